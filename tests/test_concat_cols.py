"""lingc::concat_cols: the Triton kernel (interpreter on the CPU, sm_90 with -m gpu) and the op
against torch.cat over shapes and dtypes, every output element written; the pdl_swap rewrite of a
two-input last-dim cat (numerics unchanged, the ATen cat gone), and what it leaves alone."""

from __future__ import annotations

import textwrap

import pytest
import torch
from helpers import graph_edge_types, run_sm90_compile_check
from torch import nn

import lingc.runtime.kernels.concat_cols  # noqa: F401
from lingc.runtime.kernels.concat_cols.kernel import BLOCK, concat_cols_triton
from lingc.runtime.pdl import pdl_supported

DEV = "cuda" if torch.cuda.is_available() else "cpu"


def _pair(T, d1, d2, dtype, seed, strided=False):
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(T, d1 + (5 if strided else 0), generator=g)
    b = torch.randn(T, d2 + (3 if strided else 0), generator=g)
    if dtype == torch.int64:
        a, b = (a * 1000).long(), (b * 1000).long()
    a, b = a.to(dtype).to(DEV), b.to(dtype).to(DEV)
    return (a[:, 2:2 + d1], b[:, 1:1 + d2]) if strided else (a, b)


@pytest.mark.parametrize("T,d1,d2", [(1, 96, 96), (6, 96, 96), (3, 5, 130), (2, BLOCK, 7), (4, 1000, 1100), (5, 0, 9)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64])
@pytest.mark.parametrize("strided", [False, True], ids=["contiguous", "strided-rows"])
def test_kernel_equals_torch_cat_and_writes_every_element(T, d1, d2, dtype, strided):
    a, b = _pair(T, d1, d2, dtype, seed=T * 1000 + d1 + d2, strided=strided)
    poison = float("nan") if dtype.is_floating_point else -(2 ** 40)
    out = torch.full((T, d1 + d2), poison, dtype=dtype, device=DEV)
    concat_cols_triton(a, b, out)
    assert torch.equal(out, torch.cat([a, b], -1))      # bit for bit: a copy rounds nothing


def test_op_dispatch_fake_and_opcheck():
    a, b = _pair(3, 12, 20, torch.float32, seed=1)
    assert torch.equal(torch.ops.lingc.concat_cols(a, b), torch.cat([a, b], -1))
    torch.library.opcheck(torch.ops.lingc.concat_cols.default, (a, b))
    out = torch.compile(lambda a, b: torch.ops.lingc.concat_cols(a, b) * 2, backend="aot_eager", fullgraph=True)(a, b)
    assert torch.equal(out, torch.cat([a, b], -1) * 2)


@pytest.mark.parametrize("a_shape,b_shape,dtypes,match", [
    ((3, 4), (3, 4, 1), None, "must be 2-d"),
    ((3, 4), (2, 4), None, "a has 3 rows but b has 2"),
    ((3, 4), (3, 4), (torch.float32, torch.bfloat16), "must share a dtype"),
])
def test_bad_arguments_are_named(a_shape, b_shape, dtypes, match):
    da, db = dtypes or (torch.float32, torch.float32)
    with pytest.raises(ValueError, match=match):
        torch.ops.lingc.concat_cols(torch.randn(a_shape, dtype=da), torch.randn(b_shape, dtype=db))
    with pytest.raises(ValueError, match="unit stride along its rows"):
        torch.ops.lingc.concat_cols(torch.randn(3, 4), torch.randn(4, 3).t())


def rows(report):
    return {op: n for _, op, n, _ in report.kernels.rows}


