"""Plain-PyTorch references for the fused KDA chain, built on lingc.models.kda_math.

The chain is the whole per-token KDA core of one sequence slot, from the raw projection outputs to
the delta-rule output (Ling-3's KDA layer minus the projections and the gated output norm):

    q, k, v = silu(short_conv(x_q|x_k|x_v))        continuing the slot's conv window
    q = l2norm(q) * K^-0.5,  k = l2norm(k)          per head, eps 1e-6
    g = lower_bound * sigmoid(exp(A_log) * (f + dt_bias))     (None: -exp(A_log) * softplus(f + dt_bias))
    beta = sigmoid(b)
    S = diag(exp(g)) S;  S += beta k (v - S^T k)^T;  o = S^T q

``kda_chain_reference`` is the math of lingc/models/kda.py on T <= 16 tokens (the same kda_math
calls in the same order), evaluated one position at a time, plus what the verify role needs:
every position's post-state and post-window (the "stage" of the article's stage-then-commit
scheme). It is the op's CPU implementation, so it must be batch-invariant in T like the kernel.
Calling kda_math on whole [T, ...] tensors, as the model's eager layer does, is not: torch's CPU
elementwise kernels run a vectorised body and a scalar tail whose split depends on numel, and the
two round exp/sigmoid differently, so a position's bits would depend on T (seen for T = 1, 3, 5,
7 at H*K = 48). Per-position calls on [1, ...] slices see the same numel for every T
(tests/test_kda_kernel.py checks the invariance bit for bit).

``staged_windows_reference`` is the per-position window staging written the slow, obviously
correct way (one short_conv over each prefix), for the tests to check the fast form against.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from lingc.models.kda_math import kda_gate, kda_recurrent, l2norm, short_conv

__all__ = ["KdaChainResult", "kda_chain_reference", "staged_windows_reference", "kda_commit_reference"]


@dataclass
class KdaChainResult:
    o: torch.Tensor              # [T, H, V] fp32
    state: torch.Tensor          # [H, K, V] fp32, post-chain
    window: torch.Tensor         # [3, H*K, W-1] (or flat, grouped heads), post-chain, in the window's dtype
    stage_states: torch.Tensor   # [T, H, K, V] fp32: position j's post-state
    stage_windows: torch.Tensor  # [T, *window.shape]: position j's post-window


def kda_chain_reference(q_raw: torch.Tensor, k_raw: torch.Tensor, v_raw: torch.Tensor,
                        f_raw: torch.Tensor, b_raw: torch.Tensor, conv_w: torch.Tensor,
                        conv_window: torch.Tensor, a_log: torch.Tensor, dt_bias: torch.Tensor,
                        state: torch.Tensor, lower_bound: float | None) -> KdaChainResult:
    """The chain over T tokens of one slot, position by position; inputs are not modified.

    q_raw, k_raw, v_raw, f_raw [T, H*K]; b_raw [T, H]; conv_w: the q, k, v depthwise weights,
    3 x [H*K, W] (a list, or stacked [3, H*K, W]); conv_window [3, H*K, W-1] (oldest first); a_log [H]; dt_bias [H*K];
    state [H, K, V] fp32 (V may differ from K with the flat window below: v_raw [T, H*V], the v
    conv weight [H*V, W]; the stacked [3, H*K, W-1] window needs K == V). f_raw [T, H]
    with dt_bias [H] is Gated DeltaNet's gate, one per head: the same decay for all K channels.

    Grouped heads (Qwen3-Next's Gated DeltaNet): q_raw and k_raw [T, HK*K] with HK dividing H,
    each q/k head serving H / HK consecutive value heads (repeat_interleave), their conv weights
    [HK*K, W]; the window is then one [2*HK*K + H*V, W-1] block of the q, k and v channels in
    that order (the fused convolution's cache; a [3, H*K, W-1] window is the same block when
    HK == H, and either shape is taken then). A window may also hold W columns per channel
    (Hugging Face's and fla's caches: the oldest is shifted out before any output reads it).
    """
    T = q_raw.shape[0]
    H, K, V = state.shape
    xs = (q_raw, k_raw, v_raw)
    dqk = q_raw.shape[1]
    G = H // (dqk // K)                                   # value heads per q/k head
    W = conv_w[0].shape[-1]
    flat = conv_window.reshape(-1, conv_window.shape[-1])     # [2*HK*K + H*V, W-1]
    windows = list(flat.split([dqk, dqk, H * V], 0))
    S = state.float()
    outs, states, stage_windows = [], [], []
    for t in range(T):
        # One position at a time, on [1, ...] slices: torch's CPU elementwise kernels take a
        # vectorised body and a scalar tail whose split depends on numel, and the two round
        # transcendentals (exp, sigmoid) differently, so whole-[T, ...] calls would make a
        # position's bits depend on T.
        ys = []
        for i in range(3):
            # A window of the conv's whole width (Hugging Face's cache) keeps one more column,
            # the input shifted out before any output reads it.
            y, live = short_conv(xs[i][t:t + 1], windows[i][:, -(W - 1):], conv_w[i])
            windows[i] = live if windows[i].shape[1] == W - 1 else torch.cat([windows[i][:, 1:2], live], 1)
            ys.append(y)
        q = (l2norm(ys[0].view(1, H // G, K)) * (K ** -0.5)).repeat_interleave(G, dim=1)
        k = l2norm(ys[1].view(1, H // G, K)).repeat_interleave(G, dim=1)
        v = ys[2].view(1, H, V)
        g = kda_gate(f_raw[t:t + 1].view(1, H, -1), a_log, dt_bias, lower_bound)     # [1, H, K or 1]
        beta = torch.sigmoid(b_raw[t:t + 1].float())
        o, S = kda_recurrent(q, k, v, g, beta, S)
        outs.append(o[0])
        states.append(S)
        stage_windows.append(torch.cat(windows, 0).view(conv_window.shape))
    return KdaChainResult(o=torch.stack(outs, 0), state=S, window=stage_windows[-1],
                          stage_states=torch.stack(states, 0), stage_windows=torch.stack(stage_windows, 0))


def staged_windows_reference(q_raw: torch.Tensor, k_raw: torch.Tensor, v_raw: torch.Tensor,
                             conv_w: torch.Tensor, conv_window: torch.Tensor) -> torch.Tensor:
    """Position j's post-window as short_conv's new window over the first j+1 tokens, for every j:
    [T, 3, H*K, W-1]. Quadratic in T; a test oracle for the stage slicing above."""
    T = q_raw.shape[0]
    xs = (q_raw, k_raw, v_raw)
    windows = conv_window.reshape(-1, conv_window.shape[-1]).split([x.shape[1] for x in xs], 0)
    n = conv_window.shape[-1]          # W - 1 columns, or W (the conv's whole width)
    return torch.stack([
        torch.cat([torch.cat([windows[i], x[:j + 1].T.to(conv_window.dtype)], 1)[:, -n:] for i, x in enumerate(xs)], 0)
        .view(conv_window.shape)
        for j in range(T)
    ], 0)


def kda_commit_reference(state: torch.Tensor, conv_window: torch.Tensor, stage_states: torch.Tensor,
                         stage_windows: torch.Tensor, index: torch.Tensor) -> None:
    """Copy stage position ``index`` (a 0-d or [1] integer tensor) into state and conv_window in
    place. index_select keeps the index on its device: no host sync."""
    i = index.reshape(1).long()
    state.copy_(stage_states.index_select(0, i)[0])
    conv_window.copy_(stage_windows.index_select(0, i)[0])
