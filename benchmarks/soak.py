"""``python -m benchmarks soak``: many mixed calls in one process; memory and caches must stay flat.

A server or a long training run calls the library millions of times with a
mix of shapes, dtypes, layouts and doors.  Every per-call structure it keeps
(launch plans, fast-path entries, tensor-map encodings, arrival counters, the
autograd node's state) must stop growing once the mix has been seen, and no
call may leave GPU memory behind.  This runs ``--calls`` calls (default
20,000) drawn at random from a fixed mix -- ``matmul``, ``linear``, a
converted ``nn.Linear`` and ``torch.matmul`` under ``patch()``, each with and
without a backward -- after one warm-up pass over the mix, and samples host
RSS, the GPU's allocated and reserved bytes and every cache's size as it goes.
Each case's output (and gradients) is checked against torch before the soak.

Passes when, after warm-up: GPU allocated bytes never move (nothing is held
between calls), reserved bytes never grow, host RSS grows by at most
``RSS_SLACK_MB`` and every cache stays within its bound.  Writes
``soak.csv`` (one row per sample, the results schema) and ``soak.png`` under
``benchmarks/results/<gpu>/``.  Without a GPU it runs a few hundred calls of
tiny shapes on Triton's interpreter (GPU columns empty).
"""

from __future__ import annotations

import os
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from . import harness

SUITE = "soak"
CALLS = 20_000
SAMPLES = 40
#: Host RSS may wander by this much after warm-up (the allocator's arenas, Python's free
#: lists); a leak of one small tensor per call grows it by hundreds of MB over the soak.
RSS_SLACK_MB = 32.0
DOORS = ("matmul", "linear", "nn", "patch")

#: (m, n, k): decode rows, a prompt, ragged edges, an odd leading dimension (the padded
#: path), square tiles and a projection large enough for the warp-specialized TMA kernel.
GPU_SHAPES = ((1, 4096, 4096), (16, 1024, 512), (100, 768, 768), (257, 513, 129), (333, 1023, 333))
GPU_SHAPES_2B = ((1024, 1024, 1024), (2048, 4096, 2048))
CPU_SHAPES = ((1, 24, 16), (7, 16, 24), (33, 17, 40))


@dataclass(frozen=True)
class SoakCase:
    door: str
    m: int
    n: int
    k: int
    dtype: torch.dtype
    layout: str  # "NT" (nn.Linear's weight) or "NN"
    grad: bool

    @property
    def label(self) -> str:
        dt = str(self.dtype).removeprefix("torch.")
        return f"{self.door} {self.m}x{self.n}x{self.k} {dt} {self.layout}{' grad' if self.grad else ''}"


def cases(device: torch.device) -> list[SoakCase]:
    """The mix: every door with and without grad over the shapes, dtypes and layouts."""
    if device.type == "cuda":
        shapes = [(s, dt) for s in GPU_SHAPES for dt in (torch.bfloat16, torch.float16)]
        shapes += [(s, torch.bfloat16) for s in GPU_SHAPES_2B]
        shapes += [((100, 768, 768), torch.float32)]
    else:
        shapes = [(s, torch.float32) for s in CPU_SHAPES]
    out = []
    for (m, n, k), dtype in shapes:
        for door in DOORS:
            # linear and nn.Linear take the weight as (N, K): NT; matmul and patch take both layouts.
            layouts = ("NT",) if door in ("linear", "nn") else ("NN", "NT")
            for layout in layouts:
                for grad in (False, True):
                    out.append(SoakCase(door, m, n, k, dtype, layout, grad))
    return out


