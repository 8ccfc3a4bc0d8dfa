"""MLA attention layer (direct-q, head-wise gated), attending in latent space over the cache.

q = q_proj(x) splits per head into nope (qk_nope) and rope (qk_rope) parts. kv_a_proj_with_mqa(x)
gives the latent c (kv_lora_rank, then kv_a_layernorm) and one shared rope key. The cache stores
[c ; roped k_rope] per token and is never expanded: kv_b_proj is absorbed, its k half into the
query (q_lat = q_nope @ W_k) and its v half into the output (o = (p @ c) @ W_v^T). Softmax scale
(qk_nope + qk_rope)^-0.5; interleaved RoPE; each head's output times sigmoid(g_proj(x))[head];
then `dense`. The causal mask compares cache rows with the query positions (device tensors), which
serves T=1 decode, T=6 chain verify and causal prefill alike. A prefill chunk attends
QUERY_BLOCK queries at a time (each query's row is computed alone anyway), so its fp32 scores,
[QUERY_BLOCK, H, cache rows], stay bounded whatever the chunk, and in eager mode each block reads
the cache only up to its last query's position (rows past it are masked for all its queries).
"""

from __future__ import annotations

import torch
import torch.nn as nn

from .cache import Ling3Cache
from .config import Ling3Config
from .layers import Linear, RMSNorm, apply_rope_interleaved, rope_inv_freq
from .parallel import SINGLE, TensorParallel

QUERY_BLOCK = 256


