"""One ptxas for every Triton kernel of a lingc process: Triton's own.

Why. Triton's cache key names the ptxas version it read on the process's first compile (an
lru_cache), but the ptxas it runs is read from ``TRITON_PTXAS_PATH`` at every compile. Inductor
sets that variable, the first time it compiles a Triton kernel, to PyTorch's bundled ptxas (CUDA
13 with torch 2.11+cu130, where Triton 3.6 bundles 12.8). A process that compiled a Triton kernel
before Inductor's first one then compiles every later kernel, lingc's included, with the other
ptxas and stores it under a key naming the first: the cache holds two toolchains' binaries under
one key, and which one a later run loads depends on history. On an H200 (session 28) the KDA
chain's T = 6 verify from the CUDA 13 binary took 8.84 us, from the 12.8 one 7.48 us, the same
PTX; two binaries of one kernel may also round differently, and lingc's batch invariance rests
on a binary's bits (benchmarks/results/README.md, session 28).

``pin_triton_ptxas`` sets ``TRITON_PTXAS_PATH`` to Triton's bundled ptxas when it is unset, at
``import lingc``, before any compile: Inductor then keeps it (it only fills the variable when it
is empty), so the key and the binary agree in every process. A value already set (by the user,
or by Inductor in a process that compiled before lingc was imported) is left as it is.
Blackwell (sm_100+) is unaffected: Triton takes ``TRITON_PTXAS_BLACKWELL_PATH`` there.
"""
from __future__ import annotations

import importlib.util
import os

__all__ = ["ENV", "bundled_ptxas", "pin_triton_ptxas"]

ENV = "TRITON_PTXAS_PATH"


def bundled_ptxas() -> str | None:
    """Triton's own ptxas (without importing triton), or None when Triton or the binary is absent."""
    spec = importlib.util.find_spec("triton")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = os.path.join(list(spec.submodule_search_locations)[0], "backends", "nvidia", "bin", "ptxas")
    return path if os.path.isfile(path) and os.access(path, os.X_OK) else None


def pin_triton_ptxas() -> str | None:
    """Set TRITON_PTXAS_PATH to Triton's bundled ptxas unless it is already set; returns the value
    in force afterwards (None: unset, no bundled ptxas)."""
    if os.environ.get(ENV):
        return os.environ[ENV]
    path = bundled_ptxas()
    if path is not None:
        os.environ[ENV] = path
    return path
