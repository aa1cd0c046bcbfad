"""Fused epilogues: activation(alpha * A @ B + beta * bias) + residual in one kernel.

Forward and backward against torch in float64 for every activation, with and
without bias and residual, on every kernel path (pointer, split-K, Stream-K,
TMA); broadcasting of bias and residual; the custom op that torch.compile and
torch.export see; CUDA graph capture on the GPU.
"""

import pytest
import torch
import torch.nn.functional as F

import tritongemm
from tritongemm import TileConfig
from tritongemm.testing import assert_close, assert_matches_reference, random_tensor

ACTIVATIONS = {
    "relu": F.relu,
    "gelu": F.gelu,
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "silu": F.silu,
}

PATHS = {
    "pointer": dict(config=TileConfig(16, 32, 16, 8, 4, 2)),
    "split_k": dict(config=TileConfig(16, 32, 16, 8, 4, 2, split_k=3)),
    "split_k_inline": dict(config=TileConfig(16, 32, 16, 8, 4, 2, split_k=3, split_k_inline=True)),
    "stream_k": dict(config=TileConfig(16, 16, 16, 8, 4, 2), decomposition="stream_k"),
    "tma": dict(config=TileConfig(32, 32, 16, 2, 4, 3, kernel="tma_persistent")),
}


def torch_linear(x, w, b=None, *, activation="none", residual=None):
    y = F.linear(x, w, b)
    if activation != "none":
        y = ACTIVATIONS[activation](y)
    return y + residual if residual is not None else y


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_linear_activation_forward_backward(device, activation, path):
    dtype = torch.float16 if path == "tma" else torch.float32
    x = random_tensor((3, 10, 48), dtype, device).requires_grad_()
    w = random_tensor((40, 48), dtype, device).requires_grad_()
    b = random_tensor((40,), dtype, device).requires_grad_()
    r = random_tensor((3, 10, 40), dtype, device).requires_grad_()
    assert_matches_reference(
        lambda *t, **kw: tritongemm.linear(*t, **kw, **PATHS[path]),
        torch_linear,
        x,
        w,
        b,
        activation=activation,
        residual=r,
    )


# The full Jacobian costs two launches per input element (about 9 s per activation on the
# interpreter): the default run checks a random projection of it (gradcheck's fast mode: a
# wrong entry still fails), `make test-slow` the whole Jacobian.
@pytest.mark.parametrize(
    "fast_mode", [True, pytest.param(False, marks=pytest.mark.slow)], ids=["projected", "full"]
)
@pytest.mark.parametrize("activation", ["none", *ACTIVATIONS])
def test_gradcheck_fused_linear(device, activation, fast_mode):
    x = torch.randn(5, 7, dtype=torch.float64, device=device, requires_grad=True)
    w = torch.randn(6, 7, dtype=torch.float64, device=device, requires_grad=True)
    b = torch.randn(6, dtype=torch.float64, device=device, requires_grad=True)
    r = torch.randn(5, 6, dtype=torch.float64, device=device, requires_grad=True)
    assert torch.autograd.gradcheck(
        lambda *t: tritongemm.linear(t[0], t[1], t[2], activation=activation, residual=t[3]),
        (x, w, b, r),
        fast_mode=fast_mode,
    )


@pytest.mark.parametrize(
    "bias_shape, residual_shape",
    [((24,), (24,)), ((12, 1), (12, 24)), ((1, 24), (1, 24)), ((2, 12, 24), (12, 1))],
    ids=["col-bias+row-residual", "row-bias+full-residual", "1xN+1xN", "batched-bias+col-residual"],
)
def test_matmul_bias_and_residual_broadcast(device, bias_shape, residual_shape):
    a = random_tensor((2, 12, 20), torch.float32, device)
    b = random_tensor((20, 24), torch.float32, device)
    bias = random_tensor(bias_shape, torch.float32, device)
    res = random_tensor(residual_shape, torch.float32, device)
    out = tritongemm.matmul(a, b, bias=bias, activation="silu", residual=res)
    ref = F.silu(a.double() @ b.double() + bias.double()) + res.double()
    assert_close(out, ref)


def test_out_dtype_cast_with_epilogue(device):
    x = random_tensor((9, 32), torch.float16, device)
    w = random_tensor((16, 32), torch.float16, device)
    b = random_tensor((16,), torch.float16, device)
    out = tritongemm.linear(x, w, b, activation="relu", out_dtype=torch.float32)
    assert out.dtype == torch.float32
    assert_close(out, F.relu(F.linear(x.double(), w.double(), b.double())), dtype=torch.float32, tol=2e-3)


