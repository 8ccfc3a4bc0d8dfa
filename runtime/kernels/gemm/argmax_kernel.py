"""Triton GEMM + argmax for greedy decode: (ids, max_logit) of x @ W.T without writing logits.

The lm_head is the largest weight of a decode step (201 MB on flash-tp4-rank); a greedy step
only needs the argmax of its row, so writing [M, vocab] logits and reading them back is pure
overhead. One launch: CTA (pid_m, pid_n) computes the logits of its BLOCK_N vocabulary rows with
the GEMM's own K loop (kernel._block_dot), rounds them to x.dtype (the logits tensor the graph
would have held), reduces them to one (max, argmax) per row and writes that partial; the CTA that
draws the last ticket of its M block reduces the partials of all column blocks in block order
and writes ids (int64) and max_logit (fp32). No float atomics; the ticket is an integer count.

Order of the (value, index) pairs, as torch.argmax: NaN is larger than every number (the first
NaN wins); among equal values the lowest index wins. That order is total, so the result does not
depend on how the pairs are combined; the final reduction still runs in fixed block order.
Columns past N are -inf with indices >= N, so they never beat a real column.

Batch invariance as in kernel.py: BLOCK_M = 16 for every M, config from (N, K) only, M not
specialised. With the same config as gemm (the lm_head entries of config.ARGMAX_CONFIGS), the
logits are bit for bit those of ``gemm(x, [w])``, so the ids equal ``argmax(gemm(x, [w]))``.
"""
import torch
import triton
import triton.language as tl

from lingc.runtime.kernels.gemm_common import BLOCK_M, split_k_tickets

from .config import GemmConfig, argmax_config_for
from .kernel import _block_dot, dot_flags, k_plan, resolve_pdl

__all__ = ["gemm_argmax_triton", "REDUCE_BLOCK"]

# Partials (x 16 rows) the last CTA reduces per step of its pipelined loop: the full lm_head's
# 2456 blocks take 20 steps. Compiled for sm_90, 256 per step raised the whole kernel to ~210
# registers per thread (128: ~110, as the K loop alone), which would cost occupancy.
REDUCE_BLOCK = 128
_INDEX_PAD = 2**31 - 1  # index of a padding entry: loses every tie


@triton.jit
def _argmax_combine(va, ia, vb, ib):
    """Elementwise: the larger (value, index) pair in torch.argmax's order (module docstring)."""
    a_nan = va != va
    b_nan = vb != vb
    take_a = (va > vb) | ((va == vb) & (ia < ib)) | (a_nan & (~b_nan | (ia < ib)))
    return tl.where(take_a, va, vb), tl.where(take_a, ia, ib)


@triton.jit
def _row_argmax(v, idx):
    """Per row of [R, C]: the largest (value, index) pair in torch.argmax's order, by plain max
    and min reductions (the maximum ignoring NaN, then the lowest index holding it, or holding a
    NaN if the row has one); same result as reducing with _argmax_combine."""
    is_nan = v != v
    has_nan = tl.max(is_nan.to(tl.int32), 1) > 0
    best = tl.max(tl.where(is_nan, float("-inf"), v), 1)
    holds = tl.where(has_nan[:, None], is_nan, v == best[:, None])
    best_idx = tl.min(tl.where(holds, idx, 2147483647), 1)
    return tl.where(has_nan, float("nan"), best), best_idx


