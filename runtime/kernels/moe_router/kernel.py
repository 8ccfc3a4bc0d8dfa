"""Triton MoE router: gate matvec + sigmoid + biased grouped top-k + weights, two launches.

Design (README.md has the derivation and the measurements behind it):

- Logits launch: one CTA per BLOCK_E experts and row group (Ling-3: E = 512; one token row:
  BLOCK_E = 4, 128 CTAs, one per SM of an H200; more rows: BLOCK_E = 8 and the rows split over
  2 groups, 128 CTAs again). A CTA loads its whole gate tile [BLOCK_E, H] (20 KB in bf16 at
  BLOCK_E = 4) BEFORE ``gdc_wait``: the 2.6 MB cold weight read is independent of the producer,
  so it overlaps the previous kernel's tail. Then it waits, triggers the dependents, and for
  each of its group's rows computes BLOCK_E fp32 logits (products in fp32, one tree reduction
  per row over H) into a small fp32 workspace [T, E]. Rows are serial within a CTA (each one's
  reduction crosses warps), so splitting them over two groups halves verify's chain.
- Select launch: one CTA of ONE warp per row. The expert bias is loaded before its wait; after
  it, the row's E logits are read and the grouped top-k runs on a [G_PAD, GS_PAD] view (group
  g, member j). Every candidate is one int64 key, (order key of its score) << 32 | (E - 1 -
  id), so one max reduction gives the best score and, among equal scores, the lowest id: the
  rule of naive.py. Group score top-1 + top-2 from fp32 max reductions; the topk_group best
  groups by repeated max over group keys; then the kept groups' members are read again as a
  dense [KG_PAD, GS_PAD] tile and top_k repeated maxes run over their keys only. With one warp
  every reduction is shuffles inside the warp, never a shared-memory round trip and a CTA
  barrier; rows run side by side on T SMs. The warp is bound by its dependent chain, hence
  the fp32 group stage, the dense kept tile, and the fast picks: int32 keys with one
  redux.sync a pick, the int64 picks only where a near tie could make them differ (README.md).
- Why two launches: the former one-launch kernel elected the last CTA (an atomic ticket) to run
  the selection of every row with the logits kernel's 8 warps; its cross-warp reductions cost
  ~6 us per row done one at a time, and still 21 us at T=6 with four rows at a time (H200,
  `benchmarks/moe_sweep.py`). PDL keeps the second launch's start hidden behind the first.
- Weights: s at the picked experts (the kept tile's sigmoid of their logits), renormalised
  (w / sum w) and scaled.

Batch invariance: a row's logits come from the same code and the same reduction tree for any
T (T is not specialised), and its selection is its own CTA's, the same for every T; nothing
mixes rows.
"""
import torch
import triton
import triton.language as tl

from lingc.runtime.kernels.gemm_common import add_pairs, register_cap, split_rows
from lingc.runtime.kernels.norms.kernel import _normed_row
from lingc.runtime.pdl import interpreting, pdl_launch_dependents, pdl_supported, pdl_wait

__all__ = ["SELECT_MAXNREG", "SELECT_WARPS", "moe_router_triton", "moe_select_triton", "redux_pack",
           "rmsnorm_router_triton", "router_block_e", "router_num_warps", "router_row_groups", "select_fast"]

# CTAs the matvec is spread over at most (H200: 132 SMs; 128 divides the expert counts).
_TARGET_CTAS = 128
# Row groups of the logits launch: the T token rows are split over up to this many programs per
# expert block, each reducing its rows one after another (1 = every row in one program).
# H200, session 22 (benchmarks/results, "Session 22"): verify's logits (T = 6) took 192 us per
# step with 1 group, 123 with 2, 175 with 3 and 194 with 6.
ROW_GROUPS = 2
# Above one token row, a logits CTA takes this many times the experts of router_block_e(E): with
# 2 row groups that keeps the grid at ~128 CTAs. Same warps, so 177 registers a thread at Ling-3
# (one CTA an SM), no spills (tests/test_moe_kernels.py compiles it for sm_90).
MANY_ROWS_BLOCK_E_FACTOR = 2
# Warps of a selection CTA: one, so every reduction stays inside the warp (README.md).
SELECT_WARPS = 1
# Its register cap: left alone, ptxas stops at 96 registers for the one-warp CTA and spills the
# fast path's tiles (sm_90, triton 3.6: 4 bytes); it needs 106.
SELECT_MAXNREG = 128


