"""Host time of a tensor-parallel Linear pair on DTensors, stock against tritongemm (one GPU, a one-rank mesh).

    python benchmarks/tp_host.py        # OUT=<folder> for the full report (tp_probe.txt), else ./

A column-parallel (4096 -> 14336) then row-parallel (14336 -> 4096) Linear pair at M = 16 tokens, bf16,
so the GPU work is small and the host's is what shows.  Variants: ``stock_tp`` and ``tg_tp``
(``parallelize_module``, tritongemm's after ``nn.convert``), ``stock_local`` and ``tg_local`` (the same
layers on plain tensors), ``probe_tp`` (DTensor running a trivial Python custom op: DTensor's own cost
for a custom op).  Each is checked against ``stock_local`` first; then host microseconds per pair
(500 calls queued without a sync, median of 3 interleaved rounds), the CUDA kernels each ran, and
cProfile / torch.profiler tables of ``tg_tp`` and ``stock_tp``.
"""

from __future__ import annotations

import copy
import cProfile
import io
import os
import pstats
import statistics
import sys
import time
import traceback
from collections import Counter

import torch
import torch.nn as nn

OUT = os.environ.get("OUT", ".")
LOG: list[str] = []


def log(*args) -> None:
    s = " ".join(str(a) for a in args)
    LOG.append(s)
    print(s, flush=True)


def section(title: str) -> None:
    log("")
    log("=" * 100)
    log(title)
    log("=" * 100)


def flush_log() -> None:
    try:
        with open(os.path.join(OUT, "tp_probe.txt"), "w") as f:
            f.write("\n".join(LOG) + "\n")
    except Exception as e:  # noqa: BLE001
        print(f"could not write tp_probe.txt: {e}", flush=True)


# ----------------------------------------------------------------------------------
# pstats with shortened paths (keep "torch/..." and "tritongemm/...", else basename)
# ----------------------------------------------------------------------------------
def _short(path: str) -> str:
    for marker in ("/tritongemm/", "/torch/", "/triton/"):
        i = path.rfind(marker)
        if i >= 0:
            return path[i + 1 :]
    return os.path.basename(path)


def _shorten_stats(st: pstats.Stats) -> pstats.Stats:
    def fs(func):
        fn, ln, name = func
        return (_short(fn), ln, name)

    old = st.stats
    st.stats = new = {}
    for func, (cc, nc, tt, ct, callers) in old.items():
        nf = fs(func)
        ncallers = {fs(f2): c for f2, c in callers.items()}
        if nf in new:
            new[nf] = pstats.add_func_stats(new[nf], (cc, nc, tt, ct, ncallers))
        else:
            new[nf] = (cc, nc, tt, ct, ncallers)
    st.top_level = {fs(f) for f in st.top_level}
    st.fcn_list = None
    st.all_callees = None
    return st


pstats.f8 = lambda v: f"{v:10.6f}"  # seconds, to the microsecond


def cprofile_report(name: str, fn, x, calls: int, top: int) -> None:
    section(f"cProfile: {name}, {calls} calls (no_grad)")
    pr = cProfile.Profile()
    with torch.no_grad():
        torch.cuda.synchronize()
        pr.enable()
        for _ in range(calls):
            fn(x)
        pr.disable()
        torch.cuda.synchronize()
    for key in ("tottime", "cumtime"):
        s = io.StringIO()
        st = _shorten_stats(pstats.Stats(pr, stream=s))
        st.sort_stats(key).print_stats(top)
        log(f"--- {name}: top {top} by {key} ---")
        for line in s.getvalue().splitlines():
            if line.strip():
                log(line)


def torchprof_cpu_report(name: str, fn, x, calls: int, rows: int) -> None:
    from torch.profiler import ProfilerActivity, profile

    section(f"torch.profiler CPU-only: {name}, {calls} calls (no_grad), sort self_cpu_time_total")
    with torch.no_grad():
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(calls):
                fn(x)
        torch.cuda.synchronize()
    ka = prof.key_averages()
    try:
        tbl = ka.table(sort_by="self_cpu_time_total", row_limit=rows, max_name_column_width=90)
    except TypeError:
        tbl = ka.table(sort_by="self_cpu_time_total", row_limit=rows)
    for line in tbl.splitlines():
        log(line)


def kernel_report(name: str, fn, x, calls: int = 5) -> None:
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    section(f"CUDA kernels: {name}, {calls} calls (no_grad)")
    with torch.no_grad():
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(calls):
                fn(x)
            torch.cuda.synchronize()
    rows = []
    for e in prof.key_averages():
        dt = getattr(e, "device_type", None)
        if dt == DeviceType.CUDA:
            t = getattr(e, "self_device_time_total", None)
            if t is None:
                t = getattr(e, "self_cuda_time_total", 0)
            rows.append((e.count, t, e.key))
    if not rows:
        log("  (no CUDA-device events found in key_averages)")
    for count, t, key in sorted(rows, key=lambda r: -r[1]):
        log(f"  count={count:4d}  self_dev_us_total={t:10.1f}  {key[:160]}")


