"""The one results-CSV schema: what every CSV under ``benchmarks/results/`` holds.

One tidy row per (case, dtype, implementation), plus ``ceiling`` rows (the
device's copy bandwidth and cuBLAS's best rate, measured in the same run).
The columns below come first, in this order; a writer may append columns of
its own after them (readers ignore those), and the environment follows as
``env_*`` columns (``env_gpu``, ``env_torch``, ``env_triton``, ...), the same
in every row of a file.  ``benchmarks/results/README.md`` lists the same
columns (a test keeps the two in step).

``read(path)`` returns a file as a DataFrame, or raises ``SchemaError`` with a
one-line reason; ``conform(df)`` puts a frame into the schema's column order.
"""

from __future__ import annotations

from pathlib import Path

#: (column, meaning with unit).  Empty cells are allowed wherever a value does not apply.
COLUMN_DOCS: tuple[tuple[str, str], ...] = (
    # what was computed
    (
        "suite",
        "what produced the row: a `python -m benchmarks run` suite (`square`, `llm`, ...), `quick`, "
        "`sweep` (a config sweep), `tuning` (the autotuner), `epilogue`, `mlp` (a whole gated MLP block), "
        "`fp8` (`python -m benchmarks fp8`), `fp8_train` (`python -m benchmarks fp8-train`), or `ceiling`",
    ),
    ("group", "a set of cases drawn together (one figure panel), e.g. `square`, `llama3-8b qkv`"),
    ("case", "the problem's label, unique within (suite, group)"),
    ("x", "the swept size a figure puts on its x axis (a number)"),
    ("x_label", "what `x` is, e.g. `M = N = K`, `M (tokens)`"),
    ("m", "rows of A and C"),
    ("n", "columns of B and C"),
    ("k", "the reduction length"),
    ("layout", "`NN`/`NT`/`TN`/`TT`: per operand, `N` row-major, `T` a transposed (column-major) view"),
    (
        "dtype",
        "operand dtype: `fp16`, `bf16`, `fp32`, `fp64`, or `fp8_e4m3` (float8_e4m3fn; the `fp8` suite's "
        "output dtype is in its own `out_dtype` column)",
    ),
    ("backward", "True: the row times forward + backward (autograd), and `flops` counts both"),
    # how
    (
        "impl",
        "the implementation: `cublas`, `tritongemm`, `tritongemm:<variant>`, `torch.compile`, "
        "`tritongemm.scaled_mm`, `torch._scaled_mm`, ...",
    ),
    (
        "family",
        "`cublas` (the baseline of `speedup_vs_cublas`), `tritongemm`, `torch.compile`, `ceiling`, `test`",
    ),
    (
        "variant",
        "what distinguishes the impl: `heuristic`, `tuned`, a pipeline or decomposition name, "
        "`stages`, `hierarchy`, `sweep`, `torch.matmul`, an fp8 scaling recipe (`rowwise+fast_accum`), ...",
    ),
    ("config", "the tritongemm config that ran, as `TileConfig.short()`, or a sweep's config label"),
    ("block_m", "CTA tile rows"),
    ("block_n", "CTA tile columns"),
    ("block_k", "K step of the mainloop"),
    ("group_m", "tile rows per program group (L2 reuse order)"),
    ("num_warps", "warps per CTA"),
    ("num_stages", "K-tiles in flight: 1 single_stage, 2 double_buffer, >= 3 multi_stage"),
    ("split_k", "K split across this many programs (1: none)"),
    ("split_k_inline", "True: split-K partials reduced inside the kernel"),
    ("stream_k", "True: Stream-K decomposition"),
    # the config's kernel (`TileConfig.kernel`) as four columns (`kernel_columns`)
    ("tma", "True: a TMA kernel (kernel `tma`, `tma_persistent` or `gluon_ws`)"),
    ("persistent", "True: persistent programs, one per SM (kernel `tma_persistent` or `gluon_ws`)"),
    ("warp_specialize", "True: the warp-specialized kernel (`gluon_ws`)"),
    ("epilogue_subtile", "True: the epilogue stores C in halves"),
    ("gemv", "True: the GEMV kernel (`gemv`, no tensor cores)"),
    # outcome
    (
        "status",
        "`ok`, `failed_gate` (wrong output: never timed), `invalid_config` (does not fit the device), "
        "`error`",
    ),
    ("message", "why a row is not `ok`, or a note on how it was measured"),
    (
        "rel_err",
        "relative Frobenius error ‖out − ref‖ / ‖ref‖ against the reference (cuBLAS, or float64 where noted)",
    ),
    ("tol", "the tolerance `rel_err` was held to"),
    ("n_copies", "input sets rotated through while timing (together > 2x the L2 cache)"),
    # time
    ("ms", "median time per call, milliseconds (GPU time, `triton.testing.do_bench`)"),
    ("ms_p20", "20th percentile of the timings, ms"),
    ("ms_p80", "80th percentile of the timings, ms"),
    ("host_us", "median CPU time to issue one call, microseconds"),
    # derived
    ("tflops", "`flops` / `ms`, TFLOP/s"),
    ("gbps", "`bytes` / `ms`, GB/s (for a copy ceiling: bytes read + written)"),
    ("speedup_vs_cublas", "baseline time / this row's time, same case, dtype and run (> 1: faster)"),
    ("flops", "2 M N K (x3 with backward)"),
    (
        "bytes",
        "compulsory DRAM traffic: A, B read and C written once (x3 with backward), bytes, at each "
        "operand's element size",
    ),
    ("intensity", "`flops` / `bytes`, FLOP per byte"),
)

