"""Kimi Delta Attention math in plain PyTorch: gate, short convolution, recurrence, chunked form.

These functions are the model's eager path and the references that lingc's KDA kernels are
tested against. Per head, with the state S in R^{K x V} kept in fp32:

    S' = diag(exp(g_t)) S                     per-key-channel decay, g_t < 0 (kda_gate)
    S  = S' + beta_t k_t (v_t - S'^T k_t)^T   delta rule against the decayed state
    o_t = S^T q_t

Shapes: q, k [T, H, K]; v [T, H, V]; g [T, H, K] (log decay); beta [T, H]; state [H, K, V].

`kda_recurrent` is the token-by-token form (T <= 16 in the model, so every position's state is a
node of the graph for the relay's stage/commit). `kda_chunked` is the same recurrence in chunks of
64 for prefill; its derivation is in the docstring below and it agrees with the recurrence to fp32
rounding.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def kda_gate(f: torch.Tensor, a_log: torch.Tensor, dt_bias: torch.Tensor,
             lower_bound: float | None) -> torch.Tensor:
    """The log decay g, in fp32. Bounded ("safe", Ling-3's): lower_bound * sigmoid(exp(A_log[h]) *
    (f + dt_bias)), g in (lower_bound, 0). With lower_bound None, the unbounded form of Kimi
    Linear and flash-linear-attention's default gate: -exp(A_log[h]) * softplus(f + dt_bias),
    g < 0 (softplus with beta 1, threshold 20, as F.softplus).

    f: [T, H, K] raw f_proj output; a_log: [H]; dt_bias: [H * K].
    """
    H, K = f.shape[-2:]
    x = f.float() + dt_bias.float().view(H, K)
    if lower_bound is None:
        return -a_log.float().exp().view(H, 1) * F.softplus(x)
    return lower_bound * torch.sigmoid(a_log.float().exp().view(H, 1) * x)


def l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """x / sqrt(sum(x^2) + eps) over the last dim, in fp32 (the convention of the KDA kernels)."""
    x = x.float()
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + eps)


def short_conv(x: torch.Tensor, window: torch.Tensor, weight: torch.Tensor,
               window_rows: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Depthwise causal conv + SiLU over T new inputs, continuing from the cached window.

    x: [T, D] projection outputs; window: [D, W-1] the previous W-1 inputs (oldest first);
    weight: [D, W] (the Conv1d weight [D, 1, W] squeezed). Returns (silu(conv) [T, D] fp32,
    the new window [D, W-1] in window.dtype). The sum runs over taps in a fixed order, per
    position, so a position's value does not depend on T. `window_rows` ([W-1] device indices
    into [window ; x]) picks the new window's rows instead of the last W-1 (a padded chunk:
    lingc.models.padding).
    """
    T = x.shape[0]
    W = weight.shape[-1]
    ext = torch.cat([window.transpose(0, 1).to(x.dtype), x], dim=0).float()  # [T + W - 1, D]
    w = weight.float()
    y = ext[0:T] * w[:, 0]
    for tap in range(1, W):
        y = y + ext[tap:tap + T] * w[:, tap]
    kept = ext[T:] if window_rows is None else ext.index_select(0, window_rows)
    return F.silu(y), kept.transpose(0, 1).to(window.dtype)


