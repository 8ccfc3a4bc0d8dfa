"""Fused MoE experts: the Triton launcher (moe_align -> up-GEMM + SwiGLU -> down-GEMM + combine)
against the plain-PyTorch reference, the reference against an independent eager formulation,
batch invariance, poisoned outputs and workspaces, broken variants, the op; on the GPU the
flash-tp4-rank shapes (E = 512, H = 2560, I = Is = 192, k = 8) and PDL under CUDA-graph capture.

On the CPU the kernels run under TRITON_INTERPRET=1 (conftest.py) on small shapes: E = 16,
H in {64, 96}, I = 24, shared Is = 40 (so the shared expert has more column tiles than the
routed ones), k = 4, T in {1, 2, 6, 8, 16, 20} (T = 16 has 80 pairs: moe_align's multi-launch path).

Every kernel run writes into a NaN-poisoned ``out`` and NaN-poisoned workspaces, with moe_align's
buffers pre-filled with a valid-looking pair (0) and expert (E - 1): a row the kernels forget, or
an unpublished slot they read, shows up in the output (moe_align overwrites the whole block list,
marking the blocks past ``total_padded`` "no expert").

Tolerances (relative RMS): fp32 1e-5 (summation order only). bf16 1e-2: the interpreter's
fp32->bf16 cast truncates (tests/test_swiglu_gemm.py), here twice (the activation and the
output). bf16 on the GPU at the real shapes 5e-3: both sides round the activation to nearest, and
an activation one ulp apart where the fp32 sums straddle a rounding boundary moves the output.
"""
import dataclasses
import importlib
import textwrap

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from helpers import assert_close, graph_edge_types, run_sm90_compile_check
from lingc.models.moe import swiglu as eager_swiglu
from lingc.runtime.kernels.gemm_common import split_k_tickets
import lingc.runtime.kernels.moe_router  # noqa: F401  (registers lingc::moe_router for the chain test)
from lingc.runtime.kernels.moe_experts import moe_experts, moe_experts_reference
from lingc.runtime.kernels.moe_experts import kernel as experts_kernel
from lingc.runtime.kernels.moe_experts.kernel import (
    BLOCK_M, MoeExpertsConfig, up_chunks, alloc_buffers, config_for, moe_experts_triton,
)
from lingc.runtime.kernels.moe_align.naive import align_sizes
from lingc.runtime.pdl import pdl_supported

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
RTOL = {torch.float32: 1e-5, torch.bfloat16: 1e-2}
RTOL_GPU_BF16 = 5e-3
SMALL = dict(e=16, h=64, i=24, i_s=40, k=4)
LIMITS = (2.0, 3.0)
# Split-K configs for H = 96: three chunks of 32, and two chunks of 64 (the last one past H).
SPLIT_CONFIGS = [
    MoeExpertsConfig(block_n=8, split_k=3, up_warps=4, block_h=16, down_warps=4),
    MoeExpertsConfig(block_n=16, split_k=2, up_warps=4, block_h=32, down_warps=4),
]

# The up-GEMM's loop design (block_k > 0) for H = 96: two chunks of 48 in 16-wide tiles, two
# stages; one chunk of 96 in 32-wide tiles, three stages, no split-K.
LOOP_CONFIGS = [
    MoeExpertsConfig(block_n=16, split_k=2, up_warps=4, block_h=32, down_warps=4, block_k=16, up_stages=2),
    MoeExpertsConfig(block_n=8, split_k=1, up_warps=4, block_h=16, down_warps=4, block_k=32, up_stages=3),
]
LOOP_IDS = ["bn16-s2-bk16", "bn8-s1-bk32"]
# The up-GEMM on CUDA cores (up_gemv): 1, 2 and 4 activation columns per CTA over the whole H.
GEMV_CONFIGS = [
    MoeExpertsConfig(block_n=1, split_k=1, up_warps=1, block_h=16, down_warps=4, up_gemv=True),
    MoeExpertsConfig(block_n=2, split_k=1, up_warps=2, block_h=32, down_warps=4, up_gemv=True),
    MoeExpertsConfig(block_n=4, split_k=1, up_warps=4, block_h=64, down_warps=4, up_gemv=True),
]
GEMV_IDS = ["c1-w1", "c2-w2", "c4-w4"]


# ----------------------------------------------------------------------------------------------
# Problems, the launcher into poisoned buffers, an independent eager formulation.


def make_ids(t, e, k, routing, gen):
    """int32 [t, k], distinct experts per token. 'random': any of e; 'same': every token the same
    k experts (buckets of t pairs); 'pool': drawn from 6 experts, so tokens share experts in
    varying combinations and a token's row position in a block changes with T."""
    if routing == "same":
        return torch.randperm(e, generator=gen)[:k].repeat(t, 1).int()
    pool = torch.randperm(e, generator=gen)[:6] if routing == "pool" else torch.arange(e)
    rows = [pool[torch.randperm(len(pool), generator=gen)[:k]] for _ in range(t)]
    return (torch.stack(rows) if rows else torch.empty(0, k, dtype=torch.int64)).int()


def make_problem(t, dtype, seed, *, e=16, h=64, i=24, i_s=40, k=4, shared=True, routing="random",
                 layout="stacked", limits=LIMITS, device=DEVICE, gated=False):
    """The op's arguments as a dict. Gate/up pre-activations ~ N(0, 16) so both clamps bite.
    ``gated``: the shared expert behind a sigmoid gate (key shared_sigmoid, [1, H]; its logits
    ~ N(0, 4), so the scales spread over (0, 1)).

    layout 'stacked': gate/up are w13[:, :I], w13[:, I:] of a [E, 2I, H] weight and w_down is a
    column window of a [E, H, I + 8] tensor (row stride I + 8); 'interleaved': w13[:, 0::2],
    w13[:, 1::2] of the same values interleaved; 'separate': contiguous tensors, with x and
    topk_ids / topk_weights as strided windows of wider tensors."""
    # Weights drawn on the target device (the GPU shapes hold 0.75 G values); routing on the CPU.
    gen = torch.Generator(device=device).manual_seed(seed)

    def randn(*shape, scale=1.0):
        return (torch.randn(*shape, generator=gen, device=device) * scale).to(dtype)

    x = randn(t, h)
    gate, up = randn(e, i, h, scale=4 / h**0.5), randn(e, i, h, scale=4 / h**0.5)
    down = randn(e, h, i, scale=1 / i**0.5)
    s_gate, s_up = randn(i_s, h, scale=4 / h**0.5), randn(i_s, h, scale=4 / h**0.5)
    s_down = randn(h, i_s, scale=1 / i_s**0.5)
    cpu_gen = torch.Generator().manual_seed(seed)
    ids = make_ids(t, e, k, routing, cpu_gen).to(device)
    weights = (0.1 + torch.rand(t, k, generator=cpu_gen)).to(device)
    if layout == "stacked":
        w13 = torch.cat([gate, up], dim=1)
        wide = torch.zeros(e, h, i + 8, device=device, dtype=dtype)
        wide[..., :i] = down
        w_gate, w_up, w_down = w13[:, :i], w13[:, i:], wide[..., :i]
    elif layout == "interleaved":
        w13 = torch.stack([gate, up], dim=2).reshape(e, 2 * i, h)
        w_gate, w_up, w_down = w13[:, 0::2], w13[:, 1::2], down
    else:
        w_gate, w_up, w_down = gate.contiguous(), up.contiguous(), down.contiguous()
        x, ids, weights = _strided(x), _strided(ids), _strided(weights)
    shared_w = (s_gate, s_up, s_down) if shared else (None, None, None)
    limit, shared_limit = limits
    return dict(x=x, topk_ids=ids, topk_weights=weights, w_gate=w_gate, w_up=w_up, w_down=w_down,
                shared_gate=shared_w[0], shared_up=shared_w[1], shared_down=shared_w[2],
                limit=limit, shared_limit=shared_limit if shared else 0.0,
                shared_sigmoid=randn(1, h, scale=2 / h**0.5) if gated else None)


