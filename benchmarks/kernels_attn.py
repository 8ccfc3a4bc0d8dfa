"""Attention-side micro-benchmark: lingc's norm kernels, MLA decode and GQA decode vs eager and Inductor.

    python -m benchmarks.kernels_attn --out benchmarks/results/attn [--split-len 128 256 ...]

Shapes (flash-tp4-rank, bf16): RMSNorm + residual over hidden 2560 and KDA's gated head norm over
8 heads x 128, at T = 1 and 6 tokens; MLA decode with 8 heads, kv_lora_rank 512, rope 64 over a
cache of context 8192 and 65536, T = 1 (decode) and T = 6 (a verify chain at the end of the
context: positions L-6 .. L-1), q RoPE and the head gate fused; GQA decode (``gqa_decode``) at a
Qwen3-Next-80B TP4 rank's full-attention shape (4 query heads over 1 key/value head of 256, bf16
caches [L, 1, 256]) over the same contexts and T, eager being SDPA with enable_gqa; and that
layer's whole step after its projections (``gqa layer``: the queries' and keys' per-head
zero-centred RMSNorms, their rotate-half RoPE on 64 dims, both rows written into the caches, the
attention, the sigmoid output gate), lingc being two ``head_cache_write`` (the key's norm and RoPE
folded) and one ``gqa_decode`` with the query's norm, ``inv_freq`` and ``gate``.
Variants:

- ``lingc``         the op's Triton launcher, PDL-launched where supported
- ``lingc-no-pdl``  the same launch without PDL
- ``lingc-split-no-pdl`` / ``lingc-combine-no-pdl``  MLA and GQA decode, PDL for one of the two
                    kernels (``MlaDecodeConfig`` / ``GqaDecodeConfig`` ``split_pdl`` / ``combine_pdl``
                    False)
- ``lingc-q-roped``  MLA only, the table's launch on q_rope rotated beforehand (no RoPE in the
                    kernel): what the in-kernel RoPE of q costs
- ``lingc-splitN``  MLA only, the split kernel at SPLIT_LEN = N instead of the table (``--split-len``)
- ``lingc-sN-lB-stS-wW-crR-csC``  a whole config, MLA's (``--mla-config N,B,S,W[,R[,C]]``) or
                    gqa_decode's (``--gqa-config N,B,S,W[,R[,C[,H]]]``)
- ``eager``         the model's own code: the decoder's bf16 residual add + layers.RMSNorm's expression;
                    kda_math.gated_head_rmsnorm + the cast before o_proj; mla.py's absorbed core
                    (RoPE of q, fp32 einsums over the whole cache, masked softmax), gated on o_lat
                    as the fused op does
- ``inductor``      torch.compile (default mode, its CUDA graphs off: the benchmark captures) of
                    the eager function

Conditions (benchmarks/common.py): cold operands (each call in the graph reads a different copy of
the weights, activations and, for MLA, the layer's cache; the copies span L2 four times, at
least 7 for MLA: Ling-3-flash's MLA layers), every call inside one CUDA graph of many calls timed
with CUDA events, median over replays. The floor is the bytes a call must move (norms: the
activations read and written plus the weight; MLA: the cache rows 0..max(positions) and the
queries; GQA: the key and value rows and the queries) over the device-to-device copy bandwidth
measured in the same run. Correctness is
checked first against the fp32 references; if a variant fails, no speedup is printed and the exit
status is 1. Run on the H200 and the H100 (benchmarks/results/kernels_attn_*).
"""
from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path

import torch
from triton.runtime.errors import OutOfResources

from benchmarks.common import (cold_copies, copy_bandwidth_gbps, markdown_table, rel_rms, require_cuda,
                             time_in_graph, write_json)
from lingc.models.kda_math import gated_head_rmsnorm as model_gated_head_rmsnorm
from lingc.models.layers import apply_rope_interleaved, rope_inv_freq
from lingc.runtime.kernels.mla_decode import mla_decode_reference
from lingc.runtime.kernels.mla_decode.kernel import MIN_SPLIT_LEN, MlaDecodeConfig, config_for, mla_decode_triton
from lingc.runtime.kernels.norms import gated_head_rmsnorm_reference, rmsnorm_reference
from lingc.runtime.kernels.norms.kernel import gated_head_rmsnorm_triton, rmsnorm_triton

