"""Helpers for backend tests: compile with lingc and collect the CompileReports it produced."""

from __future__ import annotations

import torch

from lingc.backend import compile_reports


def compile_lingc(fn, **options):
    torch._dynamo.reset()
    options.setdefault("inductor", False)
    return torch.compile(fn, backend="lingc", fullgraph=True, dynamic=False, options=options)


def run_and_report(fn, *args, **options):
    """Compile fn with lingc, call it once, return (result, the CompileReport of that graph)."""
    n = len(compile_reports)
    compiled = compile_lingc(fn, **options)
    with torch.no_grad():
        out = compiled(*args)
    assert len(compile_reports) == n + 1, f"expected one compiled graph, got {len(compile_reports) - n}"
    return out, compile_reports[-1]


def stat(report, name):
    return next(s for s in report.stats if s.name == name)


# Expect tests of printed graphs are pinned on the CPU / torch 2.13 path (design.md): other torch
# versions name and order nodes differently.
import pytest  # noqa: E402

from lingc.compat import TORCH_VERSION  # noqa: E402

pinned_graph_text = pytest.mark.skipif(TORCH_VERSION != (2, 13),
                                       reason="graph text is pinned on torch 2.13")