def test_bad_activation_and_shapes(device):
    x, w = random_tensor((3, 4), torch.float32, device), random_tensor((5, 4), torch.float32, device)
    with pytest.raises(ValueError, match="unknown activation 'tanh'"):
        tritongemm.linear(x, w, activation="tanh")
    with pytest.raises(RuntimeError, match=r"residual of shape \(7,\) cannot be broadcast"):
        tritongemm.linear(x, w, residual=random_tensor((7,), torch.float32, device))
    with pytest.raises(ValueError, match="unknown activation"):
        tritongemm.nn.Linear(4, 5, activation="swish")


def test_nn_linear_with_activation_matches_torch(device):
    layer = tritongemm.nn.Linear(16, 24, activation="gelu_tanh", device=device)
    x = random_tensor((5, 16), torch.float32, device)
    ref = F.gelu(F.linear(x.double(), layer.weight.double(), layer.bias.double()), approximate="tanh")
    assert_close(layer(x), ref)
    assert "activation='gelu_tanh'" in repr(layer)


def test_custom_op_opcheck(device):
    """torch.library's own checks: schema, fake (meta) kernel, autograd registration."""
    a = random_tensor((6, 8), torch.float32, device).requires_grad_()
    b = random_tensor((8, 5), torch.float32, device).requires_grad_()
    bias = random_tensor((5,), torch.float32, device).requires_grad_()
    args = (a, b, bias.expand(6, 5), None, 1.0, 1.0, "gelu", None, None, None, None)
    torch.library.opcheck(torch.ops.tritongemm.gemm.default, args)
    # the opaque op a compiled graph calls (nothing differentiates it; its defaults may be left out)
    plain = tuple(t.detach() if isinstance(t, torch.Tensor) else t for t in args)
    torch.library.opcheck(torch.ops.tritongemm.gemm_extern.default, plain)


class _MLP(torch.nn.Module):
    def __init__(self, device):
        super().__init__()
        self.up = tritongemm.nn.Linear(32, 64, activation="gelu", device=device)
        self.down = tritongemm.nn.Linear(64, 32, device=device)

    def forward(self, x):
        return self.down(self.up(x)) + x


def test_torch_compile_fullgraph_no_graph_breaks(device):
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    model = _MLP(device)
    x = random_tensor((4, 8, 32), torch.float32, device).requires_grad_()
    eager = model(x)
    # aot_eager traces forward and backward through the custom op without
    # needing a C++/Triton codegen toolchain, so it runs on the CPU interpreter.
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    out = compiled(x)
    assert not counters["graph_break"], dict(counters["graph_break"])
    # (on a GPU the traced GEMM may be the stock aten op where tritongemm has no edge: close, not equal)
    assert_close(out, eager.double())
    (g_eager,) = torch.autograd.grad(eager.sum(), x)
    (g_comp,) = torch.autograd.grad(out.sum(), x)
    assert_close(g_comp, g_eager.double())


def test_torch_export(device):
    model = _MLP(device)
    x = random_tensor((4, 8, 32), torch.float32, device)
    exported = torch.export.export(model, (x,))
    targets = [str(n.target) for n in exported.graph.nodes if n.op == "call_function"]
    assert sum("tritongemm.gemm" in t for t in targets) == 2, targets
    assert_close(exported.module()(x), model(x).double())


