"""Triton helpers for the per-head RMSNorm that head_cache_write (a key row) and gqa_decode (a
query row) run on their load: Qwen3-Next's q_norm / k_norm (and any [T, H, D] head norm in
lingc.rmsnorm's forms), folded in by pdl_norm_folds.norms_into_head_readers. The checks are
head_cache_write/op.py's ``check_head_norm``, the reference head_cache_write/naive.py's
``heads_rmsnorm_reference`` (lingc.rmsnorm's on the [T * H, D] rows).

Per row x [D] (fp32 arithmetic, the order of runtime/kernels/norms/kernel.py's _normed_row):

    r = rsqrt(sum(x^2) / D + eps)
    y = (x * r * w)                     rounded once to x's dtype   (default form)
    y = (x * r * (1 + w))               rounded once                (zero_centered: Gemma, Qwen3-Next)
    y = round(round(x * r) * w)                                     (round_before_weight: Llama)

The kernels then rotate y (RoPE) as before; a rotated column reads its partner's y, computed
from the partner's x with the same r and the partner's weight (the same bits as the partner's own
column).
"""
from __future__ import annotations

import triton
import triton.language as tl

__all__ = ["head_norm_gain", "head_norm_cols"]


@triton.jit
def head_norm_gain(w_ptr, cols, mask, ZERO_CENTERED: tl.constexpr):
    """The norm's fp32 gain at these columns (1 + w for a zero-centred weight); producer-independent."""
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    if ZERO_CENTERED:
        w = w + 1.0
    return w


@triton.jit
def head_norm_cols(xf, rinv, gain, dt: tl.constexpr, ROUND_BEFORE_WEIGHT: tl.constexpr):
    """Normed columns xf * rinv * gain rounded to dt (the Llama form: rounded before the gain too)."""
    normed = xf * rinv
    if ROUND_BEFORE_WEIGHT:
        normed = normed.to(dt).to(tl.float32)
    return (normed * gain).to(dt)
