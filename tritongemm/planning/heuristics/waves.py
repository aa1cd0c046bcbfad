"""sm_90 rules by waves of tiles: Stream-K, the warp-specialized kernel's tiles (deep, split-width, split-tail,
wide), and its tile order where a row of tiles is short."""

from __future__ import annotations

import math
from dataclasses import replace

from ...device import DeviceInfo
from ..configs import TileConfig
from ..problem import GemmProblem, wave_efficiency
from ..schedules import cdiv, split_tail_schedule
from .tiles import Tile, tiles_of

# Stream-K's tile and its efficiency against a full wave of the same tile's
# sliced-K schedule: 896x2432x4096 (133 tiles on 132 SMs) ran in 37.4 us where
# the ideal 133/132 of one wave is 23.4 us (H100, fp16, CUDA-graph timing;
# sweeps/sweep_wave.csv): 0.63, the cost of restarting the pipeline per
# segment and of the fix-up.  Below about 32 K-steps a program that cost
# dominates (1024^3: 8 K-steps each, 1.7x slower than sliced-K).
STREAM_K_TILE = Tile(128, 128, 64, 8, 4, 0.92)
STREAM_K_EFFICIENCY = 0.63
# On sm_90 the TMA kernel's Stream-K, 5 stages deep: against the pointer
# kernel's above, 1664x1408x4096 0.75 of cuBLAS (0.66-0.70), 512x4608x3584
# 0.78 (0.73), 512x5120x4096 0.75 (0.74) (sweeps/shape_class_sweep.json);
# 0.70 lets it take 1664x1408x4096 from 78 tiles of 128x256 (score 0.59).
TMA_STREAM_K_128 = STREAM_K_TILE._replace(stages=5, tma_kernel=True)
TMA_STREAM_K_128_EFFICIENCY = 0.70
STREAM_K_MIN_STEPS = 32
# Only for one wave of its tiles plus a sliver: below one wave the sliced-K
# tiles run faster than the wave-efficiency model says (Llama-3-70B QKV at
# M = 128, 80 tiles: TMA 128x128 0.91x cuBLAS, Stream-K 0.88x), and at two
# waves Stream-K measured slower (2048^3, 1.94 waves: 0.73x sliced-K).
STREAM_K_MAX_WAVES = 1.25


def prefers_stream_k(problem: GemmProblem, device: DeviceInfo, sliced_score: float) -> bool:
    """Stream-K beats the best sliced-K tile (score = wave efficiency x tile speed)?

    Considered only for one wave of 128x128 tiles plus a sliver (up to
    ``STREAM_K_MAX_WAVES``), where sliced-K runs a nearly empty second wave.
    """
    if problem.batch != 1 or problem.elem_size != 2:
        return False
    tile = STREAM_K_TILE
    tiles = tiles_of(problem, tile.block_m, tile.block_n)
    if not device.sm_count < tiles <= STREAM_K_MAX_WAVES * device.sm_count:
        return False
    if tiles * cdiv(problem.k, tile.block_k) / device.sm_count < STREAM_K_MIN_STEPS:
        return False
    efficiency = TMA_STREAM_K_128_EFFICIENCY if device.capability >= (9, 0) else STREAM_K_EFFICIENCY
    return tile.speed * efficiency > sliced_score


def stream_k_config(device: DeviceInfo) -> TileConfig:
    """Stream-K's 128x128 tile: on the TMA kernel where the device has it, else on the pointer kernel."""
    if device.capability >= (9, 0):
        return TMA_STREAM_K_128.config(kernel="tma_persistent", stream_k=True)
    return STREAM_K_TILE.config(stream_k=True)


# Stream-K on the TMA kernel's 128x256 tiles, for problems of at least two
# waves whose last wave is nearly empty.  Measured on the H100, fp16
# (sweeps/sweep_tma_streamk.csv): 5120x5120x4096 (6.06 waves) 0.83 -> 0.92 of
# cuBLAS, 3072^3 (2.18 waves) 0.74 -> 0.84; no gain where the last wave is
# fuller (4096^3, 3.88 waves: 0.92 -> 0.82; 1024x10240x8192, 2.42: none).
TMA_STREAM_K_TILE = Tile(128, 256, 64, 8, 3)
TMA_STREAM_K_MAX_SLIVER = 0.25  # the last wave's fill, as a fraction of the SMs
TMA_STREAM_K_MIN_IDLE = 0.08  # below this (many waves) streaming costs more than the idle SMs


