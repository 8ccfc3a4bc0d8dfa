"""fused_moe: foreign MoE formulations (matched and deliberately unmatched), numbers with the pass
on vs off, op counts, the tiny model at T=1, 6 and a chunked T=20, greedy tokens vs eager, one
Inductor run, and an expect test of the pass's dump on the tiny model."""

import difflib
from collections import Counter

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from expecttest import assert_expected_inline

from backend_helpers import (compile_lingc, compiled_and_eager_greedy, final_graph_text, pinned_graph_text, run_and_report,
                             stat)
from helpers import assert_close
from lingc.models import Ling3Cache, build_model, preset

# Deliberately unlike the tiny preset (16 experts in 4 groups, top-4, scale 2.5): the pass must
# read these from the graph.
H, E, I, IS, K, G, TG, SCALE = 40, 24, 12, 20, 3, 3, 2, 1.75


def _p(*shape, seed, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return nn.Parameter((torch.randn(*shape, generator=g) / shape[-1] ** 0.5).to(dtype), requires_grad=False)


class ForeignRouter(nn.Module):
    """Sigmoid scores, biased grouped top-k, renormalised unbiased weights, written independently
    of lingc.models.moe (float group mask, masked_fill, an eps in the renormalisation)."""

    def __init__(self, dtype=torch.float32, fill=float("-inf"), fp32=False, matmul3d=False):
        super().__init__()
        self.weight, self.bias = _p(E, H, seed=1, dtype=dtype), _p(E, seed=2)
        self.fill, self.fp32, self.matmul3d = fill, fp32, matmul3d

    def forward(self, x):
        T = x.shape[0]
        if self.fp32:
            logits = F.linear(x.float(), self.weight.float())
        elif self.matmul3d:
            logits = (x.unsqueeze(0) @ self.weight.T)[0].float()
        else:
            logits = (x @ self.weight.t()).float()
        s = logits.sigmoid()
        c = s + self.bias
        group_scores = c.view(T, G, -1).topk(2, dim=-1)[0].sum(-1)
        group_idx = group_scores.topk(TG, dim=-1)[1]
        group_mask = torch.zeros_like(group_scores).scatter_(1, group_idx, 1)
        mask = group_mask.unsqueeze(-1).expand(T, G, E // G).reshape(T, E)
        ids = c.masked_fill(~mask.bool(), self.fill).topk(K, dim=-1)[1]
        w = s.gather(1, ids)
        return ids, w / (w.sum(-1, keepdim=True) + 1e-20) * SCALE


class PlainTopkRouter(ForeignRouter):
    """No bias, no groups, no renormalisation or scale: moe_router with n_group = topk_group = 1
    and a zero bias."""

    def forward(self, x):
        s = torch.sigmoid(F.linear(x, self.weight))
        ids = torch.topk(s, K, dim=-1).indices
        return ids, s.gather(-1, ids)


class SoftmaxRouter(ForeignRouter):
    def forward(self, x):
        w, ids = (x @ self.weight.t()).softmax(-1).topk(K, dim=-1)
        return ids, w


class NormSoftmaxRouter(ForeignRouter):
    """Qwen3-MoE's router: softmax in fp32 over F.linear's logits, top-k, the top-k
    probabilities renormalised (norm_topk_prob), cast back to x's dtype."""

    def forward(self, x):
        probs = F.softmax(F.linear(x, self.weight), dim=1, dtype=torch.float)
        w, ids = torch.topk(probs, K, dim=-1)
        return ids, (w / w.sum(dim=-1, keepdim=True)).to(x.dtype)


class TemperedSoftmaxRouter(ForeignRouter):
    """A softmax at temperature 2: the same experts, other weights."""

    def forward(self, x):
        w, ids = (F.linear(x, self.weight) / 2.0).softmax(-1).topk(K, dim=-1)
        return ids, w


class TopkSoftmaxRouter(ForeignRouter):
    """Mistral's reference MoE router: the top-k of the logits, then a softmax over the k values
    (in fp32, cast back), optionally scaled; ``temperature`` divides the k values first (other
    weights, the same experts)."""

    def __init__(self, dtype=torch.float32, scale=1.0, temperature=1.0):
        super().__init__(dtype)
        self.scale, self.temperature = scale, temperature

    def forward(self, x):
        v, ids = torch.topk(F.linear(x, self.weight), K, dim=-1)
        return ids, (F.softmax(v / self.temperature, dim=1, dtype=torch.float) * self.scale).to(x.dtype)


class EinsumMoE(nn.Module):
    """index_select + einsum, separate gate/up/down tensors, x * sigmoid(x), an einsum combine,
    a shared expert written with F.linear."""

    def __init__(self, router=None, dtype=torch.float32):
        super().__init__()
        self.router = router or ForeignRouter(dtype)
        self.wg, self.wu, self.wd = _p(E, I, H, seed=3, dtype=dtype), _p(E, I, H, seed=4, dtype=dtype), \
            _p(E, H, I, seed=5, dtype=dtype)
        self.sg, self.su, self.sd = _p(IS, H, seed=6, dtype=dtype), _p(IS, H, seed=7, dtype=dtype), \
            _p(H, IS, seed=8, dtype=dtype)

    def experts(self, x, ids, w):
        T = x.shape[0]
        flat = ids.reshape(-1)
        wg = self.wg.index_select(0, flat).view(T, K, I, H)
        wu = self.wu.index_select(0, flat).view(T, K, I, H)
        wd = self.wd.index_select(0, flat).view(T, K, H, I)
        g, u = torch.einsum("th,tkih->tki", x, wg), torch.einsum("th,tkih->tki", x, wu)
        y = torch.einsum("tki,tkhi->tkh", g * torch.sigmoid(g) * u, wd)
        return torch.einsum("tkh,tk->th", y, w.to(y.dtype))

    def shared(self, x):
        return F.linear(F.silu(F.linear(x, self.sg)) * F.linear(x, self.su), self.sd)

    def forward(self, x):
        ids, w = self.router(x)
        return self.experts(x, ids, w) + self.shared(x)


class DenseScatterMoE(EinsumMoE):
    """Every expert on every token; the router weights scattered into a dense [T, E] combine."""

    def experts(self, x, ids, w):
        dense = torch.zeros(x.shape[0], E).scatter(1, ids, w)
        g, u = torch.einsum("th,eih->tei", x, self.wg), torch.einsum("th,eih->tei", x, self.wu)
        y = torch.einsum("tei,ehi->teh", F.silu(g) * u, self.wd)
        return torch.einsum("te,teh->th", dense, y)


class DenseOneHotMoE(DenseScatterMoE):
    """The dense form with a one-hot combine matrix."""

    def experts(self, x, ids, w):
        dense = (F.one_hot(ids, E).to(w.dtype) * w.unsqueeze(-1)).sum(1)
        g, u = torch.einsum("th,eih->tei", x, self.wg), torch.einsum("th,eih->tei", x, self.wu)
        y = torch.einsum("tei,ehi->teh", g * torch.sigmoid(g) * u, self.wd)
        return torch.einsum("te,teh->th", dense, y)


class PerSlotMoE(nn.Module):
    """A Python loop over the slots: one expert per token per iteration, stacked w13 split by chunk,
    clamped SwiGLU (routed 0.5, shared 0.7), fused gate_up shared expert, router by matmul on 3-D."""

    def __init__(self):
        super().__init__()
        self.router = ForeignRouter(matmul3d=True)
        self.w13, self.w2 = _p(E, 2 * I, H, seed=9), _p(E, H, I, seed=10)
        self.gate_up, self.down = _p(2 * IS, H, seed=11), _p(H, IS, seed=12)

    def forward(self, x):
        ids, w = self.router(x)
        out = None
        for j in range(K):
            e = ids[:, j]
            g, u = torch.bmm(self.w13[e], x.unsqueeze(-1)).squeeze(-1).chunk(2, dim=-1)
            a = torch.clamp(F.silu(g), max=0.5) * torch.clamp(u, -0.5, 0.5)
            term = w[:, j, None] * torch.bmm(self.w2[e], a.unsqueeze(-1)).squeeze(-1)
            out = term if out is None else out + term
        g, u = (x @ self.gate_up.T).chunk(2, dim=-1)
        return out + (torch.clamp(F.silu(g), max=0.7) * torch.clamp(u, -0.7, 0.7)) @ self.down.T


class WeightedSumMoE(nn.Module):
    """gather + bmm like lingc's model but a weighted sum(1) combine, no shared expert; in bf16 with
    an fp32 router (`F.linear(x.float(), W.float())`) and the swiglu under .float()."""

    def __init__(self, dtype=torch.bfloat16):
        super().__init__()
        self.router = ForeignRouter(dtype, fp32=True)
        self.w13, self.w2 = _p(E, 2 * I, H, seed=13, dtype=dtype), _p(E, H, I, seed=14, dtype=dtype)

    def forward(self, x):
        ids, w = self.router(x)
        T = x.shape[0]
        h = torch.bmm(self.w13[ids.reshape(-1)], x.repeat_interleave(K, 0).unsqueeze(-1)).squeeze(-1)
        a = (F.silu(h[:, :I].float()) * h[:, I:].float()).to(x.dtype)
        y = torch.bmm(self.w2[ids.reshape(-1)], a.unsqueeze(-1)).view(T, K, H)
        return (y.float() * w.unsqueeze(-1)).sum(1).to(x.dtype)


class PairIndexMoE(EinsumMoE):
    """Transformers' batched_mm experts form: the (token, slot) pairs flattened, x's rows gathered
    by a token index (arange expanded over the slots), the selected experts' stacked gate_up and
    down gathered per pair, bmm, chunk, the weights applied per pair and an index_add_ of the
    pairs into a zeros [T, H]; the shared expert added after."""

    def __init__(self):
        super().__init__()
        self.gate_up, self.down = _p(E, 2 * I, H, seed=15), _p(E, H, I, seed=16)

    def experts(self, x, ids, w):
        T, k = x.shape[0], ids.shape[-1]
        pair_expert = ids.reshape(-1)
        pair_token = torch.arange(T, device=x.device).unsqueeze(1).expand(-1, k).reshape(-1)
        gu = torch.bmm(self.gate_up[pair_expert], x[pair_token].unsqueeze(-1)).squeeze(-1)
        g, u = gu.chunk(2, dim=-1)
        y = torch.bmm(self.down[pair_expert], (F.silu(g) * u).unsqueeze(-1)).squeeze(-1)
        y = y * w.reshape(-1).unsqueeze(-1)
        return torch.zeros_like(x).index_add_(0, pair_token, y.to(x.dtype))


class PairIndexIntoX(PairIndexMoE):
    """The same pairs added into x itself (index_add_ onto the residual, not onto zeros)."""

    def experts(self, x, ids, w):
        T, k = x.shape[0], ids.shape[-1]
        pair_token = torch.arange(T).unsqueeze(1).expand(-1, k).reshape(-1)
        gu = torch.bmm(self.gate_up[ids.reshape(-1)], x[pair_token].unsqueeze(-1)).squeeze(-1)
        g, u = gu.chunk(2, dim=-1)
        y = torch.bmm(self.down[ids.reshape(-1)], (F.silu(g) * u).unsqueeze(-1)).squeeze(-1)
        return x.clone().index_add_(0, pair_token, y * w.reshape(-1, 1)) - x


GI = 16      # torch._grouped_mm's bf16 operands need 16-byte rows: I a multiple of 8


class GroupedMmMoE(PairIndexMoE):
    """Transformers' grouped_mm experts form (bf16: torch.compile's grouped_mm takes no other):
    the pairs sorted by expert (argsort), x's rows and the weights gathered in that order, the
    offsets a cumsum of the sorted ids' histc, torch._grouped_mm up and down, the rows put back by
    the inverse permutation and index_add_-ed into zeros. Variants: ``sorted_index`` adds the
    sorted rows by their sorted token index (no inverse), x gathered by it (``pair_token``: that
    index as perm // k); ``ends="onehot"``
    counts the rows with a one-hot; ``ends="rolled"`` shifts the counts by one expert (wrong
    groups: not the experts' projection); ``descending`` sorts the experts the other way (the
    offsets then no longer describe the rows)."""

    def __init__(self, sorted_index=False, ends="histc", descending=False, pair_token=False):
        super().__init__()
        self.gate_up, self.down = _p(E, 2 * GI, H, seed=15), _p(E, H, GI, seed=16)
        self.sorted_index, self.ends, self.descending = sorted_index, ends, descending
        self.pair_token = pair_token
        self.to(torch.bfloat16)

    def experts(self, x, ids, w):
        T, k = x.shape[0], ids.shape[-1]
        pair_expert = ids.reshape(-1)
        pair_token = torch.arange(T, device=x.device).unsqueeze(1).expand(-1, k).reshape(-1)
        perm = torch.argsort(pair_expert, stable=True, descending=self.descending)
        if self.ends == "onehot":
            counts = F.one_hot(pair_expert, E).sum(0)
        else:
            counts = torch.histc(pair_expert[perm].float(), bins=E, min=0, max=E - 1)
            if self.ends == "rolled":
                counts = counts.roll(1)
        ends = torch.cumsum(counts, dim=0, dtype=torch.int32)
        # A sorted pair's token: gathered by perm, or perm // k (lingc.models.moe's library form).
        sorted_token = perm // k if self.pair_token else pair_token[perm]
        rows = x[sorted_token] if self.sorted_index else x[pair_token][perm]
        gu = torch._grouped_mm(rows, self.gate_up.transpose(-2, -1), offs=ends)
        g, u = gu.chunk(2, dim=-1)
        y = torch._grouped_mm(F.silu(g) * u, self.down.transpose(-2, -1), offs=ends)
        y = y * w.reshape(-1)[perm].unsqueeze(-1)
        if self.sorted_index:
            return torch.zeros_like(x).index_add_(0, sorted_token, y.to(x.dtype))
        inverse = torch.argsort(perm, stable=True)
        return torch.zeros_like(x).index_add_(0, pair_token, y[inverse].to(x.dtype))


class TransposedExperts(EinsumMoE):
    """Gate/up stored [E, H, I]: moe_experts would need a copy, so the experts are left alone."""

    def __init__(self):
        super().__init__()
        self.wg, self.wu = _p(E, H, I, seed=3), _p(E, H, I, seed=4)

    def experts(self, x, ids, w):
        g, u = torch.einsum("th,tkhi->tki", x, self.wg[ids]), torch.einsum("th,tkhi->tki", x, self.wu[ids])
        y = torch.einsum("tki,tkhi->tkh", F.silu(g) * u, self.wd[ids])
        return torch.einsum("tkh,tk->th", y, w)


class ReluExperts(EinsumMoE):
    def experts(self, x, ids, w):
        g, u = torch.einsum("th,tkih->tki", x, self.wg[ids]), torch.einsum("th,tkih->tki", x, self.wu[ids])
        return torch.einsum("tkh,tk->th", torch.einsum("tki,tkhi->tkh", torch.relu(g) * u, self.wd[ids]), w)


class MissingSlot(EinsumMoE):
    def experts(self, x, ids, w):
        y = super().experts(x, ids, torch.ones_like(w))
        return y - super().experts(x, ids[:, -1:].expand(-1, K), w[:, -1:].expand(-1, K) / K)


def _with_router(module, router):
    module.router = router
    return module


MATCHED = [
    # module, T, matches, notes
    (EinsumMoE(), 5, 2, ["1 routers, 1 expert blocks (1 with shared expert)"]),
    (DenseScatterMoE(), 4, 2, ["1 routers, 1 expert blocks (1 with shared expert)"]),
    (DenseOneHotMoE(), 3, 2, ["1 routers, 1 expert blocks (1 with shared expert)"]),
    (PerSlotMoE(), 4, 2, ["1 routers, 1 expert blocks (1 with shared expert)"]),
    (WeightedSumMoE(), 5, 2, ["1 routers, 1 expert blocks (0 with shared expert)"]),
    (EinsumMoE(), 1, 2, ["1 routers, 1 expert blocks (1 with shared expert)"]),
    (EinsumMoE(PlainTopkRouter()), 4, 2, ["1 routers, 1 expert blocks (1 with shared expert)"]),
    (PairIndexMoE(), 1, 2, ["1 routers, 1 expert blocks (1 with shared expert)"]),
    (PairIndexMoE(), 5, 2, ["1 routers, 1 expert blocks (1 with shared expert)"]),
    (PairIndexMoE().to(torch.bfloat16), 4, 2, ["1 routers, 1 expert blocks (1 with shared expert)"]),
    (EinsumMoE(SoftmaxRouter()), 1, 2, ["1 routers, 1 expert blocks (1 with shared expert)"]),
    (EinsumMoE(SoftmaxRouter()), 4, 2, ["1 routers, 1 expert blocks (1 with shared expert)"]),
    (EinsumMoE(NormSoftmaxRouter()), 5, 2, ["1 routers, 1 expert blocks (1 with shared expert)"]),
    (_with_router(PairIndexMoE(), NormSoftmaxRouter()), 4, 2, ["1 routers, 1 expert blocks (1 with shared expert)"]),
    (_with_router(PairIndexMoE(), NormSoftmaxRouter()).to(torch.bfloat16), 4, 2,
     ["1 routers, 1 expert blocks (1 with shared expert)"]),
    (EinsumMoE(ForeignRouter(fill=0.0)), 4, 2, ["1 routers, 1 expert blocks (1 with shared expert)"]),
    (_with_router(PairIndexMoE(), ForeignRouter(fill=0.0, fp32=True)), 1, 2, ["1 routers, 1 expert blocks (1 with shared expert)"]),
    (EinsumMoE(TopkSoftmaxRouter()), 4, 2, ["1 routers, 1 expert blocks (1 with shared expert)"]),
    (EinsumMoE(TopkSoftmaxRouter(scale=2.5)), 1, 2, ["1 routers, 1 expert blocks (1 with shared expert)"]),
    (_with_router(PairIndexMoE(), TopkSoftmaxRouter()).to(torch.bfloat16), 4, 2,
     ["1 routers, 1 expert blocks (1 with shared expert)"]),
    (GroupedMmMoE(), 1, 2, ["1 routers, 1 expert blocks (1 with shared expert)"]),
    (GroupedMmMoE(), 5, 2, ["1 routers, 1 expert blocks (1 with shared expert)"]),
    (GroupedMmMoE(sorted_index=True, ends="onehot"), 4, 2, ["1 routers, 1 expert blocks (1 with shared expert)"]),
    (GroupedMmMoE(sorted_index=True, pair_token=True), 3, 2, ["1 routers, 1 expert blocks (1 with shared expert)"]),
]
UNMATCHED = [
    (TransposedExperts(), 1, "experts left as ATen ops: expert gate/up weights are not stored [E, I, H]"),
    (ReluExperts(), 1, "experts left as ATen ops: the expert projections do not form a SwiGLU"),
    (MissingSlot(), 1, "experts left as ATen ops: the expert outputs are not summed over all slots"),
    (PairIndexIntoX(), 1, "experts left as ATen ops: the expert outputs are not summed over all slots"),
    (EinsumMoE(TemperedSoftmaxRouter()), 1, "router left as ATen ops: the expert selection is not the top-k "
                                            "of a softmax (checked on random logits)"),
    (EinsumMoE(TopkSoftmaxRouter(temperature=2.0)), 1, "router left as ATen ops: the expert selection is not the "
                                                       "top-k of a softmax (checked on random logits)"),
]


def _rows(report) -> Counter:
    return Counter({op: n for _, op, n, _ in report.kernels.rows})


def _x(T, dtype=torch.float32, seed=0):
    return torch.randn(T, H, generator=torch.Generator().manual_seed(seed)).to(dtype)


@pytest.mark.parametrize("module, T, matches, notes", MATCHED,
                         ids=[f"{type(m).__name__}-{type(m.router).__name__}-T{t}" for m, t, *_ in MATCHED])
def test_foreign_formulations(module, T, matches, notes):
    x = _x(T, module.router.weight.dtype)
    with torch.no_grad():
        ref = module(x)
    out, report = run_and_report(module, x)
    off, report_off = run_and_report(module, x, disable_passes=["fused_moe"])
    s = stat(report, "fused_moe")
    assert (s.matches, s.notes) == (matches, notes)
    rows = _rows(report)
    assert rows["lingc.moe_router"] == rows["lingc.moe_experts"] == 1
    for gone in ("aten.topk", "aten.bmm", "aten.index", "aten.index_select", "aten.sigmoid", "aten._grouped_mm",
                 "aten.sort", "aten.histc"):
        assert rows[gone] == 0, gone
    assert s.ops_after < s.ops_before and rows["lingc.swiglu_gemm_separate"] == 0   # shared expert is ours
    if x.dtype == torch.float32:
        torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(out, off, rtol=1e-5, atol=1e-5)
    else:                      # declared: fp32 router logits, one rounding of the combine
        assert_close(out, ref, 1e-2)
        assert_close(out, off, 1e-2)


@pytest.mark.parametrize("module, matches, note", UNMATCHED, ids=[type(m).__name__ for m, *_ in UNMATCHED])
def test_unmatched_parts_are_left_with_a_note(module, matches, note):
    x = _x(4)
    with torch.no_grad():
        ref = module(x)
    out, report = run_and_report(module, x)
    s = stat(report, "fused_moe")
    assert s.matches == matches
    assert any(note in n for n in s.notes), s.notes
    rows = _rows(report)
    assert rows["lingc.moe_router"] == (1 if "router left" not in note else 0)
    assert rows["lingc.moe_experts"] == (1 if "experts left" not in note else 0)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("module, note", [
    (GroupedMmMoE(ends="rolled"), "experts left as ATen ops: the grouped_mm offsets are not the cumulative row "
                                  "counts of the selected experts (checked on random ids)"),
    (GroupedMmMoE(descending=True), "experts left as ATen ops: no projection of x by the selected experts' weights"),
], ids=["rolled-ends", "descending"])
def test_grouped_mm_experts_that_are_not_the_experts_projection_are_left(module, note):
    """Offsets that do not follow the sorted experts, or a sort the offsets do not describe, run
    some other computation: the router is still rewritten, the experts stay as they are."""
    x = _x(4, torch.bfloat16)
    with torch.no_grad():
        ref = module(x)
    out, report = run_and_report(module, x)
    s = stat(report, "fused_moe")
    assert s.matches == 1 and any(note in n for n in s.notes), s.notes
    rows = _rows(report)
    assert (rows["lingc.moe_router"], rows["lingc.moe_experts"], rows["aten._grouped_mm"]) == (1, 0, 2)
    off, _ = run_and_report(module, x, disable_passes=["fused_moe"])
    assert_close(out, ref, 1e-2)
    assert_close(out, off, 1e-2)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("T", [1, 6])
def test_gpu_grouped_mm_experts(T):
    """Transformers' grouped_mm form on the GPU (where torch._grouped_mm runs its sm_90 kernel in
    eager): the compiled block on lingc's two MoE ops equals eager within bf16's declared rounding."""
    module = GroupedMmMoE().cuda()
    x = _x(T, torch.bfloat16).cuda()
    with torch.no_grad():
        ref = module(x)
    out, report = run_and_report(module, x)
    rows = _rows(report)
    assert (rows["lingc.moe_router"], rows["lingc.moe_experts"], rows["aten._grouped_mm"]) == (1, 1, 0)
    assert_close(out, ref, 1e-2)


class GatedSharedMoE(EinsumMoE):
    """Qwen3-Next's block: a softmax router and a shared expert behind a sigmoid gate
    (`shared_expert_gate`, a Linear(H, 1)): written with F.linear on a parameter, or as
    Transformers writes it (an nn.Linear module, F.sigmoid, the product the other way round);
    with ``bias`` the gate's Linear has a bias, which moe_experts does not take."""

    def __init__(self, dtype=torch.float32, hf=False, bias=False):
        super().__init__(NormSoftmaxRouter(dtype), dtype)
        self.hf = hf
        self.shared_gate = _p(1, H, seed=30, dtype=dtype)
        if hf or bias:
            self.gate = nn.Linear(H, 1, bias=bias).to(dtype).requires_grad_(False)
            self.gate.weight.copy_(self.shared_gate)

    def forward(self, x):
        ids, w = self.router(x)
        if self.hf or hasattr(self, "gate"):
            shared = self.shared(x)
            return self.experts(x, ids, w) + shared * F.sigmoid(self.gate(x))
        return self.experts(x, ids, w) + torch.sigmoid(F.linear(x, self.shared_gate)) * self.shared(x)


GATED = [(GatedSharedMoE(), 4), (GatedSharedMoE(), 1), (GatedSharedMoE(hf=True), 3),
         (GatedSharedMoE(torch.bfloat16, hf=True), 2)]


@pytest.mark.parametrize("module, T", GATED, ids=["fp32-T4", "fp32-T1", "hf-T3", "hf-bf16-T2"])
def test_a_gated_shared_expert_is_in_the_experts_op(module, T, tmp_path):
    """The shared expert behind a sigmoid gate of x goes into moe_experts with its gate weight
    (shared_sigmoid=, computed in the combine): no sigmoid, no projection left on ATen; the block
    equals eager and the block with fused_moe off."""
    x = _x(T, module.shared_gate.dtype)
    with torch.no_grad():
        ref = module(x)
    out, report = run_and_report(module, x, dump_dir=str(tmp_path))
    off, _ = run_and_report(module, x, disable_passes=["fused_moe"])
    s = stat(report, "fused_moe")
    assert (s.matches, s.notes) == (2, ["1 routers, 1 expert blocks (1 with shared expert, 1 of them gated)"])
    rows = _rows(report)
    assert rows["lingc.moe_router"] == rows["lingc.moe_experts"] == 1
    for gone in ("aten.sigmoid", "aten.mm", "aten.addmm", "aten.index_select", "lingc.gemm", "lingc.swiglu_gemm_separate"):
        assert rows[gone] == 0, (gone, report.kernels.format())
    calls = [line for line in final_graph_text(report).splitlines() if "lingc.moe_experts(" in line]
    assert len(calls) == 1 and "shared_sigmoid=%" in calls[0], calls
    if x.dtype == torch.float32:
        torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(out, off, rtol=1e-5, atol=1e-5)
    else:                      # declared: the gate's logit and sigmoid in fp32, one rounding
        assert_close(out, ref, 1e-2)


def test_a_gated_shared_expert_with_a_biased_gate_stays_beside():
    """A gate Linear with a bias is not moe_experts' gate: the routed experts and the router are
    matched, the gated shared expert stays as it is, and the block equals eager."""
    m = GatedSharedMoE(bias=True)
    x = _x(4)
    with torch.no_grad():
        ref = m(x)
    out, report = run_and_report(m, x)
    s = stat(report, "fused_moe")
    assert (s.matches, s.notes) == (2, ["1 routers, 1 expert blocks (0 with shared expert)"])
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)


class NormedMoE(nn.Module):
    """The block's input norm (nn.RMSNorm) before a MoE block, as a decoder layer has it."""

    def __init__(self, moe):
        super().__init__()
        self.norm, self.moe = nn.RMSNorm(H, eps=1e-6), moe

    def forward(self, x):
        return self.moe(self.norm(x))


def test_softmax_router_kernel_call(tmp_path):
    """A softmax router becomes moe_router(..., softmax=True) with one group, the renormalisation
    and the scale read from the weights' chain; the norm before it is not folded into the
    router's logits kernel (rmsnorm_router's selection is the sigmoid one), where a sigmoid
    router's is."""
    m = NormedMoE(EinsumMoE(NormSoftmaxRouter()))
    x = _x(3)
    with torch.no_grad():
        ref = m(x)
    out, report = run_and_report(m, x, dump_dir=str(tmp_path))
    calls = [line for line in final_graph_text(report).splitlines() if "lingc.moe_router(" in line]
    assert len(calls) == 1 and "softmax=True" in calls[0] and ", 1, 1, 3, 1.0, True" in calls[0], calls
    rows = _rows(report)
    assert rows["lingc.rmsnorm"] == 1 and rows["lingc.rmsnorm_router"] == 0
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)


