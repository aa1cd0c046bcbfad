"""The gated GEMM of a GLU MLP: ``h = act(x @ w_gate.T + b_gate) * (x @ w_up.T + b_up)`` in one kernel.

Llama, Qwen and Mistral MLPs compute ``down(silu(gate(x)) * up(x))`` (SwiGLU); Gemma's uses the tanh
GELU (GeGLU).  Stock PyTorch runs the gate and up projections as two GEMMs, each storing an M x N
tensor, then one or two elementwise passes over both.  Here one program computes a tile of the gate
and the same tile of the up projection from the same A tiles (two accumulators), applies the
activation and the product in its epilogue and stores one tile of ``h``.  Backward needs the
pre-activations: ``save=(g, u)`` stores them too.

Two kernels: on Hopper, the warp-specialized Gluon kernel in its GATED mode (TMA operands: unit last
strides, 16-byte aligned rows); elsewhere, and on the CPU interpreter, ``kernels.gated``.
"""

from __future__ import annotations

from functools import partial

import torch
import triton

from .. import launch as _launch  # (the package, for its plan cache: this module loads after it)
from ..device import device_info, interpreter_enabled
from ..kernels.gated import gated_kernel
from ..kernels.gemm_gluon import GLUON_AVAILABLE, gemm_gluon_kernel
from .common import KernelArgs, Launch, warming
from .gluon import descriptor, max_registers
from .keys import layout_signature

GATED_ACTIVATIONS = ("silu", "gelu_tanh", "gelu")

_GLUON_RUNTIME = ("a_desc", "b_desc", "b2_desc", "c_desc", "c2_desc", "d_ptr", "r_ptr", "z_ptr")


