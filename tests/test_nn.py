"""tritongemm.nn: Linear as a drop-in torch.nn.Linear, and convert() on a small model."""

import copy
from collections import Counter

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
        self.mlp = torch.nn.Sequential(
            torch.nn.Linear(24, 20), torch.nn.GELU(), torch.nn.Linear(20, 24, bias=False)
        )
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
    assert repr(layer) == "Linear(in_features=3, out_features=2, bias=True)"
    assert repr(new) == "Linear(in_features=3, out_features=2, bias=True, backend=tritongemm)"


def test_a_converted_model_prints_which_layers_are_tritongemm():
    class MyLinear(torch.nn.Linear):
        pass

    model = tritongemm.nn.convert(torch.nn.Sequential(torch.nn.Linear(3, 4), MyLinear(4, 4), torch.nn.ReLU()))
    lines = str(model).splitlines()
    assert lines[1].strip() == "(0): Linear(in_features=3, out_features=4, bias=True, backend=tritongemm)"
    assert lines[2].strip() == "(1): MyLinear(in_features=4, out_features=4, bias=True)"
    fused = tritongemm.nn.Linear(4, 4, bias=False, activation="gelu")
    assert (
        repr(fused)
        == "Linear(in_features=4, out_features=4, bias=False, activation='gelu', backend=tritongemm)"
    )


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


class Tied(torch.nn.Module):
    """One nn.Linear under two names of the model and inside another submodule."""

    def __init__(self):
        super().__init__()
        shared = torch.nn.Linear(6, 6)
        self.first = shared
        self.again = shared
        self.branch = torch.nn.Sequential(shared, torch.nn.Tanh())
        self.out = torch.nn.Linear(6, 4)

    def forward(self, x):
        return self.out(self.branch(self.again(self.first(x))))


def test_convert_keeps_one_module_for_a_shared_linear(device, plans):
    model = Tied().to(device)
    reference = copy.deepcopy(model).double()  # deepcopy keeps the sharing
    calls = []
    model.first.register_forward_hook(lambda m, args, out: calls.append(m))
    n_modules, n_params = len(list(model.modules())), len(list(model.parameters()))

    tritongemm.nn.convert(model)
    assert type(model.first) is tritongemm.nn.Linear
    assert model.first is model.again is model.branch[0], "a shared nn.Linear must stay one module"
    assert type(model.out) is tritongemm.nn.Linear
    assert len(list(model.modules())) == n_modules and len(list(model.parameters())) == n_params

    x = random_tensor((5, 6), torch.float32, device)
    y = model(x)
    assert len(plans) == 4
    assert calls == [model.first] * 3  # the hook fires on each of the three uses, on the one module
    assert_close(y, reference(x.double()), tol=4 * tolerance(torch.float32, device))


def _state_dict_post_hook(module, hook):
    register = getattr(module, "register_state_dict_post_hook", None)  # public since torch 2.5
    return register(hook) if register is not None else module._register_state_dict_hook(hook)


def test_convert_carries_hooks_over(device, plans):
    """Hooks registered on an nn.Linear before convert() keep firing, and their handles keep working."""
    layer = torch.nn.Linear(8, 6, device=device)
    model = torch.nn.Sequential(layer, torch.nn.Tanh())
    calls = []
    layer.register_forward_pre_hook(lambda m, args: (2 * args[0],))  # changes the input
    layer.register_forward_pre_hook(lambda m, args, kwargs: calls.append(("pre", type(m))), with_kwargs=True)
    layer.register_forward_hook(lambda m, args, out: out + 1)  # changes the output
    removed = layer.register_forward_hook(lambda m, args, out: calls.append(("removed", type(m))))
    layer.register_full_backward_pre_hook(lambda m, grad_out: calls.append(("backward_pre", type(m))))
    layer.register_full_backward_hook(lambda m, grad_in, grad_out: calls.append(("backward", type(m))))
    _state_dict_post_hook(layer, lambda m, state, prefix, meta: calls.append(("state_dict", type(m))))
    layer.register_load_state_dict_post_hook(lambda m, keys: calls.append(("load", type(m))))

    tritongemm.nn.convert(model)
    new = model[0]
    assert type(new) is tritongemm.nn.Linear
    removed.remove()  # a handle taken before convert() still removes its hook

    x = random_tensor((3, 8), torch.float32, device).requires_grad_(True)
    grad_y = random_tensor((3, 6), torch.float32, device)
    y = model(x)
    y.backward(grad_y)
    assert len(plans) == 3, "the hooked layer must still run on tritongemm"
    Lin = tritongemm.nn.Linear
    assert calls == [("pre", Lin), ("backward_pre", Lin), ("backward", Lin)]

    xr, wr, br = (t.detach().double().requires_grad_(True) for t in (x, layer.weight, layer.bias))
    ref = torch.tanh(F.linear(2 * xr, wr, br) + 1)
    ref.backward(grad_y.double())
    assert_close(y, ref)
    assert_close(x.grad, xr.grad, what="grad of the input")
    assert_close(new.weight.grad, wr.grad, what="grad of the weight")

    calls.clear()
    model.load_state_dict(model.state_dict())
    assert calls == [("state_dict", Lin), ("load", Lin)]