def test_norm_folds_into_a_zero_fill_router_with_its_rule(tmp_path):
    """The block's input norm folds into a 0-fill router's logits kernel as into any sigmoid
    router's, and the fused op keeps the rule (rmsnorm_router(..., zero_fill=True))."""
    m = NormedMoE(EinsumMoE(ForeignRouter(fill=0.0)))
    x = _x(3)
    with torch.no_grad():
        ref = m(x)
    out, report = run_and_report(m, x, dump_dir=str(tmp_path))
    calls = [line for line in final_graph_text(report).splitlines() if "lingc.rmsnorm_router(" in line]
    assert len(calls) == 1 and "zero_fill=True" in calls[0], calls
    assert _rows(report)["lingc.moe_router"] == 0
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("softmax", [False, True])
def test_norm_folds_into_a_sigmoid_router_only(softmax):
    """pdl_norm_folds.norms_into_routers on rmsnorm -> moe_router with every operand ready before
    the norm: folded into rmsnorm_router for a sigmoid router, left for a softmax one (the fused
    op's selection is the sigmoid one)."""
    import operator

    from lingc.graph_build import emit
    from lingc.passes.pdl_norm_folds import norms_into_routers
    from lingc.runtime.kernels import moe_router, norms  # noqa: F401  (register the ops)

    from torch._subclasses.fake_tensor import FakeTensorMode

    g = torch.fx.Graph()
    ins = {}
    with FakeTensorMode():
        vals = (("x", torch.empty(2, H)), ("nw", torch.empty(H)), ("gw", torch.empty(E, H)), ("bias", torch.empty(E)))
    for name, t in vals:
        ins[name] = g.placeholder(name)
        ins[name].meta["val"] = t
    rms = emit(g, torch.ops.lingc.rmsnorm.default, ins["x"], ins["nw"], None, 1e-6)
    y = emit(g, operator.getitem, rms, 0)
    r = emit(g, torch.ops.lingc.moe_router.default, y, ins["gw"], ins["bias"], 1, 1, K, 1.0, True,
             **({"softmax": True} if softmax else {}))
    g.output((emit(g, operator.getitem, r, 0), emit(g, operator.getitem, r, 1), emit(g, operator.getitem, rms, 1)))
    assert norms_into_routers(g) == (0 if softmax else 1)
    ops = {n.target for n in g.nodes if n.op == "call_function"}
    assert (torch.ops.lingc.rmsnorm_router.default in ops) != softmax


