"""Public functions with torch's signatures and semantics.

Each is a door: a call of the common forms (``matmul``, ``mm``, ``linear``, ``addmm`` with
none of the optional arguments) first asks for its fast-path entry
(``request.fastpath.lookup``); every other call goes to its request
(``request.calls``), which validates the inputs (raising the exception type torch
raises, with the shapes and dtypes in the message), normalizes them into
same-batch operands using stride views only (``unsqueeze``, ``expand``, ``view``,
``mT``) and hands them to the core (``request.batched``), then remembers the
entry of a call whose lookup missed.
"""

from __future__ import annotations

import torch

from ..autograd.distributed import is_dtensor, linear_on_shards
from ..request import calls, fastpath
from ..request.batched import Config, Pipeline
from ..semantics import ACTIVATIONS


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
    else:
        key = None
    return calls.matmul(
        a, b, out_dtype, config, pipeline, decomposition, out, bias, activation, residual, key
    )


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
    else:
        key = None
    return calls.mm(input, mat2, out_dtype, config, pipeline, decomposition, out, key)


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
    return calls.bmm(input, mat2, out_dtype, config, pipeline, decomposition, out)


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
    key = None
    if (
        type(beta) is int  # the defaults (another scale, or one given as a tensor, takes the whole way)
        and type(alpha) is int
        and beta == alpha == 1
        and config is None
        and pipeline is None
        and decomposition is None
        and out is None
    ):
        key, y = fastpath.lookup("addmm", mat1, mat2, input)
        if y is not None:
            return y
    return calls.addmm(input, mat1, mat2, beta, alpha, config, pipeline, decomposition, out, key)


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
    return calls.baddbmm(input, batch1, batch2, beta, alpha, config, pipeline, decomposition, out)


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
    key = None
    if (
        residual is None
        and out_dtype is None
        and config is None
        and pipeline is None
        and decomposition is None
    ):
        if activation is None or activation == "none":
            key, y = fastpath.lookup("linear", input, weight, bias)
            if y is not None:
                return y
        elif not calls.records_grad(input, weight, bias):  # (an activation's entries run without autograd)
            key, y = fastpath.lookup(fastpath.linear_kind(activation), input, weight, bias)
            if y is not None:
                return y
        elif activation in ACTIVATIONS:  # recorded: the plain linear's entry, then torch's activation,
            _, y = fastpath.lookup("linear", input, weight, bias)  # as the whole way does
            if y is not None:
                return ACTIVATIONS[activation](y)
    if is_dtensor(input) and all(x is None for x in (residual, out_dtype, config, pipeline, decomposition)):
        # tensor parallelism: one GEMM of the shards where it can
        act = activation or "none"
        y = linear_on_shards(lambda x, w, b: linear(x, w, b, activation=act), input, weight, bias, act)
        if y is not None:
            return y
    return calls.linear(
        input, weight, bias, activation, residual, out_dtype, config, pipeline, decomposition, key
    )


__all__ = ["matmul", "mm", "bmm", "addmm", "baddbmm", "linear"]
