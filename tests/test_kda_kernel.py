"""Fused KDA chain (torch.ops.lingc.kda_chain / kda_commit): Triton kernel vs reference, staging,
commit, batch invariance in T, the ops' fake impls and argument checks.

On the CPU the kernel runs under TRITON_INTERPRET=1 (conftest.py) on small shapes, including a
non-power-of-two head dim (masked lanes) and several BV tilings (one v-block, several, a partial
last block, so the persistent mode's q/k-window ticket runs); with CUDA the same tests run on the
GPU and the ``gpu``-marked ones add flash-tp4-rank shapes (H=8, K=V=128) and a CUDA graph with PDL.

Tolerances (relative RMS): every arithmetic step is fp32 on both sides (bf16 projections and
windows convert to fp32 exactly), so only the order of the K sums and the exp/sigmoid/rsqrt
implementations differ: 2e-5 on the CPU, 1e-4 on the GPU (fast exp2-based transcendentals,
FMA contraction) after up to 8 recurrent steps. Conv windows are copies of inputs and compare
bit for bit.
"""
import os
import textwrap
from dataclasses import replace

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from helpers import assert_close, run_sm90_compile_check
from lingc.models.kda_math import kda_gate, kda_recurrent, l2norm, short_conv
from lingc.runtime.kernels.kda import (
    kda_commit_many,
    kda_chain,
    kda_chain_reference,
    kda_commit,
    staged_windows_reference,
)
from lingc.runtime.kernels.kda.kernel import (COMMIT_GROUP, KdaConfig, config_for, kda_chain_triton,
                                              kda_commit_many_triton, kda_commit_triton)
from lingc.runtime.pdl import pdl_supported

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
RTOL = 1e-4 if DEVICE == "cuda" else 2e-5
LOWER_BOUND = -5.0
W = 4
# (H, K=V): power-of-two heads and a masked one (24 -> BK 32).
SHAPES = [(2, 16), (4, 32), (2, 24)]


def make_inputs(T, H, K, dtype, seed, device=DEVICE):
    """Raw projections as the model would feed them, plus a nonzero state and window."""
    gen = torch.Generator().manual_seed(seed)
    D = H * K

    def r(*shape, scale=1.0):
        return torch.randn(*shape, generator=gen) * scale

    x = dict(
        q_raw=r(T, D).to(dtype), k_raw=r(T, D).to(dtype), v_raw=r(T, D).to(dtype),
        f_raw=r(T, D).to(dtype), b_raw=r(T, H).to(dtype),
        conv_w=r(3, D, W, scale=0.5), conv_window=r(3, D, W - 1).to(dtype),
        a_log=r(H, scale=0.5), dt_bias=r(D, scale=0.5), state=r(H, K, K, scale=0.3),
    )
    return {n: t.to(device) for n, t in x.items()}


def ref_args(x, state=None, window=None, lb=LOWER_BOUND):
    return (x["q_raw"], x["k_raw"], x["v_raw"], x["f_raw"], x["b_raw"], list(x["conv_w"].unbind(0)),
            x["conv_window"] if window is None else window, x["a_log"], x["dt_bias"],
            x["state"] if state is None else state, lb)


def prefix(x, n):
    """The inputs restricted to the chain's first n tokens."""
    return {k: (v[:n] if k in ("q_raw", "k_raw", "v_raw", "f_raw", "b_raw") else v) for k, v in x.items()}


# The sweeps run BV=16 (1 or 2 v-blocks at these sizes) to keep the interpreter's program count
# down; test_bv_tilings_agree and the ticket test cover the table's small BV.
SWEEP_CONFIG = KdaConfig(bv=16)


def run_kernel(x, staged, config=SWEEP_CONFIG, lb=LOWER_BOUND):
    """The launcher on copies of state/window, outputs and stage buffers NaN-poisoned.
    Returns (o, state, window, stage_states, stage_windows) (stage_* None when persistent)."""
    T, (H, K, V) = x["q_raw"].shape[0], x["state"].shape
    state, window = x["state"].clone(), x["conv_window"].clone()
    out = torch.full((T, H, V), float("nan"), device=state.device)
    ss = sw = None
    if staged:
        ss = torch.full((T, H, K, V), float("nan"), device=state.device)
        sw = torch.full((T, 3, H * K, W - 1), float("nan"), device=state.device).to(window.dtype)
    kda_chain_triton(*ref_args(x, state, window, lb), ss, sw, out, config=config)
    return out, state, window, ss, sw


def model_math(x, lb=LOWER_BOUND):
    """The chain as lingc/models/kda.py writes it (kda_math calls, no lingc kernel code)."""
    T, (H, K, _) = x["q_raw"].shape[0], x["state"].shape
    ys, wins = [], []
    for i, name in enumerate(("q_raw", "k_raw", "v_raw")):
        y, win = short_conv(x[name], x["conv_window"][i], x["conv_w"][i])
        ys.append(y.view(T, H, K))
        wins.append(win)
    q = l2norm(ys[0]) * (K ** -0.5)
    k = l2norm(ys[1])
    g = kda_gate(x["f_raw"].view(T, H, K), x["a_log"], x["dt_bias"], lb)
    beta = torch.sigmoid(x["b_raw"].float())
    o, S = kda_recurrent(q, k, ys[2], g, beta, x["state"])
    return o, S, torch.stack(wins, 0)


def assert_both_modes(x, o_ref, S_ref, win_ref, lb=LOWER_BOUND, config=SWEEP_CONFIG):
    """Persistent: o, state and window against the given math; staged: o, and every position's
    stage against the from-scratch reference of its prefix (outputs NaN-poisoned by run_kernel)."""
    o, state, window, _, _ = run_kernel(x, staged=False, config=config, lb=lb)
    assert_close(o, o_ref, RTOL)
    assert_close(state, S_ref, RTOL)
    assert torch.equal(window, win_ref)
    o2, _, _, ss, sw = run_kernel(x, staged=True, config=config, lb=lb)
    assert_close(o2, o_ref, RTOL)
    for j in range(x["q_raw"].shape[0]):
        scratch = kda_chain_reference(*ref_args(prefix(x, j + 1), lb=lb))
        assert_close(ss[j], scratch.state, RTOL)
        assert torch.equal(sw[j].cpu(), scratch.window.cpu()), f"stage window {j}"


def assert_runs_agree(run, base):
    """Two run_kernel results of one input under configs meant to give the same bits: equal under
    the interpreter, within RTOL on the GPU (another binary may round otherwise)."""
    for a, b in zip(run, base):
        if a is not None and DEVICE == "cpu":
            assert torch.equal(a, b)
        elif a is not None:
            assert_close(a.float(), b.float(), RTOL)


# Kernel vs reference.


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("T", [1, 3, 6, 8])
@pytest.mark.parametrize("H,K", SHAPES)
def test_persistent_matches_model_math(H, K, T, dtype):
    x = make_inputs(T, H, K, dtype, seed=100 * H + 10 * T + K)
    o, state, window, _, _ = run_kernel(x, staged=False)
    o_ref, S_ref, win_ref = model_math(x)
    assert_close(o, o_ref, RTOL)
    assert_close(state, S_ref, RTOL)
    assert torch.equal(window, win_ref)
    assert x["state"].abs().sum() > 0 and not torch.equal(state, x["state"])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("T", [1, 3, 6, 8])
@pytest.mark.parametrize("H,K", SHAPES)
def test_staged_matches_from_scratch_prefixes(H, K, T, dtype):
    x = make_inputs(T, H, K, dtype, seed=7 + 100 * H + 10 * T + K)
    state0, window0 = x["state"].clone(), x["conv_window"].clone()
    o, state, window, ss, sw = run_kernel(x, staged=True)
    # The persistent state and window are only read: bit-identical afterwards.
    assert torch.equal(state, state0) and torch.equal(window, window0)
    assert_close(o, kda_chain_reference(*ref_args(x)).o, RTOL)
    for j in range(T):
        scratch = kda_chain_reference(*ref_args(prefix(x, j + 1)))
        assert_close(ss[j], scratch.state, RTOL)
        assert torch.equal(sw[j], scratch.window), f"stage window {j}"
    assert torch.equal(sw, staged_windows_reference(x["q_raw"], x["k_raw"], x["v_raw"], x["conv_w"], window0))


