"""What the warp-specialized kernel (``gemm_gluon.py``) shares with Gluon and with the other kernels.

* The Gluon Hopper API, feature-detected: the names this Triton has for the TMA
  copies and the CTA barrier, and ``GLUON_AVAILABLE`` / ``GLUON_UNAVAILABLE_REASON``
  (the module imports, and its functions are defined, where Gluon is missing).
* The fused epilogue on the wgmma accumulator (``gemm.finish_tile``'s arithmetic).
* Stream-K's fix-up (``gemm_streamk``'s protocol): a contributor stores its partial
  tile in its program's slot and counts it in; the finisher waits for the count,
  adds the partials in program order and re-arms the counter.
"""

import inspect

try:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (
        fence_async_shared,
        mbarrier,
        tma,
        warpgroup_mma,
        warpgroup_mma_wait,
    )
except Exception as exc:  # no triton.experimental.gluon, or no Hopper ops in it
    GLUON_UNAVAILABLE_REASON = f"triton's Gluon Hopper API is not importable ({type(exc).__name__}: {exc})"
    fence_async_shared = mbarrier = tma = warpgroup_mma = warpgroup_mma_wait = None
    tma_load = tma_store = cta_barrier = None
else:
    GLUON_UNAVAILABLE_REASON = ""
    # Triton 3.6 takes warp_specialize([(fn, args), ...], warps, regs); earlier releases took
    # (default_args, default_fn, worker_args, worker_fns, ...), which this kernel does not speak.
    if list(inspect.signature(gl.warp_specialize).parameters)[:1] != ["functions_and_args"]:
        GLUON_UNAVAILABLE_REASON = "gl.warp_specialize predates the list-of-partitions form (triton < 3.6)"
    # Triton 3.9 renamed the TMA copies (the old names remain, raising an error when called).
    tma_load = getattr(tma, "async_load", None) or getattr(tma, "async_copy_global_to_shared", None)
    tma_store = getattr(tma, "async_store", None) or getattr(tma, "async_copy_shared_to_global", None)
    if tma_load is None or tma_store is None:
        GLUON_UNAVAILABLE_REASON = "gluon's hopper.tma has neither async_load nor async_copy_global_to_shared"
    # Triton 3.6's thread_barrier became barrier (with a cluster option) by 3.9.
    cta_barrier = getattr(gl, "barrier", None) or getattr(gl, "thread_barrier", None)
    if cta_barrier is None:
        GLUON_UNAVAILABLE_REASON = "gluon has neither barrier nor thread_barrier"

GLUON_AVAILABLE: bool = not GLUON_UNAVAILABLE_REASON

if not GLUON_AVAILABLE:

    class _Absent:
        """Lets the definitions below execute (never compile) where gluon is missing."""

        constexpr = None

        @staticmethod
        def jit(fn=None, **_options):
            return fn if fn is not None else (lambda f: f)

        @staticmethod
        def constexpr_function(fn):
            return fn

    gluon = gl = _Absent


@gluon.jit
def activate(x, ACTIVATION: gl.constexpr):
    """``gemm.activate`` in Gluon (which has no sigmoid: 1 / (1 + exp(-x)) is what tl.sigmoid computes)."""
    if ACTIVATION == "relu":
        x = gl.maximum(x, 0.0)
    elif ACTIVATION == "gelu":
        x = 0.5 * x * (1.0 + gl.erf(x * 0.7071067811865476))
    elif ACTIVATION == "gelu_tanh":
        u = 0.7978845608028654 * (x + 0.044715 * x * x * x)
        x = x / (1.0 + gl.exp(-2.0 * u))
    elif ACTIVATION == "silu":
        x = x / (1.0 + gl.exp(-x))
    return x


