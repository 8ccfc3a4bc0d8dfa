"""Norm kernels (torch.ops.lingc.rmsnorm / gated_head_rmsnorm): Triton kernels vs references,
the references vs the model's own modules, batch invariance in T, fake impls, argument checks.

On the CPU the kernels run under TRITON_INTERPRET=1 (conftest.py) on small widths and on the
flash hidden size (one program per row: the interpreter handles 2560 lanes quickly), including
non-power-of-two widths (masked lanes) and strided inputs; with CUDA the same tests run on the GPU
and the ``gpu``-marked ones add flash-tp4-rank shapes and a CUDA graph with PDL edges.

Outputs are NaN-poisoned before every kernel launch, so an unwritten element fails assert_close.
Tolerances (relative RMS): both sides compute in fp32 and round once; only the order of the row
sum and the rsqrt/sigmoid implementations differ (fp32: 1e-6). bf16 outputs may differ by one
rounding (the interpreter's fp32->bf16 cast truncates: runtime/kernels/swiglu_gemm/README.md), so
bf16 is held to 4e-3, and the bf16 residual add, a single rounding, to one ulp.
"""
import textwrap

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from helpers import assert_close, graph_edge_types, run_sm90_compile_check
from lingc.models.kda_math import gated_head_rmsnorm as model_gated_head_rmsnorm
from lingc.models.layers import RMSNorm
from lingc.runtime.kernels.norms import (
    embedding_rmsnorm,
    embedding_rmsnorm_reference,
    gated_head_rmsnorm,
    gated_head_rmsnorm_reference,
    rmsnorm,
    rmsnorm_reference,
)
from lingc.runtime.kernels.norms.kernel import (
    NormConfig,
    embedding_rmsnorm_triton,
    gated_config,
    gated_head_rmsnorm_triton,
    rmsnorm_config,
    rmsnorm_triton,
)
from lingc.runtime.pdl import pdl_supported

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
EPS = 1e-6
RTOL = {torch.float32: 1e-6 if DEVICE == "cpu" else 1e-5, torch.bfloat16: 4e-3}
DTYPES = [torch.float32, torch.bfloat16]
IDS = ["fp32", "bf16"]


def rand(*shape, dtype=torch.float32, seed=0, scale=1.0, device=DEVICE):
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=gen) * scale).to(dtype).to(device)


def nan(*shape, dtype, device=DEVICE):
    return torch.full(shape, float("nan"), dtype=dtype, device=device)


def assert_within_one_ulp(actual, ref):
    """bf16 results of one rounding: equal, or one bf16 ulp apart (interpreter truncation)."""
    assert actual.dtype == ref.dtype and actual.shape == ref.shape
    assert torch.isfinite(actual.float()).all(), "non-finite values (an unwritten element?)"
    diff = (actual.float() - ref.float()).abs()
    ulp = ref.float().abs().clamp_min(1e-30) * 2.0**-7
    assert bool((diff <= ulp).all()), f"max diff {diff.max().item():.3e} exceeds one ulp"


def run_rmsnorm(x, w, residual, config=None, round_before_weight=False):
    T, D = x.shape
    out, new_res = nan(T, D, dtype=x.dtype, device=x.device), nan(T, D, dtype=x.dtype, device=x.device)
    rmsnorm_triton(x, w, residual, EPS, out, new_res, config=config, round_before_weight=round_before_weight)
    return out, new_res


def run_gated(o, gate, w, out_dtype=None, config=None, round_steps=False, round_before_weight=False,
              silu_gate=False, gate_fp32=False):
    out = nan(*o.shape, dtype=out_dtype or torch.float32, device=o.device)
    gated_head_rmsnorm_triton(o, gate, w, EPS, out_dtype, out, config=config, round_steps=round_steps,
                              round_before_weight=round_before_weight, silu_gate=silu_gate, gate_fp32=gate_fp32)
    return out


def check_rmsnorm(got, ref, dtype, w=None):
    """fp32: out within RTOL, the residual add exact. bf16: the residual add within one rounding,
    and out within one rounding of the reference norm of the kernel's own residual (so an
    interpreter truncation of h is not counted twice)."""
    out, new_res = (t.cpu() for t in got)       # (the references are CPU tensors)
    ref_out, ref_res = ref
    if dtype == torch.float32:
        assert_close(out, ref_out, RTOL[dtype])
        assert torch.equal(new_res, ref_res), "fp32 residual add must be exact"
    else:
        assert_within_one_ulp(new_res, ref_res)
        assert_within_one_ulp(out, rmsnorm_reference(new_res, None if w is None else w.cpu(), None, EPS)[0])
        assert_close(out, ref_out, 2 * RTOL[dtype])


# RMSNorm + residual: kernel vs reference.


@pytest.mark.parametrize("residual", [True, False], ids=["residual", "no-residual"])
@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
@pytest.mark.parametrize("D", [96, 33, 2560])
@pytest.mark.parametrize("T", [1, 6, 16])
def test_rmsnorm_kernel_matches_reference(T, D, dtype, residual):
    seed = 10 * T + D
    x = rand(T, D, dtype=dtype, seed=seed)
    r = rand(T, D, dtype=dtype, seed=seed + 1, scale=4.0) if residual else None
    w = rand(D, dtype=dtype, seed=seed + 2)
    ref = rmsnorm_reference(x.cpu(), w.cpu(), None if r is None else r.cpu(), EPS)
    check_rmsnorm(run_rmsnorm(x, w, r), ref, dtype, w)


class LlamaRMSNorm(torch.nn.Module):
    """The Hugging Face Llama RMSNorm, as many checkpoints' modeling code copies it."""

    def __init__(self, w, eps):
        super().__init__()
        self.weight, self.eps = torch.nn.Parameter(w, requires_grad=False), eps

    def forward(self, h):
        dt = h.dtype
        h = h.to(torch.float32)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(dt)