COLUMNS: list[str] = [name for name, _ in COLUMN_DOCS]
#: What a file must have to be read (and plotted) as a results CSV; ``read`` adds any other
#: column of ``COLUMNS`` a file lacks as empty (older files predate some config fields).
REQUIRED: tuple[str, ...] = (
    "suite",
    "group",
    "case",
    "x",
    "x_label",
    "m",
    "n",
    "k",
    "layout",
    "dtype",
    "impl",
    "family",
    "variant",
    "status",
    "ms",
    "tflops",
    "speedup_vs_cublas",
    "flops",
    "bytes",
    "intensity",
)
#: The environment keys ``harness.environment()`` records, written as ``env_<key>`` columns.
ENV_KEYS: tuple[str, ...] = (
    "gpu",
    "sm_count",
    "capability",
    "l2_mb",
    "gpu_memory_gb",
    "driver",
    "cuda",
    "torch",
    "triton",
    "python",
    "tritongemm",
    "git",
    "tf32",
    "triton_interpret",
    "date",
)
ENV_PREFIX = "env_"

# Row statuses.
OK, FAILED_GATE, INVALID, ERROR = "ok", "failed_gate", "invalid_config", "error"
STATUSES = (OK, FAILED_GATE, INVALID, ERROR)


class SchemaError(ValueError):
    """A file that is not a results CSV of this schema; the message is one line naming the file."""


def kernel_columns(kernel: str) -> dict[str, bool]:
    """A config's kernel (``TileConfig.kernel``) as the columns ``tma``, ``persistent``,
    ``warp_specialize`` and ``gemv`` (which the schema kept from before that field: files hold them)."""
    return {
        "tma": kernel in ("tma", "tma_persistent", "gluon_ws"),
        "persistent": kernel in ("tma_persistent", "gluon_ws"),
        "warp_specialize": kernel == "gluon_ws",
        "gemv": kernel == "gemv",
    }


def conform(df):
    """``df`` with every schema column (missing ones empty), schema columns first, ``env_*`` last."""
    df = df.copy()
    for col in COLUMNS:
        if col not in df.columns:
            df[col] = None
    extra = [c for c in df.columns if c not in COLUMNS and not str(c).startswith(ENV_PREFIX)]
    env = [c for c in df.columns if str(c).startswith(ENV_PREFIX)]
    return df[COLUMNS + extra + env]


def missing_columns(columns) -> list[str]:
    """The required columns that ``columns`` lacks."""
    have = set(columns)
    return [c for c in REQUIRED if c not in have]


def read(path: str | Path):
    """One results CSV as a DataFrame; ``SchemaError`` (one line) if it is not one."""
    import pandas as pd

    path = Path(path)
    try:
        df = pd.read_csv(path)
    except FileNotFoundError:
        raise SchemaError(f"{path}: no such file") from None
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as exc:
        raise SchemaError(f"{path}: not readable as CSV ({type(exc).__name__})") from None
    missing = missing_columns(df.columns)
    if missing:
        shown = ", ".join(missing[:6]) + (f" and {len(missing) - 6} more" if len(missing) > 6 else "")
        raise SchemaError(
            f"{path}: not a benchmarks results CSV (missing columns {shown}; "
            "the schema is in benchmarks/schema.py)"
        )
    return conform(df)


def markdown_table() -> str:
    """The columns as the Markdown table of ``benchmarks/results/README.md``."""
    lines = ["| column | meaning |", "|---|---|"]
    lines += [f"| `{name}` | {doc} |" for name, doc in COLUMN_DOCS]
    return "\n".join(lines)
