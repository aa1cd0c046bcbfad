"""The decode kernel (out = x @ W^T + bias for at most 16 rows of x) against the float64 reference.

Tiny shapes on the interpreter cover what the kernel decides per launch: K split
or not (the last slice to arrive reduces), K a multiple of the K-step or not, a
bias or none, 1 to 16 rows of x padded to 16, N ragged against the column
block, the three dtypes, and strides other than nn.Linear's.  The GPU test
checks a real LLM width against torch.
"""

import pytest
import torch
import torch.nn.functional as F

from tritongemm.launch import common
from tritongemm.launch.decode import (
    DECODE_MENU,
    SMEM_PER_BLOCK,
    DecodeConfig,
    DecodeLaunch,
    decode_configs,
    decode_gemm,
    default_decode_config,
)
from tritongemm.testing import assert_close, nan_tensor, random_tensor, relative_error, tolerance

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}
#: Small tiles (the interpreter runs programs one by one) of every kind a launch makes.
CONFIGS = {
    "unsplit": DecodeConfig(16, 32, 1, 4, 2),
    "split3": DecodeConfig(32, 32, 3, 4, 3),
    "split-wide": DecodeConfig(64, 64, 2, 4, 2),
    # More slices asked for than K has steps: one step per slice.
    "split-every-step": DecodeConfig(16, 32, 8, 4, 2),
    "tma": DecodeConfig(16, 64, 1, 4, 2, tma=True),
    "tma-split3": DecodeConfig(32, 32, 3, 4, 3, tma=True),
}
#: (N, K): N ragged against every block_n; K a multiple of 32 and 64, then of neither (but
#: of 8: rows of 16 bytes, as TMA needs).
SHAPES = {"evenK": (40, 128), "raggedK": (37, 104)}
#: Real LLM projections (N, K) the sweep times.
LLM_SHAPES = [
    (6144, 4096),
    (4096, 4096),
    (28672, 4096),
    (4096, 14336),
    (14336, 4096),
    (18944, 3584),
    (3584, 18944),
]


def reference(x, w, bias=None):
    out = x.double() @ w.double().T
    return out + bias.double() if bias is not None else out


def scale(x, w, bias=None):
    """What the rounding error of each output is relative to: the product of |operands|."""
    return reference(x.abs(), w.abs(), bias.abs() if bias is not None else None)


def operands(m, n, k, dtype, device, bias=True):
    x = random_tensor((m, k), dtype, device)
    w = random_tensor((n, k), dtype, device)
    return x, w, random_tensor((n,), dtype, device) if bias else None


@pytest.mark.parametrize("m", [1, 3, 16])
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("config", CONFIGS)
def test_decode_matches_reference(device, config, shape, m):
    n, k = SHAPES[shape]
    bias = m != 3  # each config and shape with a bias and without
    x, w, b = operands(m, n, k, torch.float16, device, bias)
    out = nan_tensor((m, n), torch.float16, device)  # every element must be written
    result = decode_gemm(x, w, b, out, **CONFIGS[config]._asdict())
    assert result is out
    assert_close(out, reference(x, w, b), scale=scale(x, w, b))


@pytest.mark.parametrize(
    "config, dtype",
    # (TMA configs take 2-byte operands: fp32 raises, test_default_config_and_edge_cases)
    [
        (c, d)
        for c in ("unsplit", "split3", "tma-split3")
        for d in DTYPES
        if not (c.startswith("tma") and d == "fp32")
    ],
)
def test_decode_dtypes(device, config, dtype):
    x, w, b = operands(5, 37, 104, DTYPES[dtype], device)
    out = decode_gemm(x, w, b, **CONFIGS[config]._asdict())  # allocated: NaN under the tests' poisoning
    assert out.dtype == DTYPES[dtype]
    assert_close(out, reference(x, w, b), scale=scale(x, w, b))


@pytest.mark.parametrize("config", ["split3", "tma-split3"])
def test_repeated_calls_are_identical_and_rearm_the_counters(device, monkeypatch, config):
    # The workspace is never zeroed: each slice writes its own slot before the last one reads it.
    nan_workspace = lambda launch, dev: torch.full(launch.ws_shape, float("nan"), device=dev)  # noqa: E731
    monkeypatch.setattr(DecodeLaunch, "workspace", nan_workspace)
    x, w, b = operands(7, 70, 192, torch.bfloat16, device)
    cfg = CONFIGS[config]._asdict()
    first = decode_gemm(x, w, b, **cfg)
    assert_close(first, reference(x, w, b), scale=scale(x, w, b))
    for _ in range(2):
        again = decode_gemm(x, w, b, out=nan_tensor(first.shape, first.dtype, device), **cfg)
        assert torch.equal(again, first)  # slices are added in slice order: bitwise reproducible
    assert all(int(buf.count_nonzero()) == 0 for buf in common.COUNTERS.values())


