"""The gated MLP: ``gated_linear``, its backward kernel, ``nn.GatedMLP`` and ``convert``'s fusion.

Forward and every gradient against torch's form in float64 (``act(F.linear(x, w_gate, b_gate)) *
F.linear(x, w_up, b_up)``) for each activation, dtype, with and without biases, on ragged, batched
and non-contiguous inputs; the elementwise backward kernel alone (every element written, nothing
outside the matrix); torch's exceptions; what runs where (fallbacks, float64, autocast, no saved
pre-activations without grad); ``convert`` on stand-ins of transformers' MLP classes: which it
fuses, which it leaves alone (and says why), with unchanged state and stock's outputs and gradients;
``torch.compile``.
"""

from __future__ import annotations

import copy
import importlib.util
from collections import Counter

import pytest
import torch
import torch.nn.functional as F
from conftest import grid_cases
from torch import nn

import tritongemm
from tritongemm.launch import gated as gated_launch
from tritongemm.launch.gated_grad import gated_grad
from tritongemm.testing import DTYPE_IDS, assert_close, nan_tensor, random_tensor, tolerance

ACTS = {
    "silu": F.silu,
    "gelu_tanh": lambda z: F.gelu(z, approximate="tanh"),
    "gelu": F.gelu,
}
DTYPES = (torch.float32, torch.float16, torch.bfloat16)
#: Gradients pass two roundings to the dtype (dg, du stored, then the GEMM's output), as torch's
#: own backward does: twice the one-rounding bound.
GRAD_TOL = 2


@pytest.fixture(autouse=True)
def fused_at_any_size(monkeypatch):
    """These shapes are far below ``GatedMLP``'s host-bound thresholds: test the gated kernel's path."""
    monkeypatch.setattr(tritongemm.frontend.modules, "FUSED_MIN_MACS", 0)
    monkeypatch.setattr(tritongemm.nn.GatedMLP, "compiled_min_outputs", 0)


def test_small_gated_mlps_run_their_linears(device, monkeypatch):
    """Below ``FUSED_MIN_MACS`` a GatedMLP's forward is its three Linears (their fast paths), above it
    the gated kernel; both compute the same function."""
    calls = []
    real = tritongemm.frontend.modules.gated_linear
    monkeypatch.setattr(
        tritongemm.frontend.modules, "gated_linear", lambda *a, **k: calls.append(1) or real(*a, **k)
    )
    mlp = tritongemm.nn.GatedMLP(8, 12, activation="silu", device=device)
    x = random_tensor((5, 8), torch.float32, device)
    monkeypatch.setattr(tritongemm.frontend.modules, "FUSED_MIN_MACS", 5 * 8 * 12 + 1)
    small = mlp(x)
    assert calls == []
    monkeypatch.setattr(tritongemm.frontend.modules, "FUSED_MIN_MACS", 5 * 8 * 12)
    fused = mlp(x)
    assert calls == [1]
    assert_close(small, fused.double())


def test_hooks_added_after_convert_run(device):
    """A hook put on ``gate_proj`` or ``up_proj`` after convert (``parallelize_module`` does) runs: the
    projections are then called as modules, and compute the same function."""
    model = tritongemm.nn.convert(nn.Sequential(LlamaMLP(HIDDEN, INTER))).to(device)
    mlp = model[0]
    assert type(mlp) is tritongemm.nn.GatedMLP
    x = random_tensor((3, HIDDEN), torch.float32, device)
    fused = model(x)
    seen = []
    handle = mlp.up_proj.register_forward_pre_hook(lambda module, args: seen.append(args[0].shape))
    hooked = model(x)
    handle.remove()
    assert seen == [x.shape]
    assert_close(hooked, fused.double(), tol=2 * tolerance(torch.float32, device))


def torch_form(x, w_gate, w_up, b_gate=None, b_up=None, *, activation="silu"):
    return ACTS[activation](F.linear(x, w_gate, b_gate)) * F.linear(x, w_up, b_up)


