"""Casts to fp8 with dynamic scales, for ``float8.quantize``, of a matrix given by any strides (a
transposed view is read as such and written row-major, so a backward's transposed operand costs no
separate copy).

Rowwise scales of a matrix with many rows take one kernel (``rowwise_cast_kernel``): each program owns
a block of rows, finds their absolute maxima in a first sweep along them, then sweeps again to cast;
the second sweep reads what the first brought into L2, so the matrix crosses DRAM once (2 bytes read,
1 written per element).  Otherwise -- a tensorwise scale, which needs the whole matrix's maximum
before any element is cast, or too few rows to fill the GPU with blocks of them (a transposed view:
its rows are strided, so a block must hold many) -- two kernels over a 2-D grid: the maxima
(``amax_kernel``, atomic), then the cast (``cast_kernel``).

Block scales (a scale per 1 x 128 or 128 x 128 block) need no global maximum: one kernel
(``block_cast_kernel``) holds each block whole, finds its maxima and casts it.
"""

import triton
import triton.language as tl


@triton.jit
def _scale_of(amax, LIMIT: tl.constexpr):
    """The dequantizing scale mapping ``amax`` to the format's largest value; 1 for an all-zero row (a
    NaN maximum gives a NaN scale, an inf one an inf scale: ``frontend.float8.quantize_torch``'s rule)."""
    return tl.where(amax == 0, 1.0, amax / LIMIT)


@triton.jit
def _max_keep_nan(a, b):
    return tl.maximum(a, b, propagate_nan=tl.PropagateNan.ALL)


@triton.jit
def _abs_max(x, axis: tl.constexpr):
    """max |x| along ``axis``, NaN where a NaN is among them (as torch's ``amax``: ``tl.max`` skips it)."""
    return tl.reduce(tl.abs(x), axis, _max_keep_nan)


@triton.jit
def _cast(x, scale, LIMIT: tl.constexpr):
    """clamp(x / scale, +-LIMIT), the division rounded as torch's (``/`` is approximate on NVIDIA), NaN
    kept (so a NaN or inf input reaches the GEMM's output, as on torch's path)."""
    return tl.clamp(tl.div_rn(x, scale), -LIMIT, LIMIT, propagate_nan=tl.PropagateNan.ALL)


