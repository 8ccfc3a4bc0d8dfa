"""MoE router and moe_align: the Triton launchers against references written here from the
formulas, tie order, batch invariance, poisoned outputs, broken variants, the ops; on the GPU the
Ling-3 shapes (E = 512, H = 2560) and a router -> align chain under CUDA-graph capture.

On the CPU the kernels run under TRITON_INTERPRET=1 (set in conftest.py) on small shapes: E in
{16, 64} with n_group 4 or 8, H in {40, 96}, T in {1, 2, 6, 8}, top_k 4.

References here are deliberately independent of runtime/kernels/*/naive.py: the router one is a
per-token Python loop over the formulas in float32 (numpy scalars) with "lowest index wins"
written out as a sort key; the align one is a Python sort of (expert, pair) tuples.

Tolerances: router weights absolute 2e-6 (weights <= routed_scaling = 2.5; fp32 sums in a
different order and an interpreter/torch sigmoid that may differ by an ulp). Ids are compared
exactly: random inputs keep their biased scores far apart relative to those differences, and
the tie tests use integer-valued logits, which are exact in every summation order.
"""
import math
import textwrap
import types

import numpy as np
import pytest
import torch
import triton
from torch._subclasses.fake_tensor import FakeTensorMode

from helpers import run_sm90_compile_check
from lingc.models.moe import grouped_topk
from lingc.runtime.kernels.moe_align import align_sizes, moe_align, moe_align_reference
from lingc.runtime.kernels.moe_align import kernel as align_kernel
from lingc.runtime.kernels.moe_align.naive import no_expert
from lingc.runtime.kernels.moe_align.kernel import SINGLE_LAUNCH_MAX_PAIRS, moe_align_triton
from lingc.runtime.kernels.moe_router import (grouped_topk_reference, moe_router, moe_router_reference,
                                              rmsnorm_router_reference, router_logits)
from lingc.runtime.kernels.moe_router.kernel import (moe_router_triton, moe_select_triton, redux_pack, router_block_e,
                                                     rmsnorm_router_triton, router_row_groups)

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DTYPES = [torch.float32, torch.bfloat16]
WEIGHT_ATOL = 2e-6
# (E, n_group): groups of 4 and of 8 experts.
ROUTER_SHAPES = [(16, 4), (64, 8)]
TOPK_GROUP, TOP_K, SCALING = 2, 4, 2.5


# ----------------------------------------------------------------------------------------------
# Router: references and helpers.


def py_router(logits, bias, n_group, topk_group, top_k, scaling, renormalize, zero_fill=False):
    """Per-token Python reference from the formulas (float32 throughout); ties: lowest index.

    logits fp32 [T, E] (computed by the caller), bias fp32 [E]. Returns (ids [T][k], weights).
    ``zero_fill``: every expert is a candidate, those of the dropped groups with the key 0.0
    (DeepSeek-V3's Hugging Face router)."""
    f32 = np.float32
    lg = logits.detach().cpu().float().numpy()
    b = bias.detach().cpu().float().numpy()
    e = lg.shape[1]
    gs = e // n_group
    all_ids, all_w = [], []
    for row in lg:
        s = (f32(1) / (f32(1) + np.exp(-row.astype(f32)))).astype(f32)
        c = (s + b).astype(f32)
        gscore = []
        for g in range(n_group):
            members = sorted(range(g * gs, (g + 1) * gs), key=lambda i: (-c[i], i))
            gscore.append(f32(c[members[0]] + c[members[1]]))
        kept = sorted(range(n_group), key=lambda g: (-gscore[g], g))[:topk_group]
        cands = [i for g in kept for i in range(g * gs, (g + 1) * gs)]
        if zero_fill:
            key = {i: (float(c[i]) if i in cands else 0.0) for i in range(e)}
            ids = sorted(range(e), key=lambda i: (-key[i], i))[:top_k]
        else:
            ids = sorted(cands, key=lambda i: (-c[i], i))[:top_k]
        w = [f32(s[i]) for i in ids]
        if renormalize:
            tot = f32(sum(w, f32(0)))
            w = [f32(v / tot) for v in w]
        all_ids.append(ids)
        all_w.append([f32(v * f32(scaling)) for v in w])
    return all_ids, all_w


def make_router_inputs(t, e, h, dtype, seed, device=DEVICE):
    """x ~ N(0, 1) [t, h], gate_w ~ N(0, 1/h) [e, h] (logits ~ N(0, 1)), bias ~ N(0, 0.1^2) fp32."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(t, h, generator=gen).to(device=device, dtype=dtype)
    w = (torch.randn(e, h, generator=gen) / h**0.5).to(device=device, dtype=dtype)
    bias = (0.1 * torch.randn(e, generator=gen)).to(device)
    return x, w, bias


def make_tied_inputs(t, e, h, dtype, seed, device=DEVICE):
    """Integer-valued logits (x in {-1, 0, 1}, gate_w in {-1, 0, 1}/4, exact in bf16 and in any
    fp32 summation order) drawn from few values, and bias in {0, 1/4, 1/2}: many exact ties."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randint(-1, 2, (t, h), generator=gen).float()
    base = torch.randint(-1, 2, (3, h), generator=gen).float() / 4
    w = base[torch.randint(0, 3, (e,), generator=gen)]          # only 3 distinct rows
    bias = torch.randint(0, 3, (e,), generator=gen).float() / 4
    return x.to(device=device, dtype=dtype), w.to(device=device, dtype=dtype), bias.to(device)


def run_router(x, w, bias, n_group, topk_group=TOPK_GROUP, top_k=TOP_K, scaling=SCALING, renormalize=True, **kw):
    """The Triton launcher into poisoned outputs (ids -1, weights NaN): unwritten elements fail."""
    t = x.shape[0]
    ids = torch.full((t, top_k), -1, dtype=torch.int32, device=x.device)
    wts = torch.full((t, top_k), float("nan"), dtype=torch.float32, device=x.device)
    moe_router_triton(x, w, bias, n_group, topk_group, top_k, scaling, renormalize,
                      ids_out=ids, weights_out=wts, **kw)
    return ids, wts


def assert_router_matches(ids, wts, ref_ids, ref_w):
    """ids exactly (as sets and in order), weights within WEIGHT_ATOL, nothing left poisoned."""
    ids_l = ids.cpu().tolist()
    assert all(-1 not in row for row in ids_l), f"unwritten ids: {ids_l}"
    assert torch.isfinite(wts).all(), f"non-finite weights: {wts}"
    for r, (a, b) in enumerate(zip(ids_l, ref_ids)):
        assert sorted(a) == sorted(b), f"row {r}: expert set {sorted(a)} != reference {sorted(b)}"
        assert a == b, f"row {r}: order {a} != reference {b}"
    torch.testing.assert_close(wts.cpu(), torch.tensor(ref_w, dtype=torch.float32), atol=WEIGHT_ATOL, rtol=0)


def exact_logits(x, w):
    """fp32 logits row by row (the products of bf16 values are exact in fp32)."""
    return router_logits(x.cpu(), w.cpu())


# ----------------------------------------------------------------------------------------------
# Router: kernel tests.


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("t", [1, 2, 6, 8])
@pytest.mark.parametrize("h", [40, 96])
@pytest.mark.parametrize("e, n_group", ROUTER_SHAPES)
def test_router_kernel_matches_python_reference(e, n_group, h, t, dtype):
    x, w, bias = make_router_inputs(t, e, h, dtype, seed=1000 * e + 10 * h + t)
    ids, wts = run_router(x, w, bias, n_group)
    ref_ids, ref_w = py_router(exact_logits(x, w), bias, n_group, TOPK_GROUP, TOP_K, SCALING, True)
    assert_router_matches(ids, wts, ref_ids, ref_w)
    # The module reference (the op's CPU path) agrees with the formulas too.
    n_ids, n_w = moe_router_reference(x.cpu(), w.cpu(), bias.cpu(), n_group, TOPK_GROUP, TOP_K, SCALING, True)
    assert_router_matches(n_ids, n_w, ref_ids, ref_w)


@pytest.mark.parametrize("renormalize, scaling, topk_group, top_k", [
    (False, 1.0, 2, 4), (True, 1.0, 1, 3), (False, 2.5, 4, 5), (True, 2.5, 3, 7), (True, 1.0, 5, 8),
])
def test_router_kernel_options(renormalize, scaling, topk_group, top_k):
    e, n_group, h, t = 64, 8, 96, 6
    x, w, bias = make_router_inputs(t, e, h, torch.float32, seed=11 + top_k)
    ids, wts = run_router(x, w, bias, n_group, topk_group, top_k, scaling, renormalize)
    ref = py_router(exact_logits(x, w), bias, n_group, topk_group, top_k, scaling, renormalize)
    assert_router_matches(ids, wts, *ref)
    if renormalize:
        torch.testing.assert_close(wts.sum(1).cpu(), torch.full((t,), scaling), atol=1e-5, rtol=0)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("e, n_group", ROUTER_SHAPES)
@pytest.mark.parametrize("seed", range(4))
def test_router_ties_lowest_index_wins(seed, e, n_group, dtype):
    t, h = 8, 40
    x, w, bias = make_tied_inputs(t, e, h, dtype, seed=100 + seed)
    logits = exact_logits(x, w)
    c = torch.sigmoid(logits) + bias.cpu()
    # At most 3 logit values x 3 biases per row: tie-heavy by construction.
    assert all(len(set(row)) <= 9 < e for row in c.tolist())
    ids, wts = run_router(x, w, bias, n_group)
    ref = py_router(logits, bias, n_group, TOPK_GROUP, TOP_K, SCALING, True)
    assert_router_matches(ids, wts, *ref)
    assert_router_matches(*moe_router_reference(x.cpu(), w.cpu(), bias.cpu(), n_group, TOPK_GROUP, TOP_K,
                                                SCALING, True), *ref)


