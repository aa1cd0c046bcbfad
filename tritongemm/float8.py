"""fp8 training for ``nn.Linear``: dynamic scales, all three GEMMs of a layer in fp8 (``scaled_mm``).

``tritongemm.nn.convert(model, precision="fp8")`` swaps every ``nn.Linear`` for
``Float8Linear``.  Weights, gradients and the optimizer stay in the model's dtype;
each forward casts the input and the weight to fp8, and each backward casts the
output gradient, with scales computed on the GPU from the tensors' absolute
maxima (no host synchronization, so it captures in CUDA graphs and traces
under ``torch.compile``).

Formats: the forward's operands (activations, weights) are e4m3, whose 3
mantissa bits keep the products accurate; the output gradient is e5m2, whose
range (to 57344, against e4m3's 448) holds gradients that span more binades than
activations do (the split of NVIDIA's Transformer Engine and torchao).

Recipes (``recipe=``): "rowwise" scales each row of the left operand and each
column of the right one by its own amax (an outlier spoils only its row);
"tensorwise" one scale per tensor.  ``scaled_mm`` needs both operands K-major
(A row-major, B column-major) for the warp-specialized kernel, so the backward
quantizes the transposes it multiplies (dY^T, X^T, W^T) as such, each with its
own scales along the rows of the transposed matrix:

    y  = X W^T:     a = q(X)      (M, K)   b = q(W)^T      (K, N)
    dX = dY W:      a = q(dY)     (M, N)   b = q(W^T)^T    (N, K)
    dW = dY^T X:    a = q(dY^T)   (N, M)   b = q(X^T)^T    (M, K)
"""

from __future__ import annotations

import torch

from .scaled import scaled_mm

E4M3 = torch.float8_e4m3fn
E5M2 = torch.float8_e5m2
RECIPES = ("rowwise", "tensorwise")
#: The largest finite value of each format.
FP8_MAX = {E4M3: torch.finfo(E4M3).max, E5M2: torch.finfo(E5M2).max}


def quantize(x: torch.Tensor, dtype: torch.dtype, recipe: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(x in ``dtype``, the fp32 scale that dequantizes it): ``x ~ x8 * scale``, computed on x's device.

    "rowwise": one scale per row, (rows, 1); "tensorwise": one, a 0-d tensor.  The scale maps the
    (row's) absolute maximum to the format's largest value; an all-zero row keeps scale 1.  The
    result is contiguous, row-major.
    """
    limit = FP8_MAX[dtype]
    amax = x.abs().amax(dim=1, keepdim=True) if recipe == "rowwise" else x.abs().amax()
    amax = amax.float()
    scale = torch.where(amax > 0, amax / limit, torch.ones_like(amax))
    x8 = (x.float() / scale).clamp_(-limit, limit).to(dtype)
    return x8, scale


def _as_column_scale(scale: torch.Tensor) -> torch.Tensor:
    """A rowwise scale (rows, 1) of B^T as ``scaled_mm``'s scale of B's columns, (1, rows)."""
    return scale.reshape(1, -1) if scale.dim() else scale


class _Float8Linear(torch.autograd.Function):
    """y = x @ w.T + bias with every GEMM in fp8 (see the module's table)."""

    @staticmethod
    def forward(ctx, x, weight, bias, recipe: str, out_dtype: torch.dtype):
        x8, sx = quantize(x, E4M3, recipe)
        w8, sw = quantize(weight, E4M3, recipe)
        y = scaled_mm(x8, w8.t(), sx, _as_column_scale(sw), bias=bias, out_dtype=out_dtype)
        ctx.save_for_backward(x, weight)
        ctx.recipe = recipe
        ctx.has_bias = bias is not None
        return y

    @staticmethod
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors
        recipe = ctx.recipe
        grad = grad.contiguous()
        grad_x = grad_w = grad_b = None
        if ctx.needs_input_grad[0]:
            g8, sg = quantize(grad, E5M2, recipe)
            wt8, swt = quantize(weight.t(), E4M3, recipe)
            grad_x = scaled_mm(g8, wt8.t(), sg, _as_column_scale(swt), out_dtype=x.dtype)
        if ctx.needs_input_grad[1]:
            gt8, sgt = quantize(grad.t(), E5M2, recipe)
            xt8, sxt = quantize(x.t(), E4M3, recipe)
            grad_w = scaled_mm(gt8, xt8.t(), sgt, _as_column_scale(sxt), out_dtype=weight.dtype)
        if ctx.has_bias and ctx.needs_input_grad[2]:
            grad_b = grad.sum(0, dtype=torch.float32).to(grad.dtype)
        return grad_x, grad_w, grad_b, None, None


def float8_unsupported_reason(x: torch.Tensor, weight: torch.Tensor) -> str | None:
    """Why a layer cannot run in fp8 on this input (None when it can): it then runs as ``Linear``."""
    n, k = weight.shape
    if k % 16 or n % 16:
        return f"fp8 layers need in and out features that are multiples of 16 (got {k} -> {n})"
    if x.dtype not in (torch.bfloat16, torch.float16, torch.float32):
        return f"fp8 casts take bf16, fp16 or fp32 inputs, not {x.dtype}"
    return None


def float8_linear(x, weight, bias, recipe: str, out_dtype: torch.dtype) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` in fp8, any leading dimensions of ``x``; output in ``out_dtype``."""
    lead = x.shape[:-1]
    y = _Float8Linear.apply(x.reshape(-1, x.shape[-1]), weight, bias, recipe, out_dtype)
    return y.reshape(*lead, weight.shape[0])


__all__ = ["E4M3", "E5M2", "FP8_MAX", "RECIPES", "float8_linear", "float8_unsupported_reason", "quantize"]
