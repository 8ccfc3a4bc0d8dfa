"""pdl_swap: the norms, the KDA chain and the MLA decode core become lingc's PDL-launched kernels;
the dump reports PDL coverage and each layer's chain of lingc ops.

    before:  h = r + x ; y = (h * rsqrt(mean(h^2) + eps) * w)          (5-7 ATen ops, fp32 casts)
    after:   y, h = lingc.rmsnorm(x, w, r, eps)                           (1 kernel, residual fused)
    the Llama form of a 16-bit model, w * (h.float() * rsqrt(..)).to(h.dtype), rounded twice:
             y, h = lingc.rmsnorm(x, w, r, eps, round_before_weight=True)
    a zero-centred weight (Gemma, Qwen3-Next), (h.float() * rsqrt(..) * (1.0 + w.float())).to(h.dtype):
             y, h = lingc.rmsnorm(x, w, r, eps, zero_centered=True)
    no weight after the core: y, h = lingc.rmsnorm(x, None, r, eps)

    before:  rmsnorm_per_head(o) * w * sigmoid(g)        after: lingc.gated_head_rmsnorm(o, g, w, eps)
    in a 16-bit model (nn.RMSNorm of o.to(bf16), then * sigmoid(g) in bf16: 4 ATen kernels besides
    the norm's): lingc.gated_head_rmsnorm(o, g, w, eps, bf16, round_steps=True), rounded as eager

    KDA's core (conv windows, gate, delta rule, state write-back) -> lingc.kda_chain, the verify
    graph's staged commits -> lingc.kda_commit_many: pdl_swap_kda.py.
    MLA's attention core -> lingc.mla_decode, its cache write -> lingc.mla_kv_write: pdl_swap_mla.py
    (the textbook form, keys and values expanded from the cache, through mla_absorb.py).
    Softmax attention over per-head caches -> lingc.gqa_decode: pdl_swap_gqa.py; their row writes
    -> lingc.head_cache_write, the keys' and queries' RoPE into those two and an output gate into
    gqa_decode: pdl_swap_gqa_rope.py.

How matches are found (computations, not names): norms are matched op by op, x * rsqrt(mean(x^2)
+ eps) * w in its spellings (pow or x*x, mean or sum / D, commuted multiplies, fp32 upcast of x
and w with the downcast after), the add that produced x when it is a [T, D] residual add, and a
following sigmoid gate for the per-head form. The ops' CPU references run the model's exact op
sequence, so the model's path is bit-identical. KDA and MLA are matched by region: the core is cut
out of the graph between its state or cache and its projections, run on random inputs and
compared with the kernel's reference under every candidate assignment of roles (lingc/
graph_region.py); only an assignment that reproduces the region (rel. error 1e-4 in fp32) is
rewritten, and a region that none reproduces is left alone with a note.

The glue between the kernels (the absorbed MLA products, copies of fresh values, casts after a
lingc op) is pdl_glue.py's, with the reasons each rewrite is exact; a norm's folds into the lingc
op beside it (router, latent cache write, embedding gather, norm pair) are pdl_norm_folds.py's. The relay step's bookkeeping
after the last kernel (row pick, n and x advance, token ring append) is relay_tail.py's.
"""

from __future__ import annotations

import operator

import torch
import torch.fx as fx

from lingc.graph_build import eliminate_dead_code, emit
from lingc.graph_match import CASTS, aten, is_call, scalar, silu_input
from lingc.graph_region import is_heavy, numel, region, shape, val, view_base
from lingc.graph_text import target_name
from lingc.kernel_table import classify
from lingc.pass_manager import LingcPass

from . import pdl_glue, pdl_norm_folds
from .pdl_swap_common import param_operand, unit_lead
from .pdl_swap_gqa import GqaCores
from .pdl_swap_gqa_rope import GqaRope
from .pdl_swap_kda import KdaCores
from .pdl_swap_mla import MlaCores
from .relay_tail import relay_tail

