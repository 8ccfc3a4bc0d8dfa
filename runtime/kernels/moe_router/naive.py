"""Plain-PyTorch reference of the Ling-3 MoE router (the op's CPU implementation).

Per token (row of x), with ``s`` the unbiased and ``c`` the biased scores:

    logits = x @ gate_w.T            fp32 accumulation (bf16 products are exact in fp32),
                                     kept in fp32: not rounded to x.dtype
    s = sigmoid(logits)              [E]
    c = s + expert_bias              [E], used for SELECTION only
    group g (n_group groups of E / n_group consecutive experts) scores top1(c_g) + top2(c_g)
    keep the topk_group best groups
    ids = the top_k experts of the kept groups by c, in decreasing c
          (zero_fill: the top_k of all experts by c with the dropped groups' c set to 0.0,
          DeepSeek-V3's Hugging Face code; it differs only when a kept c is <= 0)
    w = s[ids]; w = w / sum(w) if renormalize; w = w * routed_scaling

Tie rule (the kernel implements the same one): among equal values the LOWEST index wins, for
the groups and for the experts, and ``ids`` lists the experts in decreasing ``c`` with equal
``c`` in increasing expert id. Here it is implemented explicitly with stable descending sorts
(``torch.sort(stable=True)`` keeps equal keys in index order), never with ``torch.topk``, whose
tie order is unspecified. The group score is a sum of the top two values, which does not depend
on which of two tied values is "first".

Numerics declared against ``lingc.models.moe.Router``: with a bf16 router the eager model rounds
the logits to bf16 before the sigmoid; this op keeps the fp32 accumulator (one rounding fewer).
With an fp32 router the two agree up to summation order.

Batch invariance: the logits are computed one row at a time and the selection is per row, so a
row's result does not depend on how many rows come with it (design.md).
"""
import torch
import torch.nn.functional as F

__all__ = ["router_logits", "grouped_keys", "grouped_topk_reference", "softmax_topk_reference", "moe_router_reference",
           "rmsnorm_router_reference"]


def router_logits(x: torch.Tensor, gate_w: torch.Tensor) -> torch.Tensor:
    """fp32 [T, E] = x @ gate_w.T, one row at a time (a single [T, H] product may choose a
    T-dependent blocking, which would break batch invariance), each row copied to a fresh buffer
    first (the CPU BLAS takes another path for a row at an unaligned offset: bits differ)."""
    xf, wf = x.float(), gate_w.float()
    rows = [F.linear(xf[t : t + 1].clone(), wf) for t in range(xf.shape[0])]
    return torch.cat(rows) if rows else xf.new_empty(0, wf.shape[0])


