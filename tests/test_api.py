"""Every public function against torch (float64), forward and backward.

matmul (1-D operands, batches, broadcasting), mm, bmm, addmm, baddbmm and
linear in every dtype; ``out=`` (NaN-filled, non-contiguous, transposed,
empty); ``out_dtype``; NaN and Inf propagating as in torch, and ``beta=0``
ignoring the addend as torch does; TF32 following torch's switch on a GPU.
"""

import pytest
import torch
import torch.nn.functional as F

import tritongemm
from tritongemm import launch, semantics
from tritongemm.testing import (
    DTYPE_IDS,
    DTYPES,
    TF32_TOLERANCE,
    TOLERANCES,
    assert_close,
    assert_matches_reference,
    make_matrix,
    make_operands,
    nan_tensor,
    random_tensor,
    relative_error,
    strided_out,
)

dtypes = pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS.get)


def _grad(*tensors):
    for t in tensors:
        t.requires_grad_(True)
    return tensors


# ----------------------------------------------------------------------------------
# matmul: every operand rank torch.matmul accepts, broadcasting included
# ----------------------------------------------------------------------------------
# id -> (shape of a, shape of b); each is built row-major then given a layout.
MATMUL_SHAPES = {
    "vec.vec": ((17,), (17,)),
    "vec.mat": ((17,), (17, 9)),
    "mat.vec": ((9, 17), (17,)),
    "mat.mat": ((9, 17), (17, 20)),
    "batch.vec": ((3, 9, 17), (17,)),
    "vec.batch": ((17,), (3, 17, 9)),
    "batch.mat-folded": ((2, 3, 9, 17), (17, 20)),  # folded into one (54, 17) @ (17, 20)
    "mat.batch": ((9, 17), (3, 17, 20)),  # A broadcast with stride 0
    "batch.batch": ((3, 9, 17), (3, 17, 20)),
    "bcast-2x1.3": ((2, 1, 9, 17), (3, 17, 20)),
    "bcast-1x3.2x1": ((1, 3, 9, 17), (2, 1, 17, 20)),
    "batch1.mat": ((1, 9, 17), (17, 20)),
    "batch0": ((0, 9, 17), (0, 17, 20)),  # no matrices at all
}


def _matmul_cases():
    cases = []
    for i, name in enumerate(MATMUL_SHAPES):
        dtype = DTYPES[i % len(DTYPES)]  # every shape once, the dtypes rotating
        cases.append(pytest.param(name, dtype, id=f"{name}-{DTYPE_IDS[dtype]}"))
    return cases


@pytest.mark.parametrize("name, dtype", _matmul_cases())
def test_matmul_shapes(name, dtype, device):
    a_shape, b_shape = MATMUL_SHAPES[name]
    a = random_tensor(a_shape, dtype, device)
    b = random_tensor(b_shape, dtype, device)
    _grad(a, b)
    assert_matches_reference(tritongemm.matmul, torch.matmul, a, b)


@dtypes
def test_matmul_batched_not_foldable(dtype, device):
    """(B, M, K) @ (K, N) whose A rows cannot be viewed as one matrix: a batch of GEMMs instead."""
    a = make_matrix(9, 17, "S", dtype, device, batch=(3,))[:, :, 1:]  # (3, 9, 16), stepped strides
    b = make_matrix(16, 20, "T", dtype, device)
    _grad(a, b)
    assert_matches_reference(tritongemm.matmul, torch.matmul, a, b)


@dtypes
def test_matmul_explicit_stride0_batch(dtype, device):
    """Operands that already are stride-0 expanded views (their gradient is summed by autograd)."""
    base_a = random_tensor((1, 9, 17), dtype, device).requires_grad_(True)
    b = make_matrix(17, 20, "T", dtype, device, batch=(4,)).requires_grad_(True)
    a = base_a.expand(4, 9, 17)
    assert a.stride(0) == 0
    assert_matches_reference(tritongemm.matmul, torch.matmul, a, b)


