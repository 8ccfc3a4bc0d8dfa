"""Speculative sampling's verdict (runtime/relay/sampling.py) against the distributions it must
reproduce: each emitted token distributed as pick_token draws it from the target, whatever the
drafts; and on the Ling-3 engine, sampling runs the relay with the first token drawn, not argmax."""

import pytest
import torch
from model_helpers import cache_tensors_close, tiny_model

from lingc.decoding.reference import allocate_cache, pick_token, prefill, sample_generate, sampling_distribution
from lingc.runtime.relay.engine import Engine
from lingc.runtime.relay.sampling import draw, sampled_targets, sampling_probs

PROMPT = [5, 17, 33, 2, 9, 41, 7]


@pytest.mark.parametrize("temperature, top_p", [(1.0, 1.0), (0.7, 0.9), (1.3, 0.5), (0.5, 1e-6)])
def test_sampling_probs_are_pick_tokens(temperature, top_p):
    logits = torch.randn(4, 50, generator=torch.Generator().manual_seed(1)) * 2
    got = sampling_probs(logits, torch.tensor([temperature]), torch.tensor([top_p]))
    torch.testing.assert_close(got, sampling_distribution(logits, temperature, top_p))
    if top_p == 1e-6:       # only the argmax keeps mass: pick_token's greedy limit
        assert torch.equal(got.argmax(-1), logits.argmax(-1)) and torch.equal(got.max(-1).values, torch.ones(4))


def test_draw_follows_the_cdf_and_never_draws_a_token_without_mass():
    probs = torch.tensor([[0.0, 0.25, 0.0, 0.75, 0.0]]).expand(6, 5)
    u = torch.tensor([0.0, 0.24, 0.26, 0.74, 0.76, 0.999999])
    # The first index whose cumulative mass reaches 1 - u of the row's: index 1 (mass 0.25) for
    # u >= 0.75, index 3 below; the zero-mass tokens 0, 2 and 4 never.
    assert draw(probs * 3.0, u).tolist() == [3, 3, 3, 3, 1, 1]


def _tol(n: int) -> float:
    """Five standard errors of a frequency estimated from n draws (at most)."""
    return 5 * (0.25 / n) ** 0.5


def _frequencies(chain, logits, temperature, top_p, n=200000, seed=0):
    """Over n uniform draws (vmapped): the first emitted token's frequencies, the second's given
    that the first was d_1 (the token the target then conditions on) with how many such draws
    there were, and how often d_1 was accepted."""
    S, V = chain.numel() - 1, logits.shape[-1]
    u = torch.rand(n, S + 1, generator=torch.Generator().manual_seed(seed))
    t, p = torch.tensor([temperature]), torch.tensor([top_p])
    y = torch.vmap(lambda row: sampled_targets(chain, logits, row, t, p))(u)
    took_d1 = y[:, 0] == chain[1]
    first = torch.bincount(y[:, 0], minlength=V) / n
    second = torch.bincount(y[took_d1, 1], minlength=V) / took_d1.sum()
    return first, second, int(took_d1.sum()), took_d1.float().mean()


@pytest.mark.parametrize("temperature, top_p", [(1.0, 1.0), (0.8, 0.85)])
def test_each_emitted_token_is_distributed_as_the_target_samples_it(temperature, top_p):
    """Whatever the drafts, the first emitted token follows p_0 and the second, given the first
    was the draft d_1, follows p_1; accepting d_1 happens with probability p_0(d_1)."""
    g = torch.Generator().manual_seed(4)
    logits = torch.randn(4, 6, generator=g) * 1.5
    want = sampling_probs(logits, torch.tensor([temperature]), torch.tensor([top_p]))
    d1 = int(want[0].argsort()[-2])                 # a likely draft, not the likeliest token
    chain = torch.tensor([0, d1, 1, 4])             # x, d_1..d_3
    first, second, n_second, accepted = _frequencies(chain, logits, temperature, top_p)
    assert (first - want[0]).abs().max() < _tol(200000), (first, want[0])
    assert (second - want[1]).abs().max() < _tol(n_second), (second, want[1])
    assert abs(accepted - want[0, d1]) < _tol(200000)


