"""Probe: does a decode GEMM that streams its weight tiles with Hopper TMA (tensor-memory
accelerator bulk copies, Triton tensor descriptors) read cold weights faster than the lingc GEMM's
per-thread vector loads?

    python -m benchmarks.tma_probe --out DIR [--m 1 6] [--replays 20]

Session 9's Nsight Compute run found the 26 MB fused KDA projection bound by per-SM latency (85%
of cycles with no eligible warp, 37% of DRAM peak) and a pure read of those bytes at 76% of the
copy bandwidth (benchmarks.read_probe). A TMA copy is one instruction per tile, issued by one
thread, landing in shared memory behind an mbarrier, so a CTA can keep more bytes in flight with
fewer instructions. This probe times, in one run on cold weights (rotated over 4x L2, PDL on, one
CUDA graph of many calls): the lingc GEMM at its table config, a pure read of the same bytes
(read_probe's kernel, 16 KB per CTA), and TMA variants of one weight [N, K]:

    CTA (pid_n, pid_k): rows pid_n*BN.., K chunk pid_k; PRE tiles requested before gdc_wait,
    the rest in a pipelined loop of NUM_STAGES; x tile loaded after the wait; tl.dot into fp32.

Split-K variants store their fp32 partials without the last-ticket reduction the lingc GEMM runs
(they are a little flattered: say so beside their rows). Every variant is checked against
``x @ w.T`` before it is timed.
"""
from __future__ import annotations

import argparse
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import triton
import triton.language as tl

from benchmarks.common import (cold_copies, copy_bandwidth_gbps, environment, markdown_table, require_cuda,
                               time_in_graph, write_json)
from lingc.runtime.pdl import pdl_launch_dependents, pdl_wait

SHAPES = {"fused KDA projection": (5128, 2560), "KDA o_proj": (2560, 1024), "fused MLA": (2120, 2560)}


@dataclass(frozen=True)
class TmaVariant:
    block_n: int
    block_k: int
    num_stages: int
    split_k: int = 1
    pre: int = 1  # tiles requested before gdc_wait
    num_warps: int = 4

    @property
    def name(self) -> str:
        return (f"TMA bn{self.block_n} bk{self.block_k} st{self.num_stages} sk{self.split_k} pre{self.pre} "
                f"w{self.num_warps}")


VARIANTS = [
    TmaVariant(64, 128, 4), TmaVariant(64, 128, 4, 2), TmaVariant(32, 128, 4), TmaVariant(32, 128, 6),
    TmaVariant(32, 256, 4), TmaVariant(64, 256, 3), TmaVariant(16, 256, 4), TmaVariant(16, 128, 6),
    TmaVariant(64, 128, 4, pre=2), TmaVariant(32, 128, 4, pre=3), TmaVariant(128, 128, 4, num_warps=8),
    TmaVariant(64, 128, 4, 2, pre=2), TmaVariant(32, 128, 4, 2),
]


@triton.jit
def _tma_gemm_kernel(x_ptr, w_desc, ws_ptr, M, N, K, stride_xm, stride_ws_s, stride_ws_m,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                     K_TILES: tl.constexpr, PRE: tl.constexpr, USE_GDC: tl.constexpr):
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    k0 = pid_k * K_TILES * BLOCK_K
    n0 = pid_n * BLOCK_N
    offs_m = tl.arange(0, BLOCK_M)
    offs_k = k0 + tl.arange(0, BLOCK_K)
    mask_m = offs_m[:, None] < M
    w0 = w_desc.load([n0, k0])
    if PRE > 1:
        w1 = w_desc.load([n0, k0 + BLOCK_K])
    if PRE > 2:
        w2 = w_desc.load([n0, k0 + 2 * BLOCK_K])
    pdl_wait(USE_GDC)
    pdl_launch_dependents(USE_GDC)
    x_ptrs = x_ptr + offs_m[:, None] * stride_xm + offs_k[None, :]
    acc = tl.dot(tl.load(x_ptrs, mask=mask_m & (offs_k[None, :] < K), other=0.0), w0.T)
    if PRE > 1:
        acc = tl.dot(tl.load(x_ptrs + BLOCK_K, mask=mask_m & (offs_k[None, :] + BLOCK_K < K), other=0.0),
                     w1.T, acc)
    if PRE > 2:
        acc = tl.dot(tl.load(x_ptrs + 2 * BLOCK_K, mask=mask_m & (offs_k[None, :] + 2 * BLOCK_K < K), other=0.0),
                     w2.T, acc)
    for i in range(PRE, K_TILES):
        kk = offs_k + i * BLOCK_K
        w = w_desc.load([n0, k0 + i * BLOCK_K])
        x = tl.load(x_ptrs + i * BLOCK_K, mask=mask_m & (kk[None, :] < K), other=0.0)
        acc = tl.dot(x, w.T, acc)
    cols = n0 + tl.arange(0, BLOCK_N)
    tl.store(ws_ptr + pid_k * stride_ws_s + offs_m[:, None] * stride_ws_m + cols[None, :], acc,
             mask=mask_m & (cols[None, :] < N))


