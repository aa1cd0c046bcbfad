"""Unaligned operands: element-wise loads on a small problem, or aligned copies.

When a leading dimension is not a multiple of 16 bytes the pointer kernel
loads element by element (no vectors, no ``cp.async``).  Two answers, each a
pure function of ``(GemmProblem, DeviceInfo)`` like ``heuristics``:
``elementwise_tile`` (the tile for such loads on a small problem) and
``padding_estimate`` (whether copying into aligned workspaces pays;
``plan.Alignment`` decides with it, ``launch/aligned.py`` runs it).  See
docs/unaligned.md.
"""

from __future__ import annotations

from typing import NamedTuple

from ..device import DeviceInfo
from .configs import TileConfig
from .heuristics import Tile, pow2_at_least, split_k_config, tiles_of
from .problem import GemmProblem

# Restoring alignment: when a leading dimension is not a multiple
# of 16 bytes, copying the operand into a padded workspace and running the
# aligned kernel can beat running on the user's strides.  The rates are H100
# fp16/bf16 measurements (benchmarks/results/h100/), used for every device:
# what matters is their ratio to the copy bandwidth, about the same on an A100.
#: Device-to-device copy, bytes read + written per second: the 1 GiB copy_
#: ceiling, 3000 GB/s (results/h100/hierarchy.csv, "ceiling" rows).
COPY_BANDWIDTH = 3.0e12
#: Fixed cost of each copy launch (``kernels/pad_copy.py``: A and B in one
#: launch, C out in another).  Measured on the H100 (bf16): about
#: 2 us of GPU time per launch beyond its bandwidth (1023^3: A and B in 4.0 us),
#: and 20-30 us of host time per padded call over the unpadded one, which a
#: busy GPU hides and an idle one does not; 6 us a launch counts part of it.
#: (The first path, a torch.empty + copy_ per operand, cost ~19 us a copy.)
COPY_OVERHEAD_S = 6e-6
#: The TMA kernel on aligned operands: 703-761 TFLOP/s at 4096^3-8192^3 fp16
#: (the H100 square and hierarchy suites), but 622 on 4096x4097x4096 NT with C
#: in a workspace (an unaligned-suite run where padding only C lost 2% to the
#: pointer kernel's 567); 650 keeps such C-only copies out.
TMA_RATE = 650e12
#: The pointer kernel on aligned operands (16-byte vectors, cp.async): 585-656
#: TFLOP/s at 2048^3-8192^3 fp16 (results/h100/stages.csv, hierarchy.csv).
POINTER_ALIGNED_RATE = 590e12
#: The pointer kernel by the widest load its strides allow (bytes).  2: the
#: element-wise loads as measured before any copy path existed, 16-90 TFLOP/s
#: (NT with odd K 0.12x, 4097^3 0.24x, 3001x5003x1009 0.73x of cuBLAS's
#: 114-139): the highest is taken, so a copy must pay even against the best
#: unaligned run.  4 and 8 are estimates
#: (loads scale with vector width up to the aligned rate), still to be
#: measured by `python -m benchmarks run --suite unaligned`.
POINTER_RATE_BY_VECTOR = {2: 90e12, 4: 180e12, 8: 360e12, 16: POINTER_ALIGNED_RATE}


