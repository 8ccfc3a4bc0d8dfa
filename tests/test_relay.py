"""The NEXTN relay on the CPU (and the GPU with -m gpu): the correctness gates of design.md.

One engine per module (compiling four role graphs costs ~40 s on the CPU); every request resets
its cache and relay buffers, which the pollution test checks.
"""

from __future__ import annotations

import difflib

import pytest
import torch
from backend_helpers import run_and_report, stat
from expecttest import assert_expected_inline
from model_helpers import tiny_model

import lingc
import relay_helpers
from lingc.decoding.reference import greedy_generate, speculative_generate
from lingc.runtime.relay.buffers import RelayBuffers
from lingc.runtime.relay.engine import Engine
from lingc.runtime.relay.steps import make_steps

PROMPT = [5, 17, 33, 2, 9, 41, 7]
STEPS = 5
OPTS = {"inductor": False}


@pytest.fixture(scope="module")
def model():
    return tiny_model()


@pytest.fixture(scope="module")
def engine(model):
    # The default capture of the ATen graph (LingcOptions.capture, "functionalize"); the other
    # one ("aot") runs the 256-token gate below, and test_backend compares the two captures'
    # graphs op for op.
    return Engine(model, max_len=512, steps=STEPS, options=OPTS, progress=False)


@pytest.fixture(scope="module")
def aot_engine(model):
    return Engine(model, max_len=512, steps=STEPS, options={**OPTS, "capture": "aot"}, progress=False)


@pytest.fixture(scope="module")
def gold(model):
    """Plain greedy output of the eager model, no EOS: the oracle's tokens."""
    return greedy_generate(model, PROMPT, 300, eos_token_id=None)


def Oracle(gold, prompt_len, schedule, steps=STEPS, vocab=320, device="cpu"):
    return relay_helpers.Oracle(gold, prompt_len, schedule, steps, vocab, device)


def test_plain_decode_matches_eager_reference(engine, gold):
    assert engine.generate(PROMPT, 40, speculative=None, eos_token_id=None) == gold[:40]
    assert engine.stats.steps >= 39


def test_the_relay_loop_lists_the_collections_inside_it(engine, gold):
    """A garbage collection while a request runs (here the consumer's) is in the request's stats
    (host_gc.py; the benchmark prints them beside its wall times)."""
    import gc
    out = []
    for t in engine.stream(PROMPT, 12, speculative=None, eos_token_id=None):
        out.append(t)
        if len(out) == 4:
            gc.collect()
    assert out == gold[:12]
    assert [c.generation for c in engine.stats.collections].count(2) >= 1


@pytest.mark.parametrize("capture", ["functionalize", "aot"])
def test_speculative_equals_plain_over_256_tokens_every_accept_length(capture, gold, request):
    engine = request.getfixturevalue("aot_engine" if capture == "aot" else "engine")
    engine.drafter = Oracle(gold, len(PROMPT), schedule=list(range(STEPS + 1)))
    try:
        out = engine.generate(PROMPT, 256, eos_token_id=None)
    finally:
        engine.drafter = None
    assert out == gold[:256]
    accepts = engine.stats.accepts
    for a in range(STEPS + 1):
        assert accepts.count(a) >= 10, f"accept length {a} occurred {accepts.count(a)} times"


def test_nextn_draft_speculative_equals_plain_and_reference(model, engine, gold):
    out = engine.generate(PROMPT, 48, eos_token_id=None)
    assert out == gold[:48]
    ref = speculative_generate(model, PROMPT, 48, steps=STEPS, eos_token_id=None)
    assert ref.tokens == out
    assert [s.accepted for s in ref.steps][:len(engine.stats.accepts)] == \
        engine.stats.accepts[:len(ref.steps)]


def test_eos_in_the_middle_of_an_accepted_chain_stops_there(engine, gold):
    # Full acceptance (schedule 5): steps emit 6 tokens each; stop at the 3rd token of step 2.
    k = 1 + 6 + 2
    stop_tok = gold[k]
    first = gold.index(stop_tok)
    engine.drafter = Oracle(gold, len(PROMPT), schedule=[STEPS])
    try:
        out = engine.generate(PROMPT, 100, eos_token_id=None, stop=[stop_tok])
    finally:
        engine.drafter = None
    assert out == gold[:first + 1]


