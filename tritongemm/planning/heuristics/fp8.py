"""Tiles for fp8 operands (``scaled_mm``): few rows stream B on the pointer kernel; more take the
warp-specialized kernel with a K-step of 128 bytes, as wgmma reads it.

**Up to 64 rows** (``FEW_ROWS``) a call reads little but B, and the warp-specialized kernel's 64-row
tile wastes most of its wgmma; the pointer kernel's narrow tiles stream B faster.  Measured on an H100
over M = 16-64 and five LLM weights against ``torch._scaled_mm`` (``python -m
benchmarks.sweep_fp8_rows``, ``benchmarks/results/h100/sweeps/fp8_rows_sweep.txt``):

* the rows rounded up to a power of two (16-64) by 32 columns, a K step of 256, 4 stages, where those
  narrow tiles number at most two waves; else 128 columns, 3 stages (14336- and 18944-wide weights);
* K cut in two slices, reduced in the kernel, where each slice keeps at least 16 K steps and the
  tiles fill under two waves (4096 x 14336: 1.29-1.33 of torch, precise, against 1.13-1.18 unsplit).

Rowwise with precise sums: geomean 1.17 of torch over those 15 problems (none below 1.01) where the
warp-specialized kernel read 1.01; tensorwise with fast accumulation 0.96 against 0.87.  Up to 128 rows,
where 64 x 64 tiles fit one wave (``ONE_WAVE_ROWS``), the pointer kernel's 64 x 64 tiles with a K step of
256, unsplit (128 x 4096 x 4096: 1.19 precise and 0.95 fast tensorwise against 1.02 and 0.80; 128 x
4096 x 14336: 1.12 and 0.85 against 0.98 and 0.77; past one wave, 128 x 5120 x 5120, they lost: 0.80
against 0.96).

**More rows**: fp8's tensor cores do twice bf16's work per byte of shared memory read, so a K-step of
128 one-byte elements keeps the 128-byte swizzle of bf16's 64 and halves the K loop.  On sm_90 the
tile runs on the warp-specialized kernel (its wgmma needs both operands K-major: A row-major, B
column-major, as ``torch._scaled_mm`` requires); elsewhere, and for other layouts, the pointer kernel
takes the same tile.  Measured on an H100 against ``torch._scaled_mm`` (fp8 e4m3 -> bf16, rowwise and
tensorwise, with and without fast accumulation, 19 shapes from 16x4096x4096 to 8192x14336x4096:
``benchmarks/results/h100/sweeps/fp8_tiles.txt``), by how many tiles the shape has:

* 128 x 128 tiles for at most half the SMs: 64 x 128 on 4 warps, which loses where more tiles would
  fill the SMs (512 x 4096 x 4096: 0.68 against 128 x 128's 0.89);
* fewer 128 x 256 tiles than three quarters of the SMs: 128 x 128, 6 stages (512 x 4096 x 4096:
  0.89 against 128 x 256's 0.62; 256 x 5120 x 5120: 0.89 against 0.60);
* else 128 x 256 on 8 warps, its output staged in halves for a fourth stage (0.84-0.90 of
  torch's precise mode, 0.93-1.00 of its fast mode, against 128 x 128's 0.78-0.84 and 0.89-0.97),
  unless its last wave leaves the SMs idle where 128 x 128's would not (``SPLIT_WAVE_GAIN``).

On the warp-specialized kernel the 128 x 128 tile runs on two 4-warp consumers that split its rows
and run apart (the kernel's SPLIT_ROWS), where one 8-warp consumer's warpgroups wait for each other at
every ring slot.  With precise sums each half adds a K-step's partial sum under its next wgmma (the
kernel's deferred promotion), which makes it the precise choice wherever 128 x 256 was
(``accumulation_config``).  Without that, the add followed its own wgmma (Triton's
``max_num_imprecise_acc``) and ptxas serialized every wgmma of the kernel: the split tile read 0.81-0.85
of torch where 128 x 256 read 0.88-0.93, and won only where 128 x 256 tiles leave the last wave part
empty (``sweeps/fp8_split_rows.txt`` at commit e3fad58, CUDA-graph replays: 1024 x 14336 x 4096, 448
wide tiles 85% busy over 4 waves, 896 narrow ones 97% over 7; the rule ``SPLIT_WAVE_GAIN`` keeps for
fast accumulation).
"""