def check_against_float64(x, w_gate, w_up, b_gate=None, b_up=None, *, activation="silu", tol_factor=1.0):
    """Output and the gradient of every operand that requires grad, against torch in float64."""
    args = (x, w_gate, w_up, b_gate, b_up)
    out = tritongemm.gated_linear(*args, activation=activation)
    refs = [a.detach().double().requires_grad_(a.requires_grad) if a is not None else None for a in args]
    ref = torch_form(*refs, activation=activation)
    dtype = x.dtype
    assert_close(out, ref, tol=tol_factor * tolerance(dtype, x.device), what="forward")
    wanted = [i for i, a in enumerate(args) if a is not None and a.requires_grad]
    if not wanted:
        return out
    grad_out = random_tensor(out.shape, dtype, x.device)
    ours = torch.autograd.grad(out, [args[i] for i in wanted], grad_out)
    theirs = torch.autograd.grad(ref, [refs[i] for i in wanted], grad_out.double())
    names = ("input", "w_gate", "w_up", "b_gate", "b_up")
    for i, g, r in zip(wanted, ours, theirs):
        tol = GRAD_TOL * tol_factor * tolerance(dtype, x.device)
        assert_close(g, r, tol=tol, dtype=dtype, what=f"gradient of {names[i]}")
    return out


def _operands(m_shape, n, k, dtype, device, bias: bool):
    x = random_tensor((*m_shape, k), dtype, device).requires_grad_()
    w_gate = random_tensor((n, k), dtype, device).requires_grad_()
    w_up = random_tensor((n, k), dtype, device).requires_grad_()
    b_gate = random_tensor((n,), dtype, device).requires_grad_() if bias else None
    b_up = random_tensor((n,), dtype, device).requires_grad_() if bias else None
    return x, w_gate, w_up, b_gate, b_up


# ----------------------------------------------------------------------------------
# gated_linear against torch in float64
# ----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "activation, dtype, bias",
    grid_cases(
        {"activation": list(ACTS), "dtype": DTYPES, "bias": (True, False)},
        keep=lambda a, d, b: (a + d) % 3 == 0,  # each activation with one dtype, both bias settings
        ids={"dtype": DTYPE_IDS.get, "bias": lambda b: "bias" if b else "nobias"},
    ),
)
def test_gated_linear_forward_and_gradients(device, activation, dtype, bias):
    # 3-D input, M = 10, N = 23, K = 19: no size a multiple of 16
    operands = _operands((2, 5), 23, 19, dtype, device, bias)
    out = check_against_float64(*operands, activation=activation)
    assert out.shape == (2, 5, 23) and out.dtype == dtype


@pytest.mark.parametrize("which", ["gate", "up"])
def test_gated_linear_with_one_bias(device, which):
    x, w_gate, w_up, b_gate, b_up = _operands((9,), 21, 19, torch.float32, device, True)
    biases = (b_gate, None) if which == "gate" else (None, b_up)
    check_against_float64(x, w_gate, w_up, *biases, activation="silu")


@pytest.mark.parametrize("layout", ["every-other-column", "transposed"])
def test_gated_linear_non_contiguous_input(device, layout):
    if layout == "every-other-column":
        x = random_tensor((3, 7, 38), torch.float32, device)[..., ::2]
    else:
        x = random_tensor((19, 11), torch.float32, device).mT
    assert not x.is_contiguous()
    x.requires_grad_()
    _, w_gate, w_up, b_gate, b_up = _operands((1,), 21, 19, torch.float32, device, True)
    out = check_against_float64(x, w_gate, w_up, b_gate, b_up, activation="gelu_tanh")
    assert out.shape == (*x.shape[:-1], 21)


@pytest.mark.slow
@pytest.mark.parametrize("activation", list(ACTS))
def test_gated_linear_larger_ragged(device, activation):
    check_against_float64(*_operands((3, 67), 97, 83, torch.bfloat16, device, True), activation=activation)


def test_one_dimensional_input(device):
    x, w_gate, w_up, _, _ = _operands((), 9, 12, torch.float32, device, False)
    assert x.dim() == 1
    out = check_against_float64(x, w_gate, w_up, activation="gelu")
    assert out.shape == (9,)


