"""Repeated calls, at the door: from a cheap signature of the arguments straight to an entry's launch.

A model calls the same few GEMMs over and over with the same shapes.  A door
(``api.linear``, ``api.matmul``, ``api.mm``, ``api.addmm``, ``nn.Linear``, ``patch()``)
first asks ``lookup``: where an entry (``autograd.fastpath.Entry``) is kept
for the call's signature, it runs and the call is done; else the call takes
the whole way (``calls``: checks, views, the autograd op, the launch), and
``build`` remembers an entry for the signature (or None: its calls always take
the whole way), planned on the views the whole way makes.

The signature holds everything the first call's checks and decisions read
from the tensors: shapes, strides, dtypes, devices, 16-byte alignment, the
negation bit, the tensor type, and for float32 torch's TF32 setting.  Under
``torch.autocast`` it also holds the autocast dtype, and an entry runs on the
operands as autocast casts them, so a mixed-precision model's repeated
calls use entries too: through torch's own ``cached_cast`` once ``native``
is built (its weight cache included, as for torch's ops), until then
``autocast.autocast_cast`` (the differentiable ``.to`` the whole way makes).
What cannot be part of it (``torch.func`` transforms, a ``torch.compile``
trace) makes the call take the whole way.

Once ``native`` is loaded, keys are packed in C++ (another form than the
Python tuples before it): each signature then takes the whole way once more.
"""

from __future__ import annotations

import os

import torch

from .. import launch
from ..autograd.fastpath import Entry
from ..autograd.modes import dispatch_stack_len, forward_ad_state
from ..launch import native
from ..planning.call import NO_REQUEST, PLAIN_EPILOGUE, Epilogue, GemmCall
from ..semantics import SUPPORTED_DTYPES, fp32_precision
from .autocast import _any_autocast, autocast_cast, autocast_dtype
from .fallback import jit_tracing_state  # (a launch under torch.jit.trace is recorded as a constant)

_PLAIN_TYPES = (torch.Tensor, torch.nn.Parameter)
_STRIDED = torch.strided
_functorch_active = torch._C._are_functorch_transforms_active
_is_compiling = torch.compiler.is_compiling
_current_device = getattr(torch._C, "_cuda_getDevice", None) or torch.cuda.current_device

BIAS_EPILOGUE = Epilogue(beta=1.0, addend=True)
#: The kind of a linear with a fused activation: "linear+gelu" (``linear_kind``).
_ACTIVATED = "linear+"

#: TRITONGEMM_FASTPATH=0 sends every call the whole way (to rule the fast path out while debugging).
ENABLED = os.environ.get("TRITONGEMM_FASTPATH", "1") != "0"


def linear_kind(activation: str | None) -> str:
    """The kind a linear with ``activation`` fused is looked up by: "linear" without one, else
    "linear+<activation>".  Its entries run without autograd only: a door looks one up only for a call
    autograd will not record (a recorded call takes the plain linear's entry, then torch's activation)."""
    return "linear" if activation is None or activation == "none" else _ACTIVATED + activation


def lookup(kind: str, x, w, bias) -> tuple:
    """``(None, result)`` when an entry ran ``kind(x, w, bias)``; else ``(key, None)``, where a key
    means: take the whole way, then ``build(kind, key, x, w, bias)``."""
    # (``autograd.modes``' questions inlined: this runs on every call)
    if (
        not ENABLED
        or _functorch_active()
        or _is_compiling()
        or jit_tracing_state() is not None
        or forward_ad_state._current_level >= 0
        or dispatch_stack_len()
    ):
        return None, None
    if type(x) not in _PLAIN_TYPES:
        return None, None
    # The casts' layouts follow from the operands' (``.to`` keeps dense strides; a fresh
    # allocation is aligned), so the operands' signature and the autocast dtype key their entry.
    amp = _any_autocast() and autocast_dtype(x.device)
    key = signature(kind, x, w, bias, amp)
    if key is None:
        return None, None
    entry = launch.PLANS.entries.get(key, _MISSING)  # an Entry, or None: this signature has none
    if entry is _MISSING:
        return key, None
    if entry is None:
        return None, None
    if amp:  # cast only for an entry that will run: a call without one casts in the whole way
        # In C++ with torch's own weight cache once ``native`` is loaded (``build`` started it).
        x, w, bias = (native.CAST or autocast_cast)(amp, x, w, bias)
    if entry.cuda_index is not None and entry.cuda_index != _current_device():
        # The kernel was loaded for, and runs on, the tensors' GPU.
        with torch.cuda.device(entry.cuda_index):
            return None, entry.run(x, w, bias)
    return None, entry.run(x, w, bias)


