"""Autograd: gradcheck and gradgradcheck in float64 for every public function,
gradients flowing into stride-0 and transposed incoming gradients, and
backward running only the GEMMs it needs.
"""

import copy

import pytest
import torch
import torch.nn.functional as F
from torch.autograd import gradcheck, gradgradcheck

import tritongemm
from tritongemm.testing import assert_close, assert_matches_reference, make_operands, random_tensor

F64 = torch.float64


def _inputs(device, *shapes, layouts=None):
    """float64 leaves requiring grad; ``layouts`` gives "N"/"T" per 2-D-or-more input."""
    out = []
    for i, shape in enumerate(shapes):
        layout = layouts[i] if layouts else "N"
        if layout == "T" and len(shape) >= 2:
            t = random_tensor((*shape[:-2], shape[-1], shape[-2]), F64, device).mT
        else:
            t = random_tensor(shape, F64, device)
        out.append(t.detach().requires_grad_(True) if layout == "N" else t.requires_grad_(True))
    return tuple(out)


# name -> (function of the inputs, input shapes, layouts)
GRADCHECK_CASES = {
    "matmul": (tritongemm.matmul, [(2, 3), (3, 4)], "NT"),
    "matmul-bcast": (tritongemm.matmul, [(2, 1, 2, 3), (2, 3, 2)], "TN"),
    "matmul-vec": (tritongemm.matmul, [(4,), (2, 4, 3)], "NN"),
    "mm": (tritongemm.mm, [(2, 3), (3, 4)], "TT"),
    "bmm": (tritongemm.bmm, [(2, 3, 4), (2, 4, 2)], "NT"),
    "addmm": (lambda i, a, b: tritongemm.addmm(i, a, b, beta=0.5, alpha=-1.5), [(4,), (2, 3), (3, 4)], "NNT"),
    "baddbmm": (
        lambda i, a, b: tritongemm.baddbmm(i, a, b, beta=2, alpha=0.5),
        [(2, 3, 2), (2, 3, 4), (2, 4, 2)],
        "NTN",
    ),
    "linear": (tritongemm.linear, [(2, 2, 3), (4, 3), (4,)], "NNN"),
    "linear-nobias": (tritongemm.linear, [(2, 3), (4, 3)], "NN"),
}


#: Batched cases check a random projection of the Jacobian (gradcheck's fast
#: mode): the full Jacobian needs two launches per input element.
BATCHED = {"matmul-bcast", "matmul-vec", "bmm", "baddbmm"}


@pytest.mark.parametrize("name", list(GRADCHECK_CASES))
def test_gradcheck(name, device):
    fn, shapes, layouts = GRADCHECK_CASES[name]
    inputs = _inputs(device, *shapes, layouts=layouts)
    assert gradcheck(fn, inputs, eps=1e-6, atol=1e-8, rtol=1e-6, fast_mode=name in BATCHED)


@pytest.mark.parametrize(
    "name",
    [
        pytest.param("matmul-bcast", marks=pytest.mark.slow),
        "addmm",
        pytest.param("baddbmm", marks=pytest.mark.slow),
        "linear",
    ],
)
def test_gradgradcheck(name, device):
    fn, shapes, layouts = GRADCHECK_CASES[name]
    inputs = _inputs(device, *shapes, layouts=layouts)
    assert gradgradcheck(fn, inputs, eps=1e-6, atol=1e-8, rtol=1e-6, fast_mode=True)


FORWARD_AD_CASES = {
    **GRADCHECK_CASES,
    "linear-gelu-residual": (
        lambda x, w, b, r: tritongemm.linear(x, w, b, activation="gelu", residual=r),
        [(2, 3), (4, 3), (4,), (2, 4)],
        "NTNN",
    ),
    "gated_linear": (lambda x, g, u: tritongemm.gated_linear(x, g, u), [(3, 4), (5, 4), (5, 4)], "NNT"),
    "mlp": (
        lambda x, w1, w2: tritongemm.mlp(x, w1, None, w2, None, activation="silu"),
        [(3, 4), (5, 4), (2, 5)],
        "NNN",
    ),
}


#: The default run's forward-AD cases (one of each epilogue and door); the rest run in the slow tier.
FORWARD_AD_FAST = {"matmul", "addmm", "linear", "linear-gelu-residual", "gated_linear", "mlp"}


@pytest.mark.parametrize(
    "name", [n if n in FORWARD_AD_FAST else pytest.param(n, marks=pytest.mark.slow) for n in FORWARD_AD_CASES]
)
def test_forward_ad_gradcheck(name, device):
    """Forward-mode AD (dual tensors, ``torch.func.jvp``): each function's tangents against finite
    differences, through the op's ``jvp`` on tritongemm's kernels."""
    fn, shapes, layouts = FORWARD_AD_CASES[name]
    inputs = _inputs(device, *shapes, layouts=layouts)
    assert gradcheck(
        fn,
        inputs,
        eps=1e-6,
        atol=1e-8,
        rtol=1e-6,
        fast_mode=True,
        check_forward_ad=True,
        check_backward_ad=False,
    )


