"""moe_align as an opaque custom op.

``torch.ops.lingc.moe_align(Tensor topk_ids, int num_experts, int block_size,
bool shared_expert) -> (Tensor, Tensor, Tensor)``: topk_ids int32 [T, k] (the router's ids);
returns (sorted_pair_ids int32 [P + min(P, E') * (block_size - 1)], block_expert_ids int32
[cdiv(that, block_size)], total_padded int32 [1]) with P = T * (k + shared_expert) pairs in
token-major order and E' = num_experts + shared_expert; the shared expert is expert
``num_experts``. naive.py gives the layout, the sentinel (P) in padding slots, and the
unspecified tail beyond total_padded.

CPU: the PyTorch implementation of naive.py. CUDA: the single-launch pair-axis kernel for
P <= 72, the device-side fallback above (kernel.py). A ``custom_op`` for the reason given in
gemm/op.py (our own PDL launch).
"""
import torch

from lingc.runtime.registry import register_op

from .naive import align_sizes, moe_align_reference

__all__ = ["moe_align", "check_moe_align_args"]


def check_moe_align_args(topk_ids, num_experts, block_size, shared_expert) -> None:
    """Raise ValueError naming the bad argument of ``moe_align``."""
    op = "moe_align"
    if topk_ids.dim() != 2:
        raise ValueError(f"{op}: topk_ids must be [T, k] (2-d), got shape {tuple(topk_ids.shape)}")
    if topk_ids.dtype != torch.int32:
        raise ValueError(f"{op}: topk_ids.dtype must be int32, got {topk_ids.dtype}")
    if topk_ids.shape[1] < 1:
        raise ValueError(f"{op}: topk_ids must have at least one slot per token, got shape {tuple(topk_ids.shape)}")
    if num_experts < 1:
        raise ValueError(f"{op}: num_experts must be >= 1, got {num_experts}")
    if block_size < 1:
        raise ValueError(f"{op}: block_size must be >= 1, got {block_size}")


def _moe_align(topk_ids, num_experts, block_size, shared_expert):
    check_moe_align_args(topk_ids, num_experts, block_size, shared_expert)
    if not topk_ids.is_cuda:
        return moe_align_reference(topk_ids, num_experts, block_size, shared_expert)
    # Imported here so the CPU path needs no triton.
    from .kernel import moe_align_triton

    return moe_align_triton(topk_ids, num_experts, block_size, shared_expert)


def _moe_align_fake(topk_ids, num_experts, block_size, shared_expert):
    check_moe_align_args(topk_ids, num_experts, block_size, shared_expert)
    t, k = topk_ids.shape
    slots, blocks = align_sizes(t * (k + int(shared_expert)), num_experts, block_size, shared_expert)
    new = lambda n: topk_ids.new_empty((n,), dtype=torch.int32)  # noqa: E731
    return new(slots), new(blocks), new(1)


_SCHEMA = "(Tensor topk_ids, int num_experts, int block_size, bool shared_expert) -> (Tensor, Tensor, Tensor)"


moe_align = register_op("moe_align", _moe_align, _moe_align_fake, schema=_SCHEMA)
