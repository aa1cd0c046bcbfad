"""fp8 GEMMs with few rows (M = 16-512): which tile and split of K beats ``torch._scaled_mm``?

With few rows an fp8 GEMM is bound by reading B once, so what counts is how many SMs stream it
and how many bytes each keeps in flight.  This times, per problem, the pointer kernel over a menu
of narrow tiles, K steps and split-K factors (slices reduced in the kernel by the last to arrive),
the heuristic's own choice (``scaled_mm`` without a config) and ``torch._scaled_mm``, in two recipes:
rowwise scales with precise sums and tensorwise scales with fast accumulation.

Run from the repository root on the GPU machine (about 5 minutes):

    python -m benchmarks.sweep_fp8_rows --out DIR        # DIR/fp8_rows_sweep.json and .txt
    TRITON_INTERPRET=1 python -m benchmarks.sweep_fp8_rows --smoke   # CPU: code paths only

Method: every config's output is first compared with the float64 product of the dequantized
operands (relative Frobenius error under 3e-2, else "wrong", not timed); kernels are compiled by a
first call before any timing; then ``triton.testing.do_bench`` medians with the inputs rotated over
copies totalling more than twice the L2, in ``ROUNDS`` rounds that interleave every config with
torch (the order reversed every other round), each point the median of its rounds.  ``ratio`` is
torch's time / ours (> 1: faster than torch); ``gbps`` counts A, B read and C (bf16) written once.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import statistics
import sys
import time

import torch
import triton

import tritongemm
from tritongemm import TileConfig
from tritongemm.planning.configs import ConfigError
from tritongemm.testing import relative_error

from . import fp8
from .gpu_check import rotating

OUT = fp8.OUT_DTYPE
TOKENS = (16, 32, 64, 128, 256, 512)
#: (N, K): Llama-3-8B attention, MLP up and down; a 5120-wide model; Qwen2.5-7B's MLP up.
WEIGHTS = ((4096, 4096), (14336, 4096), (4096, 14336), (5120, 5120), (18944, 3584))
#: (block_n, block_k, stages); block_m is the rows rounded up to a power of two (16-64, or 64 and 128).
TILES = ((32, 256, 4), (64, 256, 4), (64, 128, 6), (128, 128, 4), (128, 256, 3), (64, 512, 3))
SPLITS = (1, 2, 3, 4, 6, 8, 12, 16)
RECIPES = (("rowwise", False), ("tensorwise", True))
ROUNDS = 3
TOL = 3e-2
SMEM_CAP = 220 * 1024
BUDGET_S = float(os.environ.get("SWEEP_BUDGET_S", "480"))
T0 = time.time()


def log(msg: str) -> None:
    print(f"[{time.time() - T0:6.1f}s] {msg}", flush=True)


def row_blocks(m: int) -> list[int]:
    if m <= 64:
        return [max(16, 1 << (m - 1).bit_length())]
    return [64, 128]


def configs_for(m: int, n: int, k: int, sm: int) -> list[TileConfig]:
    """The pointer kernel's candidates: each tile unsplit, and split to about one and two waves."""
    out = []
    for bm in row_blocks(m):
        for bn, bk, stages in TILES:
            if (bm + bn) * bk * stages > SMEM_CAP:
                continue
            tiles = -(-m // bm) * -(-n // bn)
            k_tiles = -(-k // bk)
            splits = {1}
            fits = [s for s in SPLITS if k_tiles // s >= 2] or [1]
            for target in (sm, 2 * sm):
                splits.add(min(fits, key=lambda s: abs(tiles * s - target)))
            for s in sorted(splits):
                try:
                    out.append(
                        TileConfig(
                            bm, bn, bk, 8, 8 if bm == 128 else 4, stages, split_k=s, split_k_inline=s > 1
                        )
                    )
                except ConfigError:
                    pass
    return out


def inputs(m, n, k, scaling, dev, copies):
    """The fp8 suite's operands and scales (``fp8.make_inputs``) as (a, b, scale_a, scale_b) tuples."""
    case = fp8.Fp8Case("sweep", m, n, k)
    return [(s.a, s.b, *s.scales[scaling]) for s in fp8.make_inputs(case, torch.device(dev), copies)]


def reference(a, b, sa, sb):
    """The float64 product of the dequantized operands, as the fp8 suite's gate computes it."""
    return fp8.scaled_reference(a.double() @ b.double(), sa, sb)


def _compile_worker(jobs) -> int:
    """Build each job's kernel by one call on small random operands of the job's shape."""
    done = 0
    for m, n, k, scaling, fast, cfg in jobs:
        a, b, sa, sb = inputs(m, n, k, scaling, "cuda", 1)[0]
        try:
            tritongemm.scaled_mm(a, b, sa, sb, out_dtype=OUT, use_fast_accum=fast, config=cfg)
            done += 1
        except Exception:  # noqa: BLE001 (the timing process records the error)
            pass
    torch.cuda.synchronize()
    return done


def precompile(problems, sm: int, workers: int) -> None:
    """Compile every kernel the sweep runs in a pool of processes (Triton's disk cache keeps them)."""
    import multiprocessing as mp

    jobs = {}
    for m, n, k in problems:
        for scaling, fast in RECIPES:
            for cfg in configs_for(m, n, k, sm):
                key = (cfg.block_m, cfg.block_n, cfg.block_k, cfg.num_warps, cfg.num_stages, cfg.split_k > 1,
                       scaling, fast)  # fmt: skip
                jobs.setdefault(key, (m, n, k, scaling, fast, cfg))
    chunks = [list(jobs.values())[i::workers] for i in range(workers)]
    with mp.get_context("spawn").Pool(workers) as pool:
        built = sum(pool.map(_compile_worker, chunks))
    log(f"precompiled {built} of {len(jobs)} kernels in {workers} processes")


def measure(m, n, k, scaling, fast, dev, sm, l2, smoke) -> list[dict]:
    """One problem in one recipe: every candidate checked, then timed in interleaved rounds with torch."""
    copies = 1 if smoke else max(2, math.ceil(2 * l2 / (m * k + n * k)))
    sets = inputs(m, n, k, scaling, dev, copies)
    refs = (reference(*sets[0]), reference(*sets[-1]))
    cands = {"default": None, **{c.short(): c for c in configs_for(m, n, k, sm)}}
    fns, records = {}, []
    base = dict(m=m, n=n, k=k, scaling=scaling, fast_accum=fast)
    for name, cfg in cands.items():
        fn = functools.partial(_ours, fast=fast, config=cfg)
        rec = dict(base, impl=name)
        records.append(rec)
        try:
            rec["rel_err"] = max(
                relative_error(fn(*sets[0]), refs[0]), relative_error(fn(*sets[-1]), refs[1])
            )
        except Exception as exc:  # noqa: BLE001 (a config that fails to build is a result)
            rec.update(status="error", message=f"{type(exc).__name__}: {str(exc)[:200]}")
            continue
        if rec["rel_err"] > TOL:
            rec["status"] = "wrong"
            continue
        fns[name] = (fn, rec)
    if dev == "cuda":
        fn = functools.partial(_torch, fast=fast)
        rec = dict(base, impl="torch", rel_err=relative_error(fn(*sets[0]), refs[0]))
        records.append(rec)
        fns["torch"] = (fn, rec)
    times = {name: [] for name in fns}
    names = list(fns)
    for r in range(1 if smoke else ROUNDS):
        for name in names if r % 2 == 0 else names[::-1]:
            run = rotating(fns[name][0], sets)
            if dev == "cuda":
                times[name].append(triton.testing.do_bench(run, warmup=3, rep=8, return_mode="median"))
            else:
                run()
                times[name].append(1.0)
    base = statistics.median(times["torch"]) if "torch" in times else 1.0
    for name, (_, rec) in fns.items():
        ms = statistics.median(times[name])
        rec.update(status="ok", us=ms * 1e3, ratio=base / ms, gbps=(m * k + n * k + 2 * m * n) / ms * 1e-6)
    return records


def _ours(a, b, sa, sb, *, fast, config):
    return tritongemm.scaled_mm(a, b, sa, sb, out_dtype=OUT, use_fast_accum=fast, config=config)


def _torch(a, b, sa, sb, *, fast):
    return torch._scaled_mm(a, b, sa, sb, out_dtype=OUT, use_fast_accum=fast)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default=os.environ.get("OUT", "."))
    p.add_argument("--smoke", action="store_true", help="one tiny problem (the CPU interpreter)")
    p.add_argument("--jobs", type=int, default=14, help="compile processes")
    args = p.parse_args(argv)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    sm = torch.cuda.get_device_properties(0).multi_processor_count if dev == "cuda" else 132
    order = sorted(TOKENS, key=lambda m: (m not in (16, 256), m not in (64, 512), m))  # the suite's first
    problems = [(m, n, k) for m in order for n, k in WEIGHTS]
    if args.smoke:
        problems = [(16, 64, 512)]
    l2 = 50e6 if dev == "cuda" else 1
    if dev == "cuda":
        precompile(problems, sm, args.jobs)
    records = []
    for pi, (m, n, k) in enumerate(problems):
        if time.time() - T0 > BUDGET_S:
            log(f"time budget spent: {len(problems) - pi} problems not run")
            break
        for scaling, fast in RECIPES:
            rows = measure(m, n, k, scaling, fast, dev, sm, l2, args.smoke)
            records += rows
            ok = [r for r in rows if r.get("status") == "ok" and r["impl"] != "torch"]
            best = max(ok, key=lambda r: r["ratio"], default=None)
            dflt = next((r for r in ok if r["impl"] == "default"), None)
            torch_us = next((r["us"] for r in rows if r["impl"] == "torch"), float("nan"))
            log(f"[{pi + 1}/{len(problems)}] {m}x{n}x{k} {scaling}{'+fast' if fast else ''}: torch {torch_us:.1f} us; "
                f"default {dflt['ratio'] if dflt else float('nan'):.2f}; best {best['impl'] if best else '-'} "
                f"{best['ratio'] if best else float('nan'):.2f}")  # fmt: skip
    env = dict(
        gpu=torch.cuda.get_device_name() if dev == "cuda" else "cpu",
        torch=torch.__version__,
        triton=triton.__version__,
        sm=sm,
    )
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "fp8_rows_sweep.json"), "w") as f:
        json.dump(dict(env=env, records=records), f, indent=1)
    lines = [
        "fp8 few-rows sweep (python -m benchmarks.sweep_fp8_rows): tritongemm.scaled_mm with an explicit",
        "pointer-kernel config ('BMxBNxBK g8 wW sS [splitkNi]': split-K reduced in the kernel) or 'default'",
        "(the heuristic's choice when run), against torch._scaled_mm; e4m3 in, bf16 out, b = w.t().",
        "ratio = torch time / ours (> 1: ours faster); do_bench medians, inputs rotated past L2, interleaved",
        f"rounds, outputs checked against float64 first.  {env}",
        "Per (M, N, K, scaling, fast_accum): the default's ratio | the three best.",
    ]
    by = {}
    for r in records:
        by.setdefault((r["m"], r["n"], r["k"], r["scaling"], r["fast_accum"]), []).append(r)
    for key, rs in by.items():
        ok = sorted(
            (r for r in rs if r.get("status") == "ok" and r["impl"] != "torch"), key=lambda r: -r["ratio"]
        )
        dflt = next((r for r in ok if r["impl"] == "default"), None)
        top = ", ".join(f"{r['impl']} {r['ratio']:.2f}" for r in ok[:3])
        lines.append(f"{key}: default {dflt['ratio'] if dflt else float('nan'):.2f} | {top}")
    with open(os.path.join(args.out, "fp8_rows_sweep.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
