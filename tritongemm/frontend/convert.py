"""``convert``: put tritongemm's modules in place of torch's in a model, in place; and the reports of
what a converted model ran where (``fallback_summary``) and what ``convert`` fused (``fusion_summary``)."""

from __future__ import annotations

import warnings
import weakref
from collections import Counter

import torch

from . import fusion
from .float8 import RECIPES
from .modules import Conv1D, Float8Linear, FusedActivation, GatedMLP, Linear


def _is_conv1d(module: torch.nn.Module) -> bool:
    """transformers' ``Conv1D`` (``transformers.pytorch_utils``; GPT-2's projections): x @ weight + bias."""
    cls = type(module)
    return (
        cls.__name__ == "Conv1D"
        and cls.__module__.split(".")[0] == "transformers"
        and getattr(module, "weight", None) is not None
        and module.weight.dim() == 2
        and getattr(module, "bias", None) is not None
        and tuple(module.bias.shape) == tuple(module.weight.shape[1:])
    )


def _convertible(module: torch.nn.Module) -> bool:
    if not _to_convert(module):
        return False  # (subclasses may compute something else: left alone)
    if "forward" in module.__dict__:
        warnings.warn(
            f"tritongemm.nn.convert: {module} has its forward replaced on the instance (by a wrapper "
            f"library?); left as {type(module).__name__}",
            stacklevel=3,
        )
        return False
    return True


def _plain_linear(module) -> bool:
    """A Linear computing ``F.linear`` and nothing else: torch's, or ours without a fused activation (or
    a Conv1D: transformers', or ours without one)."""
    if _to_convert(module):
        return True
    return type(module) in (Linear, Conv1D) and module.activation == "none"


def _to_convert(module) -> bool:
    """Is ``module`` one ``convert`` replaces (or leaves, warning why: ``_convertible``)?"""
    return type(module) is torch.nn.Linear or _is_conv1d(module)


#: Gated MLPs ``convert`` met and did not fuse, and why (``fusion_report``); weak keys, so a
#: model's modules are not kept alive by having been converted.
_NOT_FUSED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
#: Per module, the Linears whose activation ``convert`` did not fuse, and why: {linear name: reason}.
_ACTIVATIONS_NOT_FUSED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def convert(
    model: torch.nn.Module,
    precision: str | None = None,
    recipe: str = "rowwise",
    *,
    fuse_mlp: bool = True,
    fast_accum: bool = True,
) -> torch.nn.Module:
    """Swap every ``torch.nn.Linear`` in ``model`` (in place) for ``tritongemm.nn.Linear``, every
    transformers ``Conv1D`` (GPT-2's projections) for ``tritongemm.nn.Conv1D``, and every gated MLP
    for ``tritongemm.nn.GatedMLP``.

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
    ``fusion_summary(model)``.

    An activation module (GELU, tanh-GELU, SiLU, ReLU) that a forward applies to a Linear's output and
    nothing else -- an MLP's ``act(fc1(x))``, transformers' ``BertIntermediate``, timm's ``Mlp``, an
    ``nn.Sequential`` of a Linear and a GELU -- goes into that Linear's epilogue: the Linear gets the
    activation and the activation's place a ``FusedActivation``, which passes its input on (the rule is
    in ``fusion``; nothing changes in ``state_dict``).  ``fuse_mlp=False`` fuses nothing.

    ``precision="fp8"`` makes ``Float8Linear`` layers instead (fp8 GEMMs in forward and backward,
    dynamic ``recipe`` scales: "rowwise", "tensorwise" or "blockwise" (DeepSeek-V3's 1x128
    activations and 128x128 weights); the forward GEMM with ``fast_accum``, the
    gradient GEMMs precise; see ``tritongemm.frontend.float8``), for every
    layer whose in and out features are multiples of 16; the others become ``Linear`` (and Conv1D layers
    ``Conv1D``, whose GEMMs stay in the model's dtype).  It fuses no
    MLP: the gated kernel has no fp8 variant, so each projection takes the fp8 path on its own.

    >>> model = tritongemm.nn.convert(model)
    >>> print(tritongemm.nn.fusion_summary(model))                  # which MLPs were fused, and why not
    >>> model = tritongemm.nn.convert(model, precision="fp8")       # fp8 training
    """
    if precision not in (None, "fp8"):
        raise ValueError(f"convert: precision must be None or 'fp8', got {precision!r}")
    if recipe not in RECIPES:
        raise ValueError(f"convert: recipe must be one of {RECIPES}, got {recipe!r}")
    if not isinstance(fast_accum, bool):
        raise TypeError(f"convert: fast_accum must be a bool, got {type(fast_accum).__name__}")
    replaced: dict[int, torch.nn.Module] = {}  # id(a module met) -> what takes its place
    # The modules met, kept alive until convert returns: a module taken out of the model could be freed
    # and its id given to a new one, which ``replaced`` would then answer for.
    met: list[torch.nn.Module] = []
    visited: set[int] = set()
    # How many names each module has in the model: a Linear or activation under two cannot be fused.
    names = Counter(id(c) for m in model.modules() for c in m._modules.values() if c is not None)

    def converted(linear: torch.nn.Module) -> torch.nn.Module:
        if type(linear) is not torch.nn.Linear:
            return Conv1D.from_conv1d(linear)
        if precision == "fp8" and linear.in_features % 16 == 0 and linear.out_features % 16 == 0:
            return Float8Linear.from_linear(linear, recipe, fast_accum)
        return Linear.from_linear(linear)

    def replacement(linear: torch.nn.Linear) -> torch.nn.Module:
        if id(linear) not in replaced:
            replaced[id(linear)] = converted(linear) if _convertible(linear) else linear
            met.append(linear)
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
            met.append(module)
            return module
        new = GatedMLP.from_module(module, activation)
        for name in fusion.PROJECTIONS:
            child = new._modules[name]
            if type(child) is torch.nn.Linear:
                setattr(new, name, replacement(child))
        _NOT_FUSED.pop(module, None)
        replaced[id(module)] = new
        met.append(module)
        visited.add(id(new))
        return new

    def fuse_activations(module: torch.nn.Module) -> None:
        """Each activation ``module`` applies to a Linear's output alone, into that Linear's epilogue."""
        left = {}
        for linear, act in fusion.linear_activation_pairs(module):
            activation, reason = fusion.linear_activation_reason(module, linear, act, _plain_linear)
            if activation is None and reason is None:
                continue
            lin = module._modules[linear]
            if reason is None and (names[id(lin)] > 1 or names[id(module._modules[act])] > 1):
                reason = f"{linear} or {act} is a module reachable under another name too"
            if reason is not None:
                left[linear] = reason
                continue
            new = replacement(lin) if _to_convert(lin) else lin
            if not isinstance(new, (Linear, Conv1D)):  # (left as it was: ``_convertible`` warned why)
                left[linear] = f"{linear} stays {type(lin).__name__}"
                continue
            new.activation = activation
            setattr(module, linear, new)
            setattr(module, act, FusedActivation(activation, linear))
        if left:
            _ACTIVATIONS_NOT_FUSED[module] = left
        else:
            _ACTIVATIONS_NOT_FUSED.pop(module, None)

    def walk(module: torch.nn.Module) -> None:
        if id(module) in visited:
            return
        visited.add(id(module))
        if fuse_mlp and precision is None:
            fuse_activations(module)
        # Not named_children(): it yields a module once, under its first name only.
        for name, child in list(module._modules.items()):
            if _to_convert(child):
                new = replacement(child)
            elif child is not None:
                new = fused(child)
                if new is child:
                    walk(child)
            else:
                continue
            if new is not child:
                setattr(module, name, new)

    if _to_convert(model):
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
        if isinstance(m, (Linear, Conv1D, GatedMLP)) and m.fallbacks
    }


