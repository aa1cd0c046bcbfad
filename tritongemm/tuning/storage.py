"""The tuning cache's file: its format, reading it without ever raising, and writing it safely.

Several processes may tune at once and a process may die mid-write: a writer
takes an exclusive lock beside the file, merges, writes a temporary sibling,
fsyncs and renames it over the cache, so a reader sees the old file or the new
one, never a torn one.  A file that cannot be used (corrupt, foreign, stale)
is warned about once, copied aside before it is replaced, and otherwise ignored.
A file of an older version that ``MIGRATIONS`` knows is read in the current
format, and the next save writes it so.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import shutil
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path

import filelock

from ..planning.configs import ConfigError, migrate_kernel_flags

SCHEMA = "tritongemm-tuning-cache"
#: 2: a config names its kernel (``TileConfig.kernel``); 1 had the booleans ``tma``, ``persistent``,
#: ``warp_specialize`` and ``gemv`` instead.
CACHE_VERSION = 2

#: Seconds to wait for another process's lock.  A writer holds it only while it
#: reads and rewrites a small JSON file, so a longer wait means a lock left
#: behind (a soft lock of a crashed process, where ``flock`` is missing).
LOCK_TIMEOUT_S = 60.0


class TuningCacheWarning(UserWarning):
    """A cache file that could not be used (corrupt, foreign or stale)."""


# ----------------------------------------------------------------------------------
# Reading a file: never raises
# ----------------------------------------------------------------------------------
@dataclass
class FileContents:
    entries: dict
    #: None when the file was usable (or missing); else "corrupt", "foreign" or "stale".
    problem: str | None = None
    detail: str = ""


def _entries_from_v1(entries: dict) -> dict:
    """Version-1 entries with each config's kernel booleans turned into its ``kernel``.  A config that
    cannot be turned (a flag that is no bool, a broken rule) is kept as it is, for the lookup to name."""
    migrated = {}
    for key, entry in entries.items():
        config = entry.get("config")
        if isinstance(config, dict):
            try:
                entry = {**entry, "config": migrate_kernel_flags(config)}
            except ConfigError:
                pass
        migrated[key] = entry
    return migrated


#: Older versions this tritongemm reads, each with its migration of the entries to ``CACHE_VERSION``.
MIGRATIONS = {1: _entries_from_v1}


def read_file(path: Path) -> FileContents:
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return FileContents({})
    except OSError as exc:
        return FileContents({}, "unreadable", str(exc))
    try:
        data = json.loads(raw.decode("utf-8"))
    except Exception as exc:  # any parser failure (RecursionError on deep nesting too) is a corrupt file
        return FileContents({}, "corrupt", f"not valid JSON ({type(exc).__name__}: {first_line(exc)})")
    if (
        not isinstance(data, dict)
        or data.get("schema") != SCHEMA
        or not isinstance(data.get("entries"), dict)
    ):
        return FileContents({}, "foreign", f"not a {SCHEMA} file")
    version = data.get("version")
    known = type(version) is int and (version == CACHE_VERSION or version in MIGRATIONS)  # (not JSON's true)
    if not known:
        readable = ", ".join(str(v) for v in (CACHE_VERSION, *sorted(MIGRATIONS)))
        return FileContents({}, "stale", f"schema version {version!r}, this tritongemm reads {readable}")
    entries = {k: v for k, v in data["entries"].items() if isinstance(k, str) and isinstance(v, dict)}
    if version != CACHE_VERSION:
        entries = MIGRATIONS[version](entries)
    return FileContents(entries)


def first_line(exc: BaseException) -> str:
    text = str(exc)
    return text.splitlines()[0][:200] if text else ""


_warned_paths: set[Path] = set()


def warn_once(path: Path, contents: FileContents) -> None:
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
def lock_for(path: Path) -> filelock.BaseFileLock:
    """An exclusive lock on ``<cache>.lock``: a separate file, since the cache itself is replaced.

    ``filelock`` takes an ``flock`` where the OS has one (released by the OS if
    the process dies) and falls back to a lock file created exclusively.
    """
    return filelock.FileLock(str(path.with_name(path.name + ".lock")), timeout=LOCK_TIMEOUT_S)


def backup(path: Path, reason: str) -> Path:
    """Copy an unusable cache file aside before it is replaced; returns the copy's path."""
    stamp = datetime.datetime.now().strftime("%Y%m%dT%H%M%S")
    target = path.with_name(f"{path.name}.{reason}-{stamp}")
    n = 1
    while target.exists():
        target = path.with_name(f"{path.name}.{reason}-{stamp}-{n}")
        n += 1
    shutil.copy2(path, target)
    return target


def file_mode(path: Path) -> int:
    """The mode the new file gets: the old file's, else rw-r--r--."""
    try:
        return path.stat().st_mode & 0o777
    except OSError:
        return 0o644


def write_atomic(path: Path, entries: dict) -> None:
    """Write the whole file to a temporary sibling, fsync, and rename it over ``path``."""
    document = {"schema": SCHEMA, "version": CACHE_VERSION, "entries": dict(sorted(entries.items()))}
    mode = file_mode(path)
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
