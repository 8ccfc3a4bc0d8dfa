"""The decode GEMM and the GEMM + argmax as opaque custom ops.

- ``torch.ops.lingc.gemm(Tensor x, Tensor[] weights, Tensor? bias=None, Tensor? residual=None,
  Tensor? sigmoid_mul=None) -> Tensor``: x [M, K] times 1..8 weights [N_i, K] read in place
  (fused same-input projections: one launch, no concatenated copy), out [M, sum N_i] in x.dtype
  with the optional epilogues (naive.py gives the exact math).
- ``torch.ops.lingc.gemm_rows_into(Tensor x, Tensor[] weights, Tensor? bias, Tensor? residual,
  Tensor? sigmoid_mul, Tensor(a!) out, int row) -> ()``: ``out[row:row + M] = gemm(...)`` written
  by the GEMM itself, out [R, sum N_i] of x.dtype or float32 (then the values rounded to x.dtype,
  stored as fp32: what ``.float()`` of gemm's value holds). pdl_glue emits it where a graph copies
  a GEMM's rows into a relay buffer (the draft's logits of sampled drafts); step functions do not
  call it.
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

from .naive import gemm_argmax_reference, gemm_reference

__all__ = ["MAX_WEIGHTS", "gemm", "gemm_rows_into", "gemm_argmax", "check_gemm_args", "check_gemm_argmax_args",
           "check_rows_into"]

# Weight pointers one launch takes (KDA q/k/v/f/g/b is 6; larger groups are split by the pass).
MAX_WEIGHTS = 8
DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def _check_x(op: str, x: torch.Tensor) -> None:
    if x.dim() != 2:
        raise ValueError(f"{op}: x must be [M, K] (2-d), got shape {tuple(x.shape)}")
    if x.dtype not in DTYPES:
        raise ValueError(f"{op}: x.dtype must be bfloat16, float16 or float32, got {x.dtype}")


def _check_weight(op: str, name: str, x: torch.Tensor, w: torch.Tensor) -> None:
    if w.dim() != 2:
        raise ValueError(f"{op}: {name} must be [N, K], got shape {tuple(w.shape)}")
    if w.shape[1] != x.shape[1]:
        raise ValueError(f"{op}: K mismatch, x has K={x.shape[1]} but {name} has K={w.shape[1]}")
    if w.dtype != x.dtype:
        raise ValueError(f"{op}: dtype mismatch, x is {x.dtype} but {name} is {w.dtype}")
    if w.device != x.device:
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


def check_rows_into(x, weights, out, row) -> None:
    """Raise ValueError naming what of ``gemm_rows_into``'s out and row is bad."""
    n = sum(w.shape[0] for w in weights)
    if out.dim() != 2 or out.shape[1] != n:
        raise ValueError(f"gemm_rows_into: out must be [R, {n}] (the weights' {n} columns), got {tuple(out.shape)}")
    if out.dtype not in (x.dtype, torch.float32):
        raise ValueError(f"gemm_rows_into: out.dtype must be {x.dtype} (x's) or float32, got {out.dtype}")
    if out.device != x.device:
        raise ValueError(f"gemm_rows_into: device mismatch, x on {x.device} but out on {out.device}")
    if not 0 <= row <= out.shape[0] - x.shape[0]:
        raise ValueError(f"gemm_rows_into: rows {row}..{row + x.shape[0] - 1} of out are outside its "
                         f"{out.shape[0]} rows")


def _gemm_rows_into(x, weights, bias, residual, sigmoid_mul, out, row):
    check_gemm_args(x, weights, bias, residual, sigmoid_mul)
    check_rows_into(x, weights, out, row)
    rows = out[row:row + x.shape[0]]
    if not x.is_cuda:
        rows.copy_(gemm_reference(x, weights, bias, residual, sigmoid_mul))
        return
    from .kernel import gemm_triton

    gemm_triton(x, weights, bias, residual, sigmoid_mul, out=rows)


def _gemm_rows_into_fake(x, weights, bias, residual, sigmoid_mul, out, row):
    check_gemm_args(x, weights, bias, residual, sigmoid_mul)
    check_rows_into(x, weights, out, row)


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
    "gemm_rows_into": "(Tensor x, Tensor[] weights, Tensor? bias, Tensor? residual, Tensor? sigmoid_mul, "
    "Tensor(a!) out, int row) -> ()",
    "gemm_argmax": "(Tensor x, Tensor w) -> (Tensor, Tensor)",
}


gemm = register_op("gemm", _gemm, _gemm_fake, schema=_SCHEMAS["gemm"])
gemm_argmax = register_op("gemm_argmax", _gemm_argmax, _gemm_argmax_fake, schema=_SCHEMAS["gemm_argmax"])
gemm_rows_into = register_op("gemm_rows_into", _gemm_rows_into, _gemm_rows_into_fake, mutates_args=("out",),
                             schema=_SCHEMAS["gemm_rows_into"])
