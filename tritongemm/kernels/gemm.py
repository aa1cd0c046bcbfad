"""The pointer-based GEMM kernel: C = alpha * A @ B (+ beta * D), batched, any strides.

One kernel serves the three mainloop schemes: ``num_stages`` (a launch option,
not a kernel argument) tells Triton's software pipeliner how many K-tiles to
keep in flight.  See ``tritongemm.planning.pipelines``.
"""

import triton
import triton.language as tl

from .activations import activate, activate_with


@triton.jit
def grouped_tile_coords(tile_id, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    """Map a linear tile id to (pid_m, pid_n) in grouped ("swizzled") order.

    Consecutive ids walk down a column of GROUP_M tile-rows before moving right,
    so programs that run at the same time reuse the same B columns and A rows
    from L2 instead of streaming a whole row of tiles.
    """
    tiles_m = tl.cdiv(M, BLOCK_M)
    tiles_n = tl.cdiv(N, BLOCK_N)
    tiles_per_group = GROUP_M * tiles_n
    group_id = tile_id // tiles_per_group
    first_m = group_id * GROUP_M
    group_rows = tl.minimum(tiles_m - first_m, GROUP_M)
    pid_m = first_m + (tile_id % tiles_per_group) % group_rows
    pid_n = (tile_id % tiles_per_group) // group_rows
    return pid_m, pid_n


@triton.jit
def k_step_scales(
    sa_ptr,
    sb_ptr,
    kb,
    k_blocks,
    offs_m,
    offs_n,
    M,
    N,
    SCALE_BLOCK_A: tl.constexpr,
    SCALE_BLOCK_B: tl.constexpr,
):
    """Block-scaled fp8: the scales of K block ``kb`` (of ``k_blocks``, 128 of K each) for the tile's rows
    and columns.

    SCALE_BLOCK_A rows of A share a scale (1 or 128), and SCALE_BLOCK_B columns of B.  The layouts are
    ``torch._scaled_mm``'s usual ones (``frontend.scaled.kernel_scales``): a scale per row (column) is
    stored K-block-major, the rows (columns) contiguous, so a K-step's scales are one vector load; a
    scale per 128 rows (columns) is stored block-major, its K blocks contiguous.
    """
    if SCALE_BLOCK_A == 1:
        sa = tl.load(sa_ptr + kb * M + offs_m, mask=offs_m < M, other=0.0)
    else:
        sa = tl.load(sa_ptr + (offs_m // SCALE_BLOCK_A) * k_blocks + kb, mask=offs_m < M, other=0.0)
    if SCALE_BLOCK_B == 1:
        sb = tl.load(sb_ptr + kb * N + offs_n, mask=offs_n < N, other=0.0)
    else:
        sb = tl.load(sb_ptr + (offs_n // SCALE_BLOCK_B) * k_blocks + kb, mask=offs_n < N, other=0.0)
    return sa, sb


@triton.jit
def mainloop(
    a_ptr,
    b_ptr,
    offs_m,
    offs_n,
    M,
    N,
    K,
    strides,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    EVEN_K: tl.constexpr,
    ACC_FP64: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    UPCAST_OPERANDS: tl.constexpr,
    MAX_IMPRECISE_ACC: tl.constexpr = None,
    block_scales=None,
    SCALE_BLOCK_A: tl.constexpr = 0,
    SCALE_BLOCK_B: tl.constexpr = 0,
):
    """The K loop: accumulate one BLOCK_M x BLOCK_N tile of A @ B.

    ``MAX_IMPRECISE_ACC`` (fp8 on sm_90 only): how many K the tensor cores sum in their reduced-precision
    accumulator before the sum is added into the fp32 one; None is Triton's default there (never:
    torch's ``use_fast_accum=True``), BLOCK_K adds once per K-step (cuBLAS's and CUTLASS's precise mode).
    ``strides``: (stride_am, stride_ak, stride_bk, stride_bn).

    Block-scaled fp8 (SCALE_BLOCK_A > 0, ``block_scales`` = (sa_ptr, sb_ptr, k_offset, k_blocks): where
    this K loop starts in the whole K, and how many blocks of 128 the whole K has): every 128 of K
    has its own scales, so each K-step (at most 128 deep, inside one scale block) is summed on its own
    and added into the fp32 accumulator times its rows' and columns' scales (``k_step_scales``).
    """
    stride_am, stride_ak, stride_bk, stride_bn = strides
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + offs_m[:, None] * stride_am + offs_k[None, :] * stride_ak
    b_ptrs = b_ptr + offs_k[:, None] * stride_bk + offs_n[None, :] * stride_bn
    mask_m = offs_m[:, None] < M
    mask_n = offs_n[None, :] < N
    if ACC_FP64:
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float64)
    else:
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    if (
        SCALE_BLOCK_A > 0
    ):  # the first K-step's scales; each step loads the next one's (not pipelined by Triton)
        sa_ptr, sb_ptr, k_offset, k_blocks = block_scales
        kb = k_offset // 128
        sa, sb = k_step_scales(
            sa_ptr, sb_ptr, kb, k_blocks, offs_m, offs_n, M, N, SCALE_BLOCK_A, SCALE_BLOCK_B
        )
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        if EVEN_K:
            a = tl.load(a_ptrs, mask=mask_m, other=0.0)
            b = tl.load(b_ptrs, mask=mask_n, other=0.0)
        else:
            k_left = K - k * BLOCK_K
            a = tl.load(a_ptrs, mask=mask_m & (offs_k[None, :] < k_left), other=0.0)
            b = tl.load(b_ptrs, mask=mask_n & (offs_k[:, None] < k_left), other=0.0)
        if UPCAST_OPERANDS:
            # Triton's interpreter multiplies the raw bit patterns of bfloat16
            # operands in tl.dot (triton-lang/triton#11584); fp32 operands are
            # exact products of bf16 values, so the result is unchanged.
            a = a.to(tl.float32)
            b = b.to(tl.float32)
        if SCALE_BLOCK_A > 0:
            part = tl.dot(a, b, input_precision=DOT_PRECISION, out_dtype=tl.float32)
            kb = tl.minimum((k_offset + (k + 1) * BLOCK_K) // 128, k_blocks - 1)
            sa_next, sb_next = k_step_scales(
                sa_ptr, sb_ptr, kb, k_blocks, offs_m, offs_n, M, N, SCALE_BLOCK_A, SCALE_BLOCK_B
            )  # fmt: skip
            acc += part * sa[:, None] * sb[None, :]
            sa, sb = sa_next, sb_next
        else:
            # out_dtype must name the accumulator's type: triton 3.6 defaults it to fp32 even for fp64.
            acc = tl.dot(
                a,
                b,
                acc,
                input_precision=DOT_PRECISION,
                out_dtype=acc.dtype,
                max_num_imprecise_acc=MAX_IMPRECISE_ACC,
            )
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk
    return acc


@triton.jit
def finish_tile(
    acc,
    offs_m,
    offs_n,
    out,
    HAS_ALPHA: tl.constexpr,
    ADDEND: tl.constexpr,
    ACTIVATION: tl.constexpr,
    HAS_RESIDUAL: tl.constexpr,
    STORE_PREACT: tl.constexpr,
):
    """The epilogue's arithmetic, while the accumulator is still in registers:

        z = alpha * acc + beta * D      (D: addmm's input, or linear's bias, broadcast by strides)
        y = activation(z) + R           (R: a residual of the output's shape)
        y = z * act'(R)                 (a derivative epilogue, "<act>_grad": R the saved pre-activation)

    ADDEND says how D is read: "none"; "row", one row broadcast down the tile (a bias), loaded as one
    vector; "full", one element per output (``launch.pointer.addend_kind``).  ``z`` is also stored
    when backward needs it (STORE_PREACT), with C's strides.  ``out``: the runtime values, built once
    by each kernel as one tuple (C's pointer is not read here).
    """
    # fmt: off
    (_, d_ptr, r_ptr, z_ptr, M, N, stride_zm, stride_zn, stride_dm, stride_dn, stride_rm, stride_rn,
     alpha, beta) = out
    # fmt: on
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    if HAS_ALPHA:
        acc = acc * alpha
    if ADDEND == "row":  # a bias: one vector load per tile, not one load per output
        d = tl.load(d_ptr + offs_n * stride_dn, mask=offs_n < N, other=0.0)
        acc = acc + beta * d.to(acc.dtype)[None, :]
    elif ADDEND == "full":
        d = tl.load(d_ptr + offs_m[:, None] * stride_dm + offs_n[None, :] * stride_dn, mask=mask, other=0.0)
        acc = acc + beta * d.to(acc.dtype)
    if STORE_PREACT:
        z_ptrs = z_ptr + offs_m[:, None] * stride_zm + offs_n[None, :] * stride_zn
        tl.store(z_ptrs, acc.to(z_ptr.dtype.element_ty), mask=mask)
    if HAS_RESIDUAL:
        r = tl.load(r_ptr + offs_m[:, None] * stride_rm + offs_n[None, :] * stride_rn, mask=mask, other=0.0)
        acc = activate_with(acc, r.to(acc.dtype), ACTIVATION, z_ptr.dtype.element_ty.primitive_bitwidth)
    else:
        acc = activate(acc, ACTIVATION, z_ptr.dtype.element_ty.primitive_bitwidth)
    return acc


@triton.jit
def scale_tile(acc, offs_m, offs_n, M, N, sa_ptr, sb_ptr, SCALING: tl.constexpr):
    """Dequantize an fp8 product: ``acc * scale_a * scale_b``, before the rest of the epilogue.

    "tensorwise": one scale per operand; "rowwise": one per row of A (M of them) and one per
    column of B (N), both contiguous fp32.
    """
    if SCALING == "tensorwise":
        acc = acc * (tl.load(sa_ptr) * tl.load(sb_ptr))
    elif SCALING == "rowwise":
        sa = tl.load(sa_ptr + offs_m, mask=offs_m < M, other=0.0)
        sb = tl.load(sb_ptr + offs_n, mask=offs_n < N, other=0.0)
        acc = acc * sa[:, None] * sb[None, :]
    return acc


@triton.jit
def epilogue(
    acc,
    offs_m,
    offs_n,
    out,
    HAS_ALPHA: tl.constexpr,
    ADDEND: tl.constexpr,
    ACTIVATION: tl.constexpr,
    HAS_RESIDUAL: tl.constexpr,
    STORE_PREACT: tl.constexpr,
):
    """``finish_tile``, cast to C's dtype, store the valid part of the tile (Z shares C's strides).

    ``out`` holds the epilogue's runtime values, built once by each kernel as a tuple literal:
    (C, D, R, Z pointers, M, N, C's strides, D's strides, R's strides, alpha, beta), Z sharing
    C's strides.  A literal, not a helper's return value: Inductor's analysis of a user kernel
    (``torch.compile``) then still sees that only C and Z are written."""
    c_ptr, M, N, stride_cm, stride_cn = out[0], out[4], out[5], out[6], out[7]
    acc = finish_tile(acc, offs_m, offs_n, out, HAS_ALPHA, ADDEND, ACTIVATION, HAS_RESIDUAL, STORE_PREACT)
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    c_ptrs = c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=mask)


@triton.jit
def hint_multiple(x, MULTIPLE: tl.constexpr):
    """``x`` (a stride), with the compiler told that it is a multiple of MULTIPLE (the launcher checked).

    Triton marks only integer arguments divisible by 16, so a row stride of,
    say, 1000 half-precision elements (16-byte aligned rows) would be loaded
    element by element; rounding down to a known multiple changes no value
    but lets the loads vectorize as far as the stride allows (the "hinted" path of docs/unaligned.md).
    With MULTIPLE = 1 the compiler folds it away.
    """
    return x // MULTIPLE * MULTIPLE


@triton.jit
def splitk_partials(ws_ptr, slice_id, batch, offs_m, offs_n, M, N, stride_split):
    """Pointers to one slice's fp32 partial tile in the (splits, batch, M, N) workspace."""
    return ws_ptr + slice_id * stride_split + batch * M * N + offs_m[:, None] * N + offs_n[None, :]


@triton.jit
def sum_slices(
    ws_ptr,
    splits,
    batch,
    offs_m,
    offs_n,
    M,
    N,
    stride_split,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    ACC_FP64: tl.constexpr,
):
    """Add the partial tiles of slices 0, 1, ..., splits-1 in that order.

    A fixed order makes the result bitwise-reproducible, unlike atomics.
    ``.cg`` loads go to L2, where other programs' partials are visible.
    """
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    ptrs = splitk_partials(ws_ptr, 0, batch, offs_m, offs_n, M, N, stride_split)
    if ACC_FP64:
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float64)
    else:
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for _ in range(0, splits):
        acc += tl.load(ptrs, mask=mask, other=0.0, cache_modifier=".cg")
        ptrs += stride_split  # pointer arithmetic is 64-bit: no int32 wrap over many slices
    return acc


@triton.jit
def splitk_slice(K, k_per_split):
    """This program's slice of K (axis 1 of the grid): its index, where it starts, its length.

    Offsets, not advanced pointers: Inductor's analysis of a traced kernel takes a pointer that
    a helper returns for one the kernel may write, and would copy the operands around it."""
    slice_id = tl.program_id(1).to(tl.int64)
    k_start = slice_id * k_per_split
    return slice_id, k_start, tl.minimum(K - k_start, k_per_split).to(tl.int32)


@triton.jit
def last_slice_to_arrive(count_ptr, tile_id):
    """Count this slice in for ``tile_id``; True for the last of the tile's slices,
    which re-arms the counter to zero for the next launch.

    Every thread's partial is stored before thread 0's release (the pattern of
    CUTLASS's split-K semaphore: barrier, then a gpu-scope release by one thread).
    """
    tl.debug_barrier()
    arrived = tl.atomic_add(count_ptr + tile_id, 1, sem="acq_rel", scope="gpu")
    last = arrived == tl.num_programs(1) - 1
    if last:
        tl.store(count_ptr + tile_id, 0)
    return last


@triton.jit
def gemm_kernel(
    a_ptr,
    b_ptr,
    c_ptr,
    d_ptr,
    r_ptr,
    z_ptr,
    ws_ptr,
    count_ptr,
    sa_ptr,
    sb_ptr,
    M,
    N,
    K,
    stride_ab,
    stride_am,
    stride_ak,
    stride_bb,
    stride_bk,
    stride_bn,
    stride_cb,
    stride_cm,
    stride_cn,
    stride_db,
    stride_dm,
    stride_dn,
    stride_rb,
    stride_rm,
    stride_rn,
    alpha,
    beta,
    k_per_split,
    stride_split,
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
    INDEX_64: tl.constexpr,
    ACC_FP64: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    UPCAST_OPERANDS: tl.constexpr,
    SPLIT_K: tl.constexpr,
    REDUCE_INLINE: tl.constexpr,
    HINT_AM: tl.constexpr = 1,
    HINT_AK: tl.constexpr = 1,
    HINT_BK: tl.constexpr = 1,
    HINT_BN: tl.constexpr = 1,
    HINT_CM: tl.constexpr = 1,
    HINT_CN: tl.constexpr = 1,
    SCALING: tl.constexpr = "none",
    MAX_IMPRECISE_ACC: tl.constexpr = None,
    SCALE_BLOCK_A: tl.constexpr = 0,
    SCALE_BLOCK_B: tl.constexpr = 0,
):
    """Sliced-K GEMM (SPLIT_K=False): one program per (batch, C tile), walking all of K.

    Axis 0 of the grid runs over batch x tiles (it allows 2^31 - 1 programs;
    axis 1 only 65535, too few for large batches).  A batch stride of 0
    broadcasts an operand across the batch.

    Split-K (SPLIT_K=True): axis 1 of the grid picks one of ``num_programs(1)``
    slices of ``k_per_split`` (a multiple of BLOCK_K) of the K loop; each
    program stores its fp32 partial tile into a (splits, batch, M, N)
    workspace.  Then either ``splitk_reduce_kernel`` (a second launch) adds
    the slices and runs the epilogue, or, with REDUCE_INLINE, the last slice
    of each tile to finish does it: every slice bumps the tile's arrival
    counter (``count_ptr``, zero at launch, re-armed to zero by the reducer).
    Both sum the slices in slice order, so results are bitwise-reproducible.

    With SCALING (fp8 operands, ``scale_tile``) the sum is dequantized by ``sa_ptr``'s and
    ``sb_ptr``'s scales before the epilogue; otherwise neither is read.  Block-scaled
    (SCALE_BLOCK_A > 0, SCALING "blockwise") it is dequantized in the K loop, 128 of K at a time
    (``mainloop``), so split-K's partials are already scaled.
    """
    pid = tl.program_id(0)
    tiles = tl.cdiv(M, BLOCK_M) * tl.cdiv(N, BLOCK_N)
    batch = pid // tiles
    pid_m, pid_n = grouped_tile_coords(pid % tiles, M, N, BLOCK_M, BLOCK_N, GROUP_M)
    if INDEX_64:
        # Some operand spans more than 2^31 elements: int32 offsets would wrap.
        batch = batch.to(tl.int64)
        pid_m = pid_m.to(tl.int64)
        pid_n = pid_n.to(tl.int64)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    # Tell the compiler these runs are contiguous and aligned, so loads along
    # a unit-stride M or N dimension vectorize.
    offs_m = tl.max_contiguous(tl.multiple_of(offs_m, BLOCK_M), BLOCK_M)
    offs_n = tl.max_contiguous(tl.multiple_of(offs_n, BLOCK_N), BLOCK_N)

    # HINT_*: a power of two each stride is a multiple of (``eligibility.stride_hint``).
    stride_am = hint_multiple(stride_am, HINT_AM)
    stride_ak = hint_multiple(stride_ak, HINT_AK)
    stride_bk = hint_multiple(stride_bk, HINT_BK)
    stride_bn = hint_multiple(stride_bn, HINT_BN)
    stride_cm = hint_multiple(stride_cm, HINT_CM)
    stride_cn = hint_multiple(stride_cn, HINT_CN)

    a_ptr += batch * stride_ab
    b_ptr += batch * stride_bb
    k_start = 0
    k_blocks = tl.cdiv(K, 128)  # (of the whole K: block scales are indexed by it)
    if SPLIT_K:
        slice_id, k_start, K = splitk_slice(K, k_per_split)
        a_ptr += k_start * stride_ak
        b_ptr += k_start * stride_bk
    strides = (stride_am, stride_ak, stride_bk, stride_bn)
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
        MAX_IMPRECISE_ACC,
        (sa_ptr, sb_ptr, k_start, k_blocks),
        SCALE_BLOCK_A,
        SCALE_BLOCK_B,
    )
    finish = True  # this program runs the epilogue (a constant unless split-K reduces inline)
    if SPLIT_K:
        mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
        tl.store(splitk_partials(ws_ptr, slice_id, batch, offs_m, offs_n, M, N, stride_split), acc, mask=mask)
        finish = False  # (the reduce kernel does)
        if REDUCE_INLINE:
            finish = last_slice_to_arrive(count_ptr, pid)
            if finish:
                acc = sum_slices(
                    ws_ptr, tl.num_programs(1), batch, offs_m, offs_n, M, N, stride_split, BLOCK_M, BLOCK_N, ACC_FP64
                )  # fmt: skip
    if finish:
        acc = scale_tile(acc, offs_m, offs_n, M, N, sa_ptr, sb_ptr, SCALING)
        out = (
            c_ptr + batch * stride_cb, d_ptr + batch * stride_db, r_ptr + batch * stride_rb, z_ptr + batch * stride_cb,
            M, N, stride_cm, stride_cn, stride_dm, stride_dn, stride_rm, stride_rn, alpha, beta,
        )  # fmt: skip
        epilogue(acc, offs_m, offs_n, out, HAS_ALPHA, ADDEND, ACTIVATION, HAS_RESIDUAL, STORE_PREACT)


@triton.jit
def splitk_reduce_kernel(
    ws_ptr,
    c_ptr,
    d_ptr,
    r_ptr,
    z_ptr,
    sa_ptr,
    sb_ptr,
    M,
    N,
    SPLITS,
    stride_split,
    stride_cb,
    stride_cm,
    stride_cn,
    stride_db,
    stride_dm,
    stride_dn,
    stride_rb,
    stride_rm,
    stride_rn,
    alpha,
    beta,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    HAS_ALPHA: tl.constexpr,
    ADDEND: tl.constexpr,
    ACTIVATION: tl.constexpr,
    HAS_RESIDUAL: tl.constexpr,
    STORE_PREACT: tl.constexpr,
    ACC_FP64: tl.constexpr,
    SCALING: tl.constexpr = "none",
):
    """C = epilogue(sum over s of workspace[s]): split-K's second launch.

    Its own small tiles (the reduction is memory-bound), so many programs
    share the work, however few and large the GEMM's tiles were.
    """
    tiles_n = tl.cdiv(N, BLOCK_N)
    tiles = tl.cdiv(M, BLOCK_M) * tiles_n
    pid = tl.program_id(0)
    batch = (pid // tiles).to(tl.int64)
    pid_m = (pid % tiles) // tiles_n
    pid_n = (pid % tiles) % tiles_n
    # int64 offsets: a reduction is memory-bound, so the wider arithmetic is free.
    offs_m = pid_m.to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n.to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = sum_slices(ws_ptr, SPLITS, batch, offs_m, offs_n, M, N, stride_split, BLOCK_M, BLOCK_N, ACC_FP64)
    acc = scale_tile(acc, offs_m, offs_n, M, N, sa_ptr, sb_ptr, SCALING)
    out = (
        c_ptr + batch * stride_cb, d_ptr + batch * stride_db, r_ptr + batch * stride_rb, z_ptr + batch * stride_cb,
        M, N, stride_cm, stride_cn, stride_dm, stride_dn, stride_rm, stride_rn, alpha, beta,
    )  # fmt: skip
    epilogue(acc, offs_m, offs_n, out, HAS_ALPHA, ADDEND, ACTIVATION, HAS_RESIDUAL, STORE_PREACT)
