"""lingc.SpecRunner: the NEXTN relay for a model lingc did not write (tests/foreign_model.py's
Kimi Linear-style and Qwen3-Next-style hybrids with a DeepSeek-V3-style MTP draft layer).

The correctness gates of design.md on that model: greedy speculative output equals plain greedy
output (and eager's) at every accept length, a forced rejection leaves exactly the state of the
accepted prefix, every kernel of the four step graphs is lingc's, and bad input is refused with
the reason. One runner per model (compiling the roles costs ~10 s on the CPU)."""

import pytest
import torch
from foreign_model import KimiStyleModel, MtpDraft
from relay_helpers import Oracle, eager_greedy

import lingc
from lingc.runtime.relay.sampling import draw, sampled_targets, sampling_probs

CACHE = 160
PROMPT = [5, 17, 40, 3, 9]
STEPS = 3
VOCAB = 64

MODELS = [{}, {"gdn": "qwen3-next", "gated_attention": True}]
MODEL_IDS = ["kimi-style", "qwen3-next-style"]


def _state(model_kw: dict, device="cpu", dtype=torch.float32):
    fused = {"fused_conv": 4} if model_kw.get("gdn") == "qwen3-next" else {}
    gated = model_kw.get("gated_attention", False)
    state = [[t.to(device) for t in g] for g in KimiStyleModel.fresh_state(
        1, cache_len=CACHE, dtype=dtype, gated_attention=gated, **fused)]
    return state, [t.to(device) for t in MtpDraft.fresh_cache(CACHE, dtype, gated)]


def _runner(model_kw, device="cpu", dtype=torch.float32, **kw):
    torch._dynamo.reset()
    model = KimiStyleModel(**model_kw).to(device, dtype)
    draft = MtpDraft(model)
    state, dstate = _state(model_kw, device, dtype)
    r = lingc.SpecRunner(model.target, draft, state, dstate, max_len=CACHE, steps=STEPS,
                         options={"inductor": False}, progress=False, **kw)
    r.prepare(("draft", "verify", "extend", "decode"))
    r.report = {role: reps[-1] for role, reps in r.reports.items()}     # each role's one graph
    r.model, r.model_kw = model, model_kw
    return r


@pytest.fixture(scope="module", params=MODELS, ids=MODEL_IDS)
def runner(request):
    return _runner(request.param)


def test_speculative_equals_plain_and_eager(runner):
    spec = runner.generate(PROMPT, 40)
    assert len(runner.stats.accepts) >= 10
    plain = runner.generate(PROMPT, 40, speculative=None)
    assert spec == plain
    assert plain == eager_greedy(runner.model, _state(runner.model_kw)[0], PROMPT, 40)


def test_every_kernel_is_lingc_and_the_verify_graph_stages_the_state(runner):
    """Draft, verify, extend and decode run lingc kernels only; verify stages the two recurrent
    states and two conv windows and commits them; every role's positions come from the relay's n."""
    assert set(runner.report) == {"draft", "verify", "extend", "decode"}
    for role, rep in runner.report.items():
        left = [(op, n) for cat, op, n, _ in rep.kernels.rows if cat not in ("lingc", "glue")]
        assert not left, (role, rep.kernels.format())
        stats = {s.name: s.matches for s in rep.stats}
        assert stats["metadata_capture"] >= 1, (role, stats)
        assert stats["stage_commit"] == (4 if role == "verify" else 0), (role, stats)
    lingc_ops = {op: n for cat, op, n, _ in runner.report["verify"].kernels.rows if cat == "lingc"}
    assert lingc_ops["lingc.kda_chain"] == 2 and lingc_ops["lingc.kda_commit_many"] >= 1, lingc_ops
    attention = "lingc.gqa_decode" if runner.model_kw.get("gated_attention") else "lingc.mla_decode"
    for role in ("draft", "extend"):
        ops = {op: n for cat, op, n, _ in runner.report[role].kernels.rows if cat == "lingc"}
        assert ops.get(attention, 0) == (STEPS - 1 if role == "draft" else 1), (role, ops)
        assert "lingc.kda_chain" not in ops, (role, ops)


def test_every_accept_length_gives_the_plain_tokens(runner):
    gold = runner.generate(PROMPT, 110, speculative=None)
    runner.drafter = Oracle(gold, len(PROMPT), list(range(STEPS + 1)), STEPS, VOCAB)
    try:
        out = runner.generate(PROMPT, 100)
    finally:
        runner.drafter = None
    assert out == gold[:100]
    for a in range(STEPS + 1):
        assert runner.stats.accepts.count(a) >= 5, (a, runner.stats.accepts)


