"""Triton kernels behind ``lingc.sampled_targets`` (runtime/relay/ops.py; the reference is
runtime/relay/sampling.py): speculative sampling's outcome over the verify chain's logits in four
PDL-chained launches, with no sort.

What the reference does with a sort (the nucleus) and full-row cumulative sums, these find by a
radix search over order-preserving 32-bit keys of the logits. Row j's nucleus is every token
whose logit is at least x0_j, where x0_j is the smallest key x with M_j(x) < top_p * Z_j,
M_j(x) the unnormalised mass exp((l - m_j) / T) of the tokens with key > x (ties of equal logits
are kept or dropped together: the reference's definition). M is non-increasing in x, so x0 is
found one 8-bit digit at a time, most significant first: pass i sums, per chunk of the row, the
mass of the tokens whose key agrees with the prefix found so far, binned by their next digit (a
256-bin histogram, as batched tensor-core products of one-hot digit halves, a batch a warp, w
split in two tf32 parts: near-fp32 accuracy); the chunk that draws a row's last ticket sums the
chunks' bins and picks the digit. Four passes fix the 32 bits.

- ``PASS = 0`` also takes each chunk's max and sum of exp (relative to the chunk's max, rescaled
  at the row's reduction, like an online softmax): m_j and Z_j.
- ``PASS = 3`` keeps each chunk's histogram and its mass above the 24-bit prefix, so that for any
  final digit every chunk's kept mass is known; the chunk that draws the last ticket of the whole
  launch then finishes alone (``_finish``): the accept count a (d_{j+1} accepted while
  u_j < p_j(d_{j+1}), u the uniforms' row step % rows), the chunk of row a (less the rejected
  draft d_{a+1}) where the cumulative mass reaches (1 - u_S) of its total, one scan of that chunk
  for the token, and y.
- ``top_p >= 1`` (no nucleus): passes 1-3 exit after their wait and one program of pass 3
  finishes from pass 0's chunk sums. ``top_p`` None (``NO_NUCLEUS``: no nucleus, known at
  launch) launches pass 0 alone, whose last row to be decided finishes: one launch instead of
  four.
- Sampled drafts (``DRAFT_Q``, the draft's logits q_ptr [N - 1, V]): q has the same nucleus rule
  (pick_token's distribution over the draft's logits), so the draft rows are rows N..2N-2 of the
  same search (``RA`` = 2N - 1 rows in every pass: m, Z, the cut and the kept mass of q_j as of
  p_j); the finish accepts while u_j q_j(d) < p_j(d) and only writes a and y below it; ``PASS =
  4`` (a launch over row a's chunks) sums the residual max(0, p_a - q_a) per chunk, and the chunk
  drawing its last ticket picks the chunk and scans it for the token.

Rounding: the sums run in another order than the reference's (and as two tf32 parts), so a token whose
nucleus boundary or cumulative mass lies within fp32 rounding of the cut may be decided the other
way; the distribution is the reference's to that rounding. The same holds between a sampled
draft's own draw (one row, cut into more chunks) and verify's search of its row: q's cut and sum
agree with the draw's to fp32 rounding. Ties and zero-mass tokens follow the
reference's rules exactly (a token without mass is never drawn).

Scratch (per call, from the allocator: a captured graph keeps it): per-chunk maxima and sums,
histograms and above-masses, per-row m, Z, A (the mass above the prefix), the kept mass Z_kept,
the prefix and last digit, for every row searched (the draft rows too). Tickets: one per row and
one for the launch (and pass 4's), in a persistent zeroed
buffer that the last arrivals reset (``gemm_common.persistent_buffer``). Pass i + 1 reads what
the last arrivals of pass i wrote after its wait; every pass waits, then releases its dependents
(``pdl_wait_then_release``).
"""
from __future__ import annotations

import math
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from lingc.runtime.kernels.gemm_common import persistent_buffer
from lingc.runtime.pdl import interpreting, pdl_supported, pdl_wait_then_release

__all__ = ["sampled_targets_triton", "MAX_ROWS", "chunking", "scratch", "searched_rows", "passes", "launch_pass"]

MAX_ROWS = 32           # chain positions (S + 1) a launch takes: tickets and the finish's vectors
MAX_CHUNKS = 64         # chunks a row is cut into (the row reductions load [chunks, 256] at once)
_TICKETS = 72           # row tickets (2 MAX_ROWS - 1 with the draft's rows) + the launch's and pass 4's
_FLOOR = tl.constexpr(-1.0e30)   # a finite "minus infinity" for running maxima (no inf - inf)


