"""Prefill on one GPU: time to first token of an N-token prompt, where it goes, and its floor.

    python -m benchmarks.prefill --preset flash-tp4-rank --tokens 1024 8192 --out DIR
    torchrun --nproc-per-node N -m benchmarks.prefill --tp N --preset flash ...   (tensor parallel)
        [--moe grouped grouped-library gather] [--mla expanded-bf16 expanded tensor-cores fp32]
        [--chunk 256 1024] [--reps 3] [--no-draft] [--op-calls direct dispatcher]
        [--graphs captured eager] [--profile N] [--profile-captured N] [--host-profile N]

What is timed is what `lingc.generate` runs before its first decode step (runtime/relay/engine.py,
`Engine._prefill`): the target's eager forward over the prompt in chunks of `--chunk` tokens
(`lingc.decoding.reference.greedy_prompt_prefill`: KDA's chunked recurrence on `lingc::kda_prefill`, MLA over
the cache, the MoE), the first token's argmax, and for the relay the NEXTN draft's prefill over
the same positions (`draft_prefill`; `--no-draft` leaves it out). Random bf16 weights, random
prompt ids, the cache zeroed before each run. CUDA events, one warm-up run per setting, the
median of `--reps` runs.

`--mla expanded-bf16 expanded tensor-cores fp32` compares MLA's prefill forms
(lingc.models.mla.PREFILL_FORMS): the cache expanded through kv_b_proj into one fused causal SDPA
per chunk, in bf16 on flash attention (the default on CUDA for a bf16 cache) or in fp32,
the absorbed blocks on bf16 tensor cores, and the absorbed blocks as fp32 einsums. `--moe` names
the MoE's forms to compare in the same run: `grouped` (the default, and the model's for prefill
chunks on CUDA: the pairs sorted by expert, each chosen expert read once per chunk, on
`lingc::moe_grouped`'s two GEMM kernels), `grouped-library` (the same grouping on an index_select
gather and two `torch._grouped_mm`, GROUPED_GEMM "library") and `gather` (the decode formulation
for every chunk: one gathered expert per (token, slot) pair, MOE_CHUNK tokens at a time; what
prefill ran before the grouped form, ~15 s for 8192 tokens: opt in with `--moe grouped gather`).

Breakdown: one more run with CUDA events around every layer's attention and MLP and the draft
layer (forward hooks), summed per kind (KDA attention, MLA attention, MoE, dense MLP, draft
layer); "rest" is that run's remainder (the embedding, norms, lm_head rows, host gaps). Where the
host cannot keep the GPU busy (eager), a span is the host's time to issue it.

`--graphs captured eager` (both by default) compares the two ways `Engine._prefill` runs a prompt:
`captured`, one replay of the CUDA graph of the prompt's bucket (runtime/relay/prefill_graphs.py:
the chunk padded to the bucket, which for the default power-of-two prompt sizes is the prompt
itself; its capture time is reported, and the per-kind breakdown is empty: a replay has no
module hooks), and `eager`, the model's chunks. Prompts longer than the largest bucket have no
captured row.

`--op-calls direct dispatcher` compares how the model's eager lingc op calls run: `direct` (the
default: `register_op`'s EagerOp calls the implementation) and `dispatcher` (every call through
the custom-op dispatcher, as before session 39), in the same process.

Host: one more run timed on the host says how long the host took to issue the prefill (until the
call returned) against the whole run (issue close to the whole: the host is the bottleneck, and
GPU time saved does not shorten the prefill), and one run under
`torch.cuda.set_sync_debug_mode("warn")` counts the synchronising calls by call site (each makes
the host wait for the GPU, which then idles while the host issues what follows).

`--profile N` then runs one N-token prefill (the default MoE form) under torch.profiler: the
busiest ops by GPU and by host time on stdout, the GPU's busy share, the GPU time by kind (the
breakdown's kinds, as profiler ranges) with each kind's busiest ops, and a gzipped Chrome trace
OUT/prefill_trace.json.gz. `--profile-captured N` profiles one replay of the captured prefill
of an N-token prompt: its kernels by GPU time (no kinds: a replay runs no module hooks) and
OUT/prefill_captured_trace.json.gz.

Floor: the larger of (a) the target's parameters read once over the copy bandwidth and (b) the
prompt's matmul FLOPs over the bf16 matmul throughput, both measured in the same run. FLOPs:
2 x N x (every target parameter a token multiplies: attention projections, dense MLPs, the shared
expert and its 8 routed experts; the embedding and lm_head excluded) + MLA's causal attention in
the cheaper of its two forms per (query, earlier key) pair: 2 x heads x min(rank + rope + rank,
the latent; qk_nope + qk_rope + v, expanded), the expansion itself left out. KDA's recurrence and
the draft are left out too, so the floor is a lower bound.

Agreement: every setting's first token, and its target logits at the last position against the
first setting's (relative L2, max abs) beside its top-2 logit margin, from one more prefill. With
random weights many first tokens are near ties, so forms that agree to fp32 rounding can still
pick different first tokens; the logits say whether they agree.

`--tp N` under torchrun splits the model N ways (lingc.models.parallel): each rank prefills its
shard with the all-reduces and the vocabulary gather between them, captured or eager as above.
Rank 0 reports; the floor is one rank's (its weights and FLOPs). `--profile` and
`--host-profile` are single-GPU only.

Output: a markdown table on stdout, OUT/prefill.json (OUT/prefill_tpN.json with --tp N).
"""

