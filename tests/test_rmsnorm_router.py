"""lingc.rmsnorm_router: the MoE block's input norm done by the router's logits kernel.

The fused launch must give: h = residual + x exactly as the rmsnorm kernel rounds it; y =
RMSNorm(h) * weight within one rounding of the output dtype (the kernel sums the squares in
another order); ids and weights of the logits of the fp32 normed row (the declared numerics,
naive.rmsnorm_router_reference) - ids exactly, weights within 2e-6. Fresh random inputs, outputs
poisoned with NaN / -1 so an unwritten element fails; on the CPU under the interpreter at small
shapes, on the GPU at Ling-3's (E = 512, H = 2560). With ``round_before_weight`` (the Hugging
Face Llama form) the selection is the unfused rmsnorm + moe_router's on the kernel's y, bit for bit.
"""
import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from lingc.runtime.kernels.moe_router import rmsnorm_router, rmsnorm_router_reference
from lingc.runtime.kernels.moe_router.naive import moe_router_reference
from lingc.runtime.kernels.moe_router.kernel import rmsnorm_router_triton
from lingc.runtime.kernels.norms.kernel import rmsnorm_triton
from lingc.runtime.kernels.norms.naive import rmsnorm_reference

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
N_GROUP, TOPK_GROUP, TOP_K, SCALING, EPS = 8, 2, 4, 2.5, 1e-6


def make_inputs(t, e, h, dtype, seed, device=DEVICE, residual=True):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(t, h, generator=gen).to(device=device, dtype=dtype)
    res = (3 * torch.randn(t, h, generator=gen)).to(device=device, dtype=dtype) if residual else None
    nw = (1 + 0.2 * torch.randn(h, generator=gen)).to(device=device, dtype=dtype)
    gate = (torch.randn(e, h, generator=gen) / h**0.5).to(device=device, dtype=dtype)
    bias = (0.1 * torch.randn(e, generator=gen)).to(device)
    return x, res, nw, gate, bias


def run_fused(x, res, nw, gate, bias, n_group=N_GROUP, **kw):
    """The fused launcher into poisoned buffers (y, h NaN; ids -1; weights NaN)."""
    t, h = x.shape
    y = torch.full((t, h), float("nan"), dtype=x.dtype, device=x.device)
    hh = torch.full((t, h), float("nan"), dtype=x.dtype, device=x.device)
    ids = torch.full((t, TOP_K), -1, dtype=torch.int32, device=x.device)
    wts = torch.full((t, TOP_K), float("nan"), dtype=torch.float32, device=x.device)
    rmsnorm_router_triton(x, nw, res, EPS, gate, bias, n_group, TOPK_GROUP, TOP_K, SCALING, True,
                          y_out=y, h_out=hh, ids_out=ids, weights_out=wts, **kw)
    return y, hh, ids, wts


def assert_matches_reference(x, res, nw, gate, bias, n_group=N_GROUP, **kw):
    y, h, ids, wts = run_fused(x, res, nw, gate, bias, n_group, **kw)
    # h: the unfused norm kernel's residual add, bit for bit (the same one rounding, whatever the
    # platform's fp32 -> bf16 cast does: the interpreter truncates).
    _, h_norm = rmsnorm_triton(x, nw, res, EPS)
    assert torch.equal(h, h_norm), "h differs from the rmsnorm kernel's residual + x"
    assert not y.isnan().any(), "y has unwritten elements"
    # y: the norm of the kernel's own h within one rounding of the output dtype (the sum of
    # squares in another order, the cast's rounding mode).
    y_ref, _ = rmsnorm_reference(h.cpu(), nw.cpu(), None, EPS)
    ulp = {torch.float32: 2e-6, torch.bfloat16: 2**-7}[x.dtype]
    torch.testing.assert_close(y.cpu().float(), y_ref.float(), rtol=ulp, atol=ulp)
    ids_r, wts_r = rmsnorm_router_reference(h.cpu(), nw.cpu(), None, EPS, gate.cpu(), bias.cpu(), n_group,
                                            TOPK_GROUP, TOP_K, SCALING, True)[2:]
    assert torch.equal(ids.cpu(), ids_r), f"ids {ids.tolist()} != reference {ids_r.tolist()}"
    torch.testing.assert_close(wts.cpu(), wts_r, atol=2e-6, rtol=0)
    return y, h, ids, wts


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("t", [1, 2, 6])
@pytest.mark.parametrize("h,e", [(96, 64), (40, 16)])
def test_fused_matches_the_reference(h, e, t, dtype):
    x, res, nw, gate, bias = make_inputs(t, e, h, dtype, seed=100 * h + 10 * t + e)
    assert_matches_reference(x, res, nw, gate, bias, n_group=8 if e == 64 else 4)


