"""Reference of `lingc::concat_cols`: ``torch.cat([a, b], dim=-1)``."""

from __future__ import annotations

import torch


def concat_cols_reference(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.cat([a, b], dim=-1)