@pytest.mark.parametrize("residual", [True, False], ids=["residual", "no-residual"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("D", [96, 33, 2560])
@pytest.mark.parametrize("T", [1, 6])
def test_rmsnorm_round_before_weight_is_the_llama_form(T, D, dtype, residual):
    """round_before_weight: the reference is LlamaRMSNorm(residual + x) bit for bit; the kernel
    (NaN-poisoned outputs) within its two roundings of it (an ulp each where an fp32 value lands
    on the other side of a boundary, or where the interpreter's bf16 casts truncate)."""
    seed = 3 * T + D
    x = rand(T, D, dtype=dtype, seed=seed)
    r = rand(T, D, dtype=dtype, seed=seed + 1, scale=4.0) if residual else None
    w = rand(D, dtype=dtype, seed=seed + 2)
    ref_out, ref_res = rmsnorm_reference(x.cpu(), w.cpu(), None if r is None else r.cpu(), EPS, True)
    h = x.cpu() if r is None else r.cpu() + x.cpu()
    with torch.no_grad():
        assert torch.equal(ref_out, LlamaRMSNorm(w.cpu(), EPS)(h)) and torch.equal(ref_res, h)
    assert not torch.equal(ref_out, rmsnorm_reference(x.cpu(), w.cpu(), None if r is None else r.cpu(), EPS)[0])
    out, new_res = run_rmsnorm(x, w, r, round_before_weight=True)
    assert torch.isfinite(out.float()).all() and torch.isfinite(new_res.float()).all()
    assert_within_one_ulp(new_res.cpu(), ref_res)
    want = rmsnorm_reference(new_res.cpu(), w.cpu(), None, EPS, True)[0].float()
    assert bool(((out.cpu().float() - want).abs() <= want.abs() * 2 * 2.0 ** -7 + 1e-6).all())
    if not residual:     # the same form with the embedding gather (rows of a table)
        ids = torch.randint(0, 3 * T, (T,), generator=torch.Generator().manual_seed(seed)).to(x.device)
        table = rand(3 * T, D, dtype=dtype, seed=seed + 3)
        e_out, e_x = nan(T, D, dtype=dtype), nan(T, D, dtype=dtype)
        embedding_rmsnorm_triton(table, ids, w, EPS, e_out, e_x, round_before_weight=True)
        e_ref, e_rows = embedding_rmsnorm_reference(table.cpu(), ids.cpu(), w.cpu(), EPS, True)
        assert torch.equal(e_x.cpu(), e_rows)
        assert bool(((e_out.cpu().float() - e_ref.float()).abs() <= e_ref.float().abs() * 2 * 2.0 ** -7 + 1e-6).all())


def test_rmsnorm_kernel_prefill_rows_and_strided_inputs():
    # A prefill-sized grid (T = 300 programs) over row-strided views: x and the residual are
    # column slices of wider buffers, as fused GEMM outputs would hand them over.
    xs = rand(300, 100, seed=1)
    rs = rand(300, 120, seed=2)
    x, r, w = xs[:, 4:100], rs[:, 10:106], rand(96, seed=3)
    assert x.stride(0) == 100 and r.stride(0) == 120
    check_rmsnorm(run_rmsnorm(x, w, r), rmsnorm_reference(x.cpu(), w.cpu(), r.cpu(), EPS), torch.float32)


def test_rmsnorm_extreme_scales():
    # Rows of 1e-20 and 1e15: the fp32 sum of squares neither underflows to a zero norm nor
    # overflows (|x|^2 <= 1e30 < 3.4e38).
    x = torch.cat([rand(1, 64, seed=4) * 1e-20, rand(1, 64, seed=5) * 1e15])
    check_rmsnorm(run_rmsnorm(x, torch.ones(64, device=DEVICE), None),
                  rmsnorm_reference(x.cpu(), torch.ones(64), None, EPS), torch.float32)


# The references are the model's own math, bit for bit.


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
def test_rmsnorm_reference_is_the_decoder_math(dtype):
    # DecoderLayer: h = x + attention(...); post_attention_layernorm(h). The op on (attn_out,
    # residual = x) returns exactly (norm(h), h); without a residual, (norm(x), x).
    torch.manual_seed(0)
    norm = RMSNorm(96, EPS, dtype)
    norm.weight.data.copy_(torch.randn(96))
    for T in (1, 3, 6, 8, 17):
        stream = rand(T, 96, dtype=dtype, seed=T, device="cpu")
        attn_out = rand(T, 96, dtype=dtype, seed=T + 50, device="cpu")
        h = stream + attn_out
        out, new_res = torch.ops.lingc.rmsnorm(attn_out, norm.weight, stream, EPS)
        assert torch.equal(new_res, h) and torch.equal(out, norm(h))
        out0, res0 = torch.ops.lingc.rmsnorm(stream, norm.weight, None, EPS)
        assert torch.equal(out0, norm(stream)) and torch.equal(res0, stream)
        assert res0.data_ptr() != stream.data_ptr(), "the op must not alias its input"


def test_rmsnorm_reference_is_the_tiny_models_layer():
    # The tiny model's own layer-1 norms around a real attention output.
    from model_helpers import tiny_model

    from lingc.models import Ling3Cache

    model = tiny_model(seed=3)
    layer = model.target_layers[1]
    cache = Ling3Cache.allocate(model.config, 16)
    x = rand(4, 96, seed=7, device="cpu")
    positions = torch.arange(4)
    normed = layer.input_layernorm(x)
    attn = layer.attention(normed, positions, cache)
    h = x + attn
    out, new_res = torch.ops.lingc.rmsnorm(attn, layer.post_attention_layernorm.weight, x, EPS)
    assert torch.equal(new_res, h) and torch.equal(out, layer.post_attention_layernorm(h))


@pytest.mark.parametrize("H,V", [(4, 16), (8, 128)])
@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
def test_gated_reference_is_kda_math(H, V, dtype):
    # Row by row equals the model's whole-T call at Ling-3's and the tiny preset's head shapes.
    for T in (1, 6, 8):
        o, g, w = rand(T, H, V, seed=T), rand(T, H, V, dtype=dtype, seed=T + 1), rand(V, dtype=dtype, seed=T + 2)
        o, g, w = o.cpu(), g.cpu(), w.cpu()
        want = model_gated_head_rmsnorm(o, w, g, EPS)
        assert torch.equal(gated_head_rmsnorm_reference(o, g, w, EPS), want)
        assert torch.equal(torch.ops.lingc.gated_head_rmsnorm(o, g, w, EPS, torch.bfloat16), want.to(torch.bfloat16))


# Gated head norm: kernel vs reference.


@pytest.mark.parametrize("out_dtype", [None, torch.bfloat16], ids=["fp32-out", "bf16-out"])
@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
@pytest.mark.parametrize("H,V", [(4, 16), (8, 128), (3, 24)])
@pytest.mark.parametrize("T", [1, 6, 8])
def test_gated_kernel_matches_reference(T, H, V, dtype, out_dtype):
    seed = 100 * T + H + V
    o, g, w = rand(T, H, V, seed=seed), rand(T, H, V, dtype=dtype, seed=seed + 1), rand(V, dtype=dtype, seed=seed + 2)
    got = run_gated(o, g, w, out_dtype)
    want = gated_head_rmsnorm_reference(o.cpu(), g.cpu(), w.cpu(), EPS, out_dtype)
    if out_dtype is None:
        assert_close(got, want, RTOL[torch.float32])
    else:
        assert_within_one_ulp(got.cpu(), want)


def eager_gated_in_steps(o, g, w, dt, llama=False):
    """KDA's output norm as a 16-bit model writes it: nn.RMSNorm of o.to(dt), times sigmoid(g)
    (``llama``: the head norm the Hugging Face Llama way, ``w * normed.to(dt)``)."""
    if llama:
        x = o.to(dt).float()
        return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS)).to(dt) * torch.sigmoid(g)
    norm = torch.nn.RMSNorm(o.shape[-1], eps=EPS, dtype=dt)
    with torch.no_grad():
        norm.weight.copy_(w)
        return norm(o.to(dt)) * torch.sigmoid(g)


