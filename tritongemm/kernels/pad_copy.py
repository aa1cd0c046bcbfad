"""Copy up to two strided batches of matrices in one launch (the aligned workspaces of docs/unaligned.md).

``launch/aligned.py`` copies operands whose leading dimension is not a
multiple of 16 bytes into aligned workspaces (and a padded C back out).  A
torch copy per operand costs a launch and several microseconds of host time
each; here one launch copies A and B together (or C and the pre-activation):
programs ``[0, tiles of matrix 0)`` copy matrix 0 and the rest matrix 1.

Each program copies one ``BLOCK_OUTER x BLOCK_INNER`` tile, masked only at
the edges.  The inner axis is the source's unit-stride one where it has one
(``ROWS_FAST_*`` says it is the rows), so consecutive lanes load consecutive
addresses; the padding columns of a destination are never written (the GEMM
kernels mask, and TMA zero-fills, everything past the logical shape).
"""

import triton
import triton.language as tl


@triton.jit
def _tile_count(
    rows, cols, batch, BLOCK_OUTER: tl.constexpr, BLOCK_INNER: tl.constexpr, ROWS_FAST: tl.constexpr
):
    if ROWS_FAST:
        return batch * tl.cdiv(cols, BLOCK_OUTER) * tl.cdiv(rows, BLOCK_INNER)
    return batch * tl.cdiv(rows, BLOCK_OUTER) * tl.cdiv(cols, BLOCK_INNER)


@triton.jit
def _copy_tile(
    src_ptr,
    dst_ptr,
    tile,
    outer,
    inner,
    src_batch,
    src_outer,
    src_inner,
    dst_batch,
    dst_outer,
    dst_inner,
    BLOCK_OUTER: tl.constexpr,
    BLOCK_INNER: tl.constexpr,
    INDEX_64: tl.constexpr,
):
    """Tile ``tile`` of a (batch, outer, inner) matrix, inner-major tile order within each matrix."""
    tiles_inner = tl.cdiv(inner, BLOCK_INNER)
    per_matrix = tl.cdiv(outer, BLOCK_OUTER) * tiles_inner
    b = tile // per_matrix
    t = tile % per_matrix
    pid_outer = t // tiles_inner
    pid_inner = t % tiles_inner
    if INDEX_64:
        # Some matrix spans more than 2^31 elements: int32 offsets would wrap.
        b = b.to(tl.int64)
        pid_outer = pid_outer.to(tl.int64)
        pid_inner = pid_inner.to(tl.int64)
    offs_o = pid_outer * BLOCK_OUTER + tl.arange(0, BLOCK_OUTER)
    offs_i = pid_inner * BLOCK_INNER + tl.arange(0, BLOCK_INNER)
    src = src_ptr + b * src_batch + offs_o[:, None] * src_outer + offs_i[None, :] * src_inner
    dst = dst_ptr + b * dst_batch + offs_o[:, None] * dst_outer + offs_i[None, :] * dst_inner
    if (pid_outer + 1) * BLOCK_OUTER <= outer and (pid_inner + 1) * BLOCK_INNER <= inner:
        # Interior tiles unmasked: the stores into the aligned side then vectorize (a mask against a
        # runtime size keeps every access scalar).  H100, bf16, odd leading dimension: 2047^2 in
        # 5.8 us against 17.9 masked (torch's copy_ 8.2), 8191x1023 10.6 against 31.8 (17.3).
        tl.store(dst, tl.load(src))
    else:
        mask = (offs_o[:, None] < outer) & (offs_i[None, :] < inner)
        tl.store(dst, tl.load(src, mask=mask), mask=mask)


@triton.jit
def _copy_matrix(
    src_ptr,
    dst_ptr,
    tile,
    rows,
    cols,
    src_sb,
    src_sr,
    src_sc,
    dst_sb,
    dst_sr,
    dst_sc,
    BLOCK_OUTER: tl.constexpr,
    BLOCK_INNER: tl.constexpr,
    ROWS_FAST: tl.constexpr,
    INDEX_64: tl.constexpr,
):
    if ROWS_FAST:  # walk the transpose: its inner axis is the source's rows
        _copy_tile(
            src_ptr, dst_ptr, tile, cols, rows, src_sb, src_sc, src_sr, dst_sb, dst_sc, dst_sr,
            BLOCK_OUTER, BLOCK_INNER, INDEX_64,
        )  # fmt: skip
    else:
        _copy_tile(
            src_ptr, dst_ptr, tile, rows, cols, src_sb, src_sr, src_sc, dst_sb, dst_sr, dst_sc,
            BLOCK_OUTER, BLOCK_INNER, INDEX_64,
        )  # fmt: skip


@triton.jit
def pad_copy_kernel(
    src0_ptr,
    dst0_ptr,
    rows0,
    cols0,
    batch0,
    src0_sb,
    src0_sr,
    src0_sc,
    dst0_sb,
    dst0_sr,
    dst0_sc,
    src1_ptr,
    dst1_ptr,
    rows1,
    cols1,
    batch1,
    src1_sb,
    src1_sr,
    src1_sc,
    dst1_sb,
    dst1_sr,
    dst1_sc,
    BLOCK_OUTER: tl.constexpr,
    BLOCK_INNER: tl.constexpr,
    ROWS_FAST0: tl.constexpr,
    ROWS_FAST1: tl.constexpr,
    HAS_1: tl.constexpr,
    INDEX_64: tl.constexpr,
):
    """dst_i[b, r, c] = src_i[b, r, c] for matrix 0 and, when ``HAS_1``, matrix 1; the grid is the
    two matrices' tile counts added (``_tile_count``)."""
    pid = tl.program_id(0)
    tiles0 = _tile_count(rows0, cols0, batch0, BLOCK_OUTER, BLOCK_INNER, ROWS_FAST0)
    if pid < tiles0:
        _copy_matrix(
            src0_ptr, dst0_ptr, pid, rows0, cols0, src0_sb, src0_sr, src0_sc, dst0_sb, dst0_sr, dst0_sc,
            BLOCK_OUTER, BLOCK_INNER, ROWS_FAST0, INDEX_64,
        )  # fmt: skip
    elif HAS_1:
        _copy_matrix(
            src1_ptr, dst1_ptr, pid - tiles0, rows1, cols1, src1_sb, src1_sr, src1_sc, dst1_sb, dst1_sr,
            dst1_sc, BLOCK_OUTER, BLOCK_INNER, ROWS_FAST1, INDEX_64,
        )  # fmt: skip
