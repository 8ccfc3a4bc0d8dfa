"""The relay's step functions, one per role (design.md "Roles"), written the naive way.

Each step reads and writes only the model's cache and the RelayBuffers, in place, so that a
compiled step is one graph over static buffers and can be captured as one CUDA graph. The
per-step metadata (positions) is read through ``lingc.host_refill`` from buffers the naive driver
refills from the host; the metadata_capture pass turns those reads into device arithmetic on the
relay's ``n``. The verify step calls the greedy verdict and the commit point that stage_commit
binds (without the pass a rejection would leave the state of the whole chain).

- ``draft``:  the NEXTN layer run autoregressively: steps - 1 forwards from the seed (four for
  steps = 5), unrolled into one graph; writes the chain [x_n, d_1..d_S].
- ``verify``: the target over the chain, greedy targets, verdict, commit; writes the accept
  count, the emitted tokens and the target's hidden states.
- ``verify_sample``: the same for a sampling request: the targets are speculative sampling's
  outcome (sampling.py) from the step's row of uniforms, so verdict and commit are verify's.
- ``extend``: the draft over the accepted prefix [d_1..d_a, y_a] with the target's hidden
  states (a fixed S+1 rows; rows past a are padding whose cache rows later steps rewrite
  before anything reads them), giving the next seed and draft hidden; advances n and x.
- ``decode``: plain greedy decoding, one target forward per token (no speculation).
- extend and decode, the last graph of a step, end by appending the step's tokens to the ring
  (``_ring_append``). The tail of both (pick the accepted row, advance n and x, append) is a
  handful of tiny ATen kernels as written; pdl_swap folds it into one ``lingc.relay_advance``
  launch (passes/relay_tail.py).
- ``decode_sample``: plain sampling, one target forward per token: the token drawn on the
  device from the step's uniform (``lingc.sampled_targets`` over the chain [x]), then the
  decode's tail, so a sampled request runs ahead of the host like a greedy one.
- ``draft_sample``, ``verify_sample_q``, ``extend_sample``: a sampling request with sampled
  drafts (sampling.py): the draft draws each token from its own distribution at the request's
  temperature and top_p (``lingc.sampled_targets`` over one row) and keeps the logits it drew
  from in ``relay.draft_logits``, from which verify recomputes q; extend draws the next seed from
  the accepted row's logits the same way. They compile as draft, verify and extend.
"""

from __future__ import annotations

import torch

from . import ops  # noqa: F401  (registers the relay ops)
from .buffers import RelayBuffers

lingc = torch.ops.lingc


def _positions(host: torch.Tensor, n: torch.Tensor, count: int, what: str) -> torch.Tensor:
    device_value = n + torch.arange(count, device=n.device, dtype=torch.int64)
    return lingc.host_refill(host, device_value, what)


def _ring_append(r: RelayBuffers) -> None:
    """Row ring_k % RING of the token ring = [emitted..., accept]; ring_k += 1."""
    row = torch.cat([r.emitted, r.accept]).unsqueeze(0)
    r.ring.index_copy_(0, r.ring_k % r.ring.shape[0], row)
    r.ring_k.add_(1)


