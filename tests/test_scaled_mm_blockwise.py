"""scaled_mm with block-scaled fp8 (DeepSeek-V3's recipe, in torch._scaled_mm's shapes).

One fp32 scale per block of 128 of K, and per row or per 128 rows of ``a``, per column or
per 128 columns of ``b``:

    blockwise_1x128_128x128   scale_a (M, K/128)       scale_b (K/128, N/128)
    blockwise_1x128_1x128     scale_a (M, K/128)       scale_b (K/128, N)
    blockwise_128x128_1x128   scale_a (M/128, K/128)   scale_b (K/128, N)

(sizes rounded up).  Every result is checked against float64 on the dequantized operands
(each scale expanded over its block here, independently of the library's ``dequantize``),
by ``||out - ref|| / ||ref||`` and element by element against ``tol * |A| @ |B|`` (the
dequantized magnitudes, plus bias and residual), with test_scaled_mm's per-dtype tolerances.
The scales differ per block, so a scale applied to the wrong block fails (shown by
``test_a_scale_on_the_wrong_block_is_caught``).  Then: the three recipes x out dtypes x
ragged shapes x both layouts of ``b``; torch's strided scale layouts; forced configs (a K
step of 256 capped to one scale block, split-K); the fused epilogue; e5m2; ``out=``; fp8
outputs; errors (torch's exception types); the torch fallback on a CPU without the
interpreter; the planner's tiles for block scales; torch.compile; on a GPU, full-size
problems against float64 and ``torch._scaled_mm`` and the kernel the plan picks.
"""

from dataclasses import replace

import pytest
import torch
from conftest import grid_cases
from test_scaled_mm import (
    A100,
    E4M3,
    E5M2,
    H100,
    OUT_IDS,
    TOL,
    assert_opcheck_passes,
    assert_traces_one_scaled_mm_op,
    compiled_matches_eager,
    dtype_pair_id,
    fused_scaled_mm,
    operands,
    poisoned_outputs,  # noqa: F401  (autouse: every output tritongemm allocates starts as NaN)
    run_without_interpreter,
    tolerance,
    warp_specialized_fp8_unavailable,
)

import tritongemm
import tritongemm.frontend.scaled
from tritongemm import TileConfig, launch
from tritongemm.frontend.scaled import (
    ScalingError,
    block_scale_shapes,
    dequantize,
    kernel_scales,
    scaling_of,
)
from tritongemm.launch import problem_of
from tritongemm.planning.call import BLOCK_SCALINGS, SCALE_BLOCK_K, Epilogue, GemmCall, make_request
from tritongemm.planning.eligibility import Operand
from tritongemm.planning.heuristics.fp8 import (
    FEW_ROWS,
    FP8_BLOCK_SCALED_TILE,
    FP8_NARROW_TILE,
    FP8_WIDE_TILE,
    ONE_WAVE_ROWS,
    block_scaled_config,
    few_rows_config,
    fp8_choice,
)
from tritongemm.planning.plan import plan
from tritongemm.planning.problem import GemmProblem
from tritongemm.semantics import ACTIVATIONS
from tritongemm.testing import assert_close, random_tensor, relative_error, shape_id

#: Each recipe's rows of ``a`` and columns of ``b`` per scale (for every 128 of K), written out here
#: so that the reference does not take them from the library.
RECIPES = {
    "blockwise_1x128_128x128": (1, 128),
    "blockwise_1x128_1x128": (1, 1),
    "blockwise_128x128_1x128": (128, 1),
}
RECIPE_IDS = {name: name.removeprefix("blockwise_").replace("_", "-") for name in RECIPES}


def recipes_fast_tier(fast: str) -> list:
    """Every recipe as a parameter, ``fast`` in the default tier and the others under slow."""
    return [pytest.param(r, id=RECIPE_IDS[r], marks=() if r == fast else pytest.mark.slow) for r in RECIPES]


BLOCK = 128
OUT_DTYPES = [torch.bfloat16, torch.float16, torch.float32]
#: (M, N, K): none a multiple of 128 or of a tile but 256; K = 300 (a ragged last scale block),
#: 256 (two whole ones), 320, 130 (a last block of two) and 96 (one block, shorter than it); M = 130:
#: two rows of 128x128 blocks; M = 1.
SHAPES = [(33, 200, 300), (130, 48, 256), (1, 136, 320), (40, 24, 96), (5, 16, 130)]
#: A shape of several blocks along M, N and K for the tests of one aspect.
M_, N_, K_ = 130, 200, 300