def _frequencies_sampled_drafts(logits, draft_logits, temperature, top_p, n=200000, seed=0):
    """As _frequencies, with each trial's drafts d_{j+1} drawn from q_j (pick_token's distribution
    over the draft's logits: softmax at the temperature, cut to the nucleus): the first emitted
    token's frequencies, the second's given that d_1 was accepted, their count and the
    acceptance rate of d_1."""
    S, V = draft_logits.shape
    g = torch.Generator().manual_seed(seed)
    q = sampling_probs(draft_logits, torch.tensor([temperature]), torch.tensor([top_p]))
    drafts = torch.stack([torch.multinomial(q[j], n, replacement=True, generator=g) for j in range(S)], 1)
    chains = torch.cat([torch.zeros(n, 1, dtype=torch.int64), drafts], 1)
    u = torch.rand(n, S + 1, generator=g)
    t, p = torch.tensor([temperature]), torch.tensor([top_p])
    y = torch.vmap(lambda c, row: sampled_targets(c, logits, row, t, p, draft_logits))(chains, u)
    took_d1 = y[:, 0] == chains[:, 1]
    first = torch.bincount(y[:, 0], minlength=V) / n
    second = torch.bincount(y[took_d1, 1], minlength=V) / took_d1.sum()
    return first, second, int(took_d1.sum()), took_d1.float().mean()


@pytest.mark.parametrize("temperature, top_p", [(1.0, 1.0), (0.8, 0.85), (1.2, 0.5)])
def test_sampled_drafts_emit_tokens_distributed_as_the_target_samples_them(temperature, top_p):
    """Drafts drawn from a different distribution q (its own logits, the request's temperature
    and nucleus): the first emitted token follows p_0, the second given an accepted d_1 follows
    p_1, and d_1 is accepted with probability sum min(p_0, q_0)."""
    g = torch.Generator().manual_seed(7)
    logits = torch.randn(4, 6, generator=g) * 1.5
    draft_logits = logits[:3] * 0.6 + torch.randn(3, 6, generator=g)
    want = sampling_probs(logits, torch.tensor([temperature]), torch.tensor([top_p]))
    q = sampling_probs(draft_logits, torch.tensor([temperature]), torch.tensor([top_p]))
    first, second, n_second, accepted = _frequencies_sampled_drafts(logits, draft_logits, temperature, top_p)
    assert (first - want[0]).abs().max() < _tol(200000), (first, want[0])
    assert (second - want[1]).abs().max() < _tol(n_second), (second, want[1])
    assert abs(accepted - torch.minimum(want[0], q[0]).sum()) < _tol(200000)


@pytest.mark.parametrize("top_p", [1.0, 0.7])
def test_a_sampled_draft_equal_to_the_target_is_always_accepted(top_p):
    """q = p (the same logits, temperature and nucleus): every draft is accepted whatever u; with
    a nucleus too, since q has p's cut (with q's whole softmax a draft outside p's nucleus would
    always be rejected)."""
    g = torch.Generator().manual_seed(2)
    logits = torch.randn(4, 9, generator=g)
    one, cut = torch.tensor([1.0]), torch.tensor([top_p])
    q = sampling_probs(logits[:3], one, cut)
    for trial in range(200):
        chain = torch.cat([torch.tensor([0]), torch.multinomial(q, 1, generator=g)[:, 0]])
        u = torch.rand(4, generator=g) * 0.999
        y = sampled_targets(chain, logits, u, one, cut, logits[:3].clone())
        assert torch.equal(y[:3], chain[1:]), (trial, y.tolist(), chain.tolist())


