"""The benchmark core: cases, the correctness gate, L2 rotation, timing, environment, CSV.

Rules every measurement follows:

* **Same process, same inputs.** All implementations of one case run back to
  back on the same tensors (and the same rotated copies of them).
* **Gate before timing.** Each output is compared with cuBLAS's (relative
  Frobenius error, per-dtype tolerance) on the first and last rotated copy;
  an implementation that fails is recorded ``failed_gate`` and never timed.
* **No flattering caches.** Inputs rotate over enough copies that together
  they exceed twice the L2 cache (``triton.testing.do_bench`` also flushes L2
  before each call).  Data is random normal, never zeros (zeros make tensor
  cores draw less power and run faster than real data).
* **Medians, interleaved.** ``do_bench`` after its warm-up, in rounds that
  alternate the implementations of a case (cuBLAS included); the median over
  all rounds, with the 20th and 80th percentiles.
* **Results are data.** One tidy row per (case, dtype, implementation), with
  the environment in every row (``env_*`` columns) and in a JSON sidecar.

Everything here imports and runs on a CPU machine (timing falls back to a
wall clock there, which the tests use on tiny cases); the GPU-only parts are
the ``do_bench`` call and the ceilings.
"""

from __future__ import annotations

import datetime
import json
import math
import os
import platform
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from tritongemm.semantics import tf32_enabled
from tritongemm.testing import (  # one home for tolerances, the error metric and L2 rotation
    DEFAULT_L2_BYTES,
    make_matrix,
    relative_error,
    rotation_copies,
    tolerance,
)
from tritongemm.testing import (
    L2_ROTATION_FACTOR as L2_ROTATION_FACTOR,  # re-exported: suites record it
)
from tritongemm.testing import (
    format_table as format_table,  # re-exported: suites print with it
)
from tritongemm.testing import (
    time_samples as time_samples,  # re-exported: the suites time with it
)

from . import schema

DTYPES: dict[str, torch.dtype] = {
    "fp16": torch.float16,
    "bf16": torch.bfloat16,
    "fp32": torch.float32,
    "fp64": torch.float64,
}
DTYPE_NAMES: dict[torch.dtype, str] = {v: k for k, v in DTYPES.items()}


#: Interleaved timing rounds per case, unless ``--rounds`` says otherwise (the host suite has its own).
ROUNDS = 3


#: Column order of the results CSV (the schema and its documentation: ``schema.py``).
COLUMNS = schema.COLUMNS

# Row statuses.
OK, FAILED_GATE, INVALID, ERROR = schema.OK, schema.FAILED_GATE, schema.INVALID, schema.ERROR


# ----------------------------------------------------------------------------------
# Cases and implementations
# ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Case:
    """One GEMM problem C[M, N] = A[M, K] @ B[K, N] (forward, or forward + backward).

    ``layout`` uses tritongemm's convention (``tritongemm.launch.problem_of``): one
    letter per operand, ``N`` when it is row-major as torch stores it, ``T``
    when it is a transposed (column-major) view.  So a linear layer's
    ``x @ W.T`` is ``NT`` (BLAS, which thinks column-major, calls it ``TN``).
    """

    suite: str
    group: str  # what a plot panel shows: "square", "llama3-8b qkv"
    label: str  # unique within the suite
    m: int
    n: int
    k: int
    layout: str = "NN"
    x: int | None = None  # the swept size a plot puts on its x axis (default: m)
    x_label: str = "M"
    backward: bool = False

    @property
    def flops(self) -> int:
        # forward 2MNK; backward adds dA = dC B^T and dB = A^T dC, 2MNK each
        return 2 * self.m * self.n * self.k * (3 if self.backward else 1)

    def min_bytes(self, elem_size: int) -> int:
        """Compulsory DRAM traffic: read A and B, write C once (x3 with backward)."""
        once = (self.m * self.k + self.k * self.n + self.m * self.n) * elem_size
        return once * (3 if self.backward else 1)


