"""Triton decode GEMM: out[M, sum N_i] = epilogue(x @ cat(W_0..W_n).T), one PDL-chained launch.

Layout and derivation: README.md in this folder; reference: naive.py; configs: config.py.

Tiling. A CTA owns BLOCK_M = 16 rows of x, BLOCK_N rows of ONE weight and one K chunk. The
weights of a fused group (e.g. KDA q/k/v/f/g/b) stay separate tensors: the kernel gets them as a
tuple of pointers, the host gives every weight its own run of column blocks
(ceil(N_i / BLOCK_N), so a block never straddles two weights) and passes the first block and
first output column of each; a CTA finds its weight with a chain of comparisons (``_pick``),
unrolled at compile time over the tuple's length. No weight is copied or re-laid.

Designs (config.py): A loops over K_TILES tiles of BLOCK_K with a software pipeline; B is the
same code with one tile of the whole chunk (K_TILES = 1, BLOCK_K = chunk, one stage), so its
entire weight chunk is requested before ``gdc_wait``; C (whole rows, CUDA cores, no split) is
gemv_kernel.py's, launched from ``gemm_triton`` too. Split-K partials (fp32) go to a workspace;
the CTA that draws the last integer ticket of its output tile adds them in chunk order
0..SPLIT_K-1 and runs the epilogue, in the same launch.

Batch invariance (design.md): BLOCK_M is 16 for every M (rows past M are masked to zero), the
config is a function of (N, K) only, M is excluded from Triton's value specialisation, K tiles
are folded into the fp32 accumulator in increasing order, and split-K partials are summed in a
fixed order (no atomics on values). A row's bits are the same for M = 1 and M = 16.
"""
import torch
import triton
import triton.language as tl

from lingc.runtime.kernels.gemm_common import BLOCK_M, dot_acc, split_k_tickets
from lingc.runtime.pdl import interpreting, pdl_launch_dependents, pdl_supported, pdl_wait

from .config import GemmConfig, config_for
from .op import MAX_WEIGHTS

__all__ = ["gemm_triton", "block_plan", "k_plan", "dot_flags", "resolve_pdl"]


@triton.jit
def _pick(pid_n, block_starts, values):
    """values[i] for the weight i that owns column block pid_n: the last i with
    block_starts[i] <= pid_n (block_starts[0] = 0). Unrolled over the tuple at compile time."""
    v = values[0]
    for i in tl.static_range(1, len(values)):
        v = tl.where(pid_n >= block_starts[i], values[i], v)
    return v


@triton.jit
def _weight_block(pid_n, w_ptrs, w_strides, w_rows, block_starts, col_starts, BLOCK_N: tl.constexpr):
    """Column block pid_n of a launch over a list of weights: (its weight's pointer, that
    weight's row stride, the block's BLOCK_N row indices in it, their mask, their output
    columns). Each weight has its own run of blocks (``block_plan``)."""
    w_ptr = _pick(pid_n, block_starts, w_ptrs)
    stride_wn = _pick(pid_n, block_starts, w_strides)
    rows = (pid_n - _pick(pid_n, block_starts, block_starts)) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = rows < _pick(pid_n, block_starts, w_rows)
    cols = _pick(pid_n, block_starts, col_starts) + rows
    return w_ptr, stride_wn, rows, mask_n, cols


