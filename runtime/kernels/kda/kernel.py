"""Triton kernels for the fused KDA chain (conv + norm + gate + delta rule) and its commit.

Math and layout: README.md in this folder; reference: naive.py; custom ops: op.py.

Tiling. The grid is (H, cdiv(V, BV)): a program owns one head and a BV-wide slice of V for all T
tokens of the chain, serially over T. Its state tile S[:, slice] is [K, BV] fp32 and lives in
registers for the whole chain (read once, written once). The delta rule only reduces over K
(S^T k and S^T q), so every V column is independent: each program recomputes its head's q and k
(short conv + SiLU + L2 norm over all K channels, cheap next to the state traffic) instead of
receiving them, and the K reduction of a column happens whole inside one program whatever BV is.
BV comes from a fixed table keyed by (H, K, V), never by T (see config_for).

PDL. Producer-independent loads come before ``gdc_wait``: the three conv weights of the
program's channels, A_log[h] and dt_bias. With ``state_ready`` (the op's flag, set by pdl_swap)
the state tile and the conv windows are read before it too (session 13: the state's cold read,
4 KB per program, leaves the path after the wait, where only the raw projections remain, the
previous kernel's outputs, from L2). The flag says that their last writer is not in this graph
before the chain: it is this layer's chain of an earlier step, the commit at the end of an
earlier verify graph, or the prefill, and at least one kernel that releases its dependents only
after its own wait (the projection GEMM feeding the chain) stands between that writer and this
launch, so it has completed when this kernel starts (runtime/pdl.py, rule 3; the argument of the
MoE down-GEMM's early read of moe_align's table). Without the flag (a direct call of the op, two
chains on one state back to back, the transposed copy of an independently written layer) and
under LINGC_PDL_TRIGGER=early they are read after the wait. Every store comes after the wait.

Conv windows. Every program needs its head's q and k windows; the v window of a channel is
needed only by the program owning that channel. Ownership of the writes, so that every element
is written exactly once:
- v window channels: the program that owns them (its BV slice), in both modes;
- q and k window channels of head h, staged mode: the program with v-block 0 (nobody writes the
  persistent window, so there is no reader to race with);
- q and k windows, persistent mode: the LAST program of the head to finish reading them. With one
  v-block that is simply the program; with several, each program takes an integer ticket
  (atomic_add, acq_rel, GPU scope) after its chain, long after its window loads were consumed,
  and the one drawing ticket NVB-1 writes the new q/k window and resets the ticket to zero (so a
  CUDA graph can replay it). A plain "v-block 0 writes" would race with the other programs of
  the head still reading the old window. With ``KdaConfig.early_ticket`` the ticket is drawn
  once the first token's q and k norms have consumed every thread's window values, not after
  the chain, by one lane (a relaxed ``atom.inc`` that wraps the ticket to zero itself) whose
  result is first read after the chain: the round trip off the program's path (README.md says
  why relaxed is enough).
With grouped heads (GROUP value heads per q/k head, Qwen3-Next) "head" above means the q/k head:
its window is written by the v-block-0 program of its first value head (staged) or by the last
of its GROUP * NVB programs (persistent, one ticket per q/k head). The window is then one
[2*HK*K + H*V, 3] block (q, k, v channels); [3, H*K, 3] is the same block when GROUP is 1.

Batch invariance in T: T is a runtime argument (not specialised, not a constexpr), the tile
config depends on (H, K, V) only, and the loop body for token t reads nothing that depends on
how many tokens follow; so position j's output and post-state are bitwise the same for any T > j.
STAGED is a runtime argument too (not specialised): with it a constexpr, the staged and the
persistent kernel were two compilations whose outputs differed in the last bits on the H200
(2026-11-30, flash-tp4-rank shapes), so the relay's verify disagreed with plain decode; one
binary for both modes makes position j of a staged chain the persistent result bit for bit.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from lingc.runtime.kernels.gemm_common import add_pairs, persistent_buffer
from lingc.runtime.pdl import EARLY_TRIGGER, interpreting, pdl_launch_dependents, pdl_supported, pdl_wait

__all__ = ["COMMIT_GROUP", "CONV_WIDTH", "KdaConfig", "CONFIGS", "config_for", "kda_chain_triton",
           "kda_commit_many_triton", "kda_commit_triton", "state_before_wait"]

# The short-conv kernel size the kernel is written for (Ling-3: short_conv_kernel_size 4). The
# window holds CONV_WIDTH - 1 = 3 past inputs per channel, kept as three register vectors.
CONV_WIDTH = 4
_L2_EPS = 1e-6
# Programs per launch the table rule aims for: one wave on an H200 (132 SMs). A constant, not a
# device query, so that the config (and so the bits) depend on the shape only.
_TARGET_PROGRAMS = 128


# KdaConfig.early_ticket's draw: lane 0 alone branches to the atomic (the others keep 0), so ptxas
# does not aggregate the warp's lanes into one atomic whose result it shuffles to every lane at
# once; the result register is first read after the chain.
_DRAW_IN_ONE_LANE = tl.constexpr("""{
    .reg .pred draw;
    mov.u32 $0, 0;
    setp.ne.u32 draw, $2, 0;
    @!draw bra lingc_kda_no_draw;
    atom.global.gpu.relaxed.inc.u32 $0, [$1], $3;
lingc_kda_no_draw:
}""")


@dataclass(frozen=True)
class KdaConfig:
    bv: int             # V columns per program (power of two >= 4)
    num_warps: int = 4
    # Two multi-operand reductions per token instead of four single ones: (q.q, k.k, q.k) of the
    # raw q and k, then (S'^T k, S'^T q), with o = S'^T q + delta (q.k) (the same math as
    # (S' + k delta^T)^T q, other roundings). Across K each reduction is a shared-memory round
    # trip: 12 CTA barriers per token instead of 18 in the sm_90 binary (a test checks the
    # count). Other bits than False, but the same for any T. On by default since session 23
    # (one H200, flash-tp4-rank): T=6 staged 8.10 -> 7.49 us per layer, T=1 3.25 -> 3.18; in the
    # step the KDA chain's critical time 136.6 -> 132.8 us (plain) and 333.9 -> 321.7 (verify),
    # relay 4.119 -> 4.106 ms.
    fused_reductions: bool = True
    # Persistent mode with several programs a q/k head: draw the window ticket as soon as the
    # first token's q and k norms have consumed every thread's q/k window values, not after the
    # chain, as one lane's relaxed atom.inc whose result is read after the chain, so its round
    # trip overlaps the chain instead of ending the program; the drawer of the last ticket still
    # writes the new q/k window at its end. The same arithmetic. On since session 70 (one H100,
    # flash-tp4-rank plain decode, same call: the KDA chain 145.5 -> 106.6 us critical a step,
    # the gated head norm after it 31.4 -> 44.4, wall 1.878 -> 1.852 ms, the graph replayed
    # alone level at 1.863); README.md has the bound, the first form's level result and why
    # relaxed ordering is enough.
    early_ticket: bool = True


# Fixed launch table keyed by (H, K, V). Not yet swept on the GPU (benchmarks/kernels_kda.py
# --bv sweeps it): flash-tp4-rank (H=8) takes BV=8, 128 programs, one wave on 132 SMs; the
# article's Blackwell sweep at T=6 was monotone in favour of small BV down to 1.7 waves (BV=4).
# flash (H=32) at BV=32 is again 128 programs. Warps (session 16, `--warps 1 2 4 8`): one warp
# per program is faster alone (T=6 staged 8.04 -> 7.07 us) but not in the verify graph (KDA
# 347 vs 348 us per step) and spills ~250 bytes in the runtime binary: four kept.
CONFIGS: dict[tuple[int, int, int], KdaConfig] = {
    (8, 128, 128): KdaConfig(bv=8, num_warps=4),
    (32, 128, 128): KdaConfig(bv=32, num_warps=4),
}


def config_for(h: int, k: int, v: int) -> KdaConfig:
    """The config for a head count and head dims: the table entry, else a rule aiming at about
    _TARGET_PROGRAMS programs. A function of (H, K, V) only, never of T."""
    if (h, k, v) in CONFIGS:
        return CONFIGS[(h, k, v)]
    blocks = max(1, _TARGET_PROGRAMS // h)
    bv = min(triton.next_power_of_2(v), max(4, triton.next_power_of_2(triton.cdiv(v, blocks))))
    return KdaConfig(bv=bv)


@triton.jit
def _conv_taps(w_ptr, ch, mask):
    """The four conv taps [ch, 4] of channels ch, oldest first, in fp32 (the weights' dtype may be
    lower: the taps upcast exactly, as the reference's weight.float())."""
    return (tl.load(w_ptr + ch * 4 + 0, mask=mask, other=0.0).to(tl.float32),
            tl.load(w_ptr + ch * 4 + 1, mask=mask, other=0.0).to(tl.float32),
            tl.load(w_ptr + ch * 4 + 2, mask=mask, other=0.0).to(tl.float32),
            tl.load(w_ptr + ch * 4 + 3, mask=mask, other=0.0).to(tl.float32))


@triton.jit
def _add3(a0, b0, c0, a1, b1, c1):
    return a0 + a1, b0 + b1, c0 + c1


@triton.jit
def _conv_silu(x0, x1, x2, x, w0, w1, w2, w3):
    """Depthwise conv over (x0, x1, x2 = window oldest first, x = new input), taps summed in
    order as kda_math.short_conv does, then SiLU."""
    y = x0 * w0
    y = y + x1 * w1
    y = y + x2 * w2
    y = y + x * w3
    return y * tl.sigmoid(y)


@triton.jit
def _grouped(c, glen, gstride):
    """The offset in a token's row of flat channel c of an input held as [T, A, glen] groups
    gstride apart (a head-grouped view, e.g. Qwen3-Next's q of each q/k head group inside the
    fused projection's output); a flat [T, N] input passes glen = N (one group)."""
    return (c // glen) * gstride + c % glen


@triton.jit
def _token_inputs(q_ptr, k_ptr, v_ptr, f_ptr, b_ptr, stride_q, stride_k, stride_v, stride_f, stride_b,
                  t, T, oq, ok, ov, of, ob, mk, mv):
    """Token t's raw q, k, v, f and b in fp32 at this program's offsets in a token's row (q, k at
    its q/k channels, v at its v channels, f at its gate channels, b at its head); zeros past T."""
    live = t < T
    return (tl.load(q_ptr + t * stride_q + oq, mask=mk & live, other=0.0).to(tl.float32),
            tl.load(k_ptr + t * stride_k + ok, mask=mk & live, other=0.0).to(tl.float32),
            tl.load(v_ptr + t * stride_v + ov, mask=mv & live, other=0.0).to(tl.float32),
            tl.load(f_ptr + t * stride_f + of, mask=mk & live, other=0.0).to(tl.float32),
            tl.load(b_ptr + t * stride_b + ob, mask=live, other=0.0).to(tl.float32))


@triton.jit
def _store_window(ptr, ch, xp, x0, x1, x2, mask, WIN: tl.constexpr):
    """Channels ch's window columns (x0 oldest) into a [.., channels, WIN] buffer, in its dtype;
    a WIN = 4 buffer (the conv's whole width, Hugging Face's cache) first gets xp, the input
    before x0, which no later output reads."""
    wdt = ptr.dtype.element_ty
    if WIN == 4:
        tl.store(ptr + ch * WIN + 0, xp.to(wdt), mask=mask)
    tl.store(ptr + ch * WIN + (WIN - 3), x0.to(wdt), mask=mask)
    tl.store(ptr + ch * WIN + (WIN - 2), x1.to(wdt), mask=mask)
    tl.store(ptr + ch * WIN + (WIN - 1), x2.to(wdt), mask=mask)


@triton.jit
def _softplus(x):
    """F.softplus (beta 1, threshold 20); exp(x) below -15, where log(1 + exp(x)) would round
    the 1 away (relative error of exp(x) there: below exp(-15) / 2)."""
    return tl.where(x > 20.0, x, tl.where(x < -15.0, tl.exp(x), tl.log(1.0 + tl.exp(x))))


@triton.jit(do_not_specialize=["T", "STAGED"])
def _kda_chain_kernel(
    q_ptr, k_ptr, v_ptr, f_ptr, b_ptr,
    stride_q, stride_k, stride_v, stride_f, stride_b,
    glen_q, glen_k, glen_v, glen_f, glen_b, gstride_q, gstride_k, gstride_v, gstride_f, gstride_b,
    wq_ptr, wk_ptr, wv_ptr, win_ptr, alog_ptr, dtb_ptr, state_ptr, o_ptr, sstate_ptr, swin_ptr, ticket_ptr,
    T, STAGED, lower_bound, scale, eps,
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    NVB: tl.constexpr, STATE_BEFORE_WAIT: tl.constexpr, FUSED_RED: tl.constexpr, USE_GDC: tl.constexpr,
    SOFTPLUS_GATE: tl.constexpr = False, STATE_VK: tl.constexpr = False, GATE_PER_HEAD: tl.constexpr = False,
    GROUP: tl.constexpr = 1, WIN: tl.constexpr = 3, wink_ptr=None, winv_ptr=None, SPLIT_WIN: tl.constexpr = False,
    EARLY_TICKET: tl.constexpr = False, TICKET_LANES: tl.constexpr = 128, ASM_TICKET: tl.constexpr = False,
):
    h = tl.program_id(0)
    vb = tl.program_id(1)
    # GROUP value heads share one q/k head (Qwen3-Next's grouped heads; 1: one q/k head each).
    DQK: tl.constexpr = (H // GROUP) * K    # q (and k) channels: the window's k block starts here
    C: tl.constexpr = 2 * DQK + H * V       # window channels: q, k, v blocks ([3, H*K, W-1] if GROUP 1)
    # WIN: the window's columns per channel, CONV_WIDTH - 1 = 3 past inputs, or CONV_WIDTH = 4
    # (Hugging Face's and fla's cache: one more column, shifted out before any output reads it).
    L0: tl.constexpr = WIN - 3        # the first live column
    # The k and v windows: blocks of the one window, or (SPLIT_WIN: three caches, fla's layers)
    # tensors of their own; q's is win_ptr's first block either way. Stages stay one flat block.
    offs_k = tl.arange(0, BK)
    mk = offs_k < K
    offs_v = vb * BV + tl.arange(0, BV)
    mv = offs_v < V
    cqk = (h // GROUP) * K + offs_k   # this head's q/k channels
    cv = h * V + offs_v               # this program's v channels
    # (base pointer, row) of this program's k and v window channels: the one window's k and v
    # blocks, or with SPLIT_WIN the rows of caches of their own.
    if SPLIT_WIN:
        wk_base, ck = wink_ptr, cqk
        wv_base, cvw = winv_ptr, cv
    else:
        wk_base, ck = win_ptr, DQK + cqk
        wv_base, cvw = win_ptr, 2 * DQK + cv
    m2 = mk[:, None] & mv[None, :]

    # Producer-independent loads (weights), issued before the wait.
    wq0, wq1, wq2, wq3 = _conv_taps(wq_ptr, cqk, mk)
    wk0, wk1, wk2, wk3 = _conv_taps(wk_ptr, cqk, mk)
    wv0, wv1, wv2, wv3 = _conv_taps(wv_ptr, cv, mv)
    a = tl.exp(tl.load(alog_ptr + h).to(tl.float32))
    # The gate's channels: this head's K channels, or (Gated DeltaNet) the head's one gate for all.
    cf = h + offs_k * 0 if GATE_PER_HEAD else h * K + offs_k
    dtb = tl.load(dtb_ptr + cf, mask=mk, other=0.0).to(tl.float32)

    if not STATE_BEFORE_WAIT:
        pdl_wait(USE_GDC)
        pdl_launch_dependents(USE_GDC)

    # Windows (oldest first) and the state tile (module docstring, "PDL": before the wait when
    # the caller vouches that their writer has completed).
    xq0 = tl.load(win_ptr + cqk * WIN + (L0 + 0), mask=mk, other=0.0).to(tl.float32)
    xq1 = tl.load(win_ptr + cqk * WIN + (L0 + 1), mask=mk, other=0.0).to(tl.float32)
    xq2 = tl.load(win_ptr + cqk * WIN + (L0 + 2), mask=mk, other=0.0).to(tl.float32)
    xk0 = tl.load(wk_base + ck * WIN + (L0 + 0), mask=mk, other=0.0).to(tl.float32)
    xk1 = tl.load(wk_base + ck * WIN + (L0 + 1), mask=mk, other=0.0).to(tl.float32)
    xk2 = tl.load(wk_base + ck * WIN + (L0 + 2), mask=mk, other=0.0).to(tl.float32)
    xv0 = tl.load(wv_base + cvw * WIN + (L0 + 0), mask=mv, other=0.0).to(tl.float32)
    xv1 = tl.load(wv_base + cvw * WIN + (L0 + 1), mask=mv, other=0.0).to(tl.float32)
    xv2 = tl.load(wv_base + cvw * WIN + (L0 + 2), mask=mv, other=0.0).to(tl.float32)
    if STATE_VK:    # the state (and its stages) stored [H, V, K]: the same [K, BV] tile, read in place
        s_offs = h * K * V + offs_v[None, :] * K + offs_k[:, None]
    else:
        s_offs = h * K * V + offs_k[:, None] * V + offs_v[None, :]
    S = tl.load(state_ptr + s_offs, mask=m2, other=0.0)

    if STATE_BEFORE_WAIT:
        pdl_wait(USE_GDC)
        pdl_launch_dependents(USE_GDC)

    # A while loop rather than range(T): the interpreter cannot take a runtime bound in range().
    # Token t + 1's inputs are requested before token t is computed, so their L2 latency overlaps
    # the serial work of the recurrence instead of adding to it (the same arithmetic per token).
    t = 0
    if WIN == 4:
        # The column a 4-column cache shifts out (its value after T = 0 tokens). Loaded, not
        # aliased to x*0: Triton's while loop carries only the names its body re-binds to a value
        # other than the one they entered with, and x*0 is what the body binds p* to, so an alias
        # left p* uncarried and the last token's shifted-out column never reached the store.
        pq = tl.load(win_ptr + cqk * WIN, mask=mk, other=0.0).to(tl.float32)
        pk = tl.load(wk_base + ck * WIN, mask=mk, other=0.0).to(tl.float32)
        pv = tl.load(wv_base + cvw * WIN, mask=mv, other=0.0).to(tl.float32)
    else:
        pq, pk, pv = xq0, xk0, xv0    # unused: a 3-column cache keeps no shifted-out column
    # The inputs' offsets in a token's row: flat channels, or head-grouped views (_grouped).
    oq = _grouped(cqk, glen_q, gstride_q)
    ok = _grouped(cqk, glen_k, gstride_k)
    ov = _grouped(cv, glen_v, gstride_v)
    of = _grouped(cf, glen_f, gstride_f)
    ob = _grouped(h, glen_b, gstride_b)
    nq, nk, nv, nf, nb = _token_inputs(q_ptr, k_ptr, v_ptr, f_ptr, b_ptr, stride_q, stride_k, stride_v, stride_f,
                                       stride_b, 0, T, oq, ok, ov, of, ob, mk, mv)
    if EARLY_TICKET:
        tick = tl.zeros([TICKET_LANES], tl.int32)    # lane 0's drawn ticket (below), 0 in the others
    while t < T:
        xq, xk, xv, fx, bx = nq, nk, nv, nf, nb
        nq, nk, nv, nf, nb = _token_inputs(q_ptr, k_ptr, v_ptr, f_ptr, b_ptr, stride_q, stride_k, stride_v,
                                           stride_f, stride_b, t + 1, T, oq, ok, ov, of, ob, mk, mv)

        q = _conv_silu(xq0, xq1, xq2, xq, wq0, wq1, wq2, wq3)
        k = _conv_silu(xk0, xk1, xk2, xk, wk0, wk1, wk2, wk3)
        v = _conv_silu(xv0, xv1, xv2, xv, wv0, wv1, wv2, wv3)
        pq, xq0, xq1, xq2 = xq0, xq1, xq2, xq      # p*: the column shifted out (kept by WIN = 4)
        pk, xk0, xk1, xk2 = xk0, xk1, xk2, xk
        pv, xv0, xv1, xv2 = xv0, xv1, xv2, xv
        if SOFTPLUS_GATE:
            g = -a * _softplus(fx + dtb)
        else:
            g = lower_bound * tl.sigmoid(a * (fx + dtb))
        beta = tl.sigmoid(bx)
        # KdaConfig.fused_reductions (FUSED_RED): one reduction for both norms and the raw q.k,
        # one for both state products, and o from S' and the rank-one update's q.k.
        if FUSED_RED:
            qq, kk, qk = tl.reduce((q * q, k * k, q * k), 0, _add3)
            rq = tl.rsqrt(qq + eps)
        else:
            rq = tl.rsqrt(tl.sum(q * q, axis=0) + eps)
        q = q * rq * scale
        if FUSED_RED:
            rk = tl.rsqrt(kk + eps)
        else:
            rk = tl.rsqrt(tl.sum(k * k, axis=0) + eps)
        k = k * rk
        if EARLY_TICKET and (NVB * GROUP > 1):
            if (STAGED == 0) & (t == 0):
                # KdaConfig.early_ticket: the ticket of the end (below), drawn once every thread's
                # q/k window values are consumed (the norms' reductions above read them all). One
                # lane of a vector draws it, relaxed, and its value is reduced only after the
                # chain: a scalar atomic would broadcast its result through shared memory at once,
                # and an acq_rel one would first wait for the state tile's loads, so either puts
                # the round trip back on the chain's path. Why relaxed is enough: README.md.
                tl.debug_barrier()
                lanes = tl.arange(0, TICKET_LANES)      # one lane a thread: no replicated lane
                lane0 = (lanes == 0).to(tl.int32)
                tickets = ticket_ptr + h // GROUP + lanes * 0
                if ASM_TICKET:      # the bound NVB * GROUP - 1: the last draw wraps the ticket to 0
                    tick = tl.inline_asm_elementwise(_DRAW_IN_ONE_LANE, "=r,l,r,r",
                                                     [tickets, lane0, lanes * 0 + (NVB * GROUP - 1)],
                                                     dtype=tl.int32, is_pure=False, pack=1)
                else:               # the interpreter runs no PTX: an add, and the reset at the end
                    tick = tl.atomic_add(tickets, lane0, mask=lane0 != 0, sem="relaxed", scope="gpu")
        S = S * tl.exp(g)[:, None]
        if FUSED_RED:
            kv, sq = tl.reduce((S * k[:, None], S * q[:, None]), 0, add_pairs)   # S'^T k, S'^T q
        else:
            kv = tl.sum(S * k[:, None], axis=0)                  # S'^T k over the whole K
        delta = (v - kv) * beta
        S = S + k[:, None] * delta[None, :]
        if FUSED_RED:
            o = sq + delta * (qk * rq * scale * rk)              # S^T q
        else:
            o = tl.sum(S * q[:, None], axis=0)                   # S^T q
        tl.store(o_ptr + t * H * V + h * V + offs_v, o, mask=mv)

        if STAGED != 0:
            tl.store(sstate_ptr + t * H * K * V + s_offs, S, mask=m2)
            sw = swin_ptr + t * C * WIN
            _store_window(sw, 2 * DQK + cv, pv, xv0, xv1, xv2, mv, WIN)
            if (vb == 0) & (h % GROUP == 0):      # one program per q/k head
                _store_window(sw, cqk, pq, xq0, xq1, xq2, mk, WIN)
                _store_window(sw, DQK + cqk, pk, xk0, xk1, xk2, mk, WIN)
        t += 1

    if STAGED == 0:
        tl.store(state_ptr + s_offs, S, mask=m2)
        _store_window(wv_base, cvw, pv, xv0, xv1, xv2, mv, WIN)
        last = True
        if (NVB * GROUP > 1) and EARLY_TICKET:
            last = tl.max(tick, axis=0) == NVB * GROUP - 1      # the other lanes hold 0
        elif NVB * GROUP > 1:
            # Every thread's window loads were consumed by the chain; the barrier and the acq_rel
            # ticket (one per q/k head: its GROUP value heads' NVB programs each read its window)
            # order them before the last program's q/k window stores.
            tl.debug_barrier()
            ticket = tl.atomic_add(ticket_ptr + h // GROUP, 1, sem="acq_rel", scope="gpu")
            last = ticket == NVB * GROUP - 1
        if last:
            _store_window(win_ptr, cqk, pq, xq0, xq1, xq2, mk, WIN)
            _store_window(wk_base, ck, pk, xk0, xk1, xk2, mk, WIN)
            if (NVB * GROUP > 1) and not (EARLY_TICKET and ASM_TICKET):    # atom.inc wrapped it to 0 already
                tl.atomic_xchg(ticket_ptr + h // GROUP, 0, sem="relaxed", scope="gpu")  # ready for the next call


@triton.jit
def _commit_block(pid, state_ptr, win_ptr, sstate_ptr, swin_ptr, index_ptr, N_STATE, N_WIN,
                  BLOCK: tl.constexpr, USE_GDC: tl.constexpr, wink_ptr=None, winv_ptr=None, N1=0, N2=0,
                  SPLIT_WIN: tl.constexpr = False):
    """Block pid of the copy stage[index] -> (state, window): the state's blocks, then the
    window's (SPLIT_WIN: the flat stage's elements [0, N1) to win_ptr, [N1, N2) to wink_ptr, the
    rest to winv_ptr)."""
    state_blocks = tl.cdiv(N_STATE, BLOCK)
    pdl_wait(USE_GDC)
    pdl_launch_dependents(USE_GDC)
    idx = tl.load(index_ptr).to(tl.int64)
    if pid < state_blocks:
        offs = pid * BLOCK + tl.arange(0, BLOCK)
        m = offs < N_STATE
        tl.store(state_ptr + offs, tl.load(sstate_ptr + idx * N_STATE + offs, mask=m), mask=m)
    else:
        offs = (pid - state_blocks) * BLOCK + tl.arange(0, BLOCK)
        m = offs < N_WIN
        src = tl.load(swin_ptr + idx * N_WIN + offs, mask=m)
        if SPLIT_WIN:
            dst = tl.where(offs < N1, win_ptr + offs, tl.where(offs < N2, wink_ptr + (offs - N1), winv_ptr + (offs - N2)))
        else:
            dst = win_ptr + offs
        tl.store(dst, src, mask=m)


@triton.jit
def _kda_commit_kernel(state_ptr, win_ptr, sstate_ptr, swin_ptr, index_ptr, N_STATE, N_WIN,
                       BLOCK: tl.constexpr, USE_GDC: tl.constexpr, wink_ptr=None, winv_ptr=None, N1=0, N2=0,
                       SPLIT_WIN: tl.constexpr = False):
    """state <- stage_states[index], window <- stage_windows[index]; the index is read on the
    device (after the wait: the verdict kernel wrote it)."""
    _commit_block(tl.program_id(0), state_ptr, win_ptr, sstate_ptr, swin_ptr, index_ptr, N_STATE, N_WIN,
                  BLOCK, USE_GDC, wink_ptr, winv_ptr, N1, N2, SPLIT_WIN)


# Layers one kda_commit_many launch copies: its pointer arguments are spelled out (Triton takes no
# pointer arrays without a device table, which a captured graph would have to keep alive).
COMMIT_GROUP = 8


@triton.jit
def _pick(layer, i: tl.constexpr, p, current):
    return tl.where(layer == i, p, current)


@triton.jit
def _kda_commit_many_kernel(index_ptr, N_STATE, N_WIN,
                            s0, w0, ss0, sw0, s1, w1, ss1, sw1, s2, w2, ss2, sw2, s3, w3, ss3, sw3,
                            s4, w4, ss4, sw4, s5, w5, ss5, sw5, s6, w6, ss6, sw6, s7, w7, ss7, sw7,
                            BLOCK: tl.constexpr, USE_GDC: tl.constexpr):
    """_kda_commit_kernel for up to COMMIT_GROUP layers of one shape: program (b, layer) copies
    block b of that layer's state and window (grid axis 1 is the layer)."""
    pid = tl.program_id(0)
    layer = tl.program_id(1)
    dst_s, dst_w, src_s, src_w = s0, w0, ss0, sw0
    dst_s, dst_w, src_s, src_w = _pick(layer, 1, s1, dst_s), _pick(layer, 1, w1, dst_w), _pick(layer, 1, ss1, src_s), _pick(layer, 1, sw1, src_w)
    dst_s, dst_w, src_s, src_w = _pick(layer, 2, s2, dst_s), _pick(layer, 2, w2, dst_w), _pick(layer, 2, ss2, src_s), _pick(layer, 2, sw2, src_w)
    dst_s, dst_w, src_s, src_w = _pick(layer, 3, s3, dst_s), _pick(layer, 3, w3, dst_w), _pick(layer, 3, ss3, src_s), _pick(layer, 3, sw3, src_w)
    dst_s, dst_w, src_s, src_w = _pick(layer, 4, s4, dst_s), _pick(layer, 4, w4, dst_w), _pick(layer, 4, ss4, src_s), _pick(layer, 4, sw4, src_w)
    dst_s, dst_w, src_s, src_w = _pick(layer, 5, s5, dst_s), _pick(layer, 5, w5, dst_w), _pick(layer, 5, ss5, src_s), _pick(layer, 5, sw5, src_w)
    dst_s, dst_w, src_s, src_w = _pick(layer, 6, s6, dst_s), _pick(layer, 6, w6, dst_w), _pick(layer, 6, ss6, src_s), _pick(layer, 6, sw6, src_w)
    dst_s, dst_w, src_s, src_w = _pick(layer, 7, s7, dst_s), _pick(layer, 7, w7, dst_w), _pick(layer, 7, ss7, src_s), _pick(layer, 7, sw7, src_w)
    _commit_block(pid, dst_s, dst_w, src_s, src_w, index_ptr, N_STATE, N_WIN, BLOCK, USE_GDC)


# Tickets per device: one per head of a persistent multi-block launch (Ling-3: 8-64 heads).
TICKET_CAPACITY = 1024


def _tickets(device: torch.device, n: int) -> torch.Tensor:
    """Zeroed int32 tickets, one per head, kept per device (``gemm_common.persistent_buffer``:
    never replaced, so a captured graph keeps a valid address): each persistent launch leaves
    them zero, so a captured graph replays them forever. Allocated on the first (eager, warm-up)
    call, never inside a capture. Two persistent chains running concurrently on different
    streams would share them; lingc runs one stream."""
    if n > TICKET_CAPACITY:
        raise ValueError(f"kda_chain: a launch over {n} heads needs {n} tickets, more than "
                         f"TICKET_CAPACITY={TICKET_CAPACITY}")
    return persistent_buffer("kda_tickets", device, TICKET_CAPACITY, torch.int32, 0)


def _row_major(x: torch.Tensor) -> torch.Tensor:
    return x if x.stride(-1) == 1 else x.contiguous()


def _input_layout(x: torch.Tensor) -> tuple[torch.Tensor, int, int, int]:
    """(x, token stride, group length, group stride) of a flat [T, N] input (one group of N) or a
    head-grouped [T, A, B] view (A groups of B channels, any token / group strides)."""
    x = _row_major(x)
    if x.dim() == 2:
        return x, x.stride(0), x.shape[1], 0
    return x, x.stride(0), x.shape[2], x.stride(1)


def state_before_wait(state_ready: bool, use_pdl: bool) -> bool:
    """Whether the chain reads the state and windows before its PDL wait: only when the caller
    vouches for their writer (``state_ready``), PDL is on, and the kernel before the chain
    triggers its dependents after its own wait (not under LINGC_PDL_TRIGGER=early)."""
    return bool(state_ready and use_pdl and not EARLY_TRIGGER.value)


def kda_chain_triton(q_raw, k_raw, v_raw, f_raw, b_raw, conv_w, conv_window, a_log, dt_bias, state,
                     lower_bound: float | None, stage_states=None, stage_windows=None, out=None, *,
                     state_ready: bool = False, state_vk: bool = False, config: KdaConfig | None = None,
                     use_pdl: bool | None = None, k_window=None, v_window=None) -> torch.Tensor:
    """Launch the chain over T = q_raw.shape[0] tokens; returns o [T, H, V] fp32 (``out`` if given).
    ``state_ready``: the state and window may be read before the PDL wait (module docstring).
    ``state_vk``: state and stage_states are stored [H, V, K] (each head's state transposed);
    the kernel reads and writes them in that layout. ``k_window`` / ``v_window``: the k and v
    windows as caches of their own (conv_window then q's alone); stages stay one flat block.

    Persistent mode (stage_states is None): state and conv_window are updated in place.
    Staged mode: stage_states[t] / stage_windows[t] get position t's post-state / post-window;
    state and conv_window are only read. Arguments are as checked by op.check_kda_chain_args
    (the op validates them; here only what the kernel's addressing relies on is asserted).
    """
    from .op import head_dims

    T = q_raw.shape[0]
    H, K, V = head_dims(state, state_vk)
    assert len(conv_w) == 3 and all(w.shape[-1] == CONV_WIDTH for w in conv_w), state.shape
    win = conv_window.shape[-1]
    split = k_window is not None
    n_win = conv_window.numel() + (k_window.numel() + v_window.numel() if split else 0)
    assert win in (CONV_WIDTH - 1, CONV_WIDTH) and n_win == (2 * q_raw[0].numel() + H * V) * win, conv_window.shape
    for t in (*conv_w, conv_window, state, a_log, dt_bias, *((k_window, v_window) if split else ())):
        assert t.is_contiguous(), "weights, window and state must be contiguous"
    staged = stage_states is not None
    if staged:
        assert stage_windows is not None and stage_states.is_contiguous() and stage_windows.is_contiguous()
    lays = [_input_layout(x) for x in (q_raw, k_raw, v_raw, f_raw, b_raw)]
    q_raw, k_raw, v_raw, f_raw, b_raw = (lay[0] for lay in lays)
    dqk, n_f = q_raw[0].numel(), f_raw[0].numel()       # a token's q channels and gate values
    if out is None:
        out = torch.empty((T, H, V), device=state.device, dtype=torch.float32)
    assert out.shape == (T, H, V) and out.dtype == torch.float32 and out.is_contiguous()
    cfg = config if config is not None else config_for(H, K, V)
    nvb = triton.cdiv(V, cfg.bv)
    if use_pdl is None:
        use_pdl = pdl_supported(state.device)
    assert not use_pdl or pdl_supported(state.device), "PDL requested on a device without PDL support"
    launch = {"launch_pdl": True} if use_pdl else {}
    group = H // (dqk // K)                     # value heads per q/k head
    tickets = _tickets(state.device, H) if (not staged and nvb * group > 1) else state
    _kda_chain_kernel[(H, nvb)](
        q_raw, k_raw, v_raw, f_raw, b_raw, *(lay[1] for lay in lays), *(lay[2] for lay in lays),
        *(lay[3] for lay in lays),
        conv_w[0], conv_w[1], conv_w[2], conv_window, a_log, dt_bias, state, out,
        stage_states if staged else state, stage_windows if staged else conv_window, tickets,
        T, int(staged), 0.0 if lower_bound is None else float(lower_bound), float(K) ** -0.5, _L2_EPS,
        H=H, K=K, V=V, BK=triton.next_power_of_2(K), BV=cfg.bv, NVB=nvb, SOFTPLUS_GATE=lower_bound is None,
        STATE_VK=bool(state_vk), GATE_PER_HEAD=n_f != H * K, GROUP=group, WIN=win,
        FUSED_RED=cfg.fused_reductions, STATE_BEFORE_WAIT=state_before_wait(state_ready, use_pdl), USE_GDC=use_pdl,
        EARLY_TICKET=cfg.early_ticket, TICKET_LANES=32 * cfg.num_warps, ASM_TICKET=not interpreting(),
        **({"wink_ptr": k_window, "winv_ptr": v_window, "SPLIT_WIN": True} if split else {}),
        num_warps=cfg.num_warps, num_stages=1, **launch,
    )
    return out


def kda_commit_triton(state, conv_window, stage_states, stage_windows, index, *,
                      block: int = 4096, use_pdl: bool | None = None, k_window=None, v_window=None) -> None:
    """Copy stage position ``index`` (0-d or [1] integer device tensor) into state and
    conv_window (and with ``k_window`` / ``v_window`` the flat stage's k and v blocks into those),
    in one launch and without a host sync."""
    split = k_window is not None
    for t in (state, conv_window, stage_states, stage_windows, *((k_window, v_window) if split else ())):
        assert t.is_contiguous(), "commit buffers must be contiguous"
    n1 = conv_window.numel()
    n2 = n1 + (k_window.numel() if split else 0)
    n_state, n_win = state.numel(), n2 + (v_window.numel() if split else 0)
    if use_pdl is None:
        use_pdl = pdl_supported(state.device)
    launch = {"launch_pdl": True} if use_pdl else {}
    grid = (triton.cdiv(n_state, block) + triton.cdiv(n_win, block),)
    _kda_commit_kernel[grid](state, conv_window, stage_states, stage_windows, index, n_state, n_win,
                             BLOCK=block, USE_GDC=use_pdl, num_warps=4,
                             **({"wink_ptr": k_window, "winv_ptr": v_window, "N1": n1, "N2": n2, "SPLIT_WIN": True}
                                if split else {}), **launch)


def kda_commit_many_triton(states, conv_windows, stage_states, stage_windows, index, *,
                           block: int = 4096, use_pdl: bool | None = None) -> None:
    """kda_commit_triton for L layers of one shape in cdiv(L, COMMIT_GROUP) launches (a verify
    step's 35 per-layer commits were 35 launches of ~1.7 us each on its critical path)."""
    n = len(states)
    for group in (states, conv_windows, stage_states, stage_windows):
        assert len(group) == n and all(t.is_contiguous() for t in group), "commit buffers must be contiguous"
    n_state, n_win = states[0].numel(), conv_windows[0].numel()
    if use_pdl is None:
        use_pdl = pdl_supported(states[0].device)
    launch = {"launch_pdl": True} if use_pdl else {}
    blocks = triton.cdiv(n_state, block) + triton.cdiv(n_win, block)
    for g0 in range(0, n, COMMIT_GROUP):
        layers = range(g0, min(g0 + COMMIT_GROUP, n))
        ptrs = []
        for i in range(COMMIT_GROUP):
            j = layers[i] if i < len(layers) else layers[0]     # unused slots repeat a real layer
            ptrs += [states[j], conv_windows[j], stage_states[j], stage_windows[j]]
        _kda_commit_many_kernel[(blocks, len(layers))](index, n_state, n_win, *ptrs, BLOCK=block,
                                                       USE_GDC=use_pdl, num_warps=4, **launch)
