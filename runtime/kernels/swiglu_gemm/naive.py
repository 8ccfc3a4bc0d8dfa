"""Plain-PyTorch reference for the SwiGLU GEMM, and the gate/up interleave helpers.

The fused weight ``w13`` has shape [2N, K] with gate and up rows interleaved: row 2j is gate
row j, row 2j+1 is up row j. Interleaving (rather than stacking [gate; up]) puts the two inputs
of each output column in adjacent accumulator columns, so the kernel's epilogue pairs them
without a second pass (README.md in this folder).

Numerics (shared with the Triton kernel): products and sums in fp32, activation in fp32, one
final rounding to ``x.dtype``. With ``limit`` L > 0 the activation is the clamped SwiGLU
``min(silu(g), L) * clamp(u, -L, L)``; with L == 0 it is plain ``silu(g) * u``.

The reference is batch-invariant like the kernel (design.md): each row goes through its own
[1, K] x [K, 2N] product, so a row's bits do not depend on how many rows run with it. It is the
op's CPU implementation, which the CPU speculative-decoding gate relies on.
"""
import torch
import torch.nn.functional as F

__all__ = [
    "interleave_gate_up",
    "gate_view",
    "up_view",
    "deinterleave_gate_up",
    "swiglu_activation",
    "swiglu_gemm_reference",
    "swiglu_gemm_reference_separate",
]


def interleave_gate_up(gate_w: torch.Tensor, up_w: torch.Tensor) -> torch.Tensor:
    """Build the interleaved [2N, K] weight from gate [N, K] and up [N, K] (one copy)."""
    if gate_w.shape != up_w.shape or gate_w.dim() != 2:
        raise ValueError(
            f"gate_w and up_w must both be [N, K] with the same shape, got "
            f"{tuple(gate_w.shape)} and {tuple(up_w.shape)}"
        )
    n, k = gate_w.shape
    return torch.stack((gate_w, up_w), dim=1).reshape(2 * n, k)


def gate_view(w13: torch.Tensor) -> torch.Tensor:
    """The gate rows of an interleaved weight, as a strided [N, K] view (no copy)."""
    return w13[0::2]


def up_view(w13: torch.Tensor) -> torch.Tensor:
    """The up rows of an interleaved weight, as a strided [N, K] view (no copy)."""
    return w13[1::2]


def deinterleave_gate_up(w13: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Inverse of ``interleave_gate_up`` as views: ``(gate [N, K], up [N, K])``."""
    return gate_view(w13), up_view(w13)


def swiglu_activation(g: torch.Tensor, u: torch.Tensor, limit: float) -> torch.Tensor:
    """SwiGLU on fp32 pre-activations; clamped when ``limit`` > 0."""
    act = F.silu(g)
    if limit > 0:
        act = act.clamp(max=limit)
        u = u.clamp(-limit, limit)
    return act * u


def swiglu_gemm_reference_separate(
    x: torch.Tensor, w_gate: torch.Tensor, w_up: torch.Tensor, limit: float
) -> torch.Tensor:
    """out[..., N] = act(x @ w_gate.T, x @ w_up.T) in fp32, rounded once to ``x.dtype``."""
    lead = x.shape[:-1]
    xf = x.reshape(-1, x.shape[-1]).float()
    gf, uf = w_gate.float(), w_up.float()
    n = w_gate.shape[0]
    # One product per row: a single [M, K] matmul may pick an M-dependent blocking and change
    # a row's reduction order, which would break batch invariance.
    g = [F.linear(xf[i : i + 1], gf) for i in range(xf.shape[0])]
    u = [F.linear(xf[i : i + 1], uf) for i in range(xf.shape[0])]
    g = torch.cat(g) if g else xf.new_empty(0, n)
    u = torch.cat(u) if u else xf.new_empty(0, n)
    return swiglu_activation(g, u, limit).to(x.dtype).reshape(*lead, n)


def swiglu_gemm_reference(x: torch.Tensor, w13: torch.Tensor, limit: float) -> torch.Tensor:
    """The reference on an interleaved w13 [2N, K]."""
    return swiglu_gemm_reference_separate(x, gate_view(w13), up_view(w13), limit)
