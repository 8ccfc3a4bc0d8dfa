"""Batch-1 decode: eager vs Inductor vs lingc (plain and NEXTN relay), with the floor.

    python -m benchmarks.decode --preset flash-tp4-rank --context 8192 --out OUT
        [--modes eager,eager-nextn,inductor,reduce-overhead,reduce-overhead-pdl,
                 reduce-overhead-nextn,lingc,lingc-nextn]
        [--lingc-inductor 0|1] [--lingc-gc-freeze 0|1] [--tokens 128] [--steps 3 4 5 6 7 8] [--profile]
    torchrun --nproc-per-node N -m benchmarks.decode --tp N --preset flash ...   (tensor parallel)
    python -m benchmarks.decode --smoke --out OUT       (CPU, tiny preset: exercises every path)

`--steps` sets the relay depth (draft forwards per step, draft tokens = steps + 1); several values
sweep it: each relay mode runs once per depth ("lingc-nextn s=4"), with its own floor, so a user
can pick the depth from step time x accept length. `--profile` adds, per lingc graph, device time
by kernel name, a Chrome trace (OUT/trace_<mode>_<role>.json) and the kernel sequence of one
replay with grids (in the JSON; `python -m benchmarks.sequence` compares two runs), and each
layer's chain against its floor (`layer_floor_us` in the JSON; `python -m benchmarks.layer_chains`
tables it by layer or class of layer), and the chain bound: the step's kernels x one PDL kernel
boundary (timed in the same run by `benchmarks.sync_probe`'s chained form) + the floor, the least
a chain of that many dependent kernels could take even if each read its bytes at the copy
bandwidth (`chain_bound_ms` in the JSON). Sanity: every
lingc relay run's greedy tokens must equal plain lingc's from the same synthetic state (printed, and
`spec_equals_plain` in the JSON); where one does not, the run says so before its table and exits
with status 1 once its outputs are written. Output: the table on stdout, OUT/decode.json, and OUT/decode.png
when matplotlib is installed (else `python -m benchmarks.plot` draws it anywhere).

Tensor parallel: `--preset` names the whole model and every rank builds its slice (random
weights, the same slices a checkpoint would give); the ranks run every mode in lockstep and rank 0
reports. The floor is per rank (the bytes one GPU reads), and the all-reduce share of a lingc
step is estimated as (collectives in the step's graphs) x (one decode-sized all-reduce captured
in a CUDA graph, measured in the same run) / step time.

Random bf16 weights unless `--checkpoint DIR` loads a Ling-3 checkpoint (it says which in the
output). The context is synthetic: the cache holds `context` rows of random latents and random
KDA states, as after a prefill, and decoding starts at position `context` (eager MLA scans every
cache row, so its cost is that of the full cache whatever the position; lingc's MLA kernel reads
rows up to the position, which is `context`). With `--prompt-ids-file FILE` the lingc modes
prefill those token ids instead and decode after them (the context is their length), so with a
checkpoint the relay's accept length and TPOT are measured, not projected; the eager and Inductor
modes still time their steps on the synthetic cache at that position (their step time does not
depend on the cache's content), and the eager relay keeps its short prompt.

Columns (method.md): step time = GPU time of one step (CUDA events, median); wall per step =
wall time of the real generation loop / steps launched (host run-ahead included); host per step
= Python time to launch a step; tokens per step = measured accept length (random weights give
about 1); TPOT = wall per step / tokens per step, and projected at the article's accept length
3.25 for relay rows (a projection, labelled); floor = bytes the step must read / copy bandwidth
measured in the same run, with the routed experts counted from the router's real choices;
lingc faster by = another system's wall per step over lingc's in the same run (plain modes
against lingc, relay modes against the lingc relay at the same depth). Each lingc mode's notes
also give the timed loop's median gap between two steps' token rows (a mean wall per step over
1.25x it is flagged STALLED), the garbage collections inside the loop and the one that froze the
heap after prepare (runtime/relay/host_gc.py; `--lingc-gc-freeze 0` leaves the heap unfrozen).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import NamedTuple

import torch

from lingc.cli import check_vocabulary, load_checkpoint, parse_token_ids, source_label, top_p_arg
from lingc.models import Ling3Cache, build_model, preset
from lingc.models.moe import MoE
from lingc.models.parallel import init_from_env
from lingc.runtime.relay.driver import PASS_ROLE
from lingc.runtime.relay.engine import MAX_STEPS

from .common import call_times_ms, copy_bandwidth_gbps, environment, markdown_table, require_cuda, write_json
from .layer_chains import summary_line
from .method_figures import count_aten_ops, sanity_lines
from .sequence import by_kind

ALL_MODES = ["eager", "eager-nextn", "inductor", "reduce-overhead", "reduce-overhead-pdl",
             "inductor-nextn", "reduce-overhead-nextn",
             "lingc", "lingc-nextn", "lingc-symm", "lingc-nextn-symm"]   # -symm: allreduce="symm_mem"
ARTICLE_ACCEPT = 3.25
STEPS = 5
DEFAULTS = dict(preset="flash-tp4-rank", context=8192, tokens=128, modes="eager,lingc,lingc-nextn")
SMOKE = dict(preset="tiny", context=64, tokens=8, modes="eager,eager-nextn,lingc,lingc-nextn")
DEV = "cuda"             # "cpu" in a --smoke run


def _sync() -> None:
    if DEV == "cuda":
        torch.cuda.synchronize()


def _events_ms(fn, reps, warmup=2):
    """Median ms per call: CUDA events on the GPU, wall clock in a CPU smoke run."""
    return statistics.median(call_times_ms(fn, reps, warmup, DEV == "cuda"))


def cpu_copy_bandwidth_gbps(nbytes: int = 256 * 1024**2, reps: int = 5) -> float:
    """Host memory copy bandwidth (read + write), for the smoke run's floor."""
    src = torch.empty(nbytes, dtype=torch.uint8)
    dst = torch.empty_like(src)
    ms = _events_ms(lambda: dst.copy_(src), reps, warmup=1)
    return 2 * nbytes / (ms * 1e-3) / 1e9


def fill_synthetic(cache: Ling3Cache, seed: int = 1) -> None:
    g = torch.Generator(device=cache.kv[0].device).manual_seed(seed)
    for t in cache.tensors():
        t.normal_(0, 0.3, generator=g)


def prompt_start(prompt: list[int]):
    """A lingc run's start from a real prompt (``--prompt-ids-file``): the engine's own prefill
    (the target's cache, and the draft layer's for the relay), which leaves the cache and relay
    buffers where generate() continues from; the prefill's first token is not part of the run.
    Returns a ``start(eng, context, speculative)`` for run_lingc."""
    def start(eng, context: int, speculative: bool) -> None:
        next(eng.stream(prompt, 2, speculative="nextn" if speculative else None, eos_token_id=None))
    return start


