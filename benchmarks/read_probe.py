"""Probe: how fast can a chain of kernels stream cold bytes of a decode step's sizes, when each
kernel does nothing but read? The reference the projection GEMMs should be held to.

    python -m benchmarks.read_probe --out DIR [--mb 5.2 26.3 63 200] [--chunk-kb 16 32 64] [--warps 4 8]
        [--library]

The floor of benchmarks.decode divides bytes by the copy bandwidth of a 2 GiB copy. A step's reads
are 2-26 MB each, one kernel after another. Here each call of a CUDA graph is one kernel that
reads one cold copy (rotated over more than 4x L2) of the given size: every CTA loads its whole
chunk (16-byte vectors) before ``gdc_wait``, as a design-B GEMM CTA loads its weights, then
stores one word. Calls are chained with PDL (as lingc's kernels are) or not. Beside them, in
the same run, the lingc kernel on the same bytes (M = 1: flash-tp4-rank's fused KDA projection
for 26.3 MB, the fused MLA projection for 10.9 MB, the dense MLP's SwiGLU GEMM for 15.7 MB, the
KDA o_proj for 5.2 MB), so the kernel's gap to a pure read is a ratio within one run. `--warps`
varies the read CTA's warps; `--library` adds torch's own read of the same copies (an int64
sum, which cannot start before the kernel ahead of it ends).

Output: a markdown table (us per call, GB/s, share of the copy bandwidth) and JSON.

    python -m benchmarks.read_probe --out DIR --step DECODE_JSON [--mode lingc|lingc-nextn]

The step's shape instead (``step_reads``): a JSON of ``benchmarks.decode --profile`` gives the
mode's kernels per step and each layer's floor bytes. The probe chains as many pure reads as the
step has kernels, each layer's bytes read by ONE of its kernels and the rest reading one vector,
the bytes outside the layers (the lm_head's) by the lm_head argmax kernels, in one CUDA graph.
That is a lower bound for any chain of that many kernels over those bytes at this granularity:
no kernel does more than read, and a layer's bytes come in the largest, most efficient read.
"""
from __future__ import annotations

import argparse
import json
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


# A read that stands for a kernel with (almost) nothing to read: one 16-byte vector.
_TINY_BYTES = 16


