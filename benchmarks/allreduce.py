"""All-reduce of decode-sized messages across the GPUs of one host (issue #9 item 5).

    torchrun --nproc-per-node N -m benchmarks.allreduce --out DIR [--iters 50] [--calls-per-graph 100]

Tensor-parallel decoding of Ling-3 all-reduces the hidden state (2560 values) about twice per
layer: bf16 [2560] in a T=1 decode step, bf16 [6, 2560] in a T=6 verify step. These messages are
5-30 KB, so what the all-reduce costs is latency, not bandwidth. For each message (plus fp32
[2560] as an extra row) this measures:

- ``nccl graph``: ``torch.distributed._functional_collectives.all_reduce`` + wait, captured in a
  ``torch.cuda.CUDAGraph`` with ``--calls-per-graph`` all-reduces per graph (launch overhead
  amortised, as inside lingc's captured step graphs); per all-reduce = replay time / calls, the
  median over ``--iters`` replays timed with CUDA events after warm-up replays.
- ``nccl eager``: the same calls uncaptured, back to back (host launch cost included), for
  contrast.
- ``symm_mem one_shot graph``: PyTorch symmetric memory without multicast: a buffer from
  ``symm_mem.empty`` + ``symm_mem.rendezvous``; each all-reduce copies its input into the buffer
  and runs ``torch.ops.symm_mem.one_shot_all_reduce_out(buf, "sum", group_name, out)`` (every rank
  reads all peers' buffers over NVLink and sums them; no multicast object is involved), captured
  the same way. ``symm_mem one_shot_copy graph`` is the fused variant
  (``one_shot_all_reduce_copy_out``, the copy-in inside the kernel) where this torch has it. If
  the path raises, the error message goes into the JSON and the benchmark goes on.

Before timing, every method is checked on every rank against a reference sum computed locally
(exact small-integer inputs, compared bitwise, and random inputs within a bf16/fp32 tolerance);
the captured methods are checked on the output of a replay. A failed check is reported in the
table and the JSON and makes the exit status 1.

Output on rank 0: a markdown table (message, method, us per all-reduce, GB/s algbw = bytes /
time; the JSON also has busbw = algbw * 2(n-1)/n, each rank's median and the check result) and
``DIR/allreduce_<N>gpu.json`` with the device, torch/CUDA/NCCL versions, world size, the
``NCCL_NVLS_ENABLE`` and ``TORCH_SYMM_MEM_DISABLE_MULTICAST`` values and the date. NVLink
multicast must stay off on the machines we use: the script forces ``NCCL_NVLS_ENABLE=0`` and
``TORCH_SYMM_MEM_DISABLE_MULTICAST=1`` (warning if it had to change them) and never calls a
``multimem_*`` op. Without CUDA it runs on gloo (CPU) so the plumbing can be smoke-tested:
``nccl eager`` then times gloo with a wall clock and the CUDA methods say "skipped: no CUDA".

When to offer the symm-mem path as a lingc option. Offer it (for the TP all-reduces inside the
captured decode/verify graphs) only if, on the deployment machine and world size (TP4: run with
``--nproc-per-node 4``), multicast off, its in-graph time per all-reduce passes the check and
is clearly below ``nccl graph`` at BOTH decode sizes (bf16 2560 and 6 x 2560) -- by more than the
run-to-run spread of a few repeated runs, and by enough to matter per step (about two
all-reduces per layer over 42 layers: a 2 us saving is ~0.17 ms per step against a ~1-2 ms
step). Count the variant that lingc could really use: the copy-in (or fused copy) variant
unless the producing GEMM can write straight into the symmetric buffer. If it only wins at one
size, or wins at 2 GPUs but not at the deployed count (one-shot reads (n-1) peer buffers, so its
cost grows with n), keep NCCL: one collective library, no symmetric buffers to manage. A plus
that does not decide it alone: one-shot sums in a fixed rank order on every rank, so its result
does not depend on NCCL's size-dependent algorithm choice. First reading (2026-11-29, H200s on
NV18 NVLink, torch 2.11.0+cu130, NCCL 2.28.9, multicast off, us per all-reduce in a graph, nccl /
one_shot / one_shot_copy): 4 GPUs bf16 [2560] 15.7 / 7.8 / 6.8, bf16 [6, 2560] 18.4 / 9.0 / 7.8;
2 GPUs 11.4 / 7.3 / 6.5 and 12.7 / 7.8 / 6.7 -- all checks ok, so by this rule it qualifies.
"""

