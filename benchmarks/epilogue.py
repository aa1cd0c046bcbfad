"""``python -m benchmarks run --suite epilogue``: a fused linear epilogue against the torch sequence it replaces.

One linear layer ``y = epilogue(x @ W.T + b)`` (layout NT, as ``nn.Linear``) at the widths (N, K) of
LLM projections: Llama-3-8B's up (14336, 4096) and down (4096, 14336), Qwen2.5-7B's up (18944, 3584)
and Llama-3-70B's up (28672, 8192), at M = 512, 1000, 2048 and 4096 tokens (1000: a ragged last tile
row), forward and forward + backward (the gradients of x, W and b from a random output gradient).
The epilogues:

* ``bias+gelu``       ``F.gelu(F.linear(x, w, b))`` (exact, erf)
* ``bias+silu``       ``F.silu(F.linear(x, w, b))``
* ``bias+gelu_tanh``  ``F.gelu(F.linear(x, w, b), approximate="tanh")``
* ``bias+residual``   ``F.linear(x, w, b) + r``

Sized to run in about three to four minutes on an H100, so not the whole grid: all four epilogues at
Llama-3-8B's up width, bias+gelu alone at the other three; bf16 everywhere, and fp16 too for bias+gelu
at Llama-3-8B's up width (64 cases, three implementations each).  ``--dtype`` replaces that choice:
every (width, epilogue) above in each dtype named.  ``--filter`` keeps the cases whose label contains it.

Three implementations on the same tensors:

* ``torch``: the unfused torch sequence above -- the baseline of ``speedup_vs_cublas`` (family
  ``cublas``, as every suite's torch baseline);
* ``tritongemm``: ``tritongemm.linear(x, w, b, activation=..., residual=...)``, the bias, the activation
  and the residual in the GEMM's epilogue (with backward the kernel also stores the pre-activation,
  which the activation's derivative needs: the library's own behaviour when inputs require grad);
* ``tritongemm unfused``: ``tritongemm.linear(x, w, b)``, then torch's activation or add -- what the
  fusion itself buys, beyond the GEMM.

The harness's rules hold: the inputs that are not weights (``x``, the residual, the output's
gradient) rotate over enough copies that together they exceed twice the L2 cache (each weight,
117-470 MB in bf16, is one tensor shared by the copies); before anything is timed each
implementation's output -- with backward also the gradients of x, W and b -- on the first and the
last copy is compared with float64 of the same math on the same inputs (relative Frobenius error,
the harness's gate tolerance), and a wrong one is recorded ``failed_gate`` and never timed; then a
case's three implementations are timed with ``do_bench`` in ``--rounds`` interleaved rounds, the
order reversed every other round (``ms``).  On a GPU the timed call replays a CUDA graph of the
step, one graph per input copy: a backward at a few hundred tokens takes the host about as long to
issue as the GPU to run, and issued eagerly the GPU would idle inside the timed call.  ``host_us``
is the eager step's host time.

One row per (case, dtype, implementation), in the results schema: ``group`` "<width> <epilogue>
<mode>", e.g. "llama3-8b up bias+gelu fwd", ``case`` "<width> <epilogue> M=<m> <mode>", ``x`` = ``m``
the tokens, ``layout`` NT; ``flops`` 2 M N K (x3 with backward; the elementwise work is not counted),
``bytes`` x, W and b read, the output written, and the residual read where there is one (x3 with
backward).  Own columns: ``epilogue`` and ``mode`` (``fwd`` / ``fwd+bwd``).  Writes ``epilogue.csv``
and ``epilogue_speedup.png`` under ``benchmarks/results/<gpu>/``.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from tritongemm.semantics import ACTIVATIONS
from tritongemm.testing import random_tensor

from . import harness, runner

SUITE = "epilogue"
ROUNDS = harness.ROUNDS
REFERENCE_NOTE = "rel_err against float64 of the same math on the same inputs"
TOKENS = (512, 1000, 2048, 4096)


@dataclass(frozen=True)
class Width:
    """A linear layer's output and input features: W is (n, k)."""

    name: str
    n: int
    k: int


#: The config.json widths of each model's MLP projection.
WIDTHS = (
    Width("llama3-8b up", 14336, 4096),
    Width("llama3-8b down", 4096, 14336),
    Width("qwen2.5-7b up", 18944, 3584),
    Width("llama3-70b up", 28672, 8192),
)


@dataclass(frozen=True)
class Epilogue:
    """What follows the GEMM: the bias, then ``activation`` (tritongemm's name), or the residual add."""

    name: str
    activation: str
    residual: bool = False

    def torch_after(self, y: torch.Tensor, residual: torch.Tensor | None) -> torch.Tensor:
        """What torch does after ``F.linear``: the activation, or the residual add."""
        y = ACTIVATIONS[self.activation](y)
        return y + residual if residual is not None else y


