"""Modules users swap in: ``Linear``, ``GatedMLP`` and ``convert``.

``Linear`` subclasses ``torch.nn.Linear`` (same constructor, parameters,
``state_dict`` keys, and ``isinstance`` checks keep working).  Its forward runs
``tritongemm.linear``; inputs tritongemm cannot run (CPU tensors without the
interpreter, integer dtypes, functorch-transformed tensors, ...) go to torch, as
they would under ``patch()``, and are counted by reason in the module's
``fallbacks`` (``fallback_summary(model)`` gathers them for a whole model;
``Linear.fallbacks``, read on the class, sums every instance).

``GatedMLP`` is a GLU MLP, ``down_proj(act(gate_proj(x)) * up_proj(x))``, whose gate and up
projections and product run as one kernel (``gated_linear``); ``convert`` puts one in place of
every module it can tell computes exactly that (``fusion``: the rule), and
``fusion_summary(model)`` says which it fused and which it left alone, and why.
"""

from __future__ import annotations

import threading
import warnings
import weakref
from collections import Counter

import torch

from ..autograd import fastpath
from ..autograd.distributed import is_dtensor
from ..autograd.function import is_tracing
from ..request.fallback import torch_reason, warn_device_fallback
from ..semantics import ACTIVATIONS, autocast_dtype
from . import api, fusion
from .float8 import RECIPES, WeightCache, float8_linear, float8_unsupported_reason
from .gated import check_gated_activation, gated_linear, torch_gated

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


class GatedMLP(torch.nn.Module):
    """A GLU MLP, ``down_proj(act(gate_proj(x)) * up_proj(x))``, its first half in one kernel.

    >>> mlp = tritongemm.nn.GatedMLP(4096, 14336, activation="silu", device="cuda", dtype=torch.bfloat16)
    >>> y = mlp(x)        # down_proj(gated_linear(x, gate_proj.weight, up_proj.weight, ...))

    ``gate_proj``, ``up_proj`` and ``down_proj`` are tritongemm ``Linear`` modules (so ``state_dict``
    keys are those of a Llama-style MLP); ``activation`` is "silu" (SwiGLU), "gelu_tanh" (GeGLU,
    Gemma's) or "gelu".  Only ``down_proj`` is called as a module: hooks on ``gate_proj`` and
    ``up_proj`` never fire (``convert`` leaves an MLP with such hooks alone).  Inputs tritongemm
    cannot run go to torch's ops, counted by reason in ``fallbacks`` as ``Linear`` counts them.
    ``convert`` makes these from the models' own MLPs (``from_module``).
    """

    #: Reasons inputs were handed to torch instead, summed over all instances (as ``Linear.fallbacks``).
    fallbacks: Counter = Counter()

    def __init__(
        self,
        hidden_size: int,
        intermediate_size: int,
        bias: bool = False,
        activation: str = "silu",
        device=None,
        dtype=None,
    ) -> None:
        super().__init__()
        self.activation = check_gated_activation("GatedMLP", activation)
        self.gate_proj = Linear(hidden_size, intermediate_size, bias=bias, device=device, dtype=dtype)
        self.up_proj = Linear(hidden_size, intermediate_size, bias=bias, device=device, dtype=dtype)
        self.down_proj = Linear(intermediate_size, hidden_size, bias=bias, device=device, dtype=dtype)
        self.fallbacks = Counter()

    def extra_repr(self) -> str:
        source = self.__dict__.get("fused_from")
        return f"activation={self.activation!r}" + (f", fused from {source}" if source else "")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_proj, self.up_proj
        if not is_tracing(x) or is_dtensor(x):
            tensors = tuple(t for t in (x, gate.weight, up.weight, gate.bias, up.bias) if t is not None)
            reason = torch_reason(*tensors)
            if reason is not None:
                return self._torch_forward(x, reason)
        return self.down_proj(
            gated_linear(x, gate.weight, up.weight, gate.bias, up.bias, activation=self.activation)
        )

    def _torch_forward(self, x: torch.Tensor, reason: str) -> torch.Tensor:
        with _counts_lock:
            self.fallbacks[reason] += 1
            GatedMLP.fallbacks[reason] += 1
        if isinstance(x, torch.Tensor):
            warn_device_fallback("tritongemm.nn.GatedMLP", reason, x.device)
        gate, up = self.gate_proj, self.up_proj
        h = torch_gated(x, gate.weight, up.weight, gate.bias, up.bias, self.activation)
        return self.down_proj(h)

    @classmethod
    def from_module(cls, module: torch.nn.Module, activation: str) -> GatedMLP:
        """A ``GatedMLP`` that takes over ``module``'s state: the same objects, not copies.

        As ``Linear.from_linear``: submodules, parameters, buffers, hooks (their handles still
        working), the training flag and the instance's attributes (``config``, ``act_fn``, ...)
        carry over, and the two modules share those dictionaries, so use the new one from then
        on.  ``module`` must compute ``down_proj(act(gate_proj(x)) * up_proj(x))`` with this
        ``activation`` (``fusion.gated_mlp_activation`` says whether it does); its projections
        are not converted here (``convert`` does that).
        """
        new = cls.__new__(cls)
        new.__dict__.update(module.__dict__)
        for name in ("activation", "fallbacks", "fused_from"):
            if name in module.__dict__:
                warnings.warn(
                    f"tritongemm.nn.convert: the attribute {name!r} set on {type(module).__name__} is "
                    f"replaced by tritongemm.nn.GatedMLP's own {name!r}",
                    stacklevel=3,
                )
        new.__dict__["activation"] = check_gated_activation("GatedMLP", activation)
        new.__dict__["fallbacks"] = Counter()
        new.__dict__["fused_from"] = type(module).__name__
        if new.__dict__.get("_compiled_call_impl") is not None:
            new.__dict__["_compiled_call_impl"] = None
            warnings.warn(
                f"tritongemm.nn.convert: {type(module).__name__} was compiled with Module.compile(); call "
                "compile() again on the converted module",
                stacklevel=3,
            )
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


