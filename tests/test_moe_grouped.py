"""lingc::moe_grouped and lingc::moe_group_pairs: the pairs grouped by a counting sort, the block
table, the up-GEMM (rows gathered, SwiGLU in the epilogue) and the down-GEMM (Triton interpreter on
the CPU, sm_90 with -m gpu) against the plain-PyTorch references over expert counts, skewed and
uniform routings, sizes that leave partial tiles, clamps and dtypes, on fresh random inputs with
poisoned outputs; argument checks; the grouped MoE form runs through the op."""

from __future__ import annotations

import textwrap

import pytest
import torch
from helpers import run_sm90_compile_check

import lingc.runtime.kernels.moe_grouped  # noqa: F401  (registers the op)
from lingc.runtime.kernels.moe_grouped.kernel import (
    CONFIG, MoeGroupedConfig, block_count, block_table, moe_grouped_triton,
)
from lingc.runtime.kernels.moe_grouped.group_kernel import BLOCK as GROUP_BLOCK
from lingc.runtime.kernels.moe_grouped.group_kernel import moe_group_pairs_triton
from lingc.runtime.kernels.moe_grouped.naive import moe_group_pairs_reference, moe_grouped_reference

DEV = "cuda" if torch.cuda.is_available() else "cpu"
SMALL = MoeGroupedConfig(block_m=16, block_n=16, block_k=16, block_h=16, down_block_k=16)


