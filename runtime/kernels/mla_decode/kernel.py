"""Triton kernels for MLA decode attention in latent space: split-K over the cache + combine.

Math and the choice of inputs: README.md; reference: naive.py; custom op: op.py.

Split kernel (``_mla_split_kernel``), grid (cdiv(T, TQ), NS). A program's query tile has
BH = max(16, HP) rows (HP = next_pow2(H)): TQ = BH / HP queries of all their heads at once (the
latent cache row is shared by every head, MQA-style), so with H <= 8 (flash-tp4-rank: 8 heads a
rank) two or more queries fill the 16 rows tl.dot needs anyway, and a verify chain reads each
cache tile and runs its MMAs half as often. Program (q, s) owns queries q*TQ .. q*TQ+TQ-1 and
cache rows [s * SPLIT_LEN, (s + 1) * SPLIT_LEN), each row of the tile masked to the rows its
query sees (<= positions[t]). It walks them in tiles of BLOCK_L rows with the online softmax and
stores each query's partial (running max m, running sum l, unnormalised acc [H, R]) to a
workspace. A query whose positions end before the split writes nothing there (split 0 always
writes). The query axis is the fastest grid axis, so the programs that read the same cache rows
are scheduled together and all but the first hit L2.

Dots. The cache is bf16 (the model's dtype); the query and the probabilities are fp32. Each fp32
operand is split into hi = bf16(x) and lo = bf16(x - hi), and the tile product is
hi @ c + lo @ c on bf16 tensor cores with fp32 accumulation: the cache operand is exact, the
fp32 operand keeps ~16 mantissa bits (error ~2^-17 relative), far closer to the model's fp32 math
than one bf16 rounding of q (2^-9). Operands already in the cache dtype (a bf16 q_rope) skip the
lo half. An fp16 cache (a float16 model) is split the same way into fp16 halves (~22 bits; a
probability below fp16's normal range keeps an absolute error under 2^-25). An fp32 cache uses
one fp32 (ieee) dot.

RoPE (optional, ``ROPE``). With rope_inv_freq the raw q_rope is rotated in the kernel (GPT-J
interleaved pairs, angle positions[t] * inv_freq[i], libdevice sin/cos) and rounded to its
dtype, as lingc/models/layers.apply_rope_interleaved does before the model's ``.float()``.

Combine kernel (``_mla_combine_kernel``), grid (T, H, cdiv(R, BLOCK_RC)). Program (t, h, rb)
reads the partials of splits 0 .. last_split(t) only (so unwritten ones are never touched):
M = max m_s, w_s = exp(m_s - M), o = sum_s w_s acc_s / sum_s w_s l_s, in split order in fixed
chunks, then times sigmoid(gate[t, h]) when a gate is given (with GATE_PER_COL, gqa_decode's
sigmoid(gate[t, h, r]), one per output element).

PDL. Nothing either kernel reads is a weight: the queries, positions, gate and the cache rows
written by this step are all produced upstream, so both wait at entry; only rope_inv_freq (a
constant buffer) is loaded before ``gdc_wait``.

Batch invariance in T: T is only a grid size; SPLIT_LEN, BLOCK_L, the tile and every other
constexpr come from (L, H, R, P) (config_for), never from T. A query's rows enter only their own
rows of each product (tl.dot rows are independent, whichever tile row a query lands in), the
tile's cache rows past a query's end are masked to p = 0 for it (0 * c adds exactly nothing), and
its running max and sum are per row. So query t's partials and output are bitwise the same for
any chain length, and a decode (T = 1) of a position equals that position's row of a verify
chain (tests: CPU interpreter and GPU). No float atomics anywhere.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from lingc.runtime.kernels.gemm_common import dot_acc, register_cap
from lingc.runtime.kernels.positions import position_terms
from lingc.runtime.pdl import interpreting, pdl_launch_dependents, pdl_supported, pdl_wait, pdl_wait_small

__all__ = ["MlaDecodeConfig", "config_for", "num_splits", "mla_decode_triton", "TARGET_SPLITS", "MIN_SPLIT_LEN"]

# Splits per context the rule aims for: about one wave of programs on an H200 (132 SMs) at T = 1.
# A constant, not a device query, so the split layout (and the bits) depend on the shape only.
TARGET_SPLITS = 128
# Shortest split: below it the partials ([T, H, R] fp32 per split, 16 KiB per query at flash-tp4)
# cost more traffic than the cache rows they summarise (128 rows = 144 KiB of bf16 cache).
MIN_SPLIT_LEN = 128


@dataclass(frozen=True)
class MlaDecodeConfig:
    split_len: int            # cache rows per split (a multiple of block_l)
    block_l: int = 64         # cache rows per tile (>= 16: tl.dot's smallest K/N)
    num_warps: int = 4
    num_stages: int = 3
    combine_block_r: int = 64     # latent columns per combine program
    combine_block_s: int = 32     # splits per combine chunk
    # Rows of a split program's query tile (queries x padded heads); 0 = max(16, next_pow2(H)),
    # the fewest tl.dot takes. More rows put more queries of a verify chain in one program, so
    # fewer programs re-read each cache tile; a shape constant like the rest (never from T).
    block_h: int = 0
    # Register cap per thread for the split kernel (Triton's maxnreg; 0 = none): at 128 and 8
    # warps two split programs can share an SM when the tiles leave the shared memory for it.
    max_registers: int = 0
    # Whether the split / the combine take part in the PDL chain when the launch uses PDL. A
    # launch without it waits for its predecessor by stream order and releases its successor
    # when it exits; the bits do not change. config_for turns the split's off at long contexts.
    split_pdl: bool = True
    combine_pdl: bool = True

    def __post_init__(self):
        assert self.block_l >= 16 and self.block_l & (self.block_l - 1) == 0, self
        assert self.split_len % self.block_l == 0, self
        assert self.block_h == 0 or (self.block_h >= 16 and self.block_h & (self.block_h - 1) == 0), self


def config_for(L: int, H: int, R: int, P: int) -> MlaDecodeConfig:
    """The launch config for a cache capacity L and head shape: a function of the shape only,
    never of T or of the positions. SPLIT_LEN = max(128, L / 128 rounded up to whole 64-row
    tiles): 8192 -> 64 splits of 128 rows, 65536 -> 128 of 512, 262144 -> 128 of 2048, and a
    capacity just past one of those (a context plus the decode's rows) keeps ~100-128 splits:
    65840 -> 115 of 576. (A power-of-two split length, the rule until session 34, gave it 65
    splits of 1024: half the SMs idle at T = 1.) The tile (64 rows, 3 stages: the dataclass
    defaults) is the best of the H200 sweeps in benchmarks/results (``benchmarks.kernels_attn
    --split-len / --mla-config``)."""
    block_l = MlaDecodeConfig.block_l
    split = max(MIN_SPLIT_LEN, triton.cdiv(triton.cdiv(L, TARGET_SPLITS), block_l) * block_l)
    bh = max(16, triton.next_power_of_2(H))
    # At 16 x 512 four warps sit at the 255-register limit; two such programs share an SM and
    # win alone at T = 6, but lost in the decode step (session 21), so 8 warps there.
    warps = 4 if bh * triton.next_power_of_2(R) <= 16 * 256 else 8
    # The split joins the PDL chain only at the shortest split length (L <= 16384). Session 19
    # (H200, kernels_attn, split/combine chains over cold layers): at 65536, PDL on both kernels
    # took 45.0 us at T = 1 and 105.8 at T = 6, PDL on either one alone 38.7-39.0 / 99.3-99.4,
    # none 38.4 / 99.1; at 8192 both on took 14.0 / 26.5 and either alone 15.6-15.7 / 26.6-26.8.
    # Between the two the rule is a guess.
    return MlaDecodeConfig(split_len=split, num_warps=warps, split_pdl=split <= MIN_SPLIT_LEN)


def num_splits(L: int, config: MlaDecodeConfig) -> int:
    return triton.cdiv(L, config.split_len)


@triton.jit
def _round_through(x, DT: tl.constexpr, EMULATE_RNE: tl.constexpr):
    """fp32 x rounded to DT (round to nearest even) and back to fp32. EMULATE_RNE (interpreter
    only, bf16) rounds with integer ops: the triton 3.6 interpreter's fp32->bf16 cast truncates,
    while the GPU's cvt.rn and torch round to nearest even."""
    if EMULATE_RNE:
        b = x.to(tl.uint32, bitcast=True)
        b = (b + 0x7FFF + ((b >> 16) & 1)) & 0xFFFF0000
        return b.to(tl.float32, bitcast=True)
    return x.to(DT).to(tl.float32)


@triton.jit
def softmax_tile(sc, vals, m_i, l_i, acc, SPLIT_P: tl.constexpr, DOT_PRECISION: tl.constexpr,
                 DOT_UPCAST: tl.constexpr):
    """One tile of the online softmax: the scaled, masked scores sc [BH, BL] of the tile's rows
    vals [BL, W] folded into the running max m_i, sum l_i and accumulator acc [BH, W]; returns
    them. The probabilities enter the product in vals' dtype, as hi + lo halves with SPLIT_P.
    A row with nothing unmasked yet keeps m = -inf (the safe max keeps it free of NaN)."""
    m_new = tl.maximum(m_i, tl.max(sc, axis=1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp(m_i - m_safe)
    p = tl.exp(sc - m_safe[:, None])
    l_i = l_i * alpha + tl.sum(p, axis=1)
    acc = acc * alpha[:, None]
    p_hi = p.to(vals.dtype)
    acc = dot_acc(p_hi, tl.trans(vals), acc, DOT_PRECISION, DOT_UPCAST)
    if SPLIT_P:
        acc = dot_acc((p - p_hi.to(tl.float32)).to(vals.dtype), tl.trans(vals), acc, DOT_PRECISION, DOT_UPCAST)
    return m_new, l_i, acc


@triton.jit(do_not_specialize=["T", "pos_stride", "pos_add", "pos_step"])
def _mla_split_kernel(
    ql_ptr, qr_ptr, kv_ptr, pos_ptr, freq_ptr, m_ptr, l_ptr, acc_ptr,
    stride_qlt, stride_qlh, stride_qrt, stride_qrh, stride_kv, pos_stride, pos_add, pos_step, L, scale,
    T, H: tl.constexpr, R: tl.constexpr, P: tl.constexpr, NS: tl.constexpr,
    HP: tl.constexpr, BH: tl.constexpr, BR: tl.constexpr, BP: tl.constexpr, BL: tl.constexpr,
    SPLIT_LEN: tl.constexpr, ROPE: tl.constexpr, ROPE_RNE: tl.constexpr, SPLIT_Q: tl.constexpr,
    SPLIT_QR: tl.constexpr, SPLIT_P: tl.constexpr, DOT_PRECISION: tl.constexpr, DOT_UPCAST: tl.constexpr, USE_GDC: tl.constexpr,
):
    TQ: tl.constexpr = BH // HP       # queries per program
    s = tl.program_id(1)
    KV_DT: tl.constexpr = kv_ptr.dtype.element_ty
    rows = tl.arange(0, BH)
    t = tl.program_id(0) * TQ + rows // HP        # each tile row's query and head
    h = rows % HP
    mh = (h < H) & (t < T)
    offs_r = tl.arange(0, BR)
    mr = offs_r < R
    offs_p = tl.arange(0, BP)
    mp = offs_p < P
    if ROPE:
        offs_f = tl.arange(0, BP // 2)
        freq = tl.load(freq_ptr + offs_f, mask=offs_f < P // 2, other=0.0).to(tl.float32)   # a constant buffer

    pdl_wait(USE_GDC)
    pdl_launch_dependents(USE_GDC)

    # positions.py: a [T] tensor (1, 0, 0) or a base n with rows at n + offset + t (0, offset, 1)
    pos = tl.load(pos_ptr + t * pos_stride, mask=t < T, other=0).to(tl.int32) + pos_add + t * pos_step
    last = tl.minimum(pos, L - 1)
    start = s * SPLIT_LEN
    active = mh & ((start <= last) | (s == 0))
    if tl.max(active.to(tl.int32), axis=0) > 0:
        end = tl.where(active, tl.minimum(start + SPLIT_LEN, last + 1), start)
        end_any = tl.max(end, axis=0)
        ql = tl.load(ql_ptr + t[:, None] * stride_qlt + h[:, None] * stride_qlh + offs_r[None, :],
                     mask=mh[:, None] & mr[None, :], other=0.0).to(tl.float32)
        qr = tl.load(qr_ptr + t[:, None] * stride_qrt + h[:, None] * stride_qrh + offs_p[None, :],
                     mask=mh[:, None] & mp[None, :], other=0.0).to(tl.float32)
        if ROPE:
            qe, qo = tl.split(tl.reshape(qr, [BH, BP // 2, 2]))
            ang = pos.to(tl.float32)[:, None] * freq[None, :]
            cos = tl.cos(ang)
            sin = tl.sin(ang)
            qr = tl.reshape(tl.join(qe * cos - qo * sin, qe * sin + qo * cos), [BH, BP])
            qr = _round_through(qr, qr_ptr.dtype.element_ty, ROPE_RNE)    # the model rounds roped q
        ql_hi = ql.to(KV_DT)
        qr_hi = qr.to(KV_DT)
        if SPLIT_Q:
            ql_lo = (ql - ql_hi.to(tl.float32)).to(KV_DT)
        if SPLIT_QR:
            qr_lo = (qr - qr_hi.to(tl.float32)).to(KV_DT)

        m_i = tl.full([BH], float("-inf"), tl.float32)
        l_i = tl.zeros([BH], tl.float32)
        acc = tl.zeros([BH, BR], tl.float32)
        # A constexpr trip count (pipelined on the GPU; the interpreter cannot loop over a runtime
        # bound). For a query, a tile past its end is fully masked: alpha = 1, p = 0, a bitwise
        # no-op. Rows of queries with nothing in this split stay at m = -inf (the safe max keeps
        # them free of NaN) and are not stored.
        for i in range(SPLIT_LEN // BL):
            offs_l = start + i * BL + tl.arange(0, BL)
            ml = offs_l < end_any
            kv_rows = kv_ptr + offs_l.to(tl.int64)[:, None] * stride_kv
            c = tl.load(kv_rows + offs_r[None, :], mask=ml[:, None] & mr[None, :], other=0.0)
            if P > 0:       # P = 0: an MLA without rope dims (NoPE), scores from the latent alone
                kr = tl.load(kv_rows + R + offs_p[None, :], mask=ml[:, None] & mp[None, :], other=0.0)
            # Independent accumulators, summed at the end: each dot is a chain of MMAs on one
            # accumulator, and one chain over hi, lo and the rope part (68 dependent MMAs a tile
            # at R = 512) is the tile's critical path at T = 1; as three chains they overlap.
            # The zero is a runtime value: triton folds `dot(a, b, 0) + x` into `dot(a, b, x)`,
            # which would chain them again.
            zero = tl.zeros([BH, BL], tl.float32) * scale
            sc = dot_acc(ql_hi, c, zero, DOT_PRECISION, DOT_UPCAST)
            if SPLIT_Q:
                sc_lo = dot_acc(ql_lo, c, zero, DOT_PRECISION, DOT_UPCAST)
            if P > 0:
                sc_r = dot_acc(qr_hi, kr, zero, DOT_PRECISION, DOT_UPCAST)
                if SPLIT_QR:
                    sc_r = dot_acc(qr_lo, kr, sc_r, DOT_PRECISION, DOT_UPCAST)
            if SPLIT_Q:
                sc = sc + sc_lo
            if P > 0:
                sc = sc + sc_r
            sc = tl.where(offs_l[None, :] < end[:, None], sc * scale, float("-inf"))
            m_i, l_i, acc = softmax_tile(sc, c, m_i, l_i, acc, SPLIT_P, DOT_PRECISION, DOT_UPCAST)

        part = (t * H + h) * NS + s
        tl.store(m_ptr + part, m_i, mask=active)
        tl.store(l_ptr + part, l_i, mask=active)
        tl.store(acc_ptr + part.to(tl.int64)[:, None] * R + offs_r[None, :], acc, mask=active[:, None] & mr[None, :])


@triton.jit(do_not_specialize=["pos_stride", "pos_add", "pos_step"])
def _mla_combine_kernel(
    m_ptr, l_ptr, acc_ptr, pos_ptr, gate_ptr, out_ptr, stride_gt, stride_gh, pos_stride, pos_add, pos_step, L,
    H: tl.constexpr, R: tl.constexpr, NS: tl.constexpr, SPLIT_LEN: tl.constexpr,
    BS: tl.constexpr, BSC: tl.constexpr, BRC: tl.constexpr, HAS_GATE: tl.constexpr, USE_GDC: tl.constexpr,
    GATE_PER_COL: tl.constexpr = False,
):
    t = tl.program_id(0)
    h = tl.program_id(1)
    offs_r = tl.program_id(2) * BRC + tl.arange(0, BRC)
    mr = offs_r < R

    # A small kernel: the output absorption after it streams w_vc while this one runs.
    pdl_wait_small(USE_GDC)
    pdl_launch_dependents(USE_GDC)

    pos = tl.load(pos_ptr + t * pos_stride).to(tl.int32) + pos_add + t * pos_step
    ns = tl.maximum(tl.minimum(pos, L - 1), 0) // SPLIT_LEN + 1     # the splits the split kernel wrote
    base = (t * H + h) * NS
    offs_s = tl.arange(0, BS)
    ms = offs_s < ns
    m_all = tl.load(m_ptr + base + offs_s, mask=ms, other=float("-inf"))
    m_max = tl.max(m_all, axis=0)
    l_all = tl.load(l_ptr + base + offs_s, mask=ms, other=0.0)
    l_sum = tl.sum(tl.exp(m_all - m_max) * l_all, axis=0)
    o = tl.zeros([BRC], tl.float32)
    # Unrolled (NS / BSC <= 4 chunks): every chunk's loads can be issued before the first sum,
    # so the program waits on one L2 round trip instead of one per chunk (H200, flash-tp4-rank
    # plain decode: 4.7 -> 3.5 us per layer). Same sums in the same order.
    NCH: tl.constexpr = (NS + BSC - 1) // BSC
    for c in tl.static_range(NCH):
        offs = c * BSC + tl.arange(0, BSC)
        msk = offs < ns
        w = tl.exp(tl.load(m_ptr + base + offs, mask=msk, other=float("-inf")) - m_max)
        a = tl.load(acc_ptr + (base + offs).to(tl.int64)[:, None] * R + offs_r[None, :],
                    mask=msk[:, None] & mr[None, :], other=0.0)
        o += tl.sum(w[:, None] * a, axis=0)
    o = o / l_sum
    if HAS_GATE:
        if GATE_PER_COL:          # one gate per output element (Qwen3-Next's gated attention)
            g = tl.load(gate_ptr + t * stride_gt + h * stride_gh + offs_r, mask=mr, other=0.0).to(tl.float32)
        else:                     # one gate per head (MLA's)
            g = tl.load(gate_ptr + t * stride_gt + h * stride_gh).to(tl.float32)
        o = o * tl.sigmoid(g)
    tl.store(out_ptr + (t * H + h) * R + offs_r, o, mask=mr)


def workspace(T: int, H: int, R: int, ns: int, device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The split partials: running max m and sum l [T, H, NS], unnormalised acc [T, H, NS, R]."""
    m = torch.empty((T, H, ns), device=device, dtype=torch.float32)
    return m, torch.empty_like(m), torch.empty((T, H, ns, R), device=device, dtype=torch.float32)


def mla_decode_triton(q_lat, q_rope, kv_cache, positions, scale: float, gate=None, rope_inv_freq=None,
                      out=None, *, config: MlaDecodeConfig | None = None, use_pdl: bool | None = None,
                      partials=None, pos_offset: int | None = None) -> torch.Tensor:
    """Launch split + combine; returns o_lat [T, H, R] fp32 (``out`` if given). Arguments are as
    op.check_mla_decode_args accepts them (``pos_offset``: positions is a [1] base, query t at
    base + pos_offset + t); ``partials`` (from ``workspace``) lets a caller own or poison the
    split workspace."""
    T, H, R = q_lat.shape
    P = q_rope.shape[2]
    L = kv_cache.shape[0]
    assert q_lat.stride(2) == 1 and q_rope.stride(2) == 1 and kv_cache.stride(1) == 1
    cfg = config or config_for(L, H, R, P)
    ns = num_splits(L, cfg)
    if out is None:
        out = torch.empty((T, H, R), device=q_lat.device, dtype=torch.float32)
    assert out.shape == (T, H, R) and out.dtype == torch.float32 and out.is_contiguous()
    if T == 0:
        return out
    m, l, acc = partials if partials is not None else workspace(T, H, R, ns, q_lat.device)
    assert m.shape == l.shape == (T, H, ns) and acc.shape == (T, H, ns, R)
    if use_pdl is None:
        use_pdl = pdl_supported(q_lat.device)
    assert not use_pdl or pdl_supported(q_lat.device), "PDL requested on a device without PDL support"
    split_pdl, combine_pdl = use_pdl and cfg.split_pdl, use_pdl and cfg.combine_pdl
    kv_bf16 = kv_cache.dtype != torch.float32          # bf16 or fp16: 16-bit tensor-core dots
    rope = rope_inv_freq is not None
    hp = triton.next_power_of_2(H)
    bh = max(16, hp, cfg.block_h)
    pos_terms = position_terms(pos_offset)
    _mla_split_kernel[(triton.cdiv(T, bh // hp), ns)](
        q_lat, q_rope, kv_cache, positions, rope_inv_freq if rope else positions, m, l, acc,
        q_lat.stride(0), q_lat.stride(1), q_rope.stride(0), q_rope.stride(1), kv_cache.stride(0), *pos_terms,
        L, float(scale),
        T, H=H, R=R, P=P, NS=ns, HP=hp, BH=bh, BR=max(16, triton.next_power_of_2(R)),
        BP=max(16, triton.next_power_of_2(P)), BL=cfg.block_l, SPLIT_LEN=cfg.split_len, ROPE=rope,
        ROPE_RNE=interpreting() and q_rope.dtype == torch.bfloat16,
        SPLIT_Q=kv_bf16 and q_lat.dtype != kv_cache.dtype, SPLIT_QR=kv_bf16 and q_rope.dtype != kv_cache.dtype,
        SPLIT_P=kv_bf16, DOT_PRECISION="ieee", DOT_UPCAST=interpreting() and kv_bf16, USE_GDC=split_pdl,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages, **({"launch_pdl": True} if split_pdl else {}),
        **register_cap(cfg.max_registers),
    )
    g = gate if gate is not None else positions
    _mla_combine_kernel[(T, H, triton.cdiv(R, cfg.combine_block_r))](
        m, l, acc, positions, g, out, g.stride(0), g.stride(-1) if gate is not None else 0, *pos_terms, L,
        H=H, R=R, NS=ns, SPLIT_LEN=cfg.split_len, BS=triton.next_power_of_2(ns),
        BSC=min(cfg.combine_block_s, triton.next_power_of_2(ns)), BRC=cfg.combine_block_r,
        HAS_GATE=gate is not None, USE_GDC=combine_pdl, num_warps=4, num_stages=1,
        **({"launch_pdl": True} if combine_pdl else {}),
    )
    return out
