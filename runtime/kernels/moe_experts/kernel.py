"""Triton fused-MoE experts for decode: align -> up-GEMM(+SwiGLU) -> down-GEMM(+combine), PDL-chained
(one token: up-GEMM -> down-GEMM on the slot layout, no align launch; README.md, "One token").

Layout and derivations: README.md in this folder; reference: naive.py.

Input layout (``moe_align``, block size ``BLOCK_M`` = 16): pair ``p = t * K' + j`` (K' = k + 1
with the shared expert, which is expert ``E``), ``sorted_pair_ids`` groups the pairs by expert in
blocks of 16 slots padded with the sentinel P, ``block_expert_ids[b]`` is block b's expert and
``total_padded`` the published slot count. Every block holds ONE expert, so a CTA reads one
expert's weights and multiplies them with up to 16 gathered token rows.

Up-GEMM (``_moe_up_kernel``), grid ``(split_k, n_tiles, cdiv(T, 16) + n_blocks)``: a
CTA owns one block, ``BLOCK_N`` activation columns (2*BLOCK_N weight rows, gate and up
interleaved as in swiglu_gemm) and one H chunk of ``CHUNK_K``. The first cdiv(T, 16) blocks of
the grid own the shared expert, 16 tokens each (the shared expert's bucket in the align layout is
skipped by the routed CTAs): its weights are producer-independent, so they load their tile
before ``gdc_wait``, and being first in the grid they are scheduled first. A routed CTA's expert
id is its producer's output, so it waits first, reads its block's expert id (moe_align marks the
blocks past ``total_padded`` "no expert", E + 1, so no total is read first), skips ids >= E, then
loads its whole weight chunk in one load. Then the 16 gathered x rows, one ``tl.dot`` and, with
``split_k > 1``, the fp32 partial stored by pair; the chunk that draws the last integer ticket of
its (block, tile) sums the partials in chunk order 0..split_k-1 and applies the SwiGLU epilogue
(swiglu_gemm's, with the clamp), rounding the activation to x.dtype into ``act[pair]``.
With ``block_k > 0`` (the loop design) a CTA streams its chunk through a software-pipelined loop
of block_k-wide tiles (``up_stages`` deep, cp.async into shared memory) instead of holding it in
registers from one load; its shared-expert CTAs then load nothing before the wait. With
``up_gemv`` the up-GEMM runs on CUDA cores instead (up_gemv_kernel.py: H whole, no split-K; a
sweep dimension, slower than this one on the H200).

Down-GEMM + combine (``_moe_down_kernel``), grid ``(n_htiles, n_blocks)``: a CTA owns
one block and ``BLOCK_H`` output columns over the whole intermediate size. Its weight tile is
loaded BEFORE ``gdc_wait``: the block's expert id comes from moe_align, two launches back, which
has completed by the time this kernel can start (README.md, "PDL"). After the
wait it gathers the 16 activation rows, does one ``tl.dot`` and stores fp32 ``y[pair]``; every
active block then takes a ticket for its column tile, and the last one combines that tile for
every token: ``sum_j topk_weights[t, j] * y[t, j]`` in slot order, the shared expert last, in fp32,
rounded once into ``out`` (no float atomics).

Batch invariance (design.md): the configuration is a function of (max(I, Is), H) only; T and P
are not specialised; a token's row is multiplied in a 16-row tile whose other rows do not enter
its dot products; split-K partials and the combine are summed in a fixed order. So a token's bits
do not depend on which other tokens share its blocks.
"""
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from lingc.runtime.kernels.gemm_common import BLOCK_M, register_cap, split_k_tickets
from lingc.runtime.kernels.gemm_common import dot_acc as _dot_acc
from lingc.runtime.kernels.gemm_common import dot_args
from lingc.runtime.kernels.moe_align.kernel import SINGLE_LAUNCH_MAX_PAIRS, moe_align_triton
from lingc.runtime.kernels.moe_align.naive import align_sizes
from lingc.runtime.kernels.swiglu_gemm.kernel import _swiglu  # the SwiGLU epilogue (with clamp)
from lingc.runtime.kernels.gemm.gemv_kernel import k_tiles_pow2
from lingc.runtime.pdl import pdl_launch_dependents, pdl_supported, pdl_wait, pdl_wait_then_release

from .up_gemv_kernel import _moe_up_gemv_kernel

__all__ = [
    "BLOCK_M", "COMBINE_T", "CONFIGS", "MoeExpertsBuffers", "MoeExpertsConfig", "alloc_buffers", "config_for",
    "moe_experts_triton", "up_chunks",
]

# Tokens the combine handles per step (a [COMBINE_T, BLOCK_H] fp32 accumulator).
COMBINE_T = 8
# H columns per step of a gated shared expert's sigmoid(x . w) in the combine ([COMBINE_T, 512]).
SIG_CHUNK = 512


