"""Per-pass device time of lingc.sampled_targets (torch.profiler over a few calls), rows 1 and 6 at
V = 39296, top_p 0.9 and 1.0: which of the four passes is slow (session 57)."""
import torch
from torch.profiler import ProfilerActivity, profile

import lingc.runtime.relay.ops as ops

for n in (1, 6):
    g = torch.Generator().manual_seed(n)
    logits = (torch.randn(n, 39296, generator=g) * 3).cuda()
    chain = torch.randint(0, 39296, (n,), generator=g).cuda()
    table = torch.rand(4, n, generator=g).cuda()
    step = torch.zeros(1, dtype=torch.int64, device="cuda")
    t = torch.tensor([0.8], device="cuda")
    for top_p in (0.9, 1.0):
        p = torch.tensor([top_p], device="cuda")
        for _ in range(3):
            ops.sampled_targets(chain, logits, table, step, t, p)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(5):
                ops.sampled_targets(chain, logits, table, step, t, p)
            torch.cuda.synchronize()
        rows = [(e.key, e.device_time_total / e.count, e.count) for e in prof.key_averages() if e.device_time_total > 0]
        print(f"rows={n} top_p={top_p}: " + "; ".join(f"{k[:40]} {us:.1f} us x{c}" for k, us, c in rows))
