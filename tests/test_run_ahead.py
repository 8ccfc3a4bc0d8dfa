"""RunAhead: step k's ring row comes back after step k + 1 was launched, in order, with every
launch counted and timed; a ring of the wrong shape is refused with the shape it wants."""

import pytest
import torch

from lingc.runtime.relay.buffers import RING
from lingc.runtime.relay.driver import EngineStats
from lingc.runtime.relay.run_ahead import RunAhead


def test_rows_come_back_one_step_late_in_order():
    ring = torch.full((RING, 3), -1, dtype=torch.int64)
    k = torch.zeros(1, dtype=torch.int64)
    launched_when_read = []

    def launch():                       # a "step": writes its row [k, 10 k, 100 k] at slot k % RING
        i = int(k)
        ring[i % RING] = torch.tensor([i, 10 * i, 100 * i])
        k.add_(1)

    stats = EngineStats()
    rows = []
    for row in RunAhead(ring).rows(launch, stats):
        launched_when_read.append(stats.launched)
        rows.append(row)
        if len(rows) == 2 * RING + 1:
            break
    assert rows == [[i, 10 * i, 100 * i] for i in range(2 * RING + 1)]
    assert launched_when_read == [i + 2 for i in range(2 * RING + 1)]        # one step ahead
    assert len(stats.host_s) == stats.launched == 2 * RING + 2 and stats.ahead == 0
    assert len(stats.read_at) == len(rows) and stats.read_at == sorted(stats.read_at)


def test_a_ring_of_the_wrong_shape_is_refused():
    with pytest.raises(ValueError, match=rf"shape \(3, 2\): want \[{RING}, row width\]"):
        RunAhead(torch.zeros(3, 2, dtype=torch.int64))
