"""Which KDA prefill configurations compute the right answer on this GPU (session 40: chunk 64 with
the walk on 8 warps in one K part was wrong on an H200). Prints each configuration's relative RMS
error against kda_chunked at flash-tp4-rank's shape, with PDL on and off.

    python benchmarks/scripts/kda_prefill_config_check.py [T [CHUNK WARPS K_SPLIT PRECISION ...]]

With a configuration list (groups of four), only those, each with PDL on and off. Compiling the
"ieee" walks at chunk 64 takes minutes (session 40 call 5 ran out of time in them).
"""
import itertools
import sys

import torch

from lingc.models.kda_math import kda_chunked, l2norm
from lingc.runtime.kernels.kda_prefill.kernel import KdaPrefillConfig, kda_prefill_triton

T = int(sys.argv[1]) if len(sys.argv) > 1 else 1024
H, K, V = 8, 128, 128
gen = torch.Generator().manual_seed(0)
r = lambda *s: torch.randn(*s, generator=gen)  # noqa: E731
x = [l2norm(r(T, H, K)) * K ** -0.5, l2norm(r(T, H, K)), r(T, H, V), -5.0 * torch.sigmoid(r(T, H, K)),
     torch.sigmoid(r(T, H)), 0.3 * r(H, K, V)]
x = [t.cuda() for t in x]
o_ref, s_ref = kda_chunked(*x)
rel = lambda a, b: float((a - b).norm() / b.norm())  # noqa: E731
rest = sys.argv[2:]
if rest:
    picked = [(int(rest[i]), int(rest[i + 1]), int(rest[i + 2]), rest[i + 3]) for i in range(0, len(rest), 4)]
else:
    picked = list(itertools.product((32, 64), (4, 8), (1, 2), ("tf32x3", "ieee")))
for (chunk, warps, ks, prec), pdl in itertools.product(picked, (True, False)):
    cfg = KdaPrefillConfig(chunk=chunk, bv=16, num_warps_chunk=4, num_warps_state=warps, k_split=ks, precision=prec)
    o, s = kda_prefill_triton(*x, config=cfg, use_pdl=pdl)
    torch.cuda.synchronize()
    print(f"chunk {chunk} walk warps {warps} k_split {ks} {prec:6s} pdl {pdl!s:5s}: o rel {rel(o, o_ref):.1e}, "
          f"state rel {rel(s, s_ref):.1e}", flush=True)
