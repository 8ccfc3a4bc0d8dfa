"""A prompt chunk padded to a fixed size, so that one captured CUDA graph serves every prompt length
up to that size (runtime/relay/prefill_graphs.py).

The real rows come first, at positions 0..length-1, the padding after them at later positions.
What the padding must not touch, and how each layer keeps it so:
- MLA: a real query sees cache rows at or before its position only, and the padding's rows lie
  after every real one (the causal mask already hides them). They are written to the cache at
  their positions; decoding writes those rows again before any query can see them.
- KDA: the recurrence runs in row order, so the padding comes after the real rows; its rows get a
  log decay of 0 and a beta of 0, which leave the state exactly as the last real row left it
  (S * exp(0) = S, beta * (v - S^T k) = 0). The conv windows take the last W - 1 real inputs.
- MoE and MLPs act on each row alone.
- The logits and the draft's hidden state are read at row length - 1, not at the last row.
`length` is a device tensor, so a graph captured once reads it at every replay.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class PromptPadding:
    """Rows >= length of a chunk are padding. length: [1] int64 on the chunk's device; valid:
    [rows] fp32, 1.0 for a real row and 0.0 for padding (multiplies KDA's gate and beta);
    first_pad: a row before which every row is real whatever the length (the graph of a bucket
    serves lengths above the bucket below it), so only rows from it on need masking."""

    length: torch.Tensor
    valid: torch.Tensor
    first_pad: int = 0

    @classmethod
    def of(cls, length: torch.Tensor, rows: int, first_pad: int = 0) -> "PromptPadding":
        """The padding of a chunk of `rows` rows of which the first `length` ([1] device int64,
        at least first_pad) are real (device ops only: no host read of length)."""
        if length.shape != (1,) or length.dtype != torch.int64:
            raise ValueError(f"PromptPadding length must be a [1] int64 tensor, got {tuple(length.shape)} "
                             f"{length.dtype}")
        if not 0 <= first_pad < rows:
            raise ValueError(f"PromptPadding first_pad={first_pad} must be in 0..{rows - 1} (the chunk's rows)")
        valid = (torch.arange(rows, device=length.device) < length).float()
        return cls(length, valid, first_pad)

    def mask_rows_(self, x: torch.Tensor) -> torch.Tensor:
        """x [rows, ...] with its padding rows zeroed, in place from first_pad on."""
        tail = x[self.first_pad:]
        tail.mul_(self.valid[self.first_pad:].view(-1, *([1] * (x.dim() - 1))))
        return x

    def last_row(self, x: torch.Tensor) -> torch.Tensor:
        """x[length - 1] as a [1, ...] tensor (the last real row)."""
        return x.index_select(0, self.length - 1)

    def window_rows(self, width: int) -> torch.Tensor:
        """Indices length .. length + width - 1: in [window (width rows) ; chunk], the last `width`
        rows that end at the last real row (a short prompt keeps some of the old window)."""
        return self.length + torch.arange(width, device=self.length.device)