def grouped_keys(scores: torch.Tensor, expert_bias: torch.Tensor, n_group: int, topk_group: int,
                 zero_fill: bool = False) -> torch.Tensor:
    """The selection's keys [T, E] fp32: the biased scores c of the kept groups (the topk_group
    best by top1 + top2 of c, lowest group first among ties), the dropped groups' -inf, or 0.0
    with ``zero_fill``. + 0.0: a -0.0 key (sigmoid underflow plus a -0.0 bias) ranks equal to the
    fill's +0.0."""
    t, e = scores.shape
    c = scores.float() + expert_bias.float()
    groups = c.view(t, n_group, e // n_group)
    top2 = torch.sort(groups, dim=-1, descending=True, stable=True).values[..., :2]
    group_score = top2[..., 0] + top2[..., 1]                                       # [T, n_group]
    keep = torch.sort(group_score, dim=-1, descending=True, stable=True).indices[:, :topk_group]
    group_mask = torch.zeros(t, n_group, dtype=torch.bool, device=c.device).scatter_(1, keep, True)
    return groups.masked_fill(~group_mask[..., None], 0.0 if zero_fill else float("-inf")).view(t, e) + 0.0


def grouped_topk_reference(
    scores: torch.Tensor,
    expert_bias: torch.Tensor,
    n_group: int,
    topk_group: int,
    top_k: int,
    routed_scaling: float,
    renormalize: bool,
    zero_fill: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids int32 [T, top_k], weights fp32 [T, top_k]) from sigmoid scores [T, E] (fp32).

    ``zero_fill``: the dropped groups' experts compete with the biased score 0.0 instead of being
    excluded (DeepSeek-V3's, Kimi's Hugging Face routers: ``masked_fill(~mask, 0.0)``), so when a
    kept expert's biased score is <= 0 a dropped one may be picked (its weight is its unbiased
    score, like any pick); equal keys go to the lowest index, as everywhere here."""
    s = scores.float()
    keys = grouped_keys(s, expert_bias, n_group, topk_group, zero_fill)
    ids = torch.sort(keys, dim=-1, descending=True, stable=True).indices[:, :top_k]
    w = s.gather(1, ids)
    if renormalize:
        w = w / w.sum(-1, keepdim=True)
    return ids.to(torch.int32), w * routed_scaling


def softmax_topk_reference(logits: torch.Tensor, top_k: int, routed_scaling: float,
                           renormalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """A softmax router's selection (Qwen's MoE blocks) on fp32 logits [T, E]: the top_k experts
    by logit (softmax is monotone; the lowest index first among equal logits, -0.0 equal to
    +0.0), their softmax probabilities as weights (w / sum(w) if ``renormalize``: the
    probabilities' common denominator cancels), times ``routed_scaling``. Declared against an
    eager ``topk(softmax(logits))``: that ranks the rounded probabilities, which may tie where
    the logits do not, and breaks ties in an unspecified order."""
    lg = logits.float() + 0.0
    ids = torch.sort(lg, dim=-1, descending=True, stable=True).indices[:, :top_k]
    w = torch.softmax(lg, dim=-1).gather(1, ids)
    if renormalize:
        w = w / w.sum(-1, keepdim=True)
    return ids.to(torch.int32), w * routed_scaling


def moe_router_reference(
    x: torch.Tensor,
    gate_w: torch.Tensor,
    expert_bias: torch.Tensor,
    n_group: int,
    topk_group: int,
    top_k: int,
    routed_scaling: float,
    renormalize: bool,
    softmax: bool = False,
    zero_fill: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The whole router (module docstring): (topk_ids int32 [T, top_k], topk_weights fp32);
    ``softmax``: softmax_topk_reference's selection instead (no bias, one group); ``zero_fill``:
    grouped_topk_reference's.

    Row by row: a [T, top_k] sum (the renormalisation) is vectorised across rows on the CPU in a
    T-dependent order, and a row's bits must not depend on T (batch invariance)."""
    if x.shape[0] > 1:
        rows = [moe_router_reference(x[t:t + 1].clone(), gate_w, expert_bias, n_group, topk_group, top_k,
                                     routed_scaling, renormalize, softmax, zero_fill) for t in range(x.shape[0])]
        return torch.cat([r[0] for r in rows]), torch.cat([r[1] for r in rows])
    if softmax:
        return softmax_topk_reference(router_logits(x, gate_w), top_k, routed_scaling, renormalize)
    scores = torch.sigmoid(router_logits(x, gate_w))
    return grouped_topk_reference(scores, expert_bias, n_group, topk_group, top_k, routed_scaling, renormalize,
                                  zero_fill)


def rmsnorm_router_reference(
    x: torch.Tensor,
    norm_weight: torch.Tensor,
    residual: torch.Tensor | None,
    eps: float,
    gate_w: torch.Tensor,
    expert_bias: torch.Tensor,
    n_group: int,
    topk_group: int,
    top_k: int,
    routed_scaling: float,
    renormalize: bool,
    round_before_weight: bool = False,
    zero_fill: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(y, h, ids, weights) of ``lingc.rmsnorm_router``: ``y, h = rmsnorm(x, norm_weight,
    residual, eps)`` (the norms' reference: h = residual + x in x.dtype, y = h * r * norm_weight
    rounded once, r = rsqrt(mean(h^2) + eps)), and the router's selection on the logits of the
    fp32 normed row, ``r * ((h * norm_weight) @ gate_w.T)`` in fp32: the kernel's one reduction
    for the squares and the products, with the scale after the sum. Declared against
    ``moe_router(y)``: the logits skip y's rounding to x.dtype (one rounding fewer), so the two
    agree up to that rounding. Row by row (batch invariance).

    ``round_before_weight``: y in the Hugging Face Llama form (rmsnorm_reference's flag), routed
    as it is, ``moe_router_reference(y, ...)``: the scale cannot follow the products once the
    normed row is rounded before the weight. ``zero_fill``: grouped_topk_reference's."""
    from lingc.runtime.kernels.norms.naive import rmsnorm_reference

    y, h = rmsnorm_reference(x, norm_weight, residual, eps, round_before_weight)
    if round_before_weight:
        return (y, h, *moe_router_reference(y, gate_w, expert_bias, n_group, topk_group, top_k, routed_scaling,
                                            renormalize, zero_fill=zero_fill))
    hf = h.float()
    r = torch.rsqrt(hf.pow(2).mean(-1, keepdim=True) + eps)                  # [T, 1]
    logits = router_logits(hf * norm_weight.float(), gate_w) * r
    ids, weights = [], []
    for t in range(x.shape[0]):
        i, w = grouped_topk_reference(torch.sigmoid(logits[t:t + 1]), expert_bias, n_group, topk_group, top_k,
                                      routed_scaling, renormalize, zero_fill)
        ids.append(i)
        weights.append(w)
    if not ids:
        return y, h, x.new_empty((0, top_k), dtype=torch.int32), x.new_empty((0, top_k), dtype=torch.float32)
    return y, h, torch.cat(ids), torch.cat(weights)
