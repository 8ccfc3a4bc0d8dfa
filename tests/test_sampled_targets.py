"""``lingc.sampled_targets`` (runtime/relay/ops.py) and its Triton passes
(runtime/kernels/sampled_targets): speculative sampling's outcome against the reference
(runtime/relay/sampling.py) on fresh random logits, with ties, masked (-inf) tokens, every accept
count, every top_p regime, into poisoned outputs; the op's CPU path, fake shape and argument
errors; on the GPU the op at the real vocabulary sizes and inside a captured graph."""
import textwrap

import pytest
import torch

from helpers import graph_edge_types, run_sm90_compile_check
from lingc.runtime.kernels.sampled_targets.kernel import MAX_CHUNKS, chunking, sampled_targets_triton
from lingc.runtime.pdl import pdl_supported
from lingc.runtime.relay import ops
from lingc.runtime.relay.sampling import sampling_probs

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _case(n: int, vocab: int, seed: int, ties: bool):
    """Random logits (rounded to halves with ties: many equal logits, at every nucleus cut), and a
    chain whose drafts are each row's argmax or a random token."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(n, vocab, generator=g) * 3
    if ties:
        logits = (logits * 2).round() / 2
    chain = torch.randint(0, vocab, (n,), generator=g)
    likely = torch.rand(n, generator=g) < 0.6
    chain[1:] = torch.where(likely[1:], logits[:-1].argmax(-1), chain[1:])
    return chain, logits, g


def _uniforms(u: torch.Tensor, seed: int):
    """A [5, n + 2] table of fresh uniforms holding u in row `step % 5`, and that step (> 5: the
    kernel takes the row modulo the rows)."""
    g = torch.Generator().manual_seed(seed)
    step = int(torch.randint(0, 40, (1,), generator=g))
    table = torch.rand(5, u.numel() + 2, generator=g)
    table[step % 5, :u.numel()] = u
    return table, torch.tensor([step])


def _both(chain, logits, u, temperature, top_p, sub=None, draft_logits=None):
    t = torch.tensor([temperature], device=DEVICE)
    p = None if top_p is None else torch.tensor([top_p], device=DEVICE)
    out = torch.full((chain.numel(),), -7, dtype=torch.int64, device=DEVICE)
    table, step = _uniforms(u, seed=int(logits.numel()))
    got = sampled_targets_triton(chain.to(DEVICE), logits.to(DEVICE), table.to(DEVICE), step.to(DEVICE), t, p,
                                 out=out, sub=sub,
                                 draft_logits=None if draft_logits is None else draft_logits.to(DEVICE))
    ref = ops.sampled_targets_reference(chain, logits, u, torch.tensor([temperature]),
                                        None if top_p is None else torch.tensor([top_p]), draft_logits)
    return got.cpu(), ref


def _sampled_draft_case(n: int, vocab: int, seed: int, ties: bool, temperature: float):
    """_case's logits with draft logits near them (the target's plus noise), and drafts drawn from
    the draft's softmax at the temperature."""
    chain, logits, g = _case(n, vocab, seed, ties)
    draft = logits[:-1] * 0.8 + torch.randn(n - 1, vocab, generator=g)
    if n > 1:
        chain[1:] = torch.multinomial(torch.softmax(draft / temperature, -1), 1, generator=g)[:, 0]
    return chain, logits, draft, g


@pytest.mark.parametrize("n, vocab, sub, ties", [(1, 37, 16, False), (2, 300, 32, True), (4, 1000, 64, False),
                                                 (6, 257, 16, True), (3, 3000, 256, True)])
def test_kernel_matches_the_reference(n, vocab, sub, ties):
    """Every top_p regime; top_p None (no nucleus known at launch: pass 0 alone) gives what
    top_p 1 gives from the same uniforms."""
    chain, logits, g = _case(n, vocab, seed=n * 1000 + vocab, ties=ties)
    for top_p, temperature in ((1.0, 1.0), (0.9, 0.6), (0.3, 1.3), (1e-6, 1.0), (None, 0.8)):
        u = torch.rand(n, generator=g)
        got, ref = _both(chain, logits, u, temperature, top_p, sub)
        assert (got >= 0).all(), "an output element was not written"
        assert torch.equal(got, ref), (top_p, temperature, got.tolist(), ref.tolist())
        if top_p is None:
            assert torch.equal(got, _both(chain, logits, u, temperature, 1.0, sub)[0])


