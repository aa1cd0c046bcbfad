"""fp8 training layers (``tritongemm.frontend.float8``, ``nn.convert(precision="fp8")``): the casts, the three
GEMMs against float64 products of the same fp8 operands, conversion, autocast, compile."""

from __future__ import annotations

import weakref

import pytest
import torch

import tritongemm
from tritongemm.frontend import float8
from tritongemm.frontend import nn as tnn
from tritongemm.frontend.float8 import E4M3, E5M2, FP8_MAX, float8_linear, quantize
from tritongemm.testing import relative_error

RECIPES = ("rowwise", "tensorwise")


def device_for_kernels() -> torch.device:
    return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")


#: fp32 outputs of fp8 products: exact sums on the interpreter; Hopper's tensor cores round the
#: products' partial sums (about 1e-4 relative, as torch._scaled_mm's).
def fp32_tolerance(device: torch.device) -> float:
    return 5e-4 if device.type == "cuda" else 1e-5


@pytest.mark.parametrize("dtype", [E4M3, E5M2], ids=["e4m3", "e5m2"])
@pytest.mark.parametrize("recipe", RECIPES)
def test_quantize_maps_the_amax_to_the_formats_largest_value(recipe, dtype):
    torch.manual_seed(0)
    x = torch.randn(24, 40) * torch.logspace(-3, 3, 24)[:, None]  # rows spanning six decades
    x[5] = 0.0  # an all-zero row
    x8, scale = quantize(x, dtype, recipe)
    assert x8.dtype == dtype and x8.is_contiguous() and x8.shape == x.shape
    assert scale.dtype == torch.float32
    assert scale.shape == ((24, 1) if recipe == "rowwise" else ())
    back = x8.float() * scale
    limit = FP8_MAX[dtype]
    if recipe == "rowwise":
        assert torch.equal(
            x8.float().abs().amax(dim=1)[[i for i in range(24) if i != 5]], torch.full((23,), limit)
        )
        assert scale[5].item() == 1.0 and not x8[5].float().any()
    else:
        assert x8.float().abs().max().item() == limit
    # Each element is its format's nearest value, relative to the row's (tensor's) scale.
    mantissa = 3 if dtype == E4M3 else 2
    big = x.abs() > scale * 2 ** (-6 if dtype == E4M3 else -14) * 4  # (clear of the subnormals)
    rel = ((back - x).abs() / x.abs().clamp_min(1e-30))[big]
    assert rel.max().item() <= 2.0 ** -(mantissa + 1) * 1.0001


def _reference(x, w, bias, g, recipe):
    """float64 products of exactly the fp8 operands the layer multiplies (see float8's table)."""
    q = lambda t, dt: (lambda v, s: v.double() * s.double())(*quantize(t, dt, recipe))  # noqa: E731
    y = q(x, E4M3) @ q(w, E4M3).T + (bias.double() if bias is not None else 0)
    dx = q(g, E5M2) @ q(w.t(), E4M3).T
    dw = q(g.t(), E5M2) @ q(x.t(), E4M3).T
    return y, dx, dw


@pytest.mark.parametrize("with_bias", [False, True], ids=["no-bias", "bias"])
@pytest.mark.parametrize("recipe", RECIPES)
def test_float8_linear_forward_and_backward_match_float64_of_the_fp8_operands(recipe, with_bias):
    device = device_for_kernels()
    torch.manual_seed(1)
    x = torch.randn(2, 24, 64, device=device, requires_grad=True)  # M = 48 rows, K = 64
    w = (torch.randn(48, 64, device=device) * 0.1).requires_grad_()
    bias = torch.randn(48, device=device, requires_grad=True) if with_bias else None
    y = float8_linear(x, w, bias, recipe, torch.float32, fast_accum=False)
    assert y.shape == (2, 24, 48) and y.dtype == torch.float32
    g = torch.randn_like(y)
    y.backward(g)
    ry, rdx, rdw = _reference(x.detach().reshape(48, 64), w.detach(), bias, g.reshape(48, 48), recipe)
    tol = fp32_tolerance(device)
    assert relative_error(y.detach().reshape(48, 48), ry) <= tol
    assert relative_error(x.grad.reshape(48, 64), rdx) <= tol
    assert relative_error(w.grad, rdw) <= tol
    if with_bias:
        torch.testing.assert_close(bias.grad, g.reshape(48, 48).sum(0))
    # ... and fp8 is near the exact layer (e5m2 gradients: a few percent).
    exact = torch.nn.functional.linear(x.detach().double(), w.detach().double())
    assert relative_error(y.detach() - (bias.detach() if with_bias else 0), exact) < 0.05


