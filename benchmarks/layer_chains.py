"""Each decoder layer's kernel chain against the floor of the bytes that layer must read.

    python -m benchmarks.layer_chains DECODE_JSON [--mode lingc-nextn] [--graph verify]
        [--layers | --kernels "KDA + MoE"] [--boundary-us 0.93]

The attention issue's last target is a whole-layer chain, captured in a CUDA graph, within 1.3x
of the sum of its kernels' floors. ``benchmarks.decode --profile`` records each graph's kernels in
order of their end with their critical time (since the previous kernel's end), and, per graph,
the floor of every layer it runs (``layer_floor_us``: the layer's non-expert weights, the
distinct experts its router chose in that run, its KDA state or MLA cache rows, over the copy
bandwidth measured in the same run). This module cuts the sequence into layers and sets each
layer's summed critical time beside its floor.

Where a layer ends: at its MLP's last kernel, the MoE down-GEMM (``_moe_down*``) or, for a dense
MLP, the first GEMM after the SwiGLU GEMM. What is not a layer's work, wherever it runs (the
lm_head and its argmax, the relay's verdict and advance, ATen glue), is counted outside the
layers, as are the kernels after the last layer (the final norm, a verify's KDA commits). A
graph whose cut does not give one segment per layer of its floor list is reported as such, not
matched by guesswork.

With a kernel boundary's cost (``pdl_boundary_us`` in a JSON of ``benchmarks.decode --profile``
since session 22, or ``--boundary-us``: ``benchmarks.sync_probe``'s PDL-chained form), the class
table adds each class's chain bound (its floor + its kernels x one boundary, medians) and the
time beyond it: what the kernels cost besides their bytes and their synchronisation, the part a
faster kernel can win back, where the rest needs fewer kernels.
"""
from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from benchmarks.common import markdown_table
from benchmarks.sequence import KINDS, OTHER, kind_of

__all__ = ["TARGET_X_FLOOR", "split_layers", "layer_rows", "class_rows", "kernel_rows", "summary_line", "main"]

# The attention issue's bound on a layer chain: its critical time over its floor.
TARGET_X_FLOOR = 1.3
_OUTSIDE_KINDS = {KINDS[0][0], "relay verdict + advance", OTHER}     # lm_head, relay glue, ATen


def split_layers(seq: list[dict]) -> tuple[list[list[dict]], list[dict]]:
    """(layers, outside): the layer segments of one replay's sequence in order, and the kernels
    counted outside every layer (module docstring)."""
    layers, outside, cur, swiglu = [], [], [], False
    for k in seq:
        name = k["kernel"]
        if kind_of(name) in _OUTSIDE_KINDS:
            outside.append(k)
            continue
        # A layer ends at its MoE down-GEMM, or at the first GEMM after a dense MLP's SwiGLU GEMM.
        ends = name.startswith("_moe_down") or (swiglu and name.startswith("_gemm_kernel"))
        swiglu = swiglu or name.startswith(("_swiglu_gemm", "_splitk_swiglu"))
        cur.append(k)
        if ends:
            layers.append(cur)
            cur, swiglu = [], False
    return layers, outside + cur


def _mismatch(layers: list, floors: list) -> str | None:
    """The line saying the cut does not match the floor list, or None when it does."""
    if len(layers) == len(floors):
        return None
    return (f"{len(layers)} layer segments in the sequence against {len(floors)} layers in the floor "
            f"list: not matched (no GPU kernel sequence, or a graph this cut does not know)")


def layer_rows(seq: list[dict], floors: list[tuple[str, float]]) -> list[dict] | str:
    """One row per layer: its label, summed critical us, floor us and the ratio; or, when the cut
    does not match ``floors`` (label, floor us per layer, in order), a line saying so."""
    layers, _ = split_layers(seq)
    if (bad := _mismatch(layers, floors)) is not None:
        return bad
    rows = []
    for i, (seg, (label, floor_us)) in enumerate(zip(layers, floors)):
        us = sum(k["critical_us"] for k in seg)
        rows.append({"layer": i, "class": label, "kernels": len(seg), "us": us, "floor_us": floor_us,
                     "x_floor": us / floor_us if floor_us > 0 else float("inf")})
    return rows


