"""KDA chain micro-benchmark: lingc's fused kernel vs the eager kda_math path (and FLA as a peer).

    python -m benchmarks.kernels_kda --out benchmarks/results/kda [--bv 4 8 16 32] [--warps 1 2 4]

Shape: one flash-tp4-rank KDA layer (H=8 heads, K=V=128, conv width 4, bf16 projections, fp32
state), per layer, T=1 (decode: persistent mode, state updated in place) and T=6 (verify: staged
mode, every position's post-state written to a stage buffer; also the persistent mode and the
stage commit). Variants:

- ``lingc``        torch.ops.lingc.kda_chain's Triton kernel, PDL-launched where supported
- ``lingc-no-pdl`` the same kernel launched without PDL
- ``lingc-vk``     the table's config on a state stored [H, V, K] (``state_vk``: each head's state
                   transposed, read and written in place in that layout; Ling3Cache's layout
                   since session 45, so this is the row the model's decode runs)
- ``lingc-unfused`` the table's config with ``fused_reductions=False`` (four single reductions
                   per token instead of two multi-operand ones; other roundings, checked the same way)
- ``lingc-bvN``    the kernel at BV=N instead of the table's choice (``--bv``), for the table sweep
- ``lingc-bvN-wM`` BV=N at M warps per program (``--warps``; each swept BV, the table's BV if none)
- ``commit``       torch.ops.lingc.kda_commit's kernel (copy one stage position into the slot)
- ``eager``        the model's eager path: kda_math's short_conv / l2norm / kda_gate /
                   kda_recurrent on whole [T, ...] tensors, then the in-place state/window copies
- ``inductor``     (``--inductor``) torch.compile, default mode, of that eager path with the
                   layer's tensors as graph inputs (one graph serves every cold copy; its own
                   CUDA graphs off: the benchmark captures)
- ``fla``          flash-linear-attention's fused_recurrent_kda, when importable: recurrence only
                   (q/k/v after the conv and g precomputed outside the timing, L2 norm in the
                   kernel, state returned out of place), so it does less work than lingc

Conditions: cold states (each call in the graph reads a different layer's state, window, conv
weights and inputs: at least 35 layers, as many as needed to span L2 four times), every call
timed inside one CUDA graph of many calls with CUDA events, median over replays. Correctness is
checked first against the fp32 reference; an incorrect variant's timing is reported but flagged.
"""
from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path

import torch

from benchmarks.common import (cold_copies, markdown_table, peer_row, rel_rms, require_cuda, time_in_graph, to_cpu,
                               write_json)
from lingc.models.kda_math import kda_gate, kda_recurrent, l2norm, short_conv
from lingc.runtime.kernels.kda import kda_chain_reference
from lingc.runtime.kernels.kda.kernel import KdaConfig, config_for, kda_chain_triton, kda_commit_triton

H, K, W = 8, 128, 4
LOWER_BOUND = -5.0
MIN_LAYERS = 35          # the KDA layers of Ling-3-flash
RTOL_RMS = 1e-4


def _layer(T, gen, staged):
    """One layer's inputs, state, window and (staged) stage buffers on the GPU."""
    D = H * K

    def r(*shape, scale=1.0, dtype=torch.float32):
        return (torch.randn(*shape, generator=gen, device="cuda") * scale).to(dtype)

    bf = torch.bfloat16
    return dict(
        q_raw=r(T, D, dtype=bf), k_raw=r(T, D, dtype=bf), v_raw=r(T, D, dtype=bf), f_raw=r(T, D, dtype=bf),
        b_raw=r(T, H, dtype=bf), conv_w=r(3, D, W, scale=0.5), conv_window=r(3, D, W - 1, dtype=bf),
        a_log=r(H, scale=0.5), dt_bias=r(D, scale=0.5), state=r(H, K, K, scale=0.3),
        stage_states=torch.empty(T, H, K, K, device="cuda") if staged else None,
        stage_windows=torch.empty(T, 3, D, W - 1, device="cuda", dtype=bf) if staged else None,
        out=torch.empty(T, H, K, device="cuda"),
        index=torch.tensor(T - 1, device="cuda"),
    )


def _with_vk_state(x):
    """x with its state also stored [H, V, K] (``lingc-vk``'s copy)."""
    x["state_vk"] = x["state"].transpose(-1, -2).contiguous()
    return x