lingc_ops = torch.ops.lingc








class PdlSwap(KdaCores, MlaCores, GqaCores, GqaRope, LingcPass):
    name = "pdl_swap"
    tolerance = (1e-4, 1e-4)
    reuse_probes = True          # off: every layer's region is probed (tests compare the two)
    fold_relay_tail = True       # off: the relay steps' tail copies stay ATen ops (tests count the two)
    fold_embedding = True        # off: the token embedding gather stays an ATen op (tests that want a leftover)
    fold_concat = True           # off: two-input last-dim concatenations stay ATen cats
    fold_router_norm = True      # off: the MoE block's input norm stays a lingc.rmsnorm launch
    fold_kv_norm = True          # off: MLA's kv_a_layernorm stays a lingc.rmsnorm launch
    fold_head_norm = True        # off: per-head q / k norms stay lingc.rmsnorm launches
    fold_positions = True        # off: the relay's chain positions stay n + arange(T) ATen kernels

    def apply(self, gm: fx.GraphModule) -> int:
        import lingc.runtime.kernels.gqa_decode  # noqa: F401
        import lingc.runtime.kernels.head_cache_write  # noqa: F401
        import lingc.runtime.kernels.head_matmul  # noqa: F401
        import lingc.runtime.kernels.kda  # noqa: F401  (registers lingc::kda_chain, kda_commit(_many))
        import lingc.runtime.kernels.mla_decode  # noqa: F401
        import lingc.runtime.kernels.mla_kv_write  # noqa: F401
        import lingc.runtime.kernels.norms  # noqa: F401

        g = gm.graph
        self.gates_folded = self.absorbed = self.per_head_gates = self.silu_gates = self.fused_convs = 0
        self.wide_values = self.split_windows = self.gqa_matched = 0
        self._probes, self.probes_reused = {}, 0
        counts = {"kda_chain": self._kda(g), "mla_decode": self._mla(g)}
        counts["mla_decode"] -= self.gqa_matched          # the attention search finds both forms
        counts["gqa_decode"] = self.gqa_matched
        eliminate_dead_code(g)
        counts["kda_commit_many"] = self._merge_commits(g)
        counts["gated_head_rmsnorm"] = self._norms(g, gated=True)
        eliminate_dead_code(g)
        counts["rmsnorm"] = self._norms(g, gated=False)
        eliminate_dead_code(g)
        counts["rmsnorm"] += self._weightless_norms(g)       # after the weighted ones are gone
        eliminate_dead_code(g)
        counts["head_cache_write"] = self._head_cache_writes(g)
        eliminate_dead_code(g)
        counts["mla_kv_write"] = self._kv_writes(g)
        eliminate_dead_code(g)
        query_ropes = self._rope_into_gqa(g)
        gates = self._gates_into_gqa(g)
        eliminate_dead_code(g)
        counts["head_matmul"], clones = pdl_glue.absorbed_products(g)
        eliminate_dead_code(g)
        clones += pdl_glue.drop_fresh_clones(g)
        grouped = pdl_glue.grouped_views_into_readers(g)
        fills = pdl_glue.slice_fills(g)
        casts = pdl_glue.fold_casts(g) + pdl_glue.drop_round_trips(g)
        clones += pdl_glue.rejoined_slices(g)
        eliminate_dead_code(g)
        epilogue = pdl_glue.direct_epilogue_writes(g) + pdl_glue.scattered_writes(g)
        eliminate_dead_code(g)                    # (the snapshots it dropped still read the inputs)
        epilogue += pdl_glue.rows_picked_before_gemm(g) if self.fold_relay_tail else 0
        epilogue += pdl_glue.gemm_rows_into_inputs(g) if self.fold_relay_tail else 0
        epilogue += pdl_glue.direct_lingc_writes(g) if self.fold_relay_tail else 0
        epilogue += pdl_glue.concat_into_inputs(g) if self.fold_relay_tail else 0
        gathers = pdl_norm_folds.embedding_into_norm(g) if self.fold_embedding else 0
        concats = pdl_glue.concat_cols(g) if self.fold_concat else 0
        norm_pairs = pdl_norm_folds.norm_pairs_into_concat(g) if self.fold_concat else 0
        routed = pdl_norm_folds.norms_into_routers(g) if self.fold_router_norm else 0
        kv_normed = pdl_norm_folds.norms_into_kv_writes(g) if self.fold_kv_norm else 0
        head_normed = pdl_norm_folds.norms_into_head_readers(g) if self.fold_head_norm else 0
        positions = pdl_glue.positions_into_readers(g) if self.fold_positions else 0
        tail = relay_tail(g) if self.fold_relay_tail else 0
        epilogue += pdl_glue.drawn_token_writes(g) if self.fold_relay_tail else 0
        eliminate_dead_code(g)
        summary = ", ".join(f"{v} {k}" for k, v in counts.items() if v) or "no match"
        if self.per_head_gates:
            summary += f" ({self.per_head_gates} kda_chain with one gate per head: Gated DeltaNet)"
        if self.fused_convs:
            summary += f" ({self.fused_convs} kda_chain over one fused convolution: Qwen3-Next's layout)"
        if self.wide_values:
            summary += f" ({self.wide_values} kda_chain with V != K)"
        if self.split_windows:
            summary += f" ({self.split_windows} kda_chain over three conv caches)"
        if self.silu_gates:
            summary += f" ({self.silu_gates} gated_head_rmsnorm with a silu gate)"
        if self.gates_folded:
            summary += f" (head gate folded into {self.gates_folded} mla_decode)"
        if query_ropes:
            summary += f" (the queries' RoPE folded into {query_ropes} gqa_decode)"
        if gates:
            summary += f" (output gate folded into {gates} gqa_decode)"
        if self.absorbed:
            summary += f" ({self.absorbed} written with expanded keys and values, absorbed)"
        if clones or casts or epilogue:
            summary += (f"; glue: {clones} copies of fresh values dropped, {casts} casts folded or dropped, "
                        f"{epilogue} epilogue writes made direct")
        if fills:
            summary += f"; {fills} tensors filled slice by slice taken as their slices"
        if grouped:
            summary += f"; {grouped} head-grouped projection pieces read in place (their copies dropped)"
        if gathers:
            summary += f"; {gathers} embedding gathers folded into their first norm"
        if concats:
            summary += f"; {concats} concatenations on lingc.concat_cols"
        if norm_pairs:
            summary += f"; {norm_pairs} norm pairs and their concatenation on lingc.rmsnorm_pair_cols"
        if routed:
            summary += f"; {routed} MoE input norms folded into their routers"
        if kv_normed:
            summary += f"; {kv_normed} latent norms folded into their cache writes"
        if head_normed:
            summary += f"; {head_normed} per-head q / k norms folded into gqa_decode / head_cache_write"
        if positions:
            summary += f"; {positions} position readers take the relay's n (no positions kernels)"
        if tail:
            summary += f"; relay tail: {tail} epilogue writes -> 1 relay_advance"
        if self.probes_reused:
            summary += f"; {len(self._probes)} region probes run, {self.probes_reused} reused for repeated layers"
        self.notes.insert(0, summary)
        self._coverage(g)
        return sum(counts.values())

    # -- norms --------------------------------------------------------------------------------

    def _norms(self, g: fx.Graph, gated: bool) -> int:
        matches = 0
        for n in list(g.nodes):
            if n.graph is None or not is_call(n, aten.mul.Tensor):
                continue
            m = self._gated_match(n) if gated else (self._rms_match(n) or self._rounded_rms_match(n))
            if m is not None and self._rewrite_norm(g, n, m, gated):
                matches += 1
        return matches

    def _weightless_norms(self, g: fx.Graph) -> int:
        """x * rsqrt(mean(x^2) + eps) with no weight after it (nn.RMSNorm(elementwise_affine=False),
        F.rms_norm(x, (D,)), a hand-written norm without a gain) -> lingc.rmsnorm with weight None
        (one rounding, eager's). Runs after the weighted norms are rewritten, so a core left here
        has no weight that could be folded in; one whose product is neither read in fp32 nor
        rounded back to its input's dtype is left, as _rewrite_norm decides for every norm. The
        folds into other kernels (router, cache write, pair) take weighted norms only."""
        matches = 0
        for n in list(g.nodes):
            if n.graph is None or not is_call(n, aten.mul.Tensor, aten.div.Tensor):
                continue
            core = self._rms_core(n)
            if core is not None and self._rewrite_norm(g, n, (core[0], None, core[1], None), gated=False):
                matches += 1
        if matches:
            self.notes.append(f"{matches} norms without a weight on lingc.rmsnorm")
        return matches

    def _rms_core(self, n: fx.Node):
        """n = x * rsqrt(mean(x^2) + eps) (or x / sqrt(..)): (x as read, eps)."""
        if is_call(n, aten.mul.Tensor):
            pairs = [(n.args[0], n.args[1]), (n.args[1], n.args[0])]
            for x, r in pairs:
                if isinstance(x, fx.Node) and is_call(r, aten.rsqrt.default):
                    eps = self._mean_sq_eps(r.args[0], x)
                    if eps is not None:
                        return x, eps
        if is_call(n, aten.div.Tensor) and is_call(n.args[1], aten.sqrt.default):
            eps = self._mean_sq_eps(n.args[1].args[0], n.args[0])
            if eps is not None:
                return n.args[0], eps
        return None

    @staticmethod
    def _mean_sq_eps(add: fx.Node, x: fx.Node) -> float | None:
        if not is_call(add, aten.add.Tensor, aten.add.Scalar) or len(add.args) != 2 or add.kwargs:
            return None
        ms, eps = add.args if isinstance(add.args[0], fx.Node) else add.args[::-1]
        if scalar(eps) is None or not isinstance(ms, fx.Node):
            return None
        width = shape(x)[-1]
        if is_call(ms, aten.mean.dim) and list(ms.args[1]) in ([-1], [len(shape(x)) - 1]) and ms.args[2:3] == (True,):
            sq = ms.args[0]
        elif is_call(ms, aten.div.Tensor) and scalar(ms.args[1]) == width and is_call(ms.args[0], aten.sum.dim_IntList):
            s = ms.args[0]
            if list(s.args[1]) not in ([-1], [len(shape(x)) - 1]) or s.args[2:3] != (True,):
                return None
            sq = s.args[0]
        else:
            return None
        if is_call(sq, aten.pow.Tensor_Scalar) and sq.args[1] == 2 and sq.args[0] is x:
            return scalar(eps)
        if is_call(sq, aten.mul.Tensor) and sq.args[0] is x and sq.args[1] is x:
            return scalar(eps)
        return None

    def _rms_match(self, n: fx.Node):
        """n = core * w (either order), w a [D] parameter: (x as read, w, eps, None); or w the
        fp32 gain 1 + w of a zero-centred weight (Gemma's, Qwen3-Next's ``normed * (1.0 +
        weight.float())``): (x as read, w, eps, "zero_centered")."""
        for core, w in ((n.args[0], n.args[1]), (n.args[1], n.args[0])):
            form = None
            wp = param_operand(w)
            if wp is None:
                wp, form = _zero_centered_weight(w), "zero_centered"
            if wp is None or not isinstance(core, fx.Node):
                continue
            c = self._rms_core(core)
            if c is not None and shape(wp) == (shape(c[0])[-1],):
                return c[0], wp, c[1], form
        return None

    def _rounded_rms_match(self, n: fx.Node):
        """n = w * cast(rms(cast(h, f32)), lo) in lo, w a [D] parameter in lo: the Hugging Face
        Llama RMSNorm of a 16-bit model (``weight * normed.to(input_dtype)``, rounded twice):
        (x as read, w, eps, "llama")."""
        lo = val(n).dtype
        if lo not in (torch.bfloat16, torch.float16):
            return None
        for c, w in ((n.args[0], n.args[1]), (n.args[1], n.args[0])):
            wp = param_operand(w)
            if (wp is None or w is not wp or val(wp).dtype != lo or not is_call(c, *CASTS) or val(c).dtype != lo
                    or len(c.users) != 1):
                continue
            core = self._rms_core(c.args[0])
            if core is None:
                continue
            x, eps = core
            if (is_call(x, *CASTS) and val(x).dtype == torch.float32 and val(x.args[0]).dtype == lo
                    and shape(wp) == (shape(x)[-1],)):
                return x, wp, eps, "llama"
        return None

    def _gated_match(self, n: fx.Node):
        """n = (rms(o) * w) * sigmoid(g), o and g [T, H, V] (or [1, T, H, V]: a batch of 1):
        (x as read, w, eps, g, round_steps). round_steps: the form of a model that runs the norm
        in its 16-bit dtype, ``cast(rms(cast(o_lo, f32)) * w, lo) * sigmoid(g_lo)`` in lo (what
        nn.RMSNorm of a bf16 input traces to): each step rounded as the op's round_steps does;
        "llama" for ``(w * cast(rms(cast(o_lo, f32)), lo)) * sigmoid(g_lo)``, the head norm in the
        Hugging Face Llama form (the op's round_before_weight as well). A silu gate (Gated
        DeltaNet's, ``rms(o) * w * silu(g)`` in fp32, the product perhaps taken on [T, H*V] views):
        (x, w, eps, g, False, True), the op's silu_gate."""
        for a, s in ((n.args[0], n.args[1]), (n.args[1], n.args[0])):
            s_core = s.args[0] if is_call(s, *CASTS) else s            # silu in fp32, rounded to lo
            gate = silu_input(s_core) if isinstance(s_core, fx.Node) else None
            if gate is not None and isinstance(a, fx.Node):
                m = self._qwen3_next_gated_match(n, a, s, gate)
                if m is not None:
                    return m
                lo = val(n).dtype
                rounded = lo in (torch.bfloat16, torch.float16) and val(s).dtype == lo
                m = self._silu_gated_match(a, gate, lo if rounded else None)
                if m is not None:
                    return m
            if not (isinstance(a, fx.Node) and is_call(s, aten.sigmoid.default)):
                continue
            lo = val(n).dtype
            llama = self._rounded_rms_match(a) if is_call(a, aten.mul.Tensor) else None
            if llama is not None:
                x, w, eps, _ = llama
                gate = s.args[0]
                if (val(s).dtype == lo and unit_lead(shape(x), 3) is not None and shape(gate) == shape(x)
                        and len(a.users) == 1):
                    return x, w, eps, gate, "llama"
                continue
            rounded = (is_call(a, *CASTS) and lo in (torch.bfloat16, torch.float16) and val(a).dtype == lo
                       and val(s).dtype == lo and len(a.users) == 1)
            prod = a.args[0] if rounded else a
            if not is_call(prod, aten.mul.Tensor):
                continue
            m = self._rms_match(prod)
            if m is None or m[3] is not None:           # (a zero-centred head norm stays ATen)
                continue
            x, w, eps, _ = m
            if rounded and not (is_call(x, *CASTS) and val(x.args[0]).dtype == lo and val(x).dtype == torch.float32):
                continue                                  # the norm's input is not the lo value upcast
            gate = s.args[0] if rounded else s.args[0].args[0] if is_call(s.args[0], *CASTS) else s.args[0]
            if unit_lead(shape(x), 3) is not None and shape(gate) == shape(x) and len(prod.users) == 1:
                return x, w, eps, gate, rounded
        return None

    def _qwen3_next_gated_match(self, n: fx.Node, a: fx.Node, s: fx.Node, gate: fx.Node):
        """n = a * silu(cast(g_lo, f32)) in fp32, a the Llama-form head norm in lo (``w *
        cast(rms(cast(o_lo, f32)), lo)``), n's one use its cast back to lo: Hugging Face's
        Qwen3NextRMSNormGated in a 16-bit model, (x, w, eps, g_lo, "llama", True, True): the op's
        round_steps, round_before_weight, silu_gate and gate_fp32."""
        lo = val(a).dtype
        users = list(n.users)
        if (val(n).dtype != torch.float32 or lo not in (torch.bfloat16, torch.float16) or val(s).dtype != torch.float32
                or not is_call(a, aten.mul.Tensor) or len(a.users) != 1 or len(users) != 1
                or not (is_call(users[0], *CASTS) and val(users[0]).dtype == lo) or val(gate).dtype != lo):
            return None                 # (gate: silu's input below its upcast, silu_input strips it)
        llama = self._rounded_rms_match(a)
        if llama is None:
            return None
        x, w, eps, _ = llama
        if unit_lead(shape(x), 3) is None or numel(gate) != numel(x) or shape(gate)[-1] % shape(x)[-1]:
            return None
        return x, w, eps, gate, "llama", True, True

    def _silu_gated_match(self, a: fx.Node, gate: fx.Node, lo):
        """a = rms(o) * w, or a view of it with o's elements in order (a [T, H*V] reshape), o
        [T, H, V] in fp32 and gate of o's numel: (o, w, eps, gate, False, True). With ``lo`` (a
        16-bit model: the product, silu(g) and a in lo) a is the weighted norm of o.to(lo) rounded
        to lo, nn.RMSNorm's steps: (o, w, eps, gate, True, True), the op's round_steps."""
        prod = a
        while is_call(prod, aten.view.default, aten.reshape.default, aten._unsafe_view.default) and len(prod.users) == 1:
            prod = prod.args[0]
        if lo is not None:
            if not (is_call(prod, *CASTS) and val(prod).dtype == lo and len(prod.users) == 1):
                return None
            prod = prod.args[0]
        if not is_call(prod, aten.mul.Tensor) or len(prod.users) != 1:
            return None
        m = self._rms_match(prod)
        if m is None or m[3] is not None:
            return None
        x, w, eps, _ = m
        if lo is not None and not (is_call(x, *CASTS) and val(x.args[0]).dtype == lo):
            return None                                   # the norm's input is not the lo value upcast
        if (unit_lead(shape(x), 3) is None or val(x).dtype != torch.float32 or numel(gate) != numel(x)
                or shape(gate)[-1] % shape(x)[-1] != 0):
            return None
        return x, w, eps, gate, lo is not None, True

    def _rewrite_norm(self, g: fx.Graph, n: fx.Node, m, gated: bool) -> bool:
        """Rewrite one matched norm. The ops compute in fp32 and round once to the input dtype:
        an fp32 input, or a low-precision input upcast with the result cast back."""
        x = m[0]
        base = x.args[0] if is_call(x, *CASTS) else x
        out_node, out_dtype = n, None
        users = list(n.users)
        if len(users) == 1 and is_call(users[0], *CASTS):
            out_node, out_dtype = users[0], val(users[0]).dtype
        try:
            if gated:
                _, w, eps, gate, rounded = m[:5]
                silu = len(m) > 5 and m[5]
                gate_fp32 = len(m) > 6 and m[6]
                if rounded:
                    # o as the lo value the norm reads; a lo rounding of an fp32 o (the KDA chain's
                    # output) is done by the kernel as it reads o, not by a cast kernel before it.
                    x = base
                    if is_call(x, *CASTS) and len(x.users) == 1 and val(x.args[0]).dtype == torch.float32:
                        x = x.args[0]
                    out_node, out_dtype = n, val(n).dtype
                    if gate_fp32:           # (the fp32 product's one rounding, n's cast, is the op's)
                        out_node = users[0]
                        out_dtype = val(out_node).dtype
                with g.inserting_before(out_node):
                    core = list(shape(x)[-3:])
                    x3, gate3 = (t if list(shape(t)) == core else emit(g, aten.reshape.default, t, core)
                                 for t in (x, gate))
                    flags = {"round_steps": True} if rounded else {}
                    if rounded == "llama":
                        flags["round_before_weight"] = True
                    if silu:
                        flags["silu_gate"] = True
                        self.silu_gates += 1
                    if gate_fp32:
                        flags["gate_fp32"] = True
                    new = emit(g, lingc_ops.gated_head_rmsnorm.default, x3, gate3, w, eps, out_dtype, **flags)
                    if shape(new) != shape(out_node):
                        new = emit(g, aten.reshape.default, new, list(shape(out_node)))
                out_node.replace_all_uses_with(new)
                return True
            _, w, eps, form = m
            rounded = form == "llama"                    # _rounded_rms_match: the Llama form
            if rounded:
                out_node, out_dtype = n, val(n).dtype
            if base is x:
                if val(x).dtype != torch.float32:
                    return False                         # a low-precision norm: other rounding
                out_node = n
            elif out_dtype != val(base).dtype or val(x).dtype != torch.float32:
                return False                             # not rounded back to the input dtype
            h = base
            res = None
            if (is_call(h, aten.add.Tensor) and len(h.args) == 2 and not h.kwargs
                    and all(isinstance(a, fx.Node) and shape(a) == shape(h) and val(a).dtype == val(h).dtype
                            for a in h.args)):
                res = h
            D = shape(h)[-1]
            where = res.next if res is not None else out_node
            with g.inserting_before(where):
                two_d = lambda t: t if len(shape(t)) == 2 else emit(g, aten.reshape.default, t, [-1, D])  # noqa: E731
                flag = {"round_before_weight": True} if rounded else {"zero_centered": True} if form else {}
                if res is not None:
                    pair = emit(g, lingc_ops.rmsnorm.default, two_d(res.args[1]), w, two_d(res.args[0]), eps, **flag)
                else:
                    pair = emit(g, lingc_ops.rmsnorm.default, two_d(h), w, None, eps, **flag)
                y = emit(g, operator.getitem, pair, 0)
                if shape(y) != shape(out_node):
                    y = emit(g, aten.reshape.default, y, list(shape(out_node)))
                if res is not None:
                    hr = emit(g, operator.getitem, pair, 1)
                    if shape(hr) != shape(res):
                        hr = emit(g, aten.reshape.default, hr, list(shape(res)))
            out_node.replace_all_uses_with(y)
            if res is not None:
                res.replace_all_uses_with(hr)
            return True
        except ValueError as e:                          # the op's argument check refused it
            self.notes.append(f"norm at {n.name} left: {e}")
            return False

    # -- coverage -----------------------------------------------------------------------------

    def _coverage(self, g: fx.Graph) -> None:
        """PDL coverage (lingc kernels / kernel-launching ops), what stays and why, and each
        layer's chain of lingc ops (layers of one kind with the same chain on one line)."""
        cats = {n: classify(n, False) for n in g.nodes if n.op == "call_function"}
        kernels = [n for n, c in cats.items() if c != "glue"]
        lingc = [n for n in kernels if cats[n] == "lingc"]
        if not kernels:
            return
        self.notes.append(f"PDL coverage {len(lingc)}/{len(kernels)} kernel-launching ops "
                          f"({100 * len(lingc) / len(kernels):.0f}%)")
        writes = [n for n in g.nodes if is_call(n, aten.index_put.default, aten.index_copy.default)]
        cache_write = set(region(writes, lambda n: is_heavy(view_base(n)))[0]) if writes else set()
        groups: dict[str, dict[str, int]] = {}
        for n in kernels:
            if cats[n] != "lingc":
                ops = groups.setdefault(_leftover_reason(n, cache_write), {})
                name = target_name(n.target)
                name = name.split(".")[1] if "." in name else name      # (a Python op on sizes: its name)
                ops[name] = ops.get(name, 0) + 1
        for reason, ops in sorted(groups.items(), key=lambda kv: -sum(kv[1].values())):
            detail = ", ".join(f"{k} x{v}" for k, v in sorted(ops.items(), key=lambda kv: (-kv[1], kv[0])))
            self.notes.append(f"left {sum(ops.values())}: {reason} [{detail}]")
        for label, chain in _grouped(_chains(lingc)):
            self.notes.append(f"chain {label}: " + " > ".join(chain))


