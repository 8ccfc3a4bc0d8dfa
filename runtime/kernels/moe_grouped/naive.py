"""Reference of `lingc::moe_grouped`: a prompt chunk's routed experts over the (token, slot) pairs
sorted by expert, one expert at a time in plain PyTorch."""
from __future__ import annotations

import torch

__all__ = ["moe_group_pairs_reference", "moe_grouped_reference"]


def moe_grouped_reference(x: torch.Tensor, order: torch.Tensor, ends: torch.Tensor, w13: torch.Tensor,
                          w2: torch.Tensor, limit: float, top_k: int) -> torch.Tensor:
    """ys [P, H] in x's dtype: sorted row i is pair order[i] (token order[i] // top_k) through
    expert e, the expert whose rows [ends[e-1], ends[e]) hold i: down(swiglu(gate x, up x)), the
    projections in fp32, the activation and the output rounded to x's dtype."""
    from lingc.models.moe import swiglu   # the model's definition (the op package is imported by it)

    inter = w13.shape[1] // 2
    ys = x.new_empty((order.numel(), x.shape[1]))
    start = 0
    for e, end in enumerate(ends.tolist()):
        if end > start:
            xs = x[order[start:end] // top_k].float()
            h = xs @ w13[e].float().t()
            a = swiglu(h[:, :inter], h[:, inter:], limit).to(x.dtype)
            ys[start:end] = (a.float() @ w2[e].float().t()).to(x.dtype)
        start = end
    return ys


def moe_group_pairs_reference(ids: torch.Tensor, num_experts: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(order, inv, ends) of `lingc::moe_group_pairs` by a stable sort: the pairs of an expert in
    pair order (the kernel's order inside an expert is its atomics')."""
    flat = ids.reshape(-1)
    experts, order = torch.sort(flat, stable=True)
    inv = torch.empty_like(order).scatter_(0, order, torch.arange(order.numel(), device=order.device))
    ends = torch.searchsorted(experts, torch.arange(num_experts, device=ids.device, dtype=experts.dtype),
                              right=True).to(torch.int32)
    return order, inv, ends
