"""lingc.DecodeRunner: plain decoding of a model that is not Ling-3 (tests/foreign_model.py's Kimi
Linear-style and Qwen3-Next-style hybrids), compiled by lingc: greedy tokens equal the eager
model's, the model's kernels are lingc's, stop ids and max_new_tokens trim, a request starts from
a fresh state, chunked prefill and the sampling step agree with greedy where they must, the
sampling step draws what the reference draws from the same uniforms, and bad input is refused with
the reason."""

import pytest
import torch

import lingc
from lingc.decoding.reference import pick_token
from lingc.runtime.relay.ops import sampled_targets_reference
from foreign_model import BatchedKimiStyleModel, KimiStyleModel
from relay_helpers import eager_greedy

CACHE = 32
PROMPT = [5, 17, 40, 3, 9]


MODELS = [{}, {"gdn": "qwen3-next"}, {"gdn": "qwen3-next", "gated_attention": True}]
MODEL_IDS = ["kimi-style", "qwen3-next-style", "qwen3-next-gated-attention"]


def _state(model_kw: dict, device="cpu"):
    fused = {"fused_conv": 4} if model_kw.get("gdn") == "qwen3-next" else {}
    return [[t.to(device) for t in g] for g in KimiStyleModel.fresh_state(
        1, cache_len=CACHE, gated_attention=model_kw.get("gated_attention", False), **fused)]


@pytest.fixture(scope="module", params=MODELS, ids=MODEL_IDS)
def runner(request):
    torch._dynamo.reset()
    model = KimiStyleModel(**request.param)
    r = lingc.DecodeRunner(model, _state(request.param), max_len=CACHE, options={"inductor": False},
                           progress=False)
    r.model_kw = request.param
    return r


def test_greedy_tokens_equal_eager(runner):
    got = runner.generate(PROMPT, 14)
    want = eager_greedy(runner.model, _state(runner.model_kw), PROMPT, 14)
    assert got == want
    assert (runner.stats.steps, runner.stats.launched) == (13, 14)      # one step run ahead, trimmed
    report = runner.reports["greedy"][0]
    # Every kernel is lingc's: the model's, and the step's bookkeeping (token, position, ring)
    # as one relay_advance; Qwen3-Next's gated attention on gqa_decode (RoPE and gate inside) and
    # head_cache_write.
    aten = {op for cat, op, n, _ in report.kernels.rows if cat == "aten"}
    assert not aten, report.kernels.format()
    lingc_ops = {op: n for cat, op, n, _ in report.kernels.rows if cat == "lingc"}
    assert lingc_ops.get("lingc.gqa_decode", 0) == int(bool(runner.model_kw.get("gated_attention"))), lingc_ops
    assert lingc_ops["lingc.relay_advance"] == 1 and lingc_ops["lingc.gemm_argmax"] == 1, lingc_ops


def test_stop_ids_and_max_new_tokens_trim(runner):
    want = runner.generate(PROMPT, 12)
    i = next(i for i in range(1, len(want)) if want[i] not in want[:i])
    assert runner.generate(PROMPT, 12, stop=[want[i]]) == want[:i + 1]
    assert runner.generate(PROMPT, 3) == want[:3]
    assert runner.generate(PROMPT, 1) == want[:1]


def test_a_request_starts_from_a_fresh_state(runner):
    a = runner.generate(PROMPT, 8)
    runner.generate([1, 2, 3, 4, 5, 6, 7], 9)
    assert runner.generate(PROMPT, 8) == a


def test_near_greedy_sampling_is_greedy(runner):
    """top_p below every token's probability keeps the most likely token only: the sampling step
    (the draw inside the step graph, then the greedy step's tail) gives the greedy tokens; a seed
    gives the same draws twice."""
    want = runner.generate(PROMPT, 10)
    assert runner.generate(PROMPT, 10, temperature=0.7, top_p=1e-6, seed=3) == want
    assert runner.generate(PROMPT, 10, temperature=1.5, seed=11) == runner.generate(PROMPT, 10, temperature=1.5,
                                                                                    seed=11)


def test_sampled_tokens_are_the_reference_draws(runner):
    """The sampling step draws step k's token from the logits with row k of the request's uniforms
    (drawn from its generator after the first token's pick_token): the eager model and the
    reference draw (sampled_targets_reference over the one-token chain) give the same tokens. The
    step's kernels are lingc's: the draw (lingc.sampled_targets) and the tail as relay_advance."""
    temperature, top_p, seed, n = 0.9, 0.8, 21, 12
    got = runner.generate(PROMPT, n, temperature=temperature, top_p=top_p, seed=seed)
    state = _state(runner.model_kw)
    for leaf in (leaf for group in state for leaf in group):
        leaf.zero_()                                    # a request's fresh state
    gen = torch.Generator().manual_seed(seed)
    t, p = torch.tensor([temperature]), torch.tensor([top_p])
    with torch.no_grad():
        logits = runner.model(torch.tensor(PROMPT), torch.arange(len(PROMPT)), *state)
        want = [int(pick_token(logits[-1].float(), temperature, top_p, gen))]
        table = torch.rand((runner.max_len, 1), generator=gen)
        for k in range(n - 1):
            x = torch.tensor([want[-1]])
            logits = runner.model(x, torch.tensor([len(PROMPT) + k]), *state)
            want.append(int(sampled_targets_reference(x, logits, table[k], t, p)[0]))
    assert got == want
    report = runner.reports["sample"][0]
    aten = {op for cat, op, _, _ in report.kernels.rows if cat == "aten"}
    assert not aten, report.kernels.format()
    lingc_ops = {op: n for cat, op, n, _ in report.kernels.rows if cat == "lingc"}
    assert lingc_ops["lingc.sampled_targets"] == 1 and lingc_ops["lingc.relay_advance"] == 1, lingc_ops