@pytest.mark.parametrize("recipe", RECIPES)
def test_convert_makes_fp8_layers_where_the_features_are_multiples_of_16(recipe):
    model = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 10))
    tnn.convert(model, precision="fp8", recipe=recipe)
    assert type(model[0]) is tnn.Float8Linear and model[0].recipe == recipe
    assert type(model[2]) is tnn.Linear  # 10 outputs: not a multiple of 16
    assert "precision='fp8'" in repr(model[0])


def test_convert_rejects_unknown_precision_and_recipe():
    with pytest.raises(ValueError, match="precision"):
        tnn.convert(torch.nn.Linear(16, 16), precision="fp4")
    with pytest.raises(ValueError, match="recipe"):
        tnn.convert(torch.nn.Linear(16, 16), precision="fp8", recipe="mxfp8")


def test_fp8_model_trains_and_keeps_parameters_and_grads_in_the_models_dtype():
    device = device_for_kernels()
    torch.manual_seed(2)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 16)).to(device)
    reference = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 16)).to(
        device
    )
    reference.load_state_dict(model.state_dict())
    tnn.convert(model, precision="fp8")
    x = torch.randn(64, 32, device=device)
    target = torch.randn(64, 16, device=device)
    losses = {}
    for name, net in (("fp8", model), ("fp32", reference)):
        opt = torch.optim.SGD(net.parameters(), lr=0.05)
        for _ in range(5):
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(net(x), target)
            loss.backward()
            opt.step()
        losses[name] = loss.item()
        assert all(p.dtype == torch.float32 and p.grad.dtype == torch.float32 for p in net.parameters())
    assert abs(losses["fp8"] - losses["fp32"]) <= 0.05 * losses["fp32"], losses


@pytest.mark.parametrize("recipe", ["rowwise", "blockwise"])
def test_autocast_output_in_autocast_dtype_and_grads_in_the_parameters_dtype(recipe):
    device = device_for_kernels()
    layer = tnn.convert(torch.nn.Linear(32, 48).to(device), precision="fp8", recipe=recipe)
    x = torch.randn(16, 32, device=device, requires_grad=True)
    with torch.autocast(device.type, dtype=torch.bfloat16):
        y = layer(x)
    assert y.dtype == torch.bfloat16
    y.float().sum().backward()
    assert x.grad.dtype == torch.float32 and layer.weight.grad.dtype == torch.float32
    exact = torch.nn.functional.linear(
        x.detach().double(), layer.weight.detach().double(), layer.bias.double()
    )
    assert relative_error(y.detach(), exact) < 0.05


@pytest.mark.slow
def test_fp8_layer_compiles_without_graph_breaks():
    device = device_for_kernels()
    layer = tnn.convert(torch.nn.Linear(32, 48).to(device), precision="fp8")
    x = torch.randn(16, 32, device=device, requires_grad=True)
    eager = layer(x)
    compiled = torch.compile(layer, fullgraph=True, backend="aot_eager")(x)
    torch.testing.assert_close(compiled, eager)
    compiled.sum().backward()
    assert x.grad is not None


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_fp8_layer_raises_linears_error_for_a_wrong_input_width(compiled):
    """The error ``nn.Linear`` raises (type and words, the shapes in them), eager and compiled."""
    device = device_for_kernels()
    linear = torch.nn.Linear(32, 48).to(device)
    layer = tnn.convert(torch.nn.Linear(32, 48).to(device), precision="fp8")
    x = torch.randn(2, 8, 31, device=device)
    with pytest.raises(RuntimeError) as expected:
        linear(x)
    torch._dynamo.reset()
    run = torch.compile(layer, backend="aot_eager", fullgraph=True) if compiled else layer
    with pytest.raises(RuntimeError) as got:
        run(x)
    assert str(expected.value) in str(got.value)