def test_errors(model, engine):
    with pytest.raises(ValueError, match="context overflow"):
        engine.generate(PROMPT, 600)
    with pytest.raises(ValueError, match="non-empty"):
        engine.generate([], 4)
    with pytest.raises(ValueError, match="speculative="):
        engine.generate(PROMPT, 4, speculative="eagle")
    vocab = model.config.vocab_size
    with pytest.raises(ValueError, match=rf"prompt ids \[{vocab}, -1\] are outside the vocabulary \[0, {vocab}\)"):
        engine.generate([1, vocab, 2, -1], 4)
    with pytest.raises(ValueError, match="integer token ids, got a torch.float32 tensor"):
        engine.generate(torch.tensor([1.0, 2.0]), 4)
    with pytest.raises(ValueError, match="integer token ids"):
        engine.generate([1, 2.5], 4)
    with pytest.raises(ValueError, match="temperature=-0.5"):
        engine.generate(PROMPT, 4, temperature=-0.5)
    with pytest.raises(ValueError, match="top_p=0"):
        engine.generate(PROMPT, 4, temperature=1.0, top_p=0)
    import numpy as np
    assert engine.generate(np.array(PROMPT), 3) == engine.generate(torch.tensor(PROMPT), 3)
    with pytest.raises(ValueError, match="steps=9"):
        Engine(model, max_len=64, steps=9)
    with pytest.raises(ValueError, match="must not set 'role'"):
        Engine(model, max_len=64, options={"role": "verify"})


def test_naive_host_refill_without_metadata_capture(model, gold, tmp_path):
    eng = Engine(model, max_len=128, steps=2, progress=False,
                 options=dict(OPTS, disable_passes=["metadata_capture"], dump_dir=str(tmp_path)))
    out = eng.generate(PROMPT, 12, eos_token_id=None)
    assert out == gold[:12]
    assert all(eng.naive_refill[r] for r in ("draft", "verify", "extend"))
    assert eng.stats.host_syncs == 3 * (eng.stats.steps + 1)           # one sync per graph launch
    graphs = (tmp_path / "cuda_graphs.txt").read_text().splitlines()   # the dump's CUDA-graph list
    assert [g.split()[0] for g in graphs[1:]] == ["draft", "verify", "extend"]
    assert all(g.split()[1] == "no" for g in graphs[1:])                  # CPU: uncaptured, said so


def test_second_engine_reuses_the_graphs_without_the_naive_refill(model, gold):
    """A second engine over the same model with equal options compiles nothing (Dynamo reuses the
    first engine's graphs) and still knows its graphs compute their own positions: no per-step
    host refill (session 65: every engine after the first fell back to it, one host sync a
    launch, which the GPU sync check caught)."""
    from lingc.backend import compile_reports
    first = Engine(model, max_len=128, steps=2, progress=False, options=OPTS)
    first.prepare(("draft", "verify", "extend"))
    n = len(compile_reports)
    second = Engine(model, max_len=128, steps=2, progress=False, options=OPTS)
    assert second.generate(PROMPT, 12, eos_token_id=None) == gold[:12]
    assert len(compile_reports) == n, "the second engine compiled again"
    assert not any(second.naive_refill[r] for r in ("draft", "verify", "extend")), second.naive_refill
    assert second.stats.host_syncs == 0
    assert all(second.reports[r] == first.reports[r] != [] for r in ("draft", "verify", "extend"))


def test_a_step_that_runs_without_a_lingc_graph_stops_the_engine(model, monkeypatch):
    """Where a step runs as Python (torch.compile handing the function back, as a stand-in for
    any way of running no lingc graph), the step is wrong (no stage_commit: a rejected draft's
    state stays) and the engine says so instead of generating. (torch 2.13 itself refuses a
    fullgraph compile under torch._dynamo.config.disable.)"""
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: fn)
    eng = Engine(model, max_len=128, steps=2, progress=False, options=OPTS)
    with pytest.raises(RuntimeError, match="the draft step ran without a lingc graph"):
        eng.generate(PROMPT, 12, eos_token_id=None)


