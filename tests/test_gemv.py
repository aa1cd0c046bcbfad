"""The GEMV kernel (one row of A, no tensor cores) against the float64 reference.

It shares split-K and the epilogue with the GEMM kernel, so the grid covers
ragged N and K, every layout, every dtype (bf16 included: no tl.dot, so no
interpreter workaround), both split-K reductions and the fused epilogue.
"""

import pytest
import torch
import torch.nn.functional as F

import tritongemm
from tritongemm import ConfigError, TileConfig, explain
from tritongemm.testing import assert_close, assert_matches_reference, make_operands, random_tensor, shape_id

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32, "fp64": torch.float64}
SHAPES = [(1, 1), (7, 3), (33, 100), (64, 256), (129, 517)]  # (N, K)
SPLITS = {"sliced": (1, False), "split3": (3, False), "split3_inline": (3, True)}


def gemv_config(block_n=16, block_k=64, split=(1, False)):
    return TileConfig(16, block_n, block_k, 8, 4, 1, split_k=split[0], split_k_inline=split[1], kernel="gemv")


@pytest.mark.parametrize("split", SPLITS)
@pytest.mark.parametrize("layout", ["NN", "NT", "TN", "TT", "SN"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: shape_id(1, *s))
def test_gemv_matches_reference(device, shape, layout, split):
    n, k = shape
    a, b = make_operands(1, n, k, layout, torch.float16, device)
    assert explain(a, b, config=gemv_config(split=SPLITS[split])).kernel == "gemv"
    out = tritongemm.matmul(a, b, config=gemv_config(split=SPLITS[split]))
    assert_close(out, a.double() @ b.double())


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("block_n", [1, 8, 32])
def test_gemv_dtypes_and_narrow_tiles(device, dtype, block_n):
    a, b = make_operands(1, 45, 150, "NT", DTYPES[dtype], device)
    out = tritongemm.matmul(a, b, config=gemv_config(block_n=block_n, block_k=128))
    assert_close(out, a.double() @ b.double())


@pytest.mark.parametrize("split", SPLITS)
def test_gemv_epilogue_bias_activation_residual(device, split):
    x = random_tensor((1, 70), torch.float32, device)
    w = random_tensor((40, 70), torch.float32, device)
    bias = random_tensor((40,), torch.float32, device)
    res = random_tensor((1, 40), torch.float32, device)
    out = tritongemm.linear(
        x, w, bias, activation="silu", residual=res, config=gemv_config(split=SPLITS[split])
    )
    assert_close(out, F.silu(x.double() @ w.double().T + bias.double()) + res.double())
    out = tritongemm.addmm(bias, x, w.T, beta=0.5, alpha=-2.0, config=gemv_config(split=SPLITS[split]))
    assert_close(out, 0.5 * bias.double() - 2.0 * (x.double() @ w.double().T))


def test_vector_times_matrix_uses_gemv(device):
    # torch.matmul semantics: a 1-D left operand is one row, and the output drops it.
    v, m = random_tensor((90,), torch.float16, device), random_tensor((90, 33), torch.float16, device)
    out = tritongemm.matmul(v, m, config=gemv_config())
    assert out.shape == (33,)
    assert_close(out, v.double() @ m.double())


def test_gemv_backward(device):
    a = random_tensor((1, 60), torch.float32, device).requires_grad_()
    b = random_tensor((60, 24), torch.float32, device).requires_grad_()
    assert_matches_reference(tritongemm.matmul, torch.matmul, a, b, ours_kwargs=dict(config=gemv_config()))


def test_gemv_falls_back_for_several_rows_or_a_batch(device):
    a, b = make_operands(3, 20, 40, "NN", torch.float16, device)
    plan = explain(a, b, config=gemv_config())
    assert plan.kernel == "pointer" and "GEMV" in plan.fallback
    assert_close(tritongemm.matmul(a, b, config=gemv_config()), a.double() @ b.double())
    a3, b3 = (
        random_tensor((2, 1, 40), torch.float16, device),
        random_tensor((2, 40, 20), torch.float16, device),
    )
    assert explain(a3, b3, config=gemv_config()).kernel == "pointer"
    assert_close(tritongemm.bmm(a3, b3, config=gemv_config()), a3.double() @ b3.double())


def test_gemv_k_zero_gives_the_addend(device):
    bias = random_tensor((9,), torch.float32, device)
    x, w = random_tensor((1, 0), torch.float32, device), random_tensor((9, 0), torch.float32, device)
    assert_close(tritongemm.linear(x, w, bias, config=gemv_config()), bias.double()[None, :])


def test_gemv_config_rules():
    assert TileConfig(16, 4, 64, kernel="gemv").launcher == "gemv"
    with pytest.raises(ConfigError, match="block_n"):
        TileConfig(16, 4, 64)  # tl.dot tiles stay >= 16
    with pytest.raises(ConfigError, match="not kernel='gemv'"):
        TileConfig(16, 16, 64, 8, 4, 1, kernel="gemv", stream_k=True)  # Stream-K runs tl.dot tiles
    assert "gemv" in TileConfig(16, 16, 512, 8, 8, 1, kernel="gemv").short()


def test_heuristic_picks_gemv_for_one_row_only():
    from tritongemm import GemmProblem, candidate_configs
    from tritongemm.device import DeviceInfo

    h100 = DeviceInfo("H100", (9, 0), 132, 232448)
    assert tritongemm.heuristic_config(GemmProblem(1, 4096, 4096, layout="NT"), h100).kernel == "gemv"
    assert tritongemm.heuristic_config(GemmProblem(2, 4096, 4096, layout="NT"), h100).kernel != "gemv"
    assert tritongemm.heuristic_config(GemmProblem(1, 4096, 4096, batch=4), h100).kernel != "gemv"
    space = list(candidate_configs(GemmProblem(1, 4096, 4096), h100))
    assert any(c.kernel == "gemv" for c in space) and any(c.kernel != "gemv" for c in space)
    for cfg in space:
        cfg.validate(h100)