@triton.jit(do_not_specialize=["M"])
def _gemm_argmax_kernel(
    x_ptr, w_ptr, ids_ptr, max_ptr, part_val_ptr, part_idx_ptr, ticket_ptr,
    M, N, K,
    stride_xm, stride_xk, stride_wn, stride_pm,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, K_TILES: tl.constexpr,
    EVEN_K: tl.constexpr, N_BLOCKS: tl.constexpr, REDUCE_BLOCK: tl.constexpr, ROUND_TO_BF16: tl.constexpr,
    DOT_PRECISION: tl.constexpr, DOT_UPCAST: tl.constexpr, USE_GDC: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    rows = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = rows < N
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    mask_m = offs_m < M

    acc = _block_dot(
        x_ptr, w_ptr, stride_wn, rows, mask_n, offs_m, mask_m, 0, K, stride_xm, stride_xk,
        BLOCK_M, BLOCK_N, BLOCK_K, K_TILES, EVEN_K, DOT_PRECISION, DOT_UPCAST, USE_GDC,
    )
    if ROUND_TO_BF16:  # the logits as a bf16 graph would hold them (ties included)
        acc = acc.to(tl.bfloat16).to(tl.float32)
    logits = tl.where(mask_n[None, :], acc, float("-inf"))
    idx = tl.broadcast_to(rows[None, :], (BLOCK_M, BLOCK_N))
    idx = tl.where(mask_n[None, :], idx, 2147483647)
    best, best_idx = _row_argmax(logits, idx)

    part = offs_m * stride_pm + pid_n
    tl.store(part_val_ptr + part, best, mask=mask_m)
    tl.store(part_idx_ptr + part, best_idx, mask=mask_m)
    # Partials stored by every thread before the ticket (barrier); acq_rel at GPU scope makes
    # every CTA's partials visible to the one that draws the last ticket.
    tl.debug_barrier()
    ticket = tl.atomic_add(ticket_ptr + pid_m, 1, sem="acq_rel", scope="gpu")
    if ticket == N_BLOCKS - 1:
        best = tl.full((BLOCK_M,), float("-inf"), tl.float32)
        best_idx = tl.full((BLOCK_M,), 2147483647, tl.int32)
        offs_b = tl.arange(0, REDUCE_BLOCK)
        for start in tl.range(0, N_BLOCKS, REDUCE_BLOCK, num_stages=3):  # pipelined loads
            blk = start + offs_b
            mask = mask_m[:, None] & (blk < N_BLOCKS)[None, :]
            ptrs = offs_m[:, None] * stride_pm + blk[None, :]
            v = tl.load(part_val_ptr + ptrs, mask=mask, other=float("-inf"), cache_modifier=".cg")
            i = tl.load(part_idx_ptr + ptrs, mask=mask, other=2147483647, cache_modifier=".cg")
            v, i = _row_argmax(v, i)
            best, best_idx = _argmax_combine(best, best_idx, v, i)
        tl.store(ids_ptr + offs_m, best_idx.to(tl.int64), mask=mask_m)
        tl.store(max_ptr + offs_m, best, mask=mask_m)
        tl.atomic_xchg(ticket_ptr + pid_m, 0, sem="relaxed", scope="gpu")  # ready for the next call


def gemm_argmax_triton(
    x: torch.Tensor,
    w: torch.Tensor,
    *,
    config: GemmConfig | None = None,
    use_pdl: bool | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Launch on x [M, K] and w [N, K] (unit K stride); returns (ids int64 [M], max_logit fp32
    [M]) as naive.gemm_argmax_reference. ``config`` (split_k must be 1) overrides the table;
    ``use_pdl`` defaults to ``pdl_supported(x.device)``. Arguments are assumed validated by the op.
    """
    m, k = x.shape
    n = w.shape[0]
    assert w.shape[1] == k and w.dtype == x.dtype and (w.stride(1) == 1 or k <= 1) and n >= 1, (
        x.shape, w.shape, w.dtype, w.stride())
    ids = torch.empty(m, device=x.device, dtype=torch.int64)
    best = torch.empty(m, device=x.device, dtype=torch.float32)
    if m == 0:
        return ids, best
    cfg = config if config is not None else argmax_config_for(n, k)
    assert cfg.split_k == 1 and cfg.block_n >= 16 and (cfg.prefetch or cfg.block_k >= 16), cfg
    assert n < _INDEX_PAD, n
    use_gdc, launch = resolve_pdl(x.device, use_pdl)

    block_k, k_tiles, _, even_k = k_plan(k, cfg)
    n_blocks = triton.cdiv(n, cfg.block_n)
    grid = (triton.cdiv(m, BLOCK_M), n_blocks)
    part_val = torch.empty((m, n_blocks), device=x.device, dtype=torch.float32)
    part_idx = torch.empty((m, n_blocks), device=x.device, dtype=torch.int32)
    _gemm_argmax_kernel[grid](
        x, w, ids, best, part_val, part_idx, split_k_tickets(x.device, grid[0]),
        m, n, k,
        x.stride(0), x.stride(1), w.stride(0), part_val.stride(0),
        BLOCK_M=BLOCK_M, BLOCK_N=cfg.block_n, BLOCK_K=block_k, K_TILES=k_tiles, EVEN_K=even_k,
        N_BLOCKS=n_blocks, REDUCE_BLOCK=min(REDUCE_BLOCK, triton.next_power_of_2(n_blocks)),
        ROUND_TO_BF16=x.dtype == torch.bfloat16, USE_GDC=use_gdc, **dot_flags(x.dtype),
        num_warps=cfg.num_warps, num_stages=cfg.num_stages, **launch,
    )
    return ids, best