@pytest.mark.gpu
@pytest.mark.parametrize("recipe", RECIPES)
def test_gpu_fp8_layer_runs_the_warp_specialized_kernel(plans, recipe):
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the warp-specialized kernel is sm_90's")
    layer = tnn.convert(
        torch.nn.Linear(256, 512, device="cuda", dtype=torch.bfloat16), precision="fp8", recipe=recipe
    )
    # (512 rows in every GEMM: fewer take the pointer kernel's few-rows tiles, heuristics/fp8.py)
    x = torch.randn(512, 256, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    layer(x).sum().backward()
    assert [p["kernel"] for p in plans] == ["gluon_ws"] * 3, plans
    assert tritongemm.scaled_mm is not None


def _on_the_grid(rows, cols, dtype, recipe, device, seed=5):
    """fp8 numbers of magnitude 1 to the format's largest (each row's maximum that), times a power of two
    per row where the scales are per row: their scaled values need no rounding.  (Triton's interpreter
    rounds some fp32 -> fp8 conversions down a binade; exact values keep the comparison about the
    kernels' indexing, maxima and scales.)"""
    gen = torch.Generator().manual_seed(seed)
    magnitude = 1 + torch.rand(rows, cols, generator=gen) * (FP8_MAX[dtype] - 1)
    sign = torch.randint(0, 2, (rows, cols), generator=gen) * 2 - 1
    v = (magnitude * sign).to(dtype).float()
    v[:, 0] = FP8_MAX[dtype]
    if recipe == "rowwise":
        v = v * 2.0 ** torch.randint(-4, 5, (rows, 1), generator=gen)
    return v.to(device)


DIAGONAL = {(E4M3, "row-major"), (E5M2, "transposed")}


def _cast_cases():
    """Rowwise by one kernel and by two, tensorwise (always two), each format and view; half of each
    in the fast tier, the other half under slow (the interpreter's fp8 conversions are slow)."""
    cases = []
    for recipe, kernels in (("rowwise", "one"), ("rowwise", "two"), ("tensorwise", "two")):
        for dtype, dtype_id in ((E4M3, "e4m3"), (E5M2, "e5m2")):
            for view in ("row-major", "transposed"):
                # (one diagonal of format x view per group, the other one for rowwise's two kernels)
                fast = ((dtype, view) in DIAGONAL) != (recipe == "rowwise" and kernels == "two")
                cases.append(
                    pytest.param(
                        recipe,
                        dtype,
                        view,
                        kernels,
                        id=f"{recipe}-{dtype_id}-{view}-{kernels}",
                        marks=() if fast else pytest.mark.slow,
                    )  # fmt: skip
                )
    return cases


@pytest.mark.parametrize("recipe, dtype, view, kernels", _cast_cases())
def test_quantize_kernels_match_torchs_quantization(recipe, dtype, view, kernels, monkeypatch):
    """Both rowwise paths (one kernel for many row-major rows, maxima then cast otherwise) and the
    tensorwise one give torch's quantization exactly."""
    from tritongemm.frontend import float8
    from tritongemm.frontend.float8 import quantize_kernels

    monkeypatch.setattr(float8, "ROWWISE_WAVES", 0 if kernels == "one" else 10**9)

    device = device_for_kernels()
    rows, cols = 70, 300  # ragged against the kernels' 16-row, 256-column and 64 x 64 blocks
    if device.type == "cuda":
        x = torch.randn(rows, cols, device=device, dtype=torch.bfloat16) * 3
    else:
        x = _on_the_grid(rows, cols, dtype, recipe, device)
    if view == "transposed":
        x = x.t().contiguous().t()  # the same values, column-major
    q, scale = quantize_kernels(x, dtype, recipe)
    q_ref, scale_ref = float8.quantize_torch(x.contiguous(), dtype, recipe)  # (torch's ops, x's device)
    assert q.is_contiguous() and q.dtype == dtype and q.shape == (rows, cols)
    torch.testing.assert_close(scale, scale_ref, rtol=0, atol=0)
    assert torch.equal(q.float(), q_ref.float())


@pytest.mark.parametrize("kernels", ["one", "two"])
def test_quantize_launches_are_kept_and_reused(kernels, monkeypatch):
    """A cast's launches are built once per shape and layout, kept in the plan cache, and the next call
    of that shape runs them again (no JIT dispatch), with the same result."""
    from tritongemm import launch
    from tritongemm.frontend import float8
    from tritongemm.frontend.float8 import quantize_kernels

    monkeypatch.setattr(float8, "ROWWISE_WAVES", 0 if kernels == "one" else 10**9)
    launch.clear_plan_cache()
    device = device_for_kernels()
    x = _on_the_grid(40, 96, E4M3, "rowwise", device)
    first = quantize_kernels(x, E4M3, "rowwise")
    kept = dict(launch.PLANS.launchers)
    assert len(kept) == 1, kept
    again = quantize_kernels(x.clone(), E4M3, "rowwise")
    assert launch.PLANS.launchers == kept
    assert torch.equal(first[0].float(), again[0].float()) and torch.equal(first[1], again[1])
    quantize_kernels(x[:20], E4M3, "rowwise")  # another shape: a launch of its own
    assert len(launch.PLANS.launchers) == 2


def test_inference_reuses_the_fp8_weight_until_the_weight_changes():
    device = device_for_kernels()
    layer = tnn.convert(torch.nn.Linear(32, 48).to(device), precision="fp8")
    x = torch.randn(8, 32, device=device)
    with torch.no_grad():
        first = layer(x)
        cached = layer._weight8.entries[(False, "rowwise")][1][0]
        assert torch.equal(layer(x), first)
        assert layer._weight8.entries[(False, "rowwise")][1][0] is cached  # not quantized again
        layer.weight.mul_(2.0)  # an in-place write: a new version
        second = layer(x)
    assert layer._weight8.entries[(False, "rowwise")][1][0] is not cached
    exact = torch.nn.functional.linear(
        x.double(), layer.weight.detach().double(), layer.bias.detach().double()
    )
    assert relative_error(second, exact) < 0.05
    # With gradients recorded, the weight is quantized on every call (it changes every step).
    layer(x).sum().backward()
    assert layer.weight.grad is not None


@pytest.mark.gpu
@pytest.mark.parametrize("recipe", RECIPES)
def test_gpu_fp8_layer_replays_in_a_cuda_graph(recipe):
    """Nothing in an fp8 layer's forward or backward synchronizes with the host, so a training step
    captures in a CUDA graph and its replays match eager steps on new inputs."""
    torch.manual_seed(3)
    layer = tnn.convert(
        torch.nn.Linear(256, 512, device="cuda", dtype=torch.bfloat16), precision="fp8", recipe=recipe
    )
    static_x = torch.randn(128, 256, device="cuda", dtype=torch.bfloat16, requires_grad=True)

    def step():
        layer.weight.grad = None
        static_x.grad = None
        y = layer(static_x)
        y.float().square().mean().backward()
        return y

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):  # warm-up: compile and remember every launch before capture
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_y = step()
    static_dw = layer.weight.grad  # the gradient buffer the graph writes (eager steps below make others)
    for _ in range(2):
        x = torch.randn(128, 256, device="cuda", dtype=torch.bfloat16)
        with torch.no_grad():
            static_x.copy_(x)
        graph.replay()
        torch.cuda.synchronize()
        graph_y, graph_dw = static_y.clone(), static_dw.clone()
        eager_x = x.clone().requires_grad_()
        layer.weight.grad = None
        eager_y = layer(eager_x)
        eager_y.float().square().mean().backward()
        assert torch.equal(graph_y, eager_y)
        assert torch.equal(graph_dw, layer.weight.grad)


