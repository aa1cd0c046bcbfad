"""``mlp``: a two-layer MLP, ``F.linear(act(F.linear(x, w1, b1)), w2, b2)``, whose backward computes the
activation's derivative in the epilogue of the GEMM that produces its input (``autograd.mlp``).

GPT-2's, timm's and most encoders' MLPs (``fc2(act(fc1(x)))``, GELU or ReLU) compute this.  In
forward the activation is fused into the first layer's epilogue, as ``linear(..., activation=...)``
fuses it; training is where the op differs from two ``linear`` calls: the gradient through the
activation is one GEMM epilogue instead of a GEMM's output written, read back and rewritten by an
elementwise pass.

Where it runs:

* the fused backward: eager calls that record a gradient, for operands of one dtype tritongemm runs
  with at least ``FUSED_MIN_MACS`` multiply-adds in the first layer;
* tritongemm's ``linear`` twice, the activation in the first one's epilogue (``unfused``): no
  gradient, smaller calls, traces (``torch.compile``, ``torch.export``: a compiled graph's aligned
  layers are the stock model's aten ops, which Inductor fuses around), DTensor operands and
  ``torch.func`` transforms;
* torch's ops: inputs tritongemm cannot run (``request.fallback.torch_reason``).

``nn.convert`` does not route models' MLPs here: below the threshold the layers' own repeated-call
entries cost less host time than this op's six launches, and above it the op gains 1-3% of GPU time
over them (``benchmarks/results/h100/sweeps/mlp_derivative_epilogue.txt``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..autograd.distributed import any_dtensor
from ..autograd.function import is_tracing
from ..autograd.mlp import mlp_op
from ..autograd.modes import dispatch_mode_active, forward_ad_active
from ..request import checks
from ..request.autocast import as_torch_sees
from ..request.fallback import torch_reason, traced_reason, warn_device_fallback
from ..semantics import ACTIVATIONS, DERIVATIVE_EPILOGUES, SUPPORTED_DTYPES
from . import api

_functorch_active = torch._C._are_functorch_transforms_active

#: From this many multiply-adds in the first layer (x's elements times the hidden width) the fused
#: backward is taken: below it the step is host-bound on the H100's host, and this op's launches cost
#: 200-850 us a step more than two ``linear`` calls' fast-path entries (GPT-2 to ViT-H widths,
#: ``sweeps/mlp_derivative_epilogue.txt``: fused 0.55-0.98 of torch where unfused reads 0.94-1.32;
#: from BERT-large at 16384 tokens, 6.9e10, and ViT-H at 8192, 5.4e10, it reads 1.00-1.03 against 0.95-1.00).
FUSED_MIN_MACS = 4 * 10**10


def mlp(
    input: torch.Tensor,
    w1: torch.Tensor,
    b1: torch.Tensor | None,
    w2: torch.Tensor,
    b2: torch.Tensor | None = None,
    *,
    activation: str = "gelu",
) -> torch.Tensor:
    """``F.linear(act(F.linear(input, w1, b1)), w2, b2)``, the activation's gradient fused into a GEMM.

    >>> y = tritongemm.mlp(x, fc1.weight, fc1.bias, fc2.weight, fc2.bias, activation="gelu")

    ``input`` (*, K); ``w1`` (H, K) and ``w2`` (N, H) as ``nn.Linear`` stores them; ``b1`` (H,),
    ``b2`` (N,) or None.  ``activation``: "gelu" (default), "gelu_tanh", "silu" or "relu".  Returns
    (*, N), differentiable in every tensor argument (once: no double backward on the fused path).
    """
    if activation not in DERIVATIVE_EPILOGUES:
        raise ValueError(
            f"mlp: unknown activation {activation!r}; choose one of {list(DERIVATIVE_EPILOGUES)}"
        )
    input, w1, b1, w2, b2 = as_torch_sees(input, w1, b1, w2, b2)
    checks.check_tensor_args("mlp", input=input, w1=w1, b1=b1, w2=w2, b2=b2)
    check_shapes(input, w1, b1, w2, b2)
    tensors = tuple(t for t in (input, w1, b1, w2, b2) if t is not None)
    if not is_tracing(input) or any_dtensor(*tensors):
        reason = torch_reason(*tensors)
        if reason is not None:
            warn_device_fallback("tritongemm.mlp", reason, input.device)
            return torch_mlp(input, w1, b1, w2, b2, activation)
    elif traced_reason(*tensors) is not None:  # (a trace: torch's ops in the graph, as eagerly)
        return torch_mlp(input, w1, b1, w2, b2, activation)
    if fused_eligible(input, tensors, w1.shape[0]):
        return _fused(input, w1.mT, b1, w2.mT, b2, activation)
    return unfused(input, w1, b1, w2, b2, activation)


def check_shapes(input, w1, b1, w2, b2) -> None:
    """torch's RuntimeError, with the shapes, for operands whose sizes do not fit together."""
    if input.dim() == 0:
        raise RuntimeError("mlp: input must be at least 1-D, got a 0-D tensor")
    for name, w in (("w1", w1), ("w2", w2)):
        if w.dim() != 2:
            raise RuntimeError(
                f"mlp: {name} of shape {checks.shape_str(w)} has {w.dim()} dimensions (it must be a matrix)"
            )
    if input.shape[-1] != w1.shape[1]:
        raise RuntimeError(
            f"mlp: input of shape {checks.shape_str(input)} and w1 of shape {checks.shape_str(w1)} "
            f"do not match ({input.shape[-1]} in-features != {w1.shape[1]})"
        )
    if w2.shape[1] != w1.shape[0]:
        raise RuntimeError(
            f"mlp: w1 of shape {checks.shape_str(w1)} and w2 of shape {checks.shape_str(w2)} do not match "
            f"({w1.shape[0]} hidden features != {w2.shape[1]})"
        )
    for name, b, n in (("b1", b1, w1.shape[0]), ("b2", b2, w2.shape[0])):
        if b is not None and tuple(b.shape) != (n,):
            raise RuntimeError(f"mlp: {name} of shape {checks.shape_str(b)} must be ({n},)")


