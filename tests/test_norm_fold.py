"""A layer's input norm after a MoE block, folded into the MoE's combine and the projection
after it: ``lingc::moe_experts_norm`` (h = residual + out, h * w, each token's sum of h^2 per
column tile) and ``lingc::gemm_normed`` (the GEMM's rows scaled by rsqrt(sum / K + eps)); the
kernels against their references (NaN-poisoned outputs, every element written), their
composition against the unfused norm and GEMM, batch invariance, the ops' checks, and
pdl_swap's fold (``norms_into_moe_outputs``) on the tiny model and where it must not fire.

On the CPU the kernels run under TRITON_INTERPRET=1 (conftest.py); with CUDA the same tests run
on the GPU and the ``gpu``-marked one adds flash-tp4-rank's shapes.
"""
import operator

import pytest
import torch
import torch.fx as fx
from torch._subclasses.fake_tensor import FakeTensorMode

from helpers import assert_close
from lingc.runtime.kernels.gemm import gemm_normed, gemm_normed_reference, gemm_reference
from lingc.runtime.kernels.gemm.config import GemmConfig
from lingc.runtime.kernels.gemm.kernel import gemm_triton
from lingc.runtime.kernels.gemm.naive import row_norm_scale
from lingc.runtime.kernels.moe_experts import moe_experts_norm, moe_experts_reference, residual_norm_start_reference
from lingc.runtime.kernels.moe_experts.norm_op import norm_tiles
from lingc.runtime.kernels.norms import rmsnorm_reference
from test_moe_experts import DEVICE, RTOL, SPLIT_CONFIGS, args_of, make_problem, run_kernel

ops = torch.ops.lingc
EPS = 1e-6
# h and h * w pass through two casts to bf16 after the MoE's own: under the interpreter each
# truncates (up to an ulp each), so bf16 is compared at twice test_moe_experts' tolerance there.
TOL = {torch.float32: 1e-5, torch.bfloat16: 2 * RTOL[torch.bfloat16]}


def norm_inputs(pb, seed):
    """A residual stream ~ N(0, 4) (larger than the MoE output, as in a model) and a gain ~ 1."""
    gen = torch.Generator().manual_seed(seed)
    t, h = pb["x"].shape
    residual = (2 * torch.randn(t, h, generator=gen)).to(device=pb["x"].device, dtype=pb["x"].dtype)
    weight = (1 + 0.3 * torch.randn(h, generator=gen)).to(device=pb["x"].device, dtype=pb["x"].dtype)
    return residual, weight


def exact_casts(dtype) -> bool:
    """Whether the kernel's fp32 -> dtype casts round as torch's (not the interpreter's bf16 cast,
    which truncates: tests/test_gemm.py)."""
    return dtype == torch.float32 or DEVICE == "cuda"


