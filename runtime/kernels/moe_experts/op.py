"""The fused MoE experts as an opaque custom op.

``torch.ops.lingc.moe_experts(Tensor x, Tensor topk_ids, Tensor topk_weights, Tensor w_gate,
Tensor w_up, Tensor w_down, Tensor? shared_gate, Tensor? shared_up, Tensor? shared_down,
float limit, float shared_limit, Tensor? shared_sigmoid=None) -> Tensor``

- x [T, H] bf16, fp16 or fp32 (any strides); topk_ids int32 [T, k] (lingc::moe_router's ids,
  each in [0, E): not checked, that would need a host sync); topk_weights fp32 [T, k].
- w_gate, w_up [E, I, H] and w_down [E, H, I] of x's dtype, unit stride along their last dim and
  any other strides: views such as ``w13[:, :I]`` / ``w13[:, I:]`` of a stacked [E, 2I, H]
  weight, or ``w13[:, 0::2]`` / ``w13[:, 1::2]`` of an interleaved one, are read in place (expert
  weights are never copied or re-laid).
- shared_gate, shared_up [Is, H] and shared_down [H, Is]: the optional shared expert (all three
  or none), with its own intermediate size and clamp; added unscaled (see shared_sigmoid).
- limit / shared_limit: SwiGLU clamp, 0 = none.
- shared_sigmoid [1, H] of x's dtype (needs the shared expert): a gated shared expert, its
  output scaled by ``sigmoid(x[t] . shared_sigmoid)`` (Qwen3-Next's ``shared_expert_gate``), the
  dot product and the sigmoid in fp32.

Returns out [T, H] in x.dtype: ``sum_j topk_weights[t, j] * expert_j(x[t]) + shared(x[t])``
summed in fp32 in slot order (shared last) and rounded once. **Declared numerics**: the eager
``lingc.models.moe.MoE`` rounds every expert output and the shared output to x.dtype before
adding them, so in bf16 this op is not bit-equal to it (fp32: equal up to summation order). The
SwiGLU activation is rounded to x.dtype before the down projection, as in eager.

CPU: naive.py's per-token reference (batch-invariant). CUDA: moe_align + two Triton launches
(kernel.py), PDL-chained on Hopper. A ``custom_op`` for the reason given in gemm/op.py: an opaque
op keeps our own PDL launch.
"""
import math

import torch

from lingc.runtime.registry import register_op

from .naive import moe_experts_reference

__all__ = ["moe_experts", "check_moe_experts_args"]

_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def _unit_last_stride(w: torch.Tensor) -> bool:
    return w.shape[-1] <= 1 or w.stride(-1) == 1