@triton.jit
def _keys(l):
    """uint32 keys ordered as the fp32 values l (-0.0 and +0.0 one key)."""
    b = l.to(tl.uint32, bitcast=True)
    k = tl.where((b >> 31) != 0, b ^ 0xFFFFFFFF, b | 0x80000000)
    return tl.where(l == 0.0, 0x80000000, k).to(tl.uint32)


@triton.jit
def _load_row(base, qbase, r, N: tl.constexpr, idx, mask, DRAFT_Q: tl.constexpr):
    """fp32 logits of searched row r at idx (-inf where masked): the target's row r (at base),
    or with sampled drafts the draft's row r - N for r >= N (at qbase; each load masked off on
    the other kind)."""
    if DRAFT_Q:
        lp = tl.load(base + idx, mask=mask & (r < N), other=float("-inf")).to(tl.float32)
        lq = tl.load(qbase + idx, mask=mask & (r >= N), other=float("-inf")).to(tl.float32)
        return tl.where(r >= N, lq, lp)
    else:
        return tl.load(base + idx, mask=mask, other=float("-inf")).to(tl.float32)


@triton.jit
def _digit_hist(key, w, SHIFT: tl.constexpr):
    """[B, 16, 16] masses of w [B, KB] binned by the 8-bit digit (key >> SHIFT) & 255, as
    [batch, hi nibble, lo nibble]: summed over the batch, the sub-block's histogram.

    Batched tensor-core products, one batch a warp: a [16, SUB] x [SUB, 16] product put every
    warp through SUB / 8 dependent MMA steps (128 MMAs a thread a sub-block of 256, session 58);
    split into B batches of KB columns each warp runs KB / 8. Two tf32 products: w's top 11
    significant bits (exact in tf32), then the rest (rounded to tf32: 2^-22 of w), against the
    exact one-hot digits. Triton's own tf32x3 does the same with a third product, but its code
    for this shape spilled (32 registers, 9 KB of stack: ptxas -v, session 57)."""
    d = (key >> SHIFT) & 255
    r = tl.arange(0, 16)
    w_hi = (w.to(tl.uint32, bitcast=True) & 0xFFFFE000).to(tl.float32, bitcast=True)
    hit = (d >> 4)[:, None, :] == r[None, :, None]
    b = tl.where((d & 15)[:, :, None] == r[None, None, :], 1.0, 0.0)
    acc = tl.dot(tl.where(hit, w_hi[:, None, :], 0.0), b, input_precision="tf32")
    return tl.dot(tl.where(hit, (w - w_hi)[:, None, :], 0.0), b, acc, input_precision="tf32")


@triton.jit
def _pick_digit(h, above_prefix, goal):
    """The smallest digit d with M(prefix.d.ff..) < goal, the mass above prefix.d.ff.. and the
    mass at or above prefix.d.00.. (h [256]: the in-prefix mass per digit)."""
    d = tl.arange(0, 256)
    suffix = tl.cumsum(h, 0, reverse=True)                  # mass of digits >= d
    above = above_prefix + (suffix - h)                     # digits > d
    best = tl.min(tl.where(above < goal, d, 255), 0)
    sel = d == best
    return best, tl.sum(tl.where(sel, above, 0.0), 0), tl.sum(tl.where(sel, above_prefix + suffix, 0.0), 0)


@triton.jit
def _store_hist(ptr, acc):
    """Store a [16, 16] histogram as 256 bins in digit order (hi nibble * 16 + lo)."""
    r = tl.arange(0, 16)
    tl.store(ptr + r[:, None] * 16 + r[None, :], acc)


@triton.jit
def _load_hists(hist_ptr, row, C, CP: tl.constexpr, mask_e):
    """The [CP, 256] per-chunk histograms of one row (chunks >= C and digits outside mask_e: 0)."""
    cc = tl.arange(0, CP)
    e = tl.arange(0, 256)
    ptrs = hist_ptr + (row * CP + cc[:, None]) * 256 + e[None, :]
    return tl.load(ptrs, mask=(cc < C)[:, None] & mask_e[None, :], other=0.0, cache_modifier=".cg")


@triton.jit
def _row_dist(rowf_ptr, rowi_ptr, row, mask, nucleus):
    """Searched row(s) `row`'s m, the mass its draw normalises by (Z_kept with a nucleus, else Z)
    and its cut x0 (0: every key), as the row reductions stored them (masked: 0, 1, 0)."""
    m = tl.load(rowf_ptr + row * 4, mask=mask, other=0.0, cache_modifier=".cg")
    if nucleus:
        zk = tl.load(rowf_ptr + row * 4 + 3, mask=mask, other=1.0, cache_modifier=".cg")
        x0 = tl.load(rowi_ptr + row * 2, mask=mask, other=0, cache_modifier=".cg").to(tl.uint32, bitcast=True)
    else:
        zk = tl.load(rowf_ptr + row * 4 + 1, mask=mask, other=1.0, cache_modifier=".cg")
        x0 = tl.zeros_like(m).to(tl.uint32)
    return m, zk, x0


