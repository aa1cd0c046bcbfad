"""Which config a call runs: explicit > registered sources (the tuning cache) > heuristic.

Config sources register themselves (``register_config_source``); nothing here
imports them.  The tuning package registers its cache lookup when it is
imported, so this module, and everything below it, never imports upward.
After the source, the caller's pipeline / decomposition overrides apply and
the result is validated against the device's budgets.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import replace

from ..device import DeviceInfo
from .call import NO_REQUEST, Request
from .configs import DECOMPOSITIONS, MAX_SPLIT_K, ConfigError, TileConfig
from .heuristics import (
    choose_skinny_tile,
    choose_split_k,
    choose_split_k_inline,
    fit_shared_memory,
    heuristic_choice,
)
from .problem import GemmProblem

#: A config source: (problem, device) -> a config, or None to pass.
ConfigSource = Callable[[GemmProblem, DeviceInfo], "TileConfig | None"]

_SOURCES: dict[str, ConfigSource] = {}


def register_config_source(name: str, source: ConfigSource) -> None:
    """Consult ``source`` (after an explicit config, before the heuristic); ``name`` appears in ``explain()``.

    A source that raises, or returns a config that does not validate on the
    device, is skipped with a warning: a broken source never breaks a matmul.
    """
    _SOURCES[name] = source


def unregister_config_source(name: str) -> None:
    _SOURCES.pop(name, None)


def registered_sources() -> tuple[str, ...]:
    return tuple(_SOURCES)


def _from_sources(problem: GemmProblem, device: DeviceInfo) -> tuple[TileConfig, str] | None:
    for name, source in _SOURCES.items():
        try:
            cfg = source(problem, device)
            if cfg is not None:
                return cfg.validate(device, problem.elem_size, problem.acc_size), name
        except Exception as exc:  # a broken cache must never break a matmul
            warnings.warn(
                f"tritongemm: config source {name!r} failed for {problem} ({type(exc).__name__}: {exc}); "
                "using the next source",
                RuntimeWarning,
                stacklevel=3,
            )
    return None


def select(problem: GemmProblem, device: DeviceInfo, request: Request = NO_REQUEST) -> tuple[TileConfig, str]:
    """(config, where it came from in words) for ``problem`` on ``device``."""
    cfg = request.config
    if cfg is not None:
        source = "explicit config"
    else:
        found = _from_sources(problem, device)
        if found is not None:
            cfg, source = found
        else:
            cfg, rule = heuristic_choice(problem, device)
            source = f"heuristic: {rule}"
    if request.pipeline is not None:
        cfg = cfg.with_pipeline(request.pipeline)
        source += f"; pipeline={request.pipeline!r}"
    if request.decomposition is not None:
        cfg = apply_decomposition(cfg, request.decomposition, problem, device)
        source += f"; decomposition={request.decomposition!r}"
    if request.config is None and (request.pipeline is not None or request.decomposition is not None):
        # The tiles were ours, not the caller's: keep the requested scheme within shared memory.
        cfg = fit_shared_memory(cfg, problem, device)
    return cfg.validate(device, problem.elem_size, problem.acc_size), source


def select_config(
    problem: GemmProblem,
    device: DeviceInfo,
    config: TileConfig | dict | None = None,
    pipeline: str | int | None = None,
    decomposition: str | None = None,
) -> TileConfig:
    """The config a call would run (explicit > tuning cache > heuristic, then the overrides)."""
    if isinstance(config, dict):
        config = TileConfig.from_dict(config)
    return select(problem, device, Request(config, pipeline, decomposition))[0]


def apply_decomposition(
    cfg: TileConfig, decomposition: str, problem: GemmProblem, device: DeviceInfo
) -> TileConfig:
    """Force one way of sharing the K loop, keeping the tiles."""
    if decomposition == "sliced_k":
        return replace(cfg, split_k=1, split_k_inline=False, stream_k=False)
    if decomposition == "split_k":
        if cfg.split_k > 1:
            return replace(cfg, stream_k=False)
        k_tiles = -(-problem.k // cfg.block_k)
        split = choose_split_k(problem, device, cfg.block_m, cfg.block_n, cfg.block_k)
        split = max(2, min(split, max(k_tiles, 1), MAX_SPLIT_K))
        inline = choose_split_k_inline(problem, cfg.block_m, cfg.block_n, split)
        return replace(
            cfg.without_warp_specialization(),
            kernel="gemv" if cfg.kernel == "gemv" else "pointer",  # the kernels that split K
            epilogue_subtile=False,
            stream_k=False,
            split_k=split,
            split_k_inline=inline,
        )
    if decomposition == "stream_k":
        if cfg.kernel == "gemv":  # Stream-K runs tl.dot tiles: take the skinny tile for this one-row problem
            cfg = replace(choose_skinny_tile(problem).config(), group_m=cfg.group_m)
        if cfg.uses_tma:  # the TMA kernel streams on its persistent grid
            return replace(
                cfg.without_warp_specialization(),
                kernel="tma_persistent",
                split_k=1,
                split_k_inline=False,
                stream_k=True,
            )
        return replace(
            cfg.without_warp_specialization(),
            kernel="pointer",
            epilogue_subtile=False,
            split_k=1,
            split_k_inline=False,
            stream_k=True,
        )
    raise ConfigError(f"unknown decomposition {decomposition!r}; choose one of {list(DECOMPOSITIONS)}")


__all__ = [
    "register_config_source",
    "registered_sources",
    "select",
    "select_config",
    "unregister_config_source",
]