def gated_gemm(
    x: torch.Tensor,
    w_gate: torch.Tensor,
    w_up: torch.Tensor,
    activation: str = "silu",
    b_gate: torch.Tensor | None = None,
    b_up: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    save: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> torch.Tensor:
    """``act(x @ w_gate.T + b_gate) * (x @ w_up.T + b_up)``.

    x: (M, K); w_gate, w_up: (N, K) as ``nn.Linear`` stores them; b_gate, b_up: (N,) or None; all one
    dtype (fp16, bf16, fp32), one device.  ``out``: an (M, N) tensor to write (else one is made).
    ``save``: two (M, N) tensors that receive the pre-activations ``g`` and ``u`` (for backward).  No
    checks here: the caller validated the operands.
    """
    if activation not in GATED_ACTIVATIONS:
        raise ValueError(f"gated_gemm: activation must be one of {GATED_ACTIVATIONS}, got {activation!r}")
    if (b_gate is None) != (b_up is None):  # the kernels add both or neither: the missing one is zeros
        b_gate, b_up = (
            b if b is not None else torch.zeros_like(b_gate if b_up is None else b_up) for b in (b_gate, b_up)
        )
    M = x.shape[0]
    N = w_gate.shape[0]
    if out is None:
        out = torch.empty((M, N), dtype=x.dtype, device=x.device)
    if M == 0 or N == 0:
        return out
    g, u = save if save is not None else (out, out)
    bg, bu = (b_gate, b_up) if b_gate is not None else (out, out)
    key = (
        "gated",
        activation,
        b_gate is not None,
        save is not None,
        layout_signature(x, w_gate, w_up, out, g, u),
    )
    launcher = _launch.PLANS.launchers.get(key)  # the one cache of launchers (``clear_plan_cache``)
    if launcher is None:
        if save is not None and not (g.stride() == u.stride() == out.stride()):
            raise ValueError("gated_gemm: the saved pre-activations must have the output's strides")
        kind = GluonGated if gluon_eligible(x, w_gate, w_up, out, save) else PointerGated
        launcher = _launch.PLANS.keep(
            key, kind(x, w_gate, w_up, out, activation, b_gate is not None, save is not None)
        )
    _launch.run_on(x.device, launcher, x, w_gate, w_up, out, bg, bu, g, u)
    return out


def gluon_eligible(x, w_gate, w_up, out, save, aligned=lambda t: t.data_ptr() % 16 == 0) -> bool:
    """Whether the Gluon kernel can take these tensors: sm_90, 16-bit, every TMA operand (all but the
    pointer-stored ``u``) row-major with 16-byte aligned rows and base (``aligned``)."""
    if not GLUON_AVAILABLE or interpreter_enabled() or x.device.type != "cuda":
        return False
    if not device_info(x.device).is_hopper or x.dtype not in (torch.float16, torch.bfloat16):
        return False
    tensors = (x, w_gate, w_up, out) + ((save[0],) if save is not None else ())
    return all(t.stride(1) == 1 and t.stride(0) % 8 == 0 and aligned(t) for t in tensors)


def precompile(x, w_gate, w_up, out, activation: str, biased: bool, save):
    """Start compiling the kernel ``gated_gemm`` would launch on tensors laid out as these (a trace's
    fake tensors: their bases taken as 16-byte aligned) on ``launch.precompile``'s worker; its future,
    or None."""
    from . import precompile as worker

    if x.device.type != "cuda" or interpreter_enabled():
        return None
    if not all(type(v) is int for t in (x, w_gate, w_up) for v in (*t.shape, *t.stride())):
        return None  # (symbolic sizes)
    gluon = gluon_eligible(
        x, w_gate, w_up, out, save, lambda t: t.storage_offset() * t.element_size() % 16 == 0
    )
    kind = GluonGated if gluon else PointerGated
    g, u = save if save is not None else (None, None)
    warm_up = partial(_warm, kind, activation, biased, save is not None, device_info(x.device).sm_count)
    return worker.request(("gated", kind.__name__, activation, biased), warm_up, x, w_gate, w_up, out, g, u)


def _warm(kind, activation, biased, saved, sm_count, x, w_gate, w_up, out, g, u) -> None:
    launcher = kind(x, w_gate, w_up, out, activation, biased, saved, sm_count)
    g, u = (g, u) if saved else (out, out)
    with warming():  # (``out`` stands in for the biases: the same dtype)
        launcher(x, w_gate, w_up, out, out, out, g, u)


class PointerGated:
    """``kernels.gated.gated_kernel``: any strides, any GPU, the interpreter."""

    def __init__(self, x, w_gate, w_up, out, activation, biased, saved, sm_count=None):
        """(``sm_count``: unread, its grid covers every tile; taken as ``GluonGated`` takes it.)"""
        M, K = x.shape
        N = w_gate.shape[0]
        if interpreter_enabled():
            bm, bn, bk, warps, stages = 32, 32, 32, 4, 1
        else:
            bm, bn, bk, warps, stages = 128, 64, 32, 4, 3
        self.launch = Launch(
            KernelArgs(
                gated_kernel,
                ("x_ptr", "wg_ptr", "wu_ptr", "h_ptr", "bg_ptr", "bu_ptr", "g_ptr", "u_ptr"),
                M=M,
                N=N,
                K=K,
                stride_xm=x.stride(0),
                stride_xk=x.stride(1),
                stride_gn=w_gate.stride(0),
                stride_gk=w_gate.stride(1),
                stride_un=w_up.stride(0),
                stride_uk=w_up.stride(1),
                stride_hm=out.stride(0),
                stride_hn=out.stride(1),
                BLOCK_M=bm,
                BLOCK_N=bn,
                BLOCK_K=bk,
                GROUP_M=8,
                ACTIVATION=activation,
                HAS_BIAS=biased,
                SAVE=saved,
                EVEN_K=K % bk == 0,
                # Triton's interpreter multiplies bf16 bit patterns in tl.dot (triton-lang/triton#11584).
                UPCAST_OPERANDS=interpreter_enabled() and x.dtype == torch.bfloat16,
            ),
            (triton.cdiv(M, bm) * triton.cdiv(N, bn),),
            warps,
            stages,
        )

    def __call__(self, x, w_gate, w_up, out, bg, bu, g, u):
        self.launch(x, w_gate, w_up, out, bg, bu, g, u)


class GluonGated:
    """The warp-specialized Gluon kernel's GATED mode: 128 x 128 tiles of ``h``, each from a 128-wide
    tile of both weights (two accumulators, cooperative: two consumer warpgroups of 64 rows each)."""

    BLOCK_M, BLOCK_N, BLOCK_K = 128, 128, 64

    def __init__(self, x, w_gate, w_up, out, activation, biased, saved, sm_count=None):
        """``sm_count``: the GPU's (default: ``x``'s device's)."""
        M, K = x.shape
        N = w_gate.shape[0]
        bm, bn, bk = self.BLOCK_M, self.BLOCK_N, self.BLOCK_K
        self.a_desc, _ = descriptor(x, bm, bk)
        self.b_desc, _ = descriptor(w_gate.mT, bk, bn)
        self.b2_desc, _ = descriptor(w_up.mT, bk, bn)
        self.c_desc, _ = descriptor(out, bm, bn)
        self.c2_desc = self.c_desc  # g's: the same box over another tensor of h's layout
        # A ring slot holds A's box and both weights' (48 KiB in 16 bits); h's staging tile takes 32 KiB,
        # and g's another when backward keeps it: four slots fit beside one, three beside two.
        stages = 3 if saved else 4
        tiles = triton.cdiv(M, bm) * triton.cdiv(N, bn)
        programs = max(1, min(sm_count or device_info(x.device).sm_count, tiles))
        self.launch = Launch(
            KernelArgs(
                gemm_gluon_kernel,
                _GLUON_RUNTIME,
                ws_ptr=None,
                count_ptr=None,
                sa_ptr=None,
                sb_ptr=None,
                M=M,
                N=N,
                K=K,
                dp_tiles=tiles,
                iters_per_program=0,
                tile_span=0,
                stride_dm=0,
                stride_dn=1,
                stride_rm=0,
                stride_rn=1,
                stride_zm=out.stride(0),
                stride_zn=out.stride(1),
                alpha=1.0,
                beta=1.0,
                BLOCK_M=bm,
                BLOCK_N=bn,
                BLOCK_K=bk,
                GROUP_M=8,
                NUM_STAGES=stages,
                A_ROW_MAJOR=True,
                B_ROW_MAJOR=False,
                HAS_ALPHA=False,
                ADDEND="row" if biased else "none",
                ACTIVATION="none",
                HAS_RESIDUAL=False,
                STORE_PREACT=saved,
                CONSUMERS=1,
                BLOCK_N2=bn,
                STREAM_K=False,
                EPILOGUE_SUBTILE=False,
                CLUSTER_M=1,
                CLUSTER_N=1,
                SCALING="none",
                MAX_IMPRECISE_ACC=None,
                GATED=activation,
                EPILOGUE_WARPS=0,
                SCALE_BLOCK_A=0,
                SCALE_BLOCK_B=0,
            ),
            (programs,),
            8,
            stages,
            descriptors=dict(
                a_desc=self.a_desc,
                b_desc=self.b_desc,
                b2_desc=self.b2_desc,
                c_desc=self.c_desc,
                c2_desc=self.c2_desc,
            ),
        )
        self.launch.options["maxnreg"] = max_registers(8)
        for template in (self.a_desc, self.b_desc, self.b2_desc, self.c_desc):
            template.base = None

    def __call__(self, x, w_gate, w_up, out, bg, bu, g, u):
        # Descriptors are rebased per call; the weights' boxes read W^T (K-major B), as for nn.Linear.
        self.launch(x, w_gate.mT, w_up.mT, out, g, bg, bu, u)
