"""Triton kernel of `lingc::moe_combine_sorted`. Program (t, c) owns token t's BLOCK_H columns: for
each slot j in order it loads the sorted row inv[t * K + j] (a gather of whole rows: no pair-order
copy is ever written), widens it to fp32 and accumulates weights[t, j] times it, then stores the
fp32 row, after adding the token's shared-expert row when given, rounded once to the output's
dtype. One read of the pair outputs and one write of the token rows, against the ATen form's
index_copy, fp32 copy and 2k - 1 elementwise passes (and the shared add's three). The product and the add may be contracted
into one FMA, so the result can differ from the reference in the last bit of each step.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from lingc.runtime.pdl import launch_kwargs, pdl_launch_dependents, pdl_supported, pdl_wait

BLOCK_H = 1024      # columns per program: 8 bf16 (16 bytes) per thread at 4 warps


@triton.jit
def _moe_combine_sorted_kernel(ys_ptr, inv_ptr, w_ptr, out_ptr, shared_ptr, H, stride_st, K: tl.constexpr,
                               BLOCK_H: tl.constexpr, USE_GDC: tl.constexpr, HAS_SHARED: tl.constexpr = False):
    t = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    m = cols < H

    pdl_wait(USE_GDC)                        # ys, the permutation and the weights are all upstream
    row = tl.load(inv_ptr + t * K).to(tl.int64)
    acc = tl.load(ys_ptr + row * H + cols, mask=m, other=0.0).to(tl.float32) * tl.load(w_ptr + t * K)
    for j in tl.static_range(1, K):
        row = tl.load(inv_ptr + t * K + j).to(tl.int64)
        y = tl.load(ys_ptr + row * H + cols, mask=m, other=0.0).to(tl.float32)
        acc = acc + y * tl.load(w_ptr + t * K + j)
    if HAS_SHARED:
        acc = acc + tl.load(shared_ptr + t * stride_st + cols, mask=m, other=0.0).to(tl.float32)
    pdl_launch_dependents(USE_GDC)
    tl.store(out_ptr + t * H + cols, acc.to(out_ptr.dtype.element_ty), mask=m)


def moe_combine_sorted_triton(ys: torch.Tensor, inv: torch.Tensor, weights: torch.Tensor,
                              out: torch.Tensor | None = None, shared: torch.Tensor | None = None,
                              out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """out [T, H] (out_dtype, fp32 when None) from ys [T*k, H] (contiguous), inv [T*k] (inv[p] =
    the sorted row of pair p), weights [T, k] fp32 contiguous and the optional shared [T, H] (unit
    stride along H) added in fp32 before the one rounding (op.check_moe_combine_sorted_args)."""
    T, K = weights.shape
    H = ys.shape[1]
    assert ys.is_contiguous() and inv.is_contiguous() and weights.is_contiguous() and ys.shape[0] == T * K
    if out is None:
        out = torch.empty((T, H), device=ys.device, dtype=out_dtype or torch.float32)
    assert out.shape == (T, H) and out.dtype == (out_dtype or torch.float32) and out.is_contiguous()
    assert shared is None or (shared.shape == (T, H) and (H <= 1 or shared.stride(1) == 1))
    if T == 0 or H == 0:
        return out
    _moe_combine_sorted_kernel[(T, triton.cdiv(H, BLOCK_H))](
        ys, inv, weights, out, shared if shared is not None else out, H,
        shared.stride(0) if shared is not None else 0, K=K, BLOCK_H=BLOCK_H, USE_GDC=pdl_supported(ys.device),
        HAS_SHARED=shared is not None, num_warps=4, **launch_kwargs(ys.device))
    return out