@triton.jit
def _norm_row(x_ptr, res_ptr, t, stride_xt, stride_rt, offs_h, mask, HAS_RES: tl.constexpr):
    """Row t's residual stream h = residual + x, rounded to x's dtype (the rmsnorm kernel's)."""
    x = tl.load(x_ptr + t * stride_xt + offs_h, mask=mask, other=0.0)
    if HAS_RES:
        r = tl.load(res_ptr + t * stride_rt + offs_h, mask=mask, other=0.0)
        x = (r.to(tl.float32) + x.to(tl.float32)).to(x.dtype)
    return x


@triton.jit(do_not_specialize=["T", "ROWS"])
def _moe_router_logits_kernel(
    x_ptr, w_ptr, logits_ptr, T, ROWS, H,
    stride_xt, stride_xh, stride_we, stride_lt,
    res_ptr, nw_ptr, y_ptr, h_ptr, stride_rt, stride_yt, stride_ht, eps, SLICE,
    E: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_H: tl.constexpr, USE_GDC: tl.constexpr,
    NORM: tl.constexpr = False, HAS_RES: tl.constexpr = False, ROUND_BEFORE_WEIGHT: tl.constexpr = False,
):
    """Program (e, r): the logits of experts [e * BLOCK_E, (e + 1) * BLOCK_E) for token rows
    [r * ROWS, min((r + 1) * ROWS, T)), one row after another with the same arithmetic per row
    whatever ROWS and T are (so the bits do not depend on the row grouping).

    NORM (``lingc.rmsnorm_router``): x is the sub-layer output, not yet normed. Each program
    forms its rows' residual stream h = residual + x (the rmsnorm kernel's rounding; the whole
    row is in its registers anyway, for the matvec), reduces sum(h^2) and the gate products of
    h * norm_w in one pass, scales the latter by r = rsqrt(sum(h^2) / H + eps) (the logits of
    the fp32 normed row), and stores columns [e * SLICE, (e + 1) * SLICE) of y = h * r * norm_w
    (rounded once) and of h: the expert blocks together write every column once, and the norm
    is not a launch of its own.

    With ROUND_BEFORE_WEIGHT (the Hugging Face Llama form, ``weight * normed.to(dtype)``) the
    normed row is rounded before the weight, which needs the scale before the products: each
    program forms y with the norm kernels' ``_normed_row`` and routes y as rounded, the same
    gate products as ``lingc.moe_router`` on that y (so the selection is the unfused pair's)."""
    pid = tl.program_id(0)
    # Producer-independent loads first: this CTA's gate tile (and the norm weight).
    rows = pid * BLOCK_E + tl.arange(0, BLOCK_E)
    offs_h = tl.arange(0, BLOCK_H)
    mask_e = rows < E
    mask_h = offs_h < H
    w = tl.load(w_ptr + rows[:, None] * stride_we + offs_h[None, :],
                mask=mask_e[:, None] & mask_h[None, :], other=0.0)
    if NORM:
        nw = tl.load(nw_ptr + offs_h, mask=mask_h, other=0.0).to(tl.float32)
        mine = mask_h & (offs_h >= pid * SLICE) & (offs_h < (pid + 1) * SLICE)

    pdl_wait(USE_GDC)
    pdl_launch_dependents(USE_GDC)

    wf = w.to(tl.float32)
    # Row loops are while loops: the triton 3.6 interpreter cannot iterate range() over a
    # runtime scalar (numpy 2 refuses its 1-element handle as an index); on the GPU both lower
    # to the same scf loop.
    # Row t + 1 is requested before row t is reduced, so a row's L2 latency overlaps the
    # previous row's reduction (the same arithmetic per row whatever T is).
    t = tl.program_id(1) * ROWS
    t_end = tl.minimum(t + ROWS, T)
    if NORM:
        xv = _norm_row(x_ptr, res_ptr, t, stride_xt, stride_rt, offs_h, mask_h & (t < t_end), HAS_RES)
    else:
        xv = tl.load(x_ptr + t * stride_xt + offs_h * stride_xh, mask=mask_h & (t < t_end), other=0.0)
    while t < t_end:
        if NORM:
            xn = _norm_row(x_ptr, res_ptr, t + 1, stride_xt, stride_rt, offs_h, mask_h & (t + 1 < t_end), HAS_RES)
            tl.store(h_ptr + t * stride_ht + offs_h, xv, mask=mine)
            if ROUND_BEFORE_WEIGHT:
                yv = _normed_row(xv, nw, H, eps, True).to(y_ptr.dtype.element_ty)
                logit = tl.sum(wf * yv.to(tl.float32)[None, :], axis=1)
            else:
                hf = xv.to(tl.float32)
                # One reduction for the sum of squares and the products: logits = r * (w . (h * nw))
                # with r = rsqrt(sum(h^2) / H + eps), the norm's scale applied after the sum (the
                # fp32 normed row, before y's rounding). Each expert row reduces the same squares in
                # the same tree, so every lane of ss holds the same sum, and so does y's scale.
                squares = tl.broadcast_to((hf * hf)[None, :], wf.shape)
                acc, ss = tl.reduce((wf * (hf * nw)[None, :], squares), 1, add_pairs)
                r = tl.rsqrt(ss / H + eps)
                logit = acc * r
                yv = (hf * tl.max(r, axis=0) * nw).to(y_ptr.dtype.element_ty)
            tl.store(y_ptr + t * stride_yt + offs_h, yv, mask=mine)
        else:
            xn = tl.load(x_ptr + (t + 1) * stride_xt + offs_h * stride_xh, mask=mask_h & (t + 1 < t_end), other=0.0)
            logit = tl.sum(wf * xv.to(tl.float32)[None, :], axis=1)
        tl.store(logits_ptr + t * stride_lt + rows, logit, mask=mask_e)
        xv = xn
        t += 1