def py_softmax_router(logits, top_k, scaling, renormalize):
    """Per-token Python reference of a softmax router from the formulas (float64 probabilities):
    the top_k by logit (ties: lowest index), their softmax probabilities (renormalised over the
    picks if asked), times scaling."""
    all_ids, all_w = [], []
    for row in logits.detach().cpu().double().tolist():
        ids = sorted(range(len(row)), key=lambda i: (-row[i], i))[:top_k]
        m = max(row)
        z = sum(math.exp(v - m) for v in row)
        w = [math.exp(row[i] - m) / z for i in ids]
        if renormalize:
            tot = sum(w)
            w = [v / tot for v in w]
        all_ids.append(ids)
        all_w.append([v * scaling for v in w])
    return all_ids, all_w


@pytest.mark.parametrize("renormalize", [False, True])
@pytest.mark.parametrize("t", [1, 2, 6])
@pytest.mark.parametrize("e, top_k", [(16, 4), (64, 8), (24, 3)])
def test_softmax_router_kernel_matches_python_reference(e, top_k, t, renormalize):
    """softmax=True (Qwen's MoE routers): the top_k by logit, softmax weights, on fresh inputs;
    the op's CPU reference agrees; poisoned outputs all written."""
    x, w, _ = make_router_inputs(t, e, 40, torch.float32, seed=7 * e + t)
    zeros = torch.zeros(e, device=x.device)
    ids, wts = run_router(x, w, zeros, 1, 1, top_k, 1.5, renormalize, softmax=True)
    ref = py_softmax_router(exact_logits(x, w), top_k, 1.5, renormalize)
    assert_router_matches(ids, wts, *ref)
    assert_router_matches(*moe_router_reference(x.cpu(), w.cpu(), zeros.cpu(), 1, 1, top_k, 1.5, renormalize,
                                                softmax=True), *ref)


@pytest.mark.parametrize("seed", range(3))
def test_softmax_router_ties_lowest_index_wins(seed):
    """Few distinct logits (exact in any summation order): equal logits rank by index."""
    t, e, h, top_k = 8, 16, 40, 5
    x, w, _ = make_tied_inputs(t, e, h, torch.float32, seed=200 + seed)
    zeros = torch.zeros(e, device=x.device)
    ids, wts = run_router(x, w, zeros, 1, 1, top_k, 1.0, True, softmax=True)
    assert_router_matches(ids, wts, *py_softmax_router(exact_logits(x, w), top_k, 1.0, True))


def test_softmax_router_takes_one_group():
    x, w, _ = make_router_inputs(2, 16, 40, torch.float32, seed=3)
    with pytest.raises(ValueError, match="a softmax router has one group: n_group = topk_group = 1"):
        moe_router(x, w, torch.zeros(16, device=x.device), 4, 2, 3, 1.0, True, softmax=True)


def test_router_all_tied_picks_lowest_groups_and_experts():
    # Every score equal: groups 0 and 1 are kept, experts 0..3 are picked, in that order, with
    # equal weights.
    e, n_group, h = 16, 4, 40
    x = torch.ones(2, h, device=DEVICE)
    w = torch.full((e, h), 0.25, device=DEVICE)
    ids, wts = run_router(x, w, torch.zeros(e, device=DEVICE), n_group)
    assert ids.tolist() == [[0, 1, 2, 3]] * 2
    torch.testing.assert_close(wts.cpu(), torch.full((2, 4), SCALING / 4))
    # Equal biased scores, higher ids first by bias: the tie among {5, 6} and {8, 9} goes low.
    bias = torch.zeros(e, device=DEVICE)
    bias[[5, 6, 8, 9, 12]] = torch.tensor([0.5, 0.5, 0.5, 0.5, 0.25], device=DEVICE)
    ids, _ = run_router(x, w, bias, n_group)
    assert ids.tolist() == [[5, 6, 8, 9]] * 2  # groups 1 and 2 (score 1.0 + 0.5 ...) kept


