"""Shared helpers for lingc tests: numeric comparison (``assert_close``) and the CUDA-graph edge
reader that PDL tests use (``graph_edge_types``)."""

import torch

# The CUDA-graph edge reader lives with the runtime (the Engine's dump uses it too).
from lingc.runtime.relay.graphs import graph_edge_types  # noqa: F401,E402


def rel_rms_error(actual: torch.Tensor, ref: torch.Tensor) -> float:
    """||actual - ref||_rms / ||ref||_rms in float64 (absolute RMS when ref is all zeros)."""
    a = actual.detach().to(torch.float64).cpu()
    r = ref.detach().to(torch.float64).cpu()
    err = (a - r).pow(2).mean().sqrt().item() if a.numel() else 0.0
    scale = r.pow(2).mean().sqrt().item() if r.numel() else 0.0
    return err / scale if scale > 0 else err


def assert_close(actual: torch.Tensor, ref: torch.Tensor, rtol_rms: float) -> None:
    """Assert relative RMS error <= rtol_rms; NaN or Inf anywhere in actual or ref fails.

    One relative-RMS number per tensor (not an elementwise allclose) so that a tolerance can be
    stated once per dtype; the non-finite check is what catches unwritten (NaN-poisoned)
    outputs, which an RMS alone could hide behind a NaN-tolerant comparison. A kernel's result on
    the GPU may be compared with a reference computed on the CPU (moved there first).
    """
    assert actual.shape == ref.shape, f"shape {tuple(actual.shape)} != reference {tuple(ref.shape)}"
    actual = actual.to(ref.device)
    bad_ref = ~torch.isfinite(ref.detach().float())
    assert not bad_ref.any(), f"reference has {int(bad_ref.sum())} non-finite values"
    bad = ~torch.isfinite(actual.detach().float())
    if bad.any():
        first = tuple(int(i) for i in bad.nonzero()[0])
        raise AssertionError(f"{int(bad.sum())} of {actual.numel()} values non-finite, first at {first}")
    err = rel_rms_error(actual, ref)
    if not err <= rtol_rms:
        diff = (actual.detach().double() - ref.detach().double()).abs()
        worst = tuple(int(i) for i in (diff == diff.max()).nonzero()[0])
        raise AssertionError(
            f"relative RMS error {err:.3e} > {rtol_rms:.1e}; max |diff| {diff.max().item():.3e} at {worst}"
        )


def captured_replay(fn) -> tuple[list[int], object]:
    """Capture ``fn()`` into a CUDA graph (after a synchronize), return (the graph's edge types
    as ``graph_edge_types`` reads them, fn's output after one replay): the PDL tests' check that a
    chain keeps its programmatic edges and its bits under capture."""
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph(keep_graph=True)
    with torch.cuda.graph(graph):
        out = fn()
    edges = graph_edge_types(graph)
    graph.instantiate()
    graph.replay()
    torch.cuda.synchronize()
    return edges, out


def run_sm90_compile_check(script: str) -> None:
    """Run `script` (a real, not interpreted, Triton compile for an H200, usually through
    `sm90.compile_sm90` and the bundled ptxas) in a fresh interpreter without TRITON_INTERPRET, from the repository root;
    skip when the bundled ptxas is missing, else assert it exited cleanly."""
    import os
    import subprocess
    import sys

    import pytest

    tests = os.path.dirname(os.path.abspath(__file__))
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (tests, env.get("PYTHONPATH")) if p)  # for `import sm90`
    r = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True,
                       cwd=os.path.dirname(tests))
    if r.returncode != 0 and "ptxas" in r.stderr and "No such file" in r.stderr:
        pytest.skip("triton's bundled ptxas is not installed")
    assert r.returncode == 0, r.stderr[-3000:]


ROPE_TABLE_LAYOUTS = ["pair", "column", "halves", "stacked"]


def rope_tables(layout: str, P: int, R: int, g: torch.Generator, values: str = "random", interleaved: bool = False):
    """(rope_cos, rope_sin) views of one of a model's table layouts, P rows: "pair" two [P, R/2]
    tables; "column" two [P, R] (Hugging Face's cos_cached: each half repeated when built from
    angles, or each value twice for interleaved pairs); "halves" one [P, R] table of cos | sin
    (vLLM's cos_sin_cache); "stacked" one [P, R/2, 2] of (cos, sin) (torchtune's cache, a complex
    freqs_cis as view_as_real). ``values``
    "random" (any numbers: the kernel reads them, nothing assumes trigonometry) or "angles" (the
    inv_freq rope's own, freq = rope_inv_freq(R, 10000))."""
    from lingc.models.layers import rope_inv_freq

    half = R // 2
    if values == "angles":
        ang = torch.arange(P).float()[:, None] * rope_inv_freq(R, 10000.0)[None]
        c, s = ang.cos(), ang.sin()
    else:
        c, s = torch.randn(P, half, generator=g), torch.randn(P, half, generator=g)
    if layout == "pair":
        return c, s
    if layout == "column":
        if values == "random":
            return torch.randn(P, R, generator=g), torch.randn(P, R, generator=g)
        if interleaved:
            return c.repeat_interleave(2, -1), s.repeat_interleave(2, -1)
        return torch.cat([c, c], -1), torch.cat([s, s], -1)
    if layout == "halves":
        t = torch.cat([c, s], -1)
        return t[:, :half], t[:, half:]
    t = torch.stack([c, s], -1)                                        # "stacked"
    return t[..., 0], t[..., 1]