class MLAAttention(nn.Module):
    def __init__(self, cfg: Ling3Config, layer_id: int, cache_index: int, draft: bool = False,
                 tp: TensorParallel = SINGLE):
        super().__init__()
        dt = cfg.dtype
        self.tp = tp
        self.layer_id, self.cache_index, self.draft = layer_id, cache_index, draft
        self.num_heads = H = cfg.num_attention_heads
        self.nope, self.rope, self.vdim = cfg.qk_nope_head_dim, cfg.qk_rope_head_dim, cfg.v_head_dim
        self.rank = cfg.kv_lora_rank
        self.scale = cfg.qk_head_dim ** -0.5
        hid = cfg.hidden_size
        self.q_proj = Linear(hid, H * cfg.qk_head_dim, dt)
        self.kv_a_proj_with_mqa = Linear(hid, self.rank + self.rope, dt)
        self.kv_a_layernorm = RMSNorm(self.rank, cfg.rms_norm_eps, dt)
        self.kv_b_proj = Linear(self.rank, H * (self.nope + self.vdim), dt)
        self.g_proj = Linear(hid, H, dt)
        self.dense = Linear(H * self.vdim, hid, dt)
        self.register_buffer("inv_freq", rope_inv_freq(self.rope, cfg.rope_theta), persistent=False)

    def _cache(self, cache: Ling3Cache) -> torch.Tensor:
        return (cache.draft_kv if self.draft else cache.kv)[self.cache_index]

    def project_kv(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """The cache rows of x: [T, rank + rope] = [kv_a_layernorm(c) ; rope(k_rope)]."""
        kv = self.kv_a_proj_with_mqa(x)
        c = self.kv_a_layernorm(kv[:, :self.rank])
        k_rope = apply_rope_interleaved(kv[:, self.rank:], positions, self.inv_freq)
        return torch.cat([c, k_rope], dim=-1)

    def forward(self, x: torch.Tensor, positions: torch.Tensor, cache: Ling3Cache,
                slot: int = 0) -> torch.Tensor:
        T, H = x.shape[0], self.num_heads
        q = self.q_proj(x).view(T, H, self.nope + self.rope)
        q_nope, q_rope = q[..., :self.nope], q[..., self.nope:]
        q_rope = apply_rope_interleaved(q_rope, positions, self.inv_freq)

        kv_cache = self._cache(cache)[slot]                                # [L, rank + rope]
        kv_cache.index_copy_(0, positions, self.project_kv(x, positions).to(kv_cache.dtype))

        w_kv = self.kv_b_proj.weight.view(H, self.nope + self.vdim, self.rank)
        w_k, w_v = w_kv[:, :self.nope], w_kv[:, self.nope:]                  # [H, nope|v, rank]
        q_lat = torch.einsum("thn,hnr->thr", q_nope.float(), w_k.float())  # [T, H, rank]
        cf = kv_cache.float()
        if T <= QUERY_BLOCK:
            o_lat = self._attend(q_lat, q_rope, positions, cf)
        else:
            starts = range(0, T, QUERY_BLOCK)
            # Eager prefill: a block reads only the cache rows up to its last query's position
            # (one host read of the blocks' last positions per call; all rows when compiling).
            ends = ([cf.shape[0]] * len(starts) if torch.compiler.is_compiling()
                    else [p + 1 for p in torch.stack([positions[i:i + QUERY_BLOCK].max() for i in starts]).tolist()])
            o_lat = torch.cat([self._attend(q_lat[i:i + QUERY_BLOCK], q_rope[i:i + QUERY_BLOCK],
                                            positions[i:i + QUERY_BLOCK], cf[:end]) for i, end in zip(starts, ends)])
        o = torch.einsum("thr,hvr->thv", o_lat, w_v.float())                 # [T, H, v]
        o = o * torch.sigmoid(self.g_proj(x).float()).unsqueeze(-1)
        return self.tp.all_reduce(self.dense(o.reshape(T, H * self.vdim).to(x.dtype)))

    def _attend(self, q_lat: torch.Tensor, q_rope: torch.Tensor, positions: torch.Tensor,
                cf: torch.Tensor) -> torch.Tensor:
        """softmax(scores over the visible cache rows) @ c for queries [T, H, .]: o_lat [T, H, rank] fp32."""
        scores = (torch.einsum("thr,lr->thl", q_lat, cf[:, :self.rank])
                  + torch.einsum("the,le->thl", q_rope.float(), cf[:, self.rank:])) * self.scale
        L = cf.shape[0]
        visible = torch.arange(L, device=cf.device)[None, :] <= positions[:, None]   # [T, L]
        scores = scores.masked_fill(~visible[:, None, :], float("-inf"))
        p = torch.softmax(scores, dim=-1)
        return torch.einsum("thl,lr->thr", p, cf[:, :self.rank])

    def forward_expanded(self, x: torch.Tensor, positions: torch.Tensor, cache: Ling3Cache,
                         slot: int = 0) -> torch.Tensor:
        """The textbook (non-absorbed) form: expand the cache through kv_b_proj. Test oracle only."""
        T, H = x.shape[0], self.num_heads
        q = self.q_proj(x).view(T, H, self.nope + self.rope).float()
        q_rope = apply_rope_interleaved(q[..., self.nope:], positions, self.inv_freq)
        kv_cache = self._cache(cache)[slot]
        kv_cache.index_copy_(0, positions, self.project_kv(x, positions).to(kv_cache.dtype))
        cf = kv_cache.float()
        L = cf.shape[0]
        kvb = (cf[:, :self.rank] @ self.kv_b_proj.weight.float().T).view(L, H, self.nope + self.vdim)
        k = torch.cat([kvb[..., :self.nope], cf[:, None, self.rank:].expand(L, H, self.rope)], -1)
        qf = torch.cat([q[..., :self.nope], q_rope], -1)
        scores = torch.einsum("thd,lhd->thl", qf, k) * self.scale
        visible = torch.arange(L, device=x.device)[None, :] <= positions[:, None]
        p = torch.softmax(scores.masked_fill(~visible[:, None, :], float("-inf")), -1)
        o = torch.einsum("thl,lhv->thv", p, kvb[..., self.nope:])
        o = o * torch.sigmoid(self.g_proj(x).float()).unsqueeze(-1)
        return self.tp.all_reduce(self.dense(o.reshape(T, H * self.vdim).to(x.dtype)))
