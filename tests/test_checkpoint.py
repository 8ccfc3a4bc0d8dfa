"""HF safetensors checkpoints: save/load round trips, sharding, index-less loading, key names,
and CheckpointError messages for bad checkpoints."""

import json
from pathlib import Path

import pytest
import torch
from model_helpers import tiny_model
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from lingc.models import Ling3ForCausalLM
from lingc.models.checkpoint import INDEX_NAME, CheckpointError


@pytest.fixture(scope="module")
def model():
    return tiny_model(seed=6)


@pytest.fixture(scope="module")
def saved(model, tmp_path_factory):
    """The tiny model saved as one shard."""
    path = tmp_path_factory.mktemp("ckpt")
    model.save_pretrained(path)
    return path


def read_checkpoint(path: Path) -> dict[str, torch.Tensor]:
    out = {}
    for f in sorted(path.glob("*.safetensors")):
        with safe_open(str(f), framework="pt") as s:
            for k in s.keys():
                assert k not in out, f"{k} in two shards"
                out[k] = s.get_tensor(k)
    return out


def assert_same_state(a: torch.nn.Module, b: torch.nn.Module) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for k in sa:
        assert sa[k].dtype == sb[k].dtype and torch.equal(sa[k], sb[k]), k


def copy_dir(src: Path, dst: Path) -> Path:
    dst.mkdir()
    for f in src.iterdir():
        (dst / f.name).write_bytes(f.read_bytes())
    return dst


def test_save_load_identical(model, saved):
    loaded = Ling3ForCausalLM.from_pretrained(saved)
    assert loaded.config == model.config
    assert_same_state(model, loaded)
    # The loaded model computes the same thing.
    from lingc.models import Ling3Cache
    ids, pos = torch.tensor([3, 1, 4]), torch.arange(3)
    a = model(ids, pos, Ling3Cache.allocate(model.config, 8))[0]
    b = loaded(ids, pos, Ling3Cache.allocate(model.config, 8))[0]
    assert torch.equal(a, b)


def test_checkpoint_key_names(model, saved):
    cfg = model.config
    keys = set(read_checkpoint(saved))
    n = cfg.num_hidden_layers
    assert {"model.word_embeddings.weight", "model.norm.weight", "lm_head.weight"} <= keys
    moe_layer, dense_layer = cfg.first_k_dense_replace, 0
    for e in (0, cfg.num_experts - 1):
        for proj in ("gate_proj", "up_proj", "down_proj"):
            assert f"model.layers.{moe_layer}.mlp.experts.{e}.{proj}.weight" in keys
    assert f"model.layers.{moe_layer}.mlp.experts.{cfg.num_experts}.gate_proj.weight" not in keys
    assert f"model.layers.{moe_layer}.mlp.gate.weight" in keys
    assert f"model.layers.{moe_layer}.mlp.gate.expert_bias" in keys
    assert f"model.layers.{moe_layer}.mlp.shared_experts.down_proj.weight" in keys
    assert f"model.layers.{dense_layer}.mlp.gate_proj.weight" in keys
    assert not any("w13" in k or "w2" in k.split(".") for k in keys)    # internal stacking only
    kda, mla = cfg.kda_layers[0], cfg.mla_layers[0]
    for name in ("q_proj", "k_proj", "v_proj", "f_proj", "g_proj", "b_proj", "o_proj",
                 "q_conv1d", "k_conv1d", "v_conv1d", "o_norm"):
        assert f"model.layers.{kda}.attention.{name}.weight" in keys
    assert f"model.layers.{kda}.attention.A_log" in keys and f"model.layers.{kda}.attention.dt_bias" in keys
    for name in ("q_proj", "kv_a_proj_with_mqa", "kv_a_layernorm", "kv_b_proj", "g_proj", "dense"):
        assert f"model.layers.{mla}.attention.{name}.weight" in keys
    assert n == 6
    for name in ("enorm", "hnorm", "eh_proj", "final_layernorm", "attention.kv_b_proj",
                 "mlp.experts.3.up_proj", "mlp.shared_experts.gate_proj"):
        assert f"model.layers.{n}.{name}.weight" in keys
    assert not any(k.startswith(f"model.layers.{n + 1}.") for k in keys)
    index = json.loads((saved / INDEX_NAME).read_text())
    assert set(index["weight_map"]) == keys
    cfg_json = json.loads((saved / "config.json").read_text())
    assert cfg_json["model_type"] == "bailing_hybrid" and cfg_json["num_hidden_layers"] == 6
    # Expert views hold the right rows: gate rows then up rows of the stacked w13.
    ckpt = read_checkpoint(saved)
    w13 = model.model.layers[moe_layer].mlp.experts.w13
    I = cfg.moe_intermediate_size
    assert torch.equal(ckpt[f"model.layers.{moe_layer}.mlp.experts.5.gate_proj.weight"], w13[5, :I])
    assert torch.equal(ckpt[f"model.layers.{moe_layer}.mlp.experts.5.up_proj.weight"], w13[5, I:])


