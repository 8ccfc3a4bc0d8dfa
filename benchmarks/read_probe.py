"""Probe: how fast can a chain of kernels stream cold bytes of a decode step's sizes, when each
kernel does nothing but read? The reference the projection GEMMs should be held to.

    python -m benchmarks.read_probe --out DIR [--mb 5.2 26.3 63 200] [--chunk-kb 16 32 64]

The floor of benchmarks.decode divides bytes by the copy bandwidth of a 2 GiB copy. A step's reads
are 2-26 MB each, one kernel after another. Here each call of a CUDA graph is one kernel that
reads one cold copy (rotated over more than 4x L2) of the given size: every CTA loads its whole
chunk (16-byte vectors) before ``gdc_wait``, as a design-B GEMM CTA loads its weights, then
stores one word. Calls are chained with PDL (as lingc's kernels are) or not. Beside them, in
the same run, the lingc decode GEMM on the same bytes (M = 1: flash-tp4-rank's fused KDA
projection for 26.3 MB, its o_proj for 5.2 MB), so the GEMM's gap to a pure read is a ratio
within one run.

Output: a markdown table (us per call, GB/s, share of the copy bandwidth) and JSON.
"""
from __future__ import annotations

import argparse
from pathlib import Path

import torch
import triton
import triton.language as tl

from benchmarks.common import (cold_copies, copy_bandwidth_gbps, environment, markdown_table, require_cuda,
                               time_in_graph, write_json)
from lingc.runtime.pdl import pdl_launch_dependents, pdl_wait

# int32 lanes per 16-byte vector, and per thread per load round.
_VEC = 4


@triton.jit
def _read_kernel(src_ptr, out_ptr, n, CHUNK: tl.constexpr, BLOCK: tl.constexpr, USE_GDC: tl.constexpr):
    """CTA pid reads src[pid * CHUNK : (pid + 1) * CHUNK] (int32 lanes) in CHUNK / BLOCK loads, all
    issued before the wait, folds them with xor and stores one word (so nothing is dead)."""
    base = tl.program_id(0).to(tl.int64) * CHUNK
    acc = tl.zeros([BLOCK], dtype=tl.int32)
    for i in tl.static_range(CHUNK // BLOCK):
        offs = base + i * BLOCK + tl.arange(0, BLOCK)
        acc ^= tl.load(src_ptr + offs, mask=offs < n, other=0)
    pdl_wait(USE_GDC)
    pdl_launch_dependents(USE_GDC)
    tl.store(out_ptr + tl.program_id(0), tl.xor_sum(acc, axis=0))


def read(src: torch.Tensor, out: torch.Tensor, chunk_bytes: int, use_pdl: bool, num_warps: int = 4) -> None:
    """One read kernel over src (int32, contiguous) into out (one int32 per CTA)."""
    chunk = chunk_bytes // 4
    block = min(chunk, _VEC * 32 * num_warps)
    grid = (triton.cdiv(src.numel(), chunk),)
    assert out.numel() >= grid[0]
    _read_kernel[grid](src, out, src.numel(), CHUNK=chunk, BLOCK=block, USE_GDC=use_pdl, num_warps=num_warps,
                       **({"launch_pdl": True} if use_pdl else {}))


def _gemm_case(mb: float):
    """(name, N, K) of the flash-tp4-rank projection with about ``mb`` MB of weights, or None."""
    for name, n, k in (("fused KDA projection", 5128, 2560), ("KDA o_proj", 2560, 1024)):
        if abs(n * k * 2 / 1e6 - mb) / mb < 0.05:
            return name, n, k
    return None


def _row(mb: float, what: str, nbytes: int, us: float, copy_gbps: float) -> dict:
    """One table row: us per call, GB/s and the share of the copy bandwidth for ``nbytes``."""
    gbps = nbytes / (us * 1e3)
    return dict(mb=mb, what=what, us=us, gbps=gbps, pct=100 * gbps / copy_gbps)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--mb", type=float, nargs="+", default=[5.24, 26.25, 63.0, 200.0])
    ap.add_argument("--chunk-kb", type=int, nargs="+", default=[16, 32, 64])
    ap.add_argument("--replays", type=int, default=20)
    args = ap.parse_args(argv)
    dev = require_cuda()
    from lingc.runtime.kernels.gemm.kernel import gemm_triton

    bw = copy_bandwidth_gbps()
    print(f"copy bandwidth {bw:.0f} GB/s", flush=True)
    rows = []
    for mb in args.mb:
        nbytes = int(mb * 1e6) // 16 * 16
        copies = cold_copies(nbytes, minimum=4)
        bufs = [torch.empty(nbytes // 4, dtype=torch.int32, device=dev) for _ in range(copies)]
        out = torch.empty(max(1, nbytes // (min(args.chunk_kb) * 1024)) + 1, dtype=torch.int32, device=dev)
        for chunk_kb in args.chunk_kb:
            for pdl in (True, False):
                t = time_in_graph(lambda b: read(b, out, chunk_kb * 1024, pdl), [(b,) for b in bufs],
                                  replays=args.replays)
                what = f"read, {chunk_kb} KB per CTA" + ("" if pdl else ", no PDL")
                rows.append(_row(mb, what, nbytes, t.us_per_call, bw))
                print(rows[-1], flush=True)
        del bufs
        case = _gemm_case(mb)
        if case is not None:
            name, n, k = case
            wbytes = n * k * 2
            ws = [torch.randn(n, k, device=dev, dtype=torch.bfloat16) for _ in range(cold_copies(wbytes, minimum=4))]
            x = torch.randn(1, k, device=dev, dtype=torch.bfloat16)
            y = torch.empty(1, n, device=dev, dtype=torch.bfloat16)
            t = time_in_graph(lambda w: gemm_triton(x, [w], out=y), [(w,) for w in ws], replays=args.replays)
            rows.append(_row(mb, f"lingc gemm M=1 ({name}, table config)", wbytes, t.us_per_call, bw))
            print(rows[-1], flush=True)
            del ws
        torch.cuda.empty_cache()
    table = markdown_table(rows, [("mb", "MB", ".2f"), ("what", "what", "s"), ("us", "us per call", ".2f"),
                                  ("gbps", "GB/s", ".0f"), ("pct", "% of copy bandwidth", ".0f")])
    print(table)
    args.out.mkdir(parents=True, exist_ok=True)
    write_json(args.out / "read_probe.json", dict(environment=environment(), copy_bandwidth_gbps=bw, rows=rows))
    print(f"wrote {args.out / 'read_probe.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
