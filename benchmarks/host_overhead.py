"""Host cost of one eager lingc op call on CUDA: the custom-op dispatcher, the op's Python (checks,
buffers) and the Triton launch, each measured alone.

    python -m benchmarks.host_overhead [--calls 2000] [--out DIR]

A prompt chunk runs lingc's ops eagerly (prefill is not captured), so every call pays its host cost
once; when those costs add up past the GPU time, the host is the bottleneck of the prefill
(`benchmarks.prefill` prints the host's issue time). For each op on tiny CUDA inputs (the GPU work
is negligible, so the loop's time is the host's), the median over 5 loops of `--calls` calls of:

- ``op``        ``torch.ops.lingc.<name>``: the custom-op dispatcher, then the impl (what a traced or
                compiled graph calls)
- ``model``     the op object the model calls (``register_op``'s ``EagerOp``: straight to the impl in
                plain eager code on CUDA tensors)
- ``impl``      the op's registered Python function directly (argument checks, buffers, the launch)
- ``launch``    the Triton launcher function the impl calls (buffers and the launch)
- ``torch.add`` and ``F.linear`` on the same inputs, for scale
"""
from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from benchmarks.common import markdown_table, require_cuda, write_json


def host_us(fn, calls: int, loops: int = 5) -> float:
    """Median host microseconds per call of fn over `loops` loops of `calls` calls (no waits
    inside a loop; the device is drained before each)."""
    fn()
    per = []
    for _ in range(loops):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        per.append((time.perf_counter() - t0) / calls * 1e6)
    torch.cuda.synchronize()
    return statistics.median(per)


def cases():
    """(name, op call, model call, impl call, launcher call) on tiny CUDA inputs."""
    import lingc.runtime.kernels.moe_router.kernel as router_kernel
    import lingc.runtime.kernels.moe_router.op as router_op
    import lingc.runtime.kernels.moe_swiglu.kernel as swiglu_kernel
    import lingc.runtime.kernels.moe_swiglu.op as swiglu_op
    import lingc.runtime.kernels.norms.kernel as norm_kernel
    import lingc.runtime.kernels.norms.op as norm_op

    dev = "cuda"
    x = torch.randn(8, 2560, device=dev, dtype=torch.bfloat16)
    w = torch.randn(2560, device=dev, dtype=torch.bfloat16)
    h = torch.randn(8, 384, device=dev, dtype=torch.bfloat16)
    logits = torch.randn(8, 512, device=dev)
    bias = torch.randn(512, device=dev)
    yield ("rmsnorm", lambda: torch.ops.lingc.rmsnorm(x, w, None, 1e-6), lambda: norm_op.rmsnorm(x, w, None, 1e-6),
           lambda: norm_op._rmsnorm(x, w, None, 1e-6), lambda: norm_kernel.rmsnorm_triton(x, w, None, 1e-6))
    yield ("moe_swiglu", lambda: torch.ops.lingc.moe_swiglu(h, 0.0), lambda: swiglu_op.moe_swiglu(h, 0.0),
           lambda: swiglu_op._moe_swiglu(h, 0.0), lambda: swiglu_kernel.moe_swiglu_triton(h, 0.0))
    select = (logits, bias, 8, 4, 8, 2.5, True)
    yield ("moe_select", lambda: torch.ops.lingc.moe_select(*select), lambda: router_op.moe_select(*select),
           lambda: router_op._moe_select(*select), lambda: router_kernel.moe_select_triton(*select))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    require_cuda()
    x = torch.randn(8, 2560, device="cuda", dtype=torch.bfloat16)
    wl = torch.randn(64, 2560, device="cuda", dtype=torch.bfloat16)
    rows = [{"op": "torch.add", "op_us": host_us(lambda: x + x, args.calls)},
            {"op": "F.linear", "op_us": host_us(lambda: F.linear(x, wl), args.calls)}]
    for name, op, model, impl, launch in cases():
        row = {"op": name, "op_us": host_us(op, args.calls), "model_us": host_us(model, args.calls),
               "impl_us": host_us(impl, args.calls), "launch_us": host_us(launch, args.calls)}
        row["dispatcher_us"] = row["op_us"] - row["impl_us"]
        row["checks_us"] = row["impl_us"] - row["launch_us"]
        rows.append(row)
    table = markdown_table(rows, [("op", "op", "s"), ("op_us", "op us", ".1f"), ("model_us", "model us", ".1f"),
                                  ("impl_us", "impl us", ".1f"),
                                  ("launch_us", "launch us", ".1f"), ("dispatcher_us", "dispatcher us", ".1f"),
                                  ("checks_us", "checks us", ".1f")])
    print(table)
    if args.out:
        write_json(Path(args.out) / "host_overhead.json", {"rows": rows, "calls": args.calls})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
