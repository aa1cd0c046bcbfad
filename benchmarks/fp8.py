"""``python -m benchmarks fp8``: ``tritongemm.scaled_mm`` against ``torch._scaled_mm``, fp8 e4m3 in, bf16 out.

Every shape runs five recipes: ``tensorwise`` scales (one fp32 scale per operand, 0-d) and
``rowwise`` scales (``scale_a`` (M, 1), ``scale_b`` (1, N)), each with ``use_fast_accum`` off and
on (``rowwise+fast_accum``, ...); and ``blockwise`` scales, DeepSeek-V3's forward recipe (the
library's ``blockwise_1x128_128x128``): a scale per row of ``a`` per 128 of K (1 x 128 blocks of
the activations) and one per 128 x 128 block of the weight, ``scale_a`` (M, ceil(K/128)) and
``scale_b`` (ceil(K/128), ceil(N/128)) in ``torch._scaled_mm``'s layouts (``scale_a``
M-contiguous, ``scale_b`` the transpose of a row-major (ceil(N/128), ceil(K/128)) weight scale),
``use_fast_accum`` off.  ``--recipes`` times only some of them.  The operands are laid out as
``torch._scaled_mm`` requires: ``a`` = randn(M, K) as float8_e4m3fn, row-major; ``b`` the view
``w.t()`` of a row-major (N, K) e4m3 weight (layout ``NT``); ``out_dtype`` bf16.

The shapes (``cases()``): 4096^3 and 8192x8192x4096; Llama-3-8B's attention (N x K = 4096 x 4096)
and MLP (14336 x 4096) projections at M = 16 ... 8192 tokens; Qwen2.5-7B's MLP projection
1024x18944x3584; the skinny 256x5120x5120 and 16x4096x4096.  A shape listed in two groups is
measured once, in its projection sweep (19 shapes, 95 problems).

The harness's rules hold: inputs rotate over enough copies that together they exceed twice the
L2 cache; before anything is timed, each output (ours and torch's) on the first and the last copy
is compared with the float64 product of the dequantized operands (for tensorwise and rowwise
scales, ``a @ b`` scaled; for block scales, each operand's blocks scaled before the product;
relative Frobenius error, held to the harness's bf16 gate tolerance; both errors are in the CSV),
and a wrong output is never timed; then the ten (recipe, implementation) pairs of a shape are
timed with ``do_bench`` in ``--rounds`` interleaved rounds, the order reversed every other round,
each row holding the median of all its samples.

One row per (shape, recipe, implementation), in the results schema: ``case`` is "MxNxK recipe",
``variant`` the recipe, ``dtype`` ``fp8_e4m3``.  ``torch._scaled_mm`` is the baseline row (family
``cublas``, as every suite's torch baseline; torch runs it on cuBLASLt or, for some rowwise cases,
on a CUTLASS kernel of its own), so ``speedup_vs_cublas`` on tritongemm's rows is torch's time /
ours (> 1: tritongemm faster).  Own columns: ``scaling``, ``fast_accum``, ``out_dtype`` and
``kernel`` (which tritongemm kernel ran).  Writes ``fp8.csv`` and ``fp8_speedup.png`` under
``benchmarks/results/<gpu>/``.  Needs a CUDA GPU with fp8 tensor cores (sm_89 or newer).
"""

from __future__ import annotations

import functools
import math
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

import tritongemm
from tritongemm.frontend.scaled import block_scale_shapes, dequantize
from tritongemm.planning.call import BLOCK_SCALINGS, SCALE_BLOCK_K
from tritongemm.testing import random_tensor

from . import harness, runner

SUITE = "fp8"
FP8 = torch.float8_e4m3fn
OUT_DTYPE = torch.bfloat16
#: The ``dtype`` column: the operands' format (the output is bf16, in ``out_dtype``).
DTYPE_NAME = "fp8_e4m3"
FIGURE = "fp8_speedup.png"
#: Interleaved timing rounds per shape, unless ``--rounds`` says otherwise (as the GEMM suites).
ROUNDS = harness.ROUNDS
#: What ``rel_err`` is measured against, noted on every timed row (the GEMM suites compare with cuBLAS).
REFERENCE_NOTE = "rel_err against float64 of the dequantized fp8 operands"

