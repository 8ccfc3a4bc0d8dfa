"""fused_moe: a whole MoE block (router, routed experts, shared expert, combine) becomes two lingc ops.

    before:  s = sigmoid(x @ Wr.T) ; c = s + bias                    router: ~25 ops, three top-k
             grouped top-k on c -> ids ; w = s[ids] / sum * scale
             y_j = W2[ids_j] @ swiglu(W13[ids_j] @ x)                  experts: whole experts gathered,
             out = sum_j w_j * y_j + Wd @ swiglu(Wg @ x, Wu @ x)       two bmm, a combine chain
                   [the shared term times sigmoid(x @ Wsg.T), Wsg [1, H]: a gated shared expert]
    after:   ids, w = lingc.moe_router(x, Wr, bias, n_group, topk_group, top_k, scale, renorm)
                      (no bias: None; a softmax router: lingc.moe_router(x, Wr, None, 1, 1, top_k, scale, renorm,
                      softmax=True); dropped groups filled with 0.0: zero_fill=True)
             out = lingc.moe_experts(x, ids, w, W13[:, :I], W13[:, I:], W2, Wg, Wu, Wd, L, Ls
                                     [, shared_sigmoid=Wsg])

Matched on the ATen graph by what it computes, never by module names:
- Router: a `gather` of sigmoid scores by top-k indices anchors it; the gate is a linear of a weight
  (mm or linear, on 2-D or reshaped 3-D input, fp32 or bf16, casts anywhere). What selects the
  experts (group scores, masks, fills) is written in many ways, so the subgraph from the scores
  (and the bias) to (ids, weights) is cut out and run on random scores against
  `grouped_topk_reference`, with n_group / topk_group read from its top-k shapes, top_k from the
  ids, renormalisation and scale from the weight chain, and the dropped groups masked with -inf or
  filled with 0.0 (DeepSeek-V3's and Kimi's Hugging Face routers: `moe_router(..., zero_fill=True)`;
  where a fill of 0.0 ties, any of the tied experts is accepted, since torch.topk's choice among
  equal values is unspecified). A different selection fails the check and the router stays as it is.
- Softmax routers (Qwen's MoE blocks): a `topk` over the experts whose input is computed from a
  gate projection through an exp (softmax, decomposed or not), or whose values go through a
  softmax after it (Mistral's reference MoE: the top-k logits softmaxed, which is the renormalised
  top-k of the softmax over all experts), and no sigmoid anchors one; the
  subgraph from the logits to (ids, weights) is run on random logits against
  `softmax_topk_reference` (renormalisation and scale from the weight chain) and becomes
  `lingc.moe_router(..., softmax=True)` with one group.
- Experts: values are traced forward from the block's x, ids and weights with named axes (token t,
  slot k, hidden h, expert e, weight axes), through views, permutes, expands, casts, slices,
  gathers (`index`, `index_select`), `mm`/`bmm` contractions and elementwise ops. This recognises
  a projection of x by the selected experts' weights, a SwiGLU of two of them (any silu spelling,
  clamps), a down projection, and a sum over the slots weighted by the router weights: per-slot
  selects added in order, a weighted `sum`, a contraction over k (einsum), an `index_add_` of
  the flattened (token, slot) pairs into zeros by a token index (`arange(T)` expanded over the
  slots, which also gathers x's rows: Transformers' batched_mm experts), or the dense form (all
  experts, combined by a one-hot or `scatter` of the weights), and Transformers' grouped_mm experts
  (the pairs sorted by expert, `torch._grouped_mm` over the sorted rows with offsets that are
  checked on random ids to be the experts' cumulative row counts, the rows put back by the
  inverse permutation or added by their sorted token index). A SwiGLU MLP of x with 2-D
  weights added to the sum is the shared expert, also behind a sigmoid gate of x (times
  sigmoid(x @ Wsg.T), Wsg [1, H]: Qwen3-Next's shared_expert_gate), which the op then computes in
  its combine. The node that yields the block's output is
  replaced; dead-code elimination removes the rest.

Weights: gate and up are passed as views ([E, I, H] row ranges of a stacked w13, or separate
tensors); nothing is copied or re-laid. A layout the op cannot read without a copy (experts stored
[E, H, I]) leaves the experts untouched, with a note.

Numerics (declared): the router keeps its logits in fp32 (the eager bf16 router rounds them to
bf16 first); the experts op sums the weighted expert outputs and the shared expert in fp32 and
rounds once. Ids are the same up to ties (the kernel's documented tie rule).
Blocks or parts that do not match are left untouched; the pass notes say why.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass

import torch
import torch.fx as fx

from lingc.compat import real_tensor_mode
from lingc.graph_build import emit
from lingc.graph_region import descendants
from lingc.graph_match import CASTS, aten, is_call, prims, scalar, strip, strip_upcasts, unsupported_dtype
from lingc.moe_trace import Down, MoETrace, Proj, atoms, mode
from lingc.pass_manager import LingcPass
from lingc.runtime.kernels import moe_experts as _moe_experts  # noqa: F401  (registers lingc::moe_experts)
from lingc.runtime.kernels import moe_router as _moe_router  # noqa: F401  (registers lingc::moe_router)
from lingc.runtime.kernels.moe_router.op import DTYPES as ROUTER_DTYPES

# ------------------------------------------------------------------------------------------ router
@dataclass
class _Router:
    anchor: fx.Node                 # the gather of the scores by the top-k ids
    x: fx.Node                      # the block input (what the experts read): casts and reshapes stripped
    ids: fx.Node
    weights: fx.Node
    call: tuple | None = None       # moe_router's arguments (x and bias may still need a node)
    why: str = ""
    softmax: bool = False           # a softmax router (moe_router's softmax=True)
    zero_fill: bool = False         # dropped groups filled with 0.0 (moe_router's zero_fill=True)


def _values(n: fx.Node) -> fx.Node:
    """strip, also through selects of a size-1 dim (`(x[None] @ W.T)[0]`)."""
    n = strip(n)
    while is_call(n, aten.select.int) and n.args[0].meta["val"].shape[n.args[1]] == 1:
        n = strip(n.args[0])
    return n


def _gate_linear(logits: fx.Node):
    """(input, weight) of the router's gate projection, or why it is not one."""
    n = _values(logits)
    if is_call(n, aten.addmm.default):
        return "the gate projection has a bias (moe_router takes none)"
    if is_call(n, aten.mm.default):
        a, w = n.args[0], strip(n.args[1])
        if not (is_call(w, aten.permute.default) and list(w.args[1]) == [1, 0]) and not is_call(w, aten.t.default):
            return "the gate weight operand is not a transposed weight"
        w = strip(w.args[0])
    elif is_call(n, aten.linear.default) and (len(n.args) < 3 or n.args[2] is None):
        a, w = n.args[0], strip(n.args[1])
    else:
        return "the scores are not sigmoid of a linear projection"
    if w.op not in ("placeholder", "get_attr") or w.meta["val"].dim() != 2:
        return "the gate weight is computed in the graph"
    return a, w


