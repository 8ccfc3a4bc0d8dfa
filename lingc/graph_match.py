"""Matching helpers for lingc's passes: recognise computations, not spellings.

Passes match the functionalised ATen graph that Inductor's decompositions produce, so the same math
written differently (F.linear vs matmul on [1, T, H], x * sigmoid(x) vs F.silu, `.float()` around
the activation, a fused gate_up projection split in two) reaches them in a few canonical shapes.
These helpers strip what does not change values (views, dtype casts) and recognise those shapes.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass

import torch
import torch.fx as fx

aten, prims = torch.ops.aten, torch.ops.prims

RESHAPES = {aten.view.default, aten.reshape.default, aten._unsafe_view.default,
            aten.unsqueeze.default, aten.squeeze.dim, aten.squeeze.dims}
CASTS = {prims.convert_element_type.default, aten._to_copy.default}


def is_call(n, *targets) -> bool:
    return isinstance(n, fx.Node) and n.op == "call_function" and n.target in targets


def strip(n: fx.Node, casts: bool = True) -> fx.Node:
    """Follow reshapes (and dtype casts) back to the node that computes the values."""
    while is_call(n, *RESHAPES) or (casts and is_call(n, *CASTS)):
        n = n.args[0]
    return n


def strip_upcasts(n: fx.Node) -> fx.Node:
    """Follow reshapes and widening casts (bf16 -> fp32) back to the value as the model holds
    it; stop at a narrowing cast (fp32 -> bf16), which is a rounding of its own: the output of a
    norm computed in fp32 and rounded to the model's dtype is that rounded value."""
    while True:
        if is_call(n, *RESHAPES):
            n = n.args[0]
        elif is_call(n, *CASTS) and isinstance(n.args[0], fx.Node) and "val" in n.args[0].meta and \
                n.args[0].meta["val"].dtype.itemsize < n.meta["val"].dtype.itemsize:
            n = n.args[0]
        else:
            return n


def unsupported_dtype(op: str, dtype: torch.dtype, supported: tuple[torch.dtype, ...]) -> str | None:
    """The reason a pass leaves a computation of ``dtype`` alone because lingc's ``op`` does not
    run it (written into node.meta["lingc_why"] or the pass's notes), or None when it does."""
    if dtype in supported:
        return None
    names = ", ".join(str(d).removeprefix("torch.") for d in supported)
    return f"dtype {str(dtype).removeprefix('torch.')}: lingc.{op} runs {names}"


def scalar(v) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def silu_input(n: fx.Node) -> fx.Node | None:
    """If n computes silu(x) in any of its ATen spellings, return x (stripped of casts)."""
    if is_call(n, aten.silu.default):
        return strip(n.args[0])
    if is_call(n, aten.mul.Tensor):
        a, b = n.args
        for x, s in ((a, b), (b, a)):
            if is_call(s, aten.sigmoid.default) and isinstance(x, fx.Node) and strip(s.args[0]) is strip(x):
                return strip(x)
    if is_call(n, aten.div.Tensor):                      # x / (1 + exp(-x))
        x, den = n.args
        if is_call(den, aten.add.Tensor) and isinstance(x, fx.Node):
            e, one = den.args if isinstance(den.args[0], fx.Node) else den.args[::-1]
            if scalar(one) == 1.0 and is_call(e, aten.exp.default) and is_call(e.args[0], aten.neg.default):
                if strip(e.args[0].args[0]) is strip(x):
                    return strip(x)
    return None


def clamp_bounds(n: fx.Node) -> tuple[fx.Node, float | None, float | None]:
    """Peel clamp/clamp_min/clamp_max/minimum/maximum by scalars: (inner node, lo, hi)."""
    lo = hi = None
    while True:
        if is_call(n, aten.clamp_max.default) and scalar(n.args[1]) is not None:
            hi = scalar(n.args[1]) if hi is None else min(hi, scalar(n.args[1]))
        elif is_call(n, aten.clamp_min.default) and scalar(n.args[1]) is not None:
            lo = scalar(n.args[1]) if lo is None else max(lo, scalar(n.args[1]))
        elif is_call(n, aten.clamp.default):
            a_lo = scalar(n.args[1]) if len(n.args) > 1 else scalar(n.kwargs.get("min"))
            a_hi = scalar(n.args[2]) if len(n.args) > 2 else scalar(n.kwargs.get("max"))
            if a_lo is not None:
                lo = a_lo if lo is None else max(lo, a_lo)
            if a_hi is not None:
                hi = a_hi if hi is None else min(hi, a_hi)
        else:
            return n, lo, hi
        n = strip(n.args[0])


@dataclass
class LinearMatch:
    """out = x @ weight[rows].T, x 2-D, weight a graph input (parameter)."""
    x: fx.Node
    weight: fx.Node
    rows: tuple[int, int] | None     # a row slice of weight (a fused projection split), or all


def weight_source(w: fx.Node) -> fx.Node | None:
    """The parameter behind a transposed weight operand (permute [1, 0] or t of a graph input)."""
    w = strip(w)
    if is_call(w, aten.permute.default) and list(w.args[1]) == [1, 0]:
        w = w.args[0]
    elif is_call(w, aten.t.default):
        w = w.args[0]
    else:
        return None
    return w if isinstance(w, fx.Node) and w.op in ("placeholder", "get_attr") else None


def match_linear(n: fx.Node) -> LinearMatch | None:
    """Recognise a bias-free linear, also one column block of a fused projection."""
    rows = None
    n = strip(n)
    if is_call(n, aten.slice.Tensor):
        src = n.args[0]
        dim = n.args[1] if len(n.args) > 1 else 0
        start = n.args[2] if len(n.args) > 2 else 0
        end = n.args[3] if len(n.args) > 3 else None
        val = src.meta.get("val") if isinstance(src, fx.Node) else None
        if val is None or dim not in (val.dim() - 1, -1) or not isinstance(start, int):
            return None
        width = val.shape[-1]
        end = width if end is None else min(end, width)
        rows, n = (start, end), strip(src, casts=False)
    elif n.target is operator.getitem and is_call(n.args[0], aten.split.Tensor, aten.split_with_sizes.default):
        split, idx = n.args
        src = split.args[0]
        val = src.meta.get("val")
        dim = split.args[2] if len(split.args) > 2 else split.kwargs.get("dim", 0)
        if val is None or dim not in (val.dim() - 1, -1):
            return None
        sizes = split.args[1]
        sizes = list(sizes) if isinstance(sizes, (list, tuple)) else [sizes] * -(-val.shape[-1] // sizes)
        start = sum(sizes[:idx])
        rows, n = (start, start + sizes[idx]), strip(src, casts=False)
    if not is_call(n, aten.mm.default):
        return None
    x, wt = n.args
    w = weight_source(wt)
    if w is None:
        return None
    return LinearMatch(x, w, rows)

