"""Argument checks with torch's rules: the exception type torch raises, with the shapes and dtypes in the message.

Called by ``api``'s functions (and ``explain``) on every call that does not
run from a fast-path entry, so the common case is a few attribute reads.
"""

from __future__ import annotations

import warnings

import torch

from ..semantics import SUPPORTED_DTYPES, UnsupportedInputError
from .fallback import device_unsupported_reason, jit_trace_reason, jit_tracing_state


# ----------------------------------------------------------------------------------
# Validation
# ----------------------------------------------------------------------------------
def shape_str(t: torch.Tensor) -> str:
    return str(tuple(t.shape))


def check_tensor_args(fn: str, **named) -> None:
    """torch's TypeError for an argument that is neither a tensor nor None (a function's optional operands)."""
    for name, t in named.items():
        if t is not None and not isinstance(t, torch.Tensor):
            raise TypeError(f"{fn}(): argument '{name}' must be Tensor, not {type(t).__name__}")


def check_tensors(fn: str, check_device: bool = True, **named) -> None:
    """Same dtype, same device, a dtype and device we run; torch's exception types.

    Called on every call, so the common case is a few attribute reads.
    """
    first = None
    for name, t in named.items():
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{fn}: argument '{name}' must be a Tensor, not {type(t).__name__}")
        # every operand's layout: a sparse weight beside a dense input too
        if t.layout != torch.strided or t.is_nested:
            kind = "nested" if t.is_nested else str(t.layout)
            raise UnsupportedInputError(f"{fn}: {kind} tensors are not supported (strided only)")
        if first is None:
            first = t
        elif t.dtype != first.dtype:
            desc = ", ".join(f"{n}: {x.dtype}" for n, x in named.items())
            raise RuntimeError(f"{fn}: expected all operands to have the same dtype, but got {desc}")
        elif t.device != first.device:
            desc = ", ".join(f"{n}: {x.device}" for n, x in named.items())
            raise RuntimeError(f"{fn}: expected all tensors to be on the same device, but got {desc}")
    if first.dtype not in SUPPORTED_DTYPES:
        # torch raises NotImplementedError for a dtype its kernels lack (e.g. bool); ours is one too.
        raise UnsupportedInputError(
            f"{fn}: dtype {first.dtype} is not supported; tritongemm runs float16, bfloat16, float32 and float64"
        )
    reason = jit_trace_reason()
    if reason is not None:
        raise UnsupportedInputError(f"{fn}: {reason}")
    if check_device and not _known_runnable(first.device):
        reason = device_unsupported_reason(first.device)
        if reason is not None:
            raise UnsupportedInputError(f"{fn}: {reason}")
        if not torch.compiler.is_compiling():
            RUNNABLE_DEVICES.add(first.device)


#: Devices that passed ``device_unsupported_reason`` (fixed per process: the
#: interpreter is chosen when the kernels are decorated), so the common call
#: skips the device check.
RUNNABLE_DEVICES: set = set()


def _known_runnable(device: torch.device) -> bool:
    """Has ``device`` passed the device check?  Never while tracing: Dynamo guards on what a traced
    read of this set found, and as eager calls fill it the guard fails and the model compiles again."""
    return not torch.compiler.is_compiling() and device in RUNNABLE_DEVICES


def check_pair(fn: str, a, b, b_name: str = "other") -> None:
    """``check_tensors(fn, input=a, other=b)`` for the common call, in a few attribute reads.

    Any doubt takes the full check, which raises torch's exception with the details.
    """
    if not (
        isinstance(a, torch.Tensor)
        and isinstance(b, torch.Tensor)
        and a.dtype == b.dtype
        and a.dtype in SUPPORTED_DTYPES
        and a.layout == torch.strided
        and b.layout == torch.strided
        and not a.is_nested
        and not b.is_nested
        and a.device == b.device
        and _known_runnable(a.device)
        and jit_tracing_state() is None  # (``jit_trace_reason``, inlined: every call asks)
    ):
        check_tensors(fn, **{"input": a, b_name: b})


