"""tritongemm.nn: Linear as a drop-in torch.nn.Linear, and convert() on a small model."""

import copy

import pytest
import torch
import torch.nn.functional as F

import tritongemm
from tritongemm.testing import DTYPE_IDS, assert_close, assert_matches_reference, random_tensor, tolerance


class Block(torch.nn.Module):
    """A little model: nested Linears, one without bias, a non-Linear layer, a shared module."""

    def __init__(self):
        super().__init__()
        self.proj_in = torch.nn.Linear(12, 24)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(24, 20), torch.nn.GELU(), torch.nn.Linear(20, 24, bias=False))
        self.norm = torch.nn.LayerNorm(24)
        self.head = torch.nn.Linear(24, 5)

    def forward(self, x):
        h = self.proj_in(x)
        h = h + self.mlp(h)
        return self.head(self.norm(h))


def _linears(model):
    return [m for m in model.modules() if isinstance(m, torch.nn.Linear)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=DTYPE_IDS.get)
def test_convert_small_model(dtype, device, plans):
    model = Block().to(device=device, dtype=dtype)
    reference = copy.deepcopy(model).double()  # torch, in float64
    keys = list(model.state_dict())
    params = list(model.parameters())
    x = random_tensor((2, 3, 12), dtype, device)
    grad_y = random_tensor((2, 3, 5), dtype, device)

    converted = tritongemm.nn.convert(model)
    assert converted is model
    linears = _linears(model)
    assert len(linears) == 4
    assert all(type(m) is tritongemm.nn.Linear for m in linears)
    assert all(isinstance(m, torch.nn.Linear) for m in linears)
    assert list(model.state_dict()) == keys
    assert all(p is q for p, q in zip(model.parameters(), params)), "parameters must be shared, not copied"

    y = model(x)
    y.backward(grad_y)
    assert len(plans) == 4 * 3 - 1  # forward and both gradients per Linear; none for proj_in's input
    y_ref = reference(x.double())
    y_ref.backward(grad_y.double())
    # Four layers in dtype compound the rounding of one: allow 4x the single-GEMM bound.
    tol = 4 * tolerance(dtype, device)
    assert_close(y, y_ref, tol=tol, what="output")
    for (name, p), p_ref in zip(model.named_parameters(), reference.parameters()):
        assert_close(p.grad, p_ref.grad, tol=tol, what=f"grad of {name}")


def test_convert_shares_parameters_with_the_original_module(device):
    """An optimizer built before convert() keeps training the converted model."""
    model = torch.nn.Sequential(torch.nn.Linear(6, 4), torch.nn.Tanh(), torch.nn.Linear(4, 3)).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    tritongemm.nn.convert(model)
    before = model[0].weight.detach().clone()
    model(random_tensor((5, 6), torch.float32, device)).sum().backward()
    opt.step()
    assert not torch.equal(model[0].weight, before)


def test_convert_bare_linear_and_keeps_mode():
    layer = torch.nn.Linear(3, 2).eval()
    new = tritongemm.nn.convert(layer)
    assert type(new) is tritongemm.nn.Linear and not new.training
    assert new.weight is layer.weight and new.bias is layer.bias
    assert (new.in_features, new.out_features) == (3, 2)
    assert repr(new) == repr(layer)


def test_convert_leaves_subclasses_and_converted_layers_alone():
    class MyLinear(torch.nn.Linear):
        pass

    model = torch.nn.Sequential(MyLinear(3, 3), tritongemm.nn.Linear(3, 3))
    already = model[1]
    tritongemm.nn.convert(model)
    assert type(model[0]) is MyLinear
    assert model[1] is already


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.float64], ids=DTYPE_IDS.get)
def test_linear_module(bias, dtype, device, plans):
    layer = tritongemm.nn.Linear(17, 9, bias=bias, device=device, dtype=dtype)
    x = random_tensor((3, 5, 17), dtype, device).requires_grad_(True)
    params = [layer.weight] + ([layer.bias] if bias else [])

    def module(x, *params):  # the layer reads its own parameters
        return layer(x)

    def reference(x, *params):
        return F.linear(x, *params)

    assert_matches_reference(module, reference, x, *params)
    assert len(plans) == 3  # forward, grad input, grad weight


def test_linear_module_falls_back_and_counts(monkeypatch):
    """Inputs tritongemm cannot run (here: meta tensors) go to torch, counted by reason."""
    monkeypatch.setattr(tritongemm.nn.Linear, "fallbacks", type(tritongemm.nn.Linear.fallbacks)())
    layer = tritongemm.nn.Linear(4, 3, device="meta")
    y = layer(torch.empty(2, 4, device="meta"))
    assert y.shape == (2, 3)
    ((reason, n),) = tritongemm.nn.Linear.fallbacks.items()
    assert n == 1 and "meta" in reason
