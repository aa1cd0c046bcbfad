"""``python -m benchmarks run --suite mlp``: a whole MLP block, stock torch against tritongemm.

Two kinds of block, forward and forward + backward, bf16 (``--dtype`` picks another; ``--filter``
keeps the cases whose label contains it):

* gated, ``down(act(gate(x)) * up(x))`` with bias-free projections, at the widths of Llama-3-8B
  (hidden 4096, intermediate 14336, SwiGLU), Qwen2.5-7B (3584, 18944, SwiGLU) and Gemma-7B (3072,
  24576, GeGLU: the tanh GELU), M = 1024, 2048, 4096 and 8192 tokens;
* plain, ``fc2(act(fc1(x)))`` with biases, at the widths of GPT-2 (768, 3072, tanh GELU), BERT-large
  (1024, 4096, GELU) and ViT-H (1280, 5120, GELU), M = 2048, 4096, 8192 and 16384 tokens.

Three implementations on the same parameters (one set of weights per case, shared):

* ``torch``: the stock module -- the baseline of ``speedup_vs_cublas`` (family ``cublas``, as every
  suite's torch baseline);
* ``tritongemm fused``: for a gated block what ``convert`` makes of it, a ``GatedMLP`` (the gate and up
  projections and the product in one kernel, then ``down_proj``); for a plain one ``tritongemm.mlp``
  (the activation in fc1's epilogue, and in training, from ``frontend.mlp.FUSED_MIN_MACS``, its
  gradient in the epilogue of the GEMM that gives fc2's input gradient);
* ``tritongemm unfused``: ``convert(fuse_mlp=False)``, the projections on tritongemm's GEMMs one by
  one, the activation (and the product) by torch.

The harness's rules hold: inputs (``x`` and, with backward, the output's gradient) rotate over enough
copies that together they exceed twice the L2 cache; before anything is timed each implementation's
output -- with backward also the input's and every parameter's gradient -- on the first and the last
copy is compared with torch's (relative Frobenius error, the harness's library tolerance: both sides
round to bf16), and a wrong one is recorded ``failed_gate`` and never timed; then a case's three
implementations are timed with ``do_bench`` in ``--rounds`` interleaved rounds, the order reversed
every other round (``ms``).  On a GPU the timed call replays a CUDA graph of the step, one graph
per input copy: a backward at a few hundred tokens takes the host about as long to issue as the GPU
to run, and issued eagerly the GPU would idle inside the timed call.  ``host_us`` is the eager step's
host time.

One row per (case, implementation), in the results schema: ``group`` "<model> fwd" / "<model>
fwd+bwd", ``case`` "<model> M=<m> fwd", ``x`` = ``m`` the tokens, ``n`` the intermediate and ``k``
the hidden width, ``layout`` NT (``x @ W.T``); ``flops`` counts the GEMMs, 2 M N K each (x3 with
backward; the elementwise work is not counted), ``bytes`` the compulsory traffic: ``x`` read, the
parameters read, the output written (x3 with backward).  Own columns: ``model``, ``activation``.
Writes ``mlp.csv``, ``mlp_tflops.png`` and ``mlp_speedup.png`` under ``benchmarks/results/<gpu>/``.
Sized to run in about four minutes on an H100 (48 cases, three implementations).
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
#: (model, hidden, intermediate, activation) of plain MLPs, ``fc2(act(fc1(x)))``, and their token counts
#: (from 2048 at GPT-2's width the first layer has ``frontend.mlp.FUSED_MIN_MACS`` multiply-adds).
PLAIN_MODELS: tuple[tuple[str, int, int, str], ...] = (
    ("gpt2", 768, 3072, "gelu_tanh"),
    ("bert-large", 1024, 4096, "gelu"),
    ("vit-h", 1280, 5120, "gelu"),
)
PLAIN_TOKENS = (2048, 4096, 8192, 16384)
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
    gated: bool = True

    @property
    def mode(self) -> str:
        return "fwd+bwd" if self.backward else "fwd"

    @property
    def label(self) -> str:
        return f"{self.model} M={self.m} {self.mode}"

    @property
    def gemms(self) -> int:
        return 3 if self.gated else 2

    @property
    def flops(self) -> int:
        return 2 * self.gemms * self.m * self.intermediate * self.hidden * (3 if self.backward else 1)

    def bytes(self, elem: int) -> int:
        params = self.gemms * self.hidden * self.intermediate + (
            0 if self.gated else self.intermediate + self.hidden
        )
        once = (2 * self.m * self.hidden + params) * elem
        return once * (3 if self.backward else 1)


def cases(
    models=MODELS, tokens=TOKENS, plain_models=PLAIN_MODELS, plain_tokens=PLAIN_TOKENS
) -> list[MlpCase]:
    """Per model, gated ones first, forward at every M, then forward + backward at every M."""
    return [
        MlpCase(model, hidden, inter, act, m, backward, gated)
        for gated, group, counts in ((True, models, tokens), (False, plain_models, plain_tokens))
        for model, hidden, inter, act in group
        for backward in (False, True)
        for m in counts
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


class PlainMLP(nn.Module):
    """The stock two-layer MLP with biases, as timm and GPT-2 write theirs."""

    def __init__(self, hidden: int, intermediate: int, activation: str, device=None, dtype=None):
        super().__init__()
        self.activation = activation
        self.fc1 = nn.Linear(hidden, intermediate, device=device, dtype=dtype)
        self.act = nn.GELU(approximate=activation_approximation(activation))
        self.fc2 = nn.Linear(intermediate, hidden, device=device, dtype=dtype)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


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


def _sharing(stock: nn.Module, **convert_options) -> nn.Module:
    """``convert`` of a copy of ``stock`` that holds ``stock``'s own parameters (no second set of weights)."""
    import tritongemm

    converted = tritongemm.nn.convert(_meta_copy(stock), **convert_options)
    for name, param in stock.named_parameters():
        layer, attr = name.rsplit(".", 1)
        setattr(converted.get_submodule(layer), attr, param)
    return converted


