"""Session 24 probe: lingc.rmsnorm_gemm (a layer's input norm inside its fused projection GEMM)
alone, against the two launches it replaces (lingc.rmsnorm + lingc.gemm) and the GEMM alone,
at flash-tp4-rank's fused KDA and MLA projections, M = 1 and 6. In the decode step (call 2) the
fold made the fused KDA projection ~19 us and the fused MLA one ~4 us slower a call; this says
whether the kernel itself or the chain around it pays that. Cold weights (one copy per call in
one CUDA graph, PDL-launched), medians; also NORM under other configs of the same weights.

    python benchmarks/scripts/probe_norm_gemm.py OUT.json

Runs on commit 204478c, the one that had lingc.rmsnorm_gemm (removed after this probe).
"""
import json
import sys

import torch

from benchmarks.common import cold_copies, time_in_graph
from lingc.runtime.kernels.gemm.config import GemmConfig, config_for
from lingc.runtime.kernels.gemm.kernel import gemm_triton, rmsnorm_gemm_triton
from lingc.runtime.kernels.gemm.naive import rmsnorm_gemm_reference
from lingc.runtime.kernels.norms.kernel import rmsnorm_triton

K, EPS = 2560, 1e-6
SHAPES = {"fused KDA": (1024,) * 5 + (8,), "fused MLA": (1536, 576, 8)}
EXTRA = {  # other configs of the NORM kernel, by shape
    "fused KDA": {"B bn64 s10": GemmConfig(64, 0, 10, 4, 1, prefetch=True),
                  "A bn64 bk128 s2 st2": GemmConfig(64, 128, 2, 4, 2),
                  "A bn64 bk256 s5 st2": GemmConfig(64, 256, 5, 4, 2)},
    "fused MLA": {"A bn64 bk128 s2": GemmConfig(64, 128, 2, 4, 4)},
}
gen = torch.Generator(device="cuda").manual_seed(0)
rows = []
for name, wrows in SHAPES.items():
    n = sum(wrows)
    copies = cold_copies(n * K * 2)
    sets = [[(torch.randn(r, K, generator=gen, device="cuda") / K**0.5).bfloat16() for r in wrows] for _ in range(copies)]
    nw = (torch.rand(K, generator=gen, device="cuda") + 0.5).bfloat16()
    for m in (1, 6):
        x = torch.randn(m, K, generator=gen, device="cuda").bfloat16()
        res = torch.randn(m, K, generator=gen, device="cuda").bfloat16()
        ref = rmsnorm_gemm_reference(x, res, nw, EPS, sets[0])[0].float()
        variants = {
            "gemm": lambda ws: gemm_triton(x, ws),
            "rmsnorm + gemm": lambda ws: gemm_triton(rmsnorm_triton(x, nw, res, EPS)[0], ws),
            "rmsnorm_gemm": lambda ws: rmsnorm_gemm_triton(x, res, nw, EPS, ws)[0],
        }
        for label, cfg in EXTRA[name].items():
            variants[f"rmsnorm_gemm {label}"] = lambda ws, cfg=cfg: rmsnorm_gemm_triton(x, res, nw, EPS, ws, config=cfg)[0]
        for variant, fn in variants.items():
            err = ((fn(sets[0]).float() - ref).pow(2).mean().sqrt() / ref.pow(2).mean().sqrt()).item()
            t = time_in_graph(fn, [(ws,) for ws in sets], replays=30)
            rows.append({"shape": name, "M": m, "variant": variant, "us": t.us_per_call, "rel_rms_vs_fold_ref": err})
            print(f"{name:10s} M={m} {variant:32s} {t.us_per_call:7.2f} us  (rel rms vs the fold's reference {err:.1e})",
                  flush=True)
    del sets
    torch.cuda.empty_cache()
print("table configs:", {name: str(config_for(sum(r), K)) for name, r in SHAPES.items()})
json.dump({"probe": "norm_gemm", "K": K, "rows": rows}, open(sys.argv[1], "w"), indent=1)
