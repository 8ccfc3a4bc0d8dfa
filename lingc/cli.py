"""`python -m lingc ...`: the main job (`run`) and the compiler's window (`explain`).

    python -m lingc run --preset tiny         build, compile the step graphs with lingc, generate
                                              (plain and NEXTN relay), compare with eager
    python -m lingc explain --preset tiny --t 6   pass summary and kernel table, no benchmark
    python -m lingc explain --role extend         the same for one step graph of the NEXTN relay
    python -m lingc run --checkpoint DIR --prompt-ids 1,2,3   a Ling-3 HF checkpoint instead of a
                                              preset's random weights (both commands take it)
"""

from __future__ import annotations

import builtins
import argparse
import sys
import time

import torch

from .models import Ling3Cache, PRESETS, build_model, preset
from .runtime.relay.engine import MAX_STEPS


def _device(name: str | None) -> torch.device:
    """--device as a torch.device, or a message naming what is wrong with it."""
    if not name:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(name)
    except RuntimeError:
        raise SystemExit(f"--device {name}: not a device; use cpu or cuda (cuda:N for one GPU)") from None
    if dev.type == "meta":
        # The passes check what they match on real values (region probes, the router's selection
        # against its reference), which meta tensors do not have.
        raise SystemExit("--device meta: lingc compiles with real tensors (its passes check their "
                         "matches on real values); use cpu or cuda")
    if dev.type not in ("cpu", "cuda"):
        raise SystemExit(f"--device {name}: lingc runs on cpu or cuda")
    if dev.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise SystemExit(f"--device {name}: this machine has no CUDA GPU (or this torch build has "
                             f"no CUDA); use cpu")
        if dev.index is not None and dev.index >= count:
            raise SystemExit(f"--device {name}: this machine has {count} CUDA GPU(s), cuda:0 to cuda:{count - 1}")
    return dev


def source_label(preset_name: str | None, checkpoint: str | None) -> str:
    """What the model is built from, after checking that --preset and --checkpoint do not clash."""
    if checkpoint and preset_name:
        raise SystemExit(f"--preset {preset_name} and --checkpoint {checkpoint}: the checkpoint's "
                         "config.json describes the model; give one of the two")
    return f"checkpoint {checkpoint}" if checkpoint else f"{preset_name or 'tiny'} with random weights"


def load_checkpoint(path: str, **kwargs):
    """Ling3ForCausalLM.from_pretrained(path, **kwargs), a bad checkpoint as a message (the
    CheckpointError names the directory, the keys and the fix) rather than a traceback."""
    from .models import Ling3ForCausalLM
    from .models.checkpoint import CheckpointError
    try:
        return Ling3ForCausalLM.from_pretrained(path, **kwargs)
    except CheckpointError as e:
        raise SystemExit(f"lingc: cannot load --checkpoint: {e}") from None


def _model(args: argparse.Namespace, dev: torch.device, tp=None, progress: bool = True):
    """The checkpoint's weights with --checkpoint, else the preset's random ones (seed --seed)."""
    from .models.parallel import SINGLE

    tp = tp if tp is not None else SINGLE
    if args.checkpoint:
        return load_checkpoint(args.checkpoint, device=dev, progress=progress, tp=tp)
    return build_model(preset(args.preset or "tiny"), device=dev, seed=getattr(args, "seed", 0),
                       progress=progress, tp=tp)


def parse_token_ids(text: str, what: str) -> list[int]:
    """Token ids written as text, separated by commas or whitespace (lingc has no tokenizer);
    `what` names the source in the error (an option, a file)."""
    try:
        ids = [int(v) for v in text.replace(",", " ").split()]
    except ValueError as e:
        raise SystemExit(f"{what}: want token ids separated by commas or whitespace, e.g. 1,2,3 ({e})") from None
    if not ids:
        raise SystemExit(f"{what}: no token ids given")
    return ids


def check_vocabulary(ids: list[int], vocab_size: int, what: str) -> list[int]:
    bad = [i for i in ids if not 0 <= i < vocab_size]
    if bad:
        raise SystemExit(f"{what}: ids {bad[:5]} are outside the vocabulary [0, {vocab_size})")
    return ids


def _prompt(args: argparse.Namespace, vocab_size: int) -> list[int]:
    """--prompt-ids, checked against the vocabulary; else --prompt-len random ids."""
    if args.prompt_ids is None:
        gen = torch.Generator().manual_seed(args.seed)
        return torch.randint(0, vocab_size, (args.prompt_len,), generator=gen).tolist()
    what = f"--prompt-ids {args.prompt_ids!r}"
    return check_vocabulary(parse_token_ids(args.prompt_ids, what), vocab_size, what)


