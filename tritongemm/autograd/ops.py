"""The ops ``torch.compile`` and ``torch.export`` see: ``tritongemm::gemm``, ``tritongemm::gemm_extern``
and ``tritongemm::gemm_tuned`` (``tuned``).

Under a trace (fake or functional tensors) the autograd doors call
``torch.ops.tritongemm.gemm`` (``autograd.gemm_op``); DTensor runs it on
each rank's shards (``distributed``).  Its fake kernel gives the output's
shape, its registered autograd the same backward as the eager op
(``autograd.backward_gemms``), and under AOTAutograd's functionalization it
is replaced by its body: aten ops where tritongemm's kernel has no edge
(``plan.compiled_reason``); elsewhere, plans on kernels that read plain
pointers become Triton launches Inductor makes itself, the others one opaque
call, ``gemm_extern``.  Every argument but the tensors is the ``GemmCall`` as plain
values (``call.op_args``).
"""

from __future__ import annotations

import torch
from torch._subclasses.fake_tensor import FakeTensor
from torch._subclasses.functional_tensor import FunctionalTensor, FunctionalTensorMode

from .. import launch
from ..device import interpreter_enabled
from ..launch import precompile
from ..launch.keys import layout
from ..planning.call import GemmCall, from_op_args
from ..planning.plan import compiled_reason
from ..semantics import dot_precision
from . import tuned
from .aten import aten_ops
from .function import alloc_out, backward_gemms, save_context
from .modes import gemm_flops, register_flops


def _resolve_precision(call: GemmCall, a: torch.Tensor) -> GemmCall:
    """A traced call reads torch's TF32 switch when it runs (it cannot be read while tracing)."""
    return call._replace(precision=dot_precision(a.dtype)) if call.precision == "auto" else call


def _outputs(call: GemmCall, a, b) -> tuple[torch.Tensor, torch.Tensor]:
    out = alloc_out((*a.shape[:-2], a.shape[-2], b.shape[-1]), call.out_dtype or a.dtype, a.device)
    store = call.epilogue.store_preact
    return out, (torch.empty_like(out) if store else out.new_empty(0))


def _prepared(args) -> tuple:
    """The op's arguments as a launch takes them: (call, a, b, out, addend, residual, preact, the
    pre-activation output), with ``None`` for an epilogue tensor the call does not read or write."""
    call, a, b, addend, residual = from_op_args(args)
    call = _resolve_precision(call, a)
    out, preact = _outputs(call, a, b)
    ep = call.epilogue
    return (call, a, b, out, addend if ep.addend else None, residual, preact if ep.store_preact else None,
            preact)  # fmt: skip


class _ExternEntry:
    """What ``gemm_extern``'s first call with one signature decided: its launcher and its outputs."""

    __slots__ = ("launcher", "shape", "dtype", "addend", "store", "alpha", "beta")

    def __init__(self, launcher, out: torch.Tensor, call: GemmCall):
        self.launcher, self.shape, self.dtype = launcher, tuple(out.shape), out.dtype
        ep = call.epilogue
        self.addend, self.store, self.alpha, self.beta = ep.addend, ep.store_preact, ep.alpha, ep.beta


def _gemm_extern(a, b, addend, residual, alpha, beta, activation, out_dtype, pipeline, decomposition, config_json,
                 precision="ieee", route="auto", store_preact=True):  # fmt: skip
    """``tritongemm::gemm_extern``: the GEMM as one opaque call, launched by tritongemm.

    A compiled graph makes the same call every step.  Its first call takes the whole way (``_prepared``,
    ``launch.gemm``); the launcher and outputs it decided are then kept (``launch.PLANS.entries``, cleared
    with the plans) under the op's values and its operands' layouts, and later calls go straight to the
    launch: host time is what a compiled graph cannot hide without CUDA graphs.
    """
    # (``schema``'s defaults: a graph may leave them out, and the dispatcher passes what it was given)
    values = (alpha, beta, activation, out_dtype, pipeline, decomposition, config_json)
    args = (a, b, addend, residual, *values, precision, route, store_preact)
    key = ("gemm_extern", values, precision if precision != "auto" else dot_precision(a.dtype), route,
           store_preact, layout(a), layout(b), layout(addend), layout(residual), a.device)  # fmt: skip
    entry = launch.PLANS.entries.get(key)
    if entry is None:
        precompile.wait()  # a kernel the trace started compiling (``precompile.request``) is used here
        call, a, b, out, addend, residual, preact, preact_out = _prepared(args)
        launch.gemm(call, a, b, out, addend, residual, preact)
        if out.numel():
            launcher = launch.launcher_for(call, a, b, out, addend, residual, preact)
            launch.PLANS.remember(key, _ExternEntry(launcher, out, call))
        return out, preact_out
    out = alloc_out(entry.shape, entry.dtype, a.device)
    preact = torch.empty_like(out) if entry.store else None
    d = addend if entry.addend else out
    launch.run_on(a.device, entry.launcher, a, b, out, d, out if residual is None else residual,
                  out if preact is None else preact, entry.alpha, entry.beta)  # fmt: skip
    return out, (out.new_empty(0) if preact is None else preact)