def plan(k: int, v: TmaVariant) -> tuple[int, int]:
    """(K tiles per chunk, chunks) of a K under ``v``."""
    tiles = triton.cdiv(k, v.block_k)
    per = max(triton.cdiv(tiles, v.split_k), v.pre)
    return per, triton.cdiv(tiles, per)


def tma_gemm(x: torch.Tensor, desc, n: int, ws: torch.Tensor, v: TmaVariant, use_pdl: bool = True) -> None:
    """fp32 partials ws[s, :M, :N] of x @ w.T (w behind ``desc``), one per K chunk s."""
    from triton.language.extra.cuda import gdc_wait  # noqa: F401  (fails early off CUDA builds)

    m, k = x.shape
    per, chunks = plan(k, v)
    _tma_gemm_kernel[(triton.cdiv(n, v.block_n), chunks)](
        x, desc, ws, m, n, k, x.stride(0), ws.stride(0), ws.stride(1),
        BLOCK_M=16, BLOCK_N=v.block_n, BLOCK_K=v.block_k, K_TILES=per, PRE=v.pre, USE_GDC=use_pdl,
        num_warps=v.num_warps, num_stages=v.num_stages, **({"launch_pdl": True} if use_pdl else {}))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--m", type=int, nargs="+", default=[1, 6])
    ap.add_argument("--replays", type=int, default=20)
    args = ap.parse_args(argv)
    dev = require_cuda()
    from triton.tools.tensor_descriptor import TensorDescriptor

    from benchmarks.read_probe import read
    from lingc.runtime.kernels.gemm.config import config_for
    from lingc.runtime.kernels.gemm.kernel import gemm_triton

    bw = copy_bandwidth_gbps()
    print(f"copy bandwidth {bw:.0f} GB/s", flush=True)
    rows = []

    def row(shape, m, what, us, nbytes, note=""):
        gbps = nbytes / (us * 1e3)
        rows.append(dict(shape=shape, m=m, what=what, us=us, pct=100 * gbps / bw, note=note))
        print(rows[-1], flush=True)

    for shape, (n, k) in SHAPES.items():
        nbytes = n * k * 2
        ws_list = [torch.randn(n, k, device=dev, dtype=torch.bfloat16) for _ in range(cold_copies(nbytes, minimum=4))]
        flat = [w.view(torch.int32).view(-1) for w in ws_list]
        sink = torch.empty(nbytes // 16384 + 2, dtype=torch.int32, device=dev)
        t = time_in_graph(lambda b: read(b, sink, 16384, True), [(b,) for b in flat], replays=args.replays)
        row(shape, 0, "pure read, 16 KB per CTA", t.us_per_call, nbytes)
        for m in args.m:
            x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
            y = torch.empty(m, n, device=dev, dtype=torch.bfloat16)
            t = time_in_graph(lambda w: gemm_triton(x, [w], out=y), [(w,) for w in ws_list], replays=args.replays)
            row(shape, m, f"lingc gemm, table {config_for(n, k)}", t.us_per_call, nbytes)
            ref = (x.float() @ ws_list[0].float().T)
            for v in VARIANTS:
                per, chunks = plan(k, v)
                if per < v.pre or v.block_n > n:
                    continue
                ws = torch.empty(chunks, m, n, device=dev, dtype=torch.float32)
                descs = [TensorDescriptor.from_tensor(w, [v.block_n, v.block_k]) for w in ws_list]
                tma_gemm(x, descs[0], n, ws, v)
                err = ((ws.sum(0) - ref).abs().max() / ref.abs().max()).item()
                if not err < 1e-3:
                    row(shape, m, v.name, float("nan"), nbytes, f"WRONG (rel err {err:.1e})")
                    continue
                t = time_in_graph(lambda d: tma_gemm(x, d, n, ws, v), [(d,) for d in descs], replays=args.replays)
                row(shape, m, v.name, t.us_per_call, nbytes,
                    f"{triton.cdiv(n, v.block_n) * chunks} CTAs" + (", partials not reduced" if chunks > 1 else ""))
        del ws_list, flat
        torch.cuda.empty_cache()
    table = markdown_table(rows, [("shape", "shape", "s"), ("m", "M", "d"), ("what", "what", "s"),
                                  ("us", "us per call", ".2f"), ("pct", "% of copy bandwidth", ".0f"),
                                  ("note", "note", "s")])
    print(table)
    args.out.mkdir(parents=True, exist_ok=True)
    write_json(args.out / "tma_probe.json", dict(environment=environment(), copy_bandwidth_gbps=bw, rows=rows,
                                                 variants=[asdict(v) for v in VARIANTS]))
    print(f"wrote {args.out / 'tma_probe.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
