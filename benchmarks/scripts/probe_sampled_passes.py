"""Where lingc.sampled_targets spends its time, rows 1 and 6 at V = 39296, top_p 0.9 (session 57: the
op took 0.35-4.6 ms before the histogram fix).

    python benchmarks/scripts/probe_sampled_passes.py            # each pass alone (CUDA events over
                                                                 # back-to-back launches, no PDL) at
                                                                 # 8 and 4 warps; registers, spills
    python benchmarks/scripts/probe_sampled_passes.py --profile  # the op's passes under torch.profiler
                                                                 # (top_p 0.9 and 1)
    python benchmarks/scripts/probe_sampled_passes.py --sweep    # the op (four PDL passes in a CUDA
                                                                 # graph) with fewer chunks a row
"""
import sys

import torch
from torch.profiler import ProfilerActivity, profile

import lingc.runtime.kernels.sampled_targets.kernel as K
import lingc.runtime.relay.ops as ops

V = 39296


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


def inputs(n):
    g = torch.Generator().manual_seed(n)
    logits = (torch.randn(n, V, generator=g) * 3).cuda()
    chain = torch.randint(0, V, (n,), generator=g).cuda()
    table = torch.rand(4, n, generator=g).cuda()
    step = torch.zeros(1, dtype=torch.int64, device="cuda")
    return chain, logits, table, step, torch.tensor([0.8], device="cuda"), torch.tensor([0.9], device="cuda")


def profiled(n):
    chain, logits, table, step, t, _ = inputs(n)
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


def passes_alone(n):
    chain, logits, table, step, t, p = inputs(n)
    dev = logits.device
    sub, iters, chunks = K.chunking(n, V, torch.cuda.get_device_properties(dev).multi_processor_count)
    y = torch.empty(n, dtype=torch.int64, device=dev)
    s = K.scratch(n, chunks, dev)
    for warps in (8, 4):
        def launch(pas):
            K.launch_pass(pas, s, chunks, sub, iters, chain, logits, table, step, t, p, y, num_warps=warps)
        for pas in range(4):
            launch(pas)
        torch.cuda.synchronize()
        times = [time_us(lambda: launch(pas)) for pas in range(4)]
        print(f"rows={n} chunks={chunks} sub={sub} iters={iters} warps={warps}: passes us " +
              " ".join(f"{x:.1f}" for x in times), flush=True)


def chunk_sweep(n, sms_values=(132, 64, 32)):
    """The op's four passes captured in a graph, with chunking as for a GPU of fewer SMs (fewer,
    longer chunks a row), us per replay at top_p 0.9 and 1."""
    chain, logits, table, step, t, _ = inputs(n)
    dev = logits.device
    for sms in sms_values:
        sub, iters, chunks = K.chunking(n, V, sms)
        y = torch.empty(n, dtype=torch.int64, device=dev)
        s = K.scratch(n, chunks, dev)
        row = []
        for top_p in (0.9, 1.0):
            p = torch.tensor([top_p], device=dev)

            def op():
                for pas in range(4):
                    K.launch_pass(pas, s, chunks, sub, iters, chain, logits, table, step, t, p, y, use_gdc=True)
            op()
            want = y.clone()
            torch.cuda.synchronize()
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                op()
            row.append(time_us(g.replay, reps=100))
            assert torch.equal(y, want), (sms, top_p)
        print(f"rows={n} sms={sms} chunks={chunks} iters={iters}: op us top_p 0.9 {row[0]:.2f}, top_p 1 {row[1]:.2f}",
              flush=True)


for n in (1, 6):
    if "--sweep" in sys.argv:
        chunk_sweep(n)
    elif "--profile" in sys.argv:
        profiled(n)
    else:
        passes_alone(n)
if "--profile" not in sys.argv and "--sweep" not in sys.argv:
    for kern in K._nucleus_pass_kernel.device_caches[0][0].values():
        print("regs", kern.n_regs, "spills", kern.n_spills, "shared", kern.metadata.shared, "warps",
              kern.metadata.num_warps)
