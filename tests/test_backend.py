"""The lingc backend: registration, options, capture contract, pass manager, verify, dumps,
recompiles, explain."""

import json
import subprocess
import sys
import warnings
from importlib.metadata import entry_points

import pytest
import torch
from expecttest import assert_expected_inline

from backend_helpers import compile_lingc, compiled_and_eager_greedy, run_and_report, stat
from lingc.backend import compile_reports
from lingc.dump import format_summary
from lingc.models import Ling3Cache, build_model, preset
from lingc.options import LingcOptions
from lingc.pass_manager import LingcPass, PassContext, PassManager, mutated_placeholders


@pytest.fixture(scope="module")
def tiny():
    torch.manual_seed(0)
    return build_model(preset("tiny"), progress=False)


def _decode_args(model, T=1, start=9, seed=0):
    g = torch.Generator().manual_seed(seed)
    cache = Ling3Cache.allocate(model.config, 32)
    for t in cache.tensors():                       # a mid-sequence cache, not zeros
        t.normal_(0, 0.5, generator=g)
    ids = torch.randint(0, model.config.vocab_size, (T,), generator=g)
    return ids, torch.arange(start, start + T), cache


def test_entry_point_registered():
    names = {ep.name: ep.value for ep in entry_points(group="torch_dynamo_backends")}
    assert names.get("lingc") == "lingc.backend:lingc_backend"