from __future__ import annotations

import abc
import argparse
import json
import os
import platform
import statistics
import sys
import time
import traceback
from datetime import timedelta
from pathlib import Path
from typing import Any, Callable

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol

# (name, dtype, shape): decode T=1 and verify T=6 hidden states; fp32 as an extra row.
MESSAGES = [
    ("bf16 [2560]", torch.bfloat16, (2560,)),
    ("bf16 [6, 2560]", torch.bfloat16, (6, 2560)),
    ("fp32 [2560]", torch.float32, (2560,)),
]
METHODS = ["nccl graph", "nccl eager", "symm_mem one_shot graph", "symm_mem one_shot_copy graph"]
# Multicast stays off (NVLS in NCCL, multicast objects in symmetric memory).
REQUIRED_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
SKIP_NO_CUDA = "skipped: no CUDA"


def _force_env() -> dict[str, Any]:
    """Set REQUIRED_ENV before any CUDA/NCCL/symm-mem initialisation; return what was there."""
    before = {k: os.environ.get(k) for k in REQUIRED_ENV}
    for key, value in REQUIRED_ENV.items():
        if os.environ.get(key) != value:
            if os.environ.get("RANK", "0") == "0":
                print(f"[allreduce] {key}={os.environ.get(key)!r} -> {value!r} (multicast stays off)",
                      file=sys.stderr)
            os.environ[key] = value
    return before


# ---------------------------------------------------------------------------------------------
# inputs and reference sums


def _int_input(shape, dtype, rank: int, device) -> torch.Tensor:
    """Small integers, exact in bf16 for any sum over up to 8 ranks (|sum| <= 6 * 36)."""
    n = 1
    for s in shape:
        n *= s
    base = (torch.arange(n, dtype=torch.float32) % 13) - 6
    return (base * (rank + 1)).reshape(shape).to(dtype=dtype, device=device)


def _rand_input(shape, dtype, rank: int, device) -> torch.Tensor:
    g = torch.Generator().manual_seed(1000 + rank)
    return torch.randn(shape, generator=g, dtype=torch.float32).to(dtype=dtype, device=device)


def _reference(make, shape, dtype, world: int) -> torch.Tensor:
    """The sum over all ranks' inputs, computed locally in fp32 (on the CPU)."""
    return sum(make(shape, dtype, r, "cpu").float() for r in range(world))


def _compare(out: torch.Tensor, ref: torch.Tensor, exact: bool, dtype) -> str | None:
    """None when out matches ref, else a short description of the mismatch."""
    got = out.detach().float().cpu()
    err = (got - ref).abs().max().item()
    if exact:
        return None if err == 0 else f"exact-input sum off by {err:g}"
    tol = (2e-2 if dtype == torch.bfloat16 else 1e-5) * max(1.0, ref.abs().max().item())
    return None if err <= tol else f"random-input sum off by {err:g} (tol {tol:g})"


# ---------------------------------------------------------------------------------------------
# methods: prepare() runs collectively before anything else (buffers, rendezvous; nothing for
# NCCL), step() does one all-reduce of the method's static input and returns its output.


class _Method(abc.ABC):
    def __init__(self, name: str, x: torch.Tensor, group, group_name: str):
        self.name, self.x, self.group, self.group_name = name, x, group, group_name
        self.graph = name.endswith(" graph")

    def prepare(self) -> None:
        """Collective setup before the first step; NCCL through funcol needs none."""

    @abc.abstractmethod
    def step(self) -> torch.Tensor:
        """One all-reduce of self.x; returns the reduced tensor."""


class _NcclFuncol(_Method):
    def step(self) -> torch.Tensor:
        out = funcol.all_reduce(self.x, "sum", self.group)
        if isinstance(out, funcol.AsyncCollectiveTensor):
            out = out.wait()
        return out


class _SymmOneShot(_Method):
    """one_shot_all_reduce_out on a symmetric buffer, input copied in (or fused copy)."""

    fused_copy = False

    def prepare(self) -> None:
        import torch.distributed._symmetric_memory as symm_mem

        op_name = "one_shot_all_reduce_copy_out" if self.fused_copy else "one_shot_all_reduce_out"
        try:
            self.op = getattr(torch.ops.symm_mem, op_name)
        except (AttributeError, RuntimeError) as e:
            raise RuntimeError(f"torch.ops.symm_mem.{op_name} not in torch {torch.__version__}") from e
        self.buf = symm_mem.empty(tuple(self.x.shape), dtype=self.x.dtype, device=self.x.device)
        self.handle = symm_mem.rendezvous(self.buf, self.group_name)
        self.multicast_ptr = int(getattr(self.handle, "multicast_ptr", 0) or 0)
        self.out = torch.empty_like(self.x)

    def step(self) -> torch.Tensor:
        if self.fused_copy:
            # one_shot_all_reduce_copy_out(symm_buffer, local_input, reduce_op, group_name, out)
            return self.op(self.buf, self.x, "sum", self.group_name, self.out)
        self.buf.copy_(self.x)
        # one_shot_all_reduce_out(input, reduce_op, group_name, out)
        return self.op(self.buf, "sum", self.group_name, self.out)


