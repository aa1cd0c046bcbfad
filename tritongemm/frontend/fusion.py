"""What ``nn.convert`` may fuse, read from the module alone: gated MLPs into ``nn.GatedMLP``, and an
activation module into the epilogue of the Linear whose output it takes (``linear_activation_pairs``).

``GatedMLP`` computes ``down_proj(act(gate_proj(x)) * up_proj(x))`` with the gate and up
projections and the product in one kernel, so it may take the place only of a module known to
compute exactly that.  Nothing is guessed from names: a module is a gated MLP here when all of
these hold (``gated_mlp_activation`` names the first that fails):

1. **Projections**: children ``gate_proj``, ``up_proj`` and ``down_proj`` that are plain
   ``torch.nn.Linear`` (or tritongemm's ``Linear`` without a fused activation, from an earlier
   ``convert``), with no forward replaced on the instance; ``gate_proj`` and ``up_proj`` of one
   shape, ``down_proj`` taking their out-features.
2. **Activation**: a child ``act_fn`` that is ``torch.nn.SiLU`` ("silu"), ``torch.nn.GELU``
   ("gelu", or "gelu_tanh" with ``approximate="tanh"``), or one of transformers' activation
   classes that compute one of those (``TRANSFORMERS_ACTIVATIONS``: ``SiLUActivation``,
   ``GELUTanh`` / ``PytorchGELUTanh`` / ``NewGELUActivation``, ``GELUActivation``), defined in a
   ``transformers`` module.
3. **Forward**: the class's ``forward``, read from its source, is exactly one statement
   ``return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))``, or that
   expression assigned to a name which is then returned (the two factors in either order), with
   no decorator and one argument besides ``self``.  That is the ``forward`` of transformers'
   ``LlamaMLP``, ``MistralMLP``, ``Qwen2MLP``, ``Qwen3MLP``, ``GemmaMLP``, ``Gemma2MLP`` and their
   likes; a class of any name written so is a gated MLP, and a ``LlamaMLP`` whose forward was
   edited (or whose source cannot be read) is not.  Phi-3's MLP (one fused ``gate_up_proj``)
   does not have the children of rule 1.
4. **Nothing skipped**: the fused forward never calls ``gate_proj``, ``up_proj`` or ``act_fn``,
   so none of them may have hooks; the module's class may not override ``__call__``, nor the
   instance replace ``forward``; ``gate_proj`` and the others are plain submodules (not
   properties of the class).

Hooks on the MLP module itself, and on ``down_proj``, keep firing: ``GatedMLP.from_module`` takes
over the module's hook dictionaries, and ``down_proj`` is still called.
"""

from __future__ import annotations

import ast
import inspect
import textwrap
import weakref
from collections import Counter
from collections.abc import Callable

import torch

#: The projections rule 1 asks for.
PROJECTIONS = ("gate_proj", "up_proj", "down_proj")
#: transformers' activation modules (``transformers.activations``) and the fused activation each
#: computes; ``NewGELUActivation`` writes out the tanh GELU's formula, ``GELUActivation`` the erf one.
TRANSFORMERS_ACTIVATIONS = {
    "SiLUActivation": "silu",
    "GELUTanh": "gelu_tanh",
    "PytorchGELUTanh": "gelu_tanh",
    "NewGELUActivation": "gelu_tanh",
    "GELUActivation": "gelu",
}


def is_candidate(module: torch.nn.Module) -> bool:
    """Does ``module`` have the three projections a gated MLP has (whether or not it is one)?"""
    children = module._modules
    return all(children.get(name) is not None for name in PROJECTIONS)


def has_hooks(module: torch.nn.Module) -> bool:
    """Hooks that run when ``module`` is called (forward, pre-forward, backward, pre-backward)."""
    names = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks")
    return any(getattr(module, name, None) for name in names)


def activation_of(act: object) -> str | None:
    """The fused activation ``act`` computes (rule 2), or None."""
    if not isinstance(act, torch.nn.Module) or "forward" in act.__dict__:
        return None
    cls = type(act)
    if cls is torch.nn.SiLU:
        return "silu"
    if cls is torch.nn.GELU:
        return {"none": "gelu", "tanh": "gelu_tanh"}.get(act.approximate)
    if cls.__module__.split(".")[0] == "transformers":
        return TRANSFORMERS_ACTIVATIONS.get(cls.__name__)
    return None


