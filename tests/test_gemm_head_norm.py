"""lingc::gemm_head_norm: KDA's gated head norm run in the o_proj GEMM's prologue, against the
plain-PyTorch reference (the norm, rounded to the weights' dtype, then the GEMM); both designs
and split-K; batch invariance; where it cannot fuse, the reason and the two-kernel fallback; the
op's checks and fake; on the GPU the flash-tp4-rank shape and the sm_90 compile (no spills, the
norm weight read before the PDL wait).

On the CPU the kernel runs under TRITON_INTERPRET=1 (conftest.py) on small shapes. Only design B
(one weight chunk per CTA) fuses: `head_norm_fusable` says why the others do not.
"""
import textwrap

import pytest
import torch

from helpers import assert_close, run_sm90_compile_check
from lingc.runtime.kernels.gemm import gemm_head_norm_reference
from lingc.runtime.kernels.gemm.config import GemmConfig
from lingc.runtime.kernels.gemm.kernel import gemm_triton, head_norm_fusable

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# As test_gemm.py: fp32 only the summation order differs; bf16 one rounding of the normalised
# o (the interpreter truncates) and of the output.
RTOL = {torch.float32: 1e-5, torch.bfloat16: 1e-2}
# K = 64 = 4 heads of 16, design B (the only one that fuses): chunks of 32 (two heads), of 16
# (one head), one chunk of 64.
CONFIGS = {
    "B-s2": GemmConfig(16, 0, 2, prefetch=True),
    "B-bn32-s4": GemmConfig(32, 0, 4, prefetch=True),
    "B-s1": GemmConfig(16, 0, 1, prefetch=True),
}
# (o, weights): KDA's fp32 output into bf16 or fp32 weights, or all bf16.
DTYPES = [(torch.float32, torch.float32), (torch.float32, torch.bfloat16), (torch.bfloat16, torch.bfloat16)]


def make_inputs(t, h, v, rows, o_dtype, w_dtype, seed, device=DEVICE):
    gen = torch.Generator().manual_seed(seed)
    o = torch.randn(t, h, v, generator=gen).to(device=device, dtype=o_dtype)
    gate = torch.randn(t, h, v, generator=gen).to(device=device, dtype=w_dtype)
    norm_w = (1 + 0.1 * torch.randn(v, generator=gen)).to(device=device, dtype=w_dtype)
    k = h * v
    weights = [(torch.randn(n, k, generator=gen) / k**0.5).to(device=device, dtype=w_dtype) for n in rows]
    return o, gate, norm_w, weights


def run_fused(o, gate, norm_w, weights, config=None, eps=1e-6):
    """The fused launch into a NaN-poisoned output (unwritten elements cannot pass)."""
    t, h, v = o.shape
    n = sum(w.shape[0] for w in weights)
    out = torch.full((t, n), float("nan"), device=o.device, dtype=weights[0].dtype)
    gemm_triton(o.reshape(t, h * v), weights, out=out, head_norm=(gate.reshape(t, h * v), norm_w, eps, v),
                config=config)
    return out


@pytest.mark.parametrize("o_dtype, w_dtype", DTYPES, ids=["f32-f32", "f32-bf16", "bf16-bf16"])
@pytest.mark.parametrize("config", CONFIGS.values(), ids=CONFIGS.keys())
@pytest.mark.parametrize("t", [1, 2, 6, 16])
def test_kernel_matches_reference(t, config, o_dtype, w_dtype):
    o, gate, norm_w, weights = make_inputs(t, 4, 16, (24, 7), o_dtype, w_dtype, seed=10 * t + 1)
    assert head_norm_fusable(31, 64, 16, config) is None
    assert_close(run_fused(o, gate, norm_w, weights, config), gemm_head_norm_reference(o, gate, norm_w, 1e-6, weights),
                 RTOL[w_dtype])


@pytest.mark.parametrize("config", CONFIGS.values(), ids=CONFIGS.keys())
def test_kernel_batch_invariant(config):
    # A row's bits do not depend on the rows run with it: the tile is 16 rows for any T, and
    # each (row, head) is normalised on its own.
    o, gate, norm_w, weights = make_inputs(6, 4, 16, (24, 7), torch.float32, torch.bfloat16, seed=7)
    full = run_fused(o, gate, norm_w, weights, config)
    for i in (0, 3, 5):
        one = run_fused(o[i:i + 1], gate[i:i + 1], norm_w, weights, config)
        assert torch.equal(one, full[i:i + 1]), i