def test_convert_keeps_the_state_a_user_set():
    layer = torch.nn.Linear(4, 3).eval()
    layer.tag = "encoder.q"
    layer.register_buffer("scale", torch.full((3,), 2.0))
    layer.register_buffer("scratch", torch.zeros(3), persistent=False)
    keys = list(layer.state_dict())
    new = tritongemm.nn.convert(layer)
    assert type(new) is tritongemm.nn.Linear
    assert new.tag == "encoder.q" and not new.training
    assert new.scale is layer.scale and new.scratch is layer.scratch
    assert list(new.state_dict()) == keys == ["weight", "bias", "scale"]
    assert new.fallbacks == {} and new.activation == "none"


def test_convert_leaves_a_linear_whose_forward_was_replaced():
    """A wrapper library's instance-level forward would bypass tritongemm: the layer is left alone, with a warning."""
    layer = torch.nn.Linear(3, 3)
    wrapped = layer.forward
    layer.forward = lambda x: wrapped(x)
    model = torch.nn.Sequential(layer)
    with pytest.warns(UserWarning, match="forward replaced"):
        tritongemm.nn.convert(model)
    assert model[0] is layer


def test_convert_drops_a_stale_module_compile(device, plans):
    """Module.compile() compiled the old module's call (torch's forward): it must not survive convert()."""
    layer = torch.nn.Linear(5, 4, device=device)
    layer.compile(backend="eager")
    with pytest.warns(UserWarning, match="compile"):
        new = tritongemm.nn.convert(layer)
    x = random_tensor((3, 5), torch.float32, device)
    y = new(x)
    assert len(plans) == 1, "the converted module ran torch's forward"
    assert_close(y, F.linear(x.double(), layer.weight.double(), layer.bias.double()))


def test_fallbacks_are_counted_per_module_and_summarized(monkeypatch, device, plans):
    monkeypatch.setattr(tritongemm.nn.Linear, "fallbacks", Counter())
    model = torch.nn.Sequential(
        torch.nn.Linear(4, 3, device="meta"), torch.nn.ReLU(), torch.nn.Linear(3, 2, device="meta")
    )
    model.add_module("served", torch.nn.Linear(4, 3, device=device))
    tritongemm.nn.convert(model)
    model[:3](torch.empty(2, 4, device="meta"))
    model[2](torch.empty(5, 3, device="meta"))
    model.served(random_tensor((2, 4), torch.float32, device))
    assert len(plans) == 1

    ((reason, n),) = model[0].fallbacks.items()
    assert "meta" in reason and n == 1
    assert model[2].fallbacks == {reason: 2}
    assert model.served.fallbacks == {}
    assert tritongemm.nn.Linear.fallbacks == {reason: 3}, "the class-level count sums every instance"
    assert tritongemm.nn.fallback_counts(model) == {"0": {reason: 1}, "2": {reason: 2}}
    summary = tritongemm.nn.fallback_summary(model)
    assert summary.splitlines() == [
        "tritongemm.nn: 3 Linear modules, 2 fell back to torch (3 calls)",
        f"  0: 1 ({reason})",
        f"  2: 2 ({reason})",
    ]


def test_vmap_and_grad_over_a_converted_model_fall_back(device):
    """torch.func wraps tensors (no storage for a kernel): torch computes them, counted, instead of crashing."""
    model = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 3)).to(device)
    reference = copy.deepcopy(model).double()
    tritongemm.nn.convert(model)
    x = random_tensor((4, 2, 6), torch.float32, device)

    y = torch.func.vmap(model)(x)
    assert_close(y, reference(x.double()))
    for layer in (model[0], model[2]):
        ((reason, n),) = layer.fallbacks.items()
        assert n == 1 and "functorch" in reason

    params = dict(model.named_parameters())
    grads = torch.func.grad(lambda p: torch.func.functional_call(model, p, (x[0],)).sum())(params)
    reference(x[0].double()).sum().backward()
    for name, p_ref in reference.named_parameters():
        assert_close(grads[name], p_ref.grad, what=f"grad of {name}")