def test_a_rejected_sampled_draft_draws_from_the_residual():
    """p_0 puts its mass on tokens 0 and 1, q_0 on 1 and 2: a rejected d_1 = 2 (p_0(2) = 0) gives
    token 0 only, the residual max(0, p_0 - q_0) (token 1 has p = q)."""
    logits = torch.full((2, 4), float("-inf"))
    logits[0, :2] = 0.0
    logits[1] = 0.0
    draft = torch.full((1, 4), float("-inf"))
    draft[0, 1:3] = 0.0
    one = torch.tensor([1.0])
    for u0 in (0.0, 0.3, 0.9):
        for u1 in (0.01, 0.5, 0.99):
            y = sampled_targets(torch.tensor([3, 2]), logits, torch.tensor([u0, u1]), one, one, draft)
            assert int(y[0]) == 0, (u0, u1, y.tolist())


def test_a_certain_draft_is_always_accepted_and_all_accepted_draws_from_the_last_row():
    logits = torch.full((3, 5), -30.0)
    logits[0, 3] = logits[1, 1] = 30.0              # p_0 = delta(3), p_1 = delta(1)
    logits[2] = torch.tensor([0.0, 1.0, 2.0, 3.0, 4.0])
    chain = torch.tensor([7, 3, 1])
    u = torch.rand(20000, 3, generator=torch.Generator().manual_seed(0))
    one = torch.tensor([1.0])
    y = torch.vmap(lambda row: sampled_targets(chain, logits, row, one, one))(u)
    assert (y[:, :2] == torch.tensor([3, 1])).all()
    last = torch.bincount(y[:, 2], minlength=5) / 20000
    assert (last - torch.softmax(logits[2], -1)).abs().max() < _tol(20000)


@pytest.fixture(scope="module")
def engine():
    m = tiny_model()
    return m, Engine(m, max_len=512, steps=5, options={"inductor": False}, progress=False)


def test_engine_sampling_draws_the_first_token_and_plain_sampling_draws_each_from_its_uniform(engine):
    """The first token is drawn from the prefill's logits (it was the argmax before session 56),
    with the request's generator as sample_generate draws it; plain sampling then runs the
    decode_sample graph: token k + 1 is the inverse-CDF draw, at the request's uniform of step k,
    from pick_token's distribution over the target's logits after token k (teacher-forced here
    through the reference model)."""
    model, eng = engine
    firsts = {eng.generate(PROMPT, 1, temperature=2.0, seed=s, speculative=None)[0] for s in range(8)}
    assert len(firsts) > 1
    runs = []
    for seed in (1, 2):
        got = eng.generate(PROMPT, 12, temperature=0.9, top_p=0.95, seed=seed, speculative=None, eos_token_id=None)
        assert "decode_sample" in eng._steps and eng.stats.steps >= 11
        assert got[0] == sample_generate(model, PROMPT, 1, temperature=0.9, top_p=0.95, seed=seed)[0]
        u = eng.relay.uniforms[:, 0]
        cache = allocate_cache(model, len(PROMPT), 12)
        prefill(model, cache, torch.tensor(PROMPT))
        for k in range(11):
            logits, _ = model(torch.tensor([got[k]]), torch.tensor([len(PROMPT) + k]), cache)
            want = draw(sampling_probs(logits, 0.9, 0.95), u[k:k + 1])
            assert got[k + 1] == int(want), (seed, k, got)
        runs.append(got)
        assert eng.generate(PROMPT, 12, temperature=0.9, top_p=0.95, seed=seed, speculative=None,
                            eos_token_id=None) == got
    assert runs[0] != runs[1]


def test_engine_sampled_requests_stop_at_a_stop_id(engine):
    """The run-ahead loop decides stop ids for sampled requests too (plain and speculative): the
    tokens end at the first occurrence of the stop id, which the same seed's longer run shows."""
    _, eng = engine
    for speculative in (None, "nextn"):
        kw = dict(temperature=1.1, seed=7, speculative=speculative, eos_token_id=None)
        full = eng.generate(PROMPT, 24, **kw)
        stop = full[5]
        want = full[:full.index(stop) + 1]
        assert eng.generate(PROMPT, 24, stop=[stop], **kw) == want, (speculative, full, stop)


