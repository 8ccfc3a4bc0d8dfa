"""Reference for ``lingc::head_matmul``: the per-head product in fp32, as the model writes it."""
from __future__ import annotations

import torch

__all__ = ["head_matmul_reference"]


def head_matmul_reference(a: torch.Tensor, b: torch.Tensor, out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """out[h] = a[h] @ b[h] with both operands upcast to fp32 (exact) and an fp32 product, then
    rounded once to ``out_dtype`` when given: the model's ``einsum(x.float(), w.float())``, one
    row at a time (each in a fresh buffer), because a library bmm picks its algorithm (and summation order) by the row
    count, and a row's bits must not depend on how many rows come with it (batch invariance)."""
    bf = b.float()
    # each row copied to a fresh buffer: the CPU BLAS takes another path at an unaligned offset
    out = torch.cat([torch.bmm(a[:, m:m + 1].float().clone(), bf) for m in range(a.shape[1])], 1)
    return out if out_dtype is None else out.to(out_dtype)
