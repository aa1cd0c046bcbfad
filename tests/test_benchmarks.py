"""The benchmark harness, suites, plots and CLI, on the CPU (no GPU needed).

GPU timing cannot run here; what can is: the correctness gate (it must reject
a wrong implementation and record it untimed), L2 rotation, CSV round trips
with the environment, suite shape lists, every figure from synthetic CSVs, the
fp8 suite's gate and rounds on tiny shapes, and ``python -m benchmarks quick``
on Triton's interpreter.
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pandas as pd
import pytest
import torch

import tritongemm
from benchmarks import fp8, harness, plots, quick, schema, suites
from benchmarks.__main__ import _parser as cli_parser
from benchmarks.__main__ import main as cli_main
from benchmarks.harness import Case, Impl
from tritongemm.testing import MAX_ROTATION_COPIES

REPO = Path(__file__).resolve().parent.parent

ENV = {
    "gpu": "NVIDIA H100 80GB HBM3",
    "sm_count": 132,
    "capability": "9.0",
    "l2_mb": 50.0,
    "gpu_memory_gb": 85.0,
    "driver": "580.159.04",
    "cuda": "13.0",
    "torch": "2.11.0",
    "triton": "3.6.0",
    "python": "3.12.3",
    "tritongemm": "0.1.0",
    "git": "abc1234",
    "tf32": False,
    "triton_interpret": "0",
    "date": "2026-11-23T00:00:00+00:00",
}


# ----------------------------------------------------------------------------------
# Synthetic results, built through the harness's own row code
# ----------------------------------------------------------------------------------
def _fake_tflops(impl: str, case: Case) -> float:
    """A plausible, deterministic rate: grows with size, differs per implementation."""
    base = {
        "cublas": 600.0,
        "torch.compile": 580.0,
        "tritongemm": 540.0,
        "tritongemm:single_stage": 250.0,
        "tritongemm:double_buffer": 420.0,
        "tritongemm:multi_stage": 550.0,
    }.get(impl, 400.0)
    scale = min(1.0, math.log2(max(case.m * case.n * case.k, 2)) / 39)
    return base * scale + (len(impl) % 7)


def _rows_for(case: Case, dtype: torch.dtype, impls: list[tuple[str, str, str, object]]) -> list[dict]:
    rows = []
    for name, family, variant, cfg in impls:
        row = {
            **harness._base_row(case, dtype),
            "impl": name,
            "family": family,
            "variant": variant,
            "n_copies": 4,
            "rel_err": 1e-4,
            "tol": 1e-2,
        }
        row.update(harness._config_columns(cfg))
        if cfg is not None and not _fits(cfg, dtype):
            row.update(status=harness.INVALID, message="exceeds the shared-memory budget")
        else:
            ms = case.flops / (_fake_tflops(name, case) * 1e12) * 1e3
            row.update(status=harness.OK, message="", ms=ms, ms_p20=ms * 0.98, ms_p80=ms * 1.02)
        rows.append(row)
    return rows


def _fits(cfg: tritongemm.TileConfig, dtype: torch.dtype) -> bool:
    try:
        cfg.validate(tritongemm.device.INTERPRETER_DEVICE, torch.empty((), dtype=dtype).element_size())
        return True
    except tritongemm.ConfigError:
        return False


BASELINES = [
    ("cublas", "cublas", "torch.matmul", None),
    ("tritongemm", "tritongemm", "heuristic", None),
    ("torch.compile", "torch.compile", "max-autotune-no-cudagraphs", None),
]
PIPES = [(f"tritongemm:{p}", "tritongemm", p, None) for p in tritongemm.PIPELINES]


def synthetic_rows() -> list[dict]:
    rows = [
        {
            "suite": "ceiling",
            "group": "ceiling",
            "case": "d2d copy 1024 MiB",
            "impl": "torch.Tensor.copy_",
            "family": "ceiling",
            "variant": "copy_bandwidth",
            "status": "ok",
            "gbps": 3000.0,
            "ms": 0.7,
        },
        {
            "suite": "ceiling",
            "group": "ceiling",
            "case": "cublas 8192^3 bf16",
            "impl": "cublas",
            "family": "ceiling",
            "variant": "matmul_peak",
            "status": "ok",
            "tflops": 790.0,
            "ms": 1.4,
        },
    ]
    for dtype in (torch.float16, torch.bfloat16):
        for case in suites.square_cases():
            rows += _rows_for(case, dtype, BASELINES + PIPES)
    for case in suites.llm_cases()[:6] + suites.decode_cases()[:6]:
        rows += _rows_for(case, torch.float16, BASELINES + PIPES)
    for case in suites.stages_cases():
        stage_impls = [
            (f"tritongemm:stages={s}", "tritongemm", "stages", cfg)
            for s, cfg in suites.stage_configs(torch.float16)
        ]
        rows += _rows_for(case, torch.float16, BASELINES[:1] + stage_impls)
    for case in suites.hierarchy_cases():
        grid = [
            (f"tritongemm:{c.block_m}x{c.block_n}w{c.num_warps}", "tritongemm", "hierarchy", c)
            for c in suites.hierarchy_configs(torch.float16)
        ]
        rows += _rows_for(case, torch.float16, BASELINES[:1] + grid)
    for case in suites.backward_cases()[:3]:
        rows += _rows_for(case, torch.bfloat16, BASELINES)
    for case in suites.decomposition_cases():
        decomps = [(f"tritongemm:{d}", "tritongemm", d, None) for d in ("sliced_k", "split_k", "stream_k")]
        rows += _rows_for(case, torch.float16, BASELINES[:2] + decomps)
    for case in suites.square_cases()[2:4]:  # a config sweep: the heuristic and two fixed configs
        sweep = [("cublas", "cublas", "torch.matmul", None), ("tritongemm", "tritongemm", "heuristic", None)]
        sweep += [
            (f"tritongemm:{c.short()}", "tritongemm", "sweep", c)
            for c in (tritongemm.TileConfig(64, 64, 32), tritongemm.TileConfig(128, 128, 64, num_warps=8))
        ]
        rows += [{**r, "suite": "sweep", "group": "small"} for r in _rows_for(case, torch.float16, sweep)]
    for case in quick.quick_cases():
        for dtype in quick.QUICK_DTYPES:
            impls = BASELINES[:2] + (
                PIPES if case.m == quick.PIPELINE_SIZE and dtype == torch.float16 else []
            )
            rows += [{**r, "suite": "quick"} for r in _rows_for(case, dtype, impls)]
    harness._finish_rows(rows)
    return rows


@pytest.fixture(scope="module")
def synthetic_csv(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("results") / "synthetic.csv"
    return harness.write_results(synthetic_rows(), path, ENV, {"suite": "synthetic"})


# ----------------------------------------------------------------------------------
# Plots
# ----------------------------------------------------------------------------------
@pytest.mark.slow  # (the CLI's plot test draws figures in the default tier)
def test_plot_all_writes_every_figure_from_csv_alone(synthetic_csv, tmp_path):
    files = plots.plot_all([synthetic_csv], tmp_path / "figs")
    names = {f.name for f in files}
    expected = {
        "square_tflops.png",
        "square_speedup.png",
        "llm_tflops.png",
        "llm_speedup.png",
        "decode_gbps.png",
        "decode_speedup.png",
        "backward_tflops.png",
        "backward_speedup.png",
        "decomposition_tflops.png",
        "decomposition_speedup.png",
        "stages_ladder.png",
        "hierarchy_heatmap.png",
        "sweep_best.png",
        "roofline.png",
        "vs_torch_compile.png",
        "quick.png",
    }
    assert expected <= names, expected - names
    for f in files:
        assert f.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and f.stat().st_size > 5000, f


def _visible_axes(fig):
    return [ax for ax in fig.axes if ax.get_visible() and ax.get_label() != "<colorbar>"]


FIGURES = {
    "tflops": lambda df: plots.fig_tflops(df, "square"),
    "gbps": lambda df: plots.fig_tflops(df, "decode", "gbps"),
    "bars": lambda df: plots.fig_tflops(df, "decomposition"),
    "speedup": lambda df: plots.fig_speedup(df, "llm"),
    "ladder": plots.fig_ladder,
    "heatmap": plots.fig_heatmap,
    "sweep": plots.fig_sweep,
    "roofline": plots.fig_roofline,
    "compile": plots.fig_compile,
    "quick": plots.fig_quick,
}


@pytest.mark.parametrize("name", list(FIGURES))
def test_figures_label_their_axes_and_stay_readable(synthetic_csv, name):
    fig = FIGURES[name](harness.read_results(synthetic_csv))
    assert fig is not None
    axes = _visible_axes(fig)
    assert axes
    for ax in axes:
        # a y label on the panel, or on the panel whose y axis it shares
        ylabels = [a.get_ylabel() for a in ax.get_shared_y_axes().get_siblings(ax)]
        assert ax.get_xlabel() and any(ylabels), (name, ax.get_title())
    assert "NVIDIA H100" in fig.get_suptitle() or "NVIDIA H100" in axes[0].get_title()
    width, height = fig.get_size_inches() * plots.DPI
    assert width <= 1920 and height <= 2400, (width, height)


def test_speedup_figure_marks_cublas_parity(synthetic_csv):
    fig = plots.fig_speedup(harness.read_results(synthetic_csv), "square")
    for ax in _visible_axes(fig):
        assert any(list(line.get_xdata()) == [1.0, 1.0] for line in ax.get_lines()), "no line at 1.0"


def test_tflops_figure_draws_lines_only_along_one_swept_size(synthetic_csv):
    df = harness.read_results(synthetic_csv)
    # square: the six M = N = K sizes are one line per impl and dtype; the single 5120x5120x4096 NT problem
    # gets no panel of its own (the title names it), so there are exactly the two dtype panels.
    fig = plots.fig_tflops(df, "square")
    axes = _visible_axes(fig)
    assert [ax.get_title() for ax in axes] == ["fp16", "bf16"]
    assert "5120x5120x4096 NT" in fig.get_suptitle()
    assert all(len(line.get_xdata()) == len(suites.SQUARE_SIZES) for ax in axes for line in ax.get_lines())
    # decomposition: four unrelated shapes (K is not the only thing that changes): bars, no joining lines
    (ax,) = _visible_axes(plots.fig_tflops(df, "decomposition"))
    assert not ax.get_lines() and len(ax.patches) == 4 * 5
    assert [t.get_text() for t in ax.get_xticklabels()] == [c.label for c in suites.decomposition_cases()]


def test_roofline_roof_is_the_datasheet_peak_and_the_measured_copy(synthetic_csv):
    df = harness.read_results(synthetic_csv)
    assert plots.ceilings(df) == (3000.0, 790.0)
    fig = plots.fig_roofline(df)
    ax = fig.axes[0]
    assert "ridge at 330 FLOP/byte" in ax.get_title()  # 989.4 TFLOP/s / 3000 GB/s
    roof = next(line for line in ax.get_lines() if line.get_label().startswith("roof"))
    assert max(roof.get_ydata()) == pytest.approx(989.4) and "datasheet" in roof.get_label()
    assert any(list(line.get_ydata()) == [790.0, 790.0] for line in ax.get_lines())  # cuBLAS, measured
    assert plots.datasheet_peak("NVIDIA H100 PCIe") == (756.0, "H100 PCIe")
    unknown = df.assign(env_gpu="Some Future GPU")
    roof = next(
        line
        for line in plots.fig_roofline(unknown).axes[0].get_lines()
        if line.get_label().startswith("roof")
    )
    assert max(roof.get_ydata()) == pytest.approx(790.0) and "no datasheet entry" in roof.get_label()
    no_ceilings = df[df["suite"] != "ceiling"]
    assert "not drawn" in plots.fig_roofline(no_ceilings).axes[0].get_title()


def test_compile_figure_puts_tritongemm_beside_torch_compile(synthetic_csv):
    df = harness.read_results(synthetic_csv)
    fig = plots.fig_compile(df)
    labels = {t.get_text() for t in fig.legends[0].get_texts()}
    assert {"tritongemm", "torch.compile"} <= labels
    assert plots.fig_compile(df[df["family"] != "torch.compile"]) is None


def test_sweep_figure_compares_the_heuristic_with_the_best_config(synthetic_csv):
    df = harness.read_results(synthetic_csv)
    (ax,) = _visible_axes(plots.fig_sweep(df))
    best, heuristic = ax.collections[:2]
    sweep = df[(df["suite"] == "sweep") & (df["family"] == "tritongemm")]
    per_case = sweep.groupby(["case"], sort=False)["speedup_vs_cublas"].max()
    assert sorted(best.get_offsets()[:, 0]) == pytest.approx(sorted(per_case))
    assert len(heuristic.get_offsets()) == len(per_case)


def test_figures_skip_missing_data(synthetic_csv):
    df = harness.read_results(synthetic_csv)
    only_square = df[df["suite"] == "square"]
    assert plots.fig_ladder(only_square) is None
    assert plots.fig_heatmap(only_square) is None
    assert plots.fig_quick(only_square) is None


def test_cli_plot_regenerates_figures(synthetic_csv, tmp_path, capsys):
    df = harness.read_results(synthetic_csv)
    small = tmp_path / "stages.csv"
    df[df["suite"].isin(["stages", "ceiling"])].to_csv(small, index=False)
    assert cli_main(["plot", str(small), "--out", str(tmp_path / "figs")]) == 0
    assert sorted(p.name for p in (tmp_path / "figs").iterdir()) == ["roofline.png", "stages_ladder.png"]
    assert "wrote" in capsys.readouterr().out
    assert (
        cli_main(["plot", str(synthetic_csv), "--out", str(tmp_path / "only"), "--figures", "speedup"]) == 0
    )
    assert {p.name.rsplit("_", 1)[-1] for p in (tmp_path / "only").iterdir()} == {"speedup.png"}


def test_cli_plot_names_a_file_it_cannot_plot_in_one_line(synthetic_csv, tmp_path, capsys):
    other = tmp_path / "other.csv"
    other.write_text("shape,dtype,impl,ms\n64x64x64,fp16,cublas,0.1\n")
    missing = tmp_path / "missing.csv"
    # every file skipped: no figure, status 1, one line each, no traceback
    assert cli_main(["plot", str(other), str(missing), "--out", str(tmp_path / "none")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and "Traceback" not in "".join(err)
    assert str(other) in err[0] and "not a benchmarks results CSV" in err[0] and "suite" in err[0]
    assert str(missing) in err[1] and "no such file" in err[1]
    # a good file beside a bad one: its figures are written, and the status still says something was skipped
    assert (
        cli_main(
            ["plot", str(synthetic_csv), str(other), "--out", str(tmp_path / "some"), "--figures", "ladder"]
        )
        == 1
    )
    out = capsys.readouterr()
    assert "stages_ladder.png" in out.out and out.err.count("\n") == 1


def test_every_committed_results_csv_is_in_the_schema():
    csvs = sorted((REPO / "benchmarks" / "results").glob("**/*.csv"))
    assert len(csvs) >= 28
    for path in csvs:
        df = schema.read(path)
        assert list(df.columns[: len(schema.COLUMNS)]) == schema.COLUMNS, path
        assert set(df["status"].dropna()) <= set(schema.STATUSES), path
        assert df["env_gpu"].notna().all(), path


def test_sweep_rows_are_written_in_the_schema(tmp_path):
    """``sweep_skinny`` writes its rows in the results schema: cuBLAS rows without a speedup, the heuristic's
    row marked as such, a config that failed as an error row with its message."""
    from benchmarks.sweep_skinny import to_schema

    env = dict(gpu="NVIDIA H100 80GB HBM3", sm_count=132, torch="2.11", triton="3.6", date="2026-11-24")
    base = dict(group="prompt", m=64, n=512, k=512, layout="NT", dtype="fp16")
    rows = pd.DataFrame(
        [
            dict(base, impl="cublas", ms=0.0064, ratio=1.0, **env),
            dict(base, impl="heuristic", ms=0.0066, ratio=0.97, warps=4, stages=4, inline=False, **env),
            dict(
                base, impl="64x32x128 g8 w4 s4", ms=0.0064, ratio=1.0, warps=4, stages=4, inline=False, **env
            ),
            dict(base, impl="64x32x128 g8 w4 s4 splitk2i", error="RuntimeError: rel err 1", **env),
        ]
    )
    path = tmp_path / "sweep_skinny.csv"
    to_schema(rows).to_csv(path, index=False)
    df = schema.read(path)
    assert list(df["impl"]) == ["cublas", "tritongemm", "tritongemm", "tritongemm"]
    assert list(df["status"]) == ["ok", "ok", "ok", "error"]
    assert math.isnan(df["speedup_vs_cublas"][0]) and list(df["speedup_vs_cublas"][1:3]) == [0.97, 1.0]
    assert df["variant"][1] == "heuristic" and df["config"][2] == "64x32x128 g8 w4 s4"
    assert df["message"][3].startswith("RuntimeError") and (df["case"] == "64x512x512 NT").all()
    assert (df["env_gpu"] == env["gpu"]).all() and (df["suite"] == "sweep").all()


def test_the_results_readme_documents_every_column():
    readme = (REPO / "benchmarks" / "results" / "README.md").read_text()
    documented = re.findall(r"^\| `(\w+)` \|", readme, flags=re.M)
    assert documented == schema.COLUMNS


# ----------------------------------------------------------------------------------
# CSV and environment
# ----------------------------------------------------------------------------------
def test_csv_round_trip_keeps_environment_in_every_row(synthetic_csv):
    rows = synthetic_rows()
    df = pd.read_csv(synthetic_csv)
    assert len(df) == len(rows)
    assert list(df.columns[: len(harness.COLUMNS)]) == harness.COLUMNS
    for key, value in ENV.items():
        assert (df[f"env_{key}"].astype(str) == str(value)).all(), key
    sidecar = json.loads(synthetic_csv.with_suffix(".env.json").read_text())
    assert sidecar["environment"] == ENV and sidecar["suite"] == "synthetic"
    ok = df[(df["status"] == "ok") & (df["suite"] != "ceiling")]
    assert pd.api.types.is_float_dtype(df["tflops"]) and (ok["tflops"] > 0).all()
    cublas = ok[ok["family"] == "cublas"]
    assert (cublas["speedup_vs_cublas"] == 1.0).all()
    assert set(df["status"]) == {"ok", "invalid_config"}


def test_environment_is_recorded_without_a_gpu():
    env = harness.environment(torch.device("cpu"))
    for key in ("gpu", "sm_count", "driver", "cuda", "torch", "triton", "date"):
        assert key in env
    assert env["torch"] == torch.__version__
    assert harness.gpu_slug("NVIDIA H100 80GB HBM3") == "h100"  # the folder the committed results use
    assert harness.gpu_slug("NVIDIA H200") == "h200"
    assert harness.gpu_slug("NVIDIA H100 PCIe") == "h100"
    assert harness.gpu_slug("NVIDIA RTX 6000 Ada Generation") == "nvidia-rtx-6000-ada-generation"


# ----------------------------------------------------------------------------------
# The gate, rotation, and whole runs on the CPU
# ----------------------------------------------------------------------------------
def test_gate_accepts_rounding_and_rejects_wrong_results():
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(64, 256, generator=gen).half()
    b = torch.randn(256, 48, generator=gen).half()
    ref = (a.float() @ b.float()).half()
    rounded_differently = (a.double() @ b.double()).half()
    assert harness.check_output(rounded_differently, ref).ok
    wrong = suites.sabotaged().fn(a.float(), b.float()).half()
    bad = harness.check_output(wrong, ref)
    assert not bad.ok and bad.rel_err > 10 * bad.tol and "exceeds tolerance" in bad.reason
    nan = ref.clone()
    nan[3, 4] = float("nan")
    assert "NaN" in harness.check_output(nan, ref).reason
    assert "shape" in harness.check_output(ref[:, :-1], ref).reason
    assert "dtype" in harness.check_output(ref.float(), ref).reason


def test_copies_exceed_twice_the_l2():
    l2 = 50 * 2**20
    for set_bytes in (2**16, 3 * 2**20, 40 * 2**20, 2**30):
        n = harness.copies_to_exceed_l2(set_bytes, l2)
        assert n * set_bytes >= harness.L2_ROTATION_FACTOR * l2 or n == MAX_ROTATION_COPIES
        assert n >= 1


def _counting(fn, seen: list):
    def impl(a, b):
        seen.append(a.data_ptr())
        return fn(a, b)

    return impl


def _cpu_impls(case, dtype, seen):
    impls = [suites.cublas(), suites.sabotaged(), Impl("counting", "test", _counting(torch.matmul, seen))]
    if tritongemm.interpreter_enabled():
        impls.insert(1, suites.tritongemm_heuristic())
    return impls


def test_run_cases_interleaves_timing_rounds(monkeypatch):
    # Implementations are timed in rounds, the order reversed every other round
    # (A B | B A | A B), and each row's median covers every round's samples.
    case = Case("test", "tiny", "16x16x16", 16, 16, 16, "NN")
    timed: list = []

    def fake_samples(step, device, warmup_ms, rep_ms, grad_to_none=None):
        timed.append(step)
        return [float(len(timed))]

    monkeypatch.setattr(harness, "time_samples", fake_samples)
    impls = [suites.cublas(), Impl("other", "test", torch.matmul)]
    rows = harness.run_cases(
        [case],
        [torch.float32],
        lambda c, d: impls,
        suites.cublas(),
        device="cpu",
        rep_ms=3,
        progress=False,
        rounds=3,
    )
    first_seen = list(dict.fromkeys(timed))
    assert [first_seen.index(s) for s in timed] == [0, 1, 1, 0, 0, 1]
    by_impl = {r["impl"]: r for r in rows}
    assert (
        by_impl["cublas"]["ms"] == 4.0 and by_impl["other"]["ms"] == 3.0
    )  # medians of (1, 4, 5) and (2, 3, 6)


@pytest.mark.parametrize("backward", [False, True], ids=["forward", "backward"])
def test_run_cases_gates_before_timing_and_rotates_inputs(backward):
    case = Case("test", "tiny", "48x40x64", 48, 40, 64, "NT", backward=backward)
    seen: list = []
    set_bytes = harness.input_set_bytes(case, torch.float32)
    rows = harness.run_cases(
        [case],
        [torch.float32],
        lambda c, d: _cpu_impls(c, d, seen),
        suites.cublas(),
        device="cpu",
        rep_ms=30,
        l2_bytes=4 * set_bytes,
        progress=False,
    )
    by_impl = {r["impl"]: r for r in rows}
    assert by_impl["cublas"]["status"] == "ok" and by_impl["cublas"]["ms"] > 0
    assert by_impl["cublas"]["n_copies"] == 8 and by_impl["cublas"]["backward"] == backward

    wrong = by_impl["sabotaged"]
    assert wrong["status"] == "failed_gate"
    assert "relative error" in wrong["message"]
    assert wrong.get("ms") is None and wrong.get("tflops") is None  # rejected, never timed

    timed = seen[2:]  # after the gate's two calls (first and last copy), timing walks the copies in turn
    assert len(timed) >= 6 and len(set(timed[:8])) == min(8, len(timed)), "timing must rotate the copies"
    if tritongemm.interpreter_enabled():
        tg = by_impl["tritongemm"]
        assert tg["status"] == "ok", tg.get("message")
        assert tg["rel_err"] < tg["tol"] and tg["config"] and tg["block_m"] >= 16
        assert tg["speedup_vs_cublas"] > 0


def test_run_cases_records_invalid_configs_and_errors():
    case = Case("test", "tiny", "32x32x32", 32, 32, 32)
    too_big = tritongemm.TileConfig(256, 256, 128, 8, 4, 6)  # far over every budget

    def boom(a, b):
        raise RuntimeError("kernel exploded")

    impls = [
        suites.cublas(),
        Impl("boom", "test", boom),
        suites.tritongemm_config("tritongemm:too_big", "stages", too_big),
    ]
    rows = harness.run_cases(
        [case], [torch.float32], lambda c, d: impls, suites.cublas(), device="cpu", rep_ms=2, progress=False
    )
    by_impl = {r["impl"]: r for r in rows}
    assert by_impl["boom"]["status"] == "error" and "kernel exploded" in by_impl["boom"]["message"]
    big = by_impl["tritongemm:too_big"]
    assert big["status"] == "invalid_config" and big["num_stages"] == 6 and big["block_m"] == 256


def test_run_cases_reports_progress(monkeypatch):
    import io

    stream = io.StringIO()
    monkeypatch.setattr("sys.stderr", stream)
    case = Case("test", "tiny", "16x16x16", 16, 16, 16, "NN")
    impls = [suites.cublas(), Impl("other", "test", torch.matmul)]
    harness.run_cases([case], [torch.float32], lambda c, d: impls, suites.cublas(), device="cpu", rep_ms=3)
    text = stream.getvalue()
    assert "1/2 runs" in text and "2/2 runs" in text and "16x16x16 other" in text


# ----------------------------------------------------------------------------------
# Suites
# ----------------------------------------------------------------------------------
def test_llama_presets_give_the_published_layer_shapes():
    l8, l70 = suites.LLAMA3["llama3-8b"], suites.LLAMA3["llama3-70b"]
    assert dict((p, (n, k)) for p, n, k in l8.projections()) == {
        "qkv": (6144, 4096),
        "o": (4096, 4096),
        "gate_up": (28672, 4096),
        "down": (4096, 14336),
    }
    assert dict((p, (n, k)) for p, n, k in l70.projections()) == {
        "qkv": (10240, 8192),
        "o": (8192, 8192),
        "gate_up": (57344, 8192),
        "down": (8192, 28672),
    }


def test_llm_and_decode_cases():
    llm, decode = suites.llm_cases(), suites.decode_cases()
    assert {c.m for c in llm} == {1024, 4096, 8192}
    assert {c.m for c in decode} == {1, 8, 16, 32, 64, 128}
    assert len(llm) == 2 * 4 * 3 and len(decode) == 2 * 4 * 6
    assert {(c.n, c.k) for c in llm} == {(c.n, c.k) for c in decode}
    assert all(c.layout == "NT" for c in llm + decode)  # x @ W.T with W stored (N, K)
    qkv70 = [c for c in llm if c.group == "llama3-70b qkv" and c.m == 4096]
    assert [(c.m, c.n, c.k) for c in qkv70] == [(4096, 10240, 8192)]


def test_square_stages_hierarchy_backward_cases():
    sq = suites.square_cases()
    assert [c.m for c in sq if c.layout == "NN"] == list(suites.SQUARE_SIZES)
    assert suites.SQUARE_SIZES == (256, 512, 1024, 1536, 2048, 3072, 4096, 6144, 8192)
    assert all(c.m == c.n == c.k for c in sq if c.layout == "NN")
    (nt,) = [c for c in sq if c.layout == "NT"]
    assert (nt.m, nt.n, nt.k) == (5120, 5120, 4096)
    assert [c.m for c in suites.stages_cases()] == [2048, 4096, 8192]
    stage_cfgs = suites.stage_configs(torch.float16)
    assert [s for s, _ in stage_cfgs] == [1, 2, 3, 4, 5]
    assert {(c.block_m, c.block_n, c.block_k, c.num_warps) for _, c in stage_cfgs} == {(128, 256, 64, 8)}
    assert [c.pipeline for _, c in stage_cfgs][:3] == ["single_stage", "double_buffer", "multi_stage"]
    grid = suites.hierarchy_configs(torch.float16)
    assert {c.num_stages for c in grid} == {3} and len(grid) == 3 * 3 * 2
    assert all(c.backward for c in suites.backward_cases())
    dec = suites.decomposition_cases()
    assert [(c.m, c.n, c.k) for c in dec] == [
        (512, 512, 65536),
        (1024, 1024, 32768),
        (896, 2432, 4096),
        (1536, 1536, 8192),
    ]
    variants = [
        i.variant
        for i in suites.implementations(suites.SUITES["decomposition"], torch.float16, compile=False)
    ]
    assert {"sliced_k", "split_k", "stream_k"} <= set(variants)
    for suite in suites.SUITES.values():
        labels = [c.label for c in suite.cases()]
        assert len(labels) == len(set(labels)), suite.name


def test_implementations_compare_baselines_and_variants():
    impls = suites.implementations(suites.SUITES["square"], torch.float16, compile=False)
    names = [i.name for i in impls]
    assert names[0] == "cublas"
    assert {
        "tritongemm",
        "tritongemm:single_stage",
        "tritongemm:double_buffer",
        "tritongemm:multi_stage",
    } <= set(names)
    assert "torch.compile" not in names
    stages = suites.implementations(suites.SUITES["stages"], torch.float16, compile=False)
    assert [i.config.num_stages for i in stages if i.variant == "stages"] == [1, 2, 3, 4, 5]


def test_dtype_parsing():
    suite = suites.SUITES["square"]
    assert suites.parse_dtypes("fp16,bf16", suite) == [torch.float16, torch.bfloat16]
    assert suites.parse_dtypes(None, suites.SUITES["stages"]) == [torch.float16]
    with pytest.raises(ValueError, match="int8"):
        suites.parse_dtypes("int8", suite)


# ----------------------------------------------------------------------------------
# The CLI and the main job
# ----------------------------------------------------------------------------------
def test_gpu_entry_points_exist():
    # The GPU-only paths are importable here (their syntax is checked) and callable from a script.
    for fn in (quick.run_quick, quick.quick_gpu, suites.run_suite, harness.measure_ceilings):
        assert callable(fn)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU message")
def test_cli_run_without_gpu_explains_itself(capsys):
    assert cli_main(["run", "--suite", "square"]) == 2
    assert "quick" in capsys.readouterr().err


_LOOP_PROBE = """
import triton, triton.language as tl, torch
@triton.jit
def k(x, n):
    for i in range(0, n):
        tl.store(x + i, i)
