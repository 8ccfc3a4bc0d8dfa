"""lingc.kda_chain with grouped heads, Qwen3-Next's Gated DeltaNet layout: HK q/k heads, each
serving H / HK value heads, and one fused short convolution over the concatenated q, k and v
channels (its cache one [2*HK*K + H*V, 3] block, its weight one [C, 4] tensor whose row slices the
op reads in place).

The oracle is written the way Qwen3-Next's decode writes it (a depthwise conv1d over
cat([cache, mixed_qkv.T]), a split, q and k repeat_interleave'd onto the value heads, the per-head
softplus gate), with no lingc code; the op's reference and the Triton kernel (interpreter on the
CPU, the GPU with CUDA) are checked against it in both modes, outputs and stage buffers
NaN-poisoned so that an unwritten element fails.
"""
import pytest
import torch
import torch.nn.functional as F

from helpers import assert_close, run_sm90_compile_check
from lingc.runtime.kernels.kda import kda_chain_reference
from lingc.runtime.kernels.kda.kernel import KdaConfig, _tickets, kda_chain_triton

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
RTOL = 1e-4 if DEVICE == "cuda" else 2e-5
W = 4
# (HK, H, K): two value heads per q/k head, four, and a masked head dim (24 -> BK 32).
SHAPES = [(1, 2, 16), (2, 4, 16), (1, 4, 8), (2, 4, 24)]


def grouped_inputs(T, HK, H, K, dtype, seed, per_head_gate=True, width=W - 1):
    """Raw projections (mixed_qkv split into q, k, v views of one [T, C] tensor, as the fused
    projection leaves them), a fused conv weight and cache (``width`` columns a channel: W - 1,
    or W as Hugging Face's cache), Gated DeltaNet's per-head gate (or a per-channel one),
    nonzero state."""
    gen = torch.Generator().manual_seed(seed)
    dqk, dv = HK * K, H * K
    C = 2 * dqk + dv

    def r(*shape, scale=1.0):
        return torch.randn(*shape, generator=gen) * scale

    mixed = r(T, C).to(dtype)
    x = dict(mixed=mixed, conv_w=r(C, W, scale=0.5), conv_window=r(C, width).to(dtype),
             f_raw=r(T, H if per_head_gate else dv).to(dtype), b_raw=r(T, H).to(dtype),
             a_log=r(H, scale=0.5), dt_bias=r(H if per_head_gate else dv, scale=0.5),
             state=r(H, K, K, scale=0.3))
    x = {n: t.to(DEVICE) for n, t in x.items()}
    x["q_raw"], x["k_raw"], x["v_raw"] = x["mixed"].split([dqk, dqk, dv], 1)
    return x


def args(x, state=None, window=None, lb=None):
    """kda_chain's positional arguments: the conv weights as row slices of the fused one."""
    dqk = x["q_raw"][0].numel()              # (a head-grouped [T, HK, K] view's too)
    conv_w = list(x["conv_w"].split([dqk, dqk, x["v_raw"][0].numel()], 0))
    return (x["q_raw"], x["k_raw"], x["v_raw"], x["f_raw"], x["b_raw"], conv_w,
            x["conv_window"] if window is None else window, x["a_log"], x["dt_bias"],
            x["state"] if state is None else state, lb)


