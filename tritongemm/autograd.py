"""The autograd op: ``GemmFunction`` wires forward and backward to the same kernel.

``out = alpha * a @ b + beta * addend`` on operands of one batch shape (the
public API broadcasts with stride-0 ``expand`` views, whose own backward sums
gradients over broadcast dimensions, so this op never reduces by hand).

Backward reads transposed stride views (``b.mT``, ``a.mT``): no copies.  It is
written with ``GemmFunction`` itself, so double backward works too.
"""

from __future__ import annotations

import torch

from . import dispatch
from .configs import TileConfig


def _alloc_out(batch_shape, m: int, n: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    out = torch.empty((*batch_shape, m, n), dtype=dtype, device=device)
    if _debug_poison[0]:
        out.fill_(float("nan"))  # every element must be written by the kernel
    return out


#: When true, outputs are filled with NaN before the kernel writes them (tests
#: turn this on to catch unwritten elements).  Set by TRITONGEMM_POISON_OUTPUTS=1.
_debug_poison = [False]


def set_poison_outputs(enabled: bool) -> None:
    _debug_poison[0] = bool(enabled)


def run_gemm(
    a: torch.Tensor,
    b: torch.Tensor,
    addend: torch.Tensor | None = None,
    alpha: float = 1.0,
    beta: float = 0.0,
    out_dtype: torch.dtype | None = None,
    config: TileConfig | dict | None = None,
    pipeline: str | int | None = None,
    out: torch.Tensor | None = None,
    decomposition: str | None = None,
) -> torch.Tensor:
    """Allocate (or take ``out``) and launch, without autograd."""
    batch_shape = tuple(a.shape[:-2])
    m, n = a.shape[-2], b.shape[-1]
    if out is None:
        out = _alloc_out(batch_shape, m, n, out_dtype or a.dtype, a.device)
    return dispatch.gemm(a, b, out, addend=addend, alpha=alpha, beta=beta, config=config, pipeline=pipeline,
                         decomposition=decomposition)


class GemmFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, a, b, addend, alpha, beta, out_dtype, config, pipeline, decomposition):
        ctx.alpha, ctx.beta, ctx.pipeline = alpha, beta, pipeline
        ctx.has_addend = addend is not None
        ctx.save_for_backward(
            a if ctx.needs_input_grad[1] else None,
            b if ctx.needs_input_grad[0] else None,
        )
        return run_gemm(a, b, addend, alpha, beta, out_dtype, config, pipeline, decomposition=decomposition)

    @staticmethod
    def backward(ctx, grad_out):
        a, b = ctx.saved_tensors
        grad_a = grad_b = grad_addend = None
        # Under create_graph (double backward) the gradients must themselves be
        # differentiable: go through the autograd op.  Otherwise launch
        # directly, which saves the autograd.Function bookkeeping per GEMM.
        gemm = gemm_op if torch.is_grad_enabled() else _gemm_no_grad
        # Gradients are computed in the operands' dtype (an fp32 out_dtype's
        # gradient is rounded to fp16/bf16 first, as torch's autocast does).
        if ctx.needs_input_grad[0]:
            g = grad_out.to(b.dtype)
            grad_a = gemm(g, b.mT, alpha=ctx.alpha, pipeline=ctx.pipeline)  # dA = alpha dC B^T
        if ctx.needs_input_grad[1]:
            g = grad_out.to(a.dtype)
            grad_b = gemm(a.mT, g, alpha=ctx.alpha, pipeline=ctx.pipeline)  # dB = alpha A^T dC
        if ctx.has_addend and ctx.needs_input_grad[2]:
            grad_addend = grad_out * ctx.beta if ctx.beta != 1 else grad_out
        return grad_a, grad_b, grad_addend, None, None, None, None, None, None


def _gemm_no_grad(a, b, alpha=1.0, pipeline=None):
    return run_gemm(a, b, None, alpha, 0.0, None, None, pipeline)


def gemm_op(
    a: torch.Tensor,
    b: torch.Tensor,
    addend: torch.Tensor | None = None,
    alpha: float = 1.0,
    beta: float = 0.0,
    out_dtype: torch.dtype | None = None,
    config: TileConfig | dict | None = None,
    pipeline: str | int | None = None,
    decomposition: str | None = None,
) -> torch.Tensor:
    """Differentiable ``alpha * a @ b + beta * addend`` on same-batch operands."""
    return GemmFunction.apply(a, b, addend, alpha, beta, out_dtype, config, pipeline, decomposition)
