"""lingc.runtime.relay: the NEXTN speculative relay (draft -> verify -> extend) and plain decode.

- ops.py     the relay's custom ops: the greedy verdict, the state-commit marker that
             stage_commit binds, and the host-refill marker that metadata_capture removes;
- buffers.py the GPU-resident relay buffers carried between graphs and steps;
- steps.py   the step functions, one per role (design.md "Roles");
- graphs.py  CUDA-graph capture of the compiled steps, with the loud fallback;
- prefill_graphs.py  a fresh prompt's prefill as one replay of a graph captured per padded size;
- driver.py  what every relay engine does: compile and capture the roles, then run requests
             (prefill, steps with host run-ahead, sampling);
- engine.py  Engine: Ling-3 on the driver (its cache, NEXTN layer and captured prefill);
- spec_runner.py  SpecRunner: any model written as a target step and a draft step over static
             state on the same relay;
- runner.py  DecodeRunner: the same plain decoding for any model written as a step over static
             state (no relay);
- requests.py what both do with a request on the host: the prompt and sampling checks, the
             stop rule.
"""
from . import ops  # noqa: F401  (registers torch.ops.lingc.* relay ops)
