"""register_op's EagerOp: which calls skip the custom-op dispatcher (plain eager CUDA calls) and which
keep it (compiling, tracing under fake tensors, profiling, gradients, the CPU, mutating ops). On the
CPU machine `_plain_cuda` is patched to accept CPU tensors, so the decision itself is tested."""

from __future__ import annotations

from typing import Optional

import pytest
import torch

import lingc.runtime.registry as registry

CALLS: list[str] = []


def _impl(x: torch.Tensor, scale: float) -> torch.Tensor:
    CALLS.append("impl")
    return x * scale


def _fake(x, scale):
    return torch.empty_like(x)


OP = registry.register_op("test_registry_scale", _impl, _fake)


@pytest.fixture
def cpu_as_cuda(monkeypatch):
    monkeypatch.setattr(registry, "_plain_cuda",
                        lambda x: type(x) in registry._PLAIN and not (x.requires_grad and torch.is_grad_enabled()))
    CALLS.clear()
    spy = []
    real = OP.op

    class Dispatcher:
        def __call__(self, *args, **kwargs):
            spy.append("dispatcher")
            return real(*args, **kwargs)

    monkeypatch.setattr(OP, "op", Dispatcher())
    return spy


def test_register_op_wraps_non_mutating_ops_only():
    assert isinstance(OP, registry.EagerOp) and OP.impl is _impl
    mut = registry.register_op("test_registry_fill", lambda out: out.fill_(1.0), lambda out: None,
                               mutates_args=("out",), schema="(Tensor(a!) out) -> ()")
    assert not isinstance(mut, registry.EagerOp)
    # Registering again returns the same op (idempotent), wrapped the same way.
    again = registry.register_op("test_registry_scale", _impl, _fake)
    assert isinstance(again, registry.EagerOp) and again.op is torch.ops.lingc.test_registry_scale
    assert "test_registry_scale" in repr(OP)


def test_plain_eager_calls_skip_the_dispatcher(cpu_as_cuda):
    x = torch.randn(4)
    torch.testing.assert_close(OP(x, 2.0), 2 * x)
    assert CALLS == ["impl"] and cpu_as_cuda == []
    with torch.no_grad():
        OP(torch.nn.Parameter(torch.randn(3)), 2.0)       # parameters are plain tensors
    assert cpu_as_cuda == []


@pytest.mark.parametrize("case", ["grad", "fake", "profiler", "no tensor", "compile"])
def test_other_calls_keep_the_dispatcher(cpu_as_cuda, case):
    x = torch.randn(4)
    if case == "grad":
        import warnings
        with torch.enable_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")    # "no autograd kernel registered": the dispatcher's word
            OP(x.requires_grad_(), 2.0)
    elif case == "fake":
        from torch._subclasses.fake_tensor import FakeTensorMode
        with FakeTensorMode() as mode:
            OP(mode.from_tensor(x), 2.0)
    elif case == "profiler":
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            OP(x, 2.0)
        assert any(e.name == "lingc::test_registry_scale" for e in prof.events())
    elif case == "no tensor":
        assert not registry.direct_call_applies((1, 2.0), {})
        return
    else:
        torch._dynamo.reset()
        torch.testing.assert_close(torch.compile(lambda t: OP(t, 3.0), backend="eager", fullgraph=True)(x), 3 * x)
    assert cpu_as_cuda, f"{case}: expected the call to go through the dispatcher"


def test_cpu_tensors_take_the_dispatcher_without_the_patch():
    assert not registry.direct_call_applies((torch.randn(2), 1.0), {})
    assert not registry.direct_call_applies(([torch.randn(2)],), {})


@pytest.mark.gpu
def test_gpu_plain_cuda_calls_skip_the_dispatcher(monkeypatch):
    """On real CUDA tensors the model's op object calls the implementation directly, with the same
    result as the dispatcher; a compiled call still goes through it."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    from lingc.runtime.kernels.norms import op as norm_op
    x = torch.randn(4, 256, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(256, device="cuda", dtype=torch.bfloat16)
    assert registry.direct_call_applies((x, w, None, 1e-6), {})
    used = []
    real = norm_op.rmsnorm.op
    monkeypatch.setattr(norm_op.rmsnorm, "op", lambda *a, **kw: used.append(1) or real(*a, **kw))
    got = norm_op.rmsnorm(x, w, None, 1e-6)
    assert used == []
    for g, want in zip(got, torch.ops.lingc.rmsnorm(x, w, None, 1e-6)):
        assert torch.equal(g, want)
    monkeypatch.setattr(registry, "DIRECT_CALLS", False)
    norm_op.rmsnorm(x, w, None, 1e-6)
    assert used == [1]


def _add_into(out: torch.Tensor, x: torch.Tensor, extra: Optional[torch.Tensor] = None, scale: float = 1.0) -> None:
    out.add_(x * scale)
    if extra is not None:
        extra.add_(x)


ADD_INTO = registry.register_op("test_registry_add_into", _add_into, lambda out, x, extra=None, scale=1.0: None,
                                mutates_args=("out", "extra"))


def test_written_optional_argument_left_at_its_default():
    """A written `Optional[Tensor] = None` argument left out: torch 2.11's own version-bump kernel
    indexed the stripped argument list and raised IndexError (kda_chain's k_window on the GPU
    machine, session 52); lingc's kernel fills the defaults first. The kernel is also called as
    2.11's dispatcher calls it, with the trailing defaults stripped."""
    out, x, extra = torch.randn(5), torch.randn(5), torch.randn(5)
    want, v0 = out + x, out._version
    ADD_INTO(out, x)
    torch.testing.assert_close(out, want)
    assert out._version > v0
    e0, o0 = extra.clone(), out.clone()
    ADD_INTO(out, x, extra, scale=2.0)
    torch.testing.assert_close(out, o0 + 2 * x)
    torch.testing.assert_close(extra, e0 + x)

    from lingc import compat

    kernel = compat.version_bump_kernel(ADD_INTO)
    keyset = torch._C._dispatch_keys(out)
    o1, v1, ev = out.clone(), out._version, extra._version
    kernel(keyset, out, x)                                  # extra and scale stripped
    torch.testing.assert_close(out, o1 + x)
    assert out._version > v1 and extra._version == ev
    kernel(keyset, out, x, extra)
    assert extra._version > ev
