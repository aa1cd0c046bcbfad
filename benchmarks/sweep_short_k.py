"""Short K (768-1024: BERT, ViT, GPT-2 widths): the fused activation eager and compiled, the ping-pong rule,
and the models whose MLPs ``nn.convert`` now fuses.

At K = 768 a tile's mainloop is 12 steps of 64, so whatever runs after it -- a fused activation, or
just the store -- is a large share of the GEMM, and the pass an unfused activation makes over the
output costs about 470/K of it (60%).  Per shape this times torch's ``F.linear`` (then its activation),
the same under ``torch.compile`` (cuBLAS, then one fused pointwise kernel), ``tritongemm.linear`` with
the heuristic's plan, eager and compiled (``plan.compiled_reason``: a fused activation at K <= 2048
keeps the kernel), and the warp-specialized 128 x 128 tile forced on one consumer and on two
ping-pong consumers (``heuristics/epilogue.py``'s short-K rule).  ``--models`` then times BERT-base
(bf16, 16 x 512 tokens) and ViT-B/16 (fp16, batch 64) prefill, stock and converted, eager and
compiled.

Run from the repository root on the GPU machine (about four minutes with ``--models``):

    python -m benchmarks.sweep_short_k --out DIR [--models]   # DIR/short_k.json and .txt

Method: bias and activation as the layer has them, random inputs rotated past the L2, every output
compared with float64 first (``sweep_fp8_blockwise.checked``: not timed if wrong), three interleaved
rounds (order reversed every other round) of ``do_bench_cudagraph`` medians
(``sweep_fp8_split_rows.timed_rounds``).  Ratio = torch's eager time / the other's (> 1: faster).
Models: back-to-back forwards between two synchronizations, in nine interleaved rounds, medians;
each variant's logits checked against eager stock's first.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time

import torch
import torch.nn.functional as F

import tritongemm
from tritongemm import TileConfig
from tritongemm.testing import relative_error

from .sweep_epilogue_tiles import TORCH_ACTIVATIONS, linear_inputs
from .sweep_fp8_blockwise import checked
from .sweep_fp8_split_rows import ratio_cell, save_records, start_on_gpu, timed_rounds

#: (what, M, N, K, activation): the MLP's first projection and the attention's, at prefill rows.
SHAPES = (
    ("GPT-2 fc1", 4096, 3072, 768, "gelu_tanh"),
    ("BERT fc1", 8192, 3072, 768, "gelu"),
    ("ViT fc1", 12608, 3072, 768, "gelu"),
    ("BERT-large fc1", 8192, 4096, 1024, "gelu"),
    ("BERT fc1, no act", 8192, 3072, 768, "none"),
    ("BERT qkv", 8192, 2304, 768, "none"),
    ("BERT attn out", 8192, 768, 768, "none"),
    ("ViT qkv", 12608, 2304, 768, "none"),
)
TILES = {
    "one128x128": TileConfig(128, 128, 64, 8, 4, 6, kernel="gluon_ws"),
    "pingpong128x128": TileConfig(128, 128, 64, 8, 4, 5, kernel="gluon_ws", pingpong=True),
}
#: A compiled model may err by this many times what compiled stock errs against eager stock (or 2e-2).
MODEL_GATE_FACTOR = 4.0


def measure(what: str, m: int, n: int, k: int, activation: str, device, gen) -> dict:
    sets = linear_inputs(m, n, k, device, gen)
    act = TORCH_ACTIVATIONS[activation]
    ref = act(F.linear(*(t.double() for t in sets[0])))

    def torch_fn(x, w, b):
        return act(F.linear(x, w, b))

    def ours(config=None):
        return lambda x, w, b: tritongemm.linear(x, w, b, activation=activation, config=config)

    impls = {"torch": torch_fn, "compiled": torch.compile(torch_fn), "rule": ours()}
    if activation != "none":  # (without one, the compiled converted GEMM is aten's, as stock's)
        impls["rule_compiled"] = torch.compile(ours())
    impls.update({name: ours(cfg) for name, cfg in TILES.items()})
    row = {"what": what, "m": m, "n": n, "k": k, "activation": activation}
    chosen = tritongemm.explain(sets[0][0], sets[0][1].t(), bias=sets[0][2], activation=activation)
    row["rule_plan"] = f"{chosen.kernel} {chosen.config.short()}"
    row["rule_compiled_route"] = chosen.compiled or "the aten ops"
    torch._dynamo.reset()
    timed_rounds(checked(impls, sets, ref, row), row)
    return row


def _bert(device):
    from transformers import BertConfig, BertForMaskedLM

    model = BertForMaskedLM(BertConfig()).to(device, torch.bfloat16).eval()
    ids = torch.randint(0, 30522, (16, 512), device=device)
    return model, lambda m: m(input_ids=ids).logits


def _vit(device):
    import timm

    model = timm.create_model("vit_base_patch16_224", pretrained=False).to(device, torch.float16).eval()
    x = torch.randn(64, 3, 224, 224, device=device, dtype=torch.float16)
    return model, lambda m: m(x)


MODELS = {"BERT-base prefill": _bert, "ViT-B/16 prefill": _vit}


def measure_model(name: str, device, rounds: int = 9, steps: int = 10) -> dict:
    stock, run = MODELS[name](device)
    converted = tritongemm.nn.convert(copy.deepcopy(stock))
    row = {"model": name, "fused": tritongemm.nn.fusion_summary(converted).splitlines()[0]}
    variants = {"stock": stock, "convert": converted}
    torch._dynamo.reset()
    with torch.no_grad():
        for v in ("stock", "convert"):
            t0 = time.perf_counter()
            variants[f"compiled {v}"] = compiled = torch.compile(variants[v])
            run(compiled)
            torch.cuda.synchronize()
            row[f"compile_s {v}"] = time.perf_counter() - t0
        ref = run(stock).double()
        errs = {v: relative_error(run(m).double(), ref) for v, m in variants.items()}
        bound = max(MODEL_GATE_FACTOR * errs["compiled stock"], 2e-2)
        row.update({f"rel_err {v}": e for v, e in errs.items()})
        live = {v: m for v, m in variants.items() if errs[v] <= bound}
        samples: dict[str, list[float]] = {v: [] for v in live}
        for r in range(rounds):
            for v in list(live) if r % 2 == 0 else list(live)[::-1]:
                for _ in range(2):
                    run(live[v])
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                for _ in range(steps):
                    run(live[v])
                torch.cuda.synchronize()
                samples[v].append((time.perf_counter() - t0) * 1e3 / steps)
    for v, s in samples.items():
        row[f"{v}_ms"] = statistics.median(s)
    for v in samples:
        row[f"{v} / stock"] = row["stock_ms"] / row[f"{v}_ms"]
    if "compiled convert_ms" in row:
        row["compiled convert / compiled stock"] = row["compiled stock_ms"] / row["compiled convert_ms"]
    return row


def table(rows: list[dict], models: list[dict]) -> str:
    names = ("compiled", "rule", "rule_compiled", *TILES)
    lines = [
        "GEMM (bf16, bias)                 act        torch us "
        + " ".join(f"{n:>15}" for n in names)
        + "  rule_compiled / compiled   rule"
    ]
    for r in rows:
        cells = [ratio_cell(r, n, 15) for n in names]
        vs = (
            r["compiled_ms"] / r["rule_compiled_ms"]
            if "rule_compiled_ms" in r and "compiled_ms" in r
            else None
        )
        shape = f"{r['what']} {r['m']}x{r['n']}x{r['k']}"
        lines.append(
            f"{shape:<33} {r['activation']:<10} {r['torch_ms'] * 1e3:>8.1f} "
            + " ".join(f"{c:>15}" for c in cells)
            + f"  {'-' if vs is None else format(vs, '.3f'):>24}   {r['rule_plan']}"
        )
    if models:
        lines += [
            "",
            f"{'model':<20} {'stock ms':>9} {'convert':>9} {'compiled':>9} {'c.convert':>9}  c.convert / c.stock",
        ]
        for r in models:
            cells = [
                format(r[f"{v} / stock"], ".3f") if f"{v} / stock" in r else "gate"
                for v in ("convert", "compiled stock", "compiled convert")
            ]
            vs = r.get("compiled convert / compiled stock")
            lines.append(
                f"{r['model']:<20} {r['stock_ms']:>9.3f} "
                + " ".join(f"{c:>9}" for c in cells)
                + f"  {'-' if vs is None else format(vs, '.3f')}   ({r['fused']})"
            )
        lines.append("(model columns: stock's time / the variant's; c. = torch.compile, default mode)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.sweep_short_k", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--out", default=".", help="folder for short_k.json and .txt")
    parser.add_argument("--models", action="store_true", help="also time BERT-base and ViT-B/16 prefill")
    args = parser.parse_args(argv)
    started = start_on_gpu(
        args.out, "the short-K sweep times the warp-specialized kernel: it needs an sm_90 GPU"
    )
    if started is None:
        return 2
    device, gen, out, env = started
    rows: list[dict] = []
    models: list[dict] = []

    def save() -> None:
        save_records(out, "short_k", {"env": env, "records": rows, "models": models}, table(rows, models))

    jobs = list(SHAPES)
    names = list(MODELS) if args.models else []
    for i, (what, m, n, k, act) in enumerate(jobs, 1):
        print(f"[{i}/{len(jobs) + len(names)}] {what} {m}x{n}x{k} {act}", file=sys.stderr, flush=True)
        rows.append(measure(what, m, n, k, act, device, gen))
        save()
    for i, name in enumerate(names, len(jobs) + 1):
        print(f"[{i}/{len(jobs) + len(names)}] {name}", file=sys.stderr, flush=True)
        models.append(measure_model(name, device))
        save()
    print(table(rows, models))
    return 0


if __name__ == "__main__":
    sys.exit(main())