from __future__ import annotations

import argparse
import itertools
import statistics
from pathlib import Path

import torch
from torch.autograd import DeviceType

from lingc.decoding.reference import PREFILL_CHUNK, greedy_prompt_prefill, prefill
from lingc.models import Ling3Cache, build_model, preset
from lingc.models import mla as mla_module
from lingc.models import moe as moe_module
from lingc.models.kda import KDAAttention
from lingc.models.mla import MLAAttention
from lingc.models.moe import MoE
from lingc.models.parallel import init_from_env
from lingc.runtime import registry
from lingc.runtime.relay.prefill_graphs import PrefillGraphs

from .common import copy_bandwidth_gbps, environment, event_times_ms, markdown_table, require_cuda, write_json

MOE_FORMS = ("grouped", "grouped-library", "gather")
MLA_FORMS = mla_module.PREFILL_FORMS
OP_CALLS = ("direct", "dispatcher")
GRAPHS = ("captured", "eager")


def matmul_tflops(n: int = 8192, reps: int = 10) -> float:
    """bf16 matmul throughput of an n x n x n product (TFLOP/s, median of reps)."""
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    times = event_times_ms(lambda: a @ b, reps, warmup=3)
    return 2 * n ** 3 / (statistics.median(times) * 1e-3) / 1e12


def prompt_flops(model, n: int) -> float:
    """Matmul FLOPs of the target over an n-token prompt (module docstring, "Floor")."""
    cfg = model.config
    per_token, per_pair = 0, 0.0
    for layer in model.target_layers:
        for name, p in layer.named_parameters():
            if ".experts." in f".{name}":
                continue                                   # routed experts: 8 per token below
            if p.dim() >= 2:                               # projections, router, shared expert
                per_token += p.numel()
        if isinstance(layer.mlp, MoE):
            e = layer.mlp.experts
            per_token += cfg.num_experts_per_tok * (e.w13[0].numel() + e.w2[0].numel())
        if isinstance(layer.attention, MLAAttention):
            a = layer.attention
            per_pair += 2.0 * a.num_heads * min(a.rank + a.rope + a.rank, a.nope + a.rope + a.vdim)
    return 2.0 * n * per_token + per_pair * n * (n + 1) / 2     # (query, key) pairs of causal attention


def target_bytes(model) -> int:
    return sum(p.numel() * p.element_size() for layer in model.target_layers for p in layer.parameters())


def kind_modules(model) -> list[tuple[torch.nn.Module, str]]:
    """Every layer's attention and MLP, and the draft layer, with the kind they are summed under."""
    mods = []
    for layer in model.target_layers:
        att = "KDA attention" if isinstance(layer.attention, KDAAttention) else "MLA attention"
        mods += [(layer.attention, att), (layer.mlp, "MoE" if isinstance(layer.mlp, MoE) else "dense MLP")]
    if model.nextn is not None:
        mods.append((model.nextn, "draft layer"))
    return mods


