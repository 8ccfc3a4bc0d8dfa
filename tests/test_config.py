"""Ling3Config: HF config.json parsing, presets, derived layout, validation."""

import dataclasses
import json

import pytest

from lingc.models import Ling3Config, preset
from lingc.models.config import ARCHITECTURE, MODEL_TYPE

# A config.json written like Ling-3.0-flash's (HF key names, JSON literals, keys lingc ignores).
FLASH_CONFIG_JSON = """
{
  "architectures": ["BailingMoeV3ForCausalLM"],
  "auto_map": {
    "AutoConfig": "configuration_bailing_moe_v3.BailingMoeV3Config",
    "AutoModelForCausalLM": "modeling_bailing_moe_v3.BailingMoeV3ForCausalLM"
  },
  "model_type": "bailing_hybrid",
  "vocab_size": 157184,
  "hidden_size": 2560,
  "intermediate_size": 6144,
  "num_hidden_layers": 42,
  "layer_group_size": 6,
  "num_attention_heads": 32,
  "num_key_value_heads": 32,
  "head_dim": 128,
  "hidden_act": "silu",
  "rms_norm_eps": 1e-06,
  "first_k_dense_replace": 2,
  "short_conv_kernel_size": 4,
  "kda_lower_bound": -5.0,
  "kda_safe_gate": true,
  "no_kda_lora": true,
  "q_lora_rank": null,
  "kv_lora_rank": 512,
  "qk_nope_head_dim": 128,
  "qk_rope_head_dim": 64,
  "v_head_dim": 128,
  "rope_parameters": {"rope_type": "default", "rope_theta": 6000000.0},
  "rope_interleave": true,
  "rope_scaling": null,
  "max_position_embeddings": 262144,
  "num_experts": 512,
  "num_experts_per_tok": 8,
  "num_shared_experts": 1,
  "moe_intermediate_size": 768,
  "moe_shared_expert_intermediate_size": 768,
  "n_group": 8,
  "topk_group": 4,
  "norm_topk_prob": true,
  "routed_scaling_factor": 2.5,
  "score_function": "sigmoid",
  "moe_router_enable_expert_bias": true,
  "router_dtype": "fp32",
  "expert_swiglu_limit_list": [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
                               0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 4.0, 4.0, 4.0, 4.0,
                               4.0, 4.0, 4.0, 4.0],
  "share_expert_swiglu_limit_list": [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
                                     0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 5.0, 5.0, 5.0, 5.0,
                                     5.0, 5.0, 7.0, 7.0, 7.0],
  "num_nextn_predict_layers": 1,
  "mtp_use_kda": false,
  "bos_token_id": 156891,
  "eos_token_id": 156895,
  "pad_token_id": 156892,
  "tie_word_embeddings": false,
  "torch_dtype": "bfloat16",
  "use_cache": true,
  "initializer_range": 0.02,
  "transformers_version": "4.57.1"
}
"""


def flash_dict():
    return json.loads(FLASH_CONFIG_JSON)


def test_from_hf_dict_equals_flash_preset():
    d = flash_dict()
    cfg = Ling3Config.from_hf_dict(d)
    ref = preset("flash")
    fields = {f.name for f in dataclasses.fields(Ling3Config)}
    set_here = sorted(k for k in d if k in fields)
    assert len(set_here) > 30
    for k in set_here:
        assert getattr(cfg, k) == getattr(ref, k), k
    # rope_theta comes from the nested rope_parameters (no top-level rope_theta in this file).
    assert "rope_theta" not in d and cfg.rope_theta == 6.0e6
    assert cfg == ref


