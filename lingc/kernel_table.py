"""The kernel table: what each op of a compiled graph runs as.

Categories:
- `lingc`       a lingc custom op (`torch.ops.lingc.*`): a hand-written Triton kernel on CUDA
                (PDL-launched on sm_90), its PyTorch reference on the CPU.
- `library GEMM` a matmul left to cuBLAS (CUDA) or the CPU BLAS: mm, addmm, bmm, baddbmm.
- `inductor`    everything else when Inductor compiles the leftovers; the generated kernels are
                listed by name from Inductor's output code.
- `aten`        everything else with `inductor=False`: one ATen call per op.
- `collective`  a tensor-parallel collective (`_c10d_functional.all_reduce`/`all_gather_*`): one
                NCCL kernel, captured into the CUDA graph with the rest; its `wait_tensor` is glue.
Views, getitem, in-place epilogue copies and uninitialised allocations (`empty`, `new_empty`: the
caching allocator, no kernel; the verify graph's staging buffers) are listed as `glue` (no kernel
of their own, or a copy Inductor folds into the producer). A reshape whose input, with the strides
its producer really lays out, is no view of the new shape copies at run time: it is listed as
`aten.reshape (a copy)` under `aten` / `inductor` (a kernel), not as glue.
"""

from __future__ import annotations

import contextlib
import re
from collections import Counter
from dataclasses import dataclass, field

import torch
import torch.fx as fx

from .graph_text import target_name, val_text
from .pass_manager import VIEW_OPS

GEMM_OPS = {torch.ops.aten.mm.default, torch.ops.aten.addmm.default, torch.ops.aten.bmm.default,
            torch.ops.aten.baddbmm.default}
# Allocations without a fill: memory from the caching allocator (or a planned buffer under
# Inductor), never a kernel launch, so never a break in a PDL chain.
ALLOC_OPS = {torch.ops.aten.empty.memory_format, torch.ops.aten.new_empty.default,
             torch.ops.aten.empty_like.default, torch.ops.aten.empty_strided.default,
             torch.ops.aten.new_empty_strided.default}

# Ops that return views of their input (a list of them): no kernel, like VIEW_OPS.
SPLIT_OPS = {torch.ops.aten.split_with_sizes.default, torch.ops.aten.split.Tensor, torch.ops.aten.unbind.int,
             torch.ops.aten.chunk.default}
# A complex tensor seen as real pairs (or back): a view with another dtype, no kernel (a model's
# complex RoPE table handed to a lingc kernel).
DTYPE_VIEW_OPS = {torch.ops.aten.view_as_real.default, torch.ops.aten.view_as_complex.default}


@dataclass
class KernelTable:
    rows: list[tuple[str, str, int, str]] = field(default_factory=list)  # (category, op, count, shapes)
    # Why ops are left as library GEMMs: reason -> count (from the passes' node.meta["lingc_why"]).
    why: dict[str, int] = field(default_factory=dict)
    inductor_kernels: list[str] = field(default_factory=list)

    def counts(self) -> Counter:
        c: Counter = Counter()
        for cat, _, n, _ in self.rows:
            c[cat] += n
        return c

    def as_dict(self) -> dict:
        return {"rows": [dict(category=c, op=o, count=n, example_shape=s) for c, o, n, s in self.rows],
                "inductor_kernels": self.inductor_kernels, "counts": dict(self.counts()),
                "library_gemm_why": self.why}

    def format(self, compact: bool = False) -> str:
        """The table; compact keeps only the lingc and library-GEMM rows (the totals say the rest)."""
        lines = [f"{'runs as':<13} {'op':<34} {'count':>5}  example output",
                 f"{'-' * 13} {'-' * 34} {'-' * 5}  {'-' * 20}"]
        for cat, op, n, shape in self.rows:
            if compact and cat not in ("lingc", "library GEMM", "collective"):
                continue
            lines.append(f"{cat:<13} {op:<34} {n:>5}  {shape}")
        for reason, n in sorted(self.why.items()):
            lines.append(f"  library GEMM left x{n}: {reason}")
        totals = ", ".join(f"{k} {v}" for k, v in sorted(self.counts().items()))
        lines.append(f"totals: {totals}")
        if self.inductor_kernels:
            lines.append(f"Inductor kernels ({len(self.inductor_kernels)}): "
                         + ", ".join(self.inductor_kernels))
        return "\n".join(lines) + "\n"


