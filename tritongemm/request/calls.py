"""Each door's request: the operands as torch hands them to the op (``autocast.as_torch_sees``),
torch's argument checks (``checks``), and the same-batch views every function reduces to, handed
to the core (``batched.batched_gemm``) once, at the end.

``api``'s functions and ``nn.Linear`` call these when their call has no fast-path entry; the
arguments are positional, as the doors pass them, and checked here, once.  ``matmul``, ``mm``,
``linear`` and ``addmm`` take the ``key`` of the door's missed lookup and remember the call's entry
(``fastpath.build``) once it has run.
"""

from __future__ import annotations

import torch

from ..autograd.function import differentiated, traced_plain_gemm
from ..semantics import ACTIVATIONS, SUPPORTED_DTYPES, check_activation
from . import checks
from .autocast import as_torch_sees
from .batched import batched_gemm
from .fallback import device_unsupported_reason
from .fastpath import build, linear_kind, lookup

_functorch_active = torch._C._are_functorch_transforms_active
_PLAIN_TYPES = (torch.Tensor, torch.nn.Parameter)


def matmul(a, b, out_dtype, config, pipeline, decomposition, out, bias, activation, residual, key=None):
    """``api.matmul``'s whole way; with the ``key`` of the door's missed lookup, then its entry (``build``)."""
    y = _matmul(a, b, out_dtype, config, pipeline, decomposition, out, bias, activation, residual)
    if key is not None:
        build("matmul", key, a, b, None)
    return y


def mm(input, mat2, out_dtype, config, pipeline, decomposition, out, key=None):
    """``api.mm``'s whole way; with the ``key`` of the door's missed lookup, then its entry (``build``)."""
    y = _mm(input, mat2, out_dtype, config, pipeline, decomposition, out)
    if key is not None:
        build("mm", key, input, mat2, None)
    return y


def linear(input, weight, bias, activation, residual, out_dtype, config, pipeline, decomposition, key=None):
    """``api.linear``'s (and ``nn.Linear``'s) whole way; with the ``key`` of the door's missed lookup,
    then its entry (``build``)."""
    y = _linear(input, weight, bias, activation, residual, out_dtype, config, pipeline, decomposition)
    if key is not None:
        build(linear_kind(activation), key, input, weight, bias)
    return y


def traced_linear(input, weight, bias, activation: str = "none"):
    """``nn.Linear``'s GEMM in a ``torch.compile`` trace, or None for a call that takes the whole way.

    Dynamo executes every bytecode of the whole way for each layer it traces (its checks, its
    batch broadcasting and folding): about 1,200 a Linear, where torch's ``F.linear`` takes a few
    dozen, which was most of a converted model's extra compile time.  The common call -- operands
    of one supported dtype and device, a 2-D weight, a (N,) bias, rows that fold into one matrix
    -- makes here the same op call the whole way makes; anything else, and every error, goes there.
    An ``activation`` goes into the op where nothing will differentiate it, else after it as torch's
    op (``autograd.gemm_op``'s rule).
    """
    input, weight, bias, _ = as_torch_sees(input, weight, bias, None)
    dtype, device = input.dtype, input.device
    if not (
        input.dim() >= 2
        and weight.dim() == 2
        and input.shape[-1] == weight.shape[1]
        and input.shape[-1] > 0  # (K = 0: torch's exact empty sum, the whole way's)
        and input.layout == weight.layout == torch.strided
        and weight.dtype == dtype
        and weight.device == device
        and (
            bias is None or (bias.shape == weight.shape[:1] and bias.dtype == dtype and bias.device == device)
        )
        and dtype in SUPPORTED_DTYPES
        and device_unsupported_reason(device) is None
        and not _functorch_active()
    ):
        return None
    other = weight.mT
    rows = input if input.dim() == 2 else checks.fold_rows(input)
    if rows is None:
        return None
    n = weight.shape[0]
    addend = None if bias is None else bias.expand(rows.shape[0], n)
    split = activation != "none" and differentiated(input, weight, bias)  # (``gemm_op``'s rule)
    y = traced_plain_gemm(rows, other, addend, "none" if split else activation)
    if split:
        y = ACTIVATIONS[activation](y)
    return y if input.dim() == 2 else y.view(*input.shape[:-1], n)


def _operands(fn, a, b, b_name, bias, residual, out_dtype):
    """The operands as torch sees them (autocast's casts), checked as torch checks them."""
    a, b, bias, residual = as_torch_sees(a, b, bias, residual)
    if bias is None and residual is None:
        checks.check_pair(fn, a, b, b_name)
    else:
        extra = {n: t for n, t in (("bias", bias), ("residual", residual)) if t is not None}
        checks.check_tensors(fn, input=a, **{b_name: b}, **extra)
    checks.check_out_dtype(fn, out_dtype)
    return a, b, bias, residual


