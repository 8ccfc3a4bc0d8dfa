"""A small hybrid KDA + MLA + MoE model written in plain PyTorch without lingc.models, in the
shape of Kimi Linear rather than Ling-3: the tests compile it with lingc to check that the passes
find the same math in another model's spelling.

Where it differs from lingc.models (on purpose):
- KDA: separate q/k/v projections, low-rank f and output-gate projections (two linears each),
  the convolution through F.conv1d on [window ; x], the unbounded gate
  -exp(A_log) * softplus(f + dt_bias), the state carried through a Python loop, the output norm
  as nn.RMSNorm on each head times sigmoid(gate);
- MLA: no head gate, RoPE through view_as_complex, the cache one [L, R + P] tensor per layer
  (no slot dimension) written with ``cache[pos] = rows``, the softmax written out; with
  ``textbook_mla`` the keys and values expanded from the cache every step (HF DeepSeek's decode);
- MoE: a router with one group (n_group = topk_group = 1), experts gathered by indexing a stacked
  [E, 2I, H] gate-up tensor, the shared expert as a module; in the Qwen3-Next forms Qwen3-Next's
  block (a softmax router, the shared expert behind a sigmoid gate);
- norms: nn.RMSNorm; caches and states passed as lists of tensors;
- precision: the recurrence, the attention and the router in fp32 whatever the weights' dtype
  (the KDA state fp32, windows and the MLA cache in the model's dtype).

``BatchedKimiStyleModel`` is the same model written the Hugging Face way, with a batch dim (of 1
at batch-1 decode) on every activation, state and cache: ids [1, T], KDA states [1, H, K, V]
updated by einsums over b, conv windows [1, 3, D, 3], the MLA cache [1, L, R + P] written with
``cache[:, pos] = rows``, the MoE over the flattened tokens, and all its norms (layers, MLA's
latent, KDA's gated output norm) in the Hugging Face Llama form (``HFRMSNorm``: ``weight *
normed.to(dtype)``, the same math in fp32, one more rounding in bf16 / fp16).
"""

from __future__ import annotations

import importlib.util
import itertools
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

HID, VOCAB = 32, 64
KH, KD = 2, 8                    # KDA heads, head dim (K = V)
MH, NOPE, ROPE, RANK, VD = 2, 8, 4, 16, 8
KVH = 1                          # Qwen3NextStyleAttention's key/value heads (its head dim NOPE + ROPE)
E, TOPK, INTER, SHARED = 8, 2, 16, 24
EPS = 1e-6
DIMS = ("HID", "VOCAB", "KH", "KD", "MH", "NOPE", "ROPE", "RANK", "VD", "E", "TOPK", "INTER", "SHARED", "QK_HEADS",
        "KVH")
_copies = itertools.count()


def with_dims(**dims: int):
    """A copy of this module with its sizes set (any of DIMS): every class of the copy builds
    and runs at those sizes, as its code reads them from its own module (benchmarks.foreign_decode
    runs the model at real per-GPU widths this way)."""
    unknown = sorted(set(dims) - set(DIMS))
    if unknown:
        raise ValueError(f"with_dims: unknown size(s) {unknown}; the sizes are {list(DIMS)}")
    name = f"foreign_model_{next(_copies)}"
    spec = importlib.util.spec_from_file_location(name, __file__)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module          # Dynamo finds a traced function's globals by module name
    spec.loader.exec_module(module)
    for name, value in dims.items():
        setattr(module, name, int(value))
    return module


def _w(g: torch.Generator, *shape: int, scale: float = 1.0) -> nn.Parameter:
    return nn.Parameter(torch.randn(*shape, generator=g) * scale / shape[-1] ** 0.5, requires_grad=False)


class KimiStyleKDA(nn.Module):
    def __init__(self, g: torch.Generator):
        super().__init__()
        D = KH * KD
        self.q, self.k, self.v = (nn.Linear(HID, D, bias=False) for _ in range(3))
        self.f_a, self.f_b = nn.Linear(HID, KD, bias=False), nn.Linear(KD, D, bias=False)
        self.g_a, self.g_b = nn.Linear(HID, KD, bias=False), nn.Linear(KD, D, bias=False)
        self.b = nn.Linear(HID, KH, bias=False)
        self.convs = nn.ParameterList([_w(g, D, 1, 4, scale=2.0) for _ in range(3)])
        self.A_log = nn.Parameter(torch.randn(KH, generator=g) * 0.5, requires_grad=False)
        self.dt_bias = nn.Parameter(torch.randn(D, generator=g) * 0.5, requires_grad=False)
        self.o_norm = nn.RMSNorm(KD, eps=1e-5)
        self.o = nn.Linear(D, HID, bias=False)

    def forward(self, x, state, window):
        """x [T, HID]; state [KH, KD, KD] fp32 and window [3, D, 3] updated in place."""
        T, D = x.shape[0], KH * KD
        acts = []
        for i, proj in enumerate((self.q, self.k, self.v)):
            seq = torch.cat([window[i], proj(x).T], dim=1)                      # [D, 3 + T]
            window[i].copy_(seq[:, -3:])
            acts.append(F.silu(F.conv1d(seq[None].float(), self.convs[i].float(), groups=D)[0].T))   # [T, D]
        return self.recur(x, state, acts)

    def recur(self, x, state, acts):
        """The chain after the convolutions: norms, gate, the delta rule, the gated output norm."""
        T = x.shape[0]
        q, k = (a.reshape(T, KH, KD) for a in acts[:2])
        v = acts[2].reshape(T, KH, -1)                   # (V = K here; wider in WideSplitCacheGDN)
        q = q / torch.sqrt(q.pow(2).sum(-1, keepdim=True) + EPS) * KD ** -0.5
        k = k / torch.sqrt(k.pow(2).sum(-1, keepdim=True) + EPS)
        decay = self.decay(x)
        beta = torch.sigmoid(self.b(x).float())
        S, outs = state, []
        for t in range(T):
            S = S * decay[t][:, :, None]
            kv = torch.einsum("hkv,hk->hv", S, k[t])
            S = S + torch.einsum("hk,hv->hkv", k[t], (v[t] - kv) * beta[t][:, None])
            outs.append(torch.einsum("hkv,hk->hv", S, q[t]))
        state.copy_(S)
        o = self.o_norm(torch.stack(outs).to(x.dtype)) * self.out_gate(self.g_b(self.g_a(x)).view(T, KH, -1))
        return self.o(o.reshape(T, -1))

    def decay(self, x):
        """exp(g) [T, KH, KD]: Kimi Linear's gate, one per channel."""
        f = self.f_b(self.f_a(x)).view(x.shape[0], KH, KD).float() + self.dt_bias.float().view(KH, KD)
        return (-self.A_log.float().exp()[:, None] * F.softplus(f)).exp()

    @staticmethod
    def out_gate(g):
        return torch.sigmoid(g)


