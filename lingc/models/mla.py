"""MLA attention layer (direct-q, head-wise gated), attending in latent space over the cache.

q = q_proj(x) splits per head into nope (qk_nope) and rope (qk_rope) parts. kv_a_proj_with_mqa(x)
gives the latent c (kv_lora_rank, then kv_a_layernorm) and one shared rope key. The cache stores
[c ; roped k_rope] per token and is never expanded: kv_b_proj is absorbed, its k half into the
query (q_lat = q_nope @ W_k) and its v half into the output (o = (p @ c) @ W_v^T). Softmax scale
(qk_nope + qk_rope)^-0.5; interleaved RoPE; each head's output times sigmoid(g_proj(x))[head];
then `dense`. The causal mask compares cache rows with the query positions (device tensors), which
serves T=1 decode, T=6 chain verify and causal prefill alike.

A prefill chunk longer than QUERY_BLOCK, in eager mode, attends in one of PREFILL_FORMS
(`prefill_attention_form`):
- "expanded" (CUDA, an fp32 cache): the cache rows up to the chunk's last position expanded through kv_b_proj
  into per-head keys [nope ; rope] and values, then one fused causal attention
  (`scaled_dot_product_attention`, fp32, bottom-right aligned mask): scores never reach memory,
  and a head's product is qk_head_dim + v_head_dim wide instead of the latent's 2 x rank + rope
  (absorbing kv_b_proj pays when there is one query per cache pass, not thousands);
- "expanded-bf16" (CUDA, a bf16 cache): the same with bf16 keys, values and queries on a
  flash-attention kernel, as serving engines run MLA's prefill (kv_b_proj's output rounded to the
  model dtype; within ~1e-2 of "expanded" per layer, a declared rounding change);
- "tensor-cores": absorbed, QUERY_BLOCK queries at a time, each block's fp32 scores
  [QUERY_BLOCK, H, rows] through memory, on bf16 tensor cores when the cache is bf16 on CUDA (fp32
  operands as bf16 hi + lo halves); also the expanded form's fallback where its temporaries would
  pass EXPANDED_MAX_BYTES or the positions are not one run;
- "fp32": the same blocks as fp32 einsums (the CPU's form).
Each block or chunk reads the cache only up to its last query's position (rows past it are
masked for all its queries). Under torch.compile a chunk takes the absorbed blocks over the whole
cache (no host read of positions).
"""

from __future__ import annotations

import weakref

import torch
import torch.nn as nn
import torch.nn.functional as F

from .cache import Ling3Cache
from .config import Ling3Config
from .layers import Linear, RMSNorm, apply_rope_interleaved, rope_inv_freq
from .parallel import SINGLE, TensorParallel

QUERY_BLOCK = 256
PREFILL_FORMS = ("expanded-bf16", "expanded", "tensor-cores", "fp32")
EXPANDED_FORMS = ("expanded", "expanded-bf16")
# Overrides prefill_attention_form's choice for every layer when set (benchmarks.prefill --mla).
PREFILL_FORM: str | None = None
# The expanded form's fp32 temporaries (expanded rows, keys, values) above this take the
# "tensor-cores" blocks instead: at long contexts on a full-size model they would be tens of GB.
EXPANDED_MAX_BYTES = 4 << 30


def prefill_attention_form(kv_cache: torch.Tensor) -> str:
    """The eager prefill form of a chunk longer than QUERY_BLOCK (module docstring): PREFILL_FORM
    if set, else on CUDA "expanded-bf16" for a bf16 cache (a bf16 model's attention in bf16, as
    serving engines run it: an H200 took a 32768-token prefill of flash-tp4-rank from 1222 to 784
    ms, session 38) and "expanded" otherwise, and "fp32" elsewhere."""
    if PREFILL_FORM is not None:
        if PREFILL_FORM not in PREFILL_FORMS:
            raise ValueError(f"lingc.models.mla.PREFILL_FORM = {PREFILL_FORM!r}: expected one of {PREFILL_FORMS} "
                             "or None (automatic)")
        return PREFILL_FORM
    if not kv_cache.is_cuda:
        return "fp32"
    return "expanded-bf16" if kv_cache.dtype == torch.bfloat16 else "expanded"


def tensor_core_attention_applies(kv_cache: torch.Tensor) -> bool:
    """Whether eager prefill blocks attend on tensor cores: a bf16 cache on CUDA (mm with an fp32
    output is a CUDA op)."""
    return kv_cache.is_cuda and kv_cache.dtype == torch.bfloat16


