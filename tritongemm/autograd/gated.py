"""The differentiable gated GEMM: ``h = act(x @ w_gate.T + b_gate) * (x @ w_up.T + b_up)``.

Forward is ``launch.gated.gated_gemm``, which writes the pre-activations ``g`` and ``u`` beside
``h`` only when a gradient will be asked for (two extra M x N writes instead of recomputing two
GEMMs in backward).  Backward, for ``dh``:

    dg, du    = dh * u * act'(g), dh * act(g)         one elementwise kernel (``launch.gated_grad``)
    dx        = dg @ w_gate + du @ w_up               two GEMMs, the second adding the first in its epilogue
    dw_gate   = dg^T x,  dw_up = du^T x               in the weights' own layout (``function.gradient_gemm``)
    db_gate   = sum of dg's rows,  db_up = du's

each only where ``needs_input_grad`` asks.  The GEMMs are tritongemm's (``function.run_gemm``, or the
differentiable / traceable ``function.gemm_op`` where a trace needs it).

Doors, as for the GEMM (``function``): eager code calls ``GatedFunction``; a ``torch.compile`` /
``torch.export`` trace calls the op ``torch.ops.tritongemm.gated`` (a fake kernel and this module's
backward registered as its autograd), whose elementwise backward is the op
``torch.ops.tritongemm.gated_grad``; where nothing needs a gradient, the op
``torch.ops.tritongemm.gated_extern`` (h alone, no autograd).  The ops stay whole in a compiled
graph: Inductor calls them as it calls any extern kernel.  ``torch.func`` transforms never reach here (``frontend.gated``
takes the unfused path for them).
"""

from __future__ import annotations

import torch

from ..launch import gated as gated_launch
from ..launch import precompile
from ..launch.gated_grad import gated_grad
from ..planning.call import Epilogue, plain_epilogue
from .function import (
    alloc_out,
    gemm_op,
    gradient_gemm,
    internal_call,
    is_tracing,
    is_transposed_view,
    operand_view,
    run_gemm,
)
from .modes import dispatch_mode_active, gemm_flops, register_flops

#: dx's second GEMM reads the first's result as its addend: ``dg @ w_gate + 1 * (du @ w_up)``.
ADD_EPILOGUE = Epilogue(beta=1.0, addend=True)


def needs_grad(*tensors: torch.Tensor | None) -> bool:
    """Will backward be asked for (grad mode on, and an operand that requires grad)?"""
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


def gated_forward(x, w_gate, w_up, b_gate, b_up, activation: str, save: bool) -> tuple:
    """(h, g, u) for 2-D ``x``; ``g`` and ``u`` are None unless ``save``."""
    shape = (x.shape[0], w_gate.shape[0])
    h = alloc_out(shape, x.dtype, x.device)
    pre = (alloc_out(shape, x.dtype, x.device), alloc_out(shape, x.dtype, x.device)) if save else None
    gated_launch.gated_gemm(x, w_gate, w_up, activation, b_gate, b_up, out=h, save=pre)
    return (h, *pre) if save else (h, None, None)


