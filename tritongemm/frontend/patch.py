"""``patch()``: run torch's matmul family on tritongemm inside a ``with`` block.

While a ``patch()`` is open (in any thread), the matmul family's callables -- ``torch.matmul``,
``mm``, ``bmm``, ``addmm``, ``baddbmm``, ``F.linear`` and the ``Tensor`` methods behind ``a @ b``,
``a.mm(b)`` ... -- are replaced by thin wrappers; torch's own are put back when the last one closes.
A wrapper serves a call in a thread that has a ``patch()`` open, and hands any other call to torch's
function untouched.  Calls tritongemm cannot serve go to torch and are counted with the reason.

Why not a ``TorchFunctionMode``, which would also see references taken before the block: a mode
is called for every torch function and ``Tensor`` method of the block, a ``view`` or a ``.shape``
as much as a matmul, and that Python call cost 1-3 us each (CPU-measured): whole host-bound models
ran 0.65-0.88 of their stock speed under it.  The wrappers cost nothing outside the matmul family.
A function saved before the block opened (``from torch import matmul``) is torch's and stays so.
Inside a function ``torch.compile`` traces, an opened ``patch()`` pushes such a mode, which Dynamo
traces into the graph once.
"""

from __future__ import annotations

import contextlib
import threading
from collections import Counter
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from ..request import fastpath
from ..request.fallback import torch_reason, warn_device_fallback
from . import api


@dataclass
class PatchStats:
    """What ``patch()`` did: calls served by tritongemm and calls that fell back."""

    served: Counter = field(default_factory=Counter)  # op name -> calls
    fallbacks: Counter = field(default_factory=Counter)  # (op name, reason) -> calls
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    @property
    def total_served(self) -> int:
        return sum(self.served.values())

    @property
    def total_fallbacks(self) -> int:
        return sum(self.fallbacks.values())

    def fallback_reasons(self) -> Counter:
        reasons: Counter = Counter()
        for (_, reason), n in self.fallbacks.items():
            reasons[reason] += n
        return reasons

    def summary(self) -> str:
        lines = [
            f"tritongemm.patch: {self.total_served} calls served, {self.total_fallbacks} fell back to torch"
        ]
        lines += [f"  served   {op}: {n}" for op, n in sorted(self.served.items())]
        lines += [f"  fallback {op}: {n} ({reason})" for (op, reason), n in sorted(self.fallbacks.items())]
        return "\n".join(lines)

    def _count(self, op: str, reason: str | None) -> None:
        with self._lock:
            if reason is None:
                self.served[op] += 1
            else:
                self.fallbacks[(op, reason)] += 1


def _rmatmul(a, b, **kwargs):
    return api.matmul(b, a, **kwargs)


#: What ``patch()`` replaces: (owner, attribute, our op name, our function, tensor positional args).
_TARGETS = (
    (torch, "matmul", "matmul", api.matmul, 2),
    (torch.Tensor, "matmul", "matmul", api.matmul, 2),
    (torch.Tensor, "__matmul__", "matmul", api.matmul, 2),
    (torch.Tensor, "__rmatmul__", "matmul", _rmatmul, 2),
    (torch, "mm", "mm", api.mm, 2),
    (torch.Tensor, "mm", "mm", api.mm, 2),
    (torch, "bmm", "bmm", api.bmm, 2),
    (torch.Tensor, "bmm", "bmm", api.bmm, 2),
    (torch, "addmm", "addmm", api.addmm, 3),
    (torch.Tensor, "addmm", "addmm", api.addmm, 3),
    (torch, "baddbmm", "baddbmm", api.baddbmm, 3),
    (torch.Tensor, "baddbmm", "baddbmm", api.baddbmm, 3),
    (F, "linear", "linear", api.linear, 2),
)
# torch's callables (bound at import, before any patch() opened) -> (op name, our function, tensor args)
_ROUTES = {getattr(owner, name): (op, impl, n) for owner, name, op, impl, n in _TARGETS}
# Keyword arguments our functions take with torch's meaning.
_KWARGS = {
    "matmul": set(),
    "mm": set(),
    "bmm": set(),
    "addmm": {"beta", "alpha"},
    "baddbmm": {"beta", "alpha"},
    "linear": {"bias"},
}


def _route(op: str, args: tuple, kwargs: dict, n_tensors: int) -> str | None:
    """Why this call must go to torch, or None when tritongemm serves it."""
    extra = set(kwargs) - _KWARGS[op]
    if "out" in extra:
        return "out= argument"
    if extra:
        return f"unsupported keyword arguments {sorted(extra)}"
    tensors = list(args[:n_tensors])
    if len(args) > n_tensors and op == "linear":
        tensors.append(args[n_tensors])
    if len(args) > n_tensors + (op == "linear"):
        return "extra positional arguments"
    if op == "linear" and kwargs.get("bias") is not None:
        tensors.append(kwargs["bias"])
    tensors = [t for t in tensors if t is not None]
    if any(not isinstance(t, torch.Tensor) for t in tensors):
        return "non-tensor operand"
    return torch_reason(*tensors)