@triton.jit
def _order_key(v):
    """fp32 -> int32 whose signed order is v's order (-inf lowest; -0.0 sorts below +0.0, which
    sigmoid + bias cannot produce: s > 0)."""
    b = v.to(tl.int32, bitcast=True)
    return tl.where(b < 0, b ^ 0x7FFFFFFF, b)


def _warp_max_asm(pack: int) -> tuple[str, str]:
    """PTX for ``_tile_max`` on a thread's ``pack`` elements: their max, then the warp's max of
    those (``redux.sync``, one instruction where a shuffle tree takes five rounds), into every
    output."""
    ins = [f"${pack + i}" for i in range(pack)]
    body = "{ .reg .s32 m; mov.b32 m, " + ins[0] + "; " + "".join(f"max.s32 m, m, {x}; " for x in ins[1:])
    body += "redux.sync.max.s32 m, m, 0xffffffff; " + "".join(f"mov.b32 ${i}, m; " for i in range(pack)) + "}"
    return body, ",".join(["=r"] * pack + ["r"] * pack)


_MAX4, _CON4 = (tl.constexpr(x) for x in _warp_max_asm(4))
_MAX8, _CON8 = (tl.constexpr(x) for x in _warp_max_asm(8))
_MAX16, _CON16 = (tl.constexpr(x) for x in _warp_max_asm(16))


def redux_pack(rows: int, cols: int) -> int:
    """Elements a thread holds of a [rows, cols] tile (powers of two) on one warp, or 0 where
    ``_tile_max`` does not use redux.sync. From 128 elements up a blocked layout with 16-byte
    vectors along the row spreads the tile over the 32 lanes without replication, so each holds
    n / 32; a smaller tile may be replicated across lanes (a lane's elements are then not n / 32),
    and more than 512 is past the packs the helper has. tests/test_moe_kernels.py checks the
    selection at each pack on the GPU."""
    n = rows * cols
    return n // 32 if 128 <= n <= 512 else 0


@triton.jit
def _tile_max(v, PACK: tl.constexpr):
    """The max of the int32 tile v of one warp: a [rows, cols] tensor of it in every element
    with PACK > 0 (redux.sync over the lanes' maxima; PACK must be the elements a thread holds,
    ``redux_pack``), else a scalar (shuffle trees; the interpreter's path)."""
    if PACK == 4:
        return tl.inline_asm_elementwise(_MAX4, _CON4, [v], dtype=tl.int32, is_pure=True, pack=4)
    elif PACK == 8:
        return tl.inline_asm_elementwise(_MAX8, _CON8, [v], dtype=tl.int32, is_pure=True, pack=8)
    elif PACK == 16:
        return tl.inline_asm_elementwise(_MAX16, _CON16, [v], dtype=tl.int32, is_pure=True, pack=16)
    else:
        return tl.max(tl.max(v, axis=1), axis=0)


@triton.jit
def _fast_key(v, idx, valid, BITS: tl.constexpr):
    """int32 key of score v and index idx: the order key's high 32 - BITS bits, then the
    complement of idx in the low BITS bits (so the lowest index is the largest key among equal
    highs); INT32_MIN where not valid. Orders like (v, -idx) except between scores whose order
    keys agree above bit BITS: those compare by index alone (a near tie, checked by the caller)."""
    k = ((_order_key(v) >> BITS) << BITS) | ((1 << BITS) - 1 - idx)
    return tl.where(valid, k, -2147483648)