def gated_backward(needs, dh, x, w_gate, w_up, g, u, activation: str, row_major=(True, True)) -> tuple:
    """Gradients of (x, w_gate, w_up, b_gate, b_up) from ``dh``, None where ``needs`` says none is wanted.

    ``row_major``: whether each weight was a contiguous (N, K) matrix in forward (``nn.Linear``'s),
    whose gradient is then computed in that layout; ``x`` is needed for the weights' gradients,
    the weights for the input's.
    """
    traced = is_tracing(dh)
    if torch.is_grad_enabled() and not traced:
        # g and u were written by the kernel, outside the graph: second derivatives through them
        # would silently miss terms, so refuse instead.
        raise RuntimeError(
            "tritongemm: double backward (create_graph=True) through gated_linear is not supported; "
            "compute act(linear(x, w_gate)) * linear(x, w_up) with torch instead"
        )
    needs_x, needs_wg, needs_wu, needs_bg, needs_bu = needs[:5]
    dg_du = torch.ops.tritongemm.gated_grad if traced else _gated_grad
    dg, du = dg_du(dh, g, u, activation)
    # Direct launches where nothing traces these GEMMs: no autograd bookkeeping per GEMM.
    direct = not (traced or dispatch_mode_active())

    def gemm(call, a, b, addend=None):
        return run_gemm(call, a, b, addend) if direct else gemm_op(call, a, b, addend)

    plain = internal_call(dh.dtype, plain_epilogue(), traced)
    dx = dw_gate = dw_up = None
    if needs_x:
        # (x's gradient is not put in x's layout as the weights' are: it flows into the reshape
        # and the layers before, not into a .grad.)
        partial = gemm(plain, du, w_up)
        dx = gemm(internal_call(dh.dtype, ADD_EPILOGUE, traced), dg, w_gate, partial)

    def weight_grad(grad_z, row_major_weight: bool):
        # The weight is B = w.T of x @ B: a transposed view where w is row-major, whose gradient
        # ``gradient_gemm`` then computes as dB^T = dW itself (``flip``).
        lhs, rhs, flip = gradient_gemm(1, not traced and row_major_weight)
        views = {"g": grad_z, "a": x}  # (a weight's gradient reads neither B nor its view)
        grad_b = gemm(plain, operand_view(views, lhs), operand_view(views, rhs))
        return grad_b if flip else grad_b.mT

    if needs_wg:
        dw_gate = weight_grad(dg, row_major[0])
    if needs_wu:
        dw_up = weight_grad(du, row_major[1])
    db_gate = dg.sum(0) if needs_bg else None
    db_up = du.sum(0) if needs_bu else None
    return dx, dw_gate, dw_up, db_gate, db_up