def relay_margin(steps: int) -> int:
    """Cache rows the relay may write past the last emitted token: one verify chain of drafts
    and its bonus token, twice (a step is launched before the previous one's verdict)."""
    return 2 * (steps + 1)


def check_context(prompt_len: int, new_tokens: int, steps: int, max_positions: int) -> None:
    """Refuse, before any work, a run whose cache would pass the model's positions."""
    rows = prompt_len + new_tokens + relay_margin(steps)
    if rows > max_positions:
        room = max_positions - prompt_len - relay_margin(steps)
        fix = f"at most --new-tokens {room} with this prompt" if room > 0 else "a shorter prompt"
        raise SystemExit(f"prompt {prompt_len} + --new-tokens {new_tokens} + the relay's {relay_margin(steps)} "
                         f"rows ahead (--steps {steps}) = {rows} cache rows, more than the model's "
                         f"max_position_embeddings {max_positions}: use {fix}")


def _checked(convert, ok, want: str):
    """argparse type: `convert(text)` where `ok` holds of it, else an error saying `want`."""
    def parse(text: str):
        try:
            v = convert(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"want {want}, got {text!r}") from None
        if not ok(v):
            raise argparse.ArgumentTypeError(f"want {want}, got {text}")
        return v
    return parse


def _int_at_least(lo: int):
    """argparse type: an integer >= lo."""
    return _checked(int, lambda v: v >= lo, f"an integer >= {lo}")


_non_negative_float = _checked(float, lambda v: 0 <= v < float("inf"), "a finite number >= 0")
top_p_arg = _checked(float, lambda v: 0 < v <= 1, "a number in (0, 1]")   # argparse type (also benchmarks)


def compile_step(model, role: str = "decode", **options):
    """The model's forward compiled with lingc as one static-shape graph per T."""
    return torch.compile(model, backend="lingc", fullgraph=True, dynamic=False,
                         options={"role": role, **options})


RELAY_ROLES = ("decode-step", "draft", "verify-step", "extend")


