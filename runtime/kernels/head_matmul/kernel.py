"""Triton kernel for ``lingc::head_matmul``: out[h, m] = a[h, m] @ b[h] for a few rows m.

Grid (B, cdiv(N, BLOCK_N), row groups). Program (h, j, r) holds the whole [K, BLOCK_N] tile of
b[h] in registers (K <= MAX_K) and walks the rows of its group: row m is one fp32 multiply and
one tree reduction over K, stored (optionally rounded) to out[h, m, j-tile]. The rows are split
over up to ROW_GROUPS groups (gemm_common.split_rows; by default every row of a decode chain
its own program: a walked row costs its a-load's L2 latency, and verify's T = 6 took ~3x T = 1's
time with one group). M and the rows per group are runtime loop bounds and the tile shapes come
from (K, N) only, so a row's result does not depend on M or its group (batch invariant in T).

PDL: when b is a weight (``B_IS_WEIGHT``, the pass knows it: a parameter nothing in the graph
writes), its tile is loaded before ``gdc_wait``, so the cold read overlaps the producer's tail;
otherwise everything waits first. Any strides for a and b (the MLA absorbed products read W_uk
along N and W_uv along K), fp32 or bf16 operands, upcast in registers.

Tiles: BLOCK_N = max(8, min(next_pow2(N), TILE_ELEMS / next_pow2(K))), so a program holds
TILE_ELEMS = 4096 weight values (32 per thread at 4 warps) and flash-tp4-rank's two MLA products
(8 heads, K x N = 128 x 512 and 512 x 128) run on 128 programs each.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from lingc.runtime.kernels.gemm_common import split_rows
from lingc.runtime.pdl import pdl_launch_dependents, pdl_supported, pdl_wait_small

__all__ = ["MAX_K", "TILE_ELEMS", "head_matmul_block_n", "head_matmul_triton"]

MAX_K = 1024
TILE_ELEMS = 4096
# Programs along the rows per (head, column tile): 8 puts each row of a relay chain (T <= 8) in
# its own program (flash-tp4-rank: 128 programs a row, small enough to be resident together).
ROW_GROUPS = 8


@triton.jit(do_not_specialize=["M", "ROWS"])
def _head_matmul_kernel(
    a_ptr, b_ptr, out_ptr, M, ROWS, K, N,
    stride_ab, stride_am, stride_ak, stride_bb, stride_bk, stride_bn, stride_ob, stride_om,
    BLOCK_K: tl.constexpr, BLOCK_N: tl.constexpr, B_IS_WEIGHT: tl.constexpr, USE_GDC: tl.constexpr,
):
    h = tl.program_id(0)
    offs_k = tl.arange(0, BLOCK_K)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_k = offs_k < K
    mask_n = offs_n < N
    b_ptrs = b_ptr + h * stride_bb + offs_k[:, None] * stride_bk + offs_n[None, :] * stride_bn
    b_mask = mask_k[:, None] & mask_n[None, :]
    # A small kernel (runtime/pdl.py): after the latent output absorption comes the o_proj GEMM,
    # which streams its weight while this one runs.
    if B_IS_WEIGHT:
        bt = tl.load(b_ptrs, mask=b_mask, other=0.0)
        pdl_wait_small(USE_GDC)
    else:
        pdl_wait_small(USE_GDC)
        bt = tl.load(b_ptrs, mask=b_mask, other=0.0)
    pdl_launch_dependents(USE_GDC)
    bf = bt.to(tl.float32)
    # A while loop: the triton 3.6 interpreter cannot range() over a runtime scalar.
    m = tl.program_id(2) * ROWS
    m_end = tl.minimum(m + ROWS, M)
    while m < m_end:
        a = tl.load(a_ptr + h * stride_ab + m * stride_am + offs_k * stride_ak, mask=mask_k, other=0.0)
        acc = tl.sum(a.to(tl.float32)[:, None] * bf, axis=0)
        tl.store(out_ptr + h * stride_ob + m * stride_om + offs_n, acc.to(out_ptr.dtype.element_ty), mask=mask_n)
        m += 1


def head_matmul_block_n(k: int, n: int) -> int:
    return max(8, min(triton.next_power_of_2(n), TILE_ELEMS // triton.next_power_of_2(k)))


def head_matmul_triton(a: torch.Tensor, b: torch.Tensor, out_dtype: torch.dtype | None = None,
                       b_is_weight: bool = False, *, out: torch.Tensor | None = None,
                       use_pdl: bool | None = None, groups: int | None = None) -> torch.Tensor:
    """a [B, M, K], b [B, K, N] (any strides; fp32/bf16/fp16) -> out [B, M, N] contiguous in
    ``out_dtype`` (fp32 by default). ``out`` may be given (tests pass a poisoned buffer);
    ``groups`` overrides ROW_GROUPS (the same bits for any value). Arguments are assumed
    validated by the op."""
    bsz, m, k = a.shape
    n = b.shape[2]
    if out is None:
        out = torch.empty((bsz, m, n), device=a.device, dtype=out_dtype or torch.float32)
    assert out.shape == (bsz, m, n) and out.stride(2) == 1
    if bsz == 0 or m == 0 or n == 0:
        return out
    if use_pdl is None:
        use_pdl = pdl_supported(a.device)
    block_n = head_matmul_block_n(k, n)
    n_groups, rows = split_rows(m, ROW_GROUPS if groups is None else groups)
    _head_matmul_kernel[(bsz, triton.cdiv(n, block_n), n_groups)](
        a, b, out, m, rows, k, n,
        a.stride(0), a.stride(1), a.stride(2), b.stride(0), b.stride(1), b.stride(2),
        out.stride(0), out.stride(1),
        BLOCK_K=triton.next_power_of_2(k), BLOCK_N=block_n, B_IS_WEIGHT=bool(b_is_weight), USE_GDC=use_pdl,
        num_warps=4, **({"launch_pdl": True} if use_pdl else {}),
    )
    return out
