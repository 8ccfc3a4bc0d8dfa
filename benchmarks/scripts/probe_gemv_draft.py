"""Session 13 probe: is design C (the GEMV, gemv_kernel.py) faster than the launch table at M = 1
on the shapes the relay's DRAFT graph runs (the NEXTN layer's projections and the lm_head), where
batch invariance against M = 6 is not needed (the draft only proposes tokens)? Cold weights, PDL,
CUDA graph of many calls, median (benchmarks.common). The lm_head row is the table's gemm_argmax
against design C writing the logits row (no argmax), i.e. a lower bound for a GEMV + argmax.

    python benchmarks/scripts/probe_gemv_draft.py OUT.json
"""
import json
import sys

import torch

from benchmarks.common import cold_copies, copy_bandwidth_gbps, time_in_graph
from lingc.runtime.kernels.gemm.argmax_kernel import gemm_argmax_triton
from lingc.runtime.kernels.gemm.config import _c, config_for
from lingc.runtime.kernels.gemm.kernel import gemm_triton

SHAPES = {"NEXTN eh_proj": (5120, (2560,)), "MLA fused q/kv_a/g": (2560, (1536, 576, 8)),
          "MLA dense (o_proj)": (1024, (2560,)), "lm_head": (2560, (39296,))}
C_CONFIGS = [_c(2, 2, 2), _c(4, 4), _c(4, 4, 2), _c(8, 8, 2), _c(8, 8), _c(16, 8, 2)]

rows = []
copy = copy_bandwidth_gbps()
gen = torch.Generator(device="cuda").manual_seed(0)
for name, (k, wrows) in SHAPES.items():
    n = sum(wrows)
    nbytes = n * k * 2
    sets = [[(torch.randn(r, k, generator=gen, device="cuda") / k**0.5).bfloat16() for r in wrows]
            for _ in range(min(40, cold_copies(nbytes)))]
    x = torch.randn(1, k, generator=gen, device="cuda").bfloat16()
    ref = (x.float() @ torch.cat(sets[0]).float().T)
    cands = [("table", config_for(n, k))] + [(f"C rows{c.block_n} w{c.num_warps}{' ahead' if c.num_stages > 1 else ''}", c)
                                            for c in C_CONFIGS]
    if name == "lm_head":
        t = time_in_graph(lambda x, ws: gemm_argmax_triton(x, ws[0]), [(x, ws) for ws in sets], replays=20)
        rows.append({"shape": name, "config": "table gemm_argmax", "us": t.us_per_call,
                     "frac": nbytes / (t.us_per_call * 1e-6) / 1e9 / copy})
    for label, cfg in cands:
        out = gemm_triton(x, sets[0], config=cfg)
        err = ((out.float() - ref).norm() / ref.norm()).item()
        t = time_in_graph((lambda c: lambda x, ws: gemm_triton(x, ws, config=c))(cfg), [(x, ws) for ws in sets],
                          replays=20)
        rows.append({"shape": name, "config": label, "us": t.us_per_call, "err": err,
                     "frac": nbytes / (t.us_per_call * 1e-6) / 1e9 / copy})
    del sets
    torch.cuda.empty_cache()
for r in rows:
    print(f"{r['shape']:22s} {r['config']:22s} {r['us']:8.2f} us {r['frac']:5.0%}  err {r.get('err', 0):.1e}")
json.dump({"copy_gbps": copy, "rows": rows}, open(sys.argv[1], "w"), indent=1)
