"""Build time and eager forward time of a preset at a given context (the model issue's figures).

    python -m benchmarks.eager_forward --preset flash-tp4-rank --context 8192 --out results/

Builds the preset with random bf16 weights directly on the GPU (timed), fills a cache of
`context` rows (KDA states, conv windows and MLA latents random, as after a prefill), then times
eager T=1 and T=6 forwards with CUDA events: warm-up, then the median of `--steps` calls.
Eager PyTorch is launch-bound here (thousands of small kernels); this is the baseline lingc
compiles away, not a performance target.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch

from lingc.models import Ling3Cache, build_model, preset

from .common import markdown_table, write_json


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--preset", default="flash-tp4-rank")
    ap.add_argument("--context", type=int, default=8192)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    dev = torch.device("cuda")
    cfg = preset(args.preset, router_dtype="bf16")

    torch.cuda.synchronize()
    t0 = time.perf_counter()
    model = build_model(cfg, device=dev, dtype=torch.bfloat16, seed=0)
    torch.cuda.synchronize()
    build_s = time.perf_counter() - t0
    params_gb = sum(p.numel() * p.element_size() for p in model.parameters()) / 1e9

    cache = Ling3Cache.allocate(cfg, args.context + 16, device=dev)
    g = torch.Generator(device=dev).manual_seed(1)
    for t in cache.tensors():
        t.normal_(0, 0.3, generator=g)
    rows = {}
    for T in (1, 6):
        ids = torch.randint(0, cfg.vocab_size, (T,), device=dev, generator=g)
        pos = torch.arange(args.context, args.context + T, device=dev)
        times = []
        with torch.no_grad():
            for i in range(args.steps + 3):
                s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                s.record()
                model(ids, pos, cache)
                e.record()
                e.synchronize()
                if i >= 3:
                    times.append(s.elapsed_time(e))
        rows[T] = statistics.median(times)
    result = {"preset": args.preset, "context": args.context, "build_s": build_s,
              "params_gb": params_gb, "eager_ms": {f"T={k}": v for k, v in rows.items()},
              "peak_gpu_gb": torch.cuda.max_memory_allocated() / 1e9}
    row = dict(preset=args.preset, gb=params_gb, build=build_s, t1=rows[1], t6=rows[6],
               peak=result["peak_gpu_gb"])
    print(markdown_table([row], [("preset", "preset", "s"), ("gb", "params GB", ".1f"),
                                 ("build", "build s", ".1f"), ("t1", "eager T=1 ms", ".1f"),
                                 ("t6", "eager T=6 ms", ".1f"), ("peak", "peak GPU GB", ".1f")]))
    if args.out:
        write_json(Path(args.out) / f"eager_forward_{args.preset}.json", result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
