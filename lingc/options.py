"""LingcOptions: what `torch.compile(model, backend="lingc", options={...})` accepts.

Options come from the `options=` dict and from LINGC_* environment variables (the env var wins
for switches meant for debugging a deployed run: disabling passes, dumps, verification). Unknown
keys or bad values raise with the valid choices named.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from typing import Any

ROLES = ("forward", "decode", "draft", "verify", "extend")
CAPTURES = ("aot", "functionalize")


@dataclass
class LingcOptions:
    # Which step function this graph is (design.md "Roles"); decides which passes run.
    role: str = "forward"
    # Compile what no lingc pass claims with Inductor (True) or run it as plain ATen ops (False).
    inductor: bool = True
    # Write per-graph pass dumps here (also LINGC_DUMP_DIR).
    dump_dir: str | None = None
    # Pass names to skip (also LINGC_DISABLE_PASSES=a,b or =all).
    disable_passes: list[str] = field(default_factory=list)
    # Run the graph before and after every pass on cloned inputs and check the error (LINGC_VERIFY=1).
    verify: bool = False
    # After the first compile of a frame, raise instead of warning when it recompiles.
    fail_on_recompile: bool = False
    # Print the pass summary and kernel table of every compiled graph to stderr.
    print_summary: bool = False
    # lingc.generate / the Engine capture each step graph as a CUDA graph (GPU only).
    cudagraphs: bool = True
    # The engines collect the heap once after compile + capture and freeze what survives
    # (gc.freeze), so no full garbage collection over the compiled graphs' objects stalls the
    # host run-ahead later (runtime/relay/host_gc.py).
    gc_freeze: bool = True
    # Tensor parallel: the graph's all-reduces run on NCCL ("nccl") or as one-shot
    # symmetric-memory kernels ("symm_mem", the symm_allreduce pass; CUDA, no multicast needed).
    allreduce: str = "nccl"
    # How the Dynamo graph becomes the functionalised ATen graph (also LINGC_CAPTURE):
    # "functionalize" (one functionalised trace; inputs that share storage with a mutated input
    # go through AOTAutograd, which handles aliasing) or "aot" (AOTAutograd: a metadata run, then
    # the trace; about twice the time, the same ops, some view nodes in another order).
    capture: str = "functionalize"
    # A recurrent state the model hands back as a new tensor (a cache object re-bound in Python,
    # Hugging Face's cache.recurrent_states[i] = S) is written in place into the tensor it was
    # read from, which the graph returns instead, so its chain runs on lingc.kda_chain. The old
    # state tensor is overwritten: for callers that drop it (Hugging Face's caches do).
    rebound_states_in_place: bool = False

    @classmethod
    def from_user(cls, options: dict[str, Any] | None) -> "LingcOptions":
        options = dict(options or {})
        valid = {f.name: f for f in dataclasses.fields(cls)}
        unknown = sorted(set(options) - set(valid))
        if unknown:
            raise ValueError(f"lingc: unknown option(s) {unknown}; valid options are {sorted(valid)}")
        env = os.environ
        if env.get("LINGC_DUMP_DIR"):
            options.setdefault("dump_dir", env["LINGC_DUMP_DIR"])
        if env.get("LINGC_DISABLE_PASSES"):
            extra = [p.strip() for p in env["LINGC_DISABLE_PASSES"].split(",") if p.strip()]
            options["disable_passes"] = list(options.get("disable_passes", [])) + extra
        if env.get("LINGC_VERIFY", "0") not in ("", "0"):
            options["verify"] = True
        if env.get("LINGC_CAPTURE"):
            options["capture"] = env["LINGC_CAPTURE"]
        if env.get("LINGC_INDUCTOR") in ("0", "1"):
            options["inductor"] = env["LINGC_INDUCTOR"] == "1"
        opts = cls(**options)
        opts.validate()
        return opts

    def validate(self) -> None:
        if self.role not in ROLES:
            raise ValueError(f"lingc: option role={self.role!r}; expected one of {list(ROLES)}")
        for name in ("inductor", "verify", "fail_on_recompile", "print_summary", "cudagraphs",
                     "gc_freeze", "rebound_states_in_place"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"lingc: option {name}={getattr(self, name)!r} must be a bool")
        if self.capture not in CAPTURES:
            raise ValueError(f"lingc: option capture={self.capture!r}; expected one of {list(CAPTURES)}")
        if self.allreduce not in ("nccl", "symm_mem"):
            raise ValueError(f"lingc: option allreduce={self.allreduce!r}; expected 'nccl' or 'symm_mem'")
        if isinstance(self.disable_passes, str):
            self.disable_passes = [self.disable_passes]
        if self.dump_dir is not None and not isinstance(self.dump_dir, (str, os.PathLike)):
            raise ValueError(f"lingc: option dump_dir={self.dump_dir!r} must be a path")
