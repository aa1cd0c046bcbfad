"""What every launcher shares: argument binding by keyword, the launch itself, workspaces."""

from __future__ import annotations

import contextlib
import os
import threading

import torch
import triton

from .._compat import interpreter_numpy_message
from ..device import interpreter_enabled
from .context import THREAD, ensure
from .direct import _RAW_STREAM, DirectLaunch, rebase

INT32_MAX = 2**31 - 1

#: How launches after the first reach the GPU (TRITONGEMM_FAST_LAUNCH):
#: "1" (default) the generated direct launcher where Triton's launcher has a form it
#: knows, else Triton's compiled-kernel runner; "runner" always the runner; "0" always
#: ``JITFunction`` (to rule both out while debugging a Triton upgrade).
LAUNCH_MODE = {"0": "jit", "runner": "runner"}.get(os.environ.get("TRITONGEMM_FAST_LAUNCH", "1"), "direct")
FAST_LAUNCH = LAUNCH_MODE != "jit"

#: Triton's interpreter keeps global state while it runs a kernel (it patches
#: ``tl`` functions and shares numpy buffers), so two threads launching at once
#: corrupt each other's results; launches on the interpreter take turns.
_INTERPRETER_LOCK = threading.Lock()


class KernelArgs:
    """A kernel's positional arguments, built by keyword once; per call only the runtime slots change.

    ``runtime`` names the arguments given per call (tensors, alpha, beta, ...),
    in the order ``bind`` takes them; ``fixed`` gives every other argument,
    constexprs included.  A name the kernel lacks, or one left unset, is an
    error here rather than a wrong launch.
    """

    def __init__(self, kernel, runtime: tuple[str, ...], **fixed):
        names = list(kernel.arg_names)
        unknown = (set(runtime) | set(fixed)) - set(names)
        missing = set(names) - set(runtime) - set(fixed)
        if unknown or missing:
            raise TypeError(
                f"{kernel.__name__}: unknown arguments {sorted(unknown)}, missing {sorted(missing)}"
            )
        self.kernel = kernel
        self.names = names
        self.runtime = tuple(runtime)
        self.slots = tuple(names.index(n) for n in runtime)
        self.template = [fixed.get(n) for n in names]

    def bind(self, *values) -> list:
        args = self.template.copy()
        for slot, value in zip(self.slots, values):
            args[slot] = value
        return args


class Launch:
    """One kernel launch with a fixed grid and options.

    The first launch goes through ``JITFunction`` (which compiles); later ones
    skip its per-call work.  ``JITFunction.__getitem__(grid)(...)`` re-derives
    the specialization of every argument on each call (tens of microseconds
    for our ~40 arguments), but the launch-cache key already fixes everything
    the specialization depends on (shapes, strides, 16-byte alignment), so the
    compiled kernel from the first launch is the one Triton would pick.  Where
    Triton's launcher has the form ``DirectLaunch`` knows, it is called
    without its Python wrappers; elsewhere through ``CompiledKernel[grid]``.

    ``descriptors`` maps runtime argument names to ``TensorDescriptor``
    templates (base ``None``): the caller passes the tensor, and the launch
    builds (or, on the direct path, looks up) the descriptor over it.
    """

    def __init__(
        self, args: KernelArgs, grid: tuple[int, ...], num_warps: int, num_stages: int, descriptors=None
    ):
        self.args = args
        self.grid = tuple(grid) + (1,) * (3 - len(grid))  # CompiledKernel's runner reads grid[0..2]
        self.options = dict(num_warps=num_warps, num_stages=num_stages)
        self.runner = None
        self.direct = None
        self.descriptors = [
            (i, descriptors[name]) for i, name in enumerate(args.runtime) if name in (descriptors or {})
        ]

    def __call__(self, *values) -> None:
        if not THREAD.ready:
            if THREAD.tracing:  # one flag on the hot path: ``tracing`` clears ``ready`` while it lasts
                self.traced(*values)
                return
            if THREAD.warming:  # (``warming`` too)
                self.warm(*values)
                return
            ensure()  # a thread's first launch: the driver calls below need a current context
        direct = self.direct
        if direct is not None:
            direct(*values)
            return
        self.slow(*values)

    def traced(self, *values) -> None:
        """The launch as a graph node (``torch.library.wrap_triton``): a compiled graph launches the
        kernel itself, with the same arguments, grid and options as ``__call__``."""
        from torch.library import wrap_triton

        args = self.args.bind(*values)
        wrap_triton(self.args.kernel)[self.grid](**dict(zip(self.args.names, args)), **self.options)

    def warm(self, *values) -> None:
        """Compile the kernel these arguments would launch, and launch nothing (``JITFunction.warmup``:
        Triton keeps it, so the first launch finds it).  Meta tensors will do: the compile reads their
        dtypes and their data pointers' 16-byte alignment (a meta tensor's is its offset from a null base)."""
        values = list(values)
        for i, template in self.descriptors:
            values[i] = rebase(template, values[i])
        self.args.kernel.warmup(*self.args.bind(*values), grid=self.grid, **self.options)

    def slow(self, *values) -> None:
        """The launch through Triton (``JITFunction`` the first time, then ``CompiledKernel[grid]``)."""
        if self.descriptors:
            values = list(values)
            for i, template in self.descriptors:
                values[i] = rebase(template, values[i])
        args = self.args.bind(*values)
        if self.runner is not None:
            self.runner(*args)
            return
        if interpreter_enabled():
            with _INTERPRETER_LOCK:
                self._first(args)
        else:
            self._first(args)

    def _first(self, args: list) -> None:
        kernel = self.args.kernel
        try:
            compiled = kernel[self.grid](*args, **self.options)
        except Exception as exc:
            if interpreter_enabled() and "only 0-dimensional arrays can be converted" in str(exc):
                import numpy

                raise RuntimeError(interpreter_numpy_message(triton.__version__, numpy.__version__)) from exc
            raise
        if (
            FAST_LAUNCH
            and not interpreter_enabled()
            and hasattr(compiled, "run")
            and hasattr(compiled, "__getitem__")
        ):
            self.runner = compiled[self.grid]
            device = torch.cuda.current_device() if torch.cuda.is_available() else None
            if LAUNCH_MODE == "direct" and device is not None:
                self.direct = DirectLaunch.of(compiled, self, device)


