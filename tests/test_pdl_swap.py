"""pdl_swap: norms, the KDA chain (persistent and staged), the gated head norm and the MLA decode
core on lingc ops; numbers (pass on vs off), counts, greedy tokens vs eager, foreign formulations
(a KDA layer with its state stored [V, K] or [K, V], x * sigmoid(x), another loop; RMSNorm
spellings), no whole-state copies left, and the dump's coverage and chains."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from backend_helpers import compile_lingc, dump_op_changes, final_graph_text, pinned_graph_text, run_and_report, stat
from expecttest import assert_expected_inline
from model_helpers import assert_rel_close, chain_accepting, randomize_cache_, tiny_model

import lingc.runtime.relay  # noqa: F401  (registers the relay ops)
from lingc.backend import compile_reports
from lingc.models import Ling3Cache

ops = torch.ops.lingc
P = 4                                    # prefilled positions
VOCAB = 300


@pytest.fixture(scope="module")
def tiny():
    torch.manual_seed(0)
    model = tiny_model()
    base = randomize_cache_(Ling3Cache.allocate(model.config, 32), seed=3, rows=P)
    return model, base


def verify_fn(model):
    def verify(chain, positions, cache):
        logits, hidden = model(chain, positions, cache)
        y = logits.argmax(-1)
        return y, ops.state_commit(ops.greedy_verdict(chain, y)), logits
    return verify


def rows(report):
    return {op: n for _, op, n, _ in report.kernels.rows}


def expected_counts(cfg):
    kda, mla = len(cfg.kda_layers), len(cfg.mla_layers)
    moe = sum(cfg.is_moe_layer(i) for i in range(cfg.num_hidden_layers))
    # input + post-attention norm per layer and the final norm (the first input norm with the
    # token embedding's gather folded in; a MoE layer's post-attention norm folded into its
    # router; MLA's kv_a_layernorm folded into its cache write) and MLA's two absorbed products
    # (q_nope @ W_uk, o_lat @ W_uv) per layer
    return {"lingc.kda_chain": kda, "lingc.gated_head_rmsnorm": kda, "lingc.mla_decode": mla,
            "lingc.mla_kv_write": mla, "lingc.rmsnorm": 2 * cfg.num_hidden_layers - moe,
            "lingc.rmsnorm_router": moe, "lingc.embedding_rmsnorm": 1, "lingc.head_matmul": 2 * mla}


def compare_on_off(fn, args, cache, role, tol=1e-5):
    results = []
    for off in ([], ["pdl_swap"]):
        c = cache.clone()
        out, report = run_and_report(fn, *args, c, role=role, disable_passes=off)
        results.append((out, c, report))
    (on, c_on, report), (off, c_off, _) = results
    for a, b in zip(on, off):
        if a.is_floating_point():
            assert_rel_close(a, b, tol, "graph output, pdl_swap on vs off")
        else:
            assert torch.equal(a, b)
    for a, b in zip(c_on.tensors(), c_off.tensors()):
        if b.abs().max() > 0:
            assert_rel_close(a, b, tol, "cache, pdl_swap on vs off")
    return report, on, c_on


@pytest.mark.parametrize("T", [1, 6])
def test_tiny_forward_numbers_and_counts(tiny, T):
    model, base = tiny
    ids, pos = torch.randint(0, VOCAB, (T,)), torch.arange(P, P + T)
    report = compare_on_off(model, (ids, pos), base, "forward")[0]
    r, st = rows(report), stat(report, "pdl_swap")
    for op, n in expected_counts(model.config).items():
        assert r.get(op, 0) == n, op
    # (MLA's kv_a_layernorms are matched as norms, then folded into their cache writes.)
    assert st.matches == sum(expected_counts(model.config).values()) + len(model.config.mla_layers)
    assert "lingc.kda_commit" not in r
    # In place: no epilogue copy is left (the KDA states and windows by kda_chain, the MLA
    # caches' rows by mla_kv_write), and no functional write of a whole state or cache slot.
    assert "aten.copy_" not in r
    for gone in ("aten.select_scatter", "aten.index_put", "aten.amax", "aten.rsqrt", "aten.cos"):
        assert gone not in r, gone
    # MLA's head gate is folded into mla_decode: no sigmoid and no multiply kernel left.
    assert "aten.sigmoid" not in r and "aten.mul.Tensor" not in r
    assert "head gate folded into 2 mla_decode" in st.notes[0]
    assert st.ops_after < st.ops_before // 3


@pytest.mark.parametrize("role", ["decode", "verify"])
def test_state_ready_on_every_chain_of_the_tiny_model(tiny, role, tmp_path):
    """Each layer's state and window are graph inputs that nothing in the graph writes before its
    chain, so pdl_swap lets every kda_chain read them before the PDL wait; a second chain on the
    same input would not (see test_state_ready_not_on_a_second_chain_of_one_state)."""
    model, base = tiny
    if role == "decode":
        fn, args = model, (torch.tensor([5]), torch.tensor([P]))
    else:
        fn, args = verify_fn(model), (chain_accepting(model, base, 2, start=P, vocab=VOCAB), torch.arange(P, P + 6))
    _, report = run_and_report(fn, *args, base.clone(), role=role, dump_dir=str(tmp_path))
    text = final_graph_text(report)
    n = len(model.config.kda_layers)
    assert text.count("lingc.kda_chain(") == n and text.count("state_ready=True") == n


def test_state_ready_not_on_a_second_chain_of_one_state():
    """pdl_swap leaves a KDA layer applied twice to one state to ATen today; should two chains on
    one input ever meet, only the first may read it before the wait (its writer, the first
    chain, runs in this graph). Also: a slot (select) of an input counts as the input, and a
    transposed temporary never qualifies."""
    import torch.fx as fx

    import lingc.runtime.kernels.kda  # noqa: F401  (registers lingc::kda_chain, whatever ran before)
    from lingc.graph_match import aten
    from lingc.passes.pdl_swap import PdlSwap

    g = fx.Graph()
    st, win, other_st, other_win, x = (g.placeholder(n) for n in ("st", "win", "st2", "win2", "x"))
    chain = torch.ops.lingc.kda_chain.default

    def call(window, state):
        return g.call_function(chain, (x, x, x, x, x, [x, x, x], window, x, x, state, -5.0, None, None))

    first = call(g.call_function(aten.select.int, (win, 0, 0)), g.call_function(aten.select.int, (st, 0, 0)))
    second = call(win, st)
    transposed = call(other_win, g.call_function(aten.clone.default, (other_st,)))
    g.output((first, second, transposed))
    PdlSwap._mark_state_ready(None, g)
    assert [n.kwargs.get("state_ready", False) for n in (first, second, transposed)] == [True, False, False]


@pytest.mark.parametrize("j", [1, 5])
def test_tiny_verify_staged(tiny, j):
    """T=6 verify: stage_commit + pdl_swap give kda_chain (staged) per layer and one
    kda_commit_many for all of them; the committed state equals the from-scratch state after j
    accepted drafts and the pass-off graph."""
    model, base = tiny
    chain = chain_accepting(model, base, j, start=P, vocab=VOCAB)
    pos = torch.arange(P, P + 6)
    report, out, cache = compare_on_off(verify_fn(model), (chain, pos), base, "verify")
    r = rows(report)
    n_kda = len(model.config.kda_layers)
    assert r["lingc.kda_chain"] == n_kda and r["lingc.kda_commit_many"] == 1 and "lingc.kda_commit" not in r
    assert ", 1 kda_commit_many," in stat(report, "pdl_swap").notes[0]
    assert r["lingc.mla_decode"] == len(model.config.mla_layers)
    assert "aten.index.Tensor" not in r                # no stack(V_0..V_T-1)[accept] left
    assert r["lingc.mla_kv_write"] == len(model.config.mla_layers) and "aten.copy_" not in r
    # The staging buffers are allocations (glue, no kernel): the one kernel-launching op left to
    # ATen is this verify function's own argmax over the logits.
    cats, counts = {op: cat for cat, op, _, _ in report.kernels.rows}, report.kernels.counts()
    assert cats["aten.new_empty"] == "glue" and counts["aten"] == 1 and r["aten.argmax"] == 1
    cover = [note for note in stat(report, "pdl_swap").notes if note.startswith("PDL coverage")]
    n = counts["lingc"]
    assert cover == [f"PDL coverage {n}/{n + 1} kernel-launching ops ({100 * n / (n + 1):.0f}%)"]
    assert int(out[1]) == j
    ref = base.clone()
    with torch.no_grad():
        model(chain[:j + 1], torch.arange(P, P + j + 1), ref)
    for a, b in zip(cache.recurrent_tensors(), ref.recurrent_tensors()):
        assert_rel_close(a, b, 1e-5, f"state after accepting {j}")


def test_greedy_tokens_equal_eager(tiny):
    model, base = tiny
    from backend_helpers import compile_lingc
    step = compile_lingc(model, role="decode")
    eager_cache, comp_cache = base.clone(), base.clone()
    tok_e = tok_c = torch.tensor([11])
    out_e, out_c = [], []
    with torch.no_grad():
        for i in range(12):
            p = torch.tensor([P + i])
            tok_e = model(tok_e, p, eager_cache)[0].argmax(-1)
            tok_c = step(tok_c, p, comp_cache)[0].argmax(-1)
            out_e.append(int(tok_e))
            out_c.append(int(tok_c))
    assert out_c == out_e


# -- foreign formulations -------------------------------------------------------------------

H, K, D = 2, 8, 16


def _unfold_convs(xs, convs, window):
    """The short convolutions of q, k, v [T, D] through unfold over [window ; x], silu as
    x * sigmoid(x); window [1, 3, D, 3] updated in place. Returns the three [T, D] activations."""
    acts, wins = [], []
    for i, y in enumerate(xs):
        ext = torch.cat([window[0, i].T, y], 0)                            # [T + 3, D]
        new = (ext.unfold(0, 4, 1) * convs[i][:, 0]).sum(-1)              # [T, D]
        acts.append(new * torch.sigmoid(new))
        wins.append(ext[-3:].T)
    window[0].copy_(torch.stack(wins))
    return acts


class ForeignKDA(nn.Module):
    """KDA written independently: fused qkvfgb projection split by chunk, a conv through unfold,
    silu as x * sigmoid(x), l2norm as x / sqrt(.), the gate with its constant first, a loop over
    unbind, the state stored [H, V, K] (vk=True) or [H, K, V]."""

    def __init__(self, vk: bool, softplus: bool = False):
        super().__init__()
        g = torch.Generator().manual_seed(4)
        self.vk, self.softplus = vk, softplus
        self.proj = nn.Parameter(torch.randn(5 * D + H, 24, generator=g) / 5, requires_grad=False)
        self.convs = nn.ParameterList([nn.Parameter(torch.randn(D, 1, 4, generator=g) / 2, requires_grad=False)
                                       for _ in range(3)])
        self.a = nn.Parameter(torch.randn(H, generator=g) / 2, requires_grad=False)
        self.bias = nn.Parameter(torch.randn(D, generator=g), requires_grad=False)
        self.out = nn.Parameter(torch.randn(24, D, generator=g) / 4, requires_grad=False)

    def forward(self, x, state, window):
        T = x.shape[0]
        q, k, v, f, gate, b = torch.split(x @ self.proj.T, [D, D, D, D, D, H], dim=-1)
        q, k, v = (a.view(T, H, K) for a in _unfold_convs((q, k, v), self.convs, window))
        q = q / torch.sqrt((q ** 2).sum(-1, keepdim=True) + 1e-6) / K ** 0.5
        k = k / torch.sqrt((k ** 2).sum(-1, keepdim=True) + 1e-6)
        if self.softplus:                                                  # Kimi Linear's unbounded gate
            decay = -self.a.exp()[:, None] * F.softplus(f.view(T, H, K) + self.bias.view(H, K))
        else:
            decay = -5.0 * torch.sigmoid(self.a.exp()[:, None] * (f.view(T, H, K) + self.bias.view(H, K)))
        beta = torch.sigmoid(b)
        S = state[0]
        outs = []
        for qt, kt, vt, gt, bt in zip(q.unbind(0), k.unbind(0), v.unbind(0), decay.unbind(0), beta.unbind(0)):
            if self.vk:                                                    # S[h, v, k]
                S = S * gt.exp()[:, None, :]
                pred = torch.einsum("hvk,hk->hv", S, kt)
                S = S + torch.einsum("hv,hk->hvk", (vt - pred) * bt[:, None], kt)
                outs.append(torch.einsum("hvk,hk->hv", S, qt))
            else:
                S = S * gt.exp()[:, :, None]
                pred = torch.einsum("hkv,hk->hv", S, kt)
                S = S + torch.einsum("hk,hv->hkv", kt, (vt - pred) * bt[:, None])
                outs.append(torch.einsum("hkv,hk->hv", S, qt))
        state[0].copy_(S)
        o = torch.stack(outs)
        o = o / torch.sqrt(o.pow(2).mean(-1, keepdim=True) + 1e-5)
        return (o.reshape(T, D) * torch.sigmoid(gate)) @ self.out.T


def _run_kda(m, T, dump_dir):
    """(compiled output, eager output, (state, window) compiled, the same eager, report) of one
    KDA layer module from a random state and window."""
    x = torch.randn(T, 24)
    state, window = 0.3 * torch.randn(1, H, K, K), torch.randn(1, 3, D, 3)
    ref_s, ref_w = state.clone(), window.clone()
    with torch.no_grad():
        ref = m(x, ref_s, ref_w)
    out, report = run_and_report(m, x, state, window, dump_dir=dump_dir)
    return out, ref, (state, window), (ref_s, ref_w), report


@pytest.mark.parametrize("vk", [True, False])
@pytest.mark.parametrize("T", [1, 3])
def test_foreign_kda_layer(vk, T, tmp_path):
    out, ref, (state, window), (ref_s, ref_w), report = _run_kda(ForeignKDA(vk), T, str(tmp_path))
    st = stat(report, "pdl_swap")
    assert rows(report).get("lingc.kda_chain", 0) == 1, st.notes
    text = final_graph_text(report)
    # Either layout is read and written in place (a [V, K] state through state_vk, no transposed
    # copy), so its state is read before the wait.
    assert text.count("state_ready=True") == 1
    assert text.count("state_vk=True") == (1 if vk else 0)
    assert_rel_close(out, ref, 1e-5, "foreign KDA output")
    assert_rel_close(state, ref_s, 1e-5, "foreign KDA state")
    assert_rel_close(window, ref_w, 1e-5, "foreign KDA conv window")
    assert "aten.copy_" not in rows(report) and "aten.clone" not in rows(report)   # both writes in place


class VerifyLayer(nn.Module):
    """A KDA-style layer as a verify step: tokens in, the greedy verdict over its 24 outputs
    committed."""

    def __init__(self, layer: nn.Module):
        super().__init__()
        self.layer = layer

    def forward(self, tokens, state, window):
        y = self.layer(F.one_hot(tokens, 24).float(), state, window)
        return ops.state_commit(ops.greedy_verdict(tokens, y.argmax(-1))), y


def _verify_accepting_two_of_four(m: VerifyLayer, seed: int, dump_dir: str, what: str):
    """m's verify step compiled and run on a chain whose first two drafts greedy decoding makes
    (the third rejected): checks the verdict, the rows and the committed state and window against
    eager on the accepted prefix; returns the report."""
    torch.manual_seed(seed)
    state0, window0 = 0.3 * torch.randn(1, H, K, K), torch.randn(1, 3, D, 3)
    with torch.no_grad():
        _, y = m(torch.tensor([1, 2, 3, 4]), state0.clone(), window0.clone())
        y1 = m(torch.tensor([1, int(y[0].argmax())]), state0.clone(), window0.clone())[1]
        t = [1, int(y[0].argmax()), int(y1[1].argmax())]
        tokens = torch.tensor(t + [(t[-1] + 1) % 24, 5])
        ref_s, ref_w = state0.clone(), window0.clone()
        ref = m(tokens[:3], ref_s, ref_w)[1]
    st, win = state0.clone(), window0.clone()
    (accept, out), report = run_and_report(m, tokens, st, win, role="verify", dump_dir=dump_dir)
    assert rows(report).get("lingc.kda_chain") == 1 and rows(report).get("lingc.kda_commit") == 1, rows(report)
    assert int(accept) == 2
    assert_rel_close(out[:3], ref, 1e-5, f"{what} verify output")
    assert_rel_close(st, ref_s, 1e-5, f"{what} committed state")
    assert_rel_close(win, ref_w, 1e-5, f"{what} committed window")
    return report


@pytest.mark.parametrize("vk", [True, False])
def test_foreign_kda_layer_verify(vk, tmp_path):
    """The staged form of either state layout runs on kda_chain's stages (a [V, K] state's stages
    are [V, K] too) and kda_commit; after a verify that accepts 2 of 4 drafts, the state and
    window are those of eager on the accepted prefix."""
    report = _verify_accepting_two_of_four(VerifyLayer(ForeignKDA(vk)), 2, str(tmp_path), "foreign KDA")
    assert stat(report, "stage_commit").matches == 2, stat(report, "stage_commit").notes
    assert final_graph_text(report).count("state_vk=True") == (1 if vk else 0)


def test_mla_softmax_scale_at_flash_attention_shapes(tmp_path):
    """The MLA probe picks the region's own scale. Session 43 added each multiplier's square as a
    candidate (SDPA's math form), and the probe took the first candidate within the tolerance
    with its query's position drawn anywhere in the cache: flash-tp4-rank's T = 1 decode graph drew
    a position with too few keys to tell 1/sqrt(192) from 1/192 and ran the latter (a GPU
    batch-invariance test found it). flash-tp4-rank's attention shapes, dense MLPs, small vocab."""
    from lingc.models import build_model, preset

    cfg = preset("flash-tp4-rank", num_hidden_layers=6, first_k_dense_replace=6, intermediate_size=256,
                 vocab_size=1024, lm_head_rows=1024, eos_token_id=1000, pad_token_id=1001, torch_dtype="bfloat16")
    model = build_model(cfg, device="cpu", seed=0, progress=False)
    cache = randomize_cache_(Ling3Cache.allocate(cfg, 44), seed=3, rows=32)
    ids, pos = torch.tensor([3]), torch.tensor([32])
    with torch.no_grad():
        ref = model(ids, pos, cache.clone())[0]
    out, report = run_and_report(model, ids, pos, cache.clone(), role="decode", dump_dir=str(tmp_path))
    line = next(x for x in final_graph_text(report).splitlines() if "lingc.mla_decode(" in x)
    assert f", {(cfg.qk_nope_head_dim + cfg.qk_rope_head_dim) ** -0.5:.6f}, " in line, line
    assert_rel_close(out[0], ref, 2e-2, "flash-shaped decode logits")


MH, NOPE, ROPE, RANK, VD, HID = 2, 8, 4, 16, 8, 24


class ForeignGDN(nn.Module):
    """Gated DeltaNet written as flash-linear-attention's naive recurrent reference writes it:
    one decay per head (a = x W_a [T, H], g = -exp(A_log) * softplus(a + dt_bias), or the bounded
    form), beta = sigmoid(b), separate short convs, the output a per-head RMSNorm times silu(gate)
    (fla's FusedRMSNormGated with swish). The recurrence is KDA's with one gate for a head's K
    channels: kda_chain with a [T, H] f."""

    def __init__(self, bounded: bool = False):
        super().__init__()
        g = torch.Generator().manual_seed(5)
        self.bounded = bounded
        self.proj = nn.Parameter(torch.randn(4 * D + 2 * H, 24, generator=g) / 5, requires_grad=False)
        self.convs = nn.ParameterList([nn.Parameter(torch.randn(D, 1, 4, generator=g) / 2, requires_grad=False)
                                       for _ in range(3)])
        self.A_log = nn.Parameter(torch.randn(H, generator=g) / 2, requires_grad=False)
        self.dt_bias = nn.Parameter(torch.randn(H, generator=g), requires_grad=False)
        self.o_w = nn.Parameter(1 + torch.randn(K, generator=g) / 10, requires_grad=False)
        self.out = nn.Parameter(torch.randn(24, D, generator=g) / 4, requires_grad=False)

    def forward(self, x, state, window):
        T = x.shape[0]
        q, k, v, gate, a, b = torch.split(x @ self.proj.T, [D, D, D, D, H, H], dim=-1)
        q, k, v = (t.view(T, H, K) for t in _unfold_convs((q, k, v), self.convs, window))
        q = q / torch.sqrt((q ** 2).sum(-1, keepdim=True) + 1e-6) / K ** 0.5
        k = k / torch.sqrt((k ** 2).sum(-1, keepdim=True) + 1e-6)
        if self.bounded:
            g = -5.0 * torch.sigmoid(self.A_log.exp() * (a + self.dt_bias))
        else:
            g = -self.A_log.exp() * F.softplus(a + self.dt_bias)            # [T, H]: one per head
        beta = torch.sigmoid(b)
        S, outs = state[0], []
        for t in range(T):
            S = S * g[t].exp()[:, None, None]
            pred = torch.einsum("hkv,hk->hv", S, k[t])
            S = S + torch.einsum("hk,hv->hkv", k[t], (v[t] - pred) * beta[t][:, None])
            outs.append(torch.einsum("hkv,hk->hv", S, q[t]))
        state[0].copy_(S)
        o = torch.stack(outs)
        o = o * torch.rsqrt(o.pow(2).mean(-1, keepdim=True) + 1e-5) * self.o_w
        return (o.reshape(T, D) * F.silu(gate)) @ self.out.T


@pytest.mark.parametrize("bounded", [False, True], ids=["softplus", "bounded"])
@pytest.mark.parametrize("T", [1, 3])
def test_gated_deltanet_layer(T, bounded, tmp_path):
    """A Gated DeltaNet layer runs on lingc kernels: its recurrence on lingc.kda_chain with its
    [T, H] gate (the probe tells the gate's a from beta's b and A_log from dt_bias, all [T, H] or
    [H]), its output norm on gated_head_rmsnorm's silu gate; state and window written in place,
    as eager writes them."""
    out, ref, (state, window), (ref_s, ref_w), report = _run_kda(ForeignGDN(bounded), T, str(tmp_path))
    assert rows(report).get("lingc.kda_chain", 0) == 1, stat(report, "pdl_swap").notes
    # The output norm's silu gate (taken on [T, H*V] views) on gated_head_rmsnorm: no ATen kernel left.
    assert rows(report).get("lingc.gated_head_rmsnorm") == 1 and "silu_gate=True" in final_graph_text(report)
    assert set(report.kernels.counts()) == {"lingc", "glue"}, report.kernels.format()
    summary = stat(report, "pdl_swap").notes[0]
    assert "(1 kda_chain with one gate per head: Gated DeltaNet)" in summary, summary
    assert "(1 gated_head_rmsnorm with a silu gate)" in summary, summary
    assert_rel_close(out, ref, 1e-5, "GDN output")
    assert_rel_close(state, ref_s, 1e-5, "GDN state")
    assert_rel_close(window, ref_w, 1e-5, "GDN conv window")
    assert "aten.copy_" not in rows(report) and "aten.clone" not in rows(report)   # both writes in place


class ReboundStateGDN(ForeignGDN):
    """ForeignGDN with its state handed back the Hugging Face way: the new state re-bound in a
    Python list (``cache.recurrent_states[i] = S``) instead of written in place."""

    def forward(self, x, states, window):
        state = torch.zeros_like(states[0])[None]
        state[0] = states[0]
        y = super().forward(x, state, window)
        states[0] = state[0] * 1.0
        return y


def test_a_state_rebound_in_python_is_named_with_the_fix():
    """Dynamo returns a re-bound state from the graph and stores it after the call: no in-place
    write for pdl_swap to match, so the chain stays on ATen, and the notes say why and how to
    write it instead. The step still equals eager."""
    m = ReboundStateGDN()
    g = torch.Generator().manual_seed(2)
    x, s0, w0 = torch.randn(1, 24, generator=g), torch.randn(H, K, K, generator=g) * 0.3, torch.randn(1, 3, D, 3, generator=g)
    ref_states, states = [s0.clone()], [s0.clone()]
    with torch.no_grad():
        ref = m(x, ref_states, w0.clone())
    out, report = run_and_report(m, x, states, w0.clone(), role="forward")
    notes = " ".join(stat(report, "pdl_swap").notes)
    assert "a recurrent state comes back as a new tensor [2, 8, 8]" in notes, notes
    assert "write it back with state.copy_(S)" in notes
    assert rows(report).get("lingc.kda_chain", 0) == 0
    assert_rel_close(out, ref, 1e-5, "output")
    assert_rel_close(states[0], ref_states[0], 1e-5, "the re-bound state")


def test_gated_deltanet_layer_verify(tmp_path):
    """The staged form: a verify that accepts 2 of 4 drafts leaves the state and window of eager
    on the accepted prefix."""
    _verify_accepting_two_of_four(VerifyLayer(ForeignGDN()), 3, str(tmp_path), "GDN")


class ForeignMLA(nn.Module):
    """Absorbed MLA written independently of lingc.models.mla: a cache of one sequence [L, R + P]
    (no slot dimension) written with ``cache[pos] = rows``, RoPE through view_as_complex and
    polar, the absorbed query through bmm, scores as einsums over cache slices (mm in the graph)
    divided by sqrt(d), the causal mask by torch.where (``softmax="library"``) or masked_fill
    and a softmax written out with max / exp / sum (``"by hand"``). ``strict=True`` hides each
    query's own row (other math: must not match)."""

    def __init__(self, softmax: str, strict: bool = False):
        super().__init__()
        g = torch.Generator().manual_seed(5)
        self.softmax, self.strict = softmax, strict
        self.wq = nn.Parameter(torch.randn(MH * (NOPE + ROPE), HID, generator=g) / 5, requires_grad=False)
        self.wkv = nn.Parameter(torch.randn(RANK + ROPE, HID, generator=g) / 5, requires_grad=False)
        self.wb = nn.Parameter(torch.randn(MH, NOPE + VD, RANK, generator=g) / 4, requires_grad=False)
        self.wo = nn.Parameter(torch.randn(HID, MH * VD, generator=g) / 4, requires_grad=False)
        self.register_buffer("freq", 1.0 / (100.0 ** (torch.arange(0, ROPE, 2).float() / ROPE)), persistent=False)

    def rope(self, x, pos):
        ang = pos.float()[:, None] * self.freq[None]
        rot = torch.polar(torch.ones_like(ang), ang).view((x.shape[0],) + (1,) * (x.dim() - 2) + (ROPE // 2,))
        xc = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2).contiguous())
        return torch.view_as_real(xc * rot).flatten(-2)

    def forward(self, x, pos, cache):
        T, L = x.shape[0], cache.shape[0]
        q = (x @ self.wq.T).view(T, MH, NOPE + ROPE)
        kv = x @ self.wkv.T
        cache[pos] = torch.cat([kv[:, :RANK], self.rope(kv[:, RANK:], pos)], -1)
        q_lat = torch.bmm(q[..., :NOPE].transpose(0, 1), self.wb[:, :NOPE]).transpose(0, 1)     # [T, H, R]
        q_rope = self.rope(q[..., NOPE:], pos)
        c, k_rope = cache[:, :RANK], cache[:, RANK:]
        s = (torch.einsum("thr,lr->thl", q_lat, c) + torch.einsum("thp,lp->thl", q_rope, k_rope)) / (NOPE + ROPE) ** 0.5
        rows_ = torch.arange(L, device=x.device)[None, :]
        visible = (rows_ < pos[:, None]) if self.strict else (rows_ <= pos[:, None])
        if self.softmax == "library":
            p = F.softmax(torch.where(visible[:, None], s, float("-inf")), dim=-1)
        else:
            s = s.masked_fill(~visible[:, None], float("-inf"))
            e = torch.exp(s - s.max(-1, keepdim=True).values)
            p = e / e.sum(-1, keepdim=True)
        o = torch.einsum("thr,hvr->thv", p @ c, self.wb[:, NOPE:])
        return o.reshape(T, MH * VD) @ self.wo.T


def _run_mla(m, T=3):
    """(compiled output, eager output, compiled cache, eager cache, report) of one MLA layer
    module on a random 20-row cache, queries at positions 9..9+T-1."""
    x, pos, cache = torch.randn(T, HID), torch.arange(9, 9 + T), torch.randn(20, RANK + ROPE)
    ref_cache = cache.clone()
    with torch.no_grad():
        ref = m(x, pos, ref_cache)
    out, report = run_and_report(m, x, pos, cache)
    return out, ref, cache, ref_cache, report


@pytest.mark.parametrize("softmax", ["library", "by hand"])
@pytest.mark.parametrize("T", [1, 3])
def test_foreign_mla_layer(softmax, T):
    """The whole foreign layer on lingc kernels: its cache write (lingc.mla_kv_write, RoPE of the
    key inside), the absorbed products and the latent attention (lingc.mla_decode, the query's
    RoPE inside); the output and the written cache equal eager's."""
    out, ref, cache, ref_cache, report = _run_mla(ForeignMLA(softmax), T)
    st = stat(report, "pdl_swap")
    lingc_rows = {op: n for cat, op, n, _ in report.kernels.rows if cat == "lingc"}
    assert lingc_rows == {"lingc.gemm": 2, "lingc.head_matmul": 2, "lingc.mla_decode": 1,
                          "lingc.mla_kv_write": 1}, st.notes
    assert report.kernels.counts().keys() == {"lingc", "glue"}          # nothing else runs
    assert "PDL coverage 6/6 kernel-launching ops (100%)" in st.notes
    assert_rel_close(out, ref, 1e-5, "foreign MLA output")
    assert_rel_close(cache, ref_cache, 1e-6, "foreign MLA cache")


class TextbookMLA(ForeignMLA):
    """MLA written the textbook way: the cache's latent rows expanded through kv_b into per-head
    keys and values at every step, then ordinary attention (``strict``: each query does not see
    its own row, other math)."""

    def expand(self, x, pos, cache):
        """Write the cache rows, then (queries [T, H, nope + P], keys [L, H, nope + P], values
        [L, H, v]) with the keys and values expanded from every cache row."""
        T, L = x.shape[0], cache.shape[0]
        q = (x @ self.wq.T).view(T, MH, NOPE + ROPE)
        kv = x @ self.wkv.T
        cache[pos] = torch.cat([kv[:, :RANK], self.rope(kv[:, RANK:], pos)], -1)
        kvb = (cache[:, :RANK] @ self.wb.reshape(-1, RANK).T).view(L, MH, NOPE + VD)
        k = torch.cat([kvb[..., :NOPE], cache[:, None, RANK:].expand(L, MH, ROPE)], -1)
        return torch.cat([q[..., :NOPE], self.rope(q[..., NOPE:], pos)], -1), k, kvb[..., NOPE:]

    def forward(self, x, pos, cache):
        q, k, v = self.expand(x, pos, cache)
        s = torch.einsum("thd,lhd->thl", q, k) * (NOPE + ROPE) ** -0.5
        rows_ = torch.arange(cache.shape[0], device=x.device)[None, :]
        hidden = rows_ >= pos[:, None] if self.strict else rows_ > pos[:, None]
        o = torch.einsum("thl,lhv->thv", s.masked_fill(hidden[:, None], float("-inf")).softmax(-1), v)
        return o.reshape(x.shape[0], MH * VD) @ self.wo.T


@pytest.mark.parametrize("T", [1, 3])
def test_textbook_mla_is_absorbed(T):
    """passes/mla_absorb.py: the expanded keys and values (the whole cache through kv_b every
    step) become the absorbed chain: head_matmul(q_nope, W_uk) > mla_decode > head_matmul(., W_uv^T),
    and the expansion GEMM goes."""
    out, ref, cache, ref_cache, report = _run_mla(TextbookMLA("library"), T)
    notes = stat(report, "pdl_swap").notes
    lingc_rows = {op: n for cat, op, n, _ in report.kernels.rows if cat == "lingc"}
    assert lingc_rows == {"lingc.gemm": 2, "lingc.head_matmul": 2, "lingc.mla_decode": 1,
                          "lingc.mla_kv_write": 1}, notes                  # q/kv_a and o_proj: no [L, .] GEMM
    assert report.kernels.counts().keys() == {"lingc", "glue"}
    assert "1 written with expanded keys and values, absorbed" in notes[0]
    assert_rel_close(out, ref, 1e-5, "absorbed textbook MLA output")
    assert_rel_close(cache, ref_cache, 1e-6, "absorbed textbook MLA cache")


@pinned_graph_text
def test_expect_textbook_mla_dump(tmp_path):
    """The ops pdl_swap adds and drops when it absorbs the tiny model's forward_expanded."""
    model = tiny_model(seed=2)
    layer = model.target_layers[model.config.mla_layers[0]].attention
    cache = randomize_cache_(Ling3Cache.allocate(model.config, 32), seed=3)
    _, report = run_and_report(layer.forward_expanded, torch.randn(2, model.config.hidden_size),
                               torch.tensor([12, 13]), cache, dump_dir=str(tmp_path))
    assert_expected_inline(dump_op_changes(tmp_path, report, "pdl_swap"), """\
-aten.add.Tensor 3
-aten.amax 1
-aten.bitwise_not 1
-aten.bmm 2
-aten.cat 5
-aten.clone 2
-aten.copy_ 1
-aten.cos 2
-aten.div.Tensor 1
-aten.exp 1
-aten.expand 1
-aten.index_put 1
-aten.le.Tensor 1
-aten.mean.dim 1
-aten.mul.Tensor 14
+aten.permute 5
-aten.permute 10
-aten.pow.Tensor_Scalar 1
-aten.rsqrt 1
-aten.scalar_tensor 1
+aten.select.int 1
-aten.select.int 6
-aten.select_scatter 1
-aten.sigmoid 1
-aten.sin 2
+aten.slice.Tensor 2
-aten.slice.Tensor 4
-aten.sub.Tensor 3
-aten.sum.dim_IntList 1
-aten.unsqueeze 17
+aten.view 2
-aten.view 18
-aten.where.self 1
-lingc.gemm 1
+lingc.head_matmul 2
+lingc.mla_decode 1
+lingc.mla_kv_write 1
-prims.convert_element_type 2
-prims.iota 1
""")


class SdpaTextbookMLA(TextbookMLA):
    """The textbook form with F.scaled_dot_product_attention over the expanded keys and values (a
    boolean causal mask from the positions), as HF models write attention."""

    def forward(self, x, pos, cache):
        q, k, v = self.expand(x, pos, cache)
        mask = torch.arange(cache.shape[0], device=x.device)[None, :] <= pos[:, None]
        o = F.scaled_dot_product_attention(q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None],
                                           attn_mask=mask[None, None])
        return o[0].transpose(0, 1).reshape(x.shape[0], MH * VD) @ self.wo.T


