"""pdl_swap's norm folds: a lingc norm moves into the lingc op beside it, so it is no launch (and
no PDL boundary) of its own. pdl_glue.py has the other glue; this file the five folds of a norm.

    before:  e = embedding(table, ids) ; out, x = lingc.rmsnorm(views(e), w, None, eps) ; f(e)
    after:   out, x = lingc.embedding_rmsnorm(table, ids, w, eps) ; f(views(x))

    before:  ya, _ = lingc.embedding_rmsnorm(E, ids, wa, e1) ; yb, _ = lingc.rmsnorm(b, wb, None, e2)
             y = lingc.concat_cols(ya, yb)
    after:   y = lingc.rmsnorm_pair_cols(E, ids, wa, e1, b, wb, e2)

    before:  y, h = lingc.rmsnorm(x, w, r, eps) ; ids, wts = lingc.moe_router(y, Wr, bias, ...)
    after:   y, h, ids, wts = lingc.rmsnorm_router(x, w, r, eps, Wr, bias, ...)

    before:  c, _ = lingc.rmsnorm(x, w, None, eps) ; lingc.mla_kv_write(c, k, pos, freq, cache)
    after:   lingc.mla_kv_write(x, k, pos, freq, cache, w, eps)

    before:  y, _ = lingc.rmsnorm(reshape(x, [T * H, D]), w, None, eps) ; r = reshape(y, [T, H, D])
             lingc.head_cache_write(r, pos, cache, freq) ; lingc.gqa_decode(r', ...)
    after:   lingc.head_cache_write(x, pos, cache, freq, norm_weight=w, eps=eps)   (x [T, H, D])

A norm in the Hugging Face Llama form (``round_before_weight``) folds as the one-rounding form
does (every op here takes the flag); a norm without a gain folds only into the embedding gather
(the same kernel), and one with a zero-centred gain only there and into the per-head readers.

Why each is exact:
- the embedding's value is x, the rows rmsnorm already copies out without a residual (the same
  bits: a gather rounds nothing), so the first norm after the embedding reads the table rows
  itself, and the gather (a graph's head, an ATen kernel and a full edge of every step graph:
  decode, verify, extend and each of the draft's NEXTN forwards) is gone. Only 2-d [T, D] norm
  inputs that are the embedding or a view of it with the same elements in the same order (any
  form of the norm: embedding_rmsnorm is the same kernel, so it takes the zero-centred gain too);
- two norms whose rows only a ``concat_cols`` reads (NEXTN's enorm of the embedding and hnorm
  of the hidden state, before eh_proj) run as one ``lingc.rmsnorm_pair_cols``: each half is the
  rmsnorm kernel's row arithmetic with its tile (the same bits). Only norms without a residual
  (or the embedding form for the left half) whose second result nothing reads, of one shape,
  dtype and form (both one rounding or both the Llama form; no zero-centred gain), over rows (and ids) no op of the
  graph writes (the norms move to the concatenation). Three
  launches become one in each NEXTN forward (four a draft graph, one in extend).
- the MoE block's input norm moves into its router's logits kernel (runtime/kernels/moe_router),
  whose every CTA holds whole token rows for the gate matvec anyway: it forms h and y with the
  norm kernel's arithmetic, routes y, and the expert blocks write y and h a slice each. One
  launch (and one PDL boundary) less per MoE layer. Only where the router reads the norm's y
  itself (or through views that change nothing: a full slice), every reader of the two ops'
  results takes one output (getitem), and the router's other operands exist at the norm.
  Numerics (declared): h is the same bits; y's sum of squares is reduced in another order on the
  GPU; the router's logits are those of the fp32 normed row (the norm's scale applied after the
  gate products, one rounding fewer than routing y). H200, flash-tp4-rank (session 23): plain decode 1.750 -> 1.723 ms, the
  relay level (4.121 -> 4.129 ms wall, 4.395 -> 4.374 ms GPU). A norm in the Hugging Face Llama
  form (``round_before_weight``) folds too: y is that form and the router takes y as rounded,
  the unfused pair's selection.
- MLA's kv_a_layernorm moves into the cache write (runtime/kernels/mla_kv_write), whose program
  holds the token's whole latent row anyway: it norms the row with the norm kernel's arithmetic
  before writing it. One launch less per MLA layer. Only for a norm without a residual whose
  normed row the write reads itself (or through views that change nothing) and nothing else
  reads, over a row that no op of the graph writes in place (the norm now reads it later).
  Numerics (declared): the row's sum of squares is reduced in another order on the GPU. A norm
  in the Llama form moves with its form (``round_before_weight``).
- a per-head norm of keys or queries (Qwen3-Next's k_norm / q_norm: lingc.rmsnorm over the
  [T * H, D] rows of a [T, H, D] value, zero-centred) moves into the head_cache_write of those
  keys or the gqa_decode of those queries, whose program holds the head's whole row anyway
  (runtime/kernels/head_norm.py: the norm kernel's arithmetic, rounded to the rows' dtype before
  the RoPE as the unfused norm rounds). One launch less each, and for a strided [T, H, D] piece
  (a verify chain's queries inside the fused q / gate projection) no [T * H, D] copy. Only for a
  norm without a residual whose rows only the reader reads, through a row-major [T, H, D] reshape
  of x's [T * H, D] flattening, over an x no op of the graph writes in place (the norm now reads
  it later), with unit stride along D. Numerics (declared): as the latent norm's.
"""