# ----------------------------------------------------------------------------------
# Shapes and recipes
# ----------------------------------------------------------------------------------
#: Tokens (M) swept over each projection: decode batches to long prefills.
TOKENS = (16, 64, 256, 512, 1024, 2048, 4096, 8192)
#: Projection weights (N, K): Llama-3-8B's attention projections and its MLP's up / gate projection.
PROJECTIONS: dict[str, tuple[int, int]] = {
    "proj N=4096 K=4096": (4096, 4096),
    "proj N=14336 K=4096": (14336, 4096),
}
#: Single shapes (M, N, K) by group; 1024x18944x3584 is Qwen2.5-7B's MLP up / gate projection.
SHAPES: tuple[tuple[str, tuple[tuple[int, int, int], ...]], ...] = (
    ("square", ((4096, 4096, 4096), (8192, 8192, 4096))),
    ("llm", ((2048, 14336, 4096), (1024, 18944, 3584), (4096, 4096, 4096))),
    ("skinny", ((256, 5120, 5120), (16, 4096, 4096))),
)


@dataclass(frozen=True)
class Fp8Case:
    """One problem size, C[M, N] = A[M, K] @ B[K, N] with fp8 A and B and a bf16 C."""

    group: str
    m: int
    n: int
    k: int

    @property
    def shape(self) -> str:
        return f"{self.m}x{self.n}x{self.k}"

    @property
    def flops(self) -> int:
        return 2 * self.m * self.n * self.k

    @property
    def bytes(self) -> int:
        """Compulsory DRAM traffic: A and B (one byte an element) read and C (bf16) written once."""
        return self.m * self.k + self.k * self.n + self.m * self.n * OUT_DTYPE.itemsize


#: The block-scaled recipes (the ``scaling`` column) and the library's names for them
#: (``planning.call.BLOCK_SCALINGS``, ``Epilogue.scaling``).
BLOCK_RECIPES = {"blockwise": "blockwise_1x128_128x128"}


@dataclass(frozen=True)
class Recipe:
    """How the operands are scaled and the products summed."""

    scaling: str  # "tensorwise", "rowwise" or "blockwise" (BLOCK_RECIPES)
    fast_accum: bool

    @property
    def name(self) -> str:
        return self.scaling + ("+fast_accum" if self.fast_accum else "")

    @property
    def blocked(self) -> bool:
        """Scales per block of K (their reference cannot scale ``a @ b``)."""
        return self.scaling in BLOCK_RECIPES

    @property
    def library_scaling(self) -> str:
        """The scaling as tritongemm names it (``Epilogue.scaling``)."""
        return BLOCK_RECIPES.get(self.scaling, self.scaling)


#: Blockwise is 1x128 activation blocks x 128x128 weight blocks, without fast accumulation (torch's
#: block-scaled GEMMs ignore or refuse it).
RECIPES = (
    *(Recipe(s, fast) for s in ("tensorwise", "rowwise") for fast in (False, True)),
    Recipe("blockwise", False),
)


def select_recipes(names: str | Sequence[str] | None = None) -> tuple[Recipe, ...]:
    """The suite's recipes, or only those named (``--recipes blockwise,rowwise``; a comma list or a
    sequence), in the suite's order; ``ValueError`` naming the choices for a name it does not know."""
    if names is None:
        return RECIPES
    if isinstance(names, str):
        names = names.split(",")
    wanted = {n.strip() for n in names if n.strip()}
    by_name = {r.name: r for r in RECIPES}
    unknown = sorted(wanted - by_name.keys())
    if unknown or not wanted:
        raise ValueError(
            f"unknown fp8 recipe(s) {', '.join(unknown) or '(none given)'}; choose from {', '.join(by_name)}"
        )
    return tuple(r for r in RECIPES if r.name in wanted)


