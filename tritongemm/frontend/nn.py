"""Modules users swap in: ``Linear`` and ``convert``.

``Linear`` subclasses ``torch.nn.Linear`` (same constructor, parameters,
``state_dict`` keys, and ``isinstance`` checks keep working).  Its forward runs
``tritongemm.linear``; inputs tritongemm cannot run (CPU tensors without the
interpreter, integer dtypes, functorch-transformed tensors, ...) go to torch, as
they would under ``patch()``, and are counted by reason in the module's
``fallbacks`` (``fallback_summary(model)`` gathers them for a whole model;
``Linear.fallbacks``, read on the class, sums every instance).
"""

from __future__ import annotations

import threading
import warnings
from collections import Counter

import torch

from ..autograd import fastpath
from ..autograd.distributed import is_dtensor
from ..autograd.function import is_tracing
from ..request.fallback import torch_reason, warn_device_fallback
from ..semantics import ACTIVATIONS, autocast_dtype
from . import api
from .float8 import RECIPES, WeightCache, float8_linear, float8_unsupported_reason

_counts_lock = threading.Lock()  # `counter[k] += 1` is a read-modify-write; fallbacks may come from threads


class Linear(torch.nn.Linear):
    """Drop-in ``torch.nn.Linear`` computed by tritongemm, with an optional fused activation.

    >>> layer = tritongemm.nn.Linear(4096, 11008, bias=False, device="cuda", dtype=torch.bfloat16)
    >>> up = tritongemm.nn.Linear(4096, 14336, activation="gelu")   # Linear + bias + GELU in one kernel

    ``layer.fallbacks`` counts, by reason, the calls of this module that went
    to torch; ``Linear.fallbacks`` (on the class) counts those of all instances.
    """

    #: Reasons inputs were handed to torch instead, summed over all instances
    #: (each instance's own counts shadow this name on the instance).
    fallbacks: Counter = Counter()

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = True,
        device=None,
        dtype=None,
        *,
        activation: str | None = None,
    ) -> None:
        super().__init__(in_features, out_features, bias=bias, device=device, dtype=dtype)
        self.activation = activation or "none"
        if self.activation not in ACTIVATIONS:
            raise ValueError(f"Linear: unknown activation {activation!r}; choose one of {list(ACTIVATIONS)}")
        self.fallbacks = Counter()

    def extra_repr(self) -> str:
        act = f", activation={self.activation!r}" if self.activation != "none" else ""
        return super().extra_repr() + act + ", backend=tritongemm"

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        if self.activation == "none":  # a repeated call: its entry was made by a call that passed every check
            _, y = fastpath.lookup("linear", input, self.weight, self.bias)
            if y is not None:
                return y
        if not is_tracing(input) or is_dtensor(input):
            tensors = (input, self.weight) if self.bias is None else (input, self.weight, self.bias)
            reason = torch_reason(*tensors)
            if reason is not None:
                return self._torch_forward(input, reason)
        return api.linear(input, self.weight, self.bias, activation=self.activation)

    def _torch_forward(self, input: torch.Tensor, reason: str) -> torch.Tensor:
        with _counts_lock:
            self.fallbacks[reason] += 1
            Linear.fallbacks[reason] += 1
        if isinstance(input, torch.Tensor):
            warn_device_fallback("tritongemm.nn.Linear", reason, input.device)
        y = torch.nn.functional.linear(input, self.weight, self.bias)
        return ACTIVATIONS[self.activation](y)

    def __setstate__(self, state: dict) -> None:
        super().__setstate__(state)
        if "fallbacks" not in self.__dict__:  # pickled before counts were per instance
            self.fallbacks = Counter()

    @classmethod
    def from_linear(cls, module: torch.nn.Linear) -> Linear:
        """A ``Linear`` that takes over ``module``'s state: the same objects, not copies.

        Parameters, buffers, hooks (forward, pre-forward, backward, state-dict
        ones, with their removal handles still working), the training flag and
        any attributes set on the instance carry over.  The two modules share
        their parameter, buffer and hook dictionaries, so use the new one from
        then on.
        """
        new = cls.__new__(cls)
        # Sharing the instance dictionary's values keeps every hook registered on
        # `module`, in whatever dictionaries this torch version keeps them, and
        # keeps the handles torch returned valid (they point at those dictionaries).
        new.__dict__.update(module.__dict__)
        for name in ("activation", "fallbacks"):
            if name in module.__dict__:
                warnings.warn(
                    f"tritongemm.nn.convert: the attribute {name!r} set on {module} is replaced by "
                    f"tritongemm.nn.Linear's own {name!r}",
                    stacklevel=3,
                )
        new.__dict__["activation"] = "none"
        new.__dict__["fallbacks"] = Counter()
        if new.__dict__.get("_compiled_call_impl") is not None:
            # Module.compile() compiled the old module's call: it would keep running torch.
            new.__dict__["_compiled_call_impl"] = None
            warnings.warn(
                f"tritongemm.nn.convert: {module} was compiled with Module.compile(); call compile() "
                "again on the converted module",
                stacklevel=3,
            )
        return new


