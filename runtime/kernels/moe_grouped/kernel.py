"""Triton kernels of `lingc::moe_grouped` (README.md): a block table, then an up-GEMM and a
down-GEMM over the pairs sorted by expert.

- ``_block_table_kernel`` (one program): expert e's sorted rows [ends[e-1], ends[e]) become
  cdiv(count, BLOCK_M) blocks of BLOCK_M rows, in expert order; entry b of the table is (expert,
  first row, end row), and every entry past the last block is marked -1. The launch grid is sized
  by the bound cdiv(P, BLOCK_M) + min(E, P), so nothing is read back to the host.
- ``_grouped_up_kernel``, grid (cdiv(I, BLOCK_N), blocks): a CTA gathers its block's token rows
  of x (token = pair // top_k) and multiplies them with 2 x BLOCK_N rows of the expert's w13,
  gate and up rows interleaved, so the SwiGLU (swiglu_gemm's epilogue) runs on the fp32
  accumulator and one [BLOCK_M, BLOCK_N] tile of the activation is stored, rounded once. No
  gathered copy of x and no [P, 2I] intermediate are written.
- ``_grouped_down_kernel``, grid (cdiv(H, BLOCK_H), blocks): the block's activation rows times
  BLOCK_H rows of the expert's w2, stored rounded into ys (sorted rows).

The column tiles of one block are the fastest grid axis and an expert's blocks are adjacent, so
the CTAs reading the same weight tile or the same gathered rows run together and share them in
L2: each expert's weights come from HBM about once per call.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from lingc.runtime.kernels.gemm_common import dot_acc, dot_args
from lingc.runtime.kernels.swiglu_gemm.kernel import _swiglu  # the SwiGLU epilogue (with clamp)

__all__ = ["CONFIG", "MoeGroupedConfig", "block_count", "block_table", "grouped_down", "grouped_up",
           "moe_grouped_triton"]

TAIL = 256      # table entries the block-table kernel marks per step past the last block


@dataclass(frozen=True)
class MoeGroupedConfig:
    block_m: int = 64       # sorted rows per block (both GEMMs)
    block_n: int = 64       # up-GEMM: activation columns per CTA (2 x block_n weight rows)
    block_k: int = 64       # up-GEMM: H per pipeline step
    up_warps: int = 4
    up_stages: int = 4
    block_h: int = 128      # down-GEMM: output columns per CTA
    down_block_k: int = 64  # down-GEMM: I per pipeline step
    down_warps: int = 4
    down_stages: int = 3

    def __post_init__(self):
        for name in ("block_m", "block_n", "block_k", "block_h", "down_block_k"):
            v = getattr(self, name)
            if v < 16 or v & (v - 1):
                raise ValueError(f"MoeGroupedConfig.{name}={v}: use a power of two >= 16 (tl.dot's least tile)")
        for name in ("up_warps", "down_warps"):
            v = getattr(self, name)
            if v < 1 or v & (v - 1) or v > 16:
                raise ValueError(f"MoeGroupedConfig.{name}={v}: use a power of two from 1 to 16")
        for name in ("up_stages", "down_stages"):
            if getattr(self, name) < 1:
                raise ValueError(f"MoeGroupedConfig.{name}={getattr(self, name)}: use 1 or more")


CONFIG = MoeGroupedConfig()


def block_count(pairs: int, experts: int, block_m: int) -> int:
    """The block table's length: every non-empty expert pads at most one block, and at most
    min(E, P) experts are non-empty."""
    return triton.cdiv(pairs, block_m) + min(experts, pairs)


@triton.jit
def _block_table_kernel(ends_ptr, table_ptr, E, NB, BLOCK_M: tl.constexpr, E_PAD: tl.constexpr,
                        TAIL: tl.constexpr):
    e = tl.arange(0, E_PAD)
    live = e < E
    end = tl.load(ends_ptr + e, mask=live, other=0).to(tl.int32)
    start = tl.load(ends_ptr + e - 1, mask=live & (e > 0), other=0).to(tl.int32)
    n_blocks = tl.where(live, (end - start + BLOCK_M - 1) // BLOCK_M, 0)
    first = tl.cumsum(n_blocks, 0) - n_blocks
    total = tl.sum(n_blocks, 0)
    most = tl.max(n_blocks, 0)
    j = 0
    while j < most:        # block j of every expert that has one
        m = j < n_blocks
        entry = table_ptr + (first + j) * 3
        tl.store(entry, e, mask=m)
        tl.store(entry + 1, start + j * BLOCK_M, mask=m)
        tl.store(entry + 2, end, mask=m)
        j += 1
    b0 = total
    while b0 < NB:         # no block
        b = b0 + tl.arange(0, TAIL)
        tl.store(table_ptr + b * 3, tl.full((TAIL,), -1, tl.int32), mask=b < NB)
        b0 += TAIL


@triton.jit
def _block(table_ptr, b, BLOCK_M: tl.constexpr):
    """Block b's expert (-1: past the last block), its sorted rows and which of them are live (the
    rows of an entry past the last block are unwritten: read, never used)."""
    entry = table_ptr + b * 3
    rows = tl.load(entry + 1) + tl.arange(0, BLOCK_M)
    return tl.load(entry), rows, rows < tl.load(entry + 2)


@triton.jit
def _grouped_up_kernel(
    x_ptr, order_ptr, table_ptr, w_ptr, act_ptr,
    stride_xt, stride_we, stride_wn, stride_act, limit,
    H: tl.constexpr, I: tl.constexpr, TOP_K: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, HAS_LIMIT: tl.constexpr,
    DOT_PRECISION: tl.constexpr, DOT_UPCAST: tl.constexpr,
):
    pid_n = tl.program_id(0)
    e, rows, live = _block(table_ptr, tl.program_id(1), BLOCK_M)
    if e < 0:       # past the last block
        return
    tok = tl.load(order_ptr + rows, mask=live, other=0) // TOP_K
    # Weight row r: gate row j (r even) or up row I + j (r odd), j = pid_n * BLOCK_N + r // 2,
    # so the accumulator's columns come out as (g, u) pairs (swiglu_gemm's layout).
    r = tl.arange(0, 2 * BLOCK_N)
    j = pid_n * BLOCK_N + r // 2
    w_rows = tl.where(r % 2 == 0, j, I + j)
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = x_ptr + tok[:, None].to(tl.int64) * stride_xt + offs_k[None, :]
    w_ptrs = w_ptr + e.to(tl.int64) * stride_we + w_rows[:, None].to(tl.int64) * stride_wn + offs_k[None, :]
    acc = tl.zeros((BLOCK_M, 2 * BLOCK_N), dtype=tl.float32)
    for k0 in range(0, H, BLOCK_K):
        in_k = (k0 + offs_k) < H
        a = tl.load(a_ptrs, mask=live[:, None] & in_k[None, :], other=0.0)
        w = tl.load(w_ptrs, mask=(j < I)[:, None] & in_k[None, :], other=0.0)
        acc = dot_acc(a, w, acc, DOT_PRECISION, DOT_UPCAST)
        a_ptrs += BLOCK_K
        w_ptrs += BLOCK_K
    g, u = tl.split(tl.reshape(acc, (BLOCK_M, BLOCK_N, 2)))
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    tl.store(act_ptr + rows[:, None].to(tl.int64) * stride_act + cols[None, :],
             _swiglu(g, u, limit, HAS_LIMIT).to(act_ptr.dtype.element_ty),
             mask=live[:, None] & (cols < I)[None, :])


@triton.jit
def _grouped_down_kernel(
    act_ptr, table_ptr, w_ptr, y_ptr,
    stride_act, stride_we, stride_wh, stride_y,
    H: tl.constexpr, I: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_K: tl.constexpr,
    DOT_PRECISION: tl.constexpr, DOT_UPCAST: tl.constexpr,
):
    pid_h = tl.program_id(0)
    e, rows, live = _block(table_ptr, tl.program_id(1), BLOCK_M)
    if e < 0:       # past the last block
        return
    offs_h = pid_h * BLOCK_H + tl.arange(0, BLOCK_H)
    in_h = offs_h < H
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = act_ptr + rows[:, None].to(tl.int64) * stride_act + offs_k[None, :]
    w_ptrs = w_ptr + e.to(tl.int64) * stride_we + offs_h[:, None].to(tl.int64) * stride_wh + offs_k[None, :]
    acc = tl.zeros((BLOCK_M, BLOCK_H), dtype=tl.float32)
    for k0 in range(0, I, BLOCK_K):
        in_k = (k0 + offs_k) < I
        a = tl.load(a_ptrs, mask=live[:, None] & in_k[None, :], other=0.0)
        w = tl.load(w_ptrs, mask=in_h[:, None] & in_k[None, :], other=0.0)
        acc = dot_acc(a, w, acc, DOT_PRECISION, DOT_UPCAST)
        a_ptrs += BLOCK_K
        w_ptrs += BLOCK_K
    tl.store(y_ptr + rows[:, None].to(tl.int64) * stride_y + offs_h[None, :],
             acc.to(y_ptr.dtype.element_ty), mask=live[:, None] & in_h[None, :])


def block_table(ends: torch.Tensor, pairs: int, block_m: int, out: torch.Tensor | None = None) -> torch.Tensor:
    """int32 [block_count(P, E, block_m), 3]: (expert, first sorted row, end row) per block, -1
    in the expert column of every entry past the last block (module docstring)."""
    experts = ends.numel()
    nb = block_count(pairs, experts, block_m)
    if out is None:
        out = torch.empty((nb, 3), dtype=torch.int32, device=ends.device)
    assert out.shape == (nb, 3) and out.dtype == torch.int32 and out.is_contiguous()
    _block_table_kernel[(1,)](ends, out, experts, nb, BLOCK_M=block_m,
                              E_PAD=max(16, triton.next_power_of_2(experts)), TAIL=TAIL, num_warps=4)
    return out


def grouped_up(x: torch.Tensor, order: torch.Tensor, table: torch.Tensor, w13: torch.Tensor, act: torch.Tensor,
               limit: float, top_k: int, cfg: MoeGroupedConfig) -> torch.Tensor:
    """act [P, I] = swiglu of the gathered rows' gate/up projections (sorted rows), in place."""
    inter = w13.shape[1] // 2
    _grouped_up_kernel[(triton.cdiv(inter, cfg.block_n), table.shape[0])](
        x, order, table, w13, act,
        x.stride(0), w13.stride(0), w13.stride(1), act.stride(0), float(limit) if limit > 0 else float("inf"),
        H=x.shape[1], I=inter, TOP_K=top_k, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k,
        HAS_LIMIT=limit > 0, **dot_args(x.dtype), num_warps=cfg.up_warps, num_stages=cfg.up_stages)
    return act


