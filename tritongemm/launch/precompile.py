"""Compile a traced GEMM's kernel while ``torch.compile`` goes on (``request``), so that the compiled
graph's first run finds it built.

A GEMM a compiled graph calls as the opaque ``gemm_extern`` (the warp-specialized and TMA kernels:
``TRACEABLE_KERNELS`` says why) would compile its kernel at the graph's first run, in the calling
thread, after Inductor has compiled its own kernels: seconds per kernel variant, added to the time a
user waits for ``torch.compile``.  The trace already knows the plan.  ``request`` hands it, with the
operands' layouts, to a worker thread, which builds the launcher over meta tensors of those layouts
and compiles its kernels without launching them (``warm``).  Triton's compiler spends most of its
time in C++ passes and ptxas with the GIL released, so the compile overlaps Inductor's work.  The
extern's first call waits for what is still compiling (``wait``); Triton then finds the kernel in
its cache.

``TRITONGEMM_PRECOMPILE=0`` turns it off (the kernel then compiles at its first launch, as before).
A compile that fails here is recorded in ``FAILURES`` and otherwise ignored: the first launch
compiles again and raises where the error is real.
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor

import torch

from . import build_launcher, common, stand_ins

ENABLED = os.environ.get("TRITONGEMM_PRECOMPILE", "1") != "0"
#: ``repr`` of each background compile that raised (bounded): for ``explain``-style debugging and tests.
FAILURES: list[str] = []
MAX_FAILURES = 32
#: Requests already made, by call and layouts (a trace may run a GEMM's body more than once).
MAX_REQUESTS = 1024

_LOCK = threading.Lock()
_REQUESTS: dict = {}
_POOL: list[ThreadPoolExecutor] = []


def _spec(t: torch.Tensor | None):
    return None if t is None else (tuple(t.shape), tuple(t.stride()), t.storage_offset(), t.dtype)


def _meta(spec) -> torch.Tensor | None:
    """A meta tensor with ``spec``'s shape, strides, offset and dtype."""
    if spec is None:
        return None
    shape, stride, offset, dtype = spec
    extent = offset + 1 + sum((n - 1) * s for n, s in zip(shape, stride) if n > 0)
    return torch.empty(extent, dtype=dtype, device="meta").as_strided(shape, stride, offset)


def request(chosen, call, a, b, out, addend=None, residual=None, preact=None) -> Future | None:
    """Start compiling ``chosen``'s kernels for tensors laid out as these (fake tensors will do: only
    shapes, strides, offsets and dtypes are read, on this thread) on a worker thread.  Returns its
    future, or None where nothing was started: turned off, not a CUDA device, or requested before."""
    if not ENABLED or a.device.type != "cuda":
        return None
    specs = tuple(_spec(t) for t in (a, b, out, addend, residual, preact))
    key = (call, specs, a.device)
    with _LOCK:
        if key in _REQUESTS:
            return None
        if len(_REQUESTS) >= MAX_REQUESTS:
            for k in [k for k, f in _REQUESTS.items() if f.done()]:
                del _REQUESTS[k]
        if not _POOL:
            # One worker: compiles of one kernel function share Triton's per-device caches.
            _POOL.append(ThreadPoolExecutor(max_workers=1, thread_name_prefix="tritongemm-precompile"))
        future = _POOL[0].submit(_compile, chosen, call, a.device, specs)
        _REQUESTS[key] = future
    return future


def _compile(chosen, call, device: torch.device, specs) -> None:
    try:
        a, b, out, addend, residual, preact = (_meta(s) for s in specs)
        with torch.cuda.device(device):  # Triton compiles for, and keeps the kernel under, the current device
            warm(chosen, call, a, b, out, addend, residual, preact)
    except Exception as exc:  # the first launch compiles again, and raises if the error is real
        if len(FAILURES) < MAX_FAILURES:
            FAILURES.append(f"{chosen.kernel} {chosen.config.short()}: {exc!r}")


def warm(chosen, call, a, b, out, addend=None, residual=None, preact=None) -> None:
    """Compile the kernels ``chosen``'s launcher would launch on tensors of these layouts (meta tensors
    will do) for the current GPU, on this thread, and launch nothing."""
    d, r, z = stand_ins(out, addend, residual, preact)
    launcher = build_launcher(chosen, call, a, b, out, d, r, z, interpreting=False)
    ep = call.epilogue
    with common.warming():
        launcher(a, b, out, d, r, z, ep.alpha, ep.beta)


def pending() -> int:
    """Requests still compiling or queued."""
    with _LOCK:
        return sum(not f.done() for f in _REQUESTS.values())


def wait() -> None:
    """Return once every requested compile has finished (a launch then finds its kernel built)."""
    with _LOCK:
        futures = [f for f in _REQUESTS.values() if not f.done()]
    for f in futures:
        f.result()
