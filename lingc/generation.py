"""`lingc.generate`: prefill + the NEXTN relay (or plain decode) on lingc-compiled step graphs.

    import lingc
    model = torch.compile(model, backend="lingc")         # or the eager model itself
    tokens = lingc.generate(model, prompt_ids, max_new_tokens=256)              # greedy, nextn
    for t in lingc.generate(model, prompt_ids, 256, stream=True): print(t)      # streaming
    lingc.generate(model, prompt_ids, 64, temperature=0.8, top_p=0.95, seed=1)  # sampling

The engine (lingc.runtime.relay.Engine) compiles one graph per role (draft, verify, extend,
decode) with backend="lingc", captures each once as a CUDA graph on the GPU, and is kept on the
model for later calls whose context fits (caches are sized to the run, rounded up to
`CONTEXT_ROUND` rows so nearby lengths share one engine).
"""

from __future__ import annotations

from typing import Iterator, Sequence

import torch

from .runtime.relay.engine import Engine

CONTEXT_ROUND = 512
_ATTR = "_lingc_engines"


def engine_for(model, context: int, steps: int = 5, options: dict | None = None) -> Engine:
    """The cached Engine of `model` for at least `context` cache rows (built on first use)."""
    base = getattr(model, "_orig_mod", model)
    from .models.decoder import Ling3ForCausalLM
    if not isinstance(base, Ling3ForCausalLM):
        raise TypeError(f"lingc.generate drives Ling3ForCausalLM (its caches and NEXTN relay), got a "
                        f"{type(base).__name__}; for another model written as model(ids, positions, *state) "
                        f"use lingc.DecodeRunner(model, state, max_len).generate(prompt_ids, max_new_tokens), or with a "
                        f"draft (MTP) layer lingc.SpecRunner(target, draft, state, draft_state, max_len)")
    engines = base.__dict__.setdefault(_ATTR, {})
    key = (steps, tuple(sorted((options or {}).items(), key=lambda kv: kv[0])).__repr__())
    eng = engines.get(key)
    if eng is None or eng.max_len < context:
        max_len = -(-context // CONTEXT_ROUND) * CONTEXT_ROUND
        max_len = min(max_len, base.config.max_position_embeddings)
        eng = engines[key] = Engine(base, max_len, steps=steps, options=options)
    return eng


def generate(model, prompt_ids: Sequence[int] | torch.Tensor, max_new_tokens: int,
             speculative: str | None = "nextn", temperature: float = 0.0, top_p: float = 1.0,
             seed: int = 0, stop: Sequence[int] = (), steps: int = 5, options: dict | None = None,
             stream: bool = False, sampled_drafts: bool = False) -> list[int] | Iterator[int]:
    """Generate up to max_new_tokens after prompt_ids (stops at EOS or a `stop` id, included).

    speculative="nextn" runs the draft/verify/extend relay (greedy, or with temperature > 0
    speculative sampling: each token distributed as plain sampling draws it), None plain
    decoding (greedy, or sampled on the device in the decode graph). A sampled request is
    reproduced by its seed; top_p keeps the most likely tokens until they reach top_p, tokens of
    equal logit together. `options` are lingc backend options for the step graphs (e.g.
    {"inductor": False, "cudagraphs": False, "dump_dir": ...}). sampled_drafts=True (with
    temperature > 0 and speculation) draws the draft's tokens from its own softmax instead of
    taking its argmax; the tokens keep the target's distribution either way.
    """
    n = len(prompt_ids)
    eng = engine_for(model, n + max_new_tokens + 2 * (steps + 1), steps, options)
    it = eng.stream(prompt_ids, max_new_tokens, speculative=speculative, temperature=temperature,
                    top_p=top_p, seed=seed, stop=stop, sampled_drafts=sampled_drafts)
    return it if stream else list(it)