@dataclass(frozen=True)
class MoeExpertsConfig:
    block_n: int  # up-GEMM: activation columns per CTA (2*block_n weight rows); 2*block_n >= 16
    split_k: int  # up-GEMM: H chunks (power-of-two chunk), reduced in-launch by ticket; 1 = none
    up_warps: int
    block_h: int  # down-GEMM: output columns per CTA, >= 16; K (= I) is loaded whole
    down_warps: int
    # ptxas register cap per thread for the up-GEMM (0 = the compiler's choice): fewer registers,
    # more resident CTAs, so a T = 1 grid fits one wave (and later waves start sooner).
    up_maxnreg: int = 0
    down_maxnreg: int = 0  # the same for the down-GEMM
    # Up-GEMM design. 0: a CTA loads its whole H chunk in one load (the shared expert's before
    # gdc_wait); > 0: a software-pipelined loop over block_k-wide tiles of the chunk, up_stages
    # deep (cp.async into shared memory: the bytes in flight are not bounded by registers).
    block_k: int = 0
    up_stages: int = 1
    # The up-GEMM as a GEMV on CUDA cores (up_gemv_kernel.py): block_n activation columns (a
    # power of two, >= 1) over the whole of H per CTA, no split-K (split_k must be 1, block_k 0).
    up_gemv: bool = False
    # Down-GEMM warps for one token (the slot layout), 0 = down_warps. The down-GEMM takes I whole
    # in one dot and its warps split the output tile, never K, so a token's bits do not depend on
    # them (only the up-GEMM's H chunks decide: ``up_chunks``); the one-token grid is nine blocks,
    # where more warps per CTA put more of the tile's loads in flight.
    down_warps_one_token: int = 0

    def __post_init__(self):
        for name in ("up_warps", "down_warps", "down_warps_one_token"):
            w = getattr(self, name)
            if w < (0 if name == "down_warps_one_token" else 1) or w & (w - 1) or w > 16:
                raise ValueError(f"MoeExpertsConfig.{name}={w}: use a power of two from 1 to 16"
                                 + (" (or 0: down_warps)" if name == "down_warps_one_token" else ""))
        if self.block_k and (self.block_k < 16 or self.block_k & (self.block_k - 1)):
            raise ValueError(f"MoeExpertsConfig.block_k={self.block_k}: use 0 (one load per chunk) or a "
                             f"power of two >= 16")
        if self.up_gemv and (self.split_k != 1 or self.block_k or self.block_n & (self.block_n - 1)):
            raise ValueError(f"MoeExpertsConfig(up_gemv=True, block_n={self.block_n}, split_k={self.split_k}, "
                             f"block_k={self.block_k}): the GEMV up-GEMM takes H whole (split_k=1, block_k=0) "
                             f"and a power-of-two block_n")
        if not self.up_gemv and 2 * self.block_n < 16:
            raise ValueError(f"MoeExpertsConfig.block_n={self.block_n}: the tensor-core up-GEMM needs "
                             f"2 * block_n >= 16 (tl.dot's least N); use up_gemv=True for narrower CTAs")


# Fixed launch table keyed by (max(I, Is), H). I = 192 is measured (H200, 40 cold layers,
# `python -m benchmarks.moe_sweep`, 2026-11-29; results/moe_sweep_flash-tp4-rank.json): block_n 32
# x split_k 10 (chunk 256, 32 KB of weights per CTA, 60 CTAs per expert) was the best of 11 over
# T = 1 and 6 (16.2 / 52.2 us per layer for align + up + down, against 16.9 / 54.9 us for the
# former 16 x 5 and 23.8 / 87.1 us for 16 x 3); the down-GEMM's block_h barely mattered (32 to
# 128 within 2%, 16 is 18% slower). I = 768 takes swiglu_gemm's H200 entry for the same (N, K),
# unmeasured here: 240 CTAs per expert with 32 KB of weights; down-GEMM tile [32, 1024] (48 KB).
# Registers (sm_90, ptxas -v, no spills): down 96 at 64 columns (I = 192, 5 CTAs per SM; 168 at
# the table's 128) / 182 (8 warps, one
# CTA per SM; 16 columns at 4 warps took 214 and held half the bytes in flight); up 114, capped at
# 96 for I = 192 so five CTAs fit an SM (T = 1: 16.0 -> 13.9 us, T = 6: 48.7 -> 48.0 us, session 7).
# The loop design (block_k > 0) did not beat the one-shot entry over T = 1 + 6 (session 17,
# `moe_sweep --set loop`, align + up + down us per layer): 64 rows x 2 chunks of 128-wide tiles, 4
# stages, took 46.4 us at T = 6 against 48.0 but 14.5 at T = 1 against 12.8 (54 CTAs at T = 1);
# a token's bits may not depend on T, so one config serves both. Only the H chunks decide the
# bits (`up_chunks`): session 18 (`moe_sweep --set chunk`, the same bits checked on the GPU) timed
# column tiles, load designs and down tiles around the table with its chunks; the down-GEMM's
# 128-column tile (168 registers, three CTAs per SM) took 46.8 us at T = 6 against 47.7 for 64
# columns, 12.9 against 12.9 at T = 1, and with 8 warps 12.5 at T = 1 (48.6 at T = 6): hence
# ``down_warps_one_token``; no up-GEMM variant beat the table's at either T.
CONFIGS: dict[tuple[int, int], MoeExpertsConfig] = {
    (192, 2560): MoeExpertsConfig(block_n=32, split_k=10, up_warps=4, block_h=128, down_warps=4,
                                  up_maxnreg=96, down_warps_one_token=8),
    (768, 2560): MoeExpertsConfig(block_n=32, split_k=10, up_warps=4, block_h=32, down_warps=8),
    # Qwen3-Next-80B on one GPU of four (I = Is = 512 / 4, H = 2048), measured on an H100
    # (`benchmarks.kernels_qwen3_moe`, 40 cold layers, one call, 2026-12-05, session 49): 16
    # columns x 8 chunks of 256, Ling-3's down tile and caps: 19.17 / 54.25 us at T = 1 / 6 against
    # 20.62 / 54.94 for the rule's config (16 x 4 chunks of 512, 64-column down tile), 20.34 / 53.71
    # for 32 columns and 24.79 / 90.89 for 32 columns x 4 chunks.
    (128, 2048): MoeExpertsConfig(block_n=16, split_k=8, up_warps=4, block_h=128, down_warps=4,
                                  up_maxnreg=96, down_warps_one_token=8),
}


