"""Casts to fp8 with dynamic scales, for ``float8.quantize``, of a matrix given by any strides (a
transposed view is read as such and written row-major, so a backward's transposed operand costs no
separate copy).

Rowwise scales take one kernel: each program owns a block of rows, finds their absolute maxima in a
first sweep along them, then sweeps again to cast; the second sweep reads what the first brought into
L2, so the matrix crosses DRAM once (2 bytes read, 1 written per element).  A tensorwise scale needs
the whole matrix's maximum before any element is cast: one kernel for the maximum, one for the cast.
"""

import triton
import triton.language as tl


@triton.jit
def _scale_of(amax, LIMIT: tl.constexpr):
    """The dequantizing scale mapping ``amax`` to the format's largest value; 1 for an all-zero row."""
    return tl.where(amax > 0, amax / LIMIT, 1.0)


@triton.jit
def _row_maxima(x_rows, row_ok, C, stride_c, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    """max_c |x[r, c]| of a block of rows (``x_rows``: their start pointers), BLOCK_C columns at a time."""
    cols = tl.arange(0, BLOCK_C)
    best = tl.zeros((BLOCK_R,), dtype=tl.float32)
    for c0 in range(0, C, BLOCK_C):
        mask = row_ok[:, None] & (cols[None, :] + c0 < C)
        x = tl.load(x_rows + (cols[None, :] + c0) * stride_c, mask=mask, other=0.0)
        best = tl.maximum(best, tl.max(tl.abs(x.to(tl.float32)), axis=1))
    return best


@triton.jit
def rowwise_cast_kernel(
    x_ptr,
    q_ptr,
    scale_ptr,
    R,
    C,
    stride_r,
    stride_c,
    LIMIT: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    """scale[r] = max_c |x[r, c]| / LIMIT (1 for an all-zero row); q = clamp(x / scale, +-LIMIT) in q's
    fp8 dtype, row-major (R, C).  BLOCK_R rows a program."""
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    cols = tl.arange(0, BLOCK_C)
    row_ok = rows < R
    x_rows = x_ptr + rows[:, None].to(tl.int64) * stride_r
    scale = _scale_of(_row_maxima(x_rows, row_ok, C, stride_c, BLOCK_R, BLOCK_C), LIMIT)
    tl.store(scale_ptr + rows, scale, mask=row_ok)
    q_rows = q_ptr + rows[:, None].to(tl.int64) * C
    for c0 in range(0, C, BLOCK_C):
        mask = row_ok[:, None] & (cols[None, :] + c0 < C)
        x = tl.load(x_rows + (cols[None, :] + c0) * stride_c, mask=mask, other=0.0)
        q = tl.clamp(x.to(tl.float32) / scale[:, None], -LIMIT, LIMIT)
        tl.store(q_rows + cols[None, :] + c0, q.to(q_ptr.dtype.element_ty), mask=mask)


@triton.jit
def amax_kernel(x_ptr, amax_ptr, R, C, stride_r, stride_c, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    """|x|'s maximum over the matrix: an atomic max into ``amax_ptr[0]``, which starts at 0."""
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    x_rows = x_ptr + rows[:, None].to(tl.int64) * stride_r
    best = _row_maxima(x_rows, rows < R, C, stride_c, BLOCK_R, BLOCK_C)
    tl.atomic_max(amax_ptr, tl.max(best, axis=0))


@triton.jit
def cast_kernel(
    x_ptr,
    q_ptr,
    amax_ptr,
    scale_ptr,
    R,
    C,
    stride_r,
    stride_c,
    LIMIT: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    """q = clamp(x / scale, +-LIMIT) in q's fp8 dtype, row-major (R, C), with the scale of the matrix's
    maximum (``amax_kernel``); the first program stores that scale."""
    scale = _scale_of(tl.load(amax_ptr), LIMIT)
    if (tl.program_id(0) == 0) & (tl.program_id(1) == 0):
        tl.store(scale_ptr, scale)
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    cols = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    mask = (rows[:, None] < R) & (cols[None, :] < C)
    x = tl.load(x_ptr + rows[:, None] * stride_r + cols[None, :] * stride_c, mask=mask, other=0.0)
    q = tl.clamp(x.to(tl.float32) / scale, -LIMIT, LIMIT)
    tl.store(q_ptr + rows[:, None] * C + cols[None, :], q.to(q_ptr.dtype.element_ty), mask=mask)


__all__ = ["amax_kernel", "cast_kernel", "rowwise_cast_kernel"]
