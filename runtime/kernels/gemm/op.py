"""The decode GEMM and the GEMM + argmax as opaque custom ops.

- ``torch.ops.lingc.gemm(Tensor x, Tensor[] weights, Tensor? bias=None, Tensor? residual=None,
  Tensor? sigmoid_mul=None) -> Tensor``: x [M, K] times 1..8 weights [N_i, K] read in place
  (fused same-input projections: one launch, no concatenated copy), out [M, sum N_i] in x.dtype
  with the optional epilogues (naive.py gives the exact math).
- ``torch.ops.lingc.gemm_head_norm(Tensor o, Tensor gate, Tensor norm_weight, float eps,
  Tensor[] weights) -> Tensor``: KDA's gated head norm (norms' gated_head_rmsnorm, rounded to
  the weights' dtype) and the o_proj after it as ONE launch: the GEMM normalises each tile of o
  in its prologue, so the norm's kernel and its round trip through memory leave the chain. o and
  gate are [T, H, V]; out [T, sum N_i]. A launch config whose K tiles do not hold whole heads
  (``kernel.head_norm_fusable``) runs the two kernels instead, with the same result.
- ``torch.ops.lingc.gemm_argmax(Tensor x, Tensor w) -> (Tensor, Tensor)``: (ids int64 [M],
  max_logit fp32 [M]) of x @ w.T rounded to x.dtype, ties to the lowest index as
  torch.argmax; the logits are never written.

The fuse_projections pass emits these, so they must trace (fake impls), run on the CPU (the
references, batch-invariant like the kernels) and on CUDA (the Triton kernels, PDL-launched on
Hopper). They are ``torch.library.custom_op``s rather than ``triton_op``s on purpose: Inductor
re-launches traced user Triton kernels without the PDL attribute, while an opaque op keeps our
own launch (same reasoning as swiglu_gemm/op.py).
"""
import torch

from lingc.runtime.registry import register_op

from .naive import gemm_argmax_reference, gemm_head_norm_reference, gemm_reference

__all__ = ["MAX_WEIGHTS", "gemm", "gemm_argmax", "gemm_head_norm", "check_gemm_args", "check_gemm_argmax_args",
           "check_gemm_head_norm_args"]

# Weight pointers one launch takes (KDA q/k/v/f/g/b is 6; larger groups are split by the pass).
MAX_WEIGHTS = 8
_DTYPES = (torch.bfloat16, torch.float32)


def _check_x(op: str, x: torch.Tensor) -> None:
    if x.dim() != 2:
        raise ValueError(f"{op}: x must be [M, K] (2-d), got shape {tuple(x.shape)}")
    if x.dtype not in _DTYPES:
        raise ValueError(f"{op}: x.dtype must be bfloat16 or float32, got {x.dtype}")


def _check_weight(op: str, name: str, x: torch.Tensor, w: torch.Tensor, check_device: bool = True) -> None:
    if w.dim() != 2:
        raise ValueError(f"{op}: {name} must be [N, K], got shape {tuple(w.shape)}")
    if w.shape[1] != x.shape[1]:
        raise ValueError(f"{op}: K mismatch, x has K={x.shape[1]} but {name} has K={w.shape[1]}")
    if w.dtype != x.dtype:
        raise ValueError(f"{op}: dtype mismatch, x is {x.dtype} but {name} is {w.dtype}")
    if check_device and w.device != x.device:
        raise ValueError(f"{op}: device mismatch, x on {x.device} but {name} on {w.device}")
    if w.shape[1] > 1 and w.stride(1) != 1:
        raise ValueError(
            f"{op}: {name} must have unit stride along K (any row stride), got strides {tuple(w.stride())}"
        )


def _check_operand(name: str, t: torch.Tensor, x: torch.Tensor, shape: tuple[int, ...]) -> None:
    if tuple(t.shape) != shape:
        raise ValueError(f"gemm: {name} must have shape {shape}, got {tuple(t.shape)}")
    if t.dtype not in (x.dtype, torch.float32):
        raise ValueError(f"gemm: {name}.dtype must be {x.dtype} (x's) or float32, got {t.dtype}")
    if t.device != x.device:
        raise ValueError(f"gemm: device mismatch, x on {x.device} but {name} on {t.device}")


def check_gemm_args(x, weights, bias=None, residual=None, sigmoid_mul=None) -> None:
    """Raise ValueError naming the bad argument of ``gemm``."""
    _check_x("gemm", x)
    if not 1 <= len(weights) <= MAX_WEIGHTS:
        raise ValueError(f"gemm: weights must hold 1 to {MAX_WEIGHTS} tensors, got {len(weights)}")
    for i, w in enumerate(weights):
        _check_weight("gemm", f"weights[{i}]", x, w)
    n = sum(w.shape[0] for w in weights)
    if bias is not None:
        _check_operand("bias", bias, x, (n,))
    if residual is not None:
        _check_operand("residual", residual, x, (x.shape[0], n))
    if sigmoid_mul is not None:
        _check_operand("sigmoid_mul", sigmoid_mul, x, (x.shape[0], n))


