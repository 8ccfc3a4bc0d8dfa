"""fuse_projections: same-input projections become one lingc GEMM; every other linear on the decode
path becomes a lingc GEMM too; a logits GEMM read only by argmax becomes a fused GEMV + argmax.

    before:  q = x @ Wq.T ; k = x @ Wk.T ; v = x @ Wv.T ; ...             (one library GEMM each)
    after:   qkv = lingc.gemm(x, [Wq, Wk, Wv, ...]) ; q = qkv[:, :Nq] ...  (one launch, views out)

    before:  y = x @ W.T (+ b)             after:  y = lingc.gemm(x, [W], b)
    before:  ids = argmax(x @ Wlm.T, -1)   after:  ids = lingc.gemm_argmax(x, Wlm)[0]
                                                   (the logit row is never written; the logits
                                                   may be reshaped, cast or logits[0] of a batch of 1)

Vocab-parallel lm_head (tensor parallel): the model all-gathers every rank's logit columns and
takes the argmax of the whole row. That argmax becomes a per-rank fused GEMV + argmax and an
all-gather of one (max logit, global id) pair per row, 8 bytes instead of the row:

    before:  ids = argmax(all_gather_columns(x @ Wlm_r.T), -1)
    after:   id_r, max_r = lingc.gemm_argmax(x, Wlm_r); id_r += r * N_r
             pairs = all_gather([max_r, bits(id_r)])           # [ranks, T, 2]
             ids = id of pairs[argmax over ranks of max]      (first max: the lowest global id,
                                                               torch.argmax's tie rule)

Groups are found from the graph: linears whose input is the same node and whose weights are
parameters (graph inputs) of the input's dtype, e.g. KDA q/k/v/f/g/b, MLA q_proj/kv_a/g_proj,
whatever their module names. Up to 8 weights per launch (larger groups split in graph order).

Weights: `lingc.gemm` takes the list of weights and reads each through its own pointer, so the
fused launch needs no concatenated copy and no re-layout: the parameters stay as loaded, and the
outputs are column views of one [M, sum N] result. (The issue asked for a one-time in-place
concatenation; reading several pointers gives the same single launch without touching the user's
parameters or Dynamo's guards on them.)

What stays a library GEMM, and why, is written into the node (`meta["lingc_why"]`) and shown in the
kernel table: batched products (gathered experts, attention) belong to fused_moe and pdl_swap, and a
product whose operand is computed in the graph (absorbed MLA attention) is not a projection.

Numerics (declared): fp32 accumulation and one rounding, per row (batch-invariant); equal to the
library GEMM up to summation order.
"""

from __future__ import annotations

import operator

import torch
import torch.fx as fx

from lingc.graph_build import eliminate_dead_code, emit
from lingc.graph_match import CASTS, RESHAPES, aten, is_call, prims, strip, unsupported_dtype, weight_source
from lingc.pass_manager import LingcPass
from lingc.runtime.kernels.gemm.op import DTYPES as GEMM_DTYPES

MAX_WEIGHTS = 8


def _linear(n: fx.Node):
    """(x, weight, bias) of a bias-free mm or an addmm with a parameter weight, else None."""
    if is_call(n, aten.mm.default):
        x, wt, bias = n.args[0], n.args[1], None
    elif is_call(n, aten.addmm.default) and not n.kwargs:
        bias, x, wt = n.args[:3]
        if not (isinstance(bias, fx.Node) and bias.op == "placeholder" and bias.meta["val"].dim() == 1):
            return None
    else:
        return None
    w = weight_source(wt)
    if w is None:
        n.meta["lingc_why"] = "an operand is computed in the graph (attention math), not a weight"
        return None
    if w.meta["val"].dtype != x.meta["val"].dtype:
        n.meta["lingc_why"] = "input and weight dtypes differ"
        return None
    if why := unsupported_dtype("gemm", x.meta["val"].dtype, GEMM_DTYPES):
        n.meta["lingc_why"] = why
        return None
    return x, w, bias


