"""Block-scaled fp8 (a scale per 128 of K): ``scaled_mm`` against ``torch._scaled_mm``, every recipe.

The three recipes ``torch._scaled_mm`` takes (``tritongemm.planning.call.BLOCK_SCALINGS``): 1x128
activations with 128x128 weights (the forward GEMM of DeepSeek-V3's recipe), 1x128 with 1x128, and
128x128 with 1x128; rowwise scales beside them for reference.  Per problem and recipe it times the
heuristic's plan, torch, and the alternative the rule was chosen over: from 512 rows the same 128x128
tile on one cooperative 8-warp consumer (the rule: two 4-warp consumers on the tile's halves), up to
64 rows the same narrow tile with K unsplit (the rule splits K in two).

Run from the repository root on the GPU machine (about a minute):

    python -m benchmarks.sweep_fp8_blockwise --out DIR      # DIR/fp8_blockwise.json and .txt
    python -m benchmarks.sweep_fp8_blockwise --shapes 16x4096x4096,4096x4096x4096 --out DIR
    TRITON_INTERPRET=1 python -m benchmarks.sweep_fp8_blockwise --smoke --out DIR   # CPU: code paths

Method: e4m3 operands (``b = w.t()`` of a row-major weight), bf16 out, scales random in [0.5, 1.5)
per block in torch's layouts (a per-row scale M-contiguous; a 128x128 weight scale the transpose of
a row-major (N/128, K/128)).  Every output is first compared with float64 of the dequantized operands
(relative Frobenius error under ``TOL``, else "wrong", not timed); then ``do_bench`` medians with the
inputs rotated over copies totalling more than twice the L2, in ``ROUNDS`` rounds interleaving the
implementations (order reversed every other round).  ``ratio`` is torch's time / ours.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch
import triton

import tritongemm
from tritongemm import TileConfig
from tritongemm.frontend.scaled import dequantize
from tritongemm.planning.call import BLOCK_SCALINGS, SCALE_BLOCK_K
from tritongemm.testing import relative_error

from . import harness
from .gpu_check import rotating

SHAPES = (
    (16, 4096, 4096), (64, 4096, 4096), (16, 14336, 4096), (64, 7168, 2048), (128, 4096, 4096),
    (256, 5120, 5120), (512, 4096, 4096), (1000, 4096, 4000), (1024, 14336, 4096), (2048, 7168, 2048),
    (4096, 4096, 4096), (8192, 8192, 4096),
)  # fmt: skip
RECIPES = (*BLOCK_SCALINGS, "rowwise")
ROUNDS = 3
TOL = 3e-2
FP8, OUT = torch.float8_e4m3fn, torch.bfloat16


def scales(recipe: str, m: int, n: int, k: int, device, gen) -> tuple[torch.Tensor, torch.Tensor]:
    """Random scales for ``recipe`` in the layouts torch's callers use."""

    def rand(*shape):
        return 0.5 + torch.rand(shape, device=device, generator=gen)

    if recipe == "rowwise":
        return rand(m, 1), rand(1, n)
    rows, cols = BLOCK_SCALINGS[recipe]
    kb = -(-k // SCALE_BLOCK_K)
    sa = rand(kb, m).t() if rows == 1 else rand(-(-m // rows), kb)
    sb = rand(kb, n) if cols == 1 else rand(-(-n // cols), kb).t()
    return sa, sb


def reference(recipe: str, a, b, sa, sb) -> torch.Tensor:
    if recipe == "rowwise":
        return (a.double() @ b.double()) * sa.double() * sb.double()
    rows, cols = BLOCK_SCALINGS[recipe]
    return dequantize(a.double(), sa.double(), rows, SCALE_BLOCK_K) @ dequantize(
        b.double(), sb.double(), SCALE_BLOCK_K, cols
    )


def alternative(m: int, recipe: str) -> TileConfig | None:
    """The config the rule was chosen over, for this many rows (None: none compared)."""
    if recipe == "rowwise":
        return None
    if m >= 512:
        return TileConfig(128, 128, 128, 8, 8, 6, kernel="gluon_ws")
    if m <= 64:
        return TileConfig(16 if m <= 16 else 64, 32, 128, 8, 4, 4)
    return None


def plan_of(recipe: str, a, b) -> str:
    from tritongemm import launch
    from tritongemm.planning.call import Epilogue, GemmCall, make_request

    call = GemmCall(Epilogue(scaling=recipe), make_request(None), OUT, "ieee")
    out = torch.empty((a.shape[0], b.shape[1]), dtype=OUT, device=a.device)
    chosen = launch.plan_for(call, a, b, out)
    return f"{chosen.kernel} {chosen.config.short()}"


def checked(impls: dict, sets: list, ref: torch.Tensor, row: dict, tol: float = TOL) -> dict:
    """Each implementation's output on the first input set against ``ref`` (its ``_rel_err`` and
    ``_status`` into ``row``); those within ``tol``, each a call rotating over ``sets``, to be timed.
    An implementation that raises (torch may not take a recipe) is recorded, not timed.  An output
    that is a tuple (a value and its gradients) is compared as one vector, with ``ref`` flattened so."""
    live = {}
    for name, fn in impls.items():
        try:
            out = fn(*sets[0])
            if isinstance(out, tuple):
                out = torch.cat([t.double().flatten() for t in out])
            err = relative_error(out.double(), ref)
        except Exception as exc:
            row[f"{name}_status"] = f"error: {type(exc).__name__}: {str(exc)[:200]}"
            continue
        row[f"{name}_rel_err"] = err
        row[f"{name}_status"] = "ok" if err < tol else "wrong"
        if err < tol:
            live[name] = rotating(fn, sets)
    return live


def measure(m: int, n: int, k: int, recipe: str, device, gen, smoke: bool) -> dict:
    l2 = 1 if smoke else harness.l2_cache_bytes(device)
    copies = 1 if smoke else harness.copies_to_exceed_l2(m * k + n * k + 4 * (m + n) * (k // 128 + 1), l2)
    sets = []
    for _ in range(copies):
        a = torch.randn(m, k, device=device, generator=gen).to(FP8)
        w = torch.randn(n, k, device=device, generator=gen).to(FP8)
        sets.append((a, w.t(), *scales(recipe, m, n, k, device, gen)))
    ref = reference(recipe, *sets[0])
    alt = alternative(m, recipe)
    impls = {
        "ours": lambda a, b, sa, sb: tritongemm.scaled_mm(a, b, sa, sb, out_dtype=OUT),
        "torch": lambda a, b, sa, sb: torch._scaled_mm(a, b, sa, sb, out_dtype=OUT),
    }
    if alt is not None:
        impls["alt"] = lambda a, b, sa, sb: tritongemm.scaled_mm(a, b, sa, sb, out_dtype=OUT, config=alt)
    row = {"m": m, "n": n, "k": k, "recipe": recipe, "plan": plan_of(recipe, *sets[0][:2])}
    if alt is not None:
        row["alt_config"] = alt.short()
    live = checked(impls, sets, ref, row)
    if smoke:
        return row
    times: dict[str, list[float]] = {name: [] for name in live}
    for r in range(ROUNDS):
        for name in list(live) if r % 2 == 0 else list(live)[::-1]:
            times[name].append(triton.testing.do_bench(live[name], warmup=25, rep=100, return_mode="median"))
    for name, samples in times.items():
        row[f"{name}_ms"] = statistics.median(samples)
    if "torch_ms" in row:
        for name in ("ours", "alt"):
            if f"{name}_ms" in row:
                row[f"{name}_ratio"] = row["torch_ms"] / row[f"{name}_ms"]
    return row


def _cell(row: dict, key: str, spec: str) -> str:
    return format(row[key], spec) if key in row else "-"


def table(rows: list[dict]) -> str:
    cols = ("shape", "recipe", "ours_err", "ours_ms", "torch_ms", "ratio", "alt")
    lines = [f"{cols[0]:<18} {cols[1]:<26} " + " ".join(f"{c:>9}" for c in cols[2:]) + "  plan (alt)"]
    for r in rows:
        cells = [
            _cell(r, "ours_rel_err", ".1e"), _cell(r, "ours_ms", ".4f"), _cell(r, "torch_ms", ".4f"),
            _cell(r, "ours_ratio", ".3f"), _cell(r, "alt_ratio", ".3f"),
        ]  # fmt: skip
        alt = f" ({r['alt_config']})" if "alt_config" in r else ""
        shape = f"{r['m']}x{r['n']}x{r['k']}"
        lines.append(
            f"{shape:<18} {r['recipe']:<26} " + " ".join(f"{c:>9}" for c in cells) + f"  {r['plan']}{alt}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.sweep_fp8_blockwise", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--out", default=".", help="folder for fp8_blockwise.json and .txt")
    parser.add_argument("--shapes", default=None, help="comma-separated MxNxK (default: the sweep's)")
    parser.add_argument("--smoke", action="store_true", help="one tiny problem, checked, not timed")
    args = parser.parse_args(argv)
    device = torch.device(
        "cuda" if torch.cuda.is_available() and not tritongemm.interpreter_enabled() else "cpu"
    )
    if args.smoke:
        shapes = [(33, 160, 300)]
    elif args.shapes:
        shapes = [tuple(int(x) for x in s.split("x")) for s in args.shapes.split(",")]
    else:
        shapes = list(SHAPES)
    gen = torch.Generator(device=device)
    gen.manual_seed(0)
    rows = []
    jobs = [(shape, recipe) for shape in shapes for recipe in RECIPES]
    for i, ((m, n, k), recipe) in enumerate(jobs, 1):
        print(f"[{i}/{len(jobs)}] {m}x{n}x{k} {recipe}", file=sys.stderr, flush=True)
        rows.append(measure(m, n, k, recipe, device, gen, args.smoke))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    env = harness.environment(device)
    (out / "fp8_blockwise.json").write_text(json.dumps({"env": env, "records": rows}, indent=1, default=str))
    text = table(rows)
    (out / "fp8_blockwise.txt").write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
