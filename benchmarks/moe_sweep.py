"""Sweep launch configurations of the fused-MoE expert kernels on the GPU, and break a layer's
time into its launches, to fill the fixed table in runtime/kernels/moe_experts/kernel.py
(tuning happens here, never on the captured path).

    python -m benchmarks.moe_sweep --out benchmarks/results [--preset flash-tp4-rank] [--t 1 6]
        [--set grid|regs|all|router|table|loop|chunk|gemv|narrow]

Conditions as in ``benchmarks.kernels_moe``: ``--layers`` distinct MoE layers with random weights
(cold: each call of a replay reads another layer's experts), the routing of each layer computed
once by lingc's router, then timed inside one CUDA graph with PDL on. Rows:

- ``router``          the router launch alone (gate GEMV + grouped top-k)
- ``align``           moe_align alone (T > 1: one token runs without it)
- ``experts <cfg>``   align + up-GEMM + down-GEMM/combine with config ``cfg`` (the table's first);
                      one token: up-GEMM + down-GEMM/combine on the slot layout, no align
- ``router e<B> w<W> g<G>`` (``--set router``, instead of the expert configs) the router at
                      BLOCK_E = B experts per logits CTA, W logits warps and the token rows split
                      over G programs per expert block, checked bit for bit against the table's
                      router (ids) and to 1e-6 (weights) first

Each candidate is checked against the fp32 reference first (rel. RMS <= 5e-3) and the floor is
the distinct selected experts' bytes plus the shared expert's over the copy bandwidth measured in
the same run. The config with the least summed time over the swept T is printed (the table cannot
depend on T).
"""
from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path

import torch

from benchmarks.common import copy_bandwidth_gbps, markdown_table, require_cuda, time_in_graph, write_json
from benchmarks.kernels_moe import build_layers, lingc_routing, reference_layer, rel_rms
from lingc.models.config import preset
from lingc.runtime.kernels.moe_align.kernel import moe_align_triton
from lingc.runtime.kernels.moe_experts.kernel import MoeExpertsConfig, config_for, moe_experts_triton, up_chunks
from lingc.runtime.kernels.moe_router.kernel import moe_router_triton

# (BLOCK_E, logits warps, row groups) of --set router: 128 / 64 CTAs per row group, 4..16 warps.
# Session 16 call 2 (H200, one row group): none beat (4, 8) at T=1 (5.16 us) or T=6 (8.62 us);
# 2 warps, and 16 experts per CTA, were slower everywhere and are no longer timed. Session 22
# call 2: 3 and 6 row groups lost to 2 at T = 6 and 8, 16 warps lost at 4 and 8 experts.
ROUTER_VARIANTS = [(4, 8, 1), (4, 8, 2), (8, 8, 1), (8, 8, 2), (8, 8, 3), (8, 8, 4), (4, 4, 2), (8, 16, 2)]

RTOL_RMS = 5e-3


def _loop_variants(base: MoeExpertsConfig, specs) -> list[MoeExpertsConfig]:
    """The up-GEMM's loop design (block_k > 0) at each (block_n, split_k, block_k, stages, warps)."""
    return [replace(base, block_n=bn, split_k=sk, block_k=bk, up_stages=st, up_warps=w, up_maxnreg=0)
            for bn, sk, bk, st, w in specs]


