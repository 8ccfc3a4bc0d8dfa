"""RelayDriver: what every relay engine does once its model's steps exist: compile each role with
backend="lingc", capture it, and run requests (prefill, then steps with host run-ahead).

Two engines build on it: ``Engine`` (Ling-3: its cache, captured prefill, NEXTN layer) and
``SpecRunner`` (any model written as a target step and a draft step over static state). A
subclass supplies the step model (``model(ids, pos, cache) -> (logits, hidden)`` and
``model.draft(ids, pos, hidden, cache) -> (logits, hidden)``, where ``cache`` is the one object the
compiled steps receive beside the relay buffers), zeroes its state (``_zero_state``), checks a
speculative request (``_check_speculative``) and prefills a prompt (``_prefill``, ending in
``_start_relay``).

A speculative step is three launches (draft, verify, extend graphs); a plain step one (decode).
The host launches step k+1 before it reads step k's tokens: those reach the host through a device
ring (written in-graph by the last graph of a step) copied on a side stream, whose event is read
one step late; EOS, max_new_tokens and stop ids are decided then and the overshoot is trimmed.
Nothing accept-dependent crosses to the host before the next launch, unless metadata_capture is
disabled: then the naive host refill of the positions reads ``n`` back every step (a sync per
step, which is the point of the pass). Whether it fired is read from the compile reports of the
graphs a role's first call ran (``graphs_run``), which also covers a graph Dynamo reused from
another engine over the same model with equal options: such an engine compiles nothing.

Sampling (temperature > 0): the first token is drawn from the prefill's logits with the
request's seeded generator; then a speculative request runs the relay with the verify_sample
graph (speculative sampling with the draft's greedy tokens, sampling.py: each token distributed
as plain sampling draws it; the step's uniforms drawn per request into a relay buffer, so nothing
crosses to the host between launches), a plain one the decode_sample graph (the token drawn on
the device from the step's uniform, ``lingc.sampled_targets``: as plain greedy decoding, the host
runs ahead and reads tokens one step late). Tokens are distributed as the reference's pick_token
draws them, not drawn by the same generator calls: a seed reproduces the engine's request, not
sample_generate's tokens. With ``sampled_drafts=True`` a speculative sampling request runs the
draft_sample, verify_sample_q and extend_sample graphs instead: the draft draws its tokens from
its softmax (the first seed on the host from the prefill's draft logits, the later ones in the
graphs from a second table of uniforms) and verify tests them against the draft's kept logits.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Iterator, Sequence

import torch

from lingc.backend import graphs_run
from lingc.decoding.reference import pick_token

from .buffers import RelayBuffers
from .compile_keys import compile_step
from .graphs import CapturedStep, describe, prepare_steps
from .host_gc import Collection, settle_heap
from .run_ahead import RunAhead
from .requests import check_sampling, prompt_ids, until
from .steps import make_steps

# Drafts per relay step. A verify chain is steps + 1 tokens; the relay is built and tested for
# chains of up to 8 (8 tokens x 9 experts = 72 pairs, moe_align's one-launch limit).
MAX_STEPS = 7


@dataclass
class EngineStats:
    """What the last request did (tests and the benchmark read it)."""
    steps: int = 0
    accepts: list[int] = field(default_factory=list)
    ahead: int = 0             # launches that found the previous step still running
    launched: int = 0          # steps launched (the last ones may be trimmed overshoot)
    host_s: list[float] = field(default_factory=list)   # host time to launch each step
    host_syncs: int = 0        # naive host refills (metadata_capture disabled)
    prefill_s: float = 0.0     # wall time to the first token: prompt (and draft) prefill, its argmax
    prefill_rows: int = 0      # the captured prefill's padded size; 0: the eager chunks ran
    read_at: list[float] = field(default_factory=list)  # perf_counter() when each step's row was read
    collections: list[Collection] = field(default_factory=list)   # garbage collections in the loop

    @property
    def mean_accept_length(self) -> float:
        return sum(a + 1 for a in self.accepts) / max(1, len(self.accepts))


def check_steps(steps) -> int:
    if isinstance(steps, bool) or not isinstance(steps, int) or not 1 <= steps <= MAX_STEPS:
        raise ValueError(f"steps={steps!r}: the relay supports 1..{MAX_STEPS} drafts per step "
                         f"(draft tokens = steps + 1 <= {MAX_STEPS + 1})")
    return steps


# The pass role each step function compiles as (design.md "Roles"); others are their own.
PASS_ROLE = {"verify_sample": "verify", "decode_sample": "decode", "draft_sample": "draft",
             "verify_sample_q": "verify", "extend_sample": "extend"}


class RelayDriver(ABC):
    """Compiled, captured relay generation over a subclass's step model (module docstring)."""

    def __init__(self, step_model, cache, steps: int, hidden: int, dtype: torch.dtype, device: torch.device,
               max_len: int, options: dict | None, cudagraphs: bool | None, progress: bool,
               vocab_size: int | None, eos_token_id: int | None, logits_width: int) -> None:
        self.steps = check_steps(steps)
        self.device = device
        self.options = dict(options or {})
        if "role" in self.options:
            raise ValueError(f"{type(self).__name__} options must not set 'role': it compiles one graph per role")
        want_graphs = self.options.get("cudagraphs", True) if cudagraphs is None else cudagraphs
        self.cudagraphs = bool(want_graphs) and device.type == "cuda"
        self.max_len = max_len
        self.cache = cache
        self.vocab_size = vocab_size
        self.eos_token_id = eos_token_id
        self.relay = RelayBuffers.allocate(steps, hidden, dtype, device, rows=max_len + 2, vocab=logits_width)
        self.ring, self.ring_k = self.relay.ring, self.relay.ring_k      # written in-graph (steps.py)
        self._fns = make_steps(step_model, steps)
        self._compiled: dict[str, object] = {}
        self._steps: dict[str, CapturedStep] = {}
        self.naive_refill: dict[str, bool] = {}
        self.reports: dict[str, list] = {}       # role -> the compile reports of the graphs it ran
        self.progress = progress
        self.stats = EngineStats()
        self.captures = 0
        self.heap_settled = (0, 0.0)     # (objects frozen, ms) of the last prepare's settle_heap
        self._run_ahead = RunAhead(self.ring)
        # Tests: a callable(relay) that writes relay.chain with device ops in place of the draft
        # graph (an oracle drafter with injected misses makes every accept length occur).
        self.drafter = None
        # Tests: run the relay loop under torch.cuda.set_sync_debug_mode("error"), so any host
        # synchronisation between launches raises.
        self.check_syncs = False

    # -- what a subclass supplies --------------------------------------------------------------

    @abstractmethod
    def _zero_state(self) -> None:
        """Zero every state tensor the steps read (a fresh request)."""

    def _check_speculative(self) -> None:
        """Raise if this model cannot run speculative requests."""

    @abstractmethod
    def _prefill(self, prompt: torch.Tensor, speculative: bool, pick=None) -> int:
        """Run the prompt, then ``_start_relay``; return the first token (one host read): the
        argmax of the last position's logits, or ``pick(logits)`` (a sampled request's draw),
        which the draft's prefill then reads."""

    # -- compile and capture ------------------------------------------------------------------

    def _compiled_call(self, role: str):
        if role not in self._compiled:
            self._compile(role)
        return self._compiled[role]

    def _compile(self, role: str) -> None:
        opts = dict(self.options, role=PASS_ROLE.get(role, role))
        compiled = compile_step(self._fns[role], opts)

        def call():
            return compiled(self.relay, self.cache)

        # The reports of the graphs this step ran: its own compile's, or, where Dynamo reused a
        # graph another engine compiled with equal options, that graph's.
        with graphs_run() as ran, torch.no_grad():
            call()                                              # compiles (Dynamo + lingc)
        if not ran:
            # As written, a verify step writes every chain position's state: only stage_commit
            # keeps a rejected draft's state out, so an uncompiled step gives wrong tokens.
            raise RuntimeError(
                f"lingc: the {role} step ran without a lingc graph: torch.compile did not compile it "
                f"(TORCHDYNAMO_DISABLE or torch._dynamo.config.disable set, or Dynamo ran it as "
                f"Python). The relay's steps are correct only as lingc compiles them (stage_commit, "
                f"metadata_capture); enable torch.compile for this process")
        self.reports[role] = ran
        fired = [s.matches for r in ran for s in r.stats if s.name == "metadata_capture"]
        self.naive_refill[role] = not (fired and all(m > 0 for m in fired))
        self._compiled[role] = call

    def prepare(self, roles: Sequence[str] = ("draft", "verify", "extend", "decode")) -> None:
        """Compile (and on CUDA capture) the steps of `roles` once; later calls are free."""
        bad = [r for r in roles if r not in self._fns]
        if bad:
            raise ValueError(f"prepare({list(roles)}): unknown role(s) {bad}; the roles are {list(self._fns)}")
        todo = [r for r in roles if r not in self._steps]
        if not todo:
            return
        self._steps.update(prepare_steps(todo, self._compiled_call, self._reset, self.cudagraphs, self.progress))
        # No full collection over the compiled graphs' objects may stop a request's loop later.
        self.heap_settled = settle_heap(self.options.get("gc_freeze", True))
        self.captures += len(todo) if self.cudagraphs else 0
        self._dump_graphs()

    def _dump_graphs(self) -> None:
        """With a dump_dir, write what each step runs as: captured graph (kernel nodes, PDL
        edges) or uncaptured with the reason."""
        d = self.options.get("dump_dir")
        if not d:
            return
        from pathlib import Path
        lines = ["role           captured  detail"]
        for role, step in self._steps.items():
            info = describe(step)
            detail = info.format() if info else (step.reason or "uncaptured (cudagraphs off or CPU)")
            lines.append(f"{role:<14} {'yes' if step.captured else 'no':<9} {detail}")
        Path(d).mkdir(parents=True, exist_ok=True)
        (Path(d) / "cuda_graphs.txt").write_text("\n".join(lines) + "\n")

    def graph_infos(self) -> list:
        """Kernel nodes and PDL edges of each captured graph (the dump's CUDA-graph section)."""
        return [info for s in self._steps.values() if (info := describe(s)) is not None]

    # -- requests -----------------------------------------------------------------------------

    def _reset(self) -> None:
        self._zero_state()
        self.relay.zero_()                                      # the token ring included

    def _check_capacity(self, prompt_len: int, max_new_tokens: int) -> None:
        need = prompt_len + max_new_tokens + 2 * (self.steps + 1)
        if need > self.max_len:
            raise ValueError(f"context overflow: a {prompt_len}-token prompt + {max_new_tokens} new "
                             f"tokens + the relay's run-ahead slack {2 * (self.steps + 1)} need "
                             f"{need} cache rows, the {type(self).__name__} holds {self.max_len}; "
                             f"build it with max_len >= {need}")

    def _start_relay(self, prompt_len: int, first: torch.Tensor, drafted) -> int:
        """The relay buffers after a prompt's prefill: n, x = the first token, and for a
        speculative request the draft's seed and hidden from its (logits, hidden) at the last
        position."""
        r = self.relay
        r.n.fill_(prompt_len)
        r.x.copy_(first.view(1))
        if drafted is not None:
            dlog, dh = drafted
            dlog = dlog.reshape(-1, dlog.shape[-1])[-1:]
            r.seed.copy_(dlog.argmax(-1).view(1))
            r.dh.copy_(dh.reshape(r.dh.shape))
            r.draft_logits[:1].copy_(dlog)          # the seed's q, should the request sample its drafts
        return int(first)                                       # one sync per request

    def _refill(self, role: str) -> None:
        if not self.naive_refill.get(role, False):
            return
        n = int(self.relay.n)                                   # the naive per-step sync
        self.stats.host_syncs += 1
        r = self.relay
        r.pos_chain.copy_(torch.arange(n, n + r.pos_chain.numel()))
        r.pos_draft.copy_(torch.arange(n, n + r.pos_draft.numel()))

    @torch.no_grad()
    def _launch(self, roles: Sequence[str]) -> None:
        for role in roles:
            if role == "draft" and self.drafter is not None:
                self.drafter(self.relay)
                continue
            self._refill(role)
            self._steps[role]()

    def stream(self, prompt: Sequence[int] | torch.Tensor, max_new_tokens: int,
               speculative: str | None = "nextn", temperature: float = 0.0, top_p: float = 1.0,
               seed: int = 0, stop: Sequence[int] = (), eos_token_id: int | None = -1,
               sampled_drafts: bool = False) -> Iterator[int]:
        """Generated token ids as they reach the host (see the module docstring).
        eos_token_id=-1: the model's (None: none). sampled_drafts: a speculative sampling
        request's draft draws its tokens from its own softmax instead of taking its argmax
        (sampling.py: accepted with probability min(1, p / q), so sum min(p, q) a draft instead
        of p(argmax q))."""
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens={max_new_tokens}: generation needs at least 1 new token")
        if speculative not in (None, "nextn"):
            raise ValueError(f"speculative={speculative!r}; expected 'nextn' or None")
        if speculative:
            self._check_speculative()
        check_sampling(temperature, top_p)
        sampling = temperature > 0
        if sampled_drafts and not (sampling and speculative):
            raise ValueError(f"sampled_drafts=True draws the drafts at the request's temperature: it needs "
                             f"speculative='nextn' and temperature > 0 (got speculative={speculative!r}, "
                             f"temperature={temperature})")
        ids = prompt_ids(prompt, self.vocab_size, self.device)
        self._check_capacity(ids.numel(), max_new_tokens)
        eos = self.eos_token_id if eos_token_id == -1 else eos_token_id
        stop_ids = set(stop) | ({eos} if eos is not None else set())
        if speculative and sampled_drafts:
            roles = ("draft_sample", "verify_sample_q", "extend_sample")
        elif speculative:
            roles = ("draft", "verify_sample" if sampling else "verify", "extend")
        else:
            roles = ("decode_sample",) if sampling else ("decode",)
        self.prepare(roles)
        self._reset()
        self.stats = EngineStats()
        gen = torch.Generator(device=self.device).manual_seed(seed) if sampling else None
        t0 = time.perf_counter()
        pick = (lambda logits: pick_token(logits.float(), temperature, top_p, gen)) if sampling else None
        first = self._prefill(ids, bool(speculative), pick)    # ends in a host read: the GPU is done
        self.stats.prefill_s = time.perf_counter() - t0
        yield first
        if max_new_tokens == 1 or first in stop_ids:
            return
        if sampling:
            r = self.relay
            r.uniforms.copy_(torch.rand(r.uniforms.shape, generator=gen, device=self.device))
            r.temperature.fill_(temperature)
            r.top_p.fill_(top_p)
            if sampled_drafts:
                r.draft_uniforms.copy_(torch.rand(r.draft_uniforms.shape, generator=gen, device=self.device))
                r.seed.copy_(pick_token(r.draft_logits[:1], temperature, 1.0, gen))
        yield from until(self._relay_loop(roles), max_new_tokens - 1, stop_ids)

    def resume(self, max_new_tokens: int, speculative: str | None = "nextn",
               stop: Sequence[int] = ()) -> Iterator[int]:
        """Continue greedy generation from the current cache and relay buffers, without a reset
        or prefill (benchmarks start from a synthetic context this way). On CUDA, steps launched
        ahead of the last token yielded have already run when this returns: a following resume()
        continues after their tokens, which were never yielded."""
        roles = ("draft", "verify", "extend") if speculative else ("decode",)
        missing = [r for r in roles if r not in self._steps]
        if missing:
            raise ValueError(f"resume(speculative={speculative!r}) needs the step graphs {missing} compiled "
                             f"first: call engine.prepare({tuple(roles)}) before setting up the state "
                             f"to resume from (a first capture resets the cache and relay buffers)")
        self.stats = EngineStats()
        # The host reads step k's tokens from ring slot k % RING; the graphs write slot
        # ring_k % RING. Steps run outside this loop (a previous resume's run-ahead, direct
        # replays of the graphs) have moved ring_k on: restart it (stream-ordered, after them).
        self.ring_k.zero_()
        yield from until(self._relay_loop(roles), max_new_tokens, set(stop))

    def generate(self, prompt, max_new_tokens: int, **kwargs) -> list[int]:
        return list(self.stream(prompt, max_new_tokens, **kwargs))

    def _relay_loop(self, roles) -> Iterator[int]:
        for row in self._run_ahead.rows(lambda: self._launch(roles), self.stats, self.check_syncs):
            a = row[self.steps + 1]
            self.stats.steps += 1
            self.stats.accepts.append(a)
            yield from row[:a + 1]