def _plain_linear(module) -> bool:
    """A Linear computing ``F.linear`` and nothing else: torch's, or ours without a fused activation."""
    return type(module) is torch.nn.Linear or (type(module) is Linear and module.activation == "none")


#: Gated MLPs ``convert`` met and did not fuse, and why (``fusion_report``); weak keys, so a
#: model's modules are not kept alive by having been converted.
_NOT_FUSED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def convert(
    model: torch.nn.Module,
    precision: str | None = None,
    recipe: str = "rowwise",
    *,
    fuse_mlp: bool = True,
) -> torch.nn.Module:
    """Swap every ``torch.nn.Linear`` in ``model`` (in place) for ``tritongemm.nn.Linear``, and every
    gated MLP for ``tritongemm.nn.GatedMLP``.

    The new modules take over the old ones' parameters, hooks and attributes
    (see ``Linear.from_linear``).  A module reachable under several names
    (shared between submodules) becomes one converted module.  Subclasses of
    ``nn.Linear`` are left alone.  Returns ``model`` (itself a new ``Linear``
    if it was one).

    Gated MLPs (``fuse_mlp=True``, the default): a module with ``gate_proj``, ``up_proj`` and
    ``down_proj`` that provably computes ``down_proj(act_fn(gate_proj(x)) * up_proj(x))`` with a
    SiLU or GELU ``act_fn`` (transformers' ``LlamaMLP``, ``Qwen2MLP``, ``MistralMLP``,
    ``GemmaMLP``, ...; the rule is in ``tritongemm.frontend.fusion``) becomes a ``GatedMLP``: the
    gate and up projections and the product in one kernel, the same parameters (``state_dict``
    keys and values unchanged), the module's own hooks kept.  Any other module with those three
    children is left as it is (its Linears converted) and named, with the reason, by
    ``fusion_summary(model)``.  ``fuse_mlp=False`` fuses nothing.

    ``precision="fp8"`` makes ``Float8Linear`` layers instead (fp8 GEMMs in forward and backward,
    dynamic ``recipe`` scales: "rowwise" or "tensorwise"; see ``tritongemm.frontend.float8``), for every
    layer whose in and out features are multiples of 16; the others become ``Linear``.  It fuses no
    MLP: the gated kernel has no fp8 variant, so each projection takes the fp8 path on its own.

    >>> model = tritongemm.nn.convert(model)
    >>> print(tritongemm.nn.fusion_summary(model))                  # which MLPs were fused, and why not
    >>> model = tritongemm.nn.convert(model, precision="fp8")       # fp8 training
    """
    if precision not in (None, "fp8"):
        raise ValueError(f"convert: precision must be None or 'fp8', got {precision!r}")
    if recipe not in RECIPES:
        raise ValueError(f"convert: recipe must be one of {RECIPES}, got {recipe!r}")
    replaced: dict[int, torch.nn.Module] = {}  # id(a module met) -> what takes its place
    visited: set[int] = set()

    def converted(linear: torch.nn.Linear) -> torch.nn.Module:
        if precision == "fp8" and linear.in_features % 16 == 0 and linear.out_features % 16 == 0:
            return Float8Linear.from_linear(linear, recipe)
        return Linear.from_linear(linear)

    def replacement(linear: torch.nn.Linear) -> torch.nn.Module:
        if id(linear) not in replaced:
            replaced[id(linear)] = converted(linear) if _convertible(linear) else linear
        return replaced[id(linear)]

    def fused(module: torch.nn.Module) -> torch.nn.Module:
        """``module``'s ``GatedMLP``, or ``module`` itself where it is not one to fuse."""
        if id(module) in replaced:
            return replaced[id(module)]
        if not fusion.is_candidate(module):
            return module
        if not fuse_mlp:
            activation, reason = None, "fuse_mlp=False"
        elif precision == "fp8":
            activation, reason = None, "precision='fp8' (its projections take the fp8 path one by one)"
        else:
            activation, reason = fusion.gated_mlp_activation(module, _plain_linear)
        if reason is not None:
            _NOT_FUSED[module] = reason
            replaced[id(module)] = module
            return module
        new = GatedMLP.from_module(module, activation)
        for name in fusion.PROJECTIONS:
            child = new._modules[name]
            if type(child) is torch.nn.Linear:
                setattr(new, name, replacement(child))
        _NOT_FUSED.pop(module, None)
        replaced[id(module)] = new
        visited.add(id(new))
        return new

    def walk(module: torch.nn.Module) -> None:
        if id(module) in visited:
            return
        visited.add(id(module))
        # Not named_children(): it yields a module once, under its first name only.
        for name, child in list(module._modules.items()):
            if type(child) is torch.nn.Linear:
                new = replacement(child)
            elif child is not None:
                new = fused(child)
                if new is child:
                    walk(child)
            else:
                continue
            if new is not child:
                setattr(module, name, new)

    if type(model) is torch.nn.Linear:
        return replacement(model)
    new = fused(model)
    if new is not model:
        return new
    walk(model)
    return model


