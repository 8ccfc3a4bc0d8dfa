"""The pass manager: lingc's passes in their fixed order, each switchable, timed and counted.

A pass is a small class (subclass of `LingcPass`) with a `name`, the roles it runs in, a declared
numeric tolerance, and a docstring that says what pattern it rewrites into what. Calling a pass on
a graph module returns its `PassStats` (matches, ops before and after, time). The manager runs
them in design.md's order, then a fixed cleanup tail (dead-code elimination and lint), writes the
dumps, and in verify mode runs the graph before and after each pass on clones of the real example
inputs (caches and state are mutated by the graph: the live ones are never touched) and raises if
a pass moves the outputs or the mutated state by more than its tolerance.
"""

from __future__ import annotations

import abc
import copy
import itertools
import time
from dataclasses import dataclass, field
from typing import Any, Sequence

import torch
import torch.fx as fx

from .compat import real_tensor_mode
from .graph_build import eliminate_dead_code
from .graph_text import count_ops
from .options import ROLES, LingcOptions

VIEW_OPS = {torch.ops.aten.view.default, torch.ops.aten.reshape.default,
            torch.ops.aten._unsafe_view.default, torch.ops.aten.select.int,
            torch.ops.aten.slice.Tensor, torch.ops.aten.as_strided.default,
            torch.ops.aten.unsqueeze.default, torch.ops.aten.squeeze.dim,
            torch.ops.aten.permute.default, torch.ops.aten.t.default,
            torch.ops.aten.transpose.int, torch.ops.aten.expand.default}


@dataclass
class PassContext:
    """What a pass may need beyond the graph: options, role and the real example inputs.

    `real_inputs[i]` is the live tensor behind the graph's i-th placeholder (parameters, caches),
    or None when the graph was compiled without them (tests of a bare graph).
    """
    options: LingcOptions
    real_inputs: Sequence[Any] | None = None
    # What the user called the i-th input (Dynamo's source of it, `source_name`), for notes.
    input_names: Sequence[str] | None = None

    @property
    def role(self) -> str:
        return self.options.role

    def describe(self, node: fx.Node) -> str:
        """A placeholder's graph name with the user's name for it: ``arg6_1 (cache_conv_0)``."""
        if self.input_names is None or node.op != "placeholder":
            return node.name
        # The captured graph's placeholders lead it: no walk over its (tens of thousands of) nodes.
        placeholders = list(itertools.takewhile(lambda n: n.op == "placeholder", node.graph.nodes))
        if node not in placeholders or len(placeholders) != len(self.input_names):
            return node.name                               # not the graph the names were taken for
        return f"{node.name} ({self.input_names[placeholders.index(node)]})"

    def real_input(self, gm: fx.GraphModule, node: fx.Node) -> Any:
        if self.real_inputs is None:
            return None
        placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
        return self.real_inputs[placeholders.index(node)]


def source_name(dynamo_placeholder: str) -> str:
    """Dynamo's placeholder name as the attribute path it reads:
    ``l_self_modules_model_modules_layers_modules_0_parameters_a_log_`` -> ``model.layers.0.a_log``,
    ``l_cache_conv_0_`` -> ``cache_conv_0``."""
    name = dynamo_placeholder.removeprefix("l_").removeprefix("L_").rstrip("_")
    for part in ("_modules_", "_parameters_", "_buffers_"):
        name = name.replace(part, ".")
    return name.removeprefix("self.")


@dataclass
class PassStats:
    name: str
    matches: int = 0
    ops_before: int = 0
    ops_after: int = 0
    time_ms: float = 0.0
    skipped: str | None = None
    max_abs_err: float | None = None
    max_rel_err: float | None = None
    notes: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


