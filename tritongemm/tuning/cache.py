"""The persistent tuning cache: one human-readable JSON file of tuned configs.

File layout (schema version ``CACHE_VERSION``)::

    {
      "schema": "tritongemm-tuning-cache",
      "version": 2,
      "entries": {
        "NVIDIA H100 80GB HBM3|sm_90|triton-3.5.0|pointer|float16|NT|m=1024|n=4096|k=4096|batch=1": {
          "config": {"block_m": 128, "block_n": 256, ..., "kernel": "pointer", ...},
          "tflops": 612.3, "torch_tflops": 655.0, "tuned_shape": [1000, 4096, 4096, 1],
          "timestamp": "2025-01-01T12:00:00+00:00", ...
        }
      }
    }

Keys name the GPU, its compute capability, the Triton version, the kernel
path, dtype, layout and shape.  M (and the batch count) are bucketed to the
next power of two so that dynamic token counts hit the cache; N and K are
exact (they are the weights' shape and do not change between calls).

Where it lives: ``$TRITONGEMM_CACHE_FILE`` (a file), else
``$TRITONGEMM_CACHE_DIR/tuning_cache.json``, else ``tuning_cache.json`` in
the platform's user cache directory (``platformdirs.user_cache_dir``: on
Linux ``$XDG_CACHE_HOME/tritongemm``, by default ``~/.cache/tritongemm``).

A version-1 file (configs with the booleans that chose the kernel before
``TileConfig.kernel``) is read as version 2 (``storage.MIGRATIONS``), and the
next save rewrites it so.

Reading never raises: a file that cannot be parsed (whatever the parser
raises), a foreign or a stale file is ignored with one warning per process
and path; an entry whose config is out of bounds or does not fit the device
is ignored with one warning per key, and dispatch uses its heuristic.
Writing takes an exclusive lock (``filelock``) on ``<cache>.lock``, merges
with what is on disk, writes a temporary file in the same directory and
``os.replace``s it over the cache, so two processes tuning at once neither
corrupt the file nor lose each other's entries.  A cache path that is a
symbolic link is resolved first: the link's target is written (and locked),
the link stays.  A file that could not be read is copied to
``<name>.<reason>-<timestamp>`` before it is replaced.
"""

from __future__ import annotations

import datetime
import functools
import os
import threading
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import platformdirs
import triton

from ..device import DeviceInfo
from ..planning.configs import (
    LEGACY_KERNEL_FLAGS,
    MAX_SPLIT_K,
    MAX_STAGES,
    MIN_STAGES,
    ConfigError,
    TileConfig,
)
from ..planning.problem import GemmProblem
from .storage import (
    CACHE_VERSION,
    SCHEMA,
    TuningCacheWarning,
    backup,
    lock_for,
    read_file,
    warn_once,
    write_atomic,
)

CACHE_FILENAME = "tuning_cache.json"
TRITON_VERSION = triton.__version__

#: Inclusive bounds of a cached config's integer fields, checked before a
#: TileConfig is built from the file.  The file is user data: a value no kernel
#: takes must not reach a launch (a group_m of 2**31 overflows the kernels'
#: int32 tile arithmetic and broke every matmul of its shape).  The bounds hold
#: everything the tuner can produce: tiles up to 256 (TMA boxes are at most
#: 256 wide) and GEMV K steps up to 2048 bytes (1024 fp16 elements); GEMV
#: tiles may be narrower than 16 (TileConfig enforces 16 for tl.dot tiles).
#: group_m beyond 64 tile-rows gains no L2 reuse on any GPU we target; a cluster is two CTAs at most.
CONFIG_BOUNDS: dict[str, tuple[int, int]] = {
    "block_m": (1, 1024),
    "block_n": (1, 1024),
    "block_k": (1, 1024),
    "group_m": (1, 64),
    "num_warps": (1, 16),
    "num_stages": (MIN_STAGES, MAX_STAGES),
    "split_k": (1, MAX_SPLIT_K),
    "cluster_m": (1, 2),
    "cluster_n": (1, 2),
}
#: Fields an entry's config must name (the options default to off and the kernel to the
#: pointer kernel when absent, as in entries written before the field existed).
REQUIRED_FIELDS = ("block_m", "block_n", "block_k", "group_m", "num_warps", "num_stages")


# ----------------------------------------------------------------------------------
# Where the cache lives
# ----------------------------------------------------------------------------------
def cache_path() -> Path:
    """The cache file: $TRITONGEMM_CACHE_FILE, else $TRITONGEMM_CACHE_DIR/tuning_cache.json,
    else tuning_cache.json in the user cache directory (``platformdirs``; ~/.cache/tritongemm on Linux).

    >>> cache_path()  # doctest: +SKIP
    PosixPath('/home/me/.cache/tritongemm/tuning_cache.json')
    """
    env = os.environ
    return _resolve_path(
        env.get("TRITONGEMM_CACHE_FILE"),
        env.get("TRITONGEMM_CACHE_DIR"),
        env.get("XDG_CACHE_HOME"),
        env.get("HOME"),
    )