def class_rows(rows: list[dict], boundary_us: float | None = None) -> list[dict]:
    """Per class of layer (in first-seen order): layers, median us and floor, median and worst
    ratio, and whether the worst is within TARGET_X_FLOOR; with ``boundary_us`` (one kernel
    boundary), also the median chain bound (floor + kernels x boundary) and the time beyond it."""
    out = []
    for label in dict.fromkeys(r["class"] for r in rows):
        rs = [r for r in rows if r["class"] == label]
        worst = max(r["x_floor"] for r in rs)
        row = {"class": label, "layers": len(rs), "kernels": statistics.median(r["kernels"] for r in rs),
               "us": statistics.median(r["us"] for r in rs),
               "floor_us": statistics.median(r["floor_us"] for r in rs),
               "x_floor": statistics.median(r["x_floor"] for r in rs), "worst": worst,
               "target": "met" if worst <= TARGET_X_FLOOR else "missed"}
        if boundary_us is not None:
            bounds = [r["floor_us"] + r["kernels"] * boundary_us for r in rs]
            row["bound_us"] = statistics.median(bounds)
            row["beyond_us"] = statistics.median(r["us"] - b for r, b in zip(rs, bounds))
        out.append(row)
    return out


def kernel_rows(seq: list[dict], floors: list[tuple[str, float]], label: str) -> list[dict] | str:
    """One row per kernel position of the layers of class ``label`` (all of one class share a
    chain): its kernel and grid (the first layer's), median and max critical us over the class,
    and its share of the median chain; or a line saying why not."""
    layers, _ = split_layers(seq)
    if (bad := _mismatch(layers, floors)) is not None:
        return bad
    segs = [seg for seg, (lab, _) in zip(layers, floors) if lab == label]
    if not segs:
        return f"no layer of class {label!r}; the classes here: {sorted({lab for lab, _ in floors})}"
    if len({tuple(k["kernel"] for k in seg) for seg in segs}) != 1:
        return f"the {label!r} layers do not all run the same kernel chain: not tabled by position"
    chain = statistics.median(sum(k["critical_us"] for k in seg) for seg in segs)
    rows = []
    for i, k in enumerate(segs[0]):
        us = [seg[i]["critical_us"] for seg in segs]
        rows.append({"pos": i, "kernel": k["kernel"][:40], "grid": "x".join(map(str, k.get("grid") or [])) or "-",
                     "us": statistics.median(us), "max_us": max(us), "share": statistics.median(us) / chain})
    return rows


KERNEL_COLUMNS = [("pos", "#", "d"), ("kernel", "kernel", "s"), ("grid", "grid", "s"),
                  ("us", "critical us (median)", ".2f"), ("max_us", "max", ".2f"), ("share", "share of the chain", ".0%")]

CLASS_COLUMNS = [("class", "layer", "s"), ("layers", "layers", "d"), ("kernels", "kernels", ".0f"),
                 ("us", "chain us (median)", ".1f"), ("floor_us", "floor us (median)", ".1f"),
                 ("x_floor", "x floor (median)", ".2f"), ("worst", "x floor (worst)", ".2f"),
                 ("target", f"<= {TARGET_X_FLOOR}x", "s")]
BOUND_COLUMNS = [("bound_us", "floor + kernels x boundary us", ".1f"), ("beyond_us", "beyond that us", ".1f")]


def summary_line(seq: list[dict], floors: list[tuple[str, float]]) -> str:
    """One line per graph for the decode benchmark's output: per class, median chain us / floor
    us and the ratio, and the time outside the layers."""
    rows = layer_rows(seq, floors)
    if isinstance(rows, str):
        return rows
    _, outside = split_layers(seq)
    parts = [f"{c['class']} x{c['layers']}: {c['us']:.1f} / {c['floor_us']:.1f} us = {c['x_floor']:.2f}x "
             f"(worst {c['worst']:.2f}x)" for c in class_rows(rows)]
    return ("layer chains, median critical us / floor us: " + "; ".join(parts)
            + f"; outside the layers {sum(k['critical_us'] for k in outside):.0f} us")


