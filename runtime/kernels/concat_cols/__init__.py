"""`lingc::concat_cols`: two [T, D1], [T, D2] tensors side by side, one PDL-chained kernel (op.py)."""

from . import op  # noqa: F401  (registers the op)
