"""fp8 training for ``nn.Linear``: dynamic scales, all three GEMMs of a layer in fp8 (``scaled_mm``).

``tritongemm.nn.convert(model, precision="fp8")`` swaps every ``nn.Linear`` for
``Float8Linear``.  Weights, gradients and the optimizer stay in the model's dtype;
each forward casts the input and the weight to fp8, and each backward casts the
output gradient, with scales computed on the GPU from the tensors' absolute
maxima (no host synchronization; it traces under ``torch.compile``).

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
import triton

from ..device import device_info
from ..launch.quantize import amax_then_cast, rowwise_cast
from .scaled import scaled_mm

E4M3 = torch.float8_e4m3fn
E5M2 = torch.float8_e5m2
RECIPES = ("rowwise", "tensorwise")
#: The largest finite value of each format.
FP8_MAX = {E4M3: torch.finfo(E4M3).max, E5M2: torch.finfo(E5M2).max}


def quantize(x: torch.Tensor, dtype: torch.dtype, recipe: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(x in ``dtype``, the fp32 scale that dequantizes it): ``x ~ x8 * scale``, computed on x's device.

    "rowwise": one scale per row, (rows, 1); "tensorwise": one, a 0-d tensor.  The scale maps the
    (row's) absolute maximum to the format's largest value; an all-zero row keeps scale 1.  ``x``
    may be any 2-D view (a transpose included); the result is row-major.  On a GPU Triton kernels
    do it (``quantize_kernels``: one kernel rowwise, two tensorwise); in a ``torch.compile`` graph, and on the CPU, torch's ops (which
    Inductor fuses; Triton's interpreter rounds some fp32 -> fp8 conversions down a binade).
    """
    if x.device.type == "cuda" and not torch.compiler.is_compiling():
        return quantize_kernels(x, dtype, recipe)
    limit = FP8_MAX[dtype]
    amax = (x.abs().amax(dim=1, keepdim=True) if recipe == "rowwise" else x.abs().amax()).float()
    scale = _scale(amax, limit)
    return (x.float() / scale).clamp_(-limit, limit).to(dtype).contiguous(), scale


def _scale(amax: torch.Tensor, limit: float) -> torch.Tensor:
    """The dequantizing scale mapping ``amax`` to ``limit``; 1 where ``amax`` is 0 (an all-zero row)."""
    return torch.where(amax > 0, amax / limit, torch.ones_like(amax))


def quantize_kernels(x: torch.Tensor, dtype: torch.dtype, recipe: str) -> tuple[torch.Tensor, torch.Tensor]:
    """``quantize`` by ``kernels.quantize`` (launched by ``launch.quantize``): rowwise in one kernel where
    blocks of rows fill the GPU, else (tensorwise, a transposed view, few rows) the maxima then the
    cast.  ``x`` is read through its strides and the result written row-major."""
    limit = FP8_MAX[dtype]
    rows, cols = x.shape
    rowwise = recipe == "rowwise"
    x8 = torch.empty((rows, cols), dtype=dtype, device=x.device)
    scale = torch.empty((rows, 1) if rowwise else (), dtype=torch.float32, device=x.device)
    programs = triton.cdiv(rows, ROWWISE_ROWS)
    if rowwise and x.stride(1) == 1 and programs >= ROWWISE_WAVES * device_info(x.device).sm_count:
        rowwise_cast(x, x8, scale, limit, ROWWISE_ROWS, ROWWISE_COLS)
        return x8, scale
    amax = torch.zeros(scale.shape, dtype=torch.float32, device=x.device)
    amax_then_cast(x, x8, amax, scale, limit, rowwise, CAST_TILE, AMAX_SPAN)
    return x8, scale


#: The one-kernel rowwise cast: rows and columns a program holds at a time, and how many programs
#: per SM it needs (blocks of rows of a matrix with fewer rows leave SMs idle: the two kernels then).
ROWWISE_ROWS = 16
ROWWISE_COLS = 256
ROWWISE_WAVES = 4
#: The two-kernel path: square tiles, and the columns one maximum program covers.
CAST_TILE = 64
AMAX_SPAN = 1024