k[(1,)](torch.zeros(3), 3)
"""


@pytest.mark.heavy
def test_quick_reexecs_with_the_interpreter(tmp_path):
    """`python -m benchmarks quick` from a shell without TRITON_INTERPRET: it sets it itself."""
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "TRITONGEMM_POISON_OUTPUTS")}
    env["CUDA_VISIBLE_DEVICES"] = ""
    probe = subprocess.run(
        [sys.executable, "-c", _LOOP_PROBE],
        env={**env, "TRITON_INTERPRET": "1"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    if "only 0-dimensional arrays can be converted" in probe.stderr:
        # Triton 3.6's interpreter with numpy >= 2.4 (the GPU image): tritongemm raises a clear error there.
        pytest.skip("this Triton's interpreter cannot loop over a runtime bound with this numpy")
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks", "quick", "--out", str(tmp_path)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert "NO GPU" in out and "54/54 checks passed" in out and "No timings" in out
    assert all(p in out for p in ("single_stage", "double_buffer", "multi_stage"))
    df = pd.read_csv(tmp_path / "quick_interpreter.csv")
    assert set(df["status"]) == {"ok"} and set(df["env_triton_interpret"].astype(str)) == {"1"}


def test_a_plotting_failure_does_not_lose_the_run(tmp_path, capsys):
    bad = tmp_path / "bad.csv"
    bad.write_text("not,a,results,file\n1,2,3,4\n")
    assert harness.plot_safely(bad, tmp_path) == []
    assert "benchmarks plot" in capsys.readouterr().err


def test_shape_class_suites_cover_issue_17s_classes():
    """Four decoder families besides Llama-3 at the issue's token counts; encoder widths and K = 128-256."""
    from benchmarks import shape_classes

    fam = suites.SUITES["families"].cases()
    assert len({c.label for c in fam}) == len(fam) == 4 * 4 * 5
    assert {c.m for c in fam} == {256, 512, 1024, 2048, 6000}
    assert not set(shape_classes.FAMILIES) & set(suites.LLAMA3)
    qwen = dict((p, (n, k)) for p, n, k in shape_classes.FAMILIES["qwen2.5-7b"].projections())
    assert qwen == {"qkv": (4608, 3584), "o": (3584, 3584), "gate_up": (37888, 3584), "down": (3584, 18944)}
    gemma = dict((p, (n, k)) for p, n, k in shape_classes.FAMILIES["gemma-2-9b"].projections())
    assert gemma["o"] == (3584, 4096) and gemma["qkv"] == (8192, 3584)  # 16 heads of 256
    short = suites.SUITES["shortk"].cases()
    assert len({c.label for c in short}) == len(short)
    assert all(
        c.k <= 1280 and c.m >= 8192 for c in short if c.group.startswith("encoder") and "down" not in c.label
    )
    assert {c.k for c in short if not c.group.startswith("encoder")} == {128, 256}
    assert {1536, 3072, 6144} <= {c.m for c in suites.square_cases()}


