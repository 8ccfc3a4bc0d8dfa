"""Programmatic Dependent Launch (PDL) helpers shared by every lingc Triton kernel.

What PDL buys: a kernel launched with ``launch_pdl=True`` may start while the kernel before it
on the stream is still finishing. Its CTAs can issue loads that do not depend on the previous
kernel (weights) and then block in ``gdc_wait()`` until the previous kernel has completed and its
writes are visible. Inside a CUDA graph the launch attribute becomes a programmatic edge, so the
per-kernel boundary of a decode step shrinks (notes: compile-backends-notes.md, section 3).

The rule every lingc kernel follows (the kernel takes ``USE_GDC: tl.constexpr``):

1. Loads of producer-independent data (weights, constants) may be issued before the wait;
   that is where the gain comes from.
2. ``pdl_wait(USE_GDC)`` comes before the first read of anything a previous kernel may have
   written (activations, caches, state, workspaces) AND before the first write to global memory:
   the previous kernel may still be reading the buffer this kernel is about to overwrite.
3. ``pdl_launch_dependents(USE_GDC)`` comes right after the wait. It only lets the next
   kernel's CTAs be scheduled early (once every CTA of this grid has called it, so they never
   take a slot this grid still needs); the next kernel's own wait still blocks until this kernel
   has fully completed, so the placement affects speed, never results.

   ``LINGC_PDL_TRIGGER`` (read once, at import) can move the trigger ahead of the wait, after
   the weight prefetch: then kernel i + 2 may be scheduled, and stream its weights, while kernel
   i still runs (its own wait is on i + 1, which cannot finish before i). ``late``: every
   kernel triggers after its wait. ``small`` (the default): the short latency-bound kernels that
   call ``pdl_wait_small`` (RMSNorm, the gated head norm, and MLA's glue: the cache write,
   the split combine, the per-head absorptions) trigger before it, so the
   projection after one streams its weights during the kernel before it; on flash-tp4-rank
   this took a decode step from 1.98 to 1.88 ms (H200, benchmarks/results/README.md, session
   8). ``early``: every kernel does; measured, it only moved time around (the MoE and the KDA
   chain lost what the GEMMs gained). No deadlock: a
   kernel is launched only once every CTA of its predecessor is resident, so a waiting CTA
   never holds a slot that an earlier kernel needs. What an early trigger takes away: with the
   late one, kernel i + 1 starts only after kernel i - 1 has completed, so it may read i - 1's
   outputs before its own wait. A kernel whose successor relies on that (the MoE up-GEMM: the
   down-GEMM reads moe_align's block table before its wait) calls ``pdl_wait_then_release``,
   which keeps the late placement in every mode. The KDA chain reads its recurrent state and
   conv windows before its wait when pdl_swap marks them ``state_ready`` (inputs of the graph
   that nothing in it writes before the chain): their last writer then lies behind the
   projection GEMM that feeds the chain, which triggers after its wait in the late and small
   placements; unmarked, or under ``early``, the chain reads them after its wait
   (kda/kernel.py).

Host side: launch with ``**launch_kwargs(device)`` and pass ``USE_GDC=pdl_supported(device)``.
The two must agree: a kernel launched with ``launch_pdl=True`` but without the wait would race
with its producer.

Why the constexpr guard: the Triton interpreter (``TRITON_INTERPRET=1``, our CPU test mode)
raises on the gdc intrinsics, so ``USE_GDC`` must be False there and the branch is compiled out.
The interpreter silently ignores ``launch_pdl``, but lingc never passes it there either, so the
launch code reads the same on every target.
"""
import functools
import os

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

__all__ = ["interpreting", "pdl_supported", "launch_kwargs", "pdl_wait", "pdl_wait_small",
           "pdl_launch_dependents", "pdl_wait_then_release", "EARLY_TRIGGER", "EARLY_TRIGGER_SMALL"]

_TRIGGERS = ("late", "small", "early")
_trigger = os.environ.get("LINGC_PDL_TRIGGER", "small")
if _trigger not in _TRIGGERS:
    raise ValueError(f"LINGC_PDL_TRIGGER={_trigger!r}: expected one of {_TRIGGERS}")
# Global constexprs: Triton folds them into every kernel's cache key, so the placements never
# share a compiled binary.
EARLY_TRIGGER = tl.constexpr(_trigger == "early")
EARLY_TRIGGER_SMALL = tl.constexpr(_trigger in ("small", "early"))


def interpreting() -> bool:
    """True when Triton kernels run in the CPU interpreter (``TRITON_INTERPRET=1``)."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


@functools.lru_cache(maxsize=None)
def _capability_major(index: int) -> int:
    return torch.cuda.get_device_capability(index)[0]


def pdl_supported(device) -> bool:
    """Whether kernels on ``device`` should be launched with PDL.

    Needs a CUDA device of compute capability >= 9 (Hopper), no interpreter, and the kill switch
    ``LINGC_DISABLE_PDL=1`` unset. The environment is read on every call so a test or a
    benchmark can switch PDL off around a capture.
    """
    if interpreting() or os.environ.get("LINGC_DISABLE_PDL", "0") == "1":
        return False
    device = torch.device(device)
    if device.type != "cuda":
        return False
    if device.index is None:
        if not torch.cuda.is_available():
            return False
        return _capability_major(torch.cuda.current_device()) >= 9
    # A tensor's device: CUDA is there (no is_available() on every launch of an eager prefill).
    return _capability_major(device.index) >= 9


def launch_kwargs(device) -> dict:
    """Extra launch kwargs for a Triton kernel on ``device``: ``{"launch_pdl": True}`` or ``{}``."""
    return {"launch_pdl": True} if pdl_supported(device) else {}


@triton.jit
def pdl_wait(USE_GDC: tl.constexpr):
    """Block until the previous kernel on the stream has completed (no-op when USE_GDC is False)."""
    if USE_GDC:
        if EARLY_TRIGGER:
            gdc_launch_dependents()
        gdc_wait()


@triton.jit
def pdl_wait_small(USE_GDC: tl.constexpr):
    """``pdl_wait`` for a short latency-bound kernel: releases the dependents before waiting
    under LINGC_PDL_TRIGGER=small or early. Its ``pdl_launch_dependents`` after the wait is then
    a second trigger of the same CTA, which has no effect."""
    if USE_GDC:
        if EARLY_TRIGGER_SMALL:
            gdc_launch_dependents()
        gdc_wait()


@triton.jit
def pdl_launch_dependents(USE_GDC: tl.constexpr):
    """Allow the next PDL kernel to be scheduled (no-op when USE_GDC is False, or when
    ``EARLY_TRIGGER`` already did it in ``pdl_wait``)."""
    if USE_GDC:
        if not EARLY_TRIGGER:
            gdc_launch_dependents()


@triton.jit
def pdl_wait_then_release(USE_GDC: tl.constexpr):
    """``pdl_wait`` then ``pdl_launch_dependents`` in that order whatever LINGC_PDL_TRIGGER says:
    for a kernel whose successor reads, before its own wait, what this kernel's predecessor
    wrote (rule 3 above)."""
    if USE_GDC:
        gdc_wait()
        gdc_launch_dependents()
