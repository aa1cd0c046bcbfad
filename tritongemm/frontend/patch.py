"""``patch()``: run torch's matmul family on tritongemm inside a ``with`` block.

Implemented as a ``TorchFunctionMode``, so it sees every spelling of a call
(``torch.matmul``, ``Tensor.matmul``, ``a @ b``, ``F.linear`` inside
``nn.Linear`` ...) and is undone exactly on exit.  Calls tritongemm cannot
serve go to torch and are counted with the reason.
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


# torch function -> (our op name, our implementation, names of its tensor positional args)
_ROUTES = {
    torch.matmul: ("matmul", api.matmul, 2),
    torch.Tensor.matmul: ("matmul", api.matmul, 2),
    torch.Tensor.__matmul__: ("matmul", api.matmul, 2),
    torch.Tensor.__rmatmul__: ("matmul", _rmatmul, 2),
    torch.mm: ("mm", api.mm, 2),
    torch.Tensor.mm: ("mm", api.mm, 2),
    torch.bmm: ("bmm", api.bmm, 2),
    torch.Tensor.bmm: ("bmm", api.bmm, 2),
    torch.addmm: ("addmm", api.addmm, 3),
    torch.Tensor.addmm: ("addmm", api.addmm, 3),
    torch.baddbmm: ("baddbmm", api.baddbmm, 3),
    torch.Tensor.baddbmm: ("baddbmm", api.baddbmm, 3),
    F.linear: ("linear", api.linear, 2),
}
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


class _TritonGemmMode(TorchFunctionMode):
    """One per thread, however many ``patch()`` contexts are open in it.

    Every open context of the thread counts each call once (``counting``);
    nesting a context adds a counter, not a second mode, so no call is routed
    (or counted) twice.  ``counting`` is replaced, never mutated, so a call
    being counted meanwhile sees a consistent tuple.
    """

    def __init__(self) -> None:
        super().__init__()
        self.counting: tuple[PatchStats, ...] = ()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        route = _ROUTES.get(func)
        if route is None:
            return func(*args, **kwargs)
        op, impl, n_tensors = route
        if impl in _FAST_IMPLS and len(args) >= 2:
            # A repeated call: its fast-path entry was made by a call that passed every check.
            y = None
            if op == "addmm":  # torch.addmm(input, mat1, mat2): GPT-2's Conv1D, input a bias
                if len(args) == 3 and not kwargs:
                    _, y = fastpath.lookup(op, args[1], args[2], args[0])
            else:
                bias = args[2] if len(args) == 3 and op == "linear" else kwargs.get("bias")
                if len(args) + len(kwargs) == 2 + (bias is not None) and (len(args) == 2 or op == "linear"):
                    _, y = fastpath.lookup(op, args[0], args[1], bias)
            if y is not None:
                for stats in self.counting:
                    stats._count(op, None)
                return y
        reason = _route(op, args, kwargs, n_tensors)
        if not torch.compiler.is_compiling():  # counted in eager mode; a compiled graph is traced once
            for stats in self.counting:
                stats._count(op, reason)
        if reason is not None:
            if isinstance(args[0], torch.Tensor):
                warn_device_fallback("tritongemm.patch()", reason, args[0].device)
            return func(*args, **kwargs)
        return impl(*args, **kwargs)


_active = threading.local()  # .mode: this thread's _TritonGemmMode while a patch() is open in it
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
        mode = getattr(_active, "mode", None)
        owns_mode = mode is None
        if owns_mode:
            mode = _TritonGemmMode()
            mode.__enter__()
            _active.mode = mode
        stats = PatchStats()
        mode.counting = (*mode.counting, stats)
        stack.append((mode, stats, owns_mode))
        self.stats = stats
        return stats

    def __exit__(self, *exc) -> bool:
        if torch.compiler.is_compiling():
            *open_, mode = self._traced
            self._traced = tuple(open_)
            mode.__exit__(*exc)
            return False
        stack = self._uses.stack
        mode, stats, owns_mode = stack.pop()
        # By identity: PatchStats compares by value, and two fresh ones are equal.
        mode.counting = tuple(s for s in mode.counting if s is not stats)
        if owns_mode:
            _active.mode = None
            mode.__exit__(*exc)
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
