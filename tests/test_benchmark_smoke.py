"""CPU smoke runs of the benchmark entry points, as a user would start them: benchmarks.decode
(eager, the eager relay, lingc plain and the lingc relay at two depths, with --profile), the
kernel runner benchmarks.kernels and benchmarks.foreign_decode (a model lingc did not write, on
lingc.DecodeRunner). They check the outputs' shape and the relay's sanity check, not
the times (wall clock of a tiny model on 2 cores). CUDA is hidden so they stay CPU tests."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]


def run(args, tmp_path, timeout):
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", PYTHONUNBUFFERED="1", LINGC_PROGRESS="0")
    try:
        r = subprocess.run([sys.executable, "-m", *args, "--out", str(tmp_path)], cwd=REPO, env=env,
                           capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"smoke run took over {timeout} s:\n{e.stdout}\n{e.stderr}")
    assert r.returncode == 0, f"rc {r.returncode}\nstdout:\n{r.stdout[-4000:]}\nstderr:\n{r.stderr[-4000:]}"
    return r.stdout


def test_decode_fails_when_the_relay_changes_the_output(tmp_path, monkeypatch, capsys):
    """The relay's correctness check is a gate: a run whose speculative tokens differ from plain
    decode's says so before its table and exits 1, its JSON still written (here the check is made
    to fail; session 68's benchmark printed the mismatch and exited 0)."""
    from benchmarks import decode
    monkeypatch.setenv("LINGC_PROGRESS", "0")
    monkeypatch.setattr(decode, "spec_equals_plain", lambda results: {"lingc-nextn": False})
    rc = decode.main(["--smoke", "--modes", "lingc", "--tokens", "3", "--out", str(tmp_path)])
    out, err = capsys.readouterr()
    assert rc == 1
    assert out.index("WRONG OUTPUT: the greedy tokens of lingc-nextn differ") < out.index("| mode |")
    assert "decode: FAILED: lingc-nextn changed the greedy output" in err
    assert json.loads((tmp_path / "decode.json").read_text())["spec_equals_plain"] == {"lingc-nextn": False}


def test_decode_smoke_with_depth_sweep_and_profile(tmp_path):
    out = run(["benchmarks.decode", "--smoke", "--modes", "eager,lingc,lingc-nextn", "--steps", "2", "3",
               "--tokens", "6", "--profile"], tmp_path, timeout=240)
    assert "CPU SMOKE RUN" in out and "| mode | step ms | wall/step ms |" in out
    data = json.loads((tmp_path / "decode.json").read_text())
    assert data["preset"] == "tiny" and data["env"]["gpu"] == "none (CPU)"
    assert set(data["results"]) == {"eager", "lingc", "lingc-nextn s=2", "lingc-nextn s=3"}
    for name in ("lingc-nextn s=2", "lingc-nextn s=3"):
        r = data["results"][name]
        assert "error" not in r, r
        assert r["steps"] == int(name[-1]) and set(r["per_graph_ms"]) == {"draft", "verify", "extend"}
        assert r["tpot_ms"] > 0 and r["x_floor"] > 0 and r["tpot_projected_ms"] > 0
        # The timed loop's steadiness: the median gap between two steps' rows beside the mean,
        # the loop's garbage collections and the heap frozen after prepare (host_gc.py).
        assert r["wall_median_ms"] > 0 and isinstance(r["gc_in_timed_loop"], list)
        assert r["heap_settled"]["frozen"] > 0
    # A deeper relay reads more: its floor is higher.
    assert data["floor_ms"]["relay s=3"] > data["floor_ms"]["relay s=2"] > data["floor_ms"]["plain"]
    assert data["spec_equals_plain"] == {"lingc-nextn s=2": True, "lingc-nextn s=3": True}
    # The eager step's ops are counted (method.md's sanity figures); the tiny preset is not one
    # method.md measured, so nothing is compared.
    assert data["results"]["eager"]["aten_ops"] > data["results"]["eager"]["kernel_ops"] > 100
    assert data["against_method_md"] == [] and "against method.md" not in out
    # eager's row says how many times faster lingc plain was in the same run.
    eager, lingc = data["results"]["eager"], data["results"]["lingc"]
    assert eager["lingc_faster_by"] == pytest.approx(eager["wall_ms"] / lingc["wall_ms"])
    assert "lingc_faster_by" not in lingc and "| lingc faster by |" in out
    assert "greedy output of lingc-nextn s=3 == lingc plain over the same steps: yes" in out
    assert "ms (median gap between rows)" in out and "heap frozen after prepare:" in out
    for role in ("draft", "verify", "extend"):
        trace = json.loads((tmp_path / f"trace_lingc-nextn_s3_{role}.json").read_text())
        assert any("lingc::" in ev.get("name", "") for ev in trace["traceEvents"]), role
    assert (tmp_path / "trace_lingc_decode.json").exists()
    assert data["results"]["lingc"]["kernel_profile"]["decode"][0]["us_per_step"] > 0
    # Per-layer floors for benchmarks.layer_chains: every target layer, the draft layer steps - 1
    # times in the draft graph, once in extend.
    assert len(data["results"]["lingc"]["layer_floor_us"]["decode"]) == 6
    floors = data["results"]["lingc-nextn s=3"]["layer_floor_us"]
    assert {g: len(f) for g, f in floors.items()} == {"verify": 6, "draft": 2, "extend": 1}
    assert floors["draft"][0][0] == "draft (NEXTN) layer" and all(us > 0 for _, us in floors["verify"])


@pytest.mark.parametrize("argv, message", [
    (["--steps", "3", "9"], r"--steps \[3, 9\]: every depth must be in 1..7 \(draft tokens = steps \+ 1 <= 8\)"),
    (["--modes", "lingc,lingcx"], r"unknown mode\(s\) \['lingcx'\]; valid: \['eager', "),
    (["--context", "4000"], r"--context 4000 with --tokens 8 and --steps 5 needs 4160 cache rows, more than the "
                            r"model's max_position_embeddings 4096: use at most --context 3936"),
    (["--tokens", "4000"], r"needs 24176 cache rows, .*: use at most --tokens 653"),
])
def test_decode_refuses_bad_arguments_before_any_work(tmp_path, argv, message):
    # Refused at parse time: a GPU run must not spend minutes of Inductor compiles first.
    from benchmarks.decode import main
    with pytest.raises(SystemExit, match=message):
        main(["--smoke", "--out", str(tmp_path), *argv])
    assert not any(tmp_path.iterdir())


