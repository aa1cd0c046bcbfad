"""Test setup shared by every test file.

Before tritongemm (or anything ``@triton.jit``) is imported:
* ``TRITON_INTERPRET=1`` when there is no CUDA GPU: Triton decides at
  decoration time whether kernels run compiled or on its CPU interpreter;
* ``TRITONGEMM_POISON_OUTPUTS=1``: every output tritongemm allocates starts
  as NaN, so an element the kernel never writes fails the comparison;
* an empty tuning cache and no autotuning, so ``config=None`` means the
  heuristic whatever the machine has cached;
* the C++ autograd node (``tritongemm.launch.native``) built before any test runs
  (once; xdist workers wait on its lock and load it), so every test with
  grad runs it; ``grad_node`` runs a test with it and with the Python
  ``Function`` that stands in where it cannot be built.
  ``TRITONGEMM_NATIVE=0`` tests the Python ``Function`` alone.

Tests take their device from the ``device`` fixture ("cuda" when Triton
compiles for a GPU, else "cpu" on the interpreter); ``@pytest.mark.gpu`` tests
are skipped, with the reason shown, when Triton does not run on a GPU.

Two marks keep tests out of ``make test`` (skipped, with the reason shown,
unless ``-m`` names the mark; ``make test-all`` runs them after ``make test``):
``@pytest.mark.slow``, a full-size variant of a case the default run checks
more cheaply, or the rest of a parametrized grid whose covering subset it runs
(``grid_cases``; ``make test-slow``), and ``@pytest.mark.heavy``, a test that
starts other processes or tools (a subprocess, torch.distributed over gloo, a
wheel build, a notebook kernel).
"""

import atexit
import itertools
import os
import re
import shutil
import tempfile
import zlib
from collections.abc import Callable, Sequence

import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"
os.environ["TRITONGEMM_POISON_OUTPUTS"] = "1"
# Hermetic config choice: no tuning cache from the user's home, no autotuning
# (tests that exercise tuning point these at their own files).
_cache_dir = tempfile.mkdtemp(prefix="tritongemm-tests-")
atexit.register(shutil.rmtree, _cache_dir, ignore_errors=True)
os.environ["TRITONGEMM_CACHE_FILE"] = os.path.join(_cache_dir, "cache.json")
os.environ["TRITONGEMM_AUTOTUNE"] = "0"

import pytest  # noqa: E402

import tritongemm  # noqa: E402
from tritongemm import launch  # noqa: E402
from tritongemm.autograd import fastpath  # noqa: E402
from tritongemm.autograd.function import set_poison_outputs  # noqa: E402
from tritongemm.frontend import scaled  # noqa: E402
from tritongemm.launch import native  # noqa: E402
from tritongemm.testing import default_device  # noqa: E402

# tritongemm may have been imported before this file ran (a plugin, a
# benchmark helper): make sure the poisoning is on either way.
set_poison_outputs(True)

if not torch.cuda.is_available() and not tritongemm.interpreter_enabled():
    raise pytest.UsageError(
        "no CUDA GPU and tritongemm's kernels are compiled, not interpreted: Triton was imported "
        "before tests/conftest.py could set TRITON_INTERPRET=1; run with TRITON_INTERPRET=1 set"
    )


# Built here, not in the background, so that which autograd node a test runs does not depend on
# timing; a failed build fails test_native (its message has the compiler's output).
if native.ENABLED:
    try:
        native.build()
    except native.NativeBuildError:
        pass


#: The marks whose tests ``make test`` leaves out, with the reason its summary shows.
EXTRA_TIERS = {
    "slow": "slow: a full-size variant, or the rest of a grid, of a case checked more cheaply; "
    "run with `make test-slow`, `make test-all` or `pytest -m slow`",
    "heavy": "heavy: starts other processes or tools (subprocess, gloo, wheel build, notebook); "
    "run with `make test-all` or `pytest -m heavy`",
}


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a CUDA GPU with compiled Triton (skipped otherwise)")
    # (xdist registers it too; without xdist the mark does nothing, and must not warn)
    config.addinivalue_line("markers", "xdist_group(name): run on one xdist worker under --dist loadgroup")


def pytest_collection_modifyitems(config, items):
    # A skip with its reason rather than a deselection: xdist's summary does not count
    # deselected tests, and a user should see what the default run leaves out.
    named = set(re.findall(r"\w+", config.option.markexpr or ""))
    for mark, reason in EXTRA_TIERS.items():
        if mark in named:
            continue
        skip = pytest.mark.skip(reason=reason)
        for item in items:
            if item.get_closest_marker(mark) is not None:
                item.add_marker(skip)
    if default_device().type == "cuda":
        return
    why = (
        "needs a CUDA GPU with compiled Triton kernels "
        f"(cuda available: {torch.cuda.is_available()}, interpreter: {tritongemm.interpreter_enabled()})"
    )
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(pytest.mark.skip(reason=why))


def grid_cases(
    axes: dict[str, Sequence],
    keep: Callable[..., bool],
    ids: dict[str, Callable] | None = None,
) -> list:
    """Every combination of ``axes`` (argument name -> values) as ``pytest.param``s, for one
    ``parametrize(", ".join(axes), ...)``; an axis named ``"a, b"`` has tuples as values.

    ``keep`` is called with the combination's indices, in axis order; the combinations it rejects
    are marked ``slow``, so the default run checks the subset it picks (which should still meet
    every value of every axis) and ``make test-slow`` / ``make test-all`` the whole grid.  Ids join
    the values' ids (``ids[name](value)``, else ``str``) in axis order, as stacked ``parametrize``
    decorators would, the one nearest the function first.
    """
    ids = ids or {}
    cases = []
    for index in itertools.product(*(range(len(values)) for values in axes.values())):
        values, names = [], []
        for (name, axis), i in zip(axes.items(), index):
            value = axis[i]
            values += list(value) if "," in name else [value]
            names.append(ids.get(name, str)(value))
        marks = () if keep(*index) else (pytest.mark.slow,)
        cases.append(pytest.param(*values, id="-".join(names), marks=marks))
    return cases


