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
from .dispatch import unsupported_reason


class Linear(torch.nn.Linear):
    """Drop-in ``torch.nn.Linear`` computed by tritongemm.

    >>> layer = tritongemm.nn.Linear(4096, 11008, bias=False, device="cuda", dtype=torch.bfloat16)
    """

    #: Reasons inputs were handed to torch instead, across all instances.
    fallbacks: Counter = Counter()

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        tensors = [input, self.weight] + ([self.bias] if self.bias is not None else [])
        reason = unsupported_reason(*tensors)
        if reason is not None:
            Linear.fallbacks[reason] += 1
            return torch.nn.functional.linear(input, self.weight, self.bias)
        return api.linear(input, self.weight, self.bias)

    @classmethod
    def from_linear(cls, module: torch.nn.Linear) -> "Linear":
        """A ``Linear`` that shares ``module``'s parameters (no copy)."""
        new = cls.__new__(cls)
        torch.nn.Module.__init__(new)
        new.in_features = module.in_features
        new.out_features = module.out_features
        new.weight = module.weight
        new.bias = module.bias
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
