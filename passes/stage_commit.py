"""stage_commit: stage every recurrent-state write of a verify graph per chain position, and
commit the accepted position's state at the graph's ``lingc.state_commit``.

Why: a verify step runs the target over the chain [x_n, d_1..d_S]. The model, written for plain
decoding, stores the recurrent state after ALL S+1 positions; when only a drafts are accepted
the state must be the one after position a (design.md, correctness gate 5). Rolling back by
snapshot + replay costs a second forward; staging costs one state copy per position.

What it rewrites (verify role only). In the functionalised graph every input mutation ends as
``copy_(placeholder, new_value)``. A mutated placeholder is recurrent state when its new value
replaces a whole slot (``select_scatter(ph, copy(select(ph, ...), V), ...)`` or ``copy(ph, V)``)
with a value V computed from its old content; positional writes (``index_put`` / ``index_copy``
at the positions, e.g. the MLA latent cache) are left alone: rows past the accepted prefix are
rewritten by later steps before anything reads them. For each recurrent V the pass builds
V_0..V_{T-1}, the value after chain position j, from the graph itself:

- a token-by-token recurrence (KDA's delta rule, any layout): every node carries the highest
  chain position it depends on (``select(rows, 0, i)`` or ``unbind(rows)[i]`` of a per-token
  tensor is position i, as is ``rows[:, i]`` of one with a batch dim of 1 before the tokens, or
  ``rows[:, :, i]`` where the tokens are the only dim of size T, Hugging Face's [B, H, T, K]);
  the post-state of position j is the one state-sized node of position j that position j+1
  consumes (the written value's last carries and transpositions stepped back over, so a state
  stored [V, K] and written as a transpose is staged through the same transposition);
- a sliding window (the short-conv caches): the written value is a slice ending at the end of
  ``cat([old window, new rows])`` (possibly through a dtype cast); position j's window is the same slice shifted back by
  T-1-j rows.

Then ``new_value`` becomes ``stack(V_0..V_{T-1})[accept]`` with ``accept`` the argument of
``lingc.state_commit`` (the in-graph greedy verdict), so the commit happens after the verdict,
on the device, without a host sync. On the GPU pdl_swap maps the staged KDA form onto the
kda_chain kernel's staged mode + kda_commit. A state that fits neither form (e.g. a chunked
recurrence consuming all positions at once) is an error in a verify graph, never left silently
wrong. Exact: the staged values are the very nodes the graph computed.
"""

from __future__ import annotations

import operator

import torch
import torch.fx as fx

from lingc.graph_build import eliminate_dead_code, emit
from lingc.graph_match import CASTS, is_call
from lingc.graph_region import ancestors, depends_on, descendants_upto
from lingc.pass_manager import LingcPass
from lingc.runtime.relay import ops as _relay_ops  # noqa: F401  (registers torch.ops.lingc.host_refill etc.)

aten = torch.ops.aten

SLOT_WRITES = {aten.select_scatter.default, aten.slice_scatter.default}
POSITIONAL_WRITES = {aten.index_put.default, aten.index_put_.default, aten.index_copy.default,
                     aten.scatter.src, aten.scatter.value, aten._unsafe_index_put.default}
INT_DTYPES = (torch.int32, torch.int64)


class StageCommitError(RuntimeError):
    """A verify graph writes recurrent state in a form stage_commit cannot stage."""


def _val(n):
    return n.meta.get("val") if isinstance(n, fx.Node) else None


def _shape(n) -> tuple[int, ...] | None:
    v = _val(n)
    return tuple(v.shape) if isinstance(v, torch.Tensor) else None


def _args(n: fx.Node) -> list[fx.Node]:
    return list(n.all_input_nodes)


