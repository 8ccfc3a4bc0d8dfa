"""Each pass of lingc.sampled_targets alone (CUDA events over back-to-back launches, no PDL), rows 1
and 6 at V = 39296, top_p 0.9, with num_warps 8 and 4 (session 57: the op took 0.35-4.6 ms)."""
import torch
import triton

import lingc.runtime.kernels.sampled_targets.kernel as K
from lingc.runtime.kernels.gemm_common import persistent_buffer


def time_us(fn, reps=50):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(reps):
        fn()
    b.record()
    torch.cuda.synchronize()
    return a.elapsed_time(b) * 1e3 / reps


for n in (1, 6):
    g = torch.Generator().manual_seed(n)
    logits = (torch.randn(n, 39296, generator=g) * 3).cuda()
    chain = torch.randint(0, 39296, (n,), generator=g).cuda()
    table = torch.rand(4, n, generator=g).cuda()
    step = torch.zeros(1, dtype=torch.int64, device="cuda")
    t, p = torch.tensor([0.8], device="cuda"), torch.tensor([0.9], device="cuda")
    dev = logits.device
    sub, iters, chunks = K.chunking(n, 39296, torch.cuda.get_device_properties(dev).multi_processor_count)
    cp = max(2, triton.next_power_of_2(chunks))
    y = torch.empty(n, dtype=torch.int64, device=dev)
    stats = torch.empty((n, cp, 2), device=dev)
    hist = torch.empty((n, cp, 256), device=dev)
    above = torch.empty((n, cp), device=dev)
    rowf = torch.empty((n, 4), device=dev)
    rowi = torch.empty((n, 2), dtype=torch.int32, device=dev)
    tickets = persistent_buffer("sampled_targets_tickets", dev, 64, torch.int32, 0)
    for warps in (8, 4):
        def launch(pas):
            K._nucleus_pass_kernel[(n, chunks)](
                logits, logits.stride(0), chain, chain.stride(0), table, step, table.shape[0], table.stride(0),
                t, p, y, stats, hist, above, rowf, rowi, tickets, 39296, chunks,
                PASS=pas, N=n, NP=max(2, triton.next_power_of_2(n)), CP=cp, SUB=sub, ITERS=iters, USE_GDC=False,
                num_warps=warps)
        for pas in range(4):
            launch(pas)
        torch.cuda.synchronize()
        times = [time_us(lambda: launch(pas)) for pas in range(4)]
        print(f"rows={n} chunks={chunks} sub={sub} iters={iters} warps={warps}: passes us " +
              " ".join(f"{x:.1f}" for x in times), flush=True)
# Registers and spills of the compiled passes
for key, kern in K._nucleus_pass_kernel.device_caches[0][0].items():
    print("regs", kern.n_regs, "spills", kern.n_spills, "shared", kern.metadata.shared, "warps", kern.metadata.num_warps)
