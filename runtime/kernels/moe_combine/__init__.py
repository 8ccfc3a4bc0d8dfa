"""`lingc::moe_combine_sorted`: a prefill MoE chunk's expert-sorted pair outputs summed back into
token rows in one kernel (op.py)."""

from . import op  # noqa: F401  (registers the op)
from .op import moe_combine_sorted

__all__ = ["moe_combine_sorted"]
