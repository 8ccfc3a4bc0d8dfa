"""swiglu_epilogue: numbers before/after, op counts, foreign formulations, no false matches,
and an expect test of its before/after graph."""

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from expecttest import assert_expected_inline

from backend_helpers import pinned_graph_text, run_and_report, stat
from lingc.graph_text import format_graph
from lingc.models import Ling3Cache, build_model, preset

H, I = 40, 24


def _w(*shape, seed):
    return nn.Parameter(torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) / shape[-1] ** 0.5,
                        requires_grad=False)


class PlainLinear(nn.Module):
    def __init__(self, limit=0.0):
        super().__init__()
        self.w_in, self.w_val, self.w_out = _w(I, H, seed=1), _w(I, H, seed=2), _w(H, I, seed=3)
        self.limit = limit

    def forward(self, x):
        a, b = F.linear(x, self.w_in), F.linear(x, self.w_val)
        act = F.silu(a)
        if self.limit:
            act, b = torch.clamp(act, max=self.limit), torch.clamp(b, -self.limit, self.limit)
        return F.linear(act * b, self.w_out)


class MatmulSigmoidCommuted(PlainLinear):
    """matmul on [1, T, H], x * sigmoid(x), the up side first in the product."""

    def forward(self, x):
        x3 = x.unsqueeze(0)
        gate = x3 @ self.w_in.t()
        return ((x3 @ self.w_val.t()) * (gate * torch.sigmoid(gate))) @ self.w_out.t()


class FusedGateUpChunk(PlainLinear):
    """One [2I, H] projection, split with chunk; activation under .float()."""

    def __init__(self):
        super().__init__()
        self.gate_up = nn.Parameter(torch.cat([self.w_in.data, self.w_val.data]), requires_grad=False)

    def forward(self, x):
        g, u = (x @ self.gate_up.T).chunk(2, dim=-1)
        return (F.silu(g.float()) * u.float()).to(x.dtype) @ self.w_out.T


class FusedGateUpSlice(FusedGateUpChunk):
    def forward(self, x):
        gu = F.linear(x, self.gate_up)
        return F.linear(F.silu(gu[..., :I]) * gu[..., I:], self.w_out)


class NotSwiGLU(PlainLinear):
    def forward(self, x):
        return F.linear(torch.relu(F.linear(x, self.w_in)) * F.linear(x, self.w_val), self.w_out)


class HalfClamped(PlainLinear):
    """Only the activation is clamped: not the SwiGLU clamp, must not match."""

    def forward(self, x):
        a = torch.clamp(F.silu(F.linear(x, self.w_in)), max=0.5)
        return F.linear(a * F.linear(x, self.w_val), self.w_out)


class TwoInputs(PlainLinear):
    """gate and up read different inputs: not a SwiGLU MLP."""

    def forward(self, x):
        return F.linear(F.silu(F.linear(x, self.w_in)) * F.linear(x * 2, self.w_val), self.w_out)


@pytest.mark.parametrize("module, matches", [
    (PlainLinear(), 1), (PlainLinear(limit=0.4), 1), (MatmulSigmoidCommuted(), 1),
    (FusedGateUpChunk(), 1), (FusedGateUpSlice(), 1),
    (NotSwiGLU(), 0), (HalfClamped(), 0), (TwoInputs(), 0),
])
def test_formulations(module, matches):
    x = torch.randn(5, H) * 2        # large enough that the 0.4 clamp bites
    with torch.no_grad():
        ref = module(x)
    out, report = run_and_report(module, x, disable_passes=["fuse_projections"])
    s = stat(report, "swiglu_epilogue")
    assert s.matches == matches
    assert report.kernels.counts().get("lingc", 0) == matches
    if matches:
        assert s.ops_after < s.ops_before
        assert report.kernels.counts()["library GEMM"] == 1     # only the down projection left
    torch.testing.assert_close(out.reshape(ref.shape), ref, rtol=1e-5, atol=1e-5)


def test_clamp_changes_result():
    x = torch.randn(5, H) * 2
    with torch.no_grad():
        assert not torch.allclose(PlainLinear(limit=0.4)(x), PlainLinear()(x), atol=1e-3)