from __future__ import annotations

import torch
import torch.fx as fx

from lingc.graph_build import emit, refresh_vals
from lingc.graph_match import aten, is_call
from lingc.graph_region import shape, val
from lingc.pass_manager import written_bases

from .pdl_glue import _is_lingc, _view_root

__all__ = ["embedding_into_norm", "norm_pairs_into_concat", "norms_into_head_readers", "norms_into_kv_writes",
           "norms_into_routers"]

lingc_ops = torch.ops.lingc


def _rounds_before_weight(n) -> bool:
    """n is a norm op in the Hugging Face Llama form (round_before_weight: two roundings)."""
    return bool(n.kwargs.get("round_before_weight", False))


def _zero_centered(n) -> bool:
    """n is a norm op whose weight is zero-centred (gain 1 + weight)."""
    return bool(n.kwargs.get("zero_centered", False))


def _weighted_rmsnorm(n) -> bool:
    """n is a lingc.rmsnorm with a weight, the gain itself: the ops a norm folds into
    (rmsnorm_router, mla_kv_write, rmsnorm_pair_cols) take those only; a norm without a gain or
    with a zero-centred one (gain 1 + weight) keeps its own kernel (rmsnorm_out takes both, and
    embedding_rmsnorm the zero-centred one: the same kernel)."""
    return is_call(n, lingc_ops.rmsnorm.default) and n.args[1] is not None and not _zero_centered(n)


def _norm_form(n) -> dict:
    """The keyword that carries norm n's form to the op it folds into (none for one rounding)."""
    return {"round_before_weight": True} if _rounds_before_weight(n) else {}


_RESHAPES = (aten.view.default, aten.reshape.default, aten._unsafe_view.default)


