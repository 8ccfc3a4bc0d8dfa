"""lingc.kda_chain_normed: the KDA chain with KDA's gated output norm fused into its end.

The chain's state, windows and stages are the plain chain kernel's, bit for bit (the same code
path); y is the gated norm of the chain's o as lingc.gated_head_rmsnorm's kernel computes it,
checked against that kernel run on the fused kernel's own o rows (one launch's o is its scratch
buffer, so the test reruns the plain chain for it). Fresh random inputs, y NaN-poisoned so an
unwritten element fails; several v-blocks (the head's ticket runs), one v-block (no ticket), a
masked head dim; persistent and staged modes, both state layouts, the norm's 16-bit forms. On the
CPU under the interpreter at small shapes; with -m gpu at flash-tp4-rank's (H = 8, K = V = 128).
"""
import textwrap

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from helpers import run_sm90_compile_check
from test_kda_kernel import DEVICE, LOWER_BOUND, W, make_inputs, ref_args

from lingc.runtime.kernels.kda import kda_chain, kda_chain_normed
from lingc.runtime.kernels.kda.kernel import KdaConfig, _tickets, kda_chain_triton
from lingc.runtime.kernels.norms.kernel import gated_head_rmsnorm_triton

EPS = 1e-6


def norm_inputs(T, H, V, dtype, seed):
    """A gate as a strided column window of a wider projection output (as the fused projection's
    g slice) and a norm weight."""
    gen = torch.Generator().manual_seed(seed)
    wide = torch.randn(T, H * V + 7, generator=gen).to(dtype=dtype, device=DEVICE)
    gate = wide[:, 3:3 + H * V].view(T, H, V)
    weight = (1 + 0.2 * torch.randn(V, generator=gen)).to(dtype=dtype, device=DEVICE)
    return gate, weight


def run_both(x, staged, config, gate, weight, out_dtype, round_steps=False, round_before_weight=False,
             state_vk=False):
    """(fused: y, state, window, stages), (plain chain then the gated norm kernel: the same)."""
    T, (H, K, V) = x["q_raw"].shape[0], x["state"].shape
    runs = []
    for fused in (True, False):
        state, window = x["state"].clone(), x["conv_window"].clone()
        if state_vk:
            state = state.transpose(-1, -2).contiguous()
        ss = sw = None
        if staged:
            ss = torch.full((T, H, K, V), float("nan"), device=DEVICE)
            sw = torch.full((T, 3, H * K, W - 1), float("nan"), device=DEVICE).to(window.dtype)
        args = (*ref_args(x, state, window), ss, sw)
        if fused:
            y = torch.full((T, H, V), float("nan"), device=DEVICE, dtype=out_dtype or torch.float32)
            kda_chain_triton(*args, config=config, state_vk=state_vk, y=y,
                             output_norm=(gate, weight, EPS, out_dtype, round_steps, round_before_weight))
        else:
            o = kda_chain_triton(*args, config=config, state_vk=state_vk)
            y = gated_head_rmsnorm_triton(o, gate, weight, EPS, out_dtype, round_steps=round_steps,
                                          round_before_weight=round_before_weight)
        runs.append((y, state, window, ss, sw))
    return runs


def assert_fused_is_chain_then_norm(runs, out_dtype):
    (y, *chain), (y_ref, *chain_ref) = runs
    assert not y.float().isnan().any(), "y has unwritten elements"
    for a, b in zip(chain, chain_ref):
        assert (a is None and b is None) or torch.equal(a, b)
    if out_dtype in (None, torch.float32):
        torch.testing.assert_close(y, y_ref, rtol=2e-6, atol=2e-6)
    else:   # the row sums in another order (the GPU): an ulp of the output dtype
        ulp = 2.0 ** -7 if out_dtype == torch.bfloat16 else 2.0 ** -10
        torch.testing.assert_close(y.float(), y_ref.float(), rtol=2 * ulp, atol=2 * ulp)


@pytest.mark.parametrize("staged", [False, True], ids=["persistent", "staged"])
@pytest.mark.parametrize("T", [1, 2, 6])
@pytest.mark.parametrize("H,K,bv", [(2, 16, 8), (2, 16, 16), (2, 24, 8)], ids=["2-blocks", "1-block", "masked"])
def test_fused_norm_is_the_chain_then_the_gated_norm(H, K, bv, T, staged):
    x = make_inputs(T, H, K, torch.bfloat16, seed=10 * T + H + K + bv)
    gate, weight = norm_inputs(T, H, K, torch.bfloat16, seed=T + K)
    runs = run_both(x, staged, KdaConfig(bv=bv), gate, weight, torch.bfloat16)
    assert_fused_is_chain_then_norm(runs, torch.bfloat16)
    assert not torch.any(_tickets(torch.device(DEVICE), H)[:H]), "the heads' tickets were not reset"


@pytest.mark.parametrize("form", ["fp32-out", "round-steps", "llama"])
def test_fused_norm_forms(form):
    x = make_inputs(3, 2, 16, torch.bfloat16, seed=5)
    gate, weight = norm_inputs(3, 2, 16, torch.bfloat16, seed=6)
    out_dtype = None if form == "fp32-out" else torch.bfloat16
    runs = run_both(x, False, KdaConfig(bv=8), gate, weight, out_dtype, round_steps=form != "fp32-out",
                    round_before_weight=form == "llama")
    assert_fused_is_chain_then_norm(runs, out_dtype)


@pytest.mark.parametrize("staged", [False, True], ids=["persistent", "staged"])
def test_fused_norm_on_a_state_stored_v_k(staged):
    x = make_inputs(2, 2, 16, torch.bfloat16, seed=8)
    gate, weight = norm_inputs(2, 2, 16, torch.bfloat16, seed=9)
    runs = run_both(x, staged, KdaConfig(bv=8), gate, weight, torch.bfloat16, state_vk=True)
    assert_fused_is_chain_then_norm(runs, torch.bfloat16)


