"""lingc.relay_advance (runtime/kernels/relay_advance) and the relay_tail rewrite that emits it
(passes/relay_tail.py): the Triton kernel (the interpreter on the CPU) against the reference on
fresh random inputs over a sweep of shapes, every accept count and ring slot, into poisoned
outputs; the op's CPU path, fake impl and argument errors; the rewrite on the relay's own extend
and decode graphs (the tail's ATen kernels counted before and after) and on a foreign spelling
of the same tail; a tail with other math left alone."""
import pytest
import torch
from backend_helpers import run_and_report, stat
from model_helpers import tiny_model

from lingc.runtime.kernels.relay_advance import op as relay_op
from lingc.runtime.kernels.relay_advance.kernel import relay_advance_triton
from lingc.runtime.kernels.relay_advance.naive import relay_advance_reference

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
POISON = -7
lingc = torch.ops.lingc


def _buffers(T, H, R, accepted, accept, ring_k, seed, dtype=torch.float32, drawn=False):
    """drawn: the extend form without tokens and seed (the graph wrote its seed)."""
    g = torch.Generator().manual_seed(seed)
    i64 = lambda *s: torch.randint(0, 1 << 30, s, generator=g, dtype=torch.int64)  # noqa: E731
    b = dict(tokens=None if drawn else i64(T if accepted else 1),
             hidden=torch.randn(T, H, generator=g).to(dtype) if accepted else None,
             accept=torch.tensor([accept]), emitted=i64(T), n=i64(1), x=torch.full((1,), POISON),
             seed=torch.full((1,), POISON) if accepted and not drawn else None,
             dh=torch.full((1, H), float("nan"), dtype=dtype) if accepted else None,
             ring=torch.full((R, T + 1), POISON), ring_k=torch.tensor([ring_k]))
    return {k: (v.to(DEVICE) if v is not None else None) for k, v in b.items()}


def _run(fn, b, accepted):
    c = {k: (v.clone() if v is not None else None) for k, v in b.items()}
    fn(**c, accepted=accepted)
    return c


@pytest.mark.parametrize("accepted, drawn", [(True, False), (False, False), (True, True)])
@pytest.mark.parametrize("T, H, R", [(1, 1, 1), (2, 7, 4), (6, 96, 4), (8, 1100, 5), (9, 33, 3)])
def test_kernel_matches_the_reference_every_output_written(T, H, R, accepted, drawn):
    for accept in range(T):
        for ring_k in (0, R - 1, 1000 + accept):
            b = _buffers(T, H, R, accepted, accept, ring_k, seed=T * 1000 + accept * 10 + ring_k % 7, drawn=drawn)
            got = _run(relay_advance_triton, b, accepted)
            ref = _run(relay_advance_reference, {k: (v.cpu() if v is not None else None) for k, v in b.items()},
                       accepted)
            for k, v in got.items():
                if v is not None:
                    assert torch.equal(v.cpu(), ref[k]), (k, T, H, R, accept, ring_k)
            slot = ring_k % R
            assert (got["ring"][slot] != POISON).all() and int(got["x"]) != POISON
            others = [i for i in range(R) if i != slot]
            assert (got["ring"][others] == POISON).all()                     # only its own slot
            if accepted:
                assert not got["dh"].isnan().any() and (drawn or int(got["seed"]) != POISON)
                assert int(got["n"]) == int(b["n"]) + accept + 1
                assert torch.equal(got["dh"][0], b["hidden"][accept])
            else:
                assert int(got["n"]) == int(b["n"]) + 1 and int(got["emitted"][0]) == int(b["tokens"])
            assert int(got["ring_k"]) == ring_k + 1 and int(got["ring"][slot, T]) == accept


@pytest.mark.gpu
@pytest.mark.parametrize("accepted", [True, False])
@pytest.mark.parametrize("T", [1, 6])
def test_gpu_model_shapes(T, accepted):
    # flash-tp4-rank's hidden width (2560), the relay's verify chain (T = 6) and decode's
    # single row; the unmarked sweep above runs here only when the whole file does.
    test_kernel_matches_the_reference_every_output_written(T, 2560, 4, accepted, False)
    if accepted:
        test_kernel_matches_the_reference_every_output_written(T, 2560, 4, accepted, True)


