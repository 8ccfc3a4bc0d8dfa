"""lingc::mla_kv_write: the Triton kernel (interpreter on the CPU, sm_90 with -m gpu) and the op
against the model's ops, over shapes; only the target rows change, every element of them is
written."""

from __future__ import annotations

import textwrap

import pytest
import torch
from helpers import run_sm90_compile_check

import lingc.runtime.kernels.mla_kv_write  # noqa: F401
from lingc.models.layers import rope_inv_freq
from lingc.runtime.kernels.mla_kv_write.kernel import mla_kv_write_triton
from lingc.runtime.kernels.mla_kv_write.naive import mla_kv_write_reference

DEV = "cuda" if torch.cuda.is_available() else "cpu"


def _case(T, R, P, L, dtype, cache_dtype, seed):
    g = torch.Generator().manual_seed(seed)
    c = torch.randn(T, R, generator=g).to(dtype)
    k = torch.randn(T, P + 6, generator=g).to(dtype)[:, 3:3 + P]        # a strided view
    pos = torch.randperm(L, generator=g)[:T].sort().values
    freq = rope_inv_freq(P, 6.0e6 if P == 64 else 10000.0)
    cache = torch.randn(L, R + P, generator=g).to(cache_dtype)
    return [t.to(DEV) for t in (c, k, pos, freq, cache)]


