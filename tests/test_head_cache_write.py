"""lingc::head_cache_write: the Triton kernel (interpreter on the CPU, sm_90 with -m gpu) and the
op against the model's write (RoPE of the key rows, index_copy_ into the cache), over shapes,
pair layouts, strided views and dtypes; only the target rows change, every element of them is
written."""

from __future__ import annotations

import textwrap

import pytest
import torch
from helpers import ROPE_TABLE_LAYOUTS, rope_tables, run_sm90_compile_check

import lingc.runtime.kernels.head_cache_write  # noqa: F401
from lingc.models.layers import rope_inv_freq
from lingc.runtime.kernels.head_cache_write.kernel import head_cache_write_triton
from lingc.runtime.kernels.head_cache_write.naive import head_cache_write_reference, rope_heads_reference

DEV = "cuda" if torch.cuda.is_available() else "cpu"


def _case(T, H, D, R, L, dtype, cache_dtype, seed, head_major=False):
    """rows [T, H, D] as a strided view, positions, inv_freq [R / 2] (None at R = 0), and the
    cache [L, H, D] (with head_major, Hugging Face's [H, L, D] seen through its permuted view)."""
    g = torch.Generator().manual_seed(seed)
    rows = torch.randn(T, H, D + 6, generator=g).to(dtype)[:, :, 3:3 + D]
    pos = torch.randperm(L, generator=g)[:T].sort().values
    freq = rope_inv_freq(R, 10000.0) if R else None
    cache = torch.randn(H, L, D, generator=g).to(cache_dtype).permute(1, 0, 2) if head_major else \
        torch.randn(L, H, D, generator=g).to(cache_dtype)
    return [None if t is None else t.to(DEV) for t in (rows, pos, freq, cache)]