@triton.jit
def _kept_tile(kept, j, kvalid, logits_ptr, bias_ptr, row, GROUP_SIZE: tl.constexpr, SOFTMAX: tl.constexpr,
               row_max, row_sum):
    """The kept groups' members as a dense [KG_PAD, GS_PAD] tile (this warp's own loads, so L1
    hits): their expert ids, unbiased scores (the weights) and biased scores (the keys). SOFTMAX:
    the softmax probabilities (exp(l - row_max) / row_sum) and the logits as the keys."""
    kidx = tl.where(kvalid, kept[:, None] * GROUP_SIZE + j, 0)
    lg = tl.load(logits_ptr + row + kidx, mask=kvalid, other=0.0)
    if SOFTMAX:
        key = lg + 0.0                     # -0.0 -> +0.0: equal logits, equal keys
        s = tl.exp(key - row_max) / row_sum
    else:
        s = tl.sigmoid(lg)
        key = s + tl.load(bias_ptr + kidx, mask=kvalid, other=0.0).to(tl.float32)
    return kidx, s, key


@triton.jit
def _exact_picks(key, TOP_K: tl.constexpr):
    """The slot (0..TOP_K-1) of each of the TOP_K largest int64 keys of a 2-d tile, -1 elsewhere:
    repeated maxima, each winner removed by an equality test (the keys are distinct)."""
    lowest = -9223372036854775808
    rank = (key * 0 - 1).to(tl.int32)
    for i in tl.static_range(TOP_K):
        best = tl.max(tl.max(key, axis=1), axis=0)
        rank = tl.where(key == best, i, rank)
        key = tl.where(key == best, lowest, key)
    return rank


@triton.jit
def _picked_weights(rank, ks):
    """(the unbiased scores at the picked experts, 0 elsewhere; their sum in a fixed tree over the
    tile, the same for every row and every T)."""
    wsel = tl.where(rank >= 0, ks, 0.0)
    return wsel, tl.sum(tl.sum(wsel, axis=1), axis=0)


