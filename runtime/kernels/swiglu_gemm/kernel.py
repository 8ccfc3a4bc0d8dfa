"""Triton SwiGLU GEMM for decode: out[M, N] = swiglu(x @ Wg.T, x @ Wu.T), PDL-chained.

Layout and derivation: README.md in this folder; reference: naive.py.

Tiling. A CTA owns BLOCK_N output columns for BLOCK_M = 16 rows of x and one K-chunk of K_TILES
tiles (SPLIT_K chunks in all). Its weight tile is 2*BLOCK_N rows interleaved gate, up, gate, ...
(for the op's interleaved w13: 2*BLOCK_N consecutive rows), so one ``tl.dot`` gives an
accumulator [BLOCK_M, 2*BLOCK_N] with gate and up in adjacent columns and the epilogue pairs
them with a reshape. The launcher takes gate and up as two row-strided [N, K] tensors; an
interleaved w13 is passed as its two strided views, which address exactly its rows.

Decode is weight-bandwidth bound: the config keeps enough weight bytes in flight (deep
pipelines, split-K for the small N). The first weight tile is loaded before ``gdc_wait`` so it
is in flight while the previous kernel drains, and the kernel triggers its dependents right
after the wait so that the next kernel can do the same.

Design B (``SwigluGemmConfig.prefetch``): a CTA owns 2*BLOCK_N weight rows x K/SPLIT_K and
loads that whole chunk with one load before ``gdc_wait``, so in a PDL chain its weight stream
starts while the previous kernel runs; split-K partials go to an fp32 workspace and the chunk that
draws the last integer ticket of its output tile sums them in chunk order 0..SPLIT_K-1 and runs
the epilogue, in the same launch (no second kernel, no float atomics). The table below picks A
or B per shape from measurements.

Batch invariance (design.md): nothing in the compiled kernel depends on M. BLOCK_M is fixed at
16 (rows past M are masked to zero), the config comes from (N, K) only, M is not specialised,
and the K order is fixed: within a chunk, tiles in increasing k, each folded into the fp32
accumulator by ``tl.dot``; across chunks (SPLIT_K > 1) a second kernel adds the fp32 partials in
chunk order 0..SPLIT_K-1 (no atomics). A row's bits are therefore the same for M = 1 and M = 64.
"""
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from lingc.runtime.kernels.gemm_common import BLOCK_M, TARGET_SMS, split_k_tickets
from lingc.runtime.kernels.gemm_common import dot_acc as _dot_acc
from lingc.runtime.kernels.gemm_common import dot_args
from lingc.runtime.pdl import pdl_launch_dependents, pdl_supported, pdl_wait

__all__ = ["BLOCK_M", "SwigluGemmConfig", "CONFIGS", "config_for", "swiglu_gemm_triton"]


@dataclass(frozen=True)
class SwigluGemmConfig:
    block_n: int  # output columns per CTA (2*block_n weight rows); 2*block_n >= 16 for tl.dot
    block_k: int  # K tile; power of two >= 16 (design A; design B takes K / split_k at once)
    split_k: int  # K chunks (A: reduced by a second kernel; B: in the same launch); 1 = none
    num_warps: int = 4
    num_stages: int = 4
    # Design B: each CTA loads its whole weight chunk (2*block_n rows x K/split_k) before
    # gdc_wait, and split-K partials are reduced in the same launch by the chunk that finishes
    # last (an integer ticket per output tile; the sum itself runs in chunk order 0..split_k-1).
    prefetch: bool = False


# Fixed launch table for the Ling-3 decode shapes, keyed by (N, K). Chosen on an H200 (torch 2.11,
# triton 3.6): design A by a sweep over block_n {8, 16, 32}, block_k {64..512}, split_k and
# num_stages {2..6}; then design B against A by `python -m benchmarks.swiglu_sweep`
# (benchmarks/results/swiglu_sweep_h200.json: cold weights, CUDA graphs of many calls, PDL on).
# B (whole weight chunk before gdc_wait, no second kernel) wins where the call is short; A's
# pipelined K loop wins on the 63 MB N=6144 shape (88% of copy bandwidth vs 67%).
CONFIGS: dict[tuple[int, int], SwigluGemmConfig] = {
    (6144, 2560): SwigluGemmConfig(block_n=32, block_k=128, split_k=1, num_warps=4, num_stages=4),
    (1536, 2560): SwigluGemmConfig(block_n=32, block_k=0, split_k=5, num_warps=8, prefetch=True),
    (768, 2560): SwigluGemmConfig(block_n=32, block_k=0, split_k=10, num_warps=4, prefetch=True),
    (192, 2560): SwigluGemmConfig(block_n=16, block_k=0, split_k=5, num_warps=4, prefetch=True),
}


