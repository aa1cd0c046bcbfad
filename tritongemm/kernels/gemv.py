"""GEMV: C[1, N] = A[1, K] @ B[K, N] without tensor cores.

One row of A (decode with one token) leaves 15 of the 16 rows of the
smallest ``tl.dot`` tile empty, and the kernel is bound by reading B once
anyway.  Here each program owns ``BLOCK_N`` outputs and walks K in steps of
``BLOCK_K``, multiplying the B tile by the A row on CUDA cores into a
``BLOCK_K x BLOCK_N`` fp32 accumulator that is summed over K once at the end.

Split-K and the epilogue are the GEMM kernel's own: the accumulator becomes a
1 x BLOCK_N tile, so ``epilogue`` and the split-K reduction (a second kernel,
or inline by the last slice to arrive, see ``gemm_kernel``) apply unchanged.
"""

import triton
import triton.language as tl

from .gemm import epilogue, last_slice_to_arrive, splitk_partials, splitk_slice, sum_slices


@triton.jit
def gemv_kernel(
    a_ptr,
    b_ptr,
    c_ptr,
    d_ptr,
    r_ptr,
    z_ptr,
    ws_ptr,
    count_ptr,
    N,
    K,
    stride_ak,
    stride_bk,
    stride_bn,
    stride_cn,
    stride_dn,
    stride_rn,
    alpha,
    beta,
    k_per_split,
    stride_split,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    EVEN_K: tl.constexpr,
    HAS_ALPHA: tl.constexpr,
    ADDEND: tl.constexpr,
    ACTIVATION: tl.constexpr,
    HAS_RESIDUAL: tl.constexpr,
    STORE_PREACT: tl.constexpr,
    INDEX_64: tl.constexpr,
    ACC_FP64: tl.constexpr,
    SPLIT_K: tl.constexpr,
    REDUCE_INLINE: tl.constexpr,
):
    pid = tl.program_id(0)
    if INDEX_64:
        offs_n = pid.to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)
    else:
        offs_n = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_n = tl.max_contiguous(tl.multiple_of(offs_n, BLOCK_N), BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    if SPLIT_K:
        slice_id, k_start, K = splitk_slice(K, k_per_split)
        a_ptr += k_start * stride_ak
        b_ptr += k_start * stride_bk
    a_ptrs = a_ptr + offs_k * stride_ak
    b_ptrs = b_ptr + offs_k[:, None] * stride_bk + offs_n[None, :] * stride_bn
    mask_n = offs_n[None, :] < N
    if ACC_FP64:
        acc = tl.zeros((BLOCK_K, BLOCK_N), dtype=tl.float64)
    else:
        acc = tl.zeros((BLOCK_K, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        if EVEN_K:
            a = tl.load(a_ptrs)
            b = tl.load(b_ptrs, mask=mask_n, other=0.0)
        else:
            k_left = K - k * BLOCK_K
            a = tl.load(a_ptrs, mask=offs_k < k_left, other=0.0)
            b = tl.load(b_ptrs, mask=mask_n & (offs_k[:, None] < k_left), other=0.0)
        acc += b.to(acc.dtype) * a.to(acc.dtype)[:, None]
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk
    # The 1 x BLOCK_N tile the GEMM helpers expect (row 0 of a 1-row C).
    tile = tl.sum(acc, axis=0)[None, :]
    offs_m = tl.arange(0, 1)
    finish = True  # this program runs the epilogue (a constant unless split-K reduces inline)
    if SPLIT_K:
        mask = offs_n[None, :] < N
        tl.store(splitk_partials(ws_ptr, slice_id, 0, offs_m, offs_n, 1, N, stride_split), tile, mask=mask)
        finish = False  # (the reduce kernel does)
        if REDUCE_INLINE:
            finish = last_slice_to_arrive(count_ptr, pid)
            if finish:
                tile = sum_slices(
                    ws_ptr, tl.num_programs(1), 0, offs_m, offs_n, 1, N, stride_split, 1, BLOCK_N, ACC_FP64
                )
    if finish:
        out = (c_ptr, d_ptr, r_ptr, z_ptr, 1, N, 0, stride_cn, 0, stride_dn, 0, stride_rn, alpha, beta)
        epilogue(tile, offs_m, offs_n, out, HAS_ALPHA, ADDEND, ACTIVATION, HAS_RESIDUAL, STORE_PREACT)