@pytest.mark.parametrize("accepted", range(STEPS + 1))
def test_a_rejection_leaves_the_state_of_the_accepted_prefix(runner, accepted):
    """One speculative step with `accepted` drafts right: the target's recurrent states and conv
    windows equal eager's after the prompt and the accepted prefix, and its cache rows up to
    there too (rows past it are padding later steps rewrite)."""
    gold = runner.generate(PROMPT, 12, speculative=None)
    ids = torch.tensor(PROMPT)
    runner._reset()
    runner._prefill(ids, True)
    runner.drafter = Oracle(gold, len(PROMPT), [accepted], STEPS, VOCAB)
    try:
        runner._launch(("draft", "verify", "extend"))
    finally:
        runner.drafter = None
    assert int(runner.relay.accept) == accepted
    assert int(runner.relay.n) == len(PROMPT) + accepted + 1
    got = [[t.clone() for t in g] for g in runner.state]
    want, _ = _state(runner.model_kw)
    for t in [t for g in want for t in g]:
        t.zero_()
    seen = PROMPT + gold[:accepted + 1]                  # the prompt, x_n = gold[0], d_1..d_a
    with torch.no_grad():
        runner.model(torch.tensor(seen), torch.arange(len(seen)), *want)
    for g_got, g_want in zip(got[:2], want[:2]):         # KDA states, conv windows
        for a, b in zip(g_got, g_want):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got[2][0][:len(seen)], want[2][0][:len(seen)], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_sampled_step_is_speculative_sampling_of_the_eager_targets_logits(runner, seed):
    """One relay step of a sampling request (the verify_sample graph) does what sampling.py says
    with the eager target's logits over its chain and the step's row of uniforms: the same accept
    count and emitted tokens. The drafts are the greedy continuation (often accepted at this
    temperature)."""
    runner.prepare(("verify_sample",))
    gold = runner.generate(PROMPT, 8, speculative=None)
    gen = torch.Generator().manual_seed(seed)
    runner._reset()
    runner._prefill(torch.tensor(PROMPT), True)
    r = runner.relay
    r.uniforms.copy_(torch.rand(r.uniforms.shape, generator=gen))
    r.temperature.fill_(0.6)
    r.top_p.fill_(0.95)
    before = [[t.clone() for t in g] for g in runner.state]
    runner.drafter = Oracle(gold, len(PROMPT), [STEPS], STEPS, VOCAB)
    try:
        runner._launch(("draft", "verify_sample"))
    finally:
        runner.drafter = None
    n = len(PROMPT)
    with torch.no_grad():
        logits, _ = runner.model.target(r.chain, torch.arange(n, n + STEPS + 1), *before)
    y = sampled_targets(r.chain, logits, r.uniforms[0], r.temperature, r.top_p)
    a = int((y[:STEPS] == r.chain[1:]).int().cumprod(0).sum())
    assert int(r.accept) == a
    assert r.emitted[:a + 1].tolist() == r.chain[1:a + 1].tolist() + [int(y[a])]


@pytest.mark.parametrize("seed", [1, 2])
def test_a_step_with_sampled_drafts_is_speculative_sampling_of_the_eager_logits(runner, seed):
    """One relay step of a sampling request with sampled drafts (the draft_sample and
    verify_sample_q graphs): each draft d_{j+1} (j >= 1) is the inverse-CDF draw of the draft's
    softmax over the logits it kept in draft_logits row j, cut to the request's nucleus, at its
    uniform, and the verdict is sampling.py's over the eager target's logits with those rows as q."""
    runner.prepare(("draft_sample", "verify_sample_q"))
    gen = torch.Generator().manual_seed(seed)
    runner._reset()
    runner._prefill(torch.tensor(PROMPT), True)
    r = runner.relay
    r.uniforms.copy_(torch.rand(r.uniforms.shape, generator=gen))
    r.draft_uniforms.copy_(torch.rand(r.draft_uniforms.shape, generator=gen))
    r.temperature.fill_(1.5)
    r.top_p.fill_(0.95)
    before = [[t.clone() for t in g] for g in runner.state]
    runner._launch(("draft_sample",))
    for j in range(1, STEPS):
        q = sampling_probs(r.draft_logits[j:j + 1], r.temperature, r.top_p)[0]
        assert int(r.chain[j + 1]) == int(draw(q[None], r.draft_uniforms[0, j:j + 1])), (j, r.chain.tolist())
    runner._launch(("verify_sample_q",))
    n = len(PROMPT)
    with torch.no_grad():
        logits, _ = runner.model.target(r.chain, torch.arange(n, n + STEPS + 1), *before)
    y = sampled_targets(r.chain, logits, r.uniforms[0], r.temperature, r.top_p, r.draft_logits)
    a = int((y[:STEPS] == r.chain[1:]).int().cumprod(0).sum())
    assert int(r.accept) == a
    assert r.emitted[:a + 1].tolist() == r.chain[1:a + 1].tolist() + [int(y[a])]


def test_sampled_drafts_near_greedy_are_greedy(runner):
    want = runner.generate(PROMPT, 10, speculative=None)
    assert runner.generate(PROMPT, 10, temperature=0.7, top_p=1e-6, seed=3, sampled_drafts=True) == want


def test_near_greedy_sampling_is_greedy(runner):
    want = runner.generate(PROMPT, 10, speculative=None)
    assert runner.generate(PROMPT, 10, temperature=0.7, top_p=1e-6, seed=3) == want
    assert runner.generate(PROMPT, 10, temperature=0.7, top_p=1e-6, seed=3, speculative=None) == want


