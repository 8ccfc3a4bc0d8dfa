"""stage_commit: a verify graph's recurrent-state writes are staged per chain position and the
accepted one is committed at lingc.state_commit. Forced rejections at every accept length leave
the from-scratch state; without the pass a rejection corrupts it."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
from backend_helpers import compile_lingc, dump_op_changes, pinned_graph_text, run_and_report, stat
from expecttest import assert_expected_inline
from model_helpers import assert_rel_close, chain_accepting, randomize_cache_, tiny_model

import lingc.runtime.relay  # noqa: F401  (registers the relay ops)
from lingc.backend import compile_reports
from lingc.models import Ling3Cache
from lingc.pass_manager import pass_names

ops = torch.ops.lingc
S = 5                     # drafts per chain: T = 6
P = 5                     # prefilled positions before the chain
VOCAB = 300
OTHER = [n for n in pass_names() if n != "stage_commit"]   # isolate the pass under test


def verify_fn(model):
    def verify(chain, positions, cache):
        logits, hidden = model(chain, positions, cache)
        y = logits.argmax(-1)
        accept = ops.state_commit(ops.greedy_verdict(chain, y))
        return y, accept, hidden
    return verify


@pytest.fixture(scope="module")
def setup():
    torch.manual_seed(0)
    model = tiny_model()
    base = randomize_cache_(Ling3Cache.allocate(model.config, 32), seed=3, rows=0)
    with torch.no_grad():
        model(torch.randint(0, VOCAB, (P,)), torch.arange(P), base)
    return model, base


def compiled_verify(model, **options):
    disable = options.pop("disable", [])
    return compile_lingc(verify_fn(model), role="verify", disable_passes=OTHER + disable, **options)


def run_verify(fn, base, chain):
    cache = base.clone()
    with torch.no_grad():
        y, accept, _ = fn(chain, torch.arange(P, P + S + 1), cache)
    return cache, int(accept)


@pytest.mark.parametrize("staged", [True, False])
def test_forced_rejection_at_every_position(setup, staged):
    model, base = setup
    fn = compiled_verify(model, disable=[] if staged else ["stage_commit"])
    corrupted = 0
    for j in range(S + 1):
        chain = chain_accepting(model, base, j, start=P, steps=S, vocab=VOCAB)
        cache, accept = run_verify(fn, base, chain)
        assert accept == j
        ref = base.clone()
        with torch.no_grad():
            model(chain[:j + 1], torch.arange(P, P + j + 1), ref)     # from scratch: x_n, d_1..d_j
        errs = [(a - b).abs().max().item() for a, b in zip(cache.recurrent_tensors(), ref.recurrent_tensors())]
        if staged:
            for a, b in zip(cache.recurrent_tensors(), ref.recurrent_tensors()):
                assert_rel_close(a, b, 1e-5, f"state after accepting {j}")
        elif max(errs) > 1e-3:
            corrupted += 1
    if not staged:
        assert corrupted == S, "without stage_commit every rejection must leave a wrong state"


def test_all_accepted_equals_unstaged_graph_exactly(setup):
    model, base = setup
    chain = chain_accepting(model, base, S, start=P, steps=S, vocab=VOCAB)
    staged, a1 = run_verify(compiled_verify(model), base, chain)
    plain, a2 = run_verify(compiled_verify(model, disable=["stage_commit"]), base, chain)
    assert a1 == a2 == S
    for x, y in zip(staged.tensors(), plain.tensors()):
        assert torch.equal(x, y)


def test_counts_and_notes(setup):
    model, base = setup
    cache = base.clone()
    args = (chain_accepting(model, base, 2, start=P, steps=S, vocab=VOCAB), torch.arange(P, P + S + 1), cache)
    _, report = run_and_report(verify_fn(model), *args, role="verify", disable_passes=OTHER)
    st = stat(report, "stage_commit")
    n_kda = len(model.config.kda_layers)
    assert st.matches == 2 * n_kda                                   # state + conv window per KDA layer
    assert sum("recurrence staged" in n for n in st.notes) == n_kda
    assert sum("sliding window staged" in n for n in st.notes) == n_kda
    assert sum("positional write" in n for n in st.notes) == len(model.config.mla_layers)
    counts = {op: n for _, op, n, _ in report.kernels.rows}
    assert "aten.stack" not in counts                                 # lowered to cat by the cleanup tail
    assert "lingc.state_commit" not in counts                         # bound and removed
    assert st.ops_after > st.ops_before


def test_only_in_verify_role(setup):
    model, base = setup
    chain = chain_accepting(model, base, 1, start=P, steps=S, vocab=VOCAB)
    _, report = run_and_report(verify_fn(model), chain,
                               torch.arange(P, P + S + 1), base.clone(), role="forward", disable_passes=OTHER)
    assert stat(report, "stage_commit").skipped == "not for role forward"


class ForeignRecurrence(nn.Module):
    """An independently written linear recurrence with its state stored [V, K] (transposed) and
    a token loop over unbind: same kind of write, different spelling."""

    def __init__(self, d=8):
        super().__init__()
        self.wk = nn.Parameter(torch.randn(d, d) / d ** 0.5, requires_grad=False)
        self.wv = nn.Parameter(torch.randn(d, d) / d ** 0.5, requires_grad=False)

    def forward(self, tokens, positions, state):
        x = torch.nn.functional.one_hot(tokens, 8).float() + positions[:, None].float() * 0.01
        ks, vs = torch.unbind(x @ self.wk, 0), torch.unbind(x @ self.wv, 0)
        st = state[0]
        outs = []
        for k, v in zip(ks, vs):
            st = 0.9 * st + torch.outer(v, torch.tanh(k))
            outs.append(st.sum(1))
        state[0].copy_(st)
        y = torch.stack(outs)                                          # [T, 8] "logits"
        target = y.argmax(-1)
        return ops.state_commit(ops.greedy_verdict(tokens, target)), y


def test_foreign_recurrence_staged():
    torch.manual_seed(1)
    m = ForeignRecurrence()
    tokens, pos = torch.tensor([1, 2, 3, 4]), torch.arange(4)
    state0 = torch.randn(1, 8, 8)
    with torch.no_grad():
        a_ref, y = m(tokens, pos, state0.clone())
        target = y.argmax(-1)
        tokens = torch.tensor([1, int(target[0]), int(target[1]), (int(target[2]) + 1) % 8])
        n = len(compile_reports)
        fn = compile_lingc(m, role="verify")
        st = state0.clone()
        accept, _ = fn(tokens, pos, st)
        ref = state0.clone()
        m(tokens[:int(accept) + 1], pos[:int(accept) + 1], ref)
    assert int(accept) == 2
    assert torch.allclose(st, ref, atol=1e-6)
    assert stat(compile_reports[n], "stage_commit").matches == 1


class WholeInputWindow(nn.Module):
    """A short-conv cache that is a whole graph input, [C, 3], extended with the new rows by
    cat(..., dim=-1) and cut back by window[:, -3:] (dim 1): Qwen3-Next's causal_conv1d_update
    spelling, staged as a sliding window."""

    def forward(self, tokens, positions, window):
        x = torch.nn.functional.one_hot(tokens, 8).float() + positions[:, None].float() * 0.01   # [T, C]
        seq = torch.cat([window, x.T], dim=-1)
        window.copy_(seq[:, -3:])
        y = torch.stack([seq[:, j:j + 4].sum(1) for j in range(x.shape[0])])      # [T, C] "logits"
        return ops.state_commit(ops.greedy_verdict(tokens, y.argmax(-1))), y


def test_whole_input_window_cut_on_a_negative_cat_dim_is_staged():
    m = WholeInputWindow()
    tokens, pos = torch.tensor([1, 2, 3, 4, 5]), torch.arange(5)
    win0 = torch.randn(8, 3, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        _, y = m(tokens, pos, win0.clone())
        target = y.argmax(-1)
        tokens = torch.tensor([1, int(target[0]), (int(target[1]) + 1) % 8, 3, 4])
        n = len(compile_reports)
        win = win0.clone()
        accept, _ = compile_lingc(m, role="verify")(tokens, pos, win)
        ref = win0.clone()
        m(tokens[:int(accept) + 1], pos[:int(accept) + 1], ref)
    assert int(accept) == 1
    assert torch.equal(win, ref)
    assert "sliding window staged over 5 positions" in " ".join(stat(compile_reports[n], "stage_commit").notes)


class ChunkedWrite(nn.Module):
    """A state written from all positions at once (no per-position value): must be refused."""

    def forward(self, tokens, positions, state):
        x = torch.nn.functional.one_hot(tokens, 8).float()
        state[0].copy_(0.5 * state[0] + x.T @ x)
        target = (x @ state[0]).argmax(-1)
        return ops.state_commit(ops.greedy_verdict(tokens, target))


def test_unstageable_state_is_an_error():
    with pytest.raises(Exception, match="does not decompose per chain position"):
        with torch.no_grad():
            compile_lingc(ChunkedWrite(), role="verify")(torch.tensor([1, 2, 3]), torch.arange(3),
                                                        torch.randn(1, 8, 8))


def test_verdict_reference():
    chain = torch.tensor([9, 1, 2, 3, 4])
    assert int(ops.greedy_verdict(chain, torch.tensor([1, 2, 3, 4, 0]))) == 4
    assert int(ops.greedy_verdict(chain, torch.tensor([1, 2, 0, 4, 0]))) == 2
    assert int(ops.greedy_verdict(chain, torch.tensor([0, 2, 3, 4, 0]))) == 0
    with pytest.raises(ValueError, match="must both be"):
        ops.greedy_verdict(chain, torch.tensor([1, 2]))


@pinned_graph_text
def test_expect_dump(setup, tmp_path):
    model, base = setup
    from lingc.dump import format_summary
    chain = chain_accepting(model, base, 2, start=P, steps=S, vocab=VOCAB)
    _, report = run_and_report(verify_fn(model), chain, torch.arange(P, P + S + 1), base.clone(), role="verify",
                               disable_passes=OTHER, dump_dir=str(tmp_path))
    # The ops it adds and drops, from its before / after dump (the staged copies and their stacks).
    assert_expected_inline(dump_op_changes(tmp_path, report, "stage_commit"), """\