class KindTimer:
    """CUDA events around every layer's attention and MLP, summed per kind after a run."""

    def __init__(self, model):
        self.spans: list[tuple[str, torch.cuda.Event, torch.cuda.Event]] = []
        self.handles = []
        for mod, kind in kind_modules(model):
            self.handles.append(mod.register_forward_pre_hook(self._pre(kind)))
            self.handles.append(mod.register_forward_hook(self._post()))

    def _pre(self, kind):
        def hook(mod, args):
            s = torch.cuda.Event(enable_timing=True)
            s.record()
            self.spans.append((kind, s, None))
        return hook

    def _post(self):
        def hook(mod, args, out):
            e = torch.cuda.Event(enable_timing=True)
            e.record()
            kind, s, _ = self.spans[-1]
            self.spans[-1] = (kind, s, e)
        return hook

    def totals_ms(self) -> dict[str, float]:
        torch.cuda.synchronize()
        out: dict[str, float] = {}
        for kind, s, e in self.spans:
            out[kind] = out.get(kind, 0.0) + s.elapsed_time(e)
        return out

    def remove(self):
        for h in self.handles:
            h.remove()


KIND_RANGE = "kind: "


class KindRanges:
    """A profiler range (record_function) named KIND_RANGE + kind around every module of
    kind_modules, so a profile's GPU time can be split by kind and op (`gpu_ms_by_kind`)."""

    def __init__(self, model):
        self.open: list = []
        self.handles = []
        for mod, kind in kind_modules(model):
            self.handles.append(mod.register_forward_pre_hook(self._pre(kind)))
            self.handles.append(mod.register_forward_hook(self._post))

    def _pre(self, kind):
        def hook(mod, args):
            rf = torch.profiler.record_function(KIND_RANGE + kind)
            rf.__enter__()
            self.open.append(rf)
        return hook

    def _post(self, mod, args, out):
        self.open.pop().__exit__(None, None, None)

    def remove(self):
        for h in self.handles:
            h.remove()


def gpu_ms_by_kind(events, gpu_key: str) -> dict[str, dict[str, float]]:
    """{kind: {op: GPU ms}} of a profile's host ops: each op's own GPU time (its kernels) under
    the innermost KindRanges range around it ("rest" outside every range)."""
    out: dict[str, dict[str, float]] = {}
    for e in events:
        us = getattr(e, gpu_key, 0.0)
        # Host ops only: a kernel's own event carries its time too, and so does a range's.
        if us <= 0 or e.device_type != DeviceType.CPU or e.name.startswith(KIND_RANGE):
            continue
        kind, p = "rest", e.cpu_parent
        while p is not None:
            if p.name.startswith(KIND_RANGE):
                kind = p.name[len(KIND_RANGE):]
                break
            p = p.cpu_parent
        ops = out.setdefault(kind, {})
        ops[e.name] = ops.get(e.name, 0.0) + us / 1e3
    return out


def print_by_kind(by_kind: dict[str, dict[str, float]], top: int = 8) -> None:
    """Per kind: its GPU ms and its busiest ops."""
    for kind, ops in sorted(by_kind.items(), key=lambda kv: -sum(kv[1].values())):
        busiest = sorted(ops.items(), key=lambda kv: -kv[1])[:top]
        print(f"  {kind:<14} {sum(ops.values()):8.1f} ms GPU: " + ", ".join(f"{op} {ms:.1f}" for op, ms in busiest))


def _zero(cache) -> None:
    for t in cache.tensors():
        t.zero_()


def run_prefill(model, cache, ids: torch.Tensor, chunk: int, draft: bool) -> torch.Tensor:
    """What Engine._prefill runs (`greedy_prompt_prefill`) on a zeroed cache. Returns the token."""
    _zero(cache)
    return greedy_prompt_prefill(model, cache, ids, draft and model.nextn is not None, chunk=chunk)[0]


