"""The prompt check both generation drivers (Engine, DecodeRunner) run on a request: token ids
as a 1-d int64 tensor on the model's device, refused with the reason when they are not integers,
not 1-d, empty or outside the vocabulary (an id past it would index past the embedding)."""

from __future__ import annotations

import numbers
from typing import Sequence

import torch


def prompt_ids(prompt: Sequence[int] | torch.Tensor, vocab_size: int | None, device) -> torch.Tensor:
    """The prompt as int64 ids on ``device``, checked (module docstring); ``vocab_size`` None
    checks only that no id is negative."""
    if torch.is_tensor(prompt) and (prompt.is_floating_point() or prompt.is_complex()):
        raise ValueError(f"prompt must hold integer token ids, got a {prompt.dtype} tensor")
    if not torch.is_tensor(prompt) and any(
            not isinstance(t, numbers.Integral) and not (torch.is_tensor(t) and t.dim() == 0) for t in prompt):
        raise ValueError(f"prompt must hold integer token ids, got {list(prompt)[:8]}")
    ids = torch.as_tensor(prompt if torch.is_tensor(prompt) else list(prompt), dtype=torch.int64)
    if ids.dim() != 1 or ids.numel() == 0:
        raise ValueError(f"prompt must be a non-empty 1-d list of token ids, got shape {tuple(ids.shape)}")
    bad = ids[(ids < 0) | (ids >= vocab_size)] if vocab_size else ids[ids < 0]
    if bad.numel():
        raise ValueError(f"prompt ids {bad[:8].tolist()} are outside the vocabulary [0, {vocab_size or 'V'})")
    return ids.to(device)
