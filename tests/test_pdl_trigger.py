"""Where lingc kernels release their dependents (runtime/pdl.py), checked in real sm_90 PTX: the
RMSNorm kernel and MLA's per-head absorption (two "small" kernels: ``pdl_wait_small``) and the router's logits kernel (every other
kernel: ``pdl_wait``) under LINGC_PDL_TRIGGER=late / small / early; an unknown setting is refused
at import with the valid ones named."""
import os
import subprocess
import sys
import textwrap

import pytest

from helpers import run_sm90_compile_check

_CHECK = textwrap.dedent("""
    import os
    os.environ["LINGC_PDL_TRIGGER"] = TRIGGER
    from sm90 import compile_sm90
    from lingc.runtime.kernels.norms.kernel import _rmsnorm_kernel, rmsnorm_config
    from lingc.runtime.kernels.moe_router.kernel import _moe_router_logits_kernel
    from lingc.runtime.kernels.head_matmul.kernel import _head_matmul_kernel

    def order(ptx):
        load, trigger, wait = (ptx.index(s) for s in ("ld.global", "griddepcontrol.launch_dependents",
                                                       "griddepcontrol.wait"))
        assert load < wait, "the weight load comes before the wait in every placement"
        return "early" if trigger < wait else "late"

    c = rmsnorm_config(2560)
    sig = dict(x_ptr="*bf16", ids_ptr="*i64", res_ptr="*bf16", w_ptr="*bf16", out_ptr="*bf16",
               new_res_ptr="*bf16", stride_x="i32", stride_r="i32", D="i32", eps="fp32")
    ptx, _ = compile_sm90(_rmsnorm_kernel, sig, dict(BLOCK=c.block, HAS_RESIDUAL=True, GATHER=False, USE_GDC=True),
                          num_warps=c.num_warps)
    assert order(ptx) == ("late" if TRIGGER == "late" else "early"), TRIGGER

    sig = dict(a_ptr="*fp32", b_ptr="*bf16", out_ptr="*bf16", M="i32", ROWS="i32", K="i32", N="i32",
               **{s: "i32" for s in ("stride_ab", "stride_am", "stride_ak", "stride_bb", "stride_bk",
                                     "stride_bn", "stride_ob", "stride_om")})
    ptx, _ = compile_sm90(_head_matmul_kernel, sig, dict(BLOCK_K=128, BLOCK_N=32, B_IS_WEIGHT=True, USE_GDC=True),
                          num_warps=4)
    assert order(ptx) == ("late" if TRIGGER == "late" else "early"), TRIGGER

    sig = dict(x_ptr="*bf16", w_ptr="*bf16", logits_ptr="*fp32", T="i32", ROWS="i32", H="i32", stride_xt="i32",
               stride_xh="i32", stride_we="i32", stride_lt="i32")
    ptx, _ = compile_sm90(_moe_router_logits_kernel, sig, dict(E=512, BLOCK_E=4, BLOCK_H=4096, USE_GDC=True),
                          num_warps=8)
    assert order(ptx) == ("early" if TRIGGER == "early" else "late"), TRIGGER

    # The KDA chain reads its state tile and bf16 conv windows before the wait when pdl_swap vouches
    # for them (state_ready) and the trigger placement keeps its guarantee (not under early);
    # the token inputs (bf16 too) always come after it.
    import re
    from lingc.runtime.kernels.kda.kernel import _kda_chain_kernel, config_for, state_before_wait
    assert state_before_wait(True, True) == (TRIGGER != "early")
    assert not state_before_wait(False, True) and not state_before_wait(True, False)
    sig = {n: "*bf16" for n in ["q_ptr", "k_ptr", "v_ptr", "f_ptr", "b_ptr", "win_ptr", "swin_ptr"]}
    sig.update({n: "i32" for n in ["stride_q", "stride_k", "stride_v", "stride_f", "stride_b",
                                 *(f"{g}_{x}" for g in ("glen", "gstride") for x in "qkvfb"), "T", "STAGED"]})
    sig.update({n: "*fp32" for n in ["wq_ptr", "wk_ptr", "wv_ptr", "alog_ptr", "dtb_ptr", "state_ptr", "o_ptr",
                                     "sstate_ptr"]})
    sig.update(ticket_ptr="*i32", lower_bound="fp32", scale="fp32", eps="fp32")
    cfg = config_for(8, 128, 128)
    for early_read in (True, False):
        const = dict(H=8, K=128, V=128, BK=128, BV=cfg.bv, NVB=128 // cfg.bv,
                     STATE_BEFORE_WAIT=state_before_wait(early_read, True), FUSED_RED=cfg.fused_reductions,
                     USE_GDC=True)
        ptx, _ = compile_sm90(_kda_chain_kernel, sig, const, num_warps=cfg.num_warps)
        head = ptx.split("griddepcontrol.wait")[0]
        bf16_before = re.search(r"ld\\.global(\\.\\w+)*\\.[bu]16", head) is not None
        assert bf16_before == (early_read and TRIGGER != "early"), (TRIGGER, early_read, bf16_before)
""")


@pytest.mark.parametrize("trigger", ["late", "small", "early"])
def test_trigger_placement_in_sm90_ptx(trigger):
    run_sm90_compile_check(f"TRIGGER = {trigger!r}\n" + _CHECK)


def test_unknown_trigger_is_refused_naming_the_valid_ones():
    env = {**os.environ, "LINGC_PDL_TRIGGER": "sometimes"}
    r = subprocess.run([sys.executable, "-c", "import lingc.runtime.pdl"], env=env, capture_output=True, text=True)
    assert r.returncode != 0
    assert "LINGC_PDL_TRIGGER='sometimes'" in r.stderr and "'late', 'small', 'early'" in r.stderr, r.stderr[-500:]