_MISSING = object()


def signature(kind: str, x, w, bias, amp=None) -> tuple | None:
    """The key of ``kind(x, w, bias)``, or None where it cannot have one (not dense strided tensors).

    Per tensor: shape, strides, dtype, device, 16-byte alignment, the negation
    bit (the type is checked, not keyed: plain tensors and parameters run
    alike).  Last, what decides the precision: ``amp``, the autocast dtype
    (fp16/bf16: float32 operands are cast to it, so TF32 does not apply), or
    else for float32 operands torch's TF32 setting (reading it costs ~2 us,
    so it is read only where it counts).  Once ``native`` is loaded the
    fields are packed in C++ (~0.4 us against ~1.8); until then, written out
    flat: this runs on every call, and each Python call or nested tuple here
    is a measurable share of a ~20 us budget.
    """
    if type(x) not in _PLAIN_TYPES or type(w) not in _PLAIN_TYPES:
        return None
    if bias is not None and type(bias) not in _PLAIN_TYPES:
        return None
    dtype = x.dtype
    if amp:
        precision = amp if amp is not torch.float32 else (amp, fp32_precision())
    else:
        precision = fp32_precision() if dtype is torch.float32 else None
    packed = native.SIGNATURE
    if packed is not None:  # the same fields, packed into one bytes object in C++
        return packed(kind, x, w, bias, precision)
    # Sparse and nested tensors have no key: the whole way says what happens to them.
    if x.layout is not _STRIDED or w.layout is not _STRIDED or x.is_nested or w.is_nested:
        return None
    if bias is None:
        bias_sig = None
    elif bias.layout is not _STRIDED or bias.is_nested:
        return None
    else:
        bias_sig = (
            bias.shape,
            bias.stride(),
            bias.dtype,
            bias.device,
            not bias.data_ptr() & 15,
            bias.is_neg(),
        )
    # fmt: off
    return (
        kind,
        x.shape, x.stride(), dtype, x.device, not x.data_ptr() & 15, x.is_neg(),
        w.shape, w.stride(), w.dtype, w.device, not w.data_ptr() & 15, w.is_neg(),
        bias_sig,
        precision,
    )
    # fmt: on


def build(kind: str, key, x, w, bias) -> None:
    """Remember an entry for ``key`` (after the whole way ran ``kind(x, w, bias)`` without error)."""
    native.start()  # the C++ keys, casts and node (once per process; loads a built one at once)
    amp = _any_autocast() and autocast_dtype(x.device)
    if amp:  # plan on the casts, as the entry will run on them
        x, w, bias = autocast_cast(amp, x, w, bias)
    entry = _entry(kind, x, w, bias)
    launch.PLANS.remember(key, entry)


def _entry(kind: str, x, w, bias) -> Entry | None:
    if (
        x.dim() < 2
        or w.dim() != 2
        or x.shape[-1] == 0
        or x.dtype not in SUPPORTED_DTYPES
        or x.is_neg()
        or w.is_neg()
    ):
        return None
    transposed = kind.startswith("linear")  # ("linear", or "linear+<activation>")
    b = w.mT if transposed else w
    k, n = b.shape
    if x.shape[-1] != k or (bias is not None and (bias.dim() != 1 or bias.shape[0] != n or bias.is_neg())):
        return None  # (addmm's input of shape (M, N), (1, N) or (1,) takes the whole way)
    if x.dim() == 2:
        a, fold = x, None
    else:
        try:
            a = x.view(-1, k)
        except RuntimeError:
            return None  # strides that do not fold: the whole way copies nothing either, it batches
        fold = tuple(a.shape)
    m = a.shape[0]
    if m == 0 or n == 0:
        return None
    epilogue = PLAIN_EPILOGUE if bias is None else BIAS_EPILOGUE
    if kind.startswith(_ACTIVATED):
        epilogue = epilogue._replace(activation=kind[len(_ACTIVATED) :])
    precision = fp32_precision() if x.dtype is torch.float32 else "ieee"  # semantics.dot_precision's rule
    call = GemmCall(epilogue, NO_REQUEST, None, precision)
    out = torch.empty((m, n), dtype=x.dtype, device=x.device)
    d = None if bias is None else bias.expand(m, n)
    entry = Entry(call, x, a, b, out, d, (*x.shape[:-1], n), fold, transposed)
    return entry if getattr(entry.launcher, "takes_bases", False) else None


__all__ = ["build", "linear_kind", "lookup", "signature"]