HIDDEN, KDA_H, KDA_V = 2560, 8, 128
MLA_H, RANK, ROPE, NOPE = 8, 512, 64, 128
SCALE = (NOPE + ROPE) ** -0.5
THETA = 6.0e6
EPS = 1e-6
MLA_LAYERS = 7
BF16 = torch.bfloat16
# Relative RMS against the references: the norms' bf16 outputs are one rounding from fp32 (eager
# is the reference's own expression); the MLA kernel's hi/lo dots are ~2^-17, eager/Inductor fp32.
# Inductor's compile of the same MLA expression lands 7.7e-4 - 9.7e-4 from the reference on the
# H200 (session 26; eager 4e-7): its contraction or rounding order, not investigated. The check of
# a baseline is there to catch a wrong answer (off by O(1)), so it gets one bf16 rounding's room.
RTOL = {"norm": 8e-3, "mla": 1e-4, "mla_inductor": 2e-3}


def _row(kernel, shape, T, variant, t, floor_bytes, copy_gbps, err, tol, copies):
    floor_us = floor_bytes / (copy_gbps * 1e9) * 1e6
    return {"kernel": kernel, "shape": shape, "T": T, "variant": variant, "us": t.us_per_call,
            "us_min": t.us_per_call_min, "floor_us": floor_us, "x_floor": t.us_per_call / floor_us,
            "copies": copies, "rel_rms_err": err, "correct": err <= tol}


def _speedups(rows):
    """lingc rows get x vs eager and x vs inductor of the same (kernel, shape, T)."""
    for r in rows:
        if not r["variant"].startswith("lingc"):
            continue
        peers = {p["variant"]: p["us"] for p in rows
                 if (p["kernel"], p["shape"], p["T"]) == (r["kernel"], r["shape"], r["T"])}
        for name in ("eager", "inductor"):
            if name in peers:
                r[f"speedup_vs_{name}"] = peers[name] / r["us"]


# Norms.


def _eager_rmsnorm(x, residual, weight):
    """The decoder: h = residual + sublayer_out (bf16), then layers.RMSNorm.forward's expression
    on h (the weight is an argument so that one Inductor graph serves every cold copy)."""
    h = residual + x
    hf = h.float()
    return (hf * torch.rsqrt(hf.pow(2).mean(-1, keepdim=True) + EPS) * weight.float()).to(h.dtype), h


def _eager_gated(o, gate, weight):
    """KDA's output norm as kda.py writes it, then the cast before o_proj."""
    T = o.shape[0]
    return model_gated_head_rmsnorm(o, weight, gate, EPS).reshape(T, KDA_H * KDA_V).to(BF16)


