"""The on-disk tuning cache: keys, round trip, recovery from bad files and entries, symlinks,
two writers at once.

Every test points TRITONGEMM_CACHE_DIR at its own tmp_path, so no test sees
another's file (or the user's real cache).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
import time
import warnings
from dataclasses import fields, replace
from pathlib import Path

import filelock
import platformdirs
import pytest
import torch

import tritongemm
from tritongemm import explain, launch
from tritongemm.device import INTERPRETER_DEVICE, device_info
from tritongemm.planning import heuristics
from tritongemm.planning.configs import TileConfig
from tritongemm.planning.problem import GemmProblem
from tritongemm.testing import assert_close, default_device
from tritongemm.tuning import cache, candidate_configs, storage

DEVICE = INTERPRETER_DEVICE
CONFIG = TileConfig(block_m=32, block_n=64, block_k=32, group_m=8, num_warps=4, num_stages=2)
OTHER_CONFIG = TileConfig(block_m=64, block_n=64, block_k=32, group_m=4, num_warps=4, num_stages=3)
REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def cache_dir(tmp_path, monkeypatch) -> Path:
    monkeypatch.delenv("TRITONGEMM_CACHE_FILE", raising=False)
    monkeypatch.setenv("TRITONGEMM_CACHE_DIR", str(tmp_path))
    return tmp_path


def problem(m=1024, n=4096, k=4096, dtype="float16", layout="NN", batch=1) -> GemmProblem:
    return GemmProblem(m=m, n=n, k=k, batch=batch, dtype=dtype, layout=layout)


def cache_file(cache_dir: Path) -> Path:
    return cache_dir / cache.CACHE_FILENAME


# ----------------------------------------------------------------------------------
# Where the file is
# ----------------------------------------------------------------------------------
def test_cache_path_env_vars_override_the_user_cache_dir(tmp_path, monkeypatch):
    monkeypatch.delenv("TRITONGEMM_CACHE_FILE", raising=False)
    monkeypatch.delenv("TRITONGEMM_CACHE_DIR", raising=False)
    default = Path(platformdirs.user_cache_dir("tritongemm", appauthor=False)) / cache.CACHE_FILENAME
    assert cache.cache_path() == default
    monkeypatch.setenv("TRITONGEMM_CACHE_DIR", str(tmp_path / "dir"))
    assert cache.cache_path() == tmp_path / "dir" / cache.CACHE_FILENAME
    monkeypatch.setenv("TRITONGEMM_CACHE_FILE", str(tmp_path / "mine.json"))
    assert cache.cache_path() == tmp_path / "mine.json"  # the file wins over the directory
    monkeypatch.setenv("TRITONGEMM_CACHE_FILE", "~/mine.json")
    assert cache.cache_path() == Path.home() / "mine.json"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="XDG_CACHE_HOME is the Linux convention")
def test_cache_path_follows_xdg_and_home_on_linux(tmp_path, monkeypatch):
    for var in ("TRITONGEMM_CACHE_FILE", "TRITONGEMM_CACHE_DIR", "XDG_CACHE_HOME"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert cache.cache_path() == tmp_path / ".cache" / "tritongemm" / cache.CACHE_FILENAME
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache.cache_path() == tmp_path / "xdg" / "tritongemm" / cache.CACHE_FILENAME


# ----------------------------------------------------------------------------------
# Keys
# ----------------------------------------------------------------------------------
@pytest.mark.parametrize("x, expected", [(1, 1), (2, 2), (3, 4), (1000, 1024), (1024, 1024), (1025, 2048)])
def test_bucket_rounds_up_to_power_of_two(x, expected):
    assert cache.bucket(x) == expected


def test_key_buckets_m_but_keeps_n_and_k_exact():
    key = cache.cache_key(problem(m=1000), DEVICE)
    assert cache.cache_key(problem(m=1024), DEVICE) == key
    assert cache.cache_key(problem(m=513), DEVICE) == key
    assert cache.cache_key(problem(m=1025), DEVICE) != key
    assert cache.cache_key(problem(m=512), DEVICE) != key
    assert cache.cache_key(problem(m=1000, n=4095), DEVICE) != key
    assert cache.cache_key(problem(m=1000, k=4095), DEVICE) != key


@pytest.mark.parametrize(
    "change",
    [{"dtype": "bfloat16"}, {"layout": "NT"}, {"batch": 2}],
    ids=["dtype", "layout", "batch"],
)
def test_key_separates_dtype_layout_and_batch(change):
    assert cache.cache_key(replace(problem(), **change), DEVICE) != cache.cache_key(problem(), DEVICE)


def test_key_names_device_capability_triton_and_kernel():
    key = cache.cache_key(problem(), DEVICE, kernel="pointer")
    assert DEVICE.name in key and "sm_90" in key and f"triton-{cache.TRITON_VERSION}" in key
    assert cache.cache_key(problem(), DEVICE, kernel="persistent") != key


# ----------------------------------------------------------------------------------
# Round trip
# ----------------------------------------------------------------------------------
def test_record_then_lookup_round_trips(cache_dir):
    key = cache.record(problem(m=1000), DEVICE, CONFIG, tflops=512.25, torch_tflops=600.5)
    cache.reload()  # drop the in-memory copy: the next lookup reads the file, as a new process would
    assert cache.lookup(problem(m=1000), DEVICE) == CONFIG
    document = json.loads(cache_file(cache_dir).read_text())
    assert document["schema"] == cache.SCHEMA and document["version"] == cache.CACHE_VERSION
    entry = document["entries"][key]
    assert entry["config"] == CONFIG.to_dict()
    assert entry["tflops"] == 512.25 and entry["torch_tflops"] == 600.5
    assert entry["tuned_shape"] == [1000, 4096, 4096, 1]
    assert entry["timestamp"]


def test_lookup_misses_without_a_file(cache_dir):
    assert cache.lookup(problem(), DEVICE) is None
    assert not cache_file(cache_dir).exists()  # lookup only reads


def test_lookup_hits_every_m_of_the_bucket(cache_dir):
    cache.record(problem(m=1024), DEVICE, CONFIG, 1.0)
    assert cache.lookup(problem(m=1000), DEVICE) == CONFIG
    assert cache.lookup(problem(m=513), DEVICE) == CONFIG
    assert cache.lookup(problem(m=1025), DEVICE) is None
    assert cache.lookup(problem(m=1000, n=4095), DEVICE) is None


def test_lookup_misses_on_another_gpu_or_triton_version(cache_dir, monkeypatch):
    cache.record(problem(), DEVICE, CONFIG, 1.0)
    assert cache.lookup(problem(), DEVICE) == CONFIG
    assert cache.lookup(problem(), replace(DEVICE, name="NVIDIA A100-SXM4-80GB")) is None
    assert cache.lookup(problem(), replace(DEVICE, capability=(8, 0))) is None
    assert cache.lookup(problem(), DEVICE, kernel="persistent") is None
    monkeypatch.setattr(cache, "TRITON_VERSION", "0.0.1")
    assert cache.lookup(problem(), DEVICE) is None


# ----------------------------------------------------------------------------------
# Bad entries: each is a miss with one warning naming it; dispatch uses the heuristic
# ----------------------------------------------------------------------------------
GOOD = CONFIG.to_dict()
BAD_CONFIGS = {
    "group_m_2_31": ({**GOOD, "group_m": 2**31}, "group_m=2147483648 is out of bounds"),
    "group_m_huge": ({**GOOD, "group_m": 10**30}, "group_m"),
    "group_m_zero": ({**GOOD, "group_m": 0}, "group_m=0 is out of bounds"),
    "block_m_huge_gemv": ({**GOOD, "block_m": 2**40, "num_stages": 1, "kernel": "gemv"}, "block_m"),
    "block_n_huge": ({**GOOD, "block_n": 2**20}, "block_n"),
    "block_k_negative": ({**GOOD, "block_k": -32}, "block_k"),
    "num_warps_64": ({**GOOD, "num_warps": 64}, "num_warps"),
    "num_warps_3": ({**GOOD, "num_warps": 3}, "num_warps"),
    "num_stages_99": ({**GOOD, "num_stages": 99}, "num_stages"),
    "split_k_1000": ({**GOOD, "split_k": 1000}, "split_k"),
    "cluster_m_8": ({**GOOD, "cluster_m": 8}, "cluster_m"),
    "cluster_n_0": ({**GOOD, "cluster_n": 0}, "cluster_n"),
    "block_m_float": ({**GOOD, "block_m": 32.0}, "block_m=32.0 must be an integer"),
    "block_m_string": ({**GOOD, "block_m": "32"}, "must be an integer"),
    "group_m_bool": ({**GOOD, "group_m": True}, "group_m=True must be an integer"),
    "group_m_null": ({**GOOD, "group_m": None}, "must be an integer"),
    "kernel_int": ({**GOOD, "kernel": 1}, "kernel=1 must be a string"),
    "kernel_unknown": ({**GOOD, "kernel": "cutlass"}, "kernel='cutlass' must be one of 'pointer', 'tma'"),
    # the booleans that named the kernel before (version 1), as TileConfig.from_dict still reads them
    "tma_string": ({**GOOD, "tma": "yes"}, "tma='yes' must be true or false"),
    "gemv_int": ({**GOOD, "gemv": 1}, "gemv=1 must be true or false"),
    "old_and_new_kernel": ({**GOOD, "tma": True}, "old kernel fields ['tma'] and kernel='pointer' together"),
    "missing_block_m": ({k: v for k, v in GOOD.items() if k != "block_m"}, "lacks block_m"),
    "unknown_field": ({**GOOD, "knob_from_the_future": 2}, "unknown fields"),
    "not_a_pow2": ({**GOOD, "block_m": 48}, "powers of two"),
    "too_big_for_smem": (
        {"block_m": 256, "block_n": 256, "block_k": 128, "group_m": 8, "num_warps": 8, "num_stages": 6},
        "shared memory",
    ),
    "broken_rule": ({**GOOD, "epilogue_subtile": True}, "needs a TMA kernel"),
    "broken_old_rule": (
        {**{k: v for k, v in GOOD.items() if k != "kernel"}, "persistent": True},
        "persistent=True needs tma=True",
    ),
    "config_is_a_string": ("garbage", "config is str"),
    "config_is_a_list": ([32, 64, 32], "config is list"),
}


def save_bad_entry(p: GemmProblem, config) -> str:
    entry = cache.make_entry(p, DEVICE, CONFIG, 1.0, 1.0)
    entry["config"] = config
    key = cache.cache_key(p, DEVICE)
    cache.save_entries({key: entry})
    cache.reload()
    return key


@pytest.mark.parametrize("config, why", BAD_CONFIGS.values(), ids=BAD_CONFIGS.keys())
def test_bad_entry_is_a_miss_with_one_warning(cache_dir, config, why):
    key = save_bad_entry(problem(), config)
    with pytest.warns(cache.TuningCacheWarning) as caught:
        assert cache.lookup(problem(), DEVICE) is None
    (warning,) = caught
    assert key in str(warning.message) and why in str(warning.message)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the second lookup of the key is silent
        assert cache.lookup(problem(m=1000), DEVICE) is None


def test_a_bad_entry_does_not_spoil_the_good_ones(cache_dir):
    cache.record(problem(m=16), DEVICE, CONFIG, 1.0)
    save_bad_entry(problem(m=32), {**GOOD, "group_m": 2**31})
    assert cache.lookup(problem(m=16), DEVICE) == CONFIG
    with pytest.warns(cache.TuningCacheWarning):
        assert cache.lookup(problem(m=32), DEVICE) is None


@pytest.mark.parametrize(
    "config",
    [BAD_CONFIGS["group_m_2_31"][0], BAD_CONFIGS["num_warps_64"][0], BAD_CONFIGS["block_m_huge_gemv"][0]],
    ids=["group_m", "num_warps", "gemv"],
)
def test_matmul_with_a_bad_entry_uses_the_heuristic(cache_dir, config):
    """A group_m of 2**31 passed validation once and broke every matmul of its shape."""
    device = default_device()
    a = torch.randn(24, 32, device=device)
    b = torch.randn(32, 40, device=device)
    p = launch.problem_of(a, b)
    entry = cache.make_entry(p, device_info(device), CONFIG, 1.0, 1.0)
    entry["config"] = config
    cache.save_entries({cache.cache_key(p, device_info(device)): entry})
    cache.reload()
    launch.clear_plan_cache()  # a plan cached by another test would skip the lookup
    with pytest.warns(cache.TuningCacheWarning, match="ignoring the tuned entry"):
        out = tritongemm.matmul(a, b)
    assert_close(out, a.double() @ b.double(), dtype=torch.float32)
    plan = explain(a, b)
    assert plan.source.startswith("heuristic") and plan.config == heuristics.heuristic_config(
        p, device_info(device)
    )


def test_config_bounds_cover_every_integer_field():
    ints = {f.name for f in fields(TileConfig) if type(getattr(TileConfig(), f.name)) is int}
    assert set(cache.CONFIG_BOUNDS) == ints


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
@pytest.mark.parametrize("m", [1, 16, 4096])
def test_config_bounds_admit_every_config_the_tuner_tries(m, dtype):
    p = problem(m=m, n=4096, k=8192, dtype=dtype)
    configs = list(candidate_configs(p, DEVICE)) + [heuristics.heuristic_config(p, DEVICE)]
    assert configs
    for config in configs:
        assert cache.config_fields_problem(config.to_dict()) is None, config


def test_save_merges_with_entries_another_process_wrote(cache_dir):
    cache.record(problem(m=16), DEVICE, CONFIG, 1.0)
    # Another process adds an entry behind our back; our in-memory copy does not have it.
    document = json.loads(cache_file(cache_dir).read_text())
    other_key = cache.cache_key(problem(m=32), DEVICE)
    document["entries"][other_key] = cache.make_entry(problem(m=32), DEVICE, OTHER_CONFIG, 2.0, 2.0)
    cache_file(cache_dir).write_text(json.dumps(document))
    cache.record(problem(m=64), DEVICE, CONFIG, 3.0)
    cache.reload()
    assert cache.lookup(problem(m=16), DEVICE) == CONFIG
    assert cache.lookup(problem(m=32), DEVICE) == OTHER_CONFIG
    assert cache.lookup(problem(m=64), DEVICE) == CONFIG


def test_newer_result_replaces_an_entry_of_the_same_key(cache_dir):
    cache.record(problem(m=1024), DEVICE, CONFIG, 1.0)
    cache.record(problem(m=1000), DEVICE, OTHER_CONFIG, 2.0)
    cache.reload()
    assert cache.lookup(problem(m=1024), DEVICE) == OTHER_CONFIG
    assert len(cache.load()) == 1


def test_save_keeps_a_readable_file_mode(cache_dir):
    cache.record(problem(m=16), DEVICE, CONFIG, 1.0)
    assert cache_file(cache_dir).stat().st_mode & 0o777 == 0o644
    cache_file(cache_dir).chmod(0o664)
    cache.record(problem(m=32), DEVICE, CONFIG, 1.0)
    assert cache_file(cache_dir).stat().st_mode & 0o777 == 0o664


def test_save_leaves_no_temporary_files(cache_dir):
    for m in (16, 32, 64):
        cache.record(problem(m=m), DEVICE, CONFIG, 1.0)
    names = {p.name for p in cache_dir.iterdir()} - {cache.CACHE_FILENAME + ".lock"}  # filelock may keep it
    assert names == {cache.CACHE_FILENAME}


# ----------------------------------------------------------------------------------
# Version 1: configs with the booleans that named the kernel, read as version 2
# ----------------------------------------------------------------------------------
def old_config(bm, bn, bk, g, warps, stages, **flags) -> dict:
    """A config as version 1 wrote it: every field, the kernel as four booleans."""
    old = dict(tma=False, persistent=False, warp_specialize=False, epilogue_subtile=False, pingpong=False)
    old.update(cluster_m=1, cluster_n=1, split_k=1, split_k_inline=False, stream_k=False, gemv=False)
    return {
        **dict(block_m=bm, block_n=bn, block_k=bk, group_m=g, num_warps=warps, num_stages=stages),
        **old,
        **flags,
    }


#: (m, the config as version 1 wrote it, the config it is now)
VERSION_1_ENTRIES = [
    (16, old_config(32, 64, 32, 8, 4, 2), TileConfig(32, 64, 32, 8, 4, 2)),
    (
        32,
        old_config(32, 64, 32, 8, 4, 2, split_k=4, split_k_inline=True),
        TileConfig(32, 64, 32, 8, 4, 2, split_k=4, split_k_inline=True),
    ),
    (64, old_config(64, 64, 32, 8, 4, 3, stream_k=True), TileConfig(64, 64, 32, 8, 4, 3, stream_k=True)),
    (
        128,
        old_config(64, 128, 64, 8, 4, 3, tma=True, epilogue_subtile=True),
        TileConfig(64, 128, 64, 8, 4, 3, kernel="tma", epilogue_subtile=True),
    ),
    (
        256,
        old_config(128, 128, 64, 8, 8, 4, tma=True, persistent=True, stream_k=True),
        TileConfig(128, 128, 64, 8, 8, 4, kernel="tma_persistent", stream_k=True),
    ),
    (
        512,
        old_config(64, 128, 64, 8, 4, 4, tma=True, persistent=True, warp_specialize=True, pingpong=True),
        TileConfig(64, 128, 64, 8, 4, 4, kernel="gluon_ws", pingpong=True),
    ),
    (
        1,
        old_config(16, 8, 1024, 8, 8, 1, gemv=True, split_k=2, split_k_inline=True),
        TileConfig(16, 8, 1024, 8, 8, 1, kernel="gemv", split_k=2, split_k_inline=True),
    ),
]


def write_version_1(path: Path, extra: dict | None = None) -> None:
    entries = {}
    for m, old, _ in VERSION_1_ENTRIES:
        entry = cache.make_entry(problem(m=m), DEVICE, CONFIG, 1.0, 2.0)
        entries[cache.cache_key(problem(m=m), DEVICE)] = {**entry, "config": old}
    entries.update(extra or {})
    path.write_text(json.dumps({"schema": cache.SCHEMA, "version": 1, "entries": entries}))


def test_a_version_1_file_loads_the_same_configs_and_is_rewritten_as_version_2(cache_dir):
    path = cache_file(cache_dir)
    write_version_1(path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # not stale: no warning, no backup
        for m, _, new in VERSION_1_ENTRIES:
            assert cache.lookup(problem(m=m), DEVICE) == new, m
        cache.record(problem(m=2048), DEVICE, OTHER_CONFIG, 3.0)  # any save rewrites the whole file
    assert list(cache_dir.glob(f"{cache.CACHE_FILENAME}.*-*")) == []
    document = json.loads(path.read_text())
    assert document["version"] == cache.CACHE_VERSION == 2
    for m, _, new in VERSION_1_ENTRIES:
        written = document["entries"][cache.cache_key(problem(m=m), DEVICE)]
        assert written["config"] == new.to_dict() and written["tflops"] == 1.0, m
    cache.reload()
    for m, _, new in VERSION_1_ENTRIES + [(2048, None, OTHER_CONFIG)]:
        assert cache.lookup(problem(m=m), DEVICE) == new, m


def test_a_version_1_entry_that_cannot_be_read_stays_a_miss_with_its_reason(cache_dir):
    """An entry whose old booleans break a rule is kept as it was; its lookup names the rule."""
    bad = cache.make_entry(problem(m=4096), DEVICE, CONFIG, 1.0, 1.0)
    bad["config"] = old_config(32, 64, 32, 8, 4, 2, persistent=True)
    bad_key = cache.cache_key(problem(m=4096), DEVICE)
    write_version_1(cache_file(cache_dir), {bad_key: bad})
    assert cache.lookup(problem(m=16), DEVICE) == VERSION_1_ENTRIES[0][2]
    with pytest.warns(cache.TuningCacheWarning, match="persistent=True needs tma=True"):
        assert cache.lookup(problem(m=4096), DEVICE) is None
    cache.record(problem(m=2048), DEVICE, OTHER_CONFIG, 3.0)
    assert json.loads(cache_file(cache_dir).read_text())["entries"][bad_key]["config"] == bad["config"]


@pytest.mark.parametrize("version", [True, "1", 1.0, [1], 3])
def test_only_known_integer_versions_are_read(cache_dir, version):
    path = cache_file(cache_dir)
    write_version_1(path)
    document = json.loads(path.read_text())
    path.write_text(json.dumps({**document, "version": version}))
    with pytest.warns(cache.TuningCacheWarning, match="stale file, schema version"):
        assert cache.lookup(problem(m=16), DEVICE) is None


# ----------------------------------------------------------------------------------
# A cache path that is a symbolic link
# ----------------------------------------------------------------------------------
@pytest.fixture
def linked_cache(tmp_path, monkeypatch) -> tuple[Path, Path]:
    """TRITONGEMM_CACHE_FILE is a link in one directory to a file in another."""
    target = tmp_path / "real" / "tuned.json"
    target.parent.mkdir()
    link = tmp_path / "links" / "cache.json"
    link.parent.mkdir()
    link.symlink_to(target)
    monkeypatch.delenv("TRITONGEMM_CACHE_DIR", raising=False)
    monkeypatch.setenv("TRITONGEMM_CACHE_FILE", str(link))
    return link, target


@pytest.mark.parametrize("target_exists", [True, False], ids=["target", "dangling"])
def test_save_through_a_symlink_writes_the_target_and_keeps_the_link(linked_cache, target_exists):
    link, target = linked_cache
    if target_exists:
        cache.record(problem(m=16), DEVICE, CONFIG, 1.0, path=target)
    cache.record(problem(m=32), DEVICE, OTHER_CONFIG, 1.0)
    assert link.is_symlink() and link.resolve() == target
    entries = json.loads(target.read_text())["entries"]
    assert len(entries) == (2 if target_exists else 1)
    cache.reload()
    assert cache.lookup(problem(m=32), DEVICE) == OTHER_CONFIG
    assert [p.name for p in link.parent.iterdir()] == [link.name]  # no lock, no temp file beside the link


def test_save_through_a_symlink_takes_the_targets_lock(linked_cache, monkeypatch):
    link, target = linked_cache
    monkeypatch.setattr(storage, "LOCK_TIMEOUT_S", 0.2)
    with filelock.FileLock(str(link.with_name(link.name + ".lock"))):
        cache.record(problem(m=16), DEVICE, CONFIG, 1.0)  # the link's lock file is nobody's
    failure: list[BaseException] = []

    def record_in_a_thread():  # a second lock object of this process conflicts like another process
        try:
            cache.record(problem(m=32), DEVICE, CONFIG, 1.0)
        except BaseException as exc:
            failure.append(exc)

    with filelock.FileLock(str(target.with_name(target.name + ".lock"))):
        writer = threading.Thread(target=record_in_a_thread)
        writer.start()
        writer.join(timeout=30)
    assert len(failure) == 1 and isinstance(failure[0], filelock.Timeout), failure
    assert len(json.loads(target.read_text())["entries"]) == 1  # the blocked write changed nothing


# ----------------------------------------------------------------------------------
# Bad files: one warning, a miss, a backup, and the next save works
# ----------------------------------------------------------------------------------
BAD_FILES = {
    "garbage_bytes": (b"\x00\xff\xfe garbage \x81\x82", "corrupt"),
    "truncated_json": (
        b'{"schema": "tritongemm-tuning-cache", "version": 1, "entries": {"a": {"con',
        "corrupt",
    ),
    "empty_file": (b"", "corrupt"),
    # json raises RecursionError, not ValueError, on deep nesting
    "deeply_nested": (b"[" * 100_000 + b"]" * 100_000, "corrupt"),
    "deeply_nested_entry": (
        b'{"schema": "tritongemm-tuning-cache", "version": 1, "entries": {"a": '
        + b"[" * 100_000
        + b"]" * 100_000
        + b"}}",
        "corrupt",
    ),
    "huge_integer": (b'{"entries": ' + b"9" * 10_000 + b"}", "corrupt"),
    "wrong_schema": (json.dumps({"hello": "world", "entries": {}}).encode(), "foreign"),
    "json_list": (b"[1, 2, 3]", "foreign"),
    "older_version": (
        json.dumps({"schema": cache.SCHEMA, "version": 0, "entries": {}}).encode(),
        "stale",
    ),
}


@pytest.mark.parametrize("content, reason", BAD_FILES.values(), ids=BAD_FILES.keys())
def test_bad_file_warns_once_misses_and_is_backed_up_on_save(cache_dir, content, reason):
    path = cache_file(cache_dir)
    path.write_bytes(content)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert cache.lookup(problem(), DEVICE) is None
        assert cache.lookup(problem(m=16), DEVICE) is None
        cache.record(problem(), DEVICE, CONFIG, 1.0)  # reads the bad file again, under the lock
    ours = [w for w in caught if issubclass(w.category, cache.TuningCacheWarning)]
    assert len(ours) == 1, [str(w.message) for w in ours]
    assert reason in str(ours[0].message) and str(path) in str(ours[0].message)
    backups = list(cache_dir.glob(f"{cache.CACHE_FILENAME}.{reason}-*"))
    assert len(backups) == 1 and backups[0].read_bytes() == content
    document = json.loads(path.read_text())
    assert document["schema"] == cache.SCHEMA and len(document["entries"]) == 1
    cache.reload()
    assert cache.lookup(problem(), DEVICE) == CONFIG


def test_good_file_keeps_no_backup(cache_dir):
    cache.record(problem(m=16), DEVICE, CONFIG, 1.0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # any warning fails the test
        cache.reload()
        cache.record(problem(m=32), DEVICE, CONFIG, 1.0)
    assert list(cache_dir.glob("*corrupt*")) == []


# ----------------------------------------------------------------------------------
# Two processes writing at once
# ----------------------------------------------------------------------------------
WRITER = textwrap.dedent(
    """
    import sys, time
    if sys.argv[4] == "no-fcntl":  # as on a system without flock: filelock falls back to a lock file
        sys.modules["fcntl"] = None
    from pathlib import Path
    from tritongemm.planning.configs import TileConfig
    from tritongemm.planning.problem import GemmProblem
    from tritongemm.device import INTERPRETER_DEVICE
    from tritongemm.tuning import cache

    tag, count, sync_dir = int(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3])
    (sync_dir / f"ready-{tag}").touch()
    while not (sync_dir / "go").exists():  # start both writers together
        time.sleep(0.001)
    config = TileConfig(32, 64, 32, 8, 4, 2)
    for i in range(count):
        problem = GemmProblem(m=16, n=64 * (i + 1), k=1000 + tag, dtype="float16", layout="NN")
        cache.record(problem, INTERPRETER_DEVICE, config, tflops=float(i), torch_tflops=1.0)
    """
)


@pytest.mark.heavy
@pytest.mark.parametrize("locking", ["fcntl", "no-fcntl"])
def test_two_processes_writing_at_once_keep_every_entry(cache_dir, locking):
    sync_dir = cache_dir / "sync"
    sync_dir.mkdir()
    count = 40
    env = {**os.environ, "TRITONGEMM_CACHE_DIR": str(cache_dir), "TRITON_INTERPRET": "1"}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    writers = [
        subprocess.Popen(
            [sys.executable, "-c", WRITER, str(tag), str(count), str(sync_dir), locking], env=env
        )
        for tag in (1, 2)
    ]
    deadline = time.monotonic() + 120
    while not all((sync_dir / f"ready-{tag}").exists() for tag in (1, 2)):
        assert time.monotonic() < deadline and all(w.poll() is None for w in writers), "writers did not start"
        time.sleep(0.01)
    (sync_dir / "go").touch()
    assert [w.wait(timeout=120) for w in writers] == [0, 0]
    document = json.loads(cache_file(cache_dir).read_text())  # valid JSON
    ks = sorted({e["tuned_shape"][2] for e in document["entries"].values()})
    assert ks == [1001, 1002]
    assert len(document["entries"]) == 2 * count
    leftovers = [p.name for p in cache_dir.iterdir() if p.name.endswith(".tmp")]
    assert leftovers == []
