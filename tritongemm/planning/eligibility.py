"""Which kernel can take which operands: named predicates on plain layout values.

An ``Operand`` is what a kernel sees of a matrix (its 2-D shape, strides,
element size and base alignment), built from a tensor or from numbers, so
``explain()`` can ask the same questions about an H100 on a machine without
one.  Each predicate returns the reason in words, or None when the kernel can.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from ..device import DeviceInfo


def is_aligned16(t: torch.Tensor) -> bool:
    """Does ``t``'s data start on a 16-byte boundary?  A traced tensor (fake, functional) has no
    address: its offset into its storage decides, storages being allocated aligned (a compiled
    graph copies an input that breaks this before running)."""
    if type(t) in (torch.Tensor, torch.nn.Parameter):
        return t.data_ptr() % 16 == 0
    return t.storage_offset() * t.element_size() % 16 == 0


class Operand(NamedTuple):
    """A matrix as a kernel sees it: the last two dims of a tensor."""

    rows: int
    cols: int
    row_stride: int
    col_stride: int
    elem_size: int
    #: The base address is a multiple of 16 bytes (TMA and vector loads need it).
    aligned16: bool = True

    @classmethod
    def of(cls, t: torch.Tensor) -> Operand:
        return cls(t.shape[-2], t.shape[-1], t.stride(-2), t.stride(-1), t.element_size(), is_aligned16(t))

    @classmethod
    def contiguous(cls, rows: int, cols: int, elem_size: int) -> Operand:
        """A freshly allocated row-major matrix (torch's allocations are 256-byte aligned)."""
        return cls(rows, cols, max(cols, 1), 1, elem_size, True)

    @property
    def row_major(self) -> bool:
        return self.col_stride == 1

    @property
    def lead_stride(self) -> int | None:
        """The stride between rows (row-major) or columns (column-major); None without a unit stride."""
        if self.col_stride == 1 and self.cols > 0:
            return self.row_stride
        if self.row_stride == 1:
            return self.col_stride
        return None

    def aligned(self, row_major: bool | None = None) -> Operand:
        """This matrix copied into an aligned workspace (``launch.aligned``): the same orientation unless
        ``row_major`` says (row-major when it had no unit stride), the leading dimension rounded up to
        16 bytes, a 16-byte aligned base."""
        per = max(16 // self.elem_size, 1)
        if row_major is None:
            row_major = self.lead_stride is None or self.col_stride == 1
        if not row_major:
            return Operand(self.rows, self.cols, 1, round_up(max(self.rows, 1), per), self.elem_size, True)
        return Operand(self.rows, self.cols, round_up(max(self.cols, 1), per), 1, self.elem_size, True)


def round_up(x: int, multiple: int) -> int:
    return -(-x // multiple) * multiple


def stride_hint(stride: int) -> int:
    """The largest power of two, at most 16, that divides ``stride`` (elements).

    Triton itself only marks integer arguments divisible by 16; a stride of
    4104 half-precision elements (16 bytes x 513) gets no mark, so the
    pointer kernel loads its rows element by element unless told (the "hinted"
    path of docs/unaligned.md: ``kernels/gemm.py`` rounds each stride down to this multiple,
    which changes nothing but what the compiler can prove).
    """
    return 16 if stride == 0 else min(stride & -stride, 16)


def vector_bytes(op: Operand) -> int:
    """The widest load (bytes, at most 16) the pointer kernel can issue along ``op``'s unit stride.

    A misaligned base or a missing unit stride leaves element-wise loads; else
    the leading stride's power-of-two factor decides (cp.async moves 4, 8 or
    16 bytes, so a 2-byte element on an odd stride cannot be loaded asynchronously at all).
    """
    lead = op.lead_stride
    if lead is None or not op.aligned16:
        return op.elem_size
    return min(stride_hint(lead) * op.elem_size, max(16, op.elem_size))


def tensor_descriptor_class():
    """Triton's host-side TMA descriptor, or None on a Triton that has none (< 3.4)."""
    try:
        from triton.tools.tensor_descriptor import TensorDescriptor
    except ImportError:
        return None
    return TensorDescriptor


def tma_operand_reason(name: str, op: Operand) -> str | None:
    """Why a TMA descriptor cannot describe ``op`` (None when it can): a unit stride and 16-byte alignment."""
    if not op.aligned16:
        return f"{name}'s data pointer is not 16-byte aligned"
    if op.col_stride == 1 and op.cols > 0:
        lead = op.row_stride
    elif op.row_stride == 1:
        lead = op.col_stride
    else:
        return f"{name} has no unit stride (strides {(op.row_stride, op.col_stride)})"
    if (lead * op.elem_size) % 16:
        return f"{name}'s leading stride {lead} x {op.elem_size} B is not a multiple of 16 bytes"
    return None


def tma_unsupported_reason(
    a: Operand,
    b: Operand,
    c: Operand,
    dtype: torch.dtype,
    out_dtype: torch.dtype,
    device: DeviceInfo,
    batched: bool,
) -> str | None:
    """Why the TMA kernel cannot take these operands (None when it can)."""
    if not device.interpreter and device.capability < (9, 0):
        return f"TMA needs sm_90 or newer ({device.name} is sm_{device.capability[0]}{device.capability[1]})"
    if tensor_descriptor_class() is None:
        return "this triton has no host-side TensorDescriptor"
    if dtype not in (torch.float16, torch.bfloat16):
        return f"the TMA kernel takes float16/bfloat16 ({dtype} uses the pointer kernel)"
    if out_dtype != dtype:
        return "out_dtype differs from the inputs' dtype"
    if batched:
        return "batched problems use the pointer kernel"
    for name, op in (("A", a), ("B", b)):
        reason = tma_operand_reason(name, op)
        if reason:
            return reason
    if c.col_stride != 1:
        return "C is not row-major"
    return tma_operand_reason("C", c)


def gemv_unsupported_reason(m: int, batched: bool) -> str | None:
    """The GEMV kernel takes one unbatched row of A."""
    if m == 1 and not batched:
        return None
    return "GEMV takes one unbatched row of A (M = 1)"


def stream_k_unsupported_reason(k: int, batched: bool) -> str | None:
    """Stream-K streams one matrix's tiles; batches (and K = 0) run sliced-K."""
    if not batched and k > 0:
        return None
    return "Stream-K takes one (unbatched) problem with K > 0"


__all__ = [
    "Operand",
    "gemv_unsupported_reason",
    "round_up",
    "stream_k_unsupported_reason",
    "stride_hint",
    "tma_operand_reason",
    "tma_unsupported_reason",
    "vector_bytes",
]


def warp_specialized_shared_bytes(cfg, elem_size: int = 2, out_size: int | None = None) -> int:
    """Shared memory of the warp-specialized kernel (``kernels/gemm_gluon.py``): the ring of
    ``num_stages`` A and B tiles, the output tile staged for its TMA store (one per ping-pong
    consumer, of half its rows for fp8; half of it with ``epilogue_subtile``), and one mbarrier pair
    per slot.
    ``out_size``: C's element size where it differs from the operands' (fp8 in, bf16 out)."""
    ring = cfg.num_stages * (cfg.block_m + cfg.block_n) * cfg.block_k * elem_size
    out_tiles = 2 if cfg.pingpong and not cfg.splits_rows(elem_size) else 1
    out_size = elem_size if out_size is None else out_size
    out_tile = cfg.block_m * cfg.block_n * out_size // (2 if cfg.epilogue_subtile else 1)
    barriers = 16 if cfg.cluster_m * cfg.cluster_n == 1 else 24  # (a cluster's slots have a third)
    return ring + out_tiles * out_tile + barriers * cfg.num_stages


#: The fp8 formats of ``scaled_mm`` (on sm_90: the warp-specialized kernel, else the pointer kernel).
FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)


def _fp8_warp_specialized_reason(a: Operand, b: Operand, out_dtype: torch.dtype) -> str | None:
    """Why the warp-specialized kernel cannot take fp8 operands laid out so (None when it can)."""
    from ..kernels.gluon_common import PRECISE_FP8_AVAILABLE

    if not PRECISE_FP8_AVAILABLE:
        return "this Triton's Gluon wgmma cannot sum fp8 products precisely (no max_num_imprecise_acc)"
    if out_dtype not in (torch.bfloat16, torch.float16, torch.float32):
        return f"the warp-specialized kernel stores fp8 products as bf16, fp16 or fp32 (not {out_dtype})"
    if not (a.row_major and not b.row_major):
        return "wgmma reads fp8 operands K-major only: A row-major and B column-major (b = w.t())"
    return None


def warp_specialized_unsupported_reason(
    cfg, a: Operand, b: Operand, c: Operand, dtype: torch.dtype, out_dtype, device: DeviceInfo, batched: bool
) -> str | None:
    """Why the Gluon warp-specialized kernel cannot run this config on these operands (None when it can)."""
    from ..kernels.gluon_common import CLUSTER_UNAVAILABLE_REASON, GLUON_AVAILABLE, GLUON_UNAVAILABLE_REASON

    if device.interpreter:
        return "Gluon kernels do not run on Triton's interpreter"
    if device.capability != (9, 0):
        return f"the warp-specialized kernel is written for sm_90 ({device.name})"
    if not GLUON_AVAILABLE:
        return f"Gluon unavailable: {GLUON_UNAVAILABLE_REASON}"
    if cfg.cluster_m * cfg.cluster_n > 1 and CLUSTER_UNAVAILABLE_REASON:
        return f"clusters of CTAs unavailable: {CLUSTER_UNAVAILABLE_REASON}"
    fp8 = dtype in FP8_DTYPES
    if fp8:
        reason = _fp8_warp_specialized_reason(a, b, out_dtype)
        if reason is not None:
            return reason
    elif dtype not in (torch.float16, torch.bfloat16) or out_dtype != dtype:
        return f"the warp-specialized kernel takes fp16/bf16 in and out ({dtype} -> {out_dtype})"
    if batched:
        return "the warp-specialized kernel runs one matrix (batch 1)"
    if cfg.split_k > 1:
        return "the warp-specialized kernel has no split-K"
    # (Stream-K's one consumer and power-of-two block_n are TileConfig's rule.)
    k_bytes = cfg.block_k * dtype.itemsize
    if cfg.num_warps not in (4, 8) or cfg.block_m % (16 * cfg.num_warps) or k_bytes != 128:
        return (
            f"the warp-specialized kernel needs num_warps 4 or 8, block_m a multiple of 16 x num_warps "
            f"and a K step of 128 bytes (block_k {128 // dtype.itemsize}; got {cfg.short()})"
        )
    split_rows = cfg.splits_rows(dtype.itemsize)
    if split_rows and (cfg.block_m < 128 or cfg.accumulator_widths[1] or cfg.stream_k):
        return (
            f"fp8's two consumers each take half of a tile's rows: block_m 128 or more (a wgmma's 64 rows "
            f"each), one accumulator, no Stream-K (got {cfg.short()})"
        )
    if cfg.block_m // (2 if split_rows else 1) * cfg.block_n > 128 * 128 * (cfg.num_warps // 4):
        return f"a {cfg.block_m}x{cfg.block_n} accumulator needs {2 * cfg.num_warps} warps"
    # (pingpong's num_warps=4 is TileConfig's rule: each consumer is one warpgroup.)
    smem = warp_specialized_shared_bytes(cfg, dtype.itemsize, out_dtype.itemsize)
    if smem > device.smem_per_block:
        return f"{cfg.short()} needs {smem} B of shared memory"
    for name, op in (("A", a), ("B", b), ("C", c)):
        reason = tma_operand_reason(name, op)
        if reason is not None:
            return reason
    if not c.row_major:
        return "the warp-specialized kernel stores C row-major (out has no unit last stride)"
    return None
