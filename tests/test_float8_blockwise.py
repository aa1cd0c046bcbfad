"""fp8 training with the "blockwise" recipe (DeepSeek-V3's: activations and gradients a scale per
1 x 128, weights per 128 x 128, every tensor e4m3): the block casts (torch's ops and the Triton kernel),
the three GEMMs against float64 products of exactly the fp8 operands float8's table names, an outlier
that spoils only its block, conversion and training, compile; full size on a GPU."""

from __future__ import annotations

import pytest
import torch
from test_float8 import device_for_kernels, fp32_tolerance

from tritongemm import launch
from tritongemm.frontend import float8
from tritongemm.frontend import nn as tnn
from tritongemm.frontend.float8 import E4M3, E5M2, FP8_MAX, float8_linear, quantize, quantize_kernels
from tritongemm.frontend.scaled import dequantize
from tritongemm.testing import relative_error

BLOCK = 128
#: Rows per scale of each scaling, written out here rather than taken from the library.
SCALINGS = {"1x128": 1, "128x128": 128}
DTYPES = [E4M3, E5M2]
DTYPE_IDS = ["e4m3", "e5m2"]
#: Ragged against the 128 x 128 blocks (and the kernel's 32-row programs) in both dimensions.
SHAPES = [(70, 300), (130, 260)]
SHAPE_IDS = ["70x300", "130x260"]
#: e4m3 and e5m2: mantissa bits and the smallest normal exponent.
MANTISSA = {E4M3: 3, E5M2: 2}
MIN_EXP = {E4M3: -6, E5M2: -14}


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def block_amax(x: torch.Tensor, per: int) -> torch.Tensor:
    """max |x| of every ``per`` x 128 block, block by block (independent of the library's padding)."""
    rows, cols = x.shape
    out = torch.empty(cdiv(rows, per), cdiv(cols, BLOCK), dtype=torch.float64)
    for i in range(out.shape[0]):
        for j in range(out.shape[1]):
            out[i, j] = x[i * per : (i + 1) * per, j * BLOCK : (j + 1) * BLOCK].abs().max().double()
    return out


def expand(scale: torch.Tensor, per: int, rows: int, cols: int) -> torch.Tensor:
    """Each block's scale at each of its elements."""
    return scale.repeat_interleave(per, 0)[:rows].repeat_interleave(BLOCK, 1)[:, :cols]


