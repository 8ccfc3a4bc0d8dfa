"""lingc's norms as opaque, functional custom ops.

- ``torch.ops.lingc.rmsnorm(Tensor x, Tensor? weight, Tensor? residual, float eps,
  bool round_before_weight=False, bool zero_centered=False) -> (Tensor out, Tensor new_residual)``: x, residual [T, D] of
  one dtype (unit stride along D, any row stride), weight [D] (None: a norm without a gain,
  nn.RMSNorm(elementwise_affine=False); only rmsnorm and rmsnorm_out take None). new_residual = residual + x in
  x.dtype (x itself, copied, when residual is None: the first layer's input norm) and out =
  RMSNorm(new_residual) * weight, computed in fp32 and rounded once to x.dtype: the decoder's
  ``h = x + sublayer(..)`` followed by the next RMSNorm of h, exactly as lingc/models/decoder.py
  and layers.py compute it. ``round_before_weight=True`` (weight in x.dtype): the Hugging Face
  Llama form, ``weight * normed.to(x.dtype)``, rounded twice as eager rounds it; every op a norm
  folds into (passes/pdl_glue.py: routers, cache writes, the embedding gather, pairs, out= writes)
  takes the same flag. ``zero_centered=True``: the weight is stored zero-centred, the gain is
  ``1 + weight`` in fp32 and the row is rounded once (Gemma's and Qwen3-Next's RMSNorm,
  ``normed * (1.0 + weight.float())``); embedding_rmsnorm takes it too, the other folds leave
  such a norm its own kernel.
- ``torch.ops.lingc.rmsnorm_out(Tensor x, Tensor weight, Tensor? residual, float eps,
  Tensor(a!) out, bool round_before_weight=False, bool zero_centered=False) -> Tensor new_residual``: rmsnorm with ``out``
  written in place (contiguous, [T, D] in x.dtype), the same bits. pdl_swap emits it where the
  graph copies a norm's output into one of its inputs (the relay's verify graph: the final norm's
  rows into relay.vhid), so the copy is no kernel of its own (passes/pdl_glue.py,
  ``direct_lingc_writes``).
- ``torch.ops.lingc.embedding_rmsnorm(Tensor table, Tensor ids, Tensor weight, float eps,
  bool round_before_weight=False, bool zero_centered=False) -> (Tensor out, Tensor x)``: x = table[ids] (the token embedding gather, table [V, D], ids [T]
  int32/int64 in [0, V)) and out = RMSNorm(x) * weight, as rmsnorm(x, weight, None, eps) returns
  them; one kernel, so the gather is not a launch (and a full edge of the captured graph) of its
  own. Ids are not range-checked on the device (nor by ATen's CUDA embedding, which asserts).
- ``torch.ops.lingc.rmsnorm_pair_cols(Tensor a, Tensor? a_ids, Tensor wa, float eps_a, Tensor b,
  Tensor wb, float eps_b, bool round_before_weight=False) -> Tensor``: ``cat([out_a, out_b], -1)``
  [T, 2 D] with out_a the rmsnorm (no residual) of a's rows (``a[a_ids]``: an embedding table and
  token ids, as embedding_rmsnorm) and out_b that of b [T, D], both of the form the flag names;
  one kernel, each half the bits rmsnorm gives it.
  NEXTN's enorm and hnorm before eh_proj were three launches (two norms and the concatenation);
  pdl_swap emits it there (passes/pdl_glue.py, ``norm_pairs_into_concat``).
- ``torch.ops.lingc.gated_head_rmsnorm(Tensor o, Tensor gate, Tensor weight, float eps,
  ScalarType? out_dtype=None, bool round_steps=False, bool round_before_weight=False,
  bool silu_gate=False) -> Tensor``: KDA's output norm, kda_math.gated_head_rmsnorm:
  o [T, H, V] (fp32 from the KDA chain), gate [T, H, V] (raw g_proj output; any T / H strides,
  or a head-grouped [T, H / G, G * V] view: Qwen3-Next's z inside its fused projection), weight [V];
  returns fp32 [T, H, V], or that rounded once to ``out_dtype`` (the model's cast before
  o_proj, folded in). ``round_steps=True`` (a 16-bit out_dtype, the gate in it too): the form of
  a model that runs the norm in that dtype, each step rounded as eager rounds it (o read in
  out_dtype, the weighted norm and sigmoid(gate) rounded before their product);
  ``round_before_weight=True`` with it (the weight in out_dtype): the head norm in the Hugging
  Face Llama form, ``weight * normed.to(out_dtype)``, one rounding more. ``silu_gate=True``: times
  silu(gate) instead of sigmoid(gate) (Gated DeltaNet's output norm, flash-linear-attention's
  FusedRMSNormGated with swish), in fp32 rounded once, or with round_steps each step rounded.
  ``gate_fp32=True`` (with round_steps): the gate's activation in fp32 and its product with the
  rounded norm in fp32, rounded once (Hugging Face's Qwen3NextRMSNormGated,
  ``(weight * normed.to(dt)) * silu(gate.float())`` then ``.to(dt)``).

All but rmsnorm_out are out of place (``mutates_args=()``): nothing in the graph is mutated, so
functionalisation leaves them alone and the pdl_swap pass replaces pure subgraphs by pure ops.
They trace (fake impls), run on the CPU (naive.py, batch-invariant in T) and on CUDA (kernel.py,
PDL-launched on Hopper). ``custom_op`` rather than ``triton_op`` for the reason in gemm/op.py: an
opaque op keeps lingc's own PDL launch.
"""
from __future__ import annotations

