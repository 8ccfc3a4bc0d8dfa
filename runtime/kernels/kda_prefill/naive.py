"""Plain-PyTorch reference for the chunked KDA prefill, built on lingc.models.kda_math.

``kda_prefill_reference`` is ``kda_chunked`` (chunks of 64, one triangular solve per chunk, fp32
throughout) with the op's argument order and dtypes: q and k already L2-normalised (q also scaled
by K^-0.5), v, g the log decay (fp32, per key channel), beta, and the initial state [H, K, V] fp32,
which is not modified. It is the op's CPU implementation and the tests' oracle beside the token-by-
token ``kda_recurrent``.

``kda_prefill_chunk_terms`` writes out, for one chunk, the per-chunk quantities the Triton kernel
splits the work into (see README.md): it is the same algebra as kda_chunked regrouped so that the
only thing the sequential part needs per chunk is matrix products with the running state. Tests use
it to check the regrouping on its own, independently of any kernel.
"""
from __future__ import annotations

import torch

from lingc.models.kda_math import kda_chunked

__all__ = ["CHUNK", "kda_prefill_reference", "kda_prefill_chunk_terms", "kda_prefill_from_terms"]

CHUNK = 64


def kda_prefill_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                          beta: torch.Tensor, state: torch.Tensor, chunk: int = CHUNK):
    """(o [T, H, V] fp32, final state [H, K, V] fp32); the inputs are left untouched."""
    return kda_chunked(q, k, v, g, beta, state, chunk=chunk)


def kda_prefill_chunk_terms(q, k, v, g, beta):
    """The state-independent terms of one chunk, per head (inputs [C, H, *], C <= chunk).

    Returns a dict of [H, ...] fp32 tensors:
      w  [H, C, K] = M^-1 diag(beta) (exp(G) * k)     M = I + diag(beta) A (unit lower triangular)
      u  [H, C, V] = M^-1 diag(beta) v                 so that U = u - w S0 (the deltas added)
      qg [H, C, K] = exp(G) * q                        o = qg S0 + P U
      P  [H, C, C] = q_t . (exp(G_t - G_r) k_r), r <= t
      kd [H, C, K] = exp(G_C - G) * k                  S_next = diag(exp(G_C)) S0 + kd^T U
      gc [H, K]    = exp(G_C)
    """
    q, k, v, g, beta = (t.float().transpose(0, 1) for t in (q, k, v, g, beta))  # [H, C, *]
    G = g.cumsum(1)
    C = G.shape[1]
    incl = torch.ones(C, C, dtype=torch.bool, device=q.device).tril()
    diff = G.unsqueeze(2) - G.unsqueeze(1)
    decay = torch.where(incl[None, :, :, None], diff, diff.new_full((), float("-inf"))).exp()
    A = torch.einsum("hsk,hsrk,hrk->hsr", k, decay, k).tril(-1)
    M = torch.eye(C, device=q.device) + beta.unsqueeze(-1) * A
    Minv = torch.linalg.solve_triangular(M, torch.eye(C, device=q.device).expand_as(M), upper=False,
                                         unitriangular=True)
    eG = G.exp()
    last = G[:, -1:, :]
    return dict(
        w=Minv @ (beta.unsqueeze(-1) * eG * k),
        u=Minv @ (beta.unsqueeze(-1) * v),
        qg=eG * q,
        P=torch.einsum("htk,htrk,hrk->htr", q, decay, k),
        kd=(last - G).exp() * k,
        gc=last[:, 0, :].exp(),
    )


def kda_prefill_from_terms(q, k, v, g, beta, state, chunk: int = CHUNK):
    """The prefill from ``kda_prefill_chunk_terms``: the kernel's split of the work, in torch."""
    T = q.shape[0]
    S = state.float()
    outs = []
    for c0 in range(0, T, chunk):
        sl = slice(c0, min(c0 + chunk, T))
        x = kda_prefill_chunk_terms(q[sl], k[sl], v[sl], g[sl], beta[sl])
        U = x["u"] - x["w"] @ S
        outs.append((x["qg"] @ S + x["P"] @ U).transpose(0, 1))
        S = x["gc"].unsqueeze(-1) * S + x["kd"].transpose(1, 2) @ U
    return torch.cat(outs, 0), S
