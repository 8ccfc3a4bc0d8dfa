"""``torch.ops.lingc.relay_advance(Tensor? tokens, Tensor? hidden, Tensor accept, Tensor(a!) emitted,
Tensor(b!) n, Tensor(c!) x, Tensor(d!)? seed, Tensor(e!)? dh, Tensor(f!) ring, Tensor(g!) ring_k,
bool accepted) -> ()``: the bookkeeping at the end of a relay step, in place.

With ``accepted`` (the extend graph's tail; a = accept[0], T = emitted's length):

    seed = tokens[a] ; dh = hidden[a] ; x = emitted[a] ; n += a + 1

tokens int64 [T] (the draft's argmax per row), hidden [T, H] (the draft's hidden states),
seed int64 [1], dh [1, H]; tokens and seed both None when the graph writes the seed itself (a
sampling request's extend_sample draws it: runtime/relay/steps.py). Without it (the decode graph's tail; tokens = [y], hidden, seed and dh
None):

    emitted[0] = y ; x = y ; n += 1

Then in both: ``ring[ring_k % R] = [emitted..., accept] ; ring_k += 1`` (ring int64 [R, T + 1],
the device->host token ring of runtime/relay/buffers.py). ``emitted`` is written only without
``accepted``; the schema marks it written in both forms. As ATen ops this tail was 8 (decode)
to 13 (extend) kernels, each a full edge of the captured graph; here it is one PDL-launched
program. The pdl_swap pass emits it (passes/relay_tail.py).

Indices are not bounds-checked on the device (a host sync): accept comes from the verdict
(0..T-1) and the CPU path (gather, index_copy_) raises on a bad one. CUDA: kernel.py; elsewhere
the reference (naive.py).
"""
from __future__ import annotations

import torch

from lingc.runtime.registry import register_op

from .naive import relay_advance_reference

__all__ = ["relay_advance", "check_relay_advance_args"]

_SCHEMA = ("(Tensor? tokens, Tensor? hidden, Tensor accept, Tensor(a!) emitted, Tensor(b!) n, Tensor(c!) x, "
           "Tensor(d!)? seed, Tensor(e!)? dh, Tensor(f!) ring, Tensor(g!) ring_k, bool accepted) -> ()")


def _i64(name: str, t, shape: tuple) -> None:
    if t is None or t.dtype != torch.int64 or tuple(t.shape) != shape:
        got = "None" if t is None else f"{t.dtype} {tuple(t.shape)}"
        raise ValueError(f"relay_advance: {name} must be int64 {list(shape)}, got {got}")


def check_relay_advance_args(tokens, hidden, accept, emitted, n, x, seed, dh, ring, ring_k, accepted) -> None:
    """Raise ValueError naming the bad argument."""
    op = "relay_advance"
    if emitted.dim() != 1:
        raise ValueError(f"{op}: emitted must be 1-d [T], got {tuple(emitted.shape)}")
    T = emitted.shape[0]
    _i64("emitted", emitted, (T,))
    for name, t in (("accept", accept), ("n", n), ("x", x), ("ring_k", ring_k)):
        _i64(name, t, (1,))
    if ring.dim() != 2 or ring.dtype != torch.int64 or ring.shape[1] != T + 1 or ring.stride(1) != 1:
        raise ValueError(f"{op}: ring must be int64 [R, T + 1] = [R, {T + 1}] with unit row stride, got "
                         f"{ring.dtype} {tuple(ring.shape)} strides {ring.stride()}")
    if accepted:
        if (tokens is None) != (seed is None):
            raise ValueError(f"{op}: tokens and seed go together (the seed = tokens[accept]) or are both None "
                             f"(the seed written elsewhere), got tokens {'None' if tokens is None else 'given'} "
                             f"and seed {'None' if seed is None else 'given'}")
        if tokens is not None:
            _i64("tokens", tokens, (T,))
            _i64("seed", seed, (1,))
        if hidden is None or hidden.dim() != 2 or hidden.shape[0] != T or hidden.stride(1) != 1:
            raise ValueError(f"{op}: hidden must be [T, H] = [{T}, H] with unit row stride, got "
                             f"{None if hidden is None else (tuple(hidden.shape), hidden.stride())}")
        H = hidden.shape[1]
        if dh is None or tuple(dh.shape) != (1, H) or not dh.is_contiguous() or dh.dtype != hidden.dtype:
            raise ValueError(f"{op}: dh must be contiguous [1, {H}] {hidden.dtype} (hidden's row), got "
                             f"{None if dh is None else (dh.dtype, tuple(dh.shape), dh.stride())}")
    else:
        _i64("tokens", tokens, (1,))
        if hidden is not None or seed is not None or dh is not None:
            raise ValueError(f"{op}: the decode form (accepted=False) takes no hidden, seed or dh")
    for name, t in (("tokens", tokens), ("hidden", hidden), ("accept", accept), ("n", n), ("x", x),
                    ("seed", seed), ("dh", dh), ("ring", ring), ("ring_k", ring_k)):
        if t is not None and t.device != emitted.device:
            raise ValueError(f"{op}: {name} is on {t.device} but emitted is on {emitted.device}")


def _relay_advance(tokens: torch.Tensor | None, hidden: torch.Tensor | None, accept: torch.Tensor,
                   emitted: torch.Tensor, n: torch.Tensor, x: torch.Tensor, seed: torch.Tensor | None,
                   dh: torch.Tensor | None, ring: torch.Tensor, ring_k: torch.Tensor, accepted: bool) -> None:
    check_relay_advance_args(tokens, hidden, accept, emitted, n, x, seed, dh, ring, ring_k, accepted)
    if not emitted.is_cuda:
        relay_advance_reference(tokens, hidden, accept, emitted, n, x, seed, dh, ring, ring_k, accepted)
        return
    from .kernel import relay_advance_triton
    relay_advance_triton(tokens, hidden, accept, emitted, n, x, seed, dh, ring, ring_k, accepted)


def _relay_advance_fake(tokens, hidden, accept, emitted, n, x, seed, dh, ring, ring_k, accepted) -> None:
    check_relay_advance_args(tokens, hidden, accept, emitted, n, x, seed, dh, ring, ring_k, accepted)


relay_advance = register_op("relay_advance", _relay_advance, _relay_advance_fake,
                            mutates_args=("emitted", "n", "x", "seed", "dh", "ring", "ring_k"), schema=_SCHEMA)
