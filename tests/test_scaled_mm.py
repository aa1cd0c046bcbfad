"""scaled_mm: fp8 GEMMs with torch._scaled_mm's semantics and our fused epilogues.

    out = act((a @ b) * scale_a * scale_b + bias) + residual

Every result is checked against float64 on the same fp8 values (the dequantized
operands), by ``||out - ref|| / ||ref||`` and element by element against
``tol * (|a| @ |b| * |scales| + |bias| + |residual|)``: tensorwise and rowwise
scales, e4m3 / e5m2 (and mixed) operands, bf16 / fp16 / fp32 / fp8 outputs,
ragged shapes, both layouts of ``b``, bias, every activation with a residual,
``out=``, fast accumulation.  Then: agreement with ``torch._scaled_mm``, the
exception types torch raises for bad input (asked of torch in each test),
zeros / inf / NaN in the scales, the torch fallback on a CPU without the
interpreter, torch.compile, and on a GPU: torch._scaled_mm at full size, the
kernel the plan picks, and precise against fast accumulation at K = 8192.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import tritongemm
import tritongemm.frontend.scaled
from tritongemm import TileConfig, launch
from tritongemm.autograd.function import _debug_poison
from tritongemm.device import DeviceInfo
from tritongemm.launch import problem_of
from tritongemm.planning.call import NO_REQUEST
from tritongemm.planning.eligibility import Operand
from tritongemm.planning.heuristics.fp8 import FEW_ROWS, ONE_WAVE_ROWS
from tritongemm.planning.plan import plan
from tritongemm.semantics import ACTIVATIONS  # (torch's own functions, as the reference)
from tritongemm.testing import assert_close, random_tensor, relative_error, shape_id

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
FP8_IDS = {E4M3: "e4m3", E5M2: "e5m2"}
OUT_IDS = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32", E4M3: "e4m3", E5M2: "e5m2"}

#: Bound on the relative error against float64 on the same fp8 values, per output dtype: the
#: rounding of the stored result (bf16 u = 3.9e-3, fp16 u = 4.9e-4) with room to spare, and for
#: fp32 the fp32 accumulation of K exactly representable fp8 products.  An fp8 output is the fp32
#: result rounded once more (e4m3 u = 2^-4, e5m2 u = 2^-3).
TOL = {
    torch.bfloat16: 1e-2,
    torch.float16: 2e-3,
    torch.float32: 1e-5,
    E4M3: 2**-4,
    E5M2: 2**-3,
}

#: fp32 results on a GPU: Hopper's fp8 tensor cores sum the products of a K-step in an
#: accumulator narrower than fp32 before the fp32 sum (about 1e-4 relative, measured on H100 and
#: H200 at K = 96 to 1024, torch._scaled_mm's cuBLAS alike); errors of order one still fail.
GPU_FP32_TOL = 5e-4


def tolerance(out_dtype, device) -> float:
    if out_dtype == torch.float32 and torch.device(device).type == "cuda":
        return GPU_FP32_TOL
    return TOL[out_dtype]


SCALINGS = ("tensorwise", "rowwise")
OPERAND_DTYPES = [(E4M3, E4M3), (E5M2, E5M2), (E4M3, E5M2), (E5M2, E4M3)]
OUT_DTYPES = [torch.bfloat16, torch.float16, torch.float32]
#: (M, N, K), none of them a multiple of a tile (or M = 1).
SHAPES = [(33, 48, 64), (1, 16, 32), (70, 40, 96)]
#: Small tiles: the ragged shapes above span several partial tiles on the interpreter.
SMALL_TILES = TileConfig(16, 16, 32, 8, 4, 2)


def dtype_pair_id(pair) -> str:
    return "x".join(FP8_IDS[d] for d in pair)


@pytest.fixture(autouse=True)
def poisoned_outputs():
    """Every output tritongemm allocates starts as NaN, so an element no kernel writes fails."""
    saved = _debug_poison[0]
    tritongemm._set_poison_outputs(True)
    yield
    tritongemm._set_poison_outputs(saved)


def fp8_matrix(rows, cols, dtype, device, column_major=False):
    """Random fp8 values (standard normal, rounded to ``dtype``) in either memory layout."""
    if column_major:
        return random_tensor((cols, rows), torch.float32, device).to(dtype).t()
    return random_tensor((rows, cols), torch.float32, device).to(dtype)


def operands(m, n, k, dtypes=(E4M3, E4M3), device="cpu", b_layout="col"):
    """a (M, K) row-major and b (K, N): ``w.t()`` of a row-major (N, K) ``w`` (torch's layout) or row-major."""
    a = fp8_matrix(m, k, dtypes[0], device)
    b = fp8_matrix(k, n, dtypes[1], device, column_major=b_layout == "col")
    return a, b


def make_scales(scaling, m, n, device, low=0.5, high=2.0):
    """fp32 scales, uniform in [low, high]: 0-d tensors, or (M, 1) and (1, N)."""
    shapes = ((), ()) if scaling == "tensorwise" else ((m, 1), (1, n))
    return tuple(torch.empty(s, dtype=torch.float32, device=device).uniform_(low, high) for s in shapes)


def reference(a, b, scale_a, scale_b, bias=None, activation="none", residual=None):
    """The result in float64 on the same fp8 values and scales."""
    y = (a.double() @ b.double()) * scale_a.double() * scale_b.double()
    if bias is not None:
        y = y + bias.double()
    y = ACTIVATIONS[activation](y)
    if residual is not None:
        y = y + residual.double()
    return y


def magnitude(a, b, scale_a, scale_b, bias=None, residual=None):
    """The reference evaluated on absolute values: the scale of each element's rounding error
    (relu, gelu and silu move an error by at most 1.13x, inside the tolerances' slack)."""
    s = (a.double().abs() @ b.double().abs()) * scale_a.double().abs() * scale_b.double().abs()
    if bias is not None:
        s = s + bias.double().abs()
    if residual is not None:
        s = s + residual.double().abs()
    return s


def check(
    out, a, b, scale_a, scale_b, out_dtype, *, bias=None, activation="none", residual=None, what="result"
):
    """``out`` matches the float64 reference within ``out_dtype``'s tolerance, norm- and element-wise."""
    ref = reference(a, b, scale_a, scale_b, bias, activation, residual)
    assert out.dtype == out_dtype, f"{what}: dtype {out.dtype}, expected {out_dtype}"
    assert not out.float().isnan().any(), f"{what}: NaN in the output (an element left unwritten?)"
    bound = magnitude(a, b, scale_a, scale_b, bias, residual)
    stored = out.float() if out_dtype in (E4M3, E5M2) else out  # (an fp8 result compared in fp32)
    tol = tolerance(out_dtype, out.device)
    assert_close(stored, ref, dtype=stored.dtype, scale=bound, tol=tol, what=what)


def same_bits(x, y) -> bool:
    """Bitwise equality (also for fp8, which torch.equal does not take on every device)."""
    as_int = {1: torch.uint8, 2: torch.int16, 4: torch.int32}[x.element_size()]
    return x.dtype == y.dtype and torch.equal(x.view(as_int), y.view(as_int))


# ----------------------------------------------------------------------------------
# Correctness against float64
# ----------------------------------------------------------------------------------
@pytest.mark.parametrize("b_layout", ["col", "row"], ids=["b-colmajor", "b-rowmajor"])
@pytest.mark.parametrize("m, n, k", SHAPES, ids=[shape_id(*s) for s in SHAPES])
@pytest.mark.parametrize("out_dtype", OUT_DTYPES, ids=OUT_IDS.get)
@pytest.mark.parametrize("dtypes", OPERAND_DTYPES, ids=dtype_pair_id)
@pytest.mark.parametrize("scaling", SCALINGS)
def test_matches_float64_reference(device, scaling, dtypes, out_dtype, m, n, k, b_layout):
    a, b = operands(m, n, k, dtypes, device, b_layout)
    scale_a, scale_b = make_scales(scaling, m, n, device)
    out = tritongemm.scaled_mm(a, b, scale_a, scale_b, out_dtype=out_dtype)
    check(out, a, b, scale_a, scale_b, out_dtype)


@pytest.mark.parametrize("dtypes", [(E4M3, E4M3), (E5M2, E4M3)], ids=dtype_pair_id)
@pytest.mark.parametrize("scaling", SCALINGS)
def test_default_out_dtype_is_a_dtype(device, scaling, dtypes):
    """Without out_dtype the result has a's (fp8) dtype: the fp32 result rounded to it."""
    a, b = operands(33, 48, 64, dtypes, device)
    scale_a, scale_b = make_scales(scaling, 33, 48, device)
    out = tritongemm.scaled_mm(a, b, scale_a, scale_b)
    check(out, a, b, scale_a, scale_b, dtypes[0])


@pytest.mark.parametrize("out_dtype", [E4M3, E5M2], ids=OUT_IDS.get)
def test_fp8_out_dtype(device, out_dtype):
    a, b = operands(70, 40, 96, (E4M3, E4M3), device)
    scale_a, scale_b = make_scales("rowwise", 70, 40, device)
    bias = random_tensor((40,), torch.float32, device)
    out = tritongemm.scaled_mm(a, b, scale_a, scale_b, bias=bias, out_dtype=out_dtype)
    check(out, a, b, scale_a, scale_b, out_dtype, bias=bias)


@pytest.mark.parametrize("bias_dtype", ["out", torch.float32], ids=["bias-out-dtype", "bias-fp32"])
@pytest.mark.parametrize("out_dtype", OUT_DTYPES, ids=OUT_IDS.get)
@pytest.mark.parametrize("scaling", SCALINGS)
def test_bias(device, scaling, out_dtype, bias_dtype):
    m, n, k = 33, 48, 64
    a, b = operands(m, n, k, (E4M3, E4M3), device)
    scale_a, scale_b = make_scales(scaling, m, n, device)
    bias = random_tensor((n,), out_dtype if bias_dtype == "out" else bias_dtype, device)
    out = tritongemm.scaled_mm(a, b, scale_a, scale_b, bias=bias, out_dtype=out_dtype)
    check(out, a, b, scale_a, scale_b, out_dtype, bias=bias)
    # the bias is added once, after the scales (not scaled, not dropped)
    unbiased = tritongemm.scaled_mm(a, b, scale_a, scale_b, out_dtype=torch.float32)
    assert_close(
        out.float() - unbiased,
        bias.double().expand(m, n),
        dtype=torch.float32,
        tol=10 * tolerance(out_dtype, device),
    )


@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float32], ids=OUT_IDS.get)
@pytest.mark.parametrize("scaling", SCALINGS)
@pytest.mark.parametrize("activation", ["relu", "gelu", "gelu_tanh", "silu"])
def test_activation_with_bias_and_residual(device, activation, scaling, out_dtype):
    m, n, k = 70, 40, 96
    a, b = operands(m, n, k, (E4M3, E4M3), device)
    scale_a, scale_b = make_scales(scaling, m, n, device)
    bias = random_tensor((n,), out_dtype, device)
    residual = random_tensor((m, n), out_dtype, device)
    out = tritongemm.scaled_mm(
        a, b, scale_a, scale_b, bias=bias, activation=activation, residual=residual, out_dtype=out_dtype
    )
    check(out, a, b, scale_a, scale_b, out_dtype, bias=bias, activation=activation, residual=residual)


