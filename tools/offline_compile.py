"""Compile tritongemm's kernels for a GPU target on a machine without a GPU.

    python tools/offline_compile.py [--arch 90] [--dump DIR]

Runs Triton's whole pipeline (TTIR -> TTGIR -> LLVM -> PTX -> cubin through the
bundled ptxas) for a set of representative specializations, and prints shared
memory and whether wgmma / TMA instructions are in the PTX.  Catches compile
errors of the GPU's Triton version (install it in a side venv: the kernel
modules import only triton) without spending GPU time.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import traceback

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

HERE = os.path.dirname(os.path.abspath(__file__))
KERNELS = os.path.join(HERE, "..", "tritongemm", "kernels")


class _FakeDriver:
    """Enough of a driver for the compiler to ask which target it builds for."""

    def __init__(self, target):
        self.target = target

    def get_current_target(self):
        return self.target


def _load(name):
    # Load the kernel modules as a package without importing tritongemm (and torch).
    pkg = "tgk"
    if pkg not in sys.modules:
        spec = importlib.util.spec_from_file_location(
            pkg, os.path.join(KERNELS, "__init__.py"), submodule_search_locations=[KERNELS]
        )
        mod = importlib.util.module_from_spec(spec)
        sys.modules[pkg] = mod
    spec = importlib.util.spec_from_file_location(f"{pkg}.{name}", os.path.join(KERNELS, f"{name}.py"))
    mod = importlib.util.module_from_spec(spec)
    sys.modules[f"{pkg}.{name}"] = mod
    spec.loader.exec_module(mod)
    return mod


def compile_one(kernel, types: dict, constexprs: dict, target, num_warps: int, num_stages: int):
    """Specialize as the launcher would for 16-byte-aligned pointers and sizes."""
    sig, attrs = {}, {}
    for i, name in enumerate(kernel.arg_names):
        if name in constexprs:
            sig[name] = "constexpr"
        else:
            sig[name] = types[name]
            if types[name].startswith("*") or types[name] == "i32":
                attrs[(i,)] = [["tt.divisibility", 16]]
    src = ASTSource(kernel, sig, constexprs, attrs)
    return triton.compile(src, target=target, options=dict(num_warps=num_warps, num_stages=num_stages))


def pointer_cases():
    # NN layout: the unit strides are specialized to the constant 1, as at launch.
    base = dict(
        HINT_AM=1,
        HINT_AK=1,
        HINT_BK=1,
        HINT_BN=1,
        HINT_CM=1,
        HINT_CN=1,
        stride_ak=1,
        stride_bn=1,
        stride_cn=1,
        stride_dn=1,
        GROUP_M=8,
        SPLIT_K=False,
        REDUCE_INLINE=False,
        ACTIVATION="none",
        HAS_RESIDUAL=False,
        STORE_PREACT=False,
        HAS_ALPHA=False,
        ADDEND="none",
        INDEX_64=False,
        UPCAST_OPERANDS=False,
        # Unscaled calls fix the fp8 scales to None (launch.pointer.scaling_args).
        sa_ptr=None,
        sb_ptr=None,
        SCALING="none",
        MAX_IMPRECISE_ACC=None,
        SCALE_BLOCK_A=0,  # (block-scaled fp8 only)
        SCALE_BLOCK_B=0,
    )
    yield (
        "ptr-fp16-128x256x64-s3",
        "fp16",
        dict(base, BLOCK_M=128, BLOCK_N=256, BLOCK_K=64, EVEN_K=True, ACC_FP64=False, DOT_PRECISION="ieee"),
        8,
        3,
    )
    yield (
        "ptr-fp32-tf32-s3",
        "fp32",
        dict(base, BLOCK_M=128, BLOCK_N=128, BLOCK_K=32, EVEN_K=False, ACC_FP64=False, DOT_PRECISION="tf32"),
        8,
        3,
    )
    yield (
        "ptr-fp64-s2",
        "fp64",
        dict(base, BLOCK_M=64, BLOCK_N=64, BLOCK_K=16, EVEN_K=False, ACC_FP64=True, DOT_PRECISION="ieee"),
        4,
        2,
    )
    yield (
        "ptr-bf16-int64-addend",
        "bf16",
        dict(
            base,
            BLOCK_M=64,
            BLOCK_N=128,
            BLOCK_K=64,
            EVEN_K=False,
            ACC_FP64=False,
            DOT_PRECISION="ieee",
            INDEX_64=True,
            ADDEND="full",
            HAS_ALPHA=True,
            ACTIVATION="gelu",
            HAS_RESIDUAL=True,
            STORE_PREACT=True,
        ),
        4,
        4,
    )
    yield (
        "ptr-fp16-splitk",
        "fp16",
        dict(
            base,
            BLOCK_M=16,
            BLOCK_N=128,
            BLOCK_K=64,
            EVEN_K=True,
            SPLIT_K=True,
            ACC_FP64=False,
            DOT_PRECISION="ieee",
        ),
        4,
        4,
    )
    yield (
        "ptr-fp16-splitk-inline",
        "fp16",
        dict(
            base,
            BLOCK_M=16,
            BLOCK_N=128,
            BLOCK_K=64,
            EVEN_K=True,
            SPLIT_K=True,
            REDUCE_INLINE=True,
            ADDEND="full",
            ACC_FP64=False,
            DOT_PRECISION="ieee",
        ),
        4,
        4,
    )


def pointer_fp8_cases():
    """fp8 operands on the pointer kernel (the layouts wgmma's K-major rule sends there), bf16 out."""
    for scaling, imprecise in (("rowwise", 128), ("tensorwise", None)):
        consts = {k: v for k, v in next(pointer_cases())[2].items() if k not in ("sa_ptr", "sb_ptr")}
        consts.update(
            BLOCK_M=128, BLOCK_N=128, BLOCK_K=128, EVEN_K=True, ACC_FP64=False, DOT_PRECISION="ieee",
            SCALING=scaling, MAX_IMPRECISE_ACC=imprecise, ADDEND="full",
        )  # fmt: skip
        yield (f"ptr-fp8-{scaling}-{'precise' if imprecise else 'fast'}", "fp8e4nv", consts, 8, 3)


def tma_cases():
    for a_k, b_k, persistent, ws, sub in [
        (True, True, False, False, False),
        (True, False, True, False, True),
        (False, True, True, False, False),
        (False, False, True, True, False),
    ]:
        yield (
            (
                f"tma-fp16-A{'K' if a_k else 'M'}-B{'K' if b_k else 'N'}-{'pers' if persistent else 'dp'}"
                f"{'-ws' if ws else ''}{'-sub' if sub else ''}"
            ),
            "fp16",
            dict(
                BLOCK_M=128,
                BLOCK_N=256,
                BLOCK_K=64,
                GROUP_M=8,
                A_KMAJOR=a_k,
                B_KMAJOR=b_k,
                HAS_ALPHA=False,
                ADDEND="full",
                FLATTEN=False,
                ACTIVATION="gelu_tanh" if sub else "silu",
                HAS_RESIDUAL=persistent,
                STORE_PREACT=persistent,
                WARP_SPECIALIZE=ws,
                EPILOGUE_SUBTILE=sub,
                DOT_PRECISION="ieee",
                UPCAST_OPERANDS=False,
                STREAM_K=False,
            ),
            8,
            3,
        )
    yield (
        "tma-fp16-streamk-sub",
        "fp16",
        dict(
            BLOCK_M=128,
            BLOCK_N=256,
            BLOCK_K=64,
            GROUP_M=8,
            A_KMAJOR=True,
            B_KMAJOR=False,
            HAS_ALPHA=False,
            ADDEND="full",
            FLATTEN=False,
            ACTIVATION="gelu",
            HAS_RESIDUAL=False,
            STORE_PREACT=False,
            WARP_SPECIALIZE=False,
            EPILOGUE_SUBTILE=True,
            DOT_PRECISION="ieee",
            UPCAST_OPERANDS=False,
            STREAM_K=True,
        ),
        8,
        3,
    )


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--arch", type=int, default=90)
    parser.add_argument("--dump", default=None)
    parser.add_argument("--only", default="")
    args = parser.parse_args()
    target = GPUTarget("cuda", args.arch, 32)
    triton.runtime.driver.set_active(_FakeDriver(target))
    print(f"triton {triton.__version__}, target sm_{args.arch}")
    gemm = _load("gemm").gemm_kernel
    gemv = _load("gemv").gemv_kernel
    streamk = _load("gemm_streamk").streamk_kernel
    tma = None
    try:
        tma = _load("gemm_tma").gemm_tma_kernel
    except Exception:
        traceback.print_exc()
    failures = 0
    cases = [(gemm, *c) for c in pointer_cases()] + [(gemm, *c) for c in pointer_fp8_cases()]
    gemv_base = dict(
        stride_ak=1,
        stride_bk=1,
        stride_cn=1,
        stride_dn=1,
        EVEN_K=True,
        HAS_ALPHA=False,
        ADDEND="full",
        ACTIVATION="silu",
        HAS_RESIDUAL=False,
        STORE_PREACT=False,
        INDEX_64=False,
        ACC_FP64=False,
    )
    cases += [
        (
            gemv,
            "gemv-fp16-32x256",
            "fp16",
            dict(gemv_base, BLOCK_N=32, BLOCK_K=256, SPLIT_K=False, REDUCE_INLINE=False),
            4,
            3,
        ),
        (
            gemv,
            "gemv-bf16-splitk-inline",
            "bf16",
            dict(gemv_base, BLOCK_N=64, BLOCK_K=128, SPLIT_K=True, REDUCE_INLINE=True),
            4,
            3,
        ),
    ]
    sk_base = dict(
        stride_ak=1,
        stride_bn=1,
        stride_cn=1,
        stride_dn=1,
        GROUP_M=8,
        EVEN_K=True,
        HAS_ALPHA=False,
        ADDEND="none",
        ACTIVATION="none",
        HAS_RESIDUAL=False,
        STORE_PREACT=False,
        ACC_FP64=False,
        DOT_PRECISION="ieee",
        UPCAST_OPERANDS=False,
    )
    cases += [
        (
            streamk,
            "streamk-fp16-128x128x64-s4",
            "fp16",
            dict(sk_base, BLOCK_M=128, BLOCK_N=128, BLOCK_K=64),
            8,
            4,
        ),
        (
            streamk,
            "streamk-bf16-128x256x64-s3-gelu",
            "bf16",
            dict(sk_base, BLOCK_M=128, BLOCK_N=256, BLOCK_K=64, ADDEND="row", ACTIVATION="gelu"),
            8,
            3,
        ),
    ]
    if tma is not None:
        cases += [(tma, *c) for c in tma_cases()]
    for kernel, name, dt, consts, warps, stages in cases:
        if args.only and args.only not in name:
            continue
        if kernel is not tma:
            types = {
                n: (f"*{dt}" if n.endswith("_ptr") else "fp32" if n in ("alpha", "beta") else "i32")
                for n in kernel.arg_names
            }
            types.update(ws_ptr="*fp32", count_ptr="*i32")
            if consts.get("SCALING", "none") != "none":  # fp8 in, bf16 out, fp32 scales
                types.update({n: "*bf16" for n in ("c_ptr", "d_ptr", "r_ptr", "z_ptr")})
                types.update(sa_ptr="*fp32", sb_ptr="*fp32")
        else:
            bm, bn, bk = consts["BLOCK_M"], consts["BLOCK_N"], consts["BLOCK_K"]
            a_block = [bm, bk] if consts["A_KMAJOR"] else [bk, bm]
            b_block = [bk, bn] if consts["B_KMAJOR"] else [bn, bk]
            c_block = [bm, bn // 2] if consts["EPILOGUE_SUBTILE"] else [bm, bn]
            types = {n: "i32" for n in kernel.arg_names}
            types.update(
                a_desc=f"tensordesc<{dt}{a_block}>",
                b_desc=f"tensordesc<{dt}{b_block}>",
                c_desc=f"tensordesc<{dt}{c_block}>",
                d_ptr=f"*{dt}",
                r_ptr=f"*{dt}",
                z_ptr=f"*{dt}",
                ws_ptr="*fp32",
                count_ptr="*i32",
                alpha="fp32",
                beta="fp32",
            )
        try:
            k = compile_one(kernel, types, consts, target, warps, stages)
            ptx = k.asm["ptx"]
            print(
                f"OK   {name:40s} smem={k.metadata.shared:6d}B wgmma={'wgmma' in ptx} "
                f"tma={'cp.async.bulk.tensor' in ptx} cp.async={'cp.async.cg' in ptx or 'cp.async.ca' in ptx}"
            )
            if args.dump:
                os.makedirs(args.dump, exist_ok=True)
                for ext in ("ttgir", "ptx"):
                    with open(os.path.join(args.dump, f"{name}.{ext}"), "w") as f:
                        f.write(k.asm[ext])
        except Exception as e:
            failures += 1
            msg = "".join(traceback.format_exception_only(type(e), e)).strip().splitlines()
            print(f"FAIL {name:40s} {' | '.join(msg[-6:])[:1500]}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