class NormsThenCat(nn.Module):
    """NEXTN's head shape: two RMSNorms, their outputs side by side, a projection; ``cats`` adds a
    three-input and a dim-0 cat, which the rewrite leaves alone; ``gated`` multiplies the second
    norm's rows by a sigmoid first (the concatenation then reads a plain ATen value: no norm pair)."""

    def __init__(self, d=32, cats=False, gated=False):
        super().__init__()
        self.wa, self.wb = nn.Parameter(torch.rand(d) + 0.5), nn.Parameter(torch.rand(d) + 0.5)
        self.proj = nn.Linear(2 * d, d, bias=False)
        self.cats, self.gated = cats, gated

    @staticmethod
    def norm(x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w

    def forward(self, x, h):
        hn = self.norm(h, self.wb)
        y = self.proj(torch.cat([self.norm(x, self.wa), hn * torch.sigmoid(h) if self.gated else hn], dim=-1))
        if self.cats:
            return y, torch.cat([x, h, x], dim=-1), torch.cat([x, h], dim=0)
        return (y,)


@pytest.mark.parametrize("cats,gated", [(False, False), (True, False), (False, True)],
                         ids=["norm-pair", "other-cats-left", "one-side-gated"])
def test_pdl_swap_puts_the_head_concatenation_on_lingc(cats, gated):
    """Two norms side by side become one lingc.rmsnorm_pair_cols (the norms inside); where one
    side is not a norm's rows, the concatenation alone becomes lingc.concat_cols."""
    from backend_helpers import run_and_report, stat

    torch.manual_seed(0)
    m = NormsThenCat(cats=cats, gated=gated)
    x, h = torch.randn(6, 32), torch.randn(6, 32)
    with torch.no_grad():
        ref = m(x, h)
    out, report = run_and_report(m, x, h)
    r, notes = rows(report), stat(report, "pdl_swap").notes[0]
    assert "1 concatenations on lingc.concat_cols" in notes
    if gated:
        assert r["lingc.concat_cols"] == 1 and r["lingc.rmsnorm"] == 2 and "lingc.rmsnorm_pair_cols" not in r, r
    else:
        assert r["lingc.rmsnorm_pair_cols"] == 1 and not {"lingc.rmsnorm", "lingc.concat_cols"} & set(r), r
        assert "1 norm pairs and their concatenation on lingc.rmsnorm_pair_cols" in notes
    assert r.get("aten.cat", 0) == (2 if cats else 0)
    for a, b in zip(out, ref):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_pdl_swap_can_leave_the_concatenation_to_aten(monkeypatch):
    from backend_helpers import run_and_report

    from lingc.passes.pdl_swap import PdlSwap
    monkeypatch.setattr(PdlSwap, "fold_concat", False)
    _, report = run_and_report(NormsThenCat(), torch.randn(2, 32), torch.randn(2, 32))
    assert rows(report)["aten.cat"] == 1 and "lingc.concat_cols" not in rows(report)


_COMPILE_CHECK = textwrap.dedent("""
    import triton
    from triton.backends.compiler import GPUTarget
    from lingc.runtime.kernels.concat_cols.kernel import _concat_cols_kernel, BLOCK
    sig = dict(a_ptr="*bf16", b_ptr="*bf16", out_ptr="*bf16", D1="i32", D2="i32", stride_a="i32",
               stride_b="i32", stride_o="i32")
    const = dict(BLOCK=BLOCK, USE_GDC=True)
    src = triton.compiler.ASTSource(_concat_cols_kernel, {**sig, **{k: "constexpr" for k in const}}, const)
    ptx = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=dict(num_warps=4)).asm["ptx"]
    assert "griddepcontrol.wait" in ptx and "griddepcontrol.launch_dependents" in ptx
""")


def test_kernel_compiles_for_sm90():
    run_sm90_compile_check(_COMPILE_CHECK)


@pytest.mark.gpu
def test_gpu_flash_shapes_and_pdl_under_graph_capture():
    # NEXTN's eh_proj input at flash-tp4-rank (two [T, 2560] bf16 halves), T = 1 and 6, and a PDL
    # edge into the next kernel when the copy is captured behind another lingc kernel.
    for T in (1, 6):
        a, b = _pair(T, 2560, 2560, torch.bfloat16, seed=T)
        out = torch.full((T, 5120), float("nan"), dtype=torch.bfloat16, device=DEV)
        concat_cols_triton(a, b, out)
        assert torch.equal(out, torch.cat([a, b], -1))
    if not pdl_supported(a.device):
        pytest.skip("PDL needs compute capability >= 9")
    a, b = _pair(6, 2560, 2560, torch.bfloat16, seed=9)
    torch.ops.lingc.concat_cols(a, b)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph(keep_graph=True)
    with torch.cuda.graph(g):
        y = torch.ops.lingc.concat_cols(torch.ops.lingc.concat_cols(a, b)[:, :2560], b)
    assert graph_edge_types(g) == [1]
    g.instantiate()
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(y, torch.cat([a, b], -1))
