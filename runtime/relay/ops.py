"""The relay's custom ops (``torch.ops.lingc.*``), which the step functions call and passes key on.

- ``greedy_verdict(Tensor chain, Tensor target) -> Tensor``: chain int64 [S+1] = [x_n, d_1..d_S],
  target int64 [S+1] = the target's argmax at each chain position. Returns the accept count
  ``a`` int64 [1]: the number of leading drafts with d_{j+1} == target[j]. Never syncs: on CUDA
  one one-warp Triton kernel (runtime/kernels/greedy_verdict), elsewhere a cumulative product
  of the matches (``greedy_verdict_reference``).
- ``greedy_emit(Tensor chain, Tensor target, Tensor accept) -> Tensor``: the tokens a verify step
  emits, int64 [S+1]: d_{j+1} for j < a, then target[a] (the correction, or the bonus token when
  every draft was accepted) in every later row. On CUDA one Triton kernel, elsewhere
  ``greedy_emit_reference``.
- ``greedy_verdict_out(chain, target, Tensor(a!) out)``, ``greedy_emit_out(chain, target, accept,
  Tensor(a!) out)``: the same two, written into ``out`` (contiguous, the result's shape). Step
  functions do not call them: pdl_glue.direct_lingc_writes emits them for a verdict or an emit
  whose value the graph copies into a relay buffer at its end (one copy kernel, and a full edge
  of the captured graph, each).
- ``sampled_targets(Tensor chain, Tensor logits, Tensor uniforms, Tensor step, Tensor temperature,
  Tensor? top_p, Tensor? draft_logits=None) -> Tensor``: a sampling request's verify outcome (runtime/relay/sampling.py),
  written as the target tokens y int64 [S+1] that greedy_verdict and greedy_emit read. chain int64
  [S+1] (S >= 0: S = 0 is plain sampling's draw), logits [S+1, V] (unit stride along V), the
  request's uniforms fp32 [R, W >= S+1] in [0, 1) of which row step % R is this step's (step int64
  [1], the relay's ring_k: selecting the row in the kernel saves the graph two ATen kernels),
  temperature > 0 and top_p fp32 [1] on the device (None: no nucleus, known when the graph is
  built: one launch instead of four); draft_logits [S, V] (unit stride along V) when the drafts
  were drawn from the draft's own distribution at the same temperature and top_p (sampled
  drafts; q is recomputed from them, its nucleus searched beside p's), None for greedy drafts. Never
  syncs: on CUDA four PDL-launched Triton passes (runtime/kernels/sampled_targets: the nucleus by
  a radix search over the logits, no sort; a fifth draws from the residual of sampled drafts),
  elsewhere ``sampling.sampled_targets``.
- ``sampled_targets_out(..., Tensor? top_p, Tensor(a!) out, Tensor? draft_logits=None)``: the same,
  written into ``out`` (contiguous int64 [S+1]). pdl_glue.drawn_token_writes emits it where a graph
  copies the op's value into a relay buffer after its relay tail (extend_sample's drawn seed).
- ``state_commit(Tensor accept) -> Tensor``: the commit point of a verify step. On its own it is
  the identity on ``accept`` and commits nothing: the model's recurrent-state writes have already
  stored the state after ALL chain positions, which is wrong whenever a draft is rejected. The
  stage_commit pass binds it: every recurrent-state write of the graph is staged per chain
  position and this op's ``accept`` picks the position that is written back (design.md).
- ``host_refill(Tensor host_buffer, Tensor device_value, str what) -> Tensor``: a step input that
  the naive driver refills from the host before every step (``what`` names it: "positions",
  "tokens", ...). Eagerly it returns ``host_buffer`` (what the host wrote). ``device_value`` is
  the same quantity computed on the device from relay buffers; metadata_capture replaces the op
  by it, after which the graph no longer reads the host buffer and no host value is needed to
  launch the step.
"""
from __future__ import annotations

import torch

from lingc.runtime.registry import register_op