def test_kernel_copies_a_bf16_hidden_row_exactly():
    b = _buffers(6, 300, 4, True, 4, 2, seed=3, dtype=torch.bfloat16)
    got = _run(relay_advance_triton, b, True)
    assert torch.equal(got["dh"][0], b["hidden"][4])


def test_op_on_the_cpu_is_the_reference_and_checks_its_arguments():
    b = {k: (v.cpu() if v is not None else None) for k, v in _buffers(6, 8, 4, True, 2, 5, seed=1).items()}
    got = _run(relay_op.relay_advance, b, True)
    ref = _run(relay_advance_reference, b, True)
    assert all(torch.equal(got[k], ref[k]) for k in got if got[k] is not None)
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode() as mode:
        f = {k: (mode.from_tensor(v) if v is not None else None) for k, v in b.items()}
        relay_op.relay_advance(**f, accepted=True)
    bad = dict(b, ring=torch.zeros(4, 6, dtype=torch.int64))
    with pytest.raises(ValueError, match=r"ring must be int64 \[R, T \+ 1\]"):
        relay_op.relay_advance(**bad, accepted=True)
    with pytest.raises(ValueError, match="dh must be contiguous"):
        relay_op.relay_advance(**dict(b, dh=torch.zeros(1, 8, dtype=torch.float64)), accepted=True)
    with pytest.raises(ValueError, match="takes no hidden"):
        relay_op.relay_advance(**dict(b, tokens=b["tokens"][:1]), accepted=False)
    with pytest.raises(ValueError, match="tokens and seed go together"):
        relay_op.relay_advance(**dict(b, tokens=None), accepted=True)


_COMPILE_CHECK = """
import sys
from sm90 import compile_sm90, signature
import lingc.runtime.kernels.relay_advance.kernel as K
fn = K._relay_advance_kernel
sig = signature(fn, dict(tok_ptr="*i64", hid_ptr="*bf16", acc_ptr="*i64", emit_ptr="*i64", n_ptr="*i64",
                         x_ptr="*i64", seed_ptr="*i64", dh_ptr="*bf16", ring_ptr="*i64", k_ptr="*i64"),
                ints=("stride_tok", "stride_hid", "stride_emit", "stride_ring"))
stores = {}
for accepted, has_seed in ((True, True), (True, False), (False, True)):
    const = dict(T=6, TP=8, H=2560, BH=1024, R=4, ACCEPTED=accepted, HAS_SEED=has_seed, USE_GDC=True)
    ptx, report = compile_sm90(fn, sig, const, num_warps=4, num_stages=3)
    assert "griddepcontrol.wait" in ptx and " 0 bytes spill stores" in report, (accepted, has_seed, report)
    stores[accepted, has_seed] = ptx.count("st.global")
assert stores[True, False] == stores[True, True] - 1, stores      # the seed's store compiled out
"""


def test_kernel_compiles_for_sm90_in_every_form():
    """extend (the seed = tokens[a]), extend with a drawn seed (no tokens, no seed: one store
    fewer) and decode compile for sm_90 at flash-tp4-rank's width, PDL wait in, no spill."""
    from helpers import run_sm90_compile_check

    run_sm90_compile_check(_COMPILE_CHECK)


# -- the rewrite ----------------------------------------------------------------------------------


def _launches(report) -> dict:
    """ATen kernels left in a final graph (views, getitem and new_empty launch none)."""
    out = {}
    for cls, op, n, _ in report.kernels.rows:
        if cls in ("aten", "inductor") and op != "aten.new_empty" or op == "aten.copy_":
            out[op] = n
    return out


# extend_sample (a sampling request's extend with sampled drafts): the accepted row's pick (of the
# hidden rows, before the lm_head GEMM, which writes the row into relay.draft_logits itself)
# stays; the rest is relay_advance's DRAWN form, and the draw writes the seed itself
# (sampled_targets_out).
EXTEND_SAMPLE_UNFOLDED, EXTEND_SAMPLE_FOLDED = 16, 1


