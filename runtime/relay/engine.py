"""The lingc engine: compile the step functions with their roles, capture them, and generate.

    engine = Engine(model, max_len=4096)            # model: eager, or torch.compile'd (unwrapped)
    tokens = engine.generate(prompt_ids, 256, speculative="nextn")
    for t in engine.stream(prompt_ids, 256): ...

Per request: the cache and relay buffers are reset, the prompt is prefilled, then steps run. On
CUDA a prompt of up to PREFILL_CHUNK tokens prefills as one replay of a captured graph padded to
its size (prefill_graphs.py: eager prefill issues ~2500 kernels and is host-bound up to ~8192
tokens; tensor-parallel ranks capture it, with their collectives inside, with `prefill_graphs=True`);
longer prompts, the CPU, tensor-parallel ranks by default and `prefill_graphs=False` take the
eager model's chunks. A speculative step is three launches (draft, verify,
extend graphs); a plain step one (decode). The host launches step k+1 before it reads step k's
tokens: those reach the host through a device ring (written in-graph by the last graph of a
step) copied on a side stream, whose event is read one step late; EOS, max_new_tokens and stop
ids are decided then and the overshoot is trimmed. Nothing accept-dependent crosses to the host
before the next launch, unless metadata_capture is disabled: then the naive host refill of the
positions reads ``n`` back every step (a sync per step, which is the point of the pass).

Sampling (temperature > 0) runs without speculation: the decode graph gives the logits and the
token is drawn on the device with the request's generator (the documented fallback of
design.md; speculative rejection sampling is not implemented).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Iterator, Sequence

import torch

from lingc.backend import compile_reports
from lingc.decoding.reference import greedy_prompt_prefill, pick_token
from lingc.models.cache import Ling3Cache
from lingc.progress import Progress

from .buffers import RING, RelayBuffers, copy_row_to_host
from .graphs import CapturedStep, capture_step, describe
from .prefill_graphs import PrefillGraphs
from .requests import check_sampling, prompt_ids, until
from .steps import make_steps


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

    @property
    def mean_accept_length(self) -> float:
        return sum(a + 1 for a in self.accepts) / max(1, len(self.accepts))


def _unwrap(model):
    return getattr(model, "_orig_mod", model)


# Drafts per relay step. A verify chain is steps + 1 tokens; the relay is built and tested for
# chains of up to 8 (8 tokens x 9 experts = 72 pairs, moe_align's one-launch limit).
MAX_STEPS = 7


class Engine:
    """Compiled, captured generation for one Ling-3 model (batch 1)."""

    def __init__(self, model, max_len: int, steps: int = 5, options: dict | None = None,
                 cudagraphs: bool | None = None, progress: bool = True, prefill_graphs: bool | None = None):
        """prefill_graphs: capture the prompt's prefill per padded size (default: with cudagraphs,
        on a single-GPU model; True also on tensor-parallel ranks; prefill_graphs.py)."""
        self.model = _unwrap(model)
        cfg = self.model.config
        if not 1 <= steps <= MAX_STEPS:
            raise ValueError(f"steps={steps}: the relay supports 1..{MAX_STEPS} drafts per step "
                             f"(draft tokens = steps + 1 <= {MAX_STEPS + 1})")
        self.steps = steps
        self.device = self.model.lm_head.weight.device
        self.options = dict(options or {})
        if "role" in self.options:
            raise ValueError("Engine options must not set 'role': the engine compiles one graph per role")
        want_graphs = self.options.get("cudagraphs", True) if cudagraphs is None else cudagraphs
        self.cudagraphs = bool(want_graphs) and self.device.type == "cuda"
        if prefill_graphs and not self.cudagraphs:
            raise ValueError("prefill_graphs=True needs CUDA graphs (CUDA, cudagraphs on; device "
                             f"{self.device}, cudagraphs {self.cudagraphs}); leave it None for the default")
        # Tensor-parallel ranks capture their prefill only when asked (prefill_graphs=True): the
        # path is tested on the CPU and waits for a multi-GPU run before it becomes their default.
        default = self.cudagraphs and self.model.tp.size == 1
        self.use_prefill_graphs = default if prefill_graphs is None else bool(prefill_graphs)
        self.max_len = max_len
        self.cache = Ling3Cache.allocate(cfg, max_len, device=self.device)
        self.relay = RelayBuffers.allocate(steps, cfg.hidden_size, cfg.dtype, self.device)
        self.ring, self.ring_k = self.relay.ring, self.relay.ring_k      # written in-graph (steps.py)
        self._fns = make_steps(self.model, steps)
        self._compiled: dict[str, object] = {}
        self._steps: dict[str, CapturedStep] = {}
        self._prefill_graphs: dict[bool, PrefillGraphs] = {}     # by draft (speculative requests)
        self._prefill_pool = None
        self.naive_refill: dict[str, bool] = {}
        self.progress = progress
        self.stats = EngineStats()
        self.captures = 0
        self._host_ring = None
        self._copy_stream = None
        # Tests: a callable(relay) that writes relay.chain with device ops in place of the draft
        # graph (an oracle drafter with injected misses makes every accept length occur).
        self.drafter = None
        # Tests: run the relay loop under torch.cuda.set_sync_debug_mode("error"), so any host
        # synchronisation between launches raises.
        self.check_syncs = False

    # -- compile and capture ------------------------------------------------------------------

    def _compile(self, role: str) -> None:
        fn = self._fns[role]
        opts = dict(self.options, role="decode" if role.startswith("decode") else role)
        compiled = torch.compile(fn, backend="lingc", fullgraph=True, dynamic=False, options=opts)

        def call():
            return compiled(self.relay, self.cache)

        n = len(compile_reports)
        with torch.no_grad():
            call()                                              # compiles (Dynamo + lingc)
        reports = compile_reports[n:]
        fired = [s.matches for r in reports for s in r.stats if s.name == "metadata_capture"]
        self.naive_refill[role] = not (fired and all(m > 0 for m in fired))
        self._compiled[role] = call

    def prepare(self, roles: Sequence[str] = ("draft", "verify", "extend", "decode")) -> None:
        """Compile (and on CUDA capture) the steps of `roles` once; later calls are free."""
        todo = [r for r in roles if r not in self._steps]
        if not todo:
            return
        bar = Progress(len(todo), "lingc compile + capture", enabled=self.progress)
        pool = torch.cuda.graph_pool_handle() if self.cudagraphs else None
        self._reset()
        for role in todo:
            if role not in self._compiled:
                self._compile(role)
            call = self._compiled[role]
            if self.cudagraphs:
                with torch.no_grad():
                    self._steps[role] = capture_step(role, call, pool)
                self.captures += 1
            else:
                self._steps[role] = CapturedStep(role, call, None)
            bar.update()
        bar.close()
        self._reset()
        self._dump_graphs()

    def prepare_prefill(self, prompt_len: int | None = None, speculative: Sequence[bool] = (False, True)) -> None:
        """Capture prefill graphs now instead of at the first request that needs each: the bucket
        of a prompt_len-token prompt, or every bucket (None), for plain and/or speculative requests.
        A no-op where prefill is eager (the CPU, tensor parallelism by default, prefill_graphs=False)."""
        for spec in speculative:
            graphs = self.prefill_graphs(bool(spec))
            if graphs is None:
                return
            rows = None if prompt_len is None else graphs.bucket_for(prompt_len)
            if prompt_len is None or rows is not None:
                graphs.prepare(None if rows is None else (rows,))
        self._reset()

    def prefill_graphs(self, speculative: bool) -> PrefillGraphs | None:
        """The captured prefill of plain or speculative requests (None: eager prefill only). Its
        buckets are captured as requests first need them, or by `prepare_prefill`."""
        if not self.use_prefill_graphs:
            return None
        if speculative not in self._prefill_graphs:
            # Plain and speculative prefills share one pool: they never run at the same time, and
            # each graph's outputs are read before the next replay.
            if self._prefill_pool is None and self.cudagraphs:
                self._prefill_pool = torch.cuda.graph_pool_handle()
            self._prefill_graphs[speculative] = PrefillGraphs(self.model, self.cache, speculative,
                                                              progress=self.progress, pool=self._prefill_pool)
        return self._prefill_graphs[speculative]

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
        self.cache.zero_()
        self.relay.zero_()                                      # the token ring included

    def _check_capacity(self, prompt_len: int, max_new_tokens: int) -> None:
        need = prompt_len + max_new_tokens + 2 * (self.steps + 1)
        if need > self.max_len:
            raise ValueError(f"context overflow: a {prompt_len}-token prompt + {max_new_tokens} new "
                             f"tokens + the relay's run-ahead slack {2 * (self.steps + 1)} need "
                             f"{need} cache rows, the engine holds {self.max_len}; build the Engine "
                             f"with max_len >= {need}")

    @torch.no_grad()
    def _prefill(self, prompt: torch.Tensor, speculative: bool) -> int:
        graphs = self.prefill_graphs(speculative)
        rows = graphs.bucket_for(prompt.numel()) if graphs is not None else None
        if rows is not None and rows not in graphs.captured:   # its first request: capture (runs the model)
            graphs.prepare((rows,))
            self._reset()
        if rows is not None and graphs.captured[rows]:   # a failed capture (it warned): the eager chunks
            out = graphs(prompt)
            first, drafted = out.first, out.draft
            self.stats.prefill_rows = rows
        else:
            first, drafted = greedy_prompt_prefill(self.model, self.cache, prompt, speculative)
        r = self.relay
        r.n.fill_(prompt.numel())
        r.x.copy_(first.view(1))
        if speculative:
            dlog, dh = drafted
            r.seed.copy_(dlog.argmax(-1).view(1))
            r.dh.copy_(dh)
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
               seed: int = 0, stop: Sequence[int] = (), eos_token_id: int | None = -1) -> Iterator[int]:
        """Generated token ids as they reach the host (see the module docstring)."""
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens={max_new_tokens}: generation needs at least 1 new token")
        if speculative not in (None, "nextn"):
            raise ValueError(f"speculative={speculative!r}; expected 'nextn' or None")
        if speculative and self.model.nextn is None:
            raise ValueError("speculative='nextn' needs a model with a NEXTN layer "
                             "(num_nextn_predict_layers >= 1); pass speculative=None")
        check_sampling(temperature, top_p)
        sampling = temperature > 0
        speculative = speculative if not sampling else None   # documented fallback
        ids = self._prompt_ids(prompt)
        self._check_capacity(ids.numel(), max_new_tokens)
        eos = self.model.config.eos_token_id if eos_token_id == -1 else eos_token_id
        stop_ids = set(stop) | ({eos} if eos is not None else set())
        roles = ("draft", "verify", "extend") if speculative else (("decode_logits",) if sampling else ("decode",))
        self.prepare(roles)
        self._reset()
        self.stats = EngineStats()
        t0 = time.perf_counter()
        first = self._prefill(ids, bool(speculative))          # ends in a host read: the GPU is done
        self.stats.prefill_s = time.perf_counter() - t0
        yield first
        if max_new_tokens == 1 or first in stop_ids:
            return
        if sampling:
            yield from self._sample_loop(max_new_tokens - 1, temperature, top_p, seed, stop_ids)
            return
        yield from until(self._relay_loop(roles), max_new_tokens - 1, stop_ids)

    def _prompt_ids(self, prompt: Sequence[int] | torch.Tensor) -> torch.Tensor:
        return prompt_ids(prompt, self.model.config.vocab_size, self.device)

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
        cuda = self.device.type == "cuda"
        if cuda and self._host_ring is None:
            self._host_ring = torch.zeros(RING, self.steps + 2, dtype=torch.int64, pin_memory=True)
            self._copy_stream = torch.cuda.Stream()
        done_events: list = []
        copied: list = []

        def launch(k: int) -> None:
            if cuda and done_events and done_events[-1] is not None:
                self.stats.ahead += int(not done_events[-1].query())
            t0 = time.perf_counter()
            self._launch(roles)
            self.stats.host_s.append(time.perf_counter() - t0)
            self.stats.launched += 1
            if not cuda:
                done_events.append(None)
                copied.append(self.ring[k % RING].clone())
                return
            ev, cev = copy_row_to_host(self.ring, self._host_ring, k % RING, self._copy_stream)
            done_events.append(ev)
            copied.append(cev)

        if cuda and self.check_syncs:
            torch.cuda.set_sync_debug_mode("error")
        try:
            yield from self._steps_loop(launch, copied, cuda)
        finally:
            if cuda and self.check_syncs:
                torch.cuda.set_sync_debug_mode(0)

    def _steps_loop(self, launch, copied, cuda) -> Iterator[int]:
        launch(0)
        k = 0
        while True:
            launch(k + 1)                                       # run ahead: step k may still run
            if cuda:
                copied[k].synchronize()
                row = self._host_ring[k % RING].tolist()
            else:
                row = copied[k].tolist()
            a = row[self.steps + 1]
            self.stats.steps += 1
            self.stats.accepts.append(a)
            for tok in row[:a + 1]:
                yield tok
            k += 1

    def _sample_loop(self, count: int, temperature: float, top_p: float, seed: int,
                     stop_ids: set) -> Iterator[int]:
        gen = torch.Generator(device=self.device).manual_seed(seed)
        step = self._steps["decode_logits"]
        r = self.relay
        for _ in range(count):
            self._refill("decode_logits")
            with torch.no_grad():
                logits = step()
            tok = pick_token(logits, temperature, top_p, gen)
            r.x.copy_(tok.view(1))
            t = int(tok)
            self.stats.steps += 1
            yield t
            if t in stop_ids:
                return
