"""One token's down-GEMM and combine in one pass, with no y round trip and no ticket.

The slot-block down-GEMM (kernel.py, ``_moe_down_kernel`` with ``SLOT_BLOCKS``) gives each of the
token's k + 1 experts its own CTAs: each stores its fp32 product ``y[slot]``, takes a ticket for
its column tile, and the CTA that draws the last one reads the k + 1 rows back from L2 and
combines them. At T = 1 that is three dependent L2 trips after the dot (store, atomic, reload)
on the critical path of every MoE layer of a decode step and of every draft forward.

Here a CTA owns ``BLOCK_H`` output columns for all the slots at once (grid ``cdiv(H, BLOCK_H)``):

- before the PDL wait, the router's ids (two launches back, complete for the same reason as in
  the slot-block kernel: the up-GEMM between them releases this launch only after its own wait)
  and the weight tiles of every slot: the k routed experts' ``[BLOCK_H, I]`` rows stacked into
  one ``[ROUTED_PAD * BLOCK_H, KPAD]`` tile, and the shared expert's ``[BLOCK_H, Is]``;
- after it, the k + 1 activation rows as one 16-row tile (row j = slot j) and one ``tl.dot``
  against the stacked tile: element ``(j, j * BLOCK_H + h)`` is slot j's output column h. The
  other products of the tile (row j against slot i's weights) are computed and not used; at
  T = 1 the MMA is not what the layer waits for;
- each slot's row taken out of the accumulator by a masked sum whose other terms are -0.0 (exact:
  x + -0.0 = x for every x, zeros of either sign included), then the combine in the slot-block
  kernel's order: ``0 + w_0 y_0 + ... + w_{k-1} y_{k-1}``, the shared expert's (its own dot,
  unscaled) last, in fp32, rounded once into ``out``.

The bits are the slot-block kernel's (tests compare them on the GPU): each output element of a
``tl.dot`` is one run of k16 MMAs over the same K (I whole, KPAD padded) from zero, whatever its
row in the tile or the tile's width (kernel.py, batch invariance), and the combine is the same
sequence of fp32 operations. Used when ``MoeExpertsConfig.down_one_token_block_h`` is set.
"""
import triton
import triton.language as tl

from lingc.runtime.kernels.gemm_common import dot_acc as _dot_acc
from lingc.runtime.pdl import pdl_launch_dependents, pdl_wait


@triton.jit
def _slot_column(yt, j: tl.constexpr, BLOCK_H: tl.constexpr, ROUTED_PAD: tl.constexpr):
    """Column j of yt [BLOCK_H, ROUTED_PAD] as a [BLOCK_H] vector: split the slot axis in halves
    by j's bits, lowest first (a register selection, no arithmetic)."""
    v = yt
    w: tl.constexpr = ROUTED_PAD
    for b in tl.static_range(ROUTED_PAD.bit_length() - 1):
        lo, hi = tl.split(tl.reshape(v, (BLOCK_H, w // 2 ** (b + 1), 2)))
        if (j >> b) & 1:
            v = hi
        else:
            v = lo
    return tl.reshape(v, (BLOCK_H,))


@triton.jit
def _row_of(acc, rows, j):
    """Row j of a [R, C] fp32 tile as a [C] vector, exactly (the other rows summed as -0.0)."""
    return tl.sum(tl.where((rows == j)[:, None], acc, -0.0), axis=0)


@triton.jit
def _moe_down_one_token_kernel(
    act_ptr, ids_ptr, wd_ptr, sd_ptr, topk_w_ptr, out_ptr,
    H, I, IS,
    stride_act, stride_de, stride_dh, stride_sdh, stride_wk, stride_oh, stride_ik,
    TOP_K: tl.constexpr, ROUTED_PAD: tl.constexpr, HAS_SHARED: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_H: tl.constexpr, KPAD: tl.constexpr,
    DOT_PRECISION: tl.constexpr, DOT_UPCAST: tl.constexpr, USE_GDC: tl.constexpr,
):
    pid_h = tl.program_id(0)
    offs_h = pid_h * BLOCK_H + tl.arange(0, BLOCK_H)
    mask_h = offs_h < H
    offs_k = tl.arange(0, KPAD)
    # The stacked routed tile: column c of the product is slot c // BLOCK_H, output column
    # pid_h * BLOCK_H + c % BLOCK_H. Ids from L2 (.cg): the router wrote them this step.
    cols = tl.arange(0, ROUTED_PAD * BLOCK_H)
    slot = cols // BLOCK_H
    h = pid_h * BLOCK_H + cols % BLOCK_H
    live = (slot < TOP_K) & (h < H)
    e = tl.load(ids_ptr + tl.minimum(slot, TOP_K - 1) * stride_ik, cache_modifier=".cg")
    w = tl.load(wd_ptr + e.to(tl.int64)[:, None] * stride_de + h[:, None] * stride_dh + offs_k[None, :],
                mask=live[:, None] & (offs_k < I)[None, :], other=0.0)
    if HAS_SHARED:
        ws = tl.load(sd_ptr + offs_h[:, None] * stride_sdh + offs_k[None, :],
                     mask=mask_h[:, None] & (offs_k < IS)[None, :], other=0.0)

    pdl_wait(USE_GDC)
    pdl_launch_dependents(USE_GDC)

    rows = tl.arange(0, BLOCK_M)
    a = tl.load(act_ptr + rows[:, None] * stride_act + offs_k[None, :],
                mask=(rows < TOP_K)[:, None] & (offs_k < I)[None, :], other=0.0)
    acc = _dot_acc(a, w, tl.zeros((BLOCK_M, ROUTED_PAD * BLOCK_H), dtype=tl.float32), DOT_PRECISION, DOT_UPCAST)
    # y[j, :] = acc[j, j * BLOCK_H : (j + 1) * BLOCK_H]: the diagonal blocks, exactly.
    acc3 = tl.reshape(acc, (BLOCK_M, ROUTED_PAD, BLOCK_H))
    diag = rows[:, None, None] == tl.arange(0, ROUTED_PAD)[None, :, None]
    y = tl.sum(tl.where(diag, acc3, -0.0), axis=0)                       # [ROUTED_PAD, BLOCK_H]
    # Slot j's row by halving splits of [BLOCK_H, ROUTED_PAD] (slots in-thread after one
    # transposition, no reductions), then the slot-block kernel's combine order.
    yt = tl.trans(y)
    comb = tl.zeros((BLOCK_H,), dtype=tl.float32)
    for j in tl.static_range(TOP_K):
        comb += tl.load(topk_w_ptr + j * stride_wk) * _slot_column(yt, j, BLOCK_H, ROUTED_PAD)
    if HAS_SHARED:  # the shared expert is slot TOP_K, unscaled, added last
        a_s = tl.load(act_ptr + (TOP_K + rows[:, None] * 0) * stride_act + offs_k[None, :],
                      mask=(rows == 0)[:, None] & (offs_k < IS)[None, :], other=0.0)
        ys = _dot_acc(a_s, ws, tl.zeros((BLOCK_M, BLOCK_H), dtype=tl.float32), DOT_PRECISION, DOT_UPCAST)
        comb += _row_of(ys, rows, 0)
    tl.store(out_ptr + offs_h * stride_oh, comb.to(out_ptr.dtype.element_ty), mask=mask_h)


def routed_pad(top_k: int) -> int:
    """Slots of the stacked routed tile: k rounded up to a power of two (a tile dimension)."""
    return triton.next_power_of_2(top_k)
