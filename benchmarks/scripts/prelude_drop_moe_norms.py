"""A bound, not a model: after pdl_swap, every layer-input norm that reads a MoE block's output
and feeds a lingc.gemm is removed (its normed rows and its residual sum both become the MoE
output: wrong values, the same shapes and kernels otherwise). Run as a benchmarks.decode
PRELUDE to time what those launches cost a step before building a fold of them."""
import operator

import torch

import lingc.passes.pdl_norm_folds as _folds
from lingc.graph_match import is_call

_ops = torch.ops.lingc
_orig = _folds.norms_into_head_readers


def _drop_moe_norms(g):
    n = _orig(g)
    dropped = 0
    for rms in [x for x in g.nodes if is_call(x, _ops.rmsnorm.default)]:
        src = rms.args[0]
        if not is_call(src, _ops.moe_experts.default):
            continue
        outs = list(rms.users)
        if not all(is_call(u, operator.getitem) for u in outs):
            continue
        ys = [v for u in outs if u.args[1] == 0 for v in u.users]
        if not ys or not all(is_call(v, _ops.gemm.default) for v in ys):
            continue
        for u in outs:
            u.replace_all_uses_with(src)
            g.erase_node(u)
        g.erase_node(rms)
        dropped += 1
    print(f"prelude (a bound): {dropped} layer-input norms after the MoE dropped", flush=True)
    return n


_folds.norms_into_head_readers = _drop_moe_norms