class StageCommit(LingcPass):
    """Recurrent-state writes -> per-position stages + a commit at lingc.state_commit (verify)."""

    name = "stage_commit"
    roles = ("verify",)
    # The staged graph is MEANT to differ from the unstaged one whenever a draft is rejected, so
    # the verify mode cannot bound it; tests check it against from-scratch states instead.
    tolerance = (float("inf"), float("inf"))

    def apply(self, gm: fx.GraphModule) -> int:
        g = gm.graph
        commits = [n for n in g.nodes if is_call(n, torch.ops.lingc.state_commit.default)]
        if not commits:
            self.notes.append("no lingc.state_commit in this verify graph: nothing to commit")
            return 0
        if len(commits) > 1:
            raise StageCommitError(f"stage_commit: {len(commits)} lingc.state_commit calls in one "
                                   "verify graph; a verify step commits exactly once")
        accept = commits[0].args[0]
        T = self._chain_length(g)
        writes = self._state_writes(g)
        if not writes:
            self.notes.append("no recurrent-state writes in this graph")
            return 0
        tok = _positions(g, T)
        matches = 0
        for epilogue, ph, slot_path, value in writes:
            with g.inserting_before(epilogue):
                variants, kind = self._variants(g, ph, value, T, tok)
                stacked = emit(g, aten.stack.default, variants, 0)
                picked = emit(g, aten.index.Tensor, stacked, [accept])
                committed = emit(g, aten.squeeze.dim, picked, 0)
                new_value = self._rebuild(g, ph, slot_path, committed)
            epilogue.replace_input_with(epilogue.args[1], new_value)
            matches += 1
            self.notes.append(f"{self.ctx.describe(ph)}: {kind} staged over {T} positions")
        commits[0].replace_all_uses_with(accept)
        g.erase_node(commits[0])
        eliminate_dead_code(g)
        gm.recompile()
        return matches

    # -- finding the writes -------------------------------------------------------------------

    def _chain_length(self, g: fx.Graph) -> int:
        verdicts = [n for n in g.nodes if is_call(n, torch.ops.lingc.greedy_verdict.default)]
        if len(verdicts) != 1:
            raise StageCommitError(f"stage_commit: a verify graph needs exactly one "
                                   f"lingc.greedy_verdict, found {len(verdicts)}")
        return _shape(verdicts[0].args[0])[0]

    def _state_writes(self, g: fx.Graph):
        """(epilogue copy_ node, placeholder, slot path, written value) per recurrent state.

        Recognised new values: ``select_scatter|slice_scatter(ph, copy(view(ph), V), ...)`` (a
        slot of the state, the form AOT gives ``state[slot].copy_(S)``), ``copy(ph, V)``, or V.
        """
        out = []
        order = {n: i for i, n in enumerate(g.nodes)}
        for n in g.nodes:
            if not (is_call(n, aten.copy_.default) and n.args[0].op == "placeholder"):
                continue
            ph, new = n.args
            path, inner = [], new
            if is_call(new, *SLOT_WRITES) and new.args[0] is ph:
                path, inner = [new], new.args[1]
            if is_call(inner, *POSITIONAL_WRITES):
                self.notes.append(f"{self.ctx.describe(ph)}: positional write ({inner.target.__name__}), not staged")
                continue
            value = inner.args[1] if is_call(inner, aten.copy.default) else inner
            if path and not is_call(inner, aten.copy.default):
                self.notes.append(f"{self.ctx.describe(ph)}: slot write of an unrecognised form, not staged")
                continue
            if not depends_on(value, ph, order):
                self.notes.append(f"{self.ctx.describe(ph)}: overwritten without reading it (not recurrent), not staged")
                continue
            out.append((n, ph, path, value))
        return out

    def _rebuild(self, g: fx.Graph, ph: fx.Node, path: list[fx.Node], committed: fx.Node) -> fx.Node:
        """Re-emit the slot write chain with `committed` as the written value."""
        if not path:
            return emit(g, aten.copy.default, ph, committed)
        # path[0] = select_scatter(ph, src0, *idx0); src0 = copy(select(ph, *idx0), V) (one level:
        # the form AOT gives for `state[slot].copy_(S)`).
        ss = path[0]
        view = aten.select.int if ss.target is aten.select_scatter.default else aten.slice.Tensor
        dst = emit(g, view, ph, *ss.args[2:])
        src = emit(g, aten.copy.default, dst, committed)
        return emit(g, ss.target, ph, src, *ss.args[2:])

    # -- per-position values ------------------------------------------------------------------

    def _variants(self, g: fx.Graph, ph: fx.Node, value: fx.Node, T: int, tok: dict) -> list[fx.Node]:
        # Only the part of the graph between the state's read and its new value matters: the
        # nodes downstream of ph up to `value` (dep) and, of value's ancestors, those among them
        # (cone). Window slices, the recurrence's spine and the clones all lie there (each is
        # downstream of ph and upstream of value), so bounding both walks changes no result and
        # keeps the pass linear in depth (whole-graph walks per state made it quadratic).
        order = {n: i for i, n in enumerate(g.nodes)}
        dep = descendants_upto(ph, order[value], order)
        cone = ancestors([value], within=dep) | {value}
        old = dep | {ph}             # a window's old rows: ph itself (a whole-input window) or a view of it
        windows = [n for n in cone if _is_window_slice(n, T, tok, old)]
        if windows:
            return [value if j == T - 1 else self._clone(g, value, {
                w: ("shift", T - 1 - j) for w in windows}, cone, order) for j in range(T)], "sliding window"
        crossings = _crossings(cone, dep, value, T, tok)
        if crossings is None:
            raise StageCommitError(
                f"stage_commit: the recurrent state {ph.name} is written from a value that does "
                f"not decompose per chain position (neither a token-by-token recurrence nor a "
                f"sliding window over the {T} new rows). Verify graphs need the recurrent form "
                f"(e.g. KDA's token loop, T <= 16); disable the pass only if the state is not "
                f"recurrent.")
        top = crossings[T - 1]
        return [value if j == T - 1 else self._clone(g, value, {top: ("node", crossings[j])}, cone, order)
                for j in range(T)], "recurrence"

    def _clone(self, g: fx.Graph, value: fx.Node, anchors: dict, cone: set, order: dict) -> fx.Node:
        """Copy the part of value's cone (`cone`: value and its ancestors; `order`: graph
        positions) that depends on an anchor, substituting the anchors. Only the cone is walked:
        scanning the whole graph per clone made the pass quadratic in depth (4.8 s of a 42-layer
        verify graph's compile on the CPU)."""
        affected, stack = set(anchors), list(anchors)
        while stack:
            for u in stack.pop().users:
                if u in cone and u not in affected:
                    affected.add(u)
                    stack.append(u)
        mapping: dict[fx.Node, fx.Node] = {}

        def sub(n):
            return mapping.get(n, n)

        for n in sorted(affected, key=order.__getitem__):     # topological order
            if n in anchors:
                kind, arg = anchors[n]
                if kind == "node":           # (a post-state of another rank, e.g. [1, H, K, V] for
                    # [H, K, V]: the spine's nodes have the state's numel, not always its shape)
                    mapping[n] = arg if _shape(arg) == _shape(n) else emit(g, aten.reshape.default, arg, list(_shape(n)))
                else:                                    # shift a window slice back by `arg` rows
                    src, dim, start, end = (list(n.args) + [0, None, None])[:4]
                    size = _shape(src)[dim]
                    end = size if end is None or end > size else end
                    start = start + size if start < 0 else start
                    mapping[n] = emit(g, aten.slice.Tensor, src, dim, start - arg, end - arg)
            else:
                mapping[n] = g.node_copy(n, sub)
        return mapping[value]


