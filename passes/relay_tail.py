"""The relay step's tail, after the graph's last lingc kernel, folded into one lingc.relay_advance
(runtime/kernels/relay_advance). pdl_swap calls it with the rest of the glue.

    before (extend; a = accept):                       before (decode):
      seed' = gather(tokens, 0, a)                       emitted' = slice_scatter(emitted, y, 0, 0, 1)
      dh'   = index(hidden, [a])                         n' = n + 1
      x'    = gather(emitted, 0, a)                      ring' = index_put(ring, [ring_k % R],
      n'    = n + a + 1                                             cat([emitted', accept])[None])
      ring' = index_put(ring, [ring_k % R], cat([emitted, a])[None])
      ring_k' = ring_k + 1                               ring_k' = ring_k + 1
      copy_(seed, seed'), copy_(dh, dh'), ...            copy_(n, n'), copy_(x, y), copy_(emitted, emitted'), ...
    after:
      lingc.relay_advance(tokens, hidden, accept, emitted, n, x, seed, dh, ring, ring_k, True)
      lingc.relay_advance(y, None, accept, emitted, n, x, None, None, ring, ring_k, False)

Each ATen op of the tail was its own kernel and a full edge of the captured graph (8 per decode
step, 13 per extend step on the tiny model's graphs).

How it matches (the computation, not the spelling): the tail is every write into a graph input
(copy_ into a placeholder or a view of one) after the last lingc op, with the nodes they read,
back to leaves (placeholders, lingc outputs, anything before the last lingc op). Its leaves are
assigned to the op's arguments by dtype and shape (the written inputs to the written arguments),
and each candidate assignment is run on random inputs against the op's reference; the first one
that writes the same values into every written input, on two draws, is rewritten. So an index_put
or index_copy ring, index_select or gather or indexing for the row pick, n + (a + 1) or
(n + 1) + a all match; a tail that writes anything else, or in-place ops inside it, is left alone.
One exception: an extend whose seed is a token copied as it is from a lingc op (a sampling
request's extend_sample draws it with lingc.sampled_targets) keeps that copy and folds the rest
into relay_advance without tokens and seed (16 ATen kernels -> the op and the copy on the tiny
model); pdl_glue.drawn_token_writes then has the draw write the seed itself.

Exact: the op writes what the tail wrote (checked bit for bit on the probes, the integer and row
copies have no rounding), at the same point (the graph's end, where the epilogue writes were).
"""

from __future__ import annotations

import itertools

import torch
import torch.fx as fx

from lingc.graph_build import emit
from lingc.graph_match import aten, is_call
from lingc.graph_region import region, region_module, val
from lingc.pass_manager import VIEW_OPS

__all__ = ["relay_tail"]

MAX_CANDIDATES = 256
# (argument, written by the op, dtype class) in the op's argument order.
# Forms: True extend, False decode, DRAWN extend whose seed the graph wrote itself (its copy of a
# drawn token stays; relay_advance without tokens and seed).
DRAWN = "drawn"
_ARGS = {
    True: (("tokens", False, "i64"), ("hidden", False, "float"), ("accept", False, "i64"),
           ("emitted", False, "i64"), ("n", True, "i64"), ("x", True, "i64"), ("seed", True, "i64"),
           ("dh", True, "float"), ("ring", True, "i64"), ("ring_k", True, "i64")),
    False: (("tokens", False, "i64"), ("accept", False, "i64"), ("emitted", True, "i64"),
            ("n", True, "i64"), ("x", True, "i64"), ("ring", True, "i64"), ("ring_k", True, "i64")),
    DRAWN: (("hidden", False, "float"), ("accept", False, "i64"), ("emitted", False, "i64"), ("n", True, "i64"),
            ("x", True, "i64"), ("dh", True, "float"), ("ring", True, "i64"), ("ring_k", True, "i64")),
}
_ORDER = ("tokens", "hidden", "accept", "emitted", "n", "x", "seed", "dh", "ring", "ring_k")


def _is_lingc(n: fx.Node) -> bool:
    return (n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload)
            and n.target.namespace == "lingc")


def _root(n):
    while is_call(n, *VIEW_OPS):
        n = n.args[0]
    return n


def _writes_in_place(n: fx.Node) -> bool:
    t = n.target
    return isinstance(t, torch._ops.OpOverload) and any(
        a.alias_info is not None and a.alias_info.is_write for a in t._schema.arguments)


def _klass(n: fx.Node) -> str | None:
    v = val(n)
    if not isinstance(v, torch.Tensor):
        return None
    return "i64" if v.dtype == torch.int64 else ("float" if v.dtype.is_floating_point else None)