from __future__ import annotations

from dataclasses import replace

from ...device import DeviceInfo
from ..call import SCALE_BLOCK_K
from ..configs import TileConfig
from ..problem import GemmProblem, wave_efficiency
from ..schedules import cdiv
from .tiles import pow2_at_least, tiles_of

FP8_BLOCK_K = 128
#: (block_m, block_n, warps, stages, epilogue_subtile) by the shape's tiles (see above).
FP8_NARROW_TILE = (64, 128, 4, 6, False)
FP8_MID_TILE = (128, 128, 8, 6, False)
FP8_WIDE_TILE = (128, 256, 8, 4, True)
#: 128 x 128 tiles instead of 128 x 256 where they keep the SMs this much busier over their waves.
SPLIT_WAVE_GAIN = 0.05
#: Fast accumulation from this many 128 x 256 tiles (about 4 waves on an H100): the wide tile on two
#: 4-warp consumers splitting its rows, 3 stages (see ``accumulation_config``).
FP8_FAST_SPLIT_TILES = 512
FP8_FAST_SPLIT_TILE = (128, 256, 4, 3, True)
#: The 128 x 128 tile on the warp-specialized kernel: (block_m, block_n, warps, stages, pingpong), two
#: 4-warp consumers on the halves of its rows (the kernel's SPLIT_ROWS; see above).  Block scales take
#: it from 129 rows on (see ``block_scaled_config``).
FP8_SPLIT_TILE = FP8_BLOCK_SCALED_TILE = (128, 128, 4, 6, True)
#: Up to this many rows: the pointer kernel's few-rows tiles (see above).
FEW_ROWS = 64
#: Up to this many rows, 64 x 64 pointer tiles where they fit one wave (see above).
ONE_WAVE_ROWS = 128


def few_rows_config(problem: GemmProblem, device: DeviceInfo, max_block_k: int = 256) -> TileConfig:
    """The pointer kernel's tile for an fp8 problem of at most ``FEW_ROWS`` rows (see above); block
    scales cap the K step at one scale block (``max_block_k``)."""
    bm = pow2_at_least(problem.m, 16, FEW_ROWS)
    bk = pow2_at_least(problem.k, 32, max_block_k)
    bn, stages = 32, 4
    if tiles_of(problem, bm, bn) > 2 * device.sm_count:
        bn, stages = 128, 3
    bn = pow2_at_least(problem.n, 16, bn)
    split = 2 if cdiv(problem.k, bk) >= 32 and tiles_of(problem, bm, bn) < 2 * device.sm_count else 1
    return TileConfig(bm, bn, bk, 8, 4, stages, split_k=split, split_k_inline=split > 1)


