"""The heuristic's decision: which rule a problem's shape class meets first, and why (``explain()``)."""

from __future__ import annotations

from dataclasses import replace
from typing import NamedTuple

from ...device import DeviceInfo
from ..configs import TileConfig, split_width
from ..problem import GemmProblem, wave_efficiency
from .few_rows import choose_gemv_tile, choose_skinny_tile, is_gemv, is_skinny, prompt_config
from .fp8 import fp8_choice
from .tiles import (
    LONG_K_FEW_TILES,
    LONG_K_FEW_TILES_MAX,
    LONG_K_WS_MIN_TILES,
    SMALL_MAX_K,
    choose_cta_tile,
    choose_long_k_tile,
    choose_num_stages,
    choose_split_k,
    fit_shared_memory,
    is_long_k,
    pow2_at_least,
    small_problem_tile,
    split_k_config,
    tiles_of,
)
from .waves import (
    NARROW_ROW_TILES,
    SHORT_ROW_GROUP_M,
    SHORT_ROW_TILES,
    TMA_STREAM_K_TILE,
    WS_DEEP_TILE,
    narrow_row_order,
    prefers_stream_k,
    prefers_tma_stream_k,
    split_tail_tile,
    split_width_tile,
    stream_k_config,
    warp_specialized_fits,
    warp_specialized_tile,
    wide_tile_config,
)


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
    if problem.elem_size == 1:
        return fp8_choice(problem, device)
    if is_gemv(problem):
        g = choose_gemv_tile(problem)
        split = choose_split_k(problem, device, 1, g.block_n, g.block_k)
        cfg = TileConfig(
            16, g.block_n, g.block_k, 8, g.warps, 1, kernel="gemv", split_k=split, split_k_inline=split > 1
        )
        return cfg, "one row of A (M = 1): GEMV kernel, CUDA-core dot products streaming B"
    prompt = prompt_config(problem, device)
    if prompt is not None:
        return prompt, (
            f"prompt-time rows (M = {problem.m}): {prompt.block_m}x{prompt.block_n} tiles, a K step of "
            f"{prompt.block_k}" + (f", {prompt.split_k} K slices" if prompt.split_k > 1 else ", no split")
        )
    if is_skinny(problem, device):
        tile = choose_skinny_tile(problem)
        cfg = split_k_config(tile, problem, device)
        cfg = replace(cfg, num_stages=choose_num_stages(cfg, problem, device, tile.stages))
        return cfg, f"skinny (M = {problem.m}): narrow tiles with a long K step, split-K to fill the SMs"
    if problem.elem_size <= 4 and is_long_k(problem, device):
        tiles = tiles_of(problem, 128, 128)
        if problem.elem_size == 2 and tiles <= LONG_K_FEW_TILES_MAX:
            return (
                split_k_config(LONG_K_FEW_TILES, problem, device),
                f"long K over {tiles} tiles of 128x128: 64x64 tiles, a K step of 128, split-K",
            )
        if (
            problem.layout[1] == "T"
            and tiles >= LONG_K_WS_MIN_TILES
            and warp_specialized_fits(problem, device)
        ):
            ws = WS_DEEP_TILE._replace(stages=4)  # (the sweep's best ring here; 6 was within 1%)
            return ws.config(kernel="gluon_ws", stream_k=True), (
                "long K over few tiles, B column-major: the warp-specialized kernel with each tile's K in "
                "chunks over the SMs (Stream-K)"
            )
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
        return wide.config(kernel="gluon_ws"), (
            f"{wide.block_m}x{wide.block_n} tiles fill the SMs better ({wide_score:.2f} against the menu's "
            f"{score:.2f}): the warp-specialized kernel, two accumulators of {first} + "
            f"{rest} columns"
        )
    tail = split_tail_tile(problem, device, score)
    if tail is not None:
        return tail[0].config(kernel="gluon_ws", stream_k=True), (
            f"{rule}; the warp-specialized 128x128 tile with its last wave split into K-chunks scores "
            f"{tail[1]:.2f}: whole waves, then each remaining tile in equal chunks, one per SM"
        )
    ws = warp_specialized_tile(problem, device)
    if ws is not None:
        return ws.config(kernel="gluon_ws"), (
            f"short K ({problem.k}) over many tiles on sm_90: the warp-specialized persistent kernel "
            f"({ws.block_m}x{ws.block_n}, {ws.warps} warps), whose TMA producer and overlapped epilogue "
            "hide what a short K loop cannot"
        )
    if prefers_stream_k(problem, device, score):
        return stream_k_config(device), "one wave of 128x128 tiles plus a sliver: Stream-K"
    tma = tile.tma_kernel and device.capability >= (9, 0)
    if tma and (tile.block_m, tile.block_n) == (128, 256) and prefers_tma_stream_k(problem, device):
        return (
            TMA_STREAM_K_TILE.config(kernel="tma_persistent", stream_k=True),
            "two or more waves of 128x256 tiles, the last nearly empty: Stream-K on the TMA kernel",
        )
    if tma and (tile.block_m, tile.block_n) == (128, 128) and warp_specialized_fits(problem, device):
        return WS_DEEP_TILE.config(kernel="gluon_ws"), (
            rule + "; 128x128 tiles on the warp-specialized kernel, one consumer warpgroup, a 6-deep ring "
            "(sm_90: at or above the TMA kernel's 6 stages on every shape swept)"
        )
    wide = wide_tile_config(problem, device) if tma and (tile.block_m, tile.block_n) == (128, 256) else None
    if wide is not None:
        return wide[0], f"{rule}; {wide[1]}"
    # Persistent even for a single wave: measured on the H100, the data-parallel
    # TMA grid loses up to 40% with a transposed A at 2048^3 (sweeps/sweep_layouts.csv).
    cfg = tile.config(kernel="tma_persistent" if tma else "pointer")
    if cfg.smem_bytes(problem.elem_size) > device.smem_per_block:  # smaller GPUs (e.g. 100 KiB on sm_86)
        cfg = replace(cfg, kernel="pointer")
        cfg = replace(cfg, num_stages=choose_num_stages(cfg, problem, device))
        rule += "; pointer kernel, stages cut to fit shared memory"
    elif tma:
        rule += "; TMA persistent kernel (sm_90)"
    return cfg, rule
