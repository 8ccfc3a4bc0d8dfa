"""pdl_swap's GQA matcher (passes/pdl_swap_gqa.py): softmax attention of a decode or verify chain
over per-head key and value caches [L, kv_heads, D] becomes one lingc.gqa_decode, whether it is
written as one fused attention op (enable_gqa, or as many key/value heads as query heads) or by
hand (keys repeated per group, scores scaled, masked, softmax, p @ v); numbers against eager, the
caches' row writes on lingc.head_cache_write (tests/test_pdl_swap_gqa_rope.py has their RoPE forms);
a sliding window found and carried; attentions it must leave (a mask of
another rule, a batch of two) keep their graph and say why."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from backend_helpers import dump_op_changes, final_graph_text, pinned_graph_text, run_and_report, stat
from expecttest import assert_expected_inline

HID, L = 32, 16


def rows(report):
    return {op: n for _, op, n, _ in report.kernels.rows}


class GQAttention(torch.nn.Module):
    """Grouped-query softmax attention over key and value caches [L, kv_heads, D] (Llama's, or
    Qwen3-Next's full-attention layers without their gate). ``form``: "sdpa-gqa" (SDPA with
    enable_gqa), "sdpa" (SDPA, kv_heads = heads), "hand" (repeat_interleave, scale, mask,
    softmax), "window" (hand-written with a 4-row sliding window), "strided" (hand-written, every
    other key hidden: a mask gqa_decode does not have), "upcast-first" (hand-written, the
    caches upcast to fp32 before they are repeated: SDPA's math form on CUDA in bf16)."""

    def __init__(self, form: str, heads: int = 4, kv_heads: int = 2, d: int = 8, dtype=torch.float32):
        super().__init__()
        g = torch.Generator().manual_seed(3)
        self.form, self.heads, self.kv_heads, self.d = form, heads, kv_heads, d
        self.q, self.k, self.v, self.o = (
            torch.nn.Parameter((torch.randn(o, i, generator=g) / i ** 0.5).to(dtype), requires_grad=False)
            for o, i in ((heads * d, HID), (kv_heads * d, HID), (kv_heads * d, HID), (HID, heads * d)))

    def forward(self, x, pos, kc, vc):
        T, n = x.shape[0], kc.shape[0]
        kc[pos] = (x @ self.k.T).view(T, self.kv_heads, self.d)
        vc[pos] = (x @ self.v.T).view(T, self.kv_heads, self.d)
        q = (x @ self.q.T).view(T, self.heads, self.d)
        visible = torch.arange(n, device=x.device)[None, :] <= pos[:, None]
        if self.form.startswith("sdpa"):
            o = F.scaled_dot_product_attention(q.transpose(0, 1)[None], kc.permute(1, 0, 2)[None],
                                               vc.permute(1, 0, 2)[None], attn_mask=visible[None, None],
                                               enable_gqa=self.form == "sdpa-gqa")[0].transpose(0, 1)
        else:
            group = self.heads // self.kv_heads
            if self.form == "upcast-first":
                # SDPA's math form on CUDA in bf16: head-major caches upcast to fp32, then repeated
                # per group along dim -3 (an unsqueezed fp32 view of kv_heads rows on the way).
                k, v = (c.transpose(0, 1)[None].float().repeat_interleave(group, -3) for c in (kc, vc))
                s = (q.transpose(0, 1)[None].float() @ k.transpose(-2, -1)) * self.d ** -0.5
                p = s.masked_fill(~visible[None, None], float("-inf")).softmax(-1)
                return (p @ v)[0].transpose(0, 1).to(x.dtype).reshape(T, self.heads * self.d) @ self.o.T
            k, v = kc.repeat_interleave(group, 1), vc.repeat_interleave(group, 1)       # [L, heads, d]
            s = torch.einsum("thd,lhd->htl", q.float(), k.float()) * self.d ** -0.5
            if self.form == "window":
                visible = visible & (torch.arange(n, device=x.device)[None, :] > pos[:, None] - 4)
            elif self.form == "strided":
                visible = visible & (torch.arange(n, device=x.device)[None, :] % 2 == 0)
            p = s.masked_fill(~visible[None], float("-inf")).softmax(-1)
            o = torch.einsum("htl,lhd->thd", p, v.float()).to(x.dtype)
        return o.reshape(T, self.heads * self.d) @ self.o.T


def _run(m, T, dtype=torch.float32, **options):
    gen = torch.Generator().manual_seed(T)
    x = torch.randn(T, HID, generator=gen).to(dtype)
    pos = torch.arange(L - T - 2, L - 2)
    kc = torch.randn(L, m.kv_heads, m.d, generator=gen).to(dtype)
    vc = torch.randn(L, m.kv_heads, m.d, generator=gen).to(dtype)
    ref_k, ref_v = kc.clone(), vc.clone()
    with torch.no_grad():
        ref = m(x, pos, ref_k, ref_v)
    out, report = run_and_report(m, x, pos, kc, vc, **options)
    torch.testing.assert_close(kc, ref_k)
    torch.testing.assert_close(vc, ref_v)
    return out, ref, report


@pytest.mark.parametrize("T", [1, 2, 6])
@pytest.mark.parametrize("form,heads,kv_heads", [("sdpa-gqa", 4, 2), ("sdpa-gqa", 4, 1), ("sdpa", 4, 4),
                                                 ("hand", 4, 2), ("hand", 6, 3)],
                         ids=["sdpa-gqa", "sdpa-mqa", "sdpa-mha", "hand-gqa", "hand-group2of6"])
def test_gqa_attention_becomes_gqa_decode(form, heads, kv_heads, T):
    out, ref, report = _run(GQAttention(form, heads, kv_heads), T)
    notes = stat(report, "pdl_swap").notes
    ops = rows(report)
    assert ops.get("lingc.gqa_decode") == 1 and "1 gqa_decode" in notes[0], notes
    assert ops.get("lingc.head_cache_write") == 2 and "aten.index_put" not in ops, ops
    assert "lingc.mla_decode" not in ops and not any(op.startswith(("aten.amax", "aten._softmax", "aten.exp"))
                                                     for op in ops), ops
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("T", [1, 6])
@pytest.mark.parametrize("kv_heads", [1, 2], ids=["mqa", "gqa"])
def test_bf16_caches_upcast_before_the_repeat(T, kv_heads):
    """The caches upcast to fp32 before they are repeated per group (a bf16 SDPA's math form on
    CUDA): the caches are found below their casts, so gqa_decode reads the bf16 [L, kv_heads, D]
    caches and the whole-cache casts go."""
    out, ref, report = _run(GQAttention("upcast-first", 4, kv_heads, dtype=torch.bfloat16), T, torch.bfloat16)
    assert rows(report).get("lingc.gqa_decode") == 1, stat(report, "pdl_swap").notes
    assert rows(report).get("prims.convert_element_type") == 1, report.kernels.format()    # the output's only
    torch.testing.assert_close(out.float(), ref.float(), rtol=3e-2, atol=3e-2)


def test_bf16_attention_becomes_gqa_decode():
    """A bf16 model's SDPA: gqa_decode computes in fp32 (split bf16 operands) and the output is
    cast back to bf16; eager rounds scores and probabilities to bf16 on the way, hence the bound."""
    out, ref, report = _run(GQAttention("sdpa-gqa", dtype=torch.bfloat16), 6, torch.bfloat16)
    assert rows(report).get("lingc.gqa_decode") == 1, stat(report, "pdl_swap").notes
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), ref.float(), rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("T", [1, 6])
def test_sliding_window_attention_becomes_gqa_decode_with_its_window(T, tmp_path):
    """A 4-row sliding window (`l > pos - 4`): the probe finds window 4 among the region's
    integer constants; the op carries it."""
    out, ref, report = _run(GQAttention("window"), T, dump_dir=str(tmp_path))
    assert rows(report).get("lingc.gqa_decode") == 1, stat(report, "pdl_swap").notes
    (call,) = [line for line in final_graph_text(report).splitlines() if "lingc.gqa_decode(" in line]
    assert ", 0.353553, 4)" in call, call              # scale 8^-0.5, window 4
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)