@dataclass
class Impl:
    """A way to compute ``a @ b``; ``family`` groups them (cublas, tritongemm, torch.compile)."""

    name: str
    family: str
    fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    variant: str = ""
    #: An explicit TileConfig, when the implementation pins one (recorded even if it does not fit).
    config: Any = None
    #: For tritongemm rows: (a, b) -> the TileConfig the dispatcher will run (validated).
    config_of: Callable[[torch.Tensor, torch.Tensor], Any] | None = None


# ----------------------------------------------------------------------------------
# The correctness gate
# ----------------------------------------------------------------------------------
def gate_tolerance(dtype: torch.dtype) -> float:
    """Largest relative Frobenius error vs cuBLAS a correct GEMM can show (``testing.tolerance``'s library bound)."""
    return tolerance(dtype, "cuda", against="library")


@dataclass(frozen=True)
class GateResult:
    ok: bool
    rel_err: float
    tol: float
    reason: str = ""


def check_output(
    out: Any, ref: torch.Tensor, tol: float | None = None, dtype: torch.dtype | None = None
) -> GateResult:
    """Does ``out`` match the reference (cuBLAS) output within the dtype's tolerance?

    ``dtype``: the dtype ``out`` must have, where the reference is computed in another one
    (the fp8 suite's float64 product of the dequantized operands); default the reference's.
    """
    dtype = ref.dtype if dtype is None else dtype
    tol = gate_tolerance(dtype) if tol is None else tol
    if not isinstance(out, torch.Tensor):
        return GateResult(False, math.nan, tol, f"returned {type(out).__name__}, not a Tensor")
    if tuple(out.shape) != tuple(ref.shape):
        return GateResult(False, math.nan, tol, f"shape {tuple(out.shape)} != reference {tuple(ref.shape)}")
    if out.dtype != dtype:
        return GateResult(False, math.nan, tol, f"dtype {out.dtype} != expected {dtype}")
    if not bool(torch.isfinite(out).all()):
        return GateResult(False, math.nan, tol, "output holds NaN or Inf")
    err = relative_error(out, ref)
    if not err <= tol:
        return GateResult(False, err, tol, f"relative error {err:.3g} exceeds tolerance {tol:.3g}")
    return GateResult(True, err, tol)


# ----------------------------------------------------------------------------------
# Inputs and L2 rotation
# ----------------------------------------------------------------------------------
def l2_cache_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        size = getattr(props, "L2_cache_size", 0)
        if size:
            return int(size)
    return DEFAULT_L2_BYTES


def copies_to_exceed_l2(set_bytes: int, l2_bytes: int) -> int:
    """How many copies of an input set together exceed ``L2_ROTATION_FACTOR`` x L2 (``testing.rotation_copies``)."""
    return rotation_copies(set_bytes, l2_bytes)


def make_inputs(case: Case, dtype: torch.dtype, device: torch.device, n_copies: int, seed: int = 0):
    """``n_copies`` independent random input sets: (a, b) or, with backward, (a, b, grad_out)."""
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    sets = []
    for _ in range(n_copies):
        a = make_matrix(case.m, case.k, case.layout[0], dtype, device, generator=gen)
        b = make_matrix(case.k, case.n, case.layout[1], dtype, device, generator=gen)
        if case.backward:
            a.requires_grad_(True)
            b.requires_grad_(True)
            g = torch.randn((case.m, case.n), generator=gen, device=device, dtype=torch.float32).to(dtype)
            sets.append((a, b, g))
        else:
            sets.append((a, b))
    return sets


def input_set_bytes(case: Case, dtype: torch.dtype) -> int:
    elem = torch.empty((), dtype=dtype).element_size()
    n = case.m * case.k + case.k * case.n + (case.m * case.n if case.backward else 0)
    return n * elem