@pytest.mark.parametrize("scaling", SCALINGS)
def test_residual_without_bias_in_another_dtype(device, scaling):
    """A transposed fp32 residual under a bf16 output, no bias, no activation."""
    m, n, k = 33, 48, 64
    a, b = operands(m, n, k, (E5M2, E5M2), device, "row")
    scale_a, scale_b = make_scales(scaling, m, n, device)
    residual = random_tensor((n, m), torch.float32, device).t()
    out = tritongemm.scaled_mm(a, b, scale_a, scale_b, residual=residual, out_dtype=torch.bfloat16)
    check(out, a, b, scale_a, scale_b, torch.bfloat16, residual=residual)


@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float32, E4M3], ids=OUT_IDS.get)
@pytest.mark.parametrize("scaling", SCALINGS)
def test_out_argument(device, scaling, out_dtype):
    """``out=`` is written in place (every element) and returned."""
    m, n, k = 33, 48, 64
    a, b = operands(m, n, k, (E4M3, E4M3), device)
    scale_a, scale_b = make_scales(scaling, m, n, device)
    out = torch.full((m, n), float("nan"), dtype=out_dtype, device=device)
    result = tritongemm.scaled_mm(a, b, scale_a, scale_b, out_dtype=out_dtype, out=out)
    assert result is out
    check(out, a, b, scale_a, scale_b, out_dtype)


def test_out_argument_strided_view(device):
    """A non-contiguous ``out`` view: every element of the view written, nothing beside it."""
    m, n, k = 33, 48, 64
    a, b = operands(m, n, k, (E4M3, E4M3), device)
    scale_a, scale_b = make_scales("rowwise", m, n, device)
    buf = torch.full((m, 2 * n), float("nan"), dtype=torch.float32, device=device)
    out = buf[:, ::2]
    tritongemm.scaled_mm(a, b, scale_a, scale_b, out_dtype=torch.float32, out=out)
    check(out, a, b, scale_a, scale_b, torch.float32)
    assert buf[:, 1::2].isnan().all(), "elements outside the out view were written"


@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float32], ids=OUT_IDS.get)
@pytest.mark.parametrize("scaling", SCALINGS)
def test_fast_accum_on_and_off(device, scaling, out_dtype):
    """Both accumulations match float64; on the interpreter (no reduced-precision accumulator)
    they give the same bits."""
    m, n, k = 70, 40, 96
    a, b = operands(m, n, k, (E4M3, E4M3), device)
    scale_a, scale_b = make_scales(scaling, m, n, device)
    bias = random_tensor((n,), out_dtype, device)
    results = {}
    for fast in (False, True):
        results[fast] = tritongemm.scaled_mm(
            a, b, scale_a, scale_b, bias=bias, out_dtype=out_dtype, use_fast_accum=fast
        )
        check(results[fast], a, b, scale_a, scale_b, out_dtype, bias=bias, what=f"use_fast_accum={fast}")
    if device.type == "cpu":
        assert torch.equal(results[False], results[True])


@pytest.mark.parametrize("scaling", SCALINGS)
def test_scales_that_are_not_one_are_applied(device, scaling):
    """The scales multiply the product: scaling them by 4 (exact in fp32) scales the result by 4,
    and the result is not the unscaled product."""
    m, n, k = 33, 48, 64
    a, b = operands(m, n, k, (E4M3, E4M3), device)
    scale_a, scale_b = make_scales(scaling, m, n, device, 1.25, 2.0)  # (products >= 1.56)
    out = tritongemm.scaled_mm(a, b, scale_a, scale_b, out_dtype=torch.float32)
    check(out, a, b, scale_a, scale_b, torch.float32)
    ones = torch.ones_like(scale_a), torch.ones_like(scale_b)
    unscaled = tritongemm.scaled_mm(a, b, *ones, out_dtype=torch.float32)
    assert relative_error(out, unscaled.double()) > 0.1
    quadrupled = tritongemm.scaled_mm(a, b, scale_a * 2, scale_b * 2, out_dtype=torch.float32)
    assert torch.equal(quadrupled, out * 4)


