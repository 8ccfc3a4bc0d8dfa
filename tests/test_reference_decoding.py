"""The reference decode loops: NEXTN speculative == greedy, oracle drafters with injected misses
(every accept length), state after forced rejections, EOS and max-token trimming, sampling."""

from collections import Counter

import pytest
import torch
from model_helpers import assert_rel_close, tiny_model

from lingc.decoding.reference import (greedy_generate, prefill, sample_generate,
                                      speculative_generate)
from lingc.models import Ling3Cache

STEPS = 5
NEW = 64


@pytest.fixture(scope="module")
def model():
    return tiny_model(seed=7)


@pytest.fixture(scope="module")
def prompt(model):
    g = torch.Generator().manual_seed(11)
    return torch.randint(0, model.config.vocab_size, (21,), generator=g).tolist()


@pytest.fixture(scope="module")
def greedy(model, prompt):
    """The target's own greedy continuation, long enough for an oracle's last chain."""
    return greedy_generate(model, prompt, NEW + STEPS + 1, eos_token_id=None)


def oracle_drafter(greedy_tokens, plan, vocab, steps=STEPS):
    """Proposes the target's greedy continuation; at step s the draft plan[s % len(plan)] is made
    wrong (when < steps), so exactly that many drafts are accepted."""
    calls = []

    def drafter(n, x_n, out):
        i = len(out)
        assert out[-1] == x_n == greedy_tokens[i - 1]
        drafts = list(greedy_tokens[i:i + steps])
        a = plan[len(calls) % len(plan)]
        calls.append(a)
        if a < steps:
            drafts[a] = (drafts[a] + 1) % vocab
        return drafts

    return drafter


def test_greedy_continuation_is_not_degenerate(greedy):
    assert len(set(greedy)) > 10          # a repetitive loop would make the oracle tests weak


def test_speculative_nextn_equals_greedy(model, prompt, greedy):
    res = speculative_generate(model, prompt, NEW, steps=STEPS, eos_token_id=None)
    assert res.tokens == greedy[:NEW]
    assert len(res.steps) >= 1 and all(0 <= s.accepted <= STEPS for s in res.steps)
    for s in res.steps:
        assert len(s.chain) == STEPS + 1 and s.emitted[-1] == s.target[s.accepted]


def test_oracle_drafter_every_accept_length(model, prompt, greedy):
    plan = [0, 1, 2, 3, 4, 5, 3, 5, 0, 2]
    res = speculative_generate(model, prompt, NEW, steps=STEPS, eos_token_id=None,
                               drafter=oracle_drafter(greedy, plan, model.config.vocab_size))
    assert res.tokens == greedy[:NEW]
    accepted = [s.accepted for s in res.steps]
    assert accepted == [plan[i % len(plan)] for i in range(len(accepted))]
    hist = Counter(accepted)
    assert all(hist[a] >= 1 for a in range(STEPS + 1)), hist
    assert res.mean_accept == pytest.approx(sum(a + 1 for a in accepted) / len(accepted))


class FromScratch:
    """on_step checker: after each step, the target's recurrent state and MLA rows 0..n+a must equal
    a from-scratch run: a fresh cache, prefill of the prompt, then T=1 decodes over every token
    the step committed (the chain's first token x_n and the accepted d_1..d_a, positions n..n+a).
    The reference cache is extended step by step, so across steps it is exactly that from-scratch
    computation (fresh cache, prefill, T=1 decodes up to n+a) without recomputing the prefix."""

    def __init__(self, model, prompt, max_len):
        self.model = model
        self.ref = Ling3Cache.allocate(model.config, max_len)
        prefill(model, self.ref, torch.tensor(prompt))
        self.next_pos = len(prompt)
        self.pending = None            # the bonus token of the previous step (not yet processed)
        self.checked = Counter()

    @torch.no_grad()
    def __call__(self, step, cache):
        n, a = step.position, step.accepted
        assert n == self.next_pos
        if self.pending is not None:
            assert step.chain[0] == self.pending
        for j, tok in enumerate(step.chain[:a + 1]):
            self.model(torch.tensor([tok]), torch.tensor([n + j]), self.ref)
        for x, y in zip(cache.state, self.ref.state):
            assert_rel_close(x, y, 1e-5, f"KDA state after accept {a}")
        for x, y in zip(cache.conv, self.ref.conv):
            assert_rel_close(x, y, 1e-5, f"conv window after accept {a}")
        for x, y in zip(cache.kv, self.ref.kv):
            assert_rel_close(x[:, :n + a + 1], y[:, :n + a + 1], 1e-5, f"MLA rows after accept {a}")
        self.checked[a] += 1
        self.next_pos = n + a + 1
        self.pending = step.emitted[-1]


def test_forced_rejection_state(model, prompt, greedy):
    plan = [5, 0, 3, 1, 4, 2]
    new = 40
    check = FromScratch(model, prompt, len(prompt) + new + STEPS + 1)
    res = speculative_generate(model, prompt, new, steps=STEPS, eos_token_id=None,
                               drafter=oracle_drafter(greedy, plan, model.config.vocab_size),
                               on_step=check)
    assert res.tokens == greedy[:new]
    assert all(check.checked[a] >= 1 for a in range(STEPS + 1)), check.checked


