"""The glue pdl_swap rewrites once the attention cores and norms are lingc ops: the small ATen
kernels between them, each a full (non-programmatic) edge in the captured graph. The folds of a
norm into the lingc op beside it are pdl_norm_folds.py's.

    before:  o = clone(reshape(lingc.kda_chain(...)))          a copy of a fresh, contiguous value
    after:   o = reshape(lingc.kda_chain(...))

    before:  y = convert(view(lingc.gated_head_rmsnorm(..., None)), bf16)
    after:   y = view(lingc.gated_head_rmsnorm(..., bf16))       (rounded once, in the kernel)

    before:  q32 = convert(view(q), f32) ; w32 = convert(slice(W), f32)      (W a parameter)
             out = bmm(views(q32), views(w32)) [; convert(view(out), bf16)]
    after:   out = lingc.head_matmul(views(q), views(slice(W)), True [, bf16])

    before:  y = convert(convert(x_bf16, f32), bf16)             after: y = x_bf16

    before:  y = cat([x[.., a:b], x[.., b:c], ...], d)            (x's whole dim d, in order)
    after:   y = x

    before:  copy_(buf, copy(x, v))                              (functionalisation's epilogue)
    after:   copy_(buf, v)
    before:  copy_(buf, slice_scatter(buf, copy(s, v), d, a, b))
    after:   copy_(slice(buf, d, a, b), v)
    before:  copy_(buf, slice_scatter(...slice_scatter(buf, s_1, d, a_1, b_1)..., s_k, d, a_k, b_k))
    after:   copy_(slice(buf, d, a_1, b_1), s_1) ; ... ; copy_(slice(buf, d, a_k, b_k), s_k)
    before:  y = index(cast(lingc.gemm(x, ws), f32), [i])           (the cast optional)
    after:   y = cast(lingc.gemm(index(x, [i]), ws), f32)
    before:  v = cast(lingc.gemm(x, ws), f32) ; ... ; copy_(slice(buf, 0, a, b), v)   (buf an input)
    after:   lingc.gemm_rows_into(x, ws, ..., buf, a) ; ... (v's readers read slice(buf, 0, a, b))
    before:  v = lingc.greedy_verdict(chain, y) ; ... ; copy_(buf, v)        (buf a graph input)
    after:   lingc.greedy_verdict_out(chain, y, buf) ; ... (v's readers read buf)
    before:  y, h = lingc.rmsnorm(x, w, r, eps) ; ... ; copy_(buf, y)          (buf a graph input)
    after:   h = lingc.rmsnorm_out(x, w, r, eps, buf) ; ... (y's readers read buf)
    before:  copy_(buf, cat([a, b, ...]))                                     (buf a graph input)
    after:   lingc.concat_into([a, b, ...], buf)
    before:  y = lingc.sampled_targets(...) ; copy_(buf, y)        (after the relay tail's fold)
    after:   lingc.sampled_targets_out(..., buf)

    before:  q = view(clone(qkvz_piece), [T, N]) ; lingc.kda_chain(q, ...)
             (qkvz_piece a [T, A, B] split piece of a fused projection's output grouped per q/k
             head, Qwen3-Next's fix_query_key_value_ordering; likewise k, v, b, a and z for
             gated_head_rmsnorm's gate)
    after:   lingc.kda_chain(qkvz_piece, ...)           (read as its row-major [T, A * B] rows)

    before:  y = cat([a, b], -1)                  (a [T, D1], b [T, D2], one dtype, 2-d)
    after:   y = lingc.concat_cols(a, b)

    before:  pos = n + iota(T) ; lingc.mla_decode(..., slice(pos, 0, a, b), ...)    (n a [1] tensor)
    after:   lingc.mla_decode(..., n, ..., pos_offset=a)

The third is MLA's absorbed products (q_nope @ W_uk, o_lat @ W_uv^T per head): ATen upcasts the
bf16 weight slice to a fresh fp32 copy every step, then runs a library bmm. On flash-tp4-rank's
decode graph these were 28 elementwise kernels and 14 library GEMMs per step.

Why each is exact:
- a clone is dropped only when its input is contiguous (so the clone has the same layout), its
  storage is a lingc op's output (custom ops return fresh tensors, never an alias of an input)
  and nothing in the graph writes the input or the clone in place (read from the op schemas);
- a head-grouped piece x [T, A, B] (unit stride along B) is read by kda_chain and
  gated_head_rmsnorm as its row-major [T, A * B] rows, which are the values of a contiguous copy
  of x viewed as [T, N] (N = A * B; for the norm's gate [T, H, V], V dividing B); only where
  nothing in the graph writes x's storage or the copy in place (so the copy's snapshot and x hold
  the same values). Qwen3-Next's six such copies a Gated DeltaNet layer were ATen / Inductor
  kernels, full edges between the projection and the chain;
- a cat of slices that rejoin their tensor x in order along the sliced dim is x's values; it is
  replaced by x only when x is contiguous (so the cat's layout) and no op writes x's storage or
  the cat in place (an MLA whose rope dims are not rotated concatenates its query's two slices
  back: one copy kernel and a full edge a layer);
- a cast moves into the op that produced its input only through view ops (which commute with an
  elementwise cast) and only into an op that computes in fp32 and rounds once to ``out_dtype``;
- the bmm's operands are rebuilt by replaying their view chain on the pre-cast tensors (a cast
  from a narrower float type to fp32 is exact and head_matmul upcasts in registers); a chain
  that does not replay as views on the narrower tensor's strides is left alone. ``b_is_weight``
  is set only for a parameter no op of the graph writes (read before the kernel's PDL wait);
- an epilogue write (the copy_ into a mutated input that functionalisation appends) takes its
  value straight from v, without the snapshot copy, only when v's storage is written by no op of
  the graph (so the snapshot and v hold the same values when the epilogue runs) and v already
  has the snapshot's shape and dtype; a slice_scatter into the buffer becomes a write of the
  slice only when that copy_ is the only op writing the buffer (the other elements keep the
  values the slice_scatter would have copied). Each removed snapshot is one copy kernel, and on
  the GPU a full (non-PDL) edge, at the end of every relay step;
- a chain of slice_scatters into an input (functionalisation's form of several slices of one
  buffer written in a step: each link copies the whole buffer) is its slices' copies at the
  chain's end only when that copy_ is the only op writing the buffer and nothing else reads the
  buffer or a link but the next link and the snapshot slices (so each link's slice holds exactly
  its own write at the end);
- a GEMM's rows picked by an integer index (dim 0) are the GEMM of the picked rows of x, bit for
  bit: lingc.gemm is batch invariant (a row's value does not depend on the other rows: design.md;
  tests/test_gemm.py), and a cast between is elementwise. Only for a GEMM without epilogue
  operands whose value (and cast) nothing else reads, and whose x no op writes (the GEMM moves
  to where the rows are picked). Sampled drafts' extend read the accepted
  row of its [S + 1, V] logits: a cast of every row and an index kernel, where the row's GEMM
  can write it straight into the relay buffer (below);
- a GEMM writes its rows into an input itself (``gemm_rows_into``: rounded to x.dtype, stored as
  the input's dtype, which is what the copy of ``.float()`` of its value stored) only when the
  input is written by nothing but such dim-0 row copies of disjoint rows and read by nothing
  else: the rows are then written earlier than the copy_ wrote them, where no reader sees the
  difference, and the GEMM's value (or its fp32 cast) had no reader other than the cast and the
  copy, whose readers read the written rows. Sampled drafts copied each draft's logits row into
  relay.draft_logits: a cast, a copy and a whole-buffer slice_scatter a draft, and a copy_ at
  the graph's end;
- a norm's out variant writes the rows rmsnorm would return (the same kernel, ``out=``, in
  either form: ``round_before_weight`` goes with it); the
  copy it replaces was the verify graph's last ATen kernel (the final norm's rows into
  relay.vhid, a full edge: 2.0 us of each relay step on the H200, session 31's profile). Only
  where every reader of the norm takes one result (getitem). ``drawn_token_writes`` does the same
  for ``sampled_targets``, after relay_tail: that fold keeps a drawn seed's copy (its DRAWN form),
  the extend_sample graph's last ATen kernel;
- ``concat_into`` copies its parts' values (runtime/kernels/concat_into): only a dim-0 cat of
  1 to 16 contiguous parts of the input's dtype, into a contiguous input no other op reads or
  writes (so no part is a view of it). The relay's draft graph wrote its chain as a cat and a
  copy (3.8 us, two full edges at the end of each draft graph, session 31's profile).
- a concatenation copies its inputs' values (runtime/kernels/concat_cols): only two 2-d inputs of
  one dtype with unit column stride, along the last dim. ATen's cat is a full edge in the captured
  graph; NEXTN's eh_proj (26 MB) behind it could not stream its weights until the copy ended.
- the relay's chain positions (metadata_capture's ``n + arange(T)``) reach the ops that read
  positions (``mla_kv_write``, ``mla_decode``, ``gqa_decode``, ``head_cache_write``) as the base n and a static offset, and each
  kernel forms n + offset + t where it loaded positions[t] (runtime/kernels/positions.py): the
  same integers. Only for an add of a [1] integer tensor and an iota from 0 by 1, read by those
  ops in their positions slot directly or through a slice along dim 0 by step 1. The iota and the
  add were the first two kernels of every captured step graph (full edges: 4.1 us a plain
  decode step, 4.2-5.9 us at the head of each relay graph on the H200, session 30's profile).
"""