def test_textbook_mla_through_sdpa_is_absorbed():
    """SDPA's math form, as the CPU trace decomposes it (q and k each scaled by sqrt(scale), a
    "safe" softmax for fully masked rows) is absorbed like the explicit softmax. (A CUDA trace
    keeps a fused SDPA op instead: test_mla_through_a_fused_attention_op.)"""
    out, ref, _, _, report = _run_mla(SdpaTextbookMLA("library"))
    assert "1 written with expanded keys and values, absorbed" in stat(report, "pdl_swap").notes[0]
    assert report.kernels.counts().keys() == {"lingc", "glue"}
    assert_rel_close(out, ref, 1e-5, "absorbed SDPA textbook MLA output")


def _fused_sdpa(op: str, q, k, v, visible, scale=None):
    """Attention over [1, H, ., .] operands with a boolean mask as a CUDA trace holds
    F.scaled_dot_product_attention: the mask made an additive bias, then one fused op (``op``:
    "efficient" or "cudnn") whose output is element 0 of its tuple. Eager (the reference, on the
    CPU, where those ops have no kernel) runs the CPU's SDPA on the same operands instead, and
    ``op="library"`` always does (on CUDA the trace then picks the fused op itself)."""
    bias = torch.where(visible, 0.0, float("-inf")).to(q.dtype).expand(1, q.shape[1], q.shape[2], k.shape[2])
    if op == "library" or not torch.compiler.is_compiling():
        return F.scaled_dot_product_attention(q, k, v, attn_mask=bias, scale=scale)
    fused = getattr(torch.ops.aten, f"_scaled_dot_product_{op}_attention")
    return fused(q, k, v, bias, False, scale=scale)[0]


