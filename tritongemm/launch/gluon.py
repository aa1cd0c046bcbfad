"""The warp-specialized Gluon kernel (``kernels/gemm_gluon.py``): descriptors with explicit shared layouts,
a persistent grid of one program per SM.

Reads from ``plan.config``: ``block_m``, ``block_n`` (a power of two, or the sum
of two: see ``configs.split_width``; its accumulators: ``TileConfig.accumulator_widths``),
``epilogue_subtile`` (a power-of-two tile as two halves through one half-width staging
buffer), ``block_k``, ``group_m``, ``num_stages`` (the ring's slots), ``num_warps`` (the
warps of each consumer: 4 per warpgroup; the producer warp comes on top), ``pingpong`` (two
consumers on alternate tiles, else one; block-scaled fp8: two consumers on the two halves of every tile) and ``stream_k`` (whole waves, then the last wave's
tiles split into K-chunks: ``schedules.split_tail_schedule``, with ``StreamKBuffers``'
workspace and counters), ``cluster_m`` / ``cluster_n`` (two CTAs a cluster: the kernel's tile is
the cluster's, each descriptor's box carries the CGA layout that says which CTA holds which part,
and the grid counts clusters).
From ``plan.device``: ``sm_count``.
"""

from __future__ import annotations

import torch
import triton

from ..kernels.gemm_gluon import GLUON_AVAILABLE, GLUON_UNAVAILABLE_REASON, cluster_layouts, gemm_gluon_kernel
from ..planning.heuristics.epilogue import DERIVATIVES, TRANSCENDENTAL
from .common import KernelArgs, Launch
from .pointer import epilogue_constexprs, scaling_args
from .stream_k import StreamKBuffers

if GLUON_AVAILABLE:
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    GL_DTYPES = {
        torch.float16: gl.float16,
        torch.bfloat16: gl.bfloat16,
        torch.float32: gl.float32,  # (C of an fp8 call)
        torch.float8_e4m3fn: gl.float8e4nv,
        torch.float8_e5m2: gl.float8e5,
    }
else:
    GL_DTYPES = {}

RUNTIME = (
    "a_desc",
    "b_desc",
    "b2_desc",
    "c_desc",
    "c2_desc",
    "d_ptr",
    "r_ptr",
    "z_ptr",
    "ws_ptr",
    "count_ptr",
    "alpha",
    "beta",
)

#: Registers per SM (every sm_90 part).
REGISTER_FILE = 65536


def descriptor(t: torch.Tensor, rows_block: int, cols_block: int, cga=None):
    """A descriptor of ``t`` (2-D) in the orientation whose last stride is 1, and whether ``t`` was row-major.
    ``cga``: the box's CGA layout in a cluster (``kernels.gluon_common.cluster_layouts``)."""
    r, c = t.shape
    if t.stride(1) == 1:
        shape, strides, block, row_major = [r, c], [t.stride(0), 1], [rows_block, cols_block], True
    else:
        shape, strides, block, row_major = [c, r], [t.stride(1), 1], [cols_block, rows_block], False
    extra = {} if cga is None else {"cga_layout": cga}
    layout = gl.NVMMASharedLayout.get_default_for(block, GL_DTYPES[t.dtype], **extra)
    return TensorDescriptor(t, shape, strides, block, layout), row_major


def epilogue_warps(call, cfg) -> int:
    """Warps that finish tiles apart from the consumer (the kernel's EPILOGUE_WARPS): 4 for an activation
    with a transcendental (GELU, SiLU) or a derivative epilogue (which also reads R:
    ``heuristics.epilogue.DERIVATIVES``) where one 4-warp consumer owns whole power-of-two tiles (with
    Stream-K, the whole tiles: the consumer finishes the streamed ones itself), else 0.

    A consumer that finishes its own tiles leaves the tensor cores idle meanwhile.  On the H100, bf16,
    128 x 128 tiles, 1024 x 14336 x 4096: bias + GELU took 218 us in the consumer, 199 us with the
    epilogue warps, 183 us without the activation; SiLU 197 and 196 us, tanh-GELU 204 and 195 us.  ReLU
    costs the consumer about 1 us, and a residual was not measured apart: both stay there."""
    ep = call.epilogue
    if ep.activation not in TRANSCENDENTAL and ep.activation not in DERIVATIVES:
        return 0
    if cfg.num_warps != 4 or cfg.pingpong or cfg.accumulator_widths[1] or cfg.cluster_m * cfg.cluster_n > 1:
        return 0
    return DERIVATIVE_EPILOGUE_WARPS if ep.activation in DERIVATIVES else 4


#: Epilogue warps for a derivative epilogue: its math and R's loads over a 128 x 128 tile outlast a
#: short-K mainloop with four.
DERIVATIVE_EPILOGUE_WARPS = 8