# ----------------------------------------------------------------------------------
# The fp8 suite (scaled_mm vs torch._scaled_mm)
# ----------------------------------------------------------------------------------
def test_fp8_cases_measure_each_listed_shape_once():
    shapes = [(c.m, c.n, c.k) for c in fp8.cases()]
    assert len(shapes) == len(set(shapes)) == 19
    listed = {(4096, 4096, 4096), (8192, 8192, 4096), (2048, 14336, 4096), (1024, 18944, 3584)}
    assert listed | {(256, 5120, 5120), (16, 4096, 4096)} <= set(shapes)
    for n, k in fp8.PROJECTIONS.values():  # every token count over both projections: M from 16 to 8192
        assert sorted(m for m, nn, kk in shapes if (nn, kk) == (n, k)) == list(fp8.TOKENS)
    assert (fp8.TOKENS[0], fp8.TOKENS[-1]) == (16, 8192)
    assert [r.name for r in fp8.RECIPES] == [
        "tensorwise",
        "tensorwise+fast_accum",
        "rowwise",
        "rowwise+fast_accum",
        "blockwise",
    ]
    blockwise = fp8.RECIPES[-1]
    assert blockwise.blocked and blockwise.library_scaling == "blockwise_1x128_128x128"
    assert not blockwise.fast_accum and not any(r.blocked for r in fp8.RECIPES[:4])
    # --recipes picks some, in the suite's order
    assert fp8.select_recipes() == fp8.RECIPES
    assert [r.name for r in fp8.select_recipes("blockwise, tensorwise")] == ["tensorwise", "blockwise"]
    assert fp8.select_recipes(["rowwise+fast_accum"]) == (fp8.Recipe("rowwise", True),)
    for bad in ("blockwise,rowwize", "", ","):
        with pytest.raises(ValueError, match="choose from"):
            fp8.select_recipes(bad)
    # --shape restricts the list, once per shape; a shape the suite does not list runs as "custom"
    picked = fp8.select_cases([(16, 4096, 4096), (100, 200, 300), (16, 4096, 4096)])
    assert [(c.group, c.shape) for c in picked] == [
        ("proj N=4096 K=4096", "16x4096x4096"),
        ("custom", "100x200x300"),
    ]