def test_tiny_model_counts_and_numbers():
    model = build_model(preset("tiny"), progress=False)
    cache = Ling3Cache.allocate(model.config, 16)
    ids, pos = torch.tensor([5, 7, 9]), torch.tensor([0, 1, 2])
    with torch.no_grad():
        ref, _ = model(ids, pos, cache.clone())
    (logits, _), report = run_and_report(model, ids, pos, cache, disable_passes=[])
    s = stat(report, "swiglu_epilogue")
    cfg = model.config
    dense = cfg.first_k_dense_replace
    shared = (cfg.num_hidden_layers - dense) * cfg.num_shared_experts
    assert s.matches == dense                                # the shared experts belong to fused_moe
    assert s.ops_before - s.ops_after >= 5 * s.matches       # 2 mm + activation + mul per match, at least
    torch.testing.assert_close(logits, ref, rtol=1e-4, atol=1e-4)
    _, alone = run_and_report(model, ids, pos, cache, disable_passes=["fused_moe"])
    assert stat(alone, "swiglu_epilogue").matches == dense + shared      # 1 dense MLP + 5 shared experts


@pinned_graph_text
def test_expect_before_after():
    m = PlainLinear(limit=0.4)
    x = torch.randn(3, H)
    graphs = {}

    from lingc.passes.swiglu_epilogue import SwiGLUEpilogue

    class Spy(SwiGLUEpilogue):
        def apply(self, gm):
            graphs["before"] = format_graph(gm)
            n = super().apply(gm)
            gm.graph.eliminate_dead_code()
            graphs["after"] = format_graph(gm)
            return n

    from lingc import pass_manager
    orig = pass_manager.registered_passes
    pass_manager.registered_passes = lambda: [Spy]
    try:
        run_and_report(m, x)
    finally:
        pass_manager.registered_passes = orig
    assert_expected_inline(graphs["before"], """\
input %arg0_1  f32[24, 40]
input %arg1_1  f32[3, 40]
input %arg2_1  f32[24, 40]
input %arg3_1  f32[40, 24]
%permute = aten.permute(%arg0_1, [1, 0])                     f32[40, 24]
%mm = aten.mm(%arg1_1, %permute)                             f32[3, 24]
%permute_1 = aten.permute(%arg2_1, [1, 0])                   f32[40, 24]
%mm_1 = aten.mm(%arg1_1, %permute_1)                         f32[3, 24]
%neg = aten.neg(%mm)                                         f32[3, 24]
%exp = aten.exp(%neg)                                        f32[3, 24]
%add = aten.add.Tensor(%exp, 1)                              f32[3, 24]
%div = aten.div.Tensor(%mm, %add)                            f32[3, 24]
%clamp_max = aten.clamp_max(%div, 0.4)                       f32[3, 24]
%clamp_min = aten.clamp_min(%mm_1, -0.4)                     f32[3, 24]
%clamp_max_1 = aten.clamp_max(%clamp_min, 0.4)               f32[3, 24]
%mul = aten.mul.Tensor(%clamp_max, %clamp_max_1)             f32[3, 24]
%permute_2 = aten.permute(%arg3_1, [1, 0])                   f32[24, 40]
%mm_2 = aten.mm(%mul, %permute_2)                            f32[3, 40]
return [%mm_2]
""")
    assert_expected_inline(graphs["after"], """\
input %arg0_1  f32[24, 40]
input %arg1_1  f32[3, 40]
input %arg2_1  f32[24, 40]
input %arg3_1  f32[40, 24]
%swiglu_gemm_separate_default = lingc.swiglu_gemm_separate(%arg1_1, %arg0_1, %arg2_1, 0.4) f32[3, 24]
%permute_2 = aten.permute(%arg3_1, [1, 0])                   f32[24, 40]
%mm_2 = aten.mm(%swiglu_gemm_separate_default, %permute_2)   f32[3, 40]
return [%mm_2]
""")