@pytest.mark.parametrize("n", [2, 4, 6])
def test_every_accept_count(n):
    """Drafts 1..a certain (logit +20: accepted for any u), d_{a+1} impossible (-20: rejected); the
    token after them drawn from row a without d_{a+1}."""
    vocab = 200
    for a in range(n):
        chain, logits, g = _case(n, vocab, seed=100 * n + a, ties=False)
        for j in range(n - 1):
            logits[j, chain[j + 1]] = 20.0 if j < a else -20.0
        u = torch.rand(n, generator=g) * 0.999
        got, ref = _both(chain, logits, u, 1.0, 0.95, sub=16)
        assert torch.equal(got, ref), (a, got.tolist(), ref.tolist())
        assert int(ops.greedy_verdict_reference(chain, got)) == min(a, n - 1)
        assert got[a] != (chain[a + 1] if a < n - 1 else -1)


@pytest.mark.parametrize("n, vocab, sub, ties", [(2, 37, 16, False), (3, 300, 32, True), (6, 257, 16, False),
                                                 (4, 1000, 64, True)])
def test_kernel_with_sampled_drafts_matches_the_reference(n, vocab, sub, ties):
    """Sampled drafts (draft logits given): the acceptance by p / q and the residual draw of pass
    4, for each top_p regime, against the reference; every accept count occurs over the trials."""
    seen = set()
    for trial in range(3):
        for top_p, temperature in ((1.0, 1.0), (0.9, 0.6), (0.3, 1.3), (None, 0.8)):
            chain, logits, draft, g = _sampled_draft_case(n, vocab, 31 * trial + n + vocab, ties, temperature)
            u = torch.rand(n, generator=g)
            got, ref = _both(chain, logits, u, temperature, top_p, sub, draft_logits=draft)
            assert (got >= 0).all(), "an output element was not written"
            assert torch.equal(got, ref), (trial, top_p, temperature, got.tolist(), ref.tolist())
            seen.add(int(ops.greedy_verdict_reference(chain, got)))
    assert len(seen) >= 2, seen


@pytest.mark.parametrize("n", [2, 4])
def test_sampled_drafts_every_accept_count_and_the_residual_fallback(n):
    """Drafts 1..a accepted for any u (q = p on those rows: the draft's logits are the
    target's, no nucleus), d_{a+1} impossible under p (logit -inf): rejected, and row a's token
    drawn from the residual max(0, p_a - q_a), never d_{a+1}."""
    vocab = 120
    for a in range(n):
        chain, logits, draft, g = _sampled_draft_case(n, vocab, seed=7 * n + a, ties=False, temperature=1.0)
        draft[:a] = logits[:a]
        if a < n - 1:
            logits[a, chain[a + 1]] = float("-inf")
        u = torch.rand(n, generator=g) * 0.999
        got, ref = _both(chain, logits, u, 1.0, 1.0, sub=16, draft_logits=draft)
        assert torch.equal(got, ref), (a, got.tolist(), ref.tolist())
        assert int(ops.greedy_verdict_reference(chain, got)) == min(a, n - 1)
        if a < n - 1:
            assert got[a] != chain[a + 1]


@pytest.mark.parametrize("top_p", [1.0, 0.8, 0.3])
def test_sampled_drafts_of_the_targets_distribution_are_always_accepted(top_p):
    """Draft logits equal to the target's, drafts drawn from their nucleus: q has p's cut (the
    draft rows are searched in the same launch, with the same code), so every draft is accepted
    whatever u, in the kernel as in the reference; the token after them comes from the last row."""
    n, vocab, temperature = 5, 300, 0.9
    for trial in range(3):
        chain, logits, g = _case(n, vocab, seed=40 + trial, ties=trial == 1)
        q = sampling_probs(logits[:-1], torch.tensor([temperature]), torch.tensor([top_p]))
        chain[1:] = torch.multinomial(q, 1, generator=g)[:, 0]
        u = torch.rand(n, generator=g) * 0.999
        got, ref = _both(chain, logits, u, temperature, top_p, sub=32, draft_logits=logits[:-1].clone())
        assert torch.equal(got, ref), (trial, got.tolist(), ref.tolist())
        assert torch.equal(got[:-1], chain[1:]), (trial, got.tolist(), chain.tolist())


def test_sampled_drafts_residual_without_mass_falls_back_to_p_less_the_draft():
    """p_0 = delta(0); q_0 = (1 - e, e) with e = exp(-50), so q_0(0) rounds to 1 in fp32 and the
    residual max(0, p_0 - q_0) has no mass at all; the rejected draft d_1 = 1 (p_0(1) = 0) is
    then followed by a draw from p_0 less d_1: token 0, whatever u."""
    logits = torch.tensor([[0.0, float("-inf"), float("-inf")], [0.5, 0.0, 1.0]])
    draft = torch.tensor([[0.0, -50.0, float("-inf")]])
    for u in ((0.0, 0.5), (0.7, 0.01), (0.3, 0.99)):
        got, ref = _both(torch.tensor([2, 1]), logits, torch.tensor(u), 1.0, 1.0, sub=16, draft_logits=draft)
        assert got.tolist()[0] == ref.tolist()[0] == 0, (u, got.tolist(), ref.tolist())


