"""The Hopper TMA kernel (``kernels/gemm_tma.py``): descriptors, data-parallel or persistent grid, Stream-K."""

from __future__ import annotations

import triton

from ..kernels import gemm_tma_kernel
from ..planning.eligibility import tensor_descriptor_class
from .common import KernelArgs, Launch
from .pointer import epilogue_constexprs, mainloop_constexprs
from .stream_k import StreamKBuffers

RUNTIME = ("a_desc", "b_desc", "c_desc", "d_ptr", "r_ptr", "z_ptr", "ws_ptr", "count_ptr", "alpha", "beta")


def descriptor(t, rows_block: int, cols_block: int):
    """A descriptor of ``t`` (2-D) in the orientation whose last stride is 1, and whether ``t`` was row-major."""
    TensorDescriptor = tensor_descriptor_class()
    r, c = t.shape[-2:]
    if t.stride(-1) == 1:
        return TensorDescriptor(t, [r, c], [t.stride(-2), 1], [rows_block, cols_block]), True
    return TensorDescriptor(t, [c, r], [t.stride(-1), 1], [cols_block, rows_block]), False


class TmaLauncher:
    takes_bases = True  # reads only data pointers (see ``launch.launcher_for``)

    def __init__(self, plan, call, a, b, out, d, r, z, interpreting: bool):
        cfg = plan.config
        # A batch of one, as 2-D views that keep the strides (reshape would re-derive a size-1 dim's
        # stride, e.g. (1, 7) in a padded workspace of rows of 8 -> (7, 1), which TMA rejects).
        a2, b2, c2, d2, r2 = (t[(0,) * (t.dim() - 2)] for t in (a, b, out, d, r))
        M, K = a2.shape
        N = b2.shape[1]
        # Descriptor templates: per call only the base tensor changes.
        self.a_desc, a_kmajor = descriptor(a2, cfg.block_m, cfg.block_k)
        self.b_desc, b_kmajor = descriptor(b2, cfg.block_k, cfg.block_n)
        self.c_desc, _ = descriptor(
            c2, cfg.block_m, cfg.block_n // 2 if cfg.epilogue_subtile else cfg.block_n
        )
        tiles = triton.cdiv(M, cfg.block_m) * triton.cdiv(N, cfg.block_n)
        programs = min(plan.device.sm_count, tiles) if cfg.kernel == "tma_persistent" else tiles
        dp_tiles, iters_per_program = tiles, 0
        self.buffers = None
        if cfg.stream_k:
            self.buffers = StreamKBuffers(cfg, a, tiles, K, plan.device.sm_count)
            programs, dp_tiles, iters_per_program, _ = self.buffers.schedule
        self.main = Launch(
            KernelArgs(
                gemm_tma_kernel,
                RUNTIME,
                M=M,
                N=N,
                K=K,
                stride_dm=d2.stride(0),
                stride_dn=d2.stride(1),
                stride_rm=r2.stride(0),
                stride_rn=r2.stride(1),
                stride_zm=c2.stride(0),
                stride_zn=c2.stride(1),
                num_programs=programs,
                dp_tiles=dp_tiles,
                iters_per_program=iters_per_program,
                **mainloop_constexprs(call, cfg, a.dtype, interpreting),
                **epilogue_constexprs(call, d2),
                A_KMAJOR=a_kmajor,
                B_KMAJOR=b_kmajor,
                FLATTEN=False,
                WARP_SPECIALIZE=False,  # (tl.range's; the warp-specialized kernel is Gluon's: gluon_ws)
                EPILOGUE_SUBTILE=cfg.epilogue_subtile,
                STREAM_K=cfg.stream_k,
            ),
            (programs,),
            cfg.num_warps,
            cfg.num_stages,
            descriptors=dict(a_desc=self.a_desc, b_desc=self.b_desc, c_desc=self.c_desc),
        )
        # Every launch rebases the templates, so they need no tensor: a cached launcher must not keep
        # the first call's operands (or an aligned launcher's template workspaces) alive.
        for template in (self.a_desc, self.b_desc, self.c_desc):
            template.base = None

    def __call__(self, a, b, out, d, r, z, alpha, beta):
        ws, counts = (
            self.buffers.get(a.device) if self.buffers is not None else (out, out)
        )  # unread without STREAM_K
        self.main(a, b, out, d, r, z, ws, counts, alpha, beta)  # the launch puts a, b, out in descriptors
