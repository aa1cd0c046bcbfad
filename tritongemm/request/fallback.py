"""Whether a call runs here or is handed to torch, with every reason in one place (``torch_reason``),
and saying so.

``unsupported_reason`` answers for what the kernels cannot run (dtype,
layout, device; ``checks`` raises torch's errors with the same words).  Code
that stands in for torch's own calls (``nn.Linear``, ``patch()``) needs a few
more answers, so that it never fails (or is wrong) where torch works:

* DTensor operands that tritongemm cannot serve (``dtensor_reason``: mixed
  with plain tensors, several meshes, a placement the sharding rule lacks);
* tensors with no storage for a kernel to read: the wrappers of
  ``torch.func.vmap`` / ``grad`` / ``jvp`` (torch computes through them at
  the dispatcher level; a Triton kernel needs a data pointer);
* lazily negated views (``z.conj().imag`` of a complex ``z``): the storage
  holds the values un-negated, so a kernel reading it would be silently wrong;
* autocast: torch casts the operands of the matmul family to the autocast
  dtype, so an fp32 weight with a bf16 input is a uniform call there, not a
  mixed-dtype one (the API does the cast).
"""

from __future__ import annotations

import os
import sys
import threading
import warnings

import torch

from ..autograd.distributed import registration_error
from ..device import interpreter_enabled
from ..semantics import SUPPORTED_DTYPES
from .autocast import autocast_dtype


# ----------------------------------------------------------------------------------
# The reasons
# ----------------------------------------------------------------------------------
def unsupported_reason(*tensors: torch.Tensor) -> str | None:
    """Why tritongemm cannot run these operands, or None when it can."""
    for t in tensors:
        if not isinstance(t, torch.Tensor):
            return f"non-tensor argument of type {type(t).__name__}"
    for t in tensors:
        if t.dtype not in SUPPORTED_DTYPES:
            return f"unsupported dtype {t.dtype}"
        if t.is_complex() or t.layout != torch.strided:
            return f"unsupported tensor layout {t.layout}"
        if t.is_nested:
            return "nested tensor"
    if len({t.dtype for t in tensors}) > 1:
        return "mixed dtypes " + ", ".join(str(t.dtype) for t in tensors)
    if len({t.device for t in tensors}) > 1:
        return "tensors on different devices " + ", ".join(str(t.device) for t in tensors)
    return device_unsupported_reason(tensors[0].device)


#: Why nothing is launched under ``torch.jit.trace``: it records the ops torch dispatches, and a Triton
#: launch is none, so a traced kernel's output would be recorded as a constant.
JIT_TRACE_REASON = (
    "torch.jit.trace records torch's ops, not Triton kernels (torch.export and torch.compile do)"
)
jit_tracing_state = torch._C._get_tracing_state


def jit_trace_reason() -> str | None:
    """``JIT_TRACE_REASON`` while ``torch.jit.trace`` (or the legacy ONNX export) traces, else None."""
    return None if jit_tracing_state() is None else JIT_TRACE_REASON


def device_unsupported_reason(device: torch.device) -> str | None:
    """Why tritongemm cannot run on ``device`` (None when it can)."""
    if device.type == "cuda":
        if interpreter_enabled():
            return "CUDA tensor while Triton runs on its CPU interpreter (TRITON_INTERPRET=1)"
        return None
    if device.type == "cpu":
        if interpreter_enabled():
            return None
        return "CPU tensor without Triton's interpreter (set TRITON_INTERPRET=1 before importing tritongemm)"
    return f"unsupported device type {device.type!r}"


def dtensor_reason(*tensors) -> str | None:
    """Why a call with DTensor operands must go to torch instead (None when tritongemm serves it).

    Plain-tensor calls get None.  The dtype and device are those of the local
    shards, which ``torch_reason`` reads through the DTensor before it asks here.
    ``torch.distributed`` is read from ``sys.modules``: a DTensor cannot exist
    before ``torch.distributed.tensor`` is imported.
    """
    mod = sys.modules.get("torch.distributed.tensor")
    if mod is None:
        return None
    dtensors = [t for t in tensors if isinstance(t, mod.DTensor)]
    if not dtensors:
        return None
    if len(dtensors) != len([t for t in tensors if isinstance(t, torch.Tensor)]):
        # torch raises for this too ("mixed torch.Tensor and DTensor"): let it say so.
        return "DTensor mixed with plain torch.Tensor operands"
    error = registration_error()
    if error is not None:
        return error
    mesh = dtensors[0].device_mesh
    for t in dtensors:
        if t.device_mesh != mesh:
            return "DTensor operands on different device meshes"
        for p in t.placements:
            if not isinstance(p, (mod.Shard, mod.Replicate, mod.Partial)):
                return f"unsupported DTensor placement {p}"
    return None


_is_functorch_wrapped = getattr(getattr(torch._C, "_functorch", None), "is_functorch_wrapped_tensor", None)
_has_storage = getattr(torch._C, "_has_storage", None)


def _no_storage(t: torch.Tensor) -> bool:
    if _is_functorch_wrapped is not None:
        return _is_functorch_wrapped(t)
    return _has_storage is not None and not _has_storage(t)