def config_for(n: int, k: int) -> SwigluGemmConfig:
    """The launch config for (N, K): the table entry, else a rule that depends on (N, K) only."""
    if (n, k) in CONFIGS:
        return CONFIGS[(n, k)]
    block_k = min(128, max(16, triton.next_power_of_2(k)))
    n_blocks = triton.cdiv(n, 16)
    k_tiles = triton.cdiv(k, block_k)
    split_k = 1
    # Split K while the grid is under one CTA per SM and each chunk keeps >= 2 tiles.
    while n_blocks * split_k < TARGET_SMS and k_tiles >= 4 * split_k:
        split_k *= 2
    return SwigluGemmConfig(block_n=16, block_k=block_k, split_k=split_k)


@triton.jit
def _swiglu(g, u, limit, HAS_LIMIT: tl.constexpr):
    act = g / (1.0 + tl.exp(-g))
    if HAS_LIMIT:
        act = tl.minimum(act, limit)
        u = tl.minimum(tl.maximum(u, -limit), limit)
    return act * u


@triton.jit(do_not_specialize=["M"])
def _swiglu_gemm_kernel(
    x_ptr, wg_ptr, wu_ptr, out_ptr, ws_ptr,
    M, N, K,
    stride_xm, stride_xk, stride_gn, stride_un, stride_wk, stride_om, stride_on,
    stride_ws_s, stride_ws_m,
    limit,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, K_TILES: tl.constexpr,
    SPLIT_K: tl.constexpr, EVEN_K: tl.constexpr, HAS_LIMIT: tl.constexpr,
    DOT_PRECISION: tl.constexpr, DOT_UPCAST: tl.constexpr, USE_GDC: tl.constexpr,
):
    # Axis 0 is M so the CTAs that share a weight slice (M > 16) are scheduled together.
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    pid_k = tl.program_id(2)

    # Row r of the weight tile is gate row j (r even) or up row j (r odd), j = first + r // 2:
    # the accumulator's columns come out interleaved g, u. For an interleaved w13 the two
    # pointers are w13[0::2] and w13[1::2] and the tile is 2*BLOCK_N consecutive rows.
    rows_w = pid_n * 2 * BLOCK_N + tl.arange(0, 2 * BLOCK_N)
    j = rows_w // 2
    mask_w = j < N
    row_ptrs = tl.where(rows_w % 2 == 0, wg_ptr + j * stride_gn, wu_ptr + j * stride_un)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    mask_m = offs_m < M
    # Chunk pid_k covers tiles [pid_k * K_TILES, (pid_k + 1) * K_TILES); only the last chunk can
    # run past K, and EVEN_K says it does not. The trip count is a constexpr so every CTA (and
    # the interpreter) runs the same loop.
    offs_k = pid_k * K_TILES * BLOCK_K + tl.arange(0, BLOCK_K)
    w_ptrs = row_ptrs[:, None] + offs_k[None, :] * stride_wk
    x_ptrs = x_ptr + offs_m[:, None] * stride_xm + offs_k[None, :] * stride_xk
    mask_wk = mask_w[:, None]
    mask_xk = mask_m[:, None]
    if not EVEN_K:
        mask_wk = mask_wk & (offs_k[None, :] < K)
        mask_xk = mask_xk & (offs_k[None, :] < K)

    # Weights are producer-independent: the first tile is requested before waiting.
    w = tl.load(w_ptrs, mask=mask_wk, other=0.0)
    pdl_wait(USE_GDC)
    # Trigger at once: the next kernel's CTAs can then start their own weight prefetch while
    # this one streams. They are only scheduled once every CTA of this grid has triggered, so
    # they never take a slot this grid still needs, and their wait covers our stores.
    pdl_launch_dependents(USE_GDC)
    x = tl.load(x_ptrs, mask=mask_xk, other=0.0)
    acc = _dot_acc(x, w, tl.zeros((BLOCK_M, 2 * BLOCK_N), dtype=tl.float32), DOT_PRECISION, DOT_UPCAST)

    for _ in range(1, K_TILES):
        offs_k += BLOCK_K
        w_ptrs += BLOCK_K * stride_wk
        x_ptrs += BLOCK_K * stride_xk
        if not EVEN_K:
            mask_wk = mask_w[:, None] & (offs_k[None, :] < K)
            mask_xk = mask_m[:, None] & (offs_k[None, :] < K)
        w = tl.load(w_ptrs, mask=mask_wk, other=0.0)
        x = tl.load(x_ptrs, mask=mask_xk, other=0.0)
        acc = _dot_acc(x, w, acc, DOT_PRECISION, DOT_UPCAST)

    if SPLIT_K == 1:
        g, u = tl.split(tl.reshape(acc, (BLOCK_M, BLOCK_N, 2)))
        y = _swiglu(g, u, limit, HAS_LIMIT)
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        out_ptrs = out_ptr + offs_m[:, None] * stride_om + offs_n[None, :] * stride_on
        tl.store(out_ptrs, y.to(out_ptr.dtype.element_ty), mask=mask_m[:, None] & (offs_n < N)[None, :])
    else:
        ws_ptrs = ws_ptr + pid_k * stride_ws_s + offs_m[:, None] * stride_ws_m + rows_w[None, :]
        tl.store(ws_ptrs, acc, mask=mask_m[:, None] & mask_w[None, :])


