"""Compiled Llama-style prefill: the gated MLP's op against its three Linears, beside an A/A control, and
where the compiled prefill's GPU time goes.

``nn.convert`` makes a Llama MLP a ``GatedMLP``.  Under ``torch.compile`` (inference) it is either the
gated op, one opaque call that computes ``silu(x Wg^T) * (x Wu^T)`` in one kernel, or its three Linears,
which Inductor sees as the stock model's ``mm``s and one fused pass (``GatedMLP.compiled_min_outputs``).
Per model size this times, compiled in default mode, bf16, in one process:

* ``stock`` and ``stock copy``: a deep copy of the stock model, compiled too -- the A/A control, whose
  ratio is what two identical graphs read apart on this host;
* ``convert``: the rule; ``convert gated``: the gated op at any size (``compiled_min_outputs = 0``);
  ``convert unfused``: ``convert(fuse_mlp=False)``.

``--breakdown`` also profiles compiled stock and the rule's graph and sums their GPU time by kernel
class (GEMM, attention, the rest): the rest is all that a GEMM library at cuBLAS's speed could fuse
away, so stock's time over its GEMMs' and attention's bounds what converting can gain.

Run from the repository root on a GPU machine with ``transformers`` (about six minutes):

    python -m benchmarks.sweep_compiled_llama --out DIR [--breakdown]   # DIR/compiled_llama.json and .txt

Each size runs in a process of its own (Dynamo's and Inductor's state, and the GPU's memory, start
fresh).  Method: every variant's logits checked against stock's first (not timed where they differ by
more than 2e-2), then 15 interleaved rounds (order reversed every other round) of 5 back-to-back
prefills between two synchronizations; medians, p20 and p80.  ``host ms``: one prefill's enqueue time
with the GPU idle (what a host-bound graph costs).  Ratio = stock's time / the variant's (> 1: faster).
"""

from __future__ import annotations

import argparse
import collections
import copy
import json
import re
import statistics
import subprocess
import sys
import time

import torch

import tritongemm
from tritongemm.testing import relative_error

#: (name, hidden, intermediate, layers, heads, kv heads, batch, sequence): Llama-3.2-1B's and Llama-3-8B's
#: widths (layers cut), at 1024 and 4096 tokens.
CONFIGS = (
    ("1B-wide, 4 layers", 2048, 8192, 4, 16, 8, 4, 256),
    ("8B-wide, 2 layers", 4096, 14336, 2, 32, 8, 4, 256),
    ("1B-wide, 4 layers", 2048, 8192, 4, 16, 8, 4, 1024),
    ("8B-wide, 2 layers", 4096, 14336, 2, 32, 8, 4, 1024),
)
VARIANTS = ("stock", "stock copy", "convert", "convert gated", "convert unfused")
VOCAB = 32000
ROUNDS, REPS = 15, 5
MAX_REL_ERR = 2e-2

_ATTENTION = re.compile(r"flash|fmha|attention|sdpa", re.I)
_GEMM = re.compile(r"gemm|nvjet|xmma|cublas|cutlass", re.I)


def kernel_class(name: str) -> str:
    """A GPU kernel's class by its name: "attention", "gemm" (cuBLAS's, CUTLASS's, tritongemm's) or "other"."""
    if _ATTENTION.search(name):
        return "attention"
    if _GEMM.search(name):
        return "gemm"
    return "other"


def _model(cfg, device):
    from .models import _llama

    _, hidden, inter, layers, heads, kv, _, _ = cfg
    return _llama(hidden, inter, layers, heads, kv, VOCAB)().to(device, torch.bfloat16).eval()


def variants(stock) -> dict:
    gated = tritongemm.nn.convert(copy.deepcopy(stock))
    for module in gated.modules():
        if isinstance(module, tritongemm.nn.GatedMLP):
            module.compiled_min_outputs = 0
    return {
        "stock": stock,
        "stock copy": copy.deepcopy(stock),
        "convert": tritongemm.nn.convert(copy.deepcopy(stock)),
        "convert gated": gated,
        "convert unfused": tritongemm.nn.convert(copy.deepcopy(stock), fuse_mlp=False),
    }


def _prefill(model, ids):
    compiled = torch.compile(model)

    def run():
        with torch.no_grad():
            return compiled(input_ids=ids).logits

    return run


def _gpu_by_class(run, iters: int = 5) -> dict:
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            run()
        torch.cuda.synchronize()
    total: collections.Counter = collections.Counter()
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA and not event.name.startswith("## "):
            total[kernel_class(event.name)] += event.device_time / iters / 1e3
    return dict(total)