def check_out(fn: str, out: torch.Tensor | None, shape, dtype, *inputs) -> torch.Tensor | None:
    """torch's rules for ``out=``: type, no autograd, dtype, device, no self-overlap; resized (with
    torch's warning) when its shape differs."""
    if out is None:
        return None
    if not isinstance(out, torch.Tensor):
        raise TypeError(f"{fn}: argument 'out' must be a Tensor, not {type(out).__name__}")
    if torch.is_grad_enabled() and (
        out.requires_grad or any(t.requires_grad for t in inputs if isinstance(t, torch.Tensor))
    ):
        raise RuntimeError(
            f"{fn}(): functions with out=... arguments don't support automatic differentiation, "
            "but one of the arguments requires grad."
        )
    if out.dtype != dtype:
        raise RuntimeError(f"{fn}: expected out to have dtype {dtype}, but got {out.dtype}")
    if out.device != inputs[0].device:
        raise RuntimeError(f"{fn}: expected out on {inputs[0].device}, but got {out.device}")
    if tuple(out.shape) != tuple(shape):
        if out.numel() != 0:
            warnings.warn(
                f"{fn}: an output with one or more elements was resized since it had shape {list(out.shape)}, "
                f"which does not match the required output shape {list(shape)}. (torch does the same, and "
                "deprecates it: pass an out of the right shape or an empty one.)",
                UserWarning,
                stacklevel=3,
            )
        out.resize_(shape)
    if torch._debug_has_internal_overlap(out) == 1:
        raise RuntimeError(
            f"{fn}: unsupported operation: more than one element of the written-to tensor (out, shape "
            f"{shape_str(out)}, strides {tuple(out.stride())}) refers to a single memory location. Please clone() "
            "the tensor before performing the operation."
        )
    return out


def broadcast_batch(fn: str, a: torch.Tensor, b: torch.Tensor) -> tuple[int, ...]:
    batch_a, batch_b = tuple(a.shape[:-2]), tuple(b.shape[:-2])
    if batch_a == batch_b or not batch_b:  # the common cases (torch.broadcast_shapes costs ~10 us)
        return batch_a
    if not batch_a:
        return batch_b
    try:
        return tuple(torch.broadcast_shapes(batch_a, batch_b))
    except RuntimeError:
        raise RuntimeError(
            f"{fn}: batch dimensions of {shape_str(a)} and {shape_str(b)} cannot be broadcast "
            f"({tuple(a.shape[:-2])} vs {tuple(b.shape[:-2])})"
        ) from None


def check_inner(fn: str, a_shape, b_shape, ka: int, kb: int) -> None:
    if ka != kb:
        raise RuntimeError(
            f"{fn}: shapes {tuple(a_shape)} and {tuple(b_shape)} cannot be multiplied ({ka} != {kb})"
        )


def check_scalar(fn: str, name: str, value) -> float:
    """torch's Scalar argument: a Python number (bool included) or a one-element tensor; else TypeError."""
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            raise RuntimeError(f"{fn}: {name} must be a scalar, got a tensor of shape {shape_str(value)}")
        value = value.item()
    if isinstance(value, complex):
        raise RuntimeError(f"{fn}: complex {name}={value} is not supported for real operands")
    if not isinstance(value, (int, float)):  # bool is an int; strings, None, lists are not numbers
        raise TypeError(f"{fn}(): argument '{name}' must be a Number, not {type(value).__name__}")
    return float(value)


def check_out_dtype(fn: str, out_dtype) -> None:
    if out_dtype is not None and out_dtype not in SUPPORTED_DTYPES:
        raise RuntimeError(
            f"{fn}: out_dtype {out_dtype} is not supported; use one of {list(SUPPORTED_DTYPES)}"
        )


def expand_to(fn: str, name: str, t: torch.Tensor | None, shape) -> torch.Tensor | None:
    """``t`` broadcast to ``shape`` as a stride-0 view, or torch's error with both shapes."""
    if t is None:
        return None
    try:
        return t.expand(shape)
    except RuntimeError:
        raise RuntimeError(
            f"{fn}: {name} of shape {shape_str(t)} cannot be broadcast to the result shape {tuple(shape)}"
        ) from None


def as_matrix(t: torch.Tensor, column: bool = False) -> torch.Tensor:
    """A 1-D operand as the matrix torch.matmul makes of it, a row (1, K) or a ``column`` (K, 1); else ``t``."""
    if t.dim() != 1:
        return t
    return t.unsqueeze(-1) if column else t.unsqueeze(0)


def fold_rows(a: torch.Tensor) -> torch.Tensor | None:
    """(*, M, K) as a (prod(*) * M, K) view, or None when the strides forbid it."""
    try:
        return a.view(-1, a.shape[-1])
    except RuntimeError:
        return None
