"""lingc::concat_into: the Triton kernel (interpreter on the CPU, sm_90 with -m gpu) and the op
against ``out.copy_(torch.cat(parts))`` over part counts, sizes and dtypes, every output element
written; argument checks; the pdl_swap rewrite of ``copy_(input, cat(parts))`` on a foreign
module (same results, the ATen cat and copy gone) and what it leaves alone."""

from __future__ import annotations

import textwrap

import pytest
import torch
from backend_helpers import run_and_report, stat
from helpers import graph_edge_types, run_sm90_compile_check
from torch import nn

import lingc.runtime.kernels.concat_into  # noqa: F401
from lingc.runtime.kernels.concat_into.kernel import BLOCK, concat_into_triton
from lingc.runtime.kernels.concat_into.op import MAX_PARTS
from lingc.runtime.pdl import pdl_supported

DEV = "cuda" if torch.cuda.is_available() else "cpu"


def _parts(rows, tail, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    out = []
    for n in rows:
        t = torch.randn(n, *tail, generator=g)
        out.append(((t * 1000).long() if dtype == torch.int64 else t).to(dtype).to(DEV))
    return out


def _poisoned(shape, dtype):
    return torch.full(shape, float("nan") if dtype.is_floating_point else -(2 ** 40), dtype=dtype, device=DEV)


@pytest.mark.parametrize("rows,tail", [
    ([1] * 6, ()),                      # the relay's draft chain at steps=5: x, seed, 4 drafts
    ([1] * 9, ()),                      # steps=8
    ([1], ()), ([3, 0, 2], ()),
    ([1] * MAX_PARTS, ()),
    ([700, 500, 9], ()),                # crosses a program boundary (BLOCK elements each)
    ([2, 1, 3], (96,)), ([1, 2], (BLOCK + 5,)),
])
@pytest.mark.parametrize("dtype", [torch.int64, torch.float32, torch.bfloat16])
def test_kernel_equals_torch_cat_and_writes_every_element(rows, tail, dtype):
    parts = _parts(rows, tail, dtype, seed=sum(rows) * 7 + len(rows))
    out = _poisoned((sum(rows), *tail), dtype)
    concat_into_triton(parts, out)
    assert torch.equal(out, torch.cat(parts, 0))        # bit for bit: a copy rounds nothing


def test_op_dispatch_fake_and_opcheck():
    parts = _parts([1, 2, 1], (), torch.int64, seed=3)
    out = _poisoned((4,), torch.int64)
    torch.ops.lingc.concat_into(parts, out)
    assert torch.equal(out, torch.cat(parts))
    torch.library.opcheck(torch.ops.lingc.concat_into.default, (parts, _poisoned((4,), torch.int64)))

    def f(a, b, out):
        torch.ops.lingc.concat_into([a, b * 2], out)
        return out + 1
    a, b = torch.randn(2, 5), torch.randn(3, 5)
    got = torch.compile(f, backend="aot_eager", fullgraph=True)(a, b, torch.empty(5, 5))
    assert torch.equal(got, torch.cat([a, b * 2]) + 1)


@pytest.mark.parametrize("parts,out,match", [
    ([], torch.empty(0), "takes 1 to 16 parts, got 0"),
    ([torch.zeros(1)] * 17, torch.empty(17), "takes 1 to 16 parts, got 17"),
    ([torch.zeros(2, 3)], torch.empty(2, 4), r"parts\[0\] has shape \(2, 3\); every part must be \[n, 4\]"),
    ([torch.zeros(2, dtype=torch.int64)], torch.empty(2), r"parts\[0\] is torch.int64 .* out is torch.float32"),
    ([torch.zeros(4, 2).t()], torch.empty(2, 4), r"parts\[0\] must be contiguous"),
    ([torch.zeros(2), torch.zeros(2)], torch.empty(3), "the parts have 4 rows in all but out has 3"),
    ([torch.zeros(2)], torch.empty(4)[::2], "out must be a contiguous tensor"),
])
def test_bad_arguments_are_named(parts, out, match):
    with pytest.raises(ValueError, match=match):
        torch.ops.lingc.concat_into(parts, out)


def test_a_part_overlapping_out_is_refused():
    buf = torch.arange(6)
    with pytest.raises(ValueError, match=r"parts\[1\] overlaps out"):
        torch.ops.lingc.concat_into([torch.tensor([9]), buf[1:4]], buf[2:6])


class ChainWrite(nn.Module):
    """The relay's draft tail in another spelling: a buffer input takes the concatenation of
    other inputs and of tokens computed here; ``other`` adds a cat the rewrite must leave (along
    dim 1, and one into a buffer the module also reads)."""

    def __init__(self, other=False):
        super().__init__()
        self.other = other

    def forward(self, x, anchor, chain, wide, seen):
        d = [(x * (j + 1)).argmax(-1) for j in range(3)]
        chain.copy_(torch.cat([anchor, d[0], d[1], d[2]]))
        if self.other:
            wide.copy_(torch.cat([x, x + 1, x], dim=1))
            s = seen.sum()
            seen.copy_(torch.cat([x[0], x[0] + s]))
        return x.sum(-1)


@pytest.mark.parametrize("other", [False, True], ids=["chain", "other-cats-left"])
def test_pdl_swap_writes_the_chain_with_one_kernel(other):
    x = torch.randn(1, 8)
    args = [torch.tensor([3]), torch.full((4,), -1), torch.zeros(1, 24), torch.randn(16)]
    want = [a.clone() for a in args]
    ChainWrite(other)(x, *want)
    _, report = run_and_report(ChainWrite(other), x, *args, role="forward")
    assert all(torch.equal(a, b) for a, b in zip(args, want)), (args, want)
    ops = {op: n for _, op, n, _ in report.kernels.rows}
    assert ops["lingc.concat_into"] == 1, ops
    assert ops.get("aten.cat", 0) == (2 if other else 0) and ops.get("aten.copy_", 0) == (2 if other else 0), ops
    assert "epilogue writes made direct" in stat(report, "pdl_swap").notes[0]
    off = run_and_report(ChainWrite(other), x, *[a.clone() for a in want], role="forward",
                         disable_passes=["pdl_swap"])[1]
    assert "lingc.concat_into" not in {op for _, op, _, _ in off.kernels.rows}


_COMPILE_CHECK = textwrap.dedent("""
    from sm90 import compile_sm90
    from lingc.runtime.kernels.concat_into.kernel import _concat_into_kernel, BLOCK
    for n in (1, 6, 16):
        sig = dict(parts=("*i64",) * n, starts=("i32",) * (n + 1), out_ptr="*i64", total="i32")
        ptx, report = compile_sm90(_concat_into_kernel, sig, dict(NPARTS=n, BLOCK=BLOCK, USE_GDC=True))
        assert "griddepcontrol.wait" in ptx and "griddepcontrol.launch_dependents" in ptx
        assert "0 bytes spill" in report, report
""")


def test_kernel_compiles_for_sm90():
    run_sm90_compile_check(_COMPILE_CHECK)


@pytest.mark.gpu
def test_gpu_pdl_edge_under_graph_capture():
    if not pdl_supported(torch.device(DEV)):
        pytest.skip("PDL needs compute capability >= 9")
    parts = _parts([1] * 6, (), torch.int64, seed=11)
    out, out2 = _poisoned((6,), torch.int64), _poisoned((6,), torch.int64)
    torch.ops.lingc.concat_into(parts, out)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph(keep_graph=True)
    with torch.cuda.graph(g):
        torch.ops.lingc.concat_into(parts, out)
        torch.ops.lingc.concat_into([out[:3], out[3:]], out2)
    assert graph_edge_types(g) == [1]
    g.instantiate()
    out.fill_(-1)
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, torch.cat(parts)) and torch.equal(out2, out)
