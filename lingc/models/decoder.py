"""The Ling-3 decoder layer and the target model: embedding -> 42 pre-norm layers -> norm -> lm_head.

`Ling3ForCausalLM.forward(input_ids[T], positions[T], cache)` serves every shape: T=1 decode,
T=6 chain verify, T=N prefill chunks. It has no host syncs and no data-dependent Python branches,
so `torch.compile(model, fullgraph=True)` captures a step whole. The NEXTN draft layer lives at
`model.layers[num_hidden_layers]` (checkpoint name `model.layers.42`) and runs through `draft()`.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from .cache import Ling3Cache
from .config import Ling3Config
from .kda import KDAAttention
from .layers import Linear, RMSNorm
from .mla import MLAAttention
from .moe import MoE, SwiGLUMLP
from .nextn import NextNLayer
from .padding import PromptPadding
from .parallel import SINGLE, TensorParallel, shard_config


class DecoderLayer(nn.Module):
    """h = x + attn(input_layernorm(x)); out = h + mlp(post_attention_layernorm(h))."""

    def __init__(self, cfg: Ling3Config, layer_id: int, cache_index: int,
                 tp: TensorParallel = SINGLE):
        super().__init__()
        self.layer_id = layer_id
        eps, dt = cfg.rms_norm_eps, cfg.dtype
        self.input_layernorm = RMSNorm(cfg.hidden_size, eps, dt)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, eps, dt)
        if cfg.is_mla_layer(layer_id):
            self.attention = MLAAttention(cfg, layer_id, cache_index, tp=tp)
        else:
            self.attention = KDAAttention(cfg, layer_id, cache_index, tp=tp)
        if cfg.is_moe_layer(layer_id):
            self.mlp = MoE(cfg, layer_id, tp=tp)
        else:
            self.mlp = SwiGLUMLP(cfg.hidden_size, cfg.intermediate_size, dt, reduce=tp)

    def forward(self, x: torch.Tensor, positions: torch.Tensor, cache: Ling3Cache,
                padding: PromptPadding | None = None) -> torch.Tensor:
        h = x + self.attention(self.input_layernorm(x), positions, cache, padding=padding)
        return h + self.mlp(self.post_attention_layernorm(h))


class Ling3Model(nn.Module):
    def __init__(self, cfg: Ling3Config, tp: TensorParallel = SINGLE):
        super().__init__()
        self.cfg = cfg
        self.word_embeddings = nn.Embedding(cfg.vocab_size, cfg.hidden_size, dtype=cfg.dtype,
                                            _weight=torch.empty(cfg.vocab_size, cfg.hidden_size,
                                                                dtype=cfg.dtype))
        self.word_embeddings.weight.requires_grad_(False)
        mla, kda = iter(range(len(cfg.mla_layers))), iter(range(len(cfg.kda_layers)))
        layers = [DecoderLayer(cfg, i, next(mla) if cfg.is_mla_layer(i) else next(kda), tp)
                  for i in range(cfg.num_hidden_layers)]
        layers += [NextNLayer(cfg, cfg.num_hidden_layers + j, j, tp)
                   for j in range(cfg.num_nextn_predict_layers)]
        self.layers = nn.ModuleList(layers)
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, cfg.dtype)


class Ling3ForCausalLM(nn.Module):
    """Ling-3.0 (BailingMoeV3) with HF parameter names; see lingc/models/checkpoint.py to load.

    `cfg` describes the whole model; with `tp` (lingc/models/parallel.py) this process builds only
    its rank's slice: `config` is then the per-rank config (`shard_config`), `full_config` the whole.
    """

    def __init__(self, cfg: Ling3Config, tp: TensorParallel = SINGLE):
        super().__init__()
        self.full_config = cfg
        self.config = cfg = shard_config(cfg, tp.size)
        self.tp = tp
        self.model = Ling3Model(cfg, tp)
        self.lm_head = Linear(cfg.hidden_size, cfg.lm_head_size, cfg.dtype)

    @classmethod
    def from_pretrained(cls, path, dtype=None, device="cpu", progress=None, tp_rank: int = 0,
                        tp_size: int = 1, tp: TensorParallel | None = None, **config_overrides):
        """Load an HF Ling-3 checkpoint directory (config.json + safetensors shards); with
        tp_rank/tp_size (or a TensorParallel) only that rank's slices are read."""
        from .checkpoint import from_pretrained
        return from_pretrained(path, dtype=dtype, device=device, progress=progress, tp_rank=tp_rank,
                               tp_size=tp_size, tp=tp, **config_overrides)

    def save_pretrained(self, path, max_shard_bytes: int = 5 * 2**30) -> None:
        """Write an HF checkpoint directory that from_pretrained (and HF tools) read back."""
        from .checkpoint import save_pretrained
        save_pretrained(self, path, max_shard_bytes)

    @property
    def target_layers(self) -> list[DecoderLayer]:
        return list(self.model.layers[:self.config.num_hidden_layers])

    @property
    def nextn(self) -> NextNLayer | None:
        n = self.config.num_hidden_layers
        return self.model.layers[n] if len(self.model.layers) > n else None

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                cache: Ling3Cache, last_logits_only: bool = False,
                padding: PromptPadding | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """input_ids, positions: [T] device tensors. Returns (logits [T, vocab] fp32, hidden [T, H]).

        hidden is the final-normed hidden state, which the NEXTN draft takes as target_hidden.
        With last_logits_only the logits are the last position's alone ([1, vocab]): a prefill
        chunk needs no more (the vocabulary GEMM and fp32 logits of its other rows are wasted).
        With `padding` the chunk's rows past padding.length are padding (lingc.models.padding):
        they change no state, and the last position is the last real row.
        """
        x = F.embedding(input_ids, self.model.word_embeddings.weight)
        for layer in self.model.layers[:self.config.num_hidden_layers]:
            x = layer(x, positions, cache, padding)
        hidden = self.model.norm(x)
        return self._logits(hidden, last_logits_only, padding), hidden

    def _logits(self, hidden: torch.Tensor, last_only: bool, padding: PromptPadding | None = None) -> torch.Tensor:
        """fp32 logits of every row of hidden, or of its last (real) row alone (all ranks' vocab
        slices)."""
        if last_only:
            hidden = hidden[-1:] if padding is None else padding.last_row(hidden)
        return self.tp.gather_columns(self.lm_head(hidden)).float()

    def draft(self, input_ids: torch.Tensor, positions: torch.Tensor, target_hidden: torch.Tensor,
              cache: Ling3Cache, last_logits_only: bool = False,
              padding: PromptPadding | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """One NEXTN forward: token at position p with the hidden state of position p - 1.

        Returns (logits [T, vocab] fp32, the draft's hidden [T, H] for its next autoregressive step);
        with last_logits_only, the last (real, with `padding`) position's logits alone, as
        `forward`. The draft keeps no recurrent state, so padding rows only write cache rows after
        the real ones.
        """
        layer = self.nextn
        if layer is None:
            raise ValueError("this model has no NEXTN layer (num_nextn_predict_layers=0); "
                             "speculative decoding with nextn is unavailable")
        emb = F.embedding(input_ids, self.model.word_embeddings.weight)
        hidden = layer(emb, positions, target_hidden, cache)
        return self._logits(hidden, last_logits_only, padding), hidden
