"""Reference of `lingc::moe_combine_sorted`: the pair outputs put back in pair order (an
index_copy), widened to fp32, and summed over the slots in slot order with their weights."""

from __future__ import annotations

import torch


def moe_combine_sorted_reference(ys: torch.Tensor, order: torch.Tensor, weights: torch.Tensor,
                                 shared: torch.Tensor | None = None,
                                 out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """sum_j weights[t, j] * ys[inv(t * k + j)] in fp32, inv the inverse of `order` (sorted row i
    holds pair order[i]), plus shared[t] (widened to fp32) when given, rounded once to out_dtype
    (fp32 when None). ys [T*k, H], order [T*k] int64, weights [T, k] fp32 -> [T, H]: what
    `MoE.routed_chunk` computes after the experts."""
    from lingc.models.moe import slot_sum   # the gather form's sum: one definition of slot order

    T, k = weights.shape
    y = torch.empty_like(ys).index_copy_(0, order, ys).view(T, k, -1).float()
    out = slot_sum(y, weights)
    if shared is not None:
        out = out + shared.float()
    return out if out_dtype is None else out.to(out_dtype)