def test_negated_view_input_is_not_misread(device):
    """z.conj().imag is a lazily negated view: its storage holds +imag, so a kernel reading it would be wrong."""
    layer = tritongemm.nn.Linear(6, 4, device=device)
    z = torch.randn(3, 6, dtype=torch.complex64, device=device)
    x = z.conj().imag
    assert x.is_neg()
    y = layer(x)
    assert_close(y, F.linear(-z.imag.double(), layer.weight.double(), layer.bias.double()))
    ((reason, n),) = layer.fallbacks.items()
    assert "negated" in reason


@pytest.mark.parametrize("weight_dtype", [torch.float32, torch.bfloat16], ids=DTYPE_IDS.get)
def test_linear_under_autocast_is_served_in_the_autocast_dtype(weight_dtype, device, plans):
    """Under autocast torch casts fp32 operands to bf16: mixed fp32/bf16 is a uniform call, served, in bf16."""
    layer = tritongemm.nn.Linear(16, 8, device=device, dtype=weight_dtype)
    x = random_tensor((5, 16), torch.float32 if weight_dtype == torch.bfloat16 else torch.bfloat16, device)
    with torch.autocast(device.type, dtype=torch.bfloat16):
        expected = torch.nn.functional.linear(x, layer.weight, layer.bias)
        y = layer(x)
    assert layer.fallbacks == {}, layer.fallbacks
    assert len(plans) == 1
    assert y.dtype == expected.dtype == torch.bfloat16
    as_cast = [t.to(torch.bfloat16).double() for t in (x, layer.weight, layer.bias)]
    assert_close(y, F.linear(*as_cast))


class Intermediate(torch.nn.Module):
    """transformers' ``BertIntermediate``, as its source has it: the Linear, then the activation."""

    def __init__(self, act=None):
        super().__init__()
        self.dense = torch.nn.Linear(12, 20)
        self.intermediate_act_fn = act if act is not None else torch.nn.GELU()

    def forward(self, hidden_states):
        hidden_states = self.dense(hidden_states)
        hidden_states = self.intermediate_act_fn(hidden_states)
        return hidden_states


class Mlp(torch.nn.Module):
    """timm's ``Mlp``: fc1, act, dropout, norm, fc2; and nested, in a second block."""

    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(12, 20)
        self.act = torch.nn.GELU(approximate="tanh")
        self.drop1 = torch.nn.Dropout(0.0)
        self.norm = torch.nn.Identity()
        self.fc2 = torch.nn.Linear(20, 12)
        self.gate = torch.nn.Linear(12, 12)
        self.relu = torch.nn.ReLU()

    def forward(self, x):
        x = self.fc1(x)
        x = self.act(x)
        x = self.drop1(x)
        x = self.norm(x)
        x = self.fc2(x)
        return x + self.relu(self.gate(x))


class ReadsAgain(torch.nn.Module):
    """Forwards a convert must leave alone: the Linear's output read again, the activation applied
    twice, ``self`` passed on."""

    def __init__(self):
        super().__init__()
        self.a, self.act_a = torch.nn.Linear(12, 12), torch.nn.SiLU()
        self.b, self.act_b = torch.nn.Linear(12, 12), torch.nn.SiLU()
        self.c, self.act_c = torch.nn.Linear(12, 12), torch.nn.SiLU()

    def forward(self, x):
        h = self.a(x)
        y = self.act_a(h)
        y = y + h + self.act_b(self.b(x)) + self.act_b(x)
        return y + getattr(self, "act_c")(self.c(x))  # noqa: B009 (self escaping is the point)


def _activation_models():
    return torch.nn.ModuleDict(
        {
            "bert": Intermediate(),
            "timm": Mlp(),
            "seq": torch.nn.Sequential(torch.nn.Linear(12, 20), torch.nn.SiLU(), torch.nn.Linear(20, 12)),
            "again": ReadsAgain(),
        }
    )


def _run_all(models, x):
    return {name: m(x) for name, m in models.items()}