@pytest.mark.parametrize("norm", [False, True], ids=["router", "rmsnorm_router"])
@pytest.mark.parametrize("t", [1, 6])
def test_router_float16(t, norm):
    """float16 x and gate (the sweep's DTYPES are fp32 and bf16): the same ids as the formulas on
    exact fp32 logits (fp16 products are exact in fp32), weights within WEIGHT_ATOL; with the
    input norm inside, the op's CPU reference."""
    x, w, bias = make_router_inputs(t, 64, 96, torch.float16, seed=31 + t)
    if not norm:
        ids, wts = run_router(x, w, bias, 8)
        ref_ids, ref_w = py_router(exact_logits(x, w), bias, 8, TOPK_GROUP, TOP_K, SCALING, True)
        assert_router_matches(ids, wts, ref_ids, ref_w)
        return
    nw, res = torch.randn(96).half().to(DEVICE), torch.randn(t, 96).half().to(DEVICE)
    got = rmsnorm_router_triton(x, nw, res, 1e-6, w, bias, 8, TOPK_GROUP, TOP_K, SCALING, True)
    want = rmsnorm_router_reference(x.cpu(), nw.cpu(), res.cpu(), 1e-6, w.cpu(), bias.cpu(), 8, TOPK_GROUP,
                                    TOP_K, SCALING, True)
    assert torch.equal(got[1].cpu(), want[1])                               # h = residual + x, in fp16
    assert torch.equal(got[2].cpu(), want[2].to(got[2].dtype))              # the ids
    torch.testing.assert_close(got[0].cpu().float(), want[0].float(), rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("bias_dtype", [torch.bfloat16, torch.float16])
def test_router_reads_a_half_precision_bias_as_fp32(bias_dtype):
    """A bias cast to the model's dtype (nn.Module.to(torch.bfloat16) casts every buffer) selects
    as its exact fp32 upcast does."""
    x, w, bias = make_router_inputs(6, 64, 96, torch.bfloat16, seed=23)
    half = bias.to(bias_dtype)
    ids, wts = run_router(x, w, half, 8)
    ref_ids, ref_w = run_router(x, w, half.float(), 8)
    assert torch.equal(ids, ref_ids) and torch.equal(wts, ref_w)


@pytest.mark.parametrize("dtype", DTYPES)
def test_router_bias_selects_but_does_not_weight(dtype):
    e, n_group, h, t = 64, 8, 96, 6
    x, w, _ = make_router_inputs(t, e, h, dtype, seed=21)
    s = torch.sigmoid(exact_logits(x, w))
    boosted = [3, 5, 42, 44]  # two in group 0, two in group 5 (topk_group = 2)
    bias = torch.zeros(e, device=DEVICE)
    bias[boosted] = 10.0
    ids, wts = run_router(x, w, bias, n_group)
    for r in range(t):
        assert sorted(ids[r].tolist()) == boosted
        picked = s[r, ids[r].long().cpu()]
        # Weights from the unbiased scores: s / sum(s) * scaling, not (s + 10) / sum(s + 10).
        torch.testing.assert_close(wts[r].cpu(), picked / picked.sum() * SCALING, atol=WEIGHT_ATOL, rtol=0)
    # Without the bias the selection is a different one.
    ids0, _ = run_router(x, w, torch.zeros(e, device=DEVICE), n_group)
    assert any(sorted(ids0[r].tolist()) != boosted for r in range(t))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("e, n_group", ROUTER_SHAPES)
def test_router_batch_invariant(e, n_group, dtype):
    x, w, bias = make_router_inputs(8, e, 96, dtype, seed=31)
    ids8, w8 = run_router(x, w, bias, n_group)
    for t in (1, 6):
        ids_t, w_t = run_router(x[:t], w, bias, n_group)
        assert torch.equal(ids_t, ids8[:t]) and torch.equal(w_t, w8[:t])
    for r in (3, 7):
        ids1, w1 = run_router(x[r : r + 1], w, bias, n_group)
        assert torch.equal(ids1, ids8[r : r + 1]) and torch.equal(w1, w8[r : r + 1])


# Not 2: a block narrower than the 4 warps changes the layout of a row's reduction on the GPU
# (router_block_e's docstring), which is why router_block_e never goes below 4.
@pytest.mark.parametrize("block_e", [4, 8, 16])
def test_router_block_e_does_not_change_bits(block_e):
    assert router_block_e(512) == 4 and router_block_e(64) == 4  # Ling-3: 128 CTAs
    assert router_block_e(512, 6) == 8 and router_block_e(512, 1) == 4   # x 2 row groups: 128 again
    x, w, bias = make_router_inputs(6, 64, 96, torch.float32, seed=41)
    base = run_router(x, w, bias, 8)
    other = run_router(x, w, bias, 8, block_e=block_e)
    assert torch.equal(base[0], other[0]) and torch.equal(base[1], other[1])


def test_router_row_groups_split_rows_evenly():
    assert [router_row_groups(t, 2) for t in (1, 2, 5, 6, 8)] == [(1, 1), (2, 1), (2, 3), (2, 3), (2, 4)]
    assert router_row_groups(6, 4) == (3, 2) and router_row_groups(6, 6) == (6, 1)
    assert router_row_groups(6, 1) == (1, 6) and router_row_groups(3, 8) == (3, 1)
    with pytest.raises(ValueError, match="row groups must be >= 1, got 0"):
        router_row_groups(6, 0)


@pytest.mark.parametrize("groups", [1, 2, 3, 4, 8])
def test_router_row_groups_do_not_change_bits(groups):
    """Each row's logits are one program's, in the same arithmetic whichever program and however
    many rows it has: the logits (fresh random inputs, a NaN-poisoned workspace) and the picks
    are the same bits for every grouping, and every logit is written."""
    t = 7
    x, w, bias = make_router_inputs(t, 64, 96, torch.bfloat16, seed=43)
    outs = []
    for g in (1, groups):
        logits = torch.full((t, 64), float("nan"), device=DEVICE)
        ids, wts = run_router(x, w, bias, 8, logits_out=logits, row_groups=g)
        assert not logits.isnan().any(), f"row groups {g}: logits left unwritten"
        outs.append((logits, ids, wts))
    assert all(torch.equal(a, b) for a, b in zip(*outs))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("e, n_group", ROUTER_SHAPES)
def test_router_matches_model_grouped_topk(e, n_group, dtype):
    x, w, bias = make_router_inputs(8, e, 96, dtype, seed=51 + e)
    cfg = types.SimpleNamespace(n_group=n_group, topk_group=TOPK_GROUP, num_experts_per_tok=TOP_K,
                                norm_topk_prob=True, routed_scaling_factor=SCALING)
    ref_ids, ref_w = grouped_topk(torch.sigmoid(exact_logits(x, w)), bias.cpu(), cfg)
    ids, wts = run_router(x, w, bias, n_group)
    assert torch.equal(ids.long().cpu(), ref_ids)
    torch.testing.assert_close(wts.cpu(), ref_w, atol=WEIGHT_ATOL, rtol=0)


def test_router_logits_workspace():
    x, w, bias = make_router_inputs(6, 64, 40, torch.float32, seed=61)
    logits = torch.full((6, 64), float("nan"), device=DEVICE)
    run_router(x, w, bias, 8, logits_out=logits)
    torch.testing.assert_close(logits.cpu(), exact_logits(x, w), atol=1e-5, rtol=1e-5)


# ----------------------------------------------------------------------------------------------
# moe_select: the selection kernel alone on given logits (prompt chunks).


def run_select(logits, bias, n_group, topk_group=TOPK_GROUP, top_k=TOP_K, scaling=SCALING, renormalize=True, **kw):
    """moe_select_triton into poisoned outputs (ids -1, weights NaN)."""
    t = logits.shape[0]
    ids = torch.full((t, top_k), -1, dtype=torch.int32, device=logits.device)
    wts = torch.full((t, top_k), float("nan"), dtype=torch.float32, device=logits.device)
    out = moe_select_triton(logits, bias, n_group, topk_group, top_k, scaling, renormalize,
                            ids_out=ids, weights_out=wts, **kw)
    assert out[0] is ids and out[1] is wts
    return ids, wts


@pytest.mark.parametrize("e, n_group, topk_group, top_k", [(16, 4, 2, 4), (64, 8, 2, 4), (64, 8, 4, 8)])
@pytest.mark.parametrize("t", [1, 5, 33])
def test_select_kernel_matches_python_reference(e, n_group, topk_group, top_k, t):
    gen = torch.Generator().manual_seed(7 * e + t)
    logits = (2 * torch.randn(t, e, generator=gen)).to(DEVICE)
    bias = (0.1 * torch.randn(e, generator=gen)).to(DEVICE)
    ids, wts = run_select(logits, bias, n_group, topk_group, top_k)
    assert_router_matches(ids, wts, *py_router(logits, bias, n_group, topk_group, top_k, SCALING, True))


def test_select_is_the_routers_selection_on_its_logits():
    # The router's two launches = its logits kernel + moe_select on those logits, bit for bit;
    # and a strided logits view (a row stride other than E) selects the same.
    x, w, bias = make_router_inputs(6, 64, 96, torch.bfloat16, seed=81)
    logits = torch.empty(6, 64, device=DEVICE)
    ids, wts = run_router(x, w, bias, 8, logits_out=logits)
    s_ids, s_wts = run_select(logits, bias, 8)
    assert torch.equal(s_ids, ids) and torch.equal(s_wts, wts)
    wide = torch.full((6, 80), float("nan"), device=DEVICE)
    wide[:, :64] = logits
    v_ids, v_wts = run_select(wide[:, :64], bias, 8)
    assert torch.equal(v_ids, ids) and torch.equal(v_wts, wts)


def test_select_ties_lowest_index_wins():
    x, w, bias = make_tied_inputs(8, 64, 40, torch.float32, seed=83)
    logits = exact_logits(x, w).to(DEVICE)
    assert_router_matches(*run_select(logits, bias, 8), *py_router(logits, bias, 8, TOPK_GROUP, TOP_K, SCALING, True))


def test_select_op_cpu_reference_fake_and_opcheck():
    gen = torch.Generator().manual_seed(85)
    logits, bias = torch.randn(5, 64, generator=gen), 0.1 * torch.randn(64, generator=gen)
    ids, wts = torch.ops.lingc.moe_select(logits, bias, 8, TOPK_GROUP, TOP_K, SCALING, True)
    assert ids.dtype == torch.int32 and wts.dtype == torch.float32
    assert_router_matches(ids, wts, *py_router(logits, bias, 8, TOPK_GROUP, TOP_K, SCALING, True))
    with FakeTensorMode() as mode:
        f_ids, f_w = torch.ops.lingc.moe_select(mode.from_tensor(logits), mode.from_tensor(bias), 8, TOPK_GROUP,
                                                TOP_K, SCALING, True)
    assert f_ids.shape == (5, TOP_K) and f_ids.dtype == torch.int32 and f_w.dtype == torch.float32
    torch.library.opcheck(torch.ops.lingc.moe_select.default, (logits, bias, 8, TOPK_GROUP, TOP_K, SCALING, True))


@pytest.mark.parametrize("case, match", [
    (lambda lg, b: (lg.double(), b), "logits.dtype must be float32"),
    (lambda lg, b: (lg[0], b), r"logits must be \[T, E\]"),
    (lambda lg, b: (lg[:, :60], b[:60]), "n_group=8 must be >= 1 and divide the expert count E=60"),
    (lambda lg, b: (lg.t().contiguous().t(), b), "unit stride along E"),
    (lambda lg, b: (lg, b[:-1]), r"expert_bias must have shape \(64,\)"),
    (lambda lg, b: (lg, b.double()), "expert_bias.dtype must be float32"),
])
def test_select_bad_arguments_are_named(case, match):
    logits, bias = torch.randn(5, 64), torch.zeros(64)
    with pytest.raises(ValueError, match=f"moe_select: .*({match})"):
        torch.ops.lingc.moe_select(*case(logits, bias), 8, TOPK_GROUP, TOP_K, SCALING, True)


# Zero fill (DeepSeek-V3's Hugging Face router): shifted biases put kept experts' keys at or below
# the fill, where dropped experts enter the picks.
ZERO_FILL_SHIFTS = [0.0, -0.55, -3.0]


@pytest.mark.parametrize("shift", ZERO_FILL_SHIFTS)
@pytest.mark.parametrize("t", [1, 2, 6, 16])
@pytest.mark.parametrize("e, n_group, topk_group, top_k", [(16, 4, 2, 4), (64, 8, 4, 8)])
def test_zero_fill_router_matches_python_reference(e, n_group, topk_group, top_k, t, shift):
    x, w, bias = make_router_inputs(t, e, 40, torch.float32, seed=11 * e + t)
    bias = 3 * bias + shift
    ids, wts = run_router(x, w, bias, n_group, topk_group, top_k, zero_fill=True)
    ref = py_router(exact_logits(x, w), bias, n_group, topk_group, top_k, SCALING, True, zero_fill=True)
    assert_router_matches(ids, wts, *ref)
    assert_router_matches(*moe_router_reference(x.cpu(), w.cpu(), bias.cpu(), n_group, topk_group, top_k,
                                                SCALING, True, zero_fill=True), *ref)
    plain = py_router(exact_logits(x, w), bias, n_group, topk_group, top_k, SCALING, True)
    if shift == -3.0:        # every biased score negative: the fill's zeros win, the rules differ
        assert all(sorted(a) != sorted(b) for a, b in zip(ref[0], plain[0]))
    elif shift == 0.0:       # every kept key above 0: the same picks as the -inf mask
        assert ref[0] == plain[0]


@pytest.mark.parametrize("seed", range(3))
def test_zero_fill_router_ties_lowest_index_wins(seed):
    """Integer logits and biases shifted to put many keys at exactly 0.0 and below: the picks
    among the fill's zeros and the kept experts' equal keys go to the lowest index."""
    t, e, h = 8, 64, 40
    x, w, bias = make_tied_inputs(t, e, h, torch.float32, seed=300 + seed)
    # Row 0's logits are all 0 (s = 0.5 exactly on every device; another logit's sigmoid may
    # differ by an ulp between the GPU and torch, which would move a key off 0.0): with these
    # biases its keys are -0.5, -0.25 and 0.0, half of them exactly 0.0.
    x[0] = 0
    logits = exact_logits(x, w)
    bias = bias - 1.0                                            # c in (-1, 0.5): some at or below 0
    bias[: e // 2] = -0.5
    ids, wts = run_router(x, w, bias, 8, zero_fill=True)
    ref = py_router(logits, bias, 8, TOPK_GROUP, TOP_K, SCALING, True, zero_fill=True)
    assert_router_matches(ids, wts, *ref)
    assert_router_matches(*run_select(logits.to(DEVICE), bias, 8, zero_fill=True), *ref)


@pytest.mark.parametrize("t", [1, 6])
def test_zero_fill_rmsnorm_router(t):
    """The norm folded into a zero-fill router: the fused kernel's ids and weights are the
    reference's on its logits, and the unfused pair's y and h."""
    x, w, bias = make_router_inputs(t, 64, 96, torch.float32, seed=90 + t)
    bias = bias - 0.8
    gen = torch.Generator().manual_seed(91)
    res = torch.randn(t, 96, generator=gen).to(DEVICE)
    nw = (1 + 0.1 * torch.randn(96, generator=gen)).to(DEVICE)
    y, h, ids, wts = rmsnorm_router_triton(x, nw, res, 1e-6, w, bias, 8, 4, 8, SCALING, True, zero_fill=True)
    ry, rh, r_ids, r_w = rmsnorm_router_reference(x.cpu(), nw.cpu(), res.cpu(), 1e-6, w.cpu(), bias.cpu(), 8, 4, 8,
                                                  SCALING, True, zero_fill=True)
    assert torch.equal(ids.cpu(), r_ids)
    torch.testing.assert_close(wts.cpu(), r_w, atol=WEIGHT_ATOL, rtol=0)
    torch.testing.assert_close(y.cpu(), ry, atol=1e-6, rtol=1e-6)
    assert torch.equal(h.cpu(), rh)
    op = torch.ops.lingc.rmsnorm_router(x.cpu(), nw.cpu(), res.cpu(), 1e-6, w.cpu(), bias.cpu(), 8, 4, 8, SCALING,
                                        True, zero_fill=True)
    assert torch.equal(op[2], r_ids)
    plain = rmsnorm_router_reference(x.cpu(), nw.cpu(), res.cpu(), 1e-6, w.cpu(), bias.cpu(), 8, 4, 8, SCALING, True)
    assert not torch.equal(plain[2], r_ids)        # the shift makes the rules differ somewhere


def test_zero_fill_op_cpu_fake_opcheck_and_refusal():
    x, w, bias = make_router_inputs(3, 16, 40, torch.float32, seed=92, device="cpu")
    bias = bias - 3.0
    ids, wts = torch.ops.lingc.moe_router(x, w, bias, 4, 2, 4, 2.5, True, zero_fill=True)
    ref = moe_router_reference(x, w, bias, 4, 2, 4, 2.5, True, zero_fill=True)
    assert torch.equal(ids, ref[0]) and torch.equal(wts, ref[1])
    assert not torch.equal(ids, torch.ops.lingc.moe_router(x, w, bias, 4, 2, 4, 2.5, True)[0])
    torch.library.opcheck(torch.ops.lingc.moe_router, (x, w, bias, 4, 2, 4, 2.5, True), {"zero_fill": True})
    lg = exact_logits(x, w)
    torch.library.opcheck(torch.ops.lingc.moe_select.default, (lg, bias, 4, 2, 4, 2.5, True), {"zero_fill": True})
    assert torch.equal(torch.ops.lingc.moe_select(lg, bias, 4, 2, 4, 2.5, True, zero_fill=True)[0], ids)
    with pytest.raises(ValueError, match="moe_router: zero_fill is a fill of the dropped groups .* pass zero_fill=False"):
        torch.ops.lingc.moe_router(x, w, None, 1, 1, 4, 2.5, True, softmax=True, zero_fill=True)


# A broken kernel or reference must fail the comparisons above.


def test_router_broken_variants_are_caught():
    e, n_group, h, t = 64, 8, 96, 8
    x, w, bias = make_router_inputs(t, e, h, torch.float32, seed=71)
    ref = py_router(exact_logits(x, w), bias, n_group, TOPK_GROUP, TOP_K, SCALING, True)
    # No group restriction (one group of 64): some row picks an expert from a dropped group.
    with pytest.raises(AssertionError, match="expert set|order"):
        assert_router_matches(*run_router(x, w, bias, 1, 1, TOP_K), *ref)
    # Unnormalised weights.
    with pytest.raises(AssertionError):
        assert_router_matches(*run_router(x, w, bias, n_group, renormalize=False), *ref)
    # Rows never processed (only the first 6 of 8 launched into the 8-row buffers): poisoned.
    ids = torch.full((t, TOP_K), -1, dtype=torch.int32, device=DEVICE)
    wts = torch.full((t, TOP_K), float("nan"), device=DEVICE)
    moe_router_triton(x[:6], w, bias, n_group, TOPK_GROUP, TOP_K, SCALING, True, ids_out=ids[:6], weights_out=wts[:6])
    with pytest.raises(AssertionError, match="unwritten ids"):
        assert_router_matches(ids, wts, *ref)
    # A "highest index wins" tie rule fails the tie reference.
    x, w, bias = make_tied_inputs(t, e, 40, torch.float32, seed=100)
    logits = exact_logits(x, w)
    good = py_router(logits, bias, n_group, TOPK_GROUP, TOP_K, SCALING, True)
    flipped = py_router(logits.flip(1), bias.flip(0), n_group, TOPK_GROUP, TOP_K, SCALING, True)
    flipped_ids = [[e - 1 - i for i in row] for row in flipped[0]]
    with pytest.raises(AssertionError, match="expert set|order"):
        assert_router_matches(*run_router(x, w, bias, n_group), flipped_ids, flipped[1])
    assert_router_matches(*run_router(x, w, bias, n_group), *good)


def near_tie_inputs(t, e, reverse_ids):
    """x, identity gate and bias such that the biased scores of experts 8..23 are 0.8 plus i ulps
    (i = id - 8; with ``reverse_ids`` the higher id scores higher): 16 scores whose fp32 order
    keys share all but their last bits, so the int32 fast keys see them as ties. Every other
    expert scores 0.1. The logits are exactly 0 (the identity gate), the sigmoid exactly 0.5,
    and 0.5 + (c - 0.5) == c (Sterbenz), so the kernel's scores are these."""
    x = torch.zeros(t, e, device=DEVICE)
    w = torch.eye(e, device=DEVICE)
    c = torch.full((e,), 0.1)
    ulps = torch.arange(16, dtype=torch.int32)
    near = (torch.tensor(0.8).view(torch.int32) + (ulps if reverse_ids else ulps.flip(0))).view(torch.float32)
    c[8:24] = near
    return x, w, (c - 0.5).to(DEVICE)


@pytest.mark.parametrize("reverse_ids", [True, False])
def test_router_near_ties_take_the_exact_path(reverse_ids, monkeypatch):
    # 16 candidates within 16 ulps: the fast int32 keys order them by id alone. With the higher
    # ids scoring higher that is the wrong order, and only the exact int64 path gets it right;
    # without the tie check the kernel returns the fast path's (wrong) picks.
    e, n_group, t = 64, 8, 2
    x, w, bias = near_tie_inputs(t, e, reverse_ids)
    ref = py_router(exact_logits(x, w), bias, n_group, TOPK_GROUP, TOP_K, SCALING, True)
    assert ref[0][0] == ([23, 22, 21, 20] if reverse_ids else [8, 9, 10, 11])
    assert_router_matches(*run_router(x, w, bias, n_group), *ref)
    from lingc.runtime.kernels.moe_router import kernel as router_kernel
    fast = router_kernel.select_fast
    monkeypatch.setattr(router_kernel, "select_fast", lambda *a: {**fast(*a), "CHECK_TIES": False})
    unchecked = run_router(x, w, bias, n_group)
    if reverse_ids:
        with pytest.raises(AssertionError, match="expert set|order"):
            assert_router_matches(*unchecked, *ref)
    else:   # ids in the scores' order: the fast keys were right
        assert_router_matches(*unchecked, *ref)


@pytest.mark.parametrize("seed", range(3))
def test_router_fast_path_same_bits_as_exact_path(seed, monkeypatch):
    e, n_group, t = 64, 8, 8
    x, w, bias = make_router_inputs(t, e, 96, torch.float32, seed=500 + seed)
    fast = run_router(x, w, bias, n_group, 4, 8)
    from lingc.runtime.kernels.moe_router import kernel as router_kernel
    monkeypatch.setattr(router_kernel, "select_fast", lambda *a: dict(G_BITS=0, E_BITS=0, PACK=0))
    exact = run_router(x, w, bias, n_group, 4, 8)
    assert torch.equal(fast[0], exact[0]) and torch.equal(fast[1], exact[1])


def test_redux_pack():
    assert redux_pack(4, 64) == 8 and redux_pack(2, 64) == 4 and redux_pack(8, 64) == 16
    assert redux_pack(2, 8) == 0 and redux_pack(2, 32) == 0 and redux_pack(16, 64) == 0


_ROUTER_COMPILE_CHECK = textwrap.dedent("""
    import re
    from sm90 import compile_sm90, divisible_by_16, signature
    from lingc.runtime.kernels.moe_router.kernel import (
        SELECT_MAXNREG, SELECT_WARPS, _moe_router_logits_kernel, _moe_router_select_kernel, redux_pack,
        router_block_e, router_num_warps)
    fn = _moe_router_logits_kernel
    # One row's tile for both dtypes; the tile of several rows (twice the experts, the same warps)
    # in bf16, the model's dtype.
    # And the same tiles with the block's input norm folded in (lingc.rmsnorm_router, bf16).
    # And an fp16 model's (x, weights and the norm's tensors all fp16). And the norm in the Llama
    # form (round_before_weight, "llama").
    for block_e, wdt, norm in ((router_block_e(512), "*bf16", False), (router_block_e(512), "*fp32", False),
                               (router_block_e(512, 6), "*bf16", False), (router_block_e(512), "*bf16", True),
                               (router_block_e(512, 6), "*bf16", True), (router_block_e(512), "*fp16", True),
                               (router_block_e(512), "*bf16", "llama"), (router_block_e(512, 6), "*bf16", "llama")):
        xdt = "*fp16" if wdt == "*fp16" else "*bf16"
        ptrs = dict(x_ptr=xdt, w_ptr=wdt, logits_ptr="*fp32", res_ptr=xdt, nw_ptr=xdt, y_ptr=xdt, h_ptr=xdt)
        ints = ["T", "ROWS", "H", "stride_xt", "stride_we", "stride_lt", "stride_rt", "stride_yt", "stride_ht",
                "SLICE"]
        const = dict(stride_xh=1, E=512, BLOCK_E=block_e, BLOCK_H=4096, USE_GDC=True, NORM=bool(norm),
                     HAS_RES=bool(norm), ROUND_BEFORE_WEIGHT=norm == "llama")
        attrs = divisible_by_16(fn, [n for n in list(ptrs) + ints if n not in ("T", "ROWS", "SLICE")])
        ptx, info = compile_sm90(fn, signature(fn, ptrs, ints, ["eps"]), const, attrs,
                                 num_warps=router_num_warps(router_block_e(512), 2560))   # as the launcher
        assert " 0 bytes spill stores" in info, (block_e, norm, info)
        # The gate tile is requested before the wait: its loads sit ahead of griddepcontrol.wait.
        before = ptx.split("griddepcontrol.wait")[0]
        # [4, 4096] lanes over 256 threads: 64 per thread, 8 (bf16) / 16 (fp32) 16-byte loads.
        v4 = len(re.findall(r"ld\\.global(\\.\\w+)*\\.v4", before))
        assert v4 >= (16 if wdt == "*fp32" else 8), (wdt, v4)
        assert "griddepcontrol.launch_dependents" in ptx
        print("logits", block_e, wdt, "norm" if norm else "", re.findall(r"Used \\d+ registers", info))
    fn = _moe_router_select_kernel
    ptrs = dict(logits_ptr="*fp32", bias_ptr="*fp32", ids_ptr="*i32", wts_ptr="*fp32")
    ints = ["stride_lt", "stride_it", "stride_wt"]
    const = dict(N_GROUP=8, GROUP_SIZE=64, TOPK_GROUP=4, TOP_K=8, RENORMALIZE=True, G_PAD=8, GS_PAD=64,
                 KG_PAD=4, USE_GDC=True, G_BITS=3, E_BITS=9, PACK=redux_pack(4, 64), CHECK_TIES=True)
    ptx, info = compile_sm90(fn, signature(fn, ptrs, ints, ["routed_scaling"]), const,
                             divisible_by_16(fn, list(ptrs) + ints), num_warps=SELECT_WARPS,
                             maxnreg=SELECT_MAXNREG)
    assert " 0 bytes spill stores" in info, info
    # One warp: every reduction is warp shuffles, no shared memory, no CTA barrier; the fast
    # path's expert picks are one redux.sync each (top_k + 1 of them), the exact path's shuffles.
    assert "bar.sync" not in ptx and "st.shared" not in ptx and "shfl.sync" in ptx
    assert ptx.count("redux.sync.max.s32") == 9, ptx.count("redux.sync.max.s32")
    assert "ld.global" in ptx.split("griddepcontrol.wait")[0]   # the bias, before the wait
    print("select", re.findall(r"Used \\d+ registers", info))
    # The zero-fill rule (DeepSeek-V3's router): the same fast picks, its all-expert exact picks
    # behind a branch; still one warp, no spills.
    ptx, info = compile_sm90(fn, signature(fn, ptrs, ints, ["routed_scaling"]), dict(const, ZERO_FILL=True),
                             divisible_by_16(fn, list(ptrs) + ints), num_warps=SELECT_WARPS,
                             maxnreg=SELECT_MAXNREG)
    assert " 0 bytes spill stores" in info, info
    assert "bar.sync" not in ptx and "st.shared" not in ptx
    assert ptx.count("redux.sync.max.s32") == 9, ptx.count("redux.sync.max.s32")
    print("zero-fill select", re.findall(r"Used \\d+ registers", info))
    # A softmax router's selection (Qwen3-MoE's shape: 128 experts, top 8): one warp, no spills.
    from lingc.runtime.kernels.moe_router.kernel import select_fast
    const = dict(N_GROUP=1, GROUP_SIZE=128, TOPK_GROUP=1, TOP_K=8, RENORMALIZE=True, G_PAD=1, GS_PAD=128,
                 KG_PAD=1, USE_GDC=True, SOFTMAX=True, **select_fast(1, 1, 128))
    ptx, info = compile_sm90(fn, signature(fn, ptrs, ints, ["routed_scaling"]), const,
                             divisible_by_16(fn, list(ptrs) + ints), num_warps=SELECT_WARPS,
                             maxnreg=SELECT_MAXNREG)
    assert " 0 bytes spill stores" in info, info
    assert "bar.sync" not in ptx and "st.shared" not in ptx and "ex2.approx" in ptx
    print("softmax select", re.findall(r"Used \\d+ registers", info))
""")


def test_router_compiles_for_sm90_without_spills():
    # The real (non-interpreted) compile for an H200 at Ling-3's shape with the bundled ptxas:
    # the gate tile's 16-byte loads before the wait; the one-warp selection with its int64 keys
    # neither spills nor leaves the warp.
    run_sm90_compile_check(_ROUTER_COMPILE_CHECK)


# Router op.


@pytest.mark.parametrize("dtype", DTYPES)
def test_router_op_cpu_path_is_the_reference(dtype):
    x, w, bias = make_router_inputs(6, 64, 96, dtype, seed=81, device="cpu")
    ids, wts = torch.ops.lingc.moe_router(x, w, bias, 8, 2, 4, 2.5, True)
    ref_ids, ref_w = moe_router_reference(x, w, bias, 8, 2, 4, 2.5, True)
    assert ids.dtype == torch.int32 and wts.dtype == torch.float32
    assert torch.equal(ids, ref_ids) and torch.equal(wts, ref_w)
    assert torch.equal(moe_router(x, w, bias, 8, 2, 4, 2.5, True)[0], ids)


def test_router_op_schema_fake_and_opcheck():
    assert str(torch.ops.lingc.moe_router.default._schema) == (
        "lingc::moe_router(Tensor x, Tensor gate_w, Tensor? expert_bias, int n_group, int topk_group, "
        "int top_k, float routed_scaling, bool renormalize, bool softmax=False, bool zero_fill=False) -> (Tensor, Tensor)"
    )
    with FakeTensorMode():
        ids, wts = torch.ops.lingc.moe_router(torch.empty(6, 2560, dtype=torch.bfloat16),
                                              torch.empty(512, 2560, dtype=torch.bfloat16),
                                              torch.empty(512), 8, 4, 8, 2.5, True)
    assert ids.shape == wts.shape == (6, 8) and ids.dtype == torch.int32 and wts.dtype == torch.float32
    x, w, bias = make_router_inputs(3, 16, 40, torch.float32, seed=82, device="cpu")
    torch.library.opcheck(torch.ops.lingc.moe_router, (x, w, bias, 4, 2, 4, 2.5, True))
    torch.library.opcheck(torch.ops.lingc.moe_router, (x, w, torch.zeros(16), 1, 1, 4, 2.5, True),
                          {"softmax": True})


@pytest.mark.parametrize("softmax", [False, True])
def test_router_op_without_a_bias_reads_a_persistent_zero_bias(softmax):
    """expert_bias None (a router without one, as Qwen's): the same ids and weights as a zero
    bias, from one persistent zero buffer (no zeros() a call, so no fill kernel a step)."""
    from lingc.runtime.kernels.gemm_common import persistent_buffer

    x, w, _ = make_router_inputs(3, 16, 40, torch.float32, seed=83, device=DEVICE)
    groups = (1, 1) if softmax else (4, 2)
    kw = {"softmax": True} if softmax else {}
    got = torch.ops.lingc.moe_router(x, w, None, *groups, 4, 2.5, True, **kw)
    want = torch.ops.lingc.moe_router(x, w, torch.zeros(16, device=DEVICE), *groups, 4, 2.5, True, **kw)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    zeros = persistent_buffer("zero_expert_bias_16", x.device, 16, torch.float32, 0)
    assert zeros.abs().sum() == 0
    torch.library.opcheck(torch.ops.lingc.moe_router, (x, w, None, *groups, 4, 2.5, True), kw)


def _bad_router_cases():
    z = torch.zeros
    x, w, b = z(3, 40), z(16, 40), z(16)
    ok = (4, 2, 4, 2.5, True)
    return [
        ("x 3-d", (z(1, 3, 40), w, b, *ok), r"x must be \[T, H\] \(2-d\), got shape \(1, 3, 40\)"),
        ("x fp64", (x.double(), w.double(), b, *ok), "x.dtype must be bfloat16, float16 or float32, got torch.float64"),
        ("H mismatch", (x, z(16, 32), b, *ok), "H mismatch, x has H=40 but gate_w has H=32"),
        ("dtype mismatch", (x, w.bfloat16(), b, *ok), "x is torch.float32 but gate_w is torch.bfloat16"),
        ("H stride", (x, z(40, 16).T, b, *ok), r"gate_w must have unit stride along H, got strides \(1, 16\)"),
        ("bias shape", (x, w, z(15), *ok), r"expert_bias must have shape \(16,\), got \(15,\)"),
        ("bias dtype", (x, w, b.double(), *ok), "expert_bias.dtype must be float32 .* got torch.float64"),
        ("n_group", (x, w, b, 3, 2, 4, 2.5, True), "n_group=3 must be >= 1 and divide the expert count E=16"),
        ("group of 1", (x, w, b, 16, 2, 1, 2.5, True), "groups need at least 2 experts .* = 1"),
        ("topk_group", (x, w, b, 4, 5, 4, 2.5, True), r"topk_group=5 must be in \[1, n_group=4\]"),
        ("top_k", (x, w, b, 4, 2, 9, 2.5, True), r"top_k=9 must be in \[1, topk_group \* E / n_group = 8\]"),
    ]


@pytest.mark.parametrize("case", _bad_router_cases(), ids=lambda c: c[0])
def test_router_op_rejects_bad_arguments(case):
    _, args, message = case
    with pytest.raises(ValueError, match=message):
        torch.ops.lingc.moe_router(*args)
    with FakeTensorMode() as mode, pytest.raises(ValueError, match=message):
        torch.ops.lingc.moe_router(*(mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args))


# ----------------------------------------------------------------------------------------------
# moe_align: reference, checker, helpers.

POISON = -7  # never a pair id, a sentinel or an expert id


def py_align(topk_ids, num_experts, block_size, shared_expert):
    """Straightforward sort-based align: the published (sorted_pair_ids, block_expert_ids, total)
    as Python lists."""
    ids = topk_ids.cpu().tolist()
    pairs = []
    for t, row in enumerate(ids):
        row = row + ([num_experts] if shared_expert else [])
        pairs += [(e, t * len(row) + j) for j, e in enumerate(row)]
    sentinel = len(pairs)
    sorted_ids, blocks = [], []
    for expert in sorted({e for e, _ in pairs}):
        members = sorted(p for e, p in pairs if e == expert)
        pad = -len(members) % block_size
        sorted_ids += members + [sentinel] * pad
        blocks += [expert] * ((len(members) + pad) // block_size)
    return sorted_ids, blocks, len(sorted_ids)


def check_align(out, topk_ids, num_experts, block_size, shared_expert):
    """The published range equals py_align, plus the invariants stated one by one."""
    sorted_ids, block_experts, total = (o.cpu() for o in out)
    t, k = topk_ids.shape
    p = t * (k + int(shared_expert))
    slots, blocks = align_sizes(p, num_experts, block_size, shared_expert)
    assert sorted_ids.shape == (slots,) and block_experts.shape == (blocks,) and total.shape == (1,)
    assert all(o.dtype == torch.int32 for o in (sorted_ids, block_experts, total))
    n = int(total[0])
    assert n % block_size == 0 and 0 <= n <= slots, f"total {n}"
    pub, pub_blocks = sorted_ids[:n].tolist(), block_experts[: n // block_size].tolist()
    assert POISON not in pub, f"unwritten slot at {pub.index(POISON)} of the published {n}"
    assert POISON not in pub_blocks, f"unwritten block at {pub_blocks.index(POISON)}"
    real = [q for q in pub if q != p]
    assert sorted(real) == list(range(p)), "every pair exactly once"
    pair_expert = pair_expert_list(topk_ids, num_experts, shared_expert)
    for blk, e in enumerate(pub_blocks):
        members = [q for q in pub[blk * block_size : (blk + 1) * block_size] if q != p]
        assert members, f"block {blk} holds only padding"
        assert all(pair_expert[q] == e for q in members), f"block {blk} mixes experts or has the wrong id"
    assert pub_blocks == sorted(pub_blocks), "buckets in increasing expert order"
    ref_sorted, ref_blocks, ref_total = py_align(topk_ids, num_experts, block_size, shared_expert)
    assert n == ref_total, f"total {n} != reference {ref_total}"
    assert pub == ref_sorted, f"sorted_pair_ids {pub} != reference {ref_sorted}"
    assert pub_blocks == ref_blocks, f"block_expert_ids {pub_blocks} != reference {ref_blocks}"
    tail = block_experts[n // block_size:].tolist()
    assert tail == [no_expert(num_experts)] * len(tail), f"block tail {tail}: every entry must be 'no expert'"


def pair_expert_list(topk_ids, num_experts, shared_expert):
    """The expert of each pair, token-major, the shared expert as id num_experts."""
    rows = topk_ids.cpu().tolist()
    return [e for row in rows for e in row + ([num_experts] if shared_expert else [])]


def run_align(topk_ids, num_experts, block_size, shared_expert, **kw):
    """The launcher into POISON-filled buffers (unwritten elements of the published range fail)."""
    t, k = topk_ids.shape
    slots, blocks = align_sizes(t * (k + int(shared_expert)), num_experts, block_size, shared_expert)
    out = tuple(torch.full((n,), POISON, dtype=torch.int32, device=topk_ids.device) for n in (slots, blocks, 1))
    return moe_align_triton(topk_ids, num_experts, block_size, shared_expert, out=out, **kw)


def make_ids(t, k, num_experts, kind, seed, device=DEVICE):
    """int32 [t, k]: 'random' (with repeats), 'one' (every pair in one expert), 'distinct'."""
    gen = torch.Generator().manual_seed(seed)
    if kind == "random":
        ids = torch.randint(0, num_experts, (t, k), generator=gen)
    elif kind == "one":
        ids = torch.full((t, k), int(torch.randint(0, num_experts, (1,), generator=gen)))
    else:
        ids = torch.randperm(num_experts, generator=gen)[: t * k].view(t, k)
    return ids.to(device=device, dtype=torch.int32)


# (T, k) with T * k + T in {5, 24, 54, 72} (with the shared expert; T * k without).
ALIGN_SHAPES = [(1, 4), (4, 5), (6, 8), (8, 8)]


# ----------------------------------------------------------------------------------------------
# moe_align: kernel tests.


@pytest.mark.parametrize("block_size", [4, 16])
@pytest.mark.parametrize("kind", ["random", "one", "distinct"])
@pytest.mark.parametrize("shared", [True, False], ids=["shared", "routed"])
@pytest.mark.parametrize("t, k", ALIGN_SHAPES, ids=lambda v: str(v))
def test_align_kernel_matches_reference(t, k, shared, kind, block_size):
    num_experts = 512 if kind == "distinct" else 16
    ids = make_ids(t, k, num_experts, kind, seed=100 * t + k)
    assert t * (k + shared) <= SINGLE_LAUNCH_MAX_PAIRS
    check_align(run_align(ids, num_experts, block_size, shared), ids, num_experts, block_size, shared)
    # The PyTorch implementation (CPU op path, CUDA fallback) agrees.
    check_align(moe_align_reference(ids.cpu(), num_experts, block_size, shared), ids, num_experts, block_size, shared)


@pytest.mark.parametrize("block_size", [1, 3, 64])
def test_align_kernel_odd_block_sizes(block_size):
    ids = make_ids(6, 8, 16, "random", seed=7)
    check_align(run_align(ids, 16, block_size, True), ids, 16, block_size, True)


def test_align_kernel_strided_ids_and_few_experts():
    # topk_ids as a column window (row stride 12); 2 experts, so buckets are large.
    wide = make_ids(6, 12, 2, "random", seed=8)
    ids = wide[:, 2:10]
    assert ids.stride() == (12, 1)
    check_align(run_align(ids, 2, 4, True), ids, 2, 4, True)


@pytest.mark.parametrize("block_size", [4, 16])
def test_align_kernel_padding_into_unaligned_slots(block_size):
    # sorted_pair_ids 4 bytes off an 8-byte boundary: the padding takes the 4-byte stores
    # (WIDE_PAD off), with the same outputs as into an aligned buffer (8-byte stores).
    ids = make_ids(6, 8, 16, "random", seed=14)
    slots, blocks = align_sizes(54, 16, block_size, True)
    backing = torch.full((slots + 1,), POISON, dtype=torch.int32, device=DEVICE)
    out = (backing[1:], *(torch.full((n,), POISON, dtype=torch.int32, device=DEVICE) for n in (blocks, 1)))
    assert out[0].data_ptr() % 8 == 4
    check_align(moe_align_triton(ids, 16, block_size, True, out=out), ids, 16, block_size, True)
    aligned = run_align(ids, 16, block_size, True)
    assert all(torch.equal(a, b) for a, b in zip(aligned, out))


@pytest.mark.parametrize("t, k, shared", [(10, 8, False), (9, 8, True), (16, 8, True), (3, 30, False)])
def test_align_fallback_above_single_launch(t, k, shared):
    ids = make_ids(t, k, 64, "random", seed=9 + t)
    assert t * (k + shared) > SINGLE_LAUNCH_MAX_PAIRS
    check_align(run_align(ids, 64, 16, shared), ids, 64, 16, shared)
    # The fallback forced at P <= 72 gives the kernel's published outputs.
    small = make_ids(6, 8, 64, "random", seed=10)
    a = run_align(small, 64, 16, True, max_single_launch=0)
    b = run_align(small, 64, 16, True)
    n = int(b[2][0])
    assert torch.equal(a[2], b[2]) and torch.equal(a[0][:n], b[0][:n]) and torch.equal(a[1], b[1])


def test_align_sizes():
    # Buckets are at most min(P, E'): 54 pairs over 513 experts pad at most 54 * 15 slots.
    assert align_sizes(54, 512, 16, True) == (54 + 54 * 15, 54)
    assert align_sizes(72, 4, 16, True) == (72 + 5 * 15, 10)
    assert align_sizes(5, 16, 1, False) == (5, 5)


def test_align_slot_tail_unwritten_block_tail_no_expert():
    # The kernel writes no slot past total_padded (documented), so the poison stays there; every
    # block past it says "no expert" (E + 1), which consumers skip from the id alone.
    ids = make_ids(1, 4, 16, "one", seed=11)
    sorted_ids, block_experts, total = run_align(ids, 16, 4, False)
    assert int(total[0]) == 4
    assert (sorted_ids[4:] == POISON).all()
    assert block_experts[0] == ids[0, 0] and (block_experts[1:] == 17).all() and no_expert(16) == 17


# A broken kernel must fail check_align.


def test_align_broken_variants_are_caught(monkeypatch):
    ids = make_ids(6, 8, 16, "random", seed=12)
    good = run_align(ids, 16, 16, True)
    check_align(good, ids, 16, 16, True)
    # Two pairs swapped in the sorted list.
    bad = good[0].clone()
    first_real = [i for i, q in enumerate(bad.tolist()) if q != 54][:2]
    bad[first_real[0]], bad[first_real[1]] = good[0][first_real[1]], good[0][first_real[0]]
    with pytest.raises(AssertionError):
        check_align((bad, good[1], good[2]), ids, 16, 16, True)
    # A padding slot left unwritten.
    pad_at = [i for i, q in enumerate(good[0][: int(good[2][0])].tolist()) if q == 54][0]
    bad = good[0].clone()
    bad[pad_at] = POISON
    with pytest.raises(AssertionError, match="unwritten slot"):
        check_align((bad, good[1], good[2]), ids, 16, 16, True)
    # The kernel with half the pair lanes it needs: pairs 32..53 are never placed.
    real_next_pow2 = align_kernel.triton.next_power_of_2
    monkeypatch.setattr(align_kernel.triton, "next_power_of_2", lambda n: real_next_pow2(n) // 2)
    with pytest.raises(AssertionError):
        check_align(run_align(ids, 16, 16, True), ids, 16, 16, True)
    monkeypatch.undo()
    # Outputs built for another block size (4) than the consumer expects (16) are rejected.
    with pytest.raises(AssertionError):
        check_align(run_align(ids, 16, 4, True)[:2] + (torch.tensor([int(good[2][0])], dtype=torch.int32),),
                    ids, 16, 16, True)


_ALIGN_COMPILE_CHECK = textwrap.dedent("""
    import re
    from sm90 import compile_sm90, signature
    from lingc.runtime.kernels.moe_align.kernel import ALIGN_WARPS, _moe_align_kernel
    fn = _moe_align_kernel
    ptrs = dict(ids_ptr="*i32", sorted_ptr="*i32", block_ptr="*i32", total_ptr="*i32")
    ints = ["P", "K", "NBLK", "stride_t", "stride_k"]
    # NP = 32, 64, 128: P up to 32, 33..64 (the verify step's 54 pairs), 65..72; the padding as
    # 8-byte and as 4-byte stores; block size 1 has no padding loop (its zero-trip form crashed
    # triton's coalesce pass).
    for np_, block, wide in [(32, 16, True), (64, 16, True), (128, 16, True), (64, 16, False), (64, 1, False)]:
        const = dict(NUM_EXPERTS=512, PAIRS_PER_TOKEN=9, BLOCK_SIZE=block, NP=np_, WIDE_PAD=wide, USE_GDC=True)
        ptx, info = compile_sm90(fn, signature(fn, ptrs, ints), const, num_warps=ALIGN_WARPS)
        case = (np_, block, wide)
        assert " 0 bytes spill stores" in info, (case, info)
        # One warp: the sort, the neighbour gathers, the scans and the sums are warp shuffles,
        # no shared memory, no CTA barrier.
        assert "bar.sync" not in ptx and "st.shared" not in ptx and "shfl.sync" in ptx, case
        assert "griddepcontrol.wait" in ptx and "griddepcontrol.launch_dependents" in ptx, case
        assert ("st.global.b64" in ptx) == wide, case
        print("align", case, re.findall(r"Used \\d+ registers", info))
    # P = 1 arrives as a specialised int (the one-pair launch), not an i32 tensor scalar.
    const = dict(P=1, NUM_EXPERTS=512, PAIRS_PER_TOKEN=9, BLOCK_SIZE=16, NP=32, WIDE_PAD=True, USE_GDC=True)
    compile_sm90(fn, signature(fn, ptrs, [n for n in ints if n != "P"]), const, num_warps=ALIGN_WARPS)
""")


def test_align_compiles_for_sm90_one_warp_without_spills():
    # The real (non-interpreted) compile for an H200 with the bundled ptxas at the launcher's
    # warps: no spills and nothing that leaves the warp.
    run_sm90_compile_check(_ALIGN_COMPILE_CHECK)


# moe_align op.


def test_align_op_cpu_path_and_fake():
    ids = make_ids(6, 8, 512, "random", seed=13, device="cpu")
    out = torch.ops.lingc.moe_align(ids, 512, 16, True)
    check_align(out, ids, 512, 16, True)
    assert all(torch.equal(a, b) for a, b in zip(out, moe_align(ids, 512, 16, True)))
    assert str(torch.ops.lingc.moe_align.default._schema) == (
        "lingc::moe_align(Tensor topk_ids, int num_experts, int block_size, bool shared_expert) "
        "-> (Tensor, Tensor, Tensor)"
    )
    with FakeTensorMode():
        s, b, n = torch.ops.lingc.moe_align(torch.empty(6, 8, dtype=torch.int32), 512, 16, True)
    assert (s.shape, b.shape, n.shape) == ((54 + 54 * 15,), (54,), (1,))
    assert s.dtype == b.dtype == n.dtype == torch.int32
    torch.library.opcheck(torch.ops.lingc.moe_align, (ids, 512, 16, True))


@pytest.mark.parametrize("args, message", [
    ((torch.zeros(6, dtype=torch.int32), 16, 4, True), r"topk_ids must be \[T, k\] \(2-d\), got shape \(6,\)"),
    ((torch.zeros(2, 4, dtype=torch.int64), 16, 4, True), "topk_ids.dtype must be int32, got torch.int64"),
    ((torch.zeros(2, 0, dtype=torch.int32), 16, 4, True), r"at least one slot per token, got shape \(2, 0\)"),
    ((torch.zeros(2, 4, dtype=torch.int32), 0, 4, True), "num_experts must be >= 1, got 0"),
    ((torch.zeros(2, 4, dtype=torch.int32), 16, 0, True), "block_size must be >= 1, got 0"),
])
def test_align_op_rejects_bad_arguments(args, message):
    with pytest.raises(ValueError, match=message):
        torch.ops.lingc.moe_align(*args)
    with FakeTensorMode() as mode, pytest.raises(ValueError, match=message):
        torch.ops.lingc.moe_align(mode.from_tensor(args[0]), *args[1:])


# ----------------------------------------------------------------------------------------------
# GPU: Ling-3 shapes (E = 512, H = 2560, n_group 8, topk_group 4, top_k 8, scaling 2.5).

LING3 = dict(e=512, h=2560, n_group=8, topk_group=4, top_k=8, scaling=2.5)


def assert_equivalent_selection(ids, ref_ids, c, atol=1e-6):
    """ids == ref_ids, except where two biased scores are within atol (a kernel sigmoid an ulp
    away from torch's may order them differently): then the picked scores must agree."""
    for r in range(ids.shape[0]):
        if torch.equal(ids[r], ref_ids[r]):
            continue
        a, b = c[r, ids[r].long()], c[r, ref_ids[r].long()]
        torch.testing.assert_close(a, b, atol=atol, rtol=0, msg=f"row {r}: {ids[r].tolist()} vs {ref_ids[r].tolist()}")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("t", [1, 6, 16])
def test_gpu_router_ling3(t, dtype):
    g = LING3
    x, w, bias = make_router_inputs(t, g["e"], g["h"], dtype, seed=200 + t)
    logits = torch.full((t, g["e"]), float("nan"), device=DEVICE)
    ids, wts = run_router(x, w, bias, g["n_group"], g["topk_group"], g["top_k"], g["scaling"], logits_out=logits)
    torch.testing.assert_close(logits.cpu(), exact_logits(x, w), atol=1e-4, rtol=1e-4)
    # Selection from the kernel's own logits: exact up to near-ties of the biased scores.
    s = torch.sigmoid(logits)
    ref_ids, ref_w = grouped_topk_reference(s, bias, g["n_group"], g["topk_group"], g["top_k"], g["scaling"], True)
    assert_equivalent_selection(ids, ref_ids, s + bias)
    torch.testing.assert_close(wts, ref_w, atol=1e-5, rtol=0)
    # And the op on CUDA is the kernel.
    op_ids, op_w = torch.ops.lingc.moe_router(x, w, bias, g["n_group"], g["topk_group"], g["top_k"], g["scaling"], True)
    assert torch.equal(op_ids, ids) and torch.equal(op_w, wts)


def zero_fill_keys(c, n_group, topk_group):
    """The zero-fill rule's keys: c in the kept groups (ties: lowest group), 0.0 elsewhere."""
    t, e = c.shape
    groups = c.view(t, n_group, e // n_group)
    top2 = groups.sort(dim=-1, descending=True, stable=True).values[..., :2].sum(-1)
    keep = top2.sort(dim=-1, descending=True, stable=True).indices[:, :topk_group]
    mask = torch.zeros(t, n_group, dtype=torch.bool, device=c.device).scatter_(1, keep, True)
    return groups.masked_fill(~mask[..., None], 0.0).view(t, e)


@pytest.mark.gpu
@pytest.mark.parametrize("shift", ZERO_FILL_SHIFTS + [-0.45])
@pytest.mark.parametrize("t", [1, 6, 16])
def test_gpu_zero_fill_router_ling3(t, shift):
    """DeepSeek-V3's zero-fill rule at Ling-3's shape, with biases that put kept keys around and
    below the fill: the kernel's picks are the reference's on its own logits (up to near-ties),
    every output written, and the rule's all-expert branch ran where it must."""
    g = LING3
    x, w, bias = make_router_inputs(t, g["e"], g["h"], torch.bfloat16, seed=500 + t)
    bias = 3 * bias + shift
    logits = torch.full((t, g["e"]), float("nan"), device=DEVICE)
    args = (g["n_group"], g["topk_group"], g["top_k"], g["scaling"])
    ids, wts = run_router(x, w, bias, *args[:2], args[2], args[3], logits_out=logits, zero_fill=True)
    s = torch.sigmoid(logits)
    ref_ids, ref_w = grouped_topk_reference(s, bias, *args, True, zero_fill=True)
    assert_equivalent_selection(ids, ref_ids, zero_fill_keys(s + bias, g["n_group"], g["topk_group"]))
    torch.testing.assert_close(wts, ref_w, atol=1e-5, rtol=0)
    if shift == -3.0:
        plain = grouped_topk_reference(s, bias, *args, True)[0]
        assert all(set(a) != set(b) for a, b in zip(ids.tolist(), plain.tolist()))
    s_ids, s_w = run_select(logits, bias, *args, zero_fill=True)
    assert torch.equal(s_ids, ids) and torch.equal(s_w, wts)


@pytest.mark.gpu
def test_gpu_select_prompt_chunk_ling3():
    # A prompt chunk's selection (8192 rows of Ling-3 logits, bf16-rounded as the eager router's):
    # the op on CUDA is the kernel, every row written, equal to the reference up to near-ties.
    g = LING3
    gen = torch.Generator(device=DEVICE).manual_seed(400)
    logits = torch.randn(8192, g["e"], device=DEVICE, generator=gen).bfloat16().float()
    bias = 0.1 * torch.randn(g["e"], device=DEVICE, generator=gen)
    args = (g["n_group"], g["topk_group"], g["top_k"], g["scaling"])
    ids, wts = run_select(logits, bias, *args)
    assert (ids >= 0).all() and torch.isfinite(wts).all()
    s = torch.sigmoid(logits)
    ref_ids, ref_w = grouped_topk_reference(s, bias, *args, True)
    assert_equivalent_selection(ids, ref_ids, s + bias)
    torch.testing.assert_close(wts, ref_w, atol=1e-5, rtol=0)
    op_ids, op_w = torch.ops.lingc.moe_select(logits, bias, *args, True)
    assert torch.equal(op_ids, ids) and torch.equal(op_w, wts)


@pytest.mark.gpu
@pytest.mark.parametrize("e, n_group, topk_group, top_k", [
    (256, 4, 2, 8),     # kept tile [2, 64]: pack 4
    (512, 8, 4, 8),     # Ling-3, [4, 64]: pack 8
    (1024, 8, 4, 8),    # [4, 128]: pack 16
    (256, 2, 1, 6),     # [1, 128]: pack 4
    (512, 16, 8, 8),    # [8, 32]: pack 8
    (1024, 16, 7, 8),   # [8, 64] over 7 kept groups: pack 16
])
def test_gpu_router_redux_packs(e, n_group, topk_group, top_k):
    # The redux.sync picks assume a thread holds exactly redux_pack elements of the kept tile;
    # a layout that replicates the tile would pick wrong experts here.
    from lingc.runtime.kernels.moe_router.kernel import select_fast
    kg, gs = triton.next_power_of_2(topk_group), triton.next_power_of_2(e // n_group)
    assert select_fast(n_group, topk_group, e // n_group)["PACK"] == redux_pack(kg, gs) > 0
    x, w, bias = make_router_inputs(6, e, 256, torch.float32, seed=e + topk_group)
    ids, wts = run_router(x, w, bias, n_group, topk_group, top_k)
    ref = py_router(exact_logits(x, w), bias, n_group, topk_group, top_k, SCALING, True)
    assert_router_matches(ids, wts, *ref)
    x, w, bias = near_tie_inputs(2, e, reverse_ids=True)
    assert_router_matches(*run_router(x, w, bias, n_group, topk_group, top_k),
                          *py_router(exact_logits(x, w), bias, n_group, topk_group, top_k, SCALING, True))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("t", [1, 6, 16])
@pytest.mark.parametrize("e, top_k", [(128, 8), (64, 4), (512, 10)])
def test_gpu_softmax_router(e, top_k, t, dtype):
    """The softmax selection on CUDA (redux packs of [1, 128] and [1, 512] kept tiles, and the
    shuffle path at 64): ids exactly, weights within fp32 rounding, every output written, the
    tie rule on integer logits."""
    x, w, _ = make_router_inputs(t, e, 256, dtype, seed=e + t)
    zeros = torch.zeros(e, device="cuda")
    for renormalize in (False, True):
        ids, wts = run_router(x, w, zeros, 1, 1, top_k, 1.5, renormalize, softmax=True)
        assert_router_matches(ids, wts, *py_softmax_router(exact_logits(x, w), top_k, 1.5, renormalize))
    x, w, _ = make_tied_inputs(t, e, 40, dtype, seed=e)
    ids, wts = run_router(x, w, zeros, 1, 1, top_k, 1.0, True, softmax=True)
    assert_router_matches(ids, wts, *py_softmax_router(exact_logits(x, w), top_k, 1.0, True))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
def test_gpu_router_batch_invariant(dtype):
    g = LING3
    x, w, bias = make_router_inputs(16, g["e"], g["h"], dtype, seed=300)
    args = (g["n_group"], g["topk_group"], g["top_k"], g["scaling"])
    # T = 1 runs 4 experts a CTA and T > 1 8 (router_block_e), with the same warps: the
    # logits, not only the picks, must be the same bits.
    assert router_block_e(g["e"], 1) != router_block_e(g["e"], 16)
    l16 = torch.empty(16, g["e"], device=DEVICE)
    ids16, w16 = run_router(x, w, bias, *args, logits_out=l16)
    for t in (1, 2, 6, 8):
        l_t = torch.empty(t, g["e"], device=DEVICE)
        ids_t, w_t = run_router(x[:t], w, bias, *args, logits_out=l_t)
        assert torch.equal(l_t, l16[:t]), t
        assert torch.equal(ids_t, ids16[:t]) and torch.equal(w_t, w16[:t])


@pytest.mark.gpu
@pytest.mark.parametrize("t", [6, 16])
def test_gpu_router_row_groups_same_bits(t):
    """Ling-3 shapes: the logits (NaN-poisoned workspace, every element written) and the picks
    are the same bits for every row grouping of the logits launch, the table's among them."""
    g = LING3
    x, w, bias = make_router_inputs(t, g["e"], g["h"], torch.bfloat16, seed=310 + t)
    args = (g["n_group"], g["topk_group"], g["top_k"], g["scaling"])
    outs = []
    for groups in (1, 2, 3, t, None):
        logits = torch.full((t, g["e"]), float("nan"), device=DEVICE)
        outs.append((logits, *run_router(x, w, bias, *args, logits_out=logits, row_groups=groups)))
        assert not logits.isnan().any(), groups
    for other in outs[1:]:
        assert all(torch.equal(a, b) for a, b in zip(outs[0], other))


@pytest.mark.gpu
@pytest.mark.parametrize("t", [1, 6, 8, 16])
def test_gpu_align_ling3(t):
    ids = make_ids(t, 8, 512, "random", seed=400 + t)
    for shared in (True, False):
        check_align(run_align(ids, 512, 16, shared), ids, 512, 16, shared)
        check_align(torch.ops.lingc.moe_align(ids, 512, 16, shared), ids, 512, 16, shared)


@pytest.mark.gpu
@pytest.mark.parametrize("disable_pdl", [False, True], ids=["pdl", "no-pdl"])
def test_gpu_router_align_chain_under_graph_capture(disable_pdl, monkeypatch):
    if disable_pdl:
        monkeypatch.setenv("LINGC_DISABLE_PDL", "1")
    g = LING3
    x, w, bias = make_router_inputs(6, g["e"], g["h"], torch.bfloat16, seed=500)
    args = (g["n_group"], g["topk_group"], g["top_k"], g["scaling"], True)

    def step():
        ids, wts = torch.ops.lingc.moe_router(x, w, bias, *args)
        return ids, wts, torch.ops.lingc.moe_align(ids, g["e"], 16, True)

    eager = step()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = step()
    x.copy_(make_router_inputs(6, g["e"], g["h"], torch.bfloat16, seed=501)[0])
    graph.replay()
    fresh = step()
    torch.cuda.synchronize()
    assert torch.equal(captured[0], fresh[0]) and torch.equal(captured[1], fresh[1])
    n = int(fresh[2][2][0])
    assert torch.equal(captured[2][2], fresh[2][2]) and torch.equal(captured[2][0][:n], fresh[2][0][:n])
    check_align(captured[2], captured[0], g["e"], 16, True)
    assert not torch.equal(eager[0], fresh[0])  # the replay really saw the new input
