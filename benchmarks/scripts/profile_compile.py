"""cProfile of the lingc compile + capture of flash-tp4-rank's step graphs on one GPU (the host
side of `Engine.prepare`), top functions by cumulative and by own time.

    python benchmarks/scripts/profile_compile.py --roles draft verify extend --out DIR
"""
import argparse
import cProfile
import io
import pstats
import time

import torch

from lingc.models import build_model, preset
from lingc.runtime.relay.engine import Engine

ap = argparse.ArgumentParser()
ap.add_argument("--roles", nargs="+", default=["draft", "verify", "extend"])
ap.add_argument("--preset", default="flash-tp4-rank")
ap.add_argument("--context", type=int, default=8192)
ap.add_argument("--out", required=True)
args = ap.parse_args()
model = build_model(preset(args.preset, router_dtype="bf16"), device="cuda", dtype=torch.bfloat16, seed=0)
eng = Engine(model, max_len=args.context + 1024, steps=5, options={"inductor": False}, progress=True)
pr = cProfile.Profile()
t0 = time.perf_counter()
pr.enable()
eng.prepare(tuple(args.roles))
torch.cuda.synchronize()
pr.disable()
print(f"prepare {args.roles}: {time.perf_counter() - t0:.1f} s")
for key, n in (("cumulative", 90), ("tottime", 50)):
    buf = io.StringIO()
    pstats.Stats(pr, stream=buf).sort_stats(key).print_stats(n)
    print(buf.getvalue())
pr.dump_stats(f"{args.out}/compile_{'_'.join(args.roles)}.prof")