def cdiv(x: int, y: int) -> int:
    return -(-x // y)


def pow2_at_least(x: int, low: int) -> int:
    return max(low, 1 << (x - 1).bit_length())


def scale_shapes(recipe, m, n, k):
    rows, cols = RECIPES[recipe]
    kb = cdiv(k, BLOCK)
    return (cdiv(m, rows), kb), (kb, cdiv(n, cols))


def torch_layout(recipe, scale_a, scale_b):
    """The layouts torch._scaled_mm's CUDA path takes: a scale per row of ``a`` M-contiguous (stride
    (1, M)), a scale per 128 rows K-contiguous; ``scale_b`` as ``scale_b.t()`` would be for ``b.t()``:
    per column N-contiguous, per 128 columns the transpose of a row-major (N/128, K/128)."""
    rows, cols = RECIPES[recipe]
    scale_a = scale_a.t().contiguous().t() if rows == 1 else scale_a.contiguous()
    scale_b = scale_b.t().contiguous().t() if cols == BLOCK else scale_b.contiguous()
    return scale_a, scale_b


def sliced(scale):
    """``scale`` as a view with no unit stride and a storage offset, in a buffer of NaN (an element
    read through a wrong stride poisons the result)."""
    rows, cols = scale.shape
    buf = torch.full((2 * rows + 1, 3 * cols + 2), float("nan"), device=scale.device)
    view = buf[1::2, 2::3]
    view.copy_(scale)
    return view


SCALE_LAYOUTS = ("contiguous", "torch", "sliced")


def in_layout(recipe, scale_a, scale_b, layout):
    if layout == "contiguous":
        return scale_a.contiguous(), scale_b.contiguous()
    if layout == "torch":
        return torch_layout(recipe, scale_a, scale_b)
    if layout == "sliced":
        return sliced(scale_a), sliced(scale_b)
    raise ValueError(layout)


def block_scales(recipe, m, n, k, device, layout="contiguous", low=0.5, high=2.0):
    """fp32 scales, uniform in [low, high] (a different one for each block), in ``layout``."""
    shapes = scale_shapes(recipe, m, n, k)
    scale_a, scale_b = (torch.empty(s, device=device).uniform_(low, high) for s in shapes)
    return in_layout(recipe, scale_a, scale_b, layout)


def expand(scale, rows, cols, shape):
    """A scale per element of a ``shape`` matrix, from one per ``rows`` x ``cols`` block (float64)."""
    i = torch.arange(shape[0], device=scale.device) // rows
    j = torch.arange(shape[1], device=scale.device) // cols
    return scale.double()[i][:, j]


def dequantized(a, b, scale_a, scale_b, recipe):
    """The operands in float64, each element times its block's scale."""
    rows, cols = RECIPES[recipe]
    return a.double() * expand(scale_a, rows, BLOCK, a.shape), b.double() * expand(
        scale_b, BLOCK, cols, b.shape
    )


def reference(a, b, scale_a, scale_b, recipe, bias=None, activation="none", residual=None):
    da, db = dequantized(a, b, scale_a, scale_b, recipe)
    y = da @ db
    if bias is not None:
        y = y + bias.double().reshape(-1)
    y = ACTIVATIONS[activation](y)
    if residual is not None:
        y = y + residual.double()
    return y


def magnitude(a, b, scale_a, scale_b, recipe, bias=None, residual=None):
    """The reference on absolute values: each element's rounding-error scale."""
    da, db = dequantized(a, b, scale_a.abs(), scale_b.abs(), recipe)
    s = da.abs() @ db.abs()
    if bias is not None:
        s = s + bias.double().abs().reshape(-1)
    if residual is not None:
        s = s + residual.double().abs()
    return s


def check(
    out,
    a,
    b,
    scale_a,
    scale_b,
    recipe,
    out_dtype,
    *,
    bias=None,
    activation="none",
    residual=None,
    what="result",
):
    """``out`` matches the float64 reference within ``out_dtype``'s tolerance, norm- and element-wise."""
    ref = reference(a, b, scale_a, scale_b, recipe, bias, activation, residual)
    assert out.dtype == out_dtype, f"{what}: dtype {out.dtype}, expected {out_dtype}"
    assert out.shape == ref.shape, f"{what}: shape {tuple(out.shape)}, expected {tuple(ref.shape)}"
    unwritten = out.float().isnan()
    assert not unwritten.any(), (
        f"{what}: {int(unwritten.sum())} NaN (unwritten?), first at {unwritten.nonzero()[0].tolist()}"
    )
    bound = magnitude(a, b, scale_a, scale_b, recipe, bias, residual)
    stored = out.float() if out_dtype in (E4M3, E5M2) else out
    tol = tolerance(out_dtype, out.device)
    assert_close(stored, ref, dtype=stored.dtype, scale=bound, tol=tol, what=what)


def block_call(recipe, out_dtype=torch.float32, config=None, bias=False, activation="none", residual=False):
    """The ``GemmCall`` scaled_mm makes for a block-scaled call (as benchmarks/fp8.py's ``kernel_columns``)."""
    epilogue = Epilogue(activation, beta=1.0 if bias else 0.0, addend=bias, residual=residual, scaling=recipe)
    return GemmCall(epilogue, make_request(config), out_dtype, "ieee")


# ----------------------------------------------------------------------------------
# The recipes' shapes and names
# ----------------------------------------------------------------------------------
def test_recipes_and_scale_block():
    assert BLOCK_SCALINGS == RECIPES
    assert SCALE_BLOCK_K == BLOCK


@pytest.mark.parametrize("m, n, k", [*SHAPES, (256, 384, 512)], ids=shape_id)
def test_block_scale_shapes(m, n, k):
    assert block_scale_shapes(m, n, k) == {r: scale_shapes(r, m, n, k) for r in RECIPES}


def test_block_scale_shapes_round_up():
    assert block_scale_shapes(130, 200, 300) == {
        "blockwise_1x128_128x128": ((130, 3), (3, 2)),
        "blockwise_1x128_1x128": ((130, 3), (3, 200)),
        "blockwise_128x128_1x128": ((2, 3), (3, 200)),
    }


@pytest.mark.parametrize("layout", SCALE_LAYOUTS)
@pytest.mark.parametrize("recipe", RECIPES, ids=RECIPE_IDS.get)
def test_scaling_of_names_each_recipe(recipe, layout):
    a, b = operands(M_, N_, K_, (E4M3, E4M3), "cpu")
    scale_a, scale_b = block_scales(recipe, M_, N_, K_, "cpu", layout)
    assert scaling_of(a, b, scale_a, scale_b) == recipe


def test_short_k_block_scales_that_read_as_rowwise_or_tensorwise():
    """K <= 128: one block of K, so (M, 1) and (1, N) block scales are rowwise scales (checked first,
    same meaning), and with M = 1 and N <= 128, (1, 1) ones tensorwise; other recipes stay block-scaled."""
    a, b = operands(40, 24, 96, (E4M3, E4M3), "cpu")
    names = {r: scaling_of(a, b, *block_scales(r, 40, 24, 96, "cpu")) for r in RECIPES}
    assert names == {
        "blockwise_1x128_128x128": "blockwise_1x128_128x128",  # ((40, 1), (1, 1))
        "blockwise_1x128_1x128": "rowwise",  # ((40, 1), (1, 24))
        "blockwise_128x128_1x128": "blockwise_128x128_1x128",  # ((1, 1), (1, 24))
    }
    a1, b1 = operands(1, 24, 96, (E4M3, E4M3), "cpu")
    assert scaling_of(a1, b1, *block_scales("blockwise_1x128_128x128", 1, 24, 96, "cpu")) == "tensorwise"


@pytest.mark.parametrize("recipe", RECIPES, ids=RECIPE_IDS.get)
def test_dequantize_expands_one_scale_per_block(recipe):
    rows, cols = RECIPES[recipe]
    a, b = operands(M_, N_, K_, (E4M3, E4M3), "cpu")
    scale_a, scale_b = block_scales(recipe, M_, N_, K_, "cpu", "torch")
    da, db = dequantized(a, b, scale_a, scale_b, recipe)
    assert torch.equal(dequantize(a.double(), scale_a.double(), rows, BLOCK), da)
    assert torch.equal(dequantize(b.double(), scale_b.double(), BLOCK, cols), db)


@pytest.mark.parametrize("recipe", RECIPES, ids=RECIPE_IDS.get)
def test_kernel_scales_take_torchs_layouts_without_a_copy(recipe):
    """The kernels read a per-row (per-column) scale K-block-major, and a per-128 one with its K blocks
    contiguous: torch's layouts are those already (no copy), any other is copied into them."""
    rows, cols = RECIPES[recipe]
    contiguous = block_scales(recipe, M_, N_, K_, "cpu")
    theirs = torch_layout(recipe, *contiguous)
    expected = (
        contiguous[0].t() if rows == 1 else contiguous[0],
        contiguous[1] if cols == 1 else contiguous[1].t(),
    )
    for layout in (contiguous, theirs, tuple(sliced(s) for s in contiguous)):
        got = kernel_scales(recipe, *layout)
        for g, e in zip(got, expected):
            assert g.is_contiguous() and torch.equal(g, e)
    for g, given in zip(kernel_scales(recipe, *theirs), theirs):
        assert g.data_ptr() == given.data_ptr(), "torch's layout was copied"


# ----------------------------------------------------------------------------------
# Correctness against float64
# ----------------------------------------------------------------------------------
MATCH_CASES = grid_cases(
    {
        "recipe": list(RECIPES),
        "out_dtype": OUT_DTYPES,
        "m, n, k": SHAPES,
        "b_layout": ["col", "row"],
    },
    keep=lambda r, o, s, lay: (r + o + s + 2 * lay) % 5 == 0,
    ids={
        "recipe": RECIPE_IDS.get,
        "out_dtype": OUT_IDS.get,
        "m, n, k": lambda s: shape_id(*s),
        "b_layout": lambda v: f"b-{v}major",
    },
)


@pytest.mark.parametrize("recipe, out_dtype, m, n, k, b_layout", MATCH_CASES)
def test_matches_float64_reference(device, recipe, out_dtype, m, n, k, b_layout):
    a, b = operands(m, n, k, (E4M3, E4M3), device, b_layout)
    scale_a, scale_b = block_scales(recipe, m, n, k, device)
    out = tritongemm.scaled_mm(a, b, scale_a, scale_b, out_dtype=out_dtype)
    check(out, a, b, scale_a, scale_b, recipe, out_dtype)


#: How a scale can be put on the wrong block: two blocks along K (of either operand), along M (a's
#: rows or row blocks) or along N (b's columns or column blocks) swapped: (operand, axis, i, j).
SWAPS = {
    "a-k-blocks": ("a", 1, 0, 2),
    "b-k-blocks": ("b", 0, 0, 2),
    "a-rows": ("a", 0, 0, 1),
    "b-columns": ("b", 1, 0, 1),
}


def swapped_scales(scale_a, scale_b, swap):
    """The scales with two blocks' swapped, those two made far apart first (in place)."""
    operand, axis, i, j = SWAPS[swap]
    scale = scale_a if operand == "a" else scale_b
    scale.select(axis, i).uniform_(0.5, 0.8)
    scale.select(axis, j).uniform_(1.25, 2.0)
    order = list(range(scale.shape[axis]))
    order[i], order[j] = j, i
    moved = scale.index_select(axis, torch.tensor(order, device=scale.device))
    return (moved, scale_b) if operand == "a" else (scale_a, moved)


def excess(out, ref, bound, tol) -> float:
    """How many times its element-wise bound the worst element of ``out`` is off ``ref``."""
    return ((out.double() - ref).abs() / (tol * bound)).max().item()


@pytest.mark.parametrize(
    "recipe, swap",
    grid_cases(
        {"recipe": list(RECIPES), "swap": list(SWAPS)},
        keep=lambda r, s: (r + s) % 3 == 0,
        ids={"recipe": RECIPE_IDS.get},
    ),
)
def test_a_scale_on_the_wrong_block_is_caught(device, recipe, swap):
    """Two blocks' scales swapped change the reference by far more than the tolerance (element-wise, and
    norm-wise though only a row or column may change), so the comparison would catch a scale read for the
    wrong block; ours follows the scales it is given."""
    a, b = operands(M_, N_, K_, (E4M3, E4M3), device)
    scale_a, scale_b = block_scales(recipe, M_, N_, K_, device)
    swapped = swapped_scales(scale_a, scale_b, swap)
    ref = reference(a, b, scale_a, scale_b, recipe)
    ref_swapped = reference(a, b, *swapped, recipe)
    tol = tolerance(torch.float32, device)
    bound = magnitude(a, b, scale_a, scale_b, recipe)
    assert excess(ref_swapped, ref, bound, tol) > 100, "the swap does not change the result"
    assert relative_error(ref_swapped, ref) > 10 * tol
    ours = tritongemm.scaled_mm(a, b, scale_a, scale_b, out_dtype=torch.float32)
    ours_swapped = tritongemm.scaled_mm(a, b, *swapped, out_dtype=torch.float32)
    check(ours, a, b, scale_a, scale_b, recipe, torch.float32)
    check(ours_swapped, a, b, *swapped, recipe, torch.float32, what=f"{swap} swapped")
    assert excess(ours_swapped, ref, bound, tol) > 100


@pytest.mark.parametrize("recipe", recipes_fast_tier("blockwise_1x128_128x128"))
def test_scale_layouts_give_the_same_result(device, recipe):
    """Contiguous scales, torch's layouts and views with no unit stride (in a NaN buffer)."""
    a, b = operands(M_, N_, K_, (E4M3, E4M3), device)
    scales = block_scales(recipe, M_, N_, K_, device)
    results = {}
    for layout in SCALE_LAYOUTS:
        scale_a, scale_b = in_layout(recipe, *scales, layout)
        results[layout] = tritongemm.scaled_mm(a, b, scale_a, scale_b, out_dtype=torch.float32)
        check(results[layout], a, b, scale_a, scale_b, recipe, torch.float32, what=f"{layout} scales")
    if device.type == "cpu":  # (the same kernel on the same values)
        assert torch.equal(results["torch"], results["contiguous"])
        assert torch.equal(results["sliced"], results["contiguous"])


@pytest.mark.parametrize("recipe", recipes_fast_tier("blockwise_1x128_1x128"))
def test_scales_are_applied_per_block_not_once(device, recipe):
    """The scales multiply each block's products: all of them times 4 (exact) is the result times
    4, all ones is the unscaled product, which differs."""
    a, b = operands(M_, N_, K_, (E4M3, E4M3), device)
    scale_a, scale_b = block_scales(recipe, M_, N_, K_, device, low=1.25, high=2.0)
    out = tritongemm.scaled_mm(a, b, scale_a, scale_b, out_dtype=torch.float32)
    quadrupled = tritongemm.scaled_mm(a, b, scale_a * 2, scale_b * 2, out_dtype=torch.float32)
    assert torch.equal(quadrupled, out * 4)
    ones = tritongemm.scaled_mm(
        a, b, torch.ones_like(scale_a), torch.ones_like(scale_b), out_dtype=torch.float32
    )
    assert_close(ones, a.double() @ b.double(), dtype=torch.float32, tol=tolerance(torch.float32, device))
    assert relative_error(out, ones.double()) > 0.1


@pytest.mark.parametrize("recipe", RECIPES, ids=RECIPE_IDS.get)
def test_a_nan_scale_poisons_only_its_block(device, recipe):
    """A NaN scale of one block of K in one row (block) of a and one column (block) of b: NaN in the
    rows and columns it covers, exactly where the float64 reference has it."""
    a, b = operands(M_, N_, K_, (E4M3, E4M3), device)
    scale_a, scale_b = block_scales(recipe, M_, N_, K_, device)
    scale_a[1, 2] = float("nan")
    scale_b[1, 1] = float("nan")
    out = tritongemm.scaled_mm(a, b, scale_a, scale_b, out_dtype=torch.float32)
    ref = reference(a, b, scale_a, scale_b, recipe)
    rows, cols = RECIPES[recipe]
    nan_rows = set(range(rows, min(2 * rows, M_)))
    nan_cols = set(range(cols, min(2 * cols, N_)))
    expected = torch.zeros(M_, N_, dtype=torch.bool, device=device)
    expected[sorted(nan_rows)] = True
    expected[:, sorted(nan_cols)] = True
    assert torch.equal(ref.isnan(), expected)
    assert torch.equal(out.isnan(), expected), f"NaN at {out.isnan().nonzero().tolist()[:8]}..."
    finite = ~expected
    diff = (out.double() - ref)[finite].abs()
    bound = tolerance(torch.float32, device) * magnitude(
        a, b, scale_a.nan_to_num(1.0), scale_b.nan_to_num(1.0), recipe
    )
    assert (diff <= bound[finite]).all()


# ----------------------------------------------------------------------------------
# Forced configs: the K step capped at one scale block, split-K, small tiles
# ----------------------------------------------------------------------------------
FORCED_CONFIGS = {
    "block-k-256": TileConfig(16, 32, 256, 8, 4, 2),
    "block-k-64": TileConfig(16, 32, 64, 8, 4, 2),
    "split-k": TileConfig(32, 16, 128, 8, 4, 2, split_k=2),
    "split-k-inline": TileConfig(16, 16, 32, 8, 4, 2, split_k=3, split_k_inline=True),
    "split-k-block-k-256": TileConfig(16, 32, 256, 8, 4, 2, split_k=2),
    "64x64x128": TileConfig(64, 64, 128, 8, 4, 2),
}
FORCED_CASES = grid_cases(
    {"recipe": list(RECIPES), "config": list(FORCED_CONFIGS)},
    keep=lambda r, c: (r + c) % 3 == 0,
    ids={"recipe": RECIPE_IDS.get},
)


@pytest.mark.parametrize("recipe, config", FORCED_CASES)
def test_forced_configs(device, plans, recipe, config):
    """Many partial tiles, split-K (each slice's partial sums already scaled, the epilogue once after
    they are summed), and a K step of 256 that the plan caps at one scale block."""
    forced = FORCED_CONFIGS[config]
    m, n, k = 40, 72, 300
    a, b = operands(m, n, k, (E4M3, E4M3), device)
    scale_a, scale_b = block_scales(recipe, m, n, k, device, "torch")
    bias = random_tensor((n,), torch.float32, device)
    residual = random_tensor((m, n), torch.float32, device)
    out = tritongemm.scaled_mm(
        a, b, scale_a, scale_b, bias=bias, activation="silu", residual=residual,
        out_dtype=torch.float32, config=forced,
    )  # fmt: skip
    check(out, a, b, scale_a, scale_b, recipe, torch.float32, bias=bias, activation="silu", residual=residual)
    # What ran: the forced tile with a K step inside one scale block.
    assert len(plans) == 1, plans
    ran = plans[0]["config"]
    assert ran.block_k <= BLOCK and BLOCK % ran.block_k == 0, ran
    assert ran.block_k == min(forced.block_k, BLOCK)
    assert (ran.block_m, ran.block_n, ran.split_k) == (forced.block_m, forced.block_n, forced.split_k)
    # ... as launch.plan_for plans it for this call
    call = block_call(recipe, config=forced, bias=True, activation="silu", residual=True)
    chosen = launch.plan_for(call, a, b, out)
    assert chosen.config == ran
    if forced.block_k > BLOCK:
        assert "a K step of 128" in chosen.source, chosen.source


@pytest.mark.parametrize("recipe", RECIPES, ids=RECIPE_IDS.get)
def test_default_plan_keeps_a_k_step_inside_one_scale_block(device, recipe):
    for m, n, k in SHAPES:
        a, b = operands(m, n, k, (E4M3, E4M3), device)
        out = torch.empty(m, n, dtype=torch.bfloat16, device=device)
        chosen = launch.plan_for(block_call(recipe, torch.bfloat16), a, b, out)
        assert chosen.config.block_k <= BLOCK and BLOCK % chosen.config.block_k == 0, (m, n, k, chosen)


# ----------------------------------------------------------------------------------
# The epilogue: bias, activations, residual
# ----------------------------------------------------------------------------------
EPILOGUE_CASES = grid_cases(
    {
        "recipe": list(RECIPES),
        "activation": ["none", "relu", "gelu", "gelu_tanh", "silu"],
        "out_dtype": [torch.bfloat16, torch.float32],
    },
    keep=lambda r, a, o: (r + a) % 3 == 0 and o == a % 2,
    ids={"recipe": RECIPE_IDS.get, "out_dtype": OUT_IDS.get},
)


@pytest.mark.parametrize("recipe, activation, out_dtype", EPILOGUE_CASES)
def test_bias_activation_and_residual(device, recipe, activation, out_dtype):
    a, b = operands(M_, N_, K_, (E4M3, E4M3), device)
    scale_a, scale_b = block_scales(recipe, M_, N_, K_, device)
    bias = random_tensor((N_,), out_dtype, device)
    residual = random_tensor((M_, N_), out_dtype, device)
    out = tritongemm.scaled_mm(
        a, b, scale_a, scale_b, bias=bias, activation=activation, residual=residual, out_dtype=out_dtype
    )
    check(out, a, b, scale_a, scale_b, recipe, out_dtype, bias=bias, activation=activation, residual=residual)


@pytest.mark.parametrize("recipe", RECIPES, ids=RECIPE_IDS.get)
def test_bias_is_added_once_after_the_scales(device, recipe):
    a, b = operands(M_, N_, K_, (E4M3, E4M3), device)
    scale_a, scale_b = block_scales(recipe, M_, N_, K_, device)
    bias = random_tensor((N_,), torch.float32, device)
    biased = tritongemm.scaled_mm(a, b, scale_a, scale_b, bias=bias, out_dtype=torch.float32)
    check(biased, a, b, scale_a, scale_b, recipe, torch.float32, bias=bias)
    unbiased = tritongemm.scaled_mm(a, b, scale_a, scale_b, out_dtype=torch.float32)
    bound = magnitude(a, b, scale_a, scale_b, recipe, bias)
    assert_close(
        biased - unbiased, bias.double().expand(M_, N_), dtype=torch.float32, scale=bound,
        tol=2 * tolerance(torch.float32, device),
    )  # fmt: skip


@pytest.mark.parametrize("recipe", RECIPES, ids=RECIPE_IDS.get)
def test_transposed_residual_in_another_dtype(device, recipe):
    """A transposed fp32 residual under a bf16 output, e5m2 operands, b row-major."""
    a, b = operands(M_, N_, K_, (E5M2, E5M2), device, "row")
    scale_a, scale_b = block_scales(recipe, M_, N_, K_, device, "torch")
    residual = random_tensor((N_, M_), torch.float32, device).t()
    out = tritongemm.scaled_mm(a, b, scale_a, scale_b, residual=residual, out_dtype=torch.bfloat16)
    check(out, a, b, scale_a, scale_b, recipe, torch.bfloat16, residual=residual)


# ----------------------------------------------------------------------------------
# Operand and output dtypes, out=, fast accumulation
# ----------------------------------------------------------------------------------
DTYPE_CASES = grid_cases(
    {"recipe": list(RECIPES), "dtypes": [(E5M2, E5M2), (E4M3, E5M2), (E5M2, E4M3)]},
    keep=lambda r, d: r == d,
    ids={"recipe": RECIPE_IDS.get, "dtypes": dtype_pair_id},
)


@pytest.mark.parametrize("recipe, dtypes", DTYPE_CASES)
def test_e5m2_operands(device, recipe, dtypes):
    a, b = operands(M_, N_, K_, dtypes, device)
    scale_a, scale_b = block_scales(recipe, M_, N_, K_, device)
    out = tritongemm.scaled_mm(a, b, scale_a, scale_b, out_dtype=torch.bfloat16)
    check(out, a, b, scale_a, scale_b, recipe, torch.bfloat16)


def fp8_out_scales(recipe, m, n, k, device, layout="contiguous"):
    """Scales of about 1/sqrt(K) each way, keeping the sums inside e4m3's range (448)."""
    s = k**-0.25
    return block_scales(recipe, m, n, k, device, layout, 0.5 * s, 2 * s)


@pytest.mark.parametrize(
    "recipe, out_dtype",
    grid_cases(
        {"recipe": list(RECIPES), "out_dtype": [E4M3, E5M2]},
        keep=lambda r, o: r % 2 == o,
        ids={"recipe": RECIPE_IDS.get, "out_dtype": OUT_IDS.get},
    ),
)
def test_fp8_out_dtype(device, recipe, out_dtype):
    a, b = operands(M_, N_, K_, (E4M3, E4M3), device)
    scale_a, scale_b = fp8_out_scales(recipe, M_, N_, K_, device)
    bias = random_tensor((N_,), torch.float32, device)
    out = tritongemm.scaled_mm(a, b, scale_a, scale_b, bias=bias, out_dtype=out_dtype)
    check(out, a, b, scale_a, scale_b, recipe, out_dtype, bias=bias)


@pytest.mark.parametrize("dtypes", [(E4M3, E4M3), (E5M2, E4M3)], ids=dtype_pair_id)
def test_default_out_dtype_is_a_dtype(device, dtypes):
    recipe = "blockwise_1x128_128x128"
    a, b = operands(M_, N_, K_, dtypes, device)
    scale_a, scale_b = fp8_out_scales(recipe, M_, N_, K_, device)
    out = tritongemm.scaled_mm(a, b, scale_a, scale_b)
    check(out, a, b, scale_a, scale_b, recipe, dtypes[0])


@pytest.mark.parametrize(
    "recipe, out_dtype",
    grid_cases(
        {"recipe": list(RECIPES), "out_dtype": [torch.bfloat16, torch.float32, E4M3]},
        keep=lambda r, o: r == o,
        ids={"recipe": RECIPE_IDS.get, "out_dtype": OUT_IDS.get},
    ),
)
def test_out_argument(device, recipe, out_dtype):
    """``out=`` is written in place (every element) and returned."""
    a, b = operands(M_, N_, K_, (E4M3, E4M3), device)
    scale_a, scale_b = fp8_out_scales(recipe, M_, N_, K_, device, "torch")
    out = torch.full((M_, N_), float("nan"), dtype=out_dtype, device=device)
    result = tritongemm.scaled_mm(a, b, scale_a, scale_b, out_dtype=out_dtype, out=out)
    assert result is out
    check(out, a, b, scale_a, scale_b, recipe, out_dtype)


def test_out_argument_strided_view(device):
    recipe = "blockwise_1x128_128x128"
    a, b = operands(M_, N_, K_, (E4M3, E4M3), device)
    scale_a, scale_b = block_scales(recipe, M_, N_, K_, device)
    buf = torch.full((M_, 2 * N_), float("nan"), dtype=torch.float32, device=device)
    out = buf[:, ::2]
    assert tritongemm.scaled_mm(a, b, scale_a, scale_b, out_dtype=torch.float32, out=out) is out
    check(out, a, b, scale_a, scale_b, recipe, torch.float32)
    assert buf[:, 1::2].isnan().all(), "elements outside the out view were written"


@pytest.mark.parametrize("recipe", recipes_fast_tier("blockwise_128x128_1x128"))
def test_fast_accum_on_and_off(device, recipe):
    """Both match float64; on the interpreter (no reduced-precision accumulator) bit for bit."""
    a, b = operands(M_, N_, K_, (E4M3, E4M3), device)
    scale_a, scale_b = block_scales(recipe, M_, N_, K_, device)
    results = {}
    for fast in (False, True):
        results[fast] = tritongemm.scaled_mm(
            a, b, scale_a, scale_b, out_dtype=torch.bfloat16, use_fast_accum=fast
        )
        check(results[fast], a, b, scale_a, scale_b, recipe, torch.bfloat16, what=f"use_fast_accum={fast}")
    if device.type == "cpu":
        assert torch.equal(results[False], results[True])


# ----------------------------------------------------------------------------------
# Errors: torch's exception types, our message
# ----------------------------------------------------------------------------------
KB, MB, NB = cdiv(K_, BLOCK), cdiv(M_, BLOCK), cdiv(N_, BLOCK)
#: (scale_a's shape, scale_b's shape) that are no recipe for an (M_, K_) @ (K_, N_) product.
BAD_SCALE_SHAPES = {
    "a-one-k-block-too-many": ((M_, KB + 1), (KB, NB)),
    "a-one-k-block-too-few": ((M_, KB - 1), (KB, N_)),
    "a-one-row-short": ((M_ - 1, KB), (KB, NB)),
    "a-one-row-block-too-many": ((MB + 1, KB), (KB, N_)),
    "b-one-column-block-too-many": ((M_, KB), (KB, NB + 1)),
    "b-one-k-block-too-many": ((M_, KB), (KB + 1, N_)),
    "a-transposed": ((KB, M_), (KB, NB)),
    "b-transposed": ((M_, KB), (NB, KB)),
    "k-blocks-of-64": ((M_, cdiv(K_, 64)), (cdiv(K_, 64), N_)),
    "block-a-rowwise-b": ((M_, KB), (1, N_)),
    "rowwise-a-block-b": ((M_, 1), (KB, N_)),
    "128x128-a-128x128-b": ((MB, KB), (KB, NB)),
    "1d-scales": ((M_ * KB,), (KB * N_,)),
    "3d-scale-a": ((1, M_, KB), (KB, NB)),
}


def torch_raises(a, b, scale_a, scale_b, **kwargs):
    """The exception torch._scaled_mm raises for these arguments on the CPU (None if it takes them)."""
    try:
        torch._scaled_mm(a.cpu(), b.cpu(), scale_a.cpu(), scale_b.cpu(), **kwargs)
    except Exception as exc:  # noqa: BLE001 (whatever torch raises is what we must raise)
        return exc
    return None


def assert_raises_like_torch(a, b, scale_a, scale_b, **kwargs) -> ScalingError:
    theirs = torch_raises(a, b, scale_a, scale_b, **kwargs)
    with pytest.raises(ScalingError) as ours:
        tritongemm.scaled_mm(a, b, scale_a, scale_b, **kwargs)
    # (torch 2.13's CPU _scaled_mm takes no block scales at all: a ValueError for any of them)
    if theirs is not None:
        assert isinstance(ours.value, type(theirs)), (
            f"scaled_mm raised {type(ours.value).__name__}: {ours.value}; "
            f"torch._scaled_mm raises {type(theirs).__name__}: {theirs}"
        )
    return ours.value


@pytest.mark.parametrize("case", BAD_SCALE_SHAPES)
def test_wrong_scale_shapes_raise(case):
    a, b = operands(M_, N_, K_, (E4M3, E4M3), "cpu")
    shape_a, shape_b = BAD_SCALE_SHAPES[case]
    scale_a, scale_b = torch.ones(shape_a), torch.ones(shape_b)
    error = assert_raises_like_torch(a, b, scale_a, scale_b, out_dtype=torch.bfloat16)
    message = str(error)
    # every recipe's shapes, in numbers, and what was given
    for recipe in RECIPES:
        sa, sb = scale_shapes(recipe, M_, N_, K_)
        assert f"{sa} and {sb}" in message, (recipe, message)
    assert f"({M_}, 1)" in message and f"(1, {N_})" in message, message  # (rowwise)
    assert f"got scale_a {tuple(shape_a)} and scale_b {tuple(shape_b)}" in message, message


@pytest.mark.parametrize(
    "dtypes",
    [(torch.float64, torch.float32), (torch.float32, torch.bfloat16), (torch.float16, torch.float16)],
    ids=["fp64-scale-a", "bf16-scale-b", "fp16-scales"],
)
@pytest.mark.parametrize("recipe", RECIPES, ids=RECIPE_IDS.get)
def test_block_scales_must_be_float32(recipe, dtypes):
    a, b = operands(M_, N_, K_, (E4M3, E4M3), "cpu")
    scale_a, scale_b = (s.to(d) for s, d in zip(block_scales(recipe, M_, N_, K_, "cpu"), dtypes))
    error = assert_raises_like_torch(a, b, scale_a, scale_b, out_dtype=torch.bfloat16)
    assert "float32" in str(error)


def test_mismatched_k_says_so_before_the_scales(device):
    a, b = operands(M_, N_, K_, (E4M3, E4M3), device)
    scale_a, scale_b = block_scales("blockwise_1x128_1x128", M_, N_, K_, device)
    with pytest.raises(RuntimeError, match="cannot be multiplied"):
        tritongemm.scaled_mm(a, b[:256], scale_a, scale_b, out_dtype=torch.bfloat16)


# ----------------------------------------------------------------------------------
# A CPU without the interpreter: torch computes it
# ----------------------------------------------------------------------------------
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float32, E4M3], ids=OUT_IDS.get)
@pytest.mark.parametrize("recipe", RECIPES, ids=RECIPE_IDS.get)
def test_cpu_without_interpreter_falls_back_to_torch(monkeypatch, recipe, out_dtype):
    launched = []
    monkeypatch.setattr(tritongemm.frontend.scaled, "interpreter_enabled", lambda: False)
    monkeypatch.setattr(launch, "gemm", lambda *args, **kw: launched.append(args))
    a, b = operands(M_, N_, K_, (E4M3, E5M2), "cpu")
    scale_a, scale_b = fp8_out_scales(recipe, M_, N_, K_, "cpu", "torch")
    bias = random_tensor((N_,), torch.float32, "cpu")
    residual = random_tensor((M_, N_), torch.bfloat16, "cpu")
    out = tritongemm.scaled_mm(
        a, b, scale_a, scale_b, bias=bias, activation="gelu", residual=residual, out_dtype=out_dtype
    )
    assert not launched, "a kernel was launched on a CPU without the interpreter"
    check(out, a, b, scale_a, scale_b, recipe, out_dtype, bias=bias, activation="gelu", residual=residual)
    given = torch.full((M_, N_), float("nan"), dtype=out_dtype)
    assert tritongemm.scaled_mm(a, b, scale_a, scale_b, out_dtype=out_dtype, out=given) is given
    assert not launched, "a kernel was launched on a CPU without the interpreter"
    check(given, a, b, scale_a, scale_b, recipe, out_dtype, what="out=")
    # the arguments are still checked
    with pytest.raises(ScalingError):
        tritongemm.scaled_mm(a, b, scale_a.double(), scale_b, out_dtype=out_dtype)
    with pytest.raises(ScalingError):
        tritongemm.scaled_mm(a, b, scale_a[:, :-1], scale_b, out_dtype=out_dtype)