@pytest.mark.parametrize(
    "scale_shapes",
    [((1,), (1,)), ((1, 1), ()), ((), (1, 1))],
    ids=["1", "1x1-and-0d", "0d-and-1x1"],
)
def test_one_element_scales_of_rank_up_to_two_are_tensorwise(device, scale_shapes):
    a, b = operands(33, 48, 64, (E4M3, E4M3), device)
    scale_a, scale_b = (torch.full(s, v, device=device) for s, v in zip(scale_shapes, (1.5, 0.625)))
    out = tritongemm.scaled_mm(a, b, scale_a, scale_b, out_dtype=torch.float32)
    check(out, a, b, scale_a.reshape(()), scale_b.reshape(()), torch.float32)


def test_rowwise_scales_that_are_strided_views(device):
    """(M, 1) and (1, N) scales sliced out of larger tensors (not contiguous)."""
    m, n, k = 33, 48, 64
    a, b = operands(m, n, k, (E4M3, E4M3), device)
    scale_a = torch.empty(m, 3, device=device).uniform_(0.5, 2)[:, 1:2]
    scale_b = torch.empty(2, 2 * n, device=device).uniform_(0.5, 2)[1:, ::2]
    out = tritongemm.scaled_mm(a, b, scale_a, scale_b, out_dtype=torch.float32)
    check(out, a, b, scale_a, scale_b, torch.float32)


def test_rowwise_with_one_row(device):
    """M = 1 with rowwise scales: scale_a (1, 1), scale_b (1, N)."""
    a, b = operands(1, 48, 64, (E4M3, E4M3), device)
    scale_a, scale_b = make_scales("rowwise", 1, 48, device)
    out = tritongemm.scaled_mm(a, b, scale_a, scale_b, out_dtype=torch.bfloat16)
    check(out, a, b, scale_a, scale_b, torch.bfloat16)


@pytest.mark.parametrize(
    "config",
    [
        SMALL_TILES,
        TileConfig(16, 32, 32, 8, 4, 2, split_k=3),
        TileConfig(16, 32, 32, 8, 4, 2, split_k=3, split_k_inline=True),
    ],
    ids=["small-tiles", "split-k", "split-k-inline"],
)
@pytest.mark.parametrize("scaling", SCALINGS)
def test_forced_configs(device, scaling, config):
    """Many partial tiles, and split-K (the scales applied once, after the slices are summed)."""
    m, n, k = 70, 40, 96
    a, b = operands(m, n, k, (E4M3, E4M3), device)
    scale_a, scale_b = make_scales(scaling, m, n, device)
    bias = random_tensor((n,), torch.float32, device)
    residual = random_tensor((m, n), torch.float32, device)
    out = tritongemm.scaled_mm(
        a, b, scale_a, scale_b, bias=bias, activation="silu", residual=residual,
        out_dtype=torch.float32, config=config,
    )  # fmt: skip
    check(out, a, b, scale_a, scale_b, torch.float32, bias=bias, activation="silu", residual=residual)


# ----------------------------------------------------------------------------------
# The output is fully written
# ----------------------------------------------------------------------------------
def test_poisoning_reaches_scaled_mm_outputs(device, monkeypatch):
    """With the kernel skipped, the output is all NaN: the outputs the other tests check for NaN
    really start poisoned, so an element no kernel writes would fail them."""
    monkeypatch.setattr(launch, "gemm", lambda call, a, b, out, *rest: out)
    launch.clear_plan_cache()  # (a call remembered by an earlier test would launch)
    a, b = operands(33, 48, 64, (E4M3, E4M3), device)
    scale_a, scale_b = make_scales("tensorwise", 33, 48, device)
    for out_dtype in (torch.bfloat16, torch.float32, E4M3):
        out = tritongemm.scaled_mm(a, b, scale_a, scale_b, out_dtype=out_dtype)
        assert out.float().isnan().all(), out_dtype


@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float16, torch.float32, E4M3], ids=OUT_IDS.get)
@pytest.mark.parametrize("m, n, k", SHAPES, ids=[shape_id(*s) for s in SHAPES])
@pytest.mark.parametrize("scaling", SCALINGS)
def test_output_fully_written(device, scaling, m, n, k, out_dtype):
    a, b = operands(m, n, k, (E4M3, E4M3), device)
    scale_a, scale_b = make_scales(scaling, m, n, device)
    config = SMALL_TILES if device.type == "cpu" else None
    out = tritongemm.scaled_mm(a, b, scale_a, scale_b, out_dtype=out_dtype, config=config)
    assert out.shape == (m, n)
    unwritten = out.float().isnan()
    assert not unwritten.any(), (
        f"{int(unwritten.sum())} elements unwritten, first at {unwritten.nonzero()[0].tolist()}"
    )
    check(out, a, b, scale_a, scale_b, out_dtype)


# ----------------------------------------------------------------------------------
# Agreement with torch._scaled_mm
# ----------------------------------------------------------------------------------
def torch_scaled_mm(*args, **kwargs):
    """torch._scaled_mm's result; on a GPU, a skip (with torch's words) for what its CUDA path refuses
    (N and K not multiples of 16, rowwise scaling to an fp8 output...).  On the CPU it must not refuse."""
    try:
        return torch._scaled_mm(*args, **kwargs)
    except (RuntimeError, ValueError) as exc:
        if args[0].device.type == "cpu":
            raise
        pytest.skip(f"torch._scaled_mm refuses this on {args[0].device}: {exc}")


@pytest.mark.parametrize("with_bias", [False, True], ids=["no-bias", "bias"])
@pytest.mark.parametrize("dtypes", [(E4M3, E4M3), (E4M3, E5M2)], ids=dtype_pair_id)
@pytest.mark.parametrize("scaling", SCALINGS)
def test_matches_torch_scaled_mm(device, scaling, dtypes, with_bias):
    m, n, k = 70, 48, 96  # (N and K multiples of 16: torch's CUDA path wants them)
    a, b = operands(m, n, k, dtypes, device)
    scale_a, scale_b = make_scales(scaling, m, n, device)
    bias = random_tensor((n,), torch.bfloat16, device) if with_bias else None
    theirs = torch_scaled_mm(a, b, scale_a, scale_b, bias=bias, out_dtype=torch.bfloat16)
    ours = tritongemm.scaled_mm(a, b, scale_a, scale_b, bias=bias, out_dtype=torch.bfloat16)
    assert ours.dtype == theirs.dtype == torch.bfloat16
    assert ours.shape == theirs.shape == (m, n)
    err = relative_error(ours, theirs)
    assert err <= TOL[torch.bfloat16], f"relative difference from torch._scaled_mm {err:.3g}"
    check(ours, a, b, scale_a, scale_b, torch.bfloat16, bias=bias)


@pytest.mark.parametrize("scaling", SCALINGS)
def test_matches_torch_scaled_mm_default_out_dtype(device, scaling):
    """Both default to a's fp8 dtype."""
    a, b = operands(33, 48, 64, (E4M3, E4M3), device)
    scale_a, scale_b = make_scales(scaling, 33, 48, device, 0.25, 0.5)
    theirs = torch_scaled_mm(a, b, scale_a, scale_b)
    ours = tritongemm.scaled_mm(a, b, scale_a, scale_b)
    assert ours.dtype == theirs.dtype == E4M3
    assert relative_error(ours.float(), theirs.float()) <= TOL[E4M3]


