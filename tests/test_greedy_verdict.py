"""The relay's verdict ops (runtime/relay/ops.py) and their Triton kernels
(runtime/kernels/greedy_verdict): the accept count and the emitted tokens against the references
for chain lengths 2..16 and every accept count, on fresh random tokens, into poisoned outputs;
the ops' CPU path, fake shapes and argument errors; on the GPU the ops themselves, and a
graph capture of the verdict chain with its programmatic edges."""
import pytest
import torch

from helpers import graph_edge_types
from lingc.runtime.kernels.greedy_verdict.kernel import greedy_emit_triton, greedy_verdict_triton
from lingc.runtime.pdl import pdl_supported
from lingc.runtime.relay import ops

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _case(n: int, accept: int, seed: int):
    """A chain of n tokens and targets whose first `accept` drafts match (the next one does not)."""
    g = torch.Generator().manual_seed(seed)
    chain = torch.randint(0, 50000, (n,), generator=g, dtype=torch.int64)
    target = torch.randint(0, 50000, (n,), generator=g, dtype=torch.int64)
    target[:accept] = chain[1:accept + 1]
    if accept < n - 1:
        target[accept] = chain[accept + 1] + 1
    return chain.to(DEVICE), target.to(DEVICE)


@pytest.mark.parametrize("n", [2, 3, 5, 6, 8, 9, 16])
def test_kernels_match_the_references(n):
    for accept in range(n):
        chain, target = _case(n, accept, seed=n * 100 + accept)
        got = greedy_verdict_triton(chain, target, out=torch.full((1,), -7, dtype=torch.int64, device=DEVICE))
        ref = ops.greedy_verdict_reference(chain.cpu(), target.cpu())
        assert int(got) == int(ref) == accept, (n, accept)
        emitted = greedy_emit_triton(chain, target, got, out=torch.full((n,), -7, dtype=torch.int64, device=DEVICE))
        assert torch.equal(emitted.cpu(), ops.greedy_emit_reference(chain.cpu(), target.cpu(), ref)), (n, accept)


def test_kernels_read_strided_tokens():
    # The target may be a strided view (a column of a larger buffer).
    chain, target = _case(6, 3, seed=7)
    wide = torch.full((6, 3), -1, dtype=torch.int64, device=DEVICE)
    wide[:, 1] = target
    a = greedy_verdict_triton(chain, wide[:, 1])
    assert int(a) == 3
    assert torch.equal(greedy_emit_triton(chain, wide[:, 1], a).cpu(),
                       ops.greedy_emit_reference(chain.cpu(), target.cpu(), a.cpu()))


def test_ops_on_the_cpu_are_the_references():
    chain, target = (t.cpu() for t in _case(6, 2, seed=11))
    a = ops.greedy_verdict(chain, target)
    assert torch.equal(a, ops.greedy_verdict_reference(chain, target)) and int(a) == 2
    e = ops.greedy_emit(chain, target, a)
    assert e.tolist() == chain[1:3].tolist() + [int(target[2])] * 4


def test_emit_fake_shape_and_bad_arguments():
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode():
        c = torch.empty(6, dtype=torch.int64)
        assert ops.greedy_emit(c, c, torch.empty(1, dtype=torch.int64)).shape == (6,)
    chain, target = (t.cpu() for t in _case(6, 2, seed=12))
    with pytest.raises(ValueError, match="accept must be the verdict's int64"):
        ops.greedy_emit(chain, target, torch.zeros(2, dtype=torch.int64))
    with pytest.raises(ValueError, match="accept must be the verdict's int64"):
        ops.greedy_emit(chain, target, torch.zeros(1, dtype=torch.int32))
    with pytest.raises(ValueError, match="same shape|must both be"):
        ops.greedy_emit(chain, target[:4], torch.zeros(1, dtype=torch.int64))


def test_out_variants_write_their_out_and_check_it():
    # greedy_verdict_out / greedy_emit_out (pdl_glue.direct_lingc_writes emits them): the same
    # values, written into a poisoned out; a non-contiguous or mis-shaped out is refused.
    for accept in range(6):
        chain, target = _case(6, accept, seed=60 + accept)
        a = torch.full((1,), -7, dtype=torch.int64, device=DEVICE)
        ops.greedy_verdict_out(chain, target, a)
        e = torch.full((6,), -7, dtype=torch.int64, device=DEVICE)
        ops.greedy_emit_out(chain, target, a, e)
        assert int(a) == accept
        assert torch.equal(e.cpu(), ops.greedy_emit_reference(chain.cpu(), target.cpu(), a.cpu()))
    with pytest.raises(ValueError, match="out must be contiguous"):
        ops.greedy_emit_out(chain, target, a, torch.zeros(12, dtype=torch.int64, device=DEVICE)[::2])
    with pytest.raises(ValueError, match="out must be contiguous"):
        ops.greedy_verdict_out(chain, target, torch.zeros(2, dtype=torch.int64, device=DEVICE))


@pytest.mark.gpu
@pytest.mark.parametrize("n", [2, 6, 9])
def test_gpu_ops_match_the_references(n):
    for accept in range(n):
        chain, target = _case(n, accept, seed=n + accept)
        a = ops.greedy_verdict(chain, target)
        assert int(a) == accept
        assert torch.equal(ops.greedy_emit(chain, target, a).cpu(),
                           ops.greedy_emit_reference(chain.cpu(), target.cpu(), a.cpu()))


@pytest.mark.gpu
def test_gpu_verdict_chain_under_graph_capture():
    # verdict -> emit in a CUDA graph: two kernels, one programmatic edge; replays follow the inputs.
    if not pdl_supported(DEVICE):
        pytest.skip("PDL needs compute capability >= 9")
    chain, target = _case(6, 2, seed=3)
    ops.greedy_emit(chain, target, ops.greedy_verdict(chain, target))    # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph(keep_graph=True)
    with torch.cuda.graph(graph):
        a = ops.greedy_verdict(chain, target)
        e = ops.greedy_emit(chain, target, a)
    assert graph_edge_types(graph) == [1], graph_edge_types(graph)
    graph.instantiate()
    for accept in (0, 4, 5):
        c, t = _case(6, accept, seed=40 + accept)
        chain.copy_(c)
        target.copy_(t)
        graph.replay()
        torch.cuda.synchronize()
        assert int(a) == accept
        assert torch.equal(e.cpu(), ops.greedy_emit_reference(c.cpu(), t.cpu(), a.cpu()))