@pytest.mark.parametrize("recipe", RECIPES, ids=RECIPE_IDS.get)
def test_fallback_agrees_with_the_interpreted_kernel(monkeypatch, recipe):
    a, b = operands(M_, N_, K_, (E4M3, E4M3), "cpu")
    scale_a, scale_b = block_scales(recipe, M_, N_, K_, "cpu", "sliced")
    kernel = tritongemm.scaled_mm(a, b, scale_a, scale_b, out_dtype=torch.float32)
    monkeypatch.setattr(tritongemm.frontend.scaled, "interpreter_enabled", lambda: False)
    fallback = tritongemm.scaled_mm(a, b, scale_a, scale_b, out_dtype=torch.float32)
    assert relative_error(fallback, kernel.double()) <= TOL[torch.float32]


_FALLBACK_SCRIPT = """
import json, torch, tritongemm
torch.manual_seed(0)
m, n, k = 130, 200, 300
a = torch.randn(m, k).to(torch.float8_e4m3fn)
b = torch.randn(n, k).to(torch.float8_e5m2).t()
results = {}
for name, (rows, cols) in {"blockwise_1x128_128x128": (1, 128), "blockwise_1x128_1x128": (1, 1),
                           "blockwise_128x128_1x128": (128, 1)}.items():
    sa = torch.rand(-(-m // rows), 3) + 0.5
    sb = torch.rand(3, -(-n // cols)) + 0.5
    bias = torch.randn(n)
    out = tritongemm.scaled_mm(a, b, sa, sb, bias=bias, activation="silu", out_dtype=torch.float32)
    da = a.double() * sa.double().repeat_interleave(rows, 0)[:m].repeat_interleave(128, 1)[:, :k]
    db = b.double() * sb.double().repeat_interleave(128, 0)[:k].repeat_interleave(cols, 1)[:, :n]
    ref = torch.nn.functional.silu(da @ db + bias.double())
    results[name] = dict(error=((out.double() - ref).norm() / ref.norm()).item(), dtype=str(out.dtype))
print(json.dumps(dict(interpreter=tritongemm.interpreter_enabled(), results=results)))
"""