def _weight_chain(gather: fx.Node) -> tuple[fx.Node, bool, float]:
    """Follow gather -> [/ sum (+ eps)] -> [* scale]: (last node, renormalised, scale)."""
    n, renorm, scale = gather, False, 1.0
    while True:
        steps = []
        for u in n.users:
            if len(u.args) < 2:
                continue
            other = u.args[1] if u.args[0] is n else u.args[0]
            if is_call(u, aten.div.Tensor) and u.args[0] is n and isinstance(other, fx.Node):
                den = strip(other)
                if is_call(den, aten.add.Tensor) and scalar(den.args[1]) is not None and abs(scalar(den.args[1])) < 1e-6:
                    den = strip(den.args[0])
                if is_call(den, aten.sum.dim_IntList) and den.args[0] is n:
                    steps.append((u, True, 1.0))
            elif is_call(u, aten.mul.Tensor) and scalar(other) is not None:
                steps.append((u, False, scalar(other)))
            elif is_call(u, aten.div.Tensor) and u.args[0] is n and scalar(other):
                steps.append((u, False, 1.0 / scalar(other)))
        if len(steps) != 1:
            return n, renorm, scale
        n, r, s = steps[0]
        renorm, scale = renorm or r, scale * s


def _cut(graph: fx.Graph, src: fx.Node, outs: list[fx.Node]):
    """(nodes computing ``outs`` from ``src``, the graph inputs they also read), or why not."""
    needed, leaves, stack = set(), set(), list(outs)
    while stack:
        n = stack.pop()
        if n is src or n in needed or n in leaves:
            continue
        if n.op in ("placeholder", "get_attr"):
            leaves.add(n)
            continue
        if n.op != "call_function":
            return "the expert selection reads a non-op node"
        needed.add(n)
        stack.extend(n.all_input_nodes)
    return needed, leaves