def test_wrong_head_boundaries_are_caught():
    # Normalising over the wrong groups (here: two heads as one) must fail the comparison, so
    # the test above can tell a right head split from a wrong one.
    o, gate, norm_w, weights = make_inputs(2, 4, 16, (24,), torch.float32, torch.float32, seed=3)
    wrong = gemm_head_norm_reference(o.reshape(2, 2, 32), gate.reshape(2, 2, 32), norm_w.repeat(2), 1e-6, weights)
    with pytest.raises(AssertionError):
        assert_close(run_fused(o, gate, norm_w, weights, CONFIGS["B-s2"]), wrong, RTOL[torch.float32])


@pytest.mark.parametrize("n, k, head_dim, config, reason", [
    (32, 64, 12, GemmConfig(16, 0, 1, prefetch=True), "not a power of two"),
    (32, 72, 16, GemmConfig(16, 0, 1, prefetch=True), "not a multiple of the head dim"),
    (32, 64, 32, GemmConfig(16, 0, 4, prefetch=True), "does not hold whole heads"),
    (32, 96, 32, GemmConfig(16, 0, 2, prefetch=True), "masks K=96"),
    (32, 64, 16, GemmConfig(16, 16, 1), "design A"),
])
def test_fusable_names_the_reason(n, k, head_dim, config, reason):
    assert reason in head_norm_fusable(n, k, head_dim, config)


def test_table_configs_of_the_kda_o_proj():
    # flash-tp4-rank (N=2560, K=8 heads of 128) fuses; the full model's (32 heads) is a design A
    # shape and runs the two kernels.
    assert head_norm_fusable(2560, 1024, 128) is None
    assert "design A" in head_norm_fusable(2560, 4096, 128)


def test_op_cpu_path_is_the_reference():
    o, gate, norm_w, weights = make_inputs(3, 4, 16, (24, 7), torch.float32, torch.bfloat16, seed=5, device="cpu")
    out = torch.ops.lingc.gemm_head_norm(o, gate, norm_w, 1e-6, weights)
    assert torch.equal(out, gemm_head_norm_reference(o, gate, norm_w, 1e-6, weights))
    assert out.dtype == torch.bfloat16 and out.shape == (3, 31)


def test_op_schema_and_fake():
    assert str(torch.ops.lingc.gemm_head_norm.default._schema) == (
        "lingc::gemm_head_norm(Tensor o, Tensor gate, Tensor norm_weight, float eps, Tensor[] weights) -> Tensor")
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        o = torch.empty(6, 8, 128)
        gate = torch.empty(6, 8, 128, dtype=torch.bfloat16)
        out = torch.ops.lingc.gemm_head_norm(o, gate, torch.empty(128, dtype=torch.bfloat16), 1e-6,
                                             [torch.empty(2560, 1024, dtype=torch.bfloat16)])
    assert out.shape == (6, 2560) and out.dtype == torch.bfloat16
    o, gate, norm_w, weights = make_inputs(2, 4, 16, (24,), torch.float32, torch.float32, seed=9, device="cpu")
    torch.library.opcheck(torch.ops.lingc.gemm_head_norm, (o, gate, norm_w, 1e-6, weights))


@pytest.mark.parametrize("case, message", [
    ("k", "K mismatch"),
    ("stride", "unit stride along K"),
    ("none", "1 to 8 tensors"),
    ("o2d", r"gemm_head_norm: o must be \[T, H, V\]"),
    ("gate", r"gemm_head_norm: gate must be \[T, H, V\]"),
])
def test_op_rejects_bad_arguments(case, message):
    o, gate, norm_w, weights = make_inputs(2, 4, 16, (24,), torch.float32, torch.float32, seed=11, device="cpu")
    if case == "k":
        weights = [torch.randn(24, 60)]
    elif case == "stride":
        weights = [torch.randn(64, 24).T]
    elif case == "none":
        weights = []
    elif case == "o2d":
        o = o.reshape(2, 64)
    elif case == "gate":
        gate = gate[:, :2]
    with pytest.raises(ValueError, match=message):
        torch.ops.lingc.gemm_head_norm(o, gate, norm_w, 1e-6, weights)


# ----------------------------------------------------------------------------------------------
# GPU: flash-tp4-rank's KDA o_proj (8 heads of 128 into 2560), the gate a strided view of the
# fused projection's output, and the fallback.


