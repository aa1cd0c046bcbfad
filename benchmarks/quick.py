"""``python -m benchmarks quick``: the project's main job.

With a CUDA GPU: a short benchmark (about a minute) of tritongemm against
cuBLAS on square fp16/bf16 problems, plus the three pipeline variants at
4096^3 fp16.  Prints a table and writes ``quick.csv``, ``quick.env.json`` and
``quick.png`` under ``benchmarks/results/<gpu>/`` (or ``--out``).

Without one: a correctness demo of the three pipeline variants on Triton's
CPU interpreter (small sizes, fp16/fp32/bf16, several layouts, relative error
against a float64 reference).  No timings: interpreter speed says nothing
about GPU speed.  ``__main__`` re-executes Python with ``TRITON_INTERPRET=1``
first when needed, because Triton reads that variable when kernels are
decorated, i.e. when tritongemm is imported.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

import tritongemm
from tritongemm import PIPELINES
from tritongemm.launch import problem_of
from tritongemm.testing import make_matrix, tolerance

from . import harness
from .harness import Case

QUICK_SIZES = (1024, 2048, 4096)
QUICK_DTYPES = (torch.float16, torch.bfloat16)
#: Where the three pipeline variants are compared.
PIPELINE_SIZE, PIPELINE_DTYPE = 4096, torch.float16

# The interpreter demo: one shape whose sides are multiples of the tiles and one
# ragged shape that exercises every mask; K spans several K tiles, so the
# pipelines actually pipeline.
DEMO_SHAPES = ((64, 80, 96), (33, 47, 75))
DEMO_LAYOUTS = ("NN", "NT", "TN")
DEMO_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def run_quick(
    out: str | Path | None = None, *, warmup_ms: float = 10, rep_ms: float = 50, progress: bool = True
) -> int:
    """Run the quick benchmark (GPU) or the interpreter demo (no GPU); returns an exit code."""
    if torch.cuda.is_available() and not tritongemm.interpreter_enabled():
        return quick_gpu(out, warmup_ms=warmup_ms, rep_ms=rep_ms, progress=progress)
    return quick_interpreter(out)


# ----------------------------------------------------------------------------------
# GPU
# ----------------------------------------------------------------------------------
def quick_cases() -> list[Case]:
    return [Case("quick", "square", f"{s}x{s}x{s}", s, s, s, "NN", s, "M = N = K") for s in QUICK_SIZES]


def quick_gpu(
    out: str | Path | None = None, *, warmup_ms: float = 10, rep_ms: float = 50, progress: bool = True
) -> int:
    from .suites import cublas, pipeline_impls, tritongemm_heuristic

    def impls_for(case: Case, dtype: torch.dtype):
        impls = [cublas(), tritongemm_heuristic()]
        if case.m == PIPELINE_SIZE and dtype == PIPELINE_DTYPE:
            impls += pipeline_impls()
        return impls

    device = torch.device("cuda", torch.cuda.current_device())
    env = harness.environment(device)
    out_dir = Path(out) if out is not None else harness.default_results_dir(env)
    print(
        f"tritongemm quick benchmark on {env['gpu']} ({env['sm_count']} SMs), torch {env['torch']}, "
        f"triton {env['triton']}, CUDA {env['cuda']}, driver {env['driver']}",
        flush=True,
    )
    rows = harness.measure_ceilings(device, warmup_ms=warmup_ms, rep_ms=rep_ms)
    rows += harness.run_cases(
        quick_cases(),
        QUICK_DTYPES,
        impls_for,
        cublas(),
        device=device,
        warmup_ms=warmup_ms,
        rep_ms=rep_ms,
        progress=progress,
    )
    csv = harness.write_results(rows, out_dir / "quick.csv", env, {"suite": "quick"})
    figures = harness.plot_safely(csv, out_dir)

    bench = [r for r in rows if r["suite"] == "quick"]
    for r in bench:
        r["shape"] = f"{r['m']}x{r['n']}x{r['k']}"
        r["status_note"] = r["status"] if r["status"] != harness.OK else ""
        if r.get("host_us") and r.get("ms") and r["host_us"] / 1000 > r["ms"]:
            r["status_note"] = "host-bound"
    print()
    print(
        harness.format_table(
            bench,
            [
                ("shape", "shape (MxNxK)"),
                ("dtype", "dtype"),
                ("impl", "impl"),
                ("config", "config"),
                ("ms", "ms (median)"),
                ("tflops", "TFLOP/s"),
                ("speedup_vs_cublas", "vs cuBLAS"),
                ("host_us", "host us/call"),
                ("status_note", "status"),
            ],
        )
    )
    ceil = {r["variant"]: r for r in rows if r["suite"] == "ceiling"}
    print(
        f"\nceilings: device-to-device copy {ceil['copy_bandwidth']['gbps']:,.0f} GB/s (read + write); "
        f"cuBLAS 8192^3 bf16 {ceil['matmul_peak']['tflops']:,.0f} TFLOP/s"
    )
    print(
        "'vs cuBLAS' = cuBLAS time / impl time on the same inputs (> 1 is faster than cuBLAS); "
        "every output was checked against cuBLAS before timing.\n'host us/call' = CPU time to issue one "
        "call (median); 'host-bound' = it exceeds the GPU time, so back-to-back calls would leave the GPU "
        "idle (ms is still GPU time: do_bench's L2 flush hides ~0.1 ms of host time per call)."
    )
    failed = [r for r in bench if r["status"] not in (harness.OK,)]
    for r in failed:
        print(f"  {r['shape']} {r['dtype']} {r['impl']}: {r['status']}: {r.get('message', '')}")
    print(f"\nwrote {csv}, {csv.with_suffix('.env.json')}" + "".join(f", {f}" for f in figures))
    return 1 if failed else 0


# ----------------------------------------------------------------------------------
# No GPU: correctness on the interpreter
# ----------------------------------------------------------------------------------
def quick_interpreter(out: str | Path | None = None) -> int:
    if not tritongemm.interpreter_enabled():
        raise RuntimeError(
            "quick: no CUDA GPU and Triton's interpreter is off; run `python -m benchmarks quick` "
            "(it sets TRITON_INTERPRET=1 itself) or set TRITON_INTERPRET=1 before importing tritongemm"
        )
    why = "no CUDA device found" if not torch.cuda.is_available() else "TRITON_INTERPRET=1 is set"
    banner = (
        f"NO GPU: {why}, so this ran a CORRECTNESS DEMO on Triton's CPU interpreter "
        "(TRITON_INTERPRET=1).\nNo timings are measured or claimed; run on a CUDA GPU for the benchmark."
    )
    print(banner, flush=True)
    print(
        "Each row: tritongemm.matmul(a, b, pipeline=...) vs a float64 reference, relative Frobenius error.\n"
    )
    gen = torch.Generator().manual_seed(0)
    rows = []
    for m, n, k in DEMO_SHAPES:
        for layout in DEMO_LAYOUTS:
            for dtype in DEMO_DTYPES:
                a = make_matrix(m, k, layout[0], dtype, "cpu", generator=gen)
                b = make_matrix(k, n, layout[1], dtype, "cpu", generator=gen)
                ref = a.double() @ b.double()
                for pipeline in PIPELINES:
                    row = {
                        "shape": f"{m}x{n}x{k}",
                        "m": m,
                        "n": n,
                        "k": k,
                        "layout": layout,
                        "dtype": harness.DTYPE_NAMES[dtype],
                        "pipeline": pipeline,
                        "impl": f"tritongemm:{pipeline}",
                        "family": "tritongemm",
                        "variant": pipeline,
                        "tol": tolerance(dtype),
                    }
                    try:
                        cfg = tritongemm.select_config(
                            problem_of(a, b), tritongemm.device_info(a.device), None, pipeline
                        )
                        row["config"] = cfg.short()
                        c = tritongemm.matmul(a, b, pipeline=pipeline)
                        result = harness.check_output(c.double(), ref, tolerance(dtype))
                        row.update(
                            rel_err=result.rel_err,
                            result="PASS" if result.ok else "FAIL",
                            status=harness.OK if result.ok else harness.FAILED_GATE,
                            message=result.reason,
                        )
                    except Exception as exc:  # report, keep going
                        row.update(
                            result="ERROR", status=harness.ERROR, message=f"{type(exc).__name__}: {exc}"
                        )
                    rows.append(row)
    # One line per (shape, layout, dtype); a column per pipeline variant.
    table: dict[tuple, dict] = {}
    for r in rows:
        line = table.setdefault(
            (r["shape"], r["layout"], r["dtype"]),
            {
                "shape": r["shape"],
                "layout": r["layout"],
                "dtype": r["dtype"],
                "tol": r["tol"],
                "result": "PASS",
            },
        )
        line[r["pipeline"]] = r.get("rel_err")
        line[r["pipeline"] + "_cfg"] = r.get("config")
        if r["result"] != "PASS":
            line["result"] = r["result"]
    stages = {
        p: next((r["config"].split()[-1] for r in rows if r["pipeline"] == p and r.get("config")), "")
        for p in PIPELINES
    }
    print(
        harness.format_table(
            list(table.values()),
            [
                ("shape", "shape (MxNxK)"),
                ("layout", "layout"),
                ("dtype", "dtype"),
                *[(p, f"{p} ({stages[p]})") for p in PIPELINES],
                ("tol", "tolerance"),
                ("result", "result"),
            ],
        )
    )
    tiles = next((r["config"] for r in rows if r.get("config")), "?")
    print(f"(relative errors; tiles {' '.join(tiles.split()[:3])}, stages sN = K tiles in flight)")
    bad = [r for r in rows if r["result"] != "PASS"]
    for r in bad:
        print(
            f"  {r['shape']} {r['layout']} {r['dtype']} {r['pipeline']}: {r['result']}: {r.get('message', '')}"
        )
    print(
        f"\n{len(rows) - len(bad)}/{len(rows)} checks passed.  Layout: N = row-major operand, "
        "T = transposed (column-major) view; no data was copied."
    )
    if out is not None:
        env = harness.environment(torch.device("cpu"))
        path = harness.write_results(
            [{**r, "suite": "quick-interpreter"} for r in rows],
            Path(out) / "quick_interpreter.csv",
            env,
            {"suite": "quick-interpreter"},
        )
        print(f"wrote {path}")
    print("\nNO GPU: this was a correctness check only; no performance numbers were produced.")
    sys.stdout.flush()
    return 1 if bad else 0
