"""``python -m benchmarks run --suite mlp``: a whole gated MLP block, stock torch against tritongemm.

The block is ``down(act(gate(x)) * up(x))`` with bias-free projections, at the widths of
Llama-3-8B (hidden 4096, intermediate 14336, SwiGLU), Qwen2.5-7B (3584, 18944, SwiGLU) and Gemma-7B
(3072, 24576, GeGLU: the tanh GELU), at M = 1024, 2048, 4096 and 8192 tokens, forward and forward +
backward, bf16 (``--dtype`` picks another; ``--filter`` keeps the cases whose label contains it).

Three implementations on the same parameters (one set of weights per case, shared):

* ``torch``: ``MLP``, the stock module (``F.linear`` three times, the activation, the product) -- the
  baseline of ``speedup_vs_cublas`` (family ``cublas``, as every suite's torch baseline);
* ``tritongemm.nn.GatedMLP``: what ``tritongemm.nn.convert`` makes of that module (the gate and up
  projections and the product in one kernel, then ``down_proj``);
* ``tritongemm.nn.Linear``: ``convert(fuse_mlp=False)``, the three projections on tritongemm's GEMMs
  one by one, the activation and the product by torch (the gate's activation in its epilogue: no).

The harness's rules hold: inputs (``x`` and, with backward, the output's gradient) rotate over enough
copies that together they exceed twice the L2 cache (the weights, 130-450 MB a case, are far larger
than the L2 anyway); before anything is timed each implementation's output -- with backward also the
input's and every weight's gradient -- on the first and the last copy is compared with torch's
(relative Frobenius error, the harness's library tolerance: both sides round to bf16), and a wrong one
is recorded ``failed_gate`` and never timed; then a case's three implementations are timed with
``do_bench`` in ``--rounds`` interleaved rounds, the order reversed every other round.

One row per (case, implementation), in the results schema: ``group`` "<model> fwd" / "<model>
fwd+bwd", ``case`` "<model> M=<m> fwd", ``x`` = ``m`` the tokens, ``n`` the intermediate and ``k``
the hidden width, ``layout`` NT (``x @ W.T``); ``flops`` counts the three GEMMs, 6 M N K (x3 with
backward; the elementwise work is not counted), ``bytes`` the compulsory traffic: ``x`` read, three
weights read, the output written (x3 with backward).  Own columns: ``model``, ``activation``.
Writes ``mlp.csv``, ``mlp_tflops.png`` and ``mlp_speedup.png`` under ``benchmarks/results/<gpu>/``.
Sized to run in about two minutes on an H100 (24 cases, three implementations).
"""

from __future__ import annotations

import copy
import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from tritongemm.testing import random_tensor

from . import harness, runner

SUITE = "mlp"
#: (model, hidden, intermediate, activation): the config.json widths of each model's MLP.
MODELS: tuple[tuple[str, int, int, str], ...] = (
    ("llama3-8b", 4096, 14336, "silu"),
    ("qwen2.5-7b", 3584, 18944, "silu"),
    ("gemma-7b", 3072, 24576, "gelu_tanh"),
)
TOKENS = (1024, 2048, 4096, 8192)
ROUNDS = harness.ROUNDS


@dataclass(frozen=True)
class MlpCase:
    """One MLP block at M tokens: x (M, hidden) -> (M, hidden) through the intermediate width."""

    model: str
    hidden: int
    intermediate: int
    activation: str
    m: int
    backward: bool

    @property
    def mode(self) -> str:
        return "fwd+bwd" if self.backward else "fwd"

    @property
    def label(self) -> str:
        return f"{self.model} M={self.m} {self.mode}"

    @property
    def flops(self) -> int:
        return 6 * self.m * self.intermediate * self.hidden * (3 if self.backward else 1)

    def bytes(self, elem: int) -> int:
        once = (2 * self.m * self.hidden + 3 * self.hidden * self.intermediate) * elem
        return once * (3 if self.backward else 1)


def cases(models=MODELS, tokens=TOKENS) -> list[MlpCase]:
    """Per model, forward at every M, then forward + backward at every M."""
    return [
        MlpCase(model, hidden, inter, act, m, backward)
        for model, hidden, inter, act in models
        for backward in (False, True)
        for m in tokens
    ]


# ----------------------------------------------------------------------------------
# The modules compared
# ----------------------------------------------------------------------------------
class MLP(nn.Module):
    """The stock gated MLP, as transformers writes ``LlamaMLP`` (so ``convert`` fuses it)."""

    def __init__(self, hidden: int, intermediate: int, activation: str, device=None, dtype=None):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, intermediate, bias=False, device=device, dtype=dtype)
        self.up_proj = nn.Linear(hidden, intermediate, bias=False, device=device, dtype=dtype)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False, device=device, dtype=dtype)
        self.act_fn = (
            nn.SiLU() if activation == "silu" else nn.GELU(approximate=activation_approximation(activation))
        )

    def forward(self, x):
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))