def test_convert_traces_under_compile(device):
    """nn.convert + torch.compile: a converted plain nn.Linear model traces without graph breaks."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU()).to(device)
    x = random_tensor((3, 16), torch.float32, device)
    tritongemm.nn.convert(model)
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    assert_close(compiled(x), model(x).double())
    assert not counters["graph_break"]


@pytest.mark.gpu
def test_cuda_graph_capture_and_replay(device):
    model = _MLP(device).half()
    x = random_tensor((64, 32), torch.float16, device)
    with torch.no_grad():
        model(x)  # plans and compiled kernels are made before capture
        graph = torch.cuda.CUDAGraph()
        static_x = x.clone()
        with torch.cuda.graph(graph):
            static_out = model(static_x)
        new_x = random_tensor((64, 32), torch.float16, device)
        static_x.copy_(new_x)
        graph.replay()
        torch.cuda.synchronize()
        assert_close(static_out, model(new_x).double())


@pytest.mark.gpu
def test_torch_compile_inductor_on_gpu(device):
    torch._dynamo.reset()
    model = _MLP(device).half()
    x = random_tensor((64, 32), torch.float16, device)
    compiled = torch.compile(model, fullgraph=True)
    assert_close(compiled(x), model(x).double(), dtype=torch.float16)


def test_patch_routes_into_compiled_graphs(device):
    """Under patch(), torch.compile traces F.linear / torch.matmul into tritongemm's custom op."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    seen = []

    def recording_backend(gm, example_inputs):
        seen.extend(str(n.target) for n in gm.graph.nodes if n.op == "call_function")
        return gm.forward

    model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU()).to(device)
    x = random_tensor((3, 16), torch.float32, device)
    with tritongemm.patch():
        out = torch.compile(model, fullgraph=True, backend=recording_backend)(x)
    assert not counters["graph_break"]
    assert any("tritongemm.gemm" in t for t in seen), seen
    assert_close(out, model(x).double())


def test_epilogue_on_host_looped_batches(device):
    """Batch dims that cannot merge are looped on the host: the epilogue tensors must follow each view."""
    a = random_tensor((2, 1, 9, 12), torch.float32, device).requires_grad_()
    b = random_tensor((1, 3, 12, 7), torch.float32, device).requires_grad_()
    bias = random_tensor((7,), torch.float32, device)
    r = random_tensor((2, 3, 9, 7), torch.float32, device).requires_grad_()
    assert_matches_reference(
        lambda x, y, res: tritongemm.matmul(x, y, bias=bias, activation="silu", residual=res),
        lambda x, y, res: F.silu(x @ y + bias.to(x.dtype)) + res,
        a,
        b,
        r,
    )


@pytest.mark.parametrize(
    "fast_mode", [True, pytest.param(False, marks=pytest.mark.slow)], ids=["projected", "full"]
)
def test_double_backward_through_an_activation(device, fast_mode):
    """Under grad the activation is torch's op on the stored pre-activation, so second derivatives
    through it hold; the full Jacobian takes about 15 s on the interpreter, so the default run
    checks a projection."""
    x = torch.randn(4, 6, dtype=torch.float64, device=device, requires_grad=True)
    w = torch.randn(5, 6, dtype=torch.float64, device=device, requires_grad=True)
    assert torch.autograd.gradgradcheck(
        lambda x, w: tritongemm.linear(x, w, activation="gelu"), (x, w), fast_mode=fast_mode
    )


@pytest.mark.parametrize(
    "m, n, k, activation, pingpong",
    [
        (512, 14336, 4096, "gelu", True),  # 448 tiles: ping-pong, no Stream-K
        (1000, 14336, 4096, "silu", True),
        (1000, 14336, 4096, "gelu_tanh", True),
        (512, 14336, 4096, None, False),  # no activation: the heuristic's tile (with Stream-K)
        (512, 14336, 4096, "relu", False),  # nothing worth hiding
        (512, 4096, 14336, "gelu", False),  # 128 tiles, under two waves: one consumer
        (2048, 14336, 4096, "gelu", False),  # 128x256 on two cooperating warpgroups: untouched
    ],
)
def test_transcendental_epilogue_takes_pingpong_consumers(m, n, k, activation, pingpong):
    """heuristics/epilogue.py: a fused GELU, tanh-GELU or SiLU moves the one-consumer 128x128 tile to two
    ping-pong consumers where the tiles fill two waves; everything else keeps the heuristic's plan."""
    x = torch.empty(m, k, dtype=torch.bfloat16, device="meta")
    w = torch.empty(n, k, dtype=torch.bfloat16, device="meta")
    b = torch.empty(n, dtype=torch.bfloat16, device="meta")
    fused = tritongemm.explain(x, w.t(), bias=b, activation=activation, device="h100")
    plain = tritongemm.explain(x, w.t(), bias=b, device="h100")
    if pingpong:
        cfg = fused.config
        assert (cfg.kernel, cfg.block_m, cfg.block_n, cfg.num_warps, cfg.num_stages) == (
            "gluon_ws",
            128,
            128,
            4,
            5,
        )
        assert cfg.pingpong and not cfg.stream_k and "ping-pong" in fused.source
        assert not plain.config.pingpong
    else:
        assert fused.config == plain.config


