"""Test helpers: operands, float64 references and the per-dtype tolerances.

Used by ``tests/``, the tuner and the benchmarks (no pytest import here): the one home
of operand makers, tolerances, the error metric, L2 rotation, timing and text tables.

Every check compares against torch evaluated in float64 on the same inputs,
by the relative error ``||out - ref|| / ||ref||`` and, element by element,
against the rounding bound ``|out - ref| <= tol * scale`` where ``scale`` is
the same function evaluated on ``|inputs|`` (for a product, ``|A| @ |B|``).
The element-wise bound catches a single wrong element that the norm would
average away; both use the one tolerance per dtype defined here.

>>> a, b = make_operands(17, 31, 65, "TN", torch.float16, "cpu")
>>> assert_matches_reference(tritongemm.matmul, torch.matmul, a, b)
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from .device import interpreter_enabled

DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
DTYPE_IDS = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32", torch.float64: "fp64"}

#: Bound on the relative error against a float64 reference, per output dtype.
#: Each is about 4x the format's unit roundoff u (the rounding of the stored
#: result dominates; accumulation is fp32 or fp64), so rounding passes and a
#: wrong tile, a lost K step or a misread stride (errors of order 1) fail:
#:   fp16  u = 2^-11 = 4.9e-4          bf16  u = 2^-8 = 3.9e-3
#:   fp32  u = 2^-24 = 6.0e-8, but K products accumulate: sqrt(K) u ~ 1e-6
#:   fp64  u = 2^-53 = 1.1e-16, accumulated the same way.
TOLERANCES: dict[torch.dtype, float] = {
    torch.float16: 2e-3,
    torch.bfloat16: 1.5e-2,
    torch.float32: 1e-5,
    torch.float64: 1e-12,
}
#: fp32 on a GPU when torch allows TF32: operands are rounded to a 10-bit
#: mantissa (u = 2^-11), so fp32 gets fp16-like accuracy.
TF32_TOLERANCE = 2e-3


def default_device() -> torch.device:
    """Where tests run: the GPU when Triton compiles for it, else the CPU interpreter."""
    if torch.cuda.is_available() and not interpreter_enabled():
        return torch.device("cuda")
    return torch.device("cpu")


def tf32_allowed() -> bool:
    """torch's rule for float32 matmuls: TF32 when ``allow_tf32`` (or fp32_precision) says so."""
    from .semantics import tf32_enabled

    return tf32_enabled()


#: Bound on the relative error against *another library's* result in the same dtype
#: (the benchmarks' gate against cuBLAS, the tuner's check against torch): both
#: sides are fp32 accumulations rounded to the output dtype, and cuBLAS may
#: reduce split-K partials in reduced precision, so about 10x the rounding is
#: left; a wrong kernel (a skipped K tile, a swapped operand) errs by 1e-1 or more.
LIBRARY_TOLERANCES: dict[torch.dtype, float] = {
    torch.float16: 1e-2,
    torch.bfloat16: 3e-2,
    torch.float32: 1e-4,
    torch.float64: 1e-9,
}
LIBRARY_TF32_TOLERANCE = 1e-2


def tolerance(dtype: torch.dtype, device: torch.device | str = "cpu", against: str = "float64") -> float:
    """The relative-error bound for results of ``dtype`` computed on ``device``.

    ``against="float64"``: compared with a float64 reference on the same inputs
    (the tests).  ``against="library"``: compared with another library's
    result in the same dtype (the benchmarks' gate, the tuner's check).
    """
    device = torch.device(device)
    tf32 = dtype == torch.float32 and device.type == "cuda" and tf32_allowed()
    if against == "library":
        return LIBRARY_TF32_TOLERANCE if tf32 else LIBRARY_TOLERANCES[dtype]
    if against != "float64":
        raise ValueError(f"against must be 'float64' or 'library', got {against!r}")
    return TF32_TOLERANCE if tf32 else TOLERANCES[dtype]