@pytest.mark.parametrize("dt", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("o_dtype", ["fp32", "lo"])
@pytest.mark.parametrize("H,V", [(4, 16), (3, 24), (8, 128)])
@pytest.mark.parametrize("T", [1, 6])
@pytest.mark.parametrize("llama", [False, True], ids=["nn-rmsnorm", "llama"])
def test_gated_round_steps_matches_eager_16bit_form(T, H, V, o_dtype, dt, llama):
    """round_steps: o (fp32 from the KDA chain, or already in the 16-bit dtype) read in dt, the
    weighted norm and the gate rounded to dt before their product (``llama``, round_before_weight:
    the normed head rounded before the weight too). The reference is eager's
    nn.RMSNorm(o.to(dt)) * sigmoid(g) (or the Llama spelling) bit for bit on the CPU; the kernel
    (NaN-poisoned output) within its four or five roundings of it: an ulp each (2^-7 relative in
    bf16) where an fp32 value lands on the other side of a rounding boundary, or where the Triton
    interpreter's casts to bfloat16 truncate (it does not round to nearest, as the GPU does)."""
    seed = 7 * T + H + V
    o, g, w = rand(T, H, V, seed=seed), rand(T, H, V, dtype=dt, seed=seed + 1), rand(V, dtype=dt, seed=seed + 2)
    if o_dtype == "lo":
        o = o.to(dt)
    want = gated_head_rmsnorm_reference(o.cpu(), g.cpu(), w.cpu(), EPS, dt, round_steps=True, round_before_weight=llama)
    assert torch.equal(want, eager_gated_in_steps(o.cpu(), g.cpu(), w.cpu(), dt, llama))
    # Not the one-rounding form (nor, for llama, the nn.RMSNorm steps): the roundings show.
    assert not torch.equal(want, gated_head_rmsnorm_reference(o.cpu(), g.cpu(), w.cpu(), EPS, dt))
    if llama:
        assert not torch.equal(want, gated_head_rmsnorm_reference(o.cpu(), g.cpu(), w.cpu(), EPS, dt, True))
    got = run_gated(o, g, w, dt, round_steps=True, round_before_weight=llama)
    diff = (got.cpu().float() - want.float()).abs()
    assert torch.isfinite(got.float()).all()
    steps = 5 if llama else 4
    assert bool((diff <= want.float().abs() * steps * 2.0 ** -7 + 1e-6).all()), f"max diff {diff.max().item():.3e}"
    # The op: the reference on the CPU, the kernel on CUDA.
    assert torch.equal(torch.ops.lingc.gated_head_rmsnorm(o, g, w, EPS, dt, True, llama).cpu(),
                       got.cpu() if o.is_cuda else want)


@pytest.mark.parametrize("out_dtype", [None, torch.bfloat16], ids=["fp32-out", "bf16-out"])
@pytest.mark.parametrize("T,H,V", [(1, 4, 16), (6, 8, 128), (3, 3, 24)])
def test_gated_silu_gate_is_gated_deltanets_output_norm(T, H, V, out_dtype):
    """silu_gate: rms(o) * w * silu(g) in fp32, rounded once (flash-linear-attention's
    FusedRMSNormGated with swish, as Gated DeltaNet's layer writes it): the reference is that
    formula, the kernel's rows (NaN-poisoned) match it, and it is not the sigmoid form."""
    o, g = rand(T, H, V, seed=120 + T), rand(T, H, V, seed=121 + T, scale=2.0)
    w = rand(V, seed=122 + T)
    oc, gc, wc = o.cpu(), g.cpu(), w.cpu()
    want = oc * torch.rsqrt(oc.pow(2).mean(-1, keepdim=True) + EPS) * wc * torch.nn.functional.silu(gc)
    want = want if out_dtype is None else want.to(out_dtype)
    ref = gated_head_rmsnorm_reference(oc, gc, wc, EPS, out_dtype, silu_gate=True)
    assert_close(ref, want, 1e-6)
    out = nan(T, H, V, dtype=out_dtype or torch.float32)
    gated_head_rmsnorm_triton(o, g, w, EPS, out_dtype, out, silu_gate=True)
    assert_close(out.cpu(), want, RTOL[torch.float32] if out_dtype is None else 2 * RTOL[torch.bfloat16])
    assert not torch.allclose(ref.float(), gated_head_rmsnorm_reference(oc, gc, wc, EPS, out_dtype).float(), rtol=1e-2)
    assert torch.equal(gated_head_rmsnorm(o, g, w, EPS, out_dtype, silu_gate=True).cpu(),
                       out.cpu() if o.is_cuda else ref)


@pytest.mark.parametrize("T,H,V", [(1, 4, 16), (6, 8, 128)])
def test_gated_silu_gate_in_16bit_steps(T, H, V):
    """silu_gate with round_steps: a bf16 model's nn.RMSNorm(o.to(bf16)) * F.silu(g), each step
    rounded (the reference that eager spelling bit for bit; the kernel, NaN-poisoned, within its
    four roundings of it)."""
    dt = torch.bfloat16
    o, g, w = rand(T, H, V, seed=130 + T), rand(T, H, V, dtype=dt, seed=131 + T), rand(V, dtype=dt, seed=132 + T)
    want = gated_head_rmsnorm_reference(o.cpu(), g.cpu(), w.cpu(), EPS, dt, round_steps=True, silu_gate=True)
    norm = torch.nn.RMSNorm(V, eps=EPS, dtype=dt)
    with torch.no_grad():
        norm.weight.copy_(w.cpu())
        assert torch.equal(want, norm(o.cpu().to(dt)) * torch.nn.functional.silu(g.cpu()))
    got = run_gated(o, g, w, dt, round_steps=True, silu_gate=True)
    diff = (got.cpu().float() - want.float()).abs()
    assert torch.isfinite(got.float()).all()
    assert bool((diff <= want.float().abs() * 4 * 2.0 ** -7 + 1e-6).all()), f"max diff {diff.max().item():.3e}"


@pytest.mark.parametrize("T,H,V", [(1, 4, 16), (6, 8, 128), (3, 3, 24)])
def test_gated_qwen3_next_form(T, H, V):
    """gate_fp32 (with round_steps, round_before_weight, silu_gate): Hugging Face's
    Qwen3NextRMSNormGated in bf16, ``(w * normed.to(dt)) * silu(gate.float())`` then ``.to(dt)``:
    the reference is that spelling bit for bit, the kernel (NaN-poisoned) within its roundings,
    and it is not the all-bf16 form."""
    dt = torch.bfloat16
    o, g, w = rand(T, H, V, seed=140 + T), rand(T, H, V, dtype=dt, seed=141 + T), rand(V, dtype=dt, seed=142 + T)
    oc, gc, wc = o.cpu(), g.cpu(), w.cpu()
    x = oc.to(dt).float()
    hf = ((wc * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS)).to(dt))
          * torch.nn.functional.silu(gc.float())).to(dt)
    flags = dict(round_steps=True, round_before_weight=True, silu_gate=True)
    want = gated_head_rmsnorm_reference(oc, gc, wc, EPS, dt, **flags, gate_fp32=True)
    assert torch.equal(want, hf)
    assert not torch.equal(want, gated_head_rmsnorm_reference(oc, gc, wc, EPS, dt, **flags))
    got = run_gated(o, g, w, dt, **flags, gate_fp32=True)
    diff = (got.cpu().float() - want.float()).abs()
    assert torch.isfinite(got.float()).all()
    assert bool((diff <= want.float().abs() * 4 * 2.0 ** -7 + 1e-6).all()), f"max diff {diff.max().item():.3e}"
    with pytest.raises(ValueError, match="gate_fp32 .* is a form of round_steps"):
        torch.ops.lingc.gated_head_rmsnorm(o, g, w, EPS, dt, gate_fp32=True)


