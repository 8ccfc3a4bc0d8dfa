"""pdl_swap's GQA matcher: softmax attention over per-head key and value caches becomes
lingc.gqa_decode.

    before:  scores = q k^T * scale (k, v cache rows [L, kv_heads, D], repeated for each group of
             query heads) ; causal mask from positions (or a sliding window) ; softmax ; p @ v
             (T <= 16)
             (or one fused attention op, lingc/sdpa.py, with enable_gqa or repeated heads)
    after:   o = lingc.gqa_decode(q, k_cache, v_cache, positions, scale, window)      [T, HQ, DV] in the
             region's dtype (a 16-bit model's output rounded once by the op's store)

How it is found: pdl_swap_mla's attention search hands over every attention whose values are a
per-head cache, [L, kv_heads, DV] or Hugging Face's [kv_heads, L, DV] (after this step's row write;
a batch dim of 1 above it is dropped; a head-major cache is read through a permuted view). The
key cache is the latest per-head value the scores read that is not the values' cache, an input
of it or a view of it (each cache taken below its casts: a bf16 SDPA's math form on CUDA upcasts
both to fp32 before it repeats them); the query is the furthest [T, HQ, D] (or head-major, lingc/head_layout.py)
value on the scores' other side through views, casts and copies (before it: its norm and rotary
embedding, left as they are). The region between those, the positions and the output is run on
random inputs against gqa_decode's reference under every candidate scale (pdl_swap_mla's rule),
every sliding window its integer constants could spell (none first) and every layout; the best
one within the tolerance is rewritten, the op writing the region's dtype (``out_dtype``). If
the probe fails the attention goes on to the MLA matcher (an MLA's latent rows can look like one
head's), and the GQA matcher's reason is reported when that fails too.

Numerics (declared): the kernel computes in fp32 with split 16-bit operands (runtime/kernels/
gqa_decode/README.md); a bf16 model's SDPA rounds scores and probabilities to bf16, so the
compiled attention is closer to fp32 than the eager one.
"""

from __future__ import annotations

import itertools

import torch
import torch.fx as fx

from lingc.compat import real_tensor_mode
from lingc.graph_build import emit
from lingc.graph_match import CASTS, aten, is_call
from lingc.graph_region import (ancestors, descendants, is_heavy, random_like, region, region_key, region_module,
                                rel_err, run_region, shape, softmax_scales, val)
from lingc.head_layout import emit_layout, emit_token_major, head_layouts, token_major
from lingc.pass_manager import VIEW_OPS
from lingc.sdpa import sdpa_call

from .pdl_swap_common import MAX_T, PROBE_TOL, below_lead, graph_input, unit_lead

lingc_ops = torch.ops.lingc