def _matmul(a, b, out_dtype, config, pipeline, decomposition, out, bias, activation, residual):
    a, b, bias, residual = _operands("matmul", a, b, "other", bias, residual, out_dtype)
    if a.dim() == 0 or b.dim() == 0:
        raise RuntimeError(
            f"matmul: both arguments to matmul need to be at least 1D, but they are {a.dim()}D and {b.dim()}D"
        )
    activation = check_activation("matmul", activation)
    fused = bias is not None or residual is not None or activation != "none"
    if fused and (a.dim() < 2 or b.dim() < 2):
        raise RuntimeError(
            f"matmul: bias/activation/residual need operands of at least 2 dimensions, got shapes "
            f"{checks.shape_str(a)} and {checks.shape_str(b)}"
        )
    # 1-D operands as matrices: a row (1, K) and a column (K, 1), squeezed from the result below.
    a2, b2 = checks.as_matrix(a), checks.as_matrix(b, column=True)
    checks.check_inner("matmul", a.shape, b.shape, a2.shape[-1], b2.shape[-2])
    out2 = out
    if out is not None and (a.dim() == 1 or b.dim() == 1):
        # 1-D operands: write through a view of `out` with the squeezed dims put back.
        batch = checks.broadcast_batch("matmul", a2, b2)
        full = (*batch, a2.shape[-2], b2.shape[-1])
        final = (*batch, *((a2.shape[-2],) if a.dim() > 1 else ()), *((b2.shape[-1],) if b.dim() > 1 else ()))
        checks.check_out("matmul", out, final, out_dtype or a.dtype, a, b)
        out2 = out.view(full)
    beta = 1.0 if fused else 0.0
    c = batched_gemm(
        "matmul",
        a2,
        b2,
        bias,
        1.0,
        beta,
        out_dtype,
        config,
        pipeline,
        out2,
        decomposition,
        activation,
        residual,
    )
    if out is not None:
        return out
    if a.dim() == 1:
        c = c.squeeze(-2)
    if b.dim() == 1:
        c = c.squeeze(-1)
    return c


def _mm(input, mat2, out_dtype, config, pipeline, decomposition, out):
    input, mat2 = as_torch_sees(input, mat2)
    checks.check_pair("mm", input, mat2, "mat2")
    checks.check_out_dtype("mm", out_dtype)
    if input.dim() != 2 or mat2.dim() != 2:
        raise RuntimeError(
            f"mm: expected 2-D matrices, got shapes {checks.shape_str(input)} ({input.dim()}-D) and {checks.shape_str(mat2)} ({mat2.dim()}-D)"
        )
    checks.check_inner("mm", input.shape, mat2.shape, input.shape[1], mat2.shape[0])
    return batched_gemm("mm", input, mat2, None, 1.0, 0.0, out_dtype, config, pipeline, out, decomposition)


def bmm(input, mat2, out_dtype, config, pipeline, decomposition, out):
    input, mat2 = as_torch_sees(input, mat2)
    checks.check_tensors("bmm", input=input, mat2=mat2)
    checks.check_out_dtype("bmm", out_dtype)
    if input.dim() != 3 or mat2.dim() != 3:
        raise RuntimeError(
            f"bmm: expected 3-D tensors, got shapes {checks.shape_str(input)} ({input.dim()}-D) and {checks.shape_str(mat2)} ({mat2.dim()}-D)"
        )
    if input.shape[0] != mat2.shape[0]:
        raise RuntimeError(
            f"bmm: batch1 and batch2 must have the same number of batches, got {input.shape[0]} and {mat2.shape[0]} "
            f"(shapes {checks.shape_str(input)} and {checks.shape_str(mat2)})"
        )
    checks.check_inner("bmm", input.shape, mat2.shape, input.shape[2], mat2.shape[1])
    return batched_gemm("bmm", input, mat2, None, 1.0, 0.0, out_dtype, config, pipeline, out, decomposition)


def addmm(input, mat1, mat2, beta, alpha, config, pipeline, decomposition, out, key=None):
    """``api.addmm``'s whole way; with the ``key`` of the door's missed lookup, then its entry (``build``)."""
    y = _addmm(input, mat1, mat2, beta, alpha, config, pipeline, decomposition, out)
    if key is not None:
        build("addmm", key, mat1, mat2, input)
    return y


def _addmm(input, mat1, mat2, beta, alpha, config, pipeline, decomposition, out):
    input, mat1, mat2 = as_torch_sees(input, mat1, mat2)
    checks.check_tensors("addmm", input=input, mat1=mat1, mat2=mat2)
    alpha, beta = checks.check_scalar("addmm", "alpha", alpha), checks.check_scalar("addmm", "beta", beta)
    if mat1.dim() != 2 or mat2.dim() != 2:
        raise RuntimeError(
            f"addmm: mat1 and mat2 must be matrices, got shapes {checks.shape_str(mat1)} and {checks.shape_str(mat2)}"
        )
    checks.check_inner("addmm", mat1.shape, mat2.shape, mat1.shape[1], mat2.shape[0])
    if input.dim() > 2:
        raise RuntimeError(f"addmm: input of shape {checks.shape_str(input)} has more than 2 dimensions")
    return batched_gemm("addmm", mat1, mat2, input, alpha, beta, None, config, pipeline, out, decomposition)