def cases() -> list[Fp8Case]:
    """The suite's shapes: the singles first, then the two projection sweeps by M.

    A shape in a sweep and in a single group (4096^3, 2048x14336x4096, 16x4096x4096) is measured
    once, in its sweep, so each sweep's line over M has every point.
    """
    sweeps = [Fp8Case(group, m, n, k) for group, (n, k) in PROJECTIONS.items() for m in TOKENS]
    seen = {(c.m, c.n, c.k) for c in sweeps}
    singles = []
    for group, shapes in SHAPES:
        for shape in shapes:
            if shape not in seen:
                seen.add(shape)
                singles.append(Fp8Case(group, *shape))
    return singles + sweeps


def select_cases(shapes: Sequence[tuple[int, int, int]] | None = None) -> list[Fp8Case]:
    """The suite's shapes, or only ``shapes`` (``--shape MxNxK``); one the suite does not list is
    measured too, in the group ``custom``."""
    known = cases()
    if not shapes:
        return known
    by_size = {(c.m, c.n, c.k): c for c in known}
    wanted = dict.fromkeys(tuple(s) for s in shapes)
    return [by_size.get(s, Fp8Case("custom", *s)) for s in wanted]


# ----------------------------------------------------------------------------------
# Implementations and inputs
# ----------------------------------------------------------------------------------
Fn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, bool], torch.Tensor]


@dataclass(frozen=True)
class Fp8Impl:
    """A way to compute ``fn(a, b, scale_a, scale_b, use_fast_accum)``; ``family`` as in the schema."""

    name: str
    family: str
    fn: Fn


def _ours(a, b, scale_a, scale_b, fast_accum: bool) -> torch.Tensor:
    return tritongemm.scaled_mm(a, b, scale_a, scale_b, out_dtype=OUT_DTYPE, use_fast_accum=fast_accum)


def _torch(a, b, scale_a, scale_b, fast_accum: bool) -> torch.Tensor:
    return torch._scaled_mm(a, b, scale_a, scale_b, out_dtype=OUT_DTYPE, use_fast_accum=fast_accum)


IMPLS = (
    Fp8Impl("tritongemm.scaled_mm", "tritongemm", _ours),
    Fp8Impl("torch._scaled_mm", "cublas", _torch),
)


@dataclass
class InputSet:
    """One copy of a shape's operands, with the scales of every recipe."""

    a: torch.Tensor
    b: torch.Tensor
    scales: dict[str, tuple[torch.Tensor, torch.Tensor]]

    def args(self, recipe: Recipe) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        return (self.a, self.b, *self.scales[recipe.scaling])


def input_set_bytes(case: Fp8Case) -> int:
    """What one copy holds: both fp8 operands and every recipe's fp32 scales (a call reads the
    operands and one recipe's scales; counting them all errs towards one copy more)."""
    block = sum(
        math.prod(sa) + math.prod(sb)
        for name, (sa, sb) in block_scale_shapes(case.m, case.n, case.k).items()
        if name in BLOCK_RECIPES.values()
    )
    return case.m * case.k + case.n * case.k + 4 * (2 + case.m + case.n + block)


def _scales(shape: tuple[int, ...], low: float, device, gen: torch.Generator) -> torch.Tensor:
    """Random fp32 scales in [low, 2 low)."""
    return low * (1 + torch.rand(shape, generator=gen, device=device, dtype=torch.float32))