# ----------------------------------------------------------------------------------
# Errors: torch's exception types
# ----------------------------------------------------------------------------------
M_, N_, K_ = 33, 48, 64


def _bad(**changes):
    """The keyword arguments of a valid call, with ``changes`` applied to them (callables of the
    valid arguments)."""

    def build(device):
        a, b = operands(M_, N_, K_, (E4M3, E4M3), device)
        one = torch.ones((), device=device)
        kwargs = dict(a=a, b=b, scale_a=one, scale_b=one.clone(), out_dtype=torch.bfloat16)
        for name, change in changes.items():
            kwargs[name] = change(kwargs)
        return kwargs

    return build


#: (bad input, the words both must say or None); torch's exception type is asked of torch in the test.
TORCH_ERRORS = {
    "3d-a": (_bad(a=lambda kw: kw["a"][None]), "mat1 must be a matrix"),
    "3d-b": (_bad(b=lambda kw: kw["b"][None]), None),
    "k-mismatch": (_bad(b=lambda kw: kw["b"][:32]), f"{M_}x{K_} and 32x{N_}"),
    "bf16-operands": (_bad(a=lambda kw: kw["a"].bfloat16(), b=lambda kw: kw["b"].bfloat16()), None),
    "bf16-a": (_bad(a=lambda kw: kw["a"].bfloat16()), None),
    "int8-a": (_bad(a=lambda kw: kw["a"].view(torch.int8)), None),
    "float64-scales": (
        _bad(scale_a=lambda kw: kw["scale_a"].double(), scale_b=lambda kw: kw["scale_b"].double()),
        None,
    ),
    "fp16-scale-b": (_bad(scale_b=lambda kw: kw["scale_b"].half()), None),
    "rowwise-scale-a-too-short": (
        _bad(scale_a=lambda kw: torch.ones(M_ - 1, 1), scale_b=lambda kw: torch.ones(1, N_)),
        None,
    ),
    "rowwise-scale-b-too-long": (
        _bad(scale_a=lambda kw: torch.ones(M_, 1), scale_b=lambda kw: torch.ones(1, N_ + 1)),
        None,
    ),
    "rowwise-scales-1d": (
        _bad(scale_a=lambda kw: torch.ones(M_), scale_b=lambda kw: torch.ones(N_)),
        None,
    ),
    "tensorwise-a-rowwise-b": (_bad(scale_b=lambda kw: torch.ones(1, N_)), None),
    "bias-wrong-length": (
        _bad(bias=lambda kw: torch.ones(N_ - 1, dtype=torch.bfloat16)),
        f"Bias must be size {N_}",
    ),
    "b-not-a-tensor": (_bad(b=lambda kw: kw["b"].float().tolist()), None),
    "a-not-a-tensor": (_bad(a=lambda kw: kw["a"].float().tolist()), None),
    "a-not-a-tensor-default-out-dtype": (
        _bad(a=lambda kw: kw["a"].float().tolist(), out_dtype=lambda kw: None),
        None,
    ),
    "scale-a-python-float": (_bad(scale_a=lambda kw: 1.0), None),
}


@pytest.mark.parametrize("case", list(TORCH_ERRORS))
def test_bad_input_raises_torchs_exception_type(case):
    """Each bad input is given to torch._scaled_mm (on the CPU) and to scaled_mm: ours is an instance of
    torch's exception type (a bad scaling configuration is a ValueError in torch 2.13 and a RuntimeError
    before; ``scaled.ScalingError`` is both)."""
    build, words = TORCH_ERRORS[case]
    kwargs = build("cpu")
    args = [kwargs.pop(name) for name in ("a", "b", "scale_a", "scale_b")]
    try:
        torch._scaled_mm(*args, **kwargs)
    except Exception as exc:  # noqa: BLE001 (whatever torch raises is what we must raise)
        torch_raised = exc
    else:
        pytest.skip(f"torch {torch.__version__} takes this input on the CPU: no exception type to follow")
    expected = type(torch_raised)
    if words is not None:
        assert words in str(torch_raised), "torch's message changed; update the words checked"
    with pytest.raises(Exception) as ours_raised:
        tritongemm.scaled_mm(*args, **kwargs)
    assert isinstance(ours_raised.value, expected), (
        f"scaled_mm raised {type(ours_raised.value).__name__}: {ours_raised.value}; "
        f"torch._scaled_mm raises {expected.__name__}: {torch_raised}"
    )
    if words is not None:
        assert words in str(ours_raised.value)


def test_one_element_scale_of_rank_three_is_tensorwise(device):
    a, b = operands(M_, N_, K_, (E4M3, E4M3), device)
    scale_a = torch.full((1, 1, 1), 1.5, device=device)
    scale_b = torch.full((), 0.5, device=device)
    theirs = torch._scaled_mm(a.cpu(), b.cpu(), scale_a.cpu(), scale_b.cpu(), out_dtype=torch.float32)
    ours = tritongemm.scaled_mm(a, b, scale_a, scale_b, out_dtype=torch.float32)
    assert relative_error(ours.cpu(), theirs.double()) <= tolerance(torch.float32, ours.device)


def test_bias_of_shape_1xN_is_taken_as_torch_takes_it(device):
    a, b = operands(M_, N_, K_, (E4M3, E4M3), device)
    one = torch.ones((), device=device)
    bias = random_tensor((1, N_), torch.bfloat16, device)
    theirs = torch._scaled_mm(
        a.cpu(), b.cpu(), one.cpu(), one.cpu(), bias=bias.cpu(), out_dtype=torch.bfloat16
    )
    ours = tritongemm.scaled_mm(a, b, one, one, bias=bias, out_dtype=torch.bfloat16)
    assert relative_error(ours.cpu(), theirs.double()) <= TOL[torch.bfloat16]


def test_errors_of_our_own_arguments(device):
    a, b = operands(M_, N_, K_, (E4M3, E4M3), device)
    one = torch.ones((), device=device)
    with pytest.raises(ValueError, match="unknown activation 'tanh'"):
        tritongemm.scaled_mm(a, b, one, one, out_dtype=torch.bfloat16, activation="tanh")
    wrong = torch.empty(N_, M_, dtype=torch.bfloat16, device=device)
    with pytest.raises(RuntimeError, match=rf"\({M_}, {N_}\)"):
        tritongemm.scaled_mm(a, b, one, one, out_dtype=torch.bfloat16, out=wrong)
    wrong_dtype = torch.empty(M_, N_, dtype=torch.float16, device=device)
    with pytest.raises(RuntimeError, match="float16"):
        tritongemm.scaled_mm(a, b, one, one, out_dtype=torch.bfloat16, out=wrong_dtype)
    with pytest.raises(RuntimeError, match="residual"):
        tritongemm.scaled_mm(a, b, one, one, residual=torch.ones(M_, N_ - 1, device=device))
    with pytest.raises(ValueError, match="out_dtype"):
        tritongemm.scaled_mm(a, b, one, one, out_dtype=torch.float64)