def test_fp8_cli_parses_shapes_rounds_and_out():
    args = cli_parser().parse_args(
        ["fp8", "--shape", "16x4096x4096", "--shape", "256X5120X5120", "--rounds", "5", "--out", "d"]
    )
    assert args.shape == [(16, 4096, 4096), (256, 5120, 5120)] and args.rounds == 5 and args.out == "d"
    defaults = cli_parser().parse_args(["fp8"])
    assert defaults.shape is None and defaults.rounds is None and not defaults.no_plots
    assert defaults.recipes is None and fp8.select_recipes(defaults.recipes) == fp8.RECIPES
    picked = cli_parser().parse_args(["fp8", "--recipes", "blockwise,tensorwise+fast_accum"])
    assert picked.recipes == ["tensorwise+fast_accum", "blockwise"]
    for bad in (["--shape", "16x4096"], ["--rounds", "0"], ["--recipes", "blockwise,1x128"]):
        with pytest.raises(SystemExit):
            cli_parser().parse_args(["fp8", *bad])


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU message")
def test_fp8_without_gpu_explains_itself(capsys):
    assert cli_main(["fp8", "--shape", "16x4096x4096"]) == 2
    err = capsys.readouterr().err
    assert "no CUDA GPU" in err and "torch._scaled_mm" in err and "plot" in err


def _cpu_scaled_mm(a, b, scale_a, scale_b) -> torch.Tensor:
    """``torch._scaled_mm`` where torch's CPU kernel takes the scales (tensorwise, rowwise); block
    scales, which it does not take, dequantized block by block in fp32 instead (as ``scaled_mm``
    does on a CPU without the interpreter)."""
    from tritongemm.frontend.scaled import _torch_scaled_mm, scaling_of

    if scaling_of(a, b, scale_a, scale_b) in ("tensorwise", "rowwise"):
        return torch._scaled_mm(a, b, scale_a, scale_b, out_dtype=torch.bfloat16)
    return _torch_scaled_mm(a, b, scale_a, scale_b, None, torch.bfloat16, "none", None, None)


#: The suite's torch baseline on the CPU (same name and family): ``_cpu_scaled_mm``.
CPU_TORCH = fp8.Fp8Impl("torch._scaled_mm", "cublas", lambda a, b, sa, sb, fast: _cpu_scaled_mm(a, b, sa, sb))


def _fake_timing(monkeypatch) -> list:
    """Replace do_bench by a fake that records the steps it times, in order."""
    timed: list = []

    def fake_samples(step, device, warmup_ms, rep_ms, grad_to_none=None):
        timed.append(step)
        return [float(len(timed))]

    monkeypatch.setattr(harness, "time_samples", fake_samples)
    return timed


def test_fp8_shape_is_gated_against_float64_then_timed_in_interleaved_rounds(monkeypatch):
    """Every recipe's output, ours and torch's, is held to the bf16 gate against the float64 product of
    the dequantized operands; one that drops a scale is rejected untimed; the rest are timed in rounds
    that reverse their order (A B .. | .. B A | A B ..), on the same rotated copies.  (Torch's CPU
    ``_scaled_mm`` takes no block scales: its stand-in computes the blockwise recipe, ours runs it
    on the interpreter.)"""
    timed = _fake_timing(monkeypatch)

    def drops_scale_b(a, b, scale_a, scale_b, fast_accum):
        return _cpu_scaled_mm(a, b, scale_a, torch.ones_like(scale_b))

    wrong = fp8.Fp8Impl("drops scale_b", "test", drops_scale_b)
    case = fp8.Fp8Case("tiny", 32, 48, 64)
    rows = fp8.measure_shape(
        case, "cpu", impls=(fp8.IMPLS[0], CPU_TORCH, wrong), rounds=3, l2_bytes=3 * fp8.input_set_bytes(case)
    )
    assert len(rows) == len(fp8.RECIPES) * 3
    by = {(r["variant"], r["impl"]): r for r in rows}
    tol = harness.gate_tolerance(torch.bfloat16)
    for recipe in fp8.RECIPES:
        ours, theirs = by[recipe.name, "tritongemm.scaled_mm"], by[recipe.name, "torch._scaled_mm"]
        for r in (ours, theirs):
            assert r["status"] == "ok", r.get("message")
            assert 0 < r["rel_err"] < r["tol"] == tol and r["message"] == fp8.REFERENCE_NOTE
            assert (r["dtype"], r["layout"], r["out_dtype"]) == ("fp8_e4m3", "NT", "bf16")
            assert (r["scaling"], r["fast_accum"]) == (recipe.scaling, recipe.fast_accum)
            assert r["n_copies"] == 6 and r["case"] == f"32x48x64 {recipe.name}"
            assert r["bytes"] == 32 * 64 + 64 * 48 + 32 * 48 * 2 and r["tflops"] > 0
        assert ours["speedup_vs_cublas"] == pytest.approx(theirs["ms"] / ours["ms"])
        assert theirs["speedup_vs_cublas"] == 1.0
        assert ours["config"] and ours["kernel"]
        bad = by[recipe.name, "drops scale_b"]
        assert bad["status"] == "failed_gate" and bad["rel_err"] > 1 and "relative error" in bad["message"]
        assert bad.get("ms") is None and bad.get("tflops") is None  # rejected, never timed
    first_seen = list(dict.fromkeys(timed))
    assert len(first_seen) == 10  # the five recipes' two timed implementations
    forward = list(range(10))
    assert [first_seen.index(s) for s in timed] == forward + forward[::-1] + forward


def test_fp8_blockwise_gate_rejects_scales_on_the_wrong_block(monkeypatch):
    """The blockwise recipe on a shape of several K blocks and weight blocks, both ragged (300 = 2 x 128
    + 44, 200 = 128 + 72): ours (on the interpreter) and torch's pass a reference that scales each
    operand block by block; an output with a scale on the wrong block of K (of ``a`` or of the
    weight), on the wrong block of N, or with the recipe's scales read as rowwise ones is rejected."""
    timed = _fake_timing(monkeypatch)
    from tritongemm.frontend.scaled import _torch_scaled_mm

    def with_scales(name, change):
        def fn(a, b, scale_a, scale_b, fast_accum):
            sa, sb = change(scale_a, scale_b)
            return _torch_scaled_mm(a, b, sa, sb, None, torch.bfloat16, "none", None, None)

        return fp8.Fp8Impl(name, "test", fn)

    def as_rowwise(a, b, scale_a, scale_b, fast_accum):  # each row's / block's first K block for all of K
        sa = scale_a[:, 0].unsqueeze(1)  # (M, 1), stride (1, 1) as torch wants
        sb = scale_b[0].repeat_interleave(128)[: b.shape[1]].unsqueeze(0)
        return torch._scaled_mm(a, b, sa, sb, out_dtype=torch.bfloat16)

    wrongs = (
        with_scales("a's K blocks rolled", lambda sa, sb: (sa.roll(1, 1), sb)),
        with_scales("w's K blocks rolled", lambda sa, sb: (sa, sb.roll(1, 0))),
        with_scales("w's N blocks swapped", lambda sa, sb: (sa, sb.flip(1))),
        fp8.Fp8Impl("read as rowwise", "test", as_rowwise),
    )
    blockwise = fp8.select_recipes("blockwise")
    case = fp8.Fp8Case("tiny", 40, 200, 300)
    set_bytes = fp8.input_set_bytes(case)
    assert set_bytes == 40 * 300 + 300 * 200 + 4 * (2 + 40 + 200 + 40 * 3 + 3 * 2)
    rows = fp8.measure_shape(
        case, "cpu", recipes=blockwise, impls=(fp8.IMPLS[0], CPU_TORCH, *wrongs), rounds=2,
        l2_bytes=3 * set_bytes,
    )  # fmt: skip
    by = {r["impl"]: r for r in rows}
    assert len(rows) == 6 and {r["variant"] for r in rows} == {r["scaling"] for r in rows} == {"blockwise"}
    tol = harness.gate_tolerance(torch.bfloat16)
    for name in ("tritongemm.scaled_mm", "torch._scaled_mm"):
        r = by[name]
        assert r["status"] == "ok", r.get("message")
        assert 0 < r["rel_err"] < r["tol"] == tol and r["fast_accum"] is False
        assert r["case"] == "40x200x300 blockwise" and r["n_copies"] == 6
    assert by["tritongemm.scaled_mm"]["config"] and by["tritongemm.scaled_mm"]["kernel"]
    for wrong in wrongs:
        bad = by[wrong.name]
        assert bad["status"] == "failed_gate" and bad["rel_err"] > tol, (wrong.name, bad)
        assert bad.get("ms") is None
    assert len(set(timed)) == 2  # ours and torch's, nothing else


