"""MoE: grouped sigmoid router vs a per-token Python reference, expert bias, bf16 router, MoE output
vs a per-token loop over the chosen experts, SwiGLU clamps, chunking by MOE_CHUNK."""

import dataclasses

import pytest
import torch
import torch.nn.functional as F
from model_helpers import assert_rel_close, tiny_model

from lingc.models.moe import MOE_CHUNK, MoE, grouped_topk, swiglu


@pytest.fixture(scope="module")
def model():
    return tiny_model(seed=3)


def moe_layer(model, layer_id) -> MoE:
    mlp = model.model.layers[layer_id].mlp
    assert isinstance(mlp, MoE)
    return mlp


def ref_route(s, bias, cfg):
    """One token: {expert id: weight}. s: unbiased sigmoid scores [E]; bias: expert_bias [E]."""
    s, c = s.tolist(), (s.double() + bias.double()).tolist()
    per = len(s) // cfg.n_group
    group_score = []
    for gi in range(cfg.n_group):
        top2 = sorted(c[gi * per:(gi + 1) * per], reverse=True)[:2]
        group_score.append(top2[0] + top2[1])
    kept = sorted(range(cfg.n_group), key=lambda gi: -group_score[gi])[:cfg.topk_group]
    candidates = [e for gi in kept for e in range(gi * per, (gi + 1) * per)]
    chosen = sorted(candidates, key=lambda e: -c[e])[:cfg.num_experts_per_tok]
    total = sum(s[e] for e in chosen)
    return {e: s[e] / total * cfg.routed_scaling_factor for e in chosen}


def ref_swiglu(g, u, limit):
    a = g * torch.sigmoid(g)
    if limit > 0:
        a = torch.minimum(a, torch.tensor(limit, dtype=a.dtype))
        u = u.clamp(-limit, limit)
    return a * u


def ref_moe_token(mlp: MoE, cfg, x):
    """One token through the chosen experts (checkpoint-layout weights) + the unscaled shared expert."""
    x = x.double()
    s = torch.sigmoid(mlp.gate.weight.double() @ x)
    route = ref_route(s, mlp.gate.expert_bias, cfg)
    I = cfg.moe_intermediate_size
    y = torch.zeros_like(x)
    for e, w in route.items():
        gate_w, up_w = mlp.experts.w13[e, :I].double(), mlp.experts.w13[e, I:].double()
        down_w = mlp.experts.w2[e].double()
        y += w * (down_w @ ref_swiglu(gate_w @ x, up_w @ x, mlp.experts.limit))
    sh = mlp.shared_experts
    y += sh.down_proj.weight.double() @ ref_swiglu(sh.gate_proj.weight.double() @ x,
                                                   sh.up_proj.weight.double() @ x, sh.limit)
    return y


def check_routing(ids, w, s, bias, cfg):
    assert ids.shape == w.shape == (s.shape[0], cfg.num_experts_per_tok)
    for t in range(s.shape[0]):
        ref = ref_route(s[t], bias, cfg)
        got = dict(zip(ids[t].tolist(), w[t].tolist()))
        assert set(got) == set(ref), f"token {t}: experts {sorted(got)} != {sorted(ref)}"
        for e in ref:
            assert abs(got[e] - ref[e]) < 1e-5, (t, e, got[e], ref[e])