import math

import torch

from lingc.runtime.registry import register_op

from .naive import (embedding_rmsnorm_reference, gated_head_rmsnorm_reference, rmsnorm_pair_cols_reference,
                    rmsnorm_reference)

__all__ = ["MAX_D", "rmsnorm", "rmsnorm_out", "rmsnorm_pair_cols", "embedding_rmsnorm", "gated_head_rmsnorm", "check_rmsnorm_args",
           "check_embedding_rmsnorm_args", "check_rmsnorm_pair_cols_args", "check_gated_head_rmsnorm_args"]

MAX_D = 16384     # kernel.MAX_D: the widest row one program holds
_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def _shape(t: torch.Tensor) -> tuple:
    return tuple(t.shape)


def _check_eps(op: str, eps) -> None:
    if not (isinstance(eps, (int, float)) and math.isfinite(eps) and eps >= 0):
        raise ValueError(f"{op}: eps must be a finite number >= 0 (Ling-3 uses 1e-6), got {eps}")


def check_rmsnorm_args(x, weight, residual, eps, round_before_weight=False, weightless_ok=False,
                       zero_centered=False) -> None:
    """Raise ValueError naming the bad argument of ``rmsnorm`` (``weightless_ok``: weight may be
    None, a norm without a gain; only rmsnorm and rmsnorm_out take that, and ``zero_centered``)."""
    op = "rmsnorm"
    if zero_centered and (weight is None or round_before_weight):
        raise ValueError(f"{op}: zero_centered (gain 1 + weight, rounded once) needs a weight and the one-rounding "
                         f"form; got weight={'None' if weight is None else 'given'}, "
                         f"round_before_weight={round_before_weight}")
    if weight is None:
        if not weightless_ok:
            raise ValueError(f"{op}: this op needs the norm weight [D]; only rmsnorm and rmsnorm_out take None")
        if round_before_weight:
            raise ValueError(f"{op}: round_before_weight is a weighted form; a norm without a weight rounds once")
    elif round_before_weight and weight.dtype != x.dtype:
        raise ValueError(f"{op}: round_before_weight multiplies the rounded row by the weight in x's dtype; "
                         f"weight.dtype {weight.dtype} differs from x.dtype {x.dtype}")
    if x.dim() != 2:
        raise ValueError(f"{op}: x must be [T, D] (2-d; reshape [1, T, D] inputs), got shape {_shape(x)}")
    if x.dtype not in _DTYPES:
        raise ValueError(f"{op}: x.dtype must be bfloat16, float16 or float32, got {x.dtype}")
    D = x.shape[1]
    if not 1 <= D <= MAX_D:
        raise ValueError(f"{op}: row width D = {D} must be in 1..{MAX_D} (one program holds a whole row)")
    if D > 1 and x.stride(1) != 1:
        raise ValueError(f"{op}: x must have unit stride along D (any row stride), got strides {x.stride()}")
    if weight is not None:
        if _shape(weight) != (D,):
            raise ValueError(f"{op}: weight must be [D] = ({D},), got {_shape(weight)}")
        if not weight.is_floating_point():
            raise ValueError(f"{op}: weight must be floating point, got {weight.dtype}")
        if not weight.is_contiguous():
            raise ValueError(f"{op}: weight must be contiguous, got strides {weight.stride()}")
    if residual is not None:
        if _shape(residual) != _shape(x):
            raise ValueError(f"{op}: residual must have x's shape {_shape(x)}, got {_shape(residual)}")
        if residual.dtype != x.dtype:
            raise ValueError(f"{op}: residual.dtype {residual.dtype} differs from x.dtype {x.dtype}; the "
                             f"residual stream is kept in the model dtype")
        if D > 1 and residual.stride(1) != 1:
            raise ValueError(f"{op}: residual must have unit stride along D, got strides {residual.stride()}")
    for name, t in (("weight", weight), ("residual", residual)):
        if t is not None and t.device != x.device:
            raise ValueError(f"{op}: {name} is on {t.device} but x is on {x.device}")
    _check_eps(op, eps)