def test_from_hf_dict_variants():
    d = flash_dict()
    d["eos_token_id"] = [156895, 156892]          # HF allows a list of eos ids
    d["n_routed_experts"] = d.pop("num_experts")  # DeepSeek-style name
    cfg = Ling3Config.from_hf_dict(d)
    assert cfg.eos_token_id == 156895 and cfg.num_experts == 512
    d["rope_theta"] = 1.0e6                       # a top-level rope_theta wins over rope_parameters
    assert Ling3Config.from_hf_dict(d).rope_theta == 1.0e6
    d = flash_dict()
    d["expert_swiglu_limit_list"] = None          # null lists mean "no clamp"
    cfg = Ling3Config.from_hf_dict(d)
    assert cfg.expert_swiglu_limit_list == [] and cfg.expert_limit(41) == 0.0


def test_wrong_model_type_raises_naming_it():
    d = flash_dict()
    d["model_type"] = "bailing_moe_v2"
    with pytest.raises(ValueError, match="bailing_moe_v2"):
        Ling3Config.from_hf_dict(d)


@pytest.mark.parametrize("name", ["tiny", "flash", "flash-tp4-rank"])
def test_to_hf_dict_round_trips(name):
    cfg = preset(name)
    d = json.loads(json.dumps(cfg.to_hf_dict()))     # through JSON, as config.json
    assert d["model_type"] == MODEL_TYPE and d["architectures"] == [ARCHITECTURE]
    back = Ling3Config.from_hf_dict(d)
    if name == "flash-tp4-rank":
        # lm_head_rows is not an HF key: a vocab-parallel shard's config reads back whole-vocab.
        assert back == cfg.replace(lm_head_rows=None)
    else:
        assert back == cfg


