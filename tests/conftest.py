"""pytest setup shared by all lingc tests.

Without CUDA, Triton kernels run in the interpreter: TRITON_INTERPRET must be set before triton is
first imported, which is why this happens here, at conftest import. ``gpu``-marked tests are
skipped without CUDA (run them on the device with ``-m gpu``).
"""
import gc
import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

# One intra-op thread per pytest-xdist worker: `-n 2` on two cores already keeps both busy, and
# each worker's second OpenMP thread (and the tensor-parallel tests' spawned ranks', which inherit
# OMP_NUM_THREADS) spin-waited on a core the other worker needed. On a 2-core machine the suite
# took 20-21 minutes that way; a relay-sampling test took 21 s alone but 96 s inside it.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))


def _interpreter_dot_per_element() -> None:
    """Make the interpreter's fp32 ``tl.dot`` give each output element independently of its
    place in the tile. The interpreter runs a dot as one numpy fp32 matmul, and the BLAS behind it
    sums an element in an order that depends on the element's row and the tile's shape (edge
    micro-kernels; which ones depends on the CPU: on an AMD EPYC a query's row moving inside the MLA
    split's tile changed its bits). A tensor-core MMA does not do that, and the batch-invariance
    tests compare bits across tile positions. Products of fp32 values summed in float64 and
    rounded once to fp32 are the same whatever the BLAS's order (up to a float64 rounding that
    would have to land on an fp32 rounding boundary)."""
    import numpy as np
    from triton.runtime import interpreter

    plain = interpreter.InterpreterBuilder.create_dot

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        if a.data.dtype == b.data.dtype == d.data.dtype == np.float32:
            ab = np.matmul(a.data.astype(np.float64), b.data.astype(np.float64)).astype(np.float32)
            return interpreter.TensorHandle(ab + d.data, d.dtype.scalar)
        return plain(self, a, b, d, input_precision, max_num_imprecise_acc)

    interpreter.InterpreterBuilder.create_dot = create_dot


def _interpreter_reductions_by_slice() -> None:
    """Run the interpreter's reductions and scans with a custom combine function (multi-operand
    reductions, key maxima, max-scans: the KDA chain's fused reductions, the router's selection,
    moe_align) one slice along the axis at a time instead of one element at a time. The
    interpreter folds element by element in index order, calling the combine function on scalars
    ~N times; here it is called on whole slices (a combine function is elementwise), in the same
    order, with the accumulator cast back to the input's dtype after every step as the
    interpreter's per-element store does. So every element goes through the same operations in
    the same order (the same bits), in ~axis-length calls instead of ~size calls: the KDA kernel
    tests spent two thirds of their time in the per-element fold."""
    import numpy as np
    import triton.language as tl
    from triton.runtime import interpreter

    def as_tensor(op, data, dtype):
        return op.to_tensor(np.asarray(data), dtype)

    def at(op, data, dtypes, axis, k):
        """Slice k along the axis of every operand, as interpreter tensors."""
        return tuple(as_tensor(op, np.take(d, k, axis=axis), dt) for d, dt in zip(data, dtypes))

    def fold(op, acc, x, dtypes, np_dtypes, shape):
        """combine(acc, x) on whole slices, each result stored back in its input's dtype."""
        ret = op.combine_fn.fn(*acc, *x)
        out = []
        for r, dt, nt in zip(ret if isinstance(ret, tuple) else (ret, ), dtypes, np_dtypes):
            arr = np.asarray(r.handle.data if isinstance(r, tl.core.tensor) else r).astype(nt)
            arr = np.full(shape, arr.item(), dtype=nt) if arr.size == 1 else arr.reshape(shape)
            out.append(as_tensor(op, arr, dt))
        return tuple(out)

    def generic_reduce(self, input):
        original_axis = self.axis
        input, axis = self.unravel(input, self.axis)
        data = [a.handle.data for a in input]
        dtypes = [a.dtype for a in input]
        np_dtypes = [d.dtype for d in data]
        in_shape = data[0].shape
        out_shape = in_shape[:axis] + in_shape[axis + 1:]
        acc = at(self, data, dtypes, axis, 0)
        for k in range(1, in_shape[axis]):
            acc = fold(self, acc, at(self, data, dtypes, axis, k), dtypes, np_dtypes, out_shape)
        ret = []
        for a, nt, dt in zip(acc, np_dtypes, dtypes):
            out = np.asarray(a.handle.data, dtype=nt).reshape(out_shape)
            if self.keep_dims:
                if original_axis is not None:
                    out = np.expand_dims(out, axis)
                else:
                    for _ in range(len(in_shape)):
                        out = np.expand_dims(out, 0)
            elif original_axis is None:
                out = out.item()
            ret.append(self.to_tensor(out, dt))
        return ret

    def generic_scan(self, input):
        data = [a.handle.data for a in input]
        dtypes = [a.dtype for a in input]
        np_dtypes = [d.dtype for d in data]
        shape, axis = data[0].shape, self.axis
        slice_shape = shape[:axis] + shape[axis + 1:]
        outs = [np.zeros(shape, dtype=nt) for nt in np_dtypes]
        acc = at(self, data, dtypes, axis, 0)
        for k in range(shape[axis]):
            if k:
                acc = fold(self, acc, at(self, data, dtypes, axis, k), dtypes, np_dtypes, slice_shape)
            for o, a, nt in zip(outs, acc, np_dtypes):
                idx = [slice(None)] * len(shape)
                idx[axis] = k
                o[tuple(idx)] = np.asarray(a.handle.data, dtype=nt).reshape(slice_shape)
        return [self.to_tensor(o, dt) for o, dt in zip(outs, dtypes)]

    interpreter.ReduceOps.generic_reduce = generic_reduce
    interpreter.ScanOps.generic_scan = generic_scan


