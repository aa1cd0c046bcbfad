"""A new user's first hour: the README's quickstarts run as pasted, the wheel holds
what it should (one version, the console script, py.typed, the licence), the
supported-version check names what is wrong, and every ``TRITONGEMM_*`` variable
the package reads is documented.
"""

import importlib
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import tritongemm
import tritongemm.__main__
from tritongemm import _compat, _version

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    tomllib = pytest.importorskip("tomli", reason="reading pyproject.toml needs tomllib (3.11+) or tomli")

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))


def _python_blocks() -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", README, flags=re.S | re.M)


def _quickstart(kind: str) -> str:
    """The README's quickstart block for "cpu" (it sets TRITON_INTERPRET) or "cuda"."""
    sets_interpreter = 'os.environ["TRITON_INTERPRET"] = "1"'
    if kind == "cpu":
        blocks = [b for b in _python_blocks() if sets_interpreter in b]
    else:
        blocks = [b for b in _python_blocks() if 'device="cuda"' in b and sets_interpreter not in b]
    assert len(blocks) == 1, f"expected one {kind} quickstart block in README.md, found {len(blocks)}"
    return blocks[0]


def _run_as_pasted(code: str, tmp_path: Path, *, interpreter_from_env: bool) -> subprocess.CompletedProcess:
    script = tmp_path / "quickstart.py"
    script.write_text(code, encoding="utf-8")
    env = dict(os.environ)
    if not interpreter_from_env:
        env.pop("TRITON_INTERPRET", None)  # the block has to set it (or not need it) itself
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env.pop("TRITONGEMM_CACHE_FILE", None)
    env["TRITONGEMM_CACHE_DIR"] = str(tmp_path / "cache")  # never the user's own tuning cache
    return subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900
    )


def _interpreter_cannot_run() -> str | None:
    """Why Triton's interpreter cannot run here (the pair the README says needs numpy < 2.4)."""
    import numpy
    import triton

    triton_release, numpy_release = _compat._release(triton.__version__), _compat._release(numpy.__version__)
    if triton_release and numpy_release and triton_release < (3, 7) and numpy_release >= (2, 4):
        return (
            f"Triton {triton.__version__}'s interpreter needs numpy < 2.4, this is numpy {numpy.__version__}"
        )
    return None


@pytest.mark.heavy
def test_readme_cpu_quickstart_runs_as_pasted(tmp_path):
    if reason := _interpreter_cannot_run():
        pytest.skip(reason)
    result = _run_as_pasted(_quickstart("cpu"), tmp_path, interpreter_from_env=False)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    assert result.stdout.splitlines()[-1] == "ok"
    assert "served" in result.stdout  # patch() routed the model's linears


@pytest.mark.gpu
def test_readme_cuda_quickstart_runs_as_pasted(tmp_path):
    result = _run_as_pasted(_quickstart("cuda"), tmp_path, interpreter_from_env=False)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]


# ----------------------------------------------------------------------------------
# Supported versions
# ----------------------------------------------------------------------------------
def test_installed_versions_pass_the_check():
    _compat.check_versions()


@pytest.mark.parametrize(
    ("torch_version", "triton_version", "named"),
    [
        ("2.13.0+cpu", "3.0.0", ["triton 3.0.0", "wrong products"]),
        ("2.13.0+cpu", "3.4.0", ["triton 3.4.0", "float64"]),
        ("2.13.0+cpu", "3.5.1", ["triton 3.5.1", "interpreter"]),
        ("2.4.1", "3.6.0", ["torch 2.4.1"]),
        ("2.9.1+cu128", "3.5.0", ["torch 2.9.1+cu128", "triton 3.5.0"]),
    ],
)
def test_unsupported_versions_raise_naming_installed_and_supported(torch_version, triton_version, named):
    with pytest.raises(ImportError) as info:
        _compat.check_versions(torch_version, triton_version)
    message = str(info.value)
    for text in [*named, "torch >= 2.10", "triton >= 3.6"]:
        assert text in message


@pytest.mark.parametrize(
    ("torch_version", "triton_version"),
    [
        ("2.11.0+cu130", "3.6.0"),  # the GPU image
        ("2.13.0+cpu", "3.9.0"),  # CI
        ("2.10.0a0+git1234abc", "3.6.0+gitdeadbeef"),
        ("3.0.0", "4.2.0"),  # newer than tested: let through
        ("local-build", "unknown"),  # unreadable: benefit of the doubt
    ],
)
def test_supported_versions_pass(torch_version, triton_version):
    _compat.check_versions(torch_version, triton_version)