@gluon.jit
def finish_tile(
    acc,
    off_m,
    off_n,
    epi,
    HAS_ALPHA: gl.constexpr,
    HAS_ADDEND: gl.constexpr,
    ACTIVATION: gl.constexpr,
    HAS_RESIDUAL: gl.constexpr,
    STORE_PREACT: gl.constexpr,
):
    """``gemm.finish_tile`` on the accumulator in its wgmma layout: z = alpha acc + beta D, y = act(z) + R.

    ``epi`` holds the epilogue's runtime values (the kernel's ``epi``)."""
    # fmt: off
    (M, N, d_ptr, stride_dm, stride_dn, r_ptr, stride_rm, stride_rn, z_ptr, stride_zm, stride_zn,
     alpha, beta) = epi
    # fmt: on
    BLOCK_M: gl.constexpr = acc.shape[0]
    BLOCK_N: gl.constexpr = acc.shape[1]
    offs_m = off_m + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, acc.type.layout))
    offs_n = off_n + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, acc.type.layout))
    rows = gl.expand_dims(offs_m, 1)
    cols = gl.expand_dims(offs_n, 0)
    mask = (rows < M) & (cols < N)
    if HAS_ALPHA:
        acc = acc * alpha
    if HAS_ADDEND:
        d = gl.load(d_ptr + rows * stride_dm + cols * stride_dn, mask=mask, other=0.0)
        acc = acc + beta * d.to(gl.float32)
    if STORE_PREACT:
        gl.store(z_ptr + rows * stride_zm + cols * stride_zn, acc.to(z_ptr.dtype.element_ty), mask=mask)
    acc = activate(acc, ACTIVATION)
    if HAS_RESIDUAL:
        r = gl.load(r_ptr + rows * stride_rm + cols * stride_rn, mask=mask, other=0.0)
        acc = acc + r.to(gl.float32)
    return acc


@gluon.jit
def partial_ptrs(ws_ptr, program, acc):
    """One program's fp32 workspace slot of ``acc``'s shape, addressed in ``acc``'s (the wgmma) layout."""
    BLOCK_M: gl.constexpr = acc.shape[0]
    BLOCK_N: gl.constexpr = acc.shape[1]
    rows = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, acc.type.layout))
    cols = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, acc.type.layout))
    offs = gl.expand_dims(rows, 1) * BLOCK_N + gl.expand_dims(cols, 0)
    return ws_ptr + program * (BLOCK_M * BLOCK_N) + offs


@gluon.jit
def streamk_contribute(acc, fixup, tile, pid):
    """Hand a partial tile to its finisher: store it in this program's slot, then count it in
    (``gemm_streamk.streamk_contribute``; the barrier is the consumer partition's own)."""
    ws_ptr, count_ptr = fixup
    gl.store(partial_ptrs(ws_ptr, pid, acc), acc)
    cta_barrier()  # every thread's part is stored before the release
    gl.atomic_add(count_ptr + tile, 1, sem="release", scope="gpu")


@gluon.jit
def streamk_collect(acc, fixup, tile, tile_start, pid, iters_per_program):
    """The finisher of a split tile: wait for the programs that contributed (``tile_start //
    iters_per_program .. pid - 1``), add their partials in program order, re-arm the tile's counter."""
    ws_ptr, count_ptr = fixup
    owner = tile_start // iters_per_program
    while gl.atomic_add(count_ptr + tile, 0, sem="acquire", scope="gpu") < pid - owner:
        pass
    cta_barrier()
    for p in range(owner, pid):
        ptrs = partial_ptrs(ws_ptr, p, acc)
        acc += gl.load(ptrs, cache_modifier=".cg")
    gl.store(count_ptr + tile, 0)
    return acc


@gluon.jit
def streamk_segment(first, last, k_tiles):
    """The segment of a Stream-K share that ends at ``last`` (exclusive), as ``gemm_streamk.streamk_segment``:
    its tile (counted from the first streamed tile), the tile's first iteration, where the segment starts."""
    tile = (last - 1) // k_tiles
    tile_start = tile * k_tiles
    return tile, tile_start, gl.maximum(tile_start, first)
