"""The keys calls are remembered by (``launch.Plans``): one per level of the path.

* ``signature(kind, x, w, bias, precision)``: a door's call as the user made it (``linear(x, w,
  bias)``, ``matmul(x, w)``), read before any check or view, so that a repeated call finds its
  entry (``autograd.fastpath``) for the cost of the key.  Packed in C++ once ``native`` is loaded
  (``csrc/entry_node.cpp``: the same fields, ~0.4 us against ~1.8), else a flat Python tuple.
* ``layout_signature(a, b, out, ...)``: the operands as the whole way hands them to the launch
  layer, views made; with the ``GemmCall`` it keys a launcher.
"""

from __future__ import annotations

import torch

from ..semantics import dot_precision
from . import native

_PLAIN_TYPES = (torch.Tensor, torch.nn.Parameter)
_STRIDED = torch.strided


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
        precision = amp if amp is not torch.float32 else (amp, dot_precision(amp))
    else:
        precision = dot_precision(dtype) if dtype is torch.float32 else None
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


def _layout(t) -> tuple | None:
    return None if t is None else (t.shape, t.stride(), t.dtype, not t.data_ptr() & 15)


def layout_signature(a, b, out, addend=None, residual=None, preact=None) -> tuple:
    """What a compiled launch depends on in the tensors: shapes, strides, dtypes, 16-byte alignment, device.

    Written out rather than looped: it runs on every call (a generator costs a microsecond more).
    """
    return (
        _layout(a),
        _layout(b),
        _layout(out),
        _layout(addend),
        _layout(residual),
        _layout(preact),
        a.device,
    )