def test_chunked_prefill_gives_the_same_tokens():
    torch._dynamo.reset()
    model = KimiStyleModel()
    whole = lingc.DecodeRunner(model, _state({}), max_len=CACHE, options={"inductor": False}, progress=False)
    chunked = lingc.DecodeRunner(model, _state({}), max_len=CACHE, options={"inductor": False}, progress=False,
                                 prefill_chunk=2)
    assert chunked.generate(PROMPT, 6) == whole.generate(PROMPT, 6)


def test_a_model_with_a_batch_dim_through_a_wrapper():
    """A model laid out the Hugging Face way (ids [1, T] in, logits [1, T, V] out, a batch dim of
    1 on its state) runs through a one-line wrapper; its tokens are its eager tokens."""
    torch._dynamo.reset()
    model = BatchedKimiStyleModel()
    state = BatchedKimiStyleModel.fresh_state(1, cache_len=CACHE)

    def step(ids, pos, *s):
        return model(ids[None], pos, *s)[0]

    r = lingc.DecodeRunner(step, state, max_len=CACHE, options={"inductor": False}, progress=False)
    assert r.generate(PROMPT, 10) == eager_greedy(step, BatchedKimiStyleModel.fresh_state(1, cache_len=CACHE), PROMPT, 10)
    assert r.reports["greedy"][0].kernels.counts()["lingc"] >= 25


def test_bad_input_is_refused_with_the_reason():
    model = KimiStyleModel()
    state = _state({})
    r = lingc.DecodeRunner(model, state, max_len=CACHE, options={"inductor": False}, progress=False,
                           vocab_size=64)
    cases = [
        (lambda: r.generate(PROMPT, CACHE), "context overflow: a 5-token prompt + 32 new tokens need 37 positions"),
        (lambda: r.generate([], 4), "non-empty 1-d"),
        (lambda: r.generate(torch.tensor([1.0, 2.0]), 4), "integer token ids"),
        (lambda: r.generate([3, 64], 4), "prompt ids [64] are outside the vocabulary [0, 64)"),
        (lambda: r.generate(PROMPT, 0), "at least 1 new token"),
        (lambda: r.generate(PROMPT, 4, temperature=-1.0), "temperature=-1.0"),
        (lambda: r.generate(PROMPT, 4, top_p=0.0), "top_p=0.0"),
        (lambda: lingc.DecodeRunner(model, state, max_len=1), "max_len=1"),
        (lambda: lingc.DecodeRunner(model, [state[0], 3], max_len=CACHE), "state[1] is a int"),
        (lambda: lingc.DecodeRunner(model, state[0][0], max_len=CACHE), "state must be a tuple"),
        (lambda: lingc.DecodeRunner(model, [], max_len=CACHE), "state holds no tensor"),
        (lambda: lingc.DecodeRunner(model, state, max_len=CACHE, options={"role": "verify"}), "must not set 'role'"),
        (lambda: lingc.DecodeRunner(model, state, max_len=CACHE, prefill_chunk=0), "prefill_chunk=0"),
        (lambda: r.prepare(("verify",)), "the steps are 'greedy' and 'sample'"),
    ]
    for call, message in cases:
        with pytest.raises(ValueError, match=None) as e:
            call()
        assert message in str(e.value), (message, str(e.value))


def test_lingc_generate_names_the_runner_for_another_model():
    with pytest.raises(TypeError, match="lingc.DecodeRunner"):
        lingc.generate(KimiStyleModel(), PROMPT, 4)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("model_kw", MODELS, ids=MODEL_IDS)
def test_gpu_captured_greedy_equals_eager(model_kw):
    """On CUDA: the step captured as one CUDA graph (its kernels PDL-chained), replayed with the
    host running one step ahead; tokens equal the eager model's on the GPU. The sampling step
    likewise, without a host sync between launches."""
    torch._dynamo.reset()
    model = KimiStyleModel(**model_kw).cuda()
    r = lingc.DecodeRunner(model, _state(model_kw, "cuda"), max_len=CACHE, progress=False)
    got = r.generate(PROMPT, 20)
    assert got == eager_greedy(model, _state(model_kw, "cuda"), PROMPT, 20)
    (info,) = r.graph_infos()
    assert info.kernel_nodes > 20 and info.pdl_edges > 0, info.format()
    assert (r.stats.steps, r.stats.launched) == (19, 20)
    # Sampling through the captured sample step, run ahead with no host sync between launches:
    # seeded; greedy in the one-token nucleus limit (fp32 logits: no ties at the maximum).
    r.check_syncs = True
    try:
        drawn = r.generate(PROMPT, 20, temperature=0.8, seed=5)
        assert r._steps["sample"].captured, r._steps["sample"].reason
        assert r.generate(PROMPT, 20, temperature=0.8, seed=5) == drawn != got
        assert r.generate(PROMPT, 20, temperature=0.8, top_p=1e-6, seed=6) == got
    finally:
        r.check_syncs = False
