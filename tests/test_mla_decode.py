"""MLA decode attention (torch.ops.lingc.mla_decode): the split-K Triton kernels vs the reference,
the reference vs the tiny model's own absorbed MLA layer, the causal mask inside a verify chain,
batch invariance in T, fake impl and argument checks.

On the CPU the kernels run under TRITON_INTERPRET=1 (conftest.py) at the tiny preset's head shape
(H=4, kv_lora_rank 40, rope 8: padded, masked tiles) with small splits, so contexts cross split
and tile boundaries (and end mid-tile); with CUDA the same tests run on the GPU and the
``gpu``-marked ones add flash-tp4-rank shapes (H=8, 512 + 64) at contexts 8192 and 65536.

Cache rows past the last query position hold large random values (or NaN), never zeros, so a
mask that lets one through shows. Outputs and the split workspace are NaN-poisoned.

Tolerances (relative RMS vs the fp32 reference): fp32 caches use fp32 dots (2e-6); bf16 caches
use hi/lo-split bf16 dots whose fp32 operand keeps ~16 bits (5e-5 under the interpreter, whose
bf16 cast truncates; the GPU rounds to nearest); fp16 caches split into fp16 halves (~22 bits, 5e-6).
"""
import dataclasses
import textwrap

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from helpers import assert_close, captured_replay, graph_edge_types, run_sm90_compile_check
from lingc.models import Ling3Cache
from lingc.models.layers import apply_rope_interleaved, rope_inv_freq
from lingc.runtime.kernels.mla_decode import mla_decode, mla_decode_reference
from lingc.runtime.kernels.mla_decode import kernel as mla_kernel
from lingc.runtime.kernels.mla_decode.kernel import (
    MlaDecodeConfig,
    config_for,
    mla_decode_triton,
    num_splits,
    workspace,
)
from lingc.runtime.pdl import pdl_supported

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
RTOL = {torch.float32: 2e-6 if DEVICE == "cpu" else 1e-5, torch.bfloat16: 5e-5, torch.float16: 5e-6}
H, R, P = 4, 40, 8                     # the tiny preset's MLA head shape
SCALE = (16 + 8) ** -0.5
# Small splits so short contexts cross split boundaries: 2 tiles per split, or 1.
SPLIT32 = MlaDecodeConfig(split_len=32, block_l=16)
SPLIT16 = MlaDecodeConfig(split_len=16, block_l=16)
# A 32-row query tile: 8 queries of the tiny model's 4 heads per program instead of 4.
SPLIT32_H32 = MlaDecodeConfig(split_len=32, block_l=16, block_h=32)


def make_inputs(T, L, positions, kv_dtype, seed, q_rope_dtype=None, garbage=100.0, device=DEVICE, heads=H,
                rank=R, rope=P):
    """Queries, a cache whose rows past max(positions) are large junk, and a gate."""
    gen = torch.Generator().manual_seed(seed)

    def r(*shape, scale=1.0):
        return torch.randn(*shape, generator=gen) * scale

    kv = r(L, rank + rope)
    hi = int(max(positions)) + 1
    kv[hi:] = r(L - hi, rank + rope, scale=garbage)
    x = dict(q_lat=r(T, heads, rank, scale=0.5), q_rope=r(T, heads, rope).to(q_rope_dtype or kv_dtype),
             kv_cache=kv.to(kv_dtype), positions=torch.tensor(positions, dtype=torch.int64),
             gate=r(T, heads).to(kv_dtype), inv_freq=rope_inv_freq(rope, 10000.0))
    return {k: v.to(device) for k, v in x.items()}


def args(x, gate=False, rope=False):
    return (x["q_lat"], x["q_rope"], x["kv_cache"], x["positions"], SCALE,
            x["gate"] if gate else None, x["inv_freq"] if rope else None)


def cpu(a):
    return tuple(t.cpu() if torch.is_tensor(t) else t for t in a)


def run_kernel(a, config=SPLIT32, poison_partials=True):
    """The launcher with a NaN-poisoned output and split workspace."""
    q_lat, kv = a[0], a[2]
    T, Hh, Rr = q_lat.shape
    out = torch.full((T, Hh, Rr), float("nan"), device=q_lat.device)
    cfg = config or config_for(kv.shape[0], Hh, Rr, a[1].shape[2])
    parts = None
    if poison_partials:
        parts = tuple(t.fill_(float("nan")) for t in workspace(T, Hh, Rr, num_splits(kv.shape[0], cfg), q_lat.device))
    return mla_decode_triton(*a, out=out, config=cfg, partials=parts)


