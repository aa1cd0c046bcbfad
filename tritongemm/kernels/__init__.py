"""Triton kernels, and only kernels: ``@triton.jit`` code and its jit helpers.

Nothing here imports the host API: ``tritongemm.planning.plan`` chooses a config and
kernel, and ``tritongemm.launch`` launches it (one launcher per kernel).  The
warp-specialized Gluon kernel (``gemm_gluon``) is imported by its launcher
alone, since Gluon is not available on every Triton.
"""

from .gated_grad import gated_grad_kernel
from .gemm import gemm_kernel, splitk_reduce_kernel
from .gemm_streamk import streamk_kernel
from .gemm_tma import gemm_tma_kernel
from .gemv import gemv_kernel
from .pad_copy import pad_copy_kernel
from .quantize import amax_kernel, block_cast_kernel, cast_kernel, rowwise_cast_kernel

# Triton decides at decoration time whether a kernel runs compiled or on the
# CPU interpreter (TRITON_INTERPRET=1 must be set before tritongemm is imported).
KERNELS_INTERPRETED: bool = type(gemm_kernel).__name__ == "InterpretedFunction"

__all__ = [
    "amax_kernel",
    "block_cast_kernel",
    "cast_kernel",
    "gated_grad_kernel",
    "rowwise_cast_kernel",
    "gemm_kernel",
    "gemm_tma_kernel",
    "gemv_kernel",
    "pad_copy_kernel",
    "splitk_reduce_kernel",
    "streamk_kernel",
    "KERNELS_INTERPRETED",
]
