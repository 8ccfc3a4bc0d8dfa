"""symm_allreduce: the graph's NCCL all-reduces become one-shot symmetric-memory all-reduces.

    before:  y = wait_tensor(_c10d_functional.all_reduce(x, "sum", group))
    after:   y = lingc.one_shot_all_reduce(x, group)

Only with `options={"allreduce": "symm_mem"}` and only for sums of at most MAX_BYTES (the decode
and verify messages; one-shot reads every peer's whole buffer, which stops paying off for large
messages). Why: at batch 1 an all-reduce is pure latency and the one-shot kernel halves it on
H200s (runtime/collectives.py has the figures). Numerics: a sum in a fixed rank order on every
rank, like NCCL's, but not necessarily NCCL's order: equal within bf16 rounding, not bitwise.
"""

from __future__ import annotations

import torch
import torch.fx as fx

from lingc.graph_build import emit
from lingc.graph_match import is_call
from lingc.pass_manager import LingcPass

MAX_BYTES = 256 * 1024


class SymmAllReduce(LingcPass):
    name = "symm_allreduce"
    tolerance = (1e-2, 1e-2)

    def apply(self, gm: fx.GraphModule) -> int:
        c10d = torch.ops._c10d_functional
        graph, matches, big = gm.graph, 0, 0
        if not any(is_call(n, c10d.all_reduce.default) for n in graph.nodes):
            return 0
        if self.ctx.options.allreduce != "symm_mem":
            self.notes.append("all-reduces left to NCCL (option allreduce='nccl')")
            return 0
        import lingc.runtime.collectives  # noqa: F401  (registers lingc::one_shot_all_reduce)

        for ar in list(graph.nodes):
            if not is_call(ar, c10d.all_reduce.default) or ar.args[1] != "sum":
                continue
            waits = [u for u in ar.users if is_call(u, c10d.wait_tensor.default)]
            if len(waits) != 1 or len(ar.users) != 1:
                continue
            x, group = ar.args[0], ar.args[2]
            val = x.meta["val"]
            if val.numel() * val.element_size() > MAX_BYTES:
                big += 1
                continue
            with graph.inserting_before(waits[0]):
                y = emit(graph, torch.ops.lingc.one_shot_all_reduce.default, x, group)
            waits[0].replace_all_uses_with(y)
            graph.erase_node(waits[0])
            graph.erase_node(ar)
            matches += 1
        if big:
            self.notes.append(f"{big} all-reduces over {MAX_BYTES // 1024} KB left to NCCL")
        return matches
