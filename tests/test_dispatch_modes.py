"""Under a ``TorchDispatchMode`` (``FlopCounterMode``, memory trackers, selective activation
checkpointing) the GEMMs run as tritongemm's ops, which the mode sees, not as direct launches it
would not: a converted model's FLOP count is the stock model's, fast paths warm or not."""

import copy

import pytest
import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

import tritongemm
from tritongemm.testing import assert_close, random_tensor


def _flops(fn, *args):
    with FlopCounterMode(display=False) as counter:
        out = fn(*args)
    return counter.get_total_flops(), out


@pytest.mark.parametrize("warm", [False, True], ids=["cold", "warm"])
def test_a_converted_models_flops_are_the_stock_models(warm, device):
    torch.manual_seed(0)
    stock = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 8)).to(device)
    model = tritongemm.nn.convert(copy.deepcopy(stock))
    x = random_tensor((4, 6, 16), torch.float32, device).requires_grad_(True)
    if warm:  # fast-path entries made, forward and backward
        for _ in range(2):
            model(x).sum().backward()

    def step(m):
        y = m(x)
        y.sum().backward()
        return y

    want, ref = _flops(step, stock)
    got, out = _flops(step, model)
    assert want > 0 and got == want
    assert_close(out, ref.double())


def test_functions_count_their_gemms(device):
    x = random_tensor((8, 16), torch.float32, device)
    w1, w2 = random_tensor((24, 16), torch.float32, device), random_tensor((16, 24), torch.float32, device)
    gemm = 2 * 8 * 24 * 16  # one (8 x 16) @ (16 x 24)
    x8, w8, one = x.to(torch.float8_e4m3fn), w1.to(torch.float8_e4m3fn), torch.ones((), device=device)
    cases = {
        "matmul": (lambda: tritongemm.matmul(x, w1.T), gemm, lambda: x @ w1.T),
        "linear+gelu": (lambda: tritongemm.linear(x, w1, activation="gelu"), gemm, lambda: F.gelu(x @ w1.T)),
        "gated_linear": (
            lambda: tritongemm.gated_linear(x, w1, w1),
            2 * gemm,
            lambda: F.silu(x @ w1.T) * (x @ w1.T),
        ),
        "mlp": (lambda: tritongemm.mlp(x, w1, None, w2, None, activation="relu"), 2 * gemm, None),
        "scaled_mm": (
            lambda: tritongemm.scaled_mm(x8, w8.t(), one, one, out_dtype=torch.float32),
            gemm,
            None,
        ),
    }
    for name, (fn, want, ref) in cases.items():
        got, out = _flops(fn)
        assert got == want, (name, got, want)
        if ref is not None:
            assert_close(out, ref().double(), what=name)
