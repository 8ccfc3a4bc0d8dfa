"""Compare the kernel sequences that ``benchmarks.decode --profile`` records, side by side.

    python -m benchmarks.sequence A/decode.json [B/decode.json ...] [--mode lingc] [--graph decode]
                                  [--window 20:31 | --by-kernel] [--top 25]

Each JSON holds, per mode and graph, the kernels of one replay in order of their end, with the
grid and the critical time (since the previous kernel's end). Two views, each a markdown table
with one column per file:

- ``--window START:STOP`` (default 0:40): kernels START..STOP-1 of the sequence, one row each:
  a layer's chain, kernel by kernel. The kernel names and grids are the first file's; a file
  whose kernel at a position differs is marked ``*`` (the graphs are not the same there).
- ``--by-kernel``: critical us summed per (kernel, grid) over the whole sequence, the largest
  first, with each later file's difference from the first.
- ``--by-kind``: the same summed per kind of work (``KINDS``: projection GEMMs, MoE experts,
  router and align, KDA, MLA, norms, the lm_head, the relay verdict and advance, other), the view
  `benchmarks.decode` prints.

This is how an A/B of a launch setting is read: which kernels gained, which lost.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from benchmarks.common import markdown_table

__all__ = ["KINDS", "kind_of", "by_kind", "load_sequence", "window_rows", "by_kernel_rows", "by_kind_rows", "main"]

# Kind of work of a lingc kernel, by the prefix of its Triton kernel name (first match wins);
# anything else (ATen copies, index ops, NCCL) is "other".
KINDS = (
    ("lm_head (GEMM + argmax)", ("_gemm_argmax",)),
    ("projection GEMMs", ("_gemm_kernel", "_gemv_kernel", "_swiglu_gemm", "_splitk_swiglu")),
    # _moe_combine, _moe_swiglu, _grouped_* (moe_grouped) here and _moe_pair_*, _block_table in the
    # next kind: prefill only
    ("MoE experts", ("_moe_up", "_moe_down", "_moe_combine", "_moe_swiglu", "_grouped_up", "_grouped_down")),
    ("MoE router + align", ("_moe_router", "_moe_align", "_moe_pair", "_block_table")),
    ("KDA chain + commit", ("_kda",)),   # _kda_prefill*: prefill only
    ("MLA", ("_mla", "_head_matmul")),
    # gqa_decode's combine runs as _mla_combine_kernel: counted as MLA
    ("GQA attention + cache writes", ("_gqa", "_head_cache_write")),
    ("norms", ("_rmsnorm", "_gated_head_rmsnorm")),
    ("relay verdict + advance", ("_greedy_verdict", "_greedy_emit", "_relay_advance")),
    ("sampling draw", ("_nucleus_pass",)),
    ("glue (concat)", ("_concat_cols", "_concat_into")),
)
OTHER = "other (ATen, copies, collectives)"


def kind_of(kernel: str) -> str:
    for kind, prefixes in KINDS:
        if kernel.startswith(prefixes):
            return kind
    return OTHER


def by_kind(seq: list[dict]) -> dict[str, tuple[float, int]]:
    """{kind: (critical us, launches)} over one replay's sequence, in ``KINDS`` order, other last;
    kinds with no kernel left out."""
    out: dict[str, list] = {k: [0.0, 0] for k, _ in KINDS}
    out[OTHER] = [0.0, 0]
    for k in seq:
        acc = out[kind_of(k["kernel"])]
        acc[0] += k["critical_us"]
        acc[1] += 1
    return {k: (round(v[0], 2), v[1]) for k, v in out.items() if v[1]}


def load_sequence(path: Path, mode: str, graph: str) -> list[dict]:
    """The kernel sequence of ``mode``'s ``graph`` in a decode JSON; SystemExit naming what the file
    has when it lacks one."""
    results = json.loads(Path(path).read_text()).get("results", {})
    if mode not in results:
        raise SystemExit(f"{path}: no mode {mode!r}; it has {sorted(results)}")
    seqs = results[mode].get("kernel_sequence") or {}
    if graph not in seqs or not seqs[graph]:
        raise SystemExit(f"{path}: mode {mode!r} has no kernel sequence for graph {graph!r} "
                         f"(graphs with one: {sorted(g for g, s in seqs.items() if s)}; run decode with --profile)")
    return seqs[graph]


def _key(k: dict) -> tuple[str, tuple]:
    return k["kernel"], tuple(k.get("grid") or ())


def window_rows(seqs: list[list[dict]], start: int, stop: int) -> list[dict]:
    """One row per position in [start, stop) of the first sequence: its kernel and grid, and each
    sequence's critical us (``*`` appended where that sequence's kernel differs there)."""
    rows = []
    for i in range(start, min(stop, len(seqs[0]))):
        k = seqs[0][i]
        row = {"pos": i, "kernel": k["kernel"][:40], "grid": "x".join(map(str, k.get("grid") or [])) or "-"}
        for j, s in enumerate(seqs):
            if i >= len(s):
                row[f"f{j}"] = "-"
            else:
                mark = "" if _key(s[i]) == _key(k) else "*"
                row[f"f{j}"] = f"{s[i]['critical_us']:.2f}{mark}"
        rows.append(row)
    return rows


def by_kernel_rows(seqs: list[list[dict]], top: int) -> list[dict]:
    """Critical us per (kernel, grid), summed over each sequence; the ``top`` largest in the first,
    with each later sequence's total and its difference from the first."""
    totals = []
    for s in seqs:
        t: dict[tuple, float] = {}
        for k in s:
            t[_key(k)] = t.get(_key(k), 0.0) + k["critical_us"]
        totals.append(t)
    keys = sorted(set().union(*totals), key=lambda key: -totals[0].get(key, 0.0))[:top]
    rows = []
    for key in keys:
        row = {"kernel": key[0][:40], "grid": "x".join(map(str, key[1])) or "-"}
        base = totals[0].get(key, 0.0)
        for j, t in enumerate(totals):
            v = t.get(key, 0.0)
            row[f"f{j}"] = f"{v:.1f}" if j == 0 else f"{v:.1f} ({v - base:+.1f})"
        rows.append(row)
    row = {"kernel": "all kernels", "grid": ""}
    for j, t in enumerate(totals):
        row[f"f{j}"] = f"{sum(t.values()):.1f}"
    rows.append(row)
    return rows


