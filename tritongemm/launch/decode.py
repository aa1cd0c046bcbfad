"""The decode kernel (``kernels/decode.py``): out = x @ W^T (+ bias) for at most 16 rows of x.

``decode_gemm`` launches it with a given config; ``decode_configs`` lists the
candidates a sweep times, ``default_decode_config`` the one taken when none is
given.  Nothing plans or dispatches to it yet: which config (and whether it
beats the GEMV and skinny kernels) waits on GPU measurements
(``.gpu/decode_sweep.py`` in a checkout).
"""

from __future__ import annotations

import math
import os
from typing import NamedTuple

import torch
import triton

from ..device import device_info, interpreter_enabled
from ..kernels import decode_kernel
from ..planning.eligibility import Operand, tensor_descriptor_class, tma_operand_reason
from .common import KernelArgs, Launch, arrival_counters, needs_index_64
from .keys import layout_signature

#: The rows of x the kernel pads to (``BLOCK_M``): the smallest ``tl.dot`` tile.
MAX_ROWS = 16
#: What a launch passes per call; every other argument is fixed when the launch is built.
RUNTIME = ("a_ptr", "w_ptr", "c_ptr", "bias_ptr", "ws_ptr", "count_ptr")
#: The same with x and W given through TMA descriptors (``Launch`` builds them over the tensors).
TMA_RUNTIME = ("a_desc", "w_desc", "c_ptr", "bias_ptr", "ws_ptr", "count_ptr")
DTYPES = (torch.float16, torch.bfloat16, torch.float32)
#: Shared memory one program may use on sm_90 (the opt-in limit, 227 KiB).
SMEM_PER_BLOCK = 232448
#: A slice of K spans at least this many K-steps: one step per slice leaves nothing to pipeline.
MIN_STEPS_PER_SLICE = 2
#: Outputs start as NaN when tests ask (as the library's own allocations do), so an element
#: the kernel never writes fails the comparison.
POISON_OUTPUTS = os.environ.get("TRITONGEMM_POISON_OUTPUTS", "0") == "1"


class DecodeConfig(NamedTuple):
    """One launch of the decode kernel: its tile (BLOCK_M is always 16), split and pipeline,
    and whether tiles arrive through TMA descriptors (``tma``) or 16-byte ``cp.async`` copies."""

    block_n: int
    block_k: int
    split_k: int
    num_warps: int
    num_stages: int
    tma: bool = False

    def short(self) -> str:
        tma = " tma" if self.tma else ""
        return f"{self.block_n}x{self.block_k} split{self.split_k} w{self.num_warps} s{self.num_stages}{tma}"

    def smem_bytes(self, elem_size: int) -> int:
        """Shared memory of the pipelined loads: Triton's pipeliner keeps ``num_stages - 1``
        buffers of the W and x tiles, and with TMA an 8-byte barrier per buffer (what
        ``tools/offline_compile.py`` reports for sm_90)."""
        buffers = max(self.num_stages - 1, 1)
        return buffers * ((self.block_n + MAX_ROWS) * self.block_k * elem_size + (8 if self.tma else 0))


class DecodeTile(NamedTuple):
    """A tile of the candidate menu; ``waves``: how many programs per SM its split aims at."""

    block_n: int
    block_k: int
    num_warps: int
    num_stages: int
    waves: int
    tma: bool = False