EPILOGUES = (
    Epilogue("bias+gelu", "gelu"),
    Epilogue("bias+silu", "silu"),
    Epilogue("bias+gelu_tanh", "gelu_tanh"),
    Epilogue("bias+residual", "none", residual=True),
)
DTYPES = ("bf16", "fp16")


def plan() -> list[tuple[Width, Epilogue]]:
    """Every epilogue at the first width, bias+gelu alone at the others (keeps the run to minutes)."""
    return [(WIDTHS[0], ep) for ep in EPILOGUES] + [(w, EPILOGUES[0]) for w in WIDTHS[1:]]


def default_dtypes(width: Width, epilogue: Epilogue) -> tuple[str, ...]:
    """bf16, the dtype LLMs train in; fp16 too for bias+gelu at the first width alone: one pair shows
    how the dtype moves the numbers, in 8 cases instead of 56."""
    return DTYPES if (width, epilogue) == (WIDTHS[0], EPILOGUES[0]) else DTYPES[:1]


@dataclass(frozen=True)
class EpilogueCase:
    """One linear layer and epilogue at M tokens, in one dtype (a name of ``harness.DTYPES``)."""

    width: Width
    epilogue: Epilogue
    m: int
    backward: bool
    dtype: str = "bf16"

    @property
    def mode(self) -> str:
        return "fwd+bwd" if self.backward else "fwd"

    @property
    def group(self) -> str:
        return f"{self.width.name} {self.epilogue.name} {self.mode}"

    @property
    def label(self) -> str:
        return f"{self.width.name} {self.epilogue.name} M={self.m} {self.mode}"

    @property
    def torch_dtype(self) -> torch.dtype:
        return harness.DTYPES[self.dtype]

    @property
    def flops(self) -> int:
        return 2 * self.m * self.width.n * self.width.k * (3 if self.backward else 1)

    def bytes(self, elem: int) -> int:
        m, n, k = self.m, self.width.n, self.width.k
        once = (m * k + n * k + n + m * n * (2 if self.epilogue.residual else 1)) * elem
        return once * (3 if self.backward else 1)


def cases(dtypes: Sequence[str] | None = None, tokens: Sequence[int] = TOKENS) -> list[EpilogueCase]:
    """Per dtype, per (width, epilogue) of ``plan()``: forward at every M, then forward + backward.

    ``dtypes`` None: each (width, epilogue) in its ``default_dtypes``; else each in every one of
    ``dtypes``."""
    return [
        EpilogueCase(width, ep, m, backward, dtype)
        for dtype in dtypes or DTYPES
        for width, ep in plan()
        if dtypes or dtype in default_dtypes(width, ep)
        for backward in (False, True)
        for m in tokens
    ]


# ----------------------------------------------------------------------------------
# The implementations compared
# ----------------------------------------------------------------------------------
#: (epilogue, x, w, b, residual or None) -> the layer's output.
LinearFn = Callable[..., torch.Tensor]


@dataclass(frozen=True)
class EpilogueImpl:
    """A way to compute the layer and its epilogue; ``family`` as in the schema."""

    name: str
    family: str
    variant: str
    fn: LinearFn


def torch_sequence(ep: Epilogue, x, w, b, residual):
    return ep.torch_after(F.linear(x, w, b), residual)


def fused(ep: Epilogue, x, w, b, residual):
    import tritongemm

    return tritongemm.linear(x, w, b, activation=ep.activation, residual=residual)


def unfused(ep: Epilogue, x, w, b, residual):
    import tritongemm

    return ep.torch_after(tritongemm.linear(x, w, b), residual)


IMPLS = (
    EpilogueImpl("torch", "cublas", "F.linear, then torch's epilogue", torch_sequence),
    EpilogueImpl("tritongemm", "tritongemm", "fused", fused),
    EpilogueImpl("tritongemm unfused", "tritongemm", "unfused", unfused),
)


# ----------------------------------------------------------------------------------
# Measuring a case
# ----------------------------------------------------------------------------------
def base_row(case: EpilogueCase) -> dict:
    elem = torch.empty((), dtype=case.torch_dtype).element_size()
    nbytes = case.bytes(elem)
    return {
        "suite": SUITE,
        "group": case.group,
        "case": case.label,
        "x": case.m,
        "x_label": "M (tokens)",
        "m": case.m,
        "n": case.width.n,
        "k": case.width.k,
        "layout": "NT",
        "dtype": case.dtype,
        "backward": case.backward,
        "flops": case.flops,
        "bytes": nbytes,
        "intensity": case.flops / nbytes,
        "epilogue": case.epilogue.name,
        "mode": case.mode,
    }