def test_an_unknown_mask_is_left_with_the_reason():
    """Keys hidden on a rule the op does not have (every other row): the probe fails for every
    candidate; the attention stays as it is, the note says why."""
    out, ref, report = _run(GQAttention("strided"), 2)
    notes = stat(report, "pdl_swap").notes
    assert "lingc.gqa_decode" not in rows(report)
    assert any("no assignment of the inputs reproduces the gqa_decode reference" in n for n in notes), notes
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)


class HFStyleAttention(GQAttention):
    """Hugging Face's Llama attention at batch 1 over a StaticCache: caches [1, kv_heads, L, D]
    written by index_copy_ along the sequence dim, repeat_kv (expand + reshape), SDPA with an
    additive mask (0 where visible, the dtype's minimum elsewhere)."""

    def forward(self, x, pos, kc, vc):
        T, n = x.shape[0], kc.shape[2]
        q = (x @ self.q.T).view(1, T, self.heads, self.d).transpose(1, 2)
        k = (x @ self.k.T).view(1, T, self.kv_heads, self.d).transpose(1, 2)
        q, k = self.rotate(q, k, pos)
        kc.index_copy_(2, pos, k)
        vc.index_copy_(2, pos, (x @ self.v.T).view(1, T, self.kv_heads, self.d).transpose(1, 2))
        group = self.heads // self.kv_heads

        def repeat_kv(c):
            return c[:, :, None].expand(1, self.kv_heads, group, n, self.d).reshape(1, self.heads, n, self.d)

        visible = torch.arange(n, device=x.device)[None, :] <= pos[:, None]
        mask = torch.zeros(T, n, dtype=x.dtype, device=x.device).masked_fill(~visible, torch.finfo(x.dtype).min)
        o = F.scaled_dot_product_attention(q, repeat_kv(kc), repeat_kv(vc), attn_mask=mask[None, None])
        return o.transpose(1, 2).reshape(T, self.heads * self.d) @ self.o.T

    def rotate(self, q, k, pos):
        """The queries' and keys' rotary embedding: none here (tests/test_pdl_swap_gqa_rope.py's
        subclass adds Llama's)."""
        return q, k