@triton.jit(do_not_specialize=["M"])
def _splitk_swiglu_kernel(
    ws_ptr, out_ptr,
    M, N,
    stride_ws_s, stride_ws_m, stride_om, stride_on,
    limit,
    BLOCK: tl.constexpr, SPLIT_K: tl.constexpr, HAS_LIMIT: tl.constexpr, USE_GDC: tl.constexpr,
):
    # Second stage of split-K: one row per program, partials summed in chunk order 0..SPLIT_K-1.
    row = tl.program_id(0)
    offs_n = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask_n = offs_n < N
    cols = 2 * offs_n[:, None] + tl.arange(0, 2)[None, :]  # [BLOCK, 2]: gate, up
    ptrs = ws_ptr + row * stride_ws_m + cols
    mask = mask_n[:, None]

    pdl_wait(USE_GDC)  # everything read here is the first stage's output
    pdl_launch_dependents(USE_GDC)
    acc = tl.load(ptrs, mask=mask, other=0.0)
    for s in tl.static_range(1, SPLIT_K):
        acc += tl.load(ptrs + s * stride_ws_s, mask=mask, other=0.0)

    g, u = tl.split(acc)
    y = _swiglu(g, u, limit, HAS_LIMIT)
    tl.store(out_ptr + row * stride_om + offs_n * stride_on, y.to(out_ptr.dtype.element_ty), mask=mask_n)


