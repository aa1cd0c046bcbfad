"""Persistent schedules that share K-steps between programs: which program runs which (tile, K-step).

Pure functions of tile counts and the SM count, used by the launchers of the
Stream-K kernels (``launch/stream_k.py``, ``launch/tma.py``, ``launch/gluon.py``)
and by the heuristic's scores.  Every program of such a grid must be resident at
once (one per SM): a program that finishes a split tile waits for the others.
"""

from __future__ import annotations

from typing import NamedTuple


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


#: Stream-K's hybrid schedule streams the last partial wave of tiles plus this
#: many full waves before it (CUTLASS's "DP + SK": 0 streams only the sliver,
#: 1 gives every program one to two tiles' worth of streamed work).
STREAM_K_EXTRA_WAVES = 1


class StreamKSchedule(NamedTuple):
    programs: int
    dp_tiles: int
    iters_per_program: int
    #: K-steps a streamed tile spans in the shares' layout: its K-steps, or (``split_tail_schedule``)
    #: a whole number of shares, the last share cut short at the tile's last K-step.
    tile_span: int


def stream_k_schedule(
    tiles: int, k_tiles: int, sm_count: int, extra_waves: int | None = None
) -> StreamKSchedule:
    """Stream-K's grid: one program per SM (all resident at once: a finisher may
    wait for its contributors).  Whole waves run data-parallel; the rest of
    the tiles' K-steps are cut into equal contiguous shares."""
    extra = STREAM_K_EXTRA_WAVES if extra_waves is None else extra_waves
    programs = max(1, min(sm_count, tiles * k_tiles))
    full_waves = tiles // programs
    dp_waves = max(full_waves - extra, 0) if tiles % programs else full_waves
    dp_tiles = dp_waves * programs
    iters_per_program = max(1, cdiv((tiles - dp_tiles) * k_tiles, programs))
    return StreamKSchedule(programs, dp_tiles, iters_per_program, k_tiles)


# The warp-specialized kernel's Stream-K.  Contiguous shares (above) lost to its
# data-parallel schedule on every target shape (H100, bf16, sweeps/ws_stream_k_sweep.json:
# 8192x768x3072 0.76 against 0.84 with only the last 0.9 wave streamed, 0.60 with one
# more; 256x5120x14336 0.64 against 0.85): each program starts at its own K offset, so
# the tiles that share an A or B panel no longer load the same K-step at the same time,
# and what the grouped order served from L2 comes from DRAM again.  So the kernel splits
# only the last, partial wave, each of its tiles into S equal K-chunks, one per program:
# programs p and p + S run the same chunk of neighbouring tiles side by side, as whole
# tiles do.
#: The fewest K-steps in a chunk.  Chunks of 4-8 steps lost to the fix-up (512x4608x3584 0.59 against
#: 0.68 unsplit, 1536^3 0.54, 1024^3 0.65; sweeps/ws_split_tail_sweep.json); chunks of 24 lost in all
#: three cases measured (256x3072x3072 0.83 against 0.91 in sweeps/split_tail_ab_24_steps.json; 3072^3
#: and 12608x768x3072 against 128x192); from 28 on they gained or tied (split_tail_ab_24_steps.json, 23
#: cases; the rule as shipped: sweeps/split_tail_ab.json).
SPLIT_TAIL_MIN_STEPS = 28


def split_tail_schedule(tiles: int, k_tiles: int, sm_count: int) -> StreamKSchedule:
    """Whole waves data-parallel, then each of the remaining ``tiles % sm_count`` tiles cut into S
    equal K-chunks (S as large as the SMs and ``SPLIT_TAIL_MIN_STEPS`` allow), one chunk per program."""
    dp_tiles = tiles // sm_count * sm_count
    tail = tiles - dp_tiles
    splits = 1
    if tail:
        splits = max(1, min(sm_count // tail, k_tiles // SPLIT_TAIL_MIN_STEPS))
        # Equal chunks of cdiv(k_tiles, S) steps; the last one, cut short, must keep at least one.
        while splits > 1 and (splits - 1) * cdiv(k_tiles, splits) >= k_tiles:
            splits -= 1
    chunk = cdiv(k_tiles, splits)
    programs = sm_count if dp_tiles else max(1, tail * splits)
    return StreamKSchedule(programs, dp_tiles, chunk, splits * chunk)


__all__ = [
    "SPLIT_TAIL_MIN_STEPS",
    "STREAM_K_EXTRA_WAVES",
    "StreamKSchedule",
    "split_tail_schedule",
    "stream_k_schedule",
]