def _cut_module(graph: fx.Graph, inputs: list[fx.Node], needed: set, outs: list[fx.Node]) -> fx.GraphModule:
    """The cut-out nodes ``needed`` (``_cut``) as a module of ``inputs`` returning ``outs``."""
    sub = fx.Graph()
    env = {n: sub.placeholder(n.name) for n in inputs}
    for n in graph.nodes:
        if n in needed:
            env[n] = sub.node_copy(n, lambda a: env[a])
    sub.output(tuple(env[o] for o in outs))
    return fx.GraphModule(torch.nn.Module(), sub)


def _check_selection(graph: fx.Graph, scores: fx.Node, ids: fx.Node, weights: fx.Node,
                     renorm: bool, scale: float):
    """Cut out (ids, weights) as a function of the scores (and a bias) and run it on random scores
    against the reference grouped top-k: (bias node or None, n_group, topk_group, zero_fill), or why
    not."""
    from lingc.runtime.kernels.moe_router.naive import grouped_keys, grouped_topk_reference

    T, E = scores.meta["val"].shape
    K = ids.meta["val"].shape[-1]
    cut = _cut(graph, scores, [ids, weights])
    if isinstance(cut, str):
        return cut
    needed, leaves = cut
    bias = [n for n in leaves if isinstance(v := n.meta.get("val"), torch.Tensor) and v.shape == (E,)
            and v.is_floating_point()]
    if len(leaves) > 1 or len(bias) != len(leaves):
        return "the expert selection reads graph inputs other than the scores and an [E] bias"
    bias = bias[0] if bias else None

    groups, kept = set(), set()
    for n in needed:
        if is_call(n, aten.topk.default):
            shape, k = n.args[0].meta["val"].shape, n.args[1]
            if len(shape) == 3 and shape[-2] * shape[-1] == E and k == 2:
                groups.add(shape[-2])
            elif len(shape) == 2 and shape[-1] != E:
                kept.add((shape[-1], k))
    candidates = [(g, tg) for g in sorted(groups) for g2, tg in sorted(kept) if g2 == g] + [(1, 1)]

    fn = _cut_module(graph, [scores] + ([bias] if bias is not None else []), needed, [ids, weights])

    sv = scores.meta["val"]
    with real_tensor_mode(), torch.no_grad():
        gen = torch.Generator().manual_seed(0)
        trials = []
        for shift in (0.0, -3.0, 0.5):    # all-negative biased scores tell a -inf mask from a 0 fill
            s = torch.rand(T, E, generator=gen).to(sv.device, sv.dtype)
            b = torch.randn(E, generator=gen) * 0.3 + shift
            b = b.to(sv.device, bias.meta["val"].dtype) if bias is not None else torch.zeros(E, device=sv.device)
            try:
                got = fn(s, b) if bias is not None else fn(s)
            except RuntimeError as e:
                return f"the expert selection does not run on its own ({type(e).__name__})"
            trials.append((s, b, got))
        for g, tg in candidates:
            for zero_fill in (False, True):
                if all(_same_routing(got, grouped_topk_reference(s.float(), b.float(), g, tg, K, scale, renorm,
                                                                 zero_fill), grouped_keys(s, b, g, tg, zero_fill), s,
                                     renorm, scale)
                       for s, b, got in trials):
                    return bias, g, tg, zero_fill
    return "the expert selection is not the sigmoid grouped top-k (checked on random scores)"


def _check_group_ends(graph: fx.Graph, ids: fx.Node, ends: fx.Node, E: int) -> str | None:
    """None when ``ends`` (a grouped_mm's offs) computed from the block's ids alone equals the
    cumulative row counts of the E experts, checked on random ids (many pairs on one expert, the
    first and last expert taken); else why not."""
    why = "the grouped_mm offsets are not the cumulative row counts of the selected experts (checked on random ids)"
    cut = _cut(graph, ids, [ends])
    if isinstance(cut, str) or cut[1] or ends.meta["val"].shape != (E,):
        return why
    fn = _cut_module(graph, [ids], cut[0], [ends])
    iv = ids.meta["val"]
    with real_tensor_mode(), torch.no_grad():
        gen = torch.Generator().manual_seed(0)
        for trial in range(3):
            r = torch.randint(0, E, tuple(iv.shape), generator=gen)
            if trial == 1:
                r[..., :] = r.flatten()[0]
            elif trial == 2:
                r.view(-1)[0], r.view(-1)[-1] = 0, E - 1
            try:
                got = fn(r.to(iv.device, iv.dtype))[0]
            except RuntimeError:
                return why
            want = torch.cumsum(torch.bincount(r.flatten(), minlength=E), 0)
            if got.shape != want.shape or not torch.equal(got.cpu().long(), want):
                return why
    return None


