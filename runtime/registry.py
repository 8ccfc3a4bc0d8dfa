"""`register_op`: how every lingc kernel becomes a `torch.ops.lingc.*` custom op.

Opaque `torch.library.custom_op`s (not `triton_op`s: Inductor re-launches traced user Triton
kernels without the PDL attribute, an opaque op keeps lingc's own launch), with a fake impl for
tracing. Idempotent: a module can be imported twice (reload, or under a second name) and the
dispatcher refuses a second definition of the same name, so the existing op is returned.

What the model's code calls is an `EagerOp` around the op: in plain eager code on CUDA tensors
(a prompt chunk run eagerly, or being captured: runtime/relay/prefill_graphs.py) it calls the
implementation directly, because the custom-op dispatcher costs 12-64 us of host time per call on
the H200 host (`python -m benchmarks.host_overhead`, session 39) and an eager prefill, whose host
issues ~330 such calls per forward, is host-bound; traced, compiled, profiled or differentiable calls, fake or other
subclass tensors, the CPU and ops that mutate an argument go through the dispatcher as before.
"""
from __future__ import annotations

from typing import Callable, Sequence

import torch

from lingc import compat

__all__ = ["EagerOp", "register_op"]

_PLAIN = (torch.Tensor, torch.nn.Parameter)
# False: every call through the dispatcher (`python -m benchmarks.prefill --op-calls dispatcher`
# compares the two in one process).
DIRECT_CALLS = True


def _plain_cuda(x) -> bool:
    return type(x) in _PLAIN and x.is_cuda and not (x.requires_grad and torch.is_grad_enabled())


def direct_call_applies(args, kwargs) -> bool:
    """Whether a call may skip the dispatcher: not compiling or tracing (no torch-function or
    dispatch mode), not profiling (the op's name stays in profiles), and every tensor argument a
    plain CUDA tensor (no fake or functional tensor) that needs no gradient; at least one."""
    if (not DIRECT_CALLS or torch.compiler.is_compiling() or torch._C._is_torch_function_mode_enabled()
            or torch._C._len_torch_dispatch_stack() or torch.autograd.profiler._is_profiler_enabled):
        return False
    seen = False
    for a in (*args, *kwargs.values()):
        for t in a if isinstance(a, (list, tuple)) else (a,):
            if isinstance(t, torch.Tensor):
                if not _plain_cuda(t):
                    return False
                seen = True
    return seen


class EagerOp:
    """A lingc op as the model calls it: the implementation directly where
    `direct_call_applies`, the dispatcher (`torch.ops.lingc.<name>`) otherwise (module
    docstring). Every other attribute is the registered op's."""

    def __init__(self, op, impl: Callable):
        self.op, self.impl = op, impl

    def __call__(self, *args, **kwargs):
        if direct_call_applies(args, kwargs):
            return self.impl(*args, **kwargs)
        return self.op(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self.op, name)

    def __repr__(self) -> str:
        return f"EagerOp({self.op!r})"


def register_op(name: str, impl: Callable, fake: Callable, mutates_args: Sequence[str] = (),
                schema: str | None = None):
    """`lingc::<name>` from `impl` (schema inferred from its annotations unless given), with
    `fake` as its fake impl; `mutates_args` names the arguments it writes in place. Returns the op,
    wrapped in an `EagerOp` unless it mutates an argument (the dispatcher then keeps the version
    counters of what it writes)."""
    if hasattr(torch.ops.lingc, name):
        op = getattr(torch.ops.lingc, name)
    else:
        op = torch.library.custom_op(f"lingc::{name}", impl, mutates_args=tuple(mutates_args), schema=schema)
        op.register_fake(fake)
        if op._opoverload._schema.is_mutable:
            compat.register_version_bump(op)
    return op if mutates_args else EagerOp(op, impl)