@pytest.mark.parametrize("shape", SHAPES, ids=SHAPE_IDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("scaling", SCALINGS)
def test_quantize_scales_each_block_by_its_amax(scaling, dtype, shape):
    per, (rows, cols) = SCALINGS[scaling], shape
    limit = FP8_MAX[dtype]
    # Blocks spanning eight decades (rows two more), and one all-zero block (the last row's first).
    decades = torch.rand(cdiv(rows, BLOCK), cdiv(cols, BLOCK)) * 8 - 4
    x = (
        torch.randn(rows, cols)
        * expand(10**decades, BLOCK, rows, cols)
        * torch.logspace(-1, 1, rows)[:, None]
    )
    x[rows - 1 - (rows - 1) % per :, :BLOCK] = 0.0
    x8, scale = quantize(x, dtype, scaling)
    assert x8.dtype == dtype and x8.shape == (rows, cols) and x8.is_contiguous()
    assert scale.dtype == torch.float32 and scale.shape == (cdiv(rows, per), cdiv(cols, BLOCK))
    if per == 1:
        assert scale.stride(0) == 1  # rows contiguous: the layout scaled_mm reads without a copy
    else:
        assert scale.is_contiguous()
    amax = block_amax(x, per)
    zero = amax == 0
    assert zero.sum() == 1 and zero[-1, 0]
    expected = torch.where(zero, 1.0, (amax.float() / limit))
    assert torch.equal(scale, expected)
    assert torch.equal(block_amax(x8.float(), per), torch.where(zero, 0.0, limit).double())
    # Each element is the format's nearest value relative to its block's scale (clear of subnormals).
    back = dequantize(x8.double(), scale.double(), per, BLOCK)
    full = expand(scale.double(), per, rows, cols)
    big = x.abs().double() > full * 2.0 ** MIN_EXP[dtype] * 4
    rel = ((back - x.double()).abs() / x.abs().double().clamp_min(1e-30))[big]
    assert big.float().mean() > 0.5 and rel.max().item() <= 2.0 ** -(MANTISSA[dtype] + 1) * 1.0001


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("scaling", SCALINGS)
def test_quantize_reads_a_transposed_view_as_its_contiguous_copy(scaling, dtype):
    x = torch.randn(260, 130).t()  # (130, 260), column-major
    x8, scale = quantize(x, dtype, scaling)
    ref8, ref_scale = quantize(x.contiguous(), dtype, scaling)
    assert x8.is_contiguous() and torch.equal(x8.float(), ref8.float())
    assert torch.equal(scale, ref_scale) and scale.stride() == ref_scale.stride()


def on_the_block_grid(rows, cols, dtype, per, seed=5):
    """fp8 numbers of magnitude 1 to the format's largest, each block's largest that, times a power of
    two per block: the scales are powers of two and the quotients need no rounding (Triton's interpreter
    rounds some fp32 -> fp8 conversions down a binade).  One block all zeros."""
    gen = torch.Generator().manual_seed(seed)
    magnitude = 1 + torch.rand(rows, cols, generator=gen) * (FP8_MAX[dtype] - 1)
    sign = torch.randint(0, 2, (rows, cols), generator=gen) * 2 - 1
    v = (magnitude * sign).to(dtype).float()
    v[::per, ::BLOCK] = FP8_MAX[dtype]  # (the first row of each block: its maximum)
    power = 2.0 ** torch.randint(-6, 7, (cdiv(rows, per), cdiv(cols, BLOCK)), generator=gen)
    v = v * expand(power, per, rows, cols)
    v[:per, BLOCK : 2 * BLOCK] = 0.0
    return v


def _kernel_cases():
    """The fast tier: each scaling on one ragged shape (1x128: 70 rows over three column blocks;
    128x128: two row blocks, the second ragged, over one ragged column block), e4m3 row-major and
    e5m2 transposed; the rest of the grid under slow (the interpreter is slow on 128 x 128 blocks)."""
    fast_shape = {"1x128": (70, 300), "128x128": (130, 100)}
    fast = {(E4M3, "row-major"), (E5M2, "transposed")}
    cases = []
    for scaling in SCALINGS:
        for dtype, dtype_id in zip(DTYPES, DTYPE_IDS):
            for shape in dict.fromkeys((fast_shape[scaling], *SHAPES)):
                for view in ("row-major", "transposed"):
                    in_fast = shape == fast_shape[scaling] and (dtype, view) in fast
                    case_id = f"{scaling}-{dtype_id}-{shape[0]}x{shape[1]}-{view}"
                    marks = () if in_fast else pytest.mark.slow
                    cases.append(pytest.param(scaling, dtype, shape, view, id=case_id, marks=marks))
    return cases


@pytest.mark.parametrize("scaling, dtype, shape, view", _kernel_cases())
def test_quantize_kernels_match_torchs_block_quantization(scaling, dtype, shape, view):
    rows, cols = shape
    x = on_the_block_grid(rows, cols, dtype, SCALINGS[scaling]).to(device_for_kernels())
    if view == "transposed":
        x = x.t().contiguous().t()  # the same values, column-major
    q, scale = quantize_kernels(x, dtype, scaling)
    q_ref, scale_ref = float8.quantize_torch(x.cpu(), dtype, scaling)  # torch's ops
    assert q.is_contiguous() and q.dtype == dtype and q.shape == (rows, cols)
    assert scale.shape == scale_ref.shape and scale.stride() == scale_ref.stride()
    assert torch.equal(scale.cpu(), scale_ref)
    assert torch.equal(q.cpu().float(), q_ref.float())
    assert torch.equal(q_ref.float(), x.cpu() / expand(scale_ref, SCALINGS[scaling], rows, cols))


@pytest.mark.parametrize("scaling", [pytest.param("1x128"), pytest.param("128x128", marks=pytest.mark.slow)])
def test_block_quantize_launches_are_kept_and_reused(scaling):
    launch.clear_plan_cache()
    x = on_the_block_grid(20 if scaling == "1x128" else 140, 130, E4M3, SCALINGS[scaling]).to(
        device_for_kernels()
    )
    first = quantize_kernels(x, E4M3, scaling)
    kept = dict(launch.PLANS.launchers)
    assert len(kept) == 1, kept
    again = quantize_kernels(x.clone(), E4M3, scaling)
    assert launch.PLANS.launchers == kept
    assert torch.equal(first[0].float(), again[0].float()) and torch.equal(first[1], again[1])
    quantize_kernels(x[:10], E4M3, scaling)  # another shape: a launch of its own
    assert len(launch.PLANS.launchers) == 2


def dq(t: torch.Tensor, scaling: str) -> torch.Tensor:
    """float64 of the fp8 operand ``quantize`` makes of ``t`` (e4m3: every blockwise tensor)."""
    x8, scale = quantize(t, E4M3, scaling)
    return dequantize(x8.double(), scale.double(), SCALINGS[scaling], BLOCK)


def reference(x, w, bias, g):
    """float64 products of exactly the fp8 operands float8's table names for "blockwise"."""
    y = dq(x, "1x128") @ dq(w, "128x128").T + (bias.double() if bias is not None else 0)
    dx = dq(g, "1x128") @ dq(w.t(), "128x128").T
    dw = dq(g.t(), "1x128") @ dq(x.t(), "1x128").T  # (along the tokens: K of this GEMM)
    return y, dx, dw


def test_blockwise_recipe_is_1x128_activations_128x128_weights_e4m3_gradients():
    assert "blockwise" in float8.RECIPES
    assert float8.ACTIVATION_SCALING["blockwise"] == "1x128"
    assert float8.WEIGHT_SCALING["blockwise"] == "128x128"
    assert float8.GRAD_DTYPE["blockwise"] == E4M3 and float8.GRAD_DTYPE["rowwise"] == E5M2


@pytest.mark.parametrize("with_bias", [False, True], ids=["no-bias", "bias"])
def test_float8_linear_forward_and_backward_match_float64_of_the_fp8_operands(with_bias):
    device = device_for_kernels()
    torch.manual_seed(1)
    # M = 80 (not a multiple of 128; the weight gradient's K), K = 192 and N = 160 (ragged blocks)
    x = torch.randn(2, 40, 192, device=device, requires_grad=True)
    w = (torch.randn(160, 192, device=device) * 0.1).requires_grad_()
    bias = torch.randn(160, device=device, requires_grad=True) if with_bias else None
    y = float8_linear(x, w, bias, "blockwise", torch.float32, fast_accum=False)
    assert y.shape == (2, 40, 160) and y.dtype == torch.float32
    g = torch.randn_like(y)
    y.backward(g)
    x2, g2 = x.detach().reshape(80, 192), g.reshape(80, 160)
    ry, rdx, rdw = reference(x2, w.detach(), bias, g2)
    tol = fp32_tolerance(device)
    assert relative_error(y.detach().reshape(80, 160), ry) <= tol
    assert relative_error(x.grad.reshape(80, 192), rdx) <= tol
    assert relative_error(w.grad, rdw) <= tol
    if with_bias:
        torch.testing.assert_close(bias.grad, g2.sum(0))
    # ... and fp8 is near the exact layer (e4m3 everywhere: a few percent).
    exact = x2.double() @ w.detach().double().T
    assert relative_error(y.detach().reshape(80, 160) - (bias.detach() if with_bias else 0), exact) < 0.06
    assert relative_error(x.grad.reshape(80, 192), g2.double() @ w.detach().double()) < 0.06
    assert relative_error(w.grad, g2.double().T @ x2.double()) < 0.06


def test_an_outlier_spoils_only_its_own_block():
    """An element of 1e6 in one row's first block (the weight ignores it): with a scale per 1 x 128 the
    row's other blocks keep their precision, where one scale for the row flushes them to zero (their
    quotients fall below e4m3's smallest subnormal)."""
    device = device_for_kernels()
    torch.manual_seed(2)
    x = torch.randn(64, 512, device=device)
    x[3, :BLOCK] = 0.0
    x[3, 5] = 1e6
    w = torch.randn(96, 512, device=device) * 0.1
    w[:, 5] = 0.0  # the exact output is of ordinary size
    exact = x.double() @ w.double().T
    errors = {}
    for recipe in ("blockwise", "rowwise"):
        y = float8_linear(x, w, None, recipe, torch.float32, fast_accum=False)
        errors[recipe] = relative_error(y[3], exact[3])
        assert relative_error(y[4:], exact[4:]) < 0.06  # (the rows without an outlier, both)
    assert errors["blockwise"] < 0.06, errors
    assert errors["rowwise"] > 0.5, errors  # (the check tells the two apart)


def test_convert_makes_blockwise_layers_and_a_model_trains():
    device = device_for_kernels()
    torch.manual_seed(3)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 64)).to(
        device
    )
    reference_model = torch.nn.Sequential(
        torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 64)
    ).to(device)
    reference_model.load_state_dict(model.state_dict())
    tnn.convert(model, precision="fp8", recipe="blockwise")
    for layer in (model[0], model[2]):
        assert type(layer) is tnn.Float8Linear and layer.recipe == "blockwise"
        assert "recipe='blockwise'" in repr(layer)
    x = torch.randn(96, 64, device=device)
    target = torch.randn(96, 64, device=device)
    losses = {}
    for name, net in (("fp8", model), ("fp32", reference_model)):
        opt = torch.optim.SGD(net.parameters(), lr=0.1)
        losses[name] = []
        for _ in range(4):
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(net(x), target)
            loss.backward()
            opt.step()
            losses[name].append(loss.item())
        assert all(p.dtype == torch.float32 and p.grad.dtype == torch.float32 for p in net.parameters())
    fp8 = losses["fp8"]
    assert all(torch.isfinite(torch.tensor(fp8))) and fp8[-1] < fp8[0], fp8
    assert abs(fp8[-1] - losses["fp32"][-1]) <= 0.05 * losses["fp32"][-1], losses


