"""A warp-specialized, persistent Hopper GEMM written in Gluon (CUTLASS sm90 style).

Where ``gemm_tma`` leaves the pipeline to Triton's compiler, this kernel spells
it out.  Each program (one per SM) splits its warps into two partitions:

* the **producer**, one warp, walks the program's tiles and issues TMA loads of
  the A and B K-tiles into a ring of ``NUM_STAGES`` shared-memory slots;
* the **consumers** run async ``wgmma`` on each slot, then the fused epilogue,
  then a TMA store.  With ``CONSUMERS=1`` they are the launch's ``num_warps``
  (one warpgroup, or two cooperating on each tile, stacked along M: CUTLASS's
  cooperative kernel); with ``CONSUMERS=2`` two warpgroups of 4 warps take
  alternate tiles and take turns at the ring (CUTLASS's ping-pong), each with
  its own output staging tile, so one's epilogue runs under the other's mainloop.

Each slot has two mbarriers.  ``ready[s]`` completes when the copy engine has
written the slot's bytes (the producer arms it with ``expect``); ``empty[s]``
completes when the consumers no longer read the slot (they arrive on it once
the wgmma that read it has retired).  The producer waits ``empty``, the
consumers wait ``ready``, each flipping the parity it waits for every lap of
the ring, so neither side ever needs the other's counters.

The consumers keep one wgmma in flight (``warpgroup_mma_wait(1)``): while the
tensor cores work on K-step i, slot i-1 is released and refilled.  With a
single slot there is nothing to overlap, so they wait for the wgmma to retire
before releasing it.  In CUTLASS's terms (``MmaSingleStage`` /
``MmaPipelined`` / ``MmaMultistage``, see ``tritongemm.planning.pipelines``):

* ``NUM_STAGES=1``: single_stage, load, wait, multiply, release, strictly in turn;
* ``NUM_STAGES=2``: double_buffer, the load of K-step i+1 runs under the wgmma of i;
* ``NUM_STAGES>=3``: multi_stage, the producer runs up to ``NUM_STAGES - 1``
  K-steps ahead (minus the one still read by the wgmma in flight), which also
  carries it across tile boundaries, so the next tile's first loads overlap this
  tile's epilogue.

With ``STREAM_K`` (one consumer, one accumulator) the persistent schedule is
``gemm_streamk``'s data-parallel + Stream-K hybrid: whole tiles first, then the
remaining tiles' K-steps in equal contiguous shares, one per program, each walked
backwards one tile segment at a time.  A streamed tile may span more of the
shares' iterations than it has K-steps (``tile_span``), which lets the launcher
cut each tile of the last wave into equal chunks that start at the same K offset
in every tile (``schedules.split_tail_schedule``), so neighbouring programs load
the same K-step of shared panels together, as whole tiles do.  The producer walks
the same segments, so its loads run ahead across segment boundaries as they do
across tiles.  A segment that does not reach its tile's last K-step is a partial:
the consumer stores it in its program's fp32 workspace slot and counts it in with
a release atomic; the program that computes the last K-step waits for the count,
adds the partials in program order (deterministic), re-arms the counter and runs
the epilogue.  A program only waits on lower program ids that contribute before
they wait on anyone, and every program is resident (one per SM), so the wait
cannot deadlock.

The epilogue (``out = act(alpha * acc + beta * D) + R``, optionally storing the
pre-activation ``Z``; the same arithmetic as ``gemm.finish_tile``) works on the
accumulator in its wgmma register layout, writes the tile to one shared-memory
buffer and stores it with TMA.  The store is only waited for before the next
tile's epilogue reuses the buffer, so it overlaps the next tile's mainloop.
With ``EPILOGUE_SUBTILE`` a power-of-two tile runs as two halves (two
accumulators) staged in turn through a half-width buffer, which leaves room for
one more ring slot (CUTLASS sizes its stage count from what the epilogue's
shared memory leaves, the same trade).

Gluon's API moved between Triton 3.6 and 3.9 (``tma.async_copy_global_to_shared``
became ``tma.async_load``, ...): the shims below pick the spelling this Triton
has at import time.  On a Triton without usable Gluon the module still imports;
``GLUON_AVAILABLE`` is False and ``GLUON_UNAVAILABLE_REASON`` says why.
"""