def test_gated_kernel_strided_gate_and_prefill():
    # The gate is a column slice of a fused q/k/v/f/g/b projection output [T, 5*H*V + H], viewed
    # [T, H, V]; T = 40 rows is a prefill-sized grid; H = 5 with BH = 4 leaves a partial block.
    T, H, V = 40, 5, 16
    fused = rand(T, 5 * H * V + H, dtype=torch.bfloat16, seed=11)
    g = fused[:, 4 * H * V:5 * H * V].view(T, H, V)
    o, w = rand(T, H, V, seed=12), rand(V, dtype=torch.bfloat16, seed=13)
    cfg = NormConfig(block=16, heads=4)
    got = run_gated(o, g, w, config=cfg)
    assert_close(got, gated_head_rmsnorm_reference(o.cpu(), g.cpu(), w.cpu(), EPS), RTOL[torch.float32])


@pytest.mark.parametrize("T,groups,G,V", [(1, 4, 2, 16), (3, 2, 3, 24)])
def test_gated_kernel_head_grouped_gate(T, groups, G, V):
    """A head-grouped gate: Qwen3-Next's z, the [T, groups, G * V] piece of each q/k head's group
    in its fused projection's output (groups 7 * G * V apart here), read as the [T, H, V] rows it
    holds (H = groups * G) with no copy; the kernel (NaN-poisoned) against the reference on its
    reshape, and the op on the CPU likewise."""
    H = groups * G
    fused = rand(T, groups, 7 * G * V, dtype=torch.bfloat16, seed=150 + T)
    z = fused[:, :, 3 * G * V:4 * G * V]                        # [T, groups, G * V], no [T, H, V] view of it
    o, w = rand(T, H, V, seed=151 + T), rand(V, dtype=torch.bfloat16, seed=152 + T)
    want = gated_head_rmsnorm_reference(o.cpu(), z.cpu().reshape(T, H, V), w.cpu(), EPS, silu_gate=True)
    got = run_gated(o, z, w, silu_gate=True, config=NormConfig(block=32, heads=4))
    assert_close(got, want, RTOL[torch.float32])
    assert torch.equal(gated_head_rmsnorm(o.cpu(), z.cpu(), w.cpu(), EPS, silu_gate=True), want)


# Batch invariance in T.


def test_kernels_batch_invariant_in_T():
    x, r, w = rand(8, 2560, dtype=torch.bfloat16, seed=21), rand(8, 2560, dtype=torch.bfloat16, seed=22), \
        rand(2560, dtype=torch.bfloat16, seed=23)
    o, g = rand(8, 8, 128, seed=24), rand(8, 8, 128, dtype=torch.bfloat16, seed=25)
    wg = rand(128, dtype=torch.bfloat16, seed=26)
    full = run_rmsnorm(x, w, r)
    full_g = run_gated(o, g, wg)
    for n in range(1, 8):
        part = run_rmsnorm(x[:n], w, r[:n])
        assert torch.equal(part[0], full[0][:n]) and torch.equal(part[1], full[1][:n]), f"rmsnorm T={n}"
        assert torch.equal(run_gated(o[:n], g[:n], wg), full_g[:n]), f"gated T={n}"
        # Row n-1 alone (a decode of that position) is the same row of the chain.
        one = run_rmsnorm(x[n - 1:n], w, r[n - 1:n])
        assert torch.equal(one[0], full[0][n - 1:n])


@pytest.mark.parametrize("H,V", [(3, 24), (2, 5)])
def test_references_batch_invariant_in_T(H, V):
    # Odd head shapes, where torch's whole-T sigmoid would not be invariant (naive.py).
    x, r, w = rand(8, 33, seed=31, device="cpu"), rand(8, 33, seed=32, device="cpu"), rand(33, seed=33, device="cpu")
    o, g = rand(8, H, V, seed=34, device="cpu"), rand(8, H, V, seed=35, device="cpu")
    wg = rand(V, seed=36, device="cpu")
    full, full_g = rmsnorm_reference(x, w, r, EPS), gated_head_rmsnorm_reference(o, g, wg, EPS)
    for n in range(1, 9):
        part = rmsnorm_reference(x[:n], w, r[:n], EPS)
        assert torch.equal(part[0], full[0][:n]) and torch.equal(part[1], full[1][:n])
        assert torch.equal(gated_head_rmsnorm_reference(o[:n], g[:n], wg, EPS), full_g[:n])


# A broken kernel must fail the checks above.


def test_broken_kernels_are_caught():
    # A tile narrower than the row leaves lanes unwritten (NaN) and normalises by a partial sum;
    # a kernel that skips the residual add returns the wrong norm and stream.
    x, r, w = rand(3, 96, seed=41), rand(3, 96, seed=42), rand(96, seed=43)
    ref = rmsnorm_reference(x.cpu(), w.cpu(), r.cpu(), EPS)
    with pytest.raises(AssertionError, match="non-finite"):
        check_rmsnorm(run_rmsnorm(x, w, r, config=NormConfig(block=64, num_warps=1)), ref, torch.float32)
    with pytest.raises(AssertionError, match="relative RMS error"):
        check_rmsnorm(run_rmsnorm(x, w, None), ref, torch.float32)
    o, g, wg = rand(2, 4, 16, seed=44), rand(2, 4, 16, seed=45), rand(16, seed=46)
    with pytest.raises(AssertionError, match="non-finite"):
        assert_close(run_gated(o, g, wg, config=NormConfig(block=8, heads=4)),
                     gated_head_rmsnorm_reference(o.cpu(), g.cpu(), wg.cpu(), EPS), 1e-6)


# The ops: dispatch, fake impls, compile, argument checks.


def test_ops_dispatch_and_compile():
    x, r, w = rand(6, 96, seed=51), rand(6, 96, seed=52), rand(96, seed=53)
    o, g, wg = rand(6, 4, 16, seed=54), rand(6, 4, 16, seed=55), rand(16, seed=56)

    def step(x, r, o, g):
        out, h = torch.ops.lingc.rmsnorm(x, w, r, EPS)
        y = torch.ops.lingc.gated_head_rmsnorm(o, g, wg, EPS, torch.bfloat16)
        return out, h, y

    eager = step(x, r, o, g)
    compiled = torch.compile(step, backend="aot_eager", fullgraph=True)(x, r, o, g)
    for a, b in zip(eager, compiled):
        assert torch.equal(a, b)
    assert eager[2].dtype == torch.bfloat16
    check_rmsnorm(eager[:2], rmsnorm_reference(x.cpu(), w.cpu(), r.cpu(), EPS), torch.float32)


def test_fake_impls():
    with FakeTensorMode():
        x, w = torch.empty(6, 2560, dtype=torch.bfloat16)[:, :2000], torch.empty(2000, dtype=torch.bfloat16)
        out, h = torch.ops.lingc.rmsnorm(x, w, None, EPS)
        assert out.shape == h.shape == (6, 2000) and out.dtype == torch.bfloat16 and out.is_contiguous()
        y = torch.ops.lingc.gated_head_rmsnorm(torch.empty(6, 8, 128), torch.empty(6, 8, 128, dtype=torch.bfloat16),
                                               torch.empty(128, dtype=torch.bfloat16), EPS)
        assert y.shape == (6, 8, 128) and y.dtype == torch.float32
        with pytest.raises(ValueError, match="residual.dtype"):
            torch.ops.lingc.rmsnorm(x, w, torch.empty(6, 2000), EPS)


