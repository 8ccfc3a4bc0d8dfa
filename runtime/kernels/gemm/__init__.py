"""Decode GEMM over a list of weights (fused same-input projections) with epilogues, and the
fused GEMM + argmax for greedy decode: references, Triton kernels, custom ops.

Importing this package registers ``torch.ops.lingc.gemm``, ``torch.ops.lingc.gemm_argmax`` and
``torch.ops.lingc.rmsnorm_gemm``.
The launch table (``.config``) and the Triton launchers (``.kernel``, ``.argmax_kernel``) are
imported on first CUDA use, so the CPU path needs no triton.
"""
from .naive import gemm_argmax_reference, gemm_epilogue, gemm_reference, rmsnorm_gemm_reference
from .op import (
    MAX_WEIGHTS,
    check_gemm_argmax_args,
    check_gemm_args,
    check_rmsnorm_gemm_args,
    gemm,
    gemm_argmax,
    rmsnorm_gemm,
)

__all__ = [
    "MAX_WEIGHTS",
    "check_gemm_argmax_args",
    "check_gemm_args",
    "check_rmsnorm_gemm_args",
    "gemm",
    "gemm_argmax",
    "gemm_argmax_reference",
    "gemm_epilogue",
    "gemm_reference",
    "rmsnorm_gemm",
    "rmsnorm_gemm_reference",
]
