"""``torch.ops.lingc.concat_into(Tensor[] parts, Tensor(a!) out) -> ()``: ``out.copy_(torch.cat(
parts, 0))`` for 1 to ``MAX_PARTS`` contiguous parts of out's dtype and trailing shape, out
contiguous, in place, as one PDL-launched kernel.

Why: the relay's draft step ends by writing the chain it drafted into a persistent buffer,
``relay.chain.copy_(cat([x, seed, d_2, ..., d_S]))`` (runtime/relay/steps.py). In a captured
graph those are two ATen kernels, the cat and the copy, each a full (non-programmatic) edge at
the end of every draft graph. pdl_swap emits this op there (passes/pdl_glue.py,
``concat_into_inputs``). CUDA: kernel.py; CPU: the reference (naive.py).
"""
from __future__ import annotations

import torch

from lingc.runtime.registry import register_op

from .naive import concat_into_reference

__all__ = ["MAX_PARTS", "concat_into", "check_concat_into_args"]

MAX_PARTS = 16      # one kernel variant per part count; the relay's chains have up to 9


def check_concat_into_args(parts, out) -> None:
    """Raise ValueError naming the bad argument."""
    op = "concat_into"
    if not 1 <= len(parts) <= MAX_PARTS:
        raise ValueError(f"{op}: takes 1 to {MAX_PARTS} parts, got {len(parts)}; concatenate in stages for more")
    if out.dim() == 0 or not out.is_contiguous():
        raise ValueError(f"{op}: out must be a contiguous tensor of at least one dim, got shape "
                         f"{tuple(out.shape)} strides {out.stride()}")
    rows = 0
    for i, p in enumerate(parts):
        if p.dim() != out.dim() or tuple(p.shape[1:]) != tuple(out.shape[1:]):
            raise ValueError(f"{op}: parts[{i}] has shape {tuple(p.shape)}; every part must be "
                             f"[n, {', '.join(map(str, out.shape[1:]))}] like out {tuple(out.shape)} along dim 0")
        if p.dtype != out.dtype or p.device != out.device:
            raise ValueError(f"{op}: parts[{i}] is {p.dtype} on {p.device}, out is {out.dtype} on {out.device}")
        if not p.is_contiguous():
            raise ValueError(f"{op}: parts[{i}] must be contiguous, got strides {p.stride()}")
        rows += p.shape[0]
    if rows != out.shape[0]:
        raise ValueError(f"{op}: the parts have {rows} rows in all but out has {out.shape[0]}")


def _check_no_overlap(parts, out) -> None:
    lo, hi = out.data_ptr(), out.data_ptr() + out.numel() * out.element_size()
    for i, p in enumerate(parts):
        a, b = p.data_ptr(), p.data_ptr() + p.numel() * p.element_size()
        if p.numel() and a < hi and lo < b:
            raise ValueError(f"concat_into: parts[{i}] overlaps out (the copy would read what it writes); "
                             f"pass a copy of it")


def _concat_into(parts: list[torch.Tensor], out: torch.Tensor) -> None:
    check_concat_into_args(parts, out)
    _check_no_overlap(parts, out)
    if not out.is_cuda:
        concat_into_reference(parts, out)
        return
    from .kernel import concat_into_triton
    concat_into_triton(parts, out)


def _concat_into_fake(parts, out) -> None:
    check_concat_into_args(parts, out)


concat_into = register_op("concat_into", _concat_into, _concat_into_fake, mutates_args=("out",),
                          schema="(Tensor[] parts, Tensor(a!) out) -> ()")
