"""Small problems on element-wise loads (odd leading dimensions): the heuristic's own tile, on plain values and on the kernels.

A 2-byte operand with an odd leading dimension is loaded element by element
(no vector loads, no cp.async).  Where a copy to aligned workspaces does not
pay, the heuristic switches to ``unaligned.elementwise_tile``: small tiles
with a long K step.  An explicit config, a pipeline or decomposition request,
vector-capable strides and larger problems keep the general rule.
"""

import pytest
import torch

import tritongemm
from tritongemm import KNOWN_DEVICES, TileConfig
from tritongemm.planning.call import NO_REQUEST, Request
from tritongemm.planning.eligibility import Operand
from tritongemm.planning.heuristics import tiles_of
from tritongemm.planning.plan import layout_letters, plan
from tritongemm.planning.problem import GemmProblem
from tritongemm.planning.unaligned import ELEMENTWISE_MAX_WAVES, elementwise_tile
from tritongemm.testing import assert_close, random_tensor

H100 = KNOWN_DEVICES["h100"]


def _plan(m, n, k, lead_a=None, lead_b=None, request=NO_REQUEST, dtype=torch.bfloat16, padding="auto"):
    elem = torch.empty((), dtype=dtype).element_size()
    a = Operand(m, k, lead_a or k, 1, elem, True)
    b = Operand(k, n, lead_b or n, 1, elem, True)
    c = Operand.contiguous(m, n, elem)
    problem = GemmProblem(m, n, k, 1, str(dtype).removeprefix("torch."), layout_letters(a, b))
    return plan(problem, H100, request, a, b, c, dtype, dtype, padding)


@pytest.mark.parametrize("n, block_k", [(255, 256), (511, 256), (513, 128), (101, 128), (33, 64), (7, 16)])
def test_small_odd_squares_take_the_elementwise_tile(n, block_k):
    p = _plan(n, n, n)
    assert p.alignment is not None and p.alignment.path == "plain"
    assert (p.config.block_m, p.config.block_n, p.config.block_k) == (32, 32, block_k)
    assert p.kernel == "pointer" and p.config.kernel == "pointer"
    assert "elementwise_tile" in p.source


def test_few_tiles_with_a_long_k_split_it():
    cfg = elementwise_tile(GemmProblem(65, 65, 8191, 1, "bfloat16", "NN"), H100)
    assert (cfg.block_m, cfg.block_n, cfg.block_k) == (32, 32, 128)
    assert cfg.split_k > 1  # 9 tiles on 132 SMs


def test_one_wave_with_more_than_one_k_step_takes_narrow_tiles():
    cfg = _plan(257, 257, 257).config  # 81 tiles of 32x32 on 132 SMs; K = 257 would walk two steps of 256
    assert (cfg.block_m, cfg.block_n, cfg.block_k, cfg.split_k) == (32, 16, 128, 1)
    assert "elementwise_tile" in _plan(257, 257, 257).source
    assert _plan(255, 255, 255).config.block_n == 32  # one step of 256 already
    assert _plan(511, 511, 511).config.block_n == 32  # 256 tiles: two waves


def test_larger_problems_keep_the_general_rule():
    m = 32 * 32  # 32 x 32 = 1024 tiles of 32x32: past the rule's waves on an H100
    assert tiles_of(GemmProblem(m, m, m, 1, "bfloat16", "NN"), 32, 32) > ELEMENTWISE_MAX_WAVES * 132
    assert elementwise_tile(GemmProblem(m - 1, m - 1, m - 1, 1, "bfloat16", "NN"), H100) is None
    p = _plan(m - 1, m - 1, m - 1, padding="never")
    assert (p.config.block_m, p.config.block_n) != (32, 32)


def test_requests_and_vector_strides_keep_their_tiles():
    explicit = TileConfig(64, 64, 32, 8, 4, 2)
    assert _plan(255, 255, 255, request=Request(config=explicit)).config.block_m == 64
    assert _plan(255, 255, 255, request=Request(pipeline="double_buffer")).config.block_m != 32
    assert _plan(255, 255, 255, request=Request(decomposition="split_k")).config.block_m != 32
    # Leading dimensions of 258 elements: 4-byte loads remain (path (b)), so the general tile stands.
    p = _plan(255, 255, 255, lead_a=258, lead_b=258)
    assert p.alignment.path == "hinted" and p.config.block_m != 32
    # Aligned operands never see the rule.
    assert "elementwise_tile" not in _plan(256, 256, 256).source


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("m, n, k", [(33, 31, 47), (1, 29, 61), (37, 3, 255), (45, 17, 601), (65, 70, 387)])
def test_elementwise_tile_runs_correctly(dtype, m, n, k, device):
    """The rule's configs (as an H100 would get them) on the kernel, odd strides, ragged edges."""
    a = random_tensor((m, k), dtype, device)
    b = random_tensor((k, n), dtype, device)
    cfg = elementwise_tile(GemmProblem(m, n, k, 1, str(dtype).removeprefix("torch."), "NN"), H100)
    assert (cfg.block_m, cfg.block_n) == ((32, 16) if 256 < k <= 512 else (32, 32))
    out = tritongemm.matmul(a, b, config=cfg)
    assert_close(out, a.double() @ b.double(), dtype=dtype)
    if m > 1 and device.type == "cuda" and torch.cuda.get_device_capability() == (9, 0):  # (M = 1: GEMV)
        assert tritongemm.explain(a, b).config == cfg  # and on an H100 the heuristic picks it itself
