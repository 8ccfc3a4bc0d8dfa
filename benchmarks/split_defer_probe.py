"""Probe: what does a split-K GEMM's in-launch reduction cost a decode chain, and what would
handing the partials to the consumer save?

    python -m benchmarks.split_defer_probe --out DIR [--layers 35] [--t 1 6] [--replays 30]

Every lingc decode GEMM with ``split_k > 1`` (all of flash-tp4-rank's projections) ends the same
way: each K chunk stores its fp32 partial, takes an integer ticket, and the chunk with the last
ticket reads the partials back from L2, adds them in chunk order, rounds and stores the output.
The last CTA of the grid therefore pays a store, an atomic and a reload (three L2 round trips)
after its own dot product, and the next kernel of the PDL chain waits for it.

The alternative measured here, "deferred": a GEMM only stores its partials and exits, and its
consumer sums the planes in chunk order and rounds when it loads its input, which it has to load
from L2 anyway. The arithmetic is the same, so the outputs are bit for bit those of the ticket
chain (the probe checks it before timing).

The chain is a KDA layer's two projections at flash-tp4-rank's shapes, ``--layers`` times with
cold weights (35 x 31 MB, well past L2): x [T, 2560] -> fused projection [T, 5128] (config A 64,
split 2) -> its first 1024 columns -> o_proj [T, 2560] (config B 64, split 4) -> the next layer's
x. Rows, per T:

- ``lingc``: the production ``gemm_triton`` chain (tickets);
- ``probe-ticket``: this file's kernel in ticket mode (checks that the probe kernel is the
  production kernel's equal in time);
- ``probe-deferred``: partials handed to the consumer (both GEMMs; the fused projection,
  design A, then sums four planes in every K tile of its loop);
- ``probe-deferred-fused``: only the fused projection's partials handed over, to the o_proj's
  one-tile load (a decode step's fused projection feeds such one-shot loaders);
- ``probe-no-reduce (bound)``: partials stored and never summed, the consumers reading stale
  outputs: what the ticket costs the producer alone (wrong values; a bound, not a design).

"saving / GEMM" is (lingc - variant) / 2 per layer: the layer's two GEMMs' average (one GEMM of
the two hands over its partials in ``probe-deferred-fused``, so it saves twice that).

Output: a markdown table (us per layer, the saving per GEMM) and JSON.
"""
from __future__ import annotations

import argparse
from pathlib import Path

import torch
import triton
import triton.language as tl

from benchmarks.common import markdown_table, require_cuda, time_in_graph, write_json
from lingc.runtime.kernels.gemm.kernel import gemm_triton
from lingc.runtime.kernels.gemm.config import GemmConfig, config_for
from lingc.runtime.kernels.gemm.kernel import dot_flags, k_plan, resolve_pdl
from lingc.runtime.kernels.gemm_common import BLOCK_M, dot_acc, split_k_tickets
from lingc.runtime.pdl import pdl_launch_dependents, pdl_wait

H, N_FUSED, N_ATTN = 2560, 5128, 1024


@triton.jit
def _load_x(x_ptrs, mask_m, stride_xs, dtype: tl.constexpr, X_PLANES: tl.constexpr):
    """x's tile: as it is (X_PLANES = 0), or X_PLANES fp32 planes summed in order and rounded."""
    if X_PLANES == 0:
        return tl.load(x_ptrs, mask=mask_m[:, None], other=0.0)
    xs = tl.load(x_ptrs, mask=mask_m[:, None], other=0.0, cache_modifier=".cg")
    for s in tl.static_range(1, X_PLANES):
        xs += tl.load(x_ptrs + s * stride_xs, mask=mask_m[:, None], other=0.0, cache_modifier=".cg")
    return xs.to(dtype)