class FuseProjections(LingcPass):
    name = "fuse_projections"
    tolerance = (1e-4, 1e-3)

    def apply(self, gm: fx.GraphModule) -> int:
        import lingc.runtime.kernels.gemm  # noqa: F401  (registers lingc::gemm, lingc::gemm_argmax)

        graph = gm.graph
        matches = self._argmax(graph)
        eliminate_dead_code(graph)           # the logits GEMMs the argmax fusion replaced
        # Keyed by the input's value: reshapes of one tensor to one shape are the same values,
        # which is how matmul on [1, T, H] reaches the graph (a view per projection).
        groups: dict[tuple, list[tuple[fx.Node, fx.Node, fx.Node]]] = {}
        for n in list(graph.nodes):
            if is_call(n, aten.bmm.default, aten.baddbmm.default):
                n.meta["lingc_why"] = "batched product (gathered experts or attention): fused_moe / pdl_swap"
                continue
            lin = _linear(n)
            if lin is None:
                continue
            x, w, bias = lin
            if not all(isinstance(d, int) for d in x.meta["val"].shape):
                # Rows known only at run time (a per-expert loop over torch.where, as Hugging
                # Face's MoE blocks write it): lingc's GEMM is specialised on its shapes.
                n.meta["lingc_why"] = "data-dependent rows (e.g. tokens picked by torch.where): left to ATen"
                continue
            if bias is not None:
                self._replace(graph, [n], x, [w], bias)
                matches += 1
            else:
                key = (strip(x, casts=False), tuple(x.meta["val"].shape))
                groups.setdefault(key, []).append((n, x, w))
        for members in groups.values():
            for i in range(0, len(members), MAX_WEIGHTS):
                chunk = members[i:i + MAX_WEIGHTS]
                # The input as the graph holds it now: when it is itself a projection replaced
                # above (a low-rank pair x -> A -> B), its uses moved to the fused GEMM's slice, and
                # the stale node would keep the old product alive a second time.
                x = _linear(chunk[0][0])[0]
                self._replace(graph, [m for m, _, _ in chunk], x, [w for _, _, w in chunk], None)
                matches += 1
        fused = sum(1 for ms in groups.values() if len(ms) > 1)
        if fused:
            self.notes.append(f"{fused} same-input groups")
        return matches

    def _replace(self, graph: fx.Graph, mms: list[fx.Node], x: fx.Node, weights: list[fx.Node],
                 bias: fx.Node | None) -> None:
        with graph.inserting_before(mms[0]):
            out = emit(graph, torch.ops.lingc.gemm.default, x, weights, bias)
            if len(mms) == 1:
                mms[0].replace_all_uses_with(out)
                return
            col = 0
            for mm, w in zip(mms, weights):
                width = w.meta["val"].shape[0]
                part = emit(graph, aten.slice.Tensor, out, 1, col, col + width)
                col += width
                mm.replace_all_uses_with(part)

    def _argmax(self, graph: fx.Graph) -> int:
        """argmax(logits, -1) whose logits feed nothing else -> gemm_argmax ids."""
        matches = 0
        for a in list(graph.nodes):
            if not is_call(a, aten.argmax.default) or len(a.args) < 2 or (len(a.args) > 2 and a.args[2]):
                continue
            src, chain_ok = a.args[0], True
            val = src.meta["val"]
            if a.args[1] not in (-1, val.dim() - 1):
                continue
            while is_call(src, *RESHAPES, *CASTS) or _unit_select(src):
                chain_ok &= len(src.users) == 1
                src = src.args[0]
            if chain_ok and self._vocab_parallel_argmax(graph, a, src):
                matches += 1
                continue
            lin = _linear(src) if is_call(src, aten.mm.default) else None
            if lin is None or not chain_ok or len(src.users) != 1:
                continue
            x, w, _ = lin
            with graph.inserting_before(a):
                pair = emit(graph, torch.ops.lingc.gemm_argmax.default, x, w)
                ids = emit(graph, operator.getitem, pair, 0)
                if list(a.meta["val"].shape) != list(ids.meta["val"].shape):
                    ids = emit(graph, aten.view.default, ids, list(a.meta["val"].shape))
            a.replace_all_uses_with(ids)
            graph.erase_node(a)
            matches += 1
        return matches

    def _vocab_parallel_argmax(self, graph: fx.Graph, a: fx.Node, src: fx.Node) -> bool:
        """argmax over TensorParallel.gather_columns(local logits) -> the pair all-gather."""
        gathered = _column_gather(src)
        if gathered is None:
            return False
        wait, local, size, group = gathered
        rows = local.meta["val"].shape[0]
        inner = local
        while is_call(inner, *RESHAPES, *CASTS) and len(inner.users) == 1:
            inner = inner.args[0]
        lin = _linear(inner) if is_call(inner, aten.mm.default) and len(inner.users) == 1 else None
        if lin is None or len(local.users) != 1 or len(wait.users) != 1:
            return False
        x, w, _ = lin
        width = w.meta["val"].shape[0]
        rank = _group_rank(group)
        c10d = torch.ops._c10d_functional
        with graph.inserting_before(a):
            pair = emit(graph, torch.ops.lingc.gemm_argmax.default, x, w)
            ids = emit(graph, operator.getitem, pair, 0)
            best = emit(graph, operator.getitem, pair, 1)
            gid = emit(graph, aten.add.Tensor, ids, rank * width)
            bits = emit(graph, aten.view.dtype, emit(graph, prims.convert_element_type.default,
                                                     gid, torch.int32), torch.float32)
            packed = emit(graph, aten.cat.default, [emit(graph, aten.unsqueeze.default, best, 1),
                                                    emit(graph, aten.unsqueeze.default, bits, 1)], 1)
            allp = emit(graph, c10d.wait_tensor.default,
                        emit(graph, c10d.all_gather_into_tensor.default, packed, size, group))
            allp = emit(graph, aten.view.default, allp, [size, rows, 2])
            vals = emit(graph, aten.select.int, allp, 2, 0)
            winner = emit(graph, aten.argmax.default, vals, 0, True)                # [1, T]
            all_ids = emit(graph, prims.convert_element_type.default,
                           emit(graph, aten.view.dtype, emit(graph, aten.select.int, allp, 2, 1),
                                torch.int32), torch.int64)
            out = emit(graph, aten.gather.default, all_ids, 0, winner)
            out = emit(graph, aten.view.default, out, list(a.meta["val"].shape))
        dead = a.args[0]
        a.replace_all_uses_with(out)
        graph.erase_node(a)
        # The gathered-row chain is dead now; erase it explicitly (DCE keeps collectives).
        while isinstance(dead, fx.Node) and not dead.users and dead is not inner:
            nxt = dead.args[0]
            graph.erase_node(dead)
            dead = nxt
        self.notes.append(f"vocab-parallel argmax over {size} ranks")
        return True