def read_prompt_ids(path: str) -> list[int]:
    """Token ids from a text file, separated by whitespace or commas (lingc has no tokenizer)."""
    try:
        text = Path(path).read_text()
    except OSError as e:
        raise SystemExit(f"--prompt-ids-file {path}: {e.strerror}") from None
    return parse_token_ids(text, f"--prompt-ids-file {path}")


def synthetic_start(eng, context: int, speculative: bool = False) -> None:
    """The synthetic context of an Engine: the same cache and relay inputs for every engine and
    run (decoding continues at position ``context``); plain and relay runs share it."""
    fill_synthetic(eng.cache)
    r = eng.relay
    r.n.fill_(context)
    r.x.fill_(7)
    r.seed.fill_(11)
    r.dh.normal_(generator=torch.Generator(device=r.dh.device).manual_seed(5))


# -- the floor ------------------------------------------------------------------------------------

class _LayerSpec(NamedTuple):
    label: str        # the class of layer benchmarks.layer_chains groups by
    weights: int      # non-expert weight bytes
    cache: int        # cache bytes read (and KDA state written) at T = 1
    staged: int       # bytes per extra staged position (a verify's KDA post-states)
    moe: bool


class Floor:
    """Bytes a step must read: every non-expert weight it uses once, the distinct routed experts
    the router really chose (hooked), the MLA cache rows up to the position, KDA states read and
    written (plus the staged copies of a verify)."""

    def __init__(self, model, context: int):
        self.model, self.context, cfg = model, context, model.config
        n = cfg.num_hidden_layers
        layers = list(model.model.layers)
        expert_params = {id(p) for m in model.modules() if isinstance(m, MoE) for p in m.experts.parameters()}
        self.expert_bytes = 3 * cfg.hidden_size * cfg.moe_intermediate_size * 2   # gate, up, down bf16

        def dense(mods):
            return sum(p.numel() * p.element_size() for m in mods for p in m.parameters()
                       if id(p) not in expert_params)

        # Per layer (benchmarks.layer_chains): its weights, its cache bytes at T = 1 (MLA latent rows
        # up to the position; a KDA state read once and written once) and per staged position.
        mla_rows = context * cfg.mla_cache_dim * 2
        state = cfg.num_attention_heads * cfg.head_dim ** 2 * 4
        mla = set(cfg.mla_layers)
        self.target_layers = [
            _LayerSpec(f"{'MLA' if i in mla else 'KDA'} + {'MoE' if cfg.is_moe_layer(i) else 'dense MLP'}",
                       dense([layer]), mla_rows if i in mla else 2 * state, 0 if i in mla else state,
                       cfg.is_moe_layer(i))
            for i, layer in enumerate(layers[:n])]
        self.draft_layer = _LayerSpec("draft (NEXTN) layer", dense(layers[n:]), mla_rows, 0, True)
        # A whole forward: its layers plus the final norm and the lm_head (the draft: the lm_head).
        self.target_dense = sum(s.weights for s in self.target_layers) + dense([model.model.norm, model.lm_head])
        self.draft_dense = self.draft_layer.weights + dense([model.lm_head])
        self.target_cache = sum(s.cache for s in self.target_layers)
        self.draft_cache = self.draft_layer.cache
        self.state_bytes = sum(s.staged for s in self.target_layers)     # one staged position

    def layer_bytes(self, T: int, experts: list[int], draft: bool = False) -> list[tuple[str, int]]:
        """(class, bytes) of each layer one forward at T runs, in order: the target's layers, or
        the draft's one (``draft``). ``experts``: the distinct experts of each MoE layer of that
        forward (``experts_per_layer``). A forward's ``bytes`` is their sum plus the final norm and
        the lm_head (the target) or the lm_head (the draft)."""
        specs = [self.draft_layer] if draft else self.target_layers
        moe = [i for i, s in enumerate(specs) if s.moe]
        if len(experts) != len(moe):
            raise ValueError(f"{len(experts)} expert counts for {len(moe)} MoE layers")
        per = dict(zip(moe, experts))
        return [(s.label, s.weights + s.cache + (T * s.staged if T > 1 else 0) + per.get(i, 0) * self.expert_bytes)
                for i, s in enumerate(specs)]

    def distinct_experts(self, fn) -> int:
        """Sum over MoE layers of the distinct experts chosen while fn() runs."""
        return sum(self.experts_per_layer(fn))

    def experts_per_layer(self, fn) -> list[int]:
        """The distinct experts each MoE layer chose while fn() runs, in the order they ran."""
        seen: list[set] = []

        def hook(mod, inp, out):
            seen.append(set(out[0].reshape(-1).tolist()))
        hs = [m.gate.register_forward_hook(hook) for m in self.model.modules() if isinstance(m, MoE)]
        try:
            with torch.no_grad():
                fn()
        finally:
            for h in hs:
                h.remove()
        return [len(s) for s in seen]

    def bytes(self, target_T: int | None, draft_Ts: list[int], experts: int) -> int:
        b = experts * self.expert_bytes
        if target_T is not None:
            b += self.target_dense + self.target_cache
            if target_T > 1:
                b += target_T * self.state_bytes                           # staged states
        for _ in draft_Ts:
            b += self.draft_dense + self.draft_cache
        return b


# -- modes ----------------------------------------------------------------------------------------

def _step_fn(model):
    def step(ids, pos, cache):
        logits, _ = model(ids, pos, cache)
        return logits.argmax(-1)
    return step


def allreduce_graph_us(tp, numel: int, symm: bool = False, calls: int = 50) -> float:
    """One bf16 all-reduce of `numel` values inside a CUDA graph (median per call): NCCL through
    the functional collective, or lingc's symmetric-memory one-shot op."""
    if symm:
        import lingc.runtime.collectives  # noqa: F401
        reduce = lambda t: torch.ops.lingc.one_shot_all_reduce(t, tp.group_name)  # noqa: E731
    else:
        reduce = tp.all_reduce
    x = torch.randn(1, numel, device="cuda", dtype=torch.bfloat16)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            y = reduce(x) * 0.5
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        y = x
        for _ in range(calls):
            y = reduce(y) * 0.5
    return _events_ms(g.replay, reps=20, warmup=3) * 1e3 / calls


def collectives_per_step(roles) -> int:
    """Collective kernels in the last compiled graph of each role (lingc's kernel tables)."""
    from lingc.backend import compile_reports
    last = {r.role: r for r in compile_reports}
    return sum(n for role in roles if role in last
               for cat, op, n, _ in last[role].kernels.rows
               if cat == "collective" or op == "lingc.one_shot_all_reduce")


