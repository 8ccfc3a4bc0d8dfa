"""lingc::rmsnorm_gemm: the decode GEMM with the RMSNorm (and residual add) as its prologue,
against the composition it replaces (lingc::rmsnorm then lingc::gemm); the op, its checks, and
an sm_90 compile check.

On the CPU the kernel runs under TRITON_INTERPRET=1 (conftest.py) on small, odd shapes (K = 40:
uneven chunks and a row shorter than one norm chunk; K = 1100: three norm chunks, the last one
partial). Every run writes into NaN-poisoned outputs, so an element the kernel forgets fails.
Tolerances as in test_gemm.py (the row reduction runs in another order than the norm kernel's,
and the interpreter truncates bf16 casts).
"""
import textwrap

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from helpers import assert_close, run_sm90_compile_check
from lingc.runtime.kernels.gemm import rmsnorm_gemm_reference
from lingc.runtime.kernels.gemm.config import GemmConfig
from lingc.runtime.kernels.gemm.kernel import gemm_triton
from lingc.runtime.kernels.norms import rmsnorm_reference

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
RTOL = {torch.float32: 1e-5, torch.bfloat16: 1e-2}
CONFIGS = {
    "table": None,
    "A-bk16-s3": GemmConfig(16, 16, 3),
    "B-s3": GemmConfig(16, 0, 3, prefetch=True),
}