def activation_approximation(activation: str) -> str:
    """``nn.GELU``'s ``approximate`` for a GELU activation name."""
    return {"gelu": "none", "gelu_tanh": "tanh"}[activation]


@dataclass(frozen=True)
class MlpImpl:
    """A way to build the block from the stock module (sharing its parameters); ``family`` as in the schema."""

    name: str
    family: str
    variant: str
    build: Callable[[MLP], nn.Module]


def _sharing(stock: MLP, **convert_options) -> nn.Module:
    """``convert`` of a copy of ``stock`` that holds ``stock``'s own parameters (no second set of weights)."""
    import tritongemm

    converted = tritongemm.nn.convert(_meta_copy(stock), **convert_options)
    for name in ("gate_proj", "up_proj", "down_proj"):
        getattr(converted, name).weight = getattr(stock, name).weight
    return converted


def _meta_copy(stock: MLP) -> MLP:
    """The same module with parameters on the meta device (no memory), to be given ``stock``'s."""
    hidden, inter = stock.gate_proj.in_features, stock.gate_proj.out_features
    copy_ = MLP(hidden, inter, "silu", device="meta")
    copy_.act_fn = copy.deepcopy(stock.act_fn)
    return copy_


def _fused(stock: MLP) -> nn.Module:
    import tritongemm

    module = _sharing(stock)
    if type(module) is not tritongemm.nn.GatedMLP:
        raise RuntimeError("convert did not fuse the stock MLP: " + tritongemm.nn.fusion_summary(module))
    return module


IMPLS = (
    MlpImpl("torch", "cublas", "F.linear + act + mul", lambda stock: stock),
    MlpImpl("tritongemm.nn.GatedMLP", "tritongemm", "fused", _fused),
    MlpImpl("tritongemm.nn.Linear", "tritongemm", "unfused", lambda stock: _sharing(stock, fuse_mlp=False)),
)


# ----------------------------------------------------------------------------------
# Measuring a case
# ----------------------------------------------------------------------------------
def base_row(case: MlpCase, dtype: torch.dtype) -> dict:
    elem = torch.empty((), dtype=dtype).element_size()
    nbytes = case.bytes(elem)
    return {
        "suite": SUITE,
        "group": f"{case.model} {case.mode}",
        "case": case.label,
        "x": case.m,
        "x_label": "M (tokens)",
        "m": case.m,
        "n": case.intermediate,
        "k": case.hidden,
        "layout": "NT",
        "dtype": harness.DTYPE_NAMES.get(dtype, str(dtype)),
        "backward": case.backward,
        "flops": case.flops,
        "bytes": nbytes,
        "intensity": case.flops / nbytes,
        "model": case.model,
        "activation": case.activation,
    }


def make_stock(case: MlpCase, dtype: torch.dtype, device, seed: int = 0) -> MLP:
    """The stock block with random normal weights scaled by 1 / sqrt(fan-in) (activations stay O(1))."""
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    stock = MLP(case.hidden, case.intermediate, case.activation, device="meta")
    for name in ("gate_proj", "up_proj", "down_proj"):
        layer = getattr(stock, name)
        w = random_tensor((layer.out_features, layer.in_features), torch.float32, device, gen)
        layer.weight = nn.Parameter((w / math.sqrt(layer.in_features)).to(dtype), requires_grad=case.backward)
    return stock


def input_set_bytes(case: MlpCase, dtype: torch.dtype) -> int:
    """What one call reads that is not a weight: ``x``, and the output's gradient with backward."""
    return case.m * case.hidden * torch.empty((), dtype=dtype).element_size() * (2 if case.backward else 1)


def make_inputs(case: MlpCase, dtype: torch.dtype, device, n_copies: int, seed: int = 1) -> list[tuple]:
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    sets = []
    for _ in range(n_copies):
        x = random_tensor((case.m, case.hidden), dtype, device, gen).requires_grad_(case.backward)
        grad = random_tensor((case.m, case.hidden), dtype, device, gen) if case.backward else None
        sets.append((x, grad))
    return sets


def run_block(module: nn.Module, case: MlpCase, inputs: tuple) -> tuple[torch.Tensor, ...]:
    """The block's output, and with backward the input's and the three weights' gradients."""
    x, grad = inputs
    if not case.backward:
        with torch.no_grad():
            return (module(x),)
    weights = [getattr(module, n).weight for n in ("gate_proj", "up_proj", "down_proj")]
    for t in (x, *weights):
        t.grad = None
    out = module(x)
    out.backward(grad)
    return (out.detach(), x.grad, *(w.grad for w in weights))


def gate(
    module: nn.Module, case: MlpCase, sets: Sequence[tuple], refs: dict[int, tuple]
) -> harness.GateResult:
    """``module`` on the checked copies against the reference outputs; the worst result, or the first failure."""
    return harness.gate_copies(
        lambda index: run_block(module, case, sets[index]),
        refs,
        ("out", "grad_x", "grad_gate", "grad_up", "grad_down"),
    )