from __future__ import annotations

import operator

import torch
import torch.fx as fx

from lingc.graph_build import emit, refresh_vals
from lingc.graph_match import CASTS, aten, is_call
from lingc.graph_region import shape, val
from lingc.pass_manager import VIEW_OPS, write_counts, written_bases

__all__ = ["absorbed_products", "concat_cols", "concat_into_inputs", "direct_epilogue_writes", "direct_lingc_writes",
           "drop_fresh_clones", "drop_round_trips", "fold_casts", "gemm_rows_into_inputs", "grouped_views_into_readers",
           "positions_into_readers", "rejoined_slices", "rows_picked_before_gemm", "scattered_writes"]

lingc_ops = torch.ops.lingc
_FLOATS = (torch.float32, torch.bfloat16, torch.float16)


def _is_lingc(n) -> bool:
    return (isinstance(n, fx.Node) and n.op == "call_function"
            and isinstance(n.target, torch._ops.OpOverload) and n.target.namespace == "lingc")


def _view_root(n: fx.Node) -> tuple[fx.Node, list[fx.Node]]:
    """(the node whose storage n views, the view nodes from it to n in order)."""
    chain = []
    while is_call(n, *VIEW_OPS):
        chain.append(n)
        n = n.args[0]
    return n, chain[::-1]