def config_for(n_max: int, h: int) -> MoeExpertsConfig:
    """The launch config for intermediate size n_max = max(I, Is) and hidden size H: the table
    entry, else a rule of (n_max, H) alone (never of T: batch invariance)."""
    if (n_max, h) in CONFIGS:
        return CONFIGS[(n_max, h)]
    chunk = min(512, max(16, triton.next_power_of_2(h)))
    kpad = max(16, triton.next_power_of_2(n_max))
    return MoeExpertsConfig(block_n=16, split_k=triton.cdiv(h, chunk), up_warps=4,
                            block_h=64 if kpad <= 256 else 32, down_warps=4 if kpad <= 256 else 8)


def up_chunks(cfg: MoeExpertsConfig, h: int) -> tuple[int, int]:
    """(chunk, split_k): the up-GEMM's H chunk per CTA (one power-of-two load, or, in the loop
    design, whole block_k tiles) and the chunk count. Two configs with the same chunks give a
    token the same bits: each chunk is one run of k16 MMAs from its start and the partials are
    summed in chunk order, whatever the column tile, the load design or the down-GEMM's tile
    (the down-GEMM takes I whole in one dot)."""
    if cfg.up_gemv:
        return h, 1     # H whole, on CUDA cores: these bits are the GEMV's (up_gemv_kernel.py)
    if cfg.block_k:
        chunk = triton.cdiv(triton.cdiv(h, cfg.split_k), cfg.block_k) * cfg.block_k
    else:
        chunk = triton.next_power_of_2(triton.cdiv(h, cfg.split_k))
    return chunk, triton.cdiv(h, chunk)


@triton.jit
def _up_tile(
    w, tok, valid, pair, n_e, lim, rows_w, offs_k, mask_k, tile, pid_k, pid_n,
    x_ptr, act_ptr, ws_ptr, ticket_ptr, stride_xt, stride_xh, stride_act, stride_ws_s, stride_ws_p,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, SPLIT_K: tl.constexpr, HAS_LIMIT: tl.constexpr,
    DOT_PRECISION: tl.constexpr, DOT_UPCAST: tl.constexpr,
):
    """One CTA's product of its weight chunk w [2*BLOCK_N, CHUNK_K] with the gathered x rows of
    ``tok`` (masked by ``valid``), then the SwiGLU epilogue (``_up_epilogue``)."""
    x = tl.load(x_ptr + tok[:, None] * stride_xt + offs_k[None, :] * stride_xh,
                mask=valid[:, None] & mask_k[None, :], other=0.0)
    acc = _dot_acc(x, w, tl.zeros((BLOCK_M, 2 * BLOCK_N), dtype=tl.float32), DOT_PRECISION, DOT_UPCAST)
    _up_epilogue(acc, valid, pair, n_e, lim, rows_w, tile, pid_k, pid_n, act_ptr, ws_ptr, ticket_ptr,
                 stride_act, stride_ws_s, stride_ws_p, BLOCK_M, BLOCK_N, SPLIT_K, HAS_LIMIT)


@triton.jit
def _up_tile_loop(
    w_rows, w_ok, tok, valid, pair, n_e, lim, rows_w, k0, H, tile, pid_k, pid_n,
    x_ptr, act_ptr, ws_ptr, ticket_ptr, stride_xt, stride_xh, stride_act, stride_ws_s, stride_ws_p,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, K_TILE: tl.constexpr, N_KT: tl.constexpr,
    SPLIT_K: tl.constexpr, HAS_LIMIT: tl.constexpr, DOT_PRECISION: tl.constexpr, DOT_UPCAST: tl.constexpr,
):
    """The same product over the chunk [k0, k0 + N_KT * K_TILE) as a loop of K_TILE-wide tiles
    (weight rows at ``w_rows``, masked by ``w_ok``): a constexpr trip count, so the launch's
    num_stages pipelines it. Tiles are summed in order, whatever T is."""
    acc = tl.zeros((BLOCK_M, 2 * BLOCK_N), dtype=tl.float32)
    for kt in range(N_KT):
        offs_k = k0 + kt * K_TILE + tl.arange(0, K_TILE)
        mask_k = offs_k < H
        w = tl.load(w_rows[:, None] + offs_k[None, :], mask=w_ok[:, None] & mask_k[None, :], other=0.0)
        x = tl.load(x_ptr + tok[:, None] * stride_xt + offs_k[None, :] * stride_xh,
                    mask=valid[:, None] & mask_k[None, :], other=0.0)
        acc = _dot_acc(x, w, acc, DOT_PRECISION, DOT_UPCAST)
    _up_epilogue(acc, valid, pair, n_e, lim, rows_w, tile, pid_k, pid_n, act_ptr, ws_ptr, ticket_ptr,
                 stride_act, stride_ws_s, stride_ws_p, BLOCK_M, BLOCK_N, SPLIT_K, HAS_LIMIT)


