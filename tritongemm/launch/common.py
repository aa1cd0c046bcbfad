"""What every launcher shares: argument binding by keyword, the launch itself, workspaces."""

from __future__ import annotations

import os
import threading

import torch
import triton

from ..device import interpreter_enabled

INT32_MAX = 2**31 - 1

#: Set TRITONGEMM_FAST_LAUNCH=0 to always launch through JITFunction (e.g. to
#: rule the direct launch out while debugging a Triton upgrade).
FAST_LAUNCH = os.environ.get("TRITONGEMM_FAST_LAUNCH", "1") != "0"

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
        self.slots = tuple(names.index(n) for n in runtime)
        self.template = [fixed.get(n) for n in names]

    def bind(self, *values) -> list:
        args = self.template.copy()
        for slot, value in zip(self.slots, values):
            args[slot] = value
        return args


class Launch:
    """One kernel launch with a fixed grid and options; after the first launch the compiled kernel is called
    directly.

    ``JITFunction.__getitem__(grid)(...)`` re-derives the specialization of
    every argument on each call (tens of microseconds for our ~40
    arguments).  The launch-cache key already fixes everything the
    specialization depends on (shapes, strides, 16-byte alignment), so the
    compiled kernel from the first launch is the one Triton would pick.
    """

    def __init__(self, args: KernelArgs, grid: tuple[int, ...], num_warps: int, num_stages: int):
        self.args = args
        self.grid = tuple(grid) + (1,) * (3 - len(grid))  # CompiledKernel's runner reads grid[0..2]
        self.options = dict(num_warps=num_warps, num_stages=num_stages)
        self.runner = None

    def __call__(self, *values) -> None:
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

                raise RuntimeError(
                    f"Triton {triton.__version__}'s interpreter cannot run with numpy {numpy.__version__}: it "
                    f"converts 1-element arrays to Python ints, which numpy 2.4 made an error. Install "
                    f"numpy<2.4 or a newer triton (3.9 works) to use TRITON_INTERPRET=1."
                ) from exc
            raise
        if (
            FAST_LAUNCH
            and not interpreter_enabled()
            and hasattr(compiled, "run")
            and hasattr(compiled, "__getitem__")
        ):
            self.runner = compiled[self.grid]


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
COUNTERS: dict = {}

_RAW_STREAM = getattr(torch._C, "_cuda_getCurrentRawStream", None)  # what Triton's launcher itself calls


def _current_raw_stream(device: torch.device) -> int:
    """The current CUDA stream's handle: a microsecond less than building a ``torch.cuda.Stream``."""
    if _RAW_STREAM is not None and device.index is not None:
        return _RAW_STREAM(device.index)
    return torch.cuda.current_stream(device).cuda_stream


def arrival_counters(device: torch.device, n: int) -> torch.Tensor:
    if device.type != "cuda":
        key = (device, None)
    else:
        if torch.cuda.is_current_stream_capturing():
            # Inside CUDA-graph capture: a buffer of the graph's own, zeroed by
            # a memset node at every replay; the shared buffers stay outside it.
            return torch.zeros(n, dtype=torch.int32, device=device)
        key = (device, _current_raw_stream(device))
    buf = COUNTERS.get(key)
    if buf is None or buf.numel() < n:
        buf = torch.zeros(max(n, 1024), dtype=torch.int32, device=device)
        COUNTERS[key] = buf
    return buf
