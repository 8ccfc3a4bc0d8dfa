"""Captured prefill (runtime/relay/prefill_graphs.py): a prompt padded to its bucket gives what the
eager prefill gives, its padding rows change nothing, and the engine takes it on CUDA.

On the CPU the buckets run their padded chunk eagerly (capture=False): the same model code the
graphs capture. The GPU tests capture them.
"""

from __future__ import annotations

import pytest
import torch
from model_helpers import PREFILL_ROWS as ROWS
from model_helpers import assert_rel_close, cache_tensors_close, eager_prefill, padded_prefill, tiny_model

from lingc.models import Ling3Cache
from lingc.models.padding import PromptPadding
from lingc.runtime.relay.engine import Engine
from lingc.runtime.relay.prefill_graphs import PrefillGraphs, default_buckets



@pytest.fixture(scope="module")
def model():
    return tiny_model()


def _prompt(n: int, seed: int = 0, device="cpu") -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(1, 300, (n,), generator=gen).to(device)


def test_default_buckets():
    assert default_buckets(20000) == (64, 128, 256, 512, 1024, 2048, 3072, 4096, 5120, 6144, 7168, 8192)
    assert default_buckets(3000) == (64, 128, 256, 512, 1024, 2048, 3000)     # the cache's size last
    assert default_buckets(1536) == (64, 128, 256, 512, 1024, 1536)
    assert default_buckets(63) == ()
    assert default_buckets(20000, largest=256) == (64, 128, 256)
    assert default_buckets(100) == (64, 100)


@pytest.mark.parametrize("prompt_kernels", [False, True], ids=["plain-ops", "prompt-kernels"])
@pytest.mark.parametrize("n", [1, 3, 5, 40, 64, 65])
def test_padded_prefill_equals_the_eager_prefill(model, n, prompt_kernels, monkeypatch):
    """First token, the draft's logits and hidden, KDA states, conv windows (a prompt shorter than
    the window keeps part of the old one) and the cache rows of the prompt. "prompt-kernels": KDA
    takes its CUDA prompt path (`_prompt_forward`, the lingc ops' references on the CPU) for both."""
    if prompt_kernels:
        import lingc.models.kda as kda

        monkeypatch.setattr(kda, "prompt_kernels_apply", lambda x: x.shape[0] >= 64)
    prompt = _prompt(n, seed=n)
    ref_cache, ref_first, (ref_dlog, ref_dh) = eager_prefill(model, prompt, 256)
    cache, first, (dlog, dh), _ = padded_prefill(model, prompt, 256)
    assert int(first) == int(ref_first)
    assert_rel_close(dlog, ref_dlog, 1e-4, "draft logits")
    assert_rel_close(dh, ref_dh, 1e-4, "draft hidden")
    cache_tensors_close(cache, ref_cache, 1e-4, kv_rows=n)
    for j, (x, y) in enumerate(zip(cache.draft_kv, ref_cache.draft_kv)):
        assert_rel_close(x[:, :n], y[:, :n], 1e-4, f"draft MLA cache {j}")


def test_padding_ids_change_nothing_real(model):
    """Two different paddings: the same bits in everything a real row or a later step reads."""
    prompt = _prompt(37, seed=7)
    a = padded_prefill(model, prompt, 256, pad_ids=torch.zeros(ROWS, dtype=torch.int64))
    b = padded_prefill(model, prompt, 256, pad_ids=_prompt(ROWS, seed=8))
    assert int(a[1]) == int(b[1])
    assert torch.equal(a[2][0], b[2][0]) and torch.equal(a[2][1], b[2][1])
    for x, y in zip(a[0].state + a[0].conv, b[0].state + b[0].conv):
        assert torch.equal(x, y)
    for x, y in zip(a[0].kv + a[0].draft_kv, b[0].kv + b[0].draft_kv):
        assert torch.equal(x[:, :37], y[:, :37])
        assert not torch.equal(x[:, 37:ROWS], y[:, 37:ROWS])       # the padding did write its rows