def candidates(n_max: int, h: int, which: str = "all") -> list[MoeExpertsConfig]:
    """The table's entry first, then variants around it. ``which``: "grid" varies the up-GEMM
    (block_n, split_k, warps) and the down-GEMM (block_h, warps), one side at a time; "regs" the
    register caps (0 = the compiler's choice; up 96 = five 4-warp CTAs per SM, down 80 = six);
    "all" both; "table" the table's entry alone; "loop" the up-GEMM's loop design (block_k > 0);
    "chunk" variants with the table's H chunks (the same bits: a per-T choice among them is allowed);
    "gemv" the up-GEMM on CUDA cores (``up_gemv``: other bits than the table's); "narrow" the loop
    design at 8-16 columns with H whole or in two chunks."""
    base = config_for(n_max, h)
    out = [base]
    if which == "table":
        return out
    if which == "loop":
        # The up-GEMM's loop design (block_n, split_k, block_k, stages, warps): the chunk streamed
        # through a pipelined tile loop, so the bytes in flight are not bounded by registers.
        loops = [(32, 2, 128, 4, 4), (32, 4, 128, 4, 4), (32, 5, 128, 3, 4), (32, 5, 64, 4, 4),
                 (16, 2, 128, 4, 4), (64, 2, 128, 4, 4), (32, 1, 128, 4, 4), (64, 4, 128, 4, 8)]
        return out + _loop_variants(base, loops)
    if which == "narrow":
        # The loop design at 8 or 16 activation columns and H whole (or in two chunks): no split-K
        # ticket on most CTAs (the gather probe put the ticket at +2.7 us of a T = 6 layer) and
        # still 108-216 CTAs at T = 1, where session 17's 32 x 1 had 54. (block_n, split_k,
        # block_k, stages, warps)
        narrow = [(8, 1, 256, 4, 4), (8, 1, 512, 3, 4), (8, 1, 128, 6, 4), (16, 1, 256, 4, 4), (8, 2, 256, 4, 4),
                  (16, 2, 256, 4, 4)]
        return out + _loop_variants(base, narrow)
    if which == "gemv":
        # The up-GEMM on CUDA cores (up_gemv_kernel.py): (activation columns, warps) per CTA,
        # H whole; the down-GEMM the table's. 10 16-byte weight loads a thread at (1, 2), (2, 4),
        # (4, 8) (~122 registers), 20 at (2, 2), (4, 4) (~210).
        gemv = [(2, 4), (1, 2), (4, 8), (2, 2), (4, 4), (8, 8)]
        return out + [replace(base, block_n=c, split_k=1, up_warps=w, block_k=0, up_stages=1, up_maxnreg=0,
                              up_gemv=True) for c, w in gemv]
    if which == "chunk":
        # Variants that keep the table's H chunking (the same split-K chunks, each reduced by one
        # run of k16 MMAs from its start), so a token's bits are the table's whatever the column
        # tile, the load design or the down-GEMM's tile: a per-T choice among them would keep
        # batch invariance. (block_n, block_k, stages, warps); block_k 0 = one load per chunk.
        ups = [(16, 0, 1, 4), (64, 0, 1, 8), (32, 128, 2, 4), (64, 128, 2, 4), (64, 128, 3, 4),
               (64, 64, 4, 4), (64, 128, 2, 8), (32, 64, 3, 4)]
        variants = [replace(base, block_n=bn, block_k=bk, up_stages=st, up_warps=w,
                            up_maxnreg=0 if bk or w > 4 else base.up_maxnreg) for bn, bk, st, w in ups]
        out += [c for c in variants if up_chunks(c, h) == up_chunks(base, h)]
        out += [replace(base, block_h=bh, down_warps=w, down_maxnreg=0, down_warps_one_token=0) for bh, w in [(32, 4), (128, 4), (128, 8), (256, 8)]]
        return list(dict.fromkeys(out))
    if which in ("grid", "all"):
        ups = [(16, 5, 4), (16, 10, 4), (16, 3, 8), (8, 5, 4), (8, 10, 4), (32, 10, 4), (16, 20, 4)]
        downs = [(64, 4), (32, 4), (16, 4), (128, 8), (32, 2)]
        out += [replace(base, block_n=bn, split_k=sk, up_warps=w) for bn, sk, w in ups]
        out += [replace(base, block_h=bh, down_warps=w, down_warps_one_token=0) for bh, w in downs]
    if which in ("regs", "all"):
        out += [replace(base, up_maxnreg=r) for r in (0, 96)]
        out += [replace(base, up_maxnreg=96, down_maxnreg=80)]
    return list(dict.fromkeys(out))          # deduplicated, the table's entry first


def label(c: MoeExpertsConfig) -> str:
    regs = f" r{c.up_maxnreg}" if c.up_maxnreg else ""
    dregs = f" r{c.down_maxnreg}" if c.down_maxnreg else ""
    dregs += f" (T=1 w{c.down_warps_one_token})" if c.down_warps_one_token else ""
    loop = f" bk{c.block_k} st{c.up_stages}" if c.block_k else ""
    up = f"gemv n{c.block_n}" if c.up_gemv else f"n{c.block_n} k{c.split_k}{loop}"
    return f"up {up} w{c.up_warps}{regs} | down h{c.block_h} w{c.down_warps}{dregs}"


def expert_bytes(moe, ids: torch.Tensor) -> int:
    e = moe.experts.w13[0].nbytes + moe.experts.w2[0].nbytes
    return int(torch.unique(ids).numel()) * e + sum(p.nbytes for p in moe.shared_experts.parameters())


def experts_call(cfg: MoeExpertsConfig):
    def fn(x, moe, ids, w):
        inter, s, w13 = moe.experts.inter, moe.shared_experts, moe.experts.w13
        return moe_experts_triton(x, ids, w, w13[:, :inter], w13[:, inter:], moe.experts.w2,
                                  s.gate_proj.weight, s.up_proj.weight, s.down_proj.weight,
                                  moe.experts.limit, s.limit, config=cfg)
    return fn


