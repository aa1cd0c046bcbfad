"""The pointer kernel (``kernels/gemm.py``): sliced-K and split-K, any strides, batches."""

from __future__ import annotations

import itertools

import torch
import triton

from ..kernels import gemm_kernel, splitk_reduce_kernel
from ..planning.call import BLOCK_SCALINGS
from ..planning.eligibility import stride_hint
from .common import (
    INT32_MAX,
    KernelArgs,
    Launch,
    arrival_counters,
    collapse_batch,
    needs_index_64,
    workspace_dtype,
)

#: What a launch passes per call; every other argument is fixed when the launcher is built.
RUNTIME = ("a_ptr", "b_ptr", "c_ptr", "d_ptr", "r_ptr", "z_ptr", "ws_ptr", "count_ptr", "alpha", "beta")
REDUCE_RUNTIME = ("ws_ptr", "c_ptr", "d_ptr", "r_ptr", "z_ptr", "alpha", "beta")
#: A scaled (fp8) call's dequantization scales come last, after ``alpha`` and ``beta``.
SCALES = ("sa_ptr", "sb_ptr")


#: Precise fp8 sums: how much of K the tensor cores sum in their reduced-precision accumulator before
#: the sum is added into fp32: four wgmma 32 deep, CUTLASS's default promotion interval.
PROMOTION_K = 128


def scaling_args(call, block_k: int, dtype: torch.dtype) -> tuple[tuple[str, ...], dict]:
    """The runtime names and the fixed arguments of an fp8 call's dequantization
    (``kernels.gemm.scale_tile``) and accumulation.

    The scales are given per call when the call dequantizes, else fixed to None (never read: an
    unscaled launch passes nothing more than before).  fp8 products are summed in the tensor cores'
    reduced-precision accumulator and added into the fp32 one every ``PROMOTION_K`` of K (once per
    K-step of up to that depth), unless the call asked for fast accumulation (``precision == "fast"``:
    never, Triton's default on sm_90).  Block scales (``BLOCK_SCALINGS``) are read in the K loop, laid
    out K-block-major as ``frontend.scaled.kernel_scales`` makes them.
    """
    fp8 = dtype.itemsize == 1
    precise = fp8 and call.precision != "fast"
    fixed = dict(MAX_IMPRECISE_ACC=min(block_k, PROMOTION_K) if precise else None)
    if call.epilogue.scaling in BLOCK_SCALINGS:  # dequantized in the K loop (``gemm.k_step_scales``)
        rows, cols = BLOCK_SCALINGS[call.epilogue.scaling]
        return SCALES, dict(SCALING="blockwise", SCALE_BLOCK_A=rows, SCALE_BLOCK_B=cols, **fixed)
    fixed.update(SCALE_BLOCK_A=0, SCALE_BLOCK_B=0)
    if call.epilogue.scaling == "none":
        return (), dict(sa_ptr=None, sb_ptr=None, SCALING="none", **fixed)
    return SCALES, dict(SCALING=call.epilogue.scaling, **fixed)


def addend_kind(call, d) -> str:
    """How the kernel reads D: "none"; "row", one row repeated down the columns (a bias: D's row stride
    is 0), read once per tile column as a vector; "full", an element per output."""
    if not call.epilogue.addend:
        return "none"
    return "row" if d.dim() >= 2 and d.stride(-2) == 0 else "full"


def epilogue_constexprs(call, d) -> dict:
    """The epilogue's constexprs; ``d``: the addend as the kernel reads it (its stand-in when absent)."""
    ep = call.epilogue
    return dict(
        HAS_ALPHA=ep.scaled,
        ADDEND=addend_kind(call, d),
        ACTIVATION=ep.activation,
        HAS_RESIDUAL=ep.residual,
        STORE_PREACT=ep.store_preact,
    )


def mainloop_constexprs(call, cfg, dtype: torch.dtype, interpreting: bool) -> dict:
    return dict(
        BLOCK_M=cfg.block_m,
        BLOCK_N=cfg.block_n,
        BLOCK_K=cfg.block_k,
        GROUP_M=cfg.group_m,
        DOT_PRECISION=call.precision if dtype == torch.float32 else "ieee",
        # Triton's interpreter multiplies bf16 bit patterns in tl.dot (triton-lang/triton#11584).
        UPCAST_OPERANDS=(interpreting and dtype == torch.bfloat16),
    )


def stride_hints(a, b, out) -> dict:
    """What the kernel may assume each stride is a multiple of (the "hinted" path of docs/unaligned.md: unaligned leading
    dimensions still get the widest loads and stores they allow).  1 where Triton knows as much
    itself (it specializes strides equal to 1 and multiples of 16), so aligned launches compile as before."""
    names = ("HINT_AM", "HINT_AK", "HINT_BK", "HINT_BN", "HINT_CM", "HINT_CN")
    strides = (*a.stride()[-2:], *b.stride()[-2:], *out.stride()[-2:])
    return {n: (h if 1 < h < 16 else 1) for n, h in zip(names, map(stride_hint, strides))}


class SplitK:
    """K cut into slices of whole K-tiles (no slice empty), and how the partials are reduced."""

    def __init__(self, cfg, K: int):
        k_tiles = max(triton.cdiv(K, cfg.block_k), 1)
        splits = min(cfg.split_k, k_tiles)
        self.k_per_split = triton.cdiv(k_tiles, splits) * cfg.block_k
        self.splits = triton.cdiv(K, self.k_per_split) if K > 0 else 1
        self.inline = cfg.split_k_inline and self.splits > 1


