"""The Ling-3 MoE router (gate matvec + sigmoid + biased grouped top-k + renormalised weights)
in two PDL-chained launches: reference, Triton kernels, custom op.

Importing this package registers ``torch.ops.lingc.moe_router``, ``torch.ops.lingc.rmsnorm_router``
(the block's input norm and the router in the router's launches) and ``torch.ops.lingc.moe_select``
(the selection alone on given logits: prompt chunks). The Triton launcher
(``.kernel``) is imported on first CUDA use, so the CPU path needs no triton.
"""
from .naive import grouped_topk_reference, moe_router_reference, rmsnorm_router_reference, router_logits
from .op import (check_moe_router_args, check_moe_select_args, check_rmsnorm_router_args, moe_router, moe_select,
                 rmsnorm_router)

__all__ = ["check_moe_router_args", "check_moe_select_args", "check_rmsnorm_router_args", "grouped_topk_reference",
           "moe_router", "moe_router_reference", "moe_select", "rmsnorm_router", "rmsnorm_router_reference",
           "router_logits"]