class _SymmOneShotCopy(_SymmOneShot):
    fused_copy = True


METHOD_CLASSES = {
    "nccl graph": _NcclFuncol,
    "nccl eager": _NcclFuncol,
    "symm_mem one_shot graph": _SymmOneShot,
    "symm_mem one_shot_copy graph": _SymmOneShotCopy,
}


# ---------------------------------------------------------------------------------------------
# timing


def _sync(cuda: bool) -> None:
    if cuda:
        torch.cuda.synchronize()


def _capture(step: Callable[[], torch.Tensor], calls: int) -> tuple[torch.cuda.CUDAGraph, list]:
    """Warm up on a side stream, then capture `calls` steps; returns the graph and the outputs of
    its first and last step (graph-owned tensors, rewritten by every replay)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            step()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    outs = []
    # thread_local: the NCCL watchdog thread may query events of earlier (eager) work meanwhile.
    with torch.cuda.graph(graph, capture_error_mode="thread_local"):
        for i in range(calls):
            out = step()
            if i in (0, calls - 1):
                outs.append(out)
    torch.cuda.synchronize()
    return graph, outs


def _time_graph(graph, calls: int, iters: int, warmup: int, ctrl) -> list[float]:
    """us per all-reduce of each replay. Replays are enqueued back to back with events between
    them and one synchronisation at the end, so after the first replay the ranks run in
    lock-step on the GPU and host jitter does not enter the times."""
    for _ in range(warmup):
        graph.replay()
    torch.cuda.synchronize()
    dist.barrier(group=ctrl)
    events = [torch.cuda.Event(enable_timing=True) for _ in range(iters + 1)]
    events[0].record()
    for i in range(iters):
        graph.replay()
        events[i + 1].record()
    torch.cuda.synchronize()
    return [events[i].elapsed_time(events[i + 1]) * 1e3 / calls for i in range(iters)]


def _time_eager(step, calls: int, iters: int, warmup: int, cuda: bool, ctrl) -> list[float]:
    """us per all-reduce of `iters` rounds of `calls` back-to-back eager all-reduces (CUDA events
    around each round; a wall clock on the CPU)."""
    for _ in range(warmup):
        step()
    _sync(cuda)
    dist.barrier(group=ctrl)
    times = []
    if cuda:
        events = [torch.cuda.Event(enable_timing=True) for _ in range(iters + 1)]
        events[0].record()
        for i in range(iters):
            for _ in range(calls):
                step()
            events[i + 1].record()
        torch.cuda.synchronize()
        times = [events[i].elapsed_time(events[i + 1]) * 1e3 / calls for i in range(iters)]
    else:
        for _ in range(iters):
            t0 = time.perf_counter()
            for _ in range(calls):
                step()
            times.append((time.perf_counter() - t0) * 1e6 / calls)
    return times


# ---------------------------------------------------------------------------------------------
# one (message, method) cell, with every stage agreed across ranks so that a failure on one rank
# becomes a recorded error everywhere instead of a hang


def _agree(ctrl, error: str | None) -> str | None:
    """The first rank's error of this stage (or None), the same on every rank."""
    errors = [None] * dist.get_world_size(ctrl)
    dist.all_gather_object(errors, error, group=ctrl)
    for rank, e in enumerate(errors):
        if e is not None:
            return f"rank {rank}: {e}"
    return None


