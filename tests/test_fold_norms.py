"""fold_norms: numbers with the pass on and off (bitwise on the CPU: the fused op's CPU path is the
composition it replaces), op counts on the tiny model in every role, the cases it must leave
(a second consumer of the normed value, a prefill-sized GEMM, a residual read before the GEMM),
switching it off, and an expect test of its dump."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
from backend_helpers import pinned_graph_text, run_and_report, stat
from expecttest import assert_expected_inline
from model_helpers import randomize_cache_, tiny_model

import lingc.runtime.relay  # noqa: F401  (registers the relay ops)
from lingc.models import Ling3Cache

P = 4
VOCAB = 300


@pytest.fixture(scope="module")
def tiny():
    torch.manual_seed(0)
    model = tiny_model()
    return model, randomize_cache_(Ling3Cache.allocate(model.config, 32), seed=3, rows=P)


def kernel_rows(report):
    return {op: n for _, op, n, _ in report.kernels.rows}


@pytest.mark.parametrize("T, role", [(1, "decode"), (6, "forward")])
def test_tiny_model_numbers_and_counts(tiny, T, role):
    model, base = tiny
    L = model.config.num_hidden_layers
    ids, pos = torch.randint(0, VOCAB, (T,), generator=torch.Generator().manual_seed(T)), torch.arange(P, P + T)
    runs = {}
    for off in ([], ["fold_norms"]):
        cache = base.clone()
        out, report = run_and_report(model, ids, pos, cache, role=role, disable_passes=off)
        runs[bool(off)] = (out, cache, report)
    (on, c_on, r_on), (off, c_off, r_off) = runs[False], runs[True]
    for a, b in zip(on, off):
        assert torch.equal(a, b), "graph output, fold_norms on vs off"
    for a, b in zip(c_on.tensors(), c_off.tensors()):
        assert torch.equal(a, b), "cache, fold_norms on vs off"
    k_on, k_off = kernel_rows(r_on), kernel_rows(r_off)
    # every layer's input norm goes into its attention projection
    assert stat(r_on, "fold_norms").matches == L
    assert k_on["lingc.rmsnorm_gemm"] == L and "lingc.rmsnorm_gemm" not in k_off
    assert k_off["lingc.rmsnorm"] - k_on["lingc.rmsnorm"] == L
    assert k_off["lingc.gemm"] - k_on["lingc.gemm"] == L
    st = stat(r_on, "fold_norms")
    assert st.ops_before - st.ops_after >= L


def test_off_by_env(tiny, monkeypatch):
    model, base = tiny
    monkeypatch.setenv("LINGC_DISABLE_PASSES", "fold_norms")
    _, report = run_and_report(model, torch.tensor([5]), torch.tensor([P]), base.clone(), role="decode")
    assert stat(report, "fold_norms").skipped and "lingc.rmsnorm_gemm" not in kernel_rows(report)


class NormThenProj(nn.Module):
    """residual add + RMSNorm + one projection, with knobs for the cases the pass must leave."""

    def __init__(self, d=40, n=24, second_use=False, residual_first=False):
        super().__init__()
        self.w = nn.Parameter(1 + 0.1 * torch.randn(d))
        self.proj = nn.Linear(d, n, bias=False)
        self.second_use, self.residual_first = second_use, residual_first

    def forward(self, x, r):
        h = x + r
        y = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6) * self.w
        out = self.proj(y)
        if self.residual_first:
            h = h * 2                      # the residual is read before the GEMM in graph order
            out = out + h.sum()
        if self.second_use:
            out = out + y.sum()
        return out, h


@pytest.mark.parametrize("T, kwargs, folded, note", [
    (6, {}, 1, "1 rmsnorm -> gemm folded"),
    (6, {"second_use": True}, 0, None),
    (17, {}, 0, "17 rows > 16"),
])
def test_what_is_folded_and_left(T, kwargs, folded, note):
    torch.manual_seed(1)
    m = NormThenProj(**kwargs)
    x, r = torch.randn(T, 40), torch.randn(T, 40)
    out, report = run_and_report(m, x, r)
    want = m(x, r)
    for a, b in zip(out, want):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    st = stat(report, "fold_norms")
    assert st.matches == folded
    assert (note is None and not st.notes) or any(note in n for n in st.notes), st.notes


@pinned_graph_text
def test_expect_dump(tiny):
    model, base = tiny
    _, report = run_and_report(model, torch.tensor([5]), torch.tensor([P]), base.clone(), role="decode")
    st = stat(report, "fold_norms")
    assert_expected_inline(f"{st.matches} matches, ops {st.ops_before} -> {st.ops_after}\n" + "\n".join(st.notes) + "\n",
                           """\
6 matches, ops 254 -> 248
6 rmsnorm -> gemm folded
""")
