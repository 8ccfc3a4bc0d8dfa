"""GQA decode attention (torch.ops.lingc.gqa_decode): the split-K Triton kernel (mla_decode's
combine) vs the plain-PyTorch reference over group sizes (MHA, GQA, MQA), head widths, contexts
that cross split and tile boundaries, verify chains with the causal mask inside; batch invariance
in T, positions from a base, strided queries, the fake impl and argument checks.

On the CPU the kernels run under TRITON_INTERPRET=1 (conftest.py) with small splits; with CUDA
the same tests run on the GPU and the ``gpu``-marked ones add Qwen3-Next TP4-rank shapes (16 query
heads over 2 key/value heads of 256 dims: 4 over 1 a rank) at contexts 8192 and 65536.

Cache rows past the last query position hold large random values (NaN where no reference is
compared), never zeros, so a mask that lets one through shows; the output and the split workspace
are NaN-poisoned, so an element left unwritten shows.
"""
import textwrap

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from helpers import ROPE_TABLE_LAYOUTS, assert_close, captured_replay, rope_tables, run_sm90_compile_check
from lingc.runtime.kernels.gqa_decode import gqa_decode, gqa_decode_reference
from lingc.runtime.kernels.gqa_decode.kernel import (
    GqaDecodeConfig,
    config_for,
    gqa_decode_triton,
    num_splits,
    workspace,
)
from lingc.runtime.pdl import pdl_supported

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
RTOL = {torch.float32: 2e-6 if DEVICE == "cpu" else 1e-5, torch.bfloat16: 5e-5, torch.float16: 5e-6}
SPLIT32 = GqaDecodeConfig(split_len=32, block_l=16)
SPLIT16 = GqaDecodeConfig(split_len=16, block_l=16)
SPLIT32_H32 = GqaDecodeConfig(split_len=32, block_l=16, block_h=32)


def make_inputs(T, L, positions, kv_dtype, seed, heads=(4, 2), dims=(32, 32), q_dtype=None, garbage=100.0,
                device=DEVICE):
    """q [T, HQ, D], caches whose rows past max(positions) are large junk, positions [T]."""
    gen = torch.Generator().manual_seed(seed)
    (hq, hkv), (d, dv) = heads, dims

    def r(*shape, scale=1.0):
        return torch.randn(*shape, generator=gen) * scale

    k, v = r(L, hkv, d), r(L, hkv, dv)
    hi = int(max(positions)) + 1
    k[hi:], v[hi:] = r(L - hi, hkv, d, scale=garbage), r(L - hi, hkv, dv, scale=garbage)
    x = dict(q=r(T, hq, d).to(q_dtype or kv_dtype), k=k.to(kv_dtype), v=v.to(kv_dtype),
             positions=torch.tensor(positions, dtype=torch.int64))
    return {n: t.to(device) for n, t in x.items()}


def args(x):
    return x["q"], x["k"], x["v"], x["positions"], x["q"].shape[-1] ** -0.5


def cpu(a):
    return tuple(t.cpu() if torch.is_tensor(t) else t for t in a)


def run_kernel(a, config=SPLIT32, pos_offset=None, inv_freq=None, interleaved=False, gate=None,
               out_dtype=torch.float32, **norm):
    """The launcher with a NaN-poisoned output and split workspace."""
    q, v = a[0], a[2]
    T, HQ, _ = q.shape
    L, HKV, DV = v.shape
    cfg = config or config_for(L, HQ, HKV, q.shape[2], DV)
    out = torch.full((T, HQ, DV), float("nan"), device=q.device, dtype=out_dtype)
    parts = tuple(t.fill_(float("nan")) for t in workspace(T, HQ, DV, num_splits(L, cfg), q.device))
    return gqa_decode_triton(*a, out=out, config=cfg, partials=parts, pos_offset=pos_offset, inv_freq=inv_freq,
                             interleaved=interleaved, gate=gate, **norm)


def chain(p0, T):
    return list(range(p0, p0 + T))


