"""The Ling-3 MoE router as an opaque custom op.

``torch.ops.lingc.moe_router(Tensor x, Tensor gate_w, Tensor? expert_bias, int n_group,
int topk_group, int top_k, float routed_scaling, bool renormalize) -> (Tensor, Tensor)``:
x [T, H] (bf16 or fp32), gate_w [E, H] of x's dtype (unit stride along H, any row stride),
expert_bias fp32 [E] or None (no bias: the kernels read a persistent zero bias); returns
(topk_ids int32 [T, top_k], topk_weights fp32 [T, top_k]).
naive.py gives the exact math and the tie rule (lowest index wins). ``softmax=True`` (a trailing
``bool softmax=False`` in the schema): a softmax router instead (Qwen's MoE blocks: the top_k by
logit, softmax probabilities as weights; one group, the bias unused; naive.softmax_topk_reference).
``zero_fill=True`` (a trailing ``bool zero_fill=False``): the dropped groups' experts compete with
the biased score 0.0 instead of being excluded (DeepSeek-V3's and Kimi's Hugging Face routers,
``masked_fill(~group_mask, 0.0)``; naive.grouped_topk_reference); not with ``softmax``.

The fused_moe pass emits it, so it must trace (fake impl), run on the CPU (the reference) and
on CUDA (the two Triton kernels, PDL-launched on Hopper). A ``custom_op`` rather than a
``triton_op`` for the reason given in gemm/op.py: an opaque op keeps our own PDL launch.

``torch.ops.lingc.rmsnorm_router(Tensor x, Tensor norm_weight, Tensor? residual, float eps,
Tensor gate_w, Tensor? expert_bias, int n_group, int topk_group, int top_k, float routed_scaling,
bool renormalize, bool round_before_weight=False, bool zero_fill=False) -> (Tensor y, Tensor h,
Tensor ids, Tensor weights)``: ``lingc.rmsnorm`` (the residual add and the MoE block's input norm: y, h) followed by
the router, as one op. On CUDA
the router's logits kernel does the norm on the rows it already holds for the matvec and writes
y and h (kernel.py), so the norm is not a launch of its own. Declared numerics: the logits are
those of the fp32 normed row (the norm's scale applied after the gate products), not of y
rounded to x.dtype (naive.rmsnorm_router_reference, the CPU path). With ``round_before_weight``
(the Hugging Face Llama form, rmsnorm's flag) y is that form and the logits are y's as rounded:
the same selection as the unfused ``rmsnorm`` + ``moe_router``. pdl_norm_folds.norms_into_routers
emits it.

``torch.ops.lingc.moe_select(Tensor logits, Tensor expert_bias, int n_group, int topk_group,
int top_k, float routed_scaling, bool renormalize, bool zero_fill=False) -> (Tensor, Tensor)``: the router's selection
alone on given fp32 logits [T, E]: ``grouped_topk_reference(sigmoid(logits), ...)`` on the CPU,
the selection kernel (one one-warp CTA a row) on CUDA. For prompt chunks (the eager MoE's
grouped form), whose logits a library GEMM computes: thousands of rows, where torch.topk's three
calls a chunk took 84 us each (H200, session 38).
"""
import torch

from lingc.runtime.registry import register_op

from .naive import grouped_topk_reference, moe_router_reference, rmsnorm_router_reference

__all__ = ["moe_router", "moe_select", "rmsnorm_router", "check_moe_router_args", "check_moe_select_args",
           "check_rmsnorm_router_args"]

DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def check_moe_router_args(x, gate_w, expert_bias, n_group, topk_group, top_k, routed_scaling, renormalize,
                          softmax=False, zero_fill=False) -> None:
    """Raise ValueError naming the bad argument of ``moe_router``."""
    op = "moe_router"
    _check_gate(op, x, gate_w)
    _check_selection(op, x, gate_w.shape[0], expert_bias, n_group, topk_group, top_k)
    if softmax and (n_group, topk_group) != (1, 1):
        raise ValueError(f"{op}: a softmax router has one group: n_group = topk_group = 1, got "
                         f"n_group={n_group}, topk_group={topk_group}")
    if softmax and zero_fill:
        raise ValueError(f"{op}: zero_fill is a fill of the dropped groups of the sigmoid grouped top-k; a "
                         f"softmax router drops no group: pass zero_fill=False")


