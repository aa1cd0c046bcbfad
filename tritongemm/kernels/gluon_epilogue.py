"""The warp-specialized kernel's epilogues (``gemm_gluon``), on the accumulator where the wgmma left it.

* ``finish_tile``: ``gemm.finish_tile``'s arithmetic (z = alpha acc + beta D, y = act(z) + R or a
  derivative epilogue's z * act'(R), after an fp8 product's dequantization) in the wgmma register layout;
* ``store_tile``: a consumer finishing its own tile (one or two accumulators) and storing it with TMA;
* ``epilogue_partition``: epilogue warps that finish tiles a consumer staged, under its next mainloop;
* ``gated_epilogue``: a GLU MLP's ``act(g) * u`` from the gate's and the up projection's accumulators.
"""

from .gluon_common import cta_barrier, fence_async_shared, gl, gluon, mbarrier, tile_coords, tma, tma_store


@gluon.jit
def normal_cdf(x):
    """``activations.normal_cdf`` in Gluon: Phi(x) without libdevice's branch on |x|."""
    z = gl.abs(x) * 0.7071067811865476
    t = 1.0 / (1.0 + 0.5 * z)
    p = 0.17087277 * t - 0.82215223
    p = p * t + 1.48851587
    p = p * t - 1.13520398
    p = p * t + 0.27886807
    p = p * t - 0.18628806
    p = p * t + 0.09678418
    p = p * t + 0.37409196
    p = p * t + 1.00002368
    p = p * t - 1.26551223
    tail = 0.5 * t * gl.exp2((p - z * z) * 1.4426950408889634)
    return gl.where(x >= 0, 1.0 - tail, tail)


@gluon.jit
def logit_phi_16(x):
    """log2(Phi(x) / (1 - Phi(x))) as ``gelu_16``'s fit writes it: x P(x^2), x^2 clamped at 25."""
    x2 = gl.minimum(x * x, 25.0)
    p = -1.92362056e-07 * x2 + 8.95980859e-06
    p = p * x2 - 0.000145463738
    p = p * x2 - 0.000129064741
    p = p * x2 + 0.104868111
    p = p * x2 + 2.30220155
    return x * p


@gluon.jit
def gelu_16(x):
    """``activations.gelu_16`` in Gluon: x Phi(x), Phi a logistic of x times a polynomial in x^2 (16-bit outputs)."""
    return x / (1.0 + gl.exp2(-logit_phi_16(x)))


@gluon.jit
def normal_cdf_16(x):
    """Phi(x) as ``gelu_16`` writes it, 1 / (1 + 2^-(x P(x^2))): for results rounded to 16 bits."""
    return 1.0 / (1.0 + gl.exp2(-logit_phi_16(x)))


@gluon.jit
def activate(x, ACTIVATION: gl.constexpr, OUT_BITS: gl.constexpr = 32):
    """``activations.activate`` in Gluon (no sigmoid there: 1 / (1 + exp(-x)) is what tl.sigmoid computes)."""
    if ACTIVATION == "relu":
        x = gl.maximum(x, 0.0)
    elif ACTIVATION == "gelu":
        if OUT_BITS == 16:
            x = gelu_16(x)
        else:
            x = x * normal_cdf(x)
    elif ACTIVATION == "gelu_tanh":
        u = 0.7978845608028654 * (x + 0.044715 * x * x * x)
        x = x / (1.0 + gl.exp(-2.0 * u))
    elif ACTIVATION == "silu":
        x = x / (1.0 + gl.exp(-x))
    return x


@gluon.jit
def activate_with(acc, r, ACTIVATION: gl.constexpr, OUT_BITS: gl.constexpr):
    """``activations.activate_with`` in Gluon: act(acc) + r, or a derivative epilogue's acc * act'(r)
    ("<act>_grad", r the saved pre-activation; ReLU's selects)."""
    if ACTIVATION == "relu_grad":
        y = gl.where(r > 0, acc, 0.0)
    elif ACTIVATION == "gelu_grad":  # Phi(z) + z phi(z), phi(z) = exp2(-z^2 log2(e) / 2) / sqrt(2 pi)
        if OUT_BITS == 16:
            cdf = normal_cdf_16(r)
        else:
            cdf = normal_cdf(r)
        y = acc * (cdf + r * 0.3989422804014327 * gl.exp2(-0.7213475204444817 * r * r))
    elif ACTIVATION == "gelu_tanh_grad":  # s + 2 z s (1 - s) u'(z), s = sigmoid(2u)
        r2 = r * r
        s = 1.0 / (1.0 + gl.exp(-1.5957691216057308 * (r + 0.044715 * r2 * r)))
        y = acc * (s + 1.5957691216057308 * r * s * (1.0 - s) * (1.0 + 0.134145 * r2))
    elif ACTIVATION == "silu_grad":
        s = 1.0 / (1.0 + gl.exp(-r))
        y = acc * (s * (1.0 + r * (1.0 - s)))
    else:
        y = activate(acc, ACTIVATION, OUT_BITS) + r
    return y