def _counting_quantize(monkeypatch) -> list[tuple[int, ...]]:
    """Record the shape of every matrix ``float8`` casts (weights and activations alike)."""
    shapes: list[tuple[int, ...]] = []
    real = float8.quantize

    def counting(t, dtype, recipe):
        shapes.append(tuple(t.shape))
        return real(t, dtype, recipe)

    monkeypatch.setattr(float8, "quantize", counting)
    float8.recent_casts().clear()
    return shapes


def test_a_tensor_fed_to_several_layers_is_cast_once_forward_and_backward(monkeypatch):
    """q, k and v of one hidden state: one cast of it in the forward, one of its transpose in the
    backward; the outputs and gradients are those of layers given separate copies."""
    device = device_for_kernels()
    torch.manual_seed(4)
    layers = [tnn.convert(torch.nn.Linear(64, 32, bias=False), precision="fp8").to(device) for _ in range(3)]
    x = torch.randn(2, 8, 64, device=device, requires_grad=True)
    shapes = _counting_quantize(monkeypatch)
    ys = [layer(x) for layer in layers]
    assert shapes.count((16, 64)) == 1 and shapes.count((32, 64)) == 3  # x once, each weight once
    sum(y.float().square().sum() for y in ys).backward()
    assert shapes.count((64, 16)) == 1  # x's transpose for the three weight gradients
    # The same numbers as three independent inputs.
    copies = [x.detach().clone().requires_grad_() for _ in layers]
    for layer in layers:
        layer.weight.grad = None
    for layer, xc in zip(layers, copies):
        y = layer(xc)
        assert torch.equal(y, ys[layers.index(layer)])
        y.float().square().sum().backward()
    torch.testing.assert_close(x.grad, sum(c.grad for c in copies), rtol=0, atol=1e-6)


