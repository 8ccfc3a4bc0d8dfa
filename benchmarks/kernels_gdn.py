"""Qwen3-Next's Gated DeltaNet decode chain: lingc.kda_chain's grouped heads vs the eager path (and
flash-linear-attention's recurrence as a peer).

    python -m benchmarks.kernels_gdn --out DIR [--t 1 6] [--layers N]

Shape: one Qwen3-Next-80B linear-attention layer on one GPU of four (8 value heads, 4 q/k heads,
K = V = 128, conv width 4), bf16 projections (q, k, v as the channel blocks of one [T, C] mixed
tensor, as the fused projection leaves them), fp32 state, Gated DeltaNet's per-head softplus gate.
T = 1 runs the persistent mode (state and cache updated in place), T > 1 the staged (verify) mode.
Variants:

- ``lingc``         kda_chain on Hugging Face's cache, [C, 4] (the conv's whole width)
- ``lingc-w3``      the same on a [C, 3] cache (the live columns only)
- ``lingc-no-pdl``  ``lingc`` launched without PDL
- ``eager``         the decode as Hugging Face's torch path writes it (conv1d over cat([cache, x]),
                    q and k repeat_interleave'd, the recurrence on [1, H, T, K] tensors), with the
                    cache and state written back in place
- ``fla``           fused_recurrent_gated_delta_rule when importable: recurrence only (the
                    convolution and the gate precomputed outside the timing, q and k given per
                    value head), so it does less work than lingc

Conditions as benchmarks/kernels_kda.py: cold layers rotated (at least 48: Qwen3-Next-80B's linear
layers, and enough to span L2 four times), every call timed inside one CUDA graph, medians over
replays; each variant checked first against kda_chain's fp32 reference (an incorrect one flagged).
"""
from __future__ import annotations

import argparse
from pathlib import Path

import torch
import torch.nn.functional as F

from benchmarks.common import (cold_copies, markdown_table, peer_row, rel_rms, require_cuda, time_in_graph, to_cpu,
                               write_json)
from lingc.runtime.kernels.kda import kda_chain_reference
from lingc.runtime.kernels.kda.kernel import config_for, kda_chain_triton

H, HK, K, W = 8, 4, 128, 4      # value heads, q/k heads, head dim (K = V), conv width
DQK, DV = HK * K, H * K
C = 2 * DQK + DV
MIN_LAYERS = 48                  # Qwen3-Next-80B's Gated DeltaNet layers
RTOL_RMS = 1e-4


def layer(T: int, gen: torch.Generator, device="cuda") -> dict:
    """One layer's inputs (mixed [T, C] bf16, the per-head gate's a and b), conv weight, cache
    ([C, 4]; ``cache3`` its live [C, 3] columns), parameters and state, on ``device``."""
    def r(*shape, scale=1.0, dtype=torch.float32):
        return (torch.randn(*shape, generator=gen, device=device) * scale).to(dtype)

    bf = torch.bfloat16
    x = dict(mixed=r(T, C, dtype=bf), a=r(T, H, dtype=bf), b=r(T, H, dtype=bf), conv_w=r(C, W, scale=0.5),
             cache=r(C, W, dtype=bf), a_log=r(H, scale=0.5), dt_bias=r(H, scale=0.5),
             state=r(H, K, K, scale=0.3), out=torch.empty(T, H, K, device=device))
    x["cache3"] = x["cache"][:, 1:].contiguous()
    if T > 1:
        x["stage_states"] = torch.empty(T, H, K, K, device=device)
        x["stage_windows"] = torch.empty(T, C, W, device=device, dtype=bf)
        x["stage_windows3"] = torch.empty(T, C, W - 1, device=device, dtype=bf)
    return x


def chain_args(x: dict, cache: str = "cache") -> tuple:
    """kda_chain's arguments: q, k, v as the mixed tensor's channel blocks, the conv weight's row
    blocks, the softplus gate (lower_bound None)."""
    q, k, v = x["mixed"].split([DQK, DQK, DV], 1)
    return (q, k, v, x["a"], x["b"], list(x["conv_w"].split([DQK, DQK, DV], 0)), x[cache], x["a_log"],
            x["dt_bias"], x["state"], None)


