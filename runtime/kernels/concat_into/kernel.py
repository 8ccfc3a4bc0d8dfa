"""Triton kernel of `lingc::concat_into`. The parts and their offsets are tuple arguments (one
pointer and one start per part, ``NPARTS`` a constexpr), the output flat: program j writes
elements [j * BLOCK, (j + 1) * BLOCK) of ``out``, each from the part whose range holds it (one
masked load per part, unrolled). Every part is produced upstream, so the program waits at entry;
it is a short copy, so it releases its dependents as early as the trigger placement allows
(``pdl_wait_small``). A copy rounds nothing: the bits are torch.cat's.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from lingc.runtime.pdl import launch_kwargs, pdl_launch_dependents, pdl_supported, pdl_wait_small

BLOCK = 1024        # output elements per program


@triton.jit
def _concat_into_kernel(parts, starts, out_ptr, total, NPARTS: tl.constexpr, BLOCK: tl.constexpr,
                        USE_GDC: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)

    pdl_wait_small(USE_GDC)
    pdl_launch_dependents(USE_GDC)

    v = tl.load(parts[0] + offs, mask=offs < starts[1], other=0)
    for i in tl.static_range(1, NPARTS):
        inside = (offs >= starts[i]) & (offs < starts[i + 1])
        v = tl.where(inside, tl.load(parts[i] + (offs - starts[i]), mask=inside, other=0), v)
    tl.store(out_ptr + offs, v, mask=offs < total)


def concat_into_triton(parts: list[torch.Tensor], out: torch.Tensor) -> None:
    """out = cat(parts, 0) for contiguous parts of out's dtype and trailing shape, out contiguous
    (op.check_concat_into_args)."""
    starts = [0]
    for p in parts:
        starts.append(starts[-1] + p.numel())
    assert out.is_contiguous() and starts[-1] == out.numel(), (out.shape, starts)
    if out.numel() == 0:
        return
    _concat_into_kernel[(triton.cdiv(out.numel(), BLOCK),)](
        tuple(parts), tuple(starts), out, out.numel(), NPARTS=len(parts), BLOCK=BLOCK,
        USE_GDC=pdl_supported(out.device), num_warps=4, **launch_kwargs(out.device))
