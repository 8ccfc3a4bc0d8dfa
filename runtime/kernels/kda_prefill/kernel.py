"""Triton kernels for the chunked KDA prefill: a parallel per-chunk pass, a sequential state walk,
then a parallel output pass.

Math and derivation: README.md in this folder; reference: naive.py (kda_math.kda_chunked);
custom op: op.py.

1. ``_kda_prefill_chunk_kernel``, grid (NT, H), NT = cdiv(T, BT): everything of a chunk that does
   not depend on the state entering it. With G the in-chunk cumulative log decay (tl.cumsum):
   - A[s, r] = k_s . (exp(G_s - G_r) k_r) (r < s) and P[t, r] = q_t . (exp(G_t - G_r) k_r)
     (r <= t). The chunk is cut into sub-blocks of BC = 16 rows. Inside a diagonal sub-block the
     pairwise decay is formed elementwise for s >= r only (exponent <= 0), one column of every
     sub-block per step (16 steps, rows fetched from memory: no cross-warp reduction). Between
     sub-blocks (r in an earlier sub-block than s) it factorises through the first row i0 of s's
     sub-block, exp(G_s - G_r) = exp(G_s - G_i0) exp(G_i0 - G_r), both exponents <= 0, so the block
     row is one tl.dot. Neither form can overflow however strong the decay (exp(G) * exp(-G)
     over the whole chunk would, within 18 tokens at the gate's lower bound -5);
   - M^-1 for the unit lower-triangular M = I + diag(beta) A: the diagonal sub-blocks D by forward
     substitution (16 steps, each row of every sub-block at once as one tl.dot), then
     M^-1 = (I - N + N^2 - ...) D^-1 with N = D^-1 (M - D) strictly block-lower (N^(BT/BC) = 0),
     evaluated by Horner: the block forward substitution written as products;
   - w = M^-1 (beta exp(G) k), u = M^-1 (beta v), qg = exp(G) q, kd = exp(G_C - G) k,
     gc = exp(G_C), all written to fp32 workspaces laid out [H, NT*BT, *] (padding rows zero).
2. ``_kda_prefill_state_kernel``, grid (H, cdiv(V, BV)): a program owns head h and BV columns of
   the state, keeps S [K, BV] fp32 in registers and walks the chunks in order:
       store S (the state entering chunk c);   U = u - w S (stored over u);   S = diag(gc) S + kd^T U
   Only these two products are serial; the next chunk's tiles are loaded before them, so the
   walk waits on its own arithmetic, not on memory. Columns of V never interact (all reductions
   run over K or over the chunk), so V tiling needs no communication.
3. ``_kda_prefill_output_kernel``, grid (NT, H, cdiv(V, BVO)): o = qg S_c + P U for every chunk at
   once, from the states the walk stored.

Padding. Rows t >= T of the last chunk load k = q = v = g = beta = 0: their A/P rows and columns
are zero, G stays flat (so G_C is the last real row's), their w/u/kd rows are zero and they add
nothing to the state; their outputs are not stored.

Precision. Every product runs on tensor cores as 3xTF32 (``tl.dot(..., input_precision="tf32x3")``,
~fp32 accuracy: the walk multiplies the state by a new matrix every chunk, and the tests hold the
kernels to fp32 tolerance against the recurrence, so plain TF32 is not offered). ``precision="ieee"``
runs them as fp32 FMA instead: as accurate, several times slower on the H200 (README.md).

Segments (``KdaPrefillConfig.segments`` > 1). The chunks are cut into segments; each segment's
chunk pass is launched on the caller's stream and its walk (chunks [C0, C1), carrying the state
through a buffer) on a high-priority side stream after an event, so segment i's walk runs while
segment i + 1's chunk pass does and only the first segment's chunk pass stays on the critical
path; the output pass waits for the last walk. Each chunk is computed by the same code either way,
so the bits do not depend on the segments. On the CPU (interpreter) the segments run one after
another.

PDL. None of the kernels has producer-independent loads worth issuing early (everything they read
is an activation, the state or a workspace), so each waits at entry and releases its dependents
right after.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from lingc.runtime.pdl import pdl_launch_dependents, pdl_supported, pdl_wait

__all__ = ["SUB_BLOCK", "KdaPrefillConfig", "CONFIGS", "config_for", "kda_prefill_triton", "segment_bounds"]

# Rows of a diagonal sub-block: its pairwise decays are formed elementwise, everything between
# sub-blocks by products. tl.dot needs >= 16.
SUB_BLOCK = 16

# Programs the state walk aims for: it is the serial part, so parallelism comes from H x V tiles
# only. At H = 8, K = V = 128 that is BV = 16 (64 programs); tl.dot needs BV >= 16.
_TARGET_STATE_PROGRAMS = 128


@dataclass(frozen=True)
class KdaPrefillConfig:
    chunk: int = 32            # BT: rows per chunk (16, 32 or 64: a multiple of SUB_BLOCK)
    bv: int = 16               # V columns per state-walk program (power of two >= 16)
    bv_out: int = 64           # V columns per output-pass program (power of two >= 16)
    num_warps_chunk: int = 4
    num_warps_state: int = 8   # the walk is serial: more warps per program shorten each step
    num_warps_out: int = 4
    precision: str = "tf32x3"  # tl.dot input precision: "tf32x3" (tensor cores) or "ieee" (FMA)
    k_split: int = 1           # the walk's state in 1, 2 or 4 parts of K rows (BK / k_split >= 16)
    # The chunks in this many segments, each's chunk pass launched on the caller's stream and its
    # walk on a high-priority side stream after it (CUDA): the walk of segment i runs while the
    # chunk pass of segment i + 1 does (module docstring, "Segments"). 1 = the three launches.
    segments: int = 1


# Fixed table keyed by (H, K, V), from the H200 sweep of benchmarks/kernels_kda_prefill.py at
# T = 8192 (README.md in this folder has the figures).
CONFIGS: dict[tuple[int, int, int], KdaPrefillConfig] = {
    # The walk's state in 2 parts on 4 warps (session 38): 0.880 -> 0.783 ms at H = 8 (against 8
    # warps in 1 part), 1.435 -> 1.100 ms at H = 32; 4 parts, or 8 warps, lose.
    (8, 128, 128): KdaPrefillConfig(chunk=32, bv=16, num_warps_chunk=4, num_warps_state=4, k_split=2),
    (32, 128, 128): KdaPrefillConfig(chunk=32, bv=16, num_warps_chunk=4, num_warps_state=4, k_split=2),
}


def config_for(h: int, k: int, v: int) -> KdaPrefillConfig:
    """The table entry, else BV aiming at about _TARGET_STATE_PROGRAMS state-walk programs."""
    if (h, k, v) in CONFIGS:
        return CONFIGS[(h, k, v)]
    blocks = max(1, _TARGET_STATE_PROGRAMS // h)
    bv = min(max(16, triton.next_power_of_2(v)), max(16, triton.next_power_of_2(triton.cdiv(v, blocks))))
    return KdaPrefillConfig(bv=bv)


@triton.jit(do_not_specialize=["T", "NT", "C0"])
def _kda_prefill_chunk_kernel(
    q_ptr, k_ptr, v_ptr, g_ptr, b_ptr,
    sq_t, sq_h, sk_t, sk_h, sv_t, sv_h, sg_t, sg_h, sb_t, sb_h,
    w_ptr, u_ptr, qg_ptr, kd_ptr, p_ptr, gc_ptr, gcum_ptr,
    T, NT, C0,
    K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BC: tl.constexpr, BK: tl.constexpr,
    BVA: tl.constexpr, PRECISION: tl.constexpr, USE_GDC: tl.constexpr,
):
    c = C0 + tl.program_id(0)          # this launch's chunks start at C0 (a segment, or 0)
    h = tl.program_id(1)
    idx = tl.arange(0, BT)
    rows = c * BT + idx
    mt = rows < T
    offs_k = tl.arange(0, BK)
    mk = offs_k < K
    offs_v = tl.arange(0, BVA)
    mv = offs_v < V
    mtk = mt[:, None] & mk[None, :]
    mwk = (idx < BT)[:, None] & mk[None, :]

    pdl_wait(USE_GDC)
    pdl_launch_dependents(USE_GDC)

    rows64 = rows.to(tl.int64)
    q = tl.load(q_ptr + rows64[:, None] * sq_t + h * sq_h + offs_k[None, :], mask=mtk, other=0.0).to(tl.float32)
    k = tl.load(k_ptr + rows64[:, None] * sk_t + h * sk_h + offs_k[None, :], mask=mtk, other=0.0).to(tl.float32)
    g = tl.load(g_ptr + rows64[:, None] * sg_t + h * sg_h + offs_k[None, :], mask=mtk, other=0.0).to(tl.float32)
    beta = tl.load(b_ptr + rows64 * sb_t + h * sb_h, mask=mt, other=0.0).to(tl.float32)

    G = tl.cumsum(g, axis=0)                                    # [BT, BK] in-chunk cumulative decay
    # G goes through memory so that a row of it can be fetched for every row at once below (a
    # register tile has no row gather); the barrier makes this CTA's stores visible to itself.
    wbase = (h * NT + c).to(tl.int64) * BT
    wrow = wbase + idx
    tl.store(gcum_ptr + wrow[:, None] * K + offs_k[None, :], G, mask=mwk)
    tl.debug_barrier()

    # Diagonal sub-blocks: step r fills column r of every sub-block (row s gets column
    # ref(s) = first row of s's sub-block + r), pairwise decays formed for s >= ref(s) only.
    loc = idx % BC
    A = tl.zeros((BT, BT), dtype=tl.float32)
    P = tl.zeros((BT, BT), dtype=tl.float32)
    for r in range(0, BC):
        ref = idx - loc + r
        ref_rows = c * BT + ref
        k_ref = tl.load(k_ptr + ref_rows.to(tl.int64)[:, None] * sk_t + h * sk_h + offs_k[None, :],
                        mask=(ref_rows < T)[:, None] & mk[None, :], other=0.0).to(tl.float32)
        G_ref = tl.load(gcum_ptr + (wbase + ref)[:, None] * K + offs_k[None, :], mask=mwk, other=0.0)
        on = loc >= r
        kr = tl.exp(tl.where(on[:, None], G - G_ref, float("-inf"))) * k_ref
        a_col = tl.where(loc > r, tl.sum(k * kr, axis=1), 0.0)
        p_col = tl.where(on, tl.sum(q * kr, axis=1), 0.0)
        hit = idx[None, :] == ref[:, None]
        A = tl.where(hit, a_col[:, None], A)
        P = tl.where(hit, p_col[:, None], P)

    # Earlier sub-blocks, one block row i at a time, through its first row i0 = i * BC.
    for i in tl.static_range(1, BT // BC):
        G_i0 = tl.load(gcum_ptr + (wbase + i * BC) * K + offs_k, mask=mk, other=0.0)
        in_i = (idx >= i * BC) & (idx < (i + 1) * BC)
        left = tl.exp(tl.where(in_i[:, None], G - G_i0[None, :], float("-inf")))
        right = tl.exp(tl.where((idx < i * BC)[:, None], G_i0[None, :] - G, float("-inf"))) * k
        A += tl.dot(left * k, tl.trans(right), input_precision=PRECISION)
        P += tl.dot(left * q, tl.trans(right), input_precision=PRECISION)

    # M^-1 for M = I + L, L = diag(beta) A strictly lower. D = I + (L's diagonal sub-blocks).
    L = A * beta[:, None]
    same = (idx[:, None] // BC) == (idx[None, :] // BC)
    L_diag = tl.where(same, L, 0.0)
    eye = tl.where(idx[:, None] == idx[None, :], 1.0, 0.0)
    # D^-1 row s = e_s - sum_j L[s, j] D^-1[j, :], rows of local index i of all sub-blocks at once
    # (the rows j < s it reads are final: their local index is smaller).
    Dinv = eye
    for i in range(0, BC):
        sel = (loc == i)[:, None]
        Dinv = tl.where(sel, eye - tl.dot(tl.where(sel, L_diag, 0.0), Dinv, input_precision=PRECISION), Dinv)
    Minv = Dinv
    if BT > BC:
        N = tl.dot(Dinv, L - L_diag, input_precision=PRECISION)
        Y = eye - N
        for _ in tl.static_range(2, BT // BC):
            Y = eye - tl.dot(N, Y, input_precision=PRECISION)
        Minv = tl.dot(Y, Dinv, input_precision=PRECISION)

    eG = tl.exp(G)
    G_C = tl.load(gcum_ptr + (wbase + BT - 1) * K + offs_k, mask=mk, other=0.0)   # padding rows keep G flat
    w = tl.dot(Minv, beta[:, None] * eG * k, input_precision=PRECISION)
    v = tl.load(v_ptr + rows64[:, None] * sv_t + h * sv_h + offs_v[None, :],
                mask=mt[:, None] & mv[None, :], other=0.0).to(tl.float32)
    u = tl.dot(Minv, beta[:, None] * v, input_precision=PRECISION)
    qg = eG * q
    kd = tl.exp(G_C[None, :] - G) * k

    # Workspaces [H, NT*BT, *]: each head's chunks contiguous for the state walk.
    tl.store(w_ptr + wrow[:, None] * K + offs_k[None, :], w, mask=mwk)
    tl.store(qg_ptr + wrow[:, None] * K + offs_k[None, :], qg, mask=mwk)
    tl.store(kd_ptr + wrow[:, None] * K + offs_k[None, :], kd, mask=mwk)
    tl.store(u_ptr + wrow[:, None] * V + offs_v[None, :], u, mask=(idx < BT)[:, None] & mv[None, :])
    tl.store(p_ptr + wrow[:, None] * BT + idx[None, :], P)
    tl.store(gc_ptr + (h * NT + c).to(tl.int64) * K + offs_k, tl.exp(G_C), mask=mk)


@triton.jit
def _state_part(state_ptr, h, i: tl.constexpr, offs_p, offs_v, mv, K: tl.constexpr, V: tl.constexpr,
                KP: tl.constexpr, KS: tl.constexpr):
    """Rows [i * KP, (i + 1) * KP) of head h's entering state; a 1-element placeholder for parts
    past KS (never used: the loop carries it unchanged)."""
    if i < KS:
        rows = i * KP + offs_p
        m = (rows < K)[:, None] & mv[None, :]
        return tl.load(state_ptr + h * K * V + rows[:, None] * V + offs_v[None, :], mask=m, other=0.0)
    else:
        return tl.zeros([1, 1], dtype=tl.float32)


@triton.jit
def _chunk_part(ptr, row, i: tl.constexpr, offs_p, more, K: tl.constexpr, KP: tl.constexpr, KS: tl.constexpr):
    """Columns [i * KP, (i + 1) * KP) of a [BT, K] workspace tile (w or kd) at rows ``row``; a
    placeholder for parts past KS."""
    if i < KS:
        cols = i * KP + offs_p
        m = (cols < K)[None, :] & more
        return tl.load(ptr + row[:, None] * K + cols[None, :], mask=m, other=0.0)
    else:
        return tl.zeros([1, 1], dtype=tl.float32)


@triton.jit
def _gc_part(gc_ptr, base, i: tl.constexpr, offs_p, more, K: tl.constexpr, KP: tl.constexpr, KS: tl.constexpr):
    """Entries [i * KP, (i + 1) * KP) of a chunk's decay row gc; a placeholder past KS."""
    if i < KS:
        return tl.load(gc_ptr + base + i * KP + offs_p, mask=(i * KP + offs_p < K) & more, other=0.0)
    else:
        return tl.zeros([1], dtype=tl.float32)


