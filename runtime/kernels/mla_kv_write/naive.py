"""Reference of `lingc::mla_kv_write`: exactly the model's ops (lingc/models/mla.py project_kv
after the latent norm, or with it, then `kv_cache.index_copy_(0, positions, rows.to(cache.dtype))`)."""

from __future__ import annotations

import torch

from lingc.models.layers import apply_rope_interleaved


def mla_kv_rows_reference(c: torch.Tensor, k_rope: torch.Tensor, positions: torch.Tensor,
                          inv_freq: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor:
    """[T, R + P] cache rows: the normed latent c, then the interleaved-RoPE'd shared key (with
    ``inv_freq`` None the key as it is: an MLA whose rope dims are never rotated, Kimi Linear's
    mla_use_nope)."""
    k = k_rope if inv_freq is None else apply_rope_interleaved(k_rope, positions, inv_freq)
    return torch.cat([c, k], dim=-1).to(dtype)


def mla_kv_write_reference(c, k_rope, positions, inv_freq, cache, norm_weight=None, eps=0.0,
                           round_before_weight=False) -> None:
    """The rows written in place; with ``norm_weight`` c is the raw latent and goes through the
    model's kv_a_layernorm (lingc.rmsnorm's reference, no residual; ``round_before_weight``: its
    Llama form) first."""
    if norm_weight is not None:
        from lingc.runtime.kernels.norms.naive import rmsnorm_reference

        c = rmsnorm_reference(c, norm_weight, None, eps, round_before_weight)[0]
    cache.index_copy_(0, positions, mla_kv_rows_reference(c, k_rope, positions, inv_freq, cache.dtype))