def test_load_save_round_trip_sharded(saved, tmp_path):
    """Load -> save (several shards) reproduces every key and value of the original files."""
    original = read_checkpoint(saved)
    loaded = Ling3ForCausalLM.from_pretrained(saved)
    out = tmp_path / "resaved"
    loaded.save_pretrained(out, max_shard_bytes=600_000)
    shards = sorted(out.glob("*.safetensors"))
    assert len(shards) >= 4
    resaved = read_checkpoint(out)
    assert resaved.keys() == original.keys()
    for k, t in original.items():
        assert t.dtype == resaved[k].dtype and torch.equal(t, resaved[k]), k
    # Per-file comparison through safetensors' loader as well: every shard respects the limit
    # (a single tensor may exceed it) and the index names the shard each key lives in.
    index = json.loads((out / INDEX_NAME).read_text())["weight_map"]
    for f in shards:
        tensors = load_file(str(f))
        assert all(index[k] == f.name for k in tensors)
        size = sum(t.numel() * t.element_size() for t in tensors.values())
        assert size <= 600_000 or len(tensors) == 1
    # Several shards load back with the index and without it.
    m1 = Ling3ForCausalLM.from_pretrained(out)
    assert_same_state(loaded, m1)
    (out / INDEX_NAME).unlink()
    m2 = Ling3ForCausalLM.from_pretrained(out)
    assert_same_state(loaded, m2)


def test_load_without_index_single_shard(model, saved, tmp_path):
    d = copy_dir(saved, tmp_path / "noindex")
    (d / INDEX_NAME).unlink()
    assert_same_state(model, Ling3ForCausalLM.from_pretrained(d))


def _rewrite(saved: Path, dst: Path, edit) -> Path:
    """A copy of `saved` as one shard without index, its tensors passed through edit(dict)."""
    dst.mkdir()
    (dst / "config.json").write_text((saved / "config.json").read_text())
    tensors = read_checkpoint(saved)
    edit(tensors)
    save_file(tensors, str(dst / "model.safetensors"))
    return dst


def test_missing_key(saved, tmp_path):
    key = "model.layers.3.mlp.experts.7.down_proj.weight"
    d = _rewrite(saved, tmp_path / "c", lambda t: t.pop(key))
    with pytest.raises(CheckpointError, match="missing") as e:
        Ling3ForCausalLM.from_pretrained(d)
    assert key in str(e.value) and "unexpected" not in str(e.value)


def test_unexpected_key(saved, tmp_path):
    key = "model.layers.2.attention.rotary_emb.inv_freq"
    d = _rewrite(saved, tmp_path / "c", lambda t: t.__setitem__(key, torch.randn(4)))
    with pytest.raises(CheckpointError, match="unexpected") as e:
        Ling3ForCausalLM.from_pretrained(d)
    assert key in str(e.value) and "missing" not in str(e.value)


def test_wrongly_shaped_key(saved, tmp_path):
    key = "model.layers.1.attention.q_proj.weight"          # [64, 96] in the tiny model
    d = _rewrite(saved, tmp_path / "c", lambda t: t.__setitem__(key, torch.randn(64, 80)))
    with pytest.raises(CheckpointError, match="wrongly shaped") as e:
        Ling3ForCausalLM.from_pretrained(d)
    msg = str(e.value)
    assert key in msg and "[64, 80]" in msg and "[64, 96]" in msg
    assert "missing" not in msg                              # not also reported as missing


def test_several_problems_reported_together(saved, tmp_path):
    def edit(t):
        t.pop("lm_head.weight")
        t["model.layers.9.input_layernorm.weight"] = torch.ones(96)
    d = _rewrite(saved, tmp_path / "c", edit)
    with pytest.raises(CheckpointError) as e:
        Ling3ForCausalLM.from_pretrained(d)
    assert "lm_head.weight" in str(e.value) and "model.layers.9.input_layernorm.weight" in str(e.value)


def test_unknown_model_type(saved, tmp_path):
    d = copy_dir(saved, tmp_path / "c")
    cfg = json.loads((d / "config.json").read_text())
    cfg["model_type"] = "qwen3_moe"
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="qwen3_moe"):
        Ling3ForCausalLM.from_pretrained(d)


def test_no_config_json(saved, tmp_path):
    d = copy_dir(saved, tmp_path / "c")
    (d / "config.json").unlink()
    with pytest.raises(CheckpointError, match="config.json"):
        Ling3ForCausalLM.from_pretrained(d)


def test_no_safetensors(saved, tmp_path):
    d = tmp_path / "c"
    d.mkdir()
    (d / "config.json").write_text((saved / "config.json").read_text())
    with pytest.raises(CheckpointError, match="safetensors"):
        Ling3ForCausalLM.from_pretrained(d)


def test_index_naming_missing_shard(saved, tmp_path):
    d = copy_dir(saved, tmp_path / "c")
    for f in d.glob("*.safetensors"):
        f.unlink()
    with pytest.raises(CheckpointError, match="do not exist"):
        Ling3ForCausalLM.from_pretrained(d)