def kda_step(S: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
             g: torch.Tensor, beta: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One token of the recurrence. S [H, K, V] fp32; q, k, g [H, K]; v [H, V]; beta [H]."""
    S = S * g.exp().unsqueeze(-1)
    kv_mem = (S * k.unsqueeze(-1)).sum(-2)                       # S'^T k: [H, V]
    delta = (v - kv_mem) * beta.unsqueeze(-1)
    S = S + k.unsqueeze(-1) * delta.unsqueeze(-2)
    o = (S * q.unsqueeze(-1)).sum(-2)                             # S^T q: [H, V]
    return o, S


def kda_recurrent(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                  beta: torch.Tensor, state: torch.Tensor,
                  return_states: bool = False):
    """Token-by-token recurrence over T positions (inputs already normalised and scaled).

    Returns (o [T, H, V] fp32, final state [H, K, V] fp32), plus the list of every position's
    post-state when return_states is set.
    """
    S = state.float()
    outs, states = [], []
    q, k, v, g, beta = (t.float() for t in (q, k, v, g, beta))
    for t in range(q.shape[0]):
        o, S = kda_step(S, q[t], k[t], v[t], g[t], beta[t])
        outs.append(o)
        states.append(S)
    o = torch.stack(outs, 0)
    return (o, S, states) if return_states else (o, S)


def kda_chunked(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                beta: torch.Tensor, state: torch.Tensor, chunk: int = 64):
    """The recurrence in chunks of `chunk` positions (prefill). Same returns as kda_recurrent.

    Within a chunk, with G_t = sum_{s<=t} g_s (cumulative log decay, per key channel) and the
    chunk's initial state S0, unrolling the recurrence gives S_t = exp(G_t) S0 + sum_{r<=t}
    exp(G_t - G_r) k_r u_r^T, where u_r = beta_r (v_r - S'_r^T k_r) is the delta actually added.
    Substituting S'_s = exp(G_s) S0 + sum_{r<s} exp(G_s - G_r) k_r u_r^T into u_s:

        u_s + beta_s sum_{r<s} A_sr u_r = beta_s (v_s - S0^T (exp(G_s) k_s)),
        A_sr = k_s . (exp(G_s - G_r) k_r)

    a unit lower-triangular system (I + diag(beta) A) U = diag(beta) (V - (exp(G) K) S0), solved
    per chunk. Then o_t = S0^T (exp(G_t) q_t) + sum_{r<=t} (q_t . exp(G_t - G_r) k_r) u_r and the
    next S0 = exp(G_C) S0 + sum_r (exp(G_C - G_r) k_r) u_r^T. The pairwise decays exp(G_t - G_r)
    are formed only for r <= t (exponent <= 0), so nothing overflows, unlike exp(G) * exp(-G).
    """
    T, H, K = q.shape
    S = state.float()
    q, k, v, g, beta = (t.float() for t in (q, k, v, g, beta))
    outs = []
    for c0 in range(0, T, chunk):
        sl = slice(c0, min(c0 + chunk, T))
        qc, kc, vc = q[sl].transpose(0, 1), k[sl].transpose(0, 1), v[sl].transpose(0, 1)  # [H, C, *]
        bc = beta[sl].transpose(0, 1)                                                      # [H, C]
        G = g[sl].transpose(0, 1).cumsum(1)                                                # [H, C, K]
        C = G.shape[1]
        incl = torch.ones(C, C, dtype=torch.bool, device=q.device).tril()
        diff = (G.unsqueeze(2) - G.unsqueeze(1))                                           # [H, t, r, K]
        decay = torch.where(incl[None, :, :, None], diff, diff.new_full((), float("-inf"))).exp()
        A = torch.einsum("hsk,hsrk,hrk->hsr", kc, decay, kc).tril(-1)
        M = torch.eye(C, device=q.device, dtype=q.dtype) + bc.unsqueeze(-1) * A
        eG = G.exp()
        rhs = bc.unsqueeze(-1) * (vc - (eG * kc) @ S)
        U = torch.linalg.solve_triangular(M, rhs, upper=False, unitriangular=True)        # [H, C, V]
        P = torch.einsum("htk,htrk,hrk->htr", qc, decay, kc)                               # r <= t
        o = (eG * qc) @ S + P @ U
        outs.append(o.transpose(0, 1))
        last = G[:, -1:, :]                                                                # [H, 1, K]
        S = last.transpose(1, 2).exp() * S + ((last - G).exp() * kc).transpose(1, 2) @ U
    return torch.cat(outs, 0), S


def gated_head_rmsnorm(o: torch.Tensor, weight: torch.Tensor, gate: torch.Tensor,
                       eps: float) -> torch.Tensor:
    """KDA output norm: per-head RMSNorm * weight, then * sigmoid(gate) (gate after the norm).

    o: [T, H, V] fp32; weight: [V]; gate: [T, H, V] raw g_proj output. Returns fp32.
    """
    o = o.float()
    o = o * torch.rsqrt(o.pow(2).mean(-1, keepdim=True) + eps) * weight.float()
    return o * torch.sigmoid(gate.float())