def _args(x):
    return (x["q_raw"], x["k_raw"], x["v_raw"], x["f_raw"], x["b_raw"], list(x["conv_w"].unbind(0)), x["conv_window"],
            x["a_log"], x["dt_bias"], x["state"], LOWER_BOUND)


_EAGER_INPUTS = ("q_raw", "k_raw", "v_raw", "f_raw", "b_raw", "conv_w", "conv_window", "a_log", "dt_bias", "state")


def _eager_math(q_raw, k_raw, v_raw, f_raw, b_raw, conv_w, conv_window, a_log, dt_bias, state):
    """lingc/models/kda.py's math on whole [T, ...] tensors, cache writes as copy_."""
    T = q_raw.shape[0]
    ys, wins = [], []
    for i, raw in enumerate((q_raw, k_raw, v_raw)):
        y, win = short_conv(raw, conv_window[i], conv_w[i])
        ys.append(y.view(T, H, K))
        wins.append(win)
    q, k = l2norm(ys[0]) * (K ** -0.5), l2norm(ys[1])
    g = kda_gate(f_raw.view(T, H, K), a_log, dt_bias, LOWER_BOUND)
    o, S = kda_recurrent(q, k, ys[2], g, torch.sigmoid(b_raw.float()), state)
    state.copy_(S)
    conv_window.copy_(torch.stack(wins, 0))
    return o


def _eager(x):
    return _eager_math(*(x[n] for n in _EAGER_INPUTS))


def _inductor():
    """torch.compile (default Inductor) of the eager path; its CUDA graphs are off (the benchmark
    captures), the layer's tensors are inputs so every cold copy runs the same compiled graph."""
    compiled = torch.compile(_eager_math, dynamic=False)
    return lambda x: compiled(*(x[n] for n in _EAGER_INPUTS))


def _fla_inputs(x):
    """Post-conv q/k/v and the gate for FLA's recurrence (computed once, outside the timing)."""
    T = x["q_raw"].shape[0]
    ys = [short_conv(x[n], x["conv_window"][i], x["conv_w"][i])[0].view(1, T, H, K)
          for i, n in enumerate(("q_raw", "k_raw", "v_raw"))]
    g = kda_gate(x["f_raw"].view(T, H, K), x["a_log"], x["dt_bias"], LOWER_BOUND).view(1, T, H, K)
    beta = torch.sigmoid(x["b_raw"].float()).view(1, T, H)
    return (*ys, g, beta, x["state"].view(1, H, K, K))


def _fla():
    try:
        from fla.ops.kda import fused_recurrent_kda
    except Exception:  # not installed, or an incompatible version
        return None

    def run(q, k, v, g, beta, h0):
        return fused_recurrent_kda(q, k, v, g, beta, scale=K ** -0.5, initial_state=h0,
                                   output_final_state=True, use_qk_l2norm_in_kernel=True)[0]
    return run


