"""The three mainloop schemes and the stage counts they take (``TileConfig.num_stages``).

The schemes are named after CUTLASS's collectives.  All three are the same Triton kernel; Triton's
software pipeliner (or, in the warp-specialized kernel, the ring of ``NUM_STAGES`` slots) makes the
schedule from ``num_stages``:

* ``single_stage`` (num_stages=1, CUTLASS ``MmaSingleStage``): load a K-tile into shared memory,
  wait, compute on it, repeat.  Nothing overlaps.
* ``double_buffer`` (num_stages=2, CUTLASS ``MmaPipelined``): two buffers; the copy of tile k+1 is
  issued before the MMAs on tile k.
* ``multi_stage`` (num_stages>=3, CUTLASS ``MmaMultistage``): asynchronous global->shared copies
  (cp.async, or TMA on Hopper) run num_stages-1 tiles ahead of the MMAs.
"""

from __future__ import annotations

PIPELINES: dict[str, int] = {"single_stage": 1, "double_buffer": 2, "multi_stage": 3}

#: Fewest / most stages the config space offers.
MIN_STAGES, MAX_STAGES = 1, 6


class ConfigError(ValueError):
    """A ``TileConfig`` that breaks a rule or does not fit a device's budgets."""


def pipeline_name(num_stages: int) -> str:
    if num_stages <= 1:
        return "single_stage"
    if num_stages == 2:
        return "double_buffer"
    return "multi_stage"


def resolve_pipeline(pipeline: str | int, default_multi: int = 3) -> int:
    """Stage count for a pipeline name (or an explicit stage count)."""
    if isinstance(pipeline, bool):
        raise ConfigError(f"pipeline must be a name or a stage count, got {pipeline!r}")
    if isinstance(pipeline, int):
        if not MIN_STAGES <= pipeline <= MAX_STAGES:
            raise ConfigError(f"pipeline stage count {pipeline} must be in [{MIN_STAGES}, {MAX_STAGES}]")
        return pipeline
    if pipeline not in PIPELINES:
        raise ConfigError(
            f"unknown pipeline {pipeline!r}; choose one of {sorted(PIPELINES)} or a stage count"
        )
    return default_multi if pipeline == "multi_stage" else PIPELINES[pipeline]


__all__ = ["MAX_STAGES", "MIN_STAGES", "PIPELINES", "ConfigError", "pipeline_name", "resolve_pipeline"]