class Float8Linear(Linear):
    """A ``Linear`` whose forward and backward GEMMs run in fp8 with dynamic scales (``float8``).

    The parameters stay in their dtype; the output is in the input's dtype (autocast's under
    ``torch.autocast``).  ``recipe``: "rowwise" (default) or "tensorwise" scales.  Made by
    ``convert(model, precision="fp8")`` for layers whose in and out features are multiples of 16.
    """

    recipe: str = "rowwise"

    def extra_repr(self) -> str:
        return super().extra_repr() + f", precision='fp8', recipe={self.recipe!r}"

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        tensors = (input, self.weight) if self.bias is None else (input, self.weight, self.bias)
        if not is_tracing(input) or is_dtensor(input):
            reason = torch_reason(*tensors)
            if reason is not None:
                return self._torch_forward(input, reason)
        if float8_unsupported_reason(input, self.weight) is not None:
            return super().forward(input)
        out_dtype = autocast_dtype(input.device) or input.dtype
        y = float8_linear(input, self.weight, self.bias, self.recipe, out_dtype, self._weight8)
        return ACTIVATIONS[self.activation](y)

    @property
    def _weight8(self) -> WeightCache:
        """The fp8 copies of this layer's weight (made on first use, not saved with the state)."""
        cache = self.__dict__.get("_weight8_cache")
        if cache is None:
            cache = self.__dict__["_weight8_cache"] = WeightCache()
        return cache

    @classmethod
    def from_linear(cls, module: torch.nn.Linear, recipe: str = "rowwise") -> Float8Linear:
        new = super().from_linear(module)
        new.__dict__["recipe"] = recipe
        return new


def _convertible(module: torch.nn.Module) -> bool:
    if type(module) is not torch.nn.Linear:  # subclasses may compute something else: left alone
        return False
    if "forward" in module.__dict__:
        warnings.warn(
            f"tritongemm.nn.convert: {module} has its forward replaced on the instance (by a wrapper "
            "library?); left as torch's nn.Linear",
            stacklevel=3,
        )
        return False
    return True


def convert(model: torch.nn.Module, precision: str | None = None, recipe: str = "rowwise") -> torch.nn.Module:
    """Swap every ``torch.nn.Linear`` in ``model`` (in place) for ``tritongemm.nn.Linear``.

    The new modules take over the old ones' parameters, hooks and attributes
    (see ``Linear.from_linear``).  A module reachable under several names
    (shared between submodules) becomes one converted module.  Subclasses of
    ``nn.Linear`` are left alone.  Returns ``model`` (itself a new ``Linear``
    if it was one).

    ``precision="fp8"`` makes ``Float8Linear`` layers instead (fp8 GEMMs in forward and backward,
    dynamic ``recipe`` scales: "rowwise" or "tensorwise"; see ``tritongemm.frontend.float8``), for every
    layer whose in and out features are multiples of 16; the others become ``Linear``.

    >>> model = tritongemm.nn.convert(model)
    >>> model = tritongemm.nn.convert(model, precision="fp8")       # fp8 training
    """
    if precision not in (None, "fp8"):
        raise ValueError(f"convert: precision must be None or 'fp8', got {precision!r}")
    if recipe not in RECIPES:
        raise ValueError(f"convert: recipe must be one of {RECIPES}, got {recipe!r}")
    replaced: dict[int, torch.nn.Module] = {}  # id(an nn.Linear met) -> what takes its place
    visited: set[int] = set()

    def converted(linear: torch.nn.Linear) -> torch.nn.Module:
        if precision == "fp8" and linear.in_features % 16 == 0 and linear.out_features % 16 == 0:
            return Float8Linear.from_linear(linear, recipe)
        return Linear.from_linear(linear)

    def replacement(linear: torch.nn.Linear) -> torch.nn.Module:
        if id(linear) not in replaced:
            replaced[id(linear)] = converted(linear) if _convertible(linear) else linear
        return replaced[id(linear)]

    def walk(module: torch.nn.Module) -> None:
        if id(module) in visited:
            return
        visited.add(id(module))
        # Not named_children(): it yields a module once, under its first name only.
        for name, child in list(module._modules.items()):
            if type(child) is torch.nn.Linear:
                new = replacement(child)
                if new is not child:
                    setattr(module, name, new)
            elif child is not None:
                walk(child)

    if type(model) is torch.nn.Linear:
        return replacement(model)
    walk(model)
    return model


def fallback_counts(model: torch.nn.Module) -> dict[str, Counter]:
    """Per tritongemm ``Linear`` in ``model`` (by name) that fell back: its reasons and counts."""
    return {
        name: Counter(m.fallbacks)
        for name, m in model.named_modules()
        if isinstance(m, Linear) and m.fallbacks
    }


def fallback_summary(model: torch.nn.Module) -> str:
    """Which layers of ``model`` ran on torch instead of tritongemm, and why, for printing.

    >>> print(tritongemm.nn.fallback_summary(model))
    """
    layers = [m for m in model.modules() if isinstance(m, Linear)]
    counts = fallback_counts(model)
    total = sum(sum(c.values()) for c in counts.values())
    lines = [f"tritongemm.nn: {len(layers)} Linear modules, {len(counts)} fell back to torch ({total} calls)"]
    for name, reasons in counts.items():
        lines += [f"  {name or '(model)'}: {n} ({reason})" for reason, n in sorted(reasons.items())]
    return "\n".join(lines)


__all__ = ["Float8Linear", "Linear", "convert", "fallback_counts", "fallback_summary"]