def make_weights(case: EpilogueCase, device, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """(w, b): random normal, w scaled by 1 / sqrt(K) so the pre-activation is O(1), where the
    activations bend; with backward both require grad."""
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    n, k = case.width.n, case.width.k
    w = (random_tensor((n, k), torch.float32, device, gen) / math.sqrt(k)).to(case.torch_dtype)
    b = random_tensor((n,), case.torch_dtype, device, gen)
    return w.requires_grad_(case.backward), b.requires_grad_(case.backward)


def input_set_bytes(case: EpilogueCase) -> int:
    """What one call reads that is not a weight: ``x``, the residual, the output's gradient."""
    elem = torch.empty((), dtype=case.torch_dtype).element_size()
    mn = case.m * case.width.n
    return (case.m * case.width.k + mn * case.epilogue.residual + mn * case.backward) * elem


def make_inputs(case: EpilogueCase, device, n_copies: int, seed: int = 1) -> list[tuple]:
    """``n_copies`` sets of (x, residual or None, output gradient or None)."""
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    shape_out = (case.m, case.width.n)
    sets = []
    for _ in range(n_copies):
        x = random_tensor((case.m, case.width.k), case.torch_dtype, device, gen)
        residual = random_tensor(shape_out, case.torch_dtype, device, gen) if case.epilogue.residual else None
        grad = random_tensor(shape_out, case.torch_dtype, device, gen) if case.backward else None
        sets.append((x.requires_grad_(case.backward), residual, grad))
    return sets


def run_layer(fn: LinearFn, case: EpilogueCase, weights: tuple, inputs: tuple) -> tuple[torch.Tensor, ...]:
    """The layer's output, and with backward the gradients of x, w and b."""
    w, b = weights
    x, residual, grad = inputs
    if not case.backward:
        with torch.no_grad():
            return (fn(case.epilogue, x, w, b, residual),)
    for t in (x, w, b):
        t.grad = None
    out = fn(case.epilogue, x, w, b, residual)
    out.backward(grad)
    return (out.detach(), x.grad, w.grad, b.grad)


def reference(case: EpilogueCase, weights: tuple, inputs: tuple) -> tuple[torch.Tensor, ...]:
    """``run_layer`` of torch's sequence in float64 on the same values (the gate's reference)."""

    def wide(t):
        return None if t is None else t.detach().double().requires_grad_(t.requires_grad)

    w, b = (wide(t) for t in weights)
    x, residual, grad = (wide(t) for t in inputs)
    with torch.enable_grad():
        outs = run_layer(torch_sequence, case, (w, b), (x, residual, grad))
    return tuple(t.detach() for t in outs)


def gate(fn: LinearFn, case: EpilogueCase, weights: tuple, sets: Sequence[tuple], refs: dict[int, tuple]):
    """``fn`` on the checked copies against float64; the worst result, or the first failure."""
    return harness.gate_copies(
        lambda index: run_layer(fn, case, weights, sets[index]),
        refs,
        ("out", "grad_x", "grad_w", "grad_b"),
        dtype=case.torch_dtype,
    )


def impl_row(case: EpilogueCase, impl: EpilogueImpl) -> dict:
    return {**base_row(case), "impl": impl.name, "family": impl.family, "variant": impl.variant}


def step_label(case: EpilogueCase, impl: EpilogueImpl) -> str:
    """The progress bar's name for one implementation of a case."""
    return f"{case.dtype} {case.label} {impl.name}"


def prepare(
    case: EpilogueCase,
    impl: EpilogueImpl,
    weights: tuple,
    sets: Sequence[tuple],
    refs: dict[int, tuple],
    device: torch.device,
) -> harness.Prepared | dict:
    """Gate one implementation; a finished row if it cannot be timed, else what timing needs."""
    row = {**impl_row(case, impl), "n_copies": len(sets)}
    failed = runner.gated(row, lambda: gate(impl.fn, case, weights, sets, refs), device)
    if failed is not None:
        return failed
    rotation = harness.Rotation(sets)
    w, b = weights
    ep = case.epilogue
    if case.backward:
        leaves = [s[0] for s in sets] + [w, b]

        def step():
            x, residual, grad = rotation.next()
            impl.fn(ep, x, w, b, residual).backward(grad)

        return harness.Prepared(row, step, leaves, torch.enable_grad, graphs=len(sets))

    def step():
        x, residual, _ = rotation.next()
        impl.fn(ep, x, w, b, residual)

    return harness.Prepared(row, step, None, torch.no_grad, graphs=len(sets))


def measure_case(
    case: EpilogueCase,
    device: torch.device | str,
    *,
    impls: Sequence[EpilogueImpl] = IMPLS,
    rounds: int = ROUNDS,
    warmup_ms: float = 25,
    rep_ms: float = 100,
    l2_bytes: int | None = None,
    on_step: Callable[[str], None] = lambda label: None,
) -> list[dict]:
    """Rows for every implementation of one case: gated against float64, then timed in interleaved
    rounds; ``speedup_vs_cublas`` against the first (torch)."""
    device = torch.device(device)
    l2 = l2_bytes if l2_bytes is not None else harness.l2_cache_bytes(device)
    n_copies = harness.copies_to_exceed_l2(input_set_bytes(case), l2)
    try:
        weights = make_weights(case, device)
        sets = make_inputs(case, device, n_copies)
        refs = {i: reference(case, weights, sets[i]) for i in sorted({0, n_copies - 1})}
    except Exception as exc:  # e.g. out of memory: every implementation recorded as not run
        return runner.not_run(
            [(step_label(case, impl), impl_row(case, impl)) for impl in impls], exc, on_step
        )
    slots: list = []
    for impl in impls:
        on_step(step_label(case, impl))
        slots.append(prepare(case, impl, weights, sets, refs, device))
    # The float64 references are the largest tensors of a case: not kept while timing; the steps
    # hold the weights and inputs, freed with ``slots`` once timed.
    del refs, weights, sets
    graphs = "; " + harness.GRAPHS_NOTE if device.type == "cuda" else ""
    return runner.timed_rows(slots, device, rounds, warmup_ms, rep_ms, REFERENCE_NOTE + graphs)


def run_epilogue(
    case_list: Sequence[EpilogueCase],
    device: torch.device | str,
    *,
    rounds: int = ROUNDS,
    warmup_ms: float = 25,
    rep_ms: float = 100,
    progress: bool = True,
) -> list[dict]:
    """Every case of ``case_list``, one after the other, with a progress bar on stderr."""
    measure = functools.partial(
        measure_case, device=device, rounds=rounds, warmup_ms=warmup_ms, rep_ms=rep_ms
    )
    return runner.measure_all(case_list, len(IMPLS), measure, progress)


# ----------------------------------------------------------------------------------
# Tables, figures, command line
# ----------------------------------------------------------------------------------
def summary_table(rows: Sequence[dict]) -> str:
    """One line per (case, dtype): each implementation's time and torch's time / its time."""
    return runner.impl_table(rows, SUITE, IMPLS, keys=("case", "dtype"))


FIGURE_KINDS = ("speedup",)


def plot_epilogue(csv: str | Path, out_dir: str | Path) -> list[Path]:
    """``epilogue_speedup.png``: torch's time / each tritongemm implementation's, per case and dtype."""
    from . import plots

    return plots.plot_all([csv], out_dir, FIGURE_KINDS)


def parse_dtypes(text: str | None) -> list[str] | None:
    """``--dtype fp16,bf16`` as names of ``harness.DTYPES`` (None: the suite's default choice)."""
    if not text:
        return None
    names = [d.strip() for d in text.split(",") if d.strip()]
    unknown = [d for d in names if d not in harness.DTYPES]
    if unknown:
        raise ValueError(f"unknown dtype(s) {', '.join(unknown)}; choose from {', '.join(harness.DTYPES)}")
    return names


def run_cli(args) -> int:
    """``python -m benchmarks run --suite epilogue``; the exit status (1: a row not measured)."""
    device = runner.cuda_device(SUITE)
    case_list = [c for c in cases(parse_dtypes(args.dtype)) if not args.filter or args.filter in c.label]
    extra = {
        "gate_tolerance": {c.dtype: harness.gate_tolerance(c.torch_dtype) for c in case_list},
        "gate_reference": "float64",
    }
    return runner.run_cli(
        args,
        SUITE,
        device,
        functools.partial(run_epilogue, case_list),
        extra,
        title="fused linear epilogues, torch vs tritongemm, on {gpu}",
        table=summary_table,
        plot=plot_epilogue,
        failed_fields=("dtype", "case", "impl"),
    )


__all__ = [
    "EPILOGUES",
    "IMPLS",
    "SUITE",
    "TOKENS",
    "WIDTHS",
    "Epilogue",
    "EpilogueCase",
    "EpilogueImpl",
    "Width",
    "cases",
    "default_dtypes",
    "make_inputs",
    "make_weights",
    "measure_case",
    "plan",
    "plot_epilogue",
    "reference",
    "run_cli",
    "run_epilogue",
    "summary_table",
]
