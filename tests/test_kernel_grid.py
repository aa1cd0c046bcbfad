"""The kernel grid: pipeline variant x operand layout x ragged shape x dtype.

A full product with every shape would take hours on the interpreter, so:
every variant meets every layout in every dtype (shapes and tile configs
rotating through that product), every ragged shape runs in every dtype, and
every explicit tile config meets every variant.  Small explicit
``TileConfig``s make tile edges happen on small shapes.  Each case runs
through ``tritongemm.matmul`` against torch in float64, forward and backward;
the ``plans`` spy checks that the config asked for is the one planned.

The default run (``make test``) takes a covering part of each grid: every
layout in every dtype (each variant, config and shape among them), every
ragged shape in two dtypes, every batch layout with every variant once; the
rest is marked ``slow`` (``make test-slow``, ``make test-all``).
"""

from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F
from conftest import grid_cases

import tritongemm
from tritongemm import TileConfig
from tritongemm.launch import problem_of
from tritongemm.planning.heuristics import heuristic_config
from tritongemm.planning.unaligned import elementwise_tile
from tritongemm.testing import (
    DTYPE_IDS,
    DTYPES,
    assert_close,
    assert_matches_reference,
    make_operands,
    random_tensor,
    shape_id,
)

#: Small tiles: ragged edges on shapes of a few dozen.  Different group_m values
#: exercise the grouped tile order (3 leaves a short last group for 5 tile rows).
CONFIGS = {
    "t16x16x16": TileConfig(block_m=16, block_n=16, block_k=16, group_m=3, num_warps=2),
    "t32x32x32": TileConfig(block_m=32, block_n=32, block_k=32, group_m=8, num_warps=4),
    "t16x32x64": TileConfig(block_m=16, block_n=32, block_k=64, group_m=1, num_warps=4),
}
#: Pipeline variant -> num_stages put in the TileConfig.
VARIANTS = {"single_stage": 1, "double_buffer": 2, "multi_stage": 4}
#: Operand layouts, A then B (see tritongemm.testing.LAYOUTS): N row-major,
#: T transposed, S stepped slice of a NaN-filled buffer.
LAYOUTS = ["NN", "NT", "TN", "TT", "SN", "NS", "ST", "SS"]
#: Shapes for the variant x layout grid: ragged in every dimension, K both a
#: multiple of block_k (EVEN_K) and not.
GRID_SHAPES = [(17, 31, 65), (33, 7, 48), (65, 17, 33), (7, 64, 31), (31, 33, 17), (64, 65, 64)]


def _variant_layout_cases():
    """The full variant x layout x dtype product; tile configs and shapes rotate through it.

    The default run keeps one variant per (layout, dtype), chosen so that every variant still
    meets every layout, every dtype and every tile config; the rest is ``slow``.
    """
    cases = []
    for vi, (variant, stages) in enumerate(VARIANTS.items()):
        for li, layout in enumerate(LAYOUTS):
            for di, dtype in enumerate(DTYPES):
                cfg_name = list(CONFIGS)[(vi + li + di) % len(CONFIGS)]
                m, n, k = GRID_SHAPES[(li + 2 * di + vi) % len(GRID_SHAPES)]
                case_id = f"{variant}-{layout}-{DTYPE_IDS[dtype]}-{shape_id(m, n, k)}-{cfg_name}"
                marks = () if (vi + 2 * li + di) % len(VARIANTS) == 0 else (pytest.mark.slow,)
                cases.append(
                    pytest.param(stages, layout, dtype, (m, n, k), cfg_name, id=case_id, marks=marks)
                )
    return cases


@pytest.mark.parametrize("stages, layout, dtype, shape, cfg_name", _variant_layout_cases())
def test_matmul_grid(stages, layout, dtype, shape, cfg_name, device, plans):
    m, n, k = shape
    cfg = replace(CONFIGS[cfg_name], num_stages=stages)
    a, b = make_operands(m, n, k, layout, dtype, device)
    a.requires_grad_(True)
    b.requires_grad_(True)
    assert_matches_reference(tritongemm.matmul, torch.matmul, a, b, ours_kwargs=dict(config=cfg))
    assert plans[0]["config"] == cfg
    assert (plans[0]["M"], plans[0]["N"], plans[0]["K"]) == (m, n, k)


# (M, N, K, config): what each shape makes the kernel do at its edges.
RAGGED = {
    "1x1x1": (1, 1, 1, "t16x16x16"),  # one element, everything masked but one lane
    "1x33x17": (1, 33, 17, "t32x32x32"),  # one row (decode-like), N just over a tile
    "31x1x7": (31, 1, 7, "t16x32x64"),  # one column, K < block_k
    "7x17x5": (7, 17, 5, "t16x16x16"),  # every dimension ragged, K < block_k
    "17x31x65": (17, 31, 65, "t32x32x32"),  # K = 2 * block_k + 1
    "33x65x31": (33, 65, 31, "t16x16x16"),  # K not a multiple of block_k, 5 tile rows
    "29x37x23": (29, 37, 23, "t16x32x64"),  # primes
    "64x64x64": (64, 64, 64, "t32x32x32"),  # exact tiles, EVEN_K
    "65x33x1": (65, 33, 1, "t16x16x16"),  # block_k=16 with K=1
    "13x11x0": (13, 11, 0, "t16x16x16"),  # K=0: a zero matrix (written, not left poisoned)
    "0x17x9": (0, 17, 9, "t16x16x16"),  # M=0: empty result, B's gradient is zeros
    "9x0x17": (9, 0, 17, "t16x16x16"),  # N=0: empty result, A's gradient is zeros
    "0x0x0": (0, 0, 0, "t32x32x32"),
}