@pinned_graph_text
def test_expect_tiny_dump(tmp_path):
    """Pins the tiny model's T=1 dump: the pass summary, the kernel table and the pass's diff."""
    import difflib
    from lingc.dump import format_summary
    model = build_model(preset("tiny"), progress=False)
    cache = Ling3Cache.allocate(model.config, 16)
    _, report = run_and_report(model, torch.tensor([5]), torch.tensor([3]), cache, role="decode",
                               dump_dir=str(tmp_path))
    d = tmp_path / report.dump_dir.split("/")[-1]
    before = next(d.glob("*-swiglu_epilogue.before.txt")).read_text().splitlines()
    after = next(d.glob("*-swiglu_epilogue.after.txt")).read_text().splitlines()
    diff = [l for l in difflib.unified_diff(before, after, n=0, lineterm="")
            if l[:1] in "+-" and not l.startswith(("+++", "---"))]
    lingc_rows = [r for r in report.kernels.format().splitlines() if r.startswith(("lingc", "library", "totals"))]
    assert_expected_inline(format_summary(report.stats, "decode", timings=False), """\
lingc pass summary (role decode)
pass                 matches   ops before -> after   time ms  note
stage_commit               -                     -         -  skipped: not for role decode
metadata_capture           0          1431 -> 1431         -
fused_moe                 10          1431 -> 1097         -  5 routers, 5 expert blocks (5 with shared expert)
swiglu_epilogue            1          1097 -> 1089         -
fuse_projections          14          1089 -> 1057         -  6 same-input groups
pdl_swap                  31           1057 -> 245         -  4 kda_chain, 2 mla_decode, 4 gated_head_rmsnorm, 15 rmsnorm, 2 mla_kv_write, 4 head_matmul (head gate folded into 2 mla_decode)
    glue: 4 copies of fresh values dropped, 0 casts folded or dropped, 0 epilogue writes made direct
    1 embedding gathers folded into their first norm
    5 MoE input norms folded into their routers
    2 latent norms folded into their cache writes
    3 region probes run, 3 reused for repeated layers
    PDL coverage 49/49 kernel-launching ops (100%)
    chain L0 KDA: embedding_rmsnorm > gemm > kda_chain > gated_head_rmsnorm > gemm > rmsnorm > swiglu_gemm_separate > gemm
    chain L1, L3-L4 KDA: rmsnorm > gemm > kda_chain > gated_head_rmsnorm > gemm > rmsnorm_router > moe_experts
    chain L2, L5 MLA: rmsnorm > gemm > mla_kv_write > head_matmul > mla_decode > head_matmul > gemm > rmsnorm_router > moe_experts
    chain head: rmsnorm > gemm
symm_allreduce             0            245 -> 245         -
cleanup                    0            245 -> 245         -
""")
    assert_expected_inline("\n".join(lingc_rows) + "\n", """\
lingc         lingc.gemm                            14  f32[1, 324]
lingc         lingc.rmsnorm                          7  (f32[1, 96], f32[1, 96])
lingc         lingc.moe_experts                      5  f32[1, 96]
lingc         lingc.rmsnorm_router                   5  (f32[1, 96], f32[1, 96], i32[1, 4], f32[1, 4])
lingc         lingc.gated_head_rmsnorm               4  f32[1, 4, 16]
lingc         lingc.head_matmul                      4  f32[4, 1, 40]
lingc         lingc.kda_chain                        4  f32[1, 4, 16]
lingc         lingc.mla_decode                       2  f32[1, 4, 40]
lingc         lingc.mla_kv_write                     2  
lingc         lingc.embedding_rmsnorm                1  (f32[1, 96], f32[1, 96])
lingc         lingc.swiglu_gemm_separate             1  f32[1, 160]
totals: glue 196, lingc 49
""")
    assert_expected_inline("\n".join(diff) + "\n", """\
-%permute_15 = aten.permute(%arg19_1, [1, 0])                 f32[96, 160]
-%mm_7 = aten.mm(%mul_30, %permute_15)                        f32[1, 160]
-%permute_16 = aten.permute(%arg20_1, [1, 0])                 f32[96, 160]
-%mm_8 = aten.mm(%mul_30, %permute_16)                        f32[1, 160]
-%neg_3 = aten.neg(%mm_7)                                     f32[1, 160]
-%exp_5 = aten.exp(%neg_3)                                    f32[1, 160]
-%add_20 = aten.add.Tensor(%exp_5, 1)                         f32[1, 160]
-%div_3 = aten.div.Tensor(%mm_7, %add_20)                     f32[1, 160]
-%mul_31 = aten.mul.Tensor(%div_3, %mm_8)                     f32[1, 160]
+%swiglu_gemm_separate_default = lingc.swiglu_gemm_separate(%mul_30, %arg19_1, %arg20_1, 0.0) f32[1, 160]
-%mm_9 = aten.mm(%mul_31, %permute_17)                        f32[1, 96]
+%mm_9 = aten.mm(%swiglu_gemm_separate_default, %permute_17)  f32[1, 96]
""")
