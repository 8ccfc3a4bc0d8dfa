"""Where lingc kernels release their dependents (runtime/pdl.py): after the wait by default, before
it (after the weight prefetch) under LINGC_PDL_TRIGGER=early, checked in the real sm_90 PTX of the
RMSNorm kernel; an unknown setting is refused at import with the valid ones named."""
import os
import subprocess
import sys
import textwrap

import pytest

from helpers import run_sm90_compile_check

_CHECK = textwrap.dedent("""
    import os
    os.environ["LINGC_PDL_TRIGGER"] = {trigger!r}
    from sm90 import compile_sm90
    from lingc.runtime.kernels.norms.kernel import _rmsnorm_kernel, rmsnorm_config

    c = rmsnorm_config(2560)
    sig = dict(x_ptr="*bf16", res_ptr="*bf16", w_ptr="*bf16", out_ptr="*bf16", new_res_ptr="*bf16",
               stride_x="i32", stride_r="i32", D="i32", eps="fp32")
    ptx, _ = compile_sm90(_rmsnorm_kernel, sig, dict(BLOCK=c.block, HAS_RESIDUAL=True, USE_GDC=True), num_warps=c.num_warps)
    assert ptx.count("griddepcontrol.launch_dependents") == 1, ptx.count("griddepcontrol.launch_dependents")
    load, trigger, wait = (ptx.index(s) for s in ("ld.global", "griddepcontrol.launch_dependents", "griddepcontrol.wait"))
    assert load < wait, "the weight load comes before the wait in both placements"
    if {trigger!r} == "early":
        assert load < trigger < wait, (load, trigger, wait)
    else:
        assert wait < trigger, (wait, trigger)
""")


@pytest.mark.parametrize("trigger", ["late", "early"])
def test_trigger_placement_in_sm90_ptx(trigger):
    run_sm90_compile_check(_CHECK.format(trigger=trigger))


def test_unknown_trigger_is_refused_naming_the_valid_ones():
    env = {**os.environ, "LINGC_PDL_TRIGGER": "sometimes"}
    r = subprocess.run([sys.executable, "-c", "import lingc.runtime.pdl"], env=env, capture_output=True, text=True)
    assert r.returncode != 0
    assert "LINGC_PDL_TRIGGER='sometimes'" in r.stderr and "'late', 'early'" in r.stderr, r.stderr[-500:]