@triton.jit(do_not_specialize=["M"])
def _swiglu_gemm_prefetch_kernel(
    x_ptr, wg_ptr, wu_ptr, out_ptr, ws_ptr, ticket_ptr,
    M, N, K,
    stride_xm, stride_xk, stride_gn, stride_un, stride_wk, stride_om, stride_on,
    stride_ws_s, stride_ws_m,
    limit,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CHUNK_K: tl.constexpr, SPLIT_K: tl.constexpr,
    HAS_LIMIT: tl.constexpr, DOT_PRECISION: tl.constexpr, DOT_UPCAST: tl.constexpr,
    USE_GDC: tl.constexpr,
):
    """Design B (see SwigluGemmConfig.prefetch): the CTA's whole weight chunk is one load issued
    before gdc_wait, so in a PDL chain it streams while the previous kernel is still running."""
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    pid_k = tl.program_id(2)
    rows_w = pid_n * 2 * BLOCK_N + tl.arange(0, 2 * BLOCK_N)
    j = rows_w // 2
    mask_w = j < N
    row_ptrs = tl.where(rows_w % 2 == 0, wg_ptr + j * stride_gn, wu_ptr + j * stride_un)
    offs_k = pid_k * CHUNK_K + tl.arange(0, CHUNK_K)
    mask_k = offs_k < K
    w = tl.load(row_ptrs[:, None] + offs_k[None, :] * stride_wk, mask=mask_w[:, None] & mask_k[None, :],
                other=0.0)
    pdl_wait(USE_GDC)
    pdl_launch_dependents(USE_GDC)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    mask_m = offs_m < M
    x = tl.load(x_ptr + offs_m[:, None] * stride_xm + offs_k[None, :] * stride_xk,
                mask=mask_m[:, None] & mask_k[None, :], other=0.0)
    acc = _dot_acc(x, w, tl.zeros((BLOCK_M, 2 * BLOCK_N), dtype=tl.float32), DOT_PRECISION, DOT_UPCAST)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    out_ptrs = out_ptr + offs_m[:, None] * stride_om + offs_n[None, :] * stride_on
    out_mask = mask_m[:, None] & (offs_n < N)[None, :]
    if SPLIT_K == 1:
        g, u = tl.split(tl.reshape(acc, (BLOCK_M, BLOCK_N, 2)))
        tl.store(out_ptrs, _swiglu(g, u, limit, HAS_LIMIT).to(out_ptr.dtype.element_ty), mask=out_mask)
    else:
        ws_ptrs = ws_ptr + offs_m[:, None] * stride_ws_m + rows_w[None, :]
        ws_mask = mask_m[:, None] & mask_w[None, :]
        tl.store(ws_ptrs + pid_k * stride_ws_s, acc, mask=ws_mask)
        # Every thread's partial is stored before the ticket is taken (barrier), and the ticket
        # is acq_rel at GPU scope: the chunk that draws the last ticket sees every partial.
        tl.debug_barrier()
        tile = pid_m * tl.num_programs(1) + pid_n
        ticket = tl.atomic_add(ticket_ptr + tile, 1, sem="acq_rel", scope="gpu")
        if ticket == SPLIT_K - 1:
            total = tl.load(ws_ptrs, mask=ws_mask, other=0.0, cache_modifier=".cg")
            for s in tl.static_range(1, SPLIT_K):
                total += tl.load(ws_ptrs + s * stride_ws_s, mask=ws_mask, other=0.0, cache_modifier=".cg")
            g, u = tl.split(tl.reshape(total, (BLOCK_M, BLOCK_N, 2)))
            tl.store(out_ptrs, _swiglu(g, u, limit, HAS_LIMIT).to(out_ptr.dtype.element_ty), mask=out_mask)
            tl.atomic_xchg(ticket_ptr + tile, 0, sem="relaxed", scope="gpu")   # ready for the next call