def step_reads(path: Path, mode: str) -> tuple[list[int], dict]:
    """(bytes per kernel, in the order the step runs them; facts) for ``mode`` of a decode JSON
    written with ``--profile``: per graph of the mode (plain: decode; the relay: draft, verify,
    extend), each layer's floor bytes on its first kernel and ``_TINY_BYTES`` on the others; the
    step's floor bytes beyond its layers' (the lm_head's) split evenly over the lm_head argmax
    kernels. Raises ValueError when a graph's kernels do not cut into its floor list's layers."""
    from benchmarks.layer_chains import load, split_layers

    data = json.loads(Path(path).read_text())
    res = data.get("results", {}).get(mode)
    if res is None:
        raise ValueError(f"{path}: no mode {mode!r}; it has {sorted(data.get('results', {}))}")
    bw = data["copy_bandwidth_gbps"]
    graphs = list(res.get("layer_floor_us") or {})
    if not graphs:
        raise ValueError(f"{path}: mode {mode!r} has no layer floors (run benchmarks.decode with --profile)")
    reads, heads, layer_bytes = [], [], 0
    for graph in graphs:
        seq, floors, _ = load(path, mode, graph)
        layers, _ = split_layers(seq)
        if len(layers) != len(floors):
            raise ValueError(f"{path}: {mode} {graph}: {len(layers)} layer segments against {len(floors)} floors")
        first = {id(layer[0]): int(us * bw * 1e3) for layer, (_, us) in zip(layers, floors)}
        layer_bytes += sum(first.values())
        for k in seq:
            if k["kernel"].startswith("_gemm_argmax"):
                heads.append(len(reads))
            reads.append(first.get(id(k), _TINY_BYTES))
    step_bytes = int(res["floor_ms"] * bw * 1e6)
    rest = max(0, step_bytes - layer_bytes)
    for i in heads:
        reads[i] = max(_TINY_BYTES, rest // len(heads))
    if not heads and rest:
        raise ValueError(f"{path}: {mode} reads {rest} bytes outside its layers and has no lm_head argmax kernel")
    facts = dict(mode=mode, graphs=graphs, kernels=len(reads), bytes=sum(reads), floor_ms=res["floor_ms"],
                 step_wall_ms=res.get("wall_ms"), json_copy_bandwidth_gbps=bw)
    return reads, facts


def run_step_chain(reads: list[int], chunk_kb: int, replays: int) -> float:
    """ms of one chain of pure reads of these sizes (each from its own buffer: the step's bytes
    exceed L2 many times over, so every replay reads cold), PDL-chained, in one CUDA graph."""
    dev = require_cuda()
    # Every buffer a whole number of 64-byte blocks: one Triton specialisation of n (divisible
    # by 16) for all reads, compiled by time_in_graph's warm-up, none inside the capture.
    bufs = [torch.empty(-(-n // 64) * 16, dtype=torch.int32, device=dev) for n in reads]
    out = torch.empty(max(b.numel() for b in bufs) // (chunk_kb * 256) + 1, dtype=torch.int32, device=dev)
    t = time_in_graph(lambda b: read(b, out, chunk_kb * 1024, True), [(b,) for b in bufs], replays=replays)
    return t.us_per_call * len(bufs) / 1e3


def step_record(facts: dict, bw: float, chain_ms: dict) -> dict:
    """The JSON of one --step run: the step's facts (its floor as its JSON measured it, under
    ``floor_ms``) beside this run's copy bandwidth, the floor at it, and the chain times."""
    return dict(environment=environment(), copy_bandwidth_gbps=bw, floor_ms_here=facts["bytes"] / (bw * 1e6),
                chain_ms=chain_ms, **facts)


def _step_main(args) -> int:
    reads, facts = step_reads(args.step, args.mode)
    bw = copy_bandwidth_gbps()
    floor_ms = facts["bytes"] / (bw * 1e6)
    ms = {kb: run_step_chain(reads, kb, args.replays) for kb in args.chunk_kb}
    best = min(ms, key=ms.get)
    wall = facts["step_wall_ms"]
    print(f"copy bandwidth {bw:.0f} GB/s; {facts['mode']} ({', '.join(facts['graphs'])}): {facts['kernels']} kernels, "
          f"{facts['bytes'] / 1e9:.2f} GB, floor {floor_ms:.3f} ms here")
    for kb, t in ms.items():
        print(f"  pure-read chain, {kb} KB per CTA: {t:.3f} ms ({t / floor_ms:.2f}x floor)")
    if wall:
        print(f"  the step in {args.step}: {wall:.3f} ms wall ({wall / facts['floor_ms']:.2f}x its floor); "
              f"the best pure-read chain is {ms[best] / floor_ms:.2f}x")
    args.out.mkdir(parents=True, exist_ok=True)
    write_json(args.out / "read_probe_step.json", step_record(facts, bw, ms))
    print(f"wrote {args.out / 'read_probe_step.json'}")
    return 0


# flash-tp4-rank's weights of about these sizes, and the lingc kernel that reads them at M = 1.
_GEMM_CASES = (("fused KDA projection", 5128, 2560, "gemm"), ("fused MLA projection", 2120, 2560, "gemm"),
               ("dense MLP gate/up, SwiGLU", 3072, 2560, "swiglu"), ("KDA o_proj", 2560, 1024, "gemm"))


def _gemm_case(mb: float):
    """(name, N, K, kernel) of the flash-tp4-rank weight with about ``mb`` MB, or None."""
    for name, n, k, kernel in _GEMM_CASES:
        if abs(n * k * 2 / 1e6 - mb) / mb < 0.05:
            return name, n, k, kernel
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
    ap.add_argument("--warps", type=int, nargs="+", default=[4], help="warps per read CTA (4, 8, ...)")
    ap.add_argument("--library", action="store_true",
                    help="also time torch's own read of the same bytes (an int64 sum of each copy)")
    ap.add_argument("--replays", type=int, default=20)
    ap.add_argument("--step", type=Path, help="a benchmarks.decode --profile JSON: chain reads in its step's shape")
    ap.add_argument("--mode", default="lingc", help="with --step: the JSON's mode (lingc, lingc-nextn)")
    args = ap.parse_args(argv)
    if args.step:
        return _step_main(args)
    dev = require_cuda()
    from lingc.runtime.kernels.gemm.kernel import gemm_triton
    from lingc.runtime.kernels.swiglu_gemm.kernel import swiglu_gemm_triton

    bw = copy_bandwidth_gbps()
    print(f"copy bandwidth {bw:.0f} GB/s", flush=True)
    rows = []
    for mb in args.mb:
        nbytes = int(mb * 1e6) // 16 * 16
        copies = cold_copies(nbytes, minimum=4)
        bufs = [torch.empty(nbytes // 4, dtype=torch.int32, device=dev) for _ in range(copies)]
        out = torch.empty(max(1, nbytes // (min(args.chunk_kb) * 1024)) + 1, dtype=torch.int32, device=dev)
        for chunk_kb, warps in ((c, w) for c in args.chunk_kb for w in args.warps):
            if chunk_kb * 1024 < _VEC * 4 * 32 * warps:
                continue                         # fewer bytes than one load round of the CTA
            for pdl in (True, False):
                t = time_in_graph(lambda b: read(b, out, chunk_kb * 1024, pdl, warps), [(b,) for b in bufs],
                                  replays=args.replays)
                what = (f"read, {chunk_kb} KB per CTA" + ("" if warps == 4 else f", {warps} warps")
                        + ("" if pdl else ", no PDL"))
                rows.append(_row(mb, what, nbytes, t.us_per_call, bw))
                print(rows[-1], flush=True)
        if args.library:
            acc = torch.empty((), dtype=torch.int64, device=dev)
            t = time_in_graph(lambda b: torch.sum(b, 0, dtype=torch.int64, out=acc), [(b,) for b in bufs],
                              replays=args.replays)
            rows.append(_row(mb, "torch.sum (the library's reduction, no PDL)", nbytes, t.us_per_call, bw))
            print(rows[-1], flush=True)
        del bufs
        case = _gemm_case(mb)
        if case is not None:
            name, n, k, kernel = case
            wbytes = n * k * 2
            ws = [torch.randn(n, k, device=dev, dtype=torch.bfloat16) for _ in range(cold_copies(wbytes, minimum=4))]
            x = torch.randn(1, k, device=dev, dtype=torch.bfloat16)
            if kernel == "swiglu":     # rows interleaved gate, up (the model's w13 layout)
                call = lambda w: swiglu_gemm_triton(x, w[0::2], w[1::2], 0.0)  # noqa: E731
            else:
                y = torch.empty(1, n, device=dev, dtype=torch.bfloat16)
                call = lambda w: gemm_triton(x, [w], out=y)  # noqa: E731
            t = time_in_graph(call, [(w,) for w in ws], replays=args.replays)
            rows.append(_row(mb, f"lingc {kernel} M=1 ({name}, table config)", wbytes, t.us_per_call, bw))
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