@pytest.mark.slow
def test_blockwise_layer_compiles_without_graph_breaks():
    device = device_for_kernels()
    torch.manual_seed(4)
    layer = tnn.convert(torch.nn.Linear(192, 160).to(device), precision="fp8", recipe="blockwise")
    x = torch.randn(80, 192, device=device, requires_grad=True)
    eager = layer(x)
    eager.square().sum().backward()
    eager_dx, eager_dw = x.grad, layer.weight.grad
    x.grad = layer.weight.grad = None
    compiled = torch.compile(layer, fullgraph=True, backend="aot_eager")(x)
    torch.testing.assert_close(compiled, eager)
    compiled.square().sum().backward()
    torch.testing.assert_close(x.grad, eager_dx)
    torch.testing.assert_close(layer.weight.grad, eager_dw)


@pytest.mark.gpu
@pytest.mark.parametrize("view", ["row-major", "transposed"])
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("scaling", SCALINGS)
def test_gpu_quantize_kernels_match_torchs_ops_at_full_size(scaling, dtype, view):
    """Random bf16 data (no grid: the GPU's conversions round to nearest) against torch's ops on the GPU
    (what a compiled graph runs; ``quantize`` on a GPU runs the kernels themselves): the same scales and
    the same fp8 values, bit for bit (the kernels divide with correct rounding, as torch does)."""
    x = torch.randn(1000, 4096, device="cuda", dtype=torch.bfloat16) * 3
    x[:, 4000:] *= 1e-3  # (a block of small values: subnormal quotients)
    if view == "transposed":
        x = x.t().contiguous().t()
    q, scale = quantize_kernels(x, dtype, scaling)
    q_ref, scale_ref = float8.quantize_torch(x, dtype, scaling)
    assert q.is_contiguous() and scale.stride() == scale_ref.stride()
    assert torch.equal(scale, scale_ref)
    differ = q.view(torch.uint8) != q_ref.view(torch.uint8)
    assert not differ.any(), f"{int(differ.sum())} of {differ.numel()} fp8 values differ"


@pytest.mark.gpu
def test_gpu_blockwise_layer_at_full_size_matches_float64_of_the_fp8_operands():
    torch.manual_seed(5)
    m, k, n = 1024, 4096, 4096
    layer = tnn.convert(
        torch.nn.Linear(k, n, device="cuda", dtype=torch.bfloat16), precision="fp8", recipe="blockwise"
    )
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    y = layer(x)
    assert y.dtype == torch.bfloat16
    g = torch.randn_like(y)
    y.backward(g)
    w, bias = layer.weight.detach(), layer.bias.detach()
    ry, rdx, rdw = reference(x.detach(), w, bias, g)
    # bf16 outputs: each rounded by at most 2^-8 of itself, plus the tensor cores' partial sums.
    tol = 2.0**-8 + fp32_tolerance(x.device)
    assert relative_error(y.detach(), ry) <= tol
    assert relative_error(x.grad, rdx) <= tol
    assert relative_error(layer.weight.grad, rdw) <= tol
