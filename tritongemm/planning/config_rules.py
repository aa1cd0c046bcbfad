"""Which kernel a ``TileConfig`` names and which options that kernel takes: the rules its
``__post_init__`` checks (``check_config``), and reading the booleans that chose the kernel
before the ``kernel`` field existed (``migrate_kernel_flags``).

A config names one kernel of ``KERNELS``; its options are valid on some of them:

* ``stream_k`` (a decomposition, each kernel's own on a persistent grid): ``STREAM_K_KERNELS``;
* ``split_k`` > 1 (with ``split_k_inline``): ``SPLIT_K_KERNELS``;
* ``epilogue_subtile`` (the TMA store's staging tile in two halves): ``TMA_KERNELS``;
* ``pingpong`` and ``cluster_m`` / ``cluster_n``: ``gluon_ws`` only.
"""

from __future__ import annotations

from dataclasses import fields

from .pipelines import MAX_STAGES, MIN_STAGES, ConfigError

#: The kernels a config can name (``TileConfig.kernel``): the pointer kernel (``kernels/gemm.py``;
#: with ``stream_k`` its Stream-K kernel, ``gemm_streamk.py``), the Hopper TMA kernel on a
#: data-parallel grid (``tma``) or a persistent one (``tma_persistent``), the warp-specialized
#: Gluon kernel (``gluon_ws``, always persistent) and the GEMV kernel (``gemv``, one row of A,
#: no tensor cores).
KERNELS = ("pointer", "tma", "tma_persistent", "gluon_ws", "gemv")

#: Kernels that load A and B and store C through TMA descriptors (sm_90).
TMA_KERNELS = ("tma", "tma_persistent", "gluon_ws")

#: Kernels with a Stream-K of their own: it needs a persistent grid (the TMA kernel's data-parallel
#: grid has none; the GEMV kernel runs no tl.dot tiles).
STREAM_K_KERNELS = ("pointer", "tma_persistent", "gluon_ws")

#: Kernels that cut K into ``split_k`` slices run by separate programs.
SPLIT_K_KERNELS = ("pointer", "gemv")

#: Most K slices split-K may use.
MAX_SPLIT_K = 64

_BOOL_FIELDS = ("pingpong", "epilogue_subtile", "split_k_inline", "stream_k")


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


def _names(kernels: tuple[str, ...]) -> str:
    return ", ".join(repr(k) for k in kernels)


def check_config(cfg) -> None:
    """Raise ``ConfigError`` naming the field, its value and the rule ``cfg`` (a ``TileConfig``) breaks."""
    for f in fields(cfg):
        value = getattr(cfg, f.name)
        if f.name == "kernel":
            if not isinstance(value, str) or value not in KERNELS:
                raise ConfigError(f"TileConfig.kernel={value!r} must be one of {_names(KERNELS)}")
        elif f.name in _BOOL_FIELDS:
            if not isinstance(value, bool):
                raise ConfigError(f"TileConfig.{f.name} must be a bool, got {value!r}")
        elif not isinstance(value, int) or isinstance(value, bool):
            raise ConfigError(f"TileConfig.{f.name} must be an int, got {value!r}")
    kernel = cfg.kernel
    for name in ("block_m", "block_n", "block_k"):
        value = getattr(cfg, name)
        if kernel == "gemv" and name == "block_n" and is_pow2(value):
            continue  # no tl.dot in the GEMV kernel: any power of two
        if name == "block_n" and kernel == "gluon_ws" and _is_split_width(value):
            continue  # two accumulators in the Gluon kernel (split_width)
        if not is_pow2(value) or value < 16:
            raise ConfigError(
                f"TileConfig.{name}={value}: tiles must be powers of two >= 16 "
                "(tl.dot needs every dimension >= 16"
                + (
                    "; with kernel='gluon_ws' block_n may also be a sum of two powers of two, "
                    "such as 192 = 128 + 64)"
                    if name == "block_n"
                    else ")"
                )
            )
    if cfg.group_m < 1:
        raise ConfigError(f"TileConfig.group_m={cfg.group_m} must be >= 1")
    if cfg.num_warps not in (1, 2, 4, 8, 16):
        raise ConfigError(f"TileConfig.num_warps={cfg.num_warps} must be one of 1, 2, 4, 8, 16")
    if cfg.epilogue_subtile and kernel not in TMA_KERNELS:
        raise ConfigError(
            f"TileConfig.epilogue_subtile=True needs a TMA kernel ({_names(TMA_KERNELS)}; got "
            f"kernel={kernel!r}): only the TMA store stages C in shared memory"
        )
    if cfg.pingpong and not (kernel == "gluon_ws" and cfg.num_warps == 4):
        raise ConfigError(
            "TileConfig.pingpong=True needs kernel='gluon_ws' and num_warps=4 "
            f"(a warpgroup per consumer; got kernel={kernel!r}, num_warps={cfg.num_warps})"
        )
    if (cfg.cluster_m, cfg.cluster_n) != (1, 1):
        if (cfg.cluster_m, cfg.cluster_n) not in ((2, 1), (1, 2)):
            raise ConfigError(
                f"TileConfig cluster {cfg.cluster_m}x{cfg.cluster_n}: a cluster is 2x1 or 1x2 CTAs"
            )
        if kernel != "gluon_ws" or cfg.pingpong or cfg.stream_k:
            raise ConfigError(
                "TileConfig.cluster_m/cluster_n need kernel='gluon_ws' with one cooperative consumer "
                f"and no Stream-K (got kernel={kernel!r}, pingpong={cfg.pingpong}, stream_k={cfg.stream_k})"
            )
    if not 1 <= cfg.split_k <= MAX_SPLIT_K:
        raise ConfigError(f"TileConfig.split_k={cfg.split_k} must be in [1, {MAX_SPLIT_K}]")
    if cfg.split_k_inline and cfg.split_k == 1:
        raise ConfigError("TileConfig.split_k_inline=True needs split_k > 1")
    if cfg.split_k > 1 and kernel not in SPLIT_K_KERNELS:
        raise ConfigError(
            f"TileConfig.split_k={cfg.split_k} runs on kernel {_names(SPLIT_K_KERNELS)}, not "
            f"kernel={kernel!r}: set kernel='pointer'"
        )
    if cfg.stream_k and cfg.split_k > 1:
        raise ConfigError("TileConfig.stream_k and split_k > 1 are two ways of splitting K: pick one")
    if cfg.stream_k and kernel not in STREAM_K_KERNELS:
        raise ConfigError(
            f"TileConfig.stream_k=True runs on kernel {_names(STREAM_K_KERNELS)}, not kernel={kernel!r}"
            + (" (Stream-K is a persistent grid: set kernel='tma_persistent')" if kernel == "tma" else "")
        )
    if cfg.epilogue_subtile and kernel == "gluon_ws" and (cfg.stream_k or not is_pow2(cfg.block_n)):
        raise ConfigError(
            "TileConfig.epilogue_subtile with kernel='gluon_ws' runs a power-of-two block_n as two halves "
            f"and has no Stream-K (got block_n={cfg.block_n}, stream_k={cfg.stream_k})"
        )
    if cfg.stream_k and (cfg.pingpong or not is_pow2(cfg.block_n)):
        raise ConfigError(
            "TileConfig.stream_k with kernel='gluon_ws' runs one consumer (pingpong=False) on a "
            f"power-of-two block_n (got block_n={cfg.block_n}, pingpong={cfg.pingpong})"
        )
    if not MIN_STAGES <= cfg.num_stages <= MAX_STAGES:
        raise ConfigError(f"TileConfig.num_stages={cfg.num_stages} must be in [{MIN_STAGES}, {MAX_STAGES}]")


