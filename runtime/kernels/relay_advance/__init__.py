"""`lingc::relay_advance`: the tail of the relay's last graph per step (pick the accepted row,
advance n and x, append the step's tokens to the ring) as one one-CTA kernel (op.py)."""

from . import op  # noqa: F401  (registers the op)
