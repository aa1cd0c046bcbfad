"""torch's rules that tritongemm follows, each in one place.

* which dtypes, layouts and devices we run (and why not, in words);
* the TF32 rule for float32 matmuls;
* ``torch.autocast``: which dtype a call computes in;
* the fused activations: their names, torch forms and derivatives.

Everything above this module (selection, launch, autograd, the API, ``nn``,
``patch``) asks here rather than re-deciding.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .device import interpreter_enabled

SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)

#: Names used in ``GemmProblem.dtype``, the tuning cache and the CLI.
DTYPE_NAMES: dict[torch.dtype, str] = {
    torch.float16: "float16",
    torch.bfloat16: "bfloat16",
    torch.float32: "float32",
    torch.float64: "float64",
}


class UnsupportedInputError(NotImplementedError):
    """Inputs tritongemm cannot run (dtype, device); ``patch()`` falls back to torch on these.

    A ``NotImplementedError`` (so a ``RuntimeError`` too), as torch raises for a
    dtype its kernels lack (``torch.mm`` on bool tensors).
    """


def dtype_name(dtype: torch.dtype) -> str:
    return DTYPE_NAMES.get(dtype, str(dtype).replace("torch.", ""))


# ----------------------------------------------------------------------------------
# What we can run
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


# ----------------------------------------------------------------------------------
# float32: TF32 or IEEE
# ----------------------------------------------------------------------------------
def _tf32_queries():
    """(fp32 matmul precision or None, legacy allow_tf32): the C getters behind
    ``torch.backends.cuda.matmul``'s properties where this torch has them and
    they agree with the properties now (~0.2 us against ~1.3 through the
    properties, on every fp32 call); else the properties."""
    matmul = torch.backends.cuda.matmul
    get_precision = getattr(torch._C, "_get_fp32_precision_getter", None)  # torch >= 2.9
    get_allow = getattr(torch._C, "_get_cublas_allow_tf32", None)
    try:
        agree = get_allow is not None and get_allow() == matmul.allow_tf32
        if get_precision is not None:
            agree = agree and get_precision("cuda", "matmul") == matmul.fp32_precision
    except (TypeError, RuntimeError, AttributeError):
        agree = False
    if not agree:
        return (lambda: getattr(matmul, "fp32_precision", None)), (lambda: matmul.allow_tf32)
    if get_precision is None:
        return (lambda: None), get_allow
    return (lambda: get_precision("cuda", "matmul")), get_allow


_fp32_precision, _allow_tf32 = _tf32_queries()


def tf32_enabled() -> bool:
    """Does torch let float32 matmuls use TF32?  The same rule torch follows."""
    precision = _fp32_precision()
    if precision == "tf32":
        return True
    if precision == "ieee":
        return False
    return bool(_allow_tf32())


def dot_precision(dtype: torch.dtype) -> str:
    """``tl.dot``'s input precision for operands of ``dtype``, read from torch's settings now."""
    if dtype != torch.float32:
        return "ieee"
    return "tf32" if tf32_enabled() else "ieee"


# ----------------------------------------------------------------------------------
# torch.autocast
# ----------------------------------------------------------------------------------
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


# ----------------------------------------------------------------------------------
# Fused activations
# ----------------------------------------------------------------------------------
#: The epilogue's activations and what torch computes for each.
ACTIVATIONS = {
    "none": lambda x: x,
    "relu": F.relu,
    "gelu": F.gelu,
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "silu": F.silu,
}


def check_activation(fn: str, activation: str | None) -> str:
    """``activation`` as the epilogue names it ("none" for None), or torch's ValueError."""
    if activation is None:
        return "none"
    if activation not in ACTIVATIONS:
        raise ValueError(f"{fn}: unknown activation {activation!r}; choose one of {list(ACTIVATIONS)}")
    return activation


def activation_backward(grad: torch.Tensor, z: torch.Tensor, activation: str) -> torch.Tensor:
    """d act(z) / dz * grad, with torch's own derivative kernels."""
    if activation == "none":
        return grad
    if activation == "relu":
        return torch.ops.aten.threshold_backward(grad, z, 0)
    if activation == "gelu":
        return torch.ops.aten.gelu_backward(grad, z, approximate="none")
    if activation == "gelu_tanh":
        return torch.ops.aten.gelu_backward(grad, z, approximate="tanh")
    if activation == "silu":
        return torch.ops.aten.silu_backward(grad, z)
    raise ValueError(f"unknown activation {activation!r}")


__all__ = [
    "ACTIVATIONS",
    "SUPPORTED_DTYPES",
    "UnsupportedInputError",
    "activation_backward",
    "autocast_cast",
    "autocast_dtype",
    "as_torch_sees",
    "check_activation",
    "device_unsupported_reason",
    "dot_precision",
    "dtype_name",
    "tf32_enabled",
    "unsupported_reason",
]