def test_rmsnorm_round_before_weight_needs_the_weight_in_xs_dtype():
    with pytest.raises(ValueError, match="weight.dtype torch.float32 differs from x.dtype torch.bfloat16"):
        rmsnorm(torch.zeros(2, 8, dtype=torch.bfloat16), torch.ones(8), None, EPS, True)


@pytest.mark.parametrize("kwargs,match", [
    (dict(x=torch.zeros(2, 3, 8)), r"x must be \[T, D\] .* got shape \(2, 3, 8\)"),
    (dict(x=torch.zeros(2, 8, dtype=torch.int32)), "x.dtype must be .* got torch.int32"),
    (dict(x=torch.zeros(8, 2).t()), "unit stride along D"),
    (dict(weight=torch.zeros(7)), r"weight must be \[D\] = \(8,\), got \(7,\)"),
    (dict(weight=torch.zeros(16)[::2]), "weight must be contiguous"),
    (dict(residual=torch.zeros(3, 8)), r"residual must have x's shape \(2, 8\), got \(3, 8\)"),
    (dict(residual=torch.zeros(2, 8, dtype=torch.bfloat16)), "residual.dtype torch.bfloat16 differs"),
    (dict(eps=-1.0), "eps must be .* got -1.0"),
    (dict(x=torch.zeros(2, 20000), weight=torch.zeros(20000)), "D = 20000 must be in 1..16384"),
])
def test_rmsnorm_bad_arguments_raise(kwargs, match):
    args = dict(x=torch.zeros(2, 8), weight=torch.ones(8), residual=None, eps=EPS)
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        rmsnorm(**args)


@pytest.mark.parametrize("kwargs,match", [
    (dict(o=torch.zeros(2, 64)), r"o must be \[T, H, V\] .* got shape \(2, 64\)"),
    (dict(gate=torch.zeros(2, 4, 8)), r"gate must be \[T, H, V\] = \(2, 4, 16\), got \(2, 4, 8\)"),
    (dict(gate=torch.zeros(2, 2, 24)), r"gate must be \[T, H, V\] = \(2, 4, 16\), got \(2, 2, 24\)"),
    (dict(weight=torch.zeros(4)), r"weight must be \[V\] = \(16,\), got \(4,\)"),
    (dict(weight=torch.zeros(32)[::2]), "weight must be contiguous"),
    (dict(gate=torch.zeros(2, 4, 16, dtype=torch.int64)), "gate.dtype must be .* got torch.int64"),
    (dict(gate=torch.zeros(2, 16, 4).transpose(1, 2)), "gate must have unit stride along V"),
    (dict(out_dtype=torch.int8), "out_dtype must be .* got torch.int8"),
    (dict(eps=float("nan")), "eps must be .* got nan"),
    (dict(round_steps=True), "round_steps rounds each step to a 16-bit out_dtype .* got out_dtype=None"),
    (dict(round_steps=True, out_dtype=torch.bfloat16), "gate.dtype=torch.float32"),
    (dict(round_before_weight=True), "round_before_weight .* needs round_steps and the weight in out_dtype; "
                                     "got round_steps=False"),
    (dict(round_before_weight=True, round_steps=True, out_dtype=torch.bfloat16,
          gate=torch.zeros(2, 4, 16, dtype=torch.bfloat16)), "weight.dtype=torch.float32, out_dtype=torch.bfloat16"),
])
def test_gated_bad_arguments_raise(kwargs, match):
    args = dict(o=torch.zeros(2, 4, 16), gate=torch.zeros(2, 4, 16), weight=torch.ones(16), eps=EPS)
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        gated_head_rmsnorm(**args)


def test_configs_depend_on_shape_only():
    assert rmsnorm_config(2560) == NormConfig(block=4096, num_warps=8)
    assert gated_config(8, 128) == NormConfig(block=128, heads=4, num_warps=2)
    assert gated_config(4, 16).heads == 4


_COMPILE_CHECK = textwrap.dedent("""
    from sm90 import compile_sm90
    from lingc.runtime.kernels.norms.kernel import (_rmsnorm_kernel, _rmsnorm_pair_kernel,
                                                    _gated_head_rmsnorm_kernel, rmsnorm_config, gated_config)

    def check(fn, sig, const, num_warps):
        ptx, info = compile_sm90(fn, sig, const, num_warps=num_warps)
        wait = ptx.index("griddepcontrol.wait")
        assert ptx.index("ld.global") < wait, "the weight load must be issued before the wait"
        assert " 0 bytes spill stores" in info, info

    c = rmsnorm_config(2560)
    for has_res, gather, rbw, has_w in ((False, False, False, True), (True, False, False, True),
                                        (False, True, False, True), (True, False, True, True),
                                        (True, False, False, False)):
        sig = dict(x_ptr="*bf16", ids_ptr="*i64", res_ptr="*bf16", w_ptr="*bf16", out_ptr="*bf16",
                   new_res_ptr="*bf16", stride_x="i32", stride_r="i32", D="i32", eps="fp32")
        const = dict(BLOCK=c.block, HAS_RESIDUAL=has_res, GATHER=gather, USE_GDC=True, ROUND_BEFORE_WEIGHT=rbw,
                     NO_WEIGHT=not has_w)
        if has_w:
            check(_rmsnorm_kernel, sig, const, c.num_warps)
        else:       # no weight to load: only the wait, no spills
            ptx, info = compile_sm90(_rmsnorm_kernel, sig, const, num_warps=c.num_warps)
            assert "griddepcontrol.wait" in ptx and " 0 bytes spill stores" in info, info
    for has_res, gather in ((True, False), (False, True)):
        const = dict(BLOCK=c.block, HAS_RESIDUAL=has_res, GATHER=gather, USE_GDC=True, ZERO_CENTERED=True)
        check(_rmsnorm_kernel, sig, const, c.num_warps)
    for gather, rbw in ((True, False), (False, False), (True, True)):
        sig = dict(a_ptr="*bf16", ids_ptr="*i64", wa_ptr="*bf16", b_ptr="*bf16", wb_ptr="*bf16", out_ptr="*bf16",
                   stride_a="i32", stride_b="i32", D="i32", eps_a="fp32", eps_b="fp32")
        check(_rmsnorm_pair_kernel, sig, dict(BLOCK=c.block, GATHER=gather, USE_GDC=True, ROUND_BEFORE_WEIGHT=rbw),
              c.num_warps)
    g = gated_config(8, 128)
    sig = dict(o_ptr="*fp32", g_ptr="*bf16", w_ptr="*bf16", out_ptr="*bf16", stride_ot="i32", stride_oh="i32",
               stride_gt="i32", stride_gh="i32", gate_group="i32", H="i32", V="i32", eps="fp32")
    for round_steps, rbw, silu, f32 in ((False, False, False, False), (True, False, False, False),
                                        (True, True, False, False), (False, False, True, False),
                                        (True, False, True, False), (True, True, True, True)):
        check(_gated_head_rmsnorm_kernel, sig, dict(BH=g.heads, BV=g.block, USE_GDC=True, ROUND_STEPS=round_steps,
                                                    ROUND_BEFORE_WEIGHT=rbw, SILU_GATE=silu, GATE_FP32=f32),
              g.num_warps)
""")


