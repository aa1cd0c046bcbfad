"""Choose a config for a problem and launch the kernel.

Data flows one way: ``api`` validates and normalizes (shapes, broadcasting,
stride views) and calls ``gemm`` here with operands of one batch shape; this
module picks the config (explicit > heuristic), collapses batch dimensions
into what the kernel indexes, and launches.
"""

from __future__ import annotations

import itertools
import math
import os
from dataclasses import dataclass, replace

import torch
import triton

from .configs import DECOMPOSITIONS, MAX_SPLIT_K, ConfigError, GemmProblem, TileConfig, wave_efficiency
from .device import DeviceInfo, device_info, interpreter_enabled
from .kernels import (
    gemm_kernel,
    gemm_tma_kernel,
    gemv_kernel,
    splitk_reduce_kernel,
    streamk_kernel,
)

SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
_DTYPE_NAMES = {
    torch.float16: "float16",
    torch.bfloat16: "bfloat16",
    torch.float32: "float32",
    torch.float64: "float64",
}
_INT32_MAX = 2**31 - 1


class UnsupportedInputError(RuntimeError):
    """Inputs tritongemm cannot run (dtype, device); ``patch()`` falls back to torch on these."""


# ----------------------------------------------------------------------------------
# What we can run
# ----------------------------------------------------------------------------------
def unsupported_reason(*tensors: torch.Tensor) -> str | None:
    """Why tritongemm cannot run these operands, or None when it can."""
    for t in tensors:
        if not isinstance(t, torch.Tensor):
            return f"non-tensor argument of type {type(t).__name__}"
    for t in tensors:
        if t.dtype not in SUPPORTED_DTYPES:
            return f"unsupported dtype {t.dtype}"
        if t.is_complex() or t.layout != torch.strided:
            return f"unsupported tensor layout {t.layout}"
    if len({t.dtype for t in tensors}) > 1:
        return "mixed dtypes " + ", ".join(str(t.dtype) for t in tensors)
    if len({t.device for t in tensors}) > 1:
        return "tensors on different devices " + ", ".join(str(t.device) for t in tensors)
    return device_unsupported_reason(tensors[0].device)


def device_unsupported_reason(device: torch.device) -> str | None:
    """Why tritongemm cannot run on ``device`` (None when it can)."""
    if device.type == "cuda":
        if interpreter_enabled():
            return "CUDA tensor while Triton runs on its CPU interpreter (TRITON_INTERPRET=1)"
        return None
    if device.type == "cpu":
        if interpreter_enabled():
            return None
        return "CPU tensor without Triton's interpreter (set TRITON_INTERPRET=1 before importing tritongemm)"
    return f"unsupported device type {device.type!r}"


def dtype_name(dtype: torch.dtype) -> str:
    return _DTYPE_NAMES.get(dtype, str(dtype).replace("torch.", ""))


# ----------------------------------------------------------------------------------
# Heuristic chooser: small named functions, one knob each
# ----------------------------------------------------------------------------------
def _pow2_at_least(x: int, lo: int, hi: int) -> int:
    return min(max(1 << max(x - 1, 0).bit_length(), lo), hi)


# CTA tiles the heuristic picks from on a GPU, per element size, with the
# throughput of one such tile relative to the largest (measured on an H100,
# fp16, benchmarks/results/h100/sweeps/sweep_*.csv): bigger tiles reuse each loaded
# byte more, smaller ones fill more SMs.  (block_m, block_n, block_k, warps, stages, speed, tma)
_TILE_MENU = {
    2: [
        (128, 256, 64, 8, 3, 1.00, True),   # 48 KiB a stage: 3 stages + 64 KiB TMA store buffer
        (128, 128, 64, 8, 4, 0.90, True),
        (64, 128, 64, 4, 4, 0.75, False),
        (128, 64, 64, 4, 4, 0.75, False),
        (64, 64, 64, 4, 4, 0.30, False),
    ],
    4: [
        (128, 128, 32, 8, 3, 1.00, False),
        (64, 128, 32, 4, 4, 0.75, False),
        (64, 64, 32, 4, 4, 0.45, False),
    ],
    8: [(64, 64, 16, 4, 2, 1.00, False)],  # fp64 dot runs on CUDA cores
}


