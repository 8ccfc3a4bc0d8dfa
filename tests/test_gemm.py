"""Decode GEMM and GEMM + argmax: the Triton launchers against the plain-PyTorch references,
epilogues, strided weights, batch invariance, ties, the ops; on the GPU the Ling-3 shapes and a
PDL chain under CUDA-graph capture.

On the CPU the kernels run under TRITON_INTERPRET=1 (set in conftest.py) on small, odd shapes;
with CUDA the same tests run on the GPU, and the ``gpu``-marked ones add the real shapes.

Tolerances (relative RMS), as in test_swiglu_gemm.py: fp32 1e-5 (only the summation order
differs); bf16 1e-2 under the interpreter (its fp32->bf16 cast truncates, so outputs can sit
one ulp below the reference's); bf16 on the GPU 4e-3 (both sides round to nearest once from fp32
sums that differ only in order).
"""
import textwrap

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from helpers import assert_close, graph_edge_types, run_sm90_compile_check
from lingc.runtime.kernels.gemm import gemm, gemm_argmax, gemm_argmax_reference, gemm_reference
from lingc.runtime.kernels.gemm import kernel as gemm_kernel
from lingc.runtime.kernels.gemm.argmax_kernel import EMPTY_KEY, SLOT_CAPACITY, argmax_slots, gemm_argmax_triton
from lingc.runtime.kernels.gemm.config import (
    ARGMAX_CONFIGS,
    CONFIGS,
    GemmConfig,
    argmax_config_for,
    config_for,
)
from lingc.runtime.kernels.gemm.kernel import block_plan, gemm_triton, k_plan
from lingc.runtime.kernels.gemm_common import TARGET_SMS, split_k_tickets

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
RTOL = {torch.float32: 1e-5, torch.bfloat16: 1e-2, torch.float16: 2e-3}
RTOL_GPU_BF16 = 4e-3
DTYPES = [torch.float32, torch.bfloat16]
# Weight lists with odd row counts: one weight, two, three (blocks of one weight never hold
# another's rows; the 7-row weight is a block of mostly padding).
ROWS = [(37,), (7, 24), (24, 7, 37)]
# Both designs, split and unsplit, with uneven chunks: K=40 is 3 tiles of 16 (A) or chunks of
# 16, 16, 8 (B); K=96 with block_k 32 is 3 tiles in 2 chunks, the second running past K.
CONFIG_CASES = {
    "A-bk16-s3": GemmConfig(16, 16, 3),
    "A-bn32-bk32-s2": GemmConfig(32, 32, 2),
    "B-s3": GemmConfig(16, 0, 3, prefetch=True),
    "B-s1": GemmConfig(16, 0, 1, prefetch=True),
    # Design C (gemv_kernel.py): whole rows per CTA; K=40 is tiles of 32 + 8, K=96 of 64 + 32.
    "C-r4": GemmConfig(4, 0, 1, num_stages=1, gemv=True),
    "C-r16-w8-ahead": GemmConfig(16, 0, 1, num_warps=8, num_stages=2, gemv=True),
}


