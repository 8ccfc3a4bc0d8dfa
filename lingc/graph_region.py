"""Regions of an FX graph: cut out the subgraph that computes some values from some inputs, and
run it on its own.

pdl_swap replaces whole computations (a KDA layer's core, an MLA attention core) by one lingc op.
It finds such a computation by its boundary, the values it produces (a state write, an attention
output) and the values it starts from (projection outputs, parameters, a cache), and then checks
that the cut-out region computes what the op computes: `region_module` turns the region into a
standalone GraphModule, `run_region` evaluates it on random inputs, and the pass compares the
result with the op's reference under each candidate assignment of inputs to the op's arguments.
That equivalence check is what lets a foreign spelling of the same math match (a transposed
state, x * sigmoid(x), another loop), and what keeps different math from matching.
"""

from __future__ import annotations

from typing import Callable, Iterable

import torch
import torch.fx as fx
from torch.utils._pytree import tree_map

from .compat import real_tensor_mode
from .graph_match import is_call, scalar, weight_source
from .pass_manager import VIEW_OPS
from .sdpa import CPU_STAND_INS, sdpa_call

aten = torch.ops.aten

# Ops whose results are "inputs" to an attention core: projections and other lingc kernels.
HEAVY = {aten.mm.default, aten.addmm.default, aten.embedding.default}


def is_heavy(n: fx.Node) -> bool:
    """A projection (a product with a weight: a graph input behind views), an embedding or a
    lingc kernel. A product of two computed values (attention math, e.g. ``p @ c`` over a cache
    slice, which reaches the graph as mm) is part of the core around it, not an input to it."""
    t = n.op == "call_function" and n.target
    if t in (aten.mm.default, aten.addmm.default):
        return any(weight_source(a) is not None for a in n.args[-2:])
    return t in HEAVY or (isinstance(t, torch._ops.OpOverload) and t.namespace == "lingc")


def val(n):
    return n.meta.get("val") if isinstance(n, fx.Node) else None


def shape(n) -> tuple[int, ...] | None:
    v = val(n)
    return tuple(v.shape) if isinstance(v, torch.Tensor) else None


def numel(n) -> int:
    v = val(n)
    return v.numel() if isinstance(v, torch.Tensor) else -1


def ancestors(nodes: Iterable[fx.Node], within: set[fx.Node] | None = None) -> set[fx.Node]:
    """Every node `nodes` depend on; with `within`, only through (and only) nodes of that set."""
    seen, stack = set(), list(nodes)
    while stack:
        for a in stack.pop().all_input_nodes:
            if a not in seen and (within is None or a in within):
                seen.add(a)
                stack.append(a)
    return seen


def descendants(nodes: Iterable[fx.Node], through: Callable[[fx.Node], bool] = lambda n: True) -> set[fx.Node]:
    """Every node reachable from `nodes` by users; propagation stops after nodes where
    `through(node)` is false (they are included, their users are not)."""
    seen, stack = set(), list(nodes)
    while stack:
        for u in stack.pop().users:
            if u not in seen:
                seen.add(u)
                if through(u):
                    stack.append(u)
    return seen


def descendants_upto(n: fx.Node, end: int, order: dict[fx.Node, int]) -> set[fx.Node]:
    """n's descendants at or before graph position `end` (`order`: node -> position): the part of
    the graph between n and the node at `end`, without walking every later layer."""
    before = lambda u: order.get(u, end + 1) <= end  # noqa: E731
    return {u for u in descendants([n], before) if before(u)}


def depends_on(value: fx.Node, src: fx.Node, order: dict[fx.Node, int]) -> bool:
    """Whether `value` depends on `src` (`order`: node -> graph position).

    Two walks that take turns, each expanding whichever frontier is smaller: src's users up to
    value's position and value's inputs down to src's position, until they meet (a path) or one
    side runs out (none). One direction alone can be the whole graph: a state placeholder's
    users reach every later layer, and a value written back at the epilogue sits past them; its
    inputs reach every earlier layer. The path between the two is one layer long."""
    if value is src:
        return False
    lo, hi = order[src], order[value]
    fwd_seen, bwd_seen = {src}, {value}
    fwd, bwd = [src], [value]
    while fwd and bwd:
        nxt = []
        if len(fwd) <= len(bwd):
            for n in fwd:
                for u in n.users:
                    if u in bwd_seen:
                        return True
                    if u not in fwd_seen and order.get(u, hi + 1) <= hi:
                        fwd_seen.add(u)
                        nxt.append(u)
            fwd = nxt
        else:
            for n in bwd:
                for a in n.all_input_nodes:
                    if a in fwd_seen:
                        return True
                    if a not in bwd_seen and order.get(a, -1) >= lo:
                        bwd_seen.add(a)
                        nxt.append(a)
            bwd = nxt
    return False