def bench_norms(T, copy_gbps, replays, inductor):
    gen = torch.Generator(device="cuda").manual_seed(T)

    def r(*shape, dtype=BF16):
        return torch.randn(*shape, generator=gen, device="cuda").to(dtype)

    row_bytes = HIDDEN * 2
    norm_bytes = 2 * T * row_bytes + row_bytes + 2 * T * row_bytes      # read x, residual, w; write out, h
    gated_bytes = T * KDA_H * KDA_V * (4 + 2 + 2) + KDA_V * 2            # read o fp32, gate; write bf16; w
    copies = cold_copies(norm_bytes)
    sets = [dict(w=r(HIDDEN), x=r(T, HIDDEN), res=r(T, HIDDEN), o=r(T, KDA_H, KDA_V, dtype=torch.float32),
                 gate=r(T, KDA_H, KDA_V), gw=r(KDA_V)) for _ in range(copies)]
    s0 = sets[0]
    ref_norm = rmsnorm_reference(s0["x"].cpu(), s0["w"].cpu(), s0["res"].cpu(), EPS)[0]
    ref_gated = gated_head_rmsnorm_reference(s0["o"].cpu(), s0["gate"].cpu(), s0["gw"].cpu(), EPS)

    norm_variants = {
        "lingc": lambda s: rmsnorm_triton(s["x"], s["w"], s["res"], EPS)[0],
        "lingc-no-pdl": lambda s: rmsnorm_triton(s["x"], s["w"], s["res"], EPS, use_pdl=False)[0],
        "eager": lambda s: _eager_rmsnorm(s["x"], s["res"], s["w"])[0],
    }
    gated_variants = {
        "lingc": lambda s: gated_head_rmsnorm_triton(s["o"], s["gate"], s["gw"], EPS, BF16),
        "lingc-no-pdl": lambda s: gated_head_rmsnorm_triton(s["o"], s["gate"], s["gw"], EPS, BF16, use_pdl=False),
        "eager": lambda s: _eager_gated(s["o"], s["gate"], s["gw"]),
    }
    if inductor:
        c_norm = torch.compile(_eager_rmsnorm, dynamic=False)
        c_gated = torch.compile(_eager_gated, dynamic=False)
        norm_variants["inductor"] = lambda s: c_norm(s["x"], s["res"], s["w"])[0]
        gated_variants["inductor"] = lambda s: c_gated(s["o"], s["gate"], s["gw"])

    rows = []
    for kernel, variants, ref, nbytes, tol, shape in (
        ("rmsnorm+residual", norm_variants, ref_norm, norm_bytes, RTOL["norm"], f"D={HIDDEN}"),
        ("gated_head_rmsnorm", gated_variants, ref_gated.reshape(T, -1), gated_bytes, RTOL["norm"],
         f"H={KDA_H} V={KDA_V}"),
    ):
        for variant, fn in variants.items():
            err = rel_rms(fn(s0).float().reshape(ref.shape), ref.float())
            t = time_in_graph(fn, [(s,) for s in sets], replays=replays)
            rows.append(_row(kernel, shape, T, variant, t, nbytes, copy_gbps, err, tol, copies))
    del sets
    torch.cuda.empty_cache()
    return rows


# MLA decode.


def _eager_mla(q_lat, q_rope, kv_cache, positions, gate, inv_freq):
    """lingc/models/mla.py's absorbed attention core (RoPE of q, fp32 einsums over the whole
    cache, masked softmax), gated on o_lat as mla_decode's fused gate does."""
    q_rope = apply_rope_interleaved(q_rope, positions, inv_freq)
    cf = kv_cache.float()
    scores = (torch.einsum("thr,lr->thl", q_lat, cf[:, :RANK])
              + torch.einsum("the,le->thl", q_rope.float(), cf[:, RANK:])) * SCALE
    L = kv_cache.shape[0]
    visible = torch.arange(L, device=kv_cache.device)[None, :] <= positions[:, None]
    p = torch.softmax(scores.masked_fill(~visible[:, None, :], float("-inf")), dim=-1)
    o_lat = torch.einsum("thl,lr->thr", p, cf[:, :RANK])
    return o_lat * torch.sigmoid(gate.float()).unsqueeze(-1)


def parse_mla_config(spec: str) -> MlaDecodeConfig:
    """'split_len,block_l,num_stages,num_warps[,combine_block_r[,combine_block_s[,block_h[,max_registers]]]]' ->
    a config, the split in the PDL chain or not as config_for decides for that split length."""
    try:
        vals = [int(v) for v in spec.split(",")]
        names = ["split_len", "block_l", "num_stages", "num_warps", "combine_block_r", "combine_block_s", "block_h",
                 "max_registers"]
        if not 4 <= len(vals) <= len(names):
            raise ValueError(f"{len(vals)} numbers")
        return MlaDecodeConfig(**dict(zip(names, vals)), split_pdl=vals[0] <= MIN_SPLIT_LEN)
    except (ValueError, AssertionError) as e:
        raise SystemExit(f"--mla-config {spec!r}: want split_len,block_l,num_stages,num_warps"
                         f"[,combine_block_r[,combine_block_s[,block_h[,max_registers]]]] (split_len a multiple"
                         f" of block_l >= 16, block_h 0 or a power of two >= 16): {e}")


