"""Session 70 probe: the split-K decode GEMMs of flash-tp4-rank as one-chunk configs with about
the same CTA count (thinner column blocks instead of K chunks), so no ticket, no partials and no
reduction tail. Imported as a decode_as PRELUDE before anything compiles. NOSPLIT_SET picks the
variant: `a` (default) or `b` (design A everywhere, other tile and stage counts)."""
import os

import lingc.runtime.kernels.gemm.config as C

VARIANTS = {
    "a": {
        (5128, 2560): C._a(32, 1, block_k=256),   # fused KDA: 161 CTAs x 164 KB (was 81 x 2 = 162)
        (2560, 1024): C._b(16, 1),                # KDA o_proj / MLA dense: 160 CTAs x 32 KB (was 40 x 4)
        (2120, 2560): C._a(16, 1, block_k=256),   # fused MLA: 133 CTAs x 80 KB (was 34 x 10 = 340 x 32 KB)
        (2560, 1536): C._a(16, 1, block_k=256),   # dense MLP down: 160 CTAs x 48 KB (was 40 x 6)
    },
    "b": {
        (5128, 2560): C._a(32, 1, block_k=128, num_stages=6),   # 8 KB tiles, 6 in flight
        (2560, 1024): C._a(16, 1, block_k=256),                 # o_proj as a 4-tile loop
        (2120, 2560): C._a(16, 1, block_k=128, num_stages=6),
        (2560, 1536): C._a(16, 1, block_k=256, num_stages=3),
    },
}
SET = os.environ.get("NOSPLIT_SET", "a")
NOSPLIT = VARIANTS[SET]
C.CONFIGS.update(NOSPLIT)
print(f"prelude: no-split GEMM configs ({SET})",
      {k: (v.block_n, v.block_k, v.split_k, v.prefetch, v.num_stages) for k, v in NOSPLIT.items()}, flush=True)