def fp8_choice(
    problem: GemmProblem, device: DeviceInfo, block_scaled: bool = False
) -> tuple[TileConfig, str]:
    """The fp8 tile for ``problem`` on a GPU, and why; ``block_scaled``: a scale per 128 of K
    (``block_scaled_config``'s rules)."""
    max_block_k = SCALE_BLOCK_K if block_scaled else 256
    if problem.m <= FEW_ROWS:
        cfg = few_rows_config(problem, device, max_block_k)
        split = f", K in {cfg.split_k} slices" if cfg.split_k > 1 else ""
        return cfg, (
            f"fp8, M = {problem.m}: {cfg.block_m}x{cfg.block_n} tiles, a K step of {cfg.block_k}{split}, "
            "on the pointer kernel (few rows: streaming B)"
        )
    square = tiles_of(problem, 64, 64)
    if problem.m <= ONE_WAVE_ROWS and square <= device.sm_count:
        cfg = TileConfig(64, 64, pow2_at_least(problem.k, 32, max_block_k), 8, 4, 4)
        return cfg, (
            f"fp8, M = {problem.m}: {square} tiles of 64x64 fit one wave, a K step of "
            f"{cfg.block_k}, on the pointer kernel"
        )
    ws = device.capability == (9, 0)
    if block_scaled:
        bm, bn, warps, stages, pingpong = FP8_BLOCK_SCALED_TILE
        kernel = dict(kernel="gluon_ws", pingpong=pingpong) if ws else dict(num_warps=8, num_stages=4)
        cfg = replace(TileConfig(bm, bn, SCALE_BLOCK_K, 8, warps, stages), **kernel)
        where = "two 4-warp consumers on their halves" if ws else "the pointer kernel"
        return cfg, f"block-scaled fp8: {bm}x{bn} tiles, a K step of {SCALE_BLOCK_K}, {where}"
    mid = tiles_of(problem, 128, 128)
    wide = tiles_of(problem, 128, 256)
    busy_mid, busy_wide = wave_efficiency(mid, device.sm_count), wave_efficiency(wide, device.sm_count)
    if 2 * mid <= device.sm_count:
        tile, why = FP8_NARROW_TILE, f"M = {problem.m}, {mid} tiles of 128x128"
    elif 4 * wide < 3 * device.sm_count:
        tile, why = FP8_MID_TILE, f"{wide} tiles of 128x256 fill under 3/4 of the SMs"
    elif busy_mid >= busy_wide + SPLIT_WAVE_GAIN:
        tile = FP8_MID_TILE
        why = f"{mid} tiles of 128x128 keep the SMs {busy_mid:.0%} busy, {wide} of 128x256 {busy_wide:.0%}"
    else:
        tile, why = FP8_WIDE_TILE, f"{wide} tiles of 128x256"
    bm, bn, warps, stages, subtile = tile
    pingpong = False
    if ws and tile == FP8_MID_TILE:
        bm, bn, warps, stages, pingpong = FP8_SPLIT_TILE
        why += "; two 4-warp consumers on its halves"
    cfg = TileConfig(
        bm,
        bn,
        FP8_BLOCK_K,
        8,
        warps,
        stages,
        kernel="gluon_ws" if ws else "pointer",
        epilogue_subtile=subtile and ws,
        pingpong=pingpong,
    )
    where = "the warp-specialized kernel" if ws else "the pointer kernel"
    return cfg, f"fp8: {bm}x{bn} tiles, a K step of {FP8_BLOCK_K} bytes, on {where} ({why})"


def accumulation_config(
    cfg: TileConfig, problem: GemmProblem, device: DeviceInfo, fast: bool
) -> tuple[TileConfig, str | None]:
    """The heuristic's 128 x 256 tile on one 8-warp consumer, changed for how the products are summed,
    and what was changed (None: nothing).

    **Precise sums** (``fast`` False): the 128 x 128 tile on two 4-warp consumers that split its rows
    (``FP8_SPLIT_TILE``).  Each consumer adds a K-step's partial sum under the next step's wgmma (the
    kernel's deferred promotion, which needs three 64-float accumulators a thread: 64 x 256 halves
    would need 384 registers).  Measured on an H100 (``sweeps/fp8_split_rows.txt``, CUDA-graph
    replays), tensorwise / rowwise against ``torch._scaled_mm``: 4096x4096x4096 1.02 / 1.05 against
    the wide tile's 0.89 / 0.93; 8192x14336x4096 0.99 / 1.06 against 0.85 / 0.91; 1024x4096x4096
    1.00 / 1.01 against 0.87 / 0.90.

    **Fast accumulation**: from ``FP8_FAST_SPLIT_TILES`` tiles, the wide tile on two 4-warp consumers
    that split its rows (64 x 256 each, 128 accumulator registers a thread, no partial sums) instead of
    one 8-warp consumer, whose warpgroups wait for each other at every ring slot they release; split,
    neither does (H100, CUDA-graph replays, ``sweeps/fp8_split_rows.txt`` at commit e3fad58):
    tensorwise / rowwise 1.035 / 1.002 of torch at
    4096x4096x4096 and 1.032 / 0.993 at 8192x4096x4096 against 1.013 / 0.982 and 1.002 / 0.970
    cooperative, 0.999 / 1.021 at 2048x4096x4096 (256 tiles) against 0.967 / 0.991; with few tiles it
    loses (256x14336x4096, 112 tiles: 0.87 / 0.91 against 0.91 / 0.95).  The eager-timed run of the
    same sweep (the file at commit 0c9adc8) read tensorwise 1.03-1.07 against 0.98-1.00 on 4096-8192 x
    14336 and 8192 x 8192.
    """
    bm, bn, warps, stages, subtile = FP8_WIDE_TILE
    wide = (cfg.kernel, cfg.block_m, cfg.block_n, cfg.num_warps, cfg.pingpong) == (
        "gluon_ws",
        bm,
        bn,
        warps,
        False,
    )
    if not wide:
        return cfg, None
    if not fast:
        bm, bn, warps, stages, pingpong = FP8_SPLIT_TILE
        cfg = replace(
            cfg, block_n=bn, num_warps=warps, num_stages=stages, pingpong=pingpong, epilogue_subtile=False
        )
        return cfg, f"precise sums: {bm}x{bn} tiles on two 4-warp consumers, each adding under its next wgmma"
    if tiles_of(problem, bm, bn) < FP8_FAST_SPLIT_TILES:
        return cfg, None
    bm, bn, warps, stages, pingpong = FP8_FAST_SPLIT_TILE
    cfg = replace(cfg, num_warps=warps, num_stages=stages, pingpong=pingpong, epilogue_subtile=False)
    return cfg, f"fast accumulation: {bm}x{bn} tiles on two 4-warp consumers splitting their rows"


