"""GQA decode attention as an opaque, functional custom op.

``torch.ops.lingc.gqa_decode(Tensor q, Tensor k_cache, Tensor v_cache, Tensor positions,
float scale, int window=0, int? pos_offset=None, Tensor? inv_freq=None, bool interleaved=False,
Tensor? gate=None, ScalarType? out_dtype=None, Tensor? norm_weight=None, float eps=0.0,
bool round_before_weight=False, bool zero_centered=False, Tensor? rope_cos=None, Tensor? rope_sin=None,
int rope_dims=0, bool rope_by_token=False) -> Tensor``

- q [T, HQ, D]: the queries after their norm (fp32, bf16 or fp16; unit inner stride, any T /
  head strides), after their rotary embedding too unless ``inv_freq`` is given;
- k_cache [L, HKV, D], v_cache [L, HKV, DV]: one sequence's caches (bf16, fp16 or fp32, one dtype,
  unit inner stride), read AFTER this step's rows were written (the op does not write them);
  HQ is a multiple of HKV (G = HQ / HKV query heads per key/value head);
- positions [T] int32/int64 device tensor: query t sees rows 0..positions[t]; with ``pos_offset``
  o a [1] base n, query t at n + o + t (runtime/kernels/positions.py);
- scale: the softmax scale (D^-0.5 in most models);
- window: 0, or a sliding window: query t sees only rows positions[t] - window + 1 .. positions[t]
  (Mistral's, Gemma's and GPT-OSS's local layers);
- inv_freq [R / 2] (R <= D) or None: rotate the first R dims of each query head by its position
  first (RoPE folded into the attention; rotate-half pairs, or ``interleaved`` ones), fp32 rounded
  once to q's dtype; the keys are rotated by their cache write (lingc.head_cache_write);
- or rope_cos, rope_sin [N, W] with rope_dims = R: the angles' cos and sin from the model's
  precomputed tables instead of inv_freq, at each query's position (``rope_by_token``: row t of a
  per-token input), W = R / 2 values per pair or R per column (head_cache_write/naive.py);
- gate [T, HQ, DV] (any float dtype, unit inner stride) or None: the output is multiplied by
  sigmoid(gate) in fp32 (Qwen3-Next's gated attention), inside the combine kernel;
- norm_weight [D] or None: each query head's row is first RMS-normed as lingc.rmsnorm norms a
  row (``eps``; ``zero_centered``: gain 1 + w, Qwen3-Next's q_norm; ``round_before_weight``: the
  Llama form) and rounded to q's dtype, before its RoPE: the query's per-head norm folded into the
  load (pdl_norm_folds.norms_into_head_readers), one launch fewer;
- out_dtype: the output's dtype (float32 when None; a 16-bit model's bfloat16 / float16 rounds
  the fp32 result once in the combine's store, so no cast kernel follows the op).

Returns o [T, HQ, DV] (out_dtype, fp32 by default) = softmax(q k^T * scale, causal) @ v. T is 1..16 (decode and verify
chains; prefill keeps the model's path). naive.py holds the exact math, kernel.py the split-K
Triton kernel (PDL-launched on Hopper; mla_decode's combine), README.md the design.
"""
from __future__ import annotations

import math

import torch

from lingc.runtime.kernels.head_cache_write.op import check_head_norm, check_inv_freq, check_rope_table
from lingc.runtime.kernels.positions import check_positions, expand_positions
from lingc.runtime.registry import register_op

from .naive import gqa_decode_reference

__all__ = ["MAX_T", "MAX_HEAD_DIM", "gqa_decode", "check_gqa_decode_args"]

