"""MLA written in its textbook form (the cache's latent rows expanded through kv_b_proj into
per-head keys and values at every step) -> the absorbed form on lingc's kernels.

    before:  kvb = c[:L] @ W_b.T                       [L, H, nope + v]: the whole cache, every step
             k = cat(kvb[..., :nope], k_rope)  ;  o = softmax(q . k * s, causal) @ kvb[..., nope:]
    after:   q_lat = lingc.head_matmul(q_nope, W_uk)     [T, H, R]
             o_lat = lingc.mla_decode(q_lat, q_rope, cache, positions, s[, inv_freq])
             o     = lingc.head_matmul(o_lat, W_uv^T)    [T, H, v]

with W_b viewed [H, nope + v, R], W_uk = W_b[:, :nope], W_uv = W_b[:, nope:]. The two are equal
in real arithmetic (q_nope . (c W_uk^T) = (q_nope W_uk) . c and p (c W_uv^T) = (p c) W_uv^T);
the absorbed form reads the cache once per step (576 values a row in Ling-3) instead of
expanding it into H * (nope + v) values a row. DeepSeek's and Ling's MLA are usually written
absorbed by hand for decode (the source article's model code is); this rewrite gives a model
written the textbook way the same kernels. Numerics (declared): the products are summed in
another order (fp32), as any absorption does.

scaled_dot_product_attention's math form (the CPU trace's: q and k each scaled by sqrt(scale), a
"safe" softmax) is found the same way, and so is a fused SDPA op (the CUDA trace's; its probe runs
a CPU stand-in, lingc/sdpa.py). The queries and the output may be held token-major [T, H, .] or
head-major [H, T, .] (lingc/head_layout.py).

How it is found: pdl_swap hands over a softmax p whose value operand comes out of a projection
of cache rows (a lingc.gemm or mm with a weight, the rows a leading slice of a 2-d [L, R + P]
value). The region between that projection, the cache, the positions and the query leaves
and the attention output o [T, H, v] is cut out and run on random inputs, with the projection's
value computed from the random cache and a random W_b, against the absorbed reference under
each candidate scale and with the query's RoPE inside or not; only a match is rewritten.
"""

from __future__ import annotations

import itertools

import torch
import torch.fx as fx

from lingc.graph_build import emit
from lingc.graph_match import CASTS, aten, is_call, strip, weight_source
from lingc.graph_region import (descendants, is_heavy, random_like, region, region_module, rel_err,
                                run_region, shape, softmax_scales, val, widen_leaf)
from lingc.head_layout import emit_layout, emit_token_major, head_layouts, token_major, width
from lingc.pass_manager import VIEW_OPS

from .pdl_glue import narrowed
from .pdl_swap_common import below_lead, unit_lead

lingc_ops = torch.ops.lingc


def expansion(other: fx.Node, L: int):
    """(M, W_b, cache, R) when the attention's value operand ``other`` is a view of
    M = rows @ W_b^T with rows the first R columns of a 2-d [L, R + P] value ``cache`` (or a
    [1, L, R + P] one: a batch dim of 1), or the whole [L, R] cache of an MLA without rope dims;
    None otherwise."""
    n = other
    while is_call(n, *VIEW_OPS, *CASTS):
        n = n.args[0]
    if is_call(n, lingc_ops.gemm.default) and len(n.args[1]) == 1 and (len(n.args) < 3 or n.args[2] is None):
        rows, wb = n.args[0], n.args[1][0]
    elif is_call(n, aten.mm.default) and _transposed_weight(n.args[1]) is not None:
        rows, wb = n.args[0], _transposed_weight(n.args[1])
    else:
        return None
    if shape(rows) is None or len(shape(rows)) != 2 or shape(rows)[0] != L:
        return None
    R, c = shape(rows)[1], rows
    cache_like = lambda c: unit_lead(shape(c), 2) is not None and shape(c)[-1] > R  # noqa: E731
    while is_call(c, *VIEW_OPS, *CASTS) and not cache_like(c):
        c = c.args[0]
    if not cache_like(c) or shape(c)[-2] != L or shape(c)[-1] <= R + 1:
        # No rope dims (NoPE): the rows are the whole cache, [L, R] (or [1, L, R]).
        c = rows
        while is_call(c, *VIEW_OPS, *CASTS):
            c = c.args[0]
        if unit_lead(shape(c), 2) is None or tuple(shape(c)[-2:]) != (L, R):
            return None
    return n, wb, c, R