def host_report(fn) -> dict:
    """One run of fn timed on the host: how long the host took to issue it (until fn returned,
    before any wait) against the whole run, and the run's synchronising CUDA calls (each one makes
    the host wait for the GPU, so the GPU idles while the host issues what follows), counted by
    their innermost call site outside torch (torch.cuda.set_sync_debug_mode's warnings)."""
    import collections
    import time
    import traceback
    import warnings

    torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn()
    issue = time.perf_counter() - t0
    torch.cuda.synchronize()
    wall = time.perf_counter() - t0
    sites = collections.Counter()

    def record(message, category, filename, lineno, file=None, line=None):
        for frame in reversed(traceback.extract_stack()[:-1]):
            if "/torch/" not in frame.filename and not frame.filename.endswith("warnings.py"):
                sites[f"{Path(frame.filename).name}:{frame.lineno} {frame.name}"] += 1
                break

    with warnings.catch_warnings():
        warnings.simplefilter("always")
        shown, warnings.showwarning = warnings.showwarning, record
        torch.cuda.set_sync_debug_mode("warn")
        try:
            fn()
        finally:
            torch.cuda.set_sync_debug_mode(0)
            warnings.showwarning = shown
    torch.cuda.synchronize()
    return {"host_issue_ms": issue * 1e3, "host_wall_ms": wall * 1e3, "syncs": sum(sites.values()),
            "sync_sites": dict(sites.most_common())}


def host_profile(fn, out: Path, top: int = 45) -> None:
    """cProfile of one run of fn after a warm one: where the host's time goes (Python, op
    dispatch, kernel launches), the top functions by own time and by cumulative time on stdout,
    the stats in OUT/prefill_host.pstats."""
    import cProfile
    import pstats

    with torch.no_grad():
        fn()
        torch.cuda.synchronize()
        prof = cProfile.Profile()
        prof.enable()
        fn()
        torch.cuda.synchronize()
        prof.disable()
    prof.dump_stats(out / "prefill_host.pstats")
    stats = pstats.Stats(prof).strip_dirs()
    for key in ("tottime", "cumulative"):
        print(f"\nhost profile, top {top} by {key}:")
        stats.sort_stats(key).print_stats(top)


def profile_prefill(fn, out: Path, model=None, trace: str = "prefill_trace") -> dict:
    """One run of fn under torch.profiler: op tables on stdout (with a model, also GPU time by
    kind and op), the trace gzipped into out as TRACE.json.gz."""
    import gzip
    import shutil

    from torch.profiler import ProfilerActivity, profile

    with torch.no_grad():
        fn()                                                   # warm
        torch.cuda.synchronize()
        ranges = KindRanges(model) if model is not None else None
        try:
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                wall = event_times_ms(fn, 1)[0]
        finally:
            if ranges is not None:
                ranges.remove()
    avg = prof.key_averages()
    gpu_key = "self_device_time_total" if hasattr(avg[0], "self_device_time_total") else "self_cuda_time_total"
    # Busy = the kernels' own time (host ops' GPU time repeats it, and so do the ranges').
    busy_ms = sum(getattr(e, gpu_key) for e in prof.events()
                  if e.device_type != DeviceType.CPU and not e.name.startswith(KIND_RANGE)) / 1e3
    print(avg.table(sort_by=gpu_key, row_limit=25))
    print(avg.table(sort_by="self_cpu_time_total", row_limit=25))
    print(f"profiled prefill: {wall:.1f} ms wall, GPU busy {busy_ms:.1f} ms ({100 * busy_ms / wall:.0f}%)")
    by_kind = gpu_ms_by_kind(prof.events(), gpu_key) if model is not None else {}
    if by_kind:
        print("GPU time by kind (the profiled run) and its busiest ops:")
        print_by_kind(by_kind)
    raw = out / f"{trace}.json"
    prof.export_chrome_trace(str(raw))
    with open(raw, "rb") as src, gzip.open(str(raw) + ".gz", "wb") as dst:
        shutil.copyfileobj(src, dst)
    raw.unlink()
    top = sorted(avg, key=lambda e: -getattr(e, gpu_key))[:25]
    return {"wall_ms": wall, "gpu_busy_ms": busy_ms,
            "gpu_ms_by_kind": {k: {op: round(ms, 3) for op, ms in sorted(ops.items(), key=lambda kv: -kv[1])[:20]}
                               for k, ops in by_kind.items()},
            "top_gpu": [{"op": e.key, "count": e.count, "gpu_ms": getattr(e, gpu_key) / 1e3,
                         "cpu_ms": e.self_cpu_time_total / 1e3} for e in top]}


