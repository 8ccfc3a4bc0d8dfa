"""Triton helpers for the rotary embedding of per-head rows, shared by the kernels that fold it
into their loads (head_cache_write's key rows, gqa_decode's queries). The math and its two pair
layouts: head_cache_write/naive.py (``rope_heads_reference``)."""
from __future__ import annotations

import triton
import triton.language as tl

__all__ = ["rope_cols", "rope_rotate"]

@triton.jit
def rope_cols(offs_d, HALF: tl.constexpr, INTERLEAVED: tl.constexpr):
    """For each column of a head: (its pair partner's column, its inv_freq index, the sign of the
    partner's term, whether it is rotated). HALF = rope dims / 2; columns >= 2 * HALF pass
    through (partial rotary)."""
    rotated = offs_d < 2 * HALF
    if INTERLEAVED:
        first = (offs_d % 2) == 0
        partner = tl.where(first, offs_d + 1, offs_d - 1)
        fidx = offs_d // 2
    else:
        first = offs_d < HALF
        partner = tl.where(first, offs_d + HALF, offs_d - HALF)
        fidx = tl.where(first, offs_d, offs_d - HALF)
    sign = tl.where(first, -1.0, 1.0)
    return partner, fidx, sign, rotated


@triton.jit
def rope_rotate(x, x_partner, cos, sin, sign, rotated):
    """x cos + sign * partner sin on the rotated columns, x elsewhere (cos and sin of the angle
    position * inv_freq[fidx]); fp32 in and out (the caller rounds once to the rows' dtype)."""
    return tl.where(rotated, x * cos + sign * x_partner * sin, x)
