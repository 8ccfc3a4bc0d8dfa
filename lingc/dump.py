"""Pass dumps: per compiled graph, a numbered directory with the graph before and after each pass,
the pass summary (text and summary.json) and the final kernel table.

    <dump_dir>/003-decode/
        00-captured.txt             the functionalised ATen graph as captured
        01-swiglu_epilogue.before.txt / .after.txt
        99-final.txt                what runs (or what Inductor compiles)
        summary.txt, summary.json   pass | matches | ops before -> after | time, + kernel table
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import torch.fx as fx

from .graph_text import format_graph
from .kernel_table import KernelTable
from .pass_manager import PassStats

_counter = itertools.count()


# A pass's notes, and the "; "-separated parts of one note, after the first go on lines of their
# own, indented: pdl_swap's summary and chains, stage_commit's writes run to thousands of
# characters on one line otherwise.
NOTE_INDENT = "    "


def format_summary(stats: list[PassStats], role: str, timings: bool = True) -> str:
    """The pass table, a pass's first note on its row and each further note (or part of one) on a
    line of its own (``NOTE_INDENT``); timings=False prints '-' for times (stable text for expect
    tests)."""
    lines = [f"lingc pass summary (role {role})",
             f"{'pass':<20} {'matches':>7}  {'ops before -> after':>20}  {'time ms':>8}  note"]
    for s in stats:
        if s.skipped:
            lines.append(f"{s.name:<20} {'-':>7}  {'-':>20}  {'-':>8}  skipped: {s.skipped}")
            continue
        ops = f"{s.ops_before} -> {s.ops_after}"
        notes = [part for n in s.notes for part in n.split("; ")]
        if s.max_abs_err is not None:
            notes.append(f"verify: abs {s.max_abs_err:.2e} rel {s.max_rel_err:.2e}")
        t = f"{s.time_ms:>8.1f}" if timings else f"{'-':>8}"
        lines.append(f"{s.name:<20} {s.matches:>7}  {ops:>20}  {t}  {notes[0] if notes else ''}".rstrip())
        lines.extend(NOTE_INDENT + n for n in notes[1:])
    return "\n".join(lines) + "\n"


class GraphDump:
    def __init__(self, root: str, role: str):
        self.dir = Path(root) / f"{next(_counter):03d}-{role}"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.role = role

    def graph(self, name: str, gm: fx.GraphModule) -> None:
        (self.dir / f"{name}.txt").write_text(format_graph(gm))

    def summary(self, stats: list[PassStats], table: KernelTable, extra: dict) -> None:
        text = format_summary(stats, self.role) + "\nkernel table\n" + table.format()
        (self.dir / "summary.txt").write_text(text)
        (self.dir / "summary.json").write_text(json.dumps(
            {"role": self.role, "passes": [s.as_dict() for s in stats],
             "kernels": table.as_dict(), **extra}, indent=2) + "\n")