def make_inputs(case: Fp8Case, device: torch.device, n_copies: int, seed: int = 0) -> list[InputSet]:
    """``n_copies`` independent sets: random normal operands rounded to e4m3, and random scales.

    scale_a lies in [2, 4) and scale_b in [1/8, 1/4): ranges that do not overlap and exclude 1, so a
    scale dropped, applied twice or taken from the other operand errs by 50% or more (the gate
    sees it), and their product (< 1) keeps the output well inside bf16's range.  Block scales are
    random per block, so one applied to the wrong block errs too; they are made in the layouts
    ``torch._scaled_mm`` takes: ``scale_a`` (M, K/128) M-contiguous, ``scale_b`` (K/128, N/128)
    the transpose of a row-major (N/128, K/128) tensor, the weight ``w``'s own (b = ``w.t()``).
    """
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    sets = []
    for _ in range(n_copies):
        a = random_tensor((case.m, case.k), torch.float32, device, gen).to(FP8)
        w = random_tensor((case.n, case.k), torch.float32, device, gen).to(FP8)
        scales = {
            "tensorwise": (_scales((), 2.0, device, gen), _scales((), 0.125, device, gen)),
            "rowwise": (_scales((case.m, 1), 2.0, device, gen), _scales((1, case.n), 0.125, device, gen)),
        }
        blocks = block_scale_shapes(case.m, case.n, case.k)
        for recipe, library in BLOCK_RECIPES.items():
            (m, kb), (_, nb) = blocks[library]
            scales[recipe] = (
                _scales((kb, m), 2.0, device, gen).t(),
                _scales((nb, kb), 0.125, device, gen).t(),
            )
        sets.append(InputSet(a, w.t(), scales))  # b = w.t(): column-major, as torch._scaled_mm requires
    return sets


def unscaled_reference(s: InputSet) -> torch.Tensor:
    """``a @ b`` in float64 on the fp8 values; each tensorwise or rowwise recipe's reference scales it
    (scaling the product instead of the operands changes it by float64 rounding only, so one product
    serves all four)."""
    return s.a.double() @ s.b.double()


def scaled_reference(raw: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor) -> torch.Tensor:
    return raw * scale_a.double() * scale_b.double()


def block_reference(s: InputSet, recipe: Recipe) -> torch.Tensor:
    """A block-scaled recipe's reference: the float64 product of the operands dequantized block by
    block (the scales vary along K, so they cannot scale ``a @ b``)."""
    rows, cols = BLOCK_SCALINGS[recipe.library_scaling]
    scale_a, scale_b = s.scales[recipe.scaling]
    a = dequantize(s.a.double(), scale_a.double(), rows, SCALE_BLOCK_K)
    return a @ dequantize(s.b.double(), scale_b.double(), SCALE_BLOCK_K, cols)


def references(s: InputSet, recipes: Sequence[Recipe]) -> dict[str, torch.Tensor]:
    """The float64 products one checked copy's outputs are held to: ``"raw"`` (``a @ b``, which
    ``reference`` scales for tensorwise and rowwise recipes) if any of ``recipes`` needs it, and each
    block-scaled recipe's own, by its ``scaling``."""
    refs = {}
    if any(not r.blocked for r in recipes):
        refs["raw"] = unscaled_reference(s)
    for r in recipes:
        if r.blocked and r.scaling not in refs:
            refs[r.scaling] = block_reference(s, r)
    return refs


def reference(recipe: Recipe, s: InputSet, refs: dict[str, torch.Tensor]) -> torch.Tensor:
    """``recipe``'s float64 reference on copy ``s``, from its ``references``."""
    if recipe.blocked:
        return refs[recipe.scaling]
    return scaled_reference(refs["raw"], *s.scales[recipe.scaling])


# ----------------------------------------------------------------------------------
# Measuring a shape
# ----------------------------------------------------------------------------------
def base_row(case: Fp8Case, recipe: Recipe) -> dict:
    return {
        "suite": SUITE,
        "group": case.group,
        "case": f"{case.shape} {recipe.name}",
        "x": case.m,
        "x_label": "M (tokens)",
        "m": case.m,
        "n": case.n,
        "k": case.k,
        "layout": "NT",
        "dtype": DTYPE_NAME,
        "backward": False,
        "variant": recipe.name,
        "flops": case.flops,
        "bytes": case.bytes,
        "intensity": case.flops / case.bytes,
        "scaling": recipe.scaling,
        "fast_accum": recipe.fast_accum,
        "out_dtype": harness.DTYPE_NAMES[OUT_DTYPE],
    }


