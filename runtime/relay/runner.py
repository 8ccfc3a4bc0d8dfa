"""DecodeRunner: batch-1 decoding of any model written as a step over static state, compiled by
lingc and (on the GPU) captured once as a CUDA graph.

    runner = lingc.DecodeRunner(model, state, max_len=4096)
    tokens = runner.generate(prompt_ids, 256, stop=[eos_id])
    for t in runner.stream(prompt_ids, 256, temperature=0.8, seed=1): print(t)

The model is called as ``model(ids [T], positions [T], *state) -> logits [T, V]`` and updates its
state in place: recurrent states, conv windows, attention caches written at ``positions`` (a
decoder over static caches, as tests/foreign_model.py writes Kimi Linear's and Qwen3-Next's
layers). ``state`` is the tuple of those arguments (tensors, or lists of tensors), allocated by
the caller for ``max_len`` positions. A model laid out with a batch dim of 1 (ids [1, T] in,
logits [1, T, V] out) runs through a wrapper: ``lambda ids, pos, *s: model(ids[None], pos, *s)[0]``.

Per request: every state tensor is zeroed (a fresh recurrent state, an empty cache), the prompt
runs through the eager model (in one forward, or chunks of ``prefill_chunk`` tokens), then one
decode step per token. The step is the model call compiled with backend="lingc" (role "decode",
fullgraph) together with the greedy argmax and the bookkeeping: the next token, its position and
a device token ring are written inside the graph (one lingc.relay_advance: the relay's decode
tail), so on CUDA the captured step is replayed with
nothing read back before the next launch. The host launches step k + 1 before it reads step k's
token (copied from the ring on a side stream, its event read one step late) and trims what it
ran past (stop ids, max_new_tokens). Sampling (temperature > 0) runs a second step, "sample": the
same with the token drawn from the logits on the device (``lingc.sampled_targets`` over the chain
[x], from row k of a table of uniforms drawn per request with its generator; temperature and
top_p read from device buffers), so it is captured and run ahead like the greedy step. The
request's first token comes from the prefill's logits through ``pick_token`` (one host read a
request).

This runner decodes without speculation; a model with a draft (MTP) layer runs the NEXTN relay
on SpecRunner (spec_runner.py), Ling3ForCausalLM on Engine.
"""

from __future__ import annotations

import numbers
import time
from dataclasses import dataclass, field
from typing import Callable, Iterator, Sequence

import torch

from lingc.backend import graphs_run
from lingc.decoding.reference import pick_token

from .buffers import RING
from .compile_keys import compile_step
from .graphs import CapturedStep, describe, prepare_steps
from .host_gc import Collection, settle_heap
from .run_ahead import RunAhead
from .requests import check_sampling, prompt_ids, until


@dataclass
class RunnerStats:
    """What the last request did (tests read it)."""
    steps: int = 0             # decode steps whose token reached the host
    launched: int = 0          # steps launched (the last may be run-ahead past the end)
    ahead: int = 0             # launches that found the previous step still running (CUDA)
    host_s: list[float] = field(default_factory=list)   # host time to launch each step
    prefill_s: float = 0.0     # wall time to the first token
    read_at: list[float] = field(default_factory=list)  # perf_counter() when each step's row was read
    collections: list[Collection] = field(default_factory=list)   # garbage collections in the loop


def _leaves(state, where: str = "state") -> list[torch.Tensor]:
    out = []
    for i, s in enumerate(state):
        if isinstance(s, (list, tuple)):
            out += _leaves(s, f"{where}[{i}]")
        elif torch.is_tensor(s):
            out.append(s)
        else:
            raise ValueError(f"{where}[{i}] is a {type(s).__name__}: the state must hold tensors (or lists "
                             f"of tensors), the model's arguments after ids and positions")
    return out


def _greedy_step(model: Callable, x, pos, emitted, accept, ring, k, state) -> None:
    """One token: the model at (x, pos), its argmax y written to x and to the ring's row k % RING
    ([y, accept = 0]); pos, k += 1. Written as the relay's decode tail (runtime/relay/steps.py), so
    pdl_swap folds it into one lingc.relay_advance instead of a handful of ATen kernels."""
    y = model(x, pos, *state).argmax(-1)               # logits [1, V] at one token: y [1]
    _advance(y, x, pos, emitted, accept, ring, k)


def _advance(y, x, pos, emitted, accept, ring, k) -> None:
    """The step's tail: token y to x and to ring row k % RING, position and k on by one."""
    emitted.copy_(y)
    x.copy_(y)
    pos.copy_(pos + 1)
    ring.index_copy_(0, k % ring.shape[0], torch.cat([emitted, accept]).unsqueeze(0))
    k.add_(1)


