"""`lingc::moe_grouped`: the grouped (prompt) MoE form's expert GEMMs in two Triton kernels, the rows
gathered by the up-GEMM and the SwiGLU in its epilogue (op.py)."""

from . import op  # noqa: F401  (registers the op)
from .naive import moe_grouped_reference
from .op import check_moe_grouped_args, moe_grouped

__all__ = ["check_moe_grouped_args", "moe_grouped", "moe_grouped_reference"]