# ----------------------------------------------------------------------------------
# The elementwise backward kernel alone
# ----------------------------------------------------------------------------------
def _row_strided(m, n, dtype, device, values=None):
    """An (m, n) view of every row of an (m, n + 5) buffer: ``values`` (else NaN) in the view, the
    5-column gap after each row finite (inputs) or a sentinel (outputs: 7.0), so a read or a write
    past a row's end shows."""
    buf = torch.full((m, n + 5), 1.0 if values is not None else 7.0, dtype=dtype, device=device)
    view = buf[:, :n]
    view.copy_(values if values is not None else nan_tensor((m, n), dtype, device))
    return view, buf


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS.get)
@pytest.mark.parametrize("activation", list(ACTS))
def test_gated_grad_kernel_writes_every_element_and_nothing_else(device, activation, dtype):
    m, n = 37, 1100  # two column blocks of 1024, the second ragged; a ragged last row block
    g = random_tensor((m, n), torch.float32, device) * 3
    g[0, :6] = torch.tensor([30.0, -30.0, 80.0, -80.0, 0.0, 1e-3])  # saturated and tiny pre-activations
    dh, _ = _row_strided(m, n, dtype, device, random_tensor((m, n), dtype, device))
    g, _ = _row_strided(m, n, dtype, device, g.to(dtype))
    u, _ = _row_strided(m, n, dtype, device, random_tensor((m, n), dtype, device))
    dg, dg_buf = _row_strided(m, n, dtype, device)  # NaN: an element left unwritten fails the comparison
    du, du_buf = _row_strided(m, n, dtype, device)
    gated_grad(dh, g, u, activation, dg, du)

    gr, ur = g.double().requires_grad_(), u.double().requires_grad_()
    (ACTS[activation](gr) * ur).backward(dh.double())
    assert_close(dg, gr.grad, what="dg")
    assert_close(du, ur.grad, what="du")
    for buf in (dg_buf, du_buf):
        assert (buf[:, n:] == 7.0).all(), "the kernel wrote past the end of a row"


# ----------------------------------------------------------------------------------
# What runs where
# ----------------------------------------------------------------------------------
@pytest.fixture
def saves(monkeypatch):
    """The ``save`` argument of every ``gated_gemm`` call."""
    seen = []
    real = gated_launch.gated_gemm

    def spy(*args, **kwargs):
        seen.append(kwargs.get("save"))
        return real(*args, **kwargs)

    monkeypatch.setattr(gated_launch, "gated_gemm", spy)
    return seen


def test_pre_activations_are_saved_only_for_a_gradient(device, saves):
    x, w_gate, w_up, b_gate, b_up = _operands((6,), 8, 12, torch.float32, device, True)
    with torch.no_grad():
        tritongemm.gated_linear(x, w_gate, w_up, b_gate, b_up)
    frozen = [t.detach() for t in (x, w_gate, w_up, b_gate, b_up)]
    tritongemm.gated_linear(*frozen)
    assert saves == [None, None]
    out = tritongemm.gated_linear(x.detach(), w_gate, w_up.detach())  # one operand needs a gradient
    ((g, u),) = saves[2:]
    assert g.shape == u.shape == (6, 8)
    ref_g, ref_u = F.linear(x, w_gate), F.linear(x, w_up)
    assert_close(g, ref_g.double(), what="saved g")
    assert_close(u, ref_u.double(), what="saved u")
    assert out.requires_grad


def test_only_the_gradients_asked_for_are_computed(device, plans):
    m, n, k = 10, 23, 19
    x, w_gate, w_up, _, _ = _operands((m,), n, k, torch.float32, device, False)
    frozen_w = (w_gate.detach(), w_up.detach())

    def gemms(records, mm, nn_, kk):
        return sum((r["M"], r["N"], r["K"]) == (mm, nn_, kk) for r in records)

    check_against_float64(x, *frozen_w, activation="silu")  # the input's gradient only
    assert gemms(plans, m, k, n) == 2 and gemms(plans, n, k, m) == 0, plans
    plans.clear()
    check_against_float64(x.detach(), w_gate, w_up, activation="silu")  # the weights' only
    assert gemms(plans, m, k, n) == 0 and gemms(plans, n, k, m) == 2, plans


