"""Fused MoE experts (align -> up-GEMM with SwiGLU -> down-GEMM -> weighted combine, the shared
expert folded in): reference, Triton kernels, custom op.

Importing this package registers ``torch.ops.lingc.moe_experts`` (and, through it, needs
``lingc::moe_align``). The Triton launcher (``.kernel``) is imported on first CUDA use, so the
CPU path needs no triton.
"""
from .naive import expert_mlp_row, moe_experts_reference
from .op import check_moe_experts_args, moe_experts

__all__ = ["check_moe_experts_args", "expert_mlp_row", "moe_experts", "moe_experts_reference"]
