"""The autotuner's search space: the tiling hierarchy pruned by the device's budgets."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

from ..device import DeviceInfo
from ..planning.configs import ConfigError, TileConfig
from ..planning.eligibility import warp_specialized_shared_bytes
from ..planning.heuristics import choose_split_k_inline, heuristic_config
from ..planning.problem import GemmProblem, wave_efficiency


def _next_pow2(x: int) -> int:
    return 1 << max(x - 1, 0).bit_length()


def _rank(cfg: TileConfig, problem: GemmProblem, device: DeviceInfo) -> float:
    """A rough a-priori score used only to trim the space: SM fill x operand reuse."""
    tiles = problem.batch * -(-problem.m // cfg.block_m) * -(-problem.n // cfg.block_n) * cfg.split_k
    reuse = (cfg.block_m * cfg.block_n) / (cfg.block_m + cfg.block_n) / 85.3  # 1.0 at 128x256
    full_line = 0.02 if cfg.block_k * problem.elem_size == 128 else 0.0  # K step of one 128-byte line
    return wave_efficiency(tiles, device.sm_count) * min(reuse, 1.0) + full_line + 0.005 * cfg.num_stages


#: (block_m, block_n, num_warps, num_stages, pingpong, epilogue_subtile) of the Gluon kernel worth
#: timing (rule 7).
WARP_SPECIALIZED_TILES = (
    (128, 128, 4, 6, False, False),
    (64, 128, 4, 6, False, False),
    (128, 256, 8, 3, False, False),
    # a fourth slot where half the output staging buffer is freed (heuristics.WIDE_TILE_FEW_WAVES)
    (128, 256, 8, 4, False, True),
    (128, 128, 4, 5, True, False),
    (64, 128, 4, 6, True, False),
    (64, 256, 4, 4, True, False),
    # widths that are not powers of two (two accumulators): heuristics.SPLIT_WIDTH_TILES
    (128, 192, 8, 4, False, False),
    (128, 160, 8, 5, False, False),
    (128, 96, 4, 6, False, False),
)


#: fp8's two consumers split a tile's rows rather than take turns: instead of the ping-pong tiles above,
#: 128x128 (heuristics.fp8.FP8_SPLIT_TILE) and, for fast accumulation, 128x256 (FP8_FAST_SPLIT_TILE).
FP8_SPLIT_ROWS_TILES = ((128, 128, 4, 6, True, False), (128, 256, 4, 3, True, False))


def candidate_configs(
    problem: GemmProblem, device: DeviceInfo, max_configs: int = 48
) -> Iterator[TileConfig]:
    """The pruned search space for ``problem`` on ``device`` (a few dozen configs).

    Pruning rules:
    1. a tile dimension is at most the problem's, rounded up to a power of two
       (larger tiles only compute masked-out zeros), and at least 16 (tl.dot);
    2. shared memory (stages x (A tile + B tile), + the TMA store buffer) fits
       the device; where the whole store buffer does not, its half does (the
       epilogue stored in two halves);
    3. the accumulator fragment fits the register budget, and every thread
       holds at least 8 accumulators (else the warps outnumber the work);
    4. deep pipelines only when K holds that many K-tiles;
    5. TMA variants only for 2-byte types on sm_90+; split-K only when the
       tiles alone do not fill the SMs.
    6. Stream-K variants of the large tiles (added after the trim; on the
       TMA kernel too on sm_90+) when those tiles keep the SMs less than 90%
       busy over their waves.
    7. On sm_90 (1- and 2-byte types, one matrix): the warp-specialized Gluon
       kernel's measured tiles (added after the trim): one consumer
       warpgroup on 128x128 or 64x128 at 6 stages, two cooperating on
       128x256 (3 stages, or 4 with the output staged in halves), and
       ping-pong consumers on 128x128, 64x128 and 64x256
       (``benchmarks/results/h100/sweeps/pingpong_sweep.txt``), with a K step of 128 bytes;
       for fp8, two consumers splitting the rows of 128x128 and 128x256 tiles instead
       (``sweeps/fp8_split_rows.txt``, and the file at commit e3fad58 for fast accumulation).
    Then the ``max_configs`` best by a rough score (SM fill x operand reuse)
    are kept, and the heuristic's own choice is always among them.
    """

    cap_m = max(_next_pow2(problem.m), 16)
    cap_n = max(_next_pow2(problem.n), 16)
    cap_k = max(_next_pow2(problem.k), 16)
    block_ms = [b for b in (16, 32, 64, 128, 256) if b <= cap_m][-3:]
    block_ns = [b for b in (16, 32, 64, 128, 256) if b <= cap_n][-3:]
    block_ks = {1: [64, 128, 256], 2: [32, 64, 128], 4: [16, 32, 64], 8: [16, 32]}[problem.elem_size]
    if problem.m <= 64 and problem.elem_size <= 4:
        block_ks.append(512 // problem.elem_size)  # skinny: long K runs of B rows keep more bytes in flight
    block_ks = [b for b in block_ks if b <= cap_k]
    block_ks = block_ks or [16]
    k_tiles_of = {bk: -(-max(problem.k, 1) // bk) for bk in block_ks}
    hopper_tma = problem.elem_size == 2 and device.capability >= (9, 0)
    found: dict[TileConfig, float] = {}

    def consider(cfg: TileConfig) -> None:
        try:
            cfg.validate(device, problem.elem_size, problem.acc_size)  # rules 2-3
        except ConfigError:
            return
        found[cfg] = _rank(cfg, problem, device)

    for bm in block_ms:
        for bn in block_ns:
            tiles = problem.batch * -(-problem.m // bm) * -(-problem.n // bn)
            for bk in block_ks:
                for warps in (2, 4, 8):
                    if bm * bn // (32 * warps) < 8:
                        continue  # rule 3
                    for stages in (2, 3, 4, 5):
                        if stages > 2 and stages > k_tiles_of[bk] + 1:
                            continue  # rule 4
                        consider(TileConfig(bm, bn, bk, 8, warps, stages))
                        if hopper_tma and bm >= 64 and stages >= 3:  # rule 5
                            kernel = "tma_persistent" if tiles > device.sm_count else "tma"
                            cfg = TileConfig(bm, bn, bk, 8, warps, stages, kernel=kernel)
                            consider(cfg)
                            if cfg.smem_bytes(problem.elem_size) > device.smem_per_block:  # rule 2
                                consider(replace(cfg, epilogue_subtile=True))
                    if tiles < device.sm_count and k_tiles_of[bk] >= 8:  # rule 5
                        for split_k in (2, 4, 8, 16):
                            if split_k * 4 <= k_tiles_of[bk]:
                                inline = choose_split_k_inline(problem, bm, bn, split_k)
                                consider(
                                    TileConfig(
                                        bm, bn, bk, 8, warps, 4, split_k=split_k, split_k_inline=inline
                                    )
                                )
    ranked = sorted(found, key=lambda c: -found[c])[:max_configs]
    if problem.m == 1 and problem.batch == 1:  # the GEMV kernel, outside the tl.dot tile space
        for bn in (8, 16, 32, 64):
            for k_bytes in (512, 1024, 2048):  # K step as bytes of each B row
                bk = k_bytes // problem.elem_size
                for warps in (4, 8):
                    if bk <= cap_k and bk * bn // (32 * warps) <= 64:  # accumulator registers
                        ranked.append(TileConfig(16, bn, bk, 8, warps, 1, kernel="gemv"))
    if problem.batch == 1 and problem.k > 0:  # rule 6
        for bm, bn, bk, warps, stages in ((128, 128, 64, 8, 4), (128, 256, 64, 8, 3), (128, 128, 128, 8, 3)):
            tiles = -(-problem.m // bm) * -(-problem.n // bn)
            if bk in block_ks and tiles > device.sm_count and wave_efficiency(tiles, device.sm_count) < 0.9:
                for kernel in ("pointer", "tma_persistent") if hopper_tma else ("pointer",):
                    cfg = TileConfig(bm, bn, bk, 8, warps, stages, kernel=kernel, stream_k=True)
                    try:
                        cfg.validate(device, problem.elem_size, problem.acc_size)
                        ranked.append(cfg)
                    except ConfigError:
                        pass
    # (fp8 too: the warp-specialized kernel is its sm_90 kernel; the plain TMA kernel takes 2 bytes only)
    gluon = (
        problem.elem_size <= 2 and device.capability == (9, 0) and not device.interpreter
    )  # never interprets
    if gluon and problem.batch == 1 and problem.k > 0:  # rule 7
        ws = dict(kernel="gluon_ws")
        fp8 = problem.elem_size == 1
        tiles = [t for t in WARP_SPECIALIZED_TILES if not (fp8 and t[4])]
        for bm, bn, warps, stages, pingpong, subtile in tiles + list(FP8_SPLIT_ROWS_TILES if fp8 else ()):
            if bm <= cap_m and bn <= cap_n:  # rule 1
                k_step = 128 // problem.elem_size  # 128 bytes of K, as wgmma reads it
                cfg = TileConfig(
                    bm, bn, k_step, 8, warps, stages, pingpong=pingpong, epilogue_subtile=subtile, **ws
                )
                out_size = 2  # (fp8 problems are tuned for a bf16 output: tuning.measure.FP8_OUT_DTYPE)
                if (
                    cfg not in ranked
                    and warp_specialized_shared_bytes(cfg, problem.elem_size, out_size)
                    <= device.smem_per_block
                ):
                    ranked.append(cfg)
    seed = heuristic_config(problem, device)
    try:
        seed.validate(device, problem.elem_size, problem.acc_size)
        if seed not in ranked:
            ranked.insert(0, seed)
    except ConfigError:
        pass
    yield from ranked