def drop_fresh_clones(g: fx.Graph) -> int:
    count = 0
    written = written_bases(g)
    for n in list(g.nodes):
        if not is_call(n, aten.clone.default) or n.kwargs.get("memory_format") not in (None, torch.preserve_format,
                                                                                          torch.contiguous_format):
            continue
        x = n.args[0]
        root, chain = _view_root(x)
        if _is_lingc(root):
            refresh_vals(chain)               # the views' strides as the lingc op lays its output out
        if not (_is_lingc(root) and val(x).is_contiguous() and root not in written and n not in written):
            continue
        n.replace_all_uses_with(x)
        g.erase_node(n)
        count += 1
    return count


_SPLITS = (aten.split.Tensor, aten.split_with_sizes.default)
# lingc ops that read a per-token input as a head-grouped [T, A, B] view: {op: its argument slots}
_GROUPED_READERS = {"kda_chain": (0, 1, 2, 3, 4), "gated_head_rmsnorm": (1,)}


def _view_or_piece_chain(n: fx.Node) -> list[fx.Node]:
    """The views and split pieces (getitem of a split) from n's storage root to n, in order."""
    chain = []
    while is_call(n, *VIEW_OPS) or (n.op == "call_function" and n.target is operator.getitem
                                    and is_call(n.args[0], *_SPLITS)):
        chain.append(n)
        if n.target is operator.getitem:
            chain.append(n.args[0])
            n = n.args[0]
        n = n.args[0]
    return chain[::-1]


def grouped_views_into_readers(g: fx.Graph) -> int:
    """reader(view(clone(x)))  ->  reader(x), x a head-grouped [T, A, B] piece (module docstring).
    Returns the inputs now read in place."""
    count = 0
    written = written_bases(g)
    for n in list(g.nodes):
        name = getattr(n.target, "_opname", None) if _is_lingc(n) else None
        for i in _GROUPED_READERS.get(name, ()):
            a = n.args[i]
            views = []
            while is_call(a, aten.view.default, aten.reshape.default, aten._unsafe_view.default):
                views.append(a)
                a = a.args[0]
            if not (views and is_call(a, aten.clone.default)
                    and a.kwargs.get("memory_format") in (None, torch.contiguous_format)):
                continue
            x = a.args[0]
            chain = _view_or_piece_chain(x)
            if chain and _is_lingc(chain[0].args[0]):
                refresh_vals(chain)           # the pieces' strides as the lingc op lays its output out
            root = chain[0].args[0] if chain else x
            want, have = shape(n.args[i]), shape(x)
            if (len(have) != 3 or val(x).stride(2) != 1 or have[0] != want[0] or root in written
                    or a in written or x in written):
                continue
            rows = have[1] * have[2]
            if not ((len(want) == 2 and want[1] == rows)                                      # kda_chain's [T, N]
                    or (len(want) == 3 and want[1] * want[2] == rows and have[2] % want[2] == 0)):  # [T, H, V]
                continue
            n.args = (*n.args[:i], x, *n.args[i + 1:])
            count += 1
    return count


def _slice_args(n: fx.Node, first: int = 2) -> tuple | None:
    """(dim, start, end, step) of a slice node whose args[first:] hold them (a slice_scatter's from
    2, a slice's from 1), or None when they are not plain values."""
    names = ("dim", "start", "end", "step")
    defaults = {"dim": 0, "start": None, "end": None, "step": 1}
    vals = dict(zip(names, n.args[first:]))
    vals.update({k: v for k, v in n.kwargs.items() if k in names})
    out = tuple(vals.get(k, defaults[k]) for k in names)
    return None if any(isinstance(v, fx.Node) for v in out) else out


def _slice_span(n: fx.Node, rank: int) -> tuple | None:
    """(dim, start, end) of a step-1 ``aten.slice.Tensor`` with plain arguments, normalised to its
    input's size; None otherwise."""
    args = _slice_args(n, 1) if is_call(n, aten.slice.Tensor) else None
    if args is None or args[3] not in (1, None):
        return None
    dim, start, end = 0 if args[0] is None else args[0], args[1], args[2]
    size = shape(n.args[0])[dim]
    start = 0 if start is None else (start + size if start < 0 else start)
    end = size if end is None else (end + size if end < 0 else end)
    return dim % rank, max(0, min(start, size)), max(0, min(end, size))


def rejoined_slices(g: fx.Graph) -> int:
    """cat of step-1 slices of one contiguous x along the cat's dim, adjacent and covering the
    whole dim in order -> x (the module docstring says when that is exact)."""
    count = 0
    written = written_bases(g)
    for n in list(g.nodes):
        if not is_call(n, aten.cat.default) or len(n.args[0]) < 2:
            continue
        parts, rank = n.args[0], len(shape(n))
        dim = (n.args[1] if len(n.args) > 1 else n.kwargs.get("dim", 0)) % rank
        spans = [_slice_span(p, rank) for p in parts]
        if any(s is None or s[0] != dim for s in spans) or len({p.args[0] for p in parts}) != 1:
            continue
        x = parts[0].args[0]
        if spans[0][1] != 0 or spans[-1][2] != shape(x)[dim] or any(a[2] != b[1] for a, b in zip(spans, spans[1:])):
            continue
        if not val(x).is_contiguous() or _view_root(x)[0] in written or n in written or val(x).dtype != val(n).dtype:
            continue
        n.replace_all_uses_with(x)
        g.erase_node(n)
        count += 1
    return count


