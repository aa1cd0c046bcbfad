"""Public functions with torch's signatures and semantics.

Each function validates its inputs (raising the exception type torch raises,
with the shapes and dtypes in the message), normalizes them into same-batch
operands using stride views only (``unsqueeze``, ``expand``, ``view``, ``mT``),
and calls the autograd op.
"""

from __future__ import annotations

import math
import warnings

import torch

from .autograd import gemm_op, needs_autograd, run_gemm
from .call import PLAIN_EPILOGUE, Epilogue, GemmCall, make_request
from .configs import TileConfig
from .semantics import (
    SUPPORTED_DTYPES,
    UnsupportedInputError,
    as_torch_sees,
    check_activation,
    device_unsupported_reason,
    dot_precision,
)

Config = TileConfig | dict | None
Pipeline = str | int | None


# ----------------------------------------------------------------------------------
# Validation
# ----------------------------------------------------------------------------------
def _shape(t: torch.Tensor) -> str:
    return str(tuple(t.shape))


def _check_tensors(fn: str, check_device: bool = True, **named) -> None:
    """Same dtype, same device, a dtype and device we run; torch's exception types.

    Called on every call, so the common case is a few attribute reads.
    """
    first = None
    for name, t in named.items():
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{fn}: argument '{name}' must be a Tensor, not {type(t).__name__}")
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
    if first.layout != torch.strided:
        raise UnsupportedInputError(f"{fn}: {first.layout} tensors are not supported (strided only)")
    if check_device and first.device not in _RUNNABLE_DEVICES:
        reason = device_unsupported_reason(first.device)
        if reason is not None:
            raise UnsupportedInputError(f"{fn}: {reason}")
        _RUNNABLE_DEVICES.add(first.device)


#: Devices that passed ``device_unsupported_reason`` (fixed per process: the
#: interpreter is chosen when the kernels are decorated), so the common call
#: skips the device check.
_RUNNABLE_DEVICES: set = set()


def _check_pair(fn: str, a, b, b_name: str = "other") -> None:
    """``_check_tensors(fn, input=a, other=b)`` for the common call, in a few attribute reads.

    Any doubt takes the full check, which raises torch's exception with the details.
    """
    if not (
        isinstance(a, torch.Tensor)
        and isinstance(b, torch.Tensor)
        and a.dtype == b.dtype
        and a.dtype in SUPPORTED_DTYPES
        and a.layout == torch.strided
        and b.layout == torch.strided
        and a.device == b.device
        and a.device in _RUNNABLE_DEVICES
    ):
        _check_tensors(fn, **{"input": a, b_name: b})


def _check_out(fn: str, out: torch.Tensor | None, shape, dtype, *inputs) -> torch.Tensor | None:
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
            f"{_shape(out)}, strides {tuple(out.stride())}) refers to a single memory location. Please clone() "
            "the tensor before performing the operation."
        )
    return out


def _broadcast_batch(fn: str, a: torch.Tensor, b: torch.Tensor) -> tuple[int, ...]:
    batch_a, batch_b = tuple(a.shape[:-2]), tuple(b.shape[:-2])
    if batch_a == batch_b or not batch_b:  # the common cases (torch.broadcast_shapes costs ~10 us)
        return batch_a
    if not batch_a:
        return batch_b
    try:
        return tuple(torch.broadcast_shapes(batch_a, batch_b))
    except RuntimeError:
        raise RuntimeError(
            f"{fn}: batch dimensions of {_shape(a)} and {_shape(b)} cannot be broadcast "
            f"({tuple(a.shape[:-2])} vs {tuple(b.shape[:-2])})"
        ) from None


def _check_inner(fn: str, a_shape, b_shape, ka: int, kb: int) -> None:
    if ka != kb:
        raise RuntimeError(
            f"{fn}: shapes {tuple(a_shape)} and {tuple(b_shape)} cannot be multiplied ({ka} != {kb})"
        )


def _check_scalar(fn: str, name: str, value) -> float:
    """torch's Scalar argument: a Python number (bool included) or a one-element tensor; else TypeError."""
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            raise RuntimeError(f"{fn}: {name} must be a scalar, got a tensor of shape {_shape(value)}")
        value = value.item()
    if isinstance(value, complex):
        raise RuntimeError(f"{fn}: complex {name}={value} is not supported for real operands")
    if not isinstance(value, (int, float)):  # bool is an int; strings, None, lists are not numbers
        raise TypeError(f"{fn}(): argument '{name}' must be a Number, not {type(value).__name__}")
    return float(value)