@triton.jit
def _up_epilogue(
    acc, valid, pair, n_e, lim, rows_w, tile, pid_k, pid_n, act_ptr, ws_ptr, ticket_ptr,
    stride_act, stride_ws_s, stride_ws_p,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, SPLIT_K: tl.constexpr, HAS_LIMIT: tl.constexpr,
):
    """SwiGLU of the interleaved (g, u) accumulator into act[pair]: directly, or through the
    split-K partials and the last-ticket reduction of output tile ``tile``."""
    mask_w = rows_w // 2 < n_e
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    act_ptrs = act_ptr + pair[:, None] * stride_act + offs_n[None, :]
    act_mask = valid[:, None] & (offs_n < n_e)[None, :]
    if SPLIT_K == 1:
        g, u = tl.split(tl.reshape(acc, (BLOCK_M, BLOCK_N, 2)))
        tl.store(act_ptrs, _swiglu(g, u, lim, HAS_LIMIT).to(act_ptr.dtype.element_ty), mask=act_mask)
    else:
        ws_ptrs = ws_ptr + pair[:, None] * stride_ws_p + rows_w[None, :]
        ws_mask = valid[:, None] & mask_w[None, :]
        tl.store(ws_ptrs + pid_k * stride_ws_s, acc, mask=ws_mask)
        # Every thread's partial is stored before the ticket (barrier; acq_rel at GPU scope): the
        # chunk that draws the last ticket of this output tile sees every partial.
        tl.debug_barrier()
        ticket = tl.atomic_add(ticket_ptr + tile, 1, sem="acq_rel", scope="gpu")
        if ticket == SPLIT_K - 1:
            sums = tl.load(ws_ptrs, mask=ws_mask, other=0.0, cache_modifier=".cg")
            for s in tl.static_range(1, SPLIT_K):
                sums += tl.load(ws_ptrs + s * stride_ws_s, mask=ws_mask, other=0.0, cache_modifier=".cg")
            g, u = tl.split(tl.reshape(sums, (BLOCK_M, BLOCK_N, 2)))
            tl.store(act_ptrs, _swiglu(g, u, lim, HAS_LIMIT).to(act_ptr.dtype.element_ty), mask=act_mask)
            tl.atomic_xchg(ticket_ptr + tile, 0, sem="relaxed", scope="gpu")  # ready for the next call


