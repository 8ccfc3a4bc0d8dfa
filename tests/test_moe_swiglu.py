"""lingc::moe_swiglu: the Triton kernel (interpreter on the CPU, sm_90 with -m gpu) and the op against
lingc.models.moe.swiglu over pair counts, intermediate sizes, clamps and dtypes, fresh random
inputs, every output element written; argument checks; the grouped MoE form runs through it."""

from __future__ import annotations

import textwrap

import pytest
import torch
from helpers import run_sm90_compile_check

import lingc.runtime.kernels.moe_swiglu  # noqa: F401  (registers the op)
from lingc.models.moe import swiglu
from lingc.runtime.kernels.moe_swiglu.kernel import ROWS, moe_swiglu_triton

DEV = "cuda" if torch.cuda.is_available() else "cpu"


def _h(P, inter, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    return (3 * torch.randn(P, 2 * inter, generator=g)).to(dtype).to(DEV)


def _tol(dtype):
    # One rounding of the output dtype (the kernel's sigmoid may differ from torch's in the last place).
    return dict(rtol=1e-2, atol=1e-2) if dtype == torch.bfloat16 else dict(rtol=2e-6, atol=2e-6)


@pytest.mark.parametrize("P,inter", [(1, 16), (ROWS + 3, 24), (37, 192), (5, 1)])
@pytest.mark.parametrize("limit", [0.0, 4.0])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_kernel_matches_swiglu_and_writes_every_element(P, inter, limit, dtype):
    h = _h(P, inter, dtype, seed=P * 100 + inter)
    out = torch.full((P, inter), float("nan"), device=DEV, dtype=dtype)
    got = moe_swiglu_triton(h, limit, out)
    assert got is out and not torch.isnan(out).any(), f"{int(torch.isnan(out).sum())} elements never written"
    want = swiglu(h[:, :inter], h[:, inter:], limit)
    torch.testing.assert_close(got.float(), want.float(), **_tol(dtype))


def test_clamp_applies():
    # With limit 4, gate values far above 4 saturate silu at 4 and up is clamped to [-4, 4].
    h = torch.tensor([[10.0, 10.0, 10.0, -10.0]], device=DEV)      # I = 2: gates 10, 10; ups 10, -10
    torch.testing.assert_close(moe_swiglu_triton(h, 4.0).cpu(), torch.tensor([[16.0, -16.0]]))
    torch.testing.assert_close(moe_swiglu_triton(h, 0.0).cpu(),
                               torch.tensor([[1.0, -1.0]]) * 100 * torch.sigmoid(torch.tensor(10.0)))


def test_op_dispatch_fake_and_opcheck():
    h = _h(6, 24, torch.bfloat16, seed=3)
    got = torch.ops.lingc.moe_swiglu(h, 4.0)
    torch.testing.assert_close(got.float(), swiglu(h[:, :24], h[:, 24:], 4.0).float(), **_tol(torch.bfloat16))
    torch.library.opcheck(torch.ops.lingc.moe_swiglu.default, (h, 4.0))


@pytest.mark.parametrize("case,match", [
    (lambda h: (h[:, :-1], 0.0), r"h must be the floating-point up-GEMM output \[P, 2I\]"),
    (lambda h: (h.long(), 0.0), "h must be the floating-point"),
    (lambda h: (h.t().contiguous().t(), 0.0), "h must have unit stride along its columns"),
    (lambda h: (h, -1.0), "limit must be a finite number >= 0"),
    (lambda h: (h, float("inf")), "limit must be a finite number >= 0"),
])
def test_bad_arguments_are_named(case, match):
    with pytest.raises(ValueError, match=f"moe_swiglu: {match}"):
        torch.ops.lingc.moe_swiglu(*case(_h(6, 8, torch.bfloat16, seed=4)))


def test_grouped_moe_form_runs_through_the_op(monkeypatch):
    """forward_grouped's activation on the library GEMMs is the op (CPU: the reference); with the
    shared rows and the model dtype given, its output is the MoE chunk's (the gather form's
    experts + shared)."""
    from model_helpers import tiny_model

    import lingc.runtime.kernels.moe_swiglu as pkg
    from lingc.models import moe as moe_module
    from lingc.models.moe import MoE
    monkeypatch.setattr(moe_module, "GROUPED_GEMM", "library")
    model = tiny_model(seed=6)
    mlp = next(layer.mlp for layer in model.target_layers if isinstance(layer.mlp, MoE))
    calls, real = [], pkg.moe_swiglu

    def spy(h, limit):
        calls.append((tuple(h.shape), limit))
        return real(h, limit)

    monkeypatch.setattr(pkg, "moe_swiglu", spy)
    x = torch.randn(10, model.config.hidden_size)
    ids, w = mlp.gate(x)
    inter = mlp.experts.inter
    got = mlp.experts.forward_grouped(x, ids, w)
    assert calls == [((10 * ids.shape[1], 2 * inter), mlp.experts.limit)]
    torch.testing.assert_close(got, mlp.experts(x, ids, w), rtol=1e-5, atol=1e-5)
    shared = mlp.shared_experts(x)
    whole = mlp.experts.forward_grouped(x, ids, w, shared, x.dtype)
    torch.testing.assert_close(whole, (mlp.experts(x, ids, w) + shared.float()).to(x.dtype), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(whole, mlp.routed_chunk(x)[0], rtol=1e-5, atol=1e-5)


_COMPILE_CHECK = textwrap.dedent("""
    from sm90 import compile_sm90
    from lingc.runtime.kernels.moe_swiglu.kernel import _moe_swiglu_kernel, ROWS
    for dt in ("*bf16", "*fp32"):
        sig = dict(h_ptr=dt, a_ptr=dt, P="i32", I="i32", stride_h="i32", stride_a="i32", limit="fp32")
        for clamp in (False, True):
            ptx, report = compile_sm90(_moe_swiglu_kernel, sig, dict(ROWS=ROWS, BLOCK_I=256, CLAMP=clamp))
            assert "0 bytes spill" in report, report
""")


def test_kernel_compiles_for_sm90_without_spills():
    run_sm90_compile_check(_COMPILE_CHECK)


@pytest.mark.gpu
@pytest.mark.parametrize("limit", [0.0, 4.0])
def test_gpu_flash_tp4_rank_chunk(limit):
    # flash-tp4-rank's grouped form at an 8192-token chunk: 65536 pairs, I = 192.
    h = _h(65536, 192, torch.bfloat16, seed=int(limit))
    got = torch.ops.lingc.moe_swiglu(h, limit)
    torch.testing.assert_close(got.float(), swiglu(h[:, :192], h[:, 192:], limit).float(), **_tol(torch.bfloat16))