def test_fused_without_residual_copies_x():
    x, _, nw, gate, bias = make_inputs(3, 64, 96, torch.bfloat16, seed=5, residual=False)
    _, h, _, _ = assert_matches_reference(x, None, nw, gate, bias)
    assert torch.equal(h, x)


def test_every_column_written_when_h_is_not_a_multiple_of_the_expert_blocks():
    # 64 experts in 16 blocks of 4 over H = 40 columns: slices of 3, the last block writes 0-1.
    x, res, nw, gate, bias = make_inputs(2, 64, 40, torch.float32, seed=9)
    assert_matches_reference(x, res, nw, gate, bias, block_e=4)


@pytest.fixture(scope="module")
def six_rows():
    """Six rows and their outputs at the launcher's default row groups (two groups of three)."""
    inputs = make_inputs(6, 64, 96, torch.bfloat16, seed=21)
    return inputs, run_fused(*inputs)


@pytest.mark.parametrize("groups", [1, 2, 3])
def test_fused_batch_invariant_and_row_groups_keep_bits(groups, six_rows):
    # A prefix of the rows in 1..3 row groups (5 rows: 5, 3 + 2, 2 + 2 + 1) gives each row the
    # bits it had among all six. (The interpreter takes ~1.2 s a row here.)
    (x, res, nw, gate, bias), full = six_rows
    for n in (1, 5):
        part = run_fused(x[:n], res[:n], nw, gate, bias, row_groups=groups)
        for a, b in zip(part, full):
            assert torch.equal(a, b[:n]), (n, groups)


def test_strided_rows_are_read_by_their_stride():
    x, res, nw, gate, bias = make_inputs(4, 64, 96, torch.bfloat16, seed=33)
    wide_x = torch.randn(4, 200, device=DEVICE).to(x.dtype)
    wide_r = torch.randn(4, 150, device=DEVICE).to(x.dtype)
    wide_x[:, 10:106] = x
    wide_r[:, 30:126] = res
    a = run_fused(wide_x[:, 10:106], wide_r[:, 30:126], nw, gate, bias)
    b = run_fused(x, res, nw, gate, bias)
    for u, v in zip(a, b):
        assert torch.equal(u, v)


def test_op_cpu_path_is_the_reference_and_the_norm():
    x, res, nw, gate, bias = make_inputs(3, 64, 96, torch.float32, seed=41, device="cpu")
    out = rmsnorm_router(x, nw, res, EPS, gate, bias, N_GROUP, TOPK_GROUP, TOP_K, SCALING, True)
    ref = rmsnorm_router_reference(x, nw, res, EPS, gate, bias, N_GROUP, TOPK_GROUP, TOP_K, SCALING, True)
    for a, b in zip(out, ref):
        assert torch.equal(a, b)
    y, h = rmsnorm_reference(x, nw, res, EPS)
    assert torch.equal(out[0], y) and torch.equal(out[1], h)
    # The logits of the fp32 normed row: the same selection as the router of y here (fp32: y is
    # that row, up to the order of one multiply).
    ids, wts = torch.ops.lingc.moe_router(y, gate, bias, N_GROUP, TOPK_GROUP, TOP_K, SCALING, True)
    assert torch.equal(out[2], ids)
    torch.testing.assert_close(out[3], wts, atol=2e-6, rtol=0)