def _hf_rotate_half(x, pos, freq):
    """Hugging Face's Llama / Qwen3-Next form: x * cos + rotate_half(x) * sin on the first R dims."""
    R = 2 * freq.shape[0]
    ang = pos.float()[:, None] * freq[None]
    cos, sin = torch.cat([ang.cos()] * 2, -1)[:, None], torch.cat([ang.sin()] * 2, -1)[:, None]
    r = x[..., :R].float()
    half = torch.cat([-r[..., R // 2:], r[..., :R // 2]], -1)
    return torch.cat([r * cos + half * sin, x[..., R:].float()], -1).to(x.dtype)


@pytest.mark.parametrize("interleaved", [False, True], ids=["rotate-half", "interleaved"])
def test_reference_rope_is_the_models(interleaved):
    """rope_heads_reference against Hugging Face's rotate_half and MLA's interleaved rope, full
    and partial."""
    from lingc.models.layers import apply_rope_interleaved
    g = torch.Generator().manual_seed(5)
    x, pos = torch.randn(4, 3, 32, generator=g), torch.tensor([0, 9, 100, 4000])
    for R in (8, 32):
        freq = rope_inv_freq(R, 10000.0)
        got = rope_heads_reference(x, pos, freq, interleaved)
        want = torch.cat([apply_rope_interleaved(x[..., :R], pos, freq), x[..., R:]], -1) if interleaved \
            else _hf_rotate_half(x, pos, freq)
        assert torch.allclose(got, want, atol=1e-6, rtol=0) and torch.equal(got[..., R:], x[..., R:])


@pytest.mark.parametrize("T,H,D,R,L", [(1, 1, 256, 64, 64), (6, 2, 128, 128, 40), (3, 4, 48, 16, 300),
                                       (8, 3, 20, 0, 17), (2, 1, 6, 2, 9)])
@pytest.mark.parametrize("dtype,cache_dtype", [(torch.float32, torch.float32), (torch.bfloat16, torch.bfloat16),
                                               (torch.float32, torch.bfloat16)])
@pytest.mark.parametrize("interleaved", [False, True], ids=["rotate-half", "interleaved"])
@pytest.mark.parametrize("head_major", [False, True], ids=["lh", "hl"])
def test_kernel_matches_reference_and_touches_only_its_rows(T, H, D, R, L, dtype, cache_dtype, interleaved, head_major):
    if R == 0 and interleaved:
        pytest.skip("no rotated dims: the pair layout does not enter")
    rows, pos, freq, cache = _case(T, H, D, R, L, dtype, cache_dtype, T * 100 + D, head_major)
    want = cache.clone()
    head_cache_write_reference(rows, pos, want, freq, interleaved)
    got = cache.clone()
    got[pos] = float("nan")                          # every element of the target rows is written
    head_cache_write_triton(rows, pos, got, freq, interleaved)
    assert not got.isnan().any()
    keep = torch.ones(L, dtype=torch.bool, device=cache.device)
    keep[pos] = False
    assert torch.equal(got[keep], cache[keep])
    if DEV == "cpu" and dtype != cache_dtype:    # the interpreter's fp32 -> bf16 cast truncates
        torch.testing.assert_close(got[pos][..., R:].float(), want[pos][..., R:].float(), rtol=8e-3, atol=0)
    else:
        assert torch.equal(got[pos][..., R:], want[pos][..., R:])     # past the rope dims: copied exactly
    # Triton's cos / sin against torch's: a last bit in fp32, one rounding step of the row's dtype.
    step = 1e-6 if dtype == cache_dtype == torch.float32 else 2.0**-7
    assert (got[pos].float() - want[pos].float()).abs().max() <= 4 * step * max(1.0, rows.abs().max().item())


@pytest.mark.parametrize("T,offset", [(1, 0), (1, 3), (6, 0), (6, 2)])
def test_positions_from_a_base(T, offset):
    """positions = a [1] base n with pos_offset o (row t at n + o + t, the relay's chain): the
    same bits as the explicit [T] positions, kernel and op."""
    rows, _, freq, cache = _case(T, 2, 64, 32, 64, torch.bfloat16, torch.bfloat16, seed=T + offset)
    pos = torch.arange(20, 20 + T, device=DEV)
    base = torch.tensor([20 - offset], device=DEV)
    want, got = cache.clone(), cache.clone()
    got[pos] = float("nan")
    head_cache_write_triton(rows, pos, want, freq)
    head_cache_write_triton(rows, base, got, freq, pos_offset=offset)
    assert torch.equal(got, want)
    a, b = cache.clone(), cache.clone()
    torch.ops.lingc.head_cache_write(rows, base, a, freq, pos_offset=offset)
    torch.ops.lingc.head_cache_write(rows, pos, b, freq)
    assert torch.equal(a, b) and not torch.equal(a, cache)


def test_op_is_the_model_write_and_traces():
    rows, pos, freq, cache = _case(6, 2, 64, 32, 64, torch.float32, torch.float32, seed=3)
    a, b = cache.clone(), cache.clone()
    torch.ops.lingc.head_cache_write(rows, pos, a, freq)
    b[pos] = _hf_rotate_half(rows, pos, freq)               # the model's own ops
    assert not torch.equal(a, cache)
    assert (a - b).abs().max() <= 4e-6

    def f(rows, pos, cache, freq):
        torch.ops.lingc.head_cache_write(rows, pos, cache, freq)
        return cache.sum()
    out = torch.compile(f, backend="aot_eager", fullgraph=True)(rows, pos, cache.clone(), freq)
    assert torch.allclose(out, b.sum())


class ZeroCenteredNorm(torch.nn.Module):
    """Qwen3-Next's Qwen3NextRMSNorm in its own spelling (gain 1 + w, fp32, rounded once)."""

    def __init__(self, w, eps):
        super().__init__()
        self.w, self.eps = w, eps

    def forward(self, x):
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps) * (1.0 + self.w.float())).to(x.dtype)


NORM_FORMS = {"default": dict(), "zero-centered": dict(zero_centered=True), "llama": dict(round_before_weight=True)}


@pytest.mark.parametrize("form", list(NORM_FORMS))
@pytest.mark.parametrize("T,H,D,R,dtype", [(1, 1, 256, 64, torch.bfloat16), (6, 2, 48, 16, torch.float32),
                                           (3, 3, 20, 20, torch.bfloat16), (2, 2, 32, 0, torch.bfloat16)])
def test_the_head_norm_before_the_write(form, T, H, D, R, dtype):
    """norm_weight: each row RMS-normed first (a key's k_norm folded in), in lingc.rmsnorm's forms;
    the reference is lingc.rmsnorm's on the [T * H, D] rows (and Qwen3-Next's own norm for the
    zero-centred form), the kernel within a rounding step of it, every target element written."""
    from lingc.runtime.kernels.norms.naive import rmsnorm_reference

    kw = NORM_FORMS[form]
    rows, pos, freq, cache = _case(T, H, D, R, 40, dtype, dtype, seed=T * 7 + D)
    w = (torch.rand(D, generator=torch.Generator().manual_seed(D)) + 0.5).to(dtype).to(DEV)
    want = cache.clone()
    head_cache_write_reference(rows, pos, want, freq, False, w, 1e-6, **kw)
    normed = rmsnorm_reference(rows.reshape(T * H, D), w, None, 1e-6, **kw)[0].view(T, H, D)
    if form == "zero-centered":
        assert torch.equal(normed, ZeroCenteredNorm(w, 1e-6)(rows))
    plain = cache.clone()
    head_cache_write_reference(normed, pos, plain, freq)
    assert torch.equal(want, plain)                                    # norm, then the write as before
    got = cache.clone()
    got[pos] = float("nan")
    head_cache_write_triton(rows, pos, got, freq, False, None, w, 1e-6, **kw)
    assert not got.isnan().any()
    step = 1e-6 if dtype == torch.float32 else 2.0**-7
    assert (got[pos].float() - want[pos].float()).abs().max() <= 4 * step * max(1.0, want.abs().max().item())
    op = cache.clone()
    torch.ops.lingc.head_cache_write(rows, pos, op, freq, norm_weight=w, eps=1e-6, **kw)
    if DEV == "cpu":
        assert torch.equal(op, want)


@pytest.mark.parametrize("bad,match", [
    (dict(norm_weight=torch.ones(32)), r"norm_weight must be a contiguous float \[head_dim\] = \(64,\)"),
    (dict(norm_weight=torch.ones(64), eps=-1.0), "eps must be a finite number >= 0"),
    (dict(norm_weight=torch.ones(64, dtype=torch.bfloat16), round_before_weight=True),
     "round_before_weight .* weight torch.bfloat16"),
    (dict(zero_centered=True), "forms of the head norm; norm_weight is None"),
])
def test_bad_norm_arguments_are_named(bad, match):
    rows, pos, freq, cache = _case(2, 2, 64, 32, 16, torch.float32, torch.float32, seed=1)
    bad = {k: v.to(DEV) if torch.is_tensor(v) else v for k, v in bad.items()}
    with pytest.raises(ValueError, match=match):
        torch.ops.lingc.head_cache_write(rows, pos, cache, freq, **bad)


@pytest.mark.parametrize("bad,match", [
    (lambda a: a.update(rows=a["rows"][:, :, :8]), r"cache rows are \[heads, head_dim\] = \(2, 64\)"),
    (lambda a: a.update(rows=a["rows"][0]), "must be 3-d"),
    (lambda a: a.update(freq=torch.ones(40, device=DEV)), "rope_dims <= the head dim 64"),
    (lambda a: a.update(freq=a["freq"].double()), "inv_freq must be a contiguous float"),
    (lambda a: a.update(pos=a["pos"].float()), "positions must be int32 or int64"),
    (lambda a: a.update(pos=a["pos"][:1]), r"positions must be a \[T\] = \[2\] tensor"),
    (lambda a: a.update(cache=a["cache"].transpose(1, 2)), r"cache rows are|unit stride"),
    (lambda a: a.update(rows=a["rows"].long()), "must be float32, bfloat16 or float16"),
])
def test_bad_arguments_are_named(bad, match):
    rows, pos, freq, cache = _case(2, 2, 64, 32, 16, torch.float32, torch.float32, seed=1)
    args = dict(rows=rows, pos=pos, freq=freq, cache=cache, inter=False)
    bad(args)
    with pytest.raises(ValueError, match=match):
        torch.ops.lingc.head_cache_write(args["rows"], args["pos"], args["cache"], args["freq"], args["inter"])




@pytest.mark.parametrize("layout", ROPE_TABLE_LAYOUTS)
@pytest.mark.parametrize("interleaved", [False, True], ids=["rotate-half", "interleaved"])
def test_reference_tables_of_angles_are_the_inv_freq_rope(layout, interleaved):
    """Tables holding the angles' cos and sin, in every layout, rotate as inv_freq does; the
    per-column table is Hugging Face's x * cos + rotate_half(x) * sin with its own rows."""
    from lingc.runtime.kernels.head_cache_write.naive import rope_heads_table_reference, rope_table_rows

    g = torch.Generator().manual_seed(7)
    x, pos, R = torch.randn(4, 3, 32, generator=g), torch.tensor([0, 9, 100, 300]), 16
    cos, sin = rope_tables(layout, 400, R, g, "angles", interleaved)
    got = rope_heads_table_reference(x, rope_table_rows(cos, pos, False), rope_table_rows(sin, pos, False), R,
                                     interleaved)
    want = rope_heads_reference(x, pos, rope_inv_freq(R, 10000.0), interleaved)
    assert torch.allclose(got, want, atol=1e-6, rtol=0) and torch.equal(got[..., R:], x[..., R:])
    if layout == "column" and not interleaved:
        c, s = cos[pos][:, None], sin[pos][:, None]
        r = x[..., :R]
        hf = torch.cat([r * c + torch.cat([-r[..., R // 2:], r[..., :R // 2]], -1) * s, x[..., R:]], -1)
        assert torch.allclose(got, hf, atol=1e-6, rtol=0)


@pytest.mark.parametrize("layout", ROPE_TABLE_LAYOUTS)
@pytest.mark.parametrize("by_token", [False, True], ids=["by-position", "by-token"])
@pytest.mark.parametrize("interleaved", [False, True], ids=["rotate-half", "interleaved"])
@pytest.mark.parametrize("T,H,D,R,dtype", [(1, 1, 256, 64, torch.bfloat16), (6, 2, 48, 16, torch.float32),
                                           (3, 3, 20, 20, torch.bfloat16)])
def test_kernel_rope_tables_match_reference(layout, by_token, interleaved, T, H, D, R, dtype):
    """The angles' cos and sin from tables (random values, strided views of every layout), read at
    each token's position or, by token, at its index: kernel against the reference, every target
    element written, only the target rows touched; the op (CPU: the reference) the same."""
    g = torch.Generator().manual_seed(T * 31 + D + by_token)
    rows, pos, _, cache = _case(T, H, D, R, 40, dtype, dtype, seed=T * 13 + D)
    cos, sin = (t.to(dtype).to(DEV) for t in rope_tables(layout, T if by_token else 40, R, g))
    table = dict(rope_cos=cos, rope_sin=sin, rope_dims=R, rope_by_token=by_token)
    want = cache.clone()
    head_cache_write_reference(rows, pos, want, None, interleaved, **table)
    got = cache.clone()
    got[pos] = float("nan")
    head_cache_write_triton(rows, pos, got, None, interleaved, **table)
    assert not got.isnan().any()
    keep = torch.ones(40, dtype=torch.bool, device=cache.device)
    keep[pos] = False
    assert torch.equal(got[keep], cache[keep]) and torch.equal(got[pos][..., R:], want[pos][..., R:])
    step = 1e-6 if dtype == torch.float32 else 2.0**-7
    big = max(1.0, rows.abs().max().item() * max(cos.abs().max().item(), sin.abs().max().item()))
    assert (got[pos].float() - want[pos].float()).abs().max() <= 8 * step * big
    op = cache.clone()
    torch.ops.lingc.head_cache_write(rows, pos, op, None, interleaved, **table)
    if DEV == "cpu":
        assert torch.equal(op, want)
    other = cache.clone()                         # the tables are read, not assumed: other rows, other bits
    head_cache_write_reference(rows, pos, other, None, interleaved, rope_cos=sin, rope_sin=cos, rope_dims=R,
                               rope_by_token=by_token)
    assert not torch.equal(other, want)


@pytest.mark.parametrize("bad,match", [
    (dict(rope_cos=torch.ones(40, 16)), "give both rope_cos and rope_sin or neither"),
    (dict(rope_cos=torch.ones(40, 16), rope_sin=torch.ones(40, 16), rope_dims=32, inv_freq=True),
     "rope tables and inv_freq are two ways"),
    (dict(rope_cos=torch.ones(40, 16), rope_sin=torch.ones(40, 16), rope_dims=15), "rope_dims must be even in 2..head_dim 64"),
    (dict(rope_cos=torch.ones(40, 16), rope_sin=torch.ones(40, 16), rope_dims=128), "rope_dims must be even"),
    (dict(rope_cos=torch.ones(40, 12), rope_sin=torch.ones(40, 12), rope_dims=32), "hold 12 values a row; rope_dims = 32"),
    (dict(rope_cos=torch.ones(40, 16), rope_sin=torch.ones(40, 8), rope_dims=32), r"rope_cos \(40, 16\) and rope_sin"),
    (dict(rope_cos=torch.ones(40), rope_sin=torch.ones(40), rope_dims=32), "must be a float \\[rows"),
    (dict(rope_cos=torch.ones(1, 16), rope_sin=torch.ones(1, 16), rope_dims=32, rope_by_token=True),
     r"per-token rope rows \(1\) for T = 2"),
    (dict(rope_dims=32), "rope_dims / rope_by_token describe the rope tables"),
])
def test_bad_rope_tables_are_named(bad, match):
    rows, pos, freq, cache = _case(2, 2, 64, 32, 40, torch.float32, torch.float32, seed=1)
    bad = {k: v.to(DEV) if torch.is_tensor(v) else v for k, v in bad.items()}
    f = freq if bad.pop("inv_freq", False) else None
    with pytest.raises(ValueError, match=match):
        torch.ops.lingc.head_cache_write(rows, pos, cache, f, **bad)


@pytest.mark.gpu
@pytest.mark.parametrize("T", [1, 6])
@pytest.mark.parametrize("head_major", [False, True], ids=["lh", "hl"])
def test_gpu_qwen3_next_rank_shapes(T, head_major):
    """A Qwen3-Next tensor-parallel rank's key rows (1 head of 256, 64 rotated dims, rotate-half)
    and a Llama rank's (8 heads of 128, all rotated), bf16, into a 65536-row cache."""
    for H, D, R in ((1, 256, 64), (8, 128, 128)):
        rows, pos, freq, cache = _case(T, H, D, R, 65536, torch.bfloat16, torch.bfloat16, 7 + T, head_major)
        want, got = cache.clone(), cache.clone()
        head_cache_write_reference(rows, pos, want, freq)
        got[pos] = float("nan")
        torch.ops.lingc.head_cache_write(rows, pos, got, freq)
        assert not got.isnan().any() and (got.float() - want.float()).abs().max() <= 4 * 2.0**-7 * 4


_COMPILE_CHECK = textwrap.dedent("""
    import triton
    from triton.backends.compiler import GPUTarget
    from lingc.runtime.kernels.head_cache_write.kernel import _head_cache_write_kernel
    sig = dict(x_ptr="*bf16", pos_ptr="*i64", freq_ptr="*fp32", cache_ptr="*bf16", w_ptr="*bf16", stride_xt="i32",
               stride_xh="i32", stride_cl="i32", stride_ch="i32", pos_stride="i32", pos_add="i32", pos_step="i32",
               D="i32", eps="fp32", cos_ptr="*bf16", sin_ptr="*bf16", stride_cr="i32", stride_cc="i32",
               stride_sr="i32", stride_sc="i32")
    for half, inter, norm, table in ((32, False, False, 0), (32, True, False, 0), (0, False, False, 0),
                                     (32, False, True, 0), (32, False, False, 1), (32, True, True, 2)):
        const = dict(BD=256, HALF=half, INTERLEAVED=inter, USE_GDC=True, NORM=norm, ZERO_CENTERED=norm, TABLE=table,
                     BY_TOKEN=False)
        src = triton.compiler.ASTSource(_head_cache_write_kernel, {**sig, **{k: "constexpr" for k in const}}, const)
        ptx = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=dict(num_warps=2)).asm["ptx"]
        assert "griddepcontrol.wait" in ptx
        # inv_freq, a constant, is requested before the wait (a table's rows, after it).
        head = ptx.split("griddepcontrol.wait")[0]
        assert head.count("ld.global") >= (1 if half and not table else 0) + (2 if norm else 0), half  # norm weight too
""")


def test_kernel_compiles_for_sm90():
    """The real (not interpreted) Triton compile for an H200 at a Qwen3-Next rank's key rows (one
    head of 256, 64 rotated dims), both pair layouts and none, with its zero-centred k_norm, and
    with the angles from rope tables (a value per pair, per column)."""
    run_sm90_compile_check(_COMPILE_CHECK)