def block_scaled_config(cfg: TileConfig) -> tuple[TileConfig, str | None]:
    """A tile the caller chose (or the tuner), made fit for block-scaled fp8, and what was changed
    (None: nothing).  ``fp8_choice(block_scaled=True)`` picks fitting tiles itself.

    Each K-step must lie inside one scale block: a K step of at most 128, dividing it.  The
    warp-specialized kernel adds each K-step's products, summed in an accumulator of their own, into
    the fp32 one after waiting for them, so no wgmma is in flight while a warpgroup adds.  Two consumer
    warpgroups that split every tile's rows and run apart (``pingpong``: the kernel's SPLIT_ROWS) keep
    the tensor cores busy meanwhile, where a cooperative consumer's warpgroups wait together: on the
    H100, 1x128 x 128x128 scales, 512-8192 rows, 0.75-0.88 of ``torch._scaled_mm`` against 0.69-0.85
    cooperative (``sweeps/fp8_blockwise.txt``).  Each consumer holds two accumulators, which for more
    than 64 floats a thread (64 x 256 on 4 warps: 128 each) overrun the 232 registers a consumer has; a
    tile beyond that, run as two parts, wider than a scale block, split into halves under a wgmma's 64
    rows or with Stream-K across two consumers becomes ``FP8_BLOCK_SCALED_TILE``.
    """
    changes = []
    if cfg.block_k > SCALE_BLOCK_K or SCALE_BLOCK_K % cfg.block_k:
        cfg = replace(cfg, block_k=SCALE_BLOCK_K)
        changes.append(f"a K step of {SCALE_BLOCK_K}, one scale block")
    if cfg.kernel == "gluon_ws":
        rows = cfg.block_m // 2 if cfg.pingpong else cfg.block_m
        floats = rows * cfg.block_n // (32 * cfg.num_warps)
        two_parts = cfg.epilogue_subtile or cfg.block_n & (cfg.block_n - 1)
        halves_too_short = cfg.pingpong and rows < 64  # (a wgmma is 64 rows)
        unfit = floats > 64 or two_parts or cfg.block_n > SCALE_BLOCK_K or halves_too_short
        if unfit or (cfg.stream_k and cfg.pingpong):
            bm, bn, warps, stages, pingpong = FP8_BLOCK_SCALED_TILE
            cfg = replace(
                cfg, block_m=bm, block_n=bn, num_warps=warps, num_stages=stages, epilogue_subtile=False,
                pingpong=pingpong, stream_k=False, cluster_m=1, cluster_n=1,
            )  # fmt: skip
            changes.append(f"{bm}x{bn} tiles, two 4-warp consumers on their halves")
    if not changes:
        return cfg, None
    return cfg, "block-scaled fp8: " + ", ".join(changes)


__all__ = [
    "FEW_ROWS",
    "FP8_BLOCK_K",
    "FP8_MID_TILE",
    "FP8_NARROW_TILE",
    "FP8_WIDE_TILE",
    "ONE_WAVE_ROWS",
    "FP8_BLOCK_SCALED_TILE",
    "block_scaled_config",
    "few_rows_config",
    "accumulation_config",
    "fp8_choice",
]