# Operands loaded element by element (a 2-byte dtype on an odd leading
# dimension: no vector loads, no cp.async, so no pipeline) when the problem is
# too small to repay a copy.  Each K step then costs a full round trip to
# memory, so what pays is many small programs with a long K step (many
# independent loads in flight per step), not large tiles.  Measured on the
# H100, bf16 NN, against cuBLAS in the same run (results/h100/sweeps/
# unaligned_small_sweep.json, 84 pointer configs): 32x32 tiles with a K step
# of 256 ran 255^3 in 8.2 us (cuBLAS 10.9), 257^3 9.5 (12.3), 511^3 12.8 (16.5), and
# with a K step of 128 513^3 17.5 (18.9); the 64x128x64 tile the general rule
# picks took 27-43 us there.  From about 1000^3 (1024 tiles of 32x32) larger
# tiles win again (64x64: 39 us at 1023^3) and copying to aligned workspaces
# (the padded path) wins outright, so the rule stops at 4 waves of tiles.
ELEMENTWISE_TILE = Tile(32, 32, 256, 4, 3)
ELEMENTWISE_MAX_WAVES = 4
# Within one wave of 32x32 tiles, a K longer than one step of 256 leaves
# SMs idle and walks a nearly empty second step (K = 257): 32x16 tiles with a
# K step of 128 fill more SMs with shorter steps.  Measured on the H100 at
# 257^3 NN (results/h100/sweeps/unaligned_small_257.json, 40 pointer configs a
# dtype, same run): fp16 8.4 us (cuBLAS 9.2; 32x32x256 9.5-9.9, split-K into 128-deep
# slices 8.8-9.0), bf16 8.0 (cuBLAS 12.2).  From two waves of 32x32 tiles
# (511^3, 513^3) the rule's own tile wins (unaligned_small_sweep.json).
ELEMENTWISE_NARROW_TILE = Tile(32, 16, 128, 4, 2)


def elementwise_tile(problem: GemmProblem, device: DeviceInfo) -> TileConfig | None:
    """The tile for element-wise loads on a small problem (at most a few waves of 32x32 tiles), else None."""
    tile = ELEMENTWISE_TILE
    tiles = tiles_of(problem, tile.block_m, tile.block_n)
    if tiles > ELEMENTWISE_MAX_WAVES * device.sm_count:
        return None
    if tiles <= device.sm_count and tile.block_k < problem.k <= 512:
        return ELEMENTWISE_NARROW_TILE.config()
    block_k = min(tile.block_k if problem.k <= 512 else 128, pow2_at_least(problem.k, 16, tile.block_k))
    return split_k_config(tile._replace(block_k=block_k), problem, device)


class PaddingEstimate(NamedTuple):
    """What copying into aligned workspaces costs and saves, in microseconds."""

    copy_us: float
    saved_us: float

    @property
    def pays(self) -> bool:
        return self.saved_us > self.copy_us

    def words(self) -> str:
        return f"copies ~{self.copy_us:.1f} us, the aligned kernel saves ~{self.saved_us:.1f} us"


def padding_estimate(
    problem: GemmProblem, copied_elems: int, copies: int, vector_bytes: int, padded_tma: bool
) -> PaddingEstimate:
    """Cost and gain of running ``problem`` on aligned copies rather than on the operands' own strides.

    ``copied_elems`` elements are each read and written once, in ``copies``
    launches; ``vector_bytes`` is the widest load the unaligned pointer kernel
    could use (``eligibility.vector_bytes``), ``padded_tma`` whether the aligned
    run is the TMA kernel.  Both runs are at least as slow as moving the
    GEMM's own operands once (a skinny problem is bound by memory either way,
    so a copy of its big operand never pays).
    """
    flops = 2 * problem.batch * problem.m * problem.n * problem.k
    traffic = problem.batch * (problem.m * problem.k + problem.k * problem.n + problem.m * problem.n)
    floor = traffic * problem.elem_size / COPY_BANDWIDTH
    slow_rate = POINTER_RATE_BY_VECTOR.get(min(vector_bytes, 16), POINTER_RATE_BY_VECTOR[2])
    fast_rate = TMA_RATE if padded_tma else POINTER_ALIGNED_RATE
    saved = max(flops / slow_rate, floor) - max(flops / fast_rate, floor)
    copy = copies * COPY_OVERHEAD_S + 2 * copied_elems * problem.elem_size / COPY_BANDWIDTH
    return PaddingEstimate(copy * 1e6, saved * 1e6)


__all__ = ["ELEMENTWISE_MAX_WAVES", "PaddingEstimate", "elementwise_tile", "padding_estimate"]
