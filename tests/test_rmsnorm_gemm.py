"""lingc.rmsnorm_gemm: a layer's input RMSNorm done by the fused projection GEMM after it.

The launcher (``gemm.kernel.rmsnorm_gemm_triton``, the GEMM kernel with NORM) against the
plain-PyTorch reference (``gemm.naive.rmsnorm_gemm_reference``) over M, K, weight lists and the
designs (A and B, split and unsplit): fresh random inputs, NaN-poisoned outputs (out and h), h
bit for bit on the GPU; batch invariance; the op's CPU path, fake impl and argument checks; the
fold's numerics against the unfused norm + GEMM (the declared rounding difference only); on the
GPU the flash-tp4-rank shapes the fold meets (fused KDA and MLA projections, the lm_head).

Tolerances as test_gemm.py's: relative RMS fp32 1e-5, bf16 1e-2 under the interpreter (its
fp32 -> bf16 cast truncates), 4e-3 on the GPU.
"""
import textwrap

import pytest
import torch

from helpers import assert_close, run_sm90_compile_check
from lingc.runtime.kernels.gemm import (
    gemm_reference,
    rmsnorm_gemm,
    rmsnorm_gemm_reference,
)
from lingc.runtime.kernels.gemm.config import CONFIGS, GemmConfig
from lingc.runtime.kernels.gemm.kernel import rmsnorm_gemm_triton
from lingc.runtime.kernels.gemm_common import split_k_tickets
from lingc.runtime.kernels.norms import rmsnorm

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
ON_GPU = DEVICE == "cuda"
RTOL = {torch.float32: 1e-5, torch.bfloat16: 4e-3 if ON_GPU else 1e-2}
DTYPES = [torch.float32, torch.bfloat16]
EPS = 1e-6
# Designs A and B, split and unsplit, with ragged chunks: K = 40 is 3 tiles of 16 (A) or chunks
# of 16 + 16 + 8 (B); K = 96 with block_k 32 is 3 tiles in 2 chunks, the second past K.
CONFIGS_UNDER_TEST = {
    "A-bk16-s3": GemmConfig(16, 16, 3),
    "A-bn32-bk32-s2": GemmConfig(32, 32, 2),
    "A-bk16-s1": GemmConfig(16, 16, 1),
    "B-s3": GemmConfig(16, 0, 3, prefetch=True),
    "B-s1": GemmConfig(16, 0, 1, prefetch=True),
}


