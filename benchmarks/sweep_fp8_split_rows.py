"""fp8 on two consumers that split each tile's rows, against the fp8 rule's tiles and ``torch._scaled_mm``.

The warp-specialized kernel runs two 4-warp consumers on fp8 as halves of every tile (each takes half
the rows, releases the ring's slots itself and stores its half: the kernel's SPLIT_ROWS), so that one
waits for its wgmma and adds while the other's run, and neither waits for the other's warps at a
slot release.  Per problem and recipe it times torch, the heuristic's plan, the tiles on one
cooperative 8-warp consumer (128x256 staged in halves, 128x128) and the split tiles that fit the
registers: 128x128 (its halves hold their partial sums too), and with fast accumulation 128x256 at
3 stages (64 x 256 a consumer, no partial sums).  Block scales run every tile as their rule makes it
fit (``block_scaled_config``): their rule's split 128x128 at 6 stages against 5.  Recipes:
tensorwise and rowwise scales with precise sums and with fast accumulation, and 1x128 x 128x128
block scales.

Run from the repository root on the GPU machine (about five minutes):

    python -m benchmarks.sweep_fp8_split_rows --out DIR      # DIR/fp8_split_rows.json and .txt
    python -m benchmarks.sweep_fp8_split_rows --shapes 4096x4096x4096 --out DIR

Method as ``sweep_fp8_blockwise``: e4m3 operands (``b = w.t()``), bf16 out, random scales in [0.5, 1.5)
in torch's layouts, every output compared with float64 of the dequantized operands first (not timed
if wrong), inputs rotated past the L2, ``ROUNDS`` interleaved rounds (order reversed every other
round).  Each time is ``do_bench_cudagraph``'s median, the calls replayed from a CUDA graph: a forced
config takes ``scaled_mm``'s whole request path on every eager call where the heuristic's repeats
take its fast path, and a 20-microsecond kernel timed eagerly then reads the host, not the tiles
(``do_bench`` where a graph cannot be captured: ``timer`` in the record says which).  Ratio = torch's
time / ours (> 1: ours faster).
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

from . import harness
from .sweep_fp8_blockwise import FP8, OUT, checked, reference, scales

SHAPES = (
    (256, 4096, 4096), (512, 4096, 4096), (1024, 4096, 4096), (2048, 4096, 4096), (4096, 4096, 4096),
    (8192, 4096, 4096), (256, 14336, 4096), (1024, 14336, 4096), (4096, 14336, 4096),
    (8192, 14336, 4096), (256, 5120, 5120), (1024, 18944, 3584), (8192, 8192, 4096),
)  # fmt: skip
BLOCKWISE = "blockwise_1x128_128x128"
#: (recipe, use_fast_accum)
RECIPES = (
    ("tensorwise", False),
    ("rowwise", False),
    ("tensorwise", True),
    ("rowwise", True),
    (BLOCKWISE, False),
)
ROUNDS = 3


def split(bm: int, bn: int, stages: int) -> TileConfig:
    return TileConfig(bm, bn, 128, 8, 4, stages, kernel="gluon_ws", pingpong=True)


def cooperative(bm: int, bn: int, stages: int, subtile: bool = False) -> TileConfig:
    return TileConfig(bm, bn, 128, 8, 8, stages, kernel="gluon_ws", epilogue_subtile=subtile)


#: The split tiles that fit a consumer's registers whatever the accumulation.
SPLIT_TILES = {"split128x128s6": split(128, 128, 6)}
#: The tiles timed beside the rule's plan, by recipe kind.
TILES = {
    "precise": {
        "coop128x256": cooperative(128, 256, 4, subtile=True),
        "coop128x128": cooperative(128, 128, 6),
        **SPLIT_TILES,
    },
    "fast": {
        "coop128x256": cooperative(128, 256, 4, subtile=True),
        "coop128x128": cooperative(128, 128, 6),
        **SPLIT_TILES,
        "split128x256s3": split(128, 256, 3),
    },
    "block": {**SPLIT_TILES, "split128x128s5": split(128, 128, 5)},
}


def recipe_name(recipe: str, fast: bool) -> str:
    return recipe + ("+fast" if fast else "")


def tiles_for(recipe: str, fast: bool) -> dict[str, TileConfig]:
    return TILES["block" if recipe == BLOCKWISE else "fast" if fast else "precise"]


def planned(recipe: str, fast: bool, a, b, config=None) -> str:
    """The kernel and tile a call with ``config`` (None: the heuristic's) runs."""
    from tritongemm import launch
    from tritongemm.planning.call import Epilogue, GemmCall, make_request

    call = GemmCall(Epilogue(scaling=recipe), make_request(config), OUT, "fast" if fast else "ieee")
    out = torch.empty((a.shape[0], b.shape[1]), dtype=OUT, device=a.device)
    chosen = launch.plan_for(call, a, b, out)
    return f"{chosen.kernel} {chosen.config.short()}"


def measure(m: int, n: int, k: int, recipe: str, fast: bool, device, gen) -> dict:
    l2 = harness.l2_cache_bytes(device)
    copies = harness.copies_to_exceed_l2(m * k + n * k + 4 * (m + n) * (k // 128 + 1), l2)
    sets = []
    for _ in range(copies):
        a = torch.randn(m, k, device=device, generator=gen).to(FP8)
        w = torch.randn(n, k, device=device, generator=gen).to(FP8)
        if recipe == "tensorwise":
            sa, sb = (0.5 + torch.rand((), device=device, generator=gen) for _ in range(2))
        else:
            sa, sb = scales(recipe, m, n, k, device, gen)
        sets.append((a, w.t(), sa, sb))
    ref = reference("rowwise" if recipe == "tensorwise" else recipe, *sets[0])  # (broadcasts a scalar)

    def ours(config=None):
        return lambda a, b, sa, sb: tritongemm.scaled_mm(
            a, b, sa, sb, out_dtype=OUT, use_fast_accum=fast, config=config
        )

    impls = {
        "torch": lambda a, b, sa, sb: torch._scaled_mm(a, b, sa, sb, out_dtype=OUT, use_fast_accum=fast),
        "rule": ours(),
    }
    tiles = tiles_for(recipe, fast)
    impls.update({name: ours(cfg) for name, cfg in tiles.items()})
    row = {
        "m": m,
        "n": n,
        "k": k,
        "recipe": recipe,
        "fast_accum": fast,
        "rule": planned(recipe, fast, *sets[0][:2]),
    }
    for name, cfg in tiles.items():
        row[f"{name}_plan"] = planned(recipe, fast, *sets[0][:2], cfg)
    timed_rounds(checked(impls, sets, ref, row), row)
    if "torch_ms" in row:
        row["torch_tflops"] = 2 * m * n * k / row["torch_ms"] / 1e9
    return row


def timed_rounds(live: dict, row: dict, rounds: int = ROUNDS) -> None:
    """Time each of ``live``'s calls (``time_ms``) in ``rounds`` interleaved rounds, the order reversed
    every other round; into ``row`` each one's median (``_ms``), its timer and its ratio to torch's."""
    times: dict[str, list[float]] = {name: [] for name in live}
    for r in range(rounds):
        for name in list(live) if r % 2 == 0 else list(live)[::-1]:
            ms, row[f"{name}_timer"] = time_ms(live[name])
            times[name].append(ms)
    for name, samples in times.items():
        row[f"{name}_ms"] = statistics.median(samples)
    if "torch_ms" in row:
        for name in live:
            if name != "torch":
                row[f"{name}_ratio"] = row["torch_ms"] / row[f"{name}_ms"]


def ratio_cell(row: dict, name: str, width: int) -> str:
    """``name``'s cell in a sweep's table: its ratio to torch (``timed_rounds``), else its status, cut to ``width``."""
    if f"{name}_ratio" in row:
        return format(row[f"{name}_ratio"], ".3f")
    return row.get(f"{name}_status", "-")[:width]


def save_records(out: Path, stem: str, records: dict, text: str) -> None:
    """``out/<stem>.json`` (``records``) and ``out/<stem>.txt`` (``text``, the table); written after each
    case, so a run cut short keeps what it measured."""
    (out / f"{stem}.json").write_text(json.dumps(records, indent=1, default=str))
    (out / f"{stem}.txt").write_text(text + "\n")


def start_on_gpu(out_dir: str, needs: str):
    """A GPU sweep's start: without CUDA, None after saying what it ``needs``; else the device, a generator
    seeded 0, the output folder (made) and the environment record."""
    if not torch.cuda.is_available():
        print(needs, file=sys.stderr)
        return None
    device = torch.device("cuda")
    gen = torch.Generator(device=device)
    gen.manual_seed(0)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    return device, gen, out, harness.environment(device)


def time_ms(fn) -> tuple[float, str]:
    """The median time of ``fn`` replayed from a CUDA graph (``do_bench`` where capture fails)."""
    try:
        return triton.testing.do_bench_cudagraph(fn, rep=100, return_mode="median"), "cudagraph"
    except Exception:  # (recorded in the row: timed eagerly instead)
        torch.cuda.synchronize()
        return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median"), "eager"


def table(rows: list[dict]) -> str:
    names = ("rule", "coop128x256", "coop128x128", "split128x128s6", "split128x256s3", "split128x128s5")
    lines = [
        f"{'shape':<18} {'recipe':<24} {'torch TF':>8} "
        + " ".join(f"{n:>15}" for n in names)
        + "  rule's plan"
    ]
    for r in rows:
        recipe = recipe_name(r["recipe"], r["fast_accum"])
        cells = [
            ratio_cell(r, n, 15) + ("*" if f"{n}_ratio" in r and r.get(f"{n}_timer") == "eager" else "")
            for n in names
        ]
        torch_tf = format(r["torch_tflops"], ".0f") if "torch_tflops" in r else "-"
        shape = f"{r['m']}x{r['n']}x{r['k']}"
        lines.append(
            f"{shape:<18} {recipe:<24} {torch_tf:>8} "
            + " ".join(f"{c:>15}" for c in cells)
            + f"  {r['rule']}"
        )
    return "\n".join(lines + ["(* timed eagerly: no CUDA graph could be captured)"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.sweep_fp8_split_rows", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--out", default=".", help="folder for fp8_split_rows.json and .txt")
    parser.add_argument("--shapes", default=None, help="comma-separated MxNxK (default: the sweep's)")
    parser.add_argument(
        "--recipes",
        default=None,
        help="comma-separated recipes, '+fast' for fast accumulation (default: all): "
        + ",".join(recipe_name(r, f) for r, f in RECIPES),
    )
    args = parser.parse_args(argv)
    started = start_on_gpu(
        args.out, "the split-rows sweep times the warp-specialized kernel: it needs an sm_90 GPU"
    )
    if started is None:
        return 2
    device, gen, out, env = started
    shapes = [tuple(int(x) for x in s.split("x")) for s in args.shapes.split(",")] if args.shapes else SHAPES
    rows = []
    recipes = RECIPES
    if args.recipes:
        wanted = args.recipes.split(",")
        unknown = sorted(set(wanted) - {recipe_name(r, f) for r, f in RECIPES})
        if unknown:
            parser.error(f"unknown recipes {unknown}")
        recipes = tuple(rf for rf in RECIPES if recipe_name(*rf) in wanted)
    jobs = [(shape, recipe) for shape in shapes for recipe in recipes]
    for i, ((m, n, k), (recipe, fast)) in enumerate(jobs, 1):
        print(f"[{i}/{len(jobs)}] {m}x{n}x{k} {recipe_name(recipe, fast)}", file=sys.stderr, flush=True)
        rows.append(measure(m, n, k, recipe, fast, device, gen))
        save_records(out, "fp8_split_rows", {"env": env, "records": rows}, table(rows))
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