def test_kernels_compile_for_sm90_with_weights_before_the_wait():
    # The real compile for an H200 at flash-tp4-rank shapes with the bundled ptxas: PDL wait
    # present, the first global load (the weight) issued before it, no spills.
    run_sm90_compile_check(_COMPILE_CHECK)


# GPU: flash-tp4-rank shapes, PDL inside a CUDA graph.


@pytest.mark.gpu
@pytest.mark.parametrize("T", [1, 6, 8, 512])
def test_gpu_flash_shapes_match_reference(T):
    x, r, w = rand(T, 2560, dtype=torch.bfloat16, seed=61), rand(T, 2560, dtype=torch.bfloat16, seed=62), \
        rand(2560, dtype=torch.bfloat16, seed=63)
    out, h = torch.ops.lingc.rmsnorm(x, w, r, EPS)
    ref_out, ref_h = rmsnorm_reference(x.cpu(), w.cpu(), r.cpu(), EPS)
    assert torch.equal(h.cpu(), ref_h), "the bf16 residual add is one rounding on both sides"
    assert_close(out, ref_out, RTOL[torch.bfloat16])
    llama = rmsnorm_reference(x.cpu(), w.cpu(), r.cpu(), EPS, True)[0].float()
    got = torch.ops.lingc.rmsnorm(x, w, r, EPS, True)[0].cpu().float()
    assert bool(((got - llama).abs() <= llama.abs() * 2.0 ** -7 + 1e-6).all())
    o, g = rand(T, 8, 128, seed=64), rand(T, 8, 128, dtype=torch.bfloat16, seed=65)
    wg = rand(128, dtype=torch.bfloat16, seed=66)
    want = gated_head_rmsnorm_reference(o.cpu(), g.cpu(), wg.cpu(), EPS)
    assert_close(torch.ops.lingc.gated_head_rmsnorm(o, g, wg, EPS), want, 1e-5)
    steps = gated_head_rmsnorm_reference(o.cpu(), g.cpu(), wg.cpu(), EPS, torch.bfloat16, round_steps=True)
    got = torch.ops.lingc.gated_head_rmsnorm(o, g, wg, EPS, torch.bfloat16, True).cpu().float()
    assert bool(((got - steps.float()).abs() <= steps.float().abs() * 2.0 ** -7 + 1e-6).all())
    llama = gated_head_rmsnorm_reference(o.cpu(), g.cpu(), wg.cpu(), EPS, torch.bfloat16, True, True)
    got = torch.ops.lingc.gated_head_rmsnorm(o, g, wg, EPS, torch.bfloat16, True, True).cpu().float()
    assert bool(((got - llama.float()).abs() <= llama.float().abs() * 2 * 2.0 ** -7 + 1e-6).all())


@pytest.mark.gpu
def test_gpu_pdl_chain_under_graph_capture():
    # A layer's norms as a chain: input norm (no residual) -> gated norm -> residual norm, each
    # reading its predecessor's output: 3 kernels, 2 programmatic edges; replays equal eager.
    if not pdl_supported(DEVICE):
        pytest.skip("PDL needs compute capability >= 9")
    x, w = rand(6, 2560, dtype=torch.bfloat16, seed=71), rand(2560, dtype=torch.bfloat16, seed=72)
    wg = rand(128, dtype=torch.bfloat16, seed=73)

    def chain(inp):
        n0, h0 = torch.ops.lingc.rmsnorm(inp, w, None, EPS)
        y = torch.ops.lingc.gated_head_rmsnorm(n0[:, :1024].view(6, 8, 128), n0[:, 1024:2048].view(6, 8, 128),
                                               wg, EPS, torch.bfloat16)
        return torch.ops.lingc.rmsnorm(y.view(6, 1024), w[:1024], h0[:, :1024], EPS)

    static_x = x.clone()
    eager = chain(static_x)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph(keep_graph=True)
    with torch.cuda.graph(graph):
        static_out = chain(static_x)
    types = graph_edge_types(graph)
    assert types == [1, 1], f"edge types {types}, expected 2 programmatic edges"
    graph.instantiate()
    graph.replay()
    torch.cuda.synchronize()
    for got, want in zip(static_out, eager):
        assert torch.equal(got, want)


# The token embedding gather fused into the first RMSNorm (GATHER): kernel vs reference.


@pytest.mark.parametrize("ids_dtype", [torch.int64, torch.int32], ids=["i64", "i32"])
@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
@pytest.mark.parametrize("D", [96, 33, 2560])
@pytest.mark.parametrize("T", [1, 6, 16])
def test_embedding_rmsnorm_kernel_matches_reference(T, D, dtype, ids_dtype):
    # A table wider than D (a row stride past D), repeated ids and the last row; poisoned outputs.
    V = 37
    table = rand(V, D + 8, dtype=dtype, seed=T * 100 + D)[:, :D]
    ids = torch.randint(0, V, (T,), generator=torch.Generator().manual_seed(T + D))
    ids[0], ids[-1] = V - 1, ids[0] if T > 1 else V - 1
    ids = ids.to(ids_dtype).to(DEVICE)
    w = rand(D, dtype=dtype, seed=D + 7)
    out, x = nan(T, D, dtype=dtype), nan(T, D, dtype=dtype)
    embedding_rmsnorm_triton(table, ids, w, EPS, out, x)
    ref = embedding_rmsnorm_reference(table.cpu(), ids.cpu(), w.cpu(), EPS)
    assert torch.equal(x.cpu(), ref[1]), "the gathered rows are the table's rows, bit for bit"
    check_rmsnorm((out, x), ref, dtype, w)
    # and the same bits as the plain norm of the gathered rows (what it replaces in a graph)
    plain = run_rmsnorm(ref[1].to(DEVICE), w, None)
    assert torch.equal(out, plain[0])


def test_embedding_rmsnorm_op_and_fake():
    table, w = rand(40, 96, seed=61), rand(96, seed=62)
    ids = torch.tensor([5, 39, 0, 5], device=DEVICE)
    out, x = embedding_rmsnorm(table, ids, w, EPS)
    ref = embedding_rmsnorm_reference(table.cpu(), ids.cpu(), w.cpu(), EPS)
    assert torch.equal(x.cpu(), ref[1])
    check_rmsnorm((out, x), ref, torch.float32)
    with FakeTensorMode():
        o, h = torch.ops.lingc.embedding_rmsnorm(torch.empty(40, 96, dtype=torch.bfloat16),
                                                 torch.empty(6, dtype=torch.int64), torch.empty(96), EPS)
        assert o.shape == h.shape == (6, 96) and o.dtype == h.dtype == torch.bfloat16