def test_op_without_a_bias_equals_a_zero_bias():
    # A bias-less sigmoid router folded with its norm (fused_moe passes None): the persistent
    # zero bias, the same outputs as zeros.
    x, res, nw, gate, _ = make_inputs(3, 64, 96, torch.float32, seed=42, device=DEVICE)
    got = rmsnorm_router(x, nw, res, EPS, gate, None, N_GROUP, TOPK_GROUP, TOP_K, SCALING, True)
    want = rmsnorm_router(x, nw, res, EPS, gate, torch.zeros(64, device=DEVICE), N_GROUP, TOPK_GROUP, TOP_K,
                          SCALING, True)
    for a, b in zip(got, want):
        assert torch.equal(a, b)


def test_op_fake_shapes_and_errors():
    x, res, nw, gate, bias = make_inputs(3, 64, 96, torch.bfloat16, seed=1, device="cpu")
    with FakeTensorMode() as mode:
        f = [mode.from_tensor(v) for v in (x, res, nw, gate, bias)]
        y, h, ids, wts = rmsnorm_router(f[0], f[2], f[1], EPS, f[3], f[4], N_GROUP, TOPK_GROUP, TOP_K, SCALING, True)
    assert (y.shape, h.shape, ids.shape, wts.shape) == ((3, 96), (3, 96), (3, TOP_K), (3, TOP_K))
    assert (y.dtype, h.dtype, ids.dtype, wts.dtype) == (x.dtype, x.dtype, torch.int32, torch.float32)
    with pytest.raises(ValueError, match=r"rmsnorm_router: rmsnorm: residual must have x's shape"):
        rmsnorm_router(x, nw, res[:2], EPS, gate, bias, N_GROUP, TOPK_GROUP, TOP_K, SCALING, True)
    with pytest.raises(ValueError, match=r"rmsnorm_router: moe_router: H mismatch"):
        rmsnorm_router(x, nw, res, EPS, gate[:, :90], bias, N_GROUP, TOPK_GROUP, TOP_K, SCALING, True)
    with pytest.raises(ValueError, match=r"rmsnorm_router: rmsnorm: eps must be"):
        rmsnorm_router(x, nw, res, -1.0, gate, bias, N_GROUP, TOPK_GROUP, TOP_K, SCALING, True)


def test_a_broken_norm_is_caught():
    """The y comparison is tight enough to fail a kernel run with the wrong norm weight."""
    x, res, nw, gate, bias = make_inputs(2, 64, 96, torch.float32, seed=51)
    y, h, _, _ = run_fused(x, res, 1.01 * nw, gate, bias)
    y_ref, _ = rmsnorm_reference(h.cpu(), nw.cpu(), None, EPS)
    with pytest.raises(AssertionError):
        torch.testing.assert_close(y.cpu(), y_ref, rtol=2e-6, atol=2e-6)