def swiglu_gemm_triton(
    x: torch.Tensor,
    w_gate: torch.Tensor,
    w_up: torch.Tensor,
    limit: float,
    out: torch.Tensor | None = None,
    *,
    config: SwigluGemmConfig | None = None,
    use_pdl: bool | None = None,
) -> torch.Tensor:
    """Launch on x [M, K] with gate and up weights [N, K]; returns out [M, N].

    For an interleaved w13 pass ``gate_view(w13), up_view(w13)`` (strided views, no copy); any
    two row-strided [N, K] tensors with the same K stride work. ``out`` may be any strided
    [M, N] tensor of x.dtype (tests pass NaN-filled buffers and views into larger ones).
    ``config`` overrides the table (tests, tuning); ``use_pdl`` defaults to
    ``pdl_supported(x.device)``. Arguments are assumed validated by the op.
    """
    m, k = x.shape
    n = w_gate.shape[0]
    assert w_gate.shape == w_up.shape == (n, k), (x.shape, w_gate.shape, w_up.shape)
    assert w_gate.dtype == w_up.dtype == x.dtype, (x.dtype, w_gate.dtype, w_up.dtype)
    assert w_gate.stride(1) == w_up.stride(1), (w_gate.stride(), w_up.stride())
    if out is None:
        out = torch.empty((m, n), device=x.device, dtype=x.dtype)
    assert out.shape == (m, n) and out.dtype == x.dtype, (out.shape, out.dtype)
    if m == 0 or n == 0:
        return out
    cfg = config if config is not None else config_for(n, k)
    assert 2 * cfg.block_n >= 16 and (cfg.prefetch or cfg.block_k >= 16), cfg
    if use_pdl is None:
        use_pdl = pdl_supported(x.device)
    assert not use_pdl or pdl_supported(x.device), "PDL requested on a device without PDL support"
    launch = {"launch_pdl": True} if use_pdl else {}

    if cfg.prefetch:
        return _launch_prefetch(x, w_gate, w_up, limit, out, cfg, use_pdl, launch)
    # Chunks are whole tiles; drop splits that would be empty (the split count stays a function
    # of (N, K, config) only).
    k_tiles = max(1, triton.cdiv(k, cfg.block_k))
    chunk_tiles = triton.cdiv(k_tiles, cfg.split_k)
    split_k = triton.cdiv(k_tiles, chunk_tiles)
    # Unmasked K only when every chunk is whole tiles inside K (K = 0 must take the masks).
    even_k = k > 0 and k % cfg.block_k == 0 and split_k * chunk_tiles == k_tiles
    ws = torch.empty((split_k, m, 2 * n), device=x.device, dtype=torch.float32) if split_k > 1 else out
    stride_ws_s, stride_ws_m = (ws.stride(0), ws.stride(1)) if split_k > 1 else (0, 0)
    limit = float(limit)

    grid = (triton.cdiv(m, BLOCK_M), triton.cdiv(n, cfg.block_n), split_k)
    _swiglu_gemm_kernel[grid](
        x, w_gate, w_up, out, ws,
        m, n, k,
        x.stride(0), x.stride(1), w_gate.stride(0), w_up.stride(0), w_gate.stride(1),
        out.stride(0), out.stride(1), stride_ws_s, stride_ws_m,
        limit,
        BLOCK_M=BLOCK_M, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, K_TILES=chunk_tiles,
        SPLIT_K=split_k, EVEN_K=even_k,
        HAS_LIMIT=limit > 0, **dot_args(x.dtype), USE_GDC=use_pdl,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages, **launch,
    )
    if split_k > 1:
        block = min(1024, triton.next_power_of_2(n))
        _splitk_swiglu_kernel[(m, triton.cdiv(n, block))](
            ws, out,
            m, n,
            stride_ws_s, stride_ws_m, out.stride(0), out.stride(1),
            limit,
            BLOCK=block, SPLIT_K=split_k, HAS_LIMIT=limit > 0, USE_GDC=use_pdl,
            num_warps=4, **launch,
        )
    return out


def _launch_prefetch(x, w_gate, w_up, limit, out, cfg, use_pdl, launch):
    m, k = x.shape
    n = w_gate.shape[0]
    chunk = triton.next_power_of_2(triton.cdiv(k, cfg.split_k))
    split_k = triton.cdiv(k, chunk)
    grid = (triton.cdiv(m, BLOCK_M), triton.cdiv(n, cfg.block_n), split_k)
    ws = torch.empty((split_k, m, 2 * n), device=x.device, dtype=torch.float32) if split_k > 1 else out
    tickets = split_k_tickets(x.device, grid[0] * grid[1]) if split_k > 1 else out
    _swiglu_gemm_prefetch_kernel[grid](
        x, w_gate, w_up, out, ws, tickets,
        m, n, k,
        x.stride(0), x.stride(1), w_gate.stride(0), w_up.stride(0), w_gate.stride(1),
        out.stride(0), out.stride(1),
        ws.stride(0) if split_k > 1 else 0, ws.stride(1) if split_k > 1 else 0,
        float(limit),
        BLOCK_M=BLOCK_M, BLOCK_N=cfg.block_n, CHUNK_K=chunk, SPLIT_K=split_k,
        HAS_LIMIT=limit > 0, **dot_args(x.dtype), USE_GDC=use_pdl,
        num_warps=cfg.num_warps, num_stages=1, **launch,
    )
    return out
