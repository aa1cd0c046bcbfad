"""``python -m benchmarks run --suite models``: real model families, stock against tritongemm.

Each model is built from its library's own code with random weights (no
downloads): Llama-style decoders (``transformers`` LlamaForCausalLM) at a
launch-bound and a compute-bound size, GPT-2 small, BERT-base, and ViT-B/16
from ``timm`` when asked for.  For each model and workload:

* workloads: ``infer`` (prefill forward), ``train`` (forward + backward +
  AdamW step, weights in the low-precision dtype), ``train_amp`` (fp32 weights
  under ``torch.autocast``: the usual mixed-precision recipe), ``decode``
  (greedy ``generate``, eager) and ``decode_graph`` (greedy ``generate`` with a
  static KV cache and the decode step captured by
  ``torch.compile(mode="reduce-overhead")``, CUDA graphs);
* variants: ``stock``, ``convert`` (``tritongemm.nn.convert``), ``patch``
  (under ``tritongemm.patch()``), ``compile`` and ``compile+convert``
  (``torch.compile`` of the stock and of the converted model; for ``infer``
  and ``train_amp``, the recipes people compile; GPT-2 and BERT compile
  ``infer`` only, to keep the suite near 8 minutes).  In ``decode_graph`` the
  variants are ``stock`` and ``convert``, each captured.  Variants share the
  stock model's parameters: one set of weights, so the comparison is on the
  same numbers and memory stays one model's.
* the gate, before any timing: each variant's outputs and gradients are
  compared with an fp32 reference of the same weights (TF32 off), and must
  err by at most ``GATE_FACTOR`` times what stock errs (or the dtype's
  single-GEMM tolerance, whichever is larger); greedy tokens must equal
  stock's, except after a step where stock's top-two logits are closer than
  the logits' own error (a tie that any rounding may break).  A case that fails
  is recorded ``failed_gate`` with the reason, and never timed.
* timing: the variants of a (model, workload) in interleaved rounds, with
  Python's garbage collector paused while a round times (as ``timeit`` does).
  By default (``timing="loop"``) a round runs at least ``MIN_STEPS_PER_ROUND``
  steps back to back between two synchronizations and records their mean, as
  a training or serving loop runs them: the host queues step i+1 while the GPU
  runs step i.  The row's time is the median over rounds, its p20/p80 the
  spread between rounds.  ``timing="calls"`` (``--timing calls``, the earlier
  method) is ``do_bench``'s per-call CUDA-event timing with an L2 flush
  before each call: right for one GEMM, but for a near-host-bound step it
  times a race between host and GPU restarted at every call (p20-p80 spreads
  of +-15% within a run: ``results/h100/sweeps/models_timing_methods.txt``).

Then the per-GEMM breakdown (``gemm_breakdown``): the distinct GEMMs each
workload runs, captured at the aten level during one stock step, timed alone
cuBLAS against tritongemm, with ``tritongemm.explain``'s kernel and config.

Results: ``models.csv`` (one row per model, workload, variant) and
``models_gemms.csv`` (one row per shape and implementation), each with the
environment, and ``models_speedup.png`` / ``models_gemms.png``.

Everything but the model builders runs on the CPU (the tests use ``TinyLM``
on Triton's interpreter); ``transformers`` and ``timm`` are imported only when
a model that needs them is built.
"""

from __future__ import annotations

import contextlib
import copy
import gc
import math
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from . import gemm_breakdown, harness
from .tiny_models import TinyConfig, TinyLM, greedy_full_recompute

SUITE = "models"
#: In the order they run: training last, since its optimizer steps move the weights the other
#: workloads compare against their reference (``train`` moves the low-precision copy only).
WORKLOADS = ("infer", "decode", "decode_graph", "train", "train_amp")
#: Workloads that get the torch.compile variants: compiled inference and compiled mixed-precision
#: training are the recipes people run.  Each compile costs ~10-40 s of the suite's ~8 minutes, so the
#: 12-layer GPT-2 and BERT compile inference only (``ModelSpec.compiled``).
COMPILED_WORKLOADS = ("infer", "train_amp")
#: A variant may err (against the fp32 reference) by this many times what stock errs.
GATE_FACTOR = 4.0
LEARNING_RATE = 1e-5
#: Each round times at least this many steps of every variant.  A launch-bound step takes 5-200 ms, so
#: the suite's share of ``rep_ms`` per round (100 ms over 7 rounds) would time it once, and a median of
#: one host-jittered sample per round swung such cases by +-10% between runs.
MIN_STEPS_PER_ROUND = 5
#: How a round times a variant (see the module docstring): back-to-back steps, or do_bench per call.
TIMINGS = ("loop", "calls")

# ----------------------------------------------------------------------------------
# The models
# ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class ModelSpec:
    """A model and the inputs its workloads use.

    ``build()`` makes the fp32 model on the current default device (it is
    called under ``with torch.device(...)``); ``call(model, inputs)`` returns
    logits with the class / vocabulary dimension last.
    """

    name: str
    family: str
    size: str
    build: Callable[[], nn.Module]
    call: Callable[[nn.Module, torch.Tensor], torch.Tensor]
    batch: int
    seq: int  # tokens per sequence, or the image side for images
    n_labels: int  # vocabulary or classes
    image: bool = False
    #: (model, prompt, steps, captured) -> (new tokens (B, steps), their logits (steps, B, vocab)); None: no decode
    greedy: Callable[..., tuple[torch.Tensor, torch.Tensor]] | None = None
    decode_prompt: int = 0
    decode_steps: int = 0
    needs: tuple[str, ...] = ()
    default: bool = True
    #: Workloads that also run torch.compile of stock and of the converted model.
    compiled: tuple[str, ...] = COMPILED_WORKLOADS
    #: Whether ``decode_graph`` runs (a static KV cache and a compiled, captured decode step).
    captured_decode: bool = True

    def workloads(self) -> tuple[str, ...]:
        skip = set()
        if self.greedy is None:
            skip = {"decode", "decode_graph"}
        elif not self.captured_decode:
            skip = {"decode_graph"}
        return tuple(w for w in WORKLOADS if w not in skip)

    def missing(self) -> list[str]:
        """Libraries this model needs that are not installed."""
        import importlib.util

        return [m for m in self.needs if importlib.util.find_spec(m) is None]


def _hf_logits(model: nn.Module, ids: torch.Tensor) -> torch.Tensor:
    return model(input_ids=ids).logits


