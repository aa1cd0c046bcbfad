"""The tile menu and the knobs every rule shares: CTA tile by wave efficiency, stages, split-K, shared memory."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import NamedTuple

from ...device import DeviceInfo
from ..configs import MAX_SPLIT_K, TileConfig
from ..problem import GemmProblem, wave_efficiency
from ..schedules import cdiv


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
    #: measured on the TMA kernel's persistent grid (``tma_persistent``): the menu runs it there on sm_90
    tma_kernel: bool = False

    def config(self, **flags) -> TileConfig:
        return TileConfig(self.block_m, self.block_n, self.block_k, 8, self.warps, self.stages, **flags)


# CTA tiles the heuristic picks from on a GPU, per element size, with the
# throughput of one such tile relative to the largest (measured on an H100,
# fp16, sweeps/sweep_*.csv): bigger tiles reuse each loaded byte more,
# smaller ones fill more SMs.  The 2-byte tiles below 128x256 run as deep a
# ring as shared memory holds (6 stages of 32 / 24 KiB + the TMA store
# buffer): sweeps/shape_class_sweep.json (H100, bf16 TN, 18 shapes)
# measured 128x128 at 6 stages 0.73-0.98 of cuBLAS where 4 stages gave
# 0.63-0.85 (512x4096x4096: 0.85 -> 0.98), and 64x128 on TMA at 6 stages 0.98
# at 1024^3 (the pointer kernel's 4 stages: 0.80).  Their speeds: 128x128 at
# 0.88-0.92 of 128x256 on >= 3 waves of both (2048x6144x5120), 64x128 fit to
# lose to 128x256 at 1536^3 (2.2 waves: 0.66 against 0.74) and win below a wave.
TILE_MENU: dict[int, list[Tile]] = {
    2: [
        Tile(128, 256, 64, 8, 3, 1.00, tma_kernel=True),  # 48 KiB a stage: 3 stages + 64 KiB TMA store buffer
        Tile(128, 128, 64, 8, 6, 0.92, tma_kernel=True),
        Tile(64, 128, 64, 4, 6, 0.74, tma_kernel=True),
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


def is_long_k(problem: GemmProblem, device: DeviceInfo) -> bool:
    """K much longer than M and N, and too few 128 x 128 tiles to fill half the SMs."""
    return problem.k >= 8 * max(problem.m, problem.n) and 2 * tiles_of(problem, 128, 128) <= device.sm_count


def choose_long_k_tile(problem: GemmProblem) -> Tile:
    """The menu's 128 x 128 tile: with split-K filling the SMs, the larger tile's
    operand reuse wins (measured on the H100: 1024x1024x32768 0.92x cuBLAS in
    128x128 tiles split 2, against 0.67x in 64x128 tiles unsplit)."""
    return next(t for t in TILE_MENU[problem.elem_size] if (t.block_m, t.block_n) == (128, 128))


# Long K over very few tiles (sweeps/longk_sweep.json: H100, bf16, 8 shapes x NN/NT, ~100 configs
# each, against cuBLAS): at most 4 tiles of 128x128 (256x256, K 64k-131k), 64x64 tiles with a K step
# of 128, 5 stages, 8 slices reduced in the launch read 0.89-0.94 of cuBLAS where 128x128 tiles in
# 33 slices read 0.50-0.76.  With B column-major (F.linear's weight) and a full half wave of tiles
# (1024x1024), the warp-specialized kernel's Stream-K (K chunks per SM) reads 0.90-0.91 where the
# pointer kernel's split read 0.72-0.77; row-major B keeps the pointer split (0.99-1.00).
LONG_K_FEW_TILES = Tile(64, 64, 128, 4, 5)
LONG_K_FEW_TILES_MAX = 4
LONG_K_WS_MIN_TILES = 32


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
    but leaves each tile's sum to one program.  Measured on the H100 (1500
    pairs of ``python -m benchmarks.sweep_skinny``, whose CSV was not kept; see
    docs/heuristics.md): inline is 1-3% faster (median) while
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
# shapes x 14 configs): where the menu's tiles fill at most half
# the SMs, splitting a short K costs more than it hides -- a round trip of fp32
# partials and an arrival counter per tile, for slices of 2-4 K-steps.  More,
# narrower tiles with a K step of 128 and no split win: 512^3 NN 1.12x cuBLAS
# (split 4: 0.68), 512x512x1408 NT 1.01 (0.67), 512x256x512 NT 1.09 (0.66),
# 256^3 1.17 (0.73).  At K = 8192 the split 64x128 tiles still win
# (512x512x8192: 0.94 against 0.68), so the rule stops at SMALL_MAX_K.  Where
# 64x32 tiles run over one wave, 64x64 ones win
# (sweeps/small_tile_over_a_wave.json, 11 shapes x 2 dtypes): 768x384x768 TN
# 1.07 against 0.94, 384x768x1536 0.94 (0.85), 1024x512x1024 0.96 (0.89);
# within a wave 64x32 wins or ties
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


def fit_shared_memory(cfg: TileConfig, problem: GemmProblem, device: DeviceInfo) -> TileConfig:
    """Halve block_k (not below 16) until the stages fit the device's shared memory."""
    while cfg.smem_bytes(problem.elem_size) > device.smem_per_block and cfg.block_k > 16:
        cfg = replace(cfg, block_k=cfg.block_k // 2)
    return cfg
