"""Reference of `lingc::moe_swiglu`: the grouped MoE form's activation, lingc.models.moe.swiglu over
the gate and up halves of the up-GEMM's output rows."""
from __future__ import annotations

import torch

__all__ = ["moe_swiglu_reference"]


def moe_swiglu_reference(h: torch.Tensor, limit: float) -> torch.Tensor:
    """swiglu(h[:, :I], h[:, I:], limit) for h [P, 2I]: [P, I] in h's dtype."""
    from lingc.models.moe import swiglu   # the model's definition (the op package is imported by it)

    inter = h.shape[1] // 2
    return swiglu(h[:, :inter], h[:, inter:], limit)
