"""Helpers for backend tests: compile with lingc and collect the CompileReports it produced."""

from __future__ import annotations

import torch

from lingc.backend import compile_reports


def compile_lingc(fn, **options):
    torch._dynamo.reset()
    options.setdefault("inductor", False)
    return torch.compile(fn, backend="lingc", fullgraph=True, dynamic=False, options=options)


def run_and_report(fn, *args, **options):
    """Compile fn with lingc, call it once, return (result, the CompileReport of that graph)."""
    n = len(compile_reports)
    compiled = compile_lingc(fn, **options)
    with torch.no_grad():
        out = compiled(*args)
    assert len(compile_reports) == n + 1, f"expected one compiled graph, got {len(compile_reports) - n}"
    return out, compile_reports[-1]


def compiled_and_eager_greedy(model, seed: int, steps: int = 10):
    """Greedy tokens after a 12-token random prompt: (the lingc-compiled decode step's, eager's).
    The compiled step runs under fail_on_recompile, so a per-step recompile fails the caller."""
    from lingc.decoding.reference import greedy_generate, prefill
    from lingc.models import Ling3Cache
    prompt = torch.randint(0, 300, (12,), generator=torch.Generator().manual_seed(seed))
    want = greedy_generate(model, prompt, steps, eos_token_id=None)
    step = compile_lingc(model, role="decode", fail_on_recompile=True)
    cache = Ling3Cache.allocate(model.config, 32)
    with torch.no_grad():
        logits, _ = prefill(model, cache, prompt)
        out = [int(logits.argmax())]
        for i in range(steps - 1):
            lg, _ = step(torch.tensor([out[-1]]), torch.tensor([12 + i]), cache)
            out.append(int(lg[0].argmax()))
    return out, want


def final_graph_text(report) -> str:
    """The final graph's dump of a report compiled with dump_dir."""
    from pathlib import Path
    return (Path(report.dump_dir) / "99-final.txt").read_text()


def stat(report, name):
    return next(s for s in report.stats if s.name == name)


def dump_op_changes(dump_root, report, pass_name: str) -> str:
    """What one pass changed in a dumped graph, as "+op n" / "-op n" lines sorted by op: the
    nodes its after-dump has and its before-dump lacks, by target (a readable pin of a pass that
    rewrites hundreds of nodes, where the whole diff would be noise)."""
    import difflib
    from collections import Counter
    from pathlib import Path

    d = Path(dump_root) / report.dump_dir.split("/")[-1]
    before = next(d.glob(f"*-{pass_name}.before.txt")).read_text().splitlines()
    after = next(d.glob(f"*-{pass_name}.after.txt")).read_text().splitlines()
    counts = Counter()
    for line in difflib.unified_diff(before, after, n=0, lineterm=""):
        if line.startswith(("+++", "---")) or "= " not in line or line[0] not in "+-":
            continue
        counts[(line[0], line.split("= ", 1)[1].split("(")[0])] += 1
    return "".join(f"{sign}{op} {n}\n" for (sign, op), n in sorted(counts.items(), key=lambda kv: (kv[0][1], kv[0][0])))


# Expect tests of printed graphs are pinned on the CPU / torch 2.13 path (design.md): other torch
# versions name and order nodes differently.
import pytest  # noqa: E402

from lingc.compat import TORCH_VERSION  # noqa: E402

pinned_graph_text = pytest.mark.skipif(TORCH_VERSION != (2, 13),
                                       reason="graph text is pinned on torch 2.13")