@gluon.jit
def finish_tile(
    acc,
    off_m,
    off_n,
    epi,
    HAS_ALPHA: gl.constexpr,
    ADDEND: gl.constexpr,
    ACTIVATION: gl.constexpr,
    HAS_RESIDUAL: gl.constexpr,
    STORE_PREACT: gl.constexpr,
    SCALING: gl.constexpr = "none",
):
    """``gemm.finish_tile`` on the accumulator in its wgmma layout: z = alpha acc + beta D, y = act(z) + R,
    after ``gemm.scale_tile``'s dequantization of fp8 products (SCALING).

    ``epi`` holds the epilogue's runtime values (the kernel's ``epi``)."""
    # fmt: off
    (M, N, d_ptr, stride_dm, stride_dn, r_ptr, stride_rm, stride_rn, z_ptr, stride_zm, stride_zn,
     alpha, beta, sa_ptr, sb_ptr) = epi
    # fmt: on
    BLOCK_M: gl.constexpr = acc.shape[0]
    BLOCK_N: gl.constexpr = acc.shape[1]
    offs_m = off_m + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, acc.type.layout))
    offs_n = off_n + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, acc.type.layout))
    # 64-bit offsets for the (M, N) operands read or written by pointer: past 2^31 elements (a 65536 x
    # 40960 residual) 32-bit ones wrap; one wide multiply-add an element either way.
    rows = gl.expand_dims(offs_m.to(gl.int64), 1)
    cols = gl.expand_dims(offs_n.to(gl.int64), 0)
    mask = (rows < M) & (cols < N)
    if SCALING == "tensorwise":
        acc = acc * (gl.load(sa_ptr) * gl.load(sb_ptr))
    elif SCALING == "rowwise":
        sa = gl.load(sa_ptr + offs_m, mask=offs_m < M, other=0.0)
        sb = gl.load(sb_ptr + offs_n, mask=offs_n < N, other=0.0)
        acc = acc * gl.expand_dims(sa, 1) * gl.expand_dims(sb, 0)
    if HAS_ALPHA:
        acc = acc * alpha
    if ADDEND == "row":  # a bias: one vector load per tile, in the accumulator's column layout
        d = gl.load(d_ptr + offs_n * stride_dn, mask=offs_n < N, other=0.0)
        acc = acc + beta * gl.expand_dims(d.to(gl.float32), 0)
    elif ADDEND == "full":
        d = gl.load(d_ptr + rows * stride_dm + cols * stride_dn, mask=mask, other=0.0)
        acc = acc + beta * d.to(gl.float32)
    if STORE_PREACT:
        gl.store(z_ptr + rows * stride_zm + cols * stride_zn, acc.to(z_ptr.dtype.element_ty), mask=mask)
    if HAS_RESIDUAL:
        r = gl.load(r_ptr + rows * stride_rm + cols * stride_rn, mask=mask, other=0.0)
        acc = activate_with(acc, r.to(gl.float32), ACTIVATION, z_ptr.dtype.element_ty.primitive_bitwidth)
    else:
        acc = activate(acc, ACTIVATION, z_ptr.dtype.element_ty.primitive_bitwidth)
    return acc


