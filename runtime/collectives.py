"""`lingc::one_shot_all_reduce`: a decode-sized sum over the tensor-parallel ranks through
PyTorch symmetric memory, one kernel that reads every peer's buffer over NVLink (no multicast).

At batch 1 an all-reduce moves 5-30 KB and its cost is latency: measured on H200s inside a CUDA
graph (benchmarks/results/allreduce_4gpu.json), NCCL takes 15.7 us for 2560 bf16 values over 4
GPUs where the symmetric-memory one-shot kernel takes 6.8 us, with the copy into the symmetric
buffer fused (`one_shot_all_reduce_copy_out`). A Ling-3 step runs two all-reduces per layer, so
this is most of what tensor parallelism adds to a step. The `symm_allreduce` pass rewrites the
graph's functional all-reduces into this op when `options={"allreduce": "symm_mem"}`.

One symmetric buffer per (group, dtype, device, shape), allocated and rendezvoused the first time
the op runs with it (a collective: every rank runs the same graphs, and the engine's warm-up runs
them before capture). The kernel synchronises the ranks at its start and end, so the buffer is
free again when it returns. Summation order is the rank order on every rank (checked by
tests/test_tensor_parallel.py on the GPU: the ranks' outputs are bitwise equal). Off CUDA (gloo
tests) the op is a plain c10d all-reduce of a copy.
"""

from __future__ import annotations

import torch

from lingc.runtime.registry import register_op

_BUFFERS: dict[tuple, torch.Tensor] = {}


def _symm_buffer(x: torch.Tensor, group_name: str) -> torch.Tensor:
    key = (group_name, x.dtype, x.device, tuple(x.shape))
    buf = _BUFFERS.get(key)
    if buf is None:
        if torch.cuda.is_current_stream_capturing():
            raise RuntimeError(
                f"lingc.one_shot_all_reduce: first use of shape {tuple(x.shape)} during CUDA-graph "
                f"capture; its symmetric buffer must be rendezvoused before (run the graph once eagerly)")
        from torch.distributed import _symmetric_memory as symm_mem
        buf = symm_mem.empty(tuple(x.shape), dtype=x.dtype, device=x.device)
        symm_mem.rendezvous(buf, group_name)
        _BUFFERS[key] = buf
    return buf


def _one_shot_all_reduce(x: torch.Tensor, group_name: str) -> torch.Tensor:
    """Sum of x over the ranks of `group_name` (every rank gets the same bits)."""
    if not x.is_cuda:
        import torch.distributed as dist
        from torch.distributed.distributed_c10d import _resolve_process_group
        out = x.clone()
        dist.all_reduce(out, group=_resolve_process_group(group_name))
        return out
    out = torch.empty_like(x)
    torch.ops.symm_mem.one_shot_all_reduce_copy_out(_symm_buffer(x, group_name), x.contiguous(),
                                                     "sum", group_name, out)
    return out


def _one_shot_all_reduce_fake(x, group_name):
    return torch.empty_like(x)


one_shot_all_reduce = register_op("one_shot_all_reduce", _one_shot_all_reduce, _one_shot_all_reduce_fake)
