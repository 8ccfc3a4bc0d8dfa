"""The fused KDA chain and its commit as opaque custom ops.

- ``torch.ops.lingc.kda_chain(q_raw, k_raw, v_raw, f_raw, b_raw, conv_w, conv_window, a_log,
  dt_bias, state, lower_bound, stage_states, stage_windows, state_ready=False, state_vk=False)
  -> o [T, H, V] fp32``
  lower_bound: the bounded gate's bound (Ling-3: -5.0), or None for the unbounded softplus gate
  (Kimi Linear's; lingc.models.kda_math.kda_gate). f_raw [T, H*K] with dt_bias [H*K] is KDA's
  gate, one per channel; f_raw [T, H] with dt_bias [H] is Gated DeltaNet's, one per head (the
  same decay for the head's K channels; the kernel's GATE_PER_HEAD).
  conv_w is the list of the q, k, v depthwise conv weights [H*K, W], each read in place (a
  stacked copy would be one more kernel per layer and step).
  Each of q_raw, k_raw, v_raw, f_raw and b_raw may instead be a head-grouped [T, A, B] view (unit
  stride along B, any token / group strides), read as its row-major [T, A * B]: Qwen3-Next's q, k,
  v, b and a are such views of its fused projections' outputs, grouped per q/k head, so the
  model's copies of them into [T, N] rows go.
  Grouped heads (Qwen3-Next's Gated DeltaNet): q_raw, k_raw [T, HK*K] and their conv weights
  [HK*K, W], HK dividing H, each q/k head serving H / HK consecutive value heads; conv_window is
  then the fused convolution's cache [2*HK*K + H*V, W-1] (q, k, v channels in that order; the
  three conv weights may be row slices of its one weight, read in place). With HK == H either
  window shape is taken. A flat window may hold W columns a channel instead of W-1 (Hugging
  Face's and fla's caches: the oldest input is kept, shifted out before any output reads it).
  One slot's KDA core over T = 1..16 tokens (designed for the decode T=1 and the verify chain
  T <= 8). Persistent mode (stage_states is None): state and conv_window are updated in place.
  Staged mode (verify): state and conv_window are left untouched; stage_states[j] [H, K, V] and
  stage_windows[j] [*conv_window.shape] get position j's post-state and post-window. The stage buffers
  may have more than T positions (a pass can allocate them for the longest chain); positions
  >= T are not written. ``state_ready``: the caller (pdl_swap) vouches that the state and window
  were last written before this graph, so on CUDA they are read before the PDL wait
  (kernel.py, "PDL"); no effect on the values. ``state_vk``: state and stage_states hold each
  head's state transposed, [H, V, K] (a model that stores it so: read and written in place, no
  transposed copy). V may differ from K (flash-linear-attention's expand_v: V = 2K) with a flat
  window [2*HK*K + H*V, W-1 or W]: v_raw [T, H*V], conv_w[2] [H*V, W], o [T, H, V]; the
  [3, H*K, W-1] window stacks equal blocks, so it needs HK == H and K == V.
  ``k_window`` / ``v_window`` (flash-linear-attention's layers: q, k and v convolved into caches
  of their own): conv_window is q's cache [HK*K, W-1 or W], k_window [HK*K, .] and v_window
  [H*V, .] the others, each read and written in place; stage_windows stay one flat
  [>= T, 2*HK*K + H*V, .] block, and ``kda_commit(..., k_window=, v_window=)`` writes a stage's
  blocks back into the three.
- ``torch.ops.lingc.kda_commit(state, conv_window, stage_states, stage_windows, index) -> None``
  Copies stage position ``index`` (a 0-d or [1] integer tensor on the state's device, e.g. the
  in-graph verdict's accept count) into state and conv_window, in place, without a host sync.
- ``torch.ops.lingc.kda_commit_many(states, conv_windows, stage_states, stage_windows, index)``
  The same for a list of layers of one shape (lists of equal length), in one launch per
  COMMIT_GROUP layers: pdl_swap merges a verify graph's per-layer commits into it.

The pdl_swap and stage_commit passes emit these; they must trace (fake impls), run on the CPU (the
references in naive.py: the CPU path stays a first-class, batch-invariant target) and on CUDA (the
Triton kernels of kernel.py, PDL-launched on Hopper). They are ``torch.library.custom_op``s rather
than ``triton_op``s for the reason given in swiglu_gemm/op.py: an opaque op keeps lingc's own PDL
launch. Mutations are declared (``mutates_args``) so functionalisation sees the cache writes.
"""
from __future__ import annotations