from .gluon_common import (
    CLUSTER_AVAILABLE,
    CLUSTER_UNAVAILABLE_REASON,
    GLUON_AVAILABLE,
    GLUON_UNAVAILABLE_REASON,
    PRECISE_FP8_AVAILABLE,
    accumulator_layout,
    barriers,
    block_scaled_mma,
    block_scales,
    cluster_layouts,
    cta_barrier,
    deferred_mainloop,
    fence_async_shared,
    free_slot,
    gl,
    gluon,
    mbarrier,
    mma,
    producer,
    ready_operands,
    release_slot,
    streamk_collect,
    streamk_contribute,
    streamk_segment,
    tile_coords,
    tile_width,
    tma,
    tma_store,
    warpgroup_mma_wait,
)
from .gluon_epilogue import epilogue_partition, finish_tile, gated_epilogue, store_tile

#: Registers per thread of the producer warp; it holds a few scalars only.  setmaxnreg hands the
#: rest to the consumers (CUTLASS's sm90 kernels give their producer 40 as well).
PRODUCER_REGS = gl.constexpr(40) if GLUON_AVAILABLE else 40
#: Registers per thread of the second consumer warpgroup in ping-pong (CUTLASS's ping-pong kernels give
#: each consumer 232): with the producer's 40 and the first consumer's share of what is left, 2 x 232 x 128
#: + 40 x 128 registers fit the 64K register file.
CONSUMER_REGS = gl.constexpr(232) if GLUON_AVAILABLE else 232
#: Registers per thread of four epilogue warps (EPILOGUE_WARPS): a 32-row slice of the staged tile and its
#: residual, with room for the activation's temporaries.  Eight share the same registers (72 each: half the
#: slice a thread).  Eight with 112 each and 64-row slices, R read two slices ahead, ran 8-14% slower.
EPILOGUE_REGS = gl.constexpr(152) if GLUON_AVAILABLE else 152