@triton.jit
def _moe_router_select_kernel(
    logits_ptr, bias_ptr, ids_ptr, wts_ptr, routed_scaling,
    stride_lt, stride_it, stride_wt,
    N_GROUP: tl.constexpr, GROUP_SIZE: tl.constexpr, TOPK_GROUP: tl.constexpr, TOP_K: tl.constexpr,
    RENORMALIZE: tl.constexpr, G_PAD: tl.constexpr, GS_PAD: tl.constexpr,
    KG_PAD: tl.constexpr, USE_GDC: tl.constexpr, G_BITS: tl.constexpr = 0, E_BITS: tl.constexpr = 0,
    PACK: tl.constexpr = 0, CHECK_TIES: tl.constexpr = True, SOFTMAX: tl.constexpr = False,
    ZERO_FILL: tl.constexpr = False,
):
    """Grouped top-k of row program_id(0) on a [G_PAD, GS_PAD] view of its logits.

    ZERO_FILL (naive.grouped_topk_reference's zero_fill): the dropped groups' experts compete with
    key 0.0. The kept tile's picks are that rule's picks whenever the last of them has a key > 0
    (every dropped expert ranks below it); otherwise (rare: biased scores <= 0) the row runs the
    exact int64 picks again over all E experts with the dropped ones at 0.0, and stores those.

    SOFTMAX (one group; naive.softmax_topk_reference): the keys are the logits themselves and
    the weights the softmax probabilities, over the row's max and sum of exp (computed here from
    the whole row before the picks); the bias is not read.

    With G_BITS and E_BITS (> 0: the bit lengths of G_PAD - 1 and E - 1) the picks first run on
    int32 keys (``_fast_key``: one compare per candidate where the exact key takes four; with
    PACK > 0 each expert pick is one redux.sync, ``_tile_max``), and the exact int64 picks run
    only when that could have decided differently: when the group scores on either side of the
    kept groups' boundary, or any two neighbours among the top_k + 1 expert picks, agree in
    their fast keys' high bits (ties, and scores within ~2^-(23 - E_BITS) of each other). Both
    paths give the exact rule's ids, so the bits never depend on the path.

    The exact rule: each candidate is one int64 key, (order key of its score) << 32 | (E - 1 -
    expert id), so a single max reduction yields the best score AND, among equal scores, the
    lowest id (the tie rule of naive.py); keys are distinct, so removing the winner is an
    equality test. KG_PAD = next_pow2(TOPK_GROUP): the rows of the kept groups' tile. Each pick
    records its rank at the candidate (``rank``), and the ids and weights are stored from there."""
    E: tl.constexpr = N_GROUP * GROUP_SIZE
    FAST: tl.constexpr = G_BITS > 0 and E_BITS > 0
    neg_inf = float("-inf")
    lowest = -9223372036854775808            # below every key (a key's high half is >= key(-inf))
    t = tl.program_id(0)
    g = tl.arange(0, G_PAD)[:, None]
    j = tl.arange(0, GS_PAD)[None, :]
    valid = (g < N_GROUP) & (j < GROUP_SIZE)
    eidx = tl.where(valid, g * GROUP_SIZE + j, 0)
    bias = tl.load(bias_ptr + eidx, mask=valid, other=0.0).to(tl.float32)   # producer-independent

    pdl_wait(USE_GDC)
    pdl_launch_dependents(USE_GDC)

    lg = tl.load(logits_ptr + t * stride_lt + eidx, mask=valid, other=0.0)
    if SOFTMAX:
        c = tl.where(valid, lg + 0.0, neg_inf)
        row_max = tl.max(tl.max(c, axis=1), axis=0)
        row_sum = tl.sum(tl.sum(tl.where(valid, tl.exp(c - row_max), 0.0), axis=1), axis=0)
    else:
        c = tl.where(valid, tl.sigmoid(lg) + bias, neg_inf)
        row_max = 0.0
        row_sum = 1.0
    # Group score: top-1 + top-2 of the group's values, where top-2 is top-1 again when top-1
    # occurs twice (the sum does not depend on which of two tied values is "first"). fp32 max
    # reductions: a third of the instructions of the int64 keys.
    m1 = tl.max(c, axis=1)
    twice = tl.sum((c == m1[:, None]).to(tl.int32), axis=1) > 1
    m2 = tl.where(twice, m1, tl.max(tl.where(c == m1[:, None], neg_inf, c), axis=1))
    gar = tl.arange(0, G_PAD)
    gscore = tl.where(gar < N_GROUP, m1 + m2, neg_inf)
    kg = tl.arange(0, KG_PAD)
    kvalid = (kg[:, None] < TOPK_GROUP) & (j < GROUP_SIZE)
    kept = tl.zeros([KG_PAD], dtype=tl.int32)
    rank = tl.full([KG_PAD, GS_PAD], -1, dtype=tl.int32)
    if FAST:
        # Kept groups: TOPK_GROUP + 1 picks; only the set matters (the expert keys carry ids), so
        # only the boundary between the last kept and the first dropped group must be strict.
        gfk = _fast_key(gscore, gar, gar < N_GROUP, G_BITS)
        hi_kept = 0
        for i in tl.static_range(TOPK_GROUP + 1):
            gb = tl.max(gfk, axis=0)
            if i < TOPK_GROUP:
                kept = tl.where(kg == i, (1 << G_BITS) - 1 - (gb & ((1 << G_BITS) - 1)), kept)
                hi_kept = gb >> G_BITS
            else:
                near = (gb >> G_BITS) == hi_kept
            gfk = tl.where(gfk == gb, -2147483648, gfk)
        # The picks walk the kept groups' members, topk_group / n_group of the keys (Ling-3:
        # half). TOP_K + 1 picks; each neighbour pair strictly ordered, or the exact path runs.
        kidx, ks, kc = _kept_tile(kept, j, kvalid, logits_ptr, bias_ptr, t * stride_lt, GROUP_SIZE, SOFTMAX,
                                   row_max, row_sum)
        fk = _fast_key(kc, kidx, kvalid, E_BITS)
        prev = fk    # only read from the second pick on
        ties = fk < fk   # all False, in fk's layout
        for i in tl.static_range(TOP_K + 1):
            fb = _tile_max(fk, PACK)
            if i < TOP_K:
                rank = tl.where(fk == fb, i, rank)
            if i > 0:
                ties = ties | ((fb >> E_BITS) == (prev >> E_BITS))
            prev = fb
            fk = tl.where(fk == fb, -2147483648, fk)
        # The weights' sum before the tie check's reduction, not after the branch: the two warp
        # reductions are independent and overlap. The exact path sums its own picks again.
        wsel, total = _picked_weights(rank, ks)
        # CHECK_TIES=False exists for the test that shows the check is needed.
        exact = (near | (tl.max(tl.max(ties.to(tl.int32), axis=1), axis=0) > 0)) & CHECK_TIES
    else:
        exact = True
        kidx = tl.zeros([KG_PAD, GS_PAD], dtype=tl.int32)
        ks = tl.zeros([KG_PAD, GS_PAD], dtype=tl.float32)
        kc = ks
        wsel = ks
        total = tl.sum(tl.sum(ks, axis=1), axis=0)
    if exact:
        gkey = (_order_key(gscore).to(tl.int64) << 32) | (G_PAD - 1 - gar).to(tl.int64)
        for i in tl.static_range(TOPK_GROUP):
            best = tl.max(gkey, axis=0)
            kept = tl.where(kg == i, (G_PAD - 1 - (best & 0x7FFFFFFF)).to(tl.int32), kept)
            gkey = tl.where(gkey == best, lowest, gkey)
        kidx, ks, kc = _kept_tile(kept, j, kvalid, logits_ptr, bias_ptr, t * stride_lt, GROUP_SIZE, SOFTMAX,
                                   row_max, row_sum)
        key = tl.where(kvalid, (_order_key(kc).to(tl.int64) << 32) | (E - 1 - kidx).to(tl.int64), lowest)
        rank = _exact_picks(key, TOP_K)
        wsel, total = _picked_weights(rank, ks)
    if ZERO_FILL:
        # The last pick's key (the smallest picked): above 0.0, no dropped expert could enter.
        last = tl.min(tl.min(tl.where(rank >= 0, kc, float("inf")), axis=1), axis=0)
        if last > 0.0:
            _store_picks(ids_ptr, wts_ptr, t, stride_it, stride_wt, rank, kidx, wsel, total, routed_scaling,
                         RENORMALIZE)
        else:
            member = tl.sum(((kept[None, :] == gar[:, None]) & (kg < TOPK_GROUP)[None, :]).to(tl.int32), axis=1)
            zkey = tl.where(member[:, None] > 0, c, 0.0) + 0.0      # + 0.0: -0.0 ranks equal to the fill
            key = tl.where(valid, (_order_key(zkey).to(tl.int64) << 32) | (E - 1 - eidx).to(tl.int64), lowest)
            zrank = _exact_picks(key, TOP_K)
            zw, ztotal = _picked_weights(zrank, tl.sigmoid(lg))
            _store_picks(ids_ptr, wts_ptr, t, stride_it, stride_wt, zrank, eidx, zw, ztotal, routed_scaling,
                         RENORMALIZE)
    else:
        _store_picks(ids_ptr, wts_ptr, t, stride_it, stride_wt, rank, kidx, wsel, total, routed_scaling, RENORMALIZE)