def fused_eligible(x: torch.Tensor, tensors: tuple, hidden: int) -> bool:
    """Does this call take the fused backward (the rules in this module's docstring)?"""
    return (
        torch.is_grad_enabled()
        and any(t.requires_grad for t in tensors)
        and not (
            is_tracing(x)
            or _functorch_active()
            or forward_ad_active()
            or dispatch_mode_active()
            or any_dtensor(*tensors)
        )
        and x.shape[-1] > 0  # (K = 0: torch's exact empty sum, ``linear``'s)
        and x.dtype in SUPPORTED_DTYPES
        and all(t.dtype == x.dtype and t.device == x.device for t in tensors)
        and x.numel() * hidden >= FUSED_MIN_MACS
    )


def _fused(input, b1, bias1, b2, bias2, activation: str) -> torch.Tensor:
    """The op on (*, K) ``input``, its B operands ``b1`` (K, H) and ``b2`` (H, N)."""
    k, n = b1.shape[0], b2.shape[1]
    x = input.reshape(-1, k)
    y = mlp_op(x, b1, bias1, b2, bias2, activation)
    return y.view(*input.shape[:-1], n)


def unfused(input, w1, b1, w2, b2, activation: str) -> torch.Tensor:
    """tritongemm's ``linear`` twice, the activation in the first one's epilogue."""
    return api.linear(api.linear(input, w1, b1, activation=activation), w2, b2)


def torch_mlp(input, w1, b1, w2, b2, activation: str) -> torch.Tensor:
    """The same with torch's own ops: what a stock MLP computes."""
    return F.linear(ACTIVATIONS[activation](F.linear(input, w1, b1)), w2, b2)


__all__ = ["FUSED_MIN_MACS", "check_shapes", "mlp", "torch_mlp", "unfused"]