# lookup() resolves the path on every call.  The key holds every variable the
# answer depends on (platformdirs reads XDG_CACHE_HOME and HOME on Linux).
@functools.lru_cache(maxsize=64)
def _resolve_path(cache_file: str | None, cache_dir: str | None, xdg: str | None, home: str | None) -> Path:
    if cache_file:
        return Path(cache_file).expanduser()
    if cache_dir:
        return Path(cache_dir).expanduser() / CACHE_FILENAME
    return Path(platformdirs.user_cache_dir("tritongemm", appauthor=False)) / CACHE_FILENAME


# ----------------------------------------------------------------------------------
# Keys
# ----------------------------------------------------------------------------------
def bucket(x: int) -> int:
    """The power of two a size is rounded up to in cache keys.

    >>> bucket(1000), bucket(1024), bucket(1025)
    (1024, 1024, 2048)
    """
    return 1 << max(x - 1, 0).bit_length()


def cache_key(problem: GemmProblem, device: DeviceInfo, kernel: str = "pointer") -> str:
    """The cache key of ``problem`` on ``device``: readable, one field per ``|``.

    >>> cache_key(GemmProblem(1000, 4096, 4096), INTERPRETER_DEVICE)  # doctest: +SKIP
    'triton-interpreter (H100 budgets)|sm_90|triton-3.5.0|pointer|float16|NN|m=1024|n=4096|k=4096|batch=1'
    """
    major, minor = device.capability
    return (
        f"{device.name}|sm_{major}{minor}|triton-{TRITON_VERSION}|{kernel}|{problem.dtype}|"
        f"{problem.layout}|m={bucket(problem.m)}|n={problem.n}|k={problem.k}|batch={bucket(problem.batch)}"
    )


def make_entry(
    problem: GemmProblem,
    device: DeviceInfo,
    config: TileConfig,
    tflops: float,
    torch_tflops: float | None,
    kernel: str = "pointer",
) -> dict:
    """One cache entry: the winning config and what it measured, beside torch.matmul."""
    return {
        "config": config.to_dict(),
        "tflops": round(float(tflops), 3),
        "torch_tflops": None if torch_tflops is None else round(float(torch_tflops), 3),
        "tuned_shape": [problem.m, problem.n, problem.k, problem.batch],
        "device": device.name,
        "capability": list(device.capability),
        "triton": TRITON_VERSION,
        "kernel": kernel,
        "dtype": problem.dtype,
        "layout": problem.layout,
        "timestamp": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }


# ----------------------------------------------------------------------------------
# The in-memory view of one cache file
# ----------------------------------------------------------------------------------
@dataclass
class _Store:
    path: Path
    entries: dict = field(default_factory=dict)
    #: key -> validated TileConfig, or None for a miss / an entry that no longer validates.
    resolved: dict = field(default_factory=dict)

    def forget_resolved(self) -> None:
        self.resolved = {}


_stores: dict[Path, _Store] = {}
_stores_lock = threading.Lock()


def _store_for(path: Path) -> _Store:
    store = _stores.get(path)
    if store is not None:
        return store
    with _stores_lock:
        store = _stores.get(path)
        if store is None:
            contents = read_file(path)
            warn_once(path, contents)
            store = _Store(path, contents.entries)
            _stores[path] = store
    return store


def load(path: Path | None = None) -> dict:
    """All entries of the cache file (a copy), reading it on first use.

    >>> len(load())  # doctest: +SKIP
    12
    """
    return dict(_store_for(path or cache_path()).entries)


def reload(path: Path | None = None) -> None:
    """Forget the in-memory copy so the next lookup reads the file again (e.g. after another process tuned)."""
    with _stores_lock:
        _stores.pop(path or cache_path(), None)


def save_entries(new_entries: dict, path: Path | None = None) -> Path:
    """Merge ``new_entries`` (key -> entry) into the cache file; returns its path.

    Under the file lock: read what is on disk, back up an unusable file, let
    ``new_entries`` win over disk entries of the same key, replace atomically.
    Raises ``OSError`` when the file cannot be written (a read-only directory,
    or ``filelock.Timeout`` when another process holds the lock too long).

    >>> save_entries({cache_key(problem, device): make_entry(problem, device, cfg, 500.0, 600.0)})  # doctest: +SKIP
    """
    path = path or cache_path()
    # Write through a symlink: its target is the file (and owns the lock); the link stays.
    target = Path(os.path.realpath(path))
    target.parent.mkdir(parents=True, exist_ok=True)
    with lock_for(target):
        on_disk = read_file(target)
        warn_once(path, on_disk)
        if on_disk.problem is not None and target.exists():
            backup(target, on_disk.problem)
        merged = {**on_disk.entries, **new_entries}
        write_atomic(target, merged)
    with _stores_lock:
        _stores[path] = _Store(path, merged)
    return path


