"""lingc::moe_combine_sorted: the Triton kernel (interpreter on the CPU, sm_90 with -m gpu) and the
op against the ATen form it replaces (index_copy into pair order, fp32, the slot sum) over token
counts, widths, slot counts and dtypes, fresh random inputs, every output element written;
argument checks; the grouped MoE form runs through it."""

from __future__ import annotations

import textwrap

import pytest
import torch
from helpers import run_sm90_compile_check

import lingc.runtime.kernels.moe_combine  # noqa: F401
from lingc.runtime.kernels.moe_combine.kernel import BLOCK_H, moe_combine_sorted_triton
from lingc.runtime.kernels.moe_combine.naive import moe_combine_sorted_reference
from lingc.runtime.kernels.moe_combine.op import MAX_SLOTS

DEV = "cuda" if torch.cuda.is_available() else "cpu"


def _inputs(T, k, H, dtype, seed, experts=16):
    """Pair outputs sorted by a random routing, as forward_grouped produces them."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, experts, (T * k,), generator=g)
    order = torch.argsort(ids, stable=True)
    ys = torch.randn(T * k, H, generator=g).to(dtype)
    w = torch.rand(T, k, generator=g) + 0.05
    return ys.to(DEV), order.to(DEV), w.to(DEV)


def _inverse(order):
    return torch.empty_like(order).scatter_(0, order, torch.arange(order.numel(), device=order.device))


@pytest.mark.parametrize("T,k,H", [(1, 8, 96), (5, 8, 2560), (3, 1, 17), (4, 3, BLOCK_H + 1), (2, MAX_SLOTS, 64)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_kernel_matches_reference_and_writes_every_element(T, k, H, dtype):
    ys, order, w = _inputs(T, k, H, dtype, seed=T * 100 + k * 10 + H)
    out = torch.full((T, H), float("nan"), device=DEV)
    got = moe_combine_sorted_triton(ys, _inverse(order), w, out)
    assert got is out and not torch.isnan(out).any(), f"{int(torch.isnan(out).sum())} elements never written"
    expect = moe_combine_sorted_reference(ys, order, w)
    # Same products and order; an FMA may skip one rounding per slot.
    torch.testing.assert_close(got, expect, rtol=k * 2e-7, atol=k * 2e-7 * expect.abs().max().item())


@pytest.mark.parametrize("out_dtype", [None, torch.bfloat16])
def test_kernel_adds_the_shared_rows_and_rounds_once(out_dtype):
    # The grouped MoE's output: slot sum + the shared expert's rows (bf16, a row stride other
    # than H), in fp32, rounded once to out_dtype; every element written.
    T, k, H = 5, 8, BLOCK_H + 7
    ys, order, w = _inputs(T, k, H, torch.bfloat16, seed=21)
    wide = torch.randn(T, H + 5, generator=torch.Generator().manual_seed(22)).bfloat16().to(DEV)
    shared = wide[:, :H]
    out = torch.full((T, H), float("nan"), device=DEV, dtype=out_dtype or torch.float32)
    got = moe_combine_sorted_triton(ys, _inverse(order), w, out, shared=shared, out_dtype=out_dtype)
    assert got is out and not torch.isnan(out).any()
    expect = moe_combine_sorted_reference(ys, order, w) + shared.float()
    if out_dtype is None:
        torch.testing.assert_close(got, expect, rtol=k * 2e-7, atol=k * 2e-7 * expect.abs().max().item())
    else:
        torch.testing.assert_close(got.float(), expect.to(out_dtype).float(), rtol=1e-2, atol=1e-2)
    torch.testing.assert_close(moe_combine_sorted_reference(ys, order, w, shared, out_dtype).float(),
                               expect if out_dtype is None else expect.to(out_dtype).float())


def test_reference_is_the_pair_order_slot_sum():
    # Independent of the permutation: pair (t, j) is ys[inv[t * k + j]].
    T, k, H = 3, 4, 5
    ys, order, w = _inputs(T, k, H, torch.float32, seed=9)
    inv = _inverse(order)
    expect = torch.stack([sum(w[t, j] * ys[inv[t * k + j]] for j in range(k)) for t in range(T)])
    torch.testing.assert_close(moe_combine_sorted_reference(ys, order, w), expect, rtol=1e-6, atol=1e-6)


def test_op_dispatch_fake_and_opcheck():
    ys, order, w = _inputs(6, 8, 40, torch.bfloat16, seed=3)
    got = torch.ops.lingc.moe_combine_sorted(ys, order, w)
    torch.testing.assert_close(got, moe_combine_sorted_reference(ys, order, w), rtol=2e-6, atol=2e-6)
    torch.library.opcheck(torch.ops.lingc.moe_combine_sorted.default, (ys, order, w))
    shared = torch.randn(6, 40, generator=torch.Generator().manual_seed(5)).bfloat16().to(DEV)
    got = torch.ops.lingc.moe_combine_sorted(ys, order, w, shared, torch.bfloat16)
    assert got.dtype == torch.bfloat16
    torch.library.opcheck(torch.ops.lingc.moe_combine_sorted.default, (ys, order, w, shared, torch.bfloat16))


@pytest.mark.parametrize("case,match", [
    (lambda ys, o, w: (ys, o, w.double()), "weights must be \\[T, k\\] float32"),
    (lambda ys, o, w: (ys[:-1], o, w), "ys must be .* \\[48, H\\]"),
    (lambda ys, o, w: (ys.long(), o, w), "ys must be the floating-point"),
    (lambda ys, o, w: (ys, o.int(), w), "order must be the int64 permutation"),
    (lambda ys, o, w: (ys, o[:-1], w), "order must be"),
    (lambda ys, o, w: (ys.repeat(5, 1), o.repeat(5), w.repeat(1, 5) [:, :MAX_SLOTS + 8]), "slots per token"),
    (lambda ys, o, w: (ys, o, w, ys[:5]), r"shared must be the floating-point shared-expert rows \[T, H\] = \[6, 16\]"),
    (lambda ys, o, w: (ys, o, w, ys[:6].t().contiguous().t()), "unit stride along H"),
    (lambda ys, o, w: (ys, o, w, None, torch.int32), "out_dtype must be a floating-point dtype"),
])
def test_bad_arguments_are_named(case, match):
    ys, order, w = _inputs(6, 8, 16, torch.bfloat16, seed=4)
    with pytest.raises(ValueError, match=match):
        torch.ops.lingc.moe_combine_sorted(*case(ys, order, w))


def test_grouped_moe_form_runs_through_the_op(monkeypatch):
    """forward_grouped's combine is the op (CPU: the reference), equal to the gather form."""
    from model_helpers import tiny_model

    from lingc.models.moe import MoE
    model = tiny_model(seed=5)
    mlp = next(layer.mlp for layer in model.target_layers if isinstance(layer.mlp, MoE))
    calls = []
    real = torch.ops.lingc.moe_combine_sorted

    class Spy:
        def __call__(self, *a):
            calls.append(a[0].shape)
            return real(*a)

    import lingc.runtime.kernels.moe_combine as pkg
    monkeypatch.setattr(pkg, "moe_combine_sorted", Spy())
    x = torch.randn(10, model.config.hidden_size)
    ids, w = mlp.gate(x)
    got = mlp.experts.forward_grouped(x, ids, w)
    assert calls == [(10 * ids.shape[1], model.config.hidden_size)]
    torch.testing.assert_close(got, mlp.experts(x, ids, w), rtol=1e-5, atol=1e-5)


