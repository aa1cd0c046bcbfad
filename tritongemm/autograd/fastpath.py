"""Repeated calls: the entries that run them, forward and backward.

A model calls the same few GEMMs over and over with the same shapes.  The
first call of each goes the whole way (``request``: checks, views; the
autograd op; ``launch``: plan, launcher); the door then remembers, keyed by
the call's signature (``request.fastpath``), an ``Entry``: the launcher that
call's views got and what to allocate, so the next identical call costs a
dictionary lookup, one ``torch.empty`` and the launch (host time within 1.2x
of torch's).  Only the common forms have entries: ``linear(x, w[, bias])``
and ``matmul``/``mm`` of a (*, M, K) and a (K, N) matrix, with none of the
optional arguments; everything else takes the whole way.

Entries launch with the tensors the user passed (``x``, ``w``, ``bias``):
their data pointers are those of the views the first call planned with
(``x.view(-1, K)``, ``w.mT``, ``bias.expand(M, N)``), and launchers that
read only pointers (``takes_bases``) are the only ones remembered.

With autograd an entry launches as without, and its output gets a C++
``grad_fn`` (``native``: ~0.5 us where an ``autograd.Function`` costs ~3.5);
until that is built, or where it cannot be, the entry runs its own lean
``autograd.Function`` (``EntryFunction``).  Either way backward is
``Entry.backward``: the two gradient GEMMs from launchers remembered per
layout of the incoming gradient -- the same kernels and the same rules
(``autograd.backward_gemms``: a transposed weight gets its gradient in its
own layout) as the whole way, which backward still takes under
``create_graph``, a transform or a trace.
"""

from __future__ import annotations

import torch

from .. import launch
from ..launch import native
from ..planning.call import Epilogue, GemmCall, Request
from .function import alloc_out, backward_gemms, gradient_gemm, is_transposed_view, operand_view

_PLAIN_TYPES = (torch.Tensor, torch.nn.Parameter)
_functorch_active = torch._C._are_functorch_transforms_active
_grad_enabled = torch.is_grad_enabled

_MISSING = object()