class LingcPass(abc.ABC):
    """Base class. Subclasses set `name` and implement `apply(gm) -> number of matches`."""

    name: str = ""
    roles: tuple[str, ...] = ROLES
    # (atol, rtol): the verify mode's bound on |after - before| relative to max |before|.
    tolerance: tuple[float, float] = (1e-5, 1e-5)

    def __init__(self, ctx: PassContext):
        self.ctx = ctx
        self.notes: list[str] = []

    @abc.abstractmethod
    def apply(self, gm: fx.GraphModule) -> int:
        """Rewrite gm in place; return the number of matches rewritten."""

    def __call__(self, gm: fx.GraphModule) -> PassStats:
        before = count_ops(gm)
        t0 = time.perf_counter()
        matches = self.apply(gm)
        eliminate_dead_code(gm.graph)
        gm.graph.lint()                  # a broken graph is blamed on the pass that broke it
        if self.ctx.options.verify:      # verify runs the module next; else the cleanup recompiles
            gm.recompile()
        return PassStats(self.name, matches, before, count_ops(gm),
                         (time.perf_counter() - t0) * 1e3, notes=list(self.notes))


def registered_passes() -> list[type[LingcPass]]:
    """Every lingc pass, in design.md's order (stage_commit, metadata_capture, fused_moe,
    swiglu_epilogue, fuse_projections, pdl_swap), then symm_allreduce (tensor parallel only)."""
    from .passes.fuse_projections import FuseProjections
    from .passes.fused_moe import FusedMoE
    from .passes.metadata_capture import MetadataCapture
    from .passes.pdl_swap import PdlSwap
    from .passes.stage_commit import StageCommit
    from .passes.swiglu_epilogue import SwiGLUEpilogue
    from .passes.symm_allreduce import SymmAllReduce

    return [StageCommit, MetadataCapture, FusedMoE, SwiGLUEpilogue, FuseProjections, PdlSwap,
            SymmAllReduce]


def pass_names() -> list[str]:
    return [p.name for p in registered_passes()]


def disabled_passes(options: LingcOptions) -> set[str]:
    names = set(pass_names())
    wanted = set(options.disable_passes)
    if "all" in wanted:
        return names
    unknown = sorted(wanted - names)
    if unknown:
        raise ValueError(f"lingc: disable_passes names unknown pass(es) {unknown}; "
                         f"passes are {sorted(names)} (or 'all')")
    return wanted


def lower_emitted_composites(graph: fx.Graph) -> int:
    """Passes may emit ops that the capture's decomposition table would have removed (aten.stack,
    which stage_commit emits for its staged states, and later passes match on). Inductor refuses
    such ops ("both a fallback and a decomp"), so the cleanup tail lowers them the way the table
    does: stack(xs, d) -> cat([unsqueeze(x, d) ...], d)."""
    from .graph_build import emit
    n = 0
    for node in list(graph.nodes):
        if node.op == "call_function" and node.target is torch.ops.aten.stack.default:
            xs, dim = node.args[0], (node.args[1] if len(node.args) > 1 else 0)
            with graph.inserting_before(node):
                cat = emit(graph, torch.ops.aten.cat.default,
                           [emit(graph, torch.ops.aten.unsqueeze.default, x, dim) for x in xs], dim)
            node.replace_all_uses_with(cat)
            graph.erase_node(node)
            n += 1
    return n


def write_counts(graph: fx.Graph) -> dict[fx.Node, int]:
    """For each node whose storage some op writes in place, directly or through any chain of
    views (the arguments op schemas mark as written, followed back through the views): how many
    written arguments reach it."""
    out: dict[fx.Node, int] = {}
    for n in graph.nodes:
        if n.op != "call_function" or not isinstance(n.target, torch._ops.OpOverload):
            continue
        for i, spec in enumerate(n.target._schema.arguments):
            if spec.alias_info is None or not spec.alias_info.is_write:
                continue
            arg = n.args[i] if i < len(n.args) else n.kwargs.get(spec.name)
            for base in (arg if isinstance(arg, (list, tuple)) else [arg]):
                if not isinstance(base, fx.Node):
                    continue
                while base.op == "call_function" and base.target in VIEW_OPS:
                    base = base.args[0]
                out[base] = out.get(base, 0) + 1
    return out


def written_bases(graph: fx.Graph) -> set[fx.Node]:
    """The nodes whose storage some op writes in place (``write_counts``' keys)."""
    return set(write_counts(graph))


