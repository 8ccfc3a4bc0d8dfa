"""Triton kernel of `lingc::moe_swiglu`. Program p owns ROWS rows of h [P, 2I]: it loads their gate
columns [0, I) and up columns [I, 2I), forms silu(gate) * up in fp32 (with the clamp when
limit > 0) and stores the rows of a [P, I] rounded once to h's dtype. One read of h and one
write of a, against the eager form's two slices' fp32 copies, SiLU, product and cast (five
passes). tl.sigmoid and torch.sigmoid may differ in the last place, so a can differ from the
reference by one rounding of the output dtype.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

__all__ = ["ROWS", "moe_swiglu_triton"]

ROWS = 8        # rows per program: [8, 256] at I = 192 over 4 warps


@triton.jit
def _moe_swiglu_kernel(h_ptr, a_ptr, P, I, stride_h, stride_a, limit,
                       ROWS: tl.constexpr, BLOCK_I: tl.constexpr, CLAMP: tl.constexpr):
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK_I)
    m = (rows < P)[:, None] & (cols < I)[None, :]
    base = h_ptr + rows[:, None].to(tl.int64) * stride_h + cols[None, :]
    g = tl.load(base, mask=m, other=0.0).to(tl.float32)
    u = tl.load(base + I, mask=m, other=0.0).to(tl.float32)
    a = g * tl.sigmoid(g)
    if CLAMP:
        a = tl.minimum(a, limit)
        u = tl.minimum(tl.maximum(u, -limit), limit)
    tl.store(a_ptr + rows[:, None].to(tl.int64) * stride_a + cols[None, :], (a * u).to(a_ptr.dtype.element_ty),
             mask=m)


def moe_swiglu_triton(h: torch.Tensor, limit: float, out: torch.Tensor | None = None) -> torch.Tensor:
    """a [P, I] in h's dtype from h [P, 2I] (unit stride along the columns; op.check_moe_swiglu_args)."""
    P, two_i = h.shape
    inter = two_i // 2
    if out is None:
        out = torch.empty((P, inter), device=h.device, dtype=h.dtype)
    assert out.shape == (P, inter) and out.dtype == h.dtype and (inter <= 1 or out.stride(1) == 1)
    if P == 0 or inter == 0:
        return out
    _moe_swiglu_kernel[(triton.cdiv(P, ROWS),)](
        h, out, P, inter, h.stride(0), out.stride(0), float(limit),
        ROWS=ROWS, BLOCK_I=triton.next_power_of_2(inter), CLAMP=limit > 0, num_warps=4)
    return out