def grouped_down(act: torch.Tensor, table: torch.Tensor, w2: torch.Tensor, out: torch.Tensor,
                 cfg: MoeGroupedConfig) -> torch.Tensor:
    """out [P, H] = the activation rows' down projections (sorted rows), in place."""
    H, inter = w2.shape[1], w2.shape[2]
    _grouped_down_kernel[(triton.cdiv(H, cfg.block_h), table.shape[0])](
        act, table, w2, out,
        act.stride(0), w2.stride(0), w2.stride(1), out.stride(0),
        H=H, I=inter, BLOCK_M=cfg.block_m, BLOCK_H=cfg.block_h, BLOCK_K=cfg.down_block_k,
        **dot_args(act.dtype), num_warps=cfg.down_warps, num_stages=cfg.down_stages)
    return out


def moe_grouped_triton(x: torch.Tensor, order: torch.Tensor, ends: torch.Tensor, w13: torch.Tensor,
                       w2: torch.Tensor, limit: float, top_k: int, *, config: MoeGroupedConfig | None = None,
                       act: torch.Tensor | None = None, out: torch.Tensor | None = None,
                       table: torch.Tensor | None = None) -> torch.Tensor:
    """ys [P, H] in x's dtype (naive.moe_grouped_reference) in three launches (block table,
    up-GEMM, down-GEMM); arguments checked by the op (x, w13 and w2 with unit stride along
    their last dim). ``act`` [P, I] and ``out`` [P, H] (x's dtype) and ``table``
    (``block_table``'s) let tests pass poisoned buffers."""
    cfg = config or CONFIG
    P, (_, two_i, H) = order.numel(), w13.shape
    inter = two_i // 2
    if act is None:
        act = torch.empty((P, inter), device=x.device, dtype=x.dtype)
    if out is None:
        out = torch.empty((P, H), device=x.device, dtype=x.dtype)
    assert act.shape == (P, inter) and out.shape == (P, H) and act.stride(1) == 1 and out.stride(1) == 1
    if P == 0:
        return out
    table = block_table(ends, P, cfg.block_m, table)
    grouped_up(x, order, table, w13, act, limit, top_k, cfg)
    return grouped_down(act, table, w2, out, cfg)
