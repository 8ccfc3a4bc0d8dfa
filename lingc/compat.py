"""The one place where torch 2.11 (the GPU machine) and 2.13 (the CPU and CI) differ for lingc."""

from __future__ import annotations

from typing import Any, Callable, Sequence

import torch

TORCH_VERSION = tuple(int(p) for p in torch.__version__.split("+")[0].split(".")[:2])


def inductor_compile(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> Callable:
    """Compile an AOT inference graph with Inductor, its own CUDA graphs off (lingc captures)."""
    from torch._inductor.compile_fx import compile_fx_inner
    from torch._inductor.utils import BoxedBool

    return compile_fx_inner(gm, example_inputs, is_inference=True, cudagraphs=BoxedBool(False))


def aot_inference_backend(fw_compiler: Callable, decompositions: dict) -> Callable:
    """Dynamo backend that functionalises to an ATen inference graph with cache/state mutations
    kept in the graph as explicit copy_ ops (the capture contract of design.md)."""
    from torch._dynamo.backends.common import aot_autograd

    return aot_autograd(fw_compiler=fw_compiler, inference_compiler=fw_compiler,
                        decompositions=decompositions, keep_inference_input_mutations=True)


def decomposition_table() -> dict:
    """Inductor's own table, so the graph lingc hands to Inductor is the graph Inductor expects."""
    from torch._inductor.decomposition import select_decomp_table

    return select_decomp_table()


def current_frame_compile_id() -> tuple[int | None, int | None]:
    cid = torch._guards.CompileContext.current_compile_id()
    if cid is None:
        return None, None
    return cid.frame_id, cid.frame_compile_id


def guard_failure_reasons() -> list[str]:
    """Every guard-failure reason Dynamo has recorded so far (all frames)."""
    from torch._dynamo.utils import guard_failures

    return [str(r) for reasons in list(guard_failures.values()) for r in reasons]


def real_tensor_mode():
    """A context where real tensors compute: the AOT compiler callback runs under fake mode."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    return unset_fake_temporarily()
