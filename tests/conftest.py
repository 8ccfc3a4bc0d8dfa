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