class Operands:
    """A case's tensors and the callable that runs it once (returns the output, runs backward)."""

    def __init__(self, case: SoakCase, device: torch.device, seed: int):
        import tritongemm

        g = torch.Generator(device="cpu").manual_seed(seed)
        c = case

        def rand(*shape):
            return torch.randn(*shape, generator=g).to(device=device, dtype=c.dtype)

        self.case = c
        self.x = rand(c.m, c.k).requires_grad_(c.grad)
        w = rand(c.n, c.k)  # (N, K); NN matmul takes its transpose materialized
        self.b = w.mT if c.layout == "NT" else w.mT.contiguous()
        self.b.requires_grad_(c.grad)
        self.bias = rand(c.n).requires_grad_(c.grad)
        self.grad_out = rand(c.m, c.n)
        if c.door == "nn":
            lin = torch.nn.Linear(c.k, c.n, device=device, dtype=c.dtype)
            with torch.no_grad():
                lin.weight.copy_(w)
                lin.bias.copy_(self.bias)
            lin.requires_grad_(c.grad)
            self.module = tritongemm.nn.convert(torch.nn.Sequential(lin))
            self.w = self.module[0].weight
        elif c.door == "linear":
            self.w = w.requires_grad_(c.grad)
        self.tg = tritongemm

    def leaves(self) -> list[torch.Tensor]:
        c = self.case
        if c.door == "nn":
            return [self.x, *self.module.parameters()]
        if c.door == "linear":
            return [self.x, self.w, self.bias]
        return [self.x, self.b]

    def forward(self, ours: bool = True) -> torch.Tensor:
        c, tg = self.case, self.tg
        if c.door == "matmul":
            return tg.matmul(self.x, self.b) if ours else torch.matmul(self.x, self.b)
        if c.door == "linear":
            f = tg.linear if ours else torch.nn.functional.linear
            return f(self.x, self.w, self.bias)
        if c.door == "nn":
            if ours:
                return self.module(self.x)
            return torch.nn.functional.linear(self.x, self.w, self.module[0].bias)
        if ours:
            with tg.patch():
                return torch.matmul(self.x, self.b)
        return torch.matmul(self.x, self.b)

    def step(self, ours: bool = True) -> torch.Tensor:
        out = self.forward(ours)
        if self.case.grad:
            out.backward(self.grad_out)
        return out

    def zero_grad(self) -> None:
        for t in self.leaves():
            t.grad = None


def reference(ops: Operands) -> tuple[torch.Tensor, list]:
    """The case's output and gradients computed by torch in float64."""
    leaves = [t.detach().double().requires_grad_(t.requires_grad) for t in ops.leaves()]
    if ops.case.door in ("matmul", "patch"):
        out = leaves[0] @ leaves[1]
    else:
        out = torch.nn.functional.linear(*leaves)
    if ops.case.grad:
        out.backward(ops.grad_out.double())
    return out.detach(), [t.grad for t in leaves]


def check(ops: Operands) -> float:
    """The worst relative error of the case's output and gradients against float64."""
    from tritongemm.testing import relative_error, tolerance

    ref, ref_grads = reference(ops)
    ops.zero_grad()
    out = ops.step().detach()
    grads = [t.grad for t in ops.leaves()]
    ops.zero_grad()
    worst = relative_error(out, ref)
    for got, want in zip(grads, ref_grads):
        if (got is None) != (want is None):
            raise AssertionError(f"{ops.case.label}: a gradient is {'missing' if got is None else 'extra'}")
        if got is not None:
            worst = max(worst, relative_error(got, want))
    tol = tolerance(ops.case.dtype, ops.x.device)
    if not worst <= tol:
        raise AssertionError(f"{ops.case.label}: relative error {worst:.3g} > {tol:.3g}")
    return worst


def cache_sizes() -> dict[str, int]:
    """Sizes of every per-call structure the library keeps, with their bounds."""
    from tritongemm import launch
    from tritongemm.launch import common

    plans = sum(len(p.launchers) for p in launch._PLANS.values())
    encodings = 0
    for p in launch._PLANS.values():
        for launcher in p.launchers.values():
            for lc in _launches(launcher):
                direct = getattr(lc, "direct", None)
                if direct is not None:  # the generated launcher's per-argument encoding caches
                    sizes = [
                        len(v) for k, v in direct.__globals__.items() if k[:2] == "_e" and k[2:].isdigit()
                    ]
                    encodings = max(encodings, *sizes, 0)
    return {
        "launch_plans": plans,
        "fastpath_entries": sum(len(p.entries) for p in launch._PLANS.values()),
        "encodings_per_argument": encodings,
        "counter_buffers": len(common.COUNTERS),
    }


