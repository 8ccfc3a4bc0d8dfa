"""HF safetensors checkpoints <-> Ling3ForCausalLM.

The model keeps the checkpoint's parameter names except for the routed experts, which it stores
stacked per layer (`mlp.experts.w13` [E, 2I, H] = gate rows then up rows, `mlp.experts.w2`
[E, H, I]) for the gather formulation. `checkpoint_views` maps every checkpoint key to the view of
the parameter it fills, so loading copies each tensor once into place (no second copy of the model)
and saving reads the same views back out: a load-save round trip reproduces the checkpoint's keys
and values exactly.

Loading reads config.json and the shards listed in model.safetensors.index.json, or every
*.safetensors file in the directory when there is no index, and reports every missing, unexpected
and wrongly shaped key at once. A tensor-parallel rank reads only its slice of each split tensor
(`safe_open(...).get_slice`, lingc/models/parallel.py says which dim), so no rank ever holds the
whole model.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch

from ..progress import Progress
from .config import Ling3Config
from .decoder import Ling3ForCausalLM
from .parallel import TensorParallel, full_shape, shard_dim

INDEX_NAME = "model.safetensors.index.json"


class CheckpointError(ValueError):
    """A checkpoint directory that does not match the model it is loaded into."""


def checkpoint_views(model: Ling3ForCausalLM) -> dict[str, torch.Tensor]:
    """Checkpoint key -> the parameter view holding that tensor."""
    views: dict[str, torch.Tensor] = {}
    for name, p in model.named_parameters():
        if name.endswith("mlp.experts.w13"):
            prefix, inter = name[: -len("w13")], p.shape[1] // 2
            for e in range(p.shape[0]):
                views[f"{prefix}{e}.gate_proj.weight"] = p.data[e, :inter]
                views[f"{prefix}{e}.up_proj.weight"] = p.data[e, inter:]
        elif name.endswith("mlp.experts.w2"):
            prefix = name[: -len("w2")]
            for e in range(p.shape[0]):
                views[f"{prefix}{e}.down_proj.weight"] = p.data[e]
        else:
            views[name] = p.data
    return views


def read_config(path: str | os.PathLike) -> Ling3Config:
    cfg_file = Path(path) / "config.json"
    if not cfg_file.is_file():
        raise CheckpointError(f"{path}: no config.json; expected an HF checkpoint directory")
    return Ling3Config.from_hf_dict(json.loads(cfg_file.read_text()))


def _shard_files(path: Path) -> dict[str, list[str]]:
    """shard file -> the keys it holds (from the index), or every *.safetensors file."""
    index = path / INDEX_NAME
    if index.is_file():
        weight_map = json.loads(index.read_text())["weight_map"]
        files: dict[str, list[str]] = {}
        for key, fname in weight_map.items():
            files.setdefault(fname, []).append(key)
        missing = [f for f in files if not (path / f).is_file()]
        if missing:
            raise CheckpointError(f"{path}: {INDEX_NAME} names shards that do not exist: {missing[:5]}")
        return files
    shards = sorted(p.name for p in path.glob("*.safetensors"))
    if not shards:
        raise CheckpointError(f"{path}: no *.safetensors files and no {INDEX_NAME}")
    return {f: [] for f in shards}


def _summarise(kind: str, items: list[str]) -> str:
    shown = ", ".join(items[:8])
    more = f" (and {len(items) - 8} more)" if len(items) > 8 else ""
    return f"{len(items)} {kind}: {shown}{more}"


@torch.no_grad()
def load_into(model: Ling3ForCausalLM, path: str | os.PathLike, progress: bool | None = None) -> None:
    """Fill every parameter of `model` from the checkpoint at `path`, casting to its dtype."""
    from safetensors import safe_open

    path = Path(path)
    views = checkpoint_views(model)
    tp = model.tp
    device = next(model.parameters()).device
    files = _shard_files(path)
    seen: set[str] = set()
    unexpected, bad_shape = [], []
    total = sum((path / f).stat().st_size for f in files)
    label = f"loading {path.name}" + (f" (rank {tp.rank}/{tp.size})" if tp.size > 1 else "")
    with Progress(total, label, " GB", enabled=progress, scale=1e-9) as bar:
        for fname in files:
            with safe_open(str(path / fname), framework="pt", device="cpu") as f:
                for key in f.keys():
                    if key not in views:
                        unexpected.append(key)
                        continue
                    dst = views[key]
                    src = f.get_slice(key)
                    shape = tuple(src.get_shape())
                    want = full_shape(tuple(dst.shape), key, tp.size)
                    if shape != want:
                        what = f"model {list(want)}" + (f" (rank slice {list(dst.shape)})"
                                                        if tp.size > 1 else "")
                        bad_shape.append(f"{key} (checkpoint {list(shape)}, {what})")
                        continue
                    dst.copy_(_read_slice(src, key, shape, tp).to(device=device, dtype=dst.dtype))
                    seen.add(key)
            bar.update((path / fname).stat().st_size)
    missing = sorted(set(views) - seen - {k.split(" ")[0] for k in bad_shape})
    if missing or unexpected or bad_shape:
        parts = [_summarise(k, v) for k, v in (("missing keys", missing),
                                                ("unexpected keys", sorted(unexpected)),
                                                ("wrongly shaped keys", bad_shape)) if v]
        raise CheckpointError(f"checkpoint {path} does not match the model: " + "; ".join(parts))


def _read_slice(src, key: str, shape: tuple[int, ...], tp: TensorParallel) -> torch.Tensor:
    """This rank's piece of checkpoint tensor `key`, read from the file without the rest."""
    dim = shard_dim(key)
    if dim is None or tp.size == 1:
        return src[:]
    dim = dim % len(shape)
    n = shape[dim] // tp.size
    index = tuple(slice(None) if d != dim else slice(tp.rank * n, (tp.rank + 1) * n)
                  for d in range(len(shape)))
    return src[index]


