"""`register_op`: how every lingc kernel becomes a `torch.ops.lingc.*` custom op.

Opaque `torch.library.custom_op`s (not `triton_op`s: Inductor re-launches traced user Triton
kernels without the PDL attribute, an opaque op keeps lingc's own launch), with a fake impl for
tracing. Idempotent: a module can be imported twice (reload, or under a second name) and the
dispatcher refuses a second definition of the same name, so the existing op is returned.
"""
from __future__ import annotations

from typing import Callable, Sequence

import torch

__all__ = ["register_op"]


def register_op(name: str, impl: Callable, fake: Callable, mutates_args: Sequence[str] = (),
                schema: str | None = None):
    """`lingc::<name>` from `impl` (schema inferred from its annotations unless given), with
    `fake` as its fake impl; `mutates_args` names the arguments it writes in place."""
    if hasattr(torch.ops.lingc, name):
        return getattr(torch.ops.lingc, name)
    op = torch.library.custom_op(f"lingc::{name}", impl, mutates_args=tuple(mutates_args), schema=schema)
    op.register_fake(fake)
    return op