def prefers_tma_stream_k(problem: GemmProblem, device: DeviceInfo) -> bool:
    """Stream-K on the Hopper TMA kernel: two or more waves of 128x256 tiles and a last one nearly empty."""
    if problem.batch != 1 or problem.elem_size != 2 or device.capability < (9, 0):
        return False
    tile = TMA_STREAM_K_TILE
    waves = tiles_of(problem, tile.block_m, tile.block_n) / device.sm_count
    sliver = waves - math.floor(waves)
    idle = (1 - sliver) / math.ceil(waves)  # the share of SM time sliced-K's last wave leaves idle
    return waves >= 2 and 0 < sliver <= TMA_STREAM_K_MAX_SLIVER and idle >= TMA_STREAM_K_MIN_IDLE


# The warp-specialized Gluon kernel (``kernels/gemm_gluon.py``) against the
# TMA kernel, bf16, same run (H100, sweeps/gluon_sweep.csv,
# ratios to cuBLAS, TN / NN): it wins where K is short and tiles are many --
# 12608x768x768 0.83/0.86 vs 0.65/0.68, 8192x8192x128 1.05/1.06 vs 0.80,
# 8192x8192x256 0.94/0.96 vs 0.72/0.71, 12608x3072x768 0.99/1.02 vs 0.88/0.90.
# Its deep 128x128 tile (below) then beat the wider tiles from K = 512 on
# (sweeps/shape_class_sweep_shortk.json, TN): 8192x768x768 0.96 (64x256: 0.89),
# 4096x3072x768 1.02 (128x256: 0.99), 12608x3840x1280 0.95 (TMA 128x256: 0.86,
# warp-specialized 128x256: 0.93); at K >= 3584 128x256 on TMA wins again
# (2048x6144x5120 0.96 against 0.88), so the rule stops at K = 1280.
WS_MAX_K = 1280
WS_NARROW_TILE = Tile(64, 256, 64, 4, 4)  # K < 512 (8192x8192x128/256)
# Where the menu picks 128x128 on sm_90: one consumer warpgroup holding the
# whole 128x128 accumulator, 6 stages.  sweeps/shape_class_sweep.json, against
# the TMA kernel at 6 stages: 2048x3072x3072 0.97 (0.89), 3072^3 0.85 (0.77),
# 1024x4608x3584 0.78 (0.73), 1024x5120x4096 0.82 (0.80), equal (+-0.01)
# below one wave; two consumer warpgroups (8 warps) were within 0.01 of one.
# The menu's 64x128 on this kernel instead of TMA was A/B-tested and left out:
# geomean 0.906 against 0.905 (bf16), 0.875 against 0.881 (fp16), 18 shapes
# below a wave (sweeps/ws64_below_wave_ab.json, H100).
WS_DEEP_TILE = Tile(128, 128, 64, 4, 6)

# Tile widths that are not powers of two, on the warp-specialized kernel (two
# accumulators, ``configs.split_width``): they cut wave quantization where
# every power-of-two width leaves SMs idle.  Speeds relative to 128x256 on the TMA
# kernel, from the shapes of many full waves in sweeps/split_width_sweep.json
# (H100, bf16 TN; 4096^3 and 8192x4096x4096: 128x192 0.85-0.86 of
# cuBLAS, 128x160 0.77-0.78, 128x96 0.75-0.76, against 0.96 for 128x256).  The
# same sweep, where they fit the SMs: 512x5120x4096 128x160 0.96 (heuristic
# 0.76), 1024x3072x8192 128x192 0.94 (0.79), 12608x768x3072 128x192 0.90 (0.77),
# 1536^3 128x160 0.84 (0.72).
SPLIT_WIDTH_TILES = (
    Tile(128, 192, 64, 8, 4, 0.89),
    Tile(128, 160, 64, 8, 5, 0.80),
    Tile(128, 96, 64, 4, 6, 0.78),
)
#: How much better (wave efficiency x speed) a split-width tile must score than the menu's: 1.04
#: adds just 1024x5120x{4096,14336} to 1.05's picks (128x160, +5-7%); a re-fit of the speeds lost
#: on the target shapes outside the sweep (sweeps/split_width_refit_ab.json, H100).
SPLIT_WIDTH_MARGIN = 1.04


