"""Bar chart of the kernel micro-benchmarks' JSON: lingc beside each baseline and the floor.

    python -m benchmarks.plot_kernels DIR [JSON ...] --out kernels.png

Reads the JSON that ``benchmarks.kernels`` (or one of the ``benchmarks.kernels_*`` modules)
writes: every ``kernels_*.json`` of a folder that is a benchmark's (the runner's summary is
skipped), or the files named (each must be one). One panel per benchmark, one
group of horizontal bars per kernel and shape, us per call on a log axis; the floor (bytes the
call must move over the copy bandwidth of the same run) is a black tick where the benchmark
knows it (a floor far below every bar of its panel, as a norm's few KB, is left off the axis). Only the table's lingc kernel and the baselines are drawn (eager, Inductor, cuBLAS,
fla-core); sweeps and no-PDL variants stay in the JSON and the markdown tables. The GEMM panel
shows the fused projections and the lm_head (the skinny-GEMM issue's targets).

Needs matplotlib (the optional `bench` extra), as ``benchmarks.plot`` does.
"""
from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path

LINGC = ("lingc", "lingc-argmax")
# Fixed colours so a variant looks the same in every panel.
COLORS = {"lingc": "#3b6ea8", "eager": "#999999", "inductor": "#d9822b", "inductor-max-autotune": "#b35806",
          "cublas": "#6a9f58", "cublas-cat": "#9cc98c", "fused-linear": "#6a9f58", "cublas+argmax": "#6a9f58",
          "fla-core (recurrence only)": "#8e6bb8", "aten": "#999999"}
TITLES = {"kernels_swiglu": "SwiGLU GEMM", "kernels_gemm": "skinny GEMMs", "kernels_kda": "KDA chain",
          "kernels_gdn": "Gated DeltaNet chain (Qwen3-Next)", "kernels_moe": "MoE layer",
          "kernels_qwen3_moe": "MoE block (Qwen3-Next)", "kernels_attn": "attention and norms",
          "kernels_sampling": "speculative sampling's draw (top_p 0.9)"}


@dataclass(frozen=True)
class Bar:
    group: str                  # the kernel, its shape and T (or M)
    variant: str                # "lingc" for the table's kernel, else the baseline's name
    us: float
    floor_us: float | None      # None where the benchmark reports no floor


def _floor_from_fraction(r: dict) -> float | None:
    # GEMM benchmarks report the share of the copy bandwidth: floor = time x share.
    return r["us"] * r["copy_fraction"] if r.get("copy_fraction") else None


def _variant(name: str) -> str | None:
    """The drawn name of a row's variant, or None for a sweep / ablation row."""
    if name in LINGC:
        return "lingc"
    return None if name.startswith("lingc") or name == "commit" else name


def bars(data: dict) -> list[Bar]:
    """One benchmark JSON's rows as bars (by its ``benchmark`` key)."""
    kind, out = data.get("benchmark"), []
    for r in data.get("rows", []):
        v = _variant(r["variant"])
        if v is None or r.get("us") is None:       # an ablation row, or a smoke run's untimed one
            continue
        if kind == "kernels_swiglu":
            out.append(Bar(f"{r['shape']}, M={r['M']}", v, r["us"], _floor_from_fraction(r)))
        elif kind == "kernels_gemm":
            if r.get("kind") == "fused" or "lm_head" in r["shape"]:
                out.append(Bar(f"{r['shape']}, M={r['M']}", v, r["us"], _floor_from_fraction(r)))
        elif kind in ("kernels_kda", "kernels_gdn"):
            # T > 1: lingc's verify path (staged); the baselines run the persistent update.
            if v == "lingc" and r["T"] > 1 and r["mode"] != "staged":
                continue
            label = "fla-core (recurrence only)" if v == "fla" else v
            out.append(Bar(f"T={r['T']}" + (" (lingc staged)" if r["T"] > 1 else ""), label, r["us"], None))
        elif kind in ("kernels_moe", "kernels_qwen3_moe"):
            out.append(Bar(f"T={r['T']}", v, r["us"], r.get("floor_us")))
        elif kind == "kernels_sampling":
            out.append(Bar(f"S+1={r['rows']}, V={r['vocab']}", v, r["us"], r.get("floor_us")))
        elif kind == "kernels_attn":
            out.append(Bar(f"{r['kernel']} {r['shape']}, T={r['T']}", v, r["us"], r.get("floor_us")))
        else:
            raise ValueError(f"unknown benchmark {kind!r}: want one of {sorted(TITLES)}")
    return out