class Entry:
    """What a repeated ``x @ w`` (or ``x @ w.mT``) + bias does, decided by its first call."""

    __slots__ = (
        "launcher",
        "call",
        "out_shape",
        "mn",
        "fold",
        "dtype",
        "device",
        "cuda_index",
        "transposed",
        "beta",
        "grad_call",
        "grad_launches",
        "bias_dims",
        "x_shape",
        "k",
        "a_transposed",
        "b_transposed",
    )

    def __init__(self, call: GemmCall, x, a, b, out, addend, out_shape, fold, transposed: bool):
        """The entry of ``x``'s call, planned on its views ``a`` and ``b`` (``out`` and ``addend``
        (None: no bias) as the launch will see them); ``launcher`` is the one those views get."""
        self.call = call
        self.out_shape = out_shape
        self.mn = (a.shape[0], b.shape[1])
        self.fold = fold  # (M, K) when x has batch dims to fold, else None
        self.dtype = x.dtype
        self.device = x.device
        self.cuda_index = x.device.index if x.device.type == "cuda" else None
        self.transposed = transposed
        self.beta = call.epilogue.beta
        # What backward needs of the operands' layouts (fixed by the signature), saved or not.
        self.x_shape, self.k = tuple(x.shape), a.shape[1]
        self.a_transposed, self.b_transposed = is_transposed_view(a), is_transposed_view(b)
        # backward_gemms' gradient call: alpha of the forward (1 here), no epilogue, the same precision.
        self.grad_call = GemmCall(Epilogue(), Request(), None, call.precision)
        self.grad_launches: dict = {}  # (grad strides, grad aligned, needs) -> [grad x, grad w] launches
        self.bias_dims = tuple(range(len(out_shape) - 1))
        self.launcher = launch.launcher_for(call, a, b, out, addend)

    def run(self, x, w, bias) -> torch.Tensor:
        """The entry's launch on (x, w, bias), through ``EntryFunction`` where autograd records it."""
        grad = _grad_enabled() and (
            x.requires_grad or w.requires_grad or (bias is not None and bias.requires_grad)
        )
        if grad:
            record = native.RECORD
            if record is None:  # not built (yet; ``build`` started it): the Python Function
                return _apply_entry_function(x, w, bias, self)
        out = alloc_out(self.out_shape, self.dtype, self.device)
        self.launcher(x, w, out, out if bias is None else bias, out, out, 1.0, self.beta)
        if grad:
            out = record(out, x, w, bias, self)  # out with a C++ grad_fn calling self.backward
            if out is None:  # declined (forward-mode AD): the Function says what torch says
                return _apply_entry_function(x, w, bias, self)
        return out

    def backward(self, needs, g, x, w) -> tuple:
        """(grad x, grad w, grad bias) for ``EntryFunction``, each None where not needed."""
        grads = None
        if not _grad_enabled() and type(g) in _PLAIN_TYPES and not _functorch_active():
            key = (g.stride(), not g.data_ptr() & 15, needs)
            grads = self.grad_launches.get(key, _MISSING)
            if grads is _MISSING:
                grads = self.grad_launches[key] = _grad_launches(self, needs, g, x, w)
        if grads is None:  # double backward, a transform, or layouts without bases-only launchers
            return self.slow_backward(needs, g, x, w)
        operands = (g, x, w) if grads[2] is None else (grads[2](g), x, w)  # (dZ copied once, aligned)
        grad_x = grad_w = None
        if grads[0] is not None:
            grad_x = grads[0](operands)
        if grads[1] is not None:
            grad_w = grads[1](operands)
        grad_bias = g.sum(self.bias_dims) if needs[2] else None
        return grad_x, grad_w, grad_bias

    def views(self, x, w) -> tuple:
        """(a, b): the forward's planned views of ``x`` and ``w`` (None stays None)."""
        a = x if x is None or self.fold is None else x.view(self.fold)
        b = w.mT if w is not None and self.transposed else w
        return a, b

    def slow_backward(self, needs, g, x, w) -> tuple:
        """The whole way's backward (``autograd.backward_gemms``) on the views the forward planned."""
        a, b = self.views(x, w)
        g2 = g if self.fold is None else g.reshape(self.mn)
        grad_a, grad_b, grad_d, _ = backward_gemms(_BackwardContext(self, needs), g2, a, b, None)
        grad_x = grad_a if grad_a is None or self.fold is None else grad_a.view(self.x_shape)
        grad_w = grad_b.mT if grad_b is not None and self.transposed else grad_b
        grad_bias = grad_d.sum(0) if grad_d is not None else None
        return grad_x, grad_w, grad_bias


class EntryFunction(torch.autograd.Function):
    """An entry's ``x @ w (+ bias)`` with autograd: the entry's launch, and ``Entry.backward``.

    Takes the user's tensors as they are (no views to make or record), saves
    only what backward will read, and keeps everything else on the entry.
    """

    @staticmethod
    def forward(ctx, x, w, bias, entry):
        out = alloc_out(entry.out_shape, entry.dtype, entry.device)
        entry.launcher(x, w, out, out if bias is None else bias, out, out, 1.0, entry.beta)
        ctx.entry = entry
        needs = ctx.needs_input_grad
        ctx.save_for_backward(x if needs[1] else None, w if needs[0] else None)
        return out

    @staticmethod
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        needs = ctx.needs_input_grad
        return (*ctx.entry.backward(needs[:3], g, x, w), None)


def _raw_apply(function):
    """``function.apply`` without ``Function.apply``'s Python wrapper, where torch has the C method it wraps.

    The wrapper binds default arguments for the ``setup_context`` form and
    unwraps dead ``torch.func`` wrappers; neither applies here (``lookup``
    admits only plain tensors, with no transform active), and it costs a
    few microseconds of a call whose budget is torch's ~20.
    """
    method = getattr(getattr(torch._C, "_FunctionBase", None), "__dict__", {}).get("apply")
    return method.__get__(None, function) if hasattr(method, "__get__") else function.apply


_apply_entry_function = _raw_apply(EntryFunction)


class _BackwardContext:
    """What ``autograd.backward_gemms`` reads from an autograd context."""

    def __init__(self, entry: Entry, needs):
        self.call = entry.call
        self.needs_input_grad = (needs[0], needs[1], needs[2], False)
        self.a_transposed, self.b_transposed = entry.a_transposed, entry.b_transposed