@pytest.mark.parametrize("grad", [True, False], ids=["grad", "no_grad"])
def test_forward_ad_through_converted_layers_keeps_every_tangent(grad, device):
    """A dual input through converted layers, their fast paths warm (which launch without autograd)
    and the gated kernel's dtype: the tangent is torch's, none dropped."""
    import torch.autograd.forward_ad as fwAD

    torch.manual_seed(0)
    dt = torch.float32
    stock = torch.nn.Sequential(torch.nn.Linear(16, 24), torch.nn.GELU(), torch.nn.Linear(24, 8)).to(
        device, dt
    )
    model = tritongemm.nn.convert(copy.deepcopy(stock))
    gated = tritongemm.nn.GatedMLP(16, 24, device=device, dtype=dt)
    x, v = random_tensor((5, 16), dt, device), random_tensor((5, 16), dt, device)

    def stock_gated(x):
        g, u, d = gated.gate_proj, gated.up_proj, gated.down_proj
        return F.linear(F.silu(F.linear(x, g.weight)) * F.linear(x, u.weight), d.weight)

    with torch.set_grad_enabled(grad):
        model(x), model(x), gated(x), gated(x)  # (fast-path entries made)
        gw, uw = gated.gate_proj.weight, gated.up_proj.weight
        fused = (lambda x: tritongemm.gated_linear(x, gw, uw), lambda x: F.silu(x @ gw.T) * (x @ uw.T))
        for ours, ref in ((model, stock), (gated, stock_gated), fused):
            with fwAD.dual_level():
                got = fwAD.unpack_dual(ours(fwAD.make_dual(x, v))).tangent
                want = fwAD.unpack_dual(ref(fwAD.make_dual(x, v))).tangent
            assert got is not None
            assert_close(got, want.double(), dtype=dt)


def test_gradcheck_catches_a_wrong_gradient(device):
    """The gradcheck settings above are tight enough to see a gradient off by 1e-3."""

    class Scaled(torch.autograd.Function):
        @staticmethod
        def forward(ctx, a, b):
            ctx.save_for_backward(a, b)
            return tritongemm.mm(a, b)

        @staticmethod
        def backward(ctx, g):
            a, b = ctx.saved_tensors
            return tritongemm.mm(g, b.t()) * (1 + 1e-3), tritongemm.mm(a.t(), g)

    inputs = _inputs(device, (3, 4), (4, 5))
    assert not gradcheck(Scaled.apply, inputs, eps=1e-6, atol=1e-8, rtol=1e-6, raise_exception=False)


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32], ids=["fp16", "fp32"])
@pytest.mark.parametrize("loss", ["sum", "transposed", "sliced"])
def test_backward_odd_incoming_gradients(loss, dtype, device):
    """Incoming gradients with stride 0 (sum), transposed strides, or zeros outside a slice."""
    a, b = make_operands(17, 19, 23, "NT", dtype, device)
    a.requires_grad_(True)
    b.requires_grad_(True)
    weight = random_tensor((19, 17), dtype, device)

    def reduce(c):
        if loss == "sum":
            return c.sum()  # grad_out is a (17, 19) view of one element: strides (0, 0)
        if loss == "transposed":
            return (c.t() * weight.to(c.dtype)).sum()  # grad_out = weight.t(): column-major
        return c[1::3, ::2].sum()  # grad_out zero outside the slice

    ga, gb = torch.autograd.grad(reduce(tritongemm.matmul(a, b)), (a, b))
    ra, rb = (a.detach().double().requires_grad_(), b.detach().double().requires_grad_())
    ref_a, ref_b = torch.autograd.grad(reduce(ra @ rb), (ra, rb))
    assert_close(ga, ref_a, dtype=dtype, what="grad a")
    assert_close(gb, ref_b, dtype=dtype, what="grad b")


@pytest.mark.parametrize("needs", ["a", "b", "both"])
def test_backward_runs_only_needed_gemms(needs, device, plans):
    a, b = make_operands(9, 10, 11, "NN", torch.float32, device)
    a.requires_grad_(needs in ("a", "both"))
    b.requires_grad_(needs in ("b", "both"))
    out = assert_matches_reference(tritongemm.matmul, torch.matmul, a, b)
    assert out.requires_grad
    assert len(plans) == 1 + (2 if needs == "both" else 1)


def test_no_grad_output_has_no_graph(device):
    a, b = make_operands(9, 10, 11, "NN", torch.float32, device)
    a.requires_grad_(True)
    with torch.no_grad():
        out = tritongemm.matmul(a, b)
    assert not out.requires_grad and out.grad_fn is None


