"""Named-axis dataflow over a MoE block's ATen graph, for passes/fused_moe.py.

From a block's seeds (its input x [T, H], the router's ids and weights [T, K]) every value is
followed forward with a layout whose axes have names: token ('t', T), slot ('k', K), hidden
('h', H), expert ('e', E), projection rows ('r', n), a broadcast axis not yet aligned ('*', n), and
('w', param, axis, start, end) for an axis of a weight parameter (a row range after slicing).
Size-1 axes are never stored. A layout is a tuple of dims, a dim a tuple of atoms merged in
row-major order, so views, permutes, expands and the reshapes einsum makes are followed exactly.

Meaning comes from the operations, never from names: a contraction of x's h with a full weight
axis is a projection (per selected expert after a gather by the ids, per expert for a 3-D weight
used whole, plain for a 2-D one); a product of silu(gate) and up projections (graph_match's
spellings, clamps) is a SwiGLU; its contraction with a weight axis of size I whose other axis has
size H is a down projection; the down projection times the router weights, summed over all the
slots (a contraction over k, a `sum`, or per-slot terms added up) is the routed output, or over
the experts for the dense form (weights scattered or one-hot into [T, E]); the routed output plus
a plain SwiGLU MLP of x (optionally times sigmoid(x @ w.T) with w [1, H]: a gated shared expert)
is the whole block ("moe"). Each value carries its block, so two blocks
never mix, and `fixed` pins an axis to one index (one slot of a per-slot loop).

Transformers' grouped_mm experts sort the flattened (token, slot) pairs by expert (an ascending
sort of the ids, kind perm), gather x's rows and the weights in that order (a pair axis
('p', n, perm node): pairs in the sorted order of that one sort), project each run of rows by its
expert with `torch._grouped_mm(rows, W.transpose(-2, -1), offs=ends)` and put the rows back with
the inverse permutation (a sort of the perm, kind iperm) or add them by their sorted token index
(the token index gathered by the perm, or perm // K).
A grouped product is a per-pair projection only if `ends` are the cumulative row counts of the
block's experts: the trace records every `ends` node per block (`group_ends`) and fused_moe
checks each on random ids before it rewrites the block.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass, replace
from typing import Any

import torch
import torch.fx as fx

from .graph_match import CASTS, aten, clamp_bounds, is_call, prims, scalar, silu_input, strip

REGROUP = {aten.view.default, aten.reshape.default, aten._unsafe_view.default, aten.unsqueeze.default,
           aten.squeeze.dim, aten.squeeze.dims, aten.squeeze.default, aten.clone.default, aten.alias.default}
ELEMENTWISE = {aten.neg.default, aten.exp.default, aten.sigmoid.default, aten.silu.default,
               aten.clamp.default, aten.clamp_min.default, aten.clamp_max.default, aten.minimum.default,
               aten.maximum.default, aten.add.Tensor, aten.sub.Tensor, aten.mul.Tensor, aten.div.Tensor,
               aten.reciprocal.default}
SORTS = {aten.sort.default, aten.sort.stable, aten.argsort.default, aten.argsort.stable}


def _size(a) -> int:
    return a[4] - a[3] if a[0] == "w" else a[1]


def atoms(dims) -> list:
    return [a for d in dims for a in d]


def _dsize(d) -> int:
    s = 1
    for a in d:
        s *= _size(a)
    return s


def _regroup(flat, shape):
    """The layout of a view of `shape` over the atoms `flat` (in memory order), or None when a
    dim would split an atom."""
    out, i = [], 0
    for s in shape:
        grp, p = [], 1
        while p < s and i < len(flat):
            p *= _size(flat[i])
            grp.append(flat[i])
            i += 1
        if p != s:
            return None
        out.append(tuple(grp))
    return tuple(out) if i == len(flat) else None


def _unify(a, b):
    """Two dims that must be the same axes (a broadcast '*' takes the other's name), or None."""
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
    """The union of the values' pinned axes, or None when they pin one axis to two indices."""
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
    sigmoid_w: fx.Node | None = None   # a gated MLP: times sigmoid(x @ sigmoid_w.T), sigmoid_w [1, H]


@dataclass(frozen=True)
class V:
    """What one node computes. kind: x, ids, w (the seeds), param (a weight), gw (weights gathered
    by ids), proj, expr (elementwise of projections), act (SwiGLU), down, weighted (down times
    the router weights, slot axis kept), routed (info: (Down, slots summed)), moe (info:
    (routed Down, shared Down)), onehot, onehot_w, dense_w ([T, E] router weights), tuple (split),
    glogit (x times a [1, H] weight, info: the weight; gprod: one token's terms of it, before
    their sum), gsig (its sigmoid: a shared expert's gate, as Qwen3-Next's shared_expert_gate),
    perm (the pairs' order sorted by expert, info: (the pair atoms, the sort node)) and iperm (its
    inverse, the same info)."""
    kind: str
    dims: tuple
    block: int | None = None
    fixed: frozenset = frozenset()     # axes pinned to one index: (('k', j),) for a single slot
    info: Any = None


class MoETrace:
    """Forward dataflow over the graph from each block's seeds (x, ids, weights), with named axes.
    `v[node]` is what the node computes; `H[b]`, `K[b]` are block b's hidden size and top-k."""

    def __init__(self, graph: fx.Graph, seeds: list[tuple[fx.Node, fx.Node, fx.Node]]):
        self.v: dict[fx.Node, V] = {}
        self.H, self.K = {}, {}
        self.group_ends: dict[int, set[fx.Node]] = {}     # block -> the offs of its grouped products
        self.perm_block: dict[fx.Node, int] = {}          # a pair sort -> the block whose ids it sorts
        for b, (x, ids, w) in enumerate(seeds):
            H, (T, K) = x.meta["val"].shape[-1], ids.meta["val"].shape
            self.H[b], self.K[b] = H, K
            t, k = [("t", T)] if T > 1 else [], [("k", K)] if K > 1 else []
            for node, kind, axes in ((x, "x", t + [("h", H)]), (ids, "ids", t + k), (w, "w", t + k)):
                dims = _regroup(axes, node.meta["val"].shape)
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
        if t is aten._grouped_mm.default:
            return self._grouped(n)
        if t in SORTS:
            return self._sort(n)
        if t is aten.div.Tensor_mode:
            return self._pair_token(n)
        if t in (aten.index.Tensor, aten.index_select.default):
            return self._gather(n)
        if t is prims.iota.default:
            return self._iota(n)
        if t in (aten.index_put.default, aten.index_add.default):
            return self._index_add(n)
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
            dims = _regroup(atoms(src.dims), shape)
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
    @staticmethod
    def _iota(n: fx.Node) -> V | None:
        """arange(T): a token index (kind tidx), its value along t the token itself, so rows of x
        gathered by it (expanded over the slots and flattened to pairs, as Transformers'
        batched_mm experts write it) are x broadcast over the slots."""
        length = n.args[0]
        if not isinstance(length, int) or n.kwargs.get("start", 0) != 0 or n.kwargs.get("step", 1) != 1:
            return None
        return V("tidx", ((("t", length),) if length > 1 else (),))

    def _index_add(self, n: fx.Node) -> V | None:
        """zeros[T, H].index_add_(0, token index over pairs, weighted pairs) (or the index_put
        with accumulate=True it may decompose to) over the flattened (token, slot) pairs: the
        weighted expert outputs summed over the slots, the routed output."""
        if n.target is aten.index_add.default:           # index_add(base, dim, index, source, alpha=1)
            base, dim, index, values = n.args[:4]
            alpha = n.args[4] if len(n.args) > 4 else n.kwargs.get("alpha", 1)
            if dim != 0 or alpha != 1:
                return None
        else:                                             # index_put(base, [index], values, accumulate)
            base, indices, values = n.args[:3]
            accumulate = n.args[3] if len(n.args) > 3 else n.kwargs.get("accumulate", False)
            if not accumulate or len(indices) != 1:
                return None
            index = indices[0]
        iv, wv = self.get(index), self.get(values)
        if iv is not None and wv is not None and iv.kind == "tidx" and wv.kind == "weighted" and not wv.fixed \
                and iv.dims[0] and iv.dims[0][0][0] == "p":       # added by the sorted pairs' token index
            zeros = is_call(base, aten.full.default) and scalar(base.args[1]) == 0
            b, p = wv.block, iv.dims[0][0]
            slots = [a for a in iv.info if a[0] != "t"]
            if not zeros or len(iv.dims) != 1 or wv.dims[0] != (p,) or wv.info[1] != p \
                    or slots not in ([("k", self.K[b])], [("*", self.K[b])]):
                return None
            dims = _regroup([a for a in iv.info if a[0] == "t"] + list(atoms(wv.dims[1:])), base.meta["val"].shape)
            return None if dims is None else V("routed", dims, b, frozenset(), (wv.info[0], frozenset(range(self.K[b]))))
        if iv is None or wv is None or iv.kind != "tidx" or wv.kind != "weighted" or wv.fixed \
                or len(iv.dims) != 1 or not wv.dims or wv.info[1][0] != "k":
            return None
        if not (is_call(base, aten.full.default) and scalar(base.args[1]) == 0):
            return None
        b = wv.block
        k = ("k", self.K[b])
        # The pair dim: the index's atoms (t, then the slots broadcast) against the values' (t, k).
        pair = wv.dims[0]
        want = tuple(a for a in pair if a[0] == "t") + (k,)
        got = tuple(a for a in iv.dims[0] if a[0] == "t") + tuple(k for a in iv.dims[0] if a[0] in ("*", "k"))
        if pair != want or got != want:
            return None
        shape = base.meta["val"].shape
        dims = _regroup([a for a in pair if a[0] == "t"] + list(atoms(wv.dims[1:])), shape)
        if dims is None:
            return None
        return V("routed", dims, b, frozenset(), (wv.info[0], frozenset(range(self.K[b]))))

    def _gather(self, n: fx.Node) -> V | None:
        if n.target is aten.index.Tensor:
            src_node, idx = n.args
            if len(idx) != 1:
                return None
            idx, dim = idx[0], 0
        else:
            src_node, dim, idx = n.args
        src, iv = self.get(src_node), self.get(idx)
        if src is not None and iv is not None and iv.kind in ("perm", "iperm") and dim == 0 and src.dims:
            return self._reorder(src, iv)
        if src is not None and iv is not None and src.kind == "x" and iv.kind == "tidx" and dim == 0 and src.dims \
                and iv.dims[0] and iv.dims[0][0][0] == "p":          # x[token_index[perm]]: x over sorted pairs
            ok = self.perm_block.get(iv.dims[0][0][2]) == src.block \
                and src.dims[0] == tuple(a for a in iv.info if a[0] == "t")
            return replace(src, dims=iv.dims + src.dims[1:]) if ok else None
        if src is not None and iv is not None and src.kind == "x" and iv.kind == "tidx" and dim == 0 \
                and src.dims and len(iv.dims[0]) >= 1 and src.dims[0] == tuple(a for a in iv.dims[0] if a[0] == "t"):
            return replace(src, dims=iv.dims + src.dims[1:])      # x[arange(T) per pair]: x over the pairs
        if src is None or iv is None or src.kind != "param" or iv.kind != "ids" or dim != 0:
            return None
        if len(src.dims[0]) != 1 or src.dims[0][0][0] != "e":
            return None
        return V("gw", iv.dims + src.dims[1:], iv.block, iv.fixed)

    def _sort(self, n: fx.Node) -> V | None:
        """An ascending sort (or argsort) of the flattened ids: the pairs' order by expert (perm);
        of such a perm: its inverse (iperm). Any sort that puts each expert's pairs together
        serves (stable or not): the rows are only ever gathered and put back by the same one."""
        src = self.get(n.args[0])
        if src is None or src.fixed or src.kind not in ("ids", "perm") or len(src.dims) != 1 or not src.dims[0]:
            return None
        opts = dict(zip(("dim", "descending"), n.args[1:])) if n.target in (aten.sort.default,
                                                                               aten.argsort.default) else {}
        opts.update(n.kwargs)
        if opts.get("dim", -1) not in (0, -1) or opts.get("descending", False):
            return None
        if src.kind == "ids":
            self.perm_block[n] = src.block
            out = V("perm", src.dims, src.block, info=(src.dims[0], n))
        else:
            out = V("iperm", src.dims, src.block, info=src.info)
        if n.target in (aten.argsort.default, aten.argsort.stable):
            return out
        return V("tuple", (), src.block, info=[None, out])

    def _pair_token(self, n: fx.Node) -> V | None:
        """perm // K (floor): each sorted pair's token, the (token, slot) pairs being token-major
        with K slots a token (lingc.models.moe's library form gathers x's rows by it)."""
        src, K = self.get(n.args[0]), scalar(n.args[1])
        if n.kwargs.get("rounding_mode") != "floor" or src is None or src.kind != "perm" or K is None:
            return None
        pair, sort = src.info
        k = ("k", self.K[src.block])
        if K != k[1] or pair[-1] != k or any(a[0] != "t" for a in pair[:-1]):
            return None
        return V("tidx", ((("p", _dsize(pair), sort),),), None, info=pair)

    def _reorder(self, src: V, iv: V) -> V | None:
        """A pair-axis value's rows in one sort's order (gathered by its perm: the pair dim becomes
        ('p', n, sort)) or back in (token, slot) order (gathered by that sort's iperm)."""
        pair, sort = iv.info
        p = ("p", _dsize(pair), sort)
        if src.fixed or src.kind == "tuple":
            return None
        if iv.kind == "perm":
            if src.kind not in ("x", "w", "tidx") or _unify(src.dims[0], pair) is None:
                return None
            if src.kind == "tidx":               # keeps its (token, slot) atoms to gather x by later
                return V("tidx", ((p,),) + src.dims[1:], None, info=src.dims[0])
            return replace(src, dims=((p,),) + src.dims[1:]) if src.block == iv.block else None
        if src.dims[0] != (p,):
            return None
        info = src.info
        if src.kind == "weighted":
            k = ("k", self.K[src.block])
            if k not in pair:
                return None
            info = (src.info[0], k)
        return replace(src, dims=(pair,) + src.dims[1:], info=info)

    def _grouped(self, n: fx.Node) -> V | None:
        """torch._grouped_mm(rows [N, c], W [E, c, n], offs): each run of rows times its expert's
        weight. With the rows in one sort's pair order and W a 3-D weight used whole, this is the
        per-pair projection (or down projection) by the selected experts, provided offs are the
        cumulative row counts of the block's experts: recorded in group_ends for fused_moe's check."""
        args = list(n.args) + [None] * (5 - len(n.args))
        offs, bias, out_dtype = (n.kwargs.get(k, args[i]) for i, k in ((2, "offs"), (3, "bias"), (4, "out_dtype")))
        a, b = self.get(n.args[0]), self.get(n.args[1])
        if offs is None or bias is not None or out_dtype not in (None, n.args[0].meta["val"].dtype) \
                or a is None or b is None or b.kind != "param" or len(a.dims) != 2 or len(b.dims) != 3:
            return None
        if len(a.dims[0]) != 1 or a.dims[0][0][0] != "p" or self.perm_block.get(a.dims[0][0][2]) != a.block \
                or len(b.dims[0]) != 1 or b.dims[0][0][0] != "e" or len(a.dims[1]) != 1 or len(b.dims[1]) != 1:
            return None
        gw = V("gw", (a.dims[0],) + b.dims[1:], a.block, a.fixed)
        made = self._product(a, a.dims[1][0], gw, b.dims[1][0])
        if made is None or made[0] not in ("proj", "down"):
            return None
        kind, info, relabel, block = made
        self.group_ends.setdefault(block, set()).add(offs)
        return V(kind, (a.dims[0], tuple(relabel.get(x, x) for x in b.dims[2])), block, a.fixed, info)

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
        labels = [x for x in atoms(dims) if x[0] != "*"]
        if len(set(labels)) != len(labels) or any(lab in dict(fixed) for lab, *_ in labels):
            return None
        return V(kind, dims, block, fixed, info)

    def _product(self, p: V, cp, q: V, cq):
        """What p (contracted on cp) times q (contracted on cq) computes: (kind, info, relabel, block)."""
        weight = q.kind in ("param", "gw") and cq[0] == "w" and cq[3] == 0 \
            and cq[4] == cq[1].meta["val"].shape[cq[2]] and (q.kind == "param" or q.block == p.block)
        others = [x for x in atoms(q.dims) if x[0] == "w" and x != cq]
        per = "ids" if q.kind == "gw" else "dense" if any(x[0] == "e" for x in atoms(q.dims)) else "plain"
        if p.kind == "x" and cp[0] == "h" and weight and _size(cq) == cp[1] and not others and q.kind == "param" \
                and tuple(cq[1].meta["val"].shape) == (1, cp[1]):
            return "glogit", cq[1], {}, p.block          # x @ w.T with w [1, H]: one logit a token
        if p.kind == "x" and cp[0] == "h" and weight and _size(cq) == cp[1] and len(others) == 1:
            r = others[0]
            return "proj", Proj(r[1], cq[2], r[2], (r[3], r[4]), per), {r: ("r", _size(r))}, p.block
        if p.kind == "act" and cp[0] == "r" and weight and _size(cq) == cp[1] and len(others) == 1 \
                and p.info.gate.mode == per and _size(others[0]) == self.H[p.block]:
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
        axes = [a for a in atoms(iv.dims) if a[0] == "t"] + [("e", shape[-1])]
        dims = _regroup(axes, shape)
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
        if src is not None and src.kind == "gprod" and isinstance(n.args[1], (list, tuple)) and len(n.args[1]) == 1:
            keep = len(n.args) > 2 and n.args[2]
            return V("glogit", ((),) if keep else (), src.block, src.fixed, src.info)
        if src is None or src.kind not in ("weighted", "onehot_w") or not isinstance(n.args[1], (list, tuple)) \
                or len(n.args[1]) != 1 or (src.kind == "weighted" and src.info[1][0] == "p"):
            return None                          # (a sum over sorted pairs would mix the tokens)
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
        if n.target is aten.mul.Tensor and len(vals) == 2:
            term = self._gate_term(*sorted(vals, key=lambda v: v.kind))
            if term is not None:
                return term
        blocks = {v.block for v in vals} - {None}
        dims, fixed = _align([v.dims for v in vals]) if vals else None, _merge_fixed(*vals)
        if dims is None or fixed is None or len(blocks) != 1:
            return None
        if any(a[0] in dict(fixed) for a in atoms(dims)):
            return None                                  # one slot's value against all slots
        block, kinds = blocks.pop(), [v.kind for v in vals]
        if all(k in ("proj", "expr") for k in kinds):
            out = V("expr", dims, block, fixed)
            act = self._swiglu(n, out) if n.target is aten.mul.Tensor else None
            return act or out
        if n.target is aten.sigmoid.default and kinds == ["glogit"]:
            return V("gsig", dims, block, fixed, vals[0].info)
        if len(vals) != 2:
            return None
        if n.target is aten.mul.Tensor:
            return self._weigh(dims, fixed, block, *sorted(vals, key=lambda v: v.kind))
        if n.target is aten.add.Tensor and n.kwargs.get("alpha", 1) == 1 and vals[0].dims == vals[1].dims:
            return self._add(dims, fixed, block, *sorted(vals, key=lambda v: v.kind))
        return None

    @staticmethod
    def _gate_term(w: V, x: V) -> V | None:
        """x[h] * w[0, h] with w [1, H]: the terms of a one-token x @ w.T (a [1, H] x [H, 1] mm
        reaches the graph as a product and a sum over h), kind gprod."""
        if w.kind != "param" or x.kind != "x" or len(w.dims) != 1 or len(x.dims) != 1 \
                or len(w.dims[0]) != 1 or len(x.dims[0]) != 1:
            return None
        (wa,), (ha,) = w.dims[0], x.dims[0]
        if wa[0] != "w" or ha[0] != "h" or wa[2] != 1 or (wa[3], wa[4]) != (0, ha[1]) \
                or tuple(wa[1].meta["val"].shape) != (1, ha[1]):
            return None
        return V("gprod", x.dims, x.block, x.fixed, wa[1])

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
        """down * w -> weighted (slot axis kept) or one slot's term; onehot * w -> onehot_w;
        a plain down * sigmoid(x @ w.T) -> that down, gated."""
        labels = {x[0] for x in atoms(dims)}
        if a.kind == "down" and b.kind == "gsig" and a.info.act.gate.mode == "plain" and a.info.sigmoid_w is None \
                and dims == a.dims:
            return V("down", dims, block, fixed, replace(a.info, sigmoid_w=b.info))
        if a.kind == "down" and b.kind == "w" and a.info.act.gate.mode == "ids":
            if "k" in labels and all("k" in {x[0] for x in atoms(v.dims)} for v in (a, b)):
                return V("weighted", dims, block, fixed, (a.info, ("k", self.K[block])))
            p = [x for x in atoms(dims) if x[0] == "p"]
            if len(p) == 1 and all(p[0] in atoms(v.dims) for v in (a, b)):      # both in one sort's order
                return V("weighted", dims, block, fixed, (a.info, p[0]))
            slot = dict(a.fixed).get("k")
            if self.K[block] == 1 or (slot is not None and dict(b.fixed).get("k") == slot):
                rest = frozenset(f for f in fixed if f[0] != "k")
                return V("routed", dims, block, rest, (a.info, frozenset({slot or 0})))
        if a.kind == "dense_w" and b.kind == "down" and b.info.act.gate.mode == "dense" and "e" in labels:
            return V("weighted", dims, block, fixed, (b.info, next(x for x in atoms(dims) if x[0] == "e")))
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


def mode(v: V) -> str | None:
    """'ids', 'dense' or 'plain' for the projection-derived values, else None."""
    info = {"proj": lambda i: i, "act": lambda i: i.gate, "down": lambda i: i.act.gate}.get(v.kind)
    return info(v.info).mode if info and isinstance(v.info, (Proj, Act, Down)) else None
