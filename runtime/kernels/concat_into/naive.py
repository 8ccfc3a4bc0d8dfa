"""Reference of `lingc::concat_into`: ``out.copy_(torch.cat(parts, 0))``."""

from __future__ import annotations

import torch


def concat_into_reference(parts: list[torch.Tensor], out: torch.Tensor) -> None:
    out.copy_(torch.cat(parts, 0))