@triton.jit
def _chunk_tiles(w_ptr, u_ptr, kd_ptr, gc_ptr, h, NT, c, idx, offs_p, offs_v, mtv, more,
                 K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, KP: tl.constexpr, KS: tl.constexpr):
    """Chunk c's walk operands (zeros when not ``more``): w and kd in KS column parts, u, and gc in
    KS parts (placeholders past KS)."""
    row = (h * NT + c).to(tl.int64) * BT + idx
    gcb = (h * NT + c).to(tl.int64) * K
    u = tl.load(u_ptr + row[:, None] * V + offs_v[None, :], mask=mtv & more, other=0.0)
    return (_chunk_part(w_ptr, row, 0, offs_p, more, K, KP, KS), _chunk_part(w_ptr, row, 1, offs_p, more, K, KP, KS),
            _chunk_part(w_ptr, row, 2, offs_p, more, K, KP, KS), _chunk_part(w_ptr, row, 3, offs_p, more, K, KP, KS),
            _chunk_part(kd_ptr, row, 0, offs_p, more, K, KP, KS), _chunk_part(kd_ptr, row, 1, offs_p, more, K, KP, KS),
            _chunk_part(kd_ptr, row, 2, offs_p, more, K, KP, KS), _chunk_part(kd_ptr, row, 3, offs_p, more, K, KP, KS),
            u, _gc_part(gc_ptr, gcb, 0, offs_p, more, K, KP, KS), _gc_part(gc_ptr, gcb, 1, offs_p, more, K, KP, KS),
            _gc_part(gc_ptr, gcb, 2, offs_p, more, K, KP, KS), _gc_part(gc_ptr, gcb, 3, offs_p, more, K, KP, KS))