def test_tensor_matmul_operator_is_not_changed_outside_patch(device):
    """Sanity: importing tritongemm does not route ``@`` (patch() does, see test_patch)."""
    a, b = make_operands(5, 6, 7, "NN", torch.float32, device)
    assert torch.equal(a @ b, torch.matmul(a, b))


# ----------------------------------------------------------------------------------
# mm, bmm, addmm, baddbmm, linear in every dtype
# ----------------------------------------------------------------------------------
@dtypes
@pytest.mark.parametrize("layout", ["NT", "TN"])
def test_mm(layout, dtype, device):
    a, b = _grad(*make_operands(19, 23, 37, layout, dtype, device))
    assert_matches_reference(tritongemm.mm, torch.mm, a, b)


@dtypes
@pytest.mark.parametrize("layout", ["NN", "TS"])
def test_bmm(layout, dtype, device):
    a, b = _grad(*make_operands(11, 13, 21, layout, dtype, device, batch=(3,)))
    assert_matches_reference(tritongemm.bmm, torch.bmm, a, b)


# input shape, beta, alpha
ADDMM_CASES = {
    "full": ((15, 13), 1, 1),
    "row-bias": ((13,), 0.5, -2.0),
    "1xN": ((1, 13), -1.5, 1),
    "Mx1": ((15, 1), 2, 0.25),
    "scalar": ((), 1, 3),
    "beta0": ((15, 13), 0, 1.5),
}


def _addend_cases(table):
    """Every dtype for the "full" case, one dtype (in turn) for each other case."""
    return [
        pytest.param(name, dtype, id=f"{name}-{DTYPE_IDS[dtype]}")
        for i, name in enumerate(table)
        for dtype in (DTYPES if name == "full" else [DTYPES[i % len(DTYPES)]])
    ]


@pytest.mark.parametrize("name, dtype", _addend_cases(ADDMM_CASES))
def test_addmm(name, dtype, device):
    input_shape, beta, alpha = ADDMM_CASES[name]
    inp = random_tensor(input_shape, dtype, device)
    a, b = make_operands(15, 13, 22, "TN", dtype, device)
    _grad(inp, a, b)
    assert_matches_reference(tritongemm.addmm, torch.addmm, inp, a, b, beta=beta, alpha=alpha)


# input shape, beta, alpha
BADDBMM_CASES = {
    "full": ((3, 11, 13), 1, 1),
    "per-matrix": ((11, 13), 0.5, 2.0),
    "row-bias": ((13,), -1, 1),
    "1x1xN": ((1, 1, 13), 1, -0.5),
    "beta0": ((3, 11, 13), 0, 1),
}


@pytest.mark.parametrize("name, dtype", _addend_cases(BADDBMM_CASES))
def test_baddbmm(name, dtype, device):
    input_shape, beta, alpha = BADDBMM_CASES[name]
    inp = random_tensor(input_shape, dtype, device)
    a, b = make_operands(11, 13, 18, "NT", dtype, device, batch=(3,))
    _grad(inp, a, b)
    assert_matches_reference(tritongemm.baddbmm, torch.baddbmm, inp, a, b, beta=beta, alpha=alpha)


# input shape, weight shape, bias shape (None: no bias)
LINEAR_CASES = {
    "2d-bias": ((15, 24), (10, 24), (10,)),
    "2d-nobias": ((15, 24), (10, 24), None),
    "3d-bias": ((2, 7, 24), (10, 24), (10,)),
    "1d-input": ((24,), (10, 24), (10,)),
    "1d-weight": ((2, 7, 24), (24,), ()),
    "2d-bias-broadcast": ((15, 24), (10, 24), (1, 10)),
}


def _linear_cases():
    return [
        pytest.param(name, dtype, id=f"{name}-{DTYPE_IDS[dtype]}")
        for i, name in enumerate(LINEAR_CASES)
        for dtype in (DTYPES if name == "3d-bias" else [DTYPES[i % len(DTYPES)]])
    ]