def softplus_inputs(T, dtype, seed):
    """Inputs whose f + dt_bias spans softplus's three branches (above 20, below -15, between)."""
    x = make_inputs(T, 2, 24, dtype, seed=seed)
    f = x["f_raw"].float()
    f[:, 0::4] = f[:, 0::4].abs() * 10 + 22
    f[:, 1::4] = -f[:, 1::4].abs() * 10 - 17
    x["f_raw"] = f.to(dtype)
    return x


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("T", [1, 6])
def test_softplus_gate_matches_model_math_and_prefixes(T, dtype):
    """lower_bound None: the unbounded gate -exp(A_log) * softplus(f + dt_bias) (Kimi Linear's,
    kda_math.kda_gate) in both modes."""
    x = softplus_inputs(T, dtype, seed=90 + T)
    o, state, window, _, _ = run_kernel(x, staged=False, lb=None)
    o_ref, S_ref, win_ref = model_math(x, lb=None)
    assert_close(o, o_ref, RTOL)
    assert_close(state, S_ref, RTOL)
    assert torch.equal(window, win_ref)
    assert not torch.allclose(o_ref, model_math(x)[0], rtol=1e-2), "the two gates must differ here"
    o_s, _, _, ss, _ = run_kernel(x, staged=True, lb=None)
    assert_close(o_s, o_ref, RTOL)
    for j in range(T):
        assert_close(ss[j], kda_chain_reference(*ref_args(prefix(x, j + 1), lb=None)).state, RTOL)


def gdn_math(x, lb=None):
    """Gated DeltaNet's recurrence as its reference code writes it: one decay per head,
    exp(g[h]) scaling the head's whole state (no lingc or kda_math gate code)."""
    T, (H, K, _) = x["q_raw"].shape[0], x["state"].shape
    ys, wins = [], []
    for i, name in enumerate(("q_raw", "k_raw", "v_raw")):
        y, win = short_conv(x[name], x["conv_window"][i], x["conv_w"][i])
        ys.append(y.view(T, H, K).float())
        wins.append(win)
    q, k, v = l2norm(ys[0]) * (K ** -0.5), l2norm(ys[1]), ys[2]
    a = x["f_raw"].float() + x["dt_bias"].float()                                  # [T, H]
    g = (-x["a_log"].float().exp() * torch.nn.functional.softplus(a) if lb is None
         else lb * torch.sigmoid(x["a_log"].float().exp() * a))
    beta = torch.sigmoid(x["b_raw"].float())
    S, outs = x["state"].float(), []
    for t in range(T):
        S = S * g[t].exp()[:, None, None]
        delta = (v[t] - (S * k[t][..., None]).sum(-2)) * beta[t][:, None]
        S = S + k[t][..., None] * delta[:, None, :]
        outs.append((S * q[t][..., None]).sum(-2))
    return torch.stack(outs), S, torch.stack(wins, 0)


def gdn_inputs(T, H, K, dtype, seed):
    """make_inputs with Gated DeltaNet's gate: f [T, H] and dt_bias [H], one per head."""
    x = make_inputs(T, H, K, dtype, seed)
    gen = torch.Generator().manual_seed(seed + 1)
    x["f_raw"] = torch.randn(T, H, generator=gen).to(dtype).to(DEVICE)
    x["dt_bias"] = (torch.randn(H, generator=gen) * 0.5).to(DEVICE)
    return x