def record(
    problem: GemmProblem,
    device: DeviceInfo,
    config: TileConfig,
    tflops: float,
    torch_tflops: float | None = None,
    kernel: str = "pointer",
    path: Path | None = None,
) -> str:
    """Store one tuned config; returns its key.

    >>> record(GemmProblem(1024, 4096, 4096), device_info(), cfg, tflops=610.0, torch_tflops=650.0)  # doctest: +SKIP
    """
    key = cache_key(problem, device, kernel)
    save_entries({key: make_entry(problem, device, config, tflops, torch_tflops, kernel)}, path)
    return key


# ----------------------------------------------------------------------------------
# Lookup: the hot path
# ----------------------------------------------------------------------------------
def lookup(problem: GemmProblem, device: DeviceInfo, kernel: str = "pointer") -> TileConfig | None:
    """The tuned config for ``problem`` on ``device``, or None.  Only reads; never tunes.

    After the first call per cache file this is a dict lookup.  An entry whose
    config is out of ``CONFIG_BOUNDS`` or does not fit the device (a changed
    budget or rule) counts as a miss, with one ``TuningCacheWarning`` per key.

    >>> lookup(GemmProblem(1000, 4096, 4096, dtype="float16", layout="NT"), device_info())  # doctest: +SKIP
    TileConfig(block_m=128, block_n=256, block_k=64, group_m=8, num_warps=8, num_stages=3)
    """
    path = cache_path()
    store = _store_for(path)
    key = cache_key(problem, device, kernel)
    try:
        return store.resolved[key]
    except KeyError:
        pass
    entry = store.entries.get(key)
    config, reason = (None, None) if entry is None else config_of_entry(entry, problem, device)
    if reason is not None:
        warnings.warn(
            f"tritongemm: ignoring the tuned entry {key!r} of {path}: {reason}. "
            "Using the heuristic config; re-tune the shape to replace the entry.",
            TuningCacheWarning,
            stacklevel=2,
        )
    store.resolved[key] = config  # also remembers a bad entry, so it warns once
    return config


def config_of_entry(
    entry: dict, problem: GemmProblem, device: DeviceInfo
) -> tuple[TileConfig | None, str | None]:
    """``(config, None)`` for a usable entry, else ``(None, why not)``; never raises.

    >>> config_of_entry({"config": {**cfg.to_dict(), "group_m": 2**31}}, problem, device)[1]  # doctest: +SKIP
    'config field group_m=2147483648 is out of bounds [1, 64]'
    """
    fields = entry.get("config")
    if not isinstance(fields, dict):
        return None, f"config is {type(fields).__name__}, not an object"
    reason = config_fields_problem(fields)
    if reason is not None:
        return None, reason
    try:
        config = TileConfig.from_dict(fields)
        return config.validate(device, problem.elem_size, problem.acc_size), None
    except (ConfigError, TypeError, ValueError) as exc:
        return None, str(exc)


def config_fields_problem(fields: dict) -> str | None:
    """Why a cached config's fields cannot be used (a missing, mistyped or out-of-bounds field), or None."""
    missing = [name for name in REQUIRED_FIELDS if name not in fields]
    if missing:
        return f"config lacks {', '.join(missing)}"
    # (the old kernel booleans too: TileConfig.from_dict reads them, the entries of a version-1 file
    # that could not be migrated have them)
    known = {**TileConfig().to_dict(), **dict.fromkeys(LEGACY_KERNEL_FLAGS, False)}
    unknown = sorted(str(name) for name in fields if name not in known)
    if unknown:
        return f"config has unknown fields {unknown}"
    for name, value in fields.items():
        if isinstance(known[name], str):
            if not isinstance(value, str):
                return f"config field {name}={value!r} must be a string"
            continue
        if isinstance(known[name], bool):
            if not isinstance(value, bool):
                return f"config field {name}={value!r} must be true or false"
            continue
        if not isinstance(value, int) or isinstance(value, bool):
            return f"config field {name}={value!r} must be an integer"
        if name not in CONFIG_BOUNDS:  # a new TileConfig field nobody bounded yet: refuse, don't guess
            return f"config field {name} has no bounds in CONFIG_BOUNDS"
        low, high = CONFIG_BOUNDS[name]
        if not low <= value <= high:
            return f"config field {name}={value} is out of bounds [{low}, {high}]"
    return None


__all__ = [
    "CACHE_VERSION",
    "CONFIG_BOUNDS",
    "SCHEMA",
    "TuningCacheWarning",
    "bucket",
    "cache_key",
    "cache_path",
    "config_fields_problem",
    "config_of_entry",
    "load",
    "lookup",
    "make_entry",
    "record",
    "reload",
    "save_entries",
]