@gluon.jit
def store_tile(
    acc,
    acc2,
    off_m,
    off_n,
    epi,
    c_desc,
    c_smem,
    c2_desc,
    c2_smem,
    HAS_ALPHA: gl.constexpr,
    ADDEND: gl.constexpr,
    ACTIVATION: gl.constexpr,
    HAS_RESIDUAL: gl.constexpr,
    STORE_PREACT: gl.constexpr,
    SCALING: gl.constexpr,
    BLOCK_N2: gl.constexpr,
    EPILOGUE_SUBTILE: gl.constexpr,
):
    """The consumer finishes its own tile: the epilogue on the accumulator(s) in the wgmma layout, then
    a TMA store through the staging buffer(s) (``acc2``: the tile's second part, when BLOCK_N2 > 0)."""
    BLOCK_N: gl.constexpr = acc.shape[1]
    acc = finish_tile(
        acc, off_m, off_n, epi, HAS_ALPHA, ADDEND, ACTIVATION, HAS_RESIDUAL, STORE_PREACT, SCALING
    )
    if BLOCK_N2 > 0:
        acc2 = finish_tile(
            acc2,
            off_m,
            off_n + BLOCK_N,
            epi,
            HAS_ALPHA,
            ADDEND,
            ACTIVATION,
            HAS_RESIDUAL,
            STORE_PREACT,
            SCALING,
        )
    # The previous tile's TMA stores must have finished reading c_smem before it is overwritten.
    tma.store_wait(0)
    c_smem.store(acc.to(c_desc.dtype))
    if BLOCK_N2 > 0:
        if EPILOGUE_SUBTILE:  # one staging buffer: the second half waits for the first's store
            fence_async_shared()
            tma_store(c_desc, [off_m, off_n], c_smem)
            tma.store_wait(0)
            c_smem.store(acc2.to(c_desc.dtype))
            fence_async_shared()
            tma_store(c_desc, [off_m, off_n + BLOCK_N], c_smem)
        else:
            c2_smem.store(acc2.to(c2_desc.dtype))
            fence_async_shared()
            tma_store(c_desc, [off_m, off_n], c_smem)
            tma_store(c2_desc, [off_m, off_n + BLOCK_N], c2_smem)
    else:
        fence_async_shared()
        tma_store(c_desc, [off_m, off_n], c_smem)


@gluon.jit
def gated_epilogue(
    acc,
    acc2,
    off_m,
    off_n,
    epi,
    c_desc,
    c_smem,
    c2_desc,
    c2_smem,
    ADDEND: gl.constexpr,
    STORE_PREACT: gl.constexpr,
    GATED: gl.constexpr,
):
    """A gated tile (GATED: the activation): ``acc`` holds the gate projection's tile, ``acc2`` the up
    projection's, of the same columns; stores ``h = act(g) * u`` through ``c_desc``.

    ADDEND "row": both have a bias, the gate's at D and the up's at R.  STORE_PREACT: backward's
    pre-activations, ``g`` through ``c2_desc`` (TMA) and ``u`` at Z (pointer stores: the kernel has
    one more descriptor to spare, not two)."""
    # fmt: off
    (M, N, d_ptr, stride_dm, stride_dn, r_ptr, stride_rm, stride_rn, z_ptr, stride_zm, stride_zn,
     alpha, beta, sa_ptr, sb_ptr) = epi
    # fmt: on
    BLOCK_M: gl.constexpr = acc.shape[0]
    BLOCK_N: gl.constexpr = acc.shape[1]
    offs_n = off_n + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, acc.type.layout))
    if ADDEND == "row":
        bias_g = gl.load(d_ptr + offs_n * stride_dn, mask=offs_n < N, other=0.0)
        bias_u = gl.load(r_ptr + offs_n * stride_rn, mask=offs_n < N, other=0.0)
        acc = acc + gl.expand_dims(bias_g.to(gl.float32), 0)
        acc2 = acc2 + gl.expand_dims(bias_u.to(gl.float32), 0)
    # The previous tile's TMA stores must have finished reading the staging buffers.
    tma.store_wait(0)
    if STORE_PREACT:
        c2_smem.store(acc.to(c2_desc.dtype))
        offs_m = off_m + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, acc.type.layout))
        rows = gl.expand_dims(offs_m.to(gl.int64), 1)  # (64-bit: ``finish_tile``'s reason)
        cols = gl.expand_dims(offs_n.to(gl.int64), 0)
        u_ptrs = z_ptr + rows * stride_zm + cols * stride_zn
        gl.store(u_ptrs, acc2.to(z_ptr.dtype.element_ty), mask=(rows < M) & (cols < N))
    h = activate(acc, GATED, c_desc.dtype.primitive_bitwidth) * acc2
    c_smem.store(h.to(c_desc.dtype))
    fence_async_shared()
    tma_store(c_desc, [off_m, off_n], c_smem)
    if STORE_PREACT:
        tma_store(c2_desc, [off_m, off_n], c2_smem)


