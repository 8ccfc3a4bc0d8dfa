"""MoE layer micro-benchmark: lingc's router + fused experts vs the eager module and Inductor.

    python -m benchmarks.kernels_moe --out benchmarks/results [--preset flash-tp4-rank] [--layers 40]
    python -m benchmarks.kernels_moe --out /tmp/moe --smoke      # CPU, tiny preset, no GPU timing

The whole MoE layer (router gate + grouped top-k, routed experts, shared expert, combine) of the
preset (flash-tp4-rank: 512 experts of I = 192, top-8, shared expert 192, H = 2560, bf16) for
T in {1, 6} tokens. Variants:

- ``lingc``         torch.ops.lingc.moe_router + torch.ops.lingc.moe_experts (5 launches: router
                    logits and selection, moe_align, up-GEMM, down-GEMM + combine; 4 for one
                    token, which needs no moe_align), PDL-chained where supported
- ``lingc-no-pdl``  the same with LINGC_DISABLE_PDL=1 at capture
- ``eager``         the model's own ``lingc.models.moe.MoE`` module (gather + bmm formulation)
- ``inductor``      ``torch.compile`` (default mode) of that module's forward, the layer's
                    parameters passed as inputs (``functional_call``) so the layers share graphs
- ``inductor-max-autotune`` the same in ``max-autotune-no-cudagraphs`` mode

Conditions (benchmarks/common.py): cold weights, as in the model: ``--layers`` distinct MoE
layers (default 40, Ling-3-flash's MoE layers 2..41 with their SwiGLU clamps), each with its own
router, experts, shared expert and input, called in turn inside one CUDA graph timed with CUDA
events (median over replays); copy bandwidth measured in the same run. The floor of a layer is
the bytes it must read (router weight + bias, the distinct experts its tokens select, the shared
expert) over the copy bandwidth; reported per variant: us per layer, achieved GB/s on those
bytes, fraction of copy bandwidth, multiple of the floor, speedup over eager and over the best
Inductor mode.

Correctness first, on every layer: each variant's output against the per-token fp32 reference
(``moe_experts_reference``) under the routing that variant computes (lingc's fp32-accumulated
router, the eager ``Router`` with ``--router-dtype``, or the router Inductor compiled; they may
differ on near-ties, which is why each is checked against its own). If one fails, or Inductor
compiled more graphs than there are distinct clamp settings, no speedup is printed and the exit
status is 1. Targets (issue 5):
lingc T=1 within 1.5x of the floor, T=6 within 1.3x, and at least 3x faster than the best
Inductor mode at T=6.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import time
from pathlib import Path

import torch
from torch.func import functional_call

from benchmarks.common import copy_bandwidth_gbps, markdown_table, require_cuda, time_in_graph, write_json
from lingc.models.config import preset
from lingc.models.moe import MOE_CHUNK, MoE
from lingc.runtime.kernels.moe_experts import moe_experts_reference
from lingc.runtime.kernels.moe_experts.kernel import config_for
from lingc.runtime.kernels.moe_router import moe_router  # noqa: F401  (registers lingc::moe_router)

RTOL_RMS = {"lingc": 5e-3, "lingc-no-pdl": 5e-3, "eager": 1e-2, "inductor": 1e-2, "inductor-max-autotune": 1e-2}
TARGET_FLOOR = {1: 1.5, 6: 1.3}
TARGET_VS_INDUCTOR = {6: 3.0}
SMOKE = dict(preset="tiny", layers=5, t=[1, 6])  # layers 1..5: three clamp groups


# ----------------------------------------------------------------------------------------------
# Layers and variants.


def build_layers(cfg, n_layers: int, device, seed: int = 0) -> list[MoE]:
    """``n_layers`` MoE layers with random weights (layer ids from first_k_dense_replace on, so
    each keeps the preset's clamp limits), built directly on ``device``."""
    layer_ids = list(range(cfg.first_k_dense_replace, cfg.num_hidden_layers))
    if n_layers > len(layer_ids):
        raise SystemExit(f"--layers {n_layers}: the preset has only {len(layer_ids)} MoE layers")
    gen = torch.Generator(device=device).manual_seed(seed)
    h, inter = cfg.hidden_size, cfg.moe_intermediate_size
    scales = {"gate.weight": h**-0.5, "gate.expert_bias": 0.1, "experts.w13": h**-0.5, "experts.w2": inter**-0.5,
              "shared_experts.gate_proj.weight": h**-0.5, "shared_experts.up_proj.weight": h**-0.5,
              "shared_experts.down_proj.weight": cfg.moe_shared_expert_intermediate_size**-0.5}
    layers = []
    with torch.device(device):
        for layer_id in layer_ids[:n_layers]:
            moe = MoE(cfg, layer_id).eval()
            moe.layer_id = layer_id
            for name, p in moe.named_parameters():
                p.data.normal_(0.0, scales[name], generator=gen)
            layers.append(moe)
    return layers


def lingc_layer(x: torch.Tensor, moe: MoE) -> torch.Tensor:
    """The MoE layer on lingc's ops: router, then align + experts + shared + combine."""
    cfg, inter, s = moe.gate.cfg, moe.experts.inter, moe.shared_experts
    ids, w = torch.ops.lingc.moe_router(x, moe.gate.weight, moe.gate.expert_bias, cfg.n_group, cfg.topk_group,
                                        cfg.num_experts_per_tok, cfg.routed_scaling_factor, cfg.norm_topk_prob)
    w13 = moe.experts.w13
    return torch.ops.lingc.moe_experts(x, ids, w, w13[:, :inter], w13[:, inter:], moe.experts.w2,
                                       s.gate_proj.weight, s.up_proj.weight, s.down_proj.weight,
                                       moe.experts.limit, s.limit)


def lingc_routing(x: torch.Tensor, moe: MoE):
    cfg = moe.gate.cfg
    return torch.ops.lingc.moe_router(x, moe.gate.weight, moe.gate.expert_bias, cfg.n_group, cfg.topk_group,
                                      cfg.num_experts_per_tok, cfg.routed_scaling_factor, cfg.norm_topk_prob)


class _Routed(torch.nn.Module):
    """MoE.routed_chunk as a module's forward (one chunk, no tensor parallelism: the benchmark's
    T <= MOE_CHUNK on one GPU): the output with the routing it used, since a compiled router may
    break a near-tie the other way than the eager one, so Inductor is checked under its own
    routing, like lingc."""

    def __init__(self, moe: MoE):
        super().__init__()
        self.m = moe

    def forward(self, x: torch.Tensor):
        return self.m.routed_chunk(x)


def _functional_moe(template: _Routed, params: dict, x: torch.Tensor):
    return functional_call(template, params, (x,))


class InductorLayer:
    """torch.compile of the eager module's forward with the layer's parameters as graph inputs.

    The clamp limits are Python floats on the module, so layers are grouped by (limit,
    shared_limit) and each group runs through its own template module, built on the meta device
    (a template owning one layer's real parameters would get a graph of its own: Dynamo guards on
    ``functional_call`` swapping a parameter for itself). One graph per group and token count."""

    def __init__(self, layers: list[MoE], mode: str | None):
        # Every (group, T, mode) is one cache entry on the same function: Ling-3-flash has 4 clamp
        # groups, so 2 token counts x 2 modes would pass Dynamo's default limit of 8 entries and
        # fall back to eager without an error.
        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)
        self.compiled = torch.compile(_functional_moe, dynamic=False, mode=mode)
        self.templates, self.params = {}, {}
        for moe in layers:
            if moe.tp.enabled:
                raise ValueError("kernels_moe's Inductor layer is MoE._forward on one GPU: build the layers "
                                 "without tensor parallelism")
            key = (moe.experts.limit, moe.shared_experts.limit)
            if key not in self.templates:
                with torch.device("meta"):
                    self.templates[key] = _Routed(MoE(moe.gate.cfg, moe.layer_id).eval())
            self.params[id(moe)] = (self.templates[key], {f"m.{n}": p for n, p in moe.named_parameters()})

    def __call__(self, x: torch.Tensor, moe: MoE) -> torch.Tensor:
        return self.routed(x, moe)[0]

    def routing(self, x: torch.Tensor, moe: MoE):
        """The (ids, weights) this compiled layer computes for x (deterministic: the same as in
        the call that is checked)."""
        return self.routed(x, moe)[1:]

    def routed(self, x: torch.Tensor, moe: MoE):
        if x.shape[0] > MOE_CHUNK:
            raise ValueError(f"T = {x.shape[0]}: kernels_moe's Inductor layer runs MoE._forward on one chunk "
                             f"of at most MOE_CHUNK = {MOE_CHUNK} tokens")
        template, params = self.params[id(moe)]
        return self.compiled(template, params, x)