def test_a_cast_is_not_reused_after_an_in_place_write_or_for_another_tensor(monkeypatch):
    device = device_for_kernels()
    torch.manual_seed(5)
    layer = tnn.convert(torch.nn.Linear(64, 32, bias=False), precision="fp8").to(device)
    x = torch.randn(16, 64, device=device)
    shapes = _counting_quantize(monkeypatch)
    with torch.no_grad():
        first = layer(x)
        assert torch.equal(layer(x), first) and shapes.count((16, 64)) == 1
        x.mul_(-2.0)  # in place: the cast is stale
        second = layer(x)
        assert shapes.count((16, 64)) == 2
        exact = torch.nn.functional.linear(x.double(), layer.weight.double())
        assert relative_error(second, exact) < 0.05
        ref = weakref.ref(x)
        del x
        assert ref() is None  # the cache keeps no activation alive
        assert not float8.recent_casts().entries  # nor the copy of one freed
        y = torch.randn(16, 64, device=device)  # may reuse the freed memory: still cast afresh
        layer(y)
        assert shapes.count((16, 64)) == 3
    assert len(float8.recent_casts().entries) <= float8.recent_casts().size


def test_forward_gemm_sums_fast_and_the_gradient_gemms_precisely(monkeypatch):
    """torchao's split: ``use_fast_accum`` on the forward GEMM, precise sums for the two gradient
    GEMMs; ``fast_accum=False`` (the layer's attribute, or ``convert``'s) makes the forward precise."""
    modes: list[bool] = []
    real = float8.scaled_mm

    def recording(*args, **kwargs):
        modes.append(kwargs.get("use_fast_accum", False))
        return real(*args, **kwargs)

    monkeypatch.setattr(float8, "scaled_mm", recording)
    device = device_for_kernels()
    layer = tnn.convert(torch.nn.Linear(32, 48), precision="fp8").to(device)
    x = torch.randn(8, 32, device=device, requires_grad=True)
    layer(x).sum().backward()
    assert layer.fast_accum is True and modes == [True, False, False]
    modes.clear()
    precise = tnn.convert(torch.nn.Linear(32, 48), precision="fp8", fast_accum=False).to(device)
    assert precise.fast_accum is False and "fast_accum=False" in repr(precise)
    precise(x).sum().backward()
    assert modes == [False, False, False]
    with pytest.raises(TypeError, match="fast_accum"):
        tnn.convert(torch.nn.Linear(32, 48), precision="fp8", fast_accum="yes")


@pytest.mark.parametrize("scaling", ["rowwise", "tensorwise", "1x128", "128x128"])
def test_nan_and_inf_inputs_come_out_nan_on_both_paths(scaling):
    """An inf or NaN in a cast's input is not made finite.  A NaN makes its row's (block's, tensor's)
    scale NaN and an inf makes it inf (finite values then cast to 0, the inf to NaN), on torch's ops and
    in the kernels alike (their maxima and clamp keep NaN), and a layer fed either gives a non-finite
    output in that row.  (Triton's interpreter casts NaN to a finite fp8 value: the kernels' fp8 values
    are compared on a GPU only.)"""
    from tritongemm.frontend.float8 import quantize_kernels, quantize_torch

    device = device_for_kernels()
    x = _on_the_grid(6, 256, E4M3, "tensorwise", device) / 4
    x[0, 3] = float("inf")
    x[1, 200] = float("nan")
    x[4, 7] = -float("inf")
    q, scale = quantize_kernels(x, E4M3, scaling)
    q_ref, scale_ref = quantize_torch(x, E4M3, scaling)
    torch.testing.assert_close(scale, scale_ref, rtol=0, atol=0, equal_nan=True)
    assert not scale_ref.isfinite().all()
    nan = q_ref.float().isnan()
    assert nan[0, 3] and nan[1, 200] and nan[4, 7]
    if device.type == "cuda":
        assert torch.equal(q.float().isnan(), nan)
        assert torch.equal(q.float()[~nan], q_ref.float()[~nan])
    recipe = {"rowwise": "rowwise", "tensorwise": "tensorwise", "1x128": "blockwise"}.get(scaling)
    if recipe is not None:  # (the layer whose activations take this scaling)
        layer = torch.nn.Linear(256, 32, device=device)
        tnn.convert(layer, precision="fp8", recipe=recipe)
        y = layer(x)
        for row in (0, 1, 4):
            assert not y[row].isfinite().any(), row