class Rotation:
    """Hands out the input sets (or the graphs captured on them) in turn, so consecutive calls read
    different memory."""

    def __init__(self, sets: Sequence[Any]):
        self.sets = list(sets)
        self.index = 0

    def next(self) -> Any:
        s = self.sets[self.index]
        self.index = (self.index + 1) % len(self.sets)
        return s


# ----------------------------------------------------------------------------------
# Running one implementation: forward or forward + backward
# ----------------------------------------------------------------------------------
def _forward(impl: Impl, inputs: tuple) -> torch.Tensor:
    return impl.fn(inputs[0], inputs[1])


def _forward_backward(impl: Impl, inputs: tuple) -> tuple[torch.Tensor, ...]:
    a, b, g = inputs
    a.grad = b.grad = None
    out = impl.fn(a, b)
    out.backward(g)
    return out.detach(), a.grad, b.grad


def _outputs(case: Case, impl: Impl, inputs: tuple) -> tuple[torch.Tensor, ...]:
    if case.backward:
        return _forward_backward(impl, inputs)
    with torch.no_grad():
        return (_forward(impl, inputs),)


def gate(case: Case, impl: Impl, sets: Sequence[tuple], refs: dict[int, tuple]) -> GateResult:
    """Run ``impl`` on the checked copies and compare every output with the reference."""
    return gate_copies(lambda index: _outputs(case, impl, sets[index]), refs, ("out", "grad_a", "grad_b"))


def gate_copies(outputs: Callable[[int], Sequence], refs: dict[int, tuple], names, dtype=None) -> GateResult:
    """``outputs(i)`` on each checked copy ``i`` against ``refs[i]`` by ``check_output`` (``dtype`` as
    there): the worst result, or the first failure, its reason led by the output's name in ``names``."""
    worst = None
    for index, ref in refs.items():
        for name, out, r in zip(names, outputs(index), ref):
            result = check_output(out, r, dtype=dtype)
            if not result.ok:
                return GateResult(False, result.rel_err, result.tol, f"{name}: {result.reason}")
            if worst is None or result.rel_err > worst.rel_err:
                worst = result
    return worst


# ----------------------------------------------------------------------------------
# Timing
# ----------------------------------------------------------------------------------
def summarize(times: Sequence[float]) -> tuple[float, float, float]:
    """(median, p20, p80) of timings."""
    ordered = sorted(times)
    return statistics.median(ordered), _quantile(ordered, 0.2), _quantile(ordered, 0.8)


def time_ms(
    step: Callable[[], Any],
    device: torch.device,
    warmup_ms: float = 25,
    rep_ms: float = 100,
    grad_to_none: Sequence[torch.Tensor] | None = None,
) -> tuple[float, float, float]:
    """(median, p20, p80) milliseconds of ``step`` (see ``time_samples``)."""
    return summarize(time_samples(step, device, warmup_ms, rep_ms, grad_to_none))


def host_overhead_us(step: Callable[[], Any], device: torch.device, calls: int | None = None) -> float:
    """Median microseconds of CPU time one call takes to issue its work (launches are asynchronous).

    Where this exceeds the kernel time, back-to-back calls leave the GPU idle
    ("host-bound").  ``do_bench`` hides up to its L2 flush's duration (about
    0.1 ms) of host time per call, so ``ms`` stays the GPU's time.
    """
    calls = calls or (21 if device.type == "cuda" else 1)  # on the CPU it is just the run time
    _synchronize(device)
    times = []
    for _ in range(calls):
        t0 = time.perf_counter()
        step()
        times.append((time.perf_counter() - t0) * 1e6)
    _synchronize(device)
    return statistics.median(times)


def _quantile(sorted_values: list[float], q: float) -> float:
    pos = q * (len(sorted_values) - 1)
    lo, hi = math.floor(pos), math.ceil(pos)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# ----------------------------------------------------------------------------------
