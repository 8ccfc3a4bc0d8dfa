"""Shared helpers of the eager-model tests (tiny preset, fp32, CPU).

`tiny_model` builds the random tiny model (deterministic per seed, no progress bar);
`assert_rel_close` is the shared relative-RMS comparison (helpers.assert_close, which rejects
NaN/Inf) with a label and a guard against all-zero references; `randomize_cache_` fills a cache
with random content so tests continue from nonzero recurrent state, conv windows and MLA rows
rather than from zeros. `eager_prefill` / `padded_prefill` run a prompt's prefill the eager way and
through PrefillGraphs' padded buckets (the captured-prefill tests, single-process and per rank).
"""

from __future__ import annotations

import torch
from helpers import assert_close, rel_rms_error

from lingc.models import Ling3Cache, Ling3ForCausalLM, build_model, preset


def tiny_model(seed: int = 0, **overrides) -> Ling3ForCausalLM:
    return build_model(preset("tiny", **overrides), seed=seed, progress=False)


def rel_err(actual: torch.Tensor, expected: torch.Tensor) -> float:
    return rel_rms_error(actual, expected)


def assert_rel_close(actual: torch.Tensor, expected: torch.Tensor, tol: float, what: str = "") -> None:
    assert expected.numel() and expected.abs().max() > 0, \
        f"{what}: the reference is all zeros; the comparison proves nothing"
    try:
        assert_close(actual, expected, tol)
    except AssertionError as e:
        raise AssertionError(f"{what}: {e}") from None


def randomize_cache_(cache: Ling3Cache, seed: int = 0, rows: int | None = None) -> Ling3Cache:
    """Random KDA states and conv windows; random MLA rows 0..rows-1 (all rows when None)."""
    gen = torch.Generator().manual_seed(seed)
    for t in cache.state:
        t.copy_(0.3 * torch.randn(t.shape, generator=gen))
    for t in cache.conv:
        t.copy_(torch.randn(t.shape, generator=gen))
    for t in list(cache.kv) + list(cache.draft_kv):
        n = t.shape[1] if rows is None else rows
        t[:, :n].copy_(torch.randn(t[:, :n].shape, generator=gen))
    return cache


def cache_tensors_close(a: Ling3Cache, b: Ling3Cache, tol: float, kv_rows: int | None = None) -> None:
    """KDA state, conv windows and the MLA rows [0, kv_rows) of two caches agree within tol."""
    for j, (x, y) in enumerate(zip(a.state, b.state)):
        assert_rel_close(x, y, tol, f"KDA state {j}")
    for j, (x, y) in enumerate(zip(a.conv, b.conv)):
        assert_rel_close(x, y, tol, f"KDA conv window {j}")
    for j, (x, y) in enumerate(zip(a.kv, b.kv)):
        n = x.shape[1] if kv_rows is None else kv_rows
        assert_rel_close(x[:, :n], y[:, :n], tol, f"MLA cache {j}")


def chain_accepting(model: Ling3ForCausalLM, base: Ling3Cache, j: int, start: int, steps: int = 5,
                    vocab: int = 300) -> torch.Tensor:
    """A verify chain at positions start..start+steps whose first j drafts equal the target's
    greedy picks (from `base`, left untouched) and whose draft j+1 does not."""
    pos = torch.arange(start, start + steps + 1)
    ch = torch.zeros(steps + 1, dtype=torch.long)
    ch[0] = 7
    with torch.no_grad():
        for i in range(1, steps + 1):
            lg, _ = model(ch[:i], pos[:i], base.clone())
            y = int(lg[-1].argmax())
            ch[i] = y if i <= j else (y + 1) % vocab
    return ch


# Buckets of padded_prefill: a prompt of up to 64 tokens runs padded to 64 rows, up to 128 to 128.
PREFILL_ROWS = 64


def eager_prefill(model: Ling3ForCausalLM, prompt: torch.Tensor, max_len: int):
    """(cache, first token, (draft logits, draft hidden)) of the eager chunks' prefill."""
    from lingc.decoding.reference import greedy_prompt_prefill

    cache = Ling3Cache.allocate(model.config, max_len, device=prompt.device)
    first, drafted = greedy_prompt_prefill(model, cache, prompt, True)
    return cache, first, drafted


def padded_prefill(model: Ling3ForCausalLM, prompt: torch.Tensor, max_len: int, capture: bool = False,
                   pad_ids: torch.Tensor | None = None):
    """(cache, first token, (draft logits, draft hidden), {bucket: captured}) of the prompt run in
    its PrefillGraphs bucket (captured on CUDA with `capture`); with pad_ids, the bucket's padding
    ids replaced by them and the bucket run again."""
    from lingc.runtime.relay.prefill_graphs import PrefillGraphs

    cache = Ling3Cache.allocate(model.config, max_len, device=prompt.device)
    graphs = PrefillGraphs(model, cache, draft=True, buckets=(PREFILL_ROWS, 2 * PREFILL_ROWS), capture=capture,
                           progress=False)
    graphs.prepare()
    cache.zero_()
    out = graphs(prompt)
    if pad_ids is not None:        # rerun the same bucket with other padding ids
        cache.zero_()
        bk = graphs._ready[graphs.bucket_for(prompt.numel())]
        bk.ids[prompt.numel():].copy_(pad_ids[:bk.rows - prompt.numel()])
        out = bk.step()
    dlog, dh = out.draft
    return cache, out.first.clone(), (dlog.clone(), dh.clone()), graphs.captured
