"""KDA prefill micro-benchmark: lingc's chunked Triton kernels vs PyTorch kda_chunked (and FLA's
chunk_kda as a peer), one layer's prompt.

    python -m benchmarks.kernels_kda_prefill --out benchmarks/results/kda_prefill
        [--t 8192] [--heads 8] [--chunk 64 32] [--bv 16 32] [--bv-out 32 64] [--warps-out 4 8]
        [--warps-chunk 4 8] [--warps-state 4 8]
        [--precision ieee tf32x3] [--segments 2 4 8] [--baseline OLD_KERNEL.py]

Shape: one flash-tp4-rank KDA layer (H=8 heads, K=V=128; ``--heads 32``: flash's unsharded layer),
a T=8192-token prompt, fp32 inputs (q, k L2-normalised, q scaled by K^-0.5, the bounded gate g in
(-5, 0), beta in (0, 1)) and a random fp32 initial state. Variants:

- ``lingc``            torch.ops.lingc.kda_prefill's kernels at the table config (all launches)
- ``lingc-btB-bvN-oM-wW-cX-sY-P``  the kernels at chunk B, state-walk BV = N, output-pass BV = M
                       with W warps, X warps in the chunk pass, Y in the state walk, tl.dot
                       precision P (the product of ``--chunk/--bv/--bv-out/--warps-out/
                       --warps-chunk/--warps-state/--precision``)
- ``lingc-segN``       ``--segments N``: the table config with the chunks in N segments, each
                       segment's walk on a high-priority side stream beside the next segment's
                       chunk pass (kernel.py, "Segments")
- ``baseline``         ``--baseline FILE``: an earlier version's kernel.py (e.g. from
                       ``git show REV:runtime/kernels/kda_prefill/kernel.py``), its own table
                       config, timed in the same process for a before/after
- ``torch``            lingc.models.kda_math.kda_chunked: the model's eager prefill path
- ``fla``              flash-linear-attention's chunk_kda, when importable: q, k, v and beta in
                       bf16 (as FLA's KDA layer feeds it), g and the state in fp32, scale 1 (q
                       arrives scaled), no in-kernel L2 norm. Its error is judged against a bf16
                       tolerance.

Conditions: each variant is run once and checked against kda_chunked first (relative RMS; an
incorrect variant is timed but flagged, and no speedup is printed for it); then timed with CUDA
events, per call, after warm-up calls, median (and min) over repetitions. Prefill calls last
milliseconds, so launch overhead is negligible and no CUDA graph is used. Workspaces are
allocated inside the call, as the op does. For every lingc variant a torch.profiler run of a few
calls without PDL splits the time by kernel (chunk pass / state walk / output pass: under PDL a
dependent kernel starts early and its wait would count as its own time), so that the best setting
of each kernel can be read off the sweep.
"""
from __future__ import annotations

import argparse
import dataclasses
import itertools
import statistics
import sys
from pathlib import Path

import torch

from benchmarks.common import event_times_ms, markdown_table, rel_rms, write_json
from lingc.models.kda_math import kda_chunked, l2norm

K = 128
LOWER_BOUND = -5.0
RTOL_RMS = 1e-4          # lingc vs kda_chunked, both fp32
FLA_RTOL_RMS = 2e-2      # FLA on bf16 inputs


def _require_cuda() -> None:
    if not torch.cuda.is_available():
        raise SystemExit("benchmarks.kernels_kda_prefill needs a CUDA device (it times Triton kernels on the "
                         "GPU); none is visible here. Run the CPU tests instead: "
                         "python -m pytest -q tests/test_kda_prefill.py")


def _inputs(T: int, H: int, seed: int):
    gen = torch.Generator(device="cuda").manual_seed(seed)

    def r(*shape):
        return torch.randn(*shape, generator=gen, device="cuda")

    return dict(q=l2norm(r(T, H, K)) * K ** -0.5, k=l2norm(r(T, H, K)), v=r(T, H, K),
                g=LOWER_BOUND * torch.sigmoid(r(T, H, K)), beta=torch.sigmoid(r(T, H)), state=r(H, K, K) * 0.3)


def _fla():
    try:
        from fla.ops.kda import chunk_kda
    except Exception:  # not installed, or an incompatible version
        return None

    def run(x):
        bf = torch.bfloat16
        o, S = chunk_kda(x["q"].to(bf)[None], x["k"].to(bf)[None], x["v"].to(bf)[None], x["g"][None],
                         x["beta"].to(bf)[None], scale=1.0, initial_state=x["state"][None].clone(),
                         output_final_state=True, use_qk_l2norm_in_kernel=False)
        return o[0].float(), S[0].float()
    return run