def _same_routing(got, ref, keys=None, scores=None, renorm=False, scale=1.0) -> bool:
    """Same experts per token with the same weights, in any slot order. With ``keys`` (the
    selection's, [T, E]) and the ``scores``: where keys tie at the selection's edge (a fill of 0.0),
    other experts of the same keys are accepted too (torch.topk picks among equal values in an
    unspecified order), with their own scores as weights (renormalised, scaled)."""
    (gi, gw), (ri, rw) = got, ref
    if gi.shape != ri.shape or gw.shape != rw.shape:
        return False
    go, ro = gi.long().sort(-1), ri.long().sort(-1)
    if torch.equal(go.values, ro.values):
        return torch.allclose(gw.float().gather(1, go.indices), rw.float().gather(1, ro.indices), rtol=1e-4, atol=1e-6)
    ids = go.values
    if keys is None or (ids[:, 1:] == ids[:, :-1]).any() or ids.min() < 0 or ids.max() >= keys.shape[1]:
        return False
    if not torch.equal(keys.gather(1, ids).sort(-1).values, keys.gather(1, ro.values).sort(-1).values):
        return False
    w = scores.float().gather(1, ids)
    w = (w / w.sum(-1, keepdim=True) if renorm else w) * scale
    return torch.allclose(gw.float().gather(1, go.indices), w, rtol=1e-4, atol=1e-6)


def _softmax_router(graph: fx.Graph, tk: fx.Node, order: dict) -> _Router | None:
    """A softmax router anchored at ``tk`` = topk(f(logits), K) over the experts (Qwen's MoE
    blocks: topk(softmax(x @ Wr.T)), the values renormalised or not): None when this topk is not
    one (no gate projection, no exp between it and the projection: a sigmoid router's topks),
    else the router, with ``why`` when its selection is not softmax_topk_reference's."""
    from lingc.runtime.kernels.moe_router.naive import softmax_topk_reference

    probs, K = tk.args[0], tk.args[1]
    dim = tk.args[2] if len(tk.args) > 2 else tk.kwargs.get("dim", -1)
    largest = tk.args[3] if len(tk.args) > 3 else tk.kwargs.get("largest", True)
    gets = {u.args[1]: u for u in tk.users if u.target is operator.getitem}
    if 1 not in gets or 0 not in gets or probs.meta["val"].dim() != 2 or dim not in (-1, 1) or not largest:
        return None
    T, E = probs.meta["val"].shape
    ids, vals = gets[1], gets[0]
    # The logits: the nearest gate projection [T, E] behind the probabilities, searched back
    # through [T, E] and [T, 1] values only (a softmax's pieces), so the walk stays local.
    lins, seen, stack = [], set(), [probs]
    while stack:
        n = stack.pop()
        v = n.meta.get("val")
        if n in seen or n.op != "call_function" or not isinstance(v, torch.Tensor) or v.dim() != 2 \
                or v.shape[0] != T or v.shape[1] not in (1, E):
            continue
        seen.add(n)
        lin = _gate_linear(n) if v.shape[1] == E and not is_call(n, *CASTS) else "not a projection"
        if not isinstance(lin, str):
            lins.append((n, lin))
            continue
        stack.extend(n.all_input_nodes)
    if not lins:
        return None
    logits, (a, gate_w) = max(lins, key=lambda nl: order[nl[0]])
    weights, renorm, scale = _weight_chain(vals)
    cut = _cut(graph, logits, [ids, weights])
    if isinstance(cut, str):
        return None
    needed, leaves = cut
    if not any(is_call(n, aten.exp.default, aten._softmax.default) for n in needed):
        # The top-k of the logits, then a softmax over the k values (Mistral's reference MoE):
        # the renormalised top-k of the softmax over all experts, the same selection and weights.
        soft = _softmax_of(vals)
        if soft is None:
            return None
        weights, _, scale = _weight_chain(soft)
        renorm = True
        cut = _cut(graph, logits, [ids, weights])
        if isinstance(cut, str):
            return None
        needed, leaves = cut
    if any(is_call(n, aten.sigmoid.default) for n in needed):
        return None
    r = _Router(tk, strip_upcasts(a), ids, weights, softmax=True)
    if leaves:
        r.why = "the softmax selection reads graph inputs other than the logits"
        return r
    fn = _cut_module(graph, [logits], needed, [ids, weights])
    lv = logits.meta["val"]
    with real_tensor_mode(), torch.no_grad():
        gen = torch.Generator().manual_seed(0)
        for spread in (1.0, 4.0):
            lg = (torch.randn(T, E, generator=gen) * spread).to(lv.device, lv.dtype)
            try:
                got = fn(lg)
            except RuntimeError as e:
                r.why = f"the softmax selection does not run on its own ({type(e).__name__})"
                return r
            if not _same_routing(got, softmax_topk_reference(lg.float(), K, scale, renorm)):
                r.why = "the expert selection is not the top-k of a softmax (checked on random logits)"
                return r
    if gate_w.meta["val"].dtype not in (r.x.meta["val"].dtype, a.meta["val"].dtype):
        r.why = "the gate weight's dtype is neither x's nor the gate input's"
    elif why := unsupported_dtype("moe_router", gate_w.meta["val"].dtype, ROUTER_DTYPES):
        r.why = why
    else:
        rx = r.x if r.x.meta["val"].dtype == gate_w.meta["val"].dtype else a
        r.call = (rx, gate_w, None, 1, 1, K, float(scale), renorm)
    return r


