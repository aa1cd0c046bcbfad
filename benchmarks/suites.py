"""What is measured: the suites' shape lists and the implementations they compare.

Suites (``python -m benchmarks run --suite NAME``):

* ``square``    M = N = K, powers of two 256..8192, plus 5120x5120x4096 with A
                row-major and B column-major (layout ``NT`` here; BLAS calls it ``TN``).
* ``llm``       Llama-3 8B / 70B prefill linear layers (QKV, O, gate+up, down)
                at M = 1024, 4096, 8192 tokens; weights stored as nn.Linear does
                (N, K), so B = W.T is column-major (``NT``).
* ``decode``    the same layers at M = 1, 8, 16, 32, 64, 128.
* ``stages``    num_stages 1..5 at fixed 128x256x64 tiles, 8 warps (the pipeline ladder).
* ``hierarchy`` block_m x block_n x num_warps at fixed 3 stages.
* ``backward``  autograd forward + backward of ``tritongemm.matmul`` vs torch.
* ``decomposition`` long K (512x512x65536, 1024x1024x32768) and one wave of
                128x128 tiles plus a sliver (896x2432x4096: 133 tiles, 1536x1536x8192:
                144 tiles on 132 SMs) with sliced-K, split-K and Stream-K forced.
* ``unaligned`` leading dimensions that are not multiples of 16 bytes: odd sizes,
                powers of two +- 1, primes, odd N or K under nn.Linear's layout,
                every layout, small shapes near the copy's break-even, strides
                with a factor of 2, 4 or 8 only, and aligned controls; with the
                padding policy forced each way, to check the cost model's choice.

Every case compares, on the same inputs in the same process: cuBLAS
(``torch.matmul``), ``torch.compile(mode="max-autotune-no-cudagraphs")`` unless
disabled, tritongemm's heuristic, and the suite's tritongemm variants.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

import tritongemm
from tritongemm import PIPELINES, TileConfig
from tritongemm.launch import problem_of, set_padding
from tritongemm.planning.configs import DECOMPOSITIONS

from . import harness
from .harness import Case, Impl
from .shape_classes import LlamaDims, family_cases, shortk_cases

# ----------------------------------------------------------------------------------
# Model presets
# ----------------------------------------------------------------------------------


#: Llama 3 configurations (config.json of Meta-Llama-3-8B / -70B).
LLAMA3: dict[str, LlamaDims] = {
    "llama3-8b": LlamaDims(hidden=4096, intermediate=14336, n_heads=32, n_kv_heads=8),
    "llama3-70b": LlamaDims(hidden=8192, intermediate=28672, n_heads=64, n_kv_heads=8),
}

PREFILL_TOKENS = (1024, 4096, 8192)
DECODE_TOKENS = (1, 8, 16, 32, 64, 128)
SQUARE_SIZES = (256, 512, 1024, 1536, 2048, 3072, 4096, 6144, 8192)  # powers of two and in between
STAGES_SIZES = (2048, 4096, 8192)
STAGES_RANGE = (1, 2, 3, 4, 5)
HIERARCHY_SIZES = (4096, 8192)
HIERARCHY_BLOCKS = (64, 128, 256)
HIERARCHY_WARPS = (4, 8)
HIERARCHY_STAGES = 3


# ----------------------------------------------------------------------------------
# Shape lists
# ----------------------------------------------------------------------------------
def square_cases() -> list[Case]:
    cases = [Case("square", "square", f"{s}x{s}x{s}", s, s, s, "NN", s, "M = N = K") for s in SQUARE_SIZES]
    # A row-major, B column-major: the layout cuBLAS (column-major) calls "TN".
    cases.append(Case("square", "square NT", "5120x5120x4096 NT", 5120, 5120, 4096, "NT", 5120, "M = N"))
    return cases


def _llama_cases(suite: str, tokens: Sequence[int]) -> list[Case]:
    cases = []
    for model, dims in LLAMA3.items():
        for proj, n, k in dims.projections():
            for m in tokens:
                cases.append(
                    Case(
                        suite,
                        f"{model} {proj}",
                        f"{model} {proj} M={m} N={n} K={k}",
                        m,
                        n,
                        k,
                        "NT",
                        m,
                        "M (tokens)",
                    )
                )
    return cases


def llm_cases() -> list[Case]:
    return _llama_cases("llm", PREFILL_TOKENS)


def decode_cases() -> list[Case]:
    return _llama_cases("decode", DECODE_TOKENS)


def decomposition_cases() -> list[Case]:
    """Where sliced-K leaves SMs idle: long K over few tiles, and one wave of 128x128 tiles plus a sliver (132 SMs)."""
    shapes = [
        ("long K", 512, 512, 65536),
        ("long K", 1024, 1024, 32768),
        ("wave + sliver", 896, 2432, 4096),
        ("wave + sliver", 1536, 1536, 8192),
    ]
    return [Case("decomposition", group, f"{m}x{n}x{k}", m, n, k, "NN", k, "K") for group, m, n, k in shapes]


def stages_cases() -> list[Case]:
    return [Case("stages", "stages", f"{s}x{s}x{s}", s, s, s, "NN", s, "M = N = K") for s in STAGES_SIZES]


def hierarchy_cases() -> list[Case]:
    return [
        Case("hierarchy", "hierarchy", f"{s}x{s}x{s}", s, s, s, "NN", s, "M = N = K") for s in HIERARCHY_SIZES
    ]


def backward_cases() -> list[Case]:
    cases = [
        Case("backward", "square", f"{s}x{s}x{s} fwd+bwd", s, s, s, "NN", s, "M = N = K", True)
        for s in (1024, 2048, 4096, 8192)
    ]
    dims = LLAMA3["llama3-8b"]
    for proj, n, k in dims.projections():
        cases.append(
            Case(
                "backward",
                "llama3-8b M=4096",
                f"llama3-8b {proj} M=4096 fwd+bwd",
                4096,
                n,
                k,
                "NT",
                n,
                "N",
                True,
            )
        )
    return cases


def unaligned_cases() -> list[Case]:
    """Odd leading dimensions and their neighbours; ``x`` is the smallest odd dimension (or M)."""
    shapes = [
        ("odd dimensions", 4097, 4097, 4097, "NN"),
        ("odd dimensions", 3001, 5003, 1009, "NN"),
        ("odd dimensions", 4096, 4096, 4097, "NT"),
    ]
    shapes += [("powers of two +- 1", s, s, s, "NN") for s in (1023, 1025, 2047, 2049, 4095, 8191, 8193)]
    shapes += [
        ("primes", 1009, 1009, 1009, "NN"),
        ("primes", 5003, 3001, 7919, "NN"),
        ("primes", 7919, 7919, 7919, "NN"),
    ]
    shapes += [
        ("layouts", m, n, k, layout)
        for m, n, k in ((4097, 4097, 4097), (3001, 5003, 1009))
        for layout in ("NT", "TN", "TT")
    ]
    shapes += [("odd N (linear)", 4096, n, 4096, "NT") for n in (4097, 32001, 50257)]
    shapes += [("odd K (linear)", 4096, 4096, k, "NT") for k in (4095, 11007)]
    shapes += [("small", s, s, s, "NN") for s in (255, 257, 511, 513)]
    shapes += [("stride factor 2 / 4 / 8", s, s, s, "NN") for s in (4098, 4100, 4104)]
    shapes += [("aligned control", 4096, 4096, 4096, layout) for layout in ("NN", "NT")]
    return [
        Case(
            "unaligned",
            group,
            f"{m}x{n}x{k} {layout}",
            m,
            n,
            k,
            layout,
            min([d for d in (m, n, k) if d % 8] or [m]),
            "smallest unaligned dim",
        )
        for group, m, n, k, layout in shapes
    ]


# ----------------------------------------------------------------------------------
# Implementations
# ----------------------------------------------------------------------------------
def cublas() -> Impl:
    return Impl("cublas", "cublas", torch.matmul, variant="torch.matmul")


def _config_of(config: TileConfig | None, pipeline: str | None):
    def config_of(a: torch.Tensor, b: torch.Tensor) -> TileConfig:
        return tritongemm.select_config(problem_of(a, b), tritongemm.device_info(a.device), config, pipeline)

    return config_of


_HEURISTIC_MEMO: dict = {}


def _heuristic(a: torch.Tensor, b: torch.Tensor) -> TileConfig:
    # Memoized so the heuristic impl pays no more host time per call than plain matmul.
    key = (a.shape, a.stride(), b.shape, b.stride(), a.dtype, a.device)
    cfg = _HEURISTIC_MEMO.get(key)
    if cfg is None:
        cfg = _HEURISTIC_MEMO[key] = tritongemm.heuristic_config(
            problem_of(a, b), tritongemm.device_info(a.device)
        )
    return cfg


def _planned(a: torch.Tensor, b: torch.Tensor) -> TileConfig:
    return tritongemm.explain(a, b).config


def tritongemm_heuristic() -> Impl:
    """The untuned dispatch, as a user without a tuning cache gets it.

    Plain ``tritongemm.matmul`` when the tuning cache is empty: the plan's own
    refinements (the element-wise tile for odd leading dimensions, the
    warp-specialized kernel) and the repeated-call fast path apply as they do
    for users.  With a tuning cache present, the heuristic's config is passed
    explicitly (which those refinements, made for the heuristic's own choice, leave alone).
    """
    if not tuning_cache_has_entries():
        return Impl("tritongemm", "tritongemm", tritongemm.matmul, variant="heuristic", config_of=_planned)
    return Impl(
        "tritongemm",
        "tritongemm",
        lambda a, b: tritongemm.matmul(a, b, config=_heuristic(a, b)),
        variant="heuristic",
        config_of=_heuristic,
    )


def tritongemm_tuned() -> Impl:
    """Plain ``tritongemm.matmul``: the tuning cache's config where it has one."""
    return Impl(
        "tritongemm:tuned", "tritongemm", tritongemm.matmul, variant="tuned", config_of=_config_of(None, None)
    )


def tritongemm_pipeline(pipeline: str) -> Impl:
    """The heuristic's tiles under one of the three mainloop schemes."""
    return Impl(
        f"tritongemm:{pipeline}",
        "tritongemm",
        functools.partial(tritongemm.matmul, pipeline=pipeline),
        variant=pipeline,
        config_of=_config_of(None, pipeline),
    )


def tritongemm_config(name: str, variant: str, config: TileConfig) -> Impl:
    return Impl(
        name,
        "tritongemm",
        functools.partial(tritongemm.matmul, config=config),
        variant=variant,
        config=config,
        config_of=_config_of(config, None),
    )


def tuning_cache_has_entries() -> bool:
    """Is there a tuning cache to compare against (e.g. TRITONGEMM_CACHE_FILE from a tune run)?"""
    try:
        from tritongemm.tuning import cache

        return bool(cache.load())
    except Exception:
        return False


def compile_available() -> bool:
    return hasattr(torch, "compile") and torch.cuda.is_available()


def torch_compile() -> Impl:
    """A fresh ``torch.compile(torch.matmul, mode="max-autotune-no-cudagraphs")`` for one case.

    Dynamo's caches are reset first: one compiled function recompiling for
    every new shape would hit the recompile limit and silently fall back to
    eager after a few cases.
    """
    torch._dynamo.reset()
    fn = torch.compile(torch.matmul, mode="max-autotune-no-cudagraphs", dynamic=False)
    return Impl("torch.compile", "torch.compile", fn, variant="max-autotune-no-cudagraphs")


def sabotaged() -> Impl:
    """A deliberately wrong GEMM (drops the last eighth of K): the gate must reject it."""

    def wrong(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        keep = a.shape[-1] - max(a.shape[-1] // 8, 1)
        return torch.matmul(a[..., :keep], b[..., :keep, :])

    return Impl("sabotaged", "test", wrong, variant="drops K/8 (gate check)")


def tritongemm_decomposition(decomposition: str) -> Impl:
    """The heuristic's tiles with one way of sharing the K loop forced."""

    def config_of(a: torch.Tensor, b: torch.Tensor) -> TileConfig:
        return tritongemm.select_config(
            problem_of(a, b), tritongemm.device_info(a.device), decomposition=decomposition
        )

    return Impl(
        f"tritongemm:{decomposition}",
        "tritongemm",
        functools.partial(tritongemm.matmul, decomposition=decomposition),
        variant=decomposition,
        config_of=config_of,
    )


def tritongemm_padding(policy: str) -> Impl:
    """The heuristic's config with unaligned operands always / never copied to aligned workspaces
    (each policy has its own launch cache: switching per call re-plans nothing)."""

    def run(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        old = set_padding(policy)
        try:
            return tritongemm.matmul(a, b, config=_heuristic(a, b))
        finally:
            set_padding(old)

    return Impl(
        f"tritongemm:pad-{policy}", "tritongemm", run, variant=f"padding={policy}", config_of=_heuristic
    )


def padding_impls() -> list[Impl]:
    return [tritongemm_padding("always"), tritongemm_padding("never")]


def decomposition_impls() -> list[Impl]:
    return [tritongemm_decomposition(d) for d in DECOMPOSITIONS]


def pipeline_impls() -> list[Impl]:
    return [tritongemm_pipeline(p) for p in PIPELINES]


def stage_configs(dtype: torch.dtype) -> list[tuple[int, TileConfig]]:
    """128x256 CTA tiles, 8 warps, K step 64 (128 bytes of fp16), 1..5 stages."""
    block_k = 128 // torch.empty((), dtype=dtype).element_size()
    return [
        (s, TileConfig(block_m=128, block_n=256, block_k=block_k, group_m=8, num_warps=8, num_stages=s))
        for s in STAGES_RANGE
    ]


def stages_impls(dtype: torch.dtype) -> list[Impl]:
    impls = []
    for stages, cfg in stage_configs(dtype):
        impls.append(tritongemm_config(f"tritongemm:stages={stages}", "stages", cfg))
    return impls


def hierarchy_configs(dtype: torch.dtype) -> list[TileConfig]:
    block_k = 128 // torch.empty((), dtype=dtype).element_size()
    return [
        TileConfig(
            block_m=bm, block_n=bn, block_k=block_k, group_m=8, num_warps=w, num_stages=HIERARCHY_STAGES
        )
        for w in HIERARCHY_WARPS
        for bm in HIERARCHY_BLOCKS
        for bn in HIERARCHY_BLOCKS
    ]


def hierarchy_impls(dtype: torch.dtype) -> list[Impl]:
    impls = []
    for cfg in hierarchy_configs(dtype):
        name = f"tritongemm:{cfg.block_m}x{cfg.block_n}w{cfg.num_warps}"
        impls.append(tritongemm_config(name, "hierarchy", cfg))
    return impls


# ----------------------------------------------------------------------------------
# The registry
# ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Suite:
    name: str
    description: str
    cases: Callable[[], list[Case]]
    #: The suite's own tritongemm variants for a dtype (baselines are added by ``implementations``).
    variants: Callable[[torch.dtype], list[Impl]]
    default_dtypes: tuple[str, ...] = ("fp16", "bf16")


SUITES: dict[str, Suite] = {
    s.name: s
    for s in (
        Suite(
            "square", "M = N = K, 256..8192, plus 5120x5120x4096 NT", square_cases, lambda d: pipeline_impls()
        ),
        Suite("llm", "Llama-3 8B/70B prefill linear layers", llm_cases, lambda d: pipeline_impls()),
        Suite(
            "decode",
            "Llama-3 8B/70B linear layers at decode batch sizes",
            decode_cases,
            lambda d: pipeline_impls(),
        ),
        Suite("stages", "num_stages 1..5 at 128x256x64, 8 warps", stages_cases, stages_impls, ("fp16",)),
        Suite(
            "hierarchy",
            "block_m x block_n x num_warps at 3 stages",
            hierarchy_cases,
            hierarchy_impls,
            ("fp16",),
        ),
        Suite("backward", "autograd forward + backward", backward_cases, lambda d: []),
        Suite(
            "families", "decoder linears of Qwen2.5/Phi-3/Gemma-2/Mistral-Nemo", family_cases, lambda d: []
        ),
        Suite(
            "shortk",
            "many tiles, short K: encoder widths at M >= 8k, K = 128-256",
            shortk_cases,
            lambda d: [],
        ),
        Suite(
            "decomposition",
            "sliced-K, split-K and Stream-K on long-K and wave-quantized shapes",
            decomposition_cases,
            lambda d: decomposition_impls(),
        ),
        Suite(
            "unaligned",
            "leading dimensions not a multiple of 16 bytes, padding forced each way",
            unaligned_cases,
            lambda d: padding_impls(),
        ),
    )
}


def implementations(
    suite: Suite, dtype: torch.dtype, *, compile: bool = True, include_sabotaged: bool = False
) -> list[Impl]:
    """cuBLAS first (the speedups' baseline), then tritongemm, its variants, torch.compile."""
    impls = [cublas(), tritongemm_heuristic(), *suite.variants(dtype)]
    if tuning_cache_has_entries():
        impls.insert(2, tritongemm_tuned())
    if include_sabotaged:
        impls.append(sabotaged())
    if compile and compile_available():
        impls.append(torch_compile())
    return impls


def parse_dtypes(text: str | None, suite: Suite) -> list[torch.dtype]:
    names = [t.strip() for t in text.split(",") if t.strip()] if text else list(suite.default_dtypes)
    unknown = [n for n in names if n not in harness.DTYPES]
    if unknown:
        raise ValueError(f"unknown dtype(s) {unknown}; choose from {sorted(harness.DTYPES)}")
    return [harness.DTYPES[n] for n in names]


def run_suite(
    name: str,
    dtypes: str | Sequence[str] | None = None,
    out: str | Path | None = None,
    *,
    compile: bool = True,
    case_filter: str | None = None,
    impl_filter: str | None = None,
    include_sabotaged: bool = False,
    ceilings: bool = True,
    warmup_ms: float = 25,
    rep_ms: float = 100,
    rounds: int = harness.ROUNDS,
    progress: bool = True,
    plots: bool = True,
) -> harness.RunSummary:
    """Run one suite on the current CUDA device; write ``<out>/<suite>.csv``, its env sidecar and figures.

    The function a GPU script calls, e.g. ``run_suite("square", "fp16,bf16")``.
    ``case_filter`` keeps cases whose label contains it; ``impl_filter`` (comma
    separated substrings) keeps implementations whose name contains one of them
    (cuBLAS always runs: it is the gate's reference and the speedups' baseline).
    """
    if not torch.cuda.is_available():
        raise RuntimeError("run_suite needs a CUDA GPU; `python -m benchmarks quick` runs a CPU demo")
    if tritongemm.interpreter_enabled():
        raise RuntimeError("run_suite: TRITON_INTERPRET=1 is set; unset it to time the compiled kernels")
    suite = SUITES[name]
    if isinstance(dtypes, str) or dtypes is None:
        dtype_list = parse_dtypes(dtypes, suite)
    else:
        dtype_list = parse_dtypes(",".join(dtypes), suite)
    cases = [c for c in suite.cases() if not case_filter or case_filter in c.label]
    wanted = [w.strip() for w in impl_filter.split(",")] if impl_filter else None

    def impls_for(case: Case, dtype: torch.dtype) -> list[Impl]:
        impls = implementations(suite, dtype, compile=compile, include_sabotaged=include_sabotaged)
        if wanted:
            impls = [i for i in impls if i.family == "cublas" or any(w in i.name for w in wanted)]
        return impls

    device = torch.device("cuda", torch.cuda.current_device())
    env = harness.environment(device)
    out_dir = Path(out) if out is not None else harness.default_results_dir(env)
    rows: list[dict] = []
    if ceilings:
        rows += harness.measure_ceilings(device, warmup_ms=warmup_ms, rep_ms=rep_ms)
    rows += harness.run_cases(
        cases,
        dtype_list,
        impls_for,
        cublas(),
        device=device,
        warmup_ms=warmup_ms,
        rep_ms=rep_ms,
        rounds=rounds,
        progress=progress,
    )
    extra = {
        "suite": name,
        "l2_rotation_factor": harness.L2_ROTATION_FACTOR,
        "gate_tolerance": {harness.DTYPE_NAMES[d]: harness.gate_tolerance(d) for d in dtype_list},
    }
    csv = harness.write_results(rows, out_dir / f"{name}.csv", env, extra)
    summary = harness.RunSummary(csv=csv)
    summary.failed = [
        f"{r['case']} {r.get('dtype')} {r['impl']}: {r['status']} {r.get('message', '')}"
        for r in rows
        if r.get("status") not in (harness.OK, harness.INVALID) and r.get("family") != "test"
    ]  # the sabotaged impl is meant to fail
    if plots:
        summary.figures = harness.plot_safely(csv, out_dir)
    return summary


def summary_table(csv: str | Path) -> str:
    """TFLOP/s (and GB/s for memory-bound decode) per case (rows) and implementation (columns)."""
    df = harness.read_results(csv)
    df = df[(df["suite"] != "ceiling") & (df["status"] == harness.OK)]
    if df.empty:
        return "(no successful measurements)"
    metrics = [("tflops", "TFLOP/s")] + ([("gbps", "GB/s")] if (df["suite"] == "decode").any() else [])
    parts = []
    for col, name in metrics:
        table = df.pivot_table(
            index=["dtype", "case"], columns="impl", values=col, aggfunc="first", sort=False
        )
        parts.append(f"[{name}]\n" + table.round(1).to_string())
    return "\n\n".join(parts)


__all__ = [
    "LLAMA3",
    "SUITES",
    "Suite",
    "implementations",
    "run_suite",
    "summary_table",
    "square_cases",
    "llm_cases",
    "decode_cases",
    "stages_cases",
    "hierarchy_cases",
    "backward_cases",
    "unaligned_cases",
    "padding_impls",
    "stage_configs",
    "hierarchy_configs",
    "sabotaged",
    "cublas",
]
