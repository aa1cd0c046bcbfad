"""The core every public function reaches: one batched, broadcast GEMM with its epilogue,

    C = act(alpha * A @ B + beta * D) + R

on operands the public function has validated and made same-rank (``calls``):
broadcasting by stride views, folding (*, M, K) @ (K, N) into one GEMM, torch's
exact K = 0 result; then the autograd layer's ``run`` (a direct launch or the op).
"""

from __future__ import annotations

import math

import torch

from ..autograd.function import run
from ..planning.call import Epilogue, GemmCall, make_request, plain_epilogue
from ..planning.configs import TileConfig
from ..semantics import fp32_precision
from . import checks

Config = TileConfig | dict | None
Pipeline = str | int | None


def gemm_call(a: torch.Tensor, epilogue: Epilogue, out_dtype, config, pipeline, decomposition) -> GemmCall:
    """The one value that describes this call from here down (see ``tritongemm.planning.call``).

    Under torch.compile torch's TF32 switch cannot be read while tracing: the
    custom op reads it when it runs ("auto").
    """
    if a.dtype is not torch.float32:
        precision = "ieee"  # TF32 concerns float32 only
    else:
        precision = "auto" if torch.compiler.is_compiling() else fp32_precision()
    return GemmCall(epilogue, make_request(config, pipeline, decomposition), out_dtype, precision)


def epilogue_of(activation: str, alpha: float, beta: float, addend, residual) -> Epilogue:
    # torch's rule: beta=0 ignores the addend's values, NaN and Inf included (the kernel never reads it).
    reads_addend = addend is not None and beta != 0
    if activation == "none" and alpha == 1.0 and not reads_addend and residual is None:
        return plain_epilogue()
    return Epilogue(activation, alpha, beta, reads_addend, residual is not None)


# ----------------------------------------------------------------------------------
# The core: batched, broadcast C = act(alpha * A @ B + beta * D) + R
# ----------------------------------------------------------------------------------
def batched_gemm(
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
    if (
        out is None
        and addend is None
        and residual is None
        and activation == "none"
        and alpha == 1.0
        and a.dim() == 2
        and b.dim() == 2
    ):  # the common case, kept short: one matrix product, nothing to broadcast, fold or check
        call = gemm_call(a, plain_epilogue(), out_dtype, config, pipeline, decomposition)
        operands, folded, result_shape = (a, b), False, None
    else:
        m, k = a.shape[-2:]
        n = b.shape[-1]
        batch = checks.broadcast_batch(fn, a, b)
        result_shape = (*batch, m, n)
        addend = checks.expand_to(fn, "input", addend, result_shape)
        residual = checks.expand_to(fn, "residual", residual, result_shape)
        extra = [t for t in (addend, residual) if t is not None]
        out = checks.check_out(fn, out, result_shape, out_dtype or a.dtype, a, b, *extra)
        if k == 0 and addend is not None and beta != 0 and activation == "none" and residual is None:
            # An empty sum: torch returns beta * input exactly (a -0.0 stays -0.0, which 0 + -0.0 would not).
            if out is None and torch.is_grad_enabled() and (a.requires_grad or b.requires_grad):
                return EmptySum.apply(addend, a, b, beta, out_dtype or a.dtype)
            c = empty_sum(addend, beta)
            return out.copy_(c) if out is not None else c.to(out_dtype or a.dtype)
        call = gemm_call(
            a,
            epilogue_of(activation, alpha, beta, addend, residual),
            out_dtype,
            config,
            pipeline,
            decomposition,
        )

        # Fold (*, M, K) @ (K, N) into one (prod(*) * M, K) @ (K, N) product when
        # B carries no batch and A's rows can be viewed as one matrix: a single
        # large GEMM instead of many small ones (torch.matmul does the same).
        folded = False
        if a.dim() > 2 and math.prod(b.shape[:-2]) == 1 and math.prod(a.shape[:-2]) == math.prod(batch):
            a2 = checks.fold_rows(a)
            d2 = checks.fold_rows(addend) if addend is not None else None
            r2 = checks.fold_rows(residual) if residual is not None else None
            if a2 is not None and (addend is None or d2 is not None) and (residual is None or r2 is not None):
                b2 = b.reshape(k, n)  # size-1 batch dims only: a view
                o2 = checks.fold_rows(out) if out is not None else None
                if out is None or o2 is not None:
                    operands, folded = (a2, b2, d2, r2, o2), True
        if not folded:  # the batched GEMM on the broadcast operands
            a_e = a if tuple(a.shape[:-2]) == batch else a.expand((*batch, m, k))
            b_e = b if tuple(b.shape[:-2]) == batch else b.expand((*batch, k, n))
            operands = (a_e, b_e, addend, residual, out)
    c = run(call, *operands)
    if out is not None:
        return out
    return c.view(result_shape) if folded else c


def empty_sum(addend: torch.Tensor, beta: float) -> torch.Tensor:
    """``beta * addend``: what ``addmm`` gives for K = 0 (exactly: a -0.0 stays -0.0)."""
    return addend * beta if beta != 1 else addend.clone(memory_format=torch.contiguous_format)


class EmptySum(torch.autograd.Function):
    """``empty_sum`` where the K = 0 operands ``a`` and ``b`` require grad.

    The empty product reads neither, but torch's ops still give an operand that
    requires grad a gradient of its own (zero-size), not None: a training loop
    or optimizer that reads ``.grad`` finds the same here.
    """

    generate_vmap_rule = True

    @staticmethod
    def forward(addend, a, b, beta, dtype):
        return empty_sum(addend, beta).to(dtype)

    @staticmethod
    def setup_context(ctx, inputs, output):
        addend, a, b, beta, _ = inputs
        ctx.beta, ctx.addend_dtype = beta, addend.dtype
        ctx.shapes = (a.shape, a.dtype, a.device), (b.shape, b.dtype, b.device)

    @staticmethod
    def backward(ctx, grad):
        (sa, da, va), (sb, db, vb) = ctx.shapes
        grad_addend = (grad * ctx.beta if ctx.beta != 1 else grad).to(ctx.addend_dtype)
        zeros_a = torch.zeros(sa, dtype=da, device=va)
        return grad_addend, zeros_a, torch.zeros(sb, dtype=db, device=vb), None, None


__all__ = ["Config", "EmptySum", "Pipeline", "batched_gemm", "empty_sum", "epilogue_of", "gemm_call"]
