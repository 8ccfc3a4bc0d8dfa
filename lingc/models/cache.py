"""Ling3Cache: the static, preallocated per-sequence state of a Ling-3 model.

Everything a decode step reads and writes besides the weights, allocated once and sized to the run
(context + new tokens + the speculative chain's slack), never to the 256k maximum:

- `kv[j]`      MLA latent cache of the j-th MLA layer, [slots, max_len, kv_lora_rank + rope_dim]
               (c after kv_a_layernorm, then the roped shared key): 576 values per token on flash.
- `state[j]`   KDA recurrent state of the j-th KDA layer, [slots, H, V, K], fp32: each head's
               [K, V] state of kda_math stored transposed, so lingc::kda_chain tiles it with K
               along the contiguous axis (state_vk: fewer CTA barriers a token; H200, session 44:
               3.29 -> 3.03 us a layer at T = 1, 7.49 -> 6.83 staged at T = 6).
- `conv[j]`    KDA short-conv windows of the j-th KDA layer, [slots, 3, H*K, W-1]: the last W-1
               q, k, v projection outputs, oldest first.
- `draft_kv[j]` the NEXTN draft layer's own MLA cache (the draft keeps no recurrent state).

The leading slot dimension exists even though lingc decodes batch 1: the relay's state pools and
stage/commit index it. Zero-initialised, so masked attention over unwritten rows multiplies
zeros, never stale NaNs.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch

from .config import Ling3Config


@dataclass
class Ling3Cache:
    max_len: int
    kv: list[torch.Tensor]
    state: list[torch.Tensor]
    conv: list[torch.Tensor]
    draft_kv: list[torch.Tensor]

    @classmethod
    def allocate(cls, cfg: Ling3Config, max_len: int, device: torch.device | str | None = None,
                 dtype: torch.dtype | None = None, slots: int = 1) -> "Ling3Cache":
        if max_len < 1:
            raise ValueError(f"cache max_len={max_len} must be >= 1")
        if max_len > cfg.max_position_embeddings:
            raise ValueError(f"cache max_len={max_len} exceeds max_position_embeddings="
                             f"{cfg.max_position_embeddings}; shorten the context or new tokens")
        dtype = dtype or cfg.dtype
        H, D, W = cfg.num_attention_heads, cfg.head_dim, cfg.short_conv_kernel_size

        def z(*shape, dt=dtype):
            return torch.zeros(*shape, dtype=dt, device=device)

        return cls(
            max_len=max_len,
            kv=[z(slots, max_len, cfg.mla_cache_dim) for _ in cfg.mla_layers],
            state=[z(slots, H, D, D, dt=torch.float32) for _ in cfg.kda_layers],
            conv=[z(slots, 3, H * D, W - 1) for _ in cfg.kda_layers],
            draft_kv=[z(slots, max_len, cfg.mla_cache_dim) for _ in range(cfg.num_nextn_predict_layers)],
        )

    def tensors(self) -> list[torch.Tensor]:
        return [t for f in fields(self) if f.name != "max_len" for t in getattr(self, f.name)]

    def zero_(self) -> "Ling3Cache":
        for t in self.tensors():
            t.zero_()
        return self

    def clone(self) -> "Ling3Cache":
        return Ling3Cache(self.max_len, *([t.clone() for t in getattr(self, f.name)]
                                          for f in fields(self) if f.name != "max_len"))

    def copy_(self, other: "Ling3Cache") -> "Ling3Cache":
        for dst, src in zip(self.tensors(), other.tensors()):
            dst.copy_(src)
        return self

    def recurrent_tensors(self) -> list[torch.Tensor]:
        """The state a rejected speculative token would corrupt: KDA states and conv windows."""
        return list(self.state) + list(self.conv)

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors())
