"""The autograd op: forward and backward on the same kernels.

    out = act(alpha * a @ b + beta * addend) + residual

on operands of one batch shape (the public API broadcasts with stride-0
``expand`` views, whose own backward sums gradients over broadcast
dimensions, so this op never reduces by hand).  Everything that is not a
tensor travels as one ``GemmCall`` value, kept on the autograd context.

Backward reads transposed stride views (``b.mT``, ``a.mT``): no copies.  With
an activation, forward also stores the pre-activation ``z`` (only when a
gradient is needed) and backward applies torch's own activation derivative
to it: one extra write of M x N in forward instead of recomputing the GEMM.

Forward-mode AD (``torch.autograd.forward_ad``, ``torch.func.jvp``) runs the op's ``jvp`` on the same
kernels; ``gemm_op`` leaves the activation to torch's op while a dual level is open.

Doors:

* eager code calls ``GemmFunction`` (lowest host overhead); under
  ``torch.func`` transforms (``grad`` / ``jacrev`` / ``vmap``) the same op in
  the functorch form, ``GemmTransformFunction`` (``setup_context``, a ``vmap`` rule);
* code under ``torch.compile`` / ``torch.export`` calls the op
  ``torch.ops.tritongemm.gemm`` (``ops.py``: a fake kernel, this module's
  backward registered as its autograd), so graphs trace through it with no
  graph break.
"""

from __future__ import annotations

import torch

from .. import launch
from ..planning.call import NO_REQUEST, Epilogue, GemmCall, Request, op_args
from ..semantics import ACTIVATIONS, activation_backward, dot_precision
from . import distributed
from .aten import aten_ops
from .modes import dispatch_mode_active, dispatch_stack_len, forward_ad_active, forward_ad_state

_functorch_active = torch._C._are_functorch_transforms_active


def alloc_out(shape, dtype: torch.dtype, device) -> torch.Tensor:
    out = torch.empty(*shape, dtype=dtype, device=device)  # unpacked: torch parses it in a third of the time
    if _debug_poison[0]:
        out.fill_(float("nan"))  # every element must be written by the kernel
    return out