#: Our functions that have fast-path entries (``fastpath.lookup`` by op name).
_FAST_IMPLS = (api.matmul, api.mm, api.linear, api.addmm)


def _fast_call(counting: tuple, op: str, impl, args: tuple, kwargs: dict):
    """A repeated call's result from its fast-path entry (made by a call that passed every check),
    or None."""
    if impl not in _FAST_IMPLS or len(args) < 2:
        return None
    y = None
    if op == "addmm":  # torch.addmm(input, mat1, mat2): GPT-2's Conv1D, input a bias
        if len(args) == 3 and not kwargs:
            _, y = fastpath.lookup(op, args[1], args[2], args[0])
    else:
        bias = args[2] if len(args) == 3 and op == "linear" else kwargs.get("bias")
        if len(args) + len(kwargs) == 2 + (bias is not None) and (len(args) == 2 or op == "linear"):
            _, y = fastpath.lookup(op, args[0], args[1], bias)
    if y is not None:
        for stats in counting:
            stats._count(op, None)
    return y


def _serve(counting: tuple, func, route: tuple, args: tuple, kwargs: dict):
    """One call of torch's ``func``: on tritongemm (``route``'s function) where it can, else torch's."""
    y = _fast_call(counting, route[0], route[1], args, kwargs)
    return _serve_whole_way(counting, func, route, args, kwargs) if y is None else y


def _serve_whole_way(counting: tuple, func, route: tuple, args: tuple, kwargs: dict):
    """``_serve`` for a call with no fast-path entry: checked, counted, and served or handed to torch."""
    op, impl, n_tensors = route
    reason = _route(op, args, kwargs, n_tensors)
    if not torch.compiler.is_compiling():  # counted in eager mode; a compiled graph is traced once
        for stats in counting:
            stats._count(op, reason)
    if reason is not None:
        if isinstance(args[0], torch.Tensor):
            warn_device_fallback("tritongemm.patch()", reason, args[0].device)
        return func(*args, **kwargs)
    return impl(*args, **kwargs)


class _Router:
    """A thread's open ``patch()`` uses: every one counts each call once (``counting``); nesting a
    use adds a counter, not a second router, so no call is routed (or counted) twice.  ``counting``
    is replaced, never mutated, so a call being counted meanwhile sees a consistent tuple."""

    def __init__(self) -> None:
        self.counting: tuple[PatchStats, ...] = ()


_active = threading.local()  # .router: this thread's _Router while a patch() is open in it


def _wrapper(func, route: tuple, where: tuple[str, str]):
    """What stands for torch's ``func`` while a ``patch()`` is open somewhere: it serves the calls of
    threads with one open and passes the others to ``func``."""

    def routed(*args, **kwargs):
        router = getattr(_active, "router", None)
        if router is None:
            return func(*args, **kwargs)
        if torch.compiler.is_compiling():  # (Dynamo traces this once; the graph holds what it chose)
            return _serve(router.counting, func, route, args, kwargs)
        y = _fast_call(router.counting, route[0], route[1], args, kwargs)
        if y is not None:
            return y
        # The torch calls made while serving this one are torch's (as inside a mode's handler): a
        # fallback's own Python (``Tensor.__rmatmul__`` calls ``torch.matmul``) must not be routed
        # and counted again.
        _active.router = None
        try:
            return _serve_whole_way(router.counting, func, route, args, kwargs)
        finally:
            _active.router = router

    # Named where it stands (``torch.matmul``, ``torch.Tensor.mm``, ``torch.nn.functional.linear``):
    # pickle saves a function by that name, which loads torch's own again outside a block.
    routed.__module__, routed.__qualname__ = where
    routed.__name__ = where[1].rsplit(".", 1)[-1]
    routed.__doc__ = getattr(func, "__doc__", None)
    return routed


#: (owner, attribute, torch's callable or None where the owner only inherits it, the wrapper)
_REPLACEMENTS = tuple(
    (
        owner,
        name,
        vars(owner).get(name),
        _wrapper(
            getattr(owner, name),
            (op, impl, n),
            ("torch", f"Tensor.{name}") if owner is torch.Tensor else (owner.__name__, name),
        ),
    )
    for owner, name, op, impl, n in _TARGETS
)
_installed = 0  # open eager patch() uses, all threads together
_install_lock = threading.Lock()