def make_inputs(m, k, rows, dtype, seed, device=DEVICE):
    """x [m, k] ~ N(0, 1) and weights [n, k] ~ N(0, 1/k), so outputs are ~ N(0, 1)."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=gen).to(device=device, dtype=dtype)
    weights = [(torch.randn(n, k, generator=gen) / k**0.5).to(device=device, dtype=dtype) for n in rows]
    return x, weights


def make_epilogue(m, n, dtype, seed, which, device=DEVICE):
    """The epilogue operands named in ``which`` (bias, residual, sigmoid_mul) in ``dtype``."""
    gen = torch.Generator().manual_seed(seed)
    shapes = {"bias": (n,), "residual": (m, n), "sigmoid_mul": (m, n)}
    return {name: torch.randn(shapes[name], generator=gen).to(device=device, dtype=dtype) for name in which}


def run_kernel(x, weights, config=None, **epilogue):
    """The Triton launcher into a NaN-poisoned output (unwritten elements cannot pass)."""
    n = sum(w.shape[0] for w in weights)
    out = torch.full((x.shape[0], n), float("nan"), device=x.device, dtype=x.dtype)
    gemm_triton(x, weights, out=out, config=config, **epilogue)
    return out


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows", ROWS, ids=lambda r: "x".join(map(str, r)))
@pytest.mark.parametrize("k", [40, 96])
@pytest.mark.parametrize("m", [1, 2, 6, 8, 16])
def test_kernel_matches_reference(m, k, rows, dtype):
    x, weights = make_inputs(m, k, rows, dtype, seed=1000 * m + 10 * k + sum(rows))
    assert_close(run_kernel(x, weights), gemm_reference(x, weights), RTOL[dtype])


@pytest.mark.parametrize("config", CONFIG_CASES.values(), ids=CONFIG_CASES.keys())
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("k", [40, 96])
def test_kernel_configs_match_reference(k, dtype, config):
    x, weights = make_inputs(6, k, (24, 7, 37), dtype, seed=7 * k)
    assert_close(run_kernel(x, weights, config), gemm_reference(x, weights), RTOL[dtype])


@pytest.mark.parametrize("config", ["C-r4", "C-r16-w8-ahead"])
@pytest.mark.parametrize("m", [1, 16])
def test_design_c_rows_match_reference(m, config):
    # Design C runs the token rows one after another in each CTA: one row and more rows than
    # a CTA has weight rows, beside the M = 6 of the config sweep above.
    x, weights = make_inputs(m, 96, (24, 7, 37), torch.bfloat16, seed=900 + m)
    assert_close(run_kernel(x, weights, CONFIG_CASES[config]), gemm_reference(x, weights), RTOL[torch.bfloat16])


EPILOGUES = [("bias",), ("residual",), ("sigmoid_mul",), ("bias", "residual", "sigmoid_mul")]


@pytest.mark.parametrize("config", [None, CONFIG_CASES["A-bk16-s3"], CONFIG_CASES["B-s3"], CONFIG_CASES["C-r4"]],
                         ids=["table", "A-split", "B-split", "C"])
@pytest.mark.parametrize("which", EPILOGUES, ids=lambda w: "+".join(w))
@pytest.mark.parametrize("dtype", DTYPES)
def test_kernel_epilogues(dtype, which, config):
    m, k, rows = 6, 96, (24, 7, 37)
    x, weights = make_inputs(m, k, rows, dtype, seed=51)
    # Operands in x.dtype, except the residual in fp32 for bf16 (a residual stream kept in fp32).
    epi = make_epilogue(m, sum(rows), dtype, seed=52, which=which)
    if "residual" in epi and dtype == torch.bfloat16:
        epi["residual"] = epi["residual"].float()
    ref = gemm_reference(x, weights, **epi)
    assert_close(run_kernel(x, weights, config, **epi), ref, RTOL[dtype])
    # The epilogue really changed the result (a kernel that skipped it would fail above).
    assert (ref.float() - gemm_reference(x, weights).float()).abs().max() > 0.1


def test_kernel_strided_weights_and_x():
    # Weights as views read in place: row slices of one fused tensor, a column window of a wider
    # tensor (row stride > K), every other row (row stride 2K); x every other column.
    m, k = 6, 40
    wide_x, (fused, wide, tall) = make_inputs(m, 2 * k, (68, 24, 74), torch.float32, seed=61)
    x = wide_x[:, ::2]
    weights = [fused[:37, :k], fused[37:44, :k], wide[:, 8 : 8 + k], tall[::2, :k]]
    assert [w.stride(0) for w in weights] == [2 * k, 2 * k, 2 * k, 4 * k]
    for config in (None, CONFIG_CASES["A-bn32-bk32-s2"], CONFIG_CASES["B-s3"], CONFIG_CASES["C-r4"]):
        assert_close(run_kernel(x, weights, config), gemm_reference(x, weights), RTOL[torch.float32])


@pytest.mark.parametrize("config", [None, CONFIG_CASES["A-bk16-s3"], CONFIG_CASES["B-s3"], CONFIG_CASES["C-r4"]],
                         ids=["table", "A-split", "B-split", "C"])
def test_kernel_writes_only_its_output(config):
    # out is a strided window of a sentinel-filled buffer: the window must be fully written and
    # every element outside it must keep its exact sentinel bits.
    m, k, rows = 5, 96, (24, 7, 37)
    x, weights = make_inputs(m, k, rows, torch.float32, seed=3)
    n = sum(rows)
    sentinel = -12345.0
    buf = torch.full((m + 2, n + 5), sentinel, device=DEVICE)
    out = buf[1 : m + 1, 2 : n + 2]
    gemm_triton(x, weights, out=out, config=config)
    assert_close(out, gemm_reference(x, weights), RTOL[torch.float32])
    outside = torch.ones_like(buf, dtype=torch.bool)
    outside[1 : m + 1, 2 : n + 2] = False
    assert torch.all(buf[outside] == sentinel)


@pytest.mark.parametrize("config", [None, CONFIG_CASES["A-bk16-s3"], CONFIG_CASES["B-s3"], CONFIG_CASES["C-r4"]],
                         ids=["table", "A-split", "B-split", "C"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_kernel_rounds_to_x_dtype_into_an_fp32_out(dtype, config):
    """out of float32 (gemm_rows_into's relay buffer): every element holds the x.dtype GEMM's
    value exactly (rounded to x.dtype, then widened), as .float() of gemm's output does."""
    m, k, rows = 3, 96, (24, 7, 37)
    x, weights = make_inputs(m, k, rows, dtype, seed=5)
    n = sum(rows)
    out = torch.full((m, n), float("nan"), device=DEVICE)
    gemm_triton(x, weights, out=out, config=config)
    assert torch.equal(out, run_kernel(x, weights, config=config).float())


@pytest.mark.parametrize("dtype", DTYPES)
def test_rows_into_writes_its_rows_of_the_buffer(dtype):
    """lingc.gemm_rows_into: rows row..row+M-1 of a sentinel-filled [R, N] buffer (fp32 or
    x.dtype) hold gemm's values, every other element keeps its sentinel; the op's arguments
    are checked (the wrong width, dtype, and rows past the buffer, eagerly and on fake tensors)."""
    m, k, rows = 2, 40, (24, 7)
    x, weights = make_inputs(m, k, rows, dtype, seed=9)
    epi = make_epilogue(m, 31, dtype, seed=10, which=("bias",))
    want = torch.ops.lingc.gemm(x, weights, epi["bias"])
    for out_dtype in (torch.float32, dtype):
        buf = torch.full((5, 31), -777.0, device=DEVICE, dtype=out_dtype)
        torch.ops.lingc.gemm_rows_into(x, weights, epi["bias"], None, None, buf, 2)
        assert torch.equal(buf[2:4], want.to(out_dtype))
        assert torch.all(buf[:2] == -777.0) and torch.all(buf[4:] == -777.0)
    bad = [(torch.zeros(5, 30, device=DEVICE), 0, r"out must be \[R, 31\]"),
           (torch.zeros(5, 31, device=DEVICE, dtype=torch.float16), 0, "out.dtype must be"),
           (torch.zeros(5, 31, device=DEVICE), 4, "rows 4..5 of out are outside its 5 rows")]
    for out, row, message in bad:
        with pytest.raises(ValueError, match=message):
            torch.ops.lingc.gemm_rows_into(x, weights, None, None, None, out, row)
        with FakeTensorMode() as mode, pytest.raises(ValueError, match=message):
            torch.ops.lingc.gemm_rows_into(mode.from_tensor(x), [mode.from_tensor(w) for w in weights], None, None,
                                           None, mode.from_tensor(out), row)


def test_kernel_degenerate_shapes():
    # K = 0: every product is empty, so out = the epilogue of zeros (no load may run unmasked).
    x, w = torch.ones(2, 0, device=DEVICE), torch.ones(24, 0, device=DEVICE)
    bias = torch.arange(24.0, device=DEVICE)
    assert torch.equal(run_kernel(x, [w], bias=bias), bias.expand(2, 24))
    # M = 0 launches nothing.
    assert run_kernel(torch.ones(0, 40, device=DEVICE), [torch.ones(24, 40, device=DEVICE)]).shape == (0, 24)


@pytest.mark.parametrize("config, dtype", [
    (None, torch.float32), (None, torch.bfloat16),
    (CONFIG_CASES["A-bk16-s3"], torch.bfloat16), (CONFIG_CASES["B-s3"], torch.float32),
    (CONFIG_CASES["C-r16-w8-ahead"], torch.bfloat16),
], ids=["table-fp32", "table-bf16", "A-split-bf16", "B-split-fp32", "C-bf16"])
def test_kernel_batch_invariant(config, dtype):
    x, weights = make_inputs(16, 96, (24, 7, 37), dtype, seed=11)
    epi = make_epilogue(16, 68, dtype, seed=12, which=("bias", "residual"))
    singles = {i: run_kernel(x[i : i + 1].clone(), weights, config, bias=epi["bias"],
                             residual=epi["residual"][i : i + 1].clone())
               for i in [*range(8), 15]}
    for m in [*range(1, 9), 16]:
        batch = run_kernel(x[:m], weights, config, bias=epi["bias"], residual=epi["residual"][:m])
        for i in singles:
            if i < m:
                assert torch.equal(batch[i : i + 1], singles[i]), f"row {i} of an M={m} call differs from M=1"


def test_reference_batch_invariant():
    x, weights = make_inputs(8, 96, (24, 7, 37), torch.bfloat16, seed=12, device="cpu")
    singles = torch.cat([gemm_reference(x[i : i + 1], weights) for i in range(8)])
    for m in range(1, 9):
        assert torch.equal(gemm_reference(x[:m], weights), singles[:m])


def test_split_tickets_return_to_zero():
    # The in-launch split-K reductions leave every ticket at zero, so the next call (or a graph
    # replay) starts clean; run twice and compare.
    x, weights = make_inputs(6, 96, (24, 7, 37), torch.float32, seed=21)
    w = torch.cat(weights)
    first = run_kernel(x, weights, CONFIG_CASES["B-s3"])
    ids, _ = gemm_argmax_triton(x, w)
    assert int(split_k_tickets(x.device, 1).abs().sum()) == 0
    assert bool((argmax_slots(x.device, 1) == EMPTY_KEY).all())   # gemm_argmax's key slots emptied
    assert torch.equal(run_kernel(x, weights, CONFIG_CASES["B-s3"]), first)
    assert torch.equal(gemm_argmax_triton(x, w)[0], ids)


# A broken kernel or plan must fail the comparisons above: these tests show that assert_close,
# fed by the launcher, rejects the mistakes we could plausibly make.


def test_swapped_weight_order_is_caught():
    x, weights = make_inputs(3, 96, (24, 37), torch.float32, seed=31)
    with pytest.raises(AssertionError, match="relative RMS error|shape"):
        assert_close(run_kernel(x, weights[::-1]), gemm_reference(x, weights), RTOL[torch.float32])
    x, weights = make_inputs(3, 96, (24, 24), torch.float32, seed=32)  # same shapes: values differ
    with pytest.raises(AssertionError, match="relative RMS error"):
        assert_close(run_kernel(x, weights[::-1]), gemm_reference(x, weights), RTOL[torch.float32])


def test_broken_block_plan_is_caught(monkeypatch):
    # Output columns shifted by one for every weight: column 0 is never written (NaN).
    def shifted(rows, block_n):
        starts, cols, blocks = block_plan(rows, block_n)
        return starts, tuple(c + 1 for c in cols[:-1]) + (cols[-1],), blocks

    monkeypatch.setattr(gemm_kernel, "block_plan", shifted)
    x, weights = make_inputs(3, 40, (24, 7, 37), torch.float32, seed=33)
    with pytest.raises(AssertionError, match="non-finite|relative RMS error"):
        assert_close(run_kernel(x, weights), gemm_reference(x, weights), RTOL[torch.float32])


def test_unwritten_output_is_caught():
    # Simulates a grid that misses the last weight: its columns stay NaN.
    x, weights = make_inputs(3, 40, (24, 7, 37), torch.float32, seed=34)
    out = torch.full((3, 68), float("nan"), device=DEVICE)
    gemm_triton(x, weights[:2], out=out[:, :31])
    with pytest.raises(AssertionError, match="non-finite"):
        assert_close(out, gemm_reference(x, weights), RTOL[torch.float32])


# gemm_argmax.


# A NaN with a payload no arithmetic produces (the max logit may itself be NaN or inf).
_UNWRITTEN_BITS = 0x7FA5A5A5


def run_argmax(x, w, config=None):
    # Into pre-filled outputs (an impossible id, a marked NaN): every row must be written.
    m = x.shape[0]
    out = (torch.full((m,), -1, dtype=torch.int64, device=x.device),
           torch.full((m,), _UNWRITTEN_BITS, dtype=torch.int32, device=x.device).view(torch.float32))
    ids, best = gemm_argmax_triton(x, w, config=config, out=out)
    assert ids is out[0] and best is out[1]
    assert not (ids < 0).any() and not (best.view(torch.int32) == _UNWRITTEN_BITS).any(), \
        "gemm_argmax left a row unwritten"
    return ids, best


@pytest.mark.parametrize("n", [37, 300])
@pytest.mark.parametrize("k", [40, 96])
@pytest.mark.parametrize("m", [1, 6, 16, 20])
def test_argmax_matches_reference_fp32(m, k, n):
    x, (w,) = make_inputs(m, k, (n,), torch.float32, seed=100 * m + k + n)
    ids, best = run_argmax(x, w)
    ref_ids, ref_best = gemm_argmax_reference(x, w)
    assert ids.dtype == torch.int64 and best.dtype == torch.float32 and ids.shape == best.shape == (m,)
    assert torch.equal(ids, ref_ids)
    assert_close(best, ref_best, RTOL[torch.float32])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m", [1, 6, 16])
def test_argmax_is_argmax_of_the_gemm_logits(m, dtype):
    # Same config, same K order: the argmax kernel's logits are the gemm kernel's, bit for bit
    # (rounded to x.dtype), so ids and max_logit follow exactly; against the reference the
    # chosen logit is a maximum up to one rounding.
    x, (w,) = make_inputs(m, 96, (300,), dtype, seed=41 + m)
    cfg = argmax_config_for(300, 96)
    logits = run_kernel(x, [w], cfg).float()
    ids, best = run_argmax(x, w)
    assert torch.equal(ids, torch.argmax(logits, dim=1))
    assert torch.equal(best, logits.gather(1, ids[:, None])[:, 0])
    ref = gemm_reference(x, [w]).float()
    ulp = 2.0**-7 if dtype == torch.bfloat16 else 1e-6
    ref_max = ref.max(dim=1).values
    assert torch.all(ref.gather(1, ids[:, None])[:, 0] >= ref_max - 2 * ulp * ref_max.abs())


@pytest.mark.parametrize("m", [1, 6])
def test_float16_gemm_and_argmax(m):
    """float16 (the sweep's DTYPES are bf16 and fp32): the GEMM against its reference, and the
    argmax of logits rounded to fp16 as an fp16 graph holds them (the gemm kernel's, bit for bit)."""
    x, weights = make_inputs(m, 96, (24, 7, 37), torch.float16, seed=51 + m)
    assert_close(run_kernel(x, weights), gemm_reference(x, weights), RTOL[torch.float16])
    x, (w,) = make_inputs(m, 96, (300,), torch.float16, seed=53 + m)
    logits = run_kernel(x, [w], argmax_config_for(300, 96)).float()
    ids, best = run_argmax(x, w)
    assert torch.equal(ids, torch.argmax(logits, dim=1))
    assert torch.equal(best, logits.gather(1, ids[:, None])[:, 0])
    assert torch.equal(ids, gemm_argmax_reference(x, w)[0])


@pytest.mark.parametrize("dtype", DTYPES)
def test_argmax_ties_lowest_index_wins(dtype):
    # Rows of w copied to several indices give exactly equal logits; the copies span column
    # blocks (block_n 32 here) so both the in-block and the cross-block reductions break ties.
    # x and the copied rows hold small integers, so the tied logits (sum of x^2, ~600 against
    # ~N(0, 7) for the other columns) are exact whatever the summation order.
    m, k, n = 3, 96, 300
    _, (w,) = make_inputs(m, k, (n,), dtype, seed=43)
    x = torch.randint(-4, 5, (m, k), generator=torch.Generator().manual_seed(43)).to(DEVICE, dtype)
    tied = {0: [5, 40, 41, 299], 1: [70, 71, 290], 2: [299, 298]}
    for row, idx in tied.items():
        w[idx] = x[row]
    ids, best = run_argmax(x, w)
    assert ids.tolist() == [min(idx) for idx in tied.values()]
    ref_ids, ref_best = gemm_argmax_reference(x, w)
    assert torch.equal(ids, ref_ids)
    logits = gemm_reference(x, [w]).float()
    assert torch.equal(logits.argmax(dim=1), ids)  # torch.argmax picks the same among the ties
    assert torch.equal(best, run_kernel(x, [w], argmax_config_for(n, k)).float().gather(1, ids[:, None])[:, 0])


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")  # numpy under the interpreter
@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")
def test_argmax_inf_nan_and_large_values():
    # fp32; x > 0 so that the sign of a logit is the sign of its weight row.
    m, k, n = 6, 40, 100
    gen = torch.Generator().manual_seed(44)
    x = (torch.rand(m, k, generator=gen) + 0.1).to(DEVICE)
    w = (torch.randn(n, k, generator=gen) / k**0.5).to(DEVICE)
    w[:, :] = w.abs() * -1  # all logits negative ...
    w[10] = float("-inf")  # ... one -inf column
    w[20] = 1e38  # sums overflow: +inf at 20 and 60 (a tie at +inf: 20 wins)
    w[60] = 1e38
    w[33, 0] = float("nan")  # a NaN column beats everything ...
    w[77, 5] = float("nan")  # ... the first NaN wins
    x[1, :] = float("nan")  # a row of NaN logits: id 0
    x[2, :] = 1.0
    cases = {"all": w.clone()}
    no_nan = w.clone()
    no_nan[33, 0] = no_nan[77, 5] = -1.0
    cases["inf"] = no_nan
    only_neg_inf = torch.full((n, k), float("-inf"), device=DEVICE)
    cases["all -inf"] = only_neg_inf  # every logit -inf: id 0
    for name, wc in cases.items():
        ids, best = run_argmax(x, wc)
        ref_ids, ref_best = gemm_argmax_reference(x, wc)
        assert torch.equal(ids, ref_ids), (name, ids, ref_ids)
        assert torch.allclose(best, ref_best, rtol=1e-5, equal_nan=True), (name, best, ref_best)
    assert run_argmax(x, cases["all"])[0].tolist() == [33, 0, 33, 33, 33, 33]
    assert run_argmax(x, cases["inf"])[0].tolist()[2] == 20


def test_argmax_rows_beyond_the_slots_are_refused():
    with pytest.raises(ValueError, match="SLOT_CAPACITY"):
        argmax_slots(torch.device(DEVICE), SLOT_CAPACITY + 1)


@pytest.mark.parametrize("dtype", DTYPES)
def test_argmax_batch_invariant(dtype):
    x, (w,) = make_inputs(16, 96, (300,), dtype, seed=45)
    singles = [run_argmax(x[i : i + 1].clone(), w) for i in range(16)]
    ids1 = torch.cat([s[0] for s in singles])
    best1 = torch.cat([s[1] for s in singles])
    for m in [2, 5, 8, 16]:
        ids, best = run_argmax(x[:m], w)
        assert torch.equal(ids, ids1[:m]) and torch.equal(best, best1[:m]), f"M={m} differs from M=1"


# Launch configurations.

# Every projection of the model presets (K, N): the table must hold them all.
MODEL_SHAPES = {
    "tp4 KDA q/k/v/f/g": (2560, (1024,)), "tp4 KDA b": (2560, (8,)),
    "tp4 KDA fused": (2560, (1024,) * 5 + (8,)), "tp4 KDA o_proj": (1024, (2560,)),
    "tp4 MLA q_proj": (2560, (1536,)), "tp4 MLA kv_a": (2560, (576,)), "tp4 MLA g_proj": (2560, (8,)),
    "tp4 MLA fused": (2560, (1536, 576, 8)), "tp4 MLA dense": (1024, (2560,)),
    "tp4 MLP down": (1536, (2560,)), "tp4 shared down": (192, (2560,)),
    "tp4 NEXTN eh_proj": (5120, (2560,)), "tp4 lm_head": (2560, (39296,)),
    "flash KDA q/k/v/f/g": (2560, (4096,)), "flash KDA b": (2560, (32,)),
    "flash KDA fused": (2560, (4096,) * 5 + (32,)), "flash o_proj": (4096, (2560,)),
    "flash MLA q_proj": (2560, (6144,)), "flash MLA kv_a": (2560, (576,)), "flash MLA g": (2560, (32,)),
    "flash MLA fused": (2560, (6144, 576, 32)), "flash dense": (4096, (2560,)),
    "flash MLP down": (6144, (2560,)), "flash shared down": (768, (2560,)),
    "flash lm_head": (2560, (157184,)),
}


def _ctas(rows, k, cfg):
    return block_plan(list(rows), cfg.block_n)[2] * k_plan(k, cfg)[2]


@pytest.mark.parametrize("name", MODEL_SHAPES)
def test_table_covers_model_shapes(name):
    k, rows = MODEL_SHAPES[name]
    n = sum(rows)
    cfg = CONFIGS[(n, k)]
    assert config_for(n, k) is cfg
    assert cfg.block_n >= 16 and cfg.block_n & (cfg.block_n - 1) == 0
    assert cfg.prefetch == (cfg.block_k == 0) and (cfg.prefetch or cfg.block_k >= 16)
    if n * k * 2 >= 2 * 1024**2:  # anything but the latency-bound slivers fills the GPU
        assert _ctas(rows, k, cfg) >= TARGET_SMS, (name, cfg, _ctas(rows, k, cfg))


def test_config_rule_is_a_function_of_shape_only():
    for n in (1, 37, 300, 3000, 50000):
        for k in (16, 40, 2560, 8192):
            cfg = config_for(n, k)
            assert cfg == config_for(n, k) and cfg.block_n >= 16
            assert cfg.prefetch or cfg.block_k >= 16
            if cfg.prefetch:  # design B chunks stay within the register budget
                assert k_plan(k, cfg)[0] <= 512
            acfg = argmax_config_for(n, k)
            assert acfg.split_k == 1 and not acfg.prefetch
    for key, cfg in ARGMAX_CONFIGS.items():
        assert cfg == CONFIGS[key]  # the lm_head argmax sees the gemm's logits bit for bit


def test_block_plan_keeps_weights_apart():
    starts, cols, blocks = block_plan([1024] * 5 + [8], 64)
    assert starts == (0, 16, 32, 48, 64, 80) and cols == (0, 1024, 2048, 3072, 4096, 5120) and blocks == 81
    assert block_plan([7, 24, 37], 16) == ((0, 1, 3), (0, 7, 31), 6)


# The custom ops.


@pytest.mark.parametrize("dtype", DTYPES)
def test_op_cpu_path_is_the_reference(dtype):
    x, weights = make_inputs(6, 40, (24, 7, 37), dtype, seed=71, device="cpu")
    epi = make_epilogue(6, 68, dtype, seed=72, which=("bias", "residual", "sigmoid_mul"), device="cpu")
    out = torch.ops.lingc.gemm(x, weights, **epi)
    assert out.shape == (6, 68) and out.dtype == dtype
    assert torch.equal(out, gemm_reference(x, weights, **epi))
    assert torch.equal(gemm(x, weights, epi["bias"]), gemm_reference(x, weights, epi["bias"]))
    ids, best = torch.ops.lingc.gemm_argmax(x, weights[2])
    ref_ids, ref_best = gemm_argmax_reference(x, weights[2])
    assert torch.equal(ids, ref_ids) and torch.equal(best, ref_best)
    assert torch.equal(gemm_argmax(x, weights[2])[0], ids)


def test_op_schemas():
    # fuse_projections is written against these signatures.
    assert str(torch.ops.lingc.gemm.default._schema) == (
        "lingc::gemm(Tensor x, Tensor[] weights, Tensor? bias=None, Tensor? residual=None, "
        "Tensor? sigmoid_mul=None) -> Tensor"
    )
    assert str(torch.ops.lingc.gemm_argmax.default._schema) == (
        "lingc::gemm_argmax(Tensor x, Tensor w) -> (Tensor, Tensor)"
    )


def test_op_fake_impl_shapes():
    with FakeTensorMode():
        x = torch.empty(6, 2560, dtype=torch.bfloat16)
        weights = [torch.empty(1024, 2560, dtype=torch.bfloat16) for _ in range(5)]
        weights.append(torch.empty(8, 2560, dtype=torch.bfloat16))
        out = torch.ops.lingc.gemm(x, weights)
        out_epi = torch.ops.lingc.gemm(x, weights[:1], torch.empty(1024, dtype=torch.bfloat16),
                                       torch.empty(6, 1024, dtype=torch.float32))
        ids, best = torch.ops.lingc.gemm_argmax(x, torch.empty(39296, 2560, dtype=torch.bfloat16))
    assert out.shape == (6, 5128) and out.dtype == torch.bfloat16
    assert out_epi.shape == (6, 1024) and out_epi.dtype == torch.bfloat16
    assert ids.shape == best.shape == (6,) and ids.dtype == torch.int64 and best.dtype == torch.float32


def test_op_opcheck():
    x, weights = make_inputs(3, 40, (24, 7), torch.float32, seed=73, device="cpu")
    epi = make_epilogue(3, 31, torch.float32, seed=74, which=("bias", "residual", "sigmoid_mul"), device="cpu")
    torch.library.opcheck(torch.ops.lingc.gemm, (x, weights))
    torch.library.opcheck(torch.ops.lingc.gemm, (x, weights), epi)
    torch.library.opcheck(torch.ops.lingc.gemm_argmax, (x, weights[0]))
    torch.library.opcheck(torch.ops.lingc.gemm_rows_into, (x, weights, None, None, None, torch.zeros(4, 31), 1))


def test_op_registration_is_idempotent():
    import importlib

    import lingc.runtime.kernels.gemm.op as op_module

    importlib.reload(op_module)
    assert hasattr(torch.ops.lingc, "gemm") and hasattr(torch.ops.lingc, "gemm_argmax")


def _bad_gemm_cases():
    f32, bf16 = torch.float32, torch.bfloat16
    z = torch.zeros
    x = z(3, 40)
    w = z(24, 40)
    return [
        ("x 3-d", (z(1, 3, 40), [w]), {}, r"x must be \[M, K\] \(2-d\), got shape \(1, 3, 40\)"),
        ("x fp64", (x.double(), [w.double()]), {}, "bfloat16, float16 or float32, got torch.float64"),
        ("no weights", (x, []), {}, "weights must hold 1 to 8 tensors, got 0"),
        ("9 weights", (x, [w] * 9), {}, "weights must hold 1 to 8 tensors, got 9"),
        ("K mismatch", (x, [w, z(8, 32)]), {}, r"K mismatch, x has K=40 but weights\[1\] has K=32"),
        ("dtype", (x, [w.to(bf16)]), {}, r"dtype mismatch, x is torch.float32 but weights\[0\] is torch.bfloat16"),
        ("1-d weight", (x, [z(24)]), {}, r"weights\[0\] must be \[N, K\]"),
        ("K stride", (x, [z(40, 24).T]), {}, r"weights\[0\] must have unit stride along K .* \(1, 24\)"),
        ("bias shape", (x, [w]), {"bias": z(23)}, r"bias must have shape \(24,\), got \(23,\)"),
        ("residual shape", (x, [w]), {"residual": z(2, 24)}, r"residual must have shape \(3, 24\), got \(2, 24\)"),
        ("mul dtype", (x, [w]), {"sigmoid_mul": z(3, 24, dtype=torch.float16)},
         "sigmoid_mul.dtype must be torch.float32 .* got torch.float16"),
        ("residual dtype", (x.to(bf16), [w.to(bf16)]), {"residual": z(3, 24, dtype=torch.int32)},
         "residual.dtype must be torch.bfloat16 .* or float32, got torch.int32"),
    ] + [("fp32 operand ok", (x.to(bf16), [w.to(bf16)]), {"bias": z(24, dtype=f32)}, None)]


@pytest.mark.parametrize("case", _bad_gemm_cases(), ids=lambda c: c[0])
def test_op_rejects_bad_arguments(case):
    _, args, kwargs, message = case
    if message is None:
        assert torch.ops.lingc.gemm(*args, **kwargs).shape == (3, 24)
        return
    with pytest.raises(ValueError, match=message):
        torch.ops.lingc.gemm(*args, **kwargs)
    with FakeTensorMode() as mode, pytest.raises(ValueError, match=message):
        fake_args = (mode.from_tensor(args[0]), [mode.from_tensor(w) for w in args[1]])
        torch.ops.lingc.gemm(*fake_args, **{k: mode.from_tensor(v) for k, v in kwargs.items()})


@pytest.mark.parametrize("x_shape, w_shape, message", [
    ((3, 40), (0, 40), r"w must have at least one row .* got \(0, 40\)"),
    ((3, 40), (24, 32), "K mismatch, x has K=40 but w has K=32"),
    ((40,), (24, 40), r"x must be \[M, K\] \(2-d\)"),
])
def test_op_argmax_rejects_bad_arguments(x_shape, w_shape, message):
    with pytest.raises(ValueError, match=message):
        torch.ops.lingc.gemm_argmax(torch.zeros(x_shape), torch.zeros(w_shape))


# GPU: the Ling-3 shapes, batch invariance, argmax on the lm_head, PDL under graph capture.

GPU_M = [1, 2, 6, 8, 16]


@pytest.fixture(scope="module")
def model_weights():
    """Weights per MODEL_SHAPES entry, made once per module (the lm_head ones are large)."""
    cache = {}

    def get(name):
        if name not in cache:
            k, rows = MODEL_SHAPES[name]
            cache.clear()  # keep one set alive at a time
            cache[name] = make_inputs(1, k, rows, torch.bfloat16, seed=sum(rows) + k)[1]
        return cache[name]

    return get


@pytest.mark.gpu
@pytest.mark.parametrize("name", MODEL_SHAPES)
def test_gpu_model_shapes(name, model_weights):
    k, rows = MODEL_SHAPES[name]
    weights = model_weights(name)
    for m in GPU_M:
        x, _ = make_inputs(m, k, (), torch.bfloat16, seed=m * 7919 + k)
        ref = gemm_reference(x, weights)
        assert_close(run_kernel(x, weights), ref, RTOL_GPU_BF16)
        assert_close(torch.ops.lingc.gemm(x, weights), ref, RTOL_GPU_BF16)


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["tp4 lm_head"])
def test_gpu_rows_into_an_fp32_buffer(name, model_weights):
    """The draft's logits under sampled drafts: the lm_head GEMM writes row j of an fp32 relay
    buffer, equal to gemm's bf16 value widened, the other rows untouched."""
    k, rows = MODEL_SHAPES[name]
    weights = model_weights(name)
    x, _ = make_inputs(1, k, (), torch.bfloat16, seed=k)
    buf = torch.full((5, sum(rows)), -777.0, device="cuda")
    torch.ops.lingc.gemm_rows_into(x, weights, None, None, None, buf, 3)
    assert torch.equal(buf[3:4], torch.ops.lingc.gemm(x, weights).float())
    assert torch.all(buf[:3] == -777.0) and torch.all(buf[4:] == -777.0)


