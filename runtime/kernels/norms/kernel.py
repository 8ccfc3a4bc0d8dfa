"""Triton kernels for lingc's norms: RMSNorm with the fused residual add, and KDA's per-head
gated RMSNorm. Math: naive.py; custom ops and argument checks: op.py; notes: README.md.

RMSNorm (``_rmsnorm_kernel``). Grid (T,): one program per row, the whole row in one tile
(BLOCK = next_pow2(D), 4096 for hidden 2560), so the sum of squares is one in-register
reduction with no cross-program traffic. The norm weight is loaded before ``gdc_wait``; the row,
the residual and every store come after it. Per row: h = (x + residual) rounded to x.dtype (the
model's bf16 residual stream), stored as new_residual; out = h * rsqrt(sum(h^2) / D + eps) * w in
fp32, rounded once (with ROUND_BEFORE_WEIGHT, the Hugging Face Llama form: the normed row rounded
to the row's dtype, then times w, rounded again; with ZERO_CENTERED the gain is 1 + w in fp32,
Gemma's and Qwen3-Next's zero-centred weight). With GATHER (``lingc.embedding_rmsnorm``, the model's first norm after the
token embedding) x is the embedding table and row t reads table row ids[t], loaded after the wait
(the ids are produced upstream); new_residual then holds the gathered row, the embedding's value.

Two norms side by side (``_rmsnorm_pair_kernel``, ``lingc.rmsnorm_pair_cols``). Grid (T, 2):
program (t, 0) norms row t of a (table row ids[t] with GATHER), program (t, 1) row t of b, each
as ``_rmsnorm_kernel`` norms a row without a residual, into its half of one [T, 2 D] row: NEXTN's
enorm(embedding) and hnorm(hidden) concatenated for eh_proj, one launch where there were three.

Gated head norm (``_gated_head_rmsnorm_kernel``). Grid (T, cdiv(H, BH)): a program owns BH heads
of one row; each head's mean square is reduced inside the program. The o_norm weight comes before
``gdc_wait``. Per head: y = o * rsqrt(mean(o^2) + eps) * w * sigmoid(gate), fp32, cast once to
the output dtype; with ROUND_STEPS as an eager model in the 16-bit output dtype computes it (o
read in that dtype, the weighted norm and sigmoid(gate) each rounded to it before the product;
with ROUND_BEFORE_WEIGHT too, the normed head rounded before the weight, the Llama form).

Batch invariance in T: T is only the grid size (never a kernel argument), configs depend on
(D) or (H, V) only, and a program reads nothing of another row; so a row's bits do not depend on
how many rows run with it.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from lingc.runtime.pdl import pdl_launch_dependents, pdl_supported, pdl_wait_small

__all__ = ["MAX_D", "NormConfig", "rmsnorm_config", "gated_config", "rmsnorm_triton", "embedding_rmsnorm_triton",
           "rmsnorm_pair_cols_triton", "gated_head_rmsnorm_triton"]

# The widest row one program holds in registers (the whole row is one tile). Ling-3's widest
# normed row is hidden 2560.
MAX_D = 16384
# Elements per gated-norm program: BH heads of V, about this many (fixed per (H, V)).
_GATED_TILE = 512


@dataclass(frozen=True)
class NormConfig:
    block: int          # tile width (RMSNorm: the padded row; gated: the padded head dim V)
    heads: int = 1      # gated: heads per program (BH)
    num_warps: int = 4


def rmsnorm_config(d: int) -> NormConfig:
    """A function of the row width only (never of T): one tile of next_pow2(D)."""
    block = triton.next_power_of_2(d)
    return NormConfig(block=block, num_warps=max(1, min(16, block // 512)))


def gated_config(h: int, v: int) -> NormConfig:
    """A function of (H, V) only: BH heads of next_pow2(V) lanes, about _GATED_TILE elements."""
    block = triton.next_power_of_2(v)
    heads = max(1, min(triton.next_power_of_2(h), _GATED_TILE // block))
    return NormConfig(block=block, heads=heads, num_warps=max(1, min(8, heads * block // 256)))


@triton.jit
def _normed_row(h, w, D, eps, ROUND_BEFORE_WEIGHT: tl.constexpr = False):
    """RMSNorm of one whole row h times w (fp32), in the one order every rmsnorm kernel uses, so
    the kernels that call it give a row the same bits. ROUND_BEFORE_WEIGHT: the Hugging Face Llama
    form, the normed row rounded to h's dtype before w multiplies it (the caller rounds the
    product)."""
    hf = h.to(tl.float32)
    ms = tl.sum(hf * hf, axis=0) / D
    normed = hf * tl.rsqrt(ms + eps)
    if ROUND_BEFORE_WEIGHT:
        normed = normed.to(h.dtype).to(tl.float32)
    return normed * w


@triton.jit
def _rmsnorm_kernel(x_ptr, ids_ptr, res_ptr, w_ptr, out_ptr, new_res_ptr, stride_x, stride_r, D, eps,
                    BLOCK: tl.constexpr, HAS_RESIDUAL: tl.constexpr, GATHER: tl.constexpr, USE_GDC: tl.constexpr,
                    ROUND_BEFORE_WEIGHT: tl.constexpr = False, NO_WEIGHT: tl.constexpr = False,
                    ZERO_CENTERED: tl.constexpr = False):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    m = offs < D
    if NO_WEIGHT:
        w = 1.0         # a norm without a gain: times 1.0 rounds nothing
    else:
        w = tl.load(w_ptr + offs, mask=m, other=0.0).to(tl.float32)   # producer-independent
        if ZERO_CENTERED:
            w = w + 1.0     # the gain of a zero-centred weight, in fp32 as eager adds it

    pdl_wait_small(USE_GDC)
    pdl_launch_dependents(USE_GDC)

    if GATHER:      # x is the embedding table, row `ids[row]` of it (the ids come from upstream)
        src = tl.load(ids_ptr + row).to(tl.int64)
    else:
        src = row
    x = tl.load(x_ptr + src * stride_x + offs, mask=m, other=0.0)
    if HAS_RESIDUAL:
        r = tl.load(res_ptr + row * stride_r + offs, mask=m, other=0.0)
        h = (r.to(tl.float32) + x.to(tl.float32)).to(x.dtype)     # the model's bf16 stream
    else:
        h = x
    tl.store(new_res_ptr + row * D + offs, h, mask=m)
    y = _normed_row(h, w, D, eps, ROUND_BEFORE_WEIGHT)
    tl.store(out_ptr + row * D + offs, y.to(out_ptr.dtype.element_ty), mask=m)


@triton.jit
def _rmsnorm_pair_kernel(a_ptr, ids_ptr, wa_ptr, b_ptr, wb_ptr, out_ptr, stride_a, stride_b, D, eps_a, eps_b,
                         BLOCK: tl.constexpr, GATHER: tl.constexpr, USE_GDC: tl.constexpr,
                         ROUND_BEFORE_WEIGHT: tl.constexpr = False):
    """Program (t, s): row t of a (s = 0; table row ids[t] with GATHER) or of b (s = 1), normed as
    ``_rmsnorm_kernel`` norms a row without a residual (the same tile and ``_normed_row``, so the
    same bits; ROUND_BEFORE_WEIGHT both halves in the Llama form), into columns [s * D, (s + 1) * D)
    of out [T, 2 D]."""
    row = tl.program_id(0).to(tl.int64)
    side = tl.program_id(1)
    offs = tl.arange(0, BLOCK)
    m = offs < D
    if side == 0:
        w = tl.load(wa_ptr + offs, mask=m, other=0.0).to(tl.float32)   # producer-independent
    else:
        w = tl.load(wb_ptr + offs, mask=m, other=0.0).to(tl.float32)

    pdl_wait_small(USE_GDC)
    pdl_launch_dependents(USE_GDC)

    if side == 0:
        if GATHER:
            src = tl.load(ids_ptr + row).to(tl.int64)
        else:
            src = row
        x = tl.load(a_ptr + src * stride_a + offs, mask=m, other=0.0)
        eps = eps_a
    else:
        x = tl.load(b_ptr + row * stride_b + offs, mask=m, other=0.0)
        eps = eps_b
    y = _normed_row(x, w, D, eps, ROUND_BEFORE_WEIGHT)
    tl.store(out_ptr + row * 2 * D + side * D + offs, y.to(out_ptr.dtype.element_ty), mask=m)


@triton.jit
def _gated_head_rmsnorm_kernel(o_ptr, g_ptr, w_ptr, out_ptr, stride_ot, stride_oh, stride_gt, stride_gh,
                               gate_group, H, V, eps, BH: tl.constexpr, BV: tl.constexpr, USE_GDC: tl.constexpr,
                               ROUND_STEPS: tl.constexpr = False, ROUND_BEFORE_WEIGHT: tl.constexpr = False,
                               SILU_GATE: tl.constexpr = False, GATE_FP32: tl.constexpr = False):
    t = tl.program_id(0).to(tl.int64)
    offs_h = tl.program_id(1) * BH + tl.arange(0, BH)
    offs_v = tl.arange(0, BV)
    mv = offs_v < V
    m2 = (offs_h < H)[:, None] & mv[None, :]
    w = tl.load(w_ptr + offs_v, mask=mv, other=0.0).to(tl.float32)  # producer-independent

    pdl_wait_small(USE_GDC)
    pdl_launch_dependents(USE_GDC)

    o = tl.load(o_ptr + t * stride_ot + offs_h[:, None] * stride_oh + offs_v[None, :],
                mask=m2, other=0.0).to(tl.float32)
    # gate_group heads a group of the gate's [T, A, gate_group * V] view (1: [T, H, V] as it is).
    g_head = (offs_h // gate_group) * stride_gh + (offs_h % gate_group) * V
    g = tl.load(g_ptr + t * stride_gt + g_head[:, None] + offs_v[None, :], mask=m2, other=0.0).to(tl.float32)
    dt = out_ptr.dtype.element_ty
    if ROUND_STEPS:     # the eager low-precision form: o, the weighted norm and the gate rounded
        o = o.to(dt).to(tl.float32)
    ms = tl.sum(o * o, axis=1) / V
    normed = o * tl.rsqrt(ms + eps)[:, None]
    if ROUND_BEFORE_WEIGHT:     # (with ROUND_STEPS) the head norm in the Llama form
        normed = normed.to(dt).to(tl.float32)
    y = normed * w[None, :]
    if SILU_GATE:       # Gated DeltaNet's output norm: silu(g), not sigmoid(g)
        act = g * tl.sigmoid(g)
    else:
        act = tl.sigmoid(g)
    if ROUND_STEPS and GATE_FP32:   # (Qwen3NextRMSNormGated) the rounded norm times the fp32 activation
        y = y.to(dt).to(tl.float32) * act
    elif ROUND_STEPS:
        y = y.to(dt).to(tl.float32) * act.to(dt).to(tl.float32)
    else:
        y = y * act
    tl.store(out_ptr + t * H * V + offs_h[:, None] * V + offs_v[None, :], y.to(dt), mask=m2)


def _launch(use_pdl: bool | None, device) -> tuple[bool, dict]:
    if use_pdl is None:
        use_pdl = pdl_supported(device)
    assert not use_pdl or pdl_supported(device), "PDL requested on a device without PDL support"
    return use_pdl, ({"launch_pdl": True} if use_pdl else {})


def _rmsnorm_rows(src, ids, residual, weight, eps, T, out, new_residual, config, use_pdl, round_before_weight=False,
                  zero_centered=False):
    """The one launch of ``_rmsnorm_kernel`` behind both launchers below: T rows of ``src``
    (rows ``ids[t]`` of it when ids is given), outputs allocated when not given."""
    D = src.shape[1]
    assert src.stride(-1) == 1 and (weight is None or weight.is_contiguous())
    if out is None:
        out = torch.empty((T, D), device=src.device, dtype=src.dtype)
    if new_residual is None:
        new_residual = torch.empty((T, D), device=src.device, dtype=src.dtype)
    assert out.is_contiguous() and new_residual.is_contiguous()
    if T == 0:
        return out, new_residual
    cfg = config or rmsnorm_config(D)
    use_pdl, launch = _launch(use_pdl, src.device)
    res = src if residual is None else residual
    _rmsnorm_kernel[(T,)](src, src if ids is None else ids, res, src if weight is None else weight, out,
                          new_residual, src.stride(0),
                          res.stride(0), D, float(eps), BLOCK=cfg.block, HAS_RESIDUAL=residual is not None,
                          GATHER=ids is not None, USE_GDC=use_pdl, ROUND_BEFORE_WEIGHT=bool(round_before_weight),
                          NO_WEIGHT=weight is None, ZERO_CENTERED=bool(zero_centered),
                          num_warps=cfg.num_warps, num_stages=1, **launch)
    return out, new_residual


def rmsnorm_triton(x: torch.Tensor, weight: torch.Tensor, residual: torch.Tensor | None, eps: float,
                   out: torch.Tensor | None = None, new_residual: torch.Tensor | None = None, *,
                   round_before_weight: bool = False, zero_centered: bool = False,
                   config: NormConfig | None = None, use_pdl: bool | None = None):
    """Launch the fused residual add + RMSNorm over the T rows of x [T, D]; returns
    (out, new_residual), both [T, D] contiguous in x.dtype (``out``/``new_residual`` if given).
    ``round_before_weight`` / ``zero_centered``: naive.rmsnorm_reference's Llama form / gain
    1 + weight. Arguments are as op.check_rmsnorm_args accepts them."""
    assert residual is None or (residual.shape == x.shape and residual.stride(-1) == 1)
    return _rmsnorm_rows(x, None, residual, weight, eps, x.shape[0], out, new_residual, config, use_pdl,
                         round_before_weight, zero_centered)


def embedding_rmsnorm_triton(table: torch.Tensor, ids: torch.Tensor, weight: torch.Tensor, eps: float,
                             out: torch.Tensor | None = None, x: torch.Tensor | None = None, *,
                             round_before_weight: bool = False, zero_centered: bool = False,
                             config: NormConfig | None = None, use_pdl: bool | None = None):
    """Launch the token embedding gather fused into the RMSNorm after it: (out, x) with
    x = table[ids] [T, D] and out = RMSNorm(x) * weight, both contiguous in table.dtype (``out`` /
    ``x`` if given). The rmsnorm kernel with GATHER: row t reads table row ids[t], so the gather
    is no kernel of its own. Arguments are as op.check_embedding_rmsnorm_args accepts them."""
    assert ids.dim() == 1
    return _rmsnorm_rows(table, ids, None, weight, eps, ids.shape[0], out, x, config, use_pdl, round_before_weight,
                         zero_centered)


def rmsnorm_pair_cols_triton(a: torch.Tensor, a_ids: torch.Tensor | None, wa: torch.Tensor, eps_a: float,
                             b: torch.Tensor, wb: torch.Tensor, eps_b: float, out: torch.Tensor | None = None, *,
                             round_before_weight: bool = False, use_pdl: bool | None = None) -> torch.Tensor:
    """Launch the two norms side by side: out [T, 2 D] = [RMSNorm(a rows) * wa | RMSNorm(b) * wb]
    (a's rows ``a[a_ids]`` when a_ids is given), contiguous in a.dtype. rmsnorm_config(D)'s tile
    and warps, so each half has the bits ``rmsnorm`` gives it (``round_before_weight``: both in
    the Llama form). Arguments are as op.check_rmsnorm_pair_cols_args accepts them."""
    T, D = b.shape
    if out is None:
        out = torch.empty((T, 2 * D), device=b.device, dtype=b.dtype)
    assert out.shape == (T, 2 * D) and out.is_contiguous() and a.stride(-1) == 1 and b.stride(-1) == 1
    if T == 0:
        return out
    cfg = rmsnorm_config(D)
    use_pdl, launch = _launch(use_pdl, b.device)
    _rmsnorm_pair_kernel[(T, 2)](a, a if a_ids is None else a_ids, wa, b, wb, out, a.stride(0), b.stride(0), D,
                                 float(eps_a), float(eps_b), BLOCK=cfg.block, GATHER=a_ids is not None,
                                 USE_GDC=use_pdl, ROUND_BEFORE_WEIGHT=bool(round_before_weight),
                                 num_warps=cfg.num_warps, num_stages=1, **launch)
    return out


def gated_head_rmsnorm_triton(o: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, eps: float,
                              out_dtype: torch.dtype | None = None, out: torch.Tensor | None = None, *,
                              round_steps: bool = False, round_before_weight: bool = False,
                              silu_gate: bool = False, gate_fp32: bool = False, config: NormConfig | None = None,
                              use_pdl: bool | None = None) -> torch.Tensor:
    """Launch the per-head gated RMSNorm of o [T, H, V] (gate [T, H, V] or a head-grouped [T, A, G * V]
    view, op.check_gated_head_rmsnorm_args); returns [T, H, V] contiguous in
    ``out_dtype`` (fp32 by default). ``round_steps``: each step rounded to ``out_dtype`` (naive.py,
    _gated_row_in_steps; ``round_before_weight`` its Llama form; ``gate_fp32`` the fp32 product of
    Qwen3NextRMSNormGated); ``silu_gate``: times silu(gate), not sigmoid(gate). Arguments are as
    op.check_gated_head_rmsnorm_args accepts."""
    T, H, V = o.shape
    assert o.stride(-1) == 1 and gate.stride(-1) == 1 and weight.is_contiguous()
    group = gate.shape[2] // V                  # heads a group of a head-grouped gate (1: [T, H, V])
    if out is None:
        out = torch.empty((T, H, V), device=o.device, dtype=out_dtype or torch.float32)
    assert out.is_contiguous()
    if T == 0:
        return out
    cfg = config or gated_config(H, V)
    use_pdl, launch = _launch(use_pdl, o.device)
    _gated_head_rmsnorm_kernel[(T, triton.cdiv(H, cfg.heads))](
        o, gate, weight, out, o.stride(0), o.stride(1), gate.stride(0), gate.stride(1), group, H, V, float(eps),
        BH=cfg.heads, BV=cfg.block, USE_GDC=use_pdl, ROUND_STEPS=bool(round_steps),
        ROUND_BEFORE_WEIGHT=bool(round_before_weight), SILU_GATE=bool(silu_gate), GATE_FP32=bool(gate_fp32),
        num_warps=cfg.num_warps,
        num_stages=1, **launch)
    return out
