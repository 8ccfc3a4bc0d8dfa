"""pdl_swap's MLA matcher: a latent-cache attention core becomes lingc.mla_decode, the cache's row
write lingc.mla_kv_write.

    before:  scores = (q_lat c^T + rope(q_rope) k_rope^T) * scale ; causal mask from positions ;
             softmax ; p @ c                              (T <= 16)
    after:   o_lat = lingc.mla_decode(q_lat, q_rope, kv[slot], positions, scale, None, inv_freq)

    before:  rows = cat(c, rope(k_rope, positions)) ; slot' = index_put(kv[slot], [positions], rows) ;
             kv' = select_scatter(kv, slot', 0, slot) ; ... ; copy_(kv, kv')     (~15 ops, and
             outside Inductor three copies of the whole cache slot)
    after:   lingc.mla_kv_write(c, k_rope, positions, inv_freq, kv[slot])    (in place, one kernel)

How it is found: the MLA core is everything between a softmax's p @ c output (the softmax's
maximum as amax, or max written by hand), or a fused attention op's output (a CUDA trace's SDPA,
lingc/sdpa.py), and the latent cache (a slot of a [slots, L, R + P] input, or a one-sequence
[L, R + P] input), the positions and the query projections, the queries and output token-major
[T, H, .] or head-major [H, T, .] (lingc/head_layout.py); a product of two computed values (p @ c
reaching the graph as mm) is inside a region, a product with a weight is a projection at its
edge. The cut-out region is run on random inputs and compared with mla_decode's reference under
every candidate scale (the region's constants below 1 and their squares, a divisor d as 1/d, a
fused op's scale) with the query's RoPE fused or not. An MLA whose values come out of a
projection of the cache rows (the textbook form, keys and values expanded through kv_b_proj at
every step) is handed to mla_absorb.py, which absorbs kv_b_proj into the query and the output
and rewrites it onto the same kernels.

The cache write is matched from the functional write itself (an index_put of rows into
select(cache input, 0, slot), scattered back and copied to the input at the epilogue), its rows
checked by running them on random inputs against [c ; interleaved rope(k)], or [c ; k] when no
inv_freq enters them (rope dims never rotated, Kimi Linear's mla_use_nope: mla_kv_write with
inv_freq None), or c alone for an MLA without rope dims (P = 0, the key a zero-width view; only
for a cache a lingc.mla_decode reads, since any row write has that form); it is rewritten only
when nothing reads the old cache after the write. The attention of an MLA without rope dims
runs mla_decode with a zero-width view of q_lat as its q_rope. A cache [1, L, R + P] written with
``cache[:, pos] = rows`` (a Hugging Face batch dim of 1) is the [L, R + P] cache below it, for
the write and the attention alike.

Numerics (declared): the reference evaluates one position at a time (batch-invariant in T). The
MLA head gate (the model multiplies by sigmoid(g) after the W_uv product) is folded into
mla_decode, which gates o_lat before that product: equal up to fp32 rounding, and the same in
decode and verify graphs.
"""

from __future__ import annotations

import itertools
import operator

import torch
import torch.fx as fx

from lingc.compat import real_tensor_mode
from lingc.graph_build import emit
from lingc.graph_match import CASTS, aten, is_call, scalar, strip
from lingc.graph_region import (ancestors, descendants, is_heavy, numel, random_like, region,
                                region_key, region_module, rel_err, run_region, shape, softmax_scales, val,
                                view_base, widen_leaf)
from lingc.head_layout import emit_layout, emit_token_major, head_layouts, token_major
from lingc.pass_manager import VIEW_OPS
from lingc.sdpa import sdpa_call

from . import mla_absorb
from .pdl_glue import narrowed
from .pdl_swap_gqa import per_head_cache, probe_positions
from .pdl_swap_common import MAX_T, PROBE_TOL, below_lead, drop_write_backs, graph_input, unit_lead, widest_up

lingc_ops = torch.ops.lingc