@pytest.mark.parametrize("T", [1, 6])
@pytest.mark.parametrize("heads,kv_heads", [(4, 2), (4, 1)], ids=["gqa", "mqa"])
def test_hugging_face_head_major_caches(heads, kv_heads, T):
    """Caches [1, kv_heads, L, D] (Hugging Face's StaticCache): gqa_decode reads them through a
    permuted view (its strides) and head_cache_write writes the rows through one, nothing copied."""
    m = HFStyleAttention("hf", heads, kv_heads)
    gen = torch.Generator().manual_seed(T)
    x, pos = torch.randn(T, HID, generator=gen), torch.arange(L - T - 2, L - 2)
    kc, vc = torch.randn(1, kv_heads, L, 8, generator=gen), torch.randn(1, kv_heads, L, 8, generator=gen)
    ref_k, ref_v = kc.clone(), vc.clone()
    with torch.no_grad():
        ref = m(x, pos, ref_k, ref_v)
    out, report = run_and_report(m, x, pos, kc, vc)
    ops = rows(report)
    assert ops.get("lingc.gqa_decode") == 1 and ops.get("lingc.head_cache_write") == 2, stat(report, "pdl_swap").notes
    assert not {op for cat, op, _, _ in report.kernels.rows if cat == "aten"}, report.kernels.format()
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(kc, ref_k)
    torch.testing.assert_close(vc, ref_v)


class TwoSequences(GQAttention):
    def forward(self, x, pos, kc, vc):            # x [2, T, HID], caches [2, L, kv_heads, d]
        T = x.shape[1]
        kc[:, pos] = (x @ self.k.T).view(2, T, self.kv_heads, self.d)
        vc[:, pos] = (x @ self.v.T).view(2, T, self.kv_heads, self.d)
        q = (x @ self.q.T).view(2, T, self.heads, self.d)
        visible = torch.arange(kc.shape[1], device=x.device)[None, :] <= pos[:, None]
        o = F.scaled_dot_product_attention(q.transpose(1, 2), kc.transpose(1, 2), vc.transpose(1, 2),
                                           attn_mask=visible[None, None], enable_gqa=True)
        return o.transpose(1, 2).reshape(2, T, self.heads * self.d) @ self.o.T