def by_kind_rows(seqs: list[list[dict]]) -> list[dict]:
    """One row per kind of work (``by_kind``): each sequence's critical us and launches, later
    sequences with their difference from the first."""
    kinds = [by_kind(s) for s in seqs]
    names = [k for k, _ in KINDS] + [OTHER]
    rows = []
    for name in names:
        if not any(name in k for k in kinds):
            continue
        row = {"kind": name}
        base = kinds[0].get(name, (0.0, 0))[0]
        for j, k in enumerate(kinds):
            us, n = k.get(name, (0.0, 0))
            row[f"f{j}"] = f"{us:.1f} ({n})" if j == 0 else f"{us:.1f} ({n}) {us - base:+.1f}"
        rows.append(row)
    row = {"kind": "all"}
    for j, k in enumerate(kinds):
        row[f"f{j}"] = f"{sum(us for us, _ in k.values()):.1f} ({sum(n for _, n in k.values())})"
    rows.append(row)
    return rows


def _window(text: str) -> tuple[int, int]:
    try:
        a, b = (int(v) for v in text.split(":"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--window must be START:STOP (e.g. 20:31), got {text!r}") from None
    if not 0 <= a < b:
        raise argparse.ArgumentTypeError(f"--window needs 0 <= START < STOP, got {text!r}")
    return a, b


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("json", type=Path, nargs="+", help="decode.json files written with --profile")
    ap.add_argument("--mode", default="lingc", help="the decode mode (lingc, lingc-nextn, ...)")
    ap.add_argument("--graph", default="decode", help="the graph (decode; draft, verify, extend)")
    view = ap.add_mutually_exclusive_group()
    view.add_argument("--window", type=_window, default=(0, 40), help="START:STOP positions (default 0:40)")
    view.add_argument("--by-kernel", action="store_true", help="critical us summed per kernel and grid")
    view.add_argument("--by-kind", action="store_true", help="critical us (launches) summed per kind of work")
    ap.add_argument("--top", type=int, default=25, help="rows of --by-kernel")
    args = ap.parse_args(argv)
    seqs = [load_sequence(p, args.mode, args.graph) for p in args.json]
    cols = [(f"f{j}", f"f{j}", "s") for j in range(len(args.json))]
    print(f"{args.mode} {args.graph}: critical us (time since the previous kernel's end)\n")
    for j, p in enumerate(args.json):
        print(f"f{j} = {p}")
    print()
    if args.by_kind:
        print(markdown_table(by_kind_rows(seqs), [("kind", "kind", "s")] + cols))
    elif args.by_kernel:
        print(markdown_table(by_kernel_rows(seqs, args.top), [("kernel", "kernel", "s"), ("grid", "grid", "s")] + cols))
    else:
        print(markdown_table(window_rows(seqs, *args.window),
                             [("pos", "#", "d"), ("kernel", "kernel", "s"), ("grid", "grid", "s")] + cols))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