class HFExpertLoopMoE(nn.Module):
    """A MoE block as Hugging Face's Qwen2-MoE / Qwen3-Next write it: a softmax router, then a
    loop over the experts, each taking the rows torch.where finds for it (a data-dependent count)
    and index_add_-ing its output back; a shared expert behind a sigmoid gate."""

    def __init__(self, hid=32, experts=6, topk=2, inter=16):
        super().__init__()
        g = torch.Generator().manual_seed(4)

        def lin(o, i):
            return nn.Parameter(torch.randn(o, i, generator=g) / i ** 0.5, requires_grad=False)

        self.topk, self.router = topk, lin(experts, hid)
        self.w_gate = nn.ParameterList([lin(inter, hid) for _ in range(experts)])
        self.w_up = nn.ParameterList([lin(inter, hid) for _ in range(experts)])
        self.w_down = nn.ParameterList([lin(hid, inter) for _ in range(experts)])
        self.shared = nn.ParameterList([lin(inter, hid), lin(inter, hid), lin(hid, inter), lin(1, hid)])

    def forward(self, x):
        w = F.softmax(x @ self.router.T, dim=1, dtype=torch.float)
        w, sel = torch.topk(w, self.topk, dim=-1)
        w = (w / w.sum(-1, keepdim=True)).to(x.dtype)
        out = torch.zeros_like(x)
        mask = F.one_hot(sel, num_classes=len(self.w_gate)).permute(2, 1, 0)
        for e in range(len(self.w_gate)):
            slot, rows = torch.where(mask[e])
            h = x[rows]
            y = (F.silu(h @ self.w_gate[e].T) * (h @ self.w_up[e].T)) @ self.w_down[e].T
            out.index_add_(0, rows, y * w[rows, slot, None])
        g, u, d, sg = self.shared
        return out + torch.sigmoid(x @ sg.T) * ((F.silu(x @ g.T) * (x @ u.T)) @ d.T)


