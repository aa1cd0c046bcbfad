"""The persistent tuning cache: one human-readable JSON file of tuned configs.

File layout (schema version ``CACHE_VERSION``)::

    {
      "schema": "tritongemm-tuning-cache",
      "version": 1,
      "entries": {
        "NVIDIA H100 80GB HBM3|sm_90|triton-3.5.0|pointer|float16|NT|m=1024|n=4096|k=4096|batch=1": {
          "config": {"block_m": 128, "block_n": 256, ...},
          "tflops": 612.3, "torch_tflops": 655.0, "tuned_shape": [1000, 4096, 4096, 1],
          "timestamp": "2025-01-01T12:00:00+00:00", ...
        }
      }
    }

Keys name the GPU, its compute capability, the Triton version, the kernel
path, dtype, layout and shape.  M (and the batch count) are bucketed to the
next power of two so that dynamic token counts hit the cache; N and K are
exact (they are the weights' shape and do not change between calls).

Reading never raises: a corrupt, foreign or stale file is ignored with one
warning per process and path.  Writing takes an exclusive ``flock`` on a
separate ``.lock`` file, merges with what is on disk, writes a temporary file
in the same directory and ``os.replace``s it over the cache, so two processes
tuning at once neither corrupt the file nor lose each other's entries.  A file
that could not be read is copied to ``<name>.<reason>-<timestamp>`` before it
is replaced.
"""

from __future__ import annotations

import contextlib
import datetime
import functools
import json
import os
import shutil
import tempfile
import threading
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import triton

from ..configs import ConfigError, GemmProblem, TileConfig
from ..device import DeviceInfo

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows: Triton itself is Linux-first
    fcntl = None

SCHEMA = "tritongemm-tuning-cache"
CACHE_VERSION = 1
CACHE_FILENAME = "tuning_cache.json"
TRITON_VERSION = triton.__version__


class TuningCacheWarning(UserWarning):
    """A cache file that could not be used (corrupt, foreign or stale)."""


# ----------------------------------------------------------------------------------
# Where the cache lives
# ----------------------------------------------------------------------------------
def cache_path() -> Path:
    """The cache file: $TRITONGEMM_CACHE_FILE, else $TRITONGEMM_CACHE_DIR/tuning_cache.json,
    else ($XDG_CACHE_HOME or ~/.cache)/tritongemm/tuning_cache.json.

    >>> cache_path()  # doctest: +SKIP
    PosixPath('/home/me/.cache/tritongemm/tuning_cache.json')
    """
    env = os.environ
    return _resolve_path(
        env.get("TRITONGEMM_CACHE_FILE"), env.get("TRITONGEMM_CACHE_DIR"), env.get("XDG_CACHE_HOME")
    )


@functools.lru_cache(maxsize=64)  # lookup() resolves the path on every call
def _resolve_path(cache_file: str | None, cache_dir: str | None, xdg: str | None) -> Path:
    if cache_file:
        return Path(cache_file).expanduser()
    if cache_dir:
        return Path(cache_dir).expanduser() / CACHE_FILENAME
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "tritongemm" / CACHE_FILENAME


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
# Reading a file: never raises
# ----------------------------------------------------------------------------------
@dataclass
class _FileContents:
    entries: dict
    #: None when the file was usable (or missing); else "corrupt", "foreign" or "stale".
    problem: str | None = None
    detail: str = ""


def _read_file(path: Path) -> _FileContents:
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return _FileContents({})
    except OSError as exc:
        return _FileContents({}, "unreadable", str(exc))
    try:
        data = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        return _FileContents({}, "corrupt", f"not valid JSON ({exc})")
    if not isinstance(data, dict) or data.get("schema") != SCHEMA or not isinstance(data.get("entries"), dict):
        return _FileContents({}, "foreign", f"not a {SCHEMA} file")
    version = data.get("version")
    if version != CACHE_VERSION:
        return _FileContents({}, "stale", f"schema version {version!r}, this tritongemm reads {CACHE_VERSION}")
    entries = {k: v for k, v in data["entries"].items() if isinstance(k, str) and isinstance(v, dict)}
    return _FileContents(entries)


