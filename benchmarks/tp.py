"""Tensor parallelism: a Llama decoder block, stock torch vs tritongemm, sharded the same way, in one run.

    torchrun --nproc-per-node 2 benchmarks/tp.py                        # Llama-3-8B block, bf16, 4 x 2048 tokens
    torchrun --nproc-per-node 2 benchmarks/tp.py --sequence-parallel    # norms on sequence shards
    torchrun --nproc-per-node 2 benchmarks/tp.py --smoke                # CPU: gloo, Triton's interpreter, tiny

Both variants are one block with the same weights, parallelized with
``parallelize_module`` by the same plan (q/k/v and gate/up column-wise, o and
down row-wise, as torchtitan does); the tritongemm one went through
``tritongemm.nn.convert`` first, so its projections run tritongemm's kernels
on the local shards and DTensor does the collectives for both.  Measured, in
one process group, variants interleaved round by round:

* prefill: forward without autograd; tokens/s over the whole group;
* train step: forward, backward and an AdamW step; ms.

A time is the slowest rank's (a step ends when every rank has).  Before any
timing, each variant's output and one weight gradient are checked against the
stock block's; a variant that differs is reported as ``failed_gate`` and not
timed.  Rank 0 writes ``benchmarks/results/<gpu>/tp.csv`` (``tp_sp.csv`` with sequence
parallel; the results schema, plus ``tokens_per_s`` and ``world_size``) and prints a table.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

if __package__ in (None, ""):  # run as a file (torchrun benchmarks/tp.py): make `benchmarks` importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


# ----------------------------------------------------------------------------------
# The block (Llama: RMSNorm, rotary attention with grouped KV heads, SwiGLU)
# ----------------------------------------------------------------------------------
class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        y = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + self.eps)
        return y.type_as(x) * self.weight


def _rotate(x, cos, sin):
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


class Attention(nn.Module):
    """Head counts follow the (sharded) projections' widths, so the same code runs on a rank's heads."""

    def __init__(self, dim: int, heads: int, kv_heads: int) -> None:
        super().__init__()
        self.head_dim = dim // heads
        self.wq = nn.Linear(dim, heads * self.head_dim, bias=False)
        self.wk = nn.Linear(dim, kv_heads * self.head_dim, bias=False)
        self.wv = nn.Linear(dim, kv_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(heads * self.head_dim, dim, bias=False)

    def forward(self, x, cos, sin):
        bsz, seq, _ = x.shape
        q, k, v = (
            w(x).view(bsz, seq, -1, self.head_dim).transpose(1, 2) for w in (self.wq, self.wk, self.wv)
        )
        q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
        groups = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.wo(y.transpose(1, 2).reshape(bsz, seq, -1))


class FeedForward(nn.Module):
    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.w1 = nn.Linear(dim, hidden, bias=False)  # gate
        self.w3 = nn.Linear(dim, hidden, bias=False)  # up
        self.w2 = nn.Linear(hidden, dim, bias=False)  # down

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    def __init__(self, dim: int, ffn: int, heads: int, kv_heads: int) -> None:
        super().__init__()
        self.attention_norm, self.ffn_norm = RMSNorm(dim), RMSNorm(dim)
        self.attention = Attention(dim, heads, kv_heads)
        self.feed_forward = FeedForward(dim, ffn)

    def forward(self, x, cos, sin):
        h = x + self.attention(self.attention_norm(x), cos, sin)
        return h + self.feed_forward(self.ffn_norm(h))


def rotary(seq: int, head_dim: int, device, dtype):
    inv = 1.0 / (500000.0 ** (torch.arange(0, head_dim, 2, device=device).float() / head_dim))
    angles = torch.outer(torch.arange(seq, device=device).float(), inv)
    angles = torch.cat((angles, angles), dim=-1)
    return angles.cos().to(dtype), angles.sin().to(dtype)


def tp_plan(sequence_parallel: bool) -> dict:
    """torchtitan's plan for a Llama block (with sequence parallel: norms on sequence shards)."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
        SequenceParallel,
    )

    out = Shard(1) if sequence_parallel else Replicate()
    plan = {
        "attention.wq": ColwiseParallel(),
        "attention.wk": ColwiseParallel(),
        "attention.wv": ColwiseParallel(),
        "attention.wo": RowwiseParallel(output_layouts=out),
        "feed_forward.w1": ColwiseParallel(),
        "feed_forward.w3": ColwiseParallel(),
        "feed_forward.w2": RowwiseParallel(output_layouts=out),
    }
    if sequence_parallel:
        gather = PrepareModuleInput(
            input_layouts=(Shard(1), None, None), desired_input_layouts=(Replicate(), None, None)
        )
        plan.update(
            {
                "attention_norm": SequenceParallel(),
                "ffn_norm": SequenceParallel(),
                "attention": gather,
                "feed_forward": PrepareModuleInput(
                    input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)
                ),
            }
        )
    return plan


