"""Bar chart of a decode benchmark's JSON: TPOT per mode beside the floor (log scale).

    python -m benchmarks.plot benchmarks/results/decode_flash-tp4-rank_h200.json --out decode.png

Needs matplotlib (the optional `bench` extra: pip install -e ".[bench]"). Kept apart from
benchmarks.decode so the GPU machine, which has no matplotlib, writes the JSON and any machine
draws it.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("json", type=Path)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise SystemExit("benchmarks.plot needs matplotlib: pip install -e '.[bench]'") from None
    d = json.loads(args.json.read_text())
    rows = [(m, r) for m, r in d["results"].items() if r.get("tpot_ms")]
    names = [m for m, _ in rows]
    tpot = [r["tpot_ms"] for _, r in rows]
    floor = [r["floor_ms"] for _, r in rows]
    fig, ax = plt.subplots(figsize=(max(7.0, 1.15 * len(rows) + 2.5), 4.0), dpi=120)
    xs = range(len(rows))
    ax.bar([x - 0.2 for x in xs], tpot, width=0.4, label="TPOT (measured)", color="#3b6ea8")
    ax.bar([x + 0.2 for x in xs], floor, width=0.4, label="floor (bytes / copy BW)", color="#bbbbbb")
    legend_done = False
    for x, (m, r) in zip(xs, rows):
        if r.get("tpot_projected_ms"):
            ax.plot([x - 0.2], [r["tpot_projected_ms"]], "v", color="#d9822b",
                    label=None if legend_done else "TPOT at accept 3.25 (projected)")
            legend_done = True
            ax.text(x - 0.2, r["tpot_projected_ms"] * 0.9, f"{r['tpot_projected_ms']:.2f}", ha="center",
                    va="top", fontsize=8, color="white")
        ax.text(x - 0.2, r["tpot_ms"] * 1.1, f"{r['tpot_ms']:.2f}", ha="center", fontsize=8)
        ax.text(x + 0.2, r["floor_ms"] * 1.1, f"{r['floor_ms']:.2f}", ha="center", fontsize=8, color="#666666")
    ax.set_xticks(list(xs), names, rotation=20 if len(rows) > 4 else 0, ha="right" if len(rows) > 4 else "center")
    ax.set_yscale("log")
    # Plain numbers on the log axis (not 4 x 10^0), minor ticks labelled at 2 and 5 only.
    from matplotlib.ticker import FormatStrFormatter, LogLocator
    ax.yaxis.set_major_formatter(FormatStrFormatter("%g"))
    ax.yaxis.set_minor_locator(LogLocator(subs=(2.0, 5.0)))
    ax.yaxis.set_minor_formatter(FormatStrFormatter("%g"))
    ax.set_ylim(top=max(tpot) * 1.4)   # room for the value labels
    ax.set_ylabel("ms per output token")
    ax.set_title(f"{d['preset']}, context {d['context']}, {d['weights']}, {d['env'].get('gpu', '')}",
                 fontsize=9)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))   # beside the bars, never on them
    fig.tight_layout()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
