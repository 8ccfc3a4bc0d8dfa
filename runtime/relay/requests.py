"""What both generation drivers (Engine, DecodeRunner) do with a request on the host: check the
prompt (token ids as a 1-d int64 tensor on the model's device, refused with the reason when they
are not integers, not 1-d, empty or outside the vocabulary: an id past it would index past the
embedding) and the sampling settings, and stop the token stream at a count or a stop id."""

from __future__ import annotations

import math
import numbers
from typing import Iterator, Sequence

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


def check_sampling(temperature: float, top_p: float) -> None:
    """Raise ValueError naming a temperature that is not a finite number >= 0 or a top_p outside (0, 1]."""
    if not (isinstance(temperature, (int, float)) and math.isfinite(temperature) and temperature >= 0):
        raise ValueError(f"temperature={temperature!r}: want a finite number >= 0 (0 = greedy)")
    if not (isinstance(top_p, (int, float)) and 0 < top_p <= 1):
        raise ValueError(f"top_p={top_p!r}: want 0 < top_p <= 1 (1 = the whole distribution)")


def until(tokens: Iterator[int], count: int, stop_ids: set) -> Iterator[int]:
    """tokens, up to ``count`` of them, ending after the first stop id (included)."""
    produced = 0
    for tok in tokens:
        yield tok
        produced += 1
        if produced >= count or tok in stop_ids:
            return
