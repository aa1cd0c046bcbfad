"""Fused activations on the warp-specialized kernel's 128 x 128 tiles: one consumer against ping-pong.

A transcendental activation (GELU, tanh-GELU, SiLU) in a linear layer's epilogue costs the warps
that run it a few microseconds a tile.  The heuristic's one-consumer 128 x 128 tile hands whole tiles
to epilogue warps, but with Stream-K it finishes the streamed tiles itself; two ping-pong consumers
run each one's epilogue under the other's mainloop (``planning/heuristics/epilogue.py``).  Per shape
and epilogue (an activation, none, or a residual add: the epilogue that reads a tensor) this times
torch's ``F.linear`` then its activation or add, ``tritongemm.linear`` with the heuristic's plan, and
the tiles forced: one consumer with and without Stream-K, ping-pong, and the cooperative 128 x 256
tile staged in halves.

Run from the repository root on the GPU machine (about ten minutes):

    python -m benchmarks.sweep_epilogue_tiles --out DIR      # DIR/epilogue_tiles.json and .txt

Method: bf16, bias + activation, random inputs rotated past the L2, every output compared with float64
first (``sweep_fp8_blockwise.checked``: not timed if wrong), three interleaved rounds (order reversed
every other round), each time ``do_bench_cudagraph``'s median (``sweep_fp8_split_rows.timed_rounds``;
a forced config takes the whole request path on every eager call).  Ratio = torch's time / ours (> 1: ours faster).
"""

from __future__ import annotations

import argparse
import sys

import torch
import torch.nn.functional as F

import tritongemm
from tritongemm import TileConfig

from . import harness
from .sweep_fp8_blockwise import checked
from .sweep_fp8_split_rows import ratio_cell, save_records, start_on_gpu, timed_rounds

SHAPES = (
    (512, 14336, 4096),
    (1000, 14336, 4096),
    (512, 4096, 14336),
    (1000, 18944, 3584),
    (2048, 14336, 4096),
)
#: The epilogues: bias + an activation, or (``residual``) bias + a residual add, no activation.
ACTIVATIONS = ("none", "gelu", "gelu_tanh", "silu", "residual")
DTYPE = torch.bfloat16
TILES = {
    "one128x128": TileConfig(128, 128, 64, 8, 4, 6, kernel="gluon_ws"),
    "one128x128sk": TileConfig(128, 128, 64, 8, 4, 6, kernel="gluon_ws", stream_k=True),
    "pingpong128x128": TileConfig(128, 128, 64, 8, 4, 5, kernel="gluon_ws", pingpong=True),
    "coop128x256": TileConfig(128, 256, 64, 8, 8, 4, kernel="gluon_ws", epilogue_subtile=True),
}
TORCH_ACTIVATIONS = {
    "none": lambda y: y,
    "residual": lambda y: y,
    "gelu": F.gelu,
    "gelu_tanh": lambda y: F.gelu(y, approximate="tanh"),
    "silu": F.silu,
}


def linear_inputs(m: int, n: int, k: int, device, gen, residual: bool = False) -> list[tuple]:
    """(x, w, b, r) sets of a linear layer in DTYPE (r the residual, or None), random, in as many copies
    as rotate past the L2."""
    size = m * k + n * k + n + m * n * residual
    copies = harness.copies_to_exceed_l2(2 * size, harness.l2_cache_bytes(device))
    sets = []
    for _ in range(copies):
        x = torch.randn(m, k, device=device, generator=gen).to(DTYPE)
        w = (torch.randn(n, k, device=device, generator=gen) / k**0.5).to(DTYPE)
        b = torch.randn(n, device=device, generator=gen).to(DTYPE)
        r = torch.randn(m, n, device=device, generator=gen).to(DTYPE) if residual else None
        sets.append((x, w, b, r))
    return sets


def measure(m: int, n: int, k: int, activation: str, device, gen) -> dict:
    residual = activation == "residual"
    sets = linear_inputs(m, n, k, device, gen, residual)
    act = TORCH_ACTIVATIONS[activation]
    x, w, b, r = (None if t is None else t.double() for t in sets[0])
    ref = act(F.linear(x, w, b)) + (r if residual else 0)
    fused = None if activation in ("none", "residual") else activation

    def ours(config=None):
        return lambda x, w, b, r: tritongemm.linear(x, w, b, activation=fused, residual=r, config=config)

    def stock(x, w, b, r):
        y = act(F.linear(x, w, b))
        return y if r is None else y + r

    impls = {"torch": stock, "rule": ours()}
    impls.update({name: ours(cfg) for name, cfg in TILES.items()})
    row = {"m": m, "n": n, "k": k, "activation": activation}
    x, w, b, r = sets[0]
    chosen = tritongemm.explain(x, w.t(), bias=b, residual=r, activation=fused)
    row["rule_plan"] = f"{chosen.kernel} {chosen.config.short()}"
    timed_rounds(checked(impls, sets, ref, row), row)
    return row


def table(rows: list[dict]) -> str:
    names = ("rule", *TILES)
    lines = [
        f"{'shape':<18} {'activation':<10} {'torch us':>8} " + " ".join(f"{n:>15}" for n in names) + "  rule"
    ]
    for r in rows:
        cells = [ratio_cell(r, n, 15) for n in names]
        torch_us = format(r["torch_ms"] * 1e3, ".1f") if "torch_ms" in r else "-"
        shape = f"{r['m']}x{r['n']}x{r['k']}"
        lines.append(
            f"{shape:<18} {r['activation']:<10} {torch_us:>8} "
            + " ".join(f"{c:>15}" for c in cells)
            + f"  {r['rule_plan']}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.sweep_epilogue_tiles", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--out", default=".", help="folder for epilogue_tiles.json and .txt")
    args = parser.parse_args(argv)
    started = start_on_gpu(
        args.out, "the epilogue tile sweep times the warp-specialized kernel: it needs an sm_90 GPU"
    )
    if started is None:
        return 2
    device, gen, out, env = started
    rows = []
    jobs = [(shape, act) for shape in SHAPES for act in ACTIVATIONS]
    for i, ((m, n, k), act) in enumerate(jobs, 1):
        print(f"[{i}/{len(jobs)}] {m}x{n}x{k} {act}", file=sys.stderr, flush=True)
        rows.append(measure(m, n, k, act, device, gen))
        save_records(out, "epilogue_tiles", {"env": env, "records": rows}, table(rows))
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