@triton.jit
def _store_part(ptr, base, i: tl.constexpr, S, offs_p, offs_v, mv, K: tl.constexpr, V: tl.constexpr,
                KP: tl.constexpr, KS: tl.constexpr):
    """Rows [i * KP, (i + 1) * KP) of a [K, V] state at ``ptr + base`` (nothing past KS)."""
    if i < KS:
        rows = i * KP + offs_p
        tl.store(ptr + (base + rows[:, None]) * V + offs_v[None, :], S, mask=(rows < K)[:, None] & mv[None, :])


@triton.jit
def _kda_prefill_state_kernel(
    w_ptr, u_ptr, kd_ptr, gc_ptr, state_ptr, hs_ptr, final_ptr,
    NT, C0, C1,
    K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    PRECISION: tl.constexpr, USE_GDC: tl.constexpr, KS: tl.constexpr = 1,
):
    """The walk with the state's K rows in KS parts (1, 2 or 4; BK / KS >= 16) held as separate
    tiles: w S is KS independent products summed once, and each part's update its own product,
    so the tensor cores run KS short dependent chains side by side instead of one long one (a
    step's time is its chain of MMAs, not its bytes). It walks chunks C0 .. C1 - 1 (C0 < C1) of
    the NT, from the state at state_ptr to the state after C1 - 1 at final_ptr."""
    h = tl.program_id(0)
    vb = tl.program_id(1)
    KP: tl.constexpr = BK // KS
    idx = tl.arange(0, BT)
    offs_p = tl.arange(0, KP)
    offs_v = vb * BV + tl.arange(0, BV)
    mv = offs_v < V
    mtv = (idx < BT)[:, None] & mv[None, :]

    pdl_wait(USE_GDC)
    pdl_launch_dependents(USE_GDC)

    S0 = _state_part(state_ptr, h, 0, offs_p, offs_v, mv, K, V, KP, KS)
    S1 = _state_part(state_ptr, h, 1, offs_p, offs_v, mv, K, V, KP, KS)
    S2 = _state_part(state_ptr, h, 2, offs_p, offs_v, mv, K, V, KP, KS)
    S3 = _state_part(state_ptr, h, 3, offs_p, offs_v, mv, K, V, KP, KS)

    w0n, w1n, w2n, w3n, k0n, k1n, k2n, k3n, u_next, g0n, g1n, g2n, g3n = _chunk_tiles(
        w_ptr, u_ptr, kd_ptr, gc_ptr, h, NT, C0, idx, offs_p, offs_v, mtv, True, K, V, BT, KP, KS)
    # A while loop rather than range(NT): the interpreter cannot take a runtime bound in range().
    c = C0
    while c < C1:
        w0, w1, w2, w3, k0, k1, k2, k3 = w0n, w1n, w2n, w3n, k0n, k1n, k2n, k3n
        u, g0, g1, g2, g3 = u_next, g0n, g1n, g2n, g3n
        # The next chunk's tiles are requested now and arrive while this chunk's products run.
        w0n, w1n, w2n, w3n, k0n, k1n, k2n, k3n, u_next, g0n, g1n, g2n, g3n = _chunk_tiles(
            w_ptr, u_ptr, kd_ptr, gc_ptr, h, NT, c + 1, idx, offs_p, offs_v, mtv, c + 1 < C1, K, V, BT, KP, KS)

        hs_base = (h * NT + c).to(tl.int64) * K
        _store_part(hs_ptr, hs_base, 0, S0, offs_p, offs_v, mv, K, V, KP, KS)
        _store_part(hs_ptr, hs_base, 1, S1, offs_p, offs_v, mv, K, V, KP, KS)
        _store_part(hs_ptr, hs_base, 2, S2, offs_p, offs_v, mv, K, V, KP, KS)
        _store_part(hs_ptr, hs_base, 3, S3, offs_p, offs_v, mv, K, V, KP, KS)
        WS = tl.dot(w0, S0, input_precision=PRECISION)
        if KS > 1:
            W1 = tl.dot(w1, S1, input_precision=PRECISION)
            if KS > 2:
                W2 = tl.dot(w2, S2, input_precision=PRECISION)
                W3 = tl.dot(w3, S3, input_precision=PRECISION)
                WS = (WS + W1) + (W2 + W3)
            else:
                WS = WS + W1
        U = u - WS                                                                # [BT, BV]
        crow = (h * NT + c).to(tl.int64) * BT + idx
        tl.store(u_ptr + crow[:, None] * V + offs_v[None, :], U, mask=mtv)      # U over u
        S0 = g0[:, None] * S0 + tl.dot(tl.trans(k0), U, input_precision=PRECISION)
        if KS > 1:
            S1 = g1[:, None] * S1 + tl.dot(tl.trans(k1), U, input_precision=PRECISION)
        if KS > 2:
            S2 = g2[:, None] * S2 + tl.dot(tl.trans(k2), U, input_precision=PRECISION)
            S3 = g3[:, None] * S3 + tl.dot(tl.trans(k3), U, input_precision=PRECISION)
        c += 1

    fb = (h * K).to(tl.int64)
    _store_part(final_ptr, fb, 0, S0, offs_p, offs_v, mv, K, V, KP, KS)
    _store_part(final_ptr, fb, 1, S1, offs_p, offs_v, mv, K, V, KP, KS)
    _store_part(final_ptr, fb, 2, S2, offs_p, offs_v, mv, K, V, KP, KS)
    _store_part(final_ptr, fb, 3, S3, offs_p, offs_v, mv, K, V, KP, KS)


