"""Building nodes in a pass: every new node gets a `meta["val"]` computed by running its target
under the graph's fake mode, so later passes and Inductor see valid shapes and dtypes."""

from __future__ import annotations

import torch.fx as fx
from torch.utils._pytree import tree_map


def _fake_mode(args):
    for a in args:
        if isinstance(a, fx.Node) and "val" in a.meta:
            vals = a.meta["val"] if isinstance(a.meta["val"], (list, tuple)) else [a.meta["val"]]
            for v in vals:
                if hasattr(v, "fake_mode"):
                    return v.fake_mode
        if isinstance(a, (list, tuple)):
            mode = _fake_mode(a)
            if mode is not None:
                return mode
    return None


def emit(graph: fx.Graph, target, *args, **kwargs) -> fx.Node:
    """graph.call_function(target, args, kwargs) with meta["val"] filled in."""
    node = graph.call_function(target, args, kwargs)
    val = lambda a: a.meta["val"] if isinstance(a, fx.Node) else a  # noqa: E731
    with _fake_mode(list(args) + list(kwargs.values())):
        node.meta["val"] = target(*tree_map(val, args), **tree_map(val, kwargs))
    return node
