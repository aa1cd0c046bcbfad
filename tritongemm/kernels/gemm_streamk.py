"""Stream-K: a persistent grid that splits the MAC-loop iterations evenly.

Sliced-K gives each program whole tiles; when the tile count is just over a
multiple of the SM count the last wave runs mostly empty.  Stream-K instead
lays all (tile, K-step) iterations end to end and gives each of the
``num_programs`` programs an equal, contiguous share, so a program may finish
one tile and start the next partway.

The hybrid schedule used here (as in CUTLASS's "DP + SK"): the first
``dp_tiles`` tiles (whole waves but the last one or two) run data-parallel,
one tile per program turn; only the remaining tiles are streamed.

Partial tiles are fixed up deterministically, with no spin-waiting on other
programs (which also makes the schedule safe on Triton's interpreter, where
programs run one after another):

* ``streamk_kernel`` writes every partial tile to a workspace of two slots per
  program: slot 0 for a segment that starts inside a tile (the program's first
  segment), slot 1 for a segment that starts on a tile boundary and ends inside;
* ``streamk_fixup_kernel`` runs one program per streamed tile, adds the
  partials of the programs that covered it in program order, and runs the
  epilogue.  A tile one program covered whole was already stored.
"""

import triton
import triton.language as tl

from .gemm import epilogue, grouped_tile_coords, mainloop


@triton.jit
def _tile_offsets(tile_id, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    pid_m, pid_n = grouped_tile_coords(tile_id, M, N, BLOCK_M, BLOCK_N, GROUP_M)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    return offs_m, offs_n


@triton.jit
def streamk_kernel(
    a_ptr, b_ptr, c_ptr, d_ptr, r_ptr, z_ptr, ws_ptr,
    M, N, K,
    stride_am, stride_ak, stride_bk, stride_bn,
    stride_cm, stride_cn, stride_dm, stride_dn, stride_rm, stride_rn,
    alpha, beta,
    num_programs, dp_tiles, iters_per_program,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    EVEN_K: tl.constexpr, HAS_ALPHA: tl.constexpr, HAS_ADDEND: tl.constexpr,
    ACTIVATION: tl.constexpr, HAS_RESIDUAL: tl.constexpr, STORE_PREACT: tl.constexpr,
    ACC_FP64: tl.constexpr, DOT_PRECISION: tl.constexpr, UPCAST_OPERANDS: tl.constexpr,
):
    pid = tl.program_id(0)
    k_tiles = tl.cdiv(K, BLOCK_K)
    tiles = tl.cdiv(M, BLOCK_M) * tl.cdiv(N, BLOCK_N)

    # Data-parallel part: whole tiles, round robin.
    for tile_id in range(pid, dp_tiles, num_programs):
        offs_m, offs_n = _tile_offsets(tile_id, M, N, BLOCK_M, BLOCK_N, GROUP_M)
        acc = mainloop(
            a_ptr, b_ptr, offs_m, offs_n, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
            BLOCK_M, BLOCK_N, BLOCK_K, EVEN_K, ACC_FP64, DOT_PRECISION, UPCAST_OPERANDS,
        )
        epilogue(acc, c_ptr, d_ptr, r_ptr, z_ptr, offs_m, offs_n, M, N, stride_cm, stride_cn,
                 stride_dm, stride_dn, stride_rm, stride_rn, alpha, beta,
                 HAS_ALPHA, HAS_ADDEND, ACTIVATION, HAS_RESIDUAL, STORE_PREACT)

    # Streamed part: this program's contiguous share of the remaining iterations.
    total = (tiles - dp_tiles) * k_tiles
    it = pid * iters_per_program
    end = tl.minimum(it + iters_per_program, total)
    while it < end:
        tile = it // k_tiles
        k0 = it - tile * k_tiles
        k1 = tl.minimum(k_tiles, k0 + (end - it))
        offs_m, offs_n = _tile_offsets(dp_tiles + tile, M, N, BLOCK_M, BLOCK_N, GROUP_M)
        k_start = k0 * BLOCK_K
        acc = mainloop(
            a_ptr + k_start * stride_ak, b_ptr + k_start * stride_bk, offs_m, offs_n, M, N,
            tl.minimum(K - k_start, (k1 - k0) * BLOCK_K),
            stride_am, stride_ak, stride_bk, stride_bn,
            BLOCK_M, BLOCK_N, BLOCK_K, EVEN_K, ACC_FP64, DOT_PRECISION, UPCAST_OPERANDS,
        )
        if k0 == 0 and k1 == k_tiles:
            epilogue(acc, c_ptr, d_ptr, r_ptr, z_ptr, offs_m, offs_n, M, N, stride_cm, stride_cn,
                     stride_dm, stride_dn, stride_rm, stride_rn, alpha, beta,
                     HAS_ALPHA, HAS_ADDEND, ACTIVATION, HAS_RESIDUAL, STORE_PREACT)
        else:
            slot = tl.where(k0 > 0, 0, 1)
            base = ws_ptr + (pid * 2 + slot).to(tl.int64) * (BLOCK_M * BLOCK_N)
            rows = tl.arange(0, BLOCK_M)
            cols = tl.arange(0, BLOCK_N)
            tl.store(base + rows[:, None] * BLOCK_N + cols[None, :], acc)
        it += k1 - k0


@triton.jit
def streamk_fixup_kernel(
    c_ptr, d_ptr, r_ptr, z_ptr, ws_ptr,
    M, N, K,
    stride_cm, stride_cn, stride_dm, stride_dn, stride_rm, stride_rn,
    alpha, beta,
    dp_tiles, iters_per_program,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    HAS_ALPHA: tl.constexpr, HAS_ADDEND: tl.constexpr, ACTIVATION: tl.constexpr,
    HAS_RESIDUAL: tl.constexpr, STORE_PREACT: tl.constexpr, ACC_FP64: tl.constexpr,
):
    tile = tl.program_id(0)
    k_tiles = tl.cdiv(K, BLOCK_K)
    tile_start = tile * k_tiles
    tile_end = tile_start + k_tiles
    first = tile_start // iters_per_program
    last = (tile_end - 1) // iters_per_program
    if first != last:  # split across programs: add their partials in program order
        if ACC_FP64:
            acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float64)
        else:
            acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        rows = tl.arange(0, BLOCK_M)
        cols = tl.arange(0, BLOCK_N)
        for p in range(first, last + 1):
            seg_start = tl.maximum(p * iters_per_program, tile_start)
            slot = tl.where(seg_start > tile_start, 0, 1)
            base = ws_ptr + (p * 2 + slot).to(tl.int64) * (BLOCK_M * BLOCK_N)
            acc += tl.load(base + rows[:, None] * BLOCK_N + cols[None, :])
        offs_m, offs_n = _tile_offsets(dp_tiles + tile, M, N, BLOCK_M, BLOCK_N, GROUP_M)
        epilogue(acc, c_ptr, d_ptr, r_ptr, z_ptr, offs_m, offs_n, M, N, stride_cm, stride_cn,
                 stride_dm, stride_dn, stride_rm, stride_rn, alpha, beta,
                 HAS_ALPHA, HAS_ADDEND, ACTIVATION, HAS_RESIDUAL, STORE_PREACT)