@triton.jit(do_not_specialize=["T", "NT"])
def _kda_prefill_output_kernel(
    qg_ptr, p_ptr, u_ptr, hs_ptr, o_ptr,
    T, NT,
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr,
    BV: tl.constexpr, PRECISION: tl.constexpr, USE_GDC: tl.constexpr,
):
    c = tl.program_id(0)
    h = tl.program_id(1)
    vb = tl.program_id(2)
    idx = tl.arange(0, BT)
    offs_k = tl.arange(0, BK)
    mk = offs_k < K
    offs_v = vb * BV + tl.arange(0, BV)
    mv = offs_v < V
    mtk = (idx < BT)[:, None] & mk[None, :]
    mtv = (idx < BT)[:, None] & mv[None, :]

    pdl_wait(USE_GDC)
    pdl_launch_dependents(USE_GDC)

    crow = (h * NT + c).to(tl.int64) * BT + idx
    qg = tl.load(qg_ptr + crow[:, None] * K + offs_k[None, :], mask=mtk, other=0.0)
    P = tl.load(p_ptr + crow[:, None] * BT + idx[None, :])
    U = tl.load(u_ptr + crow[:, None] * V + offs_v[None, :], mask=mtv, other=0.0)
    hs_offs = ((h * NT + c).to(tl.int64) * K + offs_k[:, None]) * V + offs_v[None, :]
    S = tl.load(hs_ptr + hs_offs, mask=mk[:, None] & mv[None, :], other=0.0)
    o = tl.dot(qg, S, input_precision=PRECISION) + tl.dot(P, U, input_precision=PRECISION)
    rows = c * BT + idx
    orow = rows.to(tl.int64) * (H * V) + h * V
    tl.store(o_ptr + orow[:, None] + offs_v[None, :], o, mask=(rows < T)[:, None] & mv[None, :])