# Measuring a case
# ----------------------------------------------------------------------------------
def _base_row(case: Case, dtype: torch.dtype) -> dict:
    elem = torch.empty((), dtype=dtype).element_size()
    nbytes = case.min_bytes(elem)
    return {
        "suite": case.suite,
        "group": case.group,
        "case": case.label,
        "x": case.x if case.x is not None else case.m,
        "x_label": case.x_label,
        "m": case.m,
        "n": case.n,
        "k": case.k,
        "layout": case.layout,
        "dtype": DTYPE_NAMES.get(dtype, str(dtype)),
        "backward": case.backward,
        "flops": case.flops,
        "bytes": nbytes,
        "intensity": case.flops / nbytes,
    }


def _config_columns(cfg: Any) -> dict:
    """The TileConfig's fields as columns (block_m ... num_stages, the options), its kernel as the
    schema's four kernel columns (``schema.kernel_columns``)."""
    if cfg is None:
        return {}
    fields = cfg.to_dict()
    kernel = fields.pop("kernel")  # (a row's ``kernel`` column, where a suite has one, is the plan's)
    return {"config": cfg.short(), **fields, **schema.kernel_columns(kernel)}


def _short_error(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}".strip().replace("\n", " ")
    return text[:400]


@dataclass
class Prepared:
    """An implementation that passed the gate, ready to time: its row so far and its step."""

    row: dict
    step: Callable[[], Any]
    leaves: list | None
    grad_mode: Callable[[], Any]
    samples: list = field(default_factory=list)
    #: On a GPU, time ``step`` replayed from CUDA graphs, one per input set it rotates through (this
    #: many): the GPU's time alone, where issuing the eager step takes about as long as running it (a
    #: backward at a few hundred tokens: a late launch leaves the GPU idle inside the timed call).
    graphs: int = 0
    replay: Callable[[], Any] | None = None


#: The ``message`` of rows timed from CUDA-graph replays (``Prepared.graphs``).
GRAPHS_NOTE = "ms from CUDA-graph replays of the step (host_us: the eager step's)"


def captured(
    step: Callable[[], Any], copies: int, leaves: Sequence[torch.Tensor] | None
) -> Callable[[], Any]:
    """``step`` recorded into ``copies`` CUDA graphs, one per input set its rotation hands out, and a
    function that replays them in turn.  The leaves' gradients are set to None before each capture, so
    each graph writes gradients of its own rather than accumulating into another's."""

    def clear() -> None:
        for t in leaves or ():
            t.grad = None

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # (capture wants a warm-up off the default stream)
        for _ in range(copies):
            clear()
            step()
    torch.cuda.current_stream().wait_stream(side)
    graphs = []
    for _ in range(copies):
        clear()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            step()
        graphs.append(graph)
    rotation = Rotation(graphs)
    return lambda: rotation.next().replay()


def prepare(
    case: Case, impl: Impl, sets: Sequence[tuple], refs: dict[int, tuple], device: torch.device
) -> Prepared | dict:
    """Gate ``impl``; a finished row if it cannot be timed, else what timing needs."""
    row = {"impl": impl.name, "family": impl.family, "variant": impl.variant, "n_copies": len(sets)}
    row.update(_config_columns(impl.config))
    try:
        if impl.config_of is not None:
            row.update(_config_columns(impl.config_of(sets[0][0], sets[0][1])))
    except Exception as exc:  # a config the device cannot hold: ConfigError names the budget
        status = INVALID if type(exc).__name__ == "ConfigError" else ERROR
        return {**row, "status": status, "message": _short_error(exc)}
    try:
        result = gate(case, impl, sets, refs)  # also the first call: compiles / autotunes
        _synchronize(device)
    except Exception as exc:
        status = INVALID if type(exc).__name__ == "ConfigError" else ERROR
        return {**row, "status": status, "message": _short_error(exc)}
    row.update(rel_err=result.rel_err, tol=result.tol)
    if not result.ok:
        return {**row, "status": FAILED_GATE, "message": result.reason}

    rotation = Rotation(sets)
    if case.backward:
        leaves = [t for s in sets for t in s[:2]]

        def step():
            a, b, g = rotation.next()
            impl.fn(a, b).backward(g)
    else:
        leaves = None

        def step():
            a, b = rotation.next()
            impl.fn(a, b)

    grad_mode = torch.enable_grad if case.backward else torch.no_grad
    return Prepared(row, step, leaves, grad_mode)