def _gemm_extern_fake(a, b, addend, residual, alpha, beta, activation, out_dtype, pipeline, decomposition,
                      config_json, precision="ieee", route="auto", store_preact=True):  # fmt: skip
    args = (a, b, addend, residual, alpha, beta, activation, out_dtype, pipeline, decomposition, config_json,
            precision, route, store_preact)  # fmt: skip
    call, a, b, _, _ = from_op_args(args)
    return _outputs(call, a, b)


def _gemm_tuned(*args):
    """``tritongemm::gemm_tuned``: ``gemm_extern``'s output alone (``tuned``)."""
    return _gemm_extern(*args)[0]


def _gemm_tuned_fake(*args):
    return _gemm_extern_fake(*args)[0]


def _gemm(
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
    precision: str = "ieee",
    route: str = "auto",
    store_preact: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``tritongemm::gemm``: (act(alpha a@b + beta addend) + residual, pre-activation or an empty tensor).

    Traced (fake or functional tensors) on a GPU, a GEMM where tritongemm has no edge over cuBLAS
    becomes the stock model's aten ops (``_hand_to_aten``), which Inductor fuses around; the others'
    kernel launches go into the graph itself where the plan's kernel allows it
    (``launch.traced_gemm``), so a compiled graph launches them with no Python of ours per call;
    elsewhere the graph holds the opaque ``gemm_extern``.  On real tensors (eager, or DTensor's
    local shards) it launches directly.

    ``route`` is ``launch.COMPILED_GEMMS`` as the call was traced: an argument, so that it is part of
    the graph torch.compile caches (its caches key on the graph, not on this op's body).
    ``store_preact``: with an activation, whether the pre-activation is written for backward (the op's
    autograd reads it).  ``autograd.gemm_op`` passes False: it sends an activation here only where
    nothing is differentiated (else it calls the op without one, then torch's activation), and the
    pre-activation's stores would cost a pass over the output.
    """
    args = (a, b, addend, residual, alpha, beta, activation, out_dtype, pipeline, decomposition, config_json,
            precision, route, store_preact)  # fmt: skip
    if type(a) in (torch.Tensor, torch.nn.Parameter):
        return _gemm_extern(*args)
    # Each op made here is traced (functionalized, faked) at compile time: decide before allocating.
    call = _resolve_precision(from_op_args(args)[0], a)
    chosen = launch.traced_plan(call, a, b, call.out_dtype or a.dtype)
    if _hand_to_aten(chosen, call, a, route):
        return aten_ops(call, a, b, addend, residual)
    call, a, b, out, d, residual, preact, preact_out = _prepared(args)
    if (
        route == "autotune"
        and tuned.eligible(route, call, a, residual)
        and tuned.available(TUNED_OP, aten_tuned)
    ):
        return torch.ops.tritongemm.gemm_tuned(*args), preact_out
    if chosen is not None and launch.traced_gemm(chosen, call, a, b, out, d, residual, preact):
        return out, preact_out
    if chosen is not None:
        precompile.request_gemm(chosen, call, a, b, out, d, residual, preact)  # built while Inductor compiles
    return torch.ops.tritongemm.gemm_extern(*args)


def _hand_to_aten(chosen, call: GemmCall, a: torch.Tensor, route: str) -> bool:
    """Does this traced GEMM become aten ops (``route``: ``launch.COMPILED_GEMMS``; ``plan.compiled_reason``)?

    Only on a GPU with compiled kernels: the interpreter keeps tritongemm's kernels, which is
    what it is for.  Sizes a plan cannot be made for (dynamic shapes, ``chosen`` None) go to aten
    too unless the request or the dtypes say otherwise."""
    if route != "auto" or a.device.type != "cuda" or interpreter_enabled():
        return False
    out_dtype = call.out_dtype or a.dtype
    return compiled_reason(chosen, call.request, a.dtype, out_dtype, call.epilogue.activation) is None


def aten_tuned(a, b, addend=None, residual=None, **values) -> torch.Tensor:
    """``gemm_tuned`` in aten ops, the choice Inductor weighs against it (``tuned``): it passes the
    tensors in order and the rest by name, as the op's schema names them."""
    keys = ("alpha", "beta", "activation", "out_dtype", "pipeline", "decomposition", "config_json",
            "precision", "route", "store_preact")  # fmt: skip
    call, a, b, addend, residual = from_op_args((a, b, addend, residual, *(values[k] for k in keys)))
    return aten_ops(call, a, b, addend, residual)[0]


def _setup_context(ctx, inputs, output):
    call, a, b, _, _ = from_op_args(inputs)
    save_context(ctx, call, a, b, output[1])


def _op_backward(ctx, grad_out, grad_preact):
    a, b, z = ctx.saved_tensors
    return (*backward_gemms(ctx, grad_out, a, b, z), *([None] * 10))


def _decompose_when_functional(mode, op, types, args, kwargs):
    """``tritongemm::gemm`` under AOTAutograd's functionalization (``torch.compile``): replaced by
    its body, whose kernel launches Inductor then takes over (what ``torch.library.triton_op``
    does; registered here directly because ``triton_op`` imports Inductor when it is called,
    which would add about a second to ``import tritongemm``).  ``torch.export`` keeps the op
    whole, as it does a ``triton_op``'s."""
    from torch.export._trace import custom_triton_ops_decomposition_disabled

    if custom_triton_ops_decomposition_disabled():
        return mode.__torch_dispatch__(op, types, args, kwargs)
    if any(not issubclass(t, (FakeTensor, FunctionalTensor)) and t is not torch.Tensor for t in types):
        return NotImplemented
    with mode:
        return _gemm(*args, **kwargs)


#: Both ops' schema: the tensors, then the ``GemmCall`` as plain values (a config as JSON).
GEMM_SCHEMA = torch.library.infer_schema(_gemm, mutates_args=())
# ``gemm_extern`` is what a compiled graph calls, once per GEMM and step: defined on a plain
# ``Library``, so the dispatcher calls ``_gemm_extern`` directly.  As a ``custom_op`` it ran behind
# two Python wrappers (its autograd and backend kernels: about 45 us of host time a call on an H100's
# host, where the whole compiled Linear took 80).  Nothing differentiates it (the graph's autograd
# is AOTAutograd's), so it has no autograd kernel: torch's fallback passes calls through.
_LIB = torch.library.Library("tritongemm", "FRAGMENT")
_LIB.define("gemm_extern" + GEMM_SCHEMA)
_LIB.impl("gemm_extern", _gemm_extern, "CompositeExplicitAutograd")
torch.library.register_fake("tritongemm::gemm_extern", _gemm_extern_fake)
TUNED_OP = torch.library.custom_op(
    "tritongemm::gemm_tuned",
    _gemm_tuned,
    mutates_args=(),
    schema=GEMM_SCHEMA.replace("-> (Tensor, Tensor)", "-> Tensor"),
)
TUNED_OP.register_fake(_gemm_tuned_fake)
_GEMM_OP = torch.library.custom_op("tritongemm::gemm", _gemm, mutates_args=())
_GEMM_OP.register_fake(_gemm_extern_fake)
_GEMM_OP.register_autograd(_op_backward, setup_context=_setup_context)
register_flops([torch.ops.tritongemm.gemm, torch.ops.tritongemm.gemm_extern], gemm_flops)
if hasattr(_GEMM_OP, "register_torch_dispatch"):
    _GEMM_OP.register_torch_dispatch(FunctionalTensorMode, _decompose_when_functional)
    # What a triton_op records: the kernels its body may launch (AOTAutograd's cache key hashes them).
    torch._library.triton.triton_ops_to_kernels["tritongemm::gemm"] = list(launch.TRACEABLE_JIT_KERNELS)
