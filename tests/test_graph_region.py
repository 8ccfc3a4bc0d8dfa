"""graph_region's walks and region keys, against brute force on small FX graphs."""
from __future__ import annotations

import random

import pytest
import torch
import torch.fx as fx

from lingc.graph_region import depends_on, descendants, region, region_key


def _random_dag(seed: int, n: int = 60) -> fx.Graph:
    """n nodes after three placeholders, each an add of two random earlier nodes (a DAG in graph
    order with long and short edges, several sinks)."""
    rng = random.Random(seed)
    g = fx.Graph()
    nodes = [g.placeholder(f"x{i}") for i in range(3)]
    for _ in range(n):
        a, b = rng.sample(nodes[-12:], 2) if rng.random() < 0.8 else rng.sample(nodes, 2)
        nodes.append(g.call_function(torch.add, (a, b)))
    g.output(nodes[-1])
    return g


@pytest.mark.parametrize("seed", range(4))
def test_depends_on_equals_a_whole_graph_walk(seed):
    g = _random_dag(seed)
    nodes = [n for n in g.nodes if n.op != "output"]
    order = {n: i for i, n in enumerate(g.nodes)}
    checked = 0
    for src in nodes:
        below = descendants([src])
        for value in nodes:
            assert depends_on(value, src, order) == (value in below), (src.name, value.name)
            checked += value in below
    assert checked > len(nodes)            # both answers occur


def _layers(eps2: float = 1e-6, second_dtype=torch.float32) -> tuple[fx.Graph, list]:
    """Two 'layers' y = x * rsqrt(mean(x^2) + eps) * w, the second fed by the first."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    aten = torch.ops.aten
    g = fx.Graph()
    mode = FakeTensorMode()
    outs = []
    x = g.placeholder("x")
    x.meta["val"] = mode.from_tensor(torch.empty(4, 8))
    for i, (eps, dt) in enumerate(((1e-6, torch.float32), (eps2, second_dtype))):
        w = g.placeholder(f"w{i}")
        w.meta["val"] = mode.from_tensor(torch.empty(8, dtype=dt))
        sq = g.call_function(aten.mul.Tensor, (x, x))
        ms = g.call_function(aten.mean.dim, (sq, [-1], True))
        r = g.call_function(aten.rsqrt.default, (g.call_function(aten.add.Tensor, (ms, eps)),))
        x = g.call_function(aten.mul.Tensor, (g.call_function(aten.mul.Tensor, (x, r)), w))
        x.meta["val"] = mode.from_tensor(torch.empty(4, 8))
        outs.append(x)
    g.output(x)
    regions = []
    for i, o in enumerate(outs):
        stop = outs[i - 1] if i else None
        nodes, leaves = region([o], lambda n, stop=stop: n is stop)
        regions.append((nodes, leaves, [o]))
    return g, regions


def test_region_key_equal_for_repeated_layers_and_apart_otherwise():
    _, (a, b) = _layers()
    assert len(a[0]) == len(b[0]) == 6
    assert region_key(*a) == region_key(*b)
    assert hash(region_key(*a)) == hash(region_key(*b))
    _, (a, b) = _layers(eps2=1e-5)                          # another constant
    assert region_key(*a) != region_key(*b)
    _, (a, b) = _layers(second_dtype=torch.bfloat16)        # a leaf of another dtype
    assert region_key(*a) != region_key(*b)
    _, (a, b) = _layers(eps2=1)                             # 1 (int) is not 1e-6, nor 1.0
    _, (c, d) = _layers(eps2=1.0)
    assert region_key(*b) != region_key(*d)
    # outputs: the same nodes, another output list
    nodes, leaves, outs = a
    assert region_key(nodes, leaves, outs) != region_key(nodes, leaves, [nodes[0]])
