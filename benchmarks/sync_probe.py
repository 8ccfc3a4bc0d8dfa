"""Probe: what does one grid-wide synchronisation cost on this GPU, as a kernel boundary (with and
without PDL) and as a software barrier inside one persistent kernel?

    python -m benchmarks.sync_probe --out DIR [--programs 132 264] [--phases 64]

A decode step is a chain of ~420 (plain) to ~500 (verify) kernels, and the small ones are bound by
latency rather than bytes (Nsight Compute, sessions 9, 15 and 21): each kernel boundary is a
grid-wide synchronisation. This probe times that synchronisation alone. G programs (one warp
each) run `phases` dependent phases; in phase k program i reads the value program i + 1 wrote in
phase k - 1 (so each phase really needs the previous one complete everywhere), adds one and
writes its own slot (two buffers, alternating). Three forms of the same phases:

- ``pdl``: one kernel launch per phase, chained with PDL as lingc's kernels are (wait at entry,
  release right after), all launches in one CUDA graph;
- ``plain``: the same launches without PDL;
- ``barrier``: one persistent launch of G programs (all resident: G <= SMs x occupancy), the
  phases separated by a barrier on a global counter (release add, acquire spin); the last
  program out resets the counters for the next replay.

Output: us per phase (graph time / phases, median of replays) for each form and G, a markdown
table and JSON. Every run checks the values the phases computed (program i ends with
``(i + phases) % G + phases``), so a barrier that let a phase through early is reported, not
timed. If a barrier costs well under a PDL boundary, fusing a layer's kernels into one
persistent kernel can pay where fusing two kernels into one (sessions 9-20) did not.

The chain forms run under the CPU interpreter (the tests use them); the barrier form needs a GPU,
since an interpreted grid runs its programs one after another and the first would wait forever.
"""
from __future__ import annotations

import argparse
from pathlib import Path

import torch
import triton
import triton.language as tl

from benchmarks.common import environment, markdown_table, require_cuda, time_in_graph, write_json
from lingc.runtime.pdl import interpreting, pdl_launch_dependents, pdl_wait

FORMS = ("pdl", "plain", "barrier")


@triton.jit
def _sync_phase_kernel(src_ptr, dst_ptr, G, USE_GDC: tl.constexpr):
    """One phase as one launch: dst[i] = src[(i + 1) % G] + 1."""
    i = tl.program_id(0)
    pdl_wait(USE_GDC)
    pdl_launch_dependents(USE_GDC)
    tl.store(dst_ptr + i, tl.load(src_ptr + (i + 1) % G) + 1)


@triton.jit
def _sync_barrier_kernel(buf_ptr, count_ptr, exit_ptr, G, PHASES):
    """All phases in one launch of G resident programs; buf is [2, G], phase k reads row k % 2 and
    writes row (k + 1) % 2, then waits until every program has written (counter >= (k + 1) G)."""
    i = tl.program_id(0)
    for k in range(PHASES):
        src = buf_ptr + (k % 2) * G
        dst = buf_ptr + ((k + 1) % 2) * G
        tl.store(dst + i, tl.load(src + (i + 1) % G, volatile=True) + 1)
        # Release: this program's store is visible before its arrival counts. The CTA barriers
        # order the store and the next load against the one thread that does the atomics.
        tl.debug_barrier()
        tl.atomic_add(count_ptr, 1, sem="release", scope="gpu")
        target = (k + 1) * G
        seen = tl.atomic_add(count_ptr, 0, sem="acquire", scope="gpu")
        while seen < target:
            seen = tl.atomic_add(count_ptr, 0, sem="acquire", scope="gpu")
        tl.debug_barrier()
    # Every program has passed the last barrier before it takes an exit ticket, so the last one
    # out can reset both counters for the next launch (a graph replay) without racing a spinner.
    if tl.atomic_add(exit_ptr, 1, sem="acq_rel", scope="gpu") == G - 1:
        tl.atomic_xchg(count_ptr, 0, sem="relaxed", scope="gpu")
        tl.atomic_xchg(exit_ptr, 0, sem="relaxed", scope="gpu")


