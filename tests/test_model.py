"""The whole tiny model: decode vs chunked prefill, final-normed hidden, NEXTN draft, fullgraph
capture (one compile per shape, eager-equal), cache capacity errors."""

import pytest
import torch
import torch._dynamo
import torch._dynamo.testing
import torch.nn.functional as F
from model_helpers import assert_rel_close, cache_tensors_close, randomize_cache_, tiny_model

from lingc.decoding.reference import prefill
from lingc.models import Ling3Cache
from lingc.models.kda import RECURRENT_MAX_T


@pytest.fixture(scope="module")
def model():
    return tiny_model(seed=5)


def test_decode_equals_chunked_prefill(model):
    torch.manual_seed(0)
    cfg = model.config
    N, chunk = 53, 24                       # chunks 24, 24, 5: chunked KDA and MoE, then recurrent
    assert chunk > RECURRENT_MAX_T and N % chunk
    tokens = torch.randint(0, cfg.vocab_size, (N,))
    a, b = Ling3Cache.allocate(cfg, 64), Ling3Cache.allocate(cfg, 64)
    last_logits, hiddens = prefill(model, a, tokens, chunk=chunk)
    assert hiddens.shape == (N, cfg.hidden_size)
    dec_logits, dec_hidden = [], []
    for t in range(N):
        lg, h = model(tokens[t:t + 1], torch.tensor([t]), b)
        dec_logits.append(lg)
        dec_hidden.append(h)
    assert_rel_close(last_logits, dec_logits[-1][0], 1e-5, "last logits")
    assert_rel_close(hiddens, torch.cat(dec_hidden), 1e-5, "hidden states")
    assert_rel_close(model.lm_head(hiddens), torch.cat(dec_logits), 1e-5, "logits of every position")
    cache_tensors_close(a, b, 1e-5)
    assert torch.equal(a.kv[0][:, N:], torch.zeros_like(a.kv[0][:, N:]))   # no rows past the prompt
    # The greedy continuation agrees too.
    assert int(last_logits.argmax()) == int(dec_logits[-1][0].argmax())


def test_prompt_kernels_equal_the_plain_ops(model, monkeypatch):
    """Prompt chunks on CUDA (layers.prompt_kernels_apply) run the layer norms as lingc::rmsnorm
    and KDA's input glue and output norm as lingc::kda_prefill_inputs and
    lingc::gated_head_rmsnorm. Forced on the CPU (the ops' references): each is called once per
    module and chunk, and the prefill's logits, hidden states and cache (KDA states, conv windows,
    MLA rows) equal the plain ops'."""
    from lingc.models import kda as kda_module
    from lingc.models import layers
    from lingc.models.layers import PROMPT_KERNEL_MIN_TOKENS
    from lingc.runtime.kernels import kda_prefill_inputs as inputs_pkg
    from lingc.runtime.kernels import norms

    torch.manual_seed(2)
    cfg = model.config
    tokens = torch.randint(0, cfg.vocab_size, (40,))
    assert not layers.prompt_kernels_apply(torch.zeros(PROMPT_KERNEL_MIN_TOKENS, 4))     # CPU
    plain_cache = Ling3Cache.allocate(cfg, 48)
    plain = prefill(model, plain_cache, tokens, chunk=20)
    calls = {"rmsnorm": 0, "gated_head_rmsnorm": 0, "kda_prefill_inputs": 0}

    def spy(pkg, name):
        real = getattr(pkg, name)

        def call(*args):
            calls[name] += 1
            return real(*args)
        monkeypatch.setattr(pkg, name, call)

    applies = lambda x: x.shape[0] > RECURRENT_MAX_T          # noqa: E731 - the chunks, not decode
    monkeypatch.setattr(layers, "prompt_kernels_apply", applies)
    monkeypatch.setattr(kda_module, "prompt_kernels_apply", applies)
    spy(norms, "rmsnorm")
    spy(norms, "gated_head_rmsnorm")
    spy(inputs_pkg, "kda_prefill_inputs")
    cache = Ling3Cache.allocate(cfg, 48)
    fused = prefill(model, cache, tokens, chunk=20)
    # Every layer's two norms, MLA's latent norm and the final norm; KDA's output norms; 2 chunks.
    norms_n = sum(isinstance(m, layers.RMSNorm) for layer in model.target_layers for m in layer.modules()) + 1
    kda_n = sum(isinstance(layer.attention, kda_module.KDAAttention) for layer in model.target_layers)
    assert calls == {"rmsnorm": 2 * norms_n, "gated_head_rmsnorm": 2 * kda_n, "kda_prefill_inputs": 2 * kda_n}
    assert_rel_close(fused[0], plain[0], 1e-5, "last logits")
    assert_rel_close(fused[1], plain[1], 1e-5, "hidden states")
    cache_tensors_close(cache, plain_cache, 1e-5)
    for a, b in zip(cache.conv, plain_cache.conv):
        assert torch.equal(a, b)                       # the windows are copies of inputs: exact


