"""The autotuner: time a problem's candidate configs against torch.matmul, keep the fastest.

For each problem:

1. build random operands in the problem's dtype and layout, several copies
   so that consecutive timed calls rotate through more memory than L2 holds;
2. time ``torch.matmul`` on the same operands (the cuBLAS baseline);
3. for each candidate (the heuristic's choice first, then
   ``candidate_configs``): run it once on NaN-filled output and compare with
   ``torch.matmul``, rejecting wrong results; then take the median time
   (``triton.testing.do_bench``);
4. stop when the time budget is spent; the fastest correct candidate wins and
   is written to the on-disk cache.

On Triton's CPU interpreter times say nothing about a GPU: there ``tune``
only checks that each candidate runs and is correct (step 3 without the
timing), says so with a ``TimingsMeaninglessWarning``, and writes nothing.
A cache that cannot be written (a read-only directory) costs the cache entry,
not the results: ``tune`` warns, and returns them with ``save_error`` set.
"""

from __future__ import annotations

import sys
import time
import warnings
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

from .. import launch
from ..device import DeviceInfo, device_info, interpreter_enabled
from ..planning.configs import ConfigError, TileConfig
from ..planning.heuristics import heuristic_config
from ..planning.problem import GemmProblem
from . import cache
from .measure import (
    DEFAULT_BENCH_MS,
    KERNEL_LAUNCHERS,
    Operands,
    Rotation,
    check_result,
    copies_for,
    launch_torch,
    make_operands,
    median_ms,
    reference,
)
from .progress import ProgressBar
from .space import candidate_configs

#: Seconds one problem may take before the remaining candidates are skipped.
#: Most of it goes to compiling candidates (Triton caches those on disk, and a
#: config compiled for one shape is reused by shapes of the same alignment).
DEFAULT_BUDGET_S = 30.0


class TimingsMeaninglessWarning(UserWarning):
    """Tuning on Triton's CPU interpreter: candidates are checked for correctness, not timed or saved."""


INTERPRETER_NOTE = (
    "on Triton's CPU interpreter timings are meaningless (they say nothing about a GPU): "
    "candidates are only checked to run and to be correct; nothing is timed or written to the tuning cache"
)

Candidates = Sequence[TileConfig | dict] | Callable[[GemmProblem, DeviceInfo], Iterable[TileConfig]] | None


@dataclass(frozen=True)
class CandidateResult:
    """One candidate's outcome: a median time (None when not timed), or why it was rejected."""

    config: TileConfig
    ms: float | None = None
    error: str | None = None


@dataclass
class TuneResult:
    """What tuning one problem found.

    >>> result.best.short(), round(result.tflops), round(result.torch_tflops)  # doctest: +SKIP
    ('128x256x64 g8 w8 s3', 612, 655)
    """

    problem: GemmProblem
    key: str
    best: TileConfig | None
    ms: float | None
    torch_ms: float | None
    candidates: list[CandidateResult] = field(default_factory=list)
    timed_out: bool = False
    seconds: float = 0.0
    saved: bool = False
    #: False on the interpreter: candidates were only checked, ``best`` is None.
    timed: bool = True
    #: Why the result is not in the cache although saving was asked for (e.g. a read-only directory).
    save_error: str | None = None

    @property
    def tflops(self) -> float | None:
        return _tflops(self.problem, self.ms)

    @property
    def torch_tflops(self) -> float | None:
        return _tflops(self.problem, self.torch_ms)

    @property
    def rejected(self) -> list[CandidateResult]:
        return [c for c in self.candidates if c.error is not None]

    @property
    def correct(self) -> list[CandidateResult]:
        return [c for c in self.candidates if c.error is None]


def _tflops(problem: GemmProblem, ms: float | None) -> float | None:
    if ms is None or ms <= 0:
        return None
    return problem.flops / (ms * 1e9)


def _try_candidate(
    config: TileConfig,
    launcher: Callable[[TileConfig], Callable[[Operands], None]],
    copies: list[Operands],
    ref: torch.Tensor,
    problem: GemmProblem,
    on_cuda: bool,
    bench_ms: int,
    timed: bool = True,
) -> CandidateResult:
    launch = launcher(config)
    try:
        first = copies[0]
        first.out.fill_(float("nan"))  # every element must be written
        launch(first)  # also compiles
        error = check_result(first.out, ref, problem.dtype)
        if error is not None:
            return CandidateResult(config, error=error)
        if not timed:
            return CandidateResult(config)
        return CandidateResult(config, ms=median_ms(Rotation(copies, launch), on_cuda, bench_ms))
    except Exception as exc:  # a compile failure or out-of-resources rejects one candidate, not the run
        return CandidateResult(
            config, error=f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        )


