"""What every launcher shares: argument binding by keyword, the launch itself, workspaces."""

from __future__ import annotations

import contextlib
import inspect
import os
import threading

import torch
import triton

from .._compat import interpreter_numpy_message
from ..device import interpreter_enabled
from .context import THREAD, ensure

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
def tracing():
    """Within the block, launches on this thread are recorded into the graph being traced
    (``Launch.traced``) instead of run, and buffers a launch would keep are made per call."""
    ready = THREAD.ready
    THREAD.ready, THREAD.tracing = False, True
    try:
        yield
    finally:
        THREAD.ready, THREAD.tracing = ready, False


def rebase(template, t):
    """The descriptor ``template`` over tensor ``t`` (same shape, strides, alignment).

    Built by copying the template's fields: ``copy.copy`` of a dataclass, or
    re-running its validating constructor, costs microseconds per launch.
    """
    desc = object.__new__(type(template))
    desc.__dict__.update(template.__dict__)
    desc.base = t
    return desc


class DirectLaunch:
    """Triton 3.4-3.6's compiled launcher (``__triton_launcher.launch``), called with no Python between.

    What Triton's own per-launch Python does, and what this does instead:

    * ``CompiledKernel[grid]`` asks the driver for the current device and
      stream, builds a ``LazyDict`` of launch metadata and passes the
      launch-hook chains, which the C launcher then calls (two Python calls)
      even when empty.  Here: the stream from one C call; no hooks while none
      is registered (with any registered, the launch goes through Triton's runner).
    * ``CudaLauncher.__call__`` defines two closures per call to allocate
      scratch; kernels that need scratch go through Triton's runner.
    * Tensors are handed over as their device addresses: the C launcher then
      skips a ``data_ptr()`` call and a ``cuPointerGetAttribute`` per pointer
      (and an operand given twice, e.g. ``out`` standing in for absent ones, is read once).
    * Tensor descriptors: Triton 3.6 re-encodes every host descriptor
      (``cuTensorMapEncodeTiled``) per launch.  An encoding is a pure function
      of (address, shape, strides, block, dtype), and the launch copies it into
      the kernel's parameters, so encodings are cached per (argument, address):
      steady-state loops reuse the caching allocator's addresses and weights stay put.
    * The argument list: Triton binds it per call; here a function written for
      this launch (``source``) puts each value in its place, the fixed ones as constants.

    ``of`` returns None outside the Triton releases it was written for
    (``DIRECT_LAUNCH_VERSIONS``) or when the launcher has another form (other
    backends, scratch buffers): those launches go through ``CompiledKernel[grid]``.
    """

    MAX_ENCODINGS = 64

    @classmethod
    def of(cls, compiled, launch: Launch, device_index: int):
        """The generated launch function for ``launch``'s compiled kernel, or None."""
        try:
            from triton import knobs
            from triton.backends.nvidia import driver as nvdriver
        except ImportError:
            return None
        if not direct_launch_supported(triton.__version__):
            return None
        run = getattr(compiled, "run", None)
        if not is_known_launcher(run):
            return None  # not the 3.4-3.6 CudaLauncher
        if getattr(run, "global_scratch_size", 1) or getattr(run, "profile_scratch_size", 1):
            return None
        raw, desc_meta, expand = run.launch, [], None
        if launch.descriptors:
            closure = _closure_vars(raw)
            expand = getattr(nvdriver, "make_tensordesc_arg", None)
            if not {"launcher", "tensordesc_meta"} <= closure.keys() or expand is None:
                return None
            raw, desc_meta = closure["launcher"], closure["tensordesc_meta"]
            if len(desc_meta) != len(launch.descriptors) or not callable(raw):
                return None
            if any(meta is None for meta in desc_meta):
                return None  # descriptors lowered to pointers: their expansion holds the tensor itself
        elif type(raw).__name__ != "builtin_function_or_method":
            return None
        if _RAW_STREAM is None:
            return None
        return cls._generate(raw, compiled, launch, device_index, desc_meta, expand, knobs.runtime)

    @classmethod
    def _generate(cls, raw, compiled, launch: Launch, device_index, desc_meta, expand, hooks):
        """Write, compile and return the launch function.

        The source text holds only generated names (``v3``, ``_c12``) and integers
        (the grid, the device index, argument positions); every value -- the
        compiled kernel's function handle and packed metadata, the fixed
        arguments, descriptor templates -- reaches it through ``env``, never as
        text, so nothing a user passes can become code.
        """
        args = launch.args
        sig = list(compiled.src.signature.values())
        runtime = list(args.runtime)
        params = [f"v{i}" for i in range(len(runtime))]
        descriptors = dict(launch.descriptors)  # runtime index -> template
        env = {
            "_raw": raw,
            "_stream": _RAW_STREAM,
            "_hooks": hooks,
            "_busy": _hook_calls,
            "_slow": launch.slow,
            "_MAX": cls.MAX_ENCODINGS,
        }
        lines = [
            f"def direct({', '.join(params)}):",
            "    if _busy(_hooks.launch_enter_hook) or _busy(_hooks.launch_exit_hook):",
            f"        return _slow({', '.join(params)})",
        ]
        # The value whose address stands in for absent operands (out): read once, reused where passed again.
        alias = next((i for i, n in enumerate(runtime) if n in ("c_ptr", "c_desc")), None)
        if alias is not None:
            lines.append(f"    p{alias} = v{alias}.data_ptr()")
        slot_of = {slot: i for i, slot in enumerate(args.slots)}
        pieces = []
        for k, (i, template) in enumerate(launch.descriptors):
            env[f"_t{i}"], env[f"_m{i}"], env[f"_e{i}"] = template, desc_meta[k], {}
        env["_expand"], env["_rebase"] = expand, rebase
        for slot, value in enumerate(args.template):
            i = slot_of.get(slot)
            if i is None:
                env[f"_c{slot}"] = value
                pieces.append(f"_c{slot}")
            elif i in descriptors:
                ptr = f"p{i}" if i == alias else f"v{i}.data_ptr()"
                lines += [
                    f"    e{i} = _e{i}.get({ptr})",
                    f"    if e{i} is None:",
                    f"        if len(_e{i}) >= _MAX:",
                    f"            _e{i}.clear()",
                    f"        e{i} = _e{i}[{ptr}] = _expand(_rebase(_t{i}, v{i}), _m{i})",
                ]
                pieces.append(f"*e{i}")
            elif isinstance(sig[slot], str) and sig[slot].startswith("*"):
                if i == alias:
                    pieces.append(f"p{i}")
                elif alias is not None:
                    pieces.append(f"(p{alias} if v{i} is v{alias} else v{i}.data_ptr())")
                else:
                    pieces.append(f"v{i}.data_ptr()")
            else:
                pieces.append(f"v{i}")
        run = compiled.run
        head = [*(int(g) for g in launch.grid), f"_stream({int(device_index)})"]
        env["_function"], env["_metadata"] = compiled.function, compiled.packed_metadata
        env["_coop"], env["_pdl"] = run.launch_cooperative_grid, run.launch_pdl
        call = ", ".join(
            [
                *map(str, head),
                "_function",
                "_coop",
                "_pdl",
                "None",
                "None",
                "_metadata",
                "None",
                "None",
                "None",
            ]
            + pieces
        )
        lines.append(f"    _raw({call})")
        source = "\n".join(lines) + "\n"
        exec(compile(source, f"<tritongemm direct launch of {args.kernel.__name__}>", "exec"), env)
        direct = env["direct"]
        direct.source = source
        return direct


