"""The two-layer MLP whose backward runs the activation's derivative in a GEMM epilogue: the derivative
epilogue itself, ``tritongemm.mlp``, and the MLPs ``nn.convert`` chains (head computes, tail hands on)."""

import copy

import pytest
import torch

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


@pytest.mark.parametrize("activation", ACTS)
@pytest.mark.parametrize(
    "dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64], ids=DTYPE_IDS.get
)
@pytest.mark.parametrize("layout", ["NN", "NT", "TN"])
def test_derivative_epilogue_multiplies_by_the_activations_slope(activation, dtype, layout, device):
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


@pytest.mark.parametrize("activation", ACTS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=DTYPE_IDS.get)
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no-bias"])
def test_mlp_forward_and_every_gradient(activation, dtype, bias, device, fused_calls):
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


# -- MLPs nn.convert chains ----------------------------------------------------------------------------


class Mlp(torch.nn.Module):
    """timm's ``Mlp``: a dropout and a norm between the activation and the second layer."""

    def __init__(self, drop=0.0, act=torch.nn.GELU):
        super().__init__()
        self.fc1 = torch.nn.Linear(16, 40)
        self.act = act()
        self.drop1 = torch.nn.Dropout(drop)
        self.norm = torch.nn.Identity()
        self.fc2 = torch.nn.Linear(40, 16)
        self.drop2 = torch.nn.Dropout(drop)

    def forward(self, x):
        x = self.fc1(x)
        x = self.act(x)
        x = self.drop1(x)
        x = self.norm(x)
        x = self.fc2(x)
        x = self.drop2(x)
        return x


class ReadsHidden(torch.nn.Module):
    """The hidden activation is read twice: no MLP to chain (the activation is still fused)."""

    def __init__(self):
        super().__init__()
        self.fc1, self.act, self.fc2 = torch.nn.Linear(16, 40), torch.nn.ReLU(), torch.nn.Linear(40, 16)

    def forward(self, x):
        h = self.act(self.fc1(x))
        return self.fc2(h) + h[..., :16]


def _models():
    return torch.nn.ModuleDict(
        {
            "seq": torch.nn.Sequential(
                torch.nn.Linear(16, 40),
                torch.nn.SiLU(),
                torch.nn.Linear(40, 24),
                torch.nn.ReLU(),
                torch.nn.Linear(24, 16),
            ),
            "timm": Mlp(),
            "reads": ReadsHidden(),
        }
    )


def _train_step(model, x):
    y = model(x)
    y.square().sum().backward()
    return y


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=DTYPE_IDS.get)
def test_convert_chains_mlps_and_their_training_matches_stock(dtype, device, fused_calls):
    stock = _models().to(device)
    models = tritongemm.nn.convert(copy.deepcopy(stock).to(dtype))
    keys = list(stock.state_dict())
    assert list(models.state_dict()) == keys
    seq, timm, reads = models["seq"], models["timm"], models["reads"]
    # seq: 0 -> SiLU -> 2 -> ReLU -> 4: the second activation's Linear is an MLP head, the first's is not
    # (its next layer carries an activation of its own).
    assert seq[2].mlp_next is seq[4] and seq[4].mlp_prev == "2" and seq[0].mlp_next is None
    assert timm.fc1.mlp_next is timm.fc2 and timm.fc1.mlp_through == (timm.drop1, timm.norm)
    assert reads.fc1.activation == "relu" and reads.fc1.mlp_next is None
    assert "MLP head (fc2 computed here)" in repr(timm.fc1) and "MLP tail (computed by fc1)" in repr(timm.fc2)
    summary = tritongemm.nn.fusion_summary(models)
    assert (
        "timm.fc1: gelu fused into its epilogue, its gradient into fc2's backward GEMM (one MLP)" in summary
    )
    x = random_tensor((2, 5, 16), dtype, device)
    for name, model in models.items():
        y = _train_step(model, x)
        ref = _train_step(stock[name].double(), x.double())
        tol = 4 * tolerance(dtype, device)
        assert_close(y, ref, tol=tol, what=name)
        for (pname, p), q in zip(model.named_parameters(), stock[name].parameters()):
            assert_close(p.grad, q.grad, tol=4 * tol, what=f"{name}: grad of {pname}")
    assert fused_calls == ["relu", "gelu"]  # seq's chained MLP, then timm's
    with torch.no_grad():
        assert_close(models["timm"](x), stock["timm"](x.double()), tol=4 * tolerance(dtype, device))
    assert fused_calls == ["relu", "gelu"]  # nothing to differentiate: the layers one by one


