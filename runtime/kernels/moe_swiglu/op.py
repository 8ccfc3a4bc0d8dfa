"""``torch.ops.lingc.moe_swiglu(Tensor h, float limit) -> Tensor``: the activation between the grouped
MoE form's two GEMMs (lingc/models/moe.py, ``Experts.forward_grouped``): h [P, 2I] holds each
pair's gate projection in columns [0, I) and its up projection in [I, 2I); returns
``swiglu(gate, up, limit)`` [P, I] in h's dtype (``silu(gate) * up`` in fp32, clamped when
limit > 0, rounded once). CPU: the reference (naive.py); CUDA: kernel.py, one pass where the
eager form makes five over [P, I] (the two fp32 copies, SiLU, the product, the cast: ~5 ms of an
8192-token prefill of flash-tp4-rank on an H200, session 38's profile).
"""
from __future__ import annotations

import math

import torch

from lingc.runtime.registry import register_op

from .naive import moe_swiglu_reference

__all__ = ["moe_swiglu", "check_moe_swiglu_args"]

MAX_I = 8192    # the kernel holds a row's I columns in one tile


def check_moe_swiglu_args(h, limit) -> None:
    """Raise ValueError naming the bad argument."""
    op = "moe_swiglu"
    if h.dim() != 2 or h.shape[1] % 2 or not h.is_floating_point():
        raise ValueError(f"{op}: h must be the floating-point up-GEMM output [P, 2I] (gate columns, then up), "
                         f"got {tuple(h.shape)} {h.dtype}")
    if h.shape[1] // 2 > MAX_I:
        raise ValueError(f"{op}: I = {h.shape[1] // 2} is above the kernel's {MAX_I}")
    if h.shape[1] > 1 and h.stride(1) != 1:
        raise ValueError(f"{op}: h must have unit stride along its columns, got strides {tuple(h.stride())}")
    if not (isinstance(limit, (int, float)) and math.isfinite(limit) and limit >= 0):
        raise ValueError(f"{op}: limit must be a finite number >= 0 (0 = no clamp), got {limit}")


def _moe_swiglu(h: torch.Tensor, limit: float) -> torch.Tensor:
    check_moe_swiglu_args(h, limit)
    if not h.is_cuda:
        return moe_swiglu_reference(h, limit)
    from .kernel import moe_swiglu_triton  # imported here so the CPU path needs no triton

    return moe_swiglu_triton(h, limit)


def _moe_swiglu_fake(h, limit):
    check_moe_swiglu_args(h, limit)
    return h.new_empty((h.shape[0], h.shape[1] // 2))


moe_swiglu = register_op("moe_swiglu", _moe_swiglu, _moe_swiglu_fake,
                         schema="(Tensor h, float limit) -> Tensor")