def classify(node: fx.Node, inductor: bool) -> str:
    t = node.target
    if isinstance(t, torch._ops.OpOverload) and t.namespace == "lingc":
        return "lingc"
    if t in GEMM_OPS:
        return "library GEMM"
    if isinstance(t, torch._ops.OpOverload) and t.namespace == "_c10d_functional":
        return "glue" if t is torch.ops._c10d_functional.wait_tensor.default else "collective"
    if (t in VIEW_OPS or t in SPLIT_OPS or t in ALLOC_OPS or t in DTYPE_VIEW_OPS or t is torch.ops.aten.copy_.default
            or getattr(t, "__name__", "") == "getitem"):
        return "glue"
    return "inductor" if inductor else "aten"


def copying_reshapes(gm: fx.GraphModule) -> set[fx.Node]:
    """The reshapes that copy at run time: their input, with the strides its producer really lays
    out (the view chain's values recomputed from its root: a pass that replaced the producer
    leaves them as traced: those values are refreshed in the graph), is no view of the new shape.
    Only ``aten.reshape`` copies; ``view`` and ``_unsafe_view`` never do."""
    from .graph_build import refresh_vals

    copies = set()
    for n in gm.graph.nodes:
        if n.op != "call_function" or n.target is not torch.ops.aten.reshape.default or not isinstance(n.args[0], fx.Node):
            continue
        chain, x = [], n.args[0]
        while x.op == "call_function" and x.target in VIEW_OPS:
            chain.append(x)
            x = x.args[0]
        refresh_vals(chain[::-1])
        v = n.args[0].meta.get("val")
        if not isinstance(v, torch.Tensor):
            continue
        try:
            with v.fake_mode if hasattr(v, "fake_mode") else contextlib.nullcontext():
                v.view(n.args[1])
        except (RuntimeError, ValueError):    # (fake mode raises the latter)
            copies.add(n)
    return copies


def build_kernel_table(gm: fx.GraphModule, inductor: bool, inductor_source: str | None = None) -> KernelTable:
    groups: dict[tuple[str, str], list[fx.Node]] = {}
    copies = copying_reshapes(gm)
    for n in gm.graph.nodes:
        if n.op == "call_function":
            if n in copies:        # a copy kernel, not a view
                groups.setdefault(("inductor" if inductor else "aten", "aten.reshape (a copy)"), []).append(n)
                continue
            groups.setdefault((classify(n, inductor), target_name(n.target)), []).append(n)
    order = {"lingc": 0, "library GEMM": 1, "collective": 2, "inductor": 3, "aten": 3, "glue": 4}
    rows = sorted(((c, op, len(ns), val_text(ns[0].meta.get("val"))) for (c, op), ns in groups.items()),
                  key=lambda r: (order[r[0]], -r[2], r[1]))
    why: dict[str, int] = {}
    for n in gm.graph.nodes:
        if n.op == "call_function" and n.target in GEMM_OPS:
            reason = n.meta.get("lingc_why", "no lingc pass matched it")
            why[reason] = why.get(reason, 0) + 1
    return KernelTable(rows=rows, why=why,
                       inductor_kernels=inductor_kernel_names(inductor_source) if inductor_source else [])


_KERNEL_DEF = re.compile(r"^(\w+) = async_compile\.(?:triton|cpp_pybinding|cpp)\(", re.M)


def inductor_kernel_names(source: str) -> list[str]:
    """Names of the kernels Inductor generated (triton_* on CUDA, cpp_fused_* on the CPU)."""
    return _KERNEL_DEF.findall(source)
