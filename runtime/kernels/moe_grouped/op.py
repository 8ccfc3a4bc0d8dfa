"""``torch.ops.lingc.moe_grouped(Tensor x, Tensor order, Tensor ends, Tensor w13, Tensor w2, float limit,
int top_k) -> Tensor``: the routed experts of a prompt chunk over its (token, slot) pairs sorted by
expert. Sorted row i is pair ``order[i]`` (token ``order[i] // top_k``), and expert e owns the
sorted rows ``[ends[e-1], ends[e])``; returns ys [P, H] in x's dtype, row i =
``down_e(swiglu(gate_e x, up_e x))`` (projections accumulated in fp32, the activation and the
output rounded to x's dtype), the input of ``lingc::moe_combine_sorted``.

Why: the grouped form (lingc/models/moe.py, ``Experts.forward_grouped``) ran a gather of x into
pair order ([P, H], 335 MB for an 8192-token chunk of flash-tp4-rank), ``torch._grouped_mm``,
``lingc::moe_swiglu`` and a second ``torch._grouped_mm``; the kernels (kernel.py) gather the rows
inside the up-GEMM and apply the SwiGLU to its accumulator. CPU: the reference (naive.py), one
expert at a time; CUDA: kernel.py.
"""
from __future__ import annotations

import math

import torch

from lingc.runtime.registry import register_op

from .naive import moe_group_pairs_reference, moe_grouped_reference

__all__ = ["check_moe_group_pairs_args", "check_moe_grouped_args", "moe_group_pairs", "moe_grouped"]


def check_moe_grouped_args(x, order, ends, w13, w2, limit, top_k) -> None:
    """Raise ValueError naming the bad argument."""
    op = "moe_grouped"
    if x.dim() != 2 or not x.is_floating_point() or (x.shape[1] > 1 and x.stride(1) != 1):
        raise ValueError(f"{op}: x must be floating-point [T, H] with unit stride along H, got "
                         f"{tuple(x.shape)} {x.dtype} strides {tuple(x.stride())}")
    T, H = x.shape
    if not (isinstance(top_k, int) and top_k >= 1):
        raise ValueError(f"{op}: top_k must be an int >= 1 (slots per token), got {top_k!r}")
    if order.dim() != 1 or order.numel() != T * top_k or order.dtype != torch.int64:
        raise ValueError(f"{op}: order must be the int64 permutation [T*top_k] = [{T * top_k}] that sorted the "
                         f"pairs by expert, got {tuple(order.shape)} {order.dtype}")
    if w13.dim() != 3 or w13.shape[1] % 2 or w13.shape[2] != H or w13.dtype != x.dtype or w13.stride(2) != 1:
        raise ValueError(f"{op}: w13 must be [E, 2I, H] = [E, 2I, {H}] of x's dtype {x.dtype} (gate rows, then up "
                         f"rows) with unit stride along H, got {tuple(w13.shape)} {w13.dtype} strides "
                         f"{tuple(w13.stride())}")
    E, inter = w13.shape[0], w13.shape[1] // 2
    if tuple(w2.shape) != (E, H, inter) or w2.dtype != x.dtype or (inter > 1 and w2.stride(2) != 1):
        raise ValueError(f"{op}: w2 must be [E, H, I] = [{E}, {H}, {inter}] of x's dtype {x.dtype} with unit "
                         f"stride along I, got {tuple(w2.shape)} {w2.dtype} strides {tuple(w2.stride())}")
    if ends.dim() != 1 or ends.numel() != E or ends.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"{op}: ends must be the int32 or int64 cumulative row counts per expert [E] = [{E}], "
                         f"got {tuple(ends.shape)} {ends.dtype}")
    for name, t in (("order", order), ("ends", ends), ("w13", w13), ("w2", w2)):
        if t.device != x.device:
            raise ValueError(f"{op}: {name} is on {t.device} but x is on {x.device}")
    if not (isinstance(limit, (int, float)) and math.isfinite(limit) and limit >= 0):
        raise ValueError(f"{op}: limit must be a finite number >= 0 (0 = no clamp), got {limit}")


def _moe_grouped(x: torch.Tensor, order: torch.Tensor, ends: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor,
                 limit: float, top_k: int) -> torch.Tensor:
    check_moe_grouped_args(x, order, ends, w13, w2, limit, top_k)
    if not x.is_cuda:
        return moe_grouped_reference(x, order, ends, w13, w2, limit, top_k)
    from .kernel import moe_grouped_triton  # imported here so the CPU path needs no triton

    return moe_grouped_triton(x, order, ends.contiguous(), w13, w2, limit, top_k)


def _moe_grouped_fake(x, order, ends, w13, w2, limit, top_k):
    check_moe_grouped_args(x, order, ends, w13, w2, limit, top_k)
    return x.new_empty((order.numel(), x.shape[1]))


moe_grouped = register_op("moe_grouped", _moe_grouped, _moe_grouped_fake,
                          schema="(Tensor x, Tensor order, Tensor ends, Tensor w13, Tensor w2, float limit, "
                                 "int top_k) -> Tensor")


def check_moe_group_pairs_args(ids, num_experts) -> None:
    """Raise ValueError naming the bad argument."""
    op = "moe_group_pairs"
    if ids.dim() != 2 or ids.dtype not in (torch.int32, torch.int64) or not ids.is_contiguous():
        raise ValueError(f"{op}: ids must be the router's contiguous int32 or int64 expert ids [T, k], got "
                         f"{tuple(ids.shape)} {ids.dtype} strides {tuple(ids.stride())}")
    if not (isinstance(num_experts, int) and 1 <= num_experts <= MAX_GROUP_EXPERTS):
        raise ValueError(f"{op}: num_experts must be an int from 1 to {MAX_GROUP_EXPERTS}, got {num_experts!r}")


MAX_GROUP_EXPERTS = 8192   # the kernel scans the experts' counts in registers


def _moe_group_pairs(ids: torch.Tensor, num_experts: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    check_moe_group_pairs_args(ids, num_experts)
    if not ids.is_cuda:
        return moe_group_pairs_reference(ids, num_experts)
    from .group_kernel import moe_group_pairs_triton

    return moe_group_pairs_triton(ids, num_experts)


def _moe_group_pairs_fake(ids, num_experts):
    check_moe_group_pairs_args(ids, num_experts)
    P = ids.numel()
    return (ids.new_empty(P, dtype=torch.int64), ids.new_empty(P, dtype=torch.int64),
            ids.new_empty(num_experts, dtype=torch.int32))


# ``lingc::moe_group_pairs(Tensor ids, int num_experts) -> (Tensor order, Tensor inv, Tensor ends)``:
# the pairs of ids [T, k] grouped by expert, the input of ``moe_grouped`` and
# ``moe_combine_sorted``: order [P] (the pair at each sorted slot, experts increasing), inv [P]
# (each pair's slot) and ends [E] (cumulative counts). Ids must lie in [0, E) (not checked: a
# host sync). CPU: a stable sort (naive.py); CUDA: a counting sort in two launches
# (group_kernel.py), whose order inside an expert is its atomics'.
moe_group_pairs = register_op("moe_group_pairs", _moe_group_pairs, _moe_group_pairs_fake,
                              schema="(Tensor ids, int num_experts) -> (Tensor, Tensor, Tensor)")
