"""``torch.ops.lingc.head_cache_write(Tensor rows, Tensor positions, Tensor(a!) cache,
Tensor? inv_freq=None, bool interleaved=False, int? pos_offset=None, Tensor? norm_weight=None,
float eps=0.0, bool round_before_weight=False, bool zero_centered=False, Tensor? rope_cos=None,
Tensor? rope_sin=None, int rope_dims=0, bool rope_by_token=False) -> ()``: write T new
rows of a per-head key or value cache in place.

- rows [T, H, D]: this step's keys (after their norm, before RoPE) or values, any T / head
  strides, unit inner stride (fp32, bf16 or fp16);
- cache [L, H, D]: one sequence's cache, any L / head strides (a Hugging Face [H, L, D] cache is
  passed as its permuted view), unit inner stride, a float dtype;
- positions [T] int32/int64 device tensor, or with ``pos_offset`` o a [1] base n (row t at
  n + o + t: runtime/kernels/positions.py);
- inv_freq [R / 2] (fp32, bf16 or fp16, R <= D): rotate the first R dims of each head by
  position * inv_freq before the write (rotate-half pairs, or ``interleaved`` ones); None: the
  rows are written as they are (values; keys of a layer without rotary embedding);
- or rope_cos, rope_sin [N, W] (any strides, float) with rope_dims = R: the angles' cos and sin
  from a model's precomputed tables, the row of each token's position (``rope_by_token``: row t,
  a per-token input), W = R / 2 values per pair or R per column (naive.py);
- norm_weight [D] or None: each row is first RMS-normed over its D dims as lingc.rmsnorm norms a
  row (``eps``; ``zero_centered``: gain 1 + w, Gemma's and Qwen3-Next's k_norm;
  ``round_before_weight``: the Llama form), rounded to the rows' dtype, then rotated: a key's
  per-head norm folded into its write (pdl_norm_folds.norms_into_head_readers), one launch fewer.

cache[positions[t]] = rope(norm(rows[t])) in the cache's dtype (naive.py is the exact math). The
pdl_swap pass emits it for a per-head cache's functional row write (index_put of the rows and the
epilogue copy back), which outside Inductor copies the whole cache twice per layer and step, and
folds the key's rotary embedding into it.

Positions are not bounds-checked on the device (that would need a host sync): the engine checks
the capacity before it launches, and the CPU path (index_copy_) raises on a bad position.
Declared mutation (``mutates_args``) so functionalisation and Inductor order the cache's readers
after the write. CUDA: kernel.py (PDL-launched on Hopper); CPU: the reference.
"""
from __future__ import annotations

import torch

from lingc.runtime.kernels.norms.op import _check_eps as check_eps
from lingc.runtime.kernels.positions import check_positions, expand_positions
from lingc.runtime.registry import register_op

from .naive import head_cache_write_reference

__all__ = ["head_cache_write", "check_head_cache_write_args", "check_head_norm", "check_inv_freq", "check_rope_table"]

MAX_HEAD_DIM = 1024     # one program holds a head's row
DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def check_inv_freq(op: str, inv_freq, D: int, device) -> None:
    """Raise ValueError unless inv_freq is None or a contiguous float [R / 2] with 0 < R <= D."""
    if inv_freq is None:
        return
    if inv_freq.dim() != 1 or not 1 <= 2 * inv_freq.shape[0] <= D or inv_freq.dtype not in DTYPES \
            or not inv_freq.is_contiguous():
        raise ValueError(f"{op}: inv_freq must be a contiguous float [rope_dims / 2] with rope_dims <= the head dim "
                         f"{D}, got {inv_freq.dtype} {tuple(inv_freq.shape)}")
    if inv_freq.device != device:
        raise ValueError(f"{op}: inv_freq is on {inv_freq.device} but the rows are on {device}")


