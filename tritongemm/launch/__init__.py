"""Launch a planned GEMM: the launch cache, and one launcher per kernel.

``gemm(call, a, b, out, ...)`` is the one entry every public function reaches.
Everything but the data pointers and the scalars is decided once per
(``GemmCall``, layout signature) and cached as a launcher, so a repeated call
costs building the signature, a dictionary lookup and the kernel launch.

Each kernel has its launcher next to its import (``pointer.py``, ``gemv.py``,
``stream_k.py``, ``tma.py``), building the kernel's arguments by keyword.
When the plan copies unaligned operands into aligned workspaces
(``plan.Alignment``), ``aligned.py``'s launcher wraps the kernel's; the
decision is made once per launch-cache entry, so aligned calls pay nothing for it.
"""

from __future__ import annotations

import contextlib
import os
import warnings

import torch

from ..device import device_info, interpreter_enabled
from ..kernels import gemm_kernel, gemv_kernel, splitk_reduce_kernel
from ..planning.call import BLOCK_SCALINGS, GemmCall
from ..planning.eligibility import Operand
from ..planning.plan import PADDING_POLICIES, Plan, layout_letters, plan
from ..planning.problem import GemmProblem
from ..semantics import dtype_name
from . import common
from .aligned import PaddedLauncher, SharedCopy
from .common import COUNTERS, arrival_counters  # noqa: F401  (tests inspect the counters)
from .gemv import GemvLauncher
from .gluon import GluonLauncher
from .keys import layout_signature
from .pointer import PointerLauncher
from .stream_k import StreamKLauncher
from .tma import TmaLauncher

#: Plan.kernel -> its launcher class.
LAUNCHERS = {
    "pointer": PointerLauncher,
    "gemv": GemvLauncher,
    "stream_k": StreamKLauncher,
    "tma": TmaLauncher,
    "tma_persistent": TmaLauncher,
    "gluon_ws": GluonLauncher,
}


def problem_of(a: torch.Tensor, b: torch.Tensor) -> GemmProblem:
    """The ``GemmProblem`` of ``a @ b`` (same-batch operands)."""
    batch = 1
    for size in a.shape[:-2]:
        batch *= size
    return GemmProblem(
        m=a.shape[-2],
        n=b.shape[-1],
        k=a.shape[-1],
        batch=batch,
        dtype=dtype_name(a.dtype),
        layout=layout_letters(Operand.of(a), Operand.of(b)),
    )


def plan_for(call: GemmCall, a: torch.Tensor, b: torch.Tensor, out: torch.Tensor) -> Plan:
    """The plan for these tensors (what ``gemm`` would run)."""
    return _plan_for(call, a, b, Operand.of(out), out.dtype)


def _plan_for(call: GemmCall, a: torch.Tensor, b: torch.Tensor, out: Operand, out_dtype) -> Plan:
    problem = problem_of(a, b)
    return plan(
        problem,
        device_info(a.device),
        call.request,
        Operand.of(a),
        Operand.of(b),
        out,
        a.dtype,
        out_dtype,
        _PADDING[0],
        call.epilogue.scaling in BLOCK_SCALINGS,
        call.precision == "fast",
        call.epilogue.activation,
    )


def _padding_from_env() -> str:
    policy = os.environ.get("TRITONGEMM_PADDING", "auto")
    if policy not in PADDING_POLICIES:
        warnings.warn(
            f"tritongemm: TRITONGEMM_PADDING={policy!r} is not one of {PADDING_POLICIES}; using 'auto'",
            RuntimeWarning,
            stacklevel=2,
        )
        return "auto"
    return policy


#: How unaligned operands are treated (``plan.PADDING_POLICIES``); TRITONGEMM_PADDING sets the default.
_PADDING = [_padding_from_env()]


def padding_policy() -> str:
    """The padding policy: "auto" (copy unaligned operands into aligned workspaces when the cost model
    says it pays), "always" or "never"."""
    return _PADDING[0]


def set_padding(policy: str) -> str:
    """Set the padding policy for every later call; returns the old one.

    Each policy keeps its own launch cache, so switching (a benchmark comparing
    them, a ``with padding(...)`` block) costs no re-planning.
    """
    global PLANS
    if policy not in PADDING_POLICIES:
        raise ValueError(f"padding policy must be one of {PADDING_POLICIES}, got {policy!r}")
    old, _PADDING[0] = _PADDING[0], policy
    PLANS = _PLANS[policy]
    return old


@contextlib.contextmanager
def padding(policy: str):
    """``with padding("never"): ...`` runs the block under another padding policy."""
    old = set_padding(policy)
    try:
        yield
    finally:
        set_padding(old)