def _check_out_dtype(fn: str, out_dtype) -> None:
    if out_dtype is not None and out_dtype not in SUPPORTED_DTYPES:
        raise RuntimeError(
            f"{fn}: out_dtype {out_dtype} is not supported; use one of {list(SUPPORTED_DTYPES)}"
        )


def _expand_to(fn: str, name: str, t: torch.Tensor | None, shape) -> torch.Tensor | None:
    """``t`` broadcast to ``shape`` as a stride-0 view, or torch's error with both shapes."""
    if t is None:
        return None
    try:
        return t.expand(shape)
    except RuntimeError:
        raise RuntimeError(
            f"{fn}: {name} of shape {_shape(t)} cannot be broadcast to the result shape {tuple(shape)}"
        ) from None


def _fold_rows(a: torch.Tensor) -> torch.Tensor | None:
    """(*, M, K) as a (prod(*) * M, K) view, or None when the strides forbid it."""
    try:
        return a.view(-1, a.shape[-1])
    except RuntimeError:
        return None


def _call(a: torch.Tensor, epilogue: Epilogue, out_dtype, config, pipeline, decomposition) -> GemmCall:
    """The one value that describes this call from here down (see ``tritongemm.call``).

    Under torch.compile torch's TF32 switch cannot be read while tracing: the
    custom op reads it when it runs ("auto").
    """
    if a.dtype is not torch.float32:
        precision = "ieee"  # TF32 concerns float32 only
    else:
        precision = "auto" if torch.compiler.is_compiling() else dot_precision(a.dtype)
    return GemmCall(epilogue, make_request(config, pipeline, decomposition), out_dtype, precision)


def _epilogue(activation: str, alpha: float, beta: float, addend, residual) -> Epilogue:
    # torch's rule: beta=0 ignores the addend's values, NaN and Inf included (the kernel never reads it).
    reads_addend = addend is not None and beta != 0
    if activation == "none" and alpha == 1.0 and not reads_addend and residual is None:
        return PLAIN_EPILOGUE
    return Epilogue(activation, alpha, beta, reads_addend, residual is not None)


# ----------------------------------------------------------------------------------
# The core: batched, broadcast C = act(alpha * A @ B + beta * D) + R
# ----------------------------------------------------------------------------------
def _batched(
    fn: str,
    a: torch.Tensor,
    b: torch.Tensor,
    addend: torch.Tensor | None,
    alpha: float,
    beta: float,
    out_dtype,
    config: Config,
    pipeline: Pipeline,
    out: torch.Tensor | None,
    decomposition: str | None = None,
    activation: str = "none",
    residual: torch.Tensor | None = None,
) -> torch.Tensor:
    """a: (*, M, K) with a.dim() >= 2, b: (*, K, N) with b.dim() >= 2."""
    m, k = a.shape[-2:]
    n = b.shape[-1]
    batch = _broadcast_batch(fn, a, b)
    result_shape = (*batch, m, n)
    addend = _expand_to(fn, "input", addend, result_shape)
    residual = _expand_to(fn, "residual", residual, result_shape)
    extra = [t for t in (addend, residual) if t is not None]
    out = _check_out(fn, out, result_shape, out_dtype or a.dtype, a, b, *extra)
    if k == 0 and addend is not None and beta != 0 and activation == "none" and residual is None:
        # An empty sum: torch returns beta * input exactly (a -0.0 stays -0.0, which 0 + -0.0 would not).
        c = addend * beta if beta != 1 else addend.clone(memory_format=torch.contiguous_format)
        return out.copy_(c) if out is not None else c.to(out_dtype or a.dtype)
    call = _call(
        a, _epilogue(activation, alpha, beta, addend, residual), out_dtype, config, pipeline, decomposition
    )

    # Fold (*, M, K) @ (K, N) into one (prod(*) * M, K) @ (K, N) product when
    # B carries no batch and A's rows can be viewed as one matrix: a single
    # large GEMM instead of many small ones (torch.matmul does the same).
    if a.dim() > 2 and math.prod(b.shape[:-2]) == 1 and math.prod(a.shape[:-2]) == math.prod(batch):
        a2 = _fold_rows(a)
        d2 = _fold_rows(addend) if addend is not None else None
        r2 = _fold_rows(residual) if residual is not None else None
        if a2 is not None and (addend is None or d2 is not None) and (residual is None or r2 is not None):
            b2 = b.reshape(k, n)  # size-1 batch dims only: a view
            o2 = _fold_rows(out) if out is not None else None
            if out is None or o2 is not None:
                c2 = _run(call, a2, b2, d2, r2, o2)
                return out if out is not None else c2.view(result_shape)

    a_e = a if tuple(a.shape[:-2]) == batch else a.expand((*batch, m, k))
    b_e = b if tuple(b.shape[:-2]) == batch else b.expand((*batch, k, n))
    return _run(call, a_e, b_e, addend, residual, out)