def time_round(prepared: Prepared, device: torch.device, warmup_ms: float, rep_ms: float) -> dict | None:
    """Add one round of timings to ``prepared``; a finished error row if timing fails."""
    try:
        with prepared.grad_mode():
            step, leaves = prepared.step, prepared.leaves
            if prepared.graphs and device.type == "cuda":
                if prepared.replay is None:
                    prepared.replay = captured(prepared.step, prepared.graphs, prepared.leaves)
                step, leaves = prepared.replay, None
            prepared.samples += time_samples(step, device, warmup_ms, rep_ms, grad_to_none=leaves)
    except Exception as exc:
        return {**prepared.row, "status": ERROR, "message": "timing: " + _short_error(exc)}
    return None


def time_interleaved(
    slots: list | dict, device: torch.device, rounds: int, warmup_ms: float, rep_ms: float
) -> None:
    """Time every ``Prepared`` of ``slots`` (a list, or a dict's values) in ``rounds`` interleaved rounds,
    the order reversed every other round, so a drift of the GPU's clocks (power capping swings them
    by +-5% over about a second) falls on all alike; a slot whose timing fails becomes its error row.
    The first round warms up for ``warmup_ms``, later ones a fifth of it; each takes ``rep_ms / rounds``."""
    keys = list(slots) if isinstance(slots, dict) else list(range(len(slots)))
    for r in range(rounds):
        for key in keys if r % 2 == 0 else reversed(keys):
            if isinstance(slots[key], Prepared):
                failed = time_round(
                    slots[key], device, warmup_ms if r == 0 else warmup_ms / 5, rep_ms / rounds
                )
                if failed is not None:
                    slots[key] = failed


def finish(prepared: Prepared, device: torch.device) -> dict:
    """The timed row: median and 20th/80th percentiles over all rounds, and the host time."""
    try:
        with prepared.grad_mode():
            host_us = host_overhead_us(prepared.step, device)
    except Exception as exc:
        return {**prepared.row, "status": ERROR, "message": "timing: " + _short_error(exc)}
    ms, p20, p80 = summarize(prepared.samples)
    return {
        **prepared.row,
        "status": OK,
        "message": "",
        "ms": ms,
        "ms_p20": p20,
        "ms_p80": p80,
        "host_us": host_us,
    }


def _references(case: Case, sets: Sequence[tuple], reference: Impl) -> dict[int, tuple]:
    """cuBLAS's outputs on the copies the gate checks (the first and the last)."""
    checked = sorted({0, len(sets) - 1})
    return {i: tuple(t.detach().clone() for t in _outputs(case, reference, sets[i])) for i in checked}


def _finish_rows(rows: list[dict]) -> None:
    """TFLOP/s, GB/s and the speedup over cuBLAS of the same case and dtype (GEMM rows only)."""
    for row in rows:
        ms = row.get("ms")
        if row.get("flops") and ms is not None and ms > 0 and not math.isnan(ms):
            row["tflops"] = row["flops"] / (ms * 1e-3) / 1e12
            if row.get("bytes"):
                row["gbps"] = row["bytes"] / (ms * 1e-3) / 1e9

    def key(r: dict) -> tuple:
        return r.get("suite"), r.get("case"), r.get("dtype")

    cublas = {key(r): r["ms"] for r in rows if r.get("family") == "cublas" and r.get("status") == OK}
    for row in rows:
        base = cublas.get(key(row))
        if base and row.get("status") == OK and row.get("flops"):
            row["speedup_vs_cublas"] = base / row["ms"]