def _strided(v):
    """v's values as every other column of a wider tensor (a non-unit column stride)."""
    wide = torch.zeros(v.shape[0], 2 * v.shape[1], device=v.device, dtype=v.dtype)
    wide[:, ::2] = v
    return wide[:, ::2]


def args_of(pb):
    return (pb["x"], pb["topk_ids"], pb["topk_weights"], pb["w_gate"], pb["w_up"], pb["w_down"],
            pb["shared_gate"], pb["shared_up"], pb["shared_down"], pb["limit"], pb["shared_limit"])


def reference(pb):
    """naive.py's per-token reference on the CPU, returned on pb's device (the unmarked tests also
    run on a GPU when one is present)."""
    sig = pb.get("shared_sigmoid")
    out = moe_experts_reference(*(a.cpu() if torch.is_tensor(a) else a for a in args_of(pb)),
                                shared_sigmoid=None if sig is None else sig.cpu())
    return out.to(pb["x"].device)


def run_kernel(pb, config=None, **kw):
    """The launcher into a NaN-poisoned out and workspaces, with moe_align's unpublished tail
    poisoned by a valid pair id (0) and expert id (E - 1)."""
    x, ids = pb["x"], pb["topk_ids"]
    t, k = ids.shape
    e, i, h = pb["w_gate"].shape
    shared = pb["shared_gate"] is not None
    n_max = max(i, pb["shared_gate"].shape[0] if shared else 0)
    p = t * (k + shared)
    slots, blocks = align_sizes(p, e, BLOCK_M, shared)
    cfg = config or config_for(n_max, h)
    chunk = 1 << (-(-h // cfg.split_k) - 1).bit_length()
    split_k = -(-h // chunk)
    out = torch.full((t, h), float("nan"), device=x.device, dtype=x.dtype)
    buffers = alloc_buffers(p, n_max, h, split_k, x.dtype, x.device, fill=float("nan"))
    align_out = (torch.zeros(slots, dtype=torch.int32, device=x.device),
                 torch.full((blocks,), e - 1, dtype=torch.int32, device=x.device),
                 torch.full((1,), -1, dtype=torch.int32, device=x.device))
    return moe_experts_triton(*args_of(pb), out, config=config, buffers=buffers, align_out=align_out,
                              shared_sigmoid=pb.get("shared_sigmoid"), **kw)


def eager_moe(pb):
    """The eager model's formulation (lingc/models/moe.py), written out independently of naive.py:
    gathered expert weights, batched products, each expert output rounded to x.dtype, the shared
    expert added after the routed sum."""
    x, ids, w = pb["x"].cpu(), pb["topk_ids"].cpu().long(), pb["topk_weights"].cpu()
    t, k = ids.shape
    flat = ids.reshape(-1)
    xs = x.repeat_interleave(k, dim=0).unsqueeze(-1)
    g = torch.bmm(pb["w_gate"].cpu()[flat], xs).squeeze(-1)
    u = torch.bmm(pb["w_up"].cpu()[flat], xs).squeeze(-1)
    a = eager_swiglu(g, u, pb["limit"])
    y = torch.bmm(pb["w_down"].cpu()[flat], a.unsqueeze(-1)).squeeze(-1).view(t, k, -1).float()
    out = y[:, 0] * w[:, 0:1]
    for j in range(1, k):
        out = out + y[:, j] * w[:, j:j + 1]
    if pb["shared_gate"] is not None:
        sg, su, sd = (pb[n].cpu() for n in ("shared_gate", "shared_up", "shared_down"))
        shared = (eager_swiglu(x @ sg.T, x @ su.T, pb["shared_limit"]) @ sd.T).float()
        if pb.get("shared_sigmoid") is not None:        # Qwen3-Next's gate: sigmoid(Linear(H, 1)(x))
            shared = torch.sigmoid(x.float() @ pb["shared_sigmoid"].cpu().float().T) * shared
        out = out + shared
    return out.to(x.dtype)


# ----------------------------------------------------------------------------------------------
# Kernel against the reference.


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("t", [1, 2, 6, 16])
def test_kernel_matches_reference(t, dtype):
    pb = make_problem(t, dtype, seed=10 + t)
    assert_close(run_kernel(pb), reference(pb), RTOL[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("t", [1, 2, 6, 16])
def test_kernel_gated_shared_expert(t, dtype):
    """A shared expert behind a sigmoid gate: the combine scales it by sigmoid(x . w) (the
    one-token slot layout at T = 1, moe_align's at T > 1, its two-pass path at T = 16); the
    gate changes the output (so ignoring it fails)."""
    pb = make_problem(t, dtype, seed=30 + t, gated=True)
    got, want = run_kernel(pb), reference(pb)
    assert_close(got, want, RTOL[dtype])
    assert not torch.allclose(want.float(), reference({**pb, "shared_sigmoid": None}).float(), rtol=0.1, atol=0.1)


def test_kernel_gated_shared_expert_split_k_and_wide_h():
    # H = 96 in the sigmoid's chunks of 128 (one masked chunk) with split-K up-GEMM chunks.
    pb = make_problem(6, torch.float32, seed=37, h=96, gated=True)
    assert_close(run_kernel(pb, SPLIT_CONFIGS[0]), reference(pb), RTOL[torch.float32])


def test_kernel_float16():
    pb = make_problem(6, torch.float16, seed=15)
    assert_close(run_kernel(pb), reference(pb), RTOL[torch.bfloat16])


@pytest.mark.parametrize("t", [1, 6])
def test_kernel_without_shared_expert(t):
    pb = make_problem(t, torch.bfloat16, seed=20 + t, shared=False, limits=(0.0, 0.0))
    assert_close(run_kernel(pb), reference(pb), RTOL[torch.bfloat16])


@pytest.mark.parametrize("limits", [(0.0, 3.0), (2.0, 0.0), (0.0, 0.0)], ids=str)
def test_kernel_clamp_on_and_off(limits):
    pb = make_problem(6, torch.float32, seed=30, limits=limits)
    ref = reference(pb)
    assert_close(run_kernel(pb), ref, RTOL[torch.float32])
    # Each clamp changes the result (so a kernel that ignored it would fail): the clamps bite.
    for which in (0, 1):
        if limits[which] > 0:
            unclamped = dict(pb, **{("limit", "shared_limit")[which]: 0.0})
            assert (reference(unclamped) - ref).abs().max() > 0.1


@pytest.mark.parametrize("config", SPLIT_CONFIGS, ids=["bn8-s3-bh16", "bn16-s2-bh32"])
@pytest.mark.parametrize("t", [1, 6])
def test_kernel_split_k_matches_reference(t, config):
    pb = make_problem(t, torch.bfloat16, seed=40 + t, h=96)
    assert_close(run_kernel(pb, config), reference(pb), RTOL[torch.bfloat16])
    # Every ticket is back at zero for the next call (or graph replay).
    assert int(split_k_tickets(pb["x"].device, 1).abs().sum()) == 0


@pytest.mark.parametrize("config", LOOP_CONFIGS, ids=LOOP_IDS)
@pytest.mark.parametrize("t, dtype", [(1, torch.bfloat16), (6, torch.bfloat16), (6, torch.float32)])
def test_kernel_up_loop_design_matches_reference(t, dtype, config):
    # The up-GEMM streaming its chunk through a pipelined tile loop (block_k > 0), the shared
    # expert's CTAs included, into poisoned workspaces; the tickets end at zero.
    pb = make_problem(t, dtype, seed=44 + t, h=96)
    assert_close(run_kernel(pb, config), reference(pb), RTOL[dtype])
    assert int(split_k_tickets(pb["x"].device, 1).abs().sum()) == 0


# Each config with two of the shapes and each shape with one or two configs: the whole product
# took 141 s under the interpreter (the one-column config at T = 16 alone 46 s) for a design no
# table entry uses; the GPU tests (test_gpu_up_gemv) sweep it at flash-tp4-rank's shapes.
GEMV_CASES = [
    (1, torch.bfloat16, 64, 0), (6, torch.float32, 64, 0),
    (1, torch.bfloat16, 64, 1), (6, torch.bfloat16, 96, 1),
    (6, torch.float32, 64, 2), (16, torch.bfloat16, 40, 2),
]


@pytest.mark.parametrize("t, dtype, h, c", GEMV_CASES,
                         ids=[f"{t}-{str(d)[6:]}-{h}-{GEMV_IDS[c]}" for t, d, h, c in GEMV_CASES])
def test_kernel_up_gemv_matches_reference(t, dtype, h, c):
    # H whole per CTA as two power-of-two tiles (96 = 64 + 32; 40 = 32 + 8, masked), a block's
    # rows up to its first sentinel (T = 16: 80 pairs, the multi-launch align), the shared
    # expert's 16-token blocks, no split-K workspace.
    pb = make_problem(t, dtype, seed=46 + t, h=h, routing="pool" if t > 1 else "random")
    assert_close(run_kernel(pb, GEMV_CONFIGS[c]), reference(pb), RTOL[dtype])


@pytest.mark.parametrize("t, k, i, i_s", [(6, 4, 40, 24), (20, 2, 24, 40)], ids=["Is<I", "T=20"])
def test_kernel_up_gemv_shared_expert_shapes(t, k, i, i_s):
    pb = make_problem(t, torch.float32, seed=47 + t, k=k, i=i, i_s=i_s)
    assert_close(run_kernel(pb, GEMV_CONFIGS[1]), reference(pb), RTOL[torch.float32])


def test_kernel_up_gemv_one_token_and_invariance():
    # One token on the slot layout: the aligned layout's bits; T = 1..8 with shared experts: each
    # token's bits its T = 1 call's.
    pb = make_problem(1, torch.bfloat16, seed=48)
    got = run_kernel(pb, GEMV_CONFIGS[2])
    assert torch.equal(got, run_kernel(pb, GEMV_CONFIGS[2], align_one_token=True))
    _batch_invariance(lambda p: run_kernel(p, GEMV_CONFIGS[2]), make_problem(8, torch.bfloat16, seed=49,
                                                                           routing="pool"))


def test_kernel_up_gemv_config_is_checked():
    with pytest.raises(ValueError, match="takes H whole"):
        MoeExpertsConfig(block_n=2, split_k=2, up_warps=2, block_h=32, down_warps=4, up_gemv=True)
    with pytest.raises(ValueError, match="power-of-two block_n"):
        MoeExpertsConfig(block_n=3, split_k=1, up_warps=2, block_h=32, down_warps=4, up_gemv=True)
    with pytest.raises(ValueError, match="use up_gemv=True"):
        MoeExpertsConfig(block_n=4, split_k=1, up_warps=2, block_h=32, down_warps=4)
    assert up_chunks(GEMV_CONFIGS[0], 2560) == (2560, 1)


def test_kernel_up_loop_design_chunks_are_whole_tiles():
    # H = 96 in three chunks of 32-wide tiles (not a power of two: 32 each), and one 128-wide
    # tile wider than H (masked past it); a tile width that is not a power of two is refused.
    pb = make_problem(6, torch.float32, seed=45, h=96)
    for cfg in (dataclasses.replace(LOOP_CONFIGS[0], split_k=3, block_k=32),
                dataclasses.replace(LOOP_CONFIGS[1], block_k=128)):
        assert_close(run_kernel(pb, cfg), reference(pb), RTOL[torch.float32])
    with pytest.raises(ValueError, match="block_k=24: use 0"):
        dataclasses.replace(LOOP_CONFIGS[0], block_k=24)


@pytest.mark.parametrize("layout", ["interleaved", "separate"])
def test_kernel_weight_layouts(layout):
    # The same values as gate/up views of an interleaved w13 (rows 2j, 2j+1), or as contiguous
    # tensors with strided x / ids / weights: the same bits as the stacked views.
    stacked = make_problem(6, torch.bfloat16, seed=50)
    pb = make_problem(6, torch.bfloat16, seed=50, layout=layout)
    assert pb["w_gate"].stride() != stacked["w_gate"].stride()
    out = run_kernel(pb)
    assert_close(out, reference(pb), RTOL[torch.bfloat16])
    assert torch.equal(out, run_kernel(stacked))


@pytest.mark.parametrize("t, routing", [(6, "same"), (16, "same"), (8, "pool")])
def test_kernel_tokens_sharing_experts(t, routing):
    # 'same': k buckets of t pairs (T = 16: whole blocks of 16, no padding, and 80 pairs through
    # moe_align's multi-launch path) and most of the allocated blocks unused; 'pool': overlaps.
    pb = make_problem(t, torch.bfloat16, seed=60 + t, routing=routing)
    assert_close(run_kernel(pb), reference(pb), RTOL[torch.bfloat16])


@pytest.mark.parametrize("t, k, i, i_s", [(6, 4, 40, 24), (20, 2, 24, 40)], ids=["Is<I", "T=20"])
def test_kernel_shared_expert_shapes(t, k, i, i_s):
    # A shared expert narrower than the routed ones (its CTAs skip column tiles past Is), and
    # T = 20 tokens: two shared-expert CTAs of 16 token rows.
    pb = make_problem(t, torch.float32, seed=65 + t, k=k, i=i, i_s=i_s)
    assert_close(run_kernel(pb), reference(pb), RTOL[torch.float32])


def test_kernel_align_fallback_path_agrees():
    # The multi-launch align path forced at 30 pairs gives the same bits.
    pb = make_problem(6, torch.bfloat16, seed=70, routing="pool")
    assert torch.equal(run_kernel(pb, max_single_launch=0), run_kernel(pb))


@pytest.mark.parametrize("shared, config", [(True, None), (False, None), (True, SPLIT_CONFIGS[1])],
                         ids=["shared", "no-shared", "split-k"])
def test_kernel_one_token_slot_layout_equals_aligned(shared, config):
    # One token runs without moe_align (block j = slot j, ids read from topk_ids, here with a
    # non-unit stride): the same bits as the aligned layout, and the reference.
    pb = make_problem(1, torch.bfloat16, seed=72, shared=shared, h=96 if config else SMALL["h"])
    pb["topk_ids"] = _strided(pb["topk_ids"])
    got = run_kernel(pb, config)
    assert torch.equal(got, run_kernel(pb, config, align_one_token=True))
    assert_close(got, reference(pb), RTOL[torch.bfloat16])


def test_kernel_one_token_repeated_expert_ids():
    # The op takes any topk_ids: a token naming one expert in several slots gets one block per
    # slot on the slot layout (the expert read twice), the aligned layout one block of several
    # rows; both equal the reference, to the bit with each other.
    pb = make_problem(1, torch.float32, seed=74)
    pb["topk_ids"] = torch.tensor([[3, 9, 3, 3]], dtype=torch.int32, device=pb["x"].device)
    got = run_kernel(pb)
    assert torch.equal(got, run_kernel(pb, align_one_token=True))
    assert_close(got, reference(pb), RTOL[torch.float32])


def test_kernel_one_token_slot_layout_launches_no_align(monkeypatch):
    calls = []
    real = experts_kernel.moe_align_triton
    monkeypatch.setattr(experts_kernel, "moe_align_triton", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    run_kernel(make_problem(1, torch.float32, seed=73))
    assert calls == []
    run_kernel(make_problem(2, torch.float32, seed=73))
    assert calls == [1]


def test_kernel_empty_batch():
    pb = make_problem(0, torch.float32, seed=71)
    assert run_kernel(pb).shape == (0, SMALL["h"])


# ----------------------------------------------------------------------------------------------
# Batch invariance: each token's output bitwise equal to its own T = 1 output, T = 1..8.


def _batch_invariance(fn, pb):
    singles = [fn({**pb, "x": pb["x"][i : i + 1].clone(), "topk_ids": pb["topk_ids"][i : i + 1].clone(),
                   "topk_weights": pb["topk_weights"][i : i + 1].clone()}) for i in range(8)]
    singles = torch.cat(singles)
    for t in range(2, 9):
        sub = {**pb, "x": pb["x"][:t], "topk_ids": pb["topk_ids"][:t], "topk_weights": pb["topk_weights"][:t]}
        assert torch.equal(fn(sub), singles[:t]), f"rows of a T={t} call differ from T=1 calls"


def test_kernel_batch_invariant():
    # 'pool' routing: tokens share experts, so a token's row position in its blocks changes with T.
    _batch_invariance(run_kernel, make_problem(8, torch.bfloat16, seed=80, routing="pool"))


def test_kernel_batch_invariant_split_k():
    # The in-launch split-K reduction sums in chunk order whichever chunk finishes last.
    pb = make_problem(8, torch.bfloat16, seed=81, routing="pool", h=96)
    one = lambda i: {**pb, **{n: pb[n][i : i + 1] for n in ("x", "topk_ids", "topk_weights")}}  # noqa: E731
    singles = torch.cat([run_kernel(one(i), SPLIT_CONFIGS[1]) for i in range(8)])
    assert torch.equal(run_kernel(pb, SPLIT_CONFIGS[1]), singles)


def test_kernel_batch_invariant_up_loop_design():
    # The tile loop sums its tiles in order and the split-K partials in chunk order, for any T.
    pb = make_problem(8, torch.bfloat16, seed=82, routing="pool", h=96)
    _batch_invariance(lambda p: run_kernel(p, LOOP_CONFIGS[0]), pb)


def test_kernel_batch_invariant_gated_shared_expert():
    # Each token's sigmoid(x . w) is its own row's reduction: the same bits at any T.
    _batch_invariance(run_kernel, make_problem(8, torch.bfloat16, seed=83, routing="pool", gated=True))


def test_reference_batch_invariant():
    _batch_invariance(reference, make_problem(8, torch.bfloat16, seed=82, routing="pool", device="cpu"))


# ----------------------------------------------------------------------------------------------
# The reference against the eager formulation (so the kernel is never checked against itself).


@pytest.mark.parametrize("shared, gated", [(True, False), (False, False), (True, True)],
                         ids=["shared", "no-shared", "gated-shared"])
def test_reference_matches_eager_formulation(shared, gated):
    pb = make_problem(6, torch.float32, seed=90, shared=shared, device="cpu", gated=gated)
    assert_close(reference(pb), eager_moe(pb), 1e-6)
    # bf16: the eager path rounds every expert output to bf16 first (declared numerics): close,
    # not equal.
    pb = make_problem(6, torch.bfloat16, seed=90, shared=shared, device="cpu", gated=gated)
    ref, eager = reference(pb), eager_moe(pb)
    assert_close(ref, eager, 1e-2)
    assert not torch.equal(ref, eager)


# ----------------------------------------------------------------------------------------------
# Broken variants must fail the comparison.


def test_swapped_gate_and_up_is_caught():
    pb = make_problem(6, torch.float32, seed=100)
    ref = reference(pb)
    with pytest.raises(AssertionError, match="relative RMS error"):
        assert_close(run_kernel({**pb, "w_gate": pb["w_up"], "w_up": pb["w_gate"]}), ref, RTOL[torch.float32])


def test_ignored_routing_weights_are_caught():
    pb = make_problem(6, torch.float32, seed=101)
    ref = reference(pb)
    with pytest.raises(AssertionError, match="relative RMS error"):
        assert_close(run_kernel({**pb, "topk_weights": torch.ones_like(pb["topk_weights"])}), ref,
                     RTOL[torch.float32])


def test_split_k_reduction_never_elected_is_caught():
    # A ticket left far from zero (e.g. by a kernel that forgot to reset it) means no chunk draws
    # the last ticket: activations stay unwritten (NaN) and the output shows it. (Left at 1, the
    # second of three chunks would reduce early: NaN on the interpreter, which runs the chunks in
    # order, but on a GPU the third chunk's partial is often already stored and nothing shows.)
    pb = make_problem(1, torch.float32, seed=102, h=96)
    tickets = split_k_tickets(pb["x"].device, 1)
    try:
        tickets[:4096] = 1 << 20
        with pytest.raises(AssertionError, match="non-finite"):
            assert_close(run_kernel(pb, SPLIT_CONFIGS[0]), reference(pb), RTOL[torch.float32])
    finally:
        tickets.zero_()


def test_wrong_align_layout_is_caught(monkeypatch):
    # moe_align output with two pairs of different routed experts swapped: rows go to the wrong
    # expert.
    pb = make_problem(6, torch.float32, seed=103)
    real = experts_kernel.moe_align_triton

    def swapped(*args, **kw):
        sorted_ids, block_experts, total = real(*args, **kw)
        a, b = 0, BLOCK_M                                   # first slots of blocks 0 and 1
        assert block_experts[0] != block_experts[1] and int(total[0]) > 2 * BLOCK_M
        sorted_ids[a], sorted_ids[b] = sorted_ids[b].clone(), sorted_ids[a].clone()
        return sorted_ids, block_experts, total

    monkeypatch.setattr(experts_kernel, "moe_align_triton", swapped)
    with pytest.raises(AssertionError, match="relative RMS error"):
        assert_close(run_kernel(pb), reference(pb), RTOL[torch.float32])


# ----------------------------------------------------------------------------------------------
# The op.


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_op_cpu_path_is_the_reference(dtype):
    pb = make_problem(6, dtype, seed=110, device="cpu")
    out = torch.ops.lingc.moe_experts(*args_of(pb))
    assert out.shape == (6, SMALL["h"]) and out.dtype == dtype
    assert torch.equal(out, reference(pb))
    assert torch.equal(moe_experts(*args_of(pb)), out)  # the package's handle is the same op
    no_shared = make_problem(2, dtype, seed=111, shared=False, device="cpu")
    assert torch.equal(torch.ops.lingc.moe_experts(*args_of(no_shared)), reference(no_shared))


def test_op_schema_fake_and_opcheck():
    assert str(torch.ops.lingc.moe_experts.default._schema) == (
        "lingc::moe_experts(Tensor x, Tensor topk_ids, Tensor topk_weights, Tensor w_gate, Tensor w_up, "
        "Tensor w_down, Tensor? shared_gate, Tensor? shared_up, Tensor? shared_down, float limit, "
        "float shared_limit, Tensor? shared_sigmoid=None) -> Tensor"
    )
    pb = make_problem(3, torch.bfloat16, seed=112, device="cpu")
    with FakeTensorMode() as mode:
        out = torch.ops.lingc.moe_experts(*(mode.from_tensor(a) if torch.is_tensor(a) else a for a in args_of(pb)))
    assert out.shape == (3, SMALL["h"]) and out.dtype == torch.bfloat16
    torch.library.opcheck(torch.ops.lingc.moe_experts, args_of(pb))
    torch.library.opcheck(torch.ops.lingc.moe_experts, args_of(make_problem(2, torch.float32, seed=113, shared=False,
                                                                            device="cpu")))
    gated = make_problem(2, torch.float32, seed=114, gated=True, device="cpu")
    torch.library.opcheck(torch.ops.lingc.moe_experts, args_of(gated), {"shared_sigmoid": gated["shared_sigmoid"]})
    assert torch.equal(torch.ops.lingc.moe_experts(*args_of(gated), shared_sigmoid=gated["shared_sigmoid"]),
                       reference(gated))


def test_op_registration_is_idempotent():
    import lingc.runtime.kernels.moe_experts.op as op_module

    importlib.reload(op_module)
    assert hasattr(torch.ops.lingc, "moe_experts")


def _bad_cases():
    pb = make_problem(2, torch.float32, seed=120, device="cpu")
    sig = torch.randn(1, pb["x"].shape[1])
    e, i, h = pb["w_gate"].shape
    w13_t = torch.zeros(e, h, 2 * i).transpose(1, 2)  # [E, 2I, H] with stride 2I along H
    return [
        ("x 1-d", dict(x=pb["x"][0]), r"x must be \[T, H\] \(2-d\), got shape \(64,\)"),
        ("x int", dict(x=pb["x"].int()), "x.dtype must be bfloat16, float16 or float32, got torch.int32"),
        ("ids int64", dict(topk_ids=pb["topk_ids"].long()),
         "topk_ids.dtype must be int32 .*moe_router.* got torch.int64; convert with topk_ids.int()"),
        ("ids rows", dict(topk_ids=pb["topk_ids"][:1]), r"topk_ids must be \[T=2, k\] with k >= 1, got shape \(1, 4\)"),
        ("weights shape", dict(topk_weights=pb["topk_weights"][:, :3]),
         r"topk_weights must have topk_ids' shape \(2, 4\), got \(2, 3\)"),
        ("weights dtype", dict(topk_weights=pb["topk_weights"].double()),
         "topk_weights.dtype must be float32, got torch.float64"),
        ("w_gate 2-d", dict(w_gate=pb["w_gate"][0]), r"w_gate must be \[E, I, H\] \(3-d\)"),
        ("H mismatch", dict(w_gate=pb["w_gate"][..., :32], w_up=pb["w_up"][..., :32]),
         "H mismatch, x has H=64 but w_gate has H=32"),
        ("w_up shape", dict(w_up=pb["w_up"][:, :20]), r"w_up must have w_gate's shape \(16, 24, 64\)"),
        ("w_down shape", dict(w_down=pb["w_down"].transpose(1, 2)), r"w_down must be \[E, H, I\] = \(16, 64, 24\)"),
        ("dtype mismatch", dict(w_down=pb["w_down"].bfloat16()), "x is torch.float32 but w_down is torch.bfloat16"),
        ("H stride", dict(w_gate=w13_t[:, :i], w_up=w13_t[:, i:]), "w_gate must have unit stride along H"),
        ("I stride", dict(w_down=torch.zeros(e, i, h).transpose(1, 2)), "w_down must have unit stride along I"),
        ("partial shared", dict(shared_down=None), "given together or all be None, got tensor/tensor/None"),
        ("shared H", dict(shared_gate=pb["shared_gate"][:, :32]), r"shared_gate must be \[Is, H=64\]"),
        ("shared_down", dict(shared_down=pb["shared_down"][:, :8]), r"shared_down must be \[H, Is\] = \(64, 40\)"),
        ("limit", dict(limit=-1.0), r"limit must be a finite number >= 0 \(0 = no clamp\), got -1.0"),
        ("shared_limit", dict(shared_limit=float("nan")), "shared_limit must be a finite number >= 0"),
        ("gate without shared", dict(shared_gate=None, shared_up=None, shared_down=None, shared_sigmoid=sig),
         "shared_sigmoid scales the shared expert, but no shared expert was given"),
        ("gate shape", dict(shared_sigmoid=sig[0]), r"shared_sigmoid must be \[1, H=64\] \(a Linear\(H, 1\) weight\), "
                                                     r"got shape \(64,\)"),
        ("gate dtype", dict(shared_sigmoid=sig.double()), "x is torch.float32 but shared_sigmoid is torch.float64"),
        ("gate stride", dict(shared_sigmoid=torch.zeros(64, 2)[:, :1].T), "shared_sigmoid must have unit stride along H"),
    ], pb


@pytest.mark.parametrize("case", range(22))
def test_op_rejects_bad_arguments(case):
    cases, pb = _bad_cases()
    _, change, message = cases[case]
    p = {**pb, **change}
    args = args_of(p)
    kw = {"shared_sigmoid": p["shared_sigmoid"]} if p.get("shared_sigmoid") is not None else {}
    with pytest.raises(ValueError, match=message):
        torch.ops.lingc.moe_experts(*args, **kw)
    with FakeTensorMode() as mode, pytest.raises(ValueError, match=message):
        torch.ops.lingc.moe_experts(*(mode.from_tensor(a) if torch.is_tensor(a) else a for a in args),
                                    **{k: mode.from_tensor(v) for k, v in kw.items()})


def test_config_is_a_function_of_shape_only():
    assert config_for(192, 2560) == config_for(192, 2560)
    for n, h in [(24, 64), (40, 96), (192, 2560), (768, 2560), (100, 3000)]:
        c = config_for(n, h)
        assert 2 * c.block_n >= 16 and c.block_h >= 16 and c.split_k >= 1


# ----------------------------------------------------------------------------------------------
# sm_90 compile check (no GPU needed): no spills, 16-byte weight loads, down-GEMM weights before
# griddepcontrol.wait.

_COMPILE_CHECK = textwrap.dedent("""
    import os, re, triton
    os.environ["LINGC_PDL_TRIGGER"] = TRIGGER
    from sm90 import compile_sm90, divisible_by_16, signature
    from lingc.runtime.kernels.moe_experts.kernel import (_moe_up_kernel, _moe_down_kernel, config_for, BLOCK_M,
                                                          COMBINE_T)
    V4 = r"ld\\.global(\\.\\w+)*\\.v4"

    def max_loads_before_a_wait(ptx):
        # 16-byte loads in the basic block (from its label) that ends in a griddepcontrol.wait,
        # the most over the waits (the up-GEMM has one wait on each of its two paths).
        blocks = [re.split(r"\\n[$]L__BB\\w+:", seg)[-1] for seg in ptx.split("griddepcontrol.wait")[:-1]]
        return max(len(re.findall(V4, b)) for b in blocks)

    def build(fn, ptrs, ints, floats, const, warps, maxnreg=0):
        # Pointers 16-byte aligned, integer arguments divisible by 16 (what the launcher's
        # specialisation sees at H = 2560 with the model's strides), except the counts.
        attrs = divisible_by_16(fn, [n for n in list(ptrs) + ints if n not in ("T", "P", "NB", "NSB", "stride_wt")])
        ptx, info = compile_sm90(fn, signature(fn, ptrs, ints, floats), const, attrs, num_warps=warps,
                                 maxnreg=maxnreg or None)
        assert " 0 bytes spill stores" in info, info
        assert "griddepcontrol.wait" in ptx and "griddepcontrol.launch_dependents" in ptx
        return ptx, info

    for n_max, h, slot in ((192, 2560, False), (768, 2560, False), (192, 2560, True), (128, 2048, False),
                           (128, 2048, True)):
        # slot: one token's slot layout (no moe_align launch; ids read from the router's output);
        # (128, 2048): Qwen3-Next-80B on one GPU of four
        cfg = config_for(n_max, h)
        # (the values of T, P and NB are not specialised: do_not_specialize)
        chunk = triton.next_power_of_2(triton.cdiv(h, cfg.split_k))
        b = "*bf16"
        ptrs = dict(x_ptr=b, sorted_ptr="*i32", block_expert_ptr="*i32", ids_ptr="*i32", wg_ptr=b, wu_ptr=b,
                    sg_ptr=b, su_ptr=b, act_ptr=b, ws_ptr="*fp32", ticket_ptr="*i32")
        ints = ["T", "P", "NB", "NSB", "H", "I", "IS", "stride_xt", "stride_ge", "stride_gn", "stride_ue", "stride_un",
                "stride_sgn", "stride_sun", "stride_act", "stride_ws_s", "stride_ws_p"]
        const = dict(stride_xh=1, stride_ik=1, NUM_EXPERTS=512, TOP_K=8, PAIRS_PER_TOKEN=9, BLOCK_M=BLOCK_M,
                     BLOCK_N=cfg.block_n, CHUNK_K=chunk, SPLIT_K=triton.cdiv(h, chunk),
                     N_TILES=triton.cdiv(n_max, cfg.block_n), HAS_LIMIT=True, SLOT_BLOCKS=slot, K_TILE=cfg.block_k,
                     DOT_PRECISION="tf32", DOT_UPCAST=False, USE_GDC=True)
        ptx, info = build(_moe_up_kernel, ptrs, ints, ["limit", "shared_limit"], const, cfg.up_warps, cfg.up_maxnreg)
        # Each of the two paths waits, then releases the down-GEMM (which reads moe_align's
        # output before its own wait), whatever LINGC_PDL_TRIGGER says.
        order = re.findall(r"griddepcontrol\\.(wait|launch_dependents)", ptx)
        assert order == ["wait", "launch_dependents"] * 2, order
        # The whole weight chunk in 16-byte loads (2*block_n x chunk bf16 over the CTA's threads),
        # the shared expert's before the wait.
        tile_loads = 2 * cfg.block_n * chunk * 2 // 16 // (32 * cfg.up_warps)
        assert max_loads_before_a_wait(ptx) >= tile_loads, ptx[-3000:]
        assert len(re.findall(V4, ptx)) >= 2 * tile_loads, ptx[-3000:]
        print("up", n_max, slot, [l for l in info.splitlines() if "registers" in l])
        ptrs = dict(act_ptr=b, sorted_ptr="*i32", block_expert_ptr="*i32", total_ptr="*i32", ids_ptr="*i32",
                    wd_ptr=b, sd_ptr=b, y_ptr="*fp32", topk_w_ptr="*fp32", out_ptr=b, ticket_ptr="*i32",
                    x_ptr=b, ssig_ptr=b)
        ints = ["T", "P", "H", "I", "IS", "stride_act", "stride_de", "stride_dh", "stride_sdh", "stride_y",
                "stride_wt", "stride_ot", "stride_xt"]
        # gated: a shared expert behind a sigmoid gate (Qwen3-Next's), reduced in the combine.
        for gated in (False, True):
            const = dict(stride_wk=1, stride_oh=1, stride_ik=1, stride_xh=1, NUM_EXPERTS=512, TOP_K=8,
                         PAIRS_PER_TOKEN=9, HAS_SHARED=True, BLOCK_M=BLOCK_M, BLOCK_H=cfg.block_h,
                         KPAD=triton.next_power_of_2(n_max), COMBINE_T=COMBINE_T, SLOT_BLOCKS=slot,
                         SHARED_SIGMOID=gated, SIG_CHUNK=512, DOT_PRECISION="tf32", DOT_UPCAST=False, USE_GDC=True)
            down_warps = (cfg.down_warps_one_token or cfg.down_warps) if slot else cfg.down_warps
            ptx, info = build(_moe_down_kernel, ptrs, ints, [], const, down_warps, cfg.down_maxnreg)
            tile_loads = cfg.block_h * triton.next_power_of_2(n_max) * 2 // 16 // (32 * down_warps)
            assert max_loads_before_a_wait(ptx) >= tile_loads, ptx[-3000:]
            # moe_align's outputs from L2 before the wait: total_padded and the block's expert id,
            # and in the align layout its pairs too (more than those two scalar loads).
            align_reads = len(re.findall(r"ld\\.global\\.cg\\.b32", ptx.split("griddepcontrol.wait")[0]))
            assert align_reads > 2 if not slot else align_reads >= 1, (slot, align_reads)
            print("down", n_max, slot, gated, [l for l in info.splitlines() if "registers" in l])

    # The loop design (block_k 128, 4 stages; chunk 1280 = 10 tiles): the tile loop is pipelined
    # (cp.async into shared memory), both paths wait then release, no spills.
    ptrs = dict(x_ptr=b, sorted_ptr="*i32", block_expert_ptr="*i32", ids_ptr="*i32", wg_ptr=b, wu_ptr=b,
                sg_ptr=b, su_ptr=b, act_ptr=b, ws_ptr="*fp32", ticket_ptr="*i32")
    ints = ["T", "P", "NB", "NSB", "H", "I", "IS", "stride_xt", "stride_ge", "stride_gn", "stride_ue", "stride_un",
            "stride_sgn", "stride_sun", "stride_act", "stride_ws_s", "stride_ws_p"]
    const = dict(stride_xh=1, stride_ik=1, NUM_EXPERTS=512, TOP_K=8, PAIRS_PER_TOKEN=9, BLOCK_M=BLOCK_M,
                 BLOCK_N=32, CHUNK_K=1280, SPLIT_K=2, N_TILES=6, HAS_LIMIT=True, SLOT_BLOCKS=False, K_TILE=128,
                 DOT_PRECISION="tf32", DOT_UPCAST=False, USE_GDC=True)
    attrs = divisible_by_16(_moe_up_kernel, [n for n in list(ptrs) + ints if n not in ("T", "P", "NB", "NSB")])
    ptx, info = compile_sm90(_moe_up_kernel, signature(_moe_up_kernel, ptrs, ints, ["limit", "shared_limit"]),
                             const, attrs, num_warps=4, num_stages=4)
    assert " 0 bytes spill stores" in info, info
    assert "cp.async" in ptx, "the tile loop is not pipelined"
    assert re.findall(r"griddepcontrol\\.(wait|launch_dependents)", ptx) == ["wait", "launch_dependents"] * 2
    print("up loop", [l for l in info.splitlines() if "registers" in l])
""")


_GEMV_COMPILE_CHECK = textwrap.dedent("""
    import re
    from sm90 import compile_sm90, divisible_by_16, signature
    from lingc.runtime.kernels.moe_experts.up_gemv_kernel import _moe_up_gemv_kernel as fn
    ptrs = dict(x_ptr="*bf16", sorted_ptr="*i32", block_expert_ptr="*i32", ids_ptr="*i32", wg_ptr="*bf16",
                wu_ptr="*bf16", sg_ptr="*bf16", su_ptr="*bf16", act_ptr="*bf16")
    ints = ["T", "P", "NB", "NSB", "H", "I", "IS", "stride_xt", "stride_ik", "stride_ge", "stride_gn", "stride_ue",
            "stride_un", "stride_sgn", "stride_sun", "stride_act"]
    aligned = [n for n in list(ptrs) + ints if n not in ("T", "P", "NB", "NSB", "stride_ik")]
    for cols, warps in ((2, 4), (1, 2), (4, 8)):
        for slot in (False, True):
            const = dict(stride_xh=1, NUM_EXPERTS=512, TOP_K=8, PAIRS_PER_TOKEN=9, BLOCK_M=16, COLS=cols, K1=2048,
                         K2=512, HAS_LIMIT=True, SLOT_BLOCKS=slot, USE_GDC=True)
            ptx, info = compile_sm90(fn, signature(fn, ptrs, ints, ["limit", "shared_limit"]), const,
                                     divisible_by_16(fn, aligned), num_warps=warps)
            assert " 0 bytes spill stores" in info, info
            # The shared expert's rows, 16-byte loads, requested before the wait (the first
            # wait in the PTX is the shared path's; the routed path waits first).
            before = ptx.split("griddepcontrol.wait")[0]
            assert len(re.findall(r"ld\\.global\\.cg(\\.\\w+)*\\.v4", before)) == 10, (cols, warps)
            print(cols, warps, slot, re.findall(r"Used \\d+ registers", info))
""")


def test_up_gemv_kernel_compiles_for_sm90_without_spills():
    # H = 2560 whole (2048 + 512) over 2 * cols rows: 10 16-byte weight loads a thread, ~122
    # registers, no spills, at the sweep's three 20-load shapes.
    run_sm90_compile_check(_GEMV_COMPILE_CHECK)


@pytest.mark.parametrize("trigger", ["late", "early"])
def test_kernels_compile_for_sm90_without_spills(trigger):
    # The real (non-interpreted) compile for an H200 at the table's shapes with the bundled ptxas,
    # in both PDL trigger placements (runtime/pdl.py).
    run_sm90_compile_check(f"TRIGGER = {trigger!r}\n" + _COMPILE_CHECK)


# ----------------------------------------------------------------------------------------------
# GPU: flash-tp4-rank shapes (E = 512, H = 2560, I = Is = 192, k = 8), batch invariance, PDL.

FLASH_TP4 = dict(e=512, h=2560, i=192, i_s=192, k=8)


def _gpu_problem(t, seed, **kw):
    return make_problem(t, torch.bfloat16, seed, **{**FLASH_TP4, **kw})


def _gpu_reference(pb):
    return moe_experts_reference(*args_of(pb))  # on the device: per-token fp32 products


@pytest.mark.gpu
@pytest.mark.parametrize("limits", [(0.0, 0.0), (4.0, 7.0)], ids=["no-clamp", "clamp"])
@pytest.mark.parametrize("t", [1, 2, 6, 8])
def test_gpu_flash_tp4_rank_matches_reference(t, limits):
    pb = _gpu_problem(t, seed=200 + t, limits=limits)
    out = run_kernel(pb)
    assert_close(out, _gpu_reference(pb), RTOL_GPU_BF16)
    assert torch.equal(torch.ops.lingc.moe_experts(*args_of(pb)), out)
    # The interleaved layout of the same values reads the same bits.
    assert torch.equal(run_kernel(_gpu_problem(t, seed=200 + t, limits=limits, layout="interleaved")), out)


# Qwen3-Next-80B's MoE on one GPU of four: 512 experts, top-10, H = 2048, I = Is = 512 / 4, the
# shared expert behind its sigmoid gate.
QWEN3_NEXT_TP4 = dict(e=512, h=2048, i=128, i_s=128, k=10)


@pytest.mark.gpu
@pytest.mark.parametrize("t", [1, 2, 6, 8])
def test_gpu_qwen3_next_gated_shared_expert(t):
    pb = _gpu_problem(t, seed=220 + t, gated=True, **QWEN3_NEXT_TP4)
    out = run_kernel(pb)
    sig = pb["shared_sigmoid"]
    assert_close(out, moe_experts_reference(*args_of(pb), shared_sigmoid=sig), RTOL_GPU_BF16)
    assert torch.equal(torch.ops.lingc.moe_experts(*args_of(pb), shared_sigmoid=sig), out)


@pytest.mark.gpu
def test_gpu_qwen3_next_gated_batch_invariant():
    _batch_invariance(run_kernel, _gpu_problem(8, seed=230, gated=True, routing="same", **QWEN3_NEXT_TP4))


@pytest.mark.gpu
@pytest.mark.parametrize("t", [1, 6])
def test_gpu_full_flash_intermediate(t):
    # I = Is = 768 (the un-sharded model) with the table's 768 entry.
    pb = _gpu_problem(t, seed=210 + t, i=768, i_s=768, e=64)
    assert_close(run_kernel(pb), _gpu_reference(pb), RTOL_GPU_BF16)


@pytest.mark.gpu
@pytest.mark.parametrize("t", [1, 6])
def test_gpu_register_caps_keep_the_bits(t):
    # A register cap changes residency, not arithmetic: the table's capped config gives the bits
    # of the same config without caps.
    pb = _gpu_problem(t, seed=215 + t)
    cfg = config_for(192, 2560)
    uncapped = dataclasses.replace(cfg, up_maxnreg=0, down_maxnreg=0)
    capped = dataclasses.replace(cfg, up_maxnreg=96, down_maxnreg=80)
    out = run_kernel(pb, uncapped)
    assert torch.equal(run_kernel(pb, capped), out)
    assert_close(out, _gpu_reference(pb), RTOL_GPU_BF16)


def test_config_rejects_bad_warp_counts():
    base = config_for(192, 2560)
    for field, bad in (("down_warps_one_token", 3), ("down_warps_one_token", -1), ("up_warps", 0),
                       ("down_warps", 32)):
        with pytest.raises(ValueError, match=field):
            dataclasses.replace(base, **{field: bad})
    assert dataclasses.replace(base, down_warps_one_token=0).down_warps_one_token == 0


def test_one_token_down_warps_keep_the_bits():
    # The one-token down-GEMM's own warp count changes who computes which output columns, not
    # the sums: the same output under the interpreter (the GPU test compares bits).
    pb = make_problem(1, torch.bfloat16, seed=217)
    cfg = config_for(40, 64)
    outs = [run_kernel(pb, dataclasses.replace(cfg, down_warps_one_token=w)) for w in (0, 2, 8)]
    assert all(torch.equal(o, outs[0]) for o in outs[1:])
    assert_close(outs[0], reference(pb), RTOL[torch.bfloat16])


def test_register_caps_are_dropped_by_the_interpreter():
    # Under TRITON_INTERPRET the launch option does not exist: the launcher leaves it out.
    pb = make_problem(6, torch.bfloat16, seed=216)
    cfg = dataclasses.replace(config_for(40, 64), up_maxnreg=96, down_maxnreg=80)
    assert_close(run_kernel(pb, cfg), reference(pb), RTOL[torch.bfloat16])


# The loop design at flash-tp4-rank's shapes (moe_sweep --set loop times these).
GPU_LOOP_CONFIGS = [
    MoeExpertsConfig(block_n=32, split_k=2, up_warps=4, block_h=64, down_warps=4, block_k=128, up_stages=4),
    MoeExpertsConfig(block_n=32, split_k=5, up_warps=4, block_h=64, down_warps=4, block_k=64, up_stages=4),
    # moe_sweep --set narrow: 8 columns, H whole (no split-K ticket).
    MoeExpertsConfig(block_n=8, split_k=1, up_warps=4, block_h=128, down_warps=4, block_k=256, up_stages=4),
]


@pytest.mark.gpu
@pytest.mark.parametrize("config", GPU_LOOP_CONFIGS, ids=["bn32-s2-bk128", "bn32-s5-bk64", "bn8-s1-bk256"])
def test_gpu_up_loop_design(config):
    # Against the reference at T = 1 and 6, and each token's bits those of its T = 1 call.
    for t in (1, 6):
        pb = _gpu_problem(t, seed=218 + t)
        assert_close(run_kernel(pb, config), _gpu_reference(pb), RTOL_GPU_BF16)
    _batch_invariance(lambda p: run_kernel(p, config), _gpu_problem(8, seed=221, routing="pool"))


# The up-GEMM on CUDA cores at flash-tp4-rank's shapes (moe_sweep --set gemv times these).
GPU_GEMV_CONFIGS = [
    MoeExpertsConfig(block_n=c, split_k=1, up_warps=w, block_h=128, down_warps=4, up_gemv=True)
    for c, w in ((2, 4), (1, 2), (4, 8))
]
# Configs with the table's H chunks (moe_sweep --set chunk times them): the same bits claimed.
GPU_SAME_CHUNK_CONFIGS = [
    MoeExpertsConfig(block_n=64, split_k=10, up_warps=4, block_h=128, down_warps=8, block_k=128, up_stages=2),
    MoeExpertsConfig(block_n=16, split_k=10, up_warps=4, block_h=32, down_warps=4),
    MoeExpertsConfig(block_n=64, split_k=10, up_warps=8, block_h=256, down_warps=8),
    # The table's one-token down-GEMM with down_warps instead of down_warps_one_token.
    dataclasses.replace(config_for(192, 2560), down_warps_one_token=0),
]


@pytest.mark.gpu
@pytest.mark.parametrize("config", GPU_GEMV_CONFIGS, ids=["c2-w4", "c1-w2", "c4-w8"])
def test_gpu_up_gemv(config):
    # The up-GEMM on CUDA cores at flash-tp4-rank's shapes: against the reference at T = 1, 6
    # and 8, and each token's bits those of its T = 1 call (shared experts across tokens).
    for t in (1, 6, 8):
        pb = _gpu_problem(t, seed=250 + t, routing="pool" if t > 1 else "random")
        assert_close(run_kernel(pb, config), _gpu_reference(pb), RTOL_GPU_BF16)
    _batch_invariance(lambda p: run_kernel(p, config), _gpu_problem(8, seed=259, routing="pool"))


def test_up_chunks_decide_the_bits():
    # The launcher's H chunks: a power of two per one-load CTA, whole block_k tiles in the loop
    # design; the swept "same chunks" variants all share the table's.
    from benchmarks.moe_sweep import candidates
    base = config_for(192, 2560)
    assert up_chunks(base, 2560) == (256, 10)
    assert all(up_chunks(c, 2560) == (256, 10) for c in GPU_SAME_CHUNK_CONFIGS)
    assert up_chunks(dataclasses.replace(base, split_k=2, block_k=128), 2560) == (1280, 2)
    assert up_chunks(dataclasses.replace(base, split_k=5, block_k=64), 2560) == (512, 5)
    chunk = candidates(192, 2560, "chunk")
    assert chunk[0] == base and len(chunk) > 8
    assert all(up_chunks(c, 2560) == up_chunks(base, 2560) for c in chunk)


@pytest.mark.gpu
@pytest.mark.parametrize("t", [1, 6, 8])
def test_gpu_same_chunks_same_bits(t):
    # Column tile, load design (one load or a tile loop) and the down-GEMM's tile do not change
    # a token's bits while the H chunks are the table's: every output equals the table's.
    pb = _gpu_problem(t, seed=240 + t, routing="pool")
    base = run_kernel(pb, config_for(192, 2560))
    for cfg in GPU_SAME_CHUNK_CONFIGS:
        assert torch.equal(run_kernel(pb, cfg), base), cfg


@pytest.mark.gpu
@pytest.mark.parametrize("routing", ["random", "pool"])
def test_gpu_batch_invariant(routing):
    _batch_invariance(run_kernel, _gpu_problem(8, seed=220, routing=routing))


@pytest.mark.gpu
@pytest.mark.parametrize("t", [1, 6])
@pytest.mark.parametrize("disable_pdl", [False, True], ids=["pdl", "no-pdl"])
def test_gpu_router_experts_chain_under_graph_capture(disable_pdl, t, monkeypatch):
    # T = 1 runs the slot layout: the down-GEMM reads the router's ids before its wait.
    if disable_pdl:
        monkeypatch.setenv("LINGC_DISABLE_PDL", "1")
    elif not pdl_supported(DEVICE):
        pytest.skip("PDL needs compute capability >= 9")
    pb = _gpu_problem(t, seed=230)
    gen = torch.Generator(device=DEVICE).manual_seed(231)
    gate_w = (torch.randn(512, 2560, generator=gen, device=DEVICE) / 2560**0.5).to(torch.bfloat16)
    bias = 0.1 * torch.randn(512, generator=gen, device=DEVICE)
    x = pb["x"].clone()

    def step():
        ids, w = torch.ops.lingc.moe_router(x, gate_w, bias, 8, 4, 8, 2.5, True)
        return ids, w, torch.ops.lingc.moe_experts(x, ids, w, *args_of(pb)[3:])

    eager = step()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph(keep_graph=True)
    with torch.cuda.graph(graph):
        captured = step()
    # router logits, router selection, moe_align (not for one token), up-GEMM, down-GEMM: four
    # edges (three), programmatic with PDL.
    assert graph_edge_types(graph) == [0 if disable_pdl else 1] * (4 if t > 1 else 3)
    graph.instantiate()
    for seed in (232, 233):
        x.copy_(_gpu_problem(t, seed=seed)["x"])
        graph.replay()
        fresh = step()
        torch.cuda.synchronize()
        assert all(torch.equal(a, b) for a, b in zip(captured, fresh))
        ref = _gpu_reference({**pb, "x": x, "topk_ids": fresh[0], "topk_weights": fresh[1]})
        assert_close(captured[2], ref, RTOL_GPU_BF16)
    assert not torch.equal(eager[2], captured[2])
