"""Plain-PyTorch references for lingc's norm kernels: the ops' CPU path and the kernels' oracle.

``rmsnorm_reference`` is the decoder's residual add followed by its RMSNorm
(lingc/models/decoder.py, lingc/models/layers.py), in the model's exact order of operations:

    h   = residual + x                  in x.dtype (bf16 in the real model: rounded once)
    out = (h.float() * rsqrt(mean(h.float()^2) + eps) * weight.float()).to(h.dtype)

so that, with x the sub-layer output and residual the stream, ``(out, h)`` is what the next
RMSNorm sees and what the next residual add adds to. Without a residual (the first layer's
input norm, the embedding) h is x itself. Whole-[T, D] torch calls are batch-invariant here: the
only ops are add, mul, a last-dim sum and rsqrt, which the CPU's vector body and scalar tail
round identically (tests/test_norm_kernels.py checks T = 1..8 bit for bit).

``gated_head_rmsnorm_reference`` is kda_math.gated_head_rmsnorm (KDA's output norm: per-head
RMSNorm times the o_norm weight, then times sigmoid(gate)) evaluated one row at a time. Whole-T
calls are not batch-invariant: torch's CPU sigmoid takes a vectorised body and a scalar tail
whose split depends on numel, and the two round differently (seen at H*V = 72 and 10). A
[1, H, V] slice has the same numel for every T. Where H*V has no tail (H*V a multiple of 32,
as Ling-3's 8 x 128 and the tiny preset's 4 x 16) the rows equal the model's whole-T call bit for
bit.
"""
from __future__ import annotations

import torch

from lingc.models.kda_math import gated_head_rmsnorm

__all__ = ["rmsnorm_reference", "embedding_rmsnorm_reference", "rmsnorm_pair_cols_reference",
           "gated_head_rmsnorm_reference"]


def rmsnorm_reference(x: torch.Tensor, weight: torch.Tensor | None, residual: torch.Tensor | None,
                      eps: float, round_before_weight: bool = False,
                      zero_centered: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """(rmsnorm(residual + x) * weight, residual + x); without a residual, (rmsnorm(x), copy of x).

    x, residual [T, D] of one dtype; weight [D], or None for a norm without a gain. Outputs are
    new tensors in x.dtype. ``round_before_weight``: the normed row is rounded to x.dtype before
    the weight multiplies it in x.dtype (the Hugging Face Llama form, ``weight *
    normed.to(input_dtype)``; weight in x.dtype), two roundings instead of one.
    ``zero_centered``: the weight is stored zero-centred and the gain is ``1 + weight`` in fp32
    (Gemma's and Qwen3-Next's RMSNorm, ``normed * (1.0 + weight.float())``), rounded once.
    """
    h = x.clone() if residual is None else residual + x
    hf = h.float()
    normed = hf * torch.rsqrt(hf.pow(2).mean(-1, keepdim=True) + eps)
    if weight is None:
        return normed.to(h.dtype), h
    if round_before_weight:
        return weight * normed.to(h.dtype), h
    gain = 1.0 + weight.float() if zero_centered else weight.float()
    return (normed * gain).to(h.dtype), h


def embedding_rmsnorm_reference(table: torch.Tensor, ids: torch.Tensor, weight: torch.Tensor,
                                eps: float, round_before_weight: bool = False,
                                zero_centered: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """(rmsnorm(table[ids]) * weight, table[ids]): the token embedding gather and the first
    RMSNorm after it. table [V, D], ids [T] integer in [0, V), weight [D]; outputs in table.dtype.
    ``round_before_weight`` / ``zero_centered``: rmsnorm_reference's Llama form / gain 1 + weight."""
    return rmsnorm_reference(table.index_select(0, ids.long()), weight, None, eps, round_before_weight,
                             zero_centered)


def rmsnorm_pair_cols_reference(a: torch.Tensor, a_ids: torch.Tensor | None, wa: torch.Tensor, eps_a: float,
                                b: torch.Tensor, wb: torch.Tensor, eps_b: float,
                                round_before_weight: bool = False) -> torch.Tensor:
    """cat([rmsnorm(a rows) * wa, rmsnorm(b) * wb], -1), a's rows ``a[a_ids]`` when a_ids is
    given (NEXTN's enorm of the embedding and hnorm of the hidden state, side by side); both
    norms of the form ``round_before_weight`` names (rmsnorm_reference's)."""
    rows = a if a_ids is None else a.index_select(0, a_ids.long())
    return torch.cat([rmsnorm_reference(rows, wa, None, eps_a, round_before_weight)[0],
                      rmsnorm_reference(b, wb, None, eps_b, round_before_weight)[0]], -1)


def _gated_row_in_steps(o, gate, weight, eps, dt, round_before_weight=False, silu_gate=False, gate_fp32=False):
    """One row as an eager low-precision model computes it: o read as ``dt``, the weighted norm
    in fp32 rounded to ``dt`` (``round_before_weight``: the Llama form, ``weight * normed.to(dt)``),
    sigmoid(gate) (``silu_gate``: silu(gate)) in ``dt``, their product in ``dt``; ``gate_fp32``:
    the activation of the gate upcast, its product with the rounded norm in fp32, rounded once
    (Hugging Face's Qwen3NextRMSNormGated: ``(w * normed.to(dt)) * silu(gate.float())``)."""
    x = o.to(dt).float()
    normed = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    n = weight * normed.to(dt) if round_before_weight else (normed * weight.float()).to(dt)
    act = torch.nn.functional.silu if silu_gate else torch.sigmoid
    if gate_fp32:
        return (n.float() * act(gate.float())).to(dt)
    return n * act(gate.to(dt))


def gated_head_rmsnorm_reference(o: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor,
                                 eps: float, out_dtype: torch.dtype | None = None,
                                 round_steps: bool = False, round_before_weight: bool = False,
                                 silu_gate: bool = False, gate_fp32: bool = False) -> torch.Tensor:
    """rmsnorm_per_head(o) * weight * sigmoid(gate), one row at a time, in fp32, then cast.

    o [T, H, V] (the KDA chain's fp32 output); gate [T, H, V] (raw g_proj output); weight [V].
    The result is fp32 (as kda_math's) rounded once to ``out_dtype`` when given (the model's
    ``.to(x.dtype)`` before o_proj). ``round_steps`` (with a 16-bit ``out_dtype``): the eager
    low-precision form instead, each step rounded to ``out_dtype`` (_gated_row_in_steps; with
    ``round_before_weight`` the head norm in the Llama form). ``silu_gate``: times silu(gate)
    instead (Gated DeltaNet's output norm, flash-linear-attention's FusedRMSNormGated with swish),
    in fp32 rounded once, or with ``round_steps`` in the steps above.
    """
    def row(o_t, g_t):
        if round_steps:
            return _gated_row_in_steps(o_t, g_t, weight, eps, out_dtype, round_before_weight, silu_gate, gate_fp32)
        if silu_gate:
            x = o_t.float()
            return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight.float() \
                * torch.nn.functional.silu(g_t.float())
        return gated_head_rmsnorm(o_t, weight, g_t, eps)

    rows = [row(o[t:t + 1], gate[t:t + 1]) for t in range(o.shape[0])]
    out = torch.cat(rows, 0) if rows else o.new_empty(o.shape, dtype=out_dtype if round_steps else torch.float32)
    return out if out_dtype is None or round_steps else out.to(out_dtype)