@triton.jit
def _row_maxima(x_rows, row_ok, c_start, c_end, stride_c, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    """max |x[r, c]| over c in [c_start, c_end) for a block of rows (``x_rows``: their start pointers)."""
    cols = tl.arange(0, BLOCK_C)
    best = tl.zeros((BLOCK_R,), dtype=tl.float32)
    for c0 in range(c_start, c_end, BLOCK_C):
        mask = row_ok[:, None] & (cols[None, :] + c0 < c_end)
        x = tl.load(x_rows + (cols[None, :] + c0) * stride_c, mask=mask, other=0.0)
        best = _max_keep_nan(best, _abs_max(x.to(tl.float32), 1))
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
    scale = _scale_of(_row_maxima(x_rows, row_ok, 0, C, stride_c, BLOCK_R, BLOCK_C), LIMIT)
    tl.store(scale_ptr + rows, scale, mask=row_ok)
    q_rows = q_ptr + rows[:, None].to(tl.int64) * C
    for c0 in range(0, C, BLOCK_C):
        mask = row_ok[:, None] & (cols[None, :] + c0 < C)
        x = tl.load(x_rows + (cols[None, :] + c0) * stride_c, mask=mask, other=0.0)
        q = _cast(x.to(tl.float32), scale[:, None], LIMIT)
        tl.store(q_rows + cols[None, :] + c0, q.to(q_ptr.dtype.element_ty), mask=mask)


@triton.jit
def amax_kernel(
    x_ptr,
    amax_ptr,
    R,
    C,
    stride_r,
    stride_c,
    ROWWISE: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_C: tl.constexpr,
    SPAN_C: tl.constexpr,
):
    """|x|'s maxima, atomically into ``amax_ptr`` (zeros first): per row (ROWWISE: ``amax_ptr[r]``) or
    over the matrix (``amax_ptr[0]``).  A program covers BLOCK_R rows by SPAN_C columns."""
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    c_start = tl.program_id(1) * SPAN_C
    x_rows = x_ptr + rows[:, None].to(tl.int64) * stride_r
    best = _row_maxima(x_rows, rows < R, c_start, tl.minimum(c_start + SPAN_C, C), stride_c, BLOCK_R, BLOCK_C)
    # (|NaN| is a positive NaN, whose bits order above +inf's: the atomic max keeps it)
    if ROWWISE:
        tl.atomic_max(amax_ptr + rows, best, mask=rows < R)
    else:
        tl.atomic_max(amax_ptr, tl.reduce(best, 0, _max_keep_nan))


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
    ROWWISE: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    """q = clamp(x / scale, +-LIMIT) in q's fp8 dtype, row-major (R, C), with the scales of
    ``amax_kernel``'s maxima (per row, or one); the programs of the first column block store them."""
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    cols = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    if ROWWISE:
        scale = _scale_of(tl.load(amax_ptr + rows, mask=rows < R, other=0.0), LIMIT)
        if tl.program_id(1) == 0:
            tl.store(scale_ptr + rows, scale, mask=rows < R)
        scale = scale[:, None]
    else:
        scale = _scale_of(tl.load(amax_ptr), LIMIT)
        if (tl.program_id(0) == 0) & (tl.program_id(1) == 0):
            tl.store(scale_ptr, scale)
    mask = (rows[:, None] < R) & (cols[None, :] < C)
    x = tl.load(x_ptr + rows[:, None] * stride_r + cols[None, :] * stride_c, mask=mask, other=0.0)
    q = _cast(x.to(tl.float32), scale, LIMIT)
    tl.store(q_ptr + rows[:, None] * C + cols[None, :], q.to(q_ptr.dtype.element_ty), mask=mask)


@triton.jit
def block_cast_kernel(
    x_ptr,
    q_ptr,
    scale_ptr,
    R,
    C,
    stride_r,
    stride_c,
    stride_sr,
    stride_sc,
    LIMIT: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_C: tl.constexpr,
    SCALE_ROWS: tl.constexpr,
):
    """q = clamp(x / scale, +-LIMIT) in q's fp8 dtype, row-major (R, C), a scale per SCALE_ROWS (1 or
    BLOCK_R) rows by BLOCK_C columns: scale[i, j] (at ``i * stride_sr + j * stride_sc``) = that
    block's max |x| / LIMIT, 1 for an all-zero block.  A program holds BLOCK_R x BLOCK_C of x."""
    pid_r = tl.program_id(0)
    pid_c = tl.program_id(1)
    rows = pid_r * BLOCK_R + tl.arange(0, BLOCK_R)
    cols = pid_c * BLOCK_C + tl.arange(0, BLOCK_C)
    mask = (rows[:, None] < R) & (cols[None, :] < C)
    x = tl.load(
        x_ptr + rows[:, None].to(tl.int64) * stride_r + cols[None, :].to(tl.int64) * stride_c,
        mask=mask,
        other=0.0,
    ).to(tl.float32)
    row_max = _abs_max(x, 1)
    if SCALE_ROWS == 1:
        scale = _scale_of(row_max, LIMIT)
        tl.store(scale_ptr + rows * stride_sr + pid_c * stride_sc, scale, mask=rows < R)
        q = _cast(x, scale[:, None], LIMIT)
    else:
        scale = _scale_of(tl.reduce(row_max, 0, _max_keep_nan), LIMIT)
        tl.store(scale_ptr + pid_r * stride_sr + pid_c * stride_sc, scale)
        q = _cast(x, scale, LIMIT)
    tl.store(q_ptr + rows[:, None].to(tl.int64) * C + cols[None, :], q.to(q_ptr.dtype.element_ty), mask=mask)


__all__ = ["amax_kernel", "block_cast_kernel", "cast_kernel", "rowwise_cast_kernel"]