def make_steps(model, steps: int):
    """The step functions of `model` for a chain of `steps` drafts, as plain callables
    ``fn(relay, cache)`` (the engine compiles each with its role)."""

    def draft(r: RelayBuffers, cache) -> None:
        tok, h = r.seed, r.dh
        drafts = [tok]
        if steps > 1:
            pos = _positions(r.pos_draft, r.n, steps - 1, "draft positions")
            for j in range(steps - 1):
                logits, h = model.draft(tok, pos[j:j + 1], h, cache)
                tok = logits.argmax(-1)
                drafts.append(tok)
        r.chain.copy_(torch.cat([r.x] + drafts))

    def draft_sample(r: RelayBuffers, cache) -> None:
        tok, h = r.seed, r.dh
        drafts = [tok]
        if steps > 1:
            pos = _positions(r.pos_draft, r.n, steps - 1, "draft positions")
            for j in range(1, steps):
                logits, h = model.draft(tok, pos[j - 1:j], h, cache)
                r.draft_logits[j:j + 1].copy_(logits)
                tok = lingc.sampled_targets(tok, logits, r.draft_uniforms[:, j:], r.ring_k, r.temperature, r.top_p)
                drafts.append(tok)
        r.chain.copy_(torch.cat([r.x] + drafts))

    def _verdict(r: RelayBuffers, y, hidden) -> None:
        accept = lingc.state_commit(lingc.greedy_verdict(r.chain, y))
        r.emitted.copy_(lingc.greedy_emit(r.chain, y, accept))
        r.accept.copy_(accept)
        r.vhid.copy_(hidden)

    def verify(r: RelayBuffers, cache) -> None:
        pos = _positions(r.pos_chain, r.n, steps + 1, "chain positions")
        logits, hidden = model(r.chain, pos, cache)
        _verdict(r, logits.argmax(-1), hidden)

    def verify_sample(r: RelayBuffers, cache) -> None:
        pos = _positions(r.pos_chain, r.n, steps + 1, "chain positions")
        logits, hidden = model(r.chain, pos, cache)
        # This step's uniforms: row ring_k % rows of the request's (a step never reuses one).
        _verdict(r, lingc.sampled_targets(r.chain, logits, r.uniforms, r.ring_k, r.temperature, r.top_p), hidden)

    def verify_sample_q(r: RelayBuffers, cache) -> None:
        pos = _positions(r.pos_chain, r.n, steps + 1, "chain positions")
        logits, hidden = model(r.chain, pos, cache)
        _verdict(r, lingc.sampled_targets(r.chain, logits, r.uniforms, r.ring_k, r.temperature, r.top_p,
                                          r.draft_logits), hidden)

    def extend_sample(r: RelayBuffers, cache) -> None:
        pos = _positions(r.pos_chain, r.n, steps + 1, "chain positions")
        logits, h = model.draft(r.emitted, pos, r.vhid, cache)
        a = r.accept
        row = logits.index_select(0, a)
        r.draft_logits[:1].copy_(row)
        # The next step's d_1, from this step's draft_uniforms row (column 0).
        r.seed.copy_(lingc.sampled_targets(r.x, row, r.draft_uniforms, r.ring_k, r.temperature, r.top_p))
        r.dh.copy_(h.index_select(0, a))
        r.x.copy_(r.emitted.gather(0, a))
        r.n.copy_(r.n + a + 1)
        _ring_append(r)

    def extend(r: RelayBuffers, cache) -> None:
        pos = _positions(r.pos_chain, r.n, steps + 1, "chain positions")
        logits, h = model.draft(r.emitted, pos, r.vhid, cache)
        a = r.accept
        r.seed.copy_(logits.argmax(-1).gather(0, a))
        r.dh.copy_(h.index_select(0, a))
        r.x.copy_(r.emitted.gather(0, a))
        r.n.copy_(r.n + a + 1)
        _ring_append(r)

    def _decode_tail(r: RelayBuffers, y) -> None:
        r.emitted[:1].copy_(y)
        r.x.copy_(y)
        r.n.copy_(r.n + 1)
        _ring_append(r)

    def decode(r: RelayBuffers, cache) -> None:
        pos = _positions(r.pos_chain[:1], r.n, 1, "decode position")
        logits, _ = model(r.x, pos, cache)
        _decode_tail(r, logits.argmax(-1))

    def decode_sample(r: RelayBuffers, cache) -> None:
        pos = _positions(r.pos_chain[:1], r.n, 1, "decode position")
        logits, _ = model(r.x, pos, cache)
        _decode_tail(r, lingc.sampled_targets(r.x, logits, r.uniforms, r.ring_k, r.temperature, r.top_p))

    return {"draft": draft, "verify": verify, "verify_sample": verify_sample, "extend": extend,
            "decode": decode, "decode_sample": decode_sample, "draft_sample": draft_sample,
            "verify_sample_q": verify_sample_q, "extend_sample": extend_sample}