def check_embedding_rmsnorm_args(table, ids, weight, eps, round_before_weight=False, zero_centered=False) -> None:
    """Raise ValueError naming the bad argument of ``embedding_rmsnorm``."""
    op = "embedding_rmsnorm"
    if table.dim() != 2:
        raise ValueError(f"{op}: table must be the [V, D] embedding weight, got shape {_shape(table)}")
    if ids.dim() != 1:
        raise ValueError(f"{op}: ids must be [T] token ids (1-d; flatten [1, T]), got shape {_shape(ids)}")
    if ids.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"{op}: ids must be int32 or int64 token ids, got {ids.dtype}")
    if ids.device != table.device:
        raise ValueError(f"{op}: ids is on {ids.device} but table is on {table.device}")
    check_rmsnorm_args(table, weight, None, eps, round_before_weight, zero_centered=zero_centered)


def check_gated_head_rmsnorm_args(o, gate, weight, eps, out_dtype=None, round_steps=False,
                                  round_before_weight=False, silu_gate=False, gate_fp32=False) -> None:
    """Raise ValueError naming the bad argument of ``gated_head_rmsnorm``."""
    op = "gated_head_rmsnorm"
    if o.dim() != 3:
        raise ValueError(f"{op}: o must be [T, H, V] (3-d; view [T, H*V] as [T, H, V]), got shape {_shape(o)}")
    T, H, V = o.shape
    if not 1 <= V <= MAX_D:
        raise ValueError(f"{op}: head dim V = {V} must be in 1..{MAX_D}")
    if gate.dim() != 3 or gate.shape[0] != T or gate.shape[2] % V or gate.shape[1] * gate.shape[2] != H * V:
        raise ValueError(f"{op}: gate must be [T, H, V] = {(T, H, V)}, got {_shape(gate)} (a head-grouped "
                         f"[T, H / G, G * V] view of it is taken too)")
    if _shape(weight) != (V,):
        raise ValueError(f"{op}: weight must be [V] = ({V},), got {_shape(weight)}")
    for name, t in (("o", o), ("gate", gate), ("weight", weight)):
        if t.dtype not in _DTYPES:
            raise ValueError(f"{op}: {name}.dtype must be bfloat16, float16 or float32, got {t.dtype}")
        if t.device != o.device:
            raise ValueError(f"{op}: {name} is on {t.device} but o is on {o.device}")
    if not weight.is_contiguous():
        raise ValueError(f"{op}: weight must be contiguous, got strides {weight.stride()}")
    for name, t in (("o", o), ("gate", gate)):
        if V > 1 and t.stride(2) != 1:
            raise ValueError(f"{op}: {name} must have unit stride along V (any T and H strides), "
                             f"got strides {t.stride()}")
    if out_dtype is not None and out_dtype not in _DTYPES:
        raise ValueError(f"{op}: out_dtype must be None (float32), bfloat16, float16 or float32, got {out_dtype}")
    if round_steps and (out_dtype not in (torch.bfloat16, torch.float16) or gate.dtype != out_dtype):
        raise ValueError(f"{op}: round_steps rounds each step to a 16-bit out_dtype that the gate has too; got "
                         f"out_dtype={out_dtype}, gate.dtype={gate.dtype}")
    if round_before_weight and not (round_steps and weight.dtype == out_dtype):
        raise ValueError(f"{op}: round_before_weight (the Llama form of the 16-bit head norm) needs round_steps "
                         f"and the weight in out_dtype; got round_steps={round_steps}, weight.dtype={weight.dtype}, "
                         f"out_dtype={out_dtype}")
    if gate_fp32 and not round_steps:
        raise ValueError(f"{op}: gate_fp32 (the fp32 product of the rounded norm and the gate's activation) "
                         f"is a form of round_steps; got round_steps={round_steps}")
    _check_eps(op, eps)


