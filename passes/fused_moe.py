"""fused_moe: a whole MoE block (router, routed experts, shared expert, combine) becomes two lingc ops.

    before:  s = sigmoid(x @ Wr.T) ; c = s + bias                    router: ~25 ops, three top-k
             grouped top-k on c -> ids ; w = s[ids] / sum * scale
             y_j = W2[ids_j] @ swiglu(W13[ids_j] @ x)                  experts: whole experts gathered,
             out = sum_j w_j * y_j + Wd @ swiglu(Wg @ x, Wu @ x)       two bmm, a combine chain
    after:   ids, w = lingc.moe_router(x, Wr, bias, n_group, topk_group, top_k, scale, renorm)
             out = lingc.moe_experts(x, ids, w, W13[:, :I], W13[:, I:], W2, Wg, Wu, Wd, L, Ls)

Matched on the ATen graph by what it computes, never by module names:
- Router: a `gather` of sigmoid scores by top-k indices anchors it; the gate is a linear of a weight
  (mm or linear, on 2-D or reshaped 3-D input, fp32 or bf16, casts anywhere). What selects the
  experts (group scores, masks, fills) is written in many ways, so the subgraph from the scores
  (and the bias) to (ids, weights) is cut out and run on random scores against
  `grouped_topk_reference`, with n_group / topk_group read from its top-k shapes, top_k from the
  ids, renormalisation and scale from the weight chain. A different selection (e.g. masking with
  0 instead of -inf) fails the check and the router stays as it is.
- Experts: values are traced forward from the block's x, ids and weights with named axes (token t,
  slot k, hidden h, expert e, weight axes), through views, permutes, expands, casts, slices,
  gathers (`index`, `index_select`), `mm`/`bmm` contractions and elementwise ops. This recognises
  a projection of x by the selected experts' weights, a SwiGLU of two of them (any silu spelling,
  clamps), a down projection, and a sum over the slots weighted by the router weights: per-slot
  selects added in order, a weighted `sum`, a contraction over k (einsum), or the dense form
  (all experts, combined by a one-hot or `scatter` of the weights). A SwiGLU MLP of x with 2-D
  weights added to the sum is the shared expert. The node that yields the block's output is
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
from dataclasses import dataclass, replace
from typing import Any

import torch
import torch.fx as fx

from lingc.compat import real_tensor_mode
from lingc.graph_build import emit
from lingc.graph_match import aten, clamp_bounds, is_call, prims, scalar, silu_input, strip
from lingc.pass_manager import LingcPass

CASTS = {prims.convert_element_type.default, aten._to_copy.default}
REGROUP = {aten.view.default, aten.reshape.default, aten._unsafe_view.default, aten.unsqueeze.default,
           aten.squeeze.dim, aten.squeeze.dims, aten.squeeze.default, aten.clone.default, aten.alias.default}
ELEMENTWISE = {aten.neg.default, aten.exp.default, aten.sigmoid.default, aten.silu.default,
               aten.clamp.default, aten.clamp_min.default, aten.clamp_max.default, aten.minimum.default,
               aten.maximum.default, aten.add.Tensor, aten.sub.Tensor, aten.mul.Tensor, aten.div.Tensor,
               aten.reciprocal.default}


# ------------------------------------------------------------------------------------------ router
@dataclass
class _Router:
    anchor: fx.Node                 # the gather of the scores by the top-k ids
    x: fx.Node                      # the block input (what the experts read): casts and reshapes stripped
    ids: fx.Node
    weights: fx.Node
    call: tuple | None = None       # moe_router's arguments (x and bias may still need a node)
    why: str = ""


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


def _check_selection(graph: fx.Graph, scores: fx.Node, ids: fx.Node, weights: fx.Node,
                     renorm: bool, scale: float):
    """Cut out (ids, weights) as a function of the scores (and a bias) and run it on random scores
    against the reference grouped top-k: (bias node or None, n_group, topk_group), or why not."""
    from lingc.runtime.kernels.moe_router.naive import grouped_topk_reference

    T, E = scores.meta["val"].shape
    K = ids.meta["val"].shape[-1]
    needed, leaves, stack = set(), set(), [ids, weights]
    while stack:
        n = stack.pop()
        if n is scores or n in needed or n in leaves:
            continue
        if n.op in ("placeholder", "get_attr"):
            leaves.add(n)
            continue
        if n.op != "call_function":
            return "the expert selection reads a non-op node"
        needed.add(n)
        stack.extend(n.all_input_nodes)
    bias = [n for n in leaves if n.meta["val"].shape == (E,) and n.meta["val"].is_floating_point()]
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

    sub = fx.Graph()
    env = {scores: sub.placeholder("scores")}
    if bias is not None:
        env[bias] = sub.placeholder("bias")
    for n in graph.nodes:
        if n in needed:
            env[n] = sub.node_copy(n, lambda a: env[a])
    sub.output((env[ids], env[weights]))
    fn = fx.GraphModule(torch.nn.Module(), sub)

    sv = scores.meta["val"]
    with real_tensor_mode(), torch.no_grad():
        gen = torch.Generator().manual_seed(0)
        trials = []
        for shift in (0.0, -3.0, 0.5):    # all-negative biased scores tell a -inf mask from a 0 fill
            s = torch.rand(T, E, generator=gen).to(sv.device, sv.dtype)
            b = torch.randn(E, generator=gen) * 0.3 + shift
            b = b.to(sv.device, bias.meta["val"].dtype) if bias is not None else torch.zeros(E, device=sv.device)
            got = fn(s, b) if bias is not None else fn(s)
            trials.append((s, b, got))
        for g, tg in candidates:
            if all(_same_routing(got, grouped_topk_reference(s.float(), b.float(), g, tg, K, scale, renorm))
                   for s, b, got in trials):
                return bias, g, tg
    return "the expert selection is not the sigmoid grouped top-k (checked on random scores)"


def _same_routing(got, ref) -> bool:
    """Same experts per token with the same weights, in any slot order."""
    (gi, gw), (ri, rw) = got, ref
    if gi.shape != ri.shape or gw.shape != rw.shape:
        return False
    go, ro = gi.long().sort(-1), ri.long().sort(-1)
    return torch.equal(go.values, ro.values) and torch.allclose(
        gw.float().gather(1, go.indices), rw.float().gather(1, ro.indices), rtol=1e-4, atol=1e-6)


def _find_routers(graph: fx.Graph) -> list[_Router]:
    routers = []
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
        r = _Router(g, strip(a), ids, weights)
        checked = _check_selection(graph, scores, ids, weights, renorm, scale)
        if isinstance(checked, str):
            r.why = checked
        elif gate_w.meta["val"].dtype not in (r.x.meta["val"].dtype, a.meta["val"].dtype):
            r.why = "the gate weight's dtype is neither x's nor the gate input's"
        else:
            bias, n_group, topk_group = checked
            rx = r.x if r.x.meta["val"].dtype == gate_w.meta["val"].dtype else a
            r.call = (rx, gate_w, bias, n_group, topk_group, ids.meta["val"].shape[-1], float(scale), renorm)
        routers.append(r)
    return routers


# ------------------------------------------------------------------------- axis-tracing of values
# An atom is one named axis: ('t', T) token, ('k', K) slot, ('h', H) hidden, ('e', E) expert,
# ('r', n) rows of a projection, ('*', n) a broadcast axis not yet aligned, and
# ('w', param, axis, start, end) an axis of a weight parameter. Size-1 axes are never stored.
# A layout is a tuple of dims, a dim a tuple of atoms merged in row-major order.
def _size(a) -> int:
    return a[4] - a[3] if a[0] == "w" else a[1]


def _atoms(dims) -> list:
    return [a for d in dims for a in d]


def _dsize(d) -> int:
    s = 1
    for a in d:
        s *= _size(a)
    return s


def _regroup(atoms, shape):
    out, i = [], 0
    for s in shape:
        grp, p = [], 1
        while p < s and i < len(atoms):
            p *= _size(atoms[i])
            grp.append(atoms[i])
            i += 1
        if p != s:
            return None
        out.append(tuple(grp))
    return tuple(out) if i == len(atoms) else None


def _unify(a, b):
    if a == b:
        return a
    if len(a) != len(b):
        return None
    out = []
    for x, y in zip(a, b):
        if x == y or (y[0] == "*" and _size(x) == y[1]):
            out.append(x)
        elif x[0] == "*" and _size(y) == x[1]:
            out.append(y)
        else:
            return None
    return tuple(out)


def _align(layouts):
    """Broadcast layouts against each other (from the right), or None."""
    n = max(len(d) for d in layouts)
    out = []
    for i in range(n):
        dim = ()
        for dims in layouts:
            d = dims[i - n + len(dims)] if i - n + len(dims) >= 0 else ()
            if d == ():
                continue
            dim = d if dim == () else _unify(dim, d)
            if dim is None:
                return None
        out.append(dim)
    return tuple(out)


def _merge_fixed(*values):
    fixed: dict = {}
    for v in values:
        for label, j in v.fixed:
            if fixed.setdefault(label, j) != j:
                return None
    return frozenset(fixed.items())


@dataclass(frozen=True)
class Proj:          # x @ param[..rows..].T along `contract`, per expert ('ids', 'dense') or 'plain'
    param: fx.Node
    contract: int
    row_axis: int
    rows: tuple[int, int]
    mode: str


@dataclass(frozen=True)
class Act:           # swiglu(gate, up) clamped at limit
    gate: Proj
    up: Proj
    limit: float


@dataclass(frozen=True)
class Down:          # param @ act along `contract`, output along out_axis
    act: Act
    param: fx.Node
    contract: int
    out_axis: int


@dataclass(frozen=True)
class V:
    kind: str        # x ids w param gw proj expr act down weighted routed moe onehot onehot_w dense_w tuple
    dims: tuple
    block: int | None = None
    fixed: frozenset = frozenset()     # axes pinned to one index: (('k', j),) for a single slot
    info: Any = None


class _Trace:
    """Forward dataflow over the graph from each block's seeds (x, ids, weights), with named axes."""

    def __init__(self, graph: fx.Graph, seeds: list[tuple[fx.Node, fx.Node, fx.Node]]):
        self.v: dict[fx.Node, V] = {}
        self.H, self.K = {}, {}
        for b, (x, ids, w) in enumerate(seeds):
            H, (T, K) = x.meta["val"].shape[-1], ids.meta["val"].shape
            self.H[b], self.K[b] = H, K
            t, k = [("t", T)] if T > 1 else [], [("k", K)] if K > 1 else []
            for node, kind, atoms in ((x, "x", t + [("h", H)]), (ids, "ids", t + k), (w, "w", t + k)):
                dims = _regroup(atoms, node.meta["val"].shape)
                if dims is not None:
                    self.v[node] = V(kind, dims, b)
        for n in graph.nodes:
            if n.op == "call_function" and n not in self.v:
                val = self._eval(n)
                if val is not None and (val.kind == "tuple" or self._fits(val, n)):
                    self.v[n] = val

    @staticmethod
    def _fits(val: V, n: fx.Node) -> bool:
        shape = getattr(n.meta.get("val"), "shape", None)
        return shape is not None and [_dsize(d) for d in val.dims] == list(shape)

    def get(self, a) -> V | None:
        if not isinstance(a, fx.Node):
            return None
        if a in self.v:
            return self.v[a]
        val = a.meta.get("val")
        if a.op in ("placeholder", "get_attr") and isinstance(val, torch.Tensor) and val.is_floating_point() \
                and val.dim() in (2, 3):
            axes = [("w", a, i, 0, s) for i, s in enumerate(val.shape)]
            if val.dim() == 3:
                axes[0] = ("e", val.shape[0])
            self.v[a] = V("param", tuple((x,) if _size(x) > 1 else () for x in axes))
            return self.v[a]
        return None

    def _eval(self, n: fx.Node) -> V | None:
        t = n.target
        if t in REGROUP or t in CASTS or t in (aten.permute.default, aten.t.default, aten.transpose.int,
                                                aten.expand.default, aten.slice.Tensor, aten.select.int):
            return self._layout(n)
        if t in (aten.split.Tensor, aten.split_with_sizes.default):
            return self._split(n)
        if t is operator.getitem:
            src = self.get(n.args[0])
            return src.info[n.args[1]] if src is not None and src.kind == "tuple" else None
        if t in (aten.mm.default, aten.bmm.default):
            return self._contract(n)
        if t in (aten.index.Tensor, aten.index_select.default):
            return self._gather(n)
        if t is aten.scatter.src:
            return self._scatter(n)
        if t is aten.eq.Tensor:
            return self._one_hot(n)
        if t is aten.sum.dim_IntList:
            return self._sum(n)
        if t in ELEMENTWISE:
            return self._elementwise(n)
        return None

    # ---------------------------------------------------------------------------- layout ops
    def _layout(self, n: fx.Node) -> V | None:
        src, t = self.get(n.args[0]), n.target
        if src is None or src.kind == "tuple":
            return None
        shape = list(n.meta["val"].shape)
        if t in CASTS:
            ok = t is prims.convert_element_type.default or set(n.kwargs) <= {"dtype"}
            return src if ok else None
        if t in REGROUP:
            dims = _regroup(_atoms(src.dims), shape)
        elif t is aten.permute.default:
            dims = tuple(src.dims[p % len(src.dims)] for p in n.args[1])
        elif t is aten.t.default or t is aten.transpose.int:
            d0, d1 = (0, 1) if t is aten.t.default else (n.args[1] % len(src.dims), n.args[2] % len(src.dims))
            dims = list(src.dims)
            dims[d0], dims[d1] = dims[d1], dims[d0]
            dims = tuple(dims)
        elif t is aten.expand.default:
            dims = []
            for d, s in zip(((),) * (len(shape) - len(src.dims)) + src.dims, shape):
                dims.append((("*", s),) if d == () and s > 1 else d if _dsize(d) == s else None)
            dims = None if None in dims else tuple(dims)
        elif t is aten.select.int:
            dim, j = n.args[1] % len(src.dims), n.args[2]
            d = src.dims[dim]
            rest = src.dims[:dim] + src.dims[dim + 1:]
            if d == ():
                return replace(src, dims=rest)
            if len(d) == 1 and d[0][0] == "k":
                return self._pin(src, rest, j % d[0][1])
            return None
        else:
            args = list(n.args) + [None] * (5 - len(n.args))
            dim = (args[1] or 0) % len(src.dims)
            if args[4] not in (None, 1):
                return None
            size = _dsize(src.dims[dim])
            start, end = args[2] or 0, size if args[3] is None else args[3]
            start, end = (start + size if start < 0 else start), (end + size if end < 0 else min(end, size))
            return self._slice(src, dim, start, end)
        return None if dims is None else replace(src, dims=dims)

    @staticmethod
    def _pin(src: V, dims, j: int) -> V | None:
        fixed = dict(src.fixed)
        fixed["k"] = j
        return replace(src, dims=dims, fixed=frozenset(fixed.items()))

    def _slice(self, src: V, dim: int, start: int, end: int) -> V | None:
        d = src.dims[dim]
        if start == 0 and end >= _dsize(d):
            return src
        if len(d) != 1 or end - start < 1:
            return None
        a, dims = d[0], list(src.dims)
        if a[0] == "k" and end - start == 1:
            dims[dim] = ()
            return self._pin(src, tuple(dims), start)
        if end - start < 2:
            return None
        if a[0] == "w":
            dims[dim] = (("w", a[1], a[2], a[3] + start, a[3] + end),)
            return replace(src, dims=tuple(dims))
        if a[0] == "r" and src.kind == "proj":
            dims[dim] = (("r", end - start),)
            r0 = src.info.rows[0]
            return replace(src, dims=tuple(dims), info=replace(src.info, rows=(r0 + start, r0 + end)))
        return None

    def _split(self, n: fx.Node) -> V | None:
        src = self.get(n.args[0])
        if src is None or src.kind == "tuple":
            return None
        dim = (n.args[2] if len(n.args) > 2 else n.kwargs.get("dim", 0)) % len(src.dims)
        size = _dsize(src.dims[dim])
        sizes = n.args[1]
        if not isinstance(sizes, (list, tuple)):
            sizes = [min(sizes, size - i) for i in range(0, size, sizes)]
        pieces, start = [], 0
        for s in sizes:
            pieces.append(self._slice(src, dim, start, start + s))
            start += s
        return V("tuple", (), src.block, info=pieces)

    # ------------------------------------------------------------------------ products
    def _gather(self, n: fx.Node) -> V | None:
        if n.target is aten.index.Tensor:
            src_node, idx = n.args
            if len(idx) != 1:
                return None
            idx, dim = idx[0], 0
        else:
            src_node, dim, idx = n.args
        src, iv = self.get(src_node), self.get(idx)
        if src is None or iv is None or src.kind != "param" or iv.kind != "ids" or dim != 0:
            return None
        if len(src.dims[0]) != 1 or src.dims[0][0][0] != "e":
            return None
        return V("gw", iv.dims + src.dims[1:], iv.block, iv.fixed)

    def _contract(self, n: fx.Node) -> V | None:
        a, b = self.get(n.args[0]), self.get(n.args[1])
        batched = n.target is aten.bmm.default
        rank = 2 + batched
        if a is None or b is None or len(a.dims) != rank or len(b.dims) != rank:
            return None
        batch = ()
        if batched:
            batch = (_unify(a.dims[0], b.dims[0]),)
            if batch[0] is None:
                return None
        (ma, na), (nb, pb) = a.dims[-2:], b.dims[-2:]
        if len(na) != 1 or len(nb) != 1:
            return None
        made = self._product(a, na[0], b, nb[0]) or self._product(b, nb[0], a, na[0])
        fixed = _merge_fixed(a, b)
        if made is None or fixed is None:
            return None
        kind, info, relabel, block = made
        dims = tuple(tuple(relabel.get(x, x) for x in d) for d in batch + (ma, pb))
        labels = [x for x in _atoms(dims) if x[0] != "*"]
        if len(set(labels)) != len(labels) or any(lab in dict(fixed) for lab, *_ in labels):
            return None
        return V(kind, dims, block, fixed, info)

    def _product(self, p: V, cp, q: V, cq):
        """What p (contracted on cp) times q (contracted on cq) computes: (kind, info, relabel, block)."""
        weight = q.kind in ("param", "gw") and cq[0] == "w" and cq[3] == 0 \
            and cq[4] == cq[1].meta["val"].shape[cq[2]] and (q.kind == "param" or q.block == p.block)
        others = [x for x in _atoms(q.dims) if x[0] == "w" and x != cq]
        mode = "ids" if q.kind == "gw" else "dense" if any(x[0] == "e" for x in _atoms(q.dims)) else "plain"
        if p.kind == "x" and cp[0] == "h" and weight and _size(cq) == cp[1] and len(others) == 1:
            r = others[0]
            return "proj", Proj(r[1], cq[2], r[2], (r[3], r[4]), mode), {r: ("r", _size(r))}, p.block
        if p.kind == "act" and cp[0] == "r" and weight and _size(cq) == cp[1] and len(others) == 1 \
                and p.info.gate.mode == mode and _size(others[0]) == self.H[p.block]:
            o = others[0]
            return "down", Down(p.info, o[1], cq[2], o[2]), {o: ("h", self.H[p.block])}, p.block
        if p.kind == "down" and p.block == q.block and cp == cq and (
                (cp[0] == "k" and q.kind == "w" and p.info.act.gate.mode == "ids")
                or (cp[0] == "e" and q.kind == "dense_w" and p.info.act.gate.mode == "dense")):
            return "routed", (p.info, frozenset(range(self.K[p.block]))), {}, p.block
        return None

    def _scatter(self, n: fx.Node) -> V | None:
        base, dim, idx, src = n.args
        iv, wv = self.get(idx), self.get(src)
        if not (is_call(base, aten.full.default) and scalar(base.args[1]) == 0 and dim in (1, -1)
                and iv is not None and wv is not None and iv.kind == "ids" and wv.kind == "w"
                and iv.block == wv.block and iv.dims == wv.dims and not iv.fixed and not wv.fixed):
            return None
        shape = base.meta["val"].shape
        atoms = [a for a in _atoms(iv.dims) if a[0] == "t"] + [("e", shape[-1])]
        dims = _regroup(atoms, shape)
        return V("dense_w", dims, iv.block) if dims is not None else None

    def _one_hot(self, n: fx.Node) -> V | None:
        for a, b in (n.args, n.args[::-1]):
            iv = self.get(a)
            if iv is not None and iv.kind == "ids" and not iv.fixed and is_call(b, prims.iota.default) \
                    and b.kwargs.get("start", 0) == 0 and b.kwargs.get("step", 1) == 1:
                dims = _align([iv.dims, ((("e", b.args[0]),),)])
                return V("onehot", dims, iv.block) if dims is not None else None
        return None

    def _sum(self, n: fx.Node) -> V | None:
        src = self.get(n.args[0])
        if src is None or src.kind not in ("weighted", "onehot_w") or len(n.args[1]) != 1:
            return None
        dim = n.args[1][0] % len(src.dims)
        keep = len(n.args) > 2 and n.args[2]
        label = ("k", self.K[src.block])
        if src.dims[dim] != (label if src.kind == "onehot_w" else src.info[1],):
            return None
        dims = src.dims[:dim] + (((),) if keep else ()) + src.dims[dim + 1:]
        if src.kind == "onehot_w":
            return V("dense_w", dims, src.block)
        return V("routed", dims, src.block, src.fixed, (src.info[0], frozenset(range(self.K[src.block]))))

    # ---------------------------------------------------------------------------- elementwise
    def _elementwise(self, n: fx.Node) -> V | None:
        vals = []
        for a in list(n.args) + list(n.kwargs.values()):
            if isinstance(a, fx.Node):
                v = self.get(a)
                if v is None or v.kind == "tuple":
                    return None
                vals.append(v)
            elif a is not None and scalar(a) is None:
                return None
        blocks = {v.block for v in vals} - {None}
        dims, fixed = _align([v.dims for v in vals]) if vals else None, _merge_fixed(*vals)
        if dims is None or fixed is None or len(blocks) != 1:
            return None
        if any(a[0] in dict(fixed) for a in _atoms(dims)):
            return None                                  # one slot's value against all slots
        block, kinds = blocks.pop(), [v.kind for v in vals]
        if all(k in ("proj", "expr") for k in kinds):
            out = V("expr", dims, block, fixed)
            act = self._swiglu(n, out) if n.target is aten.mul.Tensor else None
            return act or out
        if len(vals) != 2:
            return None
        if n.target is aten.mul.Tensor:
            return self._weigh(dims, fixed, block, *sorted(vals, key=lambda v: v.kind))
        if n.target is aten.add.Tensor and n.kwargs.get("alpha", 1) == 1 and vals[0].dims == vals[1].dims:
            return self._add(dims, fixed, block, *sorted(vals, key=lambda v: v.kind))
        return None

    def _swiglu(self, mul: fx.Node, out: V) -> V | None:
        a, b = mul.args[:2]
        for act, up in ((a, b), (b, a)):
            inner, lo_a, hi_a = clamp_bounds(strip(act))
            g = silu_input(inner)
            if g is None:
                continue
            inner_u, lo_u, hi_u = clamp_bounds(strip(up))
            if lo_a is None and hi_a is None and lo_u is None and hi_u is None:
                limit = 0.0
            elif lo_a is None and hi_a is not None and hi_a > 0 and lo_u == -hi_a and hi_u == hi_a:
                limit = hi_a
            else:
                continue
            gv, uv = self.v.get(g), self.v.get(inner_u)
            if gv is None or uv is None or gv.kind != "proj" or uv.kind != "proj" or gv.block != uv.block:
                continue
            gp, upp = gv.info, uv.info
            if gp.mode == upp.mode and gp.rows[1] - gp.rows[0] == upp.rows[1] - upp.rows[0]:
                return replace(out, kind="act", info=Act(gp, upp, limit))
        return None

    def _weigh(self, dims, fixed, block, a: V, b: V) -> V | None:
        """down * w -> weighted (slot axis kept) or one slot's term; onehot * w -> onehot_w."""
        labels = {x[0] for x in _atoms(dims)}
        if a.kind == "down" and b.kind == "w" and a.info.act.gate.mode == "ids":
            if "k" in labels and all("k" in {x[0] for x in _atoms(v.dims)} for v in (a, b)):
                return V("weighted", dims, block, fixed, (a.info, ("k", self.K[block])))
            slot = dict(a.fixed).get("k")
            if self.K[block] == 1 or (slot is not None and dict(b.fixed).get("k") == slot):
                rest = frozenset(f for f in fixed if f[0] != "k")
                return V("routed", dims, block, rest, (a.info, frozenset({slot or 0})))
        if a.kind == "dense_w" and b.kind == "down" and b.info.act.gate.mode == "dense" and "e" in labels:
            return V("weighted", dims, block, fixed, (b.info, next(x for x in _atoms(dims) if x[0] == "e")))
        if a.kind == "onehot" and b.kind == "w" and "k" in labels and "e" in labels:
            return V("onehot_w", dims, block, fixed)
        return None

    def _add(self, dims, fixed, block, a: V, b: V) -> V | None:
        """Slot terms add up to the routed sum; the routed sum plus a plain SwiGLU MLP is the block."""
        if a.kind == b.kind == "routed" and a.info[0] == b.info[0] and not a.info[1] & b.info[1]:
            return V("routed", dims, block, fixed, (a.info[0], a.info[1] | b.info[1]))
        if a.kind == "down" and b.kind == "routed" and a.info.act.gate.mode == "plain" \
                and b.info[1] == frozenset(range(self.K[block])):
            return V("moe", dims, block, fixed, (b.info[0], a.info))
        return None


