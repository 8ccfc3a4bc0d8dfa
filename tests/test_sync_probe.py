"""benchmarks.sync_probe: the chain forms compute the phases right under the interpreter, the
barrier form refuses the CPU, compiles for sm_90 with its release / acquire pair, and on a GPU
every form computes the phases right while it is timed."""
import textwrap

import pytest
import torch
from helpers import run_sm90_compile_check

from benchmarks.sync_probe import FORMS, barrier_phases, expected, run_form, table


@pytest.mark.parametrize("G, phases", [(5, 1), (5, 7), (33, 4)])
def test_chain_form_computes_each_phase_from_the_neighbours_previous_value(G, phases):
    # The interpreter has no PDL: the pdl form's launches differ from plain only on a GPU.
    if torch.cuda.is_available():
        pytest.skip("CPU check of the chain; the GPU test below times it")
    us, ok = run_form("plain", G, phases, torch.device("cpu"))
    assert ok and us is None
    assert expected(4, 3, "cpu").tolist() == [6, 3, 4, 5]      # (i + 3) % 4 + 3


def test_a_wrong_phase_is_reported(monkeypatch):
    # A chain that skips its last phase leaves values the check rejects.
    if torch.cuda.is_available():
        pytest.skip("CPU check")
    from benchmarks import sync_probe

    calls = []
    real = sync_probe.chain_phase

    def first_three(src, dst, use_pdl):
        calls.append(1)
        if len(calls) < 4:
            real(src, dst, use_pdl)

    monkeypatch.setattr(sync_probe, "chain_phase", first_three)
    assert run_form("plain", 6, 4, torch.device("cpu")) == (None, False)


def test_table_shows_times_and_a_failed_check():
    text = table([dict(form="pdl", programs=132, phases=64, us=1.234, correct=True),
                  dict(form="barrier", programs=132, phases=64, us=None, correct=False)])
    assert "| pdl | 132 | 64 | 1.23 | yes |" in text
    assert "| barrier | 132 | 64 | - | NO: a phase saw stale values |" in text


def test_barrier_form_refuses_the_interpreter():
    if torch.cuda.is_available():
        pytest.skip("the CPU refusal")
    with pytest.raises(RuntimeError, match="the barrier form needs a GPU"):
        barrier_phases(torch.zeros(2, 4, dtype=torch.int32), torch.zeros(2, dtype=torch.int32), 3)


def test_barrier_kernel_compiles_for_sm90_with_release_and_acquire():
    run_sm90_compile_check(textwrap.dedent("""
        from sm90 import compile_sm90
        from benchmarks.sync_probe import _sync_barrier_kernel
        sig = dict(buf_ptr="*i32", count_ptr="*i32", exit_ptr="*i32", G="i32", PHASES="i32")
        ptx, info = compile_sm90(_sync_barrier_kernel, sig, {}, num_warps=1)
        assert "atom.global.gpu.release.add" in ptx, "the arrival must release the phase's store"
        assert "ld.global.gpu.acquire" in ptx, "the spin must acquire the others' stores"
        assert "atom.global.gpu.acq_rel.add" in ptx, "the exit ticket"
        assert " 0 bytes spill stores" in info, info
    """))


@pytest.mark.gpu
@pytest.mark.parametrize("form", FORMS)
def test_gpu_every_form_computes_the_phases_while_timed(form):
    G = torch.cuda.get_device_properties(0).multi_processor_count
    us, ok = run_form(form, G, 16, torch.device("cuda"), replays=5)
    assert ok and us > 0
