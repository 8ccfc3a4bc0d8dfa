"""Design C of the decode GEMM: a GEMV on CUDA cores, a few whole weight rows per CTA.

Why: a chain of kernels that only read reaches 76% of the copy bandwidth on 26 MB with many
small CTAs (16 KB each, loaded before the PDL wait; benchmarks/read_probe.py, H200), where the
tensor-core designs A and B run ~160 CTAs of 32-160 KB with split-K partials and a ticket
reduction, and reach 60%. Design C is the read probe's shape with the arithmetic added: CTA i
owns ``ROWS`` rows of one weight over the WHOLE of K (no split, no partials, no ticket), loads
them before ``gdc_wait`` as at most two power-of-two tiles (K = K1 + K2, K1 the largest power of
two <= K, K2 the power of two covering the rest, masked), converts them to fp32 once, then for
each of the M rows of x (converted once per row) computes ROWS dot products in fp32 (one
``tl.sum`` per tile, tile 1 then tile 2) and runs the same epilogue as the other designs. The K
of a tile is spread over all the CTA's threads (16-byte loads), so a row's x is read and
converted once per CTA, not once per weight row. With ``num_stages`` 2 the next row's x is
requested before the current one is reduced. Weight loads bypass L1 (``.cg``: read once); x
loads stay there (``.ca``: every CTA of an SM reads the same rows).

Measured (H200, session 10, ``python -m benchmarks.gemm_sweep --m 1 6``, results README): the
fastest M = 1 design on every decode projection shape (fused KDA 8.6 us against 10.0 for the
table's design A; o_proj 2.6 against 3.7), but 1.5-2x slower than A and B at M = 6 (fused KDA
18 against 9.8 us): every row adds ~1.9 us there, whether the per-row work is three ALU ops per
weight element or one, whether x comes from L2 or L1. Batch invariance forbids choosing the
design by M, so no table entry uses it (plain decode would gain 0.14 ms a step, the relay would
lose 0.4). Earlier forms, for the record: one weight row per warp ([ROWS, chunks, 256] tiles,
warp-local reductions) was ALU-bound at M = 6 (each warp converted its own copy of x and its
weights again per row).

Batch invariance: the per-row arithmetic is the loop body, the same for every M, and the tiles
and their reduction trees are functions of (K, ROWS, num_warps) only. A row's bits therefore do
not depend on M; they differ from designs A and B in the last bits (another summation order),
which is why a shape's design comes from the launch table, never from M.

It is a candidate of ``benchmarks.gemm_sweep`` (``config._c``); the launch table picks it only
where a sweep measured it best over the M values the relay runs.
"""
import torch
import triton
import triton.language as tl

from lingc.runtime.pdl import pdl_launch_dependents, pdl_wait

from .config import GemmConfig
from .kernel import _epilogue, _weight_block, block_plan, resolve_pdl

__all__ = ["gemv_triton", "k_tiles_pow2"]


def k_tiles_pow2(k: int) -> tuple[int, int]:
    """(K1, K2): K1 the largest power of two <= K, K2 the smallest power of two >= K - K1 (0 when
    K is a power of two). K = 2560: (2048, 512); 1024: (1024, 0); 1536: (1024, 512); 40: (32, 8)."""
    if k <= 0:
        return 1, 0
    k1 = 1 << (k.bit_length() - 1)
    return k1, (triton.next_power_of_2(k - k1) if k > k1 else 0)


@triton.jit
def _load_w(w_row, rows_mask, K_FIRST: tl.constexpr, KT: tl.constexpr, K):
    """The rows' K tile [K_FIRST, K_FIRST + KT) as [ROWS, KT] (masked past K). Read once, so
    not kept in L1 (.cg): the SM's L1 holds the x rows that all its CTAs read."""
    kk = K_FIRST + tl.arange(0, KT)[None, :]
    return tl.load(w_row + kk, mask=rows_mask & (kk < K), other=0.0, cache_modifier=".cg")


@triton.jit
def _load_x(x_row, m_ok, stride_xk, K_FIRST: tl.constexpr, KT: tl.constexpr, K):
    """One x row's K tile as [1, KT] (zeros when not m_ok), converted to fp32 once."""
    kk = K_FIRST + tl.arange(0, KT)[None, :]
    return tl.load(x_row + kk * stride_xk, mask=m_ok & (kk < K), other=0.0, cache_modifier=".ca").to(tl.float32)


@triton.jit
def _load_x_row(x_row, m_ok, stride_xk, K1: tl.constexpr, K2: tl.constexpr, K):
    """One x row as its two K tiles (the second = the first when K2 = 0, unused)."""
    x1 = _load_x(x_row, m_ok, stride_xk, 0, K1, K)
    x2 = x1
    if K2 > 0:
        x2 = _load_x(x_row, m_ok, stride_xk, K1, K2, K)
    return x1, x2


