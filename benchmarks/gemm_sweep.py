"""Sweep launch configurations of the decode GEMM (and the lm_head GEMM + argmax) on the GPU, to
fill the fixed tables in runtime/kernels/gemm/config.py (tuning happens here, never on the
captured path).

    python -m benchmarks.gemm_sweep --out benchmarks/results [--preset flash-tp4-rank]
                                    [--shapes "MLA kv_a" ...] [--m 1 6]

For each shape of ``benchmarks.kernels_gemm.SHAPES`` (fused groups as their weight lists, since
the column blocks depend on the list) the candidates are the table's config first, then design
B variants (whole chunk before gdc_wait: block_n x chunk 256 or 512) and design A variants
(pipelined K loop: block_n, split_k, block_k, stages), fewer of the design that cannot win
(A below ~12 MB, B above), and design C variants (whole weight rows per CTA on CUDA cores: rows,
warps, x look-ahead; fastest at M = 1, slow at M = 6, session 10). Each candidate is checked against the reference first, then timed as
in kernels_gemm (cold weights, CUDA graph of many calls, PDL on). The best per (shape, M) is
marked, and the config with the least total time over the swept M values (the table cannot
depend on M) is printed as a table entry to paste.
"""
from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

import torch
import triton

from benchmarks.common import cold_copies, copy_bandwidth_gbps, markdown_table, require_cuda, time_in_graph, write_json
from benchmarks.kernels_gemm import LM_HEAD, SHAPES
from lingc.runtime.kernels.gemm import gemm_reference
from lingc.runtime.kernels.gemm.argmax_kernel import gemm_argmax_triton
from lingc.runtime.kernels.gemm.config import GemmConfig, _a, _b, _c, argmax_config_for, config_for
from lingc.runtime.kernels.gemm.kernel import gemm_triton

SMALL_BYTES = 12 * 1024**2  # design B territory below (config.py)


def candidates(n: int, k: int) -> list[GemmConfig]:
    """The table's config, then B, A and C variants around it (deduplicated, table first): up
    to 17 for a small weight, 25 for a large one."""
    def b(block_n, chunk, num_warps=4):
        return _b(block_n, triton.cdiv(k, chunk), num_warps)

    # No split (split_k 1): no partials, no ticket, so no L2 round trips after the dot: thin
    # blocks (16-32 rows) make the CTAs instead, each reading whole rows.
    no_split = [_a(16, 1), _a(16, 1, block_k=256, num_stages=3), _a(32, 1, block_k=256, num_stages=3)]
    # Design C (whole rows per CTA, CUDA cores, no split) and, for large weights, design-B chunks
    # of 16 KB: the CTA size at which a chain of pure reads streamed fastest (read_probe.py).
    # With and without the x look-ahead; 32-64 K values of a row per thread.
    gemv = [_c(4), _c(4, 4, 2), _c(4, 8, 2), _c(8, 8, 2), _c(2, 4, 2), _c(2, 2, 2)]
    if n * k * 2 <= SMALL_BYTES:
        out = [b(16, 256), b(32, 256), b(32, 512), b(64, 256), b(64, 512, 8), _a(32, 2), _a(64, 2)] + gemv
        out += [b(16, k), b(16, k, 8), b(32, k, 8)] if k <= 1024 else []
        out += no_split
    else:
        out = [b(32, 512), b(64, 256), b(64, 512, 8), _a(32, 1), _a(32, 2), _a(64, 1), _a(64, 2), _a(64, 4),
               _a(128, 1, num_warps=8), _a(128, 2, num_warps=8), _a(64, 1, block_k=256, num_stages=3),
               _a(64, 2, block_k=64, num_stages=6), _a(64, 2, num_warps=8), _a(64, 4, num_warps=8),
               _a(32, 2, num_warps=8, num_stages=6), _a(64, 2, block_k=64, num_stages=8, num_warps=8)] + no_split
        out += [b(32, 256), b(16, 512)] + gemv
    # A chunks of at least 4 tiles (fewer leave the pipeline empty).
    out = [c for c in out if c.prefetch or c.gemv or triton.cdiv(k, c.block_k) >= 4 * c.split_k]
    return _unique([config_for(n, k)] + out)


def argmax_candidates(n: int, k: int) -> list[GemmConfig]:
    """The table's argmax config, then K-loop variants (gemm_argmax has no split-K)."""
    # Fewer stages and thinner blocks use less shared memory per CTA, so more CTAs are resident
    # and the last wave is fuller (the lm_head table entry runs 614 CTAs of 80 KB: ~2 per SM).
    return _unique([argmax_config_for(n, k), _a(32, 1), _a(64, 1), _a(64, 1, block_k=256, num_stages=3),
                    _a(64, 1, num_stages=3), _a(64, 1, num_stages=5), _a(128, 1, num_warps=8),
                    _a(64, 1, block_k=64, num_stages=6), _a(16, 1), _a(16, 1, block_k=256, num_stages=3),
                    _a(32, 1, num_stages=3), _a(32, 1, block_k=256, num_stages=3), _a(32, 1, num_stages=2),
                    _a(64, 1, num_stages=2), _a(64, 1, num_warps=8), _a(64, 1, num_warps=8, num_stages=3),
                    _a(128, 1, num_warps=8, num_stages=3), _a(32, 1, block_k=64, num_stages=6)])