def impl_row(case: MlpCase, dtype: torch.dtype, impl: MlpImpl) -> dict:
    return {**base_row(case, dtype), "impl": impl.name, "family": impl.family, "variant": impl.variant}


def prepare(
    case: MlpCase,
    impl: MlpImpl,
    stock: MLP,
    sets: Sequence[tuple],
    refs: dict[int, tuple],
    device: torch.device,
    dtype: torch.dtype,
) -> harness.Prepared | dict:
    """Build and gate one implementation; a finished row if it cannot be timed, else what timing needs."""
    row = {**impl_row(case, dtype, impl), "n_copies": len(sets)}
    module: nn.Module | None = None

    def check() -> harness.GateResult:  # building the module may fail as its gate may: one error row
        nonlocal module
        module = impl.build(stock)
        return gate(module, case, sets, refs)

    failed = runner.gated(row, check, device)
    if failed is not None:
        return failed
    rotation = harness.Rotation(sets)
    if case.backward:
        leaves = [s[0] for s in sets] + list(stock.parameters())

        def step():
            x, grad = rotation.next()
            module(x).backward(grad)

        return harness.Prepared(row, step, leaves, torch.enable_grad)

    def step():
        module(rotation.next()[0])

    return harness.Prepared(row, step, None, torch.no_grad)


def measure_case(
    case: MlpCase,
    dtype: torch.dtype,
    device: torch.device | str,
    *,
    impls: Sequence[MlpImpl] = IMPLS,
    rounds: int = ROUNDS,
    warmup_ms: float = 25,
    rep_ms: float = 100,
    l2_bytes: int | None = None,
    on_step: Callable[[str], None] = lambda label: None,
) -> list[dict]:
    """Rows for every implementation of one case: gated against the first (torch), then timed in
    interleaved rounds."""
    device = torch.device(device)
    l2 = l2_bytes if l2_bytes is not None else harness.l2_cache_bytes(device)
    n_copies = harness.copies_to_exceed_l2(input_set_bytes(case, dtype), l2)
    try:
        stock = make_stock(case, dtype, device)
        sets = make_inputs(case, dtype, device, n_copies)
        refs = {
            i: tuple(t.clone() for t in run_block(stock, case, sets[i])) for i in sorted({0, n_copies - 1})
        }
    except Exception as exc:  # e.g. out of memory: every implementation recorded as not run
        runs = [(f"{case.label} {impl.name}", impl_row(case, dtype, impl)) for impl in impls]
        return runner.not_run(runs, exc, on_step)
    slots: list = []
    for impl in impls:
        on_step(f"{case.label} {impl.name}")
        slots.append(prepare(case, impl, stock, sets, refs, device, dtype))
    del stock, sets, refs  # the steps hold the weights and inputs, freed with ``slots`` once timed
    return runner.timed_rows(slots, device, rounds, warmup_ms, rep_ms)


def run_mlp(
    case_list: Sequence[MlpCase],
    dtype: torch.dtype,
    device: torch.device | str,
    *,
    rounds: int = ROUNDS,
    warmup_ms: float = 25,
    rep_ms: float = 100,
    progress: bool = True,
) -> list[dict]:
    """Every case of ``case_list``, one after the other, with a progress bar on stderr."""
    measure = functools.partial(
        measure_case, dtype=dtype, device=device, rounds=rounds, warmup_ms=warmup_ms, rep_ms=rep_ms
    )
    return runner.measure_all(case_list, len(IMPLS), measure, progress)


# ----------------------------------------------------------------------------------
# Tables, figures, command line
# ----------------------------------------------------------------------------------
def summary_table(rows: Sequence[dict]) -> str:
    """One line per case: each implementation's time and torch's time / its time."""
    return runner.impl_table(rows, SUITE, IMPLS)


FIGURE_KINDS = ("tflops", "speedup")


def plot_mlp(csv: str | Path, out_dir: str | Path) -> list[Path]:
    """``mlp_tflops.png`` (rate by M, one panel per model and mode) and ``mlp_speedup.png``."""
    from . import plots

    return plots.plot_all([csv], out_dir, FIGURE_KINDS)


def run_cli(args) -> int:
    """``python -m benchmarks run --suite mlp``; the exit status (1: a row not measured)."""
    device = runner.cuda_device(SUITE)
    dtype = harness.DTYPES[(args.dtype or "bf16").split(",")[0].strip()]
    case_list = [c for c in cases() if not args.filter or args.filter in c.label]
    return runner.run_cli(
        args,
        SUITE,
        device,
        functools.partial(run_mlp, case_list, dtype),
        {"gate_tolerance": harness.gate_tolerance(dtype)},
        title="the gated MLP block, torch vs tritongemm, on {gpu}",
        table=summary_table,
        plot=plot_mlp,
    )


__all__ = [
    "IMPLS",
    "MLP",
    "MODELS",
    "SUITE",
    "TOKENS",
    "MlpCase",
    "MlpImpl",
    "cases",
    "make_inputs",
    "make_stock",
    "measure_case",
    "plot_mlp",
    "run_cli",
    "run_mlp",
    "summary_table",
]