def make(m, k, rows, dtype, seed, residual=True, device=DEVICE):
    """x, residual ~ N(0, 1), a norm weight around 1, weights ~ N(0, 1/k)."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=gen).to(device=device, dtype=dtype)
    res = torch.randn(m, k, generator=gen).to(device=device, dtype=dtype) if residual else None
    nw = (1 + 0.3 * torch.randn(k, generator=gen)).to(device=device, dtype=dtype)
    weights = [(torch.randn(n, k, generator=gen) / k**0.5).to(device=device, dtype=dtype) for n in rows]
    return x, res, nw, weights


def run_kernel(x, res, nw, weights, config=None, eps=1e-6):
    """The launcher into NaN-poisoned out and new-residual buffers."""
    n = sum(w.shape[0] for w in weights)
    out = torch.full((x.shape[0], n), float("nan"), device=x.device, dtype=x.dtype)
    new_res = torch.full_like(x, float("nan"))
    gemm_triton(x, weights, out=out, config=config, norm=(nw, res, eps, new_res))
    return out, new_res


@pytest.mark.parametrize("config", CONFIGS.values(), ids=CONFIGS.keys())
@pytest.mark.parametrize("residual", [True, False], ids=["residual", "no-residual"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("m, k", [(1, 40), (6, 40), (17, 96), (3, 1100)])
def test_kernel_matches_the_norm_then_gemm(m, k, dtype, residual, config):
    x, res, nw, weights = make(m, k, (24, 7, 37), dtype, seed=m * 100 + k, residual=residual)
    out, new_res = run_kernel(x, res, nw, weights, config)
    ref_out, ref_res = rmsnorm_gemm_reference(*(t.cpu() if t is not None else None for t in (x, nw, res)),
                                              1e-6, [w.cpu() for w in weights])
    if dtype == torch.float32 or DEVICE == "cuda":
        assert torch.equal(new_res.cpu(), ref_res)      # h = residual + x, rounded once: exact
    else:                                               # the interpreter's bf16 cast truncates
        assert_close(new_res, ref_res, RTOL[dtype])
    assert_close(out, ref_out, RTOL[dtype])


def test_reference_is_the_two_ops():
    x, res, nw, weights = make(5, 40, (24, 7), torch.float32, seed=3, device="cpu")
    y, h = rmsnorm_reference(x, nw, res, 1e-6)
    out, h2 = torch.ops.lingc.rmsnorm_gemm(x, nw, res, 1e-6, weights)
    assert torch.equal(h, h2) and torch.equal(out, torch.ops.lingc.gemm(y, weights))


@pytest.mark.parametrize("config", [None, CONFIGS["A-bk16-s3"]], ids=["table", "A-split"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_kernel_batch_invariant(dtype, config):
    # A row's output and new residual are the same bits for M = 1 and inside M = 2..8, 16.
    x, res, nw, weights = make(16, 96, (24, 7, 37), dtype, seed=21)
    singles = {i: run_kernel(x[i : i + 1].clone(), res[i : i + 1].clone(), nw, weights, config) for i in (0, 3, 7, 15)}
    for m in (2, 6, 8, 16):
        out, new_res = run_kernel(x[:m], res[:m], nw, weights, config)
        for i, (o1, r1) in singles.items():
            if i < m:
                assert torch.equal(out[i : i + 1], o1), f"row {i} of an M={m} call differs from M=1"
                assert torch.equal(new_res[i : i + 1], r1)


def test_wrong_norm_weight_is_caught():
    # The kernel must use the norm weight: a different one gives a different output.
    x, res, nw, weights = make(6, 96, (24, 37), torch.float32, seed=31)
    out, _ = run_kernel(x, res, nw.flip(0), weights)
    ref, _ = rmsnorm_gemm_reference(*(t.cpu() for t in (x, nw, res)), 1e-6, [w.cpu() for w in weights])
    with pytest.raises(AssertionError, match="relative RMS error"):
        assert_close(out, ref, RTOL[torch.float32])


def test_op_fake_and_schema():
    assert str(torch.ops.lingc.rmsnorm_gemm.default._schema) == (
        "lingc::rmsnorm_gemm(Tensor x, Tensor norm_weight, Tensor? residual, float eps, Tensor[] weights) "
        "-> (Tensor, Tensor)")
    with FakeTensorMode():
        x = torch.empty(6, 2560, dtype=torch.bfloat16)
        out, h = torch.ops.lingc.rmsnorm_gemm(x, torch.empty(2560, dtype=torch.bfloat16), x.clone(), 1e-6,
                                              [torch.empty(1024, 2560, dtype=torch.bfloat16)] * 5)
    assert out.shape == (6, 5120) and h.shape == (6, 2560) and h.dtype == torch.bfloat16


def test_op_opcheck():
    x, res, nw, weights = make(3, 40, (24, 7), torch.float32, seed=41, device="cpu")
    torch.library.opcheck(torch.ops.lingc.rmsnorm_gemm, (x, nw, res, 1e-6, weights))
    torch.library.opcheck(torch.ops.lingc.rmsnorm_gemm, (x, nw, None, 1e-6, weights))


@pytest.mark.parametrize("what, message", [
    ("norm weight", r"rmsnorm_gemm: rmsnorm: weight must be \[D\] = \(40,\), got \(39,\)"),
    ("residual", r"rmsnorm_gemm: rmsnorm: residual must have x's shape \(3, 40\), got \(2, 40\)"),
    ("weights", r"rmsnorm_gemm: gemm: K mismatch, x has K=40 but weights\[0\] has K=32"),
    ("eps", r"rmsnorm_gemm: rmsnorm: eps must be a finite number >= 0 .* got -1"),
])
def test_op_rejects_bad_arguments(what, message):
    x, res, nw, weights = make(3, 40, (24,), torch.float32, seed=51, device="cpu")
    args = {"norm weight": (x, nw[:39], res, 1e-6, weights), "residual": (x, nw, res[:2], 1e-6, weights),
            "weights": (x, nw, res, 1e-6, [torch.zeros(24, 32)]), "eps": (x, nw, res, -1.0, weights)}[what]
    with pytest.raises(ValueError, match=message):
        torch.ops.lingc.rmsnorm_gemm(*args)


_COMPILE_CHECK = textwrap.dedent("""
    import re
    from sm90 import compile_sm90, divisible_by_16, signature
    from lingc.runtime.kernels.gemm.config import config_for, norm_prologue_fits
    from lingc.runtime.kernels.gemm.kernel import _gemm_kernel, block_plan, k_plan, _NORM_BLOCK, _NORM_WARPS

    def spill(rows, norm):
        n, k = sum(rows), 2560
        cfg = config_for(n, k)
        block_k, k_tiles, split_k, even_k = k_plan(k, cfg)
        block_starts, col_starts, _ = block_plan(list(rows), cfg.block_n)
        b = "*bf16"
        ptrs = dict(x_ptr=b, out_ptr=b, ws_ptr="*fp32", ticket_ptr="*i32", bias_ptr=b, res_ptr=b, mul_ptr=b,
                    nres_in_ptr=b, nres_ptr=b, nw_ptr=b)
        tuples = dict(w_ptrs=(b,) * len(rows), w_strides=("i32",) * len(rows), w_rows=("i32",) * len(rows))
        ints = ["M", "K", "stride_xm", "stride_om", "stride_ws_s", "stride_ws_m", "stride_b", "stride_rm",
                "stride_gm", "stride_nrm", "stride_nm"]
        const = dict(stride_xk=1, stride_on=1, stride_rn=1, stride_gn=1, block_starts=block_starts,
                     col_starts=col_starts, BLOCK_M=16, BLOCK_N=cfg.block_n, BLOCK_K=block_k, K_TILES=k_tiles,
                     SPLIT_K=split_k, EVEN_K=even_k, NORM=norm, HAS_NRES=True, NORM_BLOCK=_NORM_BLOCK,
                     NORM_CHUNKS=-(-k // _NORM_BLOCK), HAS_BIAS=False, HAS_RES=False, HAS_MUL=False,
                     DOT_PRECISION="tf32", DOT_UPCAST=False, USE_GDC=True)
        sig = signature(_gemm_kernel, {**ptrs, **tuples}, ints, ["eps"])
        attrs = divisible_by_16(_gemm_kernel, list(ptrs) + [i for i in ints if i not in ("M", "K")])
        ptx, info = compile_sm90(_gemm_kernel, sig, const, attrs,
                                 num_warps=max(cfg.num_warps, _NORM_WARPS) if norm else cfg.num_warps,
                                 num_stages=cfg.num_stages)
        assert "griddepcontrol.wait" in ptx
        m = re.search(r"(\\d+) bytes spill stores", info)
        return int(m.group(1)) if m else 0

    # The fused KDA projection takes the prologue (and spills no more than without it); MLA's
    # (design B, 64 x 512 weight tiles) is the one norm_prologue_fits refuses.
    kda, mla = (1024,) * 5 + (8,), (1536, 576, 64)
    assert norm_prologue_fits(sum(kda), 2560) and not norm_prologue_fits(sum(mla), 2560)
    with_norm, without = spill(kda, True), spill(kda, False)
    print("KDA spill bytes with / without the prologue:", with_norm, without)
    assert with_norm <= without, (with_norm, without)
""")


def test_kernel_compiles_for_sm90_without_more_spills():
    run_sm90_compile_check(_COMPILE_CHECK)


# ----------------------------------------------------------------------------------------------
# GPU: flash-tp4-rank's fused attention projections (K = 2560), bf16.

FLASH_ROWS = {"kda": (1024,) * 5 + (8,), "mla": (1536, 576, 64)}


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("which", FLASH_ROWS)
def test_gpu_flash_shapes_match_and_rows_are_invariant(which):
    # Against the two lingc ops it replaces (norm kernel, then GEMM kernel) within bf16 rounding;
    # rows of a 6-row chain bitwise equal to 1-row calls (decode == verify rows).
    x, res, nw, weights = make(6, 2560, FLASH_ROWS[which], torch.bfloat16, seed=61)
    out, new_res = run_kernel(x, res, nw, weights)
    y, h = torch.ops.lingc.rmsnorm(x, nw, res, 1e-6)
    assert torch.equal(new_res, h)
    assert_close(out, torch.ops.lingc.gemm(y, weights), 4e-3)
    for i in range(6):
        o1, h1 = run_kernel(x[i : i + 1].clone(), res[i : i + 1].clone(), nw, weights)
        assert torch.equal(o1, out[i : i + 1]) and torch.equal(h1, new_res[i : i + 1]), f"row {i}"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_in_a_cuda_graph_with_pdl():
    # Two fused launches chained (the second norms a view of the first's output with the first's
    # new residual), captured: a programmatic edge between them where PDL is on, and replays
    # equal to the eager run.
    from helpers import graph_edge_types
    from lingc.runtime.pdl import pdl_supported

    x, res, nw, weights = make(1, 2560, FLASH_ROWS["kda"], torch.bfloat16, seed=62)

    def step():
        out, h = torch.ops.lingc.rmsnorm_gemm(x, nw, res, 1e-6, weights)
        return torch.ops.lingc.rmsnorm_gemm(out[:, :2560], nw, h, 1e-6, weights[:1])

    eager = step()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph(keep_graph=True)
    with torch.cuda.graph(graph):
        captured = step()
    if pdl_supported(x.device):
        assert 1 in graph_edge_types(graph)
    graph.instantiate()
    for _ in range(2):
        graph.replay()
        torch.cuda.synchronize()
        assert all(torch.equal(a, b) for a, b in zip(eager, captured))
