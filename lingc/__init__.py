"""lingc: a torch.compile backend for batch-1 speculative decoding of hybrid linear-attention MoE models."""

__version__ = "0.1.0"
