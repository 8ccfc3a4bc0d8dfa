"""What pdl_swap's region matchers (pdl_swap_kda.py, pdl_swap_mla.py, mla_absorb.py) share: the
chain lengths the kernels take, the tolerance of a probe, and the graph-input tests."""

from __future__ import annotations

import torch
import torch.fx as fx

from lingc.graph_build import emit
from lingc.graph_match import strip

MAX_T = 16                                  # decode and verify chains; prefill keeps the model's path
PROBE_TOL = {torch.float32: 1e-4}          # other dtypes: 3e-2


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
