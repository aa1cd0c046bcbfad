"""One-call GPU check: correctness matrix on compiled kernels, then the pipeline ladder.

    python -m benchmarks.gpu_check [--out DIR] [--quick]

1. Correctness: every pipeline variant x layout (NN/NT/TN/TT) x dtype x ragged
   shape, compiled, against a float64 reference (outputs poisoned with NaN).
2. Timing: TFLOP/s of single_stage / double_buffer / multi_stage at 4096^3 for
   fp16 and bf16 beside torch.matmul (cuBLAS), same process, same inputs,
   inputs rotated so L2 does not flatter, do_bench medians.
Prints a short table last; writes CSVs under --out.
"""

from __future__ import annotations

import argparse
import itertools
import os
import platform
import statistics
import sys
import time

import torch
import triton

import tritongemm
from tritongemm import TileConfig
from tritongemm.testing import make_matrix, relative_error, time_samples

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32, "fp64": torch.float64}
TOL = {torch.float16: 2e-3, torch.bfloat16: 1.5e-2, torch.float32: 2e-3, torch.float64: 1e-12}


def env() -> dict:
    props = torch.cuda.get_device_properties(0)
    return {
        "gpu": props.name,
        "sm_count": props.multi_processor_count,
        "torch": torch.__version__,
        "triton": triton.__version__,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
    }


def operand(rows, cols, dtype, layout, batch=()):
    """A (rows x cols) operand, row-major for 'N', a transposed view for 'T' (``testing.make_matrix``)."""
    return make_matrix(rows, cols, layout, dtype, "cuda", batch)


rel_err = relative_error


def correctness(quick: bool) -> list[dict]:
    rows = []
    tritongemm._set_poison_outputs(True)
    shapes = [(1, 1, 1), (17, 31, 65), (128, 256, 64), (257, 129, 1000), (1000, 520, 33)]
    configs = {
        "single_stage": TileConfig(64, 64, 32, 8, 4, 1),
        "double_buffer": TileConfig(128, 128, 32, 8, 4, 2),
        "multi_stage": TileConfig(128, 256, 64, 8, 8, 3),
        "heuristic": None,
    }
    for (name, cfg), dt, la, lb, (m, n, k) in itertools.product(configs.items(), DTYPES, "NT", "NT", shapes):
        dtype = DTYPES[dt]
        if quick and (la, lb) in (("T", "N"),) and dt == "fp64":
            continue
        if cfg is not None and dtype in (torch.float32, torch.float64):
            # the big fp16 tiles do not fit with 4- and 8-byte elements
            cfg = TileConfig(64, 64, 16, 8, 4, cfg.num_stages)
        a, b = operand(m, k, dtype, la), operand(k, n, dtype, lb)
        try:
            out = tritongemm.matmul(a, b, config=cfg)
            err = rel_err(out, a.double() @ b.double())
            ok = err <= TOL[dtype] and not torch.isnan(out).any().item()
            msg = ""
        except Exception as e:  # record and go on: the table says what broke
            err, ok, msg = float("nan"), False, f"{type(e).__name__}: {str(e)[:200]}"
        rows.append(
            dict(variant=name, dtype=dt, layout=la + lb, m=m, n=n, k=k, rel_err=err, ok=ok, error=msg)
        )
    # batched + broadcast, autograd
    a = torch.randn(3, 1, 70, 50, device="cuda", dtype=torch.float16, requires_grad=True)
    b = torch.randn(1, 4, 50, 90, device="cuda", dtype=torch.float16, requires_grad=True)
    out = tritongemm.matmul(a, b)
    out.float().square().sum().backward()
    ga, gb = a.grad.clone(), b.grad.clone()
    a.grad = b.grad = None
    torch.matmul(a.double(), b.double()).square().sum().backward()
    rows.append(
        dict(
            variant="autograd-bcast",
            dtype="fp16",
            layout="NN",
            m=70,
            n=90,
            k=50,
            rel_err=max(rel_err(ga, a.grad.double()), rel_err(gb, b.grad.double())),
            ok=max(rel_err(ga, a.grad.double()), rel_err(gb, b.grad.double())) < 5e-3,
            error="",
        )
    )
    tritongemm._set_poison_outputs(False)
    return rows