def assert_llama_form_is_the_unfused_pair(x, res, nw, gate, bias, n_group=N_GROUP, **kw):
    """round_before_weight: h as the rmsnorm kernel's, y within one rounding of its Llama form
    (the sum of squares in another order), and ids and weights those of lingc.moe_router's kernel
    on this y, bit for bit (the unfused pair's selection)."""
    from lingc.runtime.kernels.moe_router.kernel import moe_router_triton

    y, h, ids, wts = run_fused(x, res, nw, gate, bias, n_group, round_before_weight=True, **kw)
    y_norm, h_norm = rmsnorm_triton(x, nw, res, EPS, round_before_weight=True)
    assert torch.equal(h, h_norm), "h differs from the rmsnorm kernel's residual + x"
    assert not y.isnan().any(), "y has unwritten elements"
    ulp = {torch.float32: 2e-6, torch.bfloat16: 2**-7, torch.float16: 2**-10}[x.dtype]
    torch.testing.assert_close(y.float(), y_norm.float(), rtol=2 * ulp, atol=2 * ulp)
    ids_u, wts_u = moe_router_triton(y, gate, bias, n_group, TOPK_GROUP, TOP_K, SCALING, True)
    assert torch.equal(ids, ids_u), f"ids {ids.tolist()} != the router's on y {ids_u.tolist()}"
    assert torch.equal(wts, wts_u)
    # Against the reference: y within a rounding (the interpreter truncates its casts), and the
    # reference router's selection on the kernel's y.
    y_ref = rmsnorm_router_reference(h.cpu(), nw.cpu(), None, EPS, gate.cpu(), bias.cpu(), n_group, TOPK_GROUP,
                                     TOP_K, SCALING, True, True)[0]
    torch.testing.assert_close(y.cpu().float(), y_ref.float(), rtol=2 * ulp, atol=2 * ulp)
    ids_r, wts_r = moe_router_reference(y.cpu(), gate.cpu(), bias.cpu(), n_group, TOPK_GROUP, TOP_K, SCALING, True)
    assert torch.equal(ids.cpu(), ids_r), f"ids {ids.tolist()} != reference {ids_r.tolist()}"
    torch.testing.assert_close(wts.cpu(), wts_r, atol=2e-6, rtol=0)
    return y, h, ids, wts


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=["fp32", "bf16", "fp16"])
@pytest.mark.parametrize("t", [1, 2, 6])
def test_llama_form_routes_its_rounded_rows(t, dtype):
    x, res, nw, gate, bias = make_inputs(t, 64, 96, dtype, seed=300 + 10 * t)
    assert_llama_form_is_the_unfused_pair(x, res, nw, gate, bias)


def test_llama_form_without_residual_and_in_uneven_slices():
    # H = 40 over 16 expert blocks of 4: slices of 3 columns, the last block writes 0-1.
    x, _, nw, gate, bias = make_inputs(2, 64, 40, torch.bfloat16, seed=17, residual=False)
    _, h, _, _ = assert_llama_form_is_the_unfused_pair(x, None, nw, gate, bias, block_e=4)
    assert torch.equal(h, x)


def test_llama_form_op_cpu_path_and_weight_dtype():
    x, res, nw, gate, bias = make_inputs(3, 64, 96, torch.bfloat16, seed=43, device="cpu")
    y, h, ids, wts = rmsnorm_router(x, nw, res, EPS, gate, bias, N_GROUP, TOPK_GROUP, TOP_K, SCALING, True, True)
    y_ref, h_ref = rmsnorm_reference(x, nw, res, EPS, round_before_weight=True)
    assert torch.equal(y, y_ref) and torch.equal(h, h_ref)
    assert not torch.equal(y, rmsnorm_reference(x, nw, res, EPS)[0])     # the forms differ here
    ids_r, wts_r = torch.ops.lingc.moe_router(y, gate, bias, N_GROUP, TOPK_GROUP, TOP_K, SCALING, True)
    assert torch.equal(ids, ids_r) and torch.equal(wts, wts_r)
    with pytest.raises(ValueError, match=r"rmsnorm_router: rmsnorm: round_before_weight"):
        rmsnorm_router(x, nw.float(), res, EPS, gate, bias, N_GROUP, TOPK_GROUP, TOP_K, SCALING, True, True)


@pytest.mark.gpu
@pytest.mark.parametrize("t", [1, 6, 16])
def test_gpu_ling3(t):
    x, res, nw, gate, bias = make_inputs(t, 512, 2560, torch.bfloat16, seed=700 + t)
    assert_matches_reference(x, res, nw, gate, bias)


@pytest.mark.gpu
def test_gpu_ling3_batch_invariant():
    x, res, nw, gate, bias = make_inputs(8, 512, 2560, torch.bfloat16, seed=777)
    full = run_fused(x, res, nw, gate, bias)
    for n in (1, 2, 6):
        for a, b in zip(run_fused(x[:n], res[:n], nw, gate, bias), full):
            assert torch.equal(a, b[:n]), n


@pytest.mark.gpu
@pytest.mark.parametrize("t", [1, 6])
def test_gpu_llama_form_ling3_shapes(t):
    x, res, nw, gate, bias = make_inputs(t, 512, 2560, torch.bfloat16, seed=900 + t)
    assert_llama_form_is_the_unfused_pair(x, res, nw, gate, bias)
