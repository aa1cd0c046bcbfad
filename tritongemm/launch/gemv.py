"""The GEMV kernel (``kernels/gemv.py``): one row of A, with the GEMM's split-K and epilogue."""

from __future__ import annotations

import torch
import triton

from ..kernels import gemv_kernel, splitk_reduce_kernel
from .common import KernelArgs, Launch, arrival_counters, needs_index_64, workspace_dtype
from .pointer import REDUCE_RUNTIME, RUNTIME, SplitK, epilogue_constexprs


class GemvLauncher:
    takes_bases = True  # reads only data pointers (see ``launch.launcher_for``)

    def __init__(self, plan, call, a, b, out, d, r, z, interpreting: bool):
        cfg = plan.config
        a2, b2, c2, d2, r2 = (t.reshape(t.shape[-2:]) for t in (a, b, out, d, r))  # one row, unbatched: views
        K, N = b2.shape
        split = SplitK(cfg, K)
        self.splits, self.inline = split.splits, split.inline
        epilogue = epilogue_constexprs(call, d)
        acc_fp64 = a.dtype == torch.float64
        self.main = Launch(
            KernelArgs(
                gemv_kernel,
                RUNTIME,
                N=N,
                K=K,
                stride_ak=a2.stride(1),
                stride_bk=b2.stride(0),
                stride_bn=b2.stride(1),
                stride_cn=c2.stride(1),
                stride_dn=d2.stride(1),
                stride_rn=r2.stride(1),
                k_per_split=split.k_per_split if split.splits > 1 else 0,
                stride_split=N if split.splits > 1 else 0,
                BLOCK_N=cfg.block_n,
                BLOCK_K=cfg.block_k,
                EVEN_K=(K % cfg.block_k == 0),
                **epilogue,
                INDEX_64=needs_index_64(a, b, out, d, r),
                ACC_FP64=acc_fp64,
                SPLIT_K=split.splits > 1,
                REDUCE_INLINE=split.inline,
            ),
            (triton.cdiv(N, cfg.block_n), split.splits),
            cfg.num_warps,
            cfg.num_stages,
        )
        if split.splits > 1:
            self.ws_shape = (split.splits, 1, 1, N)
            self.ws_dtype = workspace_dtype(a.dtype)
            self.counters = triton.cdiv(N, cfg.block_n)
        if split.splits > 1 and not split.inline:
            block_m, block_n = 32, 64
            self.reduce = Launch(
                KernelArgs(
                    splitk_reduce_kernel,
                    REDUCE_RUNTIME,
                    M=1,
                    N=N,
                    SPLITS=split.splits,
                    stride_split=N,
                    stride_cb=0,
                    stride_cm=c2.stride(0),
                    stride_cn=c2.stride(1),
                    stride_db=0,
                    stride_dm=d2.stride(0),
                    stride_dn=d2.stride(1),
                    stride_rb=0,
                    stride_rm=r2.stride(0),
                    stride_rn=r2.stride(1),
                    BLOCK_M=block_m,
                    BLOCK_N=block_n,
                    **epilogue,
                    ACC_FP64=acc_fp64,
                    sa_ptr=None,  # (unscaled: the plan runs fp8 on the pointer and Gluon kernels only)
                    sb_ptr=None,
                    SCALING="none",
                ),
                (triton.cdiv(N, block_n),),
                4,
                3,
            )

    def __call__(self, a, b, out, d, r, z, alpha, beta):
        if self.splits == 1:
            self.main(a, b, out, d, r, z, out, out, alpha, beta)
            return
        ws = torch.empty(*self.ws_shape, dtype=self.ws_dtype, device=a.device)
        counts = arrival_counters(a.device, self.counters) if self.inline else ws
        self.main(a, b, out, d, r, z, ws, counts, alpha, beta)
        if not self.inline:
            self.reduce(ws, out, d, r, z, alpha, beta)
