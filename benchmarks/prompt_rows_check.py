"""Dev check (GPU): the prompt-rows rule against the heuristic without it, and cuBLAS.

    python -m benchmarks.prompt_rows_check [M,M,...]

For M in 24/32/48/64/80/96/128 rows (default) over 17 N x K (the small Llama's and
GPT-2's projections, and the Llama-3 8B/70B decode linears), bf16 and fp16,
``F.linear``'s layout (NT): cuBLAS, the heuristic's config with the rule
switched off (the skinny rule's, or the menu's tiles from 65 rows) and with it,
each checked against a float64 product, then timed in three interleaved
rounds.  Timing is GPU time only: one CUDA graph per function replays one
call on each of enough input sets to cover 3x L2 (so every call reads cold
operands), median of 5 replays.  These kernels take 6-20 us, less than a
call's host time, so ``do_bench``'s per-call events would time the host
(a first run this way read cuBLAS at 6.9 us in one process and 31.6 in the
next, for the same shape).  Writes
``prompt_rows_check.json`` under ``$OUT`` (or the working directory) and
prints geomeans per dtype and M.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time

import torch

import tritongemm
from tritongemm.device import device_info
from tritongemm.planning import heuristics
from tritongemm.planning.problem import GemmProblem

from .sweep_skinny import PROMPT_NK

# The prompt sweep's shapes, then the Llama-3 8B/70B decode linears.
NK = [
    *PROMPT_NK,
    (6144, 4096),
    (14336, 4096),
    (28672, 4096),
    (4096, 14336),
    (8192, 8192),
    (57344, 8192),
    (8192, 28672),
]
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def config_without_rule(problem, info):
    """What the heuristic chooses with the prompt-rows rule switched off (the skinny rule, or the menu's tiles)."""
    rows = heuristics.few_rows.PROMPT_ROWS
    heuristics.few_rows.PROMPT_ROWS = (1, 0)
    try:
        return heuristics.heuristic_config(problem, info)
    finally:
        heuristics.few_rows.PROMPT_ROWS = rows


def graph_us(f, sets, replays: int = 5) -> float:
    """Median GPU microseconds of one call of ``f``: a CUDA graph of one call per input set."""
    for args in sets[:2]:
        f(*args)  # compile and warm before capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for args in sets:
            f(*args)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(replays + 1):
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / len(sets))
    return sorted(times[1:])[replays // 2]


def geomean(values) -> float:
    values = list(values)
    return math.exp(sum(map(math.log, values)) / len(values))


def main() -> int:
    rows_m = [int(x) for x in sys.argv[1].split(",")] if len(sys.argv) > 1 else [24, 32, 48, 64, 80, 96, 128]
    dev = torch.device("cuda")
    info = device_info(dev)
    l2 = torch.cuda.get_device_properties(dev).L2_cache_size
    rows, t0 = [], time.time()
    for dname, dt in DTYPES.items():
        for m in rows_m:
            for n, k in NK:
                problem = GemmProblem(m, n, k, dtype=str(dt).split(".")[1], layout="NT")
                new, old = heuristics.heuristic_config(problem, info), config_without_rule(problem, info)
                nsets = max(2, min(256, math.ceil(3 * l2 / ((m * k + k * n + m * n) * 2))))
                sets = [
                    (torch.randn(m, k, device=dev, dtype=dt), torch.randn(n, k, device=dev, dtype=dt).mT)
                    for _ in range(nsets)
                ]
                ref = sets[0][0].double() @ sets[0][1].double()
                fns = {
                    "cublas": torch.matmul,
                    "old": lambda a, b, c=old: tritongemm.matmul(a, b, config=c),
                    "new": tritongemm.matmul,
                }
                errors = {}
                for name, f in fns.items():
                    out = f(*sets[0]).double()
                    errors[name] = ((out - ref).norm() / ref.norm()).item()
                    if not errors[name] < 2e-2:
                        raise AssertionError(f"{name} {m}x{n}x{k} {dname}: relative error {errors[name]:.3g}")
                times = {name: [] for name in fns}
                for _ in range(3):
                    for name, f in fns.items():
                        times[name].append(graph_us(f, sets))
                us = {name: sorted(t)[1] for name, t in times.items()}
                row = dict(dtype=dname, m=m, n=n, k=k, old=old.short(), new=new.short(), errors=errors)
                row.update({f"{name}_us": t for name, t in us.items()})
                row.update(old_ratio=us["cublas"] / us["old"], new_ratio=us["cublas"] / us["new"])
                rows.append(row)
                print(
                    f"[{time.time() - t0:4.0f}s] {dname} {m}x{n}x{k}: cuBLAS {us['cublas']:.1f} us, "
                    f"without the rule {row['old_ratio']:.3f} ({old.short()}), now {row['new_ratio']:.3f} ({new.short()})",
                    flush=True,
                )
                del sets
    with open(os.path.join(os.environ.get("OUT", "."), "prompt_rows_check.json"), "w") as f:
        json.dump(rows, f, indent=1)
    print("\ngeomean of cuBLAS time / ours")
    for dname in DTYPES:
        for m in [*rows_m, "all"]:
            sub = [r for r in rows if r["dtype"] == dname and m in (r["m"], "all")]
            worse = sum(r["new_ratio"] < 0.97 * r["old_ratio"] for r in sub)
            print(
                f"{dname} M={m}: without the rule {geomean(r['old_ratio'] for r in sub):.3f}, "
                f"now {geomean(r['new_ratio'] for r in sub):.3f} ({len(sub)} shapes, {worse} over 3% slower)"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