def gate(
    impl: Fp8Impl,
    recipe: Recipe,
    sets: Sequence[InputSet],
    refs: dict[int, dict[str, torch.Tensor]],
    tol: float,
) -> harness.GateResult:
    """Run ``impl`` on the checked copies (``refs``: copy index -> its ``references``); the worst
    result, or the first that fails."""
    worst = None
    for index, copy_refs in refs.items():
        a, b, scale_a, scale_b = sets[index].args(recipe)
        with torch.no_grad():
            out = impl.fn(a, b, scale_a, scale_b, recipe.fast_accum)
        ref = reference(recipe, sets[index], copy_refs)
        result = harness.check_output(out, ref, tol, dtype=OUT_DTYPE)
        if not result.ok:
            return result
        if worst is None or result.rel_err > worst.rel_err:
            worst = result
    return worst


def kernel_columns(s: InputSet, recipe: Recipe) -> dict:
    """The config and kernel ``scaled_mm`` runs for these operands (as its launch plans them).

    A note on the row, not part of the measurement: where the plan cannot be read (an internal
    change), the row goes without it.
    """
    from tritongemm import launch
    from tritongemm.planning.call import Epilogue, GemmCall, make_request

    try:
        call = GemmCall(
            Epilogue(scaling=recipe.library_scaling),
            make_request(None),
            OUT_DTYPE,
            "fast" if recipe.fast_accum else "ieee",
        )
        out = torch.empty((s.a.shape[0], s.b.shape[1]), dtype=OUT_DTYPE, device=s.a.device)
        plan = launch.plan_for(call, s.a, s.b, out)
    except Exception:
        return {}
    return {**harness._config_columns(plan.config), "kernel": plan.kernel}


def prepare(
    case: Fp8Case,
    recipe: Recipe,
    impl: Fp8Impl,
    sets: Sequence[InputSet],
    refs: dict[int, dict[str, torch.Tensor]],
    device: torch.device,
    tol: float,
) -> harness.Prepared | dict:
    """Gate one (recipe, implementation); a finished row if it cannot be timed, else what timing needs."""
    row = {**base_row(case, recipe), "impl": impl.name, "family": impl.family, "n_copies": len(sets)}
    if impl.family == "tritongemm":
        row.update(kernel_columns(sets[0], recipe))
    failed = runner.gated(row, lambda: gate(impl, recipe, sets, refs, tol), device)
    if failed is not None:
        return failed
    rotation = harness.Rotation([s.args(recipe) for s in sets])

    def step():
        a, b, scale_a, scale_b = rotation.next()
        impl.fn(a, b, scale_a, scale_b, recipe.fast_accum)

    return harness.Prepared(row, step, None, torch.no_grad)


def measure_shape(
    case: Fp8Case,
    device: torch.device | str,
    *,
    recipes: Sequence[Recipe] = RECIPES,
    impls: Sequence[Fp8Impl] = IMPLS,
    rounds: int = ROUNDS,
    warmup_ms: float = 25,
    rep_ms: float = 100,
    l2_bytes: int | None = None,
    seed: int = 0,
    on_step: Callable[[str], None] = lambda label: None,
) -> list[dict]:
    """Rows for every (recipe, implementation) of one shape: gated, then timed in interleaved rounds.

    ``on_step(label)`` is called as each pair is gated (the progress bar's step).
    """
    device = torch.device(device)
    l2 = l2_bytes if l2_bytes is not None else harness.l2_cache_bytes(device)
    n_copies = harness.copies_to_exceed_l2(input_set_bytes(case), l2)
    pairs = [(recipe, impl) for recipe in recipes for impl in impls]
    try:
        sets = make_inputs(case, device, n_copies, seed)
        refs = {i: references(sets[i], recipes) for i in sorted({0, n_copies - 1})}
    except Exception as exc:  # e.g. out of memory: every pair recorded as not run
        runs = [
            (
                f"{case.shape} {recipe.name} {impl.name}",
                {**base_row(case, recipe), "impl": impl.name, "family": impl.family},
            )
            for recipe, impl in pairs
        ]
        return runner.not_run(runs, exc, on_step)
    tol = harness.gate_tolerance(OUT_DTYPE)
    slots: list = []
    for recipe, impl in pairs:
        on_step(f"{case.shape} {recipe.name} {impl.name}")
        slots.append(prepare(case, recipe, impl, sets, refs, device, tol))
    # Ours and torch's run side by side for each recipe, and the order reverses every other round,
    # so a drift of the GPU's clocks (power capping swings them by +-5% over about a second) falls on
    # both alike instead of on whichever ran during a slow phase.  The steps hold the inputs, freed
    # with ``slots`` once timed.
    del sets, refs
    return runner.timed_rows(slots, device, rounds, warmup_ms, rep_ms, REFERENCE_NOTE)


