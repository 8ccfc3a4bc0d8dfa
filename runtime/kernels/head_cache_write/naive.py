"""Plain-PyTorch reference of `lingc::head_cache_write` and of the rotary embedding of per-head
rows that it and `lingc::gqa_decode` apply (the op's CPU path and the oracle).

RoPE of a row x [D] at position p with inv_freq [R / 2] (R = rope dims, R <= D; the dims past R
pass through, partial rotary as Qwen3-Next's and GPT-NeoX's), angle a_i = p * inv_freq[i]:

    rotate-half (Llama / Hugging Face's rotate_half):  pairs (x[i], x[i + R/2])
    interleaved (GPT-J, MLA's):                       pairs (x[2i], x[2i + 1])
    each pair (u, w) -> (u cos a_i - w sin a_i, w cos a_i + u sin a_i)

in fp32, rounded once to x's dtype (a 16-bit model's eager code multiplies in its dtype, rounding
each product: declared, within the probes' tolerance).

Or from tables (``rope_cos`` / ``rope_sin`` [N, W], a model's precomputed cos / sin cache, any
values): the token's row (its position's, or row t of a per-token input), one value per pair (W =
R / 2) or per column (W = R: Hugging Face's cos_cached with each half repeated, where column i and
its partner read their own entries); the same rotation with those values for cos a_i and sin a_i.
"""
from __future__ import annotations

import torch

__all__ = ["heads_rmsnorm_reference", "rope_heads_reference", "rope_heads_table_reference", "rope_table_rows",
           "head_cache_write_reference"]


def heads_rmsnorm_reference(x: torch.Tensor, norm_weight: torch.Tensor, eps: float, round_before_weight: bool = False,
                            zero_centered: bool = False) -> torch.Tensor:
    """x [T, H, D] with each head's row normed as lingc.rmsnorm norms a row (its reference)."""
    from lingc.runtime.kernels.norms.naive import rmsnorm_reference

    T, H, D = x.shape
    y, _ = rmsnorm_reference(x.reshape(T * H, D), norm_weight, None, eps, round_before_weight, zero_centered)
    return y.view(T, H, D)


def _rotate_heads(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleaved: bool) -> torch.Tensor:
    """x [T, H, D] with its first R dims rotated, cos / sin [T, 1, R] fp32 per column (a pair's
    first column takes u cos - w sin, its second w cos + u sin); fp32 out."""
    R = cos.shape[-1]
    xf = x.float()
    r = xf[..., :R]
    if interleaved:
        u, w = r[..., 0::2], r[..., 1::2]
        rot = torch.stack((u * cos[..., 0::2] - w * sin[..., 0::2], w * cos[..., 1::2] + u * sin[..., 1::2]),
                          dim=-1).flatten(-2)
    else:
        half = R // 2
        u, w = r[..., :half], r[..., half:]
        rot = torch.cat((u * cos[..., :half] - w * sin[..., :half], w * cos[..., half:] + u * sin[..., half:]), dim=-1)
    return torch.cat((rot, xf[..., R:]), dim=-1)


def _per_column(pair_values: torch.Tensor, interleaved: bool) -> torch.Tensor:
    """[..., R / 2] values of the pairs -> [..., R] values of their columns."""
    return pair_values.repeat_interleave(2, dim=-1) if interleaved else torch.cat((pair_values, pair_values), -1)


def rope_heads_reference(x: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor,
                         interleaved: bool = False) -> torch.Tensor:
    """x [T, H, D] with its first 2 * len(inv_freq) dims of every head rotated by positions [T]."""
    if not x.shape[0]:
        return x.clone()
    ang = positions.float()[:, None, None] * inv_freq.float()[None, None, :]      # [T, 1, R/2]
    cos, sin = _per_column(ang.cos(), interleaved), _per_column(ang.sin(), interleaved)
    return _rotate_heads(x, cos, sin, interleaved).to(x.dtype)


def rope_table_rows(table: torch.Tensor, positions: torch.Tensor, by_token: bool) -> torch.Tensor:
    """The [T, W] rows of a cos or sin table a chain of T tokens reads: the tokens' positions'
    rows, or with ``by_token`` its first T rows (a per-token input)."""
    return table[: positions.shape[0]] if by_token else table[positions.long()]


def rope_heads_table_reference(x: torch.Tensor, cos_rows: torch.Tensor, sin_rows: torch.Tensor, rope_dims: int,
                               interleaved: bool = False) -> torch.Tensor:
    """x [T, H, D] with its first rope_dims dims rotated by given cos / sin rows [T, W]: W =
    rope_dims / 2 values per pair (as an inv_freq's angles), or W = rope_dims values per column
    (Hugging Face's tables, each half repeated); the same rotation as rope_heads_reference."""
    if not x.shape[0]:
        return x.clone()
    cos, sin = cos_rows.float()[:, None, :], sin_rows.float()[:, None, :]
    if cos.shape[-1] != rope_dims:
        cos, sin = _per_column(cos, interleaved), _per_column(sin, interleaved)
    return _rotate_heads(x, cos, sin, interleaved).to(x.dtype)


def head_cache_write_reference(rows: torch.Tensor, positions: torch.Tensor, cache: torch.Tensor,
                               inv_freq: torch.Tensor | None = None, interleaved: bool = False,
                               norm_weight: torch.Tensor | None = None, eps: float = 0.0,
                               round_before_weight: bool = False, zero_centered: bool = False,
                               rope_cos: torch.Tensor | None = None, rope_sin: torch.Tensor | None = None,
                               rope_dims: int = 0, rope_by_token: bool = False) -> None:
    """cache[positions[t]] = rows[t] (normed first when norm_weight is given, then rotated when
    inv_freq or the rope tables are), in the cache's dtype, in place: the model's ``cache[pos] =
    rope(k_norm(k))`` (or ``index_copy_``) write."""
    if norm_weight is not None:
        rows = heads_rmsnorm_reference(rows, norm_weight, eps, round_before_weight, zero_centered)
    if inv_freq is not None:
        rows = rope_heads_reference(rows, positions, inv_freq, interleaved)
    if rope_cos is not None:
        rows = rope_heads_table_reference(rows, rope_table_rows(rope_cos, positions, rope_by_token),
                                          rope_table_rows(rope_sin, positions, rope_by_token), rope_dims, interleaved)
    cache.index_copy_(0, positions.long(), rows.to(cache.dtype))