def test_hidden_is_final_normed(model):
    torch.manual_seed(1)
    cfg = model.config
    cache = randomize_cache_(Ling3Cache.allocate(cfg, 32), seed=1, rows=4)
    ref_cache = cache.clone()
    ids, pos = torch.randint(0, cfg.vocab_size, (3,)), torch.tensor([4, 5, 6])
    logits, hidden = model(ids, pos, cache)
    # Recompute layer by layer and apply model.norm by hand.
    x = F.embedding(ids, model.model.word_embeddings.weight)
    for layer in model.target_layers:
        x = layer(x, pos, ref_cache)
    w = model.model.norm.weight
    normed = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + cfg.rms_norm_eps) * w
    assert_rel_close(hidden, normed, 1e-6, "hidden")
    assert not torch.allclose(hidden, x, atol=1e-2)          # not the pre-norm state
    assert torch.allclose((hidden / w).pow(2).mean(-1), torch.ones(3), atol=1e-3)
    assert_rel_close(logits, hidden @ model.lm_head.weight.T, 1e-6, "logits = lm_head(hidden)")
    assert logits.dtype == torch.float32 and logits.shape == (3, cfg.lm_head_size)


def test_last_logits_only(model):
    """forward / draft with last_logits_only: the last row's logits alone, the same hidden states
    and cache as the full forward (what prefill and draft_prefill call)."""
    torch.manual_seed(2)
    cfg = model.config
    ids, pos = torch.randint(0, cfg.vocab_size, (5,)), torch.arange(3, 8)
    base = randomize_cache_(Ling3Cache.allocate(cfg, 16), seed=2, rows=3)
    a, b = base.clone(), base.clone()
    full, hidden = model(ids, pos, a)
    last, hidden_last = model(ids, pos, b, last_logits_only=True)
    assert last.shape == (1, cfg.lm_head_size) and last.dtype == torch.float32
    assert torch.equal(hidden_last, hidden)
    assert_rel_close(last[0], full[-1], 1e-6, "last row's logits")
    cache_tensors_close(a, b, 0.0)
    th = torch.randn(5, cfg.hidden_size)
    dfull, dh = model.draft(ids, pos, th, a)
    dlast, dh_last = model.draft(ids, pos, th, b, last_logits_only=True)
    assert dlast.shape == (1, cfg.lm_head_size) and torch.equal(dh_last, dh)
    assert_rel_close(dlast[0], dfull[-1], 1e-6, "draft's last row's logits")


def test_nextn_draft_writes_only_draft_kv(model):
    torch.manual_seed(2)
    cfg = model.config
    cache = randomize_cache_(Ling3Cache.allocate(cfg, 32), seed=2, rows=5)
    before = cache.clone()
    ids, pos = torch.randint(0, cfg.vocab_size, (3,)), torch.tensor([5, 6, 7])
    target_hidden = torch.randn(3, cfg.hidden_size)
    logits, dh = model.draft(ids, pos, target_hidden, cache)
    assert logits.shape == (3, cfg.lm_head_size) and dh.shape == (3, cfg.hidden_size)
    assert torch.isfinite(logits).all()
    for name in ("kv", "state", "conv"):
        for x, y in zip(getattr(cache, name), getattr(before, name)):
            assert torch.equal(x, y), f"draft wrote the target's {name}"
    changed = (cache.draft_kv[0][0] != before.draft_kv[0][0]).any(-1).nonzero().flatten().tolist()
    assert changed == [5, 6, 7]
    # Draft logits come from the shared lm_head on the draft's final-normed hidden state.
    assert_rel_close(logits, dh @ model.lm_head.weight.T, 1e-6, "draft logits")
    # The draft depends on both inputs: the token and the target hidden state.
    c2 = before.clone()
    lg2, _ = model.draft(ids, pos, target_hidden + torch.randn_like(target_hidden), c2)
    assert not torch.allclose(lg2, logits, atol=1e-3)