@pytest.mark.parametrize("name, dtype", _linear_cases())
def test_linear(name, dtype, device):
    x_shape, w_shape, bias_shape = LINEAR_CASES[name]
    x = random_tensor(x_shape, dtype, device)
    w = random_tensor(w_shape, dtype, device)
    bias = random_tensor(bias_shape, dtype, device) if bias_shape is not None else None
    _grad(x, w, *([bias] if bias is not None else []))
    assert_matches_reference(tritongemm.linear, F.linear, x, w, bias)


@pytest.mark.parametrize("fn", ["matmul", "mm", "addmm", "linear"])
def test_config_and_pipeline_keywords(fn, device, plans):
    """Every function takes config= (TileConfig or dict) and pipeline=, and they reach the kernel."""
    cfg = tritongemm.TileConfig(16, 16, 16, 4, 2, 3)
    a, b = make_operands(17, 18, 20, "NN", torch.float32, device)
    bias = random_tensor((18,), torch.float32, device)
    call = {
        "matmul": lambda **kw: tritongemm.matmul(a, b, **kw),
        "mm": lambda **kw: tritongemm.mm(a, b, **kw),
        "addmm": lambda **kw: tritongemm.addmm(bias, a, b, **kw),
        "linear": lambda **kw: tritongemm.linear(a, b.t(), bias, **kw),
    }[fn]
    ref = (
        torch.addmm(bias.double(), a.double(), b.double())
        if fn in ("addmm", "linear")
        else a.double() @ b.double()
    )
    assert_close(call(config=cfg.to_dict(), pipeline="double_buffer"), ref)
    assert plans[-1]["config"] == cfg.with_pipeline("double_buffer")


def test_repeated_shapes_with_new_values_and_scalars(device):
    """Calls that share shapes and strides (the dispatcher may reuse a plan) still use their own
    data, alpha and beta, including beta=0 after beta!=0."""
    dtype = torch.float32
    for beta, alpha in [(0.5, 2.0), (0, 2.0), (1, 1), (-1, 3.0), (1, 1)]:
        inp = random_tensor((15, 13), dtype, device)
        a, b = make_operands(15, 13, 22, "NT", dtype, device)
        assert_matches_reference(tritongemm.addmm, torch.addmm, inp, a, b, beta=beta, alpha=alpha)


def test_outputs_are_poisoned(device, monkeypatch):
    """The suite's own guard: outputs start as NaN, so a kernel that skips elements fails.

    (conftest sets TRITONGEMM_POISON_OUTPUTS=1; here no kernel runs at all.)
    """
    monkeypatch.setattr(launch, "gemm", lambda call, a, b, out, *rest: out)
    a, b = make_operands(5, 6, 7, "NN", torch.float32, device)
    assert tritongemm.matmul(a, b).isnan().all()
    assert tritongemm.addmm(random_tensor((6,), torch.float32, device), a, b).isnan().all()


# ----------------------------------------------------------------------------------
# out=
# ----------------------------------------------------------------------------------
def _out_call(fn, dtype, device):
    """(our call taking out=, the float64 reference) for each function with out=."""
    a, b = make_operands(13, 17, 19, "NT", dtype, device)
    ba, bb = make_operands(13, 17, 19, "TN", dtype, device, batch=(2,))
    inp = random_tensor((13, 17), dtype, device)
    binp = random_tensor((2, 13, 17), dtype, device)
    d = torch.float64
    return {
        "matmul": (lambda out: tritongemm.matmul(a, b, out=out), a.to(d) @ b.to(d)),
        "matmul-batched": (lambda out: tritongemm.matmul(ba, bb, out=out), ba.to(d) @ bb.to(d)),
        "mm": (lambda out: tritongemm.mm(a, b, out=out), a.to(d) @ b.to(d)),
        "bmm": (lambda out: tritongemm.bmm(ba, bb, out=out), ba.to(d) @ bb.to(d)),
        "addmm": (
            lambda out: tritongemm.addmm(inp, a, b, beta=0.5, alpha=2, out=out),
            torch.addmm(inp.to(d), a.to(d), b.to(d), beta=0.5, alpha=2),
        ),
        "baddbmm": (
            lambda out: tritongemm.baddbmm(binp, ba, bb, beta=-1, out=out),
            torch.baddbmm(binp.to(d), ba.to(d), bb.to(d), beta=-1),
        ),
    }[fn]