def _call_plain(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return model(x)


def _hf_generation_compiles_itself() -> bool:
    """Does ``generate`` compile the decode step itself when the cache is static (newer transformers)?"""
    from transformers import GenerationConfig

    return hasattr(GenerationConfig(), "compile_config")


def _hf_greedy(
    model: nn.Module, prompt: torch.Tensor, steps: int, captured: bool, scores: bool = True
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``model.generate`` greedy, exactly ``steps`` new tokens.

    Captured: a static KV cache, so the decode step has fixed shapes, and the
    step compiled with ``mode="reduce-overhead"`` (CUDA graphs): what newer
    transformers do on their own for a static cache on a GPU, and what the
    docs of older ones tell users to do by hand.
    """
    from transformers import GenerationConfig

    # raw logits where generate can return them (scores went through the logits processors:
    # min_new_tokens sets the end-of-sequence logit to -inf)
    raw = hasattr(GenerationConfig(), "output_logits")
    kwargs: dict[str, Any] = dict(
        max_new_tokens=steps,
        min_new_tokens=steps,
        do_sample=False,
        num_beams=1,
        pad_token_id=0,
        attention_mask=torch.ones_like(prompt),
        return_dict_in_generate=True,
    )
    kwargs["output_logits" if raw else "output_scores"] = scores
    if captured:
        kwargs["cache_implementation"] = "static"
        compiles_itself = _hf_generation_compiles_itself()
        if prompt.device.type == "cuda" and not compiles_itself and not hasattr(model, "_tg_compiled"):
            model.forward = torch.compile(model.forward, mode="reduce-overhead", fullgraph=True)
            model._tg_compiled = True
    out = model.generate(prompt, **kwargs)
    tokens = out.sequences[:, prompt.shape[1] :]
    if not scores:
        return tokens, None
    logits = torch.stack([s.float() for s in (out.logits if raw else out.scores)])
    # the same masked entries in every run: zero them so they add nothing to an error norm
    return tokens, torch.where(torch.isfinite(logits), logits, torch.zeros_like(logits))


def _tiny_greedy(
    model: nn.Module, prompt: torch.Tensor, steps: int, captured: bool, scores: bool = True
) -> tuple[torch.Tensor, torch.Tensor]:
    return greedy_full_recompute(model, prompt, steps)


def _llama(hidden: int, intermediate: int, layers: int, heads: int, kv_heads: int, vocab: int):
    def build() -> nn.Module:
        from transformers import LlamaConfig, LlamaForCausalLM

        cfg = LlamaConfig(
            hidden_size=hidden,
            intermediate_size=intermediate,
            num_hidden_layers=layers,
            num_attention_heads=heads,
            num_key_value_heads=kv_heads,
            vocab_size=vocab,
            max_position_embeddings=4096,
            tie_word_embeddings=False,
        )
        return LlamaForCausalLM(cfg)

    return build


def _gpt2(**overrides):
    def build() -> nn.Module:
        from transformers import GPT2Config, GPT2LMHeadModel

        return GPT2LMHeadModel(GPT2Config(**overrides))  # the defaults are GPT-2 small: 12 layers, 768 wide

    return build


def _bert(**overrides):
    def build() -> nn.Module:
        from transformers import BertConfig, BertForMaskedLM

        return BertForMaskedLM(BertConfig(**overrides))  # the defaults are BERT-base: 12 layers, 768 wide

    return build


def _vit() -> nn.Module:
    import timm

    return timm.create_model("vit_base_patch16_224", pretrained=False)


def _tiny() -> nn.Module:
    return TinyLM(TinyConfig())


#: Every registered model; the GPU suite runs the ``default`` ones (ViT-B/16 on request: ``--filter vit``).
MODELS: dict[str, ModelSpec] = {
    s.name: s
    for s in (
        ModelSpec(
            "llama-s",
            "llama",
            "small: launch-bound (hidden 512, 4 layers)",
            _llama(512, 1408, 4, 8, 4, 8192),
            _hf_logits,
            batch=4,
            seq=128,
            n_labels=8192,
            greedy=_hf_greedy,
            decode_prompt=64,
            decode_steps=16,
            needs=("transformers",),
        ),
        # GPT-2's decode is eager only: the captured decode is the Llama models' (two compiles each)
        ModelSpec(
            "gpt2",
            "gpt2",
            "GPT-2 small (124M, 12 layers)",
            _gpt2(),
            _hf_logits,
            batch=8,
            seq=512,
            n_labels=50257,
            greedy=_hf_greedy,
            decode_prompt=64,
            decode_steps=16,
            needs=("transformers",),
            compiled=("infer",),
            captured_decode=False,
        ),
        ModelSpec(
            "bert-base",
            "bert",
            "BERT-base encoder (110M, 12 layers, MLM head)",
            _bert(),
            _hf_logits,
            batch=16,
            seq=512,
            n_labels=30522,
            needs=("transformers",),
            compiled=("infer",),
        ),
        ModelSpec(
            "llama-l",
            "llama",
            "large: compute-bound (Llama-3-8B layers: hidden 4096, MLP 14336; 2 layers)",
            _llama(4096, 14336, 2, 32, 8, 32000),
            _hf_logits,
            batch=4,
            seq=1024,
            n_labels=32000,
            greedy=_hf_greedy,
            decode_prompt=64,
            decode_steps=16,
            needs=("transformers",),
        ),
        ModelSpec(
            "vit-b16",
            "vit",
            "ViT-B/16 encoder (86M, 12 layers, 224x224)",
            _vit,
            _call_plain,
            batch=64,
            seq=224,
            n_labels=1000,
            image=True,
            needs=("timm",),
            default=False,
        ),
        ModelSpec(
            "tiny",
            "tiny",
            "hand-written test model (hidden 32, 1 block)",
            _tiny,
            _call_plain,
            batch=2,
            seq=8,
            n_labels=48,
            greedy=_tiny_greedy,
            decode_prompt=4,
            decode_steps=3,
            default=False,
            captured_decode=False,
        ),  # no KV cache to make static
    )
}


@dataclass
class Batch:
    inputs: torch.Tensor
    labels: torch.Tensor
    prompt: torch.Tensor | None = None


def make_batch(spec: ModelSpec, device: torch.device | str, seed: int = 0) -> Batch:
    """Random inputs (token ids or images), labels for the loss, and a decode prompt."""
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    if spec.image:
        x = torch.randn((spec.batch, 3, spec.seq, spec.seq), generator=gen, device=device)
        labels = torch.randint(0, spec.n_labels, (spec.batch,), generator=gen, device=device)
        return Batch(x, labels)
    ids = torch.randint(0, spec.n_labels, (spec.batch, spec.seq), generator=gen, device=device)
    labels = torch.randint(0, spec.n_labels, (spec.batch, spec.seq), generator=gen, device=device)
    prompt = None
    if spec.greedy is not None:
        prompt = torch.randint(0, spec.n_labels, (1, spec.decode_prompt), generator=gen, device=device)
    return Batch(ids, labels, prompt)


def build_model(spec: ModelSpec, device: torch.device | str, seed: int = 0) -> nn.Module:
    """The fp32 model with random weights, rounded to bf16-representable values (see ``low_precision_copy``)."""
    torch.manual_seed(seed)
    with torch.device(device):
        model = spec.build()
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(p.to(torch.bfloat16))
    return model


def low_precision_copy(model: nn.Module, dtype: torch.dtype) -> nn.Module:
    """A copy whose parameters are ``dtype``; buffers stay as they are.

    Buffers are left alone because some hold fp32 constants the model relies on
    (rotary ``inv_freq``: rounded to bf16 it moves positions by whole radians).
    ``build_model`` rounds the fp32 weights to bf16 values, so the fp32 model
    is the exact reference of this copy (fp16 rounds again, by at most 2^-11).
    """
    low = copy.deepcopy(model)
    with torch.no_grad():
        for p in low.parameters():
            p.data = p.data.to(dtype)
    return low


# ----------------------------------------------------------------------------------
# Variants: one set of parameters, several module trees
# ----------------------------------------------------------------------------------
def shared_copy(model: nn.Module) -> nn.Module:
    """A new module tree over the same parameter objects (buffers are copied: they are small)."""
    memo = {id(p): p for p in model.parameters()}
    new = copy.deepcopy(model, memo)
    for attr in ("_compiled_call", "_cache", "_tg_compiled"):  # per-instance generate state
        new.__dict__.pop(attr, None)
    return new


class SabotagedLinear(nn.Linear):
    """A deliberately wrong linear layer (drops the last eighth of K): the gate must reject it."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        keep = self.in_features - max(self.in_features // 8, 1)
        return F.linear(x[..., :keep], self.weight[:, :keep], self.bias)


def sabotage(model: nn.Module) -> int:
    """Turn every ``nn.Linear`` in ``model`` into a ``SabotagedLinear`` in place; returns how many."""
    n = 0
    for m in model.modules():
        if type(m) is nn.Linear:
            m.__class__ = SabotagedLinear
            n += 1
    return n


@dataclass
class Variant:
    name: str
    family: str
    module: nn.Module
    baseline: str | None  # the tritongemm-less twin its speedup is measured against
    patched: bool = False
    note: str = ""

    def context(self):
        if self.patched:
            import tritongemm

            return tritongemm.patch()
        return contextlib.nullcontext()


def _count_linears(model: nn.Module, cls: type) -> int:
    return sum(type(m) is cls for m in model.modules())


#: ``torch.compile`` modes the suite can run (``--compile-modes``); the first is the default's.
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune-no-cudagraphs")


def compiled_name(variant: str, mode: str) -> str:
    """``compile`` / ``compile+convert`` in the default mode, ``compile:<mode>`` ... in the others."""
    return variant if mode == "default" else f"{variant}:{mode}"


def build_variants(
    stock: nn.Module,
    workload: str,
    *,
    compile: bool,
    sabotaged: bool = False,
    compiled: Sequence[str] = COMPILED_WORKLOADS,
    compile_modes: Sequence[str] = ("default",),
    eager: bool = True,
) -> list[Variant]:
    """stock, convert, patch (not for the captured decode: there the variants are torch.compile of stock
    and of the converted model), the sabotaged check when asked, and torch.compile of stock and of the
    converted model, in each of ``compile_modes``, for the ``compiled`` workloads.  ``eager=False`` (the
    compiled view) keeps stock and the compiled variants only, and adds an A/A control per mode: a
    second compiled copy of stock, timed against the first like the converted model.  Where a model is
    host-bound, two compiled copies of one program read several percent apart from round to round; the
    control's spread, measured in the same run, says how far apart the converted model may read from
    stock without any difference in what they run."""
    import tritongemm

    converted = tritongemm.nn.convert(shared_copy(stock))
    n_conv = _count_linears(converted, tritongemm.nn.Linear)
    n_conv1d = _count_linears(converted, tritongemm.nn.Conv1D)
    conv_note = f"converted {n_conv} nn.Linear" + (f", {n_conv1d} Conv1D" if n_conv1d else "")
    variants = [Variant("stock", "stock", stock, None)]
    if eager:
        variants.append(Variant("convert", "tritongemm", converted, "stock", note=conv_note))
    if eager and workload != "decode_graph":
        variants.append(Variant("patch", "tritongemm", shared_copy(stock), "stock", patched=True))
    if sabotaged and workload != "decode_graph":
        bad = shared_copy(stock)
        variants.append(
            Variant("sabotaged", "test", bad, "stock", note=f"sabotaged {sabotage(bad)} nn.Linear")
        )
    if compile and workload in compiled:
        for mode in compile_modes:
            options = {} if mode == "default" else {"mode": mode}
            base = compiled_name("compile", mode)
            variants.append(
                Variant(base, "torch.compile", torch.compile(shared_copy(stock), **options), "stock")
            )
            variants.append(
                Variant(
                    compiled_name("compile+convert", mode),
                    "torch.compile+tritongemm",
                    torch.compile(tritongemm.nn.convert(shared_copy(stock)), **options),
                    base,
                    note=conv_note,
                )
            )
            if not eager:
                variants.append(
                    Variant(
                        compiled_name("compile+copy", mode),
                        "control",
                        torch.compile(shared_copy(stock), **options),
                        base,
                        note="A/A control: a second compiled copy of stock",
                    )
                )
    return variants


# ----------------------------------------------------------------------------------
# Workloads
# ----------------------------------------------------------------------------------
def _autocast(device: torch.device, amp_dtype: torch.dtype | None):
    if amp_dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=amp_dtype)


def loss_of(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1))