@pytest.mark.gpu
@pytest.mark.parametrize("name, which", [
    ("tp4 KDA o_proj", ("residual",)), ("tp4 MLP down", ("bias", "residual")),
    ("tp4 MLA q_proj", ("sigmoid_mul",)), ("tp4 NEXTN eh_proj", ("bias", "residual", "sigmoid_mul")),
])
def test_gpu_epilogues(name, which, model_weights):
    k, rows = MODEL_SHAPES[name]
    weights = model_weights(name)
    for m in (1, 6):
        x, _ = make_inputs(m, k, (), torch.bfloat16, seed=m + 5)
        epi = make_epilogue(m, sum(rows), torch.bfloat16, seed=m + 6, which=which)
        assert_close(torch.ops.lingc.gemm(x, weights, **epi), gemm_reference(x, weights, **epi), RTOL_GPU_BF16)


@pytest.mark.gpu
@pytest.mark.parametrize("rows, warps, stages", [(4, 4, 1), (4, 4, 2), (4, 8, 2), (8, 8, 2), (2, 4, 2)])
@pytest.mark.parametrize("name", ["tp4 KDA fused", "tp4 KDA o_proj", "tp4 shared down", "tp4 KDA b"])
def test_gpu_design_c_model_shapes(name, rows, warps, stages, model_weights):
    # Design C (a sweep candidate) on the real shapes: the reference, and a row's bits for any M.
    k, _ = MODEL_SHAPES[name]
    weights = model_weights(name)
    cfg = GemmConfig(rows, 0, 1, num_warps=warps, num_stages=stages, gemv=True)
    x, _ = make_inputs(16, k, (), torch.bfloat16, seed=rows + k + stages)
    singles = torch.cat([run_kernel(x[i : i + 1].clone(), weights, cfg) for i in range(16)])
    assert_close(singles, gemm_reference(x, weights), RTOL_GPU_BF16)
    for m in (2, 6, 16):
        assert torch.equal(run_kernel(x[:m], weights, cfg), singles[:m]), f"{name}: M={m} rows differ from M=1"


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["tp4 KDA fused", "tp4 MLA fused", "tp4 KDA o_proj", "tp4 shared down",
                                  "tp4 KDA b", "flash KDA q/k/v/f/g", "tp4 lm_head"])