@pytest.mark.heavy
def test_cpu_without_interpreter_in_a_subprocess():
    """The real thing: a process without TRITON_INTERPRET, on CPU tensors."""
    result = run_without_interpreter(_FALLBACK_SCRIPT)
    assert result["interpreter"] is False
    assert set(result["results"]) == set(RECIPES)
    for recipe, r in result["results"].items():
        assert r["dtype"] == "torch.float32", recipe
        assert r["error"] <= TOL[torch.float32], (recipe, r)


# ----------------------------------------------------------------------------------
# torch.compile
# ----------------------------------------------------------------------------------
def _compile_inputs(device, recipe="blockwise_1x128_128x128"):
    a, b = operands(M_, N_, K_, (E4M3, E4M3), device)
    scale_a, scale_b = block_scales(recipe, M_, N_, K_, device, "torch")
    bias = random_tensor((N_,), torch.bfloat16, device)
    residual = random_tensor((M_, N_), torch.bfloat16, device)
    return a, b, scale_a, scale_b, bias, residual


@pytest.mark.parametrize(
    "backend, recipe",
    [
        pytest.param(
            "aot_eager", r, id=f"aot_eager-{RECIPE_IDS[r]}",
            marks=() if r == "blockwise_1x128_1x128" else pytest.mark.slow,
        )
        for r in RECIPES
    ]
    + [pytest.param("inductor", "blockwise_1x128_128x128", id="inductor-1x128-128x128")],
)  # fmt: skip
def test_torch_compile_fullgraph_matches_eager(device, backend, recipe):
    inputs = _compile_inputs(device, recipe)
    compiled = compiled_matches_eager(fused_scaled_mm, inputs, backend)
    check(
        compiled,
        *inputs[:4],
        recipe,
        torch.bfloat16,
        bias=inputs[4],
        activation="gelu_tanh",
        residual=inputs[5],
    )