def rotating(f, sets):
    """A no-argument call of ``f`` on the next input set, round robin (L2 never holds them all)."""
    state = {"i": 0}

    def run():
        args = sets[state["i"] % len(sets)]
        state["i"] += 1
        return f(*args)

    return run


def bench(fn, reps_ms=200):
    return statistics.median(time_samples(fn, torch.device("cuda"), warmup_ms=50, rep_ms=reps_ms))


def ladder(sizes, dtypes) -> list[dict]:
    rows = []
    for (m, n, k), dt in itertools.product(sizes, dtypes):
        dtype = DTYPES[dt]
        # rotate 4 input sets: 4 x (A + B) >> 50 MB of L2
        sets = [
            (torch.randn(m, k, device="cuda", dtype=dtype), torch.randn(k, n, device="cuda", dtype=dtype))
            for _ in range(4)
        ]

        def rotate(f, sets=sets):
            return rotating(f, sets)

        ref = torch.matmul(*sets[0])
        impls = {"cublas": lambda a, b: torch.matmul(a, b)}
        base = TileConfig(128, 256, 64, 8, 8, 3)
        for stages in (1, 2, 3, 4):
            cfg = TileConfig(base.block_m, base.block_n, base.block_k, 8, 8, stages)
            impls[f"{cfg.pipeline}(s={stages})"] = (lambda c: lambda a, b: tritongemm.matmul(a, b, config=c))(
                cfg
            )
        impls["heuristic"] = lambda a, b: tritongemm.matmul(a, b)
        for name, f in impls.items():
            out = f(*sets[0])
            err = rel_err(out, ref.double())
            if err > 1e-2:
                rows.append(
                    dict(
                        shape=f"{m}x{n}x{k}",
                        dtype=dt,
                        impl=name,
                        ms=float("nan"),
                        tflops=float("nan"),
                        rel_err=err,
                    )
                )
                continue
            ms = bench(rotate(f))
            rows.append(
                dict(
                    shape=f"{m}x{n}x{k}",
                    dtype=dt,
                    impl=name,
                    ms=ms,
                    tflops=2 * m * n * k / ms * 1e-9,
                    rel_err=err,
                )
            )
    return rows


def _host_us_per_call(f, calls: int, warmup: int) -> float:
    """Host microseconds per call of ``f``, launches queued back to back."""
    for _ in range(warmup):
        f()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(calls):
        f()
    host = (time.perf_counter() - t) / calls * 1e6
    torch.cuda.synchronize()
    return host


def host_overhead() -> list[dict]:
    """Microseconds of host time per call, launches queued back to back (tiny GPU work)."""
    rows = []
    a = torch.randn(256, 256, device="cuda", dtype=torch.float16)
    b = torch.randn(256, 256, device="cuda", dtype=torch.float16)
    cfgs = {
        "torch.matmul": lambda: torch.matmul(a, b),
        "tritongemm heuristic": lambda: tritongemm.matmul(a, b),
        "tritongemm ptr cfg": (lambda c: lambda: tritongemm.matmul(a, b, config=c))(
            TileConfig(64, 64, 64, 8, 4, 3)
        ),
        "tritongemm tma cfg": (lambda c: lambda: tritongemm.matmul(a, b, config=c))(
            TileConfig(64, 64, 64, 8, 4, 3, kernel="tma_persistent")
        ),
    }
    for name, f in cfgs.items():
        host = _host_us_per_call(f, calls=2000, warmup=50)
        rows.append(dict(impl=name, host_us=host))
        print(f"host overhead {name}: {host:.1f} us/call", flush=True)
    return rows


