"""The one place that asks the device what it is.

Everything else in tritongemm reads device facts (shared memory, SM count,
compute capability, whether Triton runs on its CPU interpreter) from here.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass

import torch

from .kernels import KERNELS_INTERPRETED


@dataclass(frozen=True)
class DeviceInfo:
    """Hardware budgets the config space is validated against."""

    name: str
    capability: tuple[int, int]
    sm_count: int
    #: Largest dynamic shared memory one program (CTA) may use, in bytes.
    smem_per_block: int
    #: 32-bit registers one thread may hold (255 on every NVIDIA GPU since Kepler).
    regs_per_thread: int = 255
    interpreter: bool = False

    @property
    def is_hopper(self) -> bool:
        return self.capability[0] == 9


# What the interpreter "device" pretends to be: an H100's budgets, so that a
# config validated on the CPU machine is one that also fits the GPU.
# 227 KiB = 232448 bytes is the sm_90 opt-in shared memory per block.
INTERPRETER_DEVICE = DeviceInfo(
    name="triton-interpreter (H100 budgets)",
    capability=(9, 0),
    sm_count=132,
    smem_per_block=232448,
    interpreter=True,
)


#: Budgets of GPUs by name, for ``explain(..., device="h100")`` and heuristic tests on a
#: machine without them (SM counts and opt-in shared memory per block from NVIDIA's
#: tuning guides: sm_90 227 KiB, sm_80 163 KiB, sm_86/sm_89 99 KiB).
KNOWN_DEVICES: dict[str, DeviceInfo] = {
    "h100": DeviceInfo("NVIDIA H100 80GB HBM3 (budgets)", (9, 0), 132, 232448),
    "h200": DeviceInfo("NVIDIA H200 (budgets)", (9, 0), 132, 232448),
    "a100": DeviceInfo("NVIDIA A100-SXM4-80GB (budgets)", (8, 0), 108, 166912),
    "l4": DeviceInfo("NVIDIA L4 (budgets)", (8, 9), 58, 101376),
    "rtx3090": DeviceInfo("NVIDIA GeForce RTX 3090 (budgets)", (8, 6), 82, 101376),
}


def named_device(name: str | DeviceInfo) -> DeviceInfo:
    """A ``DeviceInfo`` by name (``KNOWN_DEVICES``), or the one given."""
    if isinstance(name, DeviceInfo):
        return name
    try:
        return KNOWN_DEVICES[name.lower()]
    except KeyError:
        raise ValueError(
            f"unknown device {name!r}; choose one of {sorted(KNOWN_DEVICES)} or pass a DeviceInfo"
        ) from None


def interpreter_enabled() -> bool:
    """True when Triton's CPU interpreter is on (``TRITON_INTERPRET=1``).

    Triton reads the variable when a kernel is *decorated*, so what counts is
    whether our kernels were built as interpreted functions, not the current
    environment.
    """
    return KERNELS_INTERPRETED


def env_requests_interpreter() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes")


@functools.cache
def _cuda_info(index: int) -> DeviceInfo:
    props = torch.cuda.get_device_properties(index)
    smem = getattr(props, "shared_memory_per_block_optin", 0)
    if not smem:
        try:  # older torch: ask Triton's driver instead
            import triton

            smem = triton.runtime.driver.active.utils.get_device_properties(index)["max_shared_mem"]
        except Exception:  # pragma: no cover - depends on the installed triton
            smem = 48 * 1024  # the limit every CUDA GPU grants without opt-in
    return DeviceInfo(
        name=props.name,
        capability=(props.major, props.minor),
        sm_count=props.multi_processor_count,
        smem_per_block=int(smem),
    )


def device_info(device: torch.device | str | None = None) -> DeviceInfo:
    """Budgets of ``device`` (a CUDA device, or the interpreter for CPU tensors)."""
    device = torch.device(device) if device is not None else None
    if device is None:
        if torch.cuda.is_available() and not interpreter_enabled():
            device = torch.device("cuda", torch.cuda.current_device())
        else:
            return INTERPRETER_DEVICE
    if device.type == "cuda" and not interpreter_enabled():
        index = device.index if device.index is not None else torch.cuda.current_device()
        return _cuda_info(index)
    return INTERPRETER_DEVICE


def cuda_available() -> bool:
    return torch.cuda.is_available()
