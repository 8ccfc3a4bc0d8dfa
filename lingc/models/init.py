"""Random initialisation of a Ling-3 model for any preset, directly on the target device.

Scales keep activations of order one through the layers (weights ~ N(0, 1/fan_in)), so random
models route over many experts, bite on the SwiGLU clamps and give well-separated logits: tests
then exercise every path rather than a model of near-zeros. Norm weights are 1 plus noise so a test
catches a norm that forgot its weight.
"""

from __future__ import annotations

import math
import zlib

import torch

from ..progress import Progress
from .config import Ling3Config
from .decoder import Ling3ForCausalLM
from .parallel import SINGLE, TensorParallel, full_shape, shard_tensor


@torch.no_grad()
def init_random_(model: Ling3ForCausalLM, seed: int = 0, progress: bool | None = None) -> Ling3ForCausalLM:
    """Fill every parameter with seeded random values, the same for any tensor-parallel split.

    Each parameter draws from its own generator (seeded by `seed` and its name), one unit at a
    time (a routed expert, or the whole tensor), always at the WHOLE model's shape; a rank keeps
    its slice. So rank r of an N-way split holds exactly the slice of the single-GPU model, and
    replicated tensors (router, norms, embeddings) are equal on every rank.
    """
    tp = getattr(model, "tp", None)
    rank, size = (tp.rank, tp.size) if tp is not None else (0, 1)
    params = list(model.named_parameters())
    dev = params[0][1].device
    total = sum(p.numel() * p.element_size() for _, p in params)
    unit, scale = (" GB", 1e-9) if total >= 1e9 else (" MB", 1e-6)
    with Progress(total, "random init", unit, enabled=progress, scale=scale) as bar:
        for name, p in params:
            gen = torch.Generator(device=dev).manual_seed(seed * 1_000_003 + zlib.crc32(name.encode()))
            whole = full_shape(tuple(p.shape), name, size)
            if p.dim() == 3 and name.endswith(("experts.w13", "experts.w2")):
                for e in range(p.shape[0]):      # one expert at a time: no whole-layer temporary
                    _fill(name, p[e:e + 1], (1,) + whole[1:], gen, rank, size)
            else:
                _fill(name, p, whole, gen, rank, size)
            bar.update(p.numel() * p.element_size())
    return model


def _fill(name: str, dst: torch.Tensor, whole: tuple[int, ...], gen: torch.Generator,
          rank: int, size: int) -> None:
    if tuple(dst.shape) == whole:
        _init_param(name, dst, gen)
        return
    tmp = torch.empty(whole, dtype=dst.dtype, device=dst.device)
    _init_param(name, tmp, gen)
    dst.copy_(shard_tensor(tmp, name, rank, size))


def _init_param(name: str, p: torch.Tensor, gen: torch.Generator) -> None:
    leaf = name.rsplit(".", 1)[-1]
    parent = name.rsplit(".", 2)[-2] if name.count(".") >= 1 else ""
    if name.endswith("A_log"):
        p.uniform_(0.0, math.log(16.0), generator=gen)
    elif name.endswith("dt_bias"):
        p.normal_(0.0, 0.5, generator=gen)
    elif name.endswith("expert_bias"):
        p.normal_(0.0, 0.1, generator=gen)
    elif "conv1d" in name:
        p.normal_(0.0, 1.0 / math.sqrt(p.shape[-1]), generator=gen)
    elif "norm" in parent or leaf != "weight" and "norm" in name:
        p.normal_(1.0, 0.1, generator=gen)
    elif "word_embeddings" in name:
        p.normal_(0.0, 1.0, generator=gen)
    else:
        p.normal_(0.0, 1.0 / math.sqrt(p.shape[-1]), generator=gen)


def build_model(cfg: Ling3Config, device: torch.device | str = "cpu", dtype: torch.dtype | None = None,
                seed: int | None = 0, progress: bool | None = None,
                tp: TensorParallel = SINGLE) -> Ling3ForCausalLM:
    """Construct on `device` without a default init; random weights unless seed is None.

    `cfg` is the whole model; with `tp` only this rank's slice is allocated and initialised.
    """
    if dtype is not None:
        cfg = cfg.replace(torch_dtype={torch.float32: "float32", torch.bfloat16: "bfloat16",
                                       torch.float16: "float16"}[dtype])
    with torch.device(device):
        model = Ling3ForCausalLM(cfg, tp)
    model.eval().requires_grad_(False)
    if seed is not None:
        init_random_(model, seed, progress)
    return model
