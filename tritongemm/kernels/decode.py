"""Decode GEMM: C[M, N] = A[M, K] @ W[N, K]^T (+ bias), for M <= 16 rows of A.

With a few token rows (LLM generation) the product is bound by reading the
weight W once: 2 bytes per weight against at most 32 FLOPs on them, so the
kernel is a memory stream that happens to multiply.  Its shape follows from
keeping enough bytes of W in flight on every SM:

* W as ``nn.Linear`` stores it, (N, K) with K contiguous: a program owns
  ``BLOCK_N`` rows of W (outputs) and loads ``BLOCK_N x BLOCK_K`` tiles whose
  rows are ``BLOCK_K`` contiguous elements (16-byte vector copies).
* The rows of A are padded to ``BLOCK_M`` = 16, the smallest ``tl.dot`` tile,
  so the tensor cores do the (free) arithmetic and the loads feeding the dot
  are what Triton's pipeliner keeps ``num_stages`` deep (16-byte ``cp.async``
  copies into shared memory, or with TMA bulk copies of whole tiles).  Padding
  rows are masked (or, with TMA, out of bounds): they cost no memory traffic.
* Split-K: ``splits`` programs share each column block, each walking one
  slice of K, so that even N = 4096 makes a grid of several programs per SM
  (a resident program's loads cover another's start and finish).  The slices
  of a column block are consecutive program ids, so they run together and
  their partials meet in L2 soon after they are written.
* The partials are reduced as ``gemm_kernel``'s inline split-K does: each
  slice stores its fp32 partial tile in its own workspace slot, and the last
  slice of the column block to arrive (``last_to_arrive``, whose counter
  re-arms itself) adds the slots in slice order, adds the bias and stores C.
  One launch, no memset, bitwise-reproducible.
"""

import triton
import triton.language as tl

from .gemm import epilogue, last_to_arrive, splitk_partials, sum_slices


@triton.jit
def decode_dot(a, w, acc, UPCAST_OPERANDS: tl.constexpr):
    """acc += a @ w^T for a (16, BLOCK_K) tile of A and a (BLOCK_N, BLOCK_K) tile of W."""
    if UPCAST_OPERANDS:
        # Triton's interpreter multiplies the raw bit patterns of bfloat16 operands in
        # tl.dot (triton-lang/triton#11584); fp32 products of bf16 values are exact.
        a = a.to(tl.float32)
        w = w.to(tl.float32)
    # "ieee": fp32 operands stay fp32 (TF32 would buy nothing in a memory-bound loop).
    return tl.dot(a, tl.trans(w), acc, input_precision="ieee", out_dtype=tl.float32)


