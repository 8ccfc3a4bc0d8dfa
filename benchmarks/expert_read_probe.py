"""Probe: does the MoE up-GEMM lose bandwidth to its weights' layout?

    python -m benchmarks.expert_read_probe --out DIR [--experts 9 40] [--tiles 64x256 32x512 16x1024]

In a verify step (T = 6) the up-GEMM reads ~40 experts' gate/up weights, 79 MB, at about 73% of
the copy bandwidth, where a chain of pure contiguous reads of that size reaches ~90%
(``benchmarks.read_probe``). Each of its CTAs reads a [64 rows, 256 columns] bf16 tile of one
expert's row-interleaved w13 [2I, H]: 64 runs of 512 bytes at a 5 KB stride. This probe reads
the same bytes with the same grid, (split_k, n_tiles, experts), the expert of each block taken
from an id tensor after the PDL wait as the up-GEMM does, in two layouts:

- ``strided``: the model's layout, the tile's rows at H's stride (what the up-GEMM reads now);
- ``blocked``: each CTA's tile contiguous (a one-time re-layout of each expert in place would
  give this), 32 KB in one run.

``--tiles`` varies the tile's shape at the same bytes (rows x bf16 columns: 64 x 256 is the
up-GEMM's, 32 x 512 and 16 x 1024 read longer runs with the model's layout as it is).

Both load the whole tile in one shot (as the up-GEMM's one-load design), fold it with xor and
store one word. The expert sets rotate over a pool of 512 experts (1 GB), so reads are cold. A
ratio between the two layouts within one run is the answer (the decode profile gives the
up-GEMM's own time on ~40 experts); the table gives us per call, GB/s and the share of the copy
bandwidth.
"""
from __future__ import annotations

import argparse
from pathlib import Path

import torch
import triton
import triton.language as tl

from benchmarks.common import copy_bandwidth_gbps, environment, markdown_table, require_cuda, time_in_graph, write_json
from lingc.runtime.pdl import pdl_launch_dependents, pdl_wait

_POOL = 512          # Ling-3's routed experts: the rotation's pool


@triton.jit
def _expert_read_kernel(w_ptr, ids_ptr, out_ptr, expert_stride, row_stride,
                        ROWS: tl.constexpr, COLS: tl.constexpr, N_TILES: tl.constexpr, SPLIT_K: tl.constexpr,
                        BLOCKED: tl.constexpr, USE_GDC: tl.constexpr):
    """CTA (k, n, b) reads one [ROWS, COLS] int32 tile of expert ids[b]'s weights: rows
    n * ROWS.., columns k * COLS.. at ``row_stride`` (strided), or the (n, k)-th contiguous run
    of ROWS * COLS lanes (blocked). The id is read after the wait, as the up-GEMM's routed CTAs."""
    k = tl.program_id(0)
    n = tl.program_id(1)
    b = tl.program_id(2)
    pdl_wait(USE_GDC)
    pdl_launch_dependents(USE_GDC)
    e = tl.load(ids_ptr + b).to(tl.int64)
    base = w_ptr + e * expert_stride
    r = tl.arange(0, ROWS)[:, None]
    c = tl.arange(0, COLS)[None, :]
    if BLOCKED:
        offs = (n * SPLIT_K + k).to(tl.int64) * (ROWS * COLS) + r * COLS + c
    else:
        offs = (n * ROWS + r).to(tl.int64) * row_stride + k * COLS + c
    tile = tl.load(base + offs)
    folded = tl.xor_sum(tl.xor_sum(tile, axis=1), axis=0)
    tl.store(out_ptr + (b * N_TILES + n) * SPLIT_K + k, folded)


