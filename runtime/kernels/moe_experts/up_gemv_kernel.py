"""The MoE up-GEMM as a GEMV on CUDA cores (``MoeExpertsConfig.up_gemv``): whole H per CTA, no
split-K.

Why: at decode a routed expert's block holds one token row (T = 1: always; T = 6 with 48 picks
of 512 experts: nearly always), so the tensor-core up-GEMM multiplies 16-row tiles that are 15/16
padding, and its split-K (10 chunks of 256) adds a partial store, an atomic ticket and a reload
of ten partials to every output tile's critical path. Here a CTA owns ``COLS`` activation columns
of one block (2 * COLS weight rows, gate and up interleaved as in swiglu_gemm) over the WHOLE of
H, loads them as at most two power-of-two tiles (H = K1 + K2; 2560 = 2048 + 512, the dense
GEMM's design C, gemm/gemv_kernel.py), converts them to fp32 once, and for each token row of its
block computes the 2 * COLS dot products (``tl.sum`` per tile, tile 1 then tile 2) and the
SwiGLU (swiglu_gemm's ``_swiglu``, with the clamp) straight into ``act[pair]``. The arithmetic is
one FMA per weight element and row; a block's rows are few, so the CUDA cores keep up with HBM.

Measured (H200, session 18, ``python -m benchmarks.moe_sweep --set gemv``, align + up + down per
layer, 40 cold layers, results/moe_sweep_gemv_h200_s18_call3.*): slower than the table's
tensor-core up-GEMM at both T. Best GEMV (1 column, 2 warps: 10 KB a CTA) 13.08 us at T = 1 and
48.17 at T = 6 against 12.83 and 46.91; 2-8 columns 13.6-16.2 and 48.7-61.8. The split-K
reduction was not what held the one-token MoE back. Kept as a sweep dimension, as the dense
GEMM's design C is; no table entry uses it.

Blocks and PDL as in ``_moe_up_kernel`` (kernel.py): the first NSB blocks own the shared
expert (16 tokens each; weights requested before ``gdc_wait``); a routed CTA waits, reads its
block's expert id (moe_align's, or with SLOT_BLOCKS the router's: block b is the one token's
slot b), skips ids >= E, then loads its rows. Every CTA releases its dependents only after its
wait (``pdl_wait_then_release``: the down-GEMM reads moe_align's output before its own wait).
A block's rows are its slots up to the first sentinel (moe_align packs a bucket's pairs first).

Batch invariance: a token row's arithmetic is the loop body, the same for every T and every
position in its block; the tiles and their reduction trees are functions of (H, COLS,
num_warps) only. Its bits differ from the tensor-core design's (another summation order), so the
launch table picks one design per shape, never per T.
"""
import triton
import triton.language as tl

from lingc.runtime.kernels.gemm.gemv_kernel import _load_w, _load_x_row  # design C's tile loads
from lingc.runtime.kernels.swiglu_gemm.kernel import _swiglu
from lingc.runtime.pdl import pdl_wait_then_release

__all__ = ["_moe_up_gemv_kernel"]


@triton.jit
def _load_rows(row_ptrs, ok, K1: tl.constexpr, K2: tl.constexpr, H):
    """The rows [2 * COLS] over the whole H as design C's two tiles [ROWS, K1], [ROWS, K2] (the
    second = the first when K2 = 0, unused), masked past H and for rows not ``ok``."""
    w1 = _load_w(row_ptrs[:, None], ok[:, None], 0, K1, H)
    w2 = w1
    if K2 > 0:
        w2 = _load_w(row_ptrs[:, None], ok[:, None], K1, K2, H)
    return w1, w2


@triton.jit
def _row_swiglu(w1, w2, x_ptr, tok, pair, n_e, lim, act_ptr, stride_xt, stride_xh, stride_act, pid_n, H,
                COLS: tl.constexpr, K1: tl.constexpr, K2: tl.constexpr, HAS_LIMIT: tl.constexpr):
    """act[pair, pid_n * COLS ...] = SwiGLU of the token row's products with the fp32 weight
    tiles w1 [2 * COLS, K1], w2 [2 * COLS, K2] (rows interleaved g, u)."""
    x1, x2 = _load_x_row(x_ptr + tok * stride_xt, True, stride_xh, K1, K2, H)
    acc = tl.sum(w1 * x1, axis=1)
    if K2 > 0:
        acc += tl.sum(w2 * x2, axis=1)
    g, u = tl.split(tl.reshape(acc, (COLS, 2)))
    cols = pid_n * COLS + tl.arange(0, COLS)
    tl.store(act_ptr + pair * stride_act + cols, _swiglu(g, u, lim, HAS_LIMIT).to(act_ptr.dtype.element_ty),
             mask=cols < n_e)