def test_a_batch_of_two_sequences_is_left_with_the_reason():
    m = TwoSequences("sdpa-gqa")
    gen = torch.Generator().manual_seed(4)
    x, pos = torch.randn(2, 2, HID, generator=gen), torch.tensor([9, 10])
    kc, vc = torch.randn(2, L, 2, 8, generator=gen), torch.randn(2, L, 2, 8, generator=gen)
    ref_k, ref_v = kc.clone(), vc.clone()
    with torch.no_grad():
        ref = m(x, pos, ref_k, ref_v)
    out, report = run_and_report(m, x, pos, kc, vc)
    notes = stat(report, "pdl_swap").notes
    assert "lingc.gqa_decode" not in rows(report)
    assert any("a batch of more than one sequence" in n for n in notes), notes
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)


@pinned_graph_text
def test_expect_gqa_dump(tmp_path):
    """The ops pdl_swap adds and drops for the hand-written GQA attention at T = 2 (its dump)."""
    m = GQAttention("hand")
    gen = torch.Generator().manual_seed(2)
    x, pos = torch.randn(2, HID, generator=gen), torch.tensor([12, 13])
    kc, vc = torch.randn(L, 2, 8, generator=gen), torch.randn(L, 2, 8, generator=gen)
    _, report = run_and_report(m, x, pos, kc, vc, dump_dir=str(tmp_path))
    assert_expected_inline(dump_op_changes(tmp_path, report, "pdl_swap"), """\
-aten.amax 1
-aten.bitwise_not 1
-aten.bmm 2
-aten.clone 3
-aten.copy_ 2
-aten.div.Tensor 1
-aten.exp 1
-aten.expand 2
-aten.index_put 2
-aten.le.Tensor 1
-aten.mul.Tensor 1
-aten.permute 10
+aten.reshape 2
-aten.scalar_tensor 1
-aten.sub.Tensor 1
-aten.sum.dim_IntList 1
-aten.unsqueeze 9
+aten.view 1
-aten.view 13
-aten.where.self 1
+lingc.gqa_decode 1
+lingc.head_cache_write 2
-prims.iota 1
""")


def test_layer_chain_names_the_gqa_layer():
    _, _, report = _run(GQAttention("sdpa-gqa"), 1)
    notes = stat(report, "pdl_swap").notes
    assert any(n.startswith("chain L0 GQA: gemm > head_cache_write > head_cache_write > gqa_decode > gemm")
               for n in notes), notes


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("T", [1, 6])
@pytest.mark.parametrize("form", ["sdpa-gqa", "sdpa", "hand", "window", "hf"])
def test_gpu_forms_on_gqa_decode(form, T, dtype):
    """On CUDA (whose trace keeps SDPA as a fused CUDA op or its math form): each form becomes one
    gqa_decode, the Triton kernel, against eager on the GPU."""
    kv_heads = 4 if form == "sdpa" else 2
    m = (HFStyleAttention("hf") if form == "hf" else GQAttention(form, 4, kv_heads)).to(device="cuda", dtype=dtype)
    gen = torch.Generator(device="cuda").manual_seed(T)
    x, pos = torch.randn(T, HID, device="cuda", generator=gen).to(dtype), torch.arange(L - T - 2, L - 2, device="cuda")
    shape = (1, kv_heads, L, 8) if form == "hf" else (L, kv_heads, 8)
    kc, vc = (torch.randn(*shape, device="cuda", generator=gen).to(dtype) for _ in range(2))
    ref_k, ref_v = kc.clone(), vc.clone()
    with torch.no_grad():
        ref = m(x, pos, ref_k, ref_v)
    out, report = run_and_report(m, x, pos, kc, vc)
    assert rows(report).get("lingc.gqa_decode") == 1, stat(report, "pdl_swap").notes
    rel = (out.float() - ref.float()).norm() / ref.float().norm()
    assert rel < (1e-4 if dtype == torch.float32 else 3e-2), f"{dtype} relative error {rel:.3g}"
    torch.testing.assert_close(kc, ref_k)
    torch.testing.assert_close(vc, ref_v)
