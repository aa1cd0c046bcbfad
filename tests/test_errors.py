"""Bad inputs raise what torch raises (RuntimeError, TypeError), with messages
that name the function, the shapes / dtypes / devices involved and the rule.
"""

import pytest
import torch

import tritongemm
from tritongemm import ConfigError, TileConfig, UnsupportedInputError
from tritongemm.request import fallback
from tritongemm.testing import random_tensor

F32 = torch.float32


@pytest.fixture
def t(device):
    """Random float32 tensors on the test device, by shape."""
    return lambda *shape, dtype=F32: random_tensor(shape, dtype, device)


# ----------------------------------------------------------------------------------
# Shapes
# ----------------------------------------------------------------------------------
# id -> (call on the `t` factory, substrings the message must contain)
SHAPE_ERRORS = {
    "matmul-inner": (lambda t: tritongemm.matmul(t(3, 4), t(5, 6)), ["matmul", "(3, 4)", "(5, 6)", "4 != 5"]),
    "matmul-vec": (lambda t: tritongemm.matmul(t(3), t(4)), ["matmul", "(3,)", "(4,)"]),
    "matmul-batched": (
        lambda t: tritongemm.matmul(t(2, 3, 4), t(2, 5, 6)),
        ["(2, 3, 4)", "(2, 5, 6)", "4 != 5"],
    ),
    "matmul-broadcast": (
        lambda t: tritongemm.matmul(t(2, 3, 4), t(3, 4, 5)),
        ["broadcast", "(2, 3, 4)", "(3, 4, 5)"],
    ),
    "mm-inner": (lambda t: tritongemm.mm(t(3, 4), t(5, 6)), ["mm", "(3, 4)", "(5, 6)", "4 != 5"]),
    "mm-3d": (lambda t: tritongemm.mm(t(2, 3, 4), t(4, 5)), ["mm", "(2, 3, 4)", "2-D"]),
    "bmm-inner": (lambda t: tritongemm.bmm(t(2, 3, 4), t(2, 5, 6)), ["bmm", "(2, 3, 4)", "(2, 5, 6)"]),
    "bmm-batch": (
        lambda t: tritongemm.bmm(t(2, 3, 4), t(3, 4, 5)),
        ["bmm", "2 and 3", "(2, 3, 4)", "(3, 4, 5)"],
    ),
    "bmm-2d": (lambda t: tritongemm.bmm(t(3, 4), t(4, 5)), ["bmm", "3-D", "(3, 4)"]),
    "addmm-inner": (lambda t: tritongemm.addmm(t(3, 6), t(3, 4), t(5, 6)), ["addmm", "(3, 4)", "(5, 6)"]),
    "addmm-input": (lambda t: tritongemm.addmm(t(4, 6), t(3, 4), t(4, 6)), ["addmm", "(4, 6)", "(3, 6)"]),
    "baddbmm-batch": (
        lambda t: tritongemm.baddbmm(t(2, 3, 5), t(2, 3, 4), t(3, 4, 5)),
        ["baddbmm", "2 and 3"],
    ),
    "baddbmm-input": (
        lambda t: tritongemm.baddbmm(t(2, 4, 5), t(2, 3, 4), t(2, 4, 5)),
        ["baddbmm", "(2, 4, 5)"],
    ),
    "linear-features": (
        lambda t: tritongemm.linear(t(3, 4), t(6, 5)),
        ["linear", "(3, 4)", "(6, 5)", "4", "5"],
    ),
    "linear-bias": (lambda t: tritongemm.linear(t(3, 4), t(6, 4), t(5)), ["linear", "(5,)"]),
}


@pytest.mark.parametrize("case", list(SHAPE_ERRORS))
def test_shape_errors(case, t):
    call, words = SHAPE_ERRORS[case]
    with pytest.raises(RuntimeError) as info:
        call(t)
    for word in words:
        assert word in str(info.value), f"{word!r} missing from: {info.value}"


ZERO_D = {
    "matmul-a": lambda t: tritongemm.matmul(t(), t(3)),
    "matmul-b": lambda t: tritongemm.matmul(t(3, 4), t()),
    "mm": lambda t: tritongemm.mm(t(), t(3, 4)),
    "bmm": lambda t: tritongemm.bmm(t(2, 3, 4), t()),
    "addmm": lambda t: tritongemm.addmm(t(3, 5), t(), t(4, 5)),
    "baddbmm": lambda t: tritongemm.baddbmm(t(2, 3, 5), t(2, 3, 4), t()),
    "linear": lambda t: tritongemm.linear(t(), t(3, 4)),
}


@pytest.mark.parametrize("case", list(ZERO_D))
def test_zero_dim_operands(case, t):
    """0-d operands are rejected (torch: 'both arguments to matmul need to be at least 1D')."""
    with pytest.raises(RuntimeError) as info:
        ZERO_D[case](t)
    assert "()" in str(info.value) or "0D" in str(info.value) or "0-D" in str(info.value), str(info.value)


