"""Reference for ``lingc::head_matmul``: the per-head product in fp32, as the model writes it."""
from __future__ import annotations

import torch

__all__ = ["head_matmul_reference"]


def head_matmul_reference(a: torch.Tensor, b: torch.Tensor, out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """out[h] = a[h] @ b[h] with both operands upcast to fp32 (exact) and an fp32 product, then
    rounded once to ``out_dtype`` when given: the model's ``einsum(x.float(), w.float())``."""
    out = torch.bmm(a.float(), b.float())
    return out if out_dtype is None else out.to(out_dtype)