_MLP = ("swiglu_gemm_separate", "swiglu_gemm", "moe_experts")


def _zero_centered_weight(w) -> fx.Node | None:
    """w = 1 + p in fp32, p a parameter (possibly upcast): p, the zero-centred weight whose gain
    w is. A gain added in a 16-bit dtype (rounded before the product) is not this form."""
    if not (is_call(w, aten.add.Tensor, aten.add.Scalar) and len(w.args) == 2 and not w.kwargs
            and val(w).dtype == torch.float32):
        return None
    p, one = w.args if isinstance(w.args[0], fx.Node) else w.args[::-1]
    return param_operand(p) if scalar(one) == 1 else None


def _leftover_reason(n: fx.Node, cache_write: set) -> str:
    if n in cache_write or is_call(n, aten.select_scatter.default):
        return "MLA cache write + the cached key's RoPE (positional; no lingc kernel yet)"
    if is_call(n, aten.bmm.default, aten.mm.default):
        return "absorbed MLA products q_nope @ W_uk, o_lat @ W_uv (library GEMM)"
    if is_call(n, aten.embedding.default):
        return "token embedding gather"
    if isinstance(n.target, torch._ops.OpOverload) and n.target.namespace == "_c10d_functional":
        return "tensor-parallel collectives (NCCL kernels: a PDL chain ends and restarts at each)"
    return "glue outside the matched cores (layout copies, sampling, an unfolded MLA head gate)"




