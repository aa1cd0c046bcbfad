"""fp8 GEMMs with few rows, computed transposed ("swap AB"): does ``C^T = W @ X^T`` beat ``C = X @ W^T``?

With M = 16-256 rows, a 64-row wgmma tile (the warp-specialized kernel's least) is mostly empty, and
the pointer kernel's narrow tiles read the activations once per column tile.  Computed transposed,
the weight's N rows fill the wgmma's 64- or 128-row side and the few tokens become a 16-256 wide tile
(a common trick for decode).  Both ``torch._scaled_mm`` and ``tritongemm.scaled_mm``
take the transposed call as it is: ``a' = w`` (N, K) row-major, ``b' = x.t()`` column-major, the
scales swapped (rowwise: ``scale_a'`` (N, 1), ``scale_b'`` (1, M)), the (N, M) result read as its
transpose.  This times, per problem and recipe, the heuristic's plan both ways, torch both ways, and
explicit tiles for the transposed problem on both kernels: the warp-specialized one (64 or 128 weight
rows, the tokens rounded up to a power of two wide, 6 or 10 stages, with and without Stream-K) and the
pointer one (64 or 128 rows, K steps of 128 and 256, split-K 1, 2, 4).

Run from the repository root on the GPU machine (about 2 minutes):

    python -m benchmarks.sweep_fp8_swap --out DIR         # DIR/fp8_swap.json and .txt
    TRITON_INTERPRET=1 python -m benchmarks.sweep_fp8_swap --smoke --out DIR   # CPU: code paths only

Method: every candidate's output is first compared with the float64 product of the dequantized
operands (relative Frobenius error under 3e-2, else "wrong", not timed); kernels are built first in a
pool of processes; then ``triton.testing.do_bench`` medians, inputs rotated over copies totalling
about twice the L2, in 3 rounds interleaving every candidate with torch (the order reversed every
other round), each point the median of its rounds.  ``ratio`` is torch's untransposed time / the
candidate's (> 1: faster than ``torch._scaled_mm`` as called).
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import statistics
import sys
import time

import torch
import triton

import tritongemm
from tritongemm import TileConfig
from tritongemm.planning.configs import ConfigError
from tritongemm.testing import relative_error

from . import fp8
from .gpu_check import rotating

OUT = fp8.OUT_DTYPE
TOKENS = (16, 64, 256)
#: (N, K): Llama-3-8B's attention and MLP up projections, a 5120-wide model's.
WEIGHTS = ((4096, 4096), (14336, 4096), (5120, 5120))
RECIPES = (("tensorwise", False), ("tensorwise", True), ("rowwise", False))
ROUNDS = 3
TOL = 3e-2
SMEM = 200 * 1024
T0 = time.time()


def log(msg: str) -> None:
    print(f"[{time.time() - T0:6.1f}s] {msg}", flush=True)


def swapped(a, b, sa, sb):
    """The transposed problem's operands: (w, x.t(), scale of w's rows, scale of x's rows)."""
    sa2 = sb.reshape(-1, 1).contiguous() if sb.dim() else sb
    sb2 = sa.reshape(1, -1).contiguous() if sa.dim() else sa
    return b.t(), a.t(), sa2, sb2


def ours(a, b, sa, sb, *, fast, config=None):
    return tritongemm.scaled_mm(a, b, sa, sb, out_dtype=OUT, use_fast_accum=fast, config=config)


def ours_swapped(a, b, sa, sb, *, fast, config=None):
    return ours(*swapped(a, b, sa, sb), fast=fast, config=config).t()


def torch_mm(a, b, sa, sb, *, fast):
    return torch._scaled_mm(a, b, sa, sb, out_dtype=OUT, use_fast_accum=fast)


def torch_swapped(a, b, sa, sb, *, fast):
    return torch_mm(*swapped(a, b, sa, sb), fast=fast).t()


