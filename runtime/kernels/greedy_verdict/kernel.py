"""Triton kernels behind ``lingc.greedy_verdict`` and ``lingc.greedy_emit`` (runtime/relay/ops.py,
where the references are).

A verify step ends with a few integer operations on S + 1 <= 16 tokens: the accept count (the
leading drafts the target agrees with) and the emitted tokens. As ATen ops they were ten small
kernels on flash-tp4-rank's verify graph: compare, convert, cumprod (two cub scan kernels),
sum, arange, gather, compare, where, and a cat. Each was a full, non-programmatic edge of the
captured graph (about 18 us of the critical path per relay step on the H200, session 14). Here
each op is one program of one warp, launched with PDL.

- ``_greedy_verdict_kernel``: accept = the index of the first j < S with chain[j + 1] !=
  target[j], or S when every draft matches (the same count as cumprod(match).sum()).
- ``_greedy_emit_kernel``: emitted[j] = chain[j + 1] for j < accept, else target[accept] (rows
  past accept hold the correction token, as the reference's ``where`` does; the extend step reads
  only rows <= accept).

Both read only what the producer wrote after ``pdl_wait`` (nothing is producer-independent).
"""
import torch
import triton
import triton.language as tl

from lingc.runtime.pdl import launch_kwargs, pdl_launch_dependents, pdl_supported, pdl_wait

__all__ = ["greedy_verdict_triton", "greedy_emit_triton"]


@triton.jit
def _greedy_verdict_kernel(chain_ptr, target_ptr, accept_ptr, stride_c, stride_t,
                           N: tl.constexpr, NP: tl.constexpr, USE_GDC: tl.constexpr):
    j = tl.arange(0, NP)
    pdl_wait(USE_GDC)
    pdl_launch_dependents(USE_GDC)
    draft = tl.load(chain_ptr + (j + 1) * stride_c, mask=j + 1 < N, other=0)
    target = tl.load(target_ptr + j * stride_t, mask=j < N - 1, other=0)
    miss = (j < N - 1) & (draft != target)
    accept = tl.min(tl.where(miss, j, N - 1), axis=0)
    tl.store(accept_ptr, accept.to(tl.int64))


@triton.jit
def _greedy_emit_kernel(chain_ptr, target_ptr, accept_ptr, emitted_ptr, stride_c, stride_t,
                        N: tl.constexpr, NP: tl.constexpr, USE_GDC: tl.constexpr):
    j = tl.arange(0, NP)
    pdl_wait(USE_GDC)
    pdl_launch_dependents(USE_GDC)
    accept = tl.load(accept_ptr)
    draft = tl.load(chain_ptr + (j + 1) * stride_c, mask=j + 1 < N, other=0)
    correction = tl.load(target_ptr + accept * stride_t)
    tl.store(emitted_ptr + j, tl.where(j < accept, draft, correction), mask=j < N)


def _launch_args(chain: torch.Tensor) -> dict:
    n = chain.shape[0]
    return dict(N=n, NP=triton.next_power_of_2(n), USE_GDC=pdl_supported(chain.device), num_warps=1,
                **launch_kwargs(chain.device))


def greedy_verdict_triton(chain: torch.Tensor, target: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """accept int64 [1] for chain, target int64 [S+1] (any stride; checked by the op)."""
    out = torch.empty((1,), dtype=torch.int64, device=chain.device) if out is None else out
    _greedy_verdict_kernel[(1,)](chain, target, out, chain.stride(0), target.stride(0), **_launch_args(chain))
    return out


def greedy_emit_triton(chain: torch.Tensor, target: torch.Tensor, accept: torch.Tensor,
                       out: torch.Tensor | None = None) -> torch.Tensor:
    """emitted int64 [S+1] for chain, target int64 [S+1] and accept int64 [1]."""
    out = torch.empty(chain.shape, dtype=chain.dtype, device=chain.device) if out is None else out
    _greedy_emit_kernel[(1,)](chain, target, accept, out, chain.stride(0), target.stride(0), **_launch_args(chain))
    return out