def test_no_state_pollution_after_sampled_requests(engine):
    """design.md's gate for sampling: greedy requests after sampled ones (another prompt, another
    top_p) give the same tokens as before them, and a seeded request repeats. (On this file's
    engine, whose sampled graphs the other tests compile anyway.)"""
    _, eng = engine
    greedy = eng.generate(PROMPT, 24)
    s1 = eng.generate(PROMPT, 24, temperature=0.9, seed=1)
    s2 = eng.generate([3, 1, 4, 1, 5], 24, temperature=1.3, top_p=0.9, seed=2)
    assert eng.generate(PROMPT, 24) == greedy
    assert eng.generate(PROMPT, 24, temperature=0.9, seed=1) == s1       # seeded: reproducible
    assert s1 != greedy and len(s2) >= 1


def test_engine_speculative_sampling(engine):
    """The relay samples: a nucleus holding one token gives the greedy tokens; a seed reproduces
    a request and another seed differs; drafts are accepted (the NEXTN draft agrees with the
    target at a low temperature)."""
    model, eng = engine
    greedy = eng.generate(PROMPT, 40, eos_token_id=None)
    assert eng.generate(PROMPT, 40, temperature=1.0, top_p=1e-6, seed=3, eos_token_id=None) == greedy
    a = eng.generate(PROMPT, 40, temperature=1.2, seed=1, eos_token_id=None)
    assert "verify_sample" in eng._steps and eng.stats.steps >= 1
    assert eng.generate(PROMPT, 40, temperature=1.2, seed=1, eos_token_id=None) == a
    assert eng.generate(PROMPT, 40, temperature=1.2, seed=2, eos_token_id=None) != a
    eng.generate(PROMPT, 40, temperature=0.3, seed=4, eos_token_id=None)
    assert max(eng.stats.accepts) >= 1, eng.stats.accepts
    assert pick_token(torch.tensor([0.0, 5.0]), 1.0, 1e-6).item() == 1


def test_engine_sampled_drafts(engine):
    """Sampled drafts (draft_sample, verify_sample_q, extend_sample): a one-token nucleus gives
    the greedy tokens; a seed reproduces a request and another differs; at a temperature of
    0.01 both distributions are near point masses, so the relay accepts exactly what the greedy
    relay accepts and emits its tokens; the option is refused without speculation or
    temperature."""
    _, eng = engine
    greedy = eng.generate(PROMPT, 24, eos_token_id=None)
    greedy_accepts = list(eng.stats.accepts)
    kw = dict(sampled_drafts=True, eos_token_id=None)
    assert eng.generate(PROMPT, 24, temperature=1.0, top_p=1e-6, seed=3, **kw) == greedy
    assert {"draft_sample", "verify_sample_q", "extend_sample"} <= set(eng._steps)
    a = eng.generate(PROMPT, 24, temperature=1.2, seed=1, **kw)
    assert eng.generate(PROMPT, 24, temperature=1.2, seed=1, **kw) == a
    assert eng.generate(PROMPT, 24, temperature=1.2, seed=2, **kw) != a
    cold = eng.generate(PROMPT, 24, temperature=0.01, seed=0, **kw)
    assert cold == greedy and eng.stats.accepts == greedy_accepts, (cold, eng.stats.accepts)
    for bad in (dict(temperature=0.0), dict(temperature=0.8, speculative=None)):
        with pytest.raises(ValueError, match="sampled_drafts"):
            eng.generate(PROMPT, 4, sampled_drafts=True, **bad)


