"""Triton moe_align on the pair axis: ONE launch, one warp, for P <= 72 pairs.

The generic align needs a grid-wide scan of per-expert counts before any pair can be placed (two
launches), and the single-launch variants keep per-expert counters, so their cost grows with the
expert count (Ling-3: 512 + the shared expert). Here nothing is indexed by expert: every tensor
is over NP = max(32, next_pow2(P)) pair lanes, nothing is O(NP^2), and the kernel is one warp,
so its sort, scans and sums are warp shuffles: no shared memory, no barrier. It sits on the
critical path of every MoE layer.

    key_i   = e_i << log2(NP) | i       e_i the expert of pair i; lanes i >= P get E + 1
    sort the keys (bitonic network, registers and shuffles)
                                        lane s holds the s-th smallest key: buckets in expert
                                        order, each bucket's pairs in pair order (the reference's)
    first_s = e_s != e_{s-1}            last_s = e_s != e_{s+1}       (tl.gather of neighbours)
    rank_s  = s - max_{t <= s} (first_t ? t : 0)                      place in its bucket
    col_s   = rank_s % B                opens_s = s < P and col_s == 0 (first pair of a block)
    blk_s   = sum_{t <= s} opens_t - 1  its block; dest_s = blk_s * B + col_s
    total   = B * sum_s opens_s

Every sorted lane s < P writes ``sorted[dest_s] = pair_s`` and, if it opens a block, that block's
expert id (each published block holds at least one pair: a bucket pads fewer than B slots);
lane 0 writes the total; the last pair of each bucket writes the sentinel P into the rest of its
block, slots (dest, (blk + 1) * B); lane b writes "no expert" (E + 1) into block b for every b in
[total / B, NBLK) (NBLK <= P <= NP). Slots past the total are not written (naive.py:
unspecified, never read).

Time (one H200, torch.profiler kernel time, median of 300 launches without PDL, T tokens x (8
routed + shared), E = 512, B = 16, one run): T = 6 (the verify step, NP = 64) 2.11 us against
2.91 us for the previous form (one CTA of 8 warps, [NP, NP] comparisons, cross-warp reductions
through shared memory); T = 8 (NP = 128) 2.88 against 8.45 us; T = 4 2.11 against 2.85 us; T = 2
(NP = 32) 1.41 against 1.28 us. The padding stores dominate: one bucket per lane, so a store
instruction scatters over as many sectors as it has lanes. At T = 6 the same kernel without
them took 1.44 us and with them as 4-byte stores 2.53 us; hence ``WIDE_PAD`` (even B and an
8-byte aligned sorted_pair_ids, which the launcher checks): 8-byte stores of two slots, half the
store instructions. Not the sort: in another run, without it 2.27 us against 2.56 us with it
(4-byte padding).

Instructions (straight-line SASS, sm_90, triton 3.6, NUM_EXPERTS 512, 9 pairs a token, B = 16,
WIDE_PAD): NP = 32 240, NP = 64 448, NP = 128 880; the previous form 1072 at NP = 64. Registers
(ptxas -v): 24, 30 and 60, no spills (also at B = 1, 3, 4, 64 and without WIDE_PAD). The gate
(``SINGLE_LAUNCH_MAX_PAIRS``) keeps the kernel at P <= 72; above it ``moe_align_triton`` runs
the device-side PyTorch fallback of naive.py (several small launches, same outputs on the
published range).

PDL: nothing here is producer-independent (topk_ids comes from the router), so the kernel waits
at entry and triggers its dependents at once.
"""
import torch
import triton
import triton.language as tl

from lingc.runtime.pdl import pdl_launch_dependents, pdl_supported, pdl_wait

from .naive import align_sizes, moe_align_reference

__all__ = ["ALIGN_WARPS", "SINGLE_LAUNCH_MAX_PAIRS", "moe_align_triton"]

# Largest pair count of the single launch: T = 8 tokens x (8 routed + 1 shared) = 72.
SINGLE_LAUNCH_MAX_PAIRS = 72
# One warp: every cross-lane step is a shuffle (module docstring).
ALIGN_WARPS = 1


@triton.constexpr_function
def _log2(n):
    return n.bit_length() - 1


@triton.jit
def _bit(N_DIMS: tl.constexpr, j: tl.constexpr):
    """Whether bit j of the flat index is set, broadcastable over a [2] * N_DIMS hypercube."""
    return tl.reshape(tl.arange(0, 2), [1] * (N_DIMS - j - 1) + [2] + [1] * j) == 1


@triton.jit
def _bitonic_sort(x):
    """x [N] (N a power of two) in ascending order by a bitonic network over the [2] * log2(N)
    hypercube view (the network tl.sort uses), each step's direction a bool: tl.sort compares
    the int 0/1 of (x > partner) against an int indicator, two instructions more per element
    and step on sm_90 (this kernel with tl.sort: 48 more at NP = 64)."""
    N_DIMS: tl.constexpr = _log2(x.numel)
    h = tl.reshape(x, [2] * N_DIMS)
    for stage in tl.static_range(1, N_DIMS + 1):
        for k in tl.static_range(stage):
            # Compare-exchange with the partner across bit stage - 1 - k of the flat index.
            partner = h ^ tl.xor_sum(h, N_DIMS - stage + k, True)
            keep_max = _bit(N_DIMS, stage - 1 - k)
            if stage < N_DIMS:
                keep_max = keep_max != _bit(N_DIMS, stage)   # runs of 2^stage alternate direction
            h = tl.where((h > partner) != keep_max, partner, h)
    return tl.reshape(h, x.shape)