def measure(index: int, breakdown: bool) -> dict:
    """One size, in this process: the row of times, ratios, host times and (``breakdown``) GPU classes."""
    from tritongemm.launch import native

    native.node_in_use()  # (the C++ fast path built before anything is timed)
    cfg = CONFIGS[index]
    device = torch.device("cuda")
    torch.manual_seed(0)
    models = variants(_model(cfg, device))
    ids = torch.randint(0, VOCAB, (cfg[6], cfg[7]), device=device)
    row = {
        "model": cfg[0],
        "hidden": cfg[1],
        "intermediate": cfg[2],
        "layers": cfg[3],
        "tokens": cfg[6] * cfg[7],
    }
    row["h_elements"] = row["tokens"] * cfg[2]
    runs, ref = {}, None
    for name, model in models.items():
        t0 = time.perf_counter()
        run = _prefill(model, ids)
        out = run()
        torch.cuda.synchronize()
        row[f"{name} compile_s"] = time.perf_counter() - t0
        ref = out if ref is None else ref
        row[f"{name} rel_err"] = err = relative_error(out, ref)
        if err <= MAX_REL_ERR:
            runs[name] = run
    samples: dict[str, list[float]] = {name: [] for name in runs}
    for r in range(ROUNDS):
        for name in list(runs) if r % 2 == 0 else list(runs)[::-1]:
            runs[name]()
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(REPS):
                runs[name]()
            torch.cuda.synchronize()
            samples[name].append((time.perf_counter() - t0) * 1e3 / REPS)
    for name, s in samples.items():
        s = sorted(s)
        row[f"{name} ms"] = statistics.median(s)
        row[f"{name} p20"], row[f"{name} p80"] = s[len(s) // 5], s[4 * len(s) // 5]
        enqueue = []
        for _ in range(7):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            runs[name]()
            enqueue.append((time.perf_counter() - t0) * 1e3)
        torch.cuda.synchronize()
        row[f"{name} host ms"] = statistics.median(enqueue)
    if breakdown:
        for name in ("stock", "convert"):
            if name in runs:
                row[f"{name} gpu"] = _gpu_by_class(runs[name])
    return row


def ratio(row: dict, name: str) -> str:
    if f"{name} ms" not in row or "stock ms" not in row:
        return "gate"
    return format(row["stock ms"] / row[f"{name} ms"], ".3f")


def table(rows: list[dict]) -> str:
    lines = [
        f"{'model':<18} {'tokens':>6} {'h (M)':>6} {'stock ms':>9} "
        + " ".join(f"{v:>15}" for v in VARIANTS[1:])
        + "   host ms: stock / convert",
    ]
    for r in rows:
        lines.append(
            f"{r['model']:<18} {r['tokens']:>6} {r['h_elements'] / 1e6:>6.1f} {r.get('stock ms', float('nan')):>9.3f} "
            + " ".join(f"{ratio(r, v):>15}" for v in VARIANTS[1:])
            + f"   {r.get('stock host ms', float('nan')):.3f} / {r.get('convert host ms', float('nan')):.3f}"
        )
    lines.append(
        "(stock's time / the variant's, medians of interleaved rounds; 'stock copy' is the A/A control)"
    )
    split = [r for r in rows if "stock gpu" in r]
    if split:
        lines += [
            "",
            "GPU time a prefill by kernel class (ms):   gemm   attention   other   stock / (gemm + attention)",
        ]
        for r in split:
            for name in ("stock", "convert"):
                c = r.get(f"{name} gpu", {})
                bound = ""
                if name == "stock" and c.get("gemm", 0) + c.get("attention", 0) > 0:
                    bound = format(sum(c.values()) / (c.get("gemm", 0) + c.get("attention", 0)), ".3f")
                lines.append(
                    f"  {r['model']:<18} {r['tokens']:>5} {name:<8} {c.get('gemm', 0):>7.3f} "
                    f"{c.get('attention', 0):>10.3f} {c.get('other', 0):>7.3f}   {bound}"
                )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.sweep_compiled_llama", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--out", default=".", help="folder for compiled_llama.json and .txt")
    parser.add_argument(
        "--breakdown", action="store_true", help="also sum stock's and convert's GPU time by class"
    )
    parser.add_argument("--one", type=int, help=argparse.SUPPRESS)  # (a child process: one size, JSON out)
    args = parser.parse_args(argv)
    if args.one is not None:
        print("ROW " + json.dumps(measure(args.one, args.breakdown)))
        return 0
    from .sweep_fp8_split_rows import save_records, start_on_gpu

    started = start_on_gpu(args.out, "the compiled Llama sweep needs a CUDA GPU")
    if started is None:
        return 2
    _, _, out, env = started
    rows: list[dict] = []
    for i, cfg in enumerate(CONFIGS):
        print(f"[{i + 1}/{len(CONFIGS)}] {cfg[0]}, {cfg[6] * cfg[7]} tokens", file=sys.stderr, flush=True)
        cmd = [sys.executable, "-m", "benchmarks.sweep_compiled_llama", "--one", str(i)]
        done = subprocess.run(
            cmd + (["--breakdown"] if args.breakdown else []), capture_output=True, text=True
        )
        found = [line[4:] for line in done.stdout.splitlines() if line.startswith("ROW ")]
        if done.returncode != 0 or not found:
            print(done.stderr[-2000:], file=sys.stderr)
            continue
        rows.append(json.loads(found[-1]))
        save_records(out, "compiled_llama", {"env": env, "records": rows}, table(rows))
    print(table(rows))
    return 0 if len(rows) == len(CONFIGS) else 1


if __name__ == "__main__":
    sys.exit(main())
