"""What pdl_swap's region matchers (pdl_swap_kda.py, pdl_swap_mla.py, pdl_swap_gqa*.py,
mla_absorb.py) share: the chain lengths the kernels take, the tolerance of a probe, the graph-input
tests, the walk from a region's leaf up its views, and the drop of a rewritten cache's epilogue
write-back."""

from __future__ import annotations

import torch
import torch.fx as fx

from lingc.graph_build import emit
from lingc.graph_match import aten, is_call, strip
from lingc.pass_manager import VIEW_OPS

MAX_T = 16                                  # decode and verify chains; prefill keeps the model's path
PROBE_TOL = {torch.float32: 1e-4}          # other dtypes: 3e-2
# What a leaf's value passes through unchanged in its elements: views, copies, casts.
PASSES = (*VIEW_OPS, aten.clone.default, torch.ops.prims.convert_element_type.default)


def graph_input(n) -> bool:
    return isinstance(n, fx.Node) and n.op == "placeholder"


def param_operand(n) -> fx.Node | None:
    """A parameter operand: a placeholder, possibly cast."""
    n = strip(n) if isinstance(n, fx.Node) else n
    return n if graph_input(n) else None


def unit_lead(shape: tuple | None, rank: int) -> int | None:
    """How many leading unit dims ``shape`` has above its last ``rank`` dims (an HF-style batch
    dim of 1: a state [1, H, K, V] is the [H, K, V] state), or None when a leading dim is not 1."""
    if shape is None or len(shape) < rank or any(d != 1 for d in shape[:len(shape) - rank]):
        return None
    return len(shape) - rank


def below_lead(g: fx.Graph, n: fx.Node, rank: int) -> fx.Node:
    """n without its leading unit dims above the last ``rank`` (select(., 0, 0) views, emitted at
    g's insertion point): the [L, R + P] cache rows or [H, K, V] state a kernel takes."""
    for _ in range(len(n.meta["val"].shape) - rank):
        n = emit(g, torch.ops.aten.select.int, n, 0, 0)
    return n


def widest_up(leaf: fx.Node, fits) -> tuple[fx.Node, list[fx.Node]]:
    """Walk a region's leaf up its views, copies and casts (PASSES) to the furthest value that
    ``fits`` (a rotated slice's whole row, a key slice's [T, P] parent): (that value, the nodes
    passed on the way, which join the region); (leaf, []) when nothing above it fits."""
    best, chain, passed, n = leaf, [], [], leaf
    while True:
        if fits(n):
            best, chain = n, list(passed)
        if not is_call(n, *PASSES):
            return best, chain
        passed.append(n)
        n = n.args[0]


def drop_write_backs(g: fx.Graph, ph: fx.Node) -> None:
    """Erase the epilogue's ``copy_(ph, ph)``: a cache input whose functional write became an
    in-place lingc op is copied back onto itself otherwise."""
    for u in list(ph.users):
        if is_call(u, aten.copy_.default) and u.args[0] is ph and u.args[1] is ph:
            g.erase_node(u)