def test_chunked_prefill_and_stop_ids(runner):
    """The prompt prefilled two tokens at a time (target, then draft over the same spans) gives
    the same tokens; a stop id ends the request at its first occurrence."""
    if runner.model_kw:
        pytest.skip("one model is enough: the prefill and the stop rule are the driver's")
    want = runner.generate(PROMPT, 24)
    chunked = _runner(runner.model_kw, prefill_chunk=2)
    assert chunked.generate(PROMPT, 24) == want
    i = next(i for i in range(1, len(want)) if want[i] not in want[:i])
    assert chunked.generate(PROMPT, 24, stop=[want[i]]) == want[:i + 1]


def test_bad_input_is_refused_with_the_reason():
    model = KimiStyleModel()
    draft = MtpDraft(model)
    state, dstate = _state({})
    running = torch.zeros(32)

    def recurrent_draft(ids, pos, hidden, cache, acc):
        logits, h = draft(ids, pos, hidden, cache)
        acc.add_(h.sum(0))
        return logits, h

    def spec(*a, **kw):
        return lingc.SpecRunner(*a, **{"max_len": CACHE, "progress": False, **kw})

    r = spec(model.target, draft, state, dstate, options={"inductor": False})
    cases = [
        (lambda: spec(model, draft, state, dstate), "target must return (logits [T, V], hidden [T, H])"),
        (lambda: spec(model.target, recurrent_draft, state, (dstate[0], running)),
         "draft_state tensor 1 (shape [32]) changed outside position 159's row"),
        (lambda: spec(model.target, draft, state, (dstate, state[0])), "in both state and draft_state"),
        (lambda: spec(model.target, draft, state, dstate, steps=0), "steps=0"),
        (lambda: spec(model.target, draft, state, dstate, steps=8), "steps=8"),
        (lambda: spec(model.target, draft, state, dstate, max_len=1), "max_len=1"),
        (lambda: spec(model.target, draft, state, dstate, options={"role": "verify"}), "must not set 'role'"),
        (lambda: spec(model.target, draft, state[0][0], dstate), "state must be a tuple"),
        (lambda: spec(model.target, draft, [], dstate), "state holds no tensor"),
        (lambda: r.generate(PROMPT, CACHE), "context overflow: a 5-token prompt + 160 new tokens"),
        (lambda: r.generate([3, 64], 4), "prompt ids [64] are outside the vocabulary [0, 64)"),
        (lambda: r.generate(PROMPT, 4, speculative="eagle"), "speculative='eagle'"),
        (lambda: r.prepare(("greedy",)), "unknown role(s) ['greedy']"),
    ]
    for call, message in cases:
        with pytest.raises(ValueError) as e:
            call()
        assert message in str(e.value), (message, str(e.value))
    with pytest.raises(TypeError, match="lingc.SpecRunner"):
        lingc.generate(model, PROMPT, 4)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("model_kw", MODELS, ids=MODEL_IDS)
def test_gpu_captured_relay_equals_plain_without_a_host_sync(model_kw, dtype):
    """On CUDA: the three relay graphs and the decode graph captured; greedy speculative output
    equals plain at every accept length and with the real draft layer, bit for bit (lingc's
    kernels are batch-invariant), with no host synchronisation between launches."""
    r = _runner(model_kw, "cuda", dtype)
    assert all(r._steps[role].captured for role in ("draft", "verify", "extend", "decode")), \
        {role: s.reason for role, s in r._steps.items()}
    plain = r.generate(PROMPT, 140, speculative=None)
    r.drafter = Oracle(plain, len(PROMPT), list(range(STEPS + 1)), STEPS, VOCAB, device="cuda")
    r.check_syncs = True
    try:
        assert r.generate(PROMPT, 130) == plain[:130]
        assert min(r.stats.accepts.count(a) for a in range(STEPS + 1)) >= 5, r.stats.accepts
        r.drafter = None
        assert r.generate(PROMPT, 130) == plain[:130]
        # Sampling through the captured verify_sample and decode_sample graphs: seeded, and greedy
        # in the one-token limit. Only in fp32: bf16 logits tie at the maximum now and then, and a
        # nucleus keeps every token of the largest logit (argmax takes the first).
        sampled = r.generate(PROMPT, 60, temperature=0.8, seed=5)
        assert r._steps["verify_sample"].captured, r._steps["verify_sample"].reason
        assert r.generate(PROMPT, 60, temperature=0.8, seed=5) == sampled
        drawn = r.generate(PROMPT, 60, temperature=0.8, seed=5, speculative=None)
        assert r._steps["decode_sample"].captured, r._steps["decode_sample"].reason
        assert r.generate(PROMPT, 60, temperature=0.8, seed=5, speculative=None) == drawn != plain[:60]
        if dtype == torch.float32:
            assert r.generate(PROMPT, 60, temperature=0.8, top_p=1e-6, seed=6) == plain[:60]
            assert r.generate(PROMPT, 60, temperature=0.8, top_p=1e-6, seed=6, speculative=None) == plain[:60]
    finally:
        r.drafter, r.check_syncs = None, False
