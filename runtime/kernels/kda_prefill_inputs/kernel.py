"""Triton kernel of `lingc::kda_prefill_inputs`. Program (row block, head, input) owns BLOCK_T
rows of one head's K channels of one of q, k, v, f:

- q, k, v: the causal depthwise convolution over W taps, each tap's input row loaded straight from
  the projection output (rows before the chunk from the cached window, rounded to the input's
  dtype as the eager `cat` does), summed in tap order in fp32, then SiLU; q and k are
  L2-normalised over the head's K channels (the row is whole in the program) and q scaled by
  K^-1/2.
- f: the bounded gate, lower_bound * sigmoid(exp(A_log[h]) * (f + dt_bias)).

One read of each projection output and one fp32 write of each result, against the eager form's
~30 elementwise passes over [T, D] fp32 (cat, casts, W products and sums, SiLU, the norms'
squares, sums and products, the gate's four). Products and sums may contract into FMAs, so the
bits can differ from the eager form in the last place.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .op import MAX_W

__all__ = ["BLOCK_T", "kda_prefill_inputs_triton"]

BLOCK_T = 16        # rows per program: a [16, 128] fp32 tile over 4 warps at Ling-3's K (210 registers on
                    # sm_90, no spills; 32 rows spill)
L2_EPS = 1e-6       # kda_math.l2norm's eps
assert BLOCK_T >= MAX_W - 1     # only the first row block reads the window


@triton.jit
def _kda_prefill_inputs_kernel(
    q_ptr, k_ptr, v_ptr, f_ptr, win_ptr, wq_ptr, wk_ptr, wv_ptr, a_log_ptr, dt_bias_ptr,
    qo_ptr, ko_ptr, vo_ptr, g_ptr,
    T, stride_xt, stride_win_i, stride_win_d, stride_win_j, lower_bound, q_scale, eps,
    K: tl.constexpr, W: tl.constexpr, BLOCK_T: tl.constexpr,
):
    h = tl.program_id(1)
    which = tl.program_id(2)                      # 0 q, 1 k, 2 v, 3 f
    rows = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    cols = h * K + tl.arange(0, K)
    live = rows < T
    out_off = rows[:, None].to(tl.int64) * (tl.num_programs(1) * K) + cols[None, :]
    if which == 3:
        f = tl.load(f_ptr + rows[:, None].to(tl.int64) * stride_xt + cols[None, :], mask=live[:, None], other=0.0)
        a = tl.exp(tl.load(a_log_ptr + h).to(tl.float32))
        x = f.to(tl.float32) + tl.load(dt_bias_ptr + cols).to(tl.float32)[None, :]
        tl.store(g_ptr + out_off, lower_bound * tl.sigmoid(a * x), mask=live[:, None])
    else:
        if which == 0:
            x_ptr, w_ptr, o_ptr = q_ptr, wq_ptr, qo_ptr
        elif which == 1:
            x_ptr, w_ptr, o_ptr = k_ptr, wk_ptr, ko_ptr
        else:
            x_ptr, w_ptr, o_ptr = v_ptr, wv_ptr, vo_ptr
        acc = tl.zeros([BLOCK_T, K], dtype=tl.float32)
        x_tile = x_ptr + rows[:, None].to(tl.int64) * stride_xt + cols[None, :]
        for i in tl.static_range(W):
            # Output row t, tap i reads row t + i of [window (W - 1 rows) ; x], i.e. x row
            # t - (W - 1 - i); only the first row block reaches into the window.
            shift = W - 1 - i
            in_x = rows >= shift
            xv = tl.load(x_tile - shift * stride_xt, mask=(live & in_x)[:, None], other=0.0)
            e = xv.to(tl.float32)
            if tl.program_id(0) == 0:
                wv = tl.load(win_ptr + which * stride_win_i + cols[None, :] * stride_win_d
                             + (rows + i)[:, None] * stride_win_j, mask=(live & ~in_x)[:, None], other=0.0)
                e = tl.where(in_x[:, None], e, wv.to(xv.dtype).to(tl.float32))
            acc = acc + e * tl.load(w_ptr + cols * W + i)[None, :]
        y = acc * tl.sigmoid(acc)                 # SiLU
        if which < 2:
            y = y * tl.rsqrt(tl.sum(y * y, axis=1) + eps)[:, None]
            if which == 0:
                y = y * q_scale
        tl.store(o_ptr + out_off, y, mask=live[:, None])


def kda_prefill_inputs_triton(q, k, v, f, windows, wq, wk, wv, a_log, dt_bias, lower_bound: float, heads: int):
    """(q, k, v, g) fp32 [T, H, K] (op.check_kda_prefill_inputs_args holds: q, k, v, f [T, D] of
    one dtype with unit stride along D and one row stride; windows [3, D, W-1]; wq, wk, wv
    contiguous [D, W]; a_log [H]; dt_bias [D])."""
    T, D = q.shape
    K = D // heads
    W = wq.shape[1]
    outs = [torch.empty((T, heads, K), device=q.device, dtype=torch.float32) for _ in range(4)]
    if T == 0:
        return tuple(outs)
    _kda_prefill_inputs_kernel[(triton.cdiv(T, BLOCK_T), heads, 4)](
        q, k, v, f, windows, wq, wk, wv, a_log, dt_bias, *outs,
        T, q.stride(0), windows.stride(0), windows.stride(1), windows.stride(2),
        float(lower_bound), float(K ** -0.5), L2_EPS,
        K=K, W=W, BLOCK_T=BLOCK_T, num_warps=4,
    )
    return tuple(outs)
