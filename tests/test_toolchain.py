"""lingc.toolchain: `import lingc` pins Triton's ptxas, so that Inductor cannot switch a process's
kernels to PyTorch's ptxas under a cache key naming Triton's (toolchain.py's docstring)."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch

from lingc.toolchain import ENV, bundled_ptxas


def _run(script: str, **env_changes) -> str:
    env = {k: v for k, v in os.environ.items() if k not in (ENV, "TRITON_INTERPRET")}
    env.update({k: v for k, v in env_changes.items() if v is not None})
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(script)], env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    return r.stdout.strip().splitlines()[-1]


def test_import_pins_the_bundled_ptxas():
    if bundled_ptxas() is None:
        pytest.skip("triton's bundled ptxas is not installed")
    out = _run(f"import os, lingc; print(os.environ.get({ENV!r}))")
    assert out == bundled_ptxas()


def test_a_chosen_ptxas_is_kept(tmp_path):
    mine = str(tmp_path / "my-ptxas")
    assert _run(f"import os, lingc; print(os.environ.get({ENV!r}))", **{ENV: mine}) == mine


def test_inductor_keeps_the_pin():
    # Inductor fills the variable with PyTorch's ptxas only when it is empty; after `import
    # lingc` it is not, so Triton's ptxas (the one its cache key names) stays in force.
    if bundled_ptxas() is None:
        pytest.skip("triton's bundled ptxas is not installed")
    out = _run(f"""
        import os, lingc
        from torch._inductor.runtime.compile_tasks import _set_triton_ptxas_path
        _set_triton_ptxas_path()
        from triton import knobs
        print(os.environ[{ENV!r}] == knobs.nvidia.ptxas.path)
    """)
    assert out == "True"


def test_bundled_ptxas_without_triton(monkeypatch):
    import importlib.util
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    assert bundled_ptxas() is None


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_kernels_after_inductor_use_the_keyed_ptxas(tmp_path):
    # In a fresh process and cache: Inductor compiles a Triton kernel first, then a lingc kernel
    # compiles; its PTX must carry the version of the ptxas Triton's key names (the bundled one).
    out = _run("""
        import torch, lingc
        from lingc.runtime.kernels.norms.kernel import rmsnorm_triton
        f = torch.compile(lambda a: (a * 2).sin() + 1)
        f(torch.randn(64, device="cuda"))
        x = torch.randn(3, 512, device="cuda", dtype=torch.bfloat16)
        rmsnorm_triton(x, torch.randn(512, device="cuda", dtype=torch.bfloat16), None, 1e-6)
        torch.cuda.synchronize()
        import glob, re
        from triton import knobs
        from triton.backends.nvidia.compiler import ptx_get_version
        want = ptx_get_version(knobs.nvidia.ptxas.version)
        found = set()
        for p in glob.glob(f"{__import__('os').environ['TRITON_CACHE_DIR']}/*/_rmsnorm_kernel.ptx"):
            found.add(re.search(r"^\\.version (\\d+)\\.(\\d+)", open(p).read(), re.M).groups())
        print(sorted(found) == [(str(want // 10), str(want % 10))], sorted(found), want)
    """, TRITON_CACHE_DIR=str(tmp_path / "cache"))
    assert out.startswith("True"), out