def _run_cell(name: str, msg: tuple, ctx: dict) -> dict[str, Any]:
    label, dtype, shape = msg
    cuda, rank, world, ctrl = ctx["cuda"], ctx["rank"], ctx["world"], ctx["ctrl"]
    nbytes = dtype.itemsize
    for s in shape:
        nbytes *= s
    row: dict[str, Any] = {"message": label, "dtype": str(dtype).removeprefix("torch."),
                           "shape": list(shape), "bytes": nbytes, "method": name}
    if name != "nccl eager" and not cuda:
        row["status"] = SKIP_NO_CUDA
        return row
    if name == "nccl eager" and not cuda:
        row["method_backend"] = "gloo (CPU, wall clock)"

    device = ctx["device"]
    x = torch.empty(shape, dtype=dtype, device=device)
    method = METHOD_CLASSES[name](name, x, ctx["group"], ctx["group_name"])
    stage = "setup"
    try:
        err = None
        try:
            method.prepare()
        except Exception as e:  # noqa: BLE001  (recorded, the benchmark goes on)
            err = f"{type(e).__name__}: {e}"
        if (err := _agree(ctrl, err)) is not None:
            raise _CellError(err)
        if getattr(method, "multicast_ptr", 0):
            row["note"] = "symmetric memory reports a multicast pointer (multicast ops not used)"

        # correctness, eager (all methods) then in the graph (captured methods)
        stage = "check"
        checks = []
        err = None
        try:
            for make, exact in ((_int_input, True), (_rand_input, False)):
                x.copy_(make(shape, dtype, rank, device))
                out = method.step()
                _sync(cuda)
                bad = _compare(out, _reference(make, shape, dtype, world), exact, dtype)
                checks.append(bad)
        except Exception as e:  # noqa: BLE001
            err = f"{type(e).__name__}: {e}"
        if (err := _agree(ctrl, err)) is not None:
            raise _CellError(err)

        stage = "capture"
        graph = None
        if method.graph:
            err = None
            try:
                graph, outs = _capture(method.step, ctx["calls"])
                for make, exact in ((_int_input, True), (_rand_input, False)):
                    x.copy_(make(shape, dtype, rank, device))
                    graph.replay()
                    torch.cuda.synchronize()
                    ref = _reference(make, shape, dtype, world)
                    checks += [_compare(o, ref, exact, dtype) for o in outs]
            except Exception as e:  # noqa: BLE001
                err = f"{type(e).__name__}: {e}"
            if (err := _agree(ctrl, err)) is not None:
                raise _CellError(err)
        failures = sorted({c for c in checks if c is not None})
        check_errs = [None] * world
        dist.all_gather_object(check_errs, failures, group=ctrl)
        bad = {f"rank {r}: {f}" for r, fs in enumerate(check_errs) for f in fs}
        row["check"] = "ok" if not bad else "FAILED: " + "; ".join(sorted(bad))

        stage = "timing"
        x.copy_(_rand_input(shape, dtype, rank, device))
        if graph is not None:
            times = _time_graph(graph, ctx["calls"], ctx["iters"], ctx["warmup"], ctrl)
            row["calls_per_graph"] = ctx["calls"]
        else:
            times = _time_eager(method.step, ctx["calls"], ctx["iters"], ctx["warmup"], cuda, ctrl)
            row["calls_per_round"] = ctx["calls"]
        med = statistics.median(times)
        per_rank = [None] * world
        dist.all_gather_object(per_rank, med, group=ctrl)
        row.update(
            status="ok",
            us=med,
            us_min=min(times),
            us_per_rank=per_rank,
            us_max_rank=max(per_rank),
            replays=len(times),
            algbw_gbps=nbytes / (med * 1e-6) / 1e9,
            busbw_gbps=nbytes / (med * 1e-6) / 1e9 * 2 * (world - 1) / world,
        )
        del graph
    except _CellError as e:
        row["status"] = f"error ({stage}): {e}"
    _sync(cuda)
    return row


class _CellError(Exception):
    """A method failed at one stage of one table cell; the row records it and the run goes on."""


# ---------------------------------------------------------------------------------------------


def _environment(ctx: dict, env_before: dict) -> dict[str, Any]:
    cuda = ctx["cuda"]
    env = {
        "device": torch.cuda.get_device_name(ctx["device"]) if cuda else f"cpu ({platform.processor() or platform.machine()})",
        "backend": ctx["backend"],
        "world_size": ctx["world"],
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "nccl": ".".join(map(str, torch.cuda.nccl.version())) if cuda else None,
        "python": platform.python_version(),
        "hostname": platform.node(),
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "env": {k: os.environ.get(k) for k in REQUIRED_ENV},
        "env_before_script": env_before,
    }
    if cuda:
        props = torch.cuda.get_device_properties(ctx["device"])
        env["capability"] = f"{props.major}.{props.minor}"
        env["sm_count"] = props.multi_processor_count
    return env


