"""The autograd op: forward and backward on the same kernels.

    out = act(alpha * a @ b + beta * addend) + residual

on operands of one batch shape (the public API broadcasts with stride-0
``expand`` views, whose own backward sums gradients over broadcast
dimensions, so this op never reduces by hand).

Backward reads transposed stride views (``b.mT``, ``a.mT``): no copies.  With
an activation, forward also stores the pre-activation ``z`` (only when a
gradient is needed) and backward applies torch's own activation derivative
to it: one extra write of M x N in forward instead of recomputing the GEMM.

Two doors lead here:

* eager code calls ``GemmFunction`` (lowest host overhead);
* code under ``torch.compile`` / ``torch.export`` calls the custom op
  ``torch.ops.tritongemm.gemm``, which has a fake (meta) implementation and
  registered autograd, so graphs trace through it with no graph break.
"""

from __future__ import annotations

import json

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
    activation: str = "none",
    residual: torch.Tensor | None = None,
    preact: torch.Tensor | None = None,
) -> torch.Tensor:
    """Allocate (or take ``out``) and launch, without autograd."""
    batch_shape = tuple(a.shape[:-2])
    m, n = a.shape[-2], b.shape[-1]
    if out is None:
        out = _alloc_out(batch_shape, m, n, out_dtype or a.dtype, a.device)
    return dispatch.gemm(a, b, out, addend=addend, alpha=alpha, beta=beta, config=config, pipeline=pipeline,
                         decomposition=decomposition, activation=activation, residual=residual, preact=preact)


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


def _backward_gemms(ctx, grad_out, a, b, z):
    """Gradients of a, b, addend and residual from grad_out (shared by both doors)."""
    grad_a = grad_b = grad_addend = grad_residual = None
    if ctx.activation != "none" and torch.is_grad_enabled() and not is_tracing(grad_out):
        # The saved pre-activation is not part of the graph, so second derivatives
        # through the activation would silently miss terms: refuse instead.
        raise RuntimeError(
            f"tritongemm: double backward (create_graph=True) through the fused activation "
            f"{ctx.activation!r} is not supported; apply the activation with torch instead"
        )
    if ctx.has_residual and ctx.needs_input_grad[3]:
        grad_residual = grad_out
    grad_z = activation_backward(grad_out, z, ctx.activation) if ctx.activation != "none" else grad_out
    # Under create_graph (double backward) the gradients must themselves be
    # differentiable: go through the autograd op.  Otherwise launch directly,
    # which saves the autograd.Function bookkeeping per GEMM.
    gemm = gemm_op if torch.is_grad_enabled() or is_tracing(grad_out) else _gemm_no_grad
    # Gradients are computed in the operands' dtype (an fp32 out_dtype's
    # gradient is rounded to fp16/bf16 first, as torch's autocast does).
    # An operand that is a transposed view of a contiguous matrix (nn.Linear's
    # weight.mT) gets its gradient computed transposed, so it lands in the
    # layout of the tensor behind the view: autograd then accumulates it into
    # weight.grad without a transposing copy (which cost about 4% of a step).
    eager = not is_tracing(grad_out)
    if ctx.needs_input_grad[0]:
        if eager and getattr(ctx, "a_transposed", False):
            grad_a = gemm(b, grad_z.to(b.dtype).mT, alpha=ctx.alpha, pipeline=ctx.pipeline).mT  # dA^T = B dZ^T
        else:
            grad_a = gemm(grad_z.to(b.dtype), b.mT, alpha=ctx.alpha, pipeline=ctx.pipeline)  # dA = alpha dZ B^T
    if ctx.needs_input_grad[1]:
        if eager and getattr(ctx, "b_transposed", False):
            grad_b = gemm(grad_z.to(a.dtype).mT, a, alpha=ctx.alpha, pipeline=ctx.pipeline).mT  # dB^T = dZ^T A
        else:
            grad_b = gemm(a.mT, grad_z.to(a.dtype), alpha=ctx.alpha, pipeline=ctx.pipeline)  # dB = alpha A^T dZ
    if ctx.has_addend and ctx.needs_input_grad[2]:
        grad_addend = grad_z * ctx.beta if ctx.beta != 1 else grad_z
    return grad_a, grad_b, grad_addend, grad_residual


def _is_transposed_view(t: torch.Tensor) -> bool:
    """A 2-D column-major matrix (the transpose of a contiguous one), read from its strides."""
    if t.dim() != 2:
        return False
    rows, cols = t.shape
    return rows > 1 and cols > 1 and t.stride() == (1, rows)


class GemmFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, a, b, addend, residual, alpha, beta, out_dtype, config, pipeline, decomposition, activation):
        ctx.alpha, ctx.beta, ctx.pipeline, ctx.activation = alpha, beta, pipeline, activation
        ctx.has_addend, ctx.has_residual = addend is not None, residual is not None
        ctx.a_transposed, ctx.b_transposed = _is_transposed_view(a), _is_transposed_view(b)
        out = _alloc_out(tuple(a.shape[:-2]), a.shape[-2], b.shape[-1], out_dtype or a.dtype, a.device)
        # The pre-activation is written by the same kernel, only when backward needs it.
        wants_z = activation != "none" and any(ctx.needs_input_grad[:3])
        preact = torch.empty_like(out) if wants_z else None
        run_gemm(a, b, addend, alpha, beta, out_dtype, config, pipeline, out=out,
                 decomposition=decomposition, activation=activation, residual=residual, preact=preact)
        ctx.save_for_backward(
            a if ctx.needs_input_grad[1] else None,
            b if ctx.needs_input_grad[0] else None,
            preact,
        )
        return out

    @staticmethod
    def backward(ctx, grad_out):
        a, b, z = ctx.saved_tensors
        grads = _backward_gemms(ctx, grad_out, a, b, z)
        return (*grads, None, None, None, None, None, None, None)


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
    activation: str = "none",
    residual: torch.Tensor | None = None,
) -> torch.Tensor:
    """Differentiable ``act(alpha * a @ b + beta * addend) + residual`` on same-batch operands."""
    if is_tracing(a):
        return _traceable_gemm(a, b, addend, alpha, beta, out_dtype, config, pipeline, decomposition,
                               activation, residual)
    return GemmFunction.apply(a, b, addend, residual, alpha, beta, out_dtype, config, pipeline, decomposition,
                              activation)


def is_tracing(t: torch.Tensor) -> bool:
    """Are we inside torch.compile / export tracing (fake or functional tensors, no data)?"""
    if torch.compiler.is_compiling():
        return True
    return type(t) not in (torch.Tensor, torch.nn.Parameter)


# ----------------------------------------------------------------------------------
# The custom op: what torch.compile / torch.export see
# ----------------------------------------------------------------------------------
def _config_json(config) -> str | None:
    if config is None:
        return None
    cfg = config if isinstance(config, TileConfig) else TileConfig.from_dict(config)
    return json.dumps(cfg.to_dict(), sort_keys=True)


def _parse_pipeline(pipeline: str | None) -> str | int | None:
    """The custom op carries ``pipeline`` as a string: a name, or a stage count."""
    return int(pipeline) if pipeline is not None and pipeline.isdigit() else pipeline


def _traceable_gemm(a, b, addend, alpha, beta, out_dtype, config, pipeline, decomposition, activation, residual):
    out, _ = torch.ops.tritongemm.gemm(
        a, b, addend, residual, float(alpha), float(beta), activation, out_dtype,
        None if pipeline is None else str(pipeline), decomposition, _config_json(config),
    )
    return out


@torch.library.custom_op("tritongemm::gemm", mutates_args=())
def _gemm_custom_op(
    a: torch.Tensor,
    b: torch.Tensor,
    addend: torch.Tensor | None,
    residual: torch.Tensor | None,
    alpha: float,
    beta: float,
    activation: str,
    out_dtype: torch.dtype | None,
    pipeline: str | None,
    decomposition: str | None,
    config_json: str | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(act(alpha a@b + beta addend) + residual, pre-activation or an empty tensor)."""
    config = TileConfig.from_dict(json.loads(config_json)) if config_json else None
    stages = _parse_pipeline(pipeline)
    out = _alloc_out(tuple(a.shape[:-2]), a.shape[-2], b.shape[-1], out_dtype or a.dtype, a.device)
    preact = torch.empty_like(out) if activation != "none" else out.new_empty(0)
    run_gemm(a, b, addend, alpha, beta, out_dtype, config, stages, out=out, decomposition=decomposition,
             activation=activation, residual=residual, preact=preact if activation != "none" else None)
    return out, preact


@_gemm_custom_op.register_fake
def _(a, b, addend, residual, alpha, beta, activation, out_dtype, pipeline, decomposition, config_json):
    shape = (*a.shape[:-2], a.shape[-2], b.shape[-1])
    out = a.new_empty(shape, dtype=out_dtype or a.dtype)
    preact = torch.empty_like(out) if activation != "none" else out.new_empty(0)
    return out, preact


def _setup_context(ctx, inputs, output):
    a, b, addend, residual, alpha, beta, activation, out_dtype, pipeline, decomposition, config_json = inputs
    ctx.alpha, ctx.beta, ctx.activation = alpha, beta, activation
    ctx.pipeline = _parse_pipeline(pipeline)
    ctx.has_addend, ctx.has_residual = addend is not None, residual is not None
    ctx.save_for_backward(a, b, output[1])


def _custom_op_backward(ctx, grad_out, grad_preact):
    a, b, z = ctx.saved_tensors
    grads = _backward_gemms(ctx, grad_out, a, b, z)
    return (*grads, None, None, None, None, None, None, None)


_gemm_custom_op.register_autograd(_custom_op_backward, setup_context=_setup_context)