def forward(
    spec: ModelSpec, model: nn.Module, batch: Batch, amp_dtype: torch.dtype | None = None
) -> torch.Tensor:
    with torch.no_grad(), _autocast(batch.inputs.device, amp_dtype):
        return spec.call(model, batch.inputs)


def forward_backward(
    spec: ModelSpec,
    model: nn.Module,
    params: Sequence[tuple[str, nn.Parameter]],
    batch: Batch,
    amp_dtype: torch.dtype | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor | None]]:
    """Logits and every parameter's gradient (cloned) of one forward + backward."""
    for _, p in params:
        p.grad = None
    with _autocast(batch.inputs.device, amp_dtype):
        logits = spec.call(model, batch.inputs)
        loss = loss_of(logits, batch.labels)
    loss.backward()
    grads = {name: (None if p.grad is None else p.grad.detach().clone()) for name, p in params}
    for _, p in params:
        p.grad = None
    return logits.detach(), grads


def train_step(
    spec: ModelSpec,
    model: nn.Module,
    batch: Batch,
    optimizer: torch.optim.Optimizer,
    amp_dtype: torch.dtype | None = None,
) -> None:
    optimizer.zero_grad(set_to_none=True)
    with _autocast(batch.inputs.device, amp_dtype):
        loss = loss_of(spec.call(model, batch.inputs), batch.labels)
    loss.backward()
    optimizer.step()


@contextlib.contextmanager
def exact_fp32():
    """fp32 matmuls in full precision (no TF32) for the reference."""
    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(before)


# ----------------------------------------------------------------------------------
# The gate (pure functions of tensors)
# ----------------------------------------------------------------------------------
def error_bound(stock_err: float, dtype: torch.dtype, factor: float = GATE_FACTOR) -> float:
    """How far from the reference a correct variant may be: ``factor`` x stock's error, at least
    the dtype's single-GEMM tolerance (``harness.gate_tolerance``)."""
    return max(factor * stock_err, harness.gate_tolerance(dtype))


def gate_tensor(
    name: str,
    ref: torch.Tensor,
    stock: torch.Tensor,
    out: Any,
    dtype: torch.dtype,
    factor: float = GATE_FACTOR,
) -> harness.GateResult:
    """``out`` against the fp32 ``ref``, within ``error_bound`` of stock's own error."""
    stock_err = harness.relative_error(stock.to(ref.dtype), ref)
    tol = error_bound(stock_err, dtype, factor)
    if not isinstance(out, torch.Tensor):
        return harness.GateResult(
            False, math.nan, tol, f"{name}: returned {type(out).__name__}, not a Tensor"
        )
    if out.dtype != stock.dtype:
        return harness.GateResult(False, math.nan, tol, f"{name}: dtype {out.dtype} != stock's {stock.dtype}")
    result = harness.check_output(out.to(ref.dtype), ref, tol)
    if not result.ok:
        return harness.GateResult(
            False, result.rel_err, tol, f"{name}: {result.reason} (stock errs {stock_err:.3g})"
        )
    return result