def _alloc_out(a: torch.Tensor, b: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return alloc_out((*a.shape[:-2], a.shape[-2], b.shape[-1]), dtype, a.device)


#: When true, outputs are filled with NaN before the kernel writes them (tests
#: turn this on to catch unwritten elements).  Set by TRITONGEMM_POISON_OUTPUTS=1.
_debug_poison = [False]


def set_poison_outputs(enabled: bool) -> None:
    _debug_poison[0] = bool(enabled)


def run_gemm(
    call: GemmCall,
    a: torch.Tensor,
    b: torch.Tensor,
    addend: torch.Tensor | None = None,
    residual: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    preact: torch.Tensor | None = None,
) -> torch.Tensor:
    """Allocate (or take ``out``) and launch, without autograd."""
    if out is None:
        out = _alloc_out(a, b, call.out_dtype or a.dtype)
    return launch.gemm(call, a, b, out, addend, residual, preact)


def run(call: GemmCall, a, b, addend=None, residual=None, out=None) -> torch.Tensor:
    """The request's GEMM: launched directly when nothing needs autograd (microseconds a call), else
    through the autograd op.

    ``addend`` may be given while the epilogue does not read it (beta = 0): the
    autograd op still takes it, so its gradient is a zero tensor, as torch's.
    """
    if out is None:
        direct = not needs_autograd(call, a, b, addend, residual)
    else:  # no autograd with out= (the request refused it), but DTensors take the op (below)
        direct = not distributed.any_dtensor(a, out)
    if direct:
        return run_gemm(call, a, b, addend if call.epilogue.addend else None, residual, out)
    if out is not None:  # DTensors: DTensor runs the op on the shards; its result is copied into out
        addend = addend if call.epilogue.addend else None
    y = gemm_op(call, a, b, addend, residual)
    return y if out is None else out.copy_(y)


def internal_call(dtype: torch.dtype, epilogue: Epilogue, traced: bool) -> GemmCall:
    """The call of a GEMM autograd makes itself (a gradient, a fused op's step): no request, float32's
    TF32 rule read now (or, traced, when the op runs)."""
    precision = ("auto" if traced else dot_precision(dtype)) if dtype == torch.float32 else "ieee"
    return GemmCall(epilogue, NO_REQUEST, None, precision)


def needs_autograd(call: GemmCall, a, b, addend, residual) -> bool:
    """Must this call go through the autograd op (a gradient, a tangent, a trace or a torch.func
    transform)?"""
    if _functorch_active() or is_tracing(a) or forward_ad_state._current_level >= 0 or dispatch_stack_len():
        return True
    return torch.is_grad_enabled() and (
        a.requires_grad
        or b.requires_grad
        or (addend is not None and addend.requires_grad)
        or (residual is not None and residual.requires_grad)
    )


def differentiated(a: torch.Tensor, b: torch.Tensor, addend: torch.Tensor | None) -> bool:
    """Will autograd differentiate a GEMM of these operands (eager or traced)?  ``gemm_op`` then keeps a
    fused activation out of the op, so the op never stores a pre-activation for a backward."""
    return torch.is_grad_enabled() and (
        a.requires_grad or b.requires_grad or (addend is not None and addend.requires_grad)
    )


def gemm_op(
    call: GemmCall,
    a: torch.Tensor,
    b: torch.Tensor,
    addend: torch.Tensor | None = None,
    residual: torch.Tensor | None = None,
) -> torch.Tensor:
    """Differentiable ``act(alpha * a @ b + beta * addend) + residual`` on same-batch operands."""
    ep = call.epilogue
    if ep.activation != "none" and (
        _functorch_active() or differentiated(a, b, addend) or forward_ad_active()
    ):
        # Differentiated (or under a torch.func transform, which may differentiate): the GEMM stores z,
        # torch's op computes act(z) from it and differentiates it, twice if asked.  The kernel could
        # store both, but z's stores from the accumulator's layout cost more than the pass over z they
        # save (H100, bf16, 512 x 14336 x 4096 forward: 147 us fused against 94 + 12 us).
        z = gemm_op(call._replace(epilogue=ep._replace(activation="none", residual=False)), a, b, addend)
        y = ACTIVATIONS[ep.activation](z)
        return y if residual is None else y + residual
    if is_tracing(a) or (dispatch_mode_active() and not _functorch_active()):  # (the op: ``modes``)
        if distributed.is_dtensor(a):  # DTensor runs the custom op on the shards, by its sharding rule
            return distributed.gemm(_traceable_gemm, call, a, b, addend, residual)
        if _functorch_active() or forward_ad_active():
            # Traced under a transform or dual level: torch's ops carry tangents (a custom op's are dropped).
            return aten_ops(call, a, b, addend, residual)[0]
        return _traceable_gemm(call, a, b, addend, residual)
    if _functorch_active():
        return GemmTransformFunction.apply(a, b, addend, residual, call)[0]
    return GemmFunction.apply(a, b, addend, residual, call)


def is_tracing(t: torch.Tensor) -> bool:
    """Are we inside torch.compile / export tracing (fake or functional tensors, no data)?"""
    if torch.compiler.is_compiling():
        return True
    return type(t) not in (torch.Tensor, torch.nn.Parameter)


# ----------------------------------------------------------------------------------
# Backward, shared by both doors
# ----------------------------------------------------------------------------------
def backward_gemms(ctx, grad_out, a, b, z):
    """Gradients of a, b, addend and residual from grad_out."""
    call: GemmCall = ctx.call
    ep = call.epilogue
    grad_addend = grad_residual = None
    if ep.activation != "none" and torch.is_grad_enabled() and not is_tracing(grad_out):
        # The saved pre-activation is not part of the graph, so second derivatives
        # through the activation would silently miss terms: refuse instead.
        raise RuntimeError(
            f"tritongemm: double backward (create_graph=True) through the fused activation "
            f"{ep.activation!r} is not supported; apply the activation with torch instead"
        )
    if ep.residual and ctx.needs_input_grad[3]:
        grad_residual = grad_out
    grad_z = activation_backward(grad_out, z, ep.activation) if ep.activation != "none" else grad_out
    # The gradient GEMMs: alpha * (dZ B^T) and alpha * (A^T dZ), in the forward's pipeline.
    grad_call = GemmCall(
        Epilogue(alpha=ep.alpha), Request(pipeline=call.request.pipeline), None, call.precision
    )
    # Under create_graph (double backward), a trace or a torch.func transform the
    # gradients must themselves go through the autograd op.  Otherwise launch
    # directly, which saves the autograd.Function bookkeeping per GEMM.
    direct = not (
        torch.is_grad_enabled() or is_tracing(grad_out) or _functorch_active() or dispatch_mode_active()
    )

    def gemm(x, y):
        return run_gemm(grad_call, x, y) if direct else gemm_op(grad_call, x, y)

    # Gradients are computed in the operands' dtype (an fp32 out_dtype's gradient is rounded to
    # fp16/bf16 first, as torch's autocast does), each by the GEMM ``gradient_gemm`` names.  The
    # layout rule holds in a compiled graph too (the fake tensors carry the strides, and Inductor
    # keeps a graph output's): without it every weight gradient of a compiled step was copied by
    # autograd into the weight's layout (29 copies, 8% of the small Llama's step on the H100).
    # Not under torch.func's transforms, whose batched tensors' strides are not the matrices'.
    by_layout = not _functorch_active()
    grads = [None, None]
    for operand, transposed in ((0, ctx.a_transposed), (1, ctx.b_transposed)):
        if ctx.needs_input_grad[operand]:
            lhs, rhs, flip = gradient_gemm(operand, by_layout and transposed)
            views = {"g": grad_z.to((b, a)[operand].dtype), "a": a, "b": b}  # dA in B's dtype, dB in A's
            grad = gemm(operand_view(views, lhs), operand_view(views, rhs))
            grads[operand] = grad.mT if flip else grad
    grad_a, grad_b = grads
    if ctx.needs_input_grad[2]:  # zero when beta = 0: the addend was not read, as in torch
        grad_addend = grad_z * ep.beta if ep.beta != 1 else grad_z
    return grad_a, grad_b, grad_addend, grad_residual


def gemm_tangent(call: GemmCall, a, b, like: tuple, da, db, daddend, dresidual) -> torch.Tensor:
    """The forward-mode derivative of ``alpha * a @ b + beta * addend + residual`` (``gemm_op`` keeps an
    activation out of the op while tangents may flow): ``alpha * (da @ b + a @ db) + beta * daddend +
    dresidual``, each GEMM on tritongemm's kernels (through the op where a higher derivative needs it).
    ``like``: the output's (shape, dtype), which the tangent takes."""
    shape, dtype = like
    ep = call.epilogue
    tangent_call = call._replace(epilogue=Epilogue(alpha=ep.alpha))
    terms = [run(tangent_call, x, y) for x, y in ((da, b), (a, db)) if x is not None and y is not None]
    if ep.addend and daddend is not None:
        terms.append(daddend * ep.beta if ep.beta != 1 else daddend)
    if ep.residual and dresidual is not None:
        terms.append(dresidual)
    if not terms:
        return a.new_zeros(shape, dtype=dtype)
    tangent = terms[0]
    for term in terms[1:]:
        tangent = tangent + term
    return tangent.to(dtype).expand(shape)


def save_tangent_context(ctx, call: GemmCall, a, b, out) -> None:
    """What ``jvp`` reads, kept while a dual level is open (it runs right after forward).  The output's
    shape and dtype, not the output: the context holding its own output would make a reference cycle."""
    if forward_ad_active():
        ctx.tangent_context = (call, a, b, (out.shape, out.dtype))


def gradient_gemm(operand: int, transposed: bool) -> tuple[str, str, bool]:
    """The GEMM that gives operand ``operand``'s gradient (0: A, 1: B) of ``Z = alpha A @ B``:
    (lhs, rhs, flip), the gradient being ``lhs @ rhs``, or its transpose where ``flip``.

    Names: "g" dZ, "a" A, "b" B; a trailing "T" their ``.mT`` views.  An operand that is a
    transposed view of a contiguous matrix (``transposed``: ``nn.Linear``'s ``weight.mT``) gets its
    gradient computed transposed, so it lands in the layout of the tensor behind the view and
    autograd accumulates it into ``.grad`` without a transposing copy (about 4% of a step).  The
    one rule of both backward paths: ``backward_gemms`` and the fast path's launchers.
    """
    if operand == 0:
        return ("b", "gT", True) if transposed else ("g", "bT", False)  # dA^T = B dZ^T ; dA = dZ B^T
    return ("gT", "a", True) if transposed else ("aT", "g", False)  # dB^T = dZ^T A ; dB = A^T dZ


def operand_view(views: dict, name: str) -> torch.Tensor:
    """The tensor ``gradient_gemm`` names ("a", "aT", ...) from ``views`` ({"g": dZ, "a": A, "b": B})."""
    return views[name[0]].mT if name.endswith("T") else views[name]


def is_transposed_view(t: torch.Tensor) -> bool:
    """A 2-D column-major matrix (the transpose of a contiguous one), read from its strides."""
    if t.dim() != 2:
        return False
    rows, cols = t.shape
    return rows > 1 and cols > 1 and t.stride() == (1, rows)


def save_context(ctx, call: GemmCall, a, b, preact) -> None:
    """What backward needs, kept on ``ctx``: the call, the operands' layouts, the tensors it reads."""
    ctx.call = call
    ctx.a_transposed, ctx.b_transposed = is_transposed_view(a), is_transposed_view(b)
    ctx.save_for_backward(
        a if ctx.needs_input_grad[1] else None,
        b if ctx.needs_input_grad[0] else None,
        preact if call.epilogue.store_preact else None,
    )


def _forward(a, b, addend, residual, call: GemmCall, launcher=None):
    out = _alloc_out(a, b, call.out_dtype or a.dtype)
    preact = torch.empty_like(out) if call.epilogue.store_preact else None
    if launcher is not None:  # the fast path's: already looked up for these layouts (no residual, no preact)
        ep = call.epilogue
        launcher(a, b, out, addend if ep.addend else out, out, out, ep.alpha, ep.beta)
    else:
        launch.gemm(call, a, b, out, addend if call.epilogue.addend else None, residual, preact)
    return out, preact


class GemmFunction(torch.autograd.Function):
    """The eager door: ``act(alpha a@b + beta addend) + residual`` for the GEMM of ``call``.

    Written in the ctx form on purpose: ``apply`` of a Function with
    ``setup_context`` binds its arguments through ``inspect.signature`` on
    every call (measured: about 45 us of Python on the dev CPU, twice what
    the rest of a ``linear`` costs).  ``torch.func`` transforms need that
    form; they get ``GemmTransformFunction``.
    """

    @staticmethod
    def forward(ctx, a, b, addend, residual, call: GemmCall, launcher=None):
        out, preact = _forward(a, b, addend, residual, call, launcher)
        save_context(ctx, call, a, b, preact)
        save_tangent_context(ctx, call, a, b, out)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        a, b, z = ctx.saved_tensors
        return (*backward_gemms(ctx, grad_out, a, b, z), None, None)

    @staticmethod
    def jvp(ctx, da, db, daddend, dresidual, *_):
        return gemm_tangent(*ctx.__dict__.pop("tangent_context"), da, db, daddend, dresidual)


class GemmTransformFunction(torch.autograd.Function):
    """The same op in the functorch form (``setup_context``, a ``vmap`` rule), for ``torch.func`` transforms.

    Returns (out, pre-activation or an empty tensor): under the transforms an
    intermediate that backward needs must be an output.
    """

    @staticmethod
    def forward(a, b, addend, residual, call: GemmCall):
        out, preact = _forward(a, b, addend, residual, call)
        return out, preact if preact is not None else out.new_empty(0)

    @staticmethod
    def setup_context(ctx, inputs, output):
        a, b, _, _, call = inputs
        ctx.mark_non_differentiable(output[1])
        save_context(ctx, call, a, b, output[1])
        ctx.tangent_context = (call, a, b, (output[0].shape, output[0].dtype))  # (``torch.func.jvp``'s)

    @staticmethod
    def backward(ctx, grad_out, grad_preact):
        a, b, z = ctx.saved_tensors
        return (*backward_gemms(ctx, grad_out, a, b, z), None)

    @staticmethod
    def jvp(ctx, da, db, daddend, dresidual, _):
        return gemm_tangent(*ctx.tangent_context, da, db, daddend, dresidual), None

    @staticmethod
    def vmap(info, in_dims, a, b, addend, residual, call):
        """``torch.func.vmap``: the mapped dimension becomes one more batch dimension of the same GEMM."""
        size = info.batch_size

        def front(t, dim):
            if t is None:
                return None
            if dim is None:  # not mapped: the same for every member (a stride-0 view)
                return t.unsqueeze(0).expand(size, *t.shape)
            return t.movedim(dim, 0)

        a, b, addend, residual = (front(t, d) for t, d in zip((a, b, addend, residual), in_dims[:4]))
        # Operands of one batch shape (the op's contract): broadcast the batch dims.
        batch = torch.broadcast_shapes(*(t.shape[:-2] for t in (a, b)))
        a = a.expand(*batch, *a.shape[-2:])
        b = b.expand(*batch, *b.shape[-2:])
        result = (*batch, a.shape[-2], b.shape[-1])
        addend = addend.expand(result) if addend is not None else None
        residual = residual.expand(result) if residual is not None else None
        return GemmTransformFunction.apply(a, b, addend, residual, call), (0, 0)


def traced_plain_gemm(
    a: torch.Tensor, b: torch.Tensor, addend: torch.Tensor | None, activation: str = "none"
) -> torch.Tensor:
    """``activation(a @ b + addend)`` in a ``torch.compile`` trace of plain tensors, where nothing
    differentiates the activation: the op call ``gemm_op`` makes for it (``GemmCall`` of that epilogue,
    ``op_args``, no pre-activation stored), written out, since Dynamo executes each bytecode of the way
    there for every layer it traces."""
    precision = "auto" if a.dtype is torch.float32 else "ieee"  # (``batched.gemm_call``'s, tracing)
    return torch.ops.tritongemm.gemm(
        a,
        b,
        addend,
        None,
        1.0,
        1.0,
        activation,
        None,
        None,
        None,
        None,
        precision,
        launch.COMPILED_GEMMS,
        False,
    )[0]


def _traceable_gemm(call: GemmCall, a, b, addend, residual):
    """The GEMM as the op ``torch.ops.tritongemm.gemm`` (``ops.py``), which traces and exports; with no
    pre-activation stored, since ``gemm_op`` fuses an activation only where nothing is differentiated."""
    return torch.ops.tritongemm.gemm(*op_args(call, a, b, addend, residual), launch.COMPILED_GEMMS, False)[0]