class _GradLaunch:
    """One gradient GEMM of an entry: which of (g, x, w) are its operands, what to allocate, what to return.

    The launcher was planned on views (``g.mT``, ``w.mT``, ...); it reads only
    data pointers, which the views share with the tensors given here.
    """

    __slots__ = ("launcher", "a", "b", "shape", "dtype", "device", "transpose")

    def __init__(self, launcher, a: int, b: int, shape, like: torch.Tensor, transpose: bool):
        self.launcher, self.a, self.b = launcher, a, b
        self.shape, self.dtype, self.device = shape, like.dtype, like.device
        self.transpose = transpose

    def copies(self, place: int) -> bool:
        """Whether the launcher copies the operand at ``place`` into an aligned workspace of its own."""
        a_ws, b_ws = getattr(self.launcher, "a_ws", None), getattr(self.launcher, "b_ws", None)
        return (self.a == place and a_ws is not None) or (self.b == place and b_ws is not None)

    def __call__(self, operands) -> torch.Tensor:
        out = alloc_out(self.shape, self.dtype, self.device)
        self.launcher(operands[self.a], operands[self.b], out, out, out, out, 1.0, 0.0)
        return out.mT if self.transpose else out


G, X, W = 0, 1, 2  # places in the (g, x, w) a gradient launch is called with
PLACES = {"g": G, "a": X, "b": W}  # where each operand ``gradient_gemm`` names sits there


def _grad_launches(entry: Entry, needs, g, x, w):
    """(grad-x launch, grad-w launch, dZ's shared aligned copy or None) for gradients of ``g``'s layout,
    or None (take the whole way).

    The operand order and orientation follow ``autograd.backward_gemms`` on the
    forward's views (``a``: x, folded; ``b``: ``w.mT`` for linear, else ``w``), so
    the same kernels run as there: dA = dZ B^T (or dA^T = B dZ^T for a
    column-major A), dB = A^T dZ (or dB^T = dZ^T A for a column-major B, e.g. ``w.mT``).
    Where both would copy an unaligned dZ into workspaces of their own (an LM head's odd
    vocabulary), dZ is copied once, aligned, and both read that copy.
    """
    if g.dtype != entry.dtype:
        return None
    (m, n) = entry.mn
    try:
        g2 = g if entry.fold is None else g.view(m, n)
    except RuntimeError:
        return None  # strides that do not fold (the whole way copies)
    a, b = entry.views(x, w)
    grads = _plan_grad_launches(entry, needs, g2, a, b, g)
    if grads is None or not all(launch_ is not None and launch_.copies(G) for launch_ in grads):
        return None if grads is None else (*grads, None)
    shared = launch.SharedCopy(g2)
    aligned = _plan_grad_launches(entry, needs, shared.example(), a, b, g)
    if aligned is None or any(launch_.copies(G) for launch_ in aligned):
        return (*grads, None)
    return (*aligned, shared)


def _plan_grad_launches(entry: Entry, needs, g2, a, b, g):
    """[grad-x launch, grad-w launch] (None where not needed) planned on ``g2`` (dZ as (M, N)), or None
    where a launcher reads more than its tensors' data pointers."""
    views = {"g": g2, "a": a, "b": b}
    grads = [None, None]
    for slot in (0, 1):
        if not needs[slot]:
            continue
        lhs, rhs, flip = gradient_gemm(slot, (entry.a_transposed, entry.b_transposed)[slot])
        lhs_view, rhs_view = operand_view(views, lhs), operand_view(views, rhs)
        lhs_at, rhs_at = PLACES[lhs[0]], PLACES[rhs[0]]
        planned = (lhs_view.shape[0], rhs_view.shape[1])
        if slot == 0:  # dA^T stored (K, M), or dA written straight into x's shape
            shape, transpose = (planned if flip else entry.x_shape), flip
        else:  # dB, or dB^T in w's own layout (a linear's weight is B^T)
            shape, transpose = planned, flip != entry.transposed
        out = torch.empty(planned, dtype=entry.dtype, device=entry.device)
        launcher = launch.launcher_for(entry.grad_call, lhs_view, rhs_view, out)
        if not getattr(launcher, "takes_bases", False):
            return None
        grads[slot] = _GradLaunch(launcher, lhs_at, rhs_at, shape, g, transpose)
    return grads


__all__ = ["Entry", "EntryFunction"]