def embedding_into_norm(g: fx.Graph) -> int:
    """embedding(table, ids) -> views -> lingc.rmsnorm(., w, None, eps): one
    lingc.embedding_rmsnorm (the module docstring says when). Returns the gathers folded."""
    import operator

    from lingc.runtime.kernels import norms  # noqa: F401  (registers embedding_rmsnorm)

    count = 0
    order = {n: i for i, n in enumerate(g.nodes)}      # the graph's nodes before any rewrite here
    for rms in [n for n in g.nodes if is_call(n, lingc_ops.rmsnorm.default) and n.args[1] is not None]:  # any form
        x, w, residual, eps = rms.args
        if residual is not None or not isinstance(x, fx.Node):
            continue
        emb, chain = x, []
        while is_call(emb, *_RESHAPES) and len(emb.users) == 1:
            chain.append(emb)
            emb = emb.args[0]
        if not (is_call(emb, aten.embedding.default) and val(emb).is_contiguous()):
            continue
        table, ids = emb.args[:2]
        T, D = val(x).shape
        if val(table).dim() != 2 or val(table).shape[1] != D or val(ids).numel() != T:
            continue
        if val(ids).dtype not in (torch.int32, torch.int64):
            continue
        if any(order[u] < order[rms] for u in emb.users if u not in chain):
            continue                 # a reader before the norm could not read the norm's x
        with g.inserting_before(rms):
            flat = ids if val(ids).dim() == 1 else emit(g, aten.view.default, ids, [T])
            new = emit(g, lingc_ops.embedding_rmsnorm.default, table, flat, w, eps, **rms.kwargs)
        rms.replace_all_uses_with(new)
        g.erase_node(rms)
        for v in chain:
            if not v.users:
                g.erase_node(v)
        if emb.users:        # the embedding's other readers (the first residual add) read x
            with g.inserting_after(new):
                xs = emit(g, operator.getitem, new, 1)
            with g.inserting_after(xs):
                back = xs if tuple(val(emb).shape) == (T, D) else emit(g, aten.view.default, xs, list(val(emb).shape))
            emb.replace_all_uses_with(back)
        g.erase_node(emb)
        count += 1
    return count


def _through_identity_views(n):
    """n's source through views that change nothing: the deepest node of n's chain of views
    with n's shape, strides and offset (a full slice, e.g. the x[:T] a model takes of its [T, H]
    rows; a round trip through another shape, e.g. [T, D] -> [1, T, D] -> [T, D] around a batch
    dim of 1)."""
    best, start = n, val(n)
    while is_call(n, aten.slice.Tensor, aten.view.default, aten.alias.default, aten.reshape.default,
                  aten._unsafe_view.default) and isinstance(n.args[0], fx.Node):
        n = n.args[0]
        if _same_layout(val(n), start):
            best = n
    return best


def _same_layout(a, b) -> bool:
    return (tuple(a.shape) == tuple(b.shape) and tuple(a.stride()) == tuple(b.stride())
            and a.storage_offset() == b.storage_offset())


def norms_into_routers(g: fx.Graph) -> int:
    """y, h = lingc.rmsnorm(x, w, r, eps) ; ids, wts = lingc.moe_router(y, ...): one
    lingc.rmsnorm_router (the module docstring says when). Returns the norms folded."""
    import operator

    from lingc.runtime.kernels import moe_router  # noqa: F401  (registers rmsnorm_router)

    count = 0
    order = {n: i for i, n in enumerate(g.nodes)}      # the graph's nodes before any rewrite here
    for router in [n for n in g.nodes if is_call(n, lingc_ops.moe_router.default)]:
        if router.kwargs.get("softmax") or (len(router.args) > 8 and router.args[8]):
            continue                                    # rmsnorm_router's selection is the sigmoid one
        y = _through_identity_views(router.args[0])
        if not (is_call(y, operator.getitem) and y.args[1] == 0 and _weighted_rmsnorm(y.args[0])):
            continue
        rms = y.args[0]
        x, w, residual, eps = rms.args
        users = list(rms.users) + list(router.users)
        if any(not is_call(u, operator.getitem) for u in users):
            continue
        # The fused op takes the norm's place, so the router's other operands must exist there.
        if any(isinstance(a, fx.Node) and order[a] > order[rms] for a in router.args[1:]):
            continue
        with g.inserting_before(rms):
            new = emit(g, lingc_ops.rmsnorm_router.default, x, w, residual, eps, *router.args[1:],
                       **_norm_form(rms), **({"zero_fill": True} if router.kwargs.get("zero_fill") else {}))
        for u in list(rms.users):                       # y, h: outputs 0 and 1
            u.args = (new, u.args[1])
        for u in list(router.users):                    # ids, weights: outputs 2 and 3
            u.args = (new, u.args[1] + 2)
        g.erase_node(router)
        g.erase_node(rms)
        count += 1
    return count