@pytest.fixture(scope="module")
def tiny():
    return tiny_model()


@pytest.mark.parametrize("role, unfolded, folded", [("decode", 12, 0), ("extend", 15, 0), ("verify", 3, 0),
                                                    ("draft", 2, 0), ("extend_sample", EXTEND_SAMPLE_UNFOLDED,
                                                                      EXTEND_SAMPLE_FOLDED), ("draft_sample", 6, 0)])
def test_relay_tail_glue_is_gone(tiny, role, unfolded, folded):
    """The tiny model's decode and extend graphs (and extend_sample's, whose drawn seed's copy
    relay_tail's DRAWN form keeps and pdl_glue.drawn_token_writes then drops): the tail after
    gemm_argmax (row pick, n and x, the token ring: 12 ATen kernels in decode, 15 in extend, the ring's functional index_put and
    its two copies back included) becomes one lingc.relay_advance. Nothing else is left: the
    head's positions reach the MLA kernels as the relay's n (pdl_glue.positions_into_readers,
    either way), the embedding is folded into the first norm, and extend's NEXTN cat is
    lingc.concat_cols. (Before the ring moved into the graphs: 7 + 4
    eager ring kernels in decode, 13 + 4 in extend.) In verify the verdict, the emitted tokens
    and the final norm's rows are written into relay.accept, relay.emitted and relay.vhid by the
    ops' out variants (pdl_glue.direct_lingc_writes); the draft's chain (a cat and its copy) is
    one lingc.concat_into (pdl_glue.concat_into_inputs). draft_sample's four logits rows copied
    into relay.draft_logits (functionalisation's chain of slice_scatters, 4 row copies after
    pdl_glue.scattered_writes) are written by lingc.gemm_rows_into (gemm_rows_into_inputs)."""
    from lingc.passes.pdl_swap import PdlSwap
    from lingc.models import Ling3Cache
    from lingc.runtime.relay.buffers import RelayBuffers
    from lingc.runtime.relay.driver import PASS_ROLE
    from lingc.runtime.relay.steps import make_steps

    cfg = tiny.config
    counts, results = {}, {}
    for fold in (False, True):
        relay = RelayBuffers.allocate(5, cfg.hidden_size, cfg.dtype, "cpu", rows=4, vocab=cfg.lm_head_size)
        g = torch.Generator().manual_seed(0)
        for t in relay.tensors():
            t.copy_(torch.randint(0, 3, t.shape, generator=g) if t.dtype == torch.int64
                   else torch.randn(t.shape, generator=g))
        relay.accept.fill_(2)
        relay.temperature.fill_(0.9)
        relay.draft_uniforms.copy_(torch.rand(relay.draft_uniforms.shape, generator=g))
        cache = Ling3Cache.allocate(cfg, 32)
        PdlSwap.fold_relay_tail = fold
        try:
            _, report = run_and_report(make_steps(tiny, 5)[role], relay, cache, role=PASS_ROLE.get(role, role))
        finally:
            PdlSwap.fold_relay_tail = True
        counts[fold] = _launches(report)
        results[fold] = relay.tensors()
        ops = {op: n for _, op, n, _ in report.kernels.rows}
        if role == "verify":
            assert ops.get("lingc.greedy_verdict_out", 0) == ops.get("lingc.greedy_emit_out", 0) == int(fold)
            assert ops.get("lingc.rmsnorm_out", 0) == int(fold)
        elif role == "draft":
            assert ops.get("lingc.concat_into", 0) == int(fold)
        elif role == "draft_sample":
            # Each draft's logits row written into relay.draft_logits by its lm_head GEMM.
            assert ops.get("lingc.gemm_rows_into", 0) == 4 * int(fold) and ops.get("lingc.sampled_targets") == 4
        elif role == "extend_sample":
            # The drawn seed written by the draw itself once the tail is folded (drawn_token_writes).
            assert ops.get("lingc.relay_advance", 0) == int(fold)
            assert ops.get("lingc.sampled_targets", 0) == 1 - int(fold)
            assert ops.get("lingc.sampled_targets_out", 0) == int(fold)
            assert ops.get("lingc.gemm_rows_into", 0) == int(fold)
        else:
            assert ops.get("lingc.relay_advance", 0) == int(fold)
            if fold:
                assert "relay tail" in stat(report, "pdl_swap").notes[0]
    assert sum(counts[False].values()) == unfolded, counts[False]
    assert sum(counts[True].values()) == folded, counts[True]
    if role == "extend_sample":
        assert counts[True] == {"aten.index.Tensor": 1}, counts[True]
    else:
        assert not {"aten.copy_", "aten.gather", "aten.index.Tensor", "aten.index_put", "aten.remainder.Scalar"} \
            & set(counts[True])
    assert all(torch.equal(a, b) for a, b in zip(results[False], results[True]))


