"""The lingc engine for Ling-3: compile the step functions with their roles, capture them, and generate.

    engine = Engine(model, max_len=4096)            # model: eager, or torch.compile'd (unwrapped)
    tokens = engine.generate(prompt_ids, 256, speculative="nextn")
    for t in engine.stream(prompt_ids, 256): ...

Per request: the cache and relay buffers are reset, the prompt is prefilled, then steps run
(driver.py: the relay loop, host run-ahead, sampling). What is Ling-3's here: its cache
(Ling3Cache), its NEXTN layer as the draft, and the prefill. On CUDA a prompt of up to
PREFILL_CHUNK tokens prefills as one replay of a captured graph padded to its size
(prefill_graphs.py: eager prefill issues ~2500 kernels and is host-bound up to ~8192 tokens;
tensor-parallel ranks capture it, with their collectives inside, with `prefill_graphs=True`);
longer prompts, the CPU, tensor-parallel ranks by default and `prefill_graphs=False` take the
eager model's chunks. Any other model with a draft step runs the same relay on SpecRunner
(spec_runner.py).
"""

from __future__ import annotations

from typing import Sequence

import torch

from lingc.decoding.reference import draft_prefill, prefill
from lingc.models.cache import Ling3Cache

from .driver import MAX_STEPS, EngineStats, RelayDriver  # noqa: F401  (re-exported)
from .prefill_graphs import PrefillGraphs


def _unwrap(model):
    return getattr(model, "_orig_mod", model)


class Engine(RelayDriver):
    """Compiled, captured generation for one Ling-3 model (batch 1)."""

    def __init__(self, model, max_len: int, steps: int = 5, options: dict | None = None,
                 cudagraphs: bool | None = None, progress: bool = True, prefill_graphs: bool | None = None):
        """prefill_graphs: capture the prompt's prefill per padded size (default: with cudagraphs,
        on a single-GPU model; True also on tensor-parallel ranks; prefill_graphs.py)."""
        self.model = _unwrap(model)
        cfg = self.model.config
        device = self.model.lm_head.weight.device
        super().__init__(self.model, Ling3Cache.allocate(cfg, max_len, device=device), steps, cfg.hidden_size,
                         cfg.dtype, device, max_len, options, cudagraphs, progress,
                         vocab_size=cfg.vocab_size, eos_token_id=cfg.eos_token_id,
                         logits_width=cfg.lm_head_size * self.model.tp.size)
        if prefill_graphs and not self.cudagraphs:
            raise ValueError("prefill_graphs=True needs CUDA graphs (CUDA, cudagraphs on; device "
                             f"{self.device}, cudagraphs {self.cudagraphs}); leave it None for the default")
        # Tensor-parallel ranks capture their prefill only when asked (prefill_graphs=True): the
        # path is tested on the CPU and waits for a multi-GPU run before it becomes their default.
        default = self.cudagraphs and self.model.tp.size == 1
        self.use_prefill_graphs = default if prefill_graphs is None else bool(prefill_graphs)
        self._prefill_graphs: dict[bool, PrefillGraphs] = {}     # by draft (speculative requests)
        self._prefill_pool = None

    def _zero_state(self) -> None:
        self.cache.zero_()

    def _check_speculative(self) -> None:
        if self.model.nextn is None:
            raise ValueError("speculative='nextn' needs a model with a NEXTN layer "
                             "(num_nextn_predict_layers >= 1); pass speculative=None")

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

    @torch.no_grad()
    def _prefill(self, prompt: torch.Tensor, speculative: bool, pick=None) -> int:
        graphs = self.prefill_graphs(speculative)
        rows = graphs.bucket_for(prompt.numel()) if graphs is not None else None
        if rows is not None and rows not in graphs.captured:   # its first request: capture (runs the model)
            graphs.prepare((rows,))
            self._reset()
        n = prompt.numel()
        if rows is not None and graphs.captured[rows]:   # a failed capture (it warned): the eager chunks
            out = graphs(prompt)
            first, drafted = out.first, out.draft
            self.stats.prefill_rows = rows
            if pick is not None:
                first = pick(out.logits)
                # The graph's draft took the argmax at the last row: redo that row if the draw differs.
                if speculative and int(first) != int(out.first):
                    drafted = draft_prefill(self.model, self.cache, first.view(1), out.hidden, start=n - 1)
        else:
            logits, hidden = prefill(self.model, self.cache, prompt)
            first = logits.argmax(-1) if pick is None else pick(logits)
            drafted = (draft_prefill(self.model, self.cache, torch.cat([prompt[1:], first.view(1)]), hidden)
                       if speculative else None)
        return self._start_relay(n, first, drafted if speculative else None)
