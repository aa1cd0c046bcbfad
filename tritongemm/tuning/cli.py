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
import re
import sys
import warnings
from collections.abc import Sequence
from pathlib import Path

from .. import native
from ..configs import GemmProblem, TileConfig
from ..device import KNOWN_DEVICES, DeviceInfo, device_info, named_device
from . import cache, presets, tuner

DTYPE_ALIASES = {
    "fp16": "float16",
    "f16": "float16",
    "half": "float16",
    "float16": "float16",
    "bf16": "bfloat16",
    "bfloat16": "bfloat16",
    "fp32": "float32",
    "f32": "float32",
    "float": "float32",
    "float32": "float32",
    "fp64": "float64",
    "f64": "float64",
    "double": "float64",
    "float64": "float64",
}
LAYOUTS = ("NN", "NT", "TN", "TT")
DTYPE_HELP = "fp16, bf16, fp32 or fp64 (also float16, half, bfloat16, float, double, ...)"
LAYOUT_HELP = "NN, NT, TN or TT: A's then B's storage, N row-major, T transposed (nn.Linear is NT)"
#: Layout of explicit shapes when --layout is not given (presets use nn.Linear's "NT").
DEFAULT_LAYOUT = "NN"
SHAPES_FILE_COLUMNS = ("m", "n", "k", "batch", "dtype", "layout")
#: The kernel ``tune`` times configs on, named in cache keys (dispatch looks its entries up for every kernel).
TUNED_KERNEL = "pointer"


# ----------------------------------------------------------------------------------
# Parsing values
# ----------------------------------------------------------------------------------
def parse_shape(text: str) -> tuple[int, int, int]:
    """``'4096x4096x1024'`` -> (M, N, K).

    >>> parse_shape("1x4096x14336")
    (1, 4096, 14336)
    """
    parts = text.lower().replace("*", "x").split("x")
    try:
        m, n, k = (int(p) for p in parts)
    except ValueError:
        raise argparse.ArgumentTypeError(f"bad shape {text!r}: expected MxNxK, e.g. 4096x4096x4096") from None
    for name, size in zip("MNK", (m, n, k)):
        if size < 1:
            raise argparse.ArgumentTypeError(
                f"bad shape {text!r}: {name} = {size} is not a size (must be >= 1)"
            )
    return m, n, k


#: A shape whose first size is negative: argparse would take "-4096x..." for an option.
_NEGATIVE_SHAPE = re.compile(r"-\d+[xX*]")


def _negative_shapes_as_values(argv: Sequence[str]) -> list[str]:
    """``--shape -4096x...`` and a bare ``-4096x...`` as ``--shape=-4096x...``, so that the
    shape's parser says which size is wrong instead of argparse reporting a missing shape."""
    out: list[str] = []
    for arg in argv:
        if _NEGATIVE_SHAPE.match(arg) and ({"tune", "explain"} & set(out)):
            if out[-1] == "--shape":
                out.pop()
            out.append(f"--shape={arg}")
        else:
            out.append(arg)
    return out


def parse_dtype(text: str) -> str:
    """``'bf16'`` -> ``'bfloat16'``."""
    name = DTYPE_ALIASES.get(text.strip().lower())
    if name is None:
        raise argparse.ArgumentTypeError(f"unknown dtype {text!r}; use fp16, bf16, fp32 or fp64")
    return name


def parse_layout(text: str) -> str:
    layout = text.strip().upper()
    if layout not in LAYOUTS:
        raise argparse.ArgumentTypeError(f"unknown layout {text!r}; use one of {', '.join(LAYOUTS)}")
    return layout


def _comma_list(parse_one):
    """An argparse type for ``a,b,c`` lists of ``parse_one`` values."""

    def parse(text: str) -> list:
        items = [t for t in text.split(",") if t.strip()]
        if not items:
            raise argparse.ArgumentTypeError(f"empty list {text!r}")
        return [parse_one(t) for t in items]

    return parse


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be >= 1")
    return value


def _device_name(text: str) -> str:
    name = text.strip().lower()
    if name not in KNOWN_DEVICES:
        raise argparse.ArgumentTypeError(f"unknown device {text!r}; choose one of {', '.join(KNOWN_DEVICES)}")
    return name


def _preset_name(text: str) -> str:
    if text not in presets.PRESETS:
        raise argparse.ArgumentTypeError(
            f"unknown preset {text!r}; choose one of {', '.join(sorted(presets.PRESETS))}"
        )
    return text


# ----------------------------------------------------------------------------------
# Problems from the command line
# ----------------------------------------------------------------------------------
class ShapesFileError(ValueError):
    """A shapes file that cannot be read; the message names the file and line."""


