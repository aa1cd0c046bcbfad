"""Which GEMMs a model runs, and how tritongemm does on each of them against cuBLAS.

``capture_gemms`` runs a function under a ``TorchDispatchMode`` and counts the
distinct (batch, M, N, K, layout, dtype) of every ``aten`` GEMM it reaches:
forward and backward alike (the dispatch level is below autograd, so the
backward's ``grad @ W`` and ``grad.T @ x`` show up with their real layouts),
and after autocast has picked the dtype.  ``time_shapes`` then times each
shape alone, cuBLAS against ``tritongemm.matmul``, gated like every benchmark,
and records which kernel and config ``tritongemm.explain()`` picks.
``breakdown_rows`` joins the two: each shape's count, its share of the
workload's GEMM time under cuBLAS, and tritongemm's speed ratio, so the shapes
that cost the most and run the worst stand out.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from tritongemm.testing import make_matrix

from . import harness

# aten overload packet name -> (positions of the two GEMM operands in its arguments)
_GEMM_ARGS = {"mm": (0, 1), "bmm": (0, 1), "addmm": (1, 2), "baddbmm": (1, 2), "_addmm_activation": (1, 2)}

SUITE = "models_gemms"


@dataclass(frozen=True, order=True)
class GemmShape:
    """One distinct GEMM: C[batch, M, N] = A[batch, M, K] @ B[batch, K, N].

    ``layout`` is tritongemm's: one letter per operand, ``N`` row-major, ``T`` a
    transposed view (a linear layer's ``x @ W.T`` is ``NT``).
    """

    batch: int
    m: int
    n: int
    k: int
    layout: str
    dtype: str

    @property
    def label(self) -> str:
        batch = f"{self.batch}x" if self.batch > 1 else ""
        return f"{batch}{self.m}x{self.n}x{self.k} {self.layout}"

    @property
    def flops(self) -> int:
        return 2 * self.batch * self.m * self.n * self.k


def operand_layout(t: torch.Tensor) -> str:
    """'N' when rows are contiguous (or the last dim is trivially so), else 'T'."""
    return "N" if t.stride(-1) == 1 or t.shape[-1] == 1 else "T"


def shape_of(op: str, args: Sequence[Any]) -> GemmShape:
    ia, ib = _GEMM_ARGS[op]
    a, b = args[ia], args[ib]
    batch = a.shape[0] if a.dim() == 3 else 1
    return GemmShape(
        batch,
        a.shape[-2],
        b.shape[-1],
        a.shape[-1],
        operand_layout(a) + operand_layout(b),
        harness.DTYPE_NAMES.get(a.dtype, str(a.dtype)),
    )


class GemmRecorder(TorchDispatchMode):
    """Counts every aten GEMM (mm, addmm, bmm, baddbmm) by shape while active, forward and backward."""

    def __init__(self) -> None:
        super().__init__()
        self.counts: Counter = Counter()
        self.ops: dict[GemmShape, set[str]] = defaultdict(set)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        op = func.overloadpacket.__name__
        if op in _GEMM_ARGS:
            shape = shape_of(op, args)
            self.counts[shape] += 1
            self.ops[shape].add(op)
        return func(*args, **(kwargs or {}))


def capture_gemms(fn: Callable[[], Any]) -> tuple[Counter, dict[GemmShape, set[str]]]:
    """Run ``fn()`` once and return (count per GemmShape, the aten ops behind each shape)."""
    recorder = GemmRecorder()
    with recorder:
        fn()
    return recorder.counts, dict(recorder.ops)


# ----------------------------------------------------------------------------------
# Timing each shape: cuBLAS against tritongemm.matmul
# ----------------------------------------------------------------------------------
def make_operands(
    shape: GemmShape, device: torch.device | str, seed: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Random operands of ``shape`` with its layout (a 'T' operand is a transposed view)."""
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    dtype = harness.DTYPES[shape.dtype]
    batch = (shape.batch,) if shape.batch > 1 else ()
    a = make_matrix(shape.m, shape.k, shape.layout[0], dtype, device, batch, gen)
    return a, make_matrix(shape.k, shape.n, shape.layout[1], dtype, device, batch, gen)


def _shape_row(shape: GemmShape) -> dict:
    return {
        "suite": SUITE,
        "m": shape.m,
        "n": shape.n,
        "k": shape.k,
        "batch": shape.batch,
        "layout": shape.layout,
        "dtype": shape.dtype,
        "shape": shape.label,
        "flops": shape.flops,
    }


def _plan_columns(a: torch.Tensor, b: torch.Tensor) -> dict:
    """The kernel and config ``tritongemm.explain`` says ``matmul(a, b)`` runs (and why, if it fell back)."""
    import tritongemm

    try:
        plan = tritongemm.explain(a, b)
    except Exception as exc:
        return {"kernel": "", "message": "explain: " + harness._short_error(exc)}
    cols = {"kernel": plan.kernel, "config_source": plan.source, "config": plan.config.short()}
    cols.update({k: v for k, v in harness._config_columns(plan.config).items() if k in harness.COLUMNS})
    if plan.fallback:
        cols["kernel_fallback"] = plan.fallback
    return cols


def time_shapes(
    shapes: Iterable[GemmShape],
    device: torch.device | str,
    *,
    warmup_ms: float = 25,
    rep_ms: float = 100,
    rounds: int = harness.ROUNDS,
    log: Callable[[str], None] = lambda s: None,
) -> dict:
    """GemmShape -> {"cublas": row, "tritongemm": row}: gated, then timed in interleaved rounds."""
    import tritongemm

    device = torch.device(device)
    out: dict[GemmShape, dict[str, dict]] = {}
    shapes = sorted(set(shapes))
    for i, shape in enumerate(shapes):
        log(f"GEMM {i + 1}/{len(shapes)} {shape.label} {shape.dtype}")
        base = _shape_row(shape)
        rows = {
            "cublas": {**base, "impl": "cublas", "family": "cublas"},
            "tritongemm": {**base, "impl": "tritongemm", "family": "tritongemm"},
        }
        try:
            a, b = make_operands(shape, device)
            rows["tritongemm"].update(_plan_columns(a, b))
            with torch.no_grad():
                ref = torch.matmul(a, b)
                gate = harness.check_output(tritongemm.matmul(a, b), ref)
        except Exception as exc:
            msg = harness._short_error(exc)
            out[shape] = {k: {**r, "status": harness.ERROR, "message": msg} for k, r in rows.items()}
            continue
        rows["tritongemm"].update(rel_err=gate.rel_err, tol=gate.tol)
        slots: dict[str, Any] = {}
        for name, fn in (("cublas", torch.matmul), ("tritongemm", tritongemm.matmul)):
            if name == "tritongemm" and not gate.ok:
                rows[name].update(status=harness.FAILED_GATE, message=gate.reason)
                continue
            slots[name] = harness.Prepared(rows[name], (lambda f=fn, a=a, b=b: f(a, b)), None, torch.no_grad)
        harness.time_interleaved(slots, device, rounds, warmup_ms, rep_ms)
        for name, slot in slots.items():
            if isinstance(slot, harness.Prepared):
                ms, p20, p80 = harness.summarize(slot.samples)
                rows[name] = {
                    **slot.row,
                    "status": harness.OK,
                    "message": "",
                    "ms": ms,
                    "ms_p20": p20,
                    "ms_p80": p80,
                    "tflops": shape.flops / (ms * 1e-3) / 1e12,
                }
            else:
                rows[name] = slot
        cublas_ms, tg_ms = rows["cublas"].get("ms"), rows["tritongemm"].get("ms")
        if cublas_ms and tg_ms:
            rows["tritongemm"]["speedup_vs_cublas"] = cublas_ms / tg_ms
        out[shape] = rows
        del a, b, slots
    return out


def breakdown_rows(
    model: str,
    workload: str,
    counts: Counter,
    ops: dict[GemmShape, set[str]],
    timed: dict[GemmShape, dict[str, dict]],
) -> list[dict]:
    """Tidy rows (one per shape and implementation) with each shape's count and share of GEMM time.

    ``share`` is count x cuBLAS time over the sum of that for the workload: the
    fraction of its GEMM time the shape takes when cuBLAS runs it.
    """
    weights = {
        s: n * timed[s]["cublas"]["ms"]
        for s, n in counts.items()
        if s in timed and timed[s]["cublas"].get("status") == harness.OK
    }
    total = sum(weights.values())
    rows = []
    for shape, n in sorted(counts.items(), key=lambda kv: -weights.get(kv[0], 0.0)):
        share = weights[shape] / total if shape in weights and total > 0 else math.nan
        for impl in ("cublas", "tritongemm"):
            row = dict(
                timed.get(shape, {}).get(impl)
                or {
                    **_shape_row(shape),
                    "impl": impl,
                    "family": impl,
                    "status": harness.ERROR,
                    "message": "not timed",
                }
            )
            row.update(
                group=model,
                model=model,
                workload=workload,
                case=f"{model} {workload} {shape.label}",
                count=n,
                ops="+".join(sorted(ops.get(shape, ()))),
                share=share,
            )
            rows.append(row)
    return rows


def weighted_ratio(rows: Sequence[dict]) -> float:
    """tritongemm's speed ÷ cuBLAS's over a workload's whole GEMM mix (count-weighted times)."""
    by_shape: dict[str, dict[str, dict]] = defaultdict(dict)
    for r in rows:
        by_shape[r["case"]][r["impl"]] = r
    cublas = tg = 0.0
    for pair in by_shape.values():
        c, t = pair.get("cublas", {}), pair.get("tritongemm", {})
        if c.get("status") != harness.OK or t.get("status") != harness.OK:
            return math.nan
        cublas += c["count"] * c["ms"]
        tg += t["count"] * t["ms"]
    return cublas / tg if tg > 0 else math.nan


def breakdown_table(rows: Sequence[dict]) -> str:
    """Per model and workload: shapes by share of GEMM time, with tritongemm ÷ cuBLAS and its kernel."""
    groups: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for r in rows:
        groups[(r["model"], r["workload"])].append(r)
    parts = []
    for (model, workload), group in groups.items():
        lines = []
        pairs: dict[str, dict[str, dict]] = defaultdict(dict)
        for r in group:
            pairs[r["case"]][r["impl"]] = r
        for pair in pairs.values():
            c, t = pair.get("cublas", {}), pair.get("tritongemm", {})
            lines.append(
                {
                    "shape": t.get("shape") or c.get("shape"),
                    "dtype": t.get("dtype"),
                    "ops": t.get("ops"),
                    "count": t.get("count"),
                    "share": _pct(t.get("share")),
                    "cublas_us": _us(c),
                    "tg_us": _us(t),
                    "ratio": t.get("speedup_vs_cublas") if t.get("status") == harness.OK else t.get("status"),
                    "kernel": t.get("kernel"),
                    "config": t.get("config"),
                }
            )
        head = f"[{model} {workload}] GEMM mix: tritongemm ÷ cuBLAS = {_fmt(weighted_ratio(group))} (speed)"
        parts.append(
            head
            + "\n"
            + harness.format_table(
                lines,
                [
                    ("shape", "M x N x K layout"),
                    ("dtype", "dtype"),
                    ("ops", "aten"),
                    ("count", "count"),
                    ("share", "share %"),
                    ("cublas_us", "cuBLAS us"),
                    ("tg_us", "tritongemm us"),
                    ("ratio", "tg ÷ cuBLAS"),
                    ("kernel", "kernel"),
                    ("config", "config"),
                ],
            )
        )
    return "\n\n".join(parts) if parts else "(no GEMMs captured)"


def _pct(x) -> float | None:
    return None if x is None or (isinstance(x, float) and math.isnan(x)) else 100.0 * x


def _us(row: dict) -> float | None:
    return row["ms"] * 1e3 if row.get("status") == harness.OK else None


def _fmt(x: float) -> str:
    return "-" if x is None or math.isnan(x) else f"{x:.2f}"


# ----------------------------------------------------------------------------------
# The figure: share of GEMM time x tritongemm ÷ cuBLAS, one panel per model
# ----------------------------------------------------------------------------------
_WORKLOAD_COLORS = {"infer": "#1f77b4", "train": "#d62728", "train_amp": "#ff7f0e", "decode": "#2ca02c"}


def fig_breakdown(df):
    """Each shape a point: x its share of the workload's GEMM time, y tritongemm ÷ cuBLAS (speed)."""
    from matplotlib.figure import Figure

    d = df[(df["suite"] == SUITE) & (df["impl"] == "tritongemm") & (df["status"] == harness.OK)]
    d = d[d["share"].notna() & d["speedup_vs_cublas"].notna()]
    if d.empty:
        return None
    models = list(dict.fromkeys(d["model"]))
    ncols = min(2, len(models))
    nrows = math.ceil(len(models) / ncols)
    fig = Figure(figsize=(6.5 * ncols, 4.6 * nrows), layout="constrained")
    axes = fig.subplots(nrows, ncols, squeeze=False).ravel()
    for ax, model in zip(axes, models):
        m = d[d["model"] == model]
        for workload, w in m.groupby("workload", sort=False):
            ax.scatter(
                100 * w["share"],
                w["speedup_vs_cublas"],
                s=20 + 400 * w["share"],
                alpha=0.7,
                color=_WORKLOAD_COLORS.get(workload, "#9467bd"),
                label=workload,
                edgecolors="none",
            )
        for _, r in m.nlargest(5, "share").iterrows():
            ax.annotate(
                str(r["shape"]),
                (100 * r["share"], r["speedup_vs_cublas"]),
                fontsize=7,
                xytext=(4, 4),
                textcoords="offset points",
            )
        ax.axhline(1.0, color="#222222", lw=0.8, ls="--")
        ax.set_title(f"{model} ({m['dtype'].iloc[0]})")
        ax.set_xlabel("share of the workload's GEMM time under cuBLAS (%)")
        ax.set_ylabel("tritongemm ÷ cuBLAS (speed, >1 faster)")
        ax.legend(fontsize=8)
    for ax in axes[len(models) :]:
        ax.set_visible(False)
    gpu = df["env_gpu"].dropna().iloc[0] if "env_gpu" in df.columns and df["env_gpu"].notna().any() else ""
    fig.suptitle(f"Per-GEMM breakdown of each model: where the time is and how tritongemm does there  {gpu}")
    return fig


def plot_breakdown(csv: str | Path, out_dir: str | Path) -> list[Path]:
    fig = fig_breakdown(harness.read_results(csv))
    if fig is None:
        return []
    path = Path(out_dir) / "models_gemms.png"
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    return [path]


__all__ = [
    "GemmShape",
    "GemmRecorder",
    "capture_gemms",
    "time_shapes",
    "breakdown_rows",
    "breakdown_table",
    "weighted_ratio",
    "fig_breakdown",
    "plot_breakdown",
    "make_operands",
]