def _ragged_cases():
    """Every ragged shape in every dtype; the default run takes two dtypes per shape (rotating, so
    every layout and variant stays), the rest is ``slow``."""
    cases = []
    for si, (sid, (m, n, k, cfg_name)) in enumerate(RAGGED.items()):
        for di, dtype in enumerate(DTYPES):
            layout = LAYOUTS[(si + di) % 4]  # NN/NT/TN/TT rotate over shapes and dtypes
            variant = list(VARIANTS)[(si + di) % len(VARIANTS)]
            case_id = f"{variant}-{layout}-{DTYPE_IDS[dtype]}-{sid}"
            marks = () if (di - si) % len(DTYPES) < 2 else (pytest.mark.slow,)
            cases.append(pytest.param(m, n, k, cfg_name, layout, variant, dtype, id=case_id, marks=marks))
    return cases


@pytest.mark.parametrize("m, n, k, cfg_name, layout, variant, dtype", _ragged_cases())
def test_matmul_ragged(m, n, k, cfg_name, layout, variant, dtype, device):
    cfg = replace(CONFIGS[cfg_name], num_stages=VARIANTS[variant])
    a, b = make_operands(m, n, k, layout, dtype, device)
    a.requires_grad_(True)
    b.requires_grad_(True)
    out = assert_matches_reference(tritongemm.matmul, torch.matmul, a, b, ours_kwargs=dict(config=cfg))
    if k == 0:
        assert torch.equal(out, torch.zeros_like(out)), "K=0 must give exact zeros"


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS.get)
@pytest.mark.parametrize("shape", [(17, 31, 65), (1, 64, 33), (48, 5, 16)], ids=lambda s: shape_id(*s))
def test_matmul_heuristic_config(shape, dtype, device, plans):
    """config=None: the dispatcher's heuristic picks a (valid) config and the result is right."""
    m, n, k = shape
    a, b = make_operands(m, n, k, "NT", dtype, device)
    assert_matches_reference(tritongemm.matmul, torch.matmul, a, b)
    problem, info = problem_of(a, b), tritongemm.device_info(device)
    expected = heuristic_config(problem, info)
    if "elementwise_tile" in tritongemm.explain(a, b).source:  # odd strides on a GPU: the small-problem rule
        expected = elementwise_tile(problem, info)
    assert plans[0]["config"] == expected


@pytest.mark.parametrize(
    "pipeline, base_stages, expected_stages",
    [
        ("single_stage", 3, 1),
        ("double_buffer", 1, 2),
        ("multi_stage", 1, 3),  # at least 3 stages
        ("multi_stage", 5, 5),  # keeps a deeper config's stage count
        (2, 4, 2),  # a stage count is taken as is
        (4, 1, 4),
    ],
    ids=["single_stage", "double_buffer", "multi_stage-from1", "multi_stage-keeps5", "stages2", "stages4"],
)
def test_pipeline_argument_reaches_every_gemm(pipeline, base_stages, expected_stages, device, plans):
    """pipeline= overrides the config's num_stages, in the forward and in both backward GEMMs."""
    cfg = replace(CONFIGS["t16x16x16"], num_stages=base_stages)
    a, b = make_operands(17, 18, 33, "NN", torch.float32, device)
    a.requires_grad_(True)
    b.requires_grad_(True)
    assert_matches_reference(
        tritongemm.matmul, torch.matmul, a, b, ours_kwargs=dict(config=cfg, pipeline=pipeline)
    )
    assert len(plans) == 3  # forward, dA, dB
    assert plans[0]["config"] == replace(cfg, num_stages=expected_stages)
    # The backward GEMMs choose their own tiles but run the same scheme (and a
    # stage count given as a number exactly).
    scheme = replace(cfg, num_stages=expected_stages).pipeline
    assert [r["config"].pipeline for r in plans] == [scheme] * 3
    if isinstance(pipeline, int):
        assert [r["config"].num_stages for r in plans] == [pipeline] * 3


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_pipeline_by_name_matches_tileconfig(variant, device, plans):
    """pipeline="<name>" on the heuristic config, and TileConfig.with_pipeline, launch that scheme."""
    a, b = make_operands(33, 17, 40, "TN", torch.float16, device)
    assert_matches_reference(tritongemm.matmul, torch.matmul, a, b, ours_kwargs=dict(pipeline=variant))
    assert plans[-1]["config"].pipeline == variant
    cfg = CONFIGS["t32x32x32"].with_pipeline(variant)
    assert cfg.pipeline == variant
    assert_matches_reference(tritongemm.matmul, torch.matmul, a, b, ours_kwargs=dict(config=cfg))
    assert plans[-1]["config"] == cfg


