"""One code object per (step function, lingc options): where Dynamo may reuse a step's graphs.

Dynamo caches compiled graphs on a function's code object. Every engine's step functions are
closures of the same few functions (steps.py, runner.py), so they share code objects, and so
one cache across every engine of a process:

- Engines with equal options reuse each other's graphs (torch.compile's wrappers compare equal):
  a second engine over the same model compiles nothing. That is kept.
- Engines with different options (a dump directory, a pass disabled, a capture mode) each add
  a cache entry to the same code object, and past ``torch._dynamo.config.recompile_limit`` (8)
  a ``fullgraph=True`` compile fails hard (FailOnRecompileLimitHit), even though none of them
  is a recompile of its own graphs.

``for_options`` gives each distinct options set its own copy of the code object, so the entries
of one options set never count against another's limit, while equal options still share one;
``compile_step`` is how every engine compiles a step with it.
"""
from __future__ import annotations

import types
from typing import Any, Callable

import torch

# (original code, options key) -> the copy every function compiled under those options runs.
_CODES: dict[tuple[types.CodeType, str], types.CodeType] = {}


def options_key(options: dict[str, Any]) -> str:
    """A stable key of an options dict (equal dicts, equal keys; order does not matter)."""
    return repr(sorted((k, repr(v)) for k, v in options.items()))


def for_options(fn: Callable, options: dict[str, Any]) -> Callable:
    """``fn`` (a plain Python function, e.g. a closure) running the code object kept for
    ``options``: the same closure cells, globals and defaults, so it computes what ``fn`` does."""
    key = (fn.__code__, options_key(options))
    code = _CODES.get(key)
    if code is None:
        code = _CODES[key] = fn.__code__.replace()     # a distinct, equal code object
    own = types.FunctionType(code, fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__)
    own.__kwdefaults__ = fn.__kwdefaults__
    own.__qualname__ = fn.__qualname__
    return own


def compile_step(fn: Callable, options: dict[str, Any]) -> Callable:
    """A step function compiled by lingc as one graph of static shapes, on ``options``' code."""
    return torch.compile(for_options(fn, options), backend="lingc", fullgraph=True, dynamic=False,
                         options=options)
