"""Multi-process tensor-parallel cases: each function runs on one rank of a spawned world.

`spawn(case, world, **kw)` starts `world` processes (gloo on the CPU, NCCL on CUDA with one GPU
per rank), runs `case(tp, **kw)` on each and returns the per-rank results (torch.save'd through a
temporary directory). The cases are module-level so spawned children can import them.
"""

from __future__ import annotations

import faulthandler
import os
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

PROMPT = [5, 17, 33, 2, 9, 41, 7]


def spawn(case, world: int, **kwargs) -> list:
    with tempfile.TemporaryDirectory() as tmp:
        # A failed rank raises out of its process at once, without the closing barrier (its peers
        # may wait in a collective it never joins); start_processes then terminates the peers and
        # raises the failed rank's traceback here.
        mp.start_processes(_main, args=(world, tmp, case, kwargs), nprocs=world, join=True,
                           start_method="spawn")
        return [torch.load(os.path.join(tmp, f"rank{r}.pt"), weights_only=False) for r in range(world)]


def _main(rank: int, world: int, tmp: str, case, kwargs) -> None:
    from lingc.models.parallel import TensorParallel
    hang_dump_s = float(os.environ.get("LINGC_TEST_HANG_DUMP_S", "0"))
    if hang_dump_s > 0:
        # A rank still running after this many seconds writes every thread's stack (to
        # LINGC_TEST_HANG_DUMP_DIR/rank<r>.stacks when set, which outlives a cut pytest run) and
        # exits.
        dump_dir = os.environ.get("LINGC_TEST_HANG_DUMP_DIR")
        sink = open(os.path.join(dump_dir, f"rank{rank}.stacks"), "w") if dump_dir else None  # noqa: SIM115
        faulthandler.dump_traceback_later(hang_dump_s, exit=True, **({"file": sink} if sink else {}))
    cuda = torch.cuda.is_available() and torch.cuda.device_count() >= world
    if cuda:
        torch.cuda.set_device(rank)
    dist.init_process_group("nccl" if cuda else "gloo", init_method=f"file://{tmp}/store",
                            rank=rank, world_size=world)
    res = case(TensorParallel.from_group(), **kwargs)
    torch.save(res, os.path.join(tmp, f"rank{rank}.pt"))
    dist.barrier()
    if cuda:
        # NCCL's destroy_process_group hung one rank after the compiled relay (H200 x2, torch
        # 2.11: the stack dump showed rank 1 in destroy_process_group with its result saved).
        # The results are on disk and the peers past the barrier: leave without the teardown.
        torch.cuda.synchronize()
        faulthandler.cancel_dump_traceback_later()
        os._exit(0)
    dist.destroy_process_group()


def model_for(tp, preset_name: str = "tiny", seed: int = 0, **overrides):
    from lingc.models import build_model, preset
    dev = f"cuda:{torch.cuda.current_device()}" if torch.cuda.is_available() else "cpu"
    return build_model(preset(preset_name, **overrides), device=dev, seed=seed, progress=False, tp=tp)


def eager_logits(model, tokens: list[int]) -> torch.Tensor:
    """Prefill logits of `tokens` (every position), eager."""
    from lingc.decoding.reference import allocate_cache, prefill
    dev = model.lm_head.weight.device
    ids = torch.tensor(tokens, device=dev)
    cache = allocate_cache(model, ids.numel(), 1)
    with torch.no_grad():
        logits, _ = model(ids, torch.arange(ids.numel(), device=dev), cache)
    return logits.cpu()


def relay_case(tp, preset_name: str = "tiny", new_tokens: int = 48, spec_tokens: int = 64,
               options: dict | None = None, sample_tokens: int = 16, **overrides) -> dict:
    """Eager logits and greedy/sampled tokens, then the lingc Engine's plain and speculative
    output on this rank, and what the compiled graphs contain."""
    from lingc.backend import compile_reports
    from lingc.decoding.reference import greedy_generate, sample_generate
    from lingc.runtime.relay.engine import Engine

    model = model_for(tp, preset_name, **overrides)
    out = {"logits": eager_logits(model, PROMPT),
           "greedy": greedy_generate(model, PROMPT, new_tokens, eos_token_id=None),
           "sampled": sample_generate(model, PROMPT, sample_tokens, temperature=0.8, seed=3,
                                      eos_token_id=None)}
    engine = Engine(model, max_len=len(PROMPT) + spec_tokens + 16, options=options or {"inductor": False},
                    progress=False)
    out["plain"] = engine.generate(PROMPT, new_tokens, speculative=None, eos_token_id=None)
    out["spec"] = engine.generate(PROMPT, spec_tokens, eos_token_id=None)
    out["accepts"] = list(engine.stats.accepts)
    out["reports"] = {r.role: r.format() for r in compile_reports}     # the greedy graphs' (before sampling's)
    out.update(engine_sampling(engine))
    return out