@gluon.jit
def consumer(
    ring,
    c_desc,
    c_smem,
    c2_desc,
    c2_smem,
    epi,
    K,
    sk,
    fixup,
    handoff,
    BLOCK_M: gl.constexpr,
    BLOCK_N: gl.constexpr,
    BLOCK_K: gl.constexpr,
    GROUP_M: gl.constexpr,
    NUM_STAGES: gl.constexpr,
    A_ROW_MAJOR: gl.constexpr,
    B_ROW_MAJOR: gl.constexpr,
    HAS_ALPHA: gl.constexpr,
    ADDEND: gl.constexpr,
    ACTIVATION: gl.constexpr,
    HAS_RESIDUAL: gl.constexpr,
    STORE_PREACT: gl.constexpr,
    SCALING: gl.constexpr,
    MAX_IMPRECISE_ACC: gl.constexpr,
    CONSUMER: gl.constexpr,
    CONSUMERS: gl.constexpr,
    BLOCK_N2: gl.constexpr,
    STREAM_K: gl.constexpr,
    EPILOGUE_SUBTILE: gl.constexpr,
    CLUSTER_M: gl.constexpr,
    CLUSTER_N: gl.constexpr,
    GATED: gl.constexpr,
    EPILOGUE_WARPS: gl.constexpr,
    SCALE_BLOCK_A: gl.constexpr = 0,
    SCALE_BLOCK_B: gl.constexpr = 0,
):
    """A consumer partition: wgmma over the ring, then the epilogue and the TMA store of each of its tiles.

    Consumer ``CONSUMER`` of ``CONSUMERS`` takes every ``CONSUMERS``-th of the
    program's tiles, starting at its own index.  The producer fills the ring in
    tile order, so the ring step of a consumer's tile is that tile's place in
    the program's sequence times the K-steps per tile.

    Two consumers take turns (``turn[c]``: consumer c's mainloop may start):
    each waits for the other to have issued its previous tile's last wgmma
    before it waits on the ring, and hands the turn over once it has issued
    its own.  Besides making the mainloops alternate, with each epilogue under
    the other's mainloop, this keeps a consumer from waiting on a slot's
    ``ready`` barrier more than one phase ahead of the producer: a parity wait
    cannot tell that phase from the one two laps earlier.

    fp8 on two consumers splits every tile's rows instead of taking turns (SPLIT_ROWS, DeepGEMM's
    schedule): each runs its half of the tile on its half of A's slot, releases the slot itself
    (``empty`` counts two arrivals) and stores its half, so the two run apart.  Where a K-step waits
    for its wgmma (block scales: ``block_scaled_mma``; precise sums: the wait ptxas puts before each
    promotion), one consumer adds its partial sum while the other's wgmma keep the tensor cores busy.
    A cooperative consumer's warpgroups cannot: their release synchronizes all its warps every K-step.
    Block-scaled steps keep no wgmma in flight, so each step releases its own slot.
    """
    a_ring, b_ring, b2_ring, ready, empty, turn, _ = ring
    dp_tiles, iters_per_program, tile_span = sk
    CLUSTERED: gl.constexpr = CLUSTER_M * CLUSTER_N > 1
    M = epi[0]
    N = epi[1]
    INSTR_K: gl.constexpr = 256 // a_ring.dtype.primitive_bitwidth  # one wgmma reads 32 bytes of K
    # fp8 on two consumers: each takes one half of every tile's rows (see the docstring).
    SPLIT_ROWS: gl.constexpr = CONSUMERS > 1 and INSTR_K == 32
    ROWS: gl.constexpr = BLOCK_M // CONSUMERS if SPLIT_ROWS else BLOCK_M  # this consumer's rows of a tile
    TAKES_TURNS: gl.constexpr = CONSUMERS > 1 and not SPLIT_ROWS
    gl.static_assert(
        not SPLIT_ROWS or (A_ROW_MAJOR and not STREAM_K and BLOCK_N2 == 0 and ROWS >= 64),
        "split rows: A row-major, halves of 64 rows or more, one accumulator, no Stream-K",
    )
    acc_layout: gl.constexpr = accumulator_layout(
        ROWS, BLOCK_N, gl.num_warps(), CLUSTER_M, CLUSTER_N, INSTR_K
    )
    # (BLOCK_N2 == 0: a layout nothing uses)
    acc2_layout: gl.constexpr = accumulator_layout(
        BLOCK_M, BLOCK_N2 if BLOCK_N2 > 0 else BLOCK_N, gl.num_warps(), CLUSTER_M, CLUSTER_N, INSTR_K
    )
    TILE_N: gl.constexpr = tile_width(BLOCK_N, BLOCK_N2, GATED)
    # Precise fp8 sums are added into fp32 once a K-step, from a partial accumulator that must retire
    # first.  Where three accumulators fit the registers (64 floats a thread or fewer), each step's
    # partial is added one step late, under the next step's wgmma (``deferred_mainloop``), so the tensor
    # cores keep one wgmma of this consumer in flight instead of idling while it waits and adds.
    # Otherwise Triton's max_num_imprecise_acc adds it, with a wait ptxas puts before the add.
    DEFER_PROMOTION: gl.constexpr = (
        SCALE_BLOCK_A == 0
        and MAX_IMPRECISE_ACC is not None
        and MAX_IMPRECISE_ACC >= BLOCK_K
        and ROWS * BLOCK_N // (gl.num_warps() * 32) <= 64
        and NUM_STAGES > 1
        and BLOCK_N2 == 0
        and not STREAM_K
    )
    # One K-step's wgmma (one per accumulator) left in flight needs a second slot to load into meanwhile.
    IN_FLIGHT: gl.constexpr = 1 if NUM_STAGES > 1 and SCALE_BLOCK_A == 0 else 0
    gl.static_assert(SCALE_BLOCK_A == 0 or BLOCK_N2 == 0, "block-scaled fp8 runs one accumulator")
    WGMMAS: gl.constexpr = 2 if BLOCK_N2 > 0 else 1  # wgmma groups per K-step
    num_tiles = gl.cdiv(M, BLOCK_M) * gl.cdiv(N, TILE_N)
    k_tiles = gl.cdiv(K, BLOCK_K)
    pid = gl.program_id(0)
    nprog = gl.num_programs(0)
    TILE_STRIDE: gl.constexpr = 1 if SPLIT_ROWS else CONSUMERS  # (split rows: every consumer, every tile)
    FIRST: gl.constexpr = 0 if SPLIT_ROWS else CONSUMER
    for tile_id in range(pid + FIRST * nprog, dp_tiles, TILE_STRIDE * nprog):
        step = (tile_id - pid) // nprog * k_tiles  # the ring step of this tile's first K-step
        pid_m, pid_n = tile_coords(tile_id, M, N, BLOCK_M, TILE_N, GROUP_M)
        row0 = pid_m * BLOCK_M + (CONSUMER * ROWS if SPLIT_ROWS else 0)  # this consumer's first row
        acc = gl.zeros((ROWS, BLOCK_N), dtype=gl.float32, layout=acc_layout)
        if BLOCK_N2 > 0:
            acc2 = gl.zeros((BLOCK_M, BLOCK_N2), dtype=gl.float32, layout=acc2_layout)
        else:
            acc2 = acc  # (a stand-in the epilogue never reads)
        if TAKES_TURNS:
            # This consumer's j-th turn is phase j of turn[CONSUMER]; consumer 0's first is free (a fresh
            # mbarrier counts as having completed the phase before phase 0).
            j = (tile_id - pid) // (CONSUMERS * nprog)
            mbarrier.wait(turn.index(CONSUMER), (j & 1) ^ (1 if CONSUMER == 0 else 0))
        if SCALE_BLOCK_A > 0:  # (the first K-step's scales; each step loads the next's)
            scales = block_scales(
                epi, row0, pid_n * TILE_N, 0, k_tiles, acc_layout, ROWS, BLOCK_N, SCALE_BLOCK_A, SCALE_BLOCK_B
            )  # fmt: skip
        if DEFER_PROMOTION:
            if k_tiles > 0:  # (K = 0: nothing to load, acc stays zero)
                acc, step = deferred_mainloop(
                    ring, acc, step, k_tiles, CONSUMER * ROWS, NUM_STAGES, A_ROW_MAJOR, B_ROW_MAJOR, CLUSTERED
                )  # fmt: skip
        else:
            for ki in range(k_tiles):
                slot, a, b = ready_operands(ring, step, NUM_STAGES, A_ROW_MAJOR, B_ROW_MAJOR)
                if SPLIT_ROWS:
                    a = a.slice(CONSUMER * ROWS, ROWS)
                if SCALE_BLOCK_A > 0:
                    acc, scales = block_scaled_mma(
                        a, b, acc, scales, epi, row0, pid_n * TILE_N, ki, k_tiles, SCALE_BLOCK_A, SCALE_BLOCK_B
                    )  # fmt: skip
                else:
                    acc = mma(a, b, acc, MAX_IMPRECISE_ACC)
                if BLOCK_N2 > 0:
                    b2 = b2_ring.index(slot)
                    if not B_ROW_MAJOR:
                        b2 = b2.permute((1, 0))
                    acc2 = mma(a, b2, acc2, MAX_IMPRECISE_ACC)
                    acc, acc2 = warpgroup_mma_wait(IN_FLIGHT * WGMMAS, deps=(acc, acc2))
                elif SCALE_BLOCK_A == 0:
                    acc = warpgroup_mma_wait(IN_FLIGHT, deps=(acc,))
                release_slot(ring, step, slot, ki > 0, IN_FLIGHT, NUM_STAGES, CLUSTERED)
                step += 1
        if TAKES_TURNS:
            mbarrier.arrive(turn.index((CONSUMER + 1) % CONSUMERS))  # every wgmma of this tile is issued
        if BLOCK_N2 > 0:
            acc, acc2 = warpgroup_mma_wait(0, deps=(acc, acc2))
        elif SCALE_BLOCK_A == 0 and not DEFER_PROMOTION:
            acc = warpgroup_mma_wait(0, deps=(acc,))
        if IN_FLIGHT and not DEFER_PROMOTION:  # (the deferred loop released every slot)
            free_slot(ring, (step + NUM_STAGES - 1) % NUM_STAGES, k_tiles > 0, CLUSTERED)

        off_m = row0
        off_n = pid_n * TILE_N
        if GATED != "":
            gated_epilogue(
                acc, acc2, off_m, off_n, epi, c_desc, c_smem, c2_desc, c2_smem, ADDEND, STORE_PREACT, GATED
            )
        elif EPILOGUE_WARPS > 0:
            # Stage z for the epilogue warps, then on to the next tile's wgmma while they finish this one.
            acc = finish_tile(acc, off_m, off_n, epi, HAS_ALPHA, ADDEND, "none", False, STORE_PREACT, SCALING)
            staged, drained = handoff
            lap = (tile_id - pid) // nprog
            mbarrier.wait(drained, (lap & 1) ^ 1)  # (a fresh mbarrier: the staging tile starts free)
            c_smem.store(acc.to(c_desc.dtype))
            cta_barrier()  # every thread's part is in shared memory before the hand-over
            mbarrier.arrive(staged)
        else:
            store_tile(
                acc, acc2, off_m, off_n, epi, c_desc, c_smem, c2_desc, c2_smem,
                HAS_ALPHA, ADDEND, ACTIVATION, HAS_RESIDUAL, STORE_PREACT, SCALING, BLOCK_N2, EPILOGUE_SUBTILE,
            )  # fmt: skip
    if STREAM_K:  # (one consumer, one accumulator: the launcher's rule)
        if EPILOGUE_WARPS > 0:  # the streamed tiles are finished here: the epilogue warps' staging tile first
            laps = (dp_tiles - pid + nprog - 1) // nprog
            mbarrier.wait(handoff[1], (laps - 1) & 1, pred=laps > 0)
        # This program's share of the streamed tiles' K-steps, walked backwards one tile segment at a
        # time (see gemm_streamk): its contribution first, the tile it finishes last.
        step = (dp_tiles - pid + nprog - 1) // nprog * k_tiles  # after its whole tiles' K-steps
        first = pid * iters_per_program
        last = gl.minimum(first + iters_per_program, (num_tiles - dp_tiles) * tile_span)
        while last > first:
            tile, tile_start, seg_start = streamk_segment(first, last, tile_span)
            steps = gl.minimum(last, tile_start + k_tiles) - seg_start
            pid_m, pid_n = tile_coords(dp_tiles + tile, M, N, BLOCK_M, TILE_N, GROUP_M)
            off_m = pid_m * BLOCK_M
            off_n = pid_n * TILE_N
            acc = gl.zeros((BLOCK_M, BLOCK_N), dtype=gl.float32, layout=acc_layout)
            if SCALE_BLOCK_A > 0:
                scales = block_scales(
                    epi, off_m, off_n, seg_start - tile_start, k_tiles, acc_layout, BLOCK_M, BLOCK_N,
                    SCALE_BLOCK_A, SCALE_BLOCK_B,
                )  # fmt: skip
            for ki in range(steps):
                slot, a, b = ready_operands(ring, step, NUM_STAGES, A_ROW_MAJOR, B_ROW_MAJOR)
                if SCALE_BLOCK_A > 0:
                    kb = seg_start - tile_start + ki
                    acc, scales = block_scaled_mma(
                        a, b, acc, scales, epi, off_m, off_n, kb, k_tiles, SCALE_BLOCK_A, SCALE_BLOCK_B
                    )  # fmt: skip
                else:
                    acc = mma(a, b, acc, MAX_IMPRECISE_ACC)
                    acc = warpgroup_mma_wait(IN_FLIGHT, deps=(acc,))
                release_slot(ring, step, slot, ki > 0, IN_FLIGHT, NUM_STAGES, False)
                step += 1
            if SCALE_BLOCK_A == 0:
                acc = warpgroup_mma_wait(0, deps=(acc,))
            if IN_FLIGHT:
                mbarrier.arrive(empty.index((step + NUM_STAGES - 1) % NUM_STAGES), pred=steps > 0)
            if last < tile_start + tile_span:  # a later program computes this tile's last K-step
                streamk_contribute(acc, fixup, tile, pid)
            else:
                if seg_start > tile_start:
                    acc = streamk_collect(acc, fixup, tile, tile_start, pid, iters_per_program)
                acc = finish_tile(
                    acc, off_m, off_n, epi, HAS_ALPHA, ADDEND, ACTIVATION, HAS_RESIDUAL, STORE_PREACT,
                    SCALING,
                )  # fmt: skip
                tma.store_wait(0)
                c_smem.store(acc.to(c_desc.dtype))
                fence_async_shared()
                tma_store(c_desc, [off_m, off_n], c_smem)
            last = seg_start
    tma.store_wait(0)