OUT_FNS = ["matmul", "matmul-batched", "mm", "bmm", "addmm", "baddbmm"]


@pytest.mark.parametrize("fn", OUT_FNS)
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32], ids=DTYPE_IDS.get)
def test_out_nan_filled(fn, dtype, device):
    """out= is written in place, every element (it starts as NaN), and returned."""
    call, ref = _out_call(fn, dtype, device)
    out = nan_tensor(ref.shape, dtype, device)
    result = call(out)
    assert result is out
    assert_close(out, ref)


@pytest.mark.parametrize("fn", OUT_FNS)
def test_out_non_contiguous_view(fn, device):
    """out= a stepped view: the result lands in the view, the elements between stay untouched."""
    dtype = torch.float32
    call, ref = _out_call(fn, dtype, device)
    out, buf = strided_out(ref.shape, dtype, device)
    result = call(out)
    assert result is out
    assert_close(out, ref)
    assert buf[..., 1::2].isnan().all(), "wrote outside the out view"


def test_out_transposed_view(device):
    dtype = torch.float32
    call, ref = _out_call("mm", dtype, device)
    out = nan_tensor(ref.shape[::-1], dtype, device).t()
    assert call(out) is out
    assert_close(out, ref)


def test_out_folded_batch_non_contiguous(device):
    """(B, M, K) @ (K, N) into an out whose rows cannot be viewed as one (B*M, N) matrix: the
    library must not take its one-GEMM fold and leave out unwritten."""
    dtype = torch.float32
    a = random_tensor((2, 9, 17), dtype, device)
    b = random_tensor((17, 12), dtype, device)
    out = nan_tensor((9, 2, 12), dtype, device).transpose(0, 1)  # batch stride 12, row stride 24
    assert tritongemm.matmul(a, b, out=out) is out
    assert_close(out, a.double() @ b.double())


@pytest.mark.parametrize(
    "a_shape, b_shape",
    [((17,), (17, 9)), ((9, 17), (17,)), ((3, 9, 17), (17,))],
    ids=["vec.mat", "mat.vec", "batch.vec"],
)
def test_out_matmul_1d_operand(a_shape, b_shape, device):
    dtype = torch.float32
    a, b = random_tensor(a_shape, dtype, device), random_tensor(b_shape, dtype, device)
    ref = a.double() @ b.double()
    out = nan_tensor(ref.shape, dtype, device)
    assert tritongemm.matmul(a, b, out=out) is out
    assert_close(out, ref)


@pytest.mark.parametrize("fn", ["addmm", "baddbmm"])
def test_out_is_the_input(fn, device):
    """torch.addmm(c, a, b, out=c): accumulate in place (each element reads its addend, then is written)."""
    dtype = torch.float32
    batch = (2,) if fn == "baddbmm" else ()
    a, b = make_operands(33, 40, 19, "TN", dtype, device, batch=batch)
    c = random_tensor((*batch, 33, 40), dtype, device)
    ref = getattr(torch, fn)(c.double(), a.double(), b.double(), beta=0.5, alpha=-1)
    cfg = tritongemm.TileConfig(16, 16, 16, 2, 2, 2)  # many tiles
    assert getattr(tritongemm, fn)(c, a, b, beta=0.5, alpha=-1, config=cfg, out=c) is c
    assert_close(c, ref)


def test_out_empty_is_resized(device):
    """As in torch, an out with no elements is resized to the result's shape."""
    call, ref = _out_call("mm", torch.float32, device)
    out = torch.empty(0, dtype=torch.float32, device=device)
    assert call(out) is out
    assert_close(out, ref)