_warned_paths: set[Path] = set()


def _warn_once(path: Path, contents: _FileContents) -> None:
    if contents.problem is None or path in _warned_paths:
        return
    _warned_paths.add(path)
    warnings.warn(
        f"tritongemm: ignoring the tuning cache {path}: {contents.problem} file, {contents.detail}. "
        "Tuned configs from it are not used; the next save keeps a backup copy and starts a fresh file.",
        TuningCacheWarning,
        stacklevel=3,
    )


# ----------------------------------------------------------------------------------
# Writing: lock, merge, atomic replace
# ----------------------------------------------------------------------------------
class _FileLock:
    """An exclusive ``flock`` on ``<cache>.lock`` (a separate file: the cache itself is replaced)."""

    def __init__(self, path: Path):
        self.lock_path = path.with_name(path.name + ".lock")
        self._fd: int | None = None

    def __enter__(self) -> _FileLock:
        self._fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        if fcntl is not None:
            fcntl.flock(self._fd, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc) -> None:
        assert self._fd is not None
        if fcntl is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
        os.close(self._fd)
        self._fd = None


def _backup(path: Path, reason: str) -> Path:
    """Copy an unusable cache file aside before it is replaced; returns the copy's path."""
    stamp = datetime.datetime.now().strftime("%Y%m%dT%H%M%S")
    target = path.with_name(f"{path.name}.{reason}-{stamp}")
    n = 1
    while target.exists():
        target = path.with_name(f"{path.name}.{reason}-{stamp}-{n}")
        n += 1
    shutil.copy2(path, target)
    return target


def _file_mode(path: Path) -> int:
    """The mode the new file gets: the old file's, else rw-r--r--."""
    try:
        return path.stat().st_mode & 0o777
    except OSError:
        return 0o644


def _write_atomic(path: Path, entries: dict) -> None:
    """Write the whole file to a temporary sibling, fsync, and rename it over ``path``."""
    document = {"schema": SCHEMA, "version": CACHE_VERSION, "entries": dict(sorted(entries.items()))}
    mode = _file_mode(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, mode)  # mkstemp makes 0600; keep the cache's own mode
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(document, f, indent=2)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


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
            contents = _read_file(path)
            _warn_once(path, contents)
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

    >>> save_entries({cache_key(problem, device): make_entry(problem, device, cfg, 500.0, 600.0)})  # doctest: +SKIP
    """
    path = path or cache_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    with _FileLock(path):
        on_disk = _read_file(path)
        _warn_once(path, on_disk)
        if on_disk.problem is not None and path.exists():
            _backup(path, on_disk.problem)
        merged = {**on_disk.entries, **new_entries}
        _write_atomic(path, merged)
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
    config no longer validates (a changed budget or rule) counts as a miss.

    >>> lookup(GemmProblem(1000, 4096, 4096, dtype="float16", layout="NT"), device_info())  # doctest: +SKIP
    TileConfig(block_m=128, block_n=256, block_k=64, group_m=8, num_warps=8, num_stages=3)
    """
    store = _store_for(cache_path())
    key = cache_key(problem, device, kernel)
    try:
        return store.resolved[key]
    except KeyError:
        pass
    config = _config_of(store.entries.get(key), problem, device)
    store.resolved[key] = config
    return config


def _config_of(entry: dict | None, problem: GemmProblem, device: DeviceInfo) -> TileConfig | None:
    if entry is None or not isinstance(entry.get("config"), dict):
        return None
    try:
        config = TileConfig.from_dict(entry["config"])
        return config.validate(device, problem.elem_size, problem.acc_size)
    except (ConfigError, TypeError):
        return None


__all__ = [
    "CACHE_VERSION",
    "SCHEMA",
    "TuningCacheWarning",
    "bucket",
    "cache_key",
    "cache_path",
    "load",
    "lookup",
    "make_entry",
    "record",
    "reload",
    "save_entries",
]
