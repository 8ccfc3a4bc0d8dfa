"""KDA prefill micro-benchmark: lingc's chunked Triton kernels vs PyTorch kda_chunked (and FLA's
chunk_kda as a peer), one layer's prompt.

    python -m benchmarks.kernels_kda_prefill --out benchmarks/results/kda_prefill
        [--t 8192] [--chunk 64 32] [--bv 16 32] [--precision ieee tf32x3]

Shape: one flash-tp4-rank KDA layer (H=8 heads, K=V=128), a T=8192-token prompt, fp32 inputs
(q, k L2-normalised, q scaled by K^-0.5, the bounded gate g in (-5, 0), beta in (0, 1)) and a
random fp32 initial state. Variants:

- ``lingc``            torch.ops.lingc.kda_prefill's kernels at the table config (both launches)
- ``lingc-btB-bvN-P``  the kernels at chunk B, BV = N, tl.dot precision P (``--chunk/--bv/--precision``)
- ``torch``            lingc.models.kda_math.kda_chunked: the model's eager prefill path
- ``fla``              flash-linear-attention's chunk_kda, when importable: q, k, v and beta in
                       bf16 (as FLA's KDA layer feeds it), g and the state in fp32, scale 1 (q
                       arrives scaled), no in-kernel L2 norm. Its error is judged against a bf16
                       tolerance.

Conditions: each variant is run once and checked against kda_chunked first (relative RMS; an
incorrect variant is timed but flagged, and no speedup is printed for it); then timed with CUDA
events, per call, after warm-up calls, median (and min) over repetitions. Prefill calls last
milliseconds, so launch overhead is negligible and no CUDA graph is used. Workspaces are
allocated inside the call, as the op does.
"""
from __future__ import annotations

import argparse
import statistics
from pathlib import Path

import torch

from benchmarks.common import event_times_ms, markdown_table, write_json
from lingc.models.kda_math import kda_chunked, l2norm

H, K = 8, 128
LOWER_BOUND = -5.0
RTOL_RMS = 1e-4          # lingc vs kda_chunked, both fp32
FLA_RTOL_RMS = 2e-2      # FLA on bf16 inputs


def _require_cuda() -> None:
    if not torch.cuda.is_available():
        raise SystemExit("benchmarks.kernels_kda_prefill needs a CUDA device (it times Triton kernels on the "
                         "GPU); none is visible here. Run the CPU tests instead: "
                         "python -m pytest -q tests/test_kda_prefill.py")


def _inputs(T: int, seed: int):
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


def _rel_rms(a, b):
    a, b = a.double(), b.double()
    return ((a - b).pow(2).mean().sqrt() / b.pow(2).mean().sqrt()).item()


def bench_T(T, chunks, bvs, precisions, reps, warmup):
    from lingc.runtime.kernels.kda_prefill import kda_prefill
    from lingc.runtime.kernels.kda_prefill.kernel import KdaPrefillConfig, config_for, kda_prefill_triton

    x = _inputs(T, seed=T)
    args = (x["q"], x["k"], x["v"], x["g"], x["beta"], x["state"])
    o_ref, S_ref = kda_chunked(*args)
    torch.cuda.synchronize()

    variants = {"lingc": (lambda: kda_prefill(*args), RTOL_RMS)}
    for bt in chunks:
        for bv in bvs:
            for prec in precisions:
                cfg = KdaPrefillConfig(chunk=bt, bv=bv, precision=prec)
                variants[f"lingc-bt{bt}-bv{bv}-{prec}"] = (
                    lambda cfg=cfg: kda_prefill_triton(*args, config=cfg), RTOL_RMS)
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
            err = max(_rel_rms(o, o_ref), _rel_rms(S, S_ref))
            ms = event_times_ms(fn, reps, warmup=warmup)
        except Exception as e:  # a peer (or a sweep config) that fails is reported, not fatal
            print(f"{name} failed at T={T}: {type(e).__name__}: {e}")
            continue
        rows.append({"T": T, "variant": name, "ms": statistics.median(ms), "ms_min": min(ms),
                     "rel_rms_err": err, "correct": err <= rtol})
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
    parser.add_argument("--chunk", type=int, nargs="*", default=[], help="extra chunk sizes to time (16, 32, 64)")
    parser.add_argument("--bv", type=int, nargs="*", default=[16], help="BV values for the --chunk sweep")
    parser.add_argument("--precision", nargs="*", default=["ieee"], choices=["ieee", "tf32x3"],
                        help="tl.dot precisions for the --chunk sweep")
    parser.add_argument("--reps", type=int, default=20, help="timed calls per variant")
    parser.add_argument("--warmup", type=int, default=3, help="untimed calls per variant first")
    args = parser.parse_args(argv)
    _require_cuda()
    from lingc.runtime.kernels.kda_prefill.kernel import config_for

    rows = []
    for T in args.t:
        rows += bench_T(T, args.chunk, args.bv, args.precision, args.reps, args.warmup)
    all_correct = all(r["correct"] for r in rows)
    if not all_correct:
        bad = [f"T={r['T']} {r['variant']} (rel RMS {r['rel_rms_err']:.2e})" for r in rows if not r["correct"]]
        print("CORRECTNESS CHECK FAILED for: " + "; ".join(bad))
    table = markdown_table(rows, [
        ("T", "T", "d"), ("variant", "variant", "s"), ("ms", "ms/layer", ".3f"), ("ms_min", "min", ".3f"),
        ("speedup_vs_torch", "x vs torch", ".1f"), ("tokens_per_s", "tokens/s", ".3g"),
        ("rel_rms_err", "rel RMS err", ".1e"), ("correct", "correct", "")
    ])
    print(table)
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
