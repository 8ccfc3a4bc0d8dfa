"""SwiGLU GEMM: the Triton kernel against the plain-PyTorch reference, batch invariance, the op.

On the CPU the kernel runs under TRITON_INTERPRET=1 (set in conftest.py) on small, odd shapes;
with CUDA the same tests run on the GPU, and the ``gpu``-marked ones add the Ling-3 shapes and
PDL under CUDA-graph capture.

Tolerances (relative RMS): fp32 1e-5 (only the summation order differs). bf16 1e-2 on the small
shapes: the interpreter's fp32->bf16 cast truncates instead of rounding to nearest, so its
outputs sit up to one bf16 ulp (2^-7 relative) below the reference's. bf16 on the GPU at the
real shapes 4e-3: both sides round to nearest once from fp32 sums that differ only in order, so
an element differs by at most one ulp and only where the sums straddle a rounding boundary.
"""

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from helpers import assert_close, graph_edge_types
from lingc.runtime.kernels.swiglu_gemm import (
    deinterleave_gate_up,
    interleave_gate_up,
    swiglu_gemm,
    swiglu_gemm_reference,
    swiglu_gemm_reference_separate,
    swiglu_gemm_separate,
)
from lingc.runtime.kernels.swiglu_gemm.kernel import SwigluGemmConfig, config_for, swiglu_gemm_triton
from lingc.runtime.pdl import interpreting, launch_kwargs, pdl_supported

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
RTOL = {torch.float32: 1e-5, torch.bfloat16: 1e-2, torch.float16: 2e-3}
RTOL_GPU_BF16 = 4e-3
# Split-K configs for the small shapes: uneven chunks (K=40: 3 tiles of 16 in 3 chunks; K=96
# with block_k 32: 3 tiles in 2 chunks, the last one running past K).
SPLIT_CONFIGS = [
    SwigluGemmConfig(block_n=8, block_k=16, split_k=3),
    SwigluGemmConfig(block_n=16, block_k=32, split_k=2),
]
# Design B (whole-chunk prefetch, in-launch split-K reduction by ticket), split and unsplit.
PREFETCH_CONFIGS = [
    SwigluGemmConfig(block_n=8, block_k=0, split_k=3, prefetch=True),
    SwigluGemmConfig(block_n=16, block_k=0, split_k=1, prefetch=True),
]


