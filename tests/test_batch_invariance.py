"""Batch invariance of the compiled model (design.md): position j of a T=6 chain gives the same
bits as decoding positions 0..j one token at a time, with every lingc pass on. Eager PyTorch does
not promise this (at 42 bf16 layers its rows drift by up to ~1 on the CPU); greedy speculative ==
greedy plain rests on it."""

from __future__ import annotations

import pytest
import torch
from backend_helpers import compile_lingc
from model_helpers import randomize_cache_, tiny_model

from lingc.models import Ling3Cache


# fp32 on the CPU was not invariant until the CPU paths of moe_router and head_matmul went row
# by row (benchmarks/invariance_probe.py found them: the BLAS and the [T, k] sums pick their
# order by T and by a row's alignment).
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_chain_rows_equal_sequential_decode_bitwise(dtype):
    model = tiny_model(torch_dtype=dtype)
    base = randomize_cache_(Ling3Cache.allocate(model.config, 32), seed=3, rows=8)
    ids, pos = torch.tensor([5, 9, 13, 2, 7, 30]), torch.arange(8, 14)
    step = compile_lingc(model, role="forward")
    with torch.no_grad():
        cache = base.clone()
        seq = [step(ids[j:j + 1], pos[j:j + 1], cache) for j in range(6)]
        chain_cache = base.clone()
        logits6, hidden6 = step(ids, pos, chain_cache)
    for j, (lg, h) in enumerate(seq):
        assert torch.equal(h[0], hidden6[j]), f"hidden of position {j} depends on T"
        assert torch.equal(lg[0], logits6[j]), f"logits of position {j} depend on T"
    for a, b in zip(cache.recurrent_tensors(), chain_cache.recurrent_tensors()):
        assert torch.equal(a, b)                     # the final state too


@pytest.mark.gpu
def test_gpu_flash_tp4_rank_chain_rows_equal_sequential_decode(capsys):
    """The same on the GPU at flash-tp4-rank's shapes (6 layers: KDA, MLA, dense and MoE; bf16),
    through benchmarks.invariance_probe, which names the first lingc op whose rows differ."""
    from benchmarks import invariance_probe

    rc = invariance_probe.main(["--preset", "flash-tp4-rank", "--layers", "6"])
    assert rc == 0, capsys.readouterr().out