def _interpreter_dtype_map_cached() -> None:
    """Memoise the interpreter's Triton -> numpy dtype map: it builds a 19-entry dict (hashing
    every Triton dtype) on each of its calls, tens of thousands per kernel launch."""
    import triton.language as tl
    from triton.runtime import interpreter

    plain = interpreter._get_np_dtype
    cache = {}

    def _get_np_dtype(tt_dtype):
        if isinstance(tt_dtype, tl.block_type):    # unhashable; its element type decides
            tt_dtype = tt_dtype.element_ty
        try:
            return cache[tt_dtype]
        except KeyError:
            cache[tt_dtype] = np_dtype = plain(tt_dtype)
            return np_dtype
        except TypeError:
            return plain(tt_dtype)

    interpreter._get_np_dtype = _get_np_dtype


def _interpreter_patches_once_per_launch() -> None:
    """Patch triton.language for the interpreter once per kernel launch, not again at every call
    of a @jit helper inside it. The interpreter re-runs its patching (inspect.getmembers over
    triton.language, its tensor class and math module) on each helper call; the launch's own
    patches are in place until the launch ends, so a helper that sees the same language modules
    finds them patched already. (A helper whose module sees another of the two language modules
    is patched as before.)"""
    import inspect

    import triton.language as tl
    from triton.runtime import interpreter

    plain_patch, plain_call = interpreter._patch_lang, interpreter.GridExecutor.__call__
    active = {"depth": 0, "patched": set()}

    def langs(fn):
        return {id(v) for v in fn.__globals__.values() if inspect.ismodule(v) and v in (tl, tl.core)}

    def _patch_lang(fn):
        seen = langs(fn)
        if active["depth"] and seen <= active["patched"]:
            return interpreter._LangPatchScope()        # nothing of its own to restore
        scope = plain_patch(fn)
        if active["depth"]:
            active["patched"] |= seen
        return scope

    def call(self, *args, **kwargs):
        active["depth"] += 1
        try:
            return plain_call(self, *args, **kwargs)
        finally:
            active["depth"] -= 1
            if not active["depth"]:
                active["patched"].clear()

    interpreter._patch_lang = _patch_lang
    interpreter.GridExecutor.__call__ = call


if os.environ.get("TRITON_INTERPRET") == "1":
    _interpreter_dot_per_element()
    _interpreter_reductions_by_slice()
    _interpreter_dtype_map_cached()
    _interpreter_patches_once_per_launch()

from helpers import assert_close as _assert_close  # noqa: E402  (tests/ is on sys.path)


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


@pytest.fixture(autouse=True)
def _heap_unfrozen():
    """The engines freeze the heap after prepare (host_gc.py): unfrozen after each test, so what
    a test leaves in reference cycles is collected as before and one test's frozen objects do
    not pile up across the run."""
    yield
    if gc.get_freeze_count():
        gc.unfreeze()


@pytest.fixture
def assert_close():
    """The shared relative-RMS comparison (helpers.assert_close) as a fixture."""
    return _assert_close