def run_eager(model, cache, ctx, tokens):
    step = _step_fn(model)
    ids = torch.tensor([7], device=DEV)
    pos = torch.tensor([ctx], device=DEV)
    with torch.no_grad():
        ms = _events_ms(lambda: step(ids, pos, cache), reps=5)
    # What the step is made of (method.md's sanity figures), after the timing, in more steps: its
    # ATen ops and, on a GPU, the time its kernels kept the GPU busy.
    ops, kernel_ops = count_aten_ops(lambda: step(ids, pos, cache))
    res = dict(step_ms=ms, wall_ms=ms, host_ms=None, tokens_per_step=1.0, compile_s=0.0,
               aten_ops=ops, kernel_ops=kernel_ops)
    if DEV == "cuda":
        with torch.no_grad():
            rows = kernel_profile(lambda: step(ids, pos, cache), replays=1, top=1 << 30)
        if rows and not rows[0]["kernel"].startswith("profiling failed"):
            res.update(gpu_busy_ms=sum(r["us_per_step"] for r in rows) / 1e3,
                       kernels=round(sum(r["calls_per_step"] for r in rows)))
    return res


def run_eager_nextn(model, cache, ctx, tokens, steps=STEPS):
    """The reference speculative loop (snapshot + replay, host syncs), from a short prompt in the
    same full-size cache."""
    from lingc.decoding.reference import speculative_generate
    times = []
    last = [time.perf_counter()]

    def on_step(step, c):
        _sync()
        now = time.perf_counter()
        times.append(now - last[0])
        last[0] = now
    speculative_generate(model, list(range(3, 19)), 14, steps=steps, eos_token_id=None,
                         cache=cache, on_step=on_step)
    wall = statistics.median(times[1:]) * 1e3 if len(times) > 1 else times[0] * 1e3
    return dict(step_ms=None, wall_ms=wall, host_ms=None, tokens_per_step=None, compile_s=0.0)


def inductor_kwargs(mode: str) -> dict:
    """torch.compile's keyword arguments for an Inductor mode ("-nextn" relay modes alike)."""
    base = mode.removesuffix("-nextn")
    if base == "reduce-overhead":
        return {"mode": "reduce-overhead"}
    if base == "reduce-overhead-pdl":
        return {"options": {"triton.cudagraphs": True, "triton.enable_pdl": True}}
    return {}


def _cudagraph_mode(kwargs: dict) -> bool:
    return kwargs.get("mode") == "reduce-overhead" or bool(kwargs.get("options", {}).get("triton.cudagraphs"))


def static_cache_for_cudagraphs(cache, kwargs: dict) -> int:
    """For Inductor's CUDA-graph modes: mark the cache tensors as static inputs, so that
    cudagraph trees capture a step that writes them (a mutated non-static input makes Inductor
    skip its CUDA graphs, "mutated inputs"); the benchmark's cache lives at fixed addresses like
    a serving engine's. Returns the cudagraph-skip counter to compare after the first call."""
    from torch._dynamo.utils import counters
    if _cudagraph_mode(kwargs):
        for t in cache.tensors():
            torch._dynamo.mark_static_address(t)
    return counters["inductor"]["cudagraph_skips"]


def cudagraphs_used(kwargs: dict, skips_before: int) -> bool | None:
    """True / False for a CUDA-graph mode (no skip counted since ``skips_before``), else None."""
    from torch._dynamo.utils import counters
    if _cudagraph_mode(kwargs):
        return counters["inductor"]["cudagraph_skips"] == skips_before
    return None


def run_inductor(model, cache, ctx, tokens, mode):
    step = _step_fn(model)
    kwargs = inductor_kwargs(mode)
    torch._dynamo.reset()
    skips = static_cache_for_cudagraphs(cache, kwargs)
    compiled = torch.compile(step, fullgraph=True, dynamic=False, **kwargs)
    ids = torch.tensor([7], device=DEV)
    pos = torch.tensor([ctx], device=DEV)
    t0 = time.perf_counter()
    with torch.no_grad():
        compiled(ids, pos, cache)
        _sync()
        compile_s = time.perf_counter() - t0
        ms = _events_ms(lambda: compiled(ids, pos, cache), reps=20, warmup=3)
        t1 = time.perf_counter()
        for _ in range(20):
            compiled(ids, pos, cache)
        _sync()
        wall = (time.perf_counter() - t1) / 20 * 1e3
    return dict(step_ms=ms, wall_ms=wall, host_ms=None, tokens_per_step=1.0, compile_s=compile_s,
                inductor_cudagraphs=cudagraphs_used(kwargs, skips))


def run_inductor_relay(model, cache, ctx, mode, steps=STEPS, compile_kwargs=None):
    """The forwards of one relay step under Inductor, as the floor counts them: the draft's
    ``steps - 1`` forwards at T=1, the target's verify forward and the draft's extend forward at
    T = steps + 1 (each greedy: argmax in the compiled function). Each shape is compiled once
    (``dynamic=False``) and timed alone; the step's GPU time is their sum, and its wall time is
    the same forwards launched back to back. No host verdict, snapshot or replay runs between
    them, so this bounds a real Inductor relay from below (the comparison favours Inductor).
    ``compile_kwargs`` replaces ``inductor_kwargs(mode)`` (tests pass an eager backend)."""
    kwargs = inductor_kwargs(mode) if compile_kwargs is None else compile_kwargs
    hidden = model.config.hidden_size
    dtype = model.lm_head.weight.dtype

    def target(ids, pos, c):
        logits, hid = model(ids, pos, c)
        return logits.argmax(-1), hid

    def draft(ids, pos, h, c):
        logits, dh = model.draft(ids, pos, h, c)
        return logits.argmax(-1), dh

    torch._dynamo.reset()
    skips = static_cache_for_cudagraphs(cache, kwargs)
    target_c = torch.compile(target, fullgraph=True, dynamic=False, **kwargs)
    draft_c = torch.compile(draft, fullgraph=True, dynamic=False, **kwargs)
    n = steps + 1
    ids1, pos1 = torch.tensor([7], device=DEV), torch.tensor([ctx], device=DEV)
    idsn, posn = torch.arange(7, 7 + n, device=DEV), torch.arange(ctx, ctx + n, device=DEV)
    h1 = torch.randn(1, hidden, device=DEV, dtype=dtype)
    hn = torch.randn(n, hidden, device=DEV, dtype=dtype)
    calls = {"draft T=1": (lambda: draft_c(ids1, pos1, h1, cache), steps - 1),
             f"verify T={n}": (lambda: target_c(idsn, posn, cache), 1),
             f"extend T={n}": (lambda: draft_c(idsn, posn, hn, cache), 1)}
    t0 = time.perf_counter()
    with torch.no_grad():
        for fn, _ in calls.values():
            fn()
        _sync()
        compile_s = time.perf_counter() - t0
        per_call = {name: _events_ms(fn, reps=10, warmup=2) for name, (fn, _) in calls.items()}

        def step():
            for fn, k in calls.values():
                for _ in range(k):
                    fn()
        step()
        _sync()
        t1 = time.perf_counter()
        for _ in range(5):
            step()
        _sync()
        wall = (time.perf_counter() - t1) / 5 * 1e3
    return dict(step_ms=sum(per_call[name] * k for name, (_, k) in calls.items()), wall_ms=wall,
                host_ms=None, tokens_per_step=None, compile_s=compile_s, per_graph_ms=per_call,
                inductor_cudagraphs=cudagraphs_used(kwargs, skips))


