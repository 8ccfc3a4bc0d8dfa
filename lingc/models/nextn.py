"""The NEXTN (MTP) draft layer, checkpoint `model.layers.{num_hidden_layers}`.

h = eh_proj(cat(enorm(embed(token_p)), hnorm(target_hidden_{p-1}))) -> one MLA + MoE decoder layer
(its own MLA cache, `cache.draft_kv`) -> final_layernorm -> the target's shared lm_head. The draft
keeps no recurrent state, which is why extending or rolling it back is just rewriting cache rows.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from .cache import Ling3Cache
from .config import Ling3Config
from .layers import Linear, RMSNorm
from .mla import MLAAttention
from .moe import MoE
from .parallel import SINGLE, TensorParallel


class NextNLayer(nn.Module):
    def __init__(self, cfg: Ling3Config, layer_id: int, cache_index: int,
                 tp: TensorParallel = SINGLE):
        super().__init__()
        eps, dt, hid = cfg.rms_norm_eps, cfg.dtype, cfg.hidden_size
        self.layer_id = layer_id
        self.enorm, self.hnorm = RMSNorm(hid, eps, dt), RMSNorm(hid, eps, dt)
        self.eh_proj = Linear(2 * hid, hid, dt)
        self.input_layernorm = RMSNorm(hid, eps, dt)
        self.post_attention_layernorm = RMSNorm(hid, eps, dt)
        self.attention = MLAAttention(cfg, layer_id, cache_index, draft=True, tp=tp)
        self.mlp = MoE(cfg, layer_id, tp=tp)
        self.final_layernorm = RMSNorm(hid, eps, dt)

    def forward(self, emb: torch.Tensor, positions: torch.Tensor, target_hidden: torch.Tensor,
                cache: Ling3Cache) -> torch.Tensor:
        x = self.eh_proj(torch.cat([self.enorm(emb), self.hnorm(target_hidden.to(emb.dtype))], -1))
        h = x + self.attention(self.input_layernorm(x), positions, cache)
        h = h + self.mlp(self.post_attention_layernorm(h))
        return self.final_layernorm(h)
