"""Triton kernel of `lingc::mla_kv_write`. Grid (T,): one program per new token writes its whole
cache row: the normed latent c (R values, copied and cast) and the shared key's P values rotated
pairwise by position * inv_freq (interleaved RoPE, fp32, rounded to the key's dtype and then to
the cache's, as the model rounds). inv_freq is loaded before `gdc_wait` (a constant); the rows,
positions and every store come after it (a previous kernel may still read the cache). A program
touches only its own row, so the result does not depend on T (batch-invariant).

Without ROPE (``inv_freq`` None: Kimi Linear's never-rotated rope dims) the key's P values are
cast and copied as they are (HALF then carries P).

With NORM the program also runs MLA's kv_a_layernorm on its latent row first (it holds the whole
row anyway): c = (c.f32 * rsqrt(mean(c.f32^2) + eps) * w.f32) rounded to c's dtype, the norm
kernels' ``_normed_row`` (with ROUND_BEFORE_WEIGHT its Llama form); the norm weight is loaded
before `gdc_wait` with inv_freq.

Position t is ``load(pos_ptr + t * pos_stride) + pos_add + t * pos_step``: a [T] positions tensor
or a base n with rows at n + offset + t (runtime/kernels/positions.py), one compiled kernel.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from lingc.runtime.kernels.norms.kernel import _normed_row
from lingc.runtime.kernels.positions import position_terms
from lingc.runtime.pdl import launch_kwargs, pdl_launch_dependents, pdl_supported, pdl_wait_small

MAX_R = 8192        # one program holds the latent row (Ling-3: 512)


@triton.jit(do_not_specialize=["pos_stride", "pos_add", "pos_step"])
def _mla_kv_write_kernel(c_ptr, k_ptr, pos_ptr, freq_ptr, cache_ptr, w_ptr, stride_c, stride_k, stride_l,
                         pos_stride, pos_add, pos_step, R, HALF, eps, BR: tl.constexpr, BH: tl.constexpr, NORM: tl.constexpr,
                         USE_GDC: tl.constexpr, ROUND_BEFORE_WEIGHT: tl.constexpr = False, ROPE: tl.constexpr = True):
    t = tl.program_id(0).to(tl.int64)
    offs_h = tl.arange(0, BH)
    mh = offs_h < HALF
    if ROPE:
        freq = tl.load(freq_ptr + offs_h, mask=mh, other=0.0).to(tl.float32)   # producer-independent
    offs = tl.arange(0, BR)                                            # the whole latent row
    m = offs < R
    if NORM:
        w = tl.load(w_ptr + offs, mask=m, other=0.0).to(tl.float32)    # producer-independent

    # A small kernel: its successor (the q absorption) streams w_kc while this one runs.
    pdl_wait_small(USE_GDC)
    pdl_launch_dependents(USE_GDC)

    pos = tl.load(pos_ptr + t * pos_stride).to(tl.int64) + pos_add + t * pos_step
    row = cache_ptr + pos * stride_l
    c = tl.load(c_ptr + t * stride_c + offs, mask=m, other=0.0)
    if NORM:
        c = _normed_row(c, w, R, eps, ROUND_BEFORE_WEIGHT).to(c.dtype)
    tl.store(row + offs, c.to(cache_ptr.dtype.element_ty), mask=m)
    if ROPE:
        x0 = tl.load(k_ptr + t * stride_k + 2 * offs_h, mask=mh, other=0.0)
        x1 = tl.load(k_ptr + t * stride_k + 2 * offs_h + 1, mask=mh, other=0.0)
        ang = pos.to(tl.float32) * freq
        cs, sn = tl.cos(ang), tl.sin(ang)
        a, b = x0.to(tl.float32), x1.to(tl.float32)
        y0 = (a * cs - b * sn).to(x0.dtype).to(cache_ptr.dtype.element_ty)
        y1 = (a * sn + b * cs).to(x0.dtype).to(cache_ptr.dtype.element_ty)
        tl.store(row + R + 2 * offs_h, y0, mask=mh)
        tl.store(row + R + 2 * offs_h + 1, y1, mask=mh)
    else:
        x = tl.load(k_ptr + t * stride_k + offs_h, mask=mh, other=0.0)
        tl.store(row + R + offs_h, x.to(cache_ptr.dtype.element_ty), mask=mh)


def mla_kv_write_triton(c: torch.Tensor, k_rope: torch.Tensor, positions: torch.Tensor,
                        inv_freq: torch.Tensor | None, cache: torch.Tensor, norm_weight: torch.Tensor | None = None,
                        eps: float = 0.0, pos_offset: int | None = None, round_before_weight: bool = False) -> None:
    """Write the T rows (op.py); with ``norm_weight`` c is the raw latent, RMS-normed here (in the
    Llama form with ``round_before_weight``); with ``pos_offset`` positions is a [1] base (rows at
    base + pos_offset + t)."""
    T, R = c.shape
    rope = inv_freq is not None
    half = k_rope.shape[1] // 2 if rope else k_rope.shape[1]      # rotated pairs, or the whole key
    if R > MAX_R:
        raise ValueError(f"mla_kv_write: latent width R={R} exceeds {MAX_R} (one program holds a row)")
    use = pdl_supported(c.device)
    _mla_kv_write_kernel[(T,)](
        c, k_rope, positions, inv_freq if rope else c, cache, c if norm_weight is None else norm_weight,
        c.stride(0), k_rope.stride(0), cache.stride(0), *position_terms(pos_offset), R, half, float(eps),
        BR=triton.next_power_of_2(R), BH=max(1, triton.next_power_of_2(half)), NORM=norm_weight is not None,
        ROUND_BEFORE_WEIGHT=bool(round_before_weight), USE_GDC=use, ROPE=rope, num_warps=4,
        **launch_kwargs(c.device))
