"""A current CUDA context on the calling thread, before a launch reaches the driver.

The CUDA runtime binds a device's primary context to a thread at that
thread's first runtime call (an allocation, a copy, a ``cudaSetDevice`` to
another device).  Triton's launcher and its tensor-map encoding
(``cuTensorMapEncodeTiled``) call the driver API, which binds nothing: on a
thread with no current context they fail with "invalid device context".
Such threads are common: autograd's device thread (torch skips
``cudaSetDevice`` when the device asked for is already the selected one, so a
backward whose first CUDA call is ours has none), a user's
``threading.Thread``, a pool worker serving requests with tensors it did not
allocate.  Triton makes the context current only when it loads a kernel, so
a kernel loaded on the main thread and launched on another fails.

``ensure`` runs once per thread, from the launch every kernel goes through
(``common.Launch``): it makes the current device's primary context (the one
torch and Triton use) current where no context is, and remembers per thread
that it did.
"""

from __future__ import annotations

import ctypes
import sys
import threading

import torch


class _ThreadState(threading.local):
    #: This thread has had a current CUDA context (or runs no CUDA at all).
    ready = False
    #: Launches are being traced into a graph (``common.tracing``), not run.
    tracing = False
    #: Launches compile their kernels and run nothing (``common.warming``).
    warming = False


THREAD = _ThreadState()
_DRIVER: list = []  # [libcuda or None], loaded at the first ensure


def _driver():
    if not _DRIVER:
        name = "nvcuda.dll" if sys.platform == "win32" else "libcuda.so.1"
        try:
            lib = ctypes.CDLL(name)
        except OSError:
            lib = None
        _DRIVER.append(lib)
    return _DRIVER[0]


def current_context() -> int | None:
    """The calling thread's current CUDA context handle (0 where none), or None without a driver."""
    lib = _driver()
    if lib is None:
        return None
    ctx = ctypes.c_void_p()
    _check(lib.cuCtxGetCurrent(ctypes.byref(ctx)), "cuCtxGetCurrent")
    return ctx.value or 0


def ensure(device_index: int | None = None) -> None:
    """Make a CUDA context current on this thread if none is: the primary context of
    ``device_index`` (default: torch's current device).  Cheap after the first call per thread."""
    if THREAD.ready:
        return
    if not torch.cuda.is_available():
        THREAD.ready = True
        return
    if device_index is None:
        device_index = torch.cuda.current_device()  # reads the runtime's selection; binds nothing
    lib = _driver()
    if lib is None:
        # No driver library to ask: a runtime call binds the primary context (once per thread).
        torch.cuda.synchronize(device_index)
        THREAD.ready = True
        return
    ctx = ctypes.c_void_p()
    _check(lib.cuCtxGetCurrent(ctypes.byref(ctx)), "cuCtxGetCurrent")
    if not ctx.value:
        device = ctypes.c_int()
        _check(lib.cuDeviceGet(ctypes.byref(device), int(device_index)), "cuDeviceGet")
        # The runtime already holds the primary context (torch initialised CUDA); retaining it
        # once more per thread keeps it alive as long as the thread may use it, as Triton does.
        _check(lib.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), device), "cuDevicePrimaryCtxRetain")
        _check(lib.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
    THREAD.ready = True


def _check(status: int, what: str) -> None:
    if status != 0:
        raise RuntimeError(f"tritongemm: {what} failed with CUDA driver error {status}")
