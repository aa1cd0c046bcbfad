"""Modules users swap in: ``Linear`` and ``convert``.

``Linear`` subclasses ``torch.nn.Linear`` (same constructor, parameters,
``state_dict`` keys, and ``isinstance`` checks keep working).  Its forward runs
``tritongemm.linear``; inputs tritongemm cannot run (CPU tensors without the
interpreter, integer dtypes, ...) go to torch, as they would under ``patch()``,
and are counted in ``Linear.fallbacks``.
"""

from __future__ import annotations

from collections import Counter

import torch

from . import api
from .autograd import is_tracing
from .semantics import unsupported_reason

_TORCH_ACTIVATIONS = {
    "none": lambda x: x,
    "relu": torch.nn.functional.relu,
    "gelu": torch.nn.functional.gelu,
    "gelu_tanh": lambda x: torch.nn.functional.gelu(x, approximate="tanh"),
    "silu": torch.nn.functional.silu,
}


class Linear(torch.nn.Linear):
    """Drop-in ``torch.nn.Linear`` computed by tritongemm, with an optional fused activation.

    >>> layer = tritongemm.nn.Linear(4096, 11008, bias=False, device="cuda", dtype=torch.bfloat16)
    >>> up = tritongemm.nn.Linear(4096, 14336, activation="gelu")   # Linear + bias + GELU in one kernel
    """

    #: Reasons inputs were handed to torch instead, across all instances.
    fallbacks: Counter = Counter()

    def __init__(self, in_features: int, out_features: int, bias: bool = True, device=None, dtype=None,
                 *, activation: str | None = None) -> None:
        super().__init__(in_features, out_features, bias=bias, device=device, dtype=dtype)
        self.activation = activation or "none"
        if self.activation not in _TORCH_ACTIVATIONS:
            raise ValueError(f"Linear: unknown activation {activation!r}; choose one of {list(_TORCH_ACTIVATIONS)}")

    def extra_repr(self) -> str:
        act = f", activation={self.activation!r}" if self.activation != "none" else ""
        return super().extra_repr() + act

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        tensors = [input, self.weight] + ([self.bias] if self.bias is not None else [])
        reason = None if is_tracing(input) else unsupported_reason(*tensors)
        if reason is not None:
            Linear.fallbacks[reason] += 1
            y = torch.nn.functional.linear(input, self.weight, self.bias)
            return _TORCH_ACTIVATIONS[self.activation](y)
        return api.linear(input, self.weight, self.bias, activation=self.activation)

    @classmethod
    def from_linear(cls, module: torch.nn.Linear) -> Linear:
        """A ``Linear`` that shares ``module``'s parameters (no copy)."""
        new = cls.__new__(cls)
        torch.nn.Module.__init__(new)
        new.in_features = module.in_features
        new.out_features = module.out_features
        new.weight = module.weight
        new.bias = module.bias
        new.activation = "none"
        new.train(module.training)
        return new


def convert(model: torch.nn.Module) -> torch.nn.Module:
    """Swap every ``torch.nn.Linear`` in ``model`` (in place) for ``tritongemm.nn.Linear``.

    Parameters are shared, not copied; hooks on the old modules are not carried
    over.  Returns ``model`` (itself a new ``Linear`` if it was one).

    >>> model = tritongemm.nn.convert(model)
    """
    if type(model) is torch.nn.Linear:
        return Linear.from_linear(model)
    for name, child in list(model.named_children()):
        if type(child) is torch.nn.Linear:
            setattr(model, name, Linear.from_linear(child))
        else:
            convert(child)
    return model


__all__ = ["Linear", "convert"]