class FusedSdpaTextbookMLA(TextbookMLA):
    """The textbook form through a CUDA-trace fused attention op (its default scale)."""

    def __init__(self, op: str):
        super().__init__("library")
        self.op = op

    def forward(self, x, pos, cache):
        q, k, v = self.expand(x, pos, cache)
        visible = torch.arange(cache.shape[0], device=x.device)[None, :] <= pos[:, None]
        o = _fused_sdpa(self.op, q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None],
                        visible[None, None])
        return o[0].transpose(0, 1).reshape(x.shape[0], MH * VD) @ self.wo.T


class FusedSdpaAbsorbedMLA(ForeignMLA):
    """The absorbed form through a fused attention op: queries [q_lat ; rope(q_rope)], keys the
    cache rows and values their latent part, broadcast over the heads (as a model that calls
    SDPA on the latent cache writes it), or (``gqa``) one key/value head with enable_gqa."""

    def __init__(self, op: str, strict: bool = False, gqa: bool = False):
        super().__init__("library", strict)
        self.op, self.gqa = op, gqa

    def forward(self, x, pos, cache):
        T, L = x.shape[0], cache.shape[0]
        q = (x @ self.wq.T).view(T, MH, NOPE + ROPE)
        kv = x @ self.wkv.T
        cache[pos] = torch.cat([kv[:, :RANK], self.rope(kv[:, RANK:], pos)], -1)
        q_lat = torch.bmm(q[..., :NOPE].transpose(0, 1), self.wb[:, :NOPE])                  # [H, T, R]
        q_all = torch.cat([q_lat, self.rope(q[..., NOPE:], pos).transpose(0, 1)], -1)[None]  # [1, H, T, R + P]
        rows_ = torch.arange(L, device=x.device)[None, :]
        visible = rows_ < pos[:, None] if self.strict else rows_ <= pos[:, None]
        if self.gqa:    # one key/value head for all query heads, SDPA repeats it
            o = F.scaled_dot_product_attention(q_all, cache[None, None], cache[None, None, :, :RANK],
                                               attn_mask=visible[None, None], scale=(NOPE + ROPE) ** -0.5,
                                               enable_gqa=True)
        else:
            o = _fused_sdpa(self.op, q_all, cache[None, None].expand(1, MH, L, RANK + ROPE),
                            cache[None, None, :, :RANK].expand(1, MH, L, RANK), visible[None, None],
                            scale=(NOPE + ROPE) ** -0.5)
        o = torch.bmm(o[0], self.wb[:, NOPE:].transpose(1, 2)).transpose(0, 1)               # [T, H, v]
        return o.reshape(T, MH * VD) @ self.wo.T


