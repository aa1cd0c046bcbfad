"""Compile the kernels of a compiled graph's opaque calls while ``torch.compile`` goes on, so that the
graph's first run finds them built.

Three ops reach a compiled graph as opaque calls whose kernels tritongemm launches itself:
``gemm_extern`` (the warp-specialized and TMA kernels: ``TRACEABLE_KERNELS`` says why), ``scaled_mm``
and ``gated``.  Each would compile its kernel at the graph's first run, in the calling thread, after
Inductor has compiled its own: seconds per kernel variant, added to the time a user waits for
``torch.compile``.  The trace already knows the plan and the operands' layouts.  ``request`` hands
them to a worker thread, which builds the launcher over meta tensors of those layouts and compiles
its kernels without launching them (``common.warming``).  Triton's compiler spends most of its time
in C++ passes and ptxas with the GIL released, so the compile overlaps Inductor's work.  An op's
first call waits for what is still compiling (``wait``); Triton then finds the kernel in its cache.

``TRITONGEMM_PRECOMPILE=0`` turns it off (a kernel then compiles at its first launch).  A compile
that fails here is recorded in ``FAILURES`` and otherwise ignored: the first launch compiles again
and raises where the error is real.
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from functools import partial

import torch

from . import build_launcher, common, stand_ins

ENABLED = os.environ.get("TRITONGEMM_PRECOMPILE", "1") != "0"
#: Each background compile that raised, as "what: repr(error)" (bounded).
FAILURES: list[str] = []
MAX_FAILURES = 32
#: Requests already made, by call and layouts (a trace may run a GEMM's body more than once).
MAX_REQUESTS = 1024

_LOCK = threading.Lock()
_REQUESTS: dict = {}
_OUTSTANDING = [0]  # requests not yet finished: ``wait``'s test, without the lock
_POOL: list[ThreadPoolExecutor] = []


def _forget() -> None:
    """In a forked child: the parent's worker thread does not exist there, so its queue and requests go."""
    global _LOCK
    _LOCK = threading.Lock()
    _POOL.clear()
    _REQUESTS.clear()
    _OUTSTANDING[0] = 0


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget)


def _spec(t: torch.Tensor | None):
    return None if t is None else (tuple(t.shape), tuple(t.stride()), t.storage_offset(), t.dtype)


def _meta(spec) -> torch.Tensor | None:
    """A meta tensor with ``spec``'s shape, strides, offset and dtype."""
    if spec is None:
        return None
    shape, stride, offset, dtype = spec
    extent = offset + 1 + sum((n - 1) * s for n, s in zip(shape, stride) if n > 0)
    return torch.empty(extent, dtype=dtype, device="meta").as_strided(shape, stride, offset)


def request(key, warm_up, *tensors) -> Future | None:
    """Start ``warm_up(*meta)`` on the worker thread: ``meta`` are meta tensors laid out as ``tensors``
    (None stays None; fake tensors will do: only their shapes, strides, offsets and dtypes are read,
    on this thread), with their GPU current; ``warm_up`` runs its launcher under ``common.warming``, so
    that launches compile only.  ``key`` says what is compiled besides the layouts (an op, its call, its
    plan).
    Returns the future, or None where nothing was started: turned off, not on a CUDA device, or
    this key and these layouts requested before."""
    device = next(t.device for t in tensors if t is not None)
    if not ENABLED or device.type != "cuda":
        return None
    specs = tuple(_spec(t) for t in tensors)
    full_key = (key, specs, device)
    with _LOCK:
        if full_key in _REQUESTS:
            return None
        if len(_REQUESTS) >= MAX_REQUESTS:
            for k in [k for k, f in _REQUESTS.items() if f.done()]:
                del _REQUESTS[k]
        if not _POOL:
            # One worker: compiles of one kernel function share Triton's per-device caches.
            _POOL.append(ThreadPoolExecutor(max_workers=1, thread_name_prefix="tritongemm-precompile"))
        _OUTSTANDING[0] += 1
        future = _POOL[0].submit(_compile, warm_up, device, specs)
        _REQUESTS[full_key] = future
    future.add_done_callback(_finished)
    return future


def _finished(future: Future) -> None:
    with _LOCK:
        _OUTSTANDING[0] -= 1


def request_gemm(chosen, call, a, b, out, addend=None, residual=None, preact=None, *scales) -> Future | None:
    """``request`` the kernels of ``launch.gemm``'s launch of ``chosen`` (``warm``)."""
    key = ("gemm", call, chosen.kernel, chosen.config)  # (a new plan, after tuning say, is another kernel)
    return request(key, partial(warm, chosen, call), a, b, out, addend, residual, preact, *scales)


def attempt(what: str, request_fn, *args) -> None:
    """``request_fn(*args)``, a request made while tracing, with its errors recorded in ``FAILURES``
    rather than raised: a kernel not compiled ahead is compiled at its first launch, where a real
    error is raised."""
    try:
        request_fn(*args)
    except Exception as exc:
        _record(what, exc)


def _record(what: str, exc: Exception) -> None:
    if len(FAILURES) < MAX_FAILURES:
        FAILURES.append(f"{what}: {exc!r}")


def _compile(warm_up, device: torch.device, specs) -> None:
    try:
        with torch.cuda.device(device):  # (Triton compiles for the current device)
            warm_up(*(_meta(s) for s in specs))
    except Exception as exc:  # the first launch compiles again, and raises if the error is real
        _record(getattr(warm_up, "func", warm_up).__name__, exc)


def warm(chosen, call, a, b, out, addend=None, residual=None, preact=None, *scales) -> None:
    """Compile the kernels ``chosen``'s launcher would launch on tensors of these layouts (meta tensors
    will do; ``scales``: an fp8 call's, as ``launch.gemm`` takes them) for the current GPU, on this
    thread, and launch nothing."""
    d, r, z = stand_ins(out, addend, residual, preact)
    launcher = build_launcher(chosen, call, a, b, out, d, r, z, interpreting=False)
    ep = call.epilogue
    with common.warming():
        launcher(a, b, out, d, r, z, ep.alpha, ep.beta, *scales)


def pending() -> int:
    """Requests still compiling or queued."""
    with _LOCK:
        return sum(not f.done() for f in _REQUESTS.values())


def wait() -> None:
    """Return once every requested compile has finished (a launch then finds its kernel built)."""
    if not _OUTSTANDING[0]:
        return
    with _LOCK:
        futures = [f for f in _REQUESTS.values() if not f.done()]
    for f in futures:
        f.result()
