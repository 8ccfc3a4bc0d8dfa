"""pdl_swap's per-head cache writes and rotary embeddings (passes/pdl_swap_gqa_rope.py): around a
lingc.gqa_decode, each row write of a per-head cache becomes lingc.head_cache_write (the keys'
RoPE inside it) and the queries' RoPE moves into gqa_decode's query load; written with rotate-half
pairs (Llama, Qwen3-Next, partial or full), interleaved pairs (GPT-J), Hugging Face's head-major
cache and keys and values stacked in one cache; Qwen3-Next's output gate, o * sigmoid(g), moves
into gqa_decode's combine. Numbers and caches against eager; rows that are no RoPE of one value,
queries that are no RoPE and a gate on a reordered output are left with the reason."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from backend_helpers import dump_op_changes, pinned_graph_text, run_and_report, stat
from expecttest import assert_expected_inline
from test_pdl_swap_gqa import HFStyleAttention

HID, L = 32, 20


def rows(report):
    return {op: n for _, op, n, _ in report.kernels.rows}


def aten_kernels(report):
    """The ATen ops that launch kernels (views are not)."""
    return {op for cat, op, _, _ in report.kernels.rows if cat == "aten"}


def rotate_half(x, pos, freq):
    """Hugging Face's apply_rotary_pos_emb on the first 2 * len(freq) dims, in x's dtype."""
    R = 2 * freq.shape[0]
    ang = pos.float()[:, None] * freq[None]
    cos = torch.cat([ang.cos()] * 2, -1).to(x.dtype)
    sin = torch.cat([ang.sin()] * 2, -1).to(x.dtype)
    cos, sin = cos.view(cos.shape[0], *([1] * (x.dim() - 2)), R), sin.view(sin.shape[0], *([1] * (x.dim() - 2)), R)
    r = x[..., :R]
    half = torch.cat([-r[..., R // 2:], r[..., :R // 2]], -1)
    return torch.cat([r * cos + half * sin, x[..., R:]], -1)


def interleaved(x, pos, freq):
    """GPT-J's RoPE on all dims: pairs (x[2i], x[2i + 1])."""
    ang = pos.float()[:, None, None] * freq[None, None]
    cos, sin = ang.cos().to(x.dtype), ang.sin().to(x.dtype)
    u, w = x[..., 0::2], x[..., 1::2]
    return torch.stack([u * cos - w * sin, w * cos + u * sin], -1).flatten(-2)


