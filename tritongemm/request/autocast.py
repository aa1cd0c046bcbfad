"""``torch.autocast`` as a call meets it on its way in: which dtype the matmul family computes in,
and the operands as torch hands them to the op (``as_torch_sees``).

Read by the doors' first step (``calls``), by the repeated-call key and entries (``fastpath``: an
entry runs on the operands as autocast casts them) and by ``fallback`` (autocast can make mixed
operands one dtype we run).
"""

from __future__ import annotations

import torch


def _autocast_query():
    """(is_enabled(device_type), dtype(device_type)) for this torch version."""
    try:  # torch >= 2.4: one API for every device type
        torch.is_autocast_enabled("cpu")
        torch.get_autocast_dtype("cpu")
        return torch.is_autocast_enabled, torch.get_autocast_dtype
    except (TypeError, AttributeError):  # older torch: a function per device type

        def enabled(device_type: str) -> bool:
            if device_type == "cpu":
                return torch.is_autocast_cpu_enabled()
            return device_type == "cuda" and torch.is_autocast_enabled()

        def dtype(device_type: str) -> torch.dtype:
            return torch.get_autocast_cpu_dtype() if device_type == "cpu" else torch.get_autocast_gpu_dtype()

        return enabled, dtype


_autocast_enabled, _autocast_dtype = _autocast_query()


def autocast_dtype(device: torch.device) -> torch.dtype | None:
    """The dtype torch's matmul family computes in under ``torch.autocast`` here, or None.

    matmul, mm, bmm, addmm, baddbmm and linear are on autocast's
    lower-precision list for both CUDA and CPU: floating-point operands are
    cast to the autocast dtype, except float64 ones (torch leaves those alone).
    """
    if device.type not in ("cuda", "cpu") or not _autocast_enabled(device.type):  # the devices we run on
        return None
    return _autocast_dtype(device.type)


def autocast_cast(dtype: torch.dtype, *tensors):
    """``tensors`` as autocast casts them (None and float64 pass through); differentiable."""
    return tuple(
        t.to(dtype)
        if isinstance(t, torch.Tensor) and t.is_floating_point() and t.dtype not in (dtype, torch.float64)
        else t
        for t in tensors
    )


def as_torch_sees(*tensors):
    """The operands as torch would hand them to the op.

    Under torch.autocast, matmul, mm, bmm, addmm, baddbmm and linear compute
    in the autocast dtype (fp32 operands cast, fp64 left alone); the casts are
    ordinary differentiable ``.to`` calls, so fp32 weights get fp32 gradients.
    A lazily negated view (``z.conj().imag``) is materialized: its storage
    holds the un-negated values, which a kernel would read.
    """
    first = tensors[0]
    if not isinstance(first, torch.Tensor):
        return tensors
    if not torch.compiler.is_compiling():  # a trace sees functional tensors: negation is already resolved
        for t in tensors:
            if isinstance(t, torch.Tensor) and t.is_neg():
                tensors = tuple(x.resolve_neg() if isinstance(x, torch.Tensor) else x for x in tensors)
                break
    if not _any_autocast():
        return tensors
    dtype = autocast_dtype(first.device)
    return tensors if dtype is None else autocast_cast(dtype, *tensors)


#: One C call that says whether autocast is on for any device (the common answer: no).
_any_autocast = getattr(torch._C, "_is_any_autocast_enabled", None) or (lambda: True)


__all__ = ["as_torch_sees", "autocast_cast", "autocast_dtype"]
