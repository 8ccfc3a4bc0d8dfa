"""swiglu_epilogue: a SwiGLU MLP's two projections and activation become one GEMM with the
activation in its epilogue.

    before:  g = x @ Wg.T ;  u = x @ Wu.T ;  h = silu(g) * u            (3 kernels, h's inputs
             (clamped: h = min(silu(g), L) * clamp(u, -L, L))            round-trip through memory)
    after:   h = lingc.swiglu_gemm_separate(x, Wg, Wu, L)                 (1 kernel)

Matched on the ATen graph, whatever the spelling: F.linear or matmul on [1, T, H], silu as
F.silu, x * sigmoid(x) or x / (1 + exp(-x)), `.float()` around the activation, commuted
multiplies, a fused gate_up projection split by chunk/split/slicing (the pass then passes row
views of the fused weight). Dense layers and the shared expert match here; routed experts belong
to fused_moe.

Weights: the kernel reads the gate and up rows through two pointers with their own row strides,
so nothing is re-laid or copied: the parameters stay exactly as loaded (no second copy, no stride
change that would trip Dynamo's guards). For a hand-written kernel whose CTAs each own a block of
output columns this is what row interleaving buys a library GEMM: gate and up of one output column
are read by the same CTA.

Numerics (declared): the kernel keeps the gate and up accumulators in fp32 through the activation
and rounds once; the unfused bf16 path rounds g and u to bf16 first. Not bit-equal in bf16;
equal to rounding in fp32.
"""

from __future__ import annotations

import torch
import torch.fx as fx

from lingc.graph_build import emit
from lingc.graph_match import aten, clamp_bounds, is_call, match_linear, silu_input, strip, unsupported_dtype
from lingc.pass_manager import LingcPass
from lingc.runtime.kernels.swiglu_gemm.op import DTYPES as SWIGLU_DTYPES


def _limit(lo_a, hi_a, lo_u, hi_u) -> float | None:
    """The clamp limit L when both sides carry the SwiGLU clamp, 0.0 when neither does."""
    if lo_a is None and hi_a is None and lo_u is None and hi_u is None:
        return 0.0
    if lo_a is None and hi_a is not None and hi_a > 0 and lo_u == -hi_a and hi_u == hi_a:
        return hi_a
    return None


class SwiGLUEpilogue(LingcPass):
    name = "swiglu_epilogue"
    tolerance = (1e-4, 2e-2)

    def apply(self, gm: fx.GraphModule) -> int:
        import lingc.runtime.kernels.swiglu_gemm  # noqa: F401  (registers the lingc::swiglu_gemm ops)

        matches, self.left = 0, {}
        for n in list(gm.graph.nodes):
            if is_call(n, aten.mul.Tensor) and all(isinstance(a, fx.Node) for a in n.args[:2]):
                matches += self._try(gm.graph, n)
        self.notes += [f"{k} SwiGLU MLP(s) left unfused: {why}" for why, k in self.left.items()]
        return matches

    def _try(self, graph: fx.Graph, mul: fx.Node) -> int:
        a, b = mul.args[:2]
        for act, up in ((a, b), (b, a)):
            inner_a, lo_a, hi_a = clamp_bounds(strip(act))
            g = silu_input(inner_a)
            if g is None:
                continue
            inner_u, lo_u, hi_u = clamp_bounds(strip(up))
            limit = _limit(lo_a, hi_a, lo_u, hi_u)
            gate, upm = match_linear(g), match_linear(inner_u)
            if limit is None or gate is None or upm is None or strip(gate.x) is not strip(upm.x):
                continue
            x = gate.x
            xv, mv = x.meta.get("val"), mul.meta.get("val")
            wg, wu = gate.weight.meta.get("val"), upm.weight.meta.get("val")
            if xv is None or mv is None or xv.dim() != 2 or wg.dtype != xv.dtype or wu.dtype != xv.dtype:
                continue
            if why := unsupported_dtype("swiglu_gemm_separate", xv.dtype, SWIGLU_DTYPES):
                self.left[why] = self.left.get(why, 0) + 1
                return 0
            n_out = (gate.rows[1] - gate.rows[0]) if gate.rows else wg.shape[0]
            n_up = (upm.rows[1] - upm.rows[0]) if upm.rows else wu.shape[0]
            if n_out != n_up or mv.numel() != xv.shape[0] * n_out:
                continue
            with graph.inserting_before(mul):
                w_gate = self._rows(graph, gate)
                w_up = self._rows(graph, upm)
                out = emit(graph, torch.ops.lingc.swiglu_gemm_separate.default, x, w_gate, w_up, float(limit))
                if mv.dtype != xv.dtype:
                    out = emit(graph, torch.ops.prims.convert_element_type.default, out, mv.dtype)
                if list(mv.shape) != [xv.shape[0], n_out]:
                    out = emit(graph, aten.view.default, out, list(mv.shape))
            mul.replace_all_uses_with(out)
            graph.erase_node(mul)
            return 1
        return 0

    @staticmethod
    def _rows(graph: fx.Graph, m) -> fx.Node:
        if m.rows is None:
            return m.weight
        return emit(graph, aten.slice.Tensor, m.weight, 0, m.rows[0], m.rows[1])