@triton.jit(do_not_specialize=["T", "P", "NB", "NSB"])
def _moe_up_kernel(
    x_ptr, sorted_ptr, block_expert_ptr, ids_ptr,
    wg_ptr, wu_ptr, sg_ptr, su_ptr,
    act_ptr, ws_ptr, ticket_ptr,
    T, P, NB, NSB, H, I, IS,
    stride_xt, stride_xh, stride_ik,
    stride_ge, stride_gn, stride_ue, stride_un, stride_sgn, stride_sun,
    stride_act, stride_ws_s, stride_ws_p,
    limit, shared_limit,
    NUM_EXPERTS: tl.constexpr, TOP_K: tl.constexpr, PAIRS_PER_TOKEN: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CHUNK_K: tl.constexpr, SPLIT_K: tl.constexpr,
    N_TILES: tl.constexpr, HAS_LIMIT: tl.constexpr, SLOT_BLOCKS: tl.constexpr, K_TILE: tl.constexpr,
    DOT_PRECISION: tl.constexpr, DOT_UPCAST: tl.constexpr, USE_GDC: tl.constexpr,
):
    # K_TILE == 0: one load per chunk (a power of two); else a loop over the chunk's
    # CHUNK_K // K_TILE tiles (_up_tile_loop; CHUNK_K a multiple of K_TILE).
    N_KT: tl.constexpr = CHUNK_K // K_TILE if K_TILE > 0 else 1
    pid_k = tl.program_id(0)
    pid_n = tl.program_id(1)
    pid_b = tl.program_id(2)
    # Weight tile: row r is gate row j (r even) or up row j (r odd), j = first + r // 2, so the
    # accumulator's columns come out interleaved g, u (swiglu_gemm's layout). Unit stride along H.
    rows_w = pid_n * 2 * BLOCK_N + tl.arange(0, 2 * BLOCK_N)
    j = rows_w // 2
    even = rows_w % 2 == 0
    if K_TILE == 0:     # the chunk in one load (the loop design makes its tiles' offsets)
        offs_k = pid_k * CHUNK_K + tl.arange(0, CHUNK_K)
        mask_k = offs_k < H

    if pid_b < NSB:
        # The first NSB blocks of the grid: the shared expert, 16 tokens per CTA. They come first
        # so they are scheduled first, while the router and moe_align run. Its weights are
        # producer-independent, so the tile is requested before the wait.
        s_rows = tl.where(even, sg_ptr + j * stride_sgn, su_ptr + j * stride_sun)
        if K_TILE == 0:
            w = tl.load(s_rows[:, None] + offs_k[None, :], mask=(j < IS)[:, None] & mask_k[None, :], other=0.0)
        # Released only after the wait, in either trigger placement: the down-GEMM reads
        # moe_align's output before its own wait (runtime/pdl.py, rule 3).
        pdl_wait_then_release(USE_GDC)
        if pid_n * BLOCK_N < IS:       # else a column tile past Is (Is < I)
            tok = pid_b * BLOCK_M + tl.arange(0, BLOCK_M)
            pair = tok * PAIRS_PER_TOKEN + TOP_K   # the shared expert is every token's last pair
            tile = (NB + pid_b) * N_TILES + pid_n     # shared tiles after the routed ones
            if K_TILE == 0:
                _up_tile(w, tok, tok < T, pair, IS, shared_limit, rows_w, offs_k, mask_k, tile, pid_k, pid_n,
                         x_ptr, act_ptr, ws_ptr, ticket_ptr, stride_xt, stride_xh, stride_act, stride_ws_s,
                         stride_ws_p, BLOCK_M, BLOCK_N, SPLIT_K, HAS_LIMIT, DOT_PRECISION, DOT_UPCAST)
            else:
                _up_tile_loop(s_rows, j < IS, tok, tok < T, pair, IS, shared_limit, rows_w, pid_k * CHUNK_K, H,
                              tile, pid_k, pid_n, x_ptr, act_ptr, ws_ptr, ticket_ptr, stride_xt, stride_xh,
                              stride_act, stride_ws_s, stride_ws_p, BLOCK_M, BLOCK_N, K_TILE, N_KT, SPLIT_K,
                              HAS_LIMIT, DOT_PRECISION, DOT_UPCAST)
    else:
        # A routed block: its expert id is the producer's output (moe_align's; with SLOT_BLOCKS,
        # the router's: block b is the one token's slot b), so everything waits. Blocks past the
        # published ones (moe_align marks them E + 1: no total_padded read on this path), the
        # shared expert's bucket (E, done above) and column tiles past I (I < Is) have nothing
        # to do.
        b = pid_b - NSB
        pdl_wait_then_release(USE_GDC)
        if SLOT_BLOCKS:
            e = tl.load(ids_ptr + b * stride_ik)
        else:
            e = tl.load(block_expert_ptr + b)
        if (e < NUM_EXPERTS) & (pid_n * BLOCK_N < I):
            # The pairs after the id, not with it: requested by every block (the ones past the
            # published, which exit here, too) they cost verify's up-GEMM 22.5 us a step (session
            # 30, benchmarks/results/README.md).
            slots = b * BLOCK_M + tl.arange(0, BLOCK_M)
            if SLOT_BLOCKS:
                pair = tl.where(slots == b * BLOCK_M, b, P)   # the block's one pair, then padding
            else:
                pair = tl.load(sorted_ptr + slots)   # a published block (e < E), so inside the range
            e64 = e.to(tl.int64)
            g_rows = tl.where(even, wg_ptr + e64 * stride_ge + j * stride_gn,
                              wu_ptr + e64 * stride_ue + j * stride_un)
            # The sentinel P marks padding.
            if K_TILE == 0:
                w = tl.load(g_rows[:, None] + offs_k[None, :], mask=(j < I)[:, None] & mask_k[None, :], other=0.0)
                _up_tile(w, pair // PAIRS_PER_TOKEN, pair < P, pair, I, limit, rows_w, offs_k, mask_k,
                         b * N_TILES + pid_n, pid_k, pid_n, x_ptr, act_ptr, ws_ptr, ticket_ptr, stride_xt, stride_xh,
                         stride_act, stride_ws_s, stride_ws_p, BLOCK_M, BLOCK_N, SPLIT_K, HAS_LIMIT, DOT_PRECISION,
                         DOT_UPCAST)
            else:
                _up_tile_loop(g_rows, j < I, pair // PAIRS_PER_TOKEN, pair < P, pair, I, limit, rows_w,
                              pid_k * CHUNK_K, H, b * N_TILES + pid_n, pid_k, pid_n, x_ptr, act_ptr, ws_ptr,
                              ticket_ptr, stride_xt, stride_xh, stride_act, stride_ws_s, stride_ws_p, BLOCK_M,
                              BLOCK_N, K_TILE, N_KT, SPLIT_K, HAS_LIMIT, DOT_PRECISION, DOT_UPCAST)