def load(path: Path, mode: str, graph: str) -> tuple[list[dict], list[tuple[str, float]], float | None]:
    """(the graph's kernel sequence, its layer floors, the PDL kernel boundary the run measured
    (``pdl_boundary_us``, None in JSONs before session 22))."""
    data = json.loads(Path(path).read_text())
    results = data.get("results", {})
    if mode not in results:
        raise SystemExit(f"{path}: no mode {mode!r}; it has {sorted(results)}")
    seq = (results[mode].get("kernel_sequence") or {}).get(graph)
    floors = (results[mode].get("layer_floor_us") or {}).get(graph)
    if not seq:
        raise SystemExit(f"{path}: mode {mode!r} has no kernel sequence for graph {graph!r} (run decode with --profile)")
    if not floors:
        raise SystemExit(f"{path}: mode {mode!r} has no layer floors for graph {graph!r} (written by "
                         f"benchmarks.decode since session 17; rerun it)")
    return seq, [tuple(f) for f in floors], data.get("pdl_boundary_us")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("json", type=Path, help="a decode.json written with --profile")
    ap.add_argument("--mode", default="lingc", help="the decode mode (lingc, lingc-nextn, ...)")
    ap.add_argument("--graph", default="decode", help="the graph (decode; draft, verify, extend)")
    view = ap.add_mutually_exclusive_group()
    view.add_argument("--layers", action="store_true", help="one row per layer instead of per class")
    view.add_argument("--kernels", metavar="CLASS",
                      help="the chain of one class of layer kernel by kernel (e.g. 'KDA + MoE'), medians over its layers")
    ap.add_argument("--boundary-us", type=float, default=None,
                    help="one kernel boundary's cost for the class table's chain bound (default: the JSON's "
                         "pdl_boundary_us, when it has one)")
    args = ap.parse_args(argv)
    if args.boundary_us is not None and args.boundary_us < 0:
        raise SystemExit(f"--boundary-us {args.boundary_us}: a boundary's cost cannot be negative")
    seq, floors, measured_boundary = load(args.json, args.mode, args.graph)
    if args.kernels:
        rows = kernel_rows(seq, floors, args.kernels)
        if isinstance(rows, str):
            raise SystemExit(f"{args.json}: {args.mode} {args.graph}: {rows}")
        floor = statistics.median(f for lab, f in floors if lab == args.kernels)
        print(f"{args.mode} {args.graph}: a {args.kernels} layer kernel by kernel "
              f"(floor {floor:.1f} us per layer, median)\n")
        print(markdown_table(rows, KERNEL_COLUMNS))
        return 0
    rows = layer_rows(seq, floors)
    if isinstance(rows, str):
        raise SystemExit(f"{args.json}: {args.mode} {args.graph}: {rows}")
    print(f"{args.mode} {args.graph}: each layer's critical us (summed over its kernels) against its floor\n")
    if args.layers:
        print(markdown_table(rows, [("layer", "layer", "d"), ("class", "class", "s"), ("kernels", "kernels", "d"),
                                    ("us", "chain us", ".1f"), ("floor_us", "floor us", ".1f"),
                                    ("x_floor", "x floor", ".2f")]))
    else:
        boundary = args.boundary_us if args.boundary_us is not None else measured_boundary
        if boundary is not None:
            print(f"chain bound: each layer's floor + its kernels x {boundary:.2f} us (one PDL kernel boundary)\n")
        print(markdown_table(class_rows(rows, boundary), CLASS_COLUMNS + (BOUND_COLUMNS if boundary is not None else [])))
    _, outside = split_layers(seq)
    print(f"\noutside the layers: {sum(k['critical_us'] for k in outside):.1f} us in {len(outside)} kernels")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
