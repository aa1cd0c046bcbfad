"""torch's rules that every layer reads, each in one place.

* the dtypes we run and their names;
* the TF32 rule for float32 matmuls;
* the fused activations: their names, torch forms and derivatives.

Everything above this module (selection, launch, autograd, the request, ``nn``,
``patch``) asks here rather than re-deciding.  The rules a call meets on its
way in, before any view is made, belong to the request (``request.autocast``:
which dtype ``torch.autocast`` computes in; ``request.fallback``: which
operands, layouts and devices we run, and why not, in words).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

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


def fp32_precision() -> str:
    """``tl.dot``'s input precision for float32 operands, read from torch's settings now."""
    return "tf32" if tf32_enabled() else "ieee"


def dot_precision(dtype: torch.dtype) -> str:
    """``tl.dot``'s input precision for operands of ``dtype``, read from torch's settings now."""
    if dtype != torch.float32:
        return "ieee"
    return "tf32" if tf32_enabled() else "ieee"


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


#: The derivative epilogue of each activation: a GEMM computing ``dL / d act(z)`` that stores
#: ``dL / dz = (its result) * act'(z)`` instead, reading the saved pre-activation ``z`` in the residual's
#: place (``Epilogue(activation=DERIVATIVE_EPILOGUES[act], residual=True)``).  Used by backward passes
#: (``autograd.mlp``); not a user-facing activation.
DERIVATIVE_EPILOGUES = {
    "relu": "relu_grad",
    "gelu": "gelu_grad",
    "gelu_tanh": "gelu_tanh_grad",
    "silu": "silu_grad",
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
    "DERIVATIVE_EPILOGUES",
    "SUPPORTED_DTYPES",
    "UnsupportedInputError",
    "activation_backward",
    "check_activation",
    "dot_precision",
    "dtype_name",
    "fp32_precision",
    "tf32_enabled",
]