def check_rmsnorm_pair_cols_args(a, a_ids, wa, eps_a, b, wb, eps_b, round_before_weight=False) -> None:
    """Raise ValueError naming the bad argument of ``rmsnorm_pair_cols``."""
    op = "rmsnorm_pair_cols"
    if a_ids is None:
        check_rmsnorm_args(a, wa, None, eps_a, round_before_weight)
    else:
        check_embedding_rmsnorm_args(a, a_ids, wa, eps_a, round_before_weight)
    check_rmsnorm_args(b, wb, None, eps_b, round_before_weight)
    rows = a.shape[0] if a_ids is None else a_ids.shape[0]
    if rows != b.shape[0]:
        raise ValueError(f"{op}: a gives {rows} rows but b has {b.shape[0]}")
    if a.shape[1] != b.shape[1]:
        raise ValueError(f"{op}: a's rows have D = {a.shape[1]} but b's {b.shape[1]}; the halves must be one width")
    if a.dtype != b.dtype or a.device != b.device:
        raise ValueError(f"{op}: a is {a.dtype} on {a.device} but b is {b.dtype} on {b.device}")


def _rmsnorm_pair_cols(a, a_ids, wa, eps_a, b, wb, eps_b, round_before_weight=False):
    check_rmsnorm_pair_cols_args(a, a_ids, wa, eps_a, b, wb, eps_b, round_before_weight)
    if not b.is_cuda:
        return rmsnorm_pair_cols_reference(a, a_ids, wa, eps_a, b, wb, eps_b, round_before_weight)
    from .kernel import rmsnorm_pair_cols_triton

    return rmsnorm_pair_cols_triton(a, a_ids, wa, eps_a, b, wb, eps_b, round_before_weight=round_before_weight)


def _rmsnorm_pair_cols_fake(a, a_ids, wa, eps_a, b, wb, eps_b, round_before_weight=False):
    check_rmsnorm_pair_cols_args(a, a_ids, wa, eps_a, b, wb, eps_b, round_before_weight)
    return b.new_empty((b.shape[0], 2 * b.shape[1]))