def test_masked_tokens_and_a_one_token_nucleus():
    """-inf logits (a masked vocabulary tail) are never drawn nor kept; with top_p near 0 the draw
    is the argmax's tie group (here one token) whatever u."""
    n, vocab = 3, 300
    chain, logits, g = _case(n, vocab, seed=5, ties=False)
    logits[:, 200:] = float("-inf")
    logits[1, :150] = float("-inf")
    for top_p in (1.0, 0.8, 1e-6):
        u = torch.rand(n, generator=g)
        got, ref = _both(chain, logits, u, 0.8, top_p, sub=32)
        assert torch.equal(got, ref), (top_p, got.tolist(), ref.tolist())
        assert (got < 200).all()
    chain[1:] = (logits[:-1].argmax(-1) + 1) % 150          # rejected drafts: the draw is row 0's
    got, _ = _both(chain, logits, torch.full((n,), 0.5), 1.0, 1e-6, sub=32)
    assert int(got[0]) == int(logits[0].argmax())


def test_tied_maxima_are_one_nucleus():
    """Two tokens share the largest logit: however small top_p, both stay in the nucleus (the
    reference's rule), so each is drawn for some u."""
    logits = torch.randn(1, 64, generator=torch.Generator().manual_seed(3))
    logits[0, 10] = logits[0, 40] = 9.0
    drawn = set()
    for u in (0.1, 0.9):
        got, ref = _both(torch.tensor([0]), logits, torch.tensor([u]), 1.0, 1e-6, sub=16)
        assert torch.equal(got, ref)
        drawn.add(int(got[0]))
    assert drawn == {10, 40}


def _from_bits(bits: torch.Tensor) -> torch.Tensor:
    return bits.to(torch.int32).view(torch.float32)


def test_two_tokens_in_one_16_bit_bin_are_told_apart():
    """Tokens A and B share their first 16 key bits (B a step of the 17-24th bits below A): at
    top_p 0.3 the nucleus is A alone, which pass 2 decides; a cut at their 16-bit bin's start
    would draw B about half the time."""
    logits = torch.randn(1, 500, generator=torch.Generator().manual_seed(4)) - 20.0
    logits[0, 7] = _from_bits(torch.tensor(0x40A00100))          # A
    logits[0, 300] = _from_bits(torch.tensor(0x40A00000))        # B = 5.0, just below A
    for u in (0.05, 0.3, 0.5, 0.7, 0.95):
        got, ref = _both(torch.tensor([0]), logits, torch.tensor([u]), 1.0, 0.3, sub=32)
        assert got.tolist() == ref.tolist() == [7], (u, got.tolist(), ref.tolist())


@pytest.mark.parametrize("rows, vocab", [(1, 37), (4, 39296), (6, 39296), (6, 157184), (32, 157184)])
def test_chunking_covers_the_row_in_at_most_max_chunks(rows, vocab):
    for sms in (8, 132):
        sub, iters, chunks = chunking(rows, vocab, sms)
        assert chunks <= MAX_CHUNKS and sub * iters * chunks >= vocab > sub * iters * (chunks - 1)


_COMPILE_CHECK = textwrap.dedent("""
    import re
    import triton
    from sm90 import compile_sm90, signature
    import lingc.runtime.kernels.sampled_targets.kernel as K
    fn = K._nucleus_pass_kernel
    sig = signature(fn, dict(logits_ptr="*fp32", chain_ptr="*i64", u_ptr="*fp32", step_ptr="*i64", temp_ptr="*fp32",
                             top_p_ptr="*fp32", y_ptr="*i64", stats_ptr="*fp32", hist_ptr="*fp32",
                             above_ptr="*fp32", rowf_ptr="*fp32", rowi_ptr="*i32", ticket_ptr="*i32",
                             q_ptr="*fp32", a_ptr="*i32", res_ptr="*fp32"),
                    ints=("stride_l", "stride_c", "R", "stride_u", "V", "C", "stride_q"))
    for n, passes, draft_q, one in ((6, (0, 1, 2, 3), False, False), (1, (3,), False, False),
                                    (6, (0, 3, 4), True, False), (1, (0,), False, True), (6, (0, 4), True, True)):
        assert passes == K.passes(True, draft_q) or not one
        ra = K.searched_rows(n, draft_q)
        sub, iters, chunks = K.chunking(ra, 39296, 132)
        for p in passes:
            const = dict(PASS=p, N=n, NP=max(2, triton.next_power_of_2(n)), CP=triton.next_power_of_2(chunks),
                         SUB=sub, ITERS=iters, B=K.batches(sub), USE_GDC=True, DRAFT_Q=draft_q, NO_NUCLEUS=one,
                         RA=ra)
            ptx, report = compile_sm90(fn, sig, const, num_warps=K.pass_warps(p), num_stages=3)
            assert "griddepcontrol.wait" in ptx and "griddepcontrol.launch_dependents" in ptx, p
            spills = [int(x) for x in re.findall(r"(\\d+) bytes spill stores", report)]
            assert spills and max(spills) == 0, (n, p, draft_q, report)
""")


