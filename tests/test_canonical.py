"""lingc/canonical.py: a one-batch bmm with a transposed weight (how a linear over some [1, 1, D]
inputs traces) becomes the mm that the passes read as a projection; other bmms stay."""

from __future__ import annotations

import torch
from torch.fx.experimental.proxy_tensor import make_fx

from lingc.canonical import linear_bmm_to_mm
from lingc.graph_match import match_linear

aten = torch.ops.aten


def _count(gm, op):
    return sum(1 for n in gm.graph.nodes if n.op == "call_function" and n.target is op)


def test_one_batch_linear_becomes_mm():
    """The bmm spelling of F.linear over [1, 1, D] that a Dynamo trace of a batch-1 model gives
    (tests/foreign_model.py's BatchedKDA output projection): matmul's batched path, the weight
    transposed and expanded to [1, K, N]. After the rewrite it is an mm that match_linear reads
    as x @ W.T, with the same numbers."""
    g = torch.Generator().manual_seed(0)
    w, head = torch.randn(32, 16, generator=g), torch.randn(1, 2, 1, 8, generator=g)

    def f(w, head):
        x = head.transpose(1, 2).reshape(1, 1, 16)
        return torch.bmm(x.expand(1, 1, 16), w.t().expand(1, 16, 32)) * 2.0

    gm = make_fx(f)(w, head)
    assert _count(gm, aten.bmm.default) == 1 and _count(gm, aten.mm.default) == 0, gm.code
    before = gm(w, head)
    gm = make_fx(f, tracing_mode="fake")(w, head)             # the passes' graphs carry fake values
    assert linear_bmm_to_mm(gm.graph) == 1
    gm.graph.eliminate_dead_code()
    gm.recompile()
    assert _count(gm, aten.bmm.default) == 0 and _count(gm, aten.mm.default) == 1, gm.code
    mm = next(n for n in gm.graph.nodes if n.target is aten.mm.default)
    lin = match_linear(mm)
    assert lin is not None and lin.weight.name == "w_1", gm.code
    torch.testing.assert_close(gm(w, head), before, rtol=0, atol=0)


def test_other_bmms_stay():
    """A product of two computed values, and a product over several heads, are not linears."""
    g = torch.Generator().manual_seed(1)
    a, b, w = torch.randn(1, 3, 8, generator=g), torch.randn(1, 8, 5, generator=g), torch.randn(2, 8, 5, generator=g)

    def f(a, b, w):
        return torch.bmm(a, b).sum() + torch.bmm(a.expand(2, 3, 8), w).sum()

    gm = make_fx(f, tracing_mode="fake")(a, b, w)
    assert linear_bmm_to_mm(gm.graph) == 0
    assert _count(gm, aten.bmm.default) == 2