@contextlib.contextmanager
def pdl_disabled():
    old = os.environ.get("LINGC_DISABLE_PDL")
    os.environ["LINGC_DISABLE_PDL"] = "1"
    try:
        yield
    finally:
        if old is None:
            del os.environ["LINGC_DISABLE_PDL"]
        else:
            os.environ["LINGC_DISABLE_PDL"] = old


def make_variants(layers: list[MoE], inductor_modes: list[str]) -> dict:
    """name -> (fn(x, moe), routing(x, moe) -> (ids, weights), context manager factory)."""
    eager_routing = lambda x, moe: moe.gate(x)  # noqa: E731
    v = {
        "lingc": (lingc_layer, lingc_routing, contextlib.nullcontext),
        "lingc-no-pdl": (lingc_layer, lingc_routing, pdl_disabled),
        "eager": (lambda x, moe: moe(x), eager_routing, contextlib.nullcontext),
    }
    for mode in inductor_modes:
        name = "inductor" if mode == "default" else f"inductor-{mode}"
        compiled = InductorLayer(layers, None if mode == "default" else f"{mode}-no-cudagraphs")
        v[name] = (compiled, compiled.routing, contextlib.nullcontext)
    return v


# ----------------------------------------------------------------------------------------------
# Bytes, correctness, timing.


