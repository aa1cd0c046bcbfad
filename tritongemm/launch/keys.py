"""The key a launcher is kept by (``launch.Plans.launchers``), with the ``GemmCall``.

``layout_signature(a, b, out, ...)``: the operands as the whole way hands them to the launch
layer, views made.  (A door's call as the user made it has a key of its own, read before any
check or view: ``request.fastpath.signature``, which keys ``Plans.entries``.)
"""

from __future__ import annotations


def layout(t) -> tuple | None:
    """One tensor's share of a launch's key: shape, strides, dtype, 16-byte alignment (None: absent)."""
    return None if t is None else (t.shape, t.stride(), t.dtype, not t.data_ptr() & 15)


def layout_signature(a, b, out, addend=None, residual=None, preact=None) -> tuple:
    """What a compiled launch depends on in the tensors: shapes, strides, dtypes, 16-byte alignment, device.

    Written out rather than looped: it runs on every call (a generator costs a microsecond more).
    """
    return (
        layout(a),
        layout(b),
        layout(out),
        layout(addend),
        layout(residual),
        layout(preact),
        a.device,
    )
