"""A prompt's prefill as one CUDA-graph replay: the eager chunk captured once per padded size.

Eager prefill is host-bound up to ~8192 tokens: a prompt chunk issues ~2500 kernels at ~40 us of
host time each, so an H200 ran a 1024-token prefill of flash-tp4-rank in 111 ms with the GPU busy
about 30 of them (session 39, `benchmarks/results/README.md`). Here a fresh request's prompt of
L <= the largest bucket runs as a replay of the graph captured for the smallest bucket B >= L:
the prompt's ids go into a static [B] buffer and L into a [1] device tensor; the chunk is padded
after its L real rows (lingc.models.padding says why that changes nothing a real row sees);
the first token's argmax and, for the relay, the NEXTN draft's prefill over the same rows (tokens
shifted by one, the first token at row L - 1) run inside the same graph. So the host's work for a
prompt is a few copies and one launch, whatever its length.

Not captured (eager chunks, `lingc.decoding.reference.greedy_prompt_prefill`): prompts longer than
the largest bucket (GPU-bound there anyway), the CPU. Tensor-parallel ranks (the engine's
`prefill_graphs=True`) capture the same buckets with their collectives inside, as the decode
graphs hold theirs, and agree after each capture: a bucket that failed on any rank runs eagerly
on all of them. The padding costs
GPU time (a 1025-token prompt runs as 2048 rows), which the buckets bound: powers of two up to
1024, then every multiple of 1024, and the cache's own size (or PREFILL_CHUNK) last.

Bits: a padded chunk runs different GEMM shapes than the unpadded one, so its logits and states
agree with the eager prefill's to rounding, not bit for bit (tests/test_prefill_graphs.py); a
prompt whose length is a bucket runs the same shapes. Plain and speculative requests take the
same graphs, so their first tokens agree.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import torch

from lingc.decoding.reference import PREFILL_CHUNK
from lingc.models.cache import Ling3Cache
from lingc.models.layers import PROMPT_KERNEL_MIN_TOKENS
from lingc.models.mla import remember_positions_run
from lingc.models.padding import PromptPadding
from lingc.progress import Progress

from .graphs import CapturedStep, capture_step

__all__ = ["PrefillGraphs", "PrefillOutput", "default_buckets"]

# Power-of-two buckets up to here, multiples of it above.
BUCKET_STEP = 1024


def default_buckets(max_rows: int, largest: int = PREFILL_CHUNK) -> tuple[int, ...]:
    """Bucket sizes for a cache of max_rows rows: 64, 128, .., 1024, then 2048, 3072, .. up to
    `largest`, and min(largest, max_rows) itself when the series stops short of it (a bucket's
    rows are written to the cache, so none passes max_rows; the cache's own size serves every
    prompt that fits it)."""
    cap = min(largest, max_rows)
    sizes, b = [], PROMPT_KERNEL_MIN_TOKENS
    while b <= cap:
        sizes.append(b)
        b = b * 2 if b < BUCKET_STEP else b + BUCKET_STEP
    if sizes and sizes[-1] < cap:
        sizes.append(cap)
    return tuple(sizes)


@dataclass
class PrefillOutput:
    """A prefill's results (what greedy_prompt_prefill returns, and the target's logits)."""
    first: torch.Tensor                   # [] int64: argmax of the last prompt position's logits
    logits: torch.Tensor                  # [vocab] fp32: the target's logits there
    draft: tuple[torch.Tensor, torch.Tensor] | None   # the draft's (logits [vocab], hidden [1, H])
    # The target's hidden state at the last prompt position [1, H] (graphs with the draft): a
    # sampled first token redoes the draft's last row with it (Engine._prefill).
    hidden: torch.Tensor | None = None


@dataclass
class _Bucket:
    rows: int
    ids: torch.Tensor          # [rows] int64: the prompt, then padding ids (0)
    positions: torch.Tensor    # [rows] int64: 0 .. rows - 1
    length: torch.Tensor       # [1] int64: the prompt's length
    first_pad: int             # rows before it are always real: the bucket below's size
    step: CapturedStep | None = None


class PrefillGraphs:
    """Captured prefill of fresh prompts (module docstring) over `cache`, the engine's cache.

    graphs = PrefillGraphs(model, cache, draft=True)
    graphs.prepare()                        # warm up and capture every bucket (a progress bar)
    out = graphs(prompt_ids)                # PrefillOutput: first token, logits, the draft's

    `capture=False` runs each bucket's padded chunk eagerly (the CPU's tests of the same path).
    The outputs are the graph's static tensors: read them before the next call.
    """

    def __init__(self, model, cache: Ling3Cache, draft: bool, buckets: tuple[int, ...] | None = None,
                 capture: bool = True, progress: bool = True, pool=None):
        """pool: a CUDA-graph memory pool to capture into (torch.cuda.graph_pool_handle()), shared
        with other graphs that never run at the same time; a new one by default."""
        if draft and model.nextn is None:
            raise ValueError("PrefillGraphs(draft=True) needs a model with a NEXTN layer")
        buckets = default_buckets(cache.max_len) if buckets is None else tuple(sorted(set(buckets)))
        bad = [b for b in buckets if not PROMPT_KERNEL_MIN_TOKENS <= b <= cache.max_len]
        if bad:
            raise ValueError(f"prefill buckets {bad}: each must be in {PROMPT_KERNEL_MIN_TOKENS}..{cache.max_len} "
                             f"(the prompt kernels' minimum .. the cache's rows)")
        self.model, self.cache, self.draft = model, cache, draft
        self.capture, self.progress = capture, progress
        self.device = model.lm_head.weight.device
        self.buckets = buckets
        self._pool = pool
        self._ready: dict[int, _Bucket] = {}

    def bucket_for(self, n: int) -> int | None:
        """The bucket a prompt of n tokens runs in, or None (longer than every bucket: eager)."""
        return next((b for b in self.buckets if b >= n), None)

    @property
    def captured(self) -> dict[int, bool]:
        """Each prepared bucket: whether it runs as a graph (False: capture failed, or capture=False)."""
        return {b: bk.step.captured for b, bk in self._ready.items()}

    def prepare(self, buckets: tuple[int, ...] | None = None) -> None:
        """Warm up and capture the buckets not yet prepared (all by default). Runs the model, so
        it overwrites the cache: reset it before a request."""
        unknown = sorted(set(buckets or ()) - set(self.buckets))
        if unknown:
            raise ValueError(f"prefill buckets {unknown} are not among this object's buckets {self.buckets}")
        todo = [b for b in (buckets or self.buckets) if b not in self._ready]
        if not todo:
            return
        if self.capture and self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        bar = Progress(len(todo), "lingc capture prefill", enabled=self.progress)
        for b in reversed(todo):              # the largest first: the smaller reuse its pool blocks
            self._prepare(b)
            bar.update()
        bar.close()

    def _prepare(self, rows: int) -> None:
        dev = self.device
        below = [b for b in self.buckets if b < rows]
        bk = _Bucket(rows, torch.zeros(rows, dtype=torch.int64, device=dev), torch.arange(rows, device=dev),
                     torch.full((1,), rows, dtype=torch.int64, device=dev), below[-1] if below else 0)
        fn = lambda: self._run(bk)  # noqa: E731
        with torch.no_grad():
            if self.capture:
                bk.step = capture_step(f"prefill {rows}", fn, self._pool, warmup=1)
            else:
                bk.step = CapturedStep(f"prefill {rows}", fn, None)
        tp = self.model.tp
        if tp.size > 1 and not tp.all_true(bk.step.captured, dev):
            # A rank without the graph falls back to the unpadded eager chunks, whose collectives
            # have other sizes than the padded graph's: every rank must fall back together.
            if bk.step.captured:
                warnings.warn(f"lingc: the prefill {rows} graph was captured on rank {tp.rank} but not on "
                              f"every rank; all ranks prefill such prompts eagerly", stacklevel=3)
            bk.step = CapturedStep(bk.step.role, fn, None, reason=bk.step.reason or "a peer rank's capture failed")
        self._ready[rows] = bk

    def _run(self, bk: _Bucket) -> PrefillOutput:
        """The padded chunk from bk's static inputs."""
        model, cache = self.model, self.cache
        remember_positions_run(bk.positions, 0, bk.rows - 1)        # MLA's layers read no positions
        pad = PromptPadding.of(bk.length, bk.rows, bk.first_pad)
        logits, hidden = model(bk.ids, bk.positions, cache, last_logits_only=True, padding=pad)
        first = logits[-1].argmax(-1)
        if not self.draft:
            return PrefillOutput(first, logits[-1], None)
        # The draft at row p takes token p + 1: the prompt shifted by one, the first token last.
        shifted = bk.ids.roll(-1).index_put((bk.length - 1,), first.view(1))
        dlog, dh = model.draft(shifted, bk.positions, hidden, cache, last_logits_only=True, padding=pad)
        return PrefillOutput(first, logits[-1], (dlog[-1], pad.last_row(dh)), pad.last_row(hidden))

    @torch.no_grad()
    def __call__(self, prompt: torch.Tensor) -> PrefillOutput:
        """Prefill a prompt from position 0 into the cache (a fresh request: reset the cache first)."""
        n = prompt.numel()
        rows = self.bucket_for(n)
        if rows is None:
            raise ValueError(f"a {n}-token prompt is longer than the largest prefill bucket {self.buckets[-1]}: "
                             f"run it eagerly (lingc.decoding.reference.greedy_prompt_prefill)")
        bk = self._ready.get(rows)
        if bk is None:
            raise RuntimeError(f"prefill bucket {rows} is not captured: call prepare(({rows},)) first, then reset "
                               f"the cache (capture runs the model on it)")
        bk.ids[:n].copy_(prompt)
        bk.ids[n:].zero_()
        bk.length.fill_(n)
        return bk.step()