def run_fp8(
    case_list: Sequence[Fp8Case],
    device: torch.device | str,
    *,
    recipes: Sequence[Recipe] = RECIPES,
    rounds: int = ROUNDS,
    warmup_ms: float = 25,
    rep_ms: float = 100,
    progress: bool = True,
) -> list[dict]:
    """Every shape of ``case_list`` in ``recipes``, one after the other, with a progress bar on
    stderr (a step per (shape, recipe, implementation))."""
    measure = functools.partial(
        measure_shape, device=device, recipes=recipes, rounds=rounds, warmup_ms=warmup_ms, rep_ms=rep_ms
    )
    return runner.measure_all(case_list, len(recipes) * len(IMPLS), measure, progress)


# ----------------------------------------------------------------------------------
# Tables
# ----------------------------------------------------------------------------------
def _value(row: dict, key: str) -> float | None:
    v = row.get(key)
    if v is None:
        return None
    v = float(v)
    return None if math.isnan(v) else v


def summary_table(rows: Sequence[dict]) -> str:
    """One line per (shape, recipe): both rates and torch's time / ours."""
    by_case: dict[str, dict[str, dict]] = {}
    for r in rows:
        if r.get("suite") == SUITE and r.get("family") in ("tritongemm", "cublas"):
            by_case.setdefault(r["case"], {})[r["family"]] = r
    lines, noted = [], False
    for pair in by_case.values():
        ours, theirs = pair.get("tritongemm", {}), pair.get("cublas", {})
        first = ours or theirs
        note = "; ".join(
            f"{who} {r['status']}"
            for who, r in (("ours", ours), ("torch", theirs))
            if r and r.get("status") != harness.OK
        )
        noted = noted or bool(note)
        lines.append(
            {
                "shape": f"{first['m']}x{first['n']}x{first['k']}",
                "recipe": first.get("scaling"),
                "fast": "yes" if first.get("fast_accum") else "no",
                "ours": _value(ours, "tflops"),
                "torch": _value(theirs, "tflops"),
                "ratio": _value(ours, "speedup_vs_cublas"),
                "note": note,
            }
        )
    columns = [
        ("shape", "shape"),
        ("recipe", "recipe"),
        ("fast", "fast accum"),
        ("ours", "ours TFLOP/s"),
        ("torch", "torch TFLOP/s"),
        ("ratio", "torch ms / ours ms"),
    ]
    return harness.format_table(lines, columns + ([("note", "note")] if noted else []))


def geomeans(rows: Sequence[dict]) -> list[dict]:
    """The geometric mean of torch's time / ours per recipe, over the shapes both measured; a line
    for each recipe the rows hold (all of them, for a run of every recipe)."""
    present = {r.get("variant") for r in rows if r.get("suite") == SUITE}
    out = []
    for recipe in (r for r in RECIPES if r.name in present):
        ratios = [
            v
            for r in rows
            if r.get("suite") == SUITE
            and r.get("family") == "tritongemm"
            and r.get("variant") == recipe.name
            and (v := _value(r, "speedup_vs_cublas")) is not None
        ]
        geo = math.exp(sum(map(math.log, ratios)) / len(ratios)) if ratios else None
        out.append(
            {
                "recipe": recipe.scaling,
                "fast": "yes" if recipe.fast_accum else "no",
                "geomean": geo,
                "shapes": len(ratios),
            }
        )
    return out


def geomean_table(rows: Sequence[dict]) -> str:
    return harness.format_table(
        geomeans(rows),
        [
            ("recipe", "recipe"),
            ("fast", "fast accum"),
            ("geomean", "geomean torch ms / ours ms"),
            ("shapes", "shapes"),
        ],
    )