def test_fp8_progress_counts_the_recipes_asked_for(monkeypatch):
    """``run_fp8`` (``--recipes``): the progress bar's total and each shape's runs follow the recipes."""
    from benchmarks import runner

    seen: dict = {}

    def fake_measure_all(case_list, runs_per_case, measure, progress):
        seen.update(runs=runs_per_case, recipes=measure.keywords["recipes"], cases=list(case_list))
        return []

    monkeypatch.setattr(runner, "measure_all", fake_measure_all)
    picked = fp8.select_recipes("blockwise,rowwise")
    fp8.run_fp8(fp8.select_cases([(16, 4096, 4096)]), "cpu", recipes=picked, progress=False)
    assert seen["runs"] == 2 * len(fp8.IMPLS) and seen["recipes"] == picked
    fp8.run_fp8(fp8.select_cases([(16, 4096, 4096)]), "cpu", progress=False)
    assert seen["runs"] == 5 * len(fp8.IMPLS) and seen["recipes"] == fp8.RECIPES


def _fake_fp8_rows() -> list[dict]:
    """Rows as the suite writes them, with plausible rates; one recipe of one shape failed its gate."""
    rows = []
    for case in fp8.cases():
        for recipe in fp8.RECIPES:
            for impl in fp8.IMPLS:
                row = {
                    **fp8.base_row(case, recipe),
                    "impl": impl.name,
                    "family": impl.family,
                    "n_copies": 2,
                    "rel_err": 2e-3,
                    "tol": 3e-2,
                }
                if (
                    case.m == 16
                    and case.n == 14336
                    and recipe.name == "rowwise"
                    and impl.family == "tritongemm"
                ):
                    rows.append({**row, "rel_err": 0.5, "status": "failed_gate", "message": "relative error"})
                    continue
                rate = (900.0 if impl.family == "cublas" else 860.0 + 40 * (case.m % 3)) * (
                    1.3 if recipe.fast_accum else 1.0
                ) * min(1.0, math.log2(case.m) / 12)  # fmt: skip
                ms = case.flops / (rate * 1e12) * 1e3
                rows.append({**row, "status": "ok", "message": fp8.REFERENCE_NOTE, "ms": ms})
    harness._finish_rows(rows)
    return rows


def test_fp8_rows_tables_figure_and_plot_command(tmp_path, capsys):
    rows = _fake_fp8_rows()
    csv = harness.write_results(rows, tmp_path / "h100" / "fp8.csv", ENV, {"suite": "fp8"})
    df = schema.read(csv)
    assert list(df.columns[: len(schema.COLUMNS)]) == schema.COLUMNS
    assert {"scaling", "fast_accum", "out_dtype"} <= set(df.columns) and (df["env_gpu"] == ENV["gpu"]).all()
    ours = df[(df["family"] == "tritongemm") & (df["status"] == "ok")]
    theirs = df[df["family"] == "cublas"]
    assert (ours["speedup_vs_cublas"] > 0).all() and (theirs["speedup_vs_cublas"] == 1).all()

    table = fp8.summary_table(rows)
    assert len(table.splitlines()) == 2 + 19 * 5  # heading, rule, one line per (shape, recipe)
    assert "torch ms / ours ms" in table and "ours failed_gate" in table
    assert sum(" blockwise " in line for line in table.splitlines()) == 19
    means = {(g["recipe"], g["fast"]): g for g in fp8.geomeans(rows)}
    assert means["rowwise", "no"]["shapes"] == 18 and means["tensorwise", "yes"]["shapes"] == 19
    assert list(means) == [(r.scaling, "yes" if r.fast_accum else "no") for r in fp8.RECIPES]
    assert means["blockwise", "no"]["shapes"] == 19
    # a run of some recipes (--recipes) lists only those
    only = [r for r in rows if r["variant"] == "blockwise"]
    assert [(g["recipe"], g["shapes"]) for g in fp8.geomeans(only)] == [("blockwise", 19)]
    assert all(0.9 < g["geomean"] < 1.1 for g in means.values())
    assert "geomean" in fp8.geomean_table(rows)

    fig = fp8.fig_fp8(harness.read_results(csv))
    (legend,) = fig.legends
    assert [t.get_text() for t in legend.get_texts()] == [r.name for r in fp8.RECIPES]
    ratio_ax, rate_ax = _visible_axes(fig)
    drawn = {line.get_color() for line in ratio_ax.get_lines()}
    assert {fp8.COLORS[r.name] for r in fp8.RECIPES} <= drawn  # every recipe's series, blockwise too
    assert any(list(line.get_ydata()) == [1.0, 1.0] for line in ratio_ax.get_lines()), "no parity line"
    assert ratio_ax.get_ylabel() and rate_ax.get_ylabel() == "TFLOP/s" and rate_ax.get_xlabel()
    assert [t.get_text() for t in rate_ax.get_xticklabels()] == [c.shape for c in fp8.cases()]
    assert "NVIDIA H100" in fig.get_suptitle()
    width, height = fig.get_size_inches() * plots.DPI
    assert width <= 1920 and height <= 2400, (width, height)

    # `plot` draws the suite's own figure (no bf16 roofline or generic panels for fp8 rows)
    assert cli_main(["plot", str(csv), "--out", str(tmp_path / "figs")]) == 0
    assert sorted(p.name for p in (tmp_path / "figs").iterdir()) == [fp8.FIGURE]
    assert (tmp_path / "figs" / fp8.FIGURE).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "wrote" in capsys.readouterr().out


def test_fp8_train_corpus_blocks_and_figure(tmp_path):
    """The fp8 training benchmark's parts that need no GPU: a reproducible corpus with structure,
    the converted projections, the figure from fake results."""
    from benchmarks import fp8_train

    a = fp8_train.markov_corpus(3000, seed=3, device="cpu")
    assert torch.equal(a, fp8_train.markov_corpus(3000, seed=3, device="cpu"))
    assert not torch.equal(a, fp8_train.markov_corpus(3000, seed=4, device="cpu"))
    pairs = a[:-1] * fp8_train.VOCAB + a[1:]
    # Peaked transitions: far fewer distinct successor pairs than a uniform chain would show.
    assert pairs.unique().numel() < 0.7 * pairs.numel()
    layers, _ = fp8_train.llama_block("meta", "fp8", "tensorwise")
    assert all(type(m) is tritongemm.nn.Float8Linear and m.recipe == "tensorwise" for m in layers.values())
    curves = {
        "bf16 stock": [5.5 - 0.01 * i for i in range(50)],
        "fp8 rowwise": [5.5 - 0.01 * i for i in range(50)],
    }
    timing = [
        dict(phase=p, variant=v, speedup=s)
        for p in ("prefill", "train step")
        for v, s in (("bf16 stock", 1.0), ("fp8 rowwise", 1.3))
    ]
    fp8_train._plot(curves, timing, {"gpu": "test GPU"}, tmp_path / "f.png")
    assert (tmp_path / "f.png").stat().st_size > 10_000


# ----------------------------------------------------------------------------------
# The mlp suite (a whole gated MLP block: torch vs GatedMLP vs unfused Linear)
# ----------------------------------------------------------------------------------
def test_mlp_cases_are_three_gated_and_three_plain_models_at_four_token_counts():
    from benchmarks import mlp

    cases = mlp.cases()
    assert len(cases) == len({c.label for c in cases}) == 2 * 3 * 4 * 2
    widths = {(c.model, c.hidden, c.intermediate, c.activation, c.gated) for c in cases}
    assert widths == {
        ("llama3-8b", 4096, 14336, "silu", True),
        ("qwen2.5-7b", 3584, 18944, "silu", True),
        ("gemma-7b", 3072, 24576, "gelu_tanh", True),
        ("gpt2", 768, 3072, "gelu_tanh", False),
        ("bert-large", 1024, 4096, "gelu", False),
        ("vit-h", 1280, 5120, "gelu", False),
    }
    assert {c.m for c in cases if c.gated} == {1024, 2048, 4096, 8192}
    assert {c.m for c in cases if not c.gated} == {2048, 4096, 8192, 16384}
    llama = next(c for c in cases if c.model == "llama3-8b" and c.m == 4096 and c.backward)
    assert llama.flops == 3 * 3 * 2 * 4096 * 14336 * 4096
    gpt2 = next(c for c in cases if c.model == "gpt2" and c.m == 2048 and not c.backward)
    assert gpt2.flops == 2 * 2 * 2048 * 3072 * 768
    assert gpt2.bytes(2) == 2 * (2 * 2048 * 768 + 2 * 768 * 3072 + 3072 + 768)
    assert [i.family for i in mlp.IMPLS] == ["cublas", "tritongemm", "tritongemm"]


@pytest.mark.parametrize(
    "backward", [False, pytest.param(True, marks=pytest.mark.slow)], ids=["forward", "backward"]
)
@pytest.mark.parametrize("gated", [True, False], ids=["gated", "plain"])
def test_mlp_suite_gates_then_times_each_implementation(backward, gated, tmp_path, monkeypatch):
    """On the interpreter with a tiny block: the three implementations pass the gate (with backward:
    the output and every gradient) and are timed; a wrong one is recorded failed_gate, untimed;
    the rows go to the schema and to the suite's two figures."""
    import tritongemm.frontend.mlp
    from benchmarks import mlp
    from tritongemm.autograd.mlp import mlp_op

    calls = []
    monkeypatch.setattr(tritongemm.frontend.mlp, "FUSED_MIN_MACS", 0)  # the plain MLP's fused backward
    monkeypatch.setattr(tritongemm.frontend.mlp, "mlp_op", lambda *a: calls.append(a[-1]) or mlp_op(*a))

    def wrong(stock):
        module = mlp._sharing(stock, fuse_mlp=False)
        setattr(module, "act_fn" if gated else "act", torch.nn.ReLU())  # the wrong activation
        return module

    impls = (*mlp.IMPLS, mlp.MlpImpl("sabotaged", "test", "ReLU for GELU", wrong))
    case = mlp.MlpCase("tiny", 16, 40, "gelu_tanh", 12, backward, gated)
    rows = mlp.measure_case(
        case,
        torch.float32,
        "cpu",
        impls=impls,
        rounds=2,
        warmup_ms=0,
        rep_ms=1,
        l2_bytes=3 * mlp.input_set_bytes(case, torch.float32),  # 2 x L2 over the copies: 6 of them
    )
    by = {r["impl"]: r for r in rows}
    for name in ("torch", "tritongemm fused", "tritongemm unfused"):
        r = by[name]
        assert r["status"] == "ok", r.get("message")
        assert r["rel_err"] <= r["tol"] and r["ms"] > 0 and r["tflops"] > 0 and r["n_copies"] == 6
        assert (r["m"], r["n"], r["k"], r["backward"], r["activation"]) == (12, 40, 16, backward, "gelu_tanh")
        assert r["speedup_vs_cublas"] == pytest.approx(by["torch"]["ms"] / r["ms"])
    bad = by["sabotaged"]
    assert bad["status"] == "failed_gate" and bad.get("ms") is None
    assert bad["message"].startswith("out:")
    assert bool(calls) == (backward and not gated)  # a plain block's training ran the fused backward
    csv = harness.write_results(rows, tmp_path / "mlp.csv", ENV, {"suite": "mlp"})
    df = schema.read(csv)
    assert list(df.columns[: len(schema.COLUMNS)]) == schema.COLUMNS
    assert sorted(p.name for p in mlp.plot_mlp(csv, tmp_path)) == ["mlp_speedup.png", "mlp_tflops.png"]
    assert "tritongemm fused ms" in mlp.summary_table(rows)