CASES = [
    # (T, L, first position, config): a context ending mid-tile, on a split boundary, one past it,
    # the first token (row 0 only), chains straddling a split boundary, the default config.
    (1, 37, 36, SPLIT32),
    (1, 100, 63, SPLIT32),
    (1, 100, 64, SPLIT32),
    (1, 40, 0, SPLIT16),
    (3, 100, 30, SPLIT32),
    (6, 50, 44, SPLIT16),
    (8, 300, 200, None),
    (6, 100, 27, SPLIT32_H32),     # a 32-row query tile: 8 queries of a 4-head group per program
    (12, 100, 70, SPLIT32_H32),
]
GROUPS = [((4, 2), (32, 32)), ((4, 4), (16, 24)), ((6, 1), (24, 24)), ((8, 2), (64, 48))]


@pytest.mark.parametrize("kv_dtype", [torch.float32, torch.bfloat16, torch.float16], ids=["fp32", "bf16", "fp16"])
@pytest.mark.parametrize("T,L,p0,config", CASES, ids=[f"T{c[0]}-L{c[1]}-p{c[2]}" for c in CASES])
def test_kernel_matches_reference(T, L, p0, config, kv_dtype):
    x = make_inputs(T, L, chain(p0, T), kv_dtype, seed=T * 1000 + L + p0)
    assert_close(run_kernel(args(x), config), gqa_decode_reference(*cpu(args(x))), RTOL[kv_dtype])


@pytest.mark.parametrize("q_dtype", [torch.bfloat16, torch.float32], ids=["q-bf16", "q-fp32"])
@pytest.mark.parametrize("heads,dims", GROUPS, ids=["gqa2", "mha-dv24", "mqa6", "gqa4-dv48"])
@pytest.mark.parametrize("T,p0", [(1, 70), (6, 30)])
def test_kernel_group_sizes_and_head_widths(heads, dims, q_dtype, T, p0):
    """MHA (G = 1), GQA (2 and 4), MQA with 6 query heads (a group padded to 8 rows), value heads
    narrower or wider than key heads, widths that are not powers of two; a bf16 cache with the
    model's bf16 query, and an fp32 query split into hi + lo halves."""
    x = make_inputs(T, 100, chain(p0, T), torch.bfloat16, seed=sum(heads) * 100 + dims[1] + T, heads=heads,
                    dims=dims, q_dtype=q_dtype)
    assert_close(run_kernel(args(x)), gqa_decode_reference(*cpu(args(x))), RTOL[torch.bfloat16])


@pytest.mark.parametrize("window", [1, 5, 20, 200])
@pytest.mark.parametrize("T,L,p0,config", [(1, 100, 63, SPLIT32), (6, 100, 40, SPLIT16), (8, 300, 200, None)])
def test_kernel_sliding_window(T, L, p0, config, window):
    """A sliding window (query t sees positions[t] - window + 1 .. positions[t]): one row, a window
    inside one split, across splits (splits before a query's window store an empty partial), and
    wider than the context (the causal mask alone); rows before the window hold NaN."""
    x = make_inputs(T, L, chain(p0, T), torch.bfloat16, seed=window * 7 + T, heads=(4, 2))
    q, k, v, pos, scale = args(x)
    want = gqa_decode_reference(*cpu(args(x)), window=window)
    lo = max(0, p0 - window + 1)
    k[:lo], v[:lo] = float("nan"), float("nan")
    out = torch.full((T, 4, 32), float("nan"), device=DEVICE)
    cfg = config or config_for(L, 4, 2, 32, 32)
    parts = tuple(t.fill_(float("nan")) for t in workspace(T, 4, 32, num_splits(L, cfg), DEVICE))
    got = gqa_decode_triton(q, k, v, pos, scale, out=out, config=cfg, partials=parts, window=window)
    assert_close(got, want, RTOL[torch.bfloat16])


def test_kernel_never_reads_rows_past_the_chain():
    """NaN in every cache row past the chain's last position (the rows of later steps): the output
    is finite and the same bits as with finite junk there."""
    x = make_inputs(6, 64, chain(20, 6), torch.bfloat16, seed=5, heads=(8, 2))
    finite = run_kernel(args(x))
    x["k"][26:], x["v"][26:] = float("nan"), float("nan")
    assert torch.equal(run_kernel(args(x)), finite)


