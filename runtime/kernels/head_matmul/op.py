"""``torch.ops.lingc.head_matmul(Tensor a, Tensor b, bool b_is_weight, ScalarType? out_dtype=None,
bool heads_inner=False) -> Tensor``: per-head products out[h] = a[h] @ b[h] in fp32 for a few rows.

a [B, M, K] and b [B, K, N], any strides, fp32 / bf16 / fp16 (upcast exactly); out [B, M, N],
fp32 or rounded once to ``out_dtype``, contiguous, or with ``heads_inner`` stored as [M, B, N]
(the [T, H, D] layout the next projection reads, so no transposing copy follows). M <= 16 (decode and verify rows), K <=
kernel.MAX_K. naive.py is the math (the model's ``einsum(x.float(), w.float())``).

pdl_swap emits it for MLA's absorbed products (q_nope @ W_uk, o_lat @ W_uv^T per head), which
ATen runs as an fp32 upcast of the bf16 weight slice every step plus a library bmm: three to four
kernels and a 4 MB fp32 weight copy per layer. ``b_is_weight`` says b is a parameter no kernel
of the graph writes, so the kernel may read it before its PDL wait. CUDA: kernel.py; CPU: the
reference.
"""
from __future__ import annotations

import torch

from lingc.runtime.registry import register_op

from .naive import head_matmul_reference

__all__ = ["MAX_ROWS", "check_head_matmul_args", "head_matmul"]

MAX_ROWS = 16
_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def check_head_matmul_args(a, b, b_is_weight, out_dtype=None, heads_inner=False) -> None:
    """Raise ValueError naming the bad argument."""
    from .kernel import MAX_K

    op = "head_matmul"
    if a.dim() != 3 or b.dim() != 3:
        raise ValueError(f"{op}: a [B, M, K] and b [B, K, N] must be 3-d, got {tuple(a.shape)} and {tuple(b.shape)}")
    if a.shape[0] != b.shape[0] or a.shape[2] != b.shape[1]:
        raise ValueError(f"{op}: shapes do not chain: a {tuple(a.shape)} @ b {tuple(b.shape)}")
    if a.shape[1] > MAX_ROWS:
        raise ValueError(f"{op}: at most {MAX_ROWS} rows (decode/verify), got M={a.shape[1]}; use torch.bmm")
    if a.shape[2] > MAX_K:
        raise ValueError(f"{op}: K={a.shape[2]} is over the kernel's {MAX_K} (one register tile); use torch.bmm")
    for name, t in (("a", a), ("b", b)):
        if t.dtype not in _DTYPES:
            raise ValueError(f"{op}: {name}.dtype must be float32, bfloat16 or float16, got {t.dtype}")
    if out_dtype is not None and out_dtype not in _DTYPES:
        raise ValueError(f"{op}: out_dtype must be float32, bfloat16 or float16, got {out_dtype}")
    if b.device != a.device:
        raise ValueError(f"{op}: b is on {b.device} but a is on {a.device}")


def _empty_out(a, b, out_dtype, heads_inner):
    bsz, m, n = a.shape[0], a.shape[1], b.shape[2]
    dt = out_dtype or torch.float32
    if heads_inner:
        return a.new_empty((m, bsz, n), dtype=dt).transpose(0, 1)
    return a.new_empty((bsz, m, n), dtype=dt)


def _head_matmul(a, b, b_is_weight, out_dtype=None, heads_inner=False):
    check_head_matmul_args(a, b, b_is_weight, out_dtype, heads_inner)
    out = _empty_out(a, b, out_dtype, heads_inner)
    if not a.is_cuda:
        return out.copy_(head_matmul_reference(a, b, out_dtype))
    from .kernel import head_matmul_triton

    return head_matmul_triton(a, b, out_dtype, b_is_weight, out=out)


def _head_matmul_fake(a, b, b_is_weight, out_dtype=None, heads_inner=False):
    check_head_matmul_args(a, b, b_is_weight, out_dtype, heads_inner)
    return _empty_out(a, b, out_dtype, heads_inner)


head_matmul = register_op(
    "head_matmul", _head_matmul, _head_matmul_fake,
    schema="(Tensor a, Tensor b, bool b_is_weight, ScalarType? out_dtype=None, bool heads_inner=False) -> Tensor")
