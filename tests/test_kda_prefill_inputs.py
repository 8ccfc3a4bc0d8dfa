"""lingc::kda_prefill_inputs: the Triton kernel (interpreter on the CPU, sm_90 with -m gpu) and the
op against KDA's eager input glue (kda_math's short_conv, l2norm and kda_gate composed as
KDAAttention.forward does) over token counts, heads, head dims, conv widths and dtypes, on fresh
random inputs and cached windows, every output element written; argument checks; the model's
prompt path runs through it."""

from __future__ import annotations

import textwrap

import pytest
import torch
from helpers import run_sm90_compile_check

from lingc.models.kda_math import kda_gate, l2norm, short_conv
from lingc.runtime.kernels.kda_prefill_inputs import kda_prefill_inputs_reference
from lingc.runtime.kernels.kda_prefill_inputs.kernel import BLOCK_T, kda_prefill_inputs_triton

DEV = "cuda" if torch.cuda.is_available() else "cpu"


def _inputs(T, H, K, W, dtype, seed, window_dtype=torch.bfloat16):
    g = torch.Generator().manual_seed(seed)
    D = H * K
    q, k, v, f = (torch.randn(T, D, generator=g).to(dtype) for _ in range(4))
    windows = torch.randn(3, D, W - 1, generator=g).to(window_dtype)
    wq, wk, wv = (0.5 * torch.randn(D, W, generator=g) for _ in range(3))
    a_log = 0.3 * torch.randn(H, generator=g)
    dt_bias = 0.2 * torch.randn(D, generator=g)
    args = (q, k, v, f, windows, wq, wk, wv, a_log, dt_bias)
    return tuple(t.to(DEV) for t in args) + (-5.0, H)


def _eager(q, k, v, f, windows, wq, wk, wv, a_log, dt_bias, lower_bound, H):
    """What KDAAttention.forward runs on the projection outputs, written out here."""
    T, D = q.shape
    K = D // H
    convs = [short_conv(x, windows[i], w)[0].view(T, H, K) for i, (x, w) in enumerate(((q, wq), (k, wk), (v, wv)))]
    return (l2norm(convs[0]) * (K ** -0.5), l2norm(convs[1]), convs[2],
            kda_gate(f.view(T, H, K), a_log, dt_bias, lower_bound))


