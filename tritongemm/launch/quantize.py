"""The launchers of ``kernels/quantize.py``: fp8 casts with dynamic scales (``frontend.float8``).

Each launch is built once per shape, layout and block size and kept in the one plan cache
(``launch.PLANS``), then runs through ``common.Launch``: no ``JITFunction`` dispatch per call (tens
of microseconds a launch, and an fp8 training step launches these a dozen times a layer), and a
thread's first launch makes a CUDA context current, as backward on autograd's device thread needs.
"""

from __future__ import annotations

import torch
import triton

from .. import launch as _launch  # (the package, for its plan cache: this module loads after it)
from ..kernels import amax_kernel, block_cast_kernel, cast_kernel, rowwise_cast_kernel
from .common import KernelArgs, Launch
from .keys import layout_signature

#: What ``kernel[grid](...)`` launches with when given no options (Triton's defaults).
NUM_WARPS, NUM_STAGES = 4, 3


def _matrix(x: torch.Tensor) -> dict:
    """The kernels' sizes and strides of ``x`` (read through its strides: a transposed view too)."""
    return dict(R=x.shape[0], C=x.shape[1], stride_r=x.stride(0), stride_c=x.stride(1))


def _kept(key, build):
    """The launch(es) cached under ``key`` in the plan cache, built by ``build()`` on first use."""
    kept = _launch.PLANS.launchers.get(key)
    return kept if kept is not None else _launch.PLANS.keep(key, build())


def rowwise_cast(x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor, limit: float, rows: int, cols: int):
    """``rowwise_cast_kernel``: each row's scale into ``scale`` (R, 1), the cast into ``q``; ``rows`` x
    ``cols`` a program's block."""
    key = ("rowwise_cast", limit, rows, cols, layout_signature(x, q, scale))
    launch = _kept(
        key,
        lambda: Launch(
            KernelArgs(
                rowwise_cast_kernel,
                ("x_ptr", "q_ptr", "scale_ptr"),
                **_matrix(x),
                LIMIT=limit,
                BLOCK_R=rows,
                BLOCK_C=cols,
            ),
            (triton.cdiv(x.shape[0], rows),),
            NUM_WARPS,
            NUM_STAGES,
        ),
    )
    _launch.run_on(x.device, launch, x, q, scale)


def amax_then_cast(
    x: torch.Tensor,
    q: torch.Tensor,
    amax: torch.Tensor,
    scale: torch.Tensor,
    limit: float,
    rowwise: bool,
    tile: int,
    span: int,
):
    """``amax_kernel`` (|x|'s maxima per row, or of the matrix, atomically into the zeroed ``amax``;
    ``tile`` rows by ``span`` columns a program), then ``cast_kernel`` (``tile`` x ``tile`` blocks)."""
    r, c = x.shape

    def build():
        maxima = KernelArgs(
            amax_kernel,
            ("x_ptr", "amax_ptr"),
            **_matrix(x),
            ROWWISE=rowwise,
            BLOCK_R=tile,
            BLOCK_C=tile,
            SPAN_C=span,
        )
        cast = KernelArgs(
            cast_kernel,
            ("x_ptr", "q_ptr", "amax_ptr", "scale_ptr"),
            **_matrix(x),
            LIMIT=limit,
            ROWWISE=rowwise,
            BLOCK_R=tile,
            BLOCK_C=tile,
        )
        return (
            Launch(maxima, (triton.cdiv(r, tile), triton.cdiv(c, span)), NUM_WARPS, NUM_STAGES),
            Launch(cast, (triton.cdiv(r, tile), triton.cdiv(c, tile)), NUM_WARPS, NUM_STAGES),
        )

    launches = _kept(
        ("amax_then_cast", limit, rowwise, tile, span, layout_signature(x, q, amax, scale)), build
    )
    _launch.run_on(x.device, launches[0], x, amax)
    _launch.run_on(x.device, launches[1], x, q, amax, scale)


def block_cast(
    x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor, limit: float, rows: int, cols: int, scale_rows: int
):
    """``block_cast_kernel``: ``rows`` x ``cols`` of ``x`` a program, a scale per ``scale_rows`` (1 or
    ``rows``) rows by ``cols`` columns into ``scale`` (any strides), the cast into ``q``."""
    key = ("block_cast", limit, rows, cols, scale_rows, layout_signature(x, q, scale))
    launch = _kept(
        key,
        lambda: Launch(
            KernelArgs(
                block_cast_kernel,
                ("x_ptr", "q_ptr", "scale_ptr"),
                **_matrix(x),
                stride_sr=scale.stride(0),
                stride_sc=scale.stride(1),
                LIMIT=limit,
                BLOCK_R=rows,
                BLOCK_C=cols,
                SCALE_ROWS=scale_rows,
            ),
            (triton.cdiv(x.shape[0], rows), triton.cdiv(x.shape[1], cols)),
            8 if rows * cols > 4096 else NUM_WARPS,  # (a 128 x 128 block: 64 elements a thread)
            NUM_STAGES,
        ),
    )
    _launch.run_on(x.device, launch, x, q, scale)


__all__ = ["amax_then_cast", "block_cast", "rowwise_cast"]