def gate_grads(
    ref: dict[str, torch.Tensor | None],
    stock: dict[str, torch.Tensor | None],
    grads: dict[str, torch.Tensor | None],
    dtype: torch.dtype,
    factor: float = GATE_FACTOR,
) -> harness.GateResult:
    """Every parameter's gradient, each against its own bound; the worst (by err / tol) if all pass."""
    worst = harness.GateResult(True, 0.0, harness.gate_tolerance(dtype))
    for name, r in ref.items():
        s, g = stock.get(name), grads.get(name)
        if r is None or s is None:
            if g is not None and s is None:
                return harness.GateResult(
                    False, math.nan, worst.tol, f"grad {name}: stock has none, variant has one"
                )
            if g is None and s is not None:
                return harness.GateResult(False, math.nan, worst.tol, f"grad {name}: missing")
            continue
        if g is None:
            return harness.GateResult(False, math.nan, worst.tol, f"grad {name}: missing")
        result = gate_tensor(f"grad {name}", r, s, g, dtype, factor)
        if not result.ok:
            return result
        if result.rel_err / result.tol > worst.rel_err / worst.tol:
            worst = result
    return worst


def tie_margin(ref_logits: torch.Tensor, stock_logits: torch.Tensor, factor: float = GATE_FACTOR) -> float:
    """Logit gaps below this are ties: ``factor`` x the largest |stock - reference| logit error."""
    return factor * float((stock_logits.float() - ref_logits.float()).abs().max())


def gate_tokens(
    stock_tokens: torch.Tensor, stock_logits: torch.Tensor, tokens: torch.Tensor, margin: float
) -> harness.GateResult:
    """Greedy tokens must equal stock's; a sequence may part from stock's only at a step where stock's
    top-two logits are within ``margin`` (a tie any rounding can break; from there on the contexts differ).

    ``stock_logits`` is (steps, B, vocab), the logits each stock token was chosen from.
    """
    if tuple(tokens.shape) != tuple(stock_tokens.shape):
        return harness.GateResult(
            False,
            math.nan,
            margin,
            f"tokens: shape {tuple(tokens.shape)} != stock's {tuple(stock_tokens.shape)}",
        )
    notes = []
    for row in range(stock_tokens.shape[0]):
        differ = (tokens[row] != stock_tokens[row]).nonzero()
        if differ.numel() == 0:
            continue
        step = int(differ[0])
        top2 = stock_logits[step, row].float().topk(2).values
        gap = float(top2[0] - top2[1])
        if gap > margin:
            return harness.GateResult(
                False,
                gap,
                margin,
                f"tokens: differ from stock's at step {step} of sequence {row}, where stock's "
                f"top-two logit gap {gap:.3g} exceeds the tie margin {margin:.3g}",
            )
        notes.append(
            f"sequence {row} parts from stock's at step {step} on a tie (gap {gap:.3g} <= {margin:.3g})"
        )
    return harness.GateResult(True, 0.0, margin, "; ".join(notes))


# ----------------------------------------------------------------------------------
# Running one (model, workload)
# ----------------------------------------------------------------------------------
def _workload_dtype(workload: str, dtype: torch.dtype) -> tuple[torch.dtype | None, bool]:
    """(autocast dtype or None, whether the low-precision copy is the stock model)."""
    return (dtype, False) if workload == "train_amp" else (None, True)


def _prepare_forward(spec, variants, ref_model, batch, amp, dtype):
    with exact_fp32():
        ref = forward(spec, ref_model, batch).float()
    stock = forward(spec, variants[0].module, batch, amp)

    def gate(v):
        with v.context() as stats:
            out = forward(spec, v.module, batch, amp)
        return gate_tensor("logits", ref, stock, out, dtype), stats

    def step_for(v):
        def step():
            with v.context():
                forward(spec, v.module, batch, amp)

        return step

    return gate, step_for, harness.relative_error(stock.to(ref.dtype), ref), torch.no_grad


def _prepare_train(spec, variants, ref_model, batch, amp, dtype, optimizer):
    stock_params = list(variants[0].module.named_parameters())
    ref_params = list(ref_model.named_parameters())
    with exact_fp32():
        ref_out, ref_grads = forward_backward(spec, ref_model, ref_params, batch)
    stock_out, stock_grads = forward_backward(spec, variants[0].module, stock_params, batch, amp)

    def gate(v):
        with v.context() as stats:
            out, grads = forward_backward(spec, v.module, stock_params, batch, amp)
        result = gate_tensor("logits", ref_out.float(), stock_out, out, dtype)
        if result.ok:
            g = gate_grads(ref_grads, stock_grads, grads, dtype)
            if not g.ok or g.rel_err / g.tol > result.rel_err / result.tol:
                result = g
        return result, stats

    def step_for(v):
        def step():
            with v.context():
                train_step(spec, v.module, batch, optimizer, amp)

        return step

    stock_err = harness.relative_error(stock_out.to(torch.float32), ref_out.float())
    return gate, step_for, stock_err, torch.enable_grad


def _prepare_decode(spec, variants, ref_model, batch, amp, dtype, captured):
    steps = spec.decode_steps
    with exact_fp32(), torch.no_grad():
        _, ref_logits = spec.greedy(ref_model, batch.prompt, steps, False)
    with torch.no_grad():
        stock_tokens, stock_logits = spec.greedy(variants[0].module, batch.prompt, steps, captured)
    margin = max(tie_margin(ref_logits[0], stock_logits[0]), 1e-6)

    def gate(v):
        with torch.no_grad(), v.context() as stats:
            tokens, logits = spec.greedy(v.module, batch.prompt, steps, captured)
        # the first step's logits are the prompt's prefill: gate them like a forward
        result = gate_tensor("first-step logits", ref_logits[0], stock_logits[0], logits[0], dtype)
        if result.ok:
            tok = gate_tokens(stock_tokens, stock_logits, tokens, margin)
            if not tok.ok:
                return tok, stats
            result = harness.GateResult(True, result.rel_err, result.tol, tok.reason)
        return result, stats

    def step_for(v):
        def step():
            with v.context():
                spec.greedy(v.module, batch.prompt, steps, captured, scores=False)

        return step

    stock_err = harness.relative_error(stock_logits[0], ref_logits[0])
    return gate, step_for, stock_err, torch.no_grad


def _patch_note(stats) -> str:
    if stats is None or not hasattr(stats, "total_served"):
        return ""
    reasons = "; ".join(f"{r}: {n}" for r, n in stats.fallback_reasons().most_common(3))
    return f"patch served {stats.total_served}, fell back {stats.total_fallbacks}" + (
        f" ({reasons})" if reasons else ""
    )


