"""Reusable pieces of lingc's GPU micro-benchmarks.

Decode kernels are weight-bandwidth bound and last a few microseconds, so three things decide
whether a number means anything, and every benchmark here does them the same way:

- The floor: ``copy_bandwidth_gbps`` measures a large device-to-device copy in the same run and
  process, (read + write bytes) / time. Kernels report their weight bandwidth as a fraction of it.
- Cold weights: a real decode step streams each weight once per step, long after it was last in
  L2. ``cold_copies`` says how many distinct copies of a weight set to rotate through so that the
  rotation exceeds L2 several times; the benchmark then passes a different copy to each call.
- No launch overhead: ``time_in_graph`` captures many calls into one CUDA graph and times graph
  replays with CUDA events, as the compiled decode step runs; the median replay over the number
  of calls is the per-call time (the kernel boundaries, PDL overlap included, are in it).

Reports go through ``markdown_table`` and ``write_json`` (which records the environment).
"""
from __future__ import annotations

import json
import math
import platform
import shutil
import statistics
import subprocess
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

__all__ = [
    "L2_BYTES",
    "GraphTiming",
    "require_cuda",
    "copy_bandwidth_gbps",
    "event_times_ms",
    "cold_copies",
    "time_in_graph",
    "environment",
    "gpu_state",
    "markdown_table",
    "write_json",
]

# H200 L2 (the device reports 62914560 bytes); rotations are sized against it. environment()
# records the figure of the device a result came from.
L2_BYTES = 60 * 1024**2


@dataclass
class GraphTiming:
    us_per_call: float  # median over replays of (replay time / calls_per_graph)
    us_per_call_min: float
    calls_per_graph: int
    replays: int


def rel_rms(a: torch.Tensor, b: torch.Tensor) -> float:
    """RMS of a - b over RMS of b, in float64 on the CPU (a kernel's output against its reference)."""
    a, b = a.detach().double().cpu(), b.detach().double().cpu()
    return ((a - b).pow(2).mean().sqrt() / b.pow(2).mean().sqrt()).item()


def peer_row(name: str, fn, sets: list[tuple], ref: torch.Tensor, replays: int, tol: float = 1e-2,
             **fields) -> dict | None:
    """A peer library's kernel (flash-linear-attention's) timed as lingc's are, over the rotated
    argument ``sets``: its row (``fields`` first, then the median and minimum us per call and its
    relative RMS error against ``ref``, within ``tol``), or None with the failure printed: a peer
    that fails to run is reported, not fatal."""
    try:
        err = rel_rms(fn(*sets[0]).view_as(ref), ref)
        t = time_in_graph(fn, sets, replays=replays)
    except Exception as e:  # noqa: BLE001
        print(f"{name} failed at T={fields.get('T')}: {type(e).__name__}: {e}")
        return None
    return {**fields, "us": t.us_per_call, "us_min": t.us_per_call_min, "rel_rms_err": err, "correct": err <= tol}


def to_cpu(a):
    """An op argument on the CPU (for a reference run): a tensor, a list of tensors, or as is."""
    if isinstance(a, (list, tuple)):
        return type(a)(to_cpu(b) for b in a)
    return a.cpu() if torch.is_tensor(a) else a


def require_cuda() -> torch.device:
    """The current CUDA device; exits with a message where there is none."""
    if not torch.cuda.is_available():
        raise SystemExit("this benchmark needs a CUDA device")
    return torch.device("cuda", torch.cuda.current_device())


def event_times_ms(fn: Callable[[], Any], reps: int, warmup: int = 0) -> list[float]:
    """CUDA-event time of each of `reps` calls of fn (after `warmup` untimed calls), in ms."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return times


def call_times_ms(fn: Callable[[], Any], reps: int, warmup: int = 0, cuda: bool = True) -> list[float]:
    """Each call's time in ms: CUDA events on the GPU (event_times_ms), wall clock in a CPU smoke run."""
    if cuda:
        return event_times_ms(fn, reps, warmup)
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return times


def copy_bandwidth_gbps(nbytes: int = 2 * 1024**3, reps: int = 20) -> float:
    """Device-to-device copy bandwidth in GB/s (1e9 B/s), counting read + write bytes.

    ``nbytes`` is far beyond L2 so the copy streams from and to HBM; the median of ``reps``
    single copies (after warm-up) is used.
    """
    require_cuda()
    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    ms = statistics.median(event_times_ms(lambda: dst.copy_(src), reps))
    del src, dst
    torch.cuda.empty_cache()
    return 2 * nbytes / (ms * 1e-3) / 1e9


def cold_copies(bytes_per_copy: int, *, l2_multiple: float = 4.0, minimum: int = 40) -> int:
    """How many distinct copies to rotate through so the rotation spans ``l2_multiple`` x L2."""
    return max(minimum, math.ceil(l2_multiple * L2_BYTES / max(1, bytes_per_copy)))


