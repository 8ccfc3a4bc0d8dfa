"""KDA attention layer (Kimi Delta Attention, Ling-3 variant) over the static cache.

Ling-3 specifics: full-rank f_proj and g_proj (no_kda_lora), separate q/k/v depthwise convs
(kernel 4, fp32 weights, no bias), the bounded gate with lower_bound -5, q and k L2-normalised per
head with q scaled by 1/sqrt(head_dim), per-head gated RMSNorm on the output. The math lives in
kda_math.py; this module wires projections, cache reads and the in-place cache writes, which stay
visible to graph capture as `copy_` mutations of the cache tensors.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from .cache import Ling3Cache
from .config import Ling3Config
from .kda_math import gated_head_rmsnorm, kda_gate, kda_recurrent, l2norm, short_conv
from .layers import Linear, empty_param, prompt_kernels_apply
from .padding import PromptPadding
from .parallel import SINGLE, TensorParallel

# Up to this many tokens the recurrence runs token by token, so every position's post-state is a
# value in the graph (the relay's stage/commit stages them); longer inputs use the chunked form.
RECURRENT_MAX_T = 16


def _kda_prefill(q, k, v, g, beta, state):
    from lingc.runtime.kernels.kda_prefill import kda_prefill   # the op package imports kda_math

    return kda_prefill(q, k, v, g, beta, state)


class KDAAttention(nn.Module):
    def __init__(self, cfg: Ling3Config, layer_id: int, cache_index: int,
                 tp: TensorParallel = SINGLE):
        super().__init__()
        dt = cfg.dtype
        self.tp = tp
        self.layer_id, self.cache_index = layer_id, cache_index
        self.num_heads, self.head_dim = cfg.num_attention_heads, cfg.head_dim
        self.lower_bound = cfg.kda_lower_bound
        self.eps = cfg.rms_norm_eps
        hid, d = cfg.hidden_size, cfg.kda_dim
        W = cfg.short_conv_kernel_size
        self.q_proj, self.k_proj, self.v_proj = Linear(hid, d, dt), Linear(hid, d, dt), Linear(hid, d, dt)
        self.f_proj, self.g_proj = Linear(hid, d, dt), Linear(hid, d, dt)
        self.b_proj = Linear(hid, self.num_heads, dt)
        self.o_proj = Linear(d, hid, dt)
        self.q_conv1d, self.k_conv1d, self.v_conv1d = (_Conv(d, W) for _ in range(3))
        self.A_log = empty_param(self.num_heads, dtype=torch.float32)
        self.dt_bias = empty_param(d, dtype=torch.float32)
        self.o_norm = _Weight(self.head_dim, dt)

    def forward(self, x: torch.Tensor, positions: torch.Tensor, cache: Ling3Cache,
                slot: int = 0, padding: PromptPadding | None = None) -> torch.Tensor:
        """With `padding` (a padded prompt chunk, lingc.models.padding) the rows past its length
        leave the state and the conv windows as the last real row left them."""
        if prompt_kernels_apply(x):
            return self._prompt_forward(x, cache, slot, padding)
        T = x.shape[0]
        H, K = self.num_heads, self.head_dim
        state = cache.state[self.cache_index]
        conv = cache.conv[self.cache_index]
        windows = []
        qkv = []
        rows = None if padding is None else padding.window_rows(conv.shape[-1])
        for i, (proj, c) in enumerate(((self.q_proj, self.q_conv1d), (self.k_proj, self.k_conv1d),
                                       (self.v_proj, self.v_conv1d))):
            y, win = short_conv(proj(x), conv[slot, i], c.weight.squeeze(1), rows)
            qkv.append(y.view(T, H, K))
            windows.append(win)
        q, k, v = qkv
        q = l2norm(q) * (K ** -0.5)
        k = l2norm(k)
        g = kda_gate(self.f_proj(x).view(T, H, K), self.A_log, self.dt_bias, self.lower_bound)
        beta = torch.sigmoid(self.b_proj(x).float())
        if padding is not None:
            g, beta = _pad_gate(g, beta, padding)
        # The cache holds each head's state transposed, [V, K] (cache.py says why).
        if T <= RECURRENT_MAX_T:
            o, S = kda_recurrent(q, k, v, g, beta, state[slot].transpose(-1, -2))
        else:
            # Prefill chunks: lingc::kda_prefill is kda_math.kda_chunked itself on the CPU and the
            # chunked Triton kernels on CUDA (H200, 8192 tokens, 8 heads: 1.7 ms vs 156 ms).
            o, S = _kda_prefill(q, k, v, g, beta, state[slot].transpose(-1, -2))
        state[slot].copy_(S.transpose(-1, -2))
        conv[slot].copy_(torch.stack(windows, 0))
        o = gated_head_rmsnorm(o, self.o_norm.weight, self.g_proj(x).view(T, H, K), self.eps)
        return self.tp.all_reduce(self.o_proj(o.reshape(T, H * K).to(x.dtype)))

    def _prompt_forward(self, x: torch.Tensor, cache: Ling3Cache, slot: int,
                        padding: PromptPadding | None = None) -> torch.Tensor:
        """forward for a prompt chunk on CUDA (layers.prompt_kernels_apply), the same math in
        three lingc kernels around the projections: the input glue (short convolutions, SiLU,
        q/k norms, gate) as lingc::kda_prefill_inputs, the recurrence as lingc::kda_prefill, the
        output norm as lingc::gated_head_rmsnorm, where the plain ops make ~40 elementwise passes
        over [T, D] fp32 (H200, 8192-token prefill: ~35 ms of ~266, session 38)."""
        from lingc.runtime.kernels.kda_prefill_inputs import kda_prefill_inputs
        from lingc.runtime.kernels.norms import gated_head_rmsnorm as gated_norm_op

        T = x.shape[0]
        H, K = self.num_heads, self.head_dim
        state = cache.state[self.cache_index]
        conv = cache.conv[self.cache_index]
        raw = (self.q_proj(x), self.k_proj(x), self.v_proj(x))
        convs = (self.q_conv1d, self.k_conv1d, self.v_conv1d)
        q, k, v, g = kda_prefill_inputs(*raw, self.f_proj(x), conv[slot], *(c.weight.squeeze(1) for c in convs),
                                        self.A_log, self.dt_bias, self.lower_bound, H)
        beta = torch.sigmoid(self.b_proj(x).float())
        if padding is not None:
            g, beta = _pad_gate(g, beta, padding)
        o, S = _kda_prefill(q, k, v, g, beta, state[slot].transpose(-1, -2))
        state[slot].copy_(S.transpose(-1, -2))
        # The new windows: the chunk's last W - 1 inputs (T >= 64 > W - 1), oldest first; of a
        # padded chunk the W - 1 rows of [old window ; chunk] that end at its last real row.
        width = conv.shape[-1]
        if padding is None:
            conv[slot].copy_(torch.stack([r[T - width:] for r in raw]).transpose(1, 2))
        else:
            conv[slot].copy_(_padded_windows(raw, conv[slot], padding))
        o = gated_norm_op(o, self.g_proj(x).view(T, H, K), self.o_norm.weight, self.eps, x.dtype)
        return self.tp.all_reduce(self.o_proj(o.reshape(T, H * K)))


def _pad_gate(g: torch.Tensor, beta: torch.Tensor, padding: PromptPadding):
    """A padded chunk's log decay g [T, H, K] and beta [T, H] (fresh tensors) with their padding
    rows zeroed in place: those rows keep the state exactly (decay exp(0) = 1, no delta)."""
    return padding.mask_rows_(g), padding.mask_rows_(beta)


def _padded_windows(raw, window: torch.Tensor, padding: PromptPadding) -> torch.Tensor:
    """The conv windows [3, D, W-1] after a padded chunk: rows length .. length + W - 2 of
    [window ; chunk] (oldest first), gathered from the three projections raw ([T, D] each) and the
    old window [3, D, W-1] without concatenating them (a [3, T, D] copy at 8192 tokens)."""
    width = window.shape[-1]
    idx = padding.window_rows(width)                                           # in [window ; chunk]
    new = torch.stack([r.index_select(0, (idx - width).clamp(min=0)) for r in raw]).transpose(1, 2)
    old = window.index_select(2, idx.clamp(max=width - 1))
    return torch.where(idx < width, old, new.to(window.dtype))


class _Conv(nn.Module):
    """Holds a depthwise Conv1d weight [D, 1, W] under the checkpoint's name (`*_conv1d.weight`)."""

    def __init__(self, dim: int, width: int):
        super().__init__()
        self.weight = empty_param(dim, 1, width, dtype=torch.float32)


class _Weight(nn.Module):
    def __init__(self, dim: int, dtype: torch.dtype):
        super().__init__()
        self.weight = empty_param(dim, dtype=dtype)