def _int_vector(a: fx.Node, htl: int, L: int) -> bool:
    """Whether a is a 1-d integer vector that could be the positions of the queries of an
    attention with htl = H * T * L probabilities over L keys."""
    v = val(a)
    return (isinstance(v, torch.Tensor) and v.dtype in (torch.int32, torch.int64)
            and len(shape(a)) == 1 and (htl // L) % shape(a)[0] == 0)


def _widest_part(leaf: fx.Node, T: int, W: int) -> tuple[fx.Node, list[fx.Node]]:
    """A leaf walked up to the widest [T, w < W] value it is part of (the key's [T, P] slice above
    its even/odd selects): (that node, the views passed)."""
    return widest_up(leaf, lambda n: (unit_lead(shape(n) or (), 2) is not None and shape(n)[-2] == T
                                      and 0 < shape(n)[-1] < W))


class MlaCores:
    """pdl_swap's MLA matcher (a mixin of PdlSwap: its notes, probe cache and flags)."""

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
            self._gqa_why = None
            why = att if isinstance(att, str) else self._mla_one(g, *att)
            if why and self._gqa_why:     # values in per-head caches: the GQA matcher's reason
                why = self._gqa_why
            if why:
                self.notes.append(f"{what} at {n.name}: MLA decode left ({why})")
            else:
                matches += 1
        return matches

    @staticmethod
    def _row_max(n: fx.Node) -> tuple[fx.Node, list[int]] | None:
        """(scores, dims) when n is the maximum a softmax subtracts: amax(s, dims) (no dims:
        all of s's), or the values of max(s, dim) (a softmax written out by hand)."""
        if is_call(n, aten.amax.default):
            dims = list(n.args[1] if len(n.args) > 1 else n.kwargs.get("dim", ()))
            return n.args[0], dims or list(range(n.args[0].meta["val"].dim()))
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
        pos_cands = ([a for a in anc if graph_input(a) and _int_vector(a, htl, L)]
                     + [a for a in anc if not graph_input(a) and a.op == "call_function" and _int_vector(a, htl, L)])
        expanded = mla_absorb.expansion(other, L)
        if expanded is not None:            # the textbook form: values expanded from the cache
            done = mla_absorb.absorb(g, htl, pc, expanded, pos_cands, graph_input, PROBE_TOL, MAX_T)
            if isinstance(done, str):
                return done
            self.absorbed += 1
            self.gates_folded += self._fold_head_gate(g, done, *shape(done)[:2])
            return None
        per_head, n = None, other
        while True:                       # values with heads of their own (MQA's one head too)
            if per_head_cache(n, L):
                per_head = n
            if not is_call(n, *VIEW_OPS, *CASTS, aten.clone.default):
                break
            n = n.args[0]
        if per_head is not None:          # MHA / GQA / MQA over key and value caches [L, heads, D]
            self._gqa_why = self._gqa_one(g, L, htl, pc, p, per_head, pos_cands)
            if self._gqa_why is None:
                return None
        kv, n = None, other
        # Through copies too: SDPA's math form repeats one key/value head for every query head
        # (enable_gqa) as expand + clone.
        rows_of_l = lambda n: unit_lead(shape(n), 2) is not None and shape(n)[-2] == L  # noqa: E731  ([1, L, .]: a batch of 1)
        while is_call(n, *VIEW_OPS, *CASTS, aten.clone.default):
            if rows_of_l(n):
                kv = n
            n = n.args[0]
        if rows_of_l(n) and (kv is None or shape(n)[-1] > shape(kv)[-1]):
            kv = n                                      # the cache holds one sequence: no slot view
        if kv is None:
            if len(shape(n) or ()) >= 3 and shape(n)[-3] == L:
                return ("softmax attention over per-head key and value caches with a batch of more than "
                        "one sequence: gqa_decode reads one sequence's caches")
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
            P = shape(kv)[-1] - R             # 0: no rope dims (NoPE), the cache the latent alone
            if T > MAX_T or P < 0 or P % 2:
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
                if leaf not in stops and not graph_input(leaf):
                    w, chain = widen_leaf(leaf, lambda n: head_layouts(n, T, H, R, P) or graph_input(n))
                widened.append(w)
                nodes += chain
            leaves = list(dict.fromkeys(widened))
            order = {n: i for i, n in enumerate(g.nodes)}
            nodes = sorted(set(nodes) - set(leaves), key=order.__getitem__)
            q_lat = [n for n in leaves if head_layouts(n, T, H, R) and n not in stops]
            q_rope = [n for n in leaves if P and head_layouts(n, T, H, P) and n not in stops]
            freq = [n for n in leaves if P and graph_input(n) and shape(n) == (P // 2,) and val(n).is_floating_point()]
            known = set(q_lat[:1] + q_rope[:1] + freq[:1] + [cache, pos])
            if len(q_lat) != 1 or len(q_rope) != (1 if P else 0) or len(freq) > 1 or set(leaves) - known \
                    or cache not in leaves:
                continue
            qr = q_rope[0] if P else None
            layouts = (head_layouts(q_lat[0], T, H, R), head_layouts(qr, T, H, P) if P else [None],
                       head_layouts(o_lat, T, H, R))
            with real_tensor_mode():
                found = self._mla_probe(nodes, leaves, o_lat, (cache, kv_chain), pos, q_lat[0], qr,
                                        freq[0] if freq else None, T, L, layouts)
            if found is None:
                continue
            scale, rope, (lat_at, rope_at, o_at) = found
            # The region upcasts the raw q_rope, rotates in fp32 and rounds back to its dtype: the
            # kernel does exactly that when handed the raw tensor (and the upcast kernel goes).
            # Unrotated, the upcast to fp32 is exact and the kernel reads either dtype. The cast
            # may sit behind views (T = 1): they are replayed on the raw tensor where they apply.
            with g.inserting_before(o_lat):
                if qr is not None:
                    qr = narrowed(g, qr, to_fp32_only=not rope)
                try:
                    ql = emit_token_major(g, q_lat[0], lat_at)
                    # No rope dims: a zero-width view of q_lat stands for q_rope (no kernel).
                    qr = emit_token_major(g, qr, rope_at) if P else emit(g, aten.slice.Tensor, ql, 2, 0, 0)
                    out = emit(g, lingc_ops.mla_decode.default, ql, qr, below_lead(g, kv, 2), pos, scale, None,
                               freq[0] if rope else None)
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
               at[cache], at[pos], at[q_lat], at.get(q_rope), at.get(freq), T, L, tuple(map(tuple, layouts)))
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
                # (Session 44 found the T = 1 graph of flash-tp4-rank taking the square of its
                # scale with positions at 0: probe_positions says why they sit high.)
                inputs.append(probe_positions(T, L, val(pos).dtype, gen))
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
        x[kv] = x[kv].reshape(x[kv].shape[-2:])            # below a batch dim of 1
        tol = PROBE_TOL.get(val(kv).dtype, 3e-2)
        scales = sorted(softmax_scales(nodes))
        from lingc.runtime.kernels.mla_decode.naive import mla_decode_reference

        # The candidate that reproduces the region best, not the first within the tolerance: two
        # scales (s and s^2 are both candidates) may both pass on a weakly peaked softmax.
        best, best_err = None, None
        for lat_at, rope_at, o_at in itertools.product(*layouts):
            for scale in scales:
                for rope in ((True, False) if freq is not None else (False,)):
                    ql = token_major(x[q_lat], lat_at)
                    qr = ql[..., :0] if q_rope is None else token_major(x[q_rope], rope_at)
                    ref = mla_decode_reference(ql, qr, x[kv], x[pos], scale, None, x[freq] if rope else None)
                    err = rel_err(token_major(got[0], o_at), ref)
                    if err <= tol and (best is None or err < best_err):     # the first of equals
                        best, best_err = (scale, rope, (lat_at, rope_at, o_at)), err
        return best

    # -- MLA cache write ----------------------------------------------------------------------

    @staticmethod
    def _read_by_mla(g: fx.Graph, cache_values: set) -> bool:
        """Whether some lingc.mla_decode reads its cache through views of one of ``cache_values``."""
        for n in g.nodes:
            if is_call(n, lingc_ops.mla_decode.default):
                kv = n.args[2]
                while is_call(kv, *VIEW_OPS):
                    kv = kv.args[0]
                if kv in cache_values:
                    return True
        return False

    def _kv_writes(self, g: fx.Graph) -> int:
        """Functional row writes of a [slots, L, R + P] cache input (or of a one-sequence [L, R + P]
        one) whose rows are [c ; rope(k)]
        become in-place lingc.mla_kv_write calls (after the norms: c is a lingc.rmsnorm output)."""
        order = {n: i for i, n in enumerate(g.nodes)}
        readers = {ph: set(ph.users) for ph in g.nodes if graph_input(ph)}
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
        # cache[pos] = rows, or cache[:, pos] = rows over a batch dim of 1 (indices [None, pos])
        lead = len(indices) - 1
        if (len(ip.args) > 3 and ip.args[3]) or not indices or not isinstance(indices[-1], fx.Node) \
                or any(i is not None for i in indices[:-1]) or unit_lead(shape(base), 2) != lead:
            return "not a row write"
        pos = indices[-1]
        if graph_input(base):
            ph, scat = base, ip           # a cache of one sequence [L, R + P]: rows written into the input
        elif is_call(base, aten.select.int) and graph_input(base.args[0]) and base.args[1] == 0:
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
        T, W = shape(pos)[0], shape(base)[-1]         # rows may reach index_put as a view, e.g. [W] at T = 1
        nodes, leaves = region([rows], lambda n: n is pos or is_heavy(view_base(n)))
        widened = []
        for leaf in leaves:
            w, chain = _widest_part(leaf, T, W)
            widened.append(w)
            nodes += chain
        leaves = list(dict.fromkeys(widened))
        mats = [n for n in leaves if n is not pos and unit_lead(shape(n), 2) is not None and shape(n)[-2] == T]
        whole = [n for n in leaves if n is not pos and numel(n) == T * W]
        if not mats and len(whole) == 1 and len(leaves) <= 2:
            # The rows whole, as a view (e.g. [W] at T = 1): the [T, W] value it views, if any.
            n, passed = whole[0], []
            while shape(n) != (T, W) and is_call(n, *VIEW_OPS) and numel(n.args[0]) == T * W:
                passed.append(n)
                n = n.args[0]
            if shape(n) == (T, W):
                leaves = [n if x is whole[0] else x for x in leaves]
                nodes = list(nodes) + passed
            mats = [n if shape(n) == (T, W) else whole[0]]
        if len(mats) == 1 and numel(mats[0]) == T * W:
            # An MLA without rope dims: the rows are the latent alone. Any cache row write has
            # that form, so only a cache that a lingc.mla_decode reads is taken.
            if not self._read_by_mla(g, {ph, base, ip, scat}):
                return "rows written whole into a cache no mla_decode reads"
            c, k, P = mats[0], None, 0
        elif len(mats) != 2 or sum(shape(m)[-1] for m in mats) != W:
            return (f"the rows are not built from one [T, R] and one [T, P] value (inputs "
                    f"{[(n.name, shape(n)) for n in leaves]})")
        else:
            c, k = sorted(mats, key=lambda m: -shape(m)[-1])              # R (512) > P (64)
            P = shape(k)[-1]
        freq = [n for n in leaves if P and graph_input(n) and shape(n) == (P // 2,) and val(n).is_floating_point()]
        # Without inv_freq the key is written as it is (Kimi Linear's never-rotated rope dims).
        if len(freq) > 1 or set(leaves) - {c, k, pos} != set(freq) or shape(c)[-1] == P:
            return "the rows' inputs are not (latent, key, positions, inv_freq) or (latent, key)"
        inv = freq[0] if freq else None
        order2 = {n: i for i, n in enumerate(g.nodes)}
        nodes = sorted(set(nodes) - set(leaves), key=order2.__getitem__)
        from lingc.runtime.kernels.mla_kv_write.naive import mla_kv_rows_reference
        gen = torch.Generator().manual_seed(0)
        with real_tensor_mode():
            x = {n: random_like(n, gen) for n in (c, k) if n is not None}
            x[pos] = torch.randint(0, 4096, (T,), generator=gen).to(val(pos).dtype)
            if inv is not None:
                x[inv] = torch.rand(P // 2, generator=gen).to(val(inv).dtype)
            got = run_region(region_module(nodes, leaves, [rows]), [x[n] for n in leaves])
            xc = x[c].reshape(T, -1)
            ref = mla_kv_rows_reference(xc, xc[:, :0] if k is None else x[k].reshape(T, -1), x[pos],
                                        None if inv is None else x[inv], val(rows).dtype)
            ok = got is not None and got[0].numel() == ref.numel()
            err = rel_err(got[0].reshape(ref.shape), ref) if ok else float("inf")
        if err > PROBE_TOL.get(val(rows).dtype, 3e-2):
            return "the rows are not [c ; interleaved rope(k)]" if inv is not None else "the rows are not [c ; k]"
        with g.inserting_before(ip):
            c = c if len(shape(c)) == 2 else emit(g, aten.reshape.default, c, [T, shape(c)[-1]])
            if k is None:
                k = emit(g, aten.slice.Tensor, c, 1, 0, 0)                 # no rope dims: [T, 0], a view
            elif len(shape(k)) != 2:
                k = emit(g, aten.reshape.default, k, [T, shape(k)[-1]])
            emit(g, lingc_ops.mla_kv_write.default, c, k, pos, inv, below_lead(g, base, 2))
        scat.replace_all_uses_with(ph)
        g.erase_node(scat)
        if ip is not scat:
            g.erase_node(ip)
        drop_write_backs(g, ph)
        return None