def _as_column_scale(scale: torch.Tensor) -> torch.Tensor:
    """A rowwise scale (rows, 1) of B^T as ``scaled_mm``'s scale of B's columns, (1, rows)."""
    return scale.reshape(1, -1) if scale.dim() else scale


class WeightCache:
    """A layer's weight in fp8 for inference, kept while the weight is unchanged: recomputed when its
    address or version moves (``load_state_dict``, ``copy_``, any in-place write through the
    parameter; a write through ``weight.data`` bypasses the version, so call ``clear()`` after one).
    Only calls that record no gradient for the weight use it: a training step quantizes afresh."""

    def __init__(self) -> None:
        self.entries: dict = {}

    def get(self, weight: torch.Tensor, transposed: bool, recipe: str):
        key = (transposed, recipe)
        stamp = (weight.data_ptr(), weight._version, weight.dtype, weight.shape)
        hit = self.entries.get(key)
        if hit is not None and hit[0] == stamp:
            return hit[1]
        value = quantize(weight.t() if transposed else weight, E4M3, recipe)
        self.entries[key] = (stamp, value)
        return value

    def clear(self) -> None:
        self.entries.clear()


def _weight8(weight, transposed: bool, recipe: str, cache: WeightCache | None):
    if cache is None or (weight.requires_grad and torch.is_grad_enabled()):
        return quantize(weight.t() if transposed else weight, E4M3, recipe)
    return cache.get(weight, transposed, recipe)


class _Float8Linear(torch.autograd.Function):
    """y = x @ w.T + bias with every GEMM in fp8 (see the module's table)."""

    @staticmethod
    def forward(ctx, x, weight, bias, recipe: str, out_dtype: torch.dtype, cache: WeightCache | None):
        x8, sx = quantize(x, E4M3, recipe)
        w8, sw = _weight8(weight, False, recipe, cache)
        y = scaled_mm(x8, w8.t(), sx, _as_column_scale(sw), bias=bias, out_dtype=out_dtype)
        ctx.save_for_backward(x, weight)
        ctx.recipe = recipe
        ctx.cache = cache
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
            wt8, swt = _weight8(weight, True, recipe, ctx.cache)
            grad_x = scaled_mm(g8, wt8.t(), sg, _as_column_scale(swt), out_dtype=x.dtype)
        if ctx.needs_input_grad[1]:
            gt8, sgt = quantize(grad.t(), E5M2, recipe)
            xt8, sxt = quantize(x.t(), E4M3, recipe)
            grad_w = scaled_mm(gt8, xt8.t(), sgt, _as_column_scale(sxt), out_dtype=weight.dtype)
        if ctx.has_bias and ctx.needs_input_grad[2]:
            grad_b = grad.sum(0, dtype=torch.float32).to(grad.dtype)
        return grad_x, grad_w, grad_b, None, None, None


def float8_unsupported_reason(x: torch.Tensor, weight: torch.Tensor) -> str | None:
    """Why a layer cannot run in fp8 on this input (None when it can): it then runs as ``Linear``."""
    n, k = weight.shape
    if k % 16 or n % 16:
        return f"fp8 layers need in and out features that are multiples of 16 (got {k} -> {n})"
    if x.dtype not in (torch.bfloat16, torch.float16, torch.float32):
        return f"fp8 casts take bf16, fp16 or fp32 inputs, not {x.dtype}"
    return None


def float8_linear(x, weight, bias, recipe: str, out_dtype: torch.dtype, cache: WeightCache | None = None):
    """``F.linear(x, weight, bias)`` in fp8, any leading dimensions of ``x``; output in ``out_dtype``.
    ``cache``: the layer's ``WeightCache`` (eager only; a compiled graph quantizes in the graph)."""
    lead = x.shape[:-1]
    if torch.compiler.is_compiling():
        cache = None
    y = _Float8Linear.apply(x.reshape(-1, x.shape[-1]), weight, bias, recipe, out_dtype, cache)
    return y.reshape(*lead, weight.shape[0])


__all__ = [
    "E4M3",
    "E5M2",
    "FP8_MAX",
    "RECIPES",
    "WeightCache",
    "float8_linear",
    "float8_unsupported_reason",
    "quantize",
    "quantize_kernels",
]
