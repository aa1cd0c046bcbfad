"""The rules a ``TileConfig`` checks when it is built (``check_config``): field types, tile sizes, and
which kernel paths and options combine.
"""

from __future__ import annotations

from dataclasses import fields

from .pipelines import MAX_STAGES, MIN_STAGES, ConfigError

#: Most K slices split-K may use.
MAX_SPLIT_K = 64

_BOOL_FIELDS = (
    "tma",
    "persistent",
    "warp_specialize",
    "pingpong",
    "epilogue_subtile",
    "split_k_inline",
    "stream_k",
    "gemv",
)


def is_pow2(x: int) -> bool:
    return x > 0 and (x & (x - 1)) == 0


def split_width(block_n: int) -> tuple[int, int]:
    """A tile width as its largest power of two and the rest: 192 -> (128, 64), 128 -> (128, 0).

    Gluon tensors have power-of-two shapes; the warp-specialized kernel runs a
    width whose rest is a power of two >= 16 (192, 160, 96 ...) as two
    accumulators and two B / C boxes (``BLOCK_N``, ``BLOCK_N2``).
    """
    first = 1 << (block_n.bit_length() - 1) if block_n > 0 else 0
    return first, block_n - first


def _is_split_width(x: int) -> bool:
    rest = split_width(x)[1]
    return rest >= 16 and is_pow2(rest)


def check_config(cfg) -> None:
    """Raise ``ConfigError`` naming the field, its value and the rule ``cfg`` (a ``TileConfig``) breaks."""
    for f in fields(cfg):
        value = getattr(cfg, f.name)
        if f.name in _BOOL_FIELDS:
            if not isinstance(value, bool):
                raise ConfigError(f"TileConfig.{f.name} must be a bool, got {value!r}")
        elif not isinstance(value, int) or isinstance(value, bool):
            raise ConfigError(f"TileConfig.{f.name} must be an int, got {value!r}")
    for name in ("block_m", "block_n", "block_k"):
        value = getattr(cfg, name)
        if cfg.gemv and name == "block_n" and is_pow2(value):
            continue  # no tl.dot in the GEMV kernel: any power of two
        if name == "block_n" and cfg.warp_specialize and _is_split_width(value):
            continue  # two accumulators in the Gluon kernel (split_width)
        if not is_pow2(value) or value < 16:
            raise ConfigError(
                f"TileConfig.{name}={value}: tiles must be powers of two >= 16 "
                "(tl.dot needs every dimension >= 16"
                + (
                    "; with warp_specialize=True block_n may also be a sum of two powers of two, "
                    "such as 192 = 128 + 64)"
                    if name == "block_n"
                    else ")"
                )
            )
    if cfg.group_m < 1:
        raise ConfigError(f"TileConfig.group_m={cfg.group_m} must be >= 1")
    if cfg.num_warps not in (1, 2, 4, 8, 16):
        raise ConfigError(f"TileConfig.num_warps={cfg.num_warps} must be one of 1, 2, 4, 8, 16")
    for flag in ("persistent", "warp_specialize", "epilogue_subtile"):
        if getattr(cfg, flag) and not cfg.tma:
            raise ConfigError(f"TileConfig.{flag}=True needs tma=True (only the TMA kernel has it)")
    if cfg.pingpong and not (cfg.warp_specialize and cfg.num_warps == 4):
        raise ConfigError(
            "TileConfig.pingpong=True needs warp_specialize=True and num_warps=4 "
            f"(a warpgroup per consumer; got warp_specialize={cfg.warp_specialize}, "
            f"num_warps={cfg.num_warps})"
        )
    if (cfg.cluster_m, cfg.cluster_n) != (1, 1):
        if (cfg.cluster_m, cfg.cluster_n) not in ((2, 1), (1, 2)):
            raise ConfigError(
                f"TileConfig cluster {cfg.cluster_m}x{cfg.cluster_n}: a cluster is 2x1 or 1x2 CTAs"
            )
        if not cfg.warp_specialize or cfg.pingpong or cfg.stream_k:
            raise ConfigError(
                "TileConfig.cluster_m/cluster_n need warp_specialize=True with one cooperative consumer "
                "and no Stream-K"
            )
    if not 1 <= cfg.split_k <= MAX_SPLIT_K:
        raise ConfigError(f"TileConfig.split_k={cfg.split_k} must be in [1, {MAX_SPLIT_K}]")
    if cfg.split_k_inline and cfg.split_k == 1:
        raise ConfigError("TileConfig.split_k_inline=True needs split_k > 1")
    if cfg.split_k > 1 and cfg.tma:
        raise ConfigError("TileConfig.split_k > 1 runs on the pointer kernel: set tma=False")
    if cfg.stream_k and cfg.split_k > 1:
        raise ConfigError("TileConfig.stream_k and split_k > 1 are two ways of splitting K: pick one")
    if cfg.stream_k and cfg.tma and not cfg.persistent:
        raise ConfigError(
            "TileConfig.stream_k with tma=True needs persistent=True (Stream-K is a persistent grid)"
        )
    if cfg.epilogue_subtile and cfg.warp_specialize and (cfg.stream_k or not is_pow2(cfg.block_n)):
        raise ConfigError(
            "TileConfig.epilogue_subtile with warp_specialize runs a power-of-two block_n as two halves "
            f"and has no Stream-K (got block_n={cfg.block_n}, stream_k={cfg.stream_k})"
        )
    if cfg.stream_k and (cfg.pingpong or not is_pow2(cfg.block_n)):
        raise ConfigError(
            "TileConfig.stream_k with warp_specialize runs one consumer (pingpong=False) on a "
            f"power-of-two block_n (got block_n={cfg.block_n}, pingpong={cfg.pingpong})"
        )
    if cfg.gemv and (cfg.tma or cfg.stream_k):
        raise ConfigError("TileConfig.gemv is its own kernel: set tma=False and stream_k=False")
    if not MIN_STAGES <= cfg.num_stages <= MAX_STAGES:
        raise ConfigError(f"TileConfig.num_stages={cfg.num_stages} must be in [{MIN_STAGES}, {MAX_STAGES}]")


__all__ = ["MAX_SPLIT_K", "check_config", "is_pow2", "split_width"]
