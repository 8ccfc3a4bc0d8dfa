"""Reference decode loops in plain Python: greedy, temperature sampling, NEXTN speculative.

These are the oracles that lingc's compiled relay must match. They may sync with the host freely.

Conventions (shared with the relay):
- The target has processed positions < n; `x_n` (the last token decided, not yet processed) is
  the next input.
- The NEXTN draft at position p takes the token x_{p+1} and the target's hidden state of position
  p, and predicts x_{p+2}; so after a prefill of x_0..x_{n-1} the draft is prefilled over positions
  0..n-1 with tokens x_1..x_n, and its last prediction is the step's seed d_1.
- A speculative step with `steps` = 5: the chain is [x_n, d_1, .., d_5] at positions n..n+5, where
  d_1 is the seed and four draft forwards give d_2..d_5. The target verifies the chain in one
  forward; y_j = argmax of its logits at position n+j. Accept d_{j+1} while d_{j+1} == y_j; with a
  drafts accepted the step emits d_1..d_a and the bonus y_a, and the target's state must be that
  of positions <= n+a (the bonus is not yet processed). Extend then runs the draft over positions
  n..n+a with tokens [d_1..d_a, y_a] and the target's hidden states h_n..h_{n+a}, which rewrites
  the draft cache rows its own guesses wrote and yields the next seed.
- This reference rolls the recurrent state back by snapshot + replay of the accepted prefix; the
  compiled relay stages every position's state instead (stage/commit) and must agree with it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch

from ..models.cache import Ling3Cache
from ..models.decoder import Ling3ForCausalLM
from ..models.mla import remember_positions_run
from lingc.runtime.relay.sampling import sampling_probs

# Tokens per prefill forward. Eager prefill issues thousands of kernels a chunk whatever its size,
# so small chunks leave the GPU waiting on the host: an 8192-token prompt on one H200
# (flash-tp4-rank, `python -m benchmarks.prefill`, session 35 calls 2-3) took 4.65 s at 256, 1.51 s
# at 1024, 0.95-1.03 s at 2048 and 0.70 s at 4096 tokens a chunk; with session 37's kernels 339.7 ms
# at 4096 and 313.6 ms at 8192, and a 32768-token prompt 1713.9 against 1665.3 ms (session 38 call
# 1, one process). Memory stays bounded: MLA's expanded keys and values are capped
# (mla.EXPANDED_MAX_BYTES), the MoE runs moe.GROUPED_CHUNK tokens at a time.
PREFILL_CHUNK = 8192


def _dev(model: Ling3ForCausalLM) -> torch.device:
    return model.lm_head.weight.device


def _ids(tokens: Sequence[int] | torch.Tensor, device: torch.device) -> torch.Tensor:
    return torch.as_tensor(list(tokens) if not torch.is_tensor(tokens) else tokens,
                           dtype=torch.long).to(device)


def allocate_cache(model: Ling3ForCausalLM, prompt_len: int, max_new_tokens: int,
                   chain_slack: int = 0) -> Ling3Cache:
    """A cache sized to the run: prompt + new tokens + the speculative chain's slack."""
    return Ling3Cache.allocate(model.config, prompt_len + max_new_tokens + chain_slack,
                               device=_dev(model))


def check_capacity(cache: Ling3Cache, needed: int, what: str) -> None:
    if needed > cache.max_len:
        raise ValueError(f"context overflow: {what} needs {needed} cache rows but the cache holds "
                         f"{cache.max_len}; allocate a larger cache (Ling3Cache.allocate(max_len=...))")


def _chunk_positions(first: int, ids: torch.Tensor) -> torch.Tensor:
    """Positions first.. of a prompt chunk, their run recorded for the MLA layers (no host read of
    them, so no synchronisation in a prefill: lingc.models.mla.positions_run)."""
    pos = torch.arange(first, first + ids.numel(), device=ids.device)
    remember_positions_run(pos, first, first + ids.numel() - 1)
    return pos


@torch.no_grad()
def prefill(model: Ling3ForCausalLM, cache: Ling3Cache, tokens: torch.Tensor, start: int = 0,
            chunk: int = PREFILL_CHUNK) -> tuple[torch.Tensor, torch.Tensor]:
    """Run tokens at positions start.. through the target in chunks.

    Returns (logits of the last position [vocab], hidden states of every position [N, H]).
    """
    if tokens.numel() == 0:
        raise ValueError("prefill needs at least one token; got an empty prompt")
    check_capacity(cache, start + tokens.numel(), f"a prompt of {tokens.numel()} tokens")
    hiddens, logits = [], None
    for i in range(0, tokens.numel(), chunk):
        ids = tokens[i:i + chunk]
        pos = _chunk_positions(start + i, ids)
        lg, h = model(ids, pos, cache, last_logits_only=True)
        hiddens.append(h)
        logits = lg[-1]
    return logits, torch.cat(hiddens, 0)