def test_sampled_draft_steps_keep_the_logits_each_draft_was_drawn_from():
    """The eager step functions on the tiny model: after draft_sample, row j of draft_logits is
    the draft's logits at the forward that produced d_{j+1} (re-run here from the same cache),
    each d_{j+1} the inverse-CDF draw of its softmax at column j of the step's uniforms;
    extend_sample keeps the accepted row's logits as row 0 and draws the next seed from them at
    column 0."""
    from lingc.decoding.reference import allocate_cache as alloc
    from lingc.runtime.relay.buffers import RelayBuffers
    from lingc.runtime.relay.steps import make_steps

    model = tiny_model()
    cfg = model.config
    S = 3
    fns = make_steps(model, S)
    r = RelayBuffers.allocate(S, cfg.hidden_size, cfg.dtype, "cpu", rows=4, vocab=cfg.vocab_size).zero_()
    cache = alloc(model, len(PROMPT), 16)
    logits, hidden = prefill(model, cache, torch.tensor(PROMPT))
    g = torch.Generator().manual_seed(0)
    r.n.fill_(len(PROMPT)); r.x.fill_(int(logits[-1].argmax())); r.seed.fill_(3)      # noqa: E702
    r.dh.copy_(hidden[-1:]); r.temperature.fill_(0.9); r.ring_k.fill_(2)                # noqa: E702
    r.draft_uniforms.copy_(torch.rand(r.draft_uniforms.shape, generator=g))
    r.pos_draft.copy_(torch.arange(len(PROMPT), len(PROMPT) + S - 1))
    snapshot = [t.clone() for t in cache.tensors()]
    with torch.no_grad():
        fns["draft_sample"](r, cache)
        tok, h = r.seed.clone(), r.dh.clone()
        for t, old in zip(cache.tensors(), snapshot):
            t.copy_(old)
        for j in range(1, S):
            lg, h = model.draft(tok, r.pos_draft[j - 1:j], h, cache)
            torch.testing.assert_close(r.draft_logits[j], lg[0].float(), rtol=0, atol=0)
            want = draw(torch.softmax(lg.float() / 0.9, -1), r.draft_uniforms[2:3, j])
            assert int(r.chain[j + 1]) == int(want), (j, r.chain.tolist())
            tok = r.chain[j + 1:j + 2]
        assert int(r.chain[1]) == 3
        # extend_sample after a verify that accepted one draft.
        r.accept.fill_(1)
        r.emitted.copy_(torch.cat([r.chain[1:], r.chain[:1]]))
        r.vhid.copy_(torch.randn(r.vhid.shape, generator=g).to(r.vhid.dtype))
        r.pos_chain.copy_(torch.arange(len(PROMPT), len(PROMPT) + S + 1))
        for t, old in zip(cache.tensors(), snapshot):
            t.copy_(old)
        fns["extend_sample"](r, cache)
        for t, old in zip(cache.tensors(), snapshot):
            t.copy_(old)
        lg, _ = model.draft(r.emitted, r.pos_chain, r.vhid, cache)
        torch.testing.assert_close(r.draft_logits[0], lg[1].float(), rtol=0, atol=0)
        want = draw(torch.softmax(lg[1:2].float() / 0.9, -1), r.draft_uniforms[2:3, 0])
        assert int(r.seed) == int(want) and int(r.ring_k) == 3


