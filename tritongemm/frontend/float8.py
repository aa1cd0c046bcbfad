"""fp8 training for ``nn.Linear``: dynamic scales, all three GEMMs of a layer in fp8 (``scaled_mm``).

``tritongemm.nn.convert(model, precision="fp8")`` swaps every ``nn.Linear`` for
``Float8Linear``.  Weights, gradients and the optimizer stay in the model's dtype;
each forward casts the input and the weight to fp8, and each backward casts the
output gradient, with scales computed on the GPU from the tensors' absolute
maxima (no host synchronization; it traces under ``torch.compile``).

Formats: the forward's operands (activations, weights) are e4m3, whose 3
mantissa bits keep the products accurate; with a scale per row or tensor the
output gradient is e5m2, whose range (to 57344, against e4m3's 448) holds
gradients that span more binades than activations do (the split of NVIDIA's
Transformer Engine and torchao); "blockwise" keeps e4m3 for it (below).

Accumulation: the forward GEMM sums its products in the tensor cores' own accumulator
(``use_fast_accum=True``, torchao's default for it too: no wait for each K step's wgmma); the two
gradient GEMMs, and every block-scaled one, add each 128-deep K step into fp32, since gradients
summed over many tokens lose the most to a short accumulator.  ``Float8Linear.fast_accum = False``
makes the forward precise too.

One tensor fed to several layers (a hidden state to q, k and v; to gate and up) is cast once:
the last few casts of each thread are kept (``RecentCasts``) while their source tensor lives
unchanged, as are the backward's casts of the saved inputs' transposes.

Recipes (``recipe=``): "rowwise" scales each row of the left operand and each
column of the right one by its own amax (an outlier spoils only its row);
"tensorwise" one scale per tensor; "blockwise" DeepSeek-V3's: activations and
gradients a scale per 1 x 128 (a row's 128 consecutive elements along the
GEMM's K), weights a scale per 128 x 128 block, every tensor e4m3 (an outlier
spoils only its block, so e4m3's range suffices for gradients too, and its
extra mantissa bit is kept).  ``scaled_mm`` needs both operands K-major
(A row-major, B column-major) for the warp-specialized kernel, so the backward
quantizes the transposes it multiplies (dY^T, X^T, W^T) as such, each with its
own scales along the rows of the transposed matrix (blockwise: along K of the
GEMM that reads it, so the weight gradient re-quantizes dY and X along the tokens):

    y  = X W^T:     a = q(X)      (M, K)   b = q(W)^T      (K, N)
    dX = dY W:      a = q(dY)     (M, N)   b = q(W^T)^T    (N, K)
    dW = dY^T X:    a = q(dY^T)   (N, M)   b = q(X^T)^T    (M, K)
"""

from __future__ import annotations

import threading
import weakref
from collections import OrderedDict

import torch
import triton

from ..device import device_info
from ..launch.quantize import amax_then_cast, block_cast, rowwise_cast
from .scaled import scaled_mm

E4M3 = torch.float8_e4m3fn
E5M2 = torch.float8_e5m2
RECIPES = ("rowwise", "tensorwise", "blockwise")
#: The largest finite value of each format.
FP8_MAX = {E4M3: torch.finfo(E4M3).max, E5M2: torch.finfo(E5M2).max}
#: How each recipe scales activations (and output gradients) and weights (``quantize``'s scalings),
#: and the output gradient's format.
ACTIVATION_SCALING = {"rowwise": "rowwise", "tensorwise": "tensorwise", "blockwise": "1x128"}
WEIGHT_SCALING = {"rowwise": "rowwise", "tensorwise": "tensorwise", "blockwise": "128x128"}
GRAD_DTYPE = {"rowwise": E5M2, "tensorwise": E5M2, "blockwise": E4M3}
#: Block scales: rows per scale of each scaling, and the columns (K) every block spans.
BLOCK_ROWS = {"1x128": 1, "128x128": 128}
BLOCK_COLS = 128


