"""``tritongemm`` (or ``python -m tritongemm``): tune shapes, explain a choice, show the cache.

    tritongemm tune --shape 4096x4096x4096 --dtype fp16,bf16 --layout NN,TN
    tritongemm tune --preset llama3-8b --tokens 1,16,128,1024,4096,8192 --dtype bf16
    tritongemm tune --shapes-file shapes.csv          # columns m,n,k[,batch,dtype,layout]
    tritongemm explain --shape 1000x4096x4096 --dtype bf16 --layout NT --device h100
    tritongemm cache

Every subcommand takes a shape as ``--shape MxNxK`` (a bare ``MxNxK`` is
accepted too).  Without a CUDA GPU ``tune`` only runs on Triton's CPU interpreter
(``TRITON_INTERPRET=1``), where it checks that candidates run and are correct
but times nothing and writes nothing; with neither it exits with one line.
"""

from __future__ import annotations

import argparse
import csv
import os
import sys
import warnings
from collections.abc import Sequence
from pathlib import Path

from ..device import KNOWN_DEVICES, DeviceInfo, device_info, named_device
from ..launch import native
from ..planning.configs import TileConfig
from ..planning.problem import GemmProblem
from ..tuning import cache, measure, presets, report, tuner
from .arguments import (
    DEFAULT_LAYOUT,
    DTYPE_HELP,
    LAYOUT_HELP,
    ShapesFileError,
    comma_list,
    device_name,
    negative_shapes_as_values,
    parse_dtype,
    parse_layout,
    parse_shape,
    positive_int,
    preset_name,
    problems_from_args,
    read_shapes_file,
)

#: The kernel ``tune`` times configs on, named in cache keys (dispatch looks its entries up for every kernel).
TUNED_KERNEL = "pointer"


# ----------------------------------------------------------------------------------
# The parser
# ----------------------------------------------------------------------------------
def program_name(argv0: str | None = None) -> str:
    """The command as the user typed it, for usage and error lines: ``python -m tritongemm`` when
    ``argv0`` (default ``sys.argv[0]``) is this package's ``__main__.py``, the script's name when it
    is a ``tritongemm`` script (the console script), else ``tritongemm``."""
    argv0 = sys.argv[0] if argv0 is None else argv0
    path = os.path.normpath(argv0 or "")
    if os.path.basename(path) == "__main__.py" and os.path.basename(os.path.dirname(path)) == "tritongemm":
        return "python -m tritongemm"
    name = os.path.basename(path)
    return name if name.startswith("tritongemm") else "tritongemm"


def _add_shape_options(
    parser: argparse.ArgumentParser, help: str, positional_dest: str, repeat: bool
) -> None:
    """``--shape MxNxK`` (the documented spelling), and bare ``MxNxK`` arguments, accepted but not listed."""
    parser.add_argument(
        "--shape",
        type=parse_shape,
        action="append" if repeat else "store",
        default=[] if repeat else None,
        metavar="MxNxK",
        help=help,
    )
    parser.add_argument(
        positional_dest, type=parse_shape, nargs="*" if repeat else "?", help=argparse.SUPPRESS
    )


