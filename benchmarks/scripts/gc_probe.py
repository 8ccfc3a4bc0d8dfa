"""How long one full garbage collection takes after the engine compiled a role (session 59).

    python benchmarks/scripts/gc_probe.py LAYERS ROLES      (e.g. 42 decode: flash-tp4-rank with 64 experts)

Builds flash-tp4-rank (LAYERS layers, 64 experts, random bf16 weights, on the CPU), prepares
ROLES (comma-separated) with gc_freeze off, then times gc.collect() three times and once after
gc.freeze(): what a collection inside a generation loop would stop the host for.
"""
import gc, sys, time, torch
from lingc.models import build_model, preset
from lingc.runtime.relay.engine import Engine
layers = int(sys.argv[1]); roles = tuple(sys.argv[2].split(","))
cfg = preset("flash-tp4-rank", num_hidden_layers=layers, num_experts=64)
model = build_model(cfg, device="cpu", dtype=torch.bfloat16, seed=0)
eng = Engine(model, max_len=256, steps=5, options={"inductor": False, "gc_freeze": False}, progress=False)
t0 = time.perf_counter(); eng.prepare(roles); print("prepare s", time.perf_counter() - t0)
print("tracked objects", len(gc.get_objects()), "counts", gc.get_count(), "stats", [s["collections"] for s in gc.get_stats()])
for i in range(3):
    t0 = time.perf_counter(); n = gc.collect(); print("gen2 collect ms", (time.perf_counter() - t0) * 1e3, "collected", n)
gc.freeze()
t0 = time.perf_counter(); gc.collect(); print("after freeze, gen2 collect ms", (time.perf_counter() - t0) * 1e3)
