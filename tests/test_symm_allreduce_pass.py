"""symm_allreduce on a bare graph (no process group needed): which all-reduces it rewrites into
lingc.one_shot_all_reduce and which it leaves to NCCL, pinned as the graph before and after.
The numbers across two processes are tests/test_tensor_parallel.py's (gloo on the CPU, NCCL and
symmetric memory on GPUs)."""
import pytest
import torch
import torch.fx as fx
from expecttest import assert_expected_inline
from torch._subclasses.fake_tensor import FakeTensorMode

from backend_helpers import pinned_graph_text
from lingc.graph_build import emit
from lingc.graph_text import format_graph
from lingc.options import LingcOptions
from lingc.pass_manager import PassContext
from lingc.passes.symm_allreduce import MAX_BYTES, SymmAllReduce

C10D = torch.ops._c10d_functional


def _graph():
    """Three all-reduces as Dynamo's functional collectives trace them: a decode-sized bf16 sum,
    a sum over MAX_BYTES (fp32) and a bf16 average."""
    g = fx.Graph()
    with FakeTensorMode() as mode:
        vals = {"small": torch.empty(1, 96, dtype=torch.bfloat16),
                "big": torch.empty(1, MAX_BYTES // 4 + 1), "avg": torch.empty(6, 96, dtype=torch.bfloat16)}
    outs = []
    for name, v in vals.items():
        ph = g.placeholder(name)
        ph.meta["val"] = v
        ar = emit(g, C10D.all_reduce.default, ph, "avg" if name == "avg" else "sum", "0")
        outs.append(emit(g, C10D.wait_tensor.default, ar))
    g.output(tuple(outs))
    return fx.GraphModule(torch.nn.Module(), g)


def _run(allreduce):
    gm = _graph()
    before = format_graph(gm)
    stats = SymmAllReduce(PassContext(LingcOptions(allreduce=allreduce)))(gm)
    return before, format_graph(gm), stats


def test_counts_and_notes():
    _, _, st = _run("symm_mem")
    assert (st.matches, st.ops_before - st.ops_after) == (1, 1)     # all_reduce + wait -> one op
    assert st.notes == [f"1 all-reduces over {MAX_BYTES // 1024} KB left to NCCL"]
    before, after, st = _run("nccl")
    assert st.matches == 0 and before == after and st.notes == ["all-reduces left to NCCL (option allreduce='nccl')"]


@pinned_graph_text
def test_expect_before_after():
    before, after, _ = _run("symm_mem")
    assert_expected_inline(before, """\
input %small  bf16[1, 96]
%all_reduce_default = _c10d_functional.all_reduce(%small, 'sum', '0') bf16[1, 96]
%wait_tensor_default = _c10d_functional.wait_tensor(%all_reduce_default) bf16[1, 96]
input %big  f32[1, 65537]
%all_reduce_default_1 = _c10d_functional.all_reduce(%big, 'sum', '0') f32[1, 65537]
%wait_tensor_default_1 = _c10d_functional.wait_tensor(%all_reduce_default_1) f32[1, 65537]
input %avg  bf16[6, 96]
%all_reduce_default_2 = _c10d_functional.all_reduce(%avg, 'avg', '0') bf16[6, 96]
%wait_tensor_default_2 = _c10d_functional.wait_tensor(%all_reduce_default_2) bf16[6, 96]
return [%wait_tensor_default, %wait_tensor_default_1, %wait_tensor_default_2]
""")
    assert_expected_inline(after, """\
input %small  bf16[1, 96]
%one_shot_all_reduce_default = lingc.one_shot_all_reduce(%small, '0') bf16[1, 96]
input %big  f32[1, 65537]
%all_reduce_default_1 = _c10d_functional.all_reduce(%big, 'sum', '0') f32[1, 65537]
%wait_tensor_default_1 = _c10d_functional.wait_tensor(%all_reduce_default_1) f32[1, 65537]
input %avg  bf16[6, 96]
%all_reduce_default_2 = _c10d_functional.all_reduce(%avg, 'avg', '0') bf16[6, 96]
%wait_tensor_default_2 = _c10d_functional.wait_tensor(%all_reduce_default_2) bf16[6, 96]
return [%one_shot_all_reduce_default, %wait_tensor_default_1, %wait_tensor_default_2]
""")