@pytest.mark.parametrize("kwargs,match", [
    (dict(table=torch.zeros(2, 5, 8)), r"table must be the \[V, D\] embedding weight, got shape \(2, 5, 8\)"),
    (dict(ids=torch.zeros(1, 3, dtype=torch.int64)), r"ids must be \[T\] token ids .* got shape \(1, 3\)"),
    (dict(ids=torch.zeros(3)), "ids must be int32 or int64 token ids, got torch.float32"),
    (dict(weight=torch.zeros(7)), r"weight must be \[D\] = \(8,\), got \(7,\)"),
    (dict(eps=-1.0), "eps must be .* got -1.0"),
])
def test_embedding_rmsnorm_bad_arguments_raise(kwargs, match):
    args = dict(table=torch.zeros(10, 8), ids=torch.zeros(3, dtype=torch.int64), weight=torch.ones(8), eps=EPS)
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        embedding_rmsnorm(**args)


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
@pytest.mark.parametrize("T,D,residual", [(1, 96, True), (6, 33, False), (2, 2560, True)])
def test_rmsnorm_without_a_weight(T, D, dtype, residual):
    """weight None (a norm without a gain): the kernel's rows and residual against the reference,
    whose rows are eager's (x * rsqrt(mean(x^2) + eps)).to(dtype); outputs NaN-poisoned."""
    x = rand(T, D, dtype=dtype, seed=61 + T)
    r = rand(T, D, dtype=dtype, seed=62 + T) if residual else None
    out, new_res = run_rmsnorm(x, None, r)
    ref_out, ref_h = rmsnorm_reference(x.cpu(), None, None if r is None else r.cpu(), EPS)
    hf = ref_h.float()
    assert torch.equal(ref_out, (hf * torch.rsqrt(hf.pow(2).mean(-1, keepdim=True) + EPS)).to(dtype))
    check_rmsnorm((out, new_res), (ref_out, ref_h), dtype)
    y, h = torch.ops.lingc.rmsnorm(x, None, r, EPS)
    assert torch.equal(y.cpu(), out.cpu() if x.is_cuda else ref_out)


class ZeroCenteredRMSNorm(torch.nn.Module):
    """Gemma's and Qwen3-Next's RMSNorm, as their modeling code writes it: a zero-centred weight,
    the gain 1 + weight in fp32, the row rounded once."""

    def __init__(self, w, eps):
        super().__init__()
        self.weight, self.eps = torch.nn.Parameter(w, requires_grad=False), eps

    def forward(self, x):
        xf = x.float()
        out = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (out * (1.0 + self.weight.float())).type_as(x)


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
@pytest.mark.parametrize("T,D,residual", [(1, 96, True), (6, 33, False), (16, 2560, True)])
def test_rmsnorm_zero_centered_is_the_gemma_form(T, D, dtype, residual):
    """zero_centered: the gain 1 + w (w drawn small, as a trained zero-centred weight is): the
    reference is the Gemma module's bits, the kernel's rows (NaN-poisoned) match it, and the op's
    CPU path is the reference; rmsnorm_out writes the same rows."""
    x = rand(T, D, dtype=dtype, seed=81 + T)
    r = rand(T, D, dtype=dtype, seed=82 + T, scale=4.0) if residual else None
    w = rand(D, dtype=dtype, seed=83 + T, scale=0.1)
    ref_out, ref_h = rmsnorm_reference(x.cpu(), w.cpu(), None if r is None else r.cpu(), EPS, zero_centered=True)
    with torch.no_grad():
        assert torch.equal(ref_out, ZeroCenteredRMSNorm(w.cpu(), EPS)(ref_h))
    T_, D_ = x.shape
    out, new_res = nan(T_, D_, dtype=dtype), nan(T_, D_, dtype=dtype)
    rmsnorm_triton(x, w, r, EPS, out, new_res, zero_centered=True)
    out, new_res = out.cpu(), new_res.cpu()
    if dtype == torch.float32:
        assert_close(out, ref_out, RTOL[dtype])
        assert torch.equal(new_res, ref_h), "fp32 residual add must be exact"
    else:                   # one rounding each, against the reference of the kernel's own residual
        assert_within_one_ulp(new_res, ref_h)
        assert_within_one_ulp(out, rmsnorm_reference(new_res, w.cpu(), None, EPS, zero_centered=True)[0])
        assert_close(out, ref_out, 2 * RTOL[dtype])
    y, h = torch.ops.lingc.rmsnorm(x, w, r, EPS, zero_centered=True)
    if not x.is_cuda:
        assert torch.equal(y, ref_out) and torch.equal(h, ref_h)
    buf = nan(T_, D_, dtype=dtype)
    h2 = torch.ops.lingc.rmsnorm_out(x, w, r, EPS, buf, zero_centered=True)
    assert torch.equal(buf, y) and torch.equal(h2, h)
    if r is None:           # the gather form: the rows of x as table rows, in another order
        ids = torch.randperm(T_, generator=torch.Generator().manual_seed(T_)).to(x.device)
        ey, ex = torch.ops.lingc.embedding_rmsnorm(x, ids, w, EPS, zero_centered=True)
        assert torch.equal(ex, x[ids]) and torch.equal(ey, y[ids])


@pytest.mark.parametrize("kwargs,match", [
    (dict(weight=None, zero_centered=True), "zero_centered .* needs a weight"),
    (dict(round_before_weight=True, zero_centered=True), "zero_centered .* round_before_weight=True"),
])
def test_rmsnorm_zero_centered_bad_arguments_raise(kwargs, match):
    args = dict(x=torch.randn(2, 8), weight=torch.randn(8), residual=None, eps=EPS) | kwargs
    with pytest.raises(ValueError, match=match):
        torch.ops.lingc.rmsnorm(**args)
    with pytest.raises(ValueError, match=match):
        torch.ops.lingc.rmsnorm_out(**args, out=torch.empty(2, 8))


def test_weightless_norm_is_refused_where_a_weight_is_needed():
    x = torch.randn(2, 8)
    with pytest.raises(ValueError, match="round_before_weight is a weighted form"):
        torch.ops.lingc.rmsnorm(x, None, None, EPS, True)
    with pytest.raises(ValueError, match="this op needs the norm weight"):
        torch.ops.lingc.embedding_rmsnorm(torch.zeros(10, 8), torch.zeros(2, dtype=torch.int64), None, EPS)


# rmsnorm_out: the in-place variant pdl_glue.direct_lingc_writes emits (the verify graph's final
# norm written straight into relay.vhid).


@pytest.mark.parametrize("T,D,dtype,residual", [(1, 96, torch.float32, True), (6, 2560, torch.bfloat16, True),
                                                (3, 130, torch.float16, False)])
@pytest.mark.parametrize("llama", [False, True], ids=["one-rounding", "llama"])
def test_rmsnorm_out_writes_the_same_bits_into_out(T, D, dtype, residual, llama):
    x, w = rand(T, D, dtype=dtype, seed=71), rand(D, dtype=dtype, seed=72)
    r = rand(T, D, dtype=dtype, seed=73) if residual else None
    want_out, want_h = torch.ops.lingc.rmsnorm(x, w, r, EPS, round_before_weight=llama)
    out = nan(T, D, dtype=dtype)
    h = torch.ops.lingc.rmsnorm_out(x, w, r, EPS, out, round_before_weight=llama)
    assert torch.equal(out, want_out) and torch.equal(h, want_h)
    torch.library.opcheck(torch.ops.lingc.rmsnorm_out.default, (x, w, r, EPS, nan(T, D, dtype=dtype), llama))