def test_rows_are_batch_invariant_in_T():
    """Position j's y of a 6-token staged chain is the y of the chain's first j + 1 tokens, bit for bit
    (the norm's tile has a fixed row count; T only masks it)."""
    x = make_inputs(6, 2, 16, torch.bfloat16, seed=21)
    gate, weight = norm_inputs(6, 2, 16, torch.bfloat16, seed=22)
    full = run_both(x, True, KdaConfig(bv=8), gate, weight, torch.bfloat16)[0][0]
    for n in (1, 4):
        part = run_both({k: (v[:n] if k.endswith("_raw") else v) for k, v in x.items()}, True, KdaConfig(bv=8),
                        gate[:n], weight, torch.bfloat16)[0][0]
        assert torch.equal(part, full[:n]), n


def test_op_cpu_path_is_the_two_ops_and_its_checks():
    x = {k: v.cpu() for k, v in make_inputs(3, 2, 16, torch.bfloat16, seed=31, device="cpu").items()}
    gen = torch.Generator().manual_seed(32)
    gate = torch.randn(3, 2, 16, generator=gen).to(torch.bfloat16)
    weight = (1 + 0.2 * torch.randn(16, generator=gen)).to(torch.bfloat16)
    results = []
    for fused in (True, False):
        state, window = x["state"].clone(), x["conv_window"].clone()
        args = (*ref_args(x, state, window), None, None)
        if fused:
            y = kda_chain_normed(*args, gate, weight, EPS, torch.bfloat16)
        else:
            y = torch.ops.lingc.gated_head_rmsnorm(kda_chain(*args), gate, weight, EPS, torch.bfloat16)
        results.append((y, state, window))
    for a, b in zip(*results):
        assert torch.equal(a, b)
    with FakeTensorMode() as mode:
        f = {k: mode.from_tensor(v) for k, v in x.items()}
        y = kda_chain_normed(*ref_args(f), None, None, mode.from_tensor(gate), mode.from_tensor(weight), EPS,
                             torch.bfloat16)
        assert y.shape == (3, 2, 16) and y.dtype == torch.bfloat16
    with pytest.raises(ValueError, match=r"kda_chain_normed: gated_head_rmsnorm: gate must be \[T, H, V\]"):
        kda_chain_normed(*ref_args(x), None, None, gate[:2], weight, EPS, torch.bfloat16)
    with pytest.raises(ValueError, match=r"kda_chain_normed: gated_head_rmsnorm: round_steps rounds each step"):
        kda_chain_normed(*ref_args(x), None, None, gate, weight, EPS, None, True)


_COMPILE_CHECK = textwrap.dedent("""
    import re
    from sm90 import compile_sm90, signature
    from lingc.runtime.kernels.kda.kernel import _kda_chain_kernel
    fn = _kda_chain_kernel
    ptrs = dict(q_ptr="*bf16", k_ptr="*bf16", v_ptr="*bf16", f_ptr="*bf16", b_ptr="*bf16", wq_ptr="*fp32",
                wk_ptr="*fp32", wv_ptr="*fp32", win_ptr="*bf16", alog_ptr="*fp32", dtb_ptr="*fp32",
                state_ptr="*fp32", o_ptr="*fp32", sstate_ptr="*fp32", swin_ptr="*bf16", ticket_ptr="*i32",
                gate_ptr="*bf16", nw_ptr="*bf16", y_ptr="*bf16")
    ints = ["stride_q", "stride_k", "stride_v", "stride_f", "stride_b", "T", "STAGED", "stride_gt", "stride_gh"]
    for vk in (False, True):
        const = dict(H=8, K=128, V=128, BK=128, BV=8, NVB=16, STATE_BEFORE_WAIT=True, FUSED_RED=True,
                     USE_GDC=True, STATE_VK=vk, NORM_OUT=True, TB=16, BVF=128)
        ptx, info = compile_sm90(fn, signature(fn, ptrs, ints, ["lower_bound", "scale", "eps", "norm_eps"]), const,
                                 num_warps=4)
        assert " 0 bytes spill stores" in info, info
        # The norm weight is a parameter: requested before the wait with the conv taps.
        assert ptx.index("ld.global") < ptx.index("griddepcontrol.wait")
        assert "atom.global.gpu.acq_rel.add" in ptx, "the head's ticket"
        assert "ld.global.cg" in ptx, "the o rows read back from L2"
        print("vk" if vk else "kv", re.findall(r"Used \\d+ registers", info))
""")


def test_kernel_compiles_for_sm90_without_spills():
    """The real compile at flash-tp4-rank's shape (H = 8, K = V = 128, BV = 8: 16 v-blocks a
    head) with the fused norm, both state layouts: no spills, the weight before the wait, the
    ticket and the L2 read-back present."""
    run_sm90_compile_check(_COMPILE_CHECK)


@pytest.mark.gpu
@pytest.mark.parametrize("staged", [False, True], ids=["persistent", "staged"])
@pytest.mark.parametrize("T", [1, 6])
def test_gpu_flash_tp4_rank_shapes(T, staged):
    x = make_inputs(T, 8, 128, torch.bfloat16, seed=40 + T)
    gate, weight = norm_inputs(T, 8, 128, torch.bfloat16, seed=50 + T)
    for vk in (False, True):
        runs = run_both(x, staged, None, gate, weight, torch.bfloat16, state_vk=vk)
        assert_fused_is_chain_then_norm(runs, torch.bfloat16)
    assert LOWER_BOUND < 0
