"""SpecRunner: the NEXTN relay (draft -> verify -> extend, three CUDA graphs a step, host
run-ahead, the recurrent state staged and committed in the verify graph) for any model written
as a target step and a draft step over static state.

    runner = lingc.SpecRunner(target, draft, state, draft_state, max_len=4096, steps=3)
    tokens = runner.generate(prompt_ids, 256)                      # greedy, speculative
    tokens = runner.generate(prompt_ids, 256, speculative=None)    # plain greedy decoding
    for t in runner.stream(prompt_ids, 256): print(t)

- ``target(ids [T], positions [T], *state) -> (logits [T, V], hidden [T, H])``: the model's
  forward over one sequence, writing its recurrent states, conv windows and attention caches in
  place (as for DecodeRunner), and also returning the hidden state its draft layer reads;
- ``draft(ids [T], positions [T], hidden [T, H], *draft_state) -> (logits [T, V], hidden [T, H])``:
  a multi-token-prediction layer (DeepSeek-V3's and Qwen3-Next's MTP, Ling-3's NEXTN): at
  position p it reads token x_{p+1} and the hidden state at p (the target's, or its own when it
  drafts ahead) and writes its attention cache at p. The draft may keep position-indexed caches
  only: the extend graph runs it over a fixed steps + 1 rows, the rows past the accepted prefix
  padding that later steps rewrite before anything reads them, which a recurrent state could not
  take (checked when the runner is built).

Greedy speculative output equals plain greedy output token for token where the compiled target
is batch-invariant (lingc's kernels are: a verify row equals the decode of that position bit for
bit); the recurrent state is staged per chain position and the accepted one committed in the
verify graph (passes/stage_commit.py), so a rejection leaves no trace. Per request: every state
tensor is zeroed, the prompt runs through the eager target (and, for a speculative request, the
eager draft over the same positions, tokens shifted by one), then the relay runs (driver.py).
Sampling (temperature > 0) runs speculatively too (sampling.py: each token distributed as
plain sampling's), and plain sampling in its own decode graph, as the Engine's.
"""

from __future__ import annotations

import numbers
from typing import Callable, Sequence

import torch

from .driver import RelayDriver, check_steps
from .runner import _leaves


class _StepModel:
    """The target and draft as make_steps calls them, over cache = (state, draft_state)."""

    def __init__(self, target: Callable, draft: Callable):
        self._target, self._draft = target, draft

    def __call__(self, ids, pos, cache):
        return self._target(ids, pos, *cache[0])

    def draft(self, ids, pos, hidden, cache):
        return self._draft(ids, pos, hidden, *cache[1])


