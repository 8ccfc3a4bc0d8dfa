"""pytest setup shared by all lingc tests.

Without CUDA, Triton kernels run in the interpreter: TRITON_INTERPRET must be set before triton is
first imported, which is why this happens here, at conftest import. ``gpu``-marked tests are
skipped without CUDA (run them on the device with ``-m gpu``).
"""
import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


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


if os.environ.get("TRITON_INTERPRET") == "1":
    _interpreter_dot_per_element()

from helpers import assert_close as _assert_close  # noqa: E402  (tests/ is on sys.path)


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


@pytest.fixture
def assert_close():
    """The shared relative-RMS comparison (helpers.assert_close) as a fixture."""
    return _assert_close
