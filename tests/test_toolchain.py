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
    # In a fresh process and cache, the order that went wrong before the pin: a lingc kernel
    # compiles first (Triton's key reads the ptxas version now), Inductor compiles its first
    # kernel (and would switch TRITON_PTXAS_PATH to PyTorch's ptxas), then another lingc kernel
    # compiles. Both must carry the PTX version of Triton's bundled ptxas, the one the key names.
    out = _run("""
        import glob, os, re
        import torch, lingc
        from lingc.runtime.kernels.norms.kernel import rmsnorm_triton
        from lingc.toolchain import bundled_ptxas
        from triton.knobs import NvidiaTool
        from triton.backends.nvidia.compiler import ptx_get_version
        for hidden in (512, 256):   # two specialisations: two compiles, around Inductor's first
            x = torch.randn(3, hidden, device="cuda", dtype=torch.bfloat16)
            rmsnorm_triton(x, torch.randn(hidden, device="cuda", dtype=torch.bfloat16), None, 1e-6)
            torch.cuda.synchronize()
            if hidden == 512:
                torch.compile(lambda a: (a * 2).sin() + 1)(torch.randn(64, device="cuda"))
        want = ptx_get_version(NvidiaTool.from_path(bundled_ptxas()).version)
        found = [re.search(r"^\\.version (\\d+)\\.(\\d+)", open(p).read(), re.M).groups()
                 for p in glob.glob(os.path.join(os.environ["TRITON_CACHE_DIR"], "*", "_rmsnorm_kernel.ptx"))]
        print(len(found) == 2 and set(found) == {(str(want // 10), str(want % 10))}, found, want)
    """, TRITON_CACHE_DIR=str(tmp_path / "cache"))
    assert out.startswith("True"), out
