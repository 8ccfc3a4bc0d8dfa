"""lingc/sdpa.py and lingc/head_layout.py: fused attention ops named and run on the CPU; the
token-major / head-major conversions the MLA matchers emit."""

from __future__ import annotations

import math
import operator

import pytest
import torch
import torch.fx as fx
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx

from lingc.graph_build import emit
from lingc.head_layout import emit_layout, emit_token_major, head_layouts, token_major
from lingc.sdpa import CPU_STAND_INS, CUDA_ONLY, sdpa_call

aten = torch.ops.aten


def _operands(gen, T=3, L=11, H=2, D=12, V=8):
    q = torch.randn(1, H, T, D, generator=gen)
    k = torch.randn(1, H, L, D, generator=gen)
    v = torch.randn(1, H, L, V, generator=gen)
    bias = torch.randn(1, H, T, L, generator=gen)
    return q, k, v, bias


@pytest.mark.parametrize("op", CUDA_ONLY, ids=lambda o: o.__name__)
@pytest.mark.parametrize("causal", [False, True])
def test_stand_in_is_the_cpu_sdpa(op, causal):
    """Each CUDA-only op's stand-in returns the op's tuple with the output first, equal to the
    CPU's SDPA with the same mask, causality (top-left) and scale; flash takes no mask."""
    gen = torch.Generator().manual_seed(int(causal))
    q, k, v, bias = _operands(gen)
    if op is aten._scaled_dot_product_flash_attention.default:
        v = torch.randn(1, 2, 11, 12, generator=gen)                      # flash: equal head dims
        out = CPU_STAND_INS[op](q, k, v, 0.0, causal, scale=0.3)
        ref = F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=0.3)
    else:
        mask = None if causal else bias
        out = CPU_STAND_INS[op](q, k, v, mask, False, 0.0, causal, scale=0.3)
        ref = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal, scale=0.3)
    assert len(out) == len(op._schema.returns)
    torch.testing.assert_close(out[0], ref, rtol=0, atol=0)


def test_cudnn_stand_in_takes_fewer_key_value_heads():
    """SDPA with enable_gqa in bf16 on an H100 traces to cuDNN's op with the key / value heads as
    they are (2 for 4 query heads): the stand-in repeats them as SDPA's enable_gqa does."""
    op = aten._scaled_dot_product_cudnn_attention.default
    gen = torch.Generator().manual_seed(4)
    q, k, v, bias = _operands(gen, H=4)
    k, v = k[:, :2], v[:, :2]
    out = CPU_STAND_INS[op](q, k, v, bias, False, 0.0, False, scale=0.3)
    ref = F.scaled_dot_product_attention(q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1), attn_mask=bias,
                                         scale=0.3)
    torch.testing.assert_close(out[0], ref, rtol=1e-6, atol=1e-6)


def test_sdpa_call_names_the_operands():
    """sdpa_call binds positional and keyword arguments by the schema's names, finds the output
    (getitem 0) and the default scale 1 / sqrt(D); other nodes are not attention."""
    gen = torch.Generator().manual_seed(0)
    q, k, v, bias = _operands(gen)

    def f(q, k, v, bias):
        a = aten._scaled_dot_product_efficient_attention(q, k, v, bias, False)[0]
        b = aten._scaled_dot_product_cudnn_attention(q, k, v, None, False, is_causal=True, scale=0.25)[0]
        return a + b

    g = make_fx(f, tracing_mode="fake")(q, k, v, bias).graph
    calls = [c for c in map(sdpa_call, g.nodes) if c is not None]
    assert len(calls) == 2
    eff, cud = calls
    ph = [n for n in g.nodes if n.op == "placeholder"]
    assert (eff.q, eff.k, eff.v, eff.mask, eff.is_causal, eff.scale) == (*ph, False, None)
    assert eff.effective_scale() == pytest.approx(1 / math.sqrt(12))
    assert eff.out.target is operator.getitem and eff.out.args == (eff.node, 0)
    assert (cud.mask, cud.is_causal, cud.effective_scale()) == (None, True, 0.25)


@pytest.mark.parametrize("layout", ["th", "ht", "1ht"])
def test_layouts_round_trip(layout):
    """head_layouts names a value's layout; token_major (probe side) and emit_token_major /
    emit_layout (graph side) agree and invert each other; T == H lists both 3-d layouts."""
    T, H, X = 3, 2, 5
    x = torch.randn(T, H, X)
    held = {"th": x, "ht": x.transpose(0, 1).contiguous(), "1ht": x.transpose(0, 1).contiguous()[None]}[layout]
    g = fx.Graph()
    n = g.placeholder("n")
    n.meta["val"] = FakeTensorMode().from_tensor(held)
    assert head_layouts(n, T, H, 7, X) == [layout]
    torch.testing.assert_close(token_major(held, layout), x, rtol=0, atol=0)
    tm = emit_token_major(g, n, layout)
    back = emit_layout(g, tm, layout)
    g.output((tm, back))
    got_tm, got_back = fx.GraphModule(torch.nn.Module(), g)(held)
    torch.testing.assert_close(got_tm, x, rtol=0, atol=0)
    torch.testing.assert_close(got_back, held, rtol=0, atol=0)
    m = fx.Graph().placeholder("m")
    m.meta["val"] = torch.empty(2, 2, X)
    assert head_layouts(m, 2, 2, X) == ["th", "ht"]