def make_inputs(m, k, n, dtype, seed, scale=1.0, device=DEVICE):
    """x [m, k] ~ N(0, 1) and gate/up [n, k] scaled so pre-activations are ~ N(0, scale^2)."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=gen)
    gate = torch.randn(n, k, generator=gen) * (scale / k**0.5)
    up = torch.randn(n, k, generator=gen) * (scale / k**0.5)
    x, gate, up = (t.to(device=device, dtype=dtype) for t in (x, gate, up))
    return x, gate, up, interleave_gate_up(gate, up)


def run_kernel(x, w13, limit, config=None):
    """The Triton kernel on an interleaved w13, into a NaN-poisoned output (unwritten elements
    cannot pass)."""
    out = torch.full((x.shape[0], w13.shape[0] // 2), float("nan"), device=x.device, dtype=x.dtype)
    swiglu_gemm_triton(x, *deinterleave_gate_up(w13), limit, out, config=config)
    return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("limit", [0.0, 2.0])
@pytest.mark.parametrize("n", [24, 37])
@pytest.mark.parametrize("k", [40, 96])
@pytest.mark.parametrize("m", [1, 3, 6])
def test_kernel_matches_reference(m, k, n, limit, dtype):
    # scale 4: |pre-activations| often exceed the limit, so both clamps bite (checked below).
    x, gate, up, w13 = make_inputs(m, k, n, dtype, seed=1000 * m + 10 * k + n, scale=4.0)
    ref = swiglu_gemm_reference(x, w13, limit)
    assert_close(run_kernel(x, w13, limit), ref, RTOL[dtype])
    if limit > 0:
        g, u = x.float() @ gate.float().T, x.float() @ up.float().T
        assert (torch.nn.functional.silu(g) > limit).float().mean() > 0.05
        assert (u.abs() > limit).float().mean() > 0.05


@pytest.mark.parametrize("limit", [0.0, 2.0])
@pytest.mark.parametrize("m", [1, 6])
def test_float16_kernel_matches_reference(m, limit):
    x, _, _, w13 = make_inputs(m, 96, 37, torch.float16, seed=71 + m, scale=4.0)
    assert_close(run_kernel(x, w13, limit), swiglu_gemm_reference(x, w13, limit), RTOL[torch.float16])


@pytest.mark.parametrize("config", SPLIT_CONFIGS + PREFETCH_CONFIGS,
                         ids=["bk16-s3", "bn16-bk32-s2", "prefetch-s3", "prefetch-s1"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("k", [40, 96])
@pytest.mark.parametrize("m", [1, 6])
def test_kernel_split_k_matches_reference(m, k, dtype, config):
    x, _, _, w13 = make_inputs(m, k, 37, dtype, seed=7 * m + k, scale=4.0)
    assert_close(run_kernel(x, w13, 2.0, config), swiglu_gemm_reference(x, w13, 2.0), RTOL[dtype])


@pytest.mark.parametrize("config", [None, *SPLIT_CONFIGS, *PREFETCH_CONFIGS],
                         ids=["table", "bk16-s3", "bn16-bk32-s2", "prefetch-s3", "prefetch-s1"])
def test_kernel_writes_only_its_output(config):
    # out is a strided window of a sentinel-filled buffer: the window must be fully written and
    # every element outside it must keep its exact sentinel bits.
    m, k, n = 5, 96, 37
    x, _, _, w13 = make_inputs(m, k, n, torch.float32, seed=3)
    sentinel = -12345.0
    buf = torch.full((m + 2, n + 5), sentinel, device=DEVICE)
    out = buf[1 : m + 1, 2 : n + 2]
    swiglu_gemm_triton(x, *deinterleave_gate_up(w13), 0.0, out, config=config)
    assert_close(out, swiglu_gemm_reference(x, w13, 0.0), RTOL[torch.float32])
    outside = torch.ones_like(buf, dtype=torch.bool)
    outside[1 : m + 1, 2 : n + 2] = False
    assert torch.all(buf[outside] == sentinel)


def test_kernel_strided_inputs():
    # A non-contiguous x (every other column of a wider tensor) takes the strided load path.
    m, k, n = 3, 40, 24
    wide, _, _, w13 = make_inputs(m, 2 * k, n, torch.float32, seed=5)
    x = wide[:, ::2]
    w13 = w13[:, :k]
    assert_close(run_kernel(x, w13, 0.0), swiglu_gemm_reference(x, w13, 0.0), RTOL[torch.float32])


def test_kernel_degenerate_shapes():
    # K = 0: every product is empty, so out = silu(0) * 0 = 0 (and no load may run unmasked).
    x, w13 = torch.ones(2, 0, device=DEVICE), torch.ones(48, 0, device=DEVICE)
    assert torch.equal(run_kernel(x, w13, 0.0), torch.zeros(2, 24, device=DEVICE))
    # M = 0 launches nothing.
    assert run_kernel(torch.ones(0, 40, device=DEVICE), torch.ones(48, 40, device=DEVICE), 0.0).shape == (0, 24)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_kernel_separate_gate_up_tensors(dtype):
    # Two independent [N, K] tensors (not views of one w13) give the same result as interleaving.
    x, gate, up, w13 = make_inputs(6, 96, 37, dtype, seed=6, scale=4.0)
    out = swiglu_gemm_triton(x, gate.contiguous(), up.contiguous(), 2.0)
    assert torch.equal(out, run_kernel(x, w13, 2.0))


@pytest.mark.parametrize("config", [None, SPLIT_CONFIGS[0], PREFETCH_CONFIGS[0]],
                         ids=["table", "split", "prefetch-split"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_kernel_batch_invariant(dtype, config):
    x, _, _, w13 = make_inputs(8, 96, 37, dtype, seed=11, scale=4.0)
    singles = torch.cat([run_kernel(x[i : i + 1].clone(), w13, 2.0, config) for i in range(8)])
    for m in range(1, 9):
        batch = run_kernel(x[:m], w13, 2.0, config)
        assert torch.equal(batch, singles[:m]), f"rows of an M={m} call differ from M=1 calls"


def test_prefetch_split_tickets_return_to_zero():
    # The in-launch split-K reduction leaves every ticket at zero, so the next call (or a graph
    # replay) starts clean; run twice and compare.
    from lingc.runtime.kernels.gemm_common import split_k_tickets
    x, _, _, w13 = make_inputs(6, 96, 37, torch.float32, seed=21, scale=4.0)
    first = run_kernel(x, w13, 2.0, PREFETCH_CONFIGS[0])
    assert int(split_k_tickets(x.device, 1).abs().sum()) == 0
    assert torch.equal(run_kernel(x, w13, 2.0, PREFETCH_CONFIGS[0]), first)


def test_reference_batch_invariant():
    x, _, _, w13 = make_inputs(8, 96, 37, torch.bfloat16, seed=12, device="cpu")
    singles = torch.cat([swiglu_gemm_reference(x[i : i + 1], w13, 0.0) for i in range(8)])
    for m in range(1, 9):
        assert torch.equal(swiglu_gemm_reference(x[:m], w13, 0.0), singles[:m])


def test_config_is_a_function_of_shape_only():
    assert config_for(1536, 2560) == config_for(1536, 2560)
    assert all(2 * config_for(n, k).block_n >= 16 for n in (1, 37, 192, 6144) for k in (16, 40, 2560))


# A broken kernel or weight layout must fail the comparison above: these tests prove that
# assert_close, fed by the kernel, rejects the mistakes we could plausibly make.


def test_wrong_interleave_is_caught():
    m, k, n = 3, 96, 24
    x, gate, up, w13 = make_inputs(m, k, n, torch.float32, seed=21)
    ref = swiglu_gemm_reference(x, w13, 0.0)
    stacked = torch.cat([gate, up])  # [gate; up] instead of interleaved rows
    swapped = interleave_gate_up(up, gate)
    for wrong in (stacked, swapped):
        with pytest.raises(AssertionError, match="relative RMS error"):
            assert_close(run_kernel(x, wrong, 0.0), ref, RTOL[torch.float32])


def test_unwritten_output_is_caught():
    # Simulates a kernel whose grid misses the last column block: only N-8 columns get written.
    m, k, n = 3, 40, 37
    x, _, _, w13 = make_inputs(m, k, n, torch.float32, seed=22)
    out = torch.full((m, n), float("nan"), device=DEVICE)
    gate, up = deinterleave_gate_up(w13)
    swiglu_gemm_triton(x, gate[: n - 8], up[: n - 8], 0.0, out[:, : n - 8])
    with pytest.raises(AssertionError, match="non-finite"):
        assert_close(out, swiglu_gemm_reference(x, w13, 0.0), RTOL[torch.float32])


# Weight layout helpers.


def test_interleave_roundtrip_and_views():
    gate, up = torch.randn(5, 7), torch.randn(5, 7)
    w13 = interleave_gate_up(gate, up)
    assert torch.equal(w13[0], gate[0]) and torch.equal(w13[1], up[0]) and torch.equal(w13[9], up[4])
    g, u = deinterleave_gate_up(w13)
    assert torch.equal(g, gate) and torch.equal(u, up)
    assert g.data_ptr() == w13.data_ptr() and u.data_ptr() == w13[1].data_ptr()  # views, no copy
    with pytest.raises(ValueError, match="same shape"):
        interleave_gate_up(gate, up[:4])


# The custom op.


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_op_cpu_path_is_the_reference(dtype):
    x, _, _, w13 = make_inputs(6, 40, 37, dtype, seed=31, scale=4.0, device="cpu")
    x3 = x.reshape(2, 3, 40)
    out = torch.ops.lingc.swiglu_gemm(x3, w13, 2.0)
    assert out.shape == (2, 3, 37) and out.dtype == dtype
    assert torch.equal(out.reshape(6, 37), swiglu_gemm_reference(x, w13, 2.0))
    assert torch.equal(swiglu_gemm(x3, w13, 2.0), out)  # the package's handle is the same op


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_op_separate_cpu_path(dtype):
    # Gate and up as row slices of a fused [Wg; Wu] weight, read in place.
    x, gate, up, w13 = make_inputs(6, 40, 37, dtype, seed=33, scale=4.0, device="cpu")
    fused = torch.cat([gate, up])
    out = torch.ops.lingc.swiglu_gemm_separate(x.reshape(2, 3, 40), fused[:37], fused[37:], 2.0)
    assert out.shape == (2, 3, 37) and out.dtype == dtype
    assert torch.equal(out.reshape(6, 37), swiglu_gemm_reference_separate(x, gate, up, 2.0))
    assert torch.equal(out.reshape(6, 37), torch.ops.lingc.swiglu_gemm(x, w13, 2.0))
    assert torch.equal(swiglu_gemm_separate(x, gate, up, 2.0), out.reshape(6, 37))


def test_op_fake_impl_shape_and_dtype():
    with FakeTensorMode():
        x = torch.empty(2, 3, 40, dtype=torch.bfloat16)
        w13 = torch.empty(74, 40, dtype=torch.bfloat16)
        out = torch.ops.lingc.swiglu_gemm(x, w13, 0.0)
        out_separate = torch.ops.lingc.swiglu_gemm_separate(x, w13[:37], w13[37:], 0.0)
    assert out.shape == out_separate.shape == (2, 3, 37)
    assert out.dtype == out_separate.dtype == torch.bfloat16


def test_op_opcheck():
    x, gate, up, w13 = make_inputs(3, 40, 24, torch.float32, seed=32, device="cpu")
    torch.library.opcheck(torch.ops.lingc.swiglu_gemm, (x, w13, 1.5))
    torch.library.opcheck(torch.ops.lingc.swiglu_gemm_separate, (x, gate, up, 1.5))


def test_op_registration_is_idempotent():
    import importlib

    import lingc.runtime.kernels.swiglu_gemm.op as op_module

    importlib.reload(op_module)
    assert hasattr(torch.ops.lingc, "swiglu_gemm")


@pytest.mark.parametrize(
    "x_shape, w_shape, x_dtype, w_dtype, limit, message",
    [
        ((3, 40), (47, 40), torch.float32, torch.float32, 0.0, "rows must be even"),
        ((3, 40), (48, 32), torch.float32, torch.float32, 0.0, "K mismatch, x has K=40 but w13 has K=32"),
        ((3, 40), (48, 40), torch.bfloat16, torch.float32, 0.0, "dtype mismatch"),
        ((3, 40), (48, 40), torch.float64, torch.float64, 0.0, "bfloat16, float16 or float32, got torch.float64"),
        ((3, 40), (48,), torch.float32, torch.float32, 0.0, r"w13 must be \[2N, K\]"),
        ((3, 40), (48, 40), torch.float32, torch.float32, -1.0, "limit must be .* got -1.0"),
    ],
)
def test_op_rejects_bad_arguments(x_shape, w_shape, x_dtype, w_dtype, limit, message):
    x = torch.zeros(x_shape, dtype=x_dtype)
    w13 = torch.zeros(w_shape, dtype=w_dtype)
    with pytest.raises(ValueError, match=message):
        torch.ops.lingc.swiglu_gemm(x, w13, limit)
    with FakeTensorMode(), pytest.raises(ValueError, match=message):
        torch.ops.lingc.swiglu_gemm(torch.empty(x_shape, dtype=x_dtype), torch.empty(w_shape, dtype=w_dtype), limit)


@pytest.mark.parametrize(
    "gate_shape, up_shape, message",
    [
        ((24, 40), (23, 40), r"w_gate \(24, 40\) and w_up \(23, 40\) differ"),
        ((24, 40), (24, 32), "K mismatch, x has K=40 but w_up has K=32"),
        ((24,), (24, 40), r"w_gate must be \[N, K\]"),
    ],
)
def test_op_separate_rejects_bad_arguments(gate_shape, up_shape, message):
    x = torch.zeros(3, 40)
    with pytest.raises(ValueError, match=message):
        torch.ops.lingc.swiglu_gemm_separate(x, torch.zeros(gate_shape), torch.zeros(up_shape), 0.0)


# PDL helpers.


def test_pdl_off_on_cpu_and_interpreter(monkeypatch):
    assert not pdl_supported("cpu") and launch_kwargs("cpu") == {}
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert interpreting() and not pdl_supported("cuda") and launch_kwargs("cuda") == {}
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    monkeypatch.setenv("LINGC_DISABLE_PDL", "1")
    assert not pdl_supported("cuda")


# GPU: the Ling-3 shapes, batch invariance and PDL inside a CUDA graph.

REAL_N = [1536, 192, 6144, 768]


@pytest.mark.gpu
@pytest.mark.parametrize("limit", [0.0, 7.0])
@pytest.mark.parametrize("n", REAL_N)
@pytest.mark.parametrize("m", [1, 6, 16, 64])
def test_gpu_real_shapes(m, n, limit):
    x, _, _, w13 = make_inputs(m, 2560, n, torch.bfloat16, seed=m + n, scale=4.0)
    assert_close(run_kernel(x, w13, limit), swiglu_gemm_reference(x, w13, limit), RTOL_GPU_BF16)
    out = torch.ops.lingc.swiglu_gemm(x.reshape(1, m, 2560), w13, limit)
    assert out.shape == (1, m, n)
    assert_close(out[0], swiglu_gemm_reference(x, w13, limit), RTOL_GPU_BF16)
    # Same kernel and config on a fused [Wg; Wu] weight read through row slices: same bits.
    fused = torch.cat([w13[0::2], w13[1::2]])
    assert torch.equal(torch.ops.lingc.swiglu_gemm_separate(x, fused[:n], fused[n:], limit), out[0])


@pytest.mark.gpu
@pytest.mark.parametrize("n", REAL_N)
def test_gpu_batch_invariant(n):
    x, _, _, w13 = make_inputs(64, 2560, n, torch.bfloat16, seed=n)
    singles = torch.cat([run_kernel(x[i : i + 1].clone(), w13, 0.0) for i in range(64)])
    for m in [*range(1, 9), 16, 17, 64]:
        assert torch.equal(run_kernel(x[:m], w13, 0.0), singles[:m]), f"N={n}: M={m} rows differ from M=1"


@pytest.mark.gpu
@pytest.mark.parametrize("disable_pdl", [False, True], ids=["pdl", "LINGC_DISABLE_PDL"])
def test_gpu_pdl_chain_under_graph_capture(disable_pdl, monkeypatch):
    if not pdl_supported(DEVICE):
        pytest.skip("PDL needs compute capability >= 9")
    if disable_pdl:
        monkeypatch.setenv("LINGC_DISABLE_PDL", "1")
    # A chain whose every link reads the previous link's output: 2560 -> 1536 -> 2560 -> 192
    # (split-K in design A: two kernels; design B reduces in the same launch). Every edge of
    # the captured graph must be programmatic (plain with the kill switch on), and replays must
    # equal eager launches bit for bit.
    m = 6
    x, _, _, w_a = make_inputs(m, 2560, 1536, torch.bfloat16, seed=41)
    _, _, _, w_b = make_inputs(m, 1536, 2560, torch.bfloat16, seed=42)
    _, _, _, w_c = make_inputs(m, 2560, 192, torch.bfloat16, seed=43)

    def chain(inp):
        return swiglu_gemm(swiglu_gemm(swiglu_gemm(inp, w_a, 0.0), w_b, 0.0), w_c, 0.0)

    static_x = x.clone()
    eager = chain(static_x)  # also compiles every kernel before capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph(keep_graph=True)
    with torch.cuda.graph(graph):
        static_out = chain(static_x)
    cfgs = [config_for(n, k) for k, n in [(2560, 1536), (1536, 2560), (2560, 192)]]
    kernels = sum(1 + (c.split_k > 1 and not c.prefetch) for c in cfgs)
    types = graph_edge_types(graph)
    edge_type = 0 if disable_pdl else 1
    assert types == [edge_type] * (kernels - 1), f"edge types {types}, expected {kernels - 1} of type {edge_type}"
    graph.instantiate()

    fresh, _, _, _ = make_inputs(m, 2560, 8, torch.bfloat16, seed=44)
    for inp in (x, fresh):
        static_x.copy_(inp)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(static_out, chain(inp))
    h = swiglu_gemm_reference(swiglu_gemm_reference(fresh, w_a, 0.0), w_b, 0.0)
    assert_close(static_out, swiglu_gemm_reference(h, w_c, 0.0), 2 * RTOL_GPU_BF16)
    assert torch.equal(eager, chain(x))
