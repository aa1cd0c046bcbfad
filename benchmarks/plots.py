"""Figures from results CSVs only: everything regenerates without a GPU.

``python -m benchmarks plot CSV [CSV ...] [--out DIR] [--figures KIND,...]``
reads the CSVs (``schema.read``: a file that is not a results CSV is named in
one line and skipped), merges them, and writes whichever of these the data
supports; each answers one question:

* ``<suite>_tflops.png``  (kind ``tflops``) how fast is each implementation as
  the problem grows?  One panel per dtype (per group where a suite has several
  swept groups); problems that are not one swept size are bars, one cluster per
  problem.  ``decode_gbps.png``: the same in GB/s against the copy bandwidth,
  since decode is memory-bound.
* ``<suite>_speedup.png`` (``speedup``) where is each tritongemm variant faster
  or slower than cuBLAS?  One row per problem, one panel per dtype.
* ``stages_ladder.png``   (``ladder``) what does each extra pipeline stage buy?
* ``hierarchy_heatmap.png`` (``heatmap``) which CTA tile and warp count is fastest?
* ``sweep_best.png``      (``sweep``) how close is the heuristic to the best
  config a sweep found?
* ``roofline.png``        (``roofline``) how far is each measurement from what
  the hardware allows?  Roofs: the datasheet's dense tensor-core peak and the
  copy bandwidth measured in the same run.
* ``vs_torch_compile.png`` (``compile``) tritongemm against
  ``torch.compile(max-autotune)``, each as a ratio to cuBLAS in its own run.
* ``quick.png``           (``quick``) the quick benchmark's two panels.

Files holding repeated measurements of one (suite, case, dtype, impl) are
drawn at their median.  Figures are built on ``matplotlib.figure.Figure``
(no pyplot), so no display or backend is needed and nothing global changes.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from . import schema

OK = schema.OK
DPI = 120
#: Figure widths stay at or below this many inches (x DPI = 1920 px).
MAX_WIDTH_IN = 16.0
#: Fixed colours, so an implementation looks the same in every figure.
COLORS = {
    "cublas": "#222222",
    "torch.compile": "#8c8c8c",
    "tritongemm": "#1f77b4",
    "tritongemm:tuned": "#9467bd",
    "tritongemm:single_stage": "#ff7f0e",
    "tritongemm:double_buffer": "#2ca02c",
    "tritongemm:multi_stage": "#d62728",
    "tritongemm:sliced_k": "#17becf",
    "tritongemm:split_k": "#bcbd22",
    "tritongemm:stream_k": "#e377c2",
}
_CYCLE = ["#8c564b", "#e377c2", "#bcbd22", "#17becf", "#aec7e8", "#ffbb78", "#98df8a", "#c5b0d5"]
_PIPELINE_SPANS = (("single_stage", 0.5, 1.5), ("double_buffer", 1.5, 2.5), ("multi_stage", 2.5, 99))
#: Variants that are one point of a config grid: drawn by their own figures, not as lines of their own.
_GRID_VARIANTS = ("stages", "hierarchy", "sweep")
#: Variants of the main figures' comparison drawn only in the speedup figure (the ladder is their figure).
_PIPELINE_IMPLS = ("tritongemm:single_stage", "tritongemm:double_buffer", "tritongemm:multi_stage")

#: Dense (no sparsity) fp16/bf16 tensor-core peak in TFLOP/s from NVIDIA's datasheets, by a pattern of
#: the device name; the first match wins.  "H100 80GB HBM3" is the SXM part.
DATASHEET_PEAK_TFLOPS: tuple[tuple[str, float, str], ...] = (
    (r"H100.*PCIe", 756.0, "H100 PCIe"),
    (r"H100.*(SXM|HBM3)", 989.4, "H100 SXM"),
    (r"H200", 989.4, "H200"),
    (r"A100", 312.0, "A100"),
)


def datasheet_peak(gpu: str) -> tuple[float, str] | None:
    """(TFLOP/s, part name) of the dense fp16/bf16 tensor-core peak for a device name, if known."""
    for pattern, tflops, part in DATASHEET_PEAK_TFLOPS:
        if re.search(pattern, gpu):
            return tflops, part
    return None


# ----------------------------------------------------------------------------------
# Data
# ----------------------------------------------------------------------------------
def load(data):
    """A DataFrame from a DataFrame or one or more CSV paths (``schema.SchemaError`` for a bad file)."""
    import pandas as pd

    if isinstance(data, pd.DataFrame):
        return schema.conform(data)
    if isinstance(data, (str, Path)):
        data = [data]
    return pd.concat([schema.read(p) for p in data], ignore_index=True)


def _color(impl: str, others: dict[str, str], family: str = "") -> str:
    if impl in COLORS:
        return COLORS[impl]
    if family == "cublas":  # a baseline named otherwise (e.g. torch's linear + GELU)
        return COLORS["cublas"]
    if impl not in others:
        others[impl] = _CYCLE[len(others) % len(_CYCLE)]
    return others[impl]


def _impl_order(impls: Iterable[str]) -> list[str]:
    known = list(COLORS)
    impls = list(dict.fromkeys(impls))
    return sorted(impls, key=lambda i: (known.index(i) if i in known else len(known), impls.index(i)))


def _measured(df, suite: str | None = None):
    d = df[(df["status"] == OK) & df["tflops"].notna() & (df["suite"] != "ceiling")]
    d = d[d["family"] != "test"]
    if suite is not None:
        d = d[d["suite"] == suite]
    return d


def _collapse(d):
    """One row per (suite, group, case, dtype, impl): the median of repeated measurements."""
    if d.empty:
        return d
    keys = ["suite", "group", "case", "dtype", "impl"]
    firsts = {c: "first" for c in ("x", "x_label", "m", "n", "k", "family", "variant", "config", "intensity")}
    medians = {c: "median" for c in ("tflops", "gbps", "speedup_vs_cublas", "ms")}
    return d.groupby(keys, sort=False, dropna=False).agg({**firsts, **medians}).reset_index()


def _gpu(df) -> str:
    if "env_gpu" in df.columns and df["env_gpu"].notna().any():
        return ", ".join(dict.fromkeys(str(g) for g in df["env_gpu"].dropna()))
    return "unknown GPU"


def _is_size_sweep(cases) -> bool:
    """Do these cases vary one size (``x``), each of M, N, K either fixed or equal to it?"""
    cases = cases.drop_duplicates("case")
    if len(cases) < 2 or cases["x"].nunique() != len(cases):
        return False
    return all(cases[d].nunique() == 1 or bool((cases[d] == cases["x"]).all()) for d in ("m", "n", "k"))


def _grid(
    n: int, ncols: int, panel_w: float, panel_h: float, extra_h: float = 0.9, sharey: bool = False
) -> tuple[Figure, np.ndarray]:
    ncols = max(1, min(ncols, n))
    nrows = math.ceil(n / ncols)
    width = min(MAX_WIDTH_IN, panel_w * ncols)
    fig = Figure(figsize=(width, panel_h * nrows + extra_h), layout="constrained")
    axes = np.atleast_2d(fig.subplots(nrows, ncols, squeeze=False, sharey=sharey))
    for ax in axes.flat[n:]:
        ax.set_visible(False)
    return fig, axes


def _figure_legend(fig: Figure, handles: dict, title: str | None = None) -> None:
    if handles:
        fig.legend(
            list(handles.values()),
            list(handles),
            loc="outside lower center",
            ncols=min(len(handles), 6),
            fontsize=8,
            title=title,
            title_fontsize=8,
            frameon=False,
        )


def _pipeline_name(stages: float) -> str:
    return "single_stage" if stages <= 1 else "double_buffer" if stages == 2 else "multi_stage"


def _log2_ticks(ax, xs: Sequence[float]) -> None:
    xs = sorted(xs)
    if len(xs) > 1 and xs[-1] / max(xs[0], 1) >= 4:
        ax.set_xscale("log", base=2)
        ax.set_xticks(xs)
        ax.set_xticklabels([str(int(v)) for v in xs], fontsize=8)
        ax.minorticks_off()


# ----------------------------------------------------------------------------------
# Figures
# ----------------------------------------------------------------------------------
def fig_tflops(df, suite: str, metric: str = "tflops") -> Figure | None:
    """TFLOP/s (or GB/s) by problem size; lines where a group sweeps one size, bars otherwise.

    A group with a single problem gets no panel of its own (the speedup figure
    shows it); the figure's caption names it.
    """
    d = _collapse(_measured(df, suite))
    d = d[~d["variant"].isin(_GRID_VARIANTS) & ~d["impl"].isin(_PIPELINE_IMPLS) & d[metric].notna()]
    if d.empty:
        return None
    groups = list(dict.fromkeys(d["group"]))
    sweeps = [g for g in groups if _is_size_sweep(d[d["group"] == g])]
    others = [g for g in groups if g not in sweeps]
    other_cases = d[d["group"].isin(others)]
    left_out: list[str] = []
    bar_panel = other_cases["case"].nunique() >= 2 or not sweeps
    if not bar_panel:
        left_out = list(dict.fromkeys(other_cases["case"]))
    dtypes = list(dict.fromkeys(d["dtype"]))
    panels = [
        ("sweep", g, dt) for g in sweeps for dt in dtypes if ((d["group"] == g) & (d["dtype"] == dt)).any()
    ]
    if bar_panel and len(other_cases):
        panels += [("bars", None, dt) for dt in dtypes if (other_cases["dtype"] == dt).any()]
    ncols = len(dtypes) if len(panels) <= 2 * len(dtypes) and len(dtypes) > 1 else 4 if len(panels) > 6 else 2
    panel_w = 5.6 if ncols <= 2 else 4.0
    if not sweeps:  # bars only: room for every problem's label
        ncols = 1 if other_cases["case"].nunique() > 5 else ncols
        panel_w = max(panel_w, 1.5 + 0.9 * other_cases["case"].nunique())
    fig, axes = _grid(len(panels), ncols, panel_w, 3.8 if ncols <= 2 else 2.7, sharey=True)
    colors: dict[str, str] = {}
    handles: dict = {}
    unit = "TFLOP/s" if metric == "tflops" else "GB/s"
    bw, _ = ceilings(df)
    for ax, (kind, group, dtype) in zip(axes.flat, panels):
        if kind == "sweep":
            p = d[(d["group"] == group) & (d["dtype"] == dtype)]
            for impl in _impl_order(p["impl"]):
                s = p[p["impl"] == impl].sort_values("x")
                (line,) = ax.plot(
                    s["x"],
                    s[metric],
                    marker="o",
                    ms=4,
                    linewidth=1.6,
                    color=_color(impl, colors, s["family"].iloc[0]),
                )
                handles.setdefault(impl, line)
            _log2_ticks(ax, p["x"].unique())
            ax.set_xlabel(str(p["x_label"].dropna().iloc[0]) if p["x_label"].notna().any() else "size")
            ax.set_title(f"{group}, {dtype}" if len(sweeps) > 1 or group != suite else dtype, fontsize=10)
        else:
            p = other_cases[other_cases["dtype"] == dtype]
            cases = list(dict.fromkeys(p["case"]))
            impls = _impl_order(p["impl"])
            width = 0.8 / len(impls)
            x = np.arange(len(cases))
            for i, impl in enumerate(impls):
                s = p[p["impl"] == impl].set_index("case")[metric]
                bars = ax.bar(
                    x + (i - (len(impls) - 1) / 2) * width,
                    [float(s.get(c, np.nan)) for c in cases],
                    width,
                    color=_color(impl, colors, p.loc[p["impl"] == impl, "family"].iloc[0]),
                )
                handles.setdefault(impl, bars)
            ax.set_xticks(x)
            ax.set_xticklabels(
                cases,
                rotation=20 if len(cases) > 3 else 0,
                ha="right" if len(cases) > 3 else "center",
                fontsize=8,
            )
            ax.set_xlabel("problem")
            ax.set_title(f"{', '.join(others)}, {dtype}" if len(others) <= 2 else dtype, fontsize=10)
        if metric == "gbps" and bw:
            ax.axhline(bw, color="black", linestyle="--", linewidth=1)
            ax.text(
                0.98,
                bw,
                f"copy bandwidth {bw:,.0f} GB/s ",
                va="top",
                ha="right",
                fontsize=7,
                transform=ax.get_yaxis_transform(),
            )
        if ax in axes[:, 0]:
            ax.set_ylabel(unit)
        ax.grid(alpha=0.3)
    top = max(float(d[metric].max()), bw if metric == "gbps" and bw else 0.0)
    axes.flat[0].set_ylim(0, top * 1.1)
    _figure_legend(fig, handles)
    what = "TFLOP/s" if metric == "tflops" else "GB/s of compulsory traffic (A, B read, C written once)"
    note = (
        ("\nnot drawn (a single problem; see the speedup figure): " + ", ".join(left_out)) if left_out else ""
    )
    by = "by problem size" if sweeps else "by problem"
    fig.suptitle(f"{suite}: {what} {by} on {_gpu(df)} (median of do_bench){note}", fontsize=11)
    return fig


def _dot_rows(ax, p, cases: list[str], impls: list[str], colors: dict, handles: dict) -> None:
    """One row per case, one marker per implementation (nudged apart vertically)."""
    y = np.arange(len(cases))[::-1]
    step = min(0.16, 0.7 / max(len(impls), 1))
    for i, impl in enumerate(impls):
        s = p[p["impl"] == impl].set_index("case")["speedup_vs_cublas"]
        vals = [float(s.get(c, np.nan)) for c in cases]
        fam = p.loc[p["impl"] == impl, "family"]
        mark = ax.scatter(
            vals,
            y + (i - (len(impls) - 1) / 2) * step,
            s=22,
            zorder=3,
            color=_color(impl, colors, fam.iloc[0] if len(fam) else ""),
        )
        handles.setdefault(impl, mark)
    ax.set_yticks(y)
    ax.set_yticklabels(cases, fontsize=7)
    ax.set_ylim(-0.7, len(cases) - 0.3)
    ax.axvline(1.0, color="black", linestyle="--", linewidth=1, zorder=1)
    ax.grid(axis="x", alpha=0.3)
    for row in y[::2]:  # banding, so a marker is easy to match with its row
        ax.axhspan(row - 0.5, row + 0.5, color="0.94", zorder=0)


def fig_speedup(df, suite: str) -> Figure | None:
    """cuBLAS time / implementation time per problem; one row per problem, one panel per dtype."""
    d = _collapse(_measured(df, suite))
    d = d[(d["family"] != "cublas") & d["speedup_vs_cublas"].notna() & ~d["variant"].isin(_GRID_VARIANTS)]
    if d.empty:
        return None
    dtypes = list(dict.fromkeys(d["dtype"]))
    cases = list(dict.fromkeys(d["case"]))
    impls = _impl_order(d["impl"])
    label_in = min(3.2, 0.25 + 0.055 * max(len(c) for c in cases))
    height = min(18.0, 1.9 + 0.24 * len(cases))
    fig = Figure(figsize=(min(MAX_WIDTH_IN, label_in + 4.6 * len(dtypes)), height), layout="constrained")
    axes = fig.subplots(1, len(dtypes), squeeze=False, sharey=True)[0]
    colors: dict[str, str] = {}
    handles: dict = {}
    top = float(np.nanmax(d["speedup_vs_cublas"]))
    base = df[(df["suite"] == suite) & (df["family"] == "cublas")]["impl"].dropna()
    base = str(base.iloc[0]) if len(base) and base.iloc[0] != "cublas" else "cuBLAS"
    for ax, dtype in zip(axes, dtypes):
        _dot_rows(ax, d[d["dtype"] == dtype], cases, impls, colors, handles)
        ax.set_xlim(0, max(1.2, top * 1.05))
        ax.set_xlabel(f"{base} time / its time (> 1: faster than {base})")
        ax.set_title(dtype, fontsize=10)
    axes[0].set_ylabel("problem")
    _figure_legend(fig, handles)
    fig.suptitle(f"{suite}: speedup over {base} on {_gpu(df)}, same inputs, same process", fontsize=11)
    return fig


def fig_ladder(df) -> Figure | None:
    """The pipeline ladder: TFLOP/s by num_stages at fixed tiles, one line per size."""
    d = df[(df["suite"] == "stages") & (df["variant"] == "stages")]
    if d.empty or not (d["status"] == OK).any():
        return None
    dtypes = list(dict.fromkeys(d["dtype"]))
    fig, axes = _grid(len(dtypes), 2, 8.5, 4.6, 0.5)
    cublas = df[(df["suite"] == "stages") & (df["family"] == "cublas") & (df["status"] == OK)]
    for ax, dtype in zip(axes.flat, dtypes):
        p = d[d["dtype"] == dtype]
        stages = sorted(int(s) for s in p["num_stages"].dropna().unique())
        for name, lo, hi in _PIPELINE_SPANS:
            ax.axvspan(
                lo,
                min(hi, max(stages, default=1) + 0.5),
                alpha=0.06,
                color={"single_stage": "C1", "double_buffer": "C2", "multi_stage": "C3"}[name],
            )
        for i, m in enumerate(sorted(p["m"].unique())):
            color = f"C{i}"
            s = (
                p[(p["m"] == m) & (p["status"] == OK)]
                .groupby("num_stages", as_index=False)["tflops"]
                .median()
            )
            ax.plot(s["num_stages"], s["tflops"], marker="o", color=color, label=f"{int(m)}³ tritongemm")
            ref = cublas[(cublas["m"] == m) & (cublas["dtype"] == dtype)]["tflops"]
            if len(ref):
                ax.axhline(
                    float(ref.median()), color=color, linestyle=":", linewidth=1.2, label=f"{int(m)}³ cuBLAS"
                )
        for st, g in p[p["status"] != OK].groupby("num_stages"):
            why = (
                "does not fit"
                if (g["status"] == "invalid_config").all()
                else "/".join(sorted(set(g["status"])))
            )
            ax.plot([st], [0], marker="x", color="black", ms=9, clip_on=False)
            ax.annotate(why, (st, 0), textcoords="offset points", xytext=(0, 8), ha="center", fontsize=8)
        ax.set_xticks(stages)
        ax.set_xticklabels([f"{s}\n{_pipeline_name(s)}" for s in stages], fontsize=8)
        ax.set_xlim(0.5, max(stages, default=1) + 0.5)
        ax.set_ylim(bottom=0)
        ax.set_xlabel("num_stages (K-tiles in flight)")
        ax.set_ylabel("TFLOP/s")
        cfg = p["config"].dropna()
        tiles = str(cfg.iloc[0]).split()[0] if len(cfg) else ""
        warps = p["num_warps"].dropna()
        ax.set_title(
            f"{dtype}, {tiles} tiles" + (f", {int(warps.iloc[0])} warps" if len(warps) else ""), fontsize=10
        )
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.suptitle(f"pipeline ladder: single_stage -> double_buffer -> multi_stage on {_gpu(d)}", fontsize=11)
    return fig


def fig_heatmap(df) -> Figure | None:
    """TFLOP/s over (block_m, block_n); one panel per (dtype, size, num_warps)."""
    d = df[(df["suite"] == "hierarchy") & (df["variant"] == "hierarchy")]
    if d.empty or not (d["status"] == OK).any():
        return None
    panels = list(dict.fromkeys(zip(d["dtype"], d["m"], d["num_warps"])))
    fig, axes = _grid(len(panels), 2, 4.6, 4.0, 0.5)
    vmax = float(d.loc[d["status"] == OK, "tflops"].max())
    image = None
    for ax, (dtype, m, warps) in zip(axes.flat, panels):
        p = d[(d["dtype"] == dtype) & (d["m"] == m) & (d["num_warps"] == warps)]
        bms = sorted(int(v) for v in p["block_m"].dropna().unique())
        bns = sorted(int(v) for v in p["block_n"].dropna().unique())
        grid = np.full((len(bms), len(bns)), np.nan)
        notes = {}
        for _, r in p.iterrows():
            i, j = bms.index(int(r["block_m"])), bns.index(int(r["block_n"]))
            if r["status"] == OK:
                grid[i, j] = r["tflops"]
            else:
                notes[(i, j)] = "n/a" if r["status"] == "invalid_config" else str(r["status"])
        image = ax.imshow(grid, cmap="viridis", vmin=0, vmax=vmax, origin="lower", aspect="auto")
        for i in range(len(bms)):
            for j in range(len(bns)):
                text = notes.get((i, j)) or ("" if np.isnan(grid[i, j]) else f"{grid[i, j]:.0f}")
                light = not np.isnan(grid[i, j]) and grid[i, j] < 0.6 * vmax
                ax.text(j, i, text, ha="center", va="center", fontsize=8, color="white" if light else "black")
        ax.set_xticks(range(len(bns)))
        ax.set_xticklabels(bns)
        ax.set_yticks(range(len(bms)))
        ax.set_yticklabels(bms)
        ax.set_xlabel("block_n (CTA tile columns)")
        ax.set_ylabel("block_m (CTA tile rows)")
        stages = p["num_stages"].dropna()
        ax.set_title(
            f"{int(m)}³ {dtype}, {int(warps)} warps"
            + (f", {int(stages.iloc[0])} stages" if len(stages) else ""),
            fontsize=10,
        )
    if image is not None:
        fig.colorbar(image, ax=list(axes.flat), label="TFLOP/s", shrink=0.8)
    fig.suptitle(
        f"tiling hierarchy sweep on {_gpu(d)} (n/a: exceeds a register or shared-memory budget)", fontsize=11
    )
    return fig


def fig_sweep(df) -> Figure | None:
    """Per problem of a config sweep: the heuristic's and the best swept config's speedup over cuBLAS."""
    d = _collapse(_measured(df, "sweep"))
    d = d[(d["family"] == "tritongemm") & d["speedup_vs_cublas"].notna()]
    if d.empty:
        return None
    rows = []
    for (group, case, dtype), g in d.groupby(["group", "case", "dtype"], sort=False):
        best = g.loc[g["speedup_vs_cublas"].idxmax()]
        heur = g.loc[g["variant"] == "heuristic", "speedup_vs_cublas"]
        rows.append(
            (
                f"{case} {dtype}",
                group,
                float(best["speedup_vs_cublas"]),
                str(best["config"]),
                float(heur.iloc[0]) if len(heur) else np.nan,
            )
        )
    groups = list(dict.fromkeys(r[1] for r in rows))
    n_rows = len(rows) + 1.5 * len(groups)
    fig = Figure(figsize=(11, min(30.0, 1.4 + 0.26 * n_rows)), layout="constrained")
    axes = fig.subplots(
        len(groups), 1, squeeze=False, height_ratios=[sum(r[1] == g for r in rows) + 1.5 for g in groups]
    )[:, 0]
    top = max(max(r[2] for r in rows), np.nanmax([r[4] for r in rows] + [0]))
    for ax, group in zip(axes, groups):
        part = [r for r in rows if r[1] == group]
        y = np.arange(len(part))[::-1]
        ax.scatter([r[2] for r in part], y, color="#2ca02c", s=24, zorder=3, label="best swept config")
        ax.scatter(
            [r[4] for r in part], y, color=COLORS["tritongemm"], marker="D", s=18, zorder=3, label="heuristic"
        )
        for yy, r in zip(y, part):
            ax.annotate(
                r[3], (r[2], yy), textcoords="offset points", xytext=(6, -3), fontsize=6, color="#2ca02c"
            )
        ax.set_yticks(y)
        ax.set_yticklabels([r[0] for r in part], fontsize=7)
        ax.axvline(1.0, color="black", linestyle="--", linewidth=1)
        ax.set_xlim(0, max(1.2, top * 1.35))
        ax.set_xlabel("cuBLAS time / its time (> 1: faster than cuBLAS)")
        ax.set_ylabel("problem")
        ax.set_title(f"sweep '{group}'", fontsize=10)
        ax.grid(axis="x", alpha=0.3)
        ax.legend(fontsize=7, loc="lower right")
    fig.suptitle(f"config sweeps on {_gpu(df)}: the heuristic against the best config swept", fontsize=11)
    return fig


def ceilings(df) -> tuple[float | None, float | None]:
    """(copy bandwidth GB/s, cuBLAS's best TFLOP/s) from the CSV's ceiling rows (median over runs)."""
    c = df[(df["suite"] == "ceiling") & (df["status"] == OK)]
    bw = c.loc[c["variant"] == "copy_bandwidth", "gbps"].dropna()
    peak = c.loc[c["variant"] == "matmul_peak", "tflops"].dropna()
    return (float(bw.median()) if len(bw) else None, float(peak.median()) if len(peak) else None)


def fig_roofline(df) -> Figure | None:
    """Every successful measurement at its arithmetic intensity, under the roofs.

    Compute roof: the datasheet's dense fp16/bf16 tensor-core peak for the
    GPU (cuBLAS's measured best drawn too, dashed); memory roof: the copy
    bandwidth measured in the same run.  Without a known peak the measured
    cuBLAS rate stands in, and the legend says so.
    """
    d = _collapse(_measured(df))
    d = d[d["intensity"].notna() & (d["suite"] != "sweep")]
    if d.empty:
        return None
    bw, cublas_peak = ceilings(df)
    sheet = datasheet_peak(_gpu(df))
    peak, peak_label = (
        (sheet[0], f"{sheet[1]} datasheet,\ndense fp16/bf16 tensor cores")
        if sheet
        else (cublas_peak, "measured cuBLAS 8192³ bf16:\nno datasheet entry for this GPU")
    )
    fig = Figure(figsize=(11, 5.8), layout="constrained")
    ax = fig.subplots()
    colors: dict[str, str] = {}
    markers = {"fp16": "o", "bf16": "s", "fp32": "^", "fp64": "D"}
    grid = d["variant"].isin(_GRID_VARIANTS)
    d = d.assign(label=np.where(grid, "tritongemm (" + d["variant"].astype(str) + " configs)", d["impl"]))
    impl_handles, dtype_handles = {}, {}
    for label in _impl_order(d["label"]):
        s = d[d["label"] == label]
        color = _color(label, colors, s["family"].iloc[0])
        for dtype, g in s.groupby("dtype"):
            ax.scatter(
                g["intensity"], g["tflops"], s=18, alpha=0.75, color=color, marker=markers.get(dtype, "o")
            )
            dtype_handles.setdefault(
                dtype, Line2D([], [], color="0.3", marker=markers.get(dtype, "o"), linestyle="", label=dtype)
            )
        impl_handles[label] = Line2D([], [], color=color, marker="o", linestyle="", label=label)
    ax.set_xscale("log")
    ax.set_yscale("log")
    lo, hi = float(d["intensity"].min()) / 2, float(d["intensity"].max()) * 2
    roof_handles = []
    if bw and peak:
        ridge = peak * 1e3 / bw
        lo, hi = min(lo, ridge / 4), max(hi, ridge * 4)  # always show both roofs and the ridge
        x = np.logspace(math.log10(lo), math.log10(hi), 256)
        (roof,) = ax.plot(
            x,
            np.minimum(peak, x * bw / 1e3),
            color="black",
            linewidth=1.6,
            label=f"roof: {peak:.1f} TFLOP/s ({peak_label})\nand {bw:,.0f} GB/s (device copy, measured)",
        )
        roof_handles.append(roof)
        if sheet and cublas_peak:
            roof_handles.append(
                ax.axhline(
                    cublas_peak,
                    color="black",
                    linestyle="--",
                    linewidth=0.9,
                    label=f"cuBLAS 8192³ bf16: {cublas_peak:.0f} TFLOP/s (measured)",
                )
            )
        ax.axvline(ridge, color="black", linestyle=":", linewidth=0.8)
        ax.set_xlim(lo, hi)
        ymin = min(float(d["tflops"].min()), lo * bw / 1e3)
        ax.set_ylim(ymin / 1.5, peak * 1.6)
        title = f"roofline on {_gpu(df)} (ridge at {ridge:.0f} FLOP/byte)"
    else:
        title = f"measurements on {_gpu(df)} (no copy bandwidth in the CSV: roofs not drawn)"
    ax.set_xlabel("arithmetic intensity (FLOP per byte of compulsory DRAM traffic)")
    ax.set_ylabel("TFLOP/s")
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3, which="both")
    fig.legend(
        handles=roof_handles + list(impl_handles.values()),
        fontsize=7,
        loc="outside right upper",
        title="roofs and implementations",
        title_fontsize=7,
    )
    fig.legend(
        handles=list(dtype_handles.values()),
        fontsize=7,
        loc="outside right lower",
        title="dtype",
        title_fontsize=7,
    )
    return fig


def fig_compile(df) -> Figure | None:
    """tritongemm and torch.compile(max-autotune), each as cuBLAS time / its time in its own run.

    The two may come from different runs (files): each ratio is to the cuBLAS
    measured beside it, on the same inputs, so the ratios compare even where
    the absolute clocks of two runs differ by a few percent.
    """
    d = _collapse(_measured(df))
    d = d[d["speedup_vs_cublas"].notna()]
    compiled = d[d["family"] == "torch.compile"]
    if compiled.empty:
        return None
    key = ["suite", "case", "dtype"]
    wanted = d[d["impl"].isin(["tritongemm", "tritongemm:tuned", "torch.compile"])]
    both = compiled[key].merge(d[d["impl"] == "tritongemm"][key]).drop_duplicates()
    if both.empty:
        return None
    p = wanted.merge(both)
    panels = list(dict.fromkeys(zip(p["suite"], p["dtype"])))
    counts = [p[(p["suite"] == s) & (p["dtype"] == dt)]["case"].nunique() for s, dt in panels]
    ncols = 2 if len(panels) > 1 else 1
    nrows = math.ceil(len(panels) / ncols)
    row_cases = [max(counts[r * ncols : (r + 1) * ncols]) for r in range(nrows)]
    fig = Figure(
        figsize=(min(MAX_WIDTH_IN, 7.2 * ncols), 1.2 + 0.26 * sum(row_cases) + 0.9 * nrows),
        layout="constrained",
    )
    axes = fig.subplots(nrows, ncols, squeeze=False, height_ratios=[c + 2 for c in row_cases])
    for ax in axes.flat[len(panels) :]:
        ax.set_visible(False)
    colors: dict[str, str] = {}
    handles: dict = {}
    top = float(p["speedup_vs_cublas"].max())
    for ax, (suite, dtype) in zip(axes.flat, panels):
        part = p[(p["suite"] == suite) & (p["dtype"] == dtype)]
        cases = list(dict.fromkeys(part["case"]))
        _dot_rows(ax, part, cases, _impl_order(part["impl"]), colors, handles)
        ax.set_xlim(0, max(1.2, top * 1.05))
        ax.set_xlabel("cuBLAS time / its time (> 1: faster than cuBLAS)")
        ax.set_ylabel("problem")
        ax.set_title(f"{suite}, {dtype}", fontsize=10)
    _figure_legend(fig, handles)
    fig.suptitle(
        f"tritongemm vs torch.compile(mode='max-autotune-no-cudagraphs') on {_gpu(df)}\n"
        "each as a ratio to the cuBLAS timed beside it, on the same inputs",
        fontsize=11,
    )
    return fig


def fig_quick(df) -> Figure | None:
    """The quick benchmark: tritongemm vs cuBLAS by size, and the three pipelines at one size."""
    d = _measured(df, "quick")
    if d.empty:
        return None
    fig = Figure(figsize=(12, 4.6), layout="constrained")
    left, right = fig.subplots(1, 2, width_ratios=[1.6, 1])
    others: dict[str, str] = {}
    main = d[d["impl"].isin(["cublas", "tritongemm"])]
    labels = list(dict.fromkeys(f"{int(m)}\n{dt}" for m, dt in zip(main["m"], main["dtype"])))
    x = np.arange(len(labels))
    for i, impl in enumerate(["cublas", "tritongemm"]):
        s = main[main["impl"] == impl]
        vals = dict(zip((f"{int(m)}\n{dt}" for m, dt in zip(s["m"], s["dtype"])), s["tflops"]))
        left.bar(
            x + (i - 0.5) * 0.4,
            [vals.get(lbl, np.nan) for lbl in labels],
            0.4,
            label=impl,
            color=_color(impl, others),
        )
    left.set_xticks(x)
    left.set_xticklabels(labels, fontsize=8)
    left.set_xlabel("M = N = K, dtype")
    left.set_ylabel("TFLOP/s")
    left.set_title("tritongemm (heuristic config) vs cuBLAS", fontsize=10)
    left.grid(axis="y", alpha=0.3)
    left.legend(fontsize=8)

    pipe = d[d["impl"].str.startswith("tritongemm:") | (d["impl"] == "cublas")]
    sizes = pipe.groupby(["m", "dtype"])["impl"].nunique()
    if len(sizes) and sizes.max() > 1:
        m, dtype = sizes.idxmax()
        p = pipe[(pipe["m"] == m) & (pipe["dtype"] == dtype)]
        order = [i for i in ["cublas", *_PIPELINE_IMPLS] if i in set(p["impl"])]
        vals = [float(p.loc[p["impl"] == i, "tflops"].iloc[0]) for i in order]
        bars = right.bar(range(len(order)), vals, color=[_color(i, others) for i in order])
        for bar, impl in zip(bars, order):
            sp = p.loc[p["impl"] == impl, "speedup_vs_cublas"]
            if len(sp) and not np.isnan(sp.iloc[0]):
                right.annotate(
                    f"{sp.iloc[0]:.2f}x",
                    (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                    textcoords="offset points",
                    xytext=(0, 3),
                    ha="center",
                    fontsize=8,
                )
        right.set_xticks(range(len(order)))
        right.set_xticklabels([o.replace("tritongemm:", "") for o in order], fontsize=8, rotation=15)
        right.set_title(f"pipeline variants at {int(m)}³ {dtype} (x cuBLAS)", fontsize=10)
    right.set_xlabel("implementation")
    right.set_ylabel("TFLOP/s")
    right.grid(axis="y", alpha=0.3)
    fig.suptitle(f"tritongemm quick benchmark on {_gpu(df)}")
    return fig


# ----------------------------------------------------------------------------------
# All of them
# ----------------------------------------------------------------------------------
#: Figure kinds, for ``plot_all(..., kinds=)`` and ``python -m benchmarks plot --figures``.
KINDS = ("tflops", "speedup", "ladder", "heatmap", "sweep", "roofline", "compile", "quick")
#: Suites whose throughput is a question of bytes, not FLOPs: GB/s instead of TFLOP/s.
_BANDWIDTH_SUITES = ("decode",)


def figures_for(df, kinds: Iterable[str] = KINDS) -> list[tuple[str, Figure | None]]:
    """(file name, figure or None) for every figure of ``kinds`` the data could support."""
    unknown = set(kinds) - set(KINDS)
    if unknown:
        raise ValueError(f"unknown figure kind(s) {sorted(unknown)}; choose from {', '.join(KINDS)}")
    kinds = set(kinds)
    figures: list[tuple[str, Figure | None]] = []
    for suite in dict.fromkeys(df["suite"].dropna()):
        if suite == "ceiling":
            continue
        if suite == "quick":
            if "quick" in kinds:
                figures.append(("quick.png", fig_quick(df)))
        elif suite == "stages":
            if "ladder" in kinds:
                figures.append(("stages_ladder.png", fig_ladder(df)))
        elif suite == "hierarchy":
            if "heatmap" in kinds:
                figures.append(("hierarchy_heatmap.png", fig_heatmap(df)))
        elif suite == "sweep":
            if "sweep" in kinds:
                figures.append(("sweep_best.png", fig_sweep(df)))
        else:
            if "tflops" in kinds:
                metric = "gbps" if suite in _BANDWIDTH_SUITES else "tflops"
                figures.append((f"{suite}_{metric}.png", fig_tflops(df, suite, metric)))
            if "speedup" in kinds:
                figures.append((f"{suite}_speedup.png", fig_speedup(df, suite)))
    if "roofline" in kinds and not _measured(df[~df["suite"].isin(["quick", "sweep"])]).empty:
        figures.append(("roofline.png", fig_roofline(df)))
    if "compile" in kinds:
        figures.append(("vs_torch_compile.png", fig_compile(df)))
    return figures


def plot_all(data, out_dir: str | Path | None = None, kinds: Iterable[str] = KINDS) -> list[Path]:
    """Write every figure of ``kinds`` the data supports into ``out_dir``; returns the files written.

    ``data``: a DataFrame, or one or more CSV paths (``out_dir`` then defaults
    to the first CSV's folder).  A path that is not a results CSV raises
    ``schema.SchemaError``.
    """
    if out_dir is None:
        if isinstance(data, (str, Path)):
            out_dir = Path(data).parent
        elif isinstance(data, Sequence) and data and isinstance(data[0], (str, Path)):
            out_dir = Path(data[0]).parent
        else:
            raise ValueError("plot_all: out_dir is required when data is a DataFrame")
    df = load(data)
    out = Path(out_dir)
    written = []
    for name, fig in figures_for(df, kinds):
        if fig is None:
            continue
        out.mkdir(parents=True, exist_ok=True)
        path = out / name
        fig.savefig(path, dpi=DPI)
        written.append(path)
    return written