def gated_mlp_activation(
    module: torch.nn.Module, plain_linear: Callable[[torch.nn.Module], bool]
) -> tuple[str | None, str | None]:
    """(activation, None) when ``module`` is a gated MLP by the rules above, else (None, why not).

    ``plain_linear(m)``: is ``m`` a Linear that computes ``F.linear`` and nothing else (rule 1)?
    """
    cls = type(module)
    children = module._modules
    for name in PROJECTIONS:
        child = children.get(name)
        if not plain_linear(child):
            return None, f"{name} is {type(child).__name__}, not a plain nn.Linear"
        if "forward" in child.__dict__:
            return None, f"{name} has its forward replaced on the instance"
    gate, up, down = (children[name] for name in PROJECTIONS)
    if (gate.in_features, gate.out_features) != (up.in_features, up.out_features):
        return None, (
            f"gate_proj ({gate.in_features} -> {gate.out_features}) and up_proj "
            f"({up.in_features} -> {up.out_features}) differ in shape"
        )
    if down.in_features != gate.out_features:
        return None, f"down_proj takes {down.in_features} features, gate_proj gives {gate.out_features}"
    act = children.get("act_fn")
    if act is None:
        return None, "no act_fn submodule"
    activation = activation_of(act)
    if activation is None:
        return (
            None,
            f"act_fn is {type(act).__name__}, not an activation the fused kernel has (silu, gelu_tanh, gelu)",
        )
    why = forward_reason(cls)
    if why is not None:
        return None, why
    for name in ("gate_proj", "up_proj", "act_fn"):
        if has_hooks(children[name]):
            return None, f"{name} has hooks (the fused forward never calls it)"
    if "forward" in module.__dict__:
        return None, "forward replaced on the instance"
    if cls.__call__ is not torch.nn.Module.__call__:
        return None, f"{cls.__name__} overrides __call__"
    for name in (*PROJECTIONS, "act_fn"):
        if any(name in vars(k) for k in cls.__mro__ if k is not torch.nn.Module):
            return None, f"{cls.__name__} defines {name} on the class"
    return activation, None


_FORWARD_REASONS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def forward_reason(cls: type) -> str | None:
    """Why ``cls.forward`` is not the standard gated MLP forward (rule 3), or None; once per class."""
    try:
        return _FORWARD_REASONS[cls]
    except KeyError:
        pass
    reason = _read_forward(cls)
    _FORWARD_REASONS[cls] = reason
    return reason


def _read_forward(cls: type) -> str | None:
    standard = "down_proj(act_fn(gate_proj(x)) * up_proj(x))"
    forward = cls.forward
    if forward is torch.nn.Module.forward:
        return f"{cls.__name__} has no forward of its own"
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(forward)))
    except (OSError, TypeError, SyntaxError):
        return f"the source of {cls.__name__}.forward cannot be read, to check it computes {standard}"
    fn = tree.body[0] if len(tree.body) == 1 else None
    if not isinstance(fn, ast.FunctionDef) or not _plain_signature(fn):
        return f"{cls.__name__}.forward is decorated or takes other arguments than (self, x)"
    self_name, x_name = (a.arg for a in fn.args.args)
    body = fn.body
    if body and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant):
        body = body[1:]  # the docstring
    expr = None
    if len(body) == 1 and isinstance(body[0], ast.Return):
        expr = body[0].value
    elif (
        len(body) == 2
        and isinstance(body[0], ast.Assign)
        and len(body[0].targets) == 1
        and isinstance(body[0].targets[0], ast.Name)
        and isinstance(body[1], ast.Return)
        and isinstance(body[1].value, ast.Name)
        and body[1].value.id == body[0].targets[0].id
    ):
        expr = body[0].value
    if expr is None or not _is_standard(expr, self_name, x_name):
        return f"{cls.__name__}.forward does not compute {standard}"
    return None


