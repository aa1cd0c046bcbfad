"""Compile a suite's tritongemm kernels ahead of a timed run, in parallel (GPU).

    python -m benchmarks.warm --suite decode,llm --dtype fp16,bf16 [--jobs 14]

Triton compiles each kernel specialization once per process and keeps it in
its on-disk cache (``~/.triton/cache``).  A timed run compiles serially,
one to two seconds per kernel; this runs every tritongemm implementation of
every case once, spread over ``--jobs`` worker processes, so the timed run
that follows only loads kernels from the cache.  Nothing is timed here.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import sys
import time


def _jobs(suites: list[str], dtypes: str | None):
    from . import suites as S

    out = []
    for name in suites:
        suite = S.SUITES[name]
        for dtype in S.parse_dtypes(dtypes, suite):
            for case in suite.cases():
                out.append((name, case.label, str(dtype).replace("torch.", "")))
    return out


def _worker(jobs) -> int:
    import torch

    from . import harness
    from . import suites as S

    done = 0
    for name, label, dtype_name in jobs:
        suite = S.SUITES[name]
        case = next(c for c in suite.cases() if c.label == label)
        dtype = getattr(torch, dtype_name)
        inputs = harness.make_inputs(case, dtype, torch.device("cuda"), 1)[0]
        for impl in S.implementations(suite, dtype, compile=False):
            if impl.family != "tritongemm":
                continue
            try:
                if case.backward:
                    harness._forward_backward(impl, inputs)
                else:
                    harness._forward(impl, inputs)
                done += 1
            except Exception:  # the timed run reports it
                pass
        torch.cuda.synchronize()
    return done


def warm(suites: list[str], dtypes: str | None = None, jobs: int = 14) -> None:
    t0 = time.time()
    work = _jobs(suites, dtypes)
    buckets = [work[i::jobs] for i in range(jobs)]
    with mp.get_context("spawn").Pool(jobs) as pool:
        done = sum(pool.map(_worker, buckets))
    print(f"warmed {done} launches over {len(work)} cases in {time.time() - t0:.0f}s", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--suite", required=True)
    parser.add_argument("--dtype")
    parser.add_argument("--jobs", type=int, default=14)
    args = parser.parse_args()
    warm(args.suite.split(","), args.dtype, args.jobs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
