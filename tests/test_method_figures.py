"""benchmarks.method_figures: the sanity lines a decode run prints against method.md's
independent figures, and the ATen op count that explains an eager step's time."""
import pytest
import torch

from benchmarks.method_figures import METHOD, count_aten_ops, sanity_lines

# Session 25 calls 3 and 4's figures (one H200, benchmarks/scripts/h200_session25_c{3,4}.sh),
# with the op counts of flash-tp4-rank's eager step on the meta device (the GPU busy time and
# kernel count are made up: those calls did not measure them).
RESULTS = {
    "eager": {"wall_ms": 152.927, "aten_ops": 10950, "kernel_ops": 6393,
              "gpu_busy_ms": 3.21, "kernels": 6012},
    "inductor": {"wall_ms": 23.788},
    "reduce-overhead": {"wall_ms": 9.039},
    "reduce-overhead-nextn": {"wall_ms": 14.319, "per_graph_ms": {"draft T=1": 0.489, "verify T=6": 13.997,
                                                                  "extend T=6": 0.574}},
    "lingc": {"wall_ms": 1.700},
}


def test_each_figure_is_compared_with_its_ratio_and_verdict():
    lines = sanity_lines("flash-tp4-rank", 8192, RESULTS, plain_gb=2.748, verify_gb=7.45, verify_experts=46.62)
    assert lines == [
        "floor bytes, T=1 step: 2.748 GB against method.md's 2.75 GB (1.00x): within 3%",
        "floor bytes, T=6 verify: 7.450 GB against method.md's 7.1 GB (1.05x): OUTSIDE 3%",
        "  the verify's router chose 46.6 distinct experts of 48 picks per MoE layer; method.md counted 45 "
        "(random routing, taken as uniform)",
        "eager, T=1 step: 152.93 ms against method.md's 81 ms (1.89x): OUTSIDE 25%",
        "  eager: 10950 ATen ops a step, 6393 of them not views, 23.9 us of wall time each; the GPU busy "
        "3.2 ms of it in 6012 kernels; method.md's implementation: 12600 kernels, 6.4 us each",
        "Inductor default, T=1 step: 23.79 ms against method.md's 26.6 ms (0.89x): within 25%",
        "Inductor reduce-overhead, T=1 step: 9.04 ms against method.md's 10.2 ms (0.89x): within 25%",
        "Inductor reduce-overhead, T=6 verify: 14.00 ms against method.md's 14.4 ms (0.97x): within 25%",
    ]


def test_the_tolerance_is_inclusive_and_two_sided():
    fast = {"reduce-overhead": {"wall_ms": METHOD.reduce_overhead_t1_ms * 0.74}}
    edge = {"reduce-overhead": {"wall_ms": METHOD.reduce_overhead_t1_ms * 1.25}}
    assert sanity_lines("flash-tp4-rank", 8192, fast, None, None)[0].endswith("OUTSIDE 25%")
    assert sanity_lines("flash-tp4-rank", 8192, edge, None, None)[0].endswith("within 25%")


def test_only_the_preset_and_context_method_md_measured():
    assert sanity_lines("tiny", 8192, RESULTS, 2.75, 7.1) == []
    assert sanity_lines("flash-tp4-rank", 4096, RESULTS, 2.75, 7.1) == []
    # Modes that did not run (or failed: no wall time) give no line.
    assert sanity_lines("flash-tp4-rank", 8192, {"eager": {"error": "x"}}, None, None) == []


def test_count_aten_ops_separates_views():
    x = torch.randn(3, 4)
    assert count_aten_ops(lambda: (x.t() + 1).sum()) == (3, 2)       # t (a view), add, sum
    assert count_aten_ops(lambda: x[0].view(2, 2).unsqueeze(0)) == (3, 0)


def test_without_a_gpu_profile_the_eager_line_says_only_what_was_counted():
    cpu = {"eager": {"wall_ms": 100.0, "aten_ops": 3000, "kernel_ops": 2000}}
    lines = sanity_lines("flash-tp4-rank", 8192, cpu, None, None)
    assert lines[1] == ("  eager: 3000 ATen ops a step, 2000 of them not views, 50.0 us of wall time each; "
                        "method.md's implementation: 12600 kernels, 6.4 us each")


@pytest.mark.gpu
def test_gpu_eager_mode_counts_its_ops_and_profiles_its_kernels():
    from benchmarks import decode
    from lingc.models import Ling3Cache, build_model, preset

    model = build_model(preset("tiny"), device="cuda", dtype=torch.bfloat16, seed=0, progress=False)
    cache = Ling3Cache.allocate(model.config, 64, device="cuda")
    decode.fill_synthetic(cache)
    r = decode.run_eager(model, cache, 32, 1)
    assert r["aten_ops"] > r["kernel_ops"] > 100
    # Every non-view op launches about one kernel (a few launch none or two).
    assert 0.5 * r["kernel_ops"] < r["kernels"] < 2 * r["kernel_ops"]
    assert 0 < r["gpu_busy_ms"] < r["wall_ms"]
