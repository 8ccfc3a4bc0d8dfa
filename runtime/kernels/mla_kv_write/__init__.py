"""`lingc::mla_kv_write`: the MLA cache write, key RoPE included, as one kernel (op.py)."""

from . import op  # noqa: F401  (registers the op)
