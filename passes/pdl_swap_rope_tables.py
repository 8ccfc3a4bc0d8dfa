"""A model's precomputed rotary tables, as pdl_swap's RoPE probes (pdl_swap_gqa_rope.py) find them:
which graph inputs can hold the cos and sin of the angles, and how to hand them to lingc's kernels.

    before:  cos = cos_cached[pos] ; k' = k * cos + rotate_half(k) * sin[pos] ; cache[pos] = k'
    after:   lingc.head_cache_write(k, pos, cache, rope_cos=cos_cached, rope_sin=sin_cached,
                                    rope_dims=R)                (the table's row read in the kernel)

Many models do not compute their angles from an inv_freq in the step: they index tables built once
(Hugging Face's older cos_cached / sin_cached [P, R] with each half repeated, vLLM's cos_sin_cache
[P, R] of cos | sin halves, torchtune's cache [P, R / 2, 2] of (cos, sin) pairs, the Llama
reference's complex freqs_cis [P, R / 2]), or take cos and sin per token as step inputs ([T, R],
possibly under a batch dim of 1). ``table_sources`` lists, for the float (or complex) graph inputs
among a region's leaves, every way they could give a cos table and a sin table [N, W] of one shape:
two inputs, the halves of one, the last-dim pairs of one, a complex one seen as real pairs. A table
of N == T rows is read at each token's index (``rope_by_token``), a longer one at its position.
The probe then runs the region on random table values and keeps a source only if the rows equal
the kernels' rotation with those very values (W = R / 2 a value per pair, or W = R one per column),
so nothing here assumes the tables hold cosines: the kernels read whatever the model's tables hold.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.fx as fx

from lingc.graph_build import emit
from lingc.graph_match import aten
from lingc.graph_region import shape, val

from .pdl_swap_common import graph_input

MAX_INPUTS = 8              # table-like inputs a region's leaves may hold before the probe gives up


@dataclass(frozen=True)
class TableSource:
    """cos and sin tables [N, W] taken from graph inputs: ``form`` "pair" (inputs[0] is cos,
    inputs[1] sin), "halves" (one [.., 2W] input: cos | sin), "stacked" (one [.., W, 2]: (cos, sin)
    pairs), "complex" (one complex [.., W]: cos + i sin); ``lead`` leading unit dims above them."""
    inputs: tuple[fx.Node, ...]
    form: str
    lead: int
    n: int
    w: int

    def values(self, x: dict) -> tuple[torch.Tensor, torch.Tensor]:
        """The [N, W] cos and sin views of the probe's values ``x`` (node -> tensor)."""
        ts = [x[i] for i in self.inputs]
        ts = [t.reshape(t.shape[self.lead:]) for t in ts]
        if self.form == "pair":
            return ts[0], ts[1]
        t = ts[0]
        if self.form == "halves":
            return t[:, :self.w], t[:, self.w:]
        if self.form == "complex":
            t = torch.view_as_real(t)
        return t[..., 0], t[..., 1]

    def emit(self, g: fx.Graph) -> tuple[fx.Node, fx.Node]:
        """The same views as graph nodes (at g's insertion point): what the kernels read."""
        ts = list(self.inputs)
        for _ in range(self.lead):
            ts = [emit(g, aten.select.int, t, 0, 0) for t in ts]
        if self.form == "pair":
            return ts[0], ts[1]
        t = ts[0]
        if self.form == "halves":
            return emit(g, aten.slice.Tensor, t, 1, 0, self.w), emit(g, aten.slice.Tensor, t, 1, self.w, 2 * self.w)
        if self.form == "complex":
            t = emit(g, aten.view_as_real.default, t)
        return emit(g, aten.select.int, t, 2, 0), emit(g, aten.select.int, t, 2, 1)

    def by_token(self, T: int) -> bool:
        return self.n == T

    def rope_dims(self, D: int) -> list[int]:
        """The rotated dims R the tables could serve: W values per pair (R = 2W) or per column (R = W)."""
        return [r for r in (2 * self.w, self.w) if 2 <= r <= D and r % 2 == 0]


def _table_like(n: fx.Node) -> tuple[int, tuple[int, ...]] | None:
    """(leading unit dims, the shape below them) of a float / complex graph input that can hold a
    table: 2-d below its unit leads, or 3-d ending in a pair of 2; None otherwise."""
    v = val(n)
    if not graph_input(n) or not isinstance(v, torch.Tensor) or not (v.is_floating_point() or v.is_complex()):
        return None
    s = shape(n)
    lead = 0
    while len(s) - lead > 2 and s[lead] == 1 and not (len(s) - lead == 3 and s[-1] == 2 and not v.is_complex()):
        lead += 1
    below = s[lead:]
    if len(below) == 2 or (len(below) == 3 and below[-1] == 2 and not v.is_complex()):
        return lead, below
    return None


def table_sources(leaves: list[fx.Node], exclude: set, T: int) -> list[TableSource]:
    """Every cos / sin table pair the graph-input leaves (outside ``exclude``) could give, with at
    least T rows (module docstring)."""
    cands = []
    for n in leaves:
        if n in exclude:
            continue
        got = _table_like(n)
        if got is not None and got[1][0] >= T:
            cands.append((n, *got))
    if len(cands) > MAX_INPUTS:
        return []
    out = []
    for n, lead, below in cands:
        cplx = val(n).is_complex()
        if len(below) == 3:
            out.append(TableSource((n,), "stacked", lead, below[0], below[1]))
        elif cplx:
            out.append(TableSource((n,), "complex", lead, below[0], below[1]))
        else:
            if below[1] % 2 == 0:
                out.append(TableSource((n,), "halves", lead, below[0], below[1] // 2))
            out += [TableSource((n, m), "pair", lead, below[0], below[1]) for m, lead_m, below_m in cands
                    if m is not n and lead_m == lead and below_m == below and not val(m).is_complex()
                    and val(m).dtype == val(n).dtype]
    return out


def probe_position_limit(sources: list[TableSource], T: int, default: int) -> int:
    """The probe's positions must index every by-position table: below its row count."""
    return min([default] + [s.n for s in sources if not s.by_token(T)])