+aten.cat 20
+aten.copy 8
-aten.copy 8
+aten.copy_ 8
-aten.copy_ 8
+aten.index.Tensor 8
+aten.permute 80
+aten.select.int 8
-aten.select.int 8
+aten.select_scatter 8
-aten.select_scatter 8
+aten.slice.Tensor 60
+aten.squeeze.dim 8
+aten.stack 8
+aten.view 20
-lingc.state_commit 1
""")
    text = format_summary([s for s in report.stats if s.name in ("stage_commit", "cleanup")], "verify",
                          timings=False)
    assert_expected_inline(text, """\
lingc pass summary (role verify)
pass                 matches   ops before -> after   time ms  note
stage_commit               8          1858 -> 2061         -  arg50_1 (cache_kv_0): positional write (index_put.default), not staged
    arg115_1 (cache_kv_1): positional write (index_put.default), not staged
    arg4_1 (cache_conv_0): sliding window staged over 6 positions
    arg14_1 (cache_state_0): recurrence staged over 6 positions
    arg24_1 (cache_conv_1): sliding window staged over 6 positions
    arg34_1 (cache_state_1): recurrence staged over 6 positions
    arg66_1 (cache_conv_2): sliding window staged over 6 positions
    arg76_1 (cache_state_2): recurrence staged over 6 positions
    arg90_1 (cache_conv_3): sliding window staged over 6 positions
    arg100_1 (cache_state_3): recurrence staged over 6 positions
cleanup                    0          2061 -> 2109         -
""")


def test_staged_verify_graph_through_inductor():
    """The verify role through Inductor (the other tests run ATen): the staged states reach
    Inductor in a form it accepts (the cleanup tail lowers the emitted aten.stack)."""
    torch.manual_seed(2)
    m = ForeignRecurrence()
    pos = torch.arange(4)
    state0 = torch.randn(1, 8, 8)
    with torch.no_grad():
        _, y = m(torch.tensor([1, 2, 3, 4]), pos, state0.clone())
        t = y.argmax(-1)
        tokens = torch.tensor([1, int(t[0]), (int(t[1]) + 1) % 8, 5])
        st = state0.clone()
        accept, _ = compile_lingc(m, role="verify", inductor=True)(tokens, pos, st)
        ref = state0.clone()
        m(tokens[:int(accept) + 1], pos[:int(accept) + 1], ref)
    assert int(accept) == 1
    assert torch.allclose(st, ref, atol=1e-6)
