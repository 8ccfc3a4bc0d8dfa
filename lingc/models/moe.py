"""Ling-3 MLPs: the dense SwiGLU MLP, the grouped sigmoid router, and the MoE with gathered experts.

Router (per token, noaux_tc): s = sigmoid(gate(x)); c = s + expert_bias is used for SELECTION only;
c splits into n_group groups, a group scores the sum of its top-2; the best topk_group groups are
kept; the top-k experts of those are chosen; weights are s at the chosen experts, renormalised to
sum 1 (norm_topk_prob), times routed_scaling_factor. The shared expert is added unscaled.

Experts are stored stacked per layer, `experts.w13` [E, 2I, H] (gate rows then up rows) and
`experts.w2` [E, H, I], so the routed computation is a gather + batched matmul with no Python loop
over experts (the checkpoint loader maps `experts.{e}.{gate,up,down}_proj` in and out). That form
reads a whole expert per (token, slot) pair: right for decode (T <= 16, what `fused_moe` matches),
wasteful for a prompt. Prefill chunks of GROUPED_MIN_TOKENS or more on CUDA in bf16 therefore take
the grouped form (`Experts.forward_grouped`): the pairs grouped by expert (`lingc::moe_group_pairs`),
one grouped GEMM per projection (`lingc::moe_grouped`, or `torch._grouped_mm` with GROUPED_GEMM
"library"), so each chosen expert's weights are read once per chunk; their router selects with
`lingc::moe_select` (one kernel) instead of torch.topk. Other long inputs are
processed MOE_CHUNK tokens at a time so a prefill never gathers thousands of experts at once.

SwiGLU with clamp limit L > 0: min(silu(gate), L) * clamp(up, -L, L); L == 0 means no clamp.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from .config import Ling3Config
from .layers import Linear, empty_param
from .parallel import SINGLE, TensorParallel

MOE_CHUNK = 16
# Token counts from which a CUDA bf16 MoE call takes the grouped form, and its chunk: every chunk
# reads each chosen expert once (at 8192 tokens nearly all 512), so a prompt chunk is one MoE chunk;
# the per-pair buffers of 8192 tokens x 8 slots are 335 MB each in bf16 at H = 2560. Decode and
# verify graphs (T <= 16) never take the grouped form.
GROUPED_MIN_TOKENS = 64
GROUPED_CHUNK = 8192
# The grouped form's expert GEMMs: "lingc" (`lingc::moe_grouped`: the rows gathered inside the
# up-GEMM, the SwiGLU in its epilogue) or "library" (an index_select gather, torch._grouped_mm,
# lingc::moe_swiglu, torch._grouped_mm; `python -m benchmarks.prefill --moe grouped-library`).
GROUPED_GEMMS = ("lingc", "library")
GROUPED_GEMM = "lingc"


def grouped_form_applies(x: torch.Tensor) -> bool:
    """Whether MoE.forward takes the grouped form for x [T, H]: a prefill-sized bf16 input on CUDA
    with torch._grouped_mm available (its sm_90 kernels take bf16; elsewhere the gather form)."""
    return (x.shape[0] >= GROUPED_MIN_TOKENS and x.is_cuda and x.dtype == torch.bfloat16
            and hasattr(torch, "_grouped_mm"))


def swiglu(gate: torch.Tensor, up: torch.Tensor, limit: float) -> torch.Tensor:
    """silu(gate) * up in fp32 (clamped when limit > 0), rounded once to gate's dtype."""
    a = F.silu(gate.float())
    u = up.float()
    if limit > 0:
        a = a.clamp(max=limit)
        u = u.clamp(-limit, limit)
    return (a * u).to(gate.dtype)


