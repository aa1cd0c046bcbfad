"""The on-disk tuning cache: keys, round trip, recovery from bad files, two writers at once.

Every test points TRITONGEMM_CACHE_DIR at its own tmp_path, so no test sees
another's file (or the user's real cache).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
import warnings
from dataclasses import replace
from pathlib import Path

import pytest

from tritongemm.configs import GemmProblem, TileConfig
from tritongemm.device import INTERPRETER_DEVICE
from tritongemm.tuning import cache

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
def test_cache_path_follows_env_vars(tmp_path, monkeypatch):
    monkeypatch.delenv("TRITONGEMM_CACHE_FILE", raising=False)
    monkeypatch.delenv("TRITONGEMM_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache.cache_path() == tmp_path / "xdg" / "tritongemm" / cache.CACHE_FILENAME
    monkeypatch.setenv("TRITONGEMM_CACHE_DIR", str(tmp_path / "dir"))
    assert cache.cache_path() == tmp_path / "dir" / cache.CACHE_FILENAME
    monkeypatch.setenv("TRITONGEMM_CACHE_FILE", str(tmp_path / "mine.json"))
    assert cache.cache_path() == tmp_path / "mine.json"


def test_cache_path_defaults_to_home_cache(tmp_path, monkeypatch):
    for var in ("TRITONGEMM_CACHE_FILE", "TRITONGEMM_CACHE_DIR", "XDG_CACHE_HOME"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert cache.cache_path() == tmp_path / ".cache" / "tritongemm" / cache.CACHE_FILENAME


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


def test_entries_whose_config_no_longer_validates_are_ignored(cache_dir):
    too_big = {"block_m": 256, "block_n": 256, "block_k": 128, "group_m": 8, "num_warps": 8, "num_stages": 6}
    unknown_field = {**CONFIG.to_dict(), "knob_from_the_future": 2}
    not_a_pow2 = {**CONFIG.to_dict(), "block_m": 48}
    entries = {}
    for m, config in ((16, too_big), (32, unknown_field), (64, not_a_pow2), (128, "garbage")):
        entry = cache.make_entry(problem(m=m), DEVICE, CONFIG, 1.0, 1.0)
        entry["config"] = config
        entries[cache.cache_key(problem(m=m), DEVICE)] = entry
    cache.save_entries(entries)
    cache.reload()
    for m in (16, 32, 64, 128):
        assert cache.lookup(problem(m=m), DEVICE) is None


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
    names = sorted(p.name for p in cache_dir.iterdir())
    assert names == [cache.CACHE_FILENAME, cache.CACHE_FILENAME + ".lock"]


# ----------------------------------------------------------------------------------
# Bad files: one warning, a miss, a backup, and the next save works
# ----------------------------------------------------------------------------------
BAD_FILES = {
    "garbage_bytes": (b"\x00\xff\xfe garbage \x81\x82", "corrupt"),
    "truncated_json": (b'{"schema": "tritongemm-tuning-cache", "version": 1, "entries": {"a": {"con', "corrupt"),
    "empty_file": (b"", "corrupt"),
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
    from pathlib import Path
    from tritongemm.configs import GemmProblem, TileConfig
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


def test_two_processes_writing_at_once_keep_every_entry(cache_dir):
    sync_dir = cache_dir / "sync"
    sync_dir.mkdir()
    count = 40
    env = {**os.environ, "TRITONGEMM_CACHE_DIR": str(cache_dir), "TRITON_INTERPRET": "1"}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    writers = [
        subprocess.Popen([sys.executable, "-c", WRITER, str(tag), str(count), str(sync_dir)], env=env)
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