def from_pretrained(path: str | os.PathLike, dtype: torch.dtype | None = None,
                    device: torch.device | str = "cpu", progress: bool | None = None,
                    tp_rank: int = 0, tp_size: int = 1, tp: TensorParallel | None = None,
                    **config_overrides) -> Ling3ForCausalLM:
    """Build the model described by `path`/config.json on `device` and load its weights.

    Tensor parallel: pass `tp` (TensorParallel.from_group() under torchrun), or tp_rank/tp_size to
    load one rank's slices without a process group (its forward then refuses to run).
    """
    from .init import build_model

    if tp is None:
        tp = TensorParallel.detached(tp_rank, tp_size)
        if tp_size > 1:
            import torch.distributed as dist
            if dist.is_initialized() and dist.get_world_size() == tp_size:
                tp = TensorParallel.from_group()
                if tp.rank != tp_rank:
                    raise CheckpointError(f"tp_rank={tp_rank} but this process is rank {tp.rank} "
                                          f"of the {tp_size}-process group")
    cfg = read_config(path)
    if config_overrides:
        cfg = cfg.replace(**config_overrides)
    model = build_model(cfg, device=device, dtype=dtype, seed=None, tp=tp)
    load_into(model, path, progress=progress)
    return model


@torch.no_grad()
def save_pretrained(model: Ling3ForCausalLM, path: str | os.PathLike,
                    max_shard_bytes: int = 5 * 2**30) -> None:
    """Write config.json, safetensors shards under the checkpoint's key names, and the index."""
    from safetensors.torch import save_file

    if model.tp.size > 1:
        raise CheckpointError(f"save_pretrained on rank {model.tp.rank} of a {model.tp.size}-way "
                              f"split would write a partial checkpoint; save the whole model")
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(model.config.to_hf_dict(), indent=2) + "\n")
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for key, t in checkpoint_views(model).items():
        nbytes = t.numel() * t.element_size()
        if shards[-1] and size + nbytes > max_shard_bytes:
            shards.append({})
            size = 0
        shards[-1][key] = t.detach().to("cpu").contiguous()
        size += nbytes
    weight_map = {}
    for i, shard in enumerate(shards):
        fname = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, str(path / fname), metadata={"format": "pt"})
        weight_map.update({k: fname for k in shard})
    total = sum(t.numel() * t.element_size() for s in shards for t in s.values())
    (path / INDEX_NAME).write_text(json.dumps({"metadata": {"total_size": total},
                                               "weight_map": weight_map}, indent=2) + "\n")
