"""The frame shared by the suites that time a few implementations of one operation on cases of their
own (``mlp``, ``epilogue`` and, where it is the same, ``fp8``), so that each of them says only what
is its own: its cases, its implementations, its rows, its title and figures.

* ``gated``: the gate of one implementation turned into its error or ``failed_gate`` row;
* ``not_run``: a case's rows when its inputs could not be made (e.g. out of memory);
* ``timed_rows``: a case's gated implementations timed in interleaved rounds, then their rows;
* ``measure_all``: every case one after the other, with a progress bar on stderr;
* ``impl_table``: each implementation's time and torch's time / its time, a line per case;
* ``cuda_device``, ``measure_and_write``, ``report_failed`` and ``run_cli``: the command line,
  from the GPU check to the exit status.

Kept apart from ``harness.py`` (the timing and gate core every suite uses) to keep that module to
its size; like it, nothing here needs a GPU until a run asks for one.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import torch

from . import harness

#: ``on_step(label)``: one run of a case (an implementation, or a recipe and implementation) begins.
OnStep = Callable[[str], None]


def gated(row: dict, check: Callable[[], harness.GateResult], device: torch.device) -> dict | None:
    """Run ``check`` (the gate, and so also the first calls, which compile the kernels).

    None when the implementation passed, ``rel_err`` and ``tol`` then added to ``row``; else its
    finished row: ``error`` (the exception's message) or ``failed_gate`` (the gate's reason)."""
    try:
        result = check()
        harness._synchronize(device)
    except Exception as exc:
        return {**row, "status": harness.ERROR, "message": harness._short_error(exc)}
    row.update(rel_err=result.rel_err, tol=result.tol)
    if not result.ok:
        return {**row, "status": harness.FAILED_GATE, "message": result.reason}
    return None


def not_run(runs: Iterable[tuple[str, dict]], exc: BaseException, on_step: OnStep) -> list[dict]:
    """The rows of a case whose inputs could not be made: each (label, row) of ``runs`` recorded as an
    error that names ``exc``, and still a step of the progress bar (its total counts every run)."""
    rows = []
    for label, row in runs:
        on_step(label)
        rows.append({**row, "status": harness.ERROR, "message": "inputs: " + harness._short_error(exc)})
    return rows


def timed_rows(
    slots: list,
    device: torch.device,
    rounds: int,
    warmup_ms: float,
    rep_ms: float,
    note: str | None = None,
) -> list[dict]:
    """A case's rows: the ``Prepared`` of ``slots`` timed in interleaved rounds (the others are
    finished rows already), ``note`` the message of every row timed, then TFLOP/s, GB/s and torch's
    time / each one's.

    ``slots`` is emptied once timed: its steps hold the case's inputs and weights, which must be
    freed before the allocator's cache is emptied for the next case -- so the caller passes the
    list and keeps no other name for those tensors."""
    harness.time_interleaved(slots, device, rounds, warmup_ms, rep_ms)
    rows = [harness.finish(slot, device) if isinstance(slot, harness.Prepared) else slot for slot in slots]
    if note is not None:
        for row in rows:
            if row.get("status") == harness.OK:
                row["message"] = note
    slots.clear()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    harness._finish_rows(rows)
    return rows


def measure_all(
    case_list: Sequence[Any],
    runs_per_case: int,
    measure: Callable[..., list[dict]],
    progress: bool = True,
) -> list[dict]:
    """``measure(case, on_step=...)`` for every case of ``case_list``, one after the other, with a
    progress bar on stderr of ``runs_per_case`` steps a case; their rows, in order."""
    from tritongemm.tuning.progress import ProgressBar  # here, not at import: see benchmarks/__init__.py

    bar = ProgressBar(len(case_list) * runs_per_case, enabled=progress, unit="runs")
    done = 0

    def on_step(label: str) -> None:
        nonlocal done
        done += 1
        bar.step(done, label)

    rows: list[dict] = []
    for case in case_list:
        rows += measure(case, on_step=on_step)
    bar.close()
    return rows


def impl_table(
    rows: Sequence[dict], suite: str, impls: Sequence[Any], keys: Sequence[str] = ("case",)
) -> str:
    """One line per distinct ``keys`` of ``suite``'s rows: each of ``impls``' time (its status where
    it was not timed), and for each that is not torch's baseline (family ``cublas``) torch's time /
    its time."""
    by_line: dict[tuple, dict[str, dict]] = {}
    for r in rows:
        if r.get("suite") == suite:
            by_line.setdefault(tuple(r[k] for k in keys), {})[r["impl"]] = r
    lines = []
    for values, by_impl in by_line.items():
        line: dict = dict(zip(keys, values))
        for impl in impls:
            r = by_impl.get(impl.name, {})
            ok = r.get("status") == harness.OK
            line[impl.name] = r.get("ms") if ok else r.get("status")
            if impl.family != "cublas":
                line[impl.name + " x"] = r.get("speedup_vs_cublas") if ok else None
        lines.append(line)
    columns = [(k, k) for k in keys]
    for impl in impls:
        columns.append((impl.name, f"{impl.name} ms"))
        if impl.family != "cublas":
            columns.append((impl.name + " x", "torch ms / its ms"))
    return harness.format_table(lines, columns)


# ----------------------------------------------------------------------------------
# Command line
# ----------------------------------------------------------------------------------
def cuda_device(suite: str) -> torch.device:
    """The GPU ``suite`` times on; RuntimeError where there is none (or the interpreter is on)."""
    import tritongemm

    if not torch.cuda.is_available() or tritongemm.interpreter_enabled():
        raise RuntimeError(f"the {suite} suite times compiled kernels on a CUDA GPU")
    return torch.device("cuda", torch.cuda.current_device())


def measure_and_write(
    args, suite: str, device: torch.device, run: Callable[..., list[dict]], extra: dict[str, Any]
) -> tuple[list[dict], Path, Path, dict[str, Any]]:
    """``run(device, rounds=, warmup_ms=, rep_ms=, progress=)`` with the command line's options, and
    its rows written to ``<suite>.csv`` under ``--out`` (default ``benchmarks/results/<gpu>/``), the
    sidecar holding the suite, the rounds and the L2 rotation factor, then ``extra``.

    Returns (rows, the CSV's path, the folder, the environment)."""
    env = harness.environment(device)
    out_dir = Path(args.out) if args.out else harness.default_results_dir(env)
    rounds = args.rounds or harness.ROUNDS
    rows = run(device, rounds=rounds, warmup_ms=args.warmup, rep_ms=args.rep, progress=not args.no_progress)
    sidecar = {"suite": suite, "rounds": rounds, "l2_rotation_factor": harness.L2_ROTATION_FACTOR, **extra}
    csv = harness.write_results(rows, out_dir / f"{suite}.csv", env, sidecar)
    return rows, csv, out_dir, env


def report_failed(rows: Sequence[dict], fields: Sequence[str] = ("case", "impl"), count: bool = False) -> int:
    """Print each row not measured, named by its ``fields``, with its status and message (after a
    line that counts them, with ``count``); the exit status: 1 if there was one, else 0."""
    failed = [r for r in rows if r.get("status") != harness.OK]
    if failed and count:
        print(f"{len(failed)} row(s) not measured:")
    for r in failed:
        print(f"  {' '.join(str(r[f]) for f in fields)}: {r['status']} {r.get('message', '')}")
    return 1 if failed else 0


def run_cli(
    args,
    suite: str,
    device: torch.device,
    run: Callable[..., list[dict]],
    extra: dict[str, Any],
    *,
    title: str,
    table: Callable[[Sequence[dict]], str],
    plot: Callable[[Path, Path], list[Path]],
    failed_fields: Sequence[str] = ("case", "impl"),
) -> int:
    """A suite's command line after the GPU check (``cuda_device``): measure and write its CSV
    (``measure_and_write``), print ``title`` (``{gpu}`` in it: the GPU's name) and its ``table``,
    draw its figures (``plot(csv, out_dir)``; a failure only skips them), list the rows not
    measured; the exit status (1: a row not measured)."""
    rows, csv, out_dir, env = measure_and_write(args, suite, device, run, extra)
    print(f"\n== {suite}: {title.format(gpu=env['gpu'])} ==")
    print(table(rows))
    print(f"wrote {csv}")
    if not args.no_plots:
        for f in harness.plot_safely(csv, out_dir, plot):
            print(f"wrote {f}")
    return report_failed(rows, failed_fields)


__all__ = [
    "cuda_device",
    "gated",
    "impl_table",
    "measure_all",
    "measure_and_write",
    "not_run",
    "report_failed",
    "run_cli",
    "timed_rows",
]
