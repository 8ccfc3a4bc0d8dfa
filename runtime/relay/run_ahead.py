"""The host run-ahead loop both relay engines (driver.py) and DecodeRunner (runner.py) drive:
launch step k + 1, then read step k's row of the device token ring.

The last graph of a step writes its row of tokens into ring slot k % RING. After each launch the
host queues a copy of that slot into a pinned host ring on a side stream (which waits for the
step) and reads it one step later, after launching the next step, so the GPU always has a step
queued behind the one it runs and nothing the host decides waits for the step in flight. Stop
conditions (EOS, stop ids, max_new_tokens) are decided on the rows as they arrive, and the
caller drops what ran past them.
"""

from __future__ import annotations

import contextlib
import time
from typing import Callable, Iterator

import torch

from .buffers import RING
from .host_gc import record_collections


def copy_row_to_host(ring: torch.Tensor, host_ring: torch.Tensor, slot: int,
                     stream: torch.cuda.Stream) -> tuple[torch.cuda.Event, torch.cuda.Event]:
    """After a step launched on the current stream: (its completion event, the event of the copy
    of ring[slot] into the pinned host_ring[slot] on ``stream``, which waits for the step)."""
    done = torch.cuda.Event()
    done.record()
    with torch.cuda.stream(stream):
        stream.wait_event(done)
        host_ring[slot].copy_(ring[slot], non_blocking=True)
        copied = torch.cuda.Event()
        copied.record(stream)
    return done, copied


@contextlib.contextmanager
def host_syncs_raise(enabled: bool):
    """While enabled, a host synchronisation on CUDA raises (torch's sync debug mode): the tests'
    check that a run-ahead loop never waits for the GPU between launches."""
    if enabled:
        torch.cuda.set_sync_debug_mode("error")
    try:
        yield
    finally:
        if enabled:
            torch.cuda.set_sync_debug_mode(0)


class RunAhead:
    """Reads a device token ring [RING, W] one step late (module docstring). ``stats`` is the
    request's EngineStats / RunnerStats: launches, launches that found the previous step still
    running (CUDA), the host time of each launch, when each row was read and the garbage
    collections during the loop."""

    def __init__(self, ring: torch.Tensor):
        if ring.dim() != 2 or ring.shape[0] != RING:
            raise ValueError(f"token ring of shape {tuple(ring.shape)}: want [{RING}, row width]")
        self.ring = ring
        self.cuda = ring.device.type == "cuda"
        self._host_ring = None
        self._stream = None

    def rows(self, launch: Callable[[], None], stats, check_syncs: bool = False) -> Iterator[list[int]]:
        """Step k's ring row for k = 0, 1, ..., read after step k + 1 was launched (forever: the
        caller stops)."""
        if self.cuda and self._host_ring is None:
            self._host_ring = torch.zeros(self.ring.shape, dtype=self.ring.dtype, pin_memory=True)
            self._stream = torch.cuda.Stream()
        last_done: list = []          # the last launched step's completion event
        copied: dict = {}             # step -> its row's copy event (CPU: the row), until read

        def go(k: int) -> None:
            if last_done:
                stats.ahead += int(not last_done.pop().query())
            t0 = time.perf_counter()
            launch()
            stats.host_s.append(time.perf_counter() - t0)
            stats.launched += 1
            if not self.cuda:
                copied[k] = self.ring[k % RING].clone()
                return
            done, copied[k] = copy_row_to_host(self.ring, self._host_ring, k % RING, self._stream)
            last_done.append(done)

        with host_syncs_raise(self.cuda and check_syncs), record_collections(stats.collections):
            go(0)
            k = 0
            while True:
                go(k + 1)                                   # run ahead: step k may still run
                if self.cuda:
                    copied.pop(k).synchronize()
                    row = self._host_ring[k % RING].tolist()
                else:
                    row = copied.pop(k).tolist()
                stats.read_at.append(time.perf_counter())
                yield row
                k += 1