def test_kernels_runner_smoke(tmp_path):
    out = run(["benchmarks.kernels", "--smoke"], tmp_path, timeout=180)
    summary = {n: s for n, s in json.loads((tmp_path / "kernels_summary.json").read_text()).items()
               if n != "environment"}
    assert summary["moe"]["status"] == summary["qwen3_moe"]["status"] == "ok"
    assert {n for n, s in summary.items() if s["status"] == "GPU only: no CPU smoke mode"} == \
        {"swiglu", "gemm", "kda", "gdn", "attn", "sampling"}
    moe = json.loads((tmp_path / "kernels_moe_tiny.json").read_text())
    assert moe["all_correct"] and {r["variant"] for r in moe["rows"]} >= {"lingc", "eager"}
    qwen3 = json.loads((tmp_path / "kernels_qwen3_moe.json").read_text())
    assert qwen3["all_correct"] and {(r["T"], r["variant"]) for r in qwen3["rows"]} == \
        {(t, v) for t in (1, 6) for v in ("lingc", "eager")}
    assert "| T | variant | us/layer |" in out
    try:
        import matplotlib  # noqa: F401
    except ImportError:     # CI: the runner says how to draw it elsewhere
        assert "python -m benchmarks.plot_kernels" in out
    else:
        assert (tmp_path / "kernels.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def _kernel_jsons():
    """One row set of each kernel benchmark's JSON, as they write them (values made up)."""
    return {
        "kernels_swiglu": [dict(shape="dense-mlp", M=1, variant=v, us=us, copy_fraction=f)
                           for v, us, f in (("lingc", 6.5, 0.57), ("lingc-no-pdl", 9.0, 0.4), ("eager", 21.0, 0.18),
                                            ("fused-linear", 11.0, 0.34))],
        "kernels_gemm": [dict(kind=k, shape=s, M=1, variant=v, us=us, copy_fraction=0.5)
                         for k, s, v, us in (("fused", "KDA fused", "lingc", 10.0), ("fused", "KDA fused", "cublas", 78.0),
                                             ("fused", "KDA fused", "lingc-no-pdl", 12.0),
                                             ("single", "KDA b", "lingc", 2.4),
                                             ("single", "lm_head argmax", "lingc-argmax", 52.0),
                                             ("single", "lm_head argmax", "cublas+argmax", 64.0))],
        "kernels_kda": [dict(T=t, mode=m, variant=v, us=us)
                        for t, m, v, us in ((1, "persistent", "lingc", 3.2), (1, "persistent", "lingc-bv8", 3.3),
                                            (6, "staged", "lingc", 8.8), (6, "persistent", "lingc", 7.9),
                                            (6, "persistent", "inductor", 57.9), (6, "commit", "commit", 2.1),
                                            (6, "recurrence-only", "fla", 11.4))],
        "kernels_gdn": [dict(T=t, mode=m, variant=v, us=us)
                        for t, m, v, us in ((1, "persistent", "lingc", 3.4), (1, "persistent", "lingc-w3", 3.4),
                                            (6, "staged", "lingc", 8.0), (6, "persistent", "eager", 90.0))],
        "kernels_moe": [dict(T=6, variant=v, us=us, floor_us=30.4)
                        for v, us in (("lingc", 53.0), ("inductor-max-autotune", 134.0))],
        "kernels_attn": [dict(kernel="mla_decode", shape="L=8192", T=1, variant=v, us=us, floor_us=2.2)
                         for v, us in (("lingc", 14.2), ("lingc-split64", 15.0), ("inductor", 49.8))],
    }


def test_plot_kernels_keeps_lingc_and_the_baselines_with_their_floors():
    from benchmarks.plot_kernels import Bar, bars

    got = {k: bars({"benchmark": k, "rows": rows}) for k, rows in _kernel_jsons().items()}
    assert got["kernels_swiglu"] == [Bar("dense-mlp, M=1", "lingc", 6.5, pytest.approx(6.5 * 0.57)),
                                     Bar("dense-mlp, M=1", "eager", 21.0, pytest.approx(21.0 * 0.18)),
                                     Bar("dense-mlp, M=1", "fused-linear", 11.0, pytest.approx(11.0 * 0.34))]
    # The GEMM panel: fused projections and the lm_head only; lingc's argmax kernel is "lingc".
    assert [(b.group, b.variant) for b in got["kernels_gemm"]] == [
        ("KDA fused, M=1", "lingc"), ("KDA fused, M=1", "cublas"), ("lm_head argmax, M=1", "lingc"),
        ("lm_head argmax, M=1", "cublas+argmax")]
    # KDA at T = 6: lingc's staged (verify) kernel, not its persistent one, nor the commit.
    assert [(b.group, b.variant, b.us) for b in got["kernels_kda"]] == [
        ("T=1", "lingc", 3.2), ("T=6 (lingc staged)", "lingc", 8.8), ("T=6 (lingc staged)", "inductor", 57.9),
        ("T=6 (lingc staged)", "fla-core (recurrence only)", 11.4)]
    assert [(b.group, b.variant) for b in got["kernels_gdn"]] == [
        ("T=1", "lingc"), ("T=6 (lingc staged)", "lingc"), ("T=6 (lingc staged)", "eager")]
    assert [(b.variant, b.floor_us) for b in got["kernels_moe"]] == [("lingc", 30.4), ("inductor-max-autotune", 30.4)]
    assert [b.variant for b in got["kernels_attn"]] == ["lingc", "inductor"]
    with pytest.raises(ValueError, match="unknown benchmark 'kernels_x'"):
        bars({"benchmark": "kernels_x", "rows": [dict(variant="lingc", us=1.0)]})


def test_plot_kernels_draws_every_json_of_a_folder(tmp_path):
    pytest.importorskip("matplotlib")
    from benchmarks.plot_kernels import main

    for k, rows in _kernel_jsons().items():
        (tmp_path / f"{k}.json").write_text(json.dumps({"benchmark": k, "rows": rows}))
    (tmp_path / "kernels_summary.json").write_text(json.dumps({"moe": {"status": "ok"}}))   # not a benchmark
    (tmp_path / "kernels_other.json").write_text(json.dumps({"benchmark": "x", "rows": [{"variant": "lingc"}]}))
    assert main([str(tmp_path), "--out", str(tmp_path / "k.png"), "--title", "X"]) == 0
    assert (tmp_path / "k.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(SystemExit, match="no kernel benchmark rows"):
        main([str(tmp_path / "kernels_summary.json"), "--out", str(tmp_path / "n.png")])
    with pytest.raises(ValueError, match="unknown benchmark 'x'"):     # named: it must be one
        main([str(tmp_path / "kernels_other.json"), "--out", str(tmp_path / "n.png")])


def test_invariance_probe_finds_nothing_on_the_tiny_model_and_names_a_broken_op(capsys, monkeypatch):
    """benchmarks.invariance_probe in-process (CPU): no difference on the tiny model in fp32; a
    router made T-dependent is named."""
    from benchmarks import invariance_probe

    assert invariance_probe.main(["--preset", "tiny", "--layers", "3", "--dtype", "float32"]) == 0
    assert "every lingc op's rows agree" in capsys.readouterr().out
    # A router whose CPU path mixes rows (one [T, H] product for all rows, then a T-dependent
    # perturbation standing in for a T-dependent summation order) is caught and named.
    import lingc.runtime.kernels.moe_router.op as router_op

    # (the MoE layers' routers run inside lingc.rmsnorm_router: pdl_norm_folds.norms_into_routers)
    real = router_op.rmsnorm_router_reference

    def mixing(x, *a):
        y, h, ids, w = real(x, *a)
        return y, h, ids, w * (1 + 1e-6 * (x.shape[0] > 1))
    monkeypatch.setattr(router_op, "rmsnorm_router_reference", mixing)
    assert invariance_probe.main(["--preset", "tiny", "--layers", "3", "--dtype", "float32"]) == 1
    out = capsys.readouterr().out
    assert "first difference at lingc op" in out and "rmsnorm_router" in out, out


def test_lingc_faster_by_compares_each_run_with_lingc_of_its_kind():
    from benchmarks.decode import lingc_faster_by

    results = {"eager": {"wall_ms": 90.0}, "reduce-overhead": {"wall_ms": 9.0}, "lingc": {"wall_ms": 1.8},
               "eager-nextn s=3": {"wall_ms": 200.0}, "reduce-overhead-nextn s=3": {"wall_ms": 14.0},
               "lingc-nextn s=3": {"wall_ms": 4.0}, "reduce-overhead-nextn s=4": {"wall_ms": 15.0},
               "inductor": {"error": "RuntimeError: x"}}
    assert lingc_faster_by(results) == pytest.approx({"eager": 50.0, "reduce-overhead": 5.0,
                                                      "eager-nextn s=3": 50.0, "reduce-overhead-nextn s=3": 3.5})
    # Without the lingc run of a kind, its rows get nothing (s=4 above had no lingc relay either).
    assert lingc_faster_by({"eager": {"wall_ms": 90.0}, "lingc-nextn": {"wall_ms": 4.0}}) == {}
    assert lingc_faster_by({"eager-nextn": {"wall_ms": 200.0}, "lingc-nextn": {"wall_ms": 4.0}}) == \
        pytest.approx({"eager-nextn": 50.0})


def test_chain_bound_adds_one_boundary_per_kernel_to_the_floor():
    from benchmarks.decode import chain_bound_line, chain_bound_ms
    # The plain step of session 22: 449 kernels, a 0.93 us PDL boundary, a 0.648 ms floor.
    b = chain_bound_ms(0.648, 449, 0.93)
    assert b == pytest.approx(0.648 + 0.41757)
    line = chain_bound_line({"chain_bound_ms": b, "floor_ms": 0.648, "kernels_per_step": 449, "wall_ms": 1.737})
    assert line == ("449 kernels x 0.93 us + floor 0.648 ms = 1.066 ms (1.64x floor); "
                    "the step's wall 1.737 ms is 1.63x the bound")
    assert chain_bound_ms(0.648, 0, 0.93) == 0.648
    with pytest.raises(ValueError, match="chain bound of -1 kernels"):
        chain_bound_ms(0.648, -1, 0.93)
    with pytest.raises(ValueError, match="floor 0.0 ms"):
        chain_bound_ms(0.0, 449, 0.93)


def test_boundary_probe_failures_cost_the_bound_not_the_run(monkeypatch):
    from benchmarks import decode, sync_probe
    said = []
    monkeypatch.setattr(sync_probe, "run_form", lambda *a, **k: (0.93, True))
    assert decode.measure_boundary_us(132, said.append) == 0.93 and "132 programs): 0.93 us" in said[-1]
    monkeypatch.setattr(sync_probe, "run_form", lambda *a, **k: (0.93, False))
    assert decode.measure_boundary_us(132, said.append) is None and "wrong values" in said[-1]

    def broken(*a, **k):
        raise RuntimeError("no GPU here")
    monkeypatch.setattr(sync_probe, "run_form", broken)
    assert decode.measure_boundary_us(132, said.append) is None
    assert said[-1] == "no chain bound: the PDL boundary probe failed (RuntimeError: no GPU here)"


def test_critical_path_charges_each_kernel_the_time_since_the_previous_end():
    """Under PDL kernel B starts before A ends; B must be charged only what it adds past A's end."""
    from types import SimpleNamespace

    import torch

    from benchmarks.decode import critical_path_us

    def ev(name, start, end, dev=torch.autograd.DeviceType.CUDA):
        return SimpleNamespace(name=name, device_type=dev, time_range=SimpleNamespace(start=start, end=end))

    events = [ev("b", 1.0, 12.0), ev("a", 0.0, 10.0), ev("c", 11.0, 20.0), ev("b", 19.0, 21.5),
              ev("host", 0.0, 100.0, dev=torch.autograd.DeviceType.CPU)]
    got = critical_path_us(events)
    assert got == {"a": 10.0, "b": 2.0 + 1.5, "c": 8.0}
    assert sum(got.values()) == 21.5          # the span of the device kernels


def test_kernel_sequence_orders_one_replay_by_end_with_grids(tmp_path):
    import json

    from benchmarks.decode import kernel_sequence

    def k(name, ts, dur, grid):
        return {"cat": "kernel", "name": name, "ts": ts, "dur": dur, "args": {"grid": grid}}

    replay = lambda t0: [k("gemm", t0 + 1, 9, [1, 81, 2]), k("norm", t0, 2, [1, 1, 1]),  # noqa: E731
                         k("gemm", t0 + 9, 4, [1, 40, 4]), k("copy", t0 + 12, 1, [1, 1, 1])]
    trace = tmp_path / "t.json"
    trace.write_text(json.dumps({"traceEvents": replay(0) + replay(100) + [{"cat": "cpu_op", "ts": 0, "dur": 5}]}))
    got = kernel_sequence(str(trace), replays=2)
    assert [(r["kernel"], r["grid"], r["critical_us"], r["us"]) for r in got] == [
        ("norm", [1, 1, 1], 2, 2), ("gemm", [1, 81, 2], 8, 9), ("gemm", [1, 40, 4], 3, 4), ("copy", [1, 1, 1], 0, 1)]
    assert kernel_sequence(str(tmp_path / "missing.json")) == []


def test_ncu_summary_splits_roles_and_converts_units(tmp_path, capsys):
    from benchmarks.ncu_step import summarize

    head = ('"ID","Kernel Name","gpu__time_duration.sum","dram__bytes_read.sum","dram__bytes_write.sum",'
            '"launch__registers_per_thread","launch__grid_size","sm__warps_active.avg.pct_of_peak_sustained_active"')
    rows = ['"0","_gemm_kernel","5","10","0.5","96","132","20"', '"1","_gemm_kernel","3","2","0","96","264","40"',
            '"2","_kda_chain_kernel","2","1","1","128","64","10"']
    (tmp_path / "ncu.csv").write_text("\n".join(["==PROF== Connected", head, '"","","usecond","Mbyte","Mbyte","","",""']
                                                + rows) + "\n")
    (tmp_path / "ncu_roles.json").write_text('[{"role": "decode", "kernels": 2}, {"role": "verify", "kernels": 1}]')
    got = summarize(tmp_path / "ncu.csv", tmp_path)
    gemm = got["decode"]["by_kernel"][0]
    assert got["decode"]["kernels"] == 2 and gemm["calls"] == 2 and gemm["us"] == 8.0
    assert gemm["read_mb"] == 12.0 and gemm["grid"] == 264 and gemm["occupancy_pct"] == 30.0
    assert abs(gemm["tbps"] - 12.5 / 8.0) < 1e-9
    assert got["verify"]["by_kernel"][0]["kernel"] == "_kda_chain_kernel" and got["verify"]["isolated_us_total"] == 2.0
    assert "sum of isolated times 8.0 us" in capsys.readouterr().out


def test_ncu_command_profiles_the_run_into_the_summarised_log(tmp_path):
    from benchmarks.ncu_step import METRICS, ncu_command

    cmd = ncu_command(["decode"], tmp_path).split()
    assert cmd[0] == "ncu" and "--profile-from-start" in cmd and "--print-units" in cmd
    assert cmd[cmd.index("--metrics") + 1].split(",") == list(METRICS)
    assert cmd[cmd.index("--log-file") + 1] == str(tmp_path / "ncu.csv")
    assert cmd[-5:] == ["benchmarks.ncu_step", "--roles", "decode", "--out", str(tmp_path)]


def _sequence_json(path, seq, mode="lingc", graph="decode"):
    import json

    path.write_text(json.dumps({"results": {mode: {"kernel_sequence": {graph: seq}}}}))
    return path


def test_sequence_views_compare_two_profiles(tmp_path, capsys):
    from benchmarks.sequence import by_kernel_rows, main, window_rows

    def k(name, grid, us):
        return {"kernel": name, "grid": grid, "critical_us": us, "us": us}

    a = [k("norm", [1, 1, 1], 1.0), k("gemm", [1, 81, 2], 11.5), k("norm", [1, 1, 1], 1.0), k("gemm", [1, 40, 4], 5.0)]
    b = [k("norm", [1, 1, 1], 1.2), k("gemm", [1, 81, 2], 10.0), k("norm", [1, 1, 1], 1.1), k("chain", [8, 16, 1], 2.5)]
    rows = window_rows([a, b], 1, 10)
    assert [(r["pos"], r["grid"], r["f0"], r["f1"]) for r in rows] == [
        (1, "1x81x2", "11.50", "10.00"), (2, "1x1x1", "1.00", "1.10"), (3, "1x40x4", "5.00", "2.50*")]
    totals = by_kernel_rows([a, b], top=2)
    assert [(r["kernel"], r["grid"], r["f0"], r["f1"]) for r in totals] == [
        ("gemm", "1x81x2", "11.5", "10.0 (-1.5)"), ("gemm", "1x40x4", "5.0", "0.0 (-5.0)"),
        ("all kernels", "", "18.5", "14.8")]
    fa, fb = _sequence_json(tmp_path / "a.json", a), _sequence_json(tmp_path / "b.json", b)
    assert main([str(fa), str(fb), "--by-kernel"]) == 0
    assert "| gemm | 1x40x4 | 5.0 | 0.0 (-5.0) |" in capsys.readouterr().out
    assert main([str(fa), str(fb), "--by-kind"]) == 0
    assert "| all | 18.5 (4) | 14.8 (4) |" in capsys.readouterr().out
    with pytest.raises(SystemExit, match=r"no mode 'lingc-nextn'; it has \['lingc'\]"):
        main([str(fa), "--mode", "lingc-nextn"])
    with pytest.raises(SystemExit, match=r"no kernel sequence for graph 'verify'.*run decode with --profile"):
        main([str(fa), "--graph", "verify"])
    with pytest.raises(SystemExit):
        main([str(fa), "--window", "9:3"])


def test_by_kind_sorts_lingc_kernels_into_kinds_and_the_rest_into_other():
    from benchmarks.sequence import OTHER, by_kind

    seq = [{"kernel": n, "critical_us": us} for n, us in [
        ("_rmsnorm_kernel", 1.0), ("_gemm_kernel", 10.0), ("_kda_chain_kernel", 4.0), ("_gated_head_rmsnorm_kernel", 1.0),
        ("_gemm_argmax_kernel", 60.0), ("_moe_router_select_kernel", 3.5), ("_moe_up_kernel", 9.0),
        ("_head_matmul_kernel", 1.5), ("Memcpy DtoD (Device -> Device)", 2.0)]]
    assert by_kind(seq) == {"lm_head (GEMM + argmax)": (60.0, 1), "projection GEMMs": (10.0, 1),
                            "MoE experts": (9.0, 1), "MoE router + align": (3.5, 1), "KDA chain + commit": (4.0, 1),
                            "MLA": (1.5, 1), "norms": (2.0, 2), OTHER: (2.0, 1)}


def test_every_lingc_triton_kernel_has_a_kind():
    # A kernel added to runtime/ without a KINDS entry would be summed into "other" by --by-kind
    # (as design C's _gemv_kernel was at first): every jitted kernel of the package is classified.
    import re
    from pathlib import Path

    from benchmarks.sequence import OTHER, kind_of

    runtime = Path(__file__).resolve().parents[1] / "runtime"
    names = {m for f in runtime.rglob("*.py") for m in re.findall(r"^def (_\w+_kernel)\(", f.read_text(), re.M)}
    assert len(names) >= 20, sorted(names)
    assert {n for n in names if kind_of(n) == OTHER} == set()


@pytest.mark.parametrize("warps", [4, 8])
@pytest.mark.parametrize("n, chunk_bytes", [(10000, 4096), (1024, 16384), (333, 512)])
def test_read_probe_kernel_folds_each_chunk(n, chunk_bytes, warps):
    # benchmarks.read_probe's kernel (interpreter on the CPU): CTA i stores the xor of its chunk
    # of int32 lanes, every chunk's word is written, the tail chunk is masked.
    from benchmarks.read_probe import read

    gen = torch.Generator().manual_seed(n)
    src = torch.randint(-2**31, 2**31 - 1, (n,), generator=gen, dtype=torch.int32)
    lanes = chunk_bytes // 4
    ctas = -(-n // lanes)
    out = torch.full((ctas + 1,), 12345, dtype=torch.int32)
    read(src, out, chunk_bytes, use_pdl=False, num_warps=warps)
    want = [0] * ctas
    for i, v in enumerate(src.tolist()):
        want[i // lanes] ^= v
    assert out[:ctas].tolist() == want and out[ctas].item() == 12345


def _step_json(tmp_path, seq_names, floors_us, floor_ms, bw=1000.0):
    k = lambda name: {"kernel": name, "grid": [1, 1, 1], "critical_us": 1.0, "us": 1.0}  # noqa: E731
    data = {"copy_bandwidth_gbps": bw, "results": {"lingc": {
        "floor_ms": floor_ms, "wall_ms": 0.5, "kernel_sequence": {"decode": [k(n) for n in seq_names]},
        "layer_floor_us": {"decode": [["KDA + MoE", us] for us in floors_us]}}}}
    path = tmp_path / "decode.json"
    path.write_text(json.dumps(data))
    return path


def test_read_probe_step_reads_put_each_layers_bytes_on_one_kernel(tmp_path):
    from benchmarks.read_probe import step_reads

    # Two layers (each ends at its MoE down-GEMM), then the final norm and the lm_head argmax.
    layer = ["_rmsnorm_kernel", "_gemm_kernel", "_kda_chain_kernel", "_moe_up_kernel", "_moe_down_kernel"]
    names = layer + layer + ["_rmsnorm_kernel", "_gemm_argmax_kernel"]
    # 1000 GB/s: 1 us is 1 MB. Layers 10 and 20 us; the step 0.05 ms: 20 MB beyond the layers.
    path = _step_json(tmp_path, names, [10.0, 20.0], 0.05)
    reads, facts = step_reads(path, "lingc")
    tiny = 16
    assert reads == ([10_000_000] + [tiny] * 4 + [20_000_000] + [tiny] * 4 + [tiny, 20_000_000])
    assert facts["kernels"] == 12 and facts["bytes"] == sum(reads) and facts["step_wall_ms"] == 0.5
    with pytest.raises(ValueError, match="2 layer segments against 3 floors"):
        step_reads(_step_json(tmp_path, names, [10.0, 20.0, 5.0], 0.05), "lingc")
    with pytest.raises(ValueError, match="no mode 'lingc-nextn'"):
        step_reads(path, "lingc-nextn")
    with pytest.raises(ValueError, match="no lm_head argmax kernel"):
        step_reads(_step_json(tmp_path, layer + layer, [10.0, 20.0], 0.05), "lingc")


def test_read_probe_step_record_keeps_both_floors(tmp_path):
    # Session 26 found the --step JSON passing floor_ms twice (the step's and this run's).
    from benchmarks.read_probe import step_record, step_reads

    names = ["_gemm_kernel", "_moe_down_kernel", "_gemm_argmax_kernel"]
    _, facts = step_reads(_step_json(tmp_path, names, [10.0], 0.05), "lingc")
    rec = step_record(facts, 2000.0, {16: 0.04})
    assert rec["floor_ms"] == 0.05 and rec["floor_ms_here"] == pytest.approx(facts["bytes"] / 2e9)
    assert rec["chain_ms"] == {16: 0.04} and json.loads(json.dumps(rec))["kernels"] == 3


def test_prefill_flops_count_the_tokens_and_causal_attention():
    # benchmarks.prefill's floor FLOPs on the tiny model: linear in the prompt plus MLA's causal
    # attention (quadratic, the cheaper of the latent and expanded forms); routed experts counted
    # 8 per token, never all of them.
    from model_helpers import tiny_model

    from benchmarks.prefill import prompt_flops
    from lingc.models.moe import MoE

    model = tiny_model(seed=0)
    cfg = model.config
    f1, f2, f4 = (prompt_flops(model, n) for n in (1, 2, 4))
    per_token = 2 * sum(p.numel() for layer in model.target_layers for n, p in layer.named_parameters()
                        if p.dim() >= 2 and ".experts." not in f".{n}")
    moe_layers = [layer.mlp for layer in model.target_layers if isinstance(layer.mlp, MoE)]
    per_token += 2 * sum(cfg.num_experts_per_tok * (m.experts.w13[0].numel() + m.experts.w2[0].numel())
                         for m in moe_layers)
    attn = [layer.attention for layer in model.target_layers if hasattr(layer.attention, "rank")]
    pair = 2 * sum(a.num_heads * min(2 * a.rank + a.rope, a.nope + a.rope + a.vdim) for a in attn)
    assert attn and moe_layers
    assert f1 == pytest.approx(per_token + pair)
    assert f4 == pytest.approx(4 * per_token + 10 * pair)
    assert f4 - 2 * f2 == pytest.approx(4 * pair)           # the quadratic term alone


def test_prefill_logit_agreement_reports_distance_and_margin():
    from benchmarks.prefill import logit_agreement

    ref = torch.tensor([1.0, 5.0, 4.5, -2.0])
    same = logit_agreement(ref.clone(), ref)
    assert same == {"logits_rel_diff": 0.0, "top2_margin": 0.5, "max_abs_logit_diff": 0.0}
    moved = logit_agreement(ref + torch.tensor([0.0, 0.0, 0.75, 0.0]), ref)
    assert moved["top2_margin"] == 0.25 and moved["max_abs_logit_diff"] == 0.75
    assert moved["logits_rel_diff"] == pytest.approx(0.75 / ref.norm().item())


def test_prefill_profile_splits_gpu_time_by_the_enclosing_kind():
    # The profile's ranges nest as the modules do (a CPU profile of the tiny model has a range per
    # kind module, with the attention's ops under it), and each op's own GPU time goes to its
    # innermost kind range, "rest" outside them.
    from types import SimpleNamespace

    from model_helpers import tiny_model
    from torch.autograd import DeviceType

    from benchmarks.prefill import KIND_RANGE, KindRanges, gpu_ms_by_kind
    from lingc.decoding.reference import allocate_cache, prefill

    model = tiny_model(seed=0)
    ranges = KindRanges(model)
    try:
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            prefill(model, allocate_cache(model, 8, 1), torch.arange(8))
    finally:
        ranges.remove()
    assert not ranges.open and all(not m._forward_pre_hooks for m in model.modules())
    names = [e.name for e in prof.events()]
    layers = len(model.target_layers)
    assert names.count(KIND_RANGE + "KDA attention") + names.count(KIND_RANGE + "MLA attention") == layers
    assert any(e.name == "aten::mm" and e.cpu_parent is not None for e in prof.events())

    def ev(name, us, parent=None, device=DeviceType.CPU):
        return SimpleNamespace(name=name, gpu_us=us, cpu_parent=parent, device_type=device)

    moe = ev(KIND_RANGE + "MoE", 0.0)
    grouped = ev("aten::_grouped_mm", 3000.0, moe)
    events = [moe, grouped, ev("aten::mul", 500.0, grouped), ev("aten::mul", 250.0, moe),
              ev("aten::embedding", 100.0), ev("aten::view", 0.0, moe),
              ev("cutlass_grouped_gemm_kernel", 3000.0, None, DeviceType.CUDA),   # the kernel itself
              ev(KIND_RANGE + "MoE", 3750.0, None, DeviceType.CUDA)]              # the range on the GPU
    assert gpu_ms_by_kind(events, "gpu_us") == {"MoE": {"aten::_grouped_mm": 3.0, "aten::mul": 0.75},
                                                "rest": {"aten::embedding": 0.1}}


def test_prefill_benchmark_refuses_a_split_it_does_not_run(tmp_path):
    from benchmarks.prefill import main

    with pytest.raises(SystemExit, match="--tp 2 but 1 process"):
        main(["--tp", "2", "--out", str(tmp_path)])
    with pytest.raises(SystemExit, match="--profile, --profile-captured and --host-profile profile one GPU"):
        main(["--tp", "2", "--profile", "64", "--out", str(tmp_path)])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="needs 2 GPUs")
def test_gpu_prefill_benchmark_under_torchrun_times_the_split(tmp_path):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "-m", "benchmarks.prefill",
           "--tp", "2", "--preset", "tiny", "--tokens", "64", "100", "--reps", "2", "--out", str(tmp_path)]
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out = json.loads((tmp_path / "prefill_tp2.json").read_text())
    assert out["tp"] == 2 and not (tmp_path / "prefill.json").exists()
    rows = out["rows"]
    assert [(r["tokens"], r["graphs"]) for r in rows] == [(64, "captured"), (64, "eager"), (100, "captured"),
                                                         (100, "eager")]
    assert rows[0]["first_token"] == rows[1]["first_token"] and rows[1]["logits_rel_diff"] < 1e-4
    assert rows[0]["syncs"] == 0 and rows[0]["capture_s"] > 0


@pytest.mark.gpu
def test_gpu_prefill_benchmark_runs_both_moe_forms(tmp_path):
    from benchmarks.prefill import main

    assert main(["--preset", "tiny", "--tokens", "80", "--reps", "1", "--chunk", "64", "--moe", "grouped",
                 "grouped-library", "gather", "--op-calls", "direct", "dispatcher", "--profile", "80",
                 "--host-profile", "80", "--graphs", "eager", "--out", str(tmp_path)]) == 0
    out = json.loads((tmp_path / "prefill.json").read_text())
    by_kind = out["profile"]["gpu_ms_by_kind"]
    assert {"KDA attention", "MoE"} <= set(by_kind) and sum(by_kind["MoE"].values()) > 0
    assert [(r["moe"], r["op_calls"]) for r in out["rows"]] == [
        (f, c) for f in ("grouped", "grouped-library", "gather") for c in ("direct", "dispatcher")]
    assert (tmp_path / "prefill_host.pstats").exists()
    for r in out["rows"]:
        assert r["ttft_ms"] > 0 and r["floor_ms"] > 0
        assert 0 < r["host_issue_ms"] <= r["host_wall_ms"] and r["syncs"] == sum(r["sync_sites"].values())
        assert 0 < r["ttft_min_ms"] <= r["ttft_ms"]
        assert {"KDA attention", "MLA attention", "MoE", "dense MLP"} <= set(r["kinds_ms"])
        assert r["top2_margin"] >= 0 and r["logits_rel_diff"] >= 0
    assert out["rows"][0]["logits_rel_diff"] == 0.0          # the first setting is the reference


@pytest.mark.gpu
def test_gpu_prefill_benchmark_times_the_captured_prefill_beside_the_eager(tmp_path):
    from benchmarks.prefill import main

    assert main(["--preset", "tiny", "--tokens", "64", "100", "--reps", "2", "--profile-captured", "100",
                 "--out", str(tmp_path)]) == 0
    out = json.loads((tmp_path / "prefill.json").read_text())
    rows = out["rows"]
    prof = out["profile_captured"]
    assert prof["gpu_busy_ms"] > 0 and (tmp_path / "prefill_captured_trace.json.gz").exists()
    assert any("kda" in r["op"].lower() for r in prof["top_gpu"]), [r["op"] for r in prof["top_gpu"]]
    # The cache holds 108 rows: buckets 64 and 108 (the cache's size), so 100 tokens run padded.
    assert [(r["tokens"], r["graphs"]) for r in rows] == [(64, "captured"), (64, "eager"), (100, "captured"),
                                                         (100, "eager")]
    captured, eager = rows[0], rows[1]
    assert captured["capture_s"] > 0 and eager["capture_s"] is None
    # The process's first sync-checked run may count one sync reported at host_report's own call
    # of fn, outside the prefill's code (seen when this test ran first in its process, session 41).
    assert captured["syncs"] <= 1 and captured["kinds_ms"] == {} and rows[2]["syncs"] == 0
    assert set(captured["sync_sites"]) <= {s for s in captured["sync_sites"] if "host_report" in s}
    assert captured["ttft_ms"] > 0 and captured["first_token"] == eager["first_token"]
    assert eager["logits_rel_diff"] < 1e-4        # a bucket-sized prompt: the same computation


@pytest.mark.gpu
def test_gpu_kernels_kda_prefill_sweeps_splits_and_times_a_baseline(tmp_path):
    from benchmarks.kernels_kda_prefill import main

    kernel = REPO / "runtime" / "kernels" / "kda_prefill" / "kernel.py"
    assert main(["--t", "100", "--heads", "4", "--chunk", "32", "--bv", "16", "--bv-out", "32", "64",
                 "--k-split", "1", "4", "--segments", "2", "--reps", "2", "--warmup", "1", "--baseline", str(kernel),
                 "--out", str(tmp_path)]) == 0
    out = json.loads((tmp_path / "kernels_kda_prefill.json").read_text())
    assert out["shape"]["H"] == 4
    names = [r["variant"] for r in out["rows"]]
    assert names[:6] == ["lingc", "baseline", "lingc-bt32-bv16-o32-w4-c4-s8-tf32x3",
                         "lingc-bt32-bv16-o32-w4-c4-s8-tf32x3-ks4", "lingc-bt32-bv16-o64-w4-c4-s8-tf32x3",
                         "lingc-bt32-bv16-o64-w4-c4-s8-tf32x3-ks4"]
    assert names[6] == "lingc-seg2"
    for r in out["rows"]:
        assert r["correct"], r
        if r["variant"].startswith("lingc"):
            assert r["chunk_ms"] > 0 and r["state_ms"] > 0 and r["out_ms"] > 0, r


@pytest.mark.gpu
def test_gpu_read_probe_step_chain_times_a_chain():
    from benchmarks.read_probe import run_step_chain

    small = run_step_chain([16] * 8, chunk_kb=16, replays=5)
    big = run_step_chain([64 << 20] * 8, chunk_kb=16, replays=5)
    assert 0 < small < big


@pytest.mark.parametrize("m, n, k", [(1, 200, 512), (6, 48, 384), (3, 70, 200)])
def test_tma_probe_kernel_matches_the_product(m, n, k):
    # benchmarks.tma_probe's kernel (interpreter on the CPU, host tensor descriptors): each K
    # chunk's fp32 partial of x @ w.T, for variants with 1-3 tiles before the wait and split K;
    # ragged N and K (the descriptor zero-fills past the weight); partials NaN-poisoned first.
    from triton.tools.tensor_descriptor import TensorDescriptor

    from benchmarks.tma_probe import TmaVariant, plan, tma_gemm

    gen = torch.Generator().manual_seed(m * n + k)
    x, w = torch.randn(m, k, generator=gen), torch.randn(n, k, generator=gen)
    for v in (TmaVariant(16, 64, 2), TmaVariant(32, 64, 3, 2, pre=2), TmaVariant(16, 32, 2, pre=3)):
        per, chunks = plan(k, v)
        ws = torch.full((chunks, m, n), float("nan"))
        tma_gemm(x, TensorDescriptor.from_tensor(w, [v.block_n, v.block_k]), n, ws, v, use_pdl=False)
        torch.testing.assert_close(ws.sum(0), x @ w.T, rtol=1e-4, atol=1e-4)


def test_gemm_sweep_candidates_start_with_the_table_and_include_each_design():
    # Every shape of the preset: the table's config first, no repeats, designs A (where K holds
    # enough tiles), B and C among the candidates, each named by the sweep's printout.
    from benchmarks.gemm_sweep import candidates, name_of
    from benchmarks.kernels_gemm import SHAPES
    from lingc.runtime.kernels.gemm.config import config_for

    for label, (k, rows) in SHAPES["flash-tp4-rank"].items():
        n = sum(rows)
        cands = candidates(n, k)
        assert cands[0] == config_for(n, k) and len(set(cands)) == len(cands), label
        names = [name_of(c) for c in cands]
        kinds = {nm[0] for nm in names}
        # (design A needs 4 K tiles of 128 per chunk: none for the shared expert's K = 192)
        assert kinds == ({"A", "B", "C"} if k >= 512 else {"B", "C"}), (label, names)


def test_mla_config_specs_follow_the_tables_pdl_rule():
    # --mla-config variants take the split in or out of the PDL chain as config_for does for
    # their split length, so a sweep at 65536 compares tiles, not PDL placements.
    from benchmarks.kernels_attn import parse_mla_config
    from lingc.runtime.kernels.mla_decode.kernel import config_for

    for L, spec in ((8192, "128,64,3,8"), (65536, "512,64,3,8")):
        assert parse_mla_config(spec) == config_for(L, 8, 512, 64), spec
    c = parse_mla_config("256,32,4,8,32,16")
    assert (c.split_len, c.block_l, c.num_stages, c.num_warps, c.combine_block_r, c.combine_block_s,
            c.split_pdl) == (256, 32, 4, 8, 32, 16, False)
    assert (c.block_h, parse_mla_config("512,64,3,8,64,32,32").block_h) == (0, 32)
    assert (c.max_registers, parse_mla_config("128,64,2,8,64,32,0,128").max_registers) == (0, 128)
    for bad in ("512,64,3", "96,64,3,8", "a,b,c,d", "512,64,3,8,64,32,24"):
        with pytest.raises(SystemExit, match="--mla-config"):
            parse_mla_config(bad)


def test_gqa_config_specs():
    # --gqa-config variants: the table's config spelled out equals config_for's; a label names it.
    from benchmarks.kernels_attn import gqa_config_label, parse_gqa_config
    from lingc.runtime.kernels.gqa_decode.kernel import config_for

    assert parse_gqa_config("128,64,3,8") == config_for(8192, 4, 1, 256, 256)
    c = parse_gqa_config("256,32,2,4,128,16,32")
    assert (c.split_len, c.block_l, c.num_stages, c.num_warps, c.combine_block_r, c.combine_block_s,
            c.block_h) == (256, 32, 2, 4, 128, 16, 32)
    assert gqa_config_label(c) == "lingc-s256-l32-st2-w4-cr128-cs16-h32"
    for bad in ("512,64,3", "96,64,3,8", "a,b,c,d", "512,64,3,8,64,32,24"):
        with pytest.raises(SystemExit, match="--gqa-config"):
            parse_gqa_config(bad)


def test_plot_draws_a_decode_json(tmp_path):
    # benchmarks.plot on a decode JSON of two modes (one with a projected TPOT): a PNG is written.
    pytest.importorskip("matplotlib")
    import json

    from benchmarks.plot import main

    d = {"preset": "flash-tp4-rank", "context": 8192, "weights": "random bf16", "env": {"gpu": "X"},
         "results": {"lingc": {"tpot_ms": 1.86, "floor_ms": 0.65},
                     "lingc-nextn": {"tpot_ms": 4.49, "floor_ms": 1.90, "tpot_projected_ms": 1.38}}}
    src = tmp_path / "decode.json"
    src.write_text(json.dumps(d))
    assert main([str(src), "--out", str(tmp_path / "d.png")]) == 0
    assert (tmp_path / "d.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"



def test_inductor_relay_times_the_forwards_the_relay_floor_counts(monkeypatch):
    """The Inductor relay mode compiles the draft (T=1, T=steps+1) and the target (T=steps+1) and
    charges the step (steps - 1) draft calls plus one verify and one extend. Run here through a
    backend that records each compiled graph (its first input's length: T) and counts its runs."""
    from benchmarks import decode
    from lingc.models import Ling3Cache, build_model, preset

    monkeypatch.setattr(decode, "DEV", "cpu")
    model = build_model(preset("tiny"), device="cpu", dtype=torch.float32, seed=0)
    cache = Ling3Cache.allocate(model.config, 64, device="cpu")
    runs = []

    def backend(gm, example_inputs):
        name = f"{gm.code.count('lm_head')}:{[tuple(x.shape) for x in example_inputs if x.dim() == 1]}"

        def call(*args):
            runs.append(name)
            return gm.forward(*args)
        return call

    res = decode.run_inductor_relay(model, cache, 16, "reduce-overhead-nextn", steps=3,
                                    compile_kwargs={"backend": backend})
    assert set(res["per_graph_ms"]) == {"draft T=1", "verify T=4", "extend T=4"}
    per = res["per_graph_ms"]
    assert res["step_ms"] == pytest.approx(2 * per["draft T=1"] + per["verify T=4"] + per["extend T=4"])
    assert res["wall_ms"] > 0 and res["compile_s"] > 0
    assert len(set(runs)) == 3                      # three graphs: draft T=1, verify, extend
    # The timed back-to-back steps (5 after one warm-up): 2 drafts at T=1, a verify, an extend each.
    step = runs[-4:]
    assert runs[-24:] == step * 6 and step[0] == step[1] != step[2] != step[3] != step[0]
    assert decode.inductor_kwargs("reduce-overhead-nextn") == {"mode": "reduce-overhead"}
    assert decode.inductor_kwargs("inductor-nextn") == {}


def test_inductor_cudagraph_modes_mark_the_cache_static():
    """reduce-overhead modes hand cudagraph trees a cache at fixed addresses (else Inductor skips
    its CUDA graphs: "mutated inputs"); the default mode leaves the cache alone."""
    from benchmarks import decode
    from lingc.models import Ling3Cache, preset

    cfg = preset("tiny")
    plain, graphed = (Ling3Cache.allocate(cfg, 16, device="cpu") for _ in range(2))
    decode.static_cache_for_cudagraphs(plain, decode.inductor_kwargs("inductor"))
    assert not any(hasattr(t, "_dynamo_static_input_type") for t in plain.tensors())
    for mode in ("reduce-overhead", "reduce-overhead-pdl", "reduce-overhead-nextn"):
        c = Ling3Cache.allocate(cfg, 16, device="cpu")
        skips = decode.static_cache_for_cudagraphs(c, decode.inductor_kwargs(mode))
        assert all(getattr(t, "_dynamo_static_input_type", None) == "unguarded" for t in c.tensors()), mode
        assert decode.cudagraphs_used(decode.inductor_kwargs(mode), skips) is True
    assert decode.cudagraphs_used(decode.inductor_kwargs("inductor"), 0) is None


def test_compile_time_reports_each_role_and_pass(tmp_path):
    out = run(["benchmarks.compile_time", "--preset", "tiny", "--layers", "3", "--roles", "verify",
               "decode", "--inductor", "0", "--capture", "aot"], tmp_path, timeout=240)
    assert "compile (no capture on the CPU): tiny, 3 layers" in out and "| role | wall s |" in out
    assert "capture aot" in out
    data = json.loads((tmp_path / "compile_time.json").read_text())
    assert data["capture"] == "aot"
    assert [r["role"] for r in data["roles"]] == ["verify", "decode"]
    verify, decode = data["roles"]
    # stage_commit is for the relay's verify graph only: timed there, skipped (None) for decode.
    assert verify["per_pass_s"]["stage_commit"] > 0 and decode["per_pass_s"]["stage_commit"] is None
    for r in data["roles"]:
        assert r["graphs"] == 1 and r["per_pass_s"]["pdl_swap"] > 0
        assert 0 < r["passes_s"] < r["wall_s"]
    assert data["total_s"] == pytest.approx(verify["wall_s"] + decode["wall_s"])


def test_compile_time_measures_a_cold_compile_every_time():
    # Two measurements in one process with equal options: the second still compiles (an engine
    # would otherwise get the first one's graphs from Dynamo's cache and time nothing).
    from benchmarks.compile_time import measure
    for _ in range(2):
        (row,) = measure("tiny", 2, None, ["decode"], 2, False, None)["roles"]
        assert row["graphs"] == 1 and row["passes_s"] > 0


@pytest.mark.gpu
def test_gpu_kernels_kda_inductor_column(tmp_path):
    # The KDA benchmark's Inductor column: one compiled graph of the eager path for every cold
    # copy, checked against the fp32 reference like the other variants, lingc rows get the ratio.
    from benchmarks import kernels_kda

    assert kernels_kda.main(["--out", str(tmp_path), "--t", "1", "6", "--inductor", "--layers", "3",
                             "--replays", "3"]) == 0
    rows = json.loads((tmp_path / "kernels_kda.json").read_text())["rows"]
    ind = [r for r in rows if r["variant"] == "inductor"]
    assert [r["T"] for r in ind] == [1, 6] and all(r["correct"] and r["us"] > 0 for r in ind)
    assert all(r["speedup_vs_inductor"] > 0 for r in rows if r["variant"] == "lingc")


def test_kernels_moe_routed_wrapper_is_the_modules_forward():
    # kernels_moe's Inductor variant compiles _Routed (MoE._forward that also returns its routing,
    # so Inductor is checked under the routing it computed): eagerly it is the module, bit for bit.
    from benchmarks.kernels_moe import _Routed, build_layers
    from lingc.models.config import preset

    cfg = preset("tiny")
    moe = build_layers(cfg, 1, "cpu")[0]
    x = torch.randn(6, cfg.hidden_size)
    with torch.no_grad():
        y, ids, w = _Routed(moe)(x)
        ids_ref, w_ref = moe.gate(x)
        assert torch.equal(y, moe(x)) and torch.equal(ids, ids_ref) and torch.equal(w, w_ref)


@pytest.mark.parametrize("form", ["direct", "id-early", "id-after-wait", "+ split-K"])
def test_gather_probe_reads_the_up_gemms_tiles(form):
    # benchmarks.gather_probe's kernel (interpreter on the CPU) at a small shape: I = 16 rows of
    # gate and up, H = 64 (two tiles of 8 columns, four chunks of 16), three blocks of a pool of 5.
    from benchmarks.gather_probe import Gather, tile_folds, xor_reduce

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    i, h, bn, ck = 16, 64, 8, 16
    w = torch.randint(-2**31, 2**31 - 1, (5, 2 * i, h // 2), dtype=torch.int32, device=dev)
    g = Gather(w, 3, rows=2, i=i, h=h, block_n=bn, chunk_k=ck)
    experts = [4, 0, 2] if form != "direct" else [1, 2, 3]
    ref = tile_folds(w.cpu(), experts, i, bn)                       # [blocks * tiles, 2 * bn]
    for _ in range(2):                                              # the tickets are reset for the next call
        out = g(form, torch.tensor([4, 0, 2], dtype=torch.int32, device=dev), 1, False).cpu()
        if form == "+ split-K":
            assert torch.equal(out[:ref.numel()].view_as(ref), ref)
        else:   # one word per CTA: the xor of its chunk, whose xor over the chunks is the tile's
            words = out[:ref.shape[0] * g.split_k].view(ref.shape[0], g.split_k)
            assert torch.equal(xor_reduce(words, 1), xor_reduce(ref, 1))
    assert g.nbytes == 3 * 2 * i * h * 2
    with pytest.raises(ValueError, match="rows = 3: a power of two"):
        Gather(w, 3, rows=3, i=i, h=h, block_n=bn, chunk_k=ck)
    with pytest.raises(ValueError, match=r"want int32 \[E, 32, 32\]"):
        Gather(w.float(), 3, rows=2, i=i, h=h, block_n=bn, chunk_k=ck)


@pytest.mark.gpu
def test_gpu_gather_probe_runs_every_form(tmp_path):
    from benchmarks.gather_probe import FORMS, main

    assert main(["--out", str(tmp_path), "--experts", "8", "--sets", "4", "--pool", "64", "--replays", "3"]) == 0
    data = json.loads((tmp_path / "gather_probe.json").read_text())
    assert data["correct"] and [r["what"] for r in data["rows"]][:len(FORMS)] == list(FORMS)
    assert all(r["us"] > 0 for r in data["rows"])
    with pytest.raises(SystemExit, match="each set needs its own experts"):
        main(["--out", str(tmp_path), "--experts", "40", "--sets", "4", "--pool", "64"])


@pytest.mark.gpu
def test_gpu_kernels_moe_grouped_times_both_forms(tmp_path):
    from benchmarks.kernels_moe_grouped import main

    main(["--tokens", "64", "--reps", "2", "--block-m", "64", "--out", str(tmp_path)])
    out = json.loads((tmp_path / "kernels_moe_grouped.json").read_text())
    names = [r["variant"] for r in out["rows"]]
    assert names[:2] == ["library", "lingc"] and all(r["ok"] == "yes" for r in out["rows"])
    assert all(r["total_ms"] > 0 and r["floor_ms"] > 0 for r in out["rows"])


@pytest.mark.gpu
def test_gpu_host_overhead_splits_an_op_call(tmp_path):
    from benchmarks.host_overhead import main

    assert main(["--calls", "50", "--out", str(tmp_path)]) == 0
    rows = json.loads((tmp_path / "host_overhead.json").read_text())["rows"]
    ops = {r["op"]: r for r in rows}
    assert {"torch.add", "F.linear", "rmsnorm", "moe_swiglu", "moe_select"} <= set(ops)
    assert all(ops[n]["op_us"] > 0 and ops[n]["launch_us"] > 0 for n in ("rmsnorm", "moe_swiglu", "moe_select"))


@pytest.mark.parametrize("T", [1, 3])
def test_kernels_gdn_eager_path_is_the_reference(T):
    # The Qwen3-Next benchmark's eager variant (Hugging Face's torch decode, 4-column cache) and
    # kda_chain's reference agree on its layer, and both leave the same cache: the baseline it
    # times is the math lingc's kernel is checked against.
    from benchmarks.kernels_gdn import chain_args, eager, layer
    from lingc.runtime.kernels.kda import kda_chain_reference

    x = layer(T, torch.Generator().manual_seed(T), device="cpu")
    ref = kda_chain_reference(*chain_args(x))
    o = eager(x)
    assert ((o - ref.o).norm() / ref.o.norm()) < 1e-5
    assert torch.equal(x["cache"], ref.window)
    assert ((x["state"] - ref.state).norm() / ref.state.norm()) < 1e-5


@pytest.mark.gpu
def test_gpu_kernels_gdn_runs_and_checks(tmp_path):
    from benchmarks import kernels_gdn

    assert kernels_gdn.main(["--out", str(tmp_path), "--t", "1", "6", "--layers", "3", "--replays", "3"]) == 0
    rows = json.loads((tmp_path / "kernels_gdn.json").read_text())["rows"]
    lingc = [r for r in rows if r["variant"] == "lingc"]
    assert [r["mode"] for r in lingc] == ["persistent", "staged"] and all(r["correct"] for r in lingc)


def test_decode_smoke_times_a_sampling_requests_graphs(tmp_path):
    out = run(["benchmarks.decode", "--smoke", "--modes", "lingc,lingc-nextn", "--tokens", "4", "--sampled-verify",
               "--sampled-top-p", "1", "0.9"], tmp_path, timeout=300)
    results = json.loads((tmp_path / "decode.json").read_text())["results"]
    r, plain = results["lingc-nextn"], results["lingc"]
    assert r["verify_sample_ms"] > 0 and set(r["per_graph_ms"]) == {"draft", "verify", "extend"}
    assert r["step_ms"] == pytest.approx(sum(r["per_graph_ms"].values()))
    assert plain["decode_sample_ms"] > 0 and set(plain["per_graph_ms"]) == {"decode"}
    assert set(r["sampled_ms_by_top_p"]["verify_sample"]) == {"1.0", "0.9"}
    assert r["verify_sample_ms"] == r["sampled_ms_by_top_p"]["verify_sample"]["1.0"]
    for role, greedy in (("verify_sample", "verify"), ("decode_sample", "decode"), ("draft_sample", "draft"),
                         ("verify_sample_q", "verify"), ("extend_sample", "extend")):
        for p in ("1", "0.9"):
            assert f"a sampling request's {greedy} ({role}, top_p {p})" in out
    assert all(r[f"{role}_ms"] > 0 for role in ("draft_sample", "verify_sample_q", "extend_sample"))
    for p in ("1", "0.9"):
        assert f"a sampling request's relay step with sampled drafts (top_p {p})" in out


def test_foreign_decode_smoke(tmp_path):
    out = run(["benchmarks.foreign_decode", "--preset", "tiny", "--tokens", "5", "--warmup", "2"], tmp_path,
              timeout=240)
    assert "CPU SMOKE RUN" in out and "| mode | step ms |" in out
    data = json.loads((tmp_path / "foreign_decode.json").read_text())
    assert [r["mode"] for r in data["results"]] == ["eager", "lingc", "lingc-nextn"]
    assert all(r["step_ms"] > 0 for r in data["results"]) and data["results"][1]["compile_s"] > 0
    # fp32 on the CPU: lingc's step picks eager's tokens over all 7 steps.
    assert data["tokens_agree"] == 7 == len(data["token_ids"]["lingc"])
    assert "lingc and eager agree on the first 7 of 7 steps" in out
    # The relay's 7 steps emit at least 7 tokens, the greedy ones: plain lingc's.
    relay = data["results"][2]
    n = min(len(data["token_ids"]["lingc-nextn"]), 7)
    assert relay["tok_per_step"] >= 1.0 and data["speculative_agree"] == [n, n]
    assert f"lingc-nextn's tokens equal lingc's on the first {n} of {n}" in out
    # Every op of the tiny model's and its MTP draft's steps is on lingc's kernels: nothing left to ATen.
    assert data["ops_left"] == {} and "ops lingc left to ATen / Inductor in the step: none" in out
    # The floor counts the chosen experts, not all: between the dense weights and every weight.
    import importlib.util
    spec = importlib.util.spec_from_file_location("fm_smoke", REPO / "tests" / "foreign_model.py")
    fm = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fm)
    m = fm.KimiStyleModel()
    every = sum(p.numel() * 4 for p in m.parameters())
    experts = sum(p.numel() * 4 for moe in m.moe for p in (moe.w13, moe.w2))
    assert every - experts - m.embed.weight.numel() * 4 < data["floor_bytes"] < every


def test_kernels_attn_gqa_layer_steps_agree_on_the_cpu():
    # benchmarks.kernels_attn's gated-attention step (GPU only there): its eager function and the
    # lingc ops it times (their CPU references here) compute the same outputs and cache rows.
    from benchmarks.kernels_attn import GQA_D, GQA_EPS, GQA_HKV, GQA_HQ, GQA_ROPE, _eager_gqa_layer
    import lingc.runtime.kernels.gqa_decode  # noqa: F401
    import lingc.runtime.kernels.head_cache_write  # noqa: F401
    from lingc.models.layers import rope_inv_freq

    gen = torch.Generator().manual_seed(3)
    T, L = 6, 40
    q, gate = (torch.randn(T, GQA_HQ, GQA_D, generator=gen) for _ in range(2))
    k, v = (torch.randn(T, GQA_HKV, GQA_D, generator=gen) for _ in range(2))
    kc, vc = (torch.randn(L, GQA_HKV, GQA_D, generator=gen) for _ in range(2))
    pos, freq = torch.arange(L - T, L), rope_inv_freq(GQA_ROPE, 1.0e7)
    qw, kw = (torch.randn(GQA_D, generator=gen) * 0.1 for _ in range(2))   # the zero-centred q / k norms
    ek, ev = kc.clone(), vc.clone()
    want = _eager_gqa_layer(q, k, v, gate, ek, ev, pos, freq, qw, kw)
    norm = dict(eps=GQA_EPS, zero_centered=True)
    torch.ops.lingc.head_cache_write(k, pos, kc, freq, norm_weight=kw, **norm)
    torch.ops.lingc.head_cache_write(v, pos, vc)
    got = torch.ops.lingc.gqa_decode(q, kc, vc, pos, GQA_D ** -0.5, inv_freq=freq, gate=gate, norm_weight=qw, **norm)
    torch.testing.assert_close(kc, ek, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(vc, ev)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("m", [1, 3])
@pytest.mark.parametrize("design", ["A", "B"])
def test_split_defer_probe_kernel_matches_the_gemm_chain(m, design):
    # benchmarks.split_defer_probe's kernel (interpreter on the CPU): in ticket mode it is
    # gemm_triton's arithmetic, and a consumer summing the producer's partial planes in its
    # loads gets the ticket chain's bits (design A sums planes in every tile of its loop).
    from benchmarks.split_defer_probe import probe_gemm
    from lingc.runtime.kernels.gemm.config import GemmConfig
    from lingc.runtime.kernels.gemm.kernel import gemm_triton, k_plan

    g = torch.Generator().manual_seed(m)
    k1, n1, n2 = 128, 96, 80
    cfg1 = GemmConfig(16, 32, 2, 4, 2) if design == "A" else GemmConfig(32, 0, 2, 4, 1, prefetch=True)
    cfg2 = GemmConfig(16, 32, 3, 4, 2) if design == "A" else GemmConfig(16, 0, 3, 4, 1, prefetch=True)
    x = torch.randn(m, k1, generator=g).to(torch.bfloat16)
    w1 = (torch.randn(n1, k1, generator=g) * 0.1).to(torch.bfloat16)
    w2 = (torch.randn(n2, n1, generator=g) * 0.1).to(torch.bfloat16)
    y = gemm_triton(x, [w1], config=cfg1)
    z = gemm_triton(y, [w2], config=cfg2)
    s1, s2 = k_plan(k1, cfg1)[2], k_plan(n1, cfg2)[2]
    ws1 = torch.full((s1, m, n1), float("nan"))
    ws2 = torch.full((s2, m, n2), float("nan"))
    out1 = torch.full((m, n1), float("nan"), dtype=torch.bfloat16)
    out2 = torch.full((m, n2), float("nan"), dtype=torch.bfloat16)
    probe_gemm(x, 0, w1, ws1, out1, m, True, cfg1)
    assert torch.equal(out1, y)
    probe_gemm(x, 0, w1, ws1, out1, m, False, cfg1)      # partials only
    assert not ws1.isnan().any()
    probe_gemm(ws1, s1, w2, ws2, out2, m, True, cfg2)    # the consumer sums them
    assert torch.equal(out2, z)