import math
from typing import Optional

import torch

from lingc.runtime.registry import register_op

from .naive import kda_chain_reference, kda_commit_reference

__all__ = ["kda_chain", "kda_commit", "kda_commit_many", "check_kda_chain_args", "check_kda_commit_args",
           "check_kda_commit_many_args", "MAX_T", "CONV_WIDTH"]

MAX_T = 16          # lingc.models.kda.RECURRENT_MAX_T: longer inputs take the chunked form
CONV_WIDTH = 4      # the kernel keeps the W-1 = 3 window columns in registers
_PROJ_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def _shape(t: torch.Tensor) -> tuple:
    return tuple(t.shape)


def _rows(op: str, name: str, x: torch.Tensor) -> tuple:
    """A per-token input's [T, N] shape: x itself, or a head-grouped [T, A, B] view read as its
    row-major [T, A * B] (unit stride along B, any token / group strides)."""
    if x.dim() == 3:
        if x.stride(2) != 1 and x.shape[2] > 1:
            raise ValueError(f"{op}: {name} as [T, groups, channels] {_shape(x)} must have unit stride along its "
                             f"last dim, got strides {x.stride()}")
        return (x.shape[0], x.shape[1] * x.shape[2])
    return _shape(x)


def flat_inputs(*xs: torch.Tensor) -> list[torch.Tensor]:
    """The per-token inputs as [T, N] (a head-grouped [T, A, B] view reshaped: the reference's
    form)."""
    return [x.reshape(x.shape[0], -1) if x.dim() == 3 else x for x in xs]


def head_dims(state: torch.Tensor, state_vk: bool = False) -> tuple[int, int, int]:
    """(H, K, V) of a state stored [H, K, V], or [H, V, K] with ``state_vk``."""
    H, a, b = state.shape
    return (H, b, a) if state_vk else (H, a, b)


def _flat_window(conv_window, k_window, v_window):
    """The window as one [C, W'] block: conv_window itself, or q's, k's and v's caches stacked."""
    return conv_window if k_window is None else torch.cat([conv_window, k_window, v_window], 0)


def _check_split_windows(op, conv_window, k_window, v_window, dqk, DV, q_raw) -> None:
    """Three caches of their own (flash-linear-attention's layers): conv_window q's [HK*K, W'],
    k_window [HK*K, W'] and v_window [H*V, W'], W' = W-1 or W."""
    if (k_window is None) != (v_window is None):
        raise ValueError(f"{op}: k_window and v_window go together (the k and v caches of a layer with three); "
                         f"got k_window={'None' if k_window is None else 'tensor'}, "
                         f"v_window={'None' if v_window is None else 'tensor'}")
    cols = conv_window.shape[-1] if conv_window.dim() == 2 else -1
    for name, x, rows in (("conv_window", conv_window, dqk), ("k_window", k_window, dqk), ("v_window", v_window, DV)):
        if _shape(x) != (rows, cols) or cols not in (CONV_WIDTH - 1, CONV_WIDTH):
            raise ValueError(f"{op}: with k_window and v_window, {name} must be [{rows}, W-1 or W] "
                             f"(conv_window q's cache) with conv_window's columns, got {_shape(x)}")
        if x.dtype != q_raw.dtype or not x.is_contiguous() or x.device != q_raw.device:
            raise ValueError(f"{op}: {name} must be contiguous, of q_raw's dtype and device, got {x.dtype} "
                             f"strides {x.stride()} on {x.device}")