class RopeAttention(torch.nn.Module):
    """GQA over per-head caches with RoPE on queries and keys. ``form``: "half" (rotate-half on
    all dims), "partial" (on the first quarter: Qwen3-Next's), "interleaved" (GPT-J's), "stacked"
    (partial, keys and values in one [L, 2, kv_heads, D] cache), "gated" (stacked, the output
    times sigmoid of a second query-projection half: Qwen3-Next's), "gated-cast" (the same, the
    product in bf16 of an fp32 model: the output cast before its gate), "gated-scrambled" (the same, the
    gate applied to the output's [D, H] transpose read back as [H, D]: a view chain that is no
    layout of it), "normed" (partial, Qwen3-Next's zero-centred per-head norms on the queries
    and keys before their RoPE), "scaled-q" (the queries
    multiplied by a learned per-dim weight, no RoPE: nothing to fold), "shifted-k" (the keys
    shifted by their position before the write: no RoPE, the write stays), "strided-v" (stacked,
    the values every other column of a wider value: rows the op cannot take)."""

    def __init__(self, form: str, heads: int = 4, kv_heads: int = 2, d: int = 16, dtype=torch.float32):
        super().__init__()
        g = torch.Generator().manual_seed(3)
        self.form, self.heads, self.kv_heads, self.d = form, heads, kv_heads, d
        self.q, self.k, self.v, self.o = (
            torch.nn.Parameter((torch.randn(o, i, generator=g) / i ** 0.5).to(dtype), requires_grad=False)
            for o, i in ((heads * d, HID), (kv_heads * d, HID), (kv_heads * d, HID), (HID, heads * d)))
        self.w = torch.nn.Parameter(torch.rand(d, generator=g).to(dtype) + 0.5, requires_grad=False)
        self.g = torch.nn.Parameter((torch.randn(heads * d, HID, generator=g) / HID ** 0.5).to(dtype),
                                    requires_grad=False)
        self.v2 = torch.nn.Parameter((torch.randn(kv_heads * 2 * d, HID, generator=g) / HID ** 0.5).to(dtype),
                                     requires_grad=False)
        self.qn, self.kn = (torch.nn.Parameter((torch.randn(d, generator=g) * 0.2).to(dtype), requires_grad=False)
                            for _ in range(2))
        R = d if form in ("half", "interleaved", "shifted-k") else d // 4
        self.register_buffer("freq", 1.0 / (10000.0 ** (torch.arange(0, R, 2).float() / R)), persistent=False)

    def rope(self, x, pos):
        return interleaved(x, pos, self.freq) if self.form == "interleaved" else rotate_half(x, pos, self.freq)

    @staticmethod
    def head_norm(x, w):
        """Qwen3-Next's Qwen3NextRMSNorm over each head: gain 1 + w in fp32, rounded once."""
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6) * (1.0 + w.float())).to(x.dtype)

    def forward(self, x, pos, *caches):
        T = x.shape[0]
        q = (x @ self.q.T).view(T, self.heads, self.d)
        gate = torch.sigmoid((x @ self.g.T).view(T, self.heads, self.d))
        k = (x @ self.k.T).view(T, self.kv_heads, self.d)
        if self.form == "normed":
            q, k = self.head_norm(q, self.qn), self.head_norm(k, self.kn)
        v = (x @ self.v.T).view(T, self.kv_heads, self.d)
        q = q * self.w if self.form == "scaled-q" else self.rope(q, pos)
        k = k + pos[:, None, None].to(k.dtype) if self.form == "shifted-k" else self.rope(k, pos)
        if self.form == "strided-v":                 # every other column of a twice-wide projection
            v = (x @ self.v2.T).view(T, self.kv_heads, 2 * self.d)[..., ::2]
        if self.form in ("stacked", "gated", "gated-cast", "gated-scrambled", "strided-v"):
            (cache,) = caches
            cache[pos] = torch.stack([k, v], 1).to(cache.dtype)
            kc, vc = cache[:, 0], cache[:, 1]
        else:
            kc, vc = caches
            kc[pos], vc[pos] = k, v
        visible = torch.arange(kc.shape[0], device=x.device)[None, :] <= pos[:, None]
        o = F.scaled_dot_product_attention(q.transpose(0, 1)[None], kc.transpose(0, 1)[None], vc.transpose(0, 1)[None],
                                           attn_mask=visible[None, None], enable_gqa=True)[0].transpose(0, 1)
        if self.form == "gated":
            o = o * gate
        elif self.form == "gated-cast":
            o = (o.to(torch.bfloat16) * gate.to(torch.bfloat16)).to(o.dtype)
        elif self.form == "gated-scrambled":
            o = o.transpose(1, 2).reshape(o.shape) * gate
        return o.reshape(T, self.heads * self.d) @ self.o.T