def _unique(configs: list[GemmConfig]) -> list[GemmConfig]:
    seen, out = set(), []
    for c in configs:
        if c not in seen:
            seen.add(c)
            out.append(c)
    return out


def name_of(c: GemmConfig) -> str:
    if c.gemv:
        return f"C rows{c.block_n} w{c.num_warps}{' ahead' if c.num_stages > 1 else ''}"
    if c.prefetch:
        return f"B bn{c.block_n} sk{c.split_k} w{c.num_warps}"
    return f"A bn{c.block_n} sk{c.split_k} bk{c.block_k} st{c.num_stages} w{c.num_warps}"


def _rel(a, b):
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm()).item()


def sweep_shape(label, k, rows, ms, copy_gbps, argmax=False, hot=False):
    n = sum(rows)
    wbytes = n * k * 2
    gen = torch.Generator(device="cuda").manual_seed(0)
    sets = [[(torch.randn(r, k, generator=gen, device="cuda") / k**0.5).bfloat16() for r in rows]
            for _ in range(1 if hot else cold_copies(wbytes))]
    cands = argmax_candidates(n, k) if argmax else candidates(n, k)
    results = []
    for m in ms:
        x = torch.randn(m, k, generator=gen, device="cuda").bfloat16()
        ref = gemm_reference(x, sets[0]).float()
        best = None
        for cfg in cands:
            if argmax:
                fn = (lambda c: lambda x, ws: gemm_argmax_triton(x, ws[0], config=c))(cfg)
                ids = fn(x, sets[0])[0]
                picked = ref.gather(1, ids[:, None])[:, 0]
                err = (ref.max(dim=1).values - picked).max().item() / ref.abs().max().item()
                ok = err <= 2 * 2.0**-7
            else:
                fn = (lambda c: lambda x, ws: gemm_triton(x, ws, config=c))(cfg)
                err = _rel(fn(x, sets[0]), ref)
                ok = err <= 4e-3
            row = {"shape": label, "N": n, "K": k, "M": m, "config": name_of(cfg), "cfg": cfg, "err": err}
            if ok:
                t = time_in_graph(fn, [(x, ws) for ws in sets], replays=20, calls_per_graph=40 if hot else None)
                row.update(us=t.us_per_call, frac=wbytes / (t.us_per_call * 1e-6) / 1e9 / copy_gbps)
                if best is None or t.us_per_call < best["us"]:
                    best = row
            results.append(row)
        if best is not None:
            best["best"] = "*"
    del sets
    torch.cuda.empty_cache()
    return results


def table_entry(rows, ms):
    """The config with the least total time over ``ms`` (None if none was correct at every M)."""
    totals = {}
    for r in rows:
        if r.get("us") is not None:
            totals.setdefault(r["cfg"], {})[r["M"]] = r["us"]
    full = {c: sum(t.values()) for c, t in totals.items() if set(t) == set(ms)}
    return min(full, key=full.get) if full else None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--preset", choices=sorted(SHAPES), default="flash-tp4-rank")
    ap.add_argument("--shapes", nargs="+", help="shape names of the preset (default: all, and the lm_head)")
    ap.add_argument("--m", type=int, nargs="+", default=[1, 6])
    ap.add_argument("--hot", action="store_true",
                    help="one weight copy, read again by every call (L2-resident where it fits): what the "
                         "kernel does when HBM is not the limit")
    args = ap.parse_args(argv)
    require_cuda()
    copy_gbps = copy_bandwidth_gbps()
    shapes = {name: (k, rows, False) for name, (k, rows) in SHAPES[args.preset].items()}
    k_lm, n_lm = LM_HEAD[args.preset]
    shapes["lm_head argmax"] = (k_lm, (n_lm,), True)
    if args.shapes:
        unknown = sorted(set(args.shapes) - set(shapes))
        if unknown:
            raise SystemExit(f"unknown --shapes {unknown}; choose from {sorted(shapes)}")
        shapes = {s: shapes[s] for s in args.shapes}

    rows, entries = [], []
    for label, (k, wrows, argmax) in shapes.items():
        shape_rows = sweep_shape(label, k, wrows, args.m, copy_gbps, argmax, args.hot)
        rows += shape_rows
        best = table_entry(shape_rows, args.m)
        table = "ARGMAX_CONFIGS" if argmax else "CONFIGS"
        entries.append(f"{table}[({sum(wrows)}, {k})] = {best!r}  # {label}")
    print(f"copy bandwidth {copy_gbps:.0f} GB/s")
    print(markdown_table(rows, [("shape", "shape", "s"), ("N", "N", "d"), ("K", "K", "d"), ("M", "M", "d"),
                                ("config", "config", "s"), ("us", "us/call", ".2f"), ("frac", "of copy BW", ".0%"),
                                ("err", "err", ".1e"), ("best", "best", "s")]))
    print("\nbest over M (first row of each shape is the current table):\n" + "\n".join(entries))
    for r in rows:
        r["cfg"] = dataclasses.asdict(r["cfg"])   # so a table can be rebuilt from the JSON
    name = f"gemm_sweep_{args.preset}{'_hot' if args.hot else ''}.json"
    write_json(args.out / name, {"copy_gbps": copy_gbps, "rows": rows, "entries": entries})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