def test_tiny_exercises_every_feature():
    cfg = preset("tiny")
    L = cfg.num_hidden_layers
    mla = [i for i in range(L) if (i + 1) % cfg.layer_group_size == 0]
    assert cfg.mla_layers == mla and len(mla) >= 2
    assert cfg.kda_layers == [i for i in range(L) if i not in mla] and cfg.kda_layers
    dense = [i for i in range(L) if not cfg.is_moe_layer(i)]
    moe = [i for i in range(L) if cfg.is_moe_layer(i)]
    assert dense and moe
    # An MLA layer and a KDA layer each among the MoE layers, so both attentions meet both MLPs' paths.
    assert set(mla) & set(moe) and set(cfg.kda_layers) & set(moe)
    assert 1 <= cfg.topk_group < cfg.n_group
    assert cfg.num_experts % cfg.n_group == 0 and cfg.num_experts // cfg.n_group >= 2
    # top-k is a real choice among the kept groups' experts
    assert 1 < cfg.num_experts_per_tok < cfg.topk_group * (cfg.num_experts // cfg.n_group)
    assert cfg.num_shared_experts == 1
    assert any(cfg.expert_limit(i) > 0 for i in moe) and any(cfg.expert_limit(i) == 0 for i in moe)
    assert any(cfg.shared_limit(i) > 0 for i in moe) and any(cfg.shared_limit(i) == 0 for i in moe)
    assert cfg.num_nextn_predict_layers == 1 and cfg.is_mla_layer(L)
    assert cfg.expert_limit(L) > 0            # the NEXTN layer has its own clamp entry
    assert 0 <= cfg.eos_token_id < cfg.vocab_size and 0 <= cfg.pad_token_id < cfg.vocab_size
    dims = [cfg.hidden_size, cfg.intermediate_size, cfg.kv_lora_rank, cfg.moe_intermediate_size,
            cfg.moe_shared_expert_intermediate_size, cfg.vocab_size]
    assert any(d & (d - 1) for d in dims), "some dims must not be powers of two"
    assert cfg.num_attention_heads % 4 == 0 and cfg.num_attention_heads % 2 == 0
    assert cfg.torch_dtype == "float32" and cfg.router_dtype == "fp32"
    assert cfg.qk_rope_head_dim % 2 == 0 and cfg.max_position_embeddings >= 1024


def test_flash_layer_map():
    cfg = preset("flash")
    assert cfg.mla_layers == [5, 11, 17, 23, 29, 35, 41]
    assert len(cfg.kda_layers) == 35
    assert [i for i in range(42) if not cfg.is_moe_layer(i)] == [0, 1]
    assert cfg.is_mla_layer(42)               # NEXTN draft layer is MLA
    assert cfg.mla_cache_dim == 576 and cfg.qk_head_dim == 192 and cfg.kda_dim == 4096
    assert cfg.lm_head_size == cfg.vocab_size == 157184
    assert (cfg.eos_token_id, cfg.pad_token_id) == (156895, 156892)
    assert cfg.expert_limit(34) == 0.0 and cfg.expert_limit(35) == 4.0 and cfg.expert_limit(42) == 4.0
    assert cfg.shared_limit(33) == 0.0 and cfg.shared_limit(34) == 5.0
    assert cfg.shared_limit(39) == 5.0 and cfg.shared_limit(40) == 7.0 and cfg.shared_limit(42) == 7.0


def test_flash_tp4_rank_sizes():
    cfg, flash = preset("flash-tp4-rank"), preset("flash")
    assert cfg.hidden_size == 2560 and cfg.num_hidden_layers == 42
    assert cfg.mla_layers == flash.mla_layers and cfg.first_k_dense_replace == 2
    assert cfg.num_attention_heads == 8 and cfg.head_dim == 128
    assert cfg.intermediate_size == 1536
    assert cfg.num_experts == 512 and cfg.num_experts_per_tok == 8
    assert cfg.moe_intermediate_size == 192 and cfg.moe_shared_expert_intermediate_size == 192
    assert cfg.lm_head_size == 39296
    assert cfg.vocab_size == 157184          # embeddings replicated
    assert cfg.n_group == 8 and cfg.topk_group == 4 and cfg.kv_lora_rank == 512


def test_preset_overrides_and_unknown_preset():
    assert preset("tiny", router_dtype="bf16").router_dtype == "bf16"
    with pytest.raises(ValueError, match="'nope'"):
        preset("nope")


@pytest.mark.parametrize("changes, needle", [
    (dict(num_experts=18), "num_experts=18"),
    (dict(topk_group=5), "topk_group=5"),
    (dict(topk_group=0), "topk_group=0"),
    (dict(num_experts_per_tok=9), "num_experts_per_tok=9"),
    (dict(q_lora_rank=1536), "q_lora_rank=1536"),
    (dict(num_shared_experts=2), "num_shared_experts=2"),
    (dict(num_nextn_predict_layers=3), "num_nextn_predict_layers=3"),
    (dict(mtp_use_kda=True), "mtp_use_kda"),
    (dict(qk_rope_head_dim=7), "qk_rope_head_dim=7"),
    (dict(router_dtype="fp16"), "'fp16'"),
    (dict(torch_dtype="int8"), "'int8'"),
    (dict(eos_token_id=320), "eos_token_id=320"),
    (dict(lm_head_rows=400), "lm_head_rows=400"),
    (dict(tie_word_embeddings=True), "tie"),
    (dict(n_group=16), "experts per group"),
])
def test_invalid_config_raises_naming_value(changes, needle):
    with pytest.raises(ValueError, match=needle):
        preset("tiny", **changes)
    d = preset("tiny").to_hf_dict()
    d.update(changes)
    with pytest.raises(ValueError, match=needle):
        Ling3Config.from_hf_dict(d)


@pytest.mark.parametrize("changes", [dict(rope_interleave=False), dict(kda_safe_gate=False),
                                     dict(no_kda_lora=False), dict(layer_group_size=0)])
def test_unimplemented_settings_are_rejected(changes):
    (name,) = changes
    with pytest.raises(ValueError, match=name):
        preset("tiny", **changes)


def test_rope_scaling_is_rejected():
    d = flash_dict()
    d["rope_parameters"] = {"rope_type": "yarn", "rope_theta": 6.0e6, "factor": 4.0,
                            "original_max_position_embeddings": 65536}
    with pytest.raises(ValueError, match="yarn"):
        Ling3Config.from_hf_dict(d)
