"""Plain-PyTorch reference for lingc's GQA decode attention: the op's CPU path and the oracle.

For T query positions over one sequence's caches (read after this step's rows were written),
with G = HQ / HKV query heads sharing each key/value head (G = 1: MHA; HKV = 1: MQA):

    scores[t, h, l] = (q[t, h] . k_cache[l, h // G]) * scale
    scores[t, h, l > positions[t]] = -inf                   causal, also inside a verify chain
    scores[t, h, l <= positions[t] - window] = -inf         only with a sliding window (window > 0)
    o[t, h]         = softmax(scores[t, h]) @ v_cache[:, h // G]        [T, HQ, DV], fp32

With norm_weight, each query head is first RMS-normed (its per-head q_norm, lingc.rmsnorm's
arithmetic, rounded to q's dtype). With inv_freq, q is then rotated by its positions (RoPE of the
queries folded into the attention: head_cache_write/naive.py's rope_heads_reference, the first
2 * len(inv_freq) dims of each head, rotate-half or interleaved pairs, fp32 rounded once to q's
dtype). With gate [T, HQ, DV] (Qwen3-Next's output gate) o is multiplied by sigmoid(gate) in fp32.

Evaluated in fp32 one query row at a time over the whole cache (full L, masked), so the result
for a position does not depend on how many queries the chain has (batch invariance in T, as
mla_decode's reference).
"""
from __future__ import annotations

import torch

__all__ = ["gqa_decode_reference"]


def gqa_decode_reference(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                         positions: torch.Tensor, scale: float, window: int = 0,
                         inv_freq: torch.Tensor | None = None, interleaved: bool = False,
                         gate: torch.Tensor | None = None, norm_weight: torch.Tensor | None = None,
                         eps: float = 0.0, round_before_weight: bool = False,
                         zero_centered: bool = False, rope_cos: torch.Tensor | None = None,
                         rope_sin: torch.Tensor | None = None, rope_dims: int = 0,
                         rope_by_token: bool = False) -> torch.Tensor:
    """o [T, HQ, DV] fp32. q [T, HQ, D]; k_cache [L, HKV, D]; v_cache [L, HKV, DV]; positions [T]
    integer (query t sees rows 0..positions[t], with ``window`` > 0 only the last ``window`` of
    them); with ``inv_freq`` the queries are first rotated by their positions
    (head_cache_write/naive.py's rope_heads_reference, rounded to q's dtype); with ``gate``
    [T, HQ, DV] the output is multiplied by sigmoid(gate) in fp32; with ``norm_weight`` each
    query head is RMS-normed first (head_cache_write/naive.py's heads_rmsnorm_reference); with
    ``rope_cos`` / ``rope_sin`` the rotation's cos and sin come from those tables
    (rope_heads_table_reference)."""
    if norm_weight is not None:
        from lingc.runtime.kernels.head_cache_write.naive import heads_rmsnorm_reference

        q = heads_rmsnorm_reference(q, norm_weight, eps, round_before_weight, zero_centered)
    if inv_freq is not None:
        from lingc.runtime.kernels.head_cache_write.naive import rope_heads_reference

        q = rope_heads_reference(q, positions, inv_freq, interleaved)
    if rope_cos is not None:
        from lingc.runtime.kernels.head_cache_write.naive import rope_heads_table_reference, rope_table_rows

        q = rope_heads_table_reference(q, rope_table_rows(rope_cos, positions, rope_by_token),
                                       rope_table_rows(rope_sin, positions, rope_by_token), rope_dims, interleaved)
    T, HQ, _ = q.shape
    L, HKV, DV = v_cache.shape
    G = HQ // HKV
    kf = k_cache.float().repeat_interleave(G, dim=1)
    vf = v_cache.float().repeat_interleave(G, dim=1)
    rows = torch.arange(L, device=q.device)
    out = []
    for t in range(T):
        scores = torch.einsum("thd,lhd->thl", q[t:t + 1].float(), kf) * scale
        hidden = rows[None, None, :] > positions[t:t + 1, None, None]
        if window > 0:
            hidden = hidden | (rows[None, None, :] <= positions[t:t + 1, None, None] - window)
        p = torch.softmax(scores.masked_fill(hidden, float("-inf")), dim=-1)
        out.append(torch.einsum("thl,lhv->thv", p, vf))
    o = torch.cat(out, 0) if out else q.new_empty((0, HQ, DV), dtype=torch.float32)
    return o if gate is None else o * torch.sigmoid(gate.float())
