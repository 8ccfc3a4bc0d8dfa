"""Static specialisations of a Dynamo graph with symbolic shapes.

Dynamo hands a backend a graph with symbolic sizes when it is asked to (``dynamic=True``) and,
by default, after a frame has seen a second input shape (automatic dynamic shapes). lingc's
passes match fixed shapes and its kernels are configured per shape, so such a graph is compiled
through the ordinary static pipeline once per concrete shape, at that shape's first call, under
a fake mode of its own (the symbolic trace's is gone by then). The Dynamo graph itself is shape
generic Python; before the trace, its size inputs (SymInt placeholders) and its scalar inputs
(floats that Dynamo passes as 0-d tensors and reads with ``.item()``, e.g. a norm's eps under
``dynamic=True``) become the call's constants, so the trace is the static graph Dynamo would have
given for them. ``torch.compile(..., dynamic=False)`` gets the same graphs from Dynamo directly.
"""

from __future__ import annotations

import copy
import logging
import warnings
from typing import Any, Callable, Sequence

import torch
import torch.fx as fx

log = logging.getLogger("lingc")

# After this many shapes of one graph, warn once: each new shape is a whole compile.
MANY_SHAPES = 8


def has_symbolic_inputs(gm: fx.GraphModule, example_inputs: Sequence[Any]) -> bool:
    """Whether Dynamo traced ``gm`` with a symbolic size (a SymInt input, or a placeholder whose
    example value has a symbolic size or stride)."""
    if any(isinstance(x, (torch.SymInt, torch.SymFloat, torch.SymBool)) for x in example_inputs):
        return True
    for node in gm.graph.nodes:
        if node.op != "placeholder":
            continue
        value = node.meta.get("example_value")
        if isinstance(value, torch.Tensor) and any(
                isinstance(d, torch.SymInt) for d in (*value.shape, *value.stride())):
            return True
    return False


def _item_only_scalars(gm: fx.GraphModule) -> set[int]:
    """Indices of the placeholders that are read only by ``.item()``: Dynamo's form of a Python
    float it did not specialise (``dynamic=True``). Their values become constants of the trace."""
    found = set()
    for i, node in enumerate(n for n in gm.graph.nodes if n.op == "placeholder"):
        value = node.meta.get("example_value")
        if (isinstance(value, torch.Tensor) and value.dim() == 0 and node.users
                and all(u.op == "call_method" and u.target == "item" for u in node.users)):
            found.add(i)
    return found


def _replace_uses(node: fx.Node, value: Any) -> None:
    for user in list(node.users):
        user.args = fx.node.map_arg(user.args, lambda a: value if a is node else a)
        user.kwargs = fx.node.map_arg(user.kwargs, lambda a: value if a is node else a)


def specialise(gm: fx.GraphModule, inputs: Sequence[Any], scalars: set[int]) -> tuple[fx.GraphModule, list[int]]:
    """A copy of ``gm`` whose non-tensor inputs and ``.item()``-read scalar inputs are the
    constants of ``inputs``, and the indices of the inputs it still takes (the tensors)."""
    graph = copy.deepcopy(gm.graph)
    keep = []
    for i, node in enumerate([n for n in graph.nodes if n.op == "placeholder"]):
        x = inputs[i]
        if i in scalars:
            value = x.item()
            for item in list(node.users):
                _replace_uses(item, value)
                graph.erase_node(item)
        elif isinstance(x, torch.Tensor):
            keep.append(i)
            continue
        else:
            _replace_uses(node, x)
        graph.erase_node(node)
    graph.lint()
    return fx.GraphModule(gm, graph), keep


def _arg_key(i: int, x: Any, scalars: set[int]) -> tuple:
    if i in scalars:
        return ("v", x.item())
    if isinstance(x, torch.Tensor):
        return ("t", tuple(x.shape), tuple(x.stride()), x.dtype, str(x.device), x.requires_grad)
    return ("v", type(x).__name__, x)


class ShapeSpecializedGraph:
    """The callable lingc returns for a graph with symbolic shapes: it compiles ``compile_static``
    for each distinct signature of its arguments (tensor sizes, strides, dtypes, devices; the
    values of the other arguments, which include the symbolic sizes) at its first call and runs
    the compiled graph on the tensors."""

    def __init__(self, gm: fx.GraphModule, compile_static: Callable[[fx.GraphModule, list[Any]], Callable],
                 role: str):
        self.gm = gm
        self.compile_static = compile_static
        self.role = role
        self.scalars = _item_only_scalars(gm)
        self.compiled: dict[tuple, tuple[Callable, list[int]]] = {}
        log.info("lingc: a %s graph with symbolic shapes; compiling it per concrete shape at first call", role)

    def __call__(self, *args: Any) -> Any:
        key = tuple(_arg_key(i, a, self.scalars) for i, a in enumerate(args))
        entry = self.compiled.get(key)
        if entry is None:
            entry = self.compiled[key] = self._compile(list(args))
            if len(self.compiled) == MANY_SHAPES:
                shapes = sorted({k[1] for sig in self.compiled for k in sig if k[0] == "t"}, key=str)[:4]
                warnings.warn(
                    f"lingc: a {self.role} graph with symbolic shapes has now been compiled for "
                    f"{MANY_SHAPES} input shapes (e.g. {shapes}); lingc builds each shape's graph "
                    f"whole at its first call. Feed a few fixed shapes (pad prompts, e.g. "
                    f"lingc.models.padding.PromptPadding, or use fixed chunk sizes).", stacklevel=2)
        fn, keep = entry
        return fn(*[args[i] for i in keep])

    def _compile(self, inputs: list[Any]) -> tuple[Callable, list[int]]:
        """The static pipeline on ``inputs``' shapes: its trace runs under a fresh fake mode and
        tracing context (Dynamo's, which held the symbolic sizes, ended with its compile)."""
        from torch._guards import TracingContext, tracing
        from torch._subclasses.fake_tensor import FakeTensorMode

        gm, keep = specialise(self.gm, inputs, self.scalars)
        fake_mode = FakeTensorMode()     # no shape environment: every size static
        with tracing(TracingContext(fake_mode)), torch.no_grad():
            return self.compile_static(gm, [inputs[i] for i in keep]), keep
