"""Tiles for fp8 operands (``scaled_mm``): one K-step is 128 bytes of K, as wgmma reads it.

fp8's tensor cores do twice bf16's work per byte of shared memory read, so a K-step of 128
one-byte elements keeps the 128-byte swizzle of bf16's 64 and halves the K loop.  On sm_90 every
tile runs on the warp-specialized kernel (its wgmma needs both operands K-major: A row-major,
B column-major, as ``torch._scaled_mm`` requires); elsewhere, and for other layouts, the
pointer kernel takes the same tile.

The tiles by rows of A (H100, fp8 e4m3 -> bf16, against ``torch._scaled_mm``:
``sweeps/fp8_tiles.txt``):
"""

from __future__ import annotations

from ..configs import TileConfig
from ..device import DeviceInfo
from ..problem import GemmProblem, wave_efficiency
from .tiles import tiles_of

#: (block_m, block_n, warps, stages, epilogue_subtile, pingpong) by the most rows of A they serve
#: (the last serves every M).  A cooperative 128x256 tile holds 128 fp32 accumulators a thread
#: on 8 warps; 4 stages of it fit with the output staged in halves.
FP8_TILES: list[tuple[int, tuple[int, int, int, int, bool, bool]]] = [
    (64, (64, 128, 4, 8, False, False)),
    (512, (128, 128, 8, 6, False, False)),
    (1 << 62, (128, 256, 8, 4, True, False)),
]
FP8_BLOCK_K = 128


def fp8_choice(problem: GemmProblem, device: DeviceInfo) -> tuple[TileConfig, str]:
    """The fp8 tile for ``problem`` on a GPU, and why."""
    bm, bn, warps, stages, subtile, pingpong = next(tile for rows, tile in FP8_TILES if problem.m <= rows)
    # Too few tiles for the SMs: the next smaller width fills more of them.
    while bn > 64 and wave_efficiency(tiles_of(problem, bm, bn), device.sm_count) < 0.5:
        bn //= 2
        subtile = False
    ws = device.capability == (9, 0)
    cfg = TileConfig(
        bm,
        bn,
        FP8_BLOCK_K,
        8,
        warps,
        stages,
        tma=ws,
        persistent=ws,
        warp_specialize=ws,
        epilogue_subtile=subtile and ws,
        pingpong=pingpong and ws,
    )
    where = "the warp-specialized kernel" if ws else "the pointer kernel"
    return cfg, f"fp8 (M = {problem.m}): {bm}x{bn} tiles, a K step of {FP8_BLOCK_K} bytes, on {where}"


__all__ = ["FP8_BLOCK_K", "FP8_TILES", "fp8_choice"]
