"""``torch.ops.lingc.moe_combine_sorted(Tensor ys, Tensor order, Tensor weights, Tensor? shared=None,
ScalarType? out_dtype=None, Tensor? inv=None) -> Tensor``: the output of a prefill MoE chunk,
``sum_j weights[t, j] * ys[sorted row of pair (t, j)] (+ shared[t])`` in fp32, [T, H], rounded
once to ``out_dtype`` (fp32 when None): the routed slots and the shared expert's rows, as
``MoE.routed_chunk`` sums them.

Why: the grouped form (lingc/models/moe.py, ``Experts.forward_grouped``) runs the experts over
the (token, slot) pairs sorted by expert; putting the outputs back in pair order and summing the
slots in ATen is an index_copy of the pair outputs, their fp32 copy and 2k - 1 elementwise passes
over [T, H] fp32: ~2 GB of traffic per 4096-token chunk of flash-tp4-rank, against ~0.2 GB read
and written by one gather-and-sum kernel. ys [T*k, H] (any float dtype), order [T*k] int64
(sorted row i holds pair order[i], a permutation), weights [T, k] float32. CPU: the reference
(naive.py); CUDA: kernel.py (after one scatter that inverts the permutation, unless ``inv``, the
inverse that `lingc::moe_group_pairs` returns with the order, is given).
"""
from __future__ import annotations

import torch

from lingc.runtime.registry import register_op

from .naive import moe_combine_sorted_reference

__all__ = ["MAX_SLOTS", "moe_combine_sorted", "check_moe_combine_sorted_args"]

MAX_SLOTS = 32      # the kernel unrolls the slots (Ling-3 routes to 8)


def check_moe_combine_sorted_args(ys, order, weights, shared=None, out_dtype=None, inv=None) -> None:
    """Raise ValueError naming the bad argument."""
    op = "moe_combine_sorted"
    if weights.dim() != 2 or weights.dtype != torch.float32:
        raise ValueError(f"{op}: weights must be [T, k] float32, got {tuple(weights.shape)} {weights.dtype}")
    T, k = weights.shape
    if not 1 <= k <= MAX_SLOTS:
        raise ValueError(f"{op}: k = {k} slots per token; the kernel takes 1 to {MAX_SLOTS}")
    if ys.dim() != 2 or ys.shape[0] != T * k or not ys.is_floating_point():
        raise ValueError(f"{op}: ys must be the floating-point pair outputs [T*k, H] = [{T * k}, H], "
                         f"got {tuple(ys.shape)} {ys.dtype}")
    if order.dim() != 1 or order.numel() != T * k or order.dtype != torch.int64:
        raise ValueError(f"{op}: order must be the int64 permutation [T*k] = [{T * k}] that sorted the "
                         f"pairs, got {tuple(order.shape)} {order.dtype}")
    if inv is not None and (inv.dim() != 1 or inv.numel() != T * k or inv.dtype != torch.int64):
        raise ValueError(f"{op}: inv must be the int64 inverse permutation [T*k] = [{T * k}] (each pair's sorted "
                         f"row), got {tuple(inv.shape)} {inv.dtype}")
    for name, x in (("order", order), ("weights", weights), ("shared", shared), ("inv", inv)):
        if x is not None and x.device != ys.device:
            raise ValueError(f"{op}: {name} is on {x.device} but ys is on {ys.device}")
    if shared is not None:
        H = ys.shape[1]
        if tuple(shared.shape) != (T, H) or not shared.is_floating_point() or (H > 1 and shared.stride(1) != 1):
            raise ValueError(f"{op}: shared must be the floating-point shared-expert rows [T, H] = [{T}, {H}] "
                             f"with unit stride along H, got {tuple(shared.shape)} {shared.dtype} strides "
                             f"{tuple(shared.stride())}")
    if out_dtype is not None and not out_dtype.is_floating_point:
        raise ValueError(f"{op}: out_dtype must be a floating-point dtype or None (float32), got {out_dtype}")


def _moe_combine_sorted(ys: torch.Tensor, order: torch.Tensor, weights: torch.Tensor,
                        shared: torch.Tensor | None = None, out_dtype: torch.dtype | None = None,
                        inv: torch.Tensor | None = None) -> torch.Tensor:
    check_moe_combine_sorted_args(ys, order, weights, shared, out_dtype, inv)
    if not ys.is_cuda:
        return moe_combine_sorted_reference(ys, order, weights, shared, out_dtype)
    from .kernel import moe_combine_sorted_triton  # imported here so the CPU path needs no triton

    if inv is None:
        inv = torch.empty_like(order).scatter_(0, order, torch.arange(order.numel(), device=order.device))
    return moe_combine_sorted_triton(ys.contiguous(), inv, weights.contiguous(), shared=shared, out_dtype=out_dtype)


def _moe_combine_sorted_fake(ys, order, weights, shared=None, out_dtype=None, inv=None):
    check_moe_combine_sorted_args(ys, order, weights, shared, out_dtype, inv)
    return ys.new_empty((weights.shape[0], ys.shape[1]), dtype=out_dtype or torch.float32)


moe_combine_sorted = register_op("moe_combine_sorted", _moe_combine_sorted, _moe_combine_sorted_fake)
