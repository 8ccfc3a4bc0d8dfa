"""Graphs with symbolic shapes (dynamic=True, or Dynamo's automatic dynamic shapes after a second
input shape) compile per concrete shape through lingc's static pipeline."""

import warnings

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from lingc import shape_specialize
from lingc.backend import compile_reports
from lingc.shape_specialize import ShapeSpecializedGraph, has_symbolic_inputs, specialise


class Block(nn.Module):
    """A generic pre-norm MLP block (not Ling-3): LayerNorm (its eps is the float Dynamo passes
    as a 0-d tensor under dynamic=True), same-input projections and a SwiGLU."""

    def __init__(self, d: int = 32):
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.gate, self.up, self.down = nn.Linear(d, 2 * d, bias=False), nn.Linear(d, 2 * d, bias=False), \
            nn.Linear(2 * d, d, bias=False)

    def forward(self, x):
        h = self.norm(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


@pytest.fixture
def block():
    torch.manual_seed(0)
    torch._dynamo.reset()
    return Block().eval()


def _lingc_ops(report) -> dict[str, int]:
    return {op: n for cat, op, n, _ in report.kernels.rows if cat == "lingc"}


@pytest.mark.parametrize("dynamic", [None, True])
def test_symbolic_graph_compiles_per_shape_and_equals_eager(block, dynamic):
    """dynamic=None: the first shape compiles static, the second makes Dynamo trace a symbolic
    graph; dynamic=True: symbolic from the start. Either way every shape runs a static lingc
    graph (its passes fired: lingc ops in its kernel table), once per shape, equal to eager."""
    step = torch.compile(block, backend="lingc", dynamic=dynamic, options={"inductor": False})
    before = len(compile_reports)
    shapes = [(3, 32), (5, 32), (7, 32), (5, 32), (2, 4, 32)]
    with torch.no_grad():
        for shape in shapes:
            x = torch.randn(shape)
            torch.testing.assert_close(step(x), block(x), rtol=1e-5, atol=1e-5)
    reports = compile_reports[before:]
    assert len(reports) == 4                     # (5, 32) a second time compiles nothing
    for report, shape in zip(reports, [(3, 32), (5, 32), (7, 32), (2, 4, 32)]):
        assert str(list(shape)) in report.input_shapes, (shape, report.input_shapes)
    for r in reports:                            # the SwiGLU and the down projection on lingc kernels
        assert _lingc_ops(r) == {"lingc.swiglu_gemm_separate": 1, "lingc.gemm": 1}, r.kernels.format()


def test_symbolic_graph_through_inductor(block):
    step = torch.compile(block, backend="lingc", dynamic=True)
    with torch.no_grad():
        for n in (3, 6):
            x = torch.randn(n, 32)
            torch.testing.assert_close(step(x), block(x), rtol=1e-5, atol=1e-5)


def test_symbolic_graph_aot_capture(block):
    step = torch.compile(block, backend="lingc", dynamic=True, options={"inductor": False, "capture": "aot"})
    with torch.no_grad():
        for n in (3, 6):
            x = torch.randn(n, 32)
            torch.testing.assert_close(step(x), block(x), rtol=1e-5, atol=1e-5)


def test_the_specialised_graph_takes_only_tensors():
    seen = {}

    def probe(gm, example_inputs):
        seen["symbolic"] = has_symbolic_inputs(gm, example_inputs)
        seen["gm"], seen["inputs"] = gm, list(example_inputs)
        return gm.forward

    torch._dynamo.reset()
    block = Block().eval()
    with torch.no_grad():
        torch.compile(block, backend=probe, dynamic=True)(torch.randn(4, 32))
    assert seen["symbolic"]
    gm, inputs = seen["gm"], [x if not isinstance(x, torch.SymInt) else 4 for x in seen["inputs"]]
    scalars = shape_specialize._item_only_scalars(gm)
    assert len(scalars) == 1                     # the LayerNorm's eps
    static, keep = specialise(gm, inputs, scalars)
    assert all(isinstance(inputs[i], torch.Tensor) for i in keep)
    assert len(keep) == len(inputs) - 2          # the size and the eps became constants
    x = torch.randn(4, 32)
    args = [x if isinstance(inputs[i], torch.Tensor) and inputs[i].shape == (4, 32) else inputs[i] for i in keep]
    torch.testing.assert_close(static(*args)[0], block(x))
    assert "item" not in static.code and "s" not in [n.name for n in static.graph.nodes if n.op == "placeholder"]

    torch._dynamo.reset()
    with torch.no_grad():
        torch.compile(block, backend=probe, dynamic=False)(torch.randn(4, 32))
    assert not seen["symbolic"]


def test_many_shapes_warn_once(block, monkeypatch):
    monkeypatch.setattr(shape_specialize, "MANY_SHAPES", 3)
    step = torch.compile(block, backend="lingc", dynamic=True, options={"inductor": False})
    with warnings.catch_warnings(record=True) as caught, torch.no_grad():
        warnings.simplefilter("always")
        for n in range(1, 7):
            step(torch.randn(n, 32))
    msgs = [str(w.message) for w in caught if "symbolic shapes" in str(w.message)]
    assert len(msgs) == 1 and "3 input shapes" in msgs[0] and "PromptPadding" in msgs[0]


def test_static_graphs_are_not_wrapped(block):
    from lingc.backend import lingc_backend
    gm = torch.fx.symbolic_trace(block)
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            node.meta["example_value"] = torch.randn(4, 32)
    assert not has_symbolic_inputs(gm, [torch.randn(4, 32)])
    assert not isinstance(torch.compile(block, backend="lingc", dynamic=False), ShapeSpecializedGraph)
    assert callable(lingc_backend)
