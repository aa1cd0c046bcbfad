"""Check and time the warp-specialized Gluon GEMM on a Hopper GPU against cuBLAS (torch.matmul).

    PYTHONPATH=$PWD python tools/gluon_device_check.py [--quick] [--budget-s 330]

For fp16 and bf16, layouts TN (x @ w.T, w (N, K) contiguous) and NN, and a set of
LLM-like and square shapes: every candidate config's output is compared with a
float64 reference (relative error), then the correct ones are timed with
``triton.testing.do_bench`` (median), interleaved with torch.matmul over 3 rounds,
inputs rotated past L2.  Prints the best config per problem, its ratio to cuBLAS
and the geomean; writes every row to ``$OUT/gluon_device_check.csv`` when OUT is set.
A config that fails to compile or launch, or computes a wrong result, is reported
and left out; the run goes on.
"""

from __future__ import annotations

import argparse
import csv
import math
import os
import sys
import time
import traceback
from types import SimpleNamespace

import torch
import triton
import triton.testing

from tritongemm.kernels.gemm_gluon import GLUON_AVAILABLE, GLUON_UNAVAILABLE_REASON
from tritongemm.planning.call import GemmCall
from tritongemm.planning.configs import TileConfig
from tritongemm.testing import format_table, make_matrix, relative_error, rotation_copies

SHAPES = [
    (4096, 4096, 4096),
    (8192, 8192, 8192),
    (512, 4608, 3584),
    (512, 3584, 3584),
    (2048, 4096, 4096),
    (12608, 768, 768),
    (8192, 8192, 128),
    (1664, 1408, 4096),
    (6000, 5120, 5120),
]
DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}
#: Relative error against float64 (fp32 accumulation, output rounded once).
TOLERANCE = {"fp16": 2e-3, "bf16": 1e-2}
#: (name, config): 1 or 2 consumer warpgroups (num_warps 4 / 8); 128x256 needs 2 (128 accumulator
#: registers per thread) and leaves shared memory for 3 slots only.
CONFIGS = [
    ("128x128x64 s4 w4", TileConfig(block_m=128, block_n=128, block_k=64, num_warps=4, num_stages=4)),
    ("128x128x64 s4 w8", TileConfig(block_m=128, block_n=128, block_k=64, num_warps=8, num_stages=4)),
    ("128x256x64 s3 w8", TileConfig(block_m=128, block_n=256, block_k=64, num_warps=8, num_stages=3)),
    ("128x128x64 s3 w4", TileConfig(block_m=128, block_n=128, block_k=64, num_warps=4, num_stages=3)),
    ("64x256x64 s4 w4", TileConfig(block_m=64, block_n=256, block_k=64, num_warps=4, num_stages=4)),
]
EXTRA_SHAPES = [  # --full: more squares and LLM projections (M = 2048 / 6000), short K
    (2048, 2048, 2048),
    (3072, 3072, 3072),
    (6144, 6144, 6144),
    (2048, 14336, 4096),
    (2048, 4096, 14336),
    (6000, 4096, 4096),
    (1024, 5120, 5120),
    (12608, 3072, 768),
    (8192, 8192, 256),
]
ROUNDS = 3


def operands(m, n, k, layout, dtype, copies, gen):
    """``copies`` (a, b) pairs: a (M, K) row-major; b (K, N) row-major (NN) or w.T with w (N, K) (TN)."""
    pairs = []
    for _ in range(copies):
        a = make_matrix(m, k, "N", dtype, "cuda", generator=gen)
        b = make_matrix(k, n, "T" if layout == "TN" else "N", dtype, "cuda", generator=gen)
        pairs.append((a, b))
    return pairs