def test_torch_compile_traces_one_scaled_mm_op(device):
    assert_traces_one_scaled_mm_op(fused_scaled_mm, _compile_inputs(device))


def test_torch_compile_checks_block_scales_at_trace_time(device):
    torch._dynamo.reset()
    a, b, scale_a, scale_b, bias, residual = _compile_inputs(device)
    with pytest.raises(Exception, match="Invalid scaling configuration"):
        torch.compile(fused_scaled_mm, fullgraph=True, backend="aot_eager")(
            a, b, scale_a[:, :-1], scale_b, bias, residual
        )


def test_custom_op_opcheck_with_block_scales(device):
    assert_opcheck_passes(_compile_inputs(device))


# ----------------------------------------------------------------------------------
# The plan for block scales (on the CPU, for a GPU described by its budgets)
# ----------------------------------------------------------------------------------
def block_plan(m, n, k, gpu, b_layout="col", out_dtype=torch.bfloat16, config=None, block_scaled=True):
    """What ``plan`` chooses for a block-scaled fp8 problem on ``gpu`` (meta tensors: shapes and strides)."""
    a = torch.empty(m, k, dtype=E4M3, device="meta")
    w = torch.empty(n, k, dtype=E4M3, device="meta")
    b = w.t() if b_layout == "col" else torch.empty(k, n, dtype=E4M3, device="meta")
    c = torch.empty(m, n, dtype=out_dtype, device="meta")
    return plan(
        problem_of(a, b), gpu, make_request(config), Operand.of(a), Operand.of(b), Operand.of(c), E4M3,
        out_dtype, block_scaled=block_scaled,
    )  # fmt: skip


