"""The differentiable two-layer MLP: ``y = act(x @ b1 + bias1) @ b2 + bias2``, whose backward runs the
activation's derivative in the epilogue of the GEMM that produces its input.

``b1`` (K, H) and ``b2`` (H, N) are the layers' B operands: ``nn.Linear``'s ``weight.mT`` views, or
transformers ``Conv1D``'s weights themselves.  Forward is the two GEMMs with their biases in the epilogue
and torch's activation between them (the pre-activation ``z`` and ``h = act(z)`` are both kept for
backward, as a stock MLP's autograd keeps them).  Backward, for ``dy``:

    dz      = (dy @ b2^T) * act'(z)         one GEMM, the derivative epilogue (``DERIVATIVE_EPILOGUES``)
    db2     = h^T dy,  dbias2 = sum of dy's rows
    db1     = x^T dz,  dbias1 = sum of dz's rows
    dx      = dz @ b1^T

Where the layers are differentiated one by one, ``dy @ b2^T`` is written, read back by torch's
activation backward beside ``z``, and ``dz`` written again: two passes over the (M, H) hidden tensor
more than here, where the GEMM reads ``z`` and writes ``dz`` once.

Only eager code reaches this op (``frontend.mlp``): traced and ``torch.func`` calls take the layers one
by one, which Inductor and the transforms see as the stock model's ops.
"""

from __future__ import annotations

import torch

from ..planning.call import Epilogue, plain_epilogue
from ..semantics import ACTIVATIONS, DERIVATIVE_EPILOGUES
from .function import alloc_out, gradient_gemm, internal_call, is_transposed_view, operand_view, run_gemm


def _layer(x: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """``x @ b + bias`` on tritongemm's kernels, no autograd."""
    m, n = x.shape[0], b.shape[1]
    call = internal_call(x.dtype, plain_epilogue(bias is not None), False)  # (a bias: a stride-0 (M, N) view)
    out = alloc_out((m, n), x.dtype, x.device)
    return run_gemm(call, x, b, None if bias is None else bias.expand(m, n), out=out)


def mlp_forward(x, b1, bias1, b2, bias2, activation: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(y, z, h) for 2-D ``x``: the output, the pre-activation and the hidden activation."""
    z = _layer(x, b1, bias1)
    h = ACTIVATIONS[activation](z)
    return _layer(h, b2, bias2), z, h


def mlp_backward(needs, dy, x, b1, b2, z, h, activation: str, transposed=(False, False)) -> tuple:
    """Gradients of (x, b1, bias1, b2, bias2) from ``dy``, None where ``needs`` wants none.

    ``transposed``: whether each B operand is a transposed view of a contiguous matrix (``nn.Linear``'s
    ``weight.mT``); its gradient is then computed in that matrix's layout (``function.gradient_gemm``).
    """
    if torch.is_grad_enabled():
        # z and h came from kernels outside the graph: second derivatives would silently miss terms.
        raise RuntimeError(
            "tritongemm: double backward (create_graph=True) through the fused MLP is not supported; "
            "run its layers one by one instead"
        )
    needs_x, needs_b1, needs_bias1, needs_b2, needs_bias2 = needs[:5]
    plain = internal_call(dy.dtype, plain_epilogue(), False)
    grad_b1 = grad_b2 = grad_x = None

    def weight_grad(grad_out, inp, is_transposed: bool):
        lhs, rhs, flip = gradient_gemm(1, is_transposed)
        views = {"g": grad_out, "a": inp}
        grad = run_gemm(plain, operand_view(views, lhs), operand_view(views, rhs))
        return grad.mT if flip else grad

    if needs_b2:
        grad_b2 = weight_grad(dy, h, transposed[1])
    grad_bias2 = dy.sum(0) if needs_bias2 else None
    if not (needs_x or needs_b1 or needs_bias1):
        return None, None, None, grad_b2, grad_bias2
    derivative = internal_call(
        dy.dtype, Epilogue(activation=DERIVATIVE_EPILOGUES[activation], residual=True), False
    )
    dz = run_gemm(derivative, dy, b2.mT, residual=z)
    if needs_b1:
        grad_b1 = weight_grad(dz, x, transposed[0])
    grad_bias1 = dz.sum(0) if needs_bias1 else None
    if needs_x:
        grad_x = run_gemm(plain, dz, b1.mT)
    return grad_x, grad_b1, grad_bias1, grad_b2, grad_bias2


class MLPFunction(torch.autograd.Function):
    """The eager door, on 2-D ``x``: saves what each requested gradient reads."""

    @staticmethod
    def forward(ctx, x, b1, bias1, b2, bias2, activation: str):
        y, z, h = mlp_forward(x, b1, bias1, b2, bias2, activation)
        needs = ctx.needs_input_grad
        ctx.activation = activation
        ctx.transposed = (is_transposed_view(b1), is_transposed_view(b2))
        first = needs[0] or needs[1] or needs[2]  # anything before the activation: dz is needed
        ctx.save_for_backward(
            x if needs[1] else None,
            b1 if needs[0] else None,
            b2 if first else None,
            z if first else None,
            h if needs[3] else None,
        )
        return y

    @staticmethod
    def backward(ctx, dy):
        x, b1, b2, z, h = ctx.saved_tensors
        grads = mlp_backward(ctx.needs_input_grad, dy, x, b1, b2, z, h, ctx.activation, ctx.transposed)
        return (*grads, None)


def mlp_op(x, b1, bias1, b2, bias2, activation: str) -> torch.Tensor:
    """``act(x @ b1 + bias1) @ b2 + bias2`` on 2-D ``x``, differentiable, for eager calls."""
    return MLPFunction.apply(x, b1, bias1, b2, bias2, activation)


__all__ = ["MLPFunction", "mlp_backward", "mlp_forward", "mlp_op"]
