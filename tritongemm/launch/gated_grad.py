"""The launcher of ``kernels/gated_grad.py``: the gated MLP's elementwise backward, ``dg, du`` from
``dh, g, u`` in one pass."""

from __future__ import annotations

import torch
import triton

from .. import launch as _launch  # (the package, for its plan cache: this module loads after it)
from ..kernels import gated_grad_kernel
from .common import KernelArgs, Launch
from .keys import layout_signature

#: Elements a program holds, and the widest row slice it takes.  Chosen, not swept: an elementwise
#: pass runs at DRAM bandwidth once each SM has a few such tiles in flight, and 1024 columns keep
#: each warp's loads of one row contiguous.
TILE_ELEMENTS = 4096
MAX_BLOCK_N = 1024
NUM_WARPS = 4


def _rows_unit(t: torch.Tensor) -> torch.Tensor:
    """``t`` with unit-stride columns (any row stride), copied only where it has none."""
    return t if t.shape[1] <= 1 or t.stride(1) == 1 else t.contiguous()


def gated_grad(
    dh: torch.Tensor,
    g: torch.Tensor,
    u: torch.Tensor,
    activation: str,
    dg: torch.Tensor | None = None,
    du: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(dh * u * act'(g), dh * act(g))`` for ``h = act(g) * u``, written into ``dg`` and ``du``.

    All (M, N), one dtype (fp16, bf16, fp32), one device; rows may be strided, columns are read
    (or copied) unit-stride; ``dg`` and ``du`` must have unit-stride columns.  ``activation``:
    "silu", "gelu_tanh" or "gelu".  ``dg`` / ``du`` None: allocated here.  No other checks: the
    caller (the autograd op) made these tensors.
    """
    m, n = dh.shape
    dh, g, u = _rows_unit(dh), _rows_unit(g), _rows_unit(u)
    if dg is None:
        dg = torch.empty((m, n), dtype=dh.dtype, device=dh.device)
    if du is None:
        du = torch.empty((m, n), dtype=dh.dtype, device=dh.device)
    if m == 0 or n == 0:
        return dg, du
    key = ("gated_grad", activation, layout_signature(dh, g, u, dg, du))
    launch = _launch.PLANS.launchers.get(key)  # the one cache of launchers (``clear_plan_cache``)
    if launch is None:
        launch = _launch.PLANS.keep(key, _build(m, n, dh, g, u, dg, du, activation))
    _launch.run_on(dh.device, launch, dh, g, u, dg, du)
    return dg, du


def _build(m, n, dh, g, u, dg, du, activation: str) -> Launch:
    """The launch for these shapes and strides (through ``common.Launch``: a thread's first launch makes a
    CUDA context current, as backward on autograd's device thread needs)."""
    block_n = min(MAX_BLOCK_N, triton.next_power_of_2(n))
    block_m = max(1, TILE_ELEMENTS // block_n)
    args = KernelArgs(
        gated_grad_kernel,
        ("dh_ptr", "g_ptr", "u_ptr", "dg_ptr", "du_ptr"),
        M=m,
        N=n,
        stride_dh=dh.stride(0),
        stride_g=g.stride(0),
        stride_u=u.stride(0),
        stride_dg=dg.stride(0),
        stride_du=du.stride(0),
        ACTIVATION=activation,
        BLOCK_M=block_m,
        BLOCK_N=block_n,
    )
    return Launch(args, (triton.cdiv(m, block_m), triton.cdiv(n, block_n)), NUM_WARPS, 1)


__all__ = ["gated_grad"]