@torch.no_grad()
def draft_prefill(model: Ling3ForCausalLM, cache: Ling3Cache, next_tokens: torch.Tensor,
                  hidden: torch.Tensor, start: int = 0, chunk: int = PREFILL_CHUNK):
    """Draft over positions start.. with tokens x_{p+1} and target hiddens h_p. Returns the
    draft's (logits, hidden) at the last position."""
    for i in range(0, next_tokens.numel(), chunk):
        ids = next_tokens[i:i + chunk]
        pos = _chunk_positions(start + i, ids)
        lg, dh = model.draft(ids, pos, hidden[i:i + chunk], cache, last_logits_only=True)
    return lg[-1], dh[-1:]


@torch.no_grad()
def greedy_prompt_prefill(model: Ling3ForCausalLM, cache: Ling3Cache, prompt: torch.Tensor, draft: bool,
                          chunk: int = PREFILL_CHUNK):
    """What a greedy request runs before its first step: the target's prefill, the first token
    (argmax of the last position), and with `draft` the NEXTN draft's prefill over the same
    positions (tokens shifted by one, the first token last). Returns (first [] device tensor,
    the draft's (logits, hidden) at the last position or None)."""
    logits, hidden = prefill(model, cache, prompt, chunk=chunk)
    first = logits.argmax(-1)
    if not draft:
        return first, None
    return first, draft_prefill(model, cache, torch.cat([prompt[1:], first.view(1)]), hidden, chunk=chunk)


def _check_new_tokens(max_new_tokens: int) -> None:
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens={max_new_tokens}: generation needs at least 1 new token")


def _done(out: list[int], eos: int | None, stop: set[int], max_new: int) -> bool:
    return len(out) >= max_new or (bool(out) and (out[-1] == eos or out[-1] in stop))


@torch.no_grad()
def greedy_generate(model: Ling3ForCausalLM, prompt: Sequence[int] | torch.Tensor,
                    max_new_tokens: int, eos_token_id: int | None = -1,
                    stop_token_ids: Sequence[int] = (), cache: Ling3Cache | None = None) -> list[int]:
    """Plain greedy decoding, one token per target forward (T=1). eos_token_id=-1: the config's."""
    return sample_generate(model, prompt, max_new_tokens, temperature=0.0,
                           eos_token_id=eos_token_id, stop_token_ids=stop_token_ids, cache=cache)


@torch.no_grad()
def sample_generate(model: Ling3ForCausalLM, prompt: Sequence[int] | torch.Tensor,
                    max_new_tokens: int, temperature: float = 1.0, top_p: float = 1.0,
                    seed: int = 0, eos_token_id: int | None = -1, stop_token_ids: Sequence[int] = (),
                    cache: Ling3Cache | None = None) -> list[int]:
    """Temperature / nucleus sampling without speculation (temperature 0 = greedy)."""
    _check_new_tokens(max_new_tokens)
    dev = _dev(model)
    eos = model.config.eos_token_id if eos_token_id == -1 else eos_token_id
    tokens = _ids(prompt, dev)
    cache = cache if cache is not None else allocate_cache(model, tokens.numel(), max_new_tokens)
    check_capacity(cache, tokens.numel() + max_new_tokens - 1, "this generation")
    gen = torch.Generator(device=dev).manual_seed(seed)
    logits, _ = prefill(model, cache, tokens)
    out: list[int] = []
    pos = tokens.numel()
    while True:
        out.append(int(pick_token(logits, temperature, top_p, gen)))
        if _done(out, eos, set(stop_token_ids), max_new_tokens):
            return out
        lg, _ = model(torch.tensor([out[-1]], device=dev), torch.tensor([pos], device=dev), cache)
        logits = lg[0]
        pos += 1


def pick_token(logits: torch.Tensor, temperature: float, top_p: float = 1.0,
               generator: torch.Generator | None = None) -> torch.Tensor:
    """Greedy argmax at temperature 0 (ties: torch.argmax's first index), else sampling."""
    if temperature <= 0:
        return logits.argmax(-1)
    return torch.multinomial(sampling_distribution(logits, temperature, top_p), 1, generator=generator).squeeze(-1)


