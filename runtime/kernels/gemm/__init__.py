"""Decode GEMM over a list of weights (fused same-input projections) with epilogues, and the
fused GEMM + argmax for greedy decode: references, Triton kernels, custom ops.

Importing this package registers ``torch.ops.lingc.gemm`` and ``torch.ops.lingc.gemm_argmax``.
The launch table (``.config``) and the Triton launchers (``.kernel``, ``.argmax_kernel``) are
imported on first CUDA use, so the CPU path needs no triton.
"""
from .naive import gemm_argmax_reference, gemm_epilogue, gemm_reference
from .op import MAX_WEIGHTS, check_gemm_argmax_args, check_gemm_args, gemm, gemm_argmax

__all__ = [
    "MAX_WEIGHTS",
    "check_gemm_argmax_args",
    "check_gemm_args",
    "gemm",
    "gemm_argmax",
    "gemm_argmax_reference",
    "gemm_epilogue",
    "gemm_reference",
]