def split_width_tile(
    problem: GemmProblem, device: DeviceInfo, menu_score: float
) -> tuple[Tile, float] | None:
    """The split-width tile (and its score) that beats the menu tile's ``menu_score`` by the margin, else None."""
    if not warp_specialized_fits(problem, device):
        return None
    best, best_score = None, menu_score * SPLIT_WIDTH_MARGIN
    for tile in SPLIT_WIDTH_TILES:
        score = wave_efficiency(tiles_of(problem, tile.block_m, tile.block_n), device.sm_count) * tile.speed
        if score > best_score:
            best, best_score = tile, score
    return None if best is None else (best, best_score)


# The warp-specialized 128x128 tile with its last wave split into K-chunks
# (``split_tail_schedule``): where the tail splits at least in two, it runs
# whole_waves + chunk / K-steps waves of work.  H100, bf16, against the heuristic
# then (sweeps/ws_split_tail_sweep.json): 256x3584x18944 0.96 (0.85), 256x3072x8192
# 0.93 (0.84), 2048x3584x3584 0.99 (0.93), 512x14336x4096 1.02 (0.94).  Where a
# split-width tile fits the SMs it stays ahead at K <= 4096 (3072^3 0.85 against
# 128x192's 0.94, 12608x768x3072 0.76 against 0.89), so that rule goes first.
SPLIT_TAIL_SPEED = 0.92  # the menu's 128x128


def split_tail_tile(problem: GemmProblem, device: DeviceInfo, menu_score: float) -> tuple[Tile, float] | None:
    """The warp-specialized 128x128 tile with a split last wave (and its score), where it beats the
    menu tile's ``menu_score`` by ``SPLIT_WIDTH_MARGIN``, else None."""
    if not warp_specialized_fits(problem, device):
        return None
    tile, sms = WS_DEEP_TILE, device.sm_count
    tiles, k_tiles = tiles_of(problem, tile.block_m, tile.block_n), cdiv(problem.k, tile.block_k)
    schedule = split_tail_schedule(tiles, k_tiles, sms)
    if schedule.tile_span < 2 * schedule.iters_per_program:  # the tail does not split
        return None
    waves = schedule.dp_tiles // sms + schedule.iters_per_program / k_tiles
    score = tiles / sms / waves * SPLIT_TAIL_SPEED
    return (tile, score) if score > menu_score * SPLIT_WIDTH_MARGIN else None


# Where the menu picks 128x256 on sm_90, its ring depth, epilogue staging and kernel follow the waves of
# tiles (sweeps/wide_tile_sweep.json: H100, bf16, the 59 target shapes where TMA 128x256 at 3 stages ran,
# geomean 0.962 of cuBLAS).  Up to one wave each SM has one tile: a fourth slot to fill its pipeline
# (224 KiB with the output staged in halves) on the TMA kernel, 1024x3584x3584 0.945 (0.863), 512x8192x3584
# 1.00 (0.90).  Below WIDE_TILE_DEEP_WAVES the warp-specialized kernel with the same ring: 512x16384x3072
# 0.96 (0.89), 8192x1024x4096 0.97 (0.94).  Beyond, with many tiles per SM, overlapping each epilogue
# whole matters more than the fourth slot: the warp-specialized kernel at 3 stages, 6000x16384x3072
# 1.00 (0.94), 4096x6144x4096 0.98 (0.94), 8192x10240x8192 1.00 (0.95), where its 4 stages gave 0.97-0.98.
WIDE_TILE_DEEP_WAVES = 3.5
WIDE_TILE_SINGLE_WAVE = TileConfig(128, 256, 64, 8, 8, 4, kernel="tma_persistent", epilogue_subtile=True)
WIDE_TILE_FEW_WAVES = replace(WIDE_TILE_SINGLE_WAVE, kernel="gluon_ws")
WIDE_TILE_MANY_WAVES = TileConfig(128, 256, 64, 8, 8, 3, kernel="gluon_ws")


