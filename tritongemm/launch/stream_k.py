"""The Stream-K kernel (``kernels/gemm_streamk.py``): one program per SM sharing all K-steps."""

from __future__ import annotations

import torch
import triton

from ..kernels import streamk_kernel
from ..planning.schedules import StreamKSchedule, split_tail_schedule, stream_k_schedule
from .common import KernelArgs, Launch, arrival_counters, workspace_dtype
from .pointer import RUNTIME, epilogue_constexprs, mainloop_constexprs


class StreamKBuffers:
    """Stream-K's schedule, and the per-tile arrival counters and per-program partial slots it needs
    (shared by this kernel, the TMA kernel's Stream-K and, with ``split_tail``, the Gluon kernel's)."""

    def __init__(self, cfg, a: torch.Tensor, tiles: int, K: int, sm_count: int, split_tail: bool = False):
        schedule = split_tail_schedule if split_tail else stream_k_schedule
        self.schedule: StreamKSchedule = schedule(tiles, triton.cdiv(K, cfg.block_k), sm_count)
        self.counters = tiles - self.schedule.dp_tiles
        self.ws_shape = (self.schedule.programs, cfg.block_m, cfg.block_n)
        self.ws_dtype = workspace_dtype(a.dtype)

    def get(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """(workspace, counters) for one launch.  Each program's slot is written before it is read in
        the same launch, so the workspace needs no zeroing (it comes from torch's caching allocator)."""
        ws = torch.empty(*self.ws_shape, dtype=self.ws_dtype, device=device)
        return ws, arrival_counters(device, self.counters)


class StreamKLauncher:
    takes_bases = True  # reads only data pointers (see ``launch.launcher_for``)

    def __init__(self, plan, call, a, b, out, d, r, z, interpreting: bool):
        cfg = plan.config
        a2, b2, c2, d2, r2 = (t.reshape(t.shape[-2:]) for t in (a, b, out, d, r))  # a batch of one: views
        M, K = a2.shape
        N = b2.shape[1]
        self.buffers = StreamKBuffers(
            cfg, a, triton.cdiv(M, cfg.block_m) * triton.cdiv(N, cfg.block_n), K, plan.device.sm_count
        )
        sk = self.buffers.schedule
        self.main = Launch(
            KernelArgs(
                streamk_kernel,
                RUNTIME,
                M=M,
                N=N,
                K=K,
                stride_am=a2.stride(0),
                stride_ak=a2.stride(1),
                stride_bk=b2.stride(0),
                stride_bn=b2.stride(1),
                stride_cm=c2.stride(0),
                stride_cn=c2.stride(1),
                stride_dm=d2.stride(0),
                stride_dn=d2.stride(1),
                stride_rm=r2.stride(0),
                stride_rn=r2.stride(1),
                dp_tiles=sk.dp_tiles,
                iters_per_program=sk.iters_per_program,
                **mainloop_constexprs(call, cfg, a.dtype, interpreting),
                **epilogue_constexprs(call, d2),
                EVEN_K=(K % cfg.block_k == 0),
                ACC_FP64=(a.dtype == torch.float64),
            ),
            (sk.programs,),
            cfg.num_warps,
            cfg.num_stages,
        )

    def __call__(self, a, b, out, d, r, z, alpha, beta):
        ws, counts = self.buffers.get(a.device)
        self.main(a, b, out, d, r, z, ws, counts, alpha, beta)
