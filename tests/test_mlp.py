"""The two-layer MLP whose backward runs the activation's derivative in a GEMM epilogue: the derivative
epilogue itself, and ``tritongemm.mlp``."""

import pytest
import torch
from conftest import grid_cases

import tritongemm
import tritongemm.frontend.mlp as mlp_module
from tritongemm import launch
from tritongemm.autograd import mlp as mlp_autograd
from tritongemm.planning.call import Epilogue, GemmCall
from tritongemm.semantics import DERIVATIVE_EPILOGUES, activation_backward
from tritongemm.testing import DTYPE_IDS, assert_close, assert_matches_reference, random_tensor, tolerance

ACTS = list(DERIVATIVE_EPILOGUES)


@pytest.fixture
def fused_calls(monkeypatch):
    """Every size takes the fused backward; the list of (activation) each fused MLP call ran with."""
    monkeypatch.setattr(mlp_module, "FUSED_MIN_MACS", 0)
    calls = []
    real = mlp_autograd.MLPFunction.apply

    def spy(x, b1, bias1, b2, bias2, activation):
        calls.append(activation)
        return real(x, b1, bias1, b2, bias2, activation)

    monkeypatch.setattr(mlp_autograd.MLPFunction, "apply", spy)
    return calls


# -- the derivative epilogue ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "layout, dtype, activation",
    grid_cases(
        {
            "layout": ["NN", "NT", "TN"],
            "dtype": [torch.float32, torch.bfloat16, torch.float16, torch.float64],
            "activation": ACTS,
        },
        keep=lambda layout, dtype, act: (layout + dtype) % 4 == act,  # each activation, dtype and layout
        ids={"dtype": DTYPE_IDS.get},
    ),
)
def test_derivative_epilogue_multiplies_by_the_activations_slope(layout, dtype, activation, device):
    m, n, k = 37, 70, 45  # ragged against every tile
    a = random_tensor((m, k) if layout[0] == "N" else (k, m), dtype, device)
    b = random_tensor((k, n) if layout[1] == "N" else (n, k), dtype, device)
    a, b = (a if layout[0] == "N" else a.mT), (b if layout[1] == "N" else b.mT)
    z = 2 * random_tensor((m, n), dtype, device)
    out = torch.full((m, n), float("nan"), dtype=dtype, device=device)
    call = GemmCall(Epilogue(activation=DERIVATIVE_EPILOGUES[activation], residual=True))
    launch.gemm(call, a, b, out, None, z, None)
    ref = activation_backward(a.double() @ b.double(), z.double(), activation)
    scale = activation_backward(a.double().abs() @ b.double().abs(), z.double(), activation).abs()
    assert_close(out, ref, scale=scale + ref.abs().max() * 1e-3, tol=2 * tolerance(dtype, device))


def test_relu_derivative_selects_as_threshold_backward(device):
    """0 where z <= 0 even for an infinite gradient (a product would give NaN), the gradient elsewhere."""
    a = torch.tensor([[1.0], [1.0]], device=device)
    b = torch.tensor([[float("inf"), 2.0, -3.0]], device=device)
    z = torch.tensor([[-1.0, 0.0, 5.0], [0.5, -0.0, -2.0]], device=device)
    out = torch.empty(2, 3, device=device)
    launch.gemm(GemmCall(Epilogue(activation="relu_grad", residual=True)), a, b, out, None, z, None)
    expected = torch.ops.aten.threshold_backward(a @ b, z, 0)
    assert torch.equal(out, expected), (out, expected)


def test_derivative_epilogues_are_finished_by_epilogue_warps_on_one_consumer():
    from tritongemm.launch.gluon import epilogue_warps
    from tritongemm.planning.configs import TileConfig
    from tritongemm.planning.heuristics.epilogue import epilogue_config
    from tritongemm.planning.problem import GemmProblem

    cfg = TileConfig(128, 128, 64, 8, 4, 6, kernel="gluon_ws")
    problem = GemmProblem(8192, 4096, 1024, dtype="bf16", layout="NN")
    h100 = tritongemm.KNOWN_DEVICES["h100"]
    for activation in DERIVATIVE_EPILOGUES.values():
        call = GemmCall(Epilogue(activation=activation, residual=True))
        assert epilogue_warps(call, cfg) == 8, activation
        assert epilogue_config(cfg, problem, h100, activation) == (cfg, None)  # no ping-pong
    assert epilogue_config(cfg, problem, h100, "gelu")[0].pingpong


# -- tritongemm.mlp ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "bias, dtype, activation",
    grid_cases(
        {"bias": [True, False], "dtype": [torch.float32, torch.bfloat16], "activation": ACTS},
        keep=lambda bias, dtype, act: (bias + dtype) % 2 == act % 2,  # each activation, dtype and bias
        ids={"bias": lambda b: "bias" if b else "no-bias", "dtype": DTYPE_IDS.get},
    ),
)
def test_mlp_forward_and_every_gradient(bias, dtype, activation, device, fused_calls):
    x = random_tensor((3, 11, 24), dtype, device).requires_grad_()
    w1 = random_tensor((40, 24), dtype, device).requires_grad_()
    w2 = random_tensor((17, 40), dtype, device).requires_grad_()
    b1 = random_tensor((40,), dtype, device).requires_grad_() if bias else None
    b2 = random_tensor((17,), dtype, device).requires_grad_() if bias else None

    def theirs(x, w1, b1, w2, b2, activation):
        return mlp_module.torch_mlp(x, w1, b1, w2, b2, activation)

    def ours(x, w1, b1, w2, b2, activation):
        return tritongemm.mlp(x, w1, b1, w2, b2, activation=activation)

    assert_matches_reference(ours, theirs, x, w1, b1, w2, b2, activation)
    assert fused_calls and set(fused_calls) == {activation}