def _pair(out, who: str, T: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(logits [T, V], hidden [T, H]) from a step's return value, or the reason it is not."""
    want = f"{who} must return (logits [T, V], hidden [T, H])"
    if not isinstance(out, (tuple, list)) or len(out) != 2 or not all(torch.is_tensor(t) for t in out):
        raise ValueError(f"{want}; at T = {T} it returned a {type(out).__name__}"
                         + (f" of {len(out)} items" if isinstance(out, (tuple, list)) else ""))
    logits, hidden = out
    if logits.dim() != 2 or hidden.dim() != 2 or logits.shape[0] != T or hidden.shape[0] != T:
        raise ValueError(f"{want}; at T = {T} it returned shapes {list(logits.shape)} and {list(hidden.shape)} "
                         f"(a model with a batch dim of 1 runs through a wrapper that drops it)")
    return logits, hidden


class SpecRunner(RelayDriver):
    """Compiled, captured speculative (or plain) batch-1 decoding of a target and its draft
    layer over static state (module docstring)."""

    def __init__(self, target, draft, state: Sequence, draft_state: Sequence, max_len: int, steps: int = 3,
                 options: dict | None = None, cudagraphs: bool | None = None, prefill_chunk: int | None = None,
                 eos_token_id: int | None = None, progress: bool = True):
        """target, draft: callables (nn.Modules, bound methods, or their torch.compile wrappers:
        unwrapped); state, draft_state: their arguments after ids and positions (and the draft's
        hidden), tuples of tensors or lists of tensors on one device, allocated for max_len
        positions (zeroed when the runner is built, which runs each step once eagerly to check it,
        and at every request); steps: drafts per step (draft tokens = steps + 1); options: lingc backend
        options for the step graphs (not "role"); cudagraphs: capture the steps on CUDA (default:
        options' "cudagraphs", True); prefill_chunk: the prompt's tokens per eager forward (None:
        all at once); eos_token_id: ends a request like a stop id (default: the target's
        config.eos_token_id where there is one)."""
        check_steps(steps)
        self.target = getattr(target, "_orig_mod", target)
        self.draft = getattr(draft, "_orig_mod", draft)
        for name, fn in (("target", self.target), ("draft", self.draft)):
            if not callable(fn):
                raise TypeError(f"{name} must be callable, got {type(fn).__name__}")
        self.state, self.draft_state = self._tuple(state, "state"), self._tuple(draft_state, "draft_state")
        leaves, dleaves = _leaves(self.state), _leaves(self.draft_state, "draft_state")
        if not leaves:
            raise ValueError("state holds no tensor: the target's state (recurrent states, caches) comes after "
                             "ids and positions")
        shared = {id(t) for t in leaves} & {id(t) for t in dleaves}
        if shared:
            raise ValueError(f"{len(shared)} tensor(s) are in both state and draft_state: the draft keeps "
                             f"caches of its own")
        devices = sorted({str(t.device) for t in leaves + dleaves})
        if len(devices) != 1:
            raise ValueError(f"state and draft_state tensors are on {devices}: put them on one device")
        if not isinstance(max_len, numbers.Integral) or isinstance(max_len, bool) or max_len < 2:
            raise ValueError(f"max_len={max_len!r}: want the number of positions the state holds (an int >= 2)")
        if prefill_chunk is not None and (not isinstance(prefill_chunk, numbers.Integral) or prefill_chunk < 1):
            raise ValueError(f"prefill_chunk={prefill_chunk!r}: want a positive int, or None for the whole prompt")
        self.prefill_chunk = prefill_chunk
        self._leaves = leaves + dleaves
        device = leaves[0].device
        vocab, hidden = self._probe(device, int(max_len), dleaves)
        config = getattr(self.target, "config", None) or getattr(getattr(self.target, "__self__", None), "config", None)
        eos = eos_token_id if eos_token_id is not None else getattr(config, "eos_token_id", None)
        super().__init__(_StepModel(self.target, self.draft), (self.state, self.draft_state), steps, hidden.shape[-1],
                    hidden.dtype, device, int(max_len), options, cudagraphs, progress, vocab_size=vocab,
                    eos_token_id=eos, logits_width=vocab)

    @staticmethod
    def _tuple(state, name: str) -> tuple:
        if torch.is_tensor(state) or not isinstance(state, (list, tuple)):
            raise ValueError(f"{name} must be a tuple (or list) of the step's arguments, got a {type(state).__name__}")
        return tuple(state)

    @torch.no_grad()
    def _probe(self, device: torch.device, max_len: int, dleaves: list[torch.Tensor]) -> tuple[int, torch.Tensor]:
        """One eager target and draft token: their return contract, the vocabulary and hidden
        size, and that the draft writes its state at the position only (no recurrent state).
        Leaves every state tensor zeroed."""
        self._zero_state()
        ids = torch.zeros(1, dtype=torch.int64, device=device)
        logits, hidden = _pair(self.target(ids, torch.zeros_like(ids), *self.state), "target", 1)
        p = max_len - 1
        before = [t.clone() for t in dleaves]
        dlogits, dhidden = _pair(self.draft(ids, torch.full_like(ids, p), hidden, *self.draft_state), "draft", 1)
        if dlogits.shape[-1] != logits.shape[-1] or dhidden.shape[-1] != hidden.shape[-1]:
            raise ValueError(f"the draft returned logits [1, {dlogits.shape[-1]}] and hidden [1, {dhidden.shape[-1]}], "
                             f"the target [1, {logits.shape[-1]}] and [1, {hidden.shape[-1]}]: they must agree")
        for i, (t, old) in enumerate(zip(dleaves, before)):
            changed = (t != old).nonzero()
            if changed.numel() and not any(t.shape[d] >= max_len and bool((changed[:, d] == p).all())
                                           for d in range(t.dim())):
                raise ValueError(
                    f"draft_state tensor {i} (shape {list(t.shape)}) changed outside position {p}'s row when the "
                    f"draft ran at position {p}: a draft with recurrent state cannot run in the relay's extend "
                    f"step (its rows past the accepted prefix are padding); give the draft position-indexed "
                    f"caches of at least max_len={max_len} rows only")
        self._zero_state()
        return logits.shape[-1], hidden

    def _zero_state(self) -> None:
        for t in self._leaves:
            t.zero_()

    @torch.no_grad()
    def _prefill(self, prompt: torch.Tensor, speculative: bool, pick=None) -> int:
        n = prompt.numel()
        chunk = self.prefill_chunk or n
        spans = [(s, min(n, s + chunk)) for s in range(0, n, chunk)]
        hiddens = []
        for s, e in spans:
            logits, h = _pair(self.target(prompt[s:e], torch.arange(s, e, device=self.device), *self.state),
                              "target", e - s)
            hiddens.append(h)
        first = logits[-1].argmax(-1) if pick is None else pick(logits[-1])
        if not speculative:
            return self._start_relay(n, first, None)
        # The draft at position p reads token x_{p+1} and the target's hidden at p.
        nxt, hidden = torch.cat([prompt[1:], first.view(1)]), torch.cat(hiddens)
        for s, e in spans:
            dlogits, dh = _pair(self.draft(nxt[s:e], torch.arange(s, e, device=self.device), hidden[s:e],
                                           *self.draft_state), "draft", e - s)
        return self._start_relay(n, first, (dlogits[-1], dh[-1:]))