def _positions(g: fx.Graph, T: int) -> dict[fx.Node, int]:
    """Highest chain position each node depends on: -1 none, i for select(rows, 0, i), T for all
    of them (a per-token tensor [T, ...] before any selection)."""
    tok: dict[fx.Node, int] = {}
    for n in g.nodes:
        if n.op == "placeholder":
            v = _val(n)
            tok[n] = T if (isinstance(v, torch.Tensor) and v.dtype in INT_DTYPES
                           and tuple(v.shape) == (T,)) else -1
            continue
        t = max((tok.get(a, -1) for a in _args(n)), default=-1)
        if n.target is operator.getitem and is_call(n.args[0], aten.unbind.int) and t == T:
            rows = n.args[0]
            if (rows.args[1] if len(rows.args) > 1 else 0) == 0 and _shape(rows.args[0])[0] == T:
                t = n.args[1]                        # unbind(rows)[i]: position i
        if n.op == "call_function" and t == T and n.args and isinstance(n.args[0], fx.Node) \
                and n.target in (aten.select.int, aten.slice.Tensor) and _token_dim(n, T):
            if n.target is aten.select.int:
                t = n.args[2] % T
            elif len(n.args) >= 4:
                end = min(n.args[3], T)
                if end < T:
                    t = end - 1
        tok[n] = t
    return tok


