"""Modules users swap in: ``Linear``, ``GatedMLP`` and ``convert``.

``Linear`` subclasses ``torch.nn.Linear`` (same constructor, parameters,
``state_dict`` keys, and ``isinstance`` checks keep working).  Its forward runs
``tritongemm.linear``; inputs tritongemm cannot run (CPU tensors without the
interpreter, integer dtypes, functorch-transformed tensors, ...) go to torch, as
they would under ``patch()``, and are counted by reason in the module's
``fallbacks`` (``fallback_summary(model)`` gathers them for a whole model;
``Linear.fallbacks``, read on the class, sums every instance).

``Conv1D`` is transformers' ``Conv1D`` (GPT-2's projections: the weight stored (in, out)) on the
same GEMMs; it is no ``torch.nn.Linear``, as transformers' is not.

``GatedMLP`` is a GLU MLP, ``down_proj(act(gate_proj(x)) * up_proj(x))``, whose gate and up
projections and product run as one kernel (``gated_linear``); ``convert`` puts one in place of
every module it can tell computes exactly that (``fusion``: the rules).  It also fuses an
activation module applied to a Linear's output (an MLP's first projection and its GELU) into that
Linear's epilogue, leaving a ``FusedActivation`` in the activation's place.  ``fusion_summary(model)``
says what it fused and what it left alone, and why.
"""

from __future__ import annotations

from .convert import convert, fallback_counts, fallback_summary, fusion_report, fusion_summary
from .modules import Conv1D, Float8Linear, FusedActivation, GatedMLP, Linear

__all__ = [
    "Conv1D",
    "Float8Linear",
    "FusedActivation",
    "GatedMLP",
    "Linear",
    "convert",
    "fallback_counts",
    "fallback_summary",
    "fusion_report",
    "fusion_summary",
]