def mla_config_label(c: MlaDecodeConfig) -> str:
    return (f"lingc-s{c.split_len}-l{c.block_l}-st{c.num_stages}-w{c.num_warps}"
            f"-cr{c.combine_block_r}-cs{c.combine_block_s}" + (f"-h{c.block_h}" if c.block_h else "")
            + (f"-r{c.max_registers}" if c.max_registers else ""))


def bench_mla(L, T, copy_gbps, replays, inductor, split_lens, configs=()):
    gen = torch.Generator(device="cuda").manual_seed(L + T)
    cache_bytes = L * (RANK + ROPE) * 2
    floor_bytes = cache_bytes + T * MLA_H * (RANK * 4 + ROPE * 2) + T * MLA_H * RANK * 4
    copies = max(MLA_LAYERS, cold_copies(cache_bytes, minimum=MLA_LAYERS))
    inv_freq = rope_inv_freq(ROPE, THETA).cuda()
    positions = torch.arange(L - T, L, device="cuda")
    layers = []
    for _ in range(copies):
        layers.append(dict(
            q_lat=torch.randn(T, MLA_H, RANK, generator=gen, device="cuda") * 0.05,
            q_rope=torch.randn(T, MLA_H, ROPE, generator=gen, device="cuda").to(BF16),
            kv=torch.randn(L, RANK + ROPE, generator=gen, device="cuda").to(BF16),
            gate=torch.randn(T, MLA_H, generator=gen, device="cuda").to(BF16),
            out=torch.empty(T, MLA_H, RANK, device="cuda"),
        ))
    x0 = layers[0]

    def args(x):
        return x["q_lat"], x["q_rope"], x["kv"], positions, SCALE, x["gate"], inv_freq

    # What the in-kernel RoPE of q costs: the same call on q_rope rotated beforehand (the same bits:
    # the kernel rounds its rotated q to q_rope's dtype, as apply_rope_interleaved does).
    for x in layers:
        x["q_roped"] = apply_rope_interleaved(x["q_rope"], positions, inv_freq)

    ref = mla_decode_reference(*(a.cpu() if torch.is_tensor(a) else a for a in args(x0)))
    table = config_for(L, MLA_H, RANK, ROPE)

    def lingc(cfg, pdl):
        return lambda x: mla_decode_triton(*args(x), out=x["out"], config=cfg, use_pdl=None if pdl else False)

    variants = {"lingc": lingc(table, True), "lingc-no-pdl": lingc(table, False),
                "lingc-split-no-pdl": lingc(replace(table, split_pdl=False), True),
                "lingc-combine-no-pdl": lingc(replace(table, combine_pdl=False), True)}
    variants["lingc-q-roped"] = lambda x: mla_decode_triton(x["q_lat"], x["q_roped"], x["kv"], positions, SCALE,
                                                            x["gate"], None, out=x["out"], config=table)
    for n in split_lens:
        variants[f"lingc-split{n}"] = lingc(MlaDecodeConfig(split_len=n, block_l=min(table.block_l, n),
                                                                 num_warps=table.num_warps), True)
    for c in configs:
        variants[mla_config_label(c)] = lingc(c, True)
    eager = lambda x: _eager_mla(x["q_lat"], x["q_rope"], x["kv"], positions, x["gate"], inv_freq)  # noqa: E731
    variants["eager"] = eager
    if inductor:
        compiled = torch.compile(_eager_mla, dynamic=False)
        variants["inductor"] = lambda x: compiled(x["q_lat"], x["q_rope"], x["kv"], positions, x["gate"], inv_freq)

    rows = []
    shape = f"L={L} H={MLA_H} R={RANK}+{ROPE}"
    for variant, fn in variants.items():
        try:
            err = rel_rms(fn(x0), ref)
        except OutOfResources as e:      # a swept config that does not fit: say so, go on
            print(f"mla_decode {shape} T={T} {variant}: skipped, {e}", flush=True)
            continue
        t = time_in_graph(fn, [(x,) for x in layers], replays=replays)
        tol = RTOL["mla_inductor"] if variant == "inductor" else RTOL["mla"]
        row = _row("mla_decode", shape, T, variant, t, floor_bytes, copy_gbps, err, tol, copies)
        table_layout = ("lingc", "lingc-no-pdl", "lingc-split-no-pdl", "lingc-combine-no-pdl")
        row["split_len"] = table.split_len if variant in table_layout else None
        rows.append(row)
    del layers
    torch.cuda.empty_cache()
    return rows


