"""Figures from results CSVs only: everything regenerates without a GPU.

``python -m benchmarks plot CSV [CSV ...] [--out DIR]`` writes whichever of
these the data supports:

* ``<suite>_tflops.png``   TFLOP/s vs size, one line per implementation
* ``<suite>_speedup.png``  speedup over cuBLAS per case, 1.0 marked
* ``stages_ladder.png``    the pipeline ladder: TFLOP/s by num_stages, one line per size
* ``hierarchy_heatmap.png`` TFLOP/s over block_m x block_n, one panel per warp count
* ``roofline.png``         every measurement against the measured ceilings
* ``quick.png``            the quick benchmark's two panels

Figures are built on ``matplotlib.figure.Figure`` directly (no pyplot), so
no display or backend choice is needed and nothing global is touched.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure

OK = "ok"
#: Fixed colours, so an implementation looks the same in every figure.
COLORS = {
    "cublas": "#222222",
    "torch.compile": "#8c8c8c",
    "tritongemm": "#1f77b4",
    "tritongemm:single_stage": "#ff7f0e",
    "tritongemm:double_buffer": "#2ca02c",
    "tritongemm:multi_stage": "#d62728",
}
_CYCLE = ["#9467bd", "#8c564b", "#e377c2", "#bcbd22", "#17becf", "#aec7e8", "#ffbb78", "#98df8a"]
_PIPELINE_SPANS = (("single_stage", 0.5, 1.5), ("double_buffer", 1.5, 2.5), ("multi_stage", 2.5, 99))


def _load(data):
    import pandas as pd

    if isinstance(data, pd.DataFrame):
        return data
    if isinstance(data, (str, Path)):
        data = [data]
    return pd.concat([pd.read_csv(p) for p in data], ignore_index=True)


def _color(impl: str, others: dict[str, str]) -> str:
    if impl in COLORS:
        return COLORS[impl]
    if impl not in others:
        others[impl] = _CYCLE[len(others) % len(_CYCLE)]
    return others[impl]


def _impl_order(impls: Iterable[str]) -> list[str]:
    known = list(COLORS)
    impls = list(dict.fromkeys(impls))
    return sorted(impls, key=lambda i: (known.index(i) if i in known else len(known), impls.index(i)))


def _measured(df, suite: str | None = None):
    d = df[(df["status"] == OK) & df["tflops"].notna() & (df["suite"] != "ceiling")]
    if "family" in d.columns:
        d = d[d["family"] != "test"]
    if suite is not None:
        d = d[d["suite"] == suite]
    return d


def _gpu(df) -> str:
    if "env_gpu" in df.columns and df["env_gpu"].notna().any():
        return str(df["env_gpu"].dropna().iloc[0])
    return "unknown GPU"


def _grid(n: int, ncols: int, panel_w: float, panel_h: float) -> tuple[Figure, np.ndarray]:
    ncols = max(1, min(ncols, n))
    nrows = math.ceil(n / ncols)
    fig = Figure(figsize=(panel_w * ncols, panel_h * nrows + 0.6), layout="constrained")
    axes = np.atleast_2d(fig.subplots(nrows, ncols, squeeze=False))
    for ax in axes.flat[n:]:
        ax.set_visible(False)
    return fig, axes


def _pipeline_name(stages: float) -> str:
    return "single_stage" if stages <= 1 else "double_buffer" if stages == 2 else "multi_stage"


# ----------------------------------------------------------------------------------
# Figures
# ----------------------------------------------------------------------------------
def fig_tflops(df, suite: str) -> Figure | None:
    """TFLOP/s against the swept size; one panel per (group, dtype), one line per implementation."""
    d = _measured(df, suite)
    if d.empty:
        return None
    panels = list(dict.fromkeys(zip(d["group"], d["dtype"])))
    fig, axes = _grid(len(panels), 3, 5.0, 3.6)
    others: dict[str, str] = {}
    for ax, (group, dtype) in zip(axes.flat, panels):
        p = d[(d["group"] == group) & (d["dtype"] == dtype)]
        for impl in _impl_order(p["impl"]):
            s = p[p["impl"] == impl].sort_values("x")
            ax.plot(s["x"], s["tflops"], marker="o", ms=4, label=impl, color=_color(impl, others))
        xs = sorted(p["x"].unique())
        if len(xs) > 1 and xs[-1] / max(xs[0], 1) >= 4:
            ax.set_xscale("log", base=2)
            ax.set_xticks(xs)
            ax.set_xticklabels([str(int(v)) for v in xs], fontsize=7)
        ax.set_xlabel(str(p["x_label"].iloc[0]) if "x_label" in p and p["x_label"].notna().any() else "size")
        ax.set_ylabel("TFLOP/s")
        ax.set_ylim(bottom=0)
        ax.set_title(f"{group} ({dtype})", fontsize=10)
        ax.grid(alpha=0.3)
        if ax is axes.flat[0]:
            ax.legend(fontsize=7)
    fig.suptitle(f"{suite}: TFLOP/s by size on {_gpu(df)} (median of do_bench)")
    return fig


def fig_speedup(df, suite: str) -> Figure | None:
    """Speedup over cuBLAS (cuBLAS time / impl time) per case; one panel per dtype."""
    d = _measured(df, suite)
    d = d[(d["family"] != "cublas") & d["speedup_vs_cublas"].notna()]
    if d.empty:
        return None
    dtypes = list(dict.fromkeys(d["dtype"]))
    cases = list(dict.fromkeys(d["case"]))
    impls = _impl_order(d["impl"])
    width_in = min(40.0, 3 + 0.16 * len(cases) * len(impls) + 0.25 * len(cases))
    fig = Figure(figsize=(max(width_in, 7.0), 4.4 * len(dtypes)), layout="constrained")
    axes = fig.subplots(len(dtypes), 1, squeeze=False)[:, 0]
    others: dict[str, str] = {}
    bar_w = 0.8 / len(impls)
    for ax, dtype in zip(axes, dtypes):
        p = d[d["dtype"] == dtype]
        labels = [c for c in cases if c in set(p["case"])]
        x = np.arange(len(labels))
        for i, impl in enumerate(impls):
            s = p[p["impl"] == impl].set_index("case")["speedup_vs_cublas"]
            vals = [float(s.get(c, np.nan)) for c in labels]
            ax.bar(x + (i - (len(impls) - 1) / 2) * bar_w, vals, bar_w, label=impl, color=_color(impl, others))
        ax.axhline(1.0, color="black", linestyle="--", linewidth=1)
        ax.text(-0.5, 1.0, " cuBLAS = 1.0", va="bottom", ha="left", fontsize=8)
        top = float(np.nanmax(p["speedup_vs_cublas"])) if len(p) else 1.0
        ax.set_ylim(0, max(1.15, top * 1.1))
        ax.set_xticks(x)
        ax.set_xticklabels(labels, rotation=60, ha="right", fontsize=7)
        ax.set_xlabel("case")
        ax.set_ylabel("speedup vs cuBLAS (x)")
        ax.set_title(f"{suite} ({dtype}): > 1 is faster than cuBLAS", fontsize=10)
        ax.grid(axis="y", alpha=0.3)
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.suptitle(f"{suite}: speedup over cuBLAS on {_gpu(df)}")
    return fig


def fig_ladder(df) -> Figure | None:
    """The pipeline ladder: TFLOP/s by num_stages at fixed tiles, one line per size."""
    d = df[(df["suite"] == "stages") & (df["variant"] == "stages")]
    if d.empty or not (d["status"] == OK).any():
        return None
    dtypes = list(dict.fromkeys(d["dtype"]))
    fig, axes = _grid(len(dtypes), 2, 6.5, 4.4)
    cublas = df[(df["suite"] == "stages") & (df["family"] == "cublas") & (df["status"] == OK)]
    for ax, dtype in zip(axes.flat, dtypes):
        p = d[d["dtype"] == dtype]
        stages = sorted(int(s) for s in p["num_stages"].dropna().unique())
        for name, lo, hi in _PIPELINE_SPANS:
            ax.axvspan(lo, min(hi, max(stages, default=1) + 0.5), alpha=0.06,
                       color={"single_stage": "C1", "double_buffer": "C2", "multi_stage": "C3"}[name])
        for i, m in enumerate(sorted(p["m"].unique())):
            color = f"C{i}"
            s = p[(p["m"] == m) & (p["status"] == OK)].sort_values("num_stages")
            ax.plot(s["num_stages"], s["tflops"], marker="o", color=color, label=f"{int(m)}^3 tritongemm")
            for st, tf in zip(s["num_stages"], s["tflops"]):
                ax.annotate(f"{tf:.0f}", (st, tf), textcoords="offset points", xytext=(0, 5), ha="center",
                            fontsize=6, color=color)
            skipped = p[(p["m"] == m) & (p["status"] != OK)]
            for st, status in zip(skipped["num_stages"], skipped["status"]):
                if not np.isnan(st):
                    ax.plot([st], [0], marker="x", color=color, ms=8)
                    ax.annotate("does not fit" if status == "invalid_config" else status, (st, 0),
                                textcoords="offset points", xytext=(0, 6 + 9 * i), ha="center", fontsize=6,
                                color=color)
            ref = cublas[(cublas["m"] == m) & (cublas["dtype"] == dtype)]["tflops"]
            if len(ref):
                ax.axhline(float(ref.iloc[0]), color=color, linestyle=":", linewidth=1,
                           label=f"{int(m)}^3 cuBLAS")
        ax.set_xticks(stages)
        ax.set_xticklabels([f"{s}\n{_pipeline_name(s)}" for s in stages], fontsize=7)
        ax.set_xlim(0.5, max(stages, default=1) + 0.5)
        ax.set_ylim(bottom=0)
        ax.set_xlabel("num_stages (K tiles in flight)")
        ax.set_ylabel("TFLOP/s")
        cfg = p["config"].dropna()
        tiles = " ".join(str(cfg.iloc[0]).split()[:1]) if len(cfg) else ""
        warps = p["num_warps"].dropna()
        ax.set_title(f"pipeline ladder ({dtype}), tiles {tiles}"
                     + (f", {int(warps.iloc[0])} warps" if len(warps) else ""), fontsize=10)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(f"single_stage -> double_buffer -> multi_stage on {_gpu(df)}")
    return fig


def fig_heatmap(df) -> Figure | None:
    """TFLOP/s over (block_m, block_n); one panel per (dtype, size, num_warps)."""
    d = df[(df["suite"] == "hierarchy") & (df["variant"] == "hierarchy")]
    if d.empty or not (d["status"] == OK).any():
        return None
    panels = list(dict.fromkeys(zip(d["dtype"], d["m"], d["num_warps"])))
    fig, axes = _grid(len(panels), 2, 4.6, 4.0)
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
        ax.set_title(f"{int(m)}^3 {dtype}, {int(warps)} warps"
                     + (f", {int(stages.iloc[0])} stages" if len(stages) else ""), fontsize=10)
    if image is not None:
        fig.colorbar(image, ax=list(axes.flat), label="TFLOP/s", shrink=0.8)
    fig.suptitle(f"tiling hierarchy sweep on {_gpu(df)} (n/a: exceeds a register or shared-memory budget)")
    return fig


def ceilings(df) -> tuple[float | None, float | None]:
    """(copy bandwidth GB/s, peak matmul TFLOP/s) from the CSV's ceiling rows (median over runs)."""
    c = df[(df["suite"] == "ceiling") & (df["status"] == OK)]
    bw = c.loc[c["variant"] == "copy_bandwidth", "gbps"].dropna()
    peak = c.loc[c["variant"] == "matmul_peak", "tflops"].dropna()
    return (float(bw.median()) if len(bw) else None, float(peak.median()) if len(peak) else None)