def norms_into_kv_writes(g: fx.Graph) -> int:
    """c, _ = lingc.rmsnorm(x, w, None, eps) ; lingc.mla_kv_write(c, ...): one
    lingc.mla_kv_write(x, ..., w, eps) (the module docstring says when). Returns the norms folded."""
    import operator

    count = 0
    written = written_bases(g)
    for kv in [n for n in g.nodes if is_call(n, lingc_ops.mla_kv_write.default)]:
        if kv.kwargs.get("norm_weight") is not None or (len(kv.args) > 5 and kv.args[5] is not None):
            continue                                    # already with its norm
        chain, c = [], kv.args[0]
        # An MLA without rope dims passes a zero-width slice of c as its key (pdl_swap_mla).
        k = kv.args[1]
        empty_k = is_call(k, aten.slice.Tensor) and k.args[0] is c and shape(k)[-1] == 0 and len(k.users) == 1
        extra = int(empty_k)                            # c's one more reader: that slice
        while isinstance(c, fx.Node) and c is not _through_identity_views(c) and len(c.users) == 1 + extra:
            chain.append(c)
            c = c.args[0]
            extra = 0
        if not (is_call(c, operator.getitem) and c.args[1] == 0 and len(c.users) == 1 + extra
                and _weighted_rmsnorm(c.args[0])):
            continue
        rms = c.args[0]
        x, w, residual, eps = rms.args
        if residual is not None or any(u is not c and (not is_call(u, operator.getitem) or u.users)
                                       for u in rms.users):
            continue                                    # a residual, or x's copy has readers
        if _view_root(x)[0] in written:
            continue                  # the norm moves to the write: x must hold the same values there
        with g.inserting_before(kv):
            key = emit(g, aten.slice.Tensor, x, 1, 0, 0) if empty_k else kv.args[1]
            emit(g, lingc_ops.mla_kv_write.default, x, key, *kv.args[2:5], w, eps,
                 **{n: v for n, v in kv.kwargs.items() if n not in ("norm_weight", "eps")}, **_norm_form(rms))
        g.erase_node(kv)
        for v in [*([k] if empty_k else []), *chain, c, *[u for u in rms.users if u is not c], rms]:
            g.erase_node(v)
        count += 1
    return count


def norms_into_head_readers(g: fx.Graph) -> int:
    """rows = reshape(lingc.rmsnorm(reshape(x), w, None, eps)[0]) read by head_cache_write (its
    rows) or gqa_decode (its queries) -> the reader with x and the norm (module docstring).
    Returns the norms folded."""
    import operator

    count = 0
    written = written_bases(g)
    readers = (lingc_ops.head_cache_write.default, lingc_ops.gqa_decode.default)
    for op in [n for n in g.nodes if is_call(n, *readers)]:
        if op.kwargs.get("norm_weight") is not None:
            continue
        rows = op.args[0]
        T, H, D = shape(rows)
        chain, y = [], rows
        while is_call(y, *_RESHAPES) and len(y.users) == 1:
            chain.append(y)
            y = y.args[0]
        if not (chain and is_call(y, operator.getitem) and y.args[1] == 0 and len(y.users) == 1
                and is_call(y.args[0], lingc_ops.rmsnorm.default)):
            continue
        rms = y.args[0]
        src, w, residual, eps = rms.args[:4]
        if residual is not None or w is None or shape(src) != (T * H, D) or any(
                u is not y and (not is_call(u, operator.getitem) or u.users) for u in rms.users):
            continue                      # a residual, no gain, other rows, or x's copy is read
        x = src
        while is_call(x, *_RESHAPES) and shape(x) != (T, H, D):
            x = x.args[0]
        root, views = _view_root(x)
        if views and _is_lingc(root):
            refresh_vals(views)           # the views' strides as the lingc op lays its output out
        if shape(x) != (T, H, D) or (D > 1 and val(x).stride(2) != 1) or root in written or x in written:
            continue
        form = {k: v for k, v in rms.kwargs.items() if k in ("round_before_weight", "zero_centered") and v}
        with g.inserting_before(op):
            try:
                kw = {k: v for k, v in op.kwargs.items() if k not in ("norm_weight", "eps")}
                new = emit(g, op.target, x, *op.args[1:], **kw, norm_weight=w, eps=eps, **form)
            except ValueError:
                continue                  # a form or weight the reader cannot take: the norm stays
        op.replace_all_uses_with(new)
        new.meta.update({k: v for k, v in op.meta.items() if k != "val"})
        g.erase_node(op)
        for v in [*chain, y, *[u for u in rms.users if u is not y], rms]:
            g.erase_node(v)
        count += 1
    return count


