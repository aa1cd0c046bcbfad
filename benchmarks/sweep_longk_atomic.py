"""Long K over few output tiles: does split-K on TMA loads, its partial sums added into an fp32 workspace
by atomic reductions, beat cuBLAS where the library's own splits do not?

The library's split-K reduces a tile's slices in the kernel, the last program to arrive adding the others'
partials one after another; with tens of slices a tile that serial read dominates.  Here every program
adds its partial into the workspace itself, so any number of slices costs one add each, spread over the
L2: either as one TMA bulk reduction of the whole tile (``cp.reduce.async.bulk.tensor``, "tma") or as
element-wise ``red`` instructions ("red").  A second small kernel converts the workspace to bf16.  The
experimental kernel lives here, not in ``tritongemm/kernels``: it is what was tried, not what runs.

Run from the repository root on the GPU machine (about two minutes):

    python -m benchmarks.sweep_longk_atomic --out DIR     # DIR/longk_atomic.json and .txt
    TRITON_INTERPRET=1 python -m benchmarks.sweep_longk_atomic --smoke   # CPU: one tiny problem, "red" only

Method: bf16, the long-K shapes of ``sweep_longk.py``, both layouts of B; each config's output is first
compared with the float64 product (relative error < 1e-2, else not timed); then
``triton.testing.do_bench`` medians (L2 flushed), the inputs rotated over copies that together exceed
twice the L2 (``testing.rotation_copies``), the workspace's zeroing and the conversion included in the
timed call; cuBLAS (``torch.matmul``) is timed before and after each shape's configs, its median the
reference.
Ratio = cuBLAS us / ours (> 1: faster).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

import torch
import triton
import triton.language as tl

from tritongemm.testing import make_matrix, relative_error, rotation_copies

from .gpu_check import rotating
from .harness import l2_cache_bytes

SHAPES = ((256, 256, 131072), (256, 256, 65536), (512, 512, 65536), (1024, 1024, 32768),
          (512, 512, 16384), (1024, 1024, 16384), (256, 1024, 65536), (1024, 256, 65536))  # fmt: skip
#: (BLOCK_M, BLOCK_N, warps); K steps and stages; programs per SM the split aims at.
TILES = ((128, 256, 8), (128, 128, 8), (128, 128, 4), (64, 256, 4))
STEPS = ((64, 4), (64, 6), (128, 3), (128, 4))
PER_SM = (1, 2)


@triton.jit
def _split_k_kernel(a_desc, b_desc, ws_desc, ws_ptr, M, N, K, k_tiles_per_slice,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                    B_KMAJOR: tl.constexpr, STAGES: tl.constexpr, TMA_REDUCE: tl.constexpr):  # fmt: skip
    tiles_n = tl.cdiv(N, BLOCK_N)
    off_m = (tl.program_id(0) // tiles_n) * BLOCK_M
    off_n = (tl.program_id(0) % tiles_n) * BLOCK_N
    first = tl.program_id(1) * k_tiles_per_slice
    last = tl.minimum(first + k_tiles_per_slice, tl.cdiv(K, BLOCK_K))
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for ki in tl.range(first, last, num_stages=STAGES):
        a = a_desc.load([off_m, ki * BLOCK_K])
        if B_KMAJOR:
            b = b_desc.load([off_n, ki * BLOCK_K]).T
        else:
            b = b_desc.load([ki * BLOCK_K, off_n])
        acc = tl.dot(a, b, acc)
    if TMA_REDUCE:
        ws_desc.atomic_add([off_m, off_n], acc)
    else:
        rows = off_m + tl.arange(0, BLOCK_M)
        cols = off_n + tl.arange(0, BLOCK_N)
        mask = (rows[:, None] < M) & (cols[None, :] < N)
        tl.atomic_add(ws_ptr + rows[:, None] * N + cols[None, :], acc, mask=mask, sem="relaxed")


@triton.jit
def _convert_kernel(ws_ptr, c_ptr, numel, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < numel
    tl.store(c_ptr + offs, tl.load(ws_ptr + offs, mask=mask).to(c_ptr.dtype.element_ty), mask=mask)


def split_k_atomic(a, b, cfg, ws, out):
    """``out = a @ b`` by ``cfg`` = (BLOCK_M, BLOCK_N, BLOCK_K, warps, stages, slices, reduction)."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    bm, bn, bk, warps, stages, slices, reduction = cfg
    m, k = a.shape
    n = b.shape[1]
    b_kmajor = b.stride(0) == 1  # the (K, N) view of an (N, K) row-major weight
    a_desc = TensorDescriptor.from_tensor(a, [bm, bk])
    b_desc = (
        TensorDescriptor.from_tensor(b.t(), [bn, bk])
        if b_kmajor
        else TensorDescriptor.from_tensor(b, [bk, bn])
    )
    ws_desc = TensorDescriptor.from_tensor(ws, [bm, bn])
    per_slice = triton.cdiv(triton.cdiv(k, bk), slices)
    grid = (triton.cdiv(m, bm) * triton.cdiv(n, bn), triton.cdiv(triton.cdiv(k, bk), per_slice))
    ws.zero_()
    _split_k_kernel[grid](a_desc, b_desc, ws_desc, ws, m, n, k, per_slice, bm, bn, bk, b_kmajor, stages,
                          reduction == "tma", num_warps=warps)  # fmt: skip
    _convert_kernel[(triton.cdiv(m * n, 1024),)](ws, out, m * n, 1024, num_warps=4)
    return out