def test_forced_rejection_state_nextn(model, prompt):
    """Same check with the real NEXTN draft (mostly rejections on random weights)."""
    new = 12
    check = FromScratch(model, prompt, len(prompt) + new + STEPS + 1)
    speculative_generate(model, prompt, new, steps=STEPS, eos_token_id=None, on_step=check)
    assert sum(check.checked.values()) >= 1


def _mid_chain_index(greedy):
    """An index k of the full-acceptance output that is a draft in the middle of a chain
    (d_2..d_4 of some step) and whose token does not occur before it."""
    for k in range(3, len(greedy)):
        if (k - 1) % (STEPS + 1) in (1, 2, 3) and greedy[k] not in greedy[:k]:
            return k
    pytest.skip("no suitable eos candidate in the greedy continuation")


def test_eos_inside_accepted_chain(model, prompt, greedy):
    k = _mid_chain_index(greedy)
    eos = greedy[k]
    res = speculative_generate(model, prompt, NEW, steps=STEPS, eos_token_id=eos,
                               drafter=oracle_drafter(greedy, [STEPS], model.config.vocab_size))
    assert res.tokens == greedy[:k + 1]
    last = res.steps[-1]
    assert last.accepted == STEPS and eos in last.emitted[:-1]     # the chain went past the eos
    assert greedy_generate(model, prompt, NEW, eos_token_id=eos) == greedy[:k + 1]
    # As a stop token (eos disabled) the same.
    res2 = speculative_generate(model, prompt, NEW, steps=STEPS, eos_token_id=None,
                                stop_token_ids=[eos],
                                drafter=oracle_drafter(greedy, [STEPS], model.config.vocab_size))
    assert res2.tokens == greedy[:k + 1]


@pytest.mark.parametrize("max_new", [1, 2, 10])
def test_max_new_tokens_trims_overshoot(model, prompt, greedy, max_new):
    res = speculative_generate(model, prompt, max_new, steps=STEPS, eos_token_id=None,
                               drafter=oracle_drafter(greedy, [STEPS], model.config.vocab_size))
    assert res.tokens == greedy[:max_new]
    if max_new > 1:
        assert sum(len(s.emitted) for s in res.steps) + 1 > max_new   # the last step overshot
    res = speculative_generate(model, prompt, 7, steps=STEPS, eos_token_id=None)
    assert res.tokens == greedy[:7]


def test_sampling_seeds(model, prompt, greedy):
    kw = dict(temperature=1.5, eos_token_id=None)
    a = sample_generate(model, prompt, 24, seed=1, **kw)
    assert a == sample_generate(model, prompt, 24, seed=1, **kw)
    others = [sample_generate(model, prompt, 24, seed=s, **kw) for s in (2, 3)]
    assert any(o != a for o in others)
    assert a != greedy[:24]
    assert all(0 <= t < model.config.vocab_size for t in a)
    # A tiny nucleus keeps only the top token: greedy.
    assert sample_generate(model, prompt, 24, temperature=1.5, top_p=1e-6, seed=5,
                           eos_token_id=None) == greedy[:24]
    assert sample_generate(model, prompt, 24, temperature=0.0, seed=5,
                           eos_token_id=None) == greedy[:24]


def test_greedy_rerun_after_sampling(model, prompt):
    first = greedy_generate(model, prompt, 16, eos_token_id=None)
    for seed in (0, 1):
        sample_generate(model, prompt, 16, temperature=1.0, seed=seed, eos_token_id=None)
        sample_generate(model, prompt[:7], 9, temperature=0.8, top_p=0.9, seed=seed,
                        eos_token_id=None)
    assert greedy_generate(model, prompt, 16, eos_token_id=None) == first
    assert speculative_generate(model, prompt, 16, eos_token_id=None).tokens == first


def test_capacity_and_arguments(model, prompt):
    small = Ling3Cache.allocate(model.config, len(prompt) + 4)
    with pytest.raises(ValueError, match="overflow"):
        greedy_generate(model, prompt, 16, eos_token_id=None, cache=small)
    with pytest.raises(ValueError, match="overflow"):
        speculative_generate(model, prompt, 4, eos_token_id=None, cache=small)
    with pytest.raises(ValueError, match="steps=16"):
        speculative_generate(model, prompt, 4, steps=16)
    with pytest.raises(ValueError, match="expected steps=5"):
        speculative_generate(model, prompt, 8, eos_token_id=None, drafter=lambda n, x, o: [1, 2])


@pytest.mark.parametrize("loop", ["greedy", "speculative"])
def test_zero_new_tokens(model, prompt, loop):
    try:
        if loop == "greedy":
            out = greedy_generate(model, prompt, 0, eos_token_id=None)
        else:
            out = speculative_generate(model, prompt, 0, eos_token_id=None).tokens
    except ValueError:
        return
    assert out == []