@triton.jit(do_not_specialize=["T", "P", "NB", "NSB"])
def _moe_up_gemv_kernel(
    x_ptr, sorted_ptr, block_expert_ptr, ids_ptr,
    wg_ptr, wu_ptr, sg_ptr, su_ptr, act_ptr,
    T, P, NB, NSB, H, I, IS,
    stride_xt, stride_xh, stride_ik,
    stride_ge, stride_gn, stride_ue, stride_un, stride_sgn, stride_sun, stride_act,
    limit, shared_limit,
    NUM_EXPERTS: tl.constexpr, TOP_K: tl.constexpr, PAIRS_PER_TOKEN: tl.constexpr, BLOCK_M: tl.constexpr,
    COLS: tl.constexpr, K1: tl.constexpr, K2: tl.constexpr, HAS_LIMIT: tl.constexpr, SLOT_BLOCKS: tl.constexpr,
    USE_GDC: tl.constexpr,
):
    pid_n = tl.program_id(0)
    pid_b = tl.program_id(1)
    rows_w = pid_n * 2 * COLS + tl.arange(0, 2 * COLS)
    j = rows_w // 2
    even = rows_w % 2 == 0
    if pid_b < NSB:
        # The shared expert, tokens pid_b * 16 ...: producer-independent weights, requested first.
        s_rows = tl.where(even, sg_ptr + j * stride_sgn, su_ptr + j * stride_sun)
        w1, w2 = _load_rows(s_rows, j < IS, K1, K2, H)
        pdl_wait_then_release(USE_GDC)
        if pid_n * COLS < IS:
            w1f = w1.to(tl.float32)     # converted once, not per token row
            w2f = w2.to(tl.float32)
            t = pid_b * BLOCK_M
            end = tl.minimum(t + BLOCK_M, T)
            while t < end:      # a while loop: the interpreter cannot range() over a runtime bound
                _row_swiglu(w1f, w2f, x_ptr, t, t * PAIRS_PER_TOKEN + TOP_K, IS, shared_limit, act_ptr, stride_xt,
                            stride_xh, stride_act, pid_n, H, COLS, K1, K2, HAS_LIMIT)
                t += 1
    else:
        b = pid_b - NSB
        pdl_wait_then_release(USE_GDC)
        if SLOT_BLOCKS:
            e = tl.load(ids_ptr + b * stride_ik)
        else:
            e = tl.load(block_expert_ptr + b)
        if (e < NUM_EXPERTS) & (pid_n * COLS < I):
            e64 = e.to(tl.int64)
            g_rows = tl.where(even, wg_ptr + e64 * stride_ge + j * stride_gn, wu_ptr + e64 * stride_ue + j * stride_un)
            w1, w2 = _load_rows(g_rows, j < I, K1, K2, H)
            w1f = w1.to(tl.float32)
            w2f = w2.to(tl.float32)
            if SLOT_BLOCKS:
                _row_swiglu(w1f, w2f, x_ptr, b // PAIRS_PER_TOKEN, b, I, limit, act_ptr, stride_xt, stride_xh,
                            stride_act, pid_n, H, COLS, K1, K2, HAS_LIMIT)
            else:
                # A published block's members come first, then the sentinel P (moe_align).
                r = 0
                pair = tl.load(sorted_ptr + b * BLOCK_M)
                while (r < BLOCK_M) & (pair < P):
                    _row_swiglu(w1f, w2f, x_ptr, pair // PAIRS_PER_TOKEN, pair, I, limit, act_ptr, stride_xt,
                                stride_xh, stride_act, pid_n, H, COLS, K1, K2, HAS_LIMIT)
                    r += 1
                    pair = tl.load(sorted_ptr + b * BLOCK_M + tl.minimum(r, BLOCK_M - 1))
