"""Triton MoE router: gate matvec + sigmoid + biased grouped top-k + weights, ONE launch.

Design (README.md has the derivation):

- Grid: one CTA per BLOCK_E experts (Ling-3: E = 512, BLOCK_E = 4, 128 CTAs, one per SM of an
  H200). A CTA loads its whole gate tile [BLOCK_E, H] (20 KB in bf16) and the expert bias
  BEFORE ``gdc_wait``: the 2.6 MB cold weight read is independent of the producer, so it
  overlaps the previous kernel's tail. Then it waits, triggers the dependents, and for each of
  the T rows computes BLOCK_E fp32 logits (products in fp32, one tree reduction per row over
  H) and stores them to a small fp32 workspace [T, E].
- Election: every CTA then takes an integer ticket (acq_rel, GPU scope, after a CTA barrier so
  all its stores precede it). The CTA that draws the last ticket sees every logit and does the
  selection for all T rows, in the same launch; it resets the ticket to zero
  (``gemm_common.split_k_tickets``, the same scheme as the split-K GEMM). No CTA spins, so no
  co-residency is assumed.
- Selection, SEL_ROWS rows at once on [SEL_ROWS, G_PAD, GS_PAD] views of the scores (row, group
  g, member j): every candidate is one int64 key (its score's order key << 32 | E - 1 - id), so
  one max reduction gives the best score and, among equal scores, the lowest index: the rule of
  naive.py. Group top-1 and top-2 (the top-1's key removed); group score m1 + m2; the topk_group
  best groups by repeated max over group keys; then top_k repeated maxes over the kept groups'
  keys. The measured reason: the former one-row-at-a-time selection cost ~6 us per row inside
  the one elected CTA (H200: 8.7 us at T=1, 41.8 us at T=6, `benchmarks/moe_sweep.py`).
- Weights: s at the picked experts (the sigmoid of their logits, gathered), renormalised
  (w / sum w) and scaled.

Batch invariance: a row's logits come from the same code and the same reduction tree for any
T (T is not specialised), and its selection runs in the same SEL_ROWS-row tile whatever T is
(padding rows are masked); nothing mixes rows.
"""
import torch
import triton
import triton.language as tl

from lingc.runtime.kernels.gemm_common import split_k_tickets
from lingc.runtime.pdl import pdl_launch_dependents, pdl_supported, pdl_wait

__all__ = ["moe_router_triton", "router_block_e", "router_num_warps"]

# CTAs the matvec is spread over at most (H200: 132 SMs; 128 divides the expert counts).
_TARGET_CTAS = 128
# Rows the selection handles at once (T <= 4 in one pass, T = 6 in two; never a function of T:
# batch invariance). 8 spills on sm_90 (README.md).
SEL_ROWS = 4


@triton.jit(do_not_specialize=["T"])
def _moe_router_kernel(
    x_ptr, w_ptr, bias_ptr, logits_ptr, ticket_ptr, ids_ptr, wts_ptr,
    T, H, routed_scaling,
    stride_xt, stride_xh, stride_we, stride_lt, stride_it, stride_wt,
    N_GROUP: tl.constexpr, GROUP_SIZE: tl.constexpr, TOPK_GROUP: tl.constexpr, TOP_K: tl.constexpr,
    RENORMALIZE: tl.constexpr,
    BLOCK_E: tl.constexpr, BLOCK_H: tl.constexpr, G_PAD: tl.constexpr, GS_PAD: tl.constexpr,
    K_PAD: tl.constexpr, SEL_ROWS: tl.constexpr, USE_GDC: tl.constexpr,
):
    E: tl.constexpr = N_GROUP * GROUP_SIZE
    pid = tl.program_id(0)

    # Producer-independent loads first: this CTA's gate tile and the (small) bias view.
    rows = pid * BLOCK_E + tl.arange(0, BLOCK_E)
    offs_h = tl.arange(0, BLOCK_H)
    mask_e = rows < E
    mask_h = offs_h < H
    w = tl.load(w_ptr + rows[:, None] * stride_we + offs_h[None, :],
                mask=mask_e[:, None] & mask_h[None, :], other=0.0)
    g = tl.arange(0, G_PAD)[:, None]
    j = tl.arange(0, GS_PAD)[None, :]
    valid = (g < N_GROUP) & (j < GROUP_SIZE)
    eidx = tl.where(valid, g * GROUP_SIZE + j, E)  # expert id; E (past every id) for padding
    bias = tl.load(bias_ptr + eidx, mask=valid, other=0.0)

    pdl_wait(USE_GDC)
    pdl_launch_dependents(USE_GDC)

    wf = w.to(tl.float32)
    # Row loops are while loops: the triton 3.6 interpreter cannot iterate range() over a
    # runtime scalar (numpy 2 refuses its 1-element handle as an index); on the GPU both lower
    # to the same scf loop.
    t = 0
    while t < T:
        xv = tl.load(x_ptr + t * stride_xt + offs_h * stride_xh, mask=mask_h, other=0.0).to(tl.float32)
        logit = tl.sum(wf * xv[None, :], axis=1)
        tl.store(logits_ptr + t * stride_lt + rows, logit, mask=mask_e)
        t += 1

    # All of this CTA's logits are stored before its ticket (barrier + acq_rel): the CTA that
    # draws the last ticket sees every CTA's logits.
    tl.debug_barrier()
    ticket = tl.atomic_add(ticket_ptr, 1, sem="acq_rel", scope="gpu")
    if ticket == tl.num_programs(0) - 1:
        _select(logits_ptr, bias, eidx, valid, ids_ptr, wts_ptr, T, routed_scaling,
                stride_lt, stride_it, stride_wt, E, N_GROUP, TOPK_GROUP, TOP_K, RENORMALIZE,
                G_PAD, K_PAD, SEL_ROWS)
        tl.atomic_xchg(ticket_ptr, 0, sem="relaxed", scope="gpu")  # ready for the next launch


