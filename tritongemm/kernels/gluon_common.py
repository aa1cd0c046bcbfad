"""What the warp-specialized kernel (``gemm_gluon.py``) shares with Gluon and with the other kernels.

* The Gluon Hopper API, feature-detected: the names this Triton has for the TMA
  copies and the CTA barrier, and ``GLUON_AVAILABLE`` / ``GLUON_UNAVAILABLE_REASON``
  (the module imports, and its functions are defined, where Gluon is missing);
  clusters of CTAs (``CLUSTER_AVAILABLE``: CGA layouts and TMA multicast, Triton 3.7+).
* The tile arithmetic: wgmma's accumulator layout, a slot's bytes, clusters' CGA layouts
  and mbarriers.
* The producer partition (TMA loads of the A and B K-tiles into the ring, ``producer``) and the
  consumers' K-step helpers: the wgmma of one step, block-scaled or not, and the ring's slots.
* Stream-K's fix-up (``gemm_streamk``'s protocol): a contributor stores its partial
  tile in its program's slot and counts it in; the finisher waits for the count,
  adds the partials in program order and re-arms the counter.
"""

import dataclasses
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

#: Can wgmma sum fp8 products in full fp32 precision (a partial accumulator added every
#: ``max_num_imprecise_acc`` K)?  Without it the Gluon kernel runs fp8 with fast accumulation only.
PRECISE_FP8_AVAILABLE: bool = (
    GLUON_AVAILABLE and "max_num_imprecise_acc" in inspect.signature(warpgroup_mma).parameters
)

# Clusters (two CTAs sharing a box by TMA multicast) need Gluon's CGA layouts (Triton 3.7+).
CLUSTER_UNAVAILABLE_REASON = GLUON_UNAVAILABLE_REASON
if GLUON_AVAILABLE:
    try:
        _layout_fields = {f.name for f in dataclasses.fields(gl.NVMMASharedLayout)}
        _load_args = inspect.signature(tma_load).parameters
    except (TypeError, ValueError):
        _layout_fields, _load_args = set(), {}
    if "cga_layout" not in _layout_fields or "multicast" not in _load_args:
        CLUSTER_UNAVAILABLE_REASON = "this Triton's Gluon has no CGA layouts or TMA multicast (Triton < 3.7)"
    elif not hasattr(mbarrier, "allocate_mbarrier"):
        CLUSTER_UNAVAILABLE_REASON = "this Triton's Gluon has no cluster-wide mbarriers"
CLUSTER_AVAILABLE: bool = not CLUSTER_UNAVAILABLE_REASON

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


if CLUSTER_AVAILABLE:
    cluster_mbarriers = mbarrier.allocate_mbarrier
else:  # (a name for the jit functions below to refer to; never called where clusters are unavailable)

    @gluon.jit
    def cluster_mbarriers(batch: gl.constexpr = None, two_ctas: gl.constexpr = False):
        gl.static_assert(False, "clusters need Triton 3.7+ (CLUSTER_UNAVAILABLE_REASON)")


@gluon.constexpr_function
def cluster_split(CLUSTER_M):
    """The CGA layout of a tile split between a cluster's two CTAs: along its rows (CLUSTER_M == 2)
    or its columns."""
    return [[1, 0]] if CLUSTER_M == 2 else [[0, 1]]


def cluster_layouts(cluster_m: int, cluster_n: int, a_row_major: bool, b_row_major: bool):
    """The CGA layouts of A's, B's and C's boxes (as their descriptors lay them out: A^T and B^T
    when not row-major) for a cluster of ``cluster_m`` x ``cluster_n`` CTAs, or ``(None,) * 3``
    without one.  Split along M (N), each CTA holds its half of A (B) and of C, and B's (A's)
    box is the same for both (basis [0, 0]: multicast)."""
    if cluster_m * cluster_n == 1:
        return None, None, None
    if cluster_m * cluster_n != 2:
        raise ValueError(f"a cluster is two CTAs, got {cluster_m} x {cluster_n}")
    split_rows, split_cols, same = [[1, 0]], [[0, 1]], [[0, 0]]
    if cluster_m == 2:
        return (split_rows if a_row_major else split_cols), same, split_rows
    return same, (split_cols if b_row_major else split_rows), split_cols