def engine_rows(ctx: int, tokens: int, max_steps: int) -> int:
    """Cache rows a lingc engine of the run allocates: the context, then every step of the
    deepest relay writing its whole chain (the relay may run ahead of its verdicts), plus slack."""
    return ctx + (tokens + 8) * (max_steps + 1) + 64


def check_cache_rows(ctx: int, tokens: int, steps: list[int], max_positions: int) -> None:
    """Refuse a context and token count the model's positions cannot hold, before any mode runs."""
    deepest = max(steps + [STEPS])
    rows = max(ctx + 128, engine_rows(ctx, tokens, deepest))
    if rows > max_positions:
        room = max_positions - (rows - ctx)
        most_tokens = (max_positions - ctx - 64) // (deepest + 1) - 8
        fix = (f"at most --context {room}" if room > 0 else
               f"at most --tokens {most_tokens}" if most_tokens >= 1 else "a shorter --context")
        raise SystemExit(f"--context {ctx} with --tokens {tokens} and --steps {deepest} needs {rows} "
                         f"cache rows, more than the model's max_position_embeddings {max_positions}: use {fix}")


# A speculative sampling request's graphs beside the greedy relay's: the verify of greedy drafts,
# then the three graphs of sampled drafts (steps.py); PASS_ROLE names the greedy role each replaces.
SAMPLED_RELAY_ROLES = ("verify_sample", "draft_sample", "verify_sample_q", "extend_sample")


def run_lingc(model, ctx, tokens, speculative, lingc_inductor, allreduce="nccl", progress=True,
              profile=None, steps=STEPS, max_steps=STEPS, start=synthetic_start, sampled_verify=False,
              sampled_top_p=(1.0,), gc_freeze=True):
    """``profile``: None, or the path prefix of the Chrome traces to write (one per graph).
    ``max_steps``: the deepest relay of the run; every engine gets the same cache size, so the
    same synthetic context, and the relay's tokens can be checked against plain decode's.
    ``start(eng, ctx, speculative)`` sets up the state decoding continues from: the synthetic
    context, or ``prompt_start``'s prefill of a real prompt. ``sampled_verify``: also compile,
    capture and time a sampling request's graph: the relay's verify_sample (the same target
    forward with speculative sampling's in-graph draw) as ``verify_sample_ms``, plain decoding's
    decode_sample (the token drawn in the graph) as ``decode_sample_ms``, and the relay with
    sampled drafts (draft_sample, verify_sample_q, extend_sample), at each of ``sampled_top_p``
    (the relay buffers' top_p; 1: no nucleus) as ``sampled_ms_by_top_p``, the first also as
    ``<role>_ms``."""
    from lingc.runtime.relay.engine import Engine
    eng = Engine(model, max_len=engine_rows(ctx, tokens, max_steps), steps=steps,
                 options={"inductor": bool(lingc_inductor), "allreduce": allreduce, "gc_freeze": bool(gc_freeze)},
                 progress=progress)
    roles = ("draft", "verify", "extend") if speculative else ("decode",)
    extra = (SAMPLED_RELAY_ROLES if speculative else ("decode_sample",)) if sampled_verify else ()
    t0 = time.perf_counter()
    eng.prepare(roles + extra)
    _sync()
    compile_s = time.perf_counter() - t0
    start(eng, ctx, speculative)
    kind = "nextn" if speculative else None
    list(eng.resume(8, kind))                       # warm-up steps (not timed)
    _sync()
    t1 = time.perf_counter()
    out = list(eng.resume(tokens, kind))
    _sync()
    wall = (time.perf_counter() - t1) / eng.stats.launched * 1e3
    st = eng.stats
    gaps = [b - a for a, b in zip(st.read_at, st.read_at[1:])]
    infos = [i for i in eng.graph_infos() if i.role in roles]
    per_graph, kernels, sequence = {}, None, None
    with torch.no_grad():          # as the engine runs them (an uncaptured step would recompile)
        for role in roles:
            per_graph[role] = _events_ms(lambda: eng._steps[role](), reps=20)
        by_top_p = {}
        for role in extra:
            for p in sampled_top_p:
                eng.relay.top_p.fill_(p)
                by_top_p.setdefault(role, {})[p] = _events_ms(lambda: eng._steps[role](), reps=20)
            per_graph[role] = by_top_p[role][sampled_top_p[0]]
            eng.relay.top_p.fill_(1.0)
        if profile is not None:
            kernels = {role: kernel_profile(eng._steps[role], trace=f"{profile}_{role}.json") for role in roles}
            sequence = {role: kernel_sequence(f"{profile}_{role}.json") for role in roles}
    sampled = {f"{role}_ms": per_graph.pop(role, None) for role in SAMPLED_RELAY_ROLES + ("decode_sample",)}
    # The tokens for the speculative == plain check come from one uninterrupted run from the
    # synthetic context: between two resume() calls the steps launched ahead of the last token
    # read have already advanced the cache, by a different number of tokens in each mode.
    start(eng, ctx, speculative)
    check = list(eng.resume(tokens, kind))
    _sync()
    return dict(step_ms=sum(per_graph.values()), wall_ms=wall,
                host_ms=statistics.median(st.host_s) * 1e3,
                tokens_per_step=len(out) / max(1, st.steps), compile_s=compile_s,
                collectives=collectives_per_step(roles),
                per_graph_ms=per_graph, ahead=st.ahead / max(1, st.launched - 1),
                wall_median_ms=statistics.median(gaps) * 1e3 if gaps else None,
                gc_in_timed_loop=[dict(generation=c.generation, ms=round(c.ms, 3)) for c in st.collections],
                heap_settled=dict(frozen=eng.heap_settled[0], ms=round(eng.heap_settled[1], 1)),
                captured={r_: eng._steps[r_].captured for r_ in roles},
                graphs=[i.format() for i in infos], kernel_profile=kernels,
                kernels_per_step=sum(i.kernel_nodes for i in infos),
                kernel_sequence=sequence,
                tokens=[int(t) for t in check], sampled_ms_by_top_p=by_top_p or None, **sampled)


def stall_line(r: dict) -> str:
    """The timed loop's wall per step (a mean, stalls included) against the median gap between
    two steps' token rows: a host stall inside the loop (a garbage collection, another process)
    shows as a mean well above the median."""
    med = r.get("wall_median_ms")
    if not med:
        return "no row gaps"
    ratio = r["wall_ms"] / med
    flag = f" STALLED: the mean is {ratio:.2f}x the median" if ratio > 1.25 else ""
    return f"wall per step {r['wall_ms']:.3f} ms (mean), {med:.3f} ms (median gap between rows){flag}"