def bench_T(T, bvs, warps, replays, copies_override, inductor=False):
    gen = torch.Generator(device="cuda").manual_seed(T)
    staged = T > 1
    layer_bytes = (4 * H * K * K * (1 + (T if staged else 0)) + 3 * H * K * W * 4 + 5 * T * H * K * 2)
    copies = copies_override or max(MIN_LAYERS, cold_copies(layer_bytes))
    layers = [_with_vk_state(_layer(T, gen, staged)) for _ in range(copies)]
    x0 = layers[0]
    ref = kda_chain_reference(*(to_cpu(a) for a in _args(x0)))
    table = config_for(H, K, K)

    # As pdl_swap marks a model's chains: each call reads another layer copy's state, written
    # `copies` calls earlier, so the state may be read before the PDL wait (not with one copy).
    ready = copies > 1

    def lingc(cfg, pdl, stage, vk=False):
        def run(x):
            args = _args(x)
            if vk:
                args = (*args[:9], x["state_vk"], args[10])
            return kda_chain_triton(*args, x["stage_states"] if stage else None,
                                    x["stage_windows"] if stage else None, x["out"], config=cfg,
                                    state_ready=ready, use_pdl=None if pdl else False, state_vk=vk)
        return run

    variants = {}
    modes = [("staged", True), ("persistent", False)] if staged else [("persistent", False)]
    for mode, stage in modes:
        variants[(mode, "lingc")] = lingc(table, True, stage)
        variants[(mode, "lingc-no-pdl")] = lingc(table, False, stage)
        variants[(mode, "lingc-unfused")] = lingc(replace(table, fused_reductions=False), True, stage)
        variants[(mode, "lingc-vk")] = lingc(table, True, stage, vk=True)
        for bv in bvs:
            variants[(mode, f"lingc-bv{bv}")] = lingc(KdaConfig(bv=bv), True, stage)
        for bv in bvs or [table.bv]:
            for w in warps:
                variants[(mode, f"lingc-bv{bv}-w{w}")] = lingc(KdaConfig(bv=bv, num_warps=w), True, stage)
    variants[("persistent", "eager")] = _eager
    if inductor:
        variants[("persistent", "inductor")] = _inductor()
    if staged:
        variants[("commit", "commit")] = lambda x: kda_commit_triton(
            x["state"], x["conv_window"], x["stage_states"], x["stage_windows"], x["index"])
    fla = _fla()

    # Persistent variants update x0's state in place, in the check and in the timed replays: every
    # check starts from the pristine state the reference saw.
    pristine = (x0["state"].clone(), x0["conv_window"].clone(), x0["state_vk"].clone())

    def restore():
        x0["state"].copy_(pristine[0])
        x0["conv_window"].copy_(pristine[1])
        x0["state_vk"].copy_(pristine[2])

    rows = []
    for (mode, name), fn in variants.items():
        restore()
        err = None
        if mode != "commit":
            err = rel_rms(fn(x0), ref.o)
        restore()
        t = time_in_graph(fn, [(x,) for x in layers], replays=replays)
        rows.append({"T": T, "mode": mode, "variant": name, "us": t.us_per_call, "us_min": t.us_per_call_min,
                     "copies": copies, "rel_rms_err": err, "correct": err is None or err <= RTOL_RMS})
    if fla is not None:
        restore()
        row = peer_row("fla fused_recurrent_kda", fla, [_fla_inputs(x) for x in layers], ref.o, replays,
                       T=T, mode="recurrence-only", variant="fla", copies=copies)
        rows += [row] if row else []
    base = {name: next((r["us"] for r in rows if r["variant"] == name), None) for name in ("eager", "inductor")}
    for r in rows:
        if r["variant"].startswith("lingc"):
            for name, us in base.items():
                if us:
                    r[f"speedup_vs_{name}"] = us / r["us"]
    del layers
    torch.cuda.empty_cache()
    return rows


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="folder for kernels_kda.json")
    parser.add_argument("--t", type=int, nargs="+", default=[1, 6], help="chain lengths (default 1 6)")
    parser.add_argument("--bv", type=int, nargs="*", default=[], help="extra BV configs to time (sweep)")
    parser.add_argument("--warps", type=int, nargs="*", default=[],
                        help="warps per program to time at each --bv (or the table's BV)")
    parser.add_argument("--layers", type=int, default=0,
                        help="layer copies to rotate (default: max(35, enough to span 4x L2))")
    parser.add_argument("--replays", type=int, default=30, help="graph replays per timing")
    parser.add_argument("--inductor", action="store_true",
                        help="add torch.compile (Inductor, default mode) of the eager path")
    args = parser.parse_args(argv)
    require_cuda()

    rows = []
    for T in args.t:
        rows += bench_T(T, args.bv, args.warps, args.replays, args.layers, args.inductor)
    all_correct = all(r["correct"] for r in rows)
    if not all_correct:
        bad = [f"T={r['T']} {r['mode']} {r['variant']} (rel RMS {r['rel_rms_err']:.2e})" for r in rows if not r["correct"]]
        print("CORRECTNESS CHECK FAILED for: " + "; ".join(bad))
    print(markdown_table(rows, [
        ("T", "T", "d"), ("mode", "mode", "s"), ("variant", "variant", "s"), ("us", "us/layer", ".2f"),
        ("us_min", "min", ".2f"), ("speedup_vs_eager", "x vs eager", ".2f"),
        ("speedup_vs_inductor", "x vs inductor", ".2f"), ("rel_rms_err", "rel RMS err", ".1e"),
        ("copies", "layers rotated", "d"),
    ]))
    path = write_json(args.out / "kernels_kda.json", {
        "benchmark": "kernels_kda", "shape": {"H": H, "K": K, "V": K, "W": W}, "dtype": "bfloat16",
        "table_config": config_for(H, K, K), "rtol_rms": RTOL_RMS, "all_correct": all_correct, "rows": rows,
    })
    print(f"\nwrote {path}")
    return 0 if all_correct else 1


if __name__ == "__main__":
    raise SystemExit(main())
