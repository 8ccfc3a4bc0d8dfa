"""Triton kernels for the chunked KDA prefill: a parallel per-chunk pass, then a sequential
state pass.

Math and derivation: README.md in this folder; reference: naive.py (kda_math.kda_chunked);
custom op: op.py.

1. ``_kda_prefill_chunk_kernel``, grid (NT, H), NT = cdiv(T, BT): everything of a chunk that does
   not depend on the state entering it. With G the in-chunk cumulative log decay (tl.cumsum):
   - A[s, r] = k_s . (exp(G_s - G_r) k_r) (r < s) and P[t, r] = q_t . (exp(G_t - G_r) k_r)
     (r <= t), one column r at a time: the pairwise decay is formed elementwise for s >= r only
     (exponent <= 0), so nothing overflows however strong the decay (exp(G) * exp(-G) would
     overflow past |G| ~ 88, i.e. within 18 tokens at the gate's lower bound -5);
   - M^-1 for the unit lower-triangular M = I + diag(beta) A, by forward substitution in fp32
     registers, one row at a time;
   - w = M^-1 (beta exp(G) k), u = M^-1 (beta v), qg = exp(G) q, kd = exp(G_C - G) k,
     gc = exp(G_C), all written to fp32 workspaces laid out [H, NT*BT, *] (padding rows zero).
2. ``_kda_prefill_state_kernel``, grid (H, cdiv(V, BV)): a program owns head h and BV columns of
   the state, keeps S [K, BV] fp32 in registers and walks the chunks in order:
       U = u - w S;   o = qg S + P U;   S = diag(gc) S + kd^T U
   Columns of V never interact (all reductions run over K or over the chunk), so V tiling needs no
   communication. The per-chunk work is four small matrix products.

Padding. Rows t >= T of the last chunk load k = q = v = g = beta = 0: their A/P rows and columns
are zero, G stays flat (so G_C is the last real row's), their w/u/kd rows are zero and they add
nothing to the state; their outputs are not stored.

Precision. Every product is fp32 (``tl.dot(..., input_precision="ieee")`` by default, no TF32):
the sequential pass multiplies the state by a new matrix every chunk, and the tests hold the
kernel to fp32 tolerance against the recurrence. ``KdaPrefillConfig.precision = "tf32x3"`` is
offered for speed experiments (3xTF32 keeps ~fp32 accuracy on tensor cores).

PDL. Neither kernel has producer-independent loads worth issuing early (everything they read is an
activation or the state), so both wait at entry and release their dependents right after.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from lingc.runtime.pdl import pdl_launch_dependents, pdl_supported, pdl_wait

__all__ = ["KdaPrefillConfig", "CONFIGS", "config_for", "kda_prefill_triton"]

# Programs the state pass aims for: it is the serial part, so parallelism comes from H x V tiles
# only. At H = 8, K = V = 128 that is BV = 16 (64 programs); tl.dot needs BV >= 16.
_TARGET_STATE_PROGRAMS = 128


@dataclass(frozen=True)
class KdaPrefillConfig:
    chunk: int = 64            # BT: rows per chunk (16, 32 or 64; tl.dot needs >= 16)
    bv: int = 16               # V columns per state-pass program (power of two >= 16)
    num_warps_chunk: int = 8   # the chunk pass holds several [BT, K] fp32 tiles
    num_warps_state: int = 4
    precision: str = "ieee"    # tl.dot input precision: "ieee" (fp32) or "tf32x3"


# Fixed table keyed by (H, K, V). flash-tp4-rank from the H200 sweep of
# benchmarks/kernels_kda_prefill.py at T = 8192 (ms per layer, ieee / tf32x3): chunk 32, BV 16:
# 4.3 / 4.2; chunk 64, BV 16: 6.0 / 5.0; chunk 32, BV 32: 6.4 / 5.1; chunk 64, BV 32: 32 / 5.4
# (the chunk pass spills at chunk 64 and not at 32). flash (H = 32) is not swept yet.
CONFIGS: dict[tuple[int, int, int], KdaPrefillConfig] = {
    (8, 128, 128): KdaPrefillConfig(chunk=32, bv=16),
    (32, 128, 128): KdaPrefillConfig(chunk=32, bv=32),
}


def config_for(h: int, k: int, v: int) -> KdaPrefillConfig:
    """The table entry, else BV aiming at about _TARGET_STATE_PROGRAMS state-pass programs."""
    if (h, k, v) in CONFIGS:
        return CONFIGS[(h, k, v)]
    blocks = max(1, _TARGET_STATE_PROGRAMS // h)
    bv = min(max(16, triton.next_power_of_2(v)), max(16, triton.next_power_of_2(triton.cdiv(v, blocks))))
    return KdaPrefillConfig(bv=bv)


@triton.jit(do_not_specialize=["T", "NT"])
def _kda_prefill_chunk_kernel(
    q_ptr, k_ptr, v_ptr, g_ptr, b_ptr,
    sq_t, sq_h, sk_t, sk_h, sv_t, sv_h, sg_t, sg_h, sb_t, sb_h,
    w_ptr, u_ptr, qg_ptr, kd_ptr, p_ptr, gc_ptr,
    T, NT,
    K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, BVA: tl.constexpr,
    PRECISION: tl.constexpr, USE_GDC: tl.constexpr,
):
    c = tl.program_id(0)
    h = tl.program_id(1)
    idx = tl.arange(0, BT)
    rows = c * BT + idx
    mt = rows < T
    offs_k = tl.arange(0, BK)
    mk = offs_k < K
    offs_v = tl.arange(0, BVA)
    mv = offs_v < V
    mtk = mt[:, None] & mk[None, :]
    mtv = mt[:, None] & mv[None, :]

    pdl_wait(USE_GDC)
    pdl_launch_dependents(USE_GDC)

    rows64 = rows.to(tl.int64)
    q = tl.load(q_ptr + rows64[:, None] * sq_t + h * sq_h + offs_k[None, :], mask=mtk, other=0.0).to(tl.float32)
    k = tl.load(k_ptr + rows64[:, None] * sk_t + h * sk_h + offs_k[None, :], mask=mtk, other=0.0).to(tl.float32)
    g = tl.load(g_ptr + rows64[:, None] * sg_t + h * sg_h + offs_k[None, :], mask=mtk, other=0.0).to(tl.float32)
    v = tl.load(v_ptr + rows64[:, None] * sv_t + h * sv_h + offs_v[None, :], mask=mtv, other=0.0).to(tl.float32)
    beta = tl.load(b_ptr + rows64 * sb_t + h * sb_h, mask=mt, other=0.0).to(tl.float32)

    G = tl.cumsum(g, axis=0)                                    # [BT, BK] in-chunk cumulative decay

    # A (strictly lower) and P (lower, diagonal included), column r at a time. Row r of a register
    # tile is taken by a masked sum (exact: the other terms are zeros).
    A = tl.zeros((BT, BT), dtype=tl.float32)
    P = tl.zeros((BT, BT), dtype=tl.float32)
    for r in range(0, BT):
        sel = idx == r
        k_r = tl.sum(tl.where(sel[:, None], k, 0.0), axis=0)     # [BK]
        G_r = tl.sum(tl.where(sel[:, None], G, 0.0), axis=0)
        later = idx >= r
        d = tl.exp(tl.where(later[:, None], G - G_r[None, :], float("-inf")))  # exp(G_s - G_r), s >= r
        kr = d * k_r[None, :]
        a_col = tl.where(idx > r, tl.sum(k * kr, axis=1), 0.0)  # [BT] over s
        p_col = tl.sum(q * kr, axis=1)
        A = tl.where(sel[None, :], a_col[:, None], A)
        P = tl.where(sel[None, :], p_col[:, None], P)

    # M^-1 for M = I + diag(beta) A: row i = e_i - sum_{j<i} L[i, j] row j, L = diag(beta) A.
    L = A * beta[:, None]
    Minv = tl.zeros((BT, BT), dtype=tl.float32)
    for i in range(0, BT):
        sel = idx == i
        l_i = tl.sum(tl.where(sel[:, None], L, 0.0), axis=0)    # L[i, :] over j (zero for j >= i)
        row = tl.where(sel, 1.0, 0.0) - tl.sum(l_i[:, None] * Minv, axis=0)
        Minv = tl.where(sel[:, None], row[None, :], Minv)

    eG = tl.exp(G)
    G_C = tl.sum(tl.where((idx == BT - 1)[:, None], G, 0.0), axis=0)   # padding rows keep G flat
    w = tl.dot(Minv, beta[:, None] * eG * k, input_precision=PRECISION)
    u = tl.dot(Minv, beta[:, None] * v, input_precision=PRECISION)
    qg = eG * q
    kd = tl.exp(G_C[None, :] - G) * k

    # Workspaces [H, NT*BT, *]: each head's chunks contiguous for the state pass.
    wrow = (h * NT + c).to(tl.int64) * BT + idx
    mwk = (idx < BT)[:, None] & mk[None, :]
    tl.store(w_ptr + wrow[:, None] * K + offs_k[None, :], w, mask=mwk)
    tl.store(qg_ptr + wrow[:, None] * K + offs_k[None, :], qg, mask=mwk)
    tl.store(kd_ptr + wrow[:, None] * K + offs_k[None, :], kd, mask=mwk)
    tl.store(u_ptr + wrow[:, None] * V + offs_v[None, :], u, mask=(idx < BT)[:, None] & mv[None, :])
    tl.store(p_ptr + wrow[:, None] * BT + idx[None, :], P)
    tl.store(gc_ptr + (h * NT + c).to(tl.int64) * K + offs_k, tl.exp(G_C), mask=mk)


@triton.jit(do_not_specialize=["T", "NT"])
def _kda_prefill_state_kernel(
    w_ptr, u_ptr, qg_ptr, kd_ptr, p_ptr, gc_ptr, state_ptr, o_ptr, final_ptr,
    T, NT,
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr,
    BV: tl.constexpr, PRECISION: tl.constexpr, USE_GDC: tl.constexpr,
):
    h = tl.program_id(0)
    vb = tl.program_id(1)
    idx = tl.arange(0, BT)
    offs_k = tl.arange(0, BK)
    mk = offs_k < K
    offs_v = vb * BV + tl.arange(0, BV)
    mv = offs_v < V
    mkv = mk[:, None] & mv[None, :]
    mtk = (idx < BT)[:, None] & mk[None, :]
    mtv = (idx < BT)[:, None] & mv[None, :]

    pdl_wait(USE_GDC)
    pdl_launch_dependents(USE_GDC)

    s_offs = h * K * V + offs_k[:, None] * V + offs_v[None, :]
    S = tl.load(state_ptr + s_offs, mask=mkv, other=0.0)

    # A while loop rather than range(NT): the interpreter cannot take a runtime bound in range().
    c = 0
    while c < NT:
        wrow = (h * NT + c).to(tl.int64) * BT + idx
        w = tl.load(w_ptr + wrow[:, None] * K + offs_k[None, :], mask=mtk, other=0.0)
        qg = tl.load(qg_ptr + wrow[:, None] * K + offs_k[None, :], mask=mtk, other=0.0)
        kd = tl.load(kd_ptr + wrow[:, None] * K + offs_k[None, :], mask=mtk, other=0.0)
        u = tl.load(u_ptr + wrow[:, None] * V + offs_v[None, :], mask=mtv, other=0.0)
        P = tl.load(p_ptr + wrow[:, None] * BT + idx[None, :])
        gc = tl.load(gc_ptr + (h * NT + c).to(tl.int64) * K + offs_k, mask=mk, other=0.0)

        U = u - tl.dot(w, S, input_precision=PRECISION)                          # [BT, BV]
        o = tl.dot(qg, S, input_precision=PRECISION) + tl.dot(P, U, input_precision=PRECISION)
        rows = c * BT + idx
        orow = rows.to(tl.int64) * (H * V) + h * V
        tl.store(o_ptr + orow[:, None] + offs_v[None, :], o, mask=(rows < T)[:, None] & mv[None, :])
        S = gc[:, None] * S + tl.dot(tl.trans(kd), U, input_precision=PRECISION)
        c += 1

    tl.store(final_ptr + s_offs, S, mask=mkv)


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
    assert cfg.chunk in (16, 32, 64) and cfg.bv >= 16 and cfg.bv & (cfg.bv - 1) == 0, cfg
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
    u = torch.empty((H, NT * BT, V), **f32)
    p = torch.empty((H, NT * BT, BT), **f32)
    gc = torch.empty((H, NT, K), **f32)
    BK = max(16, triton.next_power_of_2(K))
    _kda_prefill_chunk_kernel[(NT, H)](
        q, k, v, g, beta,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        g.stride(0), g.stride(1), beta.stride(0), beta.stride(1),
        w, u, qg, kd, p, gc, T, NT,
        K=K, V=V, BT=BT, BK=BK, BVA=max(16, triton.next_power_of_2(V)),
        PRECISION=cfg.precision, USE_GDC=use_pdl, num_warps=cfg.num_warps_chunk, num_stages=1, **launch,
    )
    _kda_prefill_state_kernel[(H, triton.cdiv(V, cfg.bv))](
        w, u, qg, kd, p, gc, state, out, final_state, T, NT,
        H=H, K=K, V=V, BT=BT, BK=BK, BV=cfg.bv,
        PRECISION=cfg.precision, USE_GDC=use_pdl, num_warps=cfg.num_warps_state, num_stages=1, **launch,
    )
    return out, final_state