def test_a_dropout_that_drops_or_a_hook_on_the_tail_unchains_the_mlp(device, fused_calls):
    model = tritongemm.nn.convert(Mlp(drop=0.5).to(device))
    assert model.fc1.mlp_next is model.fc2  # chained, but checked at each call
    x = random_tensor((4, 16), torch.float32, device)
    model.train()
    torch.manual_seed(0)
    y = _train_step(model, x)
    assert fused_calls == [] and model.fc1.weight.grad is not None
    assert model.fc2.__dict__.get("mlp_handed") is None
    model.eval()  # dropout passes values on in eval mode: fused again
    _train_step(model, x)
    assert fused_calls == ["gelu"]
    seen = []
    model.fc2.register_forward_hook(lambda m, i, o: seen.append(o.shape))
    y = _train_step(model, x)
    assert fused_calls == ["gelu"] and seen == [y.shape]
    stock = Mlp(drop=0.5).to(device).eval()
    stock.load_state_dict(model.state_dict())
    assert_close(y, stock.double()(x.double()), tol=4 * tolerance(torch.float32, device))


def test_convert_leaves_a_shared_or_hooked_second_layer_unchained(device):
    shared = torch.nn.Linear(40, 16)
    model = torch.nn.ModuleDict(
        {
            "a": torch.nn.Sequential(torch.nn.Linear(16, 40), torch.nn.GELU(), shared),
            "b": torch.nn.Sequential(shared),
        }
    )
    hooked = Mlp()
    hooked.fc2.register_forward_pre_hook(lambda m, i: None)
    tritongemm.nn.convert(model)
    tritongemm.nn.convert(hooked)
    assert model["a"][0].activation == "gelu" and model["a"][0].mlp_next is None
    assert hooked.fc1.activation == "gelu" and hooked.fc1.mlp_next is None


def test_a_chained_mlp_saves_loads_and_deep_copies(device, fused_calls):
    model = tritongemm.nn.convert(Mlp().to(device))
    twin = copy.deepcopy(model)
    assert twin.fc1.mlp_next is twin.fc2 and twin.fc1.mlp_through == (twin.drop1, twin.norm)
    fresh = tritongemm.nn.convert(Mlp().to(device))
    fresh.load_state_dict(model.state_dict())
    x = random_tensor((3, 16), torch.float32, device)
    assert_close(_train_step(fresh, x), _train_step(model, x).double(), tol=tolerance(torch.float32, device))
    assert fused_calls == ["gelu", "gelu"]


@pytest.mark.gpu
@pytest.mark.parametrize("rows", [1024, 2048], ids=["under-two-waves", "over-two-waves"])
@pytest.mark.parametrize("activation", ["gelu", "gelu_tanh"])
def test_fused_mlp_backward_on_the_gpu_at_model_width(activation, rows):
    """bf16 above the size threshold: the warp-specialized kernel's derivative epilogue, finished by
    epilogue warps, under and over two waves of tiles (where a forward activation would take ping-pong)."""
    hidden = 1536
    x = random_tensor((rows, hidden), torch.bfloat16, "cuda").requires_grad_()
    w1 = (random_tensor((3072, hidden), torch.bfloat16, "cuda") * 0.05).requires_grad_()
    w2 = (random_tensor((hidden, 3072), torch.bfloat16, "cuda") * 0.05).requires_grad_()
    b1 = random_tensor((3072,), torch.bfloat16, "cuda").requires_grad_()
    b2 = random_tensor((hidden,), torch.bfloat16, "cuda").requires_grad_()
    assert x.numel() * 3072 >= mlp_module.FUSED_MIN_MACS
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