def _slice_write(cur: fx.Node, rank: int):
    """cur's one slice write (out[.., i] = x, functionalised: select_scatter(cur, copy(select(cur,
    d, i), x), d, i)) when those are cur's only users: (the select_scatter, d, i, x), else None."""
    if len(cur.users) != 2:
        return None
    ss = [u for u in cur.users if is_call(u, aten.select_scatter.default) and u.args[0] is cur]
    if len(ss) != 1:
        return None
    u = ss[0]
    d, i = u.args[2] % rank, u.args[3]
    cp = u.args[1]
    sel = cp.args[0] if is_call(cp, aten.copy.default) else None
    if not (is_call(sel, aten.select.int) and sel.args[0] is cur and sel in cur.users
            and sel.args[1] % rank == d and sel.args[2] == i):
        return None
    x = cp.args[1]
    if shape(x) != shape(sel) or val(x).dtype != val(sel).dtype:
        return None
    return u, d, i % shape(cur)[d], x


def slice_fills(g: fx.Graph) -> int:
    """A fresh tensor (aten.full / zeros, possibly cast or moved to the device) written at every
    index of one dim, once each (Hugging Face's recurrences: out = zeros(..).to(v);
    out[:, :, i] = o_i) -> unsqueeze(o_0, d) when that dim has one index (a view: no kernel at
    decode's T = 1, where the fill and the copy were two),
    stack(o_0..o_{n-1}, d) otherwise (one kernel for n + 1). Exact: every element is overwritten,
    by a value of the same dtype, so the fill value is never read."""
    count = 0
    for n in list(g.nodes):
        if n.graph is None or not is_call(n, aten.full.default, aten.zeros.default):
            continue
        base = n                # through its casts and device moves (zeros(..).to(v) on the host)
        while len(base.users) == 1 and is_call(next(iter(base.users)), *CASTS, torch.ops.prims.device_put.default):
            base = next(iter(base.users))
        rank, cur, dim, xs = len(shape(n)), base, None, {}
        while True:
            w = _slice_write(cur, rank)
            if w is None or (dim is not None and w[1] != dim) or w[2] in xs:
                break
            cur, dim = w[0], w[1]
            xs[w[2]] = w[3]
        if dim is None or len(xs) != shape(n)[dim]:
            continue
        rows = [xs[i] for i in range(len(xs))]
        with g.inserting_before(cur):
            new = (emit(g, aten.unsqueeze.default, rows[0], dim) if len(rows) == 1
                   else emit(g, aten.stack.default, rows, dim))
        cur.replace_all_uses_with(new)
        count += 1
    return count


# lingc ops that compute in fp32 and round once to an optional out_dtype: op -> its argument index.
_OUT_DTYPE_ARG = {"gated_head_rmsnorm": 4, "head_matmul": 3}


def fold_casts(g: fx.Graph) -> int:
    count = 0
    for n in list(g.nodes):
        if n.graph is None or not _is_lingc(n):
            continue
        idx = _OUT_DTYPE_ARG.get(n.target._schema.name.split("::")[-1])
        if (idx is None or n.kwargs or (len(n.args) > idx and n.args[idx] is not None)
                or val(n).dtype != torch.float32):
            continue                      # (lingc's passes emit these ops with positional args)
        chain, cur = [], n
        while len(cur.users) == 1:
            u = next(iter(cur.users))
            if is_call(u, *VIEW_OPS) and u.args[0] is cur:
                chain.append(u)
                cur = u
                continue
            break
        cast = next(iter(cur.users)) if len(cur.users) == 1 else None
        if cast is None or not is_call(cast, *CASTS) or val(cast).dtype not in _FLOATS:
            continue
        args = list(n.args) + [None] * (idx + 1 - len(n.args))
        args[idx] = val(cast).dtype
        with g.inserting_before(cast):
            y = emit(g, n.target, *args)
            for v in chain:
                y = emit(g, v.target, y, *v.args[1:], **v.kwargs)
        cast.replace_all_uses_with(y)
        count += 1
    return count


def drop_round_trips(g: fx.Graph) -> int:
    """cast(cast(x, fp32), x.dtype) with x bf16 / fp16 -> x: the upcast is exact, so the pair is
    the identity (the dense MLP's SwiGLU output on its way to the down projection)."""
    count = 0
    for n in list(g.nodes):
        if not is_call(n, *CASTS) or not is_call(n.args[0], *CASTS):
            continue
        x = n.args[0].args[0]
        if val(n.args[0]).dtype == torch.float32 and val(x).dtype in (torch.bfloat16, torch.float16) \
                and val(n).dtype == val(x).dtype:
            n.replace_all_uses_with(x)
            count += 1
    return count


