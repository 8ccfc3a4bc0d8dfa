"""Rewrites that give one computation one spelling before the passes run.

A linear over a [1, T, D] input usually reaches the ATen graph as ``mm`` of the flattened input
and the transposed weight, but some layouts (a [1, 1, D] input made by a reshape of a
non-contiguous value) trace through matmul's batched path instead:

    before:  bmm(view(expand(x, [1, M, K])), view(expand(permute(W, [1, 0]), [1, K, N])))
    after:   view(mm(reshape(x, [M, K]), permute(W, [1, 0])), [1, M, N])

The two are the same products (one batch). The passes recognise a projection as an mm with a
weight operand (graph_match.match_linear, graph_region.is_heavy), so the batched spelling would
hide it: the region matchers would take the projection into an attention core, and
fuse_projections would not see it.
"""

from __future__ import annotations

import torch
import torch.fx as fx

from .graph_build import emit
from .graph_match import is_call, weight_source

aten = torch.ops.aten
_PEEL = (aten.view.default, aten.reshape.default, aten._unsafe_view.default, aten.expand.default,
         aten.unsqueeze.default)


def _shape(n: fx.Node) -> tuple[int, ...]:
    return tuple(n.meta["val"].shape)


def _two_d(n: fx.Node, rows: int, cols: int) -> fx.Node | None:
    """The [rows, cols] value behind n (a [1, rows, cols] view or expand of it), or None."""
    while _shape(n) != (rows, cols):
        if not is_call(n, *_PEEL) or n.args[0].meta["val"].numel() != rows * cols:
            return None
        n = n.args[0]
    return n


def linear_bmm_to_mm(graph: fx.Graph) -> int:
    """Rewrite each one-batch bmm whose second operand is a transposed weight into mm (module
    docstring). Returns the number rewritten."""
    done = 0
    for n in list(graph.nodes):
        if not is_call(n, aten.bmm.default) or "val" not in n.meta:
            continue
        a, b = n.args
        (B, M, K), N = _shape(a), _shape(b)[-1]
        if B != 1:
            continue
        w = _two_d(b, K, N)
        if w is None or weight_source(w) is None:
            continue
        with graph.inserting_before(n):
            x = _two_d(a, M, K) or emit(graph, aten.reshape.default, a, [M, K])
            out = emit(graph, aten.view.default, emit(graph, aten.mm.default, x, w), [1, M, N])
        n.replace_all_uses_with(out)
        graph.erase_node(n)
        done += 1
    return done