SPLITS = {aten.split.Tensor, aten.split_with_sizes.default, aten.unbind.int, aten.chunk.default}


def view_base(n: fx.Node) -> fx.Node:
    """The node whose storage n views (through views, getitem of splits)."""
    while (is_call(n, *VIEW_OPS, *SPLITS)
           or (n.op == "call_function" and getattr(n.target, "__name__", "") == "getitem")):
        n = n.args[0]
    return n


def region(outputs: list[fx.Node], is_leaf: Callable[[fx.Node], bool]) -> tuple[list[fx.Node], list[fx.Node]]:
    """(region nodes in graph order, leaves in first-seen order): the ancestors of `outputs`,
    stopping at nodes where is_leaf is true; nodes without inputs (iota, full, scalar_tensor)
    belong to the region."""
    inside: set[fx.Node] = set()
    leaves: list[fx.Node] = []
    stack = list(outputs)
    while stack:
        n = stack.pop()
        if n in inside or n in leaves:
            continue
        if n.op == "placeholder" or (is_leaf(n) and not is_constant(n)):
            leaves.append(n)
            continue
        inside.add(n)
        stack.extend(n.all_input_nodes)
    order = {n: i for i, n in enumerate(outputs[0].graph.nodes)}
    return sorted(inside, key=order.__getitem__), leaves


def is_constant(n: fx.Node) -> bool:
    """n depends on no graph input (iota, full, arange and views of them).

    Breadth first, stopping at the first input reached: a computed value usually meets a weight or
    an activation within a hop or two, while a walk of its whole ancestry (the first version) made
    region() quadratic in depth. Iterative: a 42-layer graph is deeper than Python's recursion
    limit."""
    seen, frontier = {n}, [n]
    while frontier:
        nxt = []
        for cur in frontier:
            if cur.op != "call_function":
                return False
            for a in cur.all_input_nodes:
                if a not in seen:
                    seen.add(a)
                    nxt.append(a)
        frontier = nxt
    return True


def softmax_scales(nodes: list[fx.Node]) -> set[float]:
    """The constants of a region that could be its softmax scale s: a multiplier below 1, 1 / d
    for a divisor d above 1 (scores / sqrt(d)), or a fused attention op's scale (its default
    1 / sqrt(head dim) when it names none); and the square of each multiplier, since SDPA's math
    form scales q and k by sqrt(s) each."""
    mults = {float(a) for n in nodes for a in n.args if scalar(a) is not None and 0 < scalar(a) < 1}
    return (mults | {a * a for a in mults}
            | {1.0 / float(n.args[1]) for n in nodes if is_call(n, aten.div.Tensor)
               and scalar(n.args[1]) is not None and scalar(n.args[1]) > 1}
            | {c.effective_scale() for c in map(sdpa_call, nodes) if c is not None})


# Single-input ops that keep the values (a leaf widens through them): copies, casts, complex views.
VALUE_VIEWS = (aten.clone.default, torch.ops.prims.convert_element_type.default,
               aten.view_as_complex.default, aten.view_as_real.default)


def widen_leaf(leaf: fx.Node, want: Callable[[fx.Node], bool]) -> tuple[fx.Node, list[fx.Node]]:
    """Walk a leaf back through single-input view ops to the nearest node `want` accepts:
    (that node, the view nodes passed, which join the region). (leaf, []) when none does."""
    chain, n = [], leaf
    while True:
        if want(n):
            return n, chain
        if not is_call(n, *VIEW_OPS, *VALUE_VIEWS):
            return leaf, []
        chain.append(n)
        n = n.args[0]