def test_float64_takes_tritongemm_linear_twice(device, plans):
    """The fused kernel has no fp64 variant: two of tritongemm's GEMMs, still differentiable."""
    x, w_gate, w_up, b_gate, b_up = _operands((5,), 6, 7, torch.float64, device, True)
    out = check_against_float64(x, w_gate, w_up, b_gate, b_up, activation="gelu")
    assert len([r for r in plans if r["dtype"] == torch.float64]) >= 2 + 4
    assert out.dtype == torch.float64
    small = [t.detach()[:3, :4] if t.dim() == 2 else t.detach()[:3] for t in (x, w_gate, w_up, b_gate, b_up)]
    small = [t.clone().requires_grad_() for t in small]
    assert torch.autograd.gradcheck(
        lambda *t: tritongemm.gated_linear(*t, activation="silu"), tuple(small), fast_mode=True
    )


def test_inputs_tritongemm_cannot_run_go_to_torch():
    x = torch.empty(4, 3, 8, device="meta")
    w = torch.empty(5, 8, device="meta")
    assert tritongemm.gated_linear(x, w, w).shape == (4, 3, 5)
    ints = torch.ones(3, 4, dtype=torch.int64)
    with pytest.raises(RuntimeError) as ours:
        tritongemm.gated_linear(
            ints, torch.ones(2, 4, dtype=torch.int64), torch.ones(2, 4, dtype=torch.int64)
        )
    with pytest.raises(type(ours.value)):
        torch_form(ints, torch.ones(2, 4, dtype=torch.int64), torch.ones(2, 4, dtype=torch.int64))


def test_autocast_computes_in_the_autocast_dtype(device):
    x, w_gate, w_up, b_gate, b_up = (t.detach() for t in _operands((5,), 8, 16, torch.float32, device, True))
    with torch.autocast(device.type, dtype=torch.bfloat16):
        expected = torch_form(x, w_gate, w_up, b_gate, b_up)
        out = tritongemm.gated_linear(x, w_gate, w_up, b_gate, b_up)
    assert out.dtype == expected.dtype == torch.bfloat16
    as_cast = [t.to(torch.bfloat16).double() for t in (x, w_gate, w_up, b_gate, b_up)]
    assert_close(out, torch_form(*as_cast))


def test_double_backward_is_refused(device):
    x, w_gate, w_up, _, _ = _operands((4,), 6, 5, torch.float32, device, False)
    out = tritongemm.gated_linear(x, w_gate, w_up)
    with pytest.raises(RuntimeError, match="double backward"):
        torch.autograd.grad(out.sum(), x, create_graph=True)


# ----------------------------------------------------------------------------------
# Errors: torch's types, with the shapes
# ----------------------------------------------------------------------------------
def test_errors_match_torch(device):
    x = random_tensor((3, 4), torch.float32, device)
    w = random_tensor((5, 4), torch.float32, device)
    with pytest.raises(RuntimeError, match=r"input of shape \(3, 4\) and weights of shape \(5, 6\)"):
        tritongemm.gated_linear(
            x, random_tensor((5, 6), torch.float32, device), random_tensor((5, 6), torch.float32, device)
        )
    with pytest.raises(RuntimeError):  # torch's own type for the same mistake
        torch_form(
            x, random_tensor((5, 6), torch.float32, device), random_tensor((5, 6), torch.float32, device)
        )
    with pytest.raises(RuntimeError, match=r"w_gate of shape \(5, 4\) and w_up of shape \(7, 4\)"):
        tritongemm.gated_linear(x, w, random_tensor((7, 4), torch.float32, device))
    with pytest.raises(RuntimeError, match=r"w_up of shape \(5, 4, 1\)"):
        tritongemm.gated_linear(x, w, w.unsqueeze(-1))
    with pytest.raises(RuntimeError, match="dtype"):
        tritongemm.gated_linear(x, w, w.to(torch.float64))
    with pytest.raises(TypeError, match="w_up"):
        tritongemm.gated_linear(x, w, "w")
    with pytest.raises(ValueError, match="unknown activation 'relu'"):
        tritongemm.gated_linear(x, w, w, activation="relu")
    with pytest.raises(ValueError, match="unknown activation"):
        tritongemm.nn.GatedMLP(4, 8, activation="swish")


# ----------------------------------------------------------------------------------
# nn.GatedMLP and convert
# ----------------------------------------------------------------------------------
class LlamaMLP(nn.Module):
    """transformers' ``LlamaMLP``, as its source has it (assign, then return)."""

    def __init__(self, hidden: int, intermediate: int, bias: bool = False, act: nn.Module | None = None):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, intermediate, bias=bias)
        self.up_proj = nn.Linear(hidden, intermediate, bias=bias)
        self.down_proj = nn.Linear(intermediate, hidden, bias=bias)
        self.act_fn = act if act is not None else nn.SiLU()

    def forward(self, x):
        down_proj = self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))
        return down_proj


