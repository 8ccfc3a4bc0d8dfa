"""`lingc::head_matmul`: per-head fp32 products for a few rows (MLA's absorbed W_uk / W_uv):
reference, Triton kernel, custom op."""
from .naive import head_matmul_reference
from .op import MAX_ROWS, check_head_matmul_args, head_matmul

__all__ = ["MAX_ROWS", "check_head_matmul_args", "head_matmul", "head_matmul_reference"]