# Triton 3.6 fails to lower the kernel (ConvertTritonGPUToLLVM asserts) when ``tile_span`` is specialized
# to the constant 1 (one K-step per tile); a runtime value costs nothing.
@gluon.jit(do_not_specialize=["tile_span"])
def gemm_gluon_kernel(
    a_desc,
    b_desc,
    b2_desc,
    c_desc,
    c2_desc,
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
    dp_tiles,
    iters_per_program,
    tile_span,
    stride_dm,
    stride_dn,
    stride_rm,
    stride_rn,
    stride_zm,
    stride_zn,
    alpha,
    beta,
    BLOCK_M: gl.constexpr,
    BLOCK_N: gl.constexpr,
    BLOCK_K: gl.constexpr,
    GROUP_M: gl.constexpr,
    NUM_STAGES: gl.constexpr,
    A_ROW_MAJOR: gl.constexpr,
    B_ROW_MAJOR: gl.constexpr,
    HAS_ALPHA: gl.constexpr,
    ADDEND: gl.constexpr,
    ACTIVATION: gl.constexpr,
    HAS_RESIDUAL: gl.constexpr,
    STORE_PREACT: gl.constexpr,
    CONSUMERS: gl.constexpr,
    BLOCK_N2: gl.constexpr,
    STREAM_K: gl.constexpr,
    EPILOGUE_SUBTILE: gl.constexpr,
    CLUSTER_M: gl.constexpr = 1,
    CLUSTER_N: gl.constexpr = 1,
    SCALING: gl.constexpr = "none",
    MAX_IMPRECISE_ACC: gl.constexpr = None,
    GATED: gl.constexpr = "",
    EPILOGUE_WARPS: gl.constexpr = 0,
    SCALE_BLOCK_A: gl.constexpr = 0,
    SCALE_BLOCK_B: gl.constexpr = 0,
):
    """C = act(alpha * A @ B + beta * D) + R on a persistent grid (program p takes tiles p, p + grid, ...).

    ``a_desc`` describes A (M, K) if A_ROW_MAJOR, else A^T (K, M); ``b_desc``
    describes B (K, N) if B_ROW_MAJOR, else B^T (N, K) (the x @ w.T of a linear
    layer); ``c_desc`` describes C (M, N) with BLOCK_M x BLOCK_N boxes.  With
    ``BLOCK_N2 > 0`` a tile is BLOCK_N + BLOCK_N2 wide (e.g. 128 + 64): its last
    BLOCK_N2 columns have their own accumulator, read B through ``b2_desc`` and are
    stored through ``c2_desc`` (Gluon tensors have power-of-two shapes); otherwise
    ``b2_desc`` / ``c2_desc`` are never read.  ``EPILOGUE_SUBTILE`` (with ``BLOCK_N2 == BLOCK_N``)
    is a power-of-two tile run as two halves: two accumulators, and one half-width staging
    buffer that both halves pass through in turn (the second waits for the first's TMA store),
    which frees the shared memory of a ring slot (128x256: four stages in 224 KiB instead of three).

    Tiles ``0 .. dp_tiles - 1`` run whole (``dp_tiles`` is every tile without STREAM_K).  With STREAM_K
    (one consumer, ``BLOCK_N2 == 0``) the K-steps of the rest are shared out, each program taking
    ``iters_per_program`` of them, where each streamed tile spans ``tile_span >= cdiv(K, BLOCK_K)`` of the
    shares' iterations (those past its K-steps are skipped); ``ws_ptr`` holds one fp32 partial tile per
    program and ``count_ptr`` one arrival counter per streamed tile, zero at launch and re-armed to zero
    by the kernel (``launch.stream_k.StreamKBuffers``).  Without STREAM_K neither is read.
    GATED (an activation's name; "" for none) makes the kernel a GLU MLP's gate and up projections:
    ``b_desc`` and ``b2_desc`` describe two weights, the two accumulators (``BLOCK_N2 == BLOCK_N``) cover
    the same columns of each, and the epilogue stores ``act(g) * u`` (``gated_epilogue``).
    CLUSTER_M (N) = 2: a program is two CTAs, BLOCK_M (N) theirs, sharing B's (A's) box (``gluon_common.load_k_steps``).
    fp8 operands (K-major both, as wgmma reads them) are dequantized by ``sa_ptr``'s and ``sb_ptr``'s
    scales (SCALING, ``gluon_common.finish_tile``) and summed in full fp32 precision every
    MAX_IMPRECISE_ACC products of K (None: fast accumulation).  Block-scaled fp8 (SCALE_BLOCK_A > 0:
    SCALE_BLOCK_A rows of A and SCALE_BLOCK_B columns of B share a scale for each 128 of K) is
    dequantized in the mainloop instead, one K-step at a time (``block_scaled_mma``).
    """
    # (B's dtype may differ from A's: fp8 e4m3 x e5m2)
    a_ring = gl.allocate_shared_memory(a_desc.dtype, [NUM_STAGES] + a_desc.block_type.shape, a_desc.layout)
    b_ring = gl.allocate_shared_memory(b_desc.dtype, [NUM_STAGES] + b_desc.block_type.shape, b_desc.layout)
    # One output staging tile per consumer: each stores its own tiles.
    c_tiles = gl.allocate_shared_memory(c_desc.dtype, [CONSUMERS] + c_desc.block_type.shape, c_desc.layout)
    b2_ring = b_ring
    c2_tiles = c_tiles
    if BLOCK_N2 > 0:  # the tile's last BLOCK_N2 columns: B's in a ring of its own, C's staged on its own
        b2_ring = gl.allocate_shared_memory(
            b2_desc.dtype, [NUM_STAGES] + b2_desc.block_type.shape, b2_desc.layout
        )
        # (subtiled: both halves pass through c_tiles in turn; gated: h alone, unless g is kept for backward)
        if not EPILOGUE_SUBTILE and (GATED == "" or STORE_PREACT):
            c2_tiles = gl.allocate_shared_memory(
                c2_desc.dtype, [CONSUMERS] + c2_desc.block_type.shape, c2_desc.layout
            )
    CTAS: gl.constexpr = CLUSTER_M * CLUSTER_N
    gl.static_assert(
        CTAS == 1 or (CTAS == 2 and CONSUMERS == 1 and not STREAM_K),
        "a cluster is two CTAs of one cooperative consumer, without Stream-K",
    )
    ready = barriers(NUM_STAGES, CTAS, False)
    empty = barriers(NUM_STAGES, CTAS, False)
    turn = barriers(2, CTAS, False)
    for s in gl.static_range(NUM_STAGES):
        mbarrier.init(ready.index(s), count=1)
        # (split rows, fp8 on two consumers: both read every slot, and each releases it)
        mbarrier.init(
            empty.index(s), count=2 if CONSUMERS > 1 and a_desc.dtype.primitive_bitwidth == 8 else 1
        )
    for c in gl.static_range(2):
        mbarrier.init(turn.index(c), count=1)
    handoff_bars = barriers(2, CTAS, False)  # (staged, drained) of the epilogue warps' staging tile
    for c in gl.static_range(2):
        mbarrier.init(handoff_bars.index(c), count=1)
    if CTAS > 1:
        # The slot of the box the two CTAs share is free once both CTAs' consumers are done with it.
        gathered = barriers(NUM_STAGES, CTAS, True)
        for s in gl.static_range(NUM_STAGES):
            mbarrier.init(gathered.index(s), count=1)
    else:
        gathered = empty

    # Runtime values travel to the partitions in tuples; constexprs are written out in each call
    # (a tuple bound to a name would turn them into runtime values).
    ring = (a_ring, b_ring, b2_ring, ready, empty, turn, gathered)
    sk = (dp_tiles, iters_per_program, tile_span)
    fixup = (ws_ptr, count_ptr)
    handoff = (handoff_bars.index(0), handoff_bars.index(1))
    # fmt: off
    epi = (M, N, d_ptr, stride_dm, stride_dn, r_ptr, stride_rm, stride_rn, z_ptr, stride_zm, stride_zn,
           alpha, beta, sa_ptr, sb_ptr)
    if EPILOGUE_WARPS > 0:
        # One consumer warpgroup, and epilogue warps that finish its tiles under its next mainloop.
        gl.warp_specialize(
            [
                (consumer, (ring, c_desc, c_tiles.index(0), c2_desc, c2_tiles.index(0), epi, K, sk, fixup,
                            handoff, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, NUM_STAGES, A_ROW_MAJOR, B_ROW_MAJOR,
                            HAS_ALPHA, ADDEND, ACTIVATION, HAS_RESIDUAL, STORE_PREACT,
                            SCALING, MAX_IMPRECISE_ACC, 0, 1, BLOCK_N2, STREAM_K,
                            EPILOGUE_SUBTILE, CLUSTER_M, CLUSTER_N, GATED, EPILOGUE_WARPS,
                            SCALE_BLOCK_A, SCALE_BLOCK_B)),
                (epilogue_partition, (c_desc, c_tiles.index(0), handoff, epi, sk,
                                      BLOCK_M, BLOCK_N, GROUP_M, ACTIVATION, HAS_RESIDUAL)),
                (producer, (a_desc, b_desc, b2_desc, ring, M, N, K, sk,
                            BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, NUM_STAGES, A_ROW_MAJOR, B_ROW_MAJOR, BLOCK_N2,
                            STREAM_K, CLUSTER_M, CLUSTER_N, GATED)),
            ],
            [EPILOGUE_WARPS, 1],
            [EPILOGUE_REGS * 4 // EPILOGUE_WARPS // 8 * 8, PRODUCER_REGS],
        )
    elif CONSUMERS == 1:
        # Cooperative (or a single warpgroup): the kernel's num_warps run every tile together.
        gl.warp_specialize(
            [
                (consumer, (ring, c_desc, c_tiles.index(0), c2_desc, c2_tiles.index(0), epi, K, sk, fixup,
                            handoff, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, NUM_STAGES, A_ROW_MAJOR, B_ROW_MAJOR,
                            HAS_ALPHA, ADDEND, ACTIVATION, HAS_RESIDUAL, STORE_PREACT,
                            SCALING, MAX_IMPRECISE_ACC, 0, 1, BLOCK_N2, STREAM_K,
                            EPILOGUE_SUBTILE, CLUSTER_M, CLUSTER_N, GATED, 0, SCALE_BLOCK_A, SCALE_BLOCK_B)),
                (producer, (a_desc, b_desc, b2_desc, ring, M, N, K, sk,
                            BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, NUM_STAGES, A_ROW_MAJOR, B_ROW_MAJOR, BLOCK_N2,
                            STREAM_K, CLUSTER_M, CLUSTER_N, GATED)),
            ],
            [1],
            [PRODUCER_REGS],
        )
    else:
        # Ping-pong: a second consumer warpgroup takes the odd tiles, so that one warpgroup's
        # epilogue runs while the other's wgmma keep the tensor cores busy.
        gl.warp_specialize(
            [
                (consumer, (ring, c_desc, c_tiles.index(0), c2_desc, c2_tiles.index(0), epi, K, sk, fixup,
                            handoff, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, NUM_STAGES, A_ROW_MAJOR, B_ROW_MAJOR,
                            HAS_ALPHA, ADDEND, ACTIVATION, HAS_RESIDUAL, STORE_PREACT,
                            SCALING, MAX_IMPRECISE_ACC, 0, 2, BLOCK_N2, False,
                            EPILOGUE_SUBTILE, CLUSTER_M, CLUSTER_N, GATED, 0, SCALE_BLOCK_A, SCALE_BLOCK_B)),
                (consumer, (ring, c_desc, c_tiles.index(1), c2_desc, c2_tiles.index(1), epi, K, sk, fixup,
                            handoff, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, NUM_STAGES, A_ROW_MAJOR, B_ROW_MAJOR,
                            HAS_ALPHA, ADDEND, ACTIVATION, HAS_RESIDUAL, STORE_PREACT,
                            SCALING, MAX_IMPRECISE_ACC, 1, 2, BLOCK_N2, False,
                            EPILOGUE_SUBTILE, CLUSTER_M, CLUSTER_N, GATED, 0, SCALE_BLOCK_A, SCALE_BLOCK_B)),
                (producer, (a_desc, b_desc, b2_desc, ring, M, N, K, sk,
                            BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, NUM_STAGES, A_ROW_MAJOR, B_ROW_MAJOR, BLOCK_N2,
                            STREAM_K, CLUSTER_M, CLUSTER_N, GATED)),
            ],
            [4, 1],
            [CONSUMER_REGS, PRODUCER_REGS],
        )
    # fmt: on
    for s in gl.static_range(NUM_STAGES):
        mbarrier.invalidate(ready.index(s))
        mbarrier.invalidate(empty.index(s))
        if CTAS > 1:
            mbarrier.invalidate(gathered.index(s))
    for c in gl.static_range(2):
        mbarrier.invalidate(turn.index(c))
        mbarrier.invalidate(handoff_bars.index(c))


__all__ = [
    "PRECISE_FP8_AVAILABLE",
    "CLUSTER_AVAILABLE",
    "CLUSTER_UNAVAILABLE_REASON",
    "GLUON_AVAILABLE",
    "GLUON_UNAVAILABLE_REASON",
    "cluster_layouts",
    "gemm_gluon_kernel",
]