def test_passes_compile_for_sm90_without_spilling():
    """The first build (Triton's tf32x3 product over sub-blocks of 512) spilled to 9 KB of stack
    and took 0.3 ms a pass on an H100 (session 57): every pass at flash-tp4-rank's vocabulary
    compiles without a spill, those of sampled drafts (the draft's rows searched with the
    target's, pass 3's accept count, pass 4's residual draw) included, and pass 0 finishing alone (top_p None)."""
    run_sm90_compile_check(_COMPILE_CHECK)


def test_op_on_the_cpu_is_the_reference_and_checks_its_arguments():
    chain, logits, g = _case(4, 50, seed=9, ties=False)
    u, t, p = torch.rand(4, generator=g), torch.tensor([0.7]), torch.tensor([0.9])
    table, step = _uniforms(u, seed=1)
    assert torch.equal(ops.step_uniforms(table, step, 4), u)
    assert torch.equal(ops.sampled_targets(chain, logits, table, step, t, p),
                       ops.sampled_targets_reference(chain, logits, u, t, p))
    assert torch.equal(ops.sampled_targets(chain, logits, table, step, t, None),
                       ops.sampled_targets_reference(chain, logits, u, t, torch.tensor([1.0])))
    out = torch.full((4,), -7, dtype=torch.int64)
    ops.sampled_targets_out(chain, logits, table, step, t, p, out)
    assert torch.equal(out, ops.sampled_targets_reference(chain, logits, u, t, p))
    with pytest.raises(ValueError, match="sampled_targets_out: out must be contiguous torch.int64"):
        ops.sampled_targets_out(chain, logits, table, step, t, p, out[:3])
    with torch._subclasses.fake_tensor.FakeTensorMode() as mode:
        fake = ops.sampled_targets(*(mode.from_tensor(x) for x in (chain, logits, table, step, t, p)))
        assert fake.shape == (4,) and fake.dtype == torch.int64
    bad = {"chain": (chain.int(), logits, table, step, t, p), "logits": (chain, logits[:3], table, step, t, p),
           "uniforms": (chain, logits, table[:, :3], step, t, p), "step": (chain, logits, table, step.int(), t, p),
           "top_p": (chain, logits, table, step, t, torch.tensor(0.9)),
           "unit stride": (chain, logits.t().contiguous().t(), table, step, t, p)}
    for what, args in bad.items():
        with pytest.raises(ValueError, match=what):
            ops.sampled_targets(*args)


@pytest.mark.gpu
@pytest.mark.parametrize("n, vocab", [(4, 39296), (6, 39296), (6, 157184)])
def test_gpu_op_matches_the_reference_at_vocabulary_size(n, vocab):
    """The real sizes (flash-tp4-rank's 39296-row lm_head shard, the whole 157184 vocabulary):
    the op on fresh logits and uniforms for each top_p regime equals the CPU reference (to fp32
    rounding at a boundary: none expected in these draws)."""
    for trial in range(8):
        chain, logits, g = _case(n, vocab, seed=trial, ties=trial % 2 == 1)
        for top_p, temperature in ((1.0, 1.0), (0.9, 0.7), (0.5, 1.2), (None, 0.9)):
            u = torch.rand(n, generator=g)
            table, step = _uniforms(u, seed=trial)
            tp = None if top_p is None else torch.tensor([top_p])
            got = ops.sampled_targets(chain.cuda(), logits.cuda(), table.cuda(), step.cuda(),
                                      torch.tensor([temperature], device="cuda"), None if tp is None else tp.cuda())
            ref = ops.sampled_targets_reference(chain, logits, u, torch.tensor([temperature]), tp)
            assert torch.equal(got.cpu(), ref), (trial, top_p, got.tolist(), ref.tolist())
            out = torch.full((n,), -7, dtype=torch.int64, device="cuda")
            ops.sampled_targets_out(chain.cuda(), logits.cuda(), table.cuda(), step.cuda(),
                                    torch.tensor([temperature], device="cuda"), None if tp is None else tp.cuda(), out)
            assert torch.equal(out.cpu(), ref), (trial, top_p, out.tolist(), ref.tolist())