def region_module(nodes: list[fx.Node], leaves: list[fx.Node], outputs: list[fx.Node],
                  identities: list[fx.Node] = ()) -> fx.GraphModule:
    """The region as a standalone GraphModule(leaves...) -> outputs, on the CPU (a CUDA-only fused
    attention op replaced by its CPU stand-in, lingc/sdpa.py). ``identities``: nodes of the region
    passed through as their first argument (casts, where only the positions of elements matter)."""
    g = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    for i, leaf in enumerate(leaves):
        env[leaf] = g.placeholder(f"in{i}")
    cpu = lambda a: torch.device("cpu") if isinstance(a, torch.device) else a  # noqa: E731
    for n in nodes:
        if n in identities:
            env[n] = env[n.args[0]]
            continue
        new = g.node_copy(n, lambda a: env[a])
        new.kwargs = tree_map(cpu, dict(new.kwargs))
        if n.target in CPU_STAND_INS:
            new.target = CPU_STAND_INS[n.target]
        env[n] = new
    g.output([env[o] for o in outputs])
    return fx.GraphModule(torch.nn.Module(), g)


def region_key(nodes: list[fx.Node], leaves: list[fx.Node], outputs: list[fx.Node]) -> tuple:
    """A hashable description of everything `region_module(nodes, leaves, outputs)` computes from
    and `random_like` draws from: each node's target and its arguments (other nodes as positions
    in the region, constants as they are), the leaves' shapes and dtypes, the outputs' positions.

    Two regions with equal keys are the same function of inputs of the same kinds, so a probe of
    one (random inputs from a fixed seed, the reference runs) comes out exactly as a probe of the
    other. A 42-layer graph repeats one KDA region 35 times and one MLA region 7 times: probing
    each form once took pdl_swap from ~5.5 to ~2 s on the CPU."""
    pos = {leaf: ("in", i) for i, leaf in enumerate(leaves)}
    pos.update((n, ("node", i)) for i, n in enumerate(nodes))

    def canon(a):
        if isinstance(a, fx.Node):
            return pos.get(a, ("outside", a.name))    # region() leaves none: kept distinct, never equal
        if isinstance(a, (list, tuple)):
            return (type(a).__name__, *map(canon, a))
        if isinstance(a, dict):
            return ("dict", *sorted((k, canon(v)) for k, v in a.items()))
        if isinstance(a, slice):
            return ("slice", canon(a.start), canon(a.stop), canon(a.step))
        try:
            hash(a)
        except TypeError:
            return ("repr", repr(a))
        # 1 == 1.0 == True as dict keys: the type keeps an int constant apart from a float one
        return (type(a).__name__, a)

    ops = tuple((n.op, n.target, canon(n.args), canon(n.kwargs)) for n in nodes)
    kinds = tuple((shape(leaf), val(leaf).dtype if isinstance(val(leaf), torch.Tensor) else None)
                  for leaf in leaves)
    return ops, kinds, tuple(canon(o) for o in outputs)


def random_like(n: fx.Node, gen: torch.Generator, scale: float = 1.0) -> torch.Tensor:
    v = val(n)
    if v.dtype.is_floating_point:
        return (scale * torch.randn(v.shape, generator=gen)).to(v.dtype)
    return torch.randint(0, 2, v.shape, generator=gen).to(v.dtype)


def run_region(gm: fx.GraphModule, inputs: list[torch.Tensor]) -> list[torch.Tensor] | None:
    """Evaluate a region on real CPU tensors; None when it cannot run (an op without a CPU path).
    The outputs come back on the CPU: a region may move a tensor to the model's device itself
    (zeros made on the host, then moved), and the references it is compared with are CPU ones."""
    with real_tensor_mode(), torch.no_grad():
        try:
            return [o.detach().cpu() for o in gm(*inputs)]
        except Exception:  # noqa: BLE001  (a region that cannot run is simply not matched)
            return None


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    """max |a - b| / max |b| over equal numels (inf when they cannot be compared)."""
    if a is None or b is None or a.numel() != b.numel():
        return float("inf")
    a, b = a.reshape(-1).double(), b.reshape(-1).double()
    if not (torch.isfinite(a).all() and torch.isfinite(b).all()):
        return float("inf")
    scale = b.abs().max().item()
    return (a - b).abs().max().item() / (scale if scale > 0 else 1.0)