MAX_T = 16              # decode and verify chains; prefill keeps the model's path
MAX_GROUP = 64          # the query heads of one key/value head are one tile (with the chain's queries)
MAX_HEAD_DIM = 256      # a head's keys and values are one tile wide
Q_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
KV_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def check_gqa_decode_args(q, k_cache, v_cache, positions, scale, window=0, pos_offset=None, inv_freq=None,
                          interleaved=False, gate=None, out_dtype=None, norm_weight=None, eps=0.0,
                          round_before_weight=False, zero_centered=False, rope_cos=None, rope_sin=None, rope_dims=0,
                          rope_by_token=False) -> None:
    """Raise ValueError naming the bad argument of ``gqa_decode``."""
    op = "gqa_decode"
    if q.dim() != 3:
        raise ValueError(f"{op}: q must be [T, heads, head_dim] (3-d), got shape {tuple(q.shape)}")
    T, HQ, D = q.shape
    if not 1 <= T <= MAX_T:
        raise ValueError(f"{op}: T = {T} query positions, must be in 1..{MAX_T} (decode or a verify chain; "
                         f"prefill keeps the model's attention)")
    for name, c in (("k_cache", k_cache), ("v_cache", v_cache)):
        if c.dim() != 3:
            raise ValueError(f"{op}: {name} must be one sequence's [L, kv_heads, head_dim] (3-d), got shape "
                             f"{tuple(c.shape)}")
        if c.dtype not in KV_DTYPES:
            raise ValueError(f"{op}: {name}.dtype must be bfloat16, float16 or float32, got {c.dtype}")
        if c.stride(2) != 1 and c.shape[2] > 1:
            raise ValueError(f"{op}: {name} must have unit stride along its last dim, got strides {c.stride()}")
        if c.device != q.device:
            raise ValueError(f"{op}: {name} is on {c.device} but q is on {q.device}")
    L, HKV, Dk = k_cache.shape
    if tuple(v_cache.shape[:2]) != (L, HKV):
        raise ValueError(f"{op}: v_cache must be [L, kv_heads, DV] = [{L}, {HKV}, DV] like k_cache "
                         f"{tuple(k_cache.shape)}, got {tuple(v_cache.shape)}")
    if v_cache.dtype != k_cache.dtype:
        raise ValueError(f"{op}: k_cache and v_cache must share a dtype, got {k_cache.dtype} and {v_cache.dtype}")
    if L < 1:
        raise ValueError(f"{op}: the caches have no rows (L = 0)")
    if Dk != D:
        raise ValueError(f"{op}: q's head_dim {D} differs from k_cache's {Dk}")
    DV = v_cache.shape[2]
    for name, d in (("head_dim", D), ("v_cache's head_dim", DV)):
        if not 1 <= d <= MAX_HEAD_DIM:
            raise ValueError(f"{op}: {name} = {d} must be in 1..{MAX_HEAD_DIM}")
    if HKV < 1 or HQ % HKV:
        raise ValueError(f"{op}: q's {HQ} heads must be a multiple of the caches' {HKV} key/value heads")
    if HQ // HKV > MAX_GROUP:
        raise ValueError(f"{op}: {HQ // HKV} query heads per key/value head, at most {MAX_GROUP}")
    if q.dtype not in Q_DTYPES:
        raise ValueError(f"{op}: q.dtype must be float32, bfloat16 or float16, got {q.dtype}")
    if q.stride(2) != 1 and D > 1:
        raise ValueError(f"{op}: q must have unit stride along its last dim (any T / head strides), got "
                         f"strides {q.stride()}")
    if positions.device != q.device:
        raise ValueError(f"{op}: positions is on {positions.device} but q is on {q.device}")
    check_positions(op, positions, T, pos_offset)
    if not (isinstance(scale, (int, float)) and math.isfinite(scale) and scale > 0):
        raise ValueError(f"{op}: scale must be a finite number > 0 (most models use head_dim^-0.5), got {scale}")
    if isinstance(window, bool) or not isinstance(window, int) or window < 0:
        raise ValueError(f"{op}: window must be an int >= 0 (0: no sliding window), got {window!r}")
    check_inv_freq(op, inv_freq, D, q.device)
    if not isinstance(interleaved, bool):
        raise ValueError(f"{op}: interleaved must be a bool, got {interleaved!r}")
    if gate is not None:
        if tuple(gate.shape) != (T, HQ, DV) or gate.dtype not in Q_DTYPES or (DV > 1 and gate.stride(2) != 1):
            raise ValueError(f"{op}: gate must be a float [T, heads, DV] = {(T, HQ, DV)} with unit stride along its "
                             f"last dim, got {gate.dtype} {tuple(gate.shape)} strides {gate.stride()}")
        if gate.device != q.device:
            raise ValueError(f"{op}: gate is on {gate.device} but q is on {q.device}")
    if out_dtype is not None and out_dtype not in Q_DTYPES:
        raise ValueError(f"{op}: out_dtype must be float32, bfloat16 or float16 (or None: float32), got {out_dtype}")
    check_head_norm(op, q.dtype, D, q.device, norm_weight, eps, round_before_weight, zero_centered)
    check_rope_table(op, rope_cos, rope_sin, rope_dims, rope_by_token, inv_freq, D, T, q.device)


