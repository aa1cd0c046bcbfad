"""``python -m benchmarks fp8-train``: fp8 training through ``nn.convert(precision="fp8")`` against bf16.

Two parts, one CSV (``fp8_train.csv``) and one figure (``fp8_train.png``):

* **loss**: a small pre-norm decoder (``tiny_models.TinyLM``, 4 layers of 256 hidden units)
  trained from the same initialization for ``--steps`` AdamW steps on a fixed synthetic corpus,
  a seeded Markov chain over 256 tokens whose transitions each favour a handful of successors
  (so there is structure to learn and a loss floor below log 256).  bf16 stock (autocast over
  fp32 weights) against the converted model, rowwise, tensorwise and blockwise scales.  One row
  per run and logged step (``x`` the step, ``loss`` the mean of the last 10 steps' losses);
* **step time**: Llama-3-8B's block projections (q, k, v, o, gate, up, down on 4096 hidden
  units, 14336 intermediate) on 4096 tokens, forward (prefill) and forward + backward, bf16
  stock against the fp8 layers, in interleaved rounds (``do_bench`` medians).  ``speedup``
  is the stock time over the fp8 one.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

import tritongemm

from . import harness
from .tiny_models import TinyConfig, TinyLM

SUITE = "fp8_train"
FIGURE = "fp8_train.png"
VOCAB = 256
RECIPES = ("rowwise", "tensorwise", "blockwise")


def markov_corpus(tokens: int, seed: int, device) -> torch.Tensor:
    """A seeded Markov chain over VOCAB tokens: each token's successors drawn from a peaked
    distribution (a few likely successors), generated on ``device``."""
    gen = torch.Generator(device="cpu").manual_seed(seed)
    logits = torch.randn(VOCAB, VOCAB, generator=gen) * 3.0
    probs = torch.softmax(logits, dim=1)
    chain = torch.empty(tokens, dtype=torch.long)
    chain[0] = 0
    draws = torch.rand(tokens, generator=gen)
    cdf = probs.cumsum(1)
    for i in range(1, tokens):
        chain[i] = min(int(torch.searchsorted(cdf[chain[i - 1]], draws[i])), VOCAB - 1)
    return chain.to(device)


def train_losses(precision: str | None, recipe: str, steps: int, corpus: torch.Tensor, seed: int):
    """Per-step losses of TinyLM trained on ``corpus`` (same init for every run: ``seed``)."""
    torch.manual_seed(seed)
    cfg = TinyConfig(vocab=VOCAB, hidden=256, heads=4, mlp=1024, layers=4)
    model = TinyLM(cfg).to(corpus.device)
    if precision is not None:
        tritongemm.nn.convert(model, precision=precision, recipe=recipe)
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=0.0)
    batch, seq = 16, 128
    gen = torch.Generator(device="cpu").manual_seed(seed + 1)
    losses = []
    for _ in range(steps):
        starts = torch.randint(0, corpus.numel() - seq - 1, (batch,), generator=gen)
        idx = starts[:, None] + torch.arange(seq + 1)
        chunk = corpus[idx.to(corpus.device)]
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(chunk[:, :-1])
        loss = F.cross_entropy(logits.float().reshape(-1, VOCAB), chunk[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def llama_block(device, precision: str | None, recipe: str):
    """Llama-3-8B's seven projections (no attention or norms: the GEMMs and what they cost)."""
    torch.manual_seed(0)
    shapes = {"q": (4096, 4096), "k": (4096, 1024), "v": (4096, 1024), "o": (4096, 4096),
              "gate": (4096, 14336), "up": (4096, 14336), "down": (14336, 4096)}  # fmt: skip
    layers = torch.nn.ModuleDict(
        {
            n: torch.nn.Linear(i, o, bias=False, device=device, dtype=torch.bfloat16)
            for n, (i, o) in shapes.items()
        }
    )
    if precision is not None:
        tritongemm.nn.convert(layers, precision=precision, recipe=recipe)

    def forward(x):
        q, k, v = layers["q"](x), layers["k"](x), layers["v"](x)
        h = x + layers["o"](q) + 0.0 * (k.sum() + v.sum())
        return h + layers["down"](F.silu(layers["gate"](h)) * layers["up"](h))

    return layers, forward