def layer_bytes(moe: MoE, ids: torch.Tensor) -> int:
    """Bytes one call must read: router weight + bias, the distinct selected experts, the shared
    expert."""
    e_size = moe.experts.w13[0].numel() * moe.experts.w13.element_size() + moe.experts.w2[0].nbytes
    shared = sum(p.nbytes for p in moe.shared_experts.parameters())
    distinct = int(torch.unique(ids).numel())
    return moe.gate.weight.nbytes + moe.gate.expert_bias.nbytes + distinct * e_size + shared


def reference_layer(x: torch.Tensor, moe: MoE, ids: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    inter, s = moe.experts.inter, moe.shared_experts
    w13 = moe.experts.w13
    return moe_experts_reference(x, ids.int(), w.float(), w13[:, :inter], w13[:, inter:], moe.experts.w2,
                                 s.gate_proj.weight, s.up_proj.weight, s.down_proj.weight,
                                 moe.experts.limit, s.limit)


def rel_rms(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    return ((a - b).pow(2).mean().sqrt() / b.pow(2).mean().sqrt()).item()


def check_variant(fn, routing, ctx, xs, layers) -> float:
    """Worst relative RMS error over the layers (every layer also warms up / compiles here)."""
    worst = 0.0
    with ctx(), torch.no_grad():
        for x, moe in zip(xs, layers):
            ids, w = routing(x, moe)
            worst = max(worst, rel_rms(fn(x, moe), reference_layer(x, moe, ids, w)))
    return worst


def wall_time_us(fn, arg_sets, reps: int) -> float:
    """CPU smoke timing: median wall time per call (meaningless as a number, exercises the path)."""
    per_call = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for args in arg_sets:
            fn(*args)
        per_call.append((time.perf_counter() - t0) * 1e6 / len(arg_sets))
    return statistics.median(per_call)


def bench(cfg, layers, ts, copy_gbps, replays, inductor_modes, smoke):
    device = layers[0].gate.weight.device
    gen = torch.Generator(device=device).manual_seed(1)
    variants = make_variants(layers, inductor_modes)
    graphs_before = _dynamo_graphs()
    rows, floors = [], {}
    for t in ts:
        xs = [torch.randn(t, cfg.hidden_size, generator=gen, device=device).to(cfg.dtype) for _ in layers]
        with torch.no_grad():
            nbytes = statistics.mean(layer_bytes(moe, lingc_routing(x, moe)[0]) for x, moe in zip(xs, layers))
        floor_us = nbytes / (copy_gbps * 1e9) * 1e6
        floors[t] = {"bytes": nbytes, "floor_us": floor_us}
        timed = {}
        for name, (fn, routing, ctx) in variants.items():
            err = check_variant(fn, routing, ctx, xs, layers)
            with ctx(), torch.no_grad():
                if smoke:
                    us, us_min = wall_time_us(fn, list(zip(xs, layers)), 3), None
                else:
                    timing = time_in_graph(fn, list(zip(xs, layers)), replays=replays)
                    us, us_min = timing.us_per_call, timing.us_per_call_min
            timed[name] = us
            gbps = nbytes / (us * 1e-6) / 1e9
            rows.append({"T": t, "variant": name, "us": us, "us_min": us_min, "layers": len(layers),
                         "bytes_mb": nbytes / 1e6, "floor_us": floor_us, "gbps": gbps,
                         "copy_fraction": gbps / copy_gbps, "x_floor": us / floor_us,
                         "rel_rms_err": err, "correct": err <= RTOL_RMS[name]})
        best_inductor = min((timed[n] for n in timed if n.startswith("inductor")), default=None)
        for row in rows[-len(timed):]:
            row["speedup_vs_eager"] = timed["eager"] / row["us"]
            if best_inductor is not None:
                row["speedup_vs_inductor_best"] = best_inductor / row["us"]
    inductor_graphs = _dynamo_graphs() - graphs_before
    groups = len({(m.experts.limit, m.shared_experts.limit) for m in layers})
    return rows, floors, inductor_graphs, groups


def _dynamo_graphs() -> int:
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


def targets(rows) -> list[str]:
    lines = []
    for r in rows:
        if r["variant"] != "lingc":
            continue
        if r["T"] in TARGET_FLOOR:
            goal = TARGET_FLOOR[r["T"]]
            lines.append(f"- T={r['T']}: {r['x_floor']:.2f}x the floor (target <= {goal}x): "
                         f"{'met' if r['x_floor'] <= goal else 'MISSED'}")
        if r["T"] in TARGET_VS_INDUCTOR and "speedup_vs_inductor_best" in r:
            goal = TARGET_VS_INDUCTOR[r["T"]]
            s = r["speedup_vs_inductor_best"]
            lines.append(f"- T={r['T']}: {s:.2f}x faster than the best Inductor mode (target >= {goal}x): "
                         f"{'met' if s >= goal else 'MISSED'}")
    return lines


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="folder for kernels_moe_<preset>.json")
    parser.add_argument("--preset", default="flash-tp4-rank")
    parser.add_argument("--layers", type=int, default=40, help="distinct MoE layers rotated through (cold weights)")
    parser.add_argument("--t", type=int, nargs="+", default=[1, 6], help="token counts (default 1 6)")
    parser.add_argument("--replays", type=int, default=30, help="graph replays per timing")
    parser.add_argument("--router-dtype", choices=["bf16", "fp32"], default="bf16",
                        help="the eager Router's gate dtype (lingc's router always accumulates bf16 in fp32)")
    parser.add_argument("--inductor", nargs="*", default=["default", "max-autotune"],
                        choices=["default", "max-autotune"], help="Inductor modes (none: skip Inductor)")
    parser.add_argument("--smoke", action="store_true",
                        help="CPU smoke run: tiny preset in bf16, 5 layers, wall-clock timing, default Inductor only")
    args = parser.parse_args(argv)
    if args.smoke:
        args.preset, args.layers, args.t = SMOKE["preset"], SMOKE["layers"], SMOKE["t"]
        args.inductor = [m for m in args.inductor if m == "default"]
        device, copy_gbps = torch.device("cpu"), 1.0
    else:
        device = require_cuda()
        copy_gbps = copy_bandwidth_gbps()
    cfg = preset(args.preset, torch_dtype="bfloat16", router_dtype=args.router_dtype)

    layers = build_layers(cfg, args.layers, device)
    rows, floors, inductor_graphs, groups = bench(cfg, layers, args.t, copy_gbps, args.replays, args.inductor,
                                                  args.smoke)

    all_correct = all(r["correct"] for r in rows)
    problems = [f"T={r['T']} {r['variant']} (rel RMS {r['rel_rms_err']:.2e})" for r in rows if not r["correct"]]
    expected_graphs = groups * len(args.inductor) * len(args.t)
    if inductor_graphs > expected_graphs:
        all_correct = False
        problems.append(f"Inductor compiled {inductor_graphs} graphs, expected {expected_graphs} (clamp groups x "
                        f"modes x token counts): it recompiles per layer, so its timing is not of one graph")
    if not all_correct:
        for r in rows:
            r.pop("speedup_vs_eager", None)
            r.pop("speedup_vs_inductor_best", None)
        print("CORRECTNESS CHECK FAILED, speedups withheld: " + "; ".join(problems))
    print(f"copy bandwidth (read + write): {copy_gbps:.0f} GB/s" + (" (smoke: not measured)" if args.smoke else ""))
    for t, f in floors.items():
        print(f"T={t}: {f['bytes'] / 1e6:.1f} MB must be read per layer, floor {f['floor_us']:.2f} us")
    print()
    print(markdown_table(rows, [
        ("T", "T", "d"), ("variant", "variant", "s"), ("us", "us/layer", ".2f"), ("gbps", "GB/s", ".0f"),
        ("copy_fraction", "of copy BW", ".0%"), ("x_floor", "x floor", ".2f"),
        ("speedup_vs_eager", "x vs eager", ".2f"), ("speedup_vs_inductor_best", "x vs Inductor best", ".2f"),
        ("rel_rms_err", "rel RMS err", ".1e"),
    ]))
    goals = targets(rows) if all_correct else []
    if goals:
        print("\ntargets:\n" + "\n".join(goals))
    n_max = max(cfg.moe_intermediate_size, cfg.moe_shared_expert_intermediate_size)
    payload = {
        "benchmark": "kernels_moe", "preset": args.preset, "dtype": "bfloat16", "router_dtype": args.router_dtype,
        "layers": args.layers, "copy_gbps": copy_gbps, "floors": floors, "rtol_rms": RTOL_RMS,
        "all_correct": all_correct, "problems": problems, "inductor_graphs": inductor_graphs,
        "clamp_groups": groups, "config": config_for(n_max, cfg.hidden_size), "targets": goals, "rows": rows,
    }
    name = f"kernels_moe_{args.preset}.json"
    if args.smoke:
        path = args.out / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"environment": {"smoke": "cpu"}, **payload}, indent=2, default=str))
    else:
        path = write_json(args.out / name, payload)
    print(f"\nwrote {path}")
    return 0 if all_correct else 1


if __name__ == "__main__":
    raise SystemExit(main())