def read_shapes_file(path: str | Path, dtypes: Sequence[str], layouts: Sequence[str]) -> list[GemmProblem]:
    """Problems from a CSV with columns m,n,k[,batch,dtype,layout] (a header row optional).

    Rows without a dtype (layout) get each of ``dtypes`` (``layouts``); lines
    starting with ``#`` are comments.

    >>> read_shapes_file("shapes.csv", ["float16"], ["NN"])  # doctest: +SKIP
    [GemmProblem(m=1024, n=4096, k=4096, batch=1, dtype='float16', layout='NN')]
    """
    path = Path(path)
    try:
        lines = path.read_text().splitlines()
    except OSError as exc:
        raise ShapesFileError(f"{path}: cannot read ({exc.strerror})") from None
    rows = [
        (number, [cell.strip() for cell in row])
        for number, row in zip(range(1, len(lines) + 1), csv.reader(lines))
        if row and any(cell.strip() for cell in row) and not row[0].strip().startswith("#")
    ]
    columns = list(SHAPES_FILE_COLUMNS)
    if rows and not rows[0][1][0].isdigit():
        number, header = rows.pop(0)
        columns = [c.lower() for c in header]
        unknown = [c for c in columns if c not in SHAPES_FILE_COLUMNS]
        missing = [c for c in ("m", "n", "k") if c not in columns]
        if unknown or missing:
            raise ShapesFileError(
                f"{path}:{number}: header must name m,n,k[,batch,dtype,layout]"
                + (f"; unknown {unknown}" if unknown else "")
                + (f"; missing {missing}" if missing else "")
            )
    problems = []
    for number, cells in rows:
        try:
            problems += _problems_of_row(
                dict(zip(columns, cells)), len(cells) > len(columns), dtypes, layouts
            )
        except (ValueError, argparse.ArgumentTypeError) as exc:
            raise ShapesFileError(f"{path}:{number}: {exc}") from None
    return problems


def _problems_of_row(row: dict, extra_cells: bool, dtypes, layouts) -> list[GemmProblem]:
    if extra_cells:
        raise ValueError(f"more cells than the columns {', '.join(SHAPES_FILE_COLUMNS)}")
    m, n, k = (_positive_int(row.get(c, "")) for c in ("m", "n", "k"))
    batch = _positive_int(row["batch"]) if row.get("batch") else 1
    row_dtypes = [parse_dtype(row["dtype"])] if row.get("dtype") else dtypes
    row_layouts = [parse_layout(row["layout"])] if row.get("layout") else layouts
    return [GemmProblem(m, n, k, batch, dtype, layout) for dtype in row_dtypes for layout in row_layouts]


def problems_from_args(args: argparse.Namespace) -> list[GemmProblem]:
    """Every problem the ``tune`` arguments name, in order, without duplicates."""
    dtypes = args.dtype or ["float16"]
    layouts = args.layout or [DEFAULT_LAYOUT]
    problems = [
        GemmProblem(m, n, k, 1, dtype, layout)
        for (m, n, k) in [*args.shape, *getattr(args, "bare_shapes", [])]
        for dtype in dtypes
        for layout in layouts
    ]
    for name in args.preset:
        problems += presets.preset_problems(
            name,
            tokens=args.tokens,
            dtypes=dtypes,
            layouts=args.layout or [presets.LINEAR_LAYOUT],
            split=args.split_projections,
        )
    for shapes_file in args.shapes_file:
        problems += read_shapes_file(shapes_file, dtypes, layouts)
    return list(dict.fromkeys(problems))


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
        type=_preset_name,
        action="append",
        default=[],
        help=f"linear layers of a model: {', '.join(sorted(presets.PRESETS))} (repeatable)",
    )
    source.add_argument(
        "--tokens",
        type=_comma_list(_positive_int),
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
        type=_comma_list(parse_dtype),
        default=None,
        help=f"comma list of {DTYPE_HELP} (default: fp16)",
    )
    source.add_argument(
        "--layout",
        type=_comma_list(parse_layout),
        default=None,
        help=f"comma list of {LAYOUT_HELP} (default: NN; NT for presets)",
    )
    how = tune.add_argument_group("how")
    how.add_argument(
        "--max-candidates",
        type=_positive_int,
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
        type=_positive_int,
        default=tuner.DEFAULT_BENCH_MS,
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
    explain.add_argument("--batch", type=_positive_int, default=1, help="batch count (default: 1)")
    explain.add_argument(
        "--device",
        type=_device_name,
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
    print(tuner.format_table(results))
    rejections = tuner.format_rejections(results)
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
    from ..explain import explain_problem

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
    args = parser.parse_args(_negative_shapes_as_values(sys.argv[1:] if argv is None else argv))
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
