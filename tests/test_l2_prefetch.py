"""The LINGC_L2_PREFETCH switch (runtime/kernels/l2_prefetch.py): '0' turns every lingc L2
prefetch off (the GEMM table's and MLA's), '1' is the default, anything else is refused at import
with the valid values named. Where the prefetches land in the PTX: test_gemm and test_mla_decode."""
import os
import subprocess
import sys

_PROBE = """
from lingc.runtime.kernels.l2_prefetch import L2_PREFETCH_ENABLED
from lingc.runtime.kernels.gemm.config import config_for
from lingc.runtime.kernels.gemm.kernel import k_plan, prefetch_lines
cfg = config_for(5128, 2560)
block_k, k_tiles, _, _ = k_plan(2560, cfg)
print(L2_PREFETCH_ENABLED, prefetch_lines(cfg, k_tiles, block_k, 2, True))
"""


def _run(value):
    env = {k: v for k, v in os.environ.items() if k != "LINGC_L2_PREFETCH"}
    if value is not None:
        env["LINGC_L2_PREFETCH"] = value
    return subprocess.run([sys.executable, "-c", _PROBE], env=env, capture_output=True, text=True)


def test_default_on_and_zero_turns_it_off():
    on, off = _run(None), _run("0")
    assert on.returncode == 0 and on.stdout.split() == ["True", "32"], on.stderr[-500:]
    assert off.returncode == 0 and off.stdout.split() == ["False", "0"], off.stderr[-500:]


def test_unknown_value_is_refused_naming_the_valid_ones():
    r = _run("yes")
    assert r.returncode != 0
    assert "LINGC_L2_PREFETCH='yes'" in r.stderr and "'1'" in r.stderr and "'0'" in r.stderr, r.stderr[-500:]
