"""KDA: the layer against an independent per-head reference, chunked vs recurrent, prefill vs decode.

The reference below is written from the formulas of docs/ling3-model.md (KDA section) with
explicit per-head matrices in float64; it shares no code with lingc.models.kda_math.
"""

import math

import pytest
import torch
from model_helpers import assert_rel_close, randomize_cache_, tiny_model

from lingc.models import Ling3Cache
from lingc.models.kda import RECURRENT_MAX_T, KDAAttention
from lingc.models.kda_math import kda_chunked, kda_gate, kda_recurrent, l2norm


@pytest.fixture(scope="module")
def model():
    return tiny_model(seed=1)


def kda_layer(model, idx=0) -> KDAAttention:
    layer = model.target_layers[model.config.kda_layers[idx]].attention
    assert isinstance(layer, KDAAttention)
    return layer


def _sig(x):
    return 1.0 / (1.0 + torch.exp(-x))


class RefKDA:
    """Token-by-token KDA layer from the formulas, per head, in float64."""

    def __init__(self, layer: KDAAttention, lower_bound: float, eps: float, state, conv):
        self.L = layer
        self.H, self.K = layer.num_heads, layer.head_dim
        self.lb, self.eps = lower_bound, eps
        self.S = state.double().clone()                       # [H, K, V]
        # windows[i]: list of the previous W-1 projection outputs of q/k/v, oldest first.
        self.windows = [[conv[i][:, j].double().clone() for j in range(conv.shape[-1])]
                        for i in range(3)]

    def w(self, lin):
        return lin.weight.double()

    def step(self, x):                                        # x: [hidden]
        L, H, K = self.L, self.H, self.K
        x = x.double()
        convs = []
        for i, (proj, conv) in enumerate(((L.q_proj, L.q_conv1d), (L.k_proj, L.k_conv1d),
                                          (L.v_proj, L.v_conv1d))):
            p = self.w(proj) @ x                              # [D]
            hist = self.windows[i] + [p]                      # W inputs, oldest first
            wt = conv.weight.double()[:, 0, :]                # [D, W]; tap W-1 is the current input
            y = sum(wt[:, j] * hist[j] for j in range(len(hist)))
            convs.append(y * _sig(y))                         # SiLU
            self.windows[i] = hist[1:]
        q, k, v = convs
        f = self.w(L.f_proj) @ x
        b = self.w(L.b_proj) @ x
        gz = self.w(L.g_proj) @ x
        a_log, dt_bias = L.A_log.double(), L.dt_bias.double()
        outs = []
        for h in range(H):
            sl = slice(h * K, (h + 1) * K)
            qh = q[sl] / torch.sqrt((q[sl] ** 2).sum() + 1e-6) / math.sqrt(K)
            kh = k[sl] / torch.sqrt((k[sl] ** 2).sum() + 1e-6)
            vh = v[sl]
            gate = self.lb * _sig(torch.exp(a_log[h]) * (f[sl] + dt_bias[sl]))    # [K]
            beta = _sig(b[h])
            S = torch.diag(torch.exp(gate)) @ self.S[h]
            S = S + beta * torch.outer(kh, vh - S.T @ kh)
            self.S[h] = S
            o = S.T @ qh
            o = o / torch.sqrt((o ** 2).mean() + self.eps) * L.o_norm.weight.double()
            outs.append(o * _sig(gz[sl]))
        return self.w(L.o_proj) @ torch.cat(outs)

    def conv_window(self):                                    # [3, D, W-1] like the cache
        return torch.stack([torch.stack(w, -1) for w in self.windows], 0)