def gemm(
    call: GemmCall,
    a: torch.Tensor,
    b: torch.Tensor,
    out: torch.Tensor,
    addend: torch.Tensor | None = None,
    residual: torch.Tensor | None = None,
    preact: torch.Tensor | None = None,
    scales: tuple[torch.Tensor, torch.Tensor] | tuple[()] = (),
) -> torch.Tensor:
    """out = act(alpha * a @ b + beta * addend) + residual, written in place; returns ``out``.

    ``a`` is (*batch, M, K), ``b`` (*batch, K, N); ``out``, ``addend``,
    ``residual`` and ``preact`` are (*batch, M, N), all of one batch shape
    (broadcast operands arrive as stride-0 expanded views).  Any strides;
    nothing is copied.  The tensors must match the call's epilogue (an
    ``addend`` exactly when ``call.epilogue.addend``, and so on); ``scales``
    (contiguous fp32 ``scale_a``, ``scale_b``) exactly when the epilogue dequantizes
    fp8 products (``call.epilogue.scaling``; one matrix).
    """
    if out.numel() == 0:
        return out
    launcher = launcher_for(call, a, b, out, addend, residual, preact)
    ep = call.epilogue
    d, r, z = stand_ins(out, addend, residual, preact)
    run_on(a.device, launcher, a, b, out, d, r, z, ep.alpha, ep.beta, *scales)
    return out


def run_on(device: torch.device, launcher, *args) -> None:
    """``launcher(*args)`` with ``device`` current: a tensor on another GPU than torch's current one."""
    if device.type == "cuda" and device.index != _current_device():
        with torch.cuda.device(device):
            launcher(*args)
    else:
        launcher(*args)


#: The kernels whose launches a compiled graph can make itself (``traced_gemm``): those that read
#: plain pointers.  Host-side tensor descriptors (the TMA and Gluon kernels) fail Inductor's
#: analysis of a user kernel (torch 2.11: it cannot read a descriptor's fields from a fake
#: tensor), so their plans stay one opaque op in the graph.
TRACEABLE_KERNELS = ("pointer", "gemv")
#: The Triton kernels those plans launch.
TRACEABLE_JIT_KERNELS = (gemm_kernel, splitk_reduce_kernel, gemv_kernel)


def traced_plan(call: GemmCall, a: torch.Tensor, b: torch.Tensor, out_dtype: torch.dtype) -> Plan | None:
    """The plan an eager call with these traced tensors' layouts gets (``torch.compile``,
    ``torch.export``), into a freshly allocated ``out_dtype`` output, or None where a trace cannot
    hold one of tritongemm's kernels: symbolic sizes (dynamic shapes), a device that is not a GPU
    with compiled kernels, or no ``torch.library.wrap_triton``.  Nothing is cached: a trace runs
    once per compiled graph.  No output is allocated to plan it: a traced op costs compile time."""
    if a.device.type != "cuda" or interpreter_enabled() or _wrap_triton is None:
        return None
    if not all(type(x) is int for t in (a, b) for x in (*t.shape, *t.stride(), t.storage_offset())):
        return None  # a plan needs numbers
    return _plan_for(call, a, b, Operand.contiguous(a.shape[-2], b.shape[-1], out_dtype.itemsize), out_dtype)


def traced_gemm(
    chosen: Plan,
    call: GemmCall,
    a: torch.Tensor,
    b: torch.Tensor,
    out: torch.Tensor,
    addend: torch.Tensor | None = None,
    residual: torch.Tensor | None = None,
    preact: torch.Tensor | None = None,
) -> bool:
    """``gemm`` on traced tensors, planned (``traced_plan``): its kernel launches are recorded into
    the graph (``torch.library.wrap_triton``), so the compiled graph launches them itself, with no
    Python of ours per call.  Returns False, recording nothing, where the plan's kernel cannot be
    recorded (``TRACEABLE_KERNELS``; an operand copy into aligned workspaces; epilogue tensors
    with symbolic sizes): the caller then records the opaque op instead.
    """
    if not TRACE_KERNELS or chosen.kernel not in TRACEABLE_KERNELS:
        return False
    if chosen.alignment is not None and chosen.alignment.padded:
        return False
    if not all(
        type(x) is int for t in (addend, residual, preact) if t is not None for x in (*t.shape, *t.stride())
    ):
        return False
    if out.numel() == 0:
        return True
    d, r, z = stand_ins(out, addend, residual, preact)
    launcher = LAUNCHERS[chosen.kernel](chosen, call, a, b, out, d, r, z, False)
    ep = call.epilogue
    with common.tracing():
        launcher(a, b, out, d, r, z, ep.alpha, ep.beta)
    return True


_wrap_triton = getattr(torch.library, "wrap_triton", None)  # torch >= 2.6
#: TRITONGEMM_TRACE_KERNELS=0 keeps every GEMM one opaque op in compiled graphs.
TRACE_KERNELS = os.environ.get("TRITONGEMM_TRACE_KERNELS", "1") != "0"
#: Which GEMMs of a compiled graph run tritongemm's kernels (TRITONGEMM_COMPILED_GEMMS): "auto",
#: those ``plan.compiled_reason`` gives a reason for (the others are aten ops, as in the stock
#: model); "always", every one; "autotune", Inductor times the kernel against the aten ops per
#: GEMM and keeps the faster (``autograd.tuned``).
COMPILED_GEMMS = os.environ.get("TRITONGEMM_COMPILED_GEMMS", "auto")


