"""Long K over few output tiles (M, N <= 1024, K 16k-131k, bf16): can a config of the existing kernels
beat cuBLAS by 5%, and how close to the memory roofline does each come?

Run from the repository root on the GPU machine (about 4-5 minutes, compile included):

    python benchmarks/sweep_longk.py            # results in $OUT/longk_sweep.json (else ./)
    TRITON_INTERPRET=1 python benchmarks/sweep_longk.py --smoke    # CPU: one tiny shape, code paths only

Per (shape, layout) it times, interleaved with cuBLAS (``torch.matmul``, timed at the start, middle and
end of the shape's list; its median is the reference):

* "default": ``tritongemm.matmul(a, b)`` (the heuristic's choice, ``explain`` recorded);
* the pointer kernel with split-K: 6 tiles x stages 3-5 (shared memory <= 200 KiB) x splits from
  {4, 8, 16, 32, 64} (>= 2 K-tiles a slice, 0.9-8 programs per SM) x both reductions (second kernel,
  in-kernel); plus the default's own tile and stages (6) at those splits and at its own split;
* Stream-K on the pointer kernel (128x128x64 w8 s4, 64x128x64 w4 s4);
* the TMA persistent and warp-specialized kernels, unsplit (references), and their own ways of sharing
  K among programs: the TMA kernel's Stream-K and the warp-specialized kernel's split tail (with fewer
  tiles than SMs, each tile cut into equal K-chunks of >= 28 steps, one program each).

Method: every config is first checked against a float32 ``torch.matmul`` reference
(||out - ref|| / ||ref|| < 2e-2, else "wrong", not timed); then ``triton.testing.do_bench`` median with
the inputs rotated over copies totalling > 150 MB (so L2 never holds the set being read): ``us``,
``ratio`` (cuBLAS us / us: > 1 is faster than cuBLAS).  A second timer, ``us_stream`` / ``ratio_stream``
(``Clock.stream_ms``: batches queued behind a GPU sleep, no L2 flush), leaves out do_bench's 256 MB flush,
whose dirty lines are written back during the timed call -- for the roofline question.  Kernels are
compiled beforehand by worker processes into Triton's disk cache (one task per compiled kernel, running
all its shapes), so the timing process only loads them.  GB/s counts A + B read and C written once
(bf16); ``pct_copy`` compares it with a device-to-device copy (``sweep_skinny.copy_bandwidth``, read +
write) measured in the same run.  Every record says which kernel ran (``kernel``, ``fallback``).

Options: --jobs N (compile workers, 14), --shapes 256x256x131072,..., --dry-run (the plan only; no GPU
needed), --smoke [--smoke-jobs N] (CPU interpreter).  Environment: LONGK_BUDGET_S (330),
LONGK_PRECOMPILE_S (170: the compile pool is stopped past it).

Reuses ``benchmarks/sweep_skinny.py`` (``_compile_key``, ``copy_bandwidth``, ``rotating`` from
``benchmarks/gpu_check.py``).  Its own ``precompile``/``_compile_worker`` are fp16-only, and its ``bench``
is a fixed 10 + 30 ms; here the worker runs bf16 and the do_bench window (20 ms at most) adapts to a time
budget (``LONGK_BUDGET_S``, default 330 s from start: past it, remaining configs are recorded as skipped).
"""

from __future__ import annotations

import time

T_START = time.time()

import argparse  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import multiprocessing as mp  # noqa: E402
import os  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import traceback  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)
SMOKE = "--smoke" in sys.argv
if SMOKE:  # Triton reads it when our kernels are decorated, i.e. at import
    os.environ.setdefault("TRITON_INTERPRET", "1")

import torch  # noqa: E402
import triton  # noqa: E402

import tritongemm  # noqa: E402
from benchmarks.gpu_check import rotating  # noqa: E402
from benchmarks.sweep_skinny import _compile_key, copy_bandwidth  # noqa: E402
from tritongemm import TileConfig  # noqa: E402
from tritongemm.device import device_info, interpreter_enabled, named_device  # noqa: E402
from tritongemm.launch.pointer import SplitK  # noqa: E402
from tritongemm.planning.configs import TMA_KERNELS, ConfigError  # noqa: E402
from tritongemm.planning.schedules import split_tail_schedule, stream_k_schedule  # noqa: E402
from tritongemm.testing import relative_error  # noqa: E402