def _softmax_of(vals: fx.Node) -> fx.Node | None:
    """The softmax over the last dim of ``vals`` (through casts): aten._softmax, or its
    decomposition exp(v - amax(v)) / sum(exp(v - amax(v))) (the max subtracted or not), of v
    itself or of v times a constant; None when ``vals`` feeds none. The probe then checks what it
    computes (a temperature other than 1 changes the weights and fails it)."""
    stack, seen = [vals], set()
    while stack:
        for u in stack.pop().users:
            if u in seen:
                continue
            seen.add(u)
            if is_call(u, aten._softmax.default) and u.args[1] in (-1, 1):
                return u
            if is_call(u, aten.div.Tensor) and is_call(u.args[0], aten.exp.default) \
                    and is_call(u.args[1], aten.sum.dim_IntList) and u.args[1].args[0] is u.args[0]:
                return u
            scaled = is_call(u, aten.mul.Tensor, aten.div.Tensor) and any(scalar(a) is not None for a in u.args[:2])
            if scaled or is_call(u, *CASTS, aten.sub.Tensor, aten.exp.default, aten.amax.default):
                stack.append(u)
    return None


def _find_routers(graph: fx.Graph) -> list[_Router]:
    routers = []
    order = {n: i for i, n in enumerate(graph.nodes)}
    for tk in [n for n in graph.nodes if is_call(n, aten.topk.default)]:
        r = _softmax_router(graph, tk, order)
        if r is not None:
            routers.append(r)
    for g in graph.nodes:
        if not is_call(g, aten.gather.default) or g.args[1] not in (1, -1):
            continue
        scores, ids = strip(g.args[0]), g.args[2]
        if not (is_call(scores, aten.sigmoid.default) and isinstance(ids, fx.Node) and ids.target is operator.getitem
                and ids.args[1] == 1 and is_call(ids.args[0], aten.topk.default)
                and scores.meta["val"].dim() == 2 and ids.meta["val"].dim() == 2):
            continue
        lin = _gate_linear(scores.args[0])
        if isinstance(lin, str):
            routers.append(_Router(g, None, ids, g, why=lin))
            continue
        a, gate_w = lin
        weights, renorm, scale = _weight_chain(g)
        r = _Router(g, strip_upcasts(a), ids, weights)
        checked = _check_selection(graph, scores, ids, weights, renorm, scale)
        if isinstance(checked, str):
            r.why = checked
        elif gate_w.meta["val"].dtype not in (r.x.meta["val"].dtype, a.meta["val"].dtype):
            r.why = "the gate weight's dtype is neither x's nor the gate input's"
        elif why := unsupported_dtype("moe_router", gate_w.meta["val"].dtype, ROUTER_DTYPES):
            r.why = why
        else:
            bias, n_group, topk_group, r.zero_fill = checked
            rx = r.x if r.x.meta["val"].dtype == gate_w.meta["val"].dtype else a
            r.call = (rx, gate_w, bias, n_group, topk_group, ids.meta["val"].shape[-1], float(scale), renorm)
        routers.append(r)
    return routers