def _sample_step(model: Callable, x, pos, emitted, accept, ring, k, uniforms, temperature, top_p, state) -> None:
    """One sampled token: the model at (x, pos), y drawn from its logits with uniform row
    k % R (lingc.sampled_targets over the one-token chain [x]: plain sampling's draw), then the
    greedy step's tail."""
    y = torch.ops.lingc.sampled_targets(x, model(x, pos, *state), uniforms, k, temperature, top_p)
    _advance(y, x, pos, emitted, accept, ring, k)


class DecodeRunner:
    """Compiled, captured batch-1 decoding of one model over its static state (module docstring)."""

    def __init__(self, model, state: Sequence, max_len: int, options: dict | None = None,
                 cudagraphs: bool | None = None, prefill_chunk: int | None = None,
                 eos_token_id: int | None = None, vocab_size: int | None = None, progress: bool = True):
        """model: a callable (an nn.Module, or its torch.compile wrapper: unwrapped); state: its
        arguments after ids and positions; max_len: the positions the state holds (the cache
        rows); options: lingc backend options for the step graph (not "role"); cudagraphs:
        capture the step on CUDA (default: options' "cudagraphs", True); prefill_chunk: the
        prompt's tokens per eager forward (None: all at once); eos_token_id: ends a request like
        a stop id (default: model.config.eos_token_id where there is one); vocab_size: checks the
        prompt ids (default: model.config.vocab_size where there is one)."""
        self.model = getattr(model, "_orig_mod", model)
        if not callable(self.model):
            raise TypeError(f"model must be callable as model(ids, positions, *state), got {type(model).__name__}")
        if torch.is_tensor(state) or not isinstance(state, (list, tuple)):
            raise ValueError("state must be a tuple (or list) of the model's arguments after ids and positions, "
                             f"got a {type(state).__name__}")
        self.state = tuple(state)
        leaves = _leaves(self.state)
        if not leaves:
            raise ValueError("state holds no tensor: the runner decodes a model whose state (recurrent states, "
                             "caches) it passes after ids and positions")
        devices = sorted({str(t.device) for t in leaves})
        if len(devices) != 1:
            raise ValueError(f"state tensors are on {devices}: put the whole state on one device")
        self.device = leaves[0].device
        self._leaves = leaves
        if not isinstance(max_len, numbers.Integral) or isinstance(max_len, bool) or max_len < 2:
            raise ValueError(f"max_len={max_len!r}: want the number of positions the state holds (an int >= 2)")
        self.max_len = int(max_len)
        if prefill_chunk is not None and (not isinstance(prefill_chunk, numbers.Integral) or prefill_chunk < 1):
            raise ValueError(f"prefill_chunk={prefill_chunk!r}: want a positive int, or None for the whole prompt")
        self.prefill_chunk = prefill_chunk
        self.options = dict(options or {})
        if "role" in self.options:
            raise ValueError("DecodeRunner options must not set 'role': the step is compiled as the decode role")
        want = self.options.get("cudagraphs", True) if cudagraphs is None else cudagraphs
        self.cudagraphs = bool(want) and self.device.type == "cuda"
        config = getattr(self.model, "config", None)
        self.eos_token_id = eos_token_id if eos_token_id is not None else getattr(config, "eos_token_id", None)
        self.vocab_size = vocab_size if vocab_size is not None else getattr(config, "vocab_size", None)
        self.progress = progress
        z = dict(dtype=torch.int64, device=self.device)
        self.x, self.pos, self.k = torch.zeros(1, **z), torch.zeros(1, **z), torch.zeros(1, **z)
        self.emitted, self.accept = torch.zeros(1, **z), torch.zeros(1, **z)    # accept stays 0
        self.ring = torch.zeros(RING, 2, **z)      # row k % RING: [step k's token, 0]
        # Sampling: step k draws with uniforms[k % max_len] (a request never reuses a row).
        f32 = dict(dtype=torch.float32, device=self.device)
        self.uniforms = torch.zeros(self.max_len, 1, **f32)
        self.temperature, self.top_p = torch.ones(1, **f32), torch.ones(1, **f32)
        self.check_syncs = False                   # tests: a host sync between launches raises
        self._steps: dict[str, CapturedStep] = {}
        self.reports: dict[str, list] = {}       # kind -> the step's compile reports
        self.stats = RunnerStats()
        self.heap_settled = (0, 0.0)     # (objects frozen, ms) of the last prepare's settle_heap
        self._run_ahead = RunAhead(self.ring)

    # -- compile and capture ------------------------------------------------------------------

    def _compile(self, kind: str) -> Callable[[], object]:
        opts = dict(self.options, role="decode")
        model = self.model
        if kind == "greedy":
            def fn(x, pos, emitted, accept, ring, k, state):
                _greedy_step(model, x, pos, emitted, accept, ring, k, state)
            compiled = compile_step(fn, opts)

            def call():
                return compiled(self.x, self.pos, self.emitted, self.accept, self.ring, self.k, self.state)
        else:
            def fn(x, pos, emitted, accept, ring, k, uniforms, temperature, top_p, state):
                _sample_step(model, x, pos, emitted, accept, ring, k, uniforms, temperature, top_p, state)
            compiled = compile_step(fn, opts)

            def call():
                return compiled(self.x, self.pos, self.emitted, self.accept, self.ring, self.k, self.uniforms,
                                self.temperature, self.top_p, self.state)
        with graphs_run() as ran, torch.no_grad():
            call()                                              # compiles (Dynamo + lingc)
        self.reports[kind] = ran          # also where Dynamo reused another runner's graph
        return call

    def prepare(self, kinds: Sequence[str] = ("greedy",)) -> None:
        """Compile (and on CUDA capture) the greedy and/or sampling ("sample") step once."""
        bad = [k for k in kinds if k not in ("greedy", "sample")]
        if bad:
            raise ValueError(f"prepare({list(kinds)}): the steps are 'greedy' and 'sample'")
        todo = [k for k in kinds if k not in self._steps]
        if not todo:
            return
        self._steps.update(prepare_steps(todo, self._compile, self._reset, self.cudagraphs, self.progress))
        # No full collection over the compiled graphs' objects may stop a request's loop later.
        self.heap_settled = settle_heap(self.options.get("gc_freeze", True))

    def graph_infos(self) -> list:
        """Kernel nodes and PDL edges of each captured step graph."""
        return [info for s in self._steps.values() if (info := describe(s)) is not None]

    # -- requests -----------------------------------------------------------------------------

    def _reset(self) -> None:
        for t in self._leaves:
            t.zero_()
        for t in (self.x, self.pos, self.k, self.emitted, self.accept, self.ring):
            t.zero_()

    @torch.no_grad()
    def _prefill(self, ids: torch.Tensor) -> torch.Tensor:
        """The eager model over the prompt (in chunks): the last position's logits."""
        n = ids.numel()
        chunk = self.prefill_chunk or n
        for s in range(0, n, chunk):
            e = min(n, s + chunk)
            logits = self.model(ids[s:e], torch.arange(s, e, device=self.device), *self.state)
        return logits[-1]

    def stream(self, prompt, max_new_tokens: int, temperature: float = 0.0, top_p: float = 1.0,
               seed: int = 0, stop: Sequence[int] = ()) -> Iterator[int]:
        """Generated token ids as they reach the host: up to max_new_tokens, ending at EOS or a
        stop id (included)."""
        if not isinstance(max_new_tokens, numbers.Integral) or max_new_tokens < 1:
            raise ValueError(f"max_new_tokens={max_new_tokens!r}: generation needs at least 1 new token")
        check_sampling(temperature, top_p)
        ids = prompt_ids(prompt, self.vocab_size, self.device)
        n = ids.numel()
        # Step j feeds position n + j; the host launches one step past the last token it reads.
        if n + max_new_tokens > self.max_len:
            raise ValueError(f"context overflow: a {n}-token prompt + {max_new_tokens} new tokens need "
                             f"{n + max_new_tokens} positions, the state holds max_len={self.max_len}; "
                             f"allocate the state for more positions and pass that max_len")
        stop_ids = set(stop) | ({self.eos_token_id} if self.eos_token_id is not None else set())
        sampling = temperature > 0
        kind = "sample" if sampling else "greedy"
        self.prepare((kind,))
        self._reset()
        self.stats = RunnerStats()
        t0 = time.perf_counter()
        last = self._prefill(ids)
        gen = torch.Generator(device=self.device).manual_seed(seed) if sampling else None
        first = int(pick_token(last.float(), temperature, top_p, gen))    # one host read a request
        self.stats.prefill_s = time.perf_counter() - t0
        yield first
        if max_new_tokens == 1 or first in stop_ids:
            return
        self.x.fill_(first)
        self.pos.fill_(n)
        if sampling:
            self.uniforms.copy_(torch.rand(self.uniforms.shape, generator=gen, device=self.device))
            self.temperature.fill_(temperature)
            self.top_p.fill_(top_p)
        yield from until(self._loop(kind), max_new_tokens - 1, stop_ids)

    def generate(self, prompt, max_new_tokens: int, **kwargs) -> list[int]:
        return list(self.stream(prompt, max_new_tokens, **kwargs))

    def _loop(self, kind: str) -> Iterator[int]:
        step = self._steps[kind]

        def launch() -> None:
            with torch.no_grad():
                step()

        for row in self._run_ahead.rows(launch, self.stats, self.check_syncs):
            self.stats.steps += 1
            yield row[0]
