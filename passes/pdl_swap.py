"""pdl_swap: the norms, the KDA chain and the MLA decode core become lingc's PDL-launched kernels;
the dump reports PDL coverage and each layer's chain of lingc ops.

    before:  h = r + x ; y = (h * rsqrt(mean(h^2) + eps) * w)          (5-7 ATen ops, fp32 casts)
    after:   y, h = lingc.rmsnorm(x, w, r, eps)                           (1 kernel, residual fused)

    before:  conv window cat + taps + silu (q, k, v), l2norms, gate, beta, T token steps of the
             delta rule, state/window written back by select_scatter + copy_   (~60 ops per token)
    after:   o = lingc.kda_chain(q, k, v, f, b, conv_w, window[slot], A_log, dt_bias,
                                 state[slot], lower_bound, None, None)   (in place: no copy_ left)
    verify (the staged form stage_commit leaves: stack(V_0..V_T-1)[accept] written back):
             o = lingc.kda_chain(..., stages = aten.empty([T, ...]))     (state untouched)
             lingc.kda_commit(state[slot], window[slot], stages..., accept)  at the epilogue,
             then every layer's commit of one shape in one lingc.kda_commit_many(states,
             windows, stages..., accept)   (cdiv(layers, 8) launches instead of one per layer)

    before:  rmsnorm_per_head(o) * w * sigmoid(g)        after: lingc.gated_head_rmsnorm(o, g, w, eps)

    before:  scores = (q_lat c^T + rope(q_rope) k_rope^T) * scale ; causal mask from positions ;
             softmax ; p @ c                              (T <= 16)
    after:   o_lat = lingc.mla_decode(q_lat, q_rope, kv[slot], positions, scale, None, inv_freq)

    before:  rows = cat(c, rope(k_rope, positions)) ; slot' = index_put(kv[slot], [positions], rows) ;
             kv' = select_scatter(kv, slot', 0, slot) ; ... ; copy_(kv, kv')     (~15 ops, and
             outside Inductor three copies of the whole cache slot)
    after:   lingc.mla_kv_write(c, k_rope, positions, inv_freq, kv[slot])    (in place, one kernel)

How matches are found (computations, not names):
- norms are matched op by op: x * rsqrt(mean(x^2) + eps) * w in its spellings (pow or x*x, mean
  or sum / D, commuted multiplies, fp32 upcast of x and w with the downcast after), the add that
  produced x when it is a [T, D] residual add, and a following sigmoid gate for the per-head form.
  The ops' CPU references run the model's exact op sequence, so the model's path is bit-identical.
- KDA and MLA are matched by region: the KDA core is everything between a recurrent-state write
  (a fp32 [H, A, A] slot written back from its own old value), the conv-window write that feeds
  it and the state's read-out o (the first value every other use of the state goes through) on
  one side, and projection outputs and parameters on the other. The MLA core is everything
  between a softmax's p @ c output (the softmax's maximum as amax, or max written by hand), or a
  fused attention op's output (a CUDA trace's SDPA, lingc/sdpa.py), and the latent cache (a slot
  of a [slots, L, R + P] input, or a one-sequence [L, R + P] input), the positions and the query
  projections, the queries and output token-major [T, H, .] or head-major [H, T, .]
  (lingc/head_layout.py); a product of two computed values (p @ c reaching the
  graph as mm) is inside a region, a product with a weight is a projection at its edge. The
  cut-out region is then run on random inputs and compared with the op's reference under every
  candidate role assignment (q/k/v order, state layout [K, V] or [V, K], the gate's lower bound
  among the region's constants or the unbounded softplus gate, the softmax scale among them or a
  divisor d as the scale 1/d, RoPE fused or not). Only an
  assignment that reproduces the region (rel. error 1e-4 in fp32) is rewritten; a region that no
  assignment reproduces is left alone with a note. A state stored [V, K] runs the kernel on a
  transposed temporary (noted; the in-place layout is [K, V]).

Numerics (declared): the KDA and MLA references evaluate one position at a time (batch-invariant
in T); at T=1 they are the model's computation, at T > 1 they differ from the whole-T ATen ops in
the last bits of exp/sigmoid. The cache write is matched from the functional write itself (an
index_put of rows into select(cache input, 0, slot), scattered back and copied to the input at
the epilogue), its rows checked by running them on random inputs against
[c ; interleaved rope(k)]; it is rewritten only when nothing reads the old cache after the write.
The MLA head gate (the model multiplies by sigmoid(g) after the W_uv product) is folded into
mla_decode, which gates o_lat before that product: equal up to fp32 rounding (declared), and the
same in decode and verify graphs.

    before:  bmm(q_nope.float(), W_uk.float()) ; bmm(o_lat, W_uv.float()) ; clone ; casts
    after:   lingc.head_matmul(q_nope, W_uk, True) ; ... ; no clone, casts inside the producers

An MLA whose values come out of a projection of the cache rows (the textbook form, keys and values
expanded through kv_b_proj at every step) is handed to mla_absorb.py, which absorbs kv_b_proj
into the query and the output and rewrites it onto the same kernels.

The glue between the kernels (the absorbed MLA products, copies of fresh values, casts after a
lingc op) is pdl_glue.py's, with the reasons each rewrite is exact. The relay step's bookkeeping
after the last kernel (row pick, n and x advance, token ring append) is relay_tail.py's.
"""

from __future__ import annotations

import itertools
import operator

import torch
import torch.fx as fx

from lingc.compat import real_tensor_mode
from lingc.graph_build import eliminate_dead_code, emit
from lingc.graph_match import CASTS, aten, is_call, scalar, strip
from lingc.graph_text import target_name
from lingc.head_layout import emit_layout, emit_token_major, head_layouts, token_major
from lingc.graph_region import (ancestors, depends_on, descendants, is_heavy, numel, random_like, region,
                                region_key, region_module, rel_err, run_region, shape, softmax_scales, val,
                                view_base, widen_leaf)
from lingc.kernel_table import classify
from lingc.pass_manager import VIEW_OPS, LingcPass
from lingc.sdpa import sdpa_call

from . import mla_absorb, pdl_glue
from .relay_tail import relay_tail

lingc_ops = torch.ops.lingc
MAX_T = 16
PROBE_TOL = {torch.float32: 1e-4}          # other dtypes: 3e-2
SLOT_WRITES = {aten.select_scatter.default}
KERNEL_DIMS_OK = (1, 2, 3)
NODE_KEYS = {"qkv", "f", "conv", "b", "a_log", "dt_bias"}    # the KDA probe's result fields that are leaves


