"""The tile where the epilogue would leave the tensor cores idle: a fused activation's, or a short K's.

The heuristic picks tiles by shape alone.  A transcendental activation (GELU, tanh-GELU, SiLU) costs a
few microseconds a tile wherever the warps that run it are the ones that would issue the next wgmma.
On the one-consumer 128 x 128 tile the kernel's epilogue warps take whole tiles off the consumer, but
with Stream-K the consumer finishes the streamed tiles itself, and at 512 rows by 14336 those cost
GELU 13 us more than tanh-GELU.  Two ping-pong consumers on the same tile run each one's epilogue,
activation included, under the other's mainloop.

Ping-pong needs two tiles a program to alternate; with fewer than two waves one consumer idles.

Measured on an H100 (bf16, bias + activation, CUDA-graph replays, fused ÷ ``F.linear`` then torch's
activation; ``benchmarks/results/h100/sweeps/epilogue_tiles.txt``), GELU / tanh-GELU / SiLU, the
one-consumer tile (with the heuristic's Stream-K where it takes it) against ping-pong:

* 512 x 14336 x 4096 (448 tiles; the heuristic adds Stream-K): 0.89 / 0.97 / 0.99 against 0.95 / 0.97 /
  1.00;
* 1000 x 14336 x 4096 (896 tiles): 0.98 / 1.00 / 1.00 against 1.02 / 0.99 / 1.02;
* 1000 x 18944 x 3584 (1184 tiles): 1.01 / 1.02 / 1.03 against 1.08 / 1.01 / 1.05;
* 512 x 4096 x 14336 (128 tiles, under one wave): 0.94 / 0.96 / 0.95 against 0.90 / 0.99 / 0.97,
  so the rule leaves it.

A residual add keeps the one-consumer tile: 1.01 / 1.03 at 512 / 1000 x 14336 x 4096 against
ping-pong's 0.96 / 0.98 (``sweeps/epilogue_tiles_residual.txt``).  Without an activation the
one-consumer tile stays at long K (ping-pong: 0.93 against 0.97 at 512 x 14336, 0.95 against 0.98 at
1000 x 14336).  At a short K (``SHORT_K``) every tile's epilogue, even a
plain store, is a large share of its mainloop, and ping-pong hides it there too: against cuBLAS, one
consumer -> ping-pong, 0.96 -> 0.99 at 8192 x 3072 x 768, 0.98 -> 1.01 at 8192 x 2304 x 768, 0.94 ->
0.95 at 8192 x 768 x 768, 0.95 -> 0.98 at 12608 x 2304 x 768 (``sweeps/short_k.txt``).  The cooperative 128 x 256 tile staged in halves reads 1.02-1.05 at
512 x 14336 but 0.68 at 512 x 4096 x 14336 and 0.96-0.97 at 1000 rows.
"""

from __future__ import annotations

from dataclasses import replace

from ...device import DeviceInfo
from ...semantics import DERIVATIVE_EPILOGUES
from ..configs import TileConfig
from ..problem import GemmProblem
from .tiles import tiles_of

#: Activations whose epilogue is worth hiding (a reciprocal, an exponential and a few FMAs an element).
TRANSCENDENTAL = ("gelu", "gelu_tanh", "silu")
#: The derivative epilogues (``semantics.DERIVATIVE_EPILOGUES``): they read R, the saved pre-activation,
#: besides the math.  They keep the one-consumer tile, whose epilogue warps load R coalesced, a part ahead
#: and the first part under the mainloop; a ping-pong consumer loads it in the accumulator's layout, in
#: turn with its math (H100, bf16, 8192 x 4096 x 1024 NN, exact GELU's: 1535 us against 230 us).
DERIVATIVES = tuple(DERIVATIVE_EPILOGUES.values())
#: K up to which any epilogue is worth hiding (12-16 steps of 64, against a store of the whole tile), in
#: a forward layer's layout (both operands K-major).
SHORT_K = 1024
#: The warp-specialized 128 x 128 tile on two ping-pong consumers: (warps, stages); each consumer holds
#: an output staging tile, so the ring takes 5 stages where one consumer's takes 6.
PINGPONG_128 = (4, 5)


def epilogue_config(
    cfg: TileConfig, problem: GemmProblem, device: DeviceInfo, activation: str
) -> tuple[TileConfig, str | None]:
    """The heuristic's ``cfg`` for a fused ``activation`` ("none" for none), and what was changed (None:
    nothing): the one-consumer 128 x 128 warp-specialized tile becomes two ping-pong consumers, without
    Stream-K, where its tiles fill at least two waves and the epilogue is worth hiding (a transcendental
    activation, or a short K)."""
    one_consumer = (cfg.kernel, cfg.block_m, cfg.block_n, cfg.num_warps, cfg.pingpong) == (
        "gluon_ws",
        128,
        128,
        4,
        False,
    )
    # (measured on bf16 forward layers, x @ w.T: a weight gradient's TN GEMM over 512-1000 tokens ran
    # 3-4% slower with ping-pong, in the epilogue suite's forward + backward steps)
    short = problem.k <= SHORT_K and problem.elem_size == 2 and problem.layout == "NT"
    if not (activation in TRANSCENDENTAL or short) or not one_consumer or cfg.accumulator_widths[1]:
        return cfg, None
    if tiles_of(problem, 128, 128) < 2 * device.sm_count:
        return cfg, None
    warps, stages = PINGPONG_128
    cfg = replace(cfg, num_warps=warps, num_stages=stages, pingpong=True, stream_k=False)
    what = f"{activation} in the epilogue" if activation in TRANSCENDENTAL else f"a short K ({problem.k})"
    return cfg, f"{what}: two ping-pong consumers, each finishing under the other's mainloop"


__all__ = ["DERIVATIVES", "SHORT_K", "TRANSCENDENTAL", "epilogue_config"]
