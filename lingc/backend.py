"""The `lingc` torch.compile backend.

    torch.compile(model, backend="lingc", fullgraph=True, dynamic=False, options={...})

Registered through the `torch_dynamo_backends` entry point, so no import of lingc is needed.
Pipeline per Dynamo graph (design.md):
1. capture to a functionalised ATen inference graph (parameters, buffers and caches are
   placeholders; cache and state writes stay in the graph as explicit copy_ ops), decomposed with
   Inductor's own table so the leftovers are exactly what Inductor expects: one functionalised
   trace by default, or AOTAutograd's with `capture="aot"`;
2. lingc's passes, in order, on that graph (pass_manager.py), with dumps and optional verification;
3. what no pass claimed is compiled by Inductor (its CUDA graphs off: lingc captures), or run as
   plain ATen ops with `inductor=False`.
A graph with symbolic shapes (``dynamic=True``, or Dynamo's automatic dynamic shapes after a
second input shape) goes through the same pipeline once per concrete input shape, at that
shape's first call (shape_specialize.py): lingc's kernels and passes are built for static shapes.
Every compiled graph leaves a `CompileReport` in `compile_reports` (summary, kernel table), and
carries it: inside a `graphs_run()` window each lingc graph that runs adds its reports, whether
it was compiled just now or reused from Dynamo's cache (a second engine over the same model with
equal options compiles nothing: its steps run the first engine's graphs).
"""

from __future__ import annotations

import contextlib
import logging
import sys
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch
import torch.fx as fx

from . import compat
from .canonical import linear_bmm_to_mm
from .dump import GraphDump, format_summary
from .kernel_table import KernelTable, build_kernel_table
from .options import LingcOptions
from .pass_manager import PassContext, PassManager, PassStats, source_name
from .progress import Progress
from .shape_specialize import ShapeSpecializedGraph, has_symbolic_inputs

log = logging.getLogger("lingc")


@dataclass
class CompileReport:
    role: str
    stats: list[PassStats]
    kernels: KernelTable
    dump_dir: str | None
    input_shapes: list[str]

    def format(self, compact: bool = False) -> str:
        return (format_summary(self.stats, self.role) + "\nkernel table\n"
                + self.kernels.format(compact=compact))


compile_reports: list[CompileReport] = []

# The open graphs_run() window's list, or None.
_ran: list[CompileReport] | None = None


@contextlib.contextmanager
def graphs_run():
    """Collect the CompileReports of the lingc graphs that run inside the window, in call order:
    a freshly compiled graph's and a graph Dynamo reused from its cache alike (``compile_reports``
    only grows on compiles). Empty when nothing ran through lingc (e.g. Dynamo fell back to
    eager). Windows nest; an inner window's reports also reach the outer one."""
    global _ran
    outer, _ran = _ran, []
    try:
        yield _ran
    finally:
        inner, _ran = _ran, outer
        if outer is not None:
            outer.extend(inner)


class _ReportingGraph:
    """What Dynamo calls for a compiled graph: the graph, noting its compile reports into an open
    graphs_run() window (the compiler's list, read at call time)."""

    def __init__(self, fn: Callable, reports: list[CompileReport]):
        self.fn = fn
        self.reports = reports
        if getattr(fn, "_boxed_call", False):        # keep the calling convention Dynamo sees
            self._boxed_call = True

    def __call__(self, *args: Any) -> Any:
        if _ran is not None:
            _ran.extend(self.reports)
        return self.fn(*args)


class RecompileError(RuntimeError):
    """Raised under fail_on_recompile when a graph that already exists is compiled again."""


def _compile_wrapper() -> object | None:
    """The ``torch.compile`` call (torch's backend wrapper object) that is compiling now, found
    on the stack above the backend; None if torch's layout differs (then every wrapper counts
    as one)."""
    frame = sys._getframe(1)
    for _ in range(8):
        frame = frame.f_back
        if frame is None:
            return None
        owner = frame.f_locals.get("self")
        if type(owner).__name__ == "_TorchCompileWrapper":
            return owner
    return None