def test_engines_with_other_options_keep_their_own_recompile_limit(model, monkeypatch, tmp_path):
    """Each options set's step graphs live on a code object of its own (compile_keys.py), so
    engines that differ only in options never add up to Dynamo's recompile limit (past it a
    fullgraph compile fails hard), while equal options still share one cache."""
    from lingc.runtime.relay.compile_keys import for_options, options_key

    monkeypatch.setattr(torch._dynamo.config, "recompile_limit", 1)
    for d in ("a", "b"):        # options no other test uses: no earlier entries on their code
        opts = {**OPTS, "dump_dir": str(tmp_path / d)}
        Engine(model, max_len=128, steps=2, progress=False, options=opts).prepare(("verify",))
    assert options_key({"a": 1, "b": "x"}) == options_key({"b": "x", "a": 1}) != options_key({"a": 2, "b": "x"})

    def outer(n):
        def f(x):
            return x + n
        return f

    f3 = outer(3)
    a, b, c = for_options(f3, {"a": 1}), for_options(outer(4), {"a": 1}), for_options(f3, {"a": 2})
    assert a.__code__ is b.__code__ is not f3.__code__ and c.__code__ is not a.__code__
    assert (a(1), b(1), c(1)) == (4, 5, 4) and a.__qualname__ == f3.__qualname__


def test_generate_api_and_stream(model, gold):
    out = lingc.generate(model, PROMPT, 10, options=OPTS)
    assert out[:10] == gold[:len(out)]
    it = lingc.generate(model, PROMPT, 10, options=OPTS, stream=True)
    assert list(it) == out


def test_metadata_capture_inputs_before_and_after(model):
    """After the pass the verify graph no longer reads the host-refilled positions buffer."""
    from lingc import pass_manager
    from lingc.compat import TORCH_VERSION
    from lingc.graph_text import format_graph
    from lingc.passes.metadata_capture import MetadataCapture, graph_reads
    seen = {}

    class Spy(MetadataCapture):
        def apply(self, gm):
            refills = [n for n in gm.graph.nodes if n.target is torch.ops.lingc.host_refill.default]
            seen["host"] = {n.args[0].name for n in refills}
            seen["before"] = set(graph_reads(gm))
            seen["text_before"] = format_graph(gm).splitlines()
            matches = super().apply(gm)
            seen["after"] = set(graph_reads(gm))
            seen["text_after"] = format_graph(gm).splitlines()
            seen["refills_after"] = [n for n in gm.graph.nodes if n.target is torch.ops.lingc.host_refill.default]
            return matches

    cfg = model.config
    relay = RelayBuffers.allocate(STEPS, cfg.hidden_size, cfg.dtype, "cpu")
    from lingc.models import Ling3Cache
    cache = Ling3Cache.allocate(cfg, 32)
    verify = make_steps(model, STEPS)["verify"]
    orig = pass_manager.registered_passes
    pass_manager.registered_passes = lambda: [Spy]
    try:
        _, report = run_and_report(verify, relay, cache, role="verify")
    finally:
        pass_manager.registered_passes = orig
    assert stat(report, "metadata_capture").matches == 1
    assert len(seen["host"]) == 1 and seen["host"] <= seen["before"]
    assert seen["after"] == seen["before"] - seen["host"] and not seen["refills_after"]
    assert "chain positions" in stat(report, "metadata_capture").notes[0]
    if TORCH_VERSION == (2, 13):    # graph text is pinned on torch 2.13 (backend_helpers.pinned_graph_text)
        diff = [line for line in difflib.unified_diff(seen["text_before"], seen["text_after"], n=0, lineterm="")
                if not line.startswith(("+++", "---", "@@"))]
        assert_expected_inline("\n".join(diff) + "\n", """\
-%host_refill = lingc.host_refill(%arg1_1, %add, 'chain positions') i64[6]
-%convert_element_type = prims.convert_element_type(%host_refill, f32) f32[6]
+%convert_element_type = prims.convert_element_type(%add, f32) f32[6]
-%convert_element_type_1 = prims.convert_element_type(%host_refill, f32) f32[6]
+%convert_element_type_1 = prims.convert_element_type(%add, f32) f32[6]
-%index_put = aten.index_put(%select_112, [%host_refill], %cat_12) f32[32, 48]
+%index_put = aten.index_put(%select_112, [%add], %cat_12)    f32[32, 48]
-%unsqueeze_94 = aten.unsqueeze(%host_refill, 1)              i64[6, 1]
+%unsqueeze_94 = aten.unsqueeze(%add, 1)                      i64[6, 1]
-%convert_element_type_2 = prims.convert_element_type(%host_refill, f32) f32[6]
+%convert_element_type_2 = prims.convert_element_type(%add, f32) f32[6]
-%convert_element_type_3 = prims.convert_element_type(%host_refill, f32) f32[6]
+%convert_element_type_3 = prims.convert_element_type(%add, f32) f32[6]
-%index_put_1 = aten.index_put(%select_239, [%host_refill], %cat_25) f32[32, 48]
+%index_put_1 = aten.index_put(%select_239, [%add], %cat_25)  f32[32, 48]
-%unsqueeze_206 = aten.unsqueeze(%host_refill, 1)             i64[6, 1]
+%unsqueeze_206 = aten.unsqueeze(%add, 1)                     i64[6, 1]
""")


