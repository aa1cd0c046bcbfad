"""The generated direct launcher: Triton 3.4-3.6's compiled launch function, called with no Python between.

``common.Launch`` uses it for every launch after a kernel's first, where the
installed Triton is one it was written for and its launcher has the form it
knows (``direct_launch_supported``, ``is_known_launcher``); elsewhere launches
take Triton's compiled-kernel runner.  What it skips, and why that is safe, is
``DirectLaunch``'s docstring.
"""

from __future__ import annotations

import inspect

import torch
import triton

_RAW_STREAM = getattr(torch._C, "_cuda_getCurrentRawStream", None)  # what Triton's launcher itself calls


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
    def of(cls, compiled, launch, device_index: int):
        """The generated launch function for ``launch``'s compiled kernel (``launch``: a
        ``common.Launch``), or None."""
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
    def _generate(cls, raw, compiled, launch, device_index, desc_meta, expand, hooks):
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