@pytest.mark.parametrize("T,R,P,L", [(1, 40, 8, 64), (6, 40, 8, 64), (3, 512, 64, 300), (8, 24, 6, 17)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_kernel_matches_reference_and_touches_only_its_rows(T, R, P, L, dtype):
    c, k, pos, freq, cache = _case(T, R, P, L, dtype, dtype, seed=T * 100 + R)
    want = cache.clone()
    mla_kv_write_reference(c, k, pos, freq, want)
    got = cache.clone()
    got[pos] = float("nan")                          # every element of the target rows is written
    mla_kv_write_triton(c, k, pos, freq, got)
    assert not got.isnan().any()
    keep = torch.ones(L, dtype=torch.bool, device=cache.device)
    keep[pos] = False
    assert torch.equal(got[keep], cache[keep])
    assert torch.equal(got[pos][:, :R], want[pos][:, :R])             # c is copied exactly
    tol = 1e-6 if dtype == torch.float32 else 8e-3
    assert (got[pos][:, R:].float() - want[pos][:, R:].float()).abs().max() <= tol * 4


@pytest.mark.parametrize("T,R,P,L", [(1, 40, 8, 64), (6, 40, 8, 64), (3, 512, 64, 300), (2, 24, 5, 17), (2, 24, 0, 17)])
@pytest.mark.parametrize("dtype,cache_dtype", [(torch.float32, torch.float32), (torch.bfloat16, torch.bfloat16),
                                               (torch.float32, torch.bfloat16)])
@pytest.mark.parametrize("norm", [False, True], ids=["no-norm", "norm"])
def test_unrotated_key(T, R, P, L, dtype, cache_dtype, norm):
    """inv_freq None (an MLA whose rope dims are never rotated, Kimi Linear's mla_use_nope): the
    key is cast and copied as it is, any width P (odd too); only the target rows change, every
    element of them written; the op's CPU path is the reference."""
    c, k, pos, _, cache = _case(T, R, P, L, dtype, cache_dtype, seed=T * 10 + P)
    nw = (1 + 0.1 * torch.randn(R, generator=torch.Generator().manual_seed(3))).to(DEV) if norm else None
    want = cache.clone()
    mla_kv_write_reference(c, k, pos, None, want, nw, 1e-6)
    assert torch.equal(want[pos][:, R:], k.to(cache_dtype))
    got = cache.clone()
    got[pos] = float("nan")
    mla_kv_write_triton(c, k, pos, None, got, nw, 1e-6)
    assert not got.isnan().any()
    keep = torch.ones(L, dtype=torch.bool, device=cache.device)
    keep[pos] = False
    assert torch.equal(got[keep], cache[keep])
    if DEV == "cpu" and dtype != cache_dtype:    # the interpreter's fp32 -> bf16 cast truncates
        torch.testing.assert_close(got[pos][:, R:].float(), want[pos][:, R:].float(), rtol=8e-3, atol=0)
    else:
        assert torch.equal(got[pos][:, R:], want[pos][:, R:])          # the key: a cast copy
    if norm or (DEV == "cpu" and dtype != cache_dtype):
        torch.testing.assert_close(got[pos][:, :R].float(), want[pos][:, :R].float(), rtol=2e-2, atol=2e-2)
    else:
        assert torch.equal(got[pos][:, :R], want[pos][:, :R])
    # The op's CPU path is the reference on the CPU (a GPU run's reference normed on the GPU).
    op, want_cpu = cache.cpu().clone(), cache.cpu().clone()
    nw_cpu = None if nw is None else nw.cpu()
    torch.ops.lingc.mla_kv_write(c.cpu(), k.cpu(), pos.cpu(), None, op, nw_cpu, 1e-6)
    mla_kv_write_reference(c.cpu(), k.cpu(), pos.cpu(), None, want_cpu, nw_cpu, 1e-6)
    assert torch.equal(op, want_cpu)


def test_kernel_reads_a_bf16_inv_freq_as_fp32():
    """inv_freq cast to bf16 with the model (nn.Module.to): the rotation uses its exact fp32
    upcast, as the reference's fp32 arithmetic does."""
    c, k, pos, freq, cache = _case(6, 40, 8, 64, torch.bfloat16, torch.bfloat16, seed=5)
    half = freq.to(torch.bfloat16)
    want, got = cache.clone(), cache.clone()
    mla_kv_write_reference(c, k, pos, half, want)
    mla_kv_write_triton(c, k, pos, half, got)
    ref32 = cache.clone()
    mla_kv_write_triton(c, k, pos, half.float(), ref32)
    assert torch.equal(got, ref32)
    assert (got.float() - want.float()).abs().max() <= 8e-3 * 4


@pytest.mark.parametrize("T,R,P,L", [(1, 40, 8, 64), (6, 40, 8, 64), (3, 512, 64, 300)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("llama", [False, True], ids=["one-rounding", "llama"])
def test_kernel_with_the_latent_norm(T, R, P, L, dtype, llama):
    """NORM: the raw latent (a strided column window, as kv_a's slice of the fused projection)
    RMS-normed in the kernel, against lingc.rmsnorm's reference then the write (``llama``: the
    Hugging Face Llama form of both, round_before_weight); the key half as without the norm; only
    the target rows change, every element of them written."""
    c, k, pos, freq, cache = _case(T, R, P, L, dtype, dtype, seed=T * 10 + R + 7 + llama)
    wide = torch.randn(T, R + 9, generator=torch.Generator().manual_seed(5)).to(dtype=dtype, device=DEV)
    c = wide[:, 4:4 + R]
    nw = (torch.rand(R, generator=torch.Generator().manual_seed(6)) + 0.5).to(dtype=dtype, device=DEV)
    want = cache.clone()
    mla_kv_write_reference(c, k, pos, freq, want, nw, 1e-6, llama)
    got = cache.clone()
    got[pos] = float("nan")
    mla_kv_write_triton(c, k, pos, freq, got, nw, 1e-6, round_before_weight=llama)
    assert not got.isnan().any()
    keep = torch.ones(L, dtype=torch.bool, device=cache.device)
    keep[pos] = False
    assert torch.equal(got[keep], cache[keep])
    # The normed latent: the sum of squares reduced in another order than the reference's, and
    # (interpreter) a truncating bf16 cast: within two bf16 ulps (a rounding more in the Llama
    # form), fp32 to rounding.
    normed = got[pos][:, :R].float()
    ref = want[pos][:, :R].float()
    tol = 1e-5 if dtype == torch.float32 else (4 if llama else 2) * 2.0**-8
    assert ((normed - ref).abs() <= tol * ref.abs().clamp_min(1.0)).all()
    # A kernel that skipped the norm (or its weight) would be far off.
    assert (c.float() - ref).abs().max() > 0.1
    if llama and dtype == torch.bfloat16:       # and the forms differ: the flag reached the kernel
        other = cache.clone()
        mla_kv_write_reference(c, k, pos, freq, other, nw, 1e-6, False)
        assert not torch.equal(other[pos][:, :R], want[pos][:, :R])
    tol_k = 1e-6 if dtype == torch.float32 else 8e-3
    assert (got[pos][:, R:].float() - want[pos][:, R:].float()).abs().max() <= tol_k * 4


@pytest.mark.gpu
@pytest.mark.parametrize("norm", [False, True], ids=["no-norm", "norm"])
@pytest.mark.parametrize("T", [1, 2, 6, 8])
def test_gpu_model_shapes(T, norm):
    # flash-tp4-rank's MLA cache rows (R = 512, P = 64) at context 8192, bf16; the unmarked tests
    # above run on the GPU only when the whole file does (a `-m gpu` run skips them).
    if norm:
        test_kernel_with_the_latent_norm(T, 512, 64, 8192, torch.bfloat16, llama=False)
        test_kernel_with_the_latent_norm(T, 512, 64, 8192, torch.bfloat16, llama=True)
    else:
        test_kernel_matches_reference_and_touches_only_its_rows(T, 512, 64, 8192, torch.bfloat16)


@pytest.mark.parametrize("T,offset", [(1, 0), (1, 3), (6, 0), (6, 2)])
@pytest.mark.parametrize("norm", [False, True], ids=["no-norm", "norm"])
def test_positions_from_a_base(T, offset, norm):
    """positions = a [1] base n with pos_offset o (row t at n + o + t, the relay's chain): the
    kernel writes the same bits as with the explicit [T] positions, and the op (the reference on
    the CPU) the same as the op with [T]; only the target rows change."""
    c, k, _, freq, cache = _case(T, 40, 8, 64, torch.bfloat16, torch.bfloat16, seed=T + offset)
    p0 = 20
    pos = torch.arange(p0, p0 + T, device=DEV)
    base = torch.tensor([p0 - offset], device=DEV)
    nw = (torch.rand(40, generator=torch.Generator().manual_seed(2)) + 0.5).to(torch.bfloat16).to(DEV) if norm else None
    want, got = cache.clone(), cache.clone()
    got[pos] = float("nan")
    mla_kv_write_triton(c, k, pos, freq, want, nw, 1e-6)
    mla_kv_write_triton(c, k, base, freq, got, nw, 1e-6, pos_offset=offset)
    assert torch.equal(got, want)
    a, b = cache.clone(), cache.clone()
    torch.ops.lingc.mla_kv_write(c, k, base, freq, a, nw, 1e-6, pos_offset=offset)
    torch.ops.lingc.mla_kv_write(c, k, pos, freq, b, nw, 1e-6)
    assert torch.equal(a, b) and not torch.equal(a, cache)


@pytest.mark.parametrize("positions,offset,match", [
    ([20, 21], 0, r"with pos_offset=0 positions is the base n, a \[1\] tensor"),
    ([20], -2, "pos_offset must be an int >= 0"),
    ([20], None, r"positions must be a \[T\] = \[2\] tensor, got shape \(1,\)"),
])
def test_bad_positions_raise(positions, offset, match):
    c, k, _, freq, cache = _case(2, 40, 8, 64, torch.float32, torch.float32, seed=1)
    with pytest.raises(ValueError, match=match):
        torch.ops.lingc.mla_kv_write(c, k, torch.tensor(positions, device=DEV), freq, cache, pos_offset=offset)


@pytest.mark.gpu
@pytest.mark.parametrize("T,offset", [(1, 0), (6, 2)])
def test_gpu_positions_from_a_base(T, offset):
    test_positions_from_a_base(T, offset, norm=True)


def test_op_with_the_norm_is_rmsnorm_then_the_write():
    from lingc.runtime.kernels.norms import rmsnorm
    c, k, pos, freq, cache = _case(6, 40, 8, 64, torch.bfloat16, torch.bfloat16, seed=4)
    nw = torch.rand(40, dtype=torch.bfloat16, device=DEV) + 0.5
    a, b = cache.clone(), cache.clone()
    torch.ops.lingc.mla_kv_write(c, k, pos, freq, a, nw, 1e-6)
    torch.ops.lingc.mla_kv_write(rmsnorm(c, nw, None, 1e-6)[0], k, pos, freq, b)
    if DEV == "cpu":
        assert torch.equal(a, b)              # the same reference, bit for bit
    else:
        assert (a.float() - b.float()).abs().max() <= 2 * 2.0**-8 * b.float().abs().max()


def test_op_is_the_model_write_and_traces():
    c, k, pos, freq, cache = _case(6, 40, 8, 64, torch.float32, torch.float32, seed=3)
    a, b = cache.clone(), cache.clone()
    torch.ops.lingc.mla_kv_write(c, k, pos, freq, a)
    mla_kv_write_reference(c, k, pos, freq, b)
    assert not torch.equal(a, cache)
    if DEV == "cpu":
        assert torch.equal(a, b)              # the CPU op is the reference
    else:                                     # the kernel: Triton's cos/sin (module docstring)
        assert torch.equal(a[:, :40], b[:, :40]) and (a - b).abs().max() <= 4e-6

    def f(c, k, pos, freq, cache):
        torch.ops.lingc.mla_kv_write(c, k, pos, freq, cache)
        return cache.sum()
    out = torch.compile(f, backend="aot_eager", fullgraph=True)(c, k, pos, freq, cache.clone())
    assert torch.allclose(out, b.sum())


@pytest.mark.parametrize("bad,match", [
    (lambda a: a.update(k=a["k"][:, :7]), "even to be rotated"),
    (lambda a: a.update(k=a["k"][:, :0]), "must be > 0"),
    (lambda a: a.update(freq=a["freq"].double()), "inv_freq"),
    (lambda a: a.update(pos=a["pos"].float()), "positions"),
    (lambda a: a.update(cache=a["cache"][:, :40]), "R \\+ P"),
    (lambda a: a.update(nw=a["nw"][:8]), "norm_weight must be a contiguous float \\[R\\] = \\[40\\]"),
    (lambda a: a.update(nw=a["nw"].long()), "norm_weight must be a contiguous float"),
    (lambda a: a.update(eps=float("nan")), "eps must be a finite number"),
    (lambda a: a.update(llama=True, nw=a["nw"].double()), "round_before_weight multiplies the rounded row by "
                                                          "norm_weight in c's dtype; got norm_weight torch.float64"),
    (lambda a: a.update(llama=True, nw=None), "round_before_weight is the latent norm's form; pass norm_weight"),
])
def test_bad_arguments_are_named(bad, match):
    c, k, pos, freq, cache = _case(2, 40, 8, 16, torch.float32, torch.float32, seed=1)
    args = dict(c=c, k=k, pos=pos, freq=freq, cache=cache, nw=torch.ones(40, device=DEV), eps=1e-6, llama=False)
    bad(args)
    with pytest.raises(ValueError, match=match):
        torch.ops.lingc.mla_kv_write(args["c"], args["k"], args["pos"], args["freq"], args["cache"], args["nw"],
                                     args["eps"], round_before_weight=args["llama"])


_COMPILE_CHECK = textwrap.dedent("""
    import triton
    from triton.backends.compiler import GPUTarget
    from lingc.runtime.kernels.mla_kv_write.kernel import _mla_kv_write_kernel
    sig = dict(c_ptr="*bf16", k_ptr="*bf16", pos_ptr="*i64", freq_ptr="*fp32", cache_ptr="*bf16", w_ptr="*bf16",
               stride_c="i32", stride_k="i32", stride_l="i32", pos_stride="i32", pos_add="i32", pos_step="i32",
               R="i32", HALF="i32", eps="fp32")
    for norm, llama, rope in ((False, False, True), (True, False, True), (True, True, True), (True, False, False)):
        const = dict(BR=512, BH=32, NORM=norm, USE_GDC=True, ROUND_BEFORE_WEIGHT=llama, ROPE=rope)
        src = triton.compiler.ASTSource(_mla_kv_write_kernel, {**sig, **{k: "constexpr" for k in const}}, const)
        ptx = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=dict(num_warps=4)).asm["ptx"]
        assert "griddepcontrol.wait" in ptx
        # The norm weight, a parameter, is requested before the wait (with inv_freq).
        head = ptx.split("griddepcontrol.wait")[0]
        assert head.count("ld.global") >= (1 if norm else 0) + rope, (norm, rope)
""")


def test_kernel_compiles_for_sm90():
    """The real (not interpreted) Triton compile for an H200 at Ling-3's shapes (R=512, P=64,
    bf16, PDL on), with and without the latent norm: catches what the interpreter accepts and
    the compiler does not."""
    run_sm90_compile_check(_COMPILE_CHECK)
