"""Run a GEMM on aligned copies of its unaligned operands (path (a) of issue 16).

A leading dimension that is not a multiple of 16 bytes rules out TMA and
cp.async, and the kernels then load element by element.  When the plan says
a copy pays (``plan.Alignment``, ``heuristics.padding_estimate``), this
launcher copies those operands, per call, into workspaces whose leading
dimension is rounded up to 16 bytes (only the leading dimension: the
kernels mask, and TMA zero-fills, everything past the logical shape, so the
padding is never read and needs no zeroing), runs the aligned kernel on
views of them, and, when C was the unaligned one, copies the result out.

The workspaces come from torch's caching allocator (no cudaMalloc per call,
safe under CUDA-graph capture) and are dropped when the call returns: no
padded copy of a user's tensor outlives the call.
"""

from __future__ import annotations

import torch

from ..eligibility import Operand, round_up


class Workspace:
    """How one operand is padded: its shape, the orientation kept, which batch dims stay broadcast."""

    def __init__(self, t: torch.Tensor, row_major: bool | None = None):
        self.shape = tuple(t.shape)
        self.dtype, self.device = t.dtype, t.device
        self.row_major = Operand.of(t).aligned(row_major).row_major  # the orientation the plan assumed
        per = max(16 // t.element_size(), 1)
        *batch, rows, cols = t.shape
        # A broadcast (stride-0) batch dim is copied once and broadcast again, not materialized.
        self.broadcast = tuple(st == 0 and size != 1 for size, st in zip(batch, t.stride()[:-2]))
        kept = tuple(1 if bc else size for size, bc in zip(batch, self.broadcast))
        if self.row_major:
            self.buffer_shape, self.cut = (*kept, rows, round_up(max(cols, 1), per)), cols
        else:
            self.buffer_shape, self.cut = (*kept, cols, round_up(max(rows, 1), per)), rows

    def empty(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(the buffer's logical matrices, the same expanded to the operand's shape) for one call."""
        view = torch.empty(*self.buffer_shape, dtype=self.dtype, device=self.device)[..., : self.cut]
        if not self.row_major:
            view = view.mT
        return view, view.expand(self.shape)

    def copy_of(self, t: torch.Tensor) -> torch.Tensor:
        """``t`` copied into a fresh workspace (a view with ``t``'s shape and padded strides)."""
        view, full = self.empty()
        if any(self.broadcast):
            t = t[tuple(slice(0, 1) if bc else slice(None) for bc in self.broadcast)]
        view.copy_(t)
        return full


class PaddedLauncher:
    takes_bases = False  # copies the operands: needs their shapes and strides
    """Another kernel's launcher, run on aligned workspaces for the operands the plan names."""

    def __init__(self, plan, call, a, b, out, d, r, z, interpreting: bool, inner_class):
        padded = plan.alignment.padded
        self.a_ws = Workspace(a) if "A" in padded else None
        self.b_ws = Workspace(b) if "B" in padded else None
        self.c_ws = Workspace(out, row_major=True) if "C" in padded else None  # TMA stores rows
        # The kernels store the pre-activation with C's strides: it moves to a workspace with C.
        self.z_ws = Workspace(z, row_major=True) if self.c_ws is not None and z is not out else None
        # The inner launcher is built once, on workspaces of the layout every call will have.
        wa = self.a_ws.empty()[1] if self.a_ws else a
        wb = self.b_ws.empty()[1] if self.b_ws else b
        wc = self.c_ws.empty()[1] if self.c_ws else out
        wz = self.z_ws.empty()[1] if self.z_ws else (wc if z is out else z)
        self.inner = inner_class(plan, call, wa, wb, wc, d, r, wz, interpreting)

    def __call__(self, a, b, out, d, r, z, alpha, beta):
        if self.a_ws is not None:
            a = self.a_ws.copy_of(a)
        if self.b_ws is not None:
            b = self.b_ws.copy_of(b)
        c, wz = out, z
        if self.c_ws is not None:
            c = self.c_ws.empty()[1]
            wz = self.z_ws.empty()[1] if self.z_ws is not None else (c if z is out else z)
        self.inner(a, b, c, d, r, wz, alpha, beta)
        if self.c_ws is not None:
            out.copy_(c)
            if self.z_ws is not None:
                z.copy_(wz)


__all__ = ["PaddedLauncher", "Workspace"]