def _plain_signature(fn: ast.FunctionDef) -> bool:
    a = fn.args
    return (
        not fn.decorator_list
        and len(a.args) == 2
        and not a.posonlyargs
        and not a.kwonlyargs
        and a.vararg is None
        and a.kwarg is None
        and not a.defaults
    )


def _call_of(node, self_name: str, attr: str):
    """The one argument of ``self.<attr>(arg)``, or None where ``node`` is not such a call."""
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == attr
        and isinstance(node.func.value, ast.Name)
        and node.func.value.id == self_name
        and len(node.args) == 1
        and not node.keywords
    ):
        return node.args[0]
    return None


def _is_name(node, name: str) -> bool:
    return isinstance(node, ast.Name) and node.id == name


def _is_standard(expr, self_name: str, x_name: str) -> bool:
    """Is ``expr`` ``self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))`` (either order)?"""
    product = _call_of(expr, self_name, "down_proj")
    if not (isinstance(product, ast.BinOp) and isinstance(product.op, ast.Mult)):
        return False

    def gate(node) -> bool:
        inner = _call_of(node, self_name, "act_fn")
        return inner is not None and _is_name(_call_of(inner, self_name, "gate_proj"), x_name)

    def up(node) -> bool:
        return _is_name(_call_of(node, self_name, "up_proj"), x_name)

    left, right = product.left, product.right
    return (gate(left) and up(right)) or (up(left) and gate(right))


# -- An activation after a Linear --------------------------------------------------------------------
#
# ``h = self.act(self.fc1(x))`` (or ``h = self.fc1(x)`` then ``h = self.act(h)``) is one Linear with the
# activation in its epilogue: the activation's pass over the (M, N) output disappears.  convert makes
# ``fc1`` a Linear with the activation and ``act`` a ``FusedActivation``, which passes its input on,
# where all of these hold (``linear_activation_reason`` names the first that fails):
#
# 1. the forward, read from its source, applies ``act`` to ``fc1``'s output right away: nested, or two
#    consecutive statements of its body, the first's name read nowhere after the second; and neither
#    attribute is read anywhere else in the class's methods (nor ``self`` used but through attributes
#    in the forward); ``nn.Sequential`` qualifies by its order alone (a Linear, then the activation);
# 2. ``fc1`` is a plain Linear and ``act`` one of ``EPILOGUE_ACTIVATIONS`` (or the gated MLP's);
# 3. neither has hooks, neither is a class attribute, the module neither overrides ``__call__`` nor
#    has its forward replaced on the instance, and (checked by convert) neither is reachable under
#    another name in the model.

#: Activation modules a Linear's epilogue computes besides the gated MLP's (``activation_of``).
EPILOGUE_ACTIVATIONS = {torch.nn.ReLU: "relu"}


def epilogue_activation_of(act: object) -> str | None:
    """The activation ``act`` computes in a Linear's epilogue (rule 2), or None."""
    if (
        isinstance(act, torch.nn.Module)
        and "forward" not in act.__dict__
        and type(act) in EPILOGUE_ACTIVATIONS
    ):
        return EPILOGUE_ACTIVATIONS[type(act)]
    return activation_of(act)


def linear_activation_pairs(module: torch.nn.Module) -> tuple[tuple[str, str], ...]:
    """(Linear's name, activation's name) for each place ``module``'s forward applies a child to another
    child's output and nowhere else (rule 1: what the source says; the children are not looked at)."""
    cls = type(module)
    if cls is torch.nn.Sequential:
        names = list(module._modules)
        return tuple(zip(names, names[1:]))
    try:
        return _PAIRS[cls]
    except KeyError:
        pass
    _PAIRS[cls] = pairs = _read_pairs(cls)
    return pairs