# ------------------------------------------------------------------------------------------ pass
def _weights_layout_why(routed: Down, shared: Down | None) -> str | None:
    """Why moe_experts cannot read these weights as they are stored, or None."""
    def ok(p: Proj | Down, dim: int, contract: int, other: int) -> bool:
        val = p.param.meta["val"]
        axis = p.row_axis if isinstance(p, Proj) else p.out_axis
        return val.dim() == dim and p.contract == contract and axis == other and val.stride(contract) == 1
    act = routed.act
    if not (ok(act.gate, 3, 2, 1) and ok(act.up, 3, 2, 1)):
        return "expert gate/up weights are not stored [E, I, H] (moe_experts reads rows; no relayout)"
    if not ok(routed, 3, 2, 1):
        return "expert down weights are not stored [E, H, I]"
    if shared is not None and not (ok(shared.act.gate, 2, 1, 0) and ok(shared.act.up, 2, 1, 0)
                                   and ok(shared, 2, 1, 0)):
        return "shared expert weights are not stored [I, H] / [H, I]"
    if shared is not None and shared.sigmoid_w is not None and shared.sigmoid_w.meta["val"].stride(-1) != 1:
        return "the shared expert's sigmoid gate weight [1, H] is not contiguous along H"
    return None


class FusedMoE(LingcPass):
    name = "fused_moe"
    tolerance = (1e-4, 2e-2)

    def apply(self, gm: fx.GraphModule) -> int:

        graph = gm.graph
        routers = _find_routers(graph)
        blocks = []        # (router, ids and weights the experts read, moe_router's (ids, weights) or None)
        for r in routers:
            if r.x is None:
                self.notes.append(f"%{r.anchor.name}: not a MoE router: {r.why}")
                continue
            if r.call is None:
                self.notes.append(f"%{r.anchor.name}: router left as ATen ops: {r.why}")
                blocks.append((r, r.ids, r.weights, None))
                continue
            try:
                blocks.append((r, *self._router(graph, r)))
            except ValueError as e:      # moe_router refused an argument; nothing was replaced yet
                self.notes.append(f"%{r.anchor.name}: router left as ATen ops: moe_router refused the inputs ({e})")
                blocks.append((r, r.ids, r.weights, None))
        n_routers, n_experts, n_shared, n_gated = sum(1 for *_, new in blocks if new is not None), 0, 0, 0
        op = torch.ops.lingc.moe_experts.default
        if blocks:
            trace = MoETrace(graph, [(r.x, ids, w) for r, ids, w, _ in blocks])
            for b, (r, ids, w, new) in enumerate(blocks):
                done = self._experts(graph, trace, b, r.x, ids, w, new, op)
                if isinstance(done, str):
                    self.notes.append(f"%{r.x.name}: experts left as ATen ops: {done}")
                else:
                    n_experts, n_shared, n_gated = n_experts + 1, n_shared + (done > 0), n_gated + (done > 1)
        if n_routers or n_experts:
            gated = f", {n_gated} of them gated" if n_gated else ""
            self.notes.insert(0, f"{n_routers} routers, {n_experts} expert blocks ({n_shared} with shared expert{gated})")
        return n_routers + n_experts

    def _router(self, graph: fx.Graph, r: _Router):
        """Emit moe_router after the old ids; old ids and weights are read from it from then on."""
        rx, gate_w, bias, *consts = r.call
        H = gate_w.meta["val"].shape[1]
        with graph.inserting_before(r.ids.next):
            if rx.meta["val"].dim() != 2:
                rx = emit(graph, aten.view.default, rx, [-1, H])
            pair = emit(graph, torch.ops.lingc.moe_router.default, rx, gate_w, bias, *consts,
                        **({"softmax": True} if r.softmax else {}), **({"zero_fill": True} if r.zero_fill else {}))
            ids, w = emit(graph, operator.getitem, pair, 0), emit(graph, operator.getitem, pair, 1)
            old_ids = emit(graph, prims.convert_element_type.default, ids, r.ids.meta["val"].dtype)
            old_w = w
            if r.weights.meta["val"].dtype != torch.float32:
                old_w = emit(graph, prims.convert_element_type.default, w, r.weights.meta["val"].dtype)
        r.ids.replace_all_uses_with(old_ids)
        r.weights.replace_all_uses_with(old_w)
        return old_ids, old_w, (ids, w)

    def _experts(self, graph: fx.Graph, trace: MoETrace, b: int, x: fx.Node, ids: fx.Node, w: fx.Node,
                 new: tuple | None, op) -> int | str:
        """Replace block b's output by one moe_experts call: 1 with the shared expert in (2 with a
        gated one), 0 without, or why not. `new` holds moe_router's (ids, weights) when the router
        was rewritten."""
        final, best, kinds = None, 0, set()
        for n, v in trace.v.items():
            if v.block != b:
                continue
            complete = v.kind == "moe" or (v.kind == "routed" and v.info[1] == frozenset(range(trace.K[b])))
            kinds.add(v.kind if mode(v) != "plain" and (v.kind != "routed" or complete) else "")
            rank = (v.kind == "moe") + complete
            if rank and rank >= best:             # the latest node of the highest rank: casts, views
                final, best = n, rank
        if final is None:
            if any(is_call(n, aten.nonzero.default) for n in descendants([ids])):
                return ("the experts run on data-dependent rows (a loop over the experts on the rows "
                        "torch.where / nonzero picks, as Hugging Face's eager experts do): left to ATen; "
                        "gather stacked experts by the ids instead (Transformers: "
                        "experts_implementation='batched_mm' or 'grouped_mm')")
            return _missing(kinds)
        v = trace.v[final]
        routed, shared = v.info if v.kind == "moe" else (v.info[0], None)
        if [a[0] for a in atoms(v.dims)] not in (["t", "h"], ["h"]) or v.fixed:
            return "the block's output is not laid out [T, H]"
        why = _weights_layout_why(routed, shared)
        mlps = [routed] + ([shared] if shared is not None else [])
        gate_w = [shared.sigmoid_w] if shared is not None and shared.sigmoid_w is not None else []
        if why is None and any(p.meta["val"].dtype != x.meta["val"].dtype
                               for d in mlps for p in (d.act.gate.param, d.act.up.param, d.param, *gate_w)):
            why = "expert weights and x have different dtypes"
        E = routed.param.meta["val"].shape[0]
        for ends in sorted(trace.group_ends.get(b, ()), key=lambda n: n.name):
            why = why or _check_group_ends(graph, ids, ends, E)
        if why:
            return why
        with graph.inserting_before(final):
            if x.meta["val"].dim() != 2:
                x = emit(graph, aten.view.default, x, [-1, x.meta["val"].shape[-1]])
            if new is not None:
                ids, w = new
            else:
                ids = emit(graph, prims.convert_element_type.default, ids, torch.int32)
                if w.meta["val"].dtype != torch.float32:
                    w = emit(graph, prims.convert_element_type.default, w, torch.float32)
            args = [x, ids, w]
            for d in mlps:
                args += [_row_view(graph, d.act.gate), _row_view(graph, d.act.up), d.param]
            args += [None] * (9 - len(args)) + [float(routed.act.limit), float(shared.act.limit if shared else 0.0)]
            out = emit(graph, op, *args, **({"shared_sigmoid": gate_w[0]} if gate_w else {}))
            want = final.meta["val"]
            if want.dtype != out.meta["val"].dtype:
                out = emit(graph, prims.convert_element_type.default, out, want.dtype)
            if list(want.shape) != list(out.meta["val"].shape):
                out = emit(graph, aten.view.default, out, list(want.shape))
        final.replace_all_uses_with(out)
        return int(shared is not None) + bool(gate_w)


def _row_view(graph: fx.Graph, p: Proj) -> fx.Node:
    """The projection's weight rows: the parameter itself, or a slice of it (a view, never a copy)."""
    if p.rows == (0, p.param.meta["val"].shape[p.row_axis]):
        return p.param
    return emit(graph, aten.slice.Tensor, p.param, p.row_axis, *p.rows)


def _missing(kinds: set) -> str:
    """The first stage of the experts' computation that was not found."""
    for kind, why in (("proj", "no projection of x by the selected experts' weights"),
                      ("act", "the expert projections do not form a SwiGLU"),
                      ("down", "no down projection of the expert activations"),
                      ("routed", "the expert outputs are not summed over all slots with the router weights")):
        if kind not in kinds:
            return why
    return "no complete MoE output"
