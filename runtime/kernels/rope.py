"""Triton helpers for the rotary embedding of per-head rows, shared by the kernels that fold it
into their loads (head_cache_write's key rows, gqa_decode's queries). The math and its two pair
layouts: head_cache_write/naive.py (``rope_heads_reference``, ``rope_heads_table_reference``).

The angles' cos and sin come from ``inv_freq`` (computed in the kernel) or from a model's tables
(``rope_table``): TABLE 1 holds a value per pair (column index ``fidx``), TABLE 2 one per column
(Hugging Face's cos_cached, each half repeated: a column reads its own entry)."""
from __future__ import annotations

import triton
import triton.language as tl

__all__ = ["rope_cols", "rope_rotate", "rope_table", "rope_table_launch_args"]

@triton.jit
def rope_cols(offs_d, HALF: tl.constexpr, INTERLEAVED: tl.constexpr):
    """For each column of a head: (its pair partner's column, its inv_freq index, the sign of the
    partner's term, whether it is rotated). HALF = rope dims / 2; columns >= 2 * HALF pass
    through (partial rotary)."""
    rotated = offs_d < 2 * HALF
    if INTERLEAVED:
        first = (offs_d % 2) == 0
        partner = tl.where(first, offs_d + 1, offs_d - 1)
        fidx = offs_d // 2
    else:
        first = offs_d < HALF
        partner = tl.where(first, offs_d + HALF, offs_d - HALF)
        fidx = tl.where(first, offs_d, offs_d - HALF)
    sign = tl.where(first, -1.0, 1.0)
    return partner, fidx, sign, rotated


@triton.jit
def rope_rotate(x, x_partner, cos, sin, sign, rotated):
    """x cos + sign * partner sin on the rotated columns, x elsewhere (cos and sin of the angle
    position * inv_freq[fidx]); fp32 in and out (the caller rounds once to the rows' dtype)."""
    return tl.where(rotated, x * cos + sign * x_partner * sin, x)


@triton.jit
def rope_table(row, fidx, cols, mask, cos_ptr, sin_ptr, stride_cr, stride_cc, stride_sr, stride_sc,
               TABLE: tl.constexpr):
    """(cos, sin) in fp32 of the rotated columns from the tables' ``row`` (a token's position or,
    for a per-token input, its index): entry fidx (TABLE 1) or the column's own (TABLE 2).
    ``row`` and the column vectors broadcast against each other."""
    idx = fidx if TABLE == 1 else cols
    r = row.to(tl.int64)
    c = tl.load(cos_ptr + r * stride_cr + idx * stride_cc, mask=mask, other=0.0).to(tl.float32)
    s = tl.load(sin_ptr + r * stride_sr + idx * stride_sc, mask=mask, other=0.0).to(tl.float32)
    return c, s


def rope_table_launch_args(rope_cos, rope_sin, rope_dims: int, rope_by_token: bool) -> dict:
    """A launch's keyword arguments for ``rope_table`` (none without tables: TABLE stays 0, the
    angles from inv_freq or no RoPE); TABLE 1 for a value per pair (W = rope_dims / 2), 2 per
    column (the op checked W is one of the two)."""
    if rope_cos is None:
        return {}
    table = 1 if rope_cos.shape[1] == rope_dims // 2 else 2
    return dict(cos_ptr=rope_cos, sin_ptr=rope_sin, stride_cr=rope_cos.stride(0), stride_cc=rope_cos.stride(1),
                stride_sr=rope_sin.stride(0), stride_sc=rope_sin.stride(1), TABLE=table, BY_TOKEN=bool(rope_by_token))