def _routing(T, k, E, skew, seed):
    """ids [T, k] (distinct per token), then the stable sort's order and cumulative ends."""
    g = torch.Generator().manual_seed(seed)
    weights = torch.ones(E)
    if skew:
        weights[max(k, E // 2):] = 0.0     # the upper experts empty
        weights[1 % E] = 50.0              # one crowded over several blocks
    ids = torch.stack([torch.multinomial(weights, k, replacement=False, generator=g) for _ in range(T)])
    flat = ids.reshape(-1)
    order = torch.argsort(flat, stable=True)
    ends = torch.bincount(flat, minlength=E).cumsum(0).to(torch.int32)
    return ids, order.to(DEV), ends.to(DEV)


def _weights(E, H, inter, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    x_scale = 1.0 / H ** 0.5
    w13 = (torch.randn(E, 2 * inter, H, generator=g) * x_scale * 1.5).to(dtype).to(DEV)
    w2 = (torch.randn(E, H, inter, generator=g) / inter ** 0.5).to(dtype).to(DEV)
    return w13, w2


def _x(T, H, dtype, seed):
    return torch.randn(T, H, generator=torch.Generator().manual_seed(seed)).to(dtype).to(DEV)


def _tol(dtype):
    # bf16: one rounding of the activation and of the output (the interpreter truncates its casts).
    return dict(rtol=2e-2, atol=2e-2) if dtype == torch.bfloat16 else dict(rtol=2e-5, atol=2e-5)


def _table_reference(ends, pairs, block_m):
    nb = block_count(pairs, ends.numel(), block_m)
    rows, start = [], 0
    for e, end in enumerate(ends.tolist()):
        for lo in range(start, end, block_m):
            rows.append((e, lo, end))
        start = end
    return rows, nb


def _check_grouping(ids, E, order, inv, ends):
    """order is a permutation grouping the pairs by increasing expert, inv its inverse, ends the
    cumulative counts (the order inside an expert is free)."""
    flat = ids.reshape(-1).cpu()
    P = flat.numel()
    order, inv, ends = order.cpu(), inv.cpu(), ends.cpu()
    assert torch.equal(torch.sort(order).values, torch.arange(P)), "order must be a permutation of the pairs"
    assert torch.equal(inv[order], torch.arange(P)), "inv must invert order"
    assert torch.equal(ends.long(), torch.bincount(flat, minlength=E).cumsum(0))
    grouped = flat[order]
    assert torch.equal(grouped, torch.sort(flat).values), "sorted slots must run through the experts in order"


@pytest.mark.parametrize("E,T,k,skew", [(4, 5, 2, False), (9, 700, 3, True), (600, 3, 8, False),
                                        (512, GROUP_BLOCK // 4 + 3, 8, False), (1, 7, 1, False)])
def test_group_pairs_kernel_groups_every_pair(E, T, k, skew):
    ids, _, _ = _routing(T, k, E, skew, seed=E + 7 * T)
    ids = ids.to(DEV)
    order, inv, ends = moe_group_pairs_triton(ids, E)
    _check_grouping(ids, E, order, inv, ends)
    ro, ri, re = moe_group_pairs_reference(ids, E)
    _check_grouping(ids, E, ro, ri, re)
    assert torch.equal(ro.cpu(), torch.argsort(ids.reshape(-1).cpu(), stable=True))   # the reference is stable


def test_group_pairs_op_and_its_checks():
    ids = torch.randint(0, 6, (10, 2), device=DEV)
    _check_grouping(ids, 6, *torch.ops.lingc.moe_group_pairs(ids, 6))
    torch.library.opcheck(torch.ops.lingc.moe_group_pairs.default, (ids, 6))
    with pytest.raises(ValueError, match="moe_group_pairs: ids must be the router's contiguous int32 or int64"):
        torch.ops.lingc.moe_group_pairs(ids.float(), 6)
    with pytest.raises(ValueError, match="moe_group_pairs: ids must be the router's contiguous"):
        torch.ops.lingc.moe_group_pairs(ids.t(), 6)
    with pytest.raises(ValueError, match="moe_group_pairs: num_experts must be an int from 1 to 8192, got 0"):
        torch.ops.lingc.moe_group_pairs(ids, 0)


def test_combine_takes_the_grouping_inverse():
    """moe_combine_sorted with the inverse from moe_group_pairs equals it computing the inverse."""
    from lingc.runtime.kernels.moe_combine import moe_combine_sorted
    ids, _, _ = _routing(12, 3, 5, False, seed=3)
    ids = ids.to(DEV)
    order, inv, _ = torch.ops.lingc.moe_group_pairs(ids, 5)
    ys = torch.randn(36, 40, device=DEV)
    w = torch.rand(12, 3, device=DEV)
    torch.testing.assert_close(moe_combine_sorted(ys, order, w, None, None, inv), moe_combine_sorted(ys, order, w))
    with pytest.raises(ValueError, match=r"inv must be the int64 inverse permutation \[T\*k\] = \[36\]"):
        moe_combine_sorted(ys, order, w, None, None, inv[:-1])


@pytest.mark.parametrize("E,T,k,block_m,skew", [(4, 5, 2, 16, False), (9, 37, 3, 16, True), (600, 3, 8, 16, False),
                                                 (5, 200, 2, 64, True), (1, 7, 1, 16, False)])
def test_block_table_lists_every_block_then_marks_the_rest(E, T, k, block_m, skew):
    _, order, ends = _routing(T, k, E, skew, seed=E + T)
    want, nb = _table_reference(ends.cpu(), T * k, block_m)
    table = torch.full((nb, 3), 12345, dtype=torch.int32, device=DEV)
    got = block_table(ends, T * k, block_m, table).cpu()
    assert [tuple(r) for r in got[:len(want)].tolist()] == want
    assert (got[len(want):, 0] == -1).all(), "entries past the last block must say 'no expert'"


@pytest.mark.parametrize("E,H,inter,T,k,skew", [
    (4, 32, 16, 5, 2, False),     # fewer rows than a block
    (7, 48, 24, 37, 3, True),     # partial K and column tiles, a crowded expert over several blocks
    (3, 64, 40, 23, 1, False),    # one slot
])
@pytest.mark.parametrize("limit", [0.0, 0.5])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_kernel_matches_reference_and_writes_every_element(E, H, inter, T, k, skew, limit, dtype):
    seed = E * 1000 + H + T
    ids, order, ends = _routing(T, k, E, skew, seed)
    x = _x(T, H, dtype, seed + 1)
    w13, w2 = _weights(E, H, inter, dtype, seed + 2)
    P = T * k
    act = torch.full((P, inter), float("nan"), device=DEV, dtype=dtype)
    out = torch.full((P, H), float("nan"), device=DEV, dtype=dtype)
    got = moe_grouped_triton(x, order, ends, w13, w2, limit, k, config=SMALL, act=act, out=out)
    assert got is out and not torch.isnan(out).any(), f"{int(torch.isnan(out).sum())} output elements never written"
    assert not torch.isnan(act).any(), f"{int(torch.isnan(act).sum())} activation elements never written"
    want = moe_grouped_reference(x, order, ends, w13, w2, limit, k)
    torch.testing.assert_close(got.float(), want.float(), **_tol(dtype))


def test_default_config_on_a_small_chunk():
    # The launch table's own tiles (64-row blocks, 128 weight rows, 128 output columns).
    ids, order, ends = _routing(40, 4, 6, False, seed=11)
    x = _x(40, 128, torch.bfloat16, 12)
    w13, w2 = _weights(6, 128, 80, torch.bfloat16, 13)
    out = torch.full((160, 128), float("nan"), device=DEV, dtype=torch.bfloat16)
    got = moe_grouped_triton(x, order, ends, w13, w2, 0.0, 4, config=CONFIG, out=out)
    assert not torch.isnan(got).any()
    torch.testing.assert_close(got.float(), moe_grouped_reference(x, order, ends, w13, w2, 0.0, 4).float(),
                               **_tol(torch.bfloat16))


def test_reference_equals_the_models_grouped_matmuls():
    """The reference is the gate/up and down projections of each pair's token, as the gather form
    (Experts.forward) computes them, in sorted order."""
    from lingc.models.moe import swiglu
    E, H, inter, T, k = 5, 32, 16, 9, 2
    ids, order, ends = _routing(T, k, E, False, seed=5)
    x = _x(T, H, torch.float32, 6)
    w13, w2 = _weights(E, H, inter, torch.float32, 7)
    got = moe_grouped_reference(x, order, ends, w13, w2, 0.0, k)
    flat = ids.reshape(-1).to(DEV)
    for i, p in enumerate(order.tolist()):
        e, t = int(flat[p]), p // k
        h = w13[e] @ x[t]
        want = w2[e] @ swiglu(h[:inter], h[inter:], 0.0)
        torch.testing.assert_close(got[i], want, rtol=1e-5, atol=1e-5)


def test_op_dispatch_fake_and_opcheck():
    ids, order, ends = _routing(6, 2, 4, False, seed=8)
    x = _x(6, 32, torch.bfloat16, 9)
    w13, w2 = _weights(4, 32, 16, torch.bfloat16, 10)
    got = torch.ops.lingc.moe_grouped(x, order, ends, w13, w2, 0.5, 2)
    torch.testing.assert_close(got.float(), moe_grouped_reference(x, order, ends, w13, w2, 0.5, 2).float(),
                               **_tol(torch.bfloat16))
    torch.library.opcheck(torch.ops.lingc.moe_grouped.default, (x, order, ends, w13, w2, 0.5, 2))


def _args():
    ids, order, ends = _routing(6, 2, 4, False, seed=8)
    w13, w2 = _weights(4, 32, 16, torch.bfloat16, 10)
    return [_x(6, 32, torch.bfloat16, 9), order, ends, w13, w2, 0.0, 2]


def _with(i, value):
    def make():
        a = _args()
        a[i] = value(a[i]) if callable(value) else value
        return a
    return make


@pytest.mark.parametrize("make,match", [
    (_with(0, lambda x: x.t().contiguous().t()), "x must be floating-point"),
    (_with(0, lambda x: x.long()), "x must be floating-point"),
    (_with(6, 0), "top_k must be an int >= 1"),
    (_with(1, lambda o: o[:-1]), r"order must be the int64 permutation \[T\*top_k\] = \[12\]"),
    (_with(1, lambda o: o.int()), "order must be the int64 permutation"),
    (_with(3, lambda w: w[:, :-1]), r"w13 must be \[E, 2I, H\]"),
    (_with(3, lambda w: w.float()), r"w13 must be \[E, 2I, H\]"),
    (_with(4, lambda w: w[:, :, :-1]), r"w2 must be \[E, H, I\] = \[4, 32, 16\]"),
    (_with(2, lambda e: e[:-1]), r"ends must be the int32 or int64 cumulative row counts per expert \[E\] = \[4\]"),
    (_with(2, lambda e: e.float()), "ends must be the int32 or int64"),
    (_with(5, -1.0), "limit must be a finite number >= 0"),
])
def test_bad_arguments_are_named(make, match):
    with pytest.raises(ValueError, match=f"moe_grouped: {match}"):
        torch.ops.lingc.moe_grouped(*make())


def test_bad_config_is_named():
    with pytest.raises(ValueError, match="MoeGroupedConfig.block_m=24: use a power of two >= 16"):
        MoeGroupedConfig(block_m=24)
    with pytest.raises(ValueError, match="MoeGroupedConfig.up_warps=3"):
        MoeGroupedConfig(up_warps=3)


def test_grouped_moe_form_runs_through_the_op(monkeypatch):
    """forward_grouped's experts are the op (CPU: the reference); with the shared rows and the
    model dtype given, its output is the MoE chunk's (the gather form's experts + shared)."""
    from model_helpers import tiny_model

    import lingc.runtime.kernels.moe_grouped as pkg
    from lingc.models import moe as moe_module
    from lingc.models.moe import MoE
    model = tiny_model(seed=6)
    mlp = next(layer.mlp for layer in model.target_layers if isinstance(layer.mlp, MoE))
    calls, real = [], pkg.moe_grouped

    def spy(x, order, ends, w13, w2, limit, top_k):
        calls.append((tuple(x.shape), order.numel(), top_k, limit))
        return real(x, order, ends, w13, w2, limit, top_k)

    monkeypatch.setattr(pkg, "moe_grouped", spy)
    x = torch.randn(10, model.config.hidden_size)
    ids, w = mlp.gate(x)
    k = ids.shape[1]
    got = mlp.experts.forward_grouped(x, ids, w)
    assert calls == [((10, model.config.hidden_size), 10 * k, k, mlp.experts.limit)]
    torch.testing.assert_close(got, mlp.experts(x, ids, w), rtol=1e-5, atol=1e-5)
    shared = mlp.shared_experts(x)
    whole = mlp.experts.forward_grouped(x, ids, w, shared, x.dtype)
    torch.testing.assert_close(whole, (mlp.experts(x, ids, w) + shared.float()).to(x.dtype), rtol=1e-5, atol=1e-5)
    # The library form (torch._grouped_mm) stays selectable and agrees.
    monkeypatch.setattr(moe_module, "GROUPED_GEMM", "library")
    calls.clear()
    torch.testing.assert_close(mlp.experts.forward_grouped(x, ids, w), got, rtol=1e-5, atol=1e-5)
    assert calls == []


_COMPILE_CHECK = textwrap.dedent("""
    from sm90 import compile_sm90, divisible_by_16
    from lingc.runtime.kernels.moe_grouped.kernel import (
        CONFIG, TAIL, _block_table_kernel, _grouped_down_kernel, _grouped_up_kernel)
    c = CONFIG
    dot = dict(DOT_PRECISION="tf32", DOT_UPCAST=False)
    sig = dict(x_ptr="*bf16", order_ptr="*i64", table_ptr="*i32", w_ptr="*bf16", act_ptr="*bf16",
               stride_xt="i32", stride_we="i32", stride_wn="i32", stride_act="i32", limit="fp32")
    # The launcher's specialisation at the model's shapes: aligned pointers and strides.
    aligned = lambda fn: divisible_by_16(fn, [n for n in sig if n != "limit"])
    for lim in (False, True):
        ptx, report = compile_sm90(_grouped_up_kernel, sig, dict(H=2560, I=192, TOP_K=8, BLOCK_M=c.block_m,
            BLOCK_N=c.block_n, BLOCK_K=c.block_k, HAS_LIMIT=lim, **dot), aligned(_grouped_up_kernel),
            num_warps=c.up_warps, num_stages=c.up_stages)
        assert "0 bytes spill" in report, report
        assert "cp.async" in ptx and "wgmma.mma_async" in ptx, "the up-GEMM should stream its tiles into wgmma"
    sig = dict(act_ptr="*bf16", table_ptr="*i32", w_ptr="*bf16", y_ptr="*bf16", stride_act="i32",
               stride_we="i32", stride_wh="i32", stride_y="i32")
    ptx, report = compile_sm90(_grouped_down_kernel, sig, dict(H=2560, I=192, BLOCK_M=c.block_m,
        BLOCK_H=c.block_h, BLOCK_K=c.down_block_k, **dot), aligned(_grouped_down_kernel),
        num_warps=c.down_warps, num_stages=c.down_stages)
    assert "0 bytes spill" in report, report
    assert "cp.async" in ptx and "wgmma.mma_async" in ptx, "the down-GEMM should stream its tiles into wgmma"
    from lingc.runtime.kernels.moe_grouped.group_kernel import BLOCK, _moe_pair_count_kernel, _moe_pair_place_kernel
    ptx, report = compile_sm90(_moe_pair_count_kernel, dict(ids_ptr="*i64", counts_ptr="*i32", P="i32"), dict(BLOCK=BLOCK))
    assert "0 bytes spill" in report, report
    ptx, report = compile_sm90(_moe_pair_place_kernel, dict(ids_ptr="*i64", counts_ptr="*i32", cursor_ptr="*i32",
        ends_ptr="*i32", order_ptr="*i64", inv_ptr="*i64", P="i32", E="i32"), dict(BLOCK=BLOCK, E_PAD=512))
    assert "0 bytes spill" in report, report
    sig = dict(ends_ptr="*i32", table_ptr="*i32", E="i32", NB="i32")
    ptx, report = compile_sm90(_block_table_kernel, sig, dict(BLOCK_M=c.block_m, E_PAD=512, TAIL=TAIL))
    assert "0 bytes spill" in report, report
""")


def test_kernels_compile_for_sm90_without_spills():
    run_sm90_compile_check(_COMPILE_CHECK)


@pytest.mark.gpu
@pytest.mark.parametrize("tokens", [1024, 8192])
def test_gpu_flash_tp4_rank_chunk(tokens):
    """flash-tp4-rank's routed experts at a prompt chunk (E = 512, H = 2560, I = 192, top-8), a
    uniform routing, against the reference's fp32 products (the library path's bits differ by
    summation order)."""
    E, H, inter, k = 512, 2560, 192, 8
    ids, order, ends = _routing(tokens, k, E, False, seed=tokens)
    x = _x(tokens, H, torch.bfloat16, 1)
    w13, w2 = _weights(E, H, inter, torch.bfloat16, 2)
    P = tokens * k
    out = torch.full((P, H), float("nan"), device=DEV, dtype=torch.bfloat16)
    got = moe_grouped_triton(x, order, ends, w13, w2, 7.0, k, out=out)
    assert not torch.isnan(got).any(), f"{int(torch.isnan(got).sum())} output elements never written"
    want = moe_grouped_reference(x, order, ends, w13, w2, 7.0, k).float()
    # Summation orders differ, so an activation can round to the neighbouring bf16 value (one
    # element in 1.7e8 moved by 0.022 at 8192 tokens): a tight RMS and a loose elementwise bound.
    assert float((got.float() - want).pow(2).mean().sqrt() / want.pow(2).mean().sqrt()) < 5e-3
    torch.testing.assert_close(got.float(), want, rtol=2e-2, atol=6e-2)
    assert torch.equal(torch.ops.lingc.moe_grouped(x, order, ends, w13, w2, 7.0, k), got)


@pytest.mark.gpu
def test_gpu_group_pairs_at_a_prompt_chunk():
    """flash-tp4-rank's 8192-token chunk: 65536 pairs over 512 experts, grouped in two launches."""
    ids = torch.rand(8192, 512, device=DEV).argsort(dim=1)[:, :8].int().contiguous()
    _check_grouping(ids, 512, *torch.ops.lingc.moe_group_pairs(ids, 512))
