"""Small building blocks shared by the Ling-3 modules: weight-only linear, RMSNorm, interleaved RoPE.

Parameters are created uninitialised (`torch.empty`) on the current device: random init
(`init.py`) or a checkpoint fills them, so a 63 GB preset never pays for a default init it discards.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F


# Prompt chunks on CUDA run some eager glue as one lingc kernel where the plain ops make several
# elementwise passes over [T, D] fp32 (an 8192-token prefill on an H200 spent ~28 ms in the layer
# norms' pow/mean/mul/copy kernels alone, session 38). Decode and verify graphs (T <= 16) and
# anything being compiled keep the plain ops, which are what the passes match.
PROMPT_KERNEL_MIN_TOKENS = 64


def prompt_kernels_apply(x: torch.Tensor) -> bool:
    """Whether an eager module takes its prompt-chunk kernel for x [T, ...]: CUDA, T >= 64, eager."""
    return x.is_cuda and x.shape[0] >= PROMPT_KERNEL_MIN_TOKENS and not torch.compiler.is_compiling()


def empty_param(*shape: int, dtype: torch.dtype | None = None) -> nn.Parameter:
    return nn.Parameter(torch.empty(*shape, dtype=dtype), requires_grad=False)


class Linear(nn.Module):
    """y = x @ weight.T, no bias (no projection of Ling-3 has one)."""

    def __init__(self, in_features: int, out_features: int, dtype: torch.dtype | None = None):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.weight = empty_param(out_features, in_features, dtype=dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight)

    def extra_repr(self) -> str:
        return f"{self.in_features} -> {self.out_features}"


class RMSNorm(nn.Module):
    """x / rms(x) * weight, computed in fp32 and rounded once to the input dtype."""

    def __init__(self, dim: int, eps: float, dtype: torch.dtype | None = None):
        super().__init__()
        self.eps = eps
        self.weight = empty_param(dim, dtype=dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() == 2 and prompt_kernels_apply(x):
            from lingc.runtime.kernels.norms import rmsnorm   # the op package imports torch only

            return rmsnorm(x, self.weight, None, self.eps)[0]    # the same math, one kernel
        xf = x.float()
        y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight.float()
        return y.to(x.dtype)


def rope_inv_freq(dim: int, theta: float) -> torch.Tensor:
    return 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim)).float()


def apply_rope_interleaved(x: torch.Tensor, positions: torch.Tensor,
                           inv_freq: torch.Tensor) -> torch.Tensor:
    """GPT-J style RoPE: pairs (x[2i], x[2i+1]) rotate by positions * inv_freq[i].

    x: [T, ..., D]; positions: [T] int device tensor (never a Python int: the graph stays one
    graph for every step). Computed in fp32, returned in x.dtype.
    """
    T, D = x.shape[0], x.shape[-1]
    ang = positions.float()[:, None] * inv_freq[None, :]               # [T, D/2]
    shape = (T,) + (1,) * (x.dim() - 2) + (D // 2,)
    cos, sin = ang.cos().view(shape), ang.sin().view(shape)
    xf = x.float().unflatten(-1, (D // 2, 2))
    x0, x1 = xf[..., 0], xf[..., 1]
    out = torch.stack((x0 * cos - x1 * sin, x0 * sin + x1 * cos), dim=-1)
    return out.flatten(-2).to(x.dtype)