def test_mlp_suite_is_listed_and_refused_without_gpu(capsys):
    assert cli_main(["list"]) == 0
    out = capsys.readouterr().out
    assert "mlp" in out and "gemma-7b M=8192 fwd+bwd" in out
    if not torch.cuda.is_available():
        assert cli_main(["run", "--suite", "mlp"]) == 2
        assert "no CUDA GPU" in capsys.readouterr().err


# ----------------------------------------------------------------------------------
# The epilogue suite (a linear layer's fused epilogue: torch vs tritongemm.linear fused and unfused)
# ----------------------------------------------------------------------------------
def test_epilogue_cases_are_the_plan_at_four_token_counts_in_the_default_dtypes():
    from benchmarks import epilogue

    cases = epilogue.cases()
    keys = [(c.dtype, c.label) for c in cases]
    assert len(keys) == len(set(keys)) == (4 + 3) * 4 * 2 + 4 * 2
    assert {(c.width.n, c.width.k) for c in cases} == {
        (14336, 4096),
        (4096, 14336),
        (18944, 3584),
        (28672, 8192),
    }
    assert {c.m for c in cases} == {512, 1000, 2048, 4096}
    assert {c.epilogue.name for c in cases if c.width.name != "llama3-8b up"} == {"bias+gelu"}
    assert {(c.width.name, c.epilogue.name) for c in cases if c.dtype == "fp16"} == {
        ("llama3-8b up", "bias+gelu")
    }
    # --dtype names the dtypes: then every (width, epilogue) in each
    assert len(epilogue.cases(["fp16"])) == (4 + 3) * 4 * 2
    big = next(c for c in cases if c.width.name == "llama3-70b up" and c.m == 4096 and c.backward)
    assert big.flops == 3 * 2 * 4096 * 28672 * 8192
    assert (big.group, big.label) == (
        "llama3-70b up bias+gelu fwd+bwd",
        "llama3-70b up bias+gelu M=4096 fwd+bwd",
    )
    assert [i.family for i in epilogue.IMPLS] == ["cublas", "tritongemm", "tritongemm"]
    with pytest.raises(ValueError, match="fp12"):
        epilogue.parse_dtypes("bf16,fp12")


@pytest.mark.parametrize(
    "name, backward",
    [("bias+gelu", False), ("bias+silu", True), pytest.param("bias+residual", True, marks=pytest.mark.slow)],
    ids=["gelu-forward", "silu-backward", "residual-backward"],
)
def test_epilogue_suite_gates_then_times_each_implementation(name, backward, tmp_path):
    """On the interpreter with a tiny layer: the three implementations pass the float64 gate (with
    backward: the output and the gradients of x, w and b) and are timed; a wrong one -- a wrong
    activation forward, a bias cut from the graph backward -- is recorded failed_gate, untimed; the
    rows go to the schema, the suite's figure and ``python -m benchmarks plot``."""
    from benchmarks import epilogue

    def wrong(ep, x, w, b, residual):
        if backward:  # right output, but no gradient reaches the bias
            return epilogue.fused(ep, x, w, b.detach(), residual)
        return torch.relu(epilogue.fused(ep, x, w, b, residual))

    impls = (*epilogue.IMPLS, epilogue.EpilogueImpl("sabotaged", "test", "wrong", wrong))
    ep = next(e for e in epilogue.EPILOGUES if e.name == name)
    case = epilogue.EpilogueCase(epilogue.Width("tiny", 40, 16), ep, 12, backward, "fp32")
    rows = epilogue.measure_case(
        case,
        "cpu",
        impls=impls,
        rounds=2,
        warmup_ms=0,
        rep_ms=1,
        l2_bytes=epilogue.input_set_bytes(case),  # 2 x L2 over the copies: 2 of them
    )
    by = {r["impl"]: r for r in rows}
    for impl in ("torch", "tritongemm", "tritongemm unfused"):
        r = by[impl]
        assert r["status"] == "ok", r.get("message")
        assert r["rel_err"] <= r["tol"] and r["ms"] > 0 and r["tflops"] > 0 and r["n_copies"] == 2
        assert (r["m"], r["n"], r["k"], r["backward"]) == (12, 40, 16, backward)
        assert (r["epilogue"], r["mode"], r["group"]) == (name, case.mode, f"tiny {name} {case.mode}")
        assert r["speedup_vs_cublas"] == pytest.approx(by["torch"]["ms"] / r["ms"])
        assert "float64" in r["message"]
    bad = by["sabotaged"]
    assert bad["status"] == "failed_gate" and bad.get("ms") is None
    assert bad["message"].startswith("grad_b:" if backward else "out:")
    csv = harness.write_results(rows, tmp_path / "epilogue.csv", ENV, {"suite": "epilogue"})
    df = schema.read(csv)
    assert list(df.columns[: len(schema.COLUMNS)]) == schema.COLUMNS
    assert [p.name for p in epilogue.plot_epilogue(csv, tmp_path)] == ["epilogue_speedup.png"]
    assert cli_main(["plot", str(csv), "--out", str(tmp_path / "again"), "--figures", "speedup"]) == 0
    assert (tmp_path / "again" / "epilogue_speedup.png").exists()
    assert "tritongemm unfused ms" in epilogue.summary_table(rows)


def test_epilogue_suite_is_listed_and_refused_without_gpu(capsys):
    assert cli_main(["list"]) == 0
    out = capsys.readouterr().out
    assert "epilogue" in out and "llama3-70b up bias+gelu M=4096 fwd+bwd" in out
    if not torch.cuda.is_available():
        assert cli_main(["run", "--suite", "epilogue"]) == 2
        assert "no CUDA GPU" in capsys.readouterr().err


def test_own_runner_command_line_writes_prints_and_lists_what_was_not_measured(tmp_path, monkeypatch, capsys):
    """``runner.run_cli`` on the CPU with the epilogue suite's cases: the second case's inputs are
    refused, so its implementations are recorded untimed (each still a progress step); the CSV and
    its sidecar are written, the title and table printed, a figure that fails is only skipped, and
    the rows not measured are listed, exit status 1."""
    import argparse

    from benchmarks import epilogue, runner

    width = epilogue.Width("tiny", 40, 16)
    good, refused = (epilogue.EpilogueCase(width, epilogue.EPILOGUES[0], m, False, "fp32") for m in (12, 24))
    make_weights = epilogue.make_weights

    def weights_or_refusal(case, device, seed=0):
        if case == refused:
            raise MemoryError("no room")
        return make_weights(case, device, seed)

    monkeypatch.setattr(epilogue, "make_weights", weights_or_refusal)
    labels = []

    def run(device, rounds, warmup_ms, rep_ms, progress):
        def measure(case, on_step):
            def step(label):
                labels.append(label)
                on_step(label)

            l2 = epilogue.input_set_bytes(case)  # 2 x L2 over the copies: 2 of them
            return epilogue.measure_case(
                case, device, rounds=rounds, warmup_ms=warmup_ms, rep_ms=rep_ms, l2_bytes=l2, on_step=step
            )

        return runner.measure_all([good, refused], len(epilogue.IMPLS), measure, progress)

    def broken_figure(csv, out_dir):
        raise RuntimeError("no figure")

    args = argparse.Namespace(out=str(tmp_path), rounds=2, warmup=0, rep=1, no_progress=True, no_plots=False)
    status = runner.run_cli(
        args,
        "epilogue",
        torch.device("cpu"),
        run,
        {"gate_reference": "float64"},
        title="tiny layers on {gpu}",
        table=epilogue.summary_table,
        plot=broken_figure,
        failed_fields=("dtype", "case", "impl"),
    )
    assert status == 1
    assert labels == [f"fp32 {c.label} {impl.name}" for c in (good, refused) for impl in epilogue.IMPLS]
    out, err = capsys.readouterr()
    assert "\n== epilogue: tiny layers on " in out and "tritongemm unfused ms" in out
    assert f"wrote {tmp_path / 'epilogue.csv'}" in out
    for impl in epilogue.IMPLS:
        assert f"  fp32 {refused.label} {impl.name}: error inputs: MemoryError: no room" in out
        assert f"fp32 {good.label} {impl.name}:" not in out
    assert "figures skipped (RuntimeError: no figure); redraw with" in err
    df = schema.read(tmp_path / "epilogue.csv")
    assert list(df["status"]) == ["ok"] * 3 + ["error"] * 3
    sidecar = json.loads((tmp_path / "epilogue.env.json").read_text())
    assert list(sidecar) == ["environment", "suite", "rounds", "l2_rotation_factor", "gate_reference"]
    assert (sidecar["suite"], sidecar["rounds"]) == ("epilogue", 2)


def test_compile_time_summary_takes_medians_per_variant_and_skips_failures():
    from benchmarks.compile_time import summary

    def row(variant, secs, status="ok"):
        return dict(
            model="m", workload="infer", mode="default", variant=variant, compile_s=secs, status=status
        )

    rows = [row("stock", 10.0), row("stock", 14.0), row("stock", 12.0), row("convert", 9.0),
            row("convert", 15.0), row("convert", 99.0, "error")]  # fmt: skip
    (s,) = summary(rows)
    assert (s["stock_s"], s["convert_s"]) == (12.0, 12.0) and s["ratio"] == 1.0
    (s,) = summary([row("stock", 8.0), row("convert", 1.0, "error")])
    assert s["convert_s"] is None and s["ratio"] is None


@pytest.mark.heavy
def test_compile_time_runs_each_compile_cold_in_its_own_process(tmp_path):
    """`python -m benchmarks compile-time` on the tiny model: a row per cold compile, both variants."""
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks", "compile-time", "--models", "tiny", "--workloads", "infer",
         "--modes", "default", "--rounds", "1", "--out", str(tmp_path)],
        cwd=REPO, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    df = pd.read_csv(tmp_path / "compile_time.csv")
    assert sorted(df["variant"]) == ["convert", "stock"] and set(df["status"]) == {"ok"}
    assert (df["compile_s"] > 0).all() and (df["steady_ms"] > 0).all()
    assert "tiny" in proc.stdout and "wrote" in proc.stdout
    assert (tmp_path / "compile_time.png").stat().st_size > 0


def test_compile_time_figure_draws_every_pair(tmp_path):
    """The compile-time figure: one pair of bars per (model, workload, mode), a failed compile left out."""
    from benchmarks.compile_time import plot

    def row(model, variant, secs, status="ok"):
        return dict(
            model=model, workload="infer", mode="default", variant=variant, status=status, compile_s=secs
        )

    rows = [row("gpt2", "stock", 16.7), row("gpt2", "convert", 12.1), row("bert", "stock", 13.5),
            row("bert", "convert", 15.9), row("bert", "convert", 99.0, "error")]  # fmt: skip
    path = plot(rows, tmp_path / "compile_time.png")
    assert path.stat().st_size > 10_000