def run_workload(
    spec: ModelSpec,
    workload: str,
    stock: nn.Module,
    ref_model: nn.Module,
    batch: Batch,
    dtype: torch.dtype,
    device: torch.device,
    *,
    compile: bool = False,
    sabotaged: bool = False,
    warmup_ms: float = 25,
    rep_ms: float = 100,
    rounds: int = harness.ROUNDS,
    timing: str = "loop",
    compile_modes: Sequence[str] = ("default",),
    eager: bool = True,
    log: Callable[[str], None] = lambda s: None,
) -> list[dict]:
    """Gate every variant of (model, workload) against the fp32 reference, time those that pass.

    A compiled variant's first call, in its gate, compiles it: its seconds are the row's ``compile_s``."""
    if timing not in TIMINGS:
        raise ValueError(f"timing: one of {', '.join(TIMINGS)} (got {timing!r})")
    amp, _ = _workload_dtype(workload, dtype)
    base = {
        "suite": SUITE,
        "group": spec.name,
        "case": f"{spec.name} {workload}",
        "model": spec.name,
        "model_family": spec.family,
        "workload": workload,
        "dtype": harness.DTYPE_NAMES[dtype],
        "backward": workload.startswith("train"),
        "params": sum(p.numel() for p in stock.parameters()),
        "tokens": (
            spec.decode_steps
            if workload.startswith("decode")
            else spec.batch * (1 if spec.image else spec.seq)
        ),
    }
    variants = build_variants(
        stock,
        workload,
        compile=compile,
        sabotaged=sabotaged,
        compiled=spec.compiled,
        compile_modes=compile_modes,
        eager=eager,
    )
    optimizer = None
    if workload.startswith("train"):
        optimizer = torch.optim.AdamW(stock.parameters(), lr=LEARNING_RATE)
        gate, step_for, stock_err, grad_mode = _prepare_train(
            spec, variants, ref_model, batch, amp, dtype, optimizer
        )
    elif workload == "infer":
        gate, step_for, stock_err, grad_mode = _prepare_forward(spec, variants, ref_model, batch, amp, dtype)
    else:
        gate, step_for, stock_err, grad_mode = _prepare_decode(
            spec, variants, ref_model, batch, amp, dtype, workload == "decode_graph"
        )
    slots: list[Any] = []
    for v in variants:
        row = {
            **base,
            "impl": v.name,
            "family": v.family,
            "variant": _describe(v.name, workload),
            "baseline": v.baseline,
            "note": v.note,
        }
        try:
            if v.name == "stock":
                result, stats = harness.GateResult(True, stock_err, math.nan, "the baseline"), None
            else:
                t0 = time.perf_counter()
                result, stats = gate(v)
                _sync(device)
                if v.name.startswith("compile"):
                    row["compile_s"] = time.perf_counter() - t0
            _sync(device)
        except Exception as exc:
            log(f"{spec.name} {workload} {v.name}: error {harness._short_error(exc)}")
            slots.append({**row, "status": harness.ERROR, "message": harness._short_error(exc)})
            _free(device)
            continue
        row.update(
            rel_err=result.rel_err,
            tol=result.tol,
            note="; ".join(x for x in (v.note, _patch_note(stats) if v.patched else "") if x),
        )
        if not result.ok:
            log(f"{spec.name} {workload} {v.name}: FAILED the gate ({result.reason})")
            slots.append({**row, "status": harness.FAILED_GATE, "message": result.reason})
            continue
        log(f"{spec.name} {workload} {v.name}: gate ok (err {result.rel_err:.3g} <= {result.tol:.3g})")
        slots.append(harness.Prepared({**row, "message": result.reason}, step_for(v), None, grad_mode))
    for r in range(rounds):
        order = range(len(slots)) if r % 2 == 0 else reversed(range(len(slots)))
        for i in order:
            if isinstance(slots[i], harness.Prepared):
                with _collector_paused():
                    if timing == "loop":
                        failed = time_loop_round(slots[i], device, 2 if r == 0 else 1, rep_ms / rounds)
                    else:
                        failed = harness.time_round(
                            slots[i],
                            device,
                            warmup_ms if r == 0 else warmup_ms / 5,
                            round_rep_ms(slots[i].samples, rep_ms, rounds),
                        )
                if failed is not None:
                    slots[i] = failed
    rows = []
    for slot in slots:
        if isinstance(slot, harness.Prepared):
            ms, p20, p80 = harness.summarize(slot.samples)
            row = {**slot.row, "status": harness.OK, "ms": ms, "ms_p20": p20, "ms_p80": p80}
            if timing == "loop":  # one sample a round, in round order: paired with the baseline's
                row["round_ms"] = list(slot.samples)
            rows.append(row)
        else:
            rows.append(slot)
    finish_rows(rows)
    for row in rows:
        row.pop("round_ms", None)
    for row in rows:
        if row.get("status") == harness.OK:
            log(
                f"{spec.name} {workload} {row['impl']}: {row['ms']:.3f} ms"
                + (
                    f", {row['speedup_vs_baseline']:.2f}x {row['baseline']}"
                    if row.get("speedup_vs_baseline")
                    else ""
                )
            )
    del variants, optimizer, slots
    _free(device)
    return rows


def time_loop_round(
    prepared: harness.Prepared, device: torch.device, warmup_steps: int, share_ms: float
) -> dict | None:
    """One round of ``prepared``'s step run back to back; appends the mean ms per step (an error row if it fails).

    ``warmup_steps`` untimed steps first (the first round's also estimate the step's time), then
    ``n >= MIN_STEPS_PER_ROUND`` steps, enough to fill ``share_ms``, between two synchronizations:
    the host runs ahead of the GPU across steps, as in a training or serving loop.
    """
    try:
        with prepared.grad_mode():
            for _ in range(warmup_steps):
                _sync(device)
                t0 = time.perf_counter()
                prepared.step()
                _sync(device)
                estimate = (time.perf_counter() - t0) * 1e3
            if prepared.samples:
                estimate = statistics.median(prepared.samples)
            n = max(MIN_STEPS_PER_ROUND, math.ceil(share_ms / max(estimate, 1e-3)))
            _sync(device)
            t0 = time.perf_counter()
            for _ in range(n):
                prepared.step()
            _sync(device)
            prepared.samples.append((time.perf_counter() - t0) * 1e3 / n)
    except Exception as exc:
        return {**prepared.row, "status": harness.ERROR, "message": "timing: " + harness._short_error(exc)}
    return None


def round_rep_ms(samples: Sequence[float], rep_ms: float, rounds: int) -> float:
    """One round's ``do_bench`` time for a variant: its share of ``rep_ms``, but, once its step time
    is known (after the first round), long enough for ``MIN_STEPS_PER_ROUND`` steps."""
    share = rep_ms / rounds
    if not samples:
        return share
    return max(share, (MIN_STEPS_PER_ROUND + 0.5) * statistics.median(samples))


