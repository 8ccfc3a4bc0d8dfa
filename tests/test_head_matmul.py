"""lingc::head_matmul (MLA's absorbed per-head products): the Triton kernel vs the reference over
shapes and strides (W_uk read along N, W_uv along K), fp32 and bf16 operands, out_dtype,
heads_inner storage, batch invariance in M, the op's CPU path and argument checks, an sm_90
compile, and a CUDA-graph test with PDL on the GPU.

On the CPU the kernel runs under TRITON_INTERPRET=1 (conftest.py). Outputs are NaN-poisoned
before the launch, so an unwritten element fails. Tolerance: both sides sum exact fp32 products
in fp32, in different orders (a tree vs the library's), so fp32 outputs agree to ~1e-6 relative;
a bf16 output may differ by one rounding of that.
"""
import textwrap

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from helpers import assert_close, run_sm90_compile_check
from lingc.runtime.kernels.head_matmul import check_head_matmul_args, head_matmul, head_matmul_reference
from lingc.runtime.kernels.head_matmul.kernel import head_matmul_block_n, head_matmul_triton

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def operands(bsz, m, k, n, dtype, b_layout, seed):
    """a [B, M, K] (a transposed view of [M, B, K], as the model's q_nope is) and b [B, K, N] laid
    out as W_uk ('n': N contiguous) or W_uv ('k': K contiguous, a transposed [B, N, K])."""
    gen = torch.Generator().manual_seed(seed)
    a = torch.randn(m, bsz, k, generator=gen).to(dtype).transpose(0, 1)
    if b_layout == "n":
        b = torch.randn(bsz, k, n, generator=gen).to(dtype)
    else:
        b = torch.randn(bsz, n, k, generator=gen).to(dtype).transpose(1, 2)
    return a.to(DEVICE), b.to(DEVICE)


def launch(a, b, out_dtype=None, heads_inner=False, b_is_weight=True, groups=None):
    bsz, m, n = a.shape[0], a.shape[1], b.shape[2]
    dt = out_dtype or torch.float32
    out = (torch.full((m, bsz, n), float("nan"), dtype=dt, device=a.device).transpose(0, 1) if heads_inner
           else torch.full((bsz, m, n), float("nan"), dtype=dt, device=a.device))
    return head_matmul_triton(a, b, out_dtype, b_is_weight, out=out, groups=groups)


SHAPES = [  # (B, M, K, N): flash-tp4-rank's W_uk and W_uv products at T = 1 and 6, odd sizes
    (8, 1, 128, 512), (8, 6, 512, 128), (4, 3, 40, 24), (3, 16, 100, 36), (2, 5, 16, 8)]


@pytest.mark.parametrize("b_layout", ["n", "k"])
@pytest.mark.parametrize("shape", SHAPES)
def test_kernel_matches_reference(shape, b_layout):
    bsz, m, k, n = shape
    for dtype in (torch.float32, torch.bfloat16):
        a, b = operands(bsz, m, k, n, dtype, b_layout, seed=k + n)
        out = launch(a, b)
        assert out.dtype == torch.float32 and not out.isnan().any()
        assert_close(out, head_matmul_reference(a, b), 1e-6)


@pytest.mark.parametrize("heads_inner", [False, True])
def test_out_dtype_and_heads_inner_layout(heads_inner):
    a, b = operands(4, 6, 64, 48, torch.bfloat16, "k", seed=5)
    out = launch(a, b, torch.bfloat16, heads_inner)
    assert out.dtype == torch.bfloat16 and not out.isnan().any()
    assert out.transpose(0, 1).is_contiguous() == heads_inner
    assert_close(out.float(), head_matmul_reference(a, b), 4e-3)


def test_batch_invariant_in_rows():
    """Row m of an M-row product is bitwise the same as that row alone (the decode/verify rule).
    flash-tp4-rank's W_uk product with its 8 heads on the GPU, 2 of them under the interpreter
    (the heads are independent programs: 4x the time, no other path)."""
    a, b = operands(8 if DEVICE == "cuda" else 2, 8, 128, 512, torch.bfloat16, "n", seed=7)
    full = launch(a, b)
    for m in (1, 6):
        part = launch(a[:, :m], b)
        assert torch.equal(part, full[:, :m])
    assert torch.equal(launch(a[:, 5:6], b), full[:, 5:6])


@pytest.mark.parametrize("groups", [1, 2, 3, 8])
def test_row_groups_do_not_change_bits(groups):
    """The rows split over 1..8 programs per (head, tile), 7 rows (a short last group): every
    element written (NaN-poisoned output), the same bits as the table's grouping."""
    a, b = operands(4, 7, 64, 48, torch.bfloat16, "k", seed=17)
    out = launch(a, b, groups=groups)
    assert not out.isnan().any()
    assert torch.equal(out, launch(a, b))


def test_block_n_fills_the_grid_at_flash_shapes():
    # 8 heads x 128 x 512 and 8 x 512 x 128: 4096-value tiles, 128 programs each
    assert head_matmul_block_n(128, 512) == 32 and 8 * 512 // 32 == 128
    assert head_matmul_block_n(512, 128) == 8 and 8 * 128 // 8 == 128


