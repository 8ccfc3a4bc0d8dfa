"""The chunked KDA prefill as an opaque custom op.

``torch.ops.lingc.kda_prefill(q, k, v, g, beta, state) -> (o [T, H, V] fp32, final_state [H, K, V] fp32)``

One sequence's KDA delta-rule core over a prompt of T >= 1 tokens (the prefill; decode and verify
chains take ``lingc::kda_chain``). q and k arrive L2-normalised (q also scaled by K^-0.5), v after
the short conv, g the per-key-channel log decay in fp32, beta in (0, 1). ``state`` [H, K, V] fp32 is
the state entering the prompt and is only read: the final state is returned, and the caller copies
it into its cache slot (the op declares no mutation).

CPU: the reference (naive.py: kda_math.kda_chunked). CUDA: the two Triton kernels of kernel.py,
PDL-launched on Hopper. A ``torch.library.custom_op`` rather than a ``triton_op`` for the reason
given in swiglu_gemm/op.py: an opaque op keeps lingc's own PDL launch.
"""
from __future__ import annotations

import torch

from lingc.runtime.registry import register_op

from .naive import kda_prefill_reference

__all__ = ["kda_prefill", "check_kda_prefill_args"]


def _shape(t: torch.Tensor) -> tuple:
    return tuple(t.shape)


def check_kda_prefill_args(q, k, v, g, beta, state) -> None:
    """Raise ValueError naming the bad argument of ``kda_prefill``."""
    op = "kda_prefill"
    if state.dim() != 3 or state.dtype != torch.float32:
        raise ValueError(f"{op}: state must be [H, K, V] float32, got {_shape(state)} {state.dtype}")
    H, K, V = state.shape
    if q.dim() != 3 or q.shape[1:] != (H, K):
        raise ValueError(f"{op}: q must be [T, H, K] = [T, {H}, {K}], got {_shape(q)}")
    T = q.shape[0]
    if T < 1:
        raise ValueError(f"{op}: T = {T} tokens, must be >= 1")
    for name, x, want in (("k", k, (T, H, K)), ("g", g, (T, H, K)), ("v", v, (T, H, V)), ("beta", beta, (T, H))):
        if _shape(x) != want:
            raise ValueError(f"{op}: {name} must be {list(want)}, got {_shape(x)}")
    for name, x in (("q", q), ("k", k), ("v", v), ("beta", beta)):
        if not x.is_floating_point():
            raise ValueError(f"{op}: {name} must be floating point, got {x.dtype}")
    if g.dtype != torch.float32:
        raise ValueError(f"{op}: g (log decay) must be float32, got {g.dtype}: its in-chunk cumulative "
                         f"sum spans up to 64 tokens")
    for name, x in (("q", q), ("k", k), ("v", v), ("g", g), ("beta", beta)):
        if x.device != state.device:
            raise ValueError(f"{op}: {name} is on {x.device} but state is on {state.device}")


def _kda_prefill(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                 state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    check_kda_prefill_args(q, k, v, g, beta, state)
    if state.is_cuda:
        from .kernel import kda_prefill_triton  # imported here so the CPU path needs no triton

        return kda_prefill_triton(q, k, v, g, beta, state.contiguous())
    o, S = kda_prefill_reference(q, k, v, g, beta, state)
    return o.contiguous(), S.contiguous()


def _kda_prefill_fake(q, k, v, g, beta, state):
    check_kda_prefill_args(q, k, v, g, beta, state)
    H, K, V = state.shape
    return (state.new_empty((q.shape[0], H, V), dtype=torch.float32),
            state.new_empty((H, K, V), dtype=torch.float32))


kda_prefill = register_op("kda_prefill", _kda_prefill, _kda_prefill_fake)
