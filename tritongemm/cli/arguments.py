"""The command line's values: shapes, dtypes, layouts, devices, presets, and shapes files, each parsed
with an error that names what is wrong (argparse shows it as a usage error)."""

from __future__ import annotations

import argparse
import csv
import re
from collections.abc import Sequence
from pathlib import Path

from ..device import KNOWN_DEVICES
from ..planning.problem import GemmProblem, canonical_dtype
from ..tuning import presets

LAYOUTS = ("NN", "NT", "TN", "TT")
DTYPE_HELP = "fp16, bf16, fp32, fp64, fp8 (e4m3) or e5m2 (also float16, half, bfloat16, float, double, ...)"
LAYOUT_HELP = "NN, NT, TN or TT: A's then B's storage, N row-major, T transposed (nn.Linear is NT)"
#: Layout of explicit shapes when --layout is not given (presets use nn.Linear's "NT").
DEFAULT_LAYOUT = "NN"
SHAPES_FILE_COLUMNS = ("m", "n", "k", "batch", "dtype", "layout")


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


def negative_shapes_as_values(argv: Sequence[str]) -> list[str]:
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
    """``'bf16'`` -> ``'bfloat16'`` (the spellings ``problem.canonical_dtype`` takes)."""
    try:
        return canonical_dtype(text.strip().lower())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"unknown dtype {text!r}; use fp16, bf16, fp32, fp64, fp8 (e4m3) or e5m2"
        ) from None


def parse_layout(text: str) -> str:
    layout = text.strip().upper()
    if layout not in LAYOUTS:
        raise argparse.ArgumentTypeError(f"unknown layout {text!r}; use one of {', '.join(LAYOUTS)}")
    return layout


def comma_list(parse_one):
    """An argparse type for ``a,b,c`` lists of ``parse_one`` values."""

    def parse(text: str) -> list:
        items = [t for t in text.split(",") if t.strip()]
        if not items:
            raise argparse.ArgumentTypeError(f"empty list {text!r}")
        return [parse_one(t) for t in items]

    return parse


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be >= 1")
    return value


def device_name(text: str) -> str:
    name = text.strip().lower()
    if name not in KNOWN_DEVICES:
        raise argparse.ArgumentTypeError(f"unknown device {text!r}; choose one of {', '.join(KNOWN_DEVICES)}")
    return name


def preset_name(text: str) -> str:
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
    m, n, k = (positive_int(row.get(c, "")) for c in ("m", "n", "k"))
    batch = positive_int(row["batch"]) if row.get("batch") else 1
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
