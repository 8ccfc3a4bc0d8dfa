"""Tensor parallelism for Ling-3: which parameter splits how, the per-rank config, and the collectives.

A rank of an N-way split holds (Megatron-style, as the source article's TP4 deployment):

- attention heads 1/N: KDA q/k/v/f/g/b projections, convs, A_log, dt_bias by head rows, o_proj by
  columns (its state and conv windows are per rank, so the cache shrinks with the heads); MLA
  q_proj, kv_b_proj, g_proj by head rows and `dense` by columns. kv_a_proj_with_mqa (the shared
  latent) and every norm are replicated, so each rank writes the same MLA cache rows.
- dense MLP, shared expert and routed experts split along the intermediate dimension (gate/up by
  rows, down by columns; a routed expert's w13 keeps gate rows then up rows of this rank's slice).
  The router, its expert bias, the embeddings and the NEXTN eh_proj are replicated.
- lm_head by vocabulary rows. The model's forward all-gathers the logits (full [T, vocab] as on one
  GPU); a greedy argmax compiled by lingc never gathers them (fuse_projections rewrites it into a
  per-rank fused GEMV + argmax and an all-gather of one (max, id) pair per row).

The row-parallel outputs (o_proj, dense, the MLP down projections, the MoE's combined output) are
summed by `TensorParallel.all_reduce`, a functional collective that Dynamo traces into the graph,
so lingc's passes see it and the CUDA graphs capture it. `shard_config` gives the per-rank shapes;
`preset("flash-tp4-rank")` equals `shard_config(preset("flash"), 4)` (a test holds them equal).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .config import Ling3Config

# Module leaf names whose weight splits along dim 0 (output rows) or the last dim (input columns).
_ROW_SPLIT = {"q_proj", "k_proj", "v_proj", "f_proj", "g_proj", "b_proj", "kv_b_proj", "gate_proj",
              "up_proj", "q_conv1d", "k_conv1d", "v_conv1d", "lm_head"}
_COL_SPLIT = {"o_proj", "dense", "down_proj"}
_HEAD_VECTORS = {"A_log", "dt_bias"}


class TensorParallelError(ValueError):
    """A tensor-parallel size that does not divide the model, or a misuse of the split model."""


def shard_dim(name: str) -> int | str | None:
    """How the tensor called `name` (a parameter or checkpoint key) splits across ranks.

    Returns the dim that is cut into equal contiguous pieces (-1 = the last), "w13" for a routed
    expert block [E, 2I, H] whose gate and up halves are each cut along I, or None (replicated).
    """
    parts = name.split(".")
    leaf, owner = parts[-1], parts[-2] if len(parts) > 1 else ""
    if owner == "experts" and leaf == "w13":
        return "w13"
    if owner == "experts" and leaf == "w2":
        return -1
    if leaf in _HEAD_VECTORS:
        return 0
    if leaf != "weight":
        return None
    if owner in _ROW_SPLIT:
        return 0
    if owner in _COL_SPLIT:
        return -1
    return None


def shard_tensor(full: torch.Tensor, name: str, rank: int, size: int) -> torch.Tensor:
    """This rank's piece of a whole tensor (a view when the split is contiguous)."""
    dim = shard_dim(name)
    if dim is None or size == 1:
        return full
    if dim == "w13":
        E, two_i, H = full.shape
        i_local = two_i // 2 // size
        halves = full.view(E, 2, two_i // 2, H)[:, :, rank * i_local:(rank + 1) * i_local]
        return halves.reshape(E, 2 * i_local, H)
    n = full.shape[dim]
    if n % size:
        raise TensorParallelError(f"{name}: dim {dim} of size {n} does not split {size} ways")
    return full.narrow(dim, rank * (n // size), n // size)


def full_shape(local: tuple[int, ...], name: str, size: int) -> tuple[int, ...]:
    """The whole model's shape of a tensor whose rank-local shape is `local`."""
    dim = shard_dim(name)
    if dim is None or size == 1:
        return tuple(local)
    shape = list(local)
    shape[1 if dim == "w13" else dim] *= size
    return tuple(shape)


def shard_config(cfg: Ling3Config, size: int) -> Ling3Config:
    """The per-rank config of an N-way split: heads, intermediate sizes and lm_head rows / N."""
    if size < 1:
        raise TensorParallelError(f"tensor-parallel size {size} must be >= 1")
    if size == 1:
        return cfg
    checks = [("num_attention_heads", cfg.num_attention_heads),
              ("intermediate_size", cfg.intermediate_size),
              ("moe_intermediate_size", cfg.moe_intermediate_size),
              ("vocab_size (lm_head rows)", cfg.lm_head_size)]
    if cfg.num_shared_experts:
        checks.append(("moe_shared_expert_intermediate_size", cfg.moe_shared_expert_intermediate_size))
    bad = [f"{k}={v}" for k, v in checks if v % size]
    if bad:
        raise TensorParallelError(
            f"tensor-parallel size {size} does not divide {', '.join(bad)}; choose a size that "
            f"divides the heads ({cfg.num_attention_heads}), the intermediate sizes and the vocabulary")
    return cfg.replace(num_attention_heads=cfg.num_attention_heads // size,
                       intermediate_size=cfg.intermediate_size // size,
                       moe_intermediate_size=cfg.moe_intermediate_size // size,
                       moe_shared_expert_intermediate_size=cfg.moe_shared_expert_intermediate_size // size,
                       lm_head_rows=cfg.lm_head_size // size)


@dataclass(frozen=True)
class TensorParallel:
    """This process's place in the split: rank, size, and the c10d group (by name) it reduces over.

    size == 1 is the single-GPU model: no collective is ever emitted.
    """
    rank: int = 0
    size: int = 1
    group_name: str | None = None

    def __post_init__(self) -> None:
        if not 0 <= self.rank < self.size:
            raise TensorParallelError(f"tensor-parallel rank {self.rank} outside 0..{self.size - 1}")

    @classmethod
    def from_group(cls, group=None) -> "TensorParallel":
        """The split over an initialised process group (default: the whole world)."""
        import torch.distributed as dist
        if not dist.is_initialized():
            raise TensorParallelError("torch.distributed is not initialised: launch with torchrun "
                                      "(or call lingc.models.parallel.init_from_env())")
        group = group or dist.group.WORLD
        return cls(dist.get_rank(group), dist.get_world_size(group), group.group_name)

    @classmethod
    def detached(cls, rank: int, size: int) -> "TensorParallel":
        """A rank's shapes without a process group (loading or inspecting one shard); its forward
        raises, since the partial sums cannot be reduced."""
        return cls(rank, size, None)

    @property
    def enabled(self) -> bool:
        return self.size > 1

    def _group(self) -> str:
        if self.group_name is None:
            raise TensorParallelError(
                f"rank {self.rank} of a {self.size}-way split has no process group: its outputs "
                f"are partial sums. Build it with TensorParallel.from_group() under torchrun")
        return self.group_name

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum of x over the ranks (identity at size 1), traced as _c10d_functional.all_reduce."""
        if self.size == 1:
            return x
        import torch.distributed._functional_collectives as funcol
        return funcol.all_reduce(x, "sum", self._group())

    def all_true(self, flag: bool, device: torch.device | str) -> bool:
        """Whether `flag` holds on every rank (a host decision the ranks must share, e.g. whether
        a graph was captured everywhere: a rank that runs other shapes than its peers would pair
        its collectives with theirs wrongly). Eager, and it waits for the answer: never call it
        inside a captured region. True at size 1 without a collective."""
        if self.size == 1:
            return bool(flag)
        import torch.distributed._functional_collectives as funcol
        t = torch.tensor([1 if flag else 0], dtype=torch.int32, device=device)
        return bool(funcol.all_reduce(t, "min", self._group()).item())

    def gather_columns(self, x: torch.Tensor) -> torch.Tensor:
        """[T, N] per rank -> [T, size * N], rank r's columns at r*N (the vocab-parallel logits)."""
        if self.size == 1:
            return x
        import torch.distributed._functional_collectives as funcol
        T, N = x.shape
        # all_gather_single is the 2.13 name of all_gather_tensor (deprecated there, the only
        # one in 2.11); both trace to _c10d_functional.all_gather_into_tensor.
        gather = getattr(funcol, "all_gather_single", None) or funcol.all_gather_tensor
        g = gather(x.contiguous(), 0, self._group())                            # [size * T, N]
        if isinstance(g, funcol.AsyncCollectiveTensor):
            # Eager: wait here. The logits leave the model, and a caller's no-op conversion
            # (.float() of fp32 logits, .cpu() on the CPU) would hand on the unwaited buffer,
            # which gloo may still be writing (seen as wrong draft logits in 3 runs of 16).
            g = g.wait()
        return g.view(self.size, T, N).permute(1, 0, 2).reshape(T, self.size * N)


SINGLE = TensorParallel()


def init_from_env(backend: str | None = None) -> TensorParallel:
    """Initialise torch.distributed from torchrun's environment (NCCL on CUDA, else gloo), bind
    this process to its GPU, and return the split over the world. Without torchrun: size 1."""
    import os

    import torch.distributed as dist
    if "WORLD_SIZE" not in os.environ or int(os.environ["WORLD_SIZE"]) == 1:
        return SINGLE
    if not dist.is_initialized():
        if torch.cuda.is_available():
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        dist.init_process_group(backend or ("nccl" if torch.cuda.is_available() else "gloo"))
    return TensorParallel.from_group()