class SplitCacheKDA(KimiStyleKDA):
    """KimiStyleKDA with flash-linear-attention's caches: q, k and v convolved into three caches
    of their own, [D, width] each (width 4: the conv's whole width, as fla's ShortConvolution
    keeps it; 3: the last W-1 inputs)."""

    def __init__(self, g: torch.Generator, width: int = 4):
        super().__init__(g)
        self.width = width

    def forward(self, x, state, windows):
        """x [T, HID]; state [KH, KD, KD] fp32 and the three windows [D, width] updated in place."""
        T, D = x.shape[0], KH * KD
        acts = []
        for i, proj in enumerate((self.q, self.k, self.v)):
            seq = torch.cat([windows[i], proj(x).T], dim=1)                   # [D, width + T]
            windows[i].copy_(seq[:, -self.width:])
            acts.append(F.silu(F.conv1d(seq[None].float(), self.convs[i].float(), groups=D)[0, :, -T:].T))
        return self.recur(x, state, acts)


class GatedDeltaNetStyle(KimiStyleKDA):
    """KimiStyleKDA's projections and convolutions with Gated DeltaNet's gate and output norm: one
    decay per head from a [T, KH] projection (dt_bias [KH]; f_a / f_b unused), the head norm gated
    by silu."""

    def __init__(self, g: torch.Generator):
        super().__init__(g)
        self.a = nn.Linear(HID, KH, bias=False)
        self.dt_bias = nn.Parameter(torch.randn(KH, generator=g) * 0.5, requires_grad=False)
        del self.f_a, self.f_b

    def decay(self, x):
        """exp(g) [T, KH, 1]: one decay for a head's KD channels."""
        a = self.a(x).float() + self.dt_bias.float()
        return (-self.A_log.float().exp() * F.softplus(a)).exp()[..., None]

    @staticmethod
    def out_gate(g):
        return F.silu(g)


class WideSplitCacheGDN(GatedDeltaNetStyle):
    """flash-linear-attention's GatedDeltaNet layer at its default expand_v = 2: q, k and v
    convolved into three caches of their own, v's twice as wide ([KH*vd, width], vd = 2 KD), one
    decay per head, the state [KH, KD, vd], the output norm over vd gated by silu."""

    def __init__(self, g: torch.Generator, width: int = 4, vd: int | None = None):
        super().__init__(g)
        vd = 2 * KD if vd is None else vd          # (read at call time: with_dims copies change KD)
        self.width, self.vd, DV = width, vd, KH * vd
        self.v = nn.Linear(HID, DV, bias=False)
        self.convs[2] = _w(g, DV, 1, 4, scale=2.0)
        self.g_b = nn.Linear(KD, DV, bias=False)
        self.o_norm = nn.RMSNorm(vd, eps=1e-5)
        self.o = nn.Linear(DV, HID, bias=False)

    def forward(self, x, state, windows):
        """x [T, HID]; state [KH, KD, vd] fp32, windows [D, width], [D, width], [KH*vd, width],
        all updated in place."""
        T, acts = x.shape[0], []
        for i, proj in enumerate((self.q, self.k, self.v)):
            seq = torch.cat([windows[i], proj(x).T], dim=1)                   # [C, width + T]
            windows[i].copy_(seq[:, -self.width:])
            acts.append(F.silu(F.conv1d(seq[None].float(), self.convs[i].float(), groups=seq.shape[0])[0, :, -T:].T))
        return self.recur(x, state, acts)


QK_HEADS = 1                     # Qwen3NextStyleGDN's q/k heads, each serving KH // QK_HEADS value heads


class HFRMSNormGated(nn.RMSNorm):
    """Hugging Face's Qwen3NextRMSNormGated: the head norm in the Llama form, times silu of the
    gate in fp32, rounded once (in a 16-bit model: ``(w * normed.to(dt)) * silu(gate.float())``)."""

    def forward(self, h, gate):
        dt = h.dtype
        hf = h.to(torch.float32)
        hf = hf * torch.rsqrt(hf.pow(2).mean(-1, keepdim=True) + self.eps)
        return ((self.weight * hf.to(dt)) * F.silu(gate.to(torch.float32))).to(dt)


