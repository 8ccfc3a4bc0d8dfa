"""The router's gate products on tensor cores: split-K partial logits for T = 1..16 rows at once.

``kernel.py``'s vector logits kernel reduces one token row at a time across its CTA's warps, so a
verify chain (T = 6) pays for its rows in series: 4.4 us a layer on an H100 against 2.0 us at
T = 1 (session 63's profile). Here every row is one row of an MMA tile, so T only changes how
many of the 16 tile rows are live:

- Grid ``(E / BLOCK_E, KS)``: program (e, k) owns experts [e * 16, e * 16 + 16) and the hidden
  columns [k * BK, (k + 1) * BK) (Ling-3: 32 x 5 = 160 CTAs of 4 warps, 16 KB of gate weight
  each, loaded before ``gdc_wait``). It writes the partial products of its chunk,
  ``partials[k, t, e]`` fp32; the selection kernel sums the KS partials of a logit in a fixed
  order (k = 0, 1, ...) before anything else reads it.
- The rows are a fixed 16-row tile (``BT``) for every T (rows past T are masked loads of zero),
  and an MMA's output row depends only on its own input row, so a row's partials, and so its
  logits, are the same bits for any T: batch invariance as design.md asks.
- Block input norm (``NORM``, ``lingc.rmsnorm_router``): the program forms h = residual + x on
  its chunk (the rmsnorm kernel's rounding), stores its share of h's columns, and routes
  ``p = h * norm_w``. p is the product of two bf16 values, exact in fp32, and splits exactly
  into two bf16 halves (8 + 8 significant bits), so two MMAs give the exact products summed in
  fp32: the logits of the fp32 normed row, as the vector kernel's, in another summation order. The sum of squares of the chunk goes to
  ``ss[k, t]`` (programs of expert block 0); the selection kernel applies the norm's scale
  ``rsqrt(sum_k ss / H + eps)`` to the summed logit and its extra programs write y.
- The Llama-form norm (``ROUND_BEFORE_WEIGHT``) routes y as rounded, which needs the scale
  before the products: each program sums the squares of its rows whole (reading every chunk of
  them from L2), forms its chunk of y, stores its share of y's columns and routes that y in one
  MMA, the same products as the unfused ``lingc.moe_router`` on y (so the selection is the
  unfused pair's, bit for bit). Ling-3 does not use this form.

Used for bf16 gates at T <= 16 (``kernel.logits_on_tensor_cores``); fp32 and fp16 gates keep the
vector kernel (their products need not split into two exact halves: fp16's low half can fall below
its normal range).
"""
import triton
import triton.language as tl

from lingc.runtime.pdl import pdl_launch_dependents, pdl_wait

__all__ = ["MMA_BLOCK_E", "MMA_BLOCK_K", "MMA_ROWS", "MMA_WARPS", "mma_chunks", "mma_subchunks"]

# Tile rows: every T up to 16 in one tile (tl.dot needs 16 rows anyway).
MMA_ROWS = 16
# Experts a program: tl.dot's smallest N.
MMA_BLOCK_E = 16
# Hidden columns a program at most: Ling-3's 2560 is five chunks of 512, so with 32 expert
# blocks the grid is 160 programs of 16 KB of weights, several resident on each SM.
MMA_BLOCK_K = 512
# Warps a program, each the MMAs of one 64-column sub-chunk (a batch of a 3-d dot). A plain
# [16, 512] x [512, 16] dot puts the warps along N, so every warp holds the whole [16, 512]
# operand: 255 registers and 1.8 KB of spills at 4 warps with the norm's two halves (sm_90,
# triton 3.6); along K each holds its own 64 columns (122 registers at 8 warps, no spills).
MMA_WARPS = 8


def mma_chunks(hidden: int) -> tuple[int, int]:
    """(chunk width BK, chunks KS) of the hidden axis: BK a power of two <= MMA_BLOCK_K."""
    bk = min(MMA_BLOCK_K, triton.next_power_of_2(max(hidden, 16)))
    return bk, triton.cdiv(hidden, bk)


