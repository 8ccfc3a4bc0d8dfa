"""`lingc::moe_swiglu`: the grouped (prompt) MoE form's SwiGLU between its two GEMMs in one kernel
(op.py)."""

from . import op  # noqa: F401  (registers the op)
from .naive import moe_swiglu_reference
from .op import check_moe_swiglu_args, moe_swiglu

__all__ = ["check_moe_swiglu_args", "moe_swiglu", "moe_swiglu_reference"]