def router_rows(t: int, xs, layers, routed, replays: int) -> list[dict]:
    """One row per ROUTER_VARIANTS entry: the router at that BLOCK_E, logits warp count and row
    grouping (row groups beyond T are capped at T: at T = 1 every grouping is the same launch)."""
    rows = []
    for block_e, warps, groups in ROUTER_VARIANTS:
        def fn(x, moe, block_e=block_e, warps=warps, groups=groups):
            c = moe.gate.cfg
            return moe_router_triton(x, moe.gate.weight, moe.gate.expert_bias, c.n_group, c.topk_group,
                                     c.num_experts_per_tok, c.routed_scaling_factor, c.norm_topk_prob,
                                     block_e=block_e, logits_warps=warps, row_groups=groups)
        with torch.no_grad():
            got = [fn(x, moe) for x, moe in zip(xs, layers)]
        same_ids = all(torch.equal(g[0], r[0]) for g, r in zip(got, routed))
        err = max((g[1] - r[1]).abs().max().item() for g, r in zip(got, routed))
        timing = time_in_graph(fn, list(zip(xs, layers)), replays=replays)
        rows.append({"T": t, "what": f"router e{block_e} w{warps} g{groups}", "us": timing.us_per_call, "w_diff": err,
                     "note": "" if same_ids and err <= 1e-6 else "DIFFERS from the table's router"})
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--preset", default="flash-tp4-rank")
    parser.add_argument("--layers", type=int, default=40)
    parser.add_argument("--t", type=int, nargs="+", default=[1, 6])
    parser.add_argument("--replays", type=int, default=20)
    parser.add_argument("--set", choices=["grid", "regs", "all", "router", "table", "loop", "chunk", "gemv", "narrow"], default="all",
                        help="which variants around the table's entry to time (candidates())")
    args = parser.parse_args(argv)
    device = require_cuda()
    copy_gbps = copy_bandwidth_gbps()
    cfg = preset(args.preset, torch_dtype="bfloat16")
    layers = build_layers(cfg, args.layers, device)
    n_max = max(cfg.moe_intermediate_size, cfg.moe_shared_expert_intermediate_size)
    gen = torch.Generator(device=device).manual_seed(1)
    rows = []
    for t in args.t:
        xs = [torch.randn(t, cfg.hidden_size, generator=gen, device=device).to(cfg.dtype) for _ in layers]
        with torch.no_grad():
            routed = [lingc_routing(x, moe) for x, moe in zip(xs, layers)]
        sets = [(x, moe, ids, w) for x, moe, (ids, w) in zip(xs, layers, routed)]
        nbytes = sum(expert_bytes(moe, ids) for _, moe, ids, _ in sets) / len(sets)
        floor_us = nbytes / (copy_gbps * 1e9) * 1e6
        router = time_in_graph(lambda x, moe: lingc_routing(x, moe), [(x, moe) for x, moe in zip(xs, layers)],
                               replays=args.replays)
        rows.append({"T": t, "what": "router", "us": router.us_per_call})
        align = time_in_graph(lambda ids: moe_align_triton(ids, cfg.num_experts, 16, True),
                              [(ids,) for _, _, ids, _ in sets], replays=args.replays)
        rows.append({"T": t, "what": "align", "us": align.us_per_call})
        if args.set == "router":
            rows += router_rows(t, xs, layers, routed, args.replays)
            continue
        table_out = None
        for c in candidates(n_max, cfg.hidden_size, args.set):
            fn = experts_call(c)
            with torch.no_grad():
                outs = [fn(*s) for s in sets]
                err = max(rel_rms(o, reference_layer(s[0], s[1], s[2], s[3])) for o, s in zip(outs, sets))
            # The table's entry comes first: every other candidate is compared with it bit for bit
            # (--set chunk claims the same bits).
            same = None if table_out is None else all(torch.equal(o, b) for o, b in zip(outs, table_out))
            table_out = outs if table_out is None else table_out
            if err > RTOL_RMS:
                rows.append({"T": t, "what": label(c), "config": c, "err": err, "us": None,
                             "note": "WRONG: not timed"})
                continue
            timing = time_in_graph(fn, sets, replays=args.replays)
            us = timing.us_per_call
            rows.append({"T": t, "what": label(c), "config": c, "err": err, "us": us, "floor_us": floor_us,
                         "x_floor": us / floor_us, "gbps": nbytes / (us * 1e-6) / 1e9,
                         "bits": "" if same is None else ("same" if same else "differ")})
        print(f"T={t}: experts floor {floor_us:.2f} us ({nbytes / 1e6:.1f} MB)", flush=True)
    totals: dict[str, float] = {}
    for r in rows:
        if "config" in r and r["us"] is not None:
            totals[r["what"]] = totals.get(r["what"], 0.0) + r["us"]
    complete = {k: v for k, v in totals.items()
                if sum(1 for r in rows if r["what"] == k and r["us"] is not None) == len(args.t)}
    best = min(complete, key=complete.get) if complete else None
    for r in rows:
        r["best"] = "<-" if r["what"] == best else ""
    print(f"copy bandwidth {copy_gbps:.0f} GB/s")
    print(markdown_table(rows, [("T", "T", "d"), ("what", "what", "s"), ("us", "us/layer", ".2f"),
                                ("x_floor", "x floor", ".2f"), ("gbps", "GB/s", ".0f"), ("err", "rel RMS", ".1e"),
                                ("w_diff", "router w max|diff|", ".1e"), ("bits", "bits vs table", "s"), ("best", "best", "s"),
                                ("note", "note", "s")]))
    print(f"best over T={args.t}: {best}")
    path = write_json(args.out / f"moe_sweep_{args.preset}.json",
                      {"benchmark": "moe_sweep", "preset": args.preset, "layers": args.layers,
                       "copy_gbps": copy_gbps, "rows": rows, "best": best})
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