def stand_ins(out, addend, residual, preact) -> tuple:
    """The epilogue's tensors as a launcher takes them: ``out`` in place of each absent one (the
    kernel never touches an operand its epilogue lacks)."""
    return (
        addend if addend is not None else out,
        residual if residual is not None else out,
        preact if preact is not None else out,
    )


def launcher_for(call: GemmCall, a, b, out, addend=None, residual=None, preact=None):
    """The cached launcher for these tensors (built and cached on first use).

    It is called as ``launcher(a, b, out, d, r, z, alpha, beta)`` with absent
    tensors replaced by ``out``.  A launcher whose ``takes_bases`` is true reads
    nothing but the tensors' data pointers (and ``a.device``): it may be given any
    tensor over the same memory, e.g. ``w`` in place of the planned ``w.mT``.
    """
    key = (call, layout_signature(a, b, out, addend, residual, preact))
    launcher = PLANS.launchers.get(key)
    if launcher is None:
        launcher = PLANS.keep(key, _build(call, a, b, out, addend, residual, preact))
    return launcher


_current_device = getattr(torch._C, "_cuda_getDevice", None) or torch.cuda.current_device  # no Python layers
current_device = _current_device


def _build(call, a, b, out, addend, residual, preact):
    ep = call.epilogue
    if (ep.addend, ep.residual, ep.store_preact) != (
        addend is not None,
        residual is not None,
        preact is not None,
    ):
        raise ValueError(
            f"gemm: the tensors given (addend={addend is not None}, residual={residual is not None}, "
            f"preact={preact is not None}) do not match the call's epilogue {ep}"
        )
    chosen = plan_for(call, a, b, out)
    launcher = build_launcher(chosen, call, a, b, out, *stand_ins(out, addend, residual, preact))
    launcher.plan = chosen
    return launcher


def build_launcher(chosen: Plan, call: GemmCall, a, b, out, d, r, z, interpreting: bool | None = None):
    """``chosen``'s launcher for tensors of these layouts (``d``, ``r``, ``z``: ``stand_ins``), not cached.
    ``interpreting``: whether it launches on Triton's interpreter (default: whether Triton does)."""
    interpreting = interpreter_enabled() if interpreting is None else interpreting
    kernel_launcher = LAUNCHERS[chosen.kernel]
    if chosen.alignment is not None and chosen.alignment.padded:
        return PaddedLauncher(chosen, call, a, b, out, d, r, z, interpreting, kernel_launcher)
    return kernel_launcher(chosen, call, a, b, out, d, r, z, interpreting)


class Plans:
    """What is decided once per call signature under one padding policy, kept and cleared together.

    ``launchers``: (``GemmCall``, layout signature) -> launcher, the whole way's last step
    (``launcher_for``).  ``entries``: a door's own signature -> its repeated-call entry
    (``autograd.fastpath``, ``frontend.scaled``), which holds one of those launchers and what the
    door's checks and views decided, so that a call seen before skips them.  The keys differ
    because an entry's is read from the door's arguments before any view exists, a launcher's
    from the views the whole way made.  Both are cleared by ``clear_plan_cache()`` (the tuner
    calls it after writing new configs), and each when it grows past its bound.
    """

    __slots__ = ("launchers", "entries")
    MAX_LAUNCHERS = 4096
    MAX_ENTRIES = 2048

    def __init__(self) -> None:
        self.launchers: dict = {}
        self.entries: dict = {}

    def keep(self, key, launcher):
        """Keep a launcher under ``key`` (``launcher_for``'s, or another launch module's own key) and
        return it."""
        if len(self.launchers) >= self.MAX_LAUNCHERS:
            self.launchers.clear()
        self.launchers[key] = launcher
        return launcher

    def remember(self, key, entry) -> None:
        """Keep a door's entry (None: the signature has none, so its calls take the whole way)."""
        if len(self.entries) >= self.MAX_ENTRIES:
            self.entries.clear()
        self.entries[key] = entry

    def clear(self) -> None:
        self.launchers.clear()
        self.entries.clear()


#: One ``Plans`` per padding policy (``PLANS``: the current policy's), so switching policies
#: (a benchmark comparing them, a ``with padding(...)`` block) costs no re-planning.
_PLANS: dict[str, Plans] = {policy: Plans() for policy in PADDING_POLICIES}
PLANS: Plans = _PLANS[_PADDING[0]]


def clear_plan_cache() -> None:
    """Forget every plan, launcher and repeated-call entry (after the tuning cache changed)."""
    for plans in _PLANS.values():
        plans.clear()


__all__ = [
    "PLANS",
    "Plans",
    "SharedCopy",
    "clear_plan_cache",
    "gemm",
    "launcher_for",
    "layout_signature",
    "padding",
    "padding_policy",
    "plan_for",
    "problem_of",
    "set_padding",
    "traced_gemm",
    "traced_plan",
]
