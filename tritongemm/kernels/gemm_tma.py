"""The Hopper (sm90) GEMM kernel: TMA tensor descriptors, optionally persistent.

Operands arrive as host-built tensor descriptors (``TensorDescriptor``): the
copy engine moves whole tiles global->shared, zero-filling past the edges, so
the mainloop has no masks and no address arithmetic.  A descriptor needs a
unit last stride, so a "transposed" operand is described as the row-major
matrix it really is and its tile is transposed in shared memory
(``A_KMAJOR=False`` / ``B_KMAJOR=False``); wgmma reads either orientation.

Persistent mode launches one program per SM; each walks tiles ``pid,
pid + NUM_SMS, ...`` in grouped order, so the grid costs one launch wave and
the epilogue of one tile overlaps the loads of the next.  Stream-K (on the
persistent grid) shares the last waves' K-steps out evenly instead.
"""

import triton
import triton.language as tl

from .gemm import finish_tile, grouped_tile_coords
from .gemm_streamk import streamk_segment, streamk_settle


@triton.jit
def load_tile(desc, off_rows, off_cols, ROW_MAJOR: tl.constexpr):
    """The (rows, cols) tile at (off_rows, off_cols) of a matrix whose descriptor is
    row-major (ROW_MAJOR) or describes its transpose (then the tile is transposed back)."""
    if ROW_MAJOR:
        tile = desc.load([off_rows, off_cols])
    else:
        tile = desc.load([off_cols, off_rows]).T
    return tile


@triton.jit
def tma_k_loop(
    a_desc,
    b_desc,
    off_m,
    off_n,
    k_first,
    k_last,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    A_KMAJOR: tl.constexpr,
    B_KMAJOR: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    UPCAST_OPERANDS: tl.constexpr,
):
    """K-steps ``k_first .. k_last - 1`` of one C tile, accumulated in fp32."""
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for ki in range(k_first, k_last):
        off_k = ki * BLOCK_K
        a = load_tile(a_desc, off_m, off_k, A_KMAJOR)  # A is (M, K)
        b = load_tile(b_desc, off_k, off_n, B_KMAJOR)  # B is (K, N)
        if UPCAST_OPERANDS:  # interpreter only: bf16 tl.dot bug, triton-lang/triton#11584
            a = a.to(tl.float32)
            b = b.to(tl.float32)
        acc = tl.dot(a, b, acc, input_precision=DOT_PRECISION)
    return acc