@triton.jit(do_not_specialize=["T", "P"])
def _moe_down_kernel(
    act_ptr, sorted_ptr, block_expert_ptr, total_ptr, ids_ptr,
    wd_ptr, sd_ptr, y_ptr, topk_w_ptr, out_ptr, ticket_ptr, x_ptr, ssig_ptr,
    T, P, H, I, IS,
    stride_act, stride_de, stride_dh, stride_sdh, stride_y, stride_wt, stride_wk, stride_ot, stride_oh, stride_ik,
    stride_xt, stride_xh,
    NUM_EXPERTS: tl.constexpr, TOP_K: tl.constexpr, PAIRS_PER_TOKEN: tl.constexpr, HAS_SHARED: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_H: tl.constexpr, KPAD: tl.constexpr, COMBINE_T: tl.constexpr,
    SLOT_BLOCKS: tl.constexpr, SHARED_SIGMOID: tl.constexpr, SIG_CHUNK: tl.constexpr,
    DOT_PRECISION: tl.constexpr, DOT_UPCAST: tl.constexpr, USE_GDC: tl.constexpr,
):
    pid_h = tl.program_id(0)
    pid_b = tl.program_id(1)
    # Before the wait: moe_align (with SLOT_BLOCKS, the router) ran two launches back and the
    # up-GEMM waited for it before triggering this launch, so its outputs are complete
    # (README.md); read them from L2 (.cg). The weights are producer-independent: the whole
    # [BLOCK_H, I] tile is requested now.
    if SLOT_BLOCKS:
        # One token, block b = its slot b (the shared expert's is slot TOP_K): no align layout.
        total = PAIRS_PER_TOKEN * BLOCK_M
        active = pid_b < PAIRS_PER_TOKEN
        e = tl.load(ids_ptr + tl.minimum(pid_b, TOP_K - 1) * stride_ik, cache_modifier=".cg")
        e = tl.where(pid_b < TOP_K, e, NUM_EXPERTS)
    else:
        total = tl.load(total_ptr, cache_modifier=".cg")
        active = pid_b * BLOCK_M < total
        e = tl.load(block_expert_ptr + pid_b, mask=active, other=0, cache_modifier=".cg")
        # The block's pairs too (moe_align's, complete for the same reason): after the wait only
        # the activation rows are left to gather.
        pair = tl.load(sorted_ptr + pid_b * BLOCK_M + tl.arange(0, BLOCK_M), mask=active, other=P,
                       cache_modifier=".cg")
    er = tl.minimum(e, NUM_EXPERTS - 1)
    base = wd_ptr + er.to(tl.int64) * stride_de
    stride_w = stride_dh
    k_e = I
    if HAS_SHARED:
        shared = e == NUM_EXPERTS
        base = tl.where(shared, sd_ptr, base)
        stride_w = tl.where(shared, stride_sdh, stride_dh)
        k_e = tl.where(shared, IS, I)
    offs_h = pid_h * BLOCK_H + tl.arange(0, BLOCK_H)
    mask_h = offs_h < H
    offs_k = tl.arange(0, KPAD)
    mask_k = offs_k < k_e
    w = tl.load(base + offs_h[:, None] * stride_w + offs_k[None, :],
                mask=active & mask_h[:, None] & mask_k[None, :], other=0.0)

    pdl_wait(USE_GDC)
    pdl_launch_dependents(USE_GDC)
    if pid_b * BLOCK_M >= total:
        return

    if SLOT_BLOCKS:
        slots = pid_b * BLOCK_M + tl.arange(0, BLOCK_M)
        pair = tl.where(slots == pid_b * BLOCK_M, pid_b, P)
    valid = pair < P
    a = tl.load(act_ptr + pair[:, None] * stride_act + offs_k[None, :], mask=valid[:, None] & mask_k[None, :],
                other=0.0)
    acc = _dot_acc(a, w, tl.zeros((BLOCK_M, BLOCK_H), dtype=tl.float32), DOT_PRECISION, DOT_UPCAST)
    tl.store(y_ptr + pair[:, None] * stride_y + offs_h[None, :], acc, mask=valid[:, None] & mask_h[None, :])

    # The last active block of this column tile combines it for every token (ticket as above).
    tl.debug_barrier()
    ticket = tl.atomic_add(ticket_ptr + pid_h, 1, sem="acq_rel", scope="gpu")
    if ticket == total // BLOCK_M - 1:
        toks = tl.arange(0, COMBINE_T)
        t0 = 0
        # A while loop: the triton 3.6 interpreter cannot iterate range() over a runtime scalar.
        while t0 < T:
            t = t0 + toks
            mask_t = t < T
            mask_y = mask_t[:, None] & mask_h[None, :]
            y_rows = y_ptr + (t * PAIRS_PER_TOKEN)[:, None] * stride_y + offs_h[None, :]
            comb = tl.zeros((COMBINE_T, BLOCK_H), dtype=tl.float32)
            for j in tl.static_range(TOP_K):
                wj = tl.load(topk_w_ptr + t * stride_wt + j * stride_wk, mask=mask_t, other=0.0)
                yj = tl.load(y_rows + j * stride_y, mask=mask_y, other=0.0, cache_modifier=".cg")
                comb += wj[:, None] * yj
            if HAS_SHARED:  # the shared expert is slot TOP_K, added last
                ys = tl.load(y_rows + TOP_K * stride_y, mask=mask_y, other=0.0, cache_modifier=".cg")
                if SHARED_SIGMOID:
                    ys = ys * _shared_scale(x_ptr, ssig_ptr, t, mask_t, H, stride_xt, stride_xh, COMBINE_T,
                                            SIG_CHUNK)[:, None]
                comb += ys
            tl.store(out_ptr + t[:, None] * stride_ot + offs_h[None, :] * stride_oh,
                     comb.to(out_ptr.dtype.element_ty), mask=mask_y)
            t0 += COMBINE_T
        tl.atomic_xchg(ticket_ptr + pid_h, 0, sem="relaxed", scope="gpu")  # ready for the next call