# ----------------------------------------------------------------------------------
# Dtypes and devices
# ----------------------------------------------------------------------------------
@pytest.mark.parametrize("fn", ["matmul", "mm", "bmm", "addmm", "baddbmm", "linear"])
def test_dtype_mismatch(fn, t):
    a3, b3 = t(2, 3, 4), t(2, 4, 5, dtype=torch.float16)
    args = {
        "matmul": (t(3, 4), t(4, 5, dtype=torch.float16)),
        "mm": (t(3, 4), t(4, 5, dtype=torch.float16)),
        "bmm": (a3, b3),
        "addmm": (t(3, 5, dtype=torch.bfloat16), t(3, 4), t(4, 5)),
        "baddbmm": (t(2, 3, 5), a3, b3),
        "linear": (t(3, 4), t(5, 4, dtype=torch.float64)),
    }[fn]
    with pytest.raises(RuntimeError) as info:
        getattr(tritongemm, fn)(*args)
    message = str(info.value)
    assert fn in message and "dtype" in message
    dtypes = {str(x.dtype) for x in args}
    assert all(d in message for d in dtypes), message


@pytest.mark.parametrize(
    "dtype",
    [torch.int32, torch.int64, torch.bool, torch.complex64],
    ids=["int32", "int64", "bool", "complex64"],
)
def test_unsupported_dtypes(dtype, device):
    a = torch.ones(3, 4, dtype=dtype, device=device)
    b = torch.ones(4, 5, dtype=dtype, device=device)
    with pytest.raises(UnsupportedInputError) as info:
        tritongemm.matmul(a, b)
    assert isinstance(info.value, RuntimeError)
    assert str(dtype) in str(info.value) and "float16" in str(info.value)


def test_unsupported_out_dtype(t):
    with pytest.raises(RuntimeError, match="out_dtype"):
        tritongemm.matmul(t(3, 4), t(4, 5), out_dtype=torch.int32)


def test_device_mismatch(t):
    """Operands on two devices (here: the test device and meta, available everywhere)."""
    a = t(3, 4)
    b = torch.empty(4, 5, device="meta")
    with pytest.raises(RuntimeError) as info:
        tritongemm.mm(a, b)
    assert "same device" in str(info.value) and "meta" in str(info.value) and str(a.device) in str(info.value)


@pytest.mark.gpu
def test_device_mismatch_cpu_and_cuda(device):
    a = torch.randn(3, 4, device=device)
    b = torch.randn(4, 5)
    with pytest.raises(RuntimeError, match="same device"):
        tritongemm.matmul(a, b)


def test_device_tritongemm_does_not_drive(device):
    """CUDA tensors under the interpreter, CPU tensors without it: UnsupportedInputError saying why."""
    other = "cpu" if device.type == "cuda" else "cuda"
    if other == "cuda" and not torch.cuda.is_available():
        pytest.skip("interpreter mode without a CUDA device: every tensor tritongemm can see is CPU")
    a, b = torch.randn(3, 4, device=other), torch.randn(4, 5, device=other)
    with pytest.raises(UnsupportedInputError, match="TRITON_INTERPRET"):
        tritongemm.matmul(a, b)


@pytest.mark.parametrize("interpreting", [True, False], ids=["interpreter", "compiled"])
def test_unsupported_reason_by_mode(interpreting, monkeypatch):
    """The rule behind the test above, on any machine: which device each mode can drive."""
    monkeypatch.setattr(fallback, "interpreter_enabled", lambda: interpreting)
    cpu = torch.ones(2, 2)
    reason = fallback.unsupported_reason(cpu, cpu)
    if interpreting:
        assert reason is None
    else:
        assert "CPU tensor" in reason and "TRITON_INTERPRET" in reason
    assert "meta" in fallback.unsupported_reason(torch.ones(2, 2, device="meta"))
    assert "dtype" in fallback.unsupported_reason(cpu.int(), cpu.int())
    assert "mixed dtypes" in fallback.unsupported_reason(cpu, cpu.double())
    assert "non-tensor" in fallback.unsupported_reason(cpu, 3.0)


def test_non_tensor_arguments(t):
    with pytest.raises(TypeError, match="other"):
        tritongemm.matmul(t(3, 4), [[1.0]])
    with pytest.raises(TypeError, match="out"):
        tritongemm.mm(t(3, 4), t(4, 5), out=[0.0])


# ----------------------------------------------------------------------------------
# out=
# ----------------------------------------------------------------------------------
def test_out_wrong_shape_is_resized_with_torchs_warning(t):
    """torch resizes a non-empty out of the wrong shape (warning that this is deprecated) and writes it."""
    a, b = t(3, 4), t(4, 5)
    for fn, ref in ((tritongemm.mm, torch.mm), (tritongemm.matmul, torch.matmul)):
        out = t(5, 3)
        with pytest.warns(UserWarning, match="resized"):
            fn(a, b, out=out)
        assert out.shape == (3, 5)
        assert torch.allclose(out, ref(a, b), rtol=1e-5, atol=1e-5)


