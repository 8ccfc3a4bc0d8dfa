"""Fixed launch configurations of the decode GEMM, keyed by (N, K) (N = the sum over the
weights of one launch). Nothing here depends on M: a row's bits must not depend on how many rows
run with it, so neither may the tiling.

Two designs, as in the SwiGLU kernel (benchmarks/results/swiglu_sweep_h200.json):

- A (``prefetch=False``): a software-pipelined K loop of ``block_k`` tiles, ``num_stages`` deep;
  the first tile is requested before ``gdc_wait``. Wins once a call streams tens of MB: the
  SwiGLU N=6144 shape (63 MB) ran at 88% of copy bandwidth with 64 weight rows per CTA,
  block_k 128, 4 stages, against 67% for the best B.
- B (``prefetch=True``): each CTA loads its whole weight chunk (``block_n`` rows x K/split_k)
  with one load before ``gdc_wait``, so in a PDL chain the whole weight stream is in flight while
  the previous kernel drains. Wins for short calls (the SwiGLU 2-16 MB shapes), where per-call
  latency, not bandwidth, dominates. Best there: 64 rows x 256 (7.9 MB: 240 CTAs), 64 rows x
  512 with 8 warps (15.7 MB: 240 CTAs), 32 rows x 512 (2 MB).

Design C (``gemv=True``, gemv_kernel.py): ``block_n`` whole weight rows per CTA, all of K loaded
before ``gdc_wait``, the products on CUDA cores, no split-K. A sweep candidate: fastest at M = 1,
1.5-2x slower at M = 6 (session 10), and the table cannot depend on M, so no entry uses it.

Split-K (A or B) writes fp32 partials; the CTA drawing the last ticket of its output tile
adds them in chunk order 0..split_k-1 in the same launch (no float atomics, no second kernel).

How the table below was chosen (by reasoning from that sweep; ``python -m
benchmarks.gemm_sweep`` measures the candidates and this table is to be updated from it):
aim for 130-340 CTAs (1-2.5 per SM on 132 SMs), each B CTA holding 16-64 KB of weight
(32 KB for 64 x 256 at 4 warps, 64 KB for 64 x 512 at 8 warps: the SwiGLU winners), each A CTA
keeping >= 8 K tiles per chunk so the pipeline stays full. B for calls up to ~11 MB, A from
~21 MB on. A list of weights is tiled per weight (a block never straddles two), so a fused
group has sum(ceil(N_i / block_n)) column blocks; the CTA counts below include that.
"""
from dataclasses import dataclass

import triton

from lingc.runtime.kernels.gemm_common import TARGET_SMS

__all__ = ["GemmConfig", "CONFIGS", "ARGMAX_CONFIGS", "config_for", "argmax_config_for"]


@dataclass(frozen=True)
class GemmConfig:
    block_n: int  # weight rows (output columns) per CTA; >= 16 (tl.dot's smallest N), power of 2
    block_k: int  # design A: K tile (power of two >= 16); design B: unused (0)
    split_k: int  # K chunks; > 1: partials reduced in the same launch by the last ticket
    num_warps: int = 4
    num_stages: int = 4  # design A's pipeline depth; B: 1; C: 2 = the next x row loaded ahead
    prefetch: bool = False  # design B
    gemv: bool = False  # design C (gemv_kernel.py): block_n whole rows per CTA, no split, no dot


def _a(block_n, split_k, block_k=128, num_warps=4, num_stages=4):
    return GemmConfig(block_n, block_k, split_k, num_warps, num_stages)


def _b(block_n, split_k, num_warps=4):
    return GemmConfig(block_n, 0, split_k, num_warps, 1, prefetch=True)


def _c(rows, num_warps=4, num_stages=1):
    return GemmConfig(rows, 0, 1, num_warps, num_stages, gemv=True)


