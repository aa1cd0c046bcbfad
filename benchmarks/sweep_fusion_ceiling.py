"""What fusing can gain, measured: a fused epilogue and the gated MLP against the same GEMMs alone.

A fused kernel saves the elementwise passes around a GEMM, nothing of the GEMM.  So at best it runs
as fast as cuBLAS's GEMMs with no elementwise work after them, and torch's sequence ÷ that time is the
most any fusion can read against torch (the *ceiling*).  Per problem this times, on the same inputs:

* ``torch``: torch's sequence -- ``act(F.linear(x, w, b))``, or the stock gated block
  ``down(act(gate(x)) * up(x))`` (forward under ``no_grad``, as in inference, or forward + backward
  through autograd);
* ``cublas_gemms``: the same GEMMs through torch (cuBLAS) and nothing else -- ``F.linear(x, w, b)``, or
  the block's three GEMMs (nine with backward; x's gradient summed by ``addmm``'s beta);
* ``gemms``: those GEMMs through tritongemm (``linear``, ``mm``, ``addmm``);
* ``fused``: tritongemm's fused call -- ``linear(x, w, b, activation=)``, or ``nn.GatedMLP`` (what
  ``nn.convert`` makes of the stock block).

Each ratio below is a quotient of two of those medians, so they multiply out:
``fused`` (torch ÷ fused) = ``ceiling`` (torch ÷ cublas_gemms) × ``parity`` (cublas_gemms ÷ gemms, the
GEMMs against cuBLAS's) × ``epilogue`` (gemms ÷ fused: above 1 where the fused kernel beats
tritongemm's own GEMMs followed by nothing, which the gated kernel can, being one GEMM where the
sequence runs two).  A fused row short of its target while ``epilogue`` is near 1 is short in the
GEMMs, not in the fusion.

Run from the repository root on the GPU machine (about two minutes):

    python -m benchmarks.sweep_fusion_ceiling --out DIR     # DIR/fusion_ceiling.json, .txt and .png

Method: bf16, random inputs (the weights scaled by 1 / sqrt(K)) rotated past the L2, every output --
with backward every gradient -- compared with float64 of its own math first (not timed if wrong),
three interleaved rounds (order reversed every other round), each ``do_bench_cudagraph``'s median
(``sweep_fp8_split_rows.timed_rounds``).
"""

from __future__ import annotations

import argparse
import copy
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

import tritongemm
from tritongemm.semantics import ACTIVATIONS
from tritongemm.testing import tolerance

from . import harness
from .mlp import MLP
from .sweep_fp8_blockwise import checked
from .sweep_fp8_split_rows import ratio_cell, save_records, start_on_gpu, timed_rounds

DTYPE = torch.bfloat16
#: A linear layer's epilogue: (label, M, N, K, activation); the epilogue suite's widths, and BERT's fc1.
LINEARS = (
    ("llama3-8b up", 1000, 14336, 4096, "gelu"),
    ("llama3-8b up", 4096, 14336, 4096, "gelu"),
    ("llama3-8b up", 4096, 14336, 4096, "silu"),
    ("qwen2.5-7b up", 2048, 18944, 3584, "gelu"),
    ("llama3-70b up", 2048, 28672, 8192, "gelu"),
    ("llama3-8b down", 4096, 4096, 14336, "gelu"),
    ("bert fc1", 8192, 3072, 768, "gelu"),
)
#: A gated MLP block: (label, M, hidden, intermediate, activation, backward).
BLOCKS = tuple(
    (label, m, hidden, inter, "silu", backward)
    for backward in (False, True)
    for label, hidden, inter, tokens in (
        ("llama3-8b", 4096, 14336, (2048, 4096)),
        ("qwen2.5-7b", 3584, 18944, (4096,)),
    )
    for m in tokens
)
NAMES = ("cublas_gemms", "gemms", "fused")


def as_ref(out) -> torch.Tensor:
    """A float64 reference as ``sweep_fp8_blockwise.checked`` compares it: a tensor as it is, a tuple (a
    block's output and gradients) as one flat vector."""
    if isinstance(out, tuple):
        return torch.cat([t.double().flatten() for t in out])
    return out.double()