@pytest.mark.parametrize("op, T", [("efficient", 3), ("efficient", MH), ("cudnn", 1)])
@pytest.mark.parametrize("form", ["absorbed", "textbook"])
def test_mla_through_a_fused_attention_op(form, op, T):
    """lingc/sdpa.py: a fused SDPA op (what a CUDA trace keeps) is an attention like a softmax:
    written absorbed it becomes mla_decode, written textbook mla_absorb absorbs it; the probe runs
    the op's CPU stand-in. Nothing of the fused op is left (it has no CPU kernel: the compiled
    graph could not run here otherwise). The absorbed form's latent query and output are
    head-major [H, T, R] (T == H: the probe tells the layouts apart)."""
    m = FusedSdpaAbsorbedMLA(op) if form == "absorbed" else FusedSdpaTextbookMLA(op)
    out, ref, cache, ref_cache, report = _run_mla(m, T)
    notes = stat(report, "pdl_swap").notes
    assert rows(report).get("lingc.mla_decode") == 1, notes
    assert report.kernels.counts().keys() == {"lingc", "glue"}, report.kernels.rows
    if form == "textbook":
        assert "1 written with expanded keys and values, absorbed" in notes[0]
    assert_rel_close(out, ref, 1e-5, f"{form} MLA through the fused {op} op")
    assert_rel_close(cache, ref_cache, 1e-6, "its cache")


