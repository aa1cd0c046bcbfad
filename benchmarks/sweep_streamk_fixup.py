"""Long K over few tiles: what the warp-specialized Stream-K kernel's fix-up costs, and what its K loop
reaches without it.

The kernel splits each tile's K among consecutive programs; each writes its partial sum to a workspace
and the program with the tile's last K-steps adds the others' in program order, one after another
(``gluon_common.streamk_collect``).  With few tiles and a long K a tile has tens of contributors and
that one program reads all of their partials.  Per problem this times cuBLAS (``torch.matmul``),
tritongemm's rule and the kernel's Stream-K on four tiles.  ``--skip-fixup`` then replaces the
finisher's adds by nothing -- its results are wrong, so they are not checked, only timed -- which
bounds what a fix-up spread over every program could reach: the K loop's own time.

Run from the repository root on the GPU machine (about a minute each):

    python -m benchmarks.sweep_streamk_fixup --out DIR                 # DIR/streamk_fixup.json and .txt
    python -m benchmarks.sweep_streamk_fixup --skip-fixup --out DIR    # DIR/streamk_fixup_skipped.*

Method: bf16 operands (A row-major, B row-major), random, rotated over copies past the L2; each output
compared with a float64 product first (``TOL``; not timed if wrong) unless the fix-up is skipped;
``ROUNDS`` interleaved rounds of ``do_bench_cudagraph`` medians (``sweep_fp8_split_rows.timed_rounds``).
Ratio: cuBLAS's time / ours (> 1: ours faster).  ``pct_copy``: A, B and C's bytes over the time,
against a device-to-device copy of 256 MiB (read + write) timed in the same run.
"""

from __future__ import annotations

import argparse
import sys

import torch
import triton

import tritongemm
from tritongemm import TileConfig

from .sweep_fp8_split_rows import ratio_cell, save_records, start_on_gpu, timed_rounds

DTYPE = torch.bfloat16
TOL = 2e-2
SHAPES = ((256, 256, 131072), (256, 256, 65536), (512, 512, 65536), (256, 1024, 65536), (1024, 1024, 32768))
_WS = dict(kernel="gluon_ws", stream_k=True, group_m=8, block_k=64)
CONFIGS = {
    "sk128x128w4": TileConfig(block_m=128, block_n=128, num_warps=4, num_stages=6, **_WS),
    "sk128x128w8": TileConfig(block_m=128, block_n=128, num_warps=8, num_stages=6, **_WS),
    "sk64x128w4": TileConfig(block_m=64, block_n=128, num_warps=4, num_stages=6, **_WS),
    "sk128x256w8": TileConfig(block_m=128, block_n=256, num_warps=8, num_stages=3, **_WS),
}
ROUNDS = 3


def skip_fixup() -> None:
    """Make the Stream-K finisher add nothing (results wrong): before the kernel first compiles."""
    from triton.experimental import gluon

    from tritongemm.kernels import gemm_gluon

    @gluon.jit
    def no_collect(acc, fixup, tile, tile_start, pid, iters_per_program):
        return acc

    gemm_gluon.streamk_collect = no_collect


