"""Ling3Config: the BailingMoeV3 (`model_type: bailing_hybrid`) configuration, and its presets.

Built from an HF `config.json` dict with the checkpoint's own key names, so a real checkpoint
directory loads without translation. Presets:

- `tiny`: CPU tests and CI. Small, fp32, and built to exercise every feature of the real model:
  two MLA layers under the `(i + 1) % layer_group_size == 0` rule, dense and MoE layers, grouped
  routing with `topk_group < n_group`, a shared expert, nonzero SwiGLU clamps on late layers, the
  NEXTN layer, dimensions that are not all powers of two and head counts divisible by 2 and 4
  (so tensor-parallel tests can split them).
- `flash`: Ling-3.0-flash as published (../shared/docs/ling3-model.md).
- `flash-tp4-rank`: what one GPU holds in the 4-way tensor-parallel deployment: 8 attention heads,
  dense intermediate 1536, expert intermediate 192, 39296 lm_head rows; router and embeddings whole.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import torch

MODEL_TYPE = "bailing_hybrid"
ARCHITECTURE = "BailingMoeV3ForCausalLM"

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class Ling3Config:
    vocab_size: int = 157184
    hidden_size: int = 2560
    num_hidden_layers: int = 42
    layer_group_size: int = 6
    num_attention_heads: int = 32
    head_dim: int = 128
    rms_norm_eps: float = 1e-6
    # Layers 0..first_k_dense_replace-1 have a dense SwiGLU MLP, the rest a MoE.
    first_k_dense_replace: int = 2
    intermediate_size: int = 6144
    # KDA
    short_conv_kernel_size: int = 4
    kda_lower_bound: float = -5.0
    kda_safe_gate: bool = True
    no_kda_lora: bool = True
    # MLA (direct q: q_lora_rank is None)
    q_lora_rank: int | None = None
    kv_lora_rank: int = 512
    qk_nope_head_dim: int = 128
    qk_rope_head_dim: int = 64
    v_head_dim: int = 128
    rope_theta: float = 6.0e6
    rope_interleave: bool = True
    max_position_embeddings: int = 262144
    # MoE
    num_experts: int = 512
    num_experts_per_tok: int = 8
    num_shared_experts: int = 1
    moe_intermediate_size: int = 768
    moe_shared_expert_intermediate_size: int = 768
    n_group: int = 8
    topk_group: int = 4
    norm_topk_prob: bool = True
    routed_scaling_factor: float = 2.5
    # "fp32" is what the checkpoint's config says; "bf16" runs the gate GEMM in the weight dtype
    # (accuracy-neutral at batch 1 and half the bytes; the declared fast path).
    router_dtype: str = "fp32"
    # Per-layer SwiGLU clamp limits (index = layer id, the NEXTN layer included); 0 = no clamp.
    expert_swiglu_limit_list: list[float] = field(default_factory=list)
    share_expert_swiglu_limit_list: list[float] = field(default_factory=list)
    # NEXTN / MTP
    num_nextn_predict_layers: int = 1
    mtp_use_kda: bool = False
    eos_token_id: int = 156895
    pad_token_id: int = 156892
    tie_word_embeddings: bool = False
    torch_dtype: str = "bfloat16"
    # Not an HF key: the rows of lm_head this model holds (vocab-parallel shards hold fewer than
    # vocab_size). None means the whole vocabulary.
    lm_head_rows: int | None = None

    def __post_init__(self) -> None:
        self.validate()

    # ----------------------------------------------------------------- derived layout
    def is_mla_layer(self, i: int) -> bool:
        """Layer i is MLA when (i + 1) % layer_group_size == 0; the NEXTN layer is always MLA."""
        if i >= self.num_hidden_layers:
            return not self.mtp_use_kda
        return (i + 1) % self.layer_group_size == 0

    def is_moe_layer(self, i: int) -> bool:
        return i >= self.first_k_dense_replace

    @property
    def mla_layers(self) -> list[int]:
        return [i for i in range(self.num_hidden_layers) if self.is_mla_layer(i)]

    @property
    def kda_layers(self) -> list[int]:
        return [i for i in range(self.num_hidden_layers) if not self.is_mla_layer(i)]

    @property
    def kda_dim(self) -> int:
        return self.num_attention_heads * self.head_dim

    @property
    def mla_cache_dim(self) -> int:
        return self.kv_lora_rank + self.qk_rope_head_dim

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    @property
    def lm_head_size(self) -> int:
        return self.vocab_size if self.lm_head_rows is None else self.lm_head_rows

    @property
    def dtype(self) -> torch.dtype:
        return _DTYPES[self.torch_dtype]

    def expert_limit(self, layer: int) -> float:
        return _limit_at(self.expert_swiglu_limit_list, layer)

    def shared_limit(self, layer: int) -> float:
        return _limit_at(self.share_expert_swiglu_limit_list, layer)

    # ----------------------------------------------------------------- checks
    def validate(self) -> None:
        def need(cond: bool, msg: str) -> None:
            if not cond:
                raise ValueError(f"Ling3Config: {msg}")

        need(self.layer_group_size >= 1, f"layer_group_size={self.layer_group_size} must be >= 1")
        for name in ("rope_interleave", "kda_safe_gate", "no_kda_lora"):
            need(getattr(self, name) is True, f"{name}={getattr(self, name)}: only the Ling-3 "
                 f"setting ({name}=true) is implemented")
        need(self.q_lora_rank is None, f"q_lora_rank={self.q_lora_rank}: only direct-q MLA "
             "(q_lora_rank null, as Ling-3.0-flash) is supported")
        need(self.num_experts % self.n_group == 0,
             f"num_experts={self.num_experts} is not divisible by n_group={self.n_group}")
        need(0 < self.topk_group <= self.n_group,
             f"topk_group={self.topk_group} must be in 1..n_group={self.n_group}")
        per_group = self.num_experts // self.n_group
        need(per_group >= 2, f"{per_group} experts per group; group scores need at least 2")
        need(self.num_experts_per_tok <= self.topk_group * per_group,
             f"num_experts_per_tok={self.num_experts_per_tok} exceeds the "
             f"{self.topk_group * per_group} experts of the kept groups")
        need(self.num_shared_experts in (0, 1),
             f"num_shared_experts={self.num_shared_experts}: 0 or 1 supported")
        need(self.num_nextn_predict_layers in (0, 1),
             f"num_nextn_predict_layers={self.num_nextn_predict_layers}: 0 or 1 supported")
        need(not self.mtp_use_kda, "mtp_use_kda=true is not supported (Ling-3's draft is MLA)")
        need(self.qk_rope_head_dim % 2 == 0, f"qk_rope_head_dim={self.qk_rope_head_dim} must be even")
        need(self.router_dtype in ("fp32", "bf16"),
             f"router_dtype={self.router_dtype!r}: expected 'fp32' or 'bf16'")
        need(self.torch_dtype in _DTYPES,
             f"torch_dtype={self.torch_dtype!r}: expected one of {sorted(_DTYPES)}")
        need(0 <= self.eos_token_id < self.vocab_size,
             f"eos_token_id={self.eos_token_id} outside the vocabulary of {self.vocab_size}")
        need(self.lm_head_size <= self.vocab_size,
             f"lm_head_rows={self.lm_head_rows} exceeds vocab_size={self.vocab_size}")
        need(not self.tie_word_embeddings, "tied embeddings are not supported (Ling-3 is untied)")

    # ----------------------------------------------------------------- HF dict
    @classmethod
    def from_hf_dict(cls, d: dict[str, Any]) -> "Ling3Config":
        """Build from a parsed config.json; unknown keys are ignored, a wrong model_type raises."""
        model_type = d.get("model_type", MODEL_TYPE)
        if model_type != MODEL_TYPE:
            raise ValueError(f"config.json has model_type={model_type!r}; lingc loads "
                             f"{MODEL_TYPE!r} (BailingMoeV3) checkpoints only")
        names = {f.name for f in dataclasses.fields(cls)}
        kw = {k: v for k, v in d.items() if k in names}
        rope = d.get("rope_parameters") if isinstance(d.get("rope_parameters"), dict) else {}
        scaling = d.get("rope_scaling") or {}
        for spec in (rope, scaling):
            kind = spec.get("rope_type", spec.get("type", "default"))
            if kind not in ("default", "rope"):
                raise ValueError(f"config.json asks for rope_type={kind!r}; lingc implements plain "
                                 "(unscaled) RoPE only, as the Ling-3.0-flash checkpoint ships")
        if "rope_theta" not in d and "rope_theta" in rope:
            kw["rope_theta"] = rope["rope_theta"]
        if "num_experts" not in d and "n_routed_experts" in d:
            kw["num_experts"] = d["n_routed_experts"]
        for key in ("expert_swiglu_limit_list", "share_expert_swiglu_limit_list"):
            if kw.get(key) is None:
                kw[key] = []
        if isinstance(kw.get("eos_token_id"), list):
            kw["eos_token_id"] = kw["eos_token_id"][0]
        return cls(**kw)

    def to_hf_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d.pop("lm_head_rows")
        d["model_type"] = MODEL_TYPE
        d["architectures"] = [ARCHITECTURE]
        d["num_key_value_heads"] = self.num_attention_heads
        d["rotary_dim"] = self.qk_rope_head_dim
        return d

    def replace(self, **changes: Any) -> "Ling3Config":
        return dataclasses.replace(self, **changes)


def _limit_at(limits: list[float], layer: int) -> float:
    if layer < len(limits) and limits[layer] is not None:
        return float(limits[layer])
    return 0.0


def _flash() -> Ling3Config:
    # Clamp ranges from public fixtures (ling3-model.md marks them uncertain): experts 4.0 on
    # layers 35..41, shared expert 5.0 on 34..39 and 7.0 from 40 on (the NEXTN layer included).
    n = 42 + 1
    expert = [0.0] * 35 + [4.0] * (n - 35)
    shared = [0.0] * 34 + [5.0] * 6 + [7.0] * (n - 40)
    return Ling3Config(expert_swiglu_limit_list=expert, share_expert_swiglu_limit_list=shared)


def _flash_tp4_rank() -> Ling3Config:
    return _flash().replace(num_attention_heads=8, intermediate_size=6144 // 4,
                            moe_intermediate_size=768 // 4,
                            moe_shared_expert_intermediate_size=768 // 4,
                            lm_head_rows=157184 // 4)


def _tiny() -> Ling3Config:
    # 6 layers in groups of 3 -> MLA at 2 and 5; layer 0 dense; 16 experts in 4 groups of 4,
    # keep 2 groups, top-4. Widths like 80/96/40 are deliberately not powers of two.
    n = 6 + 1
    return Ling3Config(
        vocab_size=320, hidden_size=96, num_hidden_layers=6, layer_group_size=3,
        num_attention_heads=4, head_dim=16, first_k_dense_replace=1, intermediate_size=160,
        kv_lora_rank=40, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16,
        rope_theta=10000.0, max_position_embeddings=4096,
        num_experts=16, num_experts_per_tok=4, moe_intermediate_size=24,
        moe_shared_expert_intermediate_size=40, n_group=4, topk_group=2,
        expert_swiglu_limit_list=[0.0] * 4 + [0.6] * (n - 4),
        share_expert_swiglu_limit_list=[0.0] * 5 + [0.8] * (n - 5),
        eos_token_id=317, pad_token_id=318, torch_dtype="float32",
    )


PRESETS = {"tiny": _tiny, "flash": _flash, "flash-tp4-rank": _flash_tp4_rank}


def preset(name: str, **overrides: Any) -> Ling3Config:
    """A named preset, with field overrides (e.g. `preset("tiny", router_dtype="bf16")`)."""
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; choose one of {sorted(PRESETS)}")
    cfg = PRESETS[name]()
    return cfg.replace(**overrides) if overrides else cfg