def check_gemm_head_norm_args(o, gate, norm_weight, eps, weights) -> None:
    """Raise ValueError naming the bad argument of ``gemm_head_norm``."""
    from lingc.runtime.kernels.norms.op import check_gated_head_rmsnorm_args

    if not 1 <= len(weights) <= MAX_WEIGHTS:
        raise ValueError(f"gemm_head_norm: weights must hold 1 to {MAX_WEIGHTS} tensors, got {len(weights)}")
    check_gated_head_rmsnorm_args(o, gate, norm_weight, eps, weights[0].dtype, op="gemm_head_norm")
    if weights[0].dtype not in _DTYPES:
        raise ValueError(f"gemm_head_norm: weights[0].dtype must be bfloat16 or float32, got {weights[0].dtype}")
    # The GEMM reads the normalised o as x [T, H*V] in the weights' dtype, on o's device.
    x = o.new_empty((o.shape[0], o.shape[1] * o.shape[2]), dtype=weights[0].dtype, device="meta")
    for i, w in enumerate(weights):
        if w.device != o.device:
            raise ValueError(f"gemm_head_norm: device mismatch, o on {o.device} but weights[{i}] on {w.device}")
        _check_weight("gemm_head_norm", f"weights[{i}]", x, w, check_device=False)


def check_gemm_argmax_args(x: torch.Tensor, w: torch.Tensor) -> None:
    """Raise ValueError naming the bad argument of ``gemm_argmax``."""
    _check_x("gemm_argmax", x)
    _check_weight("gemm_argmax", "w", x, w)
    if w.shape[0] < 1:
        raise ValueError(f"gemm_argmax: w must have at least one row (the argmax of nothing), got {tuple(w.shape)}")


def _gemm(x, weights, bias=None, residual=None, sigmoid_mul=None):
    check_gemm_args(x, weights, bias, residual, sigmoid_mul)
    if not x.is_cuda:
        return gemm_reference(x, weights, bias, residual, sigmoid_mul)
    # Imported here so the CPU path needs no triton.
    from .kernel import gemm_triton

    return gemm_triton(x, weights, bias, residual, sigmoid_mul)


def _gemm_fake(x, weights, bias=None, residual=None, sigmoid_mul=None):
    check_gemm_args(x, weights, bias, residual, sigmoid_mul)
    return x.new_empty((x.shape[0], sum(w.shape[0] for w in weights)))


def _gemm_head_norm(o, gate, norm_weight, eps, weights):
    check_gemm_head_norm_args(o, gate, norm_weight, eps, weights)
    if not o.is_cuda:
        return gemm_head_norm_reference(o, gate, norm_weight, eps, weights)
    from lingc.runtime.kernels.norms.kernel import gated_head_rmsnorm_triton

    from .kernel import gemm_triton, head_norm_fusable

    t, h, v = o.shape
    n = sum(w.shape[0] for w in weights)
    # The kernel reads o and gate as [T, H*V] with one K stride: H must step V elements.
    flat = all(a.stride(1) == v * a.stride(2) or h == 1 for a in (o, gate))
    if flat and head_norm_fusable(n, h * v, v) is None:
        x, g = (a.as_strided((t, h * v), (a.stride(0), a.stride(2))) for a in (o, gate))
        return gemm_triton(x, weights, head_norm=(g, norm_weight, eps, v))
    y = gated_head_rmsnorm_triton(o, gate, norm_weight, eps, weights[0].dtype)
    return gemm_triton(y.view(t, h * v), weights)


def _gemm_head_norm_fake(o, gate, norm_weight, eps, weights):
    check_gemm_head_norm_args(o, gate, norm_weight, eps, weights)
    return o.new_empty((o.shape[0], sum(w.shape[0] for w in weights)), dtype=weights[0].dtype)


def _gemm_argmax(x, w):
    check_gemm_argmax_args(x, w)
    if not x.is_cuda:
        return gemm_argmax_reference(x, w)
    from .argmax_kernel import gemm_argmax_triton

    return gemm_argmax_triton(x, w)


def _gemm_argmax_fake(x, w):
    check_gemm_argmax_args(x, w)
    m = x.shape[0]
    return x.new_empty(m, dtype=torch.int64), x.new_empty(m, dtype=torch.float32)


_SCHEMAS = {
    "gemm": "(Tensor x, Tensor[] weights, Tensor? bias=None, Tensor? residual=None, "
    "Tensor? sigmoid_mul=None) -> Tensor",
    "gemm_argmax": "(Tensor x, Tensor w) -> (Tensor, Tensor)",
    "gemm_head_norm": "(Tensor o, Tensor gate, Tensor norm_weight, float eps, Tensor[] weights) -> Tensor",
}


gemm = register_op("gemm", _gemm, _gemm_fake, schema=_SCHEMAS["gemm"])
gemm_argmax = register_op("gemm_argmax", _gemm_argmax, _gemm_argmax_fake, schema=_SCHEMAS["gemm_argmax"])
gemm_head_norm = register_op("gemm_head_norm", _gemm_head_norm, _gemm_head_norm_fake,
                             schema=_SCHEMAS["gemm_head_norm"])
