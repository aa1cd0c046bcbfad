"""``scaled_mm``: fp8 GEMMs with ``torch._scaled_mm``'s signature and semantics, and our epilogues.

    out = act((a @ b) * scale_a * scale_b + bias) + residual

``a`` (M, K) and ``b`` (K, N) are float8 (e4m3 or e5m2); the scales dequantize
them: one fp32 scale each ("tensorwise": 0-d or one-element tensors), one per
row of ``a`` and one per column of ``b`` ("rowwise": (M, 1) and (1, N)), or one per
block of 128 of K ("blockwise", DeepSeek-V3's recipe, in ``torch._scaled_mm``'s
shapes): per row of ``a`` and per 128 x 128 block of ``b`` ((M, K/128) and (K/128,
N/128)), per row and per column ((M, K/128) and (K/128, N)), or per 128 x 128 block
of ``a`` and per column of ``b`` ((M/128, K/128) and (K/128, N)), sizes rounded up.  The
products are summed in fp32 and the epilogue runs on the fp32 sum before one
store in ``out_dtype``.  On sm_90 the warp-specialized kernel runs it (both
operands K-major: ``a`` row-major, ``b`` column-major, i.e. ``w.t()`` of a
row-major weight, the layout ``torch._scaled_mm`` requires); any other layout
runs on the pointer kernel.

What differs from ``torch._scaled_mm``: ``activation`` and ``residual`` are
fused; a bias of any float dtype is accepted (torch's CUDA path wants bf16/fp16
and none with an fp32 output); an fp8 ``out_dtype`` (torch's default) is
computed in fp32 and cast, one more pass over the output; ``scale_result`` is
not taken.  Like ``torch._scaled_mm`` it has no autograd.
"""

from __future__ import annotations

import torch

from .. import launch
from ..autograd.function import alloc_out
from ..autograd.modes import dispatch_mode_active, dispatch_stack_len, gemm_flops, register_flops
from ..device import interpreter_enabled
from ..launch import precompile
from ..planning.call import BLOCK_SCALINGS, SCALE_BLOCK_K, Epilogue, GemmCall, make_request
from ..planning.eligibility import FP8_DTYPES
from ..request.checks import check_tensor_args
from ..request.fallback import JIT_TRACE_REASON, jit_tracing_state
from ..semantics import ACTIVATIONS, UnsupportedInputError, check_activation

#: Output dtypes the kernels store (an fp8 output is cast from fp32).
STORED_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


class ScalingError(RuntimeError, ValueError):
    """Operands or scales ``scaled_mm`` cannot take: a ``ValueError`` as torch 2.13's ``_scaled_mm``
    raises, and a ``RuntimeError`` as earlier releases (and torch's CUDA checks) raise."""