# GQA decode: a Qwen3-Next-80B TP4 rank's full-attention layer (4 of 16 query heads over one of the
# 2 key/value heads, replicated, head dim 256), bf16 caches [L, kv_heads, D].
GQA_HQ, GQA_HKV, GQA_D = 4, 1, 256
GQA_LAYERS = 12                     # Qwen3-Next-80B's full-attention layers


def _eager_gqa(q, k_cache, v_cache, positions):
    """The attention core as Hugging Face's SDPA path runs it: bf16 SDPA with enable_gqa over the
    caches read head-major, a boolean causal mask from the positions; fp32 out like the op."""
    L = k_cache.shape[0]
    visible = torch.arange(L, device=q.device)[None, :] <= positions[:, None]
    o = torch.nn.functional.scaled_dot_product_attention(
        q.transpose(0, 1)[None], k_cache.transpose(0, 1)[None], v_cache.transpose(0, 1)[None],
        attn_mask=visible[None, None], scale=GQA_D ** -0.5, enable_gqa=True)
    return o[0].transpose(0, 1).float()


def parse_gqa_config(spec: str):
    """'split_len,block_l,num_stages,num_warps[,combine_block_r[,combine_block_s[,block_h]]]' -> a
    GqaDecodeConfig."""
    from lingc.runtime.kernels.gqa_decode.kernel import GqaDecodeConfig

    names = ["split_len", "block_l", "num_stages", "num_warps", "combine_block_r", "combine_block_s", "block_h"]
    try:
        vals = [int(v) for v in spec.split(",")]
        if not 4 <= len(vals) <= len(names):
            raise ValueError(f"{len(vals)} numbers")
        return GqaDecodeConfig(**dict(zip(names, vals)))
    except ValueError as e:
        raise SystemExit(f"--gqa-config {spec!r}: want split_len,block_l,num_stages,num_warps"
                         f"[,combine_block_r[,combine_block_s[,block_h]]]: {e}")


def gqa_config_label(c) -> str:
    return (f"lingc-s{c.split_len}-l{c.block_l}-st{c.num_stages}-w{c.num_warps}"
            f"-cr{c.combine_block_r}-cs{c.combine_block_s}" + (f"-h{c.block_h}" if c.block_h else ""))