def step_times(device, rounds: int) -> list[dict]:
    from triton.testing import do_bench

    tokens = 4096
    x = torch.randn(tokens, 4096, device=device, dtype=torch.bfloat16) * 0.5
    runs = {"bf16 stock": (None, "rowwise")} | {f"fp8 {r}": ("fp8", r) for r in RECIPES}
    fns = {}
    for name, (precision, recipe) in runs.items():
        layers, forward = llama_block(device, precision, recipe)
        xg = x.clone().requires_grad_()

        def prefill(forward=forward):
            with torch.no_grad():
                forward(x)

        def train(forward=forward, xg=xg, layers=layers):
            forward(xg).float().square().mean().backward()
            for p in layers.parameters():
                p.grad = None
            xg.grad = None

        fns[name] = {"prefill": prefill, "train step": train}
    times: dict = {}
    for r in range(rounds):
        order = list(fns) if r % 2 == 0 else list(reversed(fns))
        for name in order:
            for phase, fn in fns[name].items():
                times.setdefault((name, phase), []).append(do_bench(fn, warmup=25, rep=200))
    rows = []
    for (name, phase), samples in times.items():
        ms = sorted(samples)[len(samples) // 2]
        stock = sorted(times[("bf16 stock", phase)])[len(samples) // 2]
        rows.append(
            dict(
                suite=SUITE,
                group="llama3-8b projections",
                case=f"{phase}, 4096 tokens",
                x=tokens,
                x_label="tokens",
                m=tokens,
                dtype="bf16" if "stock" in name else "fp8_e4m3",
                impl="torch" if "stock" in name else "tritongemm.nn.Float8Linear",
                family="cublas" if "stock" in name else "tritongemm",
                variant=name,
                status="ok",
                ms=ms,
                speedup=stock / ms,
                phase=phase,
            )  # fmt: skip
        )
    return rows


def run_cli(args) -> int:
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() < (8, 9):
        print(
            "benchmarks fp8-train: needs a CUDA GPU with fp8 tensor cores (sm_89 or newer)", file=sys.stderr
        )
        return 2
    device = torch.device("cuda", torch.cuda.current_device())
    env = harness.environment(device)
    out_dir = Path(args.out) if args.out else harness.default_results_dir(env)
    corpus = markov_corpus(200_000, seed=7, device=device)
    rows = []
    curves = {}
    for name, precision, recipe in [("bf16 stock", None, "rowwise")] + [
        (f"fp8 {r}", "fp8", r) for r in RECIPES
    ]:
        losses = train_losses(precision, recipe, args.steps, corpus, seed=0)
        curves[name] = losses
        for step in range(10, args.steps + 1, 10):
            window = losses[step - 10 : step]
            rows.append(
                dict(
                    suite=SUITE,
                    group="loss",
                    case=f"{name} step {step}",
                    x=step,
                    x_label="step",
                    dtype="bf16" if "stock" in name else "fp8_e4m3",
                    impl=name,
                    variant=name,
                    status="ok",
                    loss=sum(window) / len(window),
                )  # fmt: skip
            )
        print(f"{name:16s} final loss (mean of last 10 steps) {sum(losses[-10:]) / 10:.4f}", flush=True)
    rows += step_times(device, args.rounds)
    out_dir.mkdir(parents=True, exist_ok=True)
    harness.to_frame(rows, env).to_csv(out_dir / f"{SUITE}.csv", index=False)
    _plot(curves, [r for r in rows if r["group"] != "loss"], env, out_dir / FIGURE)
    final = {n: sum(c[-10:]) / 10 for n, c in curves.items()}
    print()
    for n, v in final.items():
        print(f"loss {n:16s} {v:.4f}  ({v / final['bf16 stock']:.3f} of bf16)")
    for r in rows:
        if r["group"] != "loss":
            print(f"{r['phase']:11s} {r['variant']:16s} {r['ms']:8.3f} ms  x{r['speedup']:.3f} of bf16 stock")
    return 0


def _plot(curves: dict, timing: list[dict], env: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5), gridspec_kw={"width_ratios": [2, 1]})
    for name, losses in curves.items():
        smooth = [
            sum(losses[max(0, i - 9) : i + 1]) / len(losses[max(0, i - 9) : i + 1])
            for i in range(len(losses))
        ]
        left.plot(range(1, len(losses) + 1), smooth, label=name)
    left.axhline(math.log(VOCAB), color="grey", lw=0.8, ls=":")
    left.set_xlabel("step")
    left.set_ylabel("training loss (mean of 10 steps)")
    left.set_title("TinyLM (4 x 256) on a seeded Markov corpus")
    left.legend()
    phases = sorted({r["phase"] for r in timing})
    names = list(dict.fromkeys(r["variant"] for r in timing))
    width = 0.8 / len(names)
    for i, name in enumerate(names):
        vals = [
            next(r["speedup"] for r in timing if r["phase"] == p and r["variant"] == name) for p in phases
        ]
        right.bar([j + i * width for j in range(len(phases))], vals, width, label=name)
    right.axhline(1.0, color="black", lw=0.8, ls="--")
    right.set_xticks([j + width * (len(names) - 1) / 2 for j in range(len(phases))], phases)
    right.set_ylabel("bf16 stock time / time")
    right.set_title("Llama-3-8B projections, 4096 tokens")
    top = max(r["speedup"] for r in timing)
    right.set_ylim(0, top * 1.35)  # (room for the legend above the bars)
    right.legend(fontsize=8, ncol=2, loc="upper center")
    fig.suptitle(f"fp8 training through nn.convert(precision='fp8') on {env.get('gpu', 'GPU')}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


__all__ = ["llama_block", "markov_corpus", "run_cli", "train_losses"]