# ----------------------------------------------------------------------------------
# Candidates
# ----------------------------------------------------------------------------------
def candidates_for(
    problem: GemmProblem, device: DeviceInfo, candidates: Candidates = None, max_candidates: int | None = None
) -> list[TileConfig]:
    """The configs to try, in order: the heuristic's choice first, then ``candidate_configs``.

    ``candidates`` replaces the space (a list of TileConfigs/dicts, or a
    function of problem and device); configs that do not fit are dropped.

    >>> candidates_for(GemmProblem(32, 32, 32, dtype="float32"), INTERPRETER_DEVICE, max_candidates=2)  # doctest: +SKIP
    """
    if candidates is None:
        first = heuristic_config(problem, device)
        space = [first] + [c for c in candidate_configs(problem, device) if c != first]
    elif callable(candidates):
        space = list(candidates(problem, device))
    else:
        space = [c if isinstance(c, TileConfig) else TileConfig.from_dict(c) for c in candidates]
    fitting = []
    for config in space:
        try:
            fitting.append(config.validate(device, problem.elem_size, problem.acc_size))
        except ConfigError:
            continue
    return fitting[:max_candidates] if max_candidates is not None else fitting


# ----------------------------------------------------------------------------------
# Tuning
# ----------------------------------------------------------------------------------
def timings_are_meaningful(device: DeviceInfo) -> bool:
    """Do times measured on ``device`` say anything about a GPU?  Not on Triton's CPU interpreter."""
    return not device.interpreter


def torch_device_for(device: DeviceInfo) -> torch.device:
    """Where tuning ``device`` runs; ``RuntimeError`` (one line, saying what to do) when it cannot run."""
    if device.interpreter:
        if not interpreter_enabled():
            raise RuntimeError(
                "no CUDA GPU to tune on, and Triton's CPU interpreter is off (with TRITON_INTERPRET=1 set "
                "before tritongemm is imported, tune checks that configs run correctly on the CPU, untimed)"
            )
        return torch.device("cpu")
    return torch.device("cuda", torch.cuda.current_device())


def tune_problem(
    problem: GemmProblem,
    device: DeviceInfo,
    candidates: list[TileConfig],
    *,
    kernel: str = "pointer",
    time_budget_s: float = DEFAULT_BUDGET_S,
    bench_ms: int = DEFAULT_BENCH_MS,
    seed: int = 0,
    on_candidate: Callable[[int, int], None] | None = None,
    timed: bool = True,
) -> TuneResult:
    """Time ``candidates`` on one problem; nothing is saved (``tune`` does that).

    With ``timed=False`` candidates are only run and checked (no times, no ``best``).
    The returned problem (and key) carry the layout ``dispatch`` will see for
    these operands (for M = 1 a transposed A is also row-major, hence "N").
    """
    if kernel not in KERNEL_LAUNCHERS:
        raise ValueError(f"tune: unknown kernel {kernel!r}; known: {', '.join(sorted(KERNEL_LAUNCHERS))}")
    start = time.perf_counter()
    torch_device = torch_device_for(device)
    on_cuda = torch_device.type == "cuda"
    copies = make_operands(problem, torch_device, copies_for(problem, on_cuda), seed)
    seen_as = _as_dispatch_sees(problem, copies[0])
    ref = reference(copies[0])
    torch_ms = _torch_ms(copies, on_cuda, bench_ms) if timed else None

    results: list[CandidateResult] = []
    timed_out = False
    for i, config in enumerate(candidates):
        if results and _budget_spent(time.perf_counter() - start, time_budget_s, results):
            timed_out = True
            break
        if on_candidate is not None:
            on_candidate(i, len(candidates))
        results.append(
            _try_candidate(config, KERNEL_LAUNCHERS[kernel], copies, ref, problem, on_cuda, bench_ms, timed)
        )
    measured = [r for r in results if r.ms is not None]
    best = min(measured, key=lambda r: r.ms) if measured else None
    return TuneResult(
        problem=seen_as,
        key=cache.cache_key(seen_as, device, kernel),
        best=best.config if best else None,
        ms=best.ms if best else None,
        torch_ms=torch_ms,
        candidates=results,
        timed_out=timed_out,
        seconds=time.perf_counter() - start,
        timed=timed,
    )


def _torch_ms(copies: list[Operands], on_cuda: bool, bench_ms: int) -> float | None:
    """torch's time on the problem, or None where torch does not take it (``torch._scaled_mm`` wants
    A row-major and B column-major on CUDA)."""
    try:
        return median_ms(Rotation(copies, launch_torch), on_cuda, bench_ms)
    except RuntimeError:
        if not copies[0].scales:
            raise
        return None


def _budget_spent(elapsed: float, budget: float, results: list[CandidateResult]) -> bool:
    """Out of time: past the budget with a correct candidate, or past twice the budget without one."""
    have_correct = any(r.error is None for r in results)
    return elapsed > budget if have_correct else elapsed > 2 * budget


def _as_dispatch_sees(problem: GemmProblem, ops: Operands) -> GemmProblem:
    """``problem`` with the layout ``dispatch`` computes from these operands' strides."""
    layout = launch.problem_of(ops.a, ops.b).layout
    return GemmProblem(problem.m, problem.n, problem.k, problem.batch, problem.dtype, layout)