def relay_tail(g: fx.Graph) -> int:
    """Fold the tail into one lingc.relay_advance when it is the relay's bookkeeping (module
    docstring). Returns the number of epilogue writes replaced (0: no match)."""
    import lingc.runtime.kernels.relay_advance  # noqa: F401  (registers the op)

    nodes = list(g.nodes)
    lingc_at = [i for i, n in enumerate(nodes) if _is_lingc(n)]
    if not lingc_at:
        return 0
    last = lingc_at[-1]
    tail = nodes[last + 1:]
    pos = {n: i for i, n in enumerate(nodes)}

    def is_leaf(n: fx.Node) -> bool:
        if _is_lingc(n) or (getattr(n.target, "__name__", "") == "getitem" and _is_lingc(n.args[0])):
            return True
        return pos[n] <= last and not is_call(n, *VIEW_OPS)

    writes = [n for n in tail if n.op == "call_function" and _writes_in_place(n)]
    # A model's own state written back (a float cache's new rows, computed before the last lingc
    # op: a DecodeRunner model's attention cache) is not bookkeeping: its copy stays as it is.
    writes = [w for w in writes if not (is_call(w, aten.copy_.default) and _klass(w.args[0]) == "float"
                                        and is_leaf(_root(w.args[1])))]
    if not writes or not all(is_call(w, aten.copy_.default) and not w.users and _root(w.args[0]).op == "placeholder"
                             for w in writes):
        return 0
    # A token copied as it is from a lingc op (a drawn seed) may be the one write the relay's
    # forms lack: the DRAWN form leaves it and folds the rest.
    drawn = [w for w in writes if _klass(w.args[0]) == "i64" and is_leaf(_root(w.args[1]))]
    attempts = [(writes, (True, False))] + ([([w for w in writes if w not in drawn], (DRAWN,))] if drawn else [])
    for fold, forms in attempts:
        inside, leaves = region(fold, is_leaf)
        if any(_writes_in_place(n) and n not in fold for n in inside):
            continue
        written = {_root(w.args[0]) for w in fold}
        for form in forms:
            args = _assign(form, inside, leaves, fold, written)
            if args is not None:
                out = next(n for n in reversed(nodes) if n.op == "output")
                with g.inserting_before(out):
                    emit(g, torch.ops.lingc.relay_advance.default,
                         *[args.get(k) for k in _ORDER], form is not False)
                for w in reversed(fold):
                    g.erase_node(w)
                return len(fold)
    return 0


def _assign(form, inside, leaves, writes, written) -> dict | None:
    """The first assignment of leaves to the op's arguments (in `form`, a key of _ARGS) that the
    probe confirms, or None."""
    spec = _ARGS[form]
    if len(leaves) != len(spec) or {lf for lf in leaves if lf in written} != written:
        return None
    options = []
    for name, is_written, klass in spec:
        options.append([lf for lf in leaves if (lf in written) == is_written and _klass(lf) == klass])
    gm = region_module(inside, leaves, [])
    probes = 0
    for combo in itertools.product(*options):
        if len(set(combo)) != len(combo):
            continue
        args = {name: lf for (name, _, _), lf in zip(spec, combo)}
        if not _fits(args, form is not False):
            continue
        probes += 1
        if probes > MAX_CANDIDATES:
            return None
        if _probe(gm, leaves, args, form is not False):
            return args
    return None


def _fits(args: dict, accepted: bool) -> bool:
    from lingc.runtime.kernels.relay_advance.op import check_relay_advance_args

    try:
        check_relay_advance_args(*[val(args[k]) if k in args else None for k in _ORDER], accepted)
    except ValueError:
        return False
    return True


def _probe(gm: fx.GraphModule, leaves: list[fx.Node], args: dict, accepted: bool) -> bool:
    from lingc.compat import real_tensor_mode
    from lingc.runtime.kernels.relay_advance.naive import relay_advance_reference

    metas = {k: val(n) for k, n in args.items()}
    role_of = {n: k for k, n in args.items()}
    with real_tensor_mode(), torch.no_grad():
        for seed in (0, 1):
            gen = torch.Generator().manual_seed(seed)
            T = metas["emitted"].shape[0]
            ins = {}
            for k, m in metas.items():
                if k == "accept":
                    ins[k] = torch.randint(0, T, (1,), generator=gen)
                elif m.dtype == torch.int64:
                    ins[k] = torch.randint(0, 1 << 20, tuple(m.shape), generator=gen)
                else:
                    ins[k] = torch.randn(tuple(m.shape), generator=gen).to(m.dtype)
            mine = {k: v.clone() for k, v in ins.items()}
            ref = {k: v.clone() for k, v in ins.items()}
            try:
                gm(*[mine[role_of[lf]] for lf in leaves])
                relay_advance_reference(*[ref.get(k) for k in _ORDER], accepted)
            except (RuntimeError, IndexError, ValueError):
                return False
            if not all(torch.equal(mine[k], ref[k]) for k in ins):
                return False
    return True