def test_gpu_batch_invariant(name, model_weights):
    # One shape per kind of launch: A split / unsplit, B split / unsplit, mixed weight lists.
    k, rows = MODEL_SHAPES[name]
    weights = model_weights(name)
    x, _ = make_inputs(16, k, (), torch.bfloat16, seed=17)
    singles = torch.cat([run_kernel(x[i : i + 1].clone(), weights) for i in range(16)])
    for m in [*range(1, 9), 16]:
        assert torch.equal(run_kernel(x[:m], weights), singles[:m]), f"{name}: M={m} rows differ from M=1"


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["tp4 lm_head", "flash lm_head"])
def test_gpu_argmax_lm_head(name, model_weights):
    k, (n,) = MODEL_SHAPES[name]
    (w,) = model_weights(name)
    ids1 = []
    for m in (1, 6, 16):
        x, _ = make_inputs(m, k, (), torch.bfloat16, seed=m + 91)
        ids, best = torch.ops.lingc.gemm_argmax(x, w)
        logits = run_kernel(x, [w]).float()  # the gemm with the same config: the same bits
        assert torch.equal(ids, logits.argmax(dim=1))
        assert torch.equal(best, logits.gather(1, ids[:, None])[:, 0])
        ref = gemm_reference(x, [w]).float()
        assert torch.all(ref.gather(1, ids[:, None])[:, 0] >= ref.max(dim=1).values - 2 * 2.0**-7 * ref.abs().max())
        # Batch invariance: each row's id as in an M=1 call.
        singles = torch.cat([torch.ops.lingc.gemm_argmax(x[i : i + 1].clone(), w)[0] for i in range(m)])
        assert torch.equal(ids, singles)
        ids1.append(ids)
    # Ties across the vocabulary: copies of one row at three far-apart indices.
    x, _ = make_inputs(1, k, (), torch.bfloat16, seed=97)
    saved = w[[17, n // 2, n - 1]].clone()
    w[[17, n // 2, n - 1]] = (x[0].float() / x[0].float().norm() * 8).to(torch.bfloat16)
    try:
        assert torch.ops.lingc.gemm_argmax(x, w)[0].item() == 17
    finally:
        w[[17, n // 2, n - 1]] = saved


@pytest.mark.gpu
@pytest.mark.parametrize("disable_pdl", [False, True], ids=["pdl", "LINGC_DISABLE_PDL"])
def test_gpu_pdl_chain_under_graph_capture(disable_pdl, monkeypatch):
    from lingc.runtime.pdl import pdl_supported

    if not pdl_supported(DEVICE):
        pytest.skip("PDL needs compute capability >= 9")
    if disable_pdl:
        monkeypatch.setenv("LINGC_DISABLE_PDL", "1")
    # Each link reads the previous link's output: MLA q_proj (B, split) -> MLP down with the
    # residual (B, split) -> fused KDA projections (A, split) and the lm_head argmax, which
    # reads the MLP output. One launch per op, so 4 kernels and 3 edges, all programmatic
    # (plain with the kill switch on); replays equal eager launches bit for bit.
    m = 6
    x, (w_q,) = make_inputs(m, 2560, (1536,), torch.bfloat16, seed=81)
    _, (w_down,) = make_inputs(m, 1536, (2560,), torch.bfloat16, seed=82)
    _, w_kda = make_inputs(m, 2560, (1024,) * 5 + (8,), torch.bfloat16, seed=83)
    _, (w_lm,) = make_inputs(m, 2560, (39296,), torch.bfloat16, seed=84)

    def chain(inp):
        h = torch.ops.lingc.gemm(inp, [w_q])
        h2 = torch.ops.lingc.gemm(h, [w_down], None, inp)
        kda = torch.ops.lingc.gemm(h2, w_kda)
        ids, best = torch.ops.lingc.gemm_argmax(h2, w_lm)
        return kda, ids, best

    static_x = x.clone()
    eager = chain(static_x)  # also compiles every kernel and allocates the tickets before capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph(keep_graph=True)
    with torch.cuda.graph(graph):
        static_out = chain(static_x)
    types = graph_edge_types(graph)
    edge_type = 0 if disable_pdl else 1
    assert types == [edge_type] * 3, f"edge types {types}, expected 3 of type {edge_type}"
    graph.instantiate()

    fresh, _ = make_inputs(m, 2560, (), torch.bfloat16, seed=85)
    for inp in (x, fresh):
        static_x.copy_(inp)
        graph.replay()
        torch.cuda.synchronize()
        for got, want in zip(static_out, chain(inp)):
            assert torch.equal(got, want)
    h2 = gemm_reference(gemm_reference(fresh, [w_q]), [w_down], residual=fresh)
    assert_close(static_out[0], gemm_reference(h2, w_kda), 2 * RTOL_GPU_BF16)
    for got, want in zip(eager, chain(x)):
        assert torch.equal(got, want)


_DESIGN_C_COMPILE_CHECK = textwrap.dedent("""
    import re
    from sm90 import compile_sm90, divisible_by_16, signature
    from lingc.runtime.kernels.gemm.gemv_kernel import _gemv_kernel, k_tiles_pow2
    from lingc.runtime.kernels.gemm.kernel import block_plan

    fn = _gemv_kernel
    for rows_list, k in (([1024] * 5 + [8], 2560), ([2560], 1024), ([2560], 192)):
        for rows, warps, ahead in ((4, 4, False), (4, 4, True), (4, 8, True), (8, 8, True), (2, 4, True)):
            starts, cols, _ = block_plan(rows_list, rows)
            nw = len(rows_list)
            ptrs = dict(x_ptr="*bf16", out_ptr="*bf16", bias_ptr="*bf16", res_ptr="*bf16", mul_ptr="*bf16")
            sig = signature(fn, ptrs, ["M", "K", "stride_xm", "stride_om"])
            sig.update(w_ptrs=("*bf16",) * nw, w_strides=("i32",) * nw, w_rows=("i32",) * nw,
                       block_starts="constexpr", col_starts="constexpr")
            k1, k2 = k_tiles_pow2(k)
            const = dict(block_starts=starts, col_starts=cols, stride_xk=1, stride_on=1, stride_b=0, stride_rm=0,
                         stride_rn=0, stride_gm=0, stride_gn=0, ROWS=rows, K1=k1, K2=k2, X_AHEAD=ahead,
                         HAS_BIAS=False,
                         HAS_RES=False, HAS_MUL=False, USE_GDC=True)
            attrs = divisible_by_16(fn, ["x_ptr", "out_ptr", "K", "stride_xm", "stride_om"])
            for a in ("w_ptrs", "w_strides"):
                for i in range(nw):
                    attrs[(fn.arg_names.index(a), i)] = [["tt.divisibility", 16]]
            ptx, info = compile_sm90(fn, sig, const, attrs, num_warps=warps)
            assert " 0 bytes spill stores" in info, (k, rows, info)
            # The rows are requested before the wait, in 16-byte loads wherever a thread holds
            # at least 8 bf16 of the first tile (not K=192's 4 or 8 rows of 128).
            head = ptx.split("griddepcontrol.wait")[0]
            assert "ld.global" in head, (k, rows)
            if rows * k1 >= 8 * 32 * warps:
                assert re.search(r"ld\\.global(\\.\\w+)*\\.v4", head), (k, rows)
            print(k, rows, warps, ahead, [l for l in info.splitlines() if "registers" in l])
""")


def test_design_c_compiles_for_sm90_without_spills():
    # Design C at the flash-tp4-rank shapes its sweep candidates run: no spills, 16-byte row
    # loads before griddepcontrol.wait (the real sm_90 compile and ptxas).
    run_sm90_compile_check(_DESIGN_C_COMPILE_CHECK)

_ARGMAX_COMPILE_CHECK = textwrap.dedent("""
    import re
    from sm90 import compile_sm90, divisible_by_16, signature
    from lingc.runtime.kernels.gemm.argmax_kernel import _gemm_argmax_kernel
    from lingc.runtime.kernels.gemm.config import argmax_config_for
    from lingc.runtime.kernels.gemm.kernel import k_plan

    fn = _gemm_argmax_kernel
    for n, k, dt in ((39296, 2560, "bf16"), (157184, 2560, "bf16"), (39296, 2560, "fp16")):
        cfg = argmax_config_for(n, k)
        block_k, k_tiles, _, even_k = k_plan(k, cfg)
        ptrs = dict(x_ptr="*" + dt, w_ptr="*" + dt, ids_ptr="*i64", max_ptr="*fp32", slot_ptr="*i64",
                    ticket_ptr="*i32")
        sig = signature(fn, ptrs, ["M", "N", "K", "stride_xm", "stride_wn"])
        const = dict(stride_xk=1, BLOCK_M=16, BLOCK_N=cfg.block_n, BLOCK_K=block_k, K_TILES=k_tiles,
                     EVEN_K=even_k, N_BLOCKS=-(-n // cfg.block_n), ROUND_TO_BF16=dt == "bf16",
                     ROUND_TO_F16=dt == "fp16", DOT_PRECISION="tf32", DOT_UPCAST=False, USE_GDC=True)
        attrs = divisible_by_16(fn, ["x_ptr", "w_ptr", "K", "stride_xm", "stride_wn"])
        ptx, info = compile_sm90(fn, sig, const, attrs, num_warps=cfg.num_warps, num_stages=cfg.num_stages)
        assert " 0 bytes spill stores" in info, (n, info)
        # One 64-bit integer max per row into the key slots, no float atomics; the first weight
        # tile is requested before the wait.
        assert re.search(r"atom\\.global(\\.\\w+)*\\.max\\.s64", ptx), n
        assert not re.search(r"atom\\.global(\\.\\w+)*\\.add\\.f32", ptx), n
        assert "cp.async" in ptx.split("griddepcontrol.wait")[0] or "ld.global" in ptx.split("griddepcontrol.wait")[0], n
        print(n, k, [l for l in info.splitlines() if "registers" in l])
""")


def test_argmax_compiles_for_sm90_with_integer_atomics():
    # The lm_head shapes: no spills, the packed keys folded with atom.max.s64 (sm_90 compile).
    run_sm90_compile_check(_ARGMAX_COMPILE_CHECK)