def _gqa_decode(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, positions: torch.Tensor,
                scale: float, window: int = 0, pos_offset: int | None = None, inv_freq: torch.Tensor | None = None,
                interleaved: bool = False, gate: torch.Tensor | None = None,
                out_dtype: torch.dtype | None = None, norm_weight: torch.Tensor | None = None, eps: float = 0.0,
                round_before_weight: bool = False, zero_centered: bool = False, rope_cos: torch.Tensor | None = None,
                rope_sin: torch.Tensor | None = None, rope_dims: int = 0, rope_by_token: bool = False) -> torch.Tensor:
    norm = dict(norm_weight=norm_weight, eps=eps, round_before_weight=round_before_weight,
                zero_centered=zero_centered, rope_cos=rope_cos, rope_sin=rope_sin, rope_dims=rope_dims,
                rope_by_token=rope_by_token)
    check_gqa_decode_args(q, k_cache, v_cache, positions, scale, window, pos_offset, inv_freq, interleaved, gate,
                          out_dtype, **norm)
    if not q.is_cuda:
        o = gqa_decode_reference(q, k_cache, v_cache, expand_positions(positions, q.shape[0], pos_offset), scale,
                                 window, inv_freq, interleaved, gate, **norm)
        return o if out_dtype is None else o.to(out_dtype)
    from .kernel import gqa_decode_triton  # imported here so the CPU path needs no triton

    out = torch.empty((*q.shape[:2], v_cache.shape[2]), device=q.device, dtype=out_dtype or torch.float32)
    return gqa_decode_triton(q, k_cache, v_cache, positions, scale, out, window=window, pos_offset=pos_offset,
                             inv_freq=inv_freq, interleaved=interleaved, gate=gate, **norm)


def _gqa_decode_fake(q, k_cache, v_cache, positions, scale, window=0, pos_offset=None, inv_freq=None,
                     interleaved=False, gate=None, out_dtype=None, norm_weight=None, eps=0.0, round_before_weight=False,
                     zero_centered=False, rope_cos=None, rope_sin=None, rope_dims=0, rope_by_token=False):
    check_gqa_decode_args(q, k_cache, v_cache, positions, scale, window, pos_offset, inv_freq, interleaved, gate,
                          out_dtype, norm_weight, eps, round_before_weight, zero_centered, rope_cos, rope_sin,
                          rope_dims, rope_by_token)
    return q.new_empty((*q.shape[:2], v_cache.shape[2]), dtype=out_dtype or torch.float32)


_SCHEMA = ("(Tensor q, Tensor k_cache, Tensor v_cache, Tensor positions, float scale, int window=0, "
           "int? pos_offset=None, Tensor? inv_freq=None, bool interleaved=False, Tensor? gate=None, "
           "ScalarType? out_dtype=None, Tensor? norm_weight=None, float eps=0.0, bool round_before_weight=False, "
           "bool zero_centered=False, Tensor? rope_cos=None, Tensor? rope_sin=None, int rope_dims=0, "
           "bool rope_by_token=False) -> Tensor")


gqa_decode = register_op("gqa_decode", _gqa_decode, _gqa_decode_fake, schema=_SCHEMA)
