"""Per-token, per-head rows held token-major or head-major.

lingc's attention kernels take [T, H, X] rows (any T and H strides). Models hold them either way:
[T, H, X] after a projection's view, [H, T, X] as attention's operands (``q.transpose(0, 1)``,
a ``bmm`` over heads), [1, H, T, X] as a fused attention op's output, [1, T, H, X] under an
HF-style batch dim of 1. A matcher that finds such a value names its layout here, converts a
probe's tensors to token-major to compare them with a kernel's reference, and emits the views
between the kernel's layout and the model's. When T == H the shape cannot tell the layouts apart:
every candidate is listed and the probe decides.
"""

from __future__ import annotations

import torch
import torch.fx as fx

from .graph_build import emit

aten = torch.ops.aten

LEADS = ("th", "ht", "1ht", "1th")


def head_layouts(n: fx.Node, T: int, H: int, *widths: int) -> list[str]:
    """The layouts in which n may hold [T, H, X] rows for X one of ``widths``: "th" [T, H, X],
    "ht" [H, T, X], "1ht" [1, H, T, X], "1th" [1, T, H, X]."""
    v = n.meta.get("val") if isinstance(n, fx.Node) else None
    s = tuple(v.shape) if isinstance(v, torch.Tensor) else None
    return [name for name, lead in zip(LEADS, ((T, H), (H, T), (1, H, T), (1, T, H))) for X in widths
            if s == (*lead, X)]


def width(n: fx.Node) -> int:
    """X of n's rows (its last dim)."""
    return n.meta["val"].shape[-1]


def token_major(x: torch.Tensor, layout: str) -> torch.Tensor:
    """A probe's value held in ``layout``, as [T, H, X]."""
    if layout.startswith("1"):
        x, layout = x[0], layout[1:]
    return x if layout == "th" else x.transpose(0, 1)


def emit_token_major(g: fx.Graph, n: fx.Node, layout: str) -> fx.Node:
    """n held in ``layout``, as a [T, H, X] view (at g's insertion point)."""
    if layout.startswith("1"):
        n, layout = emit(g, aten.select.int, n, 0, 0), layout[1:]
    return n if layout == "th" else emit(g, aten.permute.default, n, [1, 0, 2])


def emit_layout(g: fx.Graph, n: fx.Node, layout: str) -> fx.Node:
    """A [T, H, X] value n, as a view in ``layout`` (at g's insertion point)."""
    if layout.lstrip("1") == "ht":
        n = emit(g, aten.permute.default, n, [1, 0, 2])
    return emit(g, aten.unsqueeze.default, n, 0) if layout.startswith("1") else n
