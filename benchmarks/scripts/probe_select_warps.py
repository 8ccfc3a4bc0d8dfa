"""Session 13 probe: the MoE router's selection kernel with 1, 2 or 4 warps per row (moe_router's
SELECT_WARPS). One warp keeps every reduction inside the warp, but holds 16 of the row's 512
int64 keys per lane, so each of its ~20 sequential reductions starts with a long in-lane chain
(ncu, session 9: an instruction every 3.6 cycles). Times the router (logits + selection) of 40
cold flash-tp4-rank gate weights in one CUDA graph with PDL, T = 1 and 6, and checks that every
variant picks the same experts.

    python benchmarks/scripts/probe_select_warps.py OUT.json
"""
import json
import sys

import torch

import lingc.runtime.kernels.moe_router.kernel as rk
from benchmarks.common import time_in_graph

E, H, LAYERS = 512, 2560, 40
gen = torch.Generator(device="cuda").manual_seed(0)
gates = [(torch.randn(E, H, generator=gen, device="cuda") / H**0.5).bfloat16() for _ in range(LAYERS)]
biases = [torch.randn(E, generator=gen, device="cuda") * 0.01 for _ in range(LAYERS)]


def route(x, w, b):
    return rk.moe_router_triton(x, w, b, 8, 4, 8, 2.5, True)


rows = []
for t in (1, 6):
    xs = [torch.randn(t, H, generator=gen, device="cuda").bfloat16() for _ in range(LAYERS)]
    base = None
    for warps in (1, 2, 4):
        rk.SELECT_WARPS = warps
        out = [route(x, w, b) for x, w, b in zip(xs, gates, biases)]
        ids = torch.stack([o[0] for o in out])
        wts = torch.stack([o[1] for o in out])
        if base is None:
            base = (ids, wts)
        same_ids = bool(torch.equal(ids, base[0]))
        wts_err = (wts - base[1]).abs().max().item()
        tm = time_in_graph(route, list(zip(xs, gates, biases)), replays=30)
        rows.append({"T": t, "select_warps": warps, "us": tm.us_per_call, "same_ids": same_ids, "max_weight_diff": wts_err})
        print(f"T={t} warps={warps}: {tm.us_per_call:6.2f} us per router call, same ids {same_ids}, "
              f"weights max diff {wts_err:.1e}", flush=True)
json.dump(rows, open(sys.argv[1], "w"), indent=1)