class SwiGLUMLP(nn.Module):
    """down(swiglu(gate(x), up(x))): the dense layers' MLP and the shared expert.

    Under tensor parallelism `reduce` sums the row-parallel down projection over the ranks (the
    dense MLP); the shared expert leaves it to the MoE, which reduces its whole output once.
    """

    def __init__(self, hidden: int, inter: int, dtype: torch.dtype, limit: float = 0.0,
                 reduce: TensorParallel = SINGLE):
        super().__init__()
        self.limit, self.reduce = limit, reduce
        self.gate_proj, self.up_proj = Linear(hidden, inter, dtype), Linear(hidden, inter, dtype)
        self.down_proj = Linear(inter, hidden, dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.reduce.all_reduce(self.down_proj(swiglu(self.gate_proj(x), self.up_proj(x), self.limit)))


class Router(nn.Module):
    def __init__(self, cfg: Ling3Config):
        super().__init__()
        self.cfg = cfg
        self.weight = empty_param(cfg.num_experts, cfg.hidden_size, dtype=cfg.dtype)
        self.expert_bias = empty_param(cfg.num_experts, dtype=torch.float32)

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        if self.cfg.router_dtype == "fp32":
            return F.linear(x.float(), self.weight.float())
        return F.linear(x, self.weight).float()

    def forward(self, x: torch.Tensor, kernel: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """Returns (topk_ids [T, k] int64, topk_weights [T, k] fp32).

        kernel: the selection as `lingc::moe_select` (the decode router's selection kernel, one
        warp a row, lowest index first among ties; the reference on the CPU) instead of
        torch.topk, whose three calls took 84 us each on a 4096-token prompt chunk (H200). The
        grouped (prompt) form asks for it; decode graphs never do."""
        logits = self.logits(x)
        if kernel:
            from lingc.runtime.kernels.moe_router import moe_select   # the op package imports torch only

            cfg = self.cfg
            ids, w = moe_select(logits.contiguous(), self.expert_bias, cfg.n_group, cfg.topk_group,
                                cfg.num_experts_per_tok, cfg.routed_scaling_factor, cfg.norm_topk_prob)
            return ids.long(), w
        return grouped_topk(torch.sigmoid(logits), self.expert_bias, self.cfg)


def grouped_topk(scores: torch.Tensor, bias: torch.Tensor, cfg: Ling3Config):
    """Grouped top-k selection on biased scores; weights from the unbiased scores.

    Tie order is torch.topk's; lingc's router kernel documents and tests its own against this.
    """
    T, E = scores.shape
    choice = scores + bias.float()
    groups = choice.view(T, cfg.n_group, E // cfg.n_group)
    group_score = groups.topk(2, dim=-1).values.sum(-1)                         # [T, n_group]
    keep = group_score.topk(cfg.topk_group, dim=-1).indices                      # [T, topk_group]
    group_mask = torch.zeros_like(group_score, dtype=torch.bool).scatter_(1, keep, True)
    masked = groups.masked_fill(~group_mask[..., None], float("-inf")).view(T, E)
    ids = masked.topk(cfg.num_experts_per_tok, dim=-1).indices
    w = scores.gather(1, ids)
    if cfg.norm_topk_prob:
        w = w / w.sum(-1, keepdim=True)
    return ids, w * cfg.routed_scaling_factor


class Experts(nn.Module):
    def __init__(self, cfg: Ling3Config, limit: float):
        super().__init__()
        E, H, I = cfg.num_experts, cfg.hidden_size, cfg.moe_intermediate_size
        self.inter, self.limit = I, limit
        self.w13 = empty_param(E, 2 * I, H, dtype=cfg.dtype)
        self.w2 = empty_param(E, H, I, dtype=cfg.dtype)
        # torch._grouped_mm's operands need 16-byte rows: H and I whole multiples of 8 bf16 values.
        self.grouped_aligned = H % 8 == 0 and I % 8 == 0

    def forward(self, x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """sum_j weights[t, j] * expert_{ids[t, j]}(x[t]), summed in slot order in fp32."""
        T, k = ids.shape
        flat = ids.reshape(-1)
        xs = x.repeat_interleave(k, dim=0).unsqueeze(-1)                        # [T*k, H, 1]
        h = torch.bmm(self.w13[flat], xs).squeeze(-1)                           # [T*k, 2I]
        a = swiglu(h[:, :self.inter], h[:, self.inter:], self.limit)
        y = torch.bmm(self.w2[flat], a.unsqueeze(-1)).squeeze(-1).view(T, k, -1).float()
        return slot_sum(y, weights)

    def forward_grouped(self, x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor,
                        shared: torch.Tensor | None = None, out_dtype: torch.dtype | None = None) -> torch.Tensor:
        """The same sum with each expert's pairs as one group: the (token, slot) pairs grouped by
        expert (`lingc::moe_group_pairs`; a stable sort in the library form), the gate/up and down
        projections as two grouped GEMMs over the stacked weights in place, so every chosen
        expert's weights are read once per call instead of once per pair: `lingc::moe_grouped`
        (GROUPED_GEMM "lingc": the rows gathered inside the up-GEMM, the SwiGLU on its
        accumulator; the reference on the CPU) or `torch._grouped_mm` twice around
        `lingc::moe_swiglu` ("library"). Per-pair outputs are rounded to x.dtype
        and summed in fp32 in slot order, as in `forward`, by `lingc::moe_combine_sorted` (one
        kernel on CUDA: no pair-order copy), which also adds `shared` (the shared expert's rows)
        and rounds to `out_dtype` when given (fp32 otherwise). The GEMMs' accumulation order is
        the kernels' and they may fuse a product into an add, so the bits may differ from
        `forward`'s."""
        from lingc.runtime.kernels import moe_grouped as grouped_ops   # the ops import this module
        from lingc.runtime.kernels.moe_combine import moe_combine_sorted
        from lingc.runtime.kernels.moe_swiglu import moe_swiglu

        if GROUPED_GEMM not in GROUPED_GEMMS:
            raise ValueError(f"lingc.models.moe.GROUPED_GEMM = {GROUPED_GEMM!r}: use one of {GROUPED_GEMMS}")
        T, k = ids.shape
        if GROUPED_GEMM == "lingc":
            # The pairs grouped by a counting sort (two kernels; the order inside an expert is
            # free: every row is computed on its own), with the inverse the combine needs.
            order, inv, ends = grouped_ops.moe_group_pairs(ids.contiguous(), self.w13.shape[0])
            ys = grouped_ops.moe_grouped(x.contiguous(), order, ends, self.w13, self.w2, self.limit, k)
            return moe_combine_sorted(ys, order, weights.float(), shared, out_dtype, inv)
        experts, order = torch.sort(ids.reshape(-1), stable=True)
        # ends[e] = the pairs of experts <= e. Not torch.bincount, which reads the maximum id back
        # to the host to size its output: a sync in every MoE layer of a prompt.
        ends = torch.searchsorted(experts, torch.arange(self.w13.shape[0], device=ids.device, dtype=experts.dtype),
                                  right=True).to(torch.int32)
        xs = x.index_select(0, order // k)                                    # [T*k, H], by expert
        h = torch._grouped_mm(xs, self.w13.transpose(1, 2), offs=ends)          # [T*k, 2I]
        a = moe_swiglu(h, self.limit)                                           # [T*k, I]
        ys = torch._grouped_mm(a, self.w2.transpose(1, 2), offs=ends)           # [T*k, H]
        return moe_combine_sorted(ys, order, weights.float(), shared, out_dtype)


def slot_sum(y: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """sum_j weights[:, j] * y[:, j] in slot order (y [T, k, H] fp32)."""
    out = y[:, 0] * weights[:, 0:1]
    for j in range(1, y.shape[1]):
        out = out + y[:, j] * weights[:, j:j + 1]
    return out


class MoE(nn.Module):
    """Routed experts plus the shared expert; under tensor parallelism every rank holds a slice of
    each expert's intermediate dimension and the summed output is all-reduced once."""

    def __init__(self, cfg: Ling3Config, layer_id: int, tp: TensorParallel = SINGLE):
        super().__init__()
        self.tp = tp
        self.gate = Router(cfg)
        self.experts = Experts(cfg, cfg.expert_limit(layer_id))
        self.shared_experts = (SwiGLUMLP(cfg.hidden_size, cfg.moe_shared_expert_intermediate_size,
                                         cfg.dtype, cfg.shared_limit(layer_id))
                               if cfg.num_shared_experts else None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        grouped = grouped_form_applies(x) and self.experts.grouped_aligned
        step = GROUPED_CHUNK if grouped else MOE_CHUNK
        outs = [self._forward(x[i:i + step], grouped) for i in range(0, x.shape[0], step)]
        return self.tp.all_reduce(outs[0] if len(outs) == 1 else torch.cat(outs, 0))

    def _forward(self, x: torch.Tensor, grouped: bool = False) -> torch.Tensor:
        return self.routed_chunk(x, grouped)[0]

    def routed_chunk(self, x: torch.Tensor, grouped: bool = False
                     ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """One chunk (at most MOE_CHUNK tokens, or GROUPED_CHUNK in the grouped form) before the
        all-reduce, with the routing it used: (output, expert ids, weights)."""
        ids, w = self.gate(x, kernel=grouped)
        if grouped:    # the shared expert's add and the rounding in the combine kernel
            shared = self.shared_experts(x) if self.shared_experts is not None else None
            return self.experts.forward_grouped(x, ids, w, shared, x.dtype), ids, w
        y = self.experts(x, ids, w)
        if self.shared_experts is not None:
            y = y + self.shared_experts(x).float()
        return y.to(x.dtype), ids, w