def run_cases(
    cases: Sequence[Case],
    dtypes: Sequence[torch.dtype],
    impls_for: Callable[[Case, torch.dtype], list[Impl]],
    reference: Impl,
    *,
    device: torch.device | str = "cuda",
    warmup_ms: float = 25,
    rep_ms: float = 100,
    l2_bytes: int | None = None,
    progress: bool = True,
    seed: int = 0,
    rounds: int = ROUNDS,
) -> list[dict]:
    """Measure every implementation on every (case, dtype); returns tidy rows.

    Each implementation is timed ``rounds`` times for ``rep_ms / rounds``,
    interleaved with the others, and its row holds the median of all samples.

    ``impls_for(case, dtype)`` lists the implementations to compare (built per
    case, so e.g. ``torch.compile`` starts fresh); ``reference`` (cuBLAS) is
    what the gate compares against, and is measured too if it is in the list.
    """
    device = torch.device(device)
    l2 = l2_bytes if l2_bytes is not None else l2_cache_bytes(device)
    plan = [(dtype, case) for dtype in dtypes for case in cases]
    from tritongemm.tuning.progress import ProgressBar  # here, not at import: see benchmarks/__init__.py

    bar = ProgressBar(sum(len(impls_for(case, dtype)) for dtype, case in plan), enabled=progress, unit="runs")
    done = 0
    rows: list[dict] = []
    for dtype, case in plan:
        impls = impls_for(case, dtype)  # built right before use: torch.compile starts fresh per case
        base = _base_row(case, dtype)
        n_copies = copies_to_exceed_l2(input_set_bytes(case, dtype), l2)
        try:
            sets = make_inputs(case, dtype, device, n_copies, seed=seed)
            refs = _references(case, sets, reference)
        except Exception as exc:  # e.g. out of memory: record every impl as not run
            for impl in impls:
                done += 1
                bar.step(done, f"{base['dtype']} {case.label} {impl.name}")
                rows.append(
                    {
                        **base,
                        "impl": impl.name,
                        "family": impl.family,
                        "variant": impl.variant,
                        "status": ERROR,
                        "message": "inputs: " + _short_error(exc),
                    }
                )
            continue
        # Gate every implementation, then time them in interleaved rounds (the
        # order reversed every other round), so a drift of the GPU's clocks
        # (power capping swings them by +-5% over about a second) falls on all
        # of them alike instead of on whichever ran during a slow phase.
        slots: list = []
        for impl in impls:
            done += 1
            bar.step(done, f"{base['dtype']} {case.label} {impl.name}")
            slots.append(prepare(case, impl, sets, refs, device))
        time_interleaved(slots, device, rounds, warmup_ms, rep_ms)
        for slot in slots:
            rows.append({**base, **(finish(slot, device) if isinstance(slot, Prepared) else slot)})
        del sets, refs, slots
        if device.type == "cuda":
            torch.cuda.empty_cache()
    bar.close()
    _finish_rows(rows)
    return rows


# ----------------------------------------------------------------------------------
# Ceilings: what the device can do at best, measured once per run
# ----------------------------------------------------------------------------------
def measure_ceilings(
    device: torch.device | str = "cuda",
    copy_bytes: int = 2**30,
    peak_n: int = 8192,
    warmup_ms: float = 25,
    rep_ms: float = 100,
) -> list[dict]:
    """Rows for the device-to-device copy bandwidth and cuBLAS's best matmul rate.

    GPU only.  The copy counts bytes read plus bytes written; the matmul is
    cuBLAS ``peak_n``^3 bf16 on random data.
    """
    device = torch.device(device)
    rows = [
        _copy_ceiling(device, copy_bytes, warmup_ms, rep_ms),
        _matmul_ceiling(device, peak_n, warmup_ms, rep_ms),
    ]
    torch.cuda.empty_cache()
    return rows