@pytest.fixture
def device() -> torch.device:
    """ "cuda" when Triton compiles for the GPU, else "cpu" (Triton's interpreter)."""
    return default_device()


@pytest.fixture(autouse=True)
def _seed(request):
    """A fixed seed per test (from its id), so a failure reproduces alone and under xdist."""
    torch.manual_seed(zlib.crc32(request.node.nodeid.encode()))


@pytest.fixture
def aot_targets():
    """(backend, targets): a ``torch.compile`` backend that runs AOTAutograd and records the target of
    every call in the forward and backward graphs it compiles, and that list of targets."""
    targets: list[str] = []

    def backend(gm, example_inputs):
        from torch._functorch.aot_autograd import aot_module_simplified

        def record(g, _):
            targets.extend(str(n.target) for n in g.graph.nodes if n.op == "call_function")
            return g.forward

        return aot_module_simplified(gm, example_inputs, fw_compiler=record, bw_compiler=record)

    return backend, targets


@pytest.fixture
def plans(monkeypatch):
    """Records every GEMM the library runs, as a dict (config, kernel, M, N, K, dtype).

    Wraps ``launch.gemm`` (where every first call goes) and asks
    ``launch.plan_for`` what it runs (launchers are cached, so a spy on the
    planner itself would miss repeated signatures), and the fast path's
    ``Entry`` and its gradient launches (where repeated calls and their
    backward go), which know their launchers' plans.
    """
    records = []
    real_gemm = launch.gemm

    def spy(call, a, b, out, *rest):
        if out.numel() > 0:
            chosen = launch.plan_for(call, a, b, out)
            records.append(
                dict(
                    config=chosen.config,
                    kernel=chosen.kernel,
                    M=a.shape[-2],
                    N=b.shape[-1],
                    K=a.shape[-1],
                    dtype=a.dtype,
                )
            )
        return real_gemm(call, a, b, out, *rest)

    monkeypatch.setattr(launch, "gemm", spy)

    # A repeated call runs from its fast-path entry, which holds its launcher (and plan) directly.
    real_entry_run = fastpath.Entry.run

    def entry_spy(entry, x, w, bias):
        chosen = entry.launcher.plan
        records.append(
            dict(
                config=chosen.config,
                kernel=chosen.kernel,
                M=entry.mn[0],
                N=entry.mn[1],
                K=x.shape[-1],
                dtype=x.dtype,
            )
        )
        return real_entry_run(entry, x, w, bias)

    monkeypatch.setattr(fastpath.Entry, "run", entry_spy)

    # ... and its backward, from the gradient launchers the entry holds.
    real_grad_call = fastpath._GradLaunch.__call__

    def grad_spy(grad_launch, operands):
        chosen = grad_launch.launcher.plan
        p = chosen.problem
        records.append(
            dict(config=chosen.config, kernel=chosen.kernel, M=p.m, N=p.n, K=p.k, dtype=grad_launch.dtype)
        )
        return real_grad_call(grad_launch, operands)

    monkeypatch.setattr(fastpath._GradLaunch, "__call__", grad_spy)
    # fp8's repeated calls are neither remembered nor found while recording (one an earlier test
    # remembered would launch directly): each reaches ``launch.gemm``.
    monkeypatch.setattr(scaled, "_remember", lambda *args: None)
    monkeypatch.setattr(scaled, "_fast_key", lambda *args: None)
    return records


def require_native() -> None:
    """Fail where the C++ node does not build, unless ``TRITONGEMM_NATIVE=0`` says it is not wanted (a skip)."""
    if not native.ENABLED:
        pytest.skip("TRITONGEMM_NATIVE=0: the C++ autograd node is switched off")
    native.build()  # raises NativeBuildError with the compiler's output


def grad_fn_name(fn) -> str:
    """The name of a ``grad_fn``: the class of a Python ``Function``'s node (torch 2.11 refuses
    ``name()`` there), ``name()`` of a C++ node (whose class is the generic ``CppFunction``)."""
    if isinstance(fn, torch.autograd.function.BackwardCFunction):
        return type(fn).__name__
    return fn.name()


@pytest.fixture(params=["cpp-node", "function"])
def grad_node(request, monkeypatch):
    """Runs a test with the fast path's C++ autograd node, casts and keys, then with the Python
    ``Function``, ``Tensor.to`` and key tuples."""
    if request.param == "cpp-node":
        require_native()
    else:
        monkeypatch.setattr(native, "RECORD", None)
        monkeypatch.setattr(native, "CAST", None)  # autocast casts in Python too
        monkeypatch.setattr(native, "SIGNATURE", None)  # and keys
        monkeypatch.setattr(native, "ENABLED", False)  # no background build either
    return request.param


@pytest.fixture
def restore_tf32():
    """Put torch's TF32 switches back as they were after the test."""
    matmul = torch.backends.cuda.matmul
    saved_allow = matmul.allow_tf32
    saved_precision = getattr(matmul, "fp32_precision", None)
    yield
    matmul.allow_tf32 = saved_allow
    if saved_precision is not None:
        matmul.fp32_precision = saved_precision