def copy_gbps(device) -> float:
    """A device-to-device copy's rate, read + write, GB/s."""
    src = torch.empty(256 * 2**20, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    ms = triton.testing.do_bench(lambda: dst.copy_(src), warmup=25, rep=100, return_mode="median")
    return 2 * src.numel() / ms / 1e6


def calls(configs: dict) -> dict:
    """Each implementation as ``fn(a, b)``."""
    impls = {"cublas": torch.matmul, "rule": tritongemm.matmul}
    for name, cfg in configs.items():
        impls[name] = lambda a, b, cfg=cfg: tritongemm.matmul(a, b, config=cfg)
    return impls


def measure(m, n, k, device, gen, configs: dict, check: bool, copy_rate: float, budget_bytes=300e6) -> dict:
    """One problem's row: each call checked (``check``) and timed, its ratio to cuBLAS and its share of
    the copy rate."""
    copies = max(2, int(budget_bytes // ((m + n) * k * 2)) + 1)
    sets = [
        (
            torch.randn(m, k, device=device, dtype=DTYPE, generator=gen),
            torch.randn(k, n, device=device, dtype=DTYPE, generator=gen),
        )
        for _ in range(copies)
    ]
    ref = sets[0][0].double() @ sets[0][1].double()
    plan = tritongemm.explain(*sets[0])
    impls = calls(configs)
    row = {"m": m, "n": n, "k": k, "checked": check, "rule_plan": f"{plan.kernel} {plan.config.short()}"}
    row["impls"] = [name for name in impls if name != "cublas"]
    live = {}
    for name, fn in impls.items():
        try:
            out = fn(*sets[0])
        except Exception as e:  # (recorded: the row says why it was not timed)
            row[f"{name}_status"] = f"error: {type(e).__name__}"
            continue
        err = ((out.double() - ref).norm() / ref.norm()).item()
        row[f"{name}_rel_err"] = err
        if check and not err < TOL:
            row[f"{name}_status"] = "wrong"
            continue
        state = {"i": 0}

        def rotated(fn=fn, state=state):
            a, b = sets[state["i"] % copies]
            state["i"] += 1
            return fn(a, b)

        live["torch" if name == "cublas" else name] = rotated  # (``timed_rounds`` rates all by "torch")
    timed_rounds(live, row)
    bytes_moved = (m * k + k * n + m * n) * DTYPE.itemsize
    for name in live:
        if f"{name}_ms" in row:
            row[f"{name}_pct_copy"] = 100 * bytes_moved / (row[f"{name}_ms"] * 1e-3) / (copy_rate * 1e9)
    return row


def table(rows: list[dict], skipped: bool) -> str:
    names = rows[0]["impls"] if rows else ()
    head = "fix-up SKIPPED (results wrong; timing only)" if skipped else "fix-up as shipped"
    lines = [head, f"{'shape':<18} {'cuBLAS us':>9} " + " ".join(f"{n:>12}" for n in names) + "  rule's plan"]
    for r in rows:
        cublas = format(r["torch_ms"] * 1e3, ".1f") if "torch_ms" in r else "-"
        cells = " ".join(f"{ratio_cell(r, n, 12):>12}" for n in names)
        lines.append(f"{r['m']}x{r['n']}x{r['k']:<9} {cublas:>9} {cells}  {r['rule_plan']}")
    lines.append("ratio: cuBLAS's time / ours (> 1: ours faster)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.sweep_streamk_fixup")
    parser.add_argument("--out", default=".")
    parser.add_argument(
        "--skip-fixup", action="store_true", help="time the K loop without the finisher's adds"
    )
    parser.add_argument("--shapes", default=None, help="MxNxK,... (default: SHAPES)")
    args = parser.parse_args(argv)
    started = start_on_gpu(args.out, "sweep_streamk_fixup times CUDA kernels: run it on a GPU")
    if started is None:
        return 2
    device, gen, out, env = started
    if args.skip_fixup:
        skip_fixup()
    shapes = (
        SHAPES if args.shapes is None else [tuple(map(int, s.split("x"))) for s in args.shapes.split(",")]
    )
    rate = copy_gbps(device)
    stem = "streamk_fixup_skipped" if args.skip_fixup else "streamk_fixup"
    rows = []
    for m, n, k in shapes:
        rows.append(measure(m, n, k, device, gen, CONFIGS, not args.skip_fixup, rate))
        print(f"{m}x{n}x{k} done", file=sys.stderr, flush=True)
        save_records(out, stem, {"env": env, "copy_gbps": rate, "rows": rows}, table(rows, args.skip_fixup))
    print(table(rows, args.skip_fixup))
    return 0


if __name__ == "__main__":
    sys.exit(main())