# ----------------------------------------------------------------------------------
# Zeros, inf and NaN in the scales
# ----------------------------------------------------------------------------------
def assert_same_special_values(out, ref, bound, tol):
    """NaN and +-inf exactly where the float64 reference has them; the finite rest within ``tol``."""
    out64 = out.double()
    nan, ref_nan = out64.isnan(), ref.isnan()
    assert torch.equal(nan, ref_nan), (
        f"NaN at {nan.nonzero().tolist()[:8]}..., the reference at {ref_nan.nonzero().tolist()[:8]}..."
    )
    inf, ref_inf = out64.isinf(), ref.isinf()
    assert torch.equal(inf, ref_inf), f"{int(inf.sum())} infs, the reference has {int(ref_inf.sum())}"
    assert torch.equal(out64[inf].sign(), ref[ref_inf].sign()), "infs of the wrong sign"
    finite = ref.isfinite()
    diff = (out64[finite] - ref[finite]).abs()
    assert (diff <= tol * bound[finite]).all(), f"finite elements off by up to {diff.max().item():.3g}"


def special_operands(device):
    """Operands with a zero row of a and a zero column of b: zero products, which inf scales make NaN."""
    m, n, k = 33, 48, 64
    a, b = operands(m, n, k, (E4M3, E4M3), device)
    a[2] = 0
    b[:, 5] = 0
    return a, b


@pytest.mark.parametrize("out_dtype", OUT_DTYPES, ids=OUT_IDS.get)
@pytest.mark.parametrize(
    "values",
    [(0.0, 1.5), (float("inf"), 1.5), (-float("inf"), 0.75), (float("nan"), 1.0), (float("inf"), 0.0)],
    ids=["zero", "inf", "minus-inf", "nan", "inf-times-zero"],
)
def test_tensorwise_special_scales(device, values, out_dtype):
    a, b = special_operands(device)
    scale_a, scale_b = (torch.tensor(v, device=device) for v in values)
    out = tritongemm.scaled_mm(a, b, scale_a, scale_b, out_dtype=out_dtype)
    ref = reference(a, b, scale_a, scale_b)
    if values[0] == 0.0:
        assert (out == 0).all()
    assert_same_special_values(
        out, ref, magnitude(a, b, scale_a.abs().clamp(max=2), scale_b), tolerance(out_dtype, device)
    )


@pytest.mark.parametrize("out_dtype", OUT_DTYPES, ids=OUT_IDS.get)
def test_zero_scale_leaves_the_bias(device, out_dtype):
    a, b = operands(33, 48, 64, (E4M3, E4M3), device)
    bias = random_tensor((48,), out_dtype, device)
    zero, one = torch.zeros((), device=device), torch.ones((), device=device)
    out = tritongemm.scaled_mm(a, b, zero, one, bias=bias, out_dtype=out_dtype)
    assert torch.equal(out, bias.to(out_dtype).expand(33, 48))


@pytest.mark.parametrize("out_dtype", OUT_DTYPES, ids=OUT_IDS.get)
def test_rowwise_special_scales(device, out_dtype):
    """A NaN in scale_a poisons just its row, an inf its row (NaN where the product is 0), a zero
    zeroes it; likewise for scale_b's columns."""
    a, b = special_operands(device)
    m, n = a.shape[0], b.shape[1]
    scale_a, scale_b = make_scales("rowwise", m, n, device)
    scale_a[3], scale_a[7], scale_a[11] = float("nan"), float("inf"), 0.0
    scale_b[0, 9], scale_b[0, 13] = -float("inf"), 0.0
    out = tritongemm.scaled_mm(a, b, scale_a, scale_b, out_dtype=out_dtype)
    ref = reference(a, b, scale_a, scale_b)
    finite_scales = (scale_a.nan_to_num(posinf=1.0), scale_b.nan_to_num(neginf=-1.0))
    assert_same_special_values(out, ref, magnitude(a, b, *finite_scales), tolerance(out_dtype, device))
    nan_rows = out.isnan().all(dim=1).nonzero().flatten().tolist()
    assert nan_rows == [3], nan_rows
    assert (
        not out[[r for r in range(m) if r not in (2, 3, 7, 11)]][:, [c for c in range(n) if c != 9]]
        .isnan()
        .any()
    )
    assert (out[11, [c for c in range(n) if c != 9]] == 0).all()
    assert (out[[r for r in range(m) if r not in (3, 7)], 13] == 0).all()


# ----------------------------------------------------------------------------------
# A CPU without the interpreter: torch computes it
# ----------------------------------------------------------------------------------
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float32, E4M3], ids=OUT_IDS.get)
@pytest.mark.parametrize("scaling", SCALINGS)
def test_cpu_without_interpreter_falls_back_to_torch(monkeypatch, scaling, out_dtype):
    launched = []
    monkeypatch.setattr(tritongemm.frontend.scaled, "interpreter_enabled", lambda: False)
    monkeypatch.setattr(launch, "gemm", lambda *args, **kw: launched.append(args))
    m, n, k = 33, 48, 64
    a, b = operands(m, n, k, (E4M3, E5M2), "cpu")
    scale_a, scale_b = make_scales(scaling, m, n, "cpu")
    bias = random_tensor((n,), torch.float32, "cpu")
    residual = random_tensor((m, n), torch.bfloat16, "cpu")
    out = tritongemm.scaled_mm(
        a, b, scale_a, scale_b, bias=bias, activation="gelu", residual=residual, out_dtype=out_dtype
    )
    assert not launched, "a kernel was launched on a CPU without the interpreter"
    check(out, a, b, scale_a, scale_b, out_dtype, bias=bias, activation="gelu", residual=residual)
    given = torch.full((m, n), float("nan"), dtype=out_dtype)
    assert tritongemm.scaled_mm(a, b, scale_a, scale_b, out_dtype=out_dtype, out=given) is given
    assert not launched, "a kernel was launched on a CPU without the interpreter"
    check(given, a, b, scale_a, scale_b, out_dtype, what="out=")
    # the arguments are still checked
    with pytest.raises(ValueError):
        tritongemm.scaled_mm(a, b, scale_a.double(), scale_b, out_dtype=out_dtype)


_FALLBACK_SCRIPT = """
import json, torch, tritongemm
torch.manual_seed(0)
a = torch.randn(33, 64).to(torch.float8_e4m3fn)
b = torch.randn(48, 64).to(torch.float8_e5m2).t()
sa, sb = torch.rand(33, 1) + 0.5, torch.rand(1, 48) + 0.5
bias = torch.randn(48)
out = tritongemm.scaled_mm(a, b, sa, sb, bias=bias, activation="silu", out_dtype=torch.float32)
ref = torch.nn.functional.silu(a.double() @ b.double() * sa.double() * sb.double() + bias.double())
print(json.dumps(dict(
    interpreter=tritongemm.interpreter_enabled(),
    error=((out.double() - ref).norm() / ref.norm()).item(),
    dtype=str(out.dtype),
)))
"""