def _int_vector(a: fx.Node, htl: int, L: int) -> bool:
    """Whether a is a 1-d integer vector that could be the positions of the queries of an
    attention with htl = H * T * L probabilities over L keys."""
    v = val(a)
    return (isinstance(v, torch.Tensor) and v.dtype in (torch.int32, torch.int64)
            and len(shape(a)) == 1 and (htl // L) % shape(a)[0] == 0)


def _placeholder(n) -> bool:
    return isinstance(n, fx.Node) and n.op == "placeholder"


def _param(n) -> fx.Node | None:
    """A parameter operand: a placeholder, possibly cast."""
    n = strip(n) if isinstance(n, fx.Node) else n
    return n if _placeholder(n) else None


class PdlSwap(LingcPass):
    name = "pdl_swap"
    tolerance = (1e-4, 1e-4)
    reuse_probes = True          # off: every layer's region is probed (tests compare the two)
    fold_relay_tail = True       # off: the relay steps' tail copies stay ATen ops (tests count the two)
    fold_embedding = True        # off: the token embedding gather stays an ATen op (tests that want a leftover)
    fold_concat = True           # off: two-input last-dim concatenations stay ATen cats
    fold_router_norm = True      # off: the MoE block's input norm stays a lingc.rmsnorm launch
    fold_kv_norm = True          # off: MLA's kv_a_layernorm stays a lingc.rmsnorm launch
    fold_positions = True        # off: the relay's chain positions stay n + arange(T) ATen kernels

    def apply(self, gm: fx.GraphModule) -> int:
        import lingc.runtime.kernels.head_matmul  # noqa: F401
        import lingc.runtime.kernels.kda  # noqa: F401  (registers lingc::kda_chain, kda_commit(_many))
        import lingc.runtime.kernels.mla_decode  # noqa: F401
        import lingc.runtime.kernels.mla_kv_write  # noqa: F401
        import lingc.runtime.kernels.norms  # noqa: F401

        g = gm.graph
        self.gates_folded = self.absorbed = 0
        self._probes, self.probes_reused = {}, 0
        counts = {"kda_chain": self._kda(g), "mla_decode": self._mla(g)}
        eliminate_dead_code(g)
        counts["kda_commit_many"] = self._merge_commits(g)
        counts["gated_head_rmsnorm"] = self._norms(g, gated=True)
        eliminate_dead_code(g)
        counts["rmsnorm"] = self._norms(g, gated=False)
        eliminate_dead_code(g)
        counts["mla_kv_write"] = self._kv_writes(g)
        eliminate_dead_code(g)
        counts["head_matmul"], clones = pdl_glue.absorbed_products(g)
        eliminate_dead_code(g)
        clones += pdl_glue.drop_fresh_clones(g)
        casts = pdl_glue.fold_casts(g) + pdl_glue.drop_round_trips(g)
        eliminate_dead_code(g)
        epilogue = pdl_glue.direct_epilogue_writes(g)
        eliminate_dead_code(g)                    # (the snapshots it dropped still read the inputs)
        epilogue += pdl_glue.direct_lingc_writes(g) if self.fold_relay_tail else 0
        epilogue += pdl_glue.concat_into_inputs(g) if self.fold_relay_tail else 0
        gathers = pdl_glue.embedding_into_norm(g) if self.fold_embedding else 0
        concats = pdl_glue.concat_cols(g) if self.fold_concat else 0
        norm_pairs = pdl_glue.norm_pairs_into_concat(g) if self.fold_concat else 0
        routed = pdl_glue.norms_into_routers(g) if self.fold_router_norm else 0
        kv_normed = pdl_glue.norms_into_kv_writes(g) if self.fold_kv_norm else 0
        positions = pdl_glue.positions_into_readers(g) if self.fold_positions else 0
        tail = relay_tail(g) if self.fold_relay_tail else 0
        eliminate_dead_code(g)
        summary = ", ".join(f"{v} {k}" for k, v in counts.items() if v) or "no match"
        if self.gates_folded:
            summary += f" (head gate folded into {self.gates_folded} mla_decode)"
        if self.absorbed:
            summary += f" ({self.absorbed} written with expanded keys and values, absorbed)"
        if clones or casts or epilogue:
            summary += (f"; glue: {clones} copies of fresh values dropped, {casts} casts folded or dropped, "
                        f"{epilogue} epilogue writes made direct")
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
            m = self._gated_match(n) if gated else self._rms_match(n)
            if m is not None and self._rewrite_norm(g, n, m, gated):
                matches += 1
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
        """n = core * w (either order), w a [D] parameter: (x as read, w, eps)."""
        for core, w in ((n.args[0], n.args[1]), (n.args[1], n.args[0])):
            wp = _param(w)
            if wp is None or not isinstance(core, fx.Node):
                continue
            c = self._rms_core(core)
            if c is not None and shape(wp) == (shape(c[0])[-1],):
                return c[0], wp, c[1]
        return None

    def _gated_match(self, n: fx.Node):
        """n = (rms(o) * w) * sigmoid(g), o and g [T, H, V]."""
        for a, s in ((n.args[0], n.args[1]), (n.args[1], n.args[0])):
            if not (isinstance(a, fx.Node) and is_call(s, aten.sigmoid.default) and is_call(a, aten.mul.Tensor)):
                continue
            m = self._rms_match(a)
            if m is None:
                continue
            x, w, eps = m
            gate = s.args[0].args[0] if is_call(s.args[0], *CASTS) else s.args[0]
            if len(shape(x)) == 3 and shape(gate) == shape(x) and len(a.users) == 1:
                return x, w, eps, gate
        return None

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
                _, w, eps, gate = m
                with g.inserting_before(out_node):
                    new = emit(g, lingc_ops.gated_head_rmsnorm.default, x, gate, w, eps, out_dtype)
                out_node.replace_all_uses_with(new)
                return True
            _, w, eps = m
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
                if res is not None:
                    pair = emit(g, lingc_ops.rmsnorm.default, two_d(res.args[1]), w, two_d(res.args[0]), eps)
                else:
                    pair = emit(g, lingc_ops.rmsnorm.default, two_d(h), w, None, eps)
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

    # -- KDA ----------------------------------------------------------------------------------

    def _kda(self, g: fx.Graph) -> int:
        writes = self._state_writes(g)
        states = [w for w in writes if w["kind"] == "state"]
        windows = {w["ph"]: w for w in writes if w["kind"] == "window"}
        matches = 0
        for st in states:
            _, leaves = region([st["value"]], lambda n: is_heavy(view_base(n)))
            wins = [w for ph, w in windows.items() if ph in leaves]
            if len(wins) != 1:
                self.notes.append(f"{st['ph'].name}: recurrent state without one conv window feeding it, left")
                continue
            why = self._kda_one(g, st, wins[0])
            if why:
                self.notes.append(f"{st['ph'].name}: KDA chain left ({why})")
            else:
                matches += 1
        if matches:
            self._mark_state_ready(g)
        return matches

    def _mark_state_ready(self, g: fx.Graph) -> None:
        """``state_ready=True`` on every kda_chain whose state and conv window are graph inputs
        (or slots of them) that no lingc KDA op earlier in this graph writes: their last writer
        ran before the graph, behind the projection GEMM that feeds the chain, so the kernel may
        read them before its PDL wait (runtime/kernels/kda/kernel.py, "PDL"). A transposed copy,
        or a second chain on the same input, keeps the read after the wait."""
        def input_base(x):
            if isinstance(x, fx.Node) and x.op == "placeholder":
                return x
            if is_call(x, aten.select.int) and isinstance(x.args[0], fx.Node) and x.args[0].op == "placeholder":
                return x.args[0]
            return None

        def inputs(n: fx.Node, *names: str) -> list:
            pos = [a.name for a in n.target._schema.arguments]
            return [input_base(n.args[pos.index(name)]) for name in names]

        written: set = set()
        for n in g.nodes:
            if is_call(n, lingc_ops.kda_commit.default):
                written.update(b for b in inputs(n, "state", "conv_window") if b is not None)
            if not is_call(n, lingc_ops.kda_chain.default):
                continue
            bases = inputs(n, "conv_window", "state")
            if all(b is not None and b not in written for b in bases):
                n.kwargs = {**n.kwargs, "state_ready": True}
            written.update(b for b in bases if b is not None)

    def _state_writes(self, g: fx.Graph) -> list[dict]:
        """Epilogue copy_(ph, new) of a slot (select_scatter(ph, copy(select(ph, 0, s), X), 0, s))
        or of the whole placeholder (copy_(ph, X)); X is staged when it is stack(..)[accept]."""
        out = []
        order = {n: i for i, n in enumerate(g.nodes)}
        for n in g.nodes:
            if not (is_call(n, aten.copy_.default) and _placeholder(n.args[0])):
                continue
            ph, new = n.args
            path, slot, x = [n], None, new
            if is_call(new, aten.copy.default) and new.args[0] is ph:
                path, x = path + [new], new.args[1]        # stage_commit's write of a whole input
            elif is_call(new, *SLOT_WRITES) and new.args[0] is ph and new.args[2] == 0:
                cp = new.args[1]
                if not is_call(cp, aten.copy.default):
                    continue
                slot, x = new.args[3], cp.args[1]
                path += [new, cp, cp.args[0]]
            stack = accept = None
            if is_call(x, aten.squeeze.dim) and is_call(x.args[0], aten.index.Tensor):
                idx = x.args[0]
                if is_call(idx.args[0], aten.stack.default) and len(idx.args[1]) == 1:
                    stack, accept = idx.args[0], idx.args[1][0]
                    path += [x, idx]
            s = shape(x)
            if s is None or not depends_on(stack or x, ph, order):
                continue
            kind = None
            if val(x).dtype == torch.float32 and len(s) == 3 and s[1] == s[2]:
                kind = "state"
            elif len(s) == 3 and s[0] == 3:
                kind = "window"
            if kind:
                out.append(dict(kind=kind, ph=ph, slot=slot, value=stack or x, staged=stack is not None,
                                accept=accept, path=path, epilogue=n))
        return out

    def _readout(self, st: dict, T: int, H: int, V: int) -> fx.Node | None:
        """The state's read-out o: the first [T, H, V]-sized value that every other use of the state
        (outside its own write) goes through: each use before it is one of its ancestors, each use
        after it one of its descendants."""
        # Every set below is taken inside dep (the state's descendants): a path from a node of
        # dep stays in dep, so the ancestor walks need not go back through earlier layers.
        dep = descendants([st["ph"]])
        spine = ancestors([st["value"]], within=dep) | {st["value"]}
        rest = dep - spine - set(st["path"])
        order = {n: i for i, n in enumerate(st["ph"].graph.nodes)}
        seq = sorted(dep, key=order.__getitem__)
        uses = [n for n in seq if n in rest]
        for i, c in enumerate(uses):
            if numel(c) != T * H * V or not set(uses[:i]) <= ancestors([c], within=dep):
                continue
            # One forward scan of dep in graph order marks c's descendants (they all lie in dep)
            # and stops at the first later use that is not one: a wrong candidate fails within a
            # few nodes instead of costing a walk of every later layer.
            down = {c}
            for n in seq[seq.index(c) + 1:]:
                if any(a in down for a in n.all_input_nodes):
                    down.add(n)
                elif n in rest:
                    break
            else:
                return c
        return None

    def _kda_one(self, g: fx.Graph, st: dict, win: dict) -> str | None:
        if st["staged"] != win["staged"] or st["slot"] != win["slot"]:
            return "state and window written differently"
        H, A, _ = shape(st["value"])[-3:]
        D = H * A
        if shape(win["value"])[-2:] != (D, 3):
            return f"conv window {shape(win['value'])} is not [3, H*K, 3]"
        # T from the window's inputs (the region of the two writes alone holds every projection).
        _, leaves = region([st["value"], win["value"]], lambda n: is_heavy(view_base(n)))
        raw_t = [numel(n) // D for n in leaves if not _placeholder(n) and numel(n) % D == 0]
        if not raw_t:
            return "projection inputs not found"
        T = max(raw_t)
        if st["staged"] and shape(st["value"])[0] != T:
            return "staged over a different chain length"
        if T > MAX_T:
            return f"T = {T} > {MAX_T} (chunked prefill form)"
        o = self._readout(st, T, H, A)
        if o is None:
            return "no single read-out of the state"
        outs = [o, st["value"], win["value"]]
        nodes, leaves = region(outs, lambda n: is_heavy(view_base(n)))
        want = {T * D: (T, D), T * H: (T, H)}
        widened = []
        for leaf in leaves:
            if not _placeholder(leaf) and numel(leaf) in want:
                w, chain = widen_leaf(leaf, lambda n: shape(n) == want[numel(leaf)])
                widened.append(w)
                nodes += chain
            else:
                widened.append(leaf)
        leaves = list(dict.fromkeys(widened))
        order = {n: i for i, n in enumerate(g.nodes)}
        nodes = sorted(set(nodes) - set(leaves), key=order.__getitem__)
        inner = set(nodes) - set(outs)
        allowed = set(nodes) | set(st["path"]) | set(win["path"])
        if any(u not in allowed for n in inner for u in n.users):
            return "an intermediate value is used outside the chain"
        views = lambda n: n.op == "call_function" and n.target in VIEW_OPS  # noqa: E731
        for ph in (st["ph"], win["ph"]):
            if not descendants([ph], views) <= allowed:
                return f"{ph.name} is read outside the chain"
        roles = self._kda_roles(leaves, nodes, st["ph"], win["ph"], T, H, A)
        if isinstance(roles, str):
            return roles
        with real_tensor_mode():
            found = self._kda_probe(nodes, leaves, outs, roles, st, win, T, H, A)
        if isinstance(found, str):
            return found
        if found["transposed"] and st["staged"]:
            return "state stored [V, K] in a verify graph: kda_commit writes the [K, V] layout"
        try:
            self._kda_rewrite(g, st, win, o, found, T, H, A)
        except ValueError as e:          # the op refused an argument: nothing was replaced yet
            return f"kda_chain refused the inputs ({e})"
        return None

    def _merge_commits(self, g: fx.Graph) -> int:
        """A verify graph's per-layer kda_commits (one per KDA layer, at the epilogue) -> one
        kda_commit_many per accept index and layer shape: 35 launches of ~1.7 us each on the
        step's critical path become cdiv(35, COMMIT_GROUP). The earlier commits move down to the
        last one's place, so nothing between them may touch their states or windows."""
        groups: dict[tuple, list[fx.Node]] = {}
        for n in g.nodes:
            if is_call(n, lingc_ops.kda_commit.default):
                state, window, ss, sw, idx = n.args
                key = (idx, *((shape(a), val(a).dtype) for a in (state, window, ss, sw)))
                groups.setdefault(key, []).append(n)
        order = {n: i for i, n in enumerate(g.nodes)}
        merged = 0
        for ns in groups.values():
            if len(ns) < 2:
                continue
            mine = set(ns)
            touched = {view_base(a) for n in ns for a in n.args[:2]}
            between = [n for n in g.nodes if order[ns[0]] < order[n] < order[ns[-1]] and n not in mine]
            if any(view_base(a) in touched for n in between for a in n.all_input_nodes):
                self.notes.append(f"{len(ns)} kda_commits not merged: a node between them touches their states")
                continue
            with g.inserting_after(ns[-1]):
                emit(g, lingc_ops.kda_commit_many.default, *([n.args[i] for n in ns] for i in range(4)), ns[0].args[4])
            for n in ns:
                g.erase_node(n)
            merged += 1
        return merged

    def _kda_roles(self, leaves, nodes, state_ph, win_ph, T, H, A):
        D = H * A
        raws = [n for n in leaves if not _placeholder(n) and shape(n) == (T, D)]
        braw = [n for n in leaves if not _placeholder(n) and shape(n) == (T, H)]
        params = [n for n in leaves if _placeholder(n) and n not in (state_ph, win_ph)]
        a_log = [p for p in params if shape(p) == (H,)]
        dt_bias = [p for p in params if shape(p) == (D,)]
        conv = [p for p in params if numel(p) == 4 * D and shape(p)[0] == D]
        if len(raws) != 4 or len(braw) != 1 or len(a_log) != 1 or len(dt_bias) != 1 or len(conv) != 3:
            return (f"inputs not recognised: {len(raws)} [T, H*K] projections, {len(braw)} [T, H], "
                    f"{len(a_log)} [H], {len(dt_bias)} [H*K], {len(conv)} conv weights")
        if len(leaves) != 4 + 1 + 1 + 1 + 3 + 2:
            return f"{len(leaves)} inputs, expected 12"
        # Each conv weight pairs with the projection it first meets (the conv taps); the
        # projection no conv weight claims is f.
        inside = set(nodes)
        order = {n: i for i, n in enumerate(nodes)}
        # The walks go through the region and its inputs only, not through every later layer:
        # region() stops only at inputs, so a path that left the region and came back would enter
        # it through another input, and KDA's inputs (projections, parameters) do not feed one
        # another.
        local = inside | set(leaves)
        desc = {n: descendants([n], local.__contains__) & inside for n in raws + conv}
        pair = {}
        for c in conv:
            meet = {r: min((order[u] for u in desc[r] & desc[c]), default=len(order)) for r in raws}
            pair[min(raws, key=meet.__getitem__)] = c
        if len(pair) != 3:
            return "conv weights do not pair with three projections"
        f = [r for r in raws if r not in pair]
        return dict(qkv=[r for r in raws if r in pair], pair=pair, f=f[0], b=braw[0], a_log=a_log[0],
                    dt_bias=dt_bias[0])

    def _kda_probe(self, nodes, leaves, outs, roles, st, win, T, H, A):
        """The probe, once per form of the region: a layer whose region, roles and hint equal an
        earlier one's (region_key) would draw the same inputs and run the same candidates, so it
        takes that probe's outcome, mapped onto its own leaves."""
        at = {leaf: i for i, leaf in enumerate(leaves)}
        ix = lambda n: at[n]  # noqa: E731
        hint = getattr(self, "_kda_hint", None)
        key = ("kda", region_key(nodes, leaves, outs), tuple(map(ix, roles["qkv"])),
               tuple((ix(r), ix(c)) for r, c in roles["pair"].items()),
               *(ix(roles[k]) for k in ("f", "b", "a_log", "dt_bias")), ix(st["ph"]), ix(win["ph"]),
               st["staged"], st["slot"], T, H, A, hint)
        memo = self._probes.get(key) if self.reuse_probes else None
        if memo is None:
            found = self._kda_probe_run(nodes, leaves, outs, roles, st, win, T, H, A)
            memo = found if isinstance(found, str) else (
                {k: (tuple(map(ix, v)) if isinstance(v, (list, tuple)) else ix(v)) if k in NODE_KEYS else v
                 for k, v in found.items()}, self._kda_hint)
            self._probes[key] = memo
        else:
            self.probes_reused += 1
        if isinstance(memo, str):
            return memo
        found, self._kda_hint = memo
        return {k: ([leaves[i] for i in v] if isinstance(v, tuple) else leaves[v]) if k in NODE_KEYS else v
                for k, v in found.items()}

    def _kda_probe_run(self, nodes, leaves, outs, roles, st, win, T, H, A):
        gen = torch.Generator().manual_seed(0)
        scale = {roles["b"]: 1.0, roles["a_log"]: 0.5, st["ph"]: 0.3}
        inputs = [random_like(n, gen, scale.get(n, 1.0)) for n in leaves]
        got = run_region(region_module(nodes, leaves, outs), inputs)
        if got is None:
            return "the chain does not run on the CPU"
        x = dict(zip(leaves, inputs))
        sl = (lambda t: t) if st["slot"] is None else (lambda t: t[st["slot"]])  # noqa: E731
        state_in, win_in = sl(x[st["ph"]]), sl(x[win["ph"]])
        tol = PROBE_TOL.get(val(roles["f"]).dtype, 3e-2)
        # The gate: bounded by one of the region's negative constants, or unbounded (softplus, None).
        bounds = sorted({a for n in nodes for a in n.args if isinstance(a, float) and a < 0}) + [None]
        from lingc.runtime.kernels.kda.naive import kda_chain_reference

        def run(qkv, lb, transposed, rows):
            conv_w = torch.stack([x[roles["pair"][r]].reshape(H * A, 4).float() for r in qkv])
            s0 = state_in.transpose(-1, -2) if transposed else state_in
            return kda_chain_reference(*(x[n].reshape(T, -1)[:rows] for n in qkv),
                                       x[roles["f"]].reshape(T, -1)[:rows], x[roles["b"]].reshape(T, H)[:rows],
                                       conv_w, win_in, x[roles["a_log"]], x[roles["dt_bias"]], s0.contiguous(),
                                       None if lb is None else float(lb))

        # Candidates as (permutation of the q/k/v order, lower bound, state transposed). The
        # assignment that matched the previous layer goes first: a model's KDA layers share one
        # form, and each wrong candidate costs a reference run (flash-tp4-rank: 72 candidates per
        # layer took ~2 s on the CPU, 35 layers per graph). A candidate is screened on position 0
        # alone (o's first row depends on nothing later) before the whole chain is run.
        screen = T > 1 and got[0].dim() > 0 and got[0].shape[0] == T      # o laid out [T, ...]
        perms = list(itertools.permutations(range(3)))
        cands = [(p, lb, tr) for p in perms for lb in bounds for tr in (False, True)]
        hint = getattr(self, "_kda_hint", None)
        if hint in cands:
            cands.remove(hint)
            cands.insert(0, hint)
        for cand in cands:
            perm, lb, transposed = cand
            qkv = tuple(roles["qkv"][i] for i in perm)
            try:
                if screen and cand != hint and rel_err(got[0][:1], run(qkv, lb, transposed, 1).o) > tol:
                    continue
                r = run(qkv, lb, transposed, T)
            except (RuntimeError, ValueError):
                continue
            if rel_err(got[0], r.o) > tol:
                continue
            ref_s = r.stage_states if st["staged"] else r.state
            ref_w = r.stage_windows if st["staged"] else r.window
            if transposed:
                ref_s = ref_s.transpose(-1, -2)
            if rel_err(got[1], ref_s) <= tol and rel_err(got[2], ref_w) <= tol:
                self._kda_hint = cand
                return dict(qkv=qkv, f=roles["f"], conv=[roles["pair"][r] for r in qkv],
                            lb=None if lb is None else float(lb),
                            transposed=transposed, b=roles["b"], a_log=roles["a_log"],
                            dt_bias=roles["dt_bias"])
        return "no assignment of the inputs reproduces the kda_chain reference"

    def _kda_rewrite(self, g, st, win, o, m, T, H, A):
        D = H * A
        order = {n: i for i, n in enumerate(g.nodes)}
        anchor = min([o] + [u for u in st["value"].users if u in st["path"]], key=order.__getitem__)
        with g.inserting_before(anchor):
            def slot_view(ph):
                return ph if st["slot"] is None else emit(g, aten.select.int, ph, 0, st["slot"])
            state, window = slot_view(st["ph"]), slot_view(win["ph"])
            args = [emit(g, aten.reshape.default, n, [T, D]) if shape(n) != (T, D) else n for n in m["qkv"]]
            f = m["f"] if shape(m["f"]) == (T, D) else emit(g, aten.reshape.default, m["f"], [T, D])
            conv_w = [emit(g, aten.reshape.default, c, [D, 4]) for c in m["conv"]]   # read in place
            if m["transposed"]:
                state = emit(g, aten.clone.default, emit(g, aten.transpose.int, state, -1, -2),
                             memory_format=torch.contiguous_format)
            stages = (None, None)
            if st["staged"]:
                stages = (emit(g, aten.new_empty.default, state, [T, H, A, A]),
                          emit(g, aten.new_empty.default, window, [T, 3, D, 3]))
            out = emit(g, lingc_ops.kda_chain.default, *args, f, m["b"], conv_w, window, m["a_log"],
                       m["dt_bias"], state, m["lb"], *stages)
            o_new = out if shape(out) == shape(o) else emit(g, aten.reshape.default, out, list(shape(o)))
            back = emit(g, aten.transpose.int, state, -1, -2) if m["transposed"] else None
        o.replace_all_uses_with(o_new)
        if st["staged"]:
            with g.inserting_before(st["epilogue"]):
                emit(g, lingc_ops.kda_commit.default, state, window, *stages, st["accept"])
            g.erase_node(st["epilogue"])
            g.erase_node(win["epilogue"])
            return
        g.erase_node(win["epilogue"])
        if m["transposed"]:                  # the state is written back from the transposed temporary
            st["value"].replace_all_uses_with(back, delete_user_cb=lambda u: u in st["path"])
            self.notes.append(f"{st['ph'].name}: state stored [V, K]: kda_chain runs on a transposed copy")
        else:
            g.erase_node(st["epilogue"])

    # -- MLA ----------------------------------------------------------------------------------

    def _mla(self, g: fx.Graph) -> int:
        matches = 0
        for n in list(g.nodes):
            if n.graph is None:
                continue
            if self._row_max(n) is not None:
                att, what = self._softmax_attention(n), "softmax"
            elif sdpa_call(n) is not None:
                att, what = self._sdpa_attention(n), "fused attention"
            else:
                continue
            why = att if isinstance(att, str) else self._mla_one(g, *att)
            if why:
                self.notes.append(f"{what} at {n.name}: MLA decode left ({why})")
            else:
                matches += 1
        return matches

    @staticmethod
    def _row_max(n: fx.Node) -> tuple[fx.Node, list[int]] | None:
        """(scores, dims) when n is the maximum a softmax subtracts: amax(s, dims), or the
        values of max(s, dim) (a softmax written out by hand)."""
        if is_call(n, aten.amax.default):
            return n.args[0], list(n.args[1])
        if n.op == "call_function" and n.target is operator.getitem and n.args[1] == 0 \
                and is_call(n.args[0], aten.max.dim):
            return n.args[0].args[0], [n.args[0].args[1]]
        return None

    @classmethod
    def _softmax(cls, amax: fx.Node) -> fx.Node | None:
        s = cls._row_max(amax)[0]
        for sub in amax.users:
            if is_call(sub, aten.sub.Tensor) and sub.args == (s, amax):
                for e in sub.users:
                    if is_call(e, aten.exp.default):
                        for d in e.users:
                            if is_call(d, aten.div.Tensor) and d.args[0] is e and is_call(d.args[1], aten.sum.dim_IntList):
                                return d
        return None

    def _softmax_attention(self, amax: fx.Node) -> tuple | str:
        """(L, H * T * L, pc, other, p) for the softmax whose row maximum is amax: its key
        count, its probabilities' size, the product p @ other that applies it and p."""
        p = self._softmax(amax)
        if p is None or self._row_max(amax)[1] not in ([-1], [len(shape(p)) - 1]):
            return "not a last-dim softmax"
        views = lambda n: n.op == "call_function" and n.target in VIEW_OPS  # noqa: E731
        # Through views, and through the "safe softmax" of scaled_dot_product_attention's math
        # form (where(row fully masked, 0, p): the identity for a causal row, which always sees
        # its own position; the probe runs it).
        probs = lambda n: views(n) or (is_call(n, aten.where.self) and is_call(n.args[1], aten.full.default)  # noqa: E731
                                       and scalar(n.args[1].args[1]) == 0)
        pc = [u for u in descendants([p], probs) if is_call(u, aten.bmm.default, aten.mm.default)]
        if len(pc) != 1:
            return "p is not multiplied by one matrix"
        pc = pc[0]
        other = pc.args[1] if p in ancestors([pc.args[0]]) | {pc.args[0]} else pc.args[0]
        return shape(p)[-1], numel(p), pc, other, p

    @staticmethod
    def _sdpa_attention(n: fx.Node) -> tuple | str:
        """The same for a fused attention op (lingc/sdpa.py; CUDA traces keep one): the
        probabilities stay inside it, their size is H * T * L all the same."""
        c = sdpa_call(n)
        if c.out is None:
            return "its output is not read as one value"
        if c.dropout_p:
            return f"dropout_p={c.dropout_p}"
        if len(shape(c.k) or ()) < 2 or len(shape(c.v) or ()) < 2:
            return "keys or values of unknown shape"
        L, dv = shape(c.k)[-2], shape(c.v)[-1]
        return L, numel(c.out) // dv * L, c.out, c.v, n

    def _mla_one(self, g: fx.Graph, L: int, htl: int, pc: fx.Node, other: fx.Node, p: fx.Node) -> str | None:
        """Rewrite the attention over L keys whose probabilities (H * T * L of them) are p's (or
        inside p, a fused op) and applied to ``other`` at pc, or why not."""
        views = lambda n: n.op == "call_function" and n.target in VIEW_OPS  # noqa: E731
        # Positions are a graph input, or computed on the device from one (metadata_capture's
        # `n + arange(T)` in the relay's graphs): inputs first, then computed int vectors.
        anc = ancestors([p])
        pos_cands = ([a for a in anc if _placeholder(a) and _int_vector(a, htl, L)]
                     + [a for a in anc if not _placeholder(a) and a.op == "call_function" and _int_vector(a, htl, L)])
        expanded = mla_absorb.expansion(other, L)
        if expanded is not None:            # the textbook form: values expanded from the cache
            done = mla_absorb.absorb(g, htl, pc, expanded, pos_cands, _placeholder, PROBE_TOL, MAX_T)
            if isinstance(done, str):
                return done
            self.absorbed += 1
            self.gates_folded += self._fold_head_gate(g, done, *shape(done)[:2])
            return None
        kv, n = None, other
        # Through copies too: SDPA's math form repeats one key/value head for every query head
        # (enable_gqa) as expand + clone.
        while is_call(n, *VIEW_OPS, *CASTS, aten.clone.default):
            if len(shape(n)) == 2 and shape(n)[0] == L:
                kv = n
            n = n.args[0]
        if len(shape(n) or ()) == 2 and shape(n)[0] == L and (kv is None or shape(n)[1] > shape(kv)[1]):
            kv = n                                      # the cache holds one sequence: no slot view
        if kv is None:
            return "the value operand is not a slice of an [L, R + P] cache"
        cache = n                                       # the cache value kv is a view of
        kv_chain = []
        c = kv
        while c is not cache:
            kv_chain.append(c)
            c = c.args[0]
        kv_chain.reverse()
        stops = {cache, *pos_cands}
        local = descendants(stops, lambda n: not is_heavy(n)) - {n for n in g.nodes if is_heavy(n)}
        for pos in pos_cands:
            T = shape(pos)[0]
            H = htl // (L * T)
            R = numel(pc) // (T * H)
            P = shape(kv)[1] - R
            if T > MAX_T or P < 2:
                continue
            o_lat = [u for u in descendants([pc], views) | {pc} if head_layouts(u, T, H, R)]
            if not o_lat:
                continue
            order = {n: i for i, n in enumerate(g.nodes)}
            # The first token-major view of the output when there is one, else the first view.
            o_lat = min(o_lat, key=lambda u: ("th" not in head_layouts(u, T, H, R), order[u]))
            nodes, leaves = region([o_lat], lambda n: n not in local or n in stops)
            widened = []
            for leaf in leaves:
                w, chain = leaf, []
                if leaf not in stops and not _placeholder(leaf):
                    w, chain = widen_leaf(leaf, lambda n: head_layouts(n, T, H, R, P) or _placeholder(n))
                widened.append(w)
                nodes += chain
            leaves = list(dict.fromkeys(widened))
            order = {n: i for i, n in enumerate(g.nodes)}
            nodes = sorted(set(nodes) - set(leaves), key=order.__getitem__)
            q_lat = [n for n in leaves if head_layouts(n, T, H, R) and n not in stops]
            q_rope = [n for n in leaves if head_layouts(n, T, H, P) and n not in stops]
            freq = [n for n in leaves if _placeholder(n) and shape(n) == (P // 2,) and val(n).is_floating_point()]
            known = set(q_lat[:1] + q_rope[:1] + freq[:1] + [cache, pos])
            if len(q_lat) != 1 or len(q_rope) != 1 or len(freq) > 1 or set(leaves) - known or cache not in leaves:
                continue
            layouts = (head_layouts(q_lat[0], T, H, R), head_layouts(q_rope[0], T, H, P),
                       head_layouts(o_lat, T, H, R))
            with real_tensor_mode():
                found = self._mla_probe(nodes, leaves, o_lat, (cache, kv_chain), pos, q_lat[0], q_rope[0],
                                        freq[0] if freq else None, T, L, layouts)
            if found is None:
                continue
            scale, rope, (lat_at, rope_at, o_at) = found
            qr = q_rope[0]
            if rope and is_call(qr, *CASTS) and val(qr.args[0]).dtype in (torch.bfloat16, torch.float16):
                # The region upcasts the raw q_rope, rotates in fp32 and rounds back to its dtype:
                # the kernel does exactly that when handed the raw tensor (and the upcast kernel goes).
                qr = qr.args[0]
            with g.inserting_before(o_lat):
                try:
                    out = emit(g, lingc_ops.mla_decode.default, emit_token_major(g, q_lat[0], lat_at),
                               emit_token_major(g, qr, rope_at), kv, pos, scale, None, freq[0] if rope else None)
                except ValueError as e:
                    return str(e)
                o_new = emit_layout(g, out, o_at)
            o_lat.replace_all_uses_with(o_new)
            self.gates_folded += self._fold_head_gate(g, out, T, H)
            return None
        return "no assignment of the inputs reproduces the mla_decode reference"

    @staticmethod
    def _fold_head_gate(g: fx.Graph, out: fx.Node, T: int, H: int) -> bool:
        """o = (o_lat @ W_uv) * sigmoid(G)[..., None], G [T, H]: the gate moves into mla_decode
        (o_lat * sigmoid(G) before the W_uv product: equal up to fp32 rounding, declared), which
        drops the sigmoid and multiply kernels of every MLA layer."""
        views = lambda n: n.op == "call_function" and (  # noqa: E731  (layout copies included)
            n.target in VIEW_OPS or n.target is aten.clone.default)
        prods = [u for u in descendants([out], views) if is_call(u, aten.bmm.default, aten.mm.default,
                                                                 lingc_ops.head_matmul.default)]
        if len(prods) != 1:
            return False
        n = prods[0]
        while len(n.users) == 1 and views(next(iter(n.users))):
            n = next(iter(n.users))
        if len(n.users) != 1 or (shape(n) or ())[:2] != (T, H):
            return False
        m = next(iter(n.users))
        if not is_call(m, aten.mul.Tensor) or shape(m) != shape(n):
            return False
        s = m.args[1] if m.args[0] is n else m.args[0]
        while is_call(s, *VIEW_OPS):
            s = s.args[0]
        if not is_call(s, aten.sigmoid.default):
            return False
        gate = strip(s.args[0])
        order = {x: i for i, x in enumerate(g.nodes)}
        if shape(gate) != (T, H) or not val(gate).is_floating_point() or order[gate] > order[out]:
            return False
        out.update_arg(5, gate)
        m.replace_all_uses_with(n)
        return True

    def _mla_probe(self, nodes, leaves, o_lat, kv, pos, q_lat, q_rope, freq, T, L, layouts):
        """Once per form of the region, as _kda_probe: (scale, rope, the layouts of q_lat, q_rope
        and o_lat) or None. ``layouts``: each one's candidate layouts (lingc/head_layout.py)."""
        at = {leaf: i for i, leaf in enumerate(leaves)}
        cache, kv_chain = kv
        key = ("mla", region_key(nodes, leaves, [o_lat]), region_key(kv_chain, [cache], kv_chain[-1:]),
               at[cache], at[pos], at[q_lat], at[q_rope], at.get(freq), T, L, tuple(map(tuple, layouts)))
        if key in self._probes and self.reuse_probes:
            self.probes_reused += 1
        else:
            self._probes[key] = self._mla_probe_run(nodes, leaves, o_lat, kv, pos, q_lat, q_rope, freq, T, L, layouts)
        return self._probes[key]

    def _mla_probe_run(self, nodes, leaves, o_lat, kv, pos, q_lat, q_rope, freq, T, L, layouts):
        gen = torch.Generator().manual_seed(0)
        inputs = []
        for n in leaves:
            if n is pos:
                inputs.append(torch.sort(torch.randperm(L, generator=gen)[:T]).values.to(val(pos).dtype))
            elif n is freq:
                inputs.append(torch.rand(shape(n), generator=gen).to(val(n).dtype))
            else:
                inputs.append(random_like(n, gen))
        got = run_region(region_module(nodes, leaves, [o_lat]), inputs)
        if got is None:
            return None
        x = dict(zip(leaves, inputs))
        cache, kv_chain = kv
        kv = kv_chain[-1] if kv_chain else cache
        if kv_chain:
            x[kv] = run_region(region_module(kv_chain, [cache], [kv]), [x[cache]])[0]
        tol = PROBE_TOL.get(val(kv).dtype, 3e-2)
        scales = sorted(softmax_scales(nodes))
        from lingc.runtime.kernels.mla_decode.naive import mla_decode_reference

        for lat_at, rope_at, o_at in itertools.product(*layouts):
            for scale in scales:
                for rope in ((True, False) if freq is not None else (False,)):
                    ref = mla_decode_reference(token_major(x[q_lat], lat_at), token_major(x[q_rope], rope_at),
                                               x[kv], x[pos], scale, None, x[freq] if rope else None)
                    if rel_err(token_major(got[0], o_at), ref) <= tol:
                        return scale, rope, (lat_at, rope_at, o_at)
        return None

    # -- MLA cache write ----------------------------------------------------------------------

    def _kv_writes(self, g: fx.Graph) -> int:
        """Functional row writes of a [slots, L, R + P] cache input (or of a one-sequence [L, R + P]
        one) whose rows are [c ; rope(k)]
        become in-place lingc.mla_kv_write calls (after the norms: c is a lingc.rmsnorm output)."""
        order = {n: i for i, n in enumerate(g.nodes)}
        readers = {ph: set(ph.users) for ph in g.nodes if _placeholder(ph)}
        matches = 0
        for ip in [n for n in g.nodes if is_call(n, aten.index_put.default)]:
            if not val(ip).is_floating_point():
                continue                  # integer rows (the relay's token ring): relay_tail.py's
            why = self._kv_write_one(g, ip, order, readers)
            if why:
                self.notes.append(f"cache write {ip.name} left: {why}")
            else:
                matches += 1
        return matches

    def _kv_write_one(self, g: fx.Graph, ip: fx.Node, order: dict, readers: dict) -> str | None:
        base, indices, rows = ip.args[:3]
        if (len(ip.args) > 3 and ip.args[3]) or len(indices) != 1 or not isinstance(indices[0], fx.Node):
            return "not a row write"
        pos = indices[0]
        if _placeholder(base) and len(shape(base)) == 2:
            ph, scat = base, ip           # a cache of one sequence [L, R + P]: rows written into the input
        elif is_call(base, aten.select.int) and _placeholder(base.args[0]) and base.args[1] == 0:
            ph, slot = base.args[0], base.args[2]
            scat = list(ip.users)
            if (len(scat) != 1 or not is_call(scat[0], aten.select_scatter.default)
                    or scat[0].args[0] is not ph or tuple(scat[0].args[2:4]) != (0, slot)):
                return "the new slot is not scattered back into the cache input"
            scat = scat[0]
        else:
            return "the written rows are not select(cache input, 0, slot) or a 2-d cache input"
        late = [u for u in readers.get(ph, ()) if u not in (base, ip, scat) and order.get(u, -1) > order[ip]
                and not (is_call(u, aten.copy_.default) and u.args[0] is ph)]
        if late or (base is not ph and len(base.users) != 1):
            return "the old cache is read after the write"
        T, W = shape(pos)[0], shape(base)[1]          # rows may reach index_put as a view, e.g. [W] at T = 1
        nodes, leaves = region([rows], lambda n: n is pos or is_heavy(view_base(n)))
        widened = []
        for leaf in leaves:
            w, chain = _widest_part(leaf, T, W)
            widened.append(w)
            nodes += chain
        leaves = list(dict.fromkeys(widened))
        mats = [n for n in leaves if n is not pos and len(shape(n)) == 2 and shape(n)[0] == T]
        if len(mats) != 2 or sum(shape(m)[1] for m in mats) != W:
            return (f"the rows are not built from one [T, R] and one [T, P] value (inputs "
                    f"{[(n.name, shape(n)) for n in leaves]})")
        c, k = sorted(mats, key=lambda m: -shape(m)[1])                   # R (512) > P (64)
        P = shape(k)[1]
        freq = [n for n in leaves if _placeholder(n) and shape(n) == (P // 2,) and val(n).is_floating_point()]
        if len(freq) != 1 or set(leaves) != {c, k, pos, freq[0]} or shape(c)[1] == P:
            return "the rows' inputs are not (latent, key, positions, inv_freq)"
        order2 = {n: i for i, n in enumerate(g.nodes)}
        nodes = sorted(set(nodes) - set(leaves), key=order2.__getitem__)
        from lingc.runtime.kernels.mla_kv_write.naive import mla_kv_rows_reference
        gen = torch.Generator().manual_seed(0)
        with real_tensor_mode():
            x = {n: random_like(n, gen) for n in (c, k)}
            x[pos] = torch.randint(0, 4096, (T,), generator=gen).to(val(pos).dtype)
            x[freq[0]] = torch.rand(P // 2, generator=gen).to(val(freq[0]).dtype)
            got = run_region(region_module(nodes, leaves, [rows]), [x[n] for n in leaves])
            ref = mla_kv_rows_reference(x[c], x[k], x[pos], x[freq[0]], val(rows).dtype)
            ok = got is not None and got[0].numel() == ref.numel()
            err = rel_err(got[0].reshape(ref.shape), ref) if ok else float("inf")
        if err > PROBE_TOL.get(val(rows).dtype, 3e-2):
            return "the rows are not [c ; interleaved rope(k)]"
        with g.inserting_before(ip):
            emit(g, lingc_ops.mla_kv_write.default, c, k, pos, freq[0], base)
        scat.replace_all_uses_with(ph)
        g.erase_node(scat)
        if ip is not scat:
            g.erase_node(ip)
        for u in list(ph.users):
            if is_call(u, aten.copy_.default) and u.args[0] is ph and u.args[1] is ph:
                g.erase_node(u)                                      # the epilogue write-back
        return None

    # -- coverage -----------------------------------------------------------------------------

    def _coverage(self, g: fx.Graph) -> None:
        """PDL coverage (lingc kernels / kernel-launching ops), what stays and why, and each
        layer's chain of lingc ops."""
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
                name = target_name(n.target).split(".")[1]
                ops[name] = ops.get(name, 0) + 1
        for reason, ops in sorted(groups.items(), key=lambda kv: -sum(kv[1].values())):
            detail = ", ".join(f"{k} x{v}" for k, v in sorted(ops.items(), key=lambda kv: (-kv[1], kv[0])))
            self.notes.append(f"left {sum(ops.values())}: {reason} [{detail}]")
        for label, chain in _chains(lingc):
            self.notes.append(f"chain {label}: " + " > ".join(chain))


_ATTN = ("kda_chain", "mla_decode")
_MLP = ("swiglu_gemm_separate", "swiglu_gemm", "moe_experts")


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


def _widest_part(leaf: fx.Node, T: int, W: int) -> tuple[fx.Node, list[fx.Node]]:
    """Walk a leaf up its view chain to the widest [T, w < W] value it is part of (the key's
    [T, P] slice above its even/odd selects): (that node, the views passed)."""
    best, chain, passed, n = leaf, [], [], leaf
    while True:
        s = shape(n) or ()
        if len(s) == 2 and s[0] == T and 0 < s[1] < W:
            best, chain = n, list(passed)
        if not is_call(n, *VIEW_OPS, aten.clone.default, torch.ops.prims.convert_element_type.default):
            return best, chain
        passed.append(n)
        n = n.args[0]


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
        kind = "KDA" if "kda_chain" in ch else "MLA" if "mla_decode" in ch else None
        if kind:
            out.append((f"L{layer} {kind}", ch))
            layer += 1
        else:
            out.append(("head" if out else "embed", ch))
    return out