# (N, K): config.  MB = bf16 weight bytes; CTAs = column blocks x K chunks.
CONFIGS: dict[tuple[int, int], GemmConfig] = {
    # flash-tp4-rank
    (1024, 2560): _b(64, 10),          # KDA q/k/v/f/g, 5.2 MB: 16 x 10 = 160 CTAs of 32 KB
    (8, 2560): _b(16, 5),              # KDA b / MLA g_proj, 41 KB: latency only, 5 CTAs
    (5128, 2560): _a(64, 2),           # fused KDA, 26 MB: 81 blocks x 2 = 162 CTAs, 10 tiles each
    (2560, 1024): _b(64, 4),           # KDA o_proj / MLA dense, 5.2 MB: 40 x 4 = 160 CTAs of 32 KB
    (1536, 2560): _b(64, 10),          # MLA q_proj, 7.9 MB: the SwiGLU N=768 weight shape, whose
                                       # best was 64 rows x 256: 24 x 10 = 240 CTAs
    (576, 2560): _b(32, 10),           # MLA kv_a, 2.9 MB: 18 x 10 = 180 CTAs of 16 KB
    (2120, 2560): _b(64, 10),          # fused MLA, 10.9 MB: 34 blocks x 10 = 340 CTAs of 32 KB
    (2560, 1536): _b(64, 6),           # dense MLP down, 7.9 MB: 40 x 6 = 240 CTAs of 32 KB
    (2560, 192): _b(16, 1),            # shared expert down, 1 MB: 160 CTAs of 6 KB (latency only)
    (2560, 5120): _a(64, 4),           # NEXTN eh_proj, 26 MB: 40 x 4 = 160 CTAs, 10 tiles each
    (39296, 2560): _a(64, 1),          # lm_head logits, 201 MB: 614 CTAs, 20 tiles each
    # flash (full model)
    (4096, 2560): _a(32, 2),           # KDA q/k/v/f/g, 21 MB: 128 x 2 = 256 CTAs, 10 tiles each
    (32, 2560): _b(16, 5),             # KDA b / MLA g, 164 KB: 2 x 5 = 10 CTAs
    (20512, 2560): _a(64, 1),          # fused KDA, 105 MB: 321 CTAs, 20 tiles each
    (2560, 4096): _a(64, 4),           # o_proj / MLA dense, 21 MB: 40 x 4 = 160 CTAs, 8 tiles each
    (6144, 2560): _a(64, 2),           # MLA q_proj, 31 MB: 96 x 2 = 192 CTAs, 10 tiles each
    (6752, 2560): _a(64, 2),           # fused MLA, 35 MB: 106 x 2 = 212 CTAs
    (2560, 6144): _a(64, 4),           # MLP down, 31 MB: 40 x 4 = 160 CTAs, 12 tiles each
    (2560, 768): _b(32, 3),            # shared expert down, 3.9 MB: 80 x 3 = 240 CTAs of 16 KB
    (157184, 2560): _a(64, 1),         # lm_head logits, 805 MB: 2456 CTAs
}

# gemm_argmax has no split-K (each CTA reduces its own logits block); for the lm_head shapes it
# uses the gemm's own config, so its logits are bit for bit those of gemm(x, [w]).
ARGMAX_CONFIGS: dict[tuple[int, int], GemmConfig] = {
    (39296, 2560): CONFIGS[(39296, 2560)],
    (157184, 2560): CONFIGS[(157184, 2560)],
}


def config_for(n: int, k: int) -> GemmConfig:
    """The launch config for (N, K): the table entry, else a rule of (N, K) only.

    The rule: design B while the weight is small (<= 12 MB in bf16), with 64-row blocks (32 for
    N < 1024), chunks of at most 512 (register budget) and the K split that brings the grid
    near 2 CTAs per SM; design A above, split while the grid is under one CTA per SM and each
    chunk keeps >= 8 tiles of 128.
    """
    if (n, k) in CONFIGS:
        return CONFIGS[(n, k)]
    if n * k * 2 <= 12 * 1024**2:
        block_n = 64 if n >= 1024 else (32 if n >= 32 else 16)
        blocks = triton.cdiv(n, block_n)
        split_k = 1
        while triton.cdiv(k, split_k) > 512 or (
            blocks * split_k * 2 <= 2 * TARGET_SMS and triton.cdiv(k, 2 * split_k) >= 128
        ):
            split_k *= 2
        return _b(block_n, split_k)
    blocks = triton.cdiv(n, 64)
    k_tiles = triton.cdiv(k, 128)
    split_k = 1
    while blocks * split_k < TARGET_SMS and k_tiles >= 16 * split_k:
        split_k *= 2
    return _a(64, split_k)


def argmax_config_for(n: int, k: int) -> GemmConfig:
    """gemm_argmax's config for (N, K): its table entry, else design A (a K loop: there is no
    split to bound a design-B chunk) with the gemm rule's block_n."""
    if (n, k) in ARGMAX_CONFIGS:
        return ARGMAX_CONFIGS[(n, k)]
    return _a(config_for(n, k).block_n, 1)
