"""lingc.runtime: Triton kernels (each with a plain-PyTorch reference), the relay, state pools."""