def probe_positions(T: int, L: int, dtype: torch.dtype, gen: torch.Generator) -> torch.Tensor:
    """Distinct sorted positions in the cache's upper half for a probe: every query attends to at
    least L / 2 keys, so candidate scales give different outputs (a query at position 0 has one
    key and the same output under every scale)."""
    n_upper = max(T, L - L // 2)
    upper = L - n_upper + torch.randperm(n_upper, generator=gen)[:T]
    return torch.sort(upper).values.to(dtype)


def cache_layout(n: fx.Node, L: int, heads: int | None = None) -> str | None:
    """How n holds per-head cache rows (below a batch dim of 1): "lh" [L, heads, D], "hl"
    [heads, L, D] (Hugging Face's caches), or None. D > 1: an MLA's latent rows unsqueezed for a
    product ([L, R, 1]) are not heads."""
    s = shape(n) or ()
    if unit_lead(s, 3) is None or s[-1] < 2 or not (isinstance(val(n), torch.Tensor) and val(n).is_floating_point()):
        return None
    if s[-3] == L and heads in (None, s[-2]):
        return "lh"
    if s[-2] == L and heads in (None, s[-3]):
        return "hl"
    return None


def window_candidates(nodes: list[fx.Node], L: int) -> list[int]:
    """0 (no sliding window) and the windows a region's integer constants could spell: a mask
    `l > pos - w` or `l >= pos - w + 1` (or `pos - l < w`) names w, w - 1 or w + 1."""
    consts = {abs(a) for n in nodes if n.op == "call_function" for a in n.args
              if isinstance(a, int) and not isinstance(a, bool) and 1 <= abs(a) <= L}
    return [0] + sorted({w for c in consts for w in (c - 1, c, c + 1) if 1 <= w <= L})


def per_head_cache(n: fx.Node, L: int) -> bool:
    """Whether n holds per-head cache rows in either layout (cache_layout)."""
    return cache_layout(n, L) is not None


def _below_casts(n: fx.Node, L: int) -> fx.Node:
    """The per-head cache a cast of it came from (a bf16 SDPA's math form on CUDA upcasts the
    caches to fp32, then views them for the per-group repeat): walked back through views, copies
    and casts while the values stay per-head cache rows, the input of the earliest cast passed (n
    itself when none is): the op reads the stored dtype, and the whole-cache cast goes."""
    best = n
    while (is_call(n, *CASTS, *VIEW_OPS, aten.clone.default, aten.expand.default) and isinstance(n.args[0], fx.Node)
           and cache_layout(n.args[0], L) is not None):
        cast = is_call(n, *CASTS)
        n = n.args[0]
        best = n if cast else best
    return best


def _heads_dim(n: fx.Node, layout: str) -> tuple[int, int]:
    s = shape(n)
    return (s[-2] if layout == "lh" else s[-3]), s[-1]


def _rows_first(g: fx.Graph, n: fx.Node, layout: str) -> fx.Node:
    """A [heads, L, D] cache as the [L, heads, D] view gqa_decode reads (strides, no copy)."""
    return emit(g, aten.permute.default, n, [1, 0, 2]) if layout == "hl" else n


class GqaCores:
    """pdl_swap's GQA matcher (a mixin of PdlSwap: its notes, probe cache and flags)."""

    def _gqa_one(self, g: fx.Graph, L: int, htl: int, pc: fx.Node, p: fx.Node, v_cache: fx.Node,
                 pos_cands: list[fx.Node]) -> str | None:
        """Rewrite the attention whose probabilities (HQ * T * L of them) are p's (or inside p, a
        fused op) applied at pc to the values of v_cache ([L, kv_heads, DV] or [kv_heads, L, DV]),
        or say why not."""
        v_cache = _below_casts(v_cache, L)
        v_at = cache_layout(v_cache, L)
        HKV, DV = _heads_dim(v_cache, v_at)
        # The values' own cache, what it is computed from and its views (the key is none of them).
        v_side = ancestors([v_cache]) | {v_cache} | descendants([v_cache], lambda n: n.target in VIEW_OPS)
        order = {n: i for i, n in enumerate(g.nodes)}
        keys = [a for a in ancestors([p]) if a not in v_side and cache_layout(a, L, HKV)]
        if not keys:
            return "no [L, kv_heads, D] key cache found beside the value cache"
        k_cache = _below_casts(max(keys, key=order.__getitem__), L)
        k_at = cache_layout(k_cache, L, HKV)
        D = _heads_dim(k_cache, k_at)[1]
        views = lambda n: n.op == "call_function" and n.target in VIEW_OPS  # noqa: E731
        for pos in pos_cands:
            T = shape(pos)[0]
            HQ = htl // (L * T)
            if T > MAX_T or HQ % HKV or HQ * T * L != htl:
                continue
            outs = [u for u in descendants([pc], views) | {pc} if head_layouts(u, T, HQ, DV)]
            q = self._gqa_query(p, T, HQ, D, {k_cache, v_cache})
            if not outs or q is None:
                continue
            o = min(outs, key=lambda u: ("th" not in head_layouts(u, T, HQ, DV), order[u]))
            stops = {q, k_cache, v_cache, *pos_cands}
            nodes, leaves = region([o], lambda n: n in stops or is_heavy(n) or graph_input(n))
            if set(leaves) - stops or not {pos, q, k_cache, v_cache} <= set(leaves):
                continue                  # the region reads something else: not this attention alone
            nodes = sorted(set(nodes) - set(leaves), key=order.__getitem__)
            layouts = (head_layouts(q, T, HQ, D), head_layouts(o, T, HQ, DV))
            with real_tensor_mode():
                found = self._gqa_probe(nodes, leaves, o, q, (k_cache, k_at), (v_cache, v_at), pos, T, L, layouts)
            if found is None:
                continue
            scale, window, (q_at, o_at) = found
            with g.inserting_before(o):
                try:
                    k, v = (_rows_first(g, below_lead(g, c, 3), at) for c, at in ((k_cache, k_at), (v_cache, v_at)))
                    # A 16-bit model's output rounded by the op's store, not by a cast kernel after it.
                    dt = {} if val(o).dtype == torch.float32 else {"out_dtype": val(o).dtype}
                    out = emit(g, lingc_ops.gqa_decode.default, emit_token_major(g, q, q_at), k, v, pos, scale,
                               window, **dt)
                except ValueError as e:
                    return str(e)
                o_new = emit_layout(g, out, o_at)
            o.replace_all_uses_with(o_new)
            self.gqa_matched += 1
            return None
        return "no assignment of the inputs reproduces the gqa_decode reference"

    @staticmethod
    def _gqa_query(p: fx.Node, T: int, HQ: int, D: int, caches: set) -> fx.Node | None:
        """The query of the scores behind p: a fused op's q operand, or the operand of the scores'
        product that is not computed from a cache; walked back through views, casts and copies
        to the furthest value held as [T, HQ, D] rows."""
        c = sdpa_call(p)
        if c is not None:
            n = c.q
        else:
            from_cache = lambda x: bool((ancestors([x]) | {x}) & caches)  # noqa: E731
            prods = [a for a in ancestors([p]) if is_call(a, aten.bmm.default, aten.mm.default)
                     and sum(map(from_cache, a.args[:2])) == 1]
            if len(prods) != 1:
                return None
            n = next(x for x in prods[0].args[:2] if not from_cache(x))
        best = None
        while True:
            if head_layouts(n, T, HQ, D):
                best = n
            if not is_call(n, *VIEW_OPS, *CASTS, aten.clone.default, aten.expand.default):
                return best
            n = n.args[0]

    def _gqa_probe(self, nodes, leaves, o, q, k_cache, v_cache, pos, T, L, layouts):
        """Once per form of the region (as _mla_probe): (scale, window, (q layout, o layout)) or None.
        k_cache, v_cache: (node, "lh" or "hl")."""
        at = {leaf: i for i, leaf in enumerate(leaves)}
        key = ("gqa", region_key(nodes, leaves, [o]), at[q], at[k_cache[0]], k_cache[1], at[v_cache[0]], v_cache[1],
               at[pos], T, L, tuple(map(tuple, layouts)))
        if key in self._probes and self.reuse_probes:
            self.probes_reused += 1
        else:
            self._probes[key] = self._gqa_probe_run(nodes, leaves, o, q, k_cache, v_cache, pos, T, L, layouts)
        return self._probes[key]

    @staticmethod
    def _gqa_probe_run(nodes, leaves, o, q, k_cache, v_cache, pos, T, L, layouts):
        from lingc.runtime.kernels.gqa_decode.naive import gqa_decode_reference

        gen = torch.Generator().manual_seed(0)
        inputs = [probe_positions(T, L, val(n).dtype, gen) if n is pos else random_like(n, gen) for n in leaves]
        got = run_region(region_module(nodes, leaves, [o]), inputs)
        if got is None:
            return None
        x = dict(zip(leaves, inputs))
        k, v = (x[c].reshape(x[c].shape[-3:]) for c, _ in (k_cache, v_cache))
        k, v = (t.transpose(0, 1) if at == "hl" else t for t, (_, at) in zip((k, v), (k_cache, v_cache)))
        tol = PROBE_TOL.get(val(o).dtype, 3e-2)
        best, best_err = None, None
        for q_at, o_at in itertools.product(*layouts):
            for scale, window in itertools.product(sorted(softmax_scales(nodes)), window_candidates(nodes, L)):
                ref = gqa_decode_reference(token_major(x[q], q_at), k, v, x[pos], scale, window)
                err = rel_err(token_major(got[0], o_at).float(), ref)
                if err <= tol and (best is None or err < best_err):
                    best, best_err = (scale, window, (q_at, o_at)), err
        return best