def bench_gqa(L, T, copy_gbps, replays, inductor, configs=()):
    from lingc.runtime.kernels.gqa_decode import gqa_decode_reference
    from lingc.runtime.kernels.gqa_decode.kernel import config_for as gqa_config_for, gqa_decode_triton

    gen = torch.Generator(device="cuda").manual_seed(L + T + 1)
    cache_bytes = 2 * L * GQA_HKV * GQA_D * 2
    floor_bytes = cache_bytes + T * GQA_HQ * GQA_D * (2 + 4)          # the caches, q (bf16) in, o (fp32) out
    copies = max(GQA_LAYERS, cold_copies(cache_bytes, minimum=GQA_LAYERS))
    positions = torch.arange(L - T, L, device="cuda")
    layers = [dict(q=torch.randn(T, GQA_HQ, GQA_D, generator=gen, device="cuda").to(BF16),
                   k=torch.randn(L, GQA_HKV, GQA_D, generator=gen, device="cuda").to(BF16),
                   v=torch.randn(L, GQA_HKV, GQA_D, generator=gen, device="cuda").to(BF16),
                   out=torch.empty(T, GQA_HQ, GQA_D, device="cuda")) for _ in range(copies)]
    x0 = layers[0]
    ref = gqa_decode_reference(x0["q"].cpu(), x0["k"].cpu(), x0["v"].cpu(), positions.cpu(), GQA_D ** -0.5)
    cfg = gqa_config_for(L, GQA_HQ, GQA_HKV, GQA_D, GQA_D)

    def lingc(pdl, c=cfg):
        return lambda x: gqa_decode_triton(x["q"], x["k"], x["v"], positions, GQA_D ** -0.5, out=x["out"],
                                           config=c, use_pdl=None if pdl else False)

    variants = {"lingc": lingc(True), "lingc-no-pdl": lingc(False),
                "lingc-split-no-pdl": lingc(True, replace(cfg, split_pdl=False)),
                "lingc-combine-no-pdl": lingc(True, replace(cfg, combine_pdl=False))}
    for c in configs:
        variants[gqa_config_label(c)] = lingc(True, c)
    variants["eager"] = lambda x: _eager_gqa(x["q"], x["k"], x["v"], positions)
    if inductor:
        compiled = torch.compile(_eager_gqa, dynamic=False)
        variants["inductor"] = lambda x: compiled(x["q"], x["k"], x["v"], positions)
    rows = []
    shape = f"L={L} H={GQA_HQ}/{GQA_HKV} D={GQA_D}"
    for variant, fn in variants.items():
        try:
            err = rel_rms(fn(x0), ref)
            t = time_in_graph(fn, [(x,) for x in layers], replays=replays)
        except OutOfResources as e:      # a swept config that does not fit: say so, go on
            print(f"gqa_decode {shape} T={T} {variant}: does not fit ({e})")
            continue
        # eager and Inductor run bf16 SDPA (scores and probabilities rounded to bf16)
        tol = RTOL["mla"] if variant.startswith("lingc") else RTOL["norm"]
        row = _row("gqa_decode", shape, T, variant, t, floor_bytes, copy_gbps, err, tol, copies)
        swept = next((c for c in configs if gqa_config_label(c) == variant), cfg)
        row["split_len"] = swept.split_len if variant.startswith("lingc") else None
        rows.append(row)
    del layers
    torch.cuda.empty_cache()
    return rows


GQA_ROPE = 64                       # Qwen3-Next rotates the first quarter of each head (rotate-half)
GQA_EPS = 1e-6                      # its q_norm / k_norm


def _qwen3_next_head_norm(x, w):
    """Qwen3-Next's per-head RMSNorm as its Hugging Face code writes it: fp32, gain 1 + w, cast back."""
    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + GQA_EPS)
    return (y * (1.0 + w.float())).type_as(x)