# Candidates for the sweep, not measured yet.  What they vary: the width of a program's
# slab of W (16-64 rows), the length of each row run it copies per step (128-512
# elements: 256 B-1 KiB of bf16), the pipeline depth (bytes in flight per program), how
# many programs share the SMs (their split of K) and how tiles are copied (TMA boxes are
# at most 256 elements a side).  Every one fits 2-byte operands in one program's shared
# memory (``DecodeConfig.smem_bytes``).
DECODE_MENU = (
    DecodeTile(16, 256, 4, 4, 4),
    DecodeTile(16, 512, 4, 3, 4),
    DecodeTile(32, 128, 4, 6, 4),
    DecodeTile(32, 256, 4, 3, 4),
    DecodeTile(32, 256, 4, 4, 4),
    DecodeTile(32, 256, 4, 4, 8),
    DecodeTile(32, 512, 4, 3, 4),
    DecodeTile(32, 512, 8, 4, 2),
    DecodeTile(64, 128, 4, 4, 4),
    DecodeTile(64, 128, 4, 6, 4),
    DecodeTile(64, 256, 4, 3, 2),
    DecodeTile(64, 256, 8, 4, 4),
    DecodeTile(64, 512, 8, 3, 2),
    DecodeTile(16, 256, 4, 4, 4, tma=True),
    DecodeTile(32, 128, 4, 6, 4, tma=True),
    DecodeTile(32, 256, 4, 4, 4, tma=True),
    DecodeTile(32, 256, 4, 4, 8, tma=True),
    DecodeTile(64, 128, 4, 6, 4, tma=True),
    DecodeTile(64, 256, 4, 3, 2, tma=True),
    DecodeTile(64, 256, 8, 4, 4, tma=True),
)
#: ``default_decode_config``'s tile until a sweep picks one: 16 KiB of bf16 W per step, three
#: steps in flight, three programs per SM in shared memory (72 KiB each).
DEFAULT_TILE = DecodeTile(32, 256, 4, 4, 4)


