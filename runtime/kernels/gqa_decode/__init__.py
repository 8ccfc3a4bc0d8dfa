"""Softmax attention of a decode or verify chain over one sequence's per-head key and value caches
(MHA / GQA / MQA), split-K with a T-invariant combine: reference, Triton kernels, custom op.

Importing this package registers ``torch.ops.lingc.gqa_decode``. The Triton launcher lives in
``.kernel`` and is imported on first CUDA use, so the CPU path needs no triton.
"""
from .naive import gqa_decode_reference
from .op import MAX_T, check_gqa_decode_args, gqa_decode

__all__ = ["MAX_T", "check_gqa_decode_args", "gqa_decode", "gqa_decode_reference"]
