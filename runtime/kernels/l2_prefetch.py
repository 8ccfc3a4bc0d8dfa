"""L2 prefetch, for the time a PDL kernel spends before its ``gdc_wait``.

A kernel may know which bytes it will read long before it may read them. MLA's split kernel
reads cache rows that earlier steps wrote; a design-A GEMM loads only its first weight tile
before the wait and streams the rest after it. ``prefetch.global.L2`` asks the memory system to
bring a line into L2 and returns at once, so the bytes arrive while the kernels before this one
still run, and the loads after the wait hit L2 instead of HBM.

Why this is safe whatever the addresses: a prefetch is a hint that changes no value. L2 is the
GPU's point of coherence, so a line prefetched before a producer writes it is updated by that
write, and L1 is never filled (no stale L1 line can be read later). A range computed from a
stale input only wastes bandwidth. Masked-off lanes prefetch a fallback address the caller
knows is valid, and ranges are clamped to the buffer's last byte, so no address leaves the
tensor.

``LINGC_L2_PREFETCH=0`` (read once, at import) switches every lingc prefetch off, for A/B
benchmarks; it changes no result. Only on the GPU: the Triton interpreter has no inline PTX, so
callers guard the call with a constexpr that is False there (``USE_GDC`` is).
"""
import os

import triton
import triton.language as tl

__all__ = ["LINE_BYTES", "L2_PREFETCH_ENABLED", "l2_prefetch", "l2_prefetch_range"]

LINE_BYTES: tl.constexpr = tl.constexpr(128)

_setting = os.environ.get("LINGC_L2_PREFETCH", "1")
if _setting not in ("0", "1"):
    raise ValueError(f"LINGC_L2_PREFETCH={_setting!r}: expected '1' (prefetch, the default) or '0' (off)")
L2_PREFETCH_ENABLED = _setting == "1"


@triton.jit
def l2_prefetch(ptrs, mask, fallback):
    """Prefetch into L2 the line of each pointer of ``ptrs`` where ``mask`` holds, else the line
    of ``fallback`` (a valid address: the inline PTX cannot be predicated per lane)."""
    p = tl.where(mask, ptrs, fallback)
    tl.inline_asm_elementwise("prefetch.global.L2 [$1]; mov.u32 $0, 0;", "=r,l", [p],
                              dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def l2_prefetch_range(ptr, first_byte, end_byte, last_byte, LINES: tl.constexpr):
    """Prefetch into L2 the 128-byte lines of bytes [first_byte, end_byte) of ptr's buffer,
    LINES lines per round over the CTA's threads; addresses past ``last_byte`` (the buffer's
    last valid byte, inclusive) are clamped to it. Offsets are int64 byte offsets from ptr."""
    base = ptr.to(tl.pointer_type(tl.int8))
    offs = tl.arange(0, LINES).to(tl.int64) * LINE_BYTES
    stop = tl.minimum(end_byte, last_byte + 1)
    b = first_byte
    while b < stop:
        addr = tl.minimum(b + offs, stop - 1)
        tl.inline_asm_elementwise("prefetch.global.L2 [$1]; mov.u32 $0, 0;", "=r,l", [base + addr],
                                  dtype=tl.int32, is_pure=False, pack=1)
        b += LINES * LINE_BYTES
