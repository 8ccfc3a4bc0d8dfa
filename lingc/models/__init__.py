"""Ling-3.0 (BailingMoeV3) in plain PyTorch: config, modules, static cache, checkpoints."""

from .cache import Ling3Cache
from .config import PRESETS, Ling3Config, preset
from .decoder import Ling3ForCausalLM
from .init import build_model, init_random_

__all__ = ["Ling3Cache", "Ling3Config", "Ling3ForCausalLM", "PRESETS", "build_model",
           "init_random_", "preset"]
