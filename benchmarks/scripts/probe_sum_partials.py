"""Session 27 probe (device only): the down-GEMM summing the up-GEMM's split-K partials
(MoeExpertsConfig.down_sums_partials) faulted ("misaligned address") at T = 6 and took ~1 ms a call
at T = 1 in the decode graph, while its GPU tests (w_down with a row stride of I + 8) passed.
One variant per process (a fault is sticky):

    python benchmarks/scripts/probe_sum_partials.py VARIANT FORM

VARIANT: table | h128w8 | h64w8 | h32w8 | h64w4; FORM: split (kernel.py's reshape + split of
one [16, 2 KPAD] load) or strided (two stride-2 loads, no layout conversion). Runs the
flash-tp4-rank MoE layers of benchmarks.moe_sweep (w_down contiguous, as the model's) at T = 1
and 6 with CUDA_LAUNCH_BLOCKING=1 first (eager calls, checked against the reference and the
table's bits), then times them in a CUDA graph; prints one line per T.
"""
import dataclasses
import os
import sys

import torch
import triton
import triton.language as tl

from lingc.runtime.kernels.moe_experts import kernel as K
from lingc.runtime.kernels.swiglu_gemm.kernel import _swiglu


@triton.jit
def _sum_partials_strided(ws_ptr, pair, valid, n_e, lim, stride_ws_s, stride_ws_p,
                          BLOCK_M: tl.constexpr, KPAD: tl.constexpr, SPLIT_K: tl.constexpr, HAS_LIMIT: tl.constexpr):
    k = tl.arange(0, KPAD)
    mask = valid[:, None] & (k < n_e)[None, :]
    ptrs = ws_ptr + pair[:, None] * stride_ws_p + 2 * k[None, :]
    g = tl.load(ptrs, mask=mask, other=0.0, cache_modifier=".cg")
    u = tl.load(ptrs + 1, mask=mask, other=0.0, cache_modifier=".cg")
    for s in tl.static_range(1, SPLIT_K):
        g += tl.load(ptrs + s * stride_ws_s, mask=mask, other=0.0, cache_modifier=".cg")
        u += tl.load(ptrs + s * stride_ws_s + 1, mask=mask, other=0.0, cache_modifier=".cg")
    return _swiglu(g, u, lim, HAS_LIMIT)


VARIANTS = {"table": None, "h128w8": (128, 8), "h64w8": (64, 8), "h32w8": (32, 8), "h64w4": (64, 4)}


def main(variant: str, form: str) -> None:
    if form == "strided":
        K._sum_partials = _sum_partials_strided
    from benchmarks.common import time_in_graph
    from benchmarks.kernels_moe import build_layers, lingc_routing, reference_layer, rel_rms
    from benchmarks.moe_sweep import experts_call
    from lingc.models.config import preset
    cfg = preset("flash-tp4-rank", torch_dtype="bfloat16")
    base = K.config_for(192, 2560)
    v = VARIANTS[variant]
    c = base if v is None else dataclasses.replace(base, down_sums_partials=True, block_h=v[0], down_warps=v[1],
                                                   down_warps_one_token=v[1])
    layers = build_layers(cfg, 40, "cuda")
    gen = torch.Generator(device="cuda").manual_seed(1)
    for t in (1, 6):
        xs = [torch.randn(t, cfg.hidden_size, generator=gen, device="cuda").to(cfg.dtype) for _ in layers]
        with torch.no_grad():
            routed = [lingc_routing(x, moe) for x, moe in zip(xs, layers)]
        sets = [(x, moe, ids, w) for x, moe, (ids, w) in zip(xs, layers, routed)]
        fn, table = experts_call(c), experts_call(base)
        try:
            with torch.no_grad():
                outs = [fn(*s) for s in sets]
                torch.cuda.synchronize()
                err = max(rel_rms(o, reference_layer(*s)) for o, s in zip(outs, sets))
                same = all(torch.equal(o, table(*s)) for o, s in zip(outs, sets))
            us = time_in_graph(fn, sets, replays=20).us_per_call
            print(f"{variant} {form} T={t}: {us:.2f} us/layer, rel RMS {err:.1e}, bits {'same' if same else 'DIFFER'}",
                  flush=True)
        except Exception as e:  # noqa: BLE001  (a device fault: report it and stop this process)
            print(f"{variant} {form} T={t}: FAILED {type(e).__name__}: {str(e)[:160]}", flush=True)
            return


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