def choose_cta_tile(problem: GemmProblem, device: DeviceInfo):
    """The menu tile with the best (wave efficiency x per-tile speed)."""
    best, best_score = None, -1.0
    for entry in _TILE_MENU[problem.elem_size]:
        bm, bn = entry[0], entry[1]
        tiles = problem.batch * -(-problem.m // bm) * -(-problem.n // bn)
        score = wave_efficiency(tiles, device.sm_count) * entry[5]
        if score > best_score + 1e-9:
            best, best_score = entry, score
    return best


# Skinny problems (few rows of A: decode-time linears) are bound by reading B
# once.  What matters is bytes in flight per SM, so the tiles are narrow in M
# and N and long in K (a K step of 128-256 elements is a 256-512 byte run of
# each B row).  Measured on the H100, fp16, M in {1, 32, 64, 128} over the
# Llama-3 8B/70B projections (benchmarks/results/h100/sweeps/sweep_skinny.csv):
# geomean 1.03x cuBLAS at M=1 against 0.87x for the old 16x128x64 tiles.
# (rows up to, block_m, block_n, K step in bytes, warps, most stages)
_SKINNY_MENU = [
    (16, 16, 64, 512, 4, 3),
    (32, 32, 64, 256, 4, 3),
    (64, 64, 64, 256, 4, 4),
    (128, 64, 128, 256, 4, 4),
]


def is_skinny(problem: GemmProblem, device: DeviceInfo) -> bool:
    """Few enough rows that the skinny tiles beat the large ones.

    Up to 64 rows always; up to 128 while 128-row tiles would fill fewer
    than half the SMs (beyond that the large-tile kernel wins, measured).
    """
    if problem.elem_size > 4:
        return False
    if problem.m <= 64:
        return True
    large_tiles = problem.batch * -(-problem.m // 128) * -(-problem.n // 128)
    return problem.m <= 128 and problem.elem_size == 2 and 2 * large_tiles < device.sm_count


def is_long_k(problem: GemmProblem, device: DeviceInfo) -> bool:
    """K much longer than M and N, and too few 128 x 128 tiles to fill half the SMs."""
    tiles = problem.batch * -(-problem.m // 128) * -(-problem.n // 128)
    return problem.k >= 8 * max(problem.m, problem.n) and 2 * tiles <= device.sm_count


def choose_long_k_tile(problem: GemmProblem) -> tuple:
    """The menu's 128 x 128 tile: with split-K filling the SMs, the larger tile's
    operand reuse wins (measured on the H100: 1024x1024x32768 0.92x cuBLAS in
    128x128 tiles split 2, against 0.67x in 64x128 tiles unsplit)."""
    return next(e for e in _TILE_MENU[problem.elem_size] if e[:2] == (128, 128))


def choose_gemv_tile(problem: GemmProblem) -> tuple[int, int, int]:
    """(block_n, block_k, warps) for the GEMV kernel (M = 1).

    Measured on the H100, fp16, over the Llama-3 8B/70B projections
    (sweeps/sweep_gemv.csv, sweeps/sweep_gemv_narrow.csv): 8 outputs per
    program, a K step of 2 KiB of each B row, 8 warps: geomean 1.07x cuBLAS,
    against 1.06x for 16 outputs x 1 KiB and 1.03x for the skinny tl.dot
    tiles.  Many narrow programs, not deep pipelines, keep the loads in
    flight: the loop has no tl.dot for Triton to pipeline.
    """
    bn = 8
    bk = min(2048 // problem.elem_size, _pow2_at_least(problem.k, 16, 2048))
    warps = min(8, bk * bn // 32)  # a short K (bk < 32) has work for fewer warps: each thread needs one output
    return bn, bk, warps


def choose_skinny_tile(problem: GemmProblem) -> tuple[int, int, int, int, int]:
    """(block_m, block_n, block_k, warps, most stages) for a skinny problem."""
    entry = next((e for e in _SKINNY_MENU if problem.m <= e[0]), _SKINNY_MENU[-1])
    _, bm, bn, k_bytes, warps, stages = entry
    bn = min(bn, _pow2_at_least(problem.n, 16, bn))
    bk = min(k_bytes // problem.elem_size, _pow2_at_least(problem.k, 16, 256))
    return bm, bn, bk, warps, stages


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
    tiles = problem.batch * -(-problem.m // block_m) * -(-problem.n // block_n)
    k_tiles = -(-problem.k // block_k)
    if 2 * tiles > device.sm_count:
        return 1
    return max(1, min(device.sm_count // tiles, k_tiles // 2, MAX_SPLIT_K))


#: Stream-K's hybrid schedule streams the last partial wave of tiles plus this
#: many full waves before it (CUTLASS's "DP + SK": 0 streams only the sliver,
#: 1 gives every program one to two tiles' worth of streamed work).
STREAM_K_EXTRA_WAVES = 1


def stream_k_schedule(tiles: int, k_tiles: int, sm_count: int) -> tuple[int, int, int]:
    """(programs, dp_tiles, iters_per_program) for Stream-K.

    One program per SM (all resident at once: a finisher may wait for its
    contributors).  Whole waves run data-parallel; the rest of the tiles'
    K-steps are cut into equal contiguous shares.
    """
    programs = max(1, min(sm_count, tiles * k_tiles))
    full_waves = tiles // programs
    dp_waves = max(full_waves - STREAM_K_EXTRA_WAVES, 0) if tiles % programs else full_waves
    dp_tiles = dp_waves * programs
    iters_per_program = max(1, triton.cdiv((tiles - dp_tiles) * k_tiles, programs))
    return programs, dp_tiles, iters_per_program


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


# Stream-K's tile and its efficiency against a full wave of the same tile's
# sliced-K schedule: 896x2432x4096 (133 tiles on 132 SMs) ran in 37.4 us where
# the ideal 133/132 of one wave is 23.4 us (H100, fp16, CUDA-graph timing;
# results/h100/sweeps/sweep_wave.csv): 0.63, the cost of restarting the
# pipeline per segment and of the fix-up.  Below about 32 K-steps a program
# that cost dominates (1024^3: 8 K-steps each, 1.7x slower than sliced-K).
_STREAM_K_TILE = (128, 128, 64, 8, 4)  # block_m, block_n, block_k, warps, stages
_STREAM_K_EFFICIENCY = 0.63
_STREAM_K_MIN_STEPS = 32
# Only for one wave of its tiles plus a sliver: below one wave the sliced-K
# tiles run faster than the wave-efficiency model says (Llama-3-70B QKV at
# M = 128, 80 tiles: TMA 128x128 0.91x cuBLAS, Stream-K 0.88x), and at two
# waves Stream-K measured slower (2048^3, 1.94 waves: 0.73x sliced-K).
_STREAM_K_MAX_WAVES = 1.25


def prefers_stream_k(problem: GemmProblem, device: DeviceInfo, sliced_score: float) -> bool:
    """Stream-K beats the best sliced-K tile (score = wave efficiency x tile speed)?

    Considered only for one wave of 128x128 tiles plus a sliver (up to
    ``_STREAM_K_MAX_WAVES``), where sliced-K runs a nearly empty second wave.
    """
    if problem.batch != 1 or problem.elem_size != 2:
        return False
    bm, bn, bk = _STREAM_K_TILE[:3]
    tiles = -(-problem.m // bm) * -(-problem.n // bn)
    if not device.sm_count < tiles <= _STREAM_K_MAX_WAVES * device.sm_count:
        return False
    steps_per_program = tiles * -(-problem.k // bk) / device.sm_count
    if steps_per_program < _STREAM_K_MIN_STEPS:
        return False
    speed = next(e[5] for e in _TILE_MENU[2] if e[:2] == (bm, bn))
    return speed * _STREAM_K_EFFICIENCY > sliced_score


# Stream-K on the TMA kernel's 128x256 tiles, for problems of at least two
# waves whose last wave is nearly empty.  Measured on the H100, fp16
# (results/h100/sweeps/sweep_tma_streamk.csv): 5120x5120x4096 (6.06 waves)
# 0.83 -> 0.92 of cuBLAS, 3072^3 (2.18 waves) 0.74 -> 0.84; no gain where the
# last wave is fuller (4096^3, 3.88 waves: 0.92 -> 0.82; 1024x10240x8192, 2.42: none).
_TMA_STREAM_K_TILE = (128, 256, 64, 8, 3)  # block_m, block_n, block_k, warps, stages
_TMA_STREAM_K_MAX_SLIVER = 0.25  # the last wave's fill, as a fraction of the SMs
_TMA_STREAM_K_MIN_IDLE = 0.08  # below this (many waves) streaming costs more than the idle SMs


def prefers_tma_stream_k(problem: GemmProblem, device: DeviceInfo) -> bool:
    """Stream-K on the Hopper TMA kernel: two or more waves of 128x256 tiles and a last one nearly empty."""
    if problem.batch != 1 or problem.elem_size != 2 or device.capability < (9, 0):
        return False
    bm, bn = _TMA_STREAM_K_TILE[:2]
    waves = -(-problem.m // bm) * -(-problem.n // bn) / device.sm_count
    sliver = waves - math.floor(waves)
    idle = (1 - sliver) / math.ceil(waves)  # the share of SM time sliced-K's last wave leaves idle
    return waves >= 2 and 0 < sliver <= _TMA_STREAM_K_MAX_SLIVER and idle >= _TMA_STREAM_K_MIN_IDLE


def _interpreter_config(problem: GemmProblem) -> TileConfig:
    # The interpreter runs one program at a time in numpy: small tiles keep
    # ragged-edge masks exercised, and speed does not matter.
    bm = _pow2_at_least(problem.m, 16, 64)
    bn = _pow2_at_least(problem.n, 16, 64)
    bk = min(32, _pow2_at_least(problem.k, 16, 32))
    return TileConfig(bm, bn, bk, 8, 4, 2)


def heuristic_config(problem: GemmProblem, device: DeviceInfo) -> TileConfig:
    """A good config without tuning: from the shape class and the device."""
    if device.interpreter:
        return _interpreter_config(problem)
    # The shape-class tiles were measured on an H100: on a GPU with less shared
    # memory a long K step is the part to give up.
    return _fit_shared_memory(_gpu_heuristic_config(problem, device), problem, device)


def _gpu_heuristic_config(problem: GemmProblem, device: DeviceInfo) -> TileConfig:
    hopper = device.capability >= (9, 0)
    if problem.m == 1 and problem.batch == 1 and problem.elem_size <= 4:
        bn, bk, warps = choose_gemv_tile(problem)
        split_k = choose_split_k(problem, device, 1, bn, bk)
        return TileConfig(16, bn, bk, 8, warps, 1, split_k=split_k, split_k_inline=split_k > 1, gemv=True)
    if is_skinny(problem, device):
        bm, bn, bk, warps, most_stages = choose_skinny_tile(problem)
        split_k = choose_split_k(problem, device, bm, bn, bk)
        cfg = TileConfig(bm, bn, bk, 8, warps, 3, split_k=split_k,
                         split_k_inline=choose_split_k_inline(problem, bm, bn, split_k))
        return replace(cfg, num_stages=choose_num_stages(cfg, problem, device, most_stages))
    if problem.elem_size <= 4 and is_long_k(problem, device):
        bm, bn, bk, warps, stages, _, _ = choose_long_k_tile(problem)
        split_k = choose_split_k(problem, device, bm, bn, bk)
        return TileConfig(bm, bn, bk, 8, warps, stages, split_k=split_k,
                          split_k_inline=choose_split_k_inline(problem, bm, bn, split_k))
    bm, bn, bk, warps, stages, speed, tma = choose_cta_tile(problem, device)
    tma = tma and hopper
    split_k = choose_split_k(problem, device, bm, bn, bk)
    if split_k > 1:  # long K over few tiles (e.g. 1024 x 1024 x 32768)
        return TileConfig(bm, bn, bk, 8, warps, stages, split_k=split_k,
                          split_k_inline=choose_split_k_inline(problem, bm, bn, split_k))
    tiles = problem.batch * -(-problem.m // bm) * -(-problem.n // bn)
    if prefers_stream_k(problem, device, wave_efficiency(tiles, device.sm_count) * speed):
        sbm, sbn, sbk, swarps, sstages = _STREAM_K_TILE
        return TileConfig(sbm, sbn, sbk, 8, swarps, sstages, stream_k=True)
    if tma and prefers_tma_stream_k(problem, device):
        sbm, sbn, sbk, swarps, sstages = _TMA_STREAM_K_TILE
        return TileConfig(sbm, sbn, sbk, 8, swarps, sstages, tma=True, persistent=True, stream_k=True)
    # Persistent even for a single wave: measured on the H100, the data-parallel
    # TMA grid loses up to 40% with a transposed A at 2048^3 (results/h100/sweeps/sweep_layouts.csv).
    cfg = TileConfig(bm, bn, bk, 8, warps, stages, tma=tma, persistent=tma)
    if cfg.smem_bytes(problem.elem_size) > device.smem_per_block:  # smaller GPUs (e.g. 100 KiB on sm_86)
        cfg = replace(cfg, tma=False, persistent=False)
        cfg = replace(cfg, num_stages=choose_num_stages(cfg, problem, device))
    return cfg


def _tuned_config(problem: GemmProblem, device: DeviceInfo) -> TileConfig | None:
    """The tuning cache's config for this problem (or, only when the user opted in
    with TRITONGEMM_AUTOTUNE=1, a freshly tuned one); never raises."""
    try:
        from .tuning import tuned_config
    except Exception:  # tuning package absent or broken: heuristics only
        return None
    try:
        return tuned_config(problem, device)
    except Exception:  # a broken cache must never break a matmul
        return None


def select_config(
    problem: GemmProblem,
    device: DeviceInfo,
    config: TileConfig | dict | None = None,
    pipeline: str | int | None = None,
    decomposition: str | None = None,
) -> TileConfig:
    """Explicit config (validated) > tuning cache > heuristic; then the pipeline and
    decomposition overrides."""
    return _select(problem, device, config, pipeline, decomposition)[0]


def _apply_decomposition(cfg: TileConfig, decomposition: str, problem: GemmProblem, device: DeviceInfo):
    """Force one way of sharing the K loop, keeping the tiles."""
    plain = dict(tma=False, persistent=False, warp_specialize=False, epilogue_subtile=False)
    if decomposition == "sliced_k":
        return replace(cfg, split_k=1, split_k_inline=False, stream_k=False)
    if decomposition == "split_k":
        if cfg.split_k > 1:
            return replace(cfg, stream_k=False)
        k_tiles = -(-problem.k // cfg.block_k)
        split = choose_split_k(problem, device, cfg.block_m, cfg.block_n, cfg.block_k)
        split = max(2, min(split, max(k_tiles, 1), MAX_SPLIT_K))
        inline = choose_split_k_inline(problem, cfg.block_m, cfg.block_n, split)
        return replace(cfg, **plain, stream_k=False, split_k=split, split_k_inline=inline)
    if decomposition == "stream_k":
        if cfg.gemv:  # Stream-K runs tl.dot tiles: take the skinny tile for this one-row problem
            bm, bn, bk, warps, stages = choose_skinny_tile(problem)
            cfg = TileConfig(bm, bn, bk, cfg.group_m, warps, stages)
        if cfg.tma:  # the TMA kernel streams on its persistent grid
            return replace(cfg, persistent=True, warp_specialize=False, split_k=1, split_k_inline=False,
                           stream_k=True)
        return replace(cfg, **plain, split_k=1, split_k_inline=False, stream_k=True, gemv=False)
    raise ConfigError(f"unknown decomposition {decomposition!r}; choose one of {list(DECOMPOSITIONS)}")


def _fit_shared_memory(cfg: TileConfig, problem: GemmProblem, device: DeviceInfo) -> TileConfig:
    """Halve block_k (not below 16) until the stages fit the device's shared memory."""
    while cfg.smem_bytes(problem.elem_size) > device.smem_per_block and cfg.block_k > 16:
        cfg = replace(cfg, block_k=cfg.block_k // 2)
    return cfg


def _select(problem, device, config, pipeline, decomposition=None) -> tuple[TileConfig, str]:
    source = "explicit config"
    if config is None:
        cfg = _tuned_config(problem, device)
        source = "tuning cache"
        if cfg is None:
            cfg, source = heuristic_config(problem, device), "heuristic"
    elif isinstance(config, TileConfig):
        cfg = config
    elif isinstance(config, dict):
        cfg = TileConfig.from_dict(config)
    else:
        raise TypeError(f"config must be a TileConfig or a dict, got {type(config).__name__}")
    if pipeline is not None:
        cfg = cfg.with_pipeline(pipeline)
        source += f", pipeline={pipeline!r}"
    if decomposition is not None:
        cfg = _apply_decomposition(cfg, decomposition, problem, device)
        source += f", decomposition={decomposition!r}"
    if config is None and (pipeline is not None or decomposition is not None):
        # The tiles were ours, not the caller's: keep the requested scheme within shared memory.
        cfg = _fit_shared_memory(cfg, problem, device)
    return cfg.validate(device, problem.elem_size, problem.acc_size), source


# ----------------------------------------------------------------------------------
# Kernel path: TMA (Hopper) or pointer
# ----------------------------------------------------------------------------------
def _tensor_descriptor_class():
    try:
        from triton.tools.tensor_descriptor import TensorDescriptor
    except ImportError:  # triton < 3.4: no host-side descriptors
        return None
    return TensorDescriptor


def _tma_operand_reason(name: str, t: torch.Tensor) -> str | None:
    if t.data_ptr() % 16:
        return f"{name}'s data pointer is not 16-byte aligned"
    rows, cols = t.stride(-2), t.stride(-1)
    if cols == 1 and t.shape[-1] > 0:
        lead = rows
    elif rows == 1:
        lead = cols
    else:
        return f"{name} has no unit stride (strides {tuple(t.stride())})"
    if (lead * t.element_size()) % 16:
        return f"{name}'s leading stride {lead} x {t.element_size()} B is not a multiple of 16 bytes"
    return None


def tma_unsupported_reason(a, b, out, device: DeviceInfo, batched: bool) -> str | None:
    """Why the TMA kernel cannot take these operands (None when it can)."""
    if not device.interpreter and device.capability < (9, 0):
        return f"TMA needs sm_90 or newer ({device.name} is sm_{device.capability[0]}{device.capability[1]})"
    if _tensor_descriptor_class() is None:
        return "this triton has no host-side TensorDescriptor"
    if a.dtype not in (torch.float16, torch.bfloat16):
        return f"the TMA kernel takes float16/bfloat16 ({a.dtype} uses the pointer kernel)"
    if out.dtype != a.dtype:
        return "out_dtype differs from the inputs' dtype"
    if batched:
        return "batched problems use the pointer kernel"
    for name, t in (("A", a), ("B", b)):
        reason = _tma_operand_reason(name, t)
        if reason:
            return reason
    if out.stride(-1) != 1:
        return "C is not row-major"
    return _tma_operand_reason("C", out)


@dataclass(frozen=True)
class Plan:
    """What a call will run: the config, where it came from, the kernel, and why."""

    config: TileConfig
    source: str
    kernel: str
    fallback: str | None = None
    problem: GemmProblem | None = None

    def describe(self) -> str:
        lines = [f"kernel : {self.kernel}" + (f" (fell back: {self.fallback})" if self.fallback else "")]
        lines.append(f"config : {self.config.short()}  [{self.source}]")
        if self.problem is not None:
            p = self.problem
            lines.insert(0, f"problem: {p.batch} x {p.m}x{p.n}x{p.k} {p.dtype} {p.layout}")
        return "\n".join(lines)


def plan(a, b, out, *, addend=None, config=None, pipeline=None, decomposition=None) -> Plan:
    device = device_info(a.device)
    problem = problem_of(a, b)
    cfg, source = _select(problem, device, config, pipeline, decomposition)
    kernel, fallback = "pointer", None
    batched = len(_collapse_batch(tuple(out.shape[:-2]), [a, b, out])) > 0
    if cfg.stream_k:
        if batched or problem.k == 0:
            # Stream-K streams one matrix's tiles; batches (and K=0) run sliced-K.
            fallback = "Stream-K takes one (unbatched) problem with K > 0"
            cfg = replace(cfg, stream_k=False)
        else:
            kernel = "stream_k"  # the TMA kernel's own Stream-K replaces this below when TMA applies
    if cfg.gemv:
        if problem.m == 1 and not batched:
            kernel = "gemv"
        else:
            fallback = "GEMV takes one unbatched row of A (M = 1)"
            cfg = replace(cfg, gemv=False)
    if cfg.tma:
        fallback = tma_unsupported_reason(a, b, out, device, batched)
        if fallback is None:
            kernel = cfg.kernel
        else:
            # Same tiles on the pointer kernel (Stream-K included); the TMA-only knobs do not apply.
            cfg = replace(cfg, tma=False, persistent=False, warp_specialize=False, epilogue_subtile=False)
    return Plan(cfg, source, kernel, fallback, problem)


# ----------------------------------------------------------------------------------
# Launch
# ----------------------------------------------------------------------------------
def _layout(a: torch.Tensor, b: torch.Tensor) -> str:
    """'N' for an operand whose rows are contiguous, 'T' for a transposed one."""
    la = "N" if a.stride(-1) == 1 else "T"
    lb = "N" if b.stride(-1) == 1 else "T"
    return la + lb


def problem_of(a: torch.Tensor, b: torch.Tensor) -> GemmProblem:
    batch = math.prod(a.shape[:-2]) if a.dim() > 2 else 1
    return GemmProblem(
        m=a.shape[-2], n=b.shape[-1], k=a.shape[-1], batch=batch,
        dtype=dtype_name(a.dtype), layout=_layout(a, b),
    )


def _collapse_batch(batch_shape, tensors):
    """Merge batch dims that every tensor can index with one stride.

    Returns (size, per-tensor strides) pairs with size-1 dims dropped.  Dims
    i, i+1 merge when for every tensor stride[i] == stride[i+1] * size[i+1]
    (always true for our own contiguous output and for broadcast stride-0 pairs).
    """
    nb = len(batch_shape)
    dims = [(batch_shape[i], [t.stride(i) for t in tensors]) for i in range(nb) if batch_shape[i] != 1]
    merged: list[tuple[int, list[int]]] = []
    for size, strides in dims:
        if merged:
            psize, pstrides = merged[-1]
            if all(ps == s * size for ps, s in zip(pstrides, strides)):
                merged[-1] = (psize * size, strides)
                continue
        merged.append((size, strides))
    return merged


def _max_offset(t: torch.Tensor) -> int:
    return sum((s - 1) * st for s, st in zip(t.shape, t.stride()) if s > 0)


def _dot_precision(dtype: torch.dtype) -> str:
    if dtype != torch.float32:
        return "ieee"
    return "tf32" if tf32_enabled() else "ieee"


def tf32_enabled() -> bool:
    """Does torch let float32 matmuls use TF32?  The same rule torch follows."""
    matmul = torch.backends.cuda.matmul
    precision = getattr(matmul, "fp32_precision", None)  # torch >= 2.9 API
    if precision == "tf32":
        return True
    if precision == "ieee":
        return False
    return bool(matmul.allow_tf32)


ACTIVATIONS = ("none", "relu", "gelu", "gelu_tanh", "silu")


def gemm(
    a: torch.Tensor,
    b: torch.Tensor,
    out: torch.Tensor,
    *,
    addend: torch.Tensor | None = None,
    alpha: float = 1.0,
    beta: float = 0.0,
    config: TileConfig | dict | None = None,
    pipeline: str | int | None = None,
    decomposition: str | None = None,
    activation: str = "none",
    residual: torch.Tensor | None = None,
    preact: torch.Tensor | None = None,
) -> torch.Tensor:
    """out = act(alpha * a @ b + beta * addend) + residual, written in place; returns ``out``.

    ``a`` is (*batch, M, K), ``b`` (*batch, K, N); ``out``, ``addend`` and
    ``residual`` are (*batch, M, N), all of one batch shape (broadcast
    operands arrive as stride-0 expanded views).  Any strides; nothing is
    copied.  ``preact`` (same shape and strides as ``out``), when given,
    receives the value before the activation (for backward).

    Everything but the data pointers is decided once per launch signature
    (shapes, strides, dtypes, alignment, config) and cached as a ``_Launcher``,
    so a repeated call costs a dictionary lookup plus the kernel launch.
    """
    if out.numel() == 0:
        return out
    if beta == 0:
        addend = None  # torch's rule: beta=0 ignores the addend, NaN and Inf included
    if activation not in ACTIVATIONS:
        raise ValueError(f"unknown activation {activation!r}; choose one of {list(ACTIVATIONS)}")
    if isinstance(config, dict):
        config = TileConfig.from_dict(config)
    key = _launch_key(a, b, out, addend, alpha, config, pipeline, decomposition, activation, residual, preact)
    launcher = _LAUNCHERS.get(key)
    if launcher is None:
        chosen = plan(a, b, out, addend=addend, config=config, pipeline=pipeline, decomposition=decomposition)
        launcher = _Launcher(chosen, a, b, out, addend, alpha, activation, residual, preact)
        if len(_LAUNCHERS) >= _MAX_LAUNCHERS:
            _LAUNCHERS.clear()
        _LAUNCHERS[key] = launcher
    launcher(a, b, out, addend, residual, preact, alpha, beta)
    return out


#: launch signature -> _Launcher.  Cleared by ``clear_plan_cache()`` (the tuner
#: calls it after writing new configs) and when it grows past _MAX_LAUNCHERS.
_LAUNCHERS: dict = {}
_MAX_LAUNCHERS = 4096


def clear_plan_cache() -> None:
    """Forget cached launch plans (after the tuning cache changed)."""
    _LAUNCHERS.clear()


def _launch_key(a, b, out, addend, alpha, config, pipeline, decomposition, activation, residual, preact):
    return (
        decomposition, activation,
        a.shape, a.stride(), b.stride(), b.shape[-1], out.shape, out.stride(), out.dtype, a.dtype, a.device,
        None if addend is None else (addend.stride(), addend.dtype),
        None if residual is None else (residual.stride(), residual.dtype),
        None if preact is None else (preact.stride(), preact.dtype),
        alpha != 1.0, config, pipeline, a.dtype == torch.float32 and tf32_enabled(),
        a.data_ptr() % 16 == 0, b.data_ptr() % 16 == 0, out.data_ptr() % 16 == 0,
    )


class _Launcher:
    """A planned launch with every argument fixed except the tensors and scalars.

    The epilogue's optional tensors (D = addend, R = residual, Z = pre-activation
    output) are passed as ``out`` when absent; the kernel never touches them then.
    """

    def __init__(self, chosen: Plan, a, b, out, addend, alpha, activation, residual, preact):
        self.plan = chosen
        cfg = chosen.config
        M, K = a.shape[-2:]
        N = b.shape[-1]
        self.device_ctx = a.device if a.device.type == "cuda" else None
        self._runners: dict = {}
        interpreting = interpreter_enabled()
        d = addend if addend is not None else out
        r = residual if residual is not None else out
        self.epilogue = dict(
            HAS_ALPHA=(alpha != 1.0), HAS_ADDEND=addend is not None, ACTIVATION=activation,
            HAS_RESIDUAL=residual is not None, STORE_PREACT=preact is not None,
        )
        self.mainloop = dict(
            BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, GROUP_M=cfg.group_m,
            DOT_PRECISION=_dot_precision(a.dtype),
            # Triton's interpreter multiplies bf16 bit patterns in tl.dot (triton-lang/triton#11584).
            UPCAST_OPERANDS=(interpreting and a.dtype == torch.bfloat16),
            num_warps=cfg.num_warps, num_stages=cfg.num_stages,
        )
        if chosen.kernel in ("tma", "tma_persistent"):
            self._init_tma(cfg, a, b, out, d, r, M, N, K)
        elif chosen.kernel == "stream_k":
            self._init_stream_k(cfg, a, b, out, d, r, M, N, K)
        elif chosen.kernel == "gemv":
            self._init_gemv(cfg, a, b, out, d, r, M, N, K)
        else:
            self._init_pointer(cfg, a, b, out, d, r, M, N, K)

    # -- sliced-K and split-K on the pointer kernel ----------------------------------
    def _init_pointer(self, cfg, a, b, out, d, r, M, N, K):
        self.kind = "pointer"
        tensors = [a, b, out, d, r]
        dims = _collapse_batch(tuple(out.shape[:-2]), tensors)
        # The kernel indexes one batch dimension; any further (rare: a broadcast
        # dim between two non-broadcast ones) are looped over here, as views.
        self.outer = dims[:-1]
        batch, bstrides = dims[-1] if dims else (1, [0] * len(tensors))
        index_64 = any(_max_offset(t) > _INT32_MAX for t in tensors)
        tiles = triton.cdiv(M, cfg.block_m) * triton.cdiv(N, cfg.block_n)
        if tiles * batch > _INT32_MAX:
            raise RuntimeError(f"gemm: {tiles * batch} programs exceed the grid limit of 2^31 - 1")
        self._init_split_k(cfg, a, batch, M, N, K)
        if self.splits > 1:
            index_64 = index_64 or self.splits * batch * M * N > _INT32_MAX
        self.grid = (batch * tiles, self.splits)
        self.ints = (
            M, N, K,
            bstrides[0], a.stride(-2), a.stride(-1),
            bstrides[1], b.stride(-2), b.stride(-1),
            bstrides[2], out.stride(-2), out.stride(-1),
            bstrides[3], d.stride(-2), d.stride(-1),
            bstrides[4], r.stride(-2), r.stride(-1),
        )
        self.constexprs = dict(
            self.mainloop, **self.epilogue,
            EVEN_K=(K % cfg.block_k == 0), INDEX_64=index_64, ACC_FP64=(a.dtype == torch.float64),
            SPLIT_K=self.splits > 1, REDUCE_INLINE=self.inline,
        )

    def _init_split_k(self, cfg: TileConfig, a, batch: int, M: int, N: int, K: int) -> None:
        """Split K into slices of whole K-tiles; no slice is empty."""
        k_tiles = max(triton.cdiv(K, cfg.block_k), 1)
        splits = min(cfg.split_k, k_tiles)
        self.k_per_split = triton.cdiv(k_tiles, splits) * cfg.block_k
        self.splits = triton.cdiv(K, self.k_per_split) if K > 0 else 1
        self.inline = False
        if self.splits <= 1:
            self.splits = 1
            return
        self.inline = cfg.split_k_inline
        self.ws_dtype = torch.float64 if a.dtype == torch.float64 else torch.float32
        self.ws_shape = (self.splits, batch, M, N)
        self.counters = batch * triton.cdiv(M, cfg.block_m) * triton.cdiv(N, cfg.block_n)
        block_m, block_n = 32, 64  # the reduction is memory-bound: small tiles, many programs
        self.reduce_grid = (batch * triton.cdiv(M, block_m) * triton.cdiv(N, block_n),)
        self.reduce_constexprs = dict(
            BLOCK_M=block_m, BLOCK_N=block_n, **self.epilogue, ACC_FP64=(a.dtype == torch.float64), num_warps=4,
        )

    def _pointer(self, a, b, out, d, r, z, alpha, beta):
        if self.splits == 1:
            self._launch(gemm_kernel, (a, b, out, d, r, z, out, out, *self.ints, alpha, beta, 0, 0))
            return
        # Split-K: slices write fp32 partials to a workspace (from torch's caching
        # allocator: no cudaMalloc per call, and graph-capture safe); they are
        # added in slice order by the last slice to arrive or by a second kernel.
        S, B, M, N = self.ws_shape
        ws = torch.empty(self.ws_shape, dtype=self.ws_dtype, device=a.device)
        counts = _arrival_counters(a.device, self.counters) if self.inline else ws
        self._launch(gemm_kernel, (a, b, out, d, r, z, ws, counts, *self.ints, alpha, beta, self.k_per_split,
                                   B * M * N))
        if not self.inline:
            self._launch(
                splitk_reduce_kernel,
                (ws, out, d, r, z, M, N, S, B * M * N, *self.ints[9:18], alpha, beta),
                slot="reduce",
            )

    # -- GEMV (M = 1) --------------------------------------------------------------------
    def _init_gemv(self, cfg, a, b, out, d, r, M, N, K):
        self.kind = "gemv"
        a2, b2, c2, d2, r2 = (t.reshape(t.shape[-2:]) for t in (a, b, out, d, r))  # one row, unbatched: views
        self._init_split_k(cfg, a, 1, M, N, K)
        self.grid = (triton.cdiv(N, cfg.block_n), self.splits)
        self.ints = (N, K, a2.stride(1), b2.stride(0), b2.stride(1), c2.stride(1), d2.stride(1), r2.stride(1))
        self.reduce_ints = (0, c2.stride(0), c2.stride(1), 0, d2.stride(0), d2.stride(1), 0, r2.stride(0), r2.stride(1))
        self.constexprs = dict(
            BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, EVEN_K=(K % cfg.block_k == 0), **self.epilogue,
            INDEX_64=any(_max_offset(t) > _INT32_MAX for t in (a, b, out, d, r)),
            ACC_FP64=(a.dtype == torch.float64), SPLIT_K=self.splits > 1, REDUCE_INLINE=self.inline,
            num_warps=cfg.num_warps, num_stages=cfg.num_stages,
        )

    def _gemv(self, a, b, out, d, r, z, alpha, beta):
        if self.splits == 1:
            self._launch(gemv_kernel, (a, b, out, d, r, z, out, out, *self.ints, alpha, beta, 0, 0))
            return
        N = self.ints[0]
        ws = torch.empty(self.ws_shape, dtype=self.ws_dtype, device=a.device)
        counts = _arrival_counters(a.device, self.counters) if self.inline else ws
        self._launch(gemv_kernel, (a, b, out, d, r, z, ws, counts, *self.ints, alpha, beta, self.k_per_split, N))
        if not self.inline:
            self._launch(splitk_reduce_kernel,
                         (ws, out, d, r, z, 1, N, self.splits, N, *self.reduce_ints, alpha, beta), slot="reduce")

    # -- Stream-K -----------------------------------------------------------------------
    def _init_stream_k(self, cfg, a, b, out, d, r, M, N, K):
        self.kind = "stream_k"
        a2, b2, c2, d2, r2 = (t.reshape(t.shape[-2:]) for t in (a, b, out, d, r))  # a batch of one: views
        tiles = triton.cdiv(M, cfg.block_m) * triton.cdiv(N, cfg.block_n)
        programs, dp_tiles, iters_per_program = self._plan_stream_k(cfg, a, tiles, K)
        self.grid = (programs,)
        self.ints = (M, N, K, a2.stride(0), a2.stride(1), b2.stride(0), b2.stride(1),
                     c2.stride(0), c2.stride(1), d2.stride(0), d2.stride(1), r2.stride(0), r2.stride(1))
        self.sk_ints = (dp_tiles, iters_per_program)
        self.constexprs = dict(self.mainloop, **self.epilogue, EVEN_K=(K % cfg.block_k == 0),
                               ACC_FP64=(a.dtype == torch.float64))

    def _plan_stream_k(self, cfg, a, tiles: int, K: int) -> tuple[int, int, int]:
        """Stream-K's schedule (both kernels), and the per-tile arrival counters
        and per-program partial slots it needs."""
        programs, dp_tiles, iters_per_program = stream_k_schedule(
            tiles, triton.cdiv(K, cfg.block_k), device_info(a.device).sm_count)
        self.counters = tiles - dp_tiles
        self.ws_shape = (programs, cfg.block_m, cfg.block_n)
        self.ws_dtype = torch.float64 if a.dtype == torch.float64 else torch.float32
        return programs, dp_tiles, iters_per_program

    def _stream_k_buffers(self, a) -> tuple[torch.Tensor, torch.Tensor]:
        """(workspace, counters) for one Stream-K launch.  Each program's slot is
        written before it is read in the same launch, so the workspace needs no
        zeroing (it comes from torch's caching allocator)."""
        ws = torch.empty(self.ws_shape, dtype=self.ws_dtype, device=a.device)
        return ws, _arrival_counters(a.device, self.counters)

    def _stream_k(self, a, b, out, d, r, z, alpha, beta):
        ws, counts = self._stream_k_buffers(a)
        self._launch(streamk_kernel, (a, b, out, d, r, z, ws, counts, *self.ints, alpha, beta, *self.sk_ints))

    # -- TMA (Hopper) --------------------------------------------------------------------
    def _init_tma(self, cfg, a, b, out, d, r, M, N, K):
        self.kind = "tma"
        a2, b2, c2, d2, r2 = (t.reshape(t.shape[-2:]) for t in (a, b, out, d, r))  # a batch of one: views
        # Descriptor templates: per call only the base tensor changes.
        self.a_desc, a_kmajor = _descriptor(a2, cfg.block_m, cfg.block_k)
        self.b_desc, b_kmajor = _descriptor(b2, cfg.block_k, cfg.block_n)
        c_cols = cfg.block_n // 2 if cfg.epilogue_subtile else cfg.block_n
        self.c_desc, _ = _descriptor(c2, cfg.block_m, c_cols)
        tiles = triton.cdiv(M, cfg.block_m) * triton.cdiv(N, cfg.block_n)
        programs = min(device_info(a.device).sm_count, tiles) if cfg.persistent else tiles
        dp_tiles, iters_per_program, self.counters = tiles, 0, 0
        if cfg.stream_k:
            programs, dp_tiles, iters_per_program = self._plan_stream_k(cfg, a, tiles, K)
        self.grid = (programs,)
        self.ints = (M, N, K, d2.stride(0), d2.stride(1), r2.stride(0), r2.stride(1), c2.stride(0), c2.stride(1))
        self.sk_ints = (programs, dp_tiles, iters_per_program)
        self.constexprs = dict(
            self.mainloop, **self.epilogue, A_KMAJOR=a_kmajor, B_KMAJOR=b_kmajor,
            FLATTEN=False, WARP_SPECIALIZE=cfg.warp_specialize, EPILOGUE_SUBTILE=cfg.epilogue_subtile,
            STREAM_K=cfg.stream_k,
        )
        self.constexprs["DOT_PRECISION"] = "ieee"  # TMA path: 16-bit types only

    # -- running -------------------------------------------------------------------------
    def __call__(self, a, b, out, addend, residual, preact, alpha, beta):
        if self.device_ctx is not None and self.device_ctx.index != torch.cuda.current_device():
            with torch.cuda.device(self.device_ctx):
                return self._run(a, b, out, addend, residual, preact, alpha, beta)
        return self._run(a, b, out, addend, residual, preact, alpha, beta)

    def _run(self, a, b, out, addend, residual, preact, alpha, beta):
        d = addend if addend is not None else out
        r = residual if residual is not None else out
        z = preact if preact is not None else out
        alpha, beta = float(alpha), float(beta)
        if self.kind == "tma":
            ws, counts = self._stream_k_buffers(a) if self.counters else (out, out)  # unread without STREAM_K
            args = (_rebase(self.a_desc, a), _rebase(self.b_desc, b), _rebase(self.c_desc, out), d, r, z, ws, counts,
                    *self.ints, alpha, beta, *self.sk_ints)
            self._launch(gemm_tma_kernel, args)
            return
        if self.kind == "stream_k":
            self._stream_k(a, b, out, d, r, z, alpha, beta)
            return
        if self.kind == "gemv":
            self._gemv(a, b, out, d, r, z, alpha, beta)
            return
        if not self.outer:
            self._pointer(a, b, out, d, r, z, alpha, beta)
            return
        tensors = [a, b, out, d, r, z]
        strides_of = [0, 1, 2, 3, 4, 2]  # z shares out's strides
        for outer_index in itertools.product(*[range(s) for s, _ in self.outer]):
            views = [
                t.as_strided(t.shape[-2:], t.stride()[-2:],
                             t.storage_offset() + sum(i * st[strides_of[j]] for i, (_, st) in
                                                      zip(outer_index, self.outer)))
                for j, t in enumerate(tensors)
            ]
            self._pointer(*views, alpha, beta)

    def _launch(self, kernel, args, slot: str = "main"):
        """Launch; after the first launch, call the compiled kernel directly.

        ``JITFunction.__getitem__(grid)(...)`` re-derives the specialization of
        every argument on each call (tens of microseconds for our ~30
        arguments).  The launch key already fixes everything the
        specialization depends on (shapes, strides, 16-byte alignment), so
        the compiled kernel from the first launch is the one Triton would pick.
        """
        runner = self._runners.get(slot)
        if runner is not None:
            runner[0](*args, *runner[1])
            return
        grid, constexprs = (self.reduce_grid, self.reduce_constexprs) if slot == "reduce" else (
            self.grid, self.constexprs)
        grid = tuple(grid) + (1,) * (3 - len(grid))  # CompiledKernel's runner reads grid[0..2]
        try:
            compiled = kernel[grid](*args, **constexprs)
        except Exception as exc:
            if interpreter_enabled() and "only 0-dimensional arrays can be converted" in str(exc):
                import numpy

                raise RuntimeError(
                    f"Triton {triton.__version__}'s interpreter cannot run with numpy {numpy.__version__}: it "
                    f"converts 1-element arrays to Python ints, which numpy 2.4 made an error. Install "
                    f"numpy<2.4 or a newer triton (3.9 works) to use TRITON_INTERPRET=1."
                ) from exc
            raise
        if _FAST_LAUNCH and hasattr(compiled, "run") and hasattr(compiled, "__getitem__"):
            names = kernel.arg_names[len(args):]
            if all(n in constexprs for n in names):
                self._runners[slot] = (compiled[grid], tuple(constexprs[n] for n in names))


#: Set TRITONGEMM_FAST_LAUNCH=0 to always launch through JITFunction (e.g. to
#: rule the direct launch out while debugging a Triton upgrade).
_FAST_LAUNCH = os.environ.get("TRITONGEMM_FAST_LAUNCH", "1") != "0"


#: (device, stream) -> int32 arrival counters for in-kernel split-K reduction.
#: All zero between launches: the reducing program re-arms its tile's counter.
#: One buffer per stream, since launches on one stream never overlap.
_COUNTERS: dict = {}


_RAW_STREAM = getattr(torch._C, "_cuda_getCurrentRawStream", None)  # what Triton's launcher itself calls


def _current_raw_stream(device: torch.device) -> int:
    """The current CUDA stream's handle: a microsecond less than building a ``torch.cuda.Stream``."""
    if _RAW_STREAM is not None and device.index is not None:
        return _RAW_STREAM(device.index)
    return torch.cuda.current_stream(device).cuda_stream


def _arrival_counters(device: torch.device, n: int) -> torch.Tensor:
    if device.type != "cuda":
        key = (device, None)
    else:
        if torch.cuda.is_current_stream_capturing():
            # Inside CUDA-graph capture: a buffer of the graph's own, zeroed by
            # a memset node at every replay; the shared buffers stay outside it.
            return torch.zeros(n, dtype=torch.int32, device=device)
        key = (device, _current_raw_stream(device))
    buf = _COUNTERS.get(key)
    if buf is None or buf.numel() < n:
        buf = torch.zeros(max(n, 1024), dtype=torch.int32, device=device)
        _COUNTERS[key] = buf
    return buf


def _rebase(template, t: torch.Tensor):
    """The descriptor ``template`` over tensor ``t`` (same shape, strides, alignment).

    Built by copying the template's fields: ``copy.copy`` of a dataclass, or
    re-running its validating constructor, costs microseconds per launch.
    """
    desc = object.__new__(type(template))
    desc.__dict__.update(template.__dict__)
    desc.base = t
    return desc


def _descriptor(t: torch.Tensor, rows_block: int, cols_block: int):
    """A descriptor of ``t`` (2-D) in the orientation whose last stride is 1.

    Returns (descriptor, k_major) where k_major says ``t`` was row-major.
    """
    TensorDescriptor = _tensor_descriptor_class()
    r, c = t.shape[-2:]
    if t.stride(-1) == 1:
        return TensorDescriptor(t, [r, c], [t.stride(-2), 1], [rows_block, cols_block]), True
    return TensorDescriptor(t, [c, r], [t.stride(-1), 1], [cols_block, rows_block]), False


def explain(a: torch.Tensor, b: torch.Tensor, *, config=None, pipeline=None, decomposition=None,
            out_dtype=None) -> Plan:
    """Which kernel and config ``matmul(a, b)`` would use on 2-D/3-D operands, and why.

    >>> print(tritongemm.explain(a, b).describe())
    """
    a2 = a if a.dim() >= 2 else a.unsqueeze(0)
    b2 = b if b.dim() >= 2 else b.unsqueeze(-1)
    batch = torch.broadcast_shapes(a2.shape[:-2], b2.shape[:-2])
    out = torch.empty((*batch, a2.shape[-2], b2.shape[-1]), dtype=out_dtype or a.dtype, device="meta")
    # a meta tensor has no data pointer; describe the output we would allocate
    out = _ContiguousLike(out)
    a_e = a2.expand((*batch, *a2.shape[-2:]))
    b_e = b2.expand((*batch, *b2.shape[-2:]))
    return plan(a_e, b_e, out, config=config, pipeline=pipeline, decomposition=decomposition)


class _ContiguousLike:
    """Stands in for an output tensor we would allocate (aligned, row-major)."""

    def __init__(self, meta: torch.Tensor):
        self._t = meta
        self.shape, self.dtype = meta.shape, meta.dtype

    def stride(self, dim=None):
        return self._t.stride() if dim is None else self._t.stride(dim)

    def data_ptr(self) -> int:
        return 0  # allocations are 256-byte aligned

    def element_size(self) -> int:
        return self._t.element_size()


__all__ = [
    "ConfigError",
    "UnsupportedInputError",
    "gemm",
    "heuristic_config",
    "select_config",
    "unsupported_reason",
    "problem_of",
    "plan",
    "Plan",
    "explain",
    "tma_unsupported_reason",
    "clear_plan_cache",
]