def build_parser(prog: str | None = None) -> argparse.ArgumentParser:
    """The parser; ``prog`` names the command in usage lines (default: ``program_name()``)."""
    parser = argparse.ArgumentParser(prog=prog or program_name(), description="tritongemm tools")
    commands = parser.add_subparsers(dest="command", required=True)

    tune = commands.add_parser(
        "tune",
        help="tune shapes and write the winners to the cache (on the CPU interpreter: only check configs)",
    )
    source = tune.add_argument_group("what to tune (any mix)")
    _add_shape_options(
        source, "a GEMM shape M x N x K, e.g. 4096x4096x4096 (repeatable)", "bare_shapes", repeat=True
    )
    source.add_argument(
        "--preset",
        type=preset_name,
        action="append",
        default=[],
        help=f"linear layers of a model: {', '.join(sorted(presets.PRESETS))} (repeatable)",
    )
    source.add_argument(
        "--tokens",
        type=comma_list(positive_int),
        default=list(presets.DEFAULT_TOKENS),
        help="token counts M for presets (default: %(default)s)",
    )
    source.add_argument(
        "--split-projections",
        action="store_true",
        help="presets: separate q/k/v and gate/up projections (as HF transformers runs them) "
        "instead of fused QKV and gate_up",
    )
    source.add_argument(
        "--shapes-file",
        action="append",
        default=[],
        metavar="CSV",
        help="CSV with columns m,n,k[,batch,dtype,layout] (repeatable)",
    )
    source.add_argument(
        "--dtype",
        type=comma_list(parse_dtype),
        default=None,
        help=f"comma list of {DTYPE_HELP} (default: fp16)",
    )
    source.add_argument(
        "--layout",
        type=comma_list(parse_layout),
        default=None,
        help=f"comma list of {LAYOUT_HELP} (default: NN; NT for presets)",
    )
    how = tune.add_argument_group("how")
    how.add_argument(
        "--max-candidates",
        type=positive_int,
        default=None,
        help="try at most this many configs per shape (the heuristic's first)",
    )
    how.add_argument(
        "--budget",
        type=float,
        default=tuner.DEFAULT_BUDGET_S,
        metavar="SECONDS",
        help="time box per shape (default: %(default)s)",
    )
    how.add_argument(
        "--bench-ms",
        type=positive_int,
        default=measure.DEFAULT_BENCH_MS,
        help="timed repetitions per candidate, in ms (default: %(default)s)",
    )
    how.add_argument("--cache-file", default=None, help=f"cache file (default: {cache.cache_path()})")
    how.add_argument("--no-save", action="store_true", help="do not write the cache")
    how.add_argument("--csv", default=None, metavar="PATH", help="also write the results as CSV")
    how.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    tune.set_defaults(usage_error=tune.error)

    explain = commands.add_parser("explain", help="show the config dispatch picks for a shape, and why")
    _add_shape_options(
        explain, "the GEMM shape M x N x K, e.g. 1000x4096x4096 (required)", "bare_shape", repeat=False
    )
    explain.add_argument("--dtype", type=parse_dtype, default="float16", help=f"{DTYPE_HELP} (default: fp16)")
    explain.add_argument(
        "--layout",
        type=parse_layout,
        default=DEFAULT_LAYOUT,
        help=f"{LAYOUT_HELP} (default: {DEFAULT_LAYOUT})",
    )
    explain.add_argument("--batch", type=positive_int, default=1, help="batch count (default: 1)")
    explain.add_argument(
        "--device",
        type=device_name,
        default=None,
        metavar="NAME",
        help=f"plan for a named GPU's budgets instead of this machine's: {', '.join(KNOWN_DEVICES)}",
    )
    explain.set_defaults(usage_error=explain.error)

    show = commands.add_parser("cache", help="show the cache file and its entries")
    show.add_argument("--cache-file", default=None, help=f"cache file (default: {cache.cache_path()})")

    build = commands.add_parser(
        "native", help="build the C++ autograd node now (else built in the background on first use)"
    )
    build.add_argument("--force", action="store_true", help="rebuild, also after a failed build")
    return parser


