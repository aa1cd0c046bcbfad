"""The heuristic: a good config without tuning, from the shape class and the device.

Pure functions of ``(GemmProblem, DeviceInfo)``: no tensors, no torch.cuda,
so each rule is tested alone on device fakes (``device.KNOWN_DEVICES``) and
``explain()`` can say what an H100 would run from a machine without one.
Each knob is one small function; each constant names the sweep it came from
(``benchmarks/results/h100/sweeps/``).
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import NamedTuple

from .configs import MAX_SPLIT_K, GemmProblem, TileConfig, split_width, wave_efficiency
from .device import DeviceInfo
from .schedules import cdiv, split_tail_schedule


def pow2_at_least(x: int, lo: int, hi: int) -> int:
    """The power of two >= ``x``, clamped to [lo, hi]."""
    return min(max(1 << max(x - 1, 0).bit_length(), lo), hi)


class Tile(NamedTuple):
    """A CTA tile with its warps and stages, and its measured speed relative to the menu's best."""

    block_m: int
    block_n: int
    block_k: int
    warps: int
    stages: int
    speed: float = 1.0
    tma: bool = False

    def config(self, **flags) -> TileConfig:
        return TileConfig(self.block_m, self.block_n, self.block_k, 8, self.warps, self.stages, **flags)


# CTA tiles the heuristic picks from on a GPU, per element size, with the
# throughput of one such tile relative to the largest (measured on an H100,
# fp16, sweeps/sweep_*.csv): bigger tiles reuse each loaded byte more,
# smaller ones fill more SMs.  The 2-byte tiles below 128x256 run as deep a
# ring as shared memory holds (6 stages of 32 / 24 KiB + the TMA store
# buffer): sweeps/shape_class_sweep.json (H100, bf16 TN, 18 shapes, 2026-11-23)
# measured 128x128 at 6 stages 0.73-0.98 of cuBLAS where 4 stages gave
# 0.63-0.85 (512x4096x4096: 0.85 -> 0.98), and 64x128 on TMA at 6 stages 0.98
# at 1024^3 (the pointer kernel's 4 stages: 0.80).  Their speeds: 128x128 at
# 0.88-0.92 of 128x256 on >= 3 waves of both (2048x6144x5120), 64x128 fit to
# lose to 128x256 at 1536^3 (2.2 waves: 0.66 against 0.74) and win below a wave.
TILE_MENU: dict[int, list[Tile]] = {
    2: [
        Tile(128, 256, 64, 8, 3, 1.00, tma=True),  # 48 KiB a stage: 3 stages + 64 KiB TMA store buffer
        Tile(128, 128, 64, 8, 6, 0.92, tma=True),
        Tile(64, 128, 64, 4, 6, 0.74, tma=True),
        # pointer, 4 stages: rated as the pointer 64x128 at 4 stages (1024^3: 0.80 against 0.98 at 6 on TMA)
        Tile(128, 64, 64, 4, 4, 0.60),
        Tile(64, 64, 64, 4, 4, 0.30),
    ],
    4: [
        Tile(128, 128, 32, 8, 3, 1.00),
        Tile(64, 128, 32, 4, 4, 0.75),
        Tile(64, 64, 32, 4, 4, 0.45),
    ],
    8: [Tile(64, 64, 16, 4, 2, 1.00)],  # fp64 dot runs on CUDA cores
}


def tiles_of(problem: GemmProblem, block_m: int, block_n: int) -> int:
    """Output tiles over the whole batch."""
    return problem.batch * cdiv(problem.m, block_m) * cdiv(problem.n, block_n)


def choose_cta_tile(problem: GemmProblem, device: DeviceInfo) -> Tile:
    """The menu tile with the best (wave efficiency x per-tile speed)."""
    best, best_score = None, -1.0
    for tile in TILE_MENU[problem.elem_size]:
        score = wave_efficiency(tiles_of(problem, tile.block_m, tile.block_n), device.sm_count) * tile.speed
        if score > best_score + 1e-9:
            best, best_score = tile, score
    return best


class SkinnyTile(NamedTuple):
    """Tiles for problems with few rows of A: narrow in M and N, a K step of ``k_bytes`` of each B row."""

    rows_up_to: int
    block_m: int
    block_n: int
    k_bytes: int
    warps: int
    most_stages: int