@pytest.mark.parametrize("role", ["decode", "draft"])
def test_positions_reach_their_readers_as_the_relay_n(model, role, monkeypatch):
    """pdl_glue.positions_into_readers: the relay's chain positions (n + arange(T), two ATen
    kernels at the head of every captured step graph) reach mla_kv_write and mla_decode as n
    with an offset; no iota or add is left, and the step computes what it did with the fold off."""
    from lingc.models import Ling3Cache
    from lingc.passes.pdl_swap import PdlSwap

    cfg = model.config
    results = {}
    for fold in (True, False):
        monkeypatch.setattr(PdlSwap, "fold_positions", fold)
        relay = RelayBuffers.allocate(STEPS, cfg.hidden_size, cfg.dtype, "cpu")
        relay.n.fill_(7)
        relay.x.fill_(11)
        relay.seed.fill_(13)
        relay.dh.normal_(generator=torch.Generator().manual_seed(1))
        cache = Ling3Cache.allocate(cfg, 32)
        fn = make_steps(model, STEPS)[role]
        _, report = run_and_report(fn, relay, cache, role=role)
        kernels = {op: n for _, op, n, _ in report.kernels.rows}
        results[fold] = relay, cache
        notes = " ".join(stat(report, "pdl_swap").notes)
        readers = len(cfg.mla_layers) * 2 if role == "decode" else (STEPS - 1) * 2
        if fold:
            assert "prims.iota" not in kernels and "aten.add.Tensor" not in kernels, kernels
            assert f"{readers} position readers take the relay's n" in notes, notes
        else:
            assert kernels.get("prims.iota") == 1 and kernels.get("aten.add.Tensor") == 1, kernels
            assert "position readers" not in notes
    (r1, c1), (r0, c0) = results[True], results[False]
    for a, b in zip(r1.tensors(), r0.tensors()):
        assert torch.equal(a, b)
    for a, b in zip(c1.tensors(), c0.tensors()):
        assert torch.equal(a, b)
    written = c1.kv if role == "decode" else c1.draft_kv
    # The rows at the chain's positions (n = 7 on): written, and nowhere else.
    rows = [7] if role == "decode" else list(range(7, 7 + STEPS - 1))
    assert all(t[0, rows].abs().sum(-1).gt(0).all() for t in written)
    assert all(t[0, :7].abs().sum() == 0 and t[0, rows[-1] + 1:].abs().sum() == 0 for t in written)


# -- GPU ------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def gpu_engine():
    m = tiny_model().cuda()
    return m, Engine(m, max_len=1024, steps=STEPS, progress=False)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gpu_speculative_equals_plain_256(dtype):
    m = tiny_model(torch_dtype="bfloat16" if dtype is torch.bfloat16 else "float32").cuda()
    # ATen leftovers: the Inductor path is the module engine's (gpu_engine); three engines of
    # Inductor compiles ran past the device's time limit.
    eng = Engine(m, max_len=1024, steps=STEPS, progress=False, options=OPTS)
    plain = eng.generate(PROMPT, 256, speculative=None, eos_token_id=None)
    eng.drafter = Oracle(plain, len(PROMPT), schedule=list(range(STEPS + 1)), device="cuda")
    spec = eng.generate(PROMPT, 256, eos_token_id=None)
    assert spec == plain
    eng.drafter = None
    assert eng.generate(PROMPT, 256, eos_token_id=None) == plain            # the real NEXTN draft


