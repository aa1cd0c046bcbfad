"""Dev sweep (GPU): configs for skinny, long-K and small problems, to set the heuristics.

    python -m benchmarks.sweep_skinny [--out DIR] [--jobs 14] [--groups decode,longk,small,wave]

Decode linears (M = 1...128 over Llama-3 8B/70B N x K, B column-major as in
``F.linear``), long K (512x512x65536, 1024x1024x32768) and small or
wave-quantized problems, each against a grid of tiles x split counts x
split-K reductions (second kernel / in-kernel).  Kernels are compiled first
by ``--jobs`` worker processes into Triton's on-disk cache, so the timing
process only loads them.  Each row: do_bench median, inputs rotated past L2,
output checked against cuBLAS first.  Also records the device-to-device copy
bandwidth of the same run.  Writes ``sweep_skinny.csv`` and prints the best
configs per shape and the best fixed rule per shape class.
"""

from __future__ import annotations

import argparse
import math
import multiprocessing as mp
import os
import sys
import time

import torch
import triton

from .gpu_check import rotating

NK = [
    (6144, 4096),
    (4096, 4096),
    (28672, 4096),
    (4096, 14336),
    (10240, 8192),
    (8192, 8192),
    (57344, 8192),
    (8192, 28672),
]


def decode_shapes():
    # M = 16 runs the same 16-row tiles as M = 1
    return [(m, n, k, "NT") for m in (1, 32, 64, 128) for (n, k) in NK]


# Short-K linears at prompt-time M (the small Llama's and GPT-2's projections
# in the models suite, where 64-row split-K tiles read 0.76-0.87 of cuBLAS).
PROMPT_NK = [
    (256, 512),
    (512, 512),
    (1408, 512),
    (512, 1408),
    (768, 768),
    (2304, 768),
    (3072, 768),
    (768, 3072),
    (1024, 4096),
    (4096, 4096),
]


def prompt_shapes():
    return [(m, n, k, "NT") for m in (8, 16, 32, 64, 96, 128) for (n, k) in PROMPT_NK]


def gemv_shapes():
    return [(1, n, k, "NT") for (n, k) in NK]


def longk_shapes():
    return [(512, 512, 65536, "NN"), (1024, 1024, 32768, "NN"), (256, 256, 131072, "NN")]


def small_shapes():
    return [
        (1024, 1024, 1024, "NN"),
        (896, 2432, 4096, "NN"),
        (2048, 2048, 2048, "NN"),
        (3072, 3072, 3072, "NN"),
        (1024, 1024, 1024, "NT"),
        (512, 512, 512, "NN"),
    ]


def wave_shapes():
    # Tile counts of 128x128 tiles on 132 SMs: 133 (one wave and a sliver), 64,
    # 576 (4.4 waves), 256, 1024 (7.8), 1600 (12.1), and the long-K pair.
    return [
        (896, 2432, 4096, "NN"),
        (1024, 1024, 1024, "NN"),
        (3072, 3072, 3072, "NN"),
        (2048, 2048, 2048, "NN"),
        (4096, 4096, 4096, "NN"),
        (5120, 5120, 4096, "NT"),
        (512, 512, 65536, "NN"),
        (1024, 1024, 32768, "NN"),
    ]


def tail_shapes():
    # The weakest LLM/square rows of the last H100 runs (0.83-0.92 of cuBLAS).
    return [
        (8192, 8192, 28672, "NT"),
        (1024, 6144, 4096, "NT"),
        (5120, 5120, 4096, "NT"),
        (3072, 3072, 3072, "NN"),
    ]


def backward_shapes():
    # The GEMMs of Llama-3-8B's backward at M = 4096 tokens: dA = dY @ W (long K for gate_up, NN)
    # and dW^T = X^T @ dY (A transposed, TN), plus 70B down's forward at M = 8192.
    return [
        (4096, 4096, 28672, "NN"),
        (4096, 28672, 4096, "TN"),
        (4096, 4096, 14336, "NN"),
        (4096, 14336, 4096, "TN"),
        (4096, 4096, 6144, "NN"),
        (4096, 6144, 4096, "TN"),
    ]