@triton.jit(do_not_specialize=["M"])
def _probe_gemm_kernel(
    x_ptr, ws_ptr, out_ptr, ticket_ptr, w_ptr,
    M, N, K, stride_wn, stride_xs, stride_xm, stride_ws_s, stride_ws_m, stride_om,
    X_PLANES: tl.constexpr, TICKET: tl.constexpr, SPLIT_K: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, K_TILES: tl.constexpr,
    DOT_PRECISION: tl.constexpr, DOT_UPCAST: tl.constexpr, USE_GDC: tl.constexpr,
):
    """One weight, the production kernel's tiling (K even). x is X_PLANES fp32 planes summed in
    order and rounded to the weight's dtype (X_PLANES = 0: x is already in that dtype). TICKET:
    the production reduction into out; else the partial goes to plane pid_k of ws and the CTA
    exits."""
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    pid_k = tl.program_id(2)
    rows = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = rows < N
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    mask_m = offs_m < M
    offs_k = pid_k * K_TILES * BLOCK_K + tl.arange(0, BLOCK_K)
    w_ptrs = w_ptr + rows[:, None] * stride_wn + offs_k[None, :]
    x_ptrs = x_ptr + offs_m[:, None] * stride_xm + offs_k[None, :]
    # As the production kernel's _block_dot: the first tile (design B: the chunk) before the
    # wait, the rest in a pipelined loop.
    w = tl.load(w_ptrs, mask=mask_n[:, None], other=0.0)
    pdl_wait(USE_GDC)
    pdl_launch_dependents(USE_GDC)
    x = _load_x(x_ptrs, mask_m, stride_xs, w_ptr.dtype.element_ty, X_PLANES)
    acc = dot_acc(x, w, tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32), DOT_PRECISION, DOT_UPCAST)
    for _ in range(1, K_TILES):
        w_ptrs += BLOCK_K
        x_ptrs += BLOCK_K
        w = tl.load(w_ptrs, mask=mask_n[:, None], other=0.0)
        x = _load_x(x_ptrs, mask_m, stride_xs, w_ptr.dtype.element_ty, X_PLANES)
        acc = dot_acc(x, w, acc, DOT_PRECISION, DOT_UPCAST)
    mask = mask_m[:, None] & mask_n[None, :]
    ws_ptrs = ws_ptr + offs_m[:, None] * stride_ws_m + rows[None, :]
    if TICKET:
        # gemm/kernel.py's reduction as it is (the thing measured), so that TICKET can take it out.
        out_ptrs = out_ptr + offs_m[:, None] * stride_om + rows[None, :]
        tl.store(ws_ptrs + pid_k * stride_ws_s, acc, mask=mask)
        tl.debug_barrier()
        tile = pid_m * tl.num_programs(1) + pid_n
        ticket = tl.atomic_add(ticket_ptr + tile, 1, sem="acq_rel", scope="gpu")
        if ticket == SPLIT_K - 1:
            total = tl.load(ws_ptrs, mask=mask, other=0.0, cache_modifier=".cg")
            for s in tl.static_range(1, SPLIT_K):
                total += tl.load(ws_ptrs + s * stride_ws_s, mask=mask, other=0.0, cache_modifier=".cg")
            tl.store(out_ptrs, total.to(out_ptr.dtype.element_ty), mask=mask)
            tl.atomic_xchg(ticket_ptr + tile, 0, sem="relaxed", scope="gpu")
    else:
        tl.store(ws_ptrs + pid_k * stride_ws_s, acc, mask=mask)


def probe_gemm(x: torch.Tensor, x_planes: int, w: torch.Tensor, ws: torch.Tensor, out: torch.Tensor,
               m: int, ticket: bool, config: GemmConfig | None = None) -> None:
    """x: [x_planes, M, >= K] fp32 (x_planes > 0) or [M, >= K] in w's dtype; ws [split, M, N] fp32;
    out [M, N] (ticket mode). The config is the production table's for (N, K) unless given."""
    n, k = w.shape
    cfg = config or config_for(n, k)
    block_k, k_tiles, split_k, even_k = k_plan(k, cfg)
    assert even_k and ws.shape[0] == split_k, (cfg, ws.shape)
    use_gdc, launch = resolve_pdl(w.device, None)
    grid = (triton.cdiv(m, BLOCK_M), triton.cdiv(n, cfg.block_n), split_k)
    tickets = split_k_tickets(w.device, grid[0] * grid[1])
    sxs, sxm = (x.stride(0), x.stride(1)) if x_planes else (0, x.stride(0))
    _probe_gemm_kernel[grid](
        x, ws, out, tickets, w, m, n, k, w.stride(0), sxs, sxm, ws.stride(0), ws.stride(1), out.stride(0),
        X_PLANES=x_planes, TICKET=ticket, SPLIT_K=split_k, BLOCK_M=BLOCK_M, BLOCK_N=cfg.block_n,
        BLOCK_K=block_k, K_TILES=k_tiles, USE_GDC=use_gdc, **dot_flags(w.dtype),
        num_warps=cfg.num_warps, num_stages=cfg.num_stages, **launch,
    )


def _splits(n: int, k: int) -> int:
    return k_plan(k, config_for(n, k))[2]


