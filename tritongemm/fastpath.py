"""Repeated calls: from a cheap signature of the arguments straight to the launch.

A model calls the same few GEMMs over and over with the same shapes.  The
first call of each goes the whole way (``api``: checks, views, the autograd
op; ``launch``: plan, launcher); afterwards this module remembers, per
argument signature, the launcher that call used and what to allocate, so
the next identical call costs a dictionary lookup, one ``torch.empty`` and
the launch (issue 15: host time within 1.2x of torch's).

The signature holds everything the first call's checks and decisions read
from the tensors: shapes, strides, dtypes, devices, 16-byte alignment, the
negation bit, the tensor type, and for float32 torch's TF32 setting.  What
cannot be part of it (autocast, ``torch.func`` transforms, a
``torch.compile`` trace) makes the call take the whole way.  Only the
common forms have entries: ``linear(x, w[, bias])`` and ``matmul``/``mm``
of a (*, M, K) and a (K, N) matrix, with none of the optional arguments;
everything else takes the whole way.

Entries launch with the tensors the user passed (``x``, ``w``, ``bias``):
their data pointers are those of the views the first call planned with
(``x.view(-1, K)``, ``w.mT``, ``bias.expand(M, N)``), and launchers that
read only pointers (``takes_bases``) are the only ones remembered.  With
autograd the views are made, as the first call made them, since backward
reads their shapes.
"""

from __future__ import annotations

import os

import torch

from . import launch
from .autograd import GemmFunction, alloc_out
from .call import NO_REQUEST, PLAIN_EPILOGUE, Epilogue, GemmCall
from .semantics import SUPPORTED_DTYPES, dot_precision

_PLAIN_TYPES = (torch.Tensor, torch.nn.Parameter)
_any_autocast = getattr(torch._C, "_is_any_autocast_enabled", None) or (lambda: True)
_functorch_active = torch._C._are_functorch_transforms_active
_is_compiling = torch.compiler.is_compiling
_grad_enabled = torch.is_grad_enabled
_current_device = getattr(torch._C, "_cuda_getDevice", None) or torch.cuda.current_device

BIAS_EPILOGUE = Epilogue(beta=1.0, addend=True)

#: TRITONGEMM_FASTPATH=0 sends every call the whole way (to rule the fast path out while debugging).
ENABLED = os.environ.get("TRITONGEMM_FASTPATH", "1") != "0"

#: signature -> Entry (or None: this signature has no entry; take the whole way).
ENTRIES: dict = {}
MAX_ENTRIES = 2048
launch.register_dependent_cache(ENTRIES)  # cleared with the launch cache (tuning, padding policy)


def lookup(kind: str, x, w, bias) -> tuple:
    """``(None, result)`` when an entry ran ``kind(x, w, bias)``; else ``(key, None)``, where a key
    means: take the whole way, then ``build(kind, key, x, w, bias)``."""
    if not ENABLED or _any_autocast() or _functorch_active() or _is_compiling():
        return None, None
    key = signature(kind, x, w, bias)
    if key is None:
        return None, None
    entry = ENTRIES.get(key, _MISSING)
    if entry is _MISSING:
        return key, None
    if entry is None:
        return None, None
    grad = _grad_enabled() and (
        x.requires_grad or w.requires_grad or (bias is not None and bias.requires_grad)
    )
    return None, entry(x, w, bias, grad)


_MISSING = object()


def _tensor_sig(t: torch.Tensor):
    # (The type is checked, not keyed: only plain tensors and parameters get here, and both run alike.)
    return (t.shape, t.stride(), t.dtype, t.device, not t.data_ptr() & 15, t.is_neg())


def signature(kind: str, x, w, bias) -> tuple | None:
    """The key of ``kind(x, w, bias)``, or None where it cannot have one (not tensors)."""
    if type(x) not in _PLAIN_TYPES or type(w) not in _PLAIN_TYPES:
        return None
    if bias is not None and type(bias) not in _PLAIN_TYPES:
        return None
    dtype = x.dtype
    precision = dot_precision(dtype) if dtype is torch.float32 else None
    return (
        kind,
        _tensor_sig(x),
        _tensor_sig(w),
        None if bias is None else _tensor_sig(bias),
        precision,
    )


class Entry:
    """What a repeated ``x @ w`` (or ``x @ w.mT``) + bias does, decided by its first call."""

    __slots__ = (
        "launcher",
        "call",
        "out_shape",
        "mn",
        "fold",
        "dtype",
        "device",
        "cuda_index",
        "transposed",
        "beta",
    )

    def __init__(self, launcher, call: GemmCall, out_shape, mn, fold, dtype, device, transposed: bool):
        self.launcher = launcher
        self.call = call
        self.out_shape = out_shape
        self.mn = mn
        self.fold = fold  # (M, K) when x has batch dims to fold, else None
        self.dtype = dtype
        self.device = device
        self.cuda_index = device.index if device.type == "cuda" else None
        self.transposed = transposed
        self.beta = call.epilogue.beta

    def __call__(self, x, w, bias, grad: bool) -> torch.Tensor:
        if self.cuda_index is not None and self.cuda_index != _current_device():
            # The kernel was loaded for, and runs on, the tensors' GPU.
            with torch.cuda.device(self.cuda_index):
                return self(x, w, bias, grad)
        if grad:
            return self.with_grad(x, w, bias)
        out = alloc_out(self.out_shape, self.dtype, self.device)
        self.launcher(x, w, out, out if bias is None else bias, out, out, 1.0, self.beta)
        return out

    def with_grad(self, x, w, bias) -> torch.Tensor:
        a = x if self.fold is None else x.view(self.fold)
        b = w.mT if self.transposed else w
        d = None if bias is None else bias.expand(self.mn)
        out = GemmFunction.apply(a, b, d, None, self.call, self.launcher)
        return out if self.fold is None else out.view(self.out_shape)


def build(kind: str, key, x, w, bias) -> None:
    """Remember an entry for ``key`` (after the whole way ran ``kind(x, w, bias)`` without error)."""
    if len(ENTRIES) >= MAX_ENTRIES:
        ENTRIES.clear()
    ENTRIES[key] = _entry(kind, x, w, bias)


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
    transposed = kind == "linear"
    b = w.mT if transposed else w
    k, n = b.shape
    if x.shape[-1] != k or (bias is not None and (bias.dim() != 1 or bias.shape[0] != n or bias.is_neg())):
        return None
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
    call = GemmCall(epilogue, NO_REQUEST, None, dot_precision(x.dtype))
    out = torch.empty((m, n), dtype=x.dtype, device=x.device)
    d = None if bias is None else bias.expand(m, n)
    launcher = launch.launcher_for(call, a, b, out, d)
    if not getattr(launcher, "takes_bases", False):
        return None
    return Entry(launcher, call, (*x.shape[:-1], n), (m, n), fold, x.dtype, x.device, transposed)


__all__ = ["ENTRIES", "Entry", "build", "lookup", "signature"]