def _unsnapshot(v, written: set) -> object:
    """v = copy(x, src) with src of v's shape and dtype and src's storage written by no op: src;
    else v."""
    if not (is_call(v, aten.copy.default) and len(v.args) == 2 and not v.kwargs and len(v.users) == 1):
        return v
    src = v.args[1]
    if not isinstance(src, fx.Node) or _view_root(src)[0] in written:
        return v
    a, b = val(src), val(v)
    return src if a.shape == b.shape and a.dtype == b.dtype else v


def direct_epilogue_writes(g: fx.Graph) -> int:
    """The snapshot copies feeding the epilogue writes into mutated inputs, removed (the module
    docstring says when that is exact). Returns the writes changed."""
    count = 0
    writes = write_counts(g)
    written = set(writes)
    for c in list(g.nodes):
        if not (is_call(c, aten.copy_.default) and len(c.args) == 2 and not c.kwargs and not c.users):
            continue
        dst, v = c.args
        if not (isinstance(dst, fx.Node) and dst.op == "placeholder"):
            continue
        part = _slice_args(v) if is_call(v, aten.slice_scatter.default) else None
        if part is not None and v.args[0] is dst and len(v.users) == 1 and writes.get(dst) == 1:
            with g.inserting_before(c):
                view = emit(g, aten.slice.Tensor, dst, *part)
                emit(g, aten.copy_.default, view, _unsnapshot(v.args[1], written))
            g.erase_node(c)
            count += 1
            continue
        src = _unsnapshot(v, written)
        if src is not v:
            c.args = (dst, src)
            count += 1
    return count


def scattered_writes(g: fx.Graph) -> int:
    """copy_(input, slice_scatter(...slice_scatter(input, s_1, d, a_1, b_1)..., s_k, d, a_k, b_k))
    -> copy_(slice(input, d, a_i, b_i), s_i) for each i (the module docstring says when). Returns
    the slice_scatters removed."""
    writes = write_counts(g)
    written = set(writes)
    count = 0
    for c in list(g.nodes):
        if not (is_call(c, aten.copy_.default) and len(c.args) == 2 and not c.kwargs and not c.users):
            continue
        dst, top = c.args
        if not (isinstance(dst, fx.Node) and dst.op == "placeholder" and writes.get(dst) == 1):
            continue
        links, s = [], top
        while is_call(s, aten.slice_scatter.default) and _slice_args(s) is not None:
            links.append(s)
            s = s.args[0]
        if s is not dst or len(links) < 2:
            continue
        links.reverse()                                   # from the one reading dst to top
        # Each state between two links is read only by the next link and by the slice that
        # functionalisation's copy snapshots (its values at that point: rows no other link wrote).
        inner = [dst] + links[:-1]
        if any(u is not nxt and u is not c and not _snapshot_slice(u)
               for state, nxt in zip(inner, links) for u in state.users) or len(top.users) != 1:
            continue
        with g.inserting_before(c):
            for link in links:
                dim, start, end, step = _slice_args(link)
                view = emit(g, aten.slice.Tensor, dst, dim, start, end, step)
                emit(g, aten.copy_.default, view, _unsnapshot(link.args[1], written))
        g.erase_node(c)
        count += len(links)
    return count


def _snapshot_slice(n: fx.Node) -> bool:
    """n = slice(state, ...) read only as the self argument of functional copies."""
    return is_call(n, aten.slice.Tensor) and all(is_call(u, aten.copy.default) and u.args[0] is n for u in n.users)


def rows_picked_before_gemm(g: fx.Graph) -> int:
    """index(cast?(lingc.gemm(x, ws)), [i]) -> cast?(lingc.gemm(index(x, [i]), ws)): the GEMM runs
    on the rows it is read at (the module docstring says when). Returns the GEMMs rewritten."""
    count = 0
    written = set(write_counts(g))
    for n in list(g.nodes):
        if is_call(n, aten.index.Tensor) and len(n.args) == 2 and len(n.args[1]) == 1:
            rows = n.args[1][0]
        elif is_call(n, aten.index_select.default) and n.args[1] == 0:
            rows = n.args[2]
        else:
            continue
        src = n.args[0]
        cast = src if is_call(src, *CASTS) else None
        gemm = cast.args[0] if cast is not None else src
        if not (isinstance(rows, fx.Node) and val(rows).dim() == 1 and not val(rows).is_floating_point()
                and is_call(gemm, lingc_ops.gemm.default) and not gemm.kwargs
                and all(a is None for a in gemm.args[2:]) and len(src.users) == 1
                and (cast is None or len(gemm.users) == 1)):
            continue
        x = gemm.args[0]
        if _view_root(x)[0] in written:
            continue                         # (the GEMM moves to the index: x must not change between)
        with g.inserting_before(n):
            picked = emit(g, n.target, x, *n.args[1:])
            out = emit(g, lingc_ops.gemm.default, picked, *gemm.args[1:])
            if cast is not None:
                out = emit(g, cast.target, out, *cast.args[1:], **cast.kwargs)
        n.replace_all_uses_with(out)
        for dead in (n, cast, gemm):
            if dead is not None:
                g.erase_node(dead)
        count += 1
    return count