def _eager_gqa_layer(q, k, v, gate, k_cache, v_cache, positions, inv_freq, q_w, k_w):
    """Qwen3-Next's gated attention after its projections, as its Hugging Face code runs it: the
    per-head q / k norms, rotate-half RoPE on the first GQA_ROPE dims of q and k (in their dtype),
    the rows written into the caches, SDPA with enable_gqa, the output times sigmoid(gate); fp32 out."""
    q, k = _qwen3_next_head_norm(q, q_w), _qwen3_next_head_norm(k, k_w)
    ang = positions.float()[:, None] * inv_freq[None]
    cos = torch.cat([ang.cos()] * 2, -1)[:, None].to(q.dtype)
    sin = torch.cat([ang.sin()] * 2, -1)[:, None].to(q.dtype)

    def rope(x):
        r = x[..., :GQA_ROPE]
        half = torch.cat([-r[..., GQA_ROPE // 2:], r[..., :GQA_ROPE // 2]], -1)
        return torch.cat([r * cos + half * sin, x[..., GQA_ROPE:]], -1)
    k_cache[positions] = rope(k)
    v_cache[positions] = v
    o = _eager_gqa(rope(q), k_cache, v_cache, positions)
    return (o.to(q.dtype) * torch.sigmoid(gate)).float()


def bench_gqa_layer(L, T, copy_gbps, replays, inductor):
    """The gated attention's whole step on lingc (two head_cache_write, the key's norm and RoPE in
    the first, and one gqa_decode with the queries' norm and RoPE and the gate) against the model's
    ops eager and under Inductor."""
    import lingc.runtime.kernels.head_cache_write  # noqa: F401  (registers lingc::head_cache_write)
    from lingc.models.layers import rope_inv_freq
    from lingc.runtime.kernels.gqa_decode.kernel import config_for as gqa_config_for, gqa_decode_triton

    gen = torch.Generator(device="cuda").manual_seed(L + T + 2)
    cache_bytes = 2 * L * GQA_HKV * GQA_D * 2
    floor_bytes = cache_bytes + T * GQA_HQ * GQA_D * (2 * 2 + 4)      # the caches; q and gate in, o out
    copies = max(GQA_LAYERS, cold_copies(cache_bytes, minimum=GQA_LAYERS))
    positions = torch.arange(L - T, L, device="cuda")
    inv_freq = rope_inv_freq(GQA_ROPE, 1.0e7).cuda()

    def r(*shape):
        return torch.randn(*shape, generator=gen, device="cuda").to(BF16)
    layers = [dict(q=r(T, GQA_HQ, GQA_D), k=r(T, GQA_HKV, GQA_D), v=r(T, GQA_HKV, GQA_D), gate=r(T, GQA_HQ, GQA_D),
                   kc=r(L, GQA_HKV, GQA_D), vc=r(L, GQA_HKV, GQA_D), out=torch.empty(T, GQA_HQ, GQA_D, device="cuda"),
                   qw=r(GQA_D) * 0.1, kw=r(GQA_D) * 0.1)
              for _ in range(copies)]
    x0 = layers[0]
    ref = _eager_gqa_layer(*(x0[n].cpu().clone() for n in ("q", "k", "v", "gate", "kc", "vc")), positions.cpu(),
                           inv_freq.cpu(), x0["qw"].cpu(), x0["kw"].cpu())
    cfg = gqa_config_for(L, GQA_HQ, GQA_HKV, GQA_D, GQA_D)

    def lingc_step(pdl):
        def step(x):
            torch.ops.lingc.head_cache_write(x["k"], positions, x["kc"], inv_freq, norm_weight=x["kw"], eps=GQA_EPS,
                                             zero_centered=True)
            torch.ops.lingc.head_cache_write(x["v"], positions, x["vc"])
            return gqa_decode_triton(x["q"], x["kc"], x["vc"], positions, GQA_D ** -0.5, out=x["out"], config=cfg,
                                     use_pdl=None if pdl else False, inv_freq=inv_freq, gate=x["gate"],
                                     norm_weight=x["qw"], eps=GQA_EPS, zero_centered=True)
        return step

    def eager(x):
        return _eager_gqa_layer(x["q"], x["k"], x["v"], x["gate"], x["kc"], x["vc"], positions, inv_freq, x["qw"],
                                x["kw"])

    variants = {"lingc": lingc_step(True), "lingc-no-pdl": lingc_step(False), "eager": eager}
    if inductor:
        compiled = torch.compile(_eager_gqa_layer, dynamic=False)
        variants["inductor"] = lambda x: compiled(x["q"], x["k"], x["v"], x["gate"], x["kc"], x["vc"], positions,
                                                  inv_freq, x["qw"], x["kw"])
    rows = []
    shape = f"L={L} H={GQA_HQ}/{GQA_HKV} D={GQA_D} rope={GQA_ROPE}"
    for variant, fn in variants.items():
        err = rel_rms(fn(x0), ref)
        t = time_in_graph(fn, [(x,) for x in layers], replays=replays)
        rows.append(_row("gqa layer (norms, rope, writes, gate)", shape, T, variant, t, floor_bytes, copy_gbps, err,
                         RTOL["norm"], copies))
    del layers
    torch.cuda.empty_cache()
    return rows


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="folder for kernels_attn.json and .md")
    parser.add_argument("--t", type=int, nargs="+", default=[1, 6], help="token counts (default 1 6)")
    parser.add_argument("--context", type=int, nargs="+", default=[8192, 65536],
                        help="MLA cache capacities (default 8192 65536)")
    parser.add_argument("--split-len", type=int, nargs="*", default=[],
                        help="extra MLA split lengths to time (multiples of 32), for the config table")
    parser.add_argument("--mla-config", action="append", default=[], metavar="SPEC",
                        help="an extra MLA config to time: split_len,block_l,num_stages,num_warps"
                             "[,combine_block_r[,combine_block_s]] (repeatable)")
    parser.add_argument("--gqa-config", action="append", default=[], metavar="SPEC",
                        help="an extra gqa_decode config to time: split_len,block_l,num_stages,num_warps"
                             "[,combine_block_r[,combine_block_s[,block_h]]] (repeatable)")
    parser.add_argument("--replays", type=int, default=30, help="graph replays per timing")
    parser.add_argument("--no-inductor", action="store_true", help="skip the torch.compile columns")
    parser.add_argument("--no-norms", action="store_true")
    parser.add_argument("--no-mla", action="store_true")
    parser.add_argument("--no-gqa", action="store_true", help="skip gqa_decode (a Qwen3-Next rank's attention)")
    parser.add_argument("--no-gqa-layer", action="store_true",
                        help="skip the gated attention's step (RoPE, cache writes, gqa_decode, gate)")
    args = parser.parse_args(argv)
    mla_configs = [parse_mla_config(c) for c in args.mla_config]
    gqa_configs = [parse_gqa_config(c) for c in args.gqa_config]
    require_cuda()

    copy_gbps = copy_bandwidth_gbps()
    rows = []
    for T in args.t:
        if not args.no_norms:
            rows += bench_norms(T, copy_gbps, args.replays, not args.no_inductor)
        if not args.no_mla:
            for L in args.context:
                rows += bench_mla(L, T, copy_gbps, args.replays, not args.no_inductor, args.split_len, mla_configs)
        if not args.no_gqa:
            for L in args.context:
                rows += bench_gqa(L, T, copy_gbps, args.replays, not args.no_inductor, gqa_configs)
        if not args.no_gqa_layer:
            for L in args.context:
                rows += bench_gqa_layer(L, T, copy_gbps, args.replays, not args.no_inductor)
    all_correct = all(r["correct"] for r in rows)
    if all_correct:
        _speedups(rows)
    else:
        bad = [f"{r['kernel']} {r['shape']} T={r['T']} {r['variant']} (rel RMS {r['rel_rms_err']:.2e})"
               for r in rows if not r["correct"]]
        print("CORRECTNESS CHECK FAILED, no speedups reported: " + "; ".join(bad))
    table = markdown_table(rows, [
        ("kernel", "kernel", "s"), ("shape", "shape", "s"), ("T", "T", "d"), ("variant", "variant", "s"),
        ("us", "us/call", ".2f"), ("us_min", "min", ".2f"), ("floor_us", "floor us", ".2f"),
        ("x_floor", "x floor", ".2f"), ("speedup_vs_eager", "x vs eager", ".2f"),
        ("speedup_vs_inductor", "x vs inductor", ".2f"), ("rel_rms_err", "rel RMS err", ".1e"),
        ("copies", "copies", "d"),
    ])
    header = f"copy bandwidth {copy_gbps:.0f} GB/s (read + write), floor = bytes moved / copy bandwidth\n\n"
    print(header + table)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "kernels_attn.md").write_text(header + table + "\n")
    path = write_json(args.out / "kernels_attn.json", {
        "benchmark": "kernels_attn", "preset": "flash-tp4-rank", "dtype": "bfloat16", "copy_gbps": copy_gbps,
        "mla_configs": {L: config_for(L, MLA_H, RANK, ROPE) for L in args.context}, "rtol_rms": RTOL,
        "all_correct": all_correct, "rows": rows,
    })
    print(f"\nwrote {path}")
    return 0 if all_correct else 1


if __name__ == "__main__":
    raise SystemExit(main())