@pytest.mark.parametrize("gqa", [False, True], ids=["expanded heads", "enable_gqa"])
def test_absorbed_mla_through_library_sdpa(gqa):
    """The absorbed form written with F.scaled_dot_product_attention over the latent cache, as the
    CPU traces it (the math form: q and k each scaled by sqrt(scale), so the squared constant is
    the scale; with enable_gqa the one key/value head repeated by expand + clone)."""
    out, ref, cache, ref_cache, report = _run_mla(FusedSdpaAbsorbedMLA("library", gqa=gqa))
    assert rows(report).get("lingc.mla_decode") == 1, stat(report, "pdl_swap").notes
    assert report.kernels.counts().keys() == {"lingc", "glue"}, report.kernels.rows
    assert_rel_close(out, ref, 1e-5, "absorbed MLA through SDPA")
    assert_rel_close(cache, ref_cache, 1e-6, "its cache")


def test_fused_attention_of_other_math_is_left():
    """A fused op whose mask hides each query's own row is not mla_decode's math: left with a
    note naming the fused op."""
    n = len(compile_reports)
    compiled = compile_lingc(FusedSdpaAbsorbedMLA("efficient", strict=True))
    with torch.no_grad(), pytest.raises(NotImplementedError, match="_scaled_dot_product_efficient_attention"):
        compiled(torch.randn(2, HID), torch.arange(9, 11), torch.randn(20, RANK + ROPE))   # no CPU kernel
    notes = stat(compile_reports[n], "pdl_swap").notes
    assert any(x.startswith("fused attention at") and "MLA decode left (no assignment" in x for x in notes), notes


def test_the_models_own_textbook_form_is_absorbed():
    """lingc.models' MLAAttention.forward_expanded (the test oracle that expands the cache) compiles
    to the kernels of the absorbed forward (the head gate folded into mla_decode too), and to its
    numbers."""
    from lingc.models.mla import MLAAttention

    model = tiny_model(seed=2)
    layer = model.target_layers[model.config.mla_layers[0]].attention
    assert isinstance(layer, MLAAttention)
    cache = Ling3Cache.allocate(model.config, 32)
    randomize_cache_(cache, seed=3)
    x, pos = torch.randn(2, model.config.hidden_size), torch.tensor([12, 13])
    ref_cache = cache.clone()
    with torch.no_grad():
        ref = layer.forward_expanded(x, pos, ref_cache)
    out, report = run_and_report(layer.forward_expanded, x, pos, cache)
    notes = stat(report, "pdl_swap").notes
    assert rows(report).get("lingc.mla_decode") == 1, notes
    assert "head gate folded into 1 mla_decode" in notes[0] and "PDL coverage 6/6 kernel-launching ops (100%)" in notes
    assert_rel_close(out, ref, 1e-5, "forward_expanded compiled")


def _run_mla_cuda(m, T):
    """_run_mla on CUDA: a 512-row fp32 cache, queries at positions 300..300+T-1."""
    g = torch.Generator(device="cuda").manual_seed(T)
    x = torch.randn(T, HID, device="cuda", generator=g)
    pos = torch.arange(300, 300 + T, device="cuda")
    cache = torch.randn(512, RANK + ROPE, device="cuda", generator=g)
    ref_cache = cache.clone()
    with torch.no_grad():
        ref = m(x, pos, ref_cache)
    out, report = run_and_report(m, x, pos, cache)
    return out, ref, cache, ref_cache, report


@pytest.mark.gpu
@pytest.mark.parametrize("form", ["absorbed", "textbook"])
@pytest.mark.parametrize("T", [1, 6])
def test_gpu_foreign_mla_layer(T, form):
    """The foreign layer's kernels on CUDA (fp32 cache, the Triton mla_decode and mla_kv_write),
    written absorbed or in the textbook form that mla_absorb rewrites."""
    m = (ForeignMLA("by hand") if form == "absorbed" else TextbookMLA("library")).cuda()
    out, ref, cache, ref_cache, report = _run_mla_cuda(m, T)
    assert {"lingc.mla_decode", "lingc.mla_kv_write"} <= set(rows(report))
    assert_rel_close(out, ref, 1e-4, "foreign MLA output on CUDA")
    assert_rel_close(cache, ref_cache, 1e-5, "foreign MLA cache on CUDA")


@pytest.mark.gpu
@pytest.mark.parametrize("form", ["absorbed", "absorbed-gqa", "textbook"])
@pytest.mark.parametrize("T", [1, 6])
def test_gpu_mla_through_sdpa(T, form):
    """F.scaled_dot_product_attention on CUDA tensors (the trace keeps whichever fused op the
    device picks, or its math form): written over the latent cache or over the expanded keys and
    values, it compiles onto mla_decode and equals eager."""
    m = (SdpaTextbookMLA("library") if form == "textbook" else
         FusedSdpaAbsorbedMLA("library", gqa=form == "absorbed-gqa")).cuda()
    out, ref, cache, ref_cache, report = _run_mla_cuda(m, T)
    assert rows(report).get("lingc.mla_decode") == 1, stat(report, "pdl_swap").notes
    assert_rel_close(out, ref, 1e-4, f"{form} MLA through SDPA on CUDA")
    assert_rel_close(cache, ref_cache, 1e-5, "its cache")


