"""`lingc::moe_grouped`: the grouped (prompt) MoE form's expert GEMMs in two Triton kernels, the rows
gathered by the up-GEMM and the SwiGLU in its epilogue, and `lingc::moe_group_pairs`: the pairs
grouped by expert by a counting sort (op.py)."""

from . import op  # noqa: F401  (registers the op)
from .naive import moe_group_pairs_reference, moe_grouped_reference
from .op import check_moe_group_pairs_args, check_moe_grouped_args, moe_group_pairs, moe_grouped

__all__ = ["check_moe_group_pairs_args", "check_moe_grouped_args", "moe_group_pairs", "moe_group_pairs_reference",
           "moe_grouped", "moe_grouped_reference"]
