"""SwiGLU GEMM over a row-interleaved gate/up weight: reference, Triton kernel, custom op.

Importing this package registers ``torch.ops.lingc.swiglu_gemm`` (interleaved w13) and
``torch.ops.lingc.swiglu_gemm_separate`` (gate and up as two tensors). The Triton launcher lives in
``.kernel`` and is imported on first CUDA use, so the CPU path needs no triton.
"""
from .naive import (
    deinterleave_gate_up,
    gate_view,
    interleave_gate_up,
    swiglu_activation,
    swiglu_gemm_reference,
    swiglu_gemm_reference_separate,
    up_view,
)
from .op import check_swiglu_gemm_args, swiglu_gemm, swiglu_gemm_separate

__all__ = [
    "check_swiglu_gemm_args",
    "deinterleave_gate_up",
    "gate_view",
    "interleave_gate_up",
    "swiglu_activation",
    "swiglu_gemm",
    "swiglu_gemm_reference",
    "swiglu_gemm_reference_separate",
    "swiglu_gemm_separate",
    "up_view",
]