@pytest.mark.parametrize("module, note", [
    (ForeignMLA, "MLA decode left (no assignment of the inputs reproduces the mla_decode reference)"),
    (TextbookMLA, "expanded MLA: no assignment of the inputs reproduces the absorbed reference")])
def test_mla_with_other_math_is_left(module, note):
    """A strictly causal mask (a query does not see its own row) is not mla_decode's math, written
    absorbed or textbook: the probe finds no assignment and says so; the graph still equals eager."""
    out, ref, _, _, report = _run_mla(module("library", strict=True))
    assert "lingc.mla_decode" not in rows(report)
    assert note in " ".join(stat(report, "pdl_swap").notes)
    assert_rel_close(out, ref, 1e-5, "strict-mask output")


@pytest.mark.parametrize("T", [1, 3])
def test_foreign_kda_layer_with_the_softplus_gate(T, tmp_path):
    """-exp(A_log) * softplus(f + dt_bias) (flash-linear-attention's default KDA gate, Kimi
    Linear's) matches kda_chain with lower_bound None."""
    out, ref, (state, window), (ref_s, ref_w), report = _run_kda(ForeignKDA(vk=False, softplus=True), T,
                                                                  str(tmp_path))
    assert rows(report).get("lingc.kda_chain", 0) == 1, stat(report, "pdl_swap").notes
    chain = next(line for line in final_graph_text(report).splitlines() if "lingc.kda_chain" in line)
    assert "%select_int, None, None, None, state_ready=True)" in chain, chain    # lower_bound None
    assert_rel_close(out, ref, 1e-5, "softplus-gate KDA output")
    assert_rel_close(state, ref_s, 1e-5, "softplus-gate KDA state")
    assert_rel_close(window, ref_w, 1e-5, "softplus-gate KDA conv window")


class ForeignNorms(nn.Module):
    """RMSNorm spelled three ways: x*x summed and divided, w first; a bf16 stream upcast and cast
    back with a residual add; a 3-D [1, T, D] input."""

    def __init__(self):
        super().__init__()
        self.w1 = nn.Parameter(torch.randn(40), requires_grad=False)
        self.w2 = nn.Parameter(torch.randn(40).bfloat16(), requires_grad=False)

    def forward(self, x, r):
        a = self.w1 * (x * torch.rsqrt((x * x).sum(-1, keepdim=True) / 40 + 1e-5))
        h = r + x.bfloat16()
        hf = h.float()
        b = (hf * torch.rsqrt(hf.pow(2).mean(-1, keepdim=True) + 1e-6) * self.w2.float()).to(torch.bfloat16)
        x3 = x[None]
        c = x3 * torch.rsqrt(x3.pow(2).mean(-1, keepdim=True) + 1e-6) * self.w1
        return a, b, h, c[0]


def test_foreign_norms():
    m = ForeignNorms()
    x, r = torch.randn(5, 40), torch.randn(5, 40).bfloat16()
    with torch.no_grad():
        ref = m(x, r)
    out, report = run_and_report(m, x, r)
    assert stat(report, "pdl_swap").matches == 3
    assert rows(report)["lingc.rmsnorm"] == 3
    for a, b in zip(out, ref):
        assert a.dtype == b.dtype
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    assert torch.equal(out[1], ref[1]) and torch.equal(out[2], ref[2])    # the model's bits, bf16 too


