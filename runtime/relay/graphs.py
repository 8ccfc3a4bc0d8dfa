"""CUDA-graph capture of compiled step functions (the ``cudagraphs`` stage), and what a captured
graph contains.

Each (role, shape) is captured once over the engine's static buffers, all graphs in one memory
pool, after warm-up runs (which compile the step and allocate every workspace). A capture that
fails warns with the reason and the step runs uncaptured: never silent, never wrong.

``describe`` reads a kept graph through the driver API: kernel nodes, and edges by type
(programmatic = a PDL edge), which is the evidence design.md asks for (not launch flags).
"""

from __future__ import annotations

import ctypes
import warnings
from dataclasses import dataclass
from typing import Callable

import torch

__all__ = ["CapturedStep", "capture_step", "prepare_steps", "graph_edge_types", "describe", "GraphInfo"]

# CUgraphNodeType: CU_GRAPH_NODE_TYPE_KERNEL = 0
_KERNEL_NODE = 0


@dataclass
class GraphInfo:
    role: str
    kernel_nodes: int
    nodes: int
    edges: int
    pdl_edges: int

    def format(self) -> str:
        return (f"{self.role:<14} {self.kernel_nodes:>6} kernels  {self.nodes:>6} nodes  "
                f"{self.edges:>6} edges  {self.pdl_edges:>5} PDL edges")


class CapturedStep:
    """A step run by graph replay, or by calling the compiled function when capture failed."""

    def __init__(self, role: str, fn: Callable[[], object], graph: torch.cuda.CUDAGraph | None,
                 output: object = None, reason: str | None = None):
        self.role, self.fn, self.graph, self.output, self.reason = role, fn, graph, output, reason

    @property
    def captured(self) -> bool:
        return self.graph is not None

    def __call__(self):
        if self.graph is not None:
            self.graph.replay()
            return self.output
        return self.fn()


def _keep_graph_kwargs() -> dict:
    # keep_graph (torch >= 2.9) keeps the cudaGraph_t alive so describe() can read it.
    try:
        torch.cuda.CUDAGraph(keep_graph=True)
        return {"keep_graph": True}
    except TypeError:
        return {}


def capture_step(role: str, fn: Callable[[], object], pool, warmup: int = 2) -> CapturedStep:
    """Warm fn up on a side stream, then capture one call into a CUDA graph in `pool`."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(warmup):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    kwargs = _keep_graph_kwargs()
    graph = torch.cuda.CUDAGraph(**kwargs)
    try:
        with torch.cuda.graph(graph, pool=pool):
            output = fn()
        if kwargs:
            graph.instantiate()
    except Exception as e:  # noqa: BLE001  (any capture failure falls back, loudly)
        torch.cuda.synchronize()
        reason = f"{type(e).__name__}: {e}"
        warnings.warn(f"lingc: CUDA-graph capture of the {role} step failed ({reason}); it runs "
                      f"uncaptured (correct, slower). Set options={{'cudagraphs': False}} to "
                      f"silence this.", stacklevel=2)
        return CapturedStep(role, fn, None, reason=reason)
    return CapturedStep(role, fn, graph, output)


def prepare_steps(names, compiled: Callable[[str], Callable[[], object]], reset: Callable[[], None],
                  cudagraphs: bool, progress: bool) -> dict[str, CapturedStep]:
    """Each named step compiled (``compiled(name)`` returns its call, compiling it first if need
    be) and, with cudagraphs, captured, all into one memory pool, under one progress bar;
    ``reset()`` (the engine's state and buffers zeroed) before each capture's warm-up, which runs
    the step from a fresh state again, and after the last."""
    from lingc.progress import Progress

    bar = Progress(len(names), "lingc compile + capture", enabled=progress)
    pool = torch.cuda.graph_pool_handle() if cudagraphs else None
    steps = {}
    reset()
    for name in names:
        call = compiled(name)
        reset()
        with torch.no_grad():
            steps[name] = capture_step(name, call, pool) if cudagraphs else CapturedStep(name, call, None)
        bar.update()
    bar.close()
    reset()
    return steps


def _libcuda():
    return ctypes.CDLL("libcuda.so.1")


def graph_edge_types(graph: torch.cuda.CUDAGraph) -> list[int]:
    """Dependency types of every edge of a kept CUDA graph: 0 = full, 1 = programmatic (PDL)."""

    class EdgeData(ctypes.Structure):
        _fields_ = [("from_port", ctypes.c_ubyte), ("to_port", ctypes.c_ubyte),
                    ("type", ctypes.c_ubyte), ("reserved", ctypes.c_ubyte * 5)]

    get_edges = _libcuda().cuGraphGetEdges_v2
    get_edges.argtypes = [ctypes.c_void_p] * 4 + [ctypes.POINTER(ctypes.c_size_t)]
    handle = ctypes.c_void_p(graph.raw_cuda_graph())
    count = ctypes.c_size_t(0)
    if get_edges(handle, None, None, None, ctypes.byref(count)) != 0:
        raise RuntimeError("cuGraphGetEdges_v2 failed (was the graph captured with keep_graph=True?)")
    if count.value == 0:
        return []                  # (a one-kernel graph: the driver refuses zero-length arrays)
    nodes_from = (ctypes.c_void_p * count.value)()
    nodes_to = (ctypes.c_void_p * count.value)()
    edges = (EdgeData * count.value)()
    if get_edges(handle, nodes_from, nodes_to, edges, ctypes.byref(count)) != 0:
        raise RuntimeError("cuGraphGetEdges_v2 failed")
    return [e.type for e in edges]


def _node_types(graph: torch.cuda.CUDAGraph) -> list[int]:
    lib = _libcuda()
    get_nodes, get_type = lib.cuGraphGetNodes, lib.cuGraphNodeGetType
    get_nodes.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.POINTER(ctypes.c_size_t)]
    get_type.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_int)]
    handle = ctypes.c_void_p(graph.raw_cuda_graph())
    count = ctypes.c_size_t(0)
    if get_nodes(handle, None, ctypes.byref(count)) != 0:
        raise RuntimeError("cuGraphGetNodes failed")
    nodes = (ctypes.c_void_p * count.value)()
    get_nodes(handle, nodes, ctypes.byref(count))
    types = []
    for node in nodes:
        t = ctypes.c_int(-1)
        get_type(ctypes.c_void_p(node), ctypes.byref(t))
        types.append(t.value)
    return types


def describe(step: CapturedStep) -> GraphInfo | None:
    """Kernel nodes and PDL edges of a captured step (None when it runs uncaptured)."""
    if step.graph is None:
        return None
    try:
        types = _node_types(step.graph)
        edges = graph_edge_types(step.graph)
    except (OSError, RuntimeError, AttributeError):
        return None
    return GraphInfo(step.role, sum(t == _KERNEL_NODE for t in types), len(types), len(edges),
                     sum(e == 1 for e in edges))