def _run(call: GemmCall, a, b, addend=None, residual=None, out=None) -> torch.Tensor:
    """Launch directly when nothing needs autograd (microseconds a call), else through the autograd op.

    ``addend`` may be given while the epilogue does not read it (beta = 0): the
    autograd op still takes it, so its gradient is a zero tensor, as torch's.
    """
    if out is not None or not needs_autograd(call, a, b, addend, residual):
        return run_gemm(call, a, b, addend if call.epilogue.addend else None, residual, out)
    return gemm_op(call, a, b, addend, residual)


# ----------------------------------------------------------------------------------
# Public functions
# ----------------------------------------------------------------------------------
def matmul(
    a: torch.Tensor,
    b: torch.Tensor,
    *,
    out_dtype: torch.dtype | None = None,
    config: Config = None,
    pipeline: Pipeline = None,
    decomposition: str | None = None,
    out: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    activation: str | None = None,
    residual: torch.Tensor | None = None,
) -> torch.Tensor:
    """``torch.matmul`` on Triton: 1-D operands, batches and broadcasting included.

    >>> c = tritongemm.matmul(a, b, pipeline="multi_stage")
    >>> y = tritongemm.matmul(x, w.mT, bias=b, activation="gelu", residual=h)

    ``out_dtype`` stores the fp32 accumulator in another float dtype (e.g.
    fp16 inputs, fp32 output).  ``config`` (a ``TileConfig``), ``pipeline``
    ("single_stage", "double_buffer", "multi_stage", or a stage count) and
    ``decomposition`` ("sliced_k", "split_k", "stream_k") override the
    dispatcher's choice.  Under ``torch.autocast`` it computes in the autocast
    dtype, as ``torch.matmul`` does.

    Fused epilogue (2-D or batched operands): ``activation(a @ b + bias) +
    residual``, computed while the accumulator is in registers.  ``bias`` and
    ``residual`` broadcast to the result: a bias of shape (N,) is per output
    column (as ``F.linear``), one of shape (M, 1) per row.  ``activation`` is
    one of "relu", "gelu", "gelu_tanh", "silu".
    """
    a, b, bias, residual = as_torch_sees(a, b, bias, residual)
    if bias is None and residual is None:
        _check_pair("matmul", a, b, "other")
    else:
        _check_tensors(
            "matmul",
            input=a,
            other=b,
            **{n: t for n, t in (("bias", bias), ("residual", residual)) if t is not None},
        )
    _check_out_dtype("matmul", out_dtype)
    if a.dim() == 0 or b.dim() == 0:
        raise RuntimeError(
            f"matmul: both arguments to matmul need to be at least 1D, but they are {a.dim()}D and {b.dim()}D"
        )
    activation = check_activation("matmul", activation)
    if bias is not None or residual is not None or activation != "none":
        if a.dim() < 2 or b.dim() < 2:
            raise RuntimeError(
                f"matmul: bias/activation/residual need operands of at least 2 dimensions, got shapes "
                f"{_shape(a)} and {_shape(b)}"
            )
        _check_inner("matmul", a.shape, b.shape, a.shape[-1], b.shape[-2])
        return _batched(
            "matmul",
            a,
            b,
            bias,
            1.0,
            1.0,
            out_dtype,
            config,
            pipeline,
            out,
            decomposition,
            activation,
            residual,
        )
    if a.dim() == 2 and b.dim() == 2 and out is None:  # the common case, kept short
        _check_inner("matmul", a.shape, b.shape, a.shape[1], b.shape[0])
        return _run(_call(a, PLAIN_EPILOGUE, out_dtype, config, pipeline, decomposition), a, b)
    a2 = a.unsqueeze(0) if a.dim() == 1 else a
    b2 = b.unsqueeze(-1) if b.dim() == 1 else b
    _check_inner("matmul", a.shape, b.shape, a2.shape[-1], b2.shape[-2])
    if out is not None and (a.dim() == 1 or b.dim() == 1):
        # 1-D operands: write through a view of `out` with the squeezed dims put back.
        batch = _broadcast_batch("matmul", a2, b2)
        full = (*batch, a2.shape[-2], b2.shape[-1])
        final = (*batch, *((a2.shape[-2],) if a.dim() > 1 else ()), *((b2.shape[-1],) if b.dim() > 1 else ()))
        _check_out("matmul", out, final, out_dtype or a.dtype, a, b)
        _batched("matmul", a2, b2, None, 1.0, 0.0, out_dtype, config, pipeline, out.view(full), decomposition)
        return out
    c = _batched("matmul", a2, b2, None, 1.0, 0.0, out_dtype, config, pipeline, out, decomposition)
    if a.dim() == 1:
        c = c.squeeze(-2)
    if b.dim() == 1:
        c = c.squeeze(-1)
    return c