@triton.jit
def _store_picks(ids_ptr, wts_ptr, t, stride_it, stride_wt, rank, idx, wsel, total, routed_scaling,
                 RENORMALIZE: tl.constexpr):
    """Store the picks (rank >= 0 at a candidate: its slot) of row t: ids, and the weights
    renormalised by their sum ``total`` if asked, times routed_scaling."""
    picked = rank >= 0
    if RENORMALIZE:
        wsel = wsel / total
    wsel = wsel * routed_scaling
    tl.store(ids_ptr + t * stride_it + rank, idx, mask=picked)
    tl.store(wts_ptr + t * stride_wt + rank, wsel, mask=picked)


def select_fast(n_group: int, topk_group: int, group_size: int) -> dict:
    """The selection kernel's fast-path constants: the int32 keys' index bits (G_BITS, E_BITS)
    and redux.sync's PACK for the kept tile (0 under the interpreter, which runs no PTX)."""
    e_bits = max(1, (n_group * group_size - 1).bit_length())
    g_bits = max(1, (triton.next_power_of_2(n_group) - 1).bit_length())
    pack = 0 if interpreting() else redux_pack(triton.next_power_of_2(topk_group),
                                               triton.next_power_of_2(group_size))
    return dict(G_BITS=g_bits, E_BITS=e_bits, PACK=pack)


def router_block_e(num_experts: int, t: int = 1) -> int:
    """Experts per CTA for T token rows: at one row the smallest power of two that keeps the grid
    at <= 128 CTAs, at least 4 (E = 512: 4, 128 CTAs); above one row MANY_ROWS_BLOCK_E_FACTOR
    times that. At the fixed warps (router_num_warps of the one-row block) it changes which CTA
    computes a logit, not how: the compiler spreads a row's H over the same threads and warps
    when the block is at least 4 wide, so the bits do not change and it may depend on T (tests
    check 4, 8 and 16, and the Ling-3 shapes on the GPU). A narrower block can: at 2 experts and
    4 warps (H = 96) the layout splits H over more warps and the logits' last bits moved on an
    H200 (session 25), hence the floor of 4."""
    one_row = max(4, triton.next_power_of_2(triton.cdiv(num_experts, _TARGET_CTAS)))
    return one_row * (MANY_ROWS_BLOCK_E_FACTOR if t > 1 else 1)


def router_row_groups(t: int, groups: int | None = None) -> tuple[int, int]:
    """(programs along the rows, rows per program) for T token rows: at most ``groups`` (default
    ROW_GROUPS) programs per expert block, ceil(T / programs) rows each. The grouping decides
    which program reduces a row, never how (each row has the same arithmetic in any group), so
    it may depend on T without breaking batch invariance (a test checks the bits)."""
    return split_rows(t, ROW_GROUPS if groups is None else groups)