# Skinny problems (few rows of A: decode-time linears) are bound by reading B
# once.  What matters is bytes in flight per SM, so the tiles are narrow in M
# and N and long in K (a K step of 128-256 elements is a 256-512 byte run of
# each B row).  Measured on the H100, fp16, M in {1, 32, 64, 128} over the
# Llama-3 8B/70B projections (sweeps/sweep_skinny.csv): geomean 1.03x cuBLAS
# at M=1 against 0.87x for the old 16x128x64 tiles.
SKINNY_MENU = [
    SkinnyTile(16, 16, 64, 512, 4, 3),
    SkinnyTile(32, 32, 64, 256, 4, 3),
    SkinnyTile(64, 64, 64, 256, 4, 4),
    SkinnyTile(128, 64, 128, 256, 4, 4),
]


def is_gemv(problem: GemmProblem) -> bool:
    """One row of A, unbatched: the GEMV kernel (no tensor cores) is the fastest (sweeps/sweep_gemv*.csv)."""
    return problem.m == 1 and problem.batch == 1 and problem.elem_size <= 4


def is_skinny(problem: GemmProblem, device: DeviceInfo) -> bool:
    """Few enough rows that the skinny tiles beat the large ones.

    Up to 64 rows always; up to 128 while 128-row tiles would fill fewer
    than half the SMs (beyond that the large-tile kernel wins, measured).
    """
    if problem.elem_size > 4:
        return False
    if problem.m <= 64:
        return True
    return problem.m <= 128 and problem.elem_size == 2 and 2 * tiles_of(problem, 128, 128) < device.sm_count


def is_long_k(problem: GemmProblem, device: DeviceInfo) -> bool:
    """K much longer than M and N, and too few 128 x 128 tiles to fill half the SMs."""
    return problem.k >= 8 * max(problem.m, problem.n) and 2 * tiles_of(problem, 128, 128) <= device.sm_count


def choose_long_k_tile(problem: GemmProblem) -> Tile:
    """The menu's 128 x 128 tile: with split-K filling the SMs, the larger tile's
    operand reuse wins (measured on the H100: 1024x1024x32768 0.92x cuBLAS in
    128x128 tiles split 2, against 0.67x in 64x128 tiles unsplit)."""
    return next(t for t in TILE_MENU[problem.elem_size] if (t.block_m, t.block_n) == (128, 128))


class GemvTile(NamedTuple):
    block_n: int
    block_k: int
    warps: int