@pytest.mark.parametrize("T,H,K,W", [(1, 1, 16, 4), (2, 2, 16, 4), (5, 2, 32, 2), (BLOCK_T + 3, 3, 16, 4),
                                     (70, 1, 64, 3)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_kernel_matches_eager_and_writes_every_element(T, H, K, W, dtype):
    args = _inputs(T, H, K, W, dtype, seed=T * 1000 + H * 100 + K + W)
    got = kda_prefill_inputs_triton(*args)
    want = _eager(*args)
    for name, a, b in zip("qkvg", got, want):
        assert a.shape == (T, H, K) and a.dtype == torch.float32
        assert not torch.isnan(a).any(), f"{name}: {int(torch.isnan(a).sum())} elements never written"
        # The same operations in the same order; an FMA may skip a rounding per tap.
        torch.testing.assert_close(a, b, rtol=2e-6, atol=2e-6, msg=name)


def test_outputs_start_from_poison_on_the_gpu_path():
    # torch.empty may hand back zeros or stale values; check the kernel writes over NaN too.
    args = _inputs(BLOCK_T + 1, 2, 16, 4, torch.bfloat16, seed=7)
    real_empty = torch.empty

    def poisoned(*a, **kw):
        return real_empty(*a, **kw).fill_(float("nan"))

    torch.empty = poisoned
    try:
        got = kda_prefill_inputs_triton(*args)
    finally:
        torch.empty = real_empty
    for a, b in zip(got, _eager(*args)):
        torch.testing.assert_close(a, b, rtol=2e-6, atol=2e-6)


def test_windows_continue_the_previous_chunk():
    # Two chunks through the kernel with the window carried equal one chunk of both: the window
    # really is the rows before the chunk, in order (oldest first).
    T, H, K, W = 12, 2, 16, 4
    q, k, v, f, windows, wq, wk, wv, a_log, dt_bias, lb, _ = _inputs(T, H, K, W, torch.float32, seed=11,
                                                                     window_dtype=torch.float32)
    whole = kda_prefill_inputs_triton(q, k, v, f, windows, wq, wk, wv, a_log, dt_bias, lb, H)
    cut = 5
    first = kda_prefill_inputs_triton(q[:cut], k[:cut], v[:cut], f[:cut], windows, wq, wk, wv, a_log, dt_bias, lb, H)
    carried = torch.stack([torch.cat([windows[i].T, x[:cut]])[-(W - 1):].T for i, x in enumerate((q, k, v))])
    second = kda_prefill_inputs_triton(q[cut:], k[cut:], v[cut:], f[cut:], carried.contiguous(), wq, wk, wv,
                                       a_log, dt_bias, lb, H)
    for a, b, c in zip(whole, first, second):
        torch.testing.assert_close(a, torch.cat([b, c]), rtol=0, atol=0)


def test_reference_is_the_eager_composition():
    args = _inputs(9, 2, 16, 4, torch.bfloat16, seed=13)
    cpu = tuple(a.cpu() if torch.is_tensor(a) else a for a in args)
    for a, b in zip(kda_prefill_inputs_reference(*cpu), _eager(*cpu)):
        assert torch.equal(a, b)


def test_op_dispatch_fake_and_opcheck():
    args = _inputs(6, 2, 16, 4, torch.bfloat16, seed=17)
    got = torch.ops.lingc.kda_prefill_inputs(*args)
    for a, b in zip(got, _eager(*args)):
        torch.testing.assert_close(a, b, rtol=2e-6, atol=2e-6)
    torch.library.opcheck(torch.ops.lingc.kda_prefill_inputs.default, args)


@pytest.mark.parametrize("case,match", [
    (lambda a: (a[0][None],) + a[1:], r"q must be the \[T, D\] projection output"),
    (lambda a: a[:11] + (3,), "heads=3 must be >= 1 and divide D=32"),
    (lambda a: a[:11] + (4,), "the head dim K = D / heads = 8 must be a power of two >= 16"),
    (lambda a: (a[0], a[1][:-1]) + a[2:], r"k must be \[T, D\]"),
    (lambda a: (a[0], a[1].float()) + a[2:], "must share one float dtype"),
    (lambda a: (a[0], a[1], a[2], a[3], a[4][:2]) + a[5:], r"windows must be the conv cache \[3, D, W-1\]"),
    (lambda a: a[:5] + (a[5][:, :3].contiguous(),) + a[6:], r"wq must be a contiguous float32 \[D, W\]"),
    (lambda a: a[:8] + (a[8][:1],) + a[9:], r"a_log must be \[heads\]"),
    (lambda a: (a[0].t().contiguous().t(),) + a[1:], "unit stride along D and one row stride"),
    (lambda a: a[:4] + (torch.zeros(3, 32, 17),) + tuple(torch.zeros(32, 18) for _ in range(3)) + a[8:],
     "conv width W = 18"),
])
def test_bad_arguments_are_named(case, match):
    args = _inputs(6, 2, 16, 4, torch.bfloat16, seed=19)
    with pytest.raises(ValueError, match=f"kda_prefill_inputs: .*{match}"):
        torch.ops.lingc.kda_prefill_inputs(*case(args))


_COMPILE_CHECK = textwrap.dedent("""
    from sm90 import compile_sm90
    from lingc.runtime.kernels.kda_prefill_inputs.kernel import _kda_prefill_inputs_kernel, BLOCK_T
    for dt in ("*bf16", "*fp32"):
        sig = dict(q_ptr=dt, k_ptr=dt, v_ptr=dt, f_ptr=dt, win_ptr="*bf16", wq_ptr="*fp32", wk_ptr="*fp32",
                   wv_ptr="*fp32", a_log_ptr="*fp32", dt_bias_ptr="*fp32", qo_ptr="*fp32", ko_ptr="*fp32",
                   vo_ptr="*fp32", g_ptr="*fp32", T="i32", stride_xt="i32", stride_win_i="i32",
                   stride_win_d="i32", stride_win_j="i32", lower_bound="fp32", q_scale="fp32", eps="fp32")
        ptx, report = compile_sm90(_kda_prefill_inputs_kernel, sig, dict(K=128, W=4, BLOCK_T=BLOCK_T))
        assert "0 bytes spill" in report, report
""")


def test_kernel_compiles_for_sm90_without_spills():
    run_sm90_compile_check(_COMPILE_CHECK)


@pytest.mark.gpu
@pytest.mark.parametrize("T", [64, 8192])
def test_gpu_flash_tp4_rank_chunk(T):
    # flash-tp4-rank's KDA: 8 heads of 128, conv width 4, bf16 projections and cache.
    args = _inputs(T, 8, 128, 4, torch.bfloat16, seed=T)
    got = torch.ops.lingc.kda_prefill_inputs(*args)
    for name, a, b in zip("qkvg", got, _eager(*args)):
        assert not torch.isnan(a).any(), name
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5, msg=name)
