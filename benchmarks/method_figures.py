"""The independent figures of method.md, and the sanity lines a decode run prints against them.

The benchmark issue asks that eager PyTorch and Inductor reduce-overhead land within 25% of
method.md's independently measured times on flash-tp4-rank at context 8192, and the floor bytes
within 3% of its 2.75 / 7.1 GB, or that the output explain the difference. ``sanity_lines`` turns
a run's results into one line per figure it can compare ("within" or "OUTSIDE", with the ratio),
plus, for eager, what the step is made of: its ATen ops (views apart, each launches a kernel),
the wall time per op, and on a GPU the time the GPU was busy, beside method.md's 12,600 kernels
in 81 ms (launch-bound there: the host, not the GPU, sets the time).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode


@dataclass(frozen=True)
class MethodFigures:
    """method.md, "What eager PyTorch and Inductor do on flash-tp4-rank" (one H200, 2026-11-29)."""

    preset: str = "flash-tp4-rank"
    context: int = 8192
    eager_t1_ms: float = 81.0
    eager_t1_kernels: int = 12_600          # "about 12,600 kernels per T=1 step"
    inductor_t1_ms: float = 26.6            # torch.compile default (Inductor, fullgraph)
    reduce_overhead_t1_ms: float = 10.2
    reduce_overhead_t6_ms: float = 14.4
    plain_floor_gb: float = 2.75
    verify_floor_gb: float = 7.1            # T = 6, random routing
    verify_distinct_experts: int = 45       # "45 of 48 selected experts distinct per layer"
    verify_picks: int = 48                  # 6 tokens x top-8
    time_tolerance: float = 0.25
    bytes_tolerance: float = 0.03


METHOD = MethodFigures()


class _OpCounter(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.total = self.views = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.total += 1
        self.views += bool(func.is_view)
        return func(*args, **(kwargs or {}))


def count_aten_ops(fn: Callable[[], Any]) -> tuple[int, int]:
    """(ATen ops, of which not views) that one call of fn dispatches: an eager step's launches
    are its non-view ops (a view launches nothing; a non-view op one kernel, rarely more)."""
    with torch.no_grad(), _OpCounter() as counter:
        fn()
    return counter.total, counter.total - counter.views


def _compare(what: str, ours: float, theirs: float, tolerance: float, unit: str) -> str:
    ratio = ours / theirs
    verdict = "within" if abs(ratio - 1) <= tolerance else "OUTSIDE"
    return (f"{what}: {ours:.{3 if unit == 'GB' else 2}f} {unit} against method.md's {theirs:g} {unit} "
            f"({ratio:.2f}x): {verdict} {tolerance:.0%}")


def sanity_lines(preset: str, context: int, results: dict, plain_gb: float | None,
                 verify_gb: float | None, figures: MethodFigures = METHOD,
                 verify_experts: float | None = None) -> list[str]:
    """One line per method.md figure this run measured (none for another preset or context).

    ``results``: benchmarks.decode's per-mode dicts (``wall_ms``; eager's ``aten_ops``,
    ``kernel_ops`` and, on a GPU, ``gpu_busy_ms`` and ``kernels``; reduce-overhead-nextn's
    ``per_graph_ms`` with its ``verify T=6`` entry);
    ``plain_gb`` / ``verify_gb``: the run's floor bytes of a T = 1 step and a T = 6 verify;
    ``verify_experts``: that verify's distinct experts per MoE layer (mean), which explain its
    bytes: method.md counted uniform routing's, a real router's picks overlap more."""
    if (preset, context) != (figures.preset, figures.context):
        return []
    lines = []
    if plain_gb is not None:
        lines.append(_compare("floor bytes, T=1 step", plain_gb, figures.plain_floor_gb, figures.bytes_tolerance, "GB"))
    if verify_gb is not None:
        lines.append(_compare("floor bytes, T=6 verify", verify_gb, figures.verify_floor_gb,
                              figures.bytes_tolerance, "GB"))
        if verify_experts is not None:
            lines.append(f"  the verify's router chose {verify_experts:.1f} distinct experts of {figures.verify_picks} "
                         f"picks per MoE layer; method.md counted {figures.verify_distinct_experts} "
                         f"(random routing, taken as uniform)")
    eager = results.get("eager") or {}
    if eager.get("wall_ms"):
        lines.append(_compare("eager, T=1 step", eager["wall_ms"], figures.eager_t1_ms, figures.time_tolerance, "ms"))
        if eager.get("kernel_ops"):
            per_op = eager["wall_ms"] * 1e3 / eager["kernel_ops"]
            theirs = figures.eager_t1_ms * 1e3 / figures.eager_t1_kernels
            busy = (f"; the GPU busy {eager['gpu_busy_ms']:.1f} ms of it in {eager['kernels']} kernels"
                    if eager.get("gpu_busy_ms") is not None else "")
            lines.append(f"  eager: {eager['aten_ops']} ATen ops a step, {eager['kernel_ops']} of them not views, "
                         f"{per_op:.1f} us of wall time each{busy}; method.md's implementation: "
                         f"{figures.eager_t1_kernels} kernels, {theirs:.1f} us each")
    default = results.get("inductor") or {}
    if default.get("wall_ms"):
        lines.append(_compare("Inductor default, T=1 step", default["wall_ms"], figures.inductor_t1_ms,
                              figures.time_tolerance, "ms"))
    ro = results.get("reduce-overhead") or {}
    if ro.get("wall_ms"):
        lines.append(_compare("Inductor reduce-overhead, T=1 step", ro["wall_ms"], figures.reduce_overhead_t1_ms,
                              figures.time_tolerance, "ms"))
    verify = ((results.get("reduce-overhead-nextn") or {}).get("per_graph_ms") or {}).get("verify T=6")
    if verify:
        lines.append(_compare("Inductor reduce-overhead, T=6 verify", verify, figures.reduce_overhead_t6_ms,
                              figures.time_tolerance, "ms"))
    return lines