# ----------------------------------------------------------------------------------
# out_dtype: fp32 results from 16-bit operands
# ----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "in_dtype, out_dtype",
    [
        (torch.float16, torch.float32),
        (torch.bfloat16, torch.float32),
        (torch.float32, torch.float16),
        (torch.float64, torch.float32),
    ],
    ids=["fp16-fp32", "bf16-fp32", "fp32-fp16", "fp64-fp32"],
)
def test_out_dtype(in_dtype, out_dtype, device):
    a, b = _grad(*make_operands(17, 19, 40, "NT", in_dtype, device))
    out = tritongemm.matmul(a, b, out_dtype=out_dtype)
    ref_a, ref_b = a.detach().double().requires_grad_(), b.detach().double().requires_grad_()
    ref = ref_a @ ref_b
    scale = ref_a.detach().abs() @ ref_b.detach().abs()
    assert_close(out, ref, scale=scale, dtype=out_dtype)
    # Backward rounds the incoming gradient to the operands' dtype, then runs in it.
    grad_out = random_tensor(out.shape, out_dtype, device)
    ga, gb = torch.autograd.grad(out, (a, b), grad_out)
    ra, rb = torch.autograd.grad(ref, (ref_a, ref_b), grad_out.to(in_dtype).double())
    assert_close(ga, ra, dtype=in_dtype, what="grad a")
    assert_close(gb, rb, dtype=in_dtype, what="grad b")
    # ... and into a NaN-filled out of that dtype:
    buf = nan_tensor(out.shape, out_dtype, device)
    assert tritongemm.mm(a.detach(), b.detach(), out_dtype=out_dtype, out=buf) is buf
    assert_close(buf, ref.detach(), dtype=out_dtype)


def test_out_dtype_fp32_is_more_accurate_than_fp16(device):
    """out_dtype=float32 keeps the fp32 accumulator: far below fp16's rounding of the result."""
    a, b = make_operands(32, 32, 64, "NN", torch.float16, device)
    ref = a.double() @ b.double()
    err16 = relative_error(tritongemm.matmul(a, b), ref)
    err32 = relative_error(tritongemm.matmul(a, b, out_dtype=torch.float32), ref)
    assert err32 < TOLERANCES[torch.float32] < err16


# ----------------------------------------------------------------------------------
# NaN and Inf: as in torch
# ----------------------------------------------------------------------------------
def _assert_same_specials(out, ref):
    """NaN where torch has NaN, +-Inf where it has +-Inf, close elsewhere."""
    ref = ref.to(out.device)
    assert torch.equal(out.isnan(), ref.isnan()), "NaN positions differ from torch"
    assert torch.equal(out.isinf(), ref.isinf()), "Inf positions differ from torch"
    inf = ref.isinf()
    assert torch.equal(out[inf].sign(), ref[inf].sign().to(out.dtype)), "Inf signs differ"
    finite = ref.isfinite()
    assert_close(out[finite], ref[finite], dtype=out.dtype)


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")  # numpy, in the interpreter
@dtypes
def test_nan_and_inf_propagate(dtype, device):
    a, b = make_operands(20, 18, 35, "TN", dtype, device)
    a[3, 7] = float("nan")  # row 3 of the result: NaN
    a[5, 30] = float("inf")  # row 5: +-Inf, the sign of b's row 30
    b[2, 11] = float("-inf")  # column 11: +-Inf, and NaN where it meets row 5's Inf of the other sign
    out = tritongemm.matmul(a, b, config=tritongemm.TileConfig(16, 16, 16, 8, 2, 2))
    _assert_same_specials(out, a.double() @ b.double())
    assert out[3].isnan().all() and out[5].isinf().sum() > 0