def engine_sampling(engine) -> dict:
    """A sampled request plain (decode_sample), speculative (verify_sample) and with sampled
    drafts (draft_sample, verify_sample_q, extend_sample: the draft's own draws at the nucleus)
    on `engine`."""
    return {"sampled_plain": engine.generate(PROMPT, 16, temperature=0.8, seed=3, speculative=None,
                                             eos_token_id=None),
            "sampled_spec": engine.generate(PROMPT, 24, temperature=0.8, top_p=0.9, seed=4, eos_token_id=None),
            "sampled_drafts": engine.generate(PROMPT, 16, temperature=0.8, top_p=0.9, seed=5, eos_token_id=None,
                                              sampled_drafts=True)}


def symm_case(tp, steps: int = 8, **overrides) -> dict:
    """A decode step compiled with allreduce='symm_mem' next to the NCCL one: the rewrite's counts,
    both graphs' greedy tokens and their first step's logits."""
    from lingc.backend import compile_reports
    from lingc.decoding.reference import allocate_cache, prefill

    model = model_for(tp, **overrides)
    dev = model.lm_head.weight.device

    def step(ids, pos, cache):
        logits, _ = model(ids, pos, cache)
        return logits

    out = {}
    for mode in ("nccl", "symm_mem"):
        torch._dynamo.reset()
        compiled = torch.compile(step, backend="lingc", fullgraph=True,
                                 options={"inductor": False, "allreduce": mode})
        cache = allocate_cache(model, len(PROMPT), steps + 1)
        logits, _ = prefill(model, cache, torch.tensor(PROMPT, device=dev))
        tok = logits.argmax(-1).view(1)
        toks, first = [], None
        with torch.no_grad():
            for i in range(steps):
                logits = compiled(tok, torch.tensor([len(PROMPT) + i], device=dev), cache)
                first = logits.float().cpu() if first is None else first
                tok = logits.argmax(-1)
                toks.append(int(tok))
        out[mode] = {"tokens": toks, "logits0": first, "report": compile_reports[-1].format(),
                     "table": {op: n for _c, op, n, _ in compile_reports[-1].kernels.rows}}
    return out


def prefill_case(tp, n: int = 30, capture: bool = False, engine_tokens: int = 0, **overrides) -> dict:
    """This rank's eager prefill of an n-token prompt beside its padded bucket (PrefillGraphs,
    captured on CUDA with `capture`), and with engine_tokens the Engine's plain and speculative
    output from the same prompt (its prefill captured too with `capture`)."""
    from model_helpers import eager_prefill, padded_prefill

    model = model_for(tp, **overrides)
    dev = model.lm_head.weight.device
    prompt = torch.randint(1, 300, (n,), generator=torch.Generator().manual_seed(n)).to(dev)

    def facts(cache, first, drafted):
        return {"first": int(first), "dlog": drafted[0].cpu(), "dh": drafted[1].cpu(),
                "state": [s.cpu() for s in cache.state], "kv": [k[:, :n].cpu() for k in cache.kv]}

    with torch.no_grad():
        out = {"eager": facts(*eager_prefill(model, prompt, 256))}
        cache, first, drafted, captured = padded_prefill(model, prompt, 256, capture=capture)
        out["padded"] = {**facts(cache, first, drafted), "captured": captured}
    if engine_tokens:
        from lingc.runtime.relay.engine import Engine
        engine = Engine(model, max_len=n + engine_tokens + 32, options={"inductor": False}, progress=False,
                        prefill_graphs=True if capture else None)
        out["plain"] = engine.generate(prompt.tolist(), engine_tokens, speculative=None, eos_token_id=None)
        out["plain_rows"] = engine.stats.prefill_rows
        out["spec"] = engine.generate(prompt.tolist(), engine_tokens, eos_token_id=None)
        out["spec_rows"] = engine.stats.prefill_rows
    return out


def capture_disagreement_case(tp) -> dict:
    """Rank 0's capture of a prefill bucket succeeds (a stand-in graph), rank 1's fails: after
    prepare() every rank must hold the bucket uncaptured, and rank 0 must have said why."""
    import warnings

    import lingc.runtime.relay.prefill_graphs as pg
    from lingc.models import Ling3Cache

    def fake_capture(role, fn, pool, warmup=2):
        if tp.rank == 0:
            return pg.CapturedStep(role, fn, object(), output=None)
        return pg.CapturedStep(role, fn, None, reason="RuntimeError: injected")

    model = model_for(tp)
    cache = Ling3Cache.allocate(model.config, 128, device=model.lm_head.weight.device)
    real, pg.capture_step = pg.capture_step, fake_capture
    try:
        graphs = pg.PrefillGraphs(model, cache, draft=False, buckets=(64,), capture=True, progress=False, pool=0)
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            graphs.prepare()
    finally:
        pg.capture_step = real
    return {"captured": graphs.captured, "reason": graphs._ready[64].step.reason,
            "warnings": [str(w.message) for w in seen]}