def configs(m, n, sms, smoke=False):
    if smoke:
        return [(32, 32, 32, 4, 2, 5, "red")]
    out = []
    for bm, bn, warps in TILES:
        tiles = triton.cdiv(m, bm) * triton.cdiv(n, bn)
        for bk, stages in STEPS:
            for per_sm in PER_SM:
                for reduction in ("tma", "red"):
                    out.append((bm, bn, bk, warps, stages, max(1, sms * per_sm // tiles), reduction))
    return out


def operands(m, n, k, layout, copies, device, dtype):
    """``copies`` random (A, B) sets; B in ``layout``'s second letter ("T": the (K, N) view of a row-major
    (N, K) weight)."""
    gen = torch.Generator(device=device).manual_seed(m * 7 + n * 3 + k)
    return [
        (
            make_matrix(m, k, "N", dtype, device, generator=gen),
            make_matrix(k, n, layout[1], dtype, device, generator=gen),
        )
        for _ in range(copies)
    ]


def _alloc(size, alignment, stream):  # scratch Triton may ask for on the GPU
    return torch.empty(size, dtype=torch.int8, device="cuda")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=".", help="folder for longk_atomic.json and .txt")
    p.add_argument("--smoke", action="store_true", help="CPU interpreter: one tiny problem")
    args = p.parse_args(argv)
    smoke = args.smoke
    if not smoke:
        triton.set_allocator(_alloc)  # (process-wide: left alone in the smoke run, which tests call)
    if not smoke and not torch.cuda.is_available():
        print("needs a CUDA GPU (or --smoke with TRITON_INTERPRET=1)", file=sys.stderr)
        return 2
    device = "cpu" if smoke else "cuda"
    dtype = torch.float32 if smoke else torch.bfloat16  # (the interpreter's bf16 dot is unreliable)
    sms = 4 if smoke else torch.cuda.get_device_properties(0).multi_processor_count
    bench = (lambda f: 0.0) if smoke else (lambda f: triton.testing.do_bench(f, warmup=10, rep=40))
    records, lines = [], []
    for m, n, k in ((64, 96, 512),) if smoke else SHAPES:
        for layout in ("NN", "NT"):
            copies = (
                1 if smoke else rotation_copies((m * k + k * n) * 2, l2_cache_bytes(torch.device(device)))
            )
            sets = operands(m, n, k, layout, copies, device, dtype)
            ref = sets[0][0].double() @ sets[0][1].double()
            ws = torch.zeros(m, n, device=device, dtype=torch.float32)
            out = torch.empty(m, n, device=device, dtype=dtype)
            cublas = [bench(rotating(torch.matmul, sets))]
            rows = []
            for cfg in configs(m, n, sms, smoke):
                try:
                    got = split_k_atomic(*sets[0], cfg, ws, out).double()
                except Exception as exc:  # a config the device or this Triton cannot build
                    rows.append({"config": cfg, "status": f"error: {type(exc).__name__}"})
                    continue
                err = relative_error(got, ref)
                if not err < 1e-2:
                    rows.append({"config": cfg, "status": "wrong", "rel_err": err})
                    continue
                us = 1e3 * bench(
                    rotating(lambda a, b, cfg=cfg, ws=ws, out=out: split_k_atomic(a, b, cfg, ws, out), sets)
                )
                rows.append({"config": cfg, "status": "ok", "rel_err": err, "us": us})
            cublas.append(bench(rotating(torch.matmul, sets)))
            cublas_us = 1e3 * statistics.median(cublas)
            for r in rows:
                r.update(m=m, n=n, k=k, layout=layout, cublas_us=cublas_us)
                if r["status"] == "ok" and r["us"] > 0:
                    r["ratio"] = cublas_us / r["us"]
            records += rows
            timed = [r for r in rows if "ratio" in r]
            best = max(timed, key=lambda r: r["ratio"]) if timed else None
            line = f"{m}x{n}x{k} {layout}: cuBLAS {cublas_us:.1f} us; " + (
                f"best {best['config']} {best['us']:.1f} us, ratio {best['ratio']:.3f}" if best else
                f"{sum(r['status'] == 'ok' for r in rows)} configs correct (not timed)"
            )  # fmt: skip
            print(line, flush=True)
            lines.append(line)
    env = {"gpu": "interpreter" if smoke else torch.cuda.get_device_name(), "torch": torch.__version__,
           "triton": triton.__version__}  # fmt: skip
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "longk_atomic.json"), "w") as f:  # a record a line
        f.write(
            f'{{"env": {json.dumps(env)}, "records": [\n' + ",\n".join(map(json.dumps, records)) + "\n]}\n"
        )
    with open(os.path.join(args.out, "longk_atomic.txt"), "w") as f:
        f.write(f"# {__doc__.splitlines()[0]}\n# {env}\n" + "\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