class Qwen3NextStyleGDN(nn.Module):
    """Gated DeltaNet as Qwen3-Next's decode writes it (Hugging Face's torch path): fewer q/k heads
    than value heads (q and k repeat_interleave'd onto them), one depthwise convolution over the
    concatenated q, k and v channels with one [C, 3] cache, the per-head softplus gate, the
    recurrence as Hugging Face's torch path writes it, and its gated head norm (HFRMSNormGated). ``fused_qkvz``: q, k, v and z from one projection grouped per q/k
    head (``fix_query_key_value_ordering``) and b, a from another, as Qwen3-Next; otherwise
    Qwen3.5's separate projections, mixed_qkv the convolution's input straight from its own.
    ``width``: the cache's columns a channel, 4 as Hugging Face's (the conv's whole width: the
    convolution over [cache ; new] yields T + 1 outputs, the last T kept) or 3 as vLLM's.
    ``vd``: the value head dim (KD; 2 * KD is flash-linear-attention's expand_v = 2): the state
    is [KH, KD, vd], the output norm over vd."""

    def __init__(self, g: torch.Generator, fused_qkvz: bool = True, width: int = 4, vd: int | None = None):
        super().__init__()
        vd = KD if vd is None else vd              # (read at call time: with_dims copies change KD)
        self.fused_qkvz, self.width, self.vd = fused_qkvz, width, vd
        self.dqk, self.dv = QK_HEADS * KD, KH * vd
        self.C = 2 * self.dqk + self.dv
        if fused_qkvz:
            self.in_proj_qkvz = nn.Linear(HID, 2 * self.dqk + 2 * self.dv, bias=False)
            self.in_proj_ba = nn.Linear(HID, 2 * KH, bias=False)
        else:
            self.in_proj_qkv = nn.Linear(HID, self.C, bias=False)
            self.in_proj_z = nn.Linear(HID, self.dv, bias=False)
            self.in_proj_b, self.in_proj_a = nn.Linear(HID, KH, bias=False), nn.Linear(HID, KH, bias=False)
        self.conv = _w(g, self.C, 1, 4, scale=2.0)
        self.A_log = nn.Parameter(torch.randn(KH, generator=g) * 0.5, requires_grad=False)
        self.dt_bias = nn.Parameter(torch.randn(KH, generator=g) * 0.5, requires_grad=False)
        self.o_norm = HFRMSNormGated(vd, eps=1e-5)
        self.o = nn.Linear(self.dv, HID, bias=False)

    def projections(self, x):
        """(mixed_qkv [T, C], z [T, KH, vd], b [T, KH], a [T, KH])."""
        T, G, vd = x.shape[0], KH // QK_HEADS, self.vd
        if not self.fused_qkvz:
            return (self.in_proj_qkv(x), self.in_proj_z(x).view(T, KH, vd), self.in_proj_b(x),
                    self.in_proj_a(x))
        qkvz = self.in_proj_qkvz(x).view(T, QK_HEADS, 2 * KD + 2 * G * vd)
        q, k, v, z = torch.split(qkvz, [KD, KD, G * vd, G * vd], dim=2)
        b, a = torch.split(self.in_proj_ba(x).view(T, QK_HEADS, 2 * G), [G, G], dim=2)
        mixed = torch.cat([q.reshape(T, -1), k.reshape(T, -1), v.reshape(T, -1)], dim=-1)
        return mixed, z.reshape(T, KH, vd), b.reshape(T, KH), a.reshape(T, KH)

    def forward(self, x, state, window):
        """x [T, HID]; state [KH, KD, vd] fp32 and window [C, width] updated in place."""
        T, G = x.shape[0], KH // QK_HEADS
        mixed, z, b, a = self.projections(x)
        seq = torch.cat([window, mixed.T], dim=-1)                               # [C, width + T]
        window.copy_(seq[:, -self.width:])
        mixed = F.silu(F.conv1d(seq[None].float(), self.conv.float(), groups=self.C)[0, :, -T:].T)   # [T, C]
        q, k, v = torch.split(mixed, [self.dqk, self.dqk, self.dv], dim=-1)
        q = q.reshape(1, T, QK_HEADS, KD).repeat_interleave(G, dim=2)
        k = k.reshape(1, T, QK_HEADS, KD).repeat_interleave(G, dim=2)
        v = v.reshape(1, T, KH, self.vd)
        g = -self.A_log.float().exp() * F.softplus(a.float() + self.dt_bias.float())       # [T, KH]
        o = self.recurrent_gated_delta_rule(q, k, v, g[None], b.float().sigmoid()[None], state)
        o = self.o_norm(o[0].to(x.dtype), z)
        return self.o(o.reshape(T, self.dv))

    @staticmethod
    def recurrent_gated_delta_rule(q, k, v, g, beta, state):
        """Hugging Face's torch_recurrent_gated_delta_rule (q, k, v [1, T, H, K], g and beta
        [1, T, H]): the l2 norms by rsqrt, [1, H, T, K] layouts, the output written into a zeros
        tensor position by position; the state [H, K, V] written back in place (the cache)."""
        def l2norm(x):
            return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + 1e-6)

        q, k = l2norm(q), l2norm(k)
        q, k, v, beta, g = (x.transpose(1, 2).contiguous().to(torch.float32) for x in (q, k, v, beta, g))
        B, H, T, K = k.shape
        q = q * K ** -0.5
        out = torch.zeros(B, H, T, v.shape[-1]).to(v)
        S = state[None].to(v)
        for i in range(T):
            S = S * g[:, :, i].exp()[..., None, None]
            kv_mem = (S * k[:, :, i].unsqueeze(-1)).sum(dim=-2)
            delta = (v[:, :, i] - kv_mem) * beta[:, :, i].unsqueeze(-1)
            S = S + k[:, :, i].unsqueeze(-1) * delta.unsqueeze(-2)
            out[:, :, i] = (S * q[:, :, i].unsqueeze(-1)).sum(dim=-2)
        state.copy_(S[0])
        return out.transpose(1, 2).contiguous()                                  # [1, T, H, V]


class HFCacheGDN(Qwen3NextStyleGDN):
    """Qwen3NextStyleGDN with Hugging Face's cache object: forward(x, states, window) reads the
    state from the list ``states`` and re-binds ``states[0]`` to the new one
    (``cache.recurrent_states[i] = S``) rather than writing it in place; the window is written in
    place (Hugging Face's conv update copies into its cache)."""

    def forward(self, x, states, window):
        state = states[0].clone()            # the recurrence below writes its argument: a copy
        y = super().forward(x, state, window)
        states[0] = state
        return y


