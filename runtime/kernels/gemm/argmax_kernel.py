"""Triton GEMM + argmax for greedy decode: (ids, max_logit) of x @ W.T without writing logits.

The lm_head is the largest weight of a decode step (201 MB on flash-tp4-rank); a greedy step
only needs the argmax of its row, so writing [M, vocab] logits and reading them back is pure
overhead. One launch: CTA (pid_m, pid_n) computes the logits of its BLOCK_N vocabulary rows with
the GEMM's own K loop (kernel._block_dot), rounds them to x.dtype (the logits tensor the graph
would have held) and reduces each row to one packed key (below), which it folds into the row's
slot with an integer ``atomic_max``. The CTA that draws the last ticket of its M block unpacks
the slots into ids (int64) and max_logit (fp32) and empties them again. No float atomics.

The key of a logit v at column i is (order key of v) << 32 | (2^31 - 1 - i): the order key is
v's fp32 bits mapped so that signed integer order is numeric order, with every NaN mapped to
the largest key and -0.0 to +0.0 (equal values, as torch.argmax compares them). So the largest
key is torch.argmax's pick: NaN above every number (the first NaN wins), among equal values the
lowest index. That order is total, so the result does not depend on the order in which CTAs
fold their keys. Columns past N get the lowest key and never win.

Why packed atomics (session 13): the former form stored one (max, index) partial per CTA and
row, and the last CTA reduced all 614 of them (flash-tp4-rank's lm_head) in a loop after every
other CTA had finished; with that tail the kernel took 60 us where the same GEMM writing its
logits takes 49 us (H200, ``benchmarks/scripts/probe_gemv_draft.py``). Now the last CTA reads M
slots.

Batch invariance as in kernel.py: BLOCK_M = 16 for every M, config from (N, K) only, M not
specialised. With the same config as gemm (the lm_head entries of config.ARGMAX_CONFIGS), the
logits are bit for bit those of ``gemm(x, [w])``, so the ids equal ``argmax(gemm(x, [w]))``.
"""
import torch
import triton
import triton.language as tl

from lingc.runtime.kernels.gemm_common import BLOCK_M, persistent_buffer, split_k_tickets

from .config import GemmConfig, argmax_config_for
from .kernel import _block_dot, dot_flags, k_plan, resolve_pdl

__all__ = ["gemm_argmax_triton", "argmax_slots", "SLOT_CAPACITY", "EMPTY_KEY"]

_INDEX_MAX = 2**31 - 1          # N must stay below it (the low half of a key is _INDEX_MAX - index)
EMPTY_KEY = -(2**63)            # a slot with no key yet: below every key a column can produce
SLOT_CAPACITY = 1 << 14         # rows (M) one launch may reduce
_EMPTY: tl.constexpr = tl.constexpr(EMPTY_KEY)
_IDX_MAX: tl.constexpr = tl.constexpr(_INDEX_MAX)


@triton.jit
def _argmax_keys(v, idx):
    """int64 keys of fp32 logits v at columns idx (module docstring): a larger key is
    torch.argmax's preference."""
    is_nan = v != v
    b = (v + 0.0).to(tl.int32, bitcast=True)               # -0.0 + 0.0 = +0.0
    order = tl.where(b < 0, b ^ 0x7FFFFFFF, b)
    order = tl.where(is_nan, 0x7FFFFFFF, order)             # every NaN above +inf
    return (order.to(tl.int64) << 32) | (-idx + _IDX_MAX).to(tl.int64)


@triton.jit
def _key_value(key):
    """The fp32 logit of a key (a NaN for the NaN key)."""
    order = (key >> 32).to(tl.int32)
    b = tl.where(order < 0, order ^ 0x7FFFFFFF, order)
    return b.to(tl.float32, bitcast=True)