@pytest.mark.parametrize("special", ["nan", "inf"])
@pytest.mark.parametrize("fn", ["addmm", "baddbmm"])
def test_beta0_ignores_nan_and_inf_in_input(fn, special, device):
    """torch's rule: with beta=0 the input's values are not read (NaN * 0 does not happen)."""
    dtype = torch.float32
    a, b = make_operands(9, 11, 13, "NN", dtype, device, batch=(2,) if fn == "baddbmm" else ())
    inp = random_tensor(a.shape[:-1] + (11,), dtype, device)
    inp[..., 1, 2] = float(special)
    ours = getattr(tritongemm, fn)(inp, a, b, beta=0, alpha=2)
    theirs = getattr(torch, fn)(inp.double(), a.double(), b.double(), beta=0, alpha=2)
    assert theirs.isfinite().all()
    assert_close(ours, theirs)


@pytest.mark.parametrize("fn", ["addmm", "baddbmm", "linear"])
def test_nan_in_addend_propagates(fn, device):
    dtype = torch.float32
    batch = (2,) if fn == "baddbmm" else ()
    a, b = make_operands(9, 11, 13, "NN", dtype, device, batch=batch)
    bias = random_tensor((11,), dtype, device)
    bias[4] = float("nan")
    if fn == "linear":
        out, ref = tritongemm.linear(a, b.mT, bias), F.linear(a.double(), b.double().mT, bias.double())
    else:
        out = getattr(tritongemm, fn)(bias, a, b, beta=0.5)
        ref = getattr(torch, fn)(bias.double(), a.double(), b.double(), beta=0.5)
    _assert_same_specials(out, ref)
    assert out[..., 4].isnan().all()


# ----------------------------------------------------------------------------------
# TF32 follows torch's switch
# ----------------------------------------------------------------------------------
@pytest.mark.parametrize("allow", [False, True], ids=["ieee", "tf32"])
def test_dot_precision_follows_torch_flag(allow, restore_tf32):
    """Any device: fp32 GEMMs ask Triton for tf32 exactly when torch allows it; other dtypes never."""
    torch.backends.cuda.matmul.allow_tf32 = allow
    assert semantics.dot_precision(torch.float32) == ("tf32" if allow else "ieee")
    for dtype in (torch.float16, torch.bfloat16, torch.float64):
        assert semantics.dot_precision(dtype) == "ieee"


@pytest.mark.parametrize(
    "name, value, expected",
    [
        ("allow_tf32", False, False),
        ("allow_tf32", True, True),
        ("fp32_precision", "tf32", True),
        ("fp32_precision", "ieee", False),
    ],
)
def test_tf32_switch_is_read_through_either_torch_api(name, value, expected, restore_tf32):
    """The legacy ``allow_tf32`` and the newer ``fp32_precision`` both decide, read through torch's C
    getters where it has them (``semantics._tf32_queries``), and those agree with the properties."""
    matmul = torch.backends.cuda.matmul
    if name == "fp32_precision" and not hasattr(torch._C, "_get_fp32_precision_getter"):
        pytest.skip("this torch has no fp32_precision API")
    setattr(matmul, name, value)
    assert semantics.tf32_enabled() is expected
    precision, allow = semantics._tf32_queries()
    assert precision() == getattr(matmul, "fp32_precision", None)
    if name == "allow_tf32":  # torch refuses to read the legacy flag after the new API set it
        assert allow() == matmul.allow_tf32 == value


@pytest.mark.gpu
@pytest.mark.parametrize("allow", [False, True], ids=["ieee", "tf32"])
def test_fp32_tf32_on_gpu(allow, device, restore_tf32):
    """On the GPU fp32 is IEEE unless torch allows TF32; with TF32 the error is TF32-sized."""
    torch.backends.cuda.matmul.allow_tf32 = allow
    a, b = make_operands(128, 128, 256, "NN", torch.float32, device)
    out = tritongemm.matmul(a, b)
    ref = a.double() @ b.double()
    err = relative_error(out, ref)
    if allow:
        # TF32's 10-bit mantissa gives ~3e-4; IEEE fp32 would be ~1e-7: prove TF32 ran.
        assert TOLERANCES[torch.float32] < err < TF32_TOLERANCE
    else:
        assert err < TOLERANCES[torch.float32]
    assert_close(out, ref, scale=a.double().abs() @ b.double().abs())
