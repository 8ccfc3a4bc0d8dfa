"""Speculative sampling in the verify graph: which target token each chain position gives when
the request samples (temperature > 0), so that the relay's greedy verdict and commit apply
unchanged.

The draft proposes its greedy tokens d_1..d_S (a point-mass proposal q = delta(d)). Standard
speculative sampling then accepts d_{j+1} with probability min(1, p_j(d_{j+1}) / q(d_{j+1})) =
p_j(d_{j+1}), where p_j is the target's sampling distribution at chain position j (temperature,
top_p: pick_token's), and at the first rejection a samples the token from the residual
max(0, p_a - q) normalised, i.e. p_a with d_{a+1} removed; when every draft is accepted the token
after them is drawn from p_S. Each emitted token is then distributed exactly as plain sampling
from the target would draw it (the drafts change the speed, never the distribution).

``sampled_targets`` writes that outcome as the target tokens y_0..y_S the greedy verdict reads:
y_j = d_{j+1} below a, y_a the drawn token (never d_{a+1}: the residual has no mass there), so
``greedy_verdict(chain, y)`` returns a and ``greedy_emit`` emits d_1..d_a, y_a. The uniforms come
from the relay's buffer (one row per step, drawn per request from its seeded generator), so the
graph needs nothing from the host and a seed reproduces a request.

Sampled drafts (``draft_logits`` given): the draft draws each d_{j+1} from its own distribution
q_j = softmax(draft_logits_j / temperature) cut to the request's nucleus (top_p) and renormalised:
pick_token's distribution over the draft's logits, so a draft never proposes a token that the
same cut of its own distribution drops (a nucleus on p alone would reject every such draft).
Verify recomputes q from the stored logits, the same temperature and top_p. Then d_{j+1} is
accepted while u_j q_j(d_{j+1}) < p_j(d_{j+1}) (probability min(1, p / q)), and at the first
rejection a the token is drawn from the residual max(0, p_a - q_a) normalised; when every draft
is accepted from p_S, as before. The chance to accept a draft is then sum_v min(p_j(v), q_j(v))
instead of p_j(argmax q_j): higher when the draft's distribution is close to the target's, lower
when the target is much sharper than the draft. The residual has no mass at a rejected d_{a+1}
(p < q there), so y_a differs from it and the greedy verdict still returns a. Should rounding
leave the residual without mass (p and q equal to fp32 rounding), the token is drawn from p_a
less d_{a+1}, the point-mass rule.
"""

from __future__ import annotations

import torch


def sampling_probs(logits: torch.Tensor, temperature, top_p) -> torch.Tensor:
    """pick_token's distribution for each row of logits [R, V] (fp32 [R, V]): softmax(logits /
    temperature) cut to the nucleus and renormalised. temperature and top_p are floats or device
    tensors [1]; top_p >= 1 or None keeps every token.

    The nucleus keeps token i when the tokens with a strictly greater logit hold less than top_p
    of the mass: the most likely tokens until they reach top_p, tokens of equal logit kept or
    dropped together (so the cut never depends on how a sort orders ties, and the Triton kernel
    of ``lingc.sampled_targets`` finds the same set by a search over the logits, without a sort).
    The sort here only finds the smallest kept logit: the sorted row's exclusive cumulative mass
    is below top_p on a prefix, whose last logit is that cut."""
    logits = logits.float()
    probs = torch.softmax(logits / temperature, -1)
    if top_p is None:
        return probs
    sl, si = logits.sort(-1, descending=True)
    sp = probs.gather(-1, si)
    inside = (sp.cumsum(-1) - sp) < top_p
    last = (inside.sum(-1, keepdim=True) - 1).clamp(min=0)
    keep = (logits >= sl.gather(-1, last)) | (top_p >= 1.0)
    probs = probs * keep
    return probs / probs.sum(-1, keepdim=True)


def draw(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """The token of each row of probs [R, V] (unnormalised) at uniform u [R] in [0, 1), by the
    inverse CDF: the first index whose cumulative mass reaches (1 - u) of the row's (a token
    without mass is never drawn). int64 [R]."""
    c = probs.cumsum(-1)
    return (c < (1.0 - u)[:, None] * c[:, -1:]).sum(-1).clamp(max=probs.shape[-1] - 1)


def draft_probs(draft_logits: torch.Tensor, temperature, top_p) -> torch.Tensor:
    """q: the distribution a sampled draft draws each token from (fp32 [S, V]): pick_token's
    over the draft's logits, softmax(draft_logits / temperature) cut to the nucleus (top_p None
    or >= 1: none) and renormalised."""
    return sampling_probs(draft_logits, temperature, top_p)


def sampled_targets(chain: torch.Tensor, logits: torch.Tensor, u: torch.Tensor, temperature: torch.Tensor,
                    top_p: torch.Tensor | None, draft_logits: torch.Tensor | None = None) -> torch.Tensor:
    """y [S+1] int64 for greedy_verdict / greedy_emit (module docstring). chain [S+1] = [x, d_1..d_S],
    logits [S+1, V] the target's at the chain positions, u [S+1] uniforms in [0, 1): u_j decides
    d_{j+1}, u_S draws the emitted token. draft_logits [S, V]: row j the draft's logits d_{j+1}
    was drawn from (sampled drafts); None: the drafts are the draft's greedy tokens."""
    S, V = chain.numel() - 1, logits.shape[-1]
    p = sampling_probs(logits, temperature, top_p)
    d = chain[1:]
    p_d = p[:-1].gather(1, d[:, None]).squeeze(1)
    if draft_logits is None:
        ok = (u[:S] < p_d).to(torch.int64)
    else:
        q = draft_probs(draft_logits, temperature, top_p)
        ok = (u[:S] * q.gather(1, d[:, None]).squeeze(1) < p_d).to(torch.int64)
    a = ok.cumprod(0).sum(0, keepdim=True)                      # [1]: the first rejection (S: none)
    d_at = torch.cat([d, chain[:1]])                            # d_{j+1} for j < S (the last entry unused)
    drop = (torch.arange(V, device=logits.device) == d_at.index_select(0, a)) & (a < S)
    less_draft = p.index_select(0, a).masked_fill(drop, 0.0)
    if draft_logits is None:
        y = draw(less_draft, u[S:])
    else:
        q_at = torch.cat([q, q.new_zeros(1, V)]).index_select(0, a)      # row S: no draft
        residual = (p.index_select(0, a) - q_at).clamp(min=0.0).masked_fill(drop, 0.0)   # 0 at d_{a+1} anyway
        y = draw(torch.where(residual.sum(-1, keepdim=True) > 0, residual, less_draft), u[S:])
    j = torch.arange(S + 1, device=chain.device)
    return torch.where(j < a, d_at, y)
