"""Python's garbage collector against the host run-ahead: settle the heap once after compile and
capture, and record every collection that still runs inside a generation loop.

A compiled step leaves hundreds of thousands of GC-tracked objects on the heap (FX graphs, guards,
compile reports, Triton launchers): about 0.76 M after flash-tp4-rank's decode role alone and
1.08 M with the relay's roles, over which one full (generation 2) collection took 258-266 and
423-434 ms on a 2-core CPU (session 59, benchmarks/results/README.md). Python runs such a
collection whenever enough objects survived since the last one, wherever the interpreter is:
inside a generation loop it stops the host for that long, and the GPU drains the steps launched
ahead, then idles (one H100 run of the decode benchmark stalled ~0.7 s so; a collection is the
likely cause). After prepare, ``settle_heap`` collects once and moves every object that survives
into the permanent generation (``gc.freeze``), which later collections skip, as serving engines
do after their CUDA-graph capture; ``options={"gc_freeze": False}`` leaves the collector alone.
Frozen objects are still freed by reference counting; only reference cycles among them stay
until ``gc.unfreeze()``.
"""

from __future__ import annotations

import contextlib
import gc
import time
from dataclasses import dataclass


@dataclass(frozen=True)
class Collection:
    """One garbage collection seen inside a generation loop."""
    generation: int
    ms: float
    collected: int


def settle_heap(enabled: bool) -> tuple[int, float]:
    """Collect everything collectable now, then freeze the survivors (module docstring). Returns
    (objects frozen, ms spent); (0, 0.0) when disabled."""
    if not enabled:
        return 0, 0.0
    t0 = time.perf_counter()
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count(), (time.perf_counter() - t0) * 1e3


@contextlib.contextmanager
def record_collections(into: list):
    """Append a ``Collection`` to ``into`` for every garbage collection that runs in the block."""
    started: list[float] = []

    def callback(phase: str, info: dict) -> None:
        if phase == "start":
            started.append(time.perf_counter())
        elif started:
            ms = (time.perf_counter() - started.pop()) * 1e3
            into.append(Collection(info["generation"], ms, info["collected"]))

    gc.callbacks.append(callback)
    try:
        yield into
    finally:
        gc.callbacks.remove(callback)