def test_an_expert_loop_over_data_dependent_rows_compiles_and_equals_eager():
    """Rows known only at run time (torch.where per expert) reach the passes as unbacked sizes:
    the projections on them are left to ATen with the reason (they crashed fuse_projections
    before), the rest compiles, and the step equals eager."""
    m = HFExpertLoopMoE()
    x = torch.randn(3, 32, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = m(x)
    out, report = run_and_report(m, x)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    assert "data-dependent rows (e.g. tokens picked by torch.where): left to ATen" in report.kernels.format()
    notes = stat(report, "fused_moe").notes     # the router is lingc's; the note says how to get the experts
    assert notes[0] == "1 routers, 0 expert blocks (0 with shared expert)"
    assert "experts left as ATen ops: the experts run on data-dependent rows" in notes[1] \
        and "experts_implementation='batched_mm' or 'grouped_mm'" in notes[1], notes


def test_zero_fill_changes_routing(tmp_path):
    """A 0-fill router (DeepSeek-V3's Hugging Face code) computes something else than a -inf mask
    when biased scores go negative: the pass tells them apart and runs each on its own rule."""
    from lingc.runtime.kernels.moe_router.naive import grouped_topk_reference

    a, b = ForeignRouter(), ForeignRouter(fill=0.0)
    b.bias.data -= 3.0
    a.bias.data -= 3.0
    x = _x(16)
    assert not torch.equal(a(x)[0].sort(-1).values, b(x)[0].sort(-1).values)
    for router, zero_fill in ((a, False), (b, True)):
        (ids, w), report = run_and_report(router, x, dump_dir=str(tmp_path / str(zero_fill)))
        text = final_graph_text(report)
        assert text.count("lingc.moe_router") == 1 and ("zero_fill=True" in text) == zero_fill, text
        with torch.no_grad():
            ref_ids = router(x)[0]
        # All-negative keys: the 0-fill picks are the dropped groups' lowest ids (eager's torch.topk
        # may pick others among the tied zeros, so compare the rule, not eager's tie order).
        want = grouped_topk_reference(torch.sigmoid(x @ router.weight.t()), router.bias, G, TG, K, SCALE, True,
                                      zero_fill)
        assert torch.equal(ids.int().sort(-1).values, want[0].sort(-1).values)
        torch.testing.assert_close(w.sort(-1).values, want[1].sort(-1).values, rtol=1e-5, atol=1e-6)
        if not zero_fill:
            assert torch.equal(ids.sort(-1).values, ref_ids.sort(-1).values)


# ----------------------------------------------------------------------------------- tiny model
@pytest.fixture(scope="module")
def tiny():
    return build_model(preset("tiny"), progress=False)


def _step_args(model, T, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 300, (T,), generator=g), torch.arange(7, 7 + T), Ling3Cache.allocate(model.config, 48)


@pytest.mark.parametrize("T, blocks", [(1, 5), (6, 5), (20, 10)])     # T=20: two MOE_CHUNK chunks
def test_tiny_model(tiny, T, blocks):
    ids, pos, cache = _step_args(tiny, T)
    with torch.no_grad():
        ref, _ = tiny(ids, pos, cache.clone())
    (off, _), report_off = run_and_report(tiny, ids, pos, cache.clone(), role="decode",
                                          disable_passes=["fused_moe"])
    verify = T < 16                      # the verify mode (graph run before/after every pass) is slow
    (logits, _), report = run_and_report(tiny, ids, pos, cache, role="decode", verify=verify)
    s = stat(report, "fused_moe")
    assert s.matches == 2 * blocks
    assert s.notes == [f"{blocks} routers, {blocks} expert blocks ({blocks} with shared expert)"]
    assert not verify or s.max_rel_err < 1e-5                          # verify mode ran the graph
    rows, rows_off = _rows(report), _rows(report_off)
    # (pdl_swap then folds each block's input norm into its router, lingc.rmsnorm_router, up to
    # its T limit; past it the norms stay ATen and the routers lingc.moe_router)
    routers = rows.get("lingc.rmsnorm_router", 0) + rows.get("lingc.moe_router", 0)
    assert routers == rows["lingc.moe_experts"] == blocks
    assert rows["aten.topk"] == rows["aten.index"] == 0
    assert rows_off["aten.bmm"] - rows["aten.bmm"] == 2 * blocks         # only attention bmm left
    # the dense layer's MLP is the only SwiGLU left for swiglu_epilogue
    assert stat(report, "swiglu_epilogue").matches == tiny.config.first_k_dense_replace
    torch.testing.assert_close(logits, ref, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(logits, off, rtol=1e-5, atol=1e-5)
    assert torch.equal(logits.argmax(-1), ref.argmax(-1))


def test_tiny_model_bf16_router_numerics():
    """bf16 model: the declared numerics (fp32 router logits, one rounding of the combine) keep
    the logits close to the unfused graph. Seed 2: with seeds 0 and 3 one row of six has a bf16
    near-tie in its top-k that the two roundings break differently (one expert swapped moves
    that row's logits by ~9%); a discrete flip is not the rounding error this test bounds."""
    model = build_model(preset("tiny", torch_dtype="bfloat16", router_dtype="bf16"), seed=2,
                        progress=False)
    ids, pos, cache = _step_args(model, 6)
    (on, _), report = run_and_report(model, ids, pos, cache.clone(), role="decode")
    (off, _), _ = run_and_report(model, ids, pos, cache.clone(), role="decode", disable_passes=["fused_moe"])
    assert stat(report, "fused_moe").matches == 10
    assert_close(on.float(), off.float(), 3e-2)


def test_tiny_greedy_tokens_equal_eager(tiny):
    out, want = compiled_and_eager_greedy(tiny, seed=5)
    assert out == want


def test_tiny_through_inductor(tiny, monkeypatch):
    """Inductor compiles what is left around the lingc ops; the w13 halves reach moe_experts as
    views of the parameter (reinterpret_tensor with an offset), never copies. (The embedding
    gather stays an ATen op, so that Inductor has a leftover.)"""
    import re
    from lingc.passes.pdl_swap import PdlSwap
    monkeypatch.setattr(PdlSwap, "fold_embedding", False)
    from lingc.backend import compile_reports
    from torch._inductor.utils import run_and_get_code
    ids, pos, cache = _step_args(tiny, 1)
    with torch.no_grad():
        ref, _ = tiny(ids, pos, cache.clone())
        step = compile_lingc(tiny, role="decode", inductor=True)
        (logits, _), codes = run_and_get_code(step, ids, pos, cache)
    report = compile_reports[-1]
    assert stat(report, "fused_moe").matches == 10 and report.kernels.inductor_kernels
    calls = re.findall(r"torch\.ops\.lingc\.moe_experts\.default\((.*)\)\n", "".join(codes))
    assert len(calls) == 5
    for call in calls:
        w13 = re.findall(r"reinterpret_tensor\((arg\d+_1), \(16, 24, 96\), \(4608, 96, 1\), (\d+)\)", call)
        assert [off for _, off in w13] == ["0", "2304"] and w13[0][0] == w13[1][0], call
    torch.testing.assert_close(logits, ref, rtol=1e-4, atol=1e-4)


# ------------------------------------------------------------------------------------ expect
@pinned_graph_text
def test_expect_tiny_dump(tiny, tmp_path):
    """The tiny model's T=1 dump: fused_moe's summary line and kernel rows, the nodes it adds, and
    what it removes (by op). Other passes' lines are pinned by their own tests."""
    from lingc.dump import format_summary
    ids, pos, cache = _step_args(tiny, 1)
    _, report = run_and_report(tiny, ids, pos, cache, role="decode", dump_dir=str(tmp_path))
    d = tmp_path / report.dump_dir.split("/")[-1]
    before = next(d.glob("*-fused_moe.before.txt")).read_text().splitlines()
    after = next(d.glob("*-fused_moe.after.txt")).read_text().splitlines()
    diff = [l for l in difflib.unified_diff(before, after, n=0, lineterm="") if not l.startswith(("+++", "---"))]
    added = [l for l in diff if l.startswith("+")]
    removed = Counter(l.split("= ", 1)[1].split("(")[0] for l in diff if l.startswith("-") and "= " in l)
    summary = format_summary(report.stats, "decode", timings=False).splitlines()
    mine = [line for line in summary if line.startswith(("pass ", "fused_moe "))]
    moe_rows = [r for r in report.kernels.format().splitlines() if "lingc.moe_" in r]
    assert_expected_inline("\n".join(mine + moe_rows) + "\n", """\
pass                 matches   ops before -> after   time ms  note
fused_moe                 10          1431 -> 1097         -  5 routers, 5 expert blocks (5 with shared expert)
lingc         lingc.moe_experts                      5  f32[1, 96]
""")
    assert_expected_inline("\n".join(added) + "\n", """\
+%moe_router_default = lingc.moe_router(%slice_31, %arg39_1, %arg40_1, 4, 2, 4, 2.5, True) (i32[1, 4], f32[1, 4])
+%getitem_30 = getitem(%moe_router_default, 0)                i32[1, 4]
+%getitem_31 = getitem(%moe_router_default, 1)                f32[1, 4]
+%slice_tensor = aten.slice.Tensor(%arg41_1, 1, 0, 24)        f32[16, 24, 96]
+%slice_tensor_1 = aten.slice.Tensor(%arg41_1, 1, 24, 48)     f32[16, 24, 96]
+%moe_experts_default = lingc.moe_experts(%slice_31, %getitem_30, %getitem_31, %slice_tensor, %slice_tensor_1, %arg42_1, %arg43_1, %arg44_1, %arg45_1, 0.0, 0.0) f32[1, 96]
+%add_49 = aten.add.Tensor(%add_40, %moe_experts_default)     f32[1, 96]
+%moe_router_default_1 = lingc.moe_router(%slice_50, %arg57_1, %arg58_1, 4, 2, 4, 2.5, True) (i32[1, 4], f32[1, 4])
+%getitem_32 = getitem(%moe_router_default_1, 0)              i32[1, 4]
+%getitem_33 = getitem(%moe_router_default_1, 1)              f32[1, 4]
+%slice_tensor_2 = aten.slice.Tensor(%arg59_1, 1, 0, 24)      f32[16, 24, 96]
+%slice_tensor_3 = aten.slice.Tensor(%arg59_1, 1, 24, 48)     f32[16, 24, 96]
+%moe_experts_default_1 = lingc.moe_experts(%slice_50, %getitem_32, %getitem_33, %slice_tensor_2, %slice_tensor_3, %arg60_1, %arg61_1, %arg62_1, %arg63_1, 0.0, 0.0) f32[1, 96]
+%add_64 = aten.add.Tensor(%add_55, %moe_experts_default_1)   f32[1, 96]
+%moe_router_default_2 = lingc.moe_router(%slice_72, %arg81_1, %arg82_1, 4, 2, 4, 2.5, True) (i32[1, 4], f32[1, 4])
+%getitem_34 = getitem(%moe_router_default_2, 0)              i32[1, 4]
+%getitem_35 = getitem(%moe_router_default_2, 1)              f32[1, 4]
+%slice_tensor_4 = aten.slice.Tensor(%arg83_1, 1, 0, 24)      f32[16, 24, 96]
+%slice_tensor_5 = aten.slice.Tensor(%arg83_1, 1, 24, 48)     f32[16, 24, 96]
+%moe_experts_default_2 = lingc.moe_experts(%slice_72, %getitem_34, %getitem_35, %slice_tensor_4, %slice_tensor_5, %arg84_1, %arg85_1, %arg86_1, %arg87_1, 0.0, 0.0) f32[1, 96]
+%add_92 = aten.add.Tensor(%add_83, %moe_experts_default_2)   f32[1, 96]
+%moe_router_default_3 = lingc.moe_router(%slice_94, %arg105_1, %arg106_1, 4, 2, 4, 2.5, True) (i32[1, 4], f32[1, 4])
+%getitem_36 = getitem(%moe_router_default_3, 0)              i32[1, 4]
+%getitem_37 = getitem(%moe_router_default_3, 1)              f32[1, 4]
+%slice_tensor_6 = aten.slice.Tensor(%arg107_1, 1, 0, 24)     f32[16, 24, 96]
+%slice_tensor_7 = aten.slice.Tensor(%arg107_1, 1, 24, 48)    f32[16, 24, 96]
+%moe_experts_default_3 = lingc.moe_experts(%slice_94, %getitem_36, %getitem_37, %slice_tensor_6, %slice_tensor_7, %arg108_1, %arg109_1, %arg110_1, %arg111_1, 0.6, 0.0) f32[1, 96]
+%add_120 = aten.add.Tensor(%add_111, %moe_experts_default_3) f32[1, 96]
+%moe_router_default_4 = lingc.moe_router(%slice_113, %arg122_1, %arg123_1, 4, 2, 4, 2.5, True) (i32[1, 4], f32[1, 4])
+%getitem_38 = getitem(%moe_router_default_4, 0)              i32[1, 4]
+%getitem_39 = getitem(%moe_router_default_4, 1)              f32[1, 4]
+%slice_tensor_8 = aten.slice.Tensor(%arg124_1, 1, 0, 24)     f32[16, 24, 96]
+%slice_tensor_9 = aten.slice.Tensor(%arg124_1, 1, 24, 48)    f32[16, 24, 96]
+%moe_experts_default_4 = lingc.moe_experts(%slice_113, %getitem_38, %getitem_39, %slice_tensor_8, %slice_tensor_9, %arg125_1, %arg126_1, %arg127_1, %arg128_1, 0.6, 0.8) f32[1, 96]
+%add_135 = aten.add.Tensor(%add_126, %moe_experts_default_4) f32[1, 96]
""")
    assert_expected_inline("".join(f"{op} {n}\n" for op, n in sorted(removed.items())), """\
aten.add.Tensor 40
aten.bitwise_not 5
aten.bmm 10
aten.clamp_max 6
aten.clamp_min 3
aten.clone 5
aten.div.Tensor 15
aten.exp 10
aten.expand 5
aten.full 5
aten.gather 5
aten.index.Tensor 10
aten.mm 20
aten.mul.Tensor 35
aten.neg 10
aten.permute 20
aten.scalar_tensor 5
aten.scatter.value 5
aten.select.int 20
aten.sigmoid 5
aten.slice.Tensor 30
aten.squeeze.dim 10
aten.sum.dim_IntList 10
aten.topk 15
aten.unsqueeze 20
aten.view 25
aten.where.self 5
getitem 15
""")