def test_fullgraph_compile_one_graph_per_shape(model):
    torch.manual_seed(3)
    cfg = model.config
    torch._dynamo.reset()
    counter = torch._dynamo.testing.CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(model, backend=counter, fullgraph=True)
    ce = randomize_cache_(Ling3Cache.allocate(cfg, 64), seed=3, rows=8)
    cc = ce.clone()
    pos = 8
    try:
        for T, steps in ((1, 20), (6, 3)):
            for step in range(steps):
                ids = torch.randint(0, cfg.vocab_size, (T,))
                positions = torch.arange(pos, pos + T)
                lg_c, h_c = compiled(ids, positions, cc)
                lg_e, h_e = model(ids, positions, ce)
                assert_rel_close(lg_c, lg_e, 1e-5, f"logits T={T} step {step}")
                assert_rel_close(h_c, h_e, 1e-5, f"hidden T={T} step {step}")
                assert torch.equal(lg_c.argmax(-1), lg_e.argmax(-1))
                pos += T
            assert counter.frame_count == (1 if T == 1 else 2), f"recompiled at T={T}"
        cache_tensors_close(cc, ce, 1e-5)
    finally:
        torch._dynamo.reset()
    assert counter.frame_count == 2


def test_prefill_overflow_raises_naming_sizes(model):
    cfg = model.config
    cache = Ling3Cache.allocate(cfg, 10)
    tokens = torch.randint(0, cfg.vocab_size, (17,))
    with pytest.raises(ValueError, match=r"17.*10|10.*17") as e:
        prefill(model, cache, tokens)
    assert "17" in str(e.value) and "10" in str(e.value)
    # A continuation that runs past the end is caught too.
    with pytest.raises(ValueError, match="13"):
        prefill(model, cache, tokens[:5], start=8)
    with pytest.raises(ValueError, match="empty"):
        prefill(model, cache, tokens[:0])


def test_cache_allocate_limits(model):
    cfg = model.config
    with pytest.raises(ValueError, match=str(cfg.max_position_embeddings + 1)):
        Ling3Cache.allocate(cfg, cfg.max_position_embeddings + 1)
    with pytest.raises(ValueError, match="max_len=0"):
        Ling3Cache.allocate(cfg, 0)
    c = Ling3Cache.allocate(cfg, cfg.max_position_embeddings)
    assert c.max_len == cfg.max_position_embeddings
    H, D = cfg.num_attention_heads, cfg.head_dim
    assert len(c.kv) == len(cfg.mla_layers) and len(c.state) == len(cfg.kda_layers)
    assert c.kv[0].shape == (1, cfg.max_position_embeddings, cfg.mla_cache_dim)
    assert c.state[0].shape == (1, H, D, D) and c.state[0].dtype == torch.float32
    assert c.conv[0].shape == (1, 3, H * D, cfg.short_conv_kernel_size - 1)
    assert len(c.draft_kv) == 1 and c.draft_kv[0].shape == c.kv[0].shape


@pytest.mark.gpu
def test_gpu_prompt_kernels_equal_the_plain_ops(monkeypatch):
    """On CUDA the prompt chunks take lingc's kernels (the norms, KDA's input glue and output norm;
    the tiny model is fp32, so its MoE keeps the gather form); its prefill of 200 tokens in chunks
    of 128 and 72 agrees with the plain ops' (the prompt kernels turned off), logits and cache."""
    from lingc.models import kda as kda_module
    from lingc.models import layers

    model = tiny_model(seed=5).cuda()
    cfg = model.config
    tokens = torch.randint(0, cfg.vocab_size, (200,), generator=torch.Generator().manual_seed(3)).cuda()
    fused_cache = Ling3Cache.allocate(cfg, 208, device="cuda")
    fused = prefill(model, fused_cache, tokens, chunk=128)
    assert layers.prompt_kernels_apply(tokens.new_zeros(128, 1).float())
    for mod in (layers, kda_module):
        monkeypatch.setattr(mod, "prompt_kernels_apply", lambda x: False)
    plain_cache = Ling3Cache.allocate(cfg, 208, device="cuda")
    plain = prefill(model, plain_cache, tokens, chunk=128)
    assert_rel_close(fused[0], plain[0], 1e-5, "last logits")
    assert_rel_close(fused[1], plain[1], 1e-5, "hidden states")
    cache_tensors_close(fused_cache, plain_cache, 1e-5)