# ----------------------------------------------------------------------------------
# Figure
# ----------------------------------------------------------------------------------
#: One colour per recipe, in both panels.
COLORS = {
    "tensorwise": "#1f77b4",
    "tensorwise+fast_accum": "#ff7f0e",
    "rowwise": "#2ca02c",
    "rowwise+fast_accum": "#d62728",
    "blockwise": "#9467bd",
}


def fig_fp8(df):
    """Top: torch's time / ours per shape, one line per recipe, parity at 1.0.  Bottom: both
    implementations' TFLOP/s (tritongemm solid, torch dashed).  Shapes in suite order, groups
    separated; repeated runs drawn at their median."""
    import numpy as np
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D

    from . import plots

    d = df[(df["suite"] == SUITE) & (df["status"] == harness.OK) & df["tflops"].notna()]
    if d.empty:
        return None
    d = d.assign(shape=[f"{int(m)}x{int(n)}x{int(k)}" for m, n, k in zip(d["m"], d["n"], d["k"])])
    shapes = list(dict.fromkeys(d["shape"]))
    group_of = d.groupby("shape", sort=False)["group"].first()
    med = d.groupby(["shape", "variant", "family"], sort=False)[["tflops", "speedup_vs_cublas"]].median()
    known = [r.name for r in RECIPES]
    variants = [v for v in known if v in set(d["variant"])]
    variants += [v for v in dict.fromkeys(d["variant"]) if v not in known]

    def series(variant: str, family: str, column: str) -> list[float]:
        return [float(med[column].get((s, variant, family), np.nan)) for s in shapes]

    groups = [group_of[s] for s in shapes]
    starts = [i for i in range(len(shapes)) if i == 0 or groups[i] != groups[i - 1]]
    spans = list(zip(starts, starts[1:] + [len(shapes)]))
    fig = Figure(figsize=(min(plots.MAX_WIDTH_IN, 3.0 + 0.5 * len(shapes)), 8.0), layout="constrained")
    ratio_ax, rate_ax = fig.subplots(2, 1, sharex=True)
    others: dict[str, str] = {}
    handles: dict = {}
    top = 1.2
    for i, variant in enumerate(variants):
        color = COLORS.get(variant) or plots._color(variant, others)
        nudge = (i - (len(variants) - 1) / 2) * 0.06  # recipes that tie stay visible side by side
        ratio = np.array(series(variant, "tritongemm", "speedup_vs_cublas"))
        ours = np.array(series(variant, "tritongemm", "tflops"))
        theirs = np.array(series(variant, "cublas", "tflops"))
        if not np.isnan(ratio).all():
            top = max(top, float(np.nanmax(ratio)) * 1.1)
        # A line joins the shapes of one group only: the groups are different problems, not a sweep.
        for lo, hi in spans:
            x = np.arange(lo, hi) + nudge
            (line,) = ratio_ax.plot(x, ratio[lo:hi], marker="o", ms=4, lw=1.2, color=color)
            rate_ax.plot(x, ours[lo:hi], marker="o", ms=4, lw=1.2, color=color)
            rate_ax.plot(x, theirs[lo:hi], marker="x", ms=4, lw=1.0, ls="--", color=color)
            handles.setdefault(variant, line)
    ratio_ax.axhline(1.0, color="black", linestyle="--", linewidth=1)
    ratio_ax.set_ylim(0, top)
    ratio_ax.set_ylabel("torch._scaled_mm time / scaled_mm time\n(> 1: tritongemm faster)")
    rate_ax.set_ylim(bottom=0)
    rate_ax.set_ylabel("TFLOP/s")
    rate_ax.set_xlabel("problem M x N x K (fp8 e4m3 in, bf16 out)")
    rate_ax.set_xticks(np.arange(len(shapes)), shapes, rotation=60, ha="right", fontsize=7)
    rate_ax.legend(
        handles=[
            Line2D([], [], color="0.3", marker="o", ms=4, lw=1.2, label="tritongemm.scaled_mm"),
            Line2D([], [], color="0.3", marker="x", ms=4, lw=1.0, ls="--", label="torch._scaled_mm"),
        ],
        fontsize=7,
        loc="lower right",
    )
    for lo, hi in spans:
        for ax in (ratio_ax, rate_ax):
            if lo:
                ax.axvline(lo - 0.5, color="0.6", linestyle=":", linewidth=0.8)
        ratio_ax.text(
            (lo + hi - 1) / 2, 1.0, groups[lo], transform=ratio_ax.get_xaxis_transform(),
            ha="center", va="bottom", fontsize=7,
        )  # fmt: skip
    for ax in (ratio_ax, rate_ax):
        ax.grid(axis="y", alpha=0.3)
    plots._figure_legend(fig, handles, title="recipe (colour in both panels)")
    fig.suptitle(
        f"fp8 GEMMs: tritongemm.scaled_mm vs torch._scaled_mm on {plots._gpu(d)}\n"
        "same inputs, same process, medians of interleaved do_bench rounds",
        fontsize=11,
    )
    return fig