@pytest.mark.parametrize(
    "m, n, k, pingpong",
    [
        (8192, 3072, 768, True),  # BERT's fc1 without its activation: short K, 1536 tiles
        (8192, 768, 768, True),  # its attention output
        (8192, 4096, 1024, True),
        (8192, 768, 3072, False),  # its fc2: K = 3072 is not short
        (512, 3072, 768, False),  # 96 tiles, under two waves
    ],
)
def test_short_k_takes_pingpong_consumers_without_an_activation(m, n, k, pingpong):
    """heuristics/epilogue.py: at K <= 1024 even a plain store is a large share of a tile, and two
    ping-pong consumers hide it where the 128x128 tiles fill two waves."""
    x = torch.empty(m, k, dtype=torch.bfloat16, device="meta")
    w = torch.empty(n, k, dtype=torch.bfloat16, device="meta")
    plan = tritongemm.explain(x, w.t(), device="h100")
    assert plan.config.pingpong == pingpong, plan.describe()
    if pingpong:
        assert plan.kernel == "gluon_ws" and "a short K (" in plan.source
        fp8 = tritongemm.explain(x.to(torch.float8_e4m3fn), w.t().to(torch.float8_e4m3fn), device="h100")
        assert "a short K (" not in fp8.source  # (measured on bf16 only)
        # A weight gradient over K tokens (dY.T @ X, TN) keeps the one consumer: it measured slower so.
        dy = torch.empty(k, m, dtype=torch.bfloat16, device="meta")
        xs = torch.empty(k, n, dtype=torch.bfloat16, device="meta")
        assert "a short K (" not in tritongemm.explain(dy.t(), xs, device="h100").source


def _gelu_over_range(device, dtype, **kw):
    """GELU fused after a GEMM whose products are exactly the values of a grid on [-8, 8]: (the
    grid in rows of 16) @ the 16 x 16 identity, each output one grid value, so the epilogue alone errs."""
    z = torch.linspace(-8, 8, 4001, dtype=torch.float64).to(dtype).unique()
    z = torch.cat([z, z[: -z.numel() % 16]]) if z.numel() % 16 else z  # (whole rows; repeats are harmless)
    eye = torch.eye(16, dtype=dtype, device=device)
    out = tritongemm.matmul(z.view(-1, 16).to(device), eye, activation="gelu", **kw).flatten().cpu().double()
    return z.double(), out


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_gelu_epilogue_rounds_as_the_exact_gelu(device, dtype):
    # 16-bit outputs take the cheap fit of Phi (``kernels.activations.gelu_16``): within 1.6e-6 of the exact
    # GELU before rounding; fp32 outputs keep the fp32-accurate erfc fit.
    z, out = _gelu_over_range(device, dtype, config=TileConfig(16, 16, 16, 8, 4, 2))
    exact = z * 0.5 * torch.erfc(-z / 2**0.5)
    if dtype == torch.float32:
        torch.testing.assert_close(out, exact, rtol=1e-6, atol=1e-7)
        return
    ulp = (exact.abs().to(dtype).double() * torch.finfo(dtype).eps).clamp_min(torch.finfo(dtype).tiny)
    # The rounding of a value within 2e-6 of the exact one; Triton's interpreter casts fp32 to bf16 by
    # truncation (5.7187495 becomes 5.6875), a whole ulp, where the GPU rounds to nearest.
    truncates = dtype == torch.bfloat16 and device.type == "cpu"
    bound = ulp * (1.0 if truncates else 0.5) + 2e-6
    worst = ((out - exact).abs() - bound).max().item()
    assert worst <= 0, f"GELU off by {worst:.3g} beyond rounding"


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_gelu_epilogue_rounds_as_the_exact_gelu_on_the_warp_specialized_kernel(device, dtype):
    cfg = TileConfig(128, 128, 64, 8, 4, 5, kernel="gluon_ws", pingpong=True)
    z, out = _gelu_over_range(device, dtype, config=cfg)
    exact = z * 0.5 * torch.erfc(-z / 2**0.5)
    ulp = (exact.abs().to(dtype).double() * torch.finfo(dtype).eps).clamp_min(torch.finfo(dtype).tiny)
    assert ((out - exact).abs() - (ulp * 0.5 + 2e-6)).max().item() <= 0
