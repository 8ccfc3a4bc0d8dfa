"""Session 14 probe: the MoE router's selection by bitonic top-k (tl.topk: the group top-2 and
the row's top-8, the kept groups by rank) against the former repeated-max selection (eight
dependent warp-wide max reductions for the top-8, copied here as ``_loop_select``). Times the
router (logits + selection) of 40 cold flash-tp4-rank gate weights in one CUDA graph with PDL,
at T = 1 and 6, with the selection at 1, 2 and 4 warps and the logits kernel reducing 1, 2, 4 or
8 token rows per pass (LOGITS_ROWS), and checks that every variant picks the same experts.

    python benchmarks/scripts/probe_select_topk.py OUT.json
"""
import json
import sys

import torch
import triton
import triton.language as tl

import lingc.runtime.kernels.moe_router.kernel as rk
from benchmarks.common import time_in_graph
from lingc.runtime.kernels.moe_router.kernel import _key_value, _order_key
from lingc.runtime.pdl import pdl_launch_dependents, pdl_wait

E, H, LAYERS = 512, 2560, 40


@triton.jit
def _loop_select(
    logits_ptr, bias_ptr, ids_ptr, wts_ptr, routed_scaling,
    stride_lt, stride_it, stride_wt,
    N_GROUP: tl.constexpr, GROUP_SIZE: tl.constexpr, TOPK_GROUP: tl.constexpr, TOP_K: tl.constexpr,
    RENORMALIZE: tl.constexpr, G_PAD: tl.constexpr, GS_PAD: tl.constexpr, K_PAD: tl.constexpr,
    USE_GDC: tl.constexpr,
):
    """Grouped top-k of row program_id(0) on a [G_PAD, GS_PAD] view of its logits.

    Each candidate is one int64 key, (order key of its score) << 32 | (E - 1 - expert id), so a
    single max reduction yields the best score AND, among equal scores, the lowest id (the tie
    rule of naive.py); keys are distinct, so removing the winner is an equality test."""
    E: tl.constexpr = N_GROUP * GROUP_SIZE
    neg_inf = float("-inf")
    lowest = -9223372036854775808            # below every key (a key's high half is >= key(-inf))
    t = tl.program_id(0)
    g = tl.arange(0, G_PAD)[:, None]
    j = tl.arange(0, GS_PAD)[None, :]
    valid = (g < N_GROUP) & (j < GROUP_SIZE)
    eidx = tl.where(valid, g * GROUP_SIZE + j, 0)
    bias = tl.load(bias_ptr + eidx, mask=valid, other=0.0)   # producer-independent

    pdl_wait(USE_GDC)
    pdl_launch_dependents(USE_GDC)

    lg = tl.load(logits_ptr + t * stride_lt + eidx, mask=valid, other=0.0)
    c = tl.where(valid, tl.sigmoid(lg) + bias, neg_inf)
    key = (_order_key(c).to(tl.int64) << 32) | tl.where(valid, E - 1 - eidx, 0).to(tl.int64)
    # Group score: top-1 + top-2 of the group (the top-1's lowest position removed).
    k1 = tl.max(key, axis=1)
    k2 = tl.max(tl.where(key == k1[:, None], lowest, key), axis=1)
    gar = tl.arange(0, G_PAD)
    gscore = tl.where(gar < N_GROUP, _key_value(k1) + _key_value(k2), neg_inf)
    gkey = (_order_key(gscore).to(tl.int64) << 32) | (G_PAD - 1 - gar).to(tl.int64)
    keep = gkey == lowest                  # all False
    for _ in tl.static_range(TOPK_GROUP):
        best = tl.max(gkey, axis=0)
        hit = gkey == best
        keep = keep | hit
        gkey = tl.where(hit, lowest, gkey)
    key = tl.where(keep[:, None] & valid, key, lowest)
    kr = tl.arange(0, K_PAD)
    ids = tl.zeros([K_PAD], dtype=tl.int32)
    for i in tl.static_range(TOP_K):
        best = tl.max(tl.max(key, axis=1), axis=0)
        ids = tl.where(kr == i, (E - 1 - (best & 0x7FFFFFFF)).to(tl.int32), ids)
        key = tl.where(key == best, lowest, key)
    mask = kr < TOP_K
    # The weights are the unbiased scores at the picked experts.
    lsel = tl.load(logits_ptr + t * stride_lt + ids, mask=mask, other=0.0)
    wsel = tl.where(mask, tl.sigmoid(lsel), 0.0)
    if RENORMALIZE:
        wsel = wsel / tl.sum(wsel, axis=0)
    wsel = wsel * routed_scaling
    tl.store(ids_ptr + t * stride_it + kr, ids, mask=mask)
    tl.store(wts_ptr + t * stride_wt + kr, wsel, mask=mask)


gen = torch.Generator(device="cuda").manual_seed(0)
gates = [(torch.randn(E, H, generator=gen, device="cuda") / H**0.5).bfloat16() for _ in range(LAYERS)]
biases = [torch.randn(E, generator=gen, device="cuda") * 0.01 for _ in range(LAYERS)]
TOPK_SELECT = rk._moe_router_select_kernel


def route(x, w, b):
    return rk.moe_router_triton(x, w, b, 8, 4, 8, 2.5, True)


VARIANTS = [("loop", 1, 1), ("topk", 1, 1), ("topk", 2, 1), ("topk", 4, 1), ("topk", 1, 2), ("topk", 1, 4),
            ("topk", 1, 8)]   # (selection, its warps, token rows per logits pass)
rows = []
for t in (1, 6):
    xs = [torch.randn(t, H, generator=gen, device="cuda").bfloat16() for _ in range(LAYERS)]
    base = None
    for name, warps, logit_rows in VARIANTS:
        rk._moe_router_select_kernel = _loop_select if name == "loop" else TOPK_SELECT
        rk.SELECT_WARPS, rk.LOGITS_ROWS = warps, logit_rows
        out = [route(x, w, b) for x, w, b in zip(xs, gates, biases)]
        ids = torch.stack([o[0] for o in out])
        wts = torch.stack([o[1] for o in out])
        if base is None:
            base = (ids, wts)
        same_ids = bool(torch.equal(ids, base[0]))
        wdiff = (wts - base[1]).abs().max().item()
        tm = time_in_graph(route, list(zip(xs, gates, biases)), replays=30)
        rows.append({"T": t, "select": name, "select_warps": warps, "logits_rows": logit_rows,
                     "us": tm.us_per_call, "same_ids": same_ids, "max_weight_diff": wdiff})
        print(f"T={t} select={name} warps={warps} logits rows={logit_rows}: {tm.us_per_call:6.2f} us per router "
              f"call, same ids {same_ids}, weights max diff {wdiff:.1e}", flush=True)
json.dump(rows, open(sys.argv[1], "w"), indent=1)