def test_fp8_rows_sweep_candidates():
    """The fp8 few-rows sweep's candidates: each tile unsplit, and split only where every slice keeps
    two K-steps; all fit shared memory and are valid pointer-kernel configs."""
    from benchmarks.sweep_fp8_rows import SMEM_CAP, configs_for

    for m, n, k in ((16, 4096, 4096), (128, 14336, 4096), (64, 4096, 512)):
        cands = configs_for(m, n, k, 132)
        assert cands and len({c.short() for c in cands}) == len(cands)
        for c in cands:
            assert c.kernel == "pointer" and c.block_m >= min(m, 64)
            assert (c.block_m + c.block_n) * c.block_k * c.num_stages <= SMEM_CAP
            assert c.split_k == 1 or k // c.block_k // c.split_k >= 2
        assert {c.split_k for c in cands} != {1} or k <= 512


@pytest.mark.skipif(not tritongemm.interpreter_enabled(), reason="runs the kernels on Triton's interpreter")
def test_fp8_rows_sweep_smoke(tmp_path):
    """The sweep's smoke run (one tiny problem on the interpreter) checks and records every candidate."""
    from benchmarks import sweep_fp8_rows

    assert sweep_fp8_rows.main(["--smoke", "--out", str(tmp_path)]) == 0
    records = json.loads((tmp_path / "fp8_rows_sweep.json").read_text())["records"]
    assert records and all(r["status"] == "ok" and r["rel_err"] < sweep_fp8_rows.TOL for r in records)
    assert {r["scaling"] for r in records} == {"rowwise", "tensorwise"}
    assert "default" in {r["impl"] for r in records}


@pytest.mark.skipif(not tritongemm.interpreter_enabled(), reason="runs the kernels on Triton's interpreter")
def test_longk_atomic_sweep_smoke(tmp_path):
    """The atomic split-K sweep's smoke run: its kernel, four slices adding into one workspace, is checked
    against float64 on both layouts of B (the interpreter has no TMA reduction: the "red" variant)."""
    from benchmarks import sweep_longk_atomic

    assert sweep_longk_atomic.main(["--smoke", "--out", str(tmp_path)]) == 0
    records = json.loads((tmp_path / "longk_atomic.json").read_text())["records"]
    assert {r["layout"] for r in records} == {"NN", "NT"}
    assert all(r["status"] == "ok" and r["rel_err"] < 1e-5 for r in records), records


@pytest.mark.skipif(not tritongemm.interpreter_enabled(), reason="runs the kernels on Triton's interpreter")
def test_fp8_blockwise_sweep_smoke(tmp_path):
    """The block-scaled sweep's smoke run checks ours (and the alternative config) on every recipe."""
    from benchmarks import sweep_fp8_blockwise

    assert sweep_fp8_blockwise.main(["--smoke", "--out", str(tmp_path)]) == 0
    records = json.loads((tmp_path / "fp8_blockwise.json").read_text())["records"]
    assert [r["recipe"] for r in records] == list(sweep_fp8_blockwise.RECIPES)
    for r in records:
        assert r["ours_status"] == "ok" and r["ours_rel_err"] < sweep_fp8_blockwise.TOL, r
        assert r["recipe"] == "rowwise" or r["alt_status"] == "ok", r
    assert "blockwise_1x128_128x128" in (tmp_path / "fp8_blockwise.txt").read_text()


def test_fp8_split_rows_sweep_times_only_eligible_split_tiles_and_tabulates(monkeypatch, capsys):
    """The split-rows sweep needs the GPU's warp-specialized kernel (it says so and exits 2 without
    one); its tiles are ones the kernel takes for fp8 on sm_90 (two consumers on 64-row halves), and
    its table reads a record's ratios and statuses."""
    from benchmarks import sweep_fp8_split_rows as sweep
    from tritongemm.device import DeviceInfo
    from tritongemm.planning.eligibility import Operand, warp_specialized_unsupported_reason

    h100 = DeviceInfo("H100", (9, 0), 132, 232448)

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert sweep.main(["--out", "unused"]) == 2
    assert "sm_90" in capsys.readouterr().err
    fp8 = torch.float8_e4m3fn
    a = Operand.of(torch.empty(1024, 4096, dtype=fp8, device="meta"))
    b = Operand.of(torch.empty(4096, 4096, dtype=fp8, device="meta").t())
    c = Operand.of(torch.empty(1024, 4096, dtype=torch.bfloat16, device="meta"))
    for kind, tiles in sweep.TILES.items():
        for name, cfg in tiles.items():
            assert cfg.pingpong == name.startswith("split") and cfg.block_m == 128, (kind, name)
            cfg.validate(h100, 1)  # (fp8: a split tile's consumers hold half its accumulator each)
            reason = warp_specialized_unsupported_reason(cfg, a, b, c, fp8, torch.bfloat16, h100, False)
            assert reason is None or "Gluon" in reason or "Triton" in reason, (kind, name, reason)
    halves_too_short = replace(sweep.SPLIT_TILES["split128x128s6"], block_m=64)
    reason = warp_specialized_unsupported_reason(halves_too_short, a, b, c, fp8, torch.bfloat16, h100, False)
    assert reason is not None and ("block_m 128" in reason or "Gluon" in reason or "Triton" in reason)
    row = {"m": 8, "n": 16, "k": 32, "recipe": "rowwise", "fast_accum": True, "rule": "gluon_ws 128x256"}
    row.update(rule_ratio=0.9, split128x128s6_ratio=1.25, split128x128s5_status="wrong", torch_tflops=1.0)
    text = sweep.table([row])
    assert "rowwise+fast" in text and "1.250" in text and "wrong" in text and "gluon_ws 128x256" in text


def test_epilogue_tiles_sweep_forces_tiles_the_kernel_takes_and_tabulates(monkeypatch, capsys):
    """The epilogue tile sweep needs an sm_90 GPU (it says so and exits 2 without one); its forced tiles
    are warp-specialized bf16 tiles an H100 takes, and its table reads a record's ratios and statuses."""
    from benchmarks import sweep_epilogue_tiles as sweep
    from tritongemm.device import DeviceInfo
    from tritongemm.planning.eligibility import Operand, warp_specialized_unsupported_reason

    h100 = DeviceInfo("H100", (9, 0), 132, 232448)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert sweep.main(["--out", "unused"]) == 2
    assert "sm_90" in capsys.readouterr().err
    bf16 = torch.bfloat16
    a = Operand.of(torch.empty(1000, 4096, dtype=bf16, device="meta"))
    b = Operand.of(torch.empty(14336, 4096, dtype=bf16, device="meta").t())
    c = Operand.of(torch.empty(1000, 14336, dtype=bf16, device="meta"))
    for name, cfg in sweep.TILES.items():
        cfg.validate(h100, 2)
        reason = warp_specialized_unsupported_reason(cfg, a, b, c, bf16, bf16, h100, False)
        assert reason is None or "Gluon" in reason or "Triton" in reason, (name, reason)
    assert set(sweep.ACTIVATIONS) >= {"none", "gelu", "gelu_tanh", "silu", "residual"}
    row = {"m": 8, "n": 16, "k": 32, "activation": "gelu", "rule_plan": "gluon_ws 128x128 pingpong"}
    row.update(torch_ms=0.1, rule_ratio=1.25, one128x128sk_status="wrong")
    text = sweep.table([row])
    assert "gelu" in text and "1.250" in text and "wrong" in text and "100.0" in text and "pingpong" in text
    # The gate of each epilogue on the interpreter (timing is the GPU's: not here).
    monkeypatch.setattr(sweep, "TILES", {})
    monkeypatch.setattr(sweep.harness, "l2_cache_bytes", lambda device: 1)
    timed = []
    monkeypatch.setattr(sweep, "timed_rounds", lambda live, row: timed.append(sorted(live)))
    for epilogue in ("gelu", "residual"):
        measured = sweep.measure(16, 32, 64, epilogue, torch.device("cpu"), torch.Generator().manual_seed(0))
        assert measured["torch_status"] == measured["rule_status"] == "ok", measured
    assert timed == [["rule", "torch"]] * 2


def test_derivative_epilogue_sweep_needs_a_gpu_checks_every_variant_and_tabulates(
    monkeypatch, capsys, tmp_path
):
    """The derivative epilogue sweep needs an sm_90 GPU (it says so and exits 2 without one); on the
    interpreter its variants but the forced ping-pong tile (a Gluon tile) match float64; its table
    reads a record's ratios and statuses."""
    from benchmarks import sweep_derivative_epilogue as sweep
    from tritongemm.device import DeviceInfo

    sweep.PINGPONG.validate(DeviceInfo("H100", (9, 0), 132, 232448), 2)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert sweep.main(["--out", str(tmp_path)]) == 2
    assert "sm_90" in capsys.readouterr().err
    monkeypatch.setattr(sweep, "DTYPE", torch.float32)
    monkeypatch.setattr(sweep.harness, "l2_cache_bytes", lambda device: 1)
    monkeypatch.setattr(sweep, "timed_rounds", lambda live, row: row.update(timed=sorted(live)))
    row = sweep.measure("tiny", 24, 40, 16, "gelu_tanh", torch.device("cpu"), torch.Generator())
    assert row["timed"] == ["rule", "torch", "unfused"], row
    assert row["pingpong_status"].startswith("error") and row["rule_rel_err"] < 1e-5
    row.update(torch_ms=0.1, rule_ratio=1.25)
    text = sweep.table([row])
    assert "gelu_tanh" in text and "1.250" in text and "error" in text and "100.0" in text
    sweep.save_records(tmp_path, "derivative_epilogue", {"records": [row]}, text)  # (what each case writes)
    assert json.loads((tmp_path / "derivative_epilogue.json").read_text())["records"][0]["model"] == "tiny"
    assert (tmp_path / "derivative_epilogue.txt").read_text() == text + "\n"


def test_short_k_sweep_forces_tiles_the_kernel_takes_and_tabulates(monkeypatch, capsys):
    """The short-K sweep needs an sm_90 GPU (it says so and exits 2 without one); its forced tiles are
    warp-specialized bf16 tiles an H100 takes at its shapes, and its table reads a record's ratios, the
    compiled ratio and the models' rows."""
    from benchmarks import sweep_short_k as sweep
    from tritongemm.device import DeviceInfo
    from tritongemm.planning.eligibility import Operand, warp_specialized_unsupported_reason

    h100 = DeviceInfo("H100", (9, 0), 132, 232448)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert sweep.main(["--out", "unused"]) == 2
    assert "sm_90" in capsys.readouterr().err
    bf16 = torch.bfloat16
    for _, m, n, k, _ in sweep.SHAPES:
        a = Operand.of(torch.empty(m, k, dtype=bf16, device="meta"))
        b = Operand.of(torch.empty(n, k, dtype=bf16, device="meta").t())
        c = Operand.of(torch.empty(m, n, dtype=bf16, device="meta"))
        for name, cfg in sweep.TILES.items():
            cfg.validate(h100, 2)
            reason = warp_specialized_unsupported_reason(cfg, a, b, c, bf16, bf16, h100, False)
            assert reason is None or "Gluon" in reason or "Triton" in reason, (name, reason)
    row = {
        "what": "BERT fc1",
        "m": 8,
        "n": 16,
        "k": 32,
        "activation": "gelu",
        "rule_plan": "gluon_ws pingpong",
    }
    row.update(
        torch_ms=0.1, compiled_ms=0.1, rule_compiled_ms=0.08, rule_ratio=1.25, one128x128_status="wrong"
    )
    model = {"model": "BERT-base prefill", "fused": "13 activations", "stock_ms": 5.0, "convert / stock": 1.1}
    model.update({"compiled stock / stock": 1.2, "compiled convert / compiled stock": 1.05})
    text = sweep.table([row], [model])
    assert "BERT fc1" in text and "1.250" in text and "wrong" in text and "100.0" in text
    assert "1.250" in text.splitlines()[1] and "  1.250" in text  # rule_compiled / compiled = 0.1 / 0.08
    assert "BERT-base prefill" in text and "1.050" in text and "gate" in text