def prompt_logits(model, cache, ids: torch.Tensor, chunk: int) -> torch.Tensor:
    """The target's last-position logits after a prefill of ids on a zeroed cache (fp32, CPU)."""
    _zero(cache)
    return prefill(model, cache, ids, chunk=chunk)[0].float().cpu()


def logit_agreement(logits: torch.Tensor, ref: torch.Tensor) -> dict:
    """How far a setting's first-token logits are from the first setting's (relative L2), beside
    the gap between its two largest logits: a first token that differs by less than the
    rounding's reach is a near tie (random weights give many), not a wrong form."""
    top2 = logits.topk(2).values
    return {"logits_rel_diff": ((logits - ref).norm() / ref.norm()).item(),
            "top2_margin": (top2[0] - top2[1]).item(), "max_abs_logit_diff": (logits - ref).abs().max().item()}


def captured_prefill(model, cache, ids: torch.Tensor, draft: bool):
    """(a function that runs the captured prefill of ids on a zeroed cache and returns its first
    token, the target's logits of one run, the capture's seconds), or None when ids is longer than
    every bucket."""
    import time

    graphs = PrefillGraphs(model, cache, draft and model.nextn is not None, progress=False)   # the engine's buckets
    rows = graphs.bucket_for(ids.numel())
    if rows is None:
        return None
    t0 = time.perf_counter()
    graphs.prepare((rows,))
    torch.cuda.synchronize()
    capture_s = time.perf_counter() - t0

    def fn():
        _zero(cache)
        return graphs(ids).first

    _zero(cache)
    return fn, graphs(ids).logits.float().cpu(), capture_s