def tma_streamk_shapes():
    # Partial last waves of 128x256 / 128x128 tiles on 132 SMs: 70, 144, 288, 800, 192, 320 tiles ...
    return [
        (896, 2432, 4096, "NN"),
        (1536, 1536, 8192, "NN"),
        (3072, 3072, 3072, "NN"),
        (5120, 5120, 4096, "NT"),
        (1024, 6144, 4096, "NT"),
        (1024, 10240, 8192, "NT"),
        (4096, 4096, 4096, "NN"),
        (2048, 2048, 2048, "NN"),
        (1024, 1024, 1024, "NN"),
    ]


def _splits_for(tiles: int, k_tiles: int, sm: int) -> list[int]:
    """Split counts that put about 1, 2, 4 and 8 programs per SM, each slice >= 2 K-tiles."""
    out = {1}
    for per_sm in (1, 2, 4, 8):
        s = max(1, min(round(per_sm * sm / tiles), k_tiles // 2, 64))
        out.add(s)
    return sorted(out)


def configs_for(m, n, k, group, sm=132):
    from tritongemm import TileConfig

    out = []
    if group in ("gemv", "gemv_narrow"):
        bns, bks, ws = (
            ((16, 32, 64, 128), (64, 128, 256, 512), (2, 4, 8))
            if group == "gemv"
            else ((4, 8, 16), (512, 1024, 2048), (4, 8, 16))
        )
        for bn in bns:
            for bk in bks:
                for warps in ws:
                    if not 16 <= bk * bn // (32 * warps) <= 64:
                        continue
                    tiles = -(-n // bn)
                    for s in sorted({1, *(x for x in (2, 4, 8) if tiles * x <= 8 * sm and k // bk >= 2 * x)}):
                        out.append(
                            TileConfig(
                                16, bn, bk, 8, warps, 1, kernel="gemv", split_k=s, split_k_inline=s > 1
                            )
                        )
        out.append(TileConfig(16, 64, 256, 8, 4, 3, split_k=2 if n <= 4096 else 1, split_k_inline=n <= 4096))
        return out
    if group == "tma_streamk":
        T = TileConfig
        return [
            T(128, 256, 64, 8, 8, 3, kernel="tma_persistent"),
            T(128, 256, 64, 8, 8, 3, kernel="tma_persistent", stream_k=True),
            T(128, 256, 64, 8, 8, 4, kernel="tma_persistent", epilogue_subtile=True, stream_k=True),
            T(128, 128, 64, 8, 8, 4, kernel="tma_persistent"),
            T(128, 128, 64, 8, 8, 4, kernel="tma_persistent", stream_k=True),
            T(128, 128, 64, 8, 8, 4, stream_k=True),
        ]
    if group in ("tail", "backward"):
        T = TileConfig
        return [
            T(128, 256, 64, g, 8, 3, kernel=kernel)
            for g in (4, 8, 16)
            for kernel in ("tma_persistent", "tma")
        ] + [
            T(128, 256, 64, 8, 8, 4, kernel="tma_persistent", epilogue_subtile=True),
            T(256, 128, 64, 8, 8, 3, kernel="tma_persistent", epilogue_subtile=True),
            T(128, 128, 64, 8, 8, 4, kernel="tma_persistent"),
            T(128, 128, 64, 8, 8, 4, kernel="tma"),
            T(128, 256, 64, 8, 8, 3, kernel="gluon_ws"),
            T(128, 128, 64, 8, 8, 4, kernel="gluon_ws"),
        ]
    if group == "wave":
        from dataclasses import replace

        for bm, bn, bk, warps, stages in [
            (128, 128, 64, 8, 4),
            (128, 128, 64, 4, 4),
            (128, 256, 64, 8, 3),
            (64, 128, 64, 4, 4),
            (128, 128, 128, 8, 3),
        ]:
            base = TileConfig(bm, bn, bk, 8, warps, stages)
            out += [base, replace(base, stream_k=True)]
        out += [
            TileConfig(128, 128, 64, 8, 8, 4, kernel="tma_persistent"),
            TileConfig(128, 256, 64, 8, 8, 3, kernel="tma_persistent"),
        ]
        return out
    if group in ("decode", "prompt"):
        bms = [max(16, 1 << (m - 1).bit_length())] if m <= 64 else [64, 128]
        for bm in bms:
            if group == "prompt":
                bns = (16, 32, 64, 128) if m <= 16 else (32, 64, 128, 256)
            else:
                bns = (64, 128, 256)
            for bn in bns:
                for bk in (64, 128, 256):
                    if bm * bn >= 128 * 256 and bk > 64:
                        continue
                    for warps in (2, 4, 8) if group == "prompt" else (4, 8):
                        if bm * bn // (32 * warps) < 8 or (warps == 8) != (bm * bn >= 64 * 256):
                            continue
                        for stages in (4, 5) if bk == 64 else (3, 4):
                            smem = stages * (bm + bn) * bk * 2
                            if smem > 200 * 1024:
                                continue
                            tiles = -(-m // bm) * -(-n // bn)
                            for s in _splits_for(tiles, -(-k // bk), sm):
                                if s == 1:
                                    out.append(TileConfig(bm, bn, bk, 8, warps, stages))
                                else:
                                    for inline in (True,) if group == "prompt" else (False, True):
                                        out.append(
                                            TileConfig(
                                                bm, bn, bk, 8, warps, stages, split_k=s, split_k_inline=inline
                                            )
                                        )
    else:
        for bm, bn, bk, warps, stages in [
            (64, 64, 64, 4, 4),
            (64, 128, 64, 4, 4),
            (128, 64, 64, 4, 4),
            (128, 128, 64, 8, 4),
            (128, 128, 64, 4, 4),
            (128, 256, 64, 8, 3),
            (64, 256, 64, 4, 4),
            (128, 128, 128, 8, 3),
        ]:
            tiles = -(-m // bm) * -(-n // bn)
            for s in _splits_for(tiles, -(-k // bk), sm) + [2, 3]:
                if s == 1:
                    out.append(TileConfig(bm, bn, bk, 8, warps, stages))
                    if group == "small":
                        out.append(TileConfig(bm, bn, bk, 8, warps, stages, stream_k=True))
                        if bm >= 64:
                            out.append(TileConfig(bm, bn, bk, 8, warps, stages, kernel="tma_persistent"))
                elif s * 2 <= -(-k // bk):
                    for inline in (False, True):
                        out.append(TileConfig(bm, bn, bk, 8, warps, stages, split_k=s, split_k_inline=inline))
    return list(dict.fromkeys(out))


def operand(rows, cols, layout, dtype):
    if layout == "N":
        return torch.randn(rows, cols, device="cuda", dtype=dtype)
    return torch.randn(cols, rows, device="cuda", dtype=dtype).mT


def _compile_worker(jobs):
    os.environ.setdefault("TRITONGEMM_FAST_LAUNCH", "1")
    import tritongemm

    done = 0
    for (m, n, k, layout), cfgs in jobs:
        a = operand(m, k, layout[0], torch.float16)
        b = operand(k, n, layout[1], torch.float16)
        for cfg in cfgs:
            try:
                tritongemm.matmul(a, b, config=cfg)
                done += 1
            except Exception:
                pass
    torch.cuda.synchronize()
    return done


def _compile_key(shape, cfg):
    """What Triton specializes a launch on, roughly: the config (split count aside), M == 1, ragged K, layout."""
    m, n, k, layout = shape
    return (
        cfg.kernel,
        cfg.block_m,
        cfg.block_n,
        cfg.block_k,
        cfg.num_warps,
        cfg.num_stages,
        cfg.split_k > 1,
        cfg.split_k_inline,
        cfg.stream_k,
        cfg.group_m,
        cfg.epilogue_subtile,
        m == 1,
        k % cfg.block_k == 0,
        layout,
    )


def precompile(plan, jobs: int) -> None:
    """Warm Triton's disk cache from ``jobs`` processes (compilation is CPU-bound and serial per
    process): one launch per distinct compiled kernel."""
    t0 = time.time()
    unique = {}
    for shape, cfgs in plan:
        for cfg in cfgs:
            unique.setdefault(_compile_key(shape, cfg), (shape, [cfg]))
    buckets = [[] for _ in range(jobs)]
    for i, job in enumerate(unique.values()):
        buckets[i % jobs].append(job)
    ctx = mp.get_context("spawn")
    with ctx.Pool(jobs) as pool:
        done = sum(pool.map(_compile_worker, buckets))
    print(f"precompiled {done}/{len(unique)} kernels in {time.time() - t0:.0f}s", flush=True)


def bench(fn):
    return triton.testing.do_bench(fn, warmup=10, rep=30, return_mode="median")


def copy_bandwidth() -> float:
    n = 1 << 30
    src = torch.empty(n, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    ms = triton.testing.do_bench(lambda: dst.copy_(src), warmup=25, rep=200, return_mode="median")
    return 2 * n / ms * 1e-6  # GB/s, read + write


def to_schema(df):
    """The sweep's rows in the results schema (``benchmarks/schema.py``): one row per timing, the
    swept config's label in ``config`` and the sweep's own columns (``ratio``, ``impl`` ...) kept after it."""
    from . import schema

    out = df.assign(
        suite="sweep",
        case=[f"{m}x{n}x{k} {lay}" for m, n, k, lay in zip(df.m, df.n, df.k, df.layout)],
        config=df.impl.where(df.impl != "cublas"),
        variant=df.impl.where(df.impl == "heuristic"),
        status=["error" if isinstance(e, str) else "ok" for e in df.get("error", [None] * len(df))],
        message=df.get("error"),
        speedup_vs_cublas=df.ratio.where(df.impl != "cublas"),
        num_warps=df.get("warps"),
        num_stages=df.get("stages"),
        split_k_inline=df.get("inline"),
        env_gpu=df.gpu,
        env_sm_count=df.sm_count,
        env_torch=df.torch,
        env_triton=df.triton,
        env_date=df.date,
    )
    out["impl"] = ["cublas" if i == "cublas" else "tritongemm" for i in df.impl]
    out = out.drop(columns=["gpu", "sm_count", "torch", "triton", "date"])
    return schema.conform(out)


def save(rows, out_dir, sm):
    """Write ``sweep_skinny.csv`` (results schema); return the rows as the sweep's own frame."""
    import pandas as pd

    props = torch.cuda.get_device_properties(0)
    df = pd.DataFrame(rows).assign(
        gpu=props.name,
        sm_count=sm,
        torch=torch.__version__,
        triton=triton.__version__,
        date=time.strftime("%Y-%m-%d %H:%M:%S"),
    )
    os.makedirs(out_dir, exist_ok=True)
    to_schema(df).to_csv(os.path.join(out_dir, "sweep_skinny.csv"), index=False)
    return df


def main() -> int:
    import tritongemm

    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=os.environ.get("OUT", "."))
    parser.add_argument("--jobs", type=int, default=14)
    parser.add_argument("--groups", default="decode,longk,small")
    parser.add_argument("--mlist", default="")
    args = parser.parse_args()
    sm = torch.cuda.get_device_properties(0).multi_processor_count
    groups = args.groups.split(",")
    plan = []
    for g in groups:
        shapes = {
            "decode": decode_shapes,
            "prompt": prompt_shapes,
            "longk": longk_shapes,
            "small": small_shapes,
            "gemv": gemv_shapes,
            "gemv_narrow": gemv_shapes,
            "wave": wave_shapes,
            "tail": tail_shapes,
            "backward": backward_shapes,
            "tma_streamk": tma_streamk_shapes,
        }[g]()
        if args.mlist and g in ("decode", "prompt"):
            keep = {int(x) for x in args.mlist.split(",")}
            shapes = [s for s in shapes if s[0] in keep]
        plan += [((m, n, k, lay), g, configs_for(m, n, k, g, sm)) for (m, n, k, lay) in shapes]
    print(f"{len(plan)} shapes, {sum(len(c) for *_, c in plan)} timings", flush=True)
    precompile([(s, c) for s, _, c in plan], args.jobs)
    bw = copy_bandwidth()
    print(f"d2d copy bandwidth {bw:.0f} GB/s", flush=True)
    rows = []
    t0 = time.time()
    for idx, ((m, n, k, layout), group, cfgs) in enumerate(plan):
        nbytes = (m * k + k * n + m * n) * 2
        nsets = max(2, min(16, int(150e6 // nbytes) + 1))
        sets = [
            (operand(m, k, layout[0], torch.float16), operand(k, n, layout[1], torch.float16))
            for _ in range(nsets)
        ]
        ref = torch.matmul(*sets[0]).double()
        base = dict(group=group, m=m, n=n, k=k, layout=layout, dtype="fp16", copy_gbps=bw)
        t_cublas = bench(rotating(torch.matmul, sets))
        rows.append(dict(base, impl="cublas", ms=t_cublas, ratio=1.0, gbps=nbytes / t_cublas * 1e-6))
        heur = tritongemm.explain(*sets[0]).config
        # Stream-K configs run twice: streaming the last partial wave plus one
        # full wave (the default), and the partial wave alone.
        variants = [(cfg, None) for cfg in [None] + cfgs] + [(c, 0) for c in cfgs if c.stream_k]
        for cfg, extra_waves in variants:

            def f(a, b, c=cfg):
                return tritongemm.matmul(a, b, config=c)

            name = "heuristic" if cfg is None else cfg.short()
            default_waves = tritongemm.planning.schedules.STREAM_K_EXTRA_WAVES
            if extra_waves is not None:
                tritongemm.planning.schedules.STREAM_K_EXTRA_WAVES = extra_waves
                tritongemm.clear_plan_cache()
                name += f" sk+{extra_waves}w"
            try:
                out = f(*sets[0]).double()
                err = ((out - ref).norm() / ref.norm()).item()
                if not err < 1e-2:
                    raise RuntimeError(f"rel err {err:.3g}")
                ms = bench(rotating(f, sets))
            except Exception as e:
                rows.append(dict(base, impl=name, error=f"{type(e).__name__}: {str(e)[:120]}"))
                continue
            finally:
                if extra_waves is not None:
                    tritongemm.planning.schedules.STREAM_K_EXTRA_WAVES = default_waves
                    tritongemm.clear_plan_cache()
            c = heur if cfg is None else cfg
            rows.append(
                dict(
                    base,
                    impl=name,
                    ms=ms,
                    ratio=t_cublas / ms,
                    gbps=nbytes / ms * 1e-6,
                    block_m=c.block_m,
                    block_n=c.block_n,
                    block_k=c.block_k,
                    warps=c.num_warps,
                    stages=c.num_stages,
                    split_k=c.split_k,
                    inline=c.split_k_inline,
                    stream_k=c.stream_k,
                    tma=c.uses_tma,  # (the results schema's columns: benchmarks/schema.py)
                    gemv=c.kernel == "gemv",
                )
            )
        timed = [r for r in rows[-len(variants) :] if "ratio" in r] or [dict(ratio=float("nan"), impl="-")]
        best = max(timed, key=lambda r: r["ratio"])
        heur_row = next(r for r in rows[-len(variants) :] if r["impl"] == "heuristic")
        print(
            f"[{idx + 1}/{len(plan)} {time.time() - t0:.0f}s] {m}x{n}x{k} {layout}: cublas {t_cublas * 1e3:.1f}us "
            f"heur {heur_row.get('ratio', float('nan')):.3f} best {best['ratio']:.3f} {best['impl']}",
            flush=True,
        )
        del sets
        if idx % 4 == 3 or idx == len(plan) - 1:  # partial results survive a time-out
            df = save(rows, args.out, sm)
    ok = df[df.impl != "cublas"].dropna(subset=["ratio"])
    best = ok.sort_values("ratio", ascending=False).groupby(["group", "m", "n", "k"]).head(1)
    heur = ok[ok.impl == "heuristic"].set_index(["group", "m", "n", "k"]).ratio
    best = best.assign(
        heur=[heur.get((g, m, n, k)) for g, m, n, k in zip(best.group, best.m, best.n, best.k)]
    )
    best = best.dropna(subset=["heur"])
    wave = ok[ok.group.isin(["wave", "tma_streamk"])]
    if len(wave):
        # The measure: Stream-K over the same kernel and tile's sliced-K schedule.
        print("\nStream-K speedup over sliced-K, same tile (wave group)")
        sliced = wave[~wave.impl.str.contains("streamk")].set_index(["m", "n", "k", "impl"]).ms
        sk = wave[wave.impl.str.contains("streamk")]
        sk = sk.assign(tile=sk.impl.str.replace(r"[ +]streamk.*", "", regex=True))
        sk = sk.assign(
            speedup=[
                sliced.get((m, n, k, t), float("nan")) / ms
                for m, n, k, t, ms in zip(sk.m, sk.n, sk.k, sk.tile, sk.ms)
            ]
        )
        print(sk[["m", "n", "k", "impl", "ratio", "speedup"]].to_string(index=False, float_format="%.3f"))
    for g, sub in best.groupby("group"):
        gm_best = math.exp(sum(math.log(r) for r in sub.ratio) / len(sub))
        gm_heur = math.exp(sum(math.log(r) for r in sub.heur) / len(sub))
        print(f"\n{g}: geomean best {gm_best:.3f}, heuristic {gm_heur:.3f}")
        print(
            sub[["m", "n", "k", "impl", "ratio", "heur", "gbps"]].to_string(index=False, float_format="%.3f")
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
