"""Plain-PyTorch reference of the fused MoE expert computation (the op's CPU implementation).

Per token t (row of x), with k routed slots and an optional shared expert:

    for each slot j in 0..k-1, e = topk_ids[t, j]:
        g = x[t] @ w_gate[e].T,  u = x[t] @ w_up[e].T          fp32 accumulation
        a = swiglu(g, u, limit) rounded to x.dtype             (as the eager model rounds it)
        y_j = a @ w_down[e].T                                  fp32 accumulation, NOT rounded
    y_s = the same with (shared_gate, shared_up, shared_down, shared_limit)
          [* sigmoid(x[t] . shared_sigmoid)   with a gated shared expert (Qwen3-Next's), fp32]
    out[t] = ((w_0 * y_0 + w_1 * y_1) + ... + w_{k-1} * y_{k-1}) + y_s     in fp32, slot order
    out[t] rounded to x.dtype once

SwiGLU with limit L > 0 is ``min(silu(g), L) * clamp(u, -L, L)``; L == 0 is ``silu(g) * u``
(``swiglu_gemm.naive.swiglu_activation``).

Declared numerics against ``lingc.models.moe.MoE``: the eager model rounds each expert's down
projection and the shared expert's output to x.dtype before summing them; here (and in the
Triton kernels) they stay in fp32 and the sum is rounded once. In fp32 the two agree up to
summation order; in bf16 they are not bit-equal.

Batch invariance (design.md): every product is one token's [1, H] row against one expert's
weight, so a token's bits do not depend on how many tokens run with it.
"""
import torch
import torch.nn.functional as F

from lingc.runtime.kernels.swiglu_gemm.naive import swiglu_activation

__all__ = ["expert_mlp_row", "moe_experts_reference"]


def expert_mlp_row(
    x_row: torch.Tensor, w_gate: torch.Tensor, w_up: torch.Tensor, w_down: torch.Tensor, limit: float
) -> torch.Tensor:
    """fp32 [1, H]: one token [1, H] through one SwiGLU expert (gate/up [I, H], down [H, I]); the
    activation is rounded to x_row.dtype, the down projection is kept in fp32."""
    xf = x_row.float()
    a = swiglu_activation(F.linear(xf, w_gate.float()), F.linear(xf, w_up.float()), limit).to(x_row.dtype)
    return F.linear(a.float(), w_down.float())


def moe_experts_reference(
    x: torch.Tensor,
    topk_ids: torch.Tensor,
    topk_weights: torch.Tensor,
    w_gate: torch.Tensor,
    w_up: torch.Tensor,
    w_down: torch.Tensor,
    shared_gate: torch.Tensor | None,
    shared_up: torch.Tensor | None,
    shared_down: torch.Tensor | None,
    limit: float,
    shared_limit: float,
    shared_sigmoid: torch.Tensor | None = None,
) -> torch.Tensor:
    """out [T, H] in x.dtype (module docstring). Expert ids must lie in [0, E). shared_sigmoid
    [1, H]: the shared expert's output is scaled by sigmoid(x[t] . shared_sigmoid), in fp32."""
    t_count, h = x.shape
    out = torch.empty((t_count, h), dtype=x.dtype, device=x.device)
    ids = topk_ids.tolist()
    weights = topk_weights.float()
    for t in range(t_count):
        row = x[t : t + 1]
        acc = None
        for j, e in enumerate(ids[t]):
            y = weights[t, j] * expert_mlp_row(row, w_gate[e], w_up[e], w_down[e], limit)
            acc = y if acc is None else acc + y
        if shared_gate is not None:
            y = expert_mlp_row(row, shared_gate, shared_up, shared_down, shared_limit)
            if shared_sigmoid is not None:
                y = torch.sigmoid(F.linear(row.float(), shared_sigmoid.float())) * y
            acc = y if acc is None else acc + y
        out[t] = acc[0].to(x.dtype)
    return out