def _foreign_extend(x, w, accept, emitted, n, xt, seed, dh, ring, k):
    h = x * 2.0
    ids, _ = lingc.gemm_argmax(h, w)
    a = accept
    seed[:] = ids[a]
    dh.copy_(h[a])
    xt.copy_(torch.index_select(emitted, 0, a))
    n.add_(1).add_(a)
    ring[k % ring.shape[0]] = torch.cat([emitted, a])
    k += 1


def _foreign_decode(x, w, accept, emitted, n, xt, ring, k):
    ids, _ = lingc.gemm_argmax(x + 1.0, w)
    emitted[0] = ids[0]
    xt[:] = ids
    n += 1
    ring.index_copy_(0, torch.remainder(k, ring.shape[0]), torch.cat([emitted, accept])[None])
    k.add_(1)


def _foreign_wrong(x, w, accept, emitted, n, xt, seed, dh, ring, k):
    h = x * 2.0
    ids, _ = lingc.gemm_argmax(h, w)
    seed.copy_(ids.gather(0, accept))
    dh.copy_(h.index_select(0, accept))
    xt.copy_(emitted.gather(0, accept))
    n.copy_(n + accept + 2)                     # not the relay's advance
    ring[k % ring.shape[0]] = torch.cat([emitted, accept])
    k += 1


def _foreign_drawn(x, w, accept, emitted, n, xt, seed, dh, ring, k):
    h = x * 2.0
    ids, _ = lingc.gemm_argmax(h[-1:], w)          # a token from a lingc op, written as it is
    seed.copy_(ids)
    dh.copy_(h.index_select(0, accept))
    xt.copy_(emitted[accept])
    n += accept + 1
    ring.index_copy_(0, k % ring.shape[0], torch.cat([emitted, accept]).unsqueeze(0))
    k.add_(1)


@pytest.mark.parametrize("fn, fold", [(_foreign_extend, True), (_foreign_decode, True), (_foreign_wrong, False),
                                      (_foreign_drawn, True)])
def test_foreign_tails(fn, fold):
    import lingc.runtime.kernels.gemm  # noqa: F401
    T, H, V = 6, 16, 40
    g = torch.Generator().manual_seed(5)
    decode = fn is _foreign_decode
    args = [torch.randn(1 if decode else T, H, generator=g), torch.randn(V, H, generator=g), torch.tensor([3]),
            torch.randint(0, V, (T,), generator=g), torch.tensor([50]), torch.zeros(1, dtype=torch.int64)]
    if not decode:
        args += [torch.zeros(1, dtype=torch.int64), torch.zeros(1, H)]
    args += [torch.zeros(4, T + 1, dtype=torch.int64), torch.tensor([6])]
    eager = [a.clone() for a in args]
    fn(*eager)
    _, report = run_and_report(fn, *args, role="extend")
    ops = {op: n for _, op, n, _ in report.kernels.rows}
    assert ops.get("lingc.relay_advance", 0) == int(fold), ops
    if fold:
        # The DRAWN form keeps the drawn seed's copy.
        assert ops.get("aten.copy_", 0) == int(fn is _foreign_drawn) and "relay tail" in stat(report, "pdl_swap").notes[0]
    assert all(torch.equal(a, b) for a, b in zip(args, eager))