def check_kda_chain_args(q_raw, k_raw, v_raw, f_raw, b_raw, conv_w, conv_window, a_log, dt_bias,
                         state, lower_bound, stage_states, stage_windows, state_vk=False,
                         k_window=None, v_window=None) -> None:
    """Raise ValueError naming the bad argument of ``kda_chain``."""
    op = "kda_chain"
    layout = "[H, V, K]" if state_vk else "[H, K, V]"
    if state.dim() != 3 or state.dtype != torch.float32:
        raise ValueError(f"{op}: state must be {layout} float32, got {_shape(state)} {state.dtype}")
    H, K, V = head_dims(state, state_vk)
    if not state.is_contiguous():
        raise ValueError(f"{op}: state must be contiguous (it is updated in place), got strides {state.stride()}")
    D = H * K
    DV = H * V
    if q_raw.dim() not in (2, 3):
        raise ValueError(f"{op}: q_raw must be [T, H*K] (or a head-grouped [T, HK, K] view), got {_shape(q_raw)}")
    flat = {name: _rows(op, name, x) for name, x in
            (("q_raw", q_raw), ("k_raw", k_raw), ("v_raw", v_raw), ("f_raw", f_raw), ("b_raw", b_raw))}
    T = q_raw.shape[0]
    if not 1 <= T <= MAX_T:
        raise ValueError(f"{op}: T = {T} tokens, must be in 1..{MAX_T}")
    if q_raw.dtype not in _PROJ_DTYPES:
        raise ValueError(f"{op}: q_raw.dtype must be bfloat16, float16 or float32, got {q_raw.dtype}")
    # Grouped heads: q and k may have HK heads, each serving H / HK value heads.
    dqk = flat["q_raw"][1]
    if dqk % K or not dqk or H % (dqk // K):
        raise ValueError(f"{op}: q_raw must be [T, HK*K] with HK dividing H = {H} (K = {K}: q/k heads "
                         f"serving H / HK value heads each), got {_shape(q_raw)}")
    for name, x, want in (("q_raw", q_raw, (T, dqk)), ("k_raw", k_raw, (T, dqk)), ("v_raw", v_raw, (T, DV))):
        if flat[name] != want:
            raise ValueError(f"{op}: {name} must be [T, {'HK*K' if name != 'v_raw' else 'H*V'}] = {want}, got "
                             f"{_shape(x)} (a head-grouped [T, A, B] view of those rows is taken too)")
    if flat["f_raw"] not in ((T, D), (T, H)):
        raise ValueError(f"{op}: f_raw must be [T, H*K] = {(T, D)} (a gate per channel, KDA) or [T, H] = {(T, H)} "
                         f"(one per head, Gated DeltaNet), got {_shape(f_raw)}")
    for name, x in (("k_raw", k_raw), ("v_raw", v_raw)):
        if x.dtype != q_raw.dtype:
            raise ValueError(f"{op}: {name}.dtype {x.dtype} differs from q_raw.dtype {q_raw.dtype}")
    if flat["b_raw"] != (T, H):
        raise ValueError(f"{op}: b_raw must be [T, H] = {(T, H)}, got {_shape(b_raw)} (a head-grouped [T, A, B] "
                         f"view of those rows is taken too)")
    for name, x in (("f_raw", f_raw), ("b_raw", b_raw)):
        if not x.is_floating_point():
            raise ValueError(f"{op}: {name} must be floating point, got {x.dtype}")
    if not isinstance(conv_w, (list, tuple)) or len(conv_w) != 3:
        raise ValueError(f"{op}: conv_w must be a list of the 3 (q, k, v) conv weights [H*K, W], got "
                         f"{type(conv_w).__name__} {_shape(conv_w) if torch.is_tensor(conv_w) else len(conv_w)}")
    for i, (w, rows) in enumerate(zip(conv_w, (dqk, dqk, DV))):
        if w.dim() != 2 or w.shape[0] != rows or w.shape[1] != conv_w[0].shape[-1]:
            raise ValueError(f"{op}: conv_w[{i}] must be [{('HK*K', 'HK*K', 'H*V')[i]}, W] = [{rows}, W] "
                             f"with conv_w[0]'s W, got {_shape(w)}")
        if not w.is_contiguous() or w.dtype not in _PROJ_DTYPES:
            raise ValueError(f"{op}: conv_w[{i}] must be contiguous float32, bfloat16 or float16, got {w.dtype} "
                             f"strides {w.stride()}")
    W = conv_w[0].shape[1]
    if W != CONV_WIDTH:
        raise ValueError(f"{op}: conv kernel width W = {W}, the kernel supports W = {CONV_WIDTH}")
    if k_window is not None or v_window is not None:
        _check_split_windows(op, conv_window, k_window, v_window, dqk, DV, q_raw)
        conv_window = conv_window.new_empty((2 * dqk + DV, conv_window.shape[-1]))   # the flat block's shape
    windows = ((2 * dqk + DV, W - 1), (2 * dqk + DV, W)) + (((3, D, W - 1),) if dqk == D == DV else ())
    if _shape(conv_window) not in windows:
        raise ValueError(f"{op}: conv_window must be "
                         f"{' or '.join(map(str, windows[::-1]))} (the q, k and v channels' last W-1 inputs, "
                         f"or W with the oldest kept as Hugging Face's cache keeps it), got {_shape(conv_window)}")
    if conv_window.dtype != q_raw.dtype:
        raise ValueError(f"{op}: conv_window.dtype {conv_window.dtype} differs from q_raw.dtype {q_raw.dtype}")
    if not conv_window.is_contiguous():
        raise ValueError(f"{op}: conv_window must be contiguous, got strides {conv_window.stride()}")
    if _shape(a_log) != (H,):
        raise ValueError(f"{op}: a_log must be [H] = {(H,)}, got {_shape(a_log)}")
    n_f = flat["f_raw"][1]
    if _shape(dt_bias) != (n_f,):
        raise ValueError(f"{op}: dt_bias must be [{'H*K' if n_f == D else 'H'}] = "
                         f"{(n_f,)} like f_raw's last dim, got {_shape(dt_bias)}")
    if lower_bound is not None and not (isinstance(lower_bound, (int, float)) and math.isfinite(lower_bound)
                                        and lower_bound < 0):
        raise ValueError(f"{op}: lower_bound must be a finite negative number (the bounded gate) or None "
                         f"(-exp(A_log) * softplus(f + dt_bias)), got {lower_bound}")
    if (stage_states is None) != (stage_windows is None):
        raise ValueError(f"{op}: stage_states and stage_windows must both be given (verify) or both "
                         f"be None (decode); got stage_states={'None' if stage_states is None else 'tensor'}, "
                         f"stage_windows={'None' if stage_windows is None else 'tensor'}")
    if stage_states is not None:
        if (stage_states.dim() != 4 or stage_states.shape[1:] != state.shape
                or stage_states.shape[0] < T or stage_states.dtype != torch.float32):
            raise ValueError(f"{op}: stage_states must be [>= T, *state.shape] = "
                             f"[>= {T}, {', '.join(map(str, state.shape))}] float32, "
                             f"got {_shape(stage_states)} {stage_states.dtype}")
        if (stage_windows.dim() != conv_window.dim() + 1 or stage_windows.shape[1:] != conv_window.shape
                or stage_windows.shape[0] < T or stage_windows.dtype != conv_window.dtype):
            raise ValueError(f"{op}: stage_windows must be [>= T, *conv_window.shape] = "
                             f"[>= {T}, {', '.join(map(str, conv_window.shape))}] {conv_window.dtype}, "
                             f"got {_shape(stage_windows)} {stage_windows.dtype}")
        for name, x in (("stage_states", stage_states), ("stage_windows", stage_windows)):
            if not x.is_contiguous():
                raise ValueError(f"{op}: {name} must be contiguous, got strides {x.stride()}")
    tensors = {"q_raw": q_raw, "k_raw": k_raw, "v_raw": v_raw, "f_raw": f_raw, "b_raw": b_raw,
               "conv_w[0]": conv_w[0], "conv_w[1]": conv_w[1], "conv_w[2]": conv_w[2],
               "conv_window": conv_window, "a_log": a_log, "dt_bias": dt_bias,
               "stage_states": stage_states, "stage_windows": stage_windows}
    for name, x in tensors.items():
        if x is not None and x.device != state.device:
            raise ValueError(f"{op}: {name} is on {x.device} but state is on {state.device}")


def check_kda_commit_args(state, conv_window, stage_states, stage_windows, index, k_window=None,
                          v_window=None) -> None:
    """Raise ValueError naming the bad argument of ``kda_commit``."""
    op = "kda_commit"
    if (k_window is None) != (v_window is None):
        raise ValueError(f"{op}: k_window and v_window go together")
    if k_window is not None:
        if any(w.dim() != 2 or w.shape[1] != conv_window.shape[-1] or w.dtype != conv_window.dtype
               for w in (conv_window, k_window, v_window)):
            raise ValueError(f"{op}: conv_window, k_window and v_window must be 2-d caches of one width and dtype, "
                             f"got {_shape(conv_window)}, {_shape(k_window)}, {_shape(v_window)}")
        conv_window = conv_window.new_empty((conv_window.shape[0] + k_window.shape[0] + v_window.shape[0],
                                             conv_window.shape[1]))        # the flat stage's row
    if stage_states.dim() != state.dim() + 1 or stage_states.shape[1:] != state.shape:
        raise ValueError(f"{op}: stage_states must be [P, *state.shape] = [P, {', '.join(map(str, state.shape))}], "
                         f"got {_shape(stage_states)}")
    if stage_windows.dim() != conv_window.dim() + 1 or stage_windows.shape[1:] != conv_window.shape:
        raise ValueError(f"{op}: stage_windows must be [P, *conv_window.shape], got {_shape(stage_windows)} "
                         f"for conv_window {_shape(conv_window)}")
    if stage_states.shape[0] != stage_windows.shape[0]:
        raise ValueError(f"{op}: stage_states has {stage_states.shape[0]} positions but stage_windows "
                         f"has {stage_windows.shape[0]}")
    for name, x, ref in (("stage_states", stage_states, state), ("stage_windows", stage_windows, conv_window)):
        if x.dtype != ref.dtype:
            raise ValueError(f"{op}: {name}.dtype {x.dtype} differs from its destination's {ref.dtype}")
    if index.numel() != 1 or index.dim() > 1 or index.dtype not in (torch.int64, torch.int32):
        raise ValueError(f"{op}: index must be a 0-d or [1] int64/int32 tensor, got {_shape(index)} {index.dtype}")
    for name, x in (("conv_window", conv_window), ("stage_states", stage_states),
                    ("stage_windows", stage_windows), ("index", index)):
        if x.device != state.device:
            raise ValueError(f"{op}: {name} is on {x.device} but state is on {state.device}")


def check_kda_commit_many_args(states, conv_windows, stage_states, stage_windows, index) -> None:
    """Raise ValueError naming the bad argument of ``kda_commit_many``."""
    op = "kda_commit_many"
    n = len(states)
    if n == 0:
        raise ValueError(f"{op}: states is empty (one entry per layer to commit)")
    for name, group in (("conv_windows", conv_windows), ("stage_states", stage_states),
                        ("stage_windows", stage_windows)):
        if len(group) != n:
            raise ValueError(f"{op}: {name} has {len(group)} entries, states has {n}")
    for i in range(n):
        check_kda_commit_args(states[i], conv_windows[i], stage_states[i], stage_windows[i], index)
        for name, group in (("states", states), ("conv_windows", conv_windows), ("stage_states", stage_states),
                            ("stage_windows", stage_windows)):
            x, ref = group[i], group[0]
            if x.shape != ref.shape or x.dtype != ref.dtype or x.device != ref.device:
                raise ValueError(f"{op}: {name}[{i}] is {_shape(x)} {x.dtype} on {x.device}, {name}[0] is "
                                 f"{_shape(ref)} {ref.dtype} on {ref.device}: one call commits layers of one shape")


def _kda_chain(q_raw: torch.Tensor, k_raw: torch.Tensor, v_raw: torch.Tensor, f_raw: torch.Tensor,
               b_raw: torch.Tensor, conv_w: list[torch.Tensor], conv_window: torch.Tensor, a_log: torch.Tensor,
               dt_bias: torch.Tensor, state: torch.Tensor, lower_bound: Optional[float],
               stage_states: Optional[torch.Tensor], stage_windows: Optional[torch.Tensor],
               state_ready: bool = False, state_vk: bool = False, k_window: Optional[torch.Tensor] = None,
               v_window: Optional[torch.Tensor] = None) -> torch.Tensor:
    args = (q_raw, k_raw, v_raw, f_raw, b_raw, conv_w, conv_window, a_log, dt_bias, state, lower_bound,
            stage_states, stage_windows)
    check_kda_chain_args(*args, state_vk, k_window, v_window)
    if state.is_cuda:
        from .kernel import kda_chain_triton  # imported here so the CPU path needs no triton

        return kda_chain_triton(*args, state_ready=state_ready, state_vk=state_vk, k_window=k_window,
                                v_window=v_window)
    T = q_raw.shape[0]
    kv = (lambda x: x.transpose(-1, -2)) if state_vk else (lambda x: x)    # [.., V, K] <-> [.., K, V]
    r = kda_chain_reference(*flat_inputs(*args[:5]), conv_w, _flat_window(conv_window, k_window, v_window), *args[7:9], kv(state),
                            lower_bound)
    if stage_states is None:
        state.copy_(kv(r.state))
        if k_window is None:
            conv_window.copy_(r.window)
        else:
            for w, new in zip((conv_window, k_window, v_window),
                              r.window.split([conv_window.shape[0], k_window.shape[0], v_window.shape[0]])):
                w.copy_(new)
    else:
        stage_states[:T].copy_(kv(r.stage_states))
        stage_windows[:T].copy_(r.stage_windows)
    return r.o


def _kda_chain_fake(q_raw, k_raw, v_raw, f_raw, b_raw, conv_w, conv_window, a_log, dt_bias, state,
                    lower_bound, stage_states, stage_windows, state_ready=False, state_vk=False, k_window=None,
                    v_window=None):
    check_kda_chain_args(q_raw, k_raw, v_raw, f_raw, b_raw, conv_w, conv_window, a_log, dt_bias, state,
                         lower_bound, stage_states, stage_windows, state_vk, k_window, v_window)
    H, _, V = head_dims(state, state_vk)
    return state.new_empty((q_raw.shape[0], H, V), dtype=torch.float32)


def _kda_commit(state: torch.Tensor, conv_window: torch.Tensor, stage_states: torch.Tensor,
                stage_windows: torch.Tensor, index: torch.Tensor, k_window: Optional[torch.Tensor] = None,
                v_window: Optional[torch.Tensor] = None) -> None:
    check_kda_commit_args(state, conv_window, stage_states, stage_windows, index, k_window, v_window)
    windows = (conv_window,) if k_window is None else (conv_window, k_window, v_window)
    if state.is_cuda and all(t.is_contiguous() for t in (state, *windows, stage_states, stage_windows)):
        from .kernel import kda_commit_triton

        kda_commit_triton(state, conv_window, stage_states, stage_windows, index, k_window=k_window,
                          v_window=v_window)
        return
    if k_window is None:
        kda_commit_reference(state, conv_window, stage_states, stage_windows, index)
        return
    flat = _flat_window(conv_window, k_window, v_window)
    kda_commit_reference(state, flat, stage_states, stage_windows, index)
    for w, new in zip(windows, flat.split([w.shape[0] for w in windows])):
        w.copy_(new)


def _kda_commit_fake(state, conv_window, stage_states, stage_windows, index, k_window=None, v_window=None) -> None:
    check_kda_commit_args(state, conv_window, stage_states, stage_windows, index, k_window, v_window)


def _kda_commit_many(states: list[torch.Tensor], conv_windows: list[torch.Tensor],
                     stage_states: list[torch.Tensor], stage_windows: list[torch.Tensor],
                     index: torch.Tensor) -> None:
    check_kda_commit_many_args(states, conv_windows, stage_states, stage_windows, index)
    groups = (states, conv_windows, stage_states, stage_windows)
    if states[0].is_cuda and all(t.is_contiguous() for g in groups for t in g):
        from .kernel import kda_commit_many_triton

        kda_commit_many_triton(states, conv_windows, stage_states, stage_windows, index)
        return
    for args in zip(*groups):
        kda_commit_reference(*args, index)


def _kda_commit_many_fake(states, conv_windows, stage_states, stage_windows, index) -> None:
    check_kda_commit_many_args(states, conv_windows, stage_states, stage_windows, index)


kda_chain = register_op("kda_chain", _kda_chain, _kda_chain_fake,
                        ("conv_window", "state", "stage_states", "stage_windows", "k_window", "v_window"))
kda_commit = register_op("kda_commit", _kda_commit, _kda_commit_fake, ("state", "conv_window", "k_window", "v_window"))
kda_commit_many = register_op("kda_commit_many", _kda_commit_many, _kda_commit_many_fake,
                              ("states", "conv_windows"))
