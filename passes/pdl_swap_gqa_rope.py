"""pdl_swap's per-head cache writes, rotary embeddings and output gate: what is left around a
lingc.gqa_decode once the attention itself is on it.

    before:  k = rope(k_norm(...), positions) ; cache' = index_put(cache, [positions], k) ; ... ;
             copy_(cache, cache')       (the RoPE's ~15 small ops, and outside Inductor two copies
                                         of the whole cache a layer and step)
    after:   lingc.head_cache_write(k, positions, cache, inv_freq)    (in place, one kernel)

    before:  q = rope(q_norm(...), positions) ; o = lingc.gqa_decode(q, ...)
    after:   o = lingc.gqa_decode(q_norm(...), ..., inv_freq=inv_freq)  (rotated in its query load)

    before:  y = view(lingc.gqa_decode(...)) * sigmoid(g)     (Qwen3-Next's gated attention)
    after:   y = view(lingc.gqa_decode(..., gate=g'))           (g' the [T, H, D] view of g; the
                                                                 sigmoid and product in its combine)

How it is found: a row write is an index_put of rows into a graph input at the positions along
its row dim (``cache[pos] = rows``, Hugging Face's ``index_copy_`` along dim 2 of [1, H, L, D]),
copied back at the epilogue, whose new cache a lingc.gqa_decode reads (through views). The cache
below its unit leads is [L, H, D], [H, L, D], or [L, S, H, D] holding S parts per row (Qwen3-Next-
style keys and values stacked in one cache: ``cache[pos] = stack([k, v], 1)``), one write per
part. The rows' region (back to lingc kernels and projections, each leaf widened up its views to
the [T, H, D] value it is part of) is run on random inputs: a part must equal one leaf as it is,
or that leaf rotated by the positions with a 1-d float graph input as inv_freq (rotate-half or
interleaved pairs, the first 2 * len(inv_freq) dims), or rotated with the cos / sin rows of a
model's precomputed tables (graph inputs read at the positions, or per-token inputs: random table
values, every way pdl_swap_rope_tables.py lists), whatever the other leaves hold. A query
region of a gqa_decode is probed the same way against its positions and folded into the op's
inv_freq. An output gate is a product with sigmoid(g) (cast or not) of the only value computed
from the op's output through views and casts, g of its shape: the chain is run on an iota (its
casts as identities) to check it is a head layout of the output (or its [T, H * D] flattening),
and g is taken to the op's [T, H, D] through the inverse view. Anything else is left as it is,
with a note.

Numerics (declared): the kernels rotate in fp32 and round once to the rows' dtype; a 16-bit
model's eager RoPE multiplies in its dtype (one rounding per product), within the probe tolerance.
The gate multiplies the fp32 output before its cast (eager: the rounded output times the rounded
sigmoid, rounded again).
"""

from __future__ import annotations

import torch
import torch.fx as fx

from lingc.compat import real_tensor_mode
from lingc.graph_build import emit
from lingc.graph_match import aten, is_call
from lingc.graph_region import (is_heavy, numel, random_like, region, region_module, rel_err, run_region, shape, val,
                                view_base)
from lingc.head_layout import emit_token_major, head_layouts, token_major
from lingc.pass_manager import VIEW_OPS

from .pdl_swap_common import (MAX_T, PASSES, PROBE_TOL, below_lead, drop_write_backs, graph_input, unit_lead,
                              widest_up)
from .pdl_swap_rope_tables import probe_position_limit, table_sources

lingc_ops = torch.ops.lingc
MAX_PARTS = 4                     # rows of a cache holding several values each (keys and values: 2)


def _rows_layout(n: fx.Node, T: int, H: int, D: int) -> str | None:
    """How n holds [T, H, D] rows: a head layout (lingc/head_layout.py), "flat" [T * H, D] or
    [T, H * D] (reshaped to [T, H, D]), or None."""
    lays = head_layouts(n, T, H, D)
    if lays:
        return lays[0]
    return "flat" if shape(n) in ((T * H, D), (T, H * D)) and (T > 1 or H > 1) else None


def _widest_rows(leaf: fx.Node, T: int, H: int, D: int) -> tuple[fx.Node, list[fx.Node]]:
    """A leaf walked up to the furthest value holding whole [T, H, D] rows (a rotated slice's
    parent row): (that value, the nodes passed on the way)."""
    return widest_up(leaf, lambda n: numel(n) == T * H * D and _rows_layout(n, T, H, D) is not None)


def _token_major_probe(x: torch.Tensor, layout: str, T: int, H: int, D: int) -> torch.Tensor:
    return x.reshape(T, H, D) if layout == "flat" else token_major(x, layout)


