"""The launcher of ``kernels/gated_grad.py``: the gated MLP's elementwise backward, ``dg, du`` from
``dh, g, u`` in one pass."""

from __future__ import annotations

import torch
import triton

from ..device import interpreter_enabled
from ..kernels import gated_grad_kernel
from .common import _INTERPRETER_LOCK

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
    block_n = min(MAX_BLOCK_N, triton.next_power_of_2(n))
    block_m = max(1, TILE_ELEMENTS // block_n)
    grid = (triton.cdiv(m, block_m), triton.cdiv(n, block_n))
    args = (dh, g, u, dg, du, m, n, dh.stride(0), g.stride(0), u.stride(0), dg.stride(0), du.stride(0))
    options = dict(ACTIVATION=activation, BLOCK_M=block_m, BLOCK_N=block_n, num_warps=NUM_WARPS)
    if interpreter_enabled():
        with _INTERPRETER_LOCK:  # the interpreter's global state is not thread-safe (``common``)
            gated_grad_kernel[grid](*args, **options)
    elif dh.device.index is not None and dh.device.index != torch.cuda.current_device():
        with torch.cuda.device(dh.device):
            gated_grad_kernel[grid](*args, **options)
    else:
        gated_grad_kernel[grid](*args, **options)
    return dg, du


__all__ = ["gated_grad"]