def gc_line(collections: list[dict], settled: dict | None = None) -> str:
    """The timed generation loop's garbage collections, and the collection after prepare that
    froze the heap (host_gc.py; its time is what one full collection in the loop would cost)."""
    if not collections:
        line = "no garbage collection in the timed loop"
    else:
        worst = max(collections, key=lambda c: c["ms"])
        line = (f"{len(collections)} garbage collection(s) in the timed loop, "
                f"{sum(c['ms'] for c in collections):.1f} ms (longest {worst['ms']:.1f} ms, generation "
                f"{worst['generation']})")
    if settled and settled.get("frozen"):
        line += f"; heap frozen after prepare: {settled['frozen']} objects, collected in {settled['ms']:.0f} ms"
    return line


def kernel_profile(step, trace: str | None = None, replays: int = 5, top: int = 15) -> list[dict]:
    """Device time per kernel name over one step (torch.profiler around `replays` replays of the
    step's graph): [{kernel, us_per_step, calls_per_step, critical_us_per_step}], the `top`
    largest by critical time, and the Chrome trace of those replays at `trace`.

    Kernels overlap under PDL (a dependent starts early and waits), so `us_per_step` (start to
    end of each kernel) may sum past the step time. `critical_us_per_step` does not: the kernels
    are ordered by end time and each is charged the time from the previous kernel's end to its
    own, which is what it added to the chain (the deltas sum to the replays' span). In a CPU
    smoke run: CPU time per op, and the critical time equals it."""
    from torch.profiler import ProfilerActivity, profile

    step()
    _sync()
    activity = ProfilerActivity.CUDA if DEV == "cuda" else ProfilerActivity.CPU
    try:
        with profile(activities=[activity]) as prof:
            for _ in range(replays):
                step()
            _sync()
        if trace:
            prof.export_chrome_trace(trace)
    except Exception as e:  # noqa: BLE001  (the timing stands without the breakdown)
        return [{"kernel": f"profiling failed: {type(e).__name__}: {e}"[:200], "us_per_step": 0.0,
                 "calls_per_step": 0.0, "critical_us_per_step": 0.0}]
    critical = critical_path_us(prof.events()) if DEV == "cuda" else {}
    rows = []
    for ev in prof.key_averages():
        if DEV == "cuda":
            us = getattr(ev, "device_time_total", None)
            if us is None:
                us = getattr(ev, "cuda_time_total", 0.0)
        else:
            us = ev.self_cpu_time_total
        if us > 0:
            rows.append({"kernel": ev.key[:80], "us_per_step": us / replays, "calls_per_step": ev.count / replays,
                         "critical_us_per_step": critical.get(ev.key, us) / replays})
    rows.sort(key=lambda r: -r["critical_us_per_step"])
    return rows[:top]