def test_out_wrong_shape_batched_is_resized(t):
    out = t(2, 4, 3)
    with pytest.warns(UserWarning, match="resized"):
        tritongemm.bmm(t(2, 3, 5), t(2, 5, 4), out=out)
    assert out.shape == (2, 3, 4) and not out.isnan().any()
    a, b, out = t(5), t(5, 3), t(1, 3)  # the result is (3,)
    with pytest.warns(UserWarning, match="resized"):
        tritongemm.matmul(a, b, out=out)
    assert out.shape == (3,) and torch.allclose(out, a @ b, rtol=1e-5, atol=1e-5)


def test_out_wrong_dtype_and_device(t):
    with pytest.raises(RuntimeError, match="dtype"):
        tritongemm.mm(t(3, 4), t(4, 5), out=t(3, 5, dtype=torch.float64))
    with pytest.raises(RuntimeError, match="meta"):
        tritongemm.mm(t(3, 4), t(4, 5), out=torch.empty(3, 5, device="meta"))


def test_out_with_inputs_requiring_grad(t):
    """As torch: out= functions do not support autograd."""
    a = t(3, 4).requires_grad_(True)
    with pytest.raises(RuntimeError, match="automatic differentiation"):
        tritongemm.mm(a, t(4, 5), out=t(3, 5))
    with torch.no_grad():
        out = t(3, 5)
        assert tritongemm.mm(a, t(4, 5), out=out) is out


# ----------------------------------------------------------------------------------
# Scalars, configs, pipelines
# ----------------------------------------------------------------------------------
def test_bad_scalars(t):
    with pytest.raises(RuntimeError, match="complex"):
        tritongemm.addmm(t(3, 5), t(3, 4), t(4, 5), alpha=1j)
    with pytest.raises(RuntimeError, match="scalar"):
        tritongemm.addmm(t(3, 5), t(3, 4), t(4, 5), beta=t(2))


def test_bad_config_and_pipeline(t):
    a, b = t(3, 4), t(4, 5)
    too_big = TileConfig(256, 256, 64, 8, 8, 4)  # 256 KiB of fp32 tiles x 4 stages
    with pytest.raises(ConfigError, match="shared memory"):
        tritongemm.matmul(a, b, config=too_big)
    with pytest.raises(ConfigError, match="unknown fields"):
        tritongemm.matmul(a, b, config={"block_m": 16, "tiles": 3})
    with pytest.raises(TypeError, match="TileConfig"):
        tritongemm.matmul(a, b, config="big")
    with pytest.raises(ConfigError, match="unknown pipeline"):
        tritongemm.matmul(a, b, pipeline="quadruple_buffer")
    with pytest.raises(ConfigError, match="stage count"):
        tritongemm.matmul(a, b, pipeline=9)


# ----------------------------------------------------------------------------------
# Sparse and nested tensors
# ----------------------------------------------------------------------------------
def _not_strided(kind: str, device):
    dense = random_tensor((4, 8), F32, device)
    if kind == "nested":
        return torch.nested.nested_tensor([dense[:2], dense[2:]])
    return dense.to_sparse() if kind == "sparse_coo" else dense.to_sparse_csr()


@pytest.mark.parametrize(
    "kind, where",
    [("sparse_coo", "input"), ("sparse_csr", "input"), ("nested", "input"), ("sparse_coo", "weight")],
)
@pytest.mark.parametrize("fn", ["linear", "matmul"])
def test_sparse_and_nested_operands_are_refused_by_name_even_after_an_entry(kind, where, fn, device):
    """Not a crash inside the fast path's key nor a wrong answer: torch's NotImplementedError kind, with
    the layout named, for either operand, also once a dense call of the same shapes has an entry."""
    x, w = random_tensor((4, 8), F32, device), random_tensor((6, 8), F32, device)
    call = tritongemm.linear if fn == "linear" else (lambda a, b: tritongemm.matmul(a, b.mT))
    call(x, w), call(x, w)  # a dense entry of the same shapes
    odd = _not_strided(kind, device)
    args = (odd, w) if where == "input" else (x, w.to_sparse())
    with pytest.raises(UnsupportedInputError, match=rf"{fn}: .*(nested|sparse).* tensors are not supported"):
        call(*args)


@pytest.mark.parametrize("kind", ["sparse_coo", "sparse_csr", "nested"])
def test_converted_linear_runs_torchs_kernel_on_sparse_and_nested_input(kind, device):
    """``nn.Linear`` falls back to torch for what it cannot run: the same result as the stock layer."""
    stock = torch.nn.Linear(8, 6, device=device)
    layer = tritongemm.nn.convert(torch.nn.Linear(8, 6, device=device))
    layer.load_state_dict(stock.state_dict())
    dense = random_tensor((4, 8), F32, device)
    layer(dense), layer(dense)  # a dense entry first
    x = _not_strided(kind, device)
    out, ref = layer(x), stock(x)
    if kind == "nested":
        assert out.is_nested
        for o, r in zip(out.unbind(), ref.unbind()):
            assert torch.equal(o, r)
    else:
        assert torch.equal(out, ref)
