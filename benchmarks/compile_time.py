"""``python -m benchmarks compile-time``: ``torch.compile``'s time on a converted model against stock's,
each compile cold.

The models suite's ``compile_s`` times every compile in one process, stock's first, so the
converted model's compile finds stock's kernels in Inductor's and Triton's caches.  Here each
compile runs in a process of its own with empty caches of its own (``TORCHINDUCTOR_CACHE_DIR`` and
``TRITON_CACHE_DIR`` in a new temporary folder, ``TORCHINDUCTOR_FORCE_DISABLE_CACHES=1``), stock and
converted alternating over ``--rounds`` rounds.  A compile's seconds are its first call's time less
a steady call's (the median of three after it; under ``reduce-overhead`` the second call, which
records the CUDA graph, is counted in neither).  One row per compile in ``compile_time.csv``; the
table printed last gives the medians and converted ÷ stock.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

SUITE = "compile_time"
MODES = ("default", "reduce-overhead", "max-autotune-no-cudagraphs")
VARIANTS = ("stock", "convert")


def compile_seconds(model: str, workload: str, mode: str, variant: str) -> dict:
    """Compile ``model`` (a ``models.MODELS`` name; converted when ``variant`` is "convert") in
    ``mode`` and run ``workload`` ("infer": a forward without gradients in bf16 on a GPU, fp32
    elsewhere; "train_amp": forward and backward, fp32 weights under bf16 autocast on a GPU):
    {"compile_s", "steady_ms"}.  Runs in this process, with whatever caches it has."""
    import tritongemm

    from .models import MODELS, _autocast, loss_of, make_batch

    spec = MODELS[model]
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    with torch.device(device):
        torch.manual_seed(0)
        net = spec.build()
    if workload == "infer" and device.type == "cuda":
        net = net.to(torch.bfloat16)
    if variant == "convert":
        net = tritongemm.nn.convert(net)
    compiled = torch.compile(net, **({} if mode == "default" else {"mode": mode}))
    batch = make_batch(spec, device)
    amp = torch.bfloat16 if device.type == "cuda" and workload == "train_amp" else None

    def step() -> None:
        if workload == "infer":
            with torch.no_grad():
                spec.call(compiled, batch.inputs)
        else:
            with _autocast(device, amp):
                loss = loss_of(spec.call(compiled, batch.inputs), batch.labels)
            loss.backward()

    def timed() -> float:
        if device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        step()
        if device.type == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - t0

    first = timed()
    if mode == "reduce-overhead":
        timed()  # records the CUDA graph
    steady = statistics.median(timed() for _ in range(3))
    return {"compile_s": first - steady, "steady_ms": steady * 1e3}


def _cold(model: str, workload: str, mode: str, variant: str, timeout: float) -> dict:
    """``compile_seconds`` in a fresh process with empty caches (its own temporary folders)."""
    with tempfile.TemporaryDirectory(prefix="tritongemm-compile-") as tmp:
        env = dict(
            os.environ,
            TORCHINDUCTOR_CACHE_DIR=os.path.join(tmp, "inductor"),
            TRITON_CACHE_DIR=os.path.join(tmp, "triton"),
            TORCHINDUCTOR_FORCE_DISABLE_CACHES="1",
        )
        if not torch.cuda.is_available():
            env["TRITON_INTERPRET"] = "1"  # tritongemm takes CPU tensors on Triton's interpreter only
        cmd = [sys.executable, "-m", "benchmarks.compile_time", model, workload, mode, variant]
        root = Path(__file__).resolve().parent.parent
        done = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=timeout)
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]
    if done.returncode != 0 or not lines:
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
        return {"status": "error", "message": f"exit {done.returncode}: {tail[0][:300]}"}
    return {"status": "ok", **json.loads(lines[-1])}


def measure(models, workloads, modes, rounds: int, timeout: float, progress=print) -> list[dict]:
    """Every (model, workload, mode), stock and converted alternating (stock first in even rounds),
    each compile cold: one row each."""
    from .models import MODELS

    rows = []
    for r in range(rounds):
        for model in models:
            for workload in [w for w in workloads if w in MODELS[model].compiled]:
                for mode in modes:
                    for variant in VARIANTS if r % 2 == 0 else VARIANTS[::-1]:
                        result = _cold(model, workload, mode, variant, timeout)
                        row = dict(suite=SUITE, group=model, case=f"{model} {workload} {mode}", x=r,
                                   x_label="round", model=model, workload=workload, mode=mode,
                                   variant=variant, impl=variant, **result)  # fmt: skip
                        rows.append(row)
                        shown = f"{row['compile_s']:.1f} s" if result["status"] == "ok" else row["message"]
                        progress(f"round {r + 1}/{rounds}  {model} {workload} {mode} {variant}: {shown}")
    return rows


def summary(rows: list[dict]) -> list[dict]:
    """Per (model, workload, mode): the median compile seconds of each variant and converted ÷ stock."""
    out = []
    keys = sorted({(r["model"], r["workload"], r["mode"]) for r in rows})
    for key in keys:
        med = {}
        for variant in VARIANTS:
            secs = [r["compile_s"] for r in rows if (r["model"], r["workload"], r["mode"]) == key
                    and r["variant"] == variant and r["status"] == "ok"]  # fmt: skip
            med[variant] = statistics.median(secs) if secs else None
        ratio = med["convert"] / med["stock"] if med["stock"] and med["convert"] is not None else None
        out.append(dict(model=key[0], workload=key[1], mode=key[2], stock_s=med["stock"],
                        convert_s=med["convert"], ratio=ratio))  # fmt: skip
    return out


FIGURE = "compile_time.png"


def plot(rows: list[dict], path: Path) -> Path:
    """Bars of each (model, workload, mode)'s median compile seconds, stock beside converted, with
    converted ÷ stock above each pair."""
    from matplotlib.figure import Figure

    stats = summary(rows)
    fig = Figure(figsize=(max(6.0, 1.3 * len(stats) + 2), 4.2))
    ax = fig.add_subplot()
    xs = range(len(stats))
    width = 0.38
    for i, (variant, color) in enumerate((("stock", "#888888"), ("convert", "#1f77b4"))):
        heights = [s[f"{variant}_s"] or 0.0 for s in stats]
        ax.bar([x + (i - 0.5) * width for x in xs], heights, width, color=color,
               label="torch.compile(model)" if variant == "stock" else "torch.compile(convert(model))")  # fmt: skip
    for x, s in zip(xs, stats):
        if s["ratio"] is not None:
            top = max(s["stock_s"] or 0.0, s["convert_s"] or 0.0)
            ax.annotate(f"{s['ratio']:.2f}x", (x, top), ha="center", va="bottom", fontsize=8)
    ax.set_xticks(list(xs), [f"{s['model']}\n{s['workload']}\n{s['mode']}" for s in stats], fontsize=7)
    ax.set_ylabel("compile seconds (cold, median)")
    ax.set_title("torch.compile time, each compile in a fresh process with empty caches", fontsize=9)
    ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    return path


def run_cli(args) -> int:
    from . import harness
    from .models import MODELS

    models = args.models.split(",") if args.models else [n for n, s in MODELS.items() if s.default]
    unknown = [m for m in models if m not in MODELS]
    modes = args.modes.split(",")
    bad_modes = [m for m in modes if m not in MODES]
    if unknown or bad_modes:
        print(f"benchmarks compile-time: unknown model(s) {unknown} or mode(s) {bad_modes}; models: "
              f"{', '.join(MODELS)}; modes: {', '.join(MODES)}", file=sys.stderr)  # fmt: skip
        return 2
    env = harness.environment(torch.device("cuda") if torch.cuda.is_available() else None)
    rows = measure(models, args.workloads.split(","), modes, args.rounds, args.timeout,
                   progress=lambda line: print(line, file=sys.stderr, flush=True))  # fmt: skip
    out_dir = Path(args.out) if args.out else harness.default_results_dir(env)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{SUITE}.csv"
    harness.to_frame(rows, env).to_csv(path, index=False)
    print(f"wrote {path}")
    if any(r["status"] == "ok" for r in rows):
        print(f"wrote {plot(rows, out_dir / FIGURE)}")
    print(f"{'model':10s} {'workload':10s} {'mode':28s} {'stock s':>8s} {'convert s':>10s} {'÷':>6s}")
    for s in summary(rows):
        fmt = lambda v, p: "-" if v is None else f"{v:.{p}f}"  # noqa: E731
        print(f"{s['model']:10s} {s['workload']:10s} {s['mode']:28s} {fmt(s['stock_s'], 1):>8s} "
              f"{fmt(s['convert_s'], 1):>10s} {fmt(s['ratio'], 2):>6s}")  # fmt: skip
    return 0 if all(r["status"] == "ok" for r in rows) else 1


if __name__ == "__main__":  # one cold compile: ``_cold``'s child process
    print(json.dumps(compile_seconds(*sys.argv[1:5])), flush=True)