def split_for(n: int, k: int, block_n: int, block_k: int, sm_count: int, waves: int) -> int:
    """Slices of K per column block so that the grid has ``waves`` programs per SM, keeping
    at least ``MIN_STEPS_PER_SLICE`` K-steps in each slice (and no split of a short K).

    Returns the count ``DecodeLaunch`` makes (``cdiv(N, block_n) * split`` programs).
    """
    col_blocks = triton.cdiv(n, block_n)
    k_steps = max(triton.cdiv(k, block_k), 1)
    want = max(1, min(triton.cdiv(waves * sm_count, col_blocks), k_steps // MIN_STEPS_PER_SLICE))
    # The count the launch makes of it: slices of whole, equal K-steps (the last one may be shorter).
    return triton.cdiv(k_steps, triton.cdiv(k_steps, want))


def _config(tile: DecodeTile, n: int, k: int, sm_count: int, elem_size: int) -> DecodeConfig:
    # A K-step of the same bytes for 4-byte operands: half the elements (and the same shared memory).
    block_k = max(16, tile.block_k * 2 // elem_size) if elem_size > 2 else tile.block_k
    split = split_for(n, k, tile.block_n, block_k, sm_count, tile.waves)
    return DecodeConfig(tile.block_n, block_k, split, tile.num_warps, tile.num_stages, tile.tma)


def decode_configs(n: int, k: int, sm_count: int = 132, elem_size: int = 2) -> list[DecodeConfig]:
    """The candidate configs for an (N, K) weight of ``elem_size``-byte elements (``DECODE_MENU``,
    each with its split of K for ``sm_count`` SMs), duplicates dropped."""
    configs = []
    for tile in DECODE_MENU:
        if tile.tma and elem_size != 2:
            continue
        cfg = _config(tile, n, k, sm_count, elem_size)
        if cfg not in configs and cfg.smem_bytes(elem_size) <= SMEM_PER_BLOCK:
            configs.append(cfg)
    return configs


def default_decode_config(m: int, n: int, k: int, sm_count: int = 132, elem_size: int = 2) -> DecodeConfig:
    """The config ``decode_gemm`` takes when given none (``DEFAULT_TILE``; ``m`` does not change it yet)."""
    return _config(DEFAULT_TILE, n, k, sm_count, elem_size)


class DecodeLaunch:
    """The kernel's launch for one layout of (x, W, out, bias) and one config, with its workspace."""

    def __init__(self, x2, w, out2, bias, cfg: DecodeConfig):
        M, K = x2.shape
        N = w.shape[0]
        k_steps = max(triton.cdiv(K, cfg.block_k), 1)
        splits = min(max(cfg.split_k, 1), k_steps)
        k_per_split = triton.cdiv(k_steps, splits) * cfg.block_k
        # Slices of whole K-steps, none empty: asking for 5 of 8 steps gives 4 slices of 2.
        self.splits = triton.cdiv(K, k_per_split) if K > 0 else 1
        col_blocks = triton.cdiv(N, cfg.block_n)
        if col_blocks * self.splits > 2**31 - 1:
            raise RuntimeError(f"decode_gemm: {col_blocks * self.splits} programs exceed the grid limit")
        self.ws_shape = (self.splits, M, N)
        self.counters = col_blocks
        # Without K there is no tile to copy (and no descriptor of a (M, 0) matrix).
        tma = cfg.tma and K > 0
        descriptors = tma_descriptors(x2, w, cfg) if tma else {}
        self.main = Launch(
            KernelArgs(
                decode_kernel,
                TMA_RUNTIME if tma else RUNTIME,
                **({"a_ptr": None, "w_ptr": None} if tma else {"a_desc": None, "w_desc": None}),
                M=M,
                N=N,
                K=K,
                stride_am=x2.stride(0),
                stride_ak=x2.stride(1),
                stride_wn=w.stride(0),
                stride_wk=w.stride(1),
                stride_cm=out2.stride(0),
                stride_cn=out2.stride(1),
                stride_bias=bias.stride(0) if bias is not None else 0,
                splits=self.splits,
                k_per_split=k_per_split,
                BLOCK_M=MAX_ROWS,
                BLOCK_N=cfg.block_n,
                BLOCK_K=cfg.block_k,
                SPLIT_K=self.splits > 1,
                HAS_BIAS=bias is not None,
                EVEN_K=K % cfg.block_k == 0,
                # TMA coordinates are int32 whatever the size; the copy engine addresses in 64 bits.
                INDEX_64=needs_index_64(x2, w, out2) and not tma,
                # Triton's interpreter multiplies bf16 bit patterns in tl.dot (triton-lang/triton#11584).
                UPCAST_OPERANDS=interpreter_enabled() and x2.dtype == torch.bfloat16,
                TMA=tma,
            ),
            (col_blocks * self.splits,),
            cfg.num_warps,
            cfg.num_stages,
            descriptors=descriptors,
        )
        # Every launch rebases the templates: a cached launch must not keep the first call's operands alive.
        for template in descriptors.values():
            template.base = None

    def __call__(self, x2, w, out2, bias) -> None:
        bias = bias if bias is not None else out2  # never read without HAS_BIAS
        if self.splits == 1:
            self.main(x2, w, out2, bias, out2, out2)
            return
        # Each slice's fp32 partial has its own slot, so nothing needs zeroing: the workspace
        # comes from torch's caching allocator, the counters re-arm themselves.
        self.main(x2, w, out2, bias, self.workspace(x2.device), arrival_counters(x2.device, self.counters))

    def workspace(self, device: torch.device) -> torch.Tensor:
        return torch.empty(self.ws_shape, dtype=torch.float32, device=device)


def tma_reason(x2: torch.Tensor, w: torch.Tensor, cfg: DecodeConfig) -> str | None:
    """Why the TMA copies cannot take these operands (None when they can)."""
    if tensor_descriptor_class() is None:
        return "this triton has no host-side TensorDescriptor"
    if x2.element_size() != 2:
        return f"TMA configs take float16/bfloat16 ({x2.dtype} copies with cp.async)"
    if max(cfg.block_n, cfg.block_k) > 256:
        return f"a TMA box is at most 256 elements a side (the tile is {cfg.block_n} x {cfg.block_k})"
    for name, t in (("x", x2), ("w", w)):
        if t.stride(1) != 1:
            return f"{name} is not contiguous along K (strides {tuple(t.stride())})"
        reason = tma_operand_reason(name, Operand.of(t))
        if reason:
            return reason
    return None


def tma_descriptors(x2: torch.Tensor, w: torch.Tensor, cfg: DecodeConfig) -> dict:
    """Descriptor templates of x (16 x block_k boxes: rows past M read as zeros) and W."""
    reason = tma_reason(x2, w, cfg)
    if reason:
        raise ValueError(f"decode_gemm: config {cfg.short()}: {reason}")
    TensorDescriptor = tensor_descriptor_class()
    (M, K), N = x2.shape, w.shape[0]
    return dict(
        a_desc=TensorDescriptor(x2, [M, K], [x2.stride(0), 1], [MAX_ROWS, cfg.block_k]),
        w_desc=TensorDescriptor(w, [N, K], [w.stride(0), 1], [cfg.block_n, cfg.block_k]),
    )


#: (layout signature, config) -> DecodeLaunch.  Bounded: a caller that varies shapes forever
#: would otherwise grow it without end.
LAUNCHES: dict = {}
MAX_LAUNCHES = 256


def _check(x, w, bias, out) -> None:
    if x.dtype != w.dtype or x.dtype not in DTYPES:
        raise TypeError(f"decode_gemm: x and w must share one of {DTYPES}, got {x.dtype} and {w.dtype}")
    if w.dim() != 2 or x.dim() < 1 or x.shape[-1] != w.shape[1]:
        raise ValueError(f"decode_gemm: x {tuple(x.shape)} and w {tuple(w.shape)} do not multiply as x @ w.T")
    if x.device != w.device:
        raise ValueError(f"decode_gemm: x on {x.device}, w on {w.device}")
    if x.device.type != "cuda" and not interpreter_enabled():
        raise ValueError("decode_gemm: CPU tensors run only on Triton's interpreter (TRITON_INTERPRET=1)")
    if bias is not None and (bias.shape != (w.shape[0],) or bias.device != x.device):
        raise ValueError(f"decode_gemm: bias must be a vector of {w.shape[0]} on {x.device}")
    if out is not None and (out.shape != (*x.shape[:-1], w.shape[0]) or out.device != x.device):
        raise ValueError(f"decode_gemm: out must be {(*x.shape[:-1], w.shape[0])} on {x.device}")


_current_device = getattr(torch._C, "_cuda_getDevice", None) or torch.cuda.current_device


def decode_gemm(
    x: torch.Tensor,
    w: torch.Tensor,
    bias: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    *,
    block_n: int | None = None,
    block_k: int | None = None,
    split_k: int | None = None,
    num_warps: int | None = None,
    num_stages: int | None = None,
    tma: bool | None = None,
) -> torch.Tensor:
    """``out = x @ w.T (+ bias)`` (``F.linear``) for x of shape (..., K) with at most 16 rows.

    ``w``: (N, K) as ``nn.Linear`` stores it; any strides work, the speed is for
    K contiguous.  ``bias``: a vector of N (any float dtype).  ``out``: (..., N),
    written in place (any float dtype, x's by default).  Accumulates in fp32.
    The config (``DecodeConfig``'s fields) may be given whole or in part; the
    rest comes from ``default_decode_config``.  ``tma=True`` needs fp16/bf16
    operands contiguous along K with 16-byte aligned rows.  No autograd.
    """
    _check(x, w, bias, out)
    N, K = w.shape
    M = math.prod(x.shape[:-1])
    if M > MAX_ROWS:
        raise ValueError(f"decode_gemm: {M} rows of x, at most {MAX_ROWS}")
    x2 = x.reshape(M, K)  # a view where x's rows allow one; a copy of at most 16 rows else
    if out is None:
        out = torch.empty((*x.shape[:-1], N), dtype=x.dtype, device=x.device)
        if POISON_OUTPUTS:
            out.fill_(float("nan"))
    if out.numel() == 0:
        return out
    out2 = out.view(M, N)  # raises where out's strides cannot be one (M, N) matrix
    given = (block_n, block_k, split_k, num_warps, num_stages, tma)
    if any(v is None for v in given):
        default = default_decode_config(M, N, K, device_info(x.device).sm_count, x.element_size())
        given = tuple(d if v is None else v for v, d in zip(given, default))
    cfg = DecodeConfig(*given)
    key = (layout_signature(x2, w, out2, bias), cfg)
    launch = LAUNCHES.get(key)
    if launch is None:
        launch = DecodeLaunch(x2, w, out2, bias, cfg)
        if len(LAUNCHES) >= MAX_LAUNCHES:
            LAUNCHES.clear()
        LAUNCHES[key] = launch
    device = x.device
    if device.type == "cuda" and device.index != _current_device():
        with torch.cuda.device(device):
            launch(x2, w, out2, bias)
    else:
        launch(x2, w, out2, bias)
    return out
