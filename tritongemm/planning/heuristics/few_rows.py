"""Problems with few rows of A: one row (GEMV), prompt-time rows (17-128), and the skinny tiles up to 128."""

from __future__ import annotations

from typing import NamedTuple

from ...device import DeviceInfo
from ..configs import TileConfig
from ..problem import GemmProblem
from .tiles import (
    SMALL_MAX_K,
    SMALL_TILE,
    Tile,
    choose_split_k,
    fit_shared_memory,
    pow2_at_least,
    small_problem_tile,
    split_k_config,
    tiles_of,
)


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
# Llama-3 8B/70B projections (``python -m benchmarks.sweep_skinny``; its CSV
# was not kept, docs/heuristics.md lists the committed evidence): geomean 1.03x
# cuBLAS at M=1 against 0.87x for the old 16x128x64 tiles (sweeps/sweep_decode.csv).
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


# Prompt-time rows (17-128 of one 2-byte matrix; from 65 rows only where the
# skinny rule applies): sweeps/sweep_prompt.csv (H100, fp16 NT, M = 32 and 64
# over ten N x K of the small Llama's and GPT-2's projections) and
# sweeps/sweep_prompt_more_rows.csv (M = 8, 16, 96, 128, the same shapes).
# Tiles 32 columns wide, a K step of 128, 4 stages beat the skinny menu's
# 64-wide split-K tiles at every shape: more programs each streaming a
# narrower slab of B.  With K <= SMALL_MAX_K unsplit (64x512x512: 1.00x cuBLAS
# against 0.77; 64x1408x512 1.02 against 0.73), 64 rows of them in 64x64 tiles
# beyond one wave as the small-problem rule does (128x3072x768: 1.09, 64x32:
# 1.02, the skinny rule 0.75); with a longer K split as the skinny rule splits
# (64x1024x4096, 4 slices: 1.03 against 0.86); up to 64 rows where 32-wide
# tiles already fill the SMs, unsplit with a K step of 256 (64x4096x4096: 1.00
# against 0.90) -- unless the skinny menu's 64-wide tiles fill the SMs, where
# they stay: 64 rows filling half of them (64x14336x4096: 0.97 against 0.88),
# 32 rows over 1.5 waves (32x28672x4096: 0.98-1.01 against 0.94-0.98; at 128
# tiles, 32x8192x8192, the narrow tiles win, 0.95-0.97 against 0.86-0.90).
# Checked on 17 shapes up to 57344x8192, M = 24-128, bf16 and fp16, GPU time
# interleaved with cuBLAS (sweeps/prompt_rows_check.json, every config this
# rule picks timed there): geomean 0.953 of cuBLAS against 0.723 without the
# rule, no shape over 3% slower.
PROMPT_ROWS = (17, 128)


def prompt_config(problem: GemmProblem, device: DeviceInfo) -> TileConfig | None:
    """The narrow-tile config for 17-128 rows of one 2-byte matrix, else None (batches were not swept)."""
    if problem.elem_size != 2 or problem.batch != 1 or not PROMPT_ROWS[0] <= problem.m <= PROMPT_ROWS[1]:
        return None
    if problem.m > 64 and not is_skinny(problem, device):
        return None
    bm = pow2_at_least(problem.m, 32, 64)
    if problem.k <= SMALL_MAX_K and bm == 64:  # the small-problem rule's 64x32 tiles, 64x64 beyond a wave
        return small_problem_tile(problem, device).config()
    narrow = SMALL_TILE._replace(block_m=bm)  # 32 columns, a K step of 128, 4 stages
    if problem.k <= SMALL_MAX_K:
        return narrow.config()
    split = choose_split_k(problem, device, bm, narrow.block_n, narrow.block_k)
    if split > 1:
        return split_k_config(narrow, problem, device)
    if problem.m > 64:
        return None
    # where the skinny menu's 64-wide tiles already fill the SMs: half of them for 64 rows, 1.5 waves for 32
    wide_tiles = tiles_of(problem, bm, 64)
    if 2 * wide_tiles > device.sm_count * (1 if bm == 64 else 3):
        return None
    return fit_shared_memory(narrow._replace(block_k=256).config(), problem, device)