def choose_gemv_tile(problem: GemmProblem) -> GemvTile:
    """The GEMV kernel's tile (M = 1).

    Measured on the H100, fp16, over the Llama-3 8B/70B projections
    (sweeps/sweep_gemv.csv, sweeps/sweep_gemv_narrow.csv): 8 outputs per
    program, a K step of 2 KiB of each B row, 8 warps: geomean 1.07x cuBLAS,
    against 1.06x for 16 outputs x 1 KiB and 1.03x for the skinny tl.dot
    tiles.  Many narrow programs, not deep pipelines, keep the loads in
    flight: the loop has no tl.dot for Triton to pipeline.
    """
    bn = 8
    bk = min(2048 // problem.elem_size, pow2_at_least(problem.k, 16, 2048))
    warps = min(
        8, bk * bn // 32
    )  # a short K (bk < 32) has work for fewer warps: each thread needs one output
    return GemvTile(bn, bk, warps)


def choose_skinny_tile(problem: GemmProblem) -> Tile:
    """The skinny tile for a problem with few rows (``stages`` is the most worth having)."""
    entry = next((e for e in SKINNY_MENU if problem.m <= e.rows_up_to), SKINNY_MENU[-1])
    bn = min(entry.block_n, pow2_at_least(problem.n, 16, entry.block_n))
    bk = min(entry.k_bytes // problem.elem_size, pow2_at_least(problem.k, 16, 256))
    return Tile(entry.block_m, bn, bk, entry.warps, entry.most_stages)


def choose_num_stages(cfg: TileConfig, problem: GemmProblem, device: DeviceInfo, most: int = 4) -> int:
    """As many stages as shared memory holds, at most ``most``, at least 2."""
    stage_size = (cfg.block_m * cfg.block_k + cfg.block_k * cfg.block_n) * problem.elem_size
    fit = device.smem_per_block // stage_size
    k_tiles = math.ceil(max(problem.k, 1) / cfg.block_k)
    return max(2, min(fit, most, k_tiles + 1))


def choose_split_k(problem: GemmProblem, device: DeviceInfo, block_m: int, block_n: int, block_k: int) -> int:
    """Slices of K so that the programs fill about one wave.

    Few output tiles (decode-time M, or small M x N with a long K) leave most
    SMs idle under sliced-K.  Splitting costs a round trip of fp32 partials
    through memory, so it is used only when the tiles fill at most half the
    SMs; then each SM gets about one program (measured on the H100: one
    program per SM with deep pipelines beat two or four, and splitting a
    wave that is already half full lost).  Each slice keeps at least 2 K-tiles.
    """
    tiles = tiles_of(problem, block_m, block_n)
    k_tiles = cdiv(problem.k, block_k)
    if 2 * tiles > device.sm_count:
        return 1
    return max(1, min(device.sm_count // tiles, k_tiles // 2, MAX_SPLIT_K))


def choose_split_k_inline(problem: GemmProblem, block_m: int, block_n: int, split_k: int) -> bool:
    """Reduce split-K partials in the GEMM's own launch (the last slice of a tile
    to finish adds them), rather than in a second kernel?

    Inline saves a launch (a few microseconds: most of a decode GEMM's slack)
    but leaves each tile's sum to one program.  Measured on the H100
    (sweeps/sweep_skinny.csv, 1500 pairs): inline is 1-3% faster (median) while
    one tile's partials (its valid rows only) stay within 128 KiB, even at
    256 KiB, and loses 5-15% beyond 512 KiB with small tiles.  With 128 x 128
    tiles the second kernel's pass over all partials costs more (512x512x65536,
    8 slices: inline 0.85x cuBLAS, second kernel 0.75x).
    """
    partial_bytes = split_k * min(problem.m, block_m) * block_n * problem.acc_size
    return split_k > 1 and (partial_bytes <= 256 * 1024 or block_m * block_n >= 128 * 128)


def split_k_config(tile: Tile, problem: GemmProblem, device: DeviceInfo, **flags) -> TileConfig:
    """``tile`` with split-K chosen for ``problem`` (one slice when the tiles already fill the SMs)."""
    split = choose_split_k(problem, device, tile.block_m, tile.block_n, tile.block_k)
    inline = choose_split_k_inline(problem, tile.block_m, tile.block_n, split)
    return tile.config(split_k=split, split_k_inline=inline, **flags)


# Small problems with a short K (sweeps/small_gemm_sweep.json, H100, bf16, 17
# shapes x 14 configs, 2026-11-23): where the menu's tiles fill at most half
# the SMs, splitting a short K costs more than it hides -- a round trip of fp32
# partials and an arrival counter per tile, for slices of 2-4 K-steps.  More,
# narrower tiles with a K step of 128 and no split win: 512^3 NN 1.12x cuBLAS
# (split 4: 0.68), 512x512x1408 NT 1.01 (0.67), 512x256x512 NT 1.09 (0.66),
# 256^3 1.17 (0.73).  At K = 8192 the split 64x128 tiles still win
# (512x512x8192: 0.94 against 0.68), so the rule stops at SMALL_MAX_K.  Where
# 64x32 tiles run over one wave, 64x64 ones win (sweeps/small_tile_over_a_wave
# .json, 11 shapes x 2 dtypes): 768x384x768 TN 1.07 against 0.94, 384x768x1536
# 0.94 (0.85), 1024x512x1024 0.96 (0.89); within a wave 64x32 wins or ties
# (512x512x1408 NT 0.99 against 0.92, 256x1024x1792 0.92 (0.86)).
SMALL_TILE = Tile(64, 32, 128, 4, 4)
SMALL_WIDE_TILE = Tile(64, 64, 128, 4, 4)
SMALL_MAX_K = 2048


def small_problem_tile(problem: GemmProblem, device: DeviceInfo) -> Tile | None:
    """The unsplit tile for a 2-byte problem whose K is short (asked where split-K would run), else None."""
    if problem.elem_size != 2 or problem.k > SMALL_MAX_K:
        return None
    narrow = SMALL_TILE
    return narrow if tiles_of(problem, narrow.block_m, narrow.block_n) <= device.sm_count else SMALL_WIDE_TILE


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
TMA_STREAM_K_128 = STREAM_K_TILE._replace(stages=5, tma=True)
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
        return TMA_STREAM_K_128.config(tma=True, persistent=True, stream_k=True)
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
# TMA kernel, bf16, same run (H100, benchmarks/results/h100/gluon/gluon_sweep.csv,
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
# below a wave (sweeps/ws64_below_wave_ab.json, H100, 2026-11-23).
WS_DEEP_TILE = Tile(128, 128, 64, 4, 6)


# Tile widths that are not powers of two, on the warp-specialized kernel (two
# accumulators, ``configs.split_width``): they cut wave quantization where
# every power-of-two width leaves SMs idle.  Speeds relative to 128x256 on the TMA
# kernel, from the shapes of many full waves in sweeps/split_width_sweep.json
# (H100, bf16 TN, 2026-11-23; 4096^3 and 8192x4096x4096: 128x192 0.85-0.86 of
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
#: on the target shapes outside the sweep (sweeps/split_width_refit_ab.json, H100, 2026-11-23).
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
WIDE_TILE_SINGLE_WAVE = TileConfig(128, 256, 64, 8, 8, 4, tma=True, persistent=True, epilogue_subtile=True)
WIDE_TILE_FEW_WAVES = replace(WIDE_TILE_SINGLE_WAVE, warp_specialize=True)
WIDE_TILE_MANY_WAVES = TileConfig(128, 256, 64, 8, 8, 3, tma=True, persistent=True, warp_specialize=True)


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
    if not cfg.warp_specialize or cfg.stream_k or cfg.group_m != 8:
        return None
    tiles = cdiv(problem.n, cfg.block_n)
    if tiles <= NARROW_ROW_TILES:
        return replace(cfg, group_m=1)
    if tiles <= SHORT_ROW_TILES:
        return replace(cfg, group_m=SHORT_ROW_GROUP_M)
    return None


def fit_shared_memory(cfg: TileConfig, problem: GemmProblem, device: DeviceInfo) -> TileConfig:
    """Halve block_k (not below 16) until the stages fit the device's shared memory."""
    while cfg.smem_bytes(problem.elem_size) > device.smem_per_block and cfg.block_k > 16:
        cfg = replace(cfg, block_k=cfg.block_k // 2)
    return cfg


def interpreter_config(problem: GemmProblem) -> TileConfig:
    """Small tiles: the interpreter runs one program at a time in numpy, so speed
    does not matter and small tiles keep the ragged-edge masks exercised."""
    bm = pow2_at_least(problem.m, 16, 64)
    bn = pow2_at_least(problem.n, 16, 64)
    bk = min(32, pow2_at_least(problem.k, 16, 32))
    return TileConfig(bm, bn, bk, 8, 4, 2)


class Choice(NamedTuple):
    """A heuristic config and the rule that chose it, in words (``explain()`` prints it)."""

    config: TileConfig
    rule: str


def heuristic_choice(problem: GemmProblem, device: DeviceInfo) -> Choice:
    """The heuristic's config for ``problem`` on ``device``, and why."""
    if device.interpreter:
        return Choice(interpreter_config(problem), "interpreter: small tiles (speed does not matter there)")
    # The shape-class tiles were measured on an H100: on a GPU with less shared
    # memory a long K step is the part to give up.
    cfg, rule = _gpu_choice(problem, device)
    if (narrow := narrow_row_order(cfg, problem)) is not None:
        cfg = narrow
        rule += (
            f"; at most {NARROW_ROW_TILES} tiles along N: one row of tiles after another"
            if narrow.group_m == 1
            else f"; at most {SHORT_ROW_TILES} tiles along N: groups of {SHORT_ROW_GROUP_M} rows of tiles"
        )
    return Choice(fit_shared_memory(cfg, problem, device), rule)


def heuristic_config(problem: GemmProblem, device: DeviceInfo) -> TileConfig:
    """A good config without tuning: from the shape class and the device."""
    return heuristic_choice(problem, device).config


def _gpu_choice(problem: GemmProblem, device: DeviceInfo) -> tuple[TileConfig, str]:
    if is_gemv(problem):
        g = choose_gemv_tile(problem)
        split = choose_split_k(problem, device, 1, g.block_n, g.block_k)
        cfg = TileConfig(
            16, g.block_n, g.block_k, 8, g.warps, 1, split_k=split, split_k_inline=split > 1, gemv=True
        )
        return cfg, "one row of A (M = 1): GEMV kernel, CUDA-core dot products streaming B"
    if is_skinny(problem, device):
        tile = choose_skinny_tile(problem)
        cfg = split_k_config(tile, problem, device)
        cfg = replace(cfg, num_stages=choose_num_stages(cfg, problem, device, tile.stages))
        return cfg, f"skinny (M = {problem.m}): narrow tiles with a long K step, split-K to fill the SMs"
    if problem.elem_size <= 4 and is_long_k(problem, device):
        return (
            split_k_config(choose_long_k_tile(problem), problem, device),
            "long K over few tiles: 128x128 tiles with split-K",
        )
    tile = choose_cta_tile(problem, device)
    tiles = tiles_of(problem, tile.block_m, tile.block_n)
    score = wave_efficiency(tiles, device.sm_count) * tile.speed
    rule = f"the menu tile with the best wave efficiency x tile speed ({score:.2f}, {tiles} tiles on {device.sm_count} SMs)"
    if choose_split_k(problem, device, tile.block_m, tile.block_n, tile.block_k) > 1:
        small = small_problem_tile(problem, device)
        if small is not None:
            count = tiles_of(problem, small.block_m, small.block_n)
            return small.config(), (
                f"{rule}; the tiles fill at most half the SMs and K is short ({problem.k} <= "
                f"{SMALL_MAX_K}): {count} tiles of {small.block_m}x{small.block_n}, a K step of "
                f"{small.block_k}, no split (splitting a short K costs more than it hides)"
            )
        return split_k_config(tile, problem, device), rule + "; split-K: the tiles fill at most half the SMs"
    split = split_width_tile(problem, device, score)
    if split is not None:
        wide, wide_score = split
        first, rest = split_width(wide.block_n)
        return wide.config(tma=True, persistent=True, warp_specialize=True), (
            f"{wide.block_m}x{wide.block_n} tiles fill the SMs better ({wide_score:.2f} against the menu's "
            f"{score:.2f}): the warp-specialized kernel, two accumulators of {first} + "
            f"{rest} columns"
        )
    tail = split_tail_tile(problem, device, score)
    if tail is not None:
        return tail[0].config(tma=True, persistent=True, warp_specialize=True, stream_k=True), (
            f"{rule}; the warp-specialized 128x128 tile with its last wave split into K-chunks scores "
            f"{tail[1]:.2f}: whole waves, then each remaining tile in equal chunks, one per SM"
        )
    ws = warp_specialized_tile(problem, device)
    if ws is not None:
        return ws.config(tma=True, persistent=True, warp_specialize=True), (
            f"short K ({problem.k}) over many tiles on sm_90: the warp-specialized persistent kernel "
            f"({ws.block_m}x{ws.block_n}, {ws.warps} warps), whose TMA producer and overlapped epilogue "
            "hide what a short K loop cannot"
        )
    if prefers_stream_k(problem, device, score):
        return stream_k_config(device), "one wave of 128x128 tiles plus a sliver: Stream-K"
    tma = tile.tma and device.capability >= (9, 0)
    if tma and (tile.block_m, tile.block_n) == (128, 256) and prefers_tma_stream_k(problem, device):
        return (
            TMA_STREAM_K_TILE.config(tma=True, persistent=True, stream_k=True),
            "two or more waves of 128x256 tiles, the last nearly empty: Stream-K on the TMA kernel",
        )
    if tma and (tile.block_m, tile.block_n) == (128, 128) and warp_specialized_fits(problem, device):
        return WS_DEEP_TILE.config(tma=True, persistent=True, warp_specialize=True), (
            rule + "; 128x128 tiles on the warp-specialized kernel, one consumer warpgroup, a 6-deep ring "
            "(sm_90: at or above the TMA kernel's 6 stages on every shape swept)"
        )
    wide = wide_tile_config(problem, device) if tma and (tile.block_m, tile.block_n) == (128, 256) else None
    if wide is not None:
        return wide[0], f"{rule}; {wide[1]}"
    # Persistent even for a single wave: measured on the H100, the data-parallel
    # TMA grid loses up to 40% with a transposed A at 2048^3 (sweeps/sweep_layouts.csv).
    cfg = tile.config(tma=tma, persistent=tma)
    if cfg.smem_bytes(problem.elem_size) > device.smem_per_block:  # smaller GPUs (e.g. 100 KiB on sm_86)
        cfg = replace(cfg, tma=False, persistent=False)
        cfg = replace(cfg, num_stages=choose_num_stages(cfg, problem, device))
        rule += "; pointer kernel, stages cut to fit shared memory"
    elif tma:
        rule += "; TMA persistent kernel (sm_90)"
    return cfg, rule


__all__ = [
    "Choice",
    "heuristic_choice",
    "heuristic_config",
]