@triton.jit
def _order_key(v):
    """fp32 -> int32 whose signed order is v's order (-inf lowest; -0.0 sorts below +0.0, which
    sigmoid + bias cannot produce: s > 0)."""
    b = v.to(tl.int32, bitcast=True)
    return tl.where(b < 0, b ^ 0x7FFFFFFF, b)


@triton.jit
def _key_value(key):
    """The fp32 value in the high half of a packed (order key, tie-break) int64 key."""
    b = (key >> 32).to(tl.int32)
    return tl.where(b < 0, b ^ 0x7FFFFFFF, b).to(tl.float32, bitcast=True)


@triton.jit
def _select(
    logits_ptr, bias, eidx, valid, ids_ptr, wts_ptr, T, routed_scaling,
    stride_lt, stride_it, stride_wt,
    E: tl.constexpr, N_GROUP: tl.constexpr, TOPK_GROUP: tl.constexpr, TOP_K: tl.constexpr,
    RENORMALIZE: tl.constexpr, G_PAD: tl.constexpr, K_PAD: tl.constexpr, SEL_ROWS: tl.constexpr,
):
    """Grouped top-k of SEL_ROWS rows at once, on [SEL_ROWS, G_PAD, GS_PAD] views of the logits.

    Each candidate is one int64 key, (order key of its score) << 32 | (E - 1 - expert id), so a
    single max reduction yields the best score AND, among equal scores, the lowest id (the tie
    rule of naive.py); keys are distinct, so removing the winner is an equality test. Rows go
    SEL_ROWS at a time whatever T is (same shapes, same code for every row: batch invariant)."""
    neg_inf = float("-inf")
    lowest = -9223372036854775808            # below every key (a key's high half is >= key(-inf))
    e3 = eidx[None, :, :]
    v3 = valid[None, :, :]
    tie3 = tl.where(v3, E - 1 - e3, 0).to(tl.int64)
    gar = tl.arange(0, G_PAD)[None, :]
    gtie = (G_PAD - 1 - gar).to(tl.int64)
    kr = tl.arange(0, K_PAD)[None, :]
    r0 = 0
    while r0 < T:
        rows3 = r0 + tl.arange(0, SEL_ROWS)[:, None, None]
        # .cg: read the logits from L2, where the other CTAs' stores landed.
        lg = tl.load(logits_ptr + rows3 * stride_lt + e3, mask=(rows3 < T) & v3, other=0.0, cache_modifier=".cg")
        c = tl.where(v3, tl.sigmoid(lg) + bias[None, :, :], neg_inf)
        key = (_order_key(c).to(tl.int64) << 32) | tie3
        # Group score: top-1 + top-2 of the group (the top-1's lowest position removed).
        k1 = tl.max(key, axis=2)
        k2 = tl.max(tl.where(key == k1[:, :, None], lowest, key), axis=2)
        gscore = tl.where(gar < N_GROUP, _key_value(k1) + _key_value(k2), neg_inf)
        gkey = (_order_key(gscore).to(tl.int64) << 32) | gtie
        keep = gkey == lowest                  # all False
        for _ in tl.static_range(TOPK_GROUP):
            best = tl.max(gkey, axis=1)
            hit = gkey == best[:, None]
            keep = keep | hit
            gkey = tl.where(hit, lowest, gkey)
        key = tl.where(keep[:, :, None] & v3, key, lowest)
        ids = tl.zeros([SEL_ROWS, K_PAD], dtype=tl.int32)
        for i in tl.static_range(TOP_K):
            best = tl.max(tl.max(key, axis=2), axis=1)
            ids = tl.where(kr == i, (E - 1 - (best & 0x7FFFFFFF)).to(tl.int32)[:, None], ids)
            key = tl.where(key == best[:, None, None], lowest, key)
        rows2 = r0 + tl.arange(0, SEL_ROWS)[:, None]
        mask = (rows2 < T) & (kr < TOP_K)
        # The weights are the unbiased scores at the picked experts.
        lsel = tl.load(logits_ptr + rows2 * stride_lt + ids, mask=mask, other=0.0, cache_modifier=".cg")
        wsel = tl.where(kr < TOP_K, tl.sigmoid(lsel), 0.0)
        if RENORMALIZE:
            wsel = wsel / tl.sum(wsel, axis=1)[:, None]
        wsel = wsel * routed_scaling
        tl.store(ids_ptr + rows2 * stride_it + kr, ids, mask=mask)
        tl.store(wts_ptr + rows2 * stride_wt + kr, wsel, mask=mask)
        r0 += SEL_ROWS


