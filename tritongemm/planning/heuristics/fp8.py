"""Tiles for fp8 operands (``scaled_mm``): one K-step is 128 bytes of K, as wgmma reads it.

fp8's tensor cores do twice bf16's work per byte of shared memory read, so a K-step of 128
one-byte elements keeps the 128-byte swizzle of bf16's 64 and halves the K loop.  On sm_90 every
tile runs on the warp-specialized kernel (its wgmma needs both operands K-major: A row-major,
B column-major, as ``torch._scaled_mm`` requires); elsewhere, and for other layouts, the
pointer kernel takes the same tile.

Measured on an H100 against ``torch._scaled_mm`` (fp8 e4m3 -> bf16, rowwise and tensorwise, with
and without fast accumulation, 19 shapes from 16x4096x4096 to 8192x14336x4096:
``benchmarks/results/h100/sweeps/fp8_tiles.txt``), by how many tiles the shape has:

* at most 64 rows, or 128 x 128 tiles for at most half the SMs: 64 x 128 on 4 warps (16 x 4096 x
  4096, precise sums: 0.95 of torch where 128 x 128 reached 0.81 and 128 x 256 0.54; 16 x 14336 x
  4096: 1.00 against 0.92), which loses where more tiles would fill the SMs (512 x 4096 x 4096: 0.68
  against 128 x 128's 0.89);
* fewer 128 x 256 tiles than three quarters of the SMs: 128 x 128 on 8 warps, 6 stages
  (512 x 4096 x 4096: 0.89 against 128 x 256's 0.62; 256 x 5120 x 5120: 0.89 against 0.60);
* else 128 x 256 on 8 warps, its output staged in halves for a fourth stage (0.84-0.90 of
  torch's precise mode, 0.93-1.00 of its fast mode, against 128 x 128's 0.78-0.84 and 0.89-0.97).
"""

from __future__ import annotations

from ...device import DeviceInfo
from ..configs import TileConfig
from ..problem import GemmProblem
from .tiles import tiles_of

FP8_BLOCK_K = 128
#: (block_m, block_n, warps, stages, epilogue_subtile) by the shape's tiles (see above).
FP8_NARROW_TILE = (64, 128, 4, 6, False)
FP8_MID_TILE = (128, 128, 8, 6, False)
FP8_WIDE_TILE = (128, 256, 8, 4, True)


def fp8_choice(problem: GemmProblem, device: DeviceInfo) -> tuple[TileConfig, str]:
    """The fp8 tile for ``problem`` on a GPU, and why."""
    mid = tiles_of(problem, 128, 128)
    wide = tiles_of(problem, 128, 256)
    if problem.m <= 64 or 2 * mid <= device.sm_count:
        tile, why = FP8_NARROW_TILE, f"M = {problem.m}, {mid} tiles of 128x128"
    elif 4 * wide < 3 * device.sm_count:
        tile, why = FP8_MID_TILE, f"{wide} tiles of 128x256 fill under 3/4 of the SMs"
    else:
        tile, why = FP8_WIDE_TILE, f"{wide} tiles of 128x256"
    bm, bn, warps, stages, subtile = tile
    ws = device.capability == (9, 0)
    cfg = TileConfig(
        bm,
        bn,
        FP8_BLOCK_K,
        8,
        warps,
        stages,
        kernel="gluon_ws" if ws else "pointer",
        epilogue_subtile=subtile and ws,
    )
    where = "the warp-specialized kernel" if ws else "the pointer kernel"
    return cfg, f"fp8: {bm}x{bn} tiles, a K step of {FP8_BLOCK_K} bytes, on {where} ({why})"


__all__ = ["FP8_BLOCK_K", "FP8_MID_TILE", "FP8_NARROW_TILE", "FP8_WIDE_TILE", "fp8_choice"]