def _token_dim(n: fx.Node, T: int) -> bool:
    """Whether select/slice n indexes the token dim of a per-token tensor: a dim of size T with
    only unit dims before it ([T, ...], or [1, T, ...] under a batch dim of 1), or the only dim of
    size T ([B, H, T, K]: Hugging Face's recurrences walk the tokens on dim 2)."""
    s = _shape(n.args[0])
    dim = n.args[1] if len(n.args) > 1 else 0
    if not s or not isinstance(dim, int):
        return False
    dim = dim + len(s) if dim < 0 else dim
    return 0 <= dim < len(s) and s[dim] == T and (all(d == 1 for d in s[:dim]) or s.count(T) == 1)


def _is_window_slice(n: fx.Node, T: int, tok: dict, old: set) -> bool:
    """slice(cat([old..., rows]), d, size - L, end >= size): the last L rows of old + new."""
    if not is_call(n, aten.slice.Tensor) or len(n.args) < 4:
        return False
    src, dim = n.args[0], n.args[1]
    while is_call(src, *CASTS):                  # cat(...).float() in reduced precision
        src = src.args[0]
    if not is_call(src, aten.cat.default):
        return False
    parts = src.args[0]
    cat_dim = src.args[1] if len(src.args) > 1 else 0
    rank = len(_shape(src))
    if cat_dim % rank != dim % rank or len(parts) < 2:      # cat(.., -1) sliced on dim 1 of 2
        return False
    size = _shape(src)[dim]
    last = parts[-1]
    start = n.args[2] + size if n.args[2] < 0 else n.args[2]        # window[:, -3:] counts from the end
    return (_shape(last)[dim] == T and tok.get(last, -1) == T and n.args[3] >= size
            and start > 0 and any(p in old for p in parts[:-1]))


def _crossings(cone: set, dep: set, value: fx.Node, T: int, tok: dict):
    """Per position j, the post-state of position j (None when the recurrence does not run
    position by position).

    Start from the state-sized node of position j that position j + 1 consumes (for the last
    position: the last one), then step back over "carries": ops with a single token- or
    state-dependent argument of the same shape (a constant decay, a scale), which may be
    written at the end of one step or the start of the next; position j's state is the last
    node that mixes two position-j values (e.g. decayed state + update)."""
    numel = _val(value).numel()
    spine = [n for n in cone if n in dep and isinstance(_val(n), torch.Tensor)
             and _val(n).numel() == numel]
    if any(tok.get(n, -1) >= T for n in spine if n is not value) or tok.get(value, -1) != T - 1:
        return None
    order = {n: i for i, n in enumerate(value.graph.nodes)}
    spine_set = set(spine)
    out = {}
    for j in range(T):
        at_j = [n for n in spine if tok.get(n, -1) == j]
        if j < T - 1:
            ends = [n for n in at_j if any(u in spine_set and tok.get(u, -1) > j for u in n.users)]
        else:
            ends = [max(at_j, key=order.__getitem__)] if at_j else []
        if len(ends) != 1:
            return None
        n = ends[0]
        while True:
            live = [a for a in _args(n) if tok.get(a, -1) >= 0 or a in dep]
            # A carry keeps the shape; a transposition too is stepped over (a state stored
            # [V, K] with V != K is written back as the transpose of the recurrence's [K, V]
            # state; the clone re-emits it on each position's state).
            relayout = is_call(n, aten.permute.default, aten.transpose.int, aten.t.default)
            if len(live) == 1 and live[0] in spine_set and tok.get(live[0], -1) == j \
                    and (_shape(live[0]) == _shape(n) or relayout):
                n = live[0]
                continue
            break
        out[j] = n
    return out