def as_problem(problem: GemmProblem | Sequence[int]) -> GemmProblem:
    """A GemmProblem, or (m, n, k) / (m, n, k, batch) as a float16 "NN" problem."""
    if isinstance(problem, GemmProblem):
        return problem
    return GemmProblem(*(int(x) for x in problem))


def _unique(problems: Iterable[GemmProblem], device: DeviceInfo, kernel: str) -> list[GemmProblem]:
    """Drop problems whose cache key an earlier one already has (e.g. M=1000 after M=1024)."""
    seen, unique = set(), []
    for problem in problems:
        key = cache.cache_key(problem, device, kernel)
        if key not in seen:
            seen.add(key)
            unique.append(problem)
    return unique


def describe_problem(problem: GemmProblem) -> str:
    """``'4096x4096x4096 float16 NT'`` (``x8`` appended for a batch of 8)."""
    batch = f"x{problem.batch}" if problem.batch > 1 else ""
    return f"{problem.m}x{problem.n}x{problem.k}{batch} {problem.dtype} {problem.layout}"


def tune(
    problems: Iterable[GemmProblem | Sequence[int]],
    *,
    device: DeviceInfo | None = None,
    candidates: Candidates = None,
    max_candidates: int | None = None,
    time_budget_s: float = DEFAULT_BUDGET_S,
    bench_ms: int = DEFAULT_BENCH_MS,
    save: bool = True,
    cache_file: str | Path | None = None,
    progress: bool | None = None,
    kernel: str = "pointer",
    seed: int = 0,
) -> list[TuneResult]:
    """Tune each problem and write the winners to the on-disk cache; returns one result per problem.

    ``progress`` draws a bar on stderr (default: when stderr is a terminal).
    Problems that share a cache key (M bucketed to a power of two) are tuned once.
    On Triton's CPU interpreter candidates are only checked, nothing is saved
    (``TimingsMeaninglessWarning``).  When the cache cannot be written the
    results are still returned, with ``save_error`` (``TuningCacheWarning``).
    Without a GPU or the interpreter: ``RuntimeError`` before any work.

    >>> tritongemm.tune([GemmProblem(4096, 4096, 4096, dtype="bfloat16", layout="NT")])  # doctest: +SKIP
    """
    device = device or device_info()
    torch_device_for(device)  # no GPU and no interpreter: say so before any work
    timed = timings_are_meaningful(device)
    if not timed:
        warnings.warn(f"tritongemm.tune: {INTERPRETER_NOTE}", TimingsMeaninglessWarning, stacklevel=2)
    path = Path(cache_file).expanduser() if cache_file is not None else None
    todo = _unique((as_problem(p) for p in problems), device, kernel)
    bar = ProgressBar(len(todo), enabled=sys.stderr.isatty() if progress is None else progress)
    results = []
    save_error = None  # after one failed save the rest are not tried (each could wait out the lock)
    try:
        for done, problem in enumerate(todo):
            label = describe_problem(problem)
            space = candidates_for(problem, device, candidates, max_candidates)
            bar.update(done, label)
            result = tune_problem(
                problem,
                device,
                space,
                kernel=kernel,
                time_budget_s=time_budget_s,
                bench_ms=bench_ms,
                seed=seed,
                on_candidate=_show_candidate(bar, done, label),
                timed=timed,
            )
            if save and result.best is not None:
                if save_error is None:
                    save_error = _save(result, device, kernel, path)
                result.save_error = save_error
            results.append(result)
            bar.step(done + 1, label)
    finally:
        bar.close()
    return results


def _save(result: TuneResult, device: DeviceInfo, kernel: str, path: Path | None) -> str | None:
    """Write ``result``'s winner to the cache; returns why it could not be written, or None."""
    entry = cache.make_entry(result.problem, device, result.best, result.tflops, result.torch_tflops, kernel)
    try:
        cache.save_entries({result.key: entry}, path)
    except OSError as exc:  # read-only directory, full disk, lock held too long: keep the results
        reason = f"{type(exc).__name__}: {exc}"
        warnings.warn(
            f"tritongemm.tune: could not write the tuning cache {path or cache.cache_path()} ({reason}); "
            "the results are returned (and printed by the CLI) but not saved",
            cache.TuningCacheWarning,
            stacklevel=3,
        )
        return reason
    result.saved = True
    launch.clear_plan_cache()  # cached launch plans may hold the config this entry replaces
    return None


def _show_candidate(bar: ProgressBar, done: int, label: str) -> Callable[[int, int], None]:
    return lambda i, n: bar.update(done, label, f"candidate {i + 1}/{n}")


__all__ = [
    "CandidateResult",
    "DEFAULT_BUDGET_S",
    "TimingsMeaninglessWarning",
    "TuneResult",
    "candidates_for",
    "describe_problem",
    "timings_are_meaningful",
    "torch_device_for",
    "tune",
    "tune_problem",
]