def test_declared_floors_match_the_runtime_check():
    floors = {}
    for requirement in PYPROJECT["project"]["dependencies"]:
        match = re.fullmatch(r"(torch|triton)>=(\d+)\.(\d+)", requirement.replace(" ", ""))
        if match:
            floors[match[1]] = (int(match[2]), int(match[3]))
    assert floors == {"torch": _compat.MIN_TORCH, "triton": _compat.MIN_TRITON}


# ----------------------------------------------------------------------------------
# Packaging
# ----------------------------------------------------------------------------------
def test_one_version():
    assert PYPROJECT["project"]["dynamic"] == ["version"] and "version" not in PYPROJECT["project"]
    attr = PYPROJECT["tool"]["setuptools"]["dynamic"]["version"]["attr"]
    assert attr == "tritongemm._version.__version__"
    assert tritongemm.__version__ == _version.__version__


def test_console_script_is_the_module_entry():
    target = PYPROJECT["project"]["scripts"]["tritongemm"]
    module, _, name = target.partition(":")
    assert getattr(importlib.import_module(module), name) is tritongemm.__main__.main


@pytest.mark.heavy
def test_wheel_contents(tmp_path):
    """Build the wheel from a copy of the sources with the installed setuptools (no network)."""
    setuptools = pytest.importorskip("setuptools")
    if tuple(int(p) for p in setuptools.__version__.split(".")[:2]) < (77, 0):
        pytest.skip(f"building needs setuptools >= 77 (SPDX licence), found {setuptools.__version__}")
    src = tmp_path / "src"
    shutil.copytree(ROOT / "tritongemm", src / "tritongemm", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(ROOT / name, src / name)
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-build-isolation",
            "--no-deps",
            "-q",
            "-w",
            str(tmp_path),
            str(src),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    (wheel,) = tmp_path.glob("tritongemm-*.whl")
    assert wheel.name.startswith(f"tritongemm-{_version.__version__}-")
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        dist_info = next(n.split("/")[0] for n in names if n.endswith(".dist-info/METADATA"))
        metadata = zf.read(f"{dist_info}/METADATA").decode()
        entry_points = zf.read(f"{dist_info}/entry_points.txt").decode()
    assert "tritongemm/py.typed" in names and "tritongemm/_version.py" in names
    assert "tritongemm/launch/csrc/entry_node.cpp" in names, "the C++ node is built from the installed source"
    assert any(n.endswith("dist-info/licenses/LICENSE") for n in names)
    assert {n.split("/")[0] for n in names} == {"tritongemm", dist_info}  # no benchmarks/, tests/
    assert f"Version: {_version.__version__}\n" in metadata and "License-Expression: MIT" in metadata
    for requirement in ("numpy", "filelock", "platformdirs", "tqdm"):
        assert f"Requires-Dist: {requirement}" in metadata
    assert 'Requires-Dist: timm; extra == "models"' in metadata
    assert "tritongemm = tritongemm.cli.main:main" in entry_points


def test_every_environment_variable_is_documented():
    section = (ROOT / "docs" / "environment.md").read_text(encoding="utf-8")
    assert "docs/environment.md" in README
    read = set()
    for path in (ROOT / "tritongemm").rglob("*.py"):
        read |= set(re.findall(r"TRITONGEMM_[A-Z0-9_]+", path.read_text(encoding="utf-8")))
    assert read, "no TRITONGEMM_ variables found: the scan is broken"
    assert not {name for name in read if f"`{name}`" not in section}


@pytest.mark.heavy
def test_offline_compile_builds_every_kernel_for_sm90(tmp_path):
    """``tools/offline_compile.py`` compiles every kernel family for sm_90 under the installed Triton
    (an empty Triton cache: each case goes through the whole pipeline down to ptxas)."""
    env = dict(os.environ, TRITON_CACHE_DIR=str(tmp_path / "cache"))
    env.pop("TRITON_INTERPRET", None)
    result = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "offline_compile.py")],
        capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path,
    )  # fmt: skip
    cases = re.findall(r"^(OK|FAIL) +(\S+)", result.stdout, flags=re.M)
    failed = [name for status, name in cases if status == "FAIL"]
    assert result.returncode == 0 and not failed, f"failed: {failed}\n{result.stdout[-4000:]}"
    families = {name.split("-")[0] for _, name in cases}
    assert families == {"ptr", "gemv", "streamk", "tma"}, families