def cmd_explain(args: argparse.Namespace) -> int:
    from .backend import compile_reports

    dev = _device(args.device)
    name = source_label(args.preset, args.checkpoint)
    model = _model(args, dev, progress=False)
    cfg = model.config
    ahead = args.t if args.role == "model" else 4 * (args.steps + 1)
    if args.context + ahead > cfg.max_position_embeddings:
        raise SystemExit(f"--context {args.context} + {ahead} rows for the step = {args.context + ahead} cache rows, "
                         f"more than the model's max_position_embeddings {cfg.max_position_embeddings}: use at most "
                         f"--context {cfg.max_position_embeddings - ahead}")
    opts = {"inductor": args.inductor}
    if args.dump_dir:
        opts["dump_dir"] = args.dump_dir
    t0 = time.perf_counter()
    if args.role == "model":
        cache = Ling3Cache.allocate(cfg, args.context + args.t, device=dev)
        step = compile_step(model, "verify" if args.t > 1 else "decode", **opts)
        ids = torch.randint(0, cfg.vocab_size, (args.t,), device=dev)
        pos = torch.arange(args.context, args.context + args.t, device=dev)
        with torch.no_grad():
            step(ids, pos, cache)
        what = f"T={args.t}"
    else:
        # One of the relay's step functions (runtime/relay/steps.py) as the engine compiles it:
        # the model call plus the step's relay-buffer bookkeeping, which is what the relay passes
        # (metadata_capture, stage_commit, relay_tail) rewrite. Not captured: explain runs nothing.
        from .runtime.relay.engine import Engine

        role = args.role.removesuffix("-step")
        engine = Engine(model, max_len=args.context + ahead, steps=args.steps, options=opts,
                        cudagraphs=False, progress=False)
        engine.prepare([role])
        what = f"relay step '{role}', {args.steps} drafts"
    print(f"lingc explain: {name}, {what}, device {dev}, "
          f"inductor={args.inductor}, compiled in {time.perf_counter() - t0:.1f} s\n")
    print(compile_reports[-1].format())
    if args.dump_dir:
        print(f"dumps in {compile_reports[-1].dump_dir}")
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    from .backend import compile_reports
    from .decoding.reference import greedy_generate
    from .runtime.relay.engine import Engine

    from .models.parallel import init_from_env

    tp = init_from_env()
    if tp.size != args.tp:
        raise SystemExit(f"--tp {args.tp} but {tp.size} process(es) are running: launch with "
                         f"torchrun --nproc-per-node {args.tp} -m lingc run --tp {args.tp} ...")
    dev = _device(args.device)
    if args.prefill_graphs and dev.type != "cuda":
        raise SystemExit(f"--prefill-graphs captures the prefill as CUDA graphs: it needs a CUDA device "
                         f"(this run is on {dev}); leave it out")
    if dev.type == "cuda" and tp.enabled:
        dev = torch.device("cuda", torch.cuda.current_device())
    lead = tp.rank == 0
    print = builtins.print if lead else (lambda *a, **k: None)   # noqa: A001  (rank 0 speaks)
    split = f", {tp.size}-way tensor parallel" if tp.enabled else ""
    what = source_label(args.preset, args.checkpoint)
    print(f"lingc: {'loading' if args.checkpoint else 'building'} {what} on {dev}{split}")
    model = _model(args, dev, tp=tp, progress=lead)
    cfg = model.config
    prompt = _prompt(args, cfg.vocab_size)
    n = args.new_tokens
    check_context(len(prompt), n, args.steps, cfg.max_position_embeddings)

    t0 = time.perf_counter()
    eager = greedy_generate(model, prompt, n, eos_token_id=None)
    t_eager = time.perf_counter() - t0

    engine = Engine(model, max_len=len(prompt) + n + relay_margin(args.steps), steps=args.steps,
                    options={"inductor": args.inductor}, progress=lead, prefill_graphs=args.prefill_graphs)
    t0 = time.perf_counter()
    engine.prepare(("decode", "draft", "verify", "extend"))
    engine.prepare_prefill(len(prompt))       # the prompt's prefill graphs (CUDA), not timed below
    t_compile = time.perf_counter() - t0
    # The verify graph's report; a second run in one process may reuse Dynamo's compile of the
    # same step (no new report): then the earlier one describes the same graph.
    verify = next((r for r in reversed(compile_reports) if r.role == "verify"), None)
    if verify is not None:
        print(verify.format(compact=True))

    t0 = time.perf_counter()
    plain = engine.generate(prompt, n, speculative=None, eos_token_id=None)
    t_plain = time.perf_counter() - t0
    ttft_plain = engine.stats.prefill_s
    t0 = time.perf_counter()
    spec = engine.generate(prompt, n, speculative="nextn", eos_token_id=None)
    t_spec = time.perf_counter() - t0
    st = engine.stats

    def same(out):
        return "identical to eager" if out == eager else "DIFFER from eager"

    print(f"prompt: {len(prompt)} {'given' if args.prompt_ids else 'random'} tokens; {n} new tokens, greedy; "
          f"device {dev}; "
          f"CUDA graphs {'on' if engine.cudagraphs else 'off'}")
    print(f"  eager PyTorch          {t_eager:7.2f} s   {eager[:10]} ...")
    print(f"  lingc plain decode     {t_plain:7.2f} s   {n / t_plain:8.1f} tok/s   tokens {same(plain)}")
    print(f"  lingc NEXTN relay      {t_spec:7.2f} s   {n / t_spec:8.1f} tok/s   tokens {same(spec)}, "
          f"accept length {st.mean_accept_length:.2f} over {st.steps} steps"
          + ("" if args.checkpoint else " (random weights: the draft rarely agrees)"))
    how = (f"one CUDA-graph replay of {st.prefill_rows} rows" if st.prefill_rows
           else "eager chunks")
    print(f"  time to first token (the prompt's prefill, {how}): plain {1e3 * ttft_plain:.1f} ms, "
          f"relay {1e3 * st.prefill_s:.1f} ms (+ the draft's prefill)")
    print(f"  compile + capture of the 4 step graphs{' and the prefill' if st.prefill_rows else ''}: "
          f"{t_compile:.1f} s; "
          f"speed-up over eager: plain {t_eager / t_plain:.1f}x, relay {t_eager / t_spec:.1f}x")
    repeats = _run_sampled(engine, prompt, n, args, print) if args.temperature > 0 else True
    if dev.type == "cpu":
        print("  (on the CPU lingc's ops run their plain-PyTorch references, which check the graphs "
              "rather than speed them up; the speed-up is measured on a GPU: see the README)")
    return 0 if plain == eager and spec == eager and repeats else 1