def eager(x: dict) -> torch.Tensor:
    """The decode as Hugging Face's Qwen3-Next torch path writes it (cache and state in place);
    o [T, H, V] fp32."""
    T = x["mixed"].shape[0]
    cache = x["cache"]
    seq = torch.cat([cache, x["mixed"].T.to(cache.dtype)], -1)
    cache.copy_(seq[:, -W:])
    y = F.silu(F.conv1d(seq[None].float(), x["conv_w"][:, None].float(), groups=C)[0, :, -T:].T)
    q, k, v = y.split([DQK, DQK, DV], -1)
    q = q.reshape(1, T, HK, K).repeat_interleave(H // HK, dim=2)
    k = k.reshape(1, T, HK, K).repeat_interleave(H // HK, dim=2)
    q = q * torch.rsqrt((q * q).sum(-1, keepdim=True) + 1e-6) * K ** -0.5
    k = k * torch.rsqrt((k * k).sum(-1, keepdim=True) + 1e-6)
    v = v.reshape(1, T, H, K)
    g = -x["a_log"].exp() * F.softplus(x["a"].float() + x["dt_bias"])
    beta = x["b"].float().sigmoid()
    S, outs = x["state"], []
    for i in range(T):
        S = S * g[i].exp()[:, None, None]
        delta = (v[0, i] - (S * k[0, i, :, :, None]).sum(-2)) * beta[i][:, None]
        S = S + k[0, i, :, :, None] * delta[:, None, :]
        outs.append((S * q[0, i, :, :, None]).sum(-2))
    x["state"].copy_(S)
    return torch.stack(outs)


def _fla():
    try:
        from fla.ops.gated_delta_rule import fused_recurrent_gated_delta_rule
    except Exception:  # not installed, or an incompatible version
        return None

    def run(q, k, v, g, beta, h0):
        # Keywords: fla 0.6 puts gk and gv between g and beta (beta passed fifth was read as gk)
        return fused_recurrent_gated_delta_rule(q, k, v, g=g, beta=beta, scale=K ** -0.5, initial_state=h0,
                                                output_final_state=True, use_qk_l2norm_in_kernel=True)[0]
    return run


def _fla_inputs(x: dict) -> tuple:
    """Post-conv q, k (per value head), v, the log-decay and beta (outside the timing)."""
    T = x["mixed"].shape[0]
    seq = torch.cat([x["cache"][:, 1:], x["mixed"].T], -1)
    y = F.silu(F.conv1d(seq[None].float(), x["conv_w"][:, None].float(), groups=C)[0].T)
    q, k, v = y.split([DQK, DQK, DV], -1)
    q = q.reshape(1, T, HK, K).repeat_interleave(H // HK, dim=2).contiguous()
    k = k.reshape(1, T, HK, K).repeat_interleave(H // HK, dim=2).contiguous()
    g = (-x["a_log"].exp() * F.softplus(x["a"].float() + x["dt_bias"])).view(1, T, H)
    return q, k, v.reshape(1, T, H, K).contiguous(), g, x["b"].float().sigmoid().view(1, T, H), x["state"][None]


def bench_T(T: int, replays: int, copies_override: int) -> list[dict]:
    gen = torch.Generator(device="cuda").manual_seed(T)
    staged = T > 1
    layer_bytes = 4 * H * K * K * (1 + (T if staged else 0)) + C * W * (4 + 2) + T * (C + 2 * H) * 2
    copies = copies_override or max(MIN_LAYERS, cold_copies(layer_bytes))
    layers = [layer(T, gen) for _ in range(copies)]
    x0 = layers[0]
    ref = kda_chain_reference(*(to_cpu(a) for a in chain_args(x0)))
    ready = copies > 1

    def lingc(cache: str, pdl: bool):
        stages = ("stage_states", "stage_windows" + ("3" if cache == "cache3" else ""))

        def run(x):
            return kda_chain_triton(*chain_args(x, cache), *((x[s] for s in stages) if staged else (None, None)),
                                    x["out"], state_ready=ready, use_pdl=None if pdl else False)
        return run

    variants = {"lingc": lingc("cache", True), "lingc-w3": lingc("cache3", True),
                "lingc-no-pdl": lingc("cache", False), "eager": eager}
    pristine = {n: x0[n].clone() for n in ("state", "cache", "cache3")}

    def restore():
        for n, t in pristine.items():
            x0[n].copy_(t)

    mode = "staged" if staged else "persistent"
    rows = []
    for name, fn in variants.items():
        restore()
        err = rel_rms(fn(x0), ref.o)
        restore()
        t = time_in_graph(fn, [(x,) for x in layers], replays=replays)
        rows.append({"T": T, "mode": "persistent" if name == "eager" else mode, "variant": name,
                     "us": t.us_per_call, "us_min": t.us_per_call_min, "copies": copies, "rel_rms_err": err,
                     "correct": err <= RTOL_RMS})
    fla = _fla()
    if fla is not None:
        restore()
        row = peer_row("fla fused_recurrent_gated_delta_rule", fla, [_fla_inputs(x) for x in layers], ref.o,
                       replays, T=T, mode="recurrence-only", variant="fla", copies=copies)
        rows += [row] if row else []
    eager_us = next(r["us"] for r in rows if r["variant"] == "eager")
    for r in rows:
        if r["variant"].startswith("lingc"):
            r["speedup_vs_eager"] = eager_us / r["us"]
    del layers
    torch.cuda.empty_cache()
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="folder for kernels_gdn.json")
    parser.add_argument("--t", type=int, nargs="+", default=[1, 6], help="chain lengths (default 1 6)")
    parser.add_argument("--layers", type=int, default=0,
                        help="layer copies to rotate (default: max(48, enough to span 4x L2))")
    parser.add_argument("--replays", type=int, default=30, help="graph replays per timing")
    args = parser.parse_args(argv)
    require_cuda()
    rows = []
    for T in args.t:
        rows += bench_T(T, args.replays, args.layers)
    all_correct = all(r["correct"] for r in rows)
    if not all_correct:
        print("CORRECTNESS CHECK FAILED for: " + "; ".join(
            f"T={r['T']} {r['variant']} (rel RMS {r['rel_rms_err']:.2e})" for r in rows if not r["correct"]))
    print(markdown_table(rows, [
        ("T", "T", "d"), ("mode", "mode", "s"), ("variant", "variant", "s"), ("us", "us/layer", ".2f"),
        ("us_min", "min", ".2f"), ("speedup_vs_eager", "x vs eager", ".2f"), ("rel_rms_err", "rel RMS err", ".1e"),
        ("copies", "layers rotated", "d"),
    ]))
    path = write_json(args.out / "kernels_gdn.json", {
        "benchmark": "kernels_gdn", "shape": {"H": H, "HK": HK, "K": K, "V": K, "W": W}, "dtype": "bfloat16",
        "table_config": config_for(H, K, K), "rtol_rms": RTOL_RMS, "all_correct": all_correct, "rows": rows,
    })
    print(f"\nwrote {path}")
    return 0 if all_correct else 1


if __name__ == "__main__":
    raise SystemExit(main())
