"""lingc's norm kernels: RMSNorm with the fused residual add, and KDA's per-head gated RMSNorm.

Importing this package registers ``torch.ops.lingc.rmsnorm`` (and its in-place ``rmsnorm_out``),
``torch.ops.lingc.embedding_rmsnorm``, ``torch.ops.lingc.rmsnorm_pair_cols`` and
``torch.ops.lingc.gated_head_rmsnorm``. The Triton launchers live in ``.kernel`` and are imported
on first CUDA use, so the CPU path needs no triton.
"""
from .naive import (embedding_rmsnorm_reference, gated_head_rmsnorm_reference, rmsnorm_pair_cols_reference,
                    rmsnorm_reference)
from .op import (MAX_D, check_embedding_rmsnorm_args, check_gated_head_rmsnorm_args, check_rmsnorm_args,
                 check_rmsnorm_pair_cols_args, embedding_rmsnorm, gated_head_rmsnorm, rmsnorm, rmsnorm_out,
                 rmsnorm_pair_cols)

__all__ = [
    "MAX_D",
    "check_embedding_rmsnorm_args",
    "check_gated_head_rmsnorm_args",
    "check_rmsnorm_args",
    "check_rmsnorm_pair_cols_args",
    "embedding_rmsnorm",
    "embedding_rmsnorm_reference",
    "gated_head_rmsnorm",
    "gated_head_rmsnorm_reference",
    "rmsnorm",
    "rmsnorm_out",
    "rmsnorm_pair_cols",
    "rmsnorm_pair_cols_reference",
    "rmsnorm_reference",
]
