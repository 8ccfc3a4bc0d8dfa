"""Plain-PyTorch moe_align: the op's CPU implementation and the CUDA fallback for P > 72 pairs.

What moe_align produces. The fused-MoE GEMMs consume (token, expert) pairs in tiles of
``block_size`` rows that all share one expert. With T tokens routed to k experts each, pair
``p = t * K' + j`` (token-major, K' = k + shared_expert) has expert ``topk_ids[t, j]`` for
j < k and, with ``shared_expert``, expert ``num_experts`` (the shared expert folded in as one
more expert) for j = k. P = T * K' pairs. Grouping pairs by expert into buckets, in increasing
expert id:

- ``sorted_pair_ids`` int32 [P + min(P, E') * (block_size - 1)] (E' = num_experts + shared):
  bucket after bucket, each bucket's pairs in increasing pair id (stable), then padded up to a
  multiple of block_size with the sentinel P (not a pair id: consumers mask it).
- ``block_expert_ids`` int32 [cdiv(len(sorted_pair_ids), block_size)]: the expert of each
  block of block_size slots, and ``num_experts + 1`` ("no expert", ``no_expert(num_experts)``)
  for every block past total_padded.
- ``total_padded`` int32 [1]: the number of published slots (a multiple of block_size).

``sorted_pair_ids`` past total_padded is unspecified (the Triton kernel leaves it unwritten,
consumers never read it); here it holds the sentinel. The block tail is specified so that a
consumer can skip an unused block from its expert id alone, without reading total_padded first.

Implementation: device ops only (no host sync, graph-capturable): a per-expert count by
``index_add_``, padded counts, exclusive offsets by cumsum, a stable sort of the experts for the
within-bucket rank, ``searchsorted`` for the block experts. Expert ids must lie in
[0, num_experts) (index_add_ checks this on the CPU; on CUDA an out-of-range id is a device
assert).
"""
import torch

__all__ = ["pair_experts", "align_sizes", "moe_align_reference", "no_expert"]


def no_expert(num_experts: int) -> int:
    """The block expert id of blocks past total_padded: above every routed id and the shared
    expert's (num_experts)."""
    return num_experts + 1


def pair_experts(topk_ids: torch.Tensor, num_experts: int, shared_expert: bool) -> torch.Tensor:
    """int64 [P]: the expert of each pair in token-major order (module docstring)."""
    e = topk_ids.long()
    if shared_expert:
        e = torch.cat([e, torch.full_like(e[:, :1], num_experts)], dim=1)
    return e.reshape(-1)


def align_sizes(num_pairs: int, num_experts: int, block_size: int, shared_expert: bool) -> tuple[int, int]:
    """(len(sorted_pair_ids), len(block_expert_ids)) for P = num_pairs: every bucket pads at
    most block_size - 1 slots and there are at most min(P, E') non-empty buckets."""
    buckets = min(num_pairs, num_experts + int(shared_expert))
    slots = num_pairs + buckets * (block_size - 1)
    return slots, -(-slots // block_size)


def moe_align_reference(
    topk_ids: torch.Tensor, num_experts: int, block_size: int, shared_expert: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(sorted_pair_ids, block_expert_ids, total_padded) (module docstring)."""
    dev = topk_ids.device
    e = pair_experts(topk_ids, num_experts, shared_expert)
    p = e.numel()
    n_buckets = num_experts + int(shared_expert)
    slots, blocks = align_sizes(p, num_experts, block_size, shared_expert)
    counts = torch.zeros(n_buckets, dtype=torch.int64, device=dev).index_add_(0, e, torch.ones_like(e))
    padded = (counts + block_size - 1) // block_size * block_size
    ends = padded.cumsum(0)
    offsets = ends - padded                                  # exclusive, increasing expert id
    first = counts.cumsum(0) - counts                        # bucket start in the sorted pairs
    e_sorted, order = torch.sort(e, stable=True)             # pairs of a bucket stay in pair order
    pos = offsets[e_sorted] + torch.arange(p, device=dev) - first[e_sorted]
    sorted_ids = torch.full((slots,), p, dtype=torch.int32, device=dev)
    sorted_ids.scatter_(0, pos, order.to(torch.int32))
    starts = torch.arange(blocks, device=dev) * block_size
    block_experts = torch.searchsorted(ends, starts, right=True).clamp_(max=n_buckets - 1)
    total = ends[-1:].to(torch.int32)
    block_experts = torch.where(starts < ends[-1:], block_experts, no_expert(num_experts))
    return sorted_ids, block_experts.to(torch.int32), total