def segment_bounds(nt: int, segments: int) -> list[tuple[int, int]]:
    """The chunk ranges [c0, c1) of min(segments, nt) segments of nt chunks, as equal as can be
    (the earlier ones one chunk longer)."""
    n = max(1, min(segments, nt))
    q, r = divmod(nt, n)
    out, c0 = [], 0
    for i in range(n):
        c1 = c0 + q + (1 if i < r else 0)
        out.append((c0, c1))
        c0 = c1
    return out


_WALK_STREAMS: dict[int, torch.cuda.Stream] = {}


def _walk_stream(dev: torch.device) -> torch.cuda.Stream:
    """A high-priority stream per device for the segmented walks: when a chunk-pass CTA leaves an
    SM, the block scheduler gives the walk's waiting CTAs the place first."""
    i = dev.index if dev.index is not None else torch.cuda.current_device()
    if i not in _WALK_STREAMS:
        # torch maps a priority past the device's range to its highest (a lower number is higher).
        _WALK_STREAMS[i] = torch.cuda.Stream(device=i, priority=-100)
    return _WALK_STREAMS[i]


def _last_dim_contiguous(x: torch.Tensor) -> torch.Tensor:
    return x if x.stride(-1) == 1 else x.contiguous()


def kda_prefill_triton(q, k, v, g, beta, state, out=None, final_state=None, *,
                       config: KdaPrefillConfig | None = None, use_pdl: bool | None = None):
    """Launch the chunked prefill over T = q.shape[0] tokens.

    q, k, g [T, H, K]; v [T, H, V]; beta [T, H]; state [H, K, V] fp32 contiguous (only read).
    Returns (o [T, H, V] fp32, final state [H, K, V] fp32), into ``out`` / ``final_state`` when
    given (``final_state`` may be ``state`` itself: each program reads its tile before writing it).
    Arguments are validated by op.check_kda_prefill_args; here only what the addressing relies on
    is asserted.
    """
    T, H, K = q.shape
    V = v.shape[-1]
    assert T >= 1 and state.shape == (H, K, V) and state.dtype == torch.float32 and state.is_contiguous()
    q, k, v, g, beta = (_last_dim_contiguous(x) for x in (q, k, v, g, beta))
    if beta.dim() == 2 and beta.stride(-1) != 1:
        beta = beta.contiguous()
    cfg = config if config is not None else config_for(H, K, V)
    assert cfg.chunk in (16, 32, 64) and cfg.chunk % SUB_BLOCK == 0, cfg
    for bv in (cfg.bv, cfg.bv_out):
        assert bv >= 16 and bv & (bv - 1) == 0, cfg
    assert cfg.precision in ("tf32x3", "ieee"), cfg
    assert cfg.k_split in (1, 2, 4) and max(16, triton.next_power_of_2(K)) // cfg.k_split >= 16, cfg
    if cfg.chunk == 64 and cfg.num_warps_state == 8 and cfg.k_split == 1:
        raise ValueError(f"{cfg}: the state walk at chunk 64 on 8 warps with its state in one K part computes "
                         "wrong results on an H200 (Triton 3.6: relative error ~1 in the final state, with and "
                         "without PDL, at K = V = 128; session 40, benchmarks/results/kda_prefill_configs_s40_c6.log) "
                         "while the interpreter and 4 warps, or k_split=2, agree with the reference; "
                         "use num_warps_state=4 or k_split=2")
    BT = cfg.chunk
    NT = triton.cdiv(T, BT)
    dev = state.device
    if out is None:
        out = torch.empty((T, H, V), device=dev, dtype=torch.float32)
    if final_state is None:
        final_state = torch.empty((H, K, V), device=dev, dtype=torch.float32)
    assert out.shape == (T, H, V) and out.dtype == torch.float32 and out.is_contiguous()
    assert final_state.shape == (H, K, V) and final_state.dtype == torch.float32 and final_state.is_contiguous()
    if use_pdl is None:
        use_pdl = pdl_supported(dev)
    assert not use_pdl or pdl_supported(dev), "PDL requested on a device without PDL support"
    launch = {"launch_pdl": True} if use_pdl else {}

    f32 = dict(device=dev, dtype=torch.float32)
    w = torch.empty((H, NT * BT, K), **f32)
    qg = torch.empty((H, NT * BT, K), **f32)
    kd = torch.empty((H, NT * BT, K), **f32)
    gcum = torch.empty((H, NT * BT, K), **f32)
    u = torch.empty((H, NT * BT, V), **f32)
    p = torch.empty((H, NT * BT, BT), **f32)
    gc = torch.empty((H, NT, K), **f32)
    hs = torch.empty((H, NT, K, V), **f32)     # the state entering each chunk
    BK = max(16, triton.next_power_of_2(K))

    def chunk_pass(c0: int, c1: int) -> None:
        _kda_prefill_chunk_kernel[(c1 - c0, H)](
            q, k, v, g, beta,
            q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
            g.stride(0), g.stride(1), beta.stride(0), beta.stride(1),
            w, u, qg, kd, p, gc, gcum, T, NT, c0,
            K=K, V=V, BT=BT, BC=SUB_BLOCK, BK=BK, BVA=max(16, triton.next_power_of_2(V)),
            PRECISION=cfg.precision, USE_GDC=use_pdl, num_warps=cfg.num_warps_chunk, num_stages=1, **launch,
        )

    def walk(c0: int, c1: int, s_in: torch.Tensor, s_out: torch.Tensor) -> None:
        _kda_prefill_state_kernel[(H, triton.cdiv(V, cfg.bv))](
            w, u, kd, gc, s_in, hs, s_out, NT, c0, c1,
            K=K, V=V, BT=BT, BK=BK, BV=cfg.bv, KS=cfg.k_split,
            PRECISION=cfg.precision, USE_GDC=use_pdl, num_warps=cfg.num_warps_state, num_stages=1, **launch,
        )

    # With more than one segment, segment i's walk runs on a high-priority side stream beside
    # segment i + 1's chunk pass, and the walks carry the state through `carry` (each walk program
    # reads its tile before it writes it). torch.cuda.stream(None) (one segment, the CPU) is a no-op.
    bounds = segment_bounds(NT, cfg.segments)
    side = _walk_stream(dev) if len(bounds) > 1 and dev.type == "cuda" else None
    carry = torch.empty_like(final_state) if len(bounds) > 1 else None
    for i, (c0, c1) in enumerate(bounds):
        chunk_pass(c0, c1)
        if side is not None:
            side.wait_stream(torch.cuda.current_stream(dev))        # this segment's chunk pass
        with torch.cuda.stream(side):
            walk(c0, c1, state if i == 0 else carry, final_state if i == len(bounds) - 1 else carry)
    if side is not None:
        torch.cuda.current_stream(dev).wait_stream(side)   # the output pass, every later use of the workspaces
    _kda_prefill_output_kernel[(NT, H, triton.cdiv(V, cfg.bv_out))](
        qg, p, u, hs, out, T, NT,
        H=H, K=K, V=V, BT=BT, BK=BK, BV=cfg.bv_out,
        PRECISION=cfg.precision, USE_GDC=use_pdl, num_warps=cfg.num_warps_out, num_stages=1, **launch,
    )
    return out, final_state
