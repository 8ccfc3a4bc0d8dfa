"""Triton kernel of `lingc::head_cache_write`. Grid (T, H): one program per new token and head
writes its cache row: the row's D values (RMS-normed first with NORM: head_norm.py), the first R
rotated (RoPE in fp32 from position * inv_freq, or cos / sin from the model's tables with TABLE,
rope.py; rotate-half or interleaved pairs, rounded to the rows' dtype and then to the cache's, as
the model rounds), the rest copied. inv_freq and the norm weight are loaded before `gdc_wait`
(constants); the rows, positions, the tables' rows and every store come after it (a previous
kernel may still read the cache). A program
touches only its own row, so the result does not depend on T (batch-invariant).

Position t is ``load(pos_ptr + t * pos_stride) + pos_add + t * pos_step``: a [T] positions tensor
or a base n with rows at n + offset + t (runtime/kernels/positions.py), one compiled kernel.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from lingc.runtime.kernels.head_norm import head_norm_cols, head_norm_gain
from lingc.runtime.kernels.positions import position_terms
from lingc.runtime.kernels.rope import rope_cols, rope_rotate, rope_table, rope_table_launch_args
from lingc.runtime.pdl import launch_kwargs, pdl_launch_dependents, pdl_supported, pdl_wait_small

__all__ = ["head_cache_write_triton"]


@triton.jit(do_not_specialize=["pos_stride", "pos_add", "pos_step"])
def _head_cache_write_kernel(x_ptr, pos_ptr, freq_ptr, cache_ptr, w_ptr, stride_xt, stride_xh, stride_cl,
                             stride_ch, pos_stride, pos_add, pos_step, D, eps, BD: tl.constexpr, HALF: tl.constexpr,
                             INTERLEAVED: tl.constexpr, USE_GDC: tl.constexpr, NORM: tl.constexpr = False,
                             ROUND_BEFORE_WEIGHT: tl.constexpr = False, ZERO_CENTERED: tl.constexpr = False,
                             cos_ptr=None, sin_ptr=None, stride_cr=0, stride_cc=0, stride_sr=0, stride_sc=0,
                             TABLE: tl.constexpr = 0, BY_TOKEN: tl.constexpr = False):
    t = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1).to(tl.int64)
    offs = tl.arange(0, BD)
    m = offs < D
    if HALF > 0:
        partner, fidx, sign, rotated = rope_cols(offs, HALF, INTERLEAVED)
        if TABLE == 0:
            freq = tl.load(freq_ptr + fidx, mask=rotated & m, other=0.0).to(tl.float32)   # producer-independent
    if NORM:                                                                        # (weights: likewise)
        gain = head_norm_gain(w_ptr, offs, m, ZERO_CENTERED)
        if HALF > 0:
            gain_p = head_norm_gain(w_ptr, partner, rotated & m, ZERO_CENTERED)

    # A small kernel: its successor (the attention) may start its own prologue meanwhile.
    pdl_wait_small(USE_GDC)
    pdl_launch_dependents(USE_GDC)

    pos = tl.load(pos_ptr + t * pos_stride).to(tl.int64) + pos_add + t * pos_step
    src = x_ptr + t * stride_xt + h * stride_xh
    x = tl.load(src + offs, mask=m, other=0.0)
    if NORM:        # the head's RMSNorm first (runtime/kernels/head_norm.py), rounded to the rows' dtype
        xf = x.to(tl.float32)
        rinv = tl.rsqrt(tl.sum(xf * xf, axis=0) / D + eps)
        x = head_norm_cols(xf, rinv, gain, x.dtype, ROUND_BEFORE_WEIGHT)
    y = x
    if HALF > 0:
        xp = tl.load(src + partner, mask=rotated & m, other=0.0)
        if NORM:
            xp = head_norm_cols(xp.to(tl.float32), rinv, gain_p, x.dtype, ROUND_BEFORE_WEIGHT)
        xp = xp.to(tl.float32)
        if TABLE == 0:
            ang = pos.to(tl.float32) * freq
            cs, sn = tl.cos(ang), tl.sin(ang)
        else:       # a per-token input may be produced upstream: read after the wait
            cs, sn = rope_table(t if BY_TOKEN else pos, fidx, offs, rotated & m, cos_ptr, sin_ptr, stride_cr,
                                stride_cc, stride_sr, stride_sc, TABLE)
        y = rope_rotate(x.to(tl.float32), xp, cs, sn, sign, rotated).to(x.dtype)
    tl.store(cache_ptr + pos * stride_cl + h * stride_ch + offs, y.to(cache_ptr.dtype.element_ty), mask=m)


def head_cache_write_triton(rows: torch.Tensor, positions: torch.Tensor, cache: torch.Tensor,
                            inv_freq: torch.Tensor | None = None, interleaved: bool = False,
                            pos_offset: int | None = None, norm_weight: torch.Tensor | None = None, eps: float = 0.0,
                            round_before_weight: bool = False, zero_centered: bool = False,
                            rope_cos: torch.Tensor | None = None, rope_sin: torch.Tensor | None = None,
                            rope_dims: int = 0, rope_by_token: bool = False) -> None:
    """Write the T x H rows (op.py); with ``pos_offset`` positions is a [1] base (rows at base +
    pos_offset + t); with ``norm_weight`` each row RMS-normed first (head_norm.py); the angles
    from inv_freq or the rope tables."""
    T, H, D = rows.shape
    if T == 0:
        return
    half = inv_freq.shape[0] if inv_freq is not None else rope_dims // 2
    tables = rope_table_launch_args(rope_cos, rope_sin, rope_dims, rope_by_token)
    _head_cache_write_kernel[(T, H)](
        rows, positions, rows if inv_freq is None else inv_freq, cache, rows if norm_weight is None else norm_weight,
        rows.stride(0), rows.stride(1), cache.stride(0), cache.stride(1), *position_terms(pos_offset), D, float(eps),
        BD=triton.next_power_of_2(D), HALF=half, INTERLEAVED=bool(interleaved), USE_GDC=pdl_supported(rows.device),
        NORM=norm_weight is not None, ROUND_BEFORE_WEIGHT=bool(round_before_weight),
        ZERO_CENTERED=bool(zero_centered), num_warps=1 if D <= 128 else 2, **tables, **launch_kwargs(rows.device))
