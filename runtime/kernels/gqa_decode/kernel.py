"""Triton split kernel for GQA decode attention; the combine is mla_decode's.

Math: naive.py; custom op: op.py; design: README.md.

Split kernel (``_gqa_split_kernel``), grid (cdiv(T, TQ), NS, HKV). Program (q, s, j) owns key/value
head j, cache rows [s * SPLIT_LEN, (s + 1) * SPLIT_LEN) and a query tile of BH = max(16, GP) rows
(GP = next_pow2(G)): TQ = BH / GP queries, each with the G query heads that share head j, so one
load of a key or value tile serves all of them (MQA-style within a group). Each tile row is
masked to the rows its query sees (<= positions[t], and with a sliding window > positions[t] -
window); the online softmax walks the split in tiles of
BLOCK_L rows and stores each (query, head)'s partial (running max m, sum l, unnormalised acc [DV])
in mla_decode's workspace layout [T, HQ, NS(, DV)], so ``_mla_combine_kernel`` (H = HQ, R = DV,
no gate) finishes the job. A query whose positions end before the split writes nothing (split 0
always writes), and the combine reads only the splits a query's position reaches.

Dots as mla_decode's: a 16-bit cache is an exact tensor-core operand; an fp32 query against it is
split into hi + lo halves of the cache dtype (~16 bits kept in bf16), and so are the
probabilities; an fp32 cache uses fp32 (ieee) dots. Rows read past a query's end but before the
tile's last valid row are rows of this sequence already written (finite); rows past every query's
end are masked at the load, so junk there (NaN included) never enters a product.

Batch invariance in T: T is only a grid size; every constexpr comes from (L, HQ, HKV, D, DV)
(config_for), a query's rows enter only their own rows of each product, and its running max and
sum are per row: a decode (T = 1) of a position equals that position's row of a verify chain.
No float atomics.

Queries' RoPE (``inv_freq`` given: the first 2 * len(inv_freq) dims of each query head rotated by
its position, rotate-half or interleaved pairs, runtime/kernels/rope.py; or the angles' cos and sin
from the model's tables ``rope_cos`` / ``rope_sin``, TABLE): each program loads its
query rows and their pair partners, rotates in fp32 and rounds once to the queries' dtype (as
head_cache_write rounds the keys), so the model's separate RoPE kernels on q go.

Output gate (``gate`` [T, HQ, DV] given: Qwen3-Next's gated attention, o * sigmoid(gate)): the
combine multiplies each output element by the sigmoid of its gate in fp32 as it stores it.

PDL: the queries, positions and this step's cache rows are produced upstream, so both kernels wait
at entry (inv_freq, a few L2-resident bytes, is read after the wait with the rope's other inputs).
Above SPLIT_PDL_MAX_T queries the split is launched plainly (measured faster; the same bits), and
``GqaDecodeConfig.split_pdl`` / ``combine_pdl`` take either kernel out of the chain.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from lingc.runtime.kernels.gemm_common import dot_acc
from lingc.runtime.kernels.head_norm import head_norm_cols, head_norm_gain
from lingc.runtime.kernels.mla_decode.kernel import _mla_combine_kernel, softmax_tile, workspace
from lingc.runtime.kernels.positions import position_terms
from lingc.runtime.kernels.rope import rope_cols, rope_rotate, rope_table, rope_table_launch_args
from lingc.runtime.pdl import interpreting, pdl_launch_dependents, pdl_supported, pdl_wait

__all__ = ["GqaDecodeConfig", "config_for", "num_splits", "gqa_decode_triton", "workspace"]

# Programs per context the rule aims for at T = 1 (splits x key/value heads): about one wave on
# 132 SMs. A constant, not a device query, so the split layout (and the bits) depend on the shape.
TARGET_PROGRAMS = 128
# The split kernel is PDL-launched only for chains of up to this many queries. PDL placement never
# changes the arithmetic (tests/test_gqa_decode.py's capture test compares the bits), so unlike the
# config it may depend on T. Session 55 (H100, a Qwen3-Next rank, benchmarks.kernels_attn): at
# T = 6 the split out of the chain took 13.51 -> 12.49 us at 8192 and 48.19 -> 45.84 at 65536; at
# T = 1 the chain is faster at 8192 (11.03 against 12.15) and level at 65536 (34.20 / 33.86).
SPLIT_PDL_MAX_T = 1
MIN_SPLIT_LEN = 128     # session 54's sweep (H100, a Qwen3-Next rank at 8192): 64 splits of 128 rows
                        # 11.4 / 13.3 us at T = 1 / 6, 128 of 64 13.0 / 15.3


@dataclass(frozen=True)
class GqaDecodeConfig:
    split_len: int            # cache rows per split (a multiple of block_l)
    block_l: int = 64         # cache rows per tile (>= 16: tl.dot's smallest K/N)
    num_warps: int = 4
    num_stages: int = 3
    combine_block_r: int = 64     # value columns per combine program
    combine_block_s: int = 32     # splits per combine chunk
    block_h: int = 0              # query-tile rows (queries x padded group); 0 = max(16, next_pow2(G))
    # Each kernel's PDL launch, when PDL is on at all (as MlaDecodeConfig's): False launches that
    # kernel plainly (its wait compiled out), the other one still chained. The same bits.
    split_pdl: bool = True
    combine_pdl: bool = True

    def __post_init__(self):
        if not (self.block_l >= 16 and self.block_l & (self.block_l - 1) == 0):
            raise ValueError(f"GqaDecodeConfig: block_l = {self.block_l} must be a power of two >= 16")
        if self.split_len < self.block_l or self.split_len % self.block_l:
            raise ValueError(f"GqaDecodeConfig: split_len = {self.split_len} must be a multiple of "
                             f"block_l = {self.block_l}")
        if self.block_h and (self.block_h < 16 or self.block_h & (self.block_h - 1)):
            raise ValueError(f"GqaDecodeConfig: block_h = {self.block_h} must be 0 or a power of two >= 16")


def config_for(L: int, HQ: int, HKV: int, D: int, DV: int) -> GqaDecodeConfig:
    """The launch config for a cache capacity L and head shape, never of T or the positions:
    about TARGET_PROGRAMS (splits x key/value heads) at T = 1, splits of at least MIN_SPLIT_LEN
    rows in whole 64-row tiles; wide heads (D or DV > 128) take 8 warps (at 4 a thread holds 206
    registers of the 256-column tiles, at 8 128; 8 warps with 2 stages spilled 12 bytes, with 3
    none: tests/test_gqa_decode.py's compile check). Swept once on an H100 at a Qwen3-Next rank's
    shape (session 54, benchmarks/results/kernels_attn_gqa_sweep_h100_s54_c4.*): at 65536 the
    512-row splits are the best T-independent choice (1024 rows: 37.5 against 34.4 us at T = 1,
    39.2 against 49.1 at T = 6); at 8192 128-row splits beat 64 (the minimum now) and 256."""
    block_l = GqaDecodeConfig.block_l
    splits = max(1, TARGET_PROGRAMS // HKV)
    split = max(MIN_SPLIT_LEN, triton.cdiv(triton.cdiv(L, splits), block_l) * block_l)
    wide = max(D, DV) > 128
    return GqaDecodeConfig(split_len=split, num_warps=8 if wide else 4)


def num_splits(L: int, config: GqaDecodeConfig) -> int:
    return triton.cdiv(L, config.split_len)


@triton.jit(do_not_specialize=["T", "pos_stride", "pos_add", "pos_step", "window"])
def _gqa_split_kernel(
    q_ptr, k_ptr, v_ptr, pos_ptr, freq_ptr, m_ptr, l_ptr, acc_ptr,
    stride_qt, stride_qh, stride_kl, stride_kh, stride_vl, stride_vh, pos_stride, pos_add, pos_step, L, scale,
    window, T, HQ: tl.constexpr, G: tl.constexpr, D: tl.constexpr, DV: tl.constexpr, NS: tl.constexpr,
    GP: tl.constexpr, BH: tl.constexpr, BD: tl.constexpr, BDV: tl.constexpr, BL: tl.constexpr,
    SPLIT_LEN: tl.constexpr, SPLIT_Q: tl.constexpr, SPLIT_P: tl.constexpr, DOT_PRECISION: tl.constexpr,
    DOT_UPCAST: tl.constexpr, USE_GDC: tl.constexpr, HALF: tl.constexpr = 0, INTERLEAVED: tl.constexpr = False,
    w_ptr=None, eps=0.0, NORM: tl.constexpr = False, ROUND_BEFORE_WEIGHT: tl.constexpr = False,
    ZERO_CENTERED: tl.constexpr = False, cos_ptr=None, sin_ptr=None, stride_cr=0, stride_cc=0, stride_sr=0,
    stride_sc=0, TABLE: tl.constexpr = 0, BY_TOKEN: tl.constexpr = False,
):
    TQ: tl.constexpr = BH // GP       # queries per program
    s = tl.program_id(1)
    j = tl.program_id(2)              # the key/value head
    KV_DT: tl.constexpr = k_ptr.dtype.element_ty
    rows = tl.arange(0, BH)
    t = tl.program_id(0) * TQ + rows // GP        # each tile row's query and head of the group
    gi = rows % GP
    h = j * G + gi
    mh = (gi < G) & (t < T)
    offs_d = tl.arange(0, BD)
    md = offs_d < D
    offs_v = tl.arange(0, BDV)
    mv = offs_v < DV

    pdl_wait(USE_GDC)
    pdl_launch_dependents(USE_GDC)

    pos = tl.load(pos_ptr + t * pos_stride, mask=t < T, other=0).to(tl.int32) + pos_add + t * pos_step
    last = tl.minimum(pos, L - 1)
    start = s * SPLIT_LEN
    active = mh & ((start <= last) | (s == 0))
    if tl.max(active.to(tl.int32), axis=0) > 0:
        end = tl.where(active, tl.minimum(start + SPLIT_LEN, last + 1), start)
        end_any = tl.max(end, axis=0)
        # A sliding window: each row sees from pos - window + 1 on; rows before every live row's
        # first are never loaded (a split wholly before a query's window stores m = -inf, l = 0,
        # which the combine weighs by exp(-inf) = 0).
        first = tl.where(window > 0, pos - window + 1, 0)
        first_any = tl.min(tl.where(active, first, end_any), axis=0)
        q_rows = q_ptr + t[:, None] * stride_qt + h[:, None] * stride_qh
        q = tl.load(q_rows + offs_d[None, :], mask=mh[:, None] & md[None, :], other=0.0)
        if NORM:
            # The query's per-head RMSNorm (Qwen3-Next's q_norm) first, rounded to q's dtype as
            # lingc.rmsnorm rounds it (runtime/kernels/head_norm.py); a rotated column's partner
            # is normed from its own load with the row's same factor.
            qf = q.to(tl.float32)
            rinv = tl.rsqrt(tl.sum(qf * qf, axis=1) / D + eps)[:, None]
            q = head_norm_cols(qf, rinv, head_norm_gain(w_ptr, offs_d, md, ZERO_CENTERED)[None, :],
                               q_ptr.dtype.element_ty, ROUND_BEFORE_WEIGHT)
        if HALF > 0:
            # Rotated in fp32 and rounded once to the queries' dtype, as head_cache_write rounds keys.
            # The angles depend on the query, not the head: cos / sin of TQ rows, broadcast to the
            # group's heads (GP times fewer libdevice calls). At a Qwen3-Next rank's shapes this
            # still spills 16 bytes, before the tile loop (the compile check bounds it).
            partner, fidx, sign, rotated = rope_cols(offs_d, HALF, INTERLEAVED)
            tq = tl.program_id(0) * TQ + tl.arange(0, TQ)
            pos_q = tl.load(pos_ptr + tq * pos_stride, mask=tq < T, other=0).to(tl.int32) + pos_add + tq * pos_step
            if TABLE == 0:
                freq = tl.load(freq_ptr + fidx, mask=rotated & md, other=0.0).to(tl.float32)
                ang = pos_q.to(tl.float32)[:, None] * freq[None, :]
                c_q, s_q = tl.cos(ang), tl.sin(ang)
            else:       # the model's cos / sin tables: the query's row (its position's, or its own)
                c_q, s_q = rope_table((tq if BY_TOKEN else pos_q)[:, None], fidx[None, :], offs_d[None, :],
                                      (tq < T)[:, None] & (rotated & md)[None, :], cos_ptr, sin_ptr, stride_cr,
                                      stride_cc, stride_sr, stride_sc, TABLE)
            cs = tl.reshape(tl.broadcast_to(c_q[:, None, :], [TQ, GP, BD]), [BH, BD])
            sn = tl.reshape(tl.broadcast_to(s_q[:, None, :], [TQ, GP, BD]), [BH, BD])
            qp = tl.load(q_rows + partner[None, :], mask=mh[:, None] & (rotated & md)[None, :], other=0.0)
            if NORM:
                qp = head_norm_cols(qp.to(tl.float32), rinv,
                                    head_norm_gain(w_ptr, partner, rotated & md, ZERO_CENTERED)[None, :],
                                    q_ptr.dtype.element_ty, ROUND_BEFORE_WEIGHT)
            q = rope_rotate(q.to(tl.float32), qp.to(tl.float32), cs, sn, sign[None, :], rotated[None, :])
            q = q.to(q_ptr.dtype.element_ty)
        q = q.to(tl.float32)
        q_hi = q.to(KV_DT)
        if SPLIT_Q:
            q_lo = (q - q_hi.to(tl.float32)).to(KV_DT)
        m_i = tl.full([BH], float("-inf"), tl.float32)
        l_i = tl.zeros([BH], tl.float32)
        acc = tl.zeros([BH, BDV], tl.float32)
        k_head = k_ptr + j * stride_kh
        v_head = v_ptr + j * stride_vh
        for i in range(SPLIT_LEN // BL):
            offs_l = start + i * BL + tl.arange(0, BL)
            ml = (offs_l < end_any) & (offs_l >= first_any)
            rows_l = offs_l.to(tl.int64)[:, None]
            k = tl.load(k_head + rows_l * stride_kl + offs_d[None, :], mask=ml[:, None] & md[None, :], other=0.0)
            v = tl.load(v_head + rows_l * stride_vl + offs_v[None, :], mask=ml[:, None] & mv[None, :], other=0.0)
            # Two accumulators summed after (a runtime zero: triton would fold `dot(a, b, 0) + x`
            # into one chain), as mla_decode's.
            zero = tl.zeros([BH, BL], tl.float32) * scale
            sc = dot_acc(q_hi, k, zero, DOT_PRECISION, DOT_UPCAST)
            if SPLIT_Q:
                sc = sc + dot_acc(q_lo, k, zero, DOT_PRECISION, DOT_UPCAST)
            seen = (offs_l[None, :] < end[:, None]) & (offs_l[None, :] >= first[:, None])
            sc = tl.where(seen, sc * scale, float("-inf"))
            m_i, l_i, acc = softmax_tile(sc, v, m_i, l_i, acc, SPLIT_P, DOT_PRECISION, DOT_UPCAST)

        part = (t * HQ + h) * NS + s
        tl.store(m_ptr + part, m_i, mask=active)
        tl.store(l_ptr + part, l_i, mask=active)
        tl.store(acc_ptr + part.to(tl.int64)[:, None] * DV + offs_v[None, :], acc, mask=active[:, None] & mv[None, :])


def gqa_decode_triton(q, k_cache, v_cache, positions, scale: float, out=None, *,
                      config: GqaDecodeConfig | None = None, use_pdl: bool | None = None, partials=None,
                      pos_offset: int | None = None, window: int = 0, inv_freq: torch.Tensor | None = None,
                      interleaved: bool = False, gate: torch.Tensor | None = None,
                      norm_weight: torch.Tensor | None = None, eps: float = 0.0, round_before_weight: bool = False,
                      zero_centered: bool = False, rope_cos: torch.Tensor | None = None,
                      rope_sin: torch.Tensor | None = None, rope_dims: int = 0,
                      rope_by_token: bool = False) -> torch.Tensor:
    """Launch split + combine; returns o [T, HQ, DV] fp32 (``out`` if given: fp32, bf16 or fp16,
    the fp32 result rounded once by the combine's store). Arguments as
    op.check_gqa_decode_args accepts them; ``partials`` (from ``workspace(T, HQ, DV, ns)``) lets a
    caller own or poison the split workspace."""
    T, HQ, D = q.shape
    L, HKV, DV = v_cache.shape
    G = HQ // HKV
    cfg = config or config_for(L, HQ, HKV, D, DV)
    ns = num_splits(L, cfg)
    if out is None:
        out = torch.empty((T, HQ, DV), device=q.device, dtype=torch.float32)
    assert out.shape == (T, HQ, DV) and out.dtype in (torch.float32, torch.bfloat16, torch.float16) \
        and out.is_contiguous()
    if T == 0:
        return out
    m, l, acc = partials if partials is not None else workspace(T, HQ, DV, ns, q.device)
    assert m.shape == l.shape == (T, HQ, ns) and acc.shape == (T, HQ, ns, DV)
    if use_pdl is None:
        use_pdl = pdl_supported(q.device)
    assert not use_pdl or pdl_supported(q.device), "PDL requested on a device without PDL support"
    sixteen = k_cache.dtype != torch.float32          # bf16 or fp16: 16-bit tensor-core dots
    gp = triton.next_power_of_2(G)
    bh = max(16, gp, cfg.block_h)
    pos_terms = position_terms(pos_offset)
    split_pdl, combine_pdl = use_pdl and cfg.split_pdl and T <= SPLIT_PDL_MAX_T, use_pdl and cfg.combine_pdl
    tables = rope_table_launch_args(rope_cos, rope_sin, rope_dims, rope_by_token)
    _gqa_split_kernel[(triton.cdiv(T, bh // gp), ns, HKV)](
        q, k_cache, v_cache, positions, q if inv_freq is None else inv_freq, m, l, acc,
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), v_cache.stride(0), v_cache.stride(1),
        *pos_terms, L, float(scale), int(window),
        T, HQ=HQ, G=G, D=D, DV=DV, NS=ns, GP=gp, BH=bh, BD=max(16, triton.next_power_of_2(D)),
        BDV=max(16, triton.next_power_of_2(DV)), BL=cfg.block_l, SPLIT_LEN=cfg.split_len,
        SPLIT_Q=sixteen and q.dtype != k_cache.dtype, SPLIT_P=sixteen, DOT_PRECISION="ieee",
        DOT_UPCAST=interpreting() and sixteen, USE_GDC=split_pdl,
        HALF=inv_freq.shape[0] if inv_freq is not None else rope_dims // 2, INTERLEAVED=bool(interleaved),
        w_ptr=norm_weight, eps=float(eps), NORM=norm_weight is not None,
        ROUND_BEFORE_WEIGHT=bool(round_before_weight), ZERO_CENTERED=bool(zero_centered), **tables,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages, **({"launch_pdl": True} if split_pdl else {}),
    )
    _mla_combine_kernel[(T, HQ, triton.cdiv(DV, cfg.combine_block_r))](
        m, l, acc, positions, positions if gate is None else gate, out, 0 if gate is None else gate.stride(0),
        0 if gate is None else gate.stride(1), *pos_terms, L,
        H=HQ, R=DV, NS=ns, SPLIT_LEN=cfg.split_len, BS=triton.next_power_of_2(ns),
        BSC=min(cfg.combine_block_s, triton.next_power_of_2(ns)), BRC=cfg.combine_block_r,
        HAS_GATE=gate is not None, GATE_PER_COL=True, USE_GDC=combine_pdl, num_warps=4, num_stages=1,
        **({"launch_pdl": True} if combine_pdl else {}),
    )
    return out