def gate(impls: dict, sets: list, ref: torch.Tensor, row: dict) -> dict:
    """``checked`` with bf16's tolerance against float64."""
    return checked(impls, sets, ref, row, tolerance(DTYPE, sets[0][0].device))


def derive(row: dict) -> None:
    """The ceiling, the GEMMs' parity and the epilogue's share from the medians (see the docstring)."""
    ms = {n: row.get(f"{n}_ms") for n in ("torch", *NAMES)}
    if ms["torch"] and ms["cublas_gemms"]:
        row["ceiling"] = ms["torch"] / ms["cublas_gemms"]
    if ms["cublas_gemms"] and ms["gemms"]:
        row["parity"] = ms["cublas_gemms"] / ms["gemms"]
    if ms["gemms"] and ms["fused"]:
        row["epilogue"] = ms["gemms"] / ms["fused"]


def measure_linear(label: str, m: int, n: int, k: int, activation: str, device, gen) -> dict:
    w = (torch.randn(n, k, device=device, generator=gen) / k**0.5).to(DTYPE)
    b = torch.randn(n, device=device, generator=gen).to(DTYPE)
    copies = harness.copies_to_exceed_l2(2 * (m * k + m * n), harness.l2_cache_bytes(device))
    sets = [(torch.randn(m, k, device=device, generator=gen).to(DTYPE),) for _ in range(copies)]
    act = ACTIVATIONS[activation]
    z64 = F.linear(sets[0][0].double(), w.double(), b.double())
    row = {"kind": "linear", "label": label, "m": m, "n": n, "k": k, "activation": activation, "mode": "fwd"}
    fused = {
        "torch": lambda x: act(F.linear(x, w, b)),
        "fused": lambda x: tritongemm.linear(x, w, b, activation=activation),
    }
    live = gate(fused, sets, act(z64), row)
    plain = {"cublas_gemms": lambda x: F.linear(x, w, b), "gemms": lambda x: tritongemm.linear(x, w, b)}
    live |= gate(plain, sets, z64, row)
    timed_rounds(live, row)
    derive(row)
    return row


def block_gemms(mm, addmm, backward: bool):
    """The gated block's GEMMs alone, through ``mm`` / ``addmm``: g, u and the down projection of g (the
    product's stand-in), and with backward dh = dy W_d, then g's and u's gradient taken as dh."""

    def run(x, dy, wg, wu, wd):
        g, u = mm(x, wg.t()), mm(x, wu.t())
        y = mm(g, wd.t())
        if not backward:
            return y, u
        dh = mm(dy, wd)
        dx = addmm(mm(dh, wg), dh, wu)
        return y, u, dx, mm(dh.t(), x), mm(dh.t(), x), mm(dy.t(), g)

    return run


def measure_block(
    label: str, m: int, hidden: int, inter: int, activation: str, backward: bool, device, gen
) -> dict:
    stock = MLP(hidden, inter, activation, device=device, dtype=DTYPE)
    with torch.no_grad():
        for p in stock.parameters():
            p.copy_(torch.randn(p.shape, device=device, generator=gen) / p.shape[1] ** 0.5)
    fused = tritongemm.nn.convert(copy.deepcopy(stock))
    weights = (stock.gate_proj.weight, stock.up_proj.weight, stock.down_proj.weight)
    copies = harness.copies_to_exceed_l2(2 * 2 * m * hidden, harness.l2_cache_bytes(device))
    sets = [
        (torch.randn(m, hidden, device=device, generator=gen).to(DTYPE),
         torch.randn(m, hidden, device=device, generator=gen).to(DTYPE), *weights)
        for _ in range(copies)
    ]  # fmt: skip

    def module_call(module):
        params = list(module.parameters())

        def run(x, dy, *_):
            if not backward:  # (inference: nothing is kept for a backward)
                with torch.no_grad():
                    return module(x)
            x = x.detach().requires_grad_()
            y = module(x)
            return (y, *torch.autograd.grad(y, [x, *params], dy))

        return run

    row = {"kind": "gated", "label": label, "m": m, "n": inter, "k": hidden, "activation": activation}
    row["mode"] = "fwd+bwd" if backward else "fwd"
    ref_module = copy.deepcopy(stock).double()
    x, dy = sets[0][0].double(), sets[0][1].double()
    live = gate(
        {"torch": module_call(stock), "fused": module_call(fused)},
        sets,
        as_ref(module_call(ref_module)(x, dy)),
        row,
    )
    plain = {
        "cublas_gemms": block_gemms(torch.mm, torch.addmm, backward),
        "gemms": block_gemms(tritongemm.mm, tritongemm.addmm, backward),
    }
    ref = as_ref(block_gemms(torch.mm, torch.addmm, backward)(x, dy, *(w.double() for w in weights)))
    live |= gate(plain, sets, ref, row)
    timed_rounds(live, row)
    derive(row)
    return row