@triton.jit(do_not_specialize=["M"])
def _gemv_kernel(
    x_ptr, out_ptr, bias_ptr, res_ptr, mul_ptr,
    w_ptrs, w_strides, w_rows, block_starts, col_starts,
    M, K,
    stride_xm, stride_xk, stride_om, stride_on,
    stride_b, stride_rm, stride_rn, stride_gm, stride_gn,
    ROWS: tl.constexpr, K1: tl.constexpr, K2: tl.constexpr, X_AHEAD: tl.constexpr,
    HAS_BIAS: tl.constexpr, HAS_RES: tl.constexpr, HAS_MUL: tl.constexpr, USE_GDC: tl.constexpr,
):
    pid_n = tl.program_id(0)
    w_ptr, stride_wn, rows, mask_n, cols = _weight_block(pid_n, w_ptrs, w_strides, w_rows, block_starts,
                                                         col_starts, ROWS)
    # The CTA's whole rows, requested before the wait (producer-independent).
    w_row = w_ptr + rows[:, None] * stride_wn
    rows_mask = mask_n[:, None]
    w1 = _load_w(w_row, rows_mask, 0, K1, K)
    w2 = w1
    if K2 > 0:
        w2 = _load_w(w_row, rows_mask, K1, K2, K)

    pdl_wait(USE_GDC)
    pdl_launch_dependents(USE_GDC)
    # Converted once, not per x row: the per-row work is then one FMA per weight element.
    w1 = w1.to(tl.float32)
    w2 = w2.to(tl.float32)

    # X_AHEAD: row m + 1's x is requested before row m is reduced, so its L2 round trip hides
    # behind the arithmetic (one more x tile in registers: fewer CTAs per SM). Either way the
    # arithmetic of a row is the same. A while loop: the triton 3.6 interpreter cannot range()
    # over a runtime scalar.
    x1, x2 = _load_x_row(x_ptr, 0 < M, stride_xk, K1, K2, K)
    m = 0
    while m < M:
        nxt = x_ptr + (m + 1) * stride_xm
        if X_AHEAD:
            n1, n2 = _load_x_row(nxt, m + 1 < M, stride_xk, K1, K2, K)
        acc = tl.sum(w1 * x1, axis=1)
        if K2 > 0:
            acc += tl.sum(w2 * x2, axis=1)
        offs_m = m + tl.arange(0, 1)
        y = _epilogue(acc[None, :], offs_m, cols, offs_m < M, mask_n, bias_ptr, res_ptr, mul_ptr, stride_b,
                      stride_rm, stride_rn, stride_gm, stride_gn, HAS_BIAS, HAS_RES, HAS_MUL)
        tl.store(out_ptr + offs_m[:, None] * stride_om + cols[None, :] * stride_on,
                 y.to(x_ptr.dtype.element_ty).to(out_ptr.dtype.element_ty), mask=mask_n[None, :])
        if X_AHEAD:
            x1, x2 = n1, n2
        else:
            x1, x2 = _load_x_row(nxt, m + 1 < M, stride_xk, K1, K2, K)
        m += 1


def gemv_triton(x: torch.Tensor, weights: list[torch.Tensor], bias, residual, sigmoid_mul, out: torch.Tensor,
                cfg: GemmConfig, use_pdl: bool | None) -> torch.Tensor:
    """Design C launch of ``kernel.gemm_triton`` (which validates and allocates ``out``)."""
    m, k = x.shape
    rows = [w.shape[0] for w in weights]
    block_starts, col_starts, blocks = block_plan(rows, cfg.block_n)
    k1, k2 = k_tiles_pow2(k)
    use_gdc, launch = resolve_pdl(x.device, use_pdl)
    bias_t, res_t, mul_t = (t if t is not None else out for t in (bias, residual, sigmoid_mul))
    _gemv_kernel[(blocks,)](
        x, out, bias_t, res_t, mul_t,
        tuple(weights), tuple(w.stride(0) for w in weights), tuple(rows), block_starts, col_starts,
        m, k,
        x.stride(0), x.stride(1), out.stride(0), out.stride(1),
        bias.stride(0) if bias is not None else 0,
        *(residual.stride() if residual is not None else (0, 0)),
        *(sigmoid_mul.stride() if sigmoid_mul is not None else (0, 0)),
        ROWS=cfg.block_n, K1=k1, K2=k2, X_AHEAD=cfg.num_stages > 1,
        HAS_BIAS=bias is not None, HAS_RES=residual is not None, HAS_MUL=sigmoid_mul is not None,
        USE_GDC=use_gdc, num_warps=cfg.num_warps, num_stages=1, **launch,
    )
    return out