@pytest.mark.parametrize("out,match", [
    (torch.empty(3, 8), r"out must be contiguous torch.float32 \(2, 8\) .* got torch.float32 \(3, 8\)"),
    (torch.empty(2, 8, dtype=torch.bfloat16), "got torch.bfloat16"),
    (torch.empty(8, 2).t(), r"strides \(1, 2\)"),
])
def test_rmsnorm_out_bad_out_raises(out, match):
    with pytest.raises(ValueError, match=match):
        torch.ops.lingc.rmsnorm_out(torch.randn(2, 8), torch.rand(8), None, EPS, out)
    mode = FakeTensorMode()
    fake = [mode.from_tensor(t) for t in (torch.empty(2, 8), torch.empty(8), out)]
    with mode, pytest.raises(ValueError, match=match):
        torch.ops.lingc.rmsnorm_out(fake[0], fake[1], None, EPS, fake[2])


# rmsnorm_pair_cols: NEXTN's enorm and hnorm side by side (pdl_norm_folds.norm_pairs_into_concat emits it).


def run_pair(a, ids, wa, b, wb, eps_b=1e-5, llama=False):
    from lingc.runtime.kernels.norms.kernel import rmsnorm_pair_cols_triton
    T, D = b.shape
    out = nan(T, 2 * D, dtype=b.dtype, device=b.device)
    rmsnorm_pair_cols_triton(a, ids, wa, EPS, b, wb, eps_b, out, round_before_weight=llama)
    return out


@pytest.mark.parametrize("gather", [True, False], ids=["embedding", "rows"])
@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
@pytest.mark.parametrize("T,D", [(1, 96), (6, 96), (3, 33), (2, 2560)])
@pytest.mark.parametrize("llama", [False, True], ids=["one-rounding", "llama"])
def test_rmsnorm_pair_cols_kernel_is_the_two_norms_side_by_side(T, D, dtype, gather, llama):
    """Each half the rmsnorm kernel's bits, in the form the flag names (``llama``: both halves
    round before the weight, the Hugging Face form)."""
    from lingc.runtime.kernels.norms import rmsnorm_pair_cols_reference
    a = rand(40 if gather else T, D + 3, dtype=dtype, seed=81)[:, :D]          # strided rows
    ids = torch.randint(0, 40, (T,), generator=torch.Generator().manual_seed(T)).to(DEVICE) if gather else None
    b, wa, wb = rand(T, D, dtype=dtype, seed=82), rand(D, dtype=dtype, seed=83), rand(D, dtype=dtype, seed=84)
    got = run_pair(a, ids, wa, b, wb, llama=llama)
    # The same bits as the rmsnorm kernel on each half (the same tile and reductions)...
    rows = a if ids is None else a.index_select(0, ids)
    want = torch.cat([run_rmsnorm(rows.contiguous(), wa, None, round_before_weight=llama)[0],
                      rmsnorm_triton(b, wb, None, 1e-5, round_before_weight=llama)[0]], -1)
    assert torch.equal(got, want)
    # ... and within rounding of the reference (a rounding more in the 16-bit Llama form).
    ref = rmsnorm_pair_cols_reference(a.cpu(), None if ids is None else ids.cpu(), wa.cpu(), EPS, b.cpu(),
                                      wb.cpu(), 1e-5, llama)
    assert_close(got, ref, RTOL[dtype] * (2 if dtype == torch.bfloat16 else 1) * (2 if llama else 1))
    if llama and dtype != torch.float32:     # the forms differ: the flag reached the kernel
        assert not torch.equal(got, run_pair(a, ids, wa, b, wb))


def test_rmsnorm_pair_cols_op_fake_and_opcheck():
    a, ids = rand(40, 96, seed=91), torch.tensor([5, 39, 0], device=DEVICE)
    b, wa, wb = rand(3, 96, seed=92), rand(96, seed=93), rand(96, seed=94)
    y = torch.ops.lingc.rmsnorm_pair_cols(a, ids, wa, EPS, b, wb, EPS)
    want = torch.cat([torch.ops.lingc.embedding_rmsnorm(a, ids, wa, EPS)[0], rmsnorm(b, wb, None, EPS)[0]], -1)
    assert torch.equal(y, want)
    torch.library.opcheck(torch.ops.lingc.rmsnorm_pair_cols.default, (a, ids, wa, EPS, b, wb, EPS))
    torch.library.opcheck(torch.ops.lingc.rmsnorm_pair_cols.default, (b * 2, None, wa, EPS, b, wb, EPS))
    torch.library.opcheck(torch.ops.lingc.rmsnorm_pair_cols.default, (a, ids, wa, EPS, b, wb, EPS, True))
    with FakeTensorMode():
        y = torch.ops.lingc.rmsnorm_pair_cols(torch.empty(40, 96, dtype=torch.bfloat16), torch.empty(6, dtype=torch.int64),
                                              torch.empty(96), EPS, torch.empty(6, 96, dtype=torch.bfloat16),
                                              torch.empty(96), EPS)
        assert y.shape == (6, 192) and y.dtype == torch.bfloat16


@pytest.mark.parametrize("a,ids,b,match", [
    (torch.zeros(3, 8), None, torch.zeros(2, 8), "a gives 3 rows but b has 2"),
    (torch.zeros(9, 8), torch.tensor([1, 2]), torch.zeros(3, 8), "a gives 2 rows but b has 3"),
    (torch.zeros(2, 16), None, torch.zeros(2, 8), "a's rows have D = 16 but b's 8"),
    (torch.zeros(2, 8, dtype=torch.bfloat16), None, torch.zeros(2, 8), "a is torch.bfloat16 .* but b is torch.float32"),
    (torch.zeros(9, 8), torch.tensor([[1, 2]]), torch.zeros(2, 8), r"ids must be \[T\] token ids"),
])
def test_rmsnorm_pair_cols_bad_arguments_raise(a, ids, b, match):
    wa = torch.ones(a.shape[1], dtype=a.dtype)
    with pytest.raises(ValueError, match=match):
        torch.ops.lingc.rmsnorm_pair_cols(a, ids, wa, EPS, b, torch.ones(8), EPS)


@pytest.mark.gpu
@pytest.mark.parametrize("llama", [False, True], ids=["one-rounding", "llama"])
@pytest.mark.parametrize("T", [1, 6])
def test_gpu_rmsnorm_pair_cols_flash_shapes_same_bits(T, llama):
    # NEXTN's enorm (embedding rows of a 39296-row vocab shard) and hnorm at flash-tp4-rank.
    table, b = rand(39296, 2560, dtype=torch.bfloat16, seed=95), rand(T, 2560, dtype=torch.bfloat16, seed=96)
    wa, wb = rand(2560, dtype=torch.bfloat16, seed=97), rand(2560, dtype=torch.bfloat16, seed=98)
    ids = torch.randint(0, 39296, (T,), device=DEVICE)
    y = torch.ops.lingc.rmsnorm_pair_cols(table, ids, wa, EPS, b, wb, EPS, llama)
    want = torch.cat([embedding_rmsnorm(table, ids, wa, EPS, llama)[0], rmsnorm(b, wb, None, EPS, llama)[0]], -1)
    assert torch.equal(y, want)