def mm(
    input: torch.Tensor,
    mat2: torch.Tensor,
    *,
    out_dtype: torch.dtype | None = None,
    config: Config = None,
    pipeline: Pipeline = None,
    decomposition: str | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """``torch.mm``: (n, m) @ (m, p) -> (n, p).

    >>> c = tritongemm.mm(a, b)
    """
    input, mat2 = as_torch_sees(input, mat2)
    _check_pair("mm", input, mat2, "mat2")
    _check_out_dtype("mm", out_dtype)
    if input.dim() != 2 or mat2.dim() != 2:
        raise RuntimeError(
            f"mm: expected 2-D matrices, got shapes {_shape(input)} ({input.dim()}-D) and {_shape(mat2)} ({mat2.dim()}-D)"
        )
    _check_inner("mm", input.shape, mat2.shape, input.shape[1], mat2.shape[0])
    return _batched("mm", input, mat2, None, 1.0, 0.0, out_dtype, config, pipeline, out, decomposition)


def bmm(
    input: torch.Tensor,
    mat2: torch.Tensor,
    *,
    out_dtype: torch.dtype | None = None,
    config: Config = None,
    pipeline: Pipeline = None,
    decomposition: str | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """``torch.bmm``: (b, n, m) @ (b, m, p) -> (b, n, p), no broadcasting.

    >>> c = tritongemm.bmm(a, b)
    """
    input, mat2 = as_torch_sees(input, mat2)
    _check_tensors("bmm", input=input, mat2=mat2)
    _check_out_dtype("bmm", out_dtype)
    if input.dim() != 3 or mat2.dim() != 3:
        raise RuntimeError(
            f"bmm: expected 3-D tensors, got shapes {_shape(input)} ({input.dim()}-D) and {_shape(mat2)} ({mat2.dim()}-D)"
        )
    if input.shape[0] != mat2.shape[0]:
        raise RuntimeError(
            f"bmm: batch1 and batch2 must have the same number of batches, got {input.shape[0]} and {mat2.shape[0]} "
            f"(shapes {_shape(input)} and {_shape(mat2)})"
        )
    _check_inner("bmm", input.shape, mat2.shape, input.shape[2], mat2.shape[1])
    return _batched("bmm", input, mat2, None, 1.0, 0.0, out_dtype, config, pipeline, out, decomposition)


def addmm(
    input: torch.Tensor,
    mat1: torch.Tensor,
    mat2: torch.Tensor,
    *,
    beta=1,
    alpha=1,
    config: Config = None,
    pipeline: Pipeline = None,
    decomposition: str | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """``torch.addmm``: beta * input + alpha * (mat1 @ mat2), fused in the kernel's epilogue.

    As in torch, ``beta=0`` ignores the values of ``input`` (NaN/Inf in it do
    not propagate; its gradient is zero).

    >>> y = tritongemm.addmm(bias, x, w, beta=1, alpha=0.5)
    """
    input, mat1, mat2 = as_torch_sees(input, mat1, mat2)
    _check_tensors("addmm", input=input, mat1=mat1, mat2=mat2)
    alpha, beta = _check_scalar("addmm", "alpha", alpha), _check_scalar("addmm", "beta", beta)
    if mat1.dim() != 2 or mat2.dim() != 2:
        raise RuntimeError(
            f"addmm: mat1 and mat2 must be matrices, got shapes {_shape(mat1)} and {_shape(mat2)}"
        )
    _check_inner("addmm", mat1.shape, mat2.shape, mat1.shape[1], mat2.shape[0])
    if input.dim() > 2:
        raise RuntimeError(f"addmm: input of shape {_shape(input)} has more than 2 dimensions")
    return _batched("addmm", mat1, mat2, input, alpha, beta, None, config, pipeline, out, decomposition)


def baddbmm(
    input: torch.Tensor,
    batch1: torch.Tensor,
    batch2: torch.Tensor,
    *,
    beta=1,
    alpha=1,
    config: Config = None,
    pipeline: Pipeline = None,
    decomposition: str | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """``torch.baddbmm``: beta * input + alpha * (batch1 @ batch2), batched.

    >>> y = tritongemm.baddbmm(c, a, b, beta=0.5)
    """
    input, batch1, batch2 = as_torch_sees(input, batch1, batch2)
    _check_tensors("baddbmm", input=input, batch1=batch1, batch2=batch2)
    alpha, beta = _check_scalar("baddbmm", "alpha", alpha), _check_scalar("baddbmm", "beta", beta)
    if batch1.dim() != 3 or batch2.dim() != 3:
        raise RuntimeError(
            f"baddbmm: batch1 and batch2 must be 3-D, got shapes {_shape(batch1)} and {_shape(batch2)}"
        )
    if batch1.shape[0] != batch2.shape[0]:
        raise RuntimeError(
            f"baddbmm: batch1 and batch2 must have the same number of batches, got {batch1.shape[0]} and "
            f"{batch2.shape[0]} (shapes {_shape(batch1)} and {_shape(batch2)})"
        )
    _check_inner("baddbmm", batch1.shape, batch2.shape, batch1.shape[2], batch2.shape[1])
    if input.dim() > 3:
        raise RuntimeError(f"baddbmm: input of shape {_shape(input)} has more than 3 dimensions")
    return _batched("baddbmm", batch1, batch2, input, alpha, beta, None, config, pipeline, out, decomposition)


def linear(
    input: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    activation: str | None = None,
    residual: torch.Tensor | None = None,
    out_dtype: torch.dtype | None = None,
    config: Config = None,
    pipeline: Pipeline = None,
    decomposition: str | None = None,
) -> torch.Tensor:
    """``torch.nn.functional.linear``: input @ weight.T + bias, the bias added in the epilogue.

    >>> y = tritongemm.linear(x, layer.weight, layer.bias)
    >>> y = tritongemm.linear(x, w_up, b_up, activation="gelu")          # Linear + bias + GELU, one kernel
    >>> h = tritongemm.linear(y, w_down, b_down, residual=h)             # ... + residual add

    The epilogue computes ``activation(input @ weight.T + bias) + residual``.
    """
    input, weight, bias, residual = as_torch_sees(input, weight, bias, residual)
    if bias is None and residual is None:
        _check_pair("linear", input, weight, "weight")
    else:
        _check_tensors(
            "linear",
            input=input,
            weight=weight,
            **{n: t for n, t in (("bias", bias), ("residual", residual)) if t is not None},
        )
    _check_out_dtype("linear", out_dtype)
    activation = check_activation("linear", activation)
    if input.dim() == 0 or weight.dim() == 0:
        raise RuntimeError(
            f"linear: both arguments to linear need to be at least 1D, but they are {input.dim()}D and "
            f"{weight.dim()}D"
        )
    if weight.dim() > 2:
        raise RuntimeError(
            f"linear: weight of shape {_shape(weight)} has {weight.dim()} dimensions (at most 2)"
        )
    if input.shape[-1] != weight.shape[-1]:
        raise RuntimeError(
            f"linear: input of shape {_shape(input)} and weight of shape {_shape(weight)} do not match "
            f"({input.shape[-1]} in-features != {weight.shape[-1]})"
        )
    if weight.dim() == 1:
        if activation != "none" or residual is not None:
            raise RuntimeError("linear: activation/residual need a 2-D weight")
        if bias is not None and (input.dim() == 2 or (bias.dim() == 1 and input.is_contiguous())):
            # torch routes these through addmm, whose mat2 (weight.t()) must be a matrix.
            raise RuntimeError(
                f"linear: mat2 must be a matrix, got 1-D tensor (weight of shape {_shape(weight)})"
            )
        y = matmul(
            input, weight, config=config, pipeline=pipeline, decomposition=decomposition, out_dtype=out_dtype
        )
        if bias is None:
            return y
        # torch adds the bias in place: it must broadcast into the result without growing it.
        return y + _expand_to("linear", "bias", bias, y.shape)
    x2 = input.unsqueeze(0) if input.dim() == 1 else input
    if residual is not None and input.dim() == 1:
        residual = residual.unsqueeze(0)
    y = _batched(
        "linear",
        x2,
        weight.mT,
        bias,
        1.0,
        1.0,
        out_dtype,
        config,
        pipeline,
        None,
        decomposition,
        activation,
        residual,
    )
    return y.squeeze(-2) if input.dim() == 1 else y


__all__ = ["matmul", "mm", "bmm", "addmm", "baddbmm", "linear"]
