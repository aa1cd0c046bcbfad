"""The derivative epilogue against the GEMM then torch's activation backward, at MLP widths.

In a two-layer MLP's backward, fc2's input gradient ``dh = dy @ W2`` is followed by
``dz = dh * act'(z)``.  Per shape this times, for dy (M, hidden) and W2 (hidden, H) row-major:

* ``torch``: ``dy @ W2`` (cuBLAS), then torch's activation backward (``semantics.activation_backward``);
* ``unfused``: tritongemm's GEMM, then the same backward pass;
* ``rule``: the derivative epilogue (``Epilogue(activation="<act>_grad", residual=True)``) with the
  heuristic's plan;
* ``pingpong``: the same with two ping-pong consumers forced (each finishing its own tiles).

Run from the repository root on the GPU machine (well under a minute):

    python -m benchmarks.sweep_derivative_epilogue --out DIR        # DIR/derivative_epilogue.json and .txt
    python -m benchmarks.sweep_derivative_epilogue --epilogue-warps 4 --out DIR   # four epilogue warps

Method: bf16, random inputs rotated past the L2, every output compared with float64 first
(``sweep_fp8_blockwise.checked``: not timed if wrong), three interleaved rounds (order reversed every
other round), each ``do_bench_cudagraph``'s median (``sweep_fp8_split_rows.timed_rounds``).
Ratio = torch's time / that one's (> 1: faster).
"""

from __future__ import annotations

import argparse
import sys

import torch

from tritongemm import TileConfig, launch
from tritongemm.planning.call import Epilogue, GemmCall, Request
from tritongemm.semantics import DERIVATIVE_EPILOGUES, activation_backward

from . import harness
from .sweep_fp8_blockwise import checked
from .sweep_fp8_split_rows import ratio_cell, save_records, start_on_gpu, timed_rounds

#: (label, M, H: fc1's outputs, hidden: the GEMM's K, activation)
SHAPES = (
    ("gpt2", 4096, 3072, 768, "gelu_tanh"),
    ("gpt2", 16384, 3072, 768, "gelu_tanh"),
    ("bert-large", 8192, 4096, 1024, "gelu"),
    ("vit-h", 8192, 5120, 1280, "gelu"),
    ("silu", 8192, 4096, 4096, "silu"),
)
DTYPE = torch.bfloat16
PINGPONG = TileConfig(128, 128, 64, 8, 4, 5, kernel="gluon_ws", pingpong=True)
NAMES = ("unfused", "rule", "pingpong")


def inputs(m: int, h: int, k: int, device, gen) -> list[tuple]:
    """(dy, W2, z) sets, random, in as many copies as rotate past the L2 (W2 scaled by 1 / sqrt(K))."""
    copies = harness.copies_to_exceed_l2(2 * (m * k + k * h + m * h), harness.l2_cache_bytes(device))
    sets = []
    for _ in range(copies):
        dy = torch.randn(m, k, device=device, generator=gen).to(DTYPE)
        w2 = (torch.randn(k, h, device=device, generator=gen) / k**0.5).to(DTYPE)
        z = torch.randn(m, h, device=device, generator=gen).to(DTYPE)
        sets.append((dy, w2, z))
    return sets


def measure(label: str, m: int, h: int, k: int, activation: str, device, gen) -> dict:
    sets = inputs(m, h, k, device, gen)
    dy, w2, z = (t.double() for t in sets[0])
    ref = activation_backward(dy @ w2, z, activation)
    plain = GemmCall()
    derivative = Epilogue(activation=DERIVATIVE_EPILOGUES[activation], residual=True)

    def ours(config=None):
        call = GemmCall(derivative, Request(config=config))

        def run(dy, w2, z):
            out = torch.empty(dy.shape[0], w2.shape[1], dtype=DTYPE, device=dy.device)
            return launch.gemm(call, dy, w2, out, None, z, None)

        return run

    def unfused(dy, w2, z):
        out = torch.empty(dy.shape[0], w2.shape[1], dtype=DTYPE, device=dy.device)
        return activation_backward(launch.gemm(plain, dy, w2, out), z, activation)

    impls = {
        "torch": lambda dy, w2, z: activation_backward(dy @ w2, z, activation),
        "unfused": unfused,
        "rule": ours(),
        "pingpong": ours(PINGPONG),
    }
    row = {"model": label, "m": m, "h": h, "k": k, "activation": activation}
    out = torch.empty(m, h, dtype=DTYPE, device=device)
    chosen = launch.plan_for(GemmCall(derivative), sets[0][0], sets[0][1], out)
    warps = (
        launch.gluon.epilogue_warps(GemmCall(derivative), chosen.config) if chosen.kernel == "gluon_ws" else 0
    )
    row["rule_plan"] = f"{chosen.kernel} {chosen.config.short()} epilogue warps {warps}"
    timed_rounds(checked(impls, sets, ref, row), row)
    return row


def table(rows: list[dict]) -> str:
    lines = [
        f"{'model':<11} {'M x H x K':<18} {'act':<10} {'torch us':>8} " + " ".join(f"{n:>9}" for n in NAMES)
    ]
    for r in rows:
        cells = [ratio_cell(r, n, 9) for n in NAMES]
        torch_us = format(r["torch_ms"] * 1e3, ".1f") if "torch_ms" in r else "-"
        shape = f"{r['m']}x{r['h']}x{r['k']}"
        lines.append(
            f"{r['model']:<11} {shape:<18} {r['activation']:<10} {torch_us:>8} "
            + " ".join(f"{c:>9}" for c in cells)
            + f"  {r['rule_plan']}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.sweep_derivative_epilogue", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--out", default=".", help="folder for derivative_epilogue.json and .txt")
    parser.add_argument(
        "--epilogue-warps",
        type=int,
        choices=(4, 8),
        default=None,
        help="epilogue warps for derivative epilogues (default: launch.gluon.DERIVATIVE_EPILOGUE_WARPS)",
    )
    args = parser.parse_args(argv)
    started = start_on_gpu(
        args.out, "the derivative epilogue sweep times the warp-specialized kernel: it needs an sm_90 GPU"
    )
    if started is None:
        return 2
    device, gen, out, env = started
    if args.epilogue_warps is not None:
        launch.gluon.DERIVATIVE_EPILOGUE_WARPS = args.epilogue_warps  # (before any launcher is built)
    rows = []
    for i, shape in enumerate(SHAPES, 1):
        print(f"[{i}/{len(SHAPES)}] {shape[0]} {shape[1]}x{shape[2]}x{shape[3]}", file=sys.stderr, flush=True)
        rows.append(measure(*shape, device, gen))
        save_records(out, "derivative_epilogue", {"env": env, "records": rows}, table(rows))
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
