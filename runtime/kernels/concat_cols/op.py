"""``torch.ops.lingc.concat_cols(Tensor a, Tensor b) -> Tensor``: ``torch.cat([a, b], -1)`` for
2-d a [T, D1] and b [T, D2] of one dtype, as one PDL-launched kernel.

Why an op for a copy: in a captured step graph ATen's cat is a full (non-programmatic) edge, so
the kernel after it cannot start before the copy ends. NEXTN's draft head concatenates its two
normed inputs (the token embedding and the previous hidden state) for eh_proj, a 26 MB GEMM at
flash-tp4-rank: behind the cat it streams nothing until the copy is done (pdl_swap emits this op
there, passes/pdl_glue.py). CUDA: kernel.py; CPU: the reference. Out of place.
"""
from __future__ import annotations

import torch

from lingc.runtime.registry import register_op

from .naive import concat_cols_reference

__all__ = ["concat_cols", "check_concat_cols_args"]


def check_concat_cols_args(a, b) -> None:
    """Raise ValueError naming the bad argument."""
    op = "concat_cols"
    if a.dim() != 2 or b.dim() != 2:
        raise ValueError(f"{op}: a [T, D1] and b [T, D2] must be 2-d, got {tuple(a.shape)} and {tuple(b.shape)}")
    if a.shape[0] != b.shape[0]:
        raise ValueError(f"{op}: a has {a.shape[0]} rows but b has {b.shape[0]}")
    if a.dtype != b.dtype:
        raise ValueError(f"{op}: a and b must share a dtype, got {a.dtype} and {b.dtype}")
    if a.device != b.device:
        raise ValueError(f"{op}: b is on {b.device} but a is on {a.device}")
    for name, t in (("a", a), ("b", b)):
        if t.shape[1] > 1 and t.stride(1) != 1:
            raise ValueError(f"{op}: {name} must have unit stride along its rows, got strides {t.stride()}")


def _concat_cols(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    check_concat_cols_args(a, b)
    if not a.is_cuda:
        return concat_cols_reference(a, b)
    from .kernel import concat_cols_triton
    return concat_cols_triton(a, b)


def _concat_cols_fake(a, b):
    check_concat_cols_args(a, b)
    return a.new_empty((a.shape[0], a.shape[1] + b.shape[1]))


concat_cols = register_op("concat_cols", _concat_cols, _concat_cols_fake)
