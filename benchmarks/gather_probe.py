"""Probe: what the routed MoE up-GEMM's memory pattern costs without its arithmetic.

    python -m benchmarks.gather_probe --out DIR [--experts 41] [--replays 20]

Session 26 found the verify graph's MoE up-GEMM at ~29 us per layer (flash-tp4-rank, T = 6,
~41 distinct experts, ~81 MB of gate and up weights) where a pure read of as many bytes in a PDL
chain takes ~20 us (``benchmarks.read_probe``). This probe sorts the gap into its causes by
reading exactly the up-GEMM's tiles (each CTA: 2 x 32 rows of one expert's [2 I, H] weights, one
256-wide H chunk, 32 KB; grid = chunks x column tiles x blocks, chunks fastest, as
``_moe_up_kernel``) with nothing computed but an xor fold, in four forms that add the
up-GEMM's structure one piece at a time:

- ``direct``        block b reads expert ``base + b`` (no indirection), its tile loaded before
                    the PDL wait: the bytes and the access pattern alone;
- ``id-early``      the expert id read from a table first, before the wait (ids ready early);
- ``id-after-wait`` the id read after the wait, as the up-GEMM must (moe_align writes it);
- ``+ split-K``     and each CTA stores its partial (``--rows`` rows of 64 words: the valid
                    rows, ~1 at T = 6) and takes an acq_rel ticket; the last of a tile's
                    chunks reads every partial and stores the tile's result, as the
                    up-GEMM's epilogue does.

Beside them, in the same run, a contiguous pure read of the same bytes (read_probe's kernel, 32
KB per CTA). Each call of a CUDA graph is one kernel over its own expert set (id sets drawn from
a pool of ``--pool`` experts, rotated so every call reads cold weights), chained with PDL.
Output: a markdown table (us per call, GB/s, share of the copy bandwidth) and JSON.
"""
from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import torch
import triton
import triton.language as tl

from benchmarks.common import (copy_bandwidth_gbps, environment, markdown_table, require_cuda, time_in_graph,
                               write_json)
from benchmarks.read_probe import read
from lingc.runtime.pdl import pdl_launch_dependents, pdl_wait

# flash-tp4-rank's routed experts: I = 192 gate + 192 up rows of H = 2560 (bf16), the up-GEMM's
# tile (moe_experts CONFIGS[(192, 2560)]): 32 columns of each, 256-wide H chunks, 10 chunks.
I, H, BLOCK_N, CHUNK_K = 192, 2560, 32, 256
FORMS = ("direct", "id-early", "id-after-wait", "+ split-K")