# ----------------------------------------------------------------------------------
# Operands
# ----------------------------------------------------------------------------------
def random_tensor(
    shape: Sequence[int], dtype: torch.dtype, device, generator: torch.Generator | None = None
) -> torch.Tensor:
    """Standard-normal values in ``dtype``, with no exact zeros (a zero hides bugs).

    Drawn in fp32 (fp64 for fp64) and rounded: randn's fp16/bf16 support varies by device and version.
    """
    x = torch.randn(
        tuple(shape),
        dtype=torch.float64 if dtype == torch.float64 else torch.float32,
        device=device,
        generator=generator,
    )
    x = x.to(dtype)
    return torch.where(x == 0, torch.ones_like(x), x)


def nan_tensor(shape: Sequence[int], dtype: torch.dtype, device) -> torch.Tensor:
    return torch.full(tuple(shape), float("nan"), dtype=dtype, device=device)


#: How a matrix operand is laid out in memory (what the kernel's strides see).
LAYOUTS = {
    "N": "row-major (contiguous)",
    "T": "transposed view of a contiguous tensor (.mT)",
    "S": "x[1::2, 1::2] slice of a NaN-filled buffer: no unit stride, a storage offset",
}


def make_matrix(
    rows: int,
    cols: int,
    layout: str,
    dtype: torch.dtype,
    device,
    batch: Sequence[int] = (),
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """A random (*batch, rows, cols) operand in one of ``LAYOUTS`` (the one operand maker of tests,
    tuner and benchmarks; pass a ``generator`` for reproducible sets).

    The "S" layout sits in a buffer whose other elements are NaN: an element
    read through a wrong stride poisons the result.
    """
    batch = tuple(batch)
    if layout == "N":
        return random_tensor((*batch, rows, cols), dtype, device, generator)
    if layout == "T":
        return random_tensor((*batch, cols, rows), dtype, device, generator).mT
    if layout == "S":
        buf = nan_tensor((*batch, 2 * rows + 1, 2 * cols + 1), dtype, device)
        view = buf[..., 1::2, 1::2]
        view.copy_(random_tensor(view.shape, dtype, device, generator))
        return view
    raise ValueError(f"unknown layout {layout!r}; one of {sorted(LAYOUTS)}")


def make_operands(
    m: int, n: int, k: int, layout: str, dtype: torch.dtype, device, batch: Sequence[int] = ()
) -> tuple[torch.Tensor, torch.Tensor]:
    """A (*batch, m, k) and B (*batch, k, n) in the two-letter ``layout`` ("NT": A row-major, B transposed)."""
    return (
        make_matrix(m, k, layout[0], dtype, device, batch),
        make_matrix(k, n, layout[1], dtype, device, batch),
    )


def strided_out(shape: Sequence[int], dtype: torch.dtype, device) -> tuple[torch.Tensor, torch.Tensor]:
    """A non-contiguous NaN-filled ``out`` view (every other column) and the buffer behind it."""
    *lead, cols = tuple(shape)
    buf = nan_tensor((*lead, 2 * cols), dtype, device)
    return buf[..., ::2], buf


# ----------------------------------------------------------------------------------
# Comparison with a float64 reference
# ----------------------------------------------------------------------------------
def relative_error(out: torch.Tensor, ref: torch.Tensor, rows_per_chunk: int = 1024) -> float:
    """``||out - ref|| / ||ref||`` in float64 (absolute when ``ref`` is all zeros); NaN stays NaN.

    Accumulated a row block at a time: a full-size float64 copy of an
    8192 x 57344 output would take 3.8 GB.
    """
    out2 = out.reshape(-1, out.shape[-1]) if out.dim() > 1 else out.reshape(1, -1)
    ref2 = ref.reshape(-1, ref.shape[-1]) if ref.dim() > 1 else ref.reshape(1, -1)
    err = torch.zeros((), dtype=torch.float64, device=out.device)
    norm = torch.zeros((), dtype=torch.float64, device=out.device)
    for start in range(0, out2.shape[0], rows_per_chunk):
        o = out2[start : start + rows_per_chunk].double()
        r = ref2[start : start + rows_per_chunk].double()
        err += (o - r).square().sum()
        norm += r.square().sum()
    diff, scale = math.sqrt(err.item()), math.sqrt(norm.item())
    return diff / scale if scale > 0 else diff


# ----------------------------------------------------------------------------------
# L2 rotation: timed calls never find their operands in L2
# ----------------------------------------------------------------------------------
#: Assumed L2 size when the device cannot tell us (H100: 50 MB, H200: 60 MB).
DEFAULT_L2_BYTES = 64 * 2**20
#: Rotated input copies must together be this many times the L2 size.
L2_ROTATION_FACTOR = 2
#: Never more copies than this (tiny problems would otherwise need thousands).
MAX_ROTATION_COPIES = 1024


def rotation_copies(set_bytes: int, l2_bytes: int = DEFAULT_L2_BYTES, most: int = MAX_ROTATION_COPIES) -> int:
    """How many copies of an input set together exceed ``L2_ROTATION_FACTOR`` x L2 (at most ``most``)."""
    return max(1, min(most, math.ceil(L2_ROTATION_FACTOR * l2_bytes / max(set_bytes, 1))))


def assert_close(
    out: torch.Tensor,
    ref: torch.Tensor,
    *,
    dtype: torch.dtype | None = None,
    scale: torch.Tensor | None = None,
    tol: float | None = None,
    what: str = "result",
) -> None:
    """``out`` matches the float64 ``ref`` within ``dtype``'s tolerance (norm-wise and element-wise)."""
    dtype = dtype or out.dtype
    tol = tol if tol is not None else tolerance(dtype, out.device)
    assert out.shape == ref.shape, f"{what}: shape {tuple(out.shape)} != reference {tuple(ref.shape)}"
    assert out.dtype == dtype, f"{what}: dtype {out.dtype}, expected {dtype}"
    if out.numel() == 0:
        return
    err = relative_error(out, ref)
    assert err <= tol, f"{what}: relative error {err:.3g} > {tol:.3g} ({DTYPE_IDS.get(dtype, dtype)})"
    if scale is not None:
        diff = (out.double() - ref.double()).abs()
        bound = tol * scale.double()
        bad = ~(diff <= bound)  # NaN counts as bad
        if bad.any():
            idx = tuple(int(i) for i in bad.nonzero()[0])
            raise AssertionError(
                f"{what}: {int(bad.sum())} of {out.numel()} elements outside tol*scale, first at {idx}: "
                f"got {out[idx].item()!r}, reference {ref[idx].item()!r}, bound {bound[idx].item():.3g}"
            )


def _to_reference(x, absolute: bool):
    if isinstance(x, torch.Tensor):
        r = x.detach().to(torch.float64)
        r = r.abs() if absolute else r
        return r.requires_grad_(x.requires_grad)
    if absolute and isinstance(x, (int, float)) and not isinstance(x, bool):
        return abs(x)
    return x


def assert_matches_reference(
    ours: Callable,
    theirs: Callable,
    *args,
    grad: bool = True,
    ours_kwargs: dict | None = None,
    **kwargs,
) -> torch.Tensor:
    """``ours(*args, **kwargs)`` against ``theirs`` in float64, forward and backward.

    Gradients are compared for every tensor argument that requires grad (leaf
    or view), for a random incoming gradient.  Scalar keyword arguments
    (alpha, beta) enter the element-wise scale by absolute value.  Returns our
    output.
    """
    out = ours(*args, **kwargs, **(ours_kwargs or {}))
    ref = theirs(*[_to_reference(a, False) for a in args], **kwargs)
    abs_args = [_to_reference(a, True) for a in args]
    abs_kwargs = {k: _to_reference(v, True) for k, v in kwargs.items()}
    scale = theirs(*abs_args, **abs_kwargs)
    assert out.device == args[0].device, f"result on {out.device}, inputs on {args[0].device}"
    assert_close(out, ref, scale=scale.detach(), dtype=args[0].dtype, what="forward")

    wants_grad = [a for a in args if isinstance(a, torch.Tensor) and a.requires_grad]
    if not (grad and wants_grad and out.numel() > 0):
        return out
    grad_out = random_tensor(out.shape, out.dtype, out.device)
    ours_grads = torch.autograd.grad(out, wants_grad, grad_out)
    ref_args = [_to_reference(a, False) for a in args]
    ref_inputs = [r for r in ref_args if isinstance(r, torch.Tensor) and r.requires_grad]
    ref_grads = torch.autograd.grad(theirs(*ref_args, **kwargs), ref_inputs, grad_out.double())
    abs_inputs = [r for r in abs_args if isinstance(r, torch.Tensor) and r.requires_grad]
    scale_grads = torch.autograd.grad(theirs(*abs_args, **abs_kwargs), abs_inputs, grad_out.double().abs())
    for i, (g, r, s) in enumerate(zip(ours_grads, ref_grads, scale_grads)):
        assert_close(g, r, scale=s, dtype=wants_grad[i].dtype, what=f"gradient of tensor argument {i}")
    return out


# ----------------------------------------------------------------------------------
# Timing and tables, shared by the tuner and the benchmarks
# ----------------------------------------------------------------------------------
def time_samples(
    step: Callable[[], Any],
    device: torch.device,
    warmup_ms: float = 25,
    rep_ms: float = 100,
    grad_to_none: Sequence[torch.Tensor] | None = None,
) -> list[float]:
    """Milliseconds of each timed call of ``step`` (the one timing wrapper of tuner and benchmarks).

    On CUDA: ``triton.testing.do_bench`` (CUDA events around each call, L2
    flushed before each).  On CPU (the interpreter): a wall clock, meaningful for tests only.
    """
    if device.type == "cuda":
        import triton.testing

        times = triton.testing.do_bench(
            step, warmup=warmup_ms, rep=rep_ms, grad_to_none=grad_to_none, return_mode="all"
        )
        return [float(t) for t in times]
    if warmup_ms > 0:  # (the interpreter compiles nothing: a warm-up call only settles caches)
        step()
    times = []
    deadline = time.perf_counter() + rep_ms / 1000
    while len(times) < 2 or (time.perf_counter() < deadline and len(times) < 1000):
        if grad_to_none:
            for t in grad_to_none:
                t.grad = None
        t0 = time.perf_counter()
        step()
        times.append((time.perf_counter() - t0) * 1000)
    return times


def format_table(rows: Sequence[dict], columns: Sequence[tuple[str, str]]) -> str:
    """A plain fixed-width table; ``columns`` are (key, heading) pairs."""

    def cell(v) -> str:
        if v is None or (isinstance(v, float) and math.isnan(v)):
            return "-"
        if isinstance(v, float):
            return f"{v:.3g}" if abs(v) < 1 else f"{v:,.2f}"
        return str(v)

    cells = [[cell(r.get(k)) for k, _ in columns] for r in rows]
    widths = [max([len(h)] + [len(c[i]) for c in cells]) for i, (_, h) in enumerate(columns)]
    lines = ["  ".join(h.ljust(w) for (_, h), w in zip(columns, widths))]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths)) for row in cells]
    return "\n".join(lines)


def shape_id(*dims: int) -> str:
    """'17x31x65' for readable test ids."""
    return "x".join(str(d) for d in dims)


__all__ = [
    "DTYPES",
    "DTYPE_IDS",
    "LAYOUTS",
    "TOLERANCES",
    "LIBRARY_TOLERANCES",
    "rotation_copies",
    "TF32_TOLERANCE",
    "assert_close",
    "assert_matches_reference",
    "default_device",
    "make_matrix",
    "make_operands",
    "nan_tensor",
    "random_tensor",
    "relative_error",
    "format_table",
    "shape_id",
    "time_samples",
    "strided_out",
    "tf32_allowed",
    "tolerance",
]