@gluon.constexpr_function
def accumulator_layout(BLOCK_M, BLOCK_N, num_warps, CLUSTER_M=1, CLUSTER_N=1, INSTR_K=16):
    """wgmma's register layout for a BLOCK_M x BLOCK_N fp32 tile on ``num_warps`` warps: warpgroups
    stacked along M (each owns BLOCK_M / groups rows), one instruction as wide as BLOCK_N allows
    and 32 bytes of K deep (``INSTR_K``: 16 for 2-byte operands, 32 for fp8).
    In a cluster the tile is the cluster's: each CTA holds its CLUSTER_M x CLUSTER_N share."""
    width = BLOCK_N // CLUSTER_N
    n = min(width, 256)
    while width % n:
        n -= 8
    if CLUSTER_M * CLUSTER_N == 1:
        return gl.NVMMADistributedLayout(
            version=[3, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, n, INSTR_K]
        )
    return gl.NVMMADistributedLayout(
        version=[3, 0],
        warps_per_cta=[num_warps, 1],
        instr_shape=[16, n, INSTR_K],
        cga_layout=cluster_split(CLUSTER_M),
    )


@gluon.constexpr_function
def tile_width(BLOCK_N, BLOCK_N2, GATED=""):
    """The tile's N extent: its power-of-two part and the second part (0 for none).  A gated tile's two
    accumulators cover the same columns of two weights (``gemm_gluon``'s GATED)."""
    return BLOCK_N if GATED != "" else BLOCK_N + BLOCK_N2


@gluon.constexpr_function
def slot_bytes(a_bytes, b_bytes, b2_bytes, has_b2):
    """The bytes the copy engine writes into one ring slot (A's box, B's, and B's second part if any)."""
    return a_bytes + b_bytes + (b2_bytes if has_b2 else 0)


@gluon.jit
def barriers(count: gl.constexpr, CTAS: gl.constexpr, CLUSTER_WIDE: gl.constexpr):
    """``count`` mbarriers in each of a cluster's ``CTAS`` CTAs, or with ``CLUSTER_WIDE`` (two CTAs)
    ``count`` for the pair, held by the first CTA: both CTAs arrive on them, the first one waits."""
    if CTAS == 1:
        bars = gl.allocate_shared_memory(gl.int64, [count, 1], mbarrier.MBarrierLayout())
    else:
        bars = cluster_mbarriers(batch=count, two_ctas=CLUSTER_WIDE)
    return bars


@gluon.jit
def load_box(desc, row, col, bar, dst, MULTICAST: gl.constexpr):
    """TMA-load ``desc``'s box at (row, col) into ``dst``, counted on ``bar``; with MULTICAST into the
    same slot of every CTA of the cluster (``dst``'s layout says which CTAs share the box)."""
    if MULTICAST:
        tma_load(desc, [row, col], bar, dst, multicast=True)
    else:
        tma_load(desc, [row, col], bar, dst)


@gluon.jit
def mma(a, b, acc, MAX_IMPRECISE_ACC: gl.constexpr):
    """One K-step's async wgmma; fp8 products are added into fp32 every MAX_IMPRECISE_ACC of K
    (None: fast accumulation)."""
    if MAX_IMPRECISE_ACC is None:
        acc = warpgroup_mma(a, b, acc, is_async=True)
    else:
        acc = warpgroup_mma(a, b, acc, is_async=True, max_num_imprecise_acc=MAX_IMPRECISE_ACC)
    return acc


