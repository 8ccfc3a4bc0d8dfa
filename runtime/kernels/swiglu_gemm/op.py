"""The SwiGLU GEMM as opaque custom ops.

- ``torch.ops.lingc.swiglu_gemm(x, w13, limit)``: gate/up interleaved in one [2N, K] weight.
- ``torch.ops.lingc.swiglu_gemm_separate(x, w_gate, w_up, limit)``: gate and up as two [N, K]
  tensors (any row strides, e.g. row slices of a fused gate_up weight), read in place. Same
  kernel: the interleaved op passes its weight's two strided row views.

A pass rewrites ``silu(x @ Wg.T) * (x @ Wu.T)`` into one of these, so they must trace (fake
impl), run on the CPU (the reference, which keeps the CPU path a first-class, batch-invariant
target) and on CUDA (the Triton kernel, PDL-launched on Hopper). They are
``torch.library.custom_op``s rather than ``triton_op``s on purpose: Inductor re-launches traced
user Triton kernels without the PDL attribute (compile-backends-notes.md, section 3.5), while an
opaque op keeps our own launch.

x is [..., K]; leading dims are flattened for the kernel and restored on the output [..., N].
"""
import math

import torch

from lingc.runtime.registry import register_op

from .naive import deinterleave_gate_up, swiglu_gemm_reference_separate

__all__ = ["swiglu_gemm", "swiglu_gemm_separate", "check_swiglu_gemm_args"]

DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def _check_weight(op: str, name: str, x: torch.Tensor, w: torch.Tensor, rows: str) -> None:
    if w.dim() != 2:
        raise ValueError(f"{op}: {name} must be [{rows}, K], got shape {tuple(w.shape)}")
    if x.shape[-1] != w.shape[1]:
        raise ValueError(f"{op}: K mismatch, x has K={x.shape[-1]} but {name} has K={w.shape[1]}")
    if w.dtype != x.dtype:
        raise ValueError(f"{op}: dtype mismatch, x is {x.dtype} but {name} is {w.dtype}")
    if w.device != x.device:
        raise ValueError(f"{op}: device mismatch, x on {x.device} but {name} on {w.device}")


def _check_x_and_limit(op: str, x: torch.Tensor, limit: float) -> None:
    if x.dim() < 1:
        raise ValueError(f"{op}: x must be [..., K], got a {x.dim()}-d tensor")
    if x.dtype not in DTYPES:
        raise ValueError(f"{op}: x.dtype must be bfloat16, float16 or float32, got {x.dtype}")
    if not (math.isfinite(limit) and limit >= 0):
        raise ValueError(f"{op}: limit must be a finite number >= 0, got {limit}")


def check_swiglu_gemm_args(x: torch.Tensor, w13: torch.Tensor, limit: float) -> None:
    """Raise ValueError naming the bad argument of ``swiglu_gemm``."""
    _check_x_and_limit("swiglu_gemm", x, limit)
    _check_weight("swiglu_gemm", "w13", x, w13, "2N")
    if w13.shape[0] % 2 != 0:
        raise ValueError(f"swiglu_gemm: w13 rows must be even (interleaved gate/up), got {w13.shape[0]} rows")


def _check_separate_args(x: torch.Tensor, w_gate: torch.Tensor, w_up: torch.Tensor, limit: float) -> None:
    _check_x_and_limit("swiglu_gemm_separate", x, limit)
    _check_weight("swiglu_gemm_separate", "w_gate", x, w_gate, "N")
    _check_weight("swiglu_gemm_separate", "w_up", x, w_up, "N")
    if w_gate.shape != w_up.shape:
        raise ValueError(
            f"swiglu_gemm_separate: w_gate {tuple(w_gate.shape)} and w_up {tuple(w_up.shape)} differ"
        )


def _run(x: torch.Tensor, w_gate: torch.Tensor, w_up: torch.Tensor, limit: float) -> torch.Tensor:
    if not x.is_cuda:
        return swiglu_gemm_reference_separate(x, w_gate, w_up, limit)
    # Imported here so the CPU path works where triton is not installed.
    from .kernel import swiglu_gemm_triton

    if w_gate.stride(1) != w_up.stride(1):  # the kernel shares one K stride between the two
        w_gate, w_up = w_gate.contiguous(), w_up.contiguous()
    out = swiglu_gemm_triton(x.reshape(-1, x.shape[-1]), w_gate, w_up, limit)
    return out.reshape(*x.shape[:-1], w_gate.shape[0])


def _swiglu_gemm(x: torch.Tensor, w13: torch.Tensor, limit: float) -> torch.Tensor:
    check_swiglu_gemm_args(x, w13, limit)
    return _run(x, *deinterleave_gate_up(w13), limit)


def _swiglu_gemm_fake(x: torch.Tensor, w13: torch.Tensor, limit: float) -> torch.Tensor:
    check_swiglu_gemm_args(x, w13, limit)
    return x.new_empty((*x.shape[:-1], w13.shape[0] // 2))


def _swiglu_gemm_separate(x: torch.Tensor, w_gate: torch.Tensor, w_up: torch.Tensor, limit: float) -> torch.Tensor:
    _check_separate_args(x, w_gate, w_up, limit)
    return _run(x, w_gate, w_up, limit)


def _swiglu_gemm_separate_fake(x: torch.Tensor, w_gate: torch.Tensor, w_up: torch.Tensor, limit: float) -> torch.Tensor:
    _check_separate_args(x, w_gate, w_up, limit)
    return x.new_empty((*x.shape[:-1], w_gate.shape[0]))


swiglu_gemm = register_op("swiglu_gemm", _swiglu_gemm, _swiglu_gemm_fake)
swiglu_gemm_separate = register_op("swiglu_gemm_separate", _swiglu_gemm_separate, _swiglu_gemm_separate_fake)
