"""Stream-K: a persistent grid that splits the MAC-loop iterations evenly.

Sliced-K gives each program whole tiles; when the tile count is just over a
multiple of the SM count the last wave runs mostly empty.  Stream-K instead
lays all (tile, K-step) iterations end to end and gives each of the
``num_programs`` programs an equal, contiguous share, so a program may finish
one tile and start the next partway.

The hybrid schedule (CUTLASS's "data-parallel + Stream-K"): the first
``dp_tiles`` tiles (whole waves) run data-parallel, one tile per program
turn; only the remaining tiles are streamed.

Partial tiles are fixed up inside the kernel, deterministically:

* a tile split between programs is *finished* by the program that computes
  its last K-step; every other program that covers part of it is a
  *contributor*: it stores its fp32 partial in its own workspace slot
  (a program contributes at most once: the segment at the end of its share)
  and bumps the tile's arrival counter;
* each program walks its share **backwards**, so its contribution comes first
  and the segment it must finish (the one at the start of its share) comes
  last: by then the contributors, which are lower program ids, are long done,
  and the finisher rarely waits;
* the finisher waits for the counter to reach the number of contributors,
  adds their partials in program order (bitwise-reproducible), re-arms the
  counter to zero for the next launch and runs the epilogue.

A program only ever waits on lower program ids, and the grid is at most one
program per SM (all resident at once), so the wait cannot deadlock; on
Triton's interpreter, which runs programs in order, it never spins.
"""

import triton
import triton.language as tl

from .gemm import epilogue, grouped_tile_coords, mainloop