#: The booleans that chose the kernel before ``TileConfig.kernel`` (in dicts and tuning caches
#: written then): ``TileConfig.from_dict`` and the cache's reader turn them into ``kernel``.
LEGACY_KERNEL_FLAGS = ("tma", "persistent", "warp_specialize", "gemv")


def migrate_kernel_flags(data: dict) -> dict:
    """``data`` (a config's fields) with the old kernel booleans replaced by the kernel they chose.

    The old rules on them hold: ``persistent`` and ``warp_specialize`` needed ``tma``, and ``gemv``
    excluded it.  ``warp_specialize`` ran the Gluon kernel, persistent whatever ``persistent`` said
    (it has no other grid), so both map to ``gluon_ws``.

    >>> migrate_kernel_flags({"block_m": 64, "tma": True, "persistent": True})
    {'block_m': 64, 'kernel': 'tma_persistent'}
    """
    flags = {name: data[name] for name in LEGACY_KERNEL_FLAGS if name in data}
    if not flags:
        return data
    if "kernel" in data:
        raise ConfigError(
            f"TileConfig: the old kernel fields {sorted(flags)} and kernel={data['kernel']!r} together; "
            "give kernel alone"
        )
    for name, value in flags.items():
        if not isinstance(value, bool):
            raise ConfigError(f"TileConfig.{name} must be a bool, got {value!r}")
    tma, gemv = flags.get("tma", False), flags.get("gemv", False)
    for name in ("persistent", "warp_specialize"):
        if flags.get(name, False) and not tma:
            raise ConfigError(f"TileConfig.{name}=True needs tma=True (only the TMA kernel has it)")
    if gemv and tma:
        raise ConfigError("TileConfig.gemv is its own kernel: set tma=False")
    if gemv:
        kernel = "gemv"
    elif flags.get("warp_specialize", False):
        kernel = "gluon_ws"
    elif tma:
        kernel = "tma_persistent" if flags.get("persistent", False) else "tma"
    else:
        kernel = "pointer"
    kept = {name: value for name, value in data.items() if name not in LEGACY_KERNEL_FLAGS}
    return {**kept, "kernel": kernel}


__all__ = [
    "KERNELS",
    "LEGACY_KERNEL_FLAGS",
    "MAX_SPLIT_K",
    "SPLIT_K_KERNELS",
    "STREAM_K_KERNELS",
    "TMA_KERNELS",
    "check_config",
    "is_pow2",
    "migrate_kernel_flags",
    "split_width",
]
