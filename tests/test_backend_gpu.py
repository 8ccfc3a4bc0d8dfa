"""The lingc backend on CUDA (torch 2.11 on the device): the compiled tiny model against eager,
through ATen and through Inductor, with the SwiGLU Triton kernel in the graph."""

import pytest
import torch

from backend_helpers import run_and_report, stat
from lingc.models import Ling3Cache, build_model, preset

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("inductor", [False, True])
@pytest.mark.parametrize("T", [1, 6])
def test_compiled_tiny_on_cuda_equals_eager(T, inductor, monkeypatch):
    from lingc.passes.pdl_swap import PdlSwap

    monkeypatch.setattr(PdlSwap, "fold_embedding", not inductor)   # Inductor's leftover: the gather
    model = build_model(preset("tiny"), device="cuda", progress=False)
    cache = Ling3Cache.allocate(model.config, 32, device="cuda")
    g = torch.Generator(device="cuda").manual_seed(T)
    for t in cache.tensors():
        t.normal_(0, 0.5, generator=g)
    ids = torch.randint(0, 300, (T,), device="cuda", generator=g)
    pos = torch.arange(9, 9 + T, device="cuda")
    with torch.no_grad():
        ref, _ = model(ids, pos, cache.clone())
    (logits, _), report = run_and_report(model, ids, pos, cache, role="decode", inductor=inductor)
    torch.testing.assert_close(logits, ref, rtol=2e-3, atol=2e-3)     # tf32-free fp32, kernel order
    assert torch.equal(logits.argmax(-1), ref.argmax(-1))
    n_moe = sum(model.config.is_moe_layer(i) for i in range(model.config.num_hidden_layers))
    assert stat(report, "fused_moe").matches >= n_moe             # the MoE blocks, shared experts in
    assert stat(report, "swiglu_epilogue").matches == model.config.num_hidden_layers - n_moe
    rows = {op: n for _, op, n, _ in report.kernels.rows}
    assert rows["lingc.moe_experts"] == n_moe and rows["lingc.gemm"] > 0
    if inductor:
        assert any(k.startswith("triton_") for k in report.kernels.inductor_kernels)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_compiled_tiny_half_on_cuda_close_to_eager(dtype):
    # Seed 1. With seed 0 (after the per-parameter init of tensor parallelism) the bf16 error was
    # 0.114 on the H200 and 0.052 on the CPU, carried by one row of three (0.082 on the CPU): a
    # bf16 near-tie in that row's expert choice broken differently by the two roundings. A
    # discrete flip is not the rounding error this test bounds; seed 1's rows are all ~0.015 on
    # the CPU. float16 runs on the same kernels.
    model = build_model(preset("tiny"), device="cuda", dtype=dtype, progress=False, seed=1)
    cache = Ling3Cache.allocate(model.config, 32, device="cuda")
    ids, pos = torch.tensor([3, 4, 5], device="cuda"), torch.arange(3, device="cuda")
    with torch.no_grad():
        ref, _ = model(ids, pos, cache.clone())
    (logits, _), report = run_and_report(model, ids, pos, cache, role="decode", inductor=False)
    rel = (logits.float() - ref.float()).norm() / ref.float().norm()
    assert rel < 3e-2, f"{dtype} relative error {rel:.3g}"
    rows = {op: n for cat, op, n, _ in report.kernels.rows if cat == "lingc"}
    assert rows["lingc.kda_chain"] > 0 and rows["lingc.moe_experts"] > 0
    assert rows["lingc.gemm"] > 0 and rows["lingc.rmsnorm_router"] > 0
    assert rows["lingc.mla_decode"] > 0


@pytest.mark.parametrize("dynamic", [None, True])
def test_symbolic_shapes_on_cuda_compile_per_shape(dynamic):
    """A graph Dynamo traces with symbolic sizes runs lingc's static pipeline per shape on CUDA."""
    import torch.nn.functional as F

    torch._dynamo.reset()
    g, u = (torch.randn(96, 32, device="cuda", dtype=torch.bfloat16) / 6 for _ in range(2))
    d = torch.randn(32, 96, device="cuda", dtype=torch.bfloat16) / 10

    def mlp(x):
        return x + F.linear(F.silu(F.linear(x, g)) * F.linear(x, u), d)

    from lingc.backend import compile_reports

    step = torch.compile(mlp, backend="lingc", dynamic=dynamic)
    before = len(compile_reports)
    with torch.no_grad():
        for n in (1, 3, 6, 3):
            x = torch.randn(n, 32, device="cuda", dtype=torch.bfloat16)
            torch.testing.assert_close(step(x).float(), mlp(x).float(), rtol=3e-2, atol=3e-2)
    assert len(compile_reports) - before == 3
    for report in compile_reports[before:]:
        assert {op for cat, op, _, _ in report.kernels.rows if cat == "lingc"} == \
            {"lingc.swiglu_gemm_separate", "lingc.gemm"}