@contextlib.contextmanager
def _not_launching(flag: str):
    """Within the block, launches on this thread take the course ``THREAD.<flag>`` names: ``ready`` is
    cleared, so that ``Launch.__call__`` reads the flags.  Both are restored after (blocks nest)."""
    ready, before = THREAD.ready, getattr(THREAD, flag)
    THREAD.ready = False
    setattr(THREAD, flag, True)
    try:
        yield
    finally:
        THREAD.ready = ready
        setattr(THREAD, flag, before)


def warming():
    """Within the block, launches on this thread compile their kernels and run nothing (``Launch.warm``)."""
    return _not_launching("warming")


def tracing():
    """Within the block, launches on this thread are recorded into the graph being traced
    (``Launch.traced``) instead of run, and buffers a launch would keep are made per call."""
    return _not_launching("tracing")


def max_offset(t: torch.Tensor) -> int:
    """The largest element offset ``t`` reaches from its base."""
    return sum((s - 1) * st for s, st in zip(t.shape, t.stride()) if s > 0)


def needs_index_64(*tensors: torch.Tensor) -> bool:
    return any(max_offset(t) > INT32_MAX for t in tensors)


def collapse_batch(batch_shape, tensors) -> list[tuple[int, list[int]]]:
    """Merge batch dims that every tensor can index with one stride.

    Returns (size, per-tensor strides) pairs with size-1 dims dropped.  Dims
    i, i+1 merge when for every tensor stride[i] == stride[i+1] * size[i+1]
    (always true for our own contiguous output and for broadcast stride-0 pairs).
    """
    dims = [(size, [t.stride(i) for t in tensors]) for i, size in enumerate(batch_shape) if size != 1]
    merged: list[tuple[int, list[int]]] = []
    for size, strides in dims:
        if merged:
            psize, pstrides = merged[-1]
            if all(ps == s * size for ps, s in zip(pstrides, strides)):
                merged[-1] = (psize * size, strides)
                continue
        merged.append((size, strides))
    return merged


def workspace_dtype(dtype: torch.dtype) -> torch.dtype:
    """Partial sums are kept in the accumulator's precision."""
    return torch.float64 if dtype == torch.float64 else torch.float32


#: (device, stream) -> int32 arrival counters for in-kernel split-K / Stream-K
#: fix-up.  All zero between launches: the reducing program re-arms its
#: tile's counter.  One buffer per stream, since launches on one stream never overlap.
#: Bounded: a program that makes a stream per request would otherwise grow it forever.
#: Dropping a buffer is safe while a kernel still uses it: the caching allocator hands its
#: memory out again only on the stream it was allocated on, after that stream's earlier work.
COUNTERS: dict = {}
MAX_COUNTER_BUFFERS = 64


def _current_raw_stream(device: torch.device) -> int:
    """The current CUDA stream's handle: a microsecond less than building a ``torch.cuda.Stream``."""
    if _RAW_STREAM is not None and device.index is not None:
        return _RAW_STREAM(device.index)
    return torch.cuda.current_stream(device).cuda_stream


def arrival_counters(device: torch.device, n: int) -> torch.Tensor:
    if device.type != "cuda":
        key = (device, None)
    else:
        if THREAD.tracing or torch.cuda.is_current_stream_capturing():
            # Traced into a graph, or inside CUDA-graph capture: a buffer of the graph's own,
            # zeroed at every run; the shared buffers stay outside it.
            return torch.zeros(n, dtype=torch.int32, device=device)
        key = (device, _current_raw_stream(device))
    buf = COUNTERS.get(key)
    if buf is None or buf.numel() < n:
        if buf is None and len(COUNTERS) >= MAX_COUNTER_BUFFERS:
            COUNTERS.clear()
        buf = torch.zeros(max(n, 1024), dtype=torch.int32, device=device)
        COUNTERS[key] = buf
    return buf