@triton.jit
def _shared_scale(x_ptr, ssig_ptr, t, mask_t, H, stride_xt, stride_xh, COMBINE_T: tl.constexpr,
                  SIG_CHUNK: tl.constexpr):
    """sigmoid(x[t] . shared_sigmoid) in fp32 for the combine's COMBINE_T token rows: H in
    SIG_CHUNK-wide chunks in order, each row reduced on its own (a token's bits do not depend on
    the other rows, so not on T). Only the combining CTAs compute it, after every expert: x and
    the [1, H] weight come from L2."""
    z = tl.zeros((COMBINE_T,), dtype=tl.float32)
    h0 = 0
    while h0 < H:       # a while loop: the interpreter cannot iterate range() over a runtime H
        offs = h0 + tl.arange(0, SIG_CHUNK)
        mask_c = offs < H
        xv = tl.load(x_ptr + t[:, None] * stride_xt + offs[None, :] * stride_xh,
                     mask=mask_t[:, None] & mask_c[None, :], other=0.0)
        gv = tl.load(ssig_ptr + offs, mask=mask_c, other=0.0)
        z += tl.sum(xv.to(tl.float32) * gv.to(tl.float32)[None, :], axis=1)
        h0 += SIG_CHUNK
    return tl.sigmoid(z)


@dataclass
class MoeExpertsBuffers:
    """The per-call workspaces: ``act`` [P, n_max] x.dtype (SwiGLU activations by pair),
    ``partials`` fp32 [split_k, P, 2 * n_max] (up-GEMM split-K; None when split_k == 1) and ``y``
    fp32 [P, H] (down projections by pair)."""

    act: torch.Tensor
    partials: torch.Tensor | None
    y: torch.Tensor


def alloc_buffers(p: int, n_max: int, h: int, split_k: int, dtype: torch.dtype, device,
                  fill: float | None = None) -> MoeExpertsBuffers:
    """Workspaces for P pairs; ``fill`` (tests: NaN) poisons them so that a row the kernels should
    have written but did not shows up in the output."""
    make = torch.empty if fill is None else (lambda *s, **kw: torch.full(s, fill, **kw))
    act = make(p, n_max, dtype=dtype, device=device)
    partials = make(split_k, p, 2 * n_max, dtype=torch.float32, device=device) if split_k > 1 else None
    return MoeExpertsBuffers(act, partials, make(p, h, dtype=torch.float32, device=device))