def sampling_distribution(logits: torch.Tensor, temperature: float, top_p: float = 1.0) -> torch.Tensor:
    """What pick_token draws from at temperature > 0: softmax(logits / temperature) in fp32, cut
    to the most likely tokens whose mass reaches top_p (the nucleus; tokens of equal logit kept
    or dropped together) and renormalised. One definition with the relay's speculative sampling
    (runtime/relay/sampling.py)."""
    return sampling_probs(logits, temperature, top_p)


@dataclass
class SpecStep:
    """What one speculative step did; handed to `on_step` for tests and statistics."""
    position: int               # n: the chain's first position
    chain: list[int]            # [x_n, d_1, .., d_steps]
    target: list[int]           # y_0 .. y_steps
    accepted: int               # a: drafts accepted
    emitted: list[int]          # d_1..d_a, y_a (before EOS / max-token trimming)


@dataclass
class SpecResult:
    tokens: list[int]
    steps: list[SpecStep] = field(default_factory=list)

    @property
    def mean_accept(self) -> float:
        return sum(s.accepted + 1 for s in self.steps) / max(1, len(self.steps))


# A drafter replaces the NEXTN draft (tests): given (position n, x_n, the tokens emitted so far)
# it returns `steps` draft tokens.
Drafter = Callable[[int, int, list[int]], list[int]]


@torch.no_grad()
def speculative_generate(model: Ling3ForCausalLM, prompt: Sequence[int] | torch.Tensor,
                         max_new_tokens: int, steps: int = 5, drafter: Drafter | None = None,
                         eos_token_id: int | None = -1, stop_token_ids: Sequence[int] = (),
                         cache: Ling3Cache | None = None,
                         on_step: Callable[[SpecStep, Ling3Cache], None] | None = None) -> SpecResult:
    """Greedy NEXTN speculative decoding (topk 1, a chain of steps + 1 tokens, greedy verify).

    Its output equals greedy_generate's token for token (up to argmax near-ties between the T=1
    and T=steps+1 forwards, which lingc's batch-invariant kernels rule out).
    """
    _check_new_tokens(max_new_tokens)
    if not 1 <= steps <= 15:
        raise ValueError(f"steps={steps}: the chain of steps + 1 tokens must fit the recurrent "
                         "form (1 <= steps <= 15)")
    dev = _dev(model)
    eos = model.config.eos_token_id if eos_token_id == -1 else eos_token_id
    stop = set(stop_token_ids)
    tokens = _ids(prompt, dev)
    P = tokens.numel()
    cache = cache if cache is not None else allocate_cache(model, P, max_new_tokens, steps + 1)
    check_capacity(cache, P + max_new_tokens + steps, "this speculative generation")

    logits, hidden = prefill(model, cache, tokens)
    out = [int(logits.argmax())]
    result = SpecResult(out)
    if _done(out, eos, stop, max_new_tokens):
        return result
    seed = None
    if drafter is None:
        nxt = torch.cat([tokens[1:], torch.tensor(out, device=dev)])
        dlog, dhid = draft_prefill(model, cache, nxt, hidden)
        seed = int(dlog.argmax())

    n = P
    while True:
        x_n = out[-1]
        if drafter is None:
            drafts, dh = [seed], dhid
            for j in range(steps - 1):
                dl, dh = model.draft(torch.tensor([drafts[-1]], device=dev),
                                     torch.tensor([n + j], device=dev), dh, cache)
                drafts.append(int(dl[0].argmax()))
        else:
            drafts = [int(t) for t in drafter(n, x_n, list(out))]
            if len(drafts) != steps:
                raise ValueError(f"drafter returned {len(drafts)} tokens, expected steps={steps}")
        chain = [x_n] + drafts
        snapshot = [t.clone() for t in cache.recurrent_tensors()]
        vlog, vhid = model(torch.tensor(chain, device=dev),
                           torch.arange(n, n + steps + 1, device=dev), cache)
        y = vlog.argmax(-1).tolist()
        a = 0
        while a < steps and drafts[a] == y[a]:
            a += 1
        # Roll the recurrent state back and replay the accepted prefix (x_n, d_1..d_a).
        for t, s in zip(cache.recurrent_tensors(), snapshot):
            t.copy_(s)
        model(torch.tensor(chain[:a + 1], device=dev), torch.arange(n, n + a + 1, device=dev), cache)
        emitted = drafts[:a] + [y[a]]
        step = SpecStep(n, chain, y, a, emitted)
        result.steps.append(step)
        if on_step is not None:
            on_step(step, cache)
        for t in emitted:
            out.append(t)
            if _done(out, eos, stop, max_new_tokens):
                return result
        if drafter is None:
            dlog, dhid = draft_prefill(model, cache, torch.tensor(emitted, device=dev),
                                       vhid[:a + 1], start=n)
            seed = int(dlog.argmax())
        n += a + 1
