"""Speculative sampling's outcome over a verify chain's logits (the nucleus by a radix search
over the logits' keys instead of a sort, the accept count and the draw): the Triton kernels
behind ``lingc.sampled_targets``, which runtime/relay/ops.py registers."""
