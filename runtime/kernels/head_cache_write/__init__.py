"""`lingc::head_cache_write`: a per-head key or value cache's row write, the key's rotary
embedding included, as one in-place kernel (op.py).

Importing this package registers ``torch.ops.lingc.head_cache_write``. The Triton launcher lives
in ``.kernel`` and is imported on first CUDA use, so the CPU path needs no triton."""
from .naive import head_cache_write_reference, rope_heads_reference
from .op import check_head_cache_write_args, head_cache_write

__all__ = ["check_head_cache_write_args", "head_cache_write", "head_cache_write_reference", "rope_heads_reference"]