def assert_fits_block_scales(cfg):
    """A K step inside one scale block; on the warp-specialized kernel at most 64 accumulator floats a
    thread per consumer, one power-of-two part at most 128 wide."""
    assert cfg.block_k <= BLOCK and BLOCK % cfg.block_k == 0, cfg
    if cfg.kernel == "gluon_ws":
        rows = cfg.block_m // 2 if cfg.pingpong else cfg.block_m
        assert rows * cfg.block_n // (32 * cfg.num_warps) <= 64, cfg
        assert cfg.block_n <= BLOCK and not cfg.epilogue_subtile and not (cfg.stream_k and cfg.pingpong), cfg


PLAN_SHAPES = [
    (1, 4096, 4096),
    (16, 4096, 4096),
    (64, 4096, 4096),
    (17, 4096, 14336),
    (16, 24, 80),
    (100, 4096, 4096),
    (128, 4096, 4096),
    (129, 4096, 4096),
    (512, 4096, 4096),
    (1000, 4096, 4000),
    (4096, 4096, 4096),
]


@pytest.mark.parametrize("m, n, k", PLAN_SHAPES, ids=[shape_id(*s) for s in PLAN_SHAPES])
def test_plan_on_h100(m, n, k):
    """Few rows: the pointer kernel's few-rows tile with a K step of at most 128 (not 256); up to 128 rows
    in one wave, 64 x 64 pointer tiles; more: ``FP8_BLOCK_SCALED_TILE`` on the warp-specialized kernel
    for K-major operands, on the pointer kernel (which says why) for b row-major."""
    for out_dtype in (torch.bfloat16, torch.float32):
        col = block_plan(m, n, k, H100, "col", out_dtype)
        row = block_plan(m, n, k, H100, "row", out_dtype)
        for chosen in (col, row):
            assert_fits_block_scales(chosen.config)
        if m <= FEW_ROWS:
            expected = few_rows_config(col.problem, H100, BLOCK)
            for chosen in (col, row):
                assert chosen.kernel == "pointer"
                assert chosen.config == expected, chosen.config
                assert chosen.config.block_k == min(BLOCK, pow2_at_least(k, 32))
            rowwise = block_plan(m, n, k, H100, "col", out_dtype, block_scaled=False)
            assert rowwise.config.block_k == min(256, pow2_at_least(k, 32))
            continue
        if m <= ONE_WAVE_ROWS and cdiv(m, 64) * cdiv(n, 64) <= H100.sm_count:
            for chosen in (col, row):
                assert chosen.kernel == "pointer"
                assert (chosen.config.block_m, chosen.config.block_n, chosen.config.block_k) == (
                    64,
                    64,
                    BLOCK,
                )
            continue
        bm, bn, warps, stages, pingpong = FP8_BLOCK_SCALED_TILE
        assert row.kernel == "pointer" and "K-major" in row.fallback, row
        assert (row.config.block_m, row.config.block_n, row.config.block_k) == (bm, bn, BLOCK)
        reason = warp_specialized_fp8_unavailable()
        if reason is not None:
            assert col.kernel == "pointer" and col.fallback, (reason, col.fallback)
            continue
        cfg = col.config
        assert col.kernel == cfg.kernel == "gluon_ws", (col.kernel, col.fallback)
        assert (cfg.block_m, cfg.block_n, cfg.block_k, cfg.num_warps, cfg.pingpong) == (
            bm,
            bn,
            BLOCK,
            warps,
            pingpong,
        )
        assert 2 <= cfg.num_stages <= stages
        assert cfg.split_k == 1 and not cfg.stream_k and not cfg.epilogue_subtile
        assert "block-scaled" in col.source