def run_without_interpreter(script: str) -> dict:
    """Run ``script`` in a process without TRITON_INTERPRET; the JSON its last line prints."""
    root = Path(__file__).resolve().parents[1]
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(root), env.get("PYTHONPATH", "")])
    proc = subprocess.run(
        [sys.executable, "-c", script], cwd=root, env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.heavy
def test_cpu_without_interpreter_in_a_subprocess():
    """The real thing: a process without TRITON_INTERPRET, on CPU tensors."""
    result = run_without_interpreter(_FALLBACK_SCRIPT)
    assert result["interpreter"] is False
    assert result["dtype"] == "torch.float32"
    assert result["error"] <= TOL[torch.float32], result


# ----------------------------------------------------------------------------------
# torch.compile
# ----------------------------------------------------------------------------------
def _compile_inputs(device):
    m, n, k = 33, 48, 64
    a, b = operands(m, n, k, (E4M3, E4M3), device)
    scale_a, scale_b = make_scales("rowwise", m, n, device)
    bias = random_tensor((n,), torch.bfloat16, device)
    residual = random_tensor((m, n), torch.bfloat16, device)
    return a, b, scale_a, scale_b, bias, residual


def fused_scaled_mm(a, b, scale_a, scale_b, bias, residual):
    """``scaled_mm`` with every epilogue part, as the compile tests trace it (here and for block scales)."""
    return tritongemm.scaled_mm(
        a, b, scale_a, scale_b, bias=bias, activation="gelu_tanh", residual=residual, out_dtype=torch.bfloat16
    )


def compiled_matches_eager(fused, inputs, backend):
    """``fused`` compiled with ``fullgraph=True`` on ``backend``: no graph break, the eager result bit
    for bit; returns the compiled result."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    eager = fused(*inputs)
    compiled = torch.compile(lambda *t: fused(*t), fullgraph=True, backend=backend)(*inputs)
    assert not counters["graph_break"], dict(counters["graph_break"])
    assert torch.equal(compiled, eager)
    return compiled


def assert_opcheck_passes(inputs):
    """torch.library's checks of the custom op's fake kernel and registrations on ``inputs`` (test_schema
    is left out: it compares the fp8 inputs before and after with torch.allclose, which CPU fp8 lacks)."""
    a, b, scale_a, scale_b, bias, residual = inputs
    args = (a, b, scale_a, scale_b, bias, torch.bfloat16, False, "silu", residual)
    result = torch.library.opcheck(
        torch.ops.tritongemm.scaled_mm.default,
        args,
        test_utils=("test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic"),
    )
    assert set(result.values()) == {"SUCCESS"}, result


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_torch_compile_fullgraph_matches_eager(device, backend):
    inputs = _compile_inputs(device)
    compiled = compiled_matches_eager(fused_scaled_mm, inputs, backend)
    check(compiled, *inputs[:4], torch.bfloat16, bias=inputs[4], activation="gelu_tanh", residual=inputs[5])


def assert_traces_one_scaled_mm_op(fused, inputs):
    """``fused`` compiled with ``fullgraph=True`` is one ``tritongemm.scaled_mm`` op, giving the eager result."""
    seen = []

    def recording_backend(gm, example_inputs):
        seen.extend(str(n.target) for n in gm.graph.nodes if n.op == "call_function")
        return gm.forward

    torch._dynamo.reset()
    out = torch.compile(lambda *t: fused(*t), fullgraph=True, backend=recording_backend)(*inputs)
    assert seen == ["tritongemm.scaled_mm.default"], seen
    assert torch.equal(out, fused(*inputs))


def test_torch_compile_traces_one_scaled_mm_op(device):
    assert_traces_one_scaled_mm_op(fused_scaled_mm, _compile_inputs(device))


@pytest.mark.parametrize("out_dtype", [torch.bfloat16, E4M3], ids=OUT_IDS.get)
def test_torch_compile_with_out_argument(device, out_dtype):
    torch._dynamo.reset()
    a, b, scale_a, scale_b, _, _ = _compile_inputs(device)
    out = torch.full((33, 48), float("nan"), dtype=out_dtype, device=device)

    def fn(a, b, scale_a, scale_b, out):
        return tritongemm.scaled_mm(a, b, scale_a, scale_b, out_dtype=out_dtype, out=out)

    torch.compile(fn, fullgraph=True, backend="aot_eager")(a, b, scale_a, scale_b, out)
    check(out, a, b, scale_a, scale_b, out_dtype)
    eager = tritongemm.scaled_mm(a, b, scale_a, scale_b, out_dtype=out_dtype)
    assert same_bits(out, eager)


def test_custom_op_opcheck(device):
    assert_opcheck_passes(_compile_inputs(device))


# ----------------------------------------------------------------------------------
# The kernel the plan picks (on the CPU, for a GPU described by its budgets)
# ----------------------------------------------------------------------------------
H100 = DeviceInfo("H100", (9, 0), 132, 232448)
A100 = DeviceInfo("A100", (8, 0), 108, 166912)


def warp_specialized_fp8_unavailable() -> str | None:
    """Why this Triton cannot build the warp-specialized fp8 kernel (None when it can)."""
    from tritongemm.kernels.gluon_common import GLUON_UNAVAILABLE_REASON, PRECISE_FP8_AVAILABLE

    if GLUON_UNAVAILABLE_REASON:
        return f"Gluon unavailable in this Triton: {GLUON_UNAVAILABLE_REASON}"
    if not PRECISE_FP8_AVAILABLE:
        return "this Triton's Gluon wgmma has no max_num_imprecise_acc (precise fp8 sums)"
    return None


def gpu_plan(m, n, k, gpu, b_layout, out_dtype=torch.bfloat16, fast_accumulation=False):
    """What ``plan`` chooses for an fp8 problem on ``gpu`` (shapes and strides only: meta tensors)."""
    a = torch.empty(m, k, dtype=E4M3, device="meta")
    b = (
        torch.empty(n, k, dtype=E4M3, device="meta").t()
        if b_layout == "col"
        else torch.empty(k, n, dtype=E4M3, device="meta")
    )
    c = torch.empty(m, n, dtype=out_dtype, device="meta")
    return plan(
        problem_of(a, b), gpu, NO_REQUEST, Operand.of(a), Operand.of(b), Operand.of(c), E4M3, out_dtype,
        fast_accumulation=fast_accumulation,
    )  # fmt: skip


PLAN_SHAPES = [
    (1, 4096, 4096),
    (16, 4096, 4096),
    (64, 4096, 4096),
    (65, 1024, 4096),
    (1000, 2048, 1024),
    (4096, 4096, 4096),
]


def _plan_cases():
    cases = []
    for shape in PLAN_SHAPES:
        for out_dtype in (torch.bfloat16, torch.float16, torch.float32):
            cases.append(pytest.param(*shape, out_dtype, id=f"{shape_id(*shape)}-{OUT_IDS[out_dtype]}"))
    return cases


@pytest.mark.parametrize("m, n, k, out_dtype", _plan_cases())
def test_plan_on_h100(m, n, k, out_dtype):
    """Few rows: the pointer kernel's tiles (K step 256), whatever the layout.  More: a K step of 128
    bytes, K-major operands on the warp-specialized kernel, b row-major on the pointer kernel, which
    says why."""
    col = gpu_plan(m, n, k, H100, "col", out_dtype)
    row = gpu_plan(m, n, k, H100, "row", out_dtype)
    if m <= ONE_WAVE_ROWS and -(-m // 64) * -(-n // 64) <= H100.sm_count:  # (the pointer kernel's rules)
        for chosen in (col, row):
            assert chosen.kernel == chosen.config.kernel == "pointer", chosen.kernel
            assert chosen.config.block_m == (max(16, 1 << (m - 1).bit_length()) if m <= FEW_ROWS else 64)
            assert chosen.config.block_k == 256
        return
    assert col.config.block_k == row.config.block_k == 128
    assert row.kernel == "pointer"
    assert "K-major" in row.fallback
    reason = warp_specialized_fp8_unavailable()
    if reason is None:
        assert col.kernel == "gluon_ws", (col.kernel, col.fallback)
        assert col.config.kernel == "gluon_ws"
    else:  # this Triton cannot build it: the plan falls back to the pointer kernel
        assert col.kernel == "pointer" and col.fallback, (reason, col.fallback)


@pytest.mark.parametrize(
    "m, n, k, tile, split",
    [
        (16, 4096, 4096, (16, 32, 256, 4), 1),  # 128 narrow tiles, 16 K steps: unsplit
        (17, 4096, 14336, (32, 32, 256, 4), 2),  # 56 K steps over under two waves: two slices
        (64, 5120, 5120, (64, 32, 256, 4), 1),
        (1, 14336, 4096, (16, 128, 256, 3), 1),  # 448 narrow tiles: 128 wide
        (48, 18944, 16384, (64, 128, 256, 3), 2),  # 148 wide tiles, 64 K steps
        (16, 24, 80, (16, 32, 128, 4), 1),  # short K and N: the K step and width rounded up
        (128, 4096, 14336, (64, 64, 256, 4), 1),  # 128 tiles of 64x64: one wave, unsplit
        (100, 4096, 4096, (64, 64, 256, 4), 1),
    ],
)
def test_few_rows_tiles(m, n, k, tile, split):
    """fp8 with few rows: the pointer kernel's tile, its K step and split (heuristics/fp8.py)."""
    cfg = gpu_plan(m, n, k, H100, "col").config
    assert (cfg.block_m, cfg.block_n, cfg.block_k, cfg.num_stages) == tile
    assert (cfg.kernel, cfg.num_warps, cfg.split_k, cfg.split_k_inline) == ("pointer", 4, split, split > 1)


def test_more_rows_than_one_wave_of_64x64_tiles_take_the_warp_specialized_kernel():
    """128 rows over 5120 columns: 160 tiles of 64x64, more than a wave; 129 rows: past the rule."""
    for m, n in ((128, 5120), (129, 4096)):
        cfg = gpu_plan(m, n, 4096, H100, "col").config
        assert cfg.kernel == ("gluon_ws" if warp_specialized_fp8_unavailable() is None else "pointer")
        assert cfg.block_k == 128


SPLIT_128 = (128, 128, 4, True, False)  # two 4-warp consumers on the halves of its rows
WIDE_128x256 = (128, 256, 8, False, True)  # one 8-warp consumer, staged in halves


@pytest.mark.parametrize(
    "m, n, k, fast_tile",
    [
        (256, 4096, 4096, (64, 128, 4, False, False)),  # 64 tiles of 128x128: at most half the SMs
        (512, 4096, 4096, SPLIT_128),  # 64 of 128x256: under 3/4 of the SMs
        (1024, 14336, 4096, SPLIT_128),  # 128x256 keeps 85% busy, 128x128 97%
        (1024, 18944, 3584, SPLIT_128),  # 90% against 99.7%
        (1024, 4096, 4096, WIDE_128x256),  # 128 wide tiles: 97% busy
        (512, 14336, 4096, WIDE_128x256),  # 85% either way
        (2048, 14336, 4096, (128, 256, 4, True, False)),  # 896 wide tiles: split (128 rows in halves)
    ],
)
def test_more_rows_tiles(m, n, k, fast_tile):
    """fp8 past the few-rows rules on sm_90 (heuristics/fp8.py).  Precise sums: 128x128 tiles on two
    4-warp consumers splitting its rows, except where 64x128 tiles on one consumer fill under half the
    SMs.  Fast accumulation: that split tile where 128x256 tiles would leave SMs idle, else 128x256 (on
    two consumers from many tiles).  On other GPUs the pointer kernel, whose 128-row tiles take 8 warps."""
    precise = gpu_plan(m, n, k, H100, "col").config
    fast = gpu_plan(m, n, k, H100, "col", fast_accumulation=True).config
    narrow = fast_tile[0] == 64
    assert (
        precise.block_m,
        precise.block_n,
        precise.num_warps,
        precise.pingpong,
        precise.epilogue_subtile,
    ) == (fast_tile if narrow else SPLIT_128)
    assert (fast.block_m, fast.block_n, fast.num_warps, fast.pingpong, fast.epilogue_subtile) == fast_tile
    assert precise.block_k == fast.block_k == 128
    elsewhere = gpu_plan(m, n, k, A100, "col").config  # (108 SMs: its own count of tiles)
    assert elsewhere.kernel == "pointer" and not elsewhere.pingpong
    assert elsewhere.num_warps == (4 if elsewhere.block_m == 64 else 8)


@pytest.mark.parametrize(
    "m, n, k, split",
    [
        (8192, 8192, 4096, True),  # 2048 tiles of 128x256
        (4096, 4096, 4096, True),  # 512
        (2048, 4096, 4096, False),  # 256: one consumer of 8 warps, staged in halves
        (1024, 14336, 4096, False),  # the 128x128 rule's (split already)
    ],
)
def test_fast_accumulation_splits_the_wide_tiles_rows_from_many_tiles(m, n, k, split):
    """With ``use_fast_accum`` and at least ``FP8_FAST_SPLIT_TILES`` tiles of 128x256, the wide tile
    runs on two 4-warp consumers splitting its rows (3 stages, not staged in halves); fewer tiles keep
    the heuristic's tile, and bf16 is untouched by either accumulation's rule."""
    a = torch.empty(m, k, dtype=E4M3, device="meta")
    b = torch.empty(n, k, dtype=E4M3, device="meta").t()
    c = torch.empty(m, n, dtype=torch.bfloat16, device="meta")
    ops = (Operand.of(a), Operand.of(b), Operand.of(c))
    fast = plan(problem_of(a, b), H100, NO_REQUEST, *ops, E4M3, torch.bfloat16, fast_accumulation=True)
    precise = plan(problem_of(a, b), H100, NO_REQUEST, *ops, E4M3, torch.bfloat16)
    cfg = fast.config
    if split:
        assert (cfg.block_m, cfg.block_n, cfg.num_warps, cfg.num_stages) == (128, 256, 4, 3)
        assert cfg.pingpong and not cfg.epilogue_subtile and "fast accumulation" in fast.source
    else:
        assert "fast accumulation" not in fast.source
    # Precise sums take the 128x128 split tile instead of 128x256, from the rule's tile either way.
    assert (precise.config.block_n, precise.config.num_warps, precise.config.pingpong) == (128, 4, True)
    bf16 = [torch.empty(s, dtype=torch.bfloat16, device="meta") for s in ((m, k), (n, k), (m, n))]
    ops16 = (Operand.of(bf16[0]), Operand.of(bf16[1].t()), Operand.of(bf16[2]))
    problem16 = problem_of(bf16[0], bf16[1].t())
    args16 = (problem16, H100, NO_REQUEST, *ops16, torch.bfloat16, torch.bfloat16)
    assert plan(*args16, fast_accumulation=True).config == plan(*args16).config


@pytest.mark.parametrize("m, n, k", PLAN_SHAPES[1::2], ids=[shape_id(*s) for s in PLAN_SHAPES[1::2]])
def test_plan_without_warp_specialization(m, n, k):
    """Not sm_90: the pointer kernel, whatever the layout."""
    for b_layout in ("col", "row"):
        chosen = gpu_plan(m, n, k, A100, b_layout)
        assert chosen.kernel == "pointer"
        assert chosen.config.kernel == "pointer"


# ----------------------------------------------------------------------------------
# On the GPU
# ----------------------------------------------------------------------------------
GPU_SHAPES = [(4096, 4096, 4096), (16, 4096, 4096), (128, 4096, 4096), (1000, 2048, 1024)]


@pytest.mark.gpu
@pytest.mark.parametrize("with_bias", [False, True], ids=["no-bias", "bias"])
@pytest.mark.parametrize("fast_accum", [False, True], ids=["precise", "fast-accum"])
@pytest.mark.parametrize("scaling", SCALINGS)
@pytest.mark.parametrize("m, n, k", GPU_SHAPES, ids=[shape_id(*s) for s in GPU_SHAPES])
def test_gpu_matches_torch_scaled_mm(device, m, n, k, scaling, fast_accum, with_bias):
    a, b = operands(m, n, k, (E4M3, E4M3), device)
    scale_a, scale_b = make_scales(scaling, m, n, device)
    bias = random_tensor((n,), torch.bfloat16, device) if with_bias else None
    kw = dict(bias=bias, out_dtype=torch.bfloat16, use_fast_accum=fast_accum)
    ours = tritongemm.scaled_mm(a, b, scale_a, scale_b, **kw)
    theirs = torch._scaled_mm(a, b, scale_a, scale_b, **kw)
    err = relative_error(ours, theirs)
    assert err <= TOL[torch.bfloat16], f"relative difference from torch._scaled_mm {err:.3g}"
    check(ours, a, b, scale_a, scale_b, torch.bfloat16, bias=bias)


@pytest.mark.gpu
@pytest.mark.parametrize(
    "b_layout, out_dtype",
    [
        ("col", torch.bfloat16),
        ("col", torch.float16),
        ("col", torch.float32),
        ("col", E4M3),
        ("row", torch.bfloat16),
    ],
    ids=["colmajor-bf16", "colmajor-fp16", "colmajor-fp32", "colmajor-e4m3", "rowmajor-bf16"],
)
def test_gpu_kernel_choice(device, plans, b_layout, out_dtype):
    """K-major operands run on the warp-specialized kernel on sm_90; b row-major on the pointer kernel
    (the kernel ``launch.plan_for`` gives the launch, as the ``plans`` fixture records it)."""
    capability = torch.cuda.get_device_capability(device)
    if b_layout == "col" and capability != (9, 0):
        pytest.skip(
            f"the warp-specialized fp8 kernel is sm_90's; this GPU is sm_{capability[0]}{capability[1]}"
        )
    if b_layout == "col" and warp_specialized_fp8_unavailable():
        pytest.skip(warp_specialized_fp8_unavailable())
    m, n, k = 1000, 2048, 1024
    a, b = operands(m, n, k, (E4M3, E4M3), device, b_layout)
    # (scales of 1/sqrt(K) keep the sums inside e4m3's range, 448, for the fp8 output)
    scale_a, scale_b = make_scales("rowwise", m, n, device, 0.5 / k**0.5, 2 / k**0.5)
    out = tritongemm.scaled_mm(a, b, scale_a, scale_b, out_dtype=out_dtype)
    assert [p["kernel"] for p in plans] == ["gluon_ws" if b_layout == "col" else "pointer"], plans
    check(out, a, b, scale_a, scale_b, out_dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("m", [16, 256], ids=["few-rows", "warp-specialized"])
@pytest.mark.parametrize("scaling", SCALINGS)
def test_gpu_precise_accumulation_at_least_as_accurate_as_fast(device, scaling, m):
    n, k = 256, 8192
    a, b = operands(m, n, k, (E4M3, E4M3), device)
    scale_a, scale_b = make_scales(scaling, m, n, device)
    ref = reference(a, b, scale_a, scale_b)
    errors = {}
    for fast in (False, True):
        out = tritongemm.scaled_mm(a, b, scale_a, scale_b, out_dtype=torch.float32, use_fast_accum=fast)
        errors[fast] = relative_error(out, ref)
    theirs = torch._scaled_mm(a, b, scale_a, scale_b, out_dtype=torch.float32, use_fast_accum=False)
    assert errors[False] <= errors[True], (
        f"precise {errors[False]:.3g} > fast {errors[True]:.3g} (torch precise: {relative_error(theirs, ref):.3g})"
    )
    # as accurate as torch's own precise mode (fast accumulation would not be, at this K)
    assert errors[False] <= max(2 * relative_error(theirs, ref), TOL[torch.float32]), errors
    assert errors[False] <= GPU_FP32_TOL, errors


@pytest.mark.gpu
@pytest.mark.parametrize("scaling", SCALINGS)
def test_gpu_repeated_calls_read_each_calls_tensors(device, scaling):
    """A call seen before skips its checks and plan (its entry): it must still read this call's
    operands and scales, and an operand at an address the launcher was not built for (not 16-byte
    aligned) takes the full path."""
    m, n, k = 48, 256, 512
    for _ in range(3):
        a, b = operands(m, n, k, (E4M3, E4M3), device)
        scale_a, scale_b = make_scales(scaling, m, n, device)
        ours = tritongemm.scaled_mm(a, b, scale_a, scale_b, out_dtype=torch.bfloat16)
        check(ours, a, b, scale_a, scale_b, torch.bfloat16)
    buffer = torch.empty(m * k + 1, dtype=torch.uint8, device=device)
    shifted = buffer[1:].view(E4M3).view(m, k)  # same shape and strides, an odd address
    shifted.copy_(a)
    ours = tritongemm.scaled_mm(shifted, b, scale_a, scale_b, out_dtype=torch.bfloat16)
    check(ours, a, b, scale_a, scale_b, torch.bfloat16)


@pytest.mark.gpu
@pytest.mark.parametrize("scaling", SCALINGS)
def test_gpu_the_compiled_graphs_op_repeats_its_first_calls_launch(device, scaling, monkeypatch):
    """``tritongemm::scaled_mm``, as a compiled graph calls it every step: its first call with a signature
    takes the full path, later ones the launcher it kept (not planned again), each reading its own
    operands; a bias or a residual takes the full path every call."""
    from tritongemm.frontend import scaled

    full = []
    real = scaled.run_scaled_mm
    monkeypatch.setattr(scaled, "run_scaled_mm", lambda *args, **kw: full.append(1) or real(*args, **kw))
    tritongemm.clear_plan_cache()
    m, n, k = 48, 256, 512
    op = torch.ops.tritongemm.scaled_mm.default
    for i in range(3):
        a, b = operands(m, n, k, (E4M3, E4M3), device)
        scale_a, scale_b = make_scales(scaling, m, n, device)
        check(op(a, b, scale_a, scale_b, None, torch.bfloat16, False, "none", None), a, b, scale_a, scale_b,
              torch.bfloat16)  # fmt: skip
        assert len(full) == 1, (i, full)
    bias = random_tensor((n,), torch.bfloat16, device)
    for _ in range(2):
        check(op(a, b, scale_a, scale_b, bias, torch.bfloat16, False, "none", None), a, b, scale_a, scale_b,
              torch.bfloat16, bias=bias)  # fmt: skip
    assert len(full) == 3


def test_explain_gives_scaled_mms_plan_for_fp8_operands():
    a = torch.empty(4096, 4096, dtype=E4M3, device="meta")
    w = torch.empty(4096, 4096, dtype=E4M3, device="meta")
    k_major = tritongemm.explain(a, w.t(), device="h100", out_dtype=torch.bfloat16)
    expected = gpu_plan(4096, 4096, 4096, H100, "col")
    assert (k_major.kernel, k_major.config) == (expected.kernel, expected.config)
    assert k_major.config.block_k == 128 and "fp8" in k_major.source
    row_major = tritongemm.explain(a, w, device="h100")
    assert row_major.kernel == "pointer" and "K-major" in row_major.fallback
    with pytest.raises(RuntimeError, match="cannot be multiplied"):
        tritongemm.explain(a, w[:, :128].t(), device="h100")