from .sampling import sampled_targets as sampled_targets_reference

__all__ = ["greedy_verdict", "greedy_emit", "greedy_verdict_out", "greedy_emit_out", "state_commit", "host_refill",
           "greedy_verdict_reference", "greedy_emit_reference", "sampled_targets", "sampled_targets_out",
           "sampled_targets_reference",
           "step_uniforms"]


def greedy_verdict_reference(chain: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """The accept count as plain tensor ops (the op's implementation off CUDA)."""
    match = (chain[1:] == target[:-1]).to(torch.int64)                 # d_{j+1} == y_j
    return match.cumprod(0).sum(0, keepdim=True)


def greedy_emit_reference(chain: torch.Tensor, target: torch.Tensor, accept: torch.Tensor) -> torch.Tensor:
    """The emitted tokens as plain tensor ops (the op's implementation off CUDA)."""
    idx = torch.arange(chain.shape[0], device=chain.device)
    drafts = torch.cat([chain[1:], chain[:1]])
    return torch.where(idx < accept, drafts, target.gather(0, accept))


def _check_verdict(chain: torch.Tensor, target: torch.Tensor) -> None:
    if chain.dim() != 1 or target.dim() != 1 or chain.shape != target.shape:
        raise ValueError(f"greedy_verdict: chain and target must both be [S+1], got "
                         f"{tuple(chain.shape)} and {tuple(target.shape)}")
    if chain.shape[0] < 2:
        raise ValueError(f"greedy_verdict: the chain needs at least one draft token, got length "
                         f"{chain.shape[0]}")
    if chain.dtype != torch.int64 or target.dtype != torch.int64:
        raise ValueError(f"greedy_verdict: chain and target must be int64, got {chain.dtype} and "
                         f"{target.dtype}")


def _greedy_verdict(chain, target):
    _check_verdict(chain, target)
    if chain.is_cuda:
        from lingc.runtime.kernels.greedy_verdict.kernel import greedy_verdict_triton

        return greedy_verdict_triton(chain, target)
    return greedy_verdict_reference(chain, target)


def _check_emit(chain, target, accept) -> None:
    _check_verdict(chain, target)
    if accept.shape != (1,) or accept.dtype != torch.int64:
        raise ValueError(f"greedy_emit: accept must be the verdict's int64 [1], got {tuple(accept.shape)} "
                         f"{accept.dtype}")
    if accept.device != chain.device or target.device != chain.device:
        raise ValueError(f"greedy_emit: chain ({chain.device}), target ({target.device}) and accept "
                         f"({accept.device}) must be on one device")


def _greedy_emit(chain, target, accept):
    _check_emit(chain, target, accept)
    if chain.is_cuda:
        from lingc.runtime.kernels.greedy_verdict.kernel import greedy_emit_triton

        return greedy_emit_triton(chain, target, accept)
    return greedy_emit_reference(chain, target, accept)


def _greedy_emit_fake(chain, target, accept):
    _check_emit(chain, target, accept)
    return chain.new_empty(chain.shape)


def _greedy_verdict_fake(chain, target):
    _check_verdict(chain, target)
    return chain.new_empty((1,), dtype=torch.int64)


def _check_out(op: str, out: torch.Tensor, like: torch.Tensor) -> None:
    if out.shape != like.shape or out.dtype != like.dtype or not out.is_contiguous() or out.device != like.device:
        raise ValueError(f"{op}: out must be contiguous {like.dtype} {tuple(like.shape)} on {like.device}, got "
                         f"{out.dtype} {tuple(out.shape)} strides {out.stride()} on {out.device}")


def _greedy_verdict_out(chain, target, out) -> None:
    _check_verdict(chain, target)
    _check_out("greedy_verdict_out", out, chain.new_empty((1,)))
    if chain.is_cuda:
        from lingc.runtime.kernels.greedy_verdict.kernel import greedy_verdict_triton

        greedy_verdict_triton(chain, target, out=out)
        return
    out.copy_(greedy_verdict_reference(chain, target))


def _greedy_verdict_out_fake(chain, target, out) -> None:
    _check_verdict(chain, target)
    _check_out("greedy_verdict_out", out, chain.new_empty((1,)))


def _greedy_emit_out(chain, target, accept, out) -> None:
    _check_emit(chain, target, accept)
    _check_out("greedy_emit_out", out, chain)
    if chain.is_cuda:
        from lingc.runtime.kernels.greedy_verdict.kernel import greedy_emit_triton

        greedy_emit_triton(chain, target, accept, out=out)
        return
    out.copy_(greedy_emit_reference(chain, target, accept))


def _greedy_emit_out_fake(chain, target, accept, out) -> None:
    _check_emit(chain, target, accept)
    _check_out("greedy_emit_out", out, chain)


def _check_sampled_targets(chain, logits, uniforms, step, temperature, top_p, draft_logits=None) -> None:
    from lingc.runtime.kernels.sampled_targets.kernel import MAX_ROWS

    op = "sampled_targets"
    if chain.dim() != 1 or chain.dtype != torch.int64 or not 1 <= chain.shape[0] <= MAX_ROWS:
        raise ValueError(f"{op}: chain must be int64 [S+1] with 1 <= S+1 <= {MAX_ROWS}, got {chain.dtype} "
                         f"{tuple(chain.shape)}")
    n = chain.shape[0]
    if logits.dim() != 2 or logits.shape[0] != n or not logits.is_floating_point() or logits.stride(1) != 1:
        raise ValueError(f"{op}: logits must be floating [S+1, V] = [{n}, V] with unit stride along V, got "
                         f"{logits.dtype} {tuple(logits.shape)} strides {logits.stride()}")
    if uniforms.dim() != 2 or uniforms.shape[1] < n or uniforms.dtype != torch.float32 or uniforms.stride(1) != 1:
        raise ValueError(f"{op}: uniforms must be fp32 [R, W >= {n}] (a row per step, a uniform per chain "
                         f"position) with unit stride along W, got {uniforms.dtype} {tuple(uniforms.shape)} "
                         f"strides {uniforms.stride()}")
    if step.shape != (1,) or step.dtype != torch.int64:
        raise ValueError(f"{op}: step must be the int64 [1] step counter, got {step.dtype} {tuple(step.shape)}")
    for name, t in (("temperature", temperature), ("top_p", top_p)):
        if t is not None and (t.shape != (1,) or t.dtype != torch.float32):
            raise ValueError(f"{op}: {name} must be a fp32 [1] device tensor, got {t.dtype} {tuple(t.shape)}")
    if draft_logits is not None and (draft_logits.dim() != 2 or tuple(draft_logits.shape) != (n - 1, logits.shape[1])
                                     or not draft_logits.is_floating_point() or draft_logits.stride(1) != 1):
        raise ValueError(f"{op}: draft_logits must be floating [S, V] = [{n - 1}, {logits.shape[1]}] with unit stride "
                         f"along V (row j: the draft's logits d_(j+1) was drawn from), got {draft_logits.dtype} "
                         f"{tuple(draft_logits.shape)} strides {draft_logits.stride()}")
    for name, t in (("logits", logits), ("uniforms", uniforms), ("step", step), ("temperature", temperature),
                    ("top_p", top_p), ("draft_logits", draft_logits)):
        if t is not None and t.device != chain.device:
            raise ValueError(f"{op}: {name} is on {t.device} but chain is on {chain.device}")


def step_uniforms(uniforms: torch.Tensor, step: torch.Tensor, n: int) -> torch.Tensor:
    """Row step % R of uniforms [R, W], its first n entries: a step's uniforms."""
    return uniforms.index_select(0, step % uniforms.shape[0])[0, :n]


def _sampled_targets(chain, logits, uniforms, step, temperature, top_p, draft_logits=None):
    _check_sampled_targets(chain, logits, uniforms, step, temperature, top_p, draft_logits)
    if chain.is_cuda:
        from lingc.runtime.kernels.sampled_targets.kernel import sampled_targets_triton

        return sampled_targets_triton(chain, logits, uniforms, step, temperature, top_p, draft_logits=draft_logits)
    return sampled_targets_reference(chain, logits, step_uniforms(uniforms, step, chain.shape[0]), temperature, top_p,
                                     draft_logits)


def _sampled_targets_fake(chain, logits, uniforms, step, temperature, top_p, draft_logits=None):
    _check_sampled_targets(chain, logits, uniforms, step, temperature, top_p, draft_logits)
    return chain.new_empty(chain.shape)


def _sampled_targets_out(chain, logits, uniforms, step, temperature, top_p, out, draft_logits=None) -> None:
    _sampled_targets_out_fake(chain, logits, uniforms, step, temperature, top_p, out, draft_logits)
    if chain.is_cuda:
        from lingc.runtime.kernels.sampled_targets.kernel import sampled_targets_triton

        sampled_targets_triton(chain, logits, uniforms, step, temperature, top_p, out=out, draft_logits=draft_logits)
    else:
        out.copy_(_sampled_targets(chain, logits, uniforms, step, temperature, top_p, draft_logits))


def _sampled_targets_out_fake(chain, logits, uniforms, step, temperature, top_p, out, draft_logits=None) -> None:
    _check_sampled_targets(chain, logits, uniforms, step, temperature, top_p, draft_logits)
    _check_out("sampled_targets_out", out, chain)


def _state_commit(accept):
    return accept.clone()


def _state_commit_fake(accept):
    return accept.new_empty(accept.shape)


def _host_refill(host_buffer, device_value, what):
    if host_buffer.shape != device_value.shape or host_buffer.dtype != device_value.dtype:
        raise ValueError(f"host_refill({what!r}): the host buffer {tuple(host_buffer.shape)} "
                         f"{host_buffer.dtype} and its device formula {tuple(device_value.shape)} "
                         f"{device_value.dtype} must agree in shape and dtype")
    return host_buffer.clone()


def _host_refill_fake(host_buffer, device_value, what):
    return _host_refill(host_buffer, device_value, what)


greedy_verdict = register_op("greedy_verdict", _greedy_verdict, _greedy_verdict_fake,
                             schema="(Tensor chain, Tensor target) -> Tensor")
greedy_emit = register_op("greedy_emit", _greedy_emit, _greedy_emit_fake,
                          schema="(Tensor chain, Tensor target, Tensor accept) -> Tensor")
greedy_verdict_out = register_op("greedy_verdict_out", _greedy_verdict_out, _greedy_verdict_out_fake,
                                 mutates_args=("out",), schema="(Tensor chain, Tensor target, Tensor(a!) out) -> ()")
greedy_emit_out = register_op("greedy_emit_out", _greedy_emit_out, _greedy_emit_out_fake, mutates_args=("out",),
                              schema="(Tensor chain, Tensor target, Tensor accept, Tensor(a!) out) -> ()")
state_commit = register_op("state_commit", _state_commit, _state_commit_fake, schema="(Tensor accept) -> Tensor")
host_refill = register_op("host_refill", _host_refill, _host_refill_fake,
                          schema="(Tensor host_buffer, Tensor device_value, str what) -> Tensor")
sampled_targets = register_op("sampled_targets", _sampled_targets, _sampled_targets_fake,
                              schema="(Tensor chain, Tensor logits, Tensor uniforms, Tensor step, Tensor temperature, "
                                     "Tensor? top_p, Tensor? draft_logits=None) -> Tensor")
sampled_targets_out = register_op("sampled_targets_out", _sampled_targets_out, _sampled_targets_out_fake,
                                  mutates_args=("out",),
                                  schema="(Tensor chain, Tensor logits, Tensor uniforms, Tensor step, "
                                         "Tensor temperature, Tensor? top_p, Tensor(a!) out, "
                                         "Tensor? draft_logits=None) -> ()")
