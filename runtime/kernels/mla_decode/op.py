"""MLA decode attention in latent space as an opaque, functional custom op.

``torch.ops.lingc.mla_decode(Tensor q_lat, Tensor q_rope, Tensor kv_cache, Tensor positions,
float scale, Tensor? gate=None, Tensor? rope_inv_freq=None, int? pos_offset=None) -> Tensor``

- q_lat [T, H, R]: the absorbed query q_nope @ W_uk (fp32 in the model; bf16 / fp16 accepted);
- q_rope [T, H, P]: the rope part of q_proj's output, already roped, or raw when
  rope_inv_freq [P/2] (fp32) is given, in which case the op applies interleaved RoPE at
  positions[t] and rounds to q_rope.dtype as the model does; P = 0 (a [T, H, 0] tensor, e.g. a
  zero-width slice of q_lat) for an MLA without rope dims (NoPE);
- kv_cache [L, R + P]: one slot's latent cache [c ; roped k_rope] (bf16, fp16 or fp32, unit inner
  stride), read AFTER this step's rows were written (the op does not write the cache);
- positions [T] int32/int64 device tensor: query t sees cache rows 0..positions[t] (the causal
  mask inside a verify chain; never a host int); with ``pos_offset`` o, positions is a [1] base n
  and query t is at n + o + t (the relay's consecutive chain, read from n on the device:
  runtime/kernels/positions.py);
- scale: the softmax scale (qk_nope + qk_rope)^-0.5;
- gate [T, H] (raw g_proj output) or None: o_lat[t, h] *= sigmoid(gate[t, h]) (the model gates
  after the W_uv absorption; the scalar commutes with it: same math, different fp32 rounding).

Returns o_lat [T, H, R] fp32 = softmax(scores) @ c (times the gate); the caller applies W_uv and
`dense`. T is 1..16 (decode and verify chains; prefill keeps the model's path). naive.py holds
the exact math, kernel.py the split-K Triton kernels (PDL-launched on Hopper), README.md the
design. Functional (``mutates_args=()``): the cache write stays the model's own index_copy_.
"""
from __future__ import annotations

import math

import torch

from lingc.runtime.kernels.positions import check_positions, expand_positions
from lingc.runtime.registry import register_op

from .naive import mla_decode_reference

__all__ = ["MAX_T", "MAX_HEADS", "mla_decode", "check_mla_decode_args"]

MAX_T = 16          # decode and verify chains; prefill keeps the model's path
MAX_HEADS = 64      # all heads of a query are one tile (padded to >= 16 rows)
MAX_RANK = 1024     # the latent width is one tile
MAX_ROPE = 256
Q_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
KV_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
_FREQ_DTYPES = (torch.float32, torch.bfloat16, torch.float16)    # read as fp32 (a model cast whole)


def _shape(t: torch.Tensor) -> tuple:
    return tuple(t.shape)


