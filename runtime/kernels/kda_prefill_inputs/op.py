"""``torch.ops.lingc.kda_prefill_inputs(Tensor q, Tensor k, Tensor v, Tensor f, Tensor windows,
Tensor wq, Tensor wk, Tensor wv, Tensor a_log, Tensor dt_bias, float lower_bound, int heads)
-> (Tensor, Tensor, Tensor, Tensor)``: KDA's input glue for a prompt chunk in one launch.

q, k, v, f are the raw projection outputs [T, D] (D = heads x K; one dtype, unit stride along D);
windows [3, D, W-1] the cached inputs of q's, k's and v's short convolutions (oldest first, any
dtype: the cache's); wq, wk, wv their depthwise weights [D, W]; a_log [H] and dt_bias [D] the
gate's parameters. Returns fp32 [T, H, K] each:

    q' = l2norm(silu(conv(q))) * K^-1/2,  k' = l2norm(silu(conv(k))),  v' = silu(conv(v)),
    g  = lower_bound * sigmoid(exp(a_log[h]) * (f + dt_bias))

exactly what KDAAttention.forward computes with kda_math's short_conv, l2norm and kda_gate before
the chunked recurrence (naive.py composes those functions). The windows are only read: the model
stores the chunk's last W-1 inputs itself. CPU: the reference; CUDA: kernel.py. Why: on an H200
an 8192-token prefill of flash-tp4-rank spent ~35 ms of its ~266 ms in these elementwise passes
(session 38's profile, `python -m benchmarks.prefill --profile 8192`).
"""
from __future__ import annotations

import torch

from lingc.runtime.registry import register_op

from .naive import kda_prefill_inputs_reference

__all__ = ["MAX_W", "kda_prefill_inputs", "check_kda_prefill_inputs_args"]

_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
MAX_W = 17      # conv widths whose window fits in the kernel's first row block (BLOCK_T + 1; Ling-3: 4)


def check_kda_prefill_inputs_args(q, k, v, f, windows, wq, wk, wv, a_log, dt_bias, lower_bound, heads) -> None:
    """Raise ValueError naming the bad argument."""
    op = "kda_prefill_inputs"
    if q.dim() != 2:
        raise ValueError(f"{op}: q must be the [T, D] projection output, got shape {tuple(q.shape)}")
    T, D = q.shape
    if heads < 1 or D % heads:
        raise ValueError(f"{op}: heads={heads} must be >= 1 and divide D={D}")
    K = D // heads
    if K < 16 or K & (K - 1):
        raise ValueError(f"{op}: the head dim K = D / heads = {K} must be a power of two >= 16 (one tile a head)")
    for name, x in (("k", k), ("v", v), ("f", f)):
        if tuple(x.shape) != (T, D):
            raise ValueError(f"{op}: {name} must be [T, D] = {(T, D)} like q, got {tuple(x.shape)}")
    for name, x in (("q", q), ("k", k), ("v", v), ("f", f)):
        if x.dtype != q.dtype or q.dtype not in _DTYPES:
            raise ValueError(f"{op}: q, k, v, f must share one float dtype (bf16, fp16, fp32); {name} is {x.dtype}")
        if D > 1 and x.stride(1) != 1 or T > 1 and x.stride(0) != q.stride(0):
            raise ValueError(f"{op}: q, k, v, f need unit stride along D and one row stride; {name} has "
                             f"strides {tuple(x.stride())}, q {tuple(q.stride())}")
    if windows.dim() != 3 or windows.shape[:2] != (3, D) or not windows.is_floating_point():
        raise ValueError(f"{op}: windows must be the conv cache [3, D, W-1] = [3, {D}, W-1] (q, k, v), "
                         f"got {tuple(windows.shape)} {windows.dtype}")
    W = windows.shape[2] + 1
    if W > MAX_W:
        raise ValueError(f"{op}: conv width W = {W} (the window's {W - 1} + 1) is above the kernel's {MAX_W}")
    for name, w in (("wq", wq), ("wk", wk), ("wv", wv)):
        if tuple(w.shape) != (D, W) or w.dtype != torch.float32 or not w.is_contiguous():
            raise ValueError(f"{op}: {name} must be a contiguous float32 [D, W] = {(D, W)} conv weight "
                             f"(W = the window's W-1 + 1), got {tuple(w.shape)} {w.dtype}")
    if tuple(a_log.shape) != (heads,) or tuple(dt_bias.shape) != (D,):
        raise ValueError(f"{op}: a_log must be [heads] = ({heads},) and dt_bias [D] = ({D},), got "
                         f"{tuple(a_log.shape)} and {tuple(dt_bias.shape)}")
    if not (a_log.is_contiguous() and dt_bias.is_contiguous()):
        raise ValueError(f"{op}: a_log and dt_bias must be contiguous")
    for name, x in (("k", k), ("v", v), ("f", f), ("windows", windows), ("wq", wq), ("wk", wk), ("wv", wv),
                    ("a_log", a_log), ("dt_bias", dt_bias)):
        if x.device != q.device:
            raise ValueError(f"{op}: {name} is on {x.device} but q is on {q.device}")


def _kda_prefill_inputs(q, k, v, f, windows, wq, wk, wv, a_log, dt_bias, lower_bound, heads):
    args = (q, k, v, f, windows, wq, wk, wv, a_log, dt_bias, lower_bound, heads)
    check_kda_prefill_inputs_args(*args)
    if not q.is_cuda:
        return kda_prefill_inputs_reference(*args)
    from .kernel import kda_prefill_inputs_triton  # imported here so the CPU path needs no triton

    return kda_prefill_inputs_triton(*args)


def _kda_prefill_inputs_fake(q, k, v, f, windows, wq, wk, wv, a_log, dt_bias, lower_bound, heads):
    check_kda_prefill_inputs_args(q, k, v, f, windows, wq, wk, wv, a_log, dt_bias, lower_bound, heads)
    T, D = q.shape
    return tuple(q.new_empty((T, heads, D // heads), dtype=torch.float32) for _ in range(4))


kda_prefill_inputs = register_op(
    "kda_prefill_inputs", _kda_prefill_inputs, _kda_prefill_inputs_fake,
    schema=("(Tensor q, Tensor k, Tensor v, Tensor f, Tensor windows, Tensor wq, Tensor wk, Tensor wv, "
            "Tensor a_log, Tensor dt_bias, float lower_bound, int heads) -> (Tensor, Tensor, Tensor, Tensor)"))