@contextlib.contextmanager
def _collector_paused():
    """Collect now, then keep Python's cyclic garbage collector off while timing (``timeit`` does the
    same): a collection inside one variant's round would charge that variant for every variant's garbage."""
    was_enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def finish_rows(rows: list[dict]) -> None:
    """``speedup_vs_baseline``: the baseline variant's time over this one's, within a (model, workload).

    Where both rows hold one sample per round (``round_ms``, the loop timing), it is the median of the
    rounds' own ratios, each of two variants timed back to back, so that the host's drift between rounds
    (a near-host-bound step's time wandered by up to 56% over minutes on one H100 host) cancels; its
    ``speedup_p20`` / ``speedup_p80`` are those ratios' spread.  Otherwise: the ratio of the medians.
    """
    by_impl = {(r["case"], r["dtype"], r["impl"]): r for r in rows if r.get("status") == harness.OK}
    for r in rows:
        base = by_impl.get((r["case"], r["dtype"], r.get("baseline")))
        if base is None or r.get("status") != harness.OK:
            continue
        ours, theirs = r.get("round_ms"), base.get("round_ms")
        if ours and theirs and len(ours) == len(theirs):
            ratios = [b / t for b, t in zip(theirs, ours)]
            r["speedup_vs_baseline"], r["speedup_p20"], r["speedup_p80"] = harness.summarize(ratios)
        else:
            r["speedup_vs_baseline"] = base["ms"] / r["ms"]


