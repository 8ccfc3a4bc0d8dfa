"""host_gc: settle_heap collects the cyclic garbage and freezes the survivors (and does nothing
when disabled); record_collections sees every collection in its block and none after it; both
engines freeze the heap after prepare unless options say gc_freeze=False, and list the
collections that run inside a request's loop."""

import gc
import weakref

import pytest
import torch

import lingc
from lingc.options import LingcOptions
from lingc.runtime.relay.host_gc import Collection, record_collections, settle_heap
from foreign_model import KimiStyleModel
from test_decode_runner import CACHE, PROMPT, _state


class Node:
    def __init__(self):
        self.other = None


def _cycle():
    a, b = Node(), Node()
    a.other, b.other = b, a
    return weakref.ref(a)


def test_settle_heap_frees_cycles_then_freezes_the_survivors():
    gc.unfreeze()
    dead = _cycle()
    kept = Node()
    kept.other = kept
    assert dead() is not None                   # a cycle waits for the collector
    frozen, ms = settle_heap(True)
    assert dead() is None and frozen == gc.get_freeze_count() > 0 and ms > 0
    # The frozen heap is skipped, not the collector: a later cycle is still collected.
    later = _cycle()
    gc.collect()
    assert later() is None
    gc.unfreeze()
    assert settle_heap(False) == (0, 0.0) and gc.get_freeze_count() == 0
    del kept


def test_record_collections_sees_the_block_only():
    seen: list[Collection] = []
    callbacks = list(gc.callbacks)
    with record_collections(seen):
        _cycle()
        gc.collect(1)
        gc.collect()
    gc.collect()
    assert [c.generation for c in seen] == [1, 2]
    assert sum(c.collected for c in seen) >= 2 and all(c.ms >= 0 for c in seen)
    assert gc.callbacks == callbacks


def test_gc_freeze_must_be_a_bool():
    with pytest.raises(ValueError, match="gc_freeze='yes' must be a bool"):
        LingcOptions.from_user({"gc_freeze": "yes"})


@pytest.mark.parametrize("freeze", [True, False])
def test_decode_runner_freezes_after_prepare_and_records_collections_in_its_loop(freeze):
    torch._dynamo.reset()
    gc.unfreeze()
    r = lingc.DecodeRunner(KimiStyleModel(), _state({}), max_len=CACHE,
                           options={"inductor": False, "gc_freeze": freeze}, progress=False)
    r.prepare()
    assert (gc.get_freeze_count() > 0) == freeze and (r.heap_settled[0] > 0) == freeze
    tokens = []
    for t in r.stream(PROMPT, 6):
        tokens.append(t)
        if len(tokens) == 3:
            gc.collect()                        # the consumer's collection stops the loop too
    assert len(tokens) == 6
    assert [c.generation for c in r.stats.collections].count(2) >= 1
    gc.collect()
    n = len(r.stats.collections)
    gc.collect()                                # the request is over: nothing more is recorded
    assert len(r.stats.collections) == n