def _pow2(x: int, lo: int, hi: int) -> int:
    p = lo
    while p < min(x, hi):
        p *= 2
    return p


def candidates(m: int, n: int, k: int, gluon: bool = True) -> dict[str, TileConfig]:
    """Tiles for the transposed problem (``n`` weight rows by ``m`` tokens), by name."""
    width = _pow2(m, 16, 256)
    out = {}
    if gluon:
        for bm, warps, pingpong in ((64, 4, False), (128, 4, True), (128, 8, False)):
            per_stage = (bm + width) * 128
            for stages in sorted({min(s, SMEM // per_stage) for s in (6, 10)}):
                for stream_k in (False, True):
                    try:
                        cfg = TileConfig(bm, width, 128, 8, warps, stages, kernel="gluon_ws", pingpong=pingpong,
                                         stream_k=stream_k)  # fmt: skip
                    except ConfigError:
                        continue
                    out["ws " + cfg.short()] = cfg
    for bm in (64, 128):
        for bk in (128, 256):
            for split in (1, 2, 4):
                if (bm + width) * bk * 4 > SMEM:
                    continue
                try:
                    cfg = TileConfig(bm, width, bk, 8, 4, 4, split_k=split, split_k_inline=split > 1)
                except ConfigError:
                    continue
                out["ptr " + cfg.short()] = cfg
    return out


def _compile_worker(jobs) -> int:
    done = 0
    for m, n, k, scaling, fast, cfg in jobs:
        s = fp8.make_inputs(fp8.Fp8Case("swap", m, n, k), torch.device("cuda"), 1)[0]
        try:
            ours_swapped(s.a, s.b, *s.scales[scaling], fast=fast, config=cfg)
            done += 1
        except Exception:  # noqa: BLE001 (the timing process records the error)
            pass
    torch.cuda.synchronize()
    return done


def precompile(problems, workers: int) -> None:
    """Build every candidate's kernel in a pool of processes (Triton's disk cache keeps them)."""
    import multiprocessing as mp

    jobs = {}
    for m, n, k in problems:
        for scaling, fast in RECIPES:
            for name, cfg in candidates(m, n, k).items():
                jobs.setdefault((name, scaling, fast), (m, n, k, scaling, fast, cfg))
    chunks = [list(jobs.values())[i::workers] for i in range(workers)]
    with mp.get_context("spawn").Pool(workers) as pool:
        built = sum(pool.map(_compile_worker, chunks))
    log(f"precompiled {built} of {len(jobs)} kernels in {workers} processes")


def measure(m, n, k, scaling, fast, dev, smoke) -> list[dict]:
    """One problem in one recipe: every way checked, then timed in interleaved rounds."""
    case = fp8.Fp8Case("swap", m, n, k)
    copies = 1 if smoke else max(2, math.ceil(100e6 / (m * k + n * k)))
    sets = [(s.a, s.b, *s.scales[scaling]) for s in fp8.make_inputs(case, torch.device(dev), copies)]
    ref = fp8.scaled_reference(sets[0][0].double() @ sets[0][1].double(), *sets[0][2:])
    fns = {
        "default": functools.partial(ours, fast=fast),
        "default swapped": functools.partial(ours_swapped, fast=fast),
    }
    if dev == "cuda":
        fns["torch"] = functools.partial(torch_mm, fast=fast)
        fns["torch swapped"] = functools.partial(torch_swapped, fast=fast)
    for name, cfg in candidates(m, n, k, gluon=dev == "cuda").items():
        fns[name] = functools.partial(ours_swapped, fast=fast, config=cfg)
    base = dict(m=m, n=n, k=k, scaling=scaling, fast_accum=fast)
    records, timed = [], {}
    for name, fn in fns.items():
        rec = dict(base, impl=name)
        records.append(rec)
        try:
            rec["rel_err"] = relative_error(fn(*sets[0]), ref)
        except Exception as exc:  # noqa: BLE001 (a candidate that cannot run is a result)
            rec.update(status="error", message=f"{type(exc).__name__}: {str(exc)[:200]}")
            continue
        if rec["rel_err"] > TOL:
            rec["status"] = "wrong"
            continue
        timed[name] = (fn, rec, [])
    names = list(timed)
    for r in range(1 if smoke else ROUNDS):
        for name in names if r % 2 == 0 else names[::-1]:
            run = rotating(timed[name][0], sets)
            if dev == "cuda":
                timed[name][2].append(triton.testing.do_bench(run, warmup=5, rep=20, return_mode="median"))
            else:
                run()
                timed[name][2].append(1.0)
    torch_ms = statistics.median(timed["torch"][2]) if "torch" in timed else 1.0
    for _, rec, samples in timed.values():
        ms = statistics.median(samples)
        rec.update(status="ok", us=ms * 1e3, ratio=torch_ms / ms)
    return records


def _ratio(ok: dict, name: str) -> str:
    return f"{ok[name]['ratio']:.2f}" if name in ok else "-"


def _best(ok: dict, prefix: str) -> str:
    cands = sorted((r for r in ok.values() if r["impl"].startswith(prefix)), key=lambda r: -r["ratio"])
    return f"{cands[0]['ratio']:.2f} ({cands[0]['impl'][len(prefix) :]})" if cands else "-"


def summary(records: list[dict], env: dict) -> list[str]:
    lines = [
        "fp8 few rows computed transposed (python -m benchmarks.sweep_fp8_swap): C^T = W @ X^T against",
        "C = X @ W^T, e4m3 in, bf16 out; ratio = torch._scaled_mm's untransposed time / the way's (> 1: faster).",
        "do_bench medians of 3 interleaved rounds, inputs rotated past L2, outputs checked against float64 first.",
        f"{env}",
        "Per (M, N, K, recipe): ours as planned, ours transposed (the heuristic's plan of the transposed",
        "problem), torch transposed, and the best explicit tile of the transposed problem on each kernel.",
    ]
    by: dict[tuple, list[dict]] = {}
    for r in records:
        by.setdefault((r["m"], r["n"], r["k"], r["scaling"], r["fast_accum"]), []).append(r)
    for (m, n, k, scaling, fast), rs in by.items():
        ok = {r["impl"]: r for r in rs if r.get("status") == "ok"}
        recipe = scaling + ("+fast" if fast else "")
        lines.append(
            f"{m}x{n}x{k} {recipe}: ours {_ratio(ok, 'default')}, ours transposed {_ratio(ok, 'default swapped')}, "
            f"torch transposed {_ratio(ok, 'torch swapped')}; best warp-specialized {_best(ok, 'ws ')}, "
            f"best pointer {_best(ok, 'ptr ')}"
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default=os.environ.get("OUT", "."))
    p.add_argument("--smoke", action="store_true", help="one tiny problem (the CPU interpreter)")
    p.add_argument("--jobs", type=int, default=15, help="compile processes")
    args = p.parse_args(argv)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    problems = [(m, n, k) for m in TOKENS for n, k in WEIGHTS]
    recipes = RECIPES
    if args.smoke:
        problems, recipes = [(16, 64, 256)], (("rowwise", False), ("tensorwise", True))
    if dev == "cuda":
        precompile(problems, args.jobs)
    records = []
    for i, (m, n, k) in enumerate(problems):
        for scaling, fast in recipes:
            records += measure(m, n, k, scaling, fast, dev, args.smoke)
        log(f"[{i + 1}/{len(problems)}] {m}x{n}x{k}")
    env = dict(
        gpu=torch.cuda.get_device_name() if dev == "cuda" else "cpu",
        torch=torch.__version__,
        triton=triton.__version__,
    )
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "fp8_swap.json"), "w") as f:
        json.dump(dict(env=env, records=records), f, indent=1)
    lines = summary(records, env)
    with open(os.path.join(args.out, "fp8_swap.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