def linear_activation_reason(
    module: torch.nn.Module, linear: str, act: str, plain_linear: Callable[[torch.nn.Module], bool]
) -> tuple[str | None, str | None]:
    """(activation, None) when ``module.<act>`` may be fused into ``module.<linear>`` (rules 2 and 3, but
    for the sharing convert checks), else (None, why not); (None, None) where the pair is no Linear and
    activation at all."""
    cls = type(module)
    children = module._modules
    lin, fn = children.get(linear), children.get(act)
    activation = epilogue_activation_of(fn)
    if activation is None or not (isinstance(lin, torch.nn.Linear) or plain_linear(lin)):
        return None, None  # (``plain_linear`` admits a Conv1D too)
    if not plain_linear(lin):
        return None, f"{linear} is {type(lin).__name__}, not a plain nn.Linear"
    for name, child in ((linear, lin), (act, fn)):
        if has_hooks(child):
            return None, f"{name} has hooks"
        if "forward" in child.__dict__:
            return None, f"{name} has its forward replaced on the instance"
    if "forward" in module.__dict__:
        return None, "forward replaced on the instance"
    if cls.__call__ is not torch.nn.Module.__call__:
        return None, f"{cls.__name__} overrides __call__"
    if any(name in vars(k) for name in (linear, act) for k in cls.__mro__ if k is not torch.nn.Module):
        return None, f"{cls.__name__} defines {linear} or {act} on the class"
    return activation, None


_PAIRS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _read_pairs(cls: type) -> tuple[tuple[str, str], ...]:
    if cls.forward is torch.nn.Module.forward:
        return ()
    try:
        fn = ast.parse(textwrap.dedent(inspect.getsource(cls.forward))).body[0]
    except (OSError, TypeError, SyntaxError, IndexError):
        return ()
    if not isinstance(fn, ast.FunctionDef) or fn.decorator_list or not fn.args.args:
        return ()
    me = fn.args.args[0].arg
    attributes = {id(n.value) for n in ast.walk(fn) if isinstance(n, ast.Attribute) and _is_name(n.value, me)}
    if any(_is_name(n, me) and id(n) not in attributes for n in ast.walk(fn)):
        return ()  # ``self`` itself escapes (getattr(self, ...), a helper given self): nothing is sure
    found = []
    for node in ast.walk(fn):  # nested: self.act(self.fc1(...))
        inner = _self_call(node, me)
        if inner is not None and _self_call(node.args[0], me) is not None:
            found.append((node.args[0].func.attr, node.func.attr))
    body = fn.body
    for i, (first, second) in enumerate(zip(body, body[1:])):  # h = self.fc1(...); h2 = self.act(h)
        target = _assigned_name(first)
        if target is None or _self_call(first.value, me) is None:
            continue
        value = second.value if isinstance(second, (ast.Assign, ast.Return)) else None
        if _self_call(value, me) is None or not _is_name(value.args[0], target):
            continue
        later = body[i + 2 :] if _assigned_name(second) != target else []
        if any(_is_name(n, target) for stmt in later for n in ast.walk(stmt)):
            continue  # the Linear's own output is read again
        found.append((first.value.func.attr, value.func.attr))
    reads = _attribute_reads(cls)
    if reads is None:
        return ()
    return tuple((lin, act) for lin, act in found if lin != act and reads[lin] == reads[act] == 1)


def _self_call(node, me: str):
    """The one argument of ``self.<name>(arg)``, or None."""
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and _is_name(node.func.value, me)
        and len(node.args) == 1
        and not isinstance(node.args[0], ast.Starred)
        and not node.keywords
    ):
        return node.args[0]
    return None


def _assigned_name(stmt) -> str | None:
    if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name):
        return stmt.targets[0].id
    return None


def _attribute_reads(cls: type):
    """How often each attribute name is read (not assigned) in the methods of ``cls`` and its bases
    below ``nn.Module``, or None where a source cannot be read."""
    reads: Counter = Counter()
    for k in cls.__mro__:
        if k is torch.nn.Module or issubclass(torch.nn.Module, k):
            continue
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(k)))
        except (OSError, TypeError, SyntaxError):
            return None
        reads.update(
            n.attr
            for n in ast.walk(tree)
            if isinstance(n, ast.Attribute) and not isinstance(n.ctx, ast.Store)
        )
    return reads


__all__ = [
    "EPILOGUE_ACTIVATIONS",
    "PROJECTIONS",
    "TRANSFORMERS_ACTIVATIONS",
    "activation_of",
    "epilogue_activation_of",
    "forward_reason",
    "gated_mlp_activation",
    "has_hooks",
    "is_candidate",
    "linear_activation_pairs",
    "linear_activation_reason",
]