def kernel_sequence(trace: str, replays: int = 5) -> list[dict]:
    """The kernels of one replay in the Chrome trace that ``kernel_profile`` wrote, in order of
    their end: [{kernel, grid, critical_us, us}], critical_us as in ``critical_path_us`` (the
    time since the previous kernel's end). The grid tells apart launches of one kernel at
    different shapes (the fused KDA projection from o_proj). [] without a readable trace."""
    try:
        with open(trace) as f:
            events = json.load(f).get("traceEvents", [])
    except (OSError, ValueError):
        return []
    kernels = sorted(((e["ts"] + e.get("dur", 0.0), e) for e in events
                      if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset") and "ts" in e),
                     key=lambda p: p[0])  # by end only: two kernels may end together
    if not kernels:
        return []
    per_replay = len(kernels) // replays
    out, prev = [], None
    for end, e in kernels[per_replay:2 * per_replay]:  # the second replay: the first follows a sync
        out.append({"kernel": e.get("name", "?")[:60], "grid": e.get("args", {}).get("grid"),
                    "critical_us": round(end - (prev if prev is not None else e["ts"]), 2),
                    "us": round(e.get("dur", 0.0), 2)})
        prev = end
    return out


def critical_path_us(events) -> dict[str, float]:
    """Per kernel name, the summed time from the previous device kernel's end to its own end, over
    the device kernels of a profile (the first kernel is charged its own duration)."""
    spans = []
    for ev in events:
        if getattr(ev, "device_type", None) == torch.autograd.DeviceType.CUDA and ev.time_range.end > 0:
            spans.append((ev.time_range.end, ev.time_range.start, ev.name))
    spans.sort()
    out: dict[str, float] = {}
    prev = None
    for end, start, name in spans:
        out[name] = out.get(name, 0.0) + (end - (prev if prev is not None else start))
        prev = end
    return out


def main(argv=None) -> int:
    global DEV
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--preset", help=f"default {DEFAULTS['preset']} ({SMOKE['preset']} with --smoke)")
    ap.add_argument("--context", type=int, help=f"default {DEFAULTS['context']} ({SMOKE['context']} with --smoke)")
    ap.add_argument("--tokens", type=int, help=f"default {DEFAULTS['tokens']} ({SMOKE['tokens']} with --smoke)")
    ap.add_argument("--modes", help=f"comma-separated, of {ALL_MODES}; default {DEFAULTS['modes']} "
                                    f"({SMOKE['modes']} with --smoke)")
    ap.add_argument("--lingc-inductor", type=int, default=1)
    ap.add_argument("--lingc-gc-freeze", type=int, choices=(0, 1), default=1,
                    help="the engines' gc_freeze option (1: the heap collected and frozen after capture); "
                         "each lingc mode's notes list the garbage collections inside its timed loop")
    ap.add_argument("--tp", type=int, default=1, help="tensor-parallel size (= torchrun's world size)")
    ap.add_argument("--steps", type=int, nargs="+", default=[STEPS],
                    help="NEXTN relay depth(s): draft forwards per step (draft tokens = steps + 1); "
                         "several values sweep the relay modes (e.g. --steps 3 4 5 6 7 8)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--sampled-verify", action="store_true",
                    help="lingc modes: also time a sampling request's graphs (the relay's verify_sample: "
                         "speculative sampling's draw in the graph; the relay with sampled drafts: "
                         "draft_sample, verify_sample_q, extend_sample; plain decoding's decode_sample)")
    ap.add_argument("--sampled-top-p", type=top_p_arg, nargs="+", default=[1.0], metavar="P",
                    help="with --sampled-verify: the top_p value(s) the sampled graph is timed at (default 1: "
                         "no nucleus)")
    ap.add_argument("--profile", action="store_true",
                    help="lingc modes: device time per kernel in each graph, and a Chrome trace of "
                         "each graph (OUT/trace_<mode>_<role>.json, chrome://tracing or Perfetto)")
    ap.add_argument("--smoke", action="store_true",
                    help="CPU smoke run of the whole path (tiny preset unless given, lingc leftovers as ATen "
                         "ops, wall-clock timing)")
    ap.add_argument("--checkpoint", metavar="DIR",
                    help="a Ling-3 HF checkpoint directory instead of --preset's random weights (under "
                         "torchrun each rank reads its slices)")
    ap.add_argument("--prompt-ids-file", metavar="FILE",
                    help="a real context: token ids (whitespace or commas) that the lingc modes prefill and "
                         "decode after, so the relay's accept length is measured; the context is its length")
    args = ap.parse_args(argv)
    source_label(args.preset, args.checkpoint)          # refuses both at once
    prompt = read_prompt_ids(args.prompt_ids_file) if args.prompt_ids_file else None
    if prompt is not None:
        if args.context is not None and args.context != len(prompt):
            raise SystemExit(f"--context {args.context} and --prompt-ids-file {args.prompt_ids_file} "
                             f"({len(prompt)} ids): the prompt is the context; give one of the two")
        args.context = len(prompt)
    if args.checkpoint:
        args.preset = f"checkpoint {Path(args.checkpoint).name}"
    for k, v in (SMOKE if args.smoke else DEFAULTS).items():
        if getattr(args, k) is None:
            setattr(args, k, v)
    if args.smoke:
        DEV = "cpu"
        args.lingc_inductor = 0
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    bad = [m for m in modes if m not in ALL_MODES]
    if bad:
        raise SystemExit(f"unknown mode(s) {bad}; valid: {ALL_MODES}")
    if any(not 1 <= k <= MAX_STEPS for k in args.steps):
        raise SystemExit(f"--steps {args.steps}: every depth must be in 1..{MAX_STEPS} "
                         f"(draft tokens = steps + 1 <= {MAX_STEPS + 1})")
    if not args.checkpoint:
        check_cache_rows(args.context, args.tokens, args.steps, preset(args.preset).max_position_embeddings)
    if DEV == "cuda":
        require_cuda()
    tp = init_from_env()
    if tp.size != args.tp:
        raise SystemExit(f"--tp {args.tp} but {tp.size} process(es) are running: launch with "
                         f"torchrun --nproc-per-node {args.tp} -m benchmarks.decode --tp {args.tp} ...")
    lead = tp.rank == 0
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    bw = copy_bandwidth_gbps() if DEV == "cuda" else cpu_copy_bandwidth_gbps()
    if args.checkpoint:
        model = load_checkpoint(args.checkpoint, dtype=torch.bfloat16, device=DEV, progress=lead, tp=tp,
                                router_dtype="bf16")
    else:
        model = build_model(preset(args.preset, router_dtype="bf16"), device=DEV, dtype=torch.bfloat16, seed=0,
                            progress=lead, tp=tp)
    cfg = model.config
    if prompt is not None:
        check_vocabulary(prompt, cfg.vocab_size, f"--prompt-ids-file {args.prompt_ids_file}")
    ctx = args.context
    if args.checkpoint:           # a preset's positions were checked before the weights were built
        check_cache_rows(ctx, args.tokens, args.steps, cfg.max_position_embeddings)
    ar_us = {}
    if tp.enabled and DEV == "cuda":
        ar_us = {"T1": allreduce_graph_us(tp, cfg.hidden_size),
                 "T6": allreduce_graph_us(tp, 6 * cfg.hidden_size)}
        if any(m.endswith("-symm") for m in modes):
            ar_us.update(symm_T1=allreduce_graph_us(tp, cfg.hidden_size, symm=True),
                         symm_T6=allreduce_graph_us(tp, 6 * cfg.hidden_size, symm=True))

    cache = Ling3Cache.allocate(cfg, ctx + 128, device=DEV)
    fill_synthetic(cache)
    floor = Floor(model, ctx)

    def experts(T: int, draft: bool) -> list[int]:
        ids, pos = torch.arange(7, 7 + T, device=DEV), torch.arange(ctx, ctx + T, device=DEV)
        if not draft:
            return floor.experts_per_layer(lambda: model(ids, pos, cache))
        h = torch.randn(T, cfg.hidden_size, device=DEV, dtype=torch.bfloat16)
        return floor.experts_per_layer(lambda: model.draft(ids, pos, h, cache))

    def floor_ms(nbytes: int) -> float:
        return nbytes / (bw * 1e9) * 1e3

    def layer_floor_us(T: int, ex: list[int], draft: bool = False) -> list[list]:
        return [[label, round(floor_ms(b) * 1e3, 3)] for label, b in floor.layer_bytes(T, ex, draft)]

    e_d1, e_1 = experts(1, True), experts(1, False)
    e_v = {k: experts(k + 1, False) for k in args.steps}
    e_x = {k: experts(k + 1, True) for k in args.steps}
    plain_bytes = floor.bytes(1, [], sum(e_1))
    relay_bytes = {k: floor.bytes(k + 1, [1] * (k - 1) + [k + 1], sum(e_v[k]) + (k - 1) * sum(e_d1) + sum(e_x[k]))
                   for k in args.steps}
    # Each graph's layers and their floors (benchmarks.layer_chains): the draft graph runs the draft
    # layer at T = 1 steps - 1 times, extend once at steps + 1 tokens.
    layer_floors = {"plain": {"decode": layer_floor_us(1, e_1)}}
    layer_floors.update({k: {"verify": layer_floor_us(k + 1, e_v[k]),
                             "draft": (k - 1) * layer_floor_us(1, e_d1, draft=True),
                             "extend": layer_floor_us(k + 1, e_x[k], draft=True)} for k in args.steps})

    # A T = 6 verify forward's bytes alone (method.md's 7.1 GB figure), at steps = 5.
    verify_bytes = floor.bytes(6, [], sum(e_v[5])) if 5 in e_v else None
    relay_floor = {k: floor_ms(b) for k, b in relay_bytes.items()}
    floors = {"plain": floor_ms(plain_bytes)}
    floors.update({("relay" if len(args.steps) == 1 else f"relay s={k}"): f for k, f in relay_floor.items()})
    say = print if lead else (lambda *a, **k: None)
    say(f"{'host memory ' if DEV == 'cpu' else ''}copy bandwidth {bw:.0f} GB/s; floor"
        f"{' per rank' if tp.enabled else ''} plain step {floors['plain']:.3f} ms ({plain_bytes / 1e9:.2f} GB), "
        + ", ".join(f"relay step (steps={k}) {relay_floor[k]:.3f} ms ({b / 1e9:.2f} GB)"
                    for k, b in relay_bytes.items()))
    if ar_us:
        say(f"all-reduce in a CUDA graph ({tp.size} ranks), us: " + ", ".join(
            f"{k} {v:.1f}" for k, v in ar_us.items()))

    # One PDL-chained kernel boundary, timed here for the chain bound (--profile, lingc modes).
    boundary_us = None
    if args.profile and DEV == "cuda" and any(m.startswith("lingc") for m in modes):
        boundary_us = measure_boundary_us(torch.cuda.get_device_properties(DEV).multi_processor_count, say)

    # (mode, depth) runs: relay modes once per --steps value, named "<mode> s=<k>" in a sweep.
    runs = [(m, k) for m in modes for k in (args.steps if "nextn" in m else [None])]
    results = {}
    for mode, k in runs:
        name = mode if k is None or len(args.steps) == 1 else f"{mode} s={k}"
        t0 = time.perf_counter()
        say(f"== {name}", flush=True)
        try:
            if mode == "eager":
                res = run_eager(model, cache, ctx, args.tokens)
            elif mode == "eager-nextn":
                res = run_eager_nextn(model, cache, ctx, args.tokens, steps=k)
            elif mode.startswith("inductor") or mode.startswith("reduce"):
                res = (run_inductor_relay(model, cache, ctx, mode, steps=k) if mode.endswith("-nextn")
                       else run_inductor(model, cache, ctx, args.tokens, mode))
            else:
                trace = str(out / f"trace_{name.replace(' ', '_').replace('=', '')}") if args.profile else None
                res = run_lingc(model, ctx, args.tokens, "nextn" in mode, args.lingc_inductor,
                                "symm_mem" if mode.endswith("-symm") else "nccl", progress=lead,
                                profile=trace, steps=k or STEPS, max_steps=max(args.steps + [STEPS]),
                                start=prompt_start(prompt) if prompt is not None else synthetic_start,
                                sampled_verify=args.sampled_verify, sampled_top_p=tuple(args.sampled_top_p),
                                gc_freeze=args.lingc_gc_freeze)
        except Exception as e:  # a failing mode is reported, the others still run
            res = {"error": f"{type(e).__name__}: {e}"}
            print(f"rank {tp.rank}: {name} failed: {res['error']}", flush=True)
        res["mode_s"] = time.perf_counter() - t0
        relay = "nextn" in mode
        if relay:
            res["steps"] = k
        res["floor_ms"] = relay_floor[k] if relay else floors["plain"]
        if mode.startswith("lingc"):
            res["layer_floor_us"] = layer_floors[k if relay else "plain"]
        if boundary_us and res.get("kernels_per_step"):
            res["chain_bound_ms"] = chain_bound_ms(res["floor_ms"], res["kernels_per_step"], boundary_us)
        if res.get("wall_ms"):
            tps = res.get("tokens_per_step") or 1.0
            res["tpot_ms"] = res["wall_ms"] / tps
            res["tok_s"] = 1e3 / res["tpot_ms"]
            res["x_floor"] = res["wall_ms"] / res["floor_ms"]
            if relay:
                res["tpot_projected_ms"] = res["wall_ms"] / ARTICLE_ACCEPT
        if ar_us and res.get("collectives") and res.get("step_ms"):
            # A relay step mixes T=1 (draft) and T=6 collectives; the T=6 time bounds it above.
            key = ("symm_" if mode.endswith("-symm") else "") + ("T6" if relay else "T1")
            res["allreduce_ms_est"] = res["collectives"] * ar_us[key] / 1e3
            res["allreduce_share"] = res["allreduce_ms_est"] / res["step_ms"]
        results[name] = res
        if lead:
            write_json(out / _json_name(args), _payload(args, bw, floors, results, tp, ar_us, boundary_us))
    for name, x in lingc_faster_by(results).items():
        results[name]["lingc_faster_by"] = x
    sanity = spec_equals_plain(results)
    against_method = ([] if tp.enabled or prompt is not None or args.checkpoint else
                      sanity_lines(args.preset, ctx, results, plain_bytes / 1e9,
                                   verify_bytes / 1e9 if verify_bytes else None,
                                   verify_experts=sum(e_v[5]) / len(e_v[5]) if verify_bytes else None))
    if lead:    # again: the runs now carry lingc_faster_by, and the checks are added
        write_json(out / _json_name(args), {**_payload(args, bw, floors, results, tp, ar_us, boundary_us),
                                            "spec_equals_plain": sanity, "against_method_md": against_method})
    if not lead:
        return 0

    changed = sorted(name for name, same in sanity.items() if not same)
    if changed:     # before any time or speedup: they are a wrong program's
        print(f"\nWRONG OUTPUT: the greedy tokens of {', '.join(changed)} differ from lingc plain decode's "
              f"(speculative decoding must not change them); the times below are not a result, and the run "
              f"exits with status 1", flush=True)
    rows = [dict(mode=m, **{k: v for k, v in r.items() if not isinstance(v, (dict, list))})
            for m, r in results.items()]
    split = f", {tp.size}-way tensor parallel (per-rank floor)" if tp.enabled else ""
    where = "CPU SMOKE RUN (wall-clock times of the tiny model: they exercise the path, they measure nothing)" \
        if DEV == "cpu" else _weights_label(args, prompt)
    print(f"\n{args.preset}{split}, context {ctx}, {where}\n")
    print(markdown_table(rows, [("mode", "mode", "s"), ("step_ms", "GPU step ms" if DEV == "cuda" else "step ms", ".3f"),
                                ("wall_ms", "wall/step ms", ".3f"), ("host_ms", "host/step ms", ".3f"),
                                ("tokens_per_step", "tokens/step", ".2f"), ("tpot_ms", "TPOT ms", ".3f"),
                                ("tok_s", "tok/s", ".1f"), ("floor_ms", "floor ms", ".3f"),
                                ("x_floor", "x floor", ".2f"),
                                ("tpot_projected_ms", "TPOT @3.25 (proj.) ms", ".3f"),
                                ("compile_s", "compile+capture s", ".1f"),
                                ("lingc_faster_by", "lingc faster by", ".1f"),
                                ("allreduce_share", "all-reduce share (est.)", ".0%")]))
    for m, r in results.items():
        if r.get("inductor_cudagraphs") is not None:
            print(f"{m}: Inductor's CUDA graphs {'used' if r['inductor_cudagraphs'] else 'SKIPPED (see its warning)'}")
        if "per_graph_ms" in r:
            extra = (f"; launch ahead {r.get('ahead', 0):.0%}; captured {r['captured']}"
                     f"; {stall_line(r)}; {gc_line(r.get('gc_in_timed_loop') or [], r.get('heap_settled'))}"
                     if "captured" in r else " (per call; the step runs the draft T=1 call steps - 1 times)")
            print(f"{m}: per graph ms {r['per_graph_ms']}{extra}")
            for role, greedy in PASS_ROLE.items():
                for p, ms in ((r.get("sampled_ms_by_top_p") or {}).get(role) or {}).items():
                    print(f"{m}: a sampling request's {greedy} ({role}, top_p {p:g}) {ms:.3f} ms against "
                          f"greedy {greedy}'s {r['per_graph_ms'][greedy]:.3f}")
            by_p = r.get("sampled_ms_by_top_p") or {}
            if "extend_sample" in by_p:
                for p in by_p["extend_sample"]:
                    parts = {role: by_p[role][p] for role in SAMPLED_RELAY_ROLES[1:]}
                    print(f"{m}: a sampling request's relay step with sampled drafts (top_p {p:g}) "
                          f"{sum(parts.values()):.3f} ms (" + " + ".join(f"{k} {v:.3f}" for k, v in parts.items())
                          + f") against the greedy step's {r['step_ms']:.3f}")
            for g in r.get("graphs", []):
                print("   ", g)
        if r.get("chain_bound_ms"):
            print(f"{m}: chain bound {chain_bound_line(r)}")
        for role, rows in (r.get("kernel_profile") or {}).items():
            print(f"{m} {role}: {'GPU' if DEV == 'cuda' else 'CPU'} us per step by kernel: on the critical path "
                  f"(end to end), and start to end (PDL overlaps those)")
            for k in rows:
                print(f"    {k.get('critical_us_per_step', 0.0):9.1f} us critical  {k['us_per_step']:9.1f} us  "
                      f"{k['calls_per_step']:6.1f} calls  {k['kernel']}")
            seq = (r.get("kernel_sequence") or {}).get(role)
            if seq:
                kinds = ", ".join(f"{kind} {us:.0f} ({n})" for kind, (us, n) in by_kind(seq).items())
                print(f"    by kind, us critical (launches) in one replay: {kinds}")
                floors_role = (r.get("layer_floor_us") or {}).get(role)
                if floors_role:
                    print(f"    {summary_line(seq, [tuple(f) for f in floors_role])}")
    for name, same in sanity.items():
        print(f"greedy output of {name} == lingc plain over the same steps: "
              f"{'yes' if same else 'NO: THE RELAY CHANGED THE OUTPUT'}")
    if against_method:
        print("against method.md's independent figures (one H200, 2026-11-29):")
        for line in against_method:
            print(f"  {line}")
    json_path = out / _json_name(args)
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        print(f"\nwrote {json_path} (no matplotlib here: python -m benchmarks.plot {json_path} --out PNG "
              f"draws the chart on any machine with the bench extra)")
    else:
        from . import plot
        plot.main([str(json_path), "--out", str(json_path.with_suffix(".png"))])
        print(f"wrote {json_path}")
    if changed:
        print(f"decode: FAILED: {', '.join(changed)} changed the greedy output (spec_equals_plain in {json_path})",
              file=sys.stderr)
        return 1
    return 0


def measure_boundary_us(programs: int, say=print) -> float | None:
    """One PDL-chained kernel boundary over `programs` programs (benchmarks.sync_probe's chained
    form, its values checked), or None, said, when the probe fails: the chain bound is an extra
    that must never cost the run it annotates."""
    from .sync_probe import run_form
    try:
        us, ok = run_form("pdl", programs, 64, torch.device(DEV))
    except Exception as e:  # an analysis extra: report it, keep the benchmark
        say(f"no chain bound: the PDL boundary probe failed ({type(e).__name__}: {e})")
        return None
    if not ok or us is None:
        say("no chain bound: the PDL boundary probe computed wrong values")
        return None
    say(f"one PDL-chained kernel boundary (benchmarks.sync_probe, {programs} programs): {us:.2f} us")
    return us


def chain_bound_ms(floor_ms: float, kernels: int, boundary_us: float) -> float:
    """The least time a step of `kernels` dependent kernels can take: each boundary costs one
    PDL-chained grid-wide synchronisation (measured) and the bytes at least the floor."""
    if kernels < 0 or boundary_us < 0 or floor_ms <= 0:
        raise ValueError(f"chain bound of {kernels} kernels, {boundary_us} us a boundary, floor {floor_ms} ms")
    return floor_ms + kernels * boundary_us / 1e3


def chain_bound_line(r: dict) -> str:
    """'N kernels x B us + floor F ms = X ms (Y x floor); the step's wall W ms is Z x the bound'."""
    b, f = r["chain_bound_ms"], r["floor_ms"]
    per = (b - f) * 1e3 / r["kernels_per_step"]
    line = f"{r['kernels_per_step']} kernels x {per:.2f} us + floor {f:.3f} ms = {b:.3f} ms ({b / f:.2f}x floor)"
    if r.get("wall_ms"):
        line += f"; the step's wall {r['wall_ms']:.3f} ms is {r['wall_ms'] / b:.2f}x the bound"
    return line


def lingc_faster_by(results: dict) -> dict[str, float]:
    """For each run of another system: its wall time per step over lingc's of the same kind in
    this run (plain modes against ``lingc``, relay modes against ``lingc-nextn`` at the same
    depth), i.e. how many times faster lingc is. Runs without that lingc run are left out."""
    out = {}
    for name, r in results.items():
        mode, _, depth = name.partition(" ")
        if mode.startswith("lingc") or not r.get("wall_ms"):
            continue
        base = (f"lingc-nextn {depth}".strip() if "nextn" in mode else "lingc")
        lingc_ms = results.get(base, {}).get("wall_ms")
        if lingc_ms:
            out[name] = r["wall_ms"] / lingc_ms
    return out


def spec_equals_plain(results: dict) -> dict[str, bool]:
    """For each lingc relay run: are its greedy tokens (one uninterrupted run from the same synthetic
    state) the plain lingc run's, over the shorter of the two? Empty without a plain lingc run."""
    plain = results.get("lingc", {}).get("tokens")
    if not plain:
        return {}
    out = {}
    for name, r in results.items():
        toks = r.get("tokens")
        if name.startswith("lingc-nextn") and toks:
            n = min(len(toks), len(plain))
            out[name] = toks[:n] == plain[:n]
    return out


def _json_name(args) -> str:
    return "decode.json" if args.tp == 1 else f"decode_tp{args.tp}.json"


def _weights_label(args, prompt) -> str:
    weights = "checkpoint weights" if args.checkpoint else "random weights"
    if prompt is not None:
        return f"{weights}, a real prompt of {len(prompt)} tokens (the lingc modes' accept lengths are measured)"
    return f"{weights}, synthetic context (accept lengths are not meaningful)"


def _payload(args, bw, floors, results, tp, ar_us, boundary_us=None):
    return {"preset": args.preset, "context": args.context, "pdl_boundary_us": boundary_us,
            "weights": f"checkpoint {args.checkpoint} (bf16)" if args.checkpoint else "random bf16",
            "prompt_ids_file": args.prompt_ids_file,
            "tp": tp.size, "allreduce_graph_us": ar_us,
            "copy_bandwidth_gbps": bw, "floor_ms": floors, "article_accept": ARTICLE_ACCEPT,
            "results": results, "env": environment()}


if __name__ == "__main__":
    raise SystemExit(main())