# Kernel name fragment -> column of the per-kernel split.
_KERNEL_COLUMNS = {"_kda_prefill_chunk_kernel": "chunk_ms", "_kda_prefill_state_kernel": "state_ms",
                   "_kda_prefill_output_kernel": "out_ms"}


def _kernel_split_ms(fn, calls: int = 3) -> dict:
    """Device ms per call of each lingc prefill kernel, from torch.profiler over `calls` calls."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    split = {}
    for ev in prof.key_averages():
        for frag, col in _KERNEL_COLUMNS.items():
            if frag in ev.key:
                us = getattr(ev, "device_time_total", None)
                us = getattr(ev, "cuda_time_total", 0.0) if us is None else us
                split[col] = split.get(col, 0.0) + us / calls / 1e3
    return split


def _load_baseline(path: Path):
    """kda_prefill_triton of an earlier kernel.py, imported under a private module name."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("_kda_prefill_baseline", path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"--baseline {path}: not a Python file that can be imported")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod     # dataclasses look their module up while the file runs
    spec.loader.exec_module(mod)
    return mod.kda_prefill_triton


def bench_T(T, H, sweep, reps, warmup, baseline=None, segments=()):
    from lingc.runtime.kernels.kda_prefill import kda_prefill
    from lingc.runtime.kernels.kda_prefill.kernel import KdaPrefillConfig, config_for, kda_prefill_triton

    x = _inputs(T, H, seed=T)
    args = (x["q"], x["k"], x["v"], x["g"], x["beta"], x["state"])
    o_ref, S_ref = kda_chunked(*args)
    torch.cuda.synchronize()

    variants = {"lingc": (lambda: kda_prefill(*args), RTOL_RMS)}
    if baseline is not None:
        variants["baseline"] = (lambda: baseline(*args), RTOL_RMS)
    configs = {"lingc": config_for(*x["state"].shape)}
    for bt, bv, bvo, wo, wc, ws, prec, ks in sweep:
        cfg = KdaPrefillConfig(chunk=bt, bv=bv, bv_out=bvo, num_warps_out=wo, num_warps_chunk=wc,
                               num_warps_state=ws, precision=prec, k_split=ks)
        name = f"lingc-bt{bt}-bv{bv}-o{bvo}-w{wo}-c{wc}-s{ws}-{prec}" + (f"-ks{ks}" if ks > 1 else "")
        configs[name] = cfg
        variants[name] = (lambda cfg=cfg: kda_prefill_triton(*args, config=cfg), RTOL_RMS)
    for n in segments:               # the table's config with its chunks in n segments
        cfg = dataclasses.replace(configs["lingc"], segments=n)
        configs[f"lingc-seg{n}"] = cfg
        variants[f"lingc-seg{n}"] = (lambda cfg=cfg: kda_prefill_triton(*args, config=cfg), RTOL_RMS)
    variants["torch"] = (lambda: kda_chunked(*args), 0.0)
    fla = _fla()
    if fla is not None:
        variants["fla"] = (lambda: fla(x), FLA_RTOL_RMS)
    else:
        print("fla not importable: the fla row is left out")

    rows = []
    for name, (fn, rtol) in variants.items():
        try:
            o, S = fn()
            torch.cuda.synchronize()
            err = max(rel_rms(o, o_ref), rel_rms(S, S_ref))
            ms = event_times_ms(fn, reps, warmup=warmup)
        except Exception as e:  # a peer (or a sweep config) that fails is reported, not fatal
            print(f"{name} failed at T={T}: {type(e).__name__}: {e}")
            continue
        row = {"T": T, "variant": name, "ms": statistics.median(ms), "ms_min": min(ms),
               "rel_rms_err": err, "correct": err <= rtol}
        if name in configs:
            row.update(_kernel_split_ms(lambda: kda_prefill_triton(*args, config=configs[name], use_pdl=False)))
        rows.append(row)
    torch_ms = next(r["ms"] for r in rows if r["variant"] == "torch")
    for r in rows:
        if r["correct"] and r["variant"] != "torch":
            r["speedup_vs_torch"] = torch_ms / r["ms"]
        r["tokens_per_s"] = T / (r["ms"] * 1e-3)
    return rows


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True,
                        help="folder for kernels_kda_prefill.json and kernels_kda_prefill.md")
    parser.add_argument("--t", type=int, nargs="+", default=[8192], help="prompt lengths (default 8192)")
    parser.add_argument("--heads", type=int, default=8,
                        help="KDA heads of the layer (8: flash-tp4-rank, 32: flash)")
    parser.add_argument("--chunk", type=int, nargs="*", default=[], help="extra chunk sizes to time (16, 32, 64)")
    parser.add_argument("--bv", type=int, nargs="*", default=[16], help="state-walk BV values for the --chunk sweep")
    parser.add_argument("--bv-out", type=int, nargs="*", default=[64], help="output-pass BV values for the sweep")
    parser.add_argument("--warps-out", type=int, nargs="*", default=[4], help="output-pass warps for the sweep")
    parser.add_argument("--warps-chunk", type=int, nargs="*", default=[4], help="chunk-pass warps for the sweep")
    parser.add_argument("--warps-state", type=int, nargs="*", default=[8], help="state-walk warps for the sweep")
    parser.add_argument("--precision", nargs="*", default=["tf32x3"], choices=["tf32x3", "ieee"],
                        help="tl.dot precisions for the --chunk sweep")
    parser.add_argument("--k-split", type=int, nargs="*", default=[1], choices=[1, 2, 4],
                        help="state-walk K splits for the sweep (the state in 1, 2 or 4 parts of K rows)")
    parser.add_argument("--segments", type=int, nargs="*", default=[],
                        help="the table's config with its chunks in these many segments (chunk pass and walk "
                             "overlapped on two streams), each a variant")
    parser.add_argument("--baseline", type=Path, default=None,
                        help="an earlier kernel.py to time beside this one (before/after in one run)")
    parser.add_argument("--reps", type=int, default=20, help="timed calls per variant")
    parser.add_argument("--warmup", type=int, default=3, help="untimed calls per variant first")
    args = parser.parse_args(argv)
    _require_cuda()
    from lingc.runtime.kernels.kda_prefill.kernel import config_for

    if args.baseline is not None and not args.baseline.is_file():
        raise SystemExit(f"--baseline {args.baseline}: no such file")
    baseline = _load_baseline(args.baseline) if args.baseline is not None else None
    sweep = list(itertools.product(args.chunk, args.bv, args.bv_out, args.warps_out, args.warps_chunk,
                                   args.warps_state, args.precision, args.k_split))
    rows = []
    for T in args.t:
        rows += bench_T(T, args.heads, sweep, args.reps, args.warmup, baseline, args.segments)
    all_correct = all(r["correct"] for r in rows)
    if not all_correct:
        bad = [f"T={r['T']} {r['variant']} (rel RMS {r['rel_rms_err']:.2e})" for r in rows if not r["correct"]]
        print("CORRECTNESS CHECK FAILED for: " + "; ".join(bad))
    table = markdown_table(rows, [
        ("T", "T", "d"), ("variant", "variant", "s"), ("ms", "ms/layer", ".3f"), ("ms_min", "min", ".3f"),
        ("chunk_ms", "chunk pass", ".3f"), ("state_ms", "state walk", ".3f"), ("out_ms", "output pass", ".3f"),
        ("speedup_vs_torch", "x vs torch", ".1f"), ("tokens_per_s", "tokens/s", ".3g"),
        ("rel_rms_err", "rel RMS err", ".1e"), ("correct", "correct", "")
    ])
    print(table)
    H = args.heads
    cond = (f"H={H}, K=V={K}, fp32 inputs and state, median of {args.reps} CUDA-event timed calls after "
            f"{args.warmup} warm-up calls, per layer")
    args.out.mkdir(parents=True, exist_ok=True)
    md = args.out / "kernels_kda_prefill.md"
    md.write_text(f"# KDA prefill, one layer\n\n{cond}; table config {config_for(H, K, K)}.\n\n{table}\n")
    path = write_json(args.out / "kernels_kda_prefill.json", {
        "benchmark": "kernels_kda_prefill", "shape": {"H": H, "K": K, "V": K}, "dtype": "float32",
        "table_config": config_for(H, K, K), "rtol_rms": RTOL_RMS, "fla_rtol_rms": FLA_RTOL_RMS,
        "reps": args.reps, "warmup": args.warmup, "all_correct": all_correct, "rows": rows,
    })
    print(f"\nwrote {path} and {md}")
    return 0 if all_correct else 1


if __name__ == "__main__":
    raise SystemExit(main())