def max_registers(consumer_warps: int) -> int:
    """``maxnreg`` for ``consumer_warps`` (every consumer's) plus the producer, whose warp occupies a
    whole warpgroup's register allocation: the most that lets the program launch with its full register
    file.  setmaxnreg then moves the producer's unused registers to the consumers."""
    threads = (consumer_warps + 4) * 32
    return min(256, REGISTER_FILE // threads // 8 * 8)


class GluonLauncher:
    def __init__(self, plan, call, a, b, out, d, r, z, interpreting: bool):
        if not GLUON_AVAILABLE:
            raise RuntimeError(f"the Gluon kernel cannot run: {GLUON_UNAVAILABLE_REASON}")
        if interpreting:
            raise RuntimeError("Gluon kernels do not run on Triton's CPU interpreter")
        cfg = plan.config
        # A batch of one, as 2-D views that keep the strides (see TmaLauncher).
        a2, b2, c2, d2, r2 = (t[(0,) * (t.dim() - 2)] for t in (a, b, out, d, r))
        M, K = a2.shape
        N = b2.shape[1]
        if c2.stride(1) != 1:
            raise ValueError(
                "the Gluon kernel stores C through a row-major descriptor: out needs a unit last stride"
            )
        bn, bn2 = cfg.accumulator_widths
        cm, cn = cfg.cluster_m, cfg.cluster_n
        ctas = cm * cn
        # Without a second part the kernel never reads b2 / c2, and two equal halves share one box:
        # B's and C's own descriptors stand in.
        split = bn2 and bn2 != bn
        # In a cluster the kernel's tile (and each box) is the cluster's: cm x cn CTA tiles.
        block_m, bn, bn2 = cfg.block_m * cm, bn * cn, bn2 * cn
        a_cga, b_cga, c_cga = cluster_layouts(cm, cn, a2.stride(1) == 1, b2.stride(1) == 1)
        self.a_desc, a_row_major = descriptor(a2, block_m, cfg.block_k, a_cga)
        self.b_desc, b_row_major = descriptor(b2, cfg.block_k, bn, b_cga)
        consumers = 2 if cfg.pingpong else 1
        # (two consumers splitting each tile's rows store a half each)
        self.c_desc, _ = descriptor(
            c2, block_m // 2 if cfg.splits_rows(a2.dtype.itemsize) else block_m, bn, c_cga
        )
        self.b2_desc = descriptor(b2, cfg.block_k, bn2, b_cga)[0] if split else self.b_desc
        self.c2_desc = descriptor(c2, block_m, bn2, c_cga)[0] if split else self.c_desc
        finishers = epilogue_warps(call, cfg)
        tiles = triton.cdiv(M, block_m) * triton.cdiv(N, bn + bn2)
        programs = max(1, min(plan.device.sm_count // ctas, tiles))  # (clusters, in a cluster)
        dp_tiles, iters_per_program, tile_span = tiles, 0, 0
        self.buffers = None
        if cfg.stream_k:
            # (one consumer on a power-of-two block_n: TileConfig's rule)
            self.buffers = StreamKBuffers(cfg, a, tiles, K, plan.device.sm_count, split_tail=True)
            programs, dp_tiles, iters_per_program, tile_span = self.buffers.schedule
        scales, scaling = scaling_args(call, cfg.block_k, a.dtype)
        self.main = Launch(
            KernelArgs(
                gemm_gluon_kernel,
                RUNTIME + scales,
                M=M,
                N=N,
                K=K,
                dp_tiles=dp_tiles,
                iters_per_program=iters_per_program,
                tile_span=tile_span,
                stride_dm=d2.stride(0),
                stride_dn=d2.stride(1),
                stride_rm=r2.stride(0),
                stride_rn=r2.stride(1),
                stride_zm=c2.stride(0),
                stride_zn=c2.stride(1),
                BLOCK_M=block_m,
                BLOCK_N=bn,
                BLOCK_N2=bn2,
                BLOCK_K=cfg.block_k,
                GROUP_M=cfg.group_m,
                NUM_STAGES=cfg.num_stages,
                A_ROW_MAJOR=a_row_major,
                B_ROW_MAJOR=b_row_major,
                CONSUMERS=consumers,
                STREAM_K=cfg.stream_k,
                EPILOGUE_SUBTILE=cfg.epilogue_subtile,
                CLUSTER_M=cm,
                CLUSTER_N=cn,
                GATED="",
                EPILOGUE_WARPS=finishers,
                **epilogue_constexprs(call, d2),
                **scaling,
            ),
            (programs,),
            cfg.num_warps,
            cfg.num_stages,
            descriptors=dict(
                a_desc=self.a_desc,
                b_desc=self.b_desc,
                b2_desc=self.b2_desc,
                c_desc=self.c_desc,
                c2_desc=self.c2_desc,
            ),
        )
        self.main.options["maxnreg"] = max_registers(cfg.num_warps * consumers + finishers)
        if ctas > 1:
            self.main.options["num_ctas"] = ctas
        # The templates need no tensor: every launch rebases them (a cached launcher keeps no operand alive).
        for template in (self.a_desc, self.b_desc, self.b2_desc, self.c_desc, self.c2_desc):
            template.base = None

    takes_bases = True  # reads only data pointers (see ``launch.launcher_for``)

    def __call__(self, a, b, out, d, r, z, alpha, beta, *scales):
        # The launch puts a, b and out in descriptors; without STREAM_K, out stands in for the unread
        # workspace and counters.
        ws, counts = self.buffers.get(a.device) if self.buffers is not None else (out, out)
        self.main(a, b, b, out, out, d, r, z, ws, counts, alpha, beta, *scales)