def _prime_torch_tables() -> None:
    """Build the tables torch fills once, lazily, by looking its functions up by name, before those
    names point at the wrappers: Dynamo's rules for which callables are torch's in-graph functions,
    TorchScript's builtins, ``torch.overrides``' list.  Built inside a block, they would hold the
    wrappers and miss torch's own for the rest of the process (a ``torch.compile`` traced inside one
    took a wrapper for ``torch.mm``).  TorchScript also learns each wrapper as the aten op it stands
    for, so a function scripted inside a block calls torch's (script never ran on tritongemm)."""
    torch.overrides.get_overridable_functions()
    jit_builtins = getattr(torch.jit, "_builtins", None)
    if hasattr(jit_builtins, "_register_builtin"):
        for owner, name, _, wrapper in _REPLACEMENTS:
            if owner is not torch.Tensor:
                jit_builtins._register_builtin(wrapper, f"aten::{name}")
    try:
        from torch._dynamo import trace_rules
    except ImportError:  # (a torch without Dynamo builds no such table)
        return
    trace_rules.get_torch_obj_rule_map()


def _install() -> None:
    global _installed
    with _install_lock:
        if _installed == 0:
            _prime_torch_tables()
            for owner, name, _, wrapper in _REPLACEMENTS:
                setattr(owner, name, wrapper)
        _installed += 1


def _uninstall() -> None:
    global _installed
    with _install_lock:
        _installed -= 1
        if _installed == 0:
            for owner, name, own, _ in _REPLACEMENTS:
                if own is None:
                    delattr(owner, name)  # (the owner inherits torch's again: the Tensor methods)
                else:
                    setattr(owner, name, own)


class _TritonGemmMode(TorchFunctionMode):
    """The routing of a ``patch()`` opened where Dynamo traces: a function mode, which Dynamo traces
    into the graph (it cannot trace the replacement of torch's functions while it runs)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        route = _ROUTES.get(func)
        if route is None:
            return func(*args, **kwargs)
        return _serve((), func, route, args, kwargs)


#: What a ``patch()`` opened in a traced function returns: it counts nothing.
_TRACED_STATS = PatchStats()


class patch(contextlib.ContextDecorator):
    """Route torch's matmul family to tritongemm while active.

    >>> with tritongemm.patch() as stats:
    ...     y = model(x)
    >>> print(stats.summary())

    Also a decorator (``@tritongemm.patch()``); ``patch.stats`` holds the counts
    of the most recent use (each use starts from zero), or of the current one
    while a use is open.

    Nested contexts: every open context counts every call made inside it once,
    served or not (an outer context's counts include its inner ones').
    Contexts are per thread (as torch's function modes are): a context routes
    and counts the calls made in the thread that opened it.

    Opened inside a ``torch.compile``'d function (or one it decorates), it routes the calls Dynamo
    traces there and counts nothing: a graph is traced once and run many times, and Dynamo cannot
    trace the counting's locks and thread-local state.  Its stats are then an empty ``PatchStats``.
    """

    def __init__(self) -> None:
        if torch.compiler.is_compiling():  # (see ``_enter_traced``)
            return
        self.stats = PatchStats()
        self._uses = threading.local()  # .stack: this object's open uses in this thread

    def __enter__(self) -> PatchStats:
        if torch.compiler.is_compiling():
            return self._enter_traced()
        stack = self._uses.__dict__.setdefault("stack", [])
        router = getattr(_active, "router", None)
        owns_router = router is None
        if owns_router:
            router = _Router()
            _install()
            _active.router = router
        stats = PatchStats()
        router.counting = (*router.counting, stats)
        stack.append((router, stats, owns_router))
        self.stats = stats
        return stats

    def __exit__(self, *exc) -> bool:
        if torch.compiler.is_compiling():
            *open_, mode = self._traced
            self._traced = tuple(open_)
            mode.__exit__(*exc)
            return False
        stack = self._uses.stack
        router, stats, owns_router = stack.pop()
        # By identity: PatchStats compares by value, and two fresh ones are equal.
        router.counting = tuple(s for s in router.counting if s is not stats)
        if owns_router:
            _active.router = None
            _uninstall()
        if stack:  # a recursive use of this object is still open: it is the current one
            self.stats = stack[-1][1]
        return False

    def _recreate_cm(self) -> patch:
        """The context a decorated call opens: this one, or, where Dynamo traces the call, a fresh one
        (Dynamo enters only context managers made in the function it traces)."""
        return patch() if torch.compiler.is_compiling() else self

    def _enter_traced(self) -> PatchStats:
        """A use Dynamo traces: a mode of its own pushed, routing only (Dynamo traces a function mode's
        ``__torch_function__`` into the graph); no counts, no thread-local bookkeeping."""
        mode = _TritonGemmMode()
        mode.__enter__()
        self._traced = (*getattr(self, "_traced", ()), mode)  # (a tuple: what Dynamo traces in every release)
        return _TRACED_STATS


__all__ = ["patch", "PatchStats"]
