"""Batch-1 decode of a model lingc did not write: tests/foreign_model.py's Kimi Linear-style hybrid
(two KDA layers and an MLA layer, each with a MoE; written in plain PyTorch in Kimi Linear's
spelling) at real per-GPU widths, eager against lingc.DecodeRunner and against the NEXTN relay
on lingc.SpecRunner (with an MTP draft layer, tests/foreign_model.py's MtpDraft), with the floor
beside each.

    python -m benchmarks.foreign_decode --preset kimi-linear-tp4-rank --context 8192 --out DIR
    python -m benchmarks.foreign_decode --preset tiny --out DIR          # CPU smoke run

Presets: ``kimi-linear-tp4-rank`` is one GPU's shard of Kimi-Linear-48B-A3B under 4-way tensor
parallelism (hidden 2304, 8 of its 32 KDA and MLA heads of 128, the latent 512 + 64 rope dims, 256
experts top-8 with their intermediate 1024 / 4 = 256, one shared expert, the vocabulary's quarter),
with three layers instead of 27 (the model's structure is tests/foreign_model.py's);
``qwen3-next-tp4-rank`` the same structure with Qwen3-Next's linear layers and MoE block at
Qwen3-Next-80B's per-GPU widths (hidden 2048, 8 value heads and 4 q/k heads of 128, one fused
convolution with a 4-column cache, 512 experts top-10 of intermediate 512 / 4 = 128, the shared
expert behind its sigmoid gate) and its gated full attention in the third layer (4 of its 16 query
heads over one of its 2 key/value heads, replicated, of 256 dims, 64 of them roped);
``tiny`` the tests' sizes. ``--kimi-linear`` takes Kimi Linear's own MLA (rope dims unrotated) and router
(grouped, zero-filled top-k). Weights are random, bf16 on the GPU.

Method (docs/method.md): the state starts from random values at position ``--context`` (the MLA
cache filled, no prefill); each mode runs the step ``--tokens`` times after warm-up, each step
timed by CUDA events (wall clock on the CPU), medians reported. ``eager``: the model called per
token, its argmax fed back on the device. ``lingc``: DecodeRunner's captured step (the model
compiled by lingc, one CUDA-graph replay a token). ``lingc-nextn``: SpecRunner's relay step (the
draft, verify and extend graphs, STEPS = 3 drafts) from the same state, its draft's cache random
too; its tokens per step are measured (random weights: the draft rarely agrees, so this is the
step's cost, not a real model's speed-up), and its emitted tokens are checked against the plain
step's (speculative == plain). The floor is the bytes one step must read (every
weight but the routed experts, the router's 8 chosen experts and the shared expert per layer, the
KDA states and windows, the attention cache's rows up to the position, the embedding row) over the copy
bandwidth measured in the same run; the relay step's adds its draft forwards and counts each
chain pair's expert as distinct (an upper bound on its bytes, so its x floor is a lower bound).
All modes start from the same state; the tokens each picks
over the timed steps are compared and the agreement reported (bf16: lingc's kernels round
differently, so greedy paths may part). The ops lingc's passes left to ATen (or Inductor, in a GPU
compile) in the step's graph are listed: a matcher that stops matching shows there, not only as a
slower time (session 53: the bf16 gated attention left to Inductor on the H100, unnoticed in the
table).
"""
from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import time
from pathlib import Path

import torch

from benchmarks.common import call_times_ms, copy_bandwidth_gbps, environment, markdown_table, write_json

_MLA = dict(MH=8, NOPE=128, ROPE=64, RANK=512, VD=128)
# name -> (tests/foreign_model.py's sizes, KimiStyleModel's arguments)
PRESETS = {
    "tiny": ({}, {}),
    "kimi-linear-tp4-rank": (dict(HID=2304, VOCAB=163840 // 4, KH=8, KD=128, E=256, TOPK=8, INTER=256, SHARED=256,
                                  **_MLA), {}),
    # Its full-attention layer as Qwen3-Next's: gated GQA, 16 query heads over 2 key/value heads
    # of 256 dims (64 roped): 4 over 1 (replicated) a rank.
    "qwen3-next-tp4-rank": (dict(HID=2048, VOCAB=151936 // 4, KH=8, QK_HEADS=4, KD=128, E=512, TOPK=10, INTER=128,
                                 SHARED=128, MH=4, NOPE=192, ROPE=64, KVH=1),
                            {"gdn": "qwen3-next", "gated_attention": True}),
}
MODES = ("eager", "lingc", "lingc-nextn")
STEPS = 3                       # lingc-nextn: drafts per relay step (a chain of 4 tokens)


