"""MLA decode attention in latent (absorbed) space over one slot's cache, split-K with a
T-invariant combine: reference, Triton kernels, custom op.

Importing this package registers ``torch.ops.lingc.mla_decode``. The Triton launcher lives in
``.kernel`` and is imported on first CUDA use, so the CPU path needs no triton.
"""
from .naive import mla_decode_reference
from .op import MAX_T, check_mla_decode_args, mla_decode

__all__ = ["MAX_T", "check_mla_decode_args", "mla_decode", "mla_decode_reference"]