def gemm_rows_into_inputs(g: fx.Graph) -> int:
    """copy_(slice(input, 0, a, b), v) with v a lingc.gemm's value, or its cast to the input's
    fp32 -> lingc.gemm_rows_into(..., input, a) right after the GEMM, whose readers read the
    input's rows (the module docstring says when). Returns the writes made direct."""
    from lingc.runtime.kernels.gemm import op as gemm_op  # noqa: F401  (registers gemm_rows_into)

    count = 0
    writes = write_counts(g)
    by_input: dict[fx.Node, list] = {}
    for c in g.nodes:
        if is_call(c, aten.copy_.default) and len(c.args) == 2 and not c.kwargs and not c.users \
                and is_call(c.args[0], aten.slice.Tensor) and c.args[0].args[0].op == "placeholder":
            by_input.setdefault(c.args[0].args[0], []).append(c)
    for dst, copies in by_input.items():
        # Any other use of the input would see the rows written early: only its row writes.
        targets = {c.args[0]: c for c in copies}
        if writes.get(dst) != len(copies) or any(u not in targets or set(u.users) != {targets[u]} for u in dst.users):
            continue
        spans = [_slice_span(c.args[0], val(dst).dim()) for c in copies]
        if any(sp is None or sp[0] != 0 for sp in spans) or not _disjoint([sp[1:] for sp in spans]):
            continue
        for c, (_, start, end) in zip(copies, spans):
            v = c.args[1]
            gemm = v.args[0] if is_call(v, *CASTS) and _cast_dtype(v) == val(dst).dtype == torch.float32 else v
            if not (is_call(gemm, lingc_ops.gemm.default) and not gemm.kwargs and val(v).shape == val(c.args[0]).shape):
                continue
            if gemm is not v and len(gemm.users) != 1 or val(gemm).shape[0] != end - start \
                    or val(dst).dtype not in (val(gemm).dtype, torch.float32):
                continue
            x, weights, *epilogue = list(gemm.args) + [None] * (5 - len(gemm.args))
            g.erase_node(c)
            with g.inserting_after(gemm):
                into = emit(g, lingc_ops.gemm_rows_into.default, x, weights, *epilogue, dst, start)
            with g.inserting_after(into):
                rows = emit(g, aten.slice.Tensor, dst, 0, start, end)
            v.replace_all_uses_with(rows)
            g.erase_node(v)
            if gemm is not v:
                g.erase_node(gemm)
            count += 1
    return count


def _disjoint(spans: list[tuple[int, int]]) -> bool:
    spans = sorted(spans)
    return all(a[1] <= b[0] for a, b in zip(spans, spans[1:]))


def _cast_dtype(n: fx.Node):
    return n.args[1] if n.target is torch.ops.prims.convert_element_type.default else n.kwargs.get("dtype")


def _out_variants() -> dict:
    from lingc.runtime.kernels import norms  # noqa: F401  (registers rmsnorm_out)
    from lingc.runtime.relay import ops as relay_ops  # noqa: F401  (registers the verdict ops)

    return {lingc_ops.greedy_verdict.default: lingc_ops.greedy_verdict_out.default,
            lingc_ops.greedy_emit.default: lingc_ops.greedy_emit_out.default,
            lingc_ops.rmsnorm.default: lingc_ops.rmsnorm_out.default}


def _input_writes(g: fx.Graph):
    """(c, dst, v) for each c = copy_(dst, v) with dst a contiguous graph input that nothing else
    reads and v of its shape and dtype (the graph's writes of values into relay buffers)."""
    for c in list(g.nodes):
        if not (is_call(c, aten.copy_.default) and len(c.args) == 2 and not c.kwargs and not c.users):
            continue
        dst, v = c.args
        if not (isinstance(dst, fx.Node) and dst.op == "placeholder" and len(dst.users) == 1
                and isinstance(v, fx.Node) and val(dst).is_contiguous()):
            continue
        if val(dst).shape == val(v).shape and val(dst).dtype == val(v).dtype:
            yield c, dst, v


def direct_lingc_writes(g: fx.Graph, variants: dict | None = None) -> int:
    """copy_(input, v) with v a lingc op's value (or rmsnorm's normed rows) -> the op's out
    variant writing the input (the module docstring says when); `variants` maps ops to their out
    variants (default: the verdict ops' and rmsnorm's). Returns the copies removed."""
    import operator

    variants = _out_variants() if variants is None else variants
    count = 0
    for c, dst, v in _input_writes(g):
        op = v.args[0] if v.target is operator.getitem and v.args[1] == 0 else v
        if not (op.op == "call_function" and op.target in variants):
            continue
        if set(op.kwargs) - {a.name for a in variants[op.target]._schema.arguments}:
            continue                         # a keyword the out variant does not take
        if op is not v and any(u is not v and not (is_call(u, operator.getitem) and u.args[1] == 1)
                               for u in op.users):
            continue                         # the norm's rows read other than through v
        g.erase_node(c)
        args, kwargs = _out_call(op, variants[op.target], dst)
        with g.inserting_before(op):
            new = emit(g, variants[op.target], *args, **kwargs)
        v.replace_all_uses_with(dst)
        g.erase_node(v)
        if op is not v:                      # rmsnorm: its second result is the out variant's value
            for u in list(op.users):
                u.replace_all_uses_with(new)
                g.erase_node(u)
            g.erase_node(op)
        count += 1
    return count


