"""`lingc::concat_into`: ``out.copy_(torch.cat(parts))`` as one PDL-chained kernel (op.py)."""

from . import op  # noqa: F401  (registers the op)
