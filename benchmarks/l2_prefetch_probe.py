"""Probe: can weights be pulled into L2 while the chain runs latency-bound kernels, so that the
GEMM that needs them later reads L2 instead of HBM? And do they survive the MoE's streaming?

    python -m benchmarks.l2_prefetch_probe --out DIR

One fused KDA projection (5128 x 2560 bf16, 26 MB; cold copies rotated), timed in CUDA graphs of
many iterations, each iteration one of:

- ``spin+gemm``:                  a 6 us spin kernel (the latency-bound stretch), then the GEMM
- ``prefetch+spin+gemm``:         a kernel that issues ``prefetch.global.L2::evict_last`` over the
                                  GEMM's weight and exits, the spin, the GEMM
- ``prefetch+spin+stream+gemm``:  as above with a 26 MB read of other data between (the MoE's
                                  expert weights), loaded ``evict_first`` or normally
- the same sequences without the GEMM, so that the GEMM's share can be read off by difference.

Times are us per iteration (median of graph replays / iterations).
"""
from __future__ import annotations

import argparse
from pathlib import Path

import torch
import triton
import triton.language as tl

from benchmarks.common import cold_copies, copy_bandwidth_gbps, markdown_table, require_cuda, time_in_graph, write_json
from lingc.runtime.kernels.gemm.kernel import gemm_triton

LINE = 128  # bytes per prefetch


@triton.jit
def _prefetch_kernel(ptr, n_lines, PER: tl.constexpr):
    offs = tl.arange(0, 128)
    for i in tl.static_range(PER // 128):
        line = tl.minimum(tl.program_id(0).to(tl.int64) * PER + i * 128 + offs, n_lines - 1)
        p = ptr.to(tl.pointer_type(tl.int8)) + line * 128
        tl.inline_asm_elementwise("prefetch.global.L2::evict_last [$1]; mov.u32 $0, 0;", "=r,l", [p],
                                  dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _spin_kernel(ns):
    t0 = tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=tl.int64, is_pure=False, pack=1)
    t = t0
    while t - t0 < ns:
        t = tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=tl.int64, is_pure=False, pack=1)


@triton.jit
def _stream_kernel(ptr, out_ptr, n, BLOCK: tl.constexpr, EVICT_FIRST: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    if EVICT_FIRST:
        v = tl.load(ptr + offs, mask=offs < n, other=0.0, eviction_policy="evict_first")
    else:
        v = tl.load(ptr + offs, mask=offs < n, other=0.0)
    tl.store(out_ptr + pid, tl.sum(v.to(tl.float32)))


def prefetch(w: torch.Tensor, per: int = 1024):
    lines = w.numel() * w.element_size() // LINE
    _prefetch_kernel[(triton.cdiv(lines, per),)](w, lines, PER=per)


def spin(us: float):
    _spin_kernel[(1,)](int(us * 1000))


def stream(buf: torch.Tensor, out: torch.Tensor, evict_first: bool, block: int = 8192):
    _stream_kernel[(triton.cdiv(buf.numel(), block),)](buf, out, buf.numel(), BLOCK=block, EVICT_FIRST=evict_first)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--spin-us", type=float, default=6.0)
    args = ap.parse_args(argv)
    require_cuda()
    bw = copy_bandwidth_gbps()
    rows_n, k = (1024,) * 5 + (8,), 2560
    wbytes = sum(rows_n) * k * 2
    copies = cold_copies(wbytes)
    gen = torch.Generator(device="cuda").manual_seed(0)
    ws = [torch.randn(sum(rows_n), k, generator=gen, device="cuda").bfloat16() for _ in range(copies)]
    others = [torch.randn(wbytes // 2, generator=gen, device="cuda").bfloat16() for _ in range(copies)]
    sink = torch.empty(1 << 16, device="cuda")
    x = torch.randn(1, k, device="cuda").bfloat16()

    def seq(pre: bool, streaming: str | None, gemm: bool):
        def one(i):
            w = ws[i]
            if pre:
                prefetch(w)
            spin(args.spin_us)
            if streaming:
                stream(others[i], sink, streaming == "evict_first")
            if gemm:
                gemm_triton(x, [w])
        return one

    cases = {
        "spin": seq(False, None, False),
        "spin+gemm": seq(False, None, True),
        "prefetch+spin": seq(True, None, False),
        "prefetch+spin+gemm": seq(True, None, True),
        "spin+stream(evict_first)": seq(False, "evict_first", False),
        "prefetch+spin+stream(evict_first)+gemm": seq(True, "evict_first", True),
        "spin+stream(normal)": seq(False, "normal", False),
        "prefetch+spin+stream(normal)+gemm": seq(True, "normal", True),
    }
    rows = []
    for name, fn in cases.items():
        t = time_in_graph(fn, [(i,) for i in range(copies)], replays=20)
        rows.append({"case": name, "us": t.us_per_call})
        print(f"{name:45s} {t.us_per_call:8.2f} us", flush=True)
    us = {r["case"]: r["us"] for r in rows}
    derived = {
        "gemm cold (spin+gemm - spin)": us["spin+gemm"] - us["spin"],
        "gemm after prefetch": us["prefetch+spin+gemm"] - us["prefetch+spin"],
        "gemm after prefetch + evict_first stream": us["prefetch+spin+stream(evict_first)+gemm"]
        - us["prefetch+spin"] - (us["spin+stream(evict_first)"] - us["spin"]),
        "gemm after prefetch + normal stream": us["prefetch+spin+stream(normal)+gemm"]
        - us["prefetch+spin"] - (us["spin+stream(normal)"] - us["spin"]),
        "gemm floor at copy bandwidth": wbytes / (bw * 1e9) * 1e6,
    }
    for k_, v in derived.items():
        print(f"{k_:45s} {v:8.2f} us")
    print(markdown_table(rows, [("case", "case", "s"), ("us", "us / iteration", ".2f")]))
    write_json(args.out / "l2_prefetch_probe.json", {"copy_gbps": bw, "rows": rows, "derived": derived})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
