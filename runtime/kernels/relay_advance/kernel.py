"""Triton kernel of `lingc::relay_advance` (op.py has the contract, naive.py the reference).

One program (grid (1,)): everything it reads was written by the graph's earlier kernels or by
the previous step (nothing is producer-independent), so the whole body comes after
``pdl_wait``; every store does too (rule 2 of runtime/pdl.py). The hidden row [H] is copied in
blocks of BH (H = 8192 on flash is 8 blocks); the token values are a handful of int64 lanes.
The ring slot is ``ring_k mod R`` with the floor convention of torch.remainder (ring_k is
never negative, but the two conventions then cannot differ).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from lingc.runtime.pdl import launch_kwargs, pdl_launch_dependents, pdl_supported, pdl_wait

__all__ = ["relay_advance_triton"]

BH = 1024


@triton.jit
def _relay_advance_kernel(tok_ptr, hid_ptr, acc_ptr, emit_ptr, n_ptr, x_ptr, seed_ptr, dh_ptr, ring_ptr, k_ptr,
                          stride_tok, stride_hid, stride_emit, stride_ring,
                          T: tl.constexpr, TP: tl.constexpr, H: tl.constexpr, BH: tl.constexpr,
                          R: tl.constexpr, ACCEPTED: tl.constexpr, HAS_SEED: tl.constexpr, USE_GDC: tl.constexpr):
    pdl_wait(USE_GDC)
    pdl_launch_dependents(USE_GDC)
    j = tl.arange(0, TP)
    mj = j < T
    emitted = tl.load(emit_ptr + j * stride_emit, mask=mj, other=0)
    accept = tl.load(acc_ptr)
    n = tl.load(n_ptr)
    k = tl.load(k_ptr)
    if ACCEPTED:
        a = accept
        if HAS_SEED:
            tl.store(seed_ptr, tl.load(tok_ptr + a * stride_tok))
        tl.store(x_ptr, tl.load(emit_ptr + a * stride_emit))
        tl.store(n_ptr, n + a + 1)
        offs = tl.arange(0, BH)
        for h0 in tl.static_range(0, H, BH):
            m = h0 + offs < H
            row = tl.load(hid_ptr + a * stride_hid + h0 + offs, mask=m, other=0.0)
            tl.store(dh_ptr + h0 + offs, row.to(dh_ptr.dtype.element_ty), mask=m)
    else:
        y = tl.load(tok_ptr)
        emitted = tl.where(j == 0, y, emitted)
        tl.store(emit_ptr, y)
        tl.store(x_ptr, y)
        tl.store(n_ptr, n + 1)
    slot = ((k % R) + R) % R
    row_ptr = ring_ptr + slot * stride_ring
    tl.store(row_ptr + j, emitted, mask=mj)
    tl.store(row_ptr + T, accept)
    tl.store(k_ptr, k + 1)


def relay_advance_triton(tokens, hidden, accept, emitted, n, x, seed, dh, ring, ring_k, accepted: bool) -> None:
    """The op's CUDA path (arguments checked by the op)."""
    T = emitted.shape[0]
    has_seed = tokens is not None
    if not has_seed:           # the graph wrote the seed: unused pointers (HAS_SEED compiled out)
        tokens = seed = emitted
    if accepted:
        H, stride_hid = hidden.shape[1], hidden.stride(0)
    else:                      # unused pointers (the ACCEPTED branch is compiled out)
        hidden, seed, dh, H, stride_hid = tokens, tokens, tokens, 1, 0
    _relay_advance_kernel[(1,)](
        tokens, hidden, accept, emitted, n, x, seed, dh, ring, ring_k,
        tokens.stride(0), stride_hid, emitted.stride(0), ring.stride(0),
        T=T, TP=triton.next_power_of_2(T), H=H, BH=min(BH, triton.next_power_of_2(H)), R=ring.shape[0],
        ACCEPTED=accepted, HAS_SEED=has_seed, USE_GDC=pdl_supported(emitted.device), num_warps=4, **launch_kwargs(emitted.device))