def check_mla_decode_args(q_lat, q_rope, kv_cache, positions, scale, gate=None, rope_inv_freq=None,
                          pos_offset=None) -> None:
    """Raise ValueError naming the bad argument of ``mla_decode``."""
    op = "mla_decode"
    if q_lat.dim() != 3:
        raise ValueError(f"{op}: q_lat must be [T, H, kv_lora_rank] (3-d), got shape {_shape(q_lat)}")
    T, H, R = q_lat.shape
    if not 1 <= T <= MAX_T:
        raise ValueError(f"{op}: T = {T} query positions, must be in 1..{MAX_T} (decode or a verify chain; "
                         f"prefill keeps the model's attention)")
    if not 1 <= H <= MAX_HEADS:
        raise ValueError(f"{op}: H = {H} heads, must be in 1..{MAX_HEADS}")
    if not 1 <= R <= MAX_RANK:
        raise ValueError(f"{op}: kv_lora_rank R = {R} must be in 1..{MAX_RANK}")
    if q_rope.dim() != 3 or q_rope.shape[:2] != (T, H):
        raise ValueError(f"{op}: q_rope must be [T, H, rope_dim] = [{T}, {H}, P], got {_shape(q_rope)}")
    P = q_rope.shape[2]
    if not (0 <= P <= MAX_ROPE and P % 2 == 0):
        raise ValueError(f"{op}: rope dim P = {P} must be even and in 0..{MAX_ROPE} (0: no rope dims)")
    if P == 0 and rope_inv_freq is not None:
        raise ValueError(f"{op}: rope_inv_freq given but q_rope has no rope dims (P = 0)")
    for name, t in (("q_lat", q_lat), ("q_rope", q_rope)):
        if t.dtype not in Q_DTYPES:
            raise ValueError(f"{op}: {name}.dtype must be float32, bfloat16 or float16, got {t.dtype}")
        if t.stride(2) != 1 and t.shape[2] > 1:
            raise ValueError(f"{op}: {name} must have unit stride along its last dim (any T/H strides), "
                             f"got strides {t.stride()}")
    if kv_cache.dim() != 2 or kv_cache.shape[1] != R + P:
        raise ValueError(f"{op}: kv_cache must be one slot's [L, kv_lora_rank + rope_dim] = [L, {R + P}] "
                         f"(index the slot: cache.kv[j][slot]), got {_shape(kv_cache)}")
    if kv_cache.shape[0] < 1:
        raise ValueError(f"{op}: kv_cache has no rows (L = 0)")
    if kv_cache.dtype not in KV_DTYPES:
        raise ValueError(f"{op}: kv_cache.dtype must be bfloat16, float16 or float32, got {kv_cache.dtype}")
    if kv_cache.stride(1) != 1:
        raise ValueError(f"{op}: kv_cache must have unit stride along its last dim, got strides {kv_cache.stride()}")
    check_positions(op, positions, T, pos_offset)
    if not (isinstance(scale, (int, float)) and math.isfinite(scale) and scale > 0):
        raise ValueError(f"{op}: scale must be a finite number > 0 (the model uses (qk_nope + qk_rope)^-0.5), "
                         f"got {scale}")
    if gate is not None:
        if _shape(gate) != (T, H):
            raise ValueError(f"{op}: gate must be [T, H] = {(T, H)} (the raw g_proj output), got {_shape(gate)}")
        if not gate.is_floating_point():
            raise ValueError(f"{op}: gate must be floating point, got {gate.dtype}")
    if rope_inv_freq is not None:
        if _shape(rope_inv_freq) != (P // 2,) or rope_inv_freq.dtype not in _FREQ_DTYPES:
            raise ValueError(f"{op}: rope_inv_freq must be a [P/2] = ({P // 2},) float32 (or bf16 / fp16) tensor "
                             f"(layers.rope_inv_freq), got {_shape(rope_inv_freq)} {rope_inv_freq.dtype}")
        if not rope_inv_freq.is_contiguous():
            raise ValueError(f"{op}: rope_inv_freq must be contiguous, got strides {rope_inv_freq.stride()}")
    for name, t in (("q_rope", q_rope), ("kv_cache", kv_cache), ("positions", positions), ("gate", gate),
                    ("rope_inv_freq", rope_inv_freq)):
        if t is not None and t.device != q_lat.device:
            raise ValueError(f"{op}: {name} is on {t.device} but q_lat is on {q_lat.device}")


def _mla_decode(q_lat: torch.Tensor, q_rope: torch.Tensor, kv_cache: torch.Tensor, positions: torch.Tensor,
                scale: float, gate: torch.Tensor | None = None,
                rope_inv_freq: torch.Tensor | None = None, pos_offset: int | None = None) -> torch.Tensor:
    check_mla_decode_args(q_lat, q_rope, kv_cache, positions, scale, gate, rope_inv_freq, pos_offset)
    if not q_lat.is_cuda:
        return mla_decode_reference(q_lat, q_rope, kv_cache, expand_positions(positions, q_lat.shape[0], pos_offset),
                                    scale, gate, rope_inv_freq)
    from .kernel import mla_decode_triton  # imported here so the CPU path needs no triton

    return mla_decode_triton(q_lat, q_rope, kv_cache, positions, scale, gate, rope_inv_freq, pos_offset=pos_offset)


def _mla_decode_fake(q_lat, q_rope, kv_cache, positions, scale, gate=None, rope_inv_freq=None, pos_offset=None):
    check_mla_decode_args(q_lat, q_rope, kv_cache, positions, scale, gate, rope_inv_freq, pos_offset)
    return q_lat.new_empty(q_lat.shape, dtype=torch.float32)


_SCHEMA = ("(Tensor q_lat, Tensor q_rope, Tensor kv_cache, Tensor positions, float scale, Tensor? gate=None, "
           "Tensor? rope_inv_freq=None, int? pos_offset=None) -> Tensor")


mla_decode = register_op("mla_decode", _mla_decode, _mla_decode_fake, schema=_SCHEMA)