def _run_sampled(engine, prompt: list[int], n: int, args: argparse.Namespace, print) -> bool:
    """The same request sampled (--temperature, --top-p, --seed): plain, speculative with the
    draft's greedy tokens, and speculative with sampled drafts. All three draw from the same
    distribution with different uniforms, so their tokens are not compared; each is checked to
    repeat under its seed (the return value)."""
    kw = dict(temperature=args.temperature, top_p=args.top_p, seed=args.seed, eos_token_id=None)
    roles = ("decode_sample", "verify_sample", "draft_sample", "verify_sample_q", "extend_sample")
    t0 = time.perf_counter()
    engine.prepare(roles)
    t_compile = time.perf_counter() - t0
    runs = {}
    for label, kind, sampled_drafts in (("plain decode", None, False), ("NEXTN relay", "nextn", False),
                                        ("relay, drafts sampled", "nextn", True)):
        t0 = time.perf_counter()
        out = engine.generate(prompt, n, speculative=kind, sampled_drafts=sampled_drafts, **kw)
        runs[label] = (out, time.perf_counter() - t0, engine.stats.mean_accept_length, engine.stats.steps)
        again = engine.generate(prompt, n, speculative=kind, sampled_drafts=sampled_drafts, **kw) == out
        runs[label] += ("repeats under its seed" if again else "DOES NOT REPEAT under its seed",)
    print(f"sampled: temperature {args.temperature}, top_p {args.top_p}, seed {args.seed} "
          f"(compile + capture of the {len(roles)} sampled graphs {t_compile:.1f} s)")
    for label, (out, t, accept, steps, repeat) in runs.items():
        extra = f", accept length {accept:.2f} over {steps} steps" if label != "plain decode" else ""
        print(f"  lingc {label:<21} {t:7.2f} s   {n / t:8.1f} tok/s   {out[:10]} ... {repeat}{extra}")
    return all(r[-1] == "repeats under its seed" for r in runs.values())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m lingc", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name in ("run", "explain"):
        p = sub.add_parser(name)
        p.add_argument("--preset", default=None, choices=sorted(PRESETS), help="random weights (default: tiny)")
        p.add_argument("--checkpoint", default=None, metavar="DIR",
                       help="a Ling-3 HF checkpoint directory (config.json + safetensors) instead of a preset")
        p.add_argument("--device", default=None, help="cpu or cuda (default: cuda if present)")
        p.add_argument("--inductor", action=argparse.BooleanOptionalAction, default=False,
                       help="compile the leftovers with Inductor (default: run them as ATen ops)")
    run, explain = sub.choices["run"], sub.choices["explain"]
    run.add_argument("--prompt-len", type=_int_at_least(1), default=24,
                     help="random prompt tokens (without --prompt-ids)")
    run.add_argument("--prompt-ids", default=None, metavar="IDS",
                     help="the prompt as comma-separated token ids (lingc has no tokenizer)")
    run.add_argument("--new-tokens", type=_int_at_least(1), default=48)
    run.add_argument("--seed", type=int, default=0, help="random prompt and weights, and the sampling's draws")
    run.add_argument("--temperature", type=_non_negative_float, default=0.0,
                     help="> 0: also generate the request sampled, plain and speculative (default 0: greedy only)")
    run.add_argument("--top-p", type=top_p_arg, default=1.0, help="nucleus for --temperature (0 < top_p <= 1)")
    run.add_argument("--steps", type=int, default=5, choices=range(1, MAX_STEPS + 1), metavar=f"{{1..{MAX_STEPS}}}",
                     help="NEXTN drafts per relay step")
    run.add_argument("--tp", type=int, default=1,
                     help="tensor-parallel size: run under torchrun --nproc-per-node N")
    run.add_argument("--prefill-graphs", action=argparse.BooleanOptionalAction, default=None,
                     help="capture the prompt's prefill as a CUDA graph (default: on a single CUDA GPU; "
                          "--prefill-graphs also with --tp, --no-prefill-graphs never)")
    explain.add_argument("--t", type=int, default=1, choices=range(1, 17), metavar="{1..16}",
                         help="tokens per step: 1 = decode, 6 = chain verify")
    explain.add_argument("--context", type=_int_at_least(0), default=32, help="cache rows before the step")
    explain.add_argument("--dump-dir", default=None)
    explain.add_argument("--role", default="model", choices=("model",) + RELAY_ROLES,
                         help="model: the bare forward at --t tokens (default); otherwise one step graph of the "
                              "NEXTN relay: decode-step (plain decoding), draft, verify-step, extend")
    explain.add_argument("--steps", type=int, default=5, choices=range(1, MAX_STEPS + 1), metavar=f"{{1..{MAX_STEPS}}}",
                         help="NEXTN drafts per relay step, for --role")
    args = ap.parse_args(argv)
    return {"run": cmd_run, "explain": cmd_explain}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