# ----------------------------------------------------------------------------------
# Commands
# ----------------------------------------------------------------------------------
def run_tune(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    try:
        problems = problems_from_args(args)
    except ShapesFileError as exc:
        args.usage_error(str(exc))
    if not problems:
        args.usage_error("nothing to tune; give --shape, --preset or --shapes-file")
    device = device_info()
    try:
        tuner.torch_device_for(device)
    except RuntimeError as exc:  # no GPU, no interpreter: one line, not a traceback
        print(f"{parser.prog} tune: error: {exc}", file=sys.stderr)
        return 1
    timed = tuner.timings_are_meaningful(device)
    if timed:
        print(
            f"tuning {len(problems)} shape(s) on {device.name} (sm_{device.capability[0]}{device.capability[1]}, "
            f"triton {cache.TRITON_VERSION})",
            file=sys.stderr,
        )
    else:
        print(f"checking {len(problems)} shape(s): {tuner.INTERPRETER_NOTE}", file=sys.stderr)
    cache_file = Path(args.cache_file).expanduser() if args.cache_file else cache.cache_path()
    with warnings.catch_warnings():  # both are said below, in plain lines
        warnings.simplefilter("ignore", tuner.TimingsMeaninglessWarning)
        warnings.filterwarnings("ignore", "tritongemm.tune: could not write", cache.TuningCacheWarning)
        results = tuner.tune(
            problems,
            device=device,
            max_candidates=args.max_candidates,
            time_budget_s=args.budget,
            bench_ms=args.bench_ms,
            save=not args.no_save,
            cache_file=cache_file,
            progress=not args.no_progress,
        )
    print(report.format_table(results))
    rejections = report.format_rejections(results)
    if rejections:
        print("\nrejected candidates:\n" + rejections)
    save_errors = [r.save_error for r in results if r.save_error]
    if save_errors:
        print(
            f"\nNOT SAVED: could not write the cache {cache_file} ({save_errors[0]}); "
            "the results above are all there is",
            file=sys.stderr,
        )
    elif not timed:
        print("\nnothing written to the cache: timings on the interpreter are meaningless", file=sys.stderr)
    elif not args.no_save:
        print(f"\ncache: {cache_file}")
    if args.csv:
        write_csv(results, args.csv, device)
    return 0 if all(r.correct for r in results) and not save_errors else 1


def write_csv(results: Sequence[tuner.TuneResult], path: str | Path, device: DeviceInfo) -> None:
    """One tidy row per problem, with the environment, so results are data."""
    import torch

    from .. import __version__

    config_fields = list(TileConfig().to_dict())
    header = [
        "m",
        "n",
        "k",
        "batch",
        "dtype",
        "layout",
        *config_fields,
        "ms",
        "tflops",
        "torch_ms",
        "torch_tflops",
        "candidates",
        "rejected",
        "timed_out",
        "gpu",
        "capability",
        "triton",
        "torch",
        "tritongemm",
    ]
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(header)
        for r in results:
            p = r.problem
            config = r.best.to_dict() if r.best else {}
            writer.writerow(
                [
                    p.m,
                    p.n,
                    p.k,
                    p.batch,
                    p.dtype,
                    p.layout,
                    *(config.get(c, "") for c in config_fields),
                    r.ms,
                    r.tflops,
                    r.torch_ms,
                    r.torch_tflops,
                    len(r.candidates),
                    len(r.rejected),
                    r.timed_out,
                    device.name,
                    "{}.{}".format(*device.capability),
                    cache.TRITON_VERSION,
                    torch.__version__,
                    __version__,
                ]
            )


def run_explain(args: argparse.Namespace) -> int:
    """The same ``explain`` as the Python API (it validates like a real call and says why, fallbacks included)."""
    from ..frontend.explain import explain_problem

    shape = args.shape or args.bare_shape
    if shape is None:
        args.usage_error("no shape; give --shape MxNxK, e.g. --shape 1000x4096x4096")
    if args.shape and args.bare_shape and args.shape != args.bare_shape:
        args.usage_error("two shapes; give one, as --shape MxNxK")
    m, n, k = shape
    problem = GemmProblem(m, n, k, args.batch, args.dtype, args.layout)
    device = named_device(args.device) if args.device else device_info()
    plan = explain_problem(problem, device)
    # Configs are tuned (and looked up) under the kernel they were timed on; the plan may run them on another.
    key = cache.cache_key(problem, device, TUNED_KERNEL)
    if device.interpreter:
        print(
            "device : no GPU in use: planned for Triton's CPU interpreter (its own small tiles); "
            f"--device NAME plans for a GPU ({', '.join(KNOWN_DEVICES)})"
        )
    print(plan.describe())
    print(f"cache  : {cache.cache_path()}")
    if plan.kernel == TUNED_KERNEL:
        print(f"key    : {key}")
    else:
        print(
            f"key    : {key} (configs are tuned on the {TUNED_KERNEL} kernel; this plan runs {plan.kernel})"
        )
    if plan.source.startswith("tuning cache"):
        entry = cache.load().get(key, {})
        print(
            f"source : tuned ({entry.get('tflops')} TFLOP/s vs torch {entry.get('torch_tflops')}, "
            f"at {entry.get('timestamp')})"
        )
    elif plan.source.startswith("heuristic"):
        print("source : heuristic (no tuned entry for this key)")
    print(plan.config.describe(problem.elem_size))
    return 0


def run_cache(args: argparse.Namespace) -> int:
    path = Path(args.cache_file).expanduser() if args.cache_file else cache.cache_path()
    entries = cache.load(path)
    print(f"{path}: {len(entries)} entries")
    for key, entry in sorted(entries.items()):
        print(
            f"  {key}  ->  {_short(entry.get('config'))}  {entry.get('tflops')} TFLOP/s (torch {entry.get('torch_tflops')})"
        )
    return 0


def _short(config) -> str:
    """The config in short, or why dispatch ignores it."""
    reason = cache.config_fields_problem(config) if isinstance(config, dict) else "not an object"
    if reason is None:
        try:
            return TileConfig.from_dict(config).short()
        except Exception as exc:
            reason = str(exc)
    return f"(ignored: {reason})"


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``tritongemm`` and ``python -m tritongemm``; returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(negative_shapes_as_values(sys.argv[1:] if argv is None else argv))
    if args.command == "tune":
        return run_tune(args, parser)
    if args.command == "explain":
        return run_explain(args)
    if args.command == "native":
        return run_native(args)
    return run_cache(args)


def run_native(args: argparse.Namespace) -> int:
    try:
        path = native.build(force=args.force)
    except native.NativeBuildError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    print(f"C++ autograd node: {path}")
    return 0


__all__ = ["build_parser", "main", "parse_shape", "problems_from_args", "program_name", "read_shapes_file"]