def host_profile(out_dir: str) -> None:
    """cProfile of the host path: forward (TMA and pointer) and forward+backward."""
    import cProfile
    import io
    import pstats

    a = torch.randn(2048, 2048, device="cuda", dtype=torch.float16, requires_grad=True)
    b = torch.randn(2048, 2048, device="cuda", dtype=torch.float16, requires_grad=True)
    g = torch.randn(2048, 2048, device="cuda", dtype=torch.float16)

    def fwd():
        with torch.no_grad():
            tritongemm.matmul(a, b)

    def fwd_bwd():
        a.grad = b.grad = None
        tritongemm.matmul(a, b).backward(g)

    def torch_fwd_bwd():
        a.grad = b.grad = None
        torch.matmul(a, b).backward(g)

    for name, f in (("fwd", fwd), ("fwd_bwd", fwd_bwd), ("torch_fwd_bwd", torch_fwd_bwd)):
        host = _host_us_per_call(f, calls=200, warmup=20)
        print(f"host {name}: {host:.1f} us/call", flush=True)
        if name != "torch_fwd_bwd":
            prof = cProfile.Profile()
            prof.enable()
            for _ in range(200):
                f()
            prof.disable()
            torch.cuda.synchronize()
            buf = io.StringIO()
            pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(14)
            with open(os.path.join(out_dir, f"host_profile_{name}.txt"), "w") as fh:
                fh.write(buf.getvalue())
            print("\n".join(buf.getvalue().splitlines()[6:22]), flush=True)


def sweep_configs():
    T = TileConfig
    return {
        "ptr 128x256x64 s3": T(128, 256, 64, 8, 8, 3),
        "ptr 128x256x64 s4": T(128, 256, 64, 8, 8, 4),
        "ptr 128x128x64 w4 s4": T(128, 128, 64, 8, 4, 4),
        "ptr 128x128x64 w8 s5": T(128, 128, 64, 8, 8, 5),
        "tma 128x256x64 s3": T(128, 256, 64, 8, 8, 3, kernel="tma"),
        "tma 128x256x64 s4 sub": T(128, 256, 64, 8, 8, 4, kernel="tma", epilogue_subtile=True),
        "tmaP 128x256x64 s3": T(128, 256, 64, 8, 8, 3, kernel="tma_persistent"),
        "tmaP 128x256x64 s4 sub": T(128, 256, 64, 8, 8, 4, kernel="tma_persistent", epilogue_subtile=True),
        "tmaP 128x256x64 s3 ws": T(128, 256, 64, 8, 8, 3, kernel="gluon_ws"),
        "tmaP 128x128x64 w8 s4": T(128, 128, 64, 8, 8, 4, kernel="tma_persistent"),
        "tmaP 128x128x64 w4 s4": T(128, 128, 64, 8, 4, 4, kernel="tma_persistent"),
        "tma 128x128x64 w8 s4": T(128, 128, 64, 8, 8, 4, kernel="tma"),
        "tmaP 256x128x64 s3 sub": T(256, 128, 64, 8, 8, 3, kernel="tma_persistent", epilogue_subtile=True),
        "tmaP 128x256x128 s2 sub": T(128, 256, 128, 8, 8, 2, kernel="tma_persistent", epilogue_subtile=True),
        "heuristic": None,
    }


def small_sweep_configs():
    T = TileConfig
    out = {}
    for bm, bn, bk, w, st in [
        (64, 64, 64, 4, 4),
        (64, 128, 64, 4, 4),
        (128, 64, 64, 4, 4),
        (128, 128, 64, 4, 4),
        (128, 128, 64, 8, 4),
        (64, 256, 64, 4, 3),
        (128, 256, 64, 8, 3),
        (64, 128, 128, 4, 3),
    ]:
        out[f"ptr {bm}x{bn}x{bk} w{w} s{st}"] = T(bm, bn, bk, 8, w, st)
        out[f"tmaP {bm}x{bn}x{bk} w{w} s{st}"] = T(bm, bn, bk, 8, w, st, kernel="tma_persistent")
        out[f"tma {bm}x{bn}x{bk} w{w} s{st}"] = T(bm, bn, bk, 8, w, st, kernel="tma")
    out["heuristic"] = None
    return out