# ----------------------------------------------------------------------------------
# Measuring
# ----------------------------------------------------------------------------------
def _sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    dist.barrier()


def _slowest_rank_ms(step, device, iters: int) -> list[float]:
    """Per-iteration milliseconds of ``step``, each the slowest rank's."""
    times = []
    for _ in range(iters):
        _sync(device)
        t0 = time.perf_counter()
        step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append((time.perf_counter() - t0) * 1000)
    t = torch.tensor(times, dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.tolist()


def _quantile(values, q):
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def _rel_err(out, ref) -> float:
    out = out.full_tensor() if hasattr(out, "full_tensor") else out
    ref = ref.full_tensor() if hasattr(ref, "full_tensor") else ref
    return ((out.double() - ref.double()).norm() / ref.double().norm().clamp_min(1e-30)).item()


def _block_flops(args, tokens: int) -> int:
    """GEMM FLOPs of one forward over the whole group: projections 2 T d_in d_out, attention 2 x 2 T S d (causal: /2)."""
    head_dim = args.hidden // args.heads
    proj = args.hidden * (2 * args.hidden + 2 * args.kv_heads * head_dim) + 3 * args.hidden * args.ffn
    return 2 * tokens * proj + 2 * tokens * args.seq * args.hidden


def run(args) -> list[dict]:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import parallelize_module

    import tritongemm
    from benchmarks import harness

    rank, world = dist.get_rank(), dist.get_world_size()
    device = (
        torch.device("cuda", torch.cuda.current_device()) if args.backend == "nccl" else torch.device("cpu")
    )
    dtype = DTYPES[args.dtype]
    mesh = init_device_mesh(device.type, (world,))

    torch.manual_seed(0)  # the same weights on every rank and in both variants
    base = Block(args.hidden, args.ffn, args.heads, args.kv_heads).to(device=device, dtype=dtype)
    variants = {}
    for name in ("torch", "tritongemm"):
        block = Block(args.hidden, args.ffn, args.heads, args.kv_heads).to(device=device, dtype=dtype)
        block.load_state_dict(base.state_dict())
        if name == "tritongemm":
            block = tritongemm.nn.convert(block)
        variants[name] = parallelize_module(block, mesh, tp_plan(args.sequence_parallel))
    del base

    torch.manual_seed(1)
    x_full = torch.randn(args.batch, args.seq, args.hidden, device=device, dtype=dtype)
    grad_full = torch.randn_like(x_full)
    cos, sin = rotary(args.seq, args.hidden // args.heads, device, dtype)
    if args.sequence_parallel:  # each rank holds its slice of the sequence
        x = x_full.chunk(world, dim=1)[rank].contiguous()
        grad = grad_full.chunk(world, dim=1)[rank].contiguous()
    else:
        x, grad = x_full, grad_full

    def prefill(block):
        with torch.no_grad():
            return block(x, cos, sin)

    def forward_backward(block):
        block.zero_grad(set_to_none=True)
        y = block(x, cos, sin)
        y.backward(grad)
        return y

    # The gate: output and one weight gradient against the stock block's.
    tol = harness.gate_tolerance(dtype) if device.type == "cuda" else 1e-4
    checked = {}
    ref_y = forward_backward(variants["torch"])
    ref_g = variants["torch"].feed_forward.w2.weight.grad
    for name, block in variants.items():
        y = forward_backward(block)
        err = max(_rel_err(y, ref_y), _rel_err(block.feed_forward.w2.weight.grad, ref_g))
        checked[name] = err
    # Not foreach: without sequence parallel the norms' weights stay plain tensors beside DTensors.
    optimizers = {n: torch.optim.AdamW(b.parameters(), lr=1e-6, foreach=False) for n, b in variants.items()}

    def train_step(name):
        forward_backward(variants[name])
        optimizers[name].step()

    steps = {
        "prefill": {n: (lambda b=b: prefill(b)) for n, b in variants.items()},
        "train step": {n: (lambda n=n: train_step(n)) for n in variants},
    }
    samples: dict[tuple[str, str], list[float]] = {}
    for workload, per_variant in steps.items():
        for name, step in per_variant.items():
            if checked[name] <= tol:
                for _ in range(args.warmup):
                    step()
        for _ in range(args.rounds):  # interleaved, so drift (clocks, heat) hits both variants alike
            for name, step in per_variant.items():
                if checked[name] <= tol:
                    samples.setdefault((workload, name), []).extend(
                        _slowest_rank_ms(step, device, args.iters)
                    )

    tokens = args.batch * args.seq
    case = (
        f"h{args.hidden} ffn{args.ffn} heads{args.heads}/{args.kv_heads} b{args.batch} s{args.seq} "
        f"tp{world}{'+sp' if args.sequence_parallel else ''}"
    )
    rows = []
    for workload in steps:
        for name in variants:
            ok = checked[name] <= tol
            times = samples.get((workload, name), [])
            ms = statistics.median(times) if ok else None
            flops = _block_flops(args, tokens) * (3 if workload == "train step" else 1)
            rows.append(
                {
                    "suite": "tp",
                    "group": f"llama block {workload}",
                    "case": case,
                    "x": tokens,
                    "x_label": "tokens (batch x sequence)",
                    "dtype": args.dtype,
                    "backward": workload == "train step",
                    "impl": f"{name} TP",
                    "family": "cublas" if name == "torch" else "tritongemm",
                    "variant": f"tp{world}{'+sp' if args.sequence_parallel else ''}",
                    "status": "ok" if ok else "failed_gate",
                    "message": ""
                    if ok
                    else f"differs from the stock block by {checked[name]:.3g} > {tol:.3g}",
                    "rel_err": checked[name],
                    "tol": tol,
                    "ms": ms,
                    "ms_p20": _quantile(times, 0.2) if ok else None,
                    "ms_p80": _quantile(times, 0.8) if ok else None,
                    "flops": flops,
                    "tflops": flops / ms / 1e9 if ok else None,
                    "tokens_per_s": tokens / ms * 1000 if ok else None,
                    "world_size": world,
                }
            )
    for row in rows:
        base = next(r for r in rows if r["group"] == row["group"] and r["family"] == "cublas")
        if row["ms"] and base["ms"]:
            row["speedup_vs_cublas"] = base["ms"] / row["ms"]
    return rows


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    parser.add_argument("--hidden", type=int, default=4096)
    parser.add_argument("--ffn", type=int, default=14336)
    parser.add_argument("--heads", type=int, default=32)
    parser.add_argument("--kv-heads", type=int, default=8)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq", type=int, default=2048)
    parser.add_argument("--sequence-parallel", action="store_true")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--iters", type=int, default=5, help="timed steps per variant per round")
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="CPU, gloo, Triton's interpreter, tiny sizes: checks the script runs",
    )
    parser.add_argument("--out", default=None, help="results folder (default benchmarks/results/<gpu>/)")
    args = parser.parse_args(argv)
    if args.smoke:
        if "tritongemm" not in sys.modules:
            os.environ["TRITON_INTERPRET"] = "1"  # read when tritongemm's kernels are decorated
        args.dtype, args.hidden, args.ffn, args.heads, args.kv_heads = "fp32", 32, 64, 4, 2
        args.batch, args.seq, args.warmup, args.rounds, args.iters = 1, 8, 1, 1, 1
    args.backend = "gloo" if args.smoke or not torch.cuda.is_available() else "nccl"
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group(args.backend)
    try:
        rows = run(args)
        if dist.get_rank() == 0:
            _report(rows, args)
    finally:
        dist.destroy_process_group()
    return 0


def _report(rows: list[dict], args) -> None:
    from pathlib import Path

    from benchmarks import harness

    env = harness.environment("cuda" if args.backend == "nccl" else "cpu")
    out_dir = Path(args.out) if args.out else harness.default_results_dir(env)
    csv = harness.write_results(rows, out_dir / ("tp_sp.csv" if args.sequence_parallel else "tp.csv"), env)
    columns = [
        ("group", "workload"),
        ("impl", "impl"),
        ("status", "status"),
        ("ms", "ms"),
        ("tokens_per_s", "tokens/s"),
        ("speedup_vs_cublas", "vs torch TP"),
        ("rel_err", "rel err"),
    ]
    shown = [{k: (f"{v:.4g}" if isinstance(v, float) else v) for k, v in r.items()} for r in rows]
    print(harness.format_table(shown, columns))
    print(f"wrote {csv}")


if __name__ == "__main__":
    sys.exit(main())
