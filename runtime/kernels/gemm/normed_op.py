"""The decode GEMM of a row whose RMSNorm was started by its producer, as an opaque custom op.

``torch.ops.lingc.gemm_normed(Tensor x, Tensor[] weights, Tensor ss, float eps, Tensor? bias=None,
Tensor? residual=None, Tensor? sigmoid_mul=None) -> Tensor``

x [M, K] is h * norm_weight (rounded once) and ss [NT, M] fp32 each row's sum of h^2 in NT
parts (``lingc::moe_experts_norm`` writes both); the result is ``lingc::gemm``'s with each row's
fp32 product scaled by rsqrt(sum_i ss[i] / K + eps) before the epilogue, i.e. the projection of
RMSNorm(h) * norm_weight with the scale applied after the sum instead of before it
(naive.gemm_normed_reference; declared numerics in norm_fold.md). CPU: the reference; CUDA: the
gemm kernel (designs A and B) with the scale in its epilogue.
"""
import torch

from lingc.runtime.registry import register_op

from .naive import gemm_normed_reference
from .op import check_gemm_args

__all__ = ["gemm_normed", "check_ss"]


def check_ss(x: torch.Tensor, ss: torch.Tensor, eps: float) -> None:
    """Raise ValueError naming what of ``gemm_normed``'s ss and eps is bad."""
    if ss.dim() != 2 or ss.shape[1] != x.shape[0] or ss.shape[0] < 1:
        raise ValueError(f"gemm_normed: ss must be [NT >= 1, M={x.shape[0]}] (each row's sum of squares in NT "
                         f"parts), got shape {tuple(ss.shape)}")
    if ss.dtype != torch.float32:
        raise ValueError(f"gemm_normed: ss.dtype must be float32, got {ss.dtype}")
    if ss.device != x.device:
        raise ValueError(f"gemm_normed: device mismatch, x on {x.device} but ss on {ss.device}")
    if not eps >= 0:
        raise ValueError(f"gemm_normed: eps must be >= 0, got {eps}")


def _gemm_normed(x, weights, ss, eps, bias=None, residual=None, sigmoid_mul=None):
    check_gemm_args(x, weights, bias, residual, sigmoid_mul)
    check_ss(x, ss, eps)
    if not x.is_cuda:
        return gemm_normed_reference(x, weights, ss, eps, bias, residual, sigmoid_mul)
    from .kernel import gemm_triton

    # The table's config (designs A and B: the scale lives in their epilogue), as lingc::gemm's.
    return gemm_triton(x, weights, bias, residual, sigmoid_mul, row_sumsq=ss.contiguous(), row_eps=eps)


def _gemm_normed_fake(x, weights, ss, eps, bias=None, residual=None, sigmoid_mul=None):
    check_gemm_args(x, weights, bias, residual, sigmoid_mul)
    check_ss(x, ss, eps)
    return x.new_empty((x.shape[0], sum(w.shape[0] for w in weights)))


_SCHEMA = ("(Tensor x, Tensor[] weights, Tensor ss, float eps, Tensor? bias=None, Tensor? residual=None, "
           "Tensor? sigmoid_mul=None) -> Tensor")

gemm_normed = register_op("gemm_normed", _gemm_normed, _gemm_normed_fake, schema=_SCHEMA)