def _out_call(op: fx.Node, variant, dst: fx.Node) -> tuple[list, dict]:
    """The arguments of `variant` (an out variant, its written argument named out) for op's call
    writing dst: op's positional arguments up to out's place, dst, and any later ones by name."""
    at = [a.name for a in variant._schema.arguments].index("out")
    names = [a.name for a in op.target._schema.arguments]
    return [*op.args[:at], dst], {**op.kwargs, **{names[i]: a for i, a in enumerate(op.args) if i >= at}}


def drawn_token_writes(g: fx.Graph) -> int:
    """copy_(input, lingc.sampled_targets(...)) -> lingc.sampled_targets_out(..., input):
    direct_lingc_writes for the draw. pdl_swap runs it after relay_tail, whose DRAWN form keeps
    that copy. Returns the copies removed."""
    from lingc.runtime.relay import ops as relay_ops  # noqa: F401  (registers sampled_targets_out)

    return direct_lingc_writes(g, {lingc_ops.sampled_targets.default: lingc_ops.sampled_targets_out.default})


def concat_into_inputs(g: fx.Graph) -> int:
    """copy_(input, cat(parts)) -> lingc.concat_into(parts, input) (the module docstring says
    when). Returns the concatenations rewritten."""
    from lingc.runtime.kernels.concat_into.op import MAX_PARTS  # (registers lingc::concat_into)

    count = 0
    for c, dst, v in _input_writes(g):
        if not (is_call(v, aten.cat.default) and len(v.users) == 1):
            continue
        parts = v.args[0]
        dim = v.args[1] if len(v.args) > 1 else v.kwargs.get("dim", 0)
        ndim = val(dst).dim()
        if dim not in (0, -ndim) or not 1 <= len(parts) <= MAX_PARTS:
            continue
        if not all(isinstance(p, fx.Node) and val(p).is_contiguous() and val(p).dtype == val(dst).dtype
                   and val(p).dim() == ndim for p in parts):
            continue
        with g.inserting_before(c):
            emit(g, lingc_ops.concat_into.default, list(parts), dst)
        g.erase_node(c)
        g.erase_node(v)
        count += 1
    return count


def _position_readers() -> dict:
    """{op: index of its positions argument} of the ops that take ``pos_offset``."""
    import lingc.runtime.kernels.gqa_decode  # noqa: F401  (registers lingc::gqa_decode)
    import lingc.runtime.kernels.head_cache_write  # noqa: F401  (registers lingc::head_cache_write)

    return {lingc_ops.mla_kv_write.default: 2, lingc_ops.mla_decode.default: 3, lingc_ops.gqa_decode.default: 3,
            lingc_ops.head_cache_write.default: 1}


def _iota_from_zero(n) -> bool:
    """n = iota(T) / arange(T), counting from 0 by 1."""
    if is_call(n, torch.ops.prims.iota.default):
        length = n.args[0]
        start, step = n.kwargs.get("start", 0), n.kwargs.get("step", 1)
    elif is_call(n, aten.arange.default):
        length, start, step = n.args[0], 0, 1
    elif is_call(n, aten.arange.start_step, aten.arange.start):
        start, length = n.args[0], n.args[1]
        step = n.args[2] if len(n.args) > 2 else n.kwargs.get("step", 1)
    else:
        return False
    ints = all(isinstance(v, int) and not isinstance(v, bool) for v in (length, start, step))
    return ints and (start, step) == (0, 1)


def _base_plus_iota(add) -> fx.Node | None:
    """The [1] integer base n of add = n + iota(T) (either order), else None."""
    if not (is_call(add, aten.add.Tensor) and len(add.args) == 2 and not add.kwargs):
        return None
    for n, r in (add.args, add.args[::-1]):
        if (isinstance(n, fx.Node) and _iota_from_zero(r) and tuple(shape(n)) == (1,)
                and val(n).dtype in (torch.int32, torch.int64) and val(add).dtype == val(n).dtype):
            return n
    return None


def _row_offset(view, add) -> int | None:
    """a for view = add, or slice(add, 0, a, b[, 1]) with a >= 0; else None."""
    if view is add:
        return 0
    if not (is_call(view, aten.slice.Tensor) and view.args[0] is add and not view.kwargs):
        return None
    dim, start, _end, step = (list(view.args[1:]) + [0, None, None, 1][len(view.args) - 1:])[:4]
    start = 0 if start is None else start
    if dim != 0 or step != 1 or not isinstance(start, int) or start < 0:
        return None
    return start


def positions_into_readers(g: fx.Graph) -> int:
    """lingc readers of positions = n + iota(T) (or of a row slice of it) -> the reader takes n
    and ``pos_offset`` (the module docstring says when). Returns the readers rewritten."""
    readers = _position_readers()
    count = 0
    for add in list(g.nodes):
        base = _base_plus_iota(add)
        if base is None:
            continue
        for view in [add, *add.users]:
            offset = _row_offset(view, add)
            if offset is None:
                continue
            for r in list(view.users):
                idx = readers.get(r.target) if r.op == "call_function" else None
                if (idx is None or len(r.args) <= idx or r.args[idx] is not view or "pos_offset" in r.kwargs
                        or sum(a is view for a in list(r.args) + list(r.kwargs.values())) != 1):
                    continue
                r.args = r.args[:idx] + (base,) + r.args[idx + 1:]
                r.kwargs = {**r.kwargs, "pos_offset": offset}
                count += 1
    return count