@triton.jit(do_not_specialize=["M"])
def _gemm_argmax_kernel(
    x_ptr, w_ptr, ids_ptr, max_ptr, slot_ptr, ticket_ptr,
    M, N, K,
    stride_xm, stride_xk, stride_wn,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, K_TILES: tl.constexpr,
    EVEN_K: tl.constexpr, N_BLOCKS: tl.constexpr, ROUND_TO_BF16: tl.constexpr,
    DOT_PRECISION: tl.constexpr, DOT_UPCAST: tl.constexpr, USE_GDC: tl.constexpr, ROUND_TO_F16: tl.constexpr = False,
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
    if ROUND_TO_F16:   # the same for an fp16 graph
        acc = acc.to(tl.float16).to(tl.float32)
    keys = _argmax_keys(acc, tl.broadcast_to(rows[None, :], (BLOCK_M, BLOCK_N)))
    keys = tl.where(mask_n[None, :], keys, _EMPTY)
    tl.atomic_max(slot_ptr + offs_m, tl.max(keys, axis=1), mask=mask_m, sem="relaxed", scope="gpu")
    # Every thread's atomic is issued before the ticket (barrier), and the ticket is acq_rel at
    # GPU scope: the CTA that draws the last ticket sees every CTA's keys in the slots.
    tl.debug_barrier()
    ticket = tl.atomic_add(ticket_ptr + pid_m, 1, sem="acq_rel", scope="gpu")
    if ticket == N_BLOCKS - 1:
        best = tl.load(slot_ptr + offs_m, mask=mask_m, other=0, cache_modifier=".cg")
        tl.store(ids_ptr + offs_m, -(best & 0xFFFFFFFF) + _IDX_MAX, mask=mask_m)
        tl.store(max_ptr + offs_m, _key_value(best), mask=mask_m)
        # Ready for the next call: the slots empty, the ticket zero.
        tl.store(slot_ptr + offs_m, tl.full((BLOCK_M,), _EMPTY, tl.int64), mask=mask_m)
        tl.atomic_xchg(ticket_ptr + pid_m, 0, sem="relaxed", scope="gpu")


def argmax_slots(device: torch.device, m: int) -> torch.Tensor:
    """The device's int64 key slots (``SLOT_CAPACITY`` of them, each ``EMPTY_KEY``: a
    gemm_common.persistent_buffer) for a launch over ``m`` rows; every launch leaves its slots
    empty again."""
    if m > SLOT_CAPACITY:
        raise ValueError(f"gemm_argmax: M={m} rows exceed SLOT_CAPACITY={SLOT_CAPACITY}; take the argmax "
                         f"of full logits (lingc.gemm) for larger batches")
    return persistent_buffer("argmax_slots", device, SLOT_CAPACITY, torch.int64, EMPTY_KEY)


def gemm_argmax_triton(
    x: torch.Tensor,
    w: torch.Tensor,
    *,
    config: GemmConfig | None = None,
    use_pdl: bool | None = None,
    out: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Launch on x [M, K] and w [N, K] (unit K stride); returns (ids int64 [M], max_logit fp32
    [M]) as naive.gemm_argmax_reference, in ``out`` when given (contiguous int64 [M], fp32 [M]:
    a test pre-fills them to see every row written). ``config`` (split_k must be 1) overrides
    the table; ``use_pdl`` defaults to ``pdl_supported(x.device)``. Arguments are assumed
    validated by the op.
    """
    m, k = x.shape
    n = w.shape[0]
    assert w.shape[1] == k and w.dtype == x.dtype and (w.stride(1) == 1 or k <= 1) and n >= 1, (
        x.shape, w.shape, w.dtype, w.stride())
    if out is None:
        ids = torch.empty(m, device=x.device, dtype=torch.int64)
        best = torch.empty(m, device=x.device, dtype=torch.float32)
    else:
        ids, best = out
        assert (ids.shape == best.shape == (m,) and ids.dtype == torch.int64 and best.dtype == torch.float32
                and ids.is_contiguous() and best.is_contiguous()), (ids.shape, ids.dtype, best.shape, best.dtype)
    if m == 0:
        return ids, best
    cfg = config if config is not None else argmax_config_for(n, k)
    assert cfg.split_k == 1 and cfg.block_n >= 16 and (cfg.prefetch or cfg.block_k >= 16), cfg
    assert n < _INDEX_MAX, n
    use_gdc, launch = resolve_pdl(x.device, use_pdl)

    block_k, k_tiles, _, even_k = k_plan(k, cfg)
    n_blocks = triton.cdiv(n, cfg.block_n)
    grid = (triton.cdiv(m, BLOCK_M), n_blocks)
    # The slots before the launch: their first allocation runs a fill kernel.
    slots = argmax_slots(x.device, m)
    _gemm_argmax_kernel[grid](
        x, w, ids, best, slots, split_k_tickets(x.device, grid[0]),
        m, n, k,
        x.stride(0), x.stride(1), w.stride(0),
        BLOCK_M=BLOCK_M, BLOCK_N=cfg.block_n, BLOCK_K=block_k, K_TILES=k_tiles, EVEN_K=even_k,
        N_BLOCKS=n_blocks, ROUND_TO_BF16=x.dtype == torch.bfloat16,
        ROUND_TO_F16=x.dtype == torch.float16, USE_GDC=use_gdc, **dot_flags(x.dtype),
        num_warps=cfg.num_warps, num_stages=cfg.num_stages, **launch,
    )
    return ids, best