def moe_experts_triton(
    x: torch.Tensor,
    topk_ids: torch.Tensor,
    topk_weights: torch.Tensor,
    w_gate: torch.Tensor,
    w_up: torch.Tensor,
    w_down: torch.Tensor,
    shared_gate: torch.Tensor | None,
    shared_up: torch.Tensor | None,
    shared_down: torch.Tensor | None,
    limit: float,
    shared_limit: float,
    out: torch.Tensor | None = None,
    *,
    config: MoeExpertsConfig | None = None,
    use_pdl: bool | None = None,
    buffers: MoeExpertsBuffers | None = None,
    align_out: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
    max_single_launch: int = SINGLE_LAUNCH_MAX_PAIRS,
    align_one_token: bool = False,
    shared_sigmoid: torch.Tensor | None = None,
) -> torch.Tensor:
    """out [T, H] (naive.moe_experts_reference) in three launches: moe_align, up-GEMM, down-GEMM;
    for one token in two (the slot layout: block j holds the token's slot j, read straight from
    ``topk_ids``, unless ``align_one_token``).

    ``out`` may be any strided [T, H] tensor of x.dtype; ``config`` overrides the table;
    ``buffers`` (``alloc_buffers``) and ``align_out`` (moe_align's three outputs) let tests pass
    poisoned workspaces; ``max_single_launch`` is moe_align's; ``shared_sigmoid`` [1, H] gates the
    shared expert (the op's). Arguments are assumed validated by the op (weights with unit stride
    along H for gate/up and along I for down).
    """
    t, h = x.shape
    k = topk_ids.shape[1]
    num_experts, inter, _ = w_gate.shape
    has_shared = shared_gate is not None
    inter_s = shared_gate.shape[0] if has_shared else 0
    n_max = max(inter, inter_s)
    kp = k + int(has_shared)
    p = t * kp
    dev = x.device
    if out is None:
        out = torch.empty((t, h), device=dev, dtype=x.dtype)
    assert out.shape == (t, h) and out.dtype == x.dtype, (out.shape, out.dtype)
    if t == 0:
        return out
    cfg = config if config is not None else config_for(n_max, h)
    assert cfg.block_h >= 16 and cfg.split_k >= 1, cfg
    if use_pdl is None:
        use_pdl = pdl_supported(dev)
    assert not use_pdl or pdl_supported(dev), "PDL requested on a device without PDL support"
    launch = {"launch_pdl": True} if use_pdl else {}

    chunk, split_k = up_chunks(cfg, h)
    n_tiles = triton.cdiv(n_max, cfg.block_n)
    n_htiles = triton.cdiv(h, cfg.block_h)
    if buffers is None:
        buffers = alloc_buffers(p, n_max, h, split_k, x.dtype, dev)
    assert buffers.act.shape == (p, n_max) and buffers.y.shape == (p, h)
    assert (buffers.partials is None) == (split_k == 1)
    # The ticket buffer first: its one-time allocation launches a fill, which must not sit
    # between the three launches below (the down-GEMM relies on their order, README.md).
    # One token: its k + 1 experts are distinct blocks by construction, so the slot layout needs
    # no align launch (the up-GEMM's routed blocks are its k slots, the down-GEMM's its k + 1).
    # A token's bits do not depend on which block its row sits in (module docstring).
    slot_blocks = t == 1 and not align_one_token
    if slot_blocks:
        n_blocks, up_blocks = kp, k
    else:
        _, n_blocks = align_sizes(p, num_experts, BLOCK_M, has_shared)
        up_blocks = n_blocks
    n_shared_blocks = triton.cdiv(t, BLOCK_M) if has_shared else 0
    tickets = split_k_tickets(dev, max((n_blocks + n_shared_blocks) * n_tiles, n_htiles))
    if slot_blocks:
        sorted_ids = block_experts = total = topk_ids   # unread: the kernels take topk_ids
    else:
        sorted_ids, block_experts, total = moe_align_triton(
            topk_ids, num_experts, BLOCK_M, has_shared, out=align_out, use_pdl=use_pdl,
            max_single_launch=max_single_launch)
        assert block_experts.shape == (n_blocks,)

    sg, su, sd = (shared_gate, shared_up, shared_down) if has_shared else (w_gate, w_up, w_down)
    # A limit of 0 means no clamp; +inf clamps nothing, so one kernel serves a routed expert
    # without a clamp next to a clamped shared expert (or the reverse) with the same bits.
    lim = float(limit) if limit > 0 else float("inf")
    lim_s = float(shared_limit) if has_shared and shared_limit > 0 else float("inf")
    has_limit = limit > 0 or (has_shared and shared_limit > 0)
    dot = dict(**dot_args(x.dtype), USE_GDC=use_pdl)
    act, partials, y = buffers.act, buffers.partials, buffers.y
    if cfg.up_gemv:
        k1, k2 = k_tiles_pow2(h)
        _moe_up_gemv_kernel[(n_tiles, n_shared_blocks + up_blocks)](
            x, sorted_ids, block_experts, topk_ids,
            w_gate, w_up, sg, su, act,
            t, p, up_blocks, n_shared_blocks, h, inter, inter_s,
            x.stride(0), x.stride(1), topk_ids.stride(1),
            w_gate.stride(0), w_gate.stride(1), w_up.stride(0), w_up.stride(1), sg.stride(-2), su.stride(-2),
            act.stride(0), lim, lim_s,
            NUM_EXPERTS=num_experts, TOP_K=k, PAIRS_PER_TOKEN=kp, BLOCK_M=BLOCK_M, COLS=cfg.block_n, K1=k1,
            K2=k2, HAS_LIMIT=has_limit, SLOT_BLOCKS=slot_blocks, USE_GDC=use_pdl,
            num_warps=cfg.up_warps, num_stages=1, **launch, **register_cap(cfg.up_maxnreg),
        )
    else:
        ws = partials if partials is not None else act
        _moe_up_kernel[(split_k, n_tiles, n_shared_blocks + up_blocks)](
            x, sorted_ids, block_experts, topk_ids,
            w_gate, w_up, sg, su,
            act, ws, tickets,
            t, p, up_blocks, n_shared_blocks, h, inter, inter_s,
            x.stride(0), x.stride(1), topk_ids.stride(1),
            w_gate.stride(0), w_gate.stride(1), w_up.stride(0), w_up.stride(1), sg.stride(-2), su.stride(-2),
            act.stride(0), ws.stride(0) if partials is not None else 0, ws.stride(1) if partials is not None else 0,
            lim, lim_s,
            NUM_EXPERTS=num_experts, TOP_K=k, PAIRS_PER_TOKEN=kp,
            BLOCK_M=BLOCK_M, BLOCK_N=cfg.block_n, CHUNK_K=chunk, SPLIT_K=split_k, N_TILES=n_tiles,
            HAS_LIMIT=has_limit, SLOT_BLOCKS=slot_blocks, K_TILE=cfg.block_k, **dot,
            num_warps=cfg.up_warps, num_stages=cfg.up_stages if cfg.block_k else 1, **launch,
            **register_cap(cfg.up_maxnreg),
        )
    gated = has_shared and shared_sigmoid is not None
    _moe_down_kernel[(n_htiles, n_blocks)](
        act, sorted_ids, block_experts, total, topk_ids,
        w_down, sd, y, topk_weights, out, tickets, x, shared_sigmoid if gated else x,
        t, p, h, inter, inter_s,
        act.stride(0), w_down.stride(0), w_down.stride(1), sd.stride(-2), y.stride(0),
        topk_weights.stride(0), topk_weights.stride(1), out.stride(0), out.stride(1), topk_ids.stride(1),
        x.stride(0), x.stride(1),
        NUM_EXPERTS=num_experts, TOP_K=k, PAIRS_PER_TOKEN=kp, HAS_SHARED=has_shared,
        BLOCK_M=BLOCK_M, BLOCK_H=cfg.block_h, KPAD=max(16, triton.next_power_of_2(n_max)), COMBINE_T=COMBINE_T,
        SLOT_BLOCKS=slot_blocks, SHARED_SIGMOID=gated, SIG_CHUNK=min(SIG_CHUNK, triton.next_power_of_2(h)),
        **dot,
        num_warps=(cfg.down_warps_one_token or cfg.down_warps) if slot_blocks else cfg.down_warps,
        num_stages=1, **launch, **register_cap(cfg.down_maxnreg),
    )
    return out