class Chain:
    """The layers' weights and every buffer of the three variants at T rows."""

    def __init__(self, layers: int, t: int, dev: torch.device, seed: int = 0):
        g = torch.Generator(device=dev).manual_seed(seed)

        def rnd(*shape):
            return (torch.randn(*shape, device=dev, generator=g) * 0.02).to(torch.bfloat16)

        self.t = t
        self.fused = [rnd(N_FUSED, H) for _ in range(layers)]
        self.o_proj = [rnd(H, N_ATTN) for _ in range(layers)]
        self.s1, self.s2 = _splits(N_FUSED, H), _splits(H, N_ATTN)
        self.x0 = (torch.randn(t, H, device=dev, generator=g)).to(torch.bfloat16)
        self.x0_planes = torch.zeros(self.s2, t, H, device=dev)
        self.x0_planes[0] = self.x0.float()
        self.y1 = torch.empty(t, N_FUSED, device=dev, dtype=torch.bfloat16)
        self.y2 = torch.empty(t, H, device=dev, dtype=torch.bfloat16)
        self.ws1 = torch.empty(self.s1, t, N_FUSED, device=dev)
        self.ws2 = torch.empty(self.s2, t, H, device=dev)
        self.out = torch.empty(t, H, device=dev, dtype=torch.bfloat16)

    def lingc(self) -> torch.Tensor:
        x = self.x0
        for w1, w2 in zip(self.fused, self.o_proj):
            gemm_triton(x, [w1], out=self.y1)
            gemm_triton(self.y1[:, :N_ATTN], [w2], out=self.y2)
            x = self.y2
        self.out.copy_(x)
        return self.out

    def probe(self, fused: str, o_proj: str) -> torch.Tensor:
        """The chain on this file's kernel, each GEMM's end chosen: "ticket" (the production
        reduction), "defer" (partials only, summed by the consumer's load) or "drop" (partials
        only, the consumer reading a stale output: a bound, not a result). The chain's output:
        the last o_proj's, rounded (deferred: its planes summed by torch, sequential order for
        two planes only)."""
        x, planes = (self.x0_planes, self.s2) if o_proj == "defer" else (self.x0, 0)
        for w1, w2 in zip(self.fused, self.o_proj):
            probe_gemm(x, planes, w1, self.ws1, self.y1, self.t, fused == "ticket")
            x1, p1 = (self.ws1, self.s1) if fused == "defer" else (self.y1, 0)
            probe_gemm(x1, p1, w2, self.ws2, self.y2, self.t, o_proj == "ticket")
            x, planes = (self.ws2, self.s2) if o_proj == "defer" else (self.y2, 0)
        self.out.copy_(self.ws2.sum(0).to(torch.bfloat16) if o_proj == "defer" else self.y2)
        return self.out

    def probe_ticket(self) -> torch.Tensor:
        return self.probe("ticket", "ticket")

    def probe_no_reduce(self) -> torch.Tensor:
        """What the ticket costs the producer alone (wrong values)."""
        return self.probe("drop", "drop")

    def probe_deferred_fused(self) -> torch.Tensor:
        """Only the fused projection hands over its partials, to the o_proj's one-tile (design B)
        load; the o_proj reduces with its ticket as in production. A decode step's fused
        projection feeds one-shot loaders (the KDA chain, the gated norm)."""
        return self.probe("defer", "ticket")

    def probe_deferred(self) -> torch.Tensor:
        return self.probe("defer", "defer")


def run(layers: int, ts: list[int], replays: int) -> list[dict]:
    dev = require_cuda()
    rows = []
    for t in ts:
        chain = Chain(layers, t, dev)
        ref = chain.lingc().clone()
        got = chain.probe_ticket().clone()
        assert torch.equal(ref, got), f"T={t}: the probe's ticket chain differs from gemm_triton's"
        # The deferred chain's last rounding is done by torch here (a sum over 4 planes may
        # associate differently), so compare the second-to-last GEMM's input instead: the
        # fused projection's partial planes of the last layer, rounded in chunk order.
        chain.lingc()
        last_in = chain.y1.clone()
        chain.probe_deferred()
        summed = chain.ws1[0].clone()
        for s in range(1, chain.s1):
            summed += chain.ws1[s]
        assert torch.equal(summed.to(torch.bfloat16), last_in), f"T={t}: deferred partials differ from the ticket chain"
        got = chain.probe_deferred_fused().clone()
        assert torch.equal(ref, got), f"T={t}: the fused-only deferred chain differs from gemm_triton's"
        for name, fn in (("lingc", chain.lingc), ("probe-ticket", chain.probe_ticket),
                         ("probe-deferred", chain.probe_deferred),
                         ("probe-deferred-fused", chain.probe_deferred_fused), ("probe-no-reduce (bound)", chain.probe_no_reduce)):
            timing = time_in_graph(fn, [()], calls_per_graph=1, replays=replays)
            rows.append(dict(t=t, variant=name, us_per_layer=timing.us_per_call / layers,
                             us_per_layer_min=timing.us_per_call_min / layers))
        base = next(r for r in rows if r["t"] == t and r["variant"] == "lingc")["us_per_layer"]
        for r in rows:
            if r["t"] == t:
                r["saving_per_gemm_us"] = (base - r["us_per_layer"]) / 2
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--layers", type=int, default=35)
    ap.add_argument("--t", type=int, nargs="+", default=[1, 6])
    ap.add_argument("--replays", type=int, default=30)
    args = ap.parse_args(argv)
    rows = run(args.layers, args.t, args.replays)
    print(markdown_table(rows, [("t", "T", "d"), ("variant", "variant", "s"), ("us_per_layer", "us / layer", ".2f"),
                                ("us_per_layer_min", "min", ".2f"), ("saving_per_gemm_us", "saving / GEMM us", ".2f")]))
    args.out.mkdir(parents=True, exist_ok=True)
    write_json(args.out / "split_defer_probe.json", dict(layers=args.layers, rows=rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