def _autocast_makes_runnable(tensors) -> bool:
    """Would autocast turn these operands into one dtype tritongemm runs?"""
    if not all(isinstance(t, torch.Tensor) for t in tensors):
        return False
    device = tensors[0].device
    cast = autocast_dtype(device)
    if cast is None or any(t.device != device for t in tensors):
        return False
    if any(unsupported_reason(t) is not None for t in tensors):  # dtype, layout, device one at a time
        return False
    # Autocast casts floating tensors except float64 (torch's is_eligible rule).
    return len({cast if t.dtype != torch.float64 else t.dtype for t in tensors}) == 1


_functorch_active = torch._C._are_functorch_transforms_active
#: Devices tritongemm runs on in this process (fixed once the kernels are built).
_RUNNABLE: set = set()


def _plainly_runnable(tensors) -> bool:
    """The common call in a few attribute reads: plain tensors of one supported dtype on a runnable device."""
    if torch.compiler.is_compiling():  # the traced path below handles fake tensors
        return False
    first = tensors[0]
    if type(first) not in (torch.Tensor, torch.nn.Parameter) or first.dtype not in SUPPORTED_DTYPES:
        return False
    dtype, device = first.dtype, first.device
    if device not in _RUNNABLE or _functorch_active():
        return False
    return all(
        type(t) in (torch.Tensor, torch.nn.Parameter)
        and t.dtype == dtype
        and t.device == device
        and t.layout == torch.strided
        and not t.is_nested
        and not t.is_neg()
        for t in tensors
    )


def torch_reason(*tensors: torch.Tensor) -> str | None:
    """Why this call must go to torch, or None when tritongemm can serve it: the one place the
    doors that stand in for torch (``nn.Linear``, ``patch()``) ask.

    In order: what the kernels cannot run (dtype, layout, device), what DTensor operands need
    (``dtensor_reason``), what no kernel may read (no storage, a lazy negation); under
    ``torch.jit.trace``, every call (``jit_trace_reason``)."""
    if jit_tracing_state() is not None:
        return JIT_TRACE_REASON
    if _plainly_runnable(tensors):
        return None
    reason = unsupported_reason(*tensors)
    if reason is not None and not _autocast_makes_runnable(tensors):
        return reason
    reason = dtensor_reason(*tensors)
    if reason is not None or torch.compiler.is_compiling():
        return reason  # compiling: fake tensors have no data, and trace as the custom op
    for t in tensors:
        if _no_storage(t):
            return "functorch-transformed tensor (torch.func.vmap/grad/jvp): no storage for a Triton kernel"
        if t.is_neg():
            return "lazily negated view (e.g. z.conj().imag): its storage holds the un-negated values"
    if isinstance(tensors[0], torch.Tensor) and device_unsupported_reason(tensors[0].device) is None:
        _RUNNABLE.add(tensors[0].device)
    return None


def traced_reason(*tensors: torch.Tensor) -> str | None:
    """``torch_reason`` for a trace's operands (``torch.compile``, ``torch.export``): what their dtypes,
    layouts and devices decide, which a trace knows.  A door that stands in for torch puts torch's own
    op in the graph for these, as it calls it eagerly; it neither counts nor warns, since a graph is
    traced once and run many times."""
    reason = unsupported_reason(*tensors)
    return None if reason is None or _autocast_makes_runnable(tensors) else reason


# ----------------------------------------------------------------------------------
# Saying so
# ----------------------------------------------------------------------------------
_counts_lock = threading.Lock()  # `counter[k] += 1` is a read-modify-write; fallbacks may come from threads


def count_fallback(where: str, reason: str, counters, first) -> None:
    """Count a call handed to torch under ``reason`` in each of ``counters`` (``Counter`` objects),
    and warn once where the reason is ``first``'s device (``warn_device_fallback``)."""
    with _counts_lock:
        for counter in counters:
            counter[reason] += 1
    if isinstance(first, torch.Tensor):
        warn_device_fallback(where, reason, first.device)


_warned: set = set()
_warned_lock = threading.Lock()
_LIBRARY_DIRS = tuple(
    os.path.dirname(m.__file__) + os.sep for m in (torch, sys.modules[__package__.partition(".")[0]])
)


def _caller_stacklevel() -> int:
    """The ``stacklevel`` that points a warning at the first frame outside tritongemm and torch."""
    frame, level = sys._getframe(1), 1
    while frame is not None and frame.f_code.co_filename.startswith(_LIBRARY_DIRS):
        frame, level = frame.f_back, level + 1
    return level


def warn_device_fallback(where: str, reason: str, device: torch.device) -> None:
    """Warn once per (``where``, reason) that calls on ``device`` run on torch for a device reason.

    Meta tensors stay quiet: there is nothing to compute on them.  So does
    tracing: a warning (a lock, a frame walk) would break a ``fullgraph`` compile.
    """
    if torch.compiler.is_compiling() or device.type == "meta" or reason != device_unsupported_reason(device):
        return
    with _warned_lock:
        if (where, reason) in _warned:
            return
        _warned.add((where, reason))
    if device.type == "cpu" and not torch.cuda.is_available():
        reason = (
            "this machine has no CUDA GPU, and Triton's CPU interpreter is off (TRITON_INTERPRET=1 was not "
            "set before tritongemm was imported; set it to run tritongemm's kernels on the CPU, slowly, for testing)"
        )
    warnings.warn(
        f"{where} runs torch's own kernels for {device.type} tensors: {reason}. "
        "Each such call is counted as a fallback; this warning is shown once.",
        stacklevel=_caller_stacklevel(),
    )