@pytest.mark.parametrize("variant", ["single_stage", "double_buffer", "multi_stage"])
def test_backward_under_each_pipeline(variant, device):
    """pipeline= applies to the backward GEMMs too; their results are right under each scheme."""
    a, b = make_operands(20, 13, 33, "TN", torch.bfloat16, device)
    bias = random_tensor((13,), torch.bfloat16, device)
    for t in (a, b, bias):
        t.requires_grad_(True)
    assert_matches_reference(tritongemm.linear, F.linear, a, b.t(), bias, ours_kwargs=dict(pipeline=variant))


def test_double_backward_values(device):
    """d/da of <grad_a(a, b; g), v> against torch in float64 (create_graph through our backward)."""
    a, b = _inputs(device, (4, 5), (5, 3))
    g = random_tensor((4, 3), F64, device)
    v = random_tensor((4, 5), F64, device)

    def second(fn, a, b):
        (ga,) = torch.autograd.grad(fn(a, b), (a,), g, create_graph=True)
        return torch.autograd.grad((ga * v).sum() + (fn(a, b) ** 2).sum(), (a, b))

    ours = second(tritongemm.matmul, a, b)
    ra, rb = a.detach().clone().requires_grad_(), b.detach().clone().requires_grad_()
    theirs = second(torch.matmul, ra, rb)
    for o, t in zip(ours, theirs):
        assert_close(o, t, dtype=F64)


@pytest.mark.parametrize("which", ["weight", "input"])
def test_gradient_of_a_transposed_operand_keeps_its_layout(which, device):
    # nn.Linear multiplies by weight.mT: its gradient is computed transposed, so
    # it arrives in weight's own (contiguous) layout and accumulating it into
    # weight.grad needs no transposing copy.  Same for a transposed A.  (The
    # forward records the layouts: backward may not have the operand saved.)
    from types import SimpleNamespace

    from tritongemm.autograd.function import backward_gemms

    a = random_tensor((24, 40), torch.float32, device)
    b = random_tensor((17, 40), torch.float32, device).mT  # (40, 17), column-major
    if which == "input":
        a, b = (
            random_tensor((40, 24), torch.float32, device).mT,
            random_tensor((40, 17), torch.float32, device),
        )
    grad_out = random_tensor((24, 17), torch.float32, device)
    from tritongemm.planning.call import GemmCall

    ctx = SimpleNamespace(
        call=GemmCall(),
        needs_input_grad=(True, True, False, False),
        a_transposed=which == "input",
        b_transposed=which == "weight",
    )
    with torch.no_grad():
        grad_a, grad_b, _, _ = backward_gemms(ctx, grad_out, a, b, None)
    assert_close(grad_a, grad_out.double() @ b.double().mT)
    assert_close(grad_b, a.double().mT @ grad_out.double())
    transposed = grad_b if which == "weight" else grad_a
    assert transposed.mT.is_contiguous() and not transposed.is_contiguous()


def test_forward_records_transposed_operands(device):
    from tritongemm.autograd.function import is_transposed_view

    w = random_tensor((17, 40), torch.float32, device)
    assert is_transposed_view(w.mT) and not is_transposed_view(w)
    assert not is_transposed_view(random_tensor((1, 40), torch.float32, device).mT)  # a vector: either layout
    lin = torch.nn.Linear(40, 17).to(device)
    x = random_tensor((5, 40), torch.float32, device)  # no grad: only weight's gradient is computed
    tritongemm.linear(x, lin.weight, lin.bias).sum().backward()
    assert lin.weight.grad.is_contiguous()
    assert_close(lin.weight.grad, torch.ones(5, 17, dtype=torch.float64, device=device).mT @ x.double())


def test_func_forward_mode_transforms(device):
    """``torch.func.jvp``, ``jacfwd`` and ``hessian`` (forward over reverse) through ``linear`` with a
    fused activation: the op's ``jvp`` in functorch's form, against torch's in float64."""
    x, v = random_tensor((5, 16), F64, device), random_tensor((5, 16), F64, device)
    w, b = random_tensor((8, 16), F64, device), random_tensor((8,), F64, device)

    def ours(x):
        return tritongemm.linear(x, w, b, activation="gelu")

    def theirs(x):
        return F.gelu(F.linear(x, w, b))

    assert_close(torch.func.jvp(ours, (x,), (v,))[1], torch.func.jvp(theirs, (x,), (v,))[1])
    assert_close(torch.func.jacfwd(ours)(x[0]), torch.func.jacfwd(theirs)(x[0]))
    hess = [torch.func.hessian(lambda x, f=f: f(x).sum())(x[0]) for f in (ours, theirs)]
    assert_close(hess[0], hess[1], scale=hess[1].abs() + 1)
