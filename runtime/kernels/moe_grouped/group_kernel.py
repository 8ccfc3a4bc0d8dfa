"""Triton kernels of `lingc::moe_group_pairs`: a prompt chunk's (token, slot) pairs grouped by expert
by a counting sort in two launches (and one zero fill), instead of torch.sort's radix passes (eight
kernels and their memsets for 65536 pairs), torch.searchsorted for the ends and the inverse
permutation's arange and scatter: at ~40 us of host time per launch (H200 host, session 39) an
eager prefill, which is host-bound below ~8192 tokens, pays for every launch it issues.

- ``_moe_pair_count_kernel``, grid cdiv(P, BLOCK): counts[e] += 1 per pair (integer atomics).
- ``_moe_pair_place_kernel``, grid cdiv(P, BLOCK): every program recomputes ends = cumsum(counts)
  over the E experts (a register scan; program 0 stores it), and each pair takes the slot
  ``ends[e] - counts[e] + atomic_add(cursor[e], 1)``: order[slot] = p, inv[p] = slot.

The order of the pairs inside an expert is the atomics' (not stable): the expert GEMMs compute
every row on its own, whatever its place in a tile, so the results do not depend on it.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

__all__ = ["BLOCK", "moe_group_pairs_triton"]

BLOCK = 1024    # pairs per program


@triton.jit
def _moe_pair_count_kernel(ids_ptr, counts_ptr, P, BLOCK: tl.constexpr):
    p = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    live = p < P
    e = tl.load(ids_ptr + p, mask=live, other=0)
    tl.atomic_add(counts_ptr + e, tl.full((BLOCK,), 1, tl.int32), mask=live, sem="relaxed")


@triton.jit
def _moe_pair_place_kernel(ids_ptr, counts_ptr, cursor_ptr, ends_ptr, order_ptr, inv_ptr, P, E,
                  BLOCK: tl.constexpr, E_PAD: tl.constexpr):
    experts = tl.arange(0, E_PAD)
    counts = tl.load(counts_ptr + experts, mask=experts < E, other=0)
    ends = tl.cumsum(counts, 0)
    if tl.program_id(0) == 0:
        tl.store(ends_ptr + experts, ends, mask=experts < E)
    starts = ends - counts
    p = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    live = p < P
    e = tl.load(ids_ptr + p, mask=live, other=0)
    rank = tl.atomic_add(cursor_ptr + e, tl.full((BLOCK,), 1, tl.int32), mask=live, sem="relaxed")
    slot = (tl.gather(starts, e, 0) + rank).to(tl.int64)
    tl.store(order_ptr + slot, p.to(tl.int64), mask=live)
    tl.store(inv_ptr + p, slot, mask=live)


def moe_group_pairs_triton(ids: torch.Tensor, num_experts: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(order int64 [P], inv int64 [P], ends int32 [E]) for ids [T, k] (int32 or int64, contiguous,
    in [0, E)): order[slot] is the pair at sorted slot `slot` (pairs grouped by increasing expert),
    inv its inverse, ends[e] the pairs of experts <= e (op.check_moe_group_pairs_args)."""
    flat = ids.reshape(-1)
    P, dev = flat.numel(), ids.device
    order = torch.empty(P, dtype=torch.int64, device=dev)
    inv = torch.empty(P, dtype=torch.int64, device=dev)
    ends = torch.empty(num_experts, dtype=torch.int32, device=dev)
    counts = torch.zeros(2, num_experts, dtype=torch.int32, device=dev)     # counts, then the cursors
    if P == 0:
        return order, inv, ends.zero_()
    grid = (triton.cdiv(P, BLOCK),)
    _moe_pair_count_kernel[grid](flat, counts, P, BLOCK=BLOCK, num_warps=4)
    _moe_pair_place_kernel[grid](flat, counts, counts[1], ends, order, inv, P, num_experts, BLOCK=BLOCK,
                        E_PAD=max(16, triton.next_power_of_2(num_experts)), num_warps=4)
    return order, inv, ends
