"""Prompt-chunk MoE experts micro-benchmark: lingc::moe_grouped's kernels vs the library grouped form
(index_select gather, torch._grouped_mm, lingc::moe_swiglu, torch._grouped_mm), one MoE layer.

    python -m benchmarks.kernels_moe_grouped --out benchmarks/results/moe_grouped
        [--tokens 1024 8192] [--block-m 64 128] [--block-n 32 64] [--up-warps 4 8] [--up-stages 3 4]
        [--block-h 64 128] [--down-warps 4 8] [--down-stages 2 3] [--reps 10]

Shape: one flash-tp4-rank MoE layer (E = 512 experts, H = 2560, I = 192, top-8), bf16, a random
routing (8 distinct experts a token, uniform), random weights scaled as the model's. Variants:

- ``library``   what `Experts.forward_grouped` runs with GROUPED_GEMM = "library"
- ``lingc``     the launch table (``CONFIG``)
- ``lingc-mM-nN-uwW-usS-hB-dwD-dsE``  each other point of the up-GEMM sweep (block_m M, block_n
                N, W warps, S stages; the table's down-GEMM) and of the down-GEMM sweep (block_h
                B, D warps, E stages; the table's up-GEMM at block_m M)

Each variant runs once and is checked against the library's output (relative RMS; a wrong variant
is timed but flagged); then each piece (gather / block table, up-GEMM, SwiGLU, down-GEMM) and the
whole are timed with CUDA events, per call, after warm-up, median over repetitions. A layer's
experts are 1.5 GB, far past L2, so every call reads its weights from HBM. The floor beside each
time is the bytes a call must move (the chosen experts' weights, x once, the pair outputs written)
over the copy bandwidth measured in the same run.
"""
from __future__ import annotations

import argparse
import itertools
import statistics
from dataclasses import replace
from pathlib import Path

import torch

from benchmarks.common import copy_bandwidth_gbps, event_times_ms, markdown_table, require_cuda, write_json

E, H, INTER, TOP_K = 512, 2560, 192, 8
RTOL_RMS = 1e-2


def _inputs(tokens: int, seed: int):
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(tokens, H, device="cuda", generator=g).bfloat16()
    ids = torch.rand(tokens, E, device="cuda", generator=g).argsort(dim=1)[:, :TOP_K]
    flat = ids.reshape(-1)
    order = torch.argsort(flat, stable=True)
    ends = torch.bincount(flat, minlength=E).cumsum(0).to(torch.int32)
    w13 = (torch.randn(E, 2 * INTER, H, device="cuda", generator=g) * H ** -0.5).bfloat16()
    w2 = (torch.randn(E, H, INTER, device="cuda", generator=g) * INTER ** -0.5).bfloat16()
    return x, ids, order, ends, w13, w2


def _median(fn, reps: int) -> float:
    return statistics.median(event_times_ms(fn, reps, warmup=2))