def _transposed_weight(w: fx.Node) -> fx.Node | None:
    """The parameter behind W^T, where W may be a reshape or an upcast of it (``W3.reshape(-1,
    R).T``, ``weight.float().T``): its rows are W's rows in order either way."""
    w = strip(w)
    if not (is_call(w, aten.permute.default) and list(w.args[1]) == [1, 0]) and not is_call(w, aten.t.default):
        return weight_source(w)
    w = strip(w.args[0])
    return w if w.op in ("placeholder", "get_attr") else None


def absorb(g: fx.Graph, htl: int, pc: fx.Node, found: tuple, pos_cands: list, placeholder, tol: dict,
           max_t: int) -> fx.Node | str:
    """Rewrite the expanded attention with htl = H * T * L probabilities whose value product (or
    fused attention output) is pc: the new lingc.mla_decode node, or why not. ``found``:
    expansion()'s result; ``placeholder``: pdl_swap's graph-input test."""
    M, wb, cache, R = found
    L, W = shape(cache)[-2:]
    P = W - R
    views = lambda n: n.op == "call_function" and n.target in VIEW_OPS  # noqa: E731
    for pos in pos_cands:
        T = shape(pos)[0]
        if T > max_t or htl % (L * T):
            continue
        H = htl // (L * T)
        if shape(M)[1] % H:
            continue
        dkv = shape(M)[1] // H                                  # nope + v
        outs = [u for u in descendants([pc], views) | {pc} if shape(u) and 0 < shape(u)[-1] < dkv
                and head_layouts(u, T, H, shape(u)[-1])]
        if not outs:
            continue
        order = {n: i for i, n in enumerate(g.nodes)}
        # The first token-major view of the output when there is one, else the first view.
        o = min(outs, key=lambda u: ("th" not in head_layouts(u, T, H, width(u)), order[u]))
        v = width(o)
        nope = dkv - v
        # Functionalisation re-derives a written view at each read (select(select_scatter(..)) twice
        # for the latent rows and the rope keys): every copy of the cache's expression is the cache.
        twins = {n for n in g.nodes if n.op == cache.op and n.target == cache.target and n.args == cache.args
                 and n.kwargs == cache.kwargs}
        stops = twins | {pos, M}
        local = descendants(stops, lambda n: not is_heavy(n)) - {n for n in g.nodes if is_heavy(n)} | {M}
        nodes, leaves = region([o], lambda n: n not in local or n in stops)
        widths = (nope + P, nope, P)
        widened = []
        for leaf in leaves:
            w, chain = (leaf, []) if leaf in stops or placeholder(leaf) else \
                widen_leaf(leaf, lambda n: head_layouts(n, T, H, *widths) or placeholder(n))
            widened.append(w)
            nodes += chain
        leaves = list(dict.fromkeys(widened))
        nodes = sorted(set(nodes) - set(leaves), key=order.__getitem__)
        freq = [n for n in leaves if placeholder(n) and shape(n) == (P // 2,) and val(n).is_floating_point()]
        qs = [n for n in leaves if n not in stops and head_layouts(n, T, H, *widths)]
        # The cache is read beside M for its rope keys (without rope dims only through M).
        if len(freq) > 1 or set(leaves) - set(qs) - set(freq) - stops or M not in leaves \
                or (P and not twins & set(leaves)):
            continue
        q_full = [n for n in qs if head_layouts(n, T, H, nope + P)]
        q_parts = ([n for n in qs if head_layouts(n, T, H, nope)], [n for n in qs if head_layouts(n, T, H, P)])
        if not ((len(q_full) == 1 and len(qs) == 1) or (len(qs) == 2 and all(len(x) == 1 for x in q_parts))):
            continue
        q_nodes = q_full if q_full else [q_parts[0][0], q_parts[1][0]]
        layouts = [head_layouts(n, T, H, width(n)) for n in q_nodes] + [head_layouts(o, T, H, v)]
        probe = _probe(nodes, leaves, o, M, wb, cache, twins, pos, freq[0] if freq else None, q_nodes, layouts,
                       (T, H, R, P, nope, v, L), tol)
        if probe is None:
            continue
        scale, rope, at = probe
        with g.inserting_before(o):
            # A query upcast from bf16 / fp16 (behind views) is read as the raw tensor: head_matmul
            # and mla_decode upcast in registers (exact; a rotated q_rope is rounded to its dtype
            # after the rotation, as the absorbed form's match does), and the upcast kernel goes.
            qt = [emit_token_major(g, narrowed(g, n), a) for n, a in zip(q_nodes, at)]
            if q_full:
                q_nope = emit(g, aten.slice.Tensor, qt[0], 2, 0, nope)
                q_rope = emit(g, aten.slice.Tensor, qt[0], 2, nope, nope + P)
            else:
                q_nope, q_rope = qt
            w3 = emit(g, aten.view.default, wb, [H, dkv, R])
            w_uk = emit(g, aten.slice.Tensor, w3, 1, 0, nope)                           # [H, nope, R]
            w_uv_t = emit(g, aten.permute.default, emit(g, aten.slice.Tensor, w3, 1, nope, dkv), [0, 2, 1])
            try:
                # heads_inner: the [H, T, .] products stored [T, H, .], so the permutes back are free.
                q_lat = emit(g, lingc_ops.head_matmul.default, emit(g, aten.permute.default, q_nope, [1, 0, 2]),
                             w_uk, True, None, True)
                q_lat = emit(g, aten.permute.default, q_lat, [1, 0, 2])                 # [T, H, R]
                o_lat = emit(g, lingc_ops.mla_decode.default, q_lat, q_rope, below_lead(g, cache, 2), pos, scale, None,
                             freq[0] if rope else None)
                out = emit(g, lingc_ops.head_matmul.default, emit(g, aten.permute.default, o_lat, [1, 0, 2]),
                           w_uv_t, True, None, True)
                out = emit(g, aten.permute.default, out, [1, 0, 2])                     # [T, H, v]
            except ValueError as e:
                return f"the absorbed kernels refused the inputs ({e})"
            if val(out).dtype != val(o).dtype:
                out = emit(g, aten._to_copy.default, out, dtype=val(o).dtype)
            out = emit_layout(g, out, at[-1])
        o.replace_all_uses_with(out)
        return o_lat
    return "expanded MLA: no assignment of the inputs reproduces the absorbed reference"


def _probe(nodes, leaves, o, M, wb, cache, twins, pos, freq, q_nodes, layouts, dims, tol):
    """(scale, rope, the layouts of q_nodes and o) under which the region equals the absorbed
    reference on random inputs. ``q_nodes``: [q] or [q_nope, q_rope]; ``layouts``: each one's
    and o's candidate layouts (lingc/head_layout.py)."""
    from lingc.compat import real_tensor_mode
    from lingc.runtime.kernels.mla_decode.naive import mla_decode_reference

    T, H, R, P, nope, v, L = dims
    with real_tensor_mode():
        gen = torch.Generator().manual_seed(0)
        x = {}
        x[cache] = random_like(cache, gen)
        for n in leaves:
            if n in twins:
                x[n] = x[cache]
            elif n is pos:
                x[n] = torch.sort(torch.randperm(L, generator=gen)[:T]).values.to(val(pos).dtype)
            elif n is freq:
                x[n] = torch.rand(shape(n), generator=gen).to(val(n).dtype)
            elif n is not M:
                x[n] = random_like(n, gen)
        w_val = random_like(wb, gen, 0.3)
        m_nodes, m_leaves = region([M], lambda n: n is cache or n is wb)
        if set(m_leaves) - {cache, wb}:
            return None
        env = {cache: x[cache], wb: w_val}
        m_out = run_region(region_module(m_nodes, m_leaves, [M]), [env[n] for n in m_leaves])
        if m_out is None:
            return None
        x[M] = m_out[0]
        got = run_region(region_module(nodes, leaves, [o]), [x[n] for n in leaves])
        if got is None:
            return None
        w3 = w_val.float().view(H, nope + v, R)
        scales = sorted(softmax_scales(nodes))
        kv = x[cache].reshape(L, -1)
        # The best candidate within the tolerance, not the first (a 16-bit cache's tolerance is
        # loose enough for a wrong scale or layout to come within it): stop at an exact one.
        best, limit = None, tol.get(val(cache).dtype, 3e-2)
        for at in itertools.product(*layouts):
            qt = [token_major(x[n], a) for n, a in zip(q_nodes, at)]
            q_nope, q_rope = (qt[0][..., :nope], qt[0][..., nope:]) if len(qt) == 1 else qt
            q_lat = torch.einsum("thn,hnr->thr", q_nope.float(), w3[:, :nope])
            got_t = token_major(got[0], at[-1]).float()
            for scale in scales:
                for rope in ((True, False) if freq is not None else (False,)):
                    o_lat = mla_decode_reference(q_lat, q_rope, kv, x[pos], scale, None, x[freq] if rope else None)
                    ref = torch.einsum("thr,hvr->thv", o_lat, w3[:, nope:])
                    err = rel_err(got_t, ref)
                    if err <= limit and (best is None or err < best[0]):
                        best = (err, (scale, rope, at))
                    if err <= tol[torch.float32]:
                        return scale, rope, at
    return None if best is None else best[1]
