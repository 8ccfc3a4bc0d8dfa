"""Readable, stable text of an FX graph: one line per node, for dumps and expect tests.

    %mm_3 = aten.mm(%rsqrt_1, %permute_2)            f32[1, 160]

Targets are printed without the `.default` overload, literals inline, and each node's shape and
dtype from `meta["val"]`. Placeholders are listed with their shapes. Nothing depends on memory
addresses, so the text is stable across runs and pinned by expect tests.
"""

from __future__ import annotations

from collections import Counter

import torch
import torch.fx as fx

_DT = {torch.float32: "f32", torch.bfloat16: "bf16", torch.float16: "f16", torch.int64: "i64",
       torch.int32: "i32", torch.bool: "b8", torch.float64: "f64", torch.uint8: "u8"}


def target_name(target) -> str:
    if isinstance(target, torch._ops.OpOverload):
        ns, name = target.namespace, target._schema.name.split("::")[-1]
        over = target._overloadname
        return f"{ns}.{name}" if over == "default" else f"{ns}.{name}.{over}"
    if isinstance(target, torch._ops.OpOverloadPacket):
        return str(target)
    return getattr(target, "__name__", str(target))


def val_text(val) -> str:
    if isinstance(val, torch.Tensor):
        return f"{_DT.get(val.dtype, str(val.dtype))}{list(val.shape)}"
    if isinstance(val, (list, tuple)):
        return "(" + ", ".join(val_text(v) for v in val) + ")"
    return "" if val is None else type(val).__name__


def _arg(a) -> str:
    if isinstance(a, fx.Node):
        return f"%{a.name}"
    if isinstance(a, (list, tuple)):
        inner = ", ".join(_arg(x) for x in a)
        return f"[{inner}]"
    if isinstance(a, float):
        return repr(round(a, 6))
    if isinstance(a, torch.dtype):
        return _DT.get(a, str(a))
    return repr(a)


def format_graph(gm: fx.GraphModule | fx.Graph) -> str:
    graph = gm.graph if isinstance(gm, fx.GraphModule) else gm
    lines = []
    for n in graph.nodes:
        shape = val_text(n.meta.get("val"))
        if n.op == "placeholder":
            lines.append(f"input %{n.name}  {shape}")
        elif n.op == "output":
            lines.append(f"return {_arg(n.args[0])}")
        elif n.op == "get_attr":
            lines.append(f"%{n.name} = get_attr {n.target!r}")
        else:
            args = [_arg(a) for a in n.args] + [f"{k}={_arg(v)}" for k, v in n.kwargs.items()]
            lhs = f"%{n.name} = {target_name(n.target)}({', '.join(args)})"
            lines.append(f"{lhs:<60} {shape}".rstrip())
    return "\n".join(lines) + "\n"


def count_ops(gm: fx.GraphModule | fx.Graph) -> int:
    graph = gm.graph if isinstance(gm, fx.GraphModule) else gm
    return sum(1 for n in graph.nodes if n.op == "call_function")


def op_histogram(gm: fx.GraphModule) -> Counter:
    return Counter(target_name(n.target) for n in gm.graph.nodes if n.op == "call_function")
