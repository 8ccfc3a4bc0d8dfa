"""Fused KDA chain (short conv + L2 norm + gate + delta rule over T tokens of one slot) and the
stage commit: references, Triton kernels, custom ops.

Importing this package registers ``torch.ops.lingc.kda_chain``, ``kda_commit`` and ``kda_commit_many``.
The Triton launchers live in ``.kernel`` and are imported on first CUDA use, so the CPU path
needs no triton.
"""
from .naive import KdaChainResult, kda_chain_reference, kda_commit_reference, staged_windows_reference
from .op import (MAX_T, check_kda_chain_args, check_kda_commit_args, check_kda_commit_many_args, kda_chain,
                 kda_commit, kda_commit_many)

__all__ = [
    "MAX_T",
    "KdaChainResult",
    "check_kda_chain_args",
    "check_kda_commit_args",
    "check_kda_commit_many_args",
    "kda_chain",
    "kda_chain_reference",
    "kda_commit",
    "kda_commit_many",
    "kda_commit_reference",
    "staged_windows_reference",
]