def chain_phase(src: torch.Tensor, dst: torch.Tensor, use_pdl: bool) -> None:
    """One phase of the chain forms over G = src.numel() programs (int32 buffers)."""
    _sync_phase_kernel[(src.numel(),)](src, dst, src.numel(), USE_GDC=use_pdl, num_warps=1,
                                       **({"launch_pdl": True} if use_pdl else {}))


def barrier_phases(buf: torch.Tensor, counters: torch.Tensor, phases: int) -> None:
    """All phases of the barrier form: buf int32 [2, G], counters int32 [2] (zero on entry; left
    zero on exit)."""
    if interpreting():
        raise RuntimeError("the barrier form needs a GPU: the interpreter runs a grid's programs one "
                           "after another, so the first program's barrier would wait forever")
    G = buf.shape[1]
    _sync_barrier_kernel[(G,)](buf, counters, counters[1:], G, phases, num_warps=1)


def expected(G: int, phases: int, device) -> torch.Tensor:
    """Program i's value after `phases` phases from arange(G)."""
    return (torch.arange(G, device=device) + phases) % G + phases


def run_form(form: str, G: int, phases: int, device, replays: int = 20) -> tuple[float | None, bool]:
    """(us per phase, whether the values were right) for one form at G programs. Timed only on a
    GPU (one CUDA graph of all phases, replayed); on the CPU the phases run once for the check."""
    buf = torch.zeros(2, G, dtype=torch.int32, device=device)
    counters = torch.zeros(2, dtype=torch.int32, device=device)

    def once():
        buf[0].copy_(torch.arange(G, dtype=torch.int32, device=device))
        if form == "barrier":
            barrier_phases(buf, counters, phases)
        else:
            for k in range(phases):      # (no PDL in the CPU interpreter)
                chain_phase(buf[k % 2], buf[(k + 1) % 2], form == "pdl" and device.type == "cuda")

    once()
    if device.type == "cuda":
        torch.cuda.synchronize()
    ok = torch.equal(buf[phases % 2].long().cpu(), expected(G, phases, "cpu"))
    if device.type != "cuda" or not ok:
        return None, ok
    # The graph holds the reset copy plus the phases; its time over the phases is the phase cost
    # (the copy is one small node among 64-plus).
    t = time_in_graph(once, [()], calls_per_graph=1, replays=replays)
    ok = torch.equal(buf[phases % 2].long().cpu(), expected(G, phases, "cpu"))
    return t.us_per_call / phases, ok


def table(rows: list[dict]) -> str:
    """The markdown table of run rows (form, programs, phases, us, correct)."""
    shown = [dict(r, check="yes" if r["correct"] else "NO: a phase saw stale values") for r in rows]
    return markdown_table(shown, [("form", "form", "s"), ("programs", "programs", "d"), ("phases", "phases", "d"),
                                  ("us", "us per phase", ".2f"), ("check", "values right", "s")])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--programs", type=int, nargs="+", default=None,
                    help="grid sizes G (default: the SM count and twice it)")
    ap.add_argument("--phases", type=int, default=64)
    ap.add_argument("--replays", type=int, default=20)
    args = ap.parse_args(argv)
    dev = require_cuda()
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    programs = args.programs or [sms, 2 * sms]
    rows = []
    for G in programs:
        for form in FORMS:
            if form == "barrier" and G > sms * 8:
                continue     # not all resident at one warp per program: the barrier would hang
            us, ok = run_form(form, G, args.phases, dev, args.replays)
            rows.append(dict(form=form, programs=G, phases=args.phases, us=us, correct=ok))
            print(rows[-1], flush=True)
    print(table(rows))
    args.out.mkdir(parents=True, exist_ok=True)
    write_json(args.out / "sync_probe.json", dict(environment=environment(), sms=sms, rows=rows))
    print(f"wrote {args.out / 'sync_probe.json'}")
    return 0 if all(r["correct"] for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