# ------------------------------------------------------------------------------------------ pass
def _experts_op():
    try:
        import lingc.runtime.kernels.moe_experts  # noqa: F401  (registers lingc::moe_experts)
    except ImportError:
        pass
    return torch.ops.lingc.moe_experts.default if hasattr(torch.ops.lingc, "moe_experts") else None


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
    return None


class FusedMoE(LingcPass):
    name = "fused_moe"
    tolerance = (1e-4, 2e-2)

    def apply(self, gm: fx.GraphModule) -> int:
        import lingc.runtime.kernels.moe_router  # noqa: F401  (registers lingc::moe_router)

        graph = gm.graph
        routers = _find_routers(graph)
        blocks = []                      # (router, ids for the experts, weights for the experts)
        for r in routers:
            if r.x is None:
                self.notes.append(f"%{r.anchor.name}: not a MoE router: {r.why}")
                continue
            if r.call is None:
                self.notes.append(f"%{r.anchor.name}: router left as ATen ops: {r.why}")
                blocks.append((r, r.ids, r.weights, None))
                continue
            blocks.append((r, *self._router(graph, r)))
        experts_op = _experts_op()
        if experts_op is None and blocks:
            self.notes.append("lingc.moe_experts is not available: experts left as ATen ops")
        trace = _Trace(graph, [(r.x, ids, w) for r, ids, w, _ in blocks]) if experts_op else None
        n_experts = n_shared = 0
        for b, (r, ids, w, new) in enumerate(blocks):
            if trace is None:
                continue
            done = self._experts(graph, trace, b, r, ids, w, new, experts_op)
            if isinstance(done, str):
                self.notes.append(f"%{r.x.name}: experts left as ATen ops: {done}")
            else:
                n_experts += 1
                n_shared += done
        n_routers = sum(1 for *_, new in blocks if new is not None)
        if n_routers or n_experts:
            self.notes.insert(0, f"{n_routers} routers, {n_experts} expert blocks ({n_shared} with shared expert)")
        return n_routers + n_experts

    def _router(self, graph: fx.Graph, r: _Router):
        """Emit moe_router after the old ids; old ids and weights are read from it from then on."""
        rx, gate_w, bias, *consts = r.call
        H = gate_w.meta["val"].shape[1]
        with graph.inserting_before(r.ids.next):
            if rx.meta["val"].dim() != 2:
                rx = emit(graph, aten.view.default, rx, [-1, H])
            if bias is None:
                bias = emit(graph, aten.new_zeros.default, gate_w, [gate_w.meta["val"].shape[0]],
                            dtype=torch.float32)
            pair = emit(graph, torch.ops.lingc.moe_router.default, rx, gate_w, bias, *consts)
            ids, w = emit(graph, operator.getitem, pair, 0), emit(graph, operator.getitem, pair, 1)
            old_ids = emit(graph, prims.convert_element_type.default, ids, r.ids.meta["val"].dtype)
            old_w = w
            if r.weights.meta["val"].dtype != torch.float32:
                old_w = emit(graph, prims.convert_element_type.default, w, r.weights.meta["val"].dtype)
        r.ids.replace_all_uses_with(old_ids)
        r.weights.replace_all_uses_with(old_w)
        return old_ids, old_w, (ids, w)

    def _experts(self, graph, trace: _Trace, b: int, r: _Router, ids, w, new, op) -> int | str:
        """Replace block b's output node by one moe_experts call: 1 (shared expert in) / 0, or why not."""
        final, best = None, 0
        kinds = set()
        for n, v in trace.v.items():
            if v.block != b:
                continue
            kinds.add(v.kind if _mode(v) != "plain" else "")
            rank = 2 if v.kind == "moe" else 1 if v.kind == "routed" and v.info[1] == frozenset(
                range(trace.K[b])) else 0
            if rank and rank >= best:
                final, best = n, rank
        if final is None:
            return _missing(kinds)
        v = trace.v[final]
        routed, shared = (v.info[0], v.info[1]) if v.kind == "moe" else (v.info[0], None)
        if [a[0] for a in _atoms(v.dims)] not in (["t", "h"], ["h"]) or v.fixed:
            return "the block's output is not laid out [T, H]"
        why = _weights_layout_why(routed, shared)
        x = r.x
        params = [routed.act.gate.param, routed.act.up.param, routed.param]
        if shared is not None:
            params += [shared.act.gate.param, shared.act.up.param, shared.param]
        if why is None and any(p.meta["val"].dtype != x.meta["val"].dtype for p in params):
            why = "expert weights and x have different dtypes"
        if why:
            return why
        with graph.inserting_before(final):
            H = x.meta["val"].shape[-1]
            if x.meta["val"].dim() != 2:
                x = emit(graph, aten.view.default, x, [-1, H])
            if new is not None:
                ids, w = new
            else:
                ids = emit(graph, prims.convert_element_type.default, ids, torch.int32)
                if w.meta["val"].dtype != torch.float32:
                    w = emit(graph, prims.convert_element_type.default, w, torch.float32)

            def rows(p: Proj) -> fx.Node:
                full = p.rows == (0, p.param.meta["val"].shape[1])
                return p.param if full else emit(graph, aten.slice.Tensor, p.param, 1, *p.rows)

            args = [x, ids, w, rows(routed.act.gate), rows(routed.act.up), routed.param]
            if shared is not None:
                sg, su = shared.act.gate, shared.act.up
                args += [_shared_rows(graph, sg), _shared_rows(graph, su), shared.param]
            else:
                args += [None, None, None]
            args += [float(routed.act.limit), float(shared.act.limit) if shared is not None else 0.0]
            out = emit(graph, op, *args)
            want = final.meta["val"]
            if want.dtype != out.meta["val"].dtype:
                out = emit(graph, prims.convert_element_type.default, out, want.dtype)
            if list(want.shape) != list(out.meta["val"].shape):
                out = emit(graph, aten.view.default, out, list(want.shape))
        final.replace_all_uses_with(out)
        return int(shared is not None)


def _shared_rows(graph: fx.Graph, p: Proj) -> fx.Node:
    full = p.rows == (0, p.param.meta["val"].shape[0])
    return p.param if full else emit(graph, aten.slice.Tensor, p.param, 0, *p.rows)


def _mode(v: V) -> str | None:
    """'ids', 'dense' or 'plain' for the projection-derived values, else None."""
    info = {"proj": lambda i: i, "act": lambda i: i.gate, "down": lambda i: i.act.gate}.get(v.kind)
    return info(v.info).mode if info and isinstance(v.info, (Proj, Act, Down)) else None


def _missing(kinds: set) -> str:
    """The first stage of the experts' computation that was not found."""
    for kind, why in (("proj", "no projection of x by the selected experts' weights"),
                      ("act", "the expert projections do not form a SwiGLU"),
                      ("down", "no down projection of the expert activations"),
                      ("routed", "the expert outputs are not summed over all slots with the router weights")):
        if kind not in kinds:
            return why
    return "no complete MoE output"
