"""The one place where torch 2.11 (the GPU machine) and 2.13 (the CPU and CI) differ for lingc."""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Sequence

import torch

TORCH_VERSION = tuple(int(p) for p in torch.__version__.split("+")[0].split(".")[:2])


def inductor_compile(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> Callable:
    """Compile an AOT inference graph with Inductor, its own CUDA graphs off (lingc captures)."""
    from torch._inductor.compile_fx import compile_fx_inner
    from torch._inductor.utils import BoxedBool

    with short_lowering_messages():
        return compile_fx_inner(gm, example_inputs, is_inference=True, cudagraphs=BoxedBool(False))


def describe_lowering_arg(arg: Any) -> str:
    """One line for an argument of an Inductor lowering: type, size and dtype, never the IR."""
    if isinstance(arg, (list, tuple)):
        return "[" + ", ".join(describe_lowering_arg(a) for a in arg[:8]) + (", ..." if len(arg) > 8 else "") + "]"
    size = getattr(arg, "get_size", None)
    if callable(size):
        try:
            dtype = getattr(arg, "get_dtype", lambda: None)()
            return f"{type(arg).__name__}(size={list(size())}, dtype={dtype})"
        except Exception:               # noqa: BLE001  (a node without a layout yet)
            return type(arg).__name__
    text = repr(arg) if isinstance(arg, (int, float, bool, str, type(None), torch.dtype, torch.device)) \
        else type(arg).__name__
    return text[:120]


def _short_operator_str(target: Any, args: Sequence[Any], kwargs: dict[str, Any]) -> str:
    lines = [f"target: {target}"] + [f"args[{i}]: {describe_lowering_arg(a)}" for i, a in enumerate(args)]
    if kwargs:
        lines.append("kwargs: {" + ", ".join(f"{k}: {describe_lowering_arg(v)}" for k, v in kwargs.items()) + "}")
    return "\n".join("  " + line for line in lines)


@contextlib.contextmanager
def short_lowering_messages():
    """Inductor describes a lowering's arguments (in its "implicit fallback" log line and in
    LoweringException) by str() of their IR, which recurses through every producer without
    memoisation: on the relay's draft graph (four unrolled forwards) one such message ran for
    minutes on the GPU machine (torch 2.11). While lingc calls Inductor, the arguments are
    described by type, size and dtype instead."""
    import torch._inductor.exc

    cls = getattr(torch._inductor.exc, "OperatorIssue", None)
    if cls is None or "operator_str" not in cls.__dict__:
        yield
        return
    old = cls.__dict__["operator_str"]
    cls.operator_str = staticmethod(_short_operator_str)
    try:
        yield
    finally:
        cls.operator_str = old


def functionalize_inference_backend(fw_compiler: Callable, decompositions: dict) -> Callable:
    """aot_inference_backend's ATen inference graph from one functionalised trace under Dynamo's
    fake mode: the graph's input mutations stay in it as trailing copy_ ops, as with AOTAutograd
    and keep_inference_input_mutations, and only some view nodes come in another order.
    AOTAutograd traces twice (metadata collection, then the graph): this takes about half its
    time. Functionalisation sees each input as its own tensor, so when a mutated input shares
    storage with another input, the graph goes through AOTAutograd instead, which handles it."""
    from torch._guards import TracingContext, detect_fake_mode
    from torch.fx.experimental.proxy_tensor import make_fx

    def backend(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> Callable:
        fake_mode = detect_fake_mode(example_inputs) or TracingContext.get().fake_mode    # Dynamo's
        fakes = [fake_mode.from_tensor(x) if isinstance(x, torch.Tensor) else x for x in example_inputs]
        fn = torch.func.functionalize(gm, remove="mutations")
        with fake_mode:
            g = make_fx(lambda *args: fn(*args), decomposition_table=decompositions, tracing_mode="real")(*fakes)
        if _mutates_an_aliased_input(g, example_inputs):
            return aot_inference_backend(fw_compiler, decompositions)(gm, example_inputs)
        _functional_intermediates(g.graph)
        g.graph.eliminate_dead_code()
        g.recompile()
        compiled = fw_compiler(g, fakes)
        if getattr(compiled, "_boxed_call", False):            # AOTAutograd's calling convention
            return lambda *args: compiled(list(args))
        return compiled

    return backend


def _functional_intermediates(graph: torch.fx.Graph) -> int:
    """In-place ops on intermediates become their functional forms, as AOTAutograd's trace has
    them: a decomposition applied under the functionalised trace can write into a fresh value
    (F.rms_norm's ``mean(x^2).add_(eps)``), and passes match functional ops. Rewritten only where
    nothing reads the old value afterwards and the value is no view (a write into a view also
    writes its base). Returns the number rewritten."""
    aten = torch.ops.aten
    order = {n: i for i, n in enumerate(graph.nodes)}
    done = 0
    for n in list(graph.nodes):
        t = n.target
        if n.op != "call_function" or not isinstance(t, torch._ops.OpOverload) or t.namespace != "aten":
            continue
        name = t._schema.name.split("::")[-1]
        if not name.endswith("_") or name.endswith("__") or not t._schema.arguments \
                or not t._schema.arguments[0].is_write:
            continue
        base = n.args[0] if n.args else None
        if not isinstance(base, torch.fx.Node) or base.op != "call_function" \
                or not isinstance(base.target, torch._ops.OpOverload) \
                or any(r.alias_info is not None for r in base.target._schema.returns) \
                or any(order[u] > order[n] for u in base.users if u is not n):
            continue
        functional = getattr(getattr(aten, name[:-1], None), t._overloadname, None)
        if functional is None:
            continue
        n.target = functional
        done += 1
    return done


def _mutates_an_aliased_input(g: torch.fx.GraphModule, inputs: Sequence[Any]) -> bool:
    """Whether an input the graph writes back (a trailing copy_ into a placeholder) shares its
    storage with another input."""
    placeholders = [n for n in g.graph.nodes if n.op == "placeholder"]
    written = {placeholders.index(n.args[0]) for n in g.graph.nodes
               if n.target is torch.ops.aten.copy_.default and n.args[0] in placeholders}

    def storage(x):
        return x.untyped_storage().data_ptr() if isinstance(x, torch.Tensor) and x.device.type != "meta" else None

    ptrs = [storage(x) for x in inputs]
    return any(ptrs[i] is not None and sum(p == ptrs[i] for p in ptrs) > 1 for i in written)


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


def version_bump_kernel(op) -> Callable:
    """The ADInplaceOrView kernel of a mutating custom op, as torch 2.13 writes it: the version
    counters of the written arguments bumped, then the call passed on past the key.

    torch 2.11's kernel indexes the positional arguments it is handed by their schema position,
    but the dispatcher hands a Python kernel its arguments without the trailing ones that equal
    their defaults: a written `Optional[Tensor] = None` argument left at None (kda_chain's
    k_window on a model with one conv cache) ran off the end, IndexError, on every call. Defaults
    are filled in first here."""
    from torch._library import utils

    schema = op._opoverload._schema
    written, written_keys = utils.mutated_args_kwargs(schema)
    after = torch._C._after_ADInplaceOrView_keyset

    def kernel(keyset, *args, **kwargs):
        all_args, all_kwargs = utils.fill_defaults(schema, args, kwargs)
        for i in written:
            _bump(all_args[i])
        for key in written_keys:
            _bump(all_kwargs[key])
        return op._opoverload.redispatch(keyset & after, *args, **kwargs)

    return kernel


def _bump(value: Any) -> None:
    for t in value if isinstance(value, (list, tuple)) else (value,):
        if isinstance(t, torch.Tensor):
            torch.autograd.graph.increment_version(t)


def register_version_bump(op) -> None:
    """Put `version_bump_kernel` in place of the op's own ADInplaceOrView kernel (every torch
    version, so the CPU tests run the kernel torch 2.11 on the GPU machine runs)."""
    import warnings

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Warning only once for all operators", category=UserWarning)
        op._lib.impl(op._name, version_bump_kernel(op), "ADInplaceOrView", with_keyset=True, allow_override=True)
