"""MLA: absorbed (latent) attention vs the expanded form and a formula reference, cache rows,
causality, interleaved RoPE."""

import math

import pytest
import torch
from model_helpers import assert_rel_close, tiny_model

from lingc.models import Ling3Cache
from lingc.models.layers import apply_rope_interleaved, rope_inv_freq
from lingc.models.mla import MLAAttention

MAX_LEN = 48


@pytest.fixture(scope="module")
def model():
    return tiny_model(seed=2)


def mla_layer(model, idx=0) -> MLAAttention:
    layer = model.target_layers[model.config.mla_layers[idx]].attention
    assert isinstance(layer, MLAAttention)
    return layer


def cache_with_history(cfg, rows, seed=0):
    """A cache whose MLA rows 0..rows-1 hold earlier (random) content; later rows stay zero."""
    cache = Ling3Cache.allocate(cfg, MAX_LEN)
    g = torch.Generator().manual_seed(seed)
    for t in cache.kv + cache.draft_kv:
        t[:, :rows] = torch.randn(t[:, :rows].shape, generator=g)
    return cache


def rope_complex(x, positions, theta):
    """Interleaved RoPE via complex numbers, float64: pair (x[2i], x[2i+1]) is the complex
    x[2i] + i x[2i+1], multiplied by exp(i * pos * theta^(-2i/d))."""
    d = x.shape[-1]
    freqs = theta ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    ang = positions.double()[:, None] * freqs[None]                     # [T, d/2]
    rot = torch.polar(torch.ones_like(ang), ang)
    shape = (x.shape[0],) + (1,) * (x.dim() - 2) + (d // 2,)
    z = torch.view_as_complex(x.double().reshape(*x.shape[:-1], d // 2, 2).contiguous())
    return torch.view_as_real(z * rot.view(shape)).flatten(-2)


def ref_mla(layer: MLAAttention, cfg, x, positions, cache_rows):
    """Formula reference (docs/ling3-model.md, MLA) in float64, per head, expanding kv_b_proj.

    cache_rows: [L, rank + rope] earlier cache content; rows at `positions` are replaced by x's.
    Returns (output [T, hidden], the full cache [L, rank + rope]).
    """
    H, nope, rope, vd, rank = (cfg.num_attention_heads, cfg.qk_nope_head_dim,
                               cfg.qk_rope_head_dim, cfg.v_head_dim, cfg.kv_lora_rank)
    x = x.double()
    T = x.shape[0]
    q = (x @ layer.q_proj.weight.double().T).view(T, H, nope + rope)
    q_rope = rope_complex(q[..., nope:], positions, cfg.rope_theta)
    kv = x @ layer.kv_a_proj_with_mqa.weight.double().T
    c = kv[:, :rank]
    c = (c / torch.sqrt((c ** 2).mean(-1, keepdim=True) + cfg.rms_norm_eps)
         * layer.kv_a_layernorm.weight.double())
    k_rope = rope_complex(kv[:, rank:], positions, cfg.rope_theta)
    rows = cache_rows.double().clone()
    rows[positions] = torch.cat([c, k_rope], -1)
    C, KR = rows[:, :rank], rows[:, rank:]
    kvb = (C @ layer.kv_b_proj.weight.double().T).view(-1, H, nope + vd)
    gate = 1 / (1 + torch.exp(-(x @ layer.g_proj.weight.double().T)))    # [T, H]
    scale = 1 / math.sqrt(nope + rope)
    out = torch.zeros(T, H, vd, dtype=torch.float64)
    for t in range(T):
        p = int(positions[t])
        for h in range(H):
            s = (kvb[:p + 1, h, :nope] @ q[t, h, :nope] + KR[:p + 1] @ q_rope[t, h]) * scale
            w = torch.softmax(s, 0)
            out[t, h] = (w[:, None] * kvb[:p + 1, h, nope:]).sum(0) * gate[t, h]
    return out.reshape(T, H * vd) @ layer.dense.weight.double().T, rows


@pytest.mark.parametrize("T", [1, 6, 20])
def test_absorbed_matches_expanded_and_reference(model, T):
    torch.manual_seed(T)
    cfg = model.config
    layer = mla_layer(model, 1)
    start = 9
    a = cache_with_history(cfg, start, seed=T)
    b = a.clone()
    before = a.kv[layer.cache_index][0].clone()
    x = torch.randn(T, cfg.hidden_size)
    pos = torch.arange(start, start + T)
    out = layer(x, pos, a)
    out_exp = layer.forward_expanded(x, pos, b)
    assert_rel_close(out, out_exp, 1e-5, "absorbed vs expanded")
    assert torch.equal(a.kv[layer.cache_index], b.kv[layer.cache_index])
    ref, rows = ref_mla(layer, cfg, x, pos, before)
    assert_rel_close(out, ref, 1e-5, "absorbed vs formula reference")
    assert_rel_close(a.kv[layer.cache_index][0, :start + T], rows[:start + T], 1e-6, "cache rows")
    # Only this layer's rows at `pos` changed; other MLA layers and the draft cache are untouched.
    assert torch.equal(a.kv[layer.cache_index][0, :start], before[:start])
    assert torch.equal(a.kv[layer.cache_index][0, start + T:], before[start + T:])
    fresh = cache_with_history(cfg, start, seed=T)
    for i, t in enumerate(a.kv):
        if i != layer.cache_index:
            assert torch.equal(t, fresh.kv[i])
    assert torch.equal(a.draft_kv[0], fresh.draft_kv[0])


def test_query_blocks_equal_one_block(model, monkeypatch):
    """A chunk longer than QUERY_BLOCK attends block by block (bounded scores, the cache read up to
    the block's last position) with each query's result as in one block and as the reference."""
    from lingc.models import mla as mla_module
    torch.manual_seed(40)
    cfg = model.config
    layer = mla_layer(model, 0)
    start, T = 5, 11
    a = cache_with_history(cfg, start, seed=40)
    b, ref_cache = a.clone(), a.clone()
    x = torch.randn(T, cfg.hidden_size)
    pos = torch.arange(start, start + T)
    whole = layer(x, pos, a)
    calls = []
    real = MLAAttention._attend

    def attend(self, q_lat, q_rope, positions, cf):
        calls.append((q_lat.shape[0], cf.shape[0]))
        return real(self, q_lat, q_rope, positions, cf)

    monkeypatch.setattr(mla_module, "QUERY_BLOCK", 4)
    monkeypatch.setattr(MLAAttention, "_attend", attend)
    blocked = layer(x, pos, b)
    # Each block reads the cache up to its last query's position only.
    assert calls == [(4, start + 4), (4, start + 8), (3, start + 11)]
    assert_rel_close(blocked, whole, 1e-6, "query blocks vs one block")
    assert torch.equal(a.kv[layer.cache_index], b.kv[layer.cache_index])
    ref, _ = ref_mla(layer, cfg, x, pos, ref_cache.kv[layer.cache_index][0].clone())
    assert_rel_close(blocked, ref, 1e-5, "query blocks vs formula reference")


def _spy(monkeypatch, name):
    """Records the first argument's row count of every call of MLAAttention.<name>."""
    calls, real = [], getattr(MLAAttention, name)

    def spy(self, *a):
        calls.append(a[0].shape[0])
        return real(self, *a)

    monkeypatch.setattr(MLAAttention, name, spy)
    return calls


@pytest.mark.parametrize("start,T", [(5, 11), (0, 9)])
def test_expanded_prefill_equals_blocks_and_reference(model, monkeypatch, start, T):
    """The expanded form (keys and values through kv_b_proj, one causal SDPA over the rows up to
    the chunk's last position) against the absorbed fp32 blocks and the float64 reference: the
    same output and cache rows; rows past the chunk (stale leftovers) are never seen."""
    from lingc.models import mla as mla_module
    torch.manual_seed(42 + start)
    cfg = model.config
    layer = mla_layer(model, 0)
    monkeypatch.setattr(mla_module, "QUERY_BLOCK", 4)
    a = cache_with_history(cfg, start, seed=42)
    a.kv[layer.cache_index][0, start + T:] = 100 * torch.randn(MAX_LEN - start - T, cfg.mla_cache_dim)
    b, ref_cache = a.clone(), a.clone()
    x = torch.randn(T, cfg.hidden_size)
    pos = torch.arange(start, start + T)
    blocks = _spy(monkeypatch, "_attend")
    expanded_calls = _spy(monkeypatch, "_attend_expanded")
    assert mla_module.prefill_attention_form(a.kv[0]) == "fp32"       # the CPU's default
    absorbed = layer(x, pos, a)
    assert blocks and not expanded_calls
    blocks.clear()
    monkeypatch.setattr(mla_module, "PREFILL_FORM", "expanded")
    expanded = layer(x, pos, b)
    assert expanded_calls == [T] and not blocks
    assert_rel_close(expanded, absorbed, 1e-5, "expanded vs absorbed blocks")
    assert torch.equal(a.kv[layer.cache_index], b.kv[layer.cache_index])
    ref, _ = ref_mla(layer, cfg, x, pos, ref_cache.kv[layer.cache_index][0].clone())
    assert_rel_close(expanded, ref, 1e-5, "expanded vs formula reference")


def test_expanded_prefill_needs_consecutive_positions(model, monkeypatch):
    """Positions that are not one run (not a prompt chunk) take the absorbed blocks, whose mask
    compares each row with each query's position, as do chunks whose expanded temporaries would
    pass EXPANDED_MAX_BYTES; a chunk of QUERY_BLOCK or fewer queries never takes the expanded form."""
    from lingc.models import mla as mla_module
    torch.manual_seed(43)
    cfg = model.config
    layer = mla_layer(model, 0)
    monkeypatch.setattr(mla_module, "QUERY_BLOCK", 4)
    monkeypatch.setattr(mla_module, "PREFILL_FORM", "expanded")
    expanded_calls = _spy(monkeypatch, "_attend_expanded")
    x = torch.randn(6, cfg.hidden_size)
    for pos in (torch.tensor([3, 4, 5, 7, 8, 9]), torch.tensor([9, 8, 7, 6, 5, 4])):
        layer(x, pos, cache_with_history(cfg, 3, seed=43))
    layer(x[:4], torch.arange(3, 7), cache_with_history(cfg, 3, seed=43))
    assert expanded_calls == []
    layer(x, torch.arange(3, 9), cache_with_history(cfg, 3, seed=43))
    assert expanded_calls == [6]
    # Temporaries over EXPANDED_MAX_BYTES: the blocks. 9 rows x heads x (2 (nope + v) + nope + rope) fp32.
    need = 4 * 9 * layer.num_heads * (2 * (layer.nope + layer.vdim) + layer.nope + layer.rope)
    monkeypatch.setattr(mla_module, "EXPANDED_MAX_BYTES", need - 1)
    layer(x, torch.arange(3, 9), cache_with_history(cfg, 3, seed=43))
    assert expanded_calls == [6]
    monkeypatch.setattr(mla_module, "EXPANDED_MAX_BYTES", need)
    layer(x, torch.arange(3, 9), cache_with_history(cfg, 3, seed=43))
    assert expanded_calls == [6, 6]


@pytest.mark.parametrize("chunk", [16, 64])
def test_prefill_forms_agree_on_the_whole_model(model, monkeypatch, chunk):
    """A 40-token prompt through the tiny model in chunks (QUERY_BLOCK 4, so every chunk of more
    than 4 tokens takes the prefill form): the expanded form and the absorbed fp32 blocks give the
    same logits to fp32 rounding and the same hidden states."""
    from lingc.decoding.reference import prefill
    from lingc.models import mla as mla_module
    monkeypatch.setattr(mla_module, "QUERY_BLOCK", 4)
    prompt = torch.randint(0, model.config.vocab_size, (40,), generator=torch.Generator().manual_seed(44))
    calls = _spy(monkeypatch, "_attend_expanded")
    runs = {}
    for form in ("fp32", "expanded"):
        monkeypatch.setattr(mla_module, "PREFILL_FORM", form)
        with torch.no_grad():
            runs[form] = prefill(model, Ling3Cache.allocate(model.config, 48), prompt, chunk=chunk)
    # Every MLA layer of the target, once per chunk, in the expanded run only.
    assert len(calls) == len(model.config.mla_layers) * (40 // chunk + (40 % chunk > 0))
    assert_rel_close(runs["expanded"][0], runs["fp32"][0], 1e-5, "last-position logits")
    assert_rel_close(runs["expanded"][1], runs["fp32"][1], 1e-5, "hidden states")


def test_expanded_bf16_prefill_is_the_expanded_form_in_bf16(model, monkeypatch):
    """The "expanded-bf16" form (bf16 keys, values and queries, values padded to the key width
    for the flash kernel) is the expanded form to bf16 rounding, over the same rows, and takes
    the expanded form's conditions (consecutive positions, more than QUERY_BLOCK queries)."""
    from lingc.models import mla as mla_module
    torch.manual_seed(45)
    cfg = model.config
    layer = mla_layer(model, 0)
    monkeypatch.setattr(mla_module, "QUERY_BLOCK", 4)
    start, T = 5, 11
    a = cache_with_history(cfg, start, seed=45)
    a.kv[layer.cache_index][0, start + T:] = 100 * torch.randn(MAX_LEN - start - T, cfg.mla_cache_dim)
    b = a.clone()
    x = torch.randn(T, cfg.hidden_size)
    pos = torch.arange(start, start + T)
    monkeypatch.setattr(mla_module, "PREFILL_FORM", "expanded")
    fp32 = layer(x, pos, a)
    bf16_calls, real = [], MLAAttention._attend_expanded

    def spy(self, q_nope, q_rope, start, kv_cache, bf16=False):
        bf16_calls.append((q_nope.shape[0], bf16))
        return real(self, q_nope, q_rope, start, kv_cache, bf16)

    monkeypatch.setattr(MLAAttention, "_attend_expanded", spy)
    monkeypatch.setattr(mla_module, "PREFILL_FORM", "expanded-bf16")
    low = layer(x, pos, b)
    assert bf16_calls == [(T, True)]
    assert torch.equal(a.kv[layer.cache_index], b.kv[layer.cache_index])
    assert_rel_close(low, fp32, 2e-2, "expanded-bf16 vs expanded")
    layer(x[:4], torch.arange(3, 7), cache_with_history(cfg, 3, seed=45))      # QUERY_BLOCK queries
    layer(x[:6], torch.tensor([3, 4, 5, 7, 8, 9]), cache_with_history(cfg, 3, seed=45))
    assert bf16_calls == [(T, True)]


def test_prefill_form_rejects_an_unknown_form(monkeypatch):
    from lingc.models import mla as mla_module
    monkeypatch.setattr(mla_module, "PREFILL_FORM", "flash")
    with pytest.raises(ValueError, match="PREFILL_FORM = 'flash'.*expanded"):
        mla_module.prefill_attention_form(torch.zeros(1))


def test_query_blocks_compile_in_one_graph(model, monkeypatch):
    """Under torch.compile the blocks read the whole cache (no host read of positions): one graph,
    the same result."""
    from lingc.models import mla as mla_module
    torch._dynamo.reset()
    torch.manual_seed(41)
    cfg = model.config
    layer = mla_layer(model, 0)
    start, T = 5, 11
    a = cache_with_history(cfg, start, seed=41)
    b = a.clone()
    x = torch.randn(T, cfg.hidden_size)
    pos = torch.arange(start, start + T)
    monkeypatch.setattr(mla_module, "QUERY_BLOCK", 4)
    monkeypatch.setattr(mla_module, "PREFILL_FORM", "expanded")     # eager only: no host read compiled
    eager = layer(x, pos, a)
    compiled = torch.compile(layer, backend="eager", fullgraph=True)(x, pos, b)
    assert_rel_close(compiled, eager, 1e-6, "compiled query blocks vs eager")
    torch._dynamo.reset()


def test_cache_row_is_normed_latent_and_roped_key(model):
    torch.manual_seed(3)
    cfg = model.config
    layer = mla_layer(model, 0)
    cache = cache_with_history(cfg, 4)
    x = torch.randn(3, cfg.hidden_size)
    pos = torch.tensor([4, 5, 6])
    layer(x, pos, cache)
    kv = layer.kv_a_proj_with_mqa(x)
    rank = cfg.kv_lora_rank
    expect = torch.cat([layer.kv_a_layernorm(kv[:, :rank]),
                        rope_complex(kv[:, rank:], pos, cfg.rope_theta).float()], -1)
    assert_rel_close(cache.kv[layer.cache_index][0, 4:7], expect, 1e-6, "cache rows")
    assert torch.equal(layer.project_kv(x, pos), cache.kv[layer.cache_index][0, 4:7])


def test_causal_mask(model):
    torch.manual_seed(4)
    cfg = model.config
    layer = mla_layer(model, 0)
    start, T = 7, 6
    x = torch.randn(T, cfg.hidden_size)
    pos = torch.arange(start, start + T)
    base = cache_with_history(cfg, start, seed=1)
    out = layer(x, pos, base.clone())
    # Rows after the last query position (e.g. a rejected chain's leftovers) are never seen.
    dirty = base.clone()
    dirty.kv[layer.cache_index][0, start + T:] = 100 * torch.randn(MAX_LEN - start - T, cfg.mla_cache_dim)
    assert torch.equal(layer(x, pos, dirty), out)
    # Within the T queries, query t does not see rows t+1..: a prefix run gives the same rows.
    for t in (0, 2, 4):
        prefix = layer(x[:t + 1], pos[:t + 1], base.clone())
        assert_rel_close(prefix, out[:t + 1], 1e-6, f"prefix of {t + 1}")
    # Control: perturbing an earlier row does change the output (the check above is not vacuous).
    earlier = base.clone()
    earlier.kv[layer.cache_index][0, start - 1] += 5 * torch.randn(cfg.mla_cache_dim)
    assert not torch.allclose(layer(x, pos, earlier), out, atol=1e-3)


def test_interleaved_rope_matches_complex():
    torch.manual_seed(5)
    d, theta = 8, 10000.0
    x = torch.randn(5, 3, d)
    pos = torch.tensor([0, 1, 17, 255, 300])
    got = apply_rope_interleaved(x, pos, rope_inv_freq(d, theta))
    assert got.dtype == x.dtype
    assert_rel_close(got, rope_complex(x, pos, theta).float(), 1e-6, "rope")
    assert torch.equal(got[0], x[0])                         # position 0 is the identity
    # Rotations preserve each pair's norm.
    assert torch.allclose(got.unflatten(-1, (d // 2, 2)).norm(dim=-1),
                          x.unflatten(-1, (d // 2, 2)).norm(dim=-1), atol=1e-5)
    # Flash's rope (64 dims, theta 6e6) at a long-context position, looser for fp32 angles.
    x = torch.randn(2, 4, 64)
    pos = torch.tensor([3, 200_000])
    got = apply_rope_interleaved(x, pos, rope_inv_freq(64, 6.0e6))
    assert_rel_close(got, rope_complex(x, pos, 6.0e6).float(), 2e-3, "rope at 200k")
    assert_rel_close(got[0], rope_complex(x[:1], pos[:1], 6.0e6)[0].float(), 1e-6, "rope at 3")


@pytest.mark.parametrize("T, rope_dtype", [(7, torch.bfloat16), (40, torch.float32)])
def test_tensor_core_attention_equals_fp32(model, T, rope_dtype):
    """_attend_tensor_cores (its products emulated on the CPU: exact bf16 products, fp32 sums)
    against the fp32 einsums of _attend over the same bf16 cache rows: the hi/lo halves keep the
    fp32 operands to ~2^-17, a bf16 q_rope enters whole, the mask is the same."""
    layer = mla_layer(model, 0)
    cfg = model.config
    H, R, P = cfg.num_attention_heads, cfg.kv_lora_rank, cfg.qk_rope_head_dim
    g = torch.Generator().manual_seed(T)
    rows = torch.randn(50, R + P, generator=g).bfloat16()
    q_lat = torch.randn(T, H, R, generator=g)
    q_rope = torch.randn(T, H, P, generator=g).to(rope_dtype)
    pos = torch.arange(50 - T - 3, 50 - 3)
    got = layer._attend_tensor_cores(q_lat, q_rope, pos, rows)
    expect = layer._attend(q_lat, q_rope, pos, rows.float())
    err = ((got - expect).norm() / expect.norm()).item()
    assert got.shape == (T, H, R) and got.dtype == torch.float32
    assert err < 2e-5, f"relative error {err:.2e}"
    lossy = layer._attend(q_lat.bfloat16().float(), q_rope.bfloat16().float(), pos, rows.float())
    assert ((lossy - expect).norm() / expect.norm()).item() > 10 * err    # the lo halves matter


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["tiny", "flash-tp4-rank"])
def test_gpu_prefill_blocks_on_tensor_cores(name, monkeypatch):
    """A bf16 cache on CUDA: prefill blocks attend on bf16 tensor cores (hi/lo halves of the fp32
    operands) and agree with the fp32 einsums within the halves' 2^-17 rounding; every block
    takes that path."""
    from lingc.models import mla as mla_module
    from lingc.models import preset
    cfg = preset(name)
    with torch.device("meta"):
        layer = MLAAttention(cfg, cfg.mla_layers[0], 0)
    H, R, P = cfg.num_attention_heads, cfg.kv_lora_rank, cfg.qk_rope_head_dim
    g = torch.Generator(device="cuda").manual_seed(len(name))
    start, T, L = 37, 600, 700
    kv = torch.randn(L, R + P, device="cuda", generator=g).bfloat16()
    q_lat = torch.randn(T, H, R, device="cuda", generator=g) * 0.1
    q_rope = torch.randn(T, H, P, device="cuda", generator=g).bfloat16()
    pos = torch.arange(start, start + T, device="cuda")
    assert mla_module.tensor_core_attention_applies(kv)
    assert mla_module.prefill_attention_form(kv) == "expanded-bf16"   # CUDA's default for a bf16 cache
    assert mla_module.prefill_attention_form(kv.float()) == "expanded"    # and for an fp32 one
    monkeypatch.setattr(mla_module, "PREFILL_FORM", "tensor-cores")
    calls = []
    real = MLAAttention._attend_tensor_cores

    def spy(self, q, qr, p, rows):
        calls.append(rows.shape[0])
        return real(self, q, qr, p, rows)

    monkeypatch.setattr(MLAAttention, "_attend_tensor_cores", spy)
    got = layer._attend_blocks(q_lat, q_rope, pos, kv)
    assert calls == [start + 256, start + 512, start + 600]
    monkeypatch.setattr(mla_module, "PREFILL_FORM", "fp32")
    expect = layer._attend_blocks(q_lat, q_rope, pos, kv)
    assert got.dtype == torch.float32 and got.shape == (T, H, R)
    err = ((got - expect).norm() / expect.norm()).item()
    assert err < 2e-5, f"tensor-core blocks vs fp32 einsums: relative error {err:.2e}"


@pytest.mark.gpu
def test_gpu_expanded_bf16_prefill_runs_flash_attention_within_bf16_rounding():
    """The "expanded-bf16" form at flash-tp4-rank's shapes runs on the flash-attention kernel
    alone (qk head dim 192, values padded from 128) and lands within bf16 rounding of the fp32
    expanded form."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from lingc.models import preset
    cfg = preset("flash-tp4-rank")
    with torch.device("cuda"):
        layer = MLAAttention(cfg, cfg.mla_layers[0], 0)
    H, R, P = cfg.num_attention_heads, cfg.kv_lora_rank, cfg.qk_rope_head_dim
    g = torch.Generator(device="cuda").manual_seed(17)
    with torch.no_grad():
        layer.kv_b_proj.weight.copy_(torch.randn(layer.kv_b_proj.weight.shape, device="cuda", generator=g) * R ** -0.5)
    start, T = 300, 1000
    kv = torch.randn(start + T + 50, R + P, device="cuda", generator=g).to(cfg.dtype)
    kv[start + T:] = 1e4                                      # past the chunk: must not be read
    q_nope = torch.randn(T, H, cfg.qk_nope_head_dim, device="cuda", generator=g).to(cfg.dtype)
    q_rope = torch.randn(T, H, P, device="cuda", generator=g).to(cfg.dtype)
    with torch.no_grad(), sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
        low = layer._attend_expanded(q_nope, q_rope, start, kv, bf16=True)
    with torch.no_grad():
        ref = layer._attend_expanded(q_nope, q_rope, start, kv)
    assert low.dtype == torch.float32 and low.shape == ref.shape == (T, H, cfg.v_head_dim)
    err = ((low - ref).norm() / ref.norm()).item()
    assert err < 1e-2, f"expanded-bf16 vs expanded: relative error {err:.2e}"


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["tiny", "flash-tp4-rank"])
def test_gpu_expanded_prefill_equals_fp32_einsums(name):
    """The fp32 expanded prefill form (CUDA's default over an fp32 cache) over a bf16 cache: keys
    and values expanded through kv_b_proj, one fused causal SDPA in fp32, against the absorbed fp32 einsums over the same rows (w_k into
    the query, w_v into the output); both are fp32 arithmetic, so they agree to its rounding."""
    from lingc.models import preset
    cfg = preset(name)
    with torch.device("cuda"):
        layer = MLAAttention(cfg, cfg.mla_layers[0], 0)
    H, R, P = cfg.num_attention_heads, cfg.kv_lora_rank, cfg.qk_rope_head_dim
    nope, vd = cfg.qk_nope_head_dim, cfg.v_head_dim
    g = torch.Generator(device="cuda").manual_seed(7 + len(name))
    with torch.no_grad():
        layer.kv_b_proj.weight.copy_(torch.randn(layer.kv_b_proj.weight.shape, device="cuda", generator=g) * R ** -0.5)
    start, T = 300, 600
    L = start + T
    kv = torch.randn(L + 50, R + P, device="cuda", generator=g).to(cfg.dtype)
    kv[L:] = 1e4                                             # past the chunk: must not be read
    q_nope = torch.randn(T, H, nope, device="cuda", generator=g).to(cfg.dtype)
    q_rope = torch.randn(T, H, P, device="cuda", generator=g).to(cfg.dtype)
    pos = torch.arange(start, start + T, device="cuda")
    from torch.nn.attention import SDPBackend, sdpa_kernel
    with torch.no_grad(), sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION]):   # fused, scores never stored
        got = layer._attend_expanded(q_nope, q_rope, start, kv)
    with torch.no_grad():
        w_kv = layer.kv_b_proj.weight.view(H, nope + vd, R).float()
        q_lat = torch.einsum("thn,hnr->thr", q_nope.float(), w_kv[:, :nope])
        o_lat = layer._attend(q_lat, q_rope, pos, kv[:L].float())
        expect = torch.einsum("thr,hvr->thv", o_lat, w_kv[:, nope:])
    assert got.dtype == torch.float32 and got.shape == (T, H, vd)
    err = ((got - expect).norm() / expect.norm()).item()
    assert err < 2e-5, f"expanded SDPA vs absorbed fp32 einsums: relative error {err:.2e}"


def test_prefill_reads_no_positions(monkeypatch):
    """The prefill loop records each chunk's positions run (host integers), so the MLA layers of
    the target and the draft read none back: no host-GPU synchronisation in a prefill. The
    expanded form (CUDA's default) is forced on the CPU, where it is the path that asks."""
    from model_helpers import tiny_model

    from lingc.decoding.reference import greedy_prompt_prefill
    from lingc.models import Ling3Cache
    from lingc.models import mla as mla_module
    model = tiny_model(seed=3)
    reads, real = [], mla_module._read_run
    monkeypatch.setattr(mla_module, "_read_run", lambda p: reads.append(p.numel()) or real(p))
    monkeypatch.setattr(mla_module, "PREFILL_FORM", "expanded")
    cache = Ling3Cache.allocate(model.config, 400)
    # Chunks longer than QUERY_BLOCK take the expanded form, which asks for the positions' run.
    chunk = mla_module.QUERY_BLOCK + 24
    prompt = torch.randint(0, model.config.vocab_size, (chunk + 40,))
    greedy_prompt_prefill(model, cache, prompt, draft=model.nextn is not None, chunk=chunk)
    assert reads == []
    # The forward still reads positions it was not told about (a caller's own tensor).
    mla_module.positions_run(torch.arange(3, 9))
    assert reads == [6]


def test_positions_run_reads_a_positions_tensor_once(monkeypatch):
    """A forward's MLA layers share one host read of their positions (each read is a host-GPU
    synchronisation on CUDA); a new tensor or an in-place change reads again."""
    from lingc.models import mla as mla_module
    reads, real = [], mla_module._read_run
    monkeypatch.setattr(mla_module, "_read_run", lambda p: reads.append(1) or real(p))
    p = torch.arange(5, 12)
    assert mla_module.positions_run(p) == (5, 11, True)
    assert mla_module.positions_run(p) == (5, 11, True)
    assert len(reads) == 1
    p[3] = 0
    assert mla_module.positions_run(p) == (5, 11, False) and len(reads) == 2
    q = torch.arange(5, 12)
    assert mla_module.positions_run(q) == (5, 11, True) and len(reads) == 3
