"""moe_align: (token, expert) pairs grouped into expert buckets padded to the fused-MoE GEMM's
block size, in one launch on the pair axis for decode-sized inputs: reference, Triton kernel,
custom op.

Importing this package registers ``torch.ops.lingc.moe_align``. The Triton launcher
(``.kernel``) is imported on first CUDA use, so the CPU path needs no triton.
"""
from .naive import align_sizes, moe_align_reference, pair_experts
from .op import check_moe_align_args, moe_align

__all__ = ["align_sizes", "check_moe_align_args", "moe_align", "moe_align_reference", "pair_experts"]