def concat_cols(g: fx.Graph) -> int:
    """cat([a, b], -1) of two 2-d tensors of one dtype -> lingc.concat_cols (the module docstring
    says when). Returns the concatenations rewritten."""
    from lingc.runtime.kernels import concat_cols as _concat  # noqa: F401  (registers lingc::concat_cols)

    count = 0
    for n in [n for n in g.nodes if is_call(n, aten.cat.default)]:
        tensors = n.args[0]
        dim = n.args[1] if len(n.args) > 1 else n.kwargs.get("dim", 0)
        if len(tensors) != 2 or not all(isinstance(t, fx.Node) for t in tensors):
            continue
        a, b = (val(t) for t in tensors)
        if a is None or b is None or a.dim() != 2 or b.dim() != 2 or dim not in (1, -1):
            continue
        if a.dtype != b.dtype or a.shape[0] != b.shape[0] or a.device != b.device:
            continue
        if any(t.shape[1] > 1 and t.stride(1) != 1 for t in (a, b)):
            continue
        with g.inserting_before(n):
            new = emit(g, lingc_ops.concat_cols.default, *tensors)
        n.replace_all_uses_with(new)
        g.erase_node(n)
        count += 1
    return count


def _uncast(n: fx.Node):
    """n = views(cast(src)) with src a narrower-or-equal float: (src, the views), else (n, [])."""
    root, chain = _view_root(n)
    if is_call(root, *CASTS) and val(root).dtype == torch.float32 and val(root.args[0]).dtype in _FLOATS:
        return root.args[0], chain
    return n, []


def _replay(g: fx.Graph, src: fx.Node, chain: list[fx.Node]) -> fx.Node:
    y = src
    for v in chain:
        y = emit(g, v.target, y, *v.args[1:], **v.kwargs)
    return y


def _replay_or(g: fx.Graph, src: fx.Node, chain: list[fx.Node], fallback: fx.Node) -> fx.Node:
    """The view chain replayed on src, or ``fallback`` where a view does not replay on src's
    strides (emit's fake-tensor run refuses it; the nodes it made go dead)."""
    try:
        return _replay(g, src, chain)
    except (RuntimeError, ValueError):
        return fallback


def narrowed(g: fx.Graph, n: fx.Node, to_fp32_only: bool = True) -> fx.Node:
    """n, or where n is views of a cast of a bf16 / fp16 tensor (a cast to fp32; with
    ``to_fp32_only`` False any cast), those views replayed on that tensor: for a lingc op that
    upcasts its operand in registers, which then drops the cast kernel (n itself where the views
    do not replay on the narrower tensor's strides)."""
    root, chain = _view_root(n)
    if is_call(root, *CASTS) and val(root.args[0]).dtype in (torch.bfloat16, torch.float16) \
            and (not to_fp32_only or val(root).dtype == torch.float32):
        return _replay_or(g, root.args[0], chain, n)
    return n


def absorbed_products(g: fx.Graph) -> tuple[int, int]:
    """fp32 bmm of few rows -> lingc.head_matmul (see the module docstring): (products
    rewritten, transposing copies saved by the heads_inner layout)."""
    from lingc.runtime.kernels.head_matmul import MAX_ROWS
    from lingc.runtime.kernels.head_matmul.kernel import MAX_K

    count = saved = 0
    written = written_bases(g)
    for n in list(g.nodes):
        if not is_call(n, aten.bmm.default) or val(n).dtype != torch.float32:
            continue
        a, b = n.args
        _, m, k = shape(a)
        if m > MAX_ROWS or k > MAX_K:
            continue
        (a_src, a_chain), (b_src, b_chain) = _uncast(a), _uncast(b)
        b_root, _ = _view_root(b_src)
        weight = b_root.op == "placeholder" and b_root not in written
        try:
            with g.inserting_before(n):
                new_a = _replay(g, a_src, a_chain)
                new_b = _replay(g, b_src, b_chain)
                new = emit(g, lingc_ops.head_matmul.default, new_a, new_b, weight)
        except (RuntimeError, ValueError):
            continue                      # a view that does not replay on the narrower strides
        n.replace_all_uses_with(new)
        saved += _heads_inner_if_it_saves_a_copy(g, new)
        count += 1
    return count, saved


def _heads_inner_if_it_saves_a_copy(g: fx.Graph, new: fx.Node) -> bool:
    """When new's views end in a contiguous clone (o [H, T, V] -> [T, H, V] for o_proj) that the
    [T, H, V] storage layout makes a no-op: the heads_inner product with its views replayed takes
    the clone's place (the old product and views go dead)."""
    chain, cur = [], new
    while len(cur.users) == 1 and is_call(next(iter(cur.users)), *VIEW_OPS):
        cur = next(iter(cur.users))
        chain.append(cur)
    clone = next(iter(cur.users)) if len(cur.users) == 1 else None
    if not chain or not is_call(clone, aten.clone.default) or val(cur).is_contiguous():
        return False
    with g.inserting_before(clone):
        alt = emit(g, new.target, *new.args, None, True)
        probe = _replay(g, alt, chain)
    if not val(probe).is_contiguous():
        return False                      # dead nodes: the caller's dead-code pass drops them
    clone.replace_all_uses_with(probe)
    g.erase_node(clone)
    return True
