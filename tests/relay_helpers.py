"""Shared by the relay and runner tests: an oracle drafter that makes every accept length occur,
and the eager greedy tokens of a model written as a step over static state."""

import torch

from lingc.runtime.relay.buffers import RelayBuffers


class Oracle:
    """Drafts the gold continuation with an injected miss: at step k the first
    schedule[k % len] drafts are right and the next one is wrong. Device ops only (set as an
    engine's ``drafter``, it writes relay.chain in place of the draft graph)."""

    def __init__(self, gold, prompt_len, schedule, steps, vocab, device="cpu"):
        self.gold = torch.tensor(gold + [0] * (steps + 2), device=device)
        self.p, self.steps, self.vocab = prompt_len, steps, vocab
        self.schedule = torch.tensor(schedule, device=device)
        self.k = torch.zeros(1, dtype=torch.long, device=device)

    def __call__(self, r: RelayBuffers) -> None:
        j = torch.arange(1, self.steps + 1, device=r.n.device)
        right = self.gold[(r.n - self.p) + j]
        good = self.schedule[self.k % self.schedule.numel()]
        drafts = torch.where(j <= good, right, (right + 1) % self.vocab)
        r.chain.copy_(torch.cat([r.x, drafts]))
        self.k.add_(1)


def eager_greedy(model, state, prompt, n):
    """The eager model's greedy tokens from a zeroed state: the prompt in one forward, then one
    token a step. ``model(ids, positions, *state)`` returns the logits [T, V]."""
    for t in [t for g in state for t in g]:
        t.zero_()
    dev = state[0][0].device
    with torch.no_grad():
        logits = model(torch.tensor(prompt, device=dev), torch.arange(len(prompt), device=dev), *state)
        out = [int(logits[-1].argmax())]
        for i in range(n - 1):
            logits = model(torch.tensor([out[-1]], device=dev), torch.tensor([len(prompt) + i], device=dev), *state)
            out.append(int(logits[-1].argmax()))
    return out