class _RecompileWatch:
    """A recompile, for lingc, is a second compile of the same frame with the same input shapes
    under the same backend (lingc's contract is one graph per role and shape). A new shape, e.g.
    T=6 after T=1, is a new graph; so is the first compile under a ``torch.compile`` call whose
    options differ from every earlier one's (e.g. a second engine): Dynamo does not reuse the
    earlier graphs for it and reports them as BACKEND_MATCH failures, which are not this compile's
    cause. Calls with equal options share graphs (torch's wrapper equality), so they count as one
    backend. The reasons come from Dynamo's guard-failure record; each cause warns once."""

    def __init__(self) -> None:
        self.seen: set[tuple] = set()
        self.reasons_seen = 0
        self.warned: set[str] = set()
        self.wrappers: list[object] = []     # one per distinct backend, in the order first seen

    def _backend_key(self, wrapper: object | None) -> int:
        """Index of the first wrapper seen that equals ``wrapper`` (torch's equality: same
        backend, options, mode and dynamic), which is when Dynamo reuses one call's graphs for
        another; -1 for none."""
        if wrapper is None:
            return -1
        for i, w in enumerate(self.wrappers):
            try:
                if w is wrapper or w == wrapper:
                    return i
            except Exception:      # options whose == does not give a bool: not the same backend
                continue
        self.wrappers.append(wrapper)
        return len(self.wrappers) - 1

    def check(self, example_inputs: Sequence[Any], opts: LingcOptions, wrapper: object | None = None) -> None:
        frame_id, frame_compile = compat.current_frame_compile_id()
        if frame_compile == 0:           # Dynamo's first compile of this frame (also after a reset)
            self.seen = {sig for sig in self.seen if sig[0] != frame_id}
        reasons = compat.guard_failure_reasons()
        new_reasons, self.reasons_seen = reasons[self.reasons_seen:], len(reasons)
        sig = (frame_id, self._backend_key(wrapper), opts.role, tuple(
            (tuple(x.shape), x.dtype, str(x.device)) if isinstance(x, torch.Tensor) else type(x).__name__
            for x in example_inputs))
        if sig not in self.seen:
            self.seen.add(sig)
            return
        own = [r for r in new_reasons if "BACKEND_MATCH" not in r]   # other calls' graphs: not ours
        cause = "; ".join(own) or "unknown guard failure (run with TORCH_LOGS=recompiles)"
        advice = ("A tensor's value is read as a Python number here (.item(), or indexing with a 0-d "
                  "tensor), so Dynamo specialises on it: keep it a tensor (index_select / gather with a "
                  "1-element index, torch.where)." if ".item()" in cause else
                  "Pass changing values as device tensors, not Python numbers or new objects.")
        msg = (f"lingc: frame {frame_id} (role {opts.role}) is being recompiled for inputs it was "
               f"already compiled for, because: {cause}. {advice}")
        if opts.fail_on_recompile:
            raise RecompileError(msg)
        if cause not in self.warned:
            self.warned.add(cause)
            warnings.warn(msg, stacklevel=2)


_watch = _RecompileWatch()


class GraphCompiler:
    """The AOT forward compiler for one Dynamo graph: passes, dumps, then Inductor or ATen."""

    def __init__(self, opts: LingcOptions, real_inputs: list[Any], input_names: list[str] | None = None):
        self.opts = opts
        self.real_inputs = real_inputs
        self.input_names = input_names    # the user's names of the inputs (pass notes)
        self.reports: list[CompileReport] = []      # this graph's (one per forward compiled)

    def __call__(self, gm: fx.GraphModule, example_inputs: Sequence[Any]) -> Callable:
        placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
        real = self.real_inputs if len(self.real_inputs) == len(placeholders) else None
        if real is None and self.opts.verify:
            warnings.warn("lingc verify: the AOT graph's inputs do not map one to one onto Dynamo's "
                          "(aliased inputs?); verification is skipped for this graph")
        names = self.input_names if real is not None and self.input_names is not None else None
        ctx = PassContext(self.opts, real, names)
        dump = GraphDump(self.opts.dump_dir, self.opts.role) if self.opts.dump_dir else None
        if dump is not None:
            dump.graph("00-captured", gm)
        linear_bmm_to_mm(gm.graph)
        manager = PassManager(ctx)
        bar = Progress(len(manager.pass_types) + int(self.opts.inductor), f"lingc compile ({self.opts.role})")
        stats = manager.run(gm, dump, progress=bar)
        if dump is not None:
            dump.graph("99-final", gm)
        source = None
        if self.opts.inductor:
            compiled = compat.inductor_compile(gm, example_inputs)
            source = getattr(compiled, "source_code", None)
            bar.update()
        else:
            from functorch.compile import make_boxed_func
            compiled = make_boxed_func(gm.forward)
        bar.close()
        table = build_kernel_table(gm, self.opts.inductor, source)
        shapes = [str(list(x.shape)) for x in example_inputs if isinstance(x, torch.Tensor)][:4]
        report = CompileReport(self.opts.role, stats, table, str(dump.dir) if dump else None, shapes)
        compile_reports.append(report)
        self.reports.append(report)
        if dump is not None:
            dump.summary(stats, table, {"inductor": self.opts.inductor})
        log.info("lingc compiled a %s graph:\n%s", self.opts.role, report.format())
        if self.opts.print_summary:
            sys.stderr.write(report.format())
        return compiled


def lingc_backend(gm: fx.GraphModule, example_inputs: list[Any],
                  options: dict[str, Any] | None = None, **unused: Any) -> Callable:
    """Dynamo backend entry point (see the module docstring)."""
    if unused:
        raise ValueError(f"lingc: unexpected backend arguments {sorted(unused)}; pass settings "
                         f"as options={{...}}")
    opts = LingcOptions.from_user(options)
    if torch.is_grad_enabled() and any(isinstance(x, torch.Tensor) and x.requires_grad
                                       for x in example_inputs):
        raise ValueError("lingc compiles inference graphs only: an input requires grad. Call the "
                         "model under torch.no_grad() or model.requires_grad_(False)")
    _watch.check(example_inputs, opts, _compile_wrapper())
    if has_symbolic_inputs(gm, example_inputs):
        return ShapeSpecializedGraph(gm, lambda g, inputs: _compile_static(g, inputs, opts), opts.role)
    return _compile_static(gm, example_inputs, opts)


def _compile_static(gm: fx.GraphModule, example_inputs: Sequence[Any], opts: LingcOptions) -> Callable:
    names = [source_name(n.name) for n in gm.graph.nodes if n.op == "placeholder"]
    compiler = GraphCompiler(opts, list(example_inputs), names if len(names) == len(example_inputs) else None)
    capture = (compat.functionalize_inference_backend if opts.capture == "functionalize"
               else compat.aot_inference_backend)
    return _ReportingGraph(capture(compiler, compat.decomposition_table())(gm, example_inputs), compiler.reports)