def baddbmm(input, batch1, batch2, beta, alpha, config, pipeline, decomposition, out):
    input, batch1, batch2 = as_torch_sees(input, batch1, batch2)
    checks.check_tensors("baddbmm", input=input, batch1=batch1, batch2=batch2)
    alpha, beta = checks.check_scalar("baddbmm", "alpha", alpha), checks.check_scalar("baddbmm", "beta", beta)
    if batch1.dim() != 3 or batch2.dim() != 3:
        raise RuntimeError(
            f"baddbmm: batch1 and batch2 must be 3-D, got shapes {checks.shape_str(batch1)} and {checks.shape_str(batch2)}"
        )
    if batch1.shape[0] != batch2.shape[0]:
        raise RuntimeError(
            f"baddbmm: batch1 and batch2 must have the same number of batches, got {batch1.shape[0]} and "
            f"{batch2.shape[0]} (shapes {checks.shape_str(batch1)} and {checks.shape_str(batch2)})"
        )
    checks.check_inner("baddbmm", batch1.shape, batch2.shape, batch1.shape[2], batch2.shape[1])
    if input.dim() > 3:
        raise RuntimeError(f"baddbmm: input of shape {checks.shape_str(input)} has more than 3 dimensions")
    return batched_gemm(
        "baddbmm", batch1, batch2, input, alpha, beta, None, config, pipeline, out, decomposition
    )


def _linear(input, weight, bias, activation, residual, out_dtype, config, pipeline, decomposition):
    input, weight, bias, residual = _operands("linear", input, weight, "weight", bias, residual, out_dtype)
    activation = check_activation("linear", activation)
    if input.dim() == 0 or weight.dim() == 0:
        raise RuntimeError(
            f"linear: both arguments to linear need to be at least 1D, but they are {input.dim()}D and "
            f"{weight.dim()}D"
        )
    if weight.dim() > 2:
        raise RuntimeError(
            f"linear: weight of shape {checks.shape_str(weight)} has {weight.dim()} dimensions (at most 2)"
        )
    if input.shape[-1] != weight.shape[-1]:
        raise RuntimeError(
            f"linear: input of shape {checks.shape_str(input)} and weight of shape {checks.shape_str(weight)} do not match "
            f"({input.shape[-1]} in-features != {weight.shape[-1]})"
        )
    if weight.dim() == 1:  # torch's matmul of input and the weight vector, as ``linear`` computes it
        if activation != "none" or residual is not None:
            raise RuntimeError("linear: activation/residual need a 2-D weight")
        if bias is not None and (input.dim() == 2 or (bias.dim() == 1 and input.is_contiguous())):
            # torch routes these through addmm, whose mat2 (weight.t()) must be a matrix.
            raise RuntimeError(
                f"linear: mat2 must be a matrix, got 1-D tensor (weight of shape {checks.shape_str(weight)})"
            )
        # torch adds the bias in place: it must broadcast into the result (input's rows) without growing it.
        added = checks.expand_to("linear", "bias", bias, input.shape[:-1])
        fn, other, addend, beta = "matmul", checks.as_matrix(weight, column=True), None, 0.0
    else:
        if (activation != "none" or residual is not None) and records_grad(input, weight, bias, residual):
            # Training: the plain linear (its fast path, its C++ backward node), then torch's ops.  Fused, z
            # is stored anyway and the generic autograd path cost more host time than the passes saved
            # (H100, 512 x 14336 x 4096 bf16, forward + backward: 0.99 ms a step fused, 0.33 ms so).
            residual = checks.expand_to("linear", "residual", residual, (*input.shape[:-1], weight.shape[0]))
            key = y = None
            if out_dtype is None and config is None and pipeline is None and decomposition is None:
                key, y = lookup("linear", input, weight, bias)
            if y is None:
                y = linear(input, weight, bias, None, None, out_dtype, config, pipeline, decomposition, key)
            y = ACTIVATIONS[activation](y)
            return y if residual is None else y + residual
        added = None
        fn, other, addend, beta = "linear", weight.mT, bias, 1.0
    x2 = checks.as_matrix(input)
    if residual is not None and input.dim() == 1:
        residual = residual.unsqueeze(0)
    y = batched_gemm(
        fn,
        x2,
        other,
        addend,
        1.0,
        beta,
        out_dtype,
        config,
        pipeline,
        None,
        decomposition,
        activation,
        residual,
    )
    if input.dim() == 1:
        y = y.squeeze(-2)
    if weight.dim() == 1:
        y = y.squeeze(-1)
    return y if added is None else y + added


def records_grad(*tensors) -> bool:
    """An eager call whose result autograd will differentiate (not a trace, not a torch.func transform);
    a fused activation's fast-path entries run only where it will not (``fastpath.linear_kind``)."""
    if not torch.is_grad_enabled() or _functorch_active() or torch.compiler.is_compiling():
        return False
    if type(tensors[0]) not in _PLAIN_TYPES:  # fake or functional tensors: a trace (``autograd.is_tracing``)
        return False
    return any(t is not None and t.requires_grad for t in tensors)


__all__ = ["addmm", "baddbmm", "bmm", "linear", "matmul", "mm"]