def router_num_warps(block_e: int, hidden: int) -> int:
    """Warps for a [block_e, next_pow2(hidden)] gate tile: ~64 elements per thread at most
    (Ling-3 bf16: [4, 4096] over 8 warps), so the tile and its fp32 copy stay in registers."""
    elems = block_e * triton.next_power_of_2(max(hidden, 1))
    return int(min(16, max(4, triton.next_power_of_2(triton.cdiv(elems, 64 * 32)))))


def _selection_outputs(t, top_k, dev, ids_out, weights_out) -> tuple[torch.Tensor, torch.Tensor]:
    """The selection's outputs (ids int32, weights fp32, [t, top_k], unit stride along top_k):
    the given buffers, checked, or new ones."""
    if ids_out is None:
        ids_out = torch.empty((t, top_k), device=dev, dtype=torch.int32)
    if weights_out is None:
        weights_out = torch.empty((t, top_k), device=dev, dtype=torch.float32)
    assert ids_out.shape == (t, top_k) and ids_out.dtype == torch.int32 and ids_out.stride(1) == 1
    assert weights_out.shape == (t, top_k) and weights_out.dtype == torch.float32 and weights_out.stride(1) == 1
    return ids_out, weights_out


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
    softmax: bool = False,
    ids_out: torch.Tensor | None = None,
    weights_out: torch.Tensor | None = None,
    logits_out: torch.Tensor | None = None,
    block_e: int | None = None,
    logits_warps: int | None = None,
    row_groups: int | None = None,
    use_pdl: bool | None = None,
    norm_weight: torch.Tensor | None = None,
    residual: torch.Tensor | None = None,
    eps: float = 0.0,
    y_out: torch.Tensor | None = None,
    h_out: torch.Tensor | None = None,
    round_before_weight: bool = False,
    zero_fill: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Launch on x [T, H], gate_w [E, H] (unit H stride), expert_bias fp32 [E]; returns
    (ids int32 [T, top_k], weights fp32 [T, top_k]) (naive.moe_router_reference; ``zero_fill``:
    its rule for the dropped groups).

    ``ids_out`` / ``weights_out`` may be given (tests pass poisoned buffers); ``logits_out``, an
    fp32 [T, E] contiguous buffer, is the workspace and exposes the logits to tests. ``block_e``
    overrides ``router_block_e``, ``logits_warps`` ``router_num_warps`` and ``row_groups``
    ``ROW_GROUPS`` (benchmarks.moe_sweep --set router); ``use_pdl`` defaults to ``pdl_supported(x.device)``.
    With ``norm_weight`` (``lingc.rmsnorm_router``) x is the sub-layer output: the logits kernel
    first forms h = residual + x and y = RMSNorm(h) * norm_weight (rmsnorm's math), routes y,
    and writes y and h into ``y_out`` / ``h_out`` ([T, H] of x.dtype, unit stride along H);
    ``round_before_weight``: y in the Llama form, routed as rounded (the kernel's docstring).
    Arguments are assumed validated by the op.
    """
    t, h = x.shape
    e = gate_w.shape[0]
    dev = x.device
    ids_out, weights_out = _selection_outputs(t, top_k, dev, ids_out, weights_out)
    if logits_out is None:
        logits_out = torch.empty((t, e), device=dev, dtype=torch.float32)
    assert logits_out.shape == (t, e) and logits_out.dtype == torch.float32 and logits_out.stride(1) == 1
    if t == 0:
        return ids_out, weights_out
    if use_pdl is None:
        use_pdl = pdl_supported(dev)
    # The warps are one row's (router_block_e(e)) at any T: the wider tile above one row keeps them.
    warps = logits_warps or router_num_warps(router_block_e(e), h)
    block_e = block_e or router_block_e(e, t)
    pdl = {"launch_pdl": True} if use_pdl else {}
    groups, rows = router_row_groups(t, row_groups)
    e_blocks = triton.cdiv(e, block_e)
    norm = norm_weight is not None
    if norm:
        assert y_out is not None and h_out is not None and y_out.stride(1) == 1 and h_out.stride(1) == 1
        assert x.stride(1) == 1 and (residual is None or residual.stride(1) == 1)
    # Absent norm operands: any pointer (their branch is compiled out).
    res_t = residual if residual is not None else x
    nw_t, y_t, h_t = (norm_weight, y_out, h_out) if norm else (x, x, x)
    _moe_router_logits_kernel[(e_blocks, groups)](
        x, gate_w, logits_out, t, rows, h,
        x.stride(0), x.stride(1), gate_w.stride(0), logits_out.stride(0),
        res_t, nw_t, y_t, h_t, res_t.stride(0), y_t.stride(0), h_t.stride(0), float(eps),
        triton.cdiv(h, e_blocks),
        E=e, BLOCK_E=block_e, BLOCK_H=triton.next_power_of_2(h), USE_GDC=use_pdl,
        NORM=norm, HAS_RES=residual is not None, ROUND_BEFORE_WEIGHT=bool(round_before_weight),
        num_warps=warps, **pdl,
    )
    _launch_select(logits_out, expert_bias, ids_out, weights_out, n_group, topk_group, top_k, routed_scaling,
                   renormalize, use_pdl, softmax, zero_fill)
    return ids_out, weights_out


def _launch_select(logits, expert_bias, ids_out, weights_out, n_group, topk_group, top_k, routed_scaling,
                   renormalize, use_pdl, softmax=False, zero_fill=False) -> None:
    """The selection kernel over fp32 logits [T, E] (unit stride along E): one one-warp CTA a row."""
    group_size = logits.shape[1] // n_group
    _moe_router_select_kernel[(logits.shape[0],)](
        logits, expert_bias, ids_out, weights_out, float(routed_scaling),
        logits.stride(0), ids_out.stride(0), weights_out.stride(0),
        N_GROUP=n_group, GROUP_SIZE=group_size, TOPK_GROUP=topk_group, TOP_K=top_k,
        RENORMALIZE=bool(renormalize), G_PAD=triton.next_power_of_2(n_group),
        GS_PAD=triton.next_power_of_2(group_size),
        KG_PAD=triton.next_power_of_2(topk_group), **select_fast(n_group, topk_group, group_size),
        USE_GDC=use_pdl, SOFTMAX=bool(softmax), ZERO_FILL=bool(zero_fill), num_warps=SELECT_WARPS, **({"launch_pdl": True} if use_pdl else {}),
        **register_cap(SELECT_MAXNREG),
    )


def moe_select_triton(
    logits: torch.Tensor,
    expert_bias: torch.Tensor,
    n_group: int,
    topk_group: int,
    top_k: int,
    routed_scaling: float,
    renormalize: bool,
    *,
    ids_out: torch.Tensor | None = None,
    weights_out: torch.Tensor | None = None,
    use_pdl: bool | None = None,
    zero_fill: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The router's selection alone on given fp32 logits [T, E] (unit stride along E): (ids int32
    [T, top_k], weights fp32 [T, top_k]) = grouped_topk_reference(sigmoid(logits), ...) with the
    kernel's tie rule. For prompt chunks, whose logits a library GEMM computes (thousands of rows:
    one CTA of one warp each). Arguments are assumed validated by the op."""
    t = logits.shape[0]
    ids_out, weights_out = _selection_outputs(t, top_k, logits.device, ids_out, weights_out)
    if t == 0:
        return ids_out, weights_out
    _launch_select(logits, expert_bias, ids_out, weights_out, n_group, topk_group, top_k, routed_scaling,
                   renormalize, pdl_supported(logits.device) if use_pdl is None else use_pdl, zero_fill=zero_fill)
    return ids_out, weights_out


def rmsnorm_router_triton(
    x: torch.Tensor,
    norm_weight: torch.Tensor,
    residual: torch.Tensor | None,
    eps: float,
    gate_w: torch.Tensor,
    expert_bias: torch.Tensor,
    n_group: int,
    topk_group: int,
    top_k: int,
    routed_scaling: float,
    renormalize: bool,
    round_before_weight: bool = False,
    zero_fill: bool = False,
    *,
    y_out: torch.Tensor | None = None,
    h_out: torch.Tensor | None = None,
    **launch,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(y, h, ids, weights) = rmsnorm(x, norm_weight, residual, eps) routed by moe_router, in the
    router's two launches (naive.rmsnorm_router_reference; ``round_before_weight``: its Llama
    form). ``launch``: moe_router_triton's keyword arguments (buffers, overrides, ``use_pdl``)."""
    if y_out is None:
        y_out = torch.empty_like(x, memory_format=torch.contiguous_format)
    if h_out is None:
        h_out = torch.empty_like(x, memory_format=torch.contiguous_format)
    ids, weights = moe_router_triton(x, gate_w, expert_bias, n_group, topk_group, top_k, routed_scaling,
                                     renormalize, norm_weight=norm_weight, residual=residual, eps=eps,
                                     y_out=y_out, h_out=h_out, round_before_weight=round_before_weight,
                                     zero_fill=zero_fill, **launch)
    return y_out, h_out, ids, weights