@triton.jit
def store_tile(
    c_desc, acc, off_m, off_n, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, EPILOGUE_SUBTILE: tl.constexpr
):
    """Store a finished tile through the C descriptor (TMA clips the edges)."""
    out_dtype = c_desc.dtype
    if EPILOGUE_SUBTILE:
        # Store the tile as two BLOCK_N/2 halves: half the shared-memory
        # staging buffer, which leaves room for a deeper mainloop pipeline.
        acc = tl.reshape(acc, (BLOCK_M, 2, BLOCK_N // 2))
        acc = tl.permute(acc, (0, 2, 1))
        acc0, acc1 = tl.split(acc)
        c_desc.store([off_m, off_n], acc0.to(out_dtype))
        c_desc.store([off_m, off_n + BLOCK_N // 2], acc1.to(out_dtype))
    else:
        c_desc.store([off_m, off_n], acc.to(out_dtype))


@triton.jit
def gemm_tma_kernel(
    a_desc,
    b_desc,
    c_desc,
    d_ptr,
    r_ptr,
    z_ptr,
    ws_ptr,
    count_ptr,
    M,
    N,
    K,
    stride_dm,
    stride_dn,
    stride_rm,
    stride_rn,
    stride_zm,
    stride_zn,
    alpha,
    beta,
    num_programs,
    dp_tiles,
    iters_per_program,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    A_KMAJOR: tl.constexpr,
    B_KMAJOR: tl.constexpr,
    HAS_ALPHA: tl.constexpr,
    ADDEND: tl.constexpr,
    ACTIVATION: tl.constexpr,
    HAS_RESIDUAL: tl.constexpr,
    STORE_PREACT: tl.constexpr,
    FLATTEN: tl.constexpr,
    WARP_SPECIALIZE: tl.constexpr,
    STREAM_K: tl.constexpr,
    EPILOGUE_SUBTILE: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    UPCAST_OPERANDS: tl.constexpr,
):
    """C = alpha * A @ B (+ beta * D) over tiles ``program_id, +num_programs, ...``.

    With a grid of one program per tile this is the plain data-parallel
    schedule; with a grid of one program per SM it is persistent.  With
    STREAM_K (persistent), only the first ``dp_tiles`` tiles go round robin;
    the K-steps of the rest are shared out evenly as in ``gemm_streamk``, each
    program taking ``iters_per_program`` of them, and split tiles are fixed up
    in the kernel through the workspace and arrival counters.
    """
    start = tl.program_id(0)
    # C goes out through its descriptor: the epilogue's values carry Z's strides in C's place.
    out = (z_ptr, d_ptr, r_ptr, z_ptr, M, N, stride_zm, stride_zn,
           stride_dm, stride_dn, stride_rm, stride_rn, alpha, beta)  # fmt: skip
    tiles_m = tl.cdiv(M, BLOCK_M)
    tiles_n = tl.cdiv(N, BLOCK_N)
    num_tiles = tiles_m * tiles_n
    k_tiles = tl.cdiv(K, BLOCK_K)
    dp_end = dp_tiles if STREAM_K else num_tiles
    for tile_id in tl.range(start, dp_end, num_programs, flatten=FLATTEN, warp_specialize=WARP_SPECIALIZE):
        pid_m, pid_n = grouped_tile_coords(tile_id, M, N, BLOCK_M, BLOCK_N, GROUP_M)
        off_m = pid_m * BLOCK_M
        off_n = pid_n * BLOCK_N
        acc = tma_k_loop(
            a_desc,
            b_desc,
            off_m,
            off_n,
            0,
            k_tiles,
            BLOCK_M,
            BLOCK_N,
            BLOCK_K,
            A_KMAJOR,
            B_KMAJOR,
            DOT_PRECISION,
            UPCAST_OPERANDS,
        )
        # 64-bit: D, R and Z are read and written by pointer, and past 2^31 elements 32-bit offsets wrap.
        offs_m = (off_m + tl.arange(0, BLOCK_M)).to(tl.int64)
        offs_n = (off_n + tl.arange(0, BLOCK_N)).to(tl.int64)
        acc = finish_tile(acc, offs_m, offs_n, out, HAS_ALPHA, ADDEND, ACTIVATION, HAS_RESIDUAL, STORE_PREACT)
        store_tile(c_desc, acc, off_m, off_n, BLOCK_M, BLOCK_N, EPILOGUE_SUBTILE)
    if STREAM_K:
        # This program's share [first, last) of the streamed tiles' K-steps,
        # walked backwards one tile segment at a time (see gemm_streamk).
        first = start * iters_per_program
        last = tl.minimum(first + iters_per_program, (num_tiles - dp_tiles) * k_tiles)
        while last > first:
            tile, tile_start, seg_start = streamk_segment(first, last, k_tiles)
            pid_m, pid_n = grouped_tile_coords(dp_tiles + tile, M, N, BLOCK_M, BLOCK_N, GROUP_M)
            off_m = pid_m * BLOCK_M
            off_n = pid_n * BLOCK_N
            acc = tma_k_loop(
                a_desc,
                b_desc,
                off_m,
                off_n,
                seg_start - tile_start,
                last - tile_start,
                BLOCK_M,
                BLOCK_N,
                BLOCK_K,
                A_KMAJOR,
                B_KMAJOR,
                DOT_PRECISION,
                UPCAST_OPERANDS,
            )
            acc, finished = streamk_settle(
                acc,
                ws_ptr,
                count_ptr,
                tile,
                tile_start,
                seg_start,
                last,
                k_tiles,
                start,
                iters_per_program,
                BLOCK_M,
                BLOCK_N,
            )
            if finished:
                offs_m = (off_m + tl.arange(0, BLOCK_M)).to(tl.int64)  # (64-bit: see above)
                offs_n = (off_n + tl.arange(0, BLOCK_N)).to(tl.int64)
                acc = finish_tile(
                    acc, offs_m, offs_n, out, HAS_ALPHA, ADDEND, ACTIVATION, HAS_RESIDUAL, STORE_PREACT
                )
                store_tile(c_desc, acc, off_m, off_n, BLOCK_M, BLOCK_N, EPILOGUE_SUBTILE)
            last = seg_start