def _lone_normed_rows(y):
    """y = getitem(norm, 0), the only value of norm (lingc.rmsnorm without a residual, or
    lingc.embedding_rmsnorm) anything reads, read once: (norm, its row source), else None."""
    import operator

    if not (is_call(y, operator.getitem) and y.args[1] == 0 and len(y.users) == 1):
        return None
    norm = y.args[0]
    if is_call(norm, lingc_ops.rmsnorm.default):
        if norm.args[2] is not None or not _weighted_rmsnorm(norm):
            return None
    elif not is_call(norm, lingc_ops.embedding_rmsnorm.default) or _zero_centered(norm):
        return None
    if any(u is not y and (not is_call(u, operator.getitem) or u.users) for u in norm.users):
        return None                       # the rows' copy (new_residual / the gathered x) is read
    return norm, norm.args[0]


def norm_pairs_into_concat(g: fx.Graph) -> int:
    """lingc.concat_cols(norm_a(..)[0], rmsnorm(b, ..)[0]) -> lingc.rmsnorm_pair_cols (the module
    docstring says when). Returns the concatenations rewritten."""
    from lingc.runtime.kernels import norms  # noqa: F401  (registers rmsnorm_pair_cols)

    count = 0
    written = written_bases(g)
    for cc in [n for n in g.nodes if is_call(n, lingc_ops.concat_cols.default)]:
        pa, pb = (_lone_normed_rows(y) for y in cc.args)
        if pa is None or pb is None or not _weighted_rmsnorm(pb[0]):
            continue
        if _rounds_before_weight(pa[0]) != _rounds_before_weight(pb[0]):
            continue                      # one flag gives both halves their form
        (na, src_a), (nb, src_b) = pa, pb
        ya, yb = val(cc.args[0]), val(cc.args[1])
        if ya.shape != yb.shape or ya.dtype != yb.dtype or na is nb:
            continue
        if is_call(na, lingc_ops.embedding_rmsnorm.default):
            table, ids, wa, eps_a = na.args
            a_args = (table, ids, wa, eps_a)
        else:
            x, wa, _, eps_a = na.args
            a_args = (x, None, wa, eps_a)
        rows = (src_a, src_b) if a_args[1] is None else (src_a, a_args[1], src_b)
        if any(_view_root(r)[0] in written for r in rows):
            continue                      # the norms move to the concatenation: their rows must not change
        b, wb, _, eps_b = nb.args
        with g.inserting_before(cc):
            new = emit(g, lingc_ops.rmsnorm_pair_cols.default, *a_args, b, wb, eps_b, **_norm_form(nb))
        cc.replace_all_uses_with(new)
        g.erase_node(cc)
        for norm in (na, nb):
            for u in list(norm.users):
                g.erase_node(u)
            g.erase_node(norm)
        count += 1
    return count
