"""Chunked KDA prefill (the delta-rule core over a whole prompt, chunks of 64): reference, Triton
kernels, custom op.

Importing this package registers ``torch.ops.lingc.kda_prefill``. The Triton launcher lives in
``.kernel`` and is imported on first CUDA use, so the CPU path needs no triton.
"""
from .naive import CHUNK, kda_prefill_chunk_terms, kda_prefill_from_terms, kda_prefill_reference
from .op import check_kda_prefill_args, kda_prefill

__all__ = [
    "CHUNK",
    "check_kda_prefill_args",
    "kda_prefill",
    "kda_prefill_chunk_terms",
    "kda_prefill_from_terms",
    "kda_prefill_reference",
]