def _copy_ceiling(device: torch.device, copy_bytes: int, warmup_ms: float, rep_ms: float) -> dict:
    free, _ = torch.cuda.mem_get_info(device)
    nbytes = int(min(copy_bytes, free // 4)) // 16 * 16
    src = torch.randn(nbytes // 4, device=device)
    dst = torch.empty_like(src)
    ms, p20, p80 = time_ms(lambda: dst.copy_(src), device, warmup_ms, rep_ms)
    return {
        "suite": "ceiling",
        "group": "ceiling",
        "case": f"d2d copy {nbytes / 2**20:.0f} MiB",
        "impl": "torch.Tensor.copy_",
        "family": "ceiling",
        "variant": "copy_bandwidth",
        "status": OK,
        "message": "GB/s counts bytes read + written",
        "bytes": 2 * nbytes,
        "ms": ms,
        "ms_p20": p20,
        "ms_p80": p80,
        "gbps": 2 * nbytes / (ms * 1e-3) / 1e9,
    }


def _matmul_ceiling(device: torch.device, n: int, warmup_ms: float, rep_ms: float) -> dict:
    gen = torch.Generator(device=device)
    gen.manual_seed(1)
    a = torch.randn((n, n), generator=gen, device=device).to(torch.bfloat16)
    b = torch.randn((n, n), generator=gen, device=device).to(torch.bfloat16)
    flops = 2 * n**3
    ms, p20, p80 = time_ms(lambda: torch.matmul(a, b), device, warmup_ms, rep_ms)
    return {
        "suite": "ceiling",
        "group": "ceiling",
        "case": f"cublas {n}^3 bf16",
        "m": n,
        "n": n,
        "k": n,
        "dtype": "bf16",
        "impl": "cublas",
        "family": "ceiling",
        "variant": "matmul_peak",
        "status": OK,
        "message": "",
        "flops": flops,
        "ms": ms,
        "ms_p20": p20,
        "ms_p80": p80,
        "tflops": flops / (ms * 1e-3) / 1e12,
    }


# ----------------------------------------------------------------------------------
# Environment
# ----------------------------------------------------------------------------------
def _nvidia_driver() -> str:
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
        )
        if out.returncode == 0 and out.stdout.strip():
            return out.stdout.strip().splitlines()[0]
    except (OSError, subprocess.SubprocessError):
        pass
    try:  # the CUDA driver API version (e.g. 13000), when nvidia-smi is missing
        return f"cuda-driver-api {torch._C._cuda_getDriverVersion()}"
    except Exception:
        return "unknown"


def _git_commit() -> str:
    root = Path(__file__).resolve().parent.parent
    try:
        out = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
        )
        if out.returncode != 0:
            return "unknown"
        dirty = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=10,
        )
        return out.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def environment(device: torch.device | str | None = None) -> dict[str, Any]:
    """What produced the numbers: GPU, SM count, L2, driver, CUDA, torch, triton, date."""
    import triton

    device = (
        torch.device(device)
        if device is not None
        else (torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu"))
    )
    env: dict[str, Any] = {}
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        env.update(
            gpu=props.name,
            sm_count=props.multi_processor_count,
            capability=f"{props.major}.{props.minor}",
            l2_mb=round(l2_cache_bytes(device) / 2**20, 1),
            gpu_memory_gb=round(props.total_memory / 1e9, 1),
            driver=_nvidia_driver(),
        )
    else:
        env.update(
            gpu="none (CPU, Triton interpreter)",
            sm_count=0,
            capability="",
            l2_mb=0.0,
            gpu_memory_gb=0.0,
            driver="none",
        )
    try:
        import tritongemm

        tg_version = tritongemm.__version__
    except Exception:  # the benchmarks can run without tritongemm importable (e.g. plotting)
        tg_version = "unknown"
    env.update(
        cuda=torch.version.cuda or "none",
        torch=torch.__version__,
        triton=triton.__version__,
        python=platform.python_version(),
        tritongemm=tg_version,
        git=_git_commit(),
        tf32=tf32_enabled(),
        triton_interpret=os.environ.get("TRITON_INTERPRET", "0"),
        date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    )
    return env


#: GPU families whose results live in a folder of that short name (``results/h100/``): every
#: memory size and form factor of one chip shares its folder, and the CSV rows name the exact part.
SHORT_GPU_NAMES = ("h100", "h200", "h800", "h20", "a100", "a10", "l40s", "l4", "b200", "gb200")


def gpu_slug(name: str) -> str:
    """A results folder name: the chip's short name where it is one of ``SHORT_GPU_NAMES``
    ('NVIDIA H100 80GB HBM3' -> 'h100'), else the whole name ('nvidia-rtx-6000-ada-generation')."""
    words = re.sub(r"[^a-z0-9]+", " ", name.lower()).split()
    for short in SHORT_GPU_NAMES:
        if short in words:
            return short
    return "-".join(words) or "unknown-device"


def default_results_dir(env: dict) -> Path:
    slug = gpu_slug(env["gpu"]) if env.get("sm_count") else "cpu-interpreter"
    return Path(__file__).resolve().parent / "results" / slug


# ----------------------------------------------------------------------------------
# CSV
# ----------------------------------------------------------------------------------
def to_frame(rows: Iterable[dict], env: dict[str, Any] | None = None):
    """Rows as a DataFrame in the schema's column order, with ``env_*`` columns in every row."""
    import pandas as pd

    df = pd.DataFrame(list(rows))
    for key, value in (env or {}).items():
        df[f"{schema.ENV_PREFIX}{key}"] = value
    return schema.conform(df)


def write_results(
    rows: Iterable[dict],
    path: str | Path,
    env: dict[str, Any] | None = None,
    extra: dict[str, Any] | None = None,
) -> Path:
    """Write the tidy CSV at ``path`` and ``<stem>.env.json`` beside it; returns the CSV path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = list(rows)
    try:
        to_frame(rows, env).to_csv(path, index=False)
    except ImportError:  # no pandas on this machine: the same columns through the csv module
        _write_csv_plain(rows, path, env or {})
    sidecar = {"environment": env or {}, **(extra or {})}
    path.with_suffix(".env.json").write_text(json.dumps(sidecar, indent=2, default=str) + "\n")
    return path


def _write_csv_plain(rows: list[dict], path: Path, env: dict[str, Any]) -> None:
    import csv

    extra = [k for r in rows for k in r if k not in COLUMNS]
    header = COLUMNS + list(dict.fromkeys(extra)) + [f"{schema.ENV_PREFIX}{k}" for k in env]
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=header)
        writer.writeheader()
        for r in rows:
            writer.writerow(
                {
                    **{k: ("" if v is None else v) for k, v in r.items()},
                    **{f"{schema.ENV_PREFIX}{k}": v for k, v in env.items()},
                }
            )


def read_results(*paths: str | Path):
    """One DataFrame from one or more results CSVs (``schema.SchemaError`` for a file that is not one)."""
    import pandas as pd

    frames = [schema.read(p) for p in paths]
    return pd.concat(frames, ignore_index=True) if len(frames) > 1 else frames[0]


def plot_safely(csv, out_dir, draw: Callable[..., list[Path]] | None = None, what="figures") -> list[Path]:
    """Figures at the end of a GPU run (``draw(csv, out_dir)``, else every one ``plots`` has for the CSV);
    a plotting problem (even matplotlib missing) must not lose the measurements: the CSV is written,
    ``what`` is said skipped, and ``python -m benchmarks plot CSV`` redraws later."""
    try:
        if draw is None:
            from . import plots

            return plots.plot_all([csv], out_dir)
        return draw(csv, out_dir)
    except Exception as exc:  # report and carry on
        print(
            f"{what} skipped ({type(exc).__name__}: {exc}); redraw with `python -m benchmarks plot {csv}`",
            file=sys.stderr,
        )
        return []


# ----------------------------------------------------------------------------------
# Printing
# ----------------------------------------------------------------------------------
@dataclass
class RunSummary:
    """What a suite run produced (for scripts)."""

    csv: Path
    figures: list[Path] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