def run_norm_kernel(pb, residual, weight, config=None):
    """The launcher with the norm, into NaN-poisoned hw, h and ss (and workspaces)."""
    x = pb["x"]
    t, h = x.shape
    block_h = config.block_h if config else norm_tiles(x, pb["w_gate"], pb["shared_gate"])[1]
    nt = -(-h // block_h)
    h_out = torch.full((t, h), float("nan"), device=x.device, dtype=x.dtype)
    ss = torch.full((nt, t), float("nan"), device=x.device, dtype=torch.float32)
    hw = run_kernel(pb, config=config, norm=(residual, weight, h_out, ss))
    return hw, h_out, ss, block_h


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("t", [1, 2, 6, 16])
def test_moe_combine_starts_the_norm(t, dtype):
    pb = make_problem(t, dtype, seed=40 + t)
    residual, weight = norm_inputs(pb, seed=t)
    hw, h, ss, tile = run_norm_kernel(pb, residual, weight)
    assert not any(v.isnan().any() for v in (hw, h, ss)), "an output element was not written"
    # Against the kernel's own MoE output: the norm's start is the same arithmetic (h and hw
    # bit for bit; ss in the tile's reduction order).
    want_hw, want_h, want_ss = residual_norm_start_reference(run_kernel(pb), residual, weight, tile)
    if exact_casts(dtype):
        assert torch.equal(h, want_h) and torch.equal(hw, want_hw)
    else:
        assert_close(h, want_h, TOL[dtype])
        assert_close(hw, want_hw, TOL[dtype])
    assert_close(ss, want_ss, 1e-6 if exact_casts(dtype) else TOL[dtype])
    # Against the reference MoE end to end.
    ref_hw, ref_h, ref_ss = residual_norm_start_reference(moe_experts_reference(*args_of(pb)).to(
        pb["x"].device), residual, weight, tile)
    assert_close(h, ref_h, TOL[dtype])
    assert_close(hw, ref_hw, TOL[dtype])
    assert_close(ss, ref_ss, TOL[dtype])


@pytest.mark.parametrize("config", SPLIT_CONFIGS, ids=["bh16", "bh32"])
@pytest.mark.parametrize("t", [1, 6])
def test_moe_combine_norm_over_several_column_tiles(t, config):
    pb = make_problem(t, torch.float32, seed=7, h=96)
    residual, weight = norm_inputs(pb, seed=8)
    hw, h, ss, tile = run_norm_kernel(pb, residual, weight, config=config)
    assert ss.shape == (96 // tile, t) and not ss.isnan().any()
    want_hw, want_h, want_ss = residual_norm_start_reference(run_kernel(pb, config=config), residual, weight, tile)
    assert torch.equal(h, want_h) and torch.equal(hw, want_hw)
    assert_close(ss, want_ss, 1e-6)


def test_moe_combine_norm_is_batch_invariant():
    """Token 0's h, hw and sums of squares are the same bits alone and among five others."""
    pb6 = make_problem(6, torch.bfloat16, seed=3, routing="pool")
    residual, weight = norm_inputs(pb6, seed=4)
    pb1 = dict(pb6, x=pb6["x"][:1], topk_ids=pb6["topk_ids"][:1], topk_weights=pb6["topk_weights"][:1])
    hw6, h6, ss6, _ = run_norm_kernel(pb6, residual, weight)
    hw1, h1, ss1, _ = run_norm_kernel(pb1, residual[:1], weight)
    assert torch.equal(hw1[0], hw6[0]) and torch.equal(h1[0], h6[0]) and torch.equal(ss1[:, 0], ss6[:, 0])


GEMM_CASES = {
    "A-bk16-s3": GemmConfig(16, 16, 3),
    "A-bk32-s1": GemmConfig(16, 32, 1),
    "B-s3": GemmConfig(16, 0, 3, prefetch=True),
    "B-s1": GemmConfig(32, 0, 1, prefetch=True),
}


@pytest.mark.parametrize("config", GEMM_CASES.values(), ids=GEMM_CASES.keys())
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("m", [1, 6, 16])
def test_gemm_scales_rows_by_their_norm(m, dtype, config):
    gen = torch.Generator().manual_seed(m)
    k = 96
    x = torch.randn(m, k, generator=gen).to(DEVICE, dtype)
    weights = [(torch.randn(n, k, generator=gen) / k**0.5).to(DEVICE, dtype) for n in (37, 7)]
    ss = (k * (0.5 + torch.rand(3, m, generator=gen))).to(DEVICE)       # three parts, sum ~ 3k
    residual = torch.randn(m, 44, generator=gen).to(DEVICE, dtype)
    out = torch.full((m, 44), float("nan"), device=DEVICE, dtype=dtype)
    got = gemm_triton(x, weights, residual=residual, out=out, config=config, row_sumsq=ss, row_eps=EPS)
    assert not got.isnan().any()
    want = gemm_normed_reference(x.cpu(), [w.cpu() for w in weights], ss.cpu(), EPS, residual=residual.cpu())
    assert_close(got, want.to(DEVICE), RTOL[dtype])
    # The scale is not the identity here (sum ~ 3k over K = k: ~1/sqrt(3)).
    assert not torch.allclose(want.float(), gemm_reference(x.cpu(), [w.cpu() for w in weights],
                                                           residual=residual.cpu()).float(), rtol=0.05)


def test_gemm_normed_is_batch_invariant():
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(6, 96, generator=gen).to(DEVICE, torch.bfloat16)
    w = [(torch.randn(40, 96, generator=gen) / 10).to(DEVICE, torch.bfloat16)]
    ss = (96 * (0.5 + torch.rand(2, 6, generator=gen))).to(DEVICE)
    for config in GEMM_CASES.values():
        six = gemm_triton(x, w, config=config, row_sumsq=ss, row_eps=EPS)
        one = gemm_triton(x[2:3], w, config=config, row_sumsq=ss[:, 2:3].contiguous(), row_eps=EPS)
        assert torch.equal(six[2:3], one), config


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("t", [1, 6])
def test_ops_compose_to_the_norm_and_projection(t, dtype):
    """gemm_normed(moe_experts_norm(...)) against rmsnorm(moe_experts(...)) then gemm: the op pair
    the fold replaces (on CUDA: the kernels; on the CPU: the ops' references)."""
    pb = make_problem(t, dtype, seed=20 + t)
    residual, weight = norm_inputs(pb, seed=t)
    gen = torch.Generator().manual_seed(5)
    weights = [(torch.randn(n, 64, generator=gen) / 8).to(pb["x"].device, dtype) for n in (48, 16)]
    sig = pb["shared_sigmoid"]
    hw, h, ss = moe_experts_norm(*args_of(pb), residual, weight, shared_sigmoid=sig)
    got = gemm_normed(hw, weights, ss, EPS)
    out = ops.moe_experts(*args_of(pb), shared_sigmoid=sig)
    y, h_ref = ops.rmsnorm(out, weight, residual, EPS)
    assert torch.equal(h, h_ref), "the residual stream is the norm's, bit for bit"
    assert_close(got, ops.gemm(y, weights), 1e-5 if dtype == torch.float32 else 2e-2)


def test_op_checks_name_the_bad_argument():
    pb = make_problem(2, torch.float32, seed=1, device="cpu")
    residual, weight = norm_inputs(pb, seed=1)
    with pytest.raises(ValueError, match="residual must have x's shape"):
        moe_experts_norm(*args_of(pb), residual[:1], weight)
    with pytest.raises(ValueError, match=r"norm_weight must be \[H=64\]"):
        moe_experts_norm(*args_of(pb), residual, weight[:8])
    x, w = torch.randn(2, 16), [torch.randn(8, 16)]
    with pytest.raises(ValueError, match=r"ss must be \[NT >= 1, M=2\]"):
        gemm_normed(x, w, torch.ones(3, 5), EPS)
    with pytest.raises(ValueError, match="ss.dtype must be float32"):
        gemm_normed(x, w, torch.ones(3, 2, dtype=torch.float64), EPS)


def test_fake_impls_give_the_shapes():
    pb = make_problem(6, torch.bfloat16, seed=2, device="cpu")
    residual, weight = norm_inputs(pb, seed=2)
    nt, _ = norm_tiles(pb["x"], pb["w_gate"], pb["shared_gate"])
    with FakeTensorMode(allow_non_fake_inputs=True):
        hw, h, ss = moe_experts_norm(*args_of(pb), residual, weight)
        y = gemm_normed(hw, [torch.empty(24, 64, dtype=torch.bfloat16)], ss, EPS)
    assert hw.shape == h.shape == (6, 64) and ss.shape == (nt, 6) and ss.dtype == torch.float32
    assert y.shape == (6, 24) and y.dtype == torch.bfloat16


def test_reference_scale_is_the_norm_scale():
    h = torch.randn(3, 64)
    ss = torch.stack([(h[:, c:c + 16] ** 2).sum(1) for c in range(0, 64, 16)])
    assert_close(row_norm_scale(ss, 64, EPS), torch.rsqrt((h**2).mean(1) + EPS), 1e-6)
    assert_close(rmsnorm_reference(h, torch.ones(64), None, EPS)[0],
                 h * row_norm_scale(ss, 64, EPS)[:, None], 1e-6)


# ----------------------------------------------------------------------------------------------
# The fold.


def moe_norm_graph(readers="gemm"):
    """A graph: moe_experts -> rmsnorm(out, w, r) -> (gemm of y | y read by something else)."""
    from lingc.graph_build import emit
    pb = make_problem(2, torch.float32, seed=1, device="cpu")
    residual, weight = norm_inputs(pb, seed=1)
    g, fake, ph = fx.Graph(), FakeTensorMode(), {}
    for name, v in [*zip(("x", "ids", "wts", "wg", "wu", "wd", "sg", "su", "sd"), args_of(pb)[:9]),
                    ("r", residual), ("w", weight), ("W", torch.randn(24, 64))]:
        ph[name] = g.placeholder(name)
        ph[name].meta.update(val=fake.from_tensor(v), real=v)
    out = emit(g, ops.moe_experts.default, *(ph[n] for n in ("x", "ids", "wts", "wg", "wu", "wd", "sg", "su", "sd")),
               pb["limit"], pb["shared_limit"])
    rms = emit(g, ops.rmsnorm.default, out, ph["w"], ph["r"], EPS)
    y, h = emit(g, operator.getitem, rms, 0), emit(g, operator.getitem, rms, 1)
    res = emit(g, ops.gemm.default, y, [ph["W"]]) if readers == "gemm" else emit(g, torch.ops.aten.mul.Tensor, y, 2.0)
    g.output((res, h))
    return g, [ph[n].meta["real"] for n in ph]


def test_fold_rewrites_the_pair_and_keeps_the_values():
    from lingc.passes.pdl_norm_folds import norms_into_moe_outputs
    g, inputs = moe_norm_graph()
    before = fx.GraphModule(torch.nn.Module(), g)(*inputs)
    g2, _ = moe_norm_graph()
    assert norms_into_moe_outputs(g2) == 1
    targets = [n.target for n in g2.nodes if n.op == "call_function"]
    assert ops.rmsnorm.default not in targets and ops.moe_experts.default not in targets
    assert targets.count(ops.moe_experts_norm.default) == 1 and targets.count(ops.gemm_normed.default) == 1
    after = fx.GraphModule(torch.nn.Module(), g2)(*inputs)
    assert torch.equal(after[1], before[1])
    assert_close(after[0], before[0], 1e-5)


def test_fold_leaves_rows_read_by_other_ops():
    from lingc.passes.pdl_norm_folds import norms_into_moe_outputs
    g, _ = moe_norm_graph(readers="mul")
    assert norms_into_moe_outputs(g) == 0


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("t", [1, 6])
def test_gpu_flash_shapes_compose_to_the_norm_and_projection(t):
    """flash-tp4-rank's MoE (E = 512, H = 2560, I = Is = 192, top-8) into its fused KDA
    projection (5128 x 2560, design A split 2): the folded pair against the unfused one, and
    every output written."""
    pb = make_problem(t, torch.bfloat16, seed=9, e=512, h=2560, i=192, i_s=192, k=8, device="cuda")
    residual, weight = norm_inputs(pb, seed=9)
    gen = torch.Generator(device="cuda").manual_seed(3)
    weights = [(torch.randn(n, 2560, generator=gen, device="cuda") / 50).to(torch.bfloat16)
               for n in (1024, 1024, 1024, 1024, 1024, 8)]
    hw, h, ss = moe_experts_norm(*args_of(pb), residual, weight)
    assert ss.shape == (20, t) and not ss.isnan().any()
    got = gemm_normed(hw, weights, ss, EPS)
    y, h_ref = ops.rmsnorm(ops.moe_experts(*args_of(pb)), weight, residual, EPS)
    assert torch.equal(h, h_ref)
    assert_close(got, ops.gemm(y, weights), 1e-2)