def _describe(variant: str, workload: str) -> str:
    variant, _, mode = variant.partition(":")
    what = {
        "stock": "the model as its library builds it",
        "convert": "tritongemm.nn.convert(model)",
        "patch": "model under tritongemm.patch()",
        "sabotaged": "nn.Linear dropping K/8 (gate check)",
        "compile": "torch.compile(model)",
        "compile+convert": "torch.compile(tritongemm.nn.convert(model))",
        "compile+copy": "torch.compile(a copy of model)",
    }[variant]
    if mode:
        what = what[:-1] + f", mode={mode!r})"
    if workload == "decode_graph":
        what += "; static KV cache, decode step under torch.compile(mode='reduce-overhead')"
    return what


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _free(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.empty_cache()


@contextlib.contextmanager
def _dynamo_room():
    """More recompiles than dynamo's default allows: every model and workload compiles fresh copies."""
    cfg = torch._dynamo.config
    names = []
    for new, old in (
        ("recompile_limit", "cache_size_limit"),
        ("accumulated_recompile_limit", "accumulated_cache_size_limit"),
    ):
        name = new if hasattr(cfg, new) else old if hasattr(cfg, old) else None
        if name is not None:
            names.append(name)
    with cfg.patch({n: max(getattr(cfg, n), 256) for n in names}):
        yield


# ----------------------------------------------------------------------------------
# Running models
# ----------------------------------------------------------------------------------
@dataclass
class ModelsResult:
    rows: list[dict] = field(default_factory=list)
    gemm_rows: list[dict] = field(default_factory=list)


def select_cases(
    case_filter: str | None = None, models: Sequence[str] | None = None
) -> list[tuple[ModelSpec, str]]:
    """(model, workload) pairs to run.

    ``models`` names them; by default the default models, or with a filter every
    real (non-test) model, e.g. ``--filter vit`` runs ViT-B/16.  ``case_filter``
    keeps the pairs whose "<model> <workload>" label contains it.
    """
    if models is None:
        models = [n for n, s in MODELS.items() if s.family != "tiny" and (s.default or case_filter)]
    pairs = [(MODELS[n], w) for n in models for w in MODELS[n].workloads()]
    if case_filter:
        pairs = [(s, w) for s, w in pairs if case_filter in f"{s.name} {w}"]
    return pairs


def run_models(
    pairs: Sequence[tuple[ModelSpec, str]],
    device: torch.device | str,
    dtype: torch.dtype = torch.bfloat16,
    *,
    compile: bool = False,
    sabotaged: bool = False,
    breakdown: bool = True,
    warmup_ms: float = 25,
    rep_ms: float = 100,
    rounds: int = harness.ROUNDS,
    timing: str = "loop",
    compile_modes: Sequence[str] = ("default",),
    eager: bool = True,
    log: Callable[[str], None] = lambda s: None,
) -> ModelsResult:
    """Run the (model, workload) pairs model by model; returns the model rows and the GEMM breakdown rows."""
    device = torch.device(device)
    result = ModelsResult()
    by_model: dict[str, list[str]] = {}
    for spec, workload in pairs:
        by_model.setdefault(spec.name, []).append(workload)
    for name, workloads in by_model.items():
        spec = MODELS[name] if name in MODELS else next(s for s, _ in pairs if s.name == name)
        missing = spec.missing()
        if missing:
            msg = f"needs {', '.join(missing)} (pip install {' '.join(missing)}), not installed"
            log(f"{name}: skipped: {msg}")
            result.rows += [
                {
                    "suite": SUITE,
                    "group": name,
                    "case": f"{name} {w}",
                    "model": name,
                    "workload": w,
                    "impl": "stock",
                    "dtype": harness.DTYPE_NAMES[dtype],
                    "status": harness.ERROR,
                    "message": msg,
                }
                for w in workloads
            ]
            continue
        try:
            model32 = build_model(spec, device)
            low = low_precision_copy(model32, dtype)
        except Exception as exc:
            log(f"{name}: could not build: {harness._short_error(exc)}")
            result.rows += [
                {
                    "suite": SUITE,
                    "group": name,
                    "case": f"{name} {w}",
                    "model": name,
                    "workload": w,
                    "impl": "stock",
                    "dtype": harness.DTYPE_NAMES[dtype],
                    "status": harness.ERROR,
                    "message": "build: " + harness._short_error(exc),
                }
                for w in workloads
            ]
            continue
        model32.eval()  # no dropout: every run of a batch must compute the same function
        low.eval()
        batch = make_batch(spec, device)
        captures: dict[str, tuple] = {}
        for workload in workloads:
            amp, _ = _workload_dtype(workload, dtype)
            stock = model32 if amp is not None else low
            log(f"{name} {workload}: {spec.size}")
            if compile:
                torch._dynamo.reset()
            try:
                with _dynamo_room():
                    result.rows += run_workload(
                        spec,
                        workload,
                        stock,
                        model32,
                        batch,
                        dtype,
                        device,
                        compile=compile,
                        sabotaged=sabotaged,
                        warmup_ms=warmup_ms,
                        rep_ms=rep_ms,
                        rounds=rounds,
                        timing=timing,
                        compile_modes=compile_modes,
                        eager=eager,
                        log=log,
                    )
            except Exception as exc:  # the reference or stock itself failed (e.g. out of memory)
                log(f"{name} {workload}: error {harness._short_error(exc)}")
                result.rows.append(
                    {
                        "suite": SUITE,
                        "group": name,
                        "case": f"{name} {workload}",
                        "model": name,
                        "workload": workload,
                        "impl": "stock",
                        "dtype": harness.DTYPE_NAMES[dtype],
                        "status": harness.ERROR,
                        "message": harness._short_error(exc),
                    }
                )
                _free(device)
                continue
            if breakdown and workload != "decode_graph":  # the captured decode runs the decode's GEMMs
                try:
                    captures[workload] = capture_workload(spec, workload, stock, batch, amp)
                except Exception as exc:
                    log(f"{name} {workload}: GEMM capture failed: {harness._short_error(exc)}")
        if breakdown and captures:
            shapes = {s for counts, _ in captures.values() for s in counts}
            timed = gemm_breakdown.time_shapes(
                shapes,
                device,
                warmup_ms=warmup_ms,
                rep_ms=rep_ms,
                rounds=rounds,
                log=lambda s, n=name: log(f"{n} {s}"),
            )
            for workload, (counts, ops) in captures.items():
                result.gemm_rows += gemm_breakdown.breakdown_rows(name, workload, counts, ops, timed)
        del model32, low, batch
        _free(device)
    return result


def capture_workload(
    spec: ModelSpec, workload: str, stock: nn.Module, batch: Batch, amp: torch.dtype | None
) -> tuple:
    """The GEMMs one stock run of ``workload`` reaches (forward + backward for training)."""
    if workload == "infer":
        return gemm_breakdown.capture_gemms(lambda: forward(spec, stock, batch, amp))
    if workload.startswith("train"):
        params = list(stock.named_parameters())
        return gemm_breakdown.capture_gemms(lambda: forward_backward(spec, stock, params, batch, amp))
    with torch.no_grad():
        return gemm_breakdown.capture_gemms(
            lambda: spec.greedy(stock, batch.prompt, spec.decode_steps, False, scores=False)
        )


# ----------------------------------------------------------------------------------
# Results: CSVs, tables, figures
# ----------------------------------------------------------------------------------
def summary_table(rows: Sequence[dict]) -> str:
    """Per (model, workload): each variant's time, its speedup over its baseline, or why it was not timed."""
    lines = []
    for r in rows:
        ok = r.get("status") == harness.OK
        lines.append(
            {
                "model": r.get("model"),
                "workload": r.get("workload"),
                "dtype": r.get("dtype"),
                "variant": r.get("impl"),
                "ms": r.get("ms") if ok else None,
                "speedup": r.get("speedup_vs_baseline") if ok else None,
                "spread": _spread_text(r) if ok else "",
                "baseline": r.get("baseline") or "",
                "gate": _gate_text(r),
                "status": r.get("status"),
            }
        )
    return harness.format_table(
        lines,
        [
            ("model", "model"),
            ("workload", "workload"),
            ("dtype", "dtype"),
            ("variant", "variant"),
            ("ms", "ms"),
            ("speedup", "baseline ÷ variant"),
            ("spread", "p20-p80"),
            ("baseline", "baseline"),
            ("gate", "gate err / bound"),
            ("status", "status"),
        ],
    )


def _spread_text(row: dict) -> str:
    """The paired rounds' ratios, 20th to 80th percentile ('' where the rows were not paired)."""
    lo, hi = row.get("speedup_p20"), row.get("speedup_p80")
    if lo is None or hi is None or (isinstance(lo, float) and math.isnan(lo)):
        return ""
    return f"{lo:.2f}-{hi:.2f}"


def _gate_text(row: dict) -> str:
    err, tol = row.get("rel_err"), row.get("tol")
    if err is None or (isinstance(err, float) and math.isnan(err)):
        return "-"
    if tol is None or (isinstance(tol, float) and math.isnan(tol)):
        return f"{err:.2g} (vs fp32)"
    return f"{err:.2g} / {tol:.2g}"


def fig_models(df, compiled_view: bool = False):
    """Each tritongemm variant's speedup over its baseline (stock, or torch.compile of stock), per model and
    workload; the compiled view draws the converted models against stock compiled in the same mode."""
    from matplotlib.figure import Figure

    d = df[(df["suite"] == SUITE) & (df["status"] == harness.OK) & df["speedup_vs_baseline"].notna()]
    d = d[~d["impl"].isin(["stock", "sabotaged"])]
    if compiled_view:
        d = d[d["impl"].str.startswith(("compile+convert", "compile+copy"))]
    if d.empty:
        return None
    models = list(dict.fromkeys(d["model"]))
    variants = list(dict.fromkeys(d["impl"]))
    colors = {
        "convert": "#1f77b4",
        "patch": "#2ca02c",
        "compile": "#8c8c8c",
        "compile+convert": "#d62728",
        "compile+convert:reduce-overhead": "#ff7f0e",
        "compile+convert:max-autotune-no-cudagraphs": "#9467bd",
        "compile+copy": "#c7c7c7",
        "compile+copy:reduce-overhead": "#c7c7c7",
        "compile+copy:max-autotune-no-cudagraphs": "#c7c7c7",
    }
    fig = Figure(figsize=(max(7.0, 2.2 * len(models) * 2), 4.8), layout="constrained")
    ax = fig.subplots()
    labels, x = [], 0.0
    width = 0.8 / max(len(variants), 1)
    ticks = []
    for model in models:
        m = d[d["model"] == model]
        for workload in dict.fromkeys(m["workload"]):
            w = m[m["workload"] == workload]
            for j, variant in enumerate(variants):
                v = w[w["impl"] == variant]
                if not v.empty:
                    mid = float(v["speedup_vs_baseline"].iloc[0])
                    spread = [
                        float(v[c].iloc[0]) if c in v.columns else mid for c in ("speedup_p20", "speedup_p80")
                    ]
                    ax.bar(
                        x + j * width,
                        mid,
                        width,
                        color=colors.get(variant, "#9467bd"),
                        label=variant if variant not in labels else None,
                    )
                    if all(map(math.isfinite, spread)):  # the rounds' p20-p80 of the paired ratios
                        ax.errorbar(
                            x + j * width,
                            mid,
                            yerr=[[max(mid - spread[0], 0.0)], [max(spread[1] - mid, 0.0)]],
                            color="#222222",
                            lw=0.8,
                            capsize=2,
                        )
                    labels.append(variant)
            ticks.append((x + 0.4 - width / 2, f"{model}\n{workload}"))
            x += 1.0
    ax.axhline(1.0, color="#222222", lw=0.8, ls="--")
    ax.set_xticks([t for t, _ in ticks], [s for _, s in ticks], fontsize=7, rotation=60)
    ax.set_ylabel("baseline time ÷ variant time (>1: faster)")
    ax.legend(fontsize=8)
    gpu = df["env_gpu"].dropna().iloc[0] if "env_gpu" in df.columns and df["env_gpu"].notna().any() else ""
    if compiled_view:
        title = "torch.compile of the converted model ÷ of stock, per mode (grey: a copy of stock, the A/A control)"
    else:
        title = "Whole models: tritongemm against stock" + (
            " (compile+convert against compile)" if "compile+convert" in variants else ", eager"
        )
    ax.set_title(f"{title}; whiskers: p20-p80 of the rounds\n{gpu}", fontsize=9)
    return fig


def plot_models(csvs: Sequence[str | Path], out_dir: str | Path) -> list[Path]:
    """``models_speedup.png`` (the models of every ``models*.csv`` but the compiled view, in one
    figure), ``models_compile.png`` (``models_compile.csv``) and ``models_gemms.png``, as the data allows."""
    import pandas as pd

    out = []
    frames = [(Path(csv), harness.read_results(csv)) for csv in csvs]
    frames = [(csv, df) for csv, df in frames if "suite" in df.columns]
    for figure, compiled_view in (("models_speedup.png", False), ("models_compile.png", True)):
        models = [
            df[df["suite"] == SUITE] for csv, df in frames if (csv.stem == "models_compile") == compiled_view
        ]
        models = [df for df in models if len(df)]
        fig = fig_models(pd.concat(models, ignore_index=True), compiled_view) if models else None
        if fig is not None:
            path = Path(out_dir) / figure
            path.parent.mkdir(parents=True, exist_ok=True)
            fig.savefig(path, dpi=120)
            out.append(path)
    for csv, df in frames:
        if (df["suite"] == gemm_breakdown.SUITE).any():
            out += gemm_breakdown.plot_breakdown(csv, out_dir)
    return out


def write(
    result: ModelsResult, out_dir: str | Path, env: dict, extra: dict | None = None, name: str = "models"
) -> list[Path]:
    """``<name>.csv`` and ``models_gemms.csv`` (each with an env sidecar) in ``out_dir``."""
    out_dir = Path(out_dir)
    paths = [harness.write_results(result.rows, out_dir / f"{name}.csv", env, extra)]
    if result.gemm_rows:
        paths.append(harness.write_results(result.gemm_rows, out_dir / "models_gemms.csv", env, extra))
    return paths


def modes_apart(
    compile_modes: Sequence[str] | None, run: Callable[[tuple[str, ...]], ModelsResult]
) -> ModelsResult:
    """``run(modes)`` for each of ``compile_modes`` alone (None: the eager suite, one run in the default
    mode), Dynamo's caches emptied between them; the rows gathered, eager stock's from the first run.

    Every compiled copy of a model shares its forward's code objects and Dynamo's cache entries for
    them.  On the H100, with all three modes' six copies in one process, converted GPT-2 read 0.79 of
    compiled stock in the default mode, though both ran the same generated code (1.00 timed in a
    process of their own: ``results/h100/sweeps/gpt2_compiled_same_code.txt``); one mode at a time it read
    1.00.
    """
    result = ModelsResult()
    for i, modes in enumerate([(m,) for m in compile_modes] if compile_modes is not None else [("default",)]):
        if i:
            torch._dynamo.reset()
        part = run(modes)
        result.rows += [r for r in part.rows if not i or r.get("impl") != "stock"]  # (each run times stock)
        result.gemm_rows += part.gemm_rows
    return result


def run_models_suite(
    out: str | Path | None = None,
    dtype: str | None = None,
    *,
    compile: bool = True,
    case_filter: str | None = None,
    include_sabotaged: bool = False,
    warmup_ms: float = 25,
    rep_ms: float = 100,
    rounds: int = harness.ROUNDS,
    timing: str = "loop",
    plots: bool = True,
    compile_modes: Sequence[str] | None = None,
) -> tuple[harness.RunSummary, str]:
    """The GPU suite: every default model's workloads.

    Returns the run summary (``figures`` lists every file written after the
    main CSV: the GEMM CSV and the figures) and the text tables.  With ``compile_modes``
    (``--compile-modes``) it is the compiled view instead: stock, then ``torch.compile`` of stock
    and of the converted model in each mode, with compile times, into ``models_compile.csv``.
    """
    import tritongemm

    if not torch.cuda.is_available() or tritongemm.interpreter_enabled():
        raise RuntimeError("the models suite times compiled kernels on a CUDA GPU")
    dtypes = [d.strip() for d in (dtype or "bf16").split(",") if d.strip()]
    if len(dtypes) != 1 or dtypes[0] not in ("bf16", "fp16"):
        raise ValueError(f"--dtype for the models suite: one of bf16, fp16 (got {dtype!r})")
    device = torch.device("cuda", torch.cuda.current_device())
    env = harness.environment(device)
    out_dir = Path(out) if out is not None else harness.default_results_dir(env)
    pairs = select_cases(case_filter)
    if compile_modes is not None:
        unknown = [m for m in compile_modes if m not in COMPILE_MODES]
        if unknown or not compile_modes:
            raise ValueError(
                f"--compile-modes: some of {', '.join(COMPILE_MODES)} (got {list(compile_modes)})"
            )
        pairs = [(s, w) for s, w in pairs if w in s.compiled]
    start = time.perf_counter()

    def log(msg: str) -> None:
        print(f"[models {time.perf_counter() - start:6.1f}s] {msg}", file=sys.stderr, flush=True)

    log(f"{len(pairs)} (model, workload) cases: {', '.join(f'{s.name} {w}' for s, w in pairs)}")
    result = modes_apart(
        compile_modes,
        lambda modes: run_models(
            pairs,
            device,
            harness.DTYPES[dtypes[0]],
            compile=compile and hasattr(torch, "compile"),
            sabotaged=include_sabotaged,
            warmup_ms=warmup_ms,
            rep_ms=rep_ms,
            rounds=rounds,
            timing=timing,
            compile_modes=modes,
            eager=compile_modes is None,
            breakdown=compile_modes is None,
            log=log,
        ),
    )
    extra = {
        "suite": SUITE,
        "timing": timing,
        "gate_factor": GATE_FACTOR,
        "dtype": dtypes[0],
        "models": {s.name: {"size": s.size, "compiled_workloads": s.compiled} for s, _ in pairs},
        "wall_s": round(time.perf_counter() - start, 1),
    }
    if compile_modes is not None:
        extra["compile_modes"] = list(compile_modes)
    csvs = write(result, out_dir, env, extra, name="models" if compile_modes is None else "models_compile")
    summary = harness.RunSummary(csv=csvs[0], figures=csvs[1:])
    summary.failed = [
        f"{r['case']} {r.get('impl')}: {r['status']} {r.get('message', '')}"
        for r in result.rows
        if r.get("status") != harness.OK and r.get("impl") != "sabotaged"
    ]
    if plots:
        try:
            summary.figures += plot_models(csvs, out_dir)
        except Exception as exc:  # the CSVs are written; `plot_models` redraws them later
            print(f"figures skipped ({type(exc).__name__}: {exc})", file=sys.stderr)
    table = summary_table(result.rows) + "\n\n" + gemm_breakdown.breakdown_table(result.gemm_rows)
    return summary, table


def run_cli(args) -> int:
    """``python -m benchmarks run --suite models`` (the parsed ``run`` arguments); the exit status."""
    from tritongemm.launch import native

    print(f"autograd node of repeated calls with grad: {native.node_in_use()}", file=sys.stderr)
    summary, table = run_models_suite(
        args.out,
        args.dtype,
        compile=not args.no_compile,
        case_filter=args.filter,
        include_sabotaged=args.sabotaged,
        warmup_ms=args.warmup,
        rep_ms=args.rep,
        rounds=args.rounds or harness.ROUNDS,
        timing=getattr(args, "timing", "loop"),
        plots=not args.no_plots,
        compile_modes=args.compile_modes.split(",") if getattr(args, "compile_modes", None) else None,
    )
    print("\n== models ==")
    print(table)
    print(f"wrote {summary.csv}" + "".join(f"\nwrote {f}" for f in summary.figures))
    if summary.failed:
        print(f"{len(summary.failed)} case(s) not timed:")
        for line in summary.failed:
            print("  " + line)
    return 1 if summary.failed else 0


__all__ = [
    "MODELS",
    "ModelSpec",
    "WORKLOADS",
    "GATE_FACTOR",
    "build_model",
    "low_precision_copy",
    "shared_copy",
    "build_variants",
    "make_batch",
    "forward",
    "forward_backward",
    "train_step",
    "error_bound",
    "gate_tensor",
    "gate_grads",
    "gate_tokens",
    "tie_margin",
    "run_workload",
    "run_models",
    "select_cases",
    "capture_workload",
    "summary_table",
    "fig_models",
    "plot_models",
    "write",
    "run_models_suite",
    "run_cli",
    "SabotagedLinear",
    "sabotage",
]