def quantize(x: torch.Tensor, dtype: torch.dtype, scaling: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(x in ``dtype``, the fp32 scales that dequantize it): ``x ~ x8 * scale``, computed on x's device.

    "rowwise": one scale per row, (rows, 1); "tensorwise": one, a 0-d tensor; "1x128": one per row
    and 128 columns, (rows, cdiv(cols, 128)), rows contiguous (as ``scaled_mm`` reads them without
    a copy); "128x128": one per 128 x 128 block, (cdiv(rows, 128), cdiv(cols, 128)), row-major.  The
    scale maps the (row's, block's) absolute maximum to the format's largest value; an all-zero one
    keeps scale 1.  ``x`` may be any 2-D view (a transpose included); the result is row-major.  On a
    GPU Triton kernels do it (``quantize_kernels``); in a ``torch.compile`` graph, and on the CPU,
    torch's ops (which Inductor fuses; Triton's interpreter rounds some fp32 -> fp8 conversions down
    a binade).
    """
    if x.device.type == "cuda" and not torch.compiler.is_compiling():
        return quantize_kernels(x, dtype, scaling)
    return quantize_torch(x, dtype, scaling)


def quantize_torch(x: torch.Tensor, dtype: torch.dtype, scaling: str) -> tuple[torch.Tensor, torch.Tensor]:
    """``quantize`` by torch's ops, on any device (the kernels give the same bits: the same maxima, the
    division rounded the same, NaN kept; a NaN or inf input comes out NaN)."""
    limit = torch.finfo(dtype).max  # (FP8_MAX's: a float global would be a symbol under dynamic shapes)
    if scaling in BLOCK_ROWS:
        return _block_quantize(x, dtype, BLOCK_ROWS[scaling])
    amax = (x.abs().amax(dim=1, keepdim=True) if scaling == "rowwise" else x.abs().amax()).float()
    scale = _scale(amax, limit)
    return (x.float() / scale).clamp_(-limit, limit).to(dtype).contiguous(), scale


def _block_quantize(x: torch.Tensor, dtype: torch.dtype, rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``quantize`` with a scale per ``rows`` x ``BLOCK_COLS`` block, by torch's ops (x padded with
    zeros to whole blocks, which leaves every block's maximum as it is)."""
    limit = torch.finfo(dtype).max
    r, c = x.shape
    rb, cb = -(-r // rows), -(-c // BLOCK_COLS)
    blocks = torch.nn.functional.pad(x.float(), (0, cb * BLOCK_COLS - c, 0, rb * rows - r))
    blocks = blocks.reshape(rb, rows, cb, BLOCK_COLS)
    scale = _scale(blocks.abs().amax(dim=(1, 3)), limit)
    x8 = (blocks / scale[:, None, :, None]).clamp_(-limit, limit).reshape(rb * rows, cb * BLOCK_COLS)
    x8 = x8[:r, :c].to(dtype).contiguous()
    return x8, (scale.t().contiguous().t() if rows == 1 else scale)


def _scale(amax: torch.Tensor, limit: float) -> torch.Tensor:
    """The dequantizing scale mapping ``amax`` to ``limit``; 1 where ``amax`` is 0 (an all-zero row).  A
    NaN in the tensor (row, block) makes its scale NaN and an inf makes it inf, so the products that
    read it come out NaN, as they would have without fp8, rather than finite."""
    return torch.where(amax == 0, torch.ones_like(amax), amax / limit)


def quantize_kernels(x: torch.Tensor, dtype: torch.dtype, scaling: str) -> tuple[torch.Tensor, torch.Tensor]:
    """``quantize`` by ``kernels.quantize`` (launched by ``launch.quantize``): block scales in one kernel;
    rowwise in one kernel where blocks of rows fill the GPU, else (tensorwise, a transposed view, few
    rows) the maxima then the cast.  ``x`` is read through its strides and the result written row-major."""
    limit = FP8_MAX[dtype]
    rows, cols = x.shape
    x8 = torch.empty((rows, cols), dtype=dtype, device=x.device)
    if scaling in BLOCK_ROWS:
        per, cb = BLOCK_ROWS[scaling], -(-cols // BLOCK_COLS)
        if per == 1:  # (rows contiguous: scaled_mm's layout)
            scale = torch.empty((cb, rows), dtype=torch.float32, device=x.device).t()
        else:
            scale = torch.empty((-(-rows // per), cb), dtype=torch.float32, device=x.device)
        block_rows = BLOCK_1X128_ROWS if per == 1 else per
        block_cast(x, x8, scale, limit, block_rows, BLOCK_COLS, per)
        return x8, scale
    rowwise = scaling == "rowwise"
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
#: 1 x 128 block scales: the rows a program casts.
BLOCK_1X128_ROWS = 32


def _as_column_scale(scale: torch.Tensor) -> torch.Tensor:
    """B^T's scales as ``scaled_mm``'s scales of B: a rowwise (rows, 1) as (1, rows), block scales
    transposed (a view: the layouts ``quantize`` writes are the ones ``scaled_mm`` reads)."""
    return scale.t() if scale.dim() == 2 else scale


class WeightCache:
    """A layer's weight in fp8 for inference, kept while the weight is unchanged: recomputed when its
    address or version moves (``load_state_dict``, ``copy_``, any in-place write through the
    parameter; a write through ``weight.data`` bypasses the version, so call ``clear()`` after one).
    Only calls that record no gradient for the weight use it: a training step quantizes afresh."""

    def __init__(self) -> None:
        self.entries: dict = {}

    def get(self, weight: torch.Tensor, transposed: bool, scaling: str):
        key = (transposed, scaling)
        stamp = (weight.data_ptr(), weight._version, weight.dtype, weight.shape)
        hit = self.entries.get(key)
        if hit is not None and hit[0] == stamp:
            return hit[1]
        value = quantize(weight.t() if transposed else weight, E4M3, scaling)
        self.entries[key] = (stamp, value)
        return value

    def clear(self) -> None:
        self.entries.clear()


class RecentCasts:
    """The last ``size`` activation casts of one thread, found again by their source tensor.

    An entry is used only for the same tensor object (held weakly, so the cache keeps no
    activation alive, drops the copy when the source is freed, and cannot mistake a new tensor at
    a freed one's address for it), at the same version (an in-place write since makes it stale),
    on the same stream (the copy was written there).  Nothing is kept or served under CUDA graph
    capture (a copy cast before the capture would be read by every replay without being cast
    again) or in a compiled graph (Inductor computes a repeated cast once itself).
    """

    def __init__(self, size: int = 4) -> None:
        self.size = size
        self.entries: OrderedDict = OrderedDict()

    def get(self, x: torch.Tensor, transposed: bool, dtype: torch.dtype, scaling: str):
        """``quantize`` of ``x`` (its 2-D matrix, or that matrix's transpose), cast at most once."""
        matrix = x.reshape(-1, x.shape[-1])
        if torch.compiler.is_compiling() or (x.is_cuda and torch.cuda.is_current_stream_capturing()):
            return quantize(matrix.t() if transposed else matrix, dtype, scaling)  # the graph's own
        stream = torch.cuda.current_stream(x.device).cuda_stream if x.is_cuda else None
        key = (id(x), transposed, dtype, scaling, stream)
        hit = self.entries.get(key)
        if hit is not None and hit[0]() is x and hit[1] == x._version:
            self.entries.move_to_end(key)
            return hit[2]
        value = quantize(matrix.t() if transposed else matrix, dtype, scaling)
        entries = self.entries

        def forget(ref: weakref.ref) -> None:  # the source is freed: so is its copy, at once
            hit = entries.get(key)
            if hit is not None and hit[0] is ref:
                entries.pop(key, None)

        entries[key] = (weakref.ref(x, forget), x._version, value)
        while len(self.entries) > self.size:
            self.entries.popitem(last=False)
        return value

    def clear(self) -> None:
        self.entries.clear()


_THREAD = threading.local()


def recent_casts() -> RecentCasts:
    """This thread's ``RecentCasts`` (autograd runs the backward on a thread of its own)."""
    casts = getattr(_THREAD, "casts", None)
    if casts is None:
        casts = _THREAD.casts = RecentCasts()
    return casts


def _weight8(weight, transposed: bool, recipe: str, cache: WeightCache | None):
    scaling = WEIGHT_SCALING[recipe]
    if cache is None or (weight.requires_grad and torch.is_grad_enabled()):
        return quantize(weight.t() if transposed else weight, E4M3, scaling)
    return cache.get(weight, transposed, scaling)


class _Float8Linear(torch.autograd.Function):
    """y = x @ w.T + bias with every GEMM in fp8 (see the module's table)."""

    @staticmethod
    def forward(ctx, x, weight, bias, recipe: str, out_dtype: torch.dtype, cache, fast_accum: bool):
        # ``x`` has any leading dimensions: the object the caller passed, so that the next layer
        # given the same tensor finds its cast (and the backward the cast of its transpose).
        x8, sx = recent_casts().get(x, False, E4M3, ACTIVATION_SCALING[recipe])
        w8, sw = _weight8(weight, False, recipe, cache)
        y = scaled_mm(
            x8, w8.t(), sx, _as_column_scale(sw), bias=bias, out_dtype=out_dtype, use_fast_accum=fast_accum
        )
        ctx.save_for_backward(x, weight)
        ctx.recipe = recipe
        ctx.cache = cache
        ctx.has_bias = bias is not None
        return y

    @staticmethod
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors
        recipe = ctx.recipe
        scaling, grad_dtype = ACTIVATION_SCALING[recipe], GRAD_DTYPE[recipe]
        grad = grad.reshape(-1, grad.shape[-1]).contiguous()
        grad_x = grad_w = grad_b = None
        if ctx.needs_input_grad[0]:
            g8, sg = quantize(grad, grad_dtype, scaling)
            wt8, swt = _weight8(weight, True, recipe, ctx.cache)
            grad_x = scaled_mm(g8, wt8.t(), sg, _as_column_scale(swt), out_dtype=x.dtype).view(x.shape)
        if ctx.needs_input_grad[1]:
            gt8, sgt = quantize(grad.t(), grad_dtype, scaling)
            xt8, sxt = recent_casts().get(x, True, E4M3, scaling)
            grad_w = scaled_mm(gt8, xt8.t(), sgt, _as_column_scale(sxt), out_dtype=weight.dtype)
        if ctx.has_bias and ctx.needs_input_grad[2]:
            grad_b = grad.sum(0, dtype=torch.float32).to(grad.dtype)
        return grad_x, grad_w, grad_b, None, None, None, None


def float8_unsupported_reason(x: torch.Tensor, weight: torch.Tensor) -> str | None:
    """Why a layer cannot run in fp8 on this input (None when it can): it then runs as ``Linear``."""
    n, k = weight.shape
    if k % 16 or n % 16:
        return f"fp8 layers need in and out features that are multiples of 16 (got {k} -> {n})"
    if x.dtype not in (torch.bfloat16, torch.float16, torch.float32):
        return f"fp8 casts take bf16, fp16 or fp32 inputs, not {x.dtype}"
    return None


def float8_linear(
    x,
    weight,
    bias,
    recipe: str,
    out_dtype: torch.dtype,
    cache: WeightCache | None = None,
    fast_accum: bool = True,
):
    """``F.linear(x, weight, bias)`` in fp8, any leading dimensions of ``x``; output in ``out_dtype``.
    ``cache``: the layer's ``WeightCache`` (eager only; a compiled graph quantizes in the graph).
    ``fast_accum``: the forward GEMM's accumulation (the gradients' is always precise)."""
    lead = x.shape[:-1]
    # F.linear's error, checked before the Function: traced with dynamic shapes, this makes a symbolic K
    # the weight's here; compared only inside the Function, it is specialized there, which torch 2.11's
    # Dynamo cannot trace.
    if x.shape[-1] != weight.shape[1]:
        raise RuntimeError(
            f"mat1 and mat2 shapes cannot be multiplied ({lead.numel()}x{x.shape[-1]} and "
            f"{weight.shape[1]}x{weight.shape[0]})"
        )
    if torch.compiler.is_compiling():
        cache = None
    y = _Float8Linear.apply(x, weight, bias, recipe, out_dtype, cache, fast_accum)
    return y.reshape(*lead, weight.shape[0])


__all__ = [
    "ACTIVATION_SCALING",
    "E4M3",
    "E5M2",
    "FP8_MAX",
    "GRAD_DTYPE",
    "RECIPES",
    "RecentCasts",
    "WeightCache",
    "float8_linear",
    "float8_unsupported_reason",
    "quantize",
    "quantize_kernels",
    "quantize_torch",
    "WEIGHT_SCALING",
]
