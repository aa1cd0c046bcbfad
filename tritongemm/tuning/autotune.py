"""What dispatch asks: the cached config, and opt-in autotuning on a miss.

Autotuning on the first call of a shape is off by default (a first call that
stalls for seconds surprises users).  Turn it on with
``tritongemm.tuning.set_autotune_on_first_call(True)`` or ``TRITONGEMM_AUTOTUNE=1``.
Each cache key is tuned at most once per process, never while CUDA graphs
are captured or ``torch.compile`` traces, never from inside the tuner, and
never on Triton's CPU interpreter (its timings are meaningless; a warning
says so).
"""

from __future__ import annotations

import os
import threading
import warnings

import torch

from ..device import DeviceInfo
from ..planning.configs import TileConfig
from ..planning.problem import GemmProblem
from . import tuner
from .cache import cache_key, lookup

#: Seconds a first call may spend tuning its shape (a shorter box than ``tune``'s).
ON_CALL_BUDGET_S = 10.0

_override: list[bool | None] = [None]  # None: follow TRITONGEMM_AUTOTUNE
_attempted: set[str] = set()
_attempted_lock = threading.Lock()
_tuning_now = threading.local()


def set_autotune_on_first_call(enabled: bool | None) -> None:
    """Tune a shape the first time dispatch misses the cache (None: follow ``TRITONGEMM_AUTOTUNE``).

    >>> tritongemm.tuning.set_autotune_on_first_call(True)  # doctest: +SKIP
    """
    _override[0] = None if enabled is None else bool(enabled)


def autotune_on_first_call() -> bool:
    """Is autotuning on a cache miss switched on?"""
    if _override[0] is not None:
        return _override[0]
    return os.environ.get("TRITONGEMM_AUTOTUNE", "0").lower() in ("1", "true", "on", "yes")


def tuned_config(problem: GemmProblem, device: DeviceInfo, kernel: str = "pointer") -> TileConfig | None:
    """The dispatch hook: the cached config, else (only when opted in) a freshly tuned one, else None.

    >>> cfg = tuned_config(problem, device) or heuristic_config(problem, device)  # doctest: +SKIP
    """
    config = lookup(problem, device, kernel)
    if config is not None or not autotune_on_first_call():
        return config
    return _tune_on_miss(problem, device, kernel)


def _tuning_is_unsafe_now() -> bool:
    """Launching extra kernels now would break the caller (graph capture, compile tracing)."""
    compiler = getattr(torch, "compiler", None)
    if compiler is not None and getattr(compiler, "is_compiling", lambda: False)():
        return True
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


def _tune_on_miss(problem: GemmProblem, device: DeviceInfo, kernel: str) -> TileConfig | None:
    if getattr(_tuning_now, "active", False) or _tuning_is_unsafe_now():
        return None
    key = cache_key(problem, device, kernel)
    with _attempted_lock:
        if key in _attempted:
            return None
        _attempted.add(key)
    if not tuner.timings_are_meaningful(device):
        warnings.warn(
            f"tritongemm: TRITONGEMM_AUTOTUNE is ignored on Triton's CPU interpreter ({tuner.INTERPRETER_NOTE}); "
            "using the heuristic config",
            RuntimeWarning,
            stacklevel=3,
        )
        return None
    _tuning_now.active = True
    try:
        (result,) = tuner.tune(
            [problem], device=device, kernel=kernel, time_budget_s=ON_CALL_BUDGET_S, progress=False
        )
    except Exception as exc:  # tuning is an optimization: never fail the user's matmul over it
        warnings.warn(
            f"tritongemm: autotuning {tuner.describe_problem(problem)} failed ({type(exc).__name__}: {exc}); "
            "using the heuristic config",
            RuntimeWarning,
            stacklevel=2,
        )
        return None
    finally:
        _tuning_now.active = False
    return result.best


__all__ = ["ON_CALL_BUDGET_S", "autotune_on_first_call", "set_autotune_on_first_call", "tuned_config"]