def mma_subchunks(bk: int) -> int:
    """Sub-chunks (dot batches) of a BK-wide chunk: one per warp, at least 16 columns each."""
    return min(MMA_WARPS, bk // 16)


@triton.jit
def _h_chunk(x_ptr, res_ptr, rows, offs, mask, stride_xt, stride_rt, HAS_RES: tl.constexpr):
    """Rows' residual stream h = residual + x on columns ``offs``, rounded to x's dtype (the
    rmsnorm kernel's expression)."""
    xv = tl.load(x_ptr + rows[:, None] * stride_xt + offs[None, :], mask=mask, other=0.0)
    if HAS_RES:
        r = tl.load(res_ptr + rows[:, None] * stride_rt + offs[None, :], mask=mask, other=0.0)
        xv = (r.to(tl.float32) + xv.to(tl.float32)).to(xv.dtype)
    return xv


@triton.jit
def _chunk_dot(a, w, acc, BT: tl.constexpr, BLOCK_E: tl.constexpr, BK: tl.constexpr, NSUB: tl.constexpr,
               DOT_UPCAST: tl.constexpr):
    """acc [NSUB, BT, BLOCK_E] + the products of a [BT, BK] and w [BLOCK_E, BK] over NSUB
    sub-chunks of BK / NSUB columns, one batch of the dot each."""
    a3 = tl.permute(tl.reshape(a, [BT, NSUB, BK // NSUB]), (1, 0, 2))
    w3 = tl.permute(tl.reshape(w, [BLOCK_E, NSUB, BK // NSUB]), (1, 2, 0))
    if DOT_UPCAST:
        return tl.dot(a3.to(tl.float32), w3.to(tl.float32), acc, input_precision="ieee")
    return tl.dot(a3, w3, acc, out_dtype=tl.float32)


@triton.jit(do_not_specialize=["T"])
def _router_logits_mma_kernel(
    x_ptr, w_ptr, part_ptr, ss_ptr, T, H,
    stride_xt, stride_xh, stride_we,
    res_ptr, nw_ptr, h_ptr, stride_rt, stride_ht, SLICE,
    E: tl.constexpr, BT: tl.constexpr, BLOCK_E: tl.constexpr, BK: tl.constexpr, NSUB: tl.constexpr,
    USE_GDC: tl.constexpr, NORM: tl.constexpr, HAS_RES: tl.constexpr, DOT_UPCAST: tl.constexpr,
    ROUND_BEFORE_WEIGHT: tl.constexpr = False, KS: tl.constexpr = 1, y_ptr=None, stride_yt=0, eps=0.0,
):
    """Program (e, k): partials[k, t, e'] = sum over chunk k of x[t] * w[e'] (NORM: of
    h[t] * norm_w; with ROUND_BEFORE_WEIGHT of y[t]) for the 16 experts e' of block e and every
    row t < T; with NORM also h's columns [k * BK + e * SLICE, k * BK + (e + 1) * SLICE) of the
    chunk, and ss[k, t] (block 0; the default form) or y's same columns (the Llama form)."""
    pid_e = tl.program_id(0)
    pid_k = tl.program_id(1)
    offs_e = pid_e * BLOCK_E + tl.arange(0, BLOCK_E)
    me = offs_e < E
    offs_k = pid_k * BK + tl.arange(0, BK)
    mk = offs_k < H
    # Producer-independent loads first: the gate tile (and the norm weight's chunk).
    w = tl.load(w_ptr + offs_e[:, None] * stride_we + offs_k[None, :], mask=me[:, None] & mk[None, :], other=0.0)
    if NORM:
        nw = tl.load(nw_ptr + offs_k, mask=mk, other=0.0).to(tl.float32)

    pdl_wait(USE_GDC)
    pdl_launch_dependents(USE_GDC)

    rows = tl.arange(0, BT)
    mt = rows < T
    m2 = mt[:, None] & mk[None, :]
    acc = tl.zeros([NSUB, BT, BLOCK_E], tl.float32)
    if NORM:
        xv = _h_chunk(x_ptr, res_ptr, rows, offs_k, m2, stride_xt, stride_rt, HAS_RES)
        col = offs_k - pid_k * BK
        mine = m2 & (col >= pid_e * SLICE)[None, :] & (col < (pid_e + 1) * SLICE)[None, :]
        tl.store(h_ptr + rows[:, None] * stride_ht + offs_k[None, :], xv, mask=mine)
        hf = xv.to(tl.float32)
    if NORM and ROUND_BEFORE_WEIGHT:
        # The Llama form routes y as rounded, so the scale comes first: every program sums the
        # squares of whole rows, chunk by chunk in one order (the same bits in every program, so
        # the y columns one program stores are the y it routes), then rounds as _normed_row does.
        ss = tl.zeros([BT], tl.float32)
        for c in tl.static_range(KS):
            offs_c = c * BK + tl.arange(0, BK)
            hc = _h_chunk(x_ptr, res_ptr, rows, offs_c, mt[:, None] & (offs_c < H)[None, :], stride_xt, stride_rt,
                          HAS_RES).to(tl.float32)
            ss += tl.sum(hc * hc, axis=1)
        normed = (hf * tl.rsqrt(ss / H + eps)[:, None]).to(xv.dtype).to(tl.float32)
        yv = (normed * nw[None, :]).to(y_ptr.dtype.element_ty)
        tl.store(y_ptr + rows[:, None] * stride_yt + offs_k[None, :], yv, mask=mine)
        acc = _chunk_dot(yv.to(w.dtype), w, acc, BT, BLOCK_E, BK, NSUB, DOT_UPCAST)
    elif NORM:
        tl.store(ss_ptr + pid_k * T + rows, tl.sum(hf * hf, axis=1), mask=mt & (pid_e == 0))
        p = hf * nw[None, :]                   # exact: a product of two bf16 values
        p_hi = p.to(w.dtype)
        p_lo = (p - p_hi.to(tl.float32)).to(w.dtype)     # exact: the bits p_hi left out
        acc = _chunk_dot(p_hi, w, _chunk_dot(p_lo, w, acc, BT, BLOCK_E, BK, NSUB, DOT_UPCAST), BT, BLOCK_E, BK, NSUB,
                         DOT_UPCAST)
    else:
        xv = tl.load(x_ptr + rows[:, None] * stride_xt + offs_k[None, :] * stride_xh, mask=m2, other=0.0)
        acc = _chunk_dot(xv.to(w.dtype), w, acc, BT, BLOCK_E, BK, NSUB, DOT_UPCAST)
    tl.store(part_ptr + (pid_k * T + rows)[:, None] * E + offs_e[None, :], tl.sum(acc, axis=0),
             mask=mt[:, None] & me[None, :])
