"""fold_norms: an RMSNorm whose only consumer is a lingc GEMM becomes that GEMM's prologue.

    before:  y, h = lingc.rmsnorm(x, w, residual, eps)          (2 kernels, a PDL edge between
             out  = lingc.gemm(views(y), weights)                 them, y round-trips through L2)
    after:   out, h = lingc.rmsnorm_gemm(x, w, residual, eps, weights)      (1 kernel)

In a Ling-3 decode step this is every layer's input norm in front of its fused attention
projection (KDA q/k/v/f/g/b, MLA q/kv_a/g) where the GEMM's config leaves registers for the
prologue (gemm/config.norm_prologue_fits: at flash-tp4-rank the 35 KDA layers, not the 7 MLA
ones): launches of the 494 in the decode graph, each worth a kernel's fixed cost in the chain
(benchmarks/results/README.md). Every GEMM
CTA recomputes the norm of the rows it multiplies (a few KB per row, read from L2), so the fold is
only made for chains of at most 16 rows (one BLOCK_M tile: decode, draft, verify and extend); a
prefill-sized GEMM would repeat the norm in every column block.

Conditions: the GEMM's config fits the prologue; y (through views that keep its [T, D] shape) feeds exactly one lingc.gemm as x, with
no bias, residual or sigmoid_mul epilogue; every user of the new residual h comes after the GEMM
in the graph (the fused op is placed at the GEMM). The ops' argument checks decide the rest.

Numerics: on the CPU the fused op is the composition of the two references, bit for bit. On the
GPU the row's sum of squares runs in fixed 256-column chunks instead of the norm kernel's one
tile, so y can differ by an ulp of x.dtype from the unfused graph; a row's bits still do not
depend on how many rows run with it (batch invariance).
"""

from __future__ import annotations

import operator

import torch
import torch.fx as fx

from lingc.graph_build import emit
from lingc.graph_match import is_call
from lingc.graph_region import shape
from lingc.pass_manager import VIEW_OPS, LingcPass
from lingc.runtime.kernels.gemm.config import norm_prologue_fits

__all__ = ["FoldNorms", "MAX_ROWS"]

# The most rows the fold is made for: one BLOCK_M tile of the GEMM (runtime/kernels/gemm_common).
MAX_ROWS = 16


def _getitem(n: fx.Node, i: int) -> fx.Node | None:
    users = [u for u in n.users if u.op == "call_function" and u.target is operator.getitem and u.args[1] == i]
    return users[0] if len(users) == 1 else None


def _gemm_of(y: fx.Node) -> fx.Node | None:
    """The lingc.gemm that consumes y as its x, through single-user views keeping y's shape."""
    n = y
    while len(n.users) == 1:
        (u,) = n.users
        if is_call(u, torch.ops.lingc.gemm.default):
            ok = u.args[0] is n and shape(n) == shape(y) and not u.kwargs and all(a is None for a in u.args[2:])
            return u if ok else None
        if not is_call(u, *VIEW_OPS) or u.args[0] is not n:
            return None
        n = u
    return None


class FoldNorms(LingcPass):
    name = "fold_norms"
    tolerance = (1e-4, 2e-2)

    def apply(self, gm: fx.GraphModule) -> int:
        import lingc.runtime.kernels.gemm  # noqa: F401  (registers lingc::rmsnorm_gemm)
        import lingc.runtime.kernels.norms  # noqa: F401

        g = gm.graph
        order = {n: i for i, n in enumerate(g.nodes)}
        folded, left = 0, []
        for n in list(g.nodes):
            if not is_call(n, torch.ops.lingc.rmsnorm.default):
                continue
            y = _getitem(n, 0)
            gemm = _gemm_of(y) if y is not None else None
            if gemm is None:
                continue
            if shape(y)[0] > MAX_ROWS:
                left.append(f"{n.name}: {shape(y)[0]} rows > {MAX_ROWS}")
                continue
            k = shape(y)[1]
            n_out = sum(shape(w)[0] for w in gemm.args[1])
            if not norm_prologue_fits(n_out, k):
                left.append(f"{n.name}: the {n_out} x {k} GEMM's weight tile leaves no registers for the norm")
                continue
            h = _getitem(n, 1)
            if h is not None and any(order[u] < order[gemm] for u in h.users):
                left.append(f"{n.name}: its residual is read before {gemm.name}")
                continue
            x, w, residual, eps = n.args[:4]
            with g.inserting_before(gemm):
                try:
                    fused = emit(g, torch.ops.lingc.rmsnorm_gemm.default, x, w, residual, eps, gemm.args[1])
                except ValueError as e:          # the op's argument check refused it
                    left.append(f"{n.name}: {e}")
                    continue
                out = emit(g, operator.getitem, fused, 0)
                new_h = emit(g, operator.getitem, fused, 1) if h is not None else None
            gemm.replace_all_uses_with(out)
            g.erase_node(gemm)
            if h is not None:
                h.replace_all_uses_with(new_h)
            folded += 1
        g.eliminate_dead_code()
        if folded or left:
            self.notes.append(f"{folded} rmsnorm -> gemm folded" + (f"; left: {'; '.join(left)}" if left else ""))
        return folded