@pytest.mark.gpu
@pytest.mark.parametrize("n, vocab", [(6, 39296), (4, 157184)])
def test_gpu_op_with_sampled_drafts_matches_the_reference_at_vocabulary_size(n, vocab):
    for trial in range(6):
        for top_p, temperature in ((1.0, 1.0), (0.9, 0.7), (None, 0.8)):
            chain, logits, draft, g = _sampled_draft_case(n, vocab, 50 + trial, trial % 2 == 1, temperature)
            u = torch.rand(n, generator=g)
            table, step = _uniforms(u, seed=trial)
            tp = None if top_p is None else torch.tensor([top_p])
            got = ops.sampled_targets(chain.cuda(), logits.cuda(), table.cuda(), step.cuda(),
                                      torch.tensor([temperature], device="cuda"), None if tp is None else tp.cuda(),
                                      draft.cuda())
            ref = ops.sampled_targets_reference(chain, logits, u, torch.tensor([temperature]), tp, draft)
            assert torch.equal(got.cpu(), ref), (trial, top_p, got.tolist(), ref.tolist())


@pytest.mark.gpu
def test_gpu_captured_passes_replay_with_new_uniforms_and_keep_their_programmatic_edges():
    n, vocab = 6, 39296
    chain, logits, g = _case(n, vocab, seed=11, ties=False)
    c, lg = chain.cuda(), logits.cuda()
    table = torch.rand(7, n, generator=g).cuda()
    step = torch.zeros(1, dtype=torch.int64, device="cuda")
    t, p = torch.tensor([0.8], device="cuda"), torch.tensor([0.9], device="cuda")
    ops.sampled_targets(c, lg, table, step, t, p)                      # warm-up: compile, tickets
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph(keep_graph=True)
    with torch.cuda.graph(graph):
        y = ops.sampled_targets(c, lg, table, step, t, p)
    if pdl_supported(c.device):
        assert graph_edge_types(graph) == [1, 1, 1], graph_edge_types(graph)     # the four passes' chain
    graph.instantiate()
    for trial in range(20):
        fresh = torch.rand(n, generator=g)
        table[trial % 7].copy_(fresh)
        step.fill_(trial)
        p.fill_(0.9 if trial % 2 else 1.0)
        graph.replay()
        ref = ops.sampled_targets_reference(chain, logits, fresh, torch.tensor([0.8]), p.cpu())
        assert torch.equal(y.cpu(), ref), (trial, y.tolist(), ref.tolist())


@pytest.mark.gpu
@pytest.mark.parametrize("n, draft", [(1, False), (6, False), (6, True)])
def test_gpu_captured_without_a_nucleus_is_one_launch(n, draft):
    """top_p None (the draft's own draws): pass 0 alone (no programmatic edge in the captured
    graph), and pass 4 after it with sampled drafts (one edge); replayed with fresh uniforms it
    equals the reference."""
    vocab, temperature = 39296, 0.8
    chain, logits, q, g = _sampled_draft_case(n, vocab, 5 + n, False, temperature)
    q = q if draft else None
    c, lg, qd = chain.cuda(), logits.cuda(), None if q is None else q.cuda()
    table = torch.rand(7, n, generator=g).cuda()
    step = torch.zeros(1, dtype=torch.int64, device="cuda")
    t = torch.tensor([temperature], device="cuda")
    ops.sampled_targets(c, lg, table, step, t, None, qd)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph(keep_graph=True)
    with torch.cuda.graph(graph):
        y = ops.sampled_targets(c, lg, table, step, t, None, qd)
    if pdl_supported(c.device):
        assert graph_edge_types(graph) == ([1] if draft else []), graph_edge_types(graph)
    graph.instantiate()
    for trial in range(12):
        fresh = torch.rand(n, generator=g)
        table[trial % 7].copy_(fresh)
        step.fill_(trial)
        graph.replay()
        ref = ops.sampled_targets_reference(chain, logits, fresh, torch.tensor([temperature]), None, q)
        assert torch.equal(y.cpu(), ref), (trial, y.tolist(), ref.tolist())