@triton.jit
def _finish(logits_ptr, stride_l, chain_ptr, stride_c, u_ptr, step_ptr, R, stride_u, y_ptr, stats_ptr, hist_ptr,
            above_ptr, rowf_ptr, rowi_ptr, q_ptr, stride_q, a_ptr, T, V, C, NUCLEUS: tl.constexpr,
            N: tl.constexpr, NP: tl.constexpr, CP: tl.constexpr, SUB: tl.constexpr, ITERS: tl.constexpr,
            DRAFT_Q: tl.constexpr):
    """Accept count, the drawn token of row a and y (one program, after every row is decided).
    Sampled drafts (DRAFT_Q): the accept count and y below it only; pass 4 draws row a's token
    from the residual."""
    rows = tl.arange(0, NP)
    draft_row = rows < N - 1
    d_next = tl.load(chain_ptr + (rows + 1) * stride_c, mask=draft_row, other=0)
    m_r, zk_r, x0_r = _row_dist(rowf_ptr, rowi_ptr, rows, rows < N, NUCLEUS)
    l_d = tl.load(logits_ptr + rows * stride_l + d_next, mask=draft_row, other=0.0).to(tl.float32)
    p = tl.where(_keys(l_d) >= x0_r, tl.exp((l_d - m_r) / T) / zk_r, 0.0)
    u_row = tl.load(step_ptr) % R
    u = tl.load(u_ptr + u_row * stride_u + rows, mask=rows < N, other=0.0)
    if DRAFT_Q:
        mq_r, zq_r, x0q_r = _row_dist(rowf_ptr, rowi_ptr, N + rows, draft_row, NUCLEUS)   # q_j: row N + j
        ql_d = tl.load(q_ptr + rows * stride_q + d_next, mask=draft_row, other=0.0).to(tl.float32)
        q_d = tl.where(_keys(ql_d) >= x0q_r, tl.exp((ql_d - mq_r) / T) / zq_r, 0.0)
        miss = draft_row & ~(u * q_d < p)                    # accepted with probability min(1, p / q)
    else:
        miss = draft_row & ~(u < p)
    a = tl.min(tl.where(miss, rows, N - 1), 0)               # the first rejection, or S
    if DRAFT_Q:
        tl.store(y_ptr + rows, d_next, mask=rows < a)
        tl.store(a_ptr, a)
    else:
        _draw_point_mass(logits_ptr, stride_l, rowf_ptr, rowi_ptr, stats_ptr, hist_ptr, above_ptr, y_ptr, rows,
                         d_next, u, a, T, V, C, NUCLEUS, N, CP, SUB, ITERS)


