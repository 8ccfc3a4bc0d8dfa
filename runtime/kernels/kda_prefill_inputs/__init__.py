"""`lingc::kda_prefill_inputs`: KDA's input glue for a prompt chunk (three short convolutions with
SiLU, the q/k L2 norms, the gate) in one kernel (op.py)."""

from . import op  # noqa: F401  (registers the op)
from .naive import kda_prefill_inputs_reference
from .op import check_kda_prefill_inputs_args, kda_prefill_inputs

__all__ = ["check_kda_prefill_inputs_args", "kda_prefill_inputs", "kda_prefill_inputs_reference"]