def test_mlp_computes_only_the_gradients_asked_for(device, fused_calls):
    x = random_tensor((9, 16), torch.float32, device)
    w1 = random_tensor((24, 16), torch.float32, device)
    w2 = random_tensor((8, 24), torch.float32, device).requires_grad_()
    b2 = random_tensor((8,), torch.float32, device).requires_grad_()
    tritongemm.mlp(x, w1, None, w2, b2).sum().backward()
    assert fused_calls == ["gelu"] and x.grad is None and w1.grad is None
    h = torch.nn.functional.gelu(x.double() @ w1.double().mT)
    assert_close(w2.grad, torch.ones(9, 8, dtype=torch.float64, device=device).mT @ h)
    assert_close(b2.grad, torch.full((8,), 9.0, dtype=torch.float64, device=device))


def test_mlp_without_a_gradient_runs_two_linears(device, fused_calls, plans):
    x, w1, w2 = (random_tensor(s, torch.float32, device) for s in ((5, 16), (24, 16), (8, 24)))
    with torch.no_grad():
        y = tritongemm.mlp(x, w1, None, w2, None, activation="silu")
    assert fused_calls == []
    assert_close(y, mlp_module.torch_mlp(x.double(), w1.double(), None, w2.double(), None, "silu"))


def test_small_mlp_calls_take_the_linears(device, monkeypatch, fused_calls):
    monkeypatch.setattr(mlp_module, "FUSED_MIN_MACS", 5 * 24 * 16 + 1)  # one multiply-add short
    x = random_tensor((5, 16), torch.float32, device).requires_grad_()
    w1, w2 = random_tensor((24, 16), torch.float32, device), random_tensor((8, 24), torch.float32, device)
    tritongemm.mlp(x, w1, None, w2, None).sum().backward()
    assert fused_calls == [] and x.grad is not None


def test_mlp_errors_match_torch(device):
    x, w1, w2 = (random_tensor(s, torch.float32, device) for s in ((5, 16), (24, 16), (8, 24)))
    with pytest.raises(RuntimeError, match=r"input of shape \(5, 16\) and w1 of shape \(24, 15\)"):
        tritongemm.mlp(x, w1[:, :15], None, w2)
    with pytest.raises(RuntimeError, match=r"w1 of shape \(24, 16\) and w2 of shape \(8, 23\)"):
        tritongemm.mlp(x, w1, None, w2[:, :23])
    with pytest.raises(RuntimeError, match=r"b1 of shape \(23,\) must be \(24,\)"):
        tritongemm.mlp(x, w1, w1[0, :1].expand(23), w2)
    with pytest.raises(ValueError, match="unknown activation 'tanh'"):
        tritongemm.mlp(x, w1, None, w2, activation="tanh")
    with pytest.raises(TypeError, match="argument 'w2' must be Tensor"):
        tritongemm.mlp(x, w1, None, w2.tolist())


def test_mlp_double_backward_is_refused(device, fused_calls):
    x = random_tensor((5, 16), torch.float32, device).requires_grad_()
    w1, w2 = random_tensor((24, 16), torch.float32, device), random_tensor((8, 24), torch.float32, device)
    y = tritongemm.mlp(x, w1, None, w2, None)
    with pytest.raises(RuntimeError, match="double backward"):
        torch.autograd.grad(y.sum(), x, create_graph=True)


@pytest.mark.gpu
@pytest.mark.parametrize("rows", [1024, 2048], ids=["under-two-waves", "over-two-waves"])
@pytest.mark.parametrize("activation", ["gelu", "gelu_tanh"])
def test_fused_mlp_backward_on_the_gpu_at_model_width(activation, rows, fused_calls):
    """bf16, the fused backward taken: the warp-specialized kernel's derivative epilogue, finished by
    epilogue warps, under and over two waves of tiles (where a forward activation would take ping-pong)."""
    hidden = 1536
    x = random_tensor((rows, hidden), torch.bfloat16, "cuda").requires_grad_()
    w1 = (random_tensor((3072, hidden), torch.bfloat16, "cuda") * 0.05).requires_grad_()
    w2 = (random_tensor((hidden, 3072), torch.bfloat16, "cuda") * 0.05).requires_grad_()
    b1 = random_tensor((3072,), torch.bfloat16, "cuda").requires_grad_()
    b2 = random_tensor((hidden,), torch.bfloat16, "cuda").requires_grad_()
    call = GemmCall(Epilogue(activation=DERIVATIVE_EPILOGUES[activation], residual=True))
    dz = torch.empty(rows, 3072, dtype=torch.bfloat16, device="cuda")
    chosen = launch.plan_for(call, x.detach(), w2.detach(), dz)
    assert chosen.kernel == "gluon_ws" and not chosen.config.pingpong, chosen.describe()
    # (under two waves the heuristic's 128 x 192 tile on 8 warps finishes its own tiles)
    assert launch.gluon.epilogue_warps(call, chosen.config) == (8 if rows == 2048 else 0)
    assert_matches_reference(
        lambda *a: tritongemm.mlp(*a, activation=activation),
        lambda *a: mlp_module.torch_mlp(*a, activation),
        x, w1, b1, w2, b2,
    )  # fmt: skip
    assert fused_calls == [activation]