def time_in_graph(
    fn: Callable[..., Any],
    arg_sets: Sequence[tuple],
    *,
    calls_per_graph: int | None = None,
    replays: int = 30,
    warmup_replays: int = 3,
) -> GraphTiming:
    """Time ``fn`` per call inside one CUDA graph, rotating over ``arg_sets``.

    Call i of the graph is ``fn(*arg_sets[i % len(arg_sets)])``; give each argument set its own
    weight copy (``cold_copies``) to measure cold-weight time. ``calls_per_graph`` defaults to
    the number of argument sets (each copy used once per replay, so every call misses L2). Each
    set is run once eagerly on a side stream first, which compiles kernels and creates library
    handles outside the capture.
    """
    require_cuda()
    calls = calls_per_graph or len(arg_sets)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for args in arg_sets[: min(len(arg_sets), 3)]:
            fn(*args)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()

    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(calls):
            fn(*arg_sets[i % len(arg_sets)])
    for _ in range(warmup_replays):
        graph.replay()
    torch.cuda.synchronize()
    per_call = [ms * 1e3 / calls for ms in event_times_ms(graph.replay, replays)]
    del graph
    return GraphTiming(statistics.median(per_call), min(per_call), calls, replays)


# What nvidia-smi reports of the GPU a result came from (``gpu_state``).
GPU_STATE_FIELDS = ("uuid", "serial", "driver_version", "pstate", "clocks.sm", "clocks.max.sm", "clocks.mem",
                    "clocks.max.mem", "power.draw", "power.limit", "temperature.gpu",
                    "clocks_throttle_reasons.active")


def _gpu_uuid() -> str:
    """The current CUDA device's UUID as nvidia-smi names it (GPU-...)."""
    uuid = str(torch.cuda.get_device_properties(torch.cuda.current_device()).uuid)
    return uuid if uuid.startswith(("GPU-", "MIG-")) else f"GPU-{uuid}"


def gpu_state() -> dict[str, str]:
    """Which physical GPU a result came from and its clocks, power and throttle reasons now, from
    nvidia-smi (empty without a GPU or without nvidia-smi; ``error`` when it fails), so that two
    calls' results can be told apart by machine and clocks (session 28 had to rule out a clock
    drop by hand before finding two ptxas builds). A field this driver does not know is left out
    (one query per field then), never the whole record."""
    if not torch.cuda.is_available() or shutil.which("nvidia-smi") is None:
        return {}

    def query(fields):
        try:
            r = subprocess.run(["nvidia-smi", f"--id={_gpu_uuid()}", "--query-gpu=" + ",".join(fields),
                                "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=20)
        except (OSError, subprocess.SubprocessError) as e:
            return f"{type(e).__name__}: {e}"
        if r.returncode != 0:
            return (r.stderr or r.stdout).strip()[:300]
        values = [v.strip() for v in r.stdout.strip().splitlines()[0].split(",")] if r.stdout.strip() else []
        if len(values) != len(fields):
            return f"nvidia-smi gave {len(values)} fields for {len(fields)}: {r.stdout.strip()[:300]}"
        return dict(zip(fields, values))

    state = query(GPU_STATE_FIELDS)
    if isinstance(state, dict):
        return state
    one_by_one = {f: query((f,)) for f in GPU_STATE_FIELDS}
    kept = {f: v[f] for f, v in one_by_one.items() if isinstance(v, dict)}
    return kept or {"error": state}


def environment() -> dict[str, Any]:
    """What a result depends on: GPU (or "cpu" in a smoke run), driver-visible CUDA, library
    versions, time, and the GPU's identity and clocks when the result was written (``gpu_state``)."""
    import triton

    gpu = {"gpu": "none (CPU)"}
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        gpu = {"gpu": props.name, "sm_count": props.multi_processor_count,
               "l2_bytes": getattr(props, "L2_cache_size", None), "capability": f"{props.major}.{props.minor}"}
    return {
        **gpu,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "triton": triton.__version__,
        "python": platform.python_version(),
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "host": platform.node(),
        "gpu_state": gpu_state(),
        "triton_ptxas": _triton_ptxas(),
    }


def _triton_ptxas() -> str:
    """The ptxas Triton compiles with in this process, and its CUDA release (`import lingc` pins
    Triton's bundled one: lingc/toolchain.py)."""
    try:
        from triton import knobs
        tool = knobs.nvidia.ptxas
        return f"{tool.path} ({tool.version})"
    except Exception as e:  # a CPU-only or older Triton: say so rather than fail the benchmark
        return f"unknown ({type(e).__name__}: {e})"


def markdown_table(rows: Sequence[dict[str, Any]], columns: Sequence[tuple[str, str, str]]) -> str:
    """Render rows as a markdown table; columns are (key, header, format spec), e.g.
    ("us", "us/call", ".2f"). A missing or None value prints as "-"."""

    def cell(row, key, spec):
        value = row.get(key)
        return "-" if value is None else format(value, spec)

    lines = ["| " + " | ".join(h for _, h, _ in columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(cell(r, k, s) for k, _, s in columns) + " |" for r in rows]
    return "\n".join(lines)


def _jsonable(obj: Any) -> Any:
    return asdict(obj) if hasattr(obj, "__dataclass_fields__") else str(obj)


def write_json(path: str | Path, payload: dict[str, Any]) -> Path:
    """Write ``payload`` plus ``environment()`` as indented JSON; creates parent folders."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = {"environment": environment(), **payload}
    path.write_text(json.dumps(data, indent=2, default=_jsonable))
    return path
