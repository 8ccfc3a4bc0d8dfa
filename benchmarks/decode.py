"""Batch-1 decode: eager vs Inductor vs lingc (plain and NEXTN relay), with the floor.

    python -m benchmarks.decode --preset flash-tp4-rank --context 8192 --out OUT
        [--modes eager,eager-nextn,inductor,reduce-overhead,reduce-overhead-pdl,lingc,lingc-nextn]
        [--lingc-inductor 0|1] [--tokens 128] [--profile]
    torchrun --nproc-per-node N -m benchmarks.decode --tp N --preset flash ...   (tensor parallel)

Tensor parallel: `--preset` names the whole model and every rank builds its slice (random
weights, the same slices a checkpoint would give); the ranks run every mode in lockstep and rank 0
reports. The floor is per rank (the bytes one GPU reads), and the all-reduce share of a lingc
step is estimated as (collectives in the step's graphs) x (one decode-sized all-reduce captured
in a CUDA graph, measured in the same run) / step time.

Random bf16 weights (it says so in the output). The context is synthetic: the cache holds
`context` rows of random latents and random KDA states, as after a prefill, and decoding starts
at position `context` (eager MLA scans every cache row, so its cost is that of the full cache
whatever the position; lingc's MLA kernel reads rows up to the position, which is `context`).

Columns (method.md): step time = GPU time of one step (CUDA events, median); wall per step =
wall time of the real generation loop / steps launched (host run-ahead included); host per step
= Python time to launch a step; tokens per step = measured accept length (random weights give
about 1); TPOT = wall per step / tokens per step, and projected at the article's accept length
3.25 for relay rows (a projection, labelled); floor = bytes the step must read / copy bandwidth
measured in the same run, with the routed experts counted from the router's real choices.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch

from lingc.models import Ling3Cache, build_model, preset
from lingc.models.moe import MoE
from lingc.models.parallel import init_from_env

from .common import copy_bandwidth_gbps, environment, event_times_ms, markdown_table, require_cuda, write_json

ALL_MODES = ["eager", "eager-nextn", "inductor", "reduce-overhead", "reduce-overhead-pdl",
             "lingc", "lingc-nextn", "lingc-symm", "lingc-nextn-symm"]   # -symm: allreduce="symm_mem"
ARTICLE_ACCEPT = 3.25
STEPS = 5


def _events_ms(fn, reps, warmup=2):
    return statistics.median(event_times_ms(fn, reps, warmup))


def fill_synthetic(cache: Ling3Cache, seed: int = 1) -> None:
    g = torch.Generator(device=cache.kv[0].device).manual_seed(seed)
    for t in cache.tensors():
        t.normal_(0, 0.3, generator=g)


# -- the floor ------------------------------------------------------------------------------------

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

        self.target_dense = dense(layers[:n]) + dense([model.model.norm, model.lm_head])
        self.draft_dense = dense(layers[n:]) + dense([model.lm_head])
        row = cfg.mla_cache_dim * 2
        self.state_bytes = cfg.num_attention_heads * cfg.head_dim ** 2 * 4 * len(cfg.kda_layers)
        # MLA latent rows up to the position, KDA states read once and written once.
        self.target_cache = len(cfg.mla_layers) * context * row + 2 * self.state_bytes
        self.draft_cache = context * row

    def distinct_experts(self, fn) -> int:
        """Sum over MoE layers of the distinct experts chosen while fn() runs."""
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
        return sum(len(s) for s in seen)

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
    ids = torch.tensor([7], device="cuda")
    pos = torch.tensor([ctx], device="cuda")
    with torch.no_grad():
        ms = _events_ms(lambda: step(ids, pos, cache), reps=5)
    return dict(step_ms=ms, wall_ms=ms, host_ms=None, tokens_per_step=1.0, compile_s=0.0)


def run_eager_nextn(model, cache, ctx, tokens):
    """The reference speculative loop (snapshot + replay, host syncs), from a short prompt in the
    same full-size cache."""
    from lingc.decoding.reference import speculative_generate
    times = []
    last = [time.perf_counter()]

    def on_step(step, c):
        torch.cuda.synchronize()
        now = time.perf_counter()
        times.append(now - last[0])
        last[0] = now
    speculative_generate(model, list(range(3, 19)), 14, steps=STEPS, eos_token_id=None,
                         cache=cache, on_step=on_step)
    wall = statistics.median(times[1:]) * 1e3 if len(times) > 1 else times[0] * 1e3
    return dict(step_ms=None, wall_ms=wall, host_ms=None, tokens_per_step=None, compile_s=0.0)


def run_inductor(model, cache, ctx, tokens, mode):
    step = _step_fn(model)
    kwargs = {}
    if mode == "reduce-overhead":
        kwargs = {"mode": "reduce-overhead"}
    elif mode == "reduce-overhead-pdl":
        kwargs = {"options": {"triton.cudagraphs": True, "triton.enable_pdl": True}}
    torch._dynamo.reset()
    compiled = torch.compile(step, fullgraph=True, dynamic=False, **kwargs)
    ids = torch.tensor([7], device="cuda")
    pos = torch.tensor([ctx], device="cuda")
    t0 = time.perf_counter()
    with torch.no_grad():
        compiled(ids, pos, cache)
        torch.cuda.synchronize()
        compile_s = time.perf_counter() - t0
        ms = _events_ms(lambda: compiled(ids, pos, cache), reps=20, warmup=3)
        t1 = time.perf_counter()
        for _ in range(20):
            compiled(ids, pos, cache)
        torch.cuda.synchronize()
        wall = (time.perf_counter() - t1) / 20 * 1e3
    return dict(step_ms=ms, wall_ms=wall, host_ms=None, tokens_per_step=1.0, compile_s=compile_s)


def run_lingc(model, ctx, tokens, speculative, lingc_inductor, allreduce="nccl", progress=True,
              profile=False):
    from lingc.runtime.relay.engine import Engine
    eng = Engine(model, max_len=ctx + tokens * (STEPS + 1) + 64, steps=STEPS,
                 options={"inductor": bool(lingc_inductor), "allreduce": allreduce}, progress=progress)
    roles = ("draft", "verify", "extend") if speculative else ("decode",)
    t0 = time.perf_counter()
    eng.prepare(roles)
    torch.cuda.synchronize()
    compile_s = time.perf_counter() - t0
    fill_synthetic(eng.cache)
    r = eng.relay
    r.n.fill_(ctx)
    r.x.fill_(7)
    r.seed.fill_(11)
    r.dh.normal_()
    kind = "nextn" if speculative else None
    list(eng.resume(8, kind))                       # warm-up steps (not timed)
    torch.cuda.synchronize()
    t1 = time.perf_counter()
    out = list(eng.resume(tokens, kind))
    torch.cuda.synchronize()
    wall = (time.perf_counter() - t1) / eng.stats.launched * 1e3
    st = eng.stats
    per_graph = {}
    for role in roles:
        per_graph[role] = _events_ms(lambda: eng._steps[role](), reps=20)
    kernels = {role: kernel_profile(eng._steps[role]) for role in roles} if profile else None
    return dict(step_ms=sum(per_graph.values()), wall_ms=wall,
                host_ms=statistics.median(st.host_s) * 1e3,
                tokens_per_step=len(out) / max(1, st.steps), compile_s=compile_s,
                collectives=collectives_per_step(roles),
                per_graph_ms=per_graph, ahead=st.ahead / max(1, st.launched - 1),
                captured={r_: eng._steps[r_].captured for r_ in roles},
                graphs=[i.format() for i in eng.graph_infos()], kernel_profile=kernels)


def kernel_profile(step, replays: int = 5, top: int = 15) -> list[dict]:
    """GPU time per kernel name over one step (torch.profiler around `replays` replays of the
    step's graph): [{kernel, us_per_step, calls_per_step}], the `top` largest. Kernels overlap
    under PDL, so the sum may exceed the step time."""
    from torch.profiler import ProfilerActivity, profile

    step()
    torch.cuda.synchronize()
    try:
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(replays):
                step()
            torch.cuda.synchronize()
    except Exception as e:  # noqa: BLE001  (the timing stands without the breakdown)
        return [{"kernel": f"profiling failed: {type(e).__name__}: {e}"[:200], "us_per_step": 0.0,
                 "calls_per_step": 0.0}]
    rows = []
    for ev in prof.key_averages():
        us = getattr(ev, "device_time_total", None)
        if us is None:
            us = getattr(ev, "cuda_time_total", 0.0)
        if us > 0:
            rows.append({"kernel": ev.key[:80], "us_per_step": us / replays, "calls_per_step": ev.count / replays})
    rows.sort(key=lambda r: -r["us_per_step"])
    return rows[:top]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--preset", default="flash-tp4-rank")
    ap.add_argument("--context", type=int, default=8192)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--modes", default="eager,lingc,lingc-nextn")
    ap.add_argument("--lingc-inductor", type=int, default=1)
    ap.add_argument("--tp", type=int, default=1, help="tensor-parallel size (= torchrun's world size)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--profile", action="store_true",
                    help="lingc modes: also GPU time per kernel name in each graph (torch.profiler)")
    args = ap.parse_args(argv)
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    bad = [m for m in modes if m not in ALL_MODES]
    if bad:
        raise SystemExit(f"unknown mode(s) {bad}; valid: {ALL_MODES}")
    require_cuda()
    tp = init_from_env()
    if tp.size != args.tp:
        raise SystemExit(f"--tp {args.tp} but {tp.size} process(es) are running: launch with "
                         f"torchrun --nproc-per-node {args.tp} -m benchmarks.decode --tp {args.tp} ...")
    lead = tp.rank == 0
    out = Path(args.out)
    bw = copy_bandwidth_gbps()
    full = preset(args.preset, router_dtype="bf16")
    model = build_model(full, device="cuda", dtype=torch.bfloat16, seed=0, progress=lead, tp=tp)
    cfg = model.config
    ctx = args.context
    ar_us = {}
    if tp.enabled:
        ar_us = {"T1": allreduce_graph_us(tp, cfg.hidden_size),
                 "T6": allreduce_graph_us(tp, 6 * cfg.hidden_size)}
        if any(m.endswith("-symm") for m in modes):
            ar_us.update(symm_T1=allreduce_graph_us(tp, cfg.hidden_size, symm=True),
                         symm_T6=allreduce_graph_us(tp, 6 * cfg.hidden_size, symm=True))

    cache = Ling3Cache.allocate(cfg, ctx + 128, device="cuda")
    fill_synthetic(cache)
    floor = Floor(model, ctx)
    ids1, ids6 = torch.tensor([7], device="cuda"), torch.arange(7, 13, device="cuda")
    pos1, pos6 = torch.tensor([ctx], device="cuda"), torch.arange(ctx, ctx + 6, device="cuda")
    h1 = torch.randn(1, cfg.hidden_size, device="cuda", dtype=torch.bfloat16)
    h6 = torch.randn(6, cfg.hidden_size, device="cuda", dtype=torch.bfloat16)
    e_t1 = floor.distinct_experts(lambda: model(ids1, pos1, cache))
    e_t6 = floor.distinct_experts(lambda: model(ids6, pos6, cache))
    e_d1 = floor.distinct_experts(lambda: model.draft(ids1, pos1, h1, cache))
    e_d6 = floor.distinct_experts(lambda: model.draft(ids6, pos6, h6, cache))
    plain_bytes = floor.bytes(1, [], e_t1)
    relay_bytes = floor.bytes(STEPS + 1, [1] * (STEPS - 1) + [STEPS + 1], e_t6 + (STEPS - 1) * e_d1 + e_d6)
    floors = {"plain": plain_bytes / (bw * 1e9) * 1e3, "relay": relay_bytes / (bw * 1e9) * 1e3}
    say = print if lead else (lambda *a, **k: None)
    say(f"copy bandwidth {bw:.0f} GB/s; floor{' per rank' if tp.enabled else ''} plain step "
        f"{floors['plain']:.3f} ms ({plain_bytes / 1e9:.2f} GB), relay step {floors['relay']:.3f} ms "
        f"({relay_bytes / 1e9:.2f} GB)")
    if ar_us:
        say(f"all-reduce in a CUDA graph ({tp.size} ranks), us: " + ", ".join(
            f"{k} {v:.1f}" for k, v in ar_us.items()))

    results = {}
    for mode in modes:
        t0 = time.perf_counter()
        say(f"== {mode}", flush=True)
        try:
            if mode == "eager":
                res = run_eager(model, cache, ctx, args.tokens)
            elif mode == "eager-nextn":
                res = run_eager_nextn(model, cache, ctx, args.tokens)
            elif mode.startswith("inductor") or mode.startswith("reduce"):
                res = run_inductor(model, cache, ctx, args.tokens, mode)
            else:
                res = run_lingc(model, ctx, args.tokens, "nextn" in mode, args.lingc_inductor,
                                "symm_mem" if mode.endswith("-symm") else "nccl", progress=lead,
                                profile=args.profile)
        except Exception as e:  # a failing mode is reported, the others still run
            res = {"error": f"{type(e).__name__}: {e}"}
            print(f"rank {tp.rank}: {mode} failed: {res['error']}", flush=True)
        res["mode_s"] = time.perf_counter() - t0
        relay = "nextn" in mode
        res["floor_ms"] = floors["relay" if relay else "plain"]
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
        results[mode] = res
        if lead:
            write_json(out / _json_name(args), _payload(args, bw, floors, results, tp, ar_us))
    if not lead:
        return 0

    rows = [dict(mode=m, **{k: v for k, v in r.items() if not isinstance(v, (dict, list))})
            for m, r in results.items()]
    split = f", {tp.size}-way tensor parallel (per-rank floor)" if tp.enabled else ""
    print(f"\n{args.preset}{split}, context {ctx}, random weights (accept lengths are not meaningful)\n")
    print(markdown_table(rows, [("mode", "mode", "s"), ("step_ms", "GPU step ms", ".3f"),
                                ("wall_ms", "wall/step ms", ".3f"), ("host_ms", "host/step ms", ".3f"),
                                ("tokens_per_step", "tokens/step", ".2f"), ("tpot_ms", "TPOT ms", ".3f"),
                                ("tok_s", "tok/s", ".1f"), ("floor_ms", "floor ms", ".3f"),
                                ("x_floor", "x floor", ".2f"),
                                ("tpot_projected_ms", "TPOT @3.25 (proj.) ms", ".3f"),
                                ("compile_s", "compile+capture s", ".1f"),
                                ("allreduce_share", "all-reduce share (est.)", ".0%")]))
    for m, r in results.items():
        if "per_graph_ms" in r:
            print(f"{m}: per graph ms {r['per_graph_ms']}; launch ahead {r.get('ahead', 0):.0%}; "
                  f"captured {r['captured']}")
            for g in r.get("graphs", []):
                print("   ", g)
        for role, rows in (r.get("kernel_profile") or {}).items():
            print(f"{m} {role}: GPU us per step by kernel (PDL overlaps them)")
            for k in rows:
                print(f"    {k['us_per_step']:9.1f} us  {k['calls_per_step']:6.1f} calls  {k['kernel']}")
    return 0


def _json_name(args) -> str:
    return "decode.json" if args.tp == 1 else f"decode_tp{args.tp}.json"


def _payload(args, bw, floors, results, tp, ar_us):
    return {"preset": args.preset, "context": args.context, "weights": "random bf16",
            "tp": tp.size, "allreduce_graph_us": ar_us,
            "copy_bandwidth_gbps": bw, "floor_ms": floors, "article_accept": ARTICLE_ACCEPT,
            "results": results, "env": environment()}


if __name__ == "__main__":
    raise SystemExit(main())