def test_errors(model):
    cache = Ling3Cache.allocate(model.config, 128)
    with pytest.raises(ValueError, match=r"buckets \[256\]: each must be in 64..128"):
        PrefillGraphs(model, cache, draft=False, buckets=(64, 256), capture=False)
    graphs = PrefillGraphs(model, cache, draft=False, buckets=(64,), capture=False, progress=False)
    with pytest.raises(ValueError, match="longer than the largest prefill bucket 64"):
        graphs(_prompt(65))
    with pytest.raises(RuntimeError, match=r"prefill bucket 64 is not captured: call prepare\(\(64,\)\)"):
        graphs(_prompt(10))
    with pytest.raises(ValueError, match=r"prefill buckets \[100\] are not among this object's buckets \(64,\)"):
        graphs.prepare((100,))
    with pytest.raises(ValueError, match="first_pad=64 must be in 0..63"):
        PromptPadding.of(torch.tensor([10]), 64, first_pad=64)
    with pytest.raises(ValueError, match=r"length must be a \[1\] int64 tensor"):
        PromptPadding.of(torch.tensor(10), 64)
    nonextn = tiny_model(num_nextn_predict_layers=0)
    with pytest.raises(ValueError, match="needs a model with a NEXTN layer"):
        PrefillGraphs(nonextn, Ling3Cache.allocate(nonextn.config, 128), draft=True)
    with pytest.raises(ValueError, match="prefill_graphs=True needs CUDA graphs"):
        Engine(model, max_len=128, progress=False, prefill_graphs=True)
    assert Engine(model, max_len=128, progress=False).prefill_graphs(True) is None      # the CPU: eager


@pytest.mark.gpu
@pytest.mark.parametrize("n", [7, 64, 100])
def test_gpu_captured_prefill_equals_the_eager_prefill(n):
    m = tiny_model().cuda()
    prompt = _prompt(n, seed=n, device="cuda")
    ref_cache, ref_first, (ref_dlog, ref_dh) = eager_prefill(m, prompt, 512)
    cache, first, (dlog, dh), _ = padded_prefill(m, prompt, 512, capture=True)
    assert int(first) == int(ref_first)
    assert_rel_close(dlog, ref_dlog, 1e-4, "draft logits")
    assert_rel_close(dh, ref_dh, 1e-4, "draft hidden")
    cache_tensors_close(cache, ref_cache, 1e-4, kv_rows=n)


@pytest.mark.gpu
def test_gpu_engine_prefills_by_replay_without_a_sync():
    m = tiny_model().cuda()
    eng = Engine(m, max_len=512, progress=False, options={"inductor": False})
    prompt = _prompt(30, device="cuda").tolist()
    eng.prepare_prefill(len(prompt), speculative=(True,))
    graphs = eng.prefill_graphs(True)
    assert graphs.captured == {64: True}
    spec = eng.generate(prompt, 24, eos_token_id=None)
    assert eng.stats.prefill_rows == 64 and graphs.captured == {64: True}
    plain = eng.generate(prompt, 24, speculative=None, eos_token_id=None)
    assert eng.stats.prefill_rows == 64 and spec == plain
    eng._reset()
    ids = torch.tensor(prompt, device="cuda")
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        graphs(ids)                                                 # copies, a fill, one replay
    finally:
        torch.cuda.set_sync_debug_mode(0)
    off = Engine(m, max_len=512, progress=False, options={"inductor": False}, prefill_graphs=False)
    assert off.generate(prompt, 24, eos_token_id=None)[0] == spec[0] and off.stats.prefill_rows == 0


def test_engine_falls_back_to_the_eager_chunks_when_a_capture_fails(model, monkeypatch):
    """A bucket whose capture failed (capture_step warned; here capture=False, the same state) runs
    the unpadded eager chunks, not the padded chunk uncaptured."""
    import functools

    import lingc.runtime.relay.engine as engine_module
    from lingc.decoding.reference import greedy_generate

    monkeypatch.setattr(engine_module, "PrefillGraphs", functools.partial(PrefillGraphs, capture=False))
    eng = Engine(model, max_len=256, progress=False, options={"inductor": False})
    eng.use_prefill_graphs = True                   # as on CUDA
    prompt = _prompt(20).tolist()
    eng.prepare_prefill(257)                        # buckets 64, 128, 256: none fits, nothing prepared
    assert eng.prefill_graphs(True).captured == {}
    eng.prepare_prefill(20, speculative=(True,))
    assert eng.prefill_graphs(True).captured == {64: False} and eng.prefill_graphs(False).captured == {}
    assert eng.prefill_graphs(True).buckets == (64, 128, 256)
    out = eng.generate(prompt, 4, speculative=None, eos_token_id=None)
    assert eng.prefill_graphs(False).captured == {64: False} and eng.stats.prefill_rows == 0
    assert out == greedy_generate(model, prompt, 4, eos_token_id=None)