def qwen3_next_math(x, lb=None):
    """The chain the way Qwen3-Next's decode writes it: (o [T, H, V], state, window)."""
    T, (H, K, V) = x["mixed"].shape[0], x["state"].shape
    dqk = x["q_raw"].shape[1]
    G = H // (dqk // K)
    C = x["mixed"].shape[1]
    seq = torch.cat([x["conv_window"], x["mixed"].T], -1)                  # [C, width + T]
    window = seq[:, -x["conv_window"].shape[1]:]
    y = F.silu(F.conv1d(seq[None].float(), x["conv_w"].float()[:, None], groups=C)[0, :, -T:].T)   # [T, C]
    q, k, v = y.split([dqk, dqk, H * V], -1)
    q = q.reshape(T, H // G, K).repeat_interleave(G, dim=1)
    k = k.reshape(T, H // G, K).repeat_interleave(G, dim=1)
    v = v.reshape(T, H, V)
    q = q / torch.sqrt((q * q).sum(-1, keepdim=True) + 1e-6) * K ** -0.5
    k = k / torch.sqrt((k * k).sum(-1, keepdim=True) + 1e-6)
    a = (x["f_raw"].float() + x["dt_bias"].float()).view(T, H, -1)               # [T, H, 1 or K]
    A = x["a_log"].float().exp()[:, None]
    g = -A * F.softplus(a) if lb is None else lb * torch.sigmoid(A * a)
    beta = torch.sigmoid(x["b_raw"].float())
    S, outs = x["state"].float(), []
    for t in range(T):
        S = S * g[t].exp()[..., None]
        delta = (v[t] - (S * k[t][..., None]).sum(-2)) * beta[t][:, None]
        S = S + k[t][..., None] * delta[:, None, :]
        outs.append((S * q[t][..., None]).sum(-2))
    return torch.stack(outs), S, window


def run_kernel(x, staged, config=KdaConfig(bv=8), lb=None):
    """The launcher on copies of state/window; outputs and stage buffers NaN-poisoned."""
    T, (H, K, V) = x["mixed"].shape[0], x["state"].shape
    state, window = x["state"].clone(), x["conv_window"].clone()
    out = torch.full((T, H, V), float("nan"), device=DEVICE)
    ss = sw = None
    if staged:
        ss = torch.full((T, H, K, V), float("nan"), device=DEVICE)
        sw = torch.full((T, *window.shape), float("nan"), device=DEVICE).to(window.dtype)
    kda_chain_triton(*args(x, state, window, lb), ss, sw, out, config=config)
    return out, state, window, ss, sw


def prefix(x, n):
    y = {k: (v[:n] if k in ("mixed", "f_raw", "b_raw") else v) for k, v in x.items()}
    y["q_raw"], y["k_raw"], y["v_raw"] = (t[:n] for t in (x["q_raw"], x["k_raw"], x["v_raw"]))
    return y


@pytest.mark.parametrize("lb", [None, -5.0], ids=["softplus", "bounded"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("T", [1, 3, 6])
@pytest.mark.parametrize("HK,H,K", SHAPES)
def test_grouped_heads_match_qwen3_next_math(HK, H, K, T, dtype, lb):
    x = grouped_inputs(T, HK, H, K, dtype, seed=1000 * HK + 100 * H + 10 * T + K)
    o_ref, S_ref, win_ref = qwen3_next_math(x, lb)
    r = kda_chain_reference(*args(x, lb=lb))
    assert_close(r.o, o_ref, RTOL)
    assert_close(r.state, S_ref, RTOL)
    assert torch.equal(r.window.cpu(), win_ref.cpu())
    o, state, window, _, _ = run_kernel(x, staged=False, lb=lb)
    assert_close(o, o_ref, RTOL)
    assert_close(state, S_ref, RTOL)
    assert torch.equal(window, win_ref)
    o2, state2, window2, ss, sw = run_kernel(x, staged=True, lb=lb)
    assert torch.equal(state2, x["state"]) and torch.equal(window2, x["conv_window"])
    assert_close(o2, o_ref, RTOL)
    for j in range(T):
        _, S_j, win_j = qwen3_next_math(prefix(x, j + 1), lb)
        assert_close(ss[j], S_j, RTOL)
        assert torch.equal(sw[j], win_j), f"stage window {j}"


@pytest.mark.parametrize("T", [1, 3, 6])
@pytest.mark.parametrize("HK,H,K", [(1, 2, 16), (2, 4, 24)])
def test_cache_of_the_convs_whole_width(HK, H, K, T):
    """A [C, 4] cache, Hugging Face's (the conv's whole width; the oldest column shifted out
    before any output reads it): the kernel keeps its layout, in both modes."""
    x = grouped_inputs(T, HK, H, K, torch.bfloat16, seed=300 + T + K, width=W)
    o_ref, S_ref, win_ref = qwen3_next_math(x)
    r = kda_chain_reference(*args(x))
    assert_close(r.o, o_ref, RTOL)
    assert torch.equal(r.window.cpu(), win_ref.cpu())
    o, state, window, _, _ = run_kernel(x, staged=False)
    assert_close(o, o_ref, RTOL)
    assert_close(state, S_ref, RTOL)
    assert torch.equal(window, win_ref)
    o2, _, _, ss, sw = run_kernel(x, staged=True)
    assert_close(o2, o_ref, RTOL)
    for j in range(T):
        _, S_j, win_j = qwen3_next_math(prefix(x, j + 1))
        assert_close(ss[j], S_j, RTOL)
        assert torch.equal(sw[j], win_j), f"stage window {j}"
    # The live columns are the [C, 3] cache's: the same outputs bit for bit.
    o3, state3, window3, _, _ = run_kernel(dict(x, conv_window=x["conv_window"][:, 1:].contiguous()), staged=False)
    assert torch.equal(o3, o) and torch.equal(state3, state) and torch.equal(window3, window[:, 1:])


@pytest.mark.parametrize("T", [1, 6])
def test_grouped_heads_with_a_gate_per_channel(T):
    """KDA's per-channel gate (f [T, H*K]) on grouped heads: each value head's own K decays."""
    x = grouped_inputs(T, 2, 4, 16, torch.float32, seed=7 + T, per_head_gate=False)
    o_ref, S_ref, win_ref = qwen3_next_math(x, -5.0)
    o, state, window, _, _ = run_kernel(x, staged=False, lb=-5.0)
    assert_close(o, o_ref, RTOL)
    assert_close(state, S_ref, RTOL)
    assert torch.equal(window, win_ref)


def test_one_value_head_per_qk_head_takes_either_window_layout():
    """HK == H: the flat [3*H*K, 3] window and the [3, H*K, 3] one are the same block; the
    results are bit for bit the same."""
    x = grouped_inputs(6, 2, 2, 16, torch.bfloat16, seed=3)
    flat = run_kernel(x, staged=True)
    stacked = run_kernel(dict(x, conv_window=x["conv_window"].view(3, 32, W - 1)), staged=True)
    for a, b in zip(flat, stacked):
        assert torch.equal(a.reshape(b.shape), b)


def test_batch_invariant_in_T():
    x = grouped_inputs(6, 2, 4, 16, torch.float32, seed=11)
    o6, _, _, ss6, sw6 = run_kernel(x, staged=True)
    for n in (1, 4):
        o, _, _, ss, sw = run_kernel(prefix(x, n), staged=True)
        assert torch.equal(o, o6[:n]) and torch.equal(ss, ss6[:n]) and torch.equal(sw, sw6[:n]), f"T={n}"
    # Persistent position T-1 equals the staged one bit for bit (one binary for both modes).
    o_p, state, window, _, _ = run_kernel(x, staged=False)
    assert torch.equal(o_p, o6) and torch.equal(state, ss6[-1]) and torch.equal(window, sw6[-1])


@pytest.mark.parametrize("bv", [4, 16])
def test_qk_window_written_once_by_the_last_of_its_programs(bv):
    """Persistent mode: a q/k head's window is read by all programs of its value heads (GROUP x
    NVB); the last to finish writes it and resets the q/k head's ticket, so a second launch (a
    graph replay) sees zero tickets and computes the same."""
    x = grouped_inputs(3, 1, 4, 16, torch.float32, seed=5)
    first = run_kernel(x, staged=False, config=KdaConfig(bv=bv))
    assert int(_tickets(x["state"].device, 4)[:4].abs().sum()) == 0
    second = run_kernel(x, staged=False, config=KdaConfig(bv=bv))
    for a, b in zip(first[:3], second[:3]):
        assert torch.equal(a, b)
    assert torch.equal(first[2], qwen3_next_math(x)[2])


def test_op_reads_the_fused_weight_slices_and_updates_in_place():
    x = grouped_inputs(2, 2, 4, 16, torch.float32, seed=21)
    state, window = x["state"].clone(), x["conv_window"].clone()
    o = torch.ops.lingc.kda_chain(*args(x, state, window), None, None)
    o_ref, S_ref, win_ref = qwen3_next_math(x)
    assert_close(o, o_ref, RTOL)
    assert_close(state, S_ref, RTOL)
    assert torch.equal(window, win_ref)


@pytest.mark.parametrize("what,value,match", [
    ("q_raw", (2, 3 * 16), r"q_raw must be \[T, HK\*K\] with HK dividing H = 4"),
    ("k_raw", (2, 16), r"k_raw must be \[T, HK\*K\] = \(2, 32\)"),
    ("conv_window", (3, 64, 3), r"conv_window must be \(128, 4\) or \(128, 3\)"),
    ("conv_w", (32, 4), r"conv_w\[2\] must be \[H\*V, W\] = \[64, W\]"),
])
def test_bad_grouped_arguments_raise(what, value, match):
    x = grouped_inputs(2, 2, 4, 16, torch.float32, seed=1)
    a = list(args(x))
    i = {"q_raw": 0, "k_raw": 1, "conv_window": 6}.get(what)
    if what == "conv_w":
        a[5] = a[5][:2] + [torch.zeros(*value, device=DEVICE)]
    else:
        a[i] = torch.zeros(*value, device=DEVICE)
    with pytest.raises(ValueError, match=match):
        torch.ops.lingc.kda_chain(*a, None, None)


_CARRY_CHECK = r"""
import os, re, tempfile
# A cache of its own: an entry carried in from another run (the device scripts carry Triton's
# cache without its IRs) would hand back a binary without the ttir read below.
os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp()
import triton
from triton.backends.compiler import GPUTarget
from lingc.runtime.kernels.kda.kernel import _kda_chain_kernel as fn

sig = {n: "*bf16" for n in ["q_ptr", "k_ptr", "v_ptr", "f_ptr", "b_ptr", "win_ptr", "swin_ptr"]}
sig.update({n: "i32" for n in ["stride_q", "stride_k", "stride_v", "stride_f", "stride_b",
                                 *(f"{g}_{x}" for g in ("glen", "gstride") for x in "qkvfb"), "T", "STAGED"]})
sig.update({n: "*fp32" for n in ["wq_ptr", "wk_ptr", "wv_ptr", "alog_ptr", "dtb_ptr", "state_ptr", "o_ptr",
                                 "sstate_ptr"]})
sig.update(ticket_ptr="*i32", lower_bound="fp32", scale="fp32", eps="fp32")
carried = {}
for win in (3, 4):
    const = dict(H=4, K=16, V=16, BK=16, BV=16, NVB=1, STATE_BEFORE_WAIT=False, FUSED_RED=True,
                 USE_GDC=False, SOFTPLUS_GATE=True, STATE_VK=False, GATE_PER_HEAD=True, GROUP=2, WIN=win)
    src = triton.compiler.ASTSource(fn, {**sig, **{k: "constexpr" for k in const}}, const, {})
    ttir = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=dict(num_warps=4)).asm["ttir"]
    carried[win] = int(re.search(r"= scf\.while .*-> \(([^)]*)\)", ttir).group(1).count(",")) + 1
assert carried[4] == carried[3] + 3, carried
"""


def test_the_token_loop_carries_the_shifted_out_columns():
    """The real sm_90 compile: with a 4-column cache the token loop carries the three columns
    shifted out (q, k, v) to the persistent window's store. Session 48's GPU run caught the
    kernel storing the pre-loop column instead (Triton's while carries only the names its body
    re-binds to a new value, and p* entered as an alias of what the body binds it to); the
    interpreter, plain Python, cannot see it."""
    run_sm90_compile_check(_CARRY_CHECK)


@pytest.mark.gpu
@pytest.mark.parametrize("staged", [False, True], ids=["persistent", "staged"])
@pytest.mark.parametrize("T", [1, 6])
def test_gpu_qwen3_next_tp_shapes(T, staged):
    """Qwen3-Next-80B's linear attention on one GPU of four (8 value heads, 4 q/k heads,
    K = V = 128) with the table's config, against the oracle on the CPU."""
    from lingc.runtime.kernels.kda.kernel import config_for
    x = grouped_inputs(T, 4, 8, 128, torch.bfloat16, seed=40 + T)
    o, state, window, ss, sw = run_kernel(x, staged, config=config_for(8, 128, 128))
    o_ref, S_ref, win_ref = qwen3_next_math({k: v.cpu() for k, v in x.items()})
    assert_close(o, o_ref, 1e-4)
    if staged:
        assert_close(ss[-1], S_ref, 1e-4)
        assert torch.equal(sw[-1].cpu(), win_ref)
    else:
        assert_close(state, S_ref, 1e-4)
        assert torch.equal(window.cpu(), win_ref)


@pytest.mark.gpu
def test_gpu_decode_steps_then_verify_and_commit_in_a_cuda_graph():
    """Qwen3-Next-80B's per-GPU layer on Hugging Face's [C, 4] cache, captured with PDL: two
    decode steps (persistent: the q/k window by the last of its GROUP x NVB programs, whose
    ticket must be back at zero for the next step and every replay), then a staged verify and the
    commit of its position 2. Each replay from the same start equals the reference."""
    from lingc.runtime.kernels.kda.kernel import config_for, kda_commit_triton
    x = grouped_inputs(6, 4, 8, 128, torch.bfloat16, seed=77, width=W)
    state0, cache0 = x["state"].clone(), x["conv_window"].clone()
    cfg = config_for(8, 128, 128)
    outs = [torch.empty(1, 8, 128, device="cuda") for _ in range(2)] + [torch.empty(6, 8, 128, device="cuda")]
    ss = torch.empty(6, 8, 128, 128, device="cuda")
    sw = torch.empty(6, *cache0.shape, device="cuda", dtype=cache0.dtype)
    index = torch.tensor(2, device="cuda")

    rows = ("q_raw", "k_raw", "v_raw", "f_raw", "b_raw")

    def step():
        for t in range(2):                      # decode step t: token t alone
            kda_chain_triton(*args({**x, **{k: x[k][t:t + 1] for k in rows}}), None, None, outs[t], config=cfg)
        kda_chain_triton(*args(x), ss, sw, outs[2], config=cfg)
        kda_commit_triton(x["state"], x["conv_window"], ss, sw, index)

    def reset():
        x["state"].copy_(state0)
        x["conv_window"].copy_(cache0)

    step()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    cpu = {k: v.cpu() for k, v in x.items()}
    cpu["state"], cpu["conv_window"] = state0.cpu(), cache0.cpu()
    for _ in range(2):
        reset()
        graph.replay()
        torch.cuda.synchronize()
        start = dict(cpu)
        for t in range(2):                      # the two decode steps, token t each
            r = kda_chain_reference(*args({**start, **{k: cpu[k][t:t + 1] for k in rows}}))
            assert_close(outs[t], r.o, 1e-4)
            start = {**start, "state": r.state, "conv_window": r.window}
        verify = kda_chain_reference(*args(start))
        assert_close(outs[2], verify.o, 1e-4)
        assert_close(x["state"], verify.stage_states[2], 1e-4)
        assert torch.equal(x["conv_window"].cpu(), verify.stage_windows[2])


@pytest.mark.parametrize("staged", [False, True], ids=["persistent", "staged"])
@pytest.mark.parametrize("T", [1, 3])
@pytest.mark.parametrize("HK,H,K", [(2, 4, 16), (2, 4, 24)])
def test_head_grouped_views_read_in_place(HK, H, K, T, staged):
    """q, k, v, b and f as Qwen3-Next's projections leave them: [T, HK, .] pieces of each q/k
    head's group in the fused qkvz and ba outputs (fix_query_key_value_ordering's split, no
    copy), each read as the [T, N] rows it holds. The kernel (outputs, state, window and stages
    NaN-poisoned or copied) and the op on the CPU give bitwise what the contiguous copies give."""
    G = H // HK
    x = grouped_inputs(T, HK, H, K, torch.bfloat16, seed=77 + T + K)
    gen = torch.Generator().manual_seed(5 + T)
    qkvz = (torch.randn(T, HK, 2 * K + 2 * G * K, generator=gen)).to(torch.bfloat16).to(DEVICE)
    ba = (torch.randn(T, HK, 2 * G, generator=gen)).to(torch.bfloat16).to(DEVICE)
    q, k, v, _z = qkvz.split([K, K, G * K, G * K], 2)
    b, f = ba.split([G, G], 2)
    grouped = dict(x, q_raw=q, k_raw=k, v_raw=v, b_raw=b, f_raw=f)
    flat = dict(x, **{n: t.reshape(T, -1) for n, t in grouped.items() if n.endswith("_raw")})
    assert flat["q_raw"].data_ptr() != q.data_ptr() and q.stride(1) == 2 * K + 2 * G * K   # views, no [T, N] one
    got, want = run_kernel(grouped, staged), run_kernel(flat, staged)
    for a, b_ in zip(got, want):
        assert a is None or torch.equal(a, b_)
    assert not got[0].isnan().any()
    cpu = {n: t.cpu() for n, t in grouped.items()}
    state = cpu["state"].clone()
    o = torch.ops.lingc.kda_chain(*args(cpu, state=state, window=cpu["conv_window"].clone()), None, None)
    r = kda_chain_reference(*args({n: t.cpu() for n, t in flat.items()}))
    assert torch.equal(o, r.o) and torch.equal(state, r.state)