def _table(rows: list[dict]) -> str:
    lines = ["| message | method | us per all-reduce | GB/s algbw | check |", "|---|---|---|---|---|"]
    for r in rows:
        if r.get("status") == "ok":
            us, bw = f"{r['us']:.2f}", f"{r['algbw_gbps']:.2f}"
        else:
            us, bw = r.get("status", "-"), "-"
        method = r["method"] + (" (gloo)" if r.get("method_backend") else "")
        lines.append(f"| {r['message']} | {method} | {us} | {bw} | {r.get('check', '-')} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--iters", type=int, default=50, help="timed replays (graph) or rounds (eager)")
    ap.add_argument("--warmup", type=int, default=5, help="untimed replays / rounds first")
    ap.add_argument("--calls-per-graph", type=int, default=100,
                    help="all-reduces per CUDA graph (and per timed eager round)")
    ap.add_argument("--methods", default=",".join(METHODS))
    ap.add_argument("--timeout-s", type=int, default=300, help="process-group timeout")
    args = ap.parse_args(argv)
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    unknown = [m for m in methods if m not in METHOD_CLASSES]
    if unknown:
        raise SystemExit(f"unknown method(s) {unknown}; valid: {METHODS}")
    if "RANK" not in os.environ:
        raise SystemExit("run under torchrun: torchrun --nproc-per-node N -m benchmarks.allreduce --out DIR")

    env_before = _force_env()
    cuda = torch.cuda.is_available()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    timeout = timedelta(seconds=args.timeout_s)
    if cuda:
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", timeout=timeout, device_id=device)
        # the control plane (stage agreement, gathering results) stays on the CPU
        ctrl = dist.new_group(backend="gloo", timeout=timeout)
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo", timeout=timeout)
        ctrl = dist.group.WORLD
    group = dist.group.WORLD
    ctx = {
        "cuda": cuda, "device": device, "rank": dist.get_rank(), "world": dist.get_world_size(),
        "ctrl": ctrl, "group": group, "group_name": group.group_name,
        "backend": dist.get_backend(group), "calls": args.calls_per_graph, "iters": args.iters,
        "warmup": args.warmup,
    }
    rows = []
    try:
        for msg in MESSAGES:
            for name in methods:
                t0 = time.perf_counter()
                try:
                    row = _run_cell(name, msg, ctx)
                except Exception as e:  # noqa: BLE001  (a bug in the plumbing: record, go on)
                    traceback.print_exc()
                    row = {"message": msg[0], "method": name, "status": f"error: {type(e).__name__}: {e}"}
                row["seconds"] = round(time.perf_counter() - t0, 3)
                rows.append(row)
                if ctx["rank"] == 0:
                    print(f"[allreduce] {msg[0]:<15} {name:<29} {row.get('status')}", file=sys.stderr,
                          flush=True)
        if ctx["rank"] == 0:
            payload = {
                "environment": _environment(ctx, env_before),
                "settings": {"iters": args.iters, "warmup": args.warmup,
                             "calls_per_graph": args.calls_per_graph,
                             "timing": "median over replays of (replay time / calls), CUDA events; "
                                       "algbw = bytes / time, busbw = algbw * 2(n-1)/n"},
                "symm_mem_api": "symm_mem.empty(*shape, dtype=, device=); symm_mem.rendezvous(buf, group_name); "
                                "torch.ops.symm_mem.one_shot_all_reduce_out(buf, 'sum', group_name, out); "
                                "torch.ops.symm_mem.one_shot_all_reduce_copy_out(buf, x, 'sum', group_name, out)",
                "results": rows,
            }
            args.out.mkdir(parents=True, exist_ok=True)
            path = args.out / f"allreduce_{ctx['world']}gpu.json"
            path.write_text(json.dumps(payload, indent=2, default=str))
            print(f"\nall-reduce, {ctx['world']} x {payload['environment']['device']}, "
                  f"backend {ctx['backend']}, torch {torch.__version__}\n")
            print(_table(rows))
            print(f"\nwrote {path}")
    finally:
        dist.barrier(group=ctrl)
        dist.destroy_process_group()
    failed = any(str(r.get("check", "")).startswith("FAILED") for r in rows)
    return 1 if failed else 0


if __name__ == "__main__":
    code = main()
    # Leave without the interpreter's teardown: on the CPU build, gloo's worker threads are
    # sometimes still joinable when C++ static destructors run, and a rank aborts with
    # "terminate called without an active exception" after its work is done and its result
    # written (seen in CI twice in a row, 2026-11-30). Everything is flushed first.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