@triton.jit
def _block_dot(
    x_ptr, w_ptr, stride_wn, rows, mask_n, offs_m, mask_m, k_first, K, stride_xm, stride_xk,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, K_TILES: tl.constexpr,
    EVEN_K: tl.constexpr, DOT_PRECISION: tl.constexpr, DOT_UPCAST: tl.constexpr, USE_GDC: tl.constexpr,
):
    """fp32 [BLOCK_M, BLOCK_N] = x[offs_m, chunk] @ w[rows, chunk].T over the K_TILES tiles
    starting at k_first, in increasing k. The weight has unit K stride (checked by the op), so
    its rows load as contiguous vectors.

    Issues the first weight tile (design B: the whole chunk) before waiting for the producer,
    then triggers the dependents at once: the next kernel's CTAs are only scheduled after all of
    ours have triggered, so they take no slot we need and start their own weight prefetch while
    we stream (runtime/pdl.py)."""
    offs_k = k_first + tl.arange(0, BLOCK_K)
    w_ptrs = w_ptr + rows[:, None] * stride_wn + offs_k[None, :]
    x_ptrs = x_ptr + offs_m[:, None] * stride_xm + offs_k[None, :] * stride_xk
    mask_wk = mask_n[:, None]
    mask_xk = mask_m[:, None]
    if not EVEN_K:
        mask_wk = mask_wk & (offs_k[None, :] < K)
        mask_xk = mask_xk & (offs_k[None, :] < K)
    w = tl.load(w_ptrs, mask=mask_wk, other=0.0)
    pdl_wait(USE_GDC)
    pdl_launch_dependents(USE_GDC)
    x = tl.load(x_ptrs, mask=mask_xk, other=0.0)
    acc = dot_acc(x, w, tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32), DOT_PRECISION, DOT_UPCAST)
    for _ in range(1, K_TILES):
        offs_k += BLOCK_K
        w_ptrs += BLOCK_K
        x_ptrs += BLOCK_K * stride_xk
        if not EVEN_K:
            mask_wk = mask_n[:, None] & (offs_k[None, :] < K)
            mask_xk = mask_m[:, None] & (offs_k[None, :] < K)
        w = tl.load(w_ptrs, mask=mask_wk, other=0.0)
        x = tl.load(x_ptrs, mask=mask_xk, other=0.0)
        acc = dot_acc(x, w, acc, DOT_PRECISION, DOT_UPCAST)
    return acc


@triton.jit
def _epilogue(
    acc, offs_m, cols, mask_m, mask_n,
    bias_ptr, res_ptr, mul_ptr, stride_b, stride_rm, stride_rn, stride_gm, stride_gn,
    HAS_BIAS: tl.constexpr, HAS_RES: tl.constexpr, HAS_MUL: tl.constexpr,
):
    """naive.gemm_epilogue in fp32: + bias, then sigmoid(.) * sigmoid_mul, then + residual."""
    mask = mask_m[:, None] & mask_n[None, :]
    if HAS_BIAS:
        acc += tl.load(bias_ptr + cols * stride_b, mask=mask_n, other=0.0).to(tl.float32)[None, :]
    if HAS_MUL:
        g = tl.load(mul_ptr + offs_m[:, None] * stride_gm + cols[None, :] * stride_gn, mask=mask, other=0.0)
        acc = tl.sigmoid(acc) * g.to(tl.float32)
    if HAS_RES:
        r = tl.load(res_ptr + offs_m[:, None] * stride_rm + cols[None, :] * stride_rn, mask=mask, other=0.0)
        acc += r.to(tl.float32)
    return acc