def check_rope_table(op: str, rope_cos, rope_sin, rope_dims: int, rope_by_token: bool, inv_freq, D: int, T: int,
                     device) -> None:
    """Raise ValueError unless the rope tables are absent (rope_dims 0, rope_by_token False) or a
    cos and a sin table of one shape [N, W], W = rope_dims / 2 (a value per pair) or rope_dims (per
    column), rope_dims even in 2..D, float, on the rows' device, without inv_freq; by token N >= T."""
    if rope_cos is None and rope_sin is None:
        if rope_dims or rope_by_token:
            raise ValueError(f"{op}: rope_dims / rope_by_token describe the rope tables; rope_cos and rope_sin are "
                             f"None (got rope_dims={rope_dims}, rope_by_token={rope_by_token})")
        return
    if rope_cos is None or rope_sin is None:
        raise ValueError(f"{op}: give both rope_cos and rope_sin or neither")
    if inv_freq is not None:
        raise ValueError(f"{op}: rope tables and inv_freq are two ways to give the angles; pass one")
    if not isinstance(rope_dims, int) or rope_dims < 2 or rope_dims % 2 or rope_dims > D:
        raise ValueError(f"{op}: rope_dims must be even in 2..head_dim {D}, got {rope_dims!r}")
    for name, t in (("rope_cos", rope_cos), ("rope_sin", rope_sin)):
        if t.dim() != 2 or t.dtype not in DTYPES:
            raise ValueError(f"{op}: {name} must be a float [rows, rope_dims / 2 or rope_dims] table, got "
                             f"{t.dtype} {tuple(t.shape)}")
        if t.device != device:
            raise ValueError(f"{op}: {name} is on {t.device} but the rows are on {device}")
    if rope_cos.shape != rope_sin.shape:
        raise ValueError(f"{op}: rope_cos {tuple(rope_cos.shape)} and rope_sin {tuple(rope_sin.shape)} differ")
    if rope_cos.shape[1] not in (rope_dims // 2, rope_dims):
        raise ValueError(f"{op}: the rope tables hold {rope_cos.shape[1]} values a row; rope_dims = {rope_dims} "
                         f"takes {rope_dims // 2} (one per pair) or {rope_dims} (one per column)")
    if not isinstance(rope_by_token, bool):
        raise ValueError(f"{op}: rope_by_token must be a bool, got {rope_by_token!r}")
    if rope_by_token and rope_cos.shape[0] < T:
        raise ValueError(f"{op}: per-token rope rows ({rope_cos.shape[0]}) for T = {T} tokens")


def check_head_norm(op: str, rows_dtype: torch.dtype, D: int, device, norm_weight, eps, round_before_weight,
                    zero_centered) -> None:
    """Raise ValueError naming the bad norm argument (norm_weight None: no norm, the flags unset)."""
    if norm_weight is None:
        if round_before_weight or zero_centered:
            raise ValueError(f"{op}: round_before_weight / zero_centered are forms of the head norm; "
                             f"norm_weight is None")
        return
    if tuple(norm_weight.shape) != (D,) or norm_weight.dtype not in DTYPES or not norm_weight.is_contiguous():
        raise ValueError(f"{op}: norm_weight must be a contiguous float [head_dim] = ({D},), got "
                         f"{norm_weight.dtype} {tuple(norm_weight.shape)}")
    if norm_weight.device != device:
        raise ValueError(f"{op}: norm_weight is on {norm_weight.device} but the rows are on {device}")
    check_eps(op, eps)
    if round_before_weight and (zero_centered or norm_weight.dtype != rows_dtype):
        raise ValueError(f"{op}: round_before_weight (the Llama form) multiplies the rounded row by the weight in "
                         f"the rows' dtype {rows_dtype}, without zero_centered; got weight {norm_weight.dtype}, "
                         f"zero_centered={zero_centered}")


def check_head_cache_write_args(rows, positions, cache, inv_freq=None, interleaved=False, pos_offset=None,
                                norm_weight=None, eps=0.0, round_before_weight=False, zero_centered=False,
                                rope_cos=None, rope_sin=None, rope_dims=0, rope_by_token=False) -> None:
    """Raise ValueError naming the bad argument."""
    op = "head_cache_write"
    if rows.dim() != 3 or cache.dim() != 3:
        raise ValueError(f"{op}: rows [T, heads, head_dim] and cache [L, heads, head_dim] must be 3-d, got "
                         f"{tuple(rows.shape)} and {tuple(cache.shape)}")
    T, H, D = rows.shape
    if tuple(cache.shape[1:]) != (H, D):
        raise ValueError(f"{op}: cache rows are [heads, head_dim] = {tuple(cache.shape[1:])}, the new rows "
                         f"{(H, D)}")
    if not 1 <= D <= MAX_HEAD_DIM:
        raise ValueError(f"{op}: head_dim = {D} must be in 1..{MAX_HEAD_DIM}")
    if rows.dtype not in DTYPES or cache.dtype not in DTYPES:
        raise ValueError(f"{op}: rows and cache must be float32, bfloat16 or float16, got {rows.dtype} and "
                         f"{cache.dtype}")
    for name, t in (("rows", rows), ("cache", cache)):
        if D > 1 and t.stride(2) != 1:
            raise ValueError(f"{op}: {name} must have unit stride along its last dim, got strides {t.stride()}")
    for name, t in (("positions", positions), ("cache", cache)):
        if t.device != rows.device:
            raise ValueError(f"{op}: {name} is on {t.device} but rows are on {rows.device}")
    check_positions(op, positions, T, pos_offset)
    check_inv_freq(op, inv_freq, D, rows.device)
    if not isinstance(interleaved, bool):
        raise ValueError(f"{op}: interleaved must be a bool, got {interleaved!r}")
    check_head_norm(op, rows.dtype, D, rows.device, norm_weight, eps, round_before_weight, zero_centered)
    check_rope_table(op, rope_cos, rope_sin, rope_dims, rope_by_token, inv_freq, D, T, rows.device)


def _head_cache_write(rows, positions, cache, inv_freq=None, interleaved=False, pos_offset=None, norm_weight=None,
                      eps=0.0, round_before_weight=False, zero_centered=False, rope_cos=None, rope_sin=None,
                      rope_dims=0, rope_by_token=False) -> None:
    norm = (norm_weight, eps, round_before_weight, zero_centered)
    table = (rope_cos, rope_sin, rope_dims, rope_by_token)
    check_head_cache_write_args(rows, positions, cache, inv_freq, interleaved, pos_offset, *norm, *table)
    if not rows.is_cuda:
        head_cache_write_reference(rows, expand_positions(positions, rows.shape[0], pos_offset), cache, inv_freq,
                                   interleaved, *norm, *table)
        return
    from .kernel import head_cache_write_triton  # imported here so the CPU path needs no triton

    head_cache_write_triton(rows, positions.contiguous(), cache, inv_freq, interleaved, pos_offset, *norm, *table)


def _head_cache_write_fake(rows, positions, cache, inv_freq=None, interleaved=False, pos_offset=None,
                           norm_weight=None, eps=0.0, round_before_weight=False, zero_centered=False, rope_cos=None,
                           rope_sin=None, rope_dims=0, rope_by_token=False) -> None:
    check_head_cache_write_args(rows, positions, cache, inv_freq, interleaved, pos_offset, norm_weight, eps,
                                round_before_weight, zero_centered, rope_cos, rope_sin, rope_dims, rope_by_token)


# The mutated cache precedes every argument with a default: torch 2.11 hands a Python kernel its
# arguments without the trailing defaults (lingc/compat.py's version bump handles either way).
head_cache_write = register_op(
    "head_cache_write", _head_cache_write, _head_cache_write_fake, mutates_args=("cache",),
    schema="(Tensor rows, Tensor positions, Tensor(a!) cache, Tensor? inv_freq=None, bool interleaved=False, "
           "int? pos_offset=None, Tensor? norm_weight=None, float eps=0.0, bool round_before_weight=False, "
           "bool zero_centered=False, Tensor? rope_cos=None, Tensor? rope_sin=None, int rope_dims=0, "
           "bool rope_by_token=False) -> ()")