@pytest.mark.parametrize("kv_dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_kernel_batch_invariant_in_T(kv_dtype):
    """Each query of a verify chain: the same bits as that position decoded alone (T = 1)."""
    x = make_inputs(6, 100, chain(40, 6), kv_dtype, seed=11, heads=(8, 2))
    whole = run_kernel(args(x))
    for t in range(6):
        q, k, v, pos, scale = args(x)
        assert torch.equal(whole[t:t + 1], run_kernel((q[t:t + 1], k, v, pos[t:t + 1], scale)))


@pytest.mark.parametrize("T,p0,offset", [(1, 36, 0), (6, 27, 2)])
def test_kernel_positions_from_a_base(T, p0, offset):
    """positions = a [1] base n with pos_offset o (query t at n + o + t, the relay's chain): the
    same bits as the explicit [T] positions (the split's mask, the combine's split count)."""
    x = make_inputs(T, 100, chain(p0, T), torch.bfloat16, seed=T * 31 + p0)
    explicit = run_kernel(args(x), SPLIT16)
    q, k, v, _, scale = args(x)
    base = torch.tensor([p0 - offset], dtype=torch.int64, device=DEVICE)
    assert torch.equal(run_kernel((q, k, v, base, scale), SPLIT16, pos_offset=offset), explicit)


def test_kernel_strided_queries_and_caches():
    """int32 positions; q a view of a [T, HQ, D + extra] projection; the caches views of one
    [L, HKV, D + DV] buffer (keys and values side by side) of a two-sequence pool."""
    x = make_inputs(3, 60, chain(40, 3), torch.bfloat16, seed=9)
    q = torch.randn(3, 4, 40, device=DEVICE).to(torch.bfloat16)[..., 8:]
    pool = torch.randn(2, 60, 2, 64, device=DEVICE).to(torch.bfloat16)
    pool[1, :, :, :32], pool[1, :, :, 32:] = x["k"], x["v"]
    a = (q, pool[1, :, :, :32], pool[1, :, :, 32:], x["positions"].to(torch.int32), 32 ** -0.5)
    assert not q.is_contiguous() and not a[1].is_contiguous()
    assert_close(run_kernel(a), gqa_decode_reference(*cpu(a)), RTOL[torch.bfloat16])


ROPE_CASES = [(1, 100, 63, 32, (4, 2), (32, 32)), (6, 50, 44, 8, (6, 1), (24, 24)), (3, 100, 30, 64, (8, 2), (64, 48))]


@pytest.mark.parametrize("interleaved", [False, True], ids=["rotate-half", "interleaved"])
@pytest.mark.parametrize("q_dtype,kv_dtype", [(torch.bfloat16, torch.bfloat16), (torch.float32, torch.float32),
                                              (torch.float32, torch.bfloat16)], ids=["bf16", "fp32", "q-fp32"])
@pytest.mark.parametrize("T,L,p0,R,heads,dims", ROPE_CASES, ids=[f"T{c[0]}-R{c[3]}-D{c[5][0]}" for c in ROPE_CASES])
def test_kernel_rope_on_queries(T, L, p0, R, heads, dims, q_dtype, kv_dtype, interleaved):
    """inv_freq given: the queries' RoPE (full or partial, either pair layout) folded into the
    query load equals the reference on the rotated queries, and that reference is gqa_decode's
    on queries rotated beforehand."""
    from lingc.models.layers import rope_inv_freq
    from lingc.runtime.kernels.head_cache_write.naive import rope_heads_reference
    x = make_inputs(T, L, chain(p0, T), kv_dtype, seed=T * 7 + R, heads=heads, dims=dims, q_dtype=q_dtype)
    freq = rope_inv_freq(R, 10000.0).to(DEVICE)
    want = gqa_decode_reference(*cpu(args(x)), inv_freq=freq.cpu(), interleaved=interleaved)
    q, k, v, pos, scale = cpu(args(x))
    assert torch.equal(want, gqa_decode_reference(rope_heads_reference(q, pos, freq.cpu(), interleaved), k, v, pos,
                                                  scale))
    assert not torch.allclose(want, gqa_decode_reference(q, k, v, pos, scale), atol=1e-3)   # the RoPE matters
    got = run_kernel(args(x), inv_freq=freq, interleaved=interleaved)
    # Triton's cos / sin against torch's: a last bit before the queries' rounding (bf16: one step).
    assert_close(got, want, RTOL[kv_dtype] if q_dtype == torch.float32 else 2e-2)
    one = run_kernel((x["q"][-1:], x["k"], x["v"], x["positions"][-1:], dims[0] ** -0.5), inv_freq=freq,
                     interleaved=interleaved)
    assert torch.equal(one, got[-1:]), "batch invariance in T"
    base = torch.tensor([p0 - 1], dtype=torch.int64, device=DEVICE)
    assert torch.equal(run_kernel((*args(x)[:3], base, args(x)[4]), pos_offset=1, inv_freq=freq,
                                  interleaved=interleaved), got)


NORM_FORMS = {"default": dict(), "zero-centered": dict(zero_centered=True), "llama": dict(round_before_weight=True)}


@pytest.mark.parametrize("form", list(NORM_FORMS))
@pytest.mark.parametrize("q_dtype", [torch.bfloat16, torch.float32], ids=["q-bf16", "q-fp32"])
@pytest.mark.parametrize("T,L,p0,R,heads,dims", ROPE_CASES[:2], ids=[f"T{c[0]}-R{c[3]}" for c in ROPE_CASES[:2]])
def test_kernel_query_head_norm(T, L, p0, R, heads, dims, q_dtype, form):
    """norm_weight: each query head RMS-normed in the query load (Qwen3-Next's q_norm folded in),
    before its RoPE; the reference is gqa_decode's on queries normed by lingc.rmsnorm's reference
    beforehand, the kernel within a rounding step of the queries, batch-invariant in T."""
    from lingc.models.layers import rope_inv_freq
    from lingc.runtime.kernels.head_cache_write.naive import heads_rmsnorm_reference
    kw = dict(NORM_FORMS[form], eps=1e-6)
    x = make_inputs(T, L, chain(p0, T), torch.bfloat16, seed=T * 5 + R, heads=heads, dims=dims, q_dtype=q_dtype)
    x["q"] = x["q"] * 3.0                                        # rows not already of unit RMS
    w = (torch.rand(dims[0], generator=torch.Generator().manual_seed(9)) + 0.5).to(q_dtype).to(DEVICE)
    freq = rope_inv_freq(R, 10000.0).to(DEVICE)
    q, k, v, pos, scale = cpu(args(x))
    want = gqa_decode_reference(q, k, v, pos, scale, inv_freq=freq.cpu(), norm_weight=w.cpu(), **kw)
    assert torch.equal(want, gqa_decode_reference(heads_rmsnorm_reference(q, w.cpu(), **kw), k, v, pos, scale,
                                                  inv_freq=freq.cpu()))
    got = run_kernel(args(x), inv_freq=freq, norm_weight=w, **kw)
    assert not got.isnan().any()
    assert_close(got, want, RTOL[torch.bfloat16] if q_dtype == torch.float32 else 2e-2)     # bf16 caches
    one = run_kernel((x["q"][-1:], x["k"], x["v"], x["positions"][-1:], dims[0] ** -0.5), inv_freq=freq,
                     norm_weight=w, **kw)
    assert torch.equal(one, got[-1:]), "batch invariance in T"
    if DEVICE == "cpu":
        assert torch.equal(torch.ops.lingc.gqa_decode(*args(x), inv_freq=freq, norm_weight=w, **kw), want)


@pytest.mark.parametrize("gate_dtype", [torch.bfloat16, torch.float32], ids=["gate-bf16", "gate-fp32"])
@pytest.mark.parametrize("T,p0,heads,dims", [(1, 63, (4, 2), (32, 32)), (6, 44, (6, 1), (24, 40))])
def test_kernel_output_gate(T, p0, heads, dims, gate_dtype):
    """gate [T, HQ, DV] (Qwen3-Next's output gate, a strided view): every output element times
    sigmoid(its gate), in the combine; the reference's gate is the ungated output times it."""
    x = make_inputs(T, 100, chain(p0, T), torch.bfloat16, seed=T + p0, heads=heads, dims=dims)
    g = (torch.randn(T, heads[0], dims[1] + 5, generator=torch.Generator().manual_seed(1)) * 3).to(gate_dtype)
    gate = g.to(DEVICE)[..., 2:2 + dims[1]]
    want = gqa_decode_reference(*cpu(args(x)), gate=gate.cpu())
    assert torch.equal(want, gqa_decode_reference(*cpu(args(x))) * torch.sigmoid(gate.cpu().float()))
    assert_close(run_kernel(args(x), gate=gate), want, RTOL[torch.bfloat16])


@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("T,p0,heads,dims", [(1, 63, (4, 2), (32, 32)), (6, 44, (6, 1), (24, 40))])
def test_kernel_16bit_output(T, p0, heads, dims, out_dtype):
    """A 16-bit output (the op's out_dtype): the fp32 output rounded once by the combine's store,
    to nearest on a GPU (bitwise the fp32 output's torch cast; the interpreter truncates: within
    one unit of the last place), gated or not; every element written over a NaN-poisoned output."""
    x = make_inputs(T, 100, chain(p0, T), torch.bfloat16, seed=T + p0 + 7, heads=heads, dims=dims)
    gate = (torch.randn(T, heads[0], dims[1], generator=torch.Generator().manual_seed(2)) * 3).to(DEVICE)
    for g in (None, gate):
        wide = run_kernel(args(x), gate=g)
        got = run_kernel(args(x), gate=g, out_dtype=out_dtype)
        assert got.dtype == out_dtype and not got.isnan().any()
        if DEVICE == "cuda":
            assert torch.equal(got, wide.to(out_dtype))
        else:
            fi = torch.finfo(out_dtype)               # a unit of the last place (subnormals' too)
            assert ((got.float() - wide).abs() <= fi.eps * (wide.abs() + fi.smallest_normal)).all()
        assert_close(wide, gqa_decode_reference(*cpu(args(x)), gate=None if g is None else g.cpu()),
                     RTOL[torch.bfloat16])
    o = torch.ops.lingc.gqa_decode(*args(x), gate=gate, out_dtype=out_dtype)     # the op (its own config)
    want = gqa_decode_reference(*cpu(args(x)), gate=gate.cpu())
    assert o.dtype == out_dtype
    if DEVICE == "cpu":
        assert torch.equal(o, want.to(out_dtype))                           # the reference, cast
    else:
        assert_close(o.float().cpu(), want, 5e-3)


def test_config_rule():
    # ~128 programs at T = 1 (splits x key/value heads), whole 64-row tiles, never below 128 rows.
    assert config_for(8192, 4, 1, 256, 256).split_len == 128          # MIN_SPLIT_LEN (session 54's sweep)
    assert config_for(65536, 4, 1, 256, 256).split_len == 512
    assert config_for(65536, 32, 8, 128, 128).split_len == 4096
    assert config_for(100, 4, 2, 64, 64).split_len == 128
    assert config_for(8192, 4, 1, 256, 256).num_warps == 8 and config_for(8192, 4, 1, 128, 128).num_warps == 4
    with pytest.raises(ValueError, match="split_len = 40 must be a multiple of block_l = 16"):
        GqaDecodeConfig(split_len=40, block_l=16)


def test_op_dispatch_fake_and_compile():
    x = make_inputs(6, 48, chain(40, 6), torch.bfloat16, seed=41, device="cpu", heads=(8, 2))
    a = args(x)
    assert torch.equal(torch.ops.lingc.gqa_decode(*a), gqa_decode_reference(*a))
    assert "!" not in str(torch.ops.lingc.gqa_decode.default._schema), "the op mutates nothing"
    base = torch.tensor([38])
    assert torch.equal(gqa_decode(a[0], a[1], a[2], base, a[4], pos_offset=2), gqa_decode_reference(*a))

    def step(q, k, v, positions):
        return torch.ops.lingc.gqa_decode(q, k, v, positions, 0.125) * 2

    compiled = torch.compile(step, backend="aot_eager", fullgraph=True)
    assert torch.equal(compiled(*a[:4]), step(*a[:4]))
    with FakeTensorMode() as mode:
        fa = [mode.from_tensor(t) if torch.is_tensor(t) else t for t in a]
        o = torch.ops.lingc.gqa_decode(*fa)
        assert o.shape == (6, 8, 32) and o.dtype == torch.float32
        assert torch.ops.lingc.gqa_decode(*fa, out_dtype=torch.bfloat16).dtype == torch.bfloat16
        with pytest.raises(ValueError, match="must be a multiple of the caches' 3 key/value heads"):
            torch.ops.lingc.gqa_decode(fa[0], mode.from_tensor(torch.zeros(48, 3, 32)),
                                       mode.from_tensor(torch.zeros(48, 3, 32)), *fa[3:])


def _bad(**kw):
    x = make_inputs(2, 20, [10, 11], torch.bfloat16, seed=50, device="cpu")
    a = dict(zip(["q", "k_cache", "v_cache", "positions", "scale"], args(x)), window=0)
    a.update(kw)
    return a


@pytest.mark.parametrize("kw,match", [
    (dict(q=torch.zeros(2, 4)), r"q must be \[T, heads, head_dim\]"),
    (dict(q=torch.zeros(17, 4, 32)), "T = 17 query positions"),
    (dict(k_cache=torch.zeros(20, 2, 16, dtype=torch.bfloat16)), "q's head_dim 32 differs from k_cache's 16"),
    (dict(v_cache=torch.zeros(19, 2, 32)), "v_cache must be"),
    (dict(v_cache=torch.zeros(20, 2, 32)), "k_cache and v_cache must share a dtype"),
    (dict(k_cache=torch.zeros(20, 2, 32, dtype=torch.int32)), "k_cache.dtype must be"),
    (dict(positions=torch.tensor([1.0, 2.0])), "positions must be int32 or int64"),
    (dict(positions=torch.tensor([1, 2, 3])), r"positions must be a \[T\] = \[2\] tensor"),
    (dict(scale=0.0), "scale must be a finite number > 0"),
    (dict(window=-1), "window must be an int >= 0"),
    (dict(inv_freq=torch.ones(17)), r"inv_freq must be a contiguous float \[rope_dims / 2\] with rope_dims <= the "
                                    r"head dim 32"),
    (dict(inv_freq=torch.ones(8, dtype=torch.float64)), "inv_freq must be a contiguous float"),
    (dict(gate=torch.zeros(2, 4, 16)), r"gate must be a float \[T, heads, DV\] = \(2, 4, 32\)"),
    (dict(gate=torch.zeros(2, 4, 32, dtype=torch.int32)), "gate must be a float"),
    (dict(out_dtype=torch.int32), "out_dtype must be float32, bfloat16 or float16"),
    (dict(norm_weight=torch.ones(16)), r"norm_weight must be a contiguous float \[head_dim\] = \(32,\)"),
    (dict(zero_centered=True), "forms of the head norm; norm_weight is None"),
    (dict(k_cache=torch.zeros(20, 2, 300), v_cache=torch.zeros(20, 2, 300), q=torch.zeros(2, 4, 300)),
     "head_dim = 300 must be in 1..256"),
])
def test_argument_errors(kw, match):
    with pytest.raises(ValueError, match=match):
        torch.ops.lingc.gqa_decode(**_bad(**kw))


_COMPILE_CHECK = textwrap.dedent("""
    import re
    from sm90 import compile_sm90, divisible_by_16
    from lingc.runtime.kernels.gqa_decode.kernel import _gqa_split_kernel, config_for, num_splits

    L = 65536                   # several tiles a split (at 8192 two 64-row tiles)
    # Qwen3-Next (64 of 256 dims rotated in the query load) and a Llama-style rank (all, or none)
    # (and the Qwen3-Next rank with its zero-centred q_norm in the load too, or its angles' cos / sin
    # from tables, a value per pair)
    for (hq, hkv, d, half, norm, table) in ((4, 1, 256, 32, False, 0), (8, 2, 128, 64, False, 0),
                                            (8, 2, 128, 0, False, 0), (4, 1, 256, 32, True, 0),
                                            (4, 1, 256, 32, False, 1)):
        cfg = config_for(L, hq, hkv, d, d)
        sig = dict(q_ptr="*bf16", k_ptr="*bf16", v_ptr="*bf16", pos_ptr="*i64", freq_ptr="*fp32", m_ptr="*fp32",
                   l_ptr="*fp32",
                   acc_ptr="*fp32", stride_qt="i32", stride_qh="i32", stride_kl="i32", stride_kh="i32",
                   stride_vl="i32", stride_vh="i32", pos_stride="i32", pos_add="i32", pos_step="i32", L="i32",
                   scale="fp32", window="i32", T="i32", **(dict(w_ptr="*bf16", eps="fp32") if norm else {}),
                   **(dict(cos_ptr="*bf16", sin_ptr="*bf16", stride_cr="i32", stride_cc="i32", stride_sr="i32",
                           stride_sc="i32") if table else {}))
        g = hq // hkv
        const = dict(HQ=hq, G=g, D=d, DV=d, NS=num_splits(L, cfg), GP=g, BH=16, BD=d, BDV=d, BL=cfg.block_l,
                     SPLIT_LEN=cfg.split_len, SPLIT_Q=False, SPLIT_P=True, DOT_PRECISION="ieee", DOT_UPCAST=False,
                     USE_GDC=True, HALF=half, **(dict(NORM=True, ZERO_CENTERED=True) if norm else {}),
                     **(dict(TABLE=table, BY_TOKEN=False) if table else {}))
        aligned = [n for n in sig if n.endswith("_ptr") or n.startswith("stride_")]
        ptx, info = compile_sm90(_gqa_split_kernel, sig, const, attrs=divisible_by_16(_gqa_split_kernel, aligned),
                                 num_warps=cfg.num_warps, num_stages=cfg.num_stages)
        assert "cp.async" in ptx, "the split's tile loop is not pipelined"
        assert "griddepcontrol.wait" in ptx
        # With the queries' RoPE a Qwen3-Next rank spills 16 bytes: 4 stores before the PDL wait
        # whose loads precede the tile loop's steady state (nvdisasm, session 53); none in the loop.
        spill = int(re.search(r"(\\d+) bytes spill stores", info).group(1))
        assert spill <= (16 if half else 0), info         # (with the q_norm too: 0 in session 54)
""")


def test_kernel_compiles_for_sm90_without_spills():
    # The real compile for an H200 at a Qwen3-Next rank's and a Llama-style rank's shapes (context
    # 65536) with the bundled ptxas: the tile loop pipelined, PDL wait present, no register spills.
    run_sm90_compile_check(_COMPILE_CHECK)


# GPU: a Qwen3-Next-80B TP4 rank's full-attention layer (4 query heads over 1 key/value head of
# 256 dims) and a Llama-style rank (8 over 2 of 128), bf16 caches.


@pytest.mark.gpu
@pytest.mark.parametrize("heads,d", [((4, 1), 256), ((8, 2), 128)], ids=["qwen3-next-rank", "llama-rank"])
@pytest.mark.parametrize("L", [8192, 65536])
@pytest.mark.parametrize("T", [1, 6])
def test_gpu_rank_shapes_match_reference(T, L, heads, d):
    x = make_inputs(T, L, chain(L - T, T), torch.bfloat16, seed=T + L, heads=heads, dims=(d, d), garbage=1.0)
    got = run_kernel(args(x), config=None)
    assert_close(got, gqa_decode_reference(*cpu(args(x))), 5e-5)
    one = run_kernel((x["q"][-1:], x["k"], x["v"], x["positions"][-1:], d ** -0.5), config=None)
    assert torch.equal(one, got[-1:]), "batch invariance in T"


@pytest.mark.gpu
@pytest.mark.parametrize("T", [1, 6])
def test_gpu_qwen3_next_rank_with_query_rope(T):
    """A Qwen3-Next rank (4 over 1 heads of 256, the first 64 dims rotated, rotate-half) at 8192."""
    from lingc.models.layers import rope_inv_freq
    x = make_inputs(T, 8192, chain(8192 - T, T), torch.bfloat16, seed=T, heads=(4, 1), dims=(256, 256), garbage=1.0)
    freq = rope_inv_freq(64, 1.0e7).to(DEVICE)
    got = run_kernel(args(x), config=None, inv_freq=freq)
    assert_close(got, gqa_decode_reference(*cpu(args(x)), inv_freq=freq.cpu()), 2e-2)


@pytest.mark.gpu
@pytest.mark.parametrize("T, edges", [(1, [1, 1, 1]), (6, [1, 0, 1])])
def test_gpu_pdl_chain_under_graph_capture(T, edges):
    # split -> combine -> split -> combine (the second's queries read the first's output): 4
    # kernels, 3 programmatic edges at T = 1; above SPLIT_PDL_MAX_T queries the splits launch
    # plainly. Replays equal eager launches bit for bit.
    if not pdl_supported(DEVICE):
        pytest.skip("PDL needs compute capability >= 9")
    x = make_inputs(T, 8192, chain(8192 - T, T), torch.bfloat16, seed=3, heads=(4, 1), dims=(256, 256), garbage=1.0)

    def step(q):
        o1 = gqa_decode(q, x["k"], x["v"], x["positions"], 0.0625)
        return gqa_decode(o1, x["k"], x["v"], x["positions"], 0.0625)

    static_q = x["q"].clone()
    eager = step(static_q)
    types, static_out = captured_replay(lambda: step(static_q))
    assert types == edges, f"edge types {types}, expected {edges} (1: programmatic)"
    assert torch.equal(static_out, eager)


@pytest.mark.gpu
@pytest.mark.parametrize("split_pdl, combine_pdl, edges", [(False, True, [1, 0, 1]), (True, False, [0, 1, 0])])
def test_gpu_pdl_for_one_kernel_keeps_the_bits(split_pdl, combine_pdl, edges):
    # A config that leaves one of the two kernels out of the PDL chain (as MlaDecodeConfig's):
    # the captured chain has plain edges into that kernel, and the output is the all-PDL
    # launch's, bit for bit.
    if not pdl_supported(DEVICE):
        pytest.skip("PDL needs compute capability >= 9")
    from dataclasses import replace
    x = make_inputs(1, 8192, chain(8191, 1), torch.bfloat16, seed=5, heads=(4, 1), dims=(256, 256), garbage=1.0)
    table = config_for(8192, 4, 1, 256, 256)
    cfg = replace(table, split_pdl=split_pdl, combine_pdl=combine_pdl)

    def step(q, config):
        o1 = gqa_decode_triton(q, x["k"], x["v"], x["positions"], 0.0625, config=config)
        return gqa_decode_triton(o1, x["k"], x["v"], x["positions"], 0.0625, config=config)

    static_q = x["q"].clone()
    reference = step(static_q, table)
    got_edges, static_out = captured_replay(lambda: step(static_q, cfg))
    assert got_edges == edges
    assert torch.equal(static_out, reference)


@pytest.mark.parametrize("layout", ROPE_TABLE_LAYOUTS)
@pytest.mark.parametrize("by_token", [False, True], ids=["by-position", "by-token"])
@pytest.mark.parametrize("interleaved", [False, True], ids=["rotate-half", "interleaved"])
@pytest.mark.parametrize("T,L,p0,R,heads,dims", ROPE_CASES[:2], ids=[f"T{c[0]}-R{c[3]}" for c in ROPE_CASES[:2]])
def test_kernel_rope_tables_on_queries(T, L, p0, R, heads, dims, interleaved, by_token, layout):
    """The queries' rotation with cos / sin from the model's tables (random values, every layout's
    strided views, at the query's position or its own row): the kernel equals the reference, which
    is gqa_decode's on queries rotated beforehand by head_cache_write's table reference."""
    from lingc.runtime.kernels.head_cache_write.naive import rope_heads_table_reference, rope_table_rows
    x = make_inputs(T, L, chain(p0, T), torch.bfloat16, seed=T * 11 + R, heads=heads, dims=dims)
    g = torch.Generator().manual_seed(T + R + by_token)
    cos, sin = (t.to(torch.bfloat16).to(DEVICE) for t in rope_tables(layout, T if by_token else L, R, g))
    table = dict(rope_cos=cos, rope_sin=sin, rope_dims=R, rope_by_token=by_token)
    want = gqa_decode_reference(*cpu(args(x)), interleaved=interleaved,
                                **{k: v.cpu() if torch.is_tensor(v) else v for k, v in table.items()})
    q, k, v, pos, scale = cpu(args(x))
    rows = [rope_table_rows(t.cpu(), pos, by_token) for t in (cos, sin)]
    assert torch.equal(want, gqa_decode_reference(rope_heads_table_reference(q, *rows, R, interleaved), k, v, pos,
                                                  scale))
    got = run_kernel(args(x), interleaved=interleaved, **table)
    assert_close(got, want, 2e-2)                       # bf16 queries: one rounding step apart at most
    if not by_token:
        one = run_kernel((x["q"][-1:], x["k"], x["v"], x["positions"][-1:], dims[0] ** -0.5), interleaved=interleaved,
                         **table)
        assert torch.equal(one, got[-1:]), "batch invariance in T"
    op = torch.ops.lingc.gqa_decode(*args(x), interleaved=interleaved, **table)
    if DEVICE == "cpu":
        assert torch.equal(op, want)