def test_plan_without_warp_specialization():
    """Not sm_90: the pointer kernel, a K step of 128."""
    for b_layout in ("col", "row"):
        chosen = block_plan(4096, 4096, 4096, A100, b_layout)
        assert chosen.kernel == chosen.config.kernel == "pointer"
        assert chosen.config.block_k == BLOCK


def test_heuristics_wide_tile_becomes_the_block_scaled_tile():
    """The fp8 heuristic's 128 x 256 subtiled tile (on 8 warps; what fast accumulation keeps) has 128
    accumulator floats a thread and two parts: ``block_scaled_config`` replaces it by
    ``FP8_BLOCK_SCALED_TILE``."""
    chosen, _ = fp8_choice(GemmProblem(4096, 4096, 4096, dtype=torch.float8_e4m3fn), H100)
    bm, bn, warps, stages, subtile = FP8_WIDE_TILE
    assert (chosen.block_m, chosen.block_n, chosen.num_warps, chosen.epilogue_subtile) == (
        bm,
        bn,
        warps,
        subtile,
    )
    wide = TileConfig(bm, bn, 128, 8, warps, stages, kernel="gluon_ws", epilogue_subtile=subtile)
    fitted, why = block_scaled_config(wide)
    tbm, tbn, twarps, tstages, tpingpong = FP8_BLOCK_SCALED_TILE
    assert fitted == replace(
        wide, block_m=tbm, block_n=tbn, num_warps=twarps, num_stages=tstages, pingpong=tpingpong,
        epilogue_subtile=False,
    )  # fmt: skip
    assert why is not None and f"{tbm}x{tbn} tiles" in why
    assert_fits_block_scales(fitted)
    # forced, the plan makes the same change and says so
    forced = block_plan(4096, 4096, 4096, H100, config=wide)
    assert "block-scaled fp8" in forced.source
    assert (forced.config.block_m, forced.config.block_n, forced.config.num_warps) == (tbm, tbn, twarps)
    assert_fits_block_scales(forced.config)


def test_block_scaled_tile_fits_its_own_rules():
    bm, bn, warps, stages, pingpong = FP8_BLOCK_SCALED_TILE
    cfg = TileConfig(bm, bn, BLOCK, 8, warps, stages, kernel="gluon_ws", pingpong=pingpong)
    assert block_scaled_config(cfg) == (cfg, None)
    assert_fits_block_scales(cfg)


#: Tiles the caller might force, and what ``block_scaled_config`` makes of them (None: unchanged).
CALLER_TILES = {
    # the pointer kernel: only the K step changes
    "pointer-16x32x256": (TileConfig(16, 32, 256, 8, 4, 4), dict(block_k=128)),
    "pointer-64x64x256-split": (
        TileConfig(64, 64, 256, 8, 4, 4, split_k=2, split_k_inline=True),
        dict(block_k=128),
    ),
    "pointer-64x64x128": (TileConfig(64, 64, 128, 8, 4, 4), None),
    "pointer-64x64x64": (TileConfig(64, 64, 64, 8, 4, 4), None),
    "pointer-16x16x32": (TileConfig(16, 16, 32, 8, 4, 2), None),
    # the warp-specialized kernel: 64 floats a thread fit
    "ws-128x128-w8": (TileConfig(128, 128, 128, 8, 8, 6, kernel="gluon_ws"), None),
    "ws-64x128-w4": (
        TileConfig(*FP8_NARROW_TILE[:2], 128, 8, *FP8_NARROW_TILE[2:4], kernel="gluon_ws"),
        None,
    ),
    "ws-128x128-w8-stream-k": (TileConfig(128, 128, 128, 8, 8, 5, kernel="gluon_ws", stream_k=True), None),
    # ... more do not, nor two parts, nor wider than a scale block
    "ws-128x128-w4": (TileConfig(128, 128, 128, 8, 4, 6, kernel="gluon_ws"), "tile"),
    "ws-128x256-w8-subtile": (
        TileConfig(128, 256, 128, 8, 8, 4, kernel="gluon_ws", epilogue_subtile=True),
        "tile",
    ),
    "ws-128x192-w8": (TileConfig(128, 192, 128, 8, 8, 4, kernel="gluon_ws"), "tile"),
    "ws-64x256-pingpong": (TileConfig(64, 256, 128, 8, 4, 6, kernel="gluon_ws", pingpong=True), "tile"),
    "ws-128x128-w8-block-k-256": (TileConfig(128, 128, 256, 8, 8, 3, kernel="gluon_ws"), dict(block_k=128)),
}


@pytest.mark.parametrize("case", CALLER_TILES)
def test_block_scaled_config_of_a_callers_tile(case):
    given, change = CALLER_TILES[case]
    fitted, why = block_scaled_config(given)
    if change is None:
        assert (fitted, why) == (given, None)
        return
    assert why is not None and why.startswith("block-scaled fp8")
    if change == "tile":
        bm, bn, warps, stages, pingpong = FP8_BLOCK_SCALED_TILE
        expected = replace(
            given, block_m=bm, block_n=bn, block_k=BLOCK, num_warps=warps, num_stages=stages, pingpong=pingpong,
            epilogue_subtile=False, stream_k=False,
        )  # fmt: skip
    else:
        expected = replace(given, **change)
        assert "a K step of 128" in why
    assert fitted == expected
    assert_fits_block_scales(fitted)