def foreign_module(dims: dict):
    """tests/foreign_model.py at these sizes (its with_dims copy)."""
    path = Path(__file__).resolve().parents[1] / "tests" / "foreign_model.py"
    spec = importlib.util.spec_from_file_location("foreign_model_bench", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module.with_dims(**dims)


def floor_bytes(model, fm, state, position: int, tokens: int = 1) -> int:
    """What one forward of `model` (the target, or the MTP draft with state ([], [], its cache))
    over `tokens` rows at `position` must read (module docstring). Above one row each (token,
    slot) pair is counted as a distinct expert: an upper bound on the expert bytes, so the
    relay's x floor is a lower bound."""
    moes = list(model.moe) if isinstance(model.moe, torch.nn.ModuleList) else [model.moe]
    routed = {id(p) for moe in moes for p in (moe.w13, moe.w2)}
    total = sum(p.numel() * p.element_size() for p in model.parameters() if id(p) not in routed)
    total -= model.embed.weight.numel() * model.embed.weight.element_size()
    total += tokens * model.embed.weight[0].numel() * model.embed.weight.element_size()
    for moe in moes:                    # the chosen experts' rows
        total += min(fm.E, tokens * fm.TOPK) * (moe.w13[0].numel() * moe.w13.element_size()
                                                + moe.w2[0].numel() * moe.w2.element_size())
    states, windows, caches = state
    total += sum(t.numel() * t.element_size() for t in states + windows)
    total += sum((position + tokens) * c[0].numel() * c.element_size() for c in caches)
    return total


def main(argv=None) -> dict:
    import lingc

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", choices=sorted(PRESETS), default="kimi-linear-tp4-rank")
    ap.add_argument("--kimi-linear", action="store_true", help="Kimi Linear's own MLA and router")
    ap.add_argument("--context", type=int, default=8192, help="the position decode starts at")
    ap.add_argument("--tokens", type=int, default=64, help="timed steps per mode")
    ap.add_argument("--warmup", type=int, default=8)
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    modes = [m for m in args.modes.split(",") if m]
    bad = sorted(set(modes) - set(MODES))
    if bad:
        raise SystemExit(f"--modes: unknown {bad}; choose from {list(MODES)}")
    cuda = torch.cuda.is_available()
    if args.preset != "tiny" and not cuda:
        raise SystemExit(f"--preset {args.preset} needs a GPU (use --preset tiny on the CPU)")
    device, dtype = ("cuda", torch.bfloat16) if cuda else ("cpu", torch.float32)
    dims, model_kw = PRESETS[args.preset]
    fm = foreign_module(dims)
    context = min(args.context, 16) if args.preset == "tiny" else args.context
    # The relay advances up to STEPS + 1 positions a step, and runs ahead by two steps' chains.
    max_len = context + (args.warmup + args.tokens + 2) * (STEPS + 1) + 8

    t0 = time.perf_counter()
    if args.kimi_linear and model_kw:
        raise SystemExit(f"--kimi-linear takes Kimi Linear's MLA and router; --preset {args.preset} has its own")
    model = fm.KimiStyleModel(kimi_linear=args.kimi_linear, **model_kw).to(device=device, dtype=dtype)
    build_s = time.perf_counter() - t0
    fused = {"fused_conv": 4} if model_kw.get("gdn") else {}
    start = [[t.to(device) for t in group]
             for group in fm.KimiStyleModel.fresh_state(2, cache_len=max_len, dtype=dtype, **fused,
                                                        gated_attention=model_kw.get("gated_attention", False))]
    gated = model_kw.get("gated_attention", False)
    draft = fm.MtpDraft(model) if "lingc-nextn" in modes else None
    dstart = [torch.randn(c.shape, generator=torch.Generator().manual_seed(3)).to(device, dtype)
              for c in fm.MtpDraft.fresh_cache(max_len, dtype, gated)]
    bw = copy_bandwidth_gbps() if cuda else None
    nbytes = floor_bytes(model, fm, start, context)
    floor_ms = nbytes / (bw * 1e9) * 1e3 if bw else None
    # A relay step: STEPS - 1 draft forwards, the target over the chain of STEPS + 1, the draft over it.
    relay_bytes = None if draft is None else (
        (STEPS - 1) * floor_bytes(draft, fm, ([], [], dstart), context)
        + floor_bytes(model, fm, start, context, STEPS + 1) + floor_bytes(draft, fm, ([], [], dstart), context, STEPS + 1))
    relay_floor_ms = relay_bytes / (bw * 1e9) * 1e3 if bw and relay_bytes else None

    def fresh():
        return [[t.clone() for t in group] for group in start]

    rows, tokens, left = [], {}, None
    for mode in modes:
        state = fresh()
        steps = args.warmup + args.tokens
        picked = []
        if mode == "eager":
            x = torch.ones(1, dtype=torch.int64, device=device)
            pos = torch.full((1,), context, dtype=torch.int64, device=device)

            @torch.no_grad()
            def step():
                x.copy_(model(x, pos, *state)[-1].argmax(-1).view(1))
                pos.add_(1)
                picked.append(x.clone())
            compile_s = 0.0
        elif mode == "lingc-nextn":
            t0 = time.perf_counter()
            dstate = [c.clone() for c in dstart]
            runner = lingc.SpecRunner(model.target, draft, state, dstate, max_len=max_len, steps=STEPS,
                                      progress=False)
            runner.prepare(("draft", "verify", "extend"))
            compile_s = time.perf_counter() - t0
            left = merge_left(left, ops_left([r for rs in runner.reports.values() for r in rs]))
            for dst, src in zip([t for g in state for t in g] + dstate,
                                [t for g in fresh() for t in g] + dstart):
                dst.copy_(src)                     # prepare zeroed the state
            r = runner.relay
            r.n.fill_(context)
            r.x.fill_(1)
            r.seed.fill_(1)
            r.dh.normal_()

            def step():
                runner._launch(("draft", "verify", "extend"))
                picked.append(torch.cat([r.emitted, r.accept]))
        else:
            t0 = time.perf_counter()
            runner = lingc.DecodeRunner(model, state, max_len=max_len, progress=False)
            runner.prepare(("greedy",))
            compile_s = time.perf_counter() - t0
            left = merge_left(left, ops_left(runner.reports["greedy"]))
            for dst, src in zip([t for g in state for t in g], [t for g in fresh() for t in g]):
                dst.copy_(src)                     # prepare zeroed the state
            runner.x.fill_(1)
            runner.pos.fill_(context)
            replay = runner._steps["greedy"]

            def step():
                replay()
                picked.append(runner.x.clone())
        with torch.no_grad():
            times = call_times_ms(step, args.tokens, args.warmup, cuda)
        ms = statistics.median(times)
        infos = [] if mode == "eager" else runner.graph_infos()
        row = dict(mode=mode, step_ms=ms, tok_per_step=1.0, floor_ms=floor_ms, compile_s=compile_s,
                   kernels=sum(i.kernel_nodes for i in infos) if infos else None)
        if mode == "lingc-nextn":          # each step's emitted tokens d_1..d_a, y_a
            steps_out = [row_[:int(row_[-1]) + 1].tolist() for row_ in torch.stack(picked[:steps]).cpu()]
            tokens[mode] = [t for out in steps_out for t in out]
            row.update(tok_per_step=len(tokens[mode]) / len(steps_out), floor_ms=relay_floor_ms)
        else:
            tokens[mode] = [int(t) for t in torch.cat(picked[:steps])]
        row["tok_s"] = 1e3 * row["tok_per_step"] / ms
        row["x_floor"] = ms / row["floor_ms"] if row["floor_ms"] else None
        rows.append(row)
    agree = None
    if "eager" in tokens and "lingc" in tokens:
        e, g = tokens["eager"], tokens["lingc"]
        agree = next((i for i, (a, b) in enumerate(zip(e, g)) if a != b), len(e))
    spec_agree = None
    if "lingc" in tokens and "lingc-nextn" in tokens:
        g, sp = tokens["lingc"], tokens["lingc-nextn"]
        spec_agree = (next((i for i, (a, b) in enumerate(zip(g, sp)) if a != b), min(len(g), len(sp))),
                      min(len(g), len(sp)))
    if rows and rows[0]["mode"] == "eager":
        for row in rows[1:]:
            row["faster_than_eager"] = row["tok_s"] / rows[0]["tok_s"]

    table = markdown_table(rows, [("mode", "mode", "s"), ("step_ms", "step ms", ".3f"),
                                  ("tok_per_step", "tokens / step", ".2f"), ("tok_s", "tok/s", ".0f"),
                                  ("floor_ms", "floor ms", ".3f"), ("x_floor", "x floor", ".2f"),
                                  ("faster_than_eager", "tok/s x eager", ".1f"), ("kernels", "graph kernels", "d"),
                                  ("compile_s", "compile+capture s", ".1f")])
    head = (f"foreign_decode: {args.preset}{' (Kimi Linear MLA + router)' if args.kimi_linear else ''}, "
            f"3 layers, position {context}, {args.tokens} timed steps, "
            f"{'bf16 on ' + torch.cuda.get_device_name() if cuda else 'fp32 CPU SMOKE RUN (wall clock)'}")
    lines = [head, "", table, ""]
    if bw:
        lines.append(f"copy bandwidth {bw:.0f} GB/s; floor {floor_ms:.3f} ms a step; model built in {build_s:.1f} s")
    if relay_floor_ms:
        lines.append(f"lingc-nextn: {STEPS} drafts a step (an MTP layer of the third layer's kind, random weights: "
                     f"its accept length is not a real model's); floor {relay_floor_ms:.3f} ms a relay step, "
                     f"counting every (token, slot) pair's expert as distinct (an upper bound on its bytes)")
    if agree is not None:
        lines.append(f"greedy tokens: lingc and eager agree on the first {agree} of {len(tokens['eager'])} steps")
    if spec_agree is not None:
        lines.append(f"speculative == plain: lingc-nextn's tokens equal lingc's on the first {spec_agree[0]} of "
                     f"{spec_agree[1]}")
    if left is not None:
        lines.append("ops lingc left to ATen / Inductor in the step: "
                     + (", ".join(f"{op} x{n}" for op, n in left.items()) or "none"))
    print("\n".join(lines))
    payload = dict(preset=args.preset, dims=dims, kimi_linear=args.kimi_linear, context=context,
                   tokens=args.tokens, copy_bandwidth_gbps=bw, floor_bytes=nbytes, floor_ms=floor_ms, results=rows,
                   relay_floor_bytes=relay_bytes, relay_floor_ms=relay_floor_ms, steps=STEPS,
                   ops_left=left, tokens_agree=agree, speculative_agree=spec_agree, token_ids=tokens,
                   env=environment())
    write_json(Path(args.out) / "foreign_decode.json", payload)
    (Path(args.out) / "foreign_decode.md").write_text("\n".join(lines) + "\n")
    return payload


def merge_left(a: dict | None, b: dict[str, int]) -> dict[str, int]:
    out = dict(a or {})
    for op, n in b.items():
        out[op] = out.get(op, 0) + n
    return out


def ops_left(reports) -> dict[str, int]:
    """{op: count} of the kernel-launching ops no lingc pass took in the compiled step's graphs
    (ATen's, or Inductor's in a GPU compile): what a model's step still runs outside lingc's PDL
    chains, so a matcher that stops matching shows here and not only as a slower time."""
    left: dict[str, int] = {}
    for r in reports:
        for cat, op, n, _ in r.kernels.rows:
            if cat in ("aten", "inductor"):
                left[op] = left.get(op, 0) + n
    return dict(sorted(left.items(), key=lambda kv: (-kv[1], kv[0])))


if __name__ == "__main__":
    main()