def fig_roofline(df) -> Figure | None:
    """Every successful measurement at its arithmetic intensity, under the measured roofs."""
    d = _measured(df)
    d = d[d["intensity"].notna()]
    if d.empty:
        return None
    bw, peak = ceilings(df)
    fig = Figure(figsize=(10, 5.5), layout="constrained")
    ax = fig.subplots()
    others: dict[str, str] = {}
    markers = {"fp16": "o", "bf16": "s", "fp32": "^", "fp64": "D"}
    # Sweeps (one implementation per config) share one legend entry per sweep.
    sweep = d["variant"].isin(["stages", "hierarchy"]) if "variant" in d else False
    d = d.assign(label=np.where(sweep, "tritongemm (" + d["variant"].astype(str) + " sweep)", d["impl"]))
    for label in _impl_order(d["label"]):
        s = d[d["label"] == label]
        for dtype, g in s.groupby("dtype"):
            ax.scatter(g["intensity"], g["tflops"], s=16, alpha=0.75, color=_color(label, others),
                       marker=markers.get(dtype, "o"), label=f"{label} ({dtype})")
    ax.set_xscale("log")
    ax.set_yscale("log")
    lo, hi = float(d["intensity"].min()) / 2, float(d["intensity"].max()) * 2
    if bw and peak:
        ridge = peak * 1e3 / bw
        lo, hi = min(lo, ridge / 4), max(hi, ridge * 4)  # always show both roofs and the ridge
        x = np.logspace(math.log10(lo), math.log10(hi), 256)
        ax.plot(x, np.minimum(peak, x * bw / 1e3), color="black", linewidth=1.5,
                label=f"roofs: {bw:.0f} GB/s copy, {peak:.0f} TFLOP/s cuBLAS bf16 8192^3")
        ax.axvline(ridge, color="black", linestyle=":", linewidth=0.8)
        ax.set_xlim(lo, hi)
        ymin = min(float(d["tflops"].min()), lo * bw / 1e3)
        ax.set_ylim(ymin / 1.5, peak * 1.5)
        title = f"roofline on {_gpu(df)} (ridge at {ridge:.0f} FLOP/byte)"
    else:
        title = f"measurements on {_gpu(df)} (no ceilings in the CSV: roofs not drawn)"
    ax.set_xlabel("arithmetic intensity (FLOP per byte of compulsory DRAM traffic)")
    ax.set_ylabel("TFLOP/s")
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
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
        ax_x = x + (i - 0.5) * 0.4
        ax_y = [vals.get(lbl, np.nan) for lbl in labels]
        left.bar(ax_x, ax_y, 0.4, label=impl, color=_color(impl, others))
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
        order = [i for i in ["cublas", "tritongemm:single_stage", "tritongemm:double_buffer",
                             "tritongemm:multi_stage"] if i in set(p["impl"])]
        vals = [float(p.loc[p["impl"] == i, "tflops"].iloc[0]) for i in order]
        bars = right.bar(range(len(order)), vals, color=[_color(i, others) for i in order])
        for bar, impl in zip(bars, order):
            sp = p.loc[p["impl"] == impl, "speedup_vs_cublas"]
            if len(sp) and not np.isnan(sp.iloc[0]):
                right.annotate(f"{sp.iloc[0]:.2f}x", (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                               textcoords="offset points", xytext=(0, 3), ha="center", fontsize=8)
        right.set_xticks(range(len(order)))
        right.set_xticklabels([o.replace("tritongemm:", "") for o in order], fontsize=8, rotation=15)
        right.set_title(f"pipeline variants at {int(m)}^3 {dtype} (x cuBLAS)", fontsize=10)
    right.set_xlabel("implementation")
    right.set_ylabel("TFLOP/s")
    right.grid(axis="y", alpha=0.3)
    fig.suptitle(f"tritongemm quick benchmark on {_gpu(df)}")
    return fig


# ----------------------------------------------------------------------------------
# All of them
# ----------------------------------------------------------------------------------
def plot_all(data, out_dir: str | Path | None = None) -> list[Path]:
    """Write every figure the data supports into ``out_dir``; returns the files written.

    ``data``: a DataFrame, or one or more CSV paths (``out_dir`` then defaults
    to the first CSV's folder).
    """
    if out_dir is None:
        if isinstance(data, (str, Path)):
            out_dir = Path(data).parent
        elif isinstance(data, Sequence) and data and isinstance(data[0], (str, Path)):
            out_dir = Path(data[0]).parent
        else:
            raise ValueError("plot_all: out_dir is required when data is a DataFrame")
    df = _load(data)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    figures: list[tuple[str, Figure | None]] = []
    for suite in dict.fromkeys(df["suite"].dropna()):
        if suite == "ceiling":
            continue
        if suite == "quick":
            figures.append(("quick.png", fig_quick(df)))
        elif suite == "stages":
            figures.append(("stages_ladder.png", fig_ladder(df)))
        elif suite == "hierarchy":
            figures.append(("hierarchy_heatmap.png", fig_heatmap(df)))
        else:
            figures.append((f"{suite}_tflops.png", fig_tflops(df, suite)))
            figures.append((f"{suite}_speedup.png", fig_speedup(df, suite)))
    if not _measured(df[df["suite"] != "quick"]).empty:
        figures.append(("roofline.png", fig_roofline(df)))
    written = []
    for name, fig in figures:
        if fig is None:
            continue
        path = out / name
        fig.savefig(path, dpi=120)
        written.append(path)
    return written

