"""Casts to fp8 with dynamic scales, for ``float8.quantize``: one read for the absolute maxima, one read
and a one-byte write for the cast, of a matrix given by any strides (a transposed view is read as such
and written row-major, so a backward's transposed operand costs no separate copy)."""

import triton
import triton.language as tl


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
):
    """|x|'s maximum per row (ROWWISE: ``amax_ptr[r]``) or over the matrix (an atomic max into
    ``amax_ptr[0]``, which starts at 0), BLOCK_R rows a program."""
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    cols = tl.arange(0, BLOCK_C)
    best = tl.zeros((BLOCK_R,), dtype=tl.float32)
    for c0 in range(0, C, BLOCK_C):
        mask = (rows[:, None] < R) & (cols[None, :] + c0 < C)
        x = tl.load(x_ptr + rows[:, None] * stride_r + (cols[None, :] + c0) * stride_c, mask=mask, other=0.0)
        best = tl.maximum(best, tl.max(tl.abs(x.to(tl.float32)), axis=1))
    if ROWWISE:
        tl.store(amax_ptr + rows, best, mask=rows < R)
    else:
        tl.atomic_max(amax_ptr, tl.max(best, axis=0))


@triton.jit
def cast_kernel(
    x_ptr,
    q_ptr,
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
    """q = clamp(x / scale, -LIMIT, LIMIT) in q's fp8 dtype, q row-major (R, C); ``scale_ptr`` holds one
    scale per row (ROWWISE) or one."""
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    cols = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    mask = (rows[:, None] < R) & (cols[None, :] < C)
    x = tl.load(x_ptr + rows[:, None] * stride_r + cols[None, :] * stride_c, mask=mask, other=0.0)
    if ROWWISE:
        scale = tl.load(scale_ptr + rows, mask=rows < R, other=1.0)[:, None]
    else:
        scale = tl.load(scale_ptr)
    q = tl.clamp(x.to(tl.float32) / scale, -LIMIT, LIMIT)
    tl.store(q_ptr + rows[:, None] * C + cols[None, :], q.to(q_ptr.dtype.element_ty), mask=mask)


__all__ = ["amax_kernel", "cast_kernel"]