def test_backend_by_name_without_importing_lingc():
    code = ("import sys, torch\n"
            "f = torch.compile(lambda x: torch.relu(x) * 2, backend='lingc', options={'inductor': False})\n"
            "x = torch.randn(5)\n"
            "assert torch.equal(f(x), torch.relu(x) * 2)\n"
            "from lingc.backend import compile_reports\n"
            "assert len(compile_reports) == 1\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]


@pytest.mark.parametrize("options, needle", [
    ({"bogus": 1}, "valid options are"),
    ({"role": "train"}, "expected one of"),
    ({"inductor": "yes"}, "must be a bool"),
    ({"rebound_states_in_place": 1}, "rebound_states_in_place=1 must be a bool"),
    ({"disable_passes": ["nope"]}, "unknown pass"),
    ({"capture": "export"}, r"capture='export'; expected one of \['aot', 'functionalize'\]"),
])
def test_bad_options_raise(options, needle):
    f = torch.compile(lambda x: x + 1, backend="lingc", options=options)
    with pytest.raises(Exception, match=needle):
        f(torch.randn(3))


def test_options_from_env(monkeypatch, tmp_path):
    monkeypatch.setenv("LINGC_DUMP_DIR", str(tmp_path))
    monkeypatch.setenv("LINGC_DISABLE_PASSES", "swiglu_epilogue")
    monkeypatch.setenv("LINGC_VERIFY", "1")
    assert LingcOptions.from_user({}).capture == "functionalize"
    monkeypatch.setenv("LINGC_CAPTURE", "aot")
    o = LingcOptions.from_user({"role": "decode"})
    assert (o.dump_dir, o.disable_passes, o.verify, o.role, o.capture) == \
        (str(tmp_path), ["swiglu_epilogue"], True, "decode", "aot")


@pytest.mark.parametrize("T", [1, 6])
def test_compiled_tiny_equals_eager(tiny, T):
    ids, pos, cache = _decode_args(tiny, T)
    ref_cache = cache.clone()
    with torch.no_grad():
        ref_logits, ref_hidden = tiny(ids, pos, ref_cache)
    (logits, hidden), report = run_and_report(tiny, ids, pos, cache, role="decode")
    torch.testing.assert_close(logits, ref_logits, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(hidden, ref_hidden, rtol=1e-4, atol=1e-4)
    assert torch.equal(logits.argmax(-1), ref_logits.argmax(-1))
    for a, b in zip(cache.tensors(), ref_cache.tensors()):    # the live cache was written in place
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
    assert stat(report, "swiglu_epilogue").matches > 0


def test_float16_model_runs_on_lingc_kernels():
    """A float16 model: every computation (projections, SwiGLU, norms, router, KDA, experts, the
    MLA cache write and attention) goes to lingc kernels, and the graph equals eager to float16
    rounding."""
    torch.manual_seed(0)
    model = build_model(preset("tiny"), dtype=torch.float16, progress=False)
    ids, pos, cache = _decode_args(model, 6)
    for t in cache.tensors():
        t.copy_(t.clamp(-2, 2))
    ref_cache = cache.clone()
    with torch.no_grad():
        ref, _ = model(ids, pos, ref_cache)
    (logits, _), report = run_and_report(model, ids, pos, cache, role="decode")
    torch.testing.assert_close(logits.float(), ref.float(), rtol=2e-2, atol=2e-2)
    ops = {op: n for cat, op, n, _ in report.kernels.rows if cat == "lingc"}
    assert ops["lingc.mla_decode"] == ops["lingc.mla_kv_write"] == len(model.config.mla_layers), ops
    assert ops["lingc.kda_chain"] == 4 and ops["lingc.moe_experts"] == 5 and ops["lingc.rmsnorm_router"] == 5, ops
    assert ops["lingc.gemm"] > 0 and ops["lingc.swiglu_gemm_separate"] == 1, ops
    notes = " ".join(" ".join(s.notes) for s in report.stats)
    assert "dtype" not in notes, notes


def test_each_pass_off_equals_eager(tiny):
    from lingc.pass_manager import pass_names
    for name in pass_names() + ["all"]:
        ids, pos, cache = _decode_args(tiny, 1)
        with torch.no_grad():
            ref, _ = tiny(ids, pos, cache.clone())
        (logits, _), report = run_and_report(tiny, ids, pos, cache, disable_passes=[name])
        torch.testing.assert_close(logits, ref, rtol=1e-4, atol=1e-4)
        skipped = {s.name for s in report.stats if s.skipped}
        assert name in skipped or (name == "all" and set(pass_names()) <= skipped)


def test_greedy_tokens_identical_over_steps(tiny):
    out, want = compiled_and_eager_greedy(tiny, seed=3)
    assert out == want


def test_capture_keeps_cache_mutations_in_graph(tiny):
    ids, pos, cache = _decode_args(tiny, 1)
    with torch.no_grad():
        gm = _aot_graph(tiny, ids, pos, cache)
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    mutated = mutated_placeholders(gm)
    # every KDA state, conv window and MLA cache the step writes is mutated in the graph
    # (the draft's cache is not touched by the target forward)
    assert len(mutated) == len(cache.state) + len(cache.conv) + len(cache.kv)
    assert len(placeholders) >= len(cache.tensors())
    copies = [n for n in gm.graph.nodes if n.target == torch.ops.aten.copy_.default]
    assert len(copies) == len(mutated)


class _Perturb(LingcPass):
    """A deliberately wrong pass: adds 1 to the first output."""
    name = "perturb"

    def apply(self, gm):
        out = next(n for n in gm.graph.nodes if n.op == "output")
        first = out.args[0][0]
        with gm.graph.inserting_before(out):
            bad = gm.graph.call_function(torch.ops.aten.add.Tensor, (first, 1.0))
        out.args = ((bad,) + tuple(out.args[0][1:]),)
        return 1


def _aot_graph(fn, *args):
    got = {}

    def fw(gm, ex):
        got["gm"] = gm
        from functorch.compile import make_boxed_func
        return make_boxed_func(gm.forward)
    from lingc import compat
    torch._dynamo.reset()
    torch.compile(fn, backend=lambda g, e: compat.aot_inference_backend(fw, compat.decomposition_table())(g, e))(*args)
    return got["gm"]


def test_verify_mode_catches_a_wrong_pass_and_spares_live_inputs():
    state = torch.randn(4)
    x = torch.randn(4)

    def fn(x, state):
        state.add_(x)
        return state * 2

    gm = _aot_graph(fn, x, state.clone())
    live = state.clone()
    ctx = PassContext(LingcOptions(verify=True), [x, live])
    with pytest.raises(AssertionError, match="perturb changed the graph's results"):
        PassManager(ctx, [_Perturb]).run(gm)
    assert torch.equal(live, state), "verify must run on clones, never on the live state"


def test_verify_mode_reports_errors(tiny):
    ids, pos, cache = _decode_args(tiny, 1)
    _, report = run_and_report(tiny, ids, pos, cache, verify=True)
    s = stat(report, "swiglu_epilogue")
    assert s.max_abs_err is not None and s.max_rel_err < 1e-4


@pytest.mark.parametrize("T, role", [(1, "decode"), (3, "verify")])
def test_functionalize_capture_gives_aots_graph(tiny, T, role, tmp_path):
    # options capture="functionalize" (one functionalised trace) against AOTAutograd's: the same
    # ops before and after the passes, the same matches, and the same bits in the outputs and in
    # the cache the step writes.
    from collections import Counter
    ids, pos, cache = _decode_args(tiny, T)
    runs = {}
    for capture in ("aot", "functionalize"):
        c = cache.clone()
        out, report = run_and_report(tiny, ids, pos, c, role=role, capture=capture, dump_dir=str(tmp_path / capture))
        d = tmp_path / capture / report.dump_dir.split("/")[-1]
        ops = [Counter(line.split(" = ")[1].split("(")[0] for line in (d / f).read_text().splitlines()
                       if " = " in line) for f in ("00-captured.txt", "99-final.txt")]
        runs[capture] = (out, c, ops, [(s.name, s.matches, s.ops_before, s.ops_after) for s in report.stats])
    (out_a, c_a, ops_a, st_a), (out_f, c_f, ops_f, st_f) = runs["aot"], runs["functionalize"]
    assert ops_a == ops_f and st_a == st_f
    assert all(torch.equal(a, b) for a, b in zip(out_a, out_f))
    assert all(torch.equal(a, b) for a, b in zip(c_a.tensors(), c_f.tensors()))
    assert any(not torch.equal(a, b) for a, b in zip(c_a.tensors(), cache.tensors()))    # it wrote


def test_functionalize_capture_makes_decompositions_in_place_ops_functional(tmp_path):
    """F.rms_norm's decomposition writes mean(x^2).add_(eps) in place under the functionalised
    trace; the capture gives the functional add, as AOTAutograd's trace does, so the norm pass
    sees the same graph either way."""
    import torch.nn.functional as F

    def fn(a, w):
        return F.rms_norm(a, (8,), w, 1e-6)

    texts = {}
    for capture in ("aot", "functionalize"):
        d = tmp_path / capture
        compile_lingc(fn, capture=capture, dump_dir=str(d))(torch.randn(3, 8), torch.randn(8))
        text = next(d.glob("*/00-captured.txt")).read_text()
        texts[capture] = [line.split(" = ")[1].split("(")[0] for line in text.splitlines() if " = " in line]
    assert texts["aot"] == texts["functionalize"] and "aten.add.Scalar" in texts["aot"]


def _graph_with_in_place(kind: str) -> torch.fx.Graph:
    aten = torch.ops.aten
    g = torch.fx.Graph()
    x = g.placeholder("x")
    e = g.call_function(aten.exp.default, (x,))
    base = g.call_function(aten.view.default, (e, [4])) if kind == "view" else e
    target = base if kind != "input" else x
    a = g.call_function(aten.add_.Scalar, (target, 1.0))
    outs = [g.call_function(aten.mul.Tensor, (a, 2.0))]
    if kind == "read after":
        outs.append(g.call_function(aten.neg.default, (base,)))
    g.output(outs)
    return g


@pytest.mark.parametrize("kind, functional", [("intermediate", True), ("read after", False), ("view", False),
                                              ("input", False)])
def test_functional_intermediates_only_where_nothing_sees_the_write(kind, functional):
    from lingc.compat import _functional_intermediates
    g = _graph_with_in_place(kind)
    x = torch.randn(4)
    before = torch.fx.GraphModule(torch.nn.Module(), g)(x.clone())
    assert _functional_intermediates(g) == int(functional)
    targets = {n.target for n in g.nodes if n.op == "call_function"}
    assert (torch.ops.aten.add.Scalar in targets) == functional
    after = torch.fx.GraphModule(torch.nn.Module(), g)(x.clone())
    assert all(torch.equal(a, b) for a, b in zip(before, after))


def test_functionalize_capture_leaves_aliased_mutated_inputs_to_aot(monkeypatch):
    # b is a view of a: functionalisation would treat them as two tensors and read b stale after
    # the write to a; the capture hands such graphs to AOTAutograd (and only those).
    from lingc import compat

    def fn(a, b):
        a.add_(1.0)
        return b * 2.0

    seen = []
    real = compat.aot_inference_backend
    monkeypatch.setattr(compat, "aot_inference_backend", lambda *a: seen.append(1) or real(*a))
    base = torch.randn(8)
    a = base.clone()
    got = compile_lingc(fn, capture="functionalize")(a, a[2:6])
    assert seen == [1] and torch.equal(got, (base + 1.0)[2:6] * 2.0) and torch.equal(a, base + 1.0)
    a = base.clone()
    got = compile_lingc(fn, capture="functionalize")(a, base.clone()[2:6])
    assert seen == [1] and torch.equal(got, base[2:6] * 2.0) and torch.equal(a, base + 1.0)


def test_dumps(tiny, tmp_path):
    ids, pos, cache = _decode_args(tiny, 1)
    _, report = run_and_report(tiny, ids, pos, cache, role="decode", dump_dir=str(tmp_path))
    d = tmp_path / report.dump_dir.split("/")[-1]
    names = sorted(p.name for p in d.iterdir())
    from lingc.pass_manager import pass_names
    ran = [f"{i:02d}-{s.name}.{w}.txt" for i, s in enumerate(report.stats[:-1], start=1) if not s.skipped
           for w in ("after", "before")]                  # numbered in pass order; skipped passes leave none
    assert names == ["00-captured.txt"] + ran + ["99-final.txt", "summary.json", "summary.txt"]
    summary = json.loads((d / "summary.json").read_text())
    assert summary["role"] == "decode"
    assert [p["name"] for p in summary["passes"]] == pass_names() + ["cleanup"]
    swiglu_rows = [r for r in summary["kernels"]["rows"] if r["op"] == "lingc.swiglu_gemm_separate"]
    assert swiglu_rows[0]["count"] == stat(report, "swiglu_epilogue").matches
    assert "lingc.swiglu_gemm_separate" in (d / "99-final.txt").read_text()
    assert "lingc.swiglu_gemm_separate" not in (d / "00-captured.txt").read_text()


def test_recompile_warns_once_per_cause_and_can_fail():
    def fn(x, n):
        return x * n

    f = compile_lingc(fn)
    x = torch.randn(4)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        f(x, 2)
        f(x, 3)                     # a new Python int: same input shapes, recompiled
    msgs = [str(m.message) for m in w if "recompiled" in str(m.message)]
    assert len(msgs) == 1 and "n == 2" in msgs[0].replace("L['n']", "n"), msgs
    f = compile_lingc(fn, fail_on_recompile=True)
    f(x, 2)
    with pytest.raises(Exception, match="recompiled"):
        f(x, 5)
    f(torch.randn(6), 5)            # a new shape is a new graph, not a recompile


def test_recompile_on_a_tensors_value_says_to_keep_it_a_tensor():
    """Indexing with a 0-d tensor makes Dynamo specialise on its value (.item()): the warning
    says how to keep it a tensor, not to pass device tensors (it already is one)."""
    buf = torch.zeros(8, 4)

    def fn(x, n):
        buf[n] = x
        return buf.sum(0)

    f = compile_lingc(fn)
    with warnings.catch_warnings(record=True) as w, torch.no_grad():
        warnings.simplefilter("always")
        for i in range(3):
            f(torch.randn(4), torch.tensor(i))
    msgs = [str(m.message) for m in w if "recompiled" in str(m.message)]
    assert msgs and all("keep it a tensor" in m and "index_select" in m for m in msgs), msgs


def test_second_torch_compile_with_other_options_is_not_a_recompile():
    """Each engine calls torch.compile with its own options: its first compile of a function an
    earlier call compiled is a new graph (Dynamo: BACKEND_MATCH), not a recompile, even under
    fail_on_recompile. Calls with equal options share graphs, so a changed int under the second
    one is a recompile whose reason names the int, not the other call's backend."""
    def fn(x, n):
        return torch.sin(x) * n

    torch._dynamo.reset()
    x = torch.randn(4)

    def call(f, *args):
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            f(*args)
        return [str(m.message) for m in w if "recompiled" in str(m.message)]

    opts = {"inductor": False}
    first = torch.compile(fn, backend="lingc", dynamic=False, options=dict(opts))
    assert call(first, x, 2) == []
    strict = torch.compile(fn, backend="lingc", dynamic=False, options={**opts, "fail_on_recompile": True})
    assert call(strict, x, 2) == []                 # compiles: the first call's graph is another backend's
    same = torch.compile(fn, backend="lingc", dynamic=False, options=dict(opts))
    n = len(compile_reports)
    assert call(same, x, 2) == [] and len(compile_reports) == n    # equal options: the first graph reused
    msgs = call(same, x, 3)
    assert len(msgs) == 1 and "n == 2" in msgs[0].replace("L['n']", "n") and "BACKEND_MATCH" not in msgs[0], msgs
    with pytest.raises(Exception, match="recompiled"):
        strict(x, 4)


def test_graphs_run_sees_reused_graphs_and_nests():
    """graphs_run() collects the reports of the lingc graphs that ran in it: a graph Dynamo reuses
    under a second torch.compile with equal options (no compile, so nothing new in
    compile_reports) brings its report; an outer window sees the inner one's; Python that runs
    no lingc graph adds nothing."""
    from lingc.backend import graphs_run

    def fn(x):
        return torch.cos(x) + 1

    torch._dynamo.reset()
    x = torch.randn(4)
    first = torch.compile(fn, backend="lingc", dynamic=False, options={"inductor": False})
    with graphs_run() as ran:
        first(x)
    assert len(ran) == 1 and ran[0] is compile_reports[-1]
    n = len(compile_reports)
    second = torch.compile(fn, backend="lingc", dynamic=False, options={"inductor": False})
    with graphs_run() as outer:
        with graphs_run() as inner:
            torch.testing.assert_close(second(x), fn(x))
        fn(x)                                          # eager: no lingc graph
    assert len(compile_reports) == n, "equal options compiled again"
    assert inner == ran and outer == ran
    first(x)                                           # outside any window: nothing collected
    assert outer == ran


def test_new_shape_is_not_a_recompile(tiny):
    step = compile_lingc(tiny, role="decode", fail_on_recompile=True)
    for T in (1, 6):
        for s in range(2):
            ids, pos, cache = _decode_args(tiny, T, start=9 + s)
            with torch.no_grad():
                step(ids, pos, cache)


def test_summary_format_is_stable():
    from lingc.pass_manager import PassStats
    text = format_summary([PassStats("swiglu_epilogue", 3, 100, 94, 1.25),
                           PassStats("fused_moe", skipped="disabled")], "decode")
    assert_expected_inline(text, """\
lingc pass summary (role decode)
pass                 matches   ops before -> after   time ms  note
swiglu_epilogue            3             100 -> 94       1.2
fused_moe                  -                     -         -  skipped: disabled
""")


def test_explain_cli(capsys):
    from lingc.cli import main
    assert main(["explain", "--preset", "tiny", "--t", "6", "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "lingc pass summary (role verify)" in out and "lingc.swiglu_gemm_separate" in out


def test_explain_cli_relay_step(capsys):
    # A relay step graph as the engine compiles it: the extend step's bookkeeping tail is one
    # lingc.relay_advance, and the report names the role.
    from lingc.cli import main
    assert main(["explain", "--role", "extend", "--steps", "3", "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "relay step 'extend', 3 drafts" in out and "lingc pass summary (role extend)" in out
    assert "lingc.relay_advance" in out


def test_inductor_path_decode_role(tiny, monkeypatch):
    """The one decode-role test through Inductor (slow on the CPU: C++ codegen). The embedding
    gather stays an ATen op, Inductor's leftover (folded, the graph has none)."""
    from lingc.passes.pdl_swap import PdlSwap

    monkeypatch.setattr(PdlSwap, "fold_embedding", False)
    ids, pos, cache = _decode_args(tiny, 1)
    with torch.no_grad():
        ref, _ = tiny(ids, pos, cache.clone())
    (logits, _), report = run_and_report(tiny, ids, pos, cache, role="decode", inductor=True)
    torch.testing.assert_close(logits, ref, rtol=1e-4, atol=1e-4)
    assert report.kernels.inductor_kernels, "Inductor's generated kernels are listed by name"
    assert report.kernels.counts()["lingc"] >= stat(report, "swiglu_epilogue").matches


def test_torch_logs_lingc_prints_the_summary():
    code = ("import torch\n"
            "f = torch.compile(lambda x: torch.relu(x) + 1, backend='lingc', options={'inductor': False})\n"
            "f(torch.randn(4))\n")
    import os
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                       env={**os.environ, "TORCH_LOGS": "lingc"})
    assert r.returncode == 0, r.stderr[-2000:]
    assert "lingc pass summary (role forward)" in r.stderr and "kernel table" in r.stderr


def test_inductor_path_forward_role(tiny, monkeypatch):
    """The plain user path: torch.compile(model, backend="lingc") with default options (role
    forward, Inductor on) over a T=6 step. The embedding gather is kept an ATen op, so that
    Inductor has a leftover to compile (with it folded, lingc kernels are all the graph runs)."""
    from lingc.passes.pdl_swap import PdlSwap

    monkeypatch.setattr(PdlSwap, "fold_embedding", False)
    ids, pos, cache = _decode_args(tiny, 6)
    with torch.no_grad():
        ref, _ = tiny(ids, pos, cache.clone())
    n = len(compile_reports)
    torch._dynamo.reset()
    step = torch.compile(tiny, backend="lingc", fullgraph=True, dynamic=False)
    with torch.no_grad():
        logits, _ = step(ids, pos, cache)
    report = compile_reports[n]
    assert report.role == "forward" and report.kernels.inductor_kernels
    torch.testing.assert_close(logits, ref, rtol=1e-4, atol=1e-4)


def test_inductor_lowering_messages_never_print_the_ir():
    """Inductor's lowering messages str() their IR arguments, recursing through every producer
    (minutes on the relay's draft graph): inside lingc's Inductor call they say type, size and
    dtype, and Inductor's own formatter is back afterwards."""
    from torch._inductor.exc import MissingOperatorWithoutDecomp, OperatorIssue

    from lingc import compat

    class DeepIR:
        def get_size(self):
            return [6, 2560]

        def get_dtype(self):
            return torch.bfloat16

        def __str__(self):
            raise AssertionError("the IR was printed")

    before = OperatorIssue.__dict__["operator_str"]
    with compat.short_lowering_messages():
        msg = str(MissingOperatorWithoutDecomp("lingc.op", [DeepIR(), 3, [DeepIR()]], {"out": DeepIR()}))
    assert "args[0]: DeepIR(size=[6, 2560], dtype=torch.bfloat16)" in msg and "args[1]: 3" in msg
    assert "kwargs: {out: DeepIR(size=[6, 2560], dtype=torch.bfloat16)}" in msg
    assert OperatorIssue.__dict__["operator_str"] is before
    with pytest.raises(AssertionError, match="the IR was printed"):
        MissingOperatorWithoutDecomp("lingc.op", [DeepIR()], {})


def test_notes_name_inputs_as_the_user_did():
    """Dynamo's placeholder names become the attribute paths they read, and a pass's note names a
    graph input by both its graph name and that path (no path without the one-to-one map)."""
    from lingc.pass_manager import source_name
    assert source_name("l_self_modules_model_modules_layers_modules_0_parameters_a_log_") == "model.layers.0.a_log"
    assert source_name("l_self_modules_norm_buffers_inv_freq_") == "norm.inv_freq"
    assert source_name("l_cache_conv_0_") == "cache_conv_0"
    g = torch.fx.Graph()
    a, b = g.placeholder("arg0_1"), g.placeholder("arg1_1")
    g.output(g.call_function(torch.add, (a, b)))
    named = PassContext(LingcOptions(), [None, None], ["cache_conv_0", "r_pos_chain"])
    assert [named.describe(a), named.describe(b)] == ["arg0_1 (cache_conv_0)", "arg1_1 (r_pos_chain)"]
    assert PassContext(LingcOptions()).describe(b) == "arg1_1"
    other = torch.fx.Graph()
    c = other.placeholder("arg0_1")
    assert named.describe(c) == "arg0_1", "a graph of another input count takes no names"