def _emit_rows(g: fx.Graph, n: fx.Node, layout: str, T: int, H: int, D: int) -> fx.Node:
    return emit(g, aten.reshape.default, n, [T, H, D]) if layout == "flat" else emit_token_major(g, n, layout)


def _freq_inputs(leaves: list[fx.Node], D: int) -> list[fx.Node]:
    return [n for n in leaves if graph_input(n) and len(shape(n) or ()) == 1 and 1 <= 2 * shape(n)[0] <= D
            and val(n).is_floating_point()]


def _probe_positions(T: int, dtype: torch.dtype, gen: torch.Generator, limit: int = 4096) -> torch.Tensor:
    """Distinct positions spread over a long context (below ``limit``: a rope table's rows), so
    each angle turns a different way."""
    return torch.sort(torch.randperm(limit, generator=gen)[:T]).values.to(dtype)


def _rows_probe(nodes, leaves, out, pos, T, H, D, part, target=None, head_major=False):
    """Which leaf the rows' part ``part`` (None: the whole rows; else (dim, index)) is, as it is
    or rotated: (leaf, its layout, rope, interleaved) or None, rope None (no rotation), ("freq",
    inv_freq leaf) or ("table", TableSource, rope_dims) (pdl_swap_rope_tables.py). The rows are
    [T, H, D] below unit leads ([H, T, D] with ``head_major``), in the shape ``target`` when
    given (the written rows index_put broadcasts)."""
    from lingc.runtime.kernels.head_cache_write.naive import (rope_heads_reference, rope_heads_table_reference,
                                                              rope_table_rows)

    freqs = _freq_inputs(leaves, D) if pos in leaves else []    # angles need the positions
    tables = table_sources(leaves, {pos, *freqs}, T)
    data = [n for n in leaves if n is not pos and n not in freqs]    # a table's input may be rows too
    gen = torch.Generator().manual_seed(0)
    limit = probe_position_limit(tables, T, 4096)
    if limit < T:
        return None
    x = {n: _probe_positions(T, val(n).dtype, gen, limit) if n is pos else random_like(n, gen) for n in leaves}
    for f in freqs:
        x[f] = torch.rand(shape(f), generator=gen).to(val(f).dtype)
    with real_tensor_mode():
        got = run_region(region_module(nodes, leaves, [out]), [x[n] for n in leaves])
        if got is None:
            return None
        o = got[0] if target is None else got[0].reshape(target)
        o = o if part is None else o.select(*part)
        o = o.reshape(o.shape[-3:]) if o.dim() > 3 and unit_lead(tuple(o.shape), 3) is not None else o
        o = o.transpose(0, 1) if head_major else o
        tol = PROBE_TOL.get(val(out).dtype, 3e-2)
        ropes = [(None, False)] + [(("freq", f), i) for f in freqs for i in (False, True)]
        ropes += [(("table", t, r), i) for t in tables for r in t.rope_dims(D) for i in (False, True)]
        for leaf in data:
            lay = _rows_layout(leaf, T, H, D)
            if lay is None:
                continue
            xt = _token_major_probe(x[leaf], lay, T, H, D)
            for rope, inter in ropes:
                if rope is None:
                    want = xt
                elif rope[0] == "freq":
                    want = rope_heads_reference(xt, x[pos], x[rope[1]], inter)
                else:
                    src, r = rope[1], rope[2]
                    if pos not in x and not src.by_token(T):
                        continue                      # rows that never see the positions: no lookup at them
                    at = x.get(pos, torch.arange(T))  # by token, only T counts
                    cos, sin = (rope_table_rows(v, at, src.by_token(T)) for v in src.values(x))
                    want = rope_heads_table_reference(xt, cos, sin, r, inter)
                if o.shape == want.shape and rel_err(o.float(), want.float()) <= tol:
                    return leaf, lay, rope, inter
    return None


def _rope_kwargs(g: fx.Graph, rope, T: int) -> dict:
    """The kernel arguments of a probe's rope (emitted at g's insertion point)."""
    if rope is None:
        return {}
    if rope[0] == "freq":
        return {"inv_freq": rope[1]}
    src, r = rope[1], rope[2]
    cos, sin = src.emit(g)
    return {"rope_cos": cos, "rope_sin": sin, "rope_dims": r, "rope_by_token": src.by_token(T)}


def _widened_region(outputs: list[fx.Node], stops: set, T: int, H: int, D: int):
    """The region behind ``outputs`` back to lingc kernels, projections, graph inputs and
    ``stops``, each leaf widened up its views to the rows it is part of: (nodes, leaves)."""
    nodes, leaves = region(outputs, lambda n: n in stops or is_heavy(view_base(n)))
    widened = []
    for leaf in leaves:
        w, chain = (leaf, []) if leaf in stops or graph_input(leaf) else _widest_rows(leaf, T, H, D)
        widened.append(w)
        nodes = list(nodes) + chain
    leaves = list(dict.fromkeys(widened))
    order = {n: i for i, n in enumerate(outputs[0].graph.nodes)}
    return sorted(set(nodes) - set(leaves), key=order.__getitem__), leaves


