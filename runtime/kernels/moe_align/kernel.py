"""Triton moe_align on the pair axis: ONE launch, one CTA, for P <= 72 pairs.

The generic align needs a grid-wide scan of per-expert counts before any pair can be placed (two
launches), and the single-launch variants keep per-expert counters, so their cost grows with the
expert count (Ling-3: 512 + the shared expert). Here nothing is indexed by expert: every tensor
is over pairs. With e_i the expert of pair i (i < P, padded to NP = next_pow2(P) lanes):

    same[i, j]  = e_j == e_i and j valid                     [NP, NP]
    rank_i      = sum_j same[i, j] * (j < i)                 stable rank within the bucket
    pop_i       = sum_j same[i, j]                           bucket population
    padded_i    = ceil(pop_i / B) * B
    rep_i       = rank_i == 0                                the bucket's representative
    offset_i    = sum_j rep_j * (e_j < e_i) * padded_j       exclusive offset, expert order
    total       = sum_i rep_i * padded_i

Then every pair writes ``sorted[offset_i + rank_i] = i``; lane 0 writes the total; each
representative writes the sentinel P into its bucket's padding slots [offset + pop, offset +
padded) and its expert id into its blocks offset/B .. (offset + padded)/B - 1, one masked vector
store over the pair lanes per slot / block step; the lanes then write "no expert" (E + 1) into
every block past the total. Slots past the total are not written (naive.py: unspecified, never
read).

Cost: O(NP^2) comparisons in registers. ``align_num_warps`` gives each thread at most 16 lanes
of an [NP, NP] tensor; compiled for sm_90 (ptxas -v), NP = 64 (P in 33..64) takes 8 warps and
90 registers, NP = 128 (P in 65..72) 32 warps and 64 registers, both without spills (an
earlier form with [NP, block_size] and [NP, blocks] pointer tensors spilled at NP = 128). The
gate (``SINGLE_LAUNCH_MAX_PAIRS``) keeps it there; above it ``moe_align_triton`` runs the
device-side PyTorch fallback of naive.py (several small launches, same outputs on the published
range).

PDL: nothing here is producer-independent (topk_ids comes from the router), so the kernel waits
at entry and triggers its dependents at once.
"""
import torch
import triton
import triton.language as tl

from lingc.runtime.pdl import pdl_launch_dependents, pdl_supported, pdl_wait

from .naive import align_sizes, moe_align_reference

__all__ = ["SINGLE_LAUNCH_MAX_PAIRS", "moe_align_triton", "align_num_warps"]

# Largest pair count of the single launch: T = 8 tokens x (8 routed + 1 shared) = 72.
SINGLE_LAUNCH_MAX_PAIRS = 72