def block_scale_shapes(m: int, n: int, k: int) -> dict[str, tuple[tuple[int, int], tuple[int, int]]]:
    """(scale_a's shape, scale_b's shape) of each block-scaled recipe (``BLOCK_SCALINGS``) for an
    (m, k) @ (k, n) product: one scale per block of 128 of K, per row or per 128 rows of ``a`` and
    per column or per 128 columns of ``b``, as ``torch._scaled_mm`` takes them."""
    kb = -(-k // SCALE_BLOCK_K)
    shapes = {}
    for name, (rows, cols) in BLOCK_SCALINGS.items():
        shapes[name] = ((-(-m // rows), kb), (kb, -(-n // cols)))
    return shapes


def scaling_of(a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor) -> str:
    """ "tensorwise", "rowwise" or a block-scaled recipe (``BLOCK_SCALINGS``) for these scales;
    ``ValueError`` (torch's type and words) otherwise."""
    m, n = a.shape[0], b.shape[1]
    if scale_a.dtype != torch.float32 or scale_b.dtype != torch.float32:
        raise ScalingError(
            f"Invalid scaling configuration. The scales must be float32, got scale_a {scale_a.dtype} "
            f"and scale_b {scale_b.dtype}"
        )
    if scale_a.numel() == 1 and scale_b.numel() == 1:
        return "tensorwise"
    if tuple(scale_a.shape) == (m, 1) and tuple(scale_b.shape) == (1, n):
        return "rowwise"
    blocks = block_scale_shapes(m, n, a.shape[1])
    for name, shapes in blocks.items():
        if (tuple(scale_a.shape), tuple(scale_b.shape)) == shapes:
            return name
    listed = "; ".join(
        f"for {name[10:].replace('_', ' x ')} blocks {sa} and {sb}" for name, (sa, sb) in blocks.items()
    )
    raise ScalingError(
        f"Invalid scaling configuration. For tensorwise scaling both scales have one element; for rowwise "
        f"scaling scale_a is ({m}, 1) and scale_b is (1, {n}); {listed}; got scale_a "
        f"{tuple(scale_a.shape)} and scale_b {tuple(scale_b.shape)}"
    )


def kernel_scales(
    scaling: str, scale_a: torch.Tensor, scale_b: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The scales as the kernels read them (``kernels.gemm.k_step_scales``), flat and contiguous.

    Block scales: a scale per row of ``a`` (column of ``b``) with the rows (columns) contiguous, so a
    K-step's scales are one vector; a scale per 128 rows (columns) with its K blocks contiguous.
    These are the layouts ``torch._scaled_mm`` takes (``scale_a`` (M, K/128) M-contiguous; ``scale_b``
    (K/128, N/128) the transpose of a row-major (N/128, K/128)), which need no copy."""
    sa, sb = _kernel_views(scaling, scale_a, scale_b)
    return sa.contiguous(), sb.contiguous()


def _kernel_views(scaling: str, scale_a: torch.Tensor, scale_b: torch.Tensor):
    """The scales as the kernels index them (views; ``kernel_scales`` makes them contiguous)."""
    if scaling in BLOCK_SCALINGS:
        rows, cols = BLOCK_SCALINGS[scaling]
        return (scale_a.t() if rows == 1 else scale_a), (scale_b if cols == 1 else scale_b.t())
    return scale_a.reshape(-1), scale_b.reshape(-1)


def dequantize(x: torch.Tensor, scale: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """``x`` (float) times its scales, one per ``rows`` x ``cols`` block (the last blocks may be ragged)."""
    full = scale.repeat_interleave(rows, 0)[: x.shape[0]].repeat_interleave(cols, 1)[:, : x.shape[1]]
    return x * full


def check_matrices(a: torch.Tensor, b: torch.Tensor) -> None:
    """Two matrices that multiply, or torch's ``RuntimeError`` in torch's words."""
    for name, t in (("mat1", a), ("mat2", b)):
        if t.dim() != 2:
            raise RuntimeError(f"{name} must be a matrix")
    if a.shape[1] != b.shape[0]:
        raise RuntimeError(
            f"mat_a and mat_b shapes cannot be multiplied ({a.shape[0]}x{a.shape[1]} and "
            f"{b.shape[0]}x{b.shape[1]})"
        )


def _check(a, b, scale_a, scale_b, bias, residual, out, out_dtype) -> None:
    check_matrices(a, b)
    if a.dtype not in FP8_DTYPES or b.dtype not in FP8_DTYPES:
        raise ScalingError(
            f"Invalid scaling configuration. scaled_mm multiplies float8_e4m3fn / float8_e5m2 matrices, "
            f"got {a.dtype} and {b.dtype}"
        )
    devices = {t.device for t in (a, b, scale_a, scale_b, bias, residual, out) if t is not None}
    if len(devices) > 1:
        raise RuntimeError(
            f"Expected all tensors to be on the same device, but found at least two devices: "
            f"{', '.join(sorted(map(str, devices)))}"
        )
    m, n = a.shape[0], b.shape[1]
    if bias is not None and bias.numel() != n:  # (torch counts elements: a (1, N) bias is taken)
        raise RuntimeError(f"Bias must be size {n} but got {bias.numel()}")
    if residual is not None and tuple(residual.shape) != (m, n):
        raise RuntimeError(f"residual must be ({m}, {n}) to add to the output, got {tuple(residual.shape)}")
    if out is not None and (tuple(out.shape) != (m, n) or out.dtype != out_dtype):
        raise RuntimeError(
            f"Expected out to be a ({m}, {n}) {out_dtype} tensor, got {tuple(out.shape)} {out.dtype}"
        )


def scaled_mm(
    a: torch.Tensor,
    b: torch.Tensor,
    scale_a: torch.Tensor,
    scale_b: torch.Tensor,
    *,
    bias: torch.Tensor | None = None,
    out_dtype: torch.dtype | None = None,
    use_fast_accum: bool = False,
    out: torch.Tensor | None = None,
    activation: str = "none",
    residual: torch.Tensor | None = None,
    config=None,
) -> torch.Tensor:
    """``act((a @ b) * scale_a * scale_b + bias) + residual`` for float8 ``a`` (M, K) and ``b`` (K, N).

    Scales are fp32: tensorwise (one element each), rowwise (``scale_a`` (M, 1), ``scale_b``
    (1, N)) or blockwise (one per 128 of K: ``block_scale_shapes``).  ``out_dtype`` defaults to
    ``a``'s dtype, as ``torch._scaled_mm``'s.  With
    ``use_fast_accum`` the products are summed in the tensor cores' reduced-precision
    accumulator throughout (faster, as torch's flag); without it they are added into fp32 every
    K-step.  ``activation``: "none", "relu", "gelu", "gelu_tanh" or "silu", fused.  ``config``
    forces a ``TileConfig`` (eager calls; a compiled graph runs the heuristic's).

    >>> w8 = w.to(torch.float8_e4m3fn)                       # (N, K), row-major
    >>> y = scaled_mm(x8, w8.t(), sx, sw, out_dtype=torch.bfloat16, bias=bias)
    """
    if jit_tracing_state() is not None:  # (``jit_trace_reason``, inlined: every call asks)
        raise UnsupportedInputError(f"scaled_mm: {JIT_TRACE_REASON}")
    if (
        out is None
        and residual is None
        and config is None
        and bias is None
        and not torch.compiler.is_compiling()
        and not dispatch_stack_len()  # (``autograd.modes.dispatch_mode_active``, inlined)
    ):
        fast = launch.PLANS.entries.get(
            _fast_key(a, b, scale_a, scale_b, out_dtype, use_fast_accum, activation)
        )
        if fast is not None and not ((a.data_ptr() | b.data_ptr()) & 15):
            return fast(a, b, scale_a, scale_b)
    check_tensor_args(
        "scaled_mm", mat1=a, mat2=b, scale_a=scale_a, scale_b=scale_b, bias=bias, residual=residual, out=out
    )
    out_dtype = a.dtype if out_dtype is None else out_dtype
    _check(a, b, scale_a, scale_b, bias, residual, out, out_dtype)
    activation = check_activation("scaled_mm", activation)
    if out_dtype not in STORED_DTYPES and out_dtype not in FP8_DTYPES:
        raise ValueError(
            f"scaled_mm(): out_dtype must be bf16, fp16, fp32 or a float8 dtype, got {out_dtype}"
        )
    if torch.compiler.is_compiling() or (dispatch_mode_active() and config is None):  # (``autograd.modes``)
        scaling_of(a, b, scale_a, scale_b)  # (at trace time; an eager call checks in run_scaled_mm)
        op = torch.ops.tritongemm.scaled_mm.default
        y = op(a, b, scale_a, scale_b, bias, out_dtype, use_fast_accum, activation, residual)
        return y if out is None else out.copy_(y)
    return run_scaled_mm(
        a, b, scale_a, scale_b, bias, out_dtype, use_fast_accum, activation, residual, out, config
    )


def stored_dtype(out_dtype: torch.dtype) -> torch.dtype:
    """The dtype the kernel stores for ``out_dtype`` (fp32 for an fp8 output, cast afterwards)."""
    return out_dtype if out_dtype in STORED_DTYPES else torch.float32


def _launch_args(a, b, scale_a, scale_b, bias, out_dtype, use_fast_accum, activation, residual, config=None):
    """What ``launch.gemm`` takes besides the operands and the output: the call (its ``out_dtype``, the
    one stored), the bias as an (M, N) view, and the scales as the kernels read them."""
    scaling = scaling_of(a, b, scale_a, scale_b)
    epilogue = Epilogue(
        activation,
        beta=1.0 if bias is not None else 0.0,
        addend=bias is not None,
        residual=residual is not None,
        scaling=scaling,
    )
    call = GemmCall(
        epilogue, make_request(config), stored_dtype(out_dtype), "fast" if use_fast_accum else "ieee"
    )
    m, n = a.shape[0], b.shape[1]
    addend = bias.reshape(n).expand(m, n) if bias is not None else None
    return call, addend, kernel_scales(scaling, scale_a, scale_b)


def run_scaled_mm(
    a, b, scale_a, scale_b, bias, out_dtype, use_fast_accum, activation, residual, out=None, config=None
) -> torch.Tensor:
    """``scaled_mm`` on checked arguments: launch, or hand a CPU call without the interpreter to torch."""
    if a.device.type != "cuda" and not interpreter_enabled():
        return _torch_scaled_mm(a, b, scale_a, scale_b, bias, out_dtype, activation, residual, out)
    call, addend, scales = _launch_args(a, b, scale_a, scale_b, bias, out_dtype, use_fast_accum, activation,
                                        residual, config)  # fmt: skip
    stored = call.out_dtype
    m, n = a.shape[0], b.shape[1]
    target = out if out is not None and out.dtype == stored else alloc_out((m, n), stored, a.device)
    launch.gemm(call, a, b, target, addend, residual, None, scales)
    if out is None and residual is None and bias is None and config is None and target.dtype == out_dtype:
        _remember(call, a, b, scale_a, scale_b, target, out_dtype, use_fast_accum, activation)
    if target.dtype == out_dtype:
        return target
    return out.copy_(target) if out is not None else target.to(out_dtype)


# ----------------------------------------------------------------------------------
# Repeated calls: a decode step's fp8 GEMM runs in microseconds, so the checks and the
# plan of a call seen before are not redone.  An entry is kept for the common form (no
# out=, bias, residual or config; CUDA; contiguous scales); the operands' 16-byte
# alignment, which the launcher was built for, is checked per call.
# ----------------------------------------------------------------------------------


def _fast_key(a, b, scale_a, scale_b, out_dtype, use_fast_accum, activation):
    try:
        return (a.shape, a.stride(), a.dtype, a.device, b.shape, b.stride(), b.dtype, b.device,
                scale_a.shape, scale_a.stride(), scale_a.dtype, scale_a.device, scale_b.shape,
                scale_b.stride(), scale_b.dtype, scale_b.device, out_dtype, use_fast_accum, activation)  # fmt: skip
    except AttributeError:  # (not tensors: the checks below say so)
        return None


def _remember(call, a, b, scale_a, scale_b, target, out_dtype, use_fast_accum, activation) -> None:
    """Keep what a later identical call needs: its launcher and the output's shape.  Only scales the
    kernels read where they lie (block scales in torch's layouts) are kept: the launcher takes their
    data pointers, and the key's strides hold later calls to the same layout."""
    if a.device.type != "cuda":
        return
    if not all(t.is_contiguous() for t in _kernel_views(call.epilogue.scaling, scale_a, scale_b)):
        return
    launcher = launch.launcher_for(call, a, b, target)
    if not getattr(launcher, "takes_bases", False):
        return
    key = _fast_key(a, b, scale_a, scale_b, out_dtype, use_fast_accum, activation)
    shape, device, index = (a.shape[0], b.shape[1]), a.device, a.device.index
    current = launch.current_device

    def run(a, b, scale_a, scale_b):
        if current() != index:  # (launch.gemm switches devices; this path does not)
            return run_scaled_mm(a, b, scale_a, scale_b, None, out_dtype, use_fast_accum, activation, None)
        out = alloc_out(shape, out_dtype, device)
        launcher(a, b, out, out, out, out, 1.0, 0.0, scale_a, scale_b)
        return out

    launch.PLANS.remember(key, run)


def _scaled_mm_op(
    a, b, scale_a, scale_b, bias, out_dtype, use_fast_accum, activation, residual
) -> torch.Tensor:
    """``tritongemm::scaled_mm`` (its schema: below): ``scaled_mm`` as one op of a compiled graph (checked at
    trace time, by ``scaled_mm``).  A graph makes the same call every step: from the second, the
    launcher the first kept (``_remember``), as a repeated eager call takes it."""
    if bias is None and residual is None:
        fast = launch.PLANS.entries.get(
            _fast_key(a, b, scale_a, scale_b, out_dtype, use_fast_accum, activation)
        )
        if fast is not None and not ((a.data_ptr() | b.data_ptr()) & 15):
            return fast(a, b, scale_a, scale_b)
    precompile.wait()  # (its kernel may be compiling since the trace: ``_scaled_mm_fake``)
    return run_scaled_mm(a, b, scale_a, scale_b, bias, out_dtype, use_fast_accum, activation, residual)


def _scaled_mm_fake(a, b, scale_a, scale_b, bias, out_dtype, use_fast_accum, activation, residual):
    # A trace: start compiling the kernel the op's first call will launch (``launch.precompile``).
    args = (a, b, scale_a, scale_b, bias, out_dtype, use_fast_accum, activation, residual)
    precompile.attempt("scaled_mm", _precompile, *args)
    return a.new_empty((a.shape[0], b.shape[1]), dtype=out_dtype)


# Defined on a plain ``Library``, as ``autograd.ops``' ``gemm_extern``: the dispatcher calls
# ``_scaled_mm_op`` directly, where a ``custom_op`` ran it behind two Python wrappers (its autograd and
# backend kernels) on every call of a compiled graph.  It has no autograd, as ``torch._scaled_mm`` has
# none (``Float8Linear`` calls it inside its own ``autograd.Function``).
_LIB = torch.library.Library("tritongemm", "FRAGMENT")
_LIB.define(
    "scaled_mm(Tensor a, Tensor b, Tensor scale_a, Tensor scale_b, Tensor? bias, ScalarType out_dtype, "
    "bool use_fast_accum, str activation, Tensor? residual) -> Tensor"
)
_LIB.impl("scaled_mm", _scaled_mm_op, "CompositeExplicitAutograd")
torch.library.register_fake("tritongemm::scaled_mm", _scaled_mm_fake)
register_flops([torch.ops.tritongemm.scaled_mm], gemm_flops)


def _precompile(a, b, scale_a, scale_b, bias, out_dtype, use_fast_accum, activation, residual) -> None:
    """Request the kernel ``run_scaled_mm`` would launch on tensors laid out as these (``launch.precompile``)."""
    call, addend, scales = _launch_args(a, b, scale_a, scale_b, bias, out_dtype, use_fast_accum, activation,
                                        residual)  # fmt: skip
    chosen = launch.traced_plan(call, a, b, call.out_dtype)
    if chosen is not None:
        target = a.new_empty((a.shape[0], b.shape[1]), dtype=call.out_dtype)
        precompile.request_gemm(chosen, call, a, b, target, addend, residual, None, *scales)


def _torch_scaled_mm(a, b, scale_a, scale_b, bias, out_dtype, activation, residual, out):
    """Off the GPU without the interpreter: dequantize and multiply in fp32 with torch."""
    scaling = scaling_of(a, b, scale_a, scale_b)
    if scaling in BLOCK_SCALINGS:
        rows, cols = BLOCK_SCALINGS[scaling]
        a_full = dequantize(a.float(), scale_a, rows, SCALE_BLOCK_K)
        y = a_full @ dequantize(b.float(), scale_b, SCALE_BLOCK_K, cols)
    else:
        y = (a.float() @ b.float()) * scale_a.float() * scale_b.float()
    if bias is not None:
        y = y + bias.float().reshape(-1)
    y = ACTIVATIONS[activation](y)
    if residual is not None:
        y = y + residual.float()
    return out.copy_(y) if out is not None else y.to(out_dtype)


__all__ = [
    "STORED_DTYPES",
    "ScalingError",
    "block_scale_shapes",
    "check_matrices",
    "dequantize",
    "kernel_scales",
    "stored_dtype",
    "run_scaled_mm",
    "scaled_mm",
    "scaling_of",
]