_COMPILE_CHECK = textwrap.dedent("""
    from sm90 import compile_sm90
    from lingc.runtime.kernels.moe_combine.kernel import _moe_combine_sorted_kernel, BLOCK_H
    for dt in ("*bf16", "*fp32"):
        for shared in (False, True):
            sig = dict(ys_ptr=dt, inv_ptr="*i64", w_ptr="*fp32", out_ptr=dt if shared else "*fp32", shared_ptr=dt,
                       H="i32", stride_st="i32")
            ptx, report = compile_sm90(_moe_combine_sorted_kernel, sig,
                                       dict(K=8, BLOCK_H=BLOCK_H, USE_GDC=True, HAS_SHARED=shared))
            assert "griddepcontrol.wait" in ptx and "griddepcontrol.launch_dependents" in ptx
            assert "0 bytes spill" in report, report
""")


def test_kernel_compiles_for_sm90():
    run_sm90_compile_check(_COMPILE_CHECK)


@pytest.mark.gpu
@pytest.mark.parametrize("T", [64, 4096])
def test_gpu_flash_tp4_rank_chunk(T):
    # flash-tp4-rank's MoE: H = 2560, 8 slots of 512 experts.
    ys, order, w = _inputs(T, 8, 2560, torch.bfloat16, seed=T, experts=512)
    got = torch.ops.lingc.moe_combine_sorted(ys, order, w)
    expect = moe_combine_sorted_reference(ys, order, w)
    torch.testing.assert_close(got, expect, rtol=2e-6, atol=2e-6 * expect.abs().max().item())