def test_fusion_ceiling_sweep_checks_each_call_against_its_own_math_and_multiplies_out(
    monkeypatch, capsys, tmp_path
):
    """The fusion ceiling sweep needs a GPU (it says so and exits 2 without one); on the interpreter
    each of its four calls -- torch's sequence, cuBLAS's GEMMs alone, ours alone, ours fused -- for a
    linear layer and a gated block, forward and backward, matches float64 of its own math; its
    derived ratios multiply out to the fused one, and its table and figure read them."""
    from benchmarks import sweep_fusion_ceiling as sweep

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert sweep.main(["--out", str(tmp_path)]) == 2
    assert "GPU" in capsys.readouterr().err
    monkeypatch.setattr(sweep, "DTYPE", torch.float32)
    monkeypatch.setattr(sweep.harness, "l2_cache_bytes", lambda device: 1)
    medians = {"torch": 1.2, "cublas_gemms": 1.0, "gemms": 1.05, "fused": 0.98}

    def fake_rounds(live, row):
        row.update(timed=sorted(live), **{f"{n}_ms": medians[n] for n in live})
        row.update({f"{n}_ratio": medians["torch"] / medians[n] for n in live if n != "torch"})

    monkeypatch.setattr(sweep, "timed_rounds", fake_rounds)
    cpu, gen = torch.device("cpu"), torch.Generator()
    rows = [
        sweep.measure_linear("tiny", 24, 40, 16, "gelu", cpu, gen),
        sweep.measure_block("tiny", 24, 16, 40, "silu", False, cpu, gen),
        sweep.measure_block("tiny", 24, 16, 40, "silu", True, cpu, gen),
    ]
    for row in rows:
        assert row["timed"] == ["cublas_gemms", "fused", "gemms", "torch"], row
        assert max(row[f"{n}_rel_err"] for n in ("torch", *sweep.NAMES)) < 1e-5, row
        assert row["ceiling"] * row["parity"] * row["epilogue"] == pytest.approx(row["fused_ratio"])
    wrong = sweep.gate(
        {"zero": lambda x: torch.zeros(3)}, [(torch.ones(3),)], torch.ones(3, dtype=torch.float64), {}
    )
    assert wrong == {}, "a wrong call is timed"
    text = sweep.table(rows)
    assert "fwd+bwd" in text and "1.200" in text and "1.224" in text
    sweep.plot(rows, tmp_path / "fusion_ceiling.png", "test")
    assert (tmp_path / "fusion_ceiling.png").stat().st_size > 0


def test_streamk_fixup_sweep_checks_before_timing_and_rates_against_cublas(monkeypatch, capsys, tmp_path):
    """The Stream-K fix-up sweep needs a GPU (it says so and exits 2 without one); on the interpreter a
    row checks each call against float64 first (a wrong one is not timed, unless the fix-up is skipped,
    whose results are wrong by design), rates the timed ones against cuBLAS's and the copy rate, and
    its table reads them."""
    from benchmarks import sweep_streamk_fixup as sweep
    from tritongemm import TileConfig

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert sweep.main(["--out", str(tmp_path)]) == 2
    assert "GPU" in capsys.readouterr().err
    monkeypatch.setattr(sweep, "DTYPE", torch.float32)
    medians = {"torch": 2.0, "rule": 2.5, "sk": 1.6, "zero": 1.0}

    def fake_rounds(live, row):
        row.update(timed=sorted(live), **{f"{n}_ms": medians[n] for n in live})
        row.update({f"{n}_ratio": medians["torch"] / medians[n] for n in live if n != "torch"})

    monkeypatch.setattr(sweep, "timed_rounds", fake_rounds)
    real_calls = sweep.calls
    monkeypatch.setattr(
        sweep, "calls", lambda cfgs: {**real_calls(cfgs), "zero": lambda a, b: torch.zeros(1)}
    )
    configs = {"sk": TileConfig(block_m=16, block_n=16, block_k=16, num_warps=4, num_stages=2, stream_k=True)}
    cpu, gen = torch.device("cpu"), torch.Generator()
    row = sweep.measure(24, 40, 64, cpu, gen, configs, True, copy_rate=100.0, budget_bytes=1)
    assert row["timed"] == ["rule", "sk", "torch"] and row["zero_status"] == "wrong", row
    assert max(row[f"{n}_rel_err"] for n in ("rule", "sk")) < 1e-5, row
    assert row["sk_ratio"] == pytest.approx(1.25) and row["torch_pct_copy"] > 0
    unchecked = sweep.measure(24, 40, 64, cpu, gen, configs, False, copy_rate=100.0, budget_bytes=1)
    assert "zero" in unchecked["timed"], "with the fix-up skipped nothing is gated"
    text = sweep.table([row], skipped=False)
    assert "1.250" in text and "wrong" in text and "24x40x64" in text


@pytest.mark.skipif(not tritongemm.interpreter_enabled(), reason="runs the kernels on Triton's interpreter")
def test_fp8_swap_sweep_smoke(tmp_path):
    """The transposed-problem sweep's smoke run: both ways of ours and the pointer tiles of the
    transposed problem checked against float64, the summary written."""
    from benchmarks import sweep_fp8_swap

    assert sweep_fp8_swap.main(["--smoke", "--out", str(tmp_path)]) == 0
    records = json.loads((tmp_path / "fp8_swap.json").read_text())["records"]
    impls = {r["impl"] for r in records}
    assert {"default", "default swapped"} <= impls and any(i.startswith("ptr ") for i in impls)
    assert all(r["status"] == "ok" and r["rel_err"] < sweep_fp8_swap.TOL for r in records), records
    assert "ours transposed" in (tmp_path / "fp8_swap.txt").read_text()


def test_compiled_llama_sweep_needs_a_gpu_builds_its_variants_and_tabulates(monkeypatch, capsys):
    """The compiled Llama sweep needs a GPU (it says so and exits 2 without one); its variants are stock,
    an A/A copy, convert's rule, the gated op forced and the MLP left unfused; kernels are classed by name;
    its table reads a row's ratios, a gated-out variant and the GPU-time split."""
    from torch import nn

    from benchmarks import sweep_compiled_llama as sweep

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert sweep.main(["--out", "unused"]) == 2
    assert "GPU" in capsys.readouterr().err

    class MLP(nn.Module):  # (transformers' LlamaMLP, which the sweep's models hold)
        def __init__(self):
            super().__init__()
            self.gate_proj, self.up_proj, self.down_proj = (
                nn.Linear(8, 16),
                nn.Linear(8, 16),
                nn.Linear(16, 8),
            )
            self.act_fn = nn.SiLU()

        def forward(self, x):
            return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))

    models = sweep.variants(nn.Sequential(MLP()))
    assert list(models) == list(sweep.VARIANTS)
    gated = {
        name: [m for m in v.modules() if isinstance(m, tritongemm.nn.GatedMLP)] for name, v in models.items()
    }
    assert not gated["stock"] and not gated["stock copy"] and not gated["convert unfused"]
    assert gated["convert"][0].compiled_min_outputs == tritongemm.nn.GatedMLP.compiled_min_outputs > 0
    assert gated["convert gated"][0].compiled_min_outputs == 0
    assert models["stock copy"][0].gate_proj.weight is not models["stock"][0].gate_proj.weight
    assert type(models["convert unfused"][0].gate_proj) is tritongemm.nn.Linear

    names = {
        "nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_TNT": "gemm",
        "gemm_gluon_kernel": "gemm",
        "void cutlass::Kernel2<cutlass_80_simt_sgemm_128x32_8x5_nn_align1>": "gemm",
        "cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16": "attention",
        "triton_poi_fused__scaled_dot_product_cudnn_attention__to_copy": "attention",
        "triton_red_fused__to_copy_add_embedding_mean_mul_pow_rsqrt_view_7": "other",
        "Memset (Device)": "other",
    }
    assert {n: sweep.kernel_class(n) for n in names} == names
    row = {"model": "8B-wide, 2 layers", "tokens": 4096, "h_elements": 4096 * 14336, "stock ms": 8.0}
    row.update({"stock copy ms": 8.0, "convert ms": 7.5, "convert gated ms": 7.5, "convert unfused ms": 8.2})
    row.update({"stock host ms": 2.0, "convert host ms": 2.1})
    row["stock gpu"] = {"gemm": 6.0, "attention": 1.0, "other": 0.5}
    text = sweep.table([row])
    assert (
        "1.067" in text and "0.976" in text and "58.7" in text and "1.071" in text and "2.000 / 2.100" in text
    )
    row.pop("convert unfused ms")
    assert "gate" in sweep.table([row])


@pytest.mark.gpu
def test_captured_steps_replay_the_eager_steps_work_on_current_inputs():
    """The epilogue and mlp suites time fwd+bwd from CUDA-graph replays (``harness.captured``): each
    graph must compute what the eager step does, on what its inputs hold when it is replayed, and
    write gradients of its own."""
    from tritongemm.testing import random_tensor, relative_error, tolerance

    w = random_tensor((256, 128), torch.bfloat16, "cuda").requires_grad_()
    sets = [
        (
            random_tensor((64, 128), torch.bfloat16, "cuda").requires_grad_(),
            random_tensor((64, 256), torch.bfloat16, "cuda"),
        )
        for _ in range(2)
    ]
    rotation = harness.Rotation(sets)

    def step():
        x, g = rotation.next()
        tritongemm.linear(x, w, activation="gelu").backward(g)

    replay = harness.captured(step, len(sets), [w, *(s[0] for s in sets)])
    graph_grad = w.grad  # (the last graph's: captured with no gradient before it)
    x, g = sets[1]
    with torch.no_grad():
        x.copy_(random_tensor(x.shape, x.dtype, "cuda"))  # new values after capture
    graph_grad.zero_()
    replay()  # the first set's graph, then the second's
    replay()
    torch.cuda.synchronize()
    w64 = w.detach().double().requires_grad_()
    torch.nn.functional.gelu(x.detach().double() @ w64.t()).backward(g.double())
    assert w.grad is graph_grad
    assert relative_error(graph_grad, w64.grad) <= tolerance(torch.bfloat16, "cuda")
