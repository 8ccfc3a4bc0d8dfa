"""Where lingc's compile + capture time goes: per role, and per pass inside each role.

    python -m benchmarks.compile_time --preset flash-tp4-rank --out OUT
        [--layers 42] [--experts 64] [--roles draft verify extend decode] [--steps 5]
        [--inductor 0|1] [--capture aot|functionalize] [--dump-dir DIR]

Builds the preset (random bf16 weights, on CUDA when there is one, else the CPU), then prepares
the relay's roles one at a time in this process, as `Engine.prepare` does for a user: Dynamo,
AOTAutograd, the lingc passes, Inductor (unless `--inductor 0`) and, on CUDA, the graph capture.
Per role it reports the wall time and each pass's time from the compile report (the summary
table's `time ms`), so a change to a pass can be A/B'd on the CPU without a GPU: the passes are
host work and do not depend on the device. `--layers` and `--experts` shrink the model (the pass
time grows with the layer count, not the expert count; 64 experts keeps a 42-layer model in a
2-core CI machine's memory).

The first role also pays this process's first-use costs (imports, Dynamo's own modules), as a
user's first compile does. On CUDA, the draft + verify + extend rows of a fresh process with a
warm Triton cache are what the relay issue's "compile + capture under 60 s" goal counts (session
11 measured 60.5 s with the decode benchmark's `--lingc-inductor 0`, i.e. `--inductor 0` here).
Output: the table on stdout and OUT/compile_time.json.
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from benchmarks.common import markdown_table, write_json
from lingc.options import CAPTURES

ROLES = ("draft", "verify", "extend", "decode")


def measure(preset_name: str, layers: int | None, experts: int | None, roles, steps: int,
            inductor: bool, dump_dir: str | None, capture: str = "functionalize") -> dict:
    from lingc.backend import compile_reports
    from lingc.models import build_model, preset
    from lingc.runtime.relay.engine import Engine

    overrides = {}
    if layers is not None:
        overrides["num_hidden_layers"] = layers
    if experts is not None:
        overrides["num_experts"] = experts     # the config checks it against n_group / topk
    cfg = preset(preset_name, **overrides)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    t0 = time.perf_counter()
    model = build_model(cfg, device=device, dtype=torch.bfloat16, seed=0)
    build_s = time.perf_counter() - t0
    # A cold compile: an engine with equal options earlier in the process (a second measure())
    # would otherwise hand this one its graphs from Dynamo's cache, and nothing would be timed.
    torch._dynamo.reset()
    options = {"inductor": inductor, "capture": capture}
    if dump_dir:
        options["dump_dir"] = dump_dir
    eng = Engine(model, max_len=512, steps=steps, options=options, progress=False)
    rows = []
    for role in roles:
        n = len(compile_reports)
        t0 = time.perf_counter()
        eng.prepare((role,))
        if device == "cuda":
            torch.cuda.synchronize()
        wall = time.perf_counter() - t0
        passes: dict[str, float] = {}
        for report in compile_reports[n:]:
            for s in report.stats:                      # in pass order; None = skipped
                if s.skipped is None:
                    passes[s.name] = (passes.get(s.name) or 0.0) + s.time_ms / 1e3
                else:
                    passes.setdefault(s.name, None)
        rows.append(dict(role=role, wall_s=wall, passes_s=sum(v for v in passes.values() if v),
                         per_pass_s=passes, graphs=len(compile_reports) - n))
    return dict(preset=preset_name, layers=cfg.num_hidden_layers, experts=cfg.num_experts,
                device=device, inductor=inductor, capture=capture, captured=eng.cudagraphs, steps=steps,
                build_s=build_s, total_s=sum(r["wall_s"] for r in rows), roles=rows)


def format_report(res: dict) -> str:
    names: list[str] = []
    for r in res["roles"]:
        names += [k for k in r["per_pass_s"] if k not in names]   # pass order
    cols = [("role", "role", ""), ("wall_s", "wall s", ".1f"), ("passes_s", "passes s", ".2f")]
    cols += [(k, k, ".2f") for k in names]
    body = [{**r["per_pass_s"], **r} for r in res["roles"]]
    what = "compile + capture" if res["captured"] else "compile (no capture on the CPU)"
    title = (f"{what}: {res['preset']}, {res['layers']} layers, {res['experts']} experts, "
             f"{res['device']}, inductor {'on' if res['inductor'] else 'off'}, capture {res['capture']}; "
             f"total {res['total_s']:.1f} s (model build {res['build_s']:.1f} s not counted)")
    return title + "\n" + markdown_table(body, cols)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--preset", default="flash-tp4-rank")
    ap.add_argument("--layers", type=int, help="override num_hidden_layers (default: the preset's)")
    ap.add_argument("--experts", type=int, help="override num_experts (default: the preset's)")
    ap.add_argument("--roles", nargs="+", default=list(ROLES), choices=ROLES)
    ap.add_argument("--steps", type=int, default=5, help="relay depth (draft forwards per step)")
    ap.add_argument("--inductor", type=int, default=1)
    ap.add_argument("--capture", default="functionalize", choices=CAPTURES,
                    help="how the ATen graph is captured (LingcOptions.capture)")
    ap.add_argument("--dump-dir", help="also write the pass dumps (their writing is then timed too)")
    ap.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    try:
        res = measure(a.preset, a.layers, a.experts, a.roles, a.steps, bool(a.inductor), a.dump_dir, a.capture)
    except ValueError as e:                     # a preset override the config rejects
        raise SystemExit(f"benchmarks.compile_time: {e}") from None
    print(format_report(res))
    Path(a.out).mkdir(parents=True, exist_ok=True)
    write_json(Path(a.out) / "compile_time.json", res)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
