"""Pieces shared by lingc's decode GEMM kernels (``swiglu_gemm``, ``gemm``, ``gemm_argmax``).

- ``BLOCK_M``: the M tile, fixed at 16 for every M so that a row's arithmetic never depends on
  how many rows run with it (batch invariance, design.md).
- ``TARGET_SMS``: the SM count launch rules are written for (H200). A constant, not a device
  query: a config, hence the bits, must be a function of the shape only.
- ``dot_acc``: ``acc + x @ w.T`` in fp32, with the interpreter workaround for bf16 operands.
- ``split_k_tickets``: the zeroed int32 counters with which split-K CTAs elect, in the same
  launch, the one that reduces the partials (the last to arrive), instead of float atomics or a
  second kernel.
- ``split_rows``: how the router's logits and ``head_matmul`` split a launch's token rows over
  programs (rows within a program run one after another).
- ``add_pairs``: the combine function of a two-operand ``tl.reduce`` (two sums in one
  shared-memory round trip: the KDA chain's state products, the router's norm and logits).
"""
import torch
import triton
import triton.language as tl

from lingc.runtime.pdl import interpreting

__all__ = ["BLOCK_M", "TARGET_SMS", "TICKET_CAPACITY", "add_pairs", "dot_acc", "dot_args", "persistent_buffer",
           "register_cap", "split_k_tickets", "split_rows"]

BLOCK_M = 16
TARGET_SMS = 132
# Tickets per device. A launch uses one per output tile (split-K GEMM) or per M block
# (gemm_argmax); the largest decode use is a few hundred.
TICKET_CAPACITY = 1 << 16


@triton.jit
def dot_acc(x, w, acc, DOT_PRECISION: tl.constexpr, DOT_UPCAST: tl.constexpr):
    """acc + x @ w.T in fp32. DOT_UPCAST (interpreter only) feeds fp32 copies of bf16 operands:
    the products of bf16 values are exact in fp32, so the sums match the bf16 tensor-core path
    up to summation order. It works around the triton 3.6 interpreter, whose dot multiplies the
    raw uint16 bit patterns of bf16 tensors."""
    if DOT_UPCAST:
        return tl.dot(x.to(tl.float32), tl.trans(w.to(tl.float32)), acc, input_precision="ieee")
    return tl.dot(x, tl.trans(w), acc, out_dtype=tl.float32, input_precision=DOT_PRECISION)


def dot_args(dtype: torch.dtype) -> dict:
    """`dot_acc`'s constexprs for operands of ``dtype``: exact fp32 products for fp32 ("ieee"),
    and under the interpreter the upcast of 16-bit operands."""
    return dict(DOT_PRECISION="ieee" if dtype == torch.float32 else "tf32",
                DOT_UPCAST=interpreting() and dtype != torch.float32)


@triton.jit
def add_pairs(a0, b0, a1, b1):
    """tl.reduce's combine for two operands: (a, b) of the left side plus (a, b) of the right."""
    return a0 + a1, b0 + b1


_PERSISTENT: dict[tuple, torch.Tensor] = {}


def split_rows(t: int, groups: int) -> tuple[int, int]:
    """(programs along the rows, rows per program) for t rows split over at most ``groups``
    programs: ceil(t / programs) rows each, the last group possibly shorter. Kernels that walk
    their rows with the same arithmetic per row (a row's result never depends on its group) may
    pick the grouping per t without breaking batch invariance."""
    if groups < 1:
        raise ValueError(f"row groups must be >= 1, got {groups}")
    rows = triton.cdiv(t, min(groups, max(t, 1)))
    return triton.cdiv(t, rows), rows


def register_cap(maxnreg: int) -> dict:
    """The launch option capping ptxas registers per thread (0 = none). The interpreter has no
    such option."""
    from lingc.runtime.pdl import interpreting
    return {"maxnreg": maxnreg} if maxnreg and not interpreting() else {}


def persistent_buffer(name: str, device: torch.device, capacity: int, dtype: torch.dtype,
                      fill: int) -> torch.Tensor:
    """The device's buffer ``name`` of ``capacity`` entries, filled with ``fill`` at its one
    allocation. Never replaced: a captured CUDA graph bakes in its address, so growing it would
    leave old graphs pointing at freed memory. Every kernel that uses one leaves it at ``fill``
    again, so launches on one stream, and graph replays, can share it; kernels on two streams
    running at the same time must not (a lingc decode step runs on one stream)."""
    key = (name, device.type, device.index)
    t = _PERSISTENT.get(key)
    if t is None:
        t = torch.full((capacity,), fill, dtype=dtype, device=device)
        _PERSISTENT[key] = t
    return t


def split_k_tickets(device: torch.device, n: int) -> torch.Tensor:
    """The device's zeroed int32 ticket buffer (``TICKET_CAPACITY`` entries, a
    ``persistent_buffer``), for a launch that needs ``n`` of them; the last arrival at a ticket
    resets it to zero."""
    if n > TICKET_CAPACITY:
        raise ValueError(f"a launch needs {n} split-K tickets, more than TICKET_CAPACITY={TICKET_CAPACITY}")
    return persistent_buffer("split_k_tickets", device, TICKET_CAPACITY, torch.int32, 0)