@triton.jit(do_not_specialize=["M"])
def _gemm_kernel(
    x_ptr, out_ptr, ws_ptr, ticket_ptr, bias_ptr, res_ptr, mul_ptr,
    w_ptrs, w_strides, w_rows, block_starts, col_starts,
    M, K,
    stride_xm, stride_xk, stride_om, stride_on, stride_ws_s, stride_ws_m,
    stride_b, stride_rm, stride_rn, stride_gm, stride_gn,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, K_TILES: tl.constexpr,
    SPLIT_K: tl.constexpr, EVEN_K: tl.constexpr,
    HAS_BIAS: tl.constexpr, HAS_RES: tl.constexpr, HAS_MUL: tl.constexpr,
    DOT_PRECISION: tl.constexpr, DOT_UPCAST: tl.constexpr, USE_GDC: tl.constexpr,
):
    # Axis 0 is M so the CTAs that share a weight block (M > 16) are scheduled together.
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    pid_k = tl.program_id(2)

    w_ptr, stride_wn, rows, mask_n, cols = _weight_block(pid_n, w_ptrs, w_strides, w_rows, block_starts,
                                                         col_starts, BLOCK_N)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    mask_m = offs_m < M

    acc = _block_dot(
        x_ptr, w_ptr, stride_wn, rows, mask_n, offs_m, mask_m, pid_k * K_TILES * BLOCK_K, K,
        stride_xm, stride_xk, BLOCK_M, BLOCK_N, BLOCK_K, K_TILES, EVEN_K, DOT_PRECISION, DOT_UPCAST, USE_GDC,
    )

    out_ptrs = out_ptr + offs_m[:, None] * stride_om + cols[None, :] * stride_on
    mask = mask_m[:, None] & mask_n[None, :]
    if SPLIT_K == 1:
        y = _epilogue(acc, offs_m, cols, mask_m, mask_n, bias_ptr, res_ptr, mul_ptr, stride_b,
                      stride_rm, stride_rn, stride_gm, stride_gn, HAS_BIAS, HAS_RES, HAS_MUL)
        tl.store(out_ptrs, y.to(x_ptr.dtype.element_ty).to(out_ptr.dtype.element_ty), mask=mask)
    else:
        ws_ptrs = ws_ptr + offs_m[:, None] * stride_ws_m + cols[None, :]
        tl.store(ws_ptrs + pid_k * stride_ws_s, acc, mask=mask)
        # Every thread's partial is stored before the ticket is taken (barrier), and the ticket
        # is acq_rel at GPU scope: the chunk that draws the last ticket sees every partial.
        tl.debug_barrier()
        tile = pid_m * tl.num_programs(1) + pid_n
        ticket = tl.atomic_add(ticket_ptr + tile, 1, sem="acq_rel", scope="gpu")
        if ticket == SPLIT_K - 1:
            # .cg: read the partials from L2, where the other CTAs' stores landed.
            total = tl.load(ws_ptrs, mask=mask, other=0.0, cache_modifier=".cg")
            for s in tl.static_range(1, SPLIT_K):
                total += tl.load(ws_ptrs + s * stride_ws_s, mask=mask, other=0.0, cache_modifier=".cg")
            y = _epilogue(total, offs_m, cols, mask_m, mask_n, bias_ptr, res_ptr, mul_ptr, stride_b,
                          stride_rm, stride_rn, stride_gm, stride_gn, HAS_BIAS, HAS_RES, HAS_MUL)
            tl.store(out_ptrs, y.to(x_ptr.dtype.element_ty).to(out_ptr.dtype.element_ty), mask=mask)
            tl.atomic_xchg(ticket_ptr + tile, 0, sem="relaxed", scope="gpu")  # ready for the next call


def block_plan(rows: list[int], block_n: int) -> tuple[tuple[int, ...], tuple[int, ...], int]:
    """(first column block of each weight, first output column of each weight, total blocks)
    for weights of ``rows`` rows tiled by ``block_n``: each weight gets its own blocks."""
    block_starts, col_starts, blocks, cols = [], [], 0, 0
    for n in rows:
        block_starts.append(blocks)
        col_starts.append(cols)
        blocks += triton.cdiv(n, block_n)
        cols += n
    return tuple(block_starts), tuple(col_starts), blocks


def k_plan(k: int, cfg: GemmConfig) -> tuple[int, int, int, bool]:
    """(BLOCK_K, K_TILES per chunk, chunks, EVEN_K) for a K of ``k`` under ``cfg``. Chunks are
    whole tiles; splits that would be empty are dropped (still a function of (K, config))."""
    if cfg.prefetch:
        block_k = max(16, triton.next_power_of_2(triton.cdiv(k, cfg.split_k)))
        split_k = max(1, triton.cdiv(k, block_k))
        return block_k, 1, split_k, k > 0 and split_k * block_k == k
    k_tiles = max(1, triton.cdiv(k, cfg.block_k))
    chunk_tiles = triton.cdiv(k_tiles, cfg.split_k)
    split_k = triton.cdiv(k_tiles, chunk_tiles)
    # Unmasked K only when every chunk is whole tiles inside K (K = 0 must take the masks).
    even_k = k > 0 and k % cfg.block_k == 0 and split_k * chunk_tiles == k_tiles
    return cfg.block_k, chunk_tiles, split_k, even_k


def dot_flags(dtype: torch.dtype) -> dict:
    """DOT_PRECISION / DOT_UPCAST for operands of ``dtype`` (gemm_common.dot_acc)."""
    return {
        "DOT_PRECISION": "ieee" if dtype == torch.float32 else "tf32",
        "DOT_UPCAST": interpreting() and dtype != torch.float32,
    }


