"""Plain-PyTorch reference for lingc's MLA decode attention: the op's CPU path and the oracle.

The attention core of lingc/models/mla.py's absorbed forward, from the latent query to the latent
output, for T query positions over one slot's latent cache (read after this step's cache write):

    q_r      = rope(q_rope, positions)                      only when rope_inv_freq is given
    scores   = (q_lat . c[l] + q_r . k_rope[l]) * scale     per query t, head h, cache row l
    scores[l > positions[t]] = -inf                         causal, also inside a verify chain
    o_lat    = softmax(scores) @ c                          [T, H, kv_lora_rank], fp32
    o_lat   *= sigmoid(gate)[t, h]                          only when gate is given

with kv_cache[l] = [c[l] ; k_rope[l]] (kv_lora_rank + rope dims). Outside it stay the absorption
GEMMs (q_lat = q_nope @ W_uk before, o = o_lat @ W_uv^T after), the cache write, and `dense`.

Evaluated one query row at a time with the model's own torch calls over the whole cache (as
mla.py does: full L, masked), so that (a) at T = 1 it is the model's computation bit for bit, and
(b) it is batch-invariant: a whole-T einsum is a GEMM with M = T*H whose blocking, and so whose
bits, change with T; a [1, H, ...] row is the same call for every T.

The gate: the model multiplies by sigmoid(g) after the W_uv absorption (o = (o_lat @ W_uv^T) *
s); a per-(t, h) scalar commutes with that linear map, so gating o_lat instead is the same math
with a different fp32 rounding (declared numerics). Passing gate=None keeps the model's order.
"""
from __future__ import annotations

import torch

from lingc.models.layers import apply_rope_interleaved

__all__ = ["mla_decode_reference"]


def mla_decode_reference(q_lat: torch.Tensor, q_rope: torch.Tensor, kv_cache: torch.Tensor,
                         positions: torch.Tensor, scale: float, gate: torch.Tensor | None = None,
                         rope_inv_freq: torch.Tensor | None = None) -> torch.Tensor:
    """Latent attention output o_lat [T, H, R] fp32 (see the module docstring).

    q_lat [T, H, R] (q_nope @ W_uk, fp32 in the model); q_rope [T, H, P], already roped unless
    rope_inv_freq [P/2] is given; kv_cache [L, R + P]; positions [T] integer (query t sees rows
    0..positions[t]); gate [T, H] raw g_proj output or None.
    """
    T, H, R = q_lat.shape
    L = kv_cache.shape[0]
    cf = kv_cache.float()
    rows = torch.arange(L, device=kv_cache.device)
    out = []
    for t in range(T):
        pos = positions[t:t + 1]
        qr = q_rope[t:t + 1]
        if rope_inv_freq is not None:
            qr = apply_rope_interleaved(qr, pos, rope_inv_freq)
        scores = (torch.einsum("thr,lr->thl", q_lat[t:t + 1].float(), cf[:, :R])
                  + torch.einsum("the,le->thl", qr.float(), cf[:, R:])) * scale
        visible = rows[None, :] <= pos[:, None]
        scores = scores.masked_fill(~visible[:, None, :], float("-inf"))
        p = torch.softmax(scores, dim=-1)
        o = torch.einsum("thl,lr->thr", p, cf[:, :R])
        if gate is not None:
            o = o * torch.sigmoid(gate[t:t + 1].float()).unsqueeze(-1)
        out.append(o)
    return torch.cat(out, 0) if out else q_lat.new_empty((0, H, R), dtype=torch.float32)
