"""Python time per call of tritongemm's host path, with the kernel launch itself stubbed out.

On a machine without a GPU this isolates what the redesign controls: the
layers between ``linear()`` and the launch (validation, the call value, the
launch-cache lookup, autograd).  Triton's own launch (about 17 us on the H100
host) and descriptor encoding are not in it; ``python -m benchmarks run
--suite host`` measures the whole call on a GPU.

    TRITON_INTERPRET=1 python tools/host_overhead.py     # the checkout this file is in

To compare two versions, run each one's copy of this file (``git worktree add
/tmp/old REV``, then ``python /tmp/old/tools/host_overhead.py``): it imports
tritongemm from its own checkout, never from an installed or editable copy.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this checkout's tritongemm first


def stub_launches(tg) -> None:
    """Make every kernel launch a no-op (``kernel[grid](...)`` returns at once), keeping every layer above it.

    The same stub for any version of tritongemm, so old and new host paths compare directly.
    """
    from tritongemm.kernels import gemm_kernel

    type(gemm_kernel).__getitem__ = lambda self, grid: lambda *args, **kwargs: None


def per_call_us(fn, rounds: int = 15, calls: int = 2000) -> float:
    for _ in range(200):
        fn()
    samples = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        samples.append((time.perf_counter() - t0) / calls * 1e6)
    return statistics.median(samples)


def main() -> None:
    argparse.ArgumentParser(description=__doc__).parse_args()
    import torch.nn.functional as F

    import tritongemm as tg

    x = torch.randn(16, 64)
    w = torch.randn(32, 64)
    wg = w.clone().requires_grad_()
    bias = torch.randn(32)
    b = torch.randn(64, 32)
    layer = tg.nn.Linear(64, 32)
    tg.matmul(x, b), tg.linear(x, w, bias), layer(x)  # plan (and compile) once, as a warm call would
    stub_launches(tg)
    cases = {
        "matmul": (lambda: tg.matmul(x, b), lambda: torch.matmul(x, b)),
        "linear": (lambda: tg.linear(x, w, bias), lambda: F.linear(x, w, bias)),
        "linear, weight requires grad (fwd)": (lambda: tg.linear(x, wg, bias), lambda: F.linear(x, wg, bias)),
        "nn.Linear": (lambda: layer(x), None),
    }
    print(f"tritongemm {tg.__file__}")
    native = getattr(tg, "native", None)  # the C++ autograd node (absent in older checkouts)
    if native is not None:
        print(f"autograd node of repeated calls with grad: {native.node_in_use()}")
    print(f"{'case':40s} {'tritongemm us':>14s} {'torch (CPU kernel incl.) us':>28s}")
    for name, (ours, theirs) in cases.items():
        t_ours = per_call_us(ours)
        t_theirs = per_call_us(theirs) if theirs else float("nan")
        print(f"{name:40s} {t_ours:14.1f} {t_theirs:28.1f}")


if __name__ == "__main__":
    main()