class PointerLauncher:
    def __init__(self, plan, call, a, b, out, d, r, z, interpreting: bool):
        cfg = plan.config
        M, K = a.shape[-2:]
        N = b.shape[-1]
        tensors = [a, b, out, d, r]
        dims = collapse_batch(tuple(out.shape[:-2]), tensors)
        # The kernel indexes one batch dimension; any further (rare: a broadcast
        # dim between two non-broadcast ones) are looped over here, as views.
        self.outer = dims[:-1]
        self.takes_bases = not self.outer  # the outer loop makes views of the tensors
        batch, bs = dims[-1] if dims else (1, [0] * len(tensors))
        tiles = triton.cdiv(M, cfg.block_m) * triton.cdiv(N, cfg.block_n)
        if tiles * batch > INT32_MAX:
            raise RuntimeError(f"gemm: {tiles * batch} programs exceed the grid limit of 2^31 - 1")
        split = SplitK(cfg, K)
        self.splits, self.inline = split.splits, split.inline
        index_64 = needs_index_64(*tensors) or (split.splits > 1 and split.splits * batch * M * N > INT32_MAX)
        acc_fp64 = a.dtype == torch.float64
        epilogue = epilogue_constexprs(call, d)
        scales, scaling = scaling_args(call, cfg.block_k, a.dtype)
        self.main = Launch(
            KernelArgs(
                gemm_kernel,
                RUNTIME + scales,
                M=M,
                N=N,
                K=K,
                stride_ab=bs[0],
                stride_am=a.stride(-2),
                stride_ak=a.stride(-1),
                stride_bb=bs[1],
                stride_bk=b.stride(-2),
                stride_bn=b.stride(-1),
                stride_cb=bs[2],
                stride_cm=out.stride(-2),
                stride_cn=out.stride(-1),
                stride_db=bs[3],
                stride_dm=d.stride(-2),
                stride_dn=d.stride(-1),
                stride_rb=bs[4],
                stride_rm=r.stride(-2),
                stride_rn=r.stride(-1),
                k_per_split=split.k_per_split if split.splits > 1 else 0,
                stride_split=batch * M * N if split.splits > 1 else 0,
                **mainloop_constexprs(call, cfg, a.dtype, interpreting),
                **epilogue,
                EVEN_K=(K % cfg.block_k == 0),
                INDEX_64=index_64,
                ACC_FP64=acc_fp64,
                SPLIT_K=split.splits > 1,
                REDUCE_INLINE=split.inline,
                **stride_hints(a, b, out),
                **scaling,
            ),
            (batch * tiles, split.splits),
            cfg.num_warps,
            cfg.num_stages,
        )
        if split.splits > 1:
            self.ws_shape = (split.splits, batch, M, N)
            self.ws_dtype = workspace_dtype(a.dtype)
            self.counters = batch * tiles
        if split.splits > 1 and not split.inline:
            block_m, block_n = 32, 64  # the reduction is memory-bound: small tiles, many programs
            self.reduce = Launch(
                KernelArgs(
                    splitk_reduce_kernel,
                    REDUCE_RUNTIME + scales,
                    M=M,
                    N=N,
                    SPLITS=split.splits,
                    stride_split=batch * M * N,
                    stride_cb=bs[2],
                    stride_cm=out.stride(-2),
                    stride_cn=out.stride(-1),
                    stride_db=bs[3],
                    stride_dm=d.stride(-2),
                    stride_dn=d.stride(-1),
                    stride_rb=bs[4],
                    stride_rm=r.stride(-2),
                    stride_rn=r.stride(-1),
                    BLOCK_M=block_m,
                    BLOCK_N=block_n,
                    **epilogue,
                    ACC_FP64=acc_fp64,
                    sa_ptr=scaling.get("sa_ptr"),
                    sb_ptr=scaling.get("sb_ptr"),
                    SCALING=scaling["SCALING"],
                ),
                (batch * triton.cdiv(M, block_m) * triton.cdiv(N, block_n),),
                4,
                3,
            )

    def __call__(self, a, b, out, d, r, z, alpha, beta, *scales):
        if not self.outer:
            if self.splits == 1:  # the common launch, without a further call
                self.main(a, b, out, d, r, z, out, out, alpha, beta, *scales)
            else:
                self._one(a, b, out, d, r, z, alpha, beta, *scales)
            return
        tensors = [a, b, out, d, r, z]
        strides_of = [0, 1, 2, 3, 4, 2]  # z shares out's strides
        for index in itertools.product(*[range(size) for size, _ in self.outer]):
            views = [
                t.as_strided(
                    t.shape[-2:],
                    t.stride()[-2:],
                    t.storage_offset() + sum(i * st[strides_of[j]] for i, (_, st) in zip(index, self.outer)),
                )
                for j, t in enumerate(tensors)
            ]
            self._one(*views, alpha, beta, *scales)

    def _one(self, a, b, out, d, r, z, alpha, beta, *scales):
        if self.splits == 1:
            self.main(a, b, out, d, r, z, out, out, alpha, beta, *scales)
            return
        # Split-K: slices write fp32 partials to a workspace (from torch's caching
        # allocator: no cudaMalloc per call, and graph-capture safe); they are
        # added in slice order by the last slice to arrive or by a second kernel.
        ws = torch.empty(*self.ws_shape, dtype=self.ws_dtype, device=a.device)
        counts = arrival_counters(a.device, self.counters) if self.inline else ws
        self.main(a, b, out, d, r, z, ws, counts, alpha, beta, *scales)
        if not self.inline:
            self.reduce(ws, out, d, r, z, alpha, beta, *scales)
