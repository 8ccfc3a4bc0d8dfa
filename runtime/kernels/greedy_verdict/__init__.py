"""The relay's greedy verdict and emitted tokens as two one-warp Triton kernels (kernel.py); the
ops that launch them are ``lingc.greedy_verdict`` and ``lingc.greedy_emit`` (runtime/relay/ops.py)."""