def _check_gate(op, x, gate_w) -> None:
    if x.dim() != 2:
        raise ValueError(f"{op}: x must be [T, H] (2-d), got shape {tuple(x.shape)}")
    if x.dtype not in DTYPES:
        raise ValueError(f"{op}: x.dtype must be bfloat16, float16 or float32, got {x.dtype}")
    if gate_w.dim() != 2:
        raise ValueError(f"{op}: gate_w must be [E, H] (2-d), got shape {tuple(gate_w.shape)}")
    e, h = gate_w.shape
    if h != x.shape[1]:
        raise ValueError(f"{op}: H mismatch, x has H={x.shape[1]} but gate_w has H={h}")
    if gate_w.dtype != x.dtype:
        raise ValueError(f"{op}: dtype mismatch, x is {x.dtype} but gate_w is {gate_w.dtype}")
    if h > 1 and gate_w.stride(1) != 1:
        raise ValueError(f"{op}: gate_w must have unit stride along H, got strides {tuple(gate_w.stride())}")
    if gate_w.device != x.device:
        raise ValueError(f"{op}: device mismatch, x on {x.device} but gate_w on {gate_w.device}")


def _check_selection(op, x, e, expert_bias, n_group, topk_group, top_k, x_name="x") -> None:
    """The checks of the selection's arguments; x (named x_name) is the input whose device the
    others share. expert_bias None: no bias (moe_router, rmsnorm_router)."""
    if expert_bias is not None:
        if tuple(expert_bias.shape) != (e,):
            raise ValueError(f"{op}: expert_bias must have shape ({e},), got {tuple(expert_bias.shape)}")
        if expert_bias.dtype not in (torch.float32, torch.bfloat16, torch.float16):
            raise ValueError(f"{op}: expert_bias.dtype must be float32 (or bfloat16 / float16, read as fp32), "
                             f"got {expert_bias.dtype}")
        if expert_bias.device != x.device:
            raise ValueError(f"{op}: device mismatch, {x_name} on {x.device} but expert_bias on {expert_bias.device}")
    if n_group < 1 or e % n_group != 0:
        raise ValueError(f"{op}: n_group={n_group} must be >= 1 and divide the expert count E={e}")
    if e // n_group < 2:
        raise ValueError(f"{op}: groups need at least 2 experts (the group score is a top-2 sum), "
                         f"got E={e} / n_group={n_group} = {e // n_group}")
    if not 1 <= topk_group <= n_group:
        raise ValueError(f"{op}: topk_group={topk_group} must be in [1, n_group={n_group}]")
    if not 1 <= top_k <= topk_group * (e // n_group):
        raise ValueError(f"{op}: top_k={top_k} must be in [1, topk_group * E / n_group = "
                         f"{topk_group * (e // n_group)}]")


def _zero_bias(expert_bias, gate_w):
    """expert_bias, or for None the device's zero bias of E entries: one persistent read-only
    buffer per size (a fill kernel once, not one a step as a zeros() in the graph would be)."""
    if expert_bias is not None:
        return expert_bias
    from lingc.runtime.kernels.gemm_common import persistent_buffer

    e = gate_w.shape[0]
    return persistent_buffer(f"zero_expert_bias_{e}", gate_w.device, e, torch.float32, 0)


def _moe_router(x, gate_w, expert_bias, n_group, topk_group, top_k, routed_scaling, renormalize, softmax=False,
                zero_fill=False):
    check_moe_router_args(x, gate_w, expert_bias, n_group, topk_group, top_k, routed_scaling, renormalize, softmax,
                          zero_fill)
    expert_bias = _zero_bias(expert_bias, gate_w)
    if not x.is_cuda:
        return moe_router_reference(x, gate_w, expert_bias, n_group, topk_group, top_k, routed_scaling, renormalize,
                                    softmax, zero_fill)
    # Imported here so the CPU path needs no triton.
    from .kernel import moe_router_triton

    return moe_router_triton(x, gate_w, expert_bias, n_group, topk_group, top_k, routed_scaling, renormalize,
                             softmax=softmax, zero_fill=zero_fill)


def _moe_router_fake(x, gate_w, expert_bias, n_group, topk_group, top_k, routed_scaling, renormalize, softmax=False,
                     zero_fill=False):
    check_moe_router_args(x, gate_w, expert_bias, n_group, topk_group, top_k, routed_scaling, renormalize, softmax,
                          zero_fill)
    t = x.shape[0]
    return x.new_empty((t, top_k), dtype=torch.int32), x.new_empty((t, top_k), dtype=torch.float32)


_SCHEMA = ("(Tensor x, Tensor gate_w, Tensor? expert_bias, int n_group, int topk_group, int top_k, "
           "float routed_scaling, bool renormalize, bool softmax=False, bool zero_fill=False) -> (Tensor, Tensor)")


moe_router = register_op("moe_router", _moe_router, _moe_router_fake, schema=_SCHEMA)


def check_moe_select_args(logits, expert_bias, n_group, topk_group, top_k, routed_scaling, renormalize,
                          zero_fill=False) -> None:
    """Raise ValueError naming the bad argument of ``moe_select``."""
    op = "moe_select"
    if logits.dim() != 2:
        raise ValueError(f"{op}: logits must be [T, E] (2-d), got shape {tuple(logits.shape)}")
    if logits.dtype != torch.float32:
        raise ValueError(f"{op}: logits.dtype must be float32 (the gate's fp32 accumulator or its "
                         f"bf16 rounding upcast), got {logits.dtype}")
    if logits.shape[1] > 1 and logits.stride(1) != 1:
        raise ValueError(f"{op}: logits must have unit stride along E, got strides {tuple(logits.stride())}")
    _check_selection(op, logits, logits.shape[1], expert_bias, n_group, topk_group, top_k, "logits")


def _moe_select(logits, expert_bias, n_group, topk_group, top_k, routed_scaling, renormalize, zero_fill=False):
    check_moe_select_args(logits, expert_bias, n_group, topk_group, top_k, routed_scaling, renormalize)
    if not logits.is_cuda:
        return grouped_topk_reference(torch.sigmoid(logits), expert_bias, n_group, topk_group, top_k,
                                      routed_scaling, renormalize, zero_fill)
    from .kernel import moe_select_triton

    return moe_select_triton(logits, expert_bias, n_group, topk_group, top_k, routed_scaling, renormalize,
                             zero_fill=zero_fill)


def _moe_select_fake(logits, expert_bias, n_group, topk_group, top_k, routed_scaling, renormalize, zero_fill=False):
    check_moe_select_args(logits, expert_bias, n_group, topk_group, top_k, routed_scaling, renormalize)
    t = logits.shape[0]
    return logits.new_empty((t, top_k), dtype=torch.int32), logits.new_empty((t, top_k), dtype=torch.float32)


moe_select = register_op(
    "moe_select", _moe_select, _moe_select_fake,
    schema=("(Tensor logits, Tensor expert_bias, int n_group, int topk_group, int top_k, float routed_scaling, "
            "bool renormalize, bool zero_fill=False) -> (Tensor, Tensor)"))


def check_rmsnorm_router_args(x, norm_weight, residual, eps, gate_w, expert_bias, n_group, topk_group, top_k,
                              routed_scaling, renormalize, round_before_weight=False, zero_fill=False) -> None:
    """Raise ValueError naming the bad argument of ``rmsnorm_router`` (the norm's checks, then
    the router's, each message prefixed with the op's name)."""
    from lingc.runtime.kernels.norms.op import check_rmsnorm_args

    try:
        check_rmsnorm_args(x, norm_weight, residual, eps, round_before_weight)
        check_moe_router_args(x, gate_w, expert_bias, n_group, topk_group, top_k, routed_scaling, renormalize,
                              zero_fill=zero_fill)
    except ValueError as err:
        raise ValueError(f"rmsnorm_router: {err}") from None


def _rmsnorm_router(x, norm_weight, residual, eps, gate_w, expert_bias, n_group, topk_group, top_k,
                    routed_scaling, renormalize, round_before_weight=False, zero_fill=False):
    args = (x, norm_weight, residual, eps, gate_w, expert_bias, n_group, topk_group, top_k, routed_scaling,
            renormalize, round_before_weight, zero_fill)
    check_rmsnorm_router_args(*args)
    args = args[:5] + (_zero_bias(expert_bias, gate_w),) + args[6:]
    if not x.is_cuda:
        return rmsnorm_router_reference(*args)
    from .kernel import rmsnorm_router_triton

    return rmsnorm_router_triton(*args)


def _rmsnorm_router_fake(x, norm_weight, residual, eps, gate_w, expert_bias, n_group, topk_group, top_k,
                         routed_scaling, renormalize, round_before_weight=False, zero_fill=False):
    check_rmsnorm_router_args(x, norm_weight, residual, eps, gate_w, expert_bias, n_group, topk_group, top_k,
                              routed_scaling, renormalize, round_before_weight, zero_fill)
    t = x.shape[0]
    return (torch.empty_like(x, memory_format=torch.contiguous_format),
            torch.empty_like(x, memory_format=torch.contiguous_format),
            x.new_empty((t, top_k), dtype=torch.int32), x.new_empty((t, top_k), dtype=torch.float32))


rmsnorm_router = register_op(
    "rmsnorm_router", _rmsnorm_router, _rmsnorm_router_fake,
    schema=("(Tensor x, Tensor norm_weight, Tensor? residual, float eps, Tensor gate_w, Tensor? expert_bias, "
            "int n_group, int topk_group, int top_k, float routed_scaling, bool renormalize, "
            "bool round_before_weight=False, bool zero_fill=False) -> (Tensor, Tensor, Tensor, Tensor)"))
