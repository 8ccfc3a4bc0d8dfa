"""Speculative sampling's verify outcome (``lingc.sampled_targets``) against the same math as ATen
ops (the reference, runtime/relay/sampling.py: a softmax, a sort and full-row scans) and,
with --inductor, that reference under torch.compile.

    python -m benchmarks.kernels_sampling --out DIR [--rows 4 6] [--vocab 39296 157184] [--inductor]

Shapes: a verify chain of S + 1 rows (4: the relay's default steps = 3; 6: steps = 5) over
flash-tp4-rank's 39296-row lm_head shard or the whole 157184-token vocabulary, fp32 logits.
Variants: ``lingc`` (top_p 0.9: the four passes of the nucleus search), ``lingc top_p=1`` (no
nucleus: passes 1-3 exit at once), ``lingc top_p=None`` (no nucleus known at launch: pass 0
alone), ``lingc-no-pdl`` (top_p 0.9, launched without PDL),
``aten`` and ``inductor`` (the reference, top_p 0.9). Each call is timed inside one CUDA graph
(median over replays), over one set of logits: in a verify step the logits were just written by
the lm_head and sit in L2, so cold logits would not be the real condition. The floor is one read
of the logits at the copy bandwidth measured in the same run (for these sizes the time is
latency, not bytes). Every variant's tokens are checked against the CPU reference first.
"""
from __future__ import annotations

import argparse
import functools
from pathlib import Path

import torch

from benchmarks.common import copy_bandwidth_gbps, markdown_table, require_cuda, time_in_graph, write_json
from lingc.runtime.kernels.sampled_targets.kernel import sampled_targets_triton
from lingc.runtime.relay import ops


def _inputs(rows: int, vocab: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(rows, vocab, generator=g) * 3
    chain = torch.randint(0, vocab, (rows,), generator=g)
    chain[1:] = logits[:-1].argmax(-1)
    u = torch.rand(rows, generator=g)
    return chain, logits, u


def _reference(chain, logits, uniforms, step, temperature, top_p):
    """The op's math as ATen ops (the op's CPU path), with the step's row picked as the op does."""
    u = ops.step_uniforms(uniforms, step, chain.shape[0])
    return ops.sampled_targets_reference(chain, logits, u, temperature, top_p)


def bench(rows: int, vocab: int, replays: int, inductor: bool, gbps: float) -> list[dict]:
    chain, logits, u = _inputs(rows, vocab, seed=rows * 7 + vocab)
    dev = [chain.cuda(), logits.cuda(), u[None].cuda(), torch.zeros(1, dtype=torch.int64, device="cuda")]
    t = torch.tensor([0.8], device="cuda")
    p_nucleus, p_all = torch.tensor([0.9], device="cuda"), torch.tensor([1.0], device="cuda")
    lingc = torch.ops.lingc.sampled_targets
    variants = {
        "lingc": (lingc, p_nucleus),
        "lingc top_p=1": (lingc, p_all),
        "lingc top_p=None": (lingc, None),
        "lingc-no-pdl": (functools.partial(sampled_targets_triton, use_pdl=False), p_nucleus),
        "aten": (_reference, p_nucleus),
    }
    if inductor:
        variants["inductor"] = (torch.compile(_reference, dynamic=False), p_nucleus)
    floor_us = rows * vocab * 4 / (gbps * 1e9) * 1e6
    out = []
    for name, (fn, p) in variants.items():
        want = ops.sampled_targets_reference(chain, logits, u, torch.tensor([0.8]), None if p is None else p.cpu())
        try:
            got = fn(*dev, t, p).cpu()
            timing = time_in_graph(fn, [(*dev, t, p)], calls_per_graph=20, replays=replays)
        except Exception as e:      # a baseline that does not compile (Inductor) is reported, not fatal
            if name.startswith("lingc"):
                raise
            print(f"rows={rows} vocab={vocab} {name}: FAILED ({type(e).__name__}: {str(e).splitlines()[0][:200]})")
            out.append({"rows": rows, "vocab": vocab, "variant": name, "us": None, "correct": None,
                        "error": f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"})
            continue
        out.append({"rows": rows, "vocab": vocab, "variant": name, "us": timing.us_per_call,
                    "us_min": timing.us_per_call_min, "floor_us": floor_us, "x_floor": timing.us_per_call / floor_us,
                    "correct": bool(torch.equal(got, want))})
    aten_us = next(r["us"] for r in out if r["variant"] == "aten")
    for r in out:
        if r["us"] is not None:
            r["speedup_vs_aten"] = aten_us / r["us"]
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="folder for kernels_sampling.json")
    parser.add_argument("--rows", type=int, nargs="+", default=[4, 6], help="chain rows S + 1 (default 4 6)")
    parser.add_argument("--vocab", type=int, nargs="+", default=[39296, 157184])
    parser.add_argument("--replays", type=int, default=30, help="graph replays per timing")
    parser.add_argument("--inductor", action="store_true", help="add the reference under torch.compile")
    args = parser.parse_args(argv)
    require_cuda()
    gbps = copy_bandwidth_gbps()
    rows = []
    for n in args.rows:
        for v in args.vocab:
            rows += bench(n, v, args.replays, args.inductor, gbps)
    all_correct = all(r["correct"] for r in rows if r["correct"] is not None)
    if not all_correct:
        print("CORRECTNESS CHECK FAILED for: " + "; ".join(
            f"rows={r['rows']} vocab={r['vocab']} {r['variant']}" for r in rows if r["correct"] is False))
    print(markdown_table(rows, [
        ("rows", "rows", "d"), ("vocab", "vocab", "d"), ("variant", "variant", "s"), ("us", "us", ".2f"),
        ("us_min", "min", ".2f"), ("floor_us", "floor us", ".2f"), ("x_floor", "x floor", ".1f"),
        ("speedup_vs_aten", "x vs aten", ".1f"), ("correct", "tokens == reference", ""),
    ]))
    path = write_json(args.out / "kernels_sampling.json", {
        "benchmark": "kernels_sampling", "copy_gbps": gbps, "temperature": 0.8, "all_correct": all_correct,
        "rows": rows,
    })
    print(f"\nwrote {path}")
    return 0 if all_correct else 1


if __name__ == "__main__":
    raise SystemExit(main())