def _library(x, order, ends, w13, w2):
    from lingc.runtime.kernels.moe_swiglu import moe_swiglu
    xs = x.index_select(0, order // TOP_K)
    h = torch._grouped_mm(xs, w13.transpose(1, 2), offs=ends)
    return torch._grouped_mm(moe_swiglu(h, 0.0), w2.transpose(1, 2), offs=ends)


def time_library(x, order, ends, w13, w2, reps: int) -> dict:
    from lingc.runtime.kernels.moe_swiglu import moe_swiglu
    xs = x.index_select(0, order // TOP_K)
    h = torch._grouped_mm(xs, w13.transpose(1, 2), offs=ends)
    a = moe_swiglu(h, 0.0)
    return {
        "gather_ms": _median(lambda: x.index_select(0, order // TOP_K), reps),
        "up_ms": _median(lambda: torch._grouped_mm(xs, w13.transpose(1, 2), offs=ends), reps),
        "swiglu_ms": _median(lambda: moe_swiglu(h, 0.0), reps),
        "down_ms": _median(lambda: torch._grouped_mm(a, w2.transpose(1, 2), offs=ends), reps),
        "total_ms": _median(lambda: _library(x, order, ends, w13, w2), reps),
    }


def time_lingc(x, order, ends, w13, w2, cfg, reps: int) -> tuple[dict, torch.Tensor]:
    from lingc.runtime.kernels.moe_grouped.kernel import block_table, grouped_down, grouped_up, moe_grouped_triton
    P = order.numel()
    act = torch.empty(P, INTER, device="cuda", dtype=x.dtype)
    out = torch.empty(P, H, device="cuda", dtype=x.dtype)
    table = block_table(ends, P, cfg.block_m)
    ys = moe_grouped_triton(x, order, ends, w13, w2, 0.0, TOP_K, config=cfg)
    return {
        "gather_ms": _median(lambda: block_table(ends, P, cfg.block_m, table), reps),
        "up_ms": _median(lambda: grouped_up(x, order, table, w13, act, 0.0, TOP_K, cfg), reps),
        "swiglu_ms": 0.0,
        "down_ms": _median(lambda: grouped_down(act, table, w2, out, cfg), reps),
        "total_ms": _median(lambda: moe_grouped_triton(x, order, ends, w13, w2, 0.0, TOP_K, config=cfg), reps),
    }, ys


def _name(cfg, base) -> str:
    if cfg == base:
        return "lingc"
    return (f"lingc-m{cfg.block_m}-n{cfg.block_n}-uw{cfg.up_warps}-us{cfg.up_stages}-h{cfg.block_h}"
            f"-dw{cfg.down_warps}-ds{cfg.down_stages}")


def variants(args, base) -> list:
    """The table's config, then the up-GEMM sweep (the table's down-GEMM) and the down-GEMM sweep
    (the table's up-GEMM), each block_m of --block-m."""
    out = [base]
    for m, n, w, s in itertools.product(args.block_m, args.block_n, args.up_warps, args.up_stages):
        out.append(replace(base, block_m=m, block_n=n, up_warps=w, up_stages=s))
    for m, h, w, s in itertools.product(args.block_m, args.block_h, args.down_warps, args.down_stages):
        out.append(replace(base, block_m=m, block_h=h, down_warps=w, down_stages=s))
    return list(dict.fromkeys(out))     # each once, in order


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, nargs="+", default=[1024, 8192])
    ap.add_argument("--block-m", type=int, nargs="+", default=[64])
    ap.add_argument("--block-n", type=int, nargs="+", default=[64])
    ap.add_argument("--up-warps", type=int, nargs="+", default=[4])
    ap.add_argument("--up-stages", type=int, nargs="+", default=[4])
    ap.add_argument("--block-h", type=int, nargs="+", default=[128])
    ap.add_argument("--down-warps", type=int, nargs="+", default=[4])
    ap.add_argument("--down-stages", type=int, nargs="+", default=[3])
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    require_cuda()
    import lingc.runtime.kernels.moe_grouped  # noqa: F401
    from lingc.runtime.kernels.moe_grouped.kernel import CONFIG

    gbps = copy_bandwidth_gbps()
    print(f"copy bandwidth {gbps:.0f} GB/s")
    rows = []
    for tokens in args.tokens:
        x, ids, order, ends, w13, w2 = _inputs(tokens, seed=tokens)
        chosen = int((torch.bincount(ids.reshape(-1), minlength=E) > 0).sum())
        P = tokens * TOP_K
        need = chosen * 3 * INTER * H * 2 + x.numel() * 2 + P * H * 2
        floor_ms = need / (gbps * 1e9) * 1e3
        want = _library(x, order, ends, w13, w2).float()
        timed = [("library", time_library(x, order, ends, w13, w2, args.reps), want)]
        for cfg in variants(args, CONFIG):
            try:
                t, ys = time_lingc(x, order, ends, w13, w2, cfg, args.reps)
            except Exception as exc:     # e.g. a tile past the SM's shared memory: report, go on
                print(f"  {tokens} tokens {_name(cfg, CONFIG)}: failed: {type(exc).__name__}: {str(exc)[:200]}")
                continue
            timed.append((_name(cfg, CONFIG), t, ys.float()))
        lib_total = timed[0][1]["total_ms"]
        for name, t, ys in timed:
            err = float((ys - want).pow(2).mean().sqrt() / want.pow(2).mean().sqrt())
            row = {"tokens": tokens, "variant": name, **t, "floor_ms": floor_ms, "x_floor": t["total_ms"] / floor_ms,
                   "vs_library": lib_total / t["total_ms"], "rel_rms": err, "ok": "yes" if err < RTOL_RMS else "WRONG",
                   "experts": chosen}
            rows.append(row)
            print(f"  {tokens} tokens {name}: {t['total_ms']:.3f} ms (gather/table {t['gather_ms']:.3f}, up "
                  f"{t['up_ms']:.3f}, swiglu {t['swiglu_ms']:.3f}, down {t['down_ms']:.3f}), floor {floor_ms:.3f} ms "
                  f"({row['x_floor']:.2f}x), {row['vs_library']:.2f}x the library, rel rms {err:.1e}"
                  + ("" if row["ok"] == "yes" else "  WRONG"))
        del x, w13, w2
        torch.cuda.empty_cache()
    cols = [("tokens", "tokens", "d"), ("variant", "variant", "s"), ("total_ms", "ms", ".3f"),
            ("up_ms", "up ms", ".3f"), ("down_ms", "down ms", ".3f"), ("gather_ms", "gather/table ms", ".3f"),
            ("floor_ms", "floor ms", ".3f"), ("x_floor", "x floor", ".2f"), ("vs_library", "vs library", ".2f"),
            ("ok", "correct", "s")]
    print()
    print(markdown_table(rows, cols))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "kernels_moe_grouped.json", {"copy_gbps": gbps, "rows": rows, "argv": vars(args)})
    print(f"wrote {out / 'kernels_moe_grouped.json'}")


if __name__ == "__main__":
    main()
