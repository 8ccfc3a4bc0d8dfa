"""``torch.ops.lingc.mla_kv_write(Tensor c, Tensor k_rope, Tensor positions, Tensor? inv_freq,
Tensor(a!) cache, Tensor? norm_weight=None, float eps=0.0, int? pos_offset=None,
bool round_before_weight=False) -> ()``: write T new rows of an MLA latent cache in place.

Row t of ``cache`` [L, R + P] at ``positions[t]`` becomes [c[t] ; rope(k_rope[t], positions[t])]
in the cache dtype: c [T, R] is the normed latent (kv_a_layernorm's output), k_rope [T, P] the
raw shared key, RoPE interleaved in fp32 with ``inv_freq`` [P / 2] (naive.py is the exact math:
the model's own ops); with ``inv_freq`` None the key is written as it is (an MLA whose rope dims
are never rotated: Kimi Linear's ``mla_use_nope``), and k_rope may be [T, 0] (an MLA without rope
dims: the rows are c alone). With ``norm_weight`` [R] c is the raw latent and the op runs the
kv_a_layernorm itself (lingc.rmsnorm's arithmetic without a residual, ``eps`` its epsilon): the
kernel holds the whole latent row anyway, so the norm's launch goes (pdl_norm_folds.norms_into_kv_writes);
``round_before_weight`` makes that norm the Hugging Face Llama form (lingc.rmsnorm's flag: the
normed row rounded to c's dtype before the weight, the weight in c's dtype).
With ``pos_offset`` o, ``positions`` is a [1] base n and row t goes to position n + o + t (the
relay's consecutive chain positions, read from n on the device: runtime/kernels/positions.py).

The pdl_swap pass emits it for the functional cache write (index_put + select_scatter + the
epilogue copy_), which otherwise costs ~15 small kernels per MLA layer and, outside Inductor,
three copies of the whole cache slot.

Positions are not bounds-checked on the device (that would need a host sync): the engine checks
the capacity before it launches, and the CPU path (index_copy_) raises on a bad position.
Declared mutation (``mutates_args``) so functionalisation and Inductor order the cache's readers
after the write. CUDA: kernel.py (PDL-launched on Hopper); CPU: the reference.
"""
from __future__ import annotations

import torch

from lingc.runtime.kernels.positions import check_positions, expand_positions
from lingc.runtime.registry import register_op

from .naive import mla_kv_write_reference

__all__ = ["mla_kv_write", "check_mla_kv_write_args"]


def check_mla_kv_write_args(c, k_rope, positions, inv_freq, cache, norm_weight=None, eps=0.0,
                            pos_offset=None, round_before_weight=False) -> None:
    """Raise ValueError naming the bad argument."""
    op = "mla_kv_write"
    if c.dim() != 2 or k_rope.dim() != 2 or cache.dim() != 2:
        raise ValueError(f"{op}: c [T, R], k_rope [T, P] and cache [L, R + P] must be 2-d, got "
                         f"{tuple(c.shape)}, {tuple(k_rope.shape)}, {tuple(cache.shape)}")
    T, R = c.shape
    P = k_rope.shape[1]
    if k_rope.shape[0] != T:
        raise ValueError(f"{op}: c has T={T} rows but k_rope has {k_rope.shape[0]}")
    check_positions(op, positions, T, pos_offset)
    if inv_freq is not None and (P == 0 or P % 2):
        raise ValueError(f"{op}: the rope width P={P} must be > 0 and even to be rotated (interleaved pairs)")
    if cache.shape[1] != R + P:
        raise ValueError(f"{op}: cache rows hold {cache.shape[1]} values, expected R + P = {R} + {P}")
    if inv_freq is not None and (inv_freq.shape != (P // 2,) or inv_freq.dtype not in (
            torch.float32, torch.bfloat16, torch.float16) or not inv_freq.is_contiguous()):
        raise ValueError(f"{op}: inv_freq must be contiguous fp32 (or bf16 / fp16) [P/2] = [{P // 2}], got "
                         f"{inv_freq.dtype} {tuple(inv_freq.shape)}")
    if c.dtype != k_rope.dtype or not c.is_floating_point() or not cache.is_floating_point():
        raise ValueError(f"{op}: c and k_rope must share a float dtype and cache be float, got "
                         f"{c.dtype}, {k_rope.dtype}, {cache.dtype}")
    for name, t in (("c", c), ("k_rope", k_rope), ("cache", cache)):
        if t.shape[1] > 1 and t.stride(1) != 1:
            raise ValueError(f"{op}: {name} must have unit stride along its rows, got strides {t.stride()}")
    for name, t in (("k_rope", k_rope), ("positions", positions), ("inv_freq", inv_freq), ("cache", cache),
                    ("norm_weight", norm_weight)):
        if t is not None and t.device != c.device:
            raise ValueError(f"{op}: {name} is on {t.device} but c is on {c.device}")
    if norm_weight is not None:
        if tuple(norm_weight.shape) != (R,) or not norm_weight.is_floating_point() or not norm_weight.is_contiguous():
            raise ValueError(f"{op}: norm_weight must be a contiguous float [R] = [{R}] (kv_a_layernorm's "
                             f"weight), got {norm_weight.dtype} {tuple(norm_weight.shape)} "
                             f"strides {norm_weight.stride()}")
        from lingc.runtime.kernels.norms.op import _check_eps    # the norm ops' own eps rule

        _check_eps(op, eps)
        if round_before_weight and norm_weight.dtype != c.dtype:
            raise ValueError(f"{op}: round_before_weight multiplies the rounded row by norm_weight in c's "
                             f"dtype; got norm_weight {norm_weight.dtype} for c {c.dtype} (cast the weight)")
    elif round_before_weight:
        raise ValueError(f"{op}: round_before_weight is the latent norm's form; pass norm_weight with it")


def _mla_kv_write(c: torch.Tensor, k_rope: torch.Tensor, positions: torch.Tensor,
                  inv_freq: torch.Tensor | None, cache: torch.Tensor, norm_weight: torch.Tensor | None = None,
                  eps: float = 0.0, pos_offset: int | None = None, round_before_weight: bool = False) -> None:
    check_mla_kv_write_args(c, k_rope, positions, inv_freq, cache, norm_weight, eps, pos_offset, round_before_weight)
    if not c.is_cuda:
        mla_kv_write_reference(c, k_rope, expand_positions(positions, c.shape[0], pos_offset), inv_freq, cache,
                               norm_weight, eps, round_before_weight)
        return
    from .kernel import mla_kv_write_triton
    mla_kv_write_triton(c, k_rope, positions.contiguous(), inv_freq, cache, norm_weight, eps, pos_offset,
                        round_before_weight)


def _mla_kv_write_fake(c, k_rope, positions, inv_freq, cache, norm_weight=None, eps=0.0, pos_offset=None,
                       round_before_weight=False) -> None:
    check_mla_kv_write_args(c, k_rope, positions, inv_freq, cache, norm_weight, eps, pos_offset, round_before_weight)


mla_kv_write = register_op(
    "mla_kv_write", _mla_kv_write, _mla_kv_write_fake, mutates_args=("cache",),
    schema="(Tensor c, Tensor k_rope, Tensor positions, Tensor? inv_freq, Tensor(a!) cache, "
           "Tensor? norm_weight=None, float eps=0.0, int? pos_offset=None, bool round_before_weight=False) -> ()")