@triton.jit
def _tile_offsets(tile_id, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    pid_m, pid_n = grouped_tile_coords(tile_id, M, N, BLOCK_M, BLOCK_N, GROUP_M)
    # 64-bit: an operand past 2^31 elements would wrap 32-bit offsets; the pointers are computed once a
    # segment and then advanced, so the wider arithmetic costs nothing in the K loop.
    offs_m = pid_m.to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n.to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m = tl.max_contiguous(tl.multiple_of(offs_m, BLOCK_M), BLOCK_M)
    offs_n = tl.max_contiguous(tl.multiple_of(offs_n, BLOCK_N), BLOCK_N)
    return offs_m, offs_n


@triton.jit
def _partial_ptrs(ws_ptr, program, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """One program's BLOCK_M x BLOCK_N fp32 workspace slot (programs x BLOCK_M x BLOCK_N < 2^31)."""
    rows = tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_N)
    return ws_ptr + program * (BLOCK_M * BLOCK_N) + rows[:, None] * BLOCK_N + cols[None, :]


@triton.jit
def streamk_segment(first, last, k_tiles):
    """The segment of a program's share that ends at ``last`` (exclusive): its
    tile (counted from the first streamed tile), the tile's first iteration,
    and where the segment starts (``first`` or the tile's start)."""
    tile = (last - 1) // k_tiles
    tile_start = tile * k_tiles
    return tile, tile_start, tl.maximum(tile_start, first)


@triton.jit
def streamk_contribute(acc, ws_ptr, count_ptr, tile, pid, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Hand a partial tile to its finisher: store it in this program's slot, then count it in."""
    tl.store(_partial_ptrs(ws_ptr, pid, BLOCK_M, BLOCK_N), acc)
    tl.debug_barrier()  # every thread's part is stored before the release
    tl.atomic_add(count_ptr + tile, 1, sem="release", scope="gpu")


@triton.jit
def streamk_collect(
    acc,
    ws_ptr,
    count_ptr,
    tile,
    tile_start,
    pid,
    iters_per_program,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """The finisher of a split tile: wait for the programs ``tile_start //
    iters_per_program .. pid - 1`` that contributed, add their partials in
    program order, and re-arm the tile's counter for the next launch."""
    owner = tile_start // iters_per_program
    while tl.atomic_add(count_ptr + tile, 0, sem="acquire", scope="gpu") < pid - owner:
        pass
    tl.debug_barrier()
    for p in range(owner, pid):
        acc += tl.load(_partial_ptrs(ws_ptr, p, BLOCK_M, BLOCK_N), cache_modifier=".cg")
    tl.store(count_ptr + tile, 0)
    return acc


@triton.jit
def streamk_settle(
    acc,
    ws_ptr,
    count_ptr,
    tile,
    tile_start,
    seg_start,
    last,
    k_tiles,
    pid,
    iters_per_program,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """After a segment: a contributor hands its partial over; the finisher of a
    split tile collects the others'.  Returns the accumulator and whether this
    program finishes the tile (then the caller runs the epilogue)."""
    finished = last >= tile_start + k_tiles
    if not finished:
        streamk_contribute(acc, ws_ptr, count_ptr, tile, pid, BLOCK_M, BLOCK_N)
    elif seg_start > tile_start:
        acc = streamk_collect(
            acc, ws_ptr, count_ptr, tile, tile_start, pid, iters_per_program, BLOCK_M, BLOCK_N
        )
    return acc, finished


@triton.jit
def streamk_kernel(
    a_ptr,
    b_ptr,
    c_ptr,
    d_ptr,
    r_ptr,
    z_ptr,
    ws_ptr,
    count_ptr,
    M,
    N,
    K,
    stride_am,
    stride_ak,
    stride_bk,
    stride_bn,
    stride_cm,
    stride_cn,
    stride_dm,
    stride_dn,
    stride_rm,
    stride_rn,
    alpha,
    beta,
    dp_tiles,
    iters_per_program,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    EVEN_K: tl.constexpr,
    HAS_ALPHA: tl.constexpr,
    ADDEND: tl.constexpr,
    ACTIVATION: tl.constexpr,
    HAS_RESIDUAL: tl.constexpr,
    STORE_PREACT: tl.constexpr,
    ACC_FP64: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    UPCAST_OPERANDS: tl.constexpr,
):
    pid = tl.program_id(0)
    strides = (stride_am, stride_ak, stride_bk, stride_bn)
    out = (c_ptr, d_ptr, r_ptr, z_ptr, M, N, stride_cm, stride_cn,
           stride_dm, stride_dn, stride_rm, stride_rn, alpha, beta)  # fmt: skip
    num_programs = tl.num_programs(0)
    k_tiles = tl.cdiv(K, BLOCK_K)
    tiles = tl.cdiv(M, BLOCK_M) * tl.cdiv(N, BLOCK_N)

    # Data-parallel part: whole tiles, round robin.
    for tile_id in range(pid, dp_tiles, num_programs):
        offs_m, offs_n = _tile_offsets(tile_id, M, N, BLOCK_M, BLOCK_N, GROUP_M)
        acc = mainloop(
            a_ptr,
            b_ptr,
            offs_m,
            offs_n,
            M,
            N,
            K,
            strides,
            BLOCK_M,
            BLOCK_N,
            BLOCK_K,
            EVEN_K,
            ACC_FP64,
            DOT_PRECISION,
            UPCAST_OPERANDS,
        )
        epilogue(acc, offs_m, offs_n, out, HAS_ALPHA, ADDEND, ACTIVATION, HAS_RESIDUAL, STORE_PREACT)

    # Streamed part: this program's share [first, last) of the remaining
    # iterations, walked backwards one tile segment at a time.
    first = pid * iters_per_program
    last = tl.minimum(first + iters_per_program, (tiles - dp_tiles) * k_tiles)
    while last > first:
        tile, tile_start, seg_start = streamk_segment(first, last, k_tiles)
        k_start = (seg_start - tile_start) * BLOCK_K
        offs_m, offs_n = _tile_offsets(dp_tiles + tile, M, N, BLOCK_M, BLOCK_N, GROUP_M)
        acc = mainloop(
            a_ptr + k_start * stride_ak,
            b_ptr + k_start * stride_bk,
            offs_m,
            offs_n,
            M,
            N,
            tl.minimum(K - k_start, (last - seg_start) * BLOCK_K),
            strides,
            BLOCK_M,
            BLOCK_N,
            BLOCK_K,
            EVEN_K,
            ACC_FP64,
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
            pid,
            iters_per_program,
            BLOCK_M,
            BLOCK_N,
        )
        if finished:
            epilogue(acc, offs_m, offs_n, out, HAS_ALPHA, ADDEND, ACTIVATION, HAS_RESIDUAL, STORE_PREACT)
        last = seg_start