@triton.jit
def _max_combine(a, b):
    return tl.maximum(a, b)


@triton.jit
def _moe_align_kernel(
    ids_ptr, sorted_ptr, block_ptr, total_ptr,
    P, K, NBLK, stride_t, stride_k,
    NUM_EXPERTS: tl.constexpr, PAIRS_PER_TOKEN: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    NP: tl.constexpr, WIDE_PAD: tl.constexpr, USE_GDC: tl.constexpr,
):
    pdl_wait(USE_GDC)
    pdl_launch_dependents(USE_GDC)

    PAIR_BITS: tl.constexpr = _log2(NP)
    i = tl.arange(0, NP)
    valid = i < P
    tok = i // PAIRS_PER_TOKEN
    slot = i % PAIRS_PER_TOKEN
    # Slot K (only with the shared expert) is the shared expert, id NUM_EXPERTS. One int32
    # offset: one 64-bit address computation instead of two.
    e = tl.load(ids_ptr + (tok * stride_t + slot * stride_k), mask=valid & (slot < K), other=NUM_EXPERTS)
    # (expert, pair) in one int32 key; the lanes past P sort after every pair (E + 1).
    key = _bitonic_sort((tl.where(valid, e, NUM_EXPERTS + 1) << PAIR_BITS) | i)

    # From here on lane s holds the s-th smallest key: valid is s < P.
    s = i
    e = key >> PAIR_BITS
    pair = key & (NP - 1)
    first = (s == 0) | (tl.gather(e, tl.maximum(s - 1, 0), 0) != e)
    last = (s == NP - 1) | (tl.gather(e, tl.minimum(s + 1, NP - 1), 0) != e)
    # Unsigned: the remainder by a power of two is a mask, not a signed-division sequence.
    rank = (s - tl.associative_scan(tl.where(first, s, 0), 0, _max_combine)).to(tl.uint32)
    col = (rank % BLOCK_SIZE).to(tl.int32)
    opens = (valid & (col == 0)).to(tl.int32)
    blocks_to = tl.cumsum(opens, 0)           # blocks up to and including this pair's
    dest = (blocks_to - 1) * BLOCK_SIZE + col
    used = tl.sum(opens, 0)

    tl.store(sorted_ptr + dest, pair, mask=valid)
    tl.store(block_ptr + blocks_to - 1, e, mask=opens != 0)
    tl.store(total_ptr + i, tl.zeros([NP], dtype=tl.int32) + used * BLOCK_SIZE, mask=i == 0)

    # The bucket's padding (fewer than BLOCK_SIZE slots, all in its last block), written by its
    # last pair. One bucket per lane: these stores scatter, and they dominate the kernel's time
    # (module docstring), so with WIDE_PAD (even BLOCK_SIZE, 8-byte aligned sorted_ptr) each is
    # one 8-byte store of two slots (2q, 2q + 1): every such slot couple of the block from the
    # one holding the bucket's last pair on, that one as (pair, P) when the pair sits in slot 2q
    # (little-endian: slot 2q is the low half). While loops, because the triton 3.6 interpreter
    # cannot iterate range() over a runtime scalar; none at BLOCK_SIZE 1 (no padding), where a
    # zero-trip loop crashes triton 3.6's coalesce pass.
    if BLOCK_SIZE > 1:
        end = valid & last
        if WIDE_PAD:
            slot_pairs = sorted_ptr.to(tl.pointer_type(tl.int64)) + (blocks_to - 1) * (BLOCK_SIZE // 2)
            high = (tl.zeros([NP], dtype=tl.int64) + P) << 32   # P may be a specialised int
            sentinels = high | P
            pair_sentinel = high | pair.to(tl.int64)
            q = 0
            while q < BLOCK_SIZE // 2:
                tl.store(slot_pairs + q, tl.where(2 * q == col, pair_sentinel, sentinels),
                         mask=end & (2 * q >= col))
                q += 1
        else:
            npad = tl.where(end, BLOCK_SIZE - 1 - col, 0)
            sentinel = tl.zeros([NP], dtype=tl.int32) + P
            r = 1
            while r < BLOCK_SIZE:
                tl.store(sorted_ptr + dest + r, sentinel, mask=r <= npad)
                r += 1
    # The block tail: "no expert" (naive.no_expert), so a consumer skips it from the id alone.
    # NBLK <= P <= NP (align_sizes), so lane b covers block b.
    no_expert_ids = tl.zeros([NP], dtype=tl.int32) + (NUM_EXPERTS + 1)
    tl.store(block_ptr + i, no_expert_ids, mask=(i >= used) & (i < NBLK))


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
    # At least one warp's 32 lanes: no lane holds a replicated element.
    np_ = max(32, triton.next_power_of_2(p))
    assert blocks <= np_, (blocks, np_)  # the block tail is one store per lane
    if (num_experts + 2) * np_ > 2**31:
        raise ValueError(f"moe_align: num_experts {num_experts} too large for the int32 sort key "
                         f"(expert << log2({np_}))")
    _moe_align_kernel[(1,)](
        topk_ids, sorted_ids, block_experts, total,
        p, k, blocks, topk_ids.stride(0), topk_ids.stride(1),
        NUM_EXPERTS=num_experts, PAIRS_PER_TOKEN=kp, BLOCK_SIZE=block_size,
        NP=np_, WIDE_PAD=block_size % 2 == 0 and sorted_ids.data_ptr() % 8 == 0,
        USE_GDC=use_pdl, num_warps=ALIGN_WARPS,
        **({"launch_pdl": True} if use_pdl else {}),
    )
    return out