def fallback_summary(model: torch.nn.Module) -> str:
    """Which layers of ``model`` ran on torch instead of tritongemm, and why, for printing.

    >>> print(tritongemm.nn.fallback_summary(model))
    """
    layers = [m for m in model.modules() if isinstance(m, Linear)]
    conv1d = sum(isinstance(m, Conv1D) for m in model.modules())
    mlps = [m for m in model.modules() if isinstance(m, GatedMLP)]
    counts = fallback_counts(model)
    total = sum(sum(c.values()) for c in counts.values())
    others = (f", {conv1d} Conv1D modules" if conv1d else "") + (
        f", {len(mlps)} GatedMLP modules" if mlps else ""
    )
    lines = [
        f"tritongemm.nn: {len(layers)} Linear modules{others}, {len(counts)} fell back to torch ({total} calls)"
    ]
    for name, reasons in counts.items():
        lines += [f"  {name or '(model)'}: {n} ({reason})" for reason, n in sorted(reasons.items())]
    return "\n".join(lines)


def fusion_report(model: torch.nn.Module) -> tuple[dict[str, str], dict[str, str]]:
    """(fused, left alone), by module name: each gated MLP ``convert`` fused into a ``GatedMLP`` and each
    Linear it fused an activation into, with the activation; each gated MLP, and each Linear followed by
    an activation, it left as it was, with the reason."""
    fused: dict[str, str] = {}
    left: dict[str, str] = {}
    for name, m in model.named_modules():
        prefix = f"{name}." if name else ""
        if isinstance(m, GatedMLP):
            fused[name] = m.activation
        elif m in _NOT_FUSED:
            left[name] = _NOT_FUSED[m]
        for child in m._modules.values():
            if isinstance(child, FusedActivation):
                fused[prefix + child.into] = child.activation
        for linear, reason in _ACTIVATIONS_NOT_FUSED.get(m, {}).items():
            left[prefix + linear] = reason
    return fused, left


def fusion_summary(model: torch.nn.Module) -> str:
    """Which gated MLPs of ``model`` run as ``GatedMLP`` and which ``convert`` left alone, and why.

    >>> print(tritongemm.nn.fusion_summary(model))
    tritongemm.nn: 2 gated MLPs fused into GatedMLP, 1 left as it was
      layers.0.mlp: fused (silu, from LlamaMLP)
      ...
    """
    fused, left = fusion_report(model)
    modules = dict(model.named_modules())
    mlps = [name for name in fused if isinstance(modules[name], GatedMLP)]
    into_linears = len(fused) - len(mlps)
    plural = "s" if into_linears != 1 else ""
    activations = f", {into_linears} activation{plural} into the Linear before them" if into_linears else ""
    lines = [
        f"tritongemm.nn: {len(mlps)} gated MLPs fused into GatedMLP{activations}, {len(left)} left as it was"
    ]
    for name, activation in fused.items():
        if name in mlps:
            source = modules[name].__dict__.get("fused_from")
            lines.append(
                f"  {name or '(model)'}: fused ({activation}" + (f", from {source})" if source else ")")
            )
        else:
            lines.append(f"  {name}: {activation} fused into its epilogue")
    lines += [f"  {name or '(model)'}: left alone: {reason}" for name, reason in left.items()]
    return "\n".join(lines)
