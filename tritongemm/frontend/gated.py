"""``gated_linear``: the gated half of a GLU MLP, ``act(F.linear(x, w_gate, b_gate)) * F.linear(x, w_up, b_up)``.

Llama, Qwen and Mistral MLPs compute ``down(silu(gate(x)) * up(x))`` (SwiGLU), Gemma's the same with
the tanh GELU (GeGLU).  ``gated_linear`` is the part before ``down``: both projections and the
product in one kernel (``launch.gated``), differentiable (``autograd.gated``).

Where it runs:

* the fused kernel, for float16, bfloat16 and float32 operands of one dtype on a device tritongemm
  runs (eager, or as the op ``tritongemm::gated``, or ``gated_extern`` where nothing needs a gradient,
  in a ``torch.compile`` / ``torch.export`` graph);
* tritongemm's ``linear`` twice, the activation in the gate's epilogue, then the product
  (``unfused``): float64 (the fused kernel has no fp64 variant), DTensor operands (``linear`` has
  their sharding rule) and ``torch.func`` transforms;
* torch's ops (``torch_gated``): inputs tritongemm cannot run, by the rule ``nn.Linear`` and
  ``patch()`` follow (``request.fallback.torch_reason``: a dtype or device it lacks, mixed dtypes,
  functorch-wrapped tensors, lazily negated views), with a warning once per device reason; empty
  operands; a bias that is not (N,) (torch broadcasts other shapes; they are left to it).

Arguments are checked as ``linear`` checks them, with torch's exception types (a shape mismatch is a
``RuntimeError`` naming the shapes); under ``torch.autocast`` the operands are cast as torch casts
``F.linear``'s.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..autograd.distributed import any_dtensor
from ..autograd.function import is_tracing
from ..autograd.gated import gated_op
from ..autograd.modes import forward_ad_active
from ..launch.gated import GATED_ACTIVATIONS
from ..request import checks
from ..request.autocast import as_torch_sees
from ..request.fallback import torch_reason, traced_reason, warn_device_fallback
from ..semantics import ACTIVATIONS
from . import api

_functorch_active = torch._C._are_functorch_transforms_active
#: The dtypes the fused kernel takes (``launch.gated.gated_gemm``'s contract).
FUSED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def check_gated_activation(fn: str, activation: str) -> str:
    """``activation`` if the gated kernel has it, else torch's ValueError naming the choices."""
    if activation not in GATED_ACTIVATIONS:
        raise ValueError(f"{fn}: unknown activation {activation!r}; choose one of {list(GATED_ACTIVATIONS)}")
    return activation


def gated_linear(
    input: torch.Tensor,
    w_gate: torch.Tensor,
    w_up: torch.Tensor,
    b_gate: torch.Tensor | None = None,
    b_up: torch.Tensor | None = None,
    *,
    activation: str = "silu",
) -> torch.Tensor:
    """``act(F.linear(input, w_gate, b_gate)) * F.linear(input, w_up, b_up)`` in one kernel.

    >>> h = tritongemm.gated_linear(x, mlp.gate_proj.weight, mlp.up_proj.weight)          # SwiGLU
    >>> y = mlp.down_proj(h)
    >>> h = tritongemm.gated_linear(x, w_gate, w_up, activation="gelu_tanh")             # GeGLU (Gemma)

    ``input`` (*, K); ``w_gate`` and ``w_up`` (N, K) as ``nn.Linear`` stores them; ``b_gate`` and
    ``b_up`` (N,) or None.  ``activation``: "silu" (default), "gelu_tanh" or "gelu" (exact, erf).
    Returns (*, N).  Differentiable in every tensor argument.
    """
    check_gated_activation("gated_linear", activation)
    input, w_gate, w_up, b_gate, b_up = as_torch_sees(input, w_gate, w_up, b_gate, b_up)
    checks.check_tensor_args("gated_linear", input=input, w_gate=w_gate, w_up=w_up, b_gate=b_gate, b_up=b_up)
    check_shapes("gated_linear", input, w_gate, w_up)
    tensors = tuple(t for t in (input, w_gate, w_up, b_gate, b_up) if t is not None)
    if not is_tracing(input) or any_dtensor(*tensors):
        reason = torch_reason(*tensors)
        if reason is not None:
            warn_device_fallback("tritongemm.gated_linear", reason, input.device)
            return torch_gated(input, w_gate, w_up, b_gate, b_up, activation)
    elif traced_reason(*tensors) is not None:  # (a trace: torch's ops in the graph, as eagerly)
        return torch_gated(input, w_gate, w_up, b_gate, b_up, activation)
    return _gated_linear(input, w_gate, w_up, b_gate, b_up, activation)


def check_shapes(fn: str, input: torch.Tensor, w_gate: torch.Tensor, w_up: torch.Tensor) -> None:
    """torch's RuntimeError, with the shapes, for operands whose sizes do not fit together."""
    if input.dim() == 0:
        raise RuntimeError(f"{fn}: input must be at least 1-D, got a 0-D tensor")
    for name, w in (("w_gate", w_gate), ("w_up", w_up)):
        if w.dim() != 2:
            raise RuntimeError(
                f"{fn}: {name} of shape {checks.shape_str(w)} has {w.dim()} dimensions (it must be a matrix)"
            )
    if w_gate.shape != w_up.shape:
        raise RuntimeError(
            f"{fn}: w_gate of shape {checks.shape_str(w_gate)} and w_up of shape {checks.shape_str(w_up)} "
            "differ (the gate and up projections must have the same in and out features)"
        )
    if input.shape[-1] != w_gate.shape[1]:
        raise RuntimeError(
            f"{fn}: input of shape {checks.shape_str(input)} and weights of shape {checks.shape_str(w_gate)} "
            f"do not match ({input.shape[-1]} in-features != {w_gate.shape[1]})"
        )


def _gated_linear(input, w_gate, w_up, b_gate, b_up, activation: str) -> torch.Tensor:
    """Validated operands tritongemm can run: the fused op, or the unfused path where it has none."""
    n, k = w_gate.shape
    biases_fit = all(b is None or tuple(b.shape) == (n,) for b in (b_gate, b_up))
    if not biases_fit or input.numel() == 0 or n == 0 or k == 0:
        return torch_gated(input, w_gate, w_up, b_gate, b_up, activation)
    if (
        input.dtype not in FUSED_DTYPES
        or _functorch_active()
        or forward_ad_active()  # (the gated op has no tangent rule; ``linear``'s op has)
        or any_dtensor(input, w_gate, w_up, b_gate, b_up)
    ):
        return unfused(input, w_gate, w_up, b_gate, b_up, activation)
    x = input.reshape(-1, k)
    x, w_gate, w_up = (t if t.stride(-1) == 1 else t.contiguous() for t in (x, w_gate, w_up))
    h = gated_op(x, w_gate, w_up, b_gate, b_up, activation)
    return h.view(*input.shape[:-1], n)


def unfused(input, w_gate, w_up, b_gate, b_up, activation: str) -> torch.Tensor:
    """tritongemm's ``linear`` twice (the activation in the gate's epilogue), then the product."""
    gate = api.linear(input, w_gate, b_gate, activation=activation)
    return gate * api.linear(input, w_up, b_up)


def torch_gated(input, w_gate, w_up, b_gate, b_up, activation: str) -> torch.Tensor:
    """The same with torch's own ops: what a stock gated MLP computes before ``down``."""
    return ACTIVATIONS[activation](F.linear(input, w_gate, b_gate)) * F.linear(input, w_up, b_up)


__all__ = ["check_gated_activation", "gated_linear", "torch_gated", "unfused"]