# Batched operands: the kernel's batch stride, broadcast (stride-0) batches, and
# batch dims that cannot be merged into one stride (looped over on the host).
BATCHED = {
    "batch2x3": dict(a_batch=(2, 3), b_batch=(2, 3)),
    "bcastA": dict(a_batch=(1, 3), b_batch=(2, 3)),  # A broadcast over the first dim
    "bcastB-middle": dict(a_batch=(2, 3, 2), b_batch=(2, 1, 2)),  # stride-0 dim between two real ones
}


@pytest.mark.parametrize(
    "batch_id, layout, variant",
    grid_cases(
        dict(batch_id=list(BATCHED), layout=["NN", "TT", "SN"], variant=list(VARIANTS)),
        # (indices) by default a Latin square: every pair of batch, layout and variant once
        keep=lambda batch_id, layout, variant: variant == (batch_id + layout) % 3,
    ),
)
def test_matmul_batched_grid(batch_id, layout, variant, device):
    dims = BATCHED[batch_id]
    dtype = torch.float32
    cfg = replace(CONFIGS["t16x16x16"], num_stages=VARIANTS[variant])
    a, _ = make_operands(17, 9, 20, layout, dtype, device, batch=dims["a_batch"])
    _, b = make_operands(17, 9, 20, layout, dtype, device, batch=dims["b_batch"])
    a.requires_grad_(True)
    b.requires_grad_(True)
    assert_matches_reference(tritongemm.matmul, torch.matmul, a, b, ours_kwargs=dict(config=cfg))


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS.get)
def test_matmul_unmergeable_batch_strides(dtype, device):
    """A batch sliced with a step: its two batch dims share no stride, so the host loops."""
    a_full, b_full = make_operands(9, 18, 17, "TN", dtype, device, batch=(4, 3))
    a, b = a_full[::2], b_full[::2]  # (2, 3, ...) with batch strides (2*s, s/3)
    a.requires_grad_(True)
    b.requires_grad_(True)
    cfg = CONFIGS["t16x16x16"]
    assert_matches_reference(tritongemm.matmul, torch.matmul, a, b, ours_kwargs=dict(config=cfg))


@pytest.mark.gpu
def test_matmul_index64_on_gpu(device):
    """An operand spanning more than 2^31 elements takes the 64-bit offset path."""
    k, n = 1024, 32
    m = 2**31 // k + 48  # A has > 2^31 elements (about 4 GiB in fp16)
    a = torch.randn(m, k, dtype=torch.float16, device=device)
    b = torch.randn(k, n, dtype=torch.float16, device=device)
    out = tritongemm.matmul(a, b, config=CONFIGS["t32x32x32"])
    for rows in (slice(0, 64), slice(m - 97, m)):  # the first rows and the rows past 2^31 elements
        ref = a[rows].double() @ b.double()
        scale = a[rows].double().abs() @ b.double().abs()
        assert_close(out[rows], ref, scale=scale, dtype=torch.float16, what=f"rows {rows}")


@pytest.mark.gpu
@pytest.mark.parametrize("case", ["addmm", "linear-residual", "gated-train"])
def test_epilogue_operands_past_2_31_elements_on_gpu(case, device):
    """An addend, residual or saved gated half past 2^31 elements, on the kernels the heuristic picks for
    them (the TMA and warp-specialized ones on sm_90, whose epilogues read and write those by pointer):
    the rows on both sides of the 32-bit boundary and the last rows are right (32-bit offsets wrapped
    there, an illegal address)."""
    m, n, k = 65536, 40960, 64  # 2.7e9 outputs: about 5.4 GB in bf16 a tensor
    dt = torch.bfloat16
    boundary = 2**31 // n
    rows = [0, boundary - 1, boundary, boundary + 1, m - 1]
    x = random_tensor((m, k), dt, device)
    w = random_tensor((n, k), dt, device)
    if case == "addmm":
        c = random_tensor((m, n), dt, device)
        out = tritongemm.addmm(c, x, w.T, beta=0.5)
        ref = 0.5 * c[rows].double() + x[rows].double() @ w.double().T
    elif case == "linear-residual":
        r = random_tensor((m, n), dt, device)
        out = tritongemm.linear(x, w, activation="gelu", residual=r)
        ref = F.gelu(x[rows].double() @ w.double().T) + r[rows].double()
    else:
        x.requires_grad_(True)
        out = tritongemm.gated_linear(x, w, w.flip(0))  # (the saved gate and up halves, 5.4 GB each)
        out.backward(torch.ones_like(out))
        xr = x.detach()[rows].double().requires_grad_(True)
        ref = F.silu(xr @ w.double().T) * (xr @ w.flip(0).double().T)
        ref.backward(torch.ones_like(ref))
        assert_close(x.grad[rows], xr.grad, dtype=dt, what="dx")
    assert_close(out[rows], ref.detach(), dtype=dt, what=case)