@pytest.mark.parametrize("train", [False, True], ids=["eval", "train"])
def test_convert_fuses_an_activation_into_the_linear_before_it(train, device, plans):
    models = _activation_models().to(device)
    stock = copy.deepcopy(models).double()
    keys = list(models.state_dict())
    tritongemm.nn.convert(models)
    assert list(models.state_dict()) == keys
    fused, left = tritongemm.nn.fusion_report(models)
    assert fused == {"bert.dense": "gelu", "timm.fc1": "gelu_tanh", "timm.gate": "relu", "seq.0": "silu"}
    assert left == {}
    assert [type(m).__name__ for m in (models.bert.intermediate_act_fn, models.timm.act, models.seq[1])] == [
        "FusedActivation"
    ] * 3
    assert "FusedActivation(gelu, fused into dense)" in repr(models.bert)
    assert models.timm.fc2.activation == "none" and models.again.a.activation == "none"
    assert models.again.b.activation == models.again.c.activation == "none"
    assert type(models.again.act_a) is torch.nn.SiLU
    summary = tritongemm.nn.fusion_summary(models).splitlines()
    assert (
        summary[0]
        == "tritongemm.nn: 0 gated MLPs fused into GatedMLP, 4 activations into the Linear before them, 0 left as it was"
    )
    assert "  bert.dense: gelu fused into its epilogue" in summary

    x = random_tensor((2, 3, 12), torch.float32, device)
    tol = 4 * tolerance(torch.float32, device)
    if not train:
        with torch.no_grad():
            for _ in range(2):  # the second time through the repeated-call entries
                outs, refs = _run_all(models, x), _run_all(stock, x.double())
                for name in outs:
                    assert_close(outs[name], refs[name], tol=tol, what=name)
        return
    outs, refs = _run_all(models, x), _run_all(stock, x.double())
    sum(o.square().sum() for o in outs.values()).backward()
    sum(o.square().sum() for o in refs.values()).backward()
    for (name, p), q in zip(models.named_parameters(), stock.parameters()):
        assert_close(p.grad, q.grad, tol=tol, what=f"grad of {name}")


def test_convert_leaves_activations_it_cannot_fuse_and_says_why(device):
    hooked, shared = Intermediate(), Intermediate()
    hooked.intermediate_act_fn.register_forward_hook(lambda m, i, o: o)
    model = torch.nn.Sequential(hooked, shared, torch.nn.Sequential(shared.dense, torch.nn.GELU()))
    conv = torch.nn.Sequential(torch.nn.Conv1d(3, 3, 1), torch.nn.ReLU())  # not a Linear: no word of it
    tritongemm.nn.convert(model)
    tritongemm.nn.convert(conv)
    fused, left = tritongemm.nn.fusion_report(model)
    assert fused == {}
    assert left == {
        "0.dense": "intermediate_act_fn has hooks",
        "1.dense": "dense or intermediate_act_fn is a module reachable under another name too",
        "2.0": "0 or 1 is a module reachable under another name too",
    }
    assert tritongemm.nn.fusion_report(conv) == ({}, {})
    for precision, fuse in ((None, False), ("fp8", True)):
        m = Intermediate()
        tritongemm.nn.convert(m, precision=precision, fuse_mlp=fuse)
        assert type(m.intermediate_act_fn) is torch.nn.GELU and m.dense.activation == "none"


# -- transformers' Conv1D (GPT-2), without transformers: its classes as their sources have them ----------


class Conv1D(torch.nn.Module):
    """``transformers.pytorch_utils.Conv1D``: ``x @ weight + bias``, the weight stored (in, out)."""

    def __init__(self, nf, nx):
        super().__init__()
        self.nf, self.nx = nf, nx
        self.weight = torch.nn.Parameter(torch.randn(nx, nf) * 0.2)
        self.bias = torch.nn.Parameter(torch.randn(nf) * 0.2)

    def forward(self, x):
        size_out = x.size()[:-1] + (self.nf,)
        x = torch.addmm(self.bias, x.view(-1, x.size(-1)), self.weight)
        x = x.view(size_out)
        return x


class NewGELUActivation(torch.nn.Module):
    """``transformers.activations.NewGELUActivation``: the tanh GELU, written out."""

    def forward(self, input):
        return (
            0.5 * input * (1.0 + torch.tanh(0.7978845608028654 * (input + 0.044715 * torch.pow(input, 3.0))))
        )


Conv1D.__module__ = "transformers.pytorch_utils"
NewGELUActivation.__module__ = "transformers.activations"