def plot_fp8(csv: str | Path, out_dir: str | Path) -> list[Path]:
    """Write ``fp8_speedup.png`` from a results CSV; the files written (none without fp8 rows)."""
    fig = fig_fp8(harness.read_results(csv))
    if fig is None:
        return []
    path = Path(out_dir) / FIGURE
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    return [path]


# ----------------------------------------------------------------------------------
# Command line
# ----------------------------------------------------------------------------------
def unavailable_reason() -> str | None:
    """Why this process cannot time fp8 kernels (None when it can)."""
    if not torch.cuda.is_available():
        return "no CUDA GPU is available"
    if tritongemm.interpreter_enabled():
        return "TRITON_INTERPRET=1 is set"
    major, minor = torch.cuda.get_device_capability()
    if (major, minor) < (8, 9):
        return f"{torch.cuda.get_device_name()} (sm_{major}{minor}) has no fp8 tensor cores"
    return None


def run_cli(args) -> int:
    """``python -m benchmarks fp8``; the exit status (2: no GPU to run on, 1: a row not measured)."""
    why = unavailable_reason()
    if why is not None:
        print(
            f"benchmarks fp8: {why}; the fp8 suite times compiled kernels against torch._scaled_mm on a "
            "CUDA GPU with fp8 tensor cores (sm_89 or newer, e.g. an H100).\n"
            "`python -m benchmarks plot fp8.csv` redraws its figure from saved results.",
            file=sys.stderr,
        )
        return 2
    try:
        recipes = select_recipes(getattr(args, "recipes", None))
    except ValueError as exc:
        print(f"benchmarks fp8: {exc}", file=sys.stderr)
        return 2
    extra = {
        "recipes": [r.name for r in recipes],
        "reference": REFERENCE_NOTE,
        "tolerance": harness.gate_tolerance(OUT_DTYPE),
    }
    device = torch.device("cuda", torch.cuda.current_device())
    run = functools.partial(run_fp8, select_cases(args.shape), recipes=recipes)
    rows, csv, out_dir, env = runner.measure_and_write(args, SUITE, device, run, extra)
    files = [csv]
    if not args.no_plots:
        files += harness.plot_safely(csv, out_dir, plot_fp8, what="figure")
    print(f"\n== fp8: tritongemm.scaled_mm vs torch._scaled_mm on {env['gpu']} ==")
    for f in files:
        print(f"wrote {f}")
    status = runner.report_failed(rows, count=True)
    print()
    print(summary_table(rows))
    print()
    print(geomean_table(rows))
    return status


__all__ = [
    "BLOCK_RECIPES",
    "FIGURE",
    "IMPLS",
    "RECIPES",
    "SUITE",
    "Fp8Case",
    "Fp8Impl",
    "InputSet",
    "Recipe",
    "cases",
    "fig_fp8",
    "geomean_table",
    "geomeans",
    "make_inputs",
    "measure_shape",
    "plot_fp8",
    "run_cli",
    "run_fp8",
    "select_cases",
    "select_recipes",
    "summary_table",
    "unavailable_reason",
]