def _causal_softmax(scores: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """softmax over cache rows l <= positions[t] of scores [T, H, L] (fp32)."""
    visible = torch.arange(scores.shape[-1], device=scores.device)[None, :] <= positions[:, None]   # [T, L]
    return torch.softmax(scores.masked_fill(~visible[:, None, :], float("-inf")), dim=-1)


def _mm_f32(a_bf16: torch.Tensor, b_bf16: torch.Tensor) -> torch.Tensor:
    """bf16 x bf16 -> fp32 product (tensor cores on CUDA; on the CPU the same exact bf16 products
    summed in fp32, so the tests can run the split path)."""
    if a_bf16.is_cuda:
        return torch.mm(a_bf16, b_bf16, out_dtype=torch.float32)
    return torch.mm(a_bf16.float(), b_bf16.float())


def _mm_split(a: torch.Tensor, b_bf16: torch.Tensor) -> torch.Tensor:
    """a @ b in fp32 from bf16 products: b exact in bf16, a as bf16 hi (+ lo when a is fp32)."""
    hi = a.to(torch.bfloat16)
    out = _mm_f32(hi, b_bf16)
    if a.dtype != torch.bfloat16:
        out += _mm_f32((a - hi.float()).to(torch.bfloat16), b_bf16)
    return out


_RUN_MEMO: list = [None, -1, None]      # (weakref to a positions tensor, its version, its run)


def positions_run(positions: torch.Tensor) -> tuple[int, int, bool]:
    """(first, last, whether consecutive) of a 1-d positions tensor, read to the host once per
    tensor: a forward's MLA layers (7 in Ling-3, and the draft's) all get the same positions
    object, so they share one read, a synchronisation of the host with the GPU, instead of one
    each; a caller that built the positions on the host says so with `remember_positions_run`
    and none is read. Keyed by the object and its version counter, so an in-place change reads
    again."""
    ref, version, run = _RUN_MEMO
    if ref is not None and ref() is positions and version == positions._version:
        return run
    first, last, consecutive = _read_run(positions)
    return remember_positions_run(positions, first, last, consecutive)


def _read_run(positions: torch.Tensor) -> tuple[int, int, bool]:
    first, last, consecutive = torch.stack([positions[0], positions[-1],
                                            (positions.diff() == 1).all().long()]).tolist()
    return first, last, bool(consecutive)


def remember_positions_run(positions: torch.Tensor, first: int, last: int,
                           consecutive: bool = True) -> tuple[int, int, bool]:
    """Record what `positions_run` would read for this tensor (the prefill loop builds each
    chunk's positions with torch.arange from host integers, so the MLA layers need no host read:
    no synchronisation in a prefill)."""
    run = (int(first), int(last), bool(consecutive))
    _RUN_MEMO[:] = [weakref.ref(positions), positions._version, run]
    return run


class MLAAttention(nn.Module):
    def __init__(self, cfg: Ling3Config, layer_id: int, cache_index: int, draft: bool = False,
                 tp: TensorParallel = SINGLE):
        super().__init__()
        dt = cfg.dtype
        self.tp = tp
        self.layer_id, self.cache_index, self.draft = layer_id, cache_index, draft
        self.num_heads = H = cfg.num_attention_heads
        self.nope, self.rope, self.vdim = cfg.qk_nope_head_dim, cfg.qk_rope_head_dim, cfg.v_head_dim
        self.rank = cfg.kv_lora_rank
        self.scale = cfg.qk_head_dim ** -0.5
        hid = cfg.hidden_size
        self.q_proj = Linear(hid, H * cfg.qk_head_dim, dt)
        self.kv_a_proj_with_mqa = Linear(hid, self.rank + self.rope, dt)
        self.kv_a_layernorm = RMSNorm(self.rank, cfg.rms_norm_eps, dt)
        self.kv_b_proj = Linear(self.rank, H * (self.nope + self.vdim), dt)
        self.g_proj = Linear(hid, H, dt)
        self.dense = Linear(H * self.vdim, hid, dt)
        self.register_buffer("inv_freq", rope_inv_freq(self.rope, cfg.rope_theta), persistent=False)

    def _cache(self, cache: Ling3Cache) -> torch.Tensor:
        return (cache.draft_kv if self.draft else cache.kv)[self.cache_index]

    def project_kv(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """The cache rows of x: [T, rank + rope] = [kv_a_layernorm(c) ; rope(k_rope)]."""
        kv = self.kv_a_proj_with_mqa(x)
        c = self.kv_a_layernorm(kv[:, :self.rank])
        k_rope = apply_rope_interleaved(kv[:, self.rank:], positions, self.inv_freq)
        return torch.cat([c, k_rope], dim=-1)

    def forward(self, x: torch.Tensor, positions: torch.Tensor, cache: Ling3Cache,
                slot: int = 0, padding=None) -> torch.Tensor:
        """`padding` (a padded prompt chunk) needs nothing here: its rows sit at positions after
        every real row, which the causal mask hides from the real queries."""
        T, H = x.shape[0], self.num_heads
        q = self.q_proj(x).view(T, H, self.nope + self.rope)
        q_nope, q_rope = q[..., :self.nope], q[..., self.nope:]
        q_rope = apply_rope_interleaved(q_rope, positions, self.inv_freq)

        kv_cache = self._cache(cache)[slot]                                # [L, rank + rope]
        kv_cache.index_copy_(0, positions, self.project_kv(x, positions).to(kv_cache.dtype))

        w_kv = self.kv_b_proj.weight.view(H, self.nope + self.vdim, self.rank)
        w_k, w_v = w_kv[:, :self.nope], w_kv[:, self.nope:]                  # [H, nope|v, rank]
        start = self._expanded_prefill_start(positions, kv_cache) if T > QUERY_BLOCK else None
        if start is not None:
            bf16 = prefill_attention_form(kv_cache) == "expanded-bf16"
            o = self._attend_expanded(q_nope, q_rope, start, kv_cache, bf16)  # [T, H, v]
        else:
            q_lat = torch.einsum("thn,hnr->thr", q_nope.float(), w_k.float())  # [T, H, rank]
            if T <= QUERY_BLOCK:
                o_lat = self._attend(q_lat, q_rope, positions, kv_cache.float())
            else:
                o_lat = self._attend_blocks(q_lat, q_rope, positions, kv_cache)
            o = torch.einsum("thr,hvr->thv", o_lat, w_v.float())             # [T, H, v]
        o = o * torch.sigmoid(self.g_proj(x).float()).unsqueeze(-1)
        return self.tp.all_reduce(self.dense(o.reshape(T, H * self.vdim).to(x.dtype)))

    def _expanded_prefill_start(self, positions: torch.Tensor, kv_cache: torch.Tensor) -> int | None:
        """The chunk's first position when it takes the expanded form: eager, that form chosen,
        positions consecutive (a prompt's chunk always is; one host read per forward: the MLA
        layers share it, `positions_run`) and the temporaries within EXPANDED_MAX_BYTES. None
        otherwise."""
        if torch.compiler.is_compiling() or prefill_attention_form(kv_cache) not in EXPANDED_FORMS:
            return None
        T = positions.shape[0]
        first, last, consecutive = positions_run(positions)
        if not consecutive or last - first != T - 1:
            return None
        width = 2 * (self.nope + self.vdim) + self.nope + self.rope      # fp32 values per row and head
        return first if 4 * (last + 1) * self.num_heads * width <= EXPANDED_MAX_BYTES else None

    def _attend_expanded(self, q_nope: torch.Tensor, q_rope: torch.Tensor, start: int,
                         kv_cache: torch.Tensor, bf16: bool = False) -> torch.Tensor:
        """Causal attention of queries at positions start..start+T-1 over cache rows 0..start+T-1
        in the non-absorbed form: keys [c W_k^T ; k_rope], values c W_v^T, per head, one fused
        SDPA call with a bottom-right aligned causal mask (query t sees rows <= start + t).
        Returns o [T, H, v] fp32.

        fp32 operands (the expansion's bf16 products exact, summed in fp32), or with ``bf16`` the
        form serving engines run: keys and values rounded to bf16 (kv_b_proj's output in the
        model dtype), bf16 queries, a flash-attention kernel (fp32 softmax and accumulation
        inside; values zero-padded to the key width, which it needs, the padding sliced off),
        within bf16 rounding (~3e-3 relative) of the fp32 operands."""
        from torch.nn.attention.bias import causal_lower_right

        T, H = q_nope.shape[:2]
        L = start + T
        rows = kv_cache[:L]
        c, k_rope = rows[:, :self.rank], rows[:, self.rank:]
        w = self.kv_b_proj.weight                                            # [H*(nope+v), rank]
        if bf16:
            dt = torch.bfloat16
            kvb = c.to(dt) @ w.to(dt).T
        else:
            dt = torch.float32
            kvb = _mm_f32(c, w.T) if c.dtype == w.dtype == torch.bfloat16 else c.float() @ w.float().T
        kvb = kvb.view(L, H, self.nope + self.vdim).transpose(0, 1)            # [H, L, nope+v]
        k = torch.cat([kvb[..., :self.nope], k_rope.to(dt)[None].expand(H, L, self.rope)], dim=-1)
        v = kvb[..., self.nope:]
        if bf16:
            v = F.pad(v, (0, max(0, self.nope + self.rope - self.vdim)))     # [H, L, nope+rope]
        q = torch.cat([q_nope, q_rope], dim=-1).to(dt).transpose(0, 1)       # [H, T, nope+rope]
        # [1, H, ., .]: the fused kernels take 4-d operands only (3-d falls back to the math
        # kernel, which stores the scores).
        o = F.scaled_dot_product_attention(q[None], k[None], v.contiguous()[None],
                                           attn_mask=causal_lower_right(T, L), scale=self.scale)
        return o[0, ..., :self.vdim].transpose(0, 1).float()

    def _attend_blocks(self, q_lat: torch.Tensor, q_rope: torch.Tensor, positions: torch.Tensor,
                       kv_cache: torch.Tensor) -> torch.Tensor:
        """A prefill chunk's attention, QUERY_BLOCK queries at a time. In eager mode a block reads
        the cache only up to its last query's position (one host read of the blocks' last
        positions per call; all rows when compiling), and a bf16 cache on CUDA is read by tensor
        cores (`_attend_tensor_cores`)."""
        T = q_lat.shape[0]
        starts = range(0, T, QUERY_BLOCK)
        if torch.compiler.is_compiling():
            ends, attend, rows = [kv_cache.shape[0]] * len(starts), self._attend, kv_cache.float()
        else:
            ends = [p + 1 for p in torch.stack([positions[i:i + QUERY_BLOCK].max() for i in starts]).tolist()]
            if prefill_attention_form(kv_cache) != "fp32" and tensor_core_attention_applies(kv_cache):
                attend, rows = self._attend_tensor_cores, kv_cache
            else:
                attend, rows = self._attend, kv_cache.float()
        return torch.cat([attend(q_lat[i:i + QUERY_BLOCK], q_rope[i:i + QUERY_BLOCK], positions[i:i + QUERY_BLOCK],
                                 rows[:end]) for i, end in zip(starts, ends)])

    def _attend_tensor_cores(self, q_lat: torch.Tensor, q_rope: torch.Tensor, positions: torch.Tensor,
                             rows: torch.Tensor) -> torch.Tensor:
        """`_attend` over bf16 cache rows on bf16 tensor cores with fp32 accumulation and output.
        The cache operand is exact; each fp32 operand x (q_lat, the probabilities, q_rope unless
        already bf16) enters as hi = bf16(x) plus lo = bf16(x - hi), so it keeps ~16 mantissa
        bits (2^-17 relative), as lingc::mla_decode's kernel does: 5 products instead of fp32
        SIMT einsums, for a prompt's chunks (runtime is quadratic in the prompt)."""
        B, H, R = q_lat.shape
        c, kr = rows[:, :R], rows[:, R:]
        scores = _mm_split(q_lat.reshape(B * H, R), c.T) + _mm_split(q_rope.reshape(B * H, -1), kr.T)
        p = _causal_softmax((scores * self.scale).view(B, H, -1), positions)
        return _mm_split(p.view(B * H, -1), c).view(B, H, R)

    def _attend(self, q_lat: torch.Tensor, q_rope: torch.Tensor, positions: torch.Tensor,
                cf: torch.Tensor) -> torch.Tensor:
        """softmax(scores over the visible cache rows) @ c for queries [T, H, .]: o_lat [T, H, rank] fp32."""
        scores = (torch.einsum("thr,lr->thl", q_lat, cf[:, :self.rank])
                  + torch.einsum("the,le->thl", q_rope.float(), cf[:, self.rank:])) * self.scale
        return torch.einsum("thl,lr->thr", _causal_softmax(scores, positions), cf[:, :self.rank])

    def forward_expanded(self, x: torch.Tensor, positions: torch.Tensor, cache: Ling3Cache,
                         slot: int = 0) -> torch.Tensor:
        """The textbook (non-absorbed) form: expand the cache through kv_b_proj. Test oracle only."""
        T, H = x.shape[0], self.num_heads
        q = self.q_proj(x).view(T, H, self.nope + self.rope).float()
        q_rope = apply_rope_interleaved(q[..., self.nope:], positions, self.inv_freq)
        kv_cache = self._cache(cache)[slot]
        kv_cache.index_copy_(0, positions, self.project_kv(x, positions).to(kv_cache.dtype))
        cf = kv_cache.float()
        L = cf.shape[0]
        kvb = (cf[:, :self.rank] @ self.kv_b_proj.weight.float().T).view(L, H, self.nope + self.vdim)
        k = torch.cat([kvb[..., :self.nope], cf[:, None, self.rank:].expand(L, H, self.rope)], -1)
        qf = torch.cat([q[..., :self.nope], q_rope], -1)
        scores = torch.einsum("thd,lhd->thl", qf, k) * self.scale
        visible = torch.arange(L, device=x.device)[None, :] <= positions[:, None]
        p = torch.softmax(scores.masked_fill(~visible[:, None, :], float("-inf")), -1)
        o = torch.einsum("thl,lhv->thv", p, kvb[..., self.nope:])
        o = o * torch.sigmoid(self.g_proj(x).float()).unsqueeze(-1)
        return self.tp.all_reduce(self.dense(o.reshape(T, H * self.vdim).to(x.dtype)))