# ----------------------------------------------------------------------------------
def main() -> None:
    import torch.distributed as dist
    import tritongemm.nn
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Partial, Replicate, Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    import tritongemm

    section("environment")
    log("python", sys.version.split()[0], "| torch", torch.__version__, "| cuda", torch.version.cuda)
    try:
        import triton

        log("triton", triton.__version__)
    except Exception as e:  # noqa: BLE001
        log("triton import failed:", e)
    log("tritongemm", getattr(tritongemm, "__version__", "?"), "from", tritongemm.__file__)

    dist.init_process_group("nccl", init_method="tcp://127.0.0.1:29531", rank=0, world_size=1)
    torch.cuda.set_device(0)
    log("gpu", torch.cuda.get_device_name(0))
    mesh = init_device_mesh("cuda", (1,))
    log("mesh", mesh)

    class Pair(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.up = nn.Linear(4096, 14336, bias=False)
            self.down = nn.Linear(14336, 4096, bias=False)

        def forward(self, x):
            return self.down(self.up(x))

    torch.manual_seed(0)
    base = Pair().to(device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        base.up.weight.normal_(0, 4096**-0.5)
        base.down.weight.normal_(0, 14336**-0.5)

    plan = {"up": ColwiseParallel(), "down": RowwiseParallel()}
    stock_tp = parallelize_module(copy.deepcopy(base), mesh, plan)
    tg_tp = parallelize_module(
        tritongemm.nn.convert(copy.deepcopy(base)), mesh, {"up": ColwiseParallel(), "down": RowwiseParallel()}
    )
    stock_local = copy.deepcopy(base)
    tg_local = tritongemm.nn.convert(copy.deepcopy(base))
    log("tg_tp:", tg_tp)
    log(
        "tg_tp.up.weight type:",
        type(tg_tp.up.weight).__name__,
        "placements",
        getattr(tg_tp.up.weight, "placements", None),
        "| down placements",
        getattr(tg_tp.down.weight, "placements", None),
    )

    variants = {"stock_tp": stock_tp, "tg_tp": tg_tp, "stock_local": stock_local, "tg_local": tg_local}

    # --- probe_tp: DTensor + a trivial Python custom op with a register_sharding rule ---
    probe_note = ""
    try:
        from torch.distributed.tensor.experimental import register_sharding

        @torch.library.custom_op("probe::mm", mutates_args=())
        def probe_mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
            return a @ b

        @probe_mm.register_fake
        def _probe_mm_fake(a, b):
            return a.new_empty((a.shape[0], b.shape[1]))

        @register_sharding(torch.ops.probe.mm.default)
        def _probe_mm_sharding(a, b):
            return [
                ([Replicate()], [Replicate(), Replicate()]),
                ([Shard(0)], [Shard(0), Replicate()]),
                ([Shard(1)], [Replicate(), Shard(1)]),
                ([Partial()], [Shard(1), Shard(0)]),
            ]

        class ProbePair(nn.Module):
            """x (plain) -> DTensor Replicate -> probe.mm(x, up.W^T) [Shard(1)] -> probe.mm(h, down.W^T) [Partial]
            -> redistribute Replicate -> to_local.  Uses stock_tp's DTensor weights."""

            def __init__(self, src) -> None:
                super().__init__()
                self.src = [src]  # not a submodule: no hooks of stock_tp run

            def forward(self, x):
                src = self.src[0]
                xd = DTensor.from_local(x, mesh, [Replicate()], run_check=False)
                h = probe_mm(xd, src.up.weight.t())
                y = probe_mm(h, src.down.weight.t())
                return y.redistribute(mesh, [Replicate()]).to_local()

        variants["probe_tp"] = ProbePair(stock_tp)
    except Exception as e:  # noqa: BLE001
        probe_note = f"probe_tp dropped: {type(e).__name__}: {e}"
        log(probe_note)
        log(traceback.format_exc())

    torch.manual_seed(1)
    x = torch.randn(16, 4096, device="cuda", dtype=torch.bfloat16)

    # --- correctness ---
    section("errors vs stock_local (rel = ||out-ref|| / ||ref||, must be < 2e-2)")
    errs: dict[str, str] = {}
    with torch.no_grad():
        ref = stock_local(x).float()
        for name, mod in variants.items():
            try:
                t0 = time.perf_counter()
                out = mod(x)
                torch.cuda.synchronize()
                first_ms = (time.perf_counter() - t0) * 1e3
                if isinstance(out, DTensor):
                    out = out.full_tensor()
                rel = ((out.float() - ref).norm() / ref.norm()).item()
                ok = rel < 2e-2
                errs[name] = f"{rel:.3e}" + ("" if ok else " FAIL")
                log(
                    f"  {name:12s} rel_err={rel:.3e} {'OK' if ok else 'FAIL'}  type={type(out).__name__} "
                    f"shape={tuple(out.shape)} dtype={out.dtype}  (first call {first_ms:.1f} ms)"
                )
            except Exception as e:  # noqa: BLE001
                errs[name] = f"ERROR {type(e).__name__}"
                log(f"  {name:12s} ERROR {type(e).__name__}: {e}")
                log(traceback.format_exc())
    broken = [n for n, v in errs.items() if v.startswith("ERROR")]
    for n in broken:
        variants.pop(n)

    # --- kernels ---
    for name in ("tg_tp", "tg_local", "stock_tp"):
        if name in variants:
            try:
                kernel_report(name, variants[name], x)
            except Exception as e:  # noqa: BLE001
                log(f"kernel_report({name}) failed: {type(e).__name__}: {e}")
    section("fallback counters")
    log("  tritongemm.nn.Linear.fallbacks (class):", dict(tritongemm.nn.Linear.fallbacks))
    for name in ("tg_tp", "tg_local"):
        if name in variants:
            for sub in ("up", "down"):
                m = getattr(variants[name], sub)
                log(
                    f"  {name}.{sub}: {type(m).__name__} fallbacks={dict(getattr(m, 'fallbacks', Counter()))}"
                )
    try:
        log("  fallback_summary(tg_tp):", tritongemm.nn.fallback_summary(tg_tp))
    except Exception as e:  # noqa: BLE001
        log("  fallback_summary failed:", e)

    # --- host time ---
    def host_time(mod, n=500, warm=50):
        for _ in range(warm):
            mod(x)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(n):
            y = mod(x)  # noqa: F841
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        t2 = time.perf_counter()
        return (t1 - t0) / n * 1e6, (t2 - t0) / n * 1e6

    section("host us per pair (500 calls, no sync inside; 3 interleaved rounds); wall = incl. final sync")
    host: dict[str, list[float]] = {n: [] for n in variants}
    wall: dict[str, list[float]] = {n: [] for n in variants}
    with torch.no_grad():
        for r in range(3):
            for name, mod in variants.items():
                h, w = host_time(mod)
                host[name].append(h)
                wall[name].append(w)
                log(f"  no_grad round {r}: {name:12s} host {h:8.1f} us   wall {w:8.1f} us")
    hostg: dict[str, list[float]] = {}
    wallg: dict[str, list[float]] = {}
    gvars = [n for n in ("stock_tp", "tg_tp") if n in variants]
    x.requires_grad_(False)
    log("  grad-enabled: weights requires_grad =", {n: variants[n].up.weight.requires_grad for n in gvars})
    for r in range(3):
        for name in gvars:
            h, w = host_time(variants[name])
            hostg.setdefault(name, []).append(h)
            wallg.setdefault(name, []).append(w)
            log(f"  grad    round {r}: {name:12s} host {h:8.1f} us   wall {w:8.1f} us")
    log("")
    log("  medians (no_grad): " + ", ".join(f"{n}={statistics.median(v):.1f}" for n, v in host.items()))
    log("  medians (grad):    " + ", ".join(f"{n}={statistics.median(v):.1f}" for n, v in hostg.items()))

    # --- attribution ---
    for name, calls_cp, top in (("tg_tp", 200, 40), ("stock_tp", 200, 25)):
        if name not in variants:
            continue
        try:
            cprofile_report(name, variants[name], x, calls_cp, top)
        except Exception as e:  # noqa: BLE001
            log(f"cProfile({name}) failed: {type(e).__name__}: {e}")
        try:
            torchprof_cpu_report(name, variants[name], x, 50, top)
        except Exception as e:  # noqa: BLE001
            log(f"torch.profiler({name}) failed: {type(e).__name__}: {e}")
    if "probe_tp" in variants:
        try:
            cprofile_report("probe_tp", variants["probe_tp"], x, 200, 25)
        except Exception as e:  # noqa: BLE001
            log(f"cProfile(probe_tp) failed: {type(e).__name__}: {e}")

    # --- final table ---
    section("FINAL TABLE (median of 3 rounds; host us per pair = enqueue time per call, no sync)")
    if probe_note:
        log("  " + probe_note)
    log(
        f"  {'variant':12s} {'host_us(no_grad)':>17s} {'wall_us(no_grad)':>17s} {'host_us(grad)':>14s}  rel_err"
    )
    for name in list(errs):
        hn = f"{statistics.median(host[name]):.1f}" if name in host else "-"
        wn = f"{statistics.median(wall[name]):.1f}" if name in wall else "-"
        hg = f"{statistics.median(hostg[name]):.1f}" if name in hostg else "-"
        log(f"  {name:12s} {hn:>17s} {wn:>17s} {hg:>14s}  {errs[name]}")


if __name__ == "__main__":
    try:
        main()
    except Exception:  # noqa: BLE001
        log("FATAL:\n" + traceback.format_exc())
    finally:
        flush_log()
        try:
            import torch.distributed as dist

            if dist.is_initialized():
                dist.destroy_process_group()
        except Exception:  # noqa: BLE001
            pass