def cache_bounds() -> dict[str, int]:
    from tritongemm import launch
    from tritongemm.launch import common, direct

    return {
        "launch_plans": launch.Plans.MAX_LAUNCHERS * len(launch._PLANS),
        "fastpath_entries": launch.Plans.MAX_ENTRIES * len(launch._PLANS),
        "encodings_per_argument": direct.DirectLaunch.MAX_ENCODINGS,
        "counter_buffers": common.MAX_COUNTER_BUFFERS,
    }


def _launches(launcher) -> list:
    """The ``common.Launch`` objects a launcher holds (attribute values of that type, one level down)."""
    from tritongemm.launch.common import Launch

    found = []
    for value in vars(launcher).values():
        if isinstance(value, Launch):
            found.append(value)
        elif isinstance(value, (list, tuple)):
            found += [v for v in value if isinstance(v, Launch)]
        elif hasattr(value, "__dict__") and not isinstance(value, torch.Tensor):
            found += [v for v in vars(value).values() if isinstance(v, Launch)]
    return found


def rss_mb() -> float:
    """This process's resident set size, MiB (Linux ``/proc``; elsewhere the peak from ``resource``)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except OSError:
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def sample(calls: int, device: torch.device) -> dict:
    row = {"calls": calls, "rss_mb": rss_mb(), **cache_sizes()}
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        row["gpu_allocated_mb"] = torch.cuda.memory_allocated(device) / 2**20
        row["gpu_reserved_mb"] = torch.cuda.memory_reserved(device) / 2**20
    return row


def soak(device: torch.device, calls: int, samples: int = SAMPLES, seed: int = 0, log=print) -> dict:
    """Check every case, warm up, run ``calls`` random calls; returns samples and the verdicts."""
    mix = cases(device)
    ops = [Operands(c, device, seed + i) for i, c in enumerate(mix)]
    worst = 0.0
    for i, o in enumerate(ops):
        worst = max(worst, check(o))
        if (i + 1) % 20 == 0 or i + 1 == len(ops):
            log(f"checked {i + 1}/{len(ops)} cases (worst relative error {worst:.2g})")
    for o in ops:  # warm-up: every case once more, as in the soak (fast-path entries are built here)
        o.step()
        o.zero_grad()
    rng = random.Random(seed)
    every = max(calls // samples, 1)
    rows = [sample(0, device)]
    start = time.perf_counter()
    for i in range(1, calls + 1):
        o = ops[rng.randrange(len(ops))]
        o.step()
        o.zero_grad()
        if i % every == 0 or i == calls:
            rows.append(sample(i, device))
            rate = i / (time.perf_counter() - start)
            log(f"{i}/{calls} calls ({rate:.0f}/s), RSS {rows[-1]['rss_mb']:.1f} MiB")
    return {"rows": rows, "verdicts": verdicts(rows, device), "cases": len(mix), "worst_rel_err": worst}


def verdicts(rows: list[dict], device: torch.device) -> dict[str, tuple[bool, str]]:
    """name -> (passed, what was seen), over the samples after warm-up."""
    first, last = rows[0], rows[-1]
    out = {}
    growth = max(r["rss_mb"] for r in rows) - first["rss_mb"]
    out["host RSS"] = (growth <= RSS_SLACK_MB, f"+{growth:.1f} MiB (limit {RSS_SLACK_MB:.0f})")
    if device.type == "cuda":
        alloc = [r["gpu_allocated_mb"] for r in rows]
        moved = max(alloc) - min(alloc)
        out["GPU allocated"] = (moved == 0, f"{min(alloc):.2f}-{max(alloc):.2f} MiB")
        grew = last["gpu_reserved_mb"] - first["gpu_reserved_mb"]
        out["GPU reserved"] = (
            grew <= 0,
            f"{first['gpu_reserved_mb']:.0f} -> {last['gpu_reserved_mb']:.0f} MiB",
        )
    bounds = cache_bounds()
    for name, bound in bounds.items():
        peak = max(r[name] for r in rows)
        grew = last[name] - first[name]
        out[name] = (peak <= bound and grew <= 0, f"{first[name]} -> {last[name]} (bound {bound})")
    return out


def to_rows(result: dict, device: torch.device) -> list[dict]:
    rows = []
    for r in result["rows"]:
        rows.append(
            dict(
                suite=SUITE,
                group="soak",
                case=f"after {r['calls']} calls",
                x=r["calls"],
                x_label="calls after warm-up",
                impl="tritongemm",
                family="tritongemm",
                variant="soak",
                status=harness.OK,
                message=f"{result['cases']} cases, checked to relative error {result['worst_rel_err']:.2g}",
                **{k: v for k, v in r.items() if k != "calls"},
            )
        )
    return rows


def plot(rows: list[dict], out_dir: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    x = [r["x"] for r in rows]
    fig, (mem, caches) = plt.subplots(1, 2, figsize=(11, 4))
    mem.plot(x, [r["rss_mb"] for r in rows], label="host RSS")
    if rows and rows[0].get("gpu_allocated_mb") is not None:
        mem.plot(x, [r["gpu_allocated_mb"] for r in rows], label="GPU allocated")
        mem.plot(x, [r["gpu_reserved_mb"] for r in rows], label="GPU reserved")
    mem.set(xlabel="calls after warm-up", ylabel="MiB", title="Memory stays flat")
    mem.set_ylim(bottom=0)
    mem.legend()
    for name in cache_bounds():
        caches.plot(x, [r[name] for r in rows], label=name.replace("_", " "))
    caches.set(xlabel="calls after warm-up", ylabel="entries", title="Caches stay bounded")
    caches.set_ylim(bottom=0)
    caches.legend()
    fig.suptitle(
        f"tritongemm soak: {rows[-1]['x'] if rows else 0} mixed calls ({rows[0].get('env_gpu', '')})"
    )
    fig.tight_layout()
    path = out_dir / "soak.png"
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return [path]


def run_cli(args) -> int:
    """``python -m benchmarks soak``; the exit status (1 when a verdict fails)."""
    import tritongemm

    gpu = torch.cuda.is_available() and not tritongemm.interpreter_enabled()
    device = torch.device("cuda", torch.cuda.current_device()) if gpu else torch.device("cpu")
    calls = args.calls if args.calls is not None else (CALLS if gpu else 300)
    env = harness.environment(device)
    out_dir = Path(args.out) if args.out else harness.default_results_dir(env)
    start = time.perf_counter()

    def log(s: str) -> None:
        if not args.no_progress:
            print(f"[soak {time.perf_counter() - start:6.1f}s] {s}", file=sys.stderr, flush=True)

    result = soak(device, calls, log=log)
    rows = to_rows(result, device)
    csv = harness.write_results(rows, out_dir / "soak.csv", env, {"suite": SUITE, "calls": calls})
    files = [csv]
    if not args.no_plots:
        try:
            files += plot([dict(r, env_gpu=env.get("gpu", "")) for r in rows], out_dir)
        except Exception as exc:  # a figure is a convenience: the CSV holds the numbers
            print(f"figure skipped ({type(exc).__name__}: {exc})", file=sys.stderr)
    print(f"\n== soak: {calls} calls over {result['cases']} cases on {env.get('gpu', 'the interpreter')} ==")
    failed = 0
    for name, (ok, seen) in result["verdicts"].items():
        failed += not ok
        print(f"  {'ok  ' if ok else 'FAIL'} {name:24s} {seen}")
    for f in files:
        print(f"wrote {f}")
    return 1 if failed else 0