def router_block_e(num_experts: int) -> int:
    """Experts per CTA: the smallest power of two that keeps the grid at <= 128 CTAs, at least 4
    (E = 512: 4, 128 CTAs). It changes which CTA computes a logit, never how (each logit is one
    row's reduction over H), so it does not change the bits (a test checks)."""
    return max(4, triton.next_power_of_2(triton.cdiv(num_experts, _TARGET_CTAS)))


def router_num_warps(block_e: int, hidden: int) -> int:
    """Warps for a [block_e, next_pow2(hidden)] gate tile: ~64 elements per thread at most
    (Ling-3 bf16: [4, 4096] over 8 warps), so the tile and its fp32 copy stay in registers."""
    elems = block_e * triton.next_power_of_2(max(hidden, 1))
    return int(min(16, max(4, triton.next_power_of_2(triton.cdiv(elems, 64 * 32)))))


def moe_router_triton(
    x: torch.Tensor,
    gate_w: torch.Tensor,
    expert_bias: torch.Tensor,
    n_group: int,
    topk_group: int,
    top_k: int,
    routed_scaling: float,
    renormalize: bool,
    *,
    ids_out: torch.Tensor | None = None,
    weights_out: torch.Tensor | None = None,
    logits_out: torch.Tensor | None = None,
    block_e: int | None = None,
    use_pdl: bool | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Launch on x [T, H], gate_w [E, H] (unit H stride), expert_bias fp32 [E]; returns
    (ids int32 [T, top_k], weights fp32 [T, top_k]) (naive.moe_router_reference).

    ``ids_out`` / ``weights_out`` may be given (tests pass poisoned buffers); ``logits_out``, an
    fp32 [T, E] contiguous buffer, is the workspace and exposes the logits to tests. ``block_e``
    overrides ``router_block_e``; ``use_pdl`` defaults to ``pdl_supported(x.device)``.
    Arguments are assumed validated by the op.
    """
    t, h = x.shape
    e = gate_w.shape[0]
    dev = x.device
    if ids_out is None:
        ids_out = torch.empty((t, top_k), device=dev, dtype=torch.int32)
    if weights_out is None:
        weights_out = torch.empty((t, top_k), device=dev, dtype=torch.float32)
    if logits_out is None:
        logits_out = torch.empty((t, e), device=dev, dtype=torch.float32)
    assert ids_out.shape == (t, top_k) and ids_out.dtype == torch.int32 and ids_out.stride(1) == 1
    assert weights_out.shape == (t, top_k) and weights_out.dtype == torch.float32 and weights_out.stride(1) == 1
    assert logits_out.shape == (t, e) and logits_out.dtype == torch.float32 and logits_out.stride(1) == 1
    if t == 0:
        return ids_out, weights_out
    if use_pdl is None:
        use_pdl = pdl_supported(dev)
    block_e = block_e or router_block_e(e)
    group_size = e // n_group
    _moe_router_kernel[(triton.cdiv(e, block_e),)](
        x, gate_w, expert_bias, logits_out, split_k_tickets(dev, 1), ids_out, weights_out,
        t, h, float(routed_scaling),
        x.stride(0), x.stride(1), gate_w.stride(0), logits_out.stride(0), ids_out.stride(0),
        weights_out.stride(0),
        N_GROUP=n_group, GROUP_SIZE=group_size, TOPK_GROUP=topk_group, TOP_K=top_k,
        RENORMALIZE=bool(renormalize),
        BLOCK_E=block_e, BLOCK_H=triton.next_power_of_2(h), G_PAD=triton.next_power_of_2(n_group),
        GS_PAD=triton.next_power_of_2(group_size), K_PAD=triton.next_power_of_2(top_k), SEL_ROWS=SEL_ROWS,
        USE_GDC=use_pdl, num_warps=router_num_warps(block_e, h),
        **({"launch_pdl": True} if use_pdl else {}),
    )
    return ids_out, weights_out