def _gated_grad(dh, g, u, activation: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The elementwise backward into fresh outputs (NaN-poisoned under TRITONGEMM_POISON_OUTPUTS)."""
    shape = tuple(dh.shape)
    dg = alloc_out(shape, dh.dtype, dh.device)
    du = alloc_out(shape, dh.dtype, dh.device)
    return gated_grad(dh, g, u, activation, dg, du)


# ----------------------------------------------------------------------------------
# The eager door
# ----------------------------------------------------------------------------------
class GatedFunction(torch.autograd.Function):
    """The eager door, on 2-D ``x``: saves ``g`` and ``u`` (always: it is applied only when a gradient
    is wanted) and what each requested gradient reads."""

    @staticmethod
    def forward(ctx, x, w_gate, w_up, b_gate, b_up, activation: str):
        h, g, u = gated_forward(x, w_gate, w_up, b_gate, b_up, activation, save=True)
        needs = ctx.needs_input_grad
        ctx.activation = activation
        ctx.row_major = (is_transposed_view(w_gate.mT), is_transposed_view(w_up.mT))
        ctx.save_for_backward(
            x if needs[1] or needs[2] else None,
            w_gate if needs[0] else None,
            w_up if needs[0] else None,
            g,
            u,
        )
        return h

    @staticmethod
    def backward(ctx, dh):
        x, w_gate, w_up, g, u = ctx.saved_tensors
        grads = gated_backward(ctx.needs_input_grad, dh, x, w_gate, w_up, g, u, ctx.activation, ctx.row_major)
        return (*grads, None)


def gated_op(x, w_gate, w_up, b_gate, b_up, activation: str) -> torch.Tensor:
    """``act(x @ w_gate.T + b_gate) * (x @ w_up.T + b_up)`` on 2-D ``x``, differentiable where needed."""
    save = needs_grad(x, w_gate, w_up, b_gate, b_up)
    if is_tracing(x) or dispatch_mode_active():  # (the ops: ``modes``)
        if not save:
            return torch.ops.tritongemm.gated_extern.default(x, w_gate, w_up, b_gate, b_up, activation)
        return torch.ops.tritongemm.gated(x, w_gate, w_up, b_gate, b_up, activation, save)[0]
    if save:
        return GatedFunction.apply(x, w_gate, w_up, b_gate, b_up, activation)
    return gated_forward(x, w_gate, w_up, b_gate, b_up, activation, save=False)[0]


# ----------------------------------------------------------------------------------
# The ops a trace sees
# ----------------------------------------------------------------------------------
def _gated(
    x: torch.Tensor,
    w_gate: torch.Tensor,
    w_up: torch.Tensor,
    b_gate: torch.Tensor | None,
    b_up: torch.Tensor | None,
    activation: str,
    save: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``tritongemm::gated``: (h, g, u), or (h, empty, empty) without ``save``."""
    precompile.wait()  # (its kernel may be compiling since the trace: ``_gated_fake``)
    h, g, u = gated_forward(x, w_gate, w_up, b_gate, b_up, activation, save)
    return (h, g, u) if save else (h, h.new_empty(0), h.new_empty(0))


def _gated_fake(x, w_gate, w_up, b_gate, b_up, activation, save):
    shape = (x.shape[0], w_gate.shape[0])
    pre = shape if save else (0,)
    h, g, u = x.new_empty(shape), x.new_empty(pre), x.new_empty(pre)
    # A trace: start compiling the kernel the op's first call will launch (``launch.precompile``).
    biased = b_gate is not None or b_up is not None
    precompile.attempt("gated", gated_launch.precompile, x, w_gate, w_up, h, activation, biased,
                       (g, u) if save else None)  # fmt: skip
    return h, g, u


def _gated_extern(x, w_gate, w_up, b_gate, b_up, activation: str) -> torch.Tensor:
    """``tritongemm::gated_extern`` (its schema: below): h alone, where nothing will differentiate it."""
    precompile.wait()
    return gated_forward(x, w_gate, w_up, b_gate, b_up, activation, save=False)[0]


def _gated_extern_fake(x, w_gate, w_up, b_gate, b_up, activation):
    return _gated_fake(x, w_gate, w_up, b_gate, b_up, activation, False)[0]


def _gated_setup_context(ctx, inputs, output):
    x, w_gate, w_up, _, _, activation, _ = inputs
    ctx.activation = activation
    ctx.mark_non_differentiable(output[1], output[2])
    ctx.save_for_backward(x, w_gate, w_up, output[1], output[2])


def _gated_op_backward(ctx, dh, _dg, _du):
    # (a traced backward takes the gradients' untransposed forms: ``row_major`` is not read there)
    x, w_gate, w_up, g, u = ctx.saved_tensors
    return (*gated_backward(ctx.needs_input_grad, dh, x, w_gate, w_up, g, u, ctx.activation), None, None)


def _gated_grad_op(
    dh: torch.Tensor, g: torch.Tensor, u: torch.Tensor, activation: str
) -> tuple[torch.Tensor, torch.Tensor]:
    """``tritongemm::gated_grad``: (dh * u * act'(g), dh * act(g))."""
    return _gated_grad(dh, g, u, activation)


def _gated_grad_fake(dh, g, u, activation):
    return torch.empty_like(dh, memory_format=torch.contiguous_format), torch.empty_like(
        dh, memory_format=torch.contiguous_format
    )


_GATED_OP = torch.library.custom_op("tritongemm::gated", _gated, mutates_args=())
_GATED_OP.register_fake(_gated_fake)
_GATED_OP.register_autograd(_gated_op_backward, setup_context=_gated_setup_context)
_GATED_GRAD_OP = torch.library.custom_op("tritongemm::gated_grad", _gated_grad_op, mutates_args=())
_GATED_GRAD_OP.register_fake(_gated_grad_fake)
# What a compiled inference graph calls, once per MLP and step: as ``ops.gemm_extern``, on a plain
# ``Library`` with no autograd kernel, so the dispatcher calls ``_gated_extern`` directly.  Behind
# ``custom_op``'s Python autograd and backend wrappers a call took 85 us of host time, here 40 (H100
# host), against 75 for two ``aten.mm`` and the product: the custom op lost on host-bound graphs
# (compile.md).
_LIB = torch.library.Library("tritongemm", "FRAGMENT")
_LIB.define(
    "gated_extern(Tensor x, Tensor w_gate, Tensor w_up, Tensor? b_gate, Tensor? b_up, str activation) -> Tensor"
)
_LIB.impl("gated_extern", _gated_extern, "CompositeExplicitAutograd")
torch.library.register_fake("tritongemm::gated_extern", _gated_extern_fake)
register_flops(
    [torch.ops.tritongemm.gated, torch.ops.tritongemm.gated_extern],
    lambda x, *args, out_shape, **_: 2 * gemm_flops(x, out_shape=out_shape),
)


__all__ = ["GatedFunction", "gated_backward", "gated_forward", "gated_op", "needs_grad"]
