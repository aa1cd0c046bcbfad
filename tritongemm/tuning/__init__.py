"""Autotuning and the persistent tuning cache.

    tritongemm.tuning.tune(problems)      # time candidates, write the winners to the cache
    tritongemm.tuning.lookup(problem, device)   # the cached config or None (only reads)
    tritongemm.tuning.tuned_config(problem, device)  # dispatch's hook: lookup (+ opt-in autotune)
    tritongemm.tuning.set_autotune_on_first_call(True)  # or TRITONGEMM_AUTOTUNE=1
    python -m tritongemm tune --preset llama3-8b --dtype bf16

Where things live: ``cache.py`` (keys, the JSON file, locking, lookup),
``tuner.py`` (timing and choosing), ``autotune.py`` (the dispatch hook),
``presets.py`` (LLM layer shapes), ``space.py`` (the candidate configs), ``cli.py`` (``python -m tritongemm``),
``progress.py`` (the progress bar).
"""

from ..planning.selection import register_config_source
from .autotune import autotune_on_first_call, set_autotune_on_first_call, tuned_config
from .cache import TuningCacheWarning, bucket, cache_key, cache_path, load, lookup, record, reload
from .presets import PRESETS, preset_problems
from .report import format_table
from .space import candidate_configs
from .tuner import TuneResult, tune

# Dispatch consults the cache through the registry (explicit config > tuning cache > heuristic):
# nothing below the tuning package imports it.
register_config_source("tuning cache", tuned_config)

__all__ = [
    "PRESETS",
    "TuneResult",
    "TuningCacheWarning",
    "autotune_on_first_call",
    "bucket",
    "cache_key",
    "cache_path",
    "candidate_configs",
    "format_table",
    "load",
    "lookup",
    "preset_problems",
    "record",
    "reload",
    "set_autotune_on_first_call",
    "tune",
    "tuned_config",
]