def _grouped(chains: list[tuple[str, list[str]]]) -> list[tuple[str, list[str]]]:
    """Layers of one kind with the same chain as one line, "L1, L3-L4 KDA" (a 42-layer model has a
    handful of distinct chains), in the order each chain first appears."""
    groups: dict[tuple, list[int] | None] = {}     # (kind or label, chain) -> layer numbers
    for label, chain in chains:
        if label.startswith("L"):
            num, kind = label[1:].split(" ")
            groups.setdefault((kind, tuple(chain)), []).append(int(num))
        else:
            groups[(label, tuple(chain))] = None
    return [(name if nums is None else f"{_ranges(nums)} {name}", list(chain))
            for (name, chain), nums in groups.items()]


def _ranges(nums: list[int]) -> str:
    """[1, 3, 4, 5, 7] -> "L1, L3-L5, L7"."""
    runs: list[list[int]] = []
    for n in nums:
        if runs and n == runs[-1][-1] + 1:
            runs[-1].append(n)
        else:
            runs.append([n])
    return ", ".join(f"L{r[0]}" if len(r) == 1 else f"L{r[0]}-L{r[-1]}" for r in runs)


def _chains(lingc: list[fx.Node]) -> list[tuple[str, list[str]]]:
    """Split the lingc ops into layers: a new layer starts at an rmsnorm once the current one
    has its MLP."""
    chains: list[list[str]] = [[]]
    for n in lingc:
        op = n.target._schema.name.split("::")[-1]
        if op == "rmsnorm" and any(o in _MLP for o in chains[-1]):
            chains.append([])
        chains[-1].append(op)
    out, layer = [], 0
    for ch in chains:
        kind = ("KDA" if "kda_chain" in ch else "MLA" if "mla_decode" in ch
                else "GQA" if "gqa_decode" in ch else None)
        if kind:
            out.append((f"L{layer} {kind}", ch))
            layer += 1
        else:
            out.append(("head" if out else "embed", ch))
    return out