def _cache_readers(g: fx.Graph) -> set:
    """The values whose views some lingc.gqa_decode reads as its key or value cache."""
    bases = set()
    for n in g.nodes:
        if is_call(n, lingc_ops.gqa_decode.default):
            for c in n.args[1:3]:
                while True:
                    bases.add(c)
                    if not is_call(c, *VIEW_OPS):
                        break
                    c = c.args[0]
    return bases


def _output_layout(op: fx.Node, chain: list[fx.Node], T: int, H: int, D: int) -> str | None:
    """The layout in which the view / cast chain from op's [T, H, D] output holds it ("flat":
    [T, H * D]), checked by running the chain on an iota; None when it is no such layout."""
    end = chain[-1] if chain else op
    lays = head_layouts(end, T, H, D) or (["flat"] if shape(end) == (T, H * D) else [])
    if not lays or not chain:
        return lays[0] if lays else None
    # Casts are run as identities: an iota past 256 does not survive bf16 (a 16-bit model's
    # chain casts the op's output before its gate), and a cast moves no element.
    casts = [n for n in chain if is_call(n, torch.ops.prims.convert_element_type.default)]
    iota = torch.arange(T * H * D, dtype=torch.float32).reshape(T, H, D)
    with real_tensor_mode():
        got = run_region(region_module(chain, [op], [end], identities=casts), [iota])
    if got is None:
        return None
    for lay in lays:
        if torch.equal(got[0].float().reshape(T, H, D) if lay == "flat" else token_major(got[0].float(), lay), iota):
            return lay
    return None