def mutated_placeholders(gm: fx.GraphModule) -> set[int]:
    """Indices of placeholders written by the graph (through any chain of views)."""
    written = written_bases(gm.graph)
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    return {i for i, n in enumerate(placeholders) if n in written}


def run_on_clones(gm: fx.GraphModule, inputs: Sequence[Any]) -> list[torch.Tensor]:
    """Run gm on inputs whose mutated entries are cloned; return outputs + the mutated inputs."""
    mutated = sorted(mutated_placeholders(gm))
    with real_tensor_mode(), torch.no_grad():
        args = [x.clone() if i in mutated and isinstance(x, torch.Tensor) else x
                for i, x in enumerate(inputs)]
        outs = gm(*args)
    outs = list(outs) if isinstance(outs, (list, tuple)) else [outs]
    return [o for o in outs if isinstance(o, torch.Tensor)] + [args[i] for i in mutated]


def compare(before: list[torch.Tensor], after: list[torch.Tensor]) -> tuple[float, float]:
    with real_tensor_mode():
        return _compare(before, after)


def _compare(before: list[torch.Tensor], after: list[torch.Tensor]) -> tuple[float, float]:
    if len(before) != len(after):
        raise AssertionError(f"pass changed the number of graph results: {len(before)} -> {len(after)}")
    max_abs = max_rel = 0.0
    for b, a in zip(before, after):
        if b.shape != a.shape:
            raise AssertionError(f"pass changed a result's shape: {list(b.shape)} -> {list(a.shape)}")
        if not b.is_floating_point():
            if not torch.equal(a, b):
                return float("inf"), float("inf")
            continue
        d = (a.double() - b.double()).abs().max().item() if b.numel() else 0.0
        scale = b.double().abs().max().item() if b.numel() else 0.0
        max_abs = max(max_abs, d)
        max_rel = max(max_rel, d / scale if scale > 0 else d)
    return max_abs, max_rel


class PassManager:
    def __init__(self, ctx: PassContext, passes: list[type[LingcPass]] | None = None):
        self.ctx = ctx
        self.pass_types = registered_passes() if passes is None else passes
        self.off = disabled_passes(ctx.options) if passes is None else set(ctx.options.disable_passes)

    def run(self, gm: fx.GraphModule, dump=None, progress=None) -> list[PassStats]:
        """Run every pass in order, then the cleanup tail; `progress` (a lingc.progress.Progress)
        advances by one per pass."""
        stats: list[PassStats] = []
        verify = self.ctx.options.verify and self.ctx.real_inputs is not None
        for i, cls in enumerate(self.pass_types, start=1):
            p = cls(self.ctx)
            skipped = ("disabled" if p.name in self.off else
                       f"not for role {self.ctx.role}" if self.ctx.role not in p.roles else None)
            if skipped:
                stats.append(PassStats(p.name, skipped=skipped))
                if progress is not None:
                    progress.update()
                continue
            if dump is not None:
                dump.graph(f"{i:02d}-{p.name}.before", gm)
            reference = run_on_clones(copy.deepcopy(gm), self.ctx.real_inputs) if verify else None
            st = p(gm)
            if verify:
                st.max_abs_err, st.max_rel_err = compare(reference, run_on_clones(gm, self.ctx.real_inputs))
                atol, rtol = p.tolerance
                if st.max_abs_err > atol and st.max_rel_err > rtol:
                    raise AssertionError(
                        f"lingc verify: pass {p.name} changed the graph's results by "
                        f"max abs {st.max_abs_err:.3g} / rel {st.max_rel_err:.3g}, over its declared "
                        f"tolerance (atol {atol:g}, rtol {rtol:g}); disable it with "
                        f"LINGC_DISABLE_PASSES={p.name} and report the dump")
            if dump is not None:
                dump.graph(f"{i:02d}-{p.name}.after", gm)
            stats.append(st)
            if progress is not None:
                progress.update()
        before = count_ops(gm)
        t0 = time.perf_counter()
        lower_emitted_composites(gm.graph)
        eliminate_dead_code(gm.graph)
        gm.graph.lint()
        gm.recompile()
        stats.append(PassStats("cleanup", 0, before, count_ops(gm), (time.perf_counter() - t0) * 1e3))
        return stats