def resolve_pdl(device: torch.device, use_pdl: bool | None) -> tuple[bool, dict]:
    """(USE_GDC, launch kwargs): PDL where ``runtime.pdl`` allows it, unless overridden."""
    if use_pdl is None:
        use_pdl = pdl_supported(device)
    assert not use_pdl or pdl_supported(device), "PDL requested on a device without PDL support"
    return use_pdl, ({"launch_pdl": True} if use_pdl else {})


def gemm_triton(
    x: torch.Tensor,
    weights: list[torch.Tensor],
    bias: torch.Tensor | None = None,
    residual: torch.Tensor | None = None,
    sigmoid_mul: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    *,
    config: GemmConfig | None = None,
    use_pdl: bool | None = None,
) -> torch.Tensor:
    """Launch on x [M, K] and 1..MAX_WEIGHTS weights [N_i, K] (unit K stride, any row stride);
    returns out [M, sum N_i] in x.dtype (naive.gemm_reference).

    ``out`` may be any strided [M, sum N] tensor of x.dtype (tests pass NaN-filled buffers and
    windows of larger ones), or of float32: the values rounded to x.dtype, stored as fp32
    (``gemm_rows_into``: a relay buffer of fp32 logits). ``config`` overrides the table (tests, tuning); ``use_pdl``
    defaults to ``pdl_supported(x.device)``. Arguments are assumed validated by the op.
    """
    m, k = x.shape
    rows = [w.shape[0] for w in weights]
    n = sum(rows)
    assert 1 <= len(weights) <= MAX_WEIGHTS, len(weights)
    assert all(w.shape[1] == k and w.dtype == x.dtype and (w.stride(1) == 1 or k <= 1) for w in weights), (
        x.shape, [(w.shape, w.dtype, w.stride()) for w in weights])
    if out is None:
        out = torch.empty((m, n), device=x.device, dtype=x.dtype)
    assert out.shape == (m, n) and out.dtype in (x.dtype, torch.float32), (out.shape, out.dtype)
    if m == 0 or n == 0:
        return out
    cfg = config if config is not None else config_for(n, k)
    if cfg.gemv:
        assert cfg.block_n >= 1 and cfg.block_n & (cfg.block_n - 1) == 0 and cfg.split_k == 1, cfg
        from .gemv_kernel import gemv_triton

        return gemv_triton(x, weights, bias, residual, sigmoid_mul, out, cfg, use_pdl)
    assert cfg.block_n >= 16 and (cfg.prefetch or cfg.block_k >= 16), cfg
    use_gdc, launch = resolve_pdl(x.device, use_pdl)

    block_starts, col_starts, blocks = block_plan(rows, cfg.block_n)
    block_k, k_tiles, split_k, even_k = k_plan(k, cfg)
    grid = (triton.cdiv(m, BLOCK_M), blocks, split_k)
    if split_k > 1:
        ws = torch.empty((split_k, m, n), device=x.device, dtype=torch.float32)
        tickets = split_k_tickets(x.device, grid[0] * grid[1])
    else:
        ws, tickets = out, out  # unused (SPLIT_K == 1 compiles the split-K branch out)
    # Absent epilogue operands: any pointer of the right kind; their branch is compiled out.
    bias_t, res_t, mul_t = (t if t is not None else out for t in (bias, residual, sigmoid_mul))
    _gemm_kernel[grid](
        x, out, ws, tickets, bias_t, res_t, mul_t,
        tuple(weights), tuple(w.stride(0) for w in weights), tuple(rows), block_starts, col_starts,
        m, k,
        x.stride(0), x.stride(1), out.stride(0), out.stride(1),
        ws.stride(0) if split_k > 1 else 0, ws.stride(1) if split_k > 1 else 0,
        bias.stride(0) if bias is not None else 0,
        *(residual.stride() if residual is not None else (0, 0)),
        *(sigmoid_mul.stride() if sigmoid_mul is not None else (0, 0)),
        BLOCK_M=BLOCK_M, BLOCK_N=cfg.block_n, BLOCK_K=block_k, K_TILES=k_tiles,
        SPLIT_K=split_k, EVEN_K=even_k,
        HAS_BIAS=bias is not None, HAS_RES=residual is not None, HAS_MUL=sigmoid_mul is not None,
        USE_GDC=use_gdc, **dot_flags(x.dtype),
        num_warps=cfg.num_warps, num_stages=cfg.num_stages, **launch,
    )
    return out