def test_strided_operands_batched_rows_and_out_dtype(device):
    # x with a leading batch and a non-unit K stride, W a transposed view (not nn.Linear's
    # layout: correct, only slower), bias strided, out in fp32 for fp16 operands.
    xbuf = random_tensor((2, 3, 2 * 96), torch.float16, device)
    x = xbuf[..., ::2]
    w = random_tensor((96, 45), torch.float16, device).T
    b = random_tensor((90,), torch.float16, device)[::2]
    out = nan_tensor((2, 3, 45), torch.float32, device)
    decode_gemm(x, w, b, out, **CONFIGS["split3"]._asdict())
    assert_close(out, reference(x, w, b), scale=scale(x, w, b), dtype=torch.float32)


def test_default_config_and_edge_cases(device):
    x, w, b = operands(2, 33, 64, torch.float16, device)
    assert_close(decode_gemm(x, w, b), reference(x, w, b), scale=scale(x, w, b))
    x0, w0 = random_tensor((2, 0), torch.float16, device), random_tensor((33, 0), torch.float16, device)
    assert_close(decode_gemm(x0, w0, b), b.double().expand(2, 33))  # no K: the bias
    assert decode_gemm(x[:0], w).shape == (0, 33)
    with pytest.raises(ValueError, match="at most 16"):
        decode_gemm(random_tensor((17, 64), torch.float16, device), w)
    with pytest.raises(TypeError):
        decode_gemm(x, w.float())
    with pytest.raises(ValueError, match="bias"):
        decode_gemm(x, w, b[:5])
    tma = CONFIGS["tma"]._asdict()
    with pytest.raises(ValueError, match="float16/bfloat16"):
        decode_gemm(x.float(), w.float(), **tma)
    with pytest.raises(ValueError, match="16 bytes"):  # rows of 100 halves: 200 bytes apart
        decode_gemm(
            random_tensor((2, 100), torch.float16, device),
            random_tensor((33, 100), torch.float16, device),
            **tma,
        )


@pytest.mark.parametrize("n, k", LLM_SHAPES)
def test_decode_configs(n, k):
    configs = decode_configs(n, k)
    assert 12 <= len(configs) <= 20 and len(set(configs)) == len(configs)
    assert len(set(DECODE_MENU)) == len(DECODE_MENU)
    meta = dict(device="meta", dtype=torch.bfloat16)
    x, w, out = torch.empty(4, k, **meta), torch.empty(n, k, **meta), torch.empty(4, n, **meta)
    for cfg in configs + [default_decode_config(4, n, k)]:
        assert cfg.smem_bytes(2) <= SMEM_PER_BLOCK
        # The split is the count the launch makes: at least one program per SM, and each
        # slice at least two K-steps long (something to pipeline).
        assert DecodeLaunch(x, w, out, None, cfg).splits == cfg.split_k
        assert -(-n // cfg.block_n) * cfg.split_k >= 132
        assert cfg.split_k == 1 or k // cfg.block_k >= 2 * cfg.split_k
    for cfg in decode_configs(n, k, elem_size=4):  # fp32: K-steps of the same bytes
        assert cfg.smem_bytes(4) <= SMEM_PER_BLOCK and cfg.block_k <= 256


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 4, 16])
def test_decode_llm_width_on_gpu(device, m):
    n, k = 14336, 4096
    x, w, b = operands(m, n, k, torch.bfloat16, device)
    ref = reference(x, w, b)
    for cfg in [default_decode_config(m, n, k), *decode_configs(n, k)[::4]]:
        out = decode_gemm(x, w, b, **cfg._asdict())
        assert_close(out, ref, scale=scale(x, w, b), what=cfg.short())
        assert torch.equal(decode_gemm(x, w, b, **cfg._asdict()), out), cfg.short()
        assert relative_error(out, F.linear(x, w, b)) <= tolerance(torch.bfloat16, device, against="library")
