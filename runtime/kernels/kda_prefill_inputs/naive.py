"""Plain-PyTorch reference of `lingc::kda_prefill_inputs`: KDA's eager input glue for a prompt
chunk, composed from lingc/models/kda_math.py exactly as KDAAttention.forward runs it."""
from __future__ import annotations

from lingc.models.kda_math import kda_gate, l2norm, short_conv

__all__ = ["kda_prefill_inputs_reference"]


def kda_prefill_inputs_reference(q, k, v, f, windows, wq, wk, wv, a_log, dt_bias, lower_bound: float, heads: int):
    """(q, k, v, g), each fp32 [T, H, K]: q, k, v through their causal short convolutions (from the
    cached windows [3, D, W-1]) and SiLU, q and k L2-normalised per head and q scaled by
    K^-1/2; g = kda_gate(f). The windows are read, not updated."""
    T, D = q.shape
    K = D // heads
    outs = [short_conv(x, windows[i], w)[0].view(T, heads, K) for i, (x, w) in enumerate(((q, wq), (k, wk), (v, wv)))]
    qo, ko, vo = outs
    return (l2norm(qo) * (K ** -0.5), l2norm(ko), vo,
            kda_gate(f.view(T, heads, K), a_log, dt_bias, lower_bound))