@pytest.mark.gpu
@pytest.mark.parametrize("t", [1, 6])
def test_gpu_flash_tp4_rank_o_proj(t):
    gen = torch.Generator().manual_seed(40 + t)
    o = torch.randn(t, 8, 128, generator=gen).cuda()
    fused_out = torch.randn(t, 5128, generator=gen).to("cuda", torch.bfloat16)
    gate = fused_out[:, 4096:5120].view(t, 8, 128)          # a column window, as in the graph
    norm_w = (1 + 0.1 * torch.randn(128, generator=gen)).to("cuda", torch.bfloat16)
    w = (torch.randn(2560, 1024, generator=gen) / 32).to("cuda", torch.bfloat16)
    out = torch.ops.lingc.gemm_head_norm(o, gate, norm_w, 1e-6, [w])
    ref = gemm_head_norm_reference(o, gate, norm_w, 1e-6, [w])
    assert_close(out, ref, 4e-3)
    # The two-kernel path (norm kernel, then gemm) agrees to the same tolerance.
    unfused = torch.ops.lingc.gemm(torch.ops.lingc.gated_head_rmsnorm(o, gate, norm_w, 1e-6, torch.bfloat16)
                                   .view(t, 1024), [w])
    assert_close(out, unfused, 4e-3)
    if t > 1:
        one = torch.ops.lingc.gemm_head_norm(o[:1], gate[:1], norm_w, 1e-6, [w])
        assert torch.equal(one, out[:1])


@pytest.mark.gpu
def test_gpu_fallback_when_heads_do_not_fit_a_tile():
    # Head dim 48 (not a power of two): the op runs the norm kernel and the gemm.
    o, gate, norm_w, weights = make_inputs(3, 4, 48, (40,), torch.float32, torch.bfloat16, seed=21)
    assert head_norm_fusable(40, 192, 48) is not None
    out = torch.ops.lingc.gemm_head_norm(o, gate, norm_w, 1e-6, weights)
    assert_close(out, gemm_head_norm_reference(o, gate, norm_w, 1e-6, weights), 4e-3)


_COMPILE_CHECK = textwrap.dedent("""
    import re, triton
    from sm90 import compile_sm90, divisible_by_16, signature
    from lingc.runtime.kernels.gemm.kernel import _gemm_kernel, block_plan, k_plan
    from lingc.runtime.kernels.gemm.config import config_for
    from lingc.runtime.kernels.gemm_common import BLOCK_M

    for n, k in ((2560, 1024),):
        cfg = config_for(n, k)
        block_k, k_tiles, split_k, even_k = k_plan(k, cfg)
        starts, cols, _ = block_plan([n], cfg.block_n)
        ptrs = dict(x_ptr="*fp32", out_ptr="*bf16", ws_ptr="*fp32", ticket_ptr="*i32", bias_ptr="*bf16",
                    res_ptr="*bf16", mul_ptr="*bf16", hn_gate_ptr="*bf16", hn_w_ptr="*bf16")
        ints = ["M", "K", "stride_xm", "stride_om", "stride_ws_s", "stride_ws_m", "stride_hm"]
        sig = signature(_gemm_kernel, ptrs, ints, ["hn_eps"])
        sig.update(w_ptrs=("*bf16",), w_strides=("i32",), w_rows=("i32",), block_starts="constexpr",
                   col_starts="constexpr")
        const = dict(block_starts=starts, col_starts=cols, stride_xk=1, stride_on=1, stride_b=0, stride_rm=0,
                     stride_rn=0, stride_gm=0, stride_gn=0, stride_hk=1, BLOCK_M=BLOCK_M, BLOCK_N=cfg.block_n,
                     BLOCK_K=block_k, K_TILES=k_tiles, SPLIT_K=split_k, EVEN_K=even_k, HAS_BIAS=False,
                     HAS_RES=False, HAS_MUL=False, HEAD_NORM=True, HEAD_DIM=128, DOT_PRECISION="tf32",
                     DOT_UPCAST=False, USE_GDC=True)
        ptx, info = compile_sm90(_gemm_kernel, sig, const, num_warps=cfg.num_warps, num_stages=cfg.num_stages)
        assert " 0 bytes spill stores" in info, info
        # The weight chunk and the norm weight are requested before the wait.
        assert "ld.global" in ptx.split("griddepcontrol.wait")[0]
        print(n, k, [l for l in info.splitlines() if "registers" in l])
""")


def test_kernel_compiles_for_sm90_without_spills():
    run_sm90_compile_check(_COMPILE_CHECK)