def test_router_matches_reference(model):
    torch.manual_seed(0)
    cfg = model.config
    router = moe_layer(model, 3).gate
    x = torch.randn(48, cfg.hidden_size)
    ids, w = router(x)
    s = torch.sigmoid(x.double() @ router.weight.double().T)
    check_routing(ids, w, s, router.expert_bias, cfg)
    assert torch.allclose(w.sum(-1), torch.full((48,), cfg.routed_scaling_factor))
    # Grouping matters: every token's experts lie in at most topk_group groups, and plain top-k
    # over all experts would pick differently for some tokens.
    per = cfg.num_experts // cfg.n_group
    assert all(len(set((ids[t] // per).tolist())) <= cfg.topk_group for t in range(48))
    plain = (s + router.expert_bias.double()).topk(cfg.num_experts_per_tok, -1).indices
    assert any(set(plain[t].tolist()) != set(ids[t].tolist()) for t in range(48))


def test_bias_selects_but_does_not_weight(model):
    torch.manual_seed(1)
    cfg = model.config
    s = torch.sigmoid(torch.randn(1, cfg.num_experts))
    zero = torch.zeros(cfg.num_experts)
    ids0, w0 = grouped_topk(s, zero, cfg)
    out = [e for e in range(cfg.num_experts) if e not in ids0[0].tolist()]
    bias = zero.clone()
    bias[out[0]] = 2.0                       # a boost that puts an unchosen expert in the top-k
    ids1, w1 = grouped_topk(s, bias, cfg)
    assert out[0] in ids1[0].tolist() and set(ids1[0].tolist()) != set(ids0[0].tolist())
    check_routing(ids1, w1, s.double(), bias, cfg)
    # Weights are the UNBIASED scores at the chosen experts, renormalised, times the scale.
    expect = s[0, ids1[0]] / s[0, ids1[0]].sum() * cfg.routed_scaling_factor
    assert torch.allclose(w1[0], expect, atol=1e-6)
    biased = (s + bias)[0, ids1[0]]
    assert not torch.allclose(w1[0], biased / biased.sum() * cfg.routed_scaling_factor, atol=1e-3)
    # Through the Router module too: same x, different bias, different selection.
    router = moe_layer(model, 2).gate
    x = torch.randn(1, cfg.hidden_size)
    ids_a, _ = router(x)
    saved = router.expert_bias.clone()
    try:
        unchosen = [e for e in range(cfg.num_experts) if e not in ids_a[0].tolist()][0]
        router.expert_bias[unchosen] += 3.0
        ids_b, w_b = router(x)
        assert unchosen in ids_b[0].tolist()
        sx = torch.sigmoid(router.logits(x))[0, ids_b[0]]
        assert torch.allclose(w_b[0], sx / sx.sum() * cfg.routed_scaling_factor, atol=1e-6)
    finally:
        router.expert_bias.copy_(saved)


def test_bf16_router_runs():
    torch.manual_seed(2)
    m32 = tiny_model(seed=4)
    # router_dtype bf16 on an fp32 model is the fp32 GEMM (the weight dtype): identical routing.
    m16r = tiny_model(seed=4, router_dtype="bf16")
    x = torch.randn(8, m32.config.hidden_size)
    a, b = moe_layer(m32, 2).gate(x), moe_layer(m16r, 2).gate(x)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    # A bf16 model with the bf16 router: bf16 GEMM, fp32 scores and weights, a valid routing.
    from lingc.models import build_model, preset
    mb = build_model(preset("tiny", router_dtype="bf16"), dtype=torch.bfloat16, seed=4, progress=False)
    mlp = moe_layer(mb, 2)
    xb = x.bfloat16()
    logits = mlp.gate.logits(xb)
    assert logits.dtype == torch.float32
    assert_rel_close(logits, F.linear(xb.float(), mlp.gate.weight.float()), 2e-2, "bf16 router logits")
    ids, w = mlp.gate(xb)
    assert w.dtype == torch.float32 and ids.dtype == torch.int64
    assert torch.allclose(w.sum(-1), torch.full((8,), mb.config.routed_scaling_factor), atol=1e-5)
    y = mlp(xb)
    assert y.dtype == torch.bfloat16 and torch.isfinite(y).all()


@pytest.mark.parametrize("layer_id", [1, 4, 5, 6])
def test_moe_matches_per_token_loop(model, layer_id):
    torch.manual_seed(layer_id)
    cfg = model.config
    mlp = moe_layer(model, layer_id)
    assert mlp.experts.limit == cfg.expert_limit(layer_id)
    assert mlp.shared_experts.limit == cfg.shared_limit(layer_id)
    x = torch.randn(7, cfg.hidden_size)
    y = mlp(x)
    expect = torch.stack([ref_moe_token(mlp, cfg, x[t]) for t in range(7)])
    assert_rel_close(y, expect, 1e-5, f"MoE layer {layer_id}")


def test_clamps_bite_in_tiny_model(model):
    """The tiny preset's clamped layers do clamp on ordinary activations (the feature is exercised)."""
    torch.manual_seed(6)
    cfg = model.config
    mlp = moe_layer(model, 5)
    assert mlp.experts.limit > 0 and mlp.shared_experts.limit > 0
    x = torch.randn(16, cfg.hidden_size)
    y = mlp(x)
    limits = (mlp.experts.limit, mlp.shared_experts.limit)
    try:
        mlp.experts.limit = mlp.shared_experts.limit = 0.0
        y_free = mlp(x)
    finally:
        mlp.experts.limit, mlp.shared_experts.limit = limits
    assert (y - y_free).abs().max() > 1e-2


@pytest.mark.parametrize("limit", [0.2, 0.6, 4.0])
def test_swiglu_clamp(limit):
    torch.manual_seed(7)
    g, u = torch.randn(4096) * 6, torch.randn(4096) * 6
    got = swiglu(g, u, limit)
    free = swiglu(g, u, 0.0)
    assert torch.allclose(free, F.silu(g) * u, atol=1e-6)
    assert (got - free).abs().max() > 0.1, "the clamp must change large inputs"
    expect = torch.minimum(F.silu(g), torch.tensor(limit)) * u.clamp(-limit, limit)
    assert torch.allclose(got, expect, atol=1e-6)
    # silu is bounded below by -0.278: a limit under that must not clamp the negative side.
    if limit < 0.278:
        neg = (F.silu(g) < -limit) & (u.abs() < limit)
        assert neg.any() and torch.allclose(got[neg], F.silu(g[neg]) * u[neg], atol=1e-6)


def test_moe_chunked_equals_per_token(model):
    torch.manual_seed(8)
    cfg = model.config
    mlp = moe_layer(model, 4)
    T = 40
    assert T > 2 * MOE_CHUNK and T % MOE_CHUNK
    x = torch.randn(T, cfg.hidden_size)
    y = mlp(x)
    per_token = torch.cat([mlp(x[t:t + 1]) for t in range(T)])
    assert_rel_close(y, per_token, 1e-6, "chunked MoE vs per token")
    expect = torch.stack([ref_moe_token(mlp, cfg, x[t]) for t in (0, 17, 33, 39)])
    assert_rel_close(y[[0, 17, 33, 39]], expect, 1e-5, "chunked MoE vs reference")


# The grouped form (prefill chunks on CUDA): torch._grouped_mm over the pairs sorted by expert.

@pytest.mark.parametrize("layer_id", [1, 4])
def test_grouped_form_equals_gather_form(model, layer_id):
    """Experts.forward_grouped against the gather form and the float64 per-token reference, with a
    token repeated many times (one expert holding many pairs) and most experts holding none."""
    torch.manual_seed(20 + layer_id)
    cfg = model.config
    mlp = moe_layer(model, layer_id)
    x = torch.randn(40, cfg.hidden_size)
    x[3:35] = x[2]                                    # 33 copies of one token: its experts hold 33 pairs each
    ids, w = mlp.gate(x)
    counts = torch.bincount(ids.reshape(-1), minlength=cfg.num_experts)
    assert counts.max() >= 33 and (counts == 0).any(), counts
    got = mlp.experts.forward_grouped(x, ids, w)
    assert_rel_close(got, mlp.experts(x, ids, w), 1e-6, "grouped vs gather form")
    full = got + mlp.shared_experts(x).float()
    expect = torch.stack([ref_moe_token(mlp, cfg, x[t]) for t in (0, 2, 12, 39)])
    assert_rel_close(full[[0, 2, 12, 39]], expect, 1e-5, "grouped form vs reference")


def test_moe_forward_takes_the_grouped_form_in_chunks(model, monkeypatch):
    """MoE.forward's dispatch: where the grouped form applies it runs GROUPED_CHUNK tokens at a
    time through forward_grouped (never the gather form); elsewhere MOE_CHUNK through the gather."""
    from lingc.models import moe as moe_module
    torch.manual_seed(31)
    cfg = model.config
    mlp = moe_layer(model, 5)
    x = torch.randn(50, cfg.hidden_size)
    expect = mlp(x)
    assert not moe_module.grouped_form_applies(x)      # CPU: the gather form
    calls = {"grouped": [], "gather": []}
    real_grouped, real_gather = type(mlp.experts).forward_grouped, type(mlp.experts).forward

    def grouped(self, x, ids, w, *rest):
        calls["grouped"].append(x.shape[0])
        return real_grouped(self, x, ids, w, *rest)

    def gather(self, x, ids, w):
        calls["gather"].append(x.shape[0])
        return real_gather(self, x, ids, w)

    import lingc.runtime.kernels.moe_router as router_pkg
    selects, real_select = [], router_pkg.moe_select

    def select(logits, *args):
        selects.append(logits.shape[0])
        return real_select(logits, *args)

    monkeypatch.setattr(type(mlp.experts), "forward_grouped", grouped)
    monkeypatch.setattr(type(mlp.experts), "forward", gather)
    monkeypatch.setattr(router_pkg, "moe_select", select)
    monkeypatch.setattr(moe_module, "grouped_form_applies", lambda t: t.shape[0] >= 20)
    monkeypatch.setattr(moe_module, "GROUPED_CHUNK", 24)
    got = mlp(x)
    # The grouped chunks select with lingc::moe_select (ids and weights as torch.topk's here: no ties).
    assert calls == {"grouped": [24, 24, 2], "gather": []} and selects == [24, 24, 2]
    assert_rel_close(got, expect, 1e-6, "grouped chunks vs gather chunks")
    calls["grouped"].clear()
    selects.clear()
    mlp(x[:19])
    assert calls == {"grouped": [], "gather": [MOE_CHUNK, 19 - MOE_CHUNK]} and selects == []


def test_router_kernel_selection_equals_topk_selection(model):
    """Router(x, kernel=True) (lingc::moe_select; on the CPU its reference, stable sorts) picks and
    weights what the torch.topk form does when no two scores tie."""
    torch.manual_seed(37)
    gate = moe_layer(model, 5).gate
    x = torch.randn(40, model.config.hidden_size)
    ids, w = gate(x)
    k_ids, k_w = gate(x, kernel=True)
    assert k_ids.dtype == ids.dtype == torch.int64
    assert torch.equal(k_ids, ids)
    torch.testing.assert_close(k_w, w, rtol=1e-6, atol=1e-6)


def test_grouped_form_applies_only_to_prefill_sized_bf16_on_cuda():
    from lingc.models.moe import GROUPED_MIN_TOKENS, grouped_form_applies
    assert GROUPED_MIN_TOKENS > 16                      # decode and verify graphs keep the gather form
    assert not grouped_form_applies(torch.zeros(GROUPED_MIN_TOKENS, 8, dtype=torch.bfloat16))   # CPU
    if torch.cuda.is_available():
        assert grouped_form_applies(torch.zeros(GROUPED_MIN_TOKENS, 8, dtype=torch.bfloat16, device="cuda"))
        assert not grouped_form_applies(torch.zeros(GROUPED_MIN_TOKENS - 1, 8, dtype=torch.bfloat16, device="cuda"))
        assert not grouped_form_applies(torch.zeros(GROUPED_MIN_TOKENS, 8, device="cuda"))     # fp32


@pytest.mark.gpu
@pytest.mark.parametrize("T", [64, 300, 4100])
def test_gpu_grouped_form_on_flash_tp4_rank_shapes(T):
    """On CUDA in bf16 (torch._grouped_mm's sm_90 kernels), one flash-tp4-rank MoE layer (512
    experts, I = 192, H = 2560): MoE.forward takes the grouped form (4100 tokens: two chunks) and
    agrees with the gather form within bf16 rounding; group sizes are whatever the router gives
    (not multiples of anything, many empty)."""
    from lingc.models import moe as moe_module
    from lingc.models import preset
    from lingc.models.init import build_model
    cfg = preset("flash-tp4-rank", router_dtype="bf16")
    small = dataclasses.replace(cfg, num_hidden_layers=2, first_k_dense_replace=1, num_nextn_predict_layers=0)
    model = build_model(small, device="cuda", dtype=torch.bfloat16, seed=4, progress=False)
    mlp = moe_layer(model, 1)
    g = torch.Generator(device="cuda").manual_seed(T)
    x = torch.randn(T, cfg.hidden_size, device="cuda", dtype=torch.bfloat16, generator=g)
    assert moe_module.grouped_form_applies(x)
    got = mlp(x)
    orig = moe_module.GROUPED_MIN_TOKENS
    moe_module.GROUPED_MIN_TOKENS = 1 << 62
    try:
        expect = mlp(x)
    finally:
        moe_module.GROUPED_MIN_TOKENS = orig
    err = ((got.float() - expect.float()).norm() / expect.float().norm()).item()
    assert err < 1e-2, f"T={T}: grouped vs gather relative error {err:.2e}"
    assert torch.isfinite(got).all()