def _rmsnorm(x: torch.Tensor, weight: torch.Tensor | None, residual: torch.Tensor | None,
             eps: float, round_before_weight: bool = False,
             zero_centered: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    check_rmsnorm_args(x, weight, residual, eps, round_before_weight, True, zero_centered)
    if not x.is_cuda:
        return rmsnorm_reference(x, weight, residual, eps, round_before_weight, zero_centered)
    from .kernel import rmsnorm_triton  # imported here so the CPU path needs no triton

    return rmsnorm_triton(x, weight, residual, eps, round_before_weight=round_before_weight,
                          zero_centered=zero_centered)


def _rmsnorm_fake(x, weight, residual, eps, round_before_weight=False, zero_centered=False):
    check_rmsnorm_args(x, weight, residual, eps, round_before_weight, True, zero_centered)
    return torch.empty_like(x, memory_format=torch.contiguous_format), \
        torch.empty_like(x, memory_format=torch.contiguous_format)


def _check_norm_out(x, out) -> None:
    if tuple(out.shape) != tuple(x.shape) or out.dtype != x.dtype or out.device != x.device or not out.is_contiguous():
        raise ValueError(f"rmsnorm_out: out must be contiguous {x.dtype} {tuple(x.shape)} on {x.device} like x, got "
                         f"{out.dtype} {tuple(out.shape)} strides {out.stride()} on {out.device}")


def _rmsnorm_out(x: torch.Tensor, weight: torch.Tensor | None, residual: torch.Tensor | None, eps: float,
                 out: torch.Tensor, round_before_weight: bool = False, zero_centered: bool = False) -> torch.Tensor:
    check_rmsnorm_args(x, weight, residual, eps, round_before_weight, True, zero_centered)
    _check_norm_out(x, out)
    if not x.is_cuda:
        y, h = rmsnorm_reference(x, weight, residual, eps, round_before_weight, zero_centered)
        out.copy_(y)
        return h
    from .kernel import rmsnorm_triton

    return rmsnorm_triton(x, weight, residual, eps, out=out, round_before_weight=round_before_weight,
                          zero_centered=zero_centered)[1]


def _rmsnorm_out_fake(x, weight, residual, eps, out, round_before_weight=False, zero_centered=False):
    check_rmsnorm_args(x, weight, residual, eps, round_before_weight, True, zero_centered)
    _check_norm_out(x, out)
    return torch.empty_like(x, memory_format=torch.contiguous_format)


def _embedding_rmsnorm(table: torch.Tensor, ids: torch.Tensor, weight: torch.Tensor, eps: float,
                       round_before_weight: bool = False,
                       zero_centered: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    check_embedding_rmsnorm_args(table, ids, weight, eps, round_before_weight, zero_centered)
    if not table.is_cuda:
        return embedding_rmsnorm_reference(table, ids, weight, eps, round_before_weight, zero_centered)
    from .kernel import embedding_rmsnorm_triton

    return embedding_rmsnorm_triton(table, ids, weight, eps, round_before_weight=round_before_weight,
                                    zero_centered=zero_centered)


def _embedding_rmsnorm_fake(table, ids, weight, eps, round_before_weight=False, zero_centered=False):
    check_embedding_rmsnorm_args(table, ids, weight, eps, round_before_weight, zero_centered)
    shape = (ids.shape[0], table.shape[1])
    return table.new_empty(shape), table.new_empty(shape)


def _gated_head_rmsnorm(o: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, eps: float,
                        out_dtype: torch.dtype | None = None, round_steps: bool = False,
                        round_before_weight: bool = False, silu_gate: bool = False,
                        gate_fp32: bool = False) -> torch.Tensor:
    check_gated_head_rmsnorm_args(o, gate, weight, eps, out_dtype, round_steps, round_before_weight, silu_gate,
                                  gate_fp32)
    if not o.is_cuda:
        return gated_head_rmsnorm_reference(o, gate.reshape(o.shape), weight, eps, out_dtype, round_steps,
                                            round_before_weight, silu_gate, gate_fp32)
    from .kernel import gated_head_rmsnorm_triton

    return gated_head_rmsnorm_triton(o, gate, weight, eps, out_dtype, round_steps=round_steps,
                                     round_before_weight=round_before_weight, silu_gate=silu_gate,
                                     gate_fp32=gate_fp32)


def _gated_head_rmsnorm_fake(o, gate, weight, eps, out_dtype=None, round_steps=False, round_before_weight=False,
                             silu_gate=False, gate_fp32=False):
    check_gated_head_rmsnorm_args(o, gate, weight, eps, out_dtype, round_steps, round_before_weight, silu_gate,
                                  gate_fp32)
    return o.new_empty(o.shape, dtype=out_dtype or torch.float32)


_SCHEMAS = {
    "rmsnorm": ("(Tensor x, Tensor? weight, Tensor? residual, float eps, bool round_before_weight=False, "
                "bool zero_centered=False) -> (Tensor, Tensor)"),
    "rmsnorm_out": ("(Tensor x, Tensor? weight, Tensor? residual, float eps, Tensor(a!) out, "
                    "bool round_before_weight=False, bool zero_centered=False) -> Tensor"),
    "rmsnorm_pair_cols": ("(Tensor a, Tensor? a_ids, Tensor wa, float eps_a, Tensor b, Tensor wb, float eps_b, "
                          "bool round_before_weight=False) -> Tensor"),
    "embedding_rmsnorm": ("(Tensor table, Tensor ids, Tensor weight, float eps, bool round_before_weight=False, "
                          "bool zero_centered=False) -> (Tensor, Tensor)"),
    "gated_head_rmsnorm": ("(Tensor o, Tensor gate, Tensor weight, float eps, ScalarType? out_dtype=None, "
                           "bool round_steps=False, bool round_before_weight=False, bool silu_gate=False, "
                           "bool gate_fp32=False) -> Tensor"),
}


rmsnorm = register_op("rmsnorm", _rmsnorm, _rmsnorm_fake, schema=_SCHEMAS["rmsnorm"])
rmsnorm_out = register_op("rmsnorm_out", _rmsnorm_out, _rmsnorm_out_fake, mutates_args=("out",),
                          schema=_SCHEMAS["rmsnorm_out"])
rmsnorm_pair_cols = register_op("rmsnorm_pair_cols", _rmsnorm_pair_cols, _rmsnorm_pair_cols_fake,
                                schema=_SCHEMAS["rmsnorm_pair_cols"])
embedding_rmsnorm = register_op("embedding_rmsnorm", _embedding_rmsnorm, _embedding_rmsnorm_fake,
                                schema=_SCHEMAS["embedding_rmsnorm"])
gated_head_rmsnorm = register_op("gated_head_rmsnorm", _gated_head_rmsnorm, _gated_head_rmsnorm_fake,
                                 schema=_SCHEMAS["gated_head_rmsnorm"])
