"""Qwen3-Next's MoE block on lingc's kernels vs Transformers' formulation of it.

    python -m benchmarks.kernels_qwen3_moe --out DIR [--t 1 6] [--layers 40]
    python -m benchmarks.kernels_qwen3_moe --out DIR --smoke      # CPU, small shapes, no timing

Shape: one Qwen3-Next-80B MoE layer on one GPU of four (tensor parallel over the experts'
intermediate size): 512 experts of I = 512 / 4 = 128, top-10 by softmax with the top-k
probabilities renormalised, H = 2048, a shared expert of Is = 128 behind a sigmoid gate
(``shared_expert_gate``, a Linear(H, 1)), bf16. Variants:

- ``lingc``  ``lingc.moe_router(..., softmax=True)`` (no bias: the persistent zero bias) and
             ``lingc.moe_experts(..., shared_sigmoid=gate)``: the gate's dot product and sigmoid
             in the combine; what fused_moe emits for the block (tests/test_fused_moe.py)
- ``eager``  the block as Transformers' batched experts write it: softmax over fp32 logits,
             top-k, renormalise, the selected experts gathered from the stacked weights and
             contracted by einsum, the gated shared expert by F.linear

Conditions as benchmarks/kernels_moe.py: ``--layers`` distinct layers (default 40; Qwen3-Next-80B
has 48) called in turn inside one CUDA graph (cold weights: each layer's experts are 805 MB),
medians over replays, the copy bandwidth measured in the same run; the floor of a layer is the
bytes it must read (router and gate weights, the distinct experts its tokens select, the shared
expert) over that bandwidth. Correctness first: each variant against the per-token fp32
reference (``moe_experts_reference`` with ``shared_sigmoid``) under the routing it computed.
"""
from __future__ import annotations

import argparse
import statistics
from pathlib import Path

import torch
import torch.nn.functional as F

from benchmarks.common import copy_bandwidth_gbps, markdown_table, rel_rms, require_cuda, time_in_graph, write_json
from lingc.runtime.kernels.moe_experts import moe_experts_reference
from lingc.runtime.kernels.moe_router import moe_router  # noqa: F401  (registers lingc::moe_router)

QWEN3_NEXT_TP4 = dict(E=512, K=10, H=2048, I=128)
SMOKE = dict(E=16, K=4, H=64, I=16)
RTOL_RMS = {"lingc": 5e-3, "eager": 1e-2}


def make_layer(shape: dict, gen: torch.Generator, device) -> dict:
    """One layer's weights (bf16): router [E, H], stacked w13 [E, 2I, H], w2 [E, H, I], the
    shared expert's gate / up [I, H] and down [H, I], its sigmoid gate [1, H]."""
    E, H, I = shape["E"], shape["H"], shape["I"]

    def r(*s, scale):
        return (torch.randn(*s, generator=gen, device=device) * scale).to(torch.bfloat16)

    return dict(router=r(E, H, scale=H ** -0.5 * 2), w13=r(E, 2 * I, H, scale=H ** -0.5),
                w2=r(E, H, I, scale=I ** -0.5), sg=r(I, H, scale=H ** -0.5), su=r(I, H, scale=H ** -0.5),
                sd=r(H, I, scale=I ** -0.5), gate=r(1, H, scale=H ** -0.5 * 2))


def lingc_routing(x, L, k):
    return torch.ops.lingc.moe_router(x, L["router"], None, 1, 1, k, 1.0, True, softmax=True)


def lingc(x, L, k):
    ids, w = lingc_routing(x, L, k)
    i = L["sg"].shape[0]
    return torch.ops.lingc.moe_experts(x, ids, w, L["w13"][:, :i], L["w13"][:, i:], L["w2"], L["sg"], L["su"],
                                       L["sd"], 0.0, 0.0, shared_sigmoid=L["gate"])


def eager_routing(x, L, k):
    probs = F.softmax(F.linear(x.float(), L["router"].float()), dim=-1)
    w, ids = torch.topk(probs, k, dim=-1)
    return ids, w / w.sum(-1, keepdim=True)


def eager(x, L, k):
    ids, w = eager_routing(x, L, k)
    i = L["sg"].shape[0]
    gu = torch.einsum("th,tkih->tki", x, L["w13"][ids])
    y = torch.einsum("tki,tkhi->tkh", F.silu(gu[..., :i]) * gu[..., i:], L["w2"][ids])
    shared = F.linear(F.silu(F.linear(x, L["sg"])) * F.linear(x, L["su"]), L["sd"])
    return (y * w.to(x.dtype)[..., None]).sum(1) + F.sigmoid(F.linear(x, L["gate"])) * shared


VARIANTS = {"lingc": (lingc, lingc_routing), "eager": (eager, eager_routing)}