def chain(p0, T):
    return list(range(p0, p0 + T))


# Kernel vs reference: T sweep x context sweep x options.


CASES = [
    # (T, L, first position, config): contexts that end mid-tile, on a split boundary, one past
    # it, the first token (sees row 0 only), a chain straddling a split boundary.
    (1, 37, 36, SPLIT32),
    (1, 100, 63, SPLIT32),
    (1, 100, 64, SPLIT32),
    (1, 40, 0, SPLIT16),
    (3, 100, 30, SPLIT32),
    (6, 100, 27, SPLIT32),
    (6, 50, 44, SPLIT16),
    (8, 300, 200, None),          # the default config: splits of 128 rows
    (1, 100, 63, SPLIT32_H32),    # a 32-row query tile: one query in 8 live rows of 32
    (6, 100, 27, SPLIT32_H32),
    (12, 100, 70, SPLIT32_H32),   # two programs per split, the second half empty
]


@pytest.mark.parametrize("kv_dtype", [torch.float32, torch.bfloat16, torch.float16], ids=["fp32", "bf16", "fp16"])
@pytest.mark.parametrize("T,L,p0,config", CASES, ids=[f"T{c[0]}-L{c[1]}-p{c[2]}" for c in CASES])
def test_kernel_matches_reference(T, L, p0, config, kv_dtype):
    x = make_inputs(T, L, chain(p0, T), kv_dtype, seed=T * 1000 + L + p0)
    got = run_kernel(args(x), config)
    assert_close(got, mla_decode_reference(*cpu(args(x))), RTOL[kv_dtype])


@pytest.mark.parametrize("T,p0", [(1, 70), (6, 30)])
@pytest.mark.parametrize("heads,rank,rope", [(3, 24, 6), (8, 64, 16)])
def test_kernel_matches_reference_other_head_shapes(heads, rank, rope, T, p0):
    # Head count, latent rank and RoPE width away from the tiny preset's (4, 40, 8) on the CPU
    # too (flash-tp4-rank's 8, 512, 64 run in the GPU tests): padded head tiles, a rank and a
    # RoPE width that are not powers of two.
    x = make_inputs(T, 100, chain(p0, T), torch.bfloat16, seed=heads * 100 + rank + T, heads=heads, rank=rank,
                    rope=rope)
    got = run_kernel(args(x, gate=True, rope=True))
    assert_close(got, mla_decode_reference(*cpu(args(x, gate=True, rope=True))), RTOL[torch.bfloat16])