@pytest.mark.gpu
def test_gpu_three_graphs_no_sync_run_ahead_no_recapture(gpu_engine, monkeypatch):
    """800 tokens on the captured graphs: no host sync, no recapture, no memory growth, and the
    host launches step k + 1 while step k still runs. The tiny model's step is so short on the
    GPU that a host hiccup lets it drain (753 and 743 of about 794 launches ahead under whole
    GPU runs on an H100, sessions 48-49), so each launch is padded with a ~0.5 ms GPU sleep on
    the same stream: the count then measures the loop's order (a host that waited for step k
    before launching k + 1 would score 0), not the host's jitter. The benchmark reports the
    real model's share."""
    m, eng = gpu_engine
    eng.generate(PROMPT, 8)
    captures = eng.captures
    assert all(eng._steps[r].captured for r in ("draft", "verify", "extend")), \
        {r: s.reason for r, s in eng._steps.items()}
    torch.cuda.synchronize()
    mem = torch.cuda.memory_allocated()
    eng.check_syncs = True                  # set_sync_debug_mode("error") around the step loop
    launch = eng._launch

    def padded(roles):
        torch.cuda._sleep(1_000_000)        # about 0.5 ms of clock cycles at H100/H200 clocks
        launch(roles)

    monkeypatch.setattr(eng, "_launch", padded)
    try:
        out = eng.generate(PROMPT, 800, eos_token_id=None)
    finally:
        eng.check_syncs = False
    assert len(out) == 800
    assert eng.captures == captures                                     # never recaptured
    assert torch.cuda.memory_allocated() <= mem + (1 << 20)
    assert eng.stats.ahead >= 0.95 * (eng.stats.steps - 1)
    infos = {i.role: i for i in eng.graph_infos()}
    assert set(infos) >= {"draft", "verify", "extend"}
    assert all(i.kernel_nodes > 0 for i in infos.values())


def test_relay_graphs_use_the_same_kernels_as_plain_decode(model):
    """Greedy spec == plain rests on verify and decode running the same kernels: a core matched
    in one role but not the other changes rounding (found at 42 bf16 layers: MLA positions are
    computed from relay.n in the relay's graphs, and pdl_swap first matched only input positions)."""
    cfg = model.config
    from lingc.models import Ling3Cache
    counts = {}
    for role in ("decode", "verify", "draft"):
        relay = RelayBuffers.allocate(STEPS, cfg.hidden_size, cfg.dtype, "cpu")
        fn = make_steps(model, STEPS)[role]
        _, report = run_and_report(fn, relay, Ling3Cache.allocate(cfg, 32), role=role)
        counts[role] = {op: n for _, op, n, _ in report.kernels.rows}
        # verify's final norm writes relay.vhid itself: rmsnorm's kernel with out= (the same bits)
        counts[role]["lingc.rmsnorm"] = counts[role].get("lingc.rmsnorm", 0) + counts[role].pop("lingc.rmsnorm_out", 0)
    assert counts["verify"]["lingc.rmsnorm"] > 0
    for op in ("lingc.mla_decode", "lingc.mla_kv_write", "lingc.kda_chain", "lingc.rmsnorm",
               "lingc.moe_experts"):
        assert counts["decode"].get(op) == counts["verify"].get(op), op
    assert counts["verify"]["lingc.mla_decode"] == len(cfg.mla_layers)
    # The draft's unrolled forwards write its cache one after another, each in place.
    assert counts["draft"]["lingc.mla_kv_write"] == counts["draft"]["lingc.mla_decode"] == STEPS - 1
    assert "aten.index_put" not in counts["draft"] and "aten.select_scatter" not in counts["draft"]
    # The only write left besides the cache's is the chain (one lingc.concat_into).
    assert "aten.copy_" not in counts["draft"] and counts["draft"]["lingc.concat_into"] == 1


def test_resume_continues_from_the_state_whatever_ran_before(engine, gold):
    """Engine.resume (benchmarks continue from a given state with it) reads each step's tokens
    from the right ring slot after anything else has run the step graphs: a finished request
    with its run-ahead step, direct replays of a graph. Plain and speculative resumes from the
    same state give the eager greedy continuation."""
    engine.prepare()                               # a first capture resets the cache: before the snapshot
    engine.generate(PROMPT, 4, speculative=None, eos_token_id=None)
    snap = engine.cache.clone()
    rsnap = [t.clone() for t in engine.relay.tensors()]

    def restore():
        engine.cache.copy_(snap)
        for t, s in zip(engine.relay.tensors(), rsnap):
            t.copy_(s)

    j = int(engine.relay.n) - len(PROMPT)          # x is gold[j]: the next token is gold[j + 1]
    a = list(engine.resume(6, None))
    restore()
    for _ in range(3):                             # moves the in-graph ring counter by 3
        engine._steps["decode"]()
    restore()
    b = list(engine.resume(6, None))
    restore()
    c = list(engine.resume(6, "nextn"))
    assert a == gold[j + 1:j + 7]
    assert b == a and c == a


def test_resume_before_the_graphs_exist_says_so(model):
    eng = Engine(model, max_len=64, steps=STEPS, options=OPTS, progress=False)
    with pytest.raises(ValueError, match=r"engine.prepare\(\('decode',\)\)"):
        next(eng.resume(2, None))