class GemmaMLP(LlamaMLP):
    """GeGLU, written with the factors the other way round and one return."""

    def __init__(self, hidden: int, intermediate: int):
        super().__init__(hidden, intermediate, act=nn.GELU(approximate="tanh"))

    def forward(self, hidden_state):
        """The docstring is not part of what is compared."""
        return self.down_proj(self.up_proj(hidden_state) * self.act_fn(self.gate_proj(hidden_state)))


class ScaledMLP(LlamaMLP):
    """The three projections and an act_fn, but another forward."""

    def forward(self, x):
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x) * 0.5)


class InlineActMLP(nn.Module):
    """No act_fn module: the activation is a function call."""

    def __init__(self, hidden: int, intermediate: int):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, intermediate, bias=False)
        self.up_proj = nn.Linear(hidden, intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class SiLUActivation(nn.Module):
    """transformers' class name, defined elsewhere: not taken on its name."""

    def forward(self, x):
        return F.silu(x)


class Block(nn.Module):
    def __init__(self, mlp: nn.Module, hidden: int):
        super().__init__()
        self.norm = nn.LayerNorm(hidden)
        self.mlp = mlp

    def forward(self, x):
        return x + self.mlp(self.norm(x))


HIDDEN, INTER = 12, 20


def _decoder(device, dtype=torch.float32) -> nn.Sequential:
    torch.manual_seed(0)
    layers = [
        Block(LlamaMLP(HIDDEN, INTER), HIDDEN),
        Block(GemmaMLP(HIDDEN, INTER), HIDDEN),
        Block(LlamaMLP(HIDDEN, INTER, bias=True), HIDDEN),
        Block(ScaledMLP(HIDDEN, INTER), HIDDEN),
        Block(InlineActMLP(HIDDEN, INTER), HIDDEN),
        Block(LlamaMLP(HIDDEN, INTER, act=nn.ReLU()), HIDDEN),
        Block(LlamaMLP(HIDDEN, INTER, act=SiLUActivation()), HIDDEN),
    ]
    return nn.Sequential(*layers).to(device, dtype)


def _grads(model, x, grad_y):
    x = x.detach().clone().requires_grad_()
    for p in model.parameters():
        p.grad = None
    y = model(x)
    y.backward(grad_y)
    # (a compiled module names its parameters under "_orig_mod.")
    return y.detach(), x.grad, {n.removeprefix("_orig_mod."): p.grad for n, p in model.named_parameters()}


def test_convert_fuses_the_gated_mlps_it_can_prove_and_leaves_the_rest(device):
    model = _decoder(device)
    stock = copy.deepcopy(model).double()
    state = model.state_dict()
    params = dict(model.named_parameters())

    assert tritongemm.nn.convert(model) is model
    kinds = [type(block.mlp).__name__ for block in model]
    assert kinds == ["GatedMLP", "GatedMLP", "GatedMLP", "ScaledMLP", "InlineActMLP", "LlamaMLP", "LlamaMLP"]
    assert [model[i].mlp.activation for i in range(3)] == ["silu", "gelu_tanh", "silu"]
    assert all(type(m) is tritongemm.nn.Linear for m in model.modules() if isinstance(m, nn.Linear))
    new_state = model.state_dict()
    assert list(new_state) == list(state)
    assert all(new_state[k].data_ptr() == v.data_ptr() for k, v in state.items()), "state must not be copied"
    assert all(p is params[n] for n, p in model.named_parameters())

    fused, left = tritongemm.nn.fusion_report(model)
    # Of the gated MLPs left alone, the ReLU one still applies a known activation module to gate_proj's
    # output alone: it goes into gate_proj's epilogue (``fusion.linear_activation_pairs``).  ScaledMLP's
    # base class reads act_fn in a forward of its own too, so its act_fn stays; SiLUActivation is no
    # activation convert knows.
    assert fused == {"0.mlp": "silu", "1.mlp": "gelu_tanh", "2.mlp": "silu", "5.mlp.gate_proj": "relu"}
    assert type(model[5].mlp.act_fn) is tritongemm.nn.FusedActivation
    assert type(model[3].mlp.act_fn) is nn.SiLU and type(model[6].mlp.act_fn) is SiLUActivation
    assert set(left) == {"3.mlp", "4.mlp", "5.mlp", "6.mlp"}
    assert "ScaledMLP.forward does not compute" in left["3.mlp"]
    assert "no act_fn" in left["4.mlp"]
    assert "act_fn is ReLU" in left["5.mlp"] and "act_fn is SiLUActivation" in left["6.mlp"]
    summary = tritongemm.nn.fusion_summary(model).splitlines()
    assert summary[0] == (
        "tritongemm.nn: 3 gated MLPs fused into GatedMLP, 1 activation into the Linear before them, "
        "4 left as it was"
    )
    assert summary[1] == "  0.mlp: fused (silu, from LlamaMLP)"
    assert summary[2] == "  1.mlp: fused (gelu_tanh, from GemmaMLP)"

    x = random_tensor((2, 3, HIDDEN), torch.float32, device)
    grad_y = random_tensor((2, 3, HIDDEN), torch.float32, device)
    y, gx, grads = _grads(model, x, grad_y)
    y_ref, gx_ref, grads_ref = _grads(stock, x.double(), grad_y.double())
    tol = 8 * tolerance(torch.float32, device)  # seven blocks of three GEMMs each compound the rounding
    assert_close(y, y_ref, tol=tol, what="output")
    assert_close(gx, gx_ref, tol=tol, what="input gradient")
    for name, g in grads.items():
        assert_close(g, grads_ref[name], tol=tol, what=f"gradient of {name}")


def test_fuse_mlp_false_and_fp8_leave_mlps_as_they_are():
    model = nn.Sequential(LlamaMLP(HIDDEN, INTER), GemmaMLP(HIDDEN, INTER))
    tritongemm.nn.convert(model, fuse_mlp=False)
    assert [type(m).__name__ for m in model] == ["LlamaMLP", "GemmaMLP"]
    assert all(type(m) is tritongemm.nn.Linear for m in model.modules() if isinstance(m, nn.Linear))
    assert tritongemm.nn.fusion_report(model) == ({}, {"0": "fuse_mlp=False", "1": "fuse_mlp=False"})
    tritongemm.nn.convert(model)  # a second convert fuses them (their Linears are already ours)
    assert [type(m).__name__ for m in model] == ["GatedMLP", "GatedMLP"]

    fp8 = nn.Sequential(LlamaMLP(32, 64))
    tritongemm.nn.convert(fp8, precision="fp8")
    assert type(fp8[0]) is LlamaMLP and type(fp8[0].gate_proj) is tritongemm.nn.Float8Linear
    assert "precision='fp8'" in tritongemm.nn.fusion_report(fp8)[1]["0"]


def test_convert_a_bare_mlp_and_keep_its_hooks(device):
    mlp = LlamaMLP(HIDDEN, INTER).to(device)
    mlp.eval()
    calls = []
    mlp.register_forward_hook(lambda m, args, out: calls.append(type(m).__name__) or out * 2)
    mlp.tag = "layers.0.mlp"
    new = tritongemm.nn.convert(mlp)
    assert type(new) is tritongemm.nn.GatedMLP and not new.training and new.tag == "layers.0.mlp"
    x = random_tensor((4, HIDDEN), torch.float32, device)
    y = new(x)
    assert calls == ["GatedMLP"], "the MLP's own hook must keep firing"
    ref = torch_form(x.double(), mlp.gate_proj.weight.double(), mlp.up_proj.weight.double())
    assert_close(
        y, 2 * F.linear(ref, mlp.down_proj.weight.double()), tol=2 * tolerance(torch.float32, device)
    )


def test_convert_leaves_an_mlp_whose_gate_has_hooks():
    mlp = LlamaMLP(HIDDEN, INTER)
    mlp.gate_proj.register_forward_hook(lambda m, args, out: out)
    model = nn.Sequential(mlp)
    tritongemm.nn.convert(model)
    assert type(model[0]) is LlamaMLP
    assert "gate_proj has hooks" in tritongemm.nn.fusion_report(model)[1]["0"]


def test_gated_mlp_module_falls_back_and_counts(monkeypatch):
    monkeypatch.setattr(tritongemm.nn.GatedMLP, "fallbacks", Counter())
    mlp = tritongemm.nn.GatedMLP(8, 16, activation="gelu", device="meta")
    assert mlp(torch.empty(3, 8, device="meta")).shape == (3, 8)
    ((reason, n),) = mlp.fallbacks.items()
    assert n == 1 and "meta" in reason
    assert tritongemm.nn.GatedMLP.fallbacks == {reason: 1}
    assert list(mlp.state_dict()) == ["gate_proj.weight", "up_proj.weight", "down_proj.weight"]
    assert repr(mlp).splitlines()[1].strip() == "activation='gelu'"
    lines = tritongemm.nn.fallback_summary(mlp).splitlines()
    assert lines[0] == "tritongemm.nn: 3 Linear modules, 1 GatedMLP modules, 2 fell back to torch (2 calls)"


needs_transformers = pytest.mark.skipif(
    importlib.util.find_spec("transformers") is None,
    reason="transformers is not installed (pip install transformers)",
)


@needs_transformers
@pytest.mark.parametrize("hidden_act", ["silu", "gelu_pytorch_tanh"])
def test_transformers_llama_mlp_is_fused(device, hidden_act):
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaMLP as HFLlamaMLP

    config = LlamaConfig(
        hidden_size=16,
        intermediate_size=40,
        hidden_act=hidden_act,
        num_attention_heads=2,
        num_key_value_heads=2,
    )
    torch.manual_seed(0)
    stock = HFLlamaMLP(config).to(device)
    model = nn.Sequential(copy.deepcopy(stock))
    tritongemm.nn.convert(model)
    assert type(model[0]) is tritongemm.nn.GatedMLP, tritongemm.nn.fusion_summary(model)
    assert model[0].activation == {"silu": "silu", "gelu_pytorch_tanh": "gelu_tanh"}[hidden_act]
    x = random_tensor((2, 5, 16), torch.float32, device)
    g = random_tensor((2, 5, 16), torch.float32, device)
    y, gx, grads = _grads(model[0], x, g)
    y_ref, gx_ref, grads_ref = _grads(stock.double(), x.double(), g.double())
    tol = 2 * tolerance(torch.float32, device)
    assert_close(y, y_ref, tol=tol)
    assert_close(gx, gx_ref, tol=tol)
    for name, grad in grads.items():
        assert_close(grad, grads_ref[name], tol=tol, what=name)


# ----------------------------------------------------------------------------------
# torch.compile
# ----------------------------------------------------------------------------------
def test_compiled_mlp_is_the_gated_op_for_inference_and_its_linears_for_training(device, aot_targets):
    """aot_eager (the CPU interpreter too), no graph break: a converted MLP without gradients is
    ``tritongemm::gated_extern``; with them, its three Linears (Inductor fuses the product and its
    gradient into their neighbours, which beat the gated kernel's backward).  The function
    ``gated_linear`` keeps the differentiable op ``tritongemm::gated``, and ``tritongemm::gated_grad``."""
    backend, seen = aot_targets
    model = tritongemm.nn.convert(nn.Sequential(LlamaMLP(HIDDEN, INTER, bias=True))).to(device)
    mlp = model[0]
    x = random_tensor((3, HIDDEN), torch.float32, device)
    tol = 2 * tolerance(torch.float32, device)

    torch._dynamo.reset()
    with torch.no_grad():
        out = torch.compile(model, backend=backend, fullgraph=True)(x)
        assert_close(out, model(x).double(), tol=tol)
    assert "tritongemm.gated_extern.default" in seen and "tritongemm.gated.default" not in seen, seen

    seen.clear()
    torch._dynamo.reset()
    xg = x.clone().requires_grad_()
    out = torch.compile(model, backend=backend, fullgraph=True)(xg)
    out.sum().backward()
    assert seen and not any("gated" in t for t in seen), seen
    ref_x = x.clone().requires_grad_()
    ref = model(ref_x)
    ref.sum().backward()
    assert_close(out, ref.double(), tol=tol)
    assert_close(xg.grad, ref_x.grad.double(), tol=tol)

    seen.clear()
    torch._dynamo.reset()
    weights = (mlp.gate_proj.weight, mlp.up_proj.weight, mlp.gate_proj.bias, mlp.up_proj.bias)
    xf = x.clone().requires_grad_()
    h = torch.compile(lambda t: tritongemm.gated_linear(t, *weights), backend=backend, fullgraph=True)(xf)
    h.sum().backward()
    assert "tritongemm.gated.default" in seen and "tritongemm.gated_grad.default" in seen, seen
    ref_x.grad = None
    ref_h = tritongemm.gated_linear(ref_x, *weights)
    ref_h.sum().backward()
    assert_close(h, ref_h.double(), tol=tol)
    assert_close(xf.grad, ref_x.grad.double(), tol=tol)


def test_compiled_small_mlp_traces_its_linears(device):
    """Below ``compiled_min_outputs`` elements of h a compiled GatedMLP is its three Linears: in a
    compiled graph they become the ops Inductor fuses around, where the gated op would be one opaque
    call; from it, the gated op.  Eager's threshold (``FUSED_MIN_MACS``, 0 here) does not apply."""
    seen = []

    def backend(gm, example_inputs):
        seen.extend(str(n.target) for n in gm.graph.nodes if n.op == "call_function")
        return gm.forward

    model = tritongemm.nn.convert(nn.Sequential(LlamaMLP(HIDDEN, INTER, bias=True))).to(device)
    mlp = model[0]
    assert type(mlp) is tritongemm.nn.GatedMLP
    x = random_tensor((3, HIDDEN), torch.float32, device)
    for threshold, fused in ((3 * INTER + 1, False), (3 * INTER, True)):
        mlp.compiled_min_outputs = threshold
        seen.clear()
        torch._dynamo.reset()
        with torch.no_grad():
            out = torch.compile(model, backend=backend, fullgraph=True)(x)
        assert seen and any("gated" in t for t in seen) == fused, (threshold, seen)
        assert_close(out, model(x).double(), tol=2 * tolerance(torch.float32, device))


@pytest.mark.gpu
@pytest.mark.parametrize("activation", ["silu", "gelu_tanh"])
def test_inductor_compiles_a_converted_mlp_fullgraph(activation):
    torch._dynamo.reset()
    act = nn.SiLU() if activation == "silu" else nn.GELU(approximate="tanh")
    stock = LlamaMLP(256, 688, act=act).to("cuda", torch.bfloat16)
    model = tritongemm.nn.convert(copy.deepcopy(stock))
    assert type(model) is tritongemm.nn.GatedMLP
    compiled = torch.compile(model, fullgraph=True)
    x = random_tensor((4, 33, 256), torch.bfloat16, "cuda").requires_grad_()
    g = random_tensor((4, 33, 256), torch.bfloat16, "cuda")
    y, gx, grads = _grads(compiled, x, g)
    y_ref, gx_ref, grads_ref = _grads(stock.double(), x.double(), g.double())
    tol = 2 * tolerance(torch.bfloat16, "cuda")
    assert_close(y, y_ref, tol=tol)
    assert_close(gx, gx_ref, tol=GRAD_TOL * tol)
    for name, grad in grads.items():
        assert_close(grad, grads_ref[name], tol=GRAD_TOL * tol, what=name)


def test_gated_op_opcheck(device):
    """torch.library's own checks of ``tritongemm::gated``: schema, fake kernel, autograd registration."""
    x, w_gate, w_up, b_gate, b_up = _operands((6,), 5, 8, torch.float32, device, True)
    torch.library.opcheck(torch.ops.tritongemm.gated.default, (x, w_gate, w_up, b_gate, b_up, "silu", True))
    # (no autograd kernel: a graph calls it only where nothing requires grad)
    x, w_gate, w_up, b_gate, b_up = (t.detach() for t in (x, w_gate, w_up, b_gate, b_up))
    torch.library.opcheck(
        torch.ops.tritongemm.gated_extern.default, (x, w_gate, w_up, b_gate, b_up, "gelu_tanh")
    )
    torch.library.opcheck(torch.ops.tritongemm.gated_extern.default, (x, w_gate, w_up, None, None, "silu"))
    g, u = random_tensor((6, 5), torch.float32, device), random_tensor((6, 5), torch.float32, device)
    dh = random_tensor((6, 5), torch.float32, device)
    torch.library.opcheck(torch.ops.tritongemm.gated_grad.default, (dh, g, u, "gelu"))
