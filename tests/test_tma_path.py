"""The Hopper (TMA descriptor) kernel and its fallback to the pointer kernel.

Triton's interpreter runs host-built tensor descriptors too, so the TMA
kernel's indexing (transposed tiles, persistent tile loop, split epilogue) is
checked here on the CPU; the compiled path is checked on the GPU by the same
tests.  Operands TMA cannot describe (a leading stride that is not a multiple
of 16 bytes, a batch, fp32) must go to the pointer kernel with the reason
reported, never raise and never copy.
"""

import pytest
import torch
from conftest import grid_cases

import tritongemm
from tritongemm import TileConfig, explain
from tritongemm.testing import DTYPE_IDS, assert_close, make_operands, random_tensor

TMA = TileConfig(32, 32, 16, 2, 4, 3, kernel="tma")
TMA_PERSISTENT = TileConfig(32, 32, 16, 2, 4, 3, kernel="tma_persistent", epilogue_subtile=True)


def _needs_tma(device):
    if device.type == "cuda" and torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("TMA needs sm_90+; the pointer fallback is tested elsewhere")


@pytest.mark.parametrize("cfg", [TMA, TMA_PERSISTENT], ids=["tma", "tma-persistent-subtile"])
@pytest.mark.parametrize("layout", ["NN", "NT", "TN", "TT"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_tma_kernel_matches_reference(device, cfg, layout, dtype):
    _needs_tma(device)
    a, b = make_operands(72, 88, 40, layout, dtype, device)  # ragged in M, N and K
    assert explain(a, b, config=cfg).kernel == cfg.launcher
    assert_close(tritongemm.matmul(a, b, config=cfg), a.double() @ b.double())


def test_tma_epilogue_addmm(device):
    _needs_tma(device)
    a, b = make_operands(40, 48, 64, "NN", torch.float16, device)
    bias = random_tensor((48,), torch.float16, device)
    out = tritongemm.addmm(bias, a, b, beta=2.0, alpha=0.5, config=TMA_PERSISTENT)
    assert_close(out, 2.0 * bias.double() + 0.5 * (a.double() @ b.double()))


@pytest.mark.parametrize(
    "make, reason",
    [
        (lambda d: make_operands(20, 24, 13, "NN", torch.float16, d), "not a multiple of 16 bytes"),
        (
            lambda d: (
                random_tensor((20, 64), torch.float16, d)[:, ::2],
                random_tensor((32, 24), torch.float16, d),
            ),
            "unit stride",
        ),
        (lambda d: make_operands(20, 24, 32, "NN", torch.float32, d), "float16/bfloat16"),
        (
            lambda d: (
                random_tensor((2, 20, 32), torch.float16, d),
                random_tensor((2, 32, 24), torch.float16, d),
            ),
            "batched",
        ),
        (
            lambda d: (
                random_tensor((20, 33), torch.float16, d)[:, 1:],
                random_tensor((32, 24), torch.float16, d),
            ),
            "16-byte aligned",
        ),
    ],
    ids=["odd-K-stride", "no-unit-stride", "fp32", "batched", "misaligned-pointer"],
)
def test_tma_falls_back_to_pointer_kernel(device, make, reason):
    a, b = make(device)
    plan = explain(a, b, config=TMA)
    assert plan.kernel == "pointer", plan.describe()
    assert reason in plan.fallback, plan.fallback
    assert_close(tritongemm.matmul(a, b, config=TMA), a.double() @ b.double())


def test_fallback_makes_no_copy(device):
    """The pointer kernel reads the user's strides: no operand is ever made contiguous."""
    a, b = make_operands(20, 24, 13, "TT", torch.float16, device)
    before = (a.data_ptr(), b.data_ptr(), a.stride(), b.stride())
    tritongemm.matmul(a, b, config=TMA)
    assert (a.data_ptr(), b.data_ptr(), a.stride(), b.stride()) == before


TMA_STREAM_K = TileConfig(32, 32, 16, 2, 4, 3, kernel="tma_persistent", stream_k=True)


@pytest.mark.parametrize(
    "dtype, layout, sm_count",
    grid_cases(
        dict(dtype=[torch.float16, torch.bfloat16], layout=["NN", "NT", "TN", "TT"], sm_count=[None, 3]),
        # (indices) by default each layout once, and each dtype with each schedule once
        keep=lambda dtype, layout, sm_count: (dtype, sm_count) == [(0, 0), (1, 1), (0, 1), (1, 0)][layout],
        ids=dict(dtype=DTYPE_IDS.get, sm_count=lambda n: "all-streamed" if n is None else "hybrid"),
    ),
)
def test_tma_stream_k_matches_reference(device, dtype, layout, sm_count, monkeypatch):
    # The TMA kernel's own Stream-K: with the real SM count every tile is split
    # between programs; with 3 "SMs" whole waves run data-parallel first.
    _needs_tma(device)
    from dataclasses import replace

    from tritongemm import launch
    from tritongemm.launch import COUNTERS as _COUNTERS

    if sm_count is not None:
        small = replace(launch.device_info(device), sm_count=sm_count)
        monkeypatch.setattr(launch, "device_info", lambda *_: small)
    launch.clear_plan_cache()
    for m, n, k in [(72, 88, 40), (64, 64, 160)]:
        a, b = make_operands(m, n, k, layout, dtype, device)
        assert explain(a, b, config=TMA_STREAM_K).kernel == "tma_persistent"
        first = tritongemm.matmul(a, b, config=TMA_STREAM_K)
        assert_close(first, a.double() @ b.double())
        assert torch.equal(first, tritongemm.matmul(a, b, config=TMA_STREAM_K))  # fixed order: same bits
        assert all(int(buf.count_nonzero()) == 0 for buf in _COUNTERS.values())
    launch.clear_plan_cache()


def test_tma_stream_k_epilogue_and_fallback(device):
    _needs_tma(device)
    a, b = make_operands(40, 48, 96, "NT", torch.float16, device)
    bias = random_tensor((48,), torch.float16, device)
    out = tritongemm.linear(a, b.mT, bias, activation="gelu", config=TMA_STREAM_K)
    assert_close(out, torch.nn.functional.gelu(a.double() @ b.double() + bias.double()))
    # Operands TMA cannot describe run the pointer kernel's Stream-K, and say why.
    a, b = make_operands(20, 24, 13, "NN", torch.float16, device)
    plan = explain(a, b, config=TMA_STREAM_K)
    assert plan.kernel == "stream_k" and "16 bytes" in plan.fallback
    assert_close(tritongemm.matmul(a, b, config=TMA_STREAM_K), a.double() @ b.double())
    # Forcing Stream-K on a TMA config keeps the TMA kernel.
    a, b = make_operands(64, 64, 64, "NN", torch.float16, device)
    assert explain(a, b, config=TMA_PERSISTENT, decomposition="stream_k").kernel == "tma_persistent"
