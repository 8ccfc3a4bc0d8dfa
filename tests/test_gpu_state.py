"""benchmarks.common.gpu_state: the GPU's identity and clocks from nvidia-smi, recorded in every
benchmark's environment. Checked on the CPU with a stand-in nvidia-smi on the PATH."""
from __future__ import annotations

import os
import stat

import pytest
import torch

from benchmarks import common


def _fake_smi(tmp_path, body: str):
    path = tmp_path / "nvidia-smi"
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(tmp_path)


@pytest.fixture
def on_a_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(common, "_gpu_uuid", lambda: "GPU-1234")


def test_no_gpu_no_record(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert common.gpu_state() == {}


def test_every_field_of_one_query(tmp_path, monkeypatch, on_a_gpu):
    n = len(common.GPU_STATE_FIELDS)
    values = ", ".join(f"v{i}" for i in range(n))
    # The stand-in checks that it is asked about the benchmark's GPU, by UUID.
    monkeypatch.setenv("PATH", _fake_smi(tmp_path, f'[ "$1" = "--id=GPU-1234" ] || exit 3\necho "{values}"\n')
                       + os.pathsep + os.environ["PATH"])
    state = common.gpu_state()
    assert state == {f: f"v{i}" for i, f in enumerate(common.GPU_STATE_FIELDS)}


def test_an_unknown_field_drops_only_that_field(tmp_path, monkeypatch, on_a_gpu):
    # A driver that does not know the throttle-reason field: the batch query fails, the others
    # are kept one by one.
    bad = "clocks_throttle_reasons.active"
    script = (f'case "$2" in *{bad}*) echo "Field \\"{bad}\\" is not a valid field to query." >&2; exit 2;; esac\n'
              'echo "42"\n')
    monkeypatch.setenv("PATH", _fake_smi(tmp_path, script) + os.pathsep + os.environ["PATH"])
    state = common.gpu_state()
    assert bad not in state and "error" not in state
    assert state == {f: "42" for f in common.GPU_STATE_FIELDS if f != bad}


def test_a_failing_nvidia_smi_is_reported_not_raised(tmp_path, monkeypatch, on_a_gpu):
    monkeypatch.setenv("PATH", _fake_smi(tmp_path, 'echo "NVIDIA-SMI has failed" >&2\nexit 9\n')
                       + os.pathsep + os.environ["PATH"])
    assert common.gpu_state() == {"error": "NVIDIA-SMI has failed"}


def test_environment_carries_it(monkeypatch):
    monkeypatch.setattr(common, "gpu_state", lambda: {"uuid": "GPU-x"})
    env = common.environment()
    assert env["gpu_state"] == {"uuid": "GPU-x"} and env["host"]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_real_nvidia_smi():
    state = common.gpu_state()
    assert state.get("uuid", "").startswith("GPU-") and float(state["clocks.max.sm"]) > 0, state