def fallback_counts(model: torch.nn.Module) -> dict[str, Counter]:
    """Per tritongemm ``Linear`` or ``GatedMLP`` in ``model`` (by name) that fell back: its reasons and counts."""
    return {
        name: Counter(m.fallbacks)
        for name, m in model.named_modules()
        if isinstance(m, (Linear, GatedMLP)) and m.fallbacks
    }


def fallback_summary(model: torch.nn.Module) -> str:
    """Which layers of ``model`` ran on torch instead of tritongemm, and why, for printing.

    >>> print(tritongemm.nn.fallback_summary(model))
    """
    layers = [m for m in model.modules() if isinstance(m, Linear)]
    mlps = [m for m in model.modules() if isinstance(m, GatedMLP)]
    counts = fallback_counts(model)
    total = sum(sum(c.values()) for c in counts.values())
    gated = f", {len(mlps)} GatedMLP modules" if mlps else ""
    lines = [
        f"tritongemm.nn: {len(layers)} Linear modules{gated}, {len(counts)} fell back to torch ({total} calls)"
    ]
    for name, reasons in counts.items():
        lines += [f"  {name or '(model)'}: {n} ({reason})" for reason, n in sorted(reasons.items())]
    return "\n".join(lines)


def fusion_report(model: torch.nn.Module) -> tuple[dict[str, str], dict[str, str]]:
    """(fused, left alone): the gated MLPs of ``model`` by name, with the activation of each one
    ``convert`` fused into a ``GatedMLP``, and the reason for each one it left as it was."""
    fused: dict[str, str] = {}
    left: dict[str, str] = {}
    for name, m in model.named_modules():
        if isinstance(m, GatedMLP):
            fused[name] = m.activation
        elif m in _NOT_FUSED:
            left[name] = _NOT_FUSED[m]
    return fused, left


def fusion_summary(model: torch.nn.Module) -> str:
    """Which gated MLPs of ``model`` run as ``GatedMLP`` and which ``convert`` left alone, and why.

    >>> print(tritongemm.nn.fusion_summary(model))
    tritongemm.nn: 2 gated MLPs fused into GatedMLP, 1 left as it was
      layers.0.mlp: fused (silu, from LlamaMLP)
      ...
    """
    fused, left = fusion_report(model)
    lines = [f"tritongemm.nn: {len(fused)} gated MLPs fused into GatedMLP, {len(left)} left as it was"]
    modules = dict(model.named_modules())
    for name, activation in fused.items():
        source = modules[name].__dict__.get("fused_from")
        lines.append(f"  {name or '(model)'}: fused ({activation}" + (f", from {source})" if source else ")"))
    lines += [f"  {name or '(model)'}: left alone: {reason}" for name, reason in left.items()]
    return "\n".join(lines)


__all__ = [
    "Float8Linear",
    "GatedMLP",
    "Linear",
    "convert",
    "fallback_counts",
    "fallback_summary",
    "fusion_report",
    "fusion_summary",
]