# ``M`` and ``splits`` are not specialized: Triton would compile a kernel for M = 1, another
# for M = 16 (a multiple of 16) and one more for 16 slices, with nothing to gain from any.
@triton.jit(do_not_specialize=["M", "splits"])
def decode_kernel(
    a_ptr,
    w_ptr,
    a_desc,
    w_desc,
    c_ptr,
    bias_ptr,
    ws_ptr,
    count_ptr,
    M,
    N,
    K,
    stride_am,
    stride_ak,
    stride_wn,
    stride_wk,
    stride_cm,
    stride_cn,
    stride_bias,
    splits,
    k_per_split,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    SPLIT_K: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    EVEN_K: tl.constexpr,
    INDEX_64: tl.constexpr,
    UPCAST_OPERANDS: tl.constexpr,
    TMA: tl.constexpr,
):
    """One program: ``BLOCK_N`` outputs (for all M rows) over one slice of K.

    The grid is ``cdiv(N, BLOCK_N) * splits`` programs, the slices of a column
    block consecutive.  With SPLIT_K (``splits`` > 1), slice s covers
    K[s * k_per_split, (s + 1) * k_per_split) (``k_per_split`` a multiple of
    BLOCK_K, the last slice possibly shorter) and the workspace holds
    ``splits`` fp32 (M, N) partials; ``count_ptr`` holds one zeroed int32 per
    column block.  EVEN_K: K is a multiple of BLOCK_K, so no load is masked
    along K.  UPCAST_OPERANDS: the interpreter's bf16 ``tl.dot`` workaround.

    TMA: the tiles come through host-built tensor descriptors (``a_desc`` over
    (M, K) with blocks of 16 x BLOCK_K, ``w_desc`` over (N, K) with blocks of
    BLOCK_N x BLOCK_K) instead of ``a_ptr`` / ``w_ptr``: one bulk copy per
    tile (per 128-byte column of it) instead of a 16-byte copy per thread, and
    the copy engine zero-fills what lies past M, N or K, so nothing is masked.
    A slice's tiles never cross into the next slice (``k_per_split`` is whole
    K-steps); the last slice's last tile crosses K and reads zeros there.
    """
    pid = tl.program_id(0)
    if SPLIT_K:
        pid_n = pid // splits
        slice_id = pid % splits
        k_start = slice_id * k_per_split
        k_len = tl.minimum(K - k_start, k_per_split)
    else:
        pid_n = pid
        slice_id = 0
        k_start = 0
        k_len = K
    if INDEX_64:
        # W spans more than 2^31 elements: int32 row offsets would wrap.
        pid_n = pid_n.to(tl.int64)
    offs_m = tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    if TMA:
        for k in range(0, tl.cdiv(k_len, BLOCK_K)):
            off_k = k_start + k * BLOCK_K
            a = a_desc.load([0, off_k])
            w = w_desc.load([pid_n * BLOCK_N, off_k])  # (int32: the launch leaves INDEX_64 off)
            acc = decode_dot(a, w, acc, UPCAST_OPERANDS)
    else:
        offs_k = tl.arange(0, BLOCK_K)
        # The rows of a ragged last column block read row N-1 again instead of being masked: the
        # loads of W stay unpredicated, and those outputs are never stored.
        rows_w = tl.minimum(offs_n, N - 1)
        # Along K both operands are runs of BLOCK_K contiguous elements starting at a multiple of
        # BLOCK_K (``k_per_split`` is one): what lets each thread copy 16 bytes at a time.
        cols = tl.max_contiguous(tl.multiple_of(k_start + offs_k, BLOCK_K), BLOCK_K)
        a_ptrs = a_ptr + offs_m[:, None] * stride_am + cols[None, :] * stride_ak
        w_ptrs = w_ptr + rows_w[:, None] * stride_wn + cols[None, :] * stride_wk
        # Padding rows of A are masked, not clamped: a masked copy reads no memory.
        mask_m = offs_m[:, None] < M
        for k in range(0, tl.cdiv(k_len, BLOCK_K)):
            if EVEN_K:
                a = tl.load(a_ptrs, mask=mask_m, other=0.0)
                w = tl.load(w_ptrs)
            else:
                k_left = k_len - k * BLOCK_K
                a = tl.load(a_ptrs, mask=mask_m & (offs_k[None, :] < k_left), other=0.0)
                w = tl.load(w_ptrs, mask=offs_k[None, :] < k_left, other=0.0)
            acc = decode_dot(a, w, acc, UPCAST_OPERANDS)
            a_ptrs += BLOCK_K * stride_ak
            w_ptrs += BLOCK_K * stride_wk
    finish = True  # this program stores C (a constant unless K is split)
    if SPLIT_K:
        mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
        tl.store(splitk_partials(ws_ptr, slice_id, 0, offs_m, offs_n, M, N, M * N), acc, mask=mask)
        finish = last_to_arrive(count_ptr, pid_n, splits)
        if finish:
            acc = sum_slices(ws_ptr, splits, 0, offs_m, offs_n, M, N, M * N, BLOCK_M, BLOCK_N, False)
    if finish:
        # The GEMM's epilogue with a bias as its "row" addend (C stands in for the absent tensors).
        out = (c_ptr, bias_ptr, c_ptr, c_ptr, M, N, stride_cm, stride_cn, 0, stride_bias, 0, 0, 1.0, 1.0)
        if HAS_BIAS:
            epilogue(acc, offs_m, offs_n, out, False, "row", "none", False, False)
        else:
            epilogue(acc, offs_m, offs_n, out, False, "none", "none", False, False)