@pytest.mark.parametrize("capture", ["functionalize", "aot"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_library_rms_norm(capture, dtype):
    """torch's own RMSNorm (F.rms_norm, and nn.RMSNorm with its default eps: the dtype's
    machine epsilon) becomes lingc.rmsnorm with the library's bits."""
    norm = nn.RMSNorm(40, dtype=dtype).eval()
    with torch.no_grad():
        norm.weight.normal_()
    w = torch.randn(40, dtype=dtype)

    def fn(x, w):
        return F.rms_norm(x, (40,), w, 1e-5), norm(x)

    x = torch.randn(5, 40, dtype=dtype)
    with torch.no_grad():
        ref = fn(x, w)
    out, report = run_and_report(fn, x, w, capture=capture)
    assert rows(report)["lingc.rmsnorm"] == 2, stat(report, "pdl_swap").notes
    assert all(torch.equal(a, b) for a, b in zip(out, ref))


@pytest.mark.parametrize("capture", ["functionalize", "aot"])
@pytest.mark.parametrize("o_dtype", ["fp32", "lo"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("form", ["nn-rmsnorm", "llama"])
def test_gated_head_norm_of_a_16bit_model(form, dtype, o_dtype, capture, tmp_path):
    """KDA's output norm as a bf16 / fp16 model writes it: nn.RMSNorm of o.to(dtype) per head
    (or the Hugging Face Llama RMSNorm, ``w * normed.to(dtype)``), times sigmoid(g) in that dtype
    (eager rounds the norm, the gate and the product). One lingc.gated_head_rmsnorm with
    round_steps (and round_before_weight for the Llama form), o's cast read inside it: no ATen
    kernel left, and the eager bits (the op's CPU path)."""
    norm = nn.RMSNorm(16, eps=1e-5, dtype=dtype).eval()
    with torch.no_grad():
        norm.weight.normal_(1.0, 0.1)

    def llama_norm(h):
        hf = h.float()
        return norm.weight * (hf * torch.rsqrt(hf.pow(2).mean(-1, keepdim=True) + 1e-5)).to(dtype)

    def fn(o, g):
        return (llama_norm if form == "llama" else norm)(o.to(dtype)) * torch.sigmoid(g.view(3, 2, 16))

    o = torch.randn(3, 2, 16) if o_dtype == "fp32" else torch.randn(3, 2, 16, dtype=dtype)
    g = torch.randn(3, 32, dtype=dtype)
    with torch.no_grad():
        ref = fn(o, g)
    out, report = run_and_report(fn, o, g, capture=capture, dump_dir=str(tmp_path))
    assert {op: n for cat, op, n, _ in report.kernels.rows if cat != "glue"} == {"lingc.gated_head_rmsnorm": 1}, \
        report.kernels.format()
    text = final_graph_text(report)
    assert "round_steps=True" in text and ("round_before_weight=True" in text) == (form == "llama")
    assert out.dtype == dtype and torch.equal(out, ref)


class LlamaNormed(nn.Module):
    """Hugging Face Llama RMSNorms (``weight * normed.to(input_dtype)``) in a 16-bit model: one
    after a token embedding (the gather folded into lingc.embedding_rmsnorm), one of a residual
    stream (the add fused into lingc.rmsnorm)."""

    def __init__(self, dtype):
        super().__init__()
        self.emb = nn.Embedding(50, 40, dtype=dtype)
        self.w = nn.ParameterList([nn.Parameter(1 + 0.1 * torch.randn(40, dtype=dtype), requires_grad=False)
                                   for _ in range(2)])

    def norm(self, h, i):
        dt = h.dtype
        h = h.to(torch.float32)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)
        return self.w[i] * h.to(dt)

    def forward(self, ids, x):
        a = self.norm(self.emb(ids), 0)
        h = x + a
        return self.norm(h, 1), h


@pytest.mark.parametrize("capture", ["functionalize", "aot"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_llama_rms_norm_of_a_16bit_model(dtype, capture, tmp_path):
    """The Llama form rounds the normed row before the weight: lingc.rmsnorm and
    lingc.embedding_rmsnorm with round_before_weight, eager's bits, the residual add fused."""
    torch.manual_seed(3)
    m = LlamaNormed(dtype).eval()
    ids, x = torch.tensor([3, 7, 11]), torch.randn(3, 40, dtype=dtype)
    with torch.no_grad():
        ref = m(ids, x)
    out, report = run_and_report(m, ids, x, capture=capture, dump_dir=str(tmp_path))
    kernels = {op: n for cat, op, n, _ in report.kernels.rows if cat != "glue"}
    assert kernels == {"lingc.rmsnorm": 1, "lingc.embedding_rmsnorm": 1}, report.kernels.format()
    assert final_graph_text(report).count("round_before_weight=True") == 2
    assert all(a.dtype == b.dtype and torch.equal(a, b) for a, b in zip(out, ref))


class EmbedThenNorm(nn.Module):
    """A token embedding [1, T] -> [1, T, D], its RMSNorm, and the embedding read again as the
    residual (the decoder's first layer); with ``early_reader`` the embedding also feeds an op
    placed before the norm, which a fused gather inside the norm could not feed."""

    def __init__(self, early_reader: bool):
        super().__init__()
        self.emb = nn.Embedding(30, 40)
        self.w = nn.Parameter(torch.randn(40), requires_grad=False)
        self.early_reader = early_reader

    def forward(self, ids):
        e = self.emb(ids[None])
        early = e * 3.0 if self.early_reader else None
        n = e * torch.rsqrt(e.pow(2).mean(-1, keepdim=True) + 1e-6) * self.w
        out = (n + e)[0]
        return (out, early[0]) if self.early_reader else (out,)


@pytest.mark.parametrize("early_reader", [False, True], ids=["folded", "left"])
def test_embedding_gather_folded_into_the_first_norm(early_reader):
    m = EmbedThenNorm(early_reader)
    ids = torch.tensor([3, 29, 0, 3, 7])
    with torch.no_grad():
        ref = m(ids)
    out, report = run_and_report(m, ids)
    r, notes = rows(report), stat(report, "pdl_swap").notes[0]
    if early_reader:
        assert r.get("aten.embedding") == 1 and "lingc.embedding_rmsnorm" not in r
        assert "embedding gathers folded" not in notes
    else:
        assert "aten.embedding" not in r and r["lingc.embedding_rmsnorm"] == 1 and "lingc.rmsnorm" not in r
        assert "1 embedding gathers folded into their first norm" in notes
    for a, b in zip(out, ref):
        assert torch.equal(a, b)          # the gather is exact and the norm is the same kernel


def fold_on_and_off(tiny, T, monkeypatch, flag):
    """[(outputs, cache, kernel rows, pdl_swap's summary) with PdlSwap.<flag> on, the same off]
    for one tiny-model forward of T tokens."""
    from lingc.passes.pdl_swap import PdlSwap
    model, base = tiny
    ids, pos = torch.randint(0, VOCAB, (T,)), torch.arange(P, P + T)
    results = []
    for fold in (True, False):
        monkeypatch.setattr(PdlSwap, flag, fold)
        c = base.clone()
        out, report = run_and_report(model, ids, pos, c, role="forward")
        results.append((out, c, rows(report), stat(report, "pdl_swap").notes[0]))
    return results


@pytest.mark.parametrize("T", [1, 6])
def test_moe_input_norms_folded_into_their_routers(tiny, T, monkeypatch):
    """pdl_norm_folds.norms_into_routers: every MoE layer's post-attention rmsnorm + moe_router become one
    rmsnorm_router; the graph's results agree with and without the fold up to the declared
    rounding (the router's logits of the fp32 normed row), the greedy tokens exactly."""
    model, _ = tiny
    cfg = model.config
    moe = sum(cfg.is_moe_layer(i) for i in range(cfg.num_hidden_layers))
    (on, c_on, r_on, notes), (off, c_off, r_off, _) = fold_on_and_off(tiny, T, monkeypatch, "fold_router_norm")
    assert r_on["lingc.rmsnorm_router"] == moe and "lingc.moe_router" not in r_on
    assert r_off["lingc.moe_router"] == moe and "lingc.rmsnorm_router" not in r_off
    assert r_on["lingc.rmsnorm"] == r_off["lingc.rmsnorm"] - moe
    assert f"{moe} MoE input norms folded into their routers" in notes
    for a, b in zip(on, off):
        assert_rel_close(a, b, 1e-5, "graph output, fold on vs off")
    assert torch.equal(on[0].argmax(-1), off[0].argmax(-1))
    for a, b in zip(c_on.tensors(), c_off.tensors()):
        if b.abs().max() > 0:
            assert_rel_close(a, b, 1e-5, "cache, fold on vs off")


@pytest.mark.parametrize("T", [1, 6])
def test_latent_norms_folded_into_their_cache_writes(tiny, T, monkeypatch):
    """pdl_norm_folds.norms_into_kv_writes: every MLA layer's kv_a_layernorm moves into its
    lingc.mla_kv_write (one launch less per MLA layer); on the CPU both run lingc.rmsnorm's
    reference, so the graph's results and cache are the same bits with and without the fold."""
    mla = len(tiny[0].config.mla_layers)
    (on, c_on, r_on, notes), (off, c_off, r_off, notes_off) = fold_on_and_off(tiny, T, monkeypatch, "fold_kv_norm")
    assert r_on["lingc.mla_kv_write"] == r_off["lingc.mla_kv_write"] == mla
    assert r_on["lingc.rmsnorm"] == r_off["lingc.rmsnorm"] - mla
    assert f"{mla} latent norms folded into their cache writes" in notes
    assert "latent norms" not in notes_off
    for a, b in zip(on, off):
        assert torch.equal(a, b)
    for a, b in zip(c_on.tensors(), c_off.tensors()):
        assert torch.equal(a, b)


class NotANorm(nn.Module):
    """x * rsqrt(mean(x^2) + eps) * w with the mean over the wrong dim: left alone."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(40), requires_grad=False)

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(0, keepdim=True) + 1e-6) * self.w


def test_not_a_norm_is_left():
    _, report = run_and_report(NotANorm(), torch.randn(5, 40))
    assert stat(report, "pdl_swap").matches == 0


@pinned_graph_text
def test_expect_dump(tiny, tmp_path):
    model, base = tiny
    _, report = run_and_report(model, torch.tensor([5]), torch.tensor([P]), base.clone(), role="decode",
                               dump_dir=str(tmp_path))
    # The ops it adds and drops, from its before / after dump (~800 nodes: by op, not line by line).
    assert_expected_inline(dump_op_changes(tmp_path, report, "pdl_swap"), """\
-aten.add.Tensor 101
-aten.amax 2
-aten.bitwise_not 2
-aten.bmm 10
-aten.cat 22
-aten.clone 4
-aten.copy 8
-aten.copy_ 10
-aten.cos 4
-aten.div.Tensor 14
-aten.embedding 1
-aten.exp 22
-aten.index_put 2
-aten.le.Tensor 2
-aten.mean.dim 19
-aten.mul.Tensor 162
-aten.neg 12
-aten.permute 56
-aten.pow.Tensor_Scalar 19
+aten.reshape 16
-aten.rsqrt 27
-aten.scalar_tensor 2
+aten.select.int 10
-aten.select.int 118
-aten.select_scatter 10
-aten.sigmoid 14
-aten.sin 4
+aten.slice.Tensor 5
-aten.slice.Tensor 71
-aten.squeeze.dim 12
-aten.sub.Tensor 10
-aten.sum.dim_IntList 18
-aten.unsqueeze 64
+aten.view 16
-aten.view 78
-aten.where.self 2
+getitem 35
-getitem 10
+lingc.embedding_rmsnorm 1
+lingc.gated_head_rmsnorm 4
+lingc.gemm 7
-lingc.gemm 7
+lingc.head_matmul 4
+lingc.kda_chain 4
+lingc.mla_decode 2
+lingc.mla_kv_write 2
-lingc.moe_router 5
+lingc.rmsnorm 7
+lingc.rmsnorm_router 5
+lingc.swiglu_gemm_separate 1
-lingc.swiglu_gemm_separate 1
-prims.convert_element_type 4
-prims.iota 2
""")
    st = stat(report, "pdl_swap")
    assert_expected_inline(f"{st.matches} matches, ops {st.ops_before} -> {st.ops_after}\n" + "\n".join(st.notes) + "\n",
                           """\
31 matches, ops 1057 -> 245
4 kda_chain, 2 mla_decode, 4 gated_head_rmsnorm, 15 rmsnorm, 2 mla_kv_write, 4 head_matmul (head gate folded into 2 mla_decode); glue: 4 copies of fresh values dropped, 0 casts folded or dropped, 0 epilogue writes made direct; 1 embedding gathers folded into their first norm; 5 MoE input norms folded into their routers; 2 latent norms folded into their cache writes; 3 region probes run, 3 reused for repeated layers
PDL coverage 49/49 kernel-launching ops (100%)
chain L0 KDA: embedding_rmsnorm > gemm > kda_chain > gated_head_rmsnorm > gemm > rmsnorm > swiglu_gemm_separate > gemm
chain L1, L3-L4 KDA: rmsnorm > gemm > kda_chain > gated_head_rmsnorm > gemm > rmsnorm_router > moe_experts
chain L2, L5 MLA: rmsnorm > gemm > mla_kv_write > head_matmul > mla_decode > head_matmul > gemm > rmsnorm_router > moe_experts
chain head: rmsnorm > gemm
""")


def _commit_graph(reader_between: bool):
    """Two layers' kda_commits at a graph's end, optionally with a read of layer 0's state between
    them (which the merge must not move a commit across)."""
    import torch.fx as fx
    from torch._subclasses.fake_tensor import FakeTensorMode

    from lingc.graph_build import emit
    import lingc.runtime.kernels.kda  # noqa: F401

    g = fx.Graph()
    with FakeTensorMode() as mode:
        vals = [torch.empty(2, 4, 4), torch.empty(3, 8, 3), torch.empty(6, 2, 4, 4), torch.empty(6, 3, 8, 3)]
        idx = torch.empty((), dtype=torch.int64)
    phs = []
    for layer in range(2):
        layer_phs = []
        for i, v in enumerate(vals):
            ph = g.placeholder(f"l{layer}_{i}")
            ph.meta["val"] = mode.from_tensor(v) if not isinstance(v, torch._subclasses.FakeTensor) else v
            layer_phs.append(ph)
        phs.append(layer_phs)
    accept = g.placeholder("accept")
    accept.meta["val"] = idx
    emit(g, torch.ops.lingc.kda_commit.default, *phs[0], accept)
    extra = emit(g, torch.ops.aten.sum.default, phs[0][0]) if reader_between else None
    emit(g, torch.ops.lingc.kda_commit.default, *phs[1], accept)
    g.output(extra)
    return g


@pytest.mark.parametrize("reader_between", [False, True])
def test_commit_merge_never_moves_a_commit_past_a_reader(reader_between):
    from lingc.options import LingcOptions
    from lingc.pass_manager import PassContext
    from lingc.passes.pdl_swap import PdlSwap

    g = _commit_graph(reader_between)
    p = PdlSwap(PassContext(LingcOptions(), []))
    merged = p._merge_commits(g)
    ops = [n.target for n in g.nodes if n.op == "call_function"]
    if reader_between:
        assert merged == 0 and ops.count(torch.ops.lingc.kda_commit.default) == 2
        assert any("not merged" in note for note in p.notes)
    else:
        assert merged == 1 and ops == [torch.ops.lingc.kda_commit_many.default]
        many = next(n for n in g.nodes if n.op == "call_function")
        assert [a.name for a in many.args[0]] == ["l0_0", "l1_0"] and many.args[4].name == "accept"


def test_probe_reuse_changes_nothing(tiny, tmp_path, monkeypatch):
    """Layers whose regions are equal (graph_region.region_key) take the first such layer's probe
    outcome: the graph pdl_swap leaves is the same, node for node, as when every layer is probed."""
    from lingc.passes.pdl_swap import PdlSwap
    model, base = tiny
    chain = chain_accepting(model, base, 3, start=P, vocab=VOCAB)
    pos = torch.arange(P, P + 6)
    final, note = {}, {}
    for reuse in (True, False):
        monkeypatch.setattr(PdlSwap, "reuse_probes", reuse)
        out_dir = tmp_path / f"reuse_{reuse}"
        _, report = run_and_report(verify_fn(model), chain, pos, base.clone(), role="verify",
                                   dump_dir=str(out_dir))
        note[reuse] = stat(report, "pdl_swap").notes[0]
        final[reuse] = next(out_dir.glob("*/99-final.txt")).read_text()
    # 4 KDA layers: one probe without a hint, one with the first layer's assignment as the hint,
    # two reused; 2 MLA layers: one probe, one reused.
    assert "3 region probes run, 3 reused for repeated layers" in note[True]
    assert "reused" not in note[False]
    assert final[True] == final[False]
    assert final[True].count("lingc.kda_chain") >= len(model.config.kda_layers)


class WeightlessNorm(nn.Module):
    """A residual add and an RMSNorm without a gain, in one of three spellings."""

    def __init__(self, form: str, d: int = 40):
        super().__init__()
        self.form, self.norm = form, nn.RMSNorm(d, eps=1e-6, elementwise_affine=False)

    def forward(self, x, r):
        h = x + r
        if self.form == "nn":
            y = self.norm(h)
        elif self.form == "functional":
            y = torch.nn.functional.rms_norm(h, (h.shape[-1],), eps=1e-6)
        else:
            hf = h.float()
            y = (hf * torch.rsqrt(hf.pow(2).mean(-1, keepdim=True) + 1e-6)).to(h.dtype)
        return y * 2.0, h


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("form", ["nn", "functional", "hand-written"])
def test_norm_without_a_weight_on_lingc_rmsnorm(form, dtype):
    """A norm without a gain runs on lingc.rmsnorm with a unit weight (the residual add fused):
    eager's bits, since multiplying by 1.0 rounds nothing."""
    x, r = torch.randn(5, 40, dtype=dtype), 3 * torch.randn(5, 40, dtype=dtype)
    m = WeightlessNorm(form)
    with torch.no_grad():
        ref = m(x, r)
    out, report = run_and_report(m, x, r)
    kernels = {op: n for cat, op, n, _ in report.kernels.rows if cat not in ("glue",)}
    assert kernels.get("lingc.rmsnorm") == 1 and "aten.rsqrt" not in kernels, report.kernels.format()
    assert "1 norms without a weight on lingc.rmsnorm" in stat(report, "pdl_swap").notes
    assert all(torch.equal(a, b) for a, b in zip(out, ref))


class WeightlessAfterEmbedding(nn.Module):
    """A gain-less norm of the token embedding whose rows are also copied into a buffer input:
    the embedding fold takes weighted norms only (the gather stays), the out= write takes it."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(30, 40)

    def forward(self, ids, buf):
        e = self.emb(ids)
        y = e * torch.rsqrt(e.pow(2).mean(-1, keepdim=True) + 1e-6)
        buf.copy_(y)
        return e * 2.0


def test_norm_without_a_weight_stays_out_of_the_weighted_folds():
    m = WeightlessAfterEmbedding()
    ids, buf = torch.tensor([3, 29, 0]), torch.randn(3, 40)
    want_buf = buf.clone()
    with torch.no_grad():
        want = m(ids, want_buf)
    out, report = run_and_report(m, ids, buf, role="forward")
    kernels = {op: n for cat, op, n, _ in report.kernels.rows if cat != "glue"}
    assert kernels.get("lingc.rmsnorm_out") == 1 and "lingc.embedding_rmsnorm" not in kernels, kernels
    assert torch.equal(out, want) and torch.equal(buf, want_buf)


class ZeroCenteredNorms(nn.Module):
    """Gemma's / Qwen3-Next's RMSNorm (a zero-centred weight: the gain 1 + w in fp32, the row
    rounded once), as their modeling code writes it: after the token embedding (embedding_rmsnorm
    takes it, the gather inside), after a residual add (fused), and copied into a buffer input
    (rmsnorm_out takes it). ``gain_in_dtype``: the gain added in the weight's 16-bit dtype
    instead (``1 + self.weight``), a rounding the zero-centred form does not make: left as it is."""

    def __init__(self, d: int = 40, gain_in_dtype: bool = False):
        super().__init__()
        self.emb = nn.Embedding(30, d)
        self.w1, self.w2 = (nn.Parameter(0.1 * torch.randn(d), requires_grad=False) for _ in range(2))
        self.gain_in_dtype = gain_in_dtype

    def norm(self, x, w):
        xf = x.float()
        out = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)
        gain = 1 + w if self.gain_in_dtype else 1.0 + w.float()
        return (out * gain).type_as(x)

    def forward(self, ids, buf):
        e = self.emb(ids)
        h = e + 0.5 * self.norm(e, self.w1)        # (no GEMM: lingc.gemm's sums are its own)
        buf.copy_(self.norm(h, self.w2))
        return h * 2.0


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_zero_centered_norms_on_lingc_rmsnorm(dtype, tmp_path):
    """Both zero-centred norms run on lingc kernels with zero_centered=True (the first as
    embedding_rmsnorm, the gather inside; the second as rmsnorm_out, its residual add fused), no
    ATen kernel of the norms is left, and the outputs have eager's bits."""
    m = ZeroCenteredNorms().to(dtype)
    ids, buf = torch.tensor([3, 29, 0]), torch.randn(3, 40, dtype=dtype)
    want_buf = buf.clone()
    with torch.no_grad():
        want = m(ids, want_buf)
    out, report = run_and_report(m, ids, buf, role="forward", dump_dir=str(tmp_path))
    kernels = {op: n for cat, op, n, _ in report.kernels.rows if cat != "glue"}
    # (the two muls are the model's own: 0.5 * y and h * 2)
    assert kernels == {"lingc.embedding_rmsnorm": 1, "lingc.rmsnorm_out": 1, "aten.mul.Tensor": 2}, \
        report.kernels.format()
    assert final_graph_text(report).count("zero_centered=True") == 2
    assert torch.equal(out, want) and torch.equal(buf, want_buf)


def test_zero_centered_norm_gain_rounded_in_bf16_is_left(tmp_path):
    """``1 + w`` added in bf16 rounds the gain before the product: not the zero_centered form,
    so no lingc.rmsnorm takes it with that flag, and the outputs keep eager's bits."""
    m = ZeroCenteredNorms(gain_in_dtype=True).to(torch.bfloat16)
    ids, buf = torch.tensor([3, 29, 0]), torch.randn(3, 40, dtype=torch.bfloat16)
    want_buf = buf.clone()
    with torch.no_grad():
        want = m(ids, want_buf)
    out, report = run_and_report(m, ids, buf, role="forward", dump_dir=str(tmp_path))
    assert "zero_centered" not in final_graph_text(report)
    kernels = {op: n for cat, op, n, _ in report.kernels.rows if cat != "glue"}
    assert "aten.add.Tensor" in kernels, report.kernels.format()          # the bf16 gain stays
    assert torch.equal(out, want) and torch.equal(buf, want_buf)


def test_chains_of_one_kind_and_form_share_a_line():
    """The chain notes group layers of one kind with the same ops (a 42-layer model lists a few
    chains, not 42), ranges of consecutive layers shortened, in first-appearance order."""
    from passes.pdl_swap import _grouped
    kda, mla, tail = ["rmsnorm", "gemm", "kda_chain"], ["rmsnorm", "mla_decode"], ["rmsnorm", "gemm_argmax"]
    chains = [("L0 KDA", kda + ["x"]), ("L1 KDA", kda), ("L2 KDA", kda), ("L3 KDA", kda), ("L4 MLA", mla),
              ("L5 KDA", kda), ("L6 MLA", mla), ("L7 MLA", mla + ["y"]), ("head", tail)]
    assert [label for label, _ in _grouped(chains)] == ["L0 KDA", "L1-L3, L5 KDA", "L4, L6 MLA", "L7 MLA", "head"]