def reference(x, L, ids, w):
    i = L["sg"].shape[0]
    return moe_experts_reference(x, ids.int(), w.float(), L["w13"][:, :i], L["w13"][:, i:], L["w2"], L["sg"],
                                 L["su"], L["sd"], 0.0, 0.0, shared_sigmoid=L["gate"])


def layer_bytes(L, ids) -> int:
    """Bytes a layer must read: router, gate, the distinct selected experts, the shared expert."""
    per_expert = (L["w13"][0].numel() + L["w2"][0].numel()) * 2
    shared = (L["sg"].numel() + L["su"].numel() + L["sd"].numel()) * 2
    return (L["router"].numel() + L["gate"].numel()) * 2 + per_expert * ids.unique().numel() + shared


def bench(shape, layers, ts, copy_gbps, replays, smoke, gen) -> list[dict]:
    k, device = shape["K"], layers[0]["router"].device
    rows = []
    for t in ts:
        xs = [torch.randn(t, shape["H"], generator=gen, device=device).to(torch.bfloat16) for _ in layers]
        with torch.no_grad():
            nbytes = statistics.mean(layer_bytes(L, lingc_routing(x, L, k)[0]) for x, L in zip(xs, layers))
        floor_us = nbytes / (copy_gbps * 1e9) * 1e6 if copy_gbps else None
        for name, (fn, routing) in VARIANTS.items():
            with torch.no_grad():
                err = max(rel_rms(fn(x, L, k), reference(x, L, *routing(x, L, k))) for x, L in zip(xs[:3], layers))
                us = us_min = None
                if not smoke:
                    tm = time_in_graph(lambda x, L: fn(x, L, k), list(zip(xs, layers)), replays=replays)
                    us, us_min = tm.us_per_call, tm.us_per_call_min
            row = {"T": t, "variant": name, "us": us, "us_min": us_min, "layers": len(layers),
                   "bytes_mb": nbytes / 1e6, "floor_us": floor_us, "rel_rms_err": err, "correct": err <= RTOL_RMS[name]}
            if us and floor_us:
                row["x_floor"] = us / floor_us
                row["copy_fraction"] = nbytes / (us * 1e-6) / 1e9 / copy_gbps
            rows.append(row)
        if not smoke:
            eager_us = next(r["us"] for r in rows[-len(VARIANTS):] if r["variant"] == "eager")
            for r in rows[-len(VARIANTS):]:
                r["speedup_vs_eager"] = eager_us / r["us"]
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="folder for kernels_qwen3_moe.json")
    parser.add_argument("--t", type=int, nargs="+", default=[1, 6], help="tokens per call (default 1 6)")
    parser.add_argument("--layers", type=int, default=40, help="distinct layers rotated (default 40)")
    parser.add_argument("--replays", type=int, default=30, help="graph replays per timing")
    parser.add_argument("--smoke", action="store_true", help="CPU, small shapes, 3 layers, correctness only")
    args = parser.parse_args(argv)
    if args.layers < 1:
        parser.error(f"--layers {args.layers}: need at least 1")
    shape = SMOKE if args.smoke else QWEN3_NEXT_TP4
    device = torch.device("cpu") if args.smoke else require_cuda()
    copy_gbps = None if args.smoke else copy_bandwidth_gbps()
    gen = torch.Generator(device=device).manual_seed(0)
    layers = [make_layer(shape, gen, device) for _ in range(3 if args.smoke else args.layers)]
    rows = bench(shape, layers, args.t, copy_gbps, args.replays, args.smoke, gen)
    all_correct = all(r["correct"] for r in rows)
    if not all_correct:
        print("CORRECTNESS CHECK FAILED for: " + "; ".join(
            f"T={r['T']} {r['variant']} (rel RMS {r['rel_rms_err']:.2e})" for r in rows if not r["correct"]))
    if copy_gbps:
        print(f"copy bandwidth {copy_gbps:.0f} GB/s")
    print(markdown_table(rows, [
        ("T", "T", "d"), ("variant", "variant", "s"), ("us", "us/layer", ".2f"), ("us_min", "min", ".2f"),
        ("floor_us", "floor us", ".2f"), ("x_floor", "x floor", ".2f"), ("copy_fraction", "of copy BW", ".0%"),
        ("speedup_vs_eager", "x vs eager", ".2f"), ("rel_rms_err", "rel RMS err", ".1e"), ("bytes_mb", "MB read", ".1f"),
    ]))
    path = write_json(args.out / "kernels_qwen3_moe.json", {
        "benchmark": "kernels_qwen3_moe", "shape": shape, "dtype": "bfloat16", "smoke": args.smoke,
        "copy_bandwidth_gbps": copy_gbps, "rtol_rms": RTOL_RMS, "all_correct": all_correct, "rows": rows,
    })
    print(f"\nwrote {path}")
    return 0 if all_correct else 1


if __name__ == "__main__":
    raise SystemExit(main())