def wide_tile_config(problem: GemmProblem, device: DeviceInfo) -> tuple[TileConfig, str] | None:
    """The menu's 128x256 tile on sm_90 by its waves (one tile per SM, a few, many), else None."""
    if not warp_specialized_fits(problem, device):
        return None
    waves = tiles_of(problem, 128, 256) / device.sm_count
    if waves <= 1:
        return WIDE_TILE_SINGLE_WAVE, (
            f"one tile per SM ({waves:.2f} waves): the TMA kernel, 4 stages, the output staged in halves"
        )
    if waves < WIDE_TILE_DEEP_WAVES:
        return WIDE_TILE_FEW_WAVES, (
            f"{waves:.2f} waves: the warp-specialized kernel, 4 stages, the output staged in halves"
        )
    return (
        WIDE_TILE_MANY_WAVES,
        f"{waves:.2f} waves: the warp-specialized kernel, each epilogue overlapped whole",
    )


def warp_specialized_fits(problem: GemmProblem, device: DeviceInfo) -> bool:
    """Can the warp-specialized kernel take this problem class (sm_90, one 2-byte matrix)?"""
    return device.capability == (9, 0) and problem.batch == 1 and problem.elem_size == 2


def warp_specialized_tile(problem: GemmProblem, device: DeviceInfo) -> Tile | None:
    """The warp-specialized kernel's tile for a short-K problem of at least one full wave on sm_90, else None."""
    if not warp_specialized_fits(problem, device):
        return None
    if problem.k > WS_MAX_K or tiles_of(problem, 128, 256) < device.sm_count:
        return None
    return WS_NARROW_TILE if problem.k < 512 else WS_DEEP_TILE


# The warp-specialized kernel's tile order where a row of tiles is short.  With at most
# NARROW_ROW_TILES tiles along N, walking one row of tiles after another (group_m = 1) beat the grouped
# order (group_m = 8), do_bench against cuBLAS (H100, bf16, sweeps/group_m_ab.json): 8192x768x3072
# 0.83 -> 0.96 (NN: 0.83 -> 0.97), 12608x768x3072 (128x192) 0.89 -> 0.93, 12608x768x768 0.91 -> 0.94,
# 12608x1280x5120 (128x256) 0.96 -> 0.98, 8192x1024x4096 0.97 -> 0.98; 8192x768x768 and 3072x768x8192
# TN even.  From 18 on, group_m = 1 lost (8192x2304x768 1.01 -> 0.90, 4096x14336x4096 0.97 -> 0.84).
# With 7-14 tiles, groups of 4 rows won or tied in 10 of 11 shapes (sweeps/group_m_mid_ab.txt): 8192x1280x5120
# 0.86 -> 0.92, 4096x1536x6144 0.86 -> 0.94, 6000x1408x4096 0.90 -> 0.98, 8192x2048x8192 1.005 -> 0.997;
# even at 16 tiles (3072^3), 0.97 -> 0.93 at 56 (4096x14336x4096).
NARROW_ROW_TILES = 6
SHORT_ROW_TILES = 14
SHORT_ROW_GROUP_M = 4


def narrow_row_order(cfg: TileConfig, problem: GemmProblem) -> TileConfig | None:
    """``cfg`` in row-after-row tile order where N spans at most NARROW_ROW_TILES of its tiles, in groups of
    SHORT_ROW_GROUP_M rows where it spans at most SHORT_ROW_TILES; else None (the grouped order stays)."""
    if cfg.kernel != "gluon_ws" or cfg.stream_k or cfg.group_m != 8:
        return None
    tiles = cdiv(problem.n, cfg.block_n)
    if tiles <= NARROW_ROW_TILES:
        return replace(cfg, group_m=1)
    if tiles <= SHORT_ROW_TILES:
        return replace(cfg, group_m=SHORT_ROW_GROUP_M)
    return None