def test_a_drawn_first_token_redoes_the_captured_prefills_last_draft_row(monkeypatch):
    """The captured prefill's graph feeds the draft the argmax at the prompt's last row; a sampled
    request's drawn token replaces it there (relay x, the draft's seed and hidden, its cache row),
    as the eager prefill does. On the CPU the padded chunk runs eagerly in place of a replay."""
    import functools

    import lingc.runtime.relay.engine as engine_module
    from lingc.runtime.relay.prefill_graphs import PrefillGraphs

    class Replay:                     # stands in for the CUDA graph: runs the padded chunk
        def __init__(self, step):
            self.step = step

        def replay(self):
            self.step.output = self.step.fn()

    model = tiny_model()
    monkeypatch.setattr(engine_module, "PrefillGraphs", functools.partial(PrefillGraphs, capture=False))
    padded = Engine(model, max_len=256, progress=False, options={"inductor": False})
    padded.use_prefill_graphs = True
    padded.prepare_prefill(len(PROMPT), speculative=(True,))
    bk = padded.prefill_graphs(True)._ready[64]
    bk.step.graph = Replay(bk.step)
    eager = Engine(model, max_len=256, progress=False, options={"inductor": False}, prefill_graphs=False)
    for eng in (padded, eager):
        eng._reset()
        drawn = eng._prefill(torch.tensor(PROMPT), True, pick=lambda logits: torch.tensor(7))
        assert drawn == 7 and int(eng.relay.x) == 7
    assert padded.stats.prefill_rows == 64 and eager.stats.prefill_rows == 0
    assert int(padded.relay.seed) == int(eager.relay.seed)
    torch.testing.assert_close(padded.relay.dh, eager.relay.dh, rtol=1e-4, atol=1e-5)
    # Every state and the cache rows up to the prompt's last, the draft's row there included.
    cache_tensors_close(padded.cache, eager.cache, 1e-4, kv_rows=len(PROMPT))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_engine_speculative_and_plain_sampling_captured_without_a_host_sync():
    m = tiny_model().cuda()
    eng = Engine(m, max_len=512, steps=5, options={"inductor": False}, progress=False)
    greedy = eng.generate(PROMPT, 64, eos_token_id=None)
    eng.check_syncs = True
    try:
        a = eng.generate(PROMPT, 64, temperature=0.9, top_p=0.95, seed=1, eos_token_id=None)
        assert eng._steps["verify_sample"].captured, eng._steps["verify_sample"].reason
        assert eng.generate(PROMPT, 64, temperature=0.9, top_p=0.95, seed=1, eos_token_id=None) == a
        assert eng.generate(PROMPT, 64, temperature=0.9, top_p=1e-6, seed=2, eos_token_id=None) == greedy
        assert eng.stats.prefill_rows > 0           # the captured prefill, its draft row redone
        plain = eng.generate(PROMPT, 64, temperature=0.9, top_p=0.95, seed=1, speculative=None, eos_token_id=None)
        assert eng._steps["decode_sample"].captured, eng._steps["decode_sample"].reason
        assert eng.generate(PROMPT, 64, temperature=0.9, top_p=0.95, seed=1, speculative=None,
                            eos_token_id=None) == plain
        assert eng.generate(PROMPT, 64, temperature=0.9, top_p=1e-6, seed=2, speculative=None,
                            eos_token_id=None) == greedy
    finally:
        eng.check_syncs = False
    assert a != greedy and plain != greedy


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_engine_sampled_drafts_captured_without_a_host_sync():
    """The three graphs of sampled drafts captured (the draft's draws and verify's fifth pass
    inside them), run ahead without a host sync; a seed reproduces, a one-token nucleus gives
    the greedy tokens."""
    m = tiny_model().cuda()
    eng = Engine(m, max_len=512, steps=5, options={"inductor": False}, progress=False)
    greedy = eng.generate(PROMPT, 64, eos_token_id=None)
    eng.check_syncs = True
    kw = dict(sampled_drafts=True, eos_token_id=None)
    try:
        a = eng.generate(PROMPT, 64, temperature=0.9, top_p=0.95, seed=1, **kw)
        for role in ("draft_sample", "verify_sample_q", "extend_sample"):
            assert eng._steps[role].captured, (role, eng._steps[role].reason)
        assert eng.generate(PROMPT, 64, temperature=0.9, top_p=0.95, seed=1, **kw) == a
        assert eng.generate(PROMPT, 64, temperature=0.9, top_p=1e-6, seed=2, **kw) == greedy
        assert eng.generate(PROMPT, 64, temperature=0.9, top_p=0.95, seed=5, **kw) != a
    finally:
        eng.check_syncs = False
    assert a != greedy