def sweep(shapes, dtypes, configs=None) -> list[dict]:
    rows = []
    for (m, n, k, layout), dt in itertools.product(shapes, dtypes):
        dtype = DTYPES[dt]
        nsets = max(2, min(8, int(200e6 // ((m * k + k * n) * 2)) + 1))
        sets = [(operand(m, k, dtype, layout[0]), operand(k, n, dtype, layout[1])) for _ in range(nsets)]

        def rotate(f, sets=sets):
            return rotating(f, sets)

        ref = torch.matmul(*sets[0]).double()
        t_cublas = bench(rotate(torch.matmul), 100)
        base = dict(shape=f"{m}x{n}x{k}", layout=layout, dtype=dt)
        rows.append(dict(base, impl="cublas", ms=t_cublas, tflops=2 * m * n * k / t_cublas * 1e-9, ratio=1.0))
        for name, cfg in (configs or sweep_configs()).items():
            f = (lambda c: lambda a, b: tritongemm.matmul(a, b, config=c))(cfg)
            try:
                err = rel_err(f(*sets[0]), ref)
                if not err < 1e-2:
                    raise RuntimeError(f"rel err {err}")
                ms = bench(rotate(f), 100)
                kern = tritongemm.explain(*sets[0], config=cfg).kernel
            except Exception as e:
                rows.append(
                    dict(
                        base,
                        impl=name,
                        ms=float("nan"),
                        tflops=float("nan"),
                        ratio=float("nan"),
                        error=f"{type(e).__name__}: {str(e)[:150]}",
                    )
                )
                continue
            rows.append(
                dict(
                    base, impl=name, kernel=kern, ms=ms, tflops=2 * m * n * k / ms * 1e-9, ratio=t_cublas / ms
                )
            )
        print(f"swept {base}", flush=True)
    return rows


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=os.environ.get("OUT", "benchmarks/results"))
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--skip-correctness", action="store_true")
    parser.add_argument("--sweep", action="store_true")
    parser.add_argument("--small-sweep", action="store_true")
    parser.add_argument("--decode", action="store_true")
    parser.add_argument("--host-profile", action="store_true")
    parser.add_argument("--layouts", action="store_true")
    parser.add_argument("--no-ladder", action="store_true")
    args = parser.parse_args()
    import pandas as pd

    os.makedirs(args.out, exist_ok=True)
    e = env()
    print(e, flush=True)
    if not args.skip_correctness:
        t0 = time.time()
        corr = pd.DataFrame(correctness(args.quick))
        corr.assign(**e).to_csv(os.path.join(args.out, "gpu_correctness.csv"), index=False)
        bad = corr[~corr.ok]
        print(f"correctness: {len(corr) - len(bad)}/{len(corr)} ok in {time.time() - t0:.0f}s", flush=True)
        if len(bad):
            print(bad.to_string(), flush=True)
    host_overhead()
    if args.host_profile:
        host_profile(args.out)
    if args.small_sweep:
        shapes = [
            (512, 512, 512, "NN"),
            (1024, 1024, 1024, "NN"),
            (2048, 2048, 2048, "NN"),
            (3072, 3072, 3072, "NN"),
            (1024, 6144, 4096, "NT"),
            (1024, 4096, 14336, "NT"),
            (4096, 28672, 4096, "NT"),
            (4096, 4096, 4096, "NT"),
        ]
        sw = pd.DataFrame(sweep(shapes, ["fp16"], small_sweep_configs())).assign(**e)
        sw.to_csv(os.path.join(args.out, "sweep_small.csv"), index=False)
        best = (
            sw[sw.impl != "cublas"]
            .sort_values("ratio", ascending=False)
            .groupby(["shape", "layout", "dtype"])
            .head(3)
        )
        print(
            best[["shape", "layout", "dtype", "impl", "tflops", "ratio"]].to_string(
                index=False, float_format="%.3f"
            )
        )
    if args.decode:
        shapes = [
            (m, n, k, "NT")
            for m in (1, 16, 64, 128)
            for (n, k) in ((6144, 4096), (4096, 14336), (28672, 4096))
        ]
        shapes += [
            (512, 512, 65536, "NN"),
            (1024, 1024, 32768, "NN"),
            (1024, 1024, 1024, "NN"),
            (896, 2432, 4096, "NN"),
            (3072, 3072, 3072, "NN"),
        ]
        cfgs = {
            "heuristic": None,
            "ptr 128x128x64 w8 s4": TileConfig(128, 128, 64, 8, 8, 4),
            "streamk 128x128x64 w8 s4": TileConfig(128, 128, 64, 8, 8, 4, stream_k=True),
            "streamk 128x256x64 w8 s3": TileConfig(128, 256, 64, 8, 8, 3, stream_k=True),
            "tmaP 128x128x64 w8 s4": TileConfig(128, 128, 64, 8, 8, 4, kernel="tma_persistent"),
        }
        for sk in (2, 4, 8, 16):
            cfgs[f"ptr 16x128x64 sk{sk}"] = TileConfig(16, 128, 64, 8, 4, 4, split_k=sk)
            cfgs[f"ptr 64x128x64 sk{sk}"] = TileConfig(64, 128, 64, 8, 4, 4, split_k=sk)
            cfgs[f"ptr 128x128x64 w8 sk{sk}"] = TileConfig(128, 128, 64, 8, 8, 4, split_k=sk)
        sw = pd.DataFrame(sweep(shapes, ["fp16"], cfgs)).assign(**e)
        sw.to_csv(os.path.join(args.out, "sweep_decode.csv"), index=False)
        best = (
            sw[sw.impl != "cublas"]
            .sort_values("ratio", ascending=False)
            .groupby(["shape", "layout", "dtype"])
            .head(2)
        )
        print(
            best[["shape", "layout", "dtype", "impl", "tflops", "ratio"]].to_string(
                index=False, float_format="%.3f"
            )
        )
        h = sw[sw.impl == "heuristic"]
        print(h[["shape", "impl", "tflops", "ratio"]].to_string(index=False, float_format="%.3f"))
    if args.layouts:
        shapes = [(s_, s_, s_, lay) for s_ in (2048, 4096) for lay in ("NT", "TN", "TT")]
        T = TileConfig
        cfgs = {
            "heuristic": None,
            "tma 128x256x64 s3": T(128, 256, 64, 8, 8, 3, kernel="tma"),
            "tmaP 128x256x64 s3": T(128, 256, 64, 8, 8, 3, kernel="tma_persistent"),
            "tmaP 128x256x64 s4 sub": T(
                128, 256, 64, 8, 8, 4, kernel="tma_persistent", epilogue_subtile=True
            ),
            "tmaP 128x128x64 w8 s4": T(128, 128, 64, 8, 8, 4, kernel="tma_persistent"),
            "tmaP 256x128x64 s3 sub": T(
                256, 128, 64, 8, 8, 3, kernel="tma_persistent", epilogue_subtile=True
            ),
            "ptr 128x256x64 s3": T(128, 256, 64, 8, 8, 3),
            "ptr 128x256x64 s4": T(128, 256, 64, 8, 8, 4),
            "ptr 128x128x64 w8 s4": T(128, 128, 64, 8, 8, 4),
        }
        sw = pd.DataFrame(sweep(shapes, ["fp16"], cfgs)).assign(**e)
        sw.to_csv(os.path.join(args.out, "sweep_layouts.csv"), index=False)
        print(sw.pivot_table(index="impl", columns=["shape", "layout"], values="ratio").round(2).to_string())
    if args.sweep:
        shapes = [
            (1024, 1024, 1024, "NN"),
            (2048, 2048, 2048, "NN"),
            (4096, 4096, 4096, "NN"),
            (8192, 8192, 8192, "NN"),
            (5120, 5120, 4096, "NT"),
            (4096, 4096, 4096, "TN"),
        ]
        sw = pd.DataFrame(sweep(shapes, ["fp16", "bf16"])).assign(**e)
        sw.to_csv(os.path.join(args.out, "sweep.csv"), index=False)
        best = (
            sw[sw.impl != "cublas"]
            .sort_values("ratio", ascending=False)
            .groupby(["shape", "layout", "dtype"])
            .head(2)
        )
        print(
            best[["shape", "layout", "dtype", "impl", "tflops", "ratio"]].to_string(
                index=False, float_format="%.3f"
            )
        )
    if args.no_ladder:
        return 0
    lad = pd.DataFrame(ladder([(4096, 4096, 4096)], ["fp16", "bf16"]))
    lad = lad.assign(**e)
    lad.to_csv(os.path.join(args.out, "pipeline_ladder.csv"), index=False)
    cublas = lad[lad.impl == "cublas"].set_index("dtype").tflops
    lad["vs_cublas"] = [t / cublas[d] for t, d in zip(lad.tflops, lad.dtype)]
    print(f"\nPipeline ladder on {e['gpu']} (torch {e['torch']}, triton {e['triton']})")
    print(
        lad[["shape", "dtype", "impl", "ms", "tflops", "vs_cublas"]].to_string(
            index=False, float_format="%.3f"
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