@triton.jit
def _draw_point_mass(logits_ptr, stride_l, rowf_ptr, rowi_ptr, stats_ptr, hist_ptr, above_ptr, y_ptr, rows, d_next, u,
                     a, T, V, C, NUCLEUS: tl.constexpr, N: tl.constexpr, CP: tl.constexpr, SUB: tl.constexpr,
                     ITERS: tl.constexpr):
    """Greedy drafts: row a's token from p_a less the rejected d_{a+1} (by pass 3's chunk masses),
    and y."""
    u_last = tl.sum(tl.where(rows == N - 1, u, 0.0), 0)

    m_a = tl.load(rowf_ptr + a * 4, cache_modifier=".cg")
    CHUNK: tl.constexpr = SUB * ITERS
    cc = tl.arange(0, CP)
    if NUCLEUS:
        x0 = tl.load(rowi_ptr + a * 2, cache_modifier=".cg").to(tl.uint32, bitcast=True)
        last_digit = tl.load(rowi_ptr + a * 2 + 1, cache_modifier=".cg")
        h = _load_hists(hist_ptr, a, C, CP, tl.arange(0, 256) >= last_digit)
        kept = tl.load(above_ptr + a * CP + cc, mask=cc < C, other=0.0, cache_modifier=".cg") + tl.sum(h, 1)
    else:
        x0 = tl.zeros((), dtype=tl.uint32)
        m_c = tl.load(stats_ptr + (a * CP + cc) * 2, mask=cc < C, other=_FLOOR, cache_modifier=".cg")
        s_c = tl.load(stats_ptr + (a * CP + cc) * 2 + 1, mask=cc < C, other=0.0, cache_modifier=".cg")
        kept = s_c * tl.exp((m_c - m_a) / T)
    # The rejected draft d_{a+1} has no mass in the residual.
    drop = tl.sum(tl.where(rows == a, d_next, 0), 0)
    drop = tl.where(a < N - 1, drop, -1)
    l_drop = tl.load(logits_ptr + a * stride_l + tl.maximum(drop, 0)).to(tl.float32)
    w_drop = tl.where((drop >= 0) & (_keys(l_drop) >= x0), tl.exp((l_drop - m_a) / T), 0.0)
    kept = tl.maximum(kept - tl.where(cc == drop // CHUNK, w_drop, 0.0), 0.0)
    c_star, local_goal = _pick_chunk(kept, u_last, CP)
    # p's weights unnormalised (zk = 1: the chunk masses' scale), no q.
    token = _scan_chunk(logits_ptr + a * stride_l, logits_ptr, c_star, local_goal, V, x0, m_a, 1.0, 0.0, 1.0, x0,
                        False, drop, False, T, SUB, ITERS)
    y = tl.where(rows < a, d_next, token)
    tl.store(y_ptr + rows, y, mask=rows < N)


@triton.jit
def _pick_chunk(kept, u_last, CP: tl.constexpr):
    """The chunk where the cumulative mass of kept [CP] reaches (1 - u_last) of its total, and
    the mass still to go inside it."""
    cc = tl.arange(0, CP)
    goal = (1.0 - u_last) * tl.sum(kept, 0)
    cum = tl.cumsum(kept, 0)
    live = kept > 0.0
    c_star = tl.min(tl.where((cum >= goal) & live, cc, CP), 0)
    c_star = tl.where(c_star < CP, c_star, tl.max(tl.where(live, cc, 0), 0))   # rounding: the last live chunk
    return c_star, goal - tl.sum(tl.where(cc == c_star, cum - kept, 0.0), 0)


@triton.jit
def _scan_chunk(base, qbase, c_star, local_goal, V, x0, m, zk, mq, zq, x0q, has_q, drop, use_res, T,
                SUB: tl.constexpr, ITERS: tl.constexpr):
    """The token of chunk c_star where the running weight (_residual_weights) reaches
    local_goal (rounding short of it: the chunk's last token with weight)."""
    CHUNK: tl.constexpr = SUB * ITERS
    offs = tl.arange(0, SUB)
    seen = tl.zeros((), dtype=tl.float32)
    found = tl.full((), 2147483647, tl.int32)
    last_live = tl.full((), -1, tl.int32)
    for it in range(ITERS):
        idx = c_star * CHUNK + it * SUB + offs
        l = tl.load(base + idx, mask=idx < V, other=float("-inf")).to(tl.float32)
        ql = tl.load(qbase + idx, mask=(idx < V) & has_q, other=0.0).to(tl.float32)
        w = _residual_weights(l, ql, idx, V, x0, m, zk, mq, zq, x0q, has_q, drop, use_res, T)
        cs = seen + tl.cumsum(w, 0)
        found = tl.minimum(found, tl.min(tl.where((cs >= local_goal) & (w > 0.0), idx, 2147483647), 0))
        last_live = tl.maximum(last_live, tl.max(tl.where(w > 0.0, idx, -1), 0))
        seen += tl.sum(w, 0)
    return tl.where(found < 2147483647, found, last_live).to(tl.int64)


@triton.jit
def _residual_weights(l, ql, idx, V, x0, m, zk, mq, zq, x0q, has_q, drop, use_res, T):
    """Row a's draw weights at tokens idx: the residual max(0, p - q) (q = 0 past the drafts:
    p itself), or p less the rejected draft where the residual has no mass (use_res False)."""
    p = tl.where((idx < V) & (_keys(l) >= x0), tl.exp((l - m) / T) / zk, 0.0)
    q = tl.where(has_q & (_keys(ql) >= x0q), tl.exp((ql - mq) / T) / zq, 0.0)
    w = tl.where(use_res, tl.maximum(p - q, 0.0), p)
    return tl.where(idx == drop, 0.0, w)


@triton.jit
def _residual_pass(logits_ptr, stride_l, chain_ptr, stride_c, u_ptr, step_ptr, R, stride_u, y_ptr, rowf_ptr, rowi_ptr,
                   ticket_ptr, q_ptr, stride_q, a_ptr, res_ptr, T, nucleus, V, C, c, N: tl.constexpr,
                   NP: tl.constexpr, CP: tl.constexpr, SUB: tl.constexpr, ITERS: tl.constexpr, RA: tl.constexpr):
    """Pass 4 (sampled drafts): chunk c of row a's residual mass and its p-less-draft mass; the
    program drawing the last ticket picks the chunk by (1 - u_S) of the total and scans it."""
    a = tl.load(a_ptr, cache_modifier=".cg")
    has_q = a < N - 1
    m, zk, x0 = _row_dist(rowf_ptr, rowi_ptr, a, a >= 0, nucleus)
    a_q = tl.minimum(a, N - 2)                                   # a real row of q (unused when not has_q)
    a_q = tl.maximum(a_q, 0)
    mq, zq, x0q = _row_dist(rowf_ptr, rowi_ptr, N + a_q, has_q, nucleus)
    drop = tl.load(chain_ptr + (a + 1) * stride_c, mask=has_q, other=-1)
    CHUNK: tl.constexpr = SUB * ITERS
    offs = tl.arange(0, SUB)
    base = logits_ptr + a * stride_l
    qbase = q_ptr + a_q * stride_q
    res = tl.zeros((), dtype=tl.float32)
    pmd = tl.zeros((), dtype=tl.float32)
    for it in range(ITERS):
        idx = c * CHUNK + it * SUB + offs
        l = tl.load(base + idx, mask=idx < V, other=float("-inf")).to(tl.float32)
        ql = tl.load(qbase + idx, mask=(idx < V) & has_q, other=0.0).to(tl.float32)
        res += tl.sum(_residual_weights(l, ql, idx, V, x0, m, zk, mq, zq, x0q, has_q, drop, True, T), 0)
        pmd += tl.sum(_residual_weights(l, ql, idx, V, x0, m, zk, mq, zq, x0q, has_q, drop, False, T), 0)
    tl.store(res_ptr + c * 2, res)
    tl.store(res_ptr + c * 2 + 1, pmd)
    tl.debug_barrier()
    ticket = tl.atomic_add(ticket_ptr + RA + 1, 1, sem="acq_rel", scope="gpu")
    if ticket == C - 1:
        cc = tl.arange(0, CP)
        res_c = tl.load(res_ptr + cc * 2, mask=cc < C, other=0.0, cache_modifier=".cg")
        pmd_c = tl.load(res_ptr + cc * 2 + 1, mask=cc < C, other=0.0, cache_modifier=".cg")
        use_res = tl.sum(res_c, 0) > 0.0
        kept = tl.where(use_res, res_c, pmd_c)
        u_row = tl.load(step_ptr) % R
        c_star, local_goal = _pick_chunk(kept, tl.load(u_ptr + u_row * stride_u + N - 1), CP)
        token = _scan_chunk(base, qbase, c_star, local_goal, V, x0, m, zk, mq, zq, x0q, has_q, drop, use_res, T,
                            SUB, ITERS)
        rows = tl.arange(0, NP)
        tl.store(y_ptr + rows, tl.zeros((NP,), dtype=tl.int64) + token, mask=(rows >= a) & (rows < N))
        tl.atomic_xchg(ticket_ptr + RA + 1, 0, sem="relaxed", scope="gpu")


@triton.jit
def _nucleus_pass_kernel(logits_ptr, stride_l, chain_ptr, stride_c, u_ptr, step_ptr, R, stride_u, temp_ptr, top_p_ptr,
                         y_ptr, stats_ptr, hist_ptr, above_ptr, rowf_ptr, rowi_ptr, ticket_ptr, q_ptr, stride_q,
                         a_ptr, res_ptr, V, C,
                         PASS: tl.constexpr, N: tl.constexpr, NP: tl.constexpr, CP: tl.constexpr,
                         SUB: tl.constexpr, ITERS: tl.constexpr, B: tl.constexpr, USE_GDC: tl.constexpr,
                         DRAFT_Q: tl.constexpr, NO_NUCLEUS: tl.constexpr, RA: tl.constexpr):
    r = tl.program_id(0)
    c = tl.program_id(1)
    pdl_wait_then_release(USE_GDC)
    T = tl.load(temp_ptr).to(tl.float32)
    if NO_NUCLEUS:
        # top_p None: no nucleus, known at launch; pass 0 finishes (passes 1-3 are not launched).
        top_p = 1.0
        nucleus = False
    else:
        top_p = tl.load(top_p_ptr).to(tl.float32)
        nucleus = top_p < 1.0
    CHUNK: tl.constexpr = SUB * ITERS
    KB: tl.constexpr = SUB // B
    offs = tl.arange(0, B)[:, None] * KB + tl.arange(0, KB)[None, :]     # a sub-block as [B, KB]
    base = logits_ptr + r * stride_l
    qbase = q_ptr + (r - N) * stride_q          # rows r >= N with sampled drafts (unused without)
    start = c * CHUNK
    if PASS == 0:
        # Chunk max and sum of exp, with the first digit's histogram (a nucleus only), in one
        # online sweep; each sub-block's load is issued before the previous one's products.
        m_run = tl.full((), _FLOOR, tl.float32)
        s = tl.zeros((), dtype=tl.float32)
        acc = tl.zeros((B, 16, 16), dtype=tl.float32)
        l_next = _load_row(base, qbase, r, N, start + offs, start + offs < V, DRAFT_Q)
        for it in range(ITERS):
            l = l_next
            idx = start + (it + 1) * SUB + offs
            l_next = _load_row(base, qbase, r, N, idx, (idx < V) & (it + 1 < ITERS), DRAFT_Q)
            m_new = tl.maximum(m_run, tl.max(tl.max(l, 1), 0))
            scale = tl.exp((m_run - m_new) / T)
            w = tl.exp((l - m_new) / T)
            s = s * scale + tl.sum(tl.sum(w, 1), 0)
            if nucleus:
                acc = acc * scale + _digit_hist(_keys(l), w, 24)
            m_run = m_new
        tl.store(stats_ptr + (r * CP + c) * 2, m_run)
        tl.store(stats_ptr + (r * CP + c) * 2 + 1, s)
        if nucleus:
            _store_hist(hist_ptr + (r * CP + c) * 256, tl.sum(acc, 0))
        tl.debug_barrier()
        ticket = tl.atomic_add(ticket_ptr + r, 1, sem="acq_rel", scope="gpu")
        if ticket == C - 1:
            cc = tl.arange(0, CP)
            m_c = tl.load(stats_ptr + (r * CP + cc) * 2, mask=cc < C, other=_FLOOR, cache_modifier=".cg")
            s_c = tl.load(stats_ptr + (r * CP + cc) * 2 + 1, mask=cc < C, other=0.0, cache_modifier=".cg")
            m = tl.max(m_c, 0)
            f = tl.exp((m_c - m) / T)
            z = tl.sum(s_c * f, 0)
            tl.store(rowf_ptr + r * 4, m)
            tl.store(rowf_ptr + r * 4 + 1, z)
            if nucleus:
                h = tl.sum(_load_hists(hist_ptr, r, C, CP, tl.arange(0, 256) >= 0) * f[:, None], 0)
                digit, above, kept = _pick_digit(h, 0.0, top_p * z)
                tl.store(rowf_ptr + r * 4 + 2, above)
                tl.store(rowi_ptr + r * 2, digit.to(tl.int32))
            tl.atomic_xchg(ticket_ptr + r, 0, sem="relaxed", scope="gpu")      # ready for the next pass
            if NO_NUCLEUS:
                # The row's m and Z are stored; the last row decided finishes the launch.
                tl.debug_barrier()
                done = tl.atomic_add(ticket_ptr + RA, 1, sem="acq_rel", scope="gpu")
                if done == RA - 1:
                    _finish(logits_ptr, stride_l, chain_ptr, stride_c, u_ptr, step_ptr, R, stride_u, y_ptr, stats_ptr,
                            hist_ptr, above_ptr, rowf_ptr, rowi_ptr, q_ptr, stride_q, a_ptr, T, V, C, False,
                            N, NP, CP, SUB, ITERS, DRAFT_Q)
                    tl.atomic_xchg(ticket_ptr + RA, 0, sem="relaxed", scope="gpu")
    elif PASS == 4:
        _residual_pass(logits_ptr, stride_l, chain_ptr, stride_c, u_ptr, step_ptr, R, stride_u, y_ptr, rowf_ptr,
                       rowi_ptr, ticket_ptr, q_ptr, stride_q, a_ptr, res_ptr, T, nucleus, V, C, c, N, NP,
                       CP, SUB, ITERS, RA)
    else:
        if nucleus:
            m = tl.load(rowf_ptr + r * 4, cache_modifier=".cg")
            z = tl.load(rowf_ptr + r * 4 + 1, cache_modifier=".cg")
            above_prefix = tl.load(rowf_ptr + r * 4 + 2, cache_modifier=".cg")
            prefix = tl.load(rowi_ptr + r * 2, cache_modifier=".cg").to(tl.uint32, bitcast=True)
            SHIFT: tl.constexpr = 24 - 8 * PASS
            acc = tl.zeros((B, 16, 16), dtype=tl.float32)
            above_chunk = tl.zeros((), dtype=tl.float32)
            l_next = _load_row(base, qbase, r, N, start + offs, start + offs < V, DRAFT_Q)
            for it in range(ITERS):
                l = l_next
                idx = start + (it + 1) * SUB + offs
                l_next = _load_row(base, qbase, r, N, idx, (idx < V) & (it + 1 < ITERS),
                                   DRAFT_Q)
                key = _keys(l)
                w = tl.exp((l - m) / T)
                high = key >> (SHIFT + 8)
                acc += _digit_hist(key, tl.where(high == prefix, w, 0.0), SHIFT)
                if PASS == 3:
                    above_chunk += tl.sum(tl.sum(tl.where(high > prefix, w, 0.0), 1), 0)
            _store_hist(hist_ptr + (r * CP + c) * 256, tl.sum(acc, 0))
            if PASS == 3:
                tl.store(above_ptr + r * CP + c, above_chunk)
            tl.debug_barrier()
            ticket = tl.atomic_add(ticket_ptr + r, 1, sem="acq_rel", scope="gpu")
            if ticket == C - 1:
                h = tl.sum(_load_hists(hist_ptr, r, C, CP, tl.arange(0, 256) >= 0), 0)
                digit, above, kept = _pick_digit(h, above_prefix, top_p * z)
                tl.store(rowf_ptr + r * 4 + 2, above)
                tl.store(rowi_ptr + r * 2, ((prefix << 8) | digit.to(tl.uint32)).to(tl.int32, bitcast=True))
                tl.atomic_xchg(ticket_ptr + r, 0, sem="relaxed", scope="gpu")
                if PASS == 3:
                    tl.store(rowf_ptr + r * 4 + 3, kept)
                    tl.store(rowi_ptr + r * 2 + 1, digit.to(tl.int32))
                    tl.debug_barrier()
                    done = tl.atomic_add(ticket_ptr + RA, 1, sem="acq_rel", scope="gpu")
                    if done == RA - 1:
                        _finish(logits_ptr, stride_l, chain_ptr, stride_c, u_ptr, step_ptr, R, stride_u, y_ptr,
                                stats_ptr, hist_ptr, above_ptr, rowf_ptr, rowi_ptr, q_ptr, stride_q, a_ptr,
                                T, V, C, True, N, NP, CP, SUB, ITERS, DRAFT_Q)
                        tl.atomic_xchg(ticket_ptr + RA, 0, sem="relaxed", scope="gpu")
        else:
            if PASS == 3:
                if (r == 0) & (c == 0):
                    _finish(logits_ptr, stride_l, chain_ptr, stride_c, u_ptr, step_ptr, R, stride_u, y_ptr,
                            stats_ptr, hist_ptr, above_ptr, rowf_ptr, rowi_ptr, q_ptr, stride_q, a_ptr,
                            T, V, C, False, N, NP, CP, SUB, ITERS, DRAFT_Q)


def chunking(rows: int, vocab: int, sms: int, sub: int | None = None) -> tuple[int, int, int]:
    """(SUB, ITERS, chunks) for a launch over rows x vocab on a GPU of `sms` SMs: about one
    program per SM in all, each a chunk of ITERS x SUB logits, at most MAX_CHUNKS chunks a row.
    SUB = 256 keeps a pass's two [16, SUB] x [SUB, 16] products in registers (no spill, tested
    by ptxas in tests/test_sampled_targets.py)."""
    if sub is None:
        sub = 256 if vocab >= 4096 else max(16, triton.next_power_of_2(max(1, vocab // 4)))
    per_row = max(1, min(MAX_CHUNKS, sms // rows))
    iters = max(1, math.ceil(math.ceil(vocab / per_row) / sub))
    while math.ceil(vocab / (sub * iters)) > MAX_CHUNKS:
        iters += 1
    return sub, iters, math.ceil(vocab / (sub * iters))


def batches(sub: int) -> int:
    """Warps' batches of a sub-block's histogram product: 8 (one a warp), each at least 16
    columns wide (tl.dot's least K)."""
    return max(1, min(8, sub // 16))


def searched_rows(n: int, draft: bool) -> int:
    """Rows the radix search runs over for a chain of n positions: the target's n, and with
    sampled drafts the draft's n - 1 after them (q has p's nucleus rule)."""
    return 2 * n - 1 if draft else n


class Scratch(NamedTuple):
    """The passes' scratch (module docstring) for ra searched rows (``searched_rows``) cut into
    chunks of CP (a power of two >= the chunks); (accept, res) only hold data with sampled
    drafts."""
    cp: int
    stats: torch.Tensor         # fp32 [ra, CP, 2]  per-chunk max and sum of exp
    hist: torch.Tensor          # fp32 [ra, CP, 256] per-chunk digit histograms
    above: torch.Tensor         # fp32 [ra, CP]     per-chunk mass above the 24-bit prefix
    rowf: torch.Tensor          # fp32 [ra, 4]      m, Z, the mass above the prefix, Z_kept
    rowi: torch.Tensor          # int32 [ra, 2]     the key prefix (then x0), the last digit
    tickets: torch.Tensor       # int32 [_TICKETS] persistent, zeroed by the last arrivals
    accept: torch.Tensor        # int32 [1]         the accept count a (sampled drafts)
    res: torch.Tensor           # fp32 [CP, 2]      row a's residual and p-less-draft mass per chunk


def scratch(ra: int, chunks: int, device, draft: bool = False) -> Scratch:
    """draft: allocate the sampled drafts' buffers too (without, their fields alias buffers of
    the same dtype that DRAFT_Q's compiled-out code never reaches)."""
    cp = max(2, triton.next_power_of_2(chunks))
    f32 = dict(dtype=torch.float32, device=device)
    stats, rowf, rowi = torch.empty((ra, cp, 2), **f32), torch.empty((ra, 4), **f32), \
        torch.empty((ra, 2), dtype=torch.int32, device=device)
    if draft:
        accept, res = torch.empty((1,), dtype=torch.int32, device=device), torch.empty((cp, 2), **f32)
    else:
        accept, res = rowi, stats
    return Scratch(cp, stats, torch.empty((ra, cp, 256), **f32), torch.empty((ra, cp), **f32), rowf, rowi,
                   persistent_buffer("sampled_targets_tickets", device, _TICKETS, torch.int32, 0), accept, res)


def pass_warps(p: int) -> int:
    """Warps a program of pass p: 8 for the histogram passes; 4 for pass 4, whose one-row scan
    ptxas fits in 35 registers there and spilled at 8 warps (32 registers, sm_90)."""
    return 4 if p == 4 else 8


def passes(no_nucleus: bool, draft: bool) -> tuple[int, ...]:
    """The passes a call launches: the radix search's four, or pass 0 alone when top_p is None
    (no nucleus: pass 0's last row finishes), and pass 4 with sampled drafts."""
    return ((0,) if no_nucleus else (0, 1, 2, 3)) + ((4,) if draft else ())


def launch_pass(p: int, s: Scratch, chunks: int, sub: int, iters: int, chain, logits, uniforms, step, temperature,
                top_p, y, draft_logits=None, use_gdc: bool = False, num_warps: int | None = None) -> None:
    """Launch pass p (0..3, and 4 with draft_logits) over the op's arguments (benchmarks time
    the passes one by one through this). top_p None: no nucleus, pass 0 finishes (``passes``)."""
    n, vocab = logits.shape
    q = logits if draft_logits is None else draft_logits
    ra = searched_rows(n, draft_logits is not None)
    grid = (1, chunks) if p == 4 else (ra, chunks)
    _nucleus_pass_kernel[grid](
        logits, logits.stride(0), chain, chain.stride(0), uniforms, step, uniforms.shape[0], uniforms.stride(0),
        temperature, temperature if top_p is None else top_p, y, s.stats, s.hist, s.above, s.rowf, s.rowi,
        s.tickets, q, q.stride(0), s.accept, s.res, vocab, chunks,
        PASS=p, N=n, NP=max(2, triton.next_power_of_2(n)), CP=s.cp, SUB=sub, ITERS=iters, B=batches(sub),
        USE_GDC=use_gdc, DRAFT_Q=draft_logits is not None, NO_NUCLEUS=top_p is None, RA=ra,
        num_warps=(1 if interpreting() else pass_warps(p)) if num_warps is None else num_warps,
        **({"launch_pdl": True} if use_gdc else {}))


def sampled_targets_triton(chain: torch.Tensor, logits: torch.Tensor, uniforms: torch.Tensor, step: torch.Tensor,
                           temperature: torch.Tensor, top_p: torch.Tensor | None, out: torch.Tensor | None = None,
                           sub: int | None = None, use_pdl: bool | None = None,
                           draft_logits: torch.Tensor | None = None) -> torch.Tensor:
    """y int64 [N] (the op's contract, runtime/relay/ops.py; arguments checked there). ``sub``
    overrides the sub-block size (tests: many chunks and iterations on a small vocabulary);
    ``use_pdl=False`` launches without PDL (benchmarks), None where the device supports it;
    ``draft_logits`` [N - 1, V]: sampled drafts (a fifth pass draws from the residual); top_p
    None: no nucleus, one launch (two with draft_logits)."""
    n, vocab = logits.shape
    device = logits.device
    sms = torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 8
    ra = searched_rows(n, draft_logits is not None)
    sub, iters, chunks = chunking(ra, vocab, sms, sub)
    y = torch.empty((n,), dtype=torch.int64, device=device) if out is None else out
    s = scratch(ra, chunks, device, draft=draft_logits is not None)
    use_gdc = pdl_supported(device) if use_pdl is None else use_pdl
    for p in passes(top_p is None, draft_logits is not None):
        launch_pass(p, s, chunks, sub, iters, chain, logits, uniforms, step, temperature, top_p, y, draft_logits,
                    use_gdc)
    return y