class GqaRope:
    """pdl_swap's per-head cache writes, query RoPE and output gate folds (a mixin of PdlSwap:
    its notes)."""

    def _head_cache_writes(self, g: fx.Graph) -> int:
        """Row writes of per-head caches a gqa_decode reads -> lingc.head_cache_write (module
        docstring). Returns the writes emitted (one per part)."""
        read = _cache_readers(g)
        order = {n: i for i, n in enumerate(g.nodes)}
        readers = {ph: set(ph.users) for ph in g.nodes if graph_input(ph)}
        count = 0
        for ip in [n for n in g.nodes if is_call(n, aten.index_put.default) and n in read]:
            done = self._head_cache_write_one(g, ip, order, readers)
            if isinstance(done, str):
                self.notes.append(f"per-head cache write {ip.name} left: {done}")
            else:
                count += done
        return count

    def _head_cache_write_one(self, g: fx.Graph, ip: fx.Node, order: dict, readers: dict) -> int | str:
        ph, indices, rows = ip.args[:3]
        if (len(ip.args) > 3 and ip.args[3]) or not graph_input(ph) or not val(ph).is_floating_point():
            return "not a row write into a float cache input"
        at = len(indices) - 1
        pos = indices[-1]
        s = shape(ph)
        if (not isinstance(pos, fx.Node) or any(i is not None for i in indices[:-1]) or len(shape(pos) or ()) != 1
                or val(pos).dtype not in (torch.int32, torch.int64)):
            return "not a write at one integer positions tensor"
        T, after = shape(pos)[0], s[at + 1:]
        # The row dim at `at`, unit leads above the cache's own dims (a Hugging Face batch of 1).
        if len(after) == 2 and unit_lead(s, 3) == at:
            form, (H, D), parts = "lh", after, [None]
        elif len(after) == 1 and at >= 1 and unit_lead(s, 3) == at - 1:
            form, H, D, parts = "hl", s[at - 1], after[0], [None]
        elif len(after) == 3 and unit_lead(s, 4) == at and after[0] <= MAX_PARTS:
            form, (H, D) = "parts", after[1:]
            parts = [(at + 1, i) for i in range(after[0])]
        else:
            return f"a cache {s} written along dim {at} is not [L, H, D], [H, L, D] or [L, parts, H, D]"
        below = s[len(s) - (4 if form == "parts" else 3):]
        target = tuple(s[:at]) + (T,) + tuple(s[at + 1:])
        got = tuple(shape(rows) or ())
        # index_put broadcasts: at T = 1 the rows may come without their unit leading dims.
        if T > MAX_T or D < 2 or got != target[len(target) - len(got):] or numel(rows) != T * H * D * len(parts):
            return f"rows {shape(rows)} are not T = {T} (<= {MAX_T}) whole rows of the cache {s}"
        late = [u for u in readers.get(ph, ()) if u is not ip and order.get(u, -1) > order[ip]
                and not (is_call(u, aten.copy_.default) and u.args[0] is ph)]
        if late:
            return "the old cache is read after the write"
        nodes, leaves = _widened_region([rows], {pos}, T, H, D)
        found = []
        for part in parts:
            hit = _rows_probe(nodes, leaves, rows, pos, T, H, D, part, target, head_major=form == "hl")
            if hit is None:
                what = "the rows" if part is None else f"part {part[1]} of the rows"
                return f"{what} are not one [T, H, D] value as it is or rotated by the positions"
            found.append(hit)
        existing = set(g.nodes)
        with g.inserting_before(ip):
            try:
                for part, (x, lay, rope, inter) in zip(parts, found):
                    cache = below_lead(g, ph, len(below))
                    if form == "hl":
                        cache = emit(g, aten.permute.default, cache, [1, 0, 2])
                    elif form == "parts":
                        cache = emit(g, aten.select.int, cache, 1, part[1])
                    kw = _rope_kwargs(g, rope, T)
                    emit(g, lingc_ops.head_cache_write.default, _emit_rows(g, x, lay, T, H, D), pos, cache,
                         kw.pop("inv_freq", None), inter, **kw)
            except ValueError as e:
                for n in reversed([n for n in g.nodes if n not in existing]):
                    g.erase_node(n)                  # a part already emitted: the write stays whole
                return str(e)
        ip.replace_all_uses_with(ph)
        g.erase_node(ip)
        drop_write_backs(g, ph)
        return len(parts)

    def _rope_into_gqa(self, g: fx.Graph) -> int:
        """The queries' rotary embedding of each gqa_decode -> its inv_freq (module docstring).
        Returns the attentions whose queries' RoPE was folded."""
        count = 0
        for op in [n for n in g.nodes if is_call(n, lingc_ops.gqa_decode.default)]:
            if op.kwargs.get("inv_freq") is not None or op.kwargs.get("rope_cos") is not None or len(op.args) > 7:
                continue
            q, pos = op.args[0], op.args[3]
            T, HQ, D = shape(q)
            nodes, leaves = _widened_region([q], {pos}, T, HQ, D)
            if not any(n.op == "call_function" and n.target not in PASSES for n in nodes):
                continue                                           # the queries as they are: nothing to fold
            hit = _rows_probe(nodes, leaves, q, pos, T, HQ, D, None)
            if hit is None or hit[2] is None:
                self.notes.append(f"{op.name}: the queries' computation is not a rotary embedding of one "
                                  f"[T, H, D] value by the positions; left before gqa_decode")
                continue
            x, lay, rope, inter = hit
            with g.inserting_before(op):
                op.args = (_emit_rows(g, x, lay, T, HQ, D),) + tuple(op.args[1:])
                rope_kw = _rope_kwargs(g, rope, T)
            op.kwargs = {**op.kwargs, **rope_kw, "interleaved": inter}
            count += 1
        return count

    def _gates_into_gqa(self, g: fx.Graph) -> int:
        """o * sigmoid(g) after a gqa_decode -> its gate (module docstring). Returns the gates
        folded."""
        order = {n: i for i, n in enumerate(g.nodes)}
        count = 0
        for op in [n for n in g.nodes if is_call(n, lingc_ops.gqa_decode.default)]:
            if op.kwargs.get("gate") is not None or len(op.args) > 9:
                continue
            T, H, D = shape(op)
            chain, n = [], op
            while len(n.users) == 1 and is_call(next(iter(n.users)), *PASSES):
                n = next(iter(n.users))
                chain.append(n)
            if len(n.users) != 1 or not is_call(mul := next(iter(n.users)), aten.mul.Tensor):
                continue
            sig = next((a for a in mul.args[:2] if a is not n), None)
            while is_call(sig, torch.ops.prims.convert_element_type.default) and len(sig.users) == 1:
                sig = sig.args[0]         # sigmoid(g) cast to the product's dtype
            if not is_call(sig, aten.sigmoid.default) or shape(sig) != shape(n) or len(sig.users) != 1:
                continue
            x = sig.args[0]
            lay = _output_layout(op, chain, T, H, D)
            if lay is None or order[x] > order[op] or val(x).dtype not in (torch.float32, torch.bfloat16, torch.float16):
                self.notes.append(f"{op.name}: the gate at {mul.name} is not on a head layout of its output; left")
                continue
            with g.inserting_before(op):
                gate = _emit_rows(g, x, lay, T, H, D)
            op.kwargs = {**op.kwargs, "gate": gate}
            mul.replace_all_uses_with(n)
            g.erase_node(mul)
            count += 1
        return count