@gluon.jit
def residual_rows(
    r_ptr, stride_rm, stride_rn, row0, off_n, M, N, ROWS: gl.constexpr, BLOCK_N: gl.constexpr, layout
):
    """R's ``ROWS`` x ``BLOCK_N`` block at (row0, off_n), in ``layout`` (coalesced), zero outside (M, N)."""
    offs_m = row0 + gl.arange(0, ROWS, layout=gl.SliceLayout(1, layout))
    offs_n = off_n + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, layout))
    rows = gl.expand_dims(offs_m.to(gl.int64), 1)  # (64-bit: ``finish_tile``'s reason)
    cols = gl.expand_dims(offs_n.to(gl.int64), 0)
    return gl.load(r_ptr + rows * stride_rm + cols * stride_rn, mask=(rows < M) & (cols < N), other=0.0)


@gluon.jit
def epilogue_partition(
    c_desc,
    c_smem,
    handoff,
    epi,
    sk,
    BLOCK_M: gl.constexpr,
    BLOCK_N: gl.constexpr,
    GROUP_M: gl.constexpr,
    ACTIVATION: gl.constexpr,
    HAS_RESIDUAL: gl.constexpr,
):
    """The epilogue warps (EPILOGUE_WARPS): finish each tile the consumer staged, then TMA-store it.

    The consumer stages ``z = alpha acc + beta D`` in C's dtype (what an unfused ``act(linear(x))``
    reads back from memory) and goes on to its next tile's wgmma; these warps apply the activation
    and the residual (or a derivative epilogue's act'(R)) to the staged tile, in rows of 32 read in a
    blocked layout (16 bytes a thread; R's loads coalesced, a part ahead, the first under the consumer's
    mainloop), write it back and store it.  ``handoff`` = (staged, drained):
    the consumer arrives on ``staged`` once the tile is in shared memory, these warps on ``drained``
    once its TMA store has read it."""
    staged, drained = handoff
    dp_tiles = sk[0]
    # fmt: off
    (M, N, d_ptr, stride_dm, stride_dn, r_ptr, stride_rm, stride_rn, z_ptr, stride_zm, stride_zn,
     alpha, beta, sa_ptr, sb_ptr) = epi
    # fmt: on
    ROWS: gl.constexpr = 32
    layout: gl.constexpr = gl.BlockedLayout(
        [1, 8], [ROWS // gl.num_warps(), 32 * gl.num_warps() // ROWS], [gl.num_warps(), 1], [1, 0]
    )
    pid = gl.program_id(0)
    nprog = gl.num_programs(0)
    for tile_id in range(pid, dp_tiles, nprog):
        lap = (tile_id - pid) // nprog
        pid_m, pid_n = tile_coords(tile_id, M, N, BLOCK_M, BLOCK_N, GROUP_M)
        off_m = pid_m * BLOCK_M
        off_n = pid_n * BLOCK_N
        if HAS_RESIDUAL:  # the first rows of R are read while the consumer's mainloop still runs
            r = residual_rows(r_ptr, stride_rm, stride_rn, off_m, off_n, M, N, ROWS, BLOCK_N, layout)
        mbarrier.wait(staged, lap & 1)
        for part in gl.static_range(BLOCK_M // ROWS):
            rows_smem = c_smem.slice(part * ROWS, ROWS)
            if HAS_RESIDUAL:
                if part + 1 < BLOCK_M // ROWS:  # the next rows' loads in flight under this part's math
                    row = off_m + (part + 1) * ROWS
                    r_next = residual_rows(
                        r_ptr, stride_rm, stride_rn, row, off_n, M, N, ROWS, BLOCK_N, layout
                    )
            z = rows_smem.load(layout).to(gl.float32)
            if HAS_RESIDUAL:
                y = activate_with(z, r.to(gl.float32), ACTIVATION, c_desc.dtype.primitive_bitwidth)
                if part + 1 < BLOCK_M // ROWS:
                    r = r_next
            else:
                y = activate(z, ACTIVATION, c_desc.dtype.primitive_bitwidth)
            rows_smem.store(y.to(c_desc.dtype))
        fence_async_shared()
        tma_store(c_desc, [off_m, off_n], c_smem)
        tma.store_wait(0)
        cta_barrier()  # every thread past the wait: the store has read the tile
        mbarrier.arrive(drained)