DTYPE = torch.bfloat16
SHAPES = [
    (256, 256, 131072),
    (256, 256, 65536),
    (512, 512, 65536),
    (1024, 1024, 32768),
    (512, 512, 16384),
    (1024, 1024, 16384),
    (256, 1024, 65536),
    (1024, 256, 65536),
]
LAYOUTS = ("NN", "NT")
#: (block_m, block_n, block_k, warps) of the split-K grid
SPLIT_TILES = [
    (64, 64, 64, 4),
    (64, 128, 64, 4),
    (128, 64, 64, 4),
    (128, 128, 64, 8),
    (128, 128, 128, 8),
    (64, 64, 128, 4),
]
STAGES = (3, 4, 5)
SPLITS = (4, 8, 16, 32, 64)
SMEM_CAP = 200 * 1024
#: programs (tiles x splits) per SM: "about one" (16 tiles x 8 = 128 on 132 SMs counts) to 8
MIN_PER_SM, MAX_PER_SM = 0.9, 8.0
TOL = 2e-2
ROTATE_BYTES = 150e6
BUDGET_S = float(os.environ.get("LONGK_BUDGET_S", "330"))
WARMUP_MS = 5.0
MAX_REP_MS, MIN_REP_MS = 20.0, 4.0
#: GPU ms the stream timer (``Clock.stream_ms``) spends per point, roughly
STREAM_MS = 10.0
#: Past this, the pool of compile workers is stopped (what compiled stays in Triton's cache).
PRECOMPILE_S = float(os.environ.get("LONGK_PRECOMPILE_S", "170"))


def log(msg: str) -> None:
    print(f"[{time.time() - T_START:6.1f}s] {msg}", flush=True)


# ----------------------------------------------------------------------------------------------
# The plan: configs per shape
# ----------------------------------------------------------------------------------------------
class Invalid:
    """Configs the grid proposed that TileConfig (or the device's budgets) rejected."""

    count = 0
    reasons: dict[str, int] = {}

    @classmethod
    def make(cls, dev, *args, **kw):
        try:
            cfg = TileConfig(*args, **kw)
            cfg.validate(dev)
            return cfg
        except ConfigError as e:
            cls.count += 1
            key = str(e).split(":")[0][:80]
            cls.reasons[key] = cls.reasons.get(key, 0) + 1
            return None