def expert_read(w: torch.Tensor, ids: torch.Tensor, out: torch.Tensor, *, chunk_k: int, rows: int,
                blocked: bool, use_pdl: bool = True) -> None:
    """Read the tiles of experts ``ids`` of w [E, 2I, H] (bf16 viewed as int32 lanes) as the
    up-GEMM's grid does; ``chunk_k`` bf16 columns and ``rows`` weight rows per CTA."""
    e, n_rows, h = w.shape
    if h % chunk_k or n_rows % rows:
        raise ValueError(f"w {tuple(w.shape)}: H must be whole chunks of {chunk_k} and 2I whole tiles of {rows} rows")
    lanes = w.view(torch.int32)
    split_k, n_tiles = h // chunk_k, n_rows // rows
    grid = (split_k, n_tiles, ids.numel())
    assert out.numel() >= split_k * n_tiles * ids.numel()
    _expert_read_kernel[grid](lanes, ids, out, lanes.stride(0), lanes.stride(1), ROWS=rows, COLS=chunk_k // 2,
                              N_TILES=n_tiles, SPLIT_K=split_k, BLOCKED=blocked, USE_GDC=use_pdl, num_warps=4,
                              **({"launch_pdl": True} if use_pdl else {}))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--experts", type=int, nargs="+", default=[9, 40],
                    help="experts read per call (9: one token's top-8 + shared; 40: a verify step's)")
    ap.add_argument("--tiles", nargs="+", default=["64x256", "32x512", "16x1024", "64x512"],
                    help="weight rows x bf16 columns per CTA (the up-GEMM's: 64x256)")
    ap.add_argument("--intermediate", type=int, default=192, help="I (flash-tp4-rank: 192; w13 has 2I rows)")
    ap.add_argument("--hidden", type=int, default=2560)
    ap.add_argument("--calls", type=int, default=40, help="expert sets rotated per graph")
    ap.add_argument("--replays", type=int, default=20)
    args = ap.parse_args(argv)
    dev = require_cuda()
    bw = copy_bandwidth_gbps()
    print(f"copy bandwidth {bw:.0f} GB/s", flush=True)
    w = torch.randn(_POOL, 2 * args.intermediate, args.hidden, device=dev, dtype=torch.bfloat16)
    gen = torch.Generator(device="cpu").manual_seed(0)
    rows = []
    for n_exp in args.experts:
        id_sets = [torch.randperm(_POOL, generator=gen)[:n_exp].to(torch.int32).to(dev) for _ in range(args.calls)]
        nbytes = n_exp * w[0].numel() * 2
        for tile in args.tiles:
            n_rows, chunk_k = (int(v) for v in tile.split("x"))
            out = torch.empty(n_exp * (args.hidden // chunk_k) * (2 * args.intermediate // n_rows),
                              dtype=torch.int32, device=dev)
            for blocked in (False, True):
                t = time_in_graph(lambda ids: expert_read(w, ids, out, chunk_k=chunk_k, rows=n_rows,
                                                          blocked=blocked),
                                  [(ids,) for ids in id_sets], replays=args.replays)
                gbps = nbytes / (t.us_per_call * 1e3)
                rows.append(dict(experts=n_exp, mb=nbytes / 1e6, tile=tile, kb_per_cta=n_rows * chunk_k * 2 / 1024,
                                 layout="blocked" if blocked else "strided", us=t.us_per_call, gbps=gbps,
                                 pct=100 * gbps / bw))
                print(rows[-1], flush=True)
    table = markdown_table(rows, [("experts", "experts", "d"), ("mb", "MB", ".1f"), ("tile", "tile (rows x cols)", "s"),
                                  ("kb_per_cta", "KB per CTA", ".0f"),
                                  ("layout", "layout", "s"), ("us", "us per call", ".2f"), ("gbps", "GB/s", ".0f"),
                                  ("pct", "% of copy bandwidth", ".0f")])
    print(table)
    args.out.mkdir(parents=True, exist_ok=True)
    write_json(args.out / "expert_read_probe.json", dict(environment=environment(), copy_bandwidth_gbps=bw,
                                                          rows=rows))
    print(f"wrote {args.out / 'expert_read_probe.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
