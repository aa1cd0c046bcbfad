"""Public functions with torch's signatures and semantics.

Each function validates its inputs (raising the exception type torch raises,
with the shapes and dtypes in the message), normalizes them into same-batch
operands using stride views only (``unsqueeze``, ``expand``, ``view``, ``mT``),
and hands them to ``batched.batched_gemm`` (or, for a plain 2-D product, ``batched.run``).
"""

from __future__ import annotations

import torch

from ..autograd import fastpath
from ..autograd.function import is_tracing
from ..planning.call import PLAIN_EPILOGUE
from ..request import checks
from ..request.batched import Config, Pipeline, batched_gemm, gemm_call, run
from ..semantics import ACTIVATIONS, as_torch_sees, check_activation

_functorch_active = torch._C._are_functorch_transforms_active


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
    plain = (
        out_dtype is None
        and config is None
        and pipeline is None
        and decomposition is None
        and out is None
        and bias is None
        and activation is None
        and residual is None
    )
    if plain:
        key, y = fastpath.lookup("matmul", a, b, None)
        if y is not None:
            return y
    y = _matmul(a, b, out_dtype, config, pipeline, decomposition, out, bias, activation, residual)
    if plain and key is not None:
        fastpath.build("matmul", key, a, b, None)
    return y


def _matmul(a, b, out_dtype, config, pipeline, decomposition, out, bias, activation, residual):
    a, b, bias, residual = as_torch_sees(a, b, bias, residual)
    if bias is None and residual is None:
        checks.check_pair("matmul", a, b, "other")
    else:
        checks.check_tensors(
            "matmul",
            input=a,
            other=b,
            **{n: t for n, t in (("bias", bias), ("residual", residual)) if t is not None},
        )
    checks.check_out_dtype("matmul", out_dtype)
    if a.dim() == 0 or b.dim() == 0:
        raise RuntimeError(
            f"matmul: both arguments to matmul need to be at least 1D, but they are {a.dim()}D and {b.dim()}D"
        )
    activation = check_activation("matmul", activation)
    if bias is not None or residual is not None or activation != "none":
        if a.dim() < 2 or b.dim() < 2:
            raise RuntimeError(
                f"matmul: bias/activation/residual need operands of at least 2 dimensions, got shapes "
                f"{checks.shape_str(a)} and {checks.shape_str(b)}"
            )
        checks.check_inner("matmul", a.shape, b.shape, a.shape[-1], b.shape[-2])
        return batched_gemm(
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
        checks.check_inner("matmul", a.shape, b.shape, a.shape[1], b.shape[0])
        return run(gemm_call(a, PLAIN_EPILOGUE, out_dtype, config, pipeline, decomposition), a, b)
    a2 = a.unsqueeze(0) if a.dim() == 1 else a
    b2 = b.unsqueeze(-1) if b.dim() == 1 else b
    checks.check_inner("matmul", a.shape, b.shape, a2.shape[-1], b2.shape[-2])
    if out is not None and (a.dim() == 1 or b.dim() == 1):
        # 1-D operands: write through a view of `out` with the squeezed dims put back.
        batch = checks.broadcast_batch("matmul", a2, b2)
        full = (*batch, a2.shape[-2], b2.shape[-1])
        final = (*batch, *((a2.shape[-2],) if a.dim() > 1 else ()), *((b2.shape[-1],) if b.dim() > 1 else ()))
        checks.check_out("matmul", out, final, out_dtype or a.dtype, a, b)
        batched_gemm(
            "matmul", a2, b2, None, 1.0, 0.0, out_dtype, config, pipeline, out.view(full), decomposition
        )
        return out
    c = batched_gemm("matmul", a2, b2, None, 1.0, 0.0, out_dtype, config, pipeline, out, decomposition)
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
    plain = (
        out_dtype is None and config is None and pipeline is None and decomposition is None and out is None
    )
    if plain:
        key, y = fastpath.lookup("mm", input, mat2, None)
        if y is not None:
            return y
    y = _mm(input, mat2, out_dtype, config, pipeline, decomposition, out)
    if plain and key is not None:
        fastpath.build("mm", key, input, mat2, None)
    return y


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
    plain = (
        (activation is None or activation == "none")
        and residual is None
        and out_dtype is None
        and config is None
        and pipeline is None
        and decomposition is None
    )
    if plain:
        key, y = fastpath.lookup("linear", input, weight, bias)
        if y is not None:
            return y
    y = _linear(input, weight, bias, activation, residual, out_dtype, config, pipeline, decomposition)
    if plain and key is not None:
        fastpath.build("linear", key, input, weight, bias)
    return y


def _linear(input, weight, bias, activation, residual, out_dtype, config, pipeline, decomposition):
    input, weight, bias, residual = as_torch_sees(input, weight, bias, residual)
    if bias is None and residual is None:
        checks.check_pair("linear", input, weight, "weight")
    else:
        checks.check_tensors(
            "linear",
            input=input,
            weight=weight,
            **{n: t for n, t in (("bias", bias), ("residual", residual)) if t is not None},
        )
    checks.check_out_dtype("linear", out_dtype)
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
    if weight.dim() == 1:
        if activation != "none" or residual is not None:
            raise RuntimeError("linear: activation/residual need a 2-D weight")
        if bias is not None and (input.dim() == 2 or (bias.dim() == 1 and input.is_contiguous())):
            # torch routes these through addmm, whose mat2 (weight.t()) must be a matrix.
            raise RuntimeError(
                f"linear: mat2 must be a matrix, got 1-D tensor (weight of shape {checks.shape_str(weight)})"
            )
        y = matmul(
            input, weight, config=config, pipeline=pipeline, decomposition=decomposition, out_dtype=out_dtype
        )
        if bias is None:
            return y
        # torch adds the bias in place: it must broadcast into the result without growing it.
        return y + checks.expand_to("linear", "bias", bias, y.shape)
    if (activation != "none" or residual is not None) and _trains(input, weight, bias, residual):
        # Training: the plain linear (its fast path, its C++ backward node), then torch's ops.  Fused, z is
        # stored anyway and the generic autograd path cost more host time than the passes saved (H100,
        # 512 x 14336 x 4096 bf16, forward + backward: 0.99 ms a step fused, 0.33 ms so).
        y = linear(
            input,
            weight,
            bias,
            out_dtype=out_dtype,
            config=config,
            pipeline=pipeline,
            decomposition=decomposition,
        )
        y = ACTIVATIONS[activation](y)
        return y if residual is None else y + checks.expand_to("linear", "residual", residual, y.shape)
    x2 = input.unsqueeze(0) if input.dim() == 1 else input
    if residual is not None and input.dim() == 1:
        residual = residual.unsqueeze(0)
    y = batched_gemm(
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


def _trains(*tensors) -> bool:
    """An eager call whose result autograd will differentiate (not a trace, not a torch.func transform)."""
    if not torch.is_grad_enabled() or _functorch_active() or is_tracing(tensors[0]):
        return False
    return any(t is not None and t.requires_grad for t in tensors)


__all__ = ["matmul", "mm", "bmm", "addmm", "baddbmm", "linear"]