def cell(row: dict, key: str) -> str:
    return format(row[key], ".3f") if key in row else "-"


def table(rows: list[dict]) -> str:
    head = f"{'problem':<34} {'torch us':>9} {'fused':>7} {'ceiling':>8} {'parity':>7} {'epilogue':>9}"
    lines = [head, "  (fused = torch / fused = ceiling x parity x epilogue; see the docstring)"]
    for r in rows:
        what = f"{r['label']} {r['m']}x{r['n']}x{r['k']} {r['activation']} {r['mode']}"
        torch_us = format(r["torch_ms"] * 1e3, ".1f") if "torch_ms" in r else "-"
        fused = ratio_cell(r, "fused", 7)
        lines.append(
            f"{what:<34} {torch_us:>9} {fused:>7} {cell(r, 'ceiling'):>8} {cell(r, 'parity'):>7} {cell(r, 'epilogue'):>9}"
        )
    return "\n".join(lines)


def plot(rows: list[dict], path: Path, gpu: str) -> None:
    """Per problem: the ceiling (a bar) and what the fused call reads (a dot), against torch."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shown = [r for r in rows if "ceiling" in r and "fused_ratio" in r]
    if not shown:
        return
    fig, ax = plt.subplots(figsize=(10, 4.5))
    xs = range(len(shown))
    ax.bar(xs, [r["ceiling"] for r in shown], color="#c6dbef", label="ceiling: torch ÷ cuBLAS's GEMMs alone")
    ax.plot(xs, [r["fused_ratio"] for r in shown], "o", color="#08519c", label="tritongemm fused ÷ torch")
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_xticks(list(xs))
    ax.set_xticklabels(
        [f"{r['label']}\n{r['m']} {r['activation']} {r['mode']}" for r in shown],
        rotation=60,
        ha="right",
        fontsize=7,
    )
    ax.set_ylabel("speed-up over torch's sequence")
    ax.set_ylim(0.8, max(r["ceiling"] for r in shown) * 1.05)
    ax.set_title(f"What fusion can gain (bf16, {gpu})")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.sweep_fusion_ceiling", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--out", default=".", help="folder for fusion_ceiling.json, .txt and .png")
    args = parser.parse_args(argv)
    started = start_on_gpu(
        args.out, "the fusion ceiling sweep times GEMMs against cuBLAS: it needs a CUDA GPU"
    )
    if started is None:
        return 2
    device, gen, out, env = started
    problems = [(measure_linear, p) for p in LINEARS] + [(measure_block, p) for p in BLOCKS]
    rows = []
    for i, (measure, p) in enumerate(problems, 1):
        print(f"[{i}/{len(problems)}] {p}", file=sys.stderr, flush=True)
        rows.append(measure(*p, device, gen))
        save_records(out, "fusion_ceiling", {"env": env, "records": rows}, table(rows))
        torch.cuda.empty_cache()
    plot(rows, out / "fusion_ceiling.png", env.get("gpu", "GPU"))
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