def make_inputs(m, k, rows, dtype, seed, device=DEVICE):
    """x, residual ~ N(0, 1) [m, k], a norm weight in [0.5, 1.5), weights ~ N(0, 1/k)."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=gen).to(device=device, dtype=dtype)
    res = torch.randn(m, k, generator=gen).to(device=device, dtype=dtype)
    nw = (torch.rand(k, generator=gen) + 0.5).to(device=device, dtype=dtype)
    weights = [(torch.randn(n, k, generator=gen) / k**0.5).to(device=device, dtype=dtype) for n in rows]
    return x, res, nw, weights


def run_kernel(x, res, nw, weights, config=None):
    """The launcher into NaN-poisoned out and h (an unwritten element cannot pass)."""
    n = sum(w.shape[0] for w in weights)
    out = torch.full((x.shape[0], n), float("nan"), device=x.device, dtype=x.dtype)
    h = torch.full_like(x, float("nan"))
    got = rmsnorm_gemm_triton(x, res, nw, EPS, weights, out=out, h=h, config=config)
    assert got[0] is out and got[1] is h
    return out, h


def check(m, k, rows, dtype, seed, config=None):
    x, res, nw, weights = make_inputs(m, k, rows, dtype, seed)
    out, h = run_kernel(x, res, nw, weights, config)
    ref_out, ref_h = rmsnorm_gemm_reference(x.cpu(), res.cpu(), nw.cpu(), EPS, [w.cpu() for w in weights])
    assert_close(out.cpu(), ref_out, RTOL[dtype])
    if ON_GPU or dtype == torch.float32:
        assert torch.equal(h.cpu(), ref_h)          # the same fp32 add, rounded once
    else:                                           # (the interpreter truncates where the GPU rounds)
        assert_close(h.cpu(), ref_h, RTOL[dtype])
    return out, h


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows", [(37,), (24, 7, 37)], ids=lambda r: "x".join(map(str, r)))
@pytest.mark.parametrize("k", [40, 96])
@pytest.mark.parametrize("m", [1, 2, 6, 16])
def test_kernel_matches_reference(m, k, rows, dtype):
    check(m, k, rows, dtype, seed=1000 * m + 10 * k + sum(rows))


@pytest.mark.parametrize("config", CONFIGS_UNDER_TEST.values(), ids=CONFIGS_UNDER_TEST.keys())
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("k", [40, 96])
def test_kernel_configs_match_reference(k, dtype, config):
    check(6, k, (24, 7, 37), dtype, seed=7 * k, config=config)


def test_rows_beyond_one_m_tile():
    # M = 20: two M tiles; the second is mostly masked rows, whose h must not be written.
    check(20, 96, (24, 37), torch.float32, seed=5, config=CONFIGS_UNDER_TEST["A-bk16-s3"])


def test_kernel_writes_only_its_outputs():
    # out and h are windows of sentinel-filled buffers: each window fully written, nothing else.
    m, k, rows = 5, 96, (24, 7, 37)
    x, res, nw, weights = make_inputs(m, k, rows, torch.float32, seed=3)
    n, sentinel = sum(rows), -12345.0
    obuf = torch.full((m + 2, n + 5), sentinel, device=DEVICE)
    hbuf = torch.full((m + 2, k + 3), sentinel, device=DEVICE)
    out, h = obuf[1 : m + 1, 2 : n + 2], hbuf[1 : m + 1, 1 : k + 1]
    rmsnorm_gemm_triton(x, res, nw, EPS, weights, out=out, h=h, config=CONFIGS_UNDER_TEST["B-s3"])
    ref_out, ref_h = rmsnorm_gemm_reference(x, res, nw, EPS, weights)
    assert_close(out, ref_out, RTOL[torch.float32])
    assert torch.equal(h, ref_h)
    for buf, win in ((obuf, (slice(1, m + 1), slice(2, n + 2))), (hbuf, (slice(1, m + 1), slice(1, k + 1)))):
        outside = torch.ones_like(buf, dtype=torch.bool)
        outside[win] = False
        assert torch.all(buf[outside] == sentinel)


@pytest.mark.parametrize("config", [None, CONFIGS_UNDER_TEST["A-bk16-s3"], CONFIGS_UNDER_TEST["B-s1"]],
                         ids=["table", "A-split", "B-unsplit"])
def test_kernel_batch_invariant(config):
    x, res, nw, weights = make_inputs(16, 96, (24, 7, 37), torch.bfloat16, seed=11)
    singles = {i: run_kernel(x[i : i + 1].clone(), res[i : i + 1].clone(), nw, weights, config)
               for i in [*range(8), 15]}
    for m in [*range(1, 9), 16]:
        out, h = run_kernel(x[:m], res[:m], nw, weights, config)
        for i, (o1, h1) in singles.items():
            if i < m:
                assert torch.equal(out[i : i + 1], o1), f"row {i} of an M={m} call differs from M=1"
                assert torch.equal(h[i : i + 1], h1)


def test_reference_batch_invariant():
    x, res, nw, weights = make_inputs(8, 96, (24, 7, 37), torch.bfloat16, seed=12, device="cpu")
    singles = [rmsnorm_gemm_reference(x[i : i + 1], res[i : i + 1], nw, EPS, weights) for i in range(8)]
    for m in range(1, 9):
        out, h = rmsnorm_gemm_reference(x[:m], res[:m], nw, EPS, weights)
        assert torch.equal(out, torch.cat([s[0] for s in singles[:m]]))
        assert torch.equal(h, torch.cat([s[1] for s in singles[:m]]))


def test_split_tickets_return_to_zero_and_repeat():
    x, res, nw, weights = make_inputs(6, 96, (24, 7, 37), torch.float32, seed=21)
    first = run_kernel(x, res, nw, weights, CONFIGS_UNDER_TEST["A-bk16-s3"])
    assert int(split_k_tickets(x.device, 1).abs().sum()) == 0
    again = run_kernel(x, res, nw, weights, CONFIGS_UNDER_TEST["A-bk16-s3"])
    assert torch.equal(again[0], first[0]) and torch.equal(again[1], first[1])


def test_the_norm_scale_is_applied():
    # A kernel that skipped the norm's scale (or the norm weight) would fail the comparisons
    # above: the scaled and unscaled products differ by far more than the tolerance.
    x, res, nw, weights = make_inputs(6, 96, (24, 37), torch.float32, seed=31)
    out, _ = run_kernel(x, res, nw, weights)
    h = res + x
    with pytest.raises(AssertionError, match="relative RMS error"):
        assert_close(out, gemm_reference(h * nw, weights), RTOL[torch.float32])
    with pytest.raises(AssertionError, match="relative RMS error"):
        assert_close(out, rmsnorm_gemm_reference(x, res, torch.ones_like(nw), EPS, weights)[0], RTOL[torch.float32])


def test_design_c_config_is_refused():
    x, res, nw, weights = make_inputs(2, 40, (24,), torch.float32, seed=41)
    with pytest.raises(ValueError, match="design C"):
        rmsnorm_gemm_triton(x, res, nw, EPS, weights, config=GemmConfig(4, 0, 1, num_stages=1, gemv=True))


@pytest.mark.parametrize("dtype", DTYPES)
def test_fold_differs_from_the_unfused_norm_by_rounding_only(dtype):
    # The declared numerics: the GEMM of bf16(h * w) scaled after the sum, against the GEMM of
    # the norm's output bf16(h * r * w). The same h bits; outputs within the dtype's rounding.
    x, res, nw, weights = make_inputs(6, 96, (24, 7, 37), dtype, seed=43, device="cpu")
    y, h_ref = rmsnorm(x, nw, res, EPS)
    out, h = rmsnorm_gemm(x, res, nw, EPS, weights)
    assert torch.equal(h, h_ref)
    assert_close(out, gemm_reference(y, weights), {torch.float32: 1e-5, torch.bfloat16: 1e-2}[dtype])


def test_op_cpu_path_schema_and_fake():
    x, res, nw, weights = make_inputs(3, 40, (24, 7), torch.bfloat16, seed=45, device="cpu")
    out, h = torch.ops.lingc.rmsnorm_gemm(x, res, nw, EPS, weights)
    ref = rmsnorm_gemm_reference(x, res, nw, EPS, weights)
    assert torch.equal(out, ref[0]) and torch.equal(h, ref[1])
    schema = str(torch.ops.lingc.rmsnorm_gemm.default._schema)
    assert "Tensor residual, Tensor norm_weight, float eps, Tensor[] weights) -> (Tensor, Tensor)" in schema
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode() as mode:
        fo, fh = torch.ops.lingc.rmsnorm_gemm(*(mode.from_tensor(t) for t in (x, res, nw)), EPS,
                                              [mode.from_tensor(w) for w in weights])
    assert tuple(fo.shape) == (3, 31) and tuple(fh.shape) == (3, 40) and fo.dtype == fh.dtype == x.dtype


def test_op_opcheck():
    x, res, nw, weights = make_inputs(3, 40, (24, 7), torch.float32, seed=46, device="cpu")
    torch.library.opcheck(torch.ops.lingc.rmsnorm_gemm.default, (x, res, nw, EPS, weights))


def _bad_cases():
    x, res, nw, weights = make_inputs(3, 40, (24,), torch.float32, seed=47, device="cpu")
    return [
        ("no residual", (x, None, nw, EPS, weights), r"rmsnorm_gemm: residual is required"),
        ("residual shape", (x, res[:2], nw, EPS, weights), r"rmsnorm_gemm: rmsnorm: residual must have x's shape"),
        ("norm weight", (x, res, nw[:8], EPS, weights), r"rmsnorm_gemm: rmsnorm: weight must be \[D\]"),
        ("eps", (x, res, nw, -1.0, weights), r"rmsnorm_gemm: rmsnorm: eps must be a finite number"),
        ("K mismatch", (x, res, nw, EPS, [weights[0][:, :32]]), r"rmsnorm_gemm: K mismatch"),
        ("weight dtype", (x, res, nw, EPS, [weights[0].double()]), r"rmsnorm_gemm: dtype mismatch"),
        ("no weights", (x, res, nw, EPS, []), r"rmsnorm_gemm: weights must hold 1 to 8"),
        ("fp16 x", (x.half(), res.half(), nw, EPS, [weights[0].half()]), r"rmsnorm_gemm: x.dtype must be"),
    ]


@pytest.mark.parametrize("case", _bad_cases(), ids=lambda c: c[0])
def test_op_rejects_bad_arguments(case):
    _, args, message = case
    with pytest.raises(ValueError, match=message):
        torch.ops.lingc.rmsnorm_gemm(*args)


# The flash-tp4-rank shapes the fold meets on the decode path: (K, weight rows of the fused group).
GPU_SHAPES = {
    "fused KDA q/k/v/f/g/b": (2560, (1024, 1024, 1024, 1024, 1024, 8)),
    "fused MLA q/kv_a/g": (2560, (1536, 576, 8)),
    "lm_head logits": (2560, (39296,)),
}


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 2, 6, 16])
@pytest.mark.parametrize("name", GPU_SHAPES)
def test_gpu_model_shapes(name, m):
    k, rows = GPU_SHAPES[name]
    assert (sum(rows), k) in CONFIGS
    x, res, nw, weights = make_inputs(m, k, rows, torch.bfloat16, seed=m + sum(rows))
    out, h = run_kernel(x, res, nw, weights)
    ref_out, ref_h = rmsnorm_gemm_reference(x, res, nw, EPS, weights)
    assert_close(out, ref_out, RTOL[torch.bfloat16])
    assert torch.equal(h, ref_h)


@pytest.mark.gpu
@pytest.mark.parametrize("name", GPU_SHAPES)
def test_gpu_model_shapes_batch_invariant(name):
    k, rows = GPU_SHAPES[name]
    x, res, nw, weights = make_inputs(8, k, rows, torch.bfloat16, seed=99)
    one = run_kernel(x[:1].clone(), res[:1].clone(), nw, weights)
    for m in (2, 6, 8):
        out, h = run_kernel(x[:m], res[:m], nw, weights)
        assert torch.equal(out[:1], one[0]) and torch.equal(h[:1], one[1]), m


_NORM_COMPILE_CHECK = textwrap.dedent("""
    from sm90 import compile_sm90, divisible_by_16, signature
    from lingc.runtime.kernels.gemm.config import config_for
    from lingc.runtime.kernels.gemm.kernel import _gemm_kernel, block_plan, k_plan

    fn = _gemm_kernel
    for rows_list in ([1024] * 5 + [8], [1536, 576, 8], [39296]):
        k, n = 2560, sum(rows_list)
        cfg = config_for(n, k)
        starts, cols, blocks = block_plan(rows_list, cfg.block_n)
        block_k, k_tiles, split_k, even_k = k_plan(k, cfg)
        nw = len(rows_list)
        names = ("x_ptr", "out_ptr", "ws_ptr", "bias_ptr", "res_ptr", "mul_ptr", "nres_ptr", "nw_ptr", "h_ptr")
        ptrs = {p: "*bf16" for p in names}
        ptrs.update(ws_ptr="*fp32", ticket_ptr="*i32")
        sig = signature(fn, ptrs, ["M", "K", "SQ_COL", "stride_xm", "stride_om", "stride_ws_s", "stride_ws_m",
                                   "stride_nm", "stride_hm"], floats=["eps"])
        sig.update(w_ptrs=("*bf16",) * nw, w_strides=("i32",) * nw, w_rows=("i32",) * nw,
                   block_starts="constexpr", col_starts="constexpr")
        const = dict(block_starts=starts, col_starts=cols, stride_xk=1, stride_on=1, stride_b=0, stride_rm=0,
                     stride_rn=0, stride_gm=0, stride_gn=0, BLOCK_M=16, BLOCK_N=cfg.block_n, BLOCK_K=block_k,
                     K_TILES=k_tiles, SPLIT_K=split_k, EVEN_K=even_k, HAS_BIAS=False, HAS_RES=False,
                     HAS_MUL=False, NORM=True, DOT_PRECISION="tf32", DOT_UPCAST=False, USE_GDC=True)
        attrs = divisible_by_16(fn, ["x_ptr", "out_ptr", "ws_ptr", "nres_ptr", "nw_ptr", "h_ptr", "K", "stride_xm",
                                     "stride_om", "stride_ws_s", "stride_ws_m", "stride_nm", "stride_hm"])
        for a in ("w_ptrs", "w_strides"):
            for i in range(nw):
                attrs[(fn.arg_names.index(a), i)] = [["tt.divisibility", 16]]
        ptx, info = compile_sm90(fn, sig, const, attrs, num_warps=cfg.num_warps, num_stages=cfg.num_stages)
        assert " 0 bytes spill stores" in info, (n, info)
        # The weight's first tile and the norm weight are requested before the wait.
        head = ptx.split("griddepcontrol.wait")[0]
        assert "cp.async" in head or "ld.global" in head, n
        assert head.count("ld.global") + head.count("cp.async") >= 2, n
        print(n, k, cfg, [l for l in info.splitlines() if "registers" in l])
""")


def test_norm_gemm_compiles_for_sm90_without_spills():
    # The flash-tp4-rank shapes the fold meets, at their table configs (designs A split and
    # unsplit, B split 10): no spills, the producer-independent loads before griddepcontrol.wait.
    run_sm90_compile_check(_NORM_COMPILE_CHECK)