class KimiStyleMLA(nn.Module):
    """``rotate=False``: the rope dims are never rotated (Kimi Linear's ``mla_use_nope``: NoPE
    attention with the 64 rope dims kept, q_pe and k_pe used as they are)."""

    def __init__(self, g: torch.Generator, textbook: bool = False, rotate: bool = True):
        super().__init__()
        self.textbook, self.rotate = textbook, rotate
        self.q = nn.Linear(HID, MH * (NOPE + ROPE), bias=False)
        self.kv_a = nn.Linear(HID, RANK + ROPE, bias=False)
        self.kv_norm = nn.RMSNorm(RANK, eps=EPS)
        self.kv_b = _w(g, MH, NOPE + VD, RANK)
        self.o = nn.Linear(MH * VD, HID, bias=False)
        self.register_buffer("freq", 1.0 / (1000.0 ** (torch.arange(0, ROPE, 2).float() / ROPE)), persistent=False)

    def rope(self, x, pos):
        if not self.rotate:
            return x.float()
        ang = pos.float()[:, None] * self.freq[None]
        rot = torch.polar(torch.ones_like(ang), ang)
        xc = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2).contiguous())
        return torch.view_as_real(xc * rot.view((x.shape[0],) + (1,) * (x.dim() - 2) + (ROPE // 2,))).flatten(-2)

    def forward(self, x, pos, cache):
        T, L = x.shape[0], cache.shape[0]
        q = self.q(x).view(T, MH, NOPE + ROPE)
        kv = self.kv_a(x)
        cache[pos] = torch.cat([self.kv_norm(kv[:, :RANK]).float(), self.rope(kv[:, RANK:], pos)], -1).to(cache.dtype)
        if self.textbook:
            return self.o(self.attend_expanded(q, pos, cache).reshape(T, MH * VD).to(x.dtype))
        q_lat = torch.einsum("thn,hnr->thr", q[..., :NOPE].float(), self.kv_b[:, :NOPE].float())
        c, k_rope = cache[:, :RANK].float(), cache[:, RANK:].float()
        s = (torch.einsum("thr,lr->thl", q_lat, c) + torch.einsum("thp,lp->thl", self.rope(q[..., NOPE:], pos),
                                                                 k_rope)) * (NOPE + ROPE) ** -0.5
        s = s.masked_fill(torch.arange(L, device=x.device)[None, None, :] > pos[:, None, None], float("-inf"))
        e = torch.exp(s - s.max(-1, keepdim=True).values)
        o = torch.einsum("thr,hvr->thv", (e / e.sum(-1, keepdim=True)) @ c, self.kv_b[:, NOPE:].float())
        return self.o(o.reshape(T, MH * VD).to(x.dtype))


    def attend_expanded(self, q, pos, cache):
        """The textbook form (HF DeepSeek-style decode): every cache row expanded through kv_b
        into per-head keys and values, then ordinary causal attention. [T, H, v] fp32."""
        T, L = q.shape[0], cache.shape[0]
        kvb = (cache[:, :RANK].float() @ self.kv_b.float().reshape(-1, RANK).T).view(L, MH, NOPE + VD)
        k = torch.cat([kvb[..., :NOPE], cache[:, None, RANK:].float().expand(L, MH, ROPE)], -1)
        qf = torch.cat([q[..., :NOPE].float(), self.rope(q[..., NOPE:], pos)], -1)
        s = torch.einsum("thd,lhd->thl", qf, k) * (NOPE + ROPE) ** -0.5
        s = s.masked_fill(torch.arange(L, device=q.device)[None, None, :] > pos[:, None, None], float("-inf"))
        return torch.einsum("thl,lhv->thv", s.softmax(-1), kvb[..., NOPE:])



class NoPEStyleMLA(nn.Module):
    """An MLA without rope dims (qk_rope_head_dim = 0: NoPE attention, as the DeepSeek-sparse-style
    MLA of newer hybrids): the latent cache [L, R] alone, absorbed or (``textbook``) with keys and
    values expanded from it every step."""

    def __init__(self, g: torch.Generator, textbook: bool = False):
        super().__init__()
        self.textbook = textbook
        self.q = nn.Linear(HID, MH * NOPE, bias=False)
        self.kv_a = nn.Linear(HID, RANK, bias=False)
        self.kv_norm = nn.RMSNorm(RANK, eps=EPS)
        self.kv_b = _w(g, MH, NOPE + VD, RANK)
        self.o = nn.Linear(MH * VD, HID, bias=False)

    def forward(self, x, pos, cache):
        T, L = x.shape[0], cache.shape[0]
        q = self.q(x).view(T, MH, NOPE).float()
        cache[pos] = self.kv_norm(self.kv_a(x)).to(cache.dtype)
        c = cache.float()
        hidden = torch.arange(L, device=x.device)[None, None, :] > pos[:, None, None]
        if self.textbook:
            kvb = (c @ self.kv_b.float().reshape(-1, RANK).T).view(L, MH, NOPE + VD)
            s = torch.einsum("thd,lhd->thl", q, kvb[..., :NOPE]) * NOPE ** -0.5
            o = torch.einsum("thl,lhv->thv", s.masked_fill(hidden, float("-inf")).softmax(-1), kvb[..., NOPE:])
        else:
            q_lat = torch.einsum("thn,hnr->thr", q, self.kv_b[:, :NOPE].float())
            s = torch.einsum("thr,lr->thl", q_lat, c) * NOPE ** -0.5
            o = torch.einsum("thr,hvr->thv", s.masked_fill(hidden, float("-inf")).softmax(-1) @ c,
                             self.kv_b[:, NOPE:].float())
        return self.o(o.reshape(T, MH * VD).to(x.dtype))

ROPE_TABLE_ROWS = 256       # Qwen3NextStyleAttention's rope tables (rope_table=True): positions below it


class Qwen3NextStyleAttention(nn.Module):
    """Qwen3-Next's gated full attention (Hugging Face's Qwen3NextAttention at batch 1): q_proj
    gives each of MH heads its query and an output gate ([T, MH, 2 * HD], HD = NOPE + ROPE),
    zero-centred RMSNorms on each head's query and key, the rotary embedding (rotate_half) on the
    first ROPE dims of each head, GQA over KVH key/value heads (SDPA with enable_gqa) on one cache
    [L, 2, KVH, HD] holding keys and values, the output times sigmoid(gate), o_proj. With
    ``rope_table`` cos and sin come from tables built once (Hugging Face's older cos_cached /
    sin_cached [ROPE_TABLE_ROWS, ROPE], each half repeated) read at the positions."""

    def __init__(self, g: torch.Generator, rope_table: bool = False):
        super().__init__()
        hd = NOPE + ROPE
        self.q = nn.Linear(HID, MH * 2 * hd, bias=False)
        self.k, self.v = nn.Linear(HID, KVH * hd, bias=False), nn.Linear(HID, KVH * hd, bias=False)
        self.q_norm, self.k_norm = ZeroCenteredRMSNorm(hd, eps=EPS), ZeroCenteredRMSNorm(hd, eps=EPS)
        self.o = nn.Linear(MH * hd, HID, bias=False)
        self.register_buffer("freq", 1.0 / (10000.0 ** (torch.arange(0, ROPE, 2).float() / ROPE)), persistent=False)
        self.rope_table = rope_table
        if rope_table:
            emb = torch.arange(ROPE_TABLE_ROWS).float()[:, None] * self.freq[None]
            emb = torch.cat([emb, emb], -1)
            self.register_buffer("cos_cached", emb.cos(), persistent=False)
            self.register_buffer("sin_cached", emb.sin(), persistent=False)

    def rope(self, x, pos):
        """x [T, heads, HD]: rotate_half on the first ROPE dims, the rest passed through."""
        if self.rope_table:
            cos, sin = self.cos_cached[pos][:, None].to(x.dtype), self.sin_cached[pos][:, None].to(x.dtype)
        else:
            ang = pos.float()[:, None] * self.freq[None]
            cos = torch.cat([ang.cos()] * 2, -1)[:, None].to(x.dtype)
            sin = torch.cat([ang.sin()] * 2, -1)[:, None].to(x.dtype)
        r, rest = x[..., :ROPE], x[..., ROPE:]
        half = torch.cat([-r[..., ROPE // 2:], r[..., :ROPE // 2]], -1)
        return torch.cat([r * cos + half * sin, rest], -1)

    def forward(self, x, pos, cache):
        T, L, hd = x.shape[0], cache.shape[0], NOPE + ROPE
        q, gate = self.q(x).view(T, MH, 2 * hd).chunk(2, -1)
        q = self.rope(self.q_norm(q), pos)
        k = self.rope(self.k_norm(self.k(x).view(T, KVH, hd)), pos)
        cache[pos] = torch.stack([k, self.v(x).view(T, KVH, hd)], 1).to(cache.dtype)
        visible = torch.arange(L, device=x.device)[None, :] <= pos[:, None]
        o = F.scaled_dot_product_attention(q.transpose(0, 1)[None], cache[:, 0].transpose(0, 1)[None],
                                           cache[:, 1].transpose(0, 1)[None], attn_mask=visible[None, None],
                                           enable_gqa=True)[0].transpose(0, 1)
        return self.o((o * torch.sigmoid(gate)).reshape(T, MH * hd))


class SharedExpert(nn.Module):
    def __init__(self):
        super().__init__()
        self.gate, self.up = nn.Linear(HID, SHARED, bias=False), nn.Linear(HID, SHARED, bias=False)
        self.down = nn.Linear(SHARED, HID, bias=False)

    def forward(self, x):
        return self.down(F.silu(self.gate(x)) * self.up(x))


class KimiStyleMoE(nn.Module):
    def __init__(self, g: torch.Generator):
        super().__init__()
        self.router = _w(g, E, HID, scale=4.0)
        self.bias = nn.Parameter(torch.randn(E, generator=g) * 0.1, requires_grad=False)
        self.w13 = _w(g, E, 2 * INTER, HID)
        self.w2 = _w(g, E, HID, INTER)
        self.shared = SharedExpert()

    def forward(self, x):
        T = x.shape[0]
        scores = torch.sigmoid(x.float() @ self.router.float().T)
        ids = torch.topk(scores + self.bias, TOPK, dim=-1).indices
        w = scores.gather(1, ids)
        w = w / w.sum(-1, keepdim=True) * 2.0
        gu = torch.einsum("th,tkih->tki", x, self.w13[ids])                  # [T, TOPK, 2I]
        h = F.silu(gu[..., :INTER]) * gu[..., INTER:]
        y = torch.einsum("tki,tkhi->tkh", h, self.w2[ids])
        return (y * w[..., None].to(y.dtype)).sum(1) + self.shared(x)


class KimiLinearStyleMoE(KimiStyleMoE):
    """Kimi Linear's (and DeepSeek-V3's) MoE gate as their Hugging Face code writes it: sigmoid
    scores plus the correction bias, the group score the sum of a group's top two, the best
    groups kept and the others filled with 0.0 (not -inf) before an unsorted top-k, the unbiased
    scores renormalised with an epsilon and scaled."""

    GROUPS, KEEP, SCALE = 4, 2, 2.446

    def forward(self, x):
        T = x.shape[0]
        scores = F.linear(x.float(), self.router.float()).sigmoid()
        choice = scores + self.bias.unsqueeze(0)
        group_scores = choice.view(T, self.GROUPS, -1).topk(2, dim=-1)[0].sum(dim=-1)
        group_idx = torch.topk(group_scores, k=self.KEEP, dim=-1, sorted=False)[1]
        group_mask = torch.zeros_like(group_scores)
        group_mask.scatter_(1, group_idx, 1)
        score_mask = group_mask.unsqueeze(-1).expand(T, self.GROUPS, E // self.GROUPS).reshape(T, -1)
        ids = torch.topk(choice.masked_fill(~score_mask.bool(), 0.0), k=TOPK, dim=-1, sorted=False)[1]
        w = scores.gather(1, ids)
        w = w / (w.sum(dim=-1, keepdim=True) + 1e-20) * self.SCALE
        gu = torch.einsum("th,tkih->tki", x, self.w13[ids])                  # [T, TOPK, 2I]
        h = F.silu(gu[..., :INTER]) * gu[..., INTER:]
        y = torch.einsum("tki,tkhi->tkh", h, self.w2[ids])
        return (y * w[..., None].to(y.dtype)).sum(1) + self.shared(x)


class Qwen3NextStyleMoE(nn.Module):
    """Qwen3-Next's sparse MoE block as Transformers writes it: a softmax router over all experts
    (its logits in fp32, as every router of this file), the top-k probabilities renormalised
    (norm_topk_prob), the experts gathered from a stacked w13, and the shared expert behind a
    sigmoid gate, `shared_expert_gate` (a Linear(H, 1) without bias). ``grouped_mm``: the experts
    as Transformers' grouped_mm experts backend runs them (bf16 only under torch.compile): the
    (token, slot) pairs sorted by expert, torch._grouped_mm over the sorted rows with offsets from
    a histc, the rows put back and index_add_-ed into zeros."""

    def __init__(self, g: torch.Generator, grouped_mm: bool = False):
        super().__init__()
        self.router = _w(g, E, HID, scale=4.0)
        self.w13 = _w(g, E, 2 * INTER, HID)
        self.w2 = _w(g, E, HID, INTER)
        self.shared = SharedExpert()
        self.shared_expert_gate = nn.Linear(HID, 1, bias=False)
        self.grouped_mm = grouped_mm

    def forward(self, x):
        probs = F.softmax(F.linear(x.float(), self.router.float()), dim=-1)
        w, ids = torch.topk(probs, TOPK, dim=-1)
        w = (w / w.sum(-1, keepdim=True)).to(x.dtype)
        shared = F.sigmoid(self.shared_expert_gate(x)) * self.shared(x)
        if self.grouped_mm:
            return self.grouped_experts(x, ids, w) + shared
        gu = torch.einsum("th,tkih->tki", x, self.w13[ids])                  # [T, TOPK, 2I]
        h = F.silu(gu[..., :INTER]) * gu[..., INTER:]
        y = torch.einsum("tki,tkhi->tkh", h, self.w2[ids])
        return (y * w[..., None]).sum(1) + shared

    def grouped_experts(self, x, ids, w):
        pair_expert = ids.reshape(-1)
        pair_token = torch.arange(x.shape[0], device=x.device).unsqueeze(1).expand(-1, TOPK).reshape(-1)
        perm = torch.argsort(pair_expert, stable=True)
        counts = torch.histc(pair_expert[perm].float(), bins=E, min=0, max=E - 1)
        ends = torch.cumsum(counts, dim=0, dtype=torch.int32)
        gu = torch._grouped_mm(x[pair_token][perm], self.w13.transpose(-2, -1), offs=ends)
        g, u = gu.chunk(2, dim=-1)
        y = torch._grouped_mm(F.silu(g) * u, self.w2.transpose(-2, -1), offs=ends)
        y = (y * w.reshape(-1)[perm].unsqueeze(-1))[torch.argsort(perm, stable=True)]
        return torch.zeros_like(x).index_add_(0, pair_token, y.to(x.dtype))


class KimiStyleModel(nn.Module):
    """Layers: KDA + MoE, KDA + MoE, MLA + MoE. forward(ids [T], pos [T], states, windows, caches)
    -> logits [T, VOCAB]; the KDA states / windows and the MLA caches are written in place."""

    def __init__(self, seed: int = 0, textbook_mla: bool = False, gdn: bool | str = False,
                 kimi_linear: bool = False, grouped_mm: bool = False, gated_attention: bool = False,
                 rope_table: bool = False):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.embed = nn.Embedding(VOCAB, HID)
        # gdn: Gated DeltaNet's layers; "qwen3-next" / "qwen3.5": Qwen3NextStyleGDN's (grouped
        # heads, one fused convolution; the fused qkvz / ba projections and Hugging Face's
        # 4-column cache, or separate projections and a 3-column cache: fresh_state's
        # fused_conv=4 or 3).
        linear = {False: KimiStyleKDA, True: GatedDeltaNetStyle,
                  "qwen3-next": lambda g: Qwen3NextStyleGDN(g, fused_qkvz=True, width=4),
                  "qwen3.5": lambda g: Qwen3NextStyleGDN(g, fused_qkvz=False, width=3)}[gdn]
        # kimi_linear: Kimi Linear's MLA (rope dims never rotated) and MoE gate (grouped, 0-filled).
        # gated_attention: Qwen3-Next's gated GQA full attention in the third layer instead of MLA
        # (its cache [L, 2, KVH, NOPE + ROPE]: fresh_state's gated_attention).
        layers = [linear(g), linear(g)]           # first: the generator's draws keep their order
        # rope_table: that attention's cos / sin from tables built once (Hugging Face's cos_cached).
        layers.append(Qwen3NextStyleAttention(g, rope_table) if gated_attention
                      else KimiStyleMLA(g, textbook_mla, rotate=not kimi_linear))
        self.attn = nn.ModuleList(layers)
        # Qwen3-Next's forms take its MoE block too (softmax router, gated shared expert), its
        # experts as Transformers' grouped_mm backend runs them with grouped_mm (bf16 only).
        if gdn in ("qwen3-next", "qwen3.5"):
            self.moe = nn.ModuleList([Qwen3NextStyleMoE(g, grouped_mm) for _ in range(3)])
        elif grouped_mm:
            raise ValueError("grouped_mm experts are written for gdn='qwen3-next' or 'qwen3.5' only")
        else:
            moe = KimiLinearStyleMoE if kimi_linear else KimiStyleMoE
            self.moe = nn.ModuleList([moe(g) for _ in range(3)])
        self.norms = nn.ModuleList([nn.RMSNorm(HID, eps=EPS) for _ in range(7)])
        self.lm_head = nn.Linear(HID, VOCAB, bias=False)
        torch.manual_seed(seed)
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, std=0.3)
            if isinstance(m, nn.RMSNorm):
                nn.init.normal_(m.weight, 1.0, 0.1)
        self.eval().requires_grad_(False)

    def forward(self, ids, pos, states, windows, caches):
        return self.lm_head(self.norms[6](self.body(ids, pos, states, windows, caches)))

    def target(self, ids, pos, states, windows, caches):
        """(logits, the last layer's output before the final norm): what an MTP draft reads."""
        x = self.body(ids, pos, states, windows, caches)
        return self.lm_head(self.norms[6](x)), x

    def body(self, ids, pos, states, windows, caches):
        x = self.embed(ids)
        for i, (attn, moe) in enumerate(zip(self.attn, self.moe)):
            h = self.norms[2 * i](x)
            h = attn(h, states[i], windows[i]) if i < 2 else attn(h, pos, caches[0])
            x = x + h
            x = x + moe(self.norms[2 * i + 1](x))
        return x

    @staticmethod
    def fresh_state(seed: int = 1, cache_len: int = 24, dtype: torch.dtype = torch.float32, fused_conv: int = 0,
                    gated_attention: bool = False):
        """States, conv windows ([3, D, 3], or with ``fused_conv`` = 3 or 4 Qwen3NextStyleGDN's
        one [C, fused_conv] block) and the MLA cache (with ``gated_attention`` the gated
        attention's [L, 2, KVH, NOPE + ROPE] keys and values), random."""
        g = torch.Generator().manual_seed(seed)
        states = [torch.randn(KH, KD, KD, generator=g) * 0.3 for _ in range(2)]
        win = (2 * QK_HEADS * KD + KH * KD, fused_conv) if fused_conv else (3, KH * KD, 3)
        windows = [torch.randn(*win, generator=g).to(dtype) for _ in range(2)]
        row = (2, KVH, NOPE + ROPE) if gated_attention else (RANK + ROPE,)
        caches = [torch.randn(cache_len, *row, generator=g).to(dtype)]
        return states, windows, caches


class MtpDraft(nn.Module):
    """A multi-token-prediction draft layer for KimiStyleModel, written as DeepSeek-V3's and
    Qwen3-Next's MTP modules are: the next token's embedding and the target's hidden state, each
    RMS-normed, concatenated and projected (eh_proj), one decoder layer of the target's third
    layer's kind (MLA or the gated GQA attention, and its MoE) over a cache of its own, the final
    norm and the target's lm_head (shared, as the embedding). forward(ids [T], pos [T], hidden
    [T, HID], cache) -> (logits [T, VOCAB], hidden [T, HID]); the cache row at pos is written."""

    def __init__(self, target: KimiStyleModel, seed: int = 7):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.embed, self.lm_head = target.embed, target.lm_head
        self.enorm, self.hnorm = nn.RMSNorm(HID, eps=EPS), nn.RMSNorm(HID, eps=EPS)
        self.eh_proj = nn.Linear(2 * HID, HID, bias=False)
        like = target.attn[2]
        self.attn = (Qwen3NextStyleAttention(g, like.rope_table) if isinstance(like, Qwen3NextStyleAttention)
                     else KimiStyleMLA(g, like.textbook, like.rotate))
        moe = target.moe[2]
        self.moe = Qwen3NextStyleMoE(g, moe.grouped_mm) if isinstance(moe, Qwen3NextStyleMoE) else type(moe)(g)
        self.norms = nn.ModuleList([nn.RMSNorm(HID, eps=EPS) for _ in range(3)])
        torch.manual_seed(seed)
        for m in [self.eh_proj, *self.attn.modules(), *self.moe.modules(), self.enorm, self.hnorm, *self.norms]:
            if isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, std=0.3)
            if isinstance(m, nn.RMSNorm):
                nn.init.normal_(m.weight, 1.0, 0.1)
        self.to(target.lm_head.weight.device, target.lm_head.weight.dtype).eval().requires_grad_(False)

    def forward(self, ids, pos, hidden, cache):
        x = self.eh_proj(torch.cat([self.enorm(self.embed(ids)), self.hnorm(hidden)], -1))
        x = x + self.attn(self.norms[0](x), pos, cache)
        x = x + self.moe(self.norms[1](x))
        return self.lm_head(self.norms[2](x)), x

    @staticmethod
    def fresh_cache(cache_len: int = 24, dtype: torch.dtype = torch.float32, gated_attention: bool = False):
        """The draft's one cache, zeroed (a request zeroes it anyway)."""
        row = (2, KVH, NOPE + ROPE) if gated_attention else (RANK + ROPE,)
        return [torch.zeros(cache_len, *row, dtype=dtype)]


class BatchedKDA(KimiStyleKDA):
    def forward(self, x, state, window):
        """x [B, T, HID]; state [B, KH, KD, KD] fp32 and window [B, 3, D, 3] updated in place."""
        B, T, D = x.shape[0], x.shape[1], KH * KD
        acts = []
        for i, proj in enumerate((self.q, self.k, self.v)):
            seq = torch.cat([window[:, i], proj(x).transpose(1, 2)], dim=2)              # [B, D, 3 + T]
            window[:, i].copy_(seq[:, :, -3:])
            acts.append(F.silu(F.conv1d(seq.float(), self.convs[i].float(), groups=D).transpose(1, 2)))
        q, k, v = (a.reshape(B, T, KH, KD) for a in acts)
        q = q / torch.sqrt(q.pow(2).sum(-1, keepdim=True) + EPS) * KD ** -0.5
        k = k / torch.sqrt(k.pow(2).sum(-1, keepdim=True) + EPS)
        f = self.f_b(self.f_a(x)).view(B, T, KH, KD).float() + self.dt_bias.float().view(KH, KD)
        decay = (-self.A_log.float().exp()[:, None] * F.softplus(f)).exp()
        beta = torch.sigmoid(self.b(x).float())                                           # [B, T, KH]
        S, outs = state, []
        for t in range(T):
            S = S * decay[:, t, :, :, None]
            kv = torch.einsum("bhkv,bhk->bhv", S, k[:, t])
            S = S + torch.einsum("bhk,bhv->bhkv", k[:, t], (v[:, t] - kv) * beta[:, t, :, None])
            outs.append(torch.einsum("bhkv,bhk->bhv", S, q[:, t]))
        state.copy_(S)
        o = self.o_norm(torch.stack(outs, 1).to(x.dtype)) * torch.sigmoid(self.g_b(self.g_a(x)).view(B, T, KH, KD))
        return self.o(o.reshape(B, T, D))


class BatchedMLA(KimiStyleMLA):
    def rope(self, x, pos):
        """x [B, T, (H,) P] at positions pos [T]."""
        ang = pos.float()[:, None] * self.freq[None]
        rot = torch.polar(torch.ones_like(ang), ang).view((1, x.shape[1]) + (1,) * (x.dim() - 3) + (ROPE // 2,))
        xc = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2).contiguous())
        return torch.view_as_real(xc * rot).flatten(-2)

    def forward(self, x, pos, cache):
        """x [B, T, HID]; cache [B, L, R + P]."""
        B, T, L = x.shape[0], x.shape[1], cache.shape[1]
        q = self.q(x).view(B, T, MH, NOPE + ROPE)
        kv = self.kv_a(x)
        cache[:, pos] = torch.cat([self.kv_norm(kv[..., :RANK]).float(), self.rope(kv[..., RANK:], pos)],
                                  -1).to(cache.dtype)
        hidden = torch.arange(L, device=x.device)[None, :] > pos[:, None]                 # [T, L]
        if self.textbook:
            kvb = (cache[..., :RANK].float() @ self.kv_b.float().reshape(-1, RANK).T).view(B, L, MH, NOPE + VD)
            k = torch.cat([kvb[..., :NOPE], cache[:, :, None, RANK:].float().expand(B, L, MH, ROPE)], -1)
            qf = torch.cat([q[..., :NOPE].float(), self.rope(q[..., NOPE:], pos)], -1)
            s = torch.einsum("bthd,blhd->bhtl", qf, k) * (NOPE + ROPE) ** -0.5
            o = torch.einsum("bhtl,blhv->bthv", s.masked_fill(hidden[None, None], float("-inf")).softmax(-1),
                             kvb[..., NOPE:])
            return self.o(o.reshape(B, T, MH * VD).to(x.dtype))
        q_lat = torch.einsum("bthn,hnr->bthr", q[..., :NOPE].float(), self.kv_b[:, :NOPE].float())
        c, k_rope = cache[..., :RANK].float(), cache[..., RANK:].float()
        s = (torch.einsum("bthr,blr->bthl", q_lat, c)
             + torch.einsum("bthp,blp->bthl", self.rope(q[..., NOPE:], pos), k_rope)) * (NOPE + ROPE) ** -0.5
        p = s.masked_fill(hidden[None, :, None], float("-inf")).softmax(-1)
        o = torch.einsum("bthr,hvr->bthv", torch.einsum("bthl,blr->bthr", p, c), self.kv_b[:, NOPE:].float())
        return self.o(o.reshape(B, T, MH * VD).to(x.dtype))


class BatchedMoE(KimiStyleMoE):
    def forward(self, x):
        return super().forward(x.reshape(-1, x.shape[-1])).view(x.shape)


class HFRMSNorm(nn.RMSNorm):
    """nn.RMSNorm's weights with the Hugging Face Llama forward (``weight * normed.to(dtype)``:
    in a 16-bit model the normed row is rounded before the weight multiplies it)."""

    def forward(self, h):
        dt = h.dtype
        h = h.to(torch.float32)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(dt)


class ZeroCenteredRMSNorm(nn.RMSNorm):
    """nn.RMSNorm's weight read as a zero-centred one, with Gemma's and Qwen3-Next's forward (the
    gain 1 + w in fp32, the row rounded once)."""

    def forward(self, h):
        hf = h.float()
        out = hf * torch.rsqrt(hf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (out * (1.0 + self.weight.float())).type_as(h)


class BatchedKimiStyleModel(KimiStyleModel):
    """KimiStyleModel's weights and math with a batch dim on everything and every norm in the
    Hugging Face Llama form (the module docstring; the same math in fp32).
    forward(ids [B, T], pos [T], states, windows, caches) -> logits [B, T, VOCAB]."""

    def __init__(self, seed: int = 0, textbook_mla: bool = False):
        super().__init__(seed, textbook_mla)
        for m in self.attn:
            if isinstance(m, KimiStyleMLA):
                m.__class__ = BatchedMLA
                m.kv_norm.__class__ = HFRMSNorm          # the latent norm too (DeepSeek's HF code)
            else:
                m.__class__ = BatchedKDA
                m.o_norm.__class__ = HFRMSNorm           # the output head norm, before its gate
        for m in self.moe:
            m.__class__ = BatchedMoE
        for m in self.norms:
            m.__class__ = HFRMSNorm

    @staticmethod
    def fresh_state(seed: int = 1, cache_len: int = 24, dtype: torch.dtype = torch.float32):
        return tuple([t[None].clone() for t in group] for group in KimiStyleModel.fresh_state(seed, cache_len, dtype))
