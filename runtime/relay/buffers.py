"""RelayBuffers: the GPU-resident values the relay carries between graphs and between steps.

Everything a step needs that depends on what was accepted lives here, on the device, so the
host can launch step k+1 without knowing step k's outcome (design.md "Data flow" 4). The
tensors are allocated once per engine and never reallocated: the CUDA graphs read and write
them in place.

Conventions (those of lingc.decoding.reference): the target has processed positions < n; x is
x_n, the last decided token; seed is the draft's guess d_1 for position n+1 and dh the draft
hidden it continues from. A step with S drafts emits ``emitted[:accept + 1]`` = d_1..d_a, y_a.

The token ring carries those tokens to the host: the last graph of a step (extend, or decode)
appends the row [emitted..., accept] at slot ring_k % RING and advances ring_k; the host copies
slot k % RING on a side stream and reads it one step late (run_ahead.py).
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch

RING = 4                   # device->host token ring slots (the host reads one step late)


@dataclass
class RelayBuffers:
    n: torch.Tensor             # int64 [1]   chain start position (tokens the target has processed)
    x: torch.Tensor             # int64 [1]   x_n, the chain's first token
    seed: torch.Tensor          # int64 [1]   d_1
    dh: torch.Tensor            # [1, H]      draft hidden the draft chain continues from
    chain: torch.Tensor         # int64 [S+1] [x_n, d_1..d_S]
    accept: torch.Tensor        # int64 [1]   drafts accepted by the last verify
    emitted: torch.Tensor       # int64 [S+1] d_1..d_a, y_a, then padding
    vhid: torch.Tensor          # [S+1, H]    the target's hidden states of the last chain
    ring: torch.Tensor          # int64 [RING, S+2] token ring: row k % RING = [emitted, accept] of step k
    ring_k: torch.Tensor        # int64 [1]   the next ring row to write (steps appended so far)
    # Host-refill buffers of the naive step functions (unused once metadata_capture fires).
    pos_draft: torch.Tensor     # int64 [S-1]
    pos_chain: torch.Tensor     # int64 [S+1]
    # Speculative sampling (the verify_sample role, sampling.py): step k's uniforms are row
    # ring_k % rows, drawn per request from its generator; the request's temperature and top_p.
    uniforms: torch.Tensor      # fp32 [rows, S+1]
    temperature: torch.Tensor   # fp32 [1]
    top_p: torch.Tensor         # fp32 [1]
    # Sampled drafts (draft_sample, verify_sample_q, extend_sample; sampling.py): row j of
    # draft_logits is the draft's logits d_{j+1} was drawn from (row 0 written by the previous
    # step's extend, or the prefill), verify's q. Step k draws d_1 of step k + 1 (extend) with
    # draft_uniforms[k % rows, 0] and its own d_{j+1} (draft) with column j, from its softmax cut
    # to the request's nucleus (top_p), as verify recomputes q.
    draft_logits: torch.Tensor      # fp32 [S, V]
    draft_uniforms: torch.Tensor    # fp32 [rows, S]

    @classmethod
    def allocate(cls, steps: int, hidden: int, dtype: torch.dtype, device, rows: int = 1,
                 vocab: int = 1) -> "RelayBuffers":
        """rows: the steps a sampled request may take before its uniforms would repeat (the
        engines pass their max_len: every step advances at least one position); vocab: the
        width of the model's logits (sampled drafts keep the draft's)."""
        i64 = dict(dtype=torch.int64, device=device)
        f32 = dict(dtype=torch.float32, device=device)
        return cls(
            n=torch.zeros(1, **i64), x=torch.zeros(1, **i64), seed=torch.zeros(1, **i64),
            dh=torch.zeros(1, hidden, dtype=dtype, device=device),
            chain=torch.zeros(steps + 1, **i64), accept=torch.zeros(1, **i64),
            emitted=torch.zeros(steps + 1, **i64),
            vhid=torch.zeros(steps + 1, hidden, dtype=dtype, device=device),
            ring=torch.zeros(RING, steps + 2, **i64), ring_k=torch.zeros(1, **i64),
            pos_draft=torch.zeros(max(steps - 1, 1), **i64), pos_chain=torch.zeros(steps + 1, **i64),
            uniforms=torch.zeros(rows, steps + 1, **f32), temperature=torch.ones(1, **f32),
            top_p=torch.ones(1, **f32), draft_logits=torch.zeros(steps, vocab, **f32),
            draft_uniforms=torch.zeros(rows, steps, **f32),
        )

    def tensors(self) -> list[torch.Tensor]:
        return [getattr(self, f.name) for f in fields(self)]

    def zero_(self) -> "RelayBuffers":
        for t in self.tensors():
            t.zero_()
        self.temperature.fill_(1.0)             # a sampled step run before a request arms it stays finite
        self.top_p.fill_(1.0)
        return self