def _meta_copy(stock: nn.Module) -> nn.Module:
    """The same module with parameters on the meta device (no memory), to be given ``stock``'s."""
    first = stock.gate_proj if isinstance(stock, MLP) else stock.fc1
    copy_ = type(stock)(first.in_features, first.out_features, "gelu", device="meta")
    setattr(copy_, "act_fn" if isinstance(stock, MLP) else "act", copy.deepcopy(_activation(stock)))
    return copy_


def _activation(stock: nn.Module) -> nn.Module:
    return stock.act_fn if isinstance(stock, MLP) else stock.act


class FusedPlainMLP(nn.Module):
    """``tritongemm.mlp`` on a stock plain MLP's own layers: the activation in fc1's epilogue, and in training
    (from ``frontend.mlp.FUSED_MIN_MACS``) its gradient in the epilogue of the GEMM that gives fc2's input's."""

    def __init__(self, stock: PlainMLP):
        super().__init__()
        self.fc1, self.fc2, self.activation = stock.fc1, stock.fc2, stock.activation

    def forward(self, x):
        import tritongemm

        fc1, fc2 = self.fc1, self.fc2
        return tritongemm.mlp(x, fc1.weight, fc1.bias, fc2.weight, fc2.bias, activation=self.activation)


def _fused(stock: nn.Module) -> nn.Module:
    import tritongemm

    if isinstance(stock, PlainMLP):
        return FusedPlainMLP(stock)
    module = _sharing(stock)
    if type(module) is not tritongemm.nn.GatedMLP:
        raise RuntimeError("convert did not fuse the stock MLP: " + tritongemm.nn.fusion_summary(module))
    return module


IMPLS = (
    MlpImpl("torch", "cublas", "stock", lambda stock: stock),
    MlpImpl("tritongemm fused", "tritongemm", "GatedMLP (convert) / tritongemm.mlp", _fused),
    MlpImpl(
        "tritongemm unfused",
        "tritongemm",
        "convert(fuse_mlp=False)",
        lambda stock: _sharing(stock, fuse_mlp=False),
    ),
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


def make_stock(case: MlpCase, dtype: torch.dtype, device, seed: int = 0) -> nn.Module:
    """The stock block with random normal weights scaled by 1 / sqrt(fan-in) (activations stay O(1)) and,
    in a plain MLP, random biases of the same scale."""
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    stock = (MLP if case.gated else PlainMLP)(case.hidden, case.intermediate, case.activation, device="meta")
    for name in parameter_names(case):
        layer, attr = name.rsplit(".", 1)
        module = stock.get_submodule(layer)
        shape = (module.out_features, module.in_features) if attr == "weight" else (module.out_features,)
        value = random_tensor(shape, torch.float32, device, gen) / math.sqrt(module.in_features)
        setattr(module, attr, nn.Parameter(value.to(dtype), requires_grad=case.backward))
    return stock


def parameter_names(case: MlpCase) -> tuple[str, ...]:
    if case.gated:
        return ("gate_proj.weight", "up_proj.weight", "down_proj.weight")
    return ("fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias")


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
    weights = [module.get_parameter(name) for name in parameter_names(case)]
    for t in (x, *weights):
        t.grad = None
    out = module(x)
    out.backward(grad)
    return (out.detach(), x.grad, *(w.grad for w in weights))


def gate(
    module: nn.Module, case: MlpCase, sets: Sequence[tuple], refs: dict[int, tuple]
) -> harness.GateResult:
    """``module`` on the checked copies against the reference outputs; the worst result, or the first failure."""
    names = ("out", "grad_x", *(f"grad_{name}" for name in parameter_names(case)))
    return harness.gate_copies(lambda index: run_block(module, case, sets[index]), refs, names)


def impl_row(case: MlpCase, dtype: torch.dtype, impl: MlpImpl) -> dict:
    return {**base_row(case, dtype), "impl": impl.name, "family": impl.family, "variant": impl.variant}


def prepare(
    case: MlpCase,
    impl: MlpImpl,
    stock: nn.Module,
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

        return harness.Prepared(row, step, leaves, torch.enable_grad, graphs=len(sets))

    def step():
        module(rotation.next()[0])

    return harness.Prepared(row, step, None, torch.no_grad, graphs=len(sets))


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
    note = harness.GRAPHS_NOTE if device.type == "cuda" else None
    return runner.timed_rows(slots, device, rounds, warmup_ms, rep_ms, note)


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
        title="the MLP block, torch vs tritongemm, on {gpu}",
        table=summary_table,
        plot=plot_mlp,
    )


__all__ = [
    "IMPLS",
    "MLP",
    "MODELS",
    "PLAIN_MODELS",
    "PLAIN_TOKENS",
    "FusedPlainMLP",
    "PlainMLP",
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