@gluon.jit
def block_scales(
    epi,
    off_m,
    off_n,
    kb,
    k_blocks,
    layout: gl.constexpr,
    BLOCK_M: gl.constexpr,
    BLOCK_N: gl.constexpr,
    SCALE_BLOCK_A: gl.constexpr,
    SCALE_BLOCK_B: gl.constexpr,
):
    """Block-scaled fp8: the scales of K block ``kb`` (of ``k_blocks``) for the tile at (off_m, off_n),
    in the layouts of ``gemm.k_step_scales``: a vector (in ``layout``'s row or column slice) where each
    row of A (column of B) has its own, one value where the tile lies in one 128-wide block."""
    M = epi[0]
    N = epi[1]
    sa_ptr = epi[13]
    sb_ptr = epi[14]
    if SCALE_BLOCK_A == 1:
        offs_m = off_m + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, layout))
        sa = gl.load(sa_ptr + kb * M + offs_m, mask=offs_m < M, other=0.0)
    else:
        gl.static_assert(BLOCK_M <= SCALE_BLOCK_A, "a tile in one block of A's scales")
        sa = gl.load(sa_ptr + (off_m // SCALE_BLOCK_A) * k_blocks + kb)
    if SCALE_BLOCK_B == 1:
        offs_n = off_n + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, layout))
        sb = gl.load(sb_ptr + kb * N + offs_n, mask=offs_n < N, other=0.0)
    else:
        gl.static_assert(BLOCK_N <= SCALE_BLOCK_B, "a tile in one block of B's scales")
        sb = gl.load(sb_ptr + (off_n // SCALE_BLOCK_B) * k_blocks + kb)
    return sa, sb


@gluon.jit
def block_scaled_mma(
    a,
    b,
    acc,
    scales,
    epi,
    off_m,
    off_n,
    kb,
    k_blocks,
    SCALE_BLOCK_A: gl.constexpr,
    SCALE_BLOCK_B: gl.constexpr,
):
    """One K-step of block-scaled fp8: ``acc + (a @ b) * scale_a[rows, kb] * scale_b[kb, cols]``; returns it
    and the next K-step's scales.

    The step's products go into a fresh accumulator (128 of K: one scale block, summed as cuBLAS's
    precise mode sums it) and are added into ``acc`` scaled, as DeepGEMM does.  The step waits for its
    wgmma, so none stays in flight across steps.  ``scales`` (``block_scales``) were loaded a step
    ahead, so their latency hides under the previous wgmma; the next step's are loaded under this one.
    """
    layout: gl.constexpr = acc.type.layout
    BLOCK_M: gl.constexpr = acc.shape[0]
    BLOCK_N: gl.constexpr = acc.shape[1]
    part = warpgroup_mma(a, b, gl.zeros(acc.shape, gl.float32, layout), use_acc=False, is_async=True)
    following = block_scales(
        epi, off_m, off_n, gl.minimum(kb + 1, k_blocks - 1), k_blocks, layout, BLOCK_M, BLOCK_N,
        SCALE_BLOCK_A, SCALE_BLOCK_B,
    )  # fmt: skip
    part = warpgroup_mma_wait(0, deps=(part,))
    sa, sb = scales
    if SCALE_BLOCK_A == 1 and SCALE_BLOCK_B == 1:
        acc = acc + part * (gl.expand_dims(sa, 1) * gl.expand_dims(sb, 0))
    elif SCALE_BLOCK_A == 1:  # one scale for the tile's columns: one FMA an element
        acc = acc + part * gl.expand_dims(sa * sb, 1)
    else:
        acc = acc + part * gl.expand_dims(sb * sa, 0)
    return acc, following


@gluon.jit
def partial_product(
    ring,
    step,
    row_offset,
    acc,
    NUM_STAGES: gl.constexpr,
    A_ROW_MAJOR: gl.constexpr,
    B_ROW_MAJOR: gl.constexpr,
):
    """Issue ring step ``step``'s wgmma into fresh registers of ``acc``'s shape (rows ``row_offset`` on of
    A's slot); returns the in-flight partial product."""
    _, a, b = ready_operands(ring, step, NUM_STAGES, A_ROW_MAJOR, B_ROW_MAJOR)
    if a.shape[0] != acc.shape[0]:
        a = a.slice(row_offset, acc.shape[0])
    layout: gl.constexpr = acc.type.layout
    zero = gl.zeros(acc.shape, gl.float32, layout)
    return warpgroup_mma(a, b, zero, use_acc=False, is_async=True)


@gluon.jit
def deferred_mainloop(
    ring,
    acc,
    step,
    k_tiles,
    row_offset,
    NUM_STAGES: gl.constexpr,
    A_ROW_MAJOR: gl.constexpr,
    B_ROW_MAJOR: gl.constexpr,
    CLUSTERED: gl.constexpr,
):
    """A tile's K loop for fp8 sums added into fp32 every K-step (precise sums), one step late: step k's
    wgmma runs into partial registers of its own while step k-1's retires and is added, so the tensor
    cores do not wait on the adds.  Returns (acc, the next ring step).  ``k_tiles`` > 0.

    Two sets of partial registers alternate, two steps a trip, so no partial moves between sets: ptxas
    serializes every wgmma of the kernel if an instruction reads registers that a wgmma in flight
    writes, and a move of the in-flight set would.  Each step's slot is released once it has retired."""
    pb = partial_product(ring, step, row_offset, acc, NUM_STAGES, A_ROW_MAJOR, B_ROW_MAJOR)  # step 0: set B
    pb = warpgroup_mma_wait(1, deps=(pb,))  # (waits for nothing: a loop-carried value is a tensor)
    step += 1
    for _ in range(1, k_tiles - 1, 2):  # two steps: set A, then set B
        pa = partial_product(ring, step, row_offset, acc, NUM_STAGES, A_ROW_MAJOR, B_ROW_MAJOR)
        acc, pa = add_retired(ring, acc, pb, pa, step - 1, NUM_STAGES, CLUSTERED)
        step += 1
        pb = partial_product(ring, step, row_offset, acc, NUM_STAGES, A_ROW_MAJOR, B_ROW_MAJOR)
        acc, pb = add_retired(ring, acc, pa, pb, step - 1, NUM_STAGES, CLUSTERED)
        step += 1
    # The last one or two steps.  Each branch drains its own sets: a set still in flight where the
    # branches join would be moved.
    if k_tiles % 2 == 0:
        pa = partial_product(ring, step, row_offset, acc, NUM_STAGES, A_ROW_MAJOR, B_ROW_MAJOR)
        acc, pa = add_retired(ring, acc, pb, pa, step - 1, NUM_STAGES, CLUSTERED)
        step += 1
        acc, pa = add_retired(ring, acc, pa, pa, step - 1, NUM_STAGES, CLUSTERED, LAST=True)
    else:
        acc, pb = add_retired(ring, acc, pb, pb, step - 1, NUM_STAGES, CLUSTERED, LAST=True)
    return acc, step


@gluon.jit
def add_retired(
    ring,
    acc,
    done,
    issued,
    done_step,
    NUM_STAGES: gl.constexpr,
    CLUSTERED: gl.constexpr,
    LAST: gl.constexpr = False,
):
    """Wait for partial ``done`` (ring step ``done_step``), release its slot and add it into ``acc``;
    ``issued``, issued after it, stays in flight (LAST: none was, ``issued`` is ``done``)."""
    if LAST:
        done = warpgroup_mma_wait(0, deps=(done,))
        issued = done
    else:
        done, issued = warpgroup_mma_wait(1, deps=(done, issued))
    free_slot(ring, done_step % NUM_STAGES, True, CLUSTERED)
    return acc + done, issued


@gluon.jit
def tile_coords(tile_id, M, N, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, GROUP_M: gl.constexpr):
    """(pid_m, pid_n) of a linear tile id in grouped order, as ``gemm.grouped_tile_coords``."""
    tiles_m = gl.cdiv(M, BLOCK_M)
    tiles_n = gl.cdiv(N, BLOCK_N)
    per_group = GROUP_M * tiles_n
    first_m = (tile_id // per_group) * GROUP_M
    rows = gl.minimum(tiles_m - first_m, GROUP_M)
    pid_m = first_m + (tile_id % per_group) % rows
    pid_n = (tile_id % per_group) // rows
    return pid_m, pid_n


@gluon.jit
def load_k_steps(
    descs,
    ring,
    off_m,
    off_n,
    k_begin,
    k_end,
    step,
    BLOCK_N: gl.constexpr,
    BLOCK_K: gl.constexpr,
    NUM_STAGES: gl.constexpr,
    A_ROW_MAJOR: gl.constexpr,
    B_ROW_MAJOR: gl.constexpr,
    BLOCK_N2: gl.constexpr,
    CLUSTER_M: gl.constexpr,
    CLUSTER_N: gl.constexpr,
    GATED: gl.constexpr,
):
    """Load K-steps ``k_begin .. k_end - 1`` of the tile at (off_m, off_n) into the ring from ring step
    ``step`` on; returns the next ring step.

    In a cluster of two along M (N), B's (A's) box is the same for both CTAs: the first CTA's copy
    writes it into both CTAs' slots (TMA multicast), which it may do once both CTAs' consumers are
    done with the slot (``gathered``); each CTA loads its own half of the other operand."""
    a_desc, b_desc, b2_desc = descs
    # B2's box: the tile's last BLOCK_N2 columns of B, or the same columns of the second weight (GATED).
    B2_SHIFT: gl.constexpr = 0 if GATED != "" else BLOCK_N
    a_ring, b_ring, b2_ring, ready, empty, _, gathered = ring
    if CLUSTER_M * CLUSTER_N > 1:
        nbytes: gl.constexpr = slot_bytes(
            a_desc.nbytes_per_cta, b_desc.nbytes_per_cta, b2_desc.nbytes_per_cta, BLOCK_N2 > 0
        )
    else:
        nbytes: gl.constexpr = slot_bytes(
            a_desc.block_type.nbytes, b_desc.block_type.nbytes, b2_desc.block_type.nbytes, BLOCK_N2 > 0
        )
    for ki in range(k_begin, k_end):
        slot = step % NUM_STAGES
        # A fresh mbarrier counts as having completed the phase before phase 0,
        # so the first lap finds every slot empty.
        phase = ((step // NUM_STAGES) & 1) ^ 1
        mbarrier.wait(empty.index(slot), phase)
        if CLUSTER_M * CLUSTER_N > 1:
            mbarrier.wait(gathered.index(slot), phase)  # (a wait in the first CTA only)
        bar = ready.index(slot)
        mbarrier.expect(bar, nbytes)
        off_k = ki * BLOCK_K
        if A_ROW_MAJOR:
            load_box(a_desc, off_m, off_k, bar, a_ring.index(slot), CLUSTER_N > 1)
        else:
            load_box(a_desc, off_k, off_m, bar, a_ring.index(slot), CLUSTER_N > 1)
        if B_ROW_MAJOR:
            load_box(b_desc, off_k, off_n, bar, b_ring.index(slot), CLUSTER_M > 1)
        else:
            load_box(b_desc, off_n, off_k, bar, b_ring.index(slot), CLUSTER_M > 1)
        if BLOCK_N2 > 0:
            if B_ROW_MAJOR:
                load_box(b2_desc, off_k, off_n + B2_SHIFT, bar, b2_ring.index(slot), CLUSTER_M > 1)
            else:
                load_box(b2_desc, off_n + B2_SHIFT, off_k, bar, b2_ring.index(slot), CLUSTER_M > 1)
        step += 1
    return step


@gluon.jit
def producer(
    a_desc,
    b_desc,
    b2_desc,
    ring,
    M,
    N,
    K,
    sk,
    BLOCK_M: gl.constexpr,
    BLOCK_N: gl.constexpr,
    BLOCK_K: gl.constexpr,
    GROUP_M: gl.constexpr,
    NUM_STAGES: gl.constexpr,
    A_ROW_MAJOR: gl.constexpr,
    B_ROW_MAJOR: gl.constexpr,
    BLOCK_N2: gl.constexpr,
    STREAM_K: gl.constexpr,
    CLUSTER_M: gl.constexpr,
    CLUSTER_N: gl.constexpr,
    GATED: gl.constexpr,
):
    """The load partition: fill ring slots in the order the consumers drain them (whole tiles, then, with
    STREAM_K, this program's share of the streamed K-steps, walked backwards as the consumer walks it)."""
    dp_tiles, iters_per_program, tile_span = sk
    descs = (a_desc, b_desc, b2_desc)
    TILE_N: gl.constexpr = tile_width(BLOCK_N, BLOCK_N2, GATED)
    num_tiles = gl.cdiv(M, BLOCK_M) * gl.cdiv(N, TILE_N)
    k_tiles = gl.cdiv(K, BLOCK_K)
    step = 0  # K-steps issued by this program so far, over all its tiles
    for tile_id in range(gl.program_id(0), dp_tiles, gl.num_programs(0)):
        pid_m, pid_n = tile_coords(tile_id, M, N, BLOCK_M, TILE_N, GROUP_M)
        step = load_k_steps(
            descs, ring, pid_m * BLOCK_M, pid_n * TILE_N, 0, k_tiles, step,
            BLOCK_N, BLOCK_K, NUM_STAGES, A_ROW_MAJOR, B_ROW_MAJOR, BLOCK_N2, CLUSTER_M, CLUSTER_N, GATED,
        )  # fmt: skip
    if STREAM_K:
        first = gl.program_id(0) * iters_per_program
        last = gl.minimum(first + iters_per_program, (num_tiles - dp_tiles) * tile_span)
        while last > first:
            tile, tile_start, seg_start = streamk_segment(first, last, tile_span)
            pid_m, pid_n = tile_coords(dp_tiles + tile, M, N, BLOCK_M, TILE_N, GROUP_M)
            seg_end = gl.minimum(last - tile_start, k_tiles)  # (a tile's span may end past its K-steps)
            step = load_k_steps(
                descs, ring, pid_m * BLOCK_M, pid_n * TILE_N, seg_start - tile_start, seg_end,
                step, BLOCK_N, BLOCK_K, NUM_STAGES, A_ROW_MAJOR, B_ROW_MAJOR, BLOCK_N2, 1, 1, "",
            )  # fmt: skip
            last = seg_start


@gluon.jit
def ready_operands(
    ring, step, NUM_STAGES: gl.constexpr, A_ROW_MAJOR: gl.constexpr, B_ROW_MAJOR: gl.constexpr
):
    """Wait until ring step ``step``'s slot is loaded; its index and A's and B's tiles as wgmma reads them
    (a slot holding a tile transposed is read through a permuted view)."""
    a_ring, b_ring, _, ready, _, _, _ = ring
    slot = step % NUM_STAGES
    mbarrier.wait(ready.index(slot), (step // NUM_STAGES) & 1)
    a = a_ring.index(slot)
    if not A_ROW_MAJOR:
        a = a.permute((1, 0))
    b = b_ring.index(slot)
    if not B_ROW_MAJOR:
        b = b.permute((1, 0))
    return slot, a, b


@gluon.jit
def free_slot(ring, slot, pred, CLUSTERED: gl.constexpr):
    """This CTA's consumers are done reading ``slot``: its producer may refill it, and in a cluster so
    may the first CTA's multicast (``gathered`` completes once both CTAs arrive)."""
    mbarrier.arrive(ring[4].index(slot), pred=pred)
    if CLUSTERED:
        mbarrier.arrive(ring[6].index(slot), pred=pred)


@gluon.jit
def release_slot(
    ring, step, slot, not_first, IN_FLIGHT: gl.constexpr, NUM_STAGES: gl.constexpr, CLUSTERED: gl.constexpr
):
    """After issuing ring step ``step``'s wgmma (``slot``): with one wgmma left in flight, the previous
    step's has retired and its slot may be refilled (none before a segment's first step); with none in
    flight, this step's own slot."""
    if IN_FLIGHT:
        free_slot(ring, (step + NUM_STAGES - 1) % NUM_STAGES, not_first, CLUSTERED)
    else:
        free_slot(ring, slot, True, CLUSTERED)


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