def _column_gather(n: fx.Node):
    """(wait node, local logits, group size, group name) if n is TensorParallel.gather_columns's
    [T, size * N] result: all_gather along rows, view [size, T, N], permute(1, 0, 2), reshape."""
    if is_call(n, aten.clone.default):
        n = n.args[0]
    if not is_call(n, aten.permute.default) or list(n.args[1]) != [1, 0, 2]:
        return None
    v = n.args[0]
    if not is_call(v, aten.view.default, aten.reshape.default, aten._unsafe_view.default):
        return None
    wait = v.args[0]
    if not is_call(wait, torch.ops._c10d_functional.wait_tensor.default):
        return None
    gather = wait.args[0]
    if not is_call(gather, torch.ops._c10d_functional.all_gather_into_tensor.default):
        return None
    local, size, group = gather.args[:3]
    if list(v.meta["val"].shape) != [size, *local.meta["val"].shape] or len(gather.users) != 1:
        return None
    return wait, local, size, group


def _group_rank(group_name: str) -> int:
    import torch.distributed as dist
    from torch.distributed.distributed_c10d import _resolve_process_group
    return dist.get_rank(_resolve_process_group(group_name))


def _unit_select(n: fx.Node) -> bool:
    """select(x, d, 0) over a dim of size 1: a reshape (``logits[0]`` of a batch of 1)."""
    if not is_call(n, aten.select.int) or not isinstance(n.args[0], fx.Node):
        return False
    s = n.args[0].meta["val"].shape
    d = n.args[1] + len(s) if n.args[1] < 0 else n.args[1]
    return s[d] == 1