@triton.jit(do_not_specialize=["base"])   # one compile for every set's base (warm-up runs only three)
def _gather_kernel(w_ptr, ids_ptr, base, part_ptr, ticket_ptr, out_ptr,
                   I: tl.constexpr, H: tl.constexpr, BLOCK_N: tl.constexpr, CHUNK_K: tl.constexpr,
                   SPLIT_K: tl.constexpr, N_TILES: tl.constexpr, ROWS: tl.constexpr, FORM: tl.constexpr,
                   USE_GDC: tl.constexpr):
    """One CTA: block pid_b's expert (FORM 0: base + pid_b; 1: ids[pid_b] before the wait; 2, 3:
    after it), rows j, I + j (j in column tile pid_n) over H chunk pid_k, as int32 lanes (two bf16
    each), xor-folded per row. FORM < 3 stores the fold of the fold (one word a CTA); FORM 3
    stores the [ROWS, 2 * BLOCK_N] partial and the last chunk to take the tile's ticket stores
    the xor of all chunks' partials' first rows into out[tile]."""
    pid_k = tl.program_id(0)
    pid_n = tl.program_id(1)
    pid_b = tl.program_id(2)
    LANES: tl.constexpr = CHUNK_K // 2
    r = tl.arange(0, 2 * BLOCK_N)
    j = pid_n * BLOCK_N + r // 2
    row = tl.where(r % 2 == 0, j, I + j)          # gate, up interleaved, as the up-GEMM's tile
    offs = pid_k * LANES + tl.arange(0, LANES)
    if FORM >= 2:                                 # the id is the previous kernel's output
        pdl_wait(USE_GDC)
        pdl_launch_dependents(USE_GDC)
    if FORM == 0:
        e = base + pid_b
    else:
        e = tl.load(ids_ptr + pid_b)
    w = tl.load(w_ptr + (e.to(tl.int64) * 2 * I + row[:, None]) * (H // 2) + offs[None, :])
    if FORM < 2:                                  # the tile requested before the wait
        pdl_wait(USE_GDC)
        pdl_launch_dependents(USE_GDC)
    fold = tl.xor_sum(w, axis=1)                  # [2 * BLOCK_N]: this chunk's word per row
    tile = pid_b * N_TILES + pid_n
    if FORM < 3:
        tl.store(out_ptr + (tile * SPLIT_K + pid_k), tl.xor_sum(fold, axis=0))
    else:
        rr = tl.arange(0, ROWS)
        part = part_ptr + ((tile * SPLIT_K + pid_k) * ROWS + rr[:, None]) * (2 * BLOCK_N) + r[None, :]
        tl.store(part, tl.broadcast_to(fold[None, :], (ROWS, 2 * BLOCK_N)))
        tl.debug_barrier()
        ticket = tl.atomic_add(ticket_ptr + tile, 1, sem="acq_rel", scope="gpu")
        if ticket == SPLIT_K - 1:
            acc = tl.zeros([2 * BLOCK_N], dtype=tl.int32)
            for s in tl.static_range(SPLIT_K):
                acc ^= tl.load(part_ptr + ((tile * SPLIT_K + s) * ROWS) * (2 * BLOCK_N) + r, cache_modifier=".cg")
            tl.store(out_ptr + tile * 2 * BLOCK_N + r, acc)
            tl.atomic_xchg(ticket_ptr + tile, 0, sem="relaxed", scope="gpu")


class Gather:
    """Buffers and launch of one form over ``blocks`` experts of a pool ``w`` (int32 view of
    [E, 2 I, H] bf16 weights)."""

    def __init__(self, w: torch.Tensor, blocks: int, rows: int, i: int = I, h: int = H,
                 block_n: int = BLOCK_N, chunk_k: int = CHUNK_K):
        if w.dtype != torch.int32 or w.dim() != 3 or w.shape[1:] != (2 * i, h // 2):
            raise ValueError(f"weights {tuple(w.shape)} {w.dtype}: want int32 [E, {2 * i}, {h // 2}] "
                             f"(bf16 [E, 2 I, H] viewed as int32)")
        if rows < 1 or rows & (rows - 1):
            raise ValueError(f"rows = {rows}: a power of two (a partial's rows are one tl.arange)")
        if i % block_n or h % chunk_k:
            raise ValueError(f"I = {i} and H = {h} must be multiples of the tile ({block_n} x {chunk_k})")
        self.w, self.blocks, self.rows = w, blocks, rows
        self.i, self.h, self.block_n, self.chunk_k = i, h, block_n, chunk_k
        self.split_k, self.n_tiles = h // chunk_k, i // block_n
        tiles = blocks * self.n_tiles
        dev = w.device
        self.part = torch.empty(tiles * self.split_k * rows * 2 * block_n, dtype=torch.int32, device=dev)
        self.ticket = torch.zeros(tiles, dtype=torch.int32, device=dev)
        self.out = torch.empty(tiles * max(self.split_k, 2 * block_n), dtype=torch.int32, device=dev)

    @property
    def nbytes(self) -> int:
        return self.blocks * 2 * self.i * self.h * 2

    def __call__(self, form: str, ids: torch.Tensor, base: int, use_pdl: bool) -> torch.Tensor:
        grid = (self.split_k, self.n_tiles, self.blocks)
        _gather_kernel[grid](self.w, ids, base, self.part, self.ticket, self.out, I=self.i, H=self.h,
                             BLOCK_N=self.block_n, CHUNK_K=self.chunk_k, SPLIT_K=self.split_k,
                             N_TILES=self.n_tiles, ROWS=self.rows, FORM=FORMS.index(form), USE_GDC=use_pdl,
                             num_warps=4, **({"launch_pdl": True} if use_pdl else {}))
        return self.out


def xor_reduce(t: torch.Tensor, dim: int) -> torch.Tensor:
    """Bitwise xor of an integer tensor along ``dim`` (torch has no xor reduction)."""
    return torch.from_numpy(np.bitwise_xor.reduce(t.cpu().numpy(), axis=dim))


def tile_folds(w: torch.Tensor, experts: list[int], i: int, block_n: int) -> torch.Tensor:
    """Reference of the split-K form's output: per (block, column tile), the xor over H of each
    of the tile's interleaved gate / up rows, [blocks * n_tiles, 2 * block_n] int32."""
    out = []
    for e in experts:
        folds = xor_reduce(w[e], 1)                   # [2 I]
        for t in range(i // block_n):
            j = t * block_n + torch.arange(block_n)
            out.append(torch.stack([folds[j], folds[i + j]], 1).reshape(-1))
    return torch.stack(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--experts", type=int, default=41, help="distinct experts (blocks) per call")
    ap.add_argument("--pool", type=int, default=512, help="experts in the weight pool (1 MB each x 2)")
    ap.add_argument("--rows", type=int, default=1,
                    help="rows stored per split-K partial: the up-GEMM stores only a block's valid rows, about "
                         "one at T = 6 (48 picks over ~41 experts); its BLOCK_M = 16 bounds it")
    ap.add_argument("--sets", type=int, default=12, help="id sets rotated through (cold weights)")
    ap.add_argument("--replays", type=int, default=20)
    args = ap.parse_args(argv)
    dev = require_cuda()
    if args.experts * args.sets > args.pool:
        raise SystemExit(f"--experts {args.experts} x --sets {args.sets} > --pool {args.pool}: each set needs its "
                         f"own experts for cold reads")
    bw = copy_bandwidth_gbps()
    w = torch.randint(-2**31, 2**31 - 1, (args.pool, 2 * I, H // 2), dtype=torch.int32, device=dev)
    perm = torch.randperm(args.pool, device=dev)
    sets = [(perm[s * args.experts:(s + 1) * args.experts].to(torch.int32).contiguous(), s * args.experts)
            for s in range(args.sets)]
    g = Gather(w, args.experts, args.rows)
    print(f"copy bandwidth {bw:.0f} GB/s; {args.experts} experts a call, {g.nbytes / 1e6:.1f} MB, grid "
          f"{g.split_k} x {g.n_tiles} x {args.experts}", flush=True)
    # The split-K form against its reference on one set (the other forms' words are folds of it).
    ids0 = sets[0][0]
    got = g("+ split-K", ids0, 0, True).view(-1)[:args.experts * g.n_tiles * 2 * BLOCK_N].view(-1, 2 * BLOCK_N)
    ok = torch.equal(got.cpu(), tile_folds(w.cpu(), ids0.tolist(), I, BLOCK_N))
    rows = []

    def row(what, us, nbytes):
        gbps = nbytes / (us * 1e-6) / 1e9
        rows.append(dict(what=what, us=us, gbps=gbps, pct=100 * gbps / bw, mb=nbytes / 1e6))
        print(rows[-1], flush=True)

    for form in FORMS:
        # "direct" reads experts base .. base + n: the same count of cold experts as the id forms.
        t = time_in_graph(lambda ids, base: g(form, ids, base, True), sets, replays=args.replays)
        row(form, t.us_per_call, g.nbytes)
    flat = [w[base:base + args.experts].reshape(-1) for _, base in sets]
    out = torch.empty(g.nbytes // (32 * 1024) + 1, dtype=torch.int32, device=dev)
    t = time_in_graph(lambda b: read(b, out, 32 * 1024, True), [(b,) for b in flat], replays=args.replays)
    row("contiguous pure read, 32 KB per CTA", t.us_per_call, g.nbytes)
    table = markdown_table(rows, [("what", "form", "s"), ("us", "us per call", ".2f"), ("gbps", "GB/s", ".0f"),
                                  ("pct", "% of copy bandwidth", ".0f")])
    print(table)
    print(f"split-K form's output equals its reference: {'yes' if ok else 'NO'}")
    args.out.mkdir(parents=True, exist_ok=True)
    write_json(args.out / "gather_probe.json", dict(environment=environment(), copy_bandwidth_gbps=bw,
                                                    experts=args.experts, rows_per_partial=args.rows,
                                                    correct=ok, rows=rows))
    print(f"wrote {args.out / 'gather_probe.json'}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
