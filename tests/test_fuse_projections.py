"""fuse_projections: same-input groups, every other linear, the argmax GEMV; numbers, counts,
foreign formulations, and what it leaves alone (with the reason in the kernel table)."""

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from expecttest import assert_expected_inline

from backend_helpers import dump_op_changes, pinned_graph_text, run_and_report, stat
from lingc.models import Ling3Cache, build_model, preset

H = 40


def _p(*shape, seed):
    g = torch.Generator().manual_seed(seed)
    return nn.Parameter(torch.randn(*shape, generator=g) / shape[-1] ** 0.5, requires_grad=False)


class ForeignAttention(nn.Module):
    """Three same-input projections under other names, a gated mix, an output projection."""

    def __init__(self):
        super().__init__()
        self.alpha, self.beta, self.gamma = _p(24, H, seed=1), _p(24, H, seed=2), _p(6, H, seed=3)
        self.omega = _p(H, 24, seed=4)

    def forward(self, x):
        a, b, c = F.linear(x, self.alpha), F.linear(x, self.beta), F.linear(x, self.gamma)
        mixed = a * torch.sigmoid(b) + c.mean(-1, keepdim=True)
        return F.linear(mixed, self.omega)


class MatmulOn3D(ForeignAttention):
    """The same block written with matmul on [1, T, H] (one view of x per projection)."""

    def forward(self, x):
        x3 = x.unsqueeze(0)
        a, b, c = x3 @ self.alpha.T, x3 @ self.beta.T, torch.matmul(x3, self.gamma.t())
        return ((a * torch.sigmoid(b) + c.mean(-1, keepdim=True)) @ self.omega.T)[0]


class Biased(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(H, 30).requires_grad_(False)

    def forward(self, x):
        return self.lin(x)


class Greedy(nn.Module):
    def __init__(self, also_logits=False):
        super().__init__()
        self.head = _p(50, H, seed=5)
        self.also_logits = also_logits

    def forward(self, x):
        logits = F.linear(x, self.head).float()
        ids = logits.argmax(-1)
        return (ids, logits) if self.also_logits else ids


class ComputedOperand(nn.Module):
    def forward(self, x):
        return x @ (x * 2).T


@pytest.mark.parametrize("module, gemm, argmax, matches", [
    (ForeignAttention(), 2, 0, 2), (MatmulOn3D(), 2, 0, 2), (Biased(), 1, 0, 1),
    (Greedy(), 0, 1, 1), (Greedy(also_logits=True), 1, 0, 1), (ComputedOperand(), 0, 0, 0),
])
def test_formulations(module, gemm, argmax, matches):
    x = torch.randn(5, H)
    with torch.no_grad():
        ref = module(x)
    out, report = run_and_report(module, x)
    s = stat(report, "fuse_projections")
    rows = {op: n for cat, op, n, _ in report.kernels.rows}
    assert s.matches == matches
    assert rows.get("lingc.gemm", 0) == gemm and rows.get("lingc.gemm_argmax", 0) == argmax
    if not isinstance(module, ComputedOperand):
        assert report.kernels.counts().get("library GEMM", 0) == 0
    else:
        assert report.kernels.why == {"an operand is computed in the graph (attention math), not a weight": 1}
    # Against eager, and against the same compile with this pass off (its before / after).
    off, _ = run_and_report(module, x, disable_passes=["fuse_projections"])
    for refs in (ref, off):
        for o, r in zip(out if isinstance(out, tuple) else (out,), refs if isinstance(refs, tuple) else (refs,)):
            if r.dtype == torch.int64:
                assert torch.equal(o, r)
            else:
                torch.testing.assert_close(o, r, rtol=1e-5, atol=1e-5)


def test_group_is_one_launch_of_views():
    out, report = run_and_report(ForeignAttention(), torch.randn(3, H))
    s = stat(report, "fuse_projections")
    assert s.notes == ["1 same-input groups"]
    assert s.ops_before - s.ops_after >= 3       # three mm (and their permutes) -> one gemm + views


class LowRankPair(nn.Module):
    """A low-rank projection x -> A -> B next to another projection of x (Kimi Linear's f and
    gate projections): A joins x's group, B reads A's slice of that group's output."""

    def __init__(self):
        super().__init__()
        self.a, self.b, self.other = _p(8, H, seed=1), _p(H, 8, seed=2), _p(24, H, seed=3)

    def forward(self, x):
        return (x @ self.a.T) @ self.b.T, x @ self.other.T


def test_low_rank_pair_computes_each_product_once():
    x = torch.randn(3, H)
    m = LowRankPair()
    with torch.no_grad():
        ref = m(x)
    out, report = run_and_report(m, x)
    rows = {op: n for _, op, n, _ in report.kernels.rows}
    assert rows.get("lingc.gemm") == 2 and "aten.mm" not in rows, rows     # before: A ran twice
    for a, b in zip(out, ref):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


@pytest.fixture(scope="module")
def tiny():
    return build_model(preset("tiny"), progress=False)


@pytest.mark.parametrize("T", [1, 6])
def test_tiny_model(tiny, T):
    cache = Ling3Cache.allocate(tiny.config, 32)
    ids, pos = torch.randint(0, 300, (T,)), torch.arange(4, 4 + T)
    with torch.no_grad():
        ref, _ = tiny(ids, pos, cache.clone())
    (logits, _), report = run_and_report(tiny, ids, pos, cache, role="decode")
    torch.testing.assert_close(logits, ref, rtol=1e-4, atol=1e-4)
    cfg = tiny.config
    kda, mla = len(cfg.kda_layers), len(cfg.mla_layers)
    rows = {op: n for _, op, n, _ in report.kernels.rows}
    # every KDA layer: one fused q/k/v/f/g/b launch + o_proj; every MLA layer: fused q/kv_a/g +
    # dense; dense MLP down + lm_head: one each (routers and shared experts belong to fused_moe)
    assert rows["lingc.gemm"] == 2 * kda + 2 * mla + cfg.first_k_dense_replace + 1
    why = report.kernels.why
    assert set(why) <= {"an operand is computed in the graph (attention math), not a weight",
                        "batched product (gathered experts or attention): fused_moe / pdl_swap"}
    assert sum(why.values()) == report.kernels.counts()["library GEMM"]


@pinned_graph_text
def test_expect_tiny_op_changes(tiny, tmp_path):
    # What the pass adds and drops in the tiny decode graph, from its before / after dump: the
    # projections' mm (and their views) become one lingc.gemm launch per same-input group. (The
    # whole summary and kernel table: test_swiglu_pass.py::test_expect_tiny_dump.)
    cache = Ling3Cache.allocate(tiny.config, 16)
    _, report = run_and_report(tiny, torch.tensor([5]), torch.tensor([3]), cache, role="decode",
                               dump_dir=str(tmp_path))
    assert_expected_inline(dump_op_changes(tmp_path, report, "fuse_projections"), """\
+aten.add.Tensor 7
-aten.add.Tensor 7
+aten.cat 12
-aten.cat 12
-aten.mm 38
-aten.permute 38
+aten.sigmoid 6
-aten.sigmoid 6
+aten.slice.Tensor 34
-aten.slice.Tensor 4
+aten.view 10
-aten.view 10
+lingc.gemm 14
""")