@pytest.mark.parametrize("lb", [None, LOWER_BOUND], ids=["softplus", "bounded"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("T,H,K", [(1, 2, 16), (6, 2, 24), (3, 4, 32)])
def test_per_head_gate_is_gated_deltanet(T, H, K, dtype, lb):
    """f [T, H] with dt_bias [H] (the kernel's GATE_PER_HEAD): Gated DeltaNet's recurrence, one
    decay per head, in both modes (outputs and stage buffers NaN-poisoned), against its own
    reference code and the op's reference; the per-head gate is not the per-channel one."""
    x = gdn_inputs(T, H, K, dtype, seed=110 + T + K)
    o_ref, S_ref, win_ref = gdn_math(x, lb)
    r = kda_chain_reference(*ref_args(x, lb=lb))
    assert_close(r.o, o_ref.cpu(), 2e-5)
    assert_close(r.state, S_ref.cpu(), 2e-5)
    assert_both_modes(x, o_ref, S_ref, win_ref, lb=lb)
    y = dict(x, f_raw=x["f_raw"].float().repeat_interleave(K, -1).to(dtype), dt_bias=x["dt_bias"].repeat_interleave(K))
    y["f_raw"] = y["f_raw"] + torch.arange(H * K, device=DEVICE).remainder(K).to(dtype)   # per channel now
    assert not torch.allclose(model_math(y, lb)[0], o_ref, rtol=1e-2), "a per-channel gate must differ"


def test_per_head_gate_bad_dt_bias_raises():
    x = gdn_inputs(2, 2, 16, torch.float32, seed=1)
    args = list(ref_args(x, lb=None))
    args[8] = torch.zeros(32, device=DEVICE)                 # a per-channel dt_bias with a per-head f
    with pytest.raises(ValueError, match=r"dt_bias must be \[H\] = \(2,\) like f_raw's last dim"):
        torch.ops.lingc.kda_chain(*args, None, None)
    args[3] = torch.zeros(2, 5, device=DEVICE)
    with pytest.raises(ValueError, match=r"f_raw must be \[T, H\*K\] = \(2, 32\) .* or \[T, H\] = \(2, 2\)"):
        torch.ops.lingc.kda_chain(*args, None, None)


def test_low_precision_conv_weights_read_as_fp32():
    """Conv taps in the model's dtype (a model cast whole with nn.Module.to): the kernel reads their
    exact fp32 upcast, so the results are those of the fp32 copy, and the reference's."""
    x = make_inputs(3, 2, 16, torch.bfloat16, seed=61)
    x["conv_w"] = x["conv_w"].to(torch.bfloat16)
    got = run_kernel(x, staged=True)
    want = run_kernel(dict(x, conv_w=x["conv_w"].float()), staged=True)
    assert all(torch.equal(a, b) for a, b in zip(got, want) if a is not None)
    assert_close(got[0], kda_chain_reference(*ref_args(x)).o, RTOL)


def test_softplus_gate_batch_invariant_in_T():
    x = softplus_inputs(6, torch.float32, seed=97)
    o6, _, _, ss6, _ = run_kernel(x, staged=True, lb=None)
    for n in (1, 3):
        o, _, _, ss, _ = run_kernel(prefix(x, n), staged=True, lb=None)
        assert torch.equal(o, o6[:n]) and torch.equal(ss, ss6[:n]), f"T={n}"


@pytest.mark.parametrize("staged", [False, True], ids=["persistent", "staged"])
@pytest.mark.parametrize("H,K,bvs", [(2, 16, (4, 8, 16)), (2, 24, (4, 16, 32))])
def test_bv_tilings_agree(H, K, bvs, staged):
    # One v-block (BV >= V), several, and a partial last block (V=24, BV=16): all bit-identical
    # to each other under the interpreter (each column's K reduction stays in one program).
    x = make_inputs(6, H, K, torch.bfloat16, seed=31 + K)
    results = [run_kernel(x, staged, KdaConfig(bv=bv)) for bv in bvs]
    ref = kda_chain_reference(*ref_args(x))
    assert_close(results[0][0], ref.o, RTOL)
    for r in results[1:]:
        assert_runs_agree(r, results[0])


def test_persistent_ticket_resets():
    # With several v-blocks the last program of each head writes the q/k window and resets its
    # ticket; a second launch (or graph replay) must see zero tickets and give the same result.
    from lingc.runtime.kernels.kda.kernel import _tickets
    x = make_inputs(3, 2, 16, torch.float32, seed=5)
    first = run_kernel(x, staged=False, config=KdaConfig(bv=4))
    assert int(_tickets(x["state"].device, 2)[:2].abs().sum()) == 0
    second = run_kernel(x, staged=False, config=KdaConfig(bv=4))
    for a, b in zip(first[:3], second[:3]):
        assert torch.equal(a, b)


TICKET_CONFIGS = [KdaConfig(bv=4, early_ticket=True), KdaConfig(bv=8, early_ticket=True),
                  KdaConfig(bv=8, early_ticket=False)]


@pytest.mark.parametrize("config", TICKET_CONFIGS, ids=["bv4-early", "bv8-early", "bv8-late"])
@pytest.mark.parametrize("T", [1, 6])
def test_ticket_forms_match_the_model_and_the_prefixes(T, config):
    # KdaConfig.early_ticket (the default): the ticket drawn at the first token, the last drawer
    # still writing the q/k window at its end; and the draw at the end. Persistent and staged
    # against the model's math and every prefix from scratch, twice (the tickets are back at zero
    # after each launch).
    from lingc.runtime.kernels.kda.kernel import _tickets
    x = make_inputs(T, 2, 16, torch.bfloat16, seed=7 + T)
    o_ref, S_ref, win_ref = model_math(x)
    for _ in range(2):
        assert_both_modes(x, o_ref, S_ref, win_ref, config=config)
        assert int(_tickets(x["state"].device, 2)[:2].abs().sum()) == 0


def test_early_ticket_keeps_the_bits():
    # Only where the ticket is drawn moves: the same outputs, states and windows as the draw at
    # the end, bit for bit (interpreter; on the GPU against the reference, a second binary's roundings
    # may differ: see KdaConfig).
    x = make_inputs(6, 2, 24, torch.bfloat16, seed=77)
    for staged in (False, True):
        late = run_kernel(x, staged, KdaConfig(bv=8, early_ticket=False))
        assert_runs_agree(run_kernel(x, staged, KdaConfig(bv=8, early_ticket=True)), late)


def test_ticket_buffer_is_never_replaced():
    # A captured graph bakes in the tickets' address: every launch gets the same buffer, and a
    # launch needing more than it holds is refused instead of growing it.
    from lingc.runtime.kernels.kda.kernel import TICKET_CAPACITY, _tickets
    dev = torch.device(DEVICE)
    assert _tickets(dev, 2).data_ptr() == _tickets(dev, TICKET_CAPACITY).data_ptr()
    with pytest.raises(ValueError, match="TICKET_CAPACITY"):
        _tickets(dev, TICKET_CAPACITY + 1)


# Batch invariance in T.


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_kernel_batch_invariant_in_T(dtype):
    x = make_inputs(8, 2, 16, dtype, seed=41)
    o8, _, _, ss8, sw8 = run_kernel(x, staged=True)
    for n in range(1, 9):
        o, _, _, ss, sw = run_kernel(prefix(x, n), staged=True)
        assert torch.equal(o, o8[:n]), f"outputs of a T={n} chain differ from T=8"
        assert torch.equal(ss, ss8[:n]) and torch.equal(sw, sw8[:n]), f"stages of T={n} differ"
        _, state, window, _, _ = run_kernel(prefix(x, n), staged=False)
        assert torch.equal(state, ss8[n - 1]) and torch.equal(window, sw8[n - 1]), f"persistent T={n}"


# KdaConfig.fused_reductions=False (four single reductions per token, the table's path before
# session 23): other roundings, the same guarantees.
UNFUSED_CONFIG = KdaConfig(bv=16, fused_reductions=False)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("H,K", [(2, 16), (2, 24)])
def test_unfused_reductions_match_the_model_and_the_prefixes(H, K, dtype):
    """Persistent: o, state and window against the model's math; staged: every position against
    the from-scratch reference of its prefix (fresh random inputs, NaN-poisoned outputs)."""
    T = 6
    x = make_inputs(T, H, K, dtype, seed=500 + K)
    assert_both_modes(x, *model_math(x), config=UNFUSED_CONFIG)


def test_unfused_reductions_batch_invariant_in_T():
    """Position j of any chain is the same bits, staged or persistent, whatever T is."""
    x = make_inputs(8, 2, 16, torch.bfloat16, seed=43)
    o8, _, _, ss8, sw8 = run_kernel(x, staged=True, config=UNFUSED_CONFIG)
    for n in (1, 3, 6):
        o, _, _, ss, sw = run_kernel(prefix(x, n), staged=True, config=UNFUSED_CONFIG)
        assert torch.equal(o, o8[:n]) and torch.equal(ss, ss8[:n]) and torch.equal(sw, sw8[:n]), n
        _, state, window, _, _ = run_kernel(prefix(x, n), staged=False, config=UNFUSED_CONFIG)
        assert torch.equal(state, ss8[n - 1]) and torch.equal(window, sw8[n - 1]), n


def test_reference_batch_invariant_in_T():
    x = make_inputs(8, 2, 24, torch.bfloat16, seed=42, device="cpu")
    full = kda_chain_reference(*ref_args(x))
    for n in range(1, 9):
        r = kda_chain_reference(*ref_args(prefix(x, n)))
        assert torch.equal(r.o, full.o[:n]) and torch.equal(r.stage_states, full.stage_states[:n])
        assert torch.equal(r.state, full.stage_states[n - 1]) and torch.equal(r.window, full.stage_windows[n - 1])


# Commit.


@pytest.mark.parametrize("index_shape", [(), (1,)], ids=["0d", "1elem"])
@pytest.mark.parametrize("impl", ["triton", "op"])
@pytest.mark.parametrize("H,K", SHAPES)
def test_commit_copies_the_chosen_position(impl, index_shape, H, K):
    # Every element written (NaN-poisoned destinations) from the chosen stage position; the
    # Triton launch at a small block too, so the state and the window span several blocks.
    x = make_inputs(6, H, K, torch.bfloat16, seed=51 + H + K)
    _, _, _, ss, sw = run_kernel(x, staged=True)
    for i in (0, 3, 5):
        state = torch.full_like(x["state"], float("nan"))
        window = torch.full_like(x["conv_window"], float("nan"))
        index = torch.full(index_shape, i, dtype=torch.int64, device=state.device)
        if impl == "triton":
            kda_commit_triton(state, window, ss, sw, index, block=64 if i == 3 else 4096)
        else:
            kda_commit(state, window, ss, sw, index)
        assert torch.equal(state, ss[i]) and torch.equal(window, sw[i])


def _commit_many_buffers(n, H, K, D, seed, device=DEVICE, P=6):
    """n layers' poisoned destinations and fresh random stages (state [H, K, K] fp32, window
    [3, D, 3] bf16)."""
    g = torch.Generator().manual_seed(seed)
    states = [torch.full((H, K, K), float("nan"), device=device) for _ in range(n)]
    windows = [torch.full((3, D, 3), float("nan"), device=device, dtype=torch.bfloat16) for _ in range(n)]
    ss = [torch.randn(P, H, K, K, generator=g).to(device) for _ in range(n)]
    sw = [torch.randn(P, 3, D, 3, generator=g).to(device, torch.bfloat16) for _ in range(n)]
    return states, windows, ss, sw


@pytest.mark.parametrize("n", [1, 3, COMMIT_GROUP, COMMIT_GROUP + 1, 2 * COMMIT_GROUP + 1])
@pytest.mark.parametrize("impl", ["triton", "op"])
def test_commit_many_copies_every_layers_chosen_position(impl, n):
    # Every element of every layer is written (NaN-poisoned destinations), from its own layer's
    # stage (fresh random stages per layer), across launch-group boundaries.
    for i, (H, K, D) in ((0, (2, 16, 8)), (5, (4, 32, 24))):
        states, windows, ss, sw = _commit_many_buffers(n, H, K, D, seed=60 + n + i)
        index = torch.tensor([i], device=states[0].device)
        if impl == "triton":
            kda_commit_many_triton(states, windows, ss, sw, index, block=256)
        else:
            kda_commit_many(states, windows, ss, sw, index)
        for j in range(n):
            assert torch.equal(states[j], ss[j][i]) and torch.equal(windows[j], sw[j][i]), (j, i)


def test_commit_many_rejects_ragged_or_mixed_layers():
    states, windows, ss, sw = _commit_many_buffers(3, 2, 16, 8, seed=70, device="cpu")
    idx = torch.tensor(1)
    with pytest.raises(ValueError, match="stage_windows has 2 entries, states has 3"):
        kda_commit_many(states, windows, ss, sw[:2], idx)
    with pytest.raises(ValueError, match="states is empty"):
        kda_commit_many([], [], [], [], idx)
    other = _commit_many_buffers(1, 4, 16, 8, seed=71, device="cpu")
    with pytest.raises(ValueError, match=r"states\[2\] is \(4, 16, 16\).*one call commits layers of one shape"):
        kda_commit_many(states[:2] + other[0], windows[:2] + other[1], ss[:2] + other[2], sw[:2] + other[3], idx)


def test_stage_then_commit_equals_decoding_the_accepted_prefix():
    # Verify 6 positions, accept 4 (index 3): the committed state is what a persistent chain
    # over those 4 tokens leaves behind, bit for bit.
    x = make_inputs(6, 4, 32, torch.bfloat16, seed=52)
    _, _, _, ss, sw = run_kernel(x, staged=True)
    state, window = x["state"].clone(), x["conv_window"].clone()
    kda_commit(state, window, ss, sw, torch.tensor(3, device=state.device))
    _, state4, window4, _, _ = run_kernel(prefix(x, 4), staged=False)
    assert torch.equal(state, state4) and torch.equal(window, window4)


# A broken kernel or a broken staging layout must fail the comparisons above.


def test_off_by_one_staging_is_caught():
    # The kernel writes position j into buffer row j+1 (a shifted view): reading row j as
    # position j's stage must fail the from-scratch check.
    x = make_inputs(6, 2, 16, torch.float32, seed=61)
    T, (H, K, V) = 6, x["state"].shape
    ss = torch.full((T + 1, H, K, V), float("nan"), device=DEVICE)
    sw = torch.full((T + 1, 3, H * K, W - 1), float("nan"), device=DEVICE)
    ss[0].zero_()
    sw[0].zero_()
    kda_chain_triton(*ref_args(x, x["state"].clone(), x["conv_window"].clone()), ss[1:], sw[1:])
    scratch = kda_chain_reference(*ref_args(prefix(x, 3)))
    with pytest.raises(AssertionError, match="relative RMS error"):
        assert_close(ss[2], scratch.state, RTOL)
    assert not torch.equal(sw[2], scratch.window)


def test_unstaged_verify_is_caught():
    # A verify that forgot to stage (ran the persistent mode) leaves the NaN-poisoned stage
    # buffers unwritten and corrupts the persistent state: both checks fail.
    x = make_inputs(3, 2, 16, torch.float32, seed=62)
    ss = torch.full((3, 2, 16, 16), float("nan"), device=DEVICE)
    state = x["state"].clone()
    kda_chain_triton(*ref_args(x, state, x["conv_window"].clone()))
    with pytest.raises(AssertionError, match="non-finite"):
        assert_close(ss[0], kda_chain_reference(*ref_args(prefix(x, 1))).state, RTOL)
    assert not torch.equal(state, x["state"])


# The ops: CPU path, fake impls, argument checks, functionalisation.


@pytest.mark.parametrize("staged", [False, True], ids=["persistent", "staged"])
def test_op_matches_reference(staged):
    x = make_inputs(6, 2, 24, torch.bfloat16, seed=71)
    ref = kda_chain_reference(*ref_args(x))
    state, window = x["state"].clone(), x["conv_window"].clone()
    # Stage buffers longer than the chain: rows past T stay untouched.
    ss = torch.zeros(8, 2, 24, 24, device=DEVICE) if staged else None
    sw = torch.zeros(8, 3, 48, 3, device=DEVICE, dtype=torch.bfloat16) if staged else None
    o = kda_chain(*ref_args(x, state, window), ss, sw)
    assert_close(o, ref.o, RTOL)
    if staged:
        assert torch.equal(state, x["state"]) and torch.equal(window, x["conv_window"])
        assert_close(ss[:6], ref.stage_states, RTOL)
        assert torch.equal(sw[:6], ref.stage_windows)
        assert ss[6:].abs().sum() == 0 and sw[6:].abs().sum() == 0
    else:
        assert_close(state, ref.state, RTOL)
        assert torch.equal(window, ref.window)


def transposed_state(x):
    """x with its state stored [H, V, K] (each head's [K, V] state transposed, contiguous)."""
    return {**x, "state": x["state"].transpose(-1, -2).contiguous()}


@pytest.mark.parametrize("staged", [False, True], ids=["persistent", "staged"])
@pytest.mark.parametrize("T", [1, 6])
@pytest.mark.parametrize("H,K", [(2, 16), (2, 24)])
def test_state_vk_layout_matches_the_reference(H, K, T, staged):
    """A state stored [V, K] (state_vk): read and written in that layout, stages too; every
    element of the NaN-poisoned outputs and stages written; the same values as the [K, V] chain."""
    x = make_inputs(T, H, K, torch.bfloat16, seed=300 + 10 * T + K)
    xt = transposed_state(x)
    ref = kda_chain_reference(*ref_args(x))
    state, window = xt["state"].clone(), xt["conv_window"].clone()
    out = torch.full((T, H, K), float("nan"), device=DEVICE)
    ss = torch.full((T, H, K, K), float("nan"), device=DEVICE) if staged else None
    sw = torch.full((T, 3, H * K, W - 1), float("nan"), device=DEVICE).to(window.dtype) if staged else None
    kda_chain_triton(*ref_args(xt, state, window), ss, sw, out, state_vk=True, config=KdaConfig(bv=8))
    assert not out.isnan().any()
    assert_close(out, ref.o, RTOL)
    if staged:
        assert not ss.isnan().any() and not sw.isnan().any()
        assert_close(ss.transpose(-1, -2), ref.stage_states, RTOL)
        assert torch.equal(sw, ref.stage_windows)
        assert torch.equal(state, xt["state"]) and torch.equal(window, xt["conv_window"])
    else:
        assert_close(state.transpose(-1, -2), ref.state, RTOL)
        assert torch.equal(window, ref.window)
    # The op's CPU path (the reference on the transposed views) agrees with the kernel.
    state2, window2 = xt["state"].clone(), xt["conv_window"].clone()
    ss2, sw2 = (torch.empty_like(ss), torch.empty_like(sw)) if staged else (None, None)
    o2 = kda_chain(*ref_args(xt, state2, window2), ss2, sw2, state_vk=True)
    assert_close(o2, out, RTOL)
    assert_close(ss2 if staged else state2, ss if staged else state, RTOL)



def v_wide_inputs(T, H, HK, K, V, win, dtype, seed, device=DEVICE):
    """Inputs with V != K (flash-linear-attention's expand_v): HK q/k heads of K, H value heads
    of V, one flat [2*HK*K + H*V, win] window (win = 3 columns, or 4 as Hugging Face's cache)."""
    gen = torch.Generator().manual_seed(seed)
    r = lambda *shape, scale=1.0: torch.randn(*shape, generator=gen) * scale  # noqa: E731
    x = dict(q_raw=r(T, HK * K).to(dtype), k_raw=r(T, HK * K).to(dtype), v_raw=r(T, H * V).to(dtype),
             f_raw=r(T, H * K).to(dtype), b_raw=r(T, H).to(dtype),
             conv_w=[r(HK * K, W, scale=0.5), r(HK * K, W, scale=0.5), r(H * V, W, scale=0.5)],
             conv_window=r(2 * HK * K + H * V, win).to(dtype), a_log=r(H, scale=0.5), dt_bias=r(H * K, scale=0.5),
             state=r(H, K, V, scale=0.3))
    return {n: ([t.to(device) for t in v] if isinstance(v, list) else v.to(device)) for n, v in x.items()}


def v_wide_math(x, H, HK, K, V):
    """The chain from kda_math, written here for V != K (o [T, H, V], state, window)."""
    T = x["q_raw"].shape[0]
    blocks = [HK * K, HK * K, H * V]
    win = x["conv_window"]
    parts, new = win.split(blocks, 0), []
    ys = []
    for i, name in enumerate(("q_raw", "k_raw", "v_raw")):
        y, live = short_conv(x[name], parts[i][:, -(W - 1):], x["conv_w"][i])
        ys.append(y)
        new.append(live if win.shape[1] == W - 1 else torch.cat([parts[i], x[name].T.to(win.dtype)], 1)[:, -W:])
    G = H // HK
    q = (l2norm(ys[0].view(T, HK, K)) * K ** -0.5).repeat_interleave(G, 1)
    k = l2norm(ys[1].view(T, HK, K)).repeat_interleave(G, 1)
    g = kda_gate(x["f_raw"].view(T, H, K), x["a_log"], x["dt_bias"], LOWER_BOUND)
    o, S = kda_recurrent(q, k, ys[2].view(T, H, V), g, torch.sigmoid(x["b_raw"].float()), x["state"])
    return o, S, torch.cat(new, 0)


@pytest.mark.parametrize("state_vk", [False, True], ids=["kv", "vk"])
@pytest.mark.parametrize("H,HK,K,V,win", [(2, 2, 16, 32, 3), (4, 2, 16, 32, 4), (2, 2, 32, 16, 3), (2, 1, 16, 48, 4)])
@pytest.mark.parametrize("T", [1, 6])
def test_v_unequal_k_matches_model_math(T, H, HK, K, V, win, state_vk):
    """V != K (expand_v): the kernel in both modes against the chain written from kda_math, the
    state in either layout, outputs and stages NaN-poisoned (every element written); the op's
    CPU path agrees."""
    x = v_wide_inputs(T, H, HK, K, V, win, torch.float32, seed=T * 100 + V + win)
    o_ref, S_ref, w_ref = v_wide_math(x, H, HK, K, V)
    lay = (lambda s: s.transpose(-1, -2).contiguous()) if state_vk else (lambda s: s.clone())
    args = lambda state, window: (x["q_raw"], x["k_raw"], x["v_raw"], x["f_raw"], x["b_raw"], x["conv_w"],  # noqa: E731
                                  window, x["a_log"], x["dt_bias"], state, LOWER_BOUND)
    state, window = lay(x["state"]), x["conv_window"].clone()
    out = torch.full((T, H, V), float("nan"), device=state.device)
    kda_chain_triton(*args(state, window), None, None, out, state_vk=state_vk, config=SWEEP_CONFIG)
    assert_close(out, o_ref, RTOL)
    assert_close(state.transpose(-1, -2) if state_vk else state, S_ref, RTOL)
    assert torch.equal(window, w_ref)
    state, window = lay(x["state"]), x["conv_window"].clone()
    ss = torch.full((T, *state.shape), float("nan"), device=state.device)
    sw = torch.full((T, *window.shape), float("nan"), device=state.device).to(window.dtype)
    kda_chain_triton(*args(state, window), ss, sw, state_vk=state_vk, config=SWEEP_CONFIG)
    assert torch.equal(state, lay(x["state"])) and torch.equal(window, x["conv_window"])
    for j in range(T):
        p = {**x, **{n: x[n][:j + 1] for n in ("q_raw", "k_raw", "v_raw", "f_raw", "b_raw")}}
        _, S_j, w_j = v_wide_math(p, H, HK, K, V)
        assert_close(ss[j].transpose(-1, -2) if state_vk else ss[j], S_j, RTOL)
        assert torch.equal(sw[j], w_j), f"stage window {j}"
    cpu = {n: ([t.cpu() for t in v] if isinstance(v, list) else v.cpu()) for n, v in x.items()}
    st = lay(cpu["state"])
    o_op = kda_chain(cpu["q_raw"], cpu["k_raw"], cpu["v_raw"], cpu["f_raw"], cpu["b_raw"], cpu["conv_w"],
                     cpu["conv_window"].clone(), cpu["a_log"], cpu["dt_bias"], st, LOWER_BOUND, None, None,
                     state_vk=state_vk)
    assert_close(o_op, o_ref.cpu(), 2e-5)
    st = lay(cpu["state"])
    with FakeTensorMode() as mode:
        f = lambda t: [mode.from_tensor(a) for a in t] if isinstance(t, list) else mode.from_tensor(t)  # noqa: E731
        fo = kda_chain(*[f(cpu[n]) for n in ("q_raw", "k_raw", "v_raw", "f_raw", "b_raw", "conv_w", "conv_window",
                                              "a_log", "dt_bias")], f(st), LOWER_BOUND, None, None,
                       state_vk=state_vk)
    assert fo.shape == (T, H, V)


def test_v_unequal_k_needs_the_flat_window():
    """The stacked [3, H*K, W-1] window holds equal blocks: V != K is refused there, naming it."""
    x = v_wide_inputs(2, 2, 2, 16, 32, 3, torch.float32, seed=5, device="cpu")
    with pytest.raises(ValueError, match=r"conv_window must be .*\(128, 3\).*got \(3, 32, 3\)"):
        kda_chain(x["q_raw"], x["k_raw"], x["v_raw"], x["f_raw"], x["b_raw"], x["conv_w"], torch.zeros(3, 32, 3),
                  x["a_log"], x["dt_bias"], x["state"], LOWER_BOUND, None, None)
    with pytest.raises(ValueError, match=r"v_raw must be \[T, H\*V\] = \(2, 32\), got \(2, 64\)"):
        kda_chain(x["q_raw"], x["k_raw"], x["v_raw"], x["f_raw"], x["b_raw"], x["conv_w"], x["conv_window"],
                  x["a_log"], x["dt_bias"], x["state"].transpose(-1, -2).contiguous(), LOWER_BOUND, None, None)


@pytest.mark.parametrize("staged", [False, True], ids=["persistent", "staged"])
@pytest.mark.parametrize("H,HK,K,V,win", [(2, 2, 16, 16, 4), (2, 2, 24, 24, 3), (4, 2, 16, 32, 4)])
@pytest.mark.parametrize("T", [1, 6])
def test_three_caches_are_the_flat_windows_blocks(T, H, HK, K, V, win, staged):
    """k_window / v_window (q, k and v convolved into caches of their own, fla's layers): the
    same outputs and states as the one flat window whose blocks they are, the caches written as
    its blocks (persistent) or left alone with the stages one flat block (staged); kda_commit
    writes a stage's blocks back into the three; the op's CPU path is the same."""
    x = v_wide_inputs(T, H, HK, K, V, win, torch.float32, seed=T * 13 + V + win)
    rows = [HK * K, HK * K, H * V]
    args = lambda w: (x["q_raw"], x["k_raw"], x["v_raw"], x["f_raw"], x["b_raw"], x["conv_w"], w,  # noqa: E731
                      x["a_log"], x["dt_bias"])
    stage = lambda: ((torch.full((T, *x["state"].shape), float("nan"), device=DEVICE),  # noqa: E731
                      torch.full((T, sum(rows), win), float("nan"), device=DEVICE)) if staged else (None, None))
    s1, w1, (ss1, sw1) = x["state"].clone(), x["conv_window"].clone(), stage()
    o1 = kda_chain_triton(*args(w1), s1, LOWER_BOUND, ss1, sw1, config=SWEEP_CONFIG)
    s2, (q, k, v), (ss2, sw2) = x["state"].clone(), [t.clone() for t in x["conv_window"].split(rows)], stage()
    o2 = kda_chain_triton(*args(q), s2, LOWER_BOUND, ss2, sw2, config=SWEEP_CONFIG, k_window=k, v_window=v)
    assert torch.equal(o1, o2) and torch.equal(s1, s2)
    assert torch.equal(torch.cat([q, k, v]), w1)
    if staged:
        assert torch.equal(ss1, ss2) and torch.equal(sw1, sw2)
        st = x["state"].clone()
        kda_commit_triton(st, q, ss2, sw2, torch.tensor([T - 1], device=DEVICE), k_window=k, v_window=v)
        assert torch.equal(st, ss2[T - 1]) and torch.equal(torch.cat([q, k, v]), sw2[T - 1])
    cpu = {n: ([t.cpu() for t in a] if isinstance(a, list) else a.cpu()) for n, a in x.items()}
    q, k, v = [t.clone() for t in cpu["conv_window"].split(rows)]
    st = cpu["state"].clone()
    o = kda_chain(cpu["q_raw"], cpu["k_raw"], cpu["v_raw"], cpu["f_raw"], cpu["b_raw"], cpu["conv_w"], q,
                  cpu["a_log"], cpu["dt_bias"], st, LOWER_BOUND, None, None, k_window=k, v_window=v)
    r = kda_chain_reference(cpu["q_raw"], cpu["k_raw"], cpu["v_raw"], cpu["f_raw"], cpu["b_raw"], cpu["conv_w"],
                            cpu["conv_window"], cpu["a_log"], cpu["dt_bias"], cpu["state"], LOWER_BOUND)
    assert torch.equal(o, r.o) and torch.equal(st, r.state) and torch.equal(torch.cat([q, k, v]), r.window)


def test_three_caches_bad_arguments_are_named():
    x = v_wide_inputs(2, 2, 2, 16, 16, 4, torch.float32, seed=9, device="cpu")
    q, k, v = x["conv_window"].split([32, 32, 32])
    base = (x["q_raw"], x["k_raw"], x["v_raw"], x["f_raw"], x["b_raw"], x["conv_w"])
    rest = (x["a_log"], x["dt_bias"], x["state"], LOWER_BOUND, None, None)
    from lingc.runtime.kernels.kda.op import check_kda_chain_args
    # (The check itself: torch 2.11's dispatcher fails on a call that gives one of the two.)
    with pytest.raises(ValueError, match="k_window and v_window go together"):
        check_kda_chain_args(*base, q.clone(), *rest, False, k.clone(), None)
    with pytest.raises(ValueError, match=r"v_window must be \[32, W-1 or W\].*got \(32, 3\)"):
        kda_chain(*base, q.clone(), *rest, k_window=k.clone(), v_window=v[:, :3].clone())

def test_op_schema_declares_mutations():
    schema = str(torch.ops.lingc.kda_chain.default._schema)
    for name in ("conv_window", "state", "stage_states", "stage_windows"):
        assert f"!) {name}" in schema or f"!)? {name}" in schema, schema
    commit = str(torch.ops.lingc.kda_commit.default._schema)
    assert "!) state" in commit and "!) conv_window" in commit and "!) stage_states" not in commit


@pytest.mark.parametrize("staged", [False, True], ids=["persistent", "staged"])
def test_op_fake_impls(staged):
    x = make_inputs(6, 2, 16, torch.bfloat16, seed=72, device="cpu")
    with FakeTensorMode() as mode:
        fx = {k: mode.from_tensor(v) for k, v in x.items()}
        ss = torch.empty(6, 2, 16, 16) if staged else None
        sw = torch.empty(6, 3, 32, 3, dtype=torch.bfloat16) if staged else None
        o = torch.ops.lingc.kda_chain(*ref_args(fx), ss, sw)
        assert o.shape == (6, 2, 16) and o.dtype == torch.float32
        if staged:
            torch.ops.lingc.kda_commit(fx["state"], fx["conv_window"], ss, sw, torch.tensor(2))
        with pytest.raises(ValueError, match="T = 17"):
            torch.ops.lingc.kda_chain(*ref_args(prefix({**fx, "q_raw": torch.empty(17, 32, dtype=torch.bfloat16)}, 17)),
                                      None, None)


def test_op_under_aot_functionalisation():
    # The declared mutations survive functionalisation: a compiled step updates the caller's
    # state and window exactly as the eager op does, and the staged op leaves them alone.
    x = make_inputs(3, 2, 16, torch.float32, seed=73, device="cpu")

    def step(state, window, ss, sw, idx):
        o1 = torch.ops.lingc.kda_chain(*ref_args(x, state, window), ss, sw)
        torch.ops.lingc.kda_commit(state, window, ss, sw, idx)
        o2 = torch.ops.lingc.kda_chain(*ref_args(x, state, window), None, None)
        return o1 + o2

    def buffers():
        return (x["state"].clone(), x["conv_window"].clone(), torch.zeros(3, 2, 16, 16),
                torch.zeros(3, 3, 32, 3), torch.tensor(1))

    eager, compiled = buffers(), buffers()
    out_e = step(*eager)
    out_c = torch.compile(step, backend="aot_eager", fullgraph=True)(*compiled)
    assert torch.equal(out_e, out_c)
    for a, b in zip(eager, compiled):
        assert torch.equal(a, b)
    assert not torch.equal(compiled[0], x["state"])


def _bad(name, value):
    x = make_inputs(3, 2, 16, torch.float32, seed=80, device="cpu")
    args = dict(zip(["q_raw", "k_raw", "v_raw", "f_raw", "b_raw", "conv_w", "conv_window", "a_log",
                     "dt_bias", "state", "lower_bound"], ref_args(x)))
    args.update(stage_states=None, stage_windows=None)
    args[name] = value
    return args


@pytest.mark.parametrize("name,value,match", [
    ("q_raw", torch.zeros(0, 32), "T = 0"),
    ("k_raw", torch.zeros(3, 31), r"k_raw must be \[T, HK\*K\] = \(3, 32\), got \(3, 31\)"),
    ("v_raw", torch.zeros(3, 32, dtype=torch.bfloat16), "v_raw.dtype torch.bfloat16 differs"),
    ("b_raw", torch.zeros(3, 3), r"b_raw must be \[T, H\] = \(3, 2\), got \(3, 3\)"),
    ("conv_w", list(torch.zeros(3, 32, 3).unbind(0)), "W = 3"),
    ("conv_w", [torch.zeros(32, 4), torch.zeros(32, 4), torch.zeros(16, 4)], r"conv_w\[2\]"),
    ("conv_window", torch.zeros(3, 32, 3, dtype=torch.bfloat16), "conv_window.dtype torch.bfloat16"),
    ("state", torch.zeros(2, 16, 8), r"v_raw must be \[T, H\*V\] = \(3, 16\), got \(3, 32\)"),
    ("state", torch.zeros(2, 16, 16, dtype=torch.bfloat16), "torch.bfloat16"),
    ("a_log", torch.zeros(3), r"a_log must be \[H\] = \(2,\), got \(3,\)"),
    ("lower_bound", 0.5, "lower_bound .* got 0.5"),
    ("lower_bound", float("-inf"), "or None"),
    ("stage_states", torch.zeros(3, 2, 16, 16), "stage_windows=None"),
])
def test_op_bad_arguments_raise(name, value, match):
    with pytest.raises(ValueError, match=match):
        kda_chain(**_bad(name, value))


def test_op_short_stage_buffer_raises():
    args = _bad("stage_states", torch.zeros(2, 2, 16, 16))
    args["stage_windows"] = torch.zeros(2, 3, 32, 3)
    with pytest.raises(ValueError, match=r"stage_states must be \[>= T.*got \(2, 2, 16, 16\)"):
        kda_chain(**args)


def test_commit_bad_index_raises():
    s, w = torch.zeros(2, 4, 4), torch.zeros(3, 8, 3)
    with pytest.raises(ValueError, match=r"index must be .* got \(2,\) torch.int64"):
        kda_commit(s, w, torch.zeros(3, 2, 4, 4), torch.zeros(3, 3, 8, 3), torch.tensor([0, 1]))
    with pytest.raises(ValueError, match="stage_states has 3 positions but stage_windows has 2"):
        kda_commit(s, w, torch.zeros(3, 2, 4, 4), torch.zeros(2, 3, 8, 3), torch.tensor(0))


def test_config_depends_on_shape_only():
    assert config_for(8, 128, 128) == KdaConfig(bv=8, num_warps=4, fused_reductions=True)
    assert all(config_for(h, k, k).bv >= 4 for h in (1, 2, 8, 32, 64) for k in (16, 24, 128))


_COMPILE_CHECK = textwrap.dedent("""
    import re
    from sm90 import compile_sm90, sass_sm90
    from lingc.runtime.kernels.kda.kernel import _kda_chain_kernel, config_for
    sig = {n: "*bf16" for n in ["q_ptr", "k_ptr", "v_ptr", "f_ptr", "b_ptr", "win_ptr", "swin_ptr"]}
    sig.update({n: "i32" for n in ["stride_q", "stride_k", "stride_v", "stride_f", "stride_b",
                                 *(f"{g}_{x}" for g in ("glen", "gstride") for x in "qkvfb"), "T"]})
    sig.update({n: "*fp32" for n in ["wq_ptr", "wk_ptr", "wv_ptr", "alog_ptr", "dtb_ptr", "state_ptr", "o_ptr",
                                     "sstate_ptr"]})
    sig.update(ticket_ptr="*i32", lower_bound="fp32", scale="fp32", eps="fp32")
    cfg = config_for(8, 128, 128)
    assert cfg.early_ticket

    def launch_ticket(staged, warps):   # the persistent binaries as the launcher builds them
        return {} if staged else dict(EARLY_TICKET=True, ASM_TICKET=True, TICKET_LANES=32 * warps)

    barriers, persistent_ptx = {}, {}
    # The table's four binaries, the softplus gate's (Kimi Linear's) in the verify form, a state
    # stored [V, K] (state_vk) in both modes, Gated DeltaNet's per-head gate, and Qwen3-Next's
    forms = [(s, f, False, False) for s in (False, True) for f in (False, True)] + [(True, True, True, False)]
    forms += [(False, True, False, True), (True, True, False, True), (True, True, True, "per-head gate")]
    # grouped heads (two value heads per q/k head) in both modes, with Hugging Face's 4-column cache.
    forms += [(False, True, True, "grouped"), (True, True, True, "grouped")]
    for staged, fused, softplus, vk in forms:
        const = dict(H=8, K=128, V=128, BK=128, BV=cfg.bv, NVB=128 // cfg.bv, STAGED=staged,
                     STATE_BEFORE_WAIT=True, FUSED_RED=fused, USE_GDC=True, SOFTPLUS_GATE=softplus,
                     STATE_VK=vk is True, GATE_PER_HEAD=vk in ("per-head gate", "grouped"),
                     GROUP=2 if vk == "grouped" else 1, WIN=4 if vk == "grouped" else 3,
                     **launch_ticket(staged, cfg.num_warps))
        ptx, info = compile_sm90(_kda_chain_kernel, sig, const, num_warps=cfg.num_warps)
        assert "griddepcontrol.wait" in ptx
        print(staged, fused, softplus, vk, ptx.count("bar.sync"), info)
        assert " 0 bytes spill stores" in info, info
        if not vk:
            barriers[staged, fused, softplus] = ptx.count("bar.sync")
        if not staged and fused and not softplus and vk in (False, True):
            persistent_ptx[vk] = ptx    # the table's persistent binary, for the ticket's SASS below
        if vk == "grouped":     # the q/k head shared by two value heads: the same per-token work
            assert ptx.count("bar.sync") == barriers[staged, True, True if staged else False], (vk, barriers)
    # KdaConfig.fused_reductions: the two norms' and the two state products' shared-memory round
    # trips become one each (a norm's reduction across the warps costs three barriers, a state
    # product's two): six CTA barriers fewer, all of them in the token loop (persistent binary
    # 20 -> 14, staged 18 -> 12 on triton 3.6).
    for staged in (False, True):
        assert barriers[staged, True, False] == barriers[staged, False, False] - 6, barriers
    assert barriers[True, True, True] == barriers[True, True, False], barriers   # the gate is elementwise
    # V != K (expand_v, V = 2K: the rule's config), both modes and both state layouts, Gated
    # DeltaNet's gate on a flat 4-column window: no spills.
    vcfg = config_for(8, 128, 256)
    for staged in (False, True):
        for vk in (False, True):
            const = dict(H=8, K=128, V=256, BK=128, BV=vcfg.bv, NVB=256 // vcfg.bv, STAGED=staged,
                         STATE_BEFORE_WAIT=True, FUSED_RED=vcfg.fused_reductions, USE_GDC=True, SOFTPLUS_GATE=True,
                         STATE_VK=vk, GATE_PER_HEAD=True, GROUP=1, WIN=4, **launch_ticket(staged, vcfg.num_warps))
            ptx, info = compile_sm90(_kda_chain_kernel, sig, const, num_warps=vcfg.num_warps)
            print("V = 2K", staged, vk, ptx.count("bar.sync"), info)
            assert " 0 bytes spill stores" in info, ("V = 2K", staged, vk, info)
    # KdaConfig.early_ticket: the persistent binary (compiled above, both state layouts, no spills)
    # draws its ticket in the token loop after the PDL wait, one relaxed atom.inc that wraps the
    # ticket back to 0 (no reset at the end), and ptxas neither aggregates it over the warp nor
    # reads its result before the chain's last state store (the SASS): the round trip overlaps
    # the chain.
    assert sorted(persistent_ptx) == [False, True], list(persistent_ptx)
    for ptx in persistent_ptx.values():
        assert ptx.index("griddepcontrol.wait") < ptx.index("atom.global.gpu.relaxed.inc"), "the draw before the wait"
        assert ".exch" not in ptx and ".acq_rel" not in ptx, "a reset or a fence left in"
        ops = sass_sm90(ptx)
        draws = [n for n, (op, _) in enumerate(ops) if op.startswith("ATOMG.E.INC")]
        assert len(draws) == 1 and not any(op.startswith("VOTE") for op, _ in ops), "the draw aggregated"
        reg = ops[draws[0]][1][1]                                       # ATOMG.E.INC.STRONG.GPU PT, Rd, [a], Rb
        def reads(op, args):    # a store reads every operand, anything else all but its destination
            srcs = args if op.startswith(("ST", "RED", "ATOM")) else args[1:]
            return any(re.search(rf"\\b{reg}\\b", a) for a in srcs)
        first_read = next(n for n in range(draws[0] + 1, len(ops)) if reads(*ops[n]))
        last_state_store = max(n for n, (op, _) in enumerate(ops) if op == "STG.E")     # fp32 stores
        assert first_read > last_state_store, (reg, ops[first_read], first_read, last_state_store)
    # Three conv caches (fla's layers: SPLIT_WIN, the k and v caches through their own pointers).
    for staged in (False, True):
        const = dict(H=8, K=128, V=128, BK=128, BV=cfg.bv, NVB=128 // cfg.bv, STAGED=staged, STATE_BEFORE_WAIT=True,
                     FUSED_RED=True, USE_GDC=True, SOFTPLUS_GATE=True, WIN=4, SPLIT_WIN=True,
                     **launch_ticket(staged, cfg.num_warps))
        ptx, info = compile_sm90(_kda_chain_kernel, dict(sig, wink_ptr="*bf16", winv_ptr="*bf16"), const,
                                 num_warps=cfg.num_warps)
        print("three caches", staged, ptx.count("bar.sync"), info)
        assert " 0 bytes spill stores" in info, ("three caches", staged, info)
""")


def test_commit_many_compiles_for_sm90():
    # The per-layer pointer pick (tl.where on pointers) must survive the real compile, not only
    # the interpreter; the wait comes before the index load.
    run_sm90_compile_check(textwrap.dedent("""
        from sm90 import compile_sm90
        from lingc.runtime.kernels.kda.kernel import COMMIT_GROUP, _kda_commit_many_kernel
        sig = {"index_ptr": "*i64", "N_STATE": "i32", "N_WIN": "i32"}
        for i in range(COMMIT_GROUP):
            sig.update({f"s{i}": "*fp32", f"w{i}": "*bf16", f"ss{i}": "*fp32", f"sw{i}": "*bf16"})
        ptx, info = compile_sm90(_kda_commit_many_kernel, sig, dict(BLOCK=4096, USE_GDC=True), num_warps=4)
        assert ptx.index("griddepcontrol.wait") < ptx.index("ld.global"), "index read before the wait"
        assert " 0 bytes spill stores" in info, info
    """))


def test_kernel_compiles_for_sm90_without_spills():
    # The real (non-interpreted) compile for an H200 at flash-tp4-rank shapes, both modes, with
    # the bundled ptxas: catches register/shared-memory blowups without a GPU.
    run_sm90_compile_check(_COMPILE_CHECK)


# GPU: flash-tp4-rank shapes, PDL inside a CUDA graph.


def ref_args_on_cpu(x, **kw):
    """ref_args with every tensor, the conv-weight list's included, moved to the CPU reference."""
    def cpu(a):
        if isinstance(a, (list, tuple)):
            return type(a)(cpu(b) for b in a)
        return a.cpu() if torch.is_tensor(a) else a
    return [cpu(a) for a in ref_args(x, **kw)]


@pytest.mark.gpu
@pytest.mark.parametrize("T", [1, 6])
def test_gpu_softplus_gate_matches_reference(T):
    """The unbounded softplus gate (lower_bound None) at flash-tp4-rank shapes, every branch of
    softplus taken, staged and persistent."""
    x = make_inputs(T, 8, 128, torch.bfloat16, seed=95 + T)
    f = x["f_raw"].float()
    f[:, 0::4], f[:, 1::4] = f[:, 0::4].abs() * 10 + 22, -f[:, 1::4].abs() * 10 - 17
    x["f_raw"] = f.to(torch.bfloat16)
    ref = kda_chain_reference(*ref_args_on_cpu(x, lb=None))
    o, state, _, _, _ = run_kernel(x, False, config_for(8, 128, 128), lb=None)
    assert_close(o, ref.o, 1e-4)
    assert_close(state, ref.state, 1e-4)
    o_s, _, _, ss, _ = run_kernel(x, True, config_for(8, 128, 128), lb=None)
    assert torch.equal(o_s, o) and torch.equal(ss[-1], state)


@pytest.mark.gpu
@pytest.mark.parametrize("fused", [False, True], ids=["unfused", "fused"])
@pytest.mark.parametrize("staged", [False, True], ids=["persistent", "staged"])
@pytest.mark.parametrize("T", [1, 6, 8])
def test_gpu_flash_tp4_rank_matches_reference(T, staged, fused):
    x = make_inputs(T, 8, 128, torch.bfloat16, seed=90 + T)
    cfg = config_for(8, 128, 128)
    o, state, window, ss, sw = run_kernel(x, staged, replace(cfg, fused_reductions=fused))
    ref = kda_chain_reference(*ref_args_on_cpu(x))
    assert_close(o, ref.o, 1e-4)
    if staged:
        assert_close(ss, ref.stage_states, 1e-4)
        assert torch.equal(sw.cpu(), ref.stage_windows)
        assert torch.equal(state, x["state"]) and torch.equal(window, x["conv_window"])
    else:
        assert_close(state, ref.state, 1e-4)
        assert torch.equal(window.cpu(), ref.window)


@pytest.mark.gpu
@pytest.mark.parametrize("T", [1, 6])
def test_gpu_state_vk_matches_reference(T):
    """A state stored [V, K] at flash-tp4-rank shapes, the table's config: persistent and staged
    against the reference, and position T-1 of the staged chain bitwise the persistent result
    (one binary for both modes, as in the [K, V] layout)."""
    x = make_inputs(T, 8, 128, torch.bfloat16, seed=120 + T)
    xt = transposed_state(x)
    ref = kda_chain_reference(*ref_args_on_cpu(x))
    cfg = config_for(8, 128, 128)
    state, window = xt["state"].clone(), xt["conv_window"].clone()
    o = kda_chain_triton(*ref_args(xt, state, window), state_vk=True, config=cfg)
    assert_close(o, ref.o, 1e-4)
    assert_close(state.transpose(-1, -2), ref.state, 1e-4)
    assert torch.equal(window.cpu(), ref.window)
    ss = torch.full((T, 8, 128, 128), float("nan"), device="cuda")
    sw = torch.full((T, 3, 1024, 3), float("nan"), device="cuda").to(torch.bfloat16)
    o_s = kda_chain_triton(*ref_args(xt), ss, sw, state_vk=True, config=cfg)
    assert torch.equal(o_s, o) and torch.equal(ss[-1], state) and not ss.isnan().any()


@pytest.mark.gpu
def test_gpu_bv_tilings_agree_but_not_bitwise():
    # The article claims V tiling never changes a column's K reduction. Measured on the H200
    # (2026-11-29): with Triton 3.6 the bits DO differ between BV = 4, 8, 16, 32, so batch
    # invariance rests on config_for choosing BV from (H, K, V) only, never from T (checked by
    # the batch-invariance tests). The tilings still agree to fp32 rounding.
    x = make_inputs(6, 8, 128, torch.bfloat16, seed=95)
    results = [run_kernel(x, True, KdaConfig(bv=bv)) for bv in (4, 8, 16, 32)]
    for r in results[1:]:
        assert_close(r[0], results[0][0], 1e-5)
        assert_close(r[3], results[0][3], 1e-5)


@pytest.mark.gpu
def test_gpu_cuda_graph_with_pdl():
    # Three layers' decode chains (persistent), then a verify (staged) + commit, captured into one
    # CUDA graph with PDL where supported; replays must match the eager reference each time.
    layers = [make_inputs(6, 8, 128, torch.bfloat16, seed=100 + i) for i in range(3)]
    for x in layers:
        x["state0"], x["window0"] = x["state"].clone(), x["conv_window"].clone()
    ss = torch.empty(6, 8, 128, 128, device="cuda")
    sw = torch.empty(6, 3, 1024, 3, device="cuda", dtype=torch.bfloat16)
    index = torch.tensor(3, device="cuda")
    outs = [torch.empty(1, 8, 128, device="cuda") for _ in layers] + [torch.empty(6, 8, 128, device="cuda")]

    def step():
        for x, out in zip(layers, outs):
            kda_chain_triton(*ref_args(prefix(x, 1)), None, None, out)
        v = layers[0]
        kda_chain_triton(*ref_args(v), ss, sw, outs[-1])
        kda_commit_triton(v["state"], v["conv_window"], ss, sw, index)

    def reset():
        for x in layers:
            x["state"].copy_(x["state0"])
            x["conv_window"].copy_(x["window0"])

    step()  # warm-up: compiles and allocates tickets outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    assert pdl_supported("cuda") == (torch.cuda.get_device_capability()[0] >= 9 and
                                     os.environ.get("LINGC_DISABLE_PDL", "0") != "1")
    for _ in range(2):
        reset()
        graph.replay()
        torch.cuda.synchronize()
        decoded = []
        for i, (x, out) in enumerate(zip(layers, outs)):
            start = {**x, "state": x["state0"], "conv_window": x["window0"]}
            r = kda_chain_reference(*ref_args_on_cpu(prefix(start, 1)))
            assert_close(out, r.o, 1e-4)
            decoded.append(r)
        v = layers[0]
        after_decode = {**v, "state": decoded[0].state, "conv_window": decoded[0].window}
        verify = kda_chain_reference(*ref_args_on_cpu(after_decode))
        assert_close(outs[-1], verify.o, 1e-4)
        assert_close(v["state"], verify.stage_states[3], 1e-4)
        assert torch.equal(v["conv_window"].cpu(), verify.stage_windows[3])
        for x, r in zip(layers[1:], decoded[1:]):
            assert_close(x["state"], r.state, 1e-4)


def test_op_takes_the_conv_weights_as_a_list():
    """The three conv weights are read in place through their own pointers; a stacked tensor is
    refused by the op's schema (and by the check, which names the argument)."""
    from lingc.runtime.kernels.kda.op import check_kda_chain_args
    args = _bad("conv_w", torch.zeros(3, 32, 4))
    with pytest.raises(ValueError, match="list of the 3"):
        check_kda_chain_args(**args)
    with pytest.raises(RuntimeError, match=r"List\[Tensor\]"):
        kda_chain(**args)



@pytest.mark.gpu
@pytest.mark.parametrize("state_vk", [False, True], ids=["kv", "vk"])
def test_gpu_v_unequal_k_at_a_model_shape(state_vk):
    """V = 2K at a Gated DeltaNet model's per-GPU shape (8 heads, K = 128, V = 256, bf16, the
    4-column window, the rule's config) on the GPU: against the chain written from kda_math, and
    position j of the staged chain equal to the (j + 1)-token persistent chain bit for bit."""
    T, H, K, V = 6, 8, 128, 256
    x = v_wide_inputs(T, H, H, K, V, 4, torch.bfloat16, seed=71)
    cpu = {n: ([t.cpu() for t in v] if isinstance(v, list) else v.cpu()) for n, v in x.items()}
    o_ref, S_ref, w_ref = v_wide_math(cpu, H, H, K, V)
    lay = (lambda s: s.transpose(-1, -2).contiguous()) if state_vk else (lambda s: s.clone())  # noqa: E731
    unlay = (lambda s: s.transpose(-1, -2)) if state_vk else (lambda s: s)  # noqa: E731

    def run(n, staged):
        p = {**x, **{k: x[k][:n] for k in ("q_raw", "k_raw", "v_raw", "f_raw", "b_raw")}}
        state, window = lay(x["state"]), x["conv_window"].clone()
        ss = torch.full((n, *state.shape), float("nan"), device="cuda") if staged else None
        sw = torch.full((n, *window.shape), float("nan"), device="cuda").to(window.dtype) if staged else None
        o = kda_chain_triton(p["q_raw"], p["k_raw"], p["v_raw"], p["f_raw"], p["b_raw"], p["conv_w"], window,
                             p["a_log"], p["dt_bias"], state, LOWER_BOUND, ss, sw, state_vk=state_vk)
        return o, state, window, ss, sw

    o, state, window, _, _ = run(T, False)
    assert_close(o, o_ref, 1e-4)
    assert_close(unlay(state), S_ref, 1e-4)
    assert torch.equal(window.cpu(), w_ref)
    o6, _, _, ss6, sw6 = run(T, True)
    assert torch.equal(o6, o)
    for n in range(1, T + 1):
        o_n, state_n, window_n, _, _ = run(n, False)
        assert torch.equal(o_n, o6[:n]) and torch.equal(state_n, ss6[n - 1]) and torch.equal(window_n, sw6[n - 1]), n

@pytest.mark.gpu
@pytest.mark.parametrize("fused", [False, True], ids=["unfused", "fused"])
def test_gpu_staged_and_persistent_agree_bitwise_at_flash_tp4_rank_shapes(fused):
    """The relay's verify runs the staged kernel, plain decode the persistent one: position j of a
    staged chain must be the persistent kernel's j+1-token result bit for bit, at the shapes and
    table config of flash-tp4-rank (8 heads x 128, bf16), or greedy speculative != plain."""
    x = make_inputs(6, 8, 128, torch.bfloat16, seed=61)
    cfg = replace(config_for(8, 128, 128), fused_reductions=fused)
    o6, _, _, ss6, sw6 = run_kernel(x, staged=True, config=cfg)
    for n in range(1, 7):
        o, state, window, _, _ = run_kernel(prefix(x, n), staged=False, config=cfg)
        assert torch.equal(o, o6[:n]), f"outputs of a {n}-token persistent chain differ from the staged one"
        assert torch.equal(state, ss6[n - 1]) and torch.equal(window, sw6[n - 1]), f"state after {n} tokens"


@pytest.mark.gpu
def test_gpu_commit_many_flash_layers_in_a_cuda_graph():
    # A verify graph's merged commit at flash-tp4-rank's shapes (8 heads x 128 x 128, D = 1024),
    # 35 layers (5 launches), captured with PDL; the index changes between replays on the device.
    states, windows, ss, sw = _commit_many_buffers(35, 8, 128, 1024, seed=80, device="cuda")
    index = torch.tensor([2], device="cuda")
    kda_commit_many(states, windows, ss, sw, index)          # warm-up (compiles) outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        kda_commit_many(states, windows, ss, sw, index)
    for i in (5, 0, 3):
        for t in states + windows:
            t.fill_(float("nan"))
        index.fill_(i)
        graph.replay()
        torch.cuda.synchronize()
        for j in range(35):
            assert torch.equal(states[j], ss[j][i]) and torch.equal(windows[j], sw[j][i]), (j, i)