def test_block_scaled_config_of_a_64_row_pingpong_tile():
    """Split in two, a 64-row tile would leave each consumer 32 rows, under a wgmma's 64."""
    given = TileConfig(64, 128, 128, 8, 4, 6, kernel="gluon_ws", pingpong=True)
    fitted, _ = block_scaled_config(given)
    assert fitted.block_m // 2 >= 64 or not fitted.pingpong, fitted


# ----------------------------------------------------------------------------------
# On the GPU
# ----------------------------------------------------------------------------------
GPU_SHAPES = [(512, 4096, 4096), (1000, 4096, 4000), (4096, 4096, 4096), (16, 4096, 4096), (128, 4096, 4096)]


@pytest.mark.gpu
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float32], ids=OUT_IDS.get)
@pytest.mark.parametrize("recipe", RECIPES, ids=RECIPE_IDS.get)
@pytest.mark.parametrize("m, n, k", GPU_SHAPES, ids=[shape_id(*s) for s in GPU_SHAPES])
def test_gpu_full_size_matches_float64(device, m, n, k, recipe, out_dtype):
    a, b = operands(m, n, k, (E4M3, E4M3), device)
    scale_a, scale_b = block_scales(recipe, m, n, k, device, "torch")
    out = tritongemm.scaled_mm(a, b, scale_a, scale_b, out_dtype=out_dtype)
    check(out, a, b, scale_a, scale_b, recipe, out_dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("fast_accum", [False, True], ids=["precise", "fast-accum"])
@pytest.mark.parametrize("recipe", RECIPES, ids=RECIPE_IDS.get)
@pytest.mark.parametrize("m, n, k", GPU_SHAPES, ids=[shape_id(*s) for s in GPU_SHAPES])
def test_gpu_matches_torch_scaled_mm(device, m, n, k, recipe, fast_accum):
    """torch._scaled_mm with the same arguments, the scales in the layouts its CUDA path requires; a
    recipe torch refuses on this GPU is a skip with torch's words."""
    a, b = operands(m, n, k, (E4M3, E4M3), device)
    scale_a, scale_b = block_scales(recipe, m, n, k, device, "torch")
    kw = dict(out_dtype=torch.bfloat16, use_fast_accum=fast_accum)
    ours = tritongemm.scaled_mm(a, b, scale_a, scale_b, **kw)
    check(ours, a, b, scale_a, scale_b, recipe, torch.bfloat16)
    try:
        theirs = torch._scaled_mm(a, b, scale_a, scale_b, **kw)
    except (RuntimeError, ValueError, NotImplementedError) as exc:
        pytest.skip(
            f"torch {torch.__version__} refuses {recipe} on {torch.cuda.get_device_name(device)}: {exc}"
        )
    err = relative_error(ours, theirs)
    assert err <= TOL[torch.bfloat16], f"relative difference from torch._scaled_mm {err:.3g}"


@pytest.mark.gpu
@pytest.mark.parametrize("recipe", RECIPES, ids=RECIPE_IDS.get)
@pytest.mark.parametrize("m", [16, 64, 512, 4096])
def test_gpu_kernel_choice(device, plans, recipe, m):
    """On sm_90: the warp-specialized kernel from 512 rows, the pointer kernel's few-rows tiles up to 64;
    a K step inside one scale block either way (the kernel ``launch.plan_for`` gives the launch)."""
    capability = torch.cuda.get_device_capability(device)
    if m >= 512 and capability != (9, 0):
        pytest.skip(
            f"the warp-specialized fp8 kernel is sm_90's; this GPU is sm_{capability[0]}{capability[1]}"
        )
    if m >= 512 and warp_specialized_fp8_unavailable():
        pytest.skip(warp_specialized_fp8_unavailable())
    n, k = 4096, 4096
    a, b = operands(m, n, k, (E4M3, E4M3), device)
    scale_a, scale_b = block_scales(recipe, m, n, k, device, "torch")
    out = tritongemm.scaled_mm(a, b, scale_a, scale_b, out_dtype=torch.bfloat16)
    assert [p["kernel"] for p in plans] == ["gluon_ws" if m >= 512 else "pointer"], plans
    assert_fits_block_scales(plans[0]["config"])
    check(out, a, b, scale_a, scale_b, recipe, torch.bfloat16)


@pytest.mark.gpu
@pytest.mark.parametrize("recipe", RECIPES, ids=RECIPE_IDS.get)
@pytest.mark.parametrize("m", [48, 1024])
def test_gpu_repeated_calls_read_each_calls_scales(device, recipe, m):
    """Repeated calls with block scales in torch's layouts take the fast path (the first is remembered)
    and every call reads its own scales and operands; scales in a layout that needs a copy are not
    remembered, and their calls stay right."""
    n, k = 512, 1024
    launch.clear_plan_cache()
    for layout in ("torch", "contiguous"):
        for _ in range(3):
            a, b = operands(m, n, k, (E4M3, E4M3), device)
            scale_a, scale_b = block_scales(recipe, m, n, k, device, layout)
            ours = tritongemm.scaled_mm(a, b, scale_a, scale_b, out_dtype=torch.bfloat16)
            check(ours, a, b, scale_a, scale_b, recipe, torch.bfloat16)
        key = tritongemm.frontend.scaled._fast_key(a, b, scale_a, scale_b, torch.bfloat16, False, "none")
        copied = not all(
            t.is_contiguous() for t in tritongemm.frontend.scaled._kernel_views(recipe, scale_a, scale_b)
        )
        assert (key in launch.PLANS.entries) == (not copied), (layout, copied)


@pytest.mark.gpu
@pytest.mark.parametrize("recipe", RECIPES, ids=RECIPE_IDS.get)
def test_gpu_forced_warp_specialized_tiles(device, recipe):
    """Tiles the caller forces on the warp-specialized kernel, made fit for block scales (or kept)."""
    if torch.cuda.get_device_capability(device) != (9, 0) or warp_specialized_fp8_unavailable():
        pytest.skip("the warp-specialized fp8 kernel is sm_90's and needs Gluon's precise fp8 wgmma")
    m, n, k = 1000, 2048, 1000
    a, b = operands(m, n, k, (E4M3, E4M3), device)
    scale_a, scale_b = block_scales(recipe, m, n, k, device, "torch")
    for name in ("ws-128x128-w8", "ws-128x128-w8-stream-k", "ws-128x256-w8-subtile", "ws-64x128-w4"):
        forced = CALLER_TILES[name][0]
        for out_dtype in (torch.bfloat16, torch.float32):
            out = tritongemm.scaled_mm(a, b, scale_a, scale_b, out_dtype=out_dtype, config=forced)
            check(out, a, b, scale_a, scale_b, recipe, out_dtype, what=f"{name} -> {out_dtype}")


@pytest.mark.gpu
@pytest.mark.parametrize("m", [16, 256], ids=["few-rows", "warp-specialized"])
def test_gpu_precise_accumulation_at_long_k(device, m):
    recipe = "blockwise_1x128_128x128"
    n, k = 256, 8192
    a, b = operands(m, n, k, (E4M3, E4M3), device)
    scale_a, scale_b = block_scales(recipe, m, n, k, device, "torch")
    out = tritongemm.scaled_mm(a, b, scale_a, scale_b, out_dtype=torch.float32)
    check(out, a, b, scale_a, scale_b, recipe, torch.float32)