class HFRopeAttention(HFStyleAttention):
    """Hugging Face's Llama attention at batch 1 (test_pdl_swap_gqa.HFStyleAttention: a
    StaticCache [1, kv_heads, L, D] written by index_copy_ along dim 2, repeat_kv, SDPA with an
    additive mask) with its RoPE: [1, H, T, D] queries and keys rotated after the transpose, cos
    and sin from inv_freq and the positions."""

    def __init__(self, form: str, dtype=torch.float32):
        super().__init__(form, 4, 2, 16, dtype)
        self.register_buffer("freq", 1.0 / (10000.0 ** (torch.arange(0, 16, 2).float() / 16)), persistent=False)

    def rotate(self, q, k, pos):
        ang = pos.float()[:, None] * self.freq[None]
        emb = torch.cat([ang, ang], -1)
        cos, sin = emb.cos()[None, None].to(q.dtype), emb.sin()[None, None].to(q.dtype)

        def rot(t):
            return t * cos + torch.cat([-t[..., self.d // 2:], t[..., :self.d // 2]], -1) * sin
        return rot(q), rot(k)


def _caches(m, gen, dtype):
    if isinstance(m, HFRopeAttention):
        return [torch.randn(1, m.kv_heads, L, m.d, generator=gen).to(dtype) for _ in range(2)]
    if m.form in ("stacked", "gated", "gated-cast", "gated-scrambled", "strided-v"):
        return [torch.randn(L, 2, m.kv_heads, m.d, generator=gen).to(dtype)]
    return [torch.randn(L, m.kv_heads, m.d, generator=gen).to(dtype) for _ in range(2)]


def _inputs_for(m, T, dtype=torch.float32):
    gen = torch.Generator().manual_seed(T)
    x = torch.randn(T, HID, generator=gen).to(dtype)
    pos = torch.arange(L - T - 2, L - 2)
    return [x, pos, *_caches(m, gen, dtype)]


def _run(m, T, dtype=torch.float32, **options):
    x, pos, *caches = _inputs_for(m, T, dtype)
    refs = [c.clone() for c in caches]
    with torch.no_grad():
        ref = m(x, pos, *refs)
    out, report = run_and_report(m, x, pos, *caches, **options)
    return out, ref, caches, refs, report


FORMS = [("half", RopeAttention), ("partial", RopeAttention), ("interleaved", RopeAttention),
         ("stacked", RopeAttention), ("gated", RopeAttention), ("normed", RopeAttention), ("hf", HFRopeAttention)]


@pytest.mark.parametrize("T", [1, 2, 6])
@pytest.mark.parametrize("form,cls", FORMS, ids=[f for f, _ in FORMS])
def test_rope_and_row_writes_fold_into_lingc_ops(form, cls, T):
    m = cls(form)
    out, ref, caches, refs, report = _run(m, T)
    ops = rows(report)
    notes = stat(report, "pdl_swap").notes
    assert ops.get("lingc.gqa_decode") == 1 and ops.get("lingc.head_cache_write") == 2, (ops, notes)
    assert "the queries' RoPE folded into 1 gqa_decode" in notes[0], notes
    assert ("output gate folded into 1 gqa_decode" in notes[0]) == (form == "gated"), notes
    assert ("2 per-head q / k norms folded into gqa_decode / head_cache_write" in notes[0]) == (form == "normed")
    assert "lingc.rmsnorm" not in ops, ops
    assert not aten_kernels(report), report.kernels.format()    # RoPE, index_put, the epilogue copy_: all gone
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    for got, want in zip(caches, refs):
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("form", ["partial", "gated"])
def test_bf16_model(form):
    """bf16: the kernels' references rotate in fp32 and round once (eager rounds each product).
    gqa_decode writes the bf16 output itself (no cast kernel after it), and the gate is found
    through a bf16 model's cast of the output: the layout check's iota (past 256 at T = 6, which
    bf16 cannot hold) runs the casts as identities."""
    m = RopeAttention(form, dtype=torch.bfloat16)
    out, ref, caches, refs, report = _run(m, 6, torch.bfloat16)
    ops = rows(report)
    assert ops.get("lingc.gqa_decode") == 1 and ops.get("lingc.head_cache_write") == 2, ops
    assert ("output gate folded into 1 gqa_decode" in stat(report, "pdl_swap").notes[0]) == (form == "gated")
    assert not aten_kernels(report), report.kernels.format()
    torch.testing.assert_close(out.float(), ref.float(), rtol=3e-2, atol=3e-2)
    for got, want in zip(caches, refs):
        torch.testing.assert_close(got.float(), want.float(), rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("T", [1, 6])
def test_head_norms_fold_into_their_readers(T, dtype, monkeypatch):
    """Qwen3-Next's q_norm / k_norm (zero-centred, per head, before the RoPE): with the fold the
    two lingc.rmsnorm launches go into gqa_decode's query load and head_cache_write (at T = 6 the
    queries' [T * H, D] rows are no view of the strided [T, H, D] piece: the copy goes too); the
    same outputs and caches as with the norms apart, and as eager."""
    from lingc.passes.pdl_swap import PdlSwap

    tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=3e-2, atol=3e-2)
    runs = {}
    for fold in (True, False):
        monkeypatch.setattr(PdlSwap, "fold_head_norm", fold)
        runs[fold] = _run(RopeAttention("normed", dtype=dtype), T, dtype)
    (out, ref, caches, refs, report), (out_off, _, caches_off, _, report_off) = runs[True], runs[False]
    assert rows(report).get("lingc.rmsnorm") is None and rows(report_off).get("lingc.rmsnorm") == 2
    # Unfolded at T = 6 the norms' [T * H, D] reshapes of the strided q and k slices copy at run
    # time, and the kernel table says so (lingc/kernel_table.py, copying_reshapes).
    copies = [(c, n) for c, op, n, _ in report_off.kernels.rows if op == "aten.reshape (a copy)"]
    assert copies == ([("aten", 2)] if T > 1 else []), report_off.kernels.format()
    assert not aten_kernels(report), report.kernels.format()
    assert rows(report)["lingc.head_cache_write"] == 2 and rows(report)["lingc.gqa_decode"] == 1
    torch.testing.assert_close(out.float(), out_off.float(), **tol)
    torch.testing.assert_close(out.float(), ref.float(), **tol)
    for got, off, want in zip(caches, caches_off, refs):
        torch.testing.assert_close(got.float(), off.float(), **tol)
        torch.testing.assert_close(got.float(), want.float(), **tol)


def test_a_head_norm_read_elsewhere_stays():
    """The normed keys are also read by something else (returned): the norm keeps its launch
    (its rows must exist), and the write takes them as before."""
    class ReadTwice(RopeAttention):
        def head_norm(self, x, w):
            y = RopeAttention.head_norm(x, w)
            if w is self.kn:
                self.normed_k = y
            return y

        def forward(self, x, pos, *caches):
            return super().forward(x, pos, *caches), self.normed_k.sum()

    m = ReadTwice("normed")
    inputs = _inputs_for(m, 2)
    with torch.no_grad():
        want = m(*[t.clone() for t in inputs])
    out, report = run_and_report(m, *inputs)
    assert rows(report).get("lingc.rmsnorm") == 1, rows(report)
    assert "1 per-head q / k norms folded" in stat(report, "pdl_swap").notes[0], stat(report, "pdl_swap").notes
    torch.testing.assert_close(out[1], want[1], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out[0], want[0], rtol=1e-5, atol=1e-5)


def test_a_gate_behind_a_bf16_cast_of_the_output_folds():
    """The fp32 output cast to bf16 before its gate: the layout check runs the cast as an
    identity (an iota past 256, here 384 elements at T = 6, does not survive bf16)."""
    out, ref, caches, refs, report = _run(RopeAttention("gated-cast"), 6)
    assert "output gate folded into 1 gqa_decode" in stat(report, "pdl_swap").notes[0], stat(report, "pdl_swap").notes
    assert aten_kernels(report) <= {"prims.convert_element_type"}, report.kernels.format()   # the casts
    torch.testing.assert_close(out, ref, rtol=2e-2, atol=2e-2)


def test_queries_without_rope_keep_their_computation_with_the_reason():
    out, ref, caches, refs, report = _run(RopeAttention("scaled-q"), 2)
    ops, notes = rows(report), stat(report, "pdl_swap").notes
    assert ops.get("lingc.gqa_decode") == 1 and ops.get("lingc.head_cache_write") == 2, ops
    assert aten_kernels(report) == {"aten.mul.Tensor"}, report.kernels.format()     # q * w stays
    assert any("the queries' computation is not a rotary embedding" in n for n in notes), notes
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)


def test_rows_that_are_no_rope_keep_their_write_with_the_reason():
    """Keys shifted by their position: no RoPE of one value, so the key cache's write stays an
    index_put (the value cache's becomes head_cache_write); caches and output as eager's."""
    out, ref, caches, refs, report = _run(RopeAttention("shifted-k"), 2)
    ops, notes = rows(report), stat(report, "pdl_swap").notes
    assert ops.get("lingc.head_cache_write") == 1 and ops.get("aten.index_put") == 1, ops
    assert any("per-head cache write" in n and "are not one [T, H, D] value as it is or rotated" in n
               for n in notes), notes
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    for got, want in zip(caches, refs):
        torch.testing.assert_close(got, want)


def test_a_gate_on_a_scrambled_output_is_left_with_the_reason():
    """The gate multiplies the output's [D, H] transpose read back as [H, D] (views and a copy of
    the right shape, but no head layout of the op's output: the iota check): left as ATen ops, the
    note says why; numbers as eager's."""
    out, ref, caches, refs, report = _run(RopeAttention("gated-scrambled"), 2)
    ops, notes = rows(report), stat(report, "pdl_swap").notes
    assert ops.get("lingc.gqa_decode") == 1 and "aten.sigmoid" in ops, ops
    assert any("the gate at" in n and "is not on a head layout of its output" in n for n in notes), notes
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)


def test_a_part_the_op_cannot_take_leaves_the_whole_write():
    """Keys and values stacked in one cache, the values a strided view (no unit inner stride):
    the keys' part would be written, the values' cannot; nothing of the write is emitted (no
    half-rewritten cache), the index_put stays and the note names the stride."""
    out, ref, caches, refs, report = _run(RopeAttention("strided-v"), 2)
    ops, notes = rows(report), stat(report, "pdl_swap").notes
    assert "lingc.head_cache_write" not in ops and ops.get("aten.index_put") == 1, ops
    assert any("per-head cache write" in n and "unit stride" in n for n in notes), notes
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(caches[0], refs[0])


def test_relay_positions_reach_the_cache_write():
    """A chain at n + arange(T) (the relay's metadata): head_cache_write and gqa_decode read the
    base n with pos_offset (pdl_glue.positions_into_readers); numbers as eager's."""
    m = RopeAttention("partial")

    class Chain(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.m = m

        def forward(self, x, n, kc, vc):
            return self.m(x, n + torch.arange(x.shape[0]), kc, vc)

    gen = torch.Generator().manual_seed(5)
    x, n = torch.randn(6, HID, generator=gen), torch.tensor([9])
    kc, vc = _caches(m, gen, torch.float32)
    rk, rv = kc.clone(), vc.clone()
    with torch.no_grad():
        ref = Chain()(x, n, rk, rv)
    out, report = run_and_report(Chain(), x, n, kc, vc)
    ops = rows(report)
    assert ops.get("lingc.head_cache_write") == 2 and not aten_kernels(report), report.kernels.format()
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(kc, rk, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(vc, rv, rtol=1e-6, atol=1e-6)


class TableRopeAttention(RopeAttention):
    """RopeAttention with its angles from tables built once (R = d / 2, of L rows), indexed by the
    positions in the step, as models write them: "hf-cached" (Hugging Face's older cos_cached /
    sin_cached [L, R], each half repeated, cast to the rows' dtype, rotate_half), "vllm" (one
    cos_sin_cache [L, R] of cos | sin halves, index_select, neox pairs), "torchtune" (a cache
    [L, R / 2, 2] of (cos, sin), interleaved pairs in fp32), "complex" (the Llama reference's
    complex freqs_cis [L, R / 2], view_as_complex)."""

    def __init__(self, form: str, dtype=torch.float32):
        super().__init__(form, dtype=dtype)
        R = self.d // 2
        freq = 1.0 / (10000.0 ** (torch.arange(0, R, 2).float() / R))
        ang = torch.arange(L).float()[:, None] * freq[None]                  # [L, R / 2]
        self.R = R
        if form == "hf-cached":
            emb = torch.cat([ang, ang], -1)
            self.register_buffer("cos_cached", emb.cos(), persistent=False)
            self.register_buffer("sin_cached", emb.sin(), persistent=False)
        elif form == "vllm":
            self.register_buffer("cos_sin_cache", torch.cat([ang.cos(), ang.sin()], -1), persistent=False)
        elif form == "torchtune":
            self.register_buffer("cache", torch.stack([ang.cos(), ang.sin()], -1), persistent=False)
        else:
            self.register_buffer("freqs_cis", torch.polar(torch.ones_like(ang), ang), persistent=False)

    def rope(self, x, pos):
        R, T, H = self.R, x.shape[0], x.shape[1]
        r, rest = x[..., :R], x[..., R:]
        if self.form == "hf-cached":
            cos, sin = self.cos_cached[pos].to(x.dtype)[:, None], self.sin_cached[pos].to(x.dtype)[:, None]
            out = r * cos + torch.cat([-r[..., R // 2:], r[..., :R // 2]], -1) * sin
        elif self.form == "vllm":
            cos, sin = self.cos_sin_cache.index_select(0, pos).chunk(2, dim=-1)
            cos, sin = cos[:, None].to(x.dtype), sin[:, None].to(x.dtype)
            x1, x2 = r[..., :R // 2], r[..., R // 2:]
            out = torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1)
        elif self.form == "torchtune":
            xs = r.float().reshape(T, H, R // 2, 2)
            rc = self.cache[pos].view(T, 1, R // 2, 2)
            out = torch.stack([xs[..., 0] * rc[..., 0] - xs[..., 1] * rc[..., 1],
                               xs[..., 1] * rc[..., 0] + xs[..., 0] * rc[..., 1]], -1).flatten(2).type_as(x)
        else:
            xc = torch.view_as_complex(r.float().reshape(T, H, R // 2, 2))
            out = torch.view_as_real(xc * self.freqs_cis[pos][:, None]).flatten(2).type_as(x)
        return torch.cat([out, rest], -1)


TABLE_FORMS = ["hf-cached", "vllm", "torchtune", "complex"]


@pytest.mark.parametrize("T", [1, 6])
@pytest.mark.parametrize("form", TABLE_FORMS)
def test_rope_tables_fold_into_lingc_ops(form, T):
    """RoPE from a model's precomputed tables: the keys' rotation moves into head_cache_write and
    the queries' into gqa_decode, each reading the table's row at the token's position; no ATen
    kernel is left, and output and caches are eager's."""
    m = TableRopeAttention(form)
    out, ref, caches, refs, report = _run(m, T)
    ops, notes = rows(report), stat(report, "pdl_swap").notes
    assert ops.get("lingc.gqa_decode") == 1 and ops.get("lingc.head_cache_write") == 2, (ops, notes)
    assert "the queries' RoPE folded into 1 gqa_decode" in notes[0], notes
    assert not aten_kernels(report), report.kernels.format()
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    for got, want in zip(caches, refs):
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)


def test_rope_tables_in_bf16():
    """A bf16 model's cos_cached rows cast to bf16 and multiplied in bf16 (eager rounds each
    product): within the probe's tolerance of the kernels' fp32 rotation, no ATen kernel left."""
    m = TableRopeAttention("hf-cached", dtype=torch.bfloat16)
    out, ref, caches, refs, report = _run(m, 6, torch.bfloat16)
    assert rows(report).get("lingc.head_cache_write") == 2 and not aten_kernels(report), report.kernels.format()
    torch.testing.assert_close(out.float(), ref.float(), rtol=3e-2, atol=3e-2)


class PerTokenRopeAttention(RopeAttention):
    """Hugging Face's current decoder layers: cos and sin [1, T, R] computed outside the compiled
    step (the model's position_embeddings), passed in, rotate_half."""

    def __init__(self):
        super().__init__("half")

    def forward(self, x, pos, cos, sin, *caches):
        self.cs = (cos[0][:, None], sin[0][:, None])
        return super().forward(x, pos, *caches)

    def rope(self, x, pos):
        cos, sin = self.cs
        return x * cos + torch.cat([-x[..., self.d // 2:], x[..., :self.d // 2]], -1) * sin


@pytest.mark.parametrize("T", [1, 6])
def test_per_token_cos_sin_inputs_fold(T):
    """cos / sin as step inputs, one row per token under a batch dim of 1: read by token."""
    m = PerTokenRopeAttention()
    x, pos, *caches = _inputs_for(m, T)
    ang = pos.float()[:, None] * m.freq[None]
    emb = torch.cat([ang, ang], -1)
    cos, sin = emb.cos()[None], emb.sin()[None]
    refs = [c.clone() for c in caches]
    with torch.no_grad():
        ref = m(x, pos, cos, sin, *refs)
    out, report = run_and_report(m, x, pos, cos, sin, *caches)
    assert rows(report).get("lingc.head_cache_write") == 2 and not aten_kernels(report), report.kernels.format()
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    for got, want in zip(caches, refs):
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)


def test_a_table_whose_rows_are_transformed_is_left():
    """The table's rows scaled after the lookup (a YaRN-style attention factor applied in the step):
    no table holds the values the rotation uses, so the keys' write and the queries' RoPE stay,
    with the reasons; numbers as eager's."""
    class Scaled(TableRopeAttention):
        def rope(self, x, pos):
            R = self.R
            r = x[..., :R]
            cos, sin = self.cos_cached[pos][:, None] * 1.5, self.sin_cached[pos][:, None] * 1.5
            return torch.cat([r * cos + torch.cat([-r[..., R // 2:], r[..., :R // 2]], -1) * sin, x[..., R:]], -1)

    out, ref, caches, refs, report = _run(Scaled("hf-cached"), 2)
    ops, notes = rows(report), stat(report, "pdl_swap").notes
    assert ops.get("aten.index_put") == 1 and ops.get("lingc.head_cache_write") == 1, ops
    assert any("the queries' computation is not a rotary embedding" in n for n in notes), notes
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)


def _pdl_swap_changes(form: str, tmp_path, cls=None) -> str:
    """The ops pdl_swap adds and drops for RopeAttention(form) (or cls(form)) at T = 2 (its dump)."""
    m = (cls or RopeAttention)(form)
    gen = torch.Generator().manual_seed(2)
    x, pos = torch.randn(2, HID, generator=gen), torch.tensor([12, 13])
    kc, vc = _caches(m, gen, torch.float32)
    _, report = run_and_report(m, x, pos, kc, vc, dump_dir=str(tmp_path))
    return dump_op_changes(tmp_path, report, "pdl_swap")


@pinned_graph_text
def test_expect_rope_dump(tmp_path):
    """The ops pdl_swap adds and drops for the partial-RoPE attention at T = 2 (its dump)."""
    assert_expected_inline(_pdl_swap_changes("partial", tmp_path), """\
-aten._scaled_dot_product_flash_attention_for_cpu 1
-aten.add.Tensor 2
-aten.cat 4
-aten.clone 8
-aten.copy_ 2
-aten.cos 2
-aten.expand 4
-aten.index_put 2
-aten.le.Tensor 1
-aten.mul.Tensor 6
-aten.neg 2
+aten.permute 2
-aten.permute 4
+aten.reshape 3
-aten.scalar_tensor 2
+aten.select.int 1
-aten.select.int 1
-aten.sin 2
-aten.slice.Tensor 8
-aten.unsqueeze 14
+aten.view 1
-aten.view 12
-aten.where.self 1
-getitem 1
+lingc.gqa_decode 1
+lingc.head_cache_write 2
-prims.convert_element_type 2
-prims.iota 1
""")


@pinned_graph_text
def test_expect_normed_dump(tmp_path):
    """The same with Qwen3-Next's per-head q / k norms: no lingc.rmsnorm is left (both folded
    into the readers), the norms' ATen ops gone."""
    assert_expected_inline(_pdl_swap_changes("normed", tmp_path), """\
-aten._scaled_dot_product_flash_attention_for_cpu 1
-aten.add.Tensor 6
-aten.cat 4
-aten.clone 8
-aten.copy_ 2
-aten.cos 2
-aten.expand 4
-aten.index_put 2
-aten.le.Tensor 1
-aten.mean.dim 2
-aten.mul.Tensor 10
-aten.neg 2
+aten.permute 2
-aten.permute 4
-aten.pow.Tensor_Scalar 2
+aten.reshape 1
-aten.rsqrt 2
-aten.scalar_tensor 2
+aten.select.int 1
-aten.select.int 1
-aten.sin 2
-aten.slice.Tensor 8
-aten.unsqueeze 14
+aten.view 1
-aten.view 10
-aten.where.self 1
-getitem 1
+lingc.gqa_decode 1
+lingc.head_cache_write 2
-prims.convert_element_type 2
-prims.iota 1
""")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("T", [1, 6])
@pytest.mark.parametrize("form,cls", FORMS, ids=[f for f, _ in FORMS])
def test_gpu_forms(form, cls, T, dtype):
    """On CUDA: the Triton kernels (head_cache_write's rotation and write, gqa_decode's query
    rotation) against eager on the GPU."""
    m = cls(form, dtype=dtype).to("cuda")
    gen = torch.Generator().manual_seed(T)
    x = torch.randn(T, HID, generator=gen).to(dtype).cuda()
    pos = torch.arange(L - T - 2, L - 2, device="cuda")
    caches = [c.cuda() for c in _caches(m, gen, dtype)]
    refs = [c.clone() for c in caches]
    with torch.no_grad():
        ref = m(x, pos, *refs)
    out, report = run_and_report(m, x, pos, *caches)
    ops = rows(report)
    assert ops.get("lingc.gqa_decode") == 1 and ops.get("lingc.head_cache_write") == 2, ops
    tol = 1e-4 if dtype == torch.float32 else 3e-2
    assert (out.float() - ref.float()).norm() / ref.float().norm() < tol
    for got, want in zip(caches, refs):
        torch.testing.assert_close(got.float(), want.float(), rtol=tol, atol=tol)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("T", [1, 6])
@pytest.mark.parametrize("form", TABLE_FORMS)
def test_gpu_table_forms(form, T, dtype):
    """On CUDA: the kernels reading the model's rope tables (each layout's views) against eager."""
    test_gpu_forms(form, TableRopeAttention, T, dtype)


@pinned_graph_text
def test_expect_rope_table_dump(tmp_path):
    """The ops pdl_swap adds and drops for vLLM's cos_sin_cache form at T = 2 (its dump): the
    table's halves handed to the kernels as slices, its lookup and the rotation gone."""
    assert_expected_inline(_pdl_swap_changes("vllm", tmp_path, TableRopeAttention), """\
-aten._scaled_dot_product_flash_attention_for_cpu 1
-aten.add.Tensor 2
-aten.cat 4
-aten.copy_ 2
-aten.index.Tensor 2
-aten.index_put 2
-aten.le.Tensor 1
-aten.mul.Tensor 8
+aten.permute 2
-aten.permute 4
+aten.reshape 3
-aten.scalar_tensor 2
+aten.select.int 1
-aten.select.int 1
+aten.slice.Tensor 4
-aten.slice.Tensor 8
-aten.split.Tensor 2
-aten.sub.Tensor 2
-aten.unsqueeze 10
+aten.view 1
-aten.view 4
-aten.where.self 1
-getitem 5
+lingc.gqa_decode 1
+lingc.head_cache_write 2
-prims.iota 1
""")


def test_table_sources_list_every_layout_and_give_up_on_many_inputs():
    """pdl_swap_rope_tables.table_sources on placeholders of each table shape: two [N, W] tables
    (both orders), one [N, 2W] (its halves, and with the other 2-d one none), [N, W, 2] pairs, a
    complex [N, W], a batch dim of 1 above a per-token [T, R]; a [N] vector and an integer
    table are no tables; more than MAX_INPUTS table-like inputs give none."""
    import torch.fx as fx
    from torch._subclasses.fake_tensor import FakeTensorMode
    from lingc.passes.pdl_swap_rope_tables import MAX_INPUTS, table_sources

    g = fx.Graph()
    with FakeTensorMode() as mode:
        def ph(name, *shape, dtype=torch.float32):
            n = g.placeholder(name)
            n.meta["val"] = mode.from_tensor(torch.empty(*shape, dtype=dtype))
            return n
        a, b = ph("a", 40, 8), ph("b", 40, 8)
        st, cx, tok = ph("st", 40, 4, 2), ph("cx", 40, 4, dtype=torch.complex64), ph("tok", 1, 3, 16)
        vec, ints = ph("vec", 8), ph("ints", 40, 8, dtype=torch.int64)
        got = {(tuple(n.name for n in s.inputs), s.form, s.lead, s.n, s.w)
               for s in table_sources([a, b, st, cx, tok, vec, ints], set(), 3)}
        assert got == {(("a",), "halves", 0, 40, 4), (("b",), "halves", 0, 40, 4), (("a", "b"), "pair", 0, 40, 8),
                       (("b", "a"), "pair", 0, 40, 8), (("st",), "stacked", 0, 40, 4),
                       (("cx",), "complex", 0, 40, 4), (("tok",), "halves", 1, 3, 8)}, got
        assert {s.by_token(3) for s in table_sources([tok], set(), 3)} == {True}
        assert table_sources([a], {a}, 3) == [] and table_sources([a], set(), 41) == []
        many = [ph(f"t{i}", 40, 8) for i in range(MAX_INPUTS + 1)]
        assert table_sources(many, set(), 3) == []