def test_kda_layer_matches_formula_reference(model):
    torch.manual_seed(0)
    cfg = model.config
    layer = kda_layer(model, 1)
    j = layer.cache_index
    cache = randomize_cache_(Ling3Cache.allocate(cfg, 32), seed=3)
    assert cache.state[j].abs().min() > 0 and cache.conv[j].abs().min() > 0
    # The cache holds each head's state as [V, K]; the formulas' S is [K, V].
    ref = RefKDA(layer, cfg.kda_lower_bound, cfg.rms_norm_eps, cache.state[j][0].transpose(-1, -2), cache.conv[j][0])
    pos = 5
    # Decode steps, then a short multi-token (recurrent path) call, then decode again.
    for T in (1, 1, 1, 3, 1, 2):
        x = torch.randn(T, cfg.hidden_size)
        out = layer(x, torch.arange(pos, pos + T), cache)
        expect = torch.stack([ref.step(x[t]) for t in range(T)])
        assert_rel_close(out, expect, 2e-5, f"output at T={T}, pos={pos}")
        assert_rel_close(cache.state[j][0].transpose(-1, -2), ref.S, 2e-5, "state")
        assert_rel_close(cache.conv[j][0], ref.conv_window(), 1e-6, "conv window")
        pos += T
    # The other KDA layers' cache entries are untouched.
    other = Ling3Cache.allocate(cfg, 32)
    randomize_cache_(other, seed=3)
    for i in range(len(cache.state)):
        if i != j:
            assert torch.equal(cache.state[i], other.state[i]) and torch.equal(cache.conv[i], other.conv[i])


def _random_kda_inputs(T, H=3, K=16, V=24, near_lb=False, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = l2norm(torch.randn(T, H, K, generator=g)) * K ** -0.5
    k = l2norm(torch.randn(T, H, K, generator=g))
    v = torch.randn(T, H, V, generator=g)
    f = torch.randn(T, H, K, generator=g)
    a_log = torch.rand(H, generator=g) * math.log(16)
    dt_bias = torch.randn(H * K, generator=g) * 0.5
    if near_lb:
        # Push half of the key channels against the lower bound (gates ~ -5 + 1e-4): the chunk's
        # cumulative decay reaches ~ -320 and exp underflows; the rest keep a slow decay.
        f[..., : K // 2] = 8.0 + torch.rand(T, H, K // 2, generator=g)
        f[..., K // 2:] = -2.0 - torch.rand(T, H, K - K // 2, generator=g)
    gate = kda_gate(f, a_log, dt_bias, -5.0)
    beta = torch.sigmoid(torch.randn(T, H, generator=g))
    state = torch.randn(H, K, V, generator=g) * 0.5
    return q, k, v, gate, beta, state


@pytest.mark.parametrize("near_lb", [False, True])
@pytest.mark.parametrize("chunk", [16, 64])
@pytest.mark.parametrize("T", [1, 5, 63, 64, 65, 130])
def test_chunked_matches_recurrent(T, chunk, near_lb):
    q, k, v, g, beta, state = _random_kda_inputs(T, near_lb=near_lb, seed=T * 7 + chunk)
    assert (g <= 0).all() and (g >= -5).all()
    if near_lb:
        assert (g < -4.99).float().mean() > 0.45
    o_r, S_r = kda_recurrent(q, k, v, g, beta, state)
    o_c, S_c = kda_chunked(q, k, v, g, beta, state, chunk=chunk)
    assert o_c.dtype == S_c.dtype == torch.float32
    assert_rel_close(o_c, o_r, 1e-5, "output")
    assert_rel_close(S_c, S_r, 1e-5, "final state")


def test_recurrent_return_states():
    q, k, v, g, beta, state = _random_kda_inputs(6)
    o, S, states = kda_recurrent(q, k, v, g, beta, state, return_states=True)
    assert len(states) == 6 and torch.equal(states[-1], S)
    o3, S3 = kda_recurrent(q[:3], k[:3], v[:3], g[:3], beta[:3], state)
    assert torch.equal(states[2], S3) and torch.equal(o[:3], o3)


@pytest.mark.parametrize("T", [40, 70])
def test_layer_prefill_matches_decode(model, T):
    torch.manual_seed(1)
    cfg = model.config
    layer = kda_layer(model, 0)
    j = layer.cache_index
    assert T > RECURRENT_MAX_T               # the chunked path
    a = randomize_cache_(Ling3Cache.allocate(cfg, 128), seed=5)
    b = a.clone()
    x = torch.randn(T, cfg.hidden_size)
    start = 11
    pre = layer(x, torch.arange(start, start + T), a)
    dec = torch.cat([layer(x[t:t + 1], torch.tensor([start + t]), b) for t in range(T)])
    assert_rel_close(pre, dec, 1e-5, "prefill vs decode output")
    assert_rel_close(a.state[j], b.state[j], 1e-5, "state")
    # The window holds projection outputs, from a T-row GEMM here and 1-row GEMMs there.
    assert torch.allclose(a.conv[j], b.conv[j], rtol=1e-5, atol=1e-6)
