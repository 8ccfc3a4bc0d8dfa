"""lingc: a torch.compile backend for batch-1 speculative decoding of hybrid linear-attention MoE models."""

__version__ = "0.1.0"

from .toolchain import pin_triton_ptxas as _pin_triton_ptxas

# Before anything compiles: every Triton kernel of the process is built by one ptxas, the one
# Triton's cache key names (toolchain.py says why).
_pin_triton_ptxas()

__all__ = ["generate", "Engine", "DecodeRunner", "SpecRunner"]


def __getattr__(name):
    # Lazy: `import lingc.backend` (the Dynamo entry point) must not pull in the runtime.
    if name == "generate":
        from .generation import generate
        return generate
    if name == "Engine":
        from .runtime.relay.engine import Engine
        return Engine
    if name == "DecodeRunner":
        from .runtime.relay.runner import DecodeRunner
        return DecodeRunner
    if name == "SpecRunner":
        from .runtime.relay.spec_runner import SpecRunner
        return SpecRunner
    raise AttributeError(f"module 'lingc' has no attribute {name!r}")