@triton.jit
def _moe_align_kernel(
    ids_ptr, sorted_ptr, block_ptr, total_ptr,
    P, K, NBLK, stride_t, stride_k,
    NUM_EXPERTS: tl.constexpr, PAIRS_PER_TOKEN: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    NP: tl.constexpr, USE_GDC: tl.constexpr,
):
    pdl_wait(USE_GDC)
    pdl_launch_dependents(USE_GDC)

    i = tl.arange(0, NP)
    valid = i < P
    tok = i // PAIRS_PER_TOKEN
    slot = i % PAIRS_PER_TOKEN
    # Slot K (only with the shared expert) is the shared expert, id NUM_EXPERTS.
    e = tl.load(ids_ptr + tok * stride_t + slot * stride_k, mask=valid & (slot < K), other=NUM_EXPERTS)

    same = (e[:, None] == e[None, :]) & valid[None, :]
    rank = tl.sum((same & (i[None, :] < i[:, None])).to(tl.int32), axis=1)
    pop = tl.sum(same.to(tl.int32), axis=1)
    padded = (pop + BLOCK_SIZE - 1) // BLOCK_SIZE * BLOCK_SIZE
    rep = valid & (rank == 0)
    before = rep[None, :] & (e[None, :] < e[:, None])
    offset = tl.sum(tl.where(before, padded[None, :], 0), axis=1)
    total = tl.sum(tl.where(rep, padded, 0), axis=0)

    tl.store(sorted_ptr + offset + rank, i, mask=valid)
    tl.store(total_ptr + i, tl.zeros([NP], dtype=tl.int32) + total, mask=i == 0)

    # Representatives write their bucket's padding (fewer than BLOCK_SIZE slots, all in its
    # last block) and its block expert ids (at most cdiv(P, BLOCK_SIZE) blocks), one vector
    # store over the pair lanes per step: loops rather than [NP, BLOCK_SIZE] / [NP, blocks]
    # lanes keep the 64-bit pointer tensors out of the register budget. While loops, because
    # the triton 3.6 interpreter cannot iterate range() over a runtime scalar.
    sentinel = tl.zeros([NP], dtype=tl.int32) + P
    r = 0
    while r < BLOCK_SIZE - 1:
        tl.store(sorted_ptr + offset + pop + r, sentinel, mask=rep & (pop + r < padded))
        r += 1
    q = 0
    while q * BLOCK_SIZE < P:
        tl.store(block_ptr + offset // BLOCK_SIZE + q, e, mask=rep & (q * BLOCK_SIZE < padded))
        q += 1
    # The block tail: "no expert" (naive.no_expert), so a consumer skips it from the id alone.
    no_expert_ids = tl.zeros([NP], dtype=tl.int32) + (NUM_EXPERTS + 1)
    q = 0
    while q * NP < NBLK:
        b = total // BLOCK_SIZE + q * NP + i
        tl.store(block_ptr + b, no_expert_ids, mask=b < NBLK)
        q += 1


def align_num_warps(np_: int) -> int:
    """Warps for NP pair lanes: at most 16 lanes of an [NP, NP] tensor per thread (NP = 64: 8
    warps, NP = 128: 32), so the pairwise tensors stay in registers (module docstring)."""
    return int(min(32, max(4, np_ * np_ // (16 * 32))))


def moe_align_triton(
    topk_ids: torch.Tensor,
    num_experts: int,
    block_size: int,
    shared_expert: bool,
    *,
    out: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
    use_pdl: bool | None = None,
    max_single_launch: int = SINGLE_LAUNCH_MAX_PAIRS,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(sorted_pair_ids, block_expert_ids, total_padded) for topk_ids int32 [T, k] (naive.py).

    P <= ``max_single_launch``: the pair-axis kernel, one launch. Larger P: the device-side
    PyTorch fallback (naive.moe_align_reference). ``out`` may give the three output buffers
    (tests pass poisoned ones; the fallback copies into them). Arguments are assumed validated
    by the op.
    """
    t, k = topk_ids.shape
    kp = k + int(shared_expert)
    p = t * kp
    slots, blocks = align_sizes(p, num_experts, block_size, shared_expert)
    dev = topk_ids.device
    if out is None:
        out = (torch.empty(slots, dtype=torch.int32, device=dev),
               torch.empty(blocks, dtype=torch.int32, device=dev),
               torch.empty(1, dtype=torch.int32, device=dev))
    sorted_ids, block_experts, total = out
    assert sorted_ids.shape == (slots,) and block_experts.shape == (blocks,) and total.shape == (1,)
    assert all(o.dtype == torch.int32 and o.is_contiguous() for o in out)
    if p == 0 or p > max_single_launch:
        ref = moe_align_reference(topk_ids, num_experts, block_size, shared_expert)
        for dst, src in zip(out, ref):
            dst.copy_(src)
        return out
    if use_pdl is None:
        use_pdl = pdl_supported(dev)
    np_ = max(16, triton.next_power_of_2(p))
    _moe_align_kernel[(1,)](
        topk_ids, sorted_ids, block_experts, total,
        p, k, blocks, topk_ids.stride(0), topk_ids.stride(1),
        NUM_EXPERTS=num_experts, PAIRS_PER_TOKEN=kp, BLOCK_SIZE=block_size,
        NP=np_,
        USE_GDC=use_pdl, num_warps=align_num_warps(np_),
        **({"launch_pdl": True} if use_pdl else {}),
    )
    return out