@pytest.mark.parametrize("kv_dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("T,L,p0,config", [(1, 100, 63, SPLIT32), (6, 100, 27, SPLIT32), (8, 300, 200, None)])
def test_kernel_without_rope_dims(T, L, p0, config, kv_dtype):
    """P = 0 (an MLA without rope dims, NoPE; q_rope a zero-width slice of q_lat, the cache the
    latent alone): the kernel against the reference, gate on, every output written (poisoned)."""
    x = make_inputs(T, L, chain(p0, T), kv_dtype, seed=T * 7 + L, rope=0)
    x["q_rope"] = x["q_lat"][..., :0].to(kv_dtype)
    got = run_kernel(args(x, gate=True), config)
    assert_close(got, mla_decode_reference(*cpu(args(x, gate=True))), RTOL[kv_dtype])
    with pytest.raises(ValueError, match=r"rope_inv_freq given but q_rope has no rope dims \(P = 0\)"):
        torch.ops.lingc.mla_decode(*cpu(args(x))[:6], torch.ones(4))


@pytest.mark.parametrize("kv_dtype,q_rope_dtype", [(torch.float32, torch.float32), (torch.bfloat16, torch.bfloat16),
                                                   (torch.bfloat16, torch.float32), (torch.float16, torch.float16)],
                         ids=["fp32", "bf16", "bf16-q32", "fp16"])
def test_kernel_fused_rope_and_gate(kv_dtype, q_rope_dtype):
    # Raw q_rope + inv_freq (RoPE in the kernel, rounded to q_rope's dtype) and the sigmoid gate.
    x = make_inputs(6, 100, chain(60, 6), kv_dtype, seed=7, q_rope_dtype=q_rope_dtype)
    got = run_kernel(args(x, gate=True, rope=True))
    assert_close(got, mla_decode_reference(*cpu(args(x, gate=True, rope=True))), RTOL[kv_dtype])


def test_kernel_reads_a_bf16_inv_freq_as_fp32():
    """inv_freq cast to bf16 with the model: the same output as its exact fp32 upcast."""
    x = make_inputs(6, 100, chain(60, 6), torch.bfloat16, seed=9)
    x["inv_freq"] = x["inv_freq"].to(torch.bfloat16)
    got = run_kernel(args(x, gate=True, rope=True))
    x32 = dict(x, inv_freq=x["inv_freq"].float())
    assert torch.equal(got, run_kernel(args(x32, gate=True, rope=True)))
    assert_close(got, mla_decode_reference(*cpu(args(x, gate=True, rope=True))), RTOL[torch.bfloat16])


def test_kernel_large_rope_angles():
    # Positions near the 256k context limit with the flash theta: the rotation's angle is
    # ~2.6e5 rad in the first pair, where a fast sin/cos without range reduction breaks.
    x = make_inputs(2, 40, [39, 39], torch.float32, seed=8)
    x["positions"] = torch.tensor([262000, 262143], device=DEVICE)
    x["inv_freq"] = rope_inv_freq(P, 6.0e6).to(DEVICE)
    # Positions beyond the cache see every row (the mask clamps at L - 1, as the model's does).
    got = run_kernel(args(x, rope=True), SPLIT16)
    assert_close(got, mla_decode_reference(*cpu(args(x, rope=True))), RTOL[torch.float32])


def test_kernel_positions_as_int32_and_strided_queries():
    # int32 positions; q_lat and q_rope as views with H/T strides (q_rope a slice of q_proj's
    # [T, H, nope + rope] output); the cache one slot of a [slots, L, R + P] buffer.
    x = make_inputs(3, 60, chain(40, 3), torch.bfloat16, seed=9)
    q_full = torch.randn(3, H, 16 + P, device=DEVICE).to(torch.bfloat16)
    q_rope = q_full[..., 16:]
    q_lat = torch.randn(3, H * 2, R, device=DEVICE)[:, ::2]
    slots = torch.randn(2, 60, R + P, device=DEVICE).to(torch.bfloat16)
    slots[1] = x["kv_cache"]
    a = (q_lat, q_rope, slots[1], x["positions"].to(torch.int32), SCALE, None, None)
    assert not q_lat.is_contiguous() and not q_rope.is_contiguous()
    assert_close(run_kernel(a), mla_decode_reference(*cpu(a)), RTOL[torch.bfloat16])


@pytest.mark.parametrize("T,p0,offset", [(1, 36, 0), (1, 64, 3), (6, 27, 0), (6, 44, 2)])
def test_kernel_positions_from_a_base(T, p0, offset):
    """positions = a [1] base n with pos_offset o (query t at n + o + t, the relay's chain): the
    same bits as the explicit [T] positions, on both kernels (the split's mask and RoPE, the
    combine's split count), from a poisoned workspace and output."""
    x = make_inputs(T, 100, chain(p0, T), torch.bfloat16, seed=T * 31 + p0)
    explicit = run_kernel(args(x, gate=True, rope=True), SPLIT16)
    base = torch.tensor([p0 - offset], dtype=torch.int64, device=DEVICE)
    a = list(args(x, gate=True, rope=True))
    a[3] = base
    q_lat, kv = a[0], a[2]
    out = torch.full(q_lat.shape, float("nan"), device=DEVICE)
    parts = tuple(t.fill_(float("nan")) for t in workspace(T, H, R, num_splits(kv.shape[0], SPLIT16), DEVICE))
    got = mla_decode_triton(*a, out=out, config=SPLIT16, partials=parts, pos_offset=offset)
    assert torch.equal(got, explicit)
    # The op (the reference on the CPU) reads the base form the same way.
    assert torch.equal(mla_decode(*a, pos_offset=offset), mla_decode(*args(x, gate=True, rope=True)))
    # A base read as explicit positions (offset ignored) would be another query set.
    assert not torch.equal(mla_decode(*a, pos_offset=offset + 1), explicit)


# The causal mask and what the kernel never reads.


def test_causal_mask_inside_the_chain():
    # Query j of a chain sees rows <= its own position: rewriting the chain's later rows changes
    # the later queries' outputs and leaves query j's bit for bit unchanged.
    T, p0 = 6, 40
    x = make_inputs(T, 64, chain(p0, T), torch.bfloat16, seed=11)
    base = run_kernel(args(x))
    for j in range(T - 1):
        y = dict(x, kv_cache=x["kv_cache"].clone())
        y["kv_cache"][p0 + j + 1:p0 + T] = -y["kv_cache"][p0 + j + 1:p0 + T]
        got = run_kernel(args(y))
        assert torch.equal(got[:j + 1], base[:j + 1]), f"query {j} saw a later row of its chain"
        assert not torch.equal(got[j + 1:], base[j + 1:]), f"queries after {j} ignored their own rows"


def test_rows_past_the_positions_are_never_read():
    # NaN in every row past the last position (and in the rest of the last tile): finite output,
    # bitwise the same as with zeros there.
    x = make_inputs(4, 100, chain(50, 4), torch.bfloat16, seed=12)
    nan_rows, zero_rows = x["kv_cache"].clone(), x["kv_cache"].clone()
    nan_rows[54:] = float("nan")
    zero_rows[54:] = 0
    a = run_kernel(args(dict(x, kv_cache=nan_rows)))
    b = run_kernel(args(dict(x, kv_cache=zero_rows)))
    assert torch.isfinite(a).all() and torch.equal(a, b)


# Batch invariance in T.


@pytest.mark.parametrize("config", [SPLIT32, SPLIT32_H32], ids=["tile16", "tile32"])
@pytest.mark.parametrize("kv_dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_kernel_batch_invariant_in_T(kv_dtype, config):
    # A T = 8 chain straddling a split boundary (rows 28..35, splits of 32): every shorter chain
    # and every single-position decode gives the same bits for the same position.
    x = make_inputs(8, 64, chain(28, 8), kv_dtype, seed=21)
    full = run_kernel(args(x, gate=True, rope=True), config)
    for n in range(1, 8):
        part = {k: (v[:n] if k in ("q_lat", "q_rope", "positions", "gate") else v) for k, v in x.items()}
        assert torch.equal(run_kernel(args(part, gate=True, rope=True), config), full[:n]), f"T={n}"
    for j in (0, 5, 7):
        one = {k: (v[j:j + 1] if k in ("q_lat", "q_rope", "positions", "gate") else v) for k, v in x.items()}
        assert torch.equal(run_kernel(args(one, gate=True, rope=True), config), full[j:j + 1]), f"decode of position {j}"


def test_reference_batch_invariant_in_T():
    x = make_inputs(8, 48, chain(30, 8), torch.bfloat16, seed=22, device="cpu")
    full = mla_decode_reference(*args(x, gate=True, rope=True))
    for n in (1, 3, 6, 7):
        part = {k: (v[:n] if k in ("q_lat", "q_rope", "positions", "gate") else v) for k, v in x.items()}
        assert torch.equal(mla_decode_reference(*args(part, gate=True, rope=True)), full[:n])


# The reference is the model's own absorbed attention; the kernel agrees with the model's layer.


def _mla(model, idx=0):
    return model.target_layers[model.config.mla_layers[idx]].attention


def _cache_with_history(cfg, rows, seed):
    cache = Ling3Cache.allocate(cfg, 48)
    gen = torch.Generator().manual_seed(seed)
    for t in cache.kv:
        t[:, :rows] = torch.randn(t[:, :rows].shape, generator=gen).to(t.dtype)
    return cache


def layer_with_op(layer, x, positions, cache, impl, fuse_gate=False, fuse_rope=False):
    """MLAAttention.forward (lingc/models/mla.py) with its attention core replaced by ``impl``
    (mla_decode's signature); everything else is the model's code, in the model's order."""
    T, Hh = x.shape[0], layer.num_heads
    q = layer.q_proj(x).view(T, Hh, layer.nope + layer.rope)
    q_nope, q_rope = q[..., :layer.nope], q[..., layer.nope:]
    if not fuse_rope:
        q_rope = apply_rope_interleaved(q_rope, positions, layer.inv_freq)
    kv_cache = layer._cache(cache)[0]
    kv_cache.index_copy_(0, positions, layer.project_kv(x, positions).to(kv_cache.dtype))
    w_kv = layer.kv_b_proj.weight.view(Hh, layer.nope + layer.vdim, layer.rank)
    w_k, w_v = w_kv[:, :layer.nope], w_kv[:, layer.nope:]
    q_lat = torch.einsum("thn,hnr->thr", q_nope.float(), w_k.float())
    g = layer.g_proj(x)
    o_lat = impl(q_lat, q_rope, kv_cache, positions, layer.scale, g if fuse_gate else None,
                 layer.inv_freq if fuse_rope else None)
    o = torch.einsum("thr,hvr->thv", o_lat, w_v.float())
    if not fuse_gate:
        o = o * torch.sigmoid(g.float()).unsqueeze(-1)
    return layer.dense(o.reshape(T, Hh * layer.vdim).to(x.dtype))


@pytest.fixture(scope="module", params=["float32", "bfloat16"])
def tiny(request):
    from model_helpers import tiny_model

    return tiny_model(seed=5, torch_dtype=request.param)


def test_reference_is_the_models_absorbed_attention(tiny):
    # The op's CPU path inside the model's layer: bit for bit at T = 1 (the same torch calls on the
    # same shapes), with RoPE fused too; to fp32 rounding at T = 6 (the model's whole-T einsums
    # are GEMMs whose blocking changes with T) and with the gate fused (declared numerics).
    layer, cfg = _mla(tiny), tiny.config
    tol = 1e-5 if cfg.torch_dtype == "float32" else 5e-3
    for T, p0 in ((1, 20), (1, 0), (6, 30)):
        x = torch.randn(T, cfg.hidden_size, generator=torch.Generator().manual_seed(T + p0)).to(cfg.dtype)
        positions = torch.arange(p0, p0 + T)
        want = layer(x, positions, _cache_with_history(cfg, p0, seed=p0))
        for fuse_gate, fuse_rope in ((False, False), (False, True), (True, True)):
            got = layer_with_op(layer, x, positions, _cache_with_history(cfg, p0, seed=p0), mla_decode,
                                fuse_gate, fuse_rope)
            if T == 1 and not fuse_gate:
                assert torch.equal(got, want), f"T=1 fuse_rope={fuse_rope}"
            else:
                assert_close(got, want, tol)


def test_kernel_inside_the_models_layer(tiny):
    # The Triton kernel (interpreter on the CPU) as the layer's core, RoPE and gate fused, at the
    # preset's default config and at 16-row splits, for a verify chain and a decode.
    layer, cfg = _mla(tiny), tiny.config
    tol = 1e-5 if cfg.torch_dtype == "float32" else 5e-3
    for T, p0, config in ((6, 25, SPLIT16), (1, 47, None)):
        x = torch.randn(T, cfg.hidden_size, generator=torch.Generator().manual_seed(p0)).to(cfg.dtype)
        positions = torch.arange(p0, p0 + T)
        want = layer(x, positions, _cache_with_history(cfg, p0, seed=p0))

        def impl(*a):
            # The layer lives on the CPU; on a GPU machine the kernel runs on the GPU.
            a = [v.to(DEVICE) if isinstance(v, torch.Tensor) else v for v in a]
            return mla_decode_triton(*a, config=config).cpu()

        got = layer_with_op(layer, x, positions, _cache_with_history(cfg, p0, seed=p0), impl, True, True)
        assert_close(got, want, tol)


# A broken kernel must fail the checks above.


def test_broken_kernels_are_caught(monkeypatch):
    # Positions reach the third split (rows 64..69 of splits of 32).
    x = make_inputs(3, 70, chain(64, 3), torch.float32, seed=31)
    ref = mla_decode_reference(*cpu(args(x)))
    assert_close(run_kernel(args(x)), ref, RTOL[torch.float32])
    # An off-by-one causal mask (each query also sees the next row).
    shifted = dict(x, positions=x["positions"] + 1)
    with pytest.raises(AssertionError, match="relative RMS error"):
        assert_close(run_kernel(args(shifted)), ref, RTOL[torch.float32])
    # A split grid that misses the last split: its partials stay NaN-poisoned, the combine reads them.
    real = mla_kernel._mla_split_kernel

    class DropLastSplit:
        def __getitem__(self, grid):
            return real[(grid[0], grid[1] - 1)]

    monkeypatch.setattr(mla_kernel, "_mla_split_kernel", DropLastSplit())
    with pytest.raises(AssertionError, match="non-finite"):
        assert_close(run_kernel(args(x)), ref, RTOL[torch.float32])


# The op: dispatch, fake impl, compile, argument checks, config.


def test_op_dispatch_fake_and_compile():
    x = make_inputs(6, 48, chain(40, 6), torch.bfloat16, seed=41, device="cpu")
    a = args(x, gate=True, rope=True)
    assert torch.equal(torch.ops.lingc.mla_decode(*a), mla_decode_reference(*a))
    assert "!" not in str(torch.ops.lingc.mla_decode.default._schema), "the op mutates nothing"

    def step(q_lat, q_rope, kv, positions, gate):
        return torch.ops.lingc.mla_decode(q_lat, q_rope, kv, positions, SCALE, gate, x["inv_freq"]) * 2

    compiled = torch.compile(step, backend="aot_eager", fullgraph=True)
    assert torch.equal(compiled(*a[:4], a[5]), step(*a[:4], a[5]))
    with FakeTensorMode() as mode:
        fa = [mode.from_tensor(t) if torch.is_tensor(t) else t for t in a]
        o = torch.ops.lingc.mla_decode(*fa)
        assert o.shape == (6, H, R) and o.dtype == torch.float32
        with pytest.raises(ValueError, match="kv_cache must be one slot's"):
            torch.ops.lingc.mla_decode(fa[0], fa[1], mode.from_tensor(torch.zeros(1, 48, R + P)), *fa[3:])


def _bad(**kw):
    x = make_inputs(2, 20, [10, 11], torch.bfloat16, seed=50, device="cpu")
    a = dict(zip(["q_lat", "q_rope", "kv_cache", "positions", "scale", "gate", "rope_inv_freq"], args(x)))
    a.update(kw)
    return a


@pytest.mark.parametrize("kw,match", [
    (dict(q_lat=torch.zeros(2, H * R)), r"q_lat must be \[T, H, kv_lora_rank\]"),
    (dict(q_lat=torch.zeros(17, H, R)), "T = 17 query positions, must be in 1..16"),
    (dict(q_lat=torch.zeros(2, H, R, dtype=torch.float64)), "q_lat.dtype must be .* got torch.float64"),
    (dict(q_rope=torch.zeros(2, H + 1, P)), r"q_rope must be \[T, H, rope_dim\] = \[2, 4, P\]"),
    (dict(q_rope=torch.zeros(2, H, 7)), "rope dim P = 7 must be even"),
    (dict(q_rope=torch.zeros(2, P, H).transpose(1, 2)), "q_rope must have unit stride"),
    (dict(kv_cache=torch.zeros(20, R)), r"kv_cache must be one slot's \[L, kv_lora_rank \+ rope_dim\] = \[L, 48\]"),
    (dict(kv_cache=torch.zeros(20, R + P, dtype=torch.int8)), "kv_cache.dtype must be bfloat16, float16 or float32"),
    (dict(positions=torch.tensor([10, 11], dtype=torch.float32)), "positions must be int32 or int64"),
    (dict(positions=torch.tensor([10])), r"positions must be a \[T\] = \[2\] tensor, got shape \(1,\)"),
    (dict(positions=torch.tensor([10, 11]), pos_offset=0), r"with pos_offset=0 positions is the base n, a \[1\]"),
    (dict(positions=torch.tensor([10]), pos_offset=-1), "pos_offset must be an int >= 0"),
    (dict(scale=0.0), "scale must be a finite number > 0"),
    (dict(gate=torch.zeros(2, H, 1)), r"gate must be \[T, H\] = \(2, 4\)"),
    (dict(rope_inv_freq=torch.zeros(P)), r"rope_inv_freq must be a \[P/2\] = \(4,\) float32"),
])
def test_bad_arguments_raise(kw, match):
    with pytest.raises(ValueError, match=match):
        mla_decode(**_bad(**kw))


def test_config_depends_on_capacity_only():
    # Split layouts for the contexts of the benchmark and the 256k limit; T is not an input. A
    # capacity just past a power of two (the benchmark's: context + its decode rows) keeps ~100+
    # splits of whole 64-row tiles, not 65 of twice the length.
    for L, split, ns in ((8192, 128, 64), (8256, 128, 65), (65536, 512, 128), (262144, 2048, 128), (48, 128, 1),
                         (16384, 128, 128), (16512, 192, 86), (33072, 320, 104), (65840, 576, 115),
                         (131376, 1088, 121)):
        cfg = config_for(L, 8, 512, 64)
        assert (cfg.split_len, num_splits(L, cfg)) == (split, ns), L
    assert config_for(8192, 8, 512, 64).num_warps == 8
    # The split joins the PDL chain at the shortest split length only (measured: 8192 on, 65536 off).
    assert [config_for(L, 8, 512, 64).split_pdl for L in (48, 8192, 16384, 32768, 65536, 262144)] == \
        [True, True, True, False, False, False]
    assert all(config_for(L, 8, 512, 64).combine_pdl for L in (8192, 65536))


_COMPILE_CHECK = textwrap.dedent("""
    from sm90 import compile_sm90, divisible_by_16
    from lingc.runtime.kernels.mla_decode.kernel import _mla_split_kernel, _mla_combine_kernel, config_for, num_splits

    def check(fn, sig, const, num_warps, num_stages):
        # Pointers and strides 16-divisible, as the launcher specialises them at these shapes:
        # without it the cache loads are 2-byte scalar loads and the tile loop is not pipelined
        # (no cp.async), which is not the kernel that runs.
        aligned = [n for n in sig if n.endswith("_ptr") or n in ("stride_qlt", "stride_qlh", "stride_qrt", "stride_kv")]
        ptx, info = compile_sm90(fn, sig, const, attrs=divisible_by_16(fn, aligned), num_warps=num_warps,
                                 num_stages=num_stages)
        assert fn is not _mla_split_kernel or "cp.async" in ptx, "the split's tile loop is not pipelined"
        assert "griddepcontrol.wait" in ptx
        assert " 0 bytes spill stores" in info, info

    L = 8192
    cfg = config_for(L, 8, 512, 64)
    ns = num_splits(L, cfg)
    for dt in ("bf16", "fp16"):         # the model's cache, and a float16 model's
        sig = dict(ql_ptr="*fp32", qr_ptr=f"*{dt}", kv_ptr=f"*{dt}", pos_ptr="*i64", freq_ptr="*fp32",
                   m_ptr="*fp32", l_ptr="*fp32", acc_ptr="*fp32", stride_qlt="i32", stride_qlh="i32",
                   stride_qrt="i32", stride_qrh="i32", stride_kv="i32", pos_stride="i32", pos_add="i32",
                   pos_step="i32", L="i32", scale="fp32", T="i32")
        const = dict(H=8, R=512, P=64, NS=ns, HP=8, BH=16, BR=512, BP=64, BL=cfg.block_l, SPLIT_LEN=cfg.split_len,
                     ROPE=True, ROPE_RNE=False, SPLIT_Q=True, SPLIT_QR=False, SPLIT_P=True, DOT_PRECISION="ieee",
                     DOT_UPCAST=False, USE_GDC=True)
        check(_mla_split_kernel, sig, const, cfg.num_warps, cfg.num_stages)
    # An MLA without rope dims (NoPE): the cache rows the latent alone.
    check(_mla_split_kernel, sig, dict(const, P=0, BP=16, ROPE=False, SPLIT_Q=True), cfg.num_warps, cfg.num_stages)
    sig = dict(m_ptr="*fp32", l_ptr="*fp32", acc_ptr="*fp32", pos_ptr="*i64", gate_ptr="*bf16", out_ptr="*fp32",
               stride_gt="i32", stride_gh="i32", pos_stride="i32", pos_add="i32", pos_step="i32", L="i32")
    const = dict(H=8, R=512, NS=ns, SPLIT_LEN=cfg.split_len, BS=ns, BSC=32, BRC=cfg.combine_block_r,
                 HAS_GATE=True, USE_GDC=True)
    check(_mla_combine_kernel, sig, const, 4, 1)
""")


def test_kernels_compile_for_sm90_without_spills():
    # The real compile for an H200 at flash-tp4-rank shapes (context 8192, RoPE and gate fused;
    # bf16 and fp16 caches) with the bundled ptxas: PDL wait present, no register spills.
    run_sm90_compile_check(_COMPILE_CHECK)


# GPU: flash-tp4-rank shapes (8 heads per rank, kv_lora_rank 512, rope 64, bf16 cache).


def _flash_inputs(T, L, seed):
    return make_inputs(T, L, chain(L - T, T), torch.bfloat16, seed=seed, heads=8, rank=512, rope=64, garbage=1.0)


@pytest.mark.gpu
@pytest.mark.parametrize("q_rope_dtype", [torch.bfloat16, torch.float32], ids=["q_rope-bf16", "q_rope-fp32"])
@pytest.mark.parametrize("L", [8192, 65536])
@pytest.mark.parametrize("T", [1, 6, 8])
def test_gpu_flash_shapes_match_reference(T, L, q_rope_dtype):
    # bf16 q_rope is the model's path (roped q rounded to bf16 on both sides); fp32 exercises
    # the hi/lo split of the rope query too.
    x = _flash_inputs(T, L, seed=T + L)
    x["q_rope"] = x["q_rope"].to(q_rope_dtype)
    got = run_kernel(args(x, gate=True, rope=True), config=None)
    ref = mla_decode_reference(*cpu(args(x, gate=True, rope=True)))
    assert_close(got, ref, 5e-5)


@pytest.mark.gpu
@pytest.mark.parametrize("T", [1, 6])
def test_gpu_flash_shapes_float16_cache(T):
    """A float16 model's cache at flash-tp4-rank shapes (fp16 hi/lo halves on the tensor cores)."""
    x = make_inputs(T, 8192, chain(8192 - T, T), torch.float16, seed=T + 11, heads=8, rank=512, rope=64, garbage=1.0)
    got = run_kernel(args(x, gate=True, rope=True), config=None)
    assert_close(got, mla_decode_reference(*cpu(args(x, gate=True, rope=True))), 2e-5)


@pytest.mark.gpu
@pytest.mark.parametrize("T", [1, 6])
def test_gpu_positions_from_a_base_same_bits(T):
    """flash-tp4-rank's shapes at 8192 with the table's config: the base form (the relay's n and
    pos_offset) gives the explicit positions' bits on both kernels."""
    x = _flash_inputs(T, 8192, seed=T + 5)
    explicit = run_kernel(args(x, gate=True, rope=True), config=None)
    a = list(args(x, gate=True, rope=True))
    a[3] = x["positions"][:1] - 2
    out = torch.full_like(explicit, float("nan"))
    assert torch.equal(mla_decode_triton(*a, out=out, pos_offset=2), explicit)


@pytest.mark.gpu
@pytest.mark.parametrize("block_h", [0, 32], ids=["table-tile", "tile32"])
@pytest.mark.parametrize("L", [8192, 65536])
def test_gpu_batch_invariant_in_T(L, block_h):
    x = _flash_inputs(8, L, seed=L + 1)
    cfg = dataclasses.replace(config_for(L, 8, 512, 64), block_h=block_h)
    full = run_kernel(args(x, gate=True, rope=True), config=cfg)
    assert_close(full, mla_decode_reference(*cpu(args(x, gate=True, rope=True))), 5e-5)
    for n in range(1, 8):
        part = {k: (v[:n] if k in ("q_lat", "q_rope", "positions", "gate") else v) for k, v in x.items()}
        assert torch.equal(run_kernel(args(part, gate=True, rope=True), config=cfg), full[:n]), f"T={n}"


@pytest.mark.gpu
def test_gpu_register_cap_keeps_the_results():
    # max_registers = 128 makes ptxas spill a little at 8 warps (benchmarks only; not in the table).
    x = _flash_inputs(6, 8192, seed=5)
    cfg = dataclasses.replace(config_for(8192, 8, 512, 64), num_stages=2, max_registers=128)
    got = run_kernel(args(x, gate=True, rope=True), config=cfg)
    assert_close(got, mla_decode_reference(*cpu(args(x, gate=True, rope=True))), 5e-5)
    assert torch.equal(got, run_kernel(args(x, gate=True, rope=True), config=dataclasses.replace(cfg, max_registers=0)))


@pytest.mark.gpu
@pytest.mark.parametrize("split_pdl, combine_pdl, edges", [(False, True, [1, 0, 1]), (True, False, [0, 1, 0])])
def test_gpu_pdl_for_one_kernel_keeps_the_bits(split_pdl, combine_pdl, edges):
    # A config that leaves one of the two kernels out of the PDL chain (config_for does it for
    # the split at long contexts): the captured chain has plain edges into that kernel, and the
    # output is the all-PDL launch's, bit for bit.
    if not pdl_supported(DEVICE):
        pytest.skip("PDL needs compute capability >= 9")
    from dataclasses import replace
    x = _flash_inputs(6, 8192, seed=5)
    cfg = replace(config_for(8192, 8, 512, 64), split_pdl=split_pdl, combine_pdl=combine_pdl)

    def step(q_lat, config):
        o1 = mla_decode_triton(q_lat, x["q_rope"], x["kv_cache"], x["positions"], SCALE, x["gate"], x["inv_freq"],
                               config=config)
        return mla_decode_triton(o1, x["q_rope"], x["kv_cache"], x["positions"], SCALE, x["gate"], x["inv_freq"],
                                 config=config)

    static_q = x["q_lat"].clone()
    reference = step(static_q, config_for(8192, 8, 512, 64))
    got_edges, static_out = captured_replay(lambda: step(static_q, cfg))
    assert got_edges == edges
    assert torch.equal(static_out, reference)


@pytest.mark.gpu
def test_gpu_pdl_chain_under_graph_capture():
    # split -> combine -> split -> combine (the second layer's queries read the first's output):
    # 4 kernels, 3 programmatic edges; replays equal eager launches bit for bit.
    if not pdl_supported(DEVICE):
        pytest.skip("PDL needs compute capability >= 9")
    x = _flash_inputs(6, 8192, seed=3)

    def step(q_lat):
        o1 = mla_decode(q_lat, x["q_rope"], x["kv_cache"], x["positions"], SCALE, x["gate"], x["inv_freq"])
        return mla_decode(o1, x["q_rope"], x["kv_cache"], x["positions"], SCALE, x["gate"], x["inv_freq"])

    static_q = x["q_lat"].clone()
    eager = step(static_q)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph(keep_graph=True)
    with torch.cuda.graph(graph):
        static_out = step(static_q)
    types = graph_edge_types(graph)
    assert types == [1, 1, 1], f"edge types {types}, expected 3 programmatic edges"
    graph.instantiate()
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(static_out, eager)
