"""Token positions as the MLA kernels read them: an explicit [T] tensor, or a device base n and a
static offset o (row t at n + o + t).

The relay's steps compute their chain positions on the device as ``n + arange(T)`` (metadata
capture), which as ATen ops is two kernels and two full (non-PDL) edges at the head of every
captured step graph. Every position a decode or verify graph needs is consecutive from the
relay's n, so the ops that read positions (``mla_kv_write``, ``mla_decode``, ``gqa_decode``,
``head_cache_write``) also take the base itself with ``pos_offset=o``, and each kernel forms
``n + o + t`` where it loaded ``positions[t]`` (pdl_glue.positions_into_readers rewrites the
graph; nothing is built on the device).

A kernel reads position t as ``load(ptr + t * stride) + add + t * step``: (1, 0, 0) for a [T]
tensor, (0, o, 1) for a base. Runtime integers, so both forms run one compiled kernel.
"""
from __future__ import annotations

import torch

__all__ = ["check_positions", "position_terms", "expand_positions"]


def check_positions(op: str, positions: torch.Tensor, T: int, pos_offset: int | None) -> None:
    """Raise ValueError naming the problem: positions must be a [T] integer tensor, or with
    ``pos_offset`` a [1] base and the offset an int >= 0."""
    shape = tuple(positions.shape)
    if positions.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"{op}: positions must be int32 or int64 (on the device, not a host int), got "
                         f"{positions.dtype}")
    if pos_offset is None:
        if shape != (T,):
            raise ValueError(f"{op}: positions must be a [T] = [{T}] tensor, got shape {shape} (or pass a [1] "
                             f"base with pos_offset)")
        return
    if isinstance(pos_offset, bool) or not isinstance(pos_offset, int) or pos_offset < 0:
        raise ValueError(f"{op}: pos_offset must be an int >= 0 (row t at positions[0] + pos_offset + t), "
                         f"got {pos_offset!r}")
    if shape != (1,):
        raise ValueError(f"{op}: with pos_offset={pos_offset} positions is the base n, a [1] tensor; got "
                         f"shape {shape}")


def position_terms(pos_offset: int | None) -> tuple[int, int, int]:
    """(stride, add, step) with which a kernel reads position t as
    ``load(ptr + t * stride) + add + t * step``."""
    return (1, 0, 0) if pos_offset is None else (0, int(pos_offset), 1)


def expand_positions(positions: torch.Tensor, T: int, pos_offset: int | None) -> torch.Tensor:
    """The [T] int64 positions either form stands for (the references' input)."""
    if pos_offset is None:
        return positions.long()
    return positions.long() + pos_offset + torch.arange(T, device=positions.device, dtype=torch.int64)
