"""What a call will run: the config, the kernel, and why (``Plan``).

``plan`` works on plain values (a ``GemmProblem``, a ``DeviceInfo``, the
caller's ``Request`` and the operands' ``Operand`` layouts), so the same
function serves the launch layer (from tensors) and ``explain()`` (from
tensors, shapes, or another device's budgets).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from .call import Request
from .configs import GemmProblem, TileConfig
from .device import DeviceInfo
from .eligibility import Operand, gemv_unsupported_reason, stream_k_unsupported_reason, tma_unsupported_reason
from .selection import select


@dataclass(frozen=True)
class Plan:
    """What a call will run: the config, where it came from, the kernel, and why."""

    config: TileConfig
    source: str
    kernel: str
    fallback: str | None = None
    problem: GemmProblem | None = None
    device: DeviceInfo | None = None

    def describe(self) -> str:
        lines = []
        if self.problem is not None:
            p = self.problem
            batch = f"{p.batch} x " if p.batch != 1 else ""
            lines.append(f"problem: {batch}{p.m}x{p.n}x{p.k} {p.dtype} {p.layout}"
                         + (f" on {self.device.name}" if self.device else ""))
        lines.append(f"kernel : {self.kernel}" + (f" (fell back: {self.fallback})" if self.fallback else ""))
        lines.append(f"config : {self.config.short()}")
        lines.append(f"why    : {self.source}")
        return "\n".join(lines)


def plan(problem: GemmProblem, device: DeviceInfo, request: Request, a: Operand, b: Operand, c: Operand,
         dtype: torch.dtype, out_dtype: torch.dtype) -> Plan:
    """Choose the config (``selection.select``), then the kernel the operands allow."""
    cfg, source = select(problem, device, request)
    batched = problem.batch > 1
    kernel, fallbacks = "pointer", []
    if cfg.stream_k:
        reason = stream_k_unsupported_reason(problem.k, batched)
        if reason is None:
            kernel = "stream_k"  # the TMA kernel's own Stream-K replaces this below when TMA applies
        else:
            fallbacks.append(reason)
            cfg = replace(cfg, stream_k=False)
    if cfg.gemv:
        reason = gemv_unsupported_reason(problem.m, batched)
        if reason is None:
            kernel = "gemv"
        else:
            fallbacks.append(reason)
            cfg = replace(cfg, gemv=False)
    if cfg.tma:
        reason = tma_unsupported_reason(a, b, c, dtype, out_dtype, device, batched)
        if reason is None:
            kernel = cfg.kernel
        else:
            # Same tiles on the pointer kernel (Stream-K included); the TMA-only knobs do not apply.
            fallbacks.append(reason)
            cfg = replace(cfg, tma=False, persistent=False, warp_specialize=False, epilogue_subtile=False)
    return Plan(cfg, source, kernel, "; ".join(fallbacks) or None, problem, device)


def layout_letters(a: Operand, b: Operand) -> str:
    """'N' for an operand whose rows are contiguous, 'T' for a transposed one ("NT", ...)."""
    return ("N" if a.col_stride == 1 else "T") + ("N" if b.col_stride == 1 else "T")


__all__ = ["Plan", "layout_letters", "plan"]
