"""lingc's norm kernels: RMSNorm with the fused residual add, and KDA's per-head gated RMSNorm.

Importing this package registers ``torch.ops.lingc.rmsnorm``, ``torch.ops.lingc.embedding_rmsnorm``
and ``torch.ops.lingc.gated_head_rmsnorm``. The Triton launchers live in ``.kernel`` and are imported
on first CUDA use, so the CPU path needs no triton.
"""
from .naive import embedding_rmsnorm_reference, gated_head_rmsnorm_reference, rmsnorm_reference
from .op import (MAX_D, check_embedding_rmsnorm_args, check_gated_head_rmsnorm_args, check_rmsnorm_args,
                 embedding_rmsnorm, gated_head_rmsnorm, rmsnorm)

__all__ = [
    "MAX_D",
    "check_embedding_rmsnorm_args",
    "check_gated_head_rmsnorm_args",
    "check_rmsnorm_args",
    "embedding_rmsnorm",
    "embedding_rmsnorm_reference",
    "gated_head_rmsnorm",
    "gated_head_rmsnorm_reference",
    "rmsnorm",
    "rmsnorm_reference",
]
