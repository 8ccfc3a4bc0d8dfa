"""Session 67's A/B prelude: the MLA and GQA split kernels with their queries' cos / sin computed
as before session 67 (plain tl.cos / tl.sin, which Triton's layout pass recomputes per query row in
the MMA operand's layout: 16 angles a thread), instead of rope.cos_sin_spread. Import it as a
module before the first compile (Triton reads a jit function's source from its file)."""
import triton
import triton.language as tl

import lingc.runtime.kernels.gqa_decode.kernel as gqa
import lingc.runtime.kernels.mla_decode.kernel as mla


@triton.jit
def cos_sin_plain(ang):
    return tl.cos(ang), tl.sin(ang)


mla.cos_sin_spread = cos_sin_plain
gqa.cos_sin_spread = cos_sin_plain
print("prelude: the split kernels' cos / sin as before session 67 (replicated)", flush=True)
