"""The MoE experts with the next RMSNorm's start in their combine, as an opaque custom op.

``torch.ops.lingc.moe_experts_norm(<moe_experts' arguments>, Tensor residual, Tensor norm_weight,
Tensor? shared_sigmoid=None) -> (Tensor hw, Tensor h, Tensor ss)``

With out = moe_experts(...) [T, H]:
- h = residual + out, rounded to x.dtype: the residual stream after the MoE block (what
  ``lingc::rmsnorm(out, norm_weight, residual, eps)`` returns second);
- hw = h * norm_weight in fp32, rounded once to x.dtype;
- ss [NT, T] fp32: each token's sum of h^2 over each of the combine's NT column tiles
  (NT = cdiv(H, block_h) of the launch table, ``norm_tiles``).

``lingc::gemm_normed(hw, weights, ss, eps)`` then gives the projection of the normed row: each
row of hw @ W.T scaled by rsqrt(sum(ss) / H + eps). pdl_swap folds a layer's input norm into
these two ops (passes/pdl_norm_folds.py: no norm launch, no norm kernel between the MoE and
the projection; norm_fold.md has the numerics). CPU: the references (naive.py); CUDA: the
moe_experts kernels with the norm in the down-GEMM's combine.
"""
import torch

from lingc.runtime.registry import register_op

from .naive import moe_experts_reference, residual_norm_start_reference
from .op import check_moe_experts_args

__all__ = ["moe_experts_norm", "norm_tiles", "check_norm_args"]


def norm_tiles(x: torch.Tensor, w_gate: torch.Tensor, shared_gate: torch.Tensor | None) -> tuple[int, int]:
    """(NT, tile width): the combine's column tiles, those of the launch table's down-GEMM."""
    from .kernel import config_for     # the table lives beside the kernels

    h = x.shape[1]
    n_max = max(w_gate.shape[1], shared_gate.shape[0] if shared_gate is not None else 0)
    tile = config_for(n_max, h).block_h
    return -(-h // tile), tile


def check_norm_args(x, residual, norm_weight) -> None:
    """Raise ValueError naming the bad norm argument of ``moe_experts_norm``."""
    op = "moe_experts_norm"
    if tuple(residual.shape) != tuple(x.shape):
        raise ValueError(f"{op}: residual must have x's shape {tuple(x.shape)}, got {tuple(residual.shape)}")
    if residual.dtype != x.dtype:
        raise ValueError(f"{op}: dtype mismatch, x is {x.dtype} but residual is {residual.dtype}")
    if tuple(norm_weight.shape) != (x.shape[1],):
        raise ValueError(f"{op}: norm_weight must be [H={x.shape[1]}], got shape {tuple(norm_weight.shape)}")
    if norm_weight.dtype not in (x.dtype, torch.float32):
        raise ValueError(f"{op}: norm_weight.dtype must be {x.dtype} (x's) or float32, got {norm_weight.dtype}")
    for name, t in (("residual", residual), ("norm_weight", norm_weight)):
        if t.device != x.device:
            raise ValueError(f"{op}: device mismatch, x on {x.device} but {name} on {t.device}")


def _moe_experts_norm(x, topk_ids, topk_weights, w_gate, w_up, w_down, shared_gate, shared_up, shared_down,
                      limit, shared_limit, residual, norm_weight, shared_sigmoid=None):
    args = (x, topk_ids, topk_weights, w_gate, w_up, w_down, shared_gate, shared_up, shared_down, limit, shared_limit)
    check_moe_experts_args(*args, shared_sigmoid)
    check_norm_args(x, residual, norm_weight)
    nt, tile = norm_tiles(x, w_gate, shared_gate)
    if not x.is_cuda:
        out = moe_experts_reference(*args, shared_sigmoid)
        return residual_norm_start_reference(out, residual, norm_weight, tile)
    from .kernel import moe_experts_triton

    h = torch.empty_like(x, memory_format=torch.contiguous_format)
    ss = torch.empty((nt, x.shape[0]), device=x.device, dtype=torch.float32)
    hw = moe_experts_triton(*args, shared_sigmoid=shared_sigmoid, norm=(residual, norm_weight, h, ss))
    return hw, h, ss


def _moe_experts_norm_fake(x, topk_ids, topk_weights, w_gate, w_up, w_down, shared_gate, shared_up, shared_down,
                           limit, shared_limit, residual, norm_weight, shared_sigmoid=None):
    check_moe_experts_args(x, topk_ids, topk_weights, w_gate, w_up, w_down, shared_gate, shared_up, shared_down,
                           limit, shared_limit, shared_sigmoid)
    check_norm_args(x, residual, norm_weight)
    nt, _ = norm_tiles(x, w_gate, shared_gate)
    return x.new_empty(x.shape), x.new_empty(x.shape), x.new_empty((nt, x.shape[0]), dtype=torch.float32)


_SCHEMA = ("(Tensor x, Tensor topk_ids, Tensor topk_weights, Tensor w_gate, Tensor w_up, Tensor w_down, "
           "Tensor? shared_gate, Tensor? shared_up, Tensor? shared_down, float limit, float shared_limit, "
           "Tensor residual, Tensor norm_weight, Tensor? shared_sigmoid=None) -> (Tensor, Tensor, Tensor)")


moe_experts_norm = register_op("moe_experts_norm", _moe_experts_norm, _moe_experts_norm_fake, schema=_SCHEMA)
