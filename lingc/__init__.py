"""lingc: a torch.compile backend for batch-1 speculative decoding of hybrid linear-attention MoE models."""

__version__ = "0.1.0"

__all__ = ["generate", "Engine"]


def __getattr__(name):
    # Lazy: `import lingc.backend` (the Dynamo entry point) must not pull in the runtime.
    if name == "generate":
        from .generation import generate
        return generate
    if name == "Engine":
        from .runtime.relay.engine import Engine
        return Engine
    raise AttributeError(f"module 'lingc' has no attribute {name!r}")