def load(paths: list[Path]) -> list[tuple[str, list[Bar]]]:
    """(panel title, bars) per benchmark JSON found in ``paths`` (folders: their kernels_*.json)."""
    files = []      # (path, named: a file given by name must be a benchmark's JSON)
    for p in paths:
        if p.is_dir():
            files += [(f, False) for f in sorted(p.glob("kernels_*.json"))]
        elif p.is_file():
            files.append((p, True))
        else:
            raise SystemExit(f"{p}: no such file or folder")
    panels = []
    for f, named in files:
        data = json.loads(f.read_text())
        if not named and data.get("benchmark") not in TITLES:   # the runner's summary, a stray file
            continue
        b = bars(data)
        if b:
            panels.append((TITLES.get(data.get("benchmark"), f.stem), b))
    if not panels:
        raise SystemExit(f"no kernel benchmark rows in {', '.join(map(str, paths))} "
                         f"(want the kernels_*.json of python -m benchmarks.kernels)")
    return panels


def draw(panels: list[tuple[str, list[Bar]]], out: Path, title: str = "") -> Path:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = [len(b) + len({x.group for x in b}) for _, b in panels]
    height = 0.6 + 0.15 * sum(sizes) + 0.45 * len(panels)
    fig, axes = plt.subplots(len(panels), 1, figsize=(8.0, height),
                             dpi=120, gridspec_kw={"height_ratios": sizes}, squeeze=False)
    seen = {}
    for ax, (name, b) in zip(axes[:, 0], panels):
        groups = list(dict.fromkeys(x.group for x in b))
        # The axis starts a little below the fastest bar: a floor far below every bar (a norm's few
        # KB) would squeeze the bars into a corner, so such a floor is left off the axis.
        left = min(x.us for x in b) / 8
        y, ticks = 0.0, []
        for g in groups:
            members = [x for x in b if x.group == g]
            ticks.append((y + (len(members) - 1) / 2, g))
            for x in members:
                color = COLORS.get(x.variant, "#444444")
                h = ax.barh(y, x.us, height=0.8, color=color, label=x.variant)
                seen.setdefault(x.variant, h)
                ax.text(x.us * 1.05, y, f"{x.us:.3g}", va="center", fontsize=7)
                if x.floor_us and x.floor_us >= left:
                    ax.plot([x.floor_us] * 2, [y - 0.45, y + 0.45], color="black", lw=1.5)
                y += 1
            y += 1
        ax.set_yticks([t for t, _ in ticks], [g for _, g in ticks], fontsize=7)
        ax.invert_yaxis()
        ax.set_xscale("log")
        ax.set_xlim(left=left, right=max(x.us for x in b) * 2.5)   # room for the value labels
        ax.set_title(name, fontsize=9, loc="left")
        ax.tick_params(axis="x", labelsize=7)
    axes[-1, 0].set_xlabel("us per call (log); black tick: floor = bytes / copy bandwidth", fontsize=8)
    if title:
        fig.suptitle(title, fontsize=9, x=0.01, ha="left")
    fig.tight_layout(rect=(0, 0, 1, 1 - (0.35 / height if title else 0)))   # the title's line kept free
    fig.legend(list(seen.values()), list(seen), fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 0.98))
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, bbox_inches="tight")   # the legend beside the panels, never on the bars
    plt.close(fig)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("paths", type=Path, nargs="+", help="folders holding kernels_*.json, or JSON files")
    ap.add_argument("--out", type=Path, required=True, help="the PNG to write")
    ap.add_argument("--title", default="", help="a line above the panels (device, date)")
    args = ap.parse_args(argv)
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise SystemExit("benchmarks.plot_kernels needs matplotlib: pip install -e '.[bench]'") from None
    print(f"wrote {draw(load(args.paths), args.out, args.title)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
