"""``python -m benchmarks run --suite host``: what one call of a tiny GEMM costs on the host, against torch.

A tiny GEMM's kernel runs in a few microseconds, so back-to-back calls are
bound by the CPU work of issuing them (argument checks, dispatch, autograd
bookkeeping, the launch).  Each case times ``calls`` back-to-back calls and
one synchronize, per call in microseconds, in ``rounds`` rounds that alternate
torch and tritongemm (the order reversed every other round); the row holds the
median round and the 20th / 80th percentiles.  The spellings:

* ``matmul``            ``tritongemm.matmul`` / ``torch.matmul``
* ``linear``            ``tritongemm.linear`` / ``F.linear`` (with bias), no grad
* ``linear grad fwd``   the same with operands that require grad (records the graph)
* ``linear grad fwd+bwd`` forward and ``backward``
* ``nn.Linear``         ``tritongemm.nn.Linear`` / ``torch.nn.Linear`` forward, no grad
* ``patch matmul`` / ``patch F.linear`` / ``patch nn.Linear``: torch's own call inside
  ``tritongemm.patch()`` (entered once around the timed calls) against the same call outside.

Outputs (and gradients) are checked against torch before timing, as everywhere.
Target: tritongemm within 1.2x of torch per call.
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from . import harness

SUITE = "host"
SIZES = ((16, 16, 16), (64, 64, 64), (128, 256, 128))
TARGET_RATIO = 1.2
#: Interleaved rounds per case (``--rounds`` overrides): the H100 host's per-call times wander by
#: 10-30% between rounds, so the median needs more of them than a GPU-bound suite.
ROUNDS = 15


@dataclass
class HostCase:
    api: str
    m: int
    n: int
    k: int

    @property
    def label(self) -> str:
        return f"{self.api} {self.m}x{self.n}x{self.k}"


APIS = (
    "matmul",
    "linear",
    "linear grad fwd",
    "linear grad fwd+bwd",
    "nn.Linear",
    "patch matmul",
    "patch F.linear",
    "patch nn.Linear",
)


def cases(sizes=SIZES) -> list[HostCase]:
    return [HostCase(api, m, n, k) for api in APIS for m, n, k in sizes]


def _pair(case: HostCase, dtype: torch.dtype, device: torch.device):
    """(torch call, tritongemm call, context for the tritongemm side, the call's outputs for the gate).

    Each call returns the tensors the gate compares (output, and grads for backward).
    """
    import contextlib

    import tritongemm

    gen = torch.Generator(device=device)
    gen.manual_seed(0)

    def rand(*shape, grad=False):
        t = torch.randn(shape, generator=gen, device=device).to(dtype)
        return t.requires_grad_(grad)

    grad = case.api.startswith("linear grad")
    a = rand(case.m, case.k, grad=grad)
    b = rand(case.k, case.n)
    w = rand(case.n, case.k, grad=grad)
    bias = rand(case.n, grad=grad)
    g = rand(case.m, case.n)
    nocontext = contextlib.nullcontext

    if case.api in ("matmul", "patch matmul"):

        def torch_fn():
            return (torch.matmul(a, b),)

        tg_fn = (lambda: (tritongemm.matmul(a, b),)) if case.api == "matmul" else torch_fn
    elif case.api in ("linear", "linear grad fwd", "patch F.linear"):

        def torch_fn():
            return (F.linear(a, w, bias),)

        tg_fn = (lambda: (tritongemm.linear(a, w, bias),)) if case.api != "patch F.linear" else torch_fn
    elif case.api == "linear grad fwd+bwd":

        def fwd_bwd(fn):
            def run():
                a.grad = w.grad = bias.grad = None
                fn(a, w, bias).backward(g)
                return a.grad, w.grad, bias.grad

            return run

        torch_fn, tg_fn = fwd_bwd(F.linear), fwd_bwd(tritongemm.linear)
    else:  # nn.Linear, patch nn.Linear
        layer = torch.nn.Linear(case.k, case.n, device=device, dtype=dtype)
        ours = tritongemm.nn.Linear.from_linear(layer) if case.api == "nn.Linear" else layer

        def torch_fn():
            return (layer(a),)

        def tg_fn():
            return (ours(a),)

    context = tritongemm.patch if case.api.startswith("patch") else nocontext
    grad_mode = torch.enable_grad if grad else torch.no_grad
    return torch_fn, tg_fn, context, grad_mode


def per_call_us(fn: Callable[[], object], calls: int, device: torch.device) -> float:
    """Wall time of ``calls`` back-to-back calls and one synchronize, per call, in microseconds."""
    harness._synchronize(device)
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    harness._synchronize(device)
    return (time.perf_counter() - t0) / calls * 1e6


def measure(
    case: HostCase, dtype: torch.dtype, device: torch.device | str, *, calls: int = 200, rounds: int = ROUNDS
) -> list[dict]:
    """Two rows (torch, tritongemm) for one case: gated, then interleaved rounds of ``calls`` calls."""
    device = torch.device(device)
    base = {
        "suite": SUITE,
        "group": case.api,
        "case": case.label,
        "api": case.api,
        "m": case.m,
        "n": case.n,
        "k": case.k,
        "layout": "NT" if "linear" in case.api.lower() else "NN",
        "dtype": harness.DTYPE_NAMES[dtype],
        "backward": case.api.endswith("bwd"),
        "calls": calls,
        "rounds": rounds,
    }
    rows = {
        "torch": {**base, "impl": "torch", "family": "cublas"},
        "tritongemm": {**base, "impl": "tritongemm", "family": "tritongemm"},
    }
    try:
        torch_fn, tg_fn, context, grad_mode = _pair(case, dtype, device)
        with grad_mode():
            refs = [t.detach().clone() for t in torch_fn()]
            with context():
                outs = tg_fn()
        worst = None
        for ref, out in zip(refs, outs):
            result = harness.check_output(out, ref)
            if not result.ok:
                worst = result
                break
            if worst is None or result.rel_err > worst.rel_err:
                worst = result
    except Exception as exc:
        return [{**r, "status": harness.ERROR, "message": harness._short_error(exc)} for r in rows.values()]
    rows["tritongemm"].update(rel_err=worst.rel_err, tol=worst.tol)
    if not worst.ok:
        rows["tritongemm"].update(status=harness.FAILED_GATE, message=worst.reason)
        return list(rows.values())
    samples: dict[str, list[float]] = {"torch": [], "tritongemm": []}

    def timed(name: str) -> float:
        with grad_mode():
            if name == "torch":
                return per_call_us(torch_fn, calls, device)
            with context():  # entered once around the calls, as a user wraps a loop
                return per_call_us(tg_fn, calls, device)

    for name in samples:  # warm-up: first-call compilation and caches
        timed(name)
    for r in range(rounds):
        for name in ("torch", "tritongemm") if r % 2 == 0 else ("tritongemm", "torch"):
            samples[name].append(timed(name))
    for name, s in samples.items():
        ordered = sorted(s)
        rows[name].update(
            status=harness.OK,
            message="",
            host_us=statistics.median(ordered),
            us_p20=harness._quantile(ordered, 0.2),
            us_p80=harness._quantile(ordered, 0.8),
            ms=statistics.median(ordered) / 1e3,
        )
    rows["tritongemm"]["ratio_vs_torch"] = rows["tritongemm"]["host_us"] / rows["torch"]["host_us"]
    return list(rows.values())


def run_host(
    case_list: list[HostCase],
    dtype: torch.dtype,
    device: torch.device | str,
    *,
    calls: int = 200,
    rounds: int = ROUNDS,
    log: Callable[[str], None] = lambda s: None,
) -> list[dict]:
    rows = []
    for i, case in enumerate(case_list):
        log(f"{i + 1}/{len(case_list)} {case.label}")
        rows += measure(case, dtype, device, calls=calls, rounds=rounds)
    return rows


def summary_table(rows: list[dict]) -> str:
    pairs: dict[str, dict[str, dict]] = {}
    for r in rows:
        pairs.setdefault(r["case"], {})[r["impl"]] = r
    lines = []
    for case, p in pairs.items():
        t, g = p.get("torch", {}), p.get("tritongemm", {})
        ratio = g.get("ratio_vs_torch")
        lines.append(
            {
                "case": case,
                "dtype": g.get("dtype"),
                "torch": t.get("host_us"),
                "tg": g.get("host_us"),
                "ratio": ratio,
                "target": ("ok" if ratio <= TARGET_RATIO else "over") if ratio else g.get("status"),
            }
        )
    return harness.format_table(
        lines,
        [
            ("case", "case"),
            ("dtype", "dtype"),
            ("torch", "torch us/call"),
            ("tg", "tritongemm us/call"),
            ("ratio", "tritongemm ÷ torch"),
            ("target", f"<= {TARGET_RATIO}x"),
        ],
    )


def fig_host(df):
    """Per-call host time, tritongemm ÷ torch, one bar per case; the 1.2x target marked."""
    from matplotlib.figure import Figure

    d = df[(df["suite"] == SUITE) & (df["impl"] == "tritongemm") & df["ratio_vs_torch"].notna()]
    if d.empty:
        return None
    fig = Figure(figsize=(max(7.0, 0.35 * len(d)), 4.5), layout="constrained")
    ax = fig.subplots()
    colors = ["#1f77b4" if r <= TARGET_RATIO else "#d62728" for r in d["ratio_vs_torch"]]
    ax.bar(range(len(d)), d["ratio_vs_torch"], color=colors)
    ax.axhline(1.0, color="#222222", lw=0.8)
    ax.axhline(TARGET_RATIO, color="#d62728", lw=0.8, ls="--", label=f"target {TARGET_RATIO}x")
    ax.set_xticks(range(len(d)), list(d["case"]), rotation=70, fontsize=7)
    ax.set_ylabel("per-call wall time: tritongemm ÷ torch")
    gpu = df["env_gpu"].dropna().iloc[0] if "env_gpu" in df.columns and df["env_gpu"].notna().any() else ""
    ax.set_title(f"Host overhead of tiny GEMMs (medians of interleaved rounds)  {gpu}")
    ax.legend(fontsize=8)
    return fig


def plot_host(csv: str | Path, out_dir: str | Path) -> list[Path]:
    fig = fig_host(harness.read_results(csv))
    if fig is None:
        return []
    path = Path(out_dir) / "host_overhead.png"
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    return [path]


def run_cli(args) -> int:
    """``python -m benchmarks run --suite host``; the exit status."""
    import tritongemm
    from tritongemm.launch import native

    if not torch.cuda.is_available() or tritongemm.interpreter_enabled():
        raise RuntimeError("the host suite times compiled kernels on a CUDA GPU")
    dtype = harness.DTYPES[(args.dtype or "bf16").split(",")[0].strip()]
    device = torch.device("cuda", torch.cuda.current_device())
    env = harness.environment(device)
    out_dir = Path(args.out) if args.out else harness.default_results_dir(env)
    case_list = [c for c in cases() if not args.filter or args.filter in c.label]
    node = native.node_in_use()
    print(f"autograd node of repeated calls with grad: {node}", file=sys.stderr)
    start = time.perf_counter()
    rows = run_host(
        case_list,
        dtype,
        device,
        rounds=getattr(args, "rounds", None) or ROUNDS,
        log=lambda s: print(f"[host {time.perf_counter() - start:6.1f}s] {s}", file=sys.stderr, flush=True),
    )
    csv = harness.write_results(
        rows, out_dir / "host.csv", env, {"suite": SUITE, "target_ratio": TARGET_RATIO, "autograd_node": node}
    )
    print("\n== host ==")
    print(f"autograd node: {node}")
    print(summary_table(rows))
    print(f"wrote {csv}")
    if not args.no_plots:
        try:
            for f in plot_host(csv, out_dir):
                print(f"wrote {f}")
        except Exception as exc:
            print(f"figure skipped ({type(exc).__name__}: {exc})", file=sys.stderr)
    failed = [r for r in rows if r.get("status") != harness.OK]
    for r in failed:
        print(f"  {r['case']} {r['impl']}: {r['status']} {r.get('message', '')}")
    return 1 if failed else 0


__all__ = [
    "HostCase",
    "APIS",
    "cases",
    "measure",
    "run_host",
    "per_call_us",
    "summary_table",
    "fig_host",
    "plot_host",
    "run_cli",
]