def bench(step, pairs) -> float:
    """Median ms of ``step(a, b)``, each call on the next operand copy."""
    it = [0]

    def fn():
        a, b = pairs[it[0] % len(pairs)]
        it[0] += 1
        step(a, b)

    return float(triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median"))


def check_problem(dt_name, layout, m, n, k, env) -> tuple[list[dict], dict]:
    """Check every config on one problem, then time the good ones against cuBLAS: (rows, best row)."""
    from tritongemm.launch.gluon import GluonLauncher
    from tritongemm.planning.eligibility import warp_specialized_shared_bytes as shared_bytes

    dtype = DTYPES[dt_name]
    rows = []
    problem = dict(dtype=dt_name, layout=layout, m=m, n=n, k=k)
    set_bytes = (m * k + k * n) * 2
    pairs = operands(m, n, k, layout, dtype, rotation_copies(set_bytes, env.l2_bytes, most=64), env.gen)
    a0, b0 = pairs[0]
    ref = a0.double() @ b0.double()
    out = torch.empty(m, n, dtype=dtype, device="cuda")
    flops = 2.0 * m * n * k
    # Build, check, and keep the configs that are right.
    steps = {}
    print(f"{dt_name} {layout} {m}x{n}x{k}: checking", end="", flush=True)
    for name, cfg in CONFIGS:
        print(f" [{name}]", end="", flush=True)  # a hang shows which config it was
        row = dict(problem, config=name, smem=shared_bytes(cfg))
        try:
            plan = SimpleNamespace(config=cfg, device=env.device)
            launcher = GluonLauncher(plan, env.call, a0, b0, out, out, out, out, False)
            out.fill_(float("nan"))
            launcher(a0, b0, out, out, out, out, 1.0, 0.0)
            torch.cuda.synchronize()
            err = relative_error(out, ref)
            row["rel_err"] = err
            if not err <= TOLERANCE[dt_name]:
                row["status"] = f"WRONG (rel err {err:.3g})"
            else:
                row["status"] = "ok"
                steps[name] = launcher
        except Exception as exc:  # report and go on: one bad config must not end the run
            row["status"] = f"FAIL {type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
            traceback.print_exc(limit=2, file=sys.stdout)
        rows.append(row)
    del ref
    print(flush=True)
    # Interleaved timing rounds: cuBLAS and every good config, best median of the rounds.
    times = {name: [] for name in steps}
    times["cublas"], times["tritongemm"] = [], []
    import tritongemm

    for _ in range(ROUNDS):
        times["cublas"].append(bench(lambda a, b: torch.matmul(a, b, out=out), pairs))
        times["tritongemm"].append(bench(lambda a, b: tritongemm.matmul(a, b, out=out), pairs))
        for name, launcher in steps.items():
            times[name].append(bench(lambda a, b, f=launcher: f(a, b, out, out, out, out, 1.0, 0.0), pairs))
    cublas_tf = flops / (min(times["cublas"]) * 1e-3) / 1e12
    for row in rows[-len(CONFIGS) :]:
        row["cublas_tflops"] = cublas_tf
        if row["config"] in steps:
            row["tflops"] = flops / (min(times[row["config"]]) * 1e-3) / 1e12
            row["ratio"] = row["tflops"] / cublas_tf
    good = [r for r in rows[-len(CONFIGS) :] if "tflops" in r]
    best = max(good, key=lambda r: r["tflops"]) if good else dict(problem, config="none", ratio=None)
    tg_tf = flops / (min(times["tritongemm"]) * 1e-3) / 1e12
    best = dict(
        best, shape=f"{m}x{n}x{k}", cublas_tflops=cublas_tf, tg_tflops=tg_tf, tg_ratio=tg_tf / cublas_tf
    )
    print(
        f"[{time.perf_counter() - env.start:5.0f}s] {dt_name} {layout} {m}x{n}x{k}: cuBLAS {cublas_tf:.0f} "
        f"TFLOP/s, tritongemm now {tg_tf:.0f}; "
        + ", ".join(
            f"{r['config']}: {r['tflops']:.0f}" if "tflops" in r else f"{r['config']}: {r['status']}"
            for r in rows[-len(CONFIGS) :]
        ),
        flush=True,
    )
    return rows, best


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="first 3 shapes, TN only")
    parser.add_argument("--full", action="store_true", help="also EXTRA_SHAPES")
    parser.add_argument("--dtype", choices=sorted(DTYPES), action="append", help="only these (repeatable)")
    parser.add_argument("--budget-s", type=float, default=330, help="stop timing new problems after this")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("needs a CUDA GPU")
        return 2
    if not GLUON_AVAILABLE:
        print(f"Gluon unavailable: {GLUON_UNAVAILABLE_REASON}")
        return 2
    start = time.perf_counter()
    props = torch.cuda.get_device_properties(0)
    print(
        f"{props.name}, {props.multi_processor_count} SMs, sm_{props.major}{props.minor}; "
        f"torch {torch.__version__}, triton {triton.__version__}",
        flush=True,
    )
    if (props.major, props.minor) != (9, 0):
        print("the Gluon kernel targets sm_90 only")
        return 2
    env = SimpleNamespace(
        start=start,
        device=SimpleNamespace(sm_count=props.multi_processor_count),
        l2_bytes=getattr(props, "L2_cache_size", 50 * 2**20),
        call=GemmCall(),
        gen=torch.Generator(device="cuda").manual_seed(0),
    )
    shapes = SHAPES[:3] if args.quick else SHAPES + (EXTRA_SHAPES if args.full else [])
    layouts = ["TN"] if args.quick else ["TN", "NN"]
    rows, best_rows = [], []
    for dt_name in args.dtype or DTYPES:
        for layout in layouts:
            for m, n, k in shapes:
                if time.perf_counter() - start > args.budget_s:
                    print(f"budget of {args.budget_s:.0f} s spent: skipping {dt_name} {layout} {m}x{n}x{k}")
                    continue
                rows_p, best = check_problem(dt_name, layout, m, n, k, env)
                rows += rows_p
                best_rows.append(best)
                torch.cuda.empty_cache()

    print()
    print(
        format_table(
            best_rows,
            [
                ("dtype", "dtype"),
                ("layout", "layout"),
                ("shape", "MxNxK"),
                ("config", "best config"),
                ("tflops", "gluon TFLOP/s"),
                ("cublas_tflops", "cuBLAS TFLOP/s"),
                ("ratio", "ratio"),
                ("tg_ratio", "tritongemm now ratio"),
            ],
        )
    )
    ratios = [r["ratio"] for r in best_rows if r.get("ratio")]
    for dt_name in DTYPES:
        for layout in layouts:
            sub = [
                r["ratio"]
                for r in best_rows
                if r.get("ratio") and (r["dtype"], r["layout"]) == (dt_name, layout)
            ]
            if sub:
                print(f"geomean ratio {dt_name} {layout}: {math.exp(sum(map(math.log, sub)) / len(sub)):.3f}")
    if ratios:
        print(
            f"geomean ratio, all: {math.exp(sum(map(math.log, ratios)) / len(ratios)):.3f} over {len(ratios)}"
        )
    failures = [r for r in rows if r.get("status") != "ok"]
    print(f"{len(failures)} of {len(rows)} config runs failed or were wrong")
    if os.environ.get("OUT"):
        path = os.path.join(os.environ["OUT"], "gluon_device_check.csv")
        fields = ["dtype", "layout", "m", "n", "k", "config", "smem", "status", "rel_err", "tflops"]
        fields += ["cublas_tflops", "ratio"]
        with open(path, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=fields, extrasaction="ignore")
            w.writeheader()
            w.writerows(rows)
        best_fields = ["dtype", "layout", "m", "n", "k", "config", "tflops", "cublas_tflops", "ratio"]
        with open(os.path.join(os.environ["OUT"], "gluon_best.csv"), "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=best_fields + ["tg_tflops", "tg_ratio"], extrasaction="ignore")
            w.writeheader()
            w.writerows(best_rows)
        print(f"wrote {path}")
    print(f"done in {time.perf_counter() - start:.0f} s")
    return 1 if any(r["status"].startswith("WRONG") for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