class GPT2MLP(torch.nn.Module):
    """transformers' ``GPT2MLP``, with an attention's projection beside it."""

    def __init__(self):
        super().__init__()
        self.c_fc = Conv1D(20, 12)
        self.c_proj = Conv1D(12, 20)
        self.act = NewGELUActivation()
        self.dropout = torch.nn.Dropout(0.0)
        self.c_attn = Conv1D(36, 12)

    def forward(self, hidden_states):
        hidden_states = self.c_fc(hidden_states)
        hidden_states = self.act(hidden_states)
        hidden_states = self.c_proj(hidden_states)
        hidden_states = self.dropout(hidden_states)
        return hidden_states + self.c_attn(hidden_states)[..., :12]


@pytest.mark.parametrize("train", [False, True], ids=["eval", "train"])
def test_convert_takes_transformers_conv1d_and_fuses_gpt2s_gelu(train, device, plans):
    model = GPT2MLP().to(device)
    stock = copy.deepcopy(model).double()
    state = {k: v.shape for k, v in model.state_dict().items()}
    tritongemm.nn.convert(model)
    assert {k: v.shape for k, v in model.state_dict().items()} == state  # (in, out) weights, as saved
    assert [type(m) for m in (model.c_fc, model.c_proj, model.c_attn)] == [tritongemm.nn.Conv1D] * 3
    assert not isinstance(model.c_fc, torch.nn.Linear)
    assert (model.c_fc.activation, model.c_proj.activation) == ("gelu_tanh", "none")
    assert type(model.act) is tritongemm.nn.FusedActivation
    assert tritongemm.nn.fusion_report(model) == ({"c_fc": "gelu_tanh"}, {})
    assert "nf=20, nx=12, activation='gelu_tanh', backend=tritongemm" in repr(model.c_fc)
    tol = 4 * tolerance(torch.float32, device)
    x = random_tensor((2, 3, 12), torch.float32, device)
    if not train:
        with torch.no_grad():
            for _ in range(2):  # the second time through the repeated-call entries
                assert_close(model(x), stock(x.double()), tol=tol)
        assert sorted((p["M"], p["N"], p["K"]) for p in plans) == sorted(
            2 * [(6, 12, 20), (6, 20, 12), (6, 36, 12)]
        )
    else:
        model(x).square().sum().backward()
        stock(x.double()).square().sum().backward()
        for (name, p), q in zip(model.named_parameters(), stock.parameters()):
            assert_close(p.grad, q.grad, tol=tol, what=f"grad of {name}")
    assert "3 Conv1D modules, 0 fell back" in tritongemm.nn.fallback_summary(model)


def test_conv1d_module_keeps_transformers_state_and_semantics(device):
    stock = GPT2MLP().to(device)
    mine = tritongemm.nn.convert(copy.deepcopy(stock), precision="fp8")  # Conv1D layers stay 16-bit,
    assert type(mine.c_fc) is tritongemm.nn.Conv1D and type(mine.act) is NewGELUActivation  # unfused
    fresh = tritongemm.nn.convert(GPT2MLP().to(device))
    fresh.load_state_dict(stock.state_dict())  # a checkpoint saved from the stock model loads as it is
    x = random_tensor((4, 12), torch.float32, device)
    with torch.no_grad():
        assert_close(fresh(x), stock.double()(x.double()), tol=4 * tolerance(torch.float32, device))
        assert_close(copy.deepcopy(fresh)(x), fresh(x))
    layer = tritongemm.nn.Conv1D(6, 4, device=device)  # transformers' argument order: (nf, nx)
    assert layer.weight.shape == (4, 6) and layer.bias.shape == (6,)
    with torch.no_grad():
        assert_close(
            layer(x[:, :4]), torch.addmm(layer.bias.double(), x[:, :4].double(), layer.weight.double())
        )
    with pytest.raises(RuntimeError, match="5"):
        layer(random_tensor((3, 5), torch.float32, device))
    with pytest.raises(ValueError, match="activation"):
        tritongemm.nn.Conv1D(6, 4, activation="tanh")


def test_convert_leaves_other_conv1ds_alone(device):
    class Conv1DElsewhere(Conv1D):  # the name alone is not enough: it is not transformers'
        pass

    Conv1DElsewhere.__module__ = __name__
    Conv1DElsewhere.__name__ = "Conv1D"
    mine = Conv1DElsewhere(4, 6)
    assert tritongemm.nn.convert(mine) is mine
    replaced = Conv1D(4, 6)
    replaced.forward = lambda x: x
    with pytest.warns(UserWarning, match="forward replaced on the instance"):
        assert tritongemm.nn.convert(torch.nn.Sequential(replaced))[0] is replaced
    assert type(tritongemm.nn.convert(Conv1D(4, 6))) is tritongemm.nn.Conv1D