def check_moe_experts_args(x, topk_ids, topk_weights, w_gate, w_up, w_down, shared_gate, shared_up, shared_down,
                           limit, shared_limit, shared_sigmoid=None) -> None:
    """Raise ValueError naming the bad argument of ``moe_experts``."""
    op = "moe_experts"
    if x.dim() != 2:
        raise ValueError(f"{op}: x must be [T, H] (2-d), got shape {tuple(x.shape)}")
    if x.dtype not in _DTYPES:
        raise ValueError(f"{op}: x.dtype must be bfloat16, float16 or float32, got {x.dtype}")
    t, h = x.shape
    if h < 1:
        raise ValueError(f"{op}: x must have H >= 1 columns, got shape {tuple(x.shape)}")
    if topk_ids.dim() != 2 or topk_ids.shape[0] != t or topk_ids.shape[1] < 1:
        raise ValueError(f"{op}: topk_ids must be [T={t}, k] with k >= 1, got shape {tuple(topk_ids.shape)}")
    if topk_ids.dtype != torch.int32:
        raise ValueError(f"{op}: topk_ids.dtype must be int32 (what lingc::moe_router returns), got "
                         f"{topk_ids.dtype}; convert with topk_ids.int()")
    if tuple(topk_weights.shape) != tuple(topk_ids.shape):
        raise ValueError(f"{op}: topk_weights must have topk_ids' shape {tuple(topk_ids.shape)}, got "
                         f"{tuple(topk_weights.shape)}")
    if topk_weights.dtype != torch.float32:
        raise ValueError(f"{op}: topk_weights.dtype must be float32, got {topk_weights.dtype}")
    if w_gate.dim() != 3:
        raise ValueError(f"{op}: w_gate must be [E, I, H] (3-d), got shape {tuple(w_gate.shape)}")
    e, i, hw = w_gate.shape
    if e < 1 or i < 1:
        raise ValueError(f"{op}: w_gate must have E >= 1 experts and I >= 1 rows, got shape {tuple(w_gate.shape)}")
    if hw != h:
        raise ValueError(f"{op}: H mismatch, x has H={h} but w_gate has H={hw}")
    if tuple(w_up.shape) != (e, i, h):
        raise ValueError(f"{op}: w_up must have w_gate's shape {(e, i, h)}, got {tuple(w_up.shape)}")
    if tuple(w_down.shape) != (e, h, i):
        raise ValueError(f"{op}: w_down must be [E, H, I] = {(e, h, i)}, got {tuple(w_down.shape)}")
    given = [s is not None for s in (shared_gate, shared_up, shared_down)]
    if any(given) and not all(given):
        raise ValueError(f"{op}: shared_gate, shared_up and shared_down must be given together or all be None, "
                         f"got {'/'.join('tensor' if g else 'None' for g in given)}")
    weights = [("w_gate", w_gate, "H"), ("w_up", w_up, "H"), ("w_down", w_down, "I")]
    if all(given):
        if shared_gate.dim() != 2 or shared_gate.shape[0] < 1 or shared_gate.shape[1] != h:
            raise ValueError(f"{op}: shared_gate must be [Is, H={h}] with Is >= 1, got shape "
                             f"{tuple(shared_gate.shape)}")
        i_s = shared_gate.shape[0]
        if tuple(shared_up.shape) != (i_s, h):
            raise ValueError(f"{op}: shared_up must have shared_gate's shape {(i_s, h)}, got {tuple(shared_up.shape)}")
        if tuple(shared_down.shape) != (h, i_s):
            raise ValueError(f"{op}: shared_down must be [H, Is] = {(h, i_s)}, got {tuple(shared_down.shape)}")
        weights += [("shared_gate", shared_gate, "H"), ("shared_up", shared_up, "H"),
                    ("shared_down", shared_down, "Is")]
    if shared_sigmoid is not None:
        if not all(given):
            raise ValueError(f"{op}: shared_sigmoid scales the shared expert, but no shared expert was given "
                             f"(shared_gate, shared_up, shared_down are None)")
        if tuple(shared_sigmoid.shape) != (1, h):
            raise ValueError(f"{op}: shared_sigmoid must be [1, H={h}] (a Linear(H, 1) weight), got shape "
                             f"{tuple(shared_sigmoid.shape)}")
        weights.append(("shared_sigmoid", shared_sigmoid, "H"))
    for name, w, last in weights:
        if w.dtype != x.dtype:
            raise ValueError(f"{op}: dtype mismatch, x is {x.dtype} but {name} is {w.dtype}")
        if not _unit_last_stride(w):
            raise ValueError(f"{op}: {name} must have unit stride along {last} (its last dim), got strides "
                             f"{tuple(w.stride())}; pass a view of a weight stored that way (it is never copied)")
    for name, tensor in [("topk_ids", topk_ids), ("topk_weights", topk_weights)] + [(n, w) for n, w, _ in weights]:
        if tensor.device != x.device:
            raise ValueError(f"{op}: device mismatch, x on {x.device} but {name} on {tensor.device}")
    for name, value in (("limit", limit), ("shared_limit", shared_limit)):
        if not (math.isfinite(value) and value >= 0):
            raise ValueError(f"{op}: {name} must be a finite number >= 0 (0 = no clamp), got {value}")


def _moe_experts(x, topk_ids, topk_weights, w_gate, w_up, w_down, shared_gate, shared_up, shared_down,
                 limit, shared_limit, shared_sigmoid=None):
    args = (x, topk_ids, topk_weights, w_gate, w_up, w_down, shared_gate, shared_up, shared_down, limit, shared_limit)
    check_moe_experts_args(*args, shared_sigmoid)
    if not x.is_cuda:
        return moe_experts_reference(*args, shared_sigmoid)
    # Imported here so the CPU path needs no triton.
    from .kernel import moe_experts_triton

    return moe_experts_triton(*args, shared_sigmoid=shared_sigmoid)


def _moe_experts_fake(x, topk_ids, topk_weights, w_gate, w_up, w_down, shared_gate, shared_up, shared_down,
                      limit, shared_limit, shared_sigmoid=None):
    check_moe_experts_args(x, topk_ids, topk_weights, w_gate, w_up, w_down, shared_gate, shared_up, shared_down,
                           limit, shared_limit, shared_sigmoid)
    return x.new_empty(x.shape)


_SCHEMA = ("(Tensor x, Tensor topk_ids, Tensor topk_weights, Tensor w_gate, Tensor w_up, Tensor w_down, "
           "Tensor? shared_gate, Tensor? shared_up, Tensor? shared_down, float limit, float shared_limit, "
           "Tensor? shared_sigmoid=None) -> Tensor")


moe_experts = register_op("moe_experts", _moe_experts, _moe_experts_fake, schema=_SCHEMA)
