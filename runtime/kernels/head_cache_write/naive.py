"""Plain-PyTorch reference of `lingc::head_cache_write` and of the rotary embedding of per-head
rows that it and `lingc::gqa_decode` apply (the op's CPU path and the oracle).

RoPE of a row x [D] at position p with inv_freq [R / 2] (R = rope dims, R <= D; the dims past R
pass through, partial rotary as Qwen3-Next's and GPT-NeoX's), angle a_i = p * inv_freq[i]:

    rotate-half (Llama / Hugging Face's rotate_half):  pairs (x[i], x[i + R/2])
    interleaved (GPT-J, MLA's):                       pairs (x[2i], x[2i + 1])
    each pair (u, w) -> (u cos a_i - w sin a_i, w cos a_i + u sin a_i)

in fp32, rounded once to x's dtype (a 16-bit model's eager code multiplies in its dtype, rounding
each product: declared, within the probes' tolerance).
"""
from __future__ import annotations

import torch

__all__ = ["heads_rmsnorm_reference", "rope_heads_reference", "head_cache_write_reference"]


def heads_rmsnorm_reference(x: torch.Tensor, norm_weight: torch.Tensor, eps: float, round_before_weight: bool = False,
                            zero_centered: bool = False) -> torch.Tensor:
    """x [T, H, D] with each head's row normed as lingc.rmsnorm norms a row (its reference)."""
    from lingc.runtime.kernels.norms.naive import rmsnorm_reference

    T, H, D = x.shape
    y, _ = rmsnorm_reference(x.reshape(T * H, D), norm_weight, None, eps, round_before_weight, zero_centered)
    return y.view(T, H, D)


def rope_heads_reference(x: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor,
                         interleaved: bool = False) -> torch.Tensor:
    """x [T, H, D] with its first 2 * len(inv_freq) dims of every head rotated by positions [T]."""
    T, half = x.shape[0], inv_freq.shape[0]
    R = 2 * half
    ang = positions.float()[:, None, None] * inv_freq.float()[None, None, :]      # [T, 1, R/2]
    cos, sin = ang.cos(), ang.sin()
    xf = x.float()
    r = xf[..., :R]
    if interleaved:
        u, w = r[..., 0::2], r[..., 1::2]
        rot = torch.stack((u * cos - w * sin, w * cos + u * sin), dim=-1).flatten(-2)
    else:
        u, w = r[..., :half], r[..., half:]
        rot = torch.cat((u * cos - w * sin, w * cos + u * sin), dim=-1)
    return torch.cat((rot, xf[..., R:]), dim=-1).to(x.dtype) if T else x.clone()


def head_cache_write_reference(rows: torch.Tensor, positions: torch.Tensor, cache: torch.Tensor,
                               inv_freq: torch.Tensor | None = None, interleaved: bool = False,
                               norm_weight: torch.Tensor | None = None, eps: float = 0.0,
                               round_before_weight: bool = False, zero_centered: bool = False) -> None:
    """cache[positions[t]] = rows[t] (normed first when norm_weight is given, then rotated when
    inv_freq is), in the cache's dtype, in place: the model's ``cache[pos] = rope(k_norm(k))`` (or
    ``index_copy_``) write."""
    if norm_weight is not None:
        rows = heads_rmsnorm_reference(rows, norm_weight, eps, round_before_weight, zero_centered)
    if inv_freq is not None:
        rows = rope_heads_reference(rows, positions, inv_freq, interleaved)
    cache.index_copy_(0, positions.long(), rows.to(cache.dtype))