def measure(model, cache, ids, chunk: int, form: str, mla: str, reps: int, draft: bool, op_calls: str = "direct",
            graphs: str = "eager"):
    """(median ms, the hooked run's ms, its per-kind ms, the first token, the target's logits,
    `host_report`) of a prefill of ids with the MoE in `form` and MLA's prefill in `mla`, by eager
    chunks or (graphs "captured") a graph replay; None when ids has no captured bucket."""
    default_min, default_form = moe_module.GROUPED_MIN_TOKENS, mla_module.PREFILL_FORM
    default_gemm, default_calls = moe_module.GROUPED_GEMM, registry.DIRECT_CALLS
    registry.DIRECT_CALLS = op_calls == "direct"
    moe_module.GROUPED_MIN_TOKENS = default_min if form.startswith("grouped") else 1 << 62
    moe_module.GROUPED_GEMM = "library" if form == "grouped-library" else "lingc"
    mla_module.PREFILL_FORM = mla
    try:
        with torch.no_grad():
            capture_s = None
            if graphs == "captured":
                got = captured_prefill(model, cache, ids, draft)
                if got is None:
                    return None
                fn, logits, capture_s = got
            else:
                fn = lambda: run_prefill(model, cache, ids, chunk, draft)  # noqa: E731
            first = int(fn())                                          # warm-up
            times = event_times_ms(fn, reps)
            ms = statistics.median(times)
            timer = KindTimer(model)
            try:
                hooked_ms = event_times_ms(fn, 1)[0]
                kinds = timer.totals_ms()
            finally:
                timer.remove()
            if graphs != "captured":
                logits = prompt_logits(model, cache, ids, chunk)
            host = host_report(fn)
            host["capture_s"] = capture_s
            del fn
            torch.cuda.empty_cache()
    finally:
        moe_module.GROUPED_MIN_TOKENS = default_min
        moe_module.GROUPED_GEMM = default_gemm
        registry.DIRECT_CALLS = default_calls
        mla_module.PREFILL_FORM = default_form
    host["ttft_min_ms"] = min(times)     # the host's noise is one-sided: the fastest run beside the median
    return ms, hooked_ms, kinds, first, logits, host


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--preset", default="flash-tp4-rank")
    ap.add_argument("--tokens", type=int, nargs="+", default=[1024, 8192])
    ap.add_argument("--moe", nargs="+", choices=MOE_FORMS, default=[MOE_FORMS[0]],
                    help="MoE forms to compare (default: grouped only; gather takes ~15 s per 8192 tokens)")
    ap.add_argument("--mla", nargs="+", choices=MLA_FORMS, default=[MLA_FORMS[0]],
                    help="MLA's prefill forms to compare (the first is CUDA's default)")
    ap.add_argument("--chunk", type=int, nargs="+", default=[PREFILL_CHUNK],
                    help="prefill chunks (tokens per forward) to compare")
    ap.add_argument("--op-calls", nargs="+", choices=OP_CALLS, default=[OP_CALLS[0]],
                    help="how eager lingc op calls run, compared in one process (default: direct)")
    ap.add_argument("--graphs", nargs="+", choices=GRAPHS, default=list(GRAPHS),
                    help="captured (one CUDA-graph replay per prompt, as the engine runs it) and/or eager chunks")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--no-draft", action="store_true", help="leave the NEXTN draft's prefill out")
    ap.add_argument("--profile", type=int, default=0, metavar="N",
                    help="profile one N-token prefill with torch.profiler (tables and a Chrome trace)")
    ap.add_argument("--profile-captured", type=int, default=0, metavar="N",
                    help="profile one replay of the captured prefill of N tokens (its kernels by GPU time, "
                         "OUT/prefill_captured_trace.json.gz)")
    ap.add_argument("--host-profile", type=int, default=0, metavar="N",
                    help="profile the host side of one N-token prefill with cProfile (top functions on stdout, "
                         "OUT/prefill_host.pstats)")
    ap.add_argument("--tp", type=int, default=1, help="tensor-parallel size (= torchrun's world size)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    if min(args.chunk) < 1 or min(args.tokens) < 1 or args.reps < 1:
        raise SystemExit(f"--chunk {args.chunk}, --tokens {args.tokens}, --reps {args.reps}: all must be >= 1")
    if args.tp > 1 and (args.profile or args.host_profile or args.profile_captured):
        raise SystemExit("--profile, --profile-captured and --host-profile profile one GPU: leave them out "
                         "with --tp > 1")
    tp = init_from_env()
    if tp.size != args.tp:
        raise SystemExit(f"--tp {args.tp} but {tp.size} process(es) are running: launch with "
                         f"torchrun --nproc-per-node {args.tp} -m benchmarks.prefill --tp {args.tp} ...")
    require_cuda()
    lead = tp.rank == 0
    say = print if lead else (lambda *a, **k: None)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    bw = copy_bandwidth_gbps()
    tflops = matmul_tflops()
    cfg = preset(args.preset, router_dtype="bf16")
    if max(args.tokens) + 1 > cfg.max_position_embeddings:
        raise SystemExit(f"--tokens {max(args.tokens)}: the preset's positions end at {cfg.max_position_embeddings}")
    model = build_model(cfg, device="cuda", dtype=torch.bfloat16, seed=0, progress=lead, tp=tp)
    cache = Ling3Cache.allocate(model.config, max(args.tokens) + 8, device="cuda")
    nbytes = target_bytes(model)
    gen = torch.Generator().manual_seed(1)            # on the host: every rank draws the same prompt
    split = f" per rank ({tp.size}-way tensor parallel)" if tp.enabled else ""
    say(f"copy bandwidth {bw:.0f} GB/s, bf16 matmul {tflops:.0f} TFLOP/s, target weights {nbytes / 1e9:.1f} GB"
        f"{split}", flush=True)

    rows, firsts, ref_logits = [], {}, {}
    for n in args.tokens:
        ids = torch.randint(0, model.config.vocab_size, (n,), generator=gen).cuda()
        flops = prompt_flops(model, n)
        floor_ms = max(nbytes / (bw * 1e9), flops / (tflops * 1e12)) * 1e3
        for graphs, chunk, form, mla, calls in itertools.product(args.graphs, args.chunk, args.moe, args.mla,
                                                                 args.op_calls):
            got = measure(model, cache, ids, chunk, form, mla, args.reps, not args.no_draft, calls, graphs)
            if got is None:
                say(f"  {n} tokens: longer than the largest prefill bucket, no captured row", flush=True)
                continue
            ms, hooked_ms, kinds, first, logits, host = got
            firsts[(n, graphs, chunk, form, mla, calls)] = first
            ref_logits.setdefault(n, logits)
            row = {"tokens": n, "graphs": graphs, "chunk": chunk, "moe": form, "mla": mla, "op_calls": calls,
                   "ttft_ms": ms,
                   "tokens_per_s": n / (ms * 1e-3),
                   "floor_ms": floor_ms, "x_floor": ms / floor_ms, "first_token": first,
                   "kinds_ms": {k: round(v, 3) for k, v in sorted(kinds.items())},
                   "hooked_run_ms": hooked_ms, "rest_ms": max(0.0, hooked_ms - sum(kinds.values())),
                   **host, **logit_agreement(logits, ref_logits[n])}
            rows.append(row)
            say(f"  {n} tokens, {graphs}, chunk {chunk}, MoE {form}, MLA {mla}, op calls {calls}: {ms:.1f} ms "
                  f"({row['tokens_per_s']:.0f} tok/s), "
                  + ", ".join(f"{k} {v:.1f}" for k, v in sorted(kinds.items())), flush=True)
            captured = "" if host["capture_s"] is None else f"captured in {host['capture_s']:.2f} s; "
            say(f"    {captured}fastest of {args.reps}: {host['ttft_min_ms']:.1f} ms; host: issued in "
                  f"{host['host_issue_ms']:.1f} of {host['host_wall_ms']:.1f} ms, {host['syncs']} synchronising calls: "
                  + ", ".join(f"{k} x{v}" for k, v in host["sync_sites"].items()), flush=True)

    same = {n: len({v for key, v in firsts.items() if key[0] == n}) == 1 for n in args.tokens}
    cols = [("tokens", "prompt tokens", "d"), ("graphs", "prefill", "s"), ("chunk", "chunk", "d"),
            ("moe", "MoE form", "s"), ("mla", "MLA", "s"), ("op_calls", "op calls", "s"),
            ("ttft_ms", "TTFT ms", ".1f"), ("ttft_min_ms", "fastest ms", ".1f"), ("tokens_per_s", "tokens/s", ".0f"),
            ("floor_ms", "floor ms", ".1f"),
            ("x_floor", "x floor", ".1f"), ("host_issue_ms", "host issue ms", ".1f"), ("syncs", "syncs", "d")]
    kinds_all = sorted({k for r in rows for k in r["kinds_ms"]})
    table_rows = []
    for r in rows:
        t = dict(r)
        for k in kinds_all:
            t[k] = r["kinds_ms"].get(k, 0.0)
        table_rows.append(t)
    cols += [(k, f"{k} ms", ".1f") for k in kinds_all] + [("rest_ms", "rest ms", ".1f")]
    table = markdown_table(table_rows, cols)
    say()
    say(table)
    say(f"\nfirst token equal across the forms and chunks: {same}")
    for r in rows:
        say(f"  {r['tokens']} tokens, {r['graphs']}, MoE {r['moe']}, MLA {r['mla']}, chunk {r['chunk']}: first token "
              f"{r['first_token']}, top-2 logit margin {r['top2_margin']:.3g}, logits vs the first setting: "
              f"rel {r['logits_rel_diff']:.2e}, max abs {r['max_abs_logit_diff']:.3g}")
    prof_summary = None
    if args.profile:
        ids = torch.randint(0, model.config.vocab_size, (args.profile,), generator=gen).cuda()
        prof_summary = profile_prefill(lambda: run_prefill(model, cache, ids, args.chunk[0], not args.no_draft), out,
                                       model)
    captured_summary = None
    if args.profile_captured:
        ids = torch.randint(0, model.config.vocab_size, (args.profile_captured,), generator=gen).cuda()
        got = captured_prefill(model, cache, ids, not args.no_draft)
        if got is None:
            raise SystemExit(f"--profile-captured {args.profile_captured}: longer than the largest prefill bucket")
        captured_summary = profile_prefill(got[0], out, None, trace="prefill_captured_trace")
    if args.host_profile:
        ids = torch.randint(0, model.config.vocab_size, (args.host_profile,), generator=gen).cuda()
        host_profile(lambda: run_prefill(model, cache, ids, args.chunk[0], not args.no_draft), out)
    if not lead:
        return 0
    write_json(out / ("prefill.json" if tp.size == 1 else f"prefill_tp{tp.size}.json"), {
        "preset": args.preset, "tp": tp.size, "chunks": args.chunk, "draft": not args.no_draft, "copy_bw_gbps": bw,
        "matmul_tflops": tflops, "target_bytes": nbytes, "rows": rows, "first_token_equal": same,
        "profile": prof_summary, "profile_captured": captured_summary, "environment": environment()})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