def tiles_of(m, n, cfg) -> int:
    return -(-m // cfg.block_m) * -(-n // cfg.block_n)


def programs_of(m, n, k, cfg, sm) -> int:
    """Programs the launch runs: tiles x effective K slices (split-K), one per SM at most (Stream-K)."""
    tiles = tiles_of(m, n, cfg)
    k_tiles = -(-k // cfg.block_k)
    if cfg.stream_k:
        schedule = split_tail_schedule if cfg.kernel == "gluon_ws" else stream_k_schedule
        return schedule(tiles, k_tiles, sm).programs
    if cfg.split_k > 1 and not cfg.uses_tma:
        return tiles * SplitK(cfg, k).splits
    return min(tiles, sm) if cfg.kernel in ("tma_persistent", "gluon_ws") else tiles


def split_grid(m, n, k, sm, dev, tile, stage_list, extra_splits=()):
    """Split-K configs of one tile (bm, bn, bk, warps) over stages x splits x both reductions."""
    bm, bn, bk, w = tile
    out = []
    tiles = -(-m // bm) * -(-n // bn)
    k_tiles = -(-k // bk)
    for st in stage_list:
        if st * (bm + bn) * bk * 2 > SMEM_CAP:
            continue
        for s in sorted({*SPLITS, *extra_splits}):
            if k_tiles // s < 2:
                continue
            if s not in extra_splits and not MIN_PER_SM * sm <= tiles * s <= MAX_PER_SM * sm:
                continue
            for inline in (True, False):
                cfg = Invalid.make(dev, bm, bn, bk, 8, w, st, split_k=s, split_k_inline=inline)
                if cfg is not None:
                    out.append(cfg)
    return out


def configs_for(m, n, k, sm, dev, default_cfg):
    """The configs timed for one shape (deduplicated; the default itself runs as "default")."""
    out = []
    for tile in SPLIT_TILES:
        out += split_grid(m, n, k, sm, dev, tile, STAGES)
    if default_cfg is not None and default_cfg.split_k > 1 and not default_cfg.uses_tma:
        d = default_cfg
        out += split_grid(
            m, n, k, sm, dev, (d.block_m, d.block_n, d.block_k, d.num_warps), (d.num_stages,), (d.split_k,)
        )
    tma = dict(kernel="tma_persistent")
    ws = dict(kernel="gluon_ws")
    out += [
        # Stream-K on the pointer kernel
        Invalid.make(dev, 128, 128, 64, 8, 8, 4, stream_k=True),
        Invalid.make(dev, 64, 128, 64, 8, 4, 4, stream_k=True),
        # references, unsplit: one program per output tile
        Invalid.make(dev, 128, 128, 64, 8, 8, 4, **tma),
        Invalid.make(dev, 128, 128, 64, 8, 4, 4, **ws),
        # the TMA kernels' own K-sharing (no split_k there, but these schedules split K all the same):
        # the TMA persistent kernel's Stream-K (contiguous shares; the heuristic's sm_90 Stream-K tile) and
        # the warp-specialized kernel's "split tail" (with fewer tiles than SMs: every tile cut into
        # S = min(SMs // tiles, K-steps // 28) equal K-chunks, one program each, fixed up in-kernel)
        Invalid.make(dev, 128, 128, 64, 8, 8, 5, stream_k=True, **tma),
        Invalid.make(dev, 128, 128, 64, 8, 4, 4, stream_k=True, **ws),
        Invalid.make(dev, 128, 128, 64, 8, 4, 6, stream_k=True, **ws),
        Invalid.make(dev, 64, 128, 64, 8, 4, 6, stream_k=True, **ws),
    ]
    seen = {default_cfg}
    uniq = []
    for c in out:
        if c is not None and c not in seen:
            seen.add(c)
            uniq.append(c)
    return uniq


def smoke_configs(dev):
    cfgs = [
        Invalid.make(dev, 32, 32, 64, 8, 4, 3, split_k=4, split_k_inline=True),
        Invalid.make(dev, 32, 32, 64, 8, 4, 3, split_k=4, split_k_inline=False),
        Invalid.make(dev, 32, 32, 64, 8, 4, 3, stream_k=True),
        Invalid.make(dev, 64, 64, 64, 8, 4, 3, kernel="tma_persistent"),
        Invalid.make(dev, 64, 64, 64, 8, 4, 2, kernel="gluon_ws"),
        Invalid.make(dev, 64, 64, 64, 8, 4, 2, kernel="tma_persistent", stream_k=True),
        Invalid.make(dev, 32, 32, 64, 8, 4, 3, split_k=128),  # invalid on purpose: counted, skipped
    ]
    return [c for c in cfgs if c is not None]


def operand(rows, cols, layout, device, empty=False):
    """(rows x cols) bf16: row-major for "N", else the transpose of a row-major (cols x rows)."""
    make = torch.empty if empty else torch.randn
    if layout == "N":
        return make(rows, cols, device=device, dtype=DTYPE)
    return make(cols, rows, device=device, dtype=DTYPE).t()


def meta_operands(m, n, k, layout):
    return operand(m, k, layout[0], "meta", True), operand(k, n, layout[1], "meta", True)


def default_plan(m, n, k, layout, dev):
    a, b = meta_operands(m, n, k, layout)
    return tritongemm.explain(a, b, device=dev)


def short(cfg) -> str:
    """A compact label: tile, warps, stages and the decomposition / kernel."""
    if cfg is None:
        return "default"
    s = f"{cfg.block_m}x{cfg.block_n}x{cfg.block_k} w{cfg.num_warps} s{cfg.num_stages}"
    if cfg.split_k > 1:
        s += f" sk{cfg.split_k}" + ("i" if cfg.split_k_inline else "r")
    s += {"gluon_ws": " ws", "tma_persistent": " tma-pers", "tma": " tma"}.get(cfg.kernel, "")
    if cfg.stream_k:
        s += " split-tail" if cfg.kernel == "gluon_ws" else " streamk"
    return s


# ----------------------------------------------------------------------------------------------
# Pre-compilation in worker processes
# ----------------------------------------------------------------------------------------------
def _fatal(exc: BaseException) -> bool:
    """Did a CUDA error leave this process's context unusable?"""
    if not torch.cuda.is_available():
        return False
    text = str(exc).lower()
    if "illegal" in text or "unspecified launch failure" in text or "misaligned address" in text:
        return True
    try:
        torch.cuda.synchronize()
        return False
    except Exception:
        return True


#: A worker's state across its tasks: operands per (shape, layout), and whether its context broke.
_WORKER = dict(operands={}, dead=False)
#: Where workers run the kernels: the GPU, or (``--smoke --jobs N``) the CPU interpreter.
WORKER_DEVICE = "cpu" if SMOKE else "cuda"


def _compile_worker(group):
    """Run every (shape, layout, config) point of one group -- one compiled kernel -- once: the first
    compiles it, later shapes only what Triton specializes differently.  Returns [(point id, status, msg)]."""
    import tritongemm.launch.native as native

    native.ENABLED = False  # the main process builds the C++ fast-path module: no 14-way race
    results = []
    t0 = time.time()
    for pid, (m, n, k, layout), cfg in group:
        if _WORKER["dead"]:
            results.append((pid, "not_compiled", "an earlier point broke this worker's CUDA context"))
            continue
        key = (m, n, k, layout)
        if key not in _WORKER["operands"]:
            _WORKER["operands"][key] = (
                operand(m, k, layout[0], WORKER_DEVICE, True).zero_(),
                operand(k, n, layout[1], WORKER_DEVICE, True).zero_(),
            )
        a, b = _WORKER["operands"][key]
        try:
            if cfg is None:
                tritongemm.matmul(a, b)
            else:
                tritongemm.matmul(a, b, config=cfg)
            if WORKER_DEVICE == "cuda":
                torch.cuda.synchronize()
            results.append((pid, "ok", ""))
        except Exception as e:
            _WORKER["dead"] = _fatal(e)
            status = "fatal" if _WORKER["dead"] else "error"
            results.append((pid, status, f"{type(e).__name__}: {str(e)[:300]}"))
    return results, time.time() - t0


def precompile(points, jobs: int, shape_key_cfg, timeout_s: float) -> dict:
    """Compile in ``jobs`` processes: points grouped by ``sweep_skinny._compile_key`` (the kernel each
    runs), one task per group, largest first.  Returns {point id: (status, message)}; past ``timeout_s``
    the pool is stopped (what compiled is in Triton's cache; the rest compiles where it is first timed)."""
    groups: dict = {}
    for pid, shape, cfg in points:
        groups.setdefault(_compile_key(shape, shape_key_cfg(shape, cfg)), []).append((pid, shape, cfg))
    tasks = sorted(groups.values(), key=len, reverse=True)
    jobs = max(1, min(jobs, len(tasks)))
    log(f"precompiling {len(tasks)} kernels ({len(points)} points) in {jobs} processes")
    t0 = time.time()
    status = {}
    slow = []
    ctx = mp.get_context("spawn")
    pool = ctx.Pool(jobs)
    try:
        it = pool.imap_unordered(_compile_worker, tasks, chunksize=1)
        for done in range(1, len(tasks) + 1):
            left = timeout_s - (time.time() - t0)
            if left <= 0:
                raise mp.TimeoutError
            part, secs = it.next(timeout=left)
            status.update({pid: (st, msg) for pid, st, msg in part})
            slow.append((secs, part[0][0][1]))
            if done % 10 == 0 or done == len(tasks):
                log(f"  precompiled {done}/{len(tasks)} kernels")
        pool.close()
    except mp.TimeoutError:
        log(
            f"  precompile stopped after {timeout_s:.0f}s: {len(tasks) - len(slow)} kernels compile when timed"
        )
        pool.terminate()
    finally:
        pool.join()
    counts = {}
    for st, _ in status.values():
        counts[st] = counts.get(st, 0) + 1
    log(f"precompiled in {time.time() - t0:.0f}s: {counts}")
    for secs, cfg in sorted(slow, key=lambda x: -x[0])[:3]:
        log(f"  slowest: {secs:.0f}s {short(cfg)}")
    shown = 0
    for st, msg in status.values():
        if st in ("error", "fatal") and shown < 5:
            print(f"  precompile {st}: {msg[:200]}", flush=True)
            shown += 1
    return status


# ----------------------------------------------------------------------------------------------
# Timing
# ----------------------------------------------------------------------------------------------
class Clock:
    """Two timers over the same rotated inputs.

    ``time_ms``: ``triton.testing.do_bench`` median (the project's rule; it zeroes a 256 MB buffer before
    every call, which leaves L2 full of dirty lines whose write-back shares DRAM with the call timed).
    ``stream_ms``: ``calls`` queued behind a GPU sleep (so host launch costs stay off the clock), bracketed
    by one pair of CUDA events, no flush (the rotation already keeps the operands out of L2); the median
    of ``rounds`` batches, per call.  The roofline question reads better from the second."""

    #: host time a queued call may take (tritongemm with a config: ~20-40 us); the sleep covers this many
    HOST_MS_PER_CALL = 0.05

    def __init__(self, smoke: bool, device):
        self.smoke = smoke
        self.device = device
        self.rep_ms = MAX_REP_MS
        self.cycles_per_ms = None if smoke else self._sleep_cycles_per_ms()

    @staticmethod
    def _sleep_cycles_per_ms() -> float:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(1000)
        start.record()
        torch.cuda._sleep(10_000_000)
        end.record()
        end.synchronize()
        return 10_000_000 / start.elapsed_time(end)

    def sync(self):
        if self.device.type == "cuda":
            torch.cuda.synchronize()

    def time_ms(self, fn) -> float:
        if self.smoke:  # the interpreter: one timed call (code paths only)
            t0 = time.perf_counter()
            fn()
            return (time.perf_counter() - t0) * 1e3
        return triton.testing.do_bench(fn, warmup=WARMUP_MS, rep=self.rep_ms, return_mode="median")

    def stream_ms(self, fn, est_ms: float, rounds: int = 5, batch_ms: float = 1.0) -> tuple[float, bool]:
        """(ms per call, whether the host fell behind the GPU in some batch)."""
        if self.smoke:
            return self.time_ms(fn), False
        calls = max(3, min(200, int(batch_ms / max(est_ms, 1e-3))))
        sleep_ms = max(0.3, calls * self.HOST_MS_PER_CALL)
        per_call, host_bound = [], False
        for _ in range(rounds):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda._sleep(int(self.cycles_per_ms * sleep_ms))
            t0 = time.perf_counter()
            start.record()
            for _ in range(calls):
                fn()
            end.record()
            host_bound |= (time.perf_counter() - t0) * 1e3 > sleep_ms
            end.synchronize()
            per_call.append(start.elapsed_time(end) / calls)
        return statistics.median(per_call), host_bound


def smoke_copy_bandwidth(device) -> float:
    n = 1 << 22
    src = torch.empty(n, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)
    t0 = time.perf_counter()
    dst.copy_(src)
    return 2 * n / (time.perf_counter() - t0) * 1e-9


def geomean(xs):
    xs = [x for x in xs if x and x > 0 and math.isfinite(x)]
    return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else float("nan")


def time_shape(shape, cfgs, clock, copy_gbps, sm, pre_status, deadline, shapes_left, stats):
    """Check and time one (shape, layout): cuBLAS, default and every config.  Returns the records."""
    m, n, k, layout = shape
    device = clock.device
    nbytes = (m * k + k * n + m * n) * 2
    flops = 2 * m * n * k
    nsets = 1 if clock.smoke else max(2, min(16, int(ROTATE_BYTES // nbytes) + 1))
    sets = [(operand(m, k, layout[0], device), operand(k, n, layout[1], device)) for _ in range(nsets)]
    a0, b0 = sets[0]
    ref = torch.matmul(a0.float(), b0.float())
    base = dict(m=m, n=n, k=k, layout=layout, dtype="bf16", bytes=nbytes, flops=flops, rotation_sets=nsets)

    # The time this shape may take, and the do_bench window that fits it.
    t_shape = time.time()
    points = len(cfgs) + 4
    share = max(5.0, (deadline - t_shape) / max(shapes_left, 1))
    if not clock.smoke:
        per_point = share / points
        rep = (per_point - stats["overhead_s"]) / stats["gpu_factor"] * 1e3 - WARMUP_MS - STREAM_MS
        clock.rep_ms = max(MIN_REP_MS, min(MAX_REP_MS, rep))

    def cublas_fn(a, b):
        return torch.matmul(a, b)

    cublas_us, cublas_stream_us = [], []

    def time_cublas():
        ms = clock.time_ms(rotating(cublas_fn, sets))
        cublas_us.append(ms * 1e3)
        cublas_stream_us.append(clock.stream_ms(rotating(cublas_fn, sets), ms)[0] * 1e3)

    order = [None] + list(cfgs)  # None: the default
    mid = len(order) // 2 + 1
    records = []
    err_cublas = relative_error(cublas_fn(a0, b0), ref)
    time_cublas()
    n_timed, t_timed = 0, 0.0
    for i, cfg in enumerate(order):
        if i == mid:
            time_cublas()
        label = "default" if cfg is None else cfg.short()
        rec = dict(base, label=label, short=short(cfg))
        pid = (shape, cfg)
        try:
            plan = tritongemm.explain(a0, b0, config=cfg)
            rec.update(kernel=plan.kernel, fallback=plan.fallback, config=plan.config.to_dict())
            if plan.fallback and cfg is not None:
                rec["short"] += f" (ran as {plan.kernel})"
            run_cfg = plan.config
            rec["programs"] = programs_of(m, n, k, run_cfg, sm)
            rec["tiles"] = tiles_of(m, n, run_cfg)
            if cfg is None:
                rec["config_short"] = run_cfg.short()
                rec["why"] = plan.source
        except Exception as e:
            rec.update(status="error", error=f"explain: {type(e).__name__}: {str(e)[:200]}")
            records.append(rec)
            continue
        st, msg = pre_status.get(pid, ("ok", ""))
        if st in ("fatal", "error"):
            rec.update(status="error", error=f"precompile: {msg}")
            records.append(rec)
            continue
        if time.time() - t_shape > 1.3 * share or time.time() > deadline:
            rec.update(status="skipped", error="time budget")
            records.append(rec)
            continue

        def f(a, b, c=cfg):
            return tritongemm.matmul(a, b) if c is None else tritongemm.matmul(a, b, config=c)

        t0 = time.time()
        try:
            out = f(a0, b0)
            clock.sync()
            err = relative_error(out, ref)
            rec["rel_err"] = err
            if not err < TOL:
                rec.update(status="wrong")
                records.append(rec)
                continue
            ms = clock.time_ms(rotating(f, sets))
            try:
                ms_stream, host_bound = clock.stream_ms(rotating(f, sets), ms)
                rec["host_bound"] = host_bound
            except Exception as e:  # the do_bench figure stands
                ms_stream = None
                rec["stream_error"] = f"{type(e).__name__}: {str(e)[:200]}"
                if device.type == "cuda" and _fatal(e):
                    raise
        except Exception as e:
            rec.update(status="error", error=f"{type(e).__name__}: {str(e)[:300]}")
            records.append(rec)
            if device.type == "cuda" and _fatal(e):
                raise
            continue
        dt = time.time() - t0
        n_timed += 1
        t_timed += dt
        us = ms * 1e3
        rec.update(
            status="ok",
            us=us,
            tflops=flops / (us * 1e-6) * 1e-12,
            gbps=nbytes / (us * 1e-6) * 1e-9,
            pct_copy=100 * nbytes / (us * 1e-6) * 1e-9 / copy_gbps,
        )
        if ms_stream is not None:
            us_s = ms_stream * 1e3
            rec.update(
                us_stream=us_s,
                gbps_stream=nbytes / (us_s * 1e-6) * 1e-9,
                pct_copy_stream=100 * nbytes / (us_s * 1e-6) * 1e-9 / copy_gbps,
            )
        records.append(rec)
    time_cublas()
    t_cub = statistics.median(cublas_us)
    t_cub_s = statistics.median(cublas_stream_us)
    for rec in records:
        if rec.get("status") == "ok":
            rec["ratio"] = t_cub / rec["us"]
            rec["cublas_us"] = t_cub
            if rec.get("us_stream"):
                rec["ratio_stream"] = t_cub_s / rec["us_stream"]
                rec["cublas_us_stream"] = t_cub_s
    records.insert(
        0,
        dict(
            base,
            label="cublas",
            short="cublas",
            status="ok",
            us=t_cub,
            us_samples=cublas_us,
            rel_err=err_cublas,
            ratio=1.0,
            tflops=flops / (t_cub * 1e-6) * 1e-12,
            gbps=nbytes / (t_cub * 1e-6) * 1e-9,
            pct_copy=100 * nbytes / (t_cub * 1e-6) * 1e-9 / copy_gbps,
            us_stream=t_cub_s,
            us_stream_samples=cublas_stream_us,
            ratio_stream=1.0,
            gbps_stream=nbytes / (t_cub_s * 1e-6) * 1e-9,
            pct_copy_stream=100 * nbytes / (t_cub_s * 1e-6) * 1e-9 / copy_gbps,
        ),
    )
    if n_timed and not clock.smoke:
        # learn the per-point cost: do_bench's GPU time is about (warmup + rep) x gpu_factor, plus overhead
        per = t_timed / n_timed
        window = (WARMUP_MS + clock.rep_ms + STREAM_MS) / 1e3
        stats["overhead_s"] = max(0.005, min(0.2, per - stats["gpu_factor"] * window))

    return records


# ----------------------------------------------------------------------------------------------
# Summary
# ----------------------------------------------------------------------------------------------
def summarize(records, copy_gbps, sm):
    """The table (best by the do_bench ratio; s- columns: the same rows by the stream timer), geomeans,
    and the best fixed rules (tile + stages + reduction, split to about P programs per SM)."""
    by_shape: dict = {}
    for r in records:
        by_shape.setdefault((r["m"], r["n"], r["k"], r["layout"]), []).append(r)

    def f(x, fmt, width):
        return format(x, fmt) if isinstance(x, (int, float)) and math.isfinite(x) else "-".rjust(width)

    hdr = (
        f"{'shape':<16} {'lay':<3} {'cuBLAS us':>9} {'%copy':>5} {'s%cpy':>5} | {'default us':>10} {'ratio':>5} "
        f"{'s-rat':>5} | {'best config':<30} {'us':>7} {'ratio':>5} {'%copy':>5} {'s-rat':>5} {'s%cpy':>5}"
    )
    lines = [hdr, "-" * len(hdr)]
    d_ratios, b_ratios, d_stream, b_stream, summary = [], [], [], [], []
    for (m, n, k, lay), rs in by_shape.items():
        cub = next(r for r in rs if r["label"] == "cublas")
        dflt = next((r for r in rs if r["label"] == "default" and r.get("status") == "ok"), None) or {}
        ok = [r for r in rs if r["label"] != "cublas" and r.get("status") == "ok"]
        best = max(ok, key=lambda r: r["ratio"]) if ok else {}
        best_s = max((r for r in ok if r.get("ratio_stream")), key=lambda r: r["ratio_stream"], default={})
        d_ratios.append(dflt.get("ratio", float("nan")))
        b_ratios.append(best.get("ratio", float("nan")))
        d_stream.append(dflt.get("ratio_stream", float("nan")))
        b_stream.append(best_s.get("ratio_stream", float("nan")))
        summary.append(
            dict(
                m=m,
                n=n,
                k=k,
                layout=lay,
                cublas_us=cub["us"],
                cublas_pct_copy=cub["pct_copy"],
                cublas_us_stream=cub.get("us_stream"),
                cublas_pct_copy_stream=cub.get("pct_copy_stream"),
                default_config=dflt.get("config_short"),
                default_us=dflt.get("us"),
                default_ratio=dflt.get("ratio"),
                default_ratio_stream=dflt.get("ratio_stream"),
                best=best.get("label"),
                best_us=best.get("us"),
                best_ratio=best.get("ratio"),
                best_pct_copy=best.get("pct_copy"),
                best_ratio_stream=best.get("ratio_stream"),
                best_pct_copy_stream=best.get("pct_copy_stream"),
                best_by_stream=best_s.get("label"),
                best_by_stream_ratio=best_s.get("ratio_stream"),
                best_by_stream_pct_copy=best_s.get("pct_copy_stream"),
            )
        )
        lines.append(
            f"{f'{m}x{n}x{k}':<16} {lay:<3} {cub['us']:9.1f} {f(cub['pct_copy'], '4.0f', 4)}% "
            f"{f(cub.get('pct_copy_stream'), '4.0f', 4)}% | {f(dflt.get('us'), '10.1f', 10)} "
            f"{f(dflt.get('ratio'), '5.2f', 5)} {f(dflt.get('ratio_stream'), '5.2f', 5)} | "
            f"{best.get('short', '-'):<30} {f(best.get('us'), '7.1f', 7)} {f(best.get('ratio'), '5.2f', 5)} "
            f"{f(best.get('pct_copy'), '4.0f', 4)}% {f(best.get('ratio_stream'), '5.2f', 5)} "
            f"{f(best.get('pct_copy_stream'), '4.0f', 4)}%"
        )
    gd, gb, gds, gbs = geomean(d_ratios), geomean(b_ratios), geomean(d_stream), geomean(b_stream)
    hits = sum(1 for r in b_ratios if r >= 1.05)
    hits_s = sum(1 for r in b_stream if r >= 1.05)
    lines.append(
        f"geomean default/cuBLAS {gd:.3f}  best/cuBLAS {gb:.3f}  (best >= 1.05x on {hits}/{len(b_ratios)})"
        f"   [stream timer: default {gds:.3f}, best {gbs:.3f}, >= 1.05x on {hits_s}/{len(b_stream)}]"
    )
    lines.append(f"copy bandwidth {copy_gbps:.0f} GB/s; s- columns: stream timer (no L2 flush), see Clock")

    fam: dict = {}
    for r in records:
        if r.get("status") != "ok" or r["label"] in ("cublas", "default"):
            continue
        c = r.get("config") or {}
        if c.get("split_k", 1) > 1 and c.get("kernel") not in TMA_KERNELS:
            per_sm = r["programs"] / sm
            bucket = 2 ** round(math.log2(max(per_sm, 0.5)))
            name = (
                f"{c['block_m']}x{c['block_n']}x{c['block_k']} w{c['num_warps']} s{c['num_stages']} "
                f"sk{'i' if c['split_k_inline'] else 'r'} ~{bucket}/SM"
            )
        else:
            name = r["short"]
        key = (r["m"], r["n"], r["k"], r["layout"])
        fam.setdefault(name, {})
        fam[name][key] = max(fam[name].get(key, 0.0), r["ratio"])
    full = {name: geomean(v.values()) for name, v in fam.items() if len(v) == len(by_shape)}
    top = sorted(full.items(), key=lambda kv: -kv[1])[:6]
    rules = [dict(rule=name, geomean_ratio=g) for name, g in top]
    if top:  # printed above the table, so that the table and its geomeans are the last lines
        rule_lines = [
            "fixed rules over all shapes (geomean do_bench ratio; sk i/r = in-kernel/second-kernel reduce):"
        ]
        rule_lines += [f"  {g:5.3f}  {name}" for name, g in top]
        lines = rule_lines + [""] + lines
    out = dict(
        shapes=summary,
        geomean_default=gd,
        geomean_best=gb,
        best_ge_1_05=hits,
        geomean_default_stream=gds,
        geomean_best_stream=gbs,
        best_ge_1_05_stream=hits_s,
        rules=rules,
    )
    return lines, out


def env_info(device) -> dict:
    info = dict(torch=torch.__version__, triton=triton.__version__, date=time.strftime("%Y-%m-%d %H:%M:%S"))
    if device.type == "cuda":
        p = torch.cuda.get_device_properties(0)
        info.update(gpu=p.name, sm_count=p.multi_processor_count, cuda=torch.version.cuda)
    else:
        info.update(gpu="cpu (Triton interpreter)", sm_count=132)
    try:
        import subprocess

        info["commit"] = subprocess.run(
            ["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True, text=True
        ).stdout.strip()
    except Exception:
        pass
    return info


def write(path, payload):
    tmp = path + ".tmp"
    with open(tmp, "w") as fh:
        json.dump(payload, fh, indent=1, default=str)
    os.replace(tmp, path)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="CPU interpreter: one tiny shape, few configs")
    parser.add_argument("--out", default=os.environ.get("OUT", "."))
    parser.add_argument("--jobs", type=int, default=min(14, max(1, (os.cpu_count() or 2) - 2)))
    parser.add_argument("--shapes", default="", help="subset, e.g. 256x256x131072,512x512x16384")
    parser.add_argument("--smoke-jobs", type=int, default=0, help="with --smoke: precompile in N CPU workers")
    parser.add_argument(
        "--dry-run", action="store_true", help="list the plan only (no GPU needed: H100 budgets without one)"
    )
    args = parser.parse_args()
    deadline = T_START + BUDGET_S - 12  # keep time for the summary
    smoke = args.smoke
    if smoke:
        if not interpreter_enabled():
            sys.exit("--smoke needs TRITON_INTERPRET=1 in the environment before Python starts")
        device = torch.device("cpu")
    elif args.dry_run and not torch.cuda.is_available():
        device = torch.device("meta")
    else:
        if not torch.cuda.is_available():
            sys.exit("no GPU: run with --smoke (TRITON_INTERPRET=1) on a CPU machine")
        device = torch.device("cuda")
        torch.backends.cuda.matmul.allow_tf32 = False  # the float32 reference in full precision
    import tritongemm.launch.native as native

    if device.type == "cuda":
        native.start()  # built in the background while kernels compile: timing sees the steady state
    else:
        native.ENABLED = False
    dev = named_device("h100") if device.type == "meta" else device_info(device)
    sm = dev.sm_count
    os.makedirs(args.out, exist_ok=True)
    out_path = os.path.join(args.out, "longk_sweep.json")

    shapes = [(32, 32, 1024)] if smoke else SHAPES
    if args.shapes:
        keep = {tuple(int(x) for x in s.split("x")) for s in args.shapes.split(",")}
        shapes = [s for s in shapes if s in keep]
    plan = []
    defaults = {}
    for m, n, k in shapes:
        for lay in LAYOUTS:
            p = default_plan(m, n, k, lay, dev)
            defaults[(m, n, k, lay)] = p.config
            cfgs = smoke_configs(dev) if smoke else configs_for(m, n, k, sm, dev, p.config)
            plan.append(((m, n, k, lay), cfgs))
            log(f"{m}x{n}x{k} {lay}: default {p.kernel} {p.config.short()}; {len(cfgs)} configs")
    n_points = sum(len(c) + 1 for _, c in plan)
    kernels = {_compile_key(sh, defaults[sh] if c is None else c) for sh, cfgs in plan for c in [None] + cfgs}
    log(
        f"{len(plan)} (shape, layout) pairs, {n_points} points to time (+3 cuBLAS timings each); "
        f"{len(kernels)} compiled kernels (before shape specializations); "
        f"{Invalid.count} proposed configs rejected by TileConfig / device budgets {Invalid.reasons or ''}"
    )

    if args.dry_run:
        return 0
    pre_status = {}
    if not smoke or args.smoke_jobs:
        points = [((s, c), s, c) for s, cfgs in plan for c in [None] + cfgs]

        def key_cfg(shape, cfg):
            return defaults[shape] if cfg is None else cfg

        pre_status = precompile(points, args.smoke_jobs or args.jobs, key_cfg, PRECOMPILE_S)
    if not smoke and native.wait(timeout=20):
        log("C++ fast-path module loaded")
    copy_gbps = smoke_copy_bandwidth(device) if smoke else copy_bandwidth()
    log(f"device-to-device copy bandwidth {copy_gbps:.0f} GB/s (read + write)")

    payload = dict(
        env=env_info(device),
        copy_gbps=copy_gbps,
        invalid_configs=Invalid.count,
        invalid_reasons=Invalid.reasons,
        precompile={
            st: sum(1 for s, _ in pre_status.values() if s == st)
            for st in {s for s, _ in pre_status.values()}
        },
        records=[],
    )
    clock = Clock(smoke, device)
    stats = dict(overhead_s=0.03, gpu_factor=1.15)
    for i, (shape, cfgs) in enumerate(plan):
        t0 = time.time()
        try:
            recs = time_shape(shape, cfgs, clock, copy_gbps, sm, pre_status, deadline, len(plan) - i, stats)
        except Exception:
            traceback.print_exc()
            log("CUDA context lost: writing what was measured and stopping")
            break
        payload["records"] += recs
        write(out_path, payload)
        m, n, k, lay = shape
        ok = [r for r in recs if r.get("status") == "ok" and r["label"] != "cublas"]
        best = max(ok, key=lambda r: r["ratio"]) if ok else None
        dflt = next((r for r in ok if r["label"] == "default"), None)
        counts = {}
        for r in recs[1:]:
            counts[r["status"]] = counts.get(r["status"], 0) + 1
        log(
            f"[{i + 1}/{len(plan)}] {m}x{n}x{k} {lay} ({time.time() - t0:.0f}s, rep {clock.rep_ms:.0f}ms): "
            f"cuBLAS {recs[0]['us']:.1f}us ({recs[0]['pct_copy']:.0f}% copy)  "
            + (f"default {dflt['ratio']:.3f}  " if dflt else "default -  ")
            + (
                f"best {best['ratio']:.3f} {best['short']} ({best['pct_copy']:.0f}% copy; "
                f"stream {best.get('ratio_stream', float('nan')):.3f}, {best.get('pct_copy_stream', float('nan')):.0f}%)  "
                if best
                else ""
            )
            + f"{counts}"
        )
    lines, summary = summarize(payload["records"], copy_gbps, sm)
    payload["summary"] = summary
    payload["wall_s"] = time.time() - T_START
    write(out_path, payload)
    print(f"\nwrote {out_path} ({len(payload['records'])} records, {payload['wall_s']:.0f}s)\n", flush=True)
    print("\n".join(lines), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