def test_broken_kernel_variants_are_caught():
    a, b = operands(4, 3, 40, 24, torch.float32, "n", seed=9)
    ref = head_matmul_reference(a, b)
    with pytest.raises(AssertionError):          # the transposed weight
        assert_close(launch(a, b.transpose(1, 2).contiguous().transpose(1, 2).flip(1)), ref, 1e-6)
    out = torch.full((4, 3, 24), float("nan"), device=a.device)
    head_matmul_triton(a[:, :2], b, out=out[:, :2])  # a row never launched stays poisoned
    assert out[:, 2].isnan().all()


@pytest.mark.parametrize("heads_inner", [False, True])
def test_op_cpu_path_is_the_reference(heads_inner):
    gen = torch.Generator().manual_seed(3)
    a = torch.randn(4, 2, 16, generator=gen, dtype=torch.bfloat16)
    b = torch.randn(4, 16, 8, generator=gen, dtype=torch.bfloat16)
    out = head_matmul(a, b, True, torch.bfloat16, heads_inner)
    assert torch.equal(out, torch.bmm(a.float(), b.float()).to(torch.bfloat16))
    assert out.transpose(0, 1).is_contiguous() == heads_inner
    with FakeTensorMode():
        fa, fb = torch.empty(4, 2, 16), torch.empty(4, 16, 8, dtype=torch.bfloat16)
        f = torch.ops.lingc.head_matmul(fa, fb, True, None, heads_inner)
        assert f.shape == (4, 2, 8) and f.dtype == torch.float32 and f.stride() == out.stride()


@pytest.mark.parametrize("a_shape, b_shape, dtype, match", [
    ((4, 2, 16), (4, 16), torch.float32, "3-d"),
    ((4, 2, 16), (3, 16, 8), torch.float32, "do not chain"),
    ((4, 17, 16), (4, 16, 8), torch.float32, "at most 16 rows"),
    ((1, 1, 2048), (1, 2048, 8), torch.float32, "K=2048"),
    ((4, 2, 16), (4, 16, 8), torch.int32, "dtype"),
])
def test_bad_arguments_are_named(a_shape, b_shape, dtype, match):
    a = torch.zeros(a_shape, dtype=dtype)
    b = torch.zeros(b_shape, dtype=torch.float32 if dtype == torch.int32 else dtype)
    with pytest.raises(ValueError, match=match):
        check_head_matmul_args(a, b, True)


_COMPILE_CHECK = textwrap.dedent("""
    from sm90 import compile_sm90, divisible_by_16, signature
    from lingc.runtime.kernels.head_matmul.kernel import _head_matmul_kernel as fn, head_matmul_block_n
    ints = ["M", "ROWS", "K", "N", "stride_ab", "stride_am", "stride_ak", "stride_bb", "stride_bk", "stride_bn",
            "stride_ob", "stride_om"]
    for k, n, bdt in ((128, 512, "*bf16"), (512, 128, "*bf16")):
        ptrs = dict(a_ptr="*fp32", b_ptr=bdt, out_ptr="*fp32")
        # W_uk: N contiguous; W_uv: K contiguous
        unit = dict(stride_ak=1, stride_bn=1) if n == 512 else dict(stride_ak=1, stride_bk=1)
        ints_k = [i for i in ints if i not in unit]
        const = dict(**unit, BLOCK_K=k, BLOCK_N=head_matmul_block_n(k, n), B_IS_WEIGHT=True, USE_GDC=True)
        ptx, info = compile_sm90(fn, signature(fn, ptrs, ints_k), const,
                                 divisible_by_16(fn, list(ptrs) + [i for i in ints_k if i not in ("M", "ROWS")]), num_warps=4)
        assert " 0 bytes spill stores" in info, info
        before = ptx.split("griddepcontrol.wait")[0]
        assert "ld.global" in before, "the weight tile must be requested before the PDL wait"
        assert "griddepcontrol.launch_dependents" in ptx
""")


def test_compiles_for_sm90_with_the_weight_before_the_wait():
    run_sm90_compile_check(_COMPILE_CHECK)


@pytest.mark.gpu
def test_gpu_flash_shapes_in_a_cuda_graph():
    """Both flash-tp4-rank products at T = 1 and 6, captured with PDL, against the reference."""
    cases = []
    for m in (1, 6):
        cases.append(operands(8, m, 128, 512, torch.bfloat16, "n", seed=m))
        cases.append(operands(8, m, 512, 128, torch.bfloat16, "k", seed=10 + m))
    outs = [torch.full((a.shape[0], a.shape[1], b.shape[2]), float("nan"), device=DEVICE) for a, b in cases]
    graph = torch.cuda.CUDAGraph()
    torch.cuda.synchronize()
    with torch.cuda.graph(graph):
        for (a, b), o in zip(cases, outs):
            head_matmul_triton(a, b, None, True, out=o)
    graph.replay()
    torch.cuda.synchronize()
    for (a, b), o in zip(cases, outs):
        assert_close(o, head_matmul_reference(a, b), 1e-6)
        assert torch.equal(o, launch(a, b, groups=1))   # one program walking every row: same bits