#: The Triton releases whose ``CudaLauncher`` the generated launcher was written against and
#: tested on.  A newer one takes Triton's compiled-kernel runner (a few microseconds more per
#: launch) until its launcher is checked: 3.9's, for one, passes hooks, scratch buffers and
#: the arguments in another order, under a ``__call__`` whose first parameters look the same.
DIRECT_LAUNCH_VERSIONS = ((3, 4), (3, 5), (3, 6))


def direct_launch_supported(version: str) -> bool:
    """Is ``version`` (a Triton version string) one whose launcher ``DirectLaunch`` knows?"""
    parts = version.split(".")
    try:
        major, minor = int(parts[0]), int(parts[1])
    except (IndexError, ValueError):
        return False
    return (major, minor) in DIRECT_LAUNCH_VERSIONS


#: ``CudaLauncher.__call__``'s parameters in Triton 3.4-3.6, with the kernel's arguments as ``*args``.
_LAUNCHER_PARAMS = ("self", "gridX", "gridY", "gridZ", "stream", "function")


def is_known_launcher(run) -> bool:
    """Does ``run`` (a compiled kernel's ``run``) have the 3.4-3.6 ``CudaLauncher`` form:
    ``__call__(self, gridX, gridY, gridZ, stream, function, *args)`` and nothing more?"""
    call = vars(type(run)).get("__call__") if run is not None else None
    code = getattr(call, "__code__", None)
    if code is None:
        return False
    return (
        code.co_argcount == len(_LAUNCHER_PARAMS)
        and code.co_varnames[: code.co_argcount] == _LAUNCHER_PARAMS
        and bool(code.co_flags & inspect.CO_VARARGS)
        and not code.co_kwonlyargcount
    )


def _hook_calls(hook):
    """Is a launch hook registered?  (Triton 3.6 keeps them in ``HookChain``s; older ones use None.)"""
    if hook is None:
        return False
    return bool(getattr(hook, "calls", True))


def _closure_vars(fn) -> dict:
    code, cells = getattr(fn, "__code__", None), getattr(fn, "__closure__", None)
    if code is None or cells is None:
        return {}
    return {name: cell.cell_contents for name, cell in zip(code.co_freevars, cells)}


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
