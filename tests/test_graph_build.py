"""lingc.graph_build.eliminate_dead_code removes exactly what torch's Graph.eliminate_dead_code
removes: on traced graphs with in-place state writes, mutable custom ops, random ops, multi-output
ops and chains of dead values, and on a compiled tiny model's captured graph with dead branches
grafted on."""
import copy

import pytest
import torch
import torch.fx as fx
from torch.fx.experimental.proxy_tensor import make_fx

from lingc.graph_build import eliminate_dead_code


@torch.library.custom_op("lingc_test::bump", mutates_args=("state",))
def _bump(state: torch.Tensor, x: torch.Tensor) -> None:
    state.add_(x.sum())


@_bump.register_fake
def _(state, x):
    return None


def both(gm: fx.GraphModule):
    ours, theirs = copy.deepcopy(gm), copy.deepcopy(gm)
    removed = eliminate_dead_code(ours.graph)
    n_before = len(theirs.graph.nodes)
    theirs.graph.eliminate_dead_code()
    assert removed == n_before - len(theirs.graph.nodes)
    assert [str(n.format_node()) for n in ours.graph.nodes] == \
           [str(n.format_node()) for n in theirs.graph.nodes]
    return removed


def program(state, cache, x):
    dead = (x * 2).exp().sum()              # a dead chain          # noqa: F841
    vals, idx = torch.topk(x, 2)            # multi-output, one output used
    cache[0].copy_(vals)                    # an in-place state write: kept
    _bump(state, x)                         # a mutable custom op: kept
    torch.rand(3)                           # a random op with no user: torch keeps it
    torch.sigmoid(idx.float())              # dead                       # noqa: B018
    return x.relu() + vals.sum()


@pytest.mark.parametrize("seed", range(3))
def test_same_verdicts_as_torch_on_a_traced_graph(seed):
    torch.manual_seed(seed)
    args = (torch.randn(1), torch.randn(2, 2), torch.randn(4))
    gm = make_fx(program)(*args)
    # More dead ends on top of what tracing left: unused views and casts of live values.
    g = gm.graph
    live = [n for n in g.nodes if n.op == "call_function"]
    out = next(n for n in g.nodes if n.op == "output")
    for n in live[seed::2]:
        with g.inserting_before(out):
            a = g.call_function(torch.ops.aten.view.default, (n, [-1]))
            g.call_function(torch.ops.prims.convert_element_type.default, (a, torch.float64))
    assert both(gm) >= 4


def test_same_verdicts_as_torch_on_a_captured_model_graph():
    """The capture lingc's backend starts from (compat.aot_inference_backend), of the tiny model."""
    from lingc import compat
    from lingc.models import Ling3Cache
    from model_helpers import tiny_model

    model = tiny_model()
    captured = {}

    def grab(gm, example_inputs):
        captured["gm"] = gm
        return gm.forward

    cache = Ling3Cache.allocate(model.config, 16)
    backend = compat.aot_inference_backend(grab, compat.decomposition_table())
    fn = torch.compile(model, backend=backend, fullgraph=True, dynamic=False)
    with torch.no_grad():
        fn(torch.tensor([5]), torch.tensor([3]), cache)
    gm = captured["gm"]
    g = gm.graph
    out = next(n for n in g.nodes if n.op == "output")
    computes = [n for n in g.nodes if n.op == "call_function" and n.target != torch.ops.aten.copy_.default]
    for n in computes[::7]:                 # graft dead branches onto every seventh value
        if isinstance(n.meta.get("val"), torch.Tensor):
            with g.inserting_before(out):
                g.call_function(torch.ops.aten.neg.default, (n,))
    assert both(gm) > 0
