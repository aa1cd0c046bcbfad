"""Choose a config for a problem and launch the kernel.

Data flows one way: ``api`` validates and normalizes (shapes, broadcasting,
stride views) and calls ``gemm`` here with operands of one batch shape; this
module picks the config (explicit > heuristic), collapses batch dimensions
into what the kernel indexes, and launches.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import replace

import torch
import triton

from .configs import ConfigError, GemmProblem, TileConfig, resolve_pipeline
from .device import DeviceInfo, device_info, interpreter_enabled
from .kernels import gemm_kernel

SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
_DTYPE_NAMES = {
    torch.float16: "float16",
    torch.bfloat16: "bfloat16",
    torch.float32: "float32",
    torch.float64: "float64",
}
_INT32_MAX = 2**31 - 1


class UnsupportedInputError(RuntimeError):
    """Inputs tritongemm cannot run (dtype, device); ``patch()`` falls back to torch on these."""


# ----------------------------------------------------------------------------------
# What we can run
# ----------------------------------------------------------------------------------
def unsupported_reason(*tensors: torch.Tensor) -> str | None:
    """Why tritongemm cannot run these operands, or None when it can."""
    for t in tensors:
        if not isinstance(t, torch.Tensor):
            return f"non-tensor argument of type {type(t).__name__}"
    for t in tensors:
        if t.dtype not in SUPPORTED_DTYPES:
            return f"unsupported dtype {t.dtype}"
        if t.is_complex() or t.layout != torch.strided:
            return f"unsupported tensor layout {t.layout}"
    if len({t.dtype for t in tensors}) > 1:
        return "mixed dtypes " + ", ".join(str(t.dtype) for t in tensors)
    if len({t.device for t in tensors}) > 1:
        return "tensors on different devices " + ", ".join(str(t.device) for t in tensors)
    device = tensors[0].device
    if device.type == "cuda":
        if interpreter_enabled():
            return "CUDA tensor while Triton runs on its CPU interpreter (TRITON_INTERPRET=1)"
        return None
    if device.type == "cpu":
        if interpreter_enabled():
            return None
        return "CPU tensor without Triton's interpreter (set TRITON_INTERPRET=1 before importing tritongemm)"
    return f"unsupported device type {device.type!r}"


def dtype_name(dtype: torch.dtype) -> str:
    return _DTYPE_NAMES.get(dtype, str(dtype).replace("torch.", ""))


# ----------------------------------------------------------------------------------
# Heuristic chooser: small named functions, one knob each
# ----------------------------------------------------------------------------------
def _pow2_at_least(x: int, lo: int, hi: int) -> int:
    return min(max(1 << max(x - 1, 0).bit_length(), lo), hi)


def choose_block_m(problem: GemmProblem, device: DeviceInfo) -> int:
    # Decode-like problems (few rows) waste a 128-row tile; 16 is tl.dot's minimum.
    return _pow2_at_least(problem.m, 16, 128)


def choose_block_n(problem: GemmProblem, device: DeviceInfo) -> int:
    if device.interpreter:
        return _pow2_at_least(problem.n, 16, 64)
    # fp16/bf16 on a full-size problem: 128x256 tiles keep the tensor cores fed
    # with 8 warps (two warpgroups on Hopper); wider types get 128.
    wide = 256 if problem.elem_size == 2 and problem.m >= 128 else 128
    return _pow2_at_least(problem.n, 32, wide)


def choose_block_k(problem: GemmProblem, device: DeviceInfo) -> int:
    # 128 bytes of K per row: one full cache line / 128B TMA swizzle row.
    bk = 128 // problem.elem_size
    if device.interpreter:
        bk = 32
    return min(max(bk, 16), _pow2_at_least(problem.k, 16, 128))


def choose_num_warps(block_m: int, block_n: int) -> int:
    # Keep the fp32 fragment near 64-128 accumulators per thread.
    return 8 if block_m * block_n >= 128 * 256 else 4


def choose_num_stages(cfg: TileConfig, problem: GemmProblem, device: DeviceInfo) -> int:
    """As many stages as shared memory holds, at most 4, at least 2."""
    stage_size = (cfg.block_m * cfg.block_k + cfg.block_k * cfg.block_n) * problem.elem_size
    fit = device.smem_per_block // stage_size
    k_tiles = math.ceil(max(problem.k, 1) / cfg.block_k)
    return max(2, min(fit, 4, k_tiles + 1))


def heuristic_config(problem: GemmProblem, device: DeviceInfo) -> TileConfig:
    bm = choose_block_m(problem, device)
    bn = choose_block_n(problem, device)
    bk = choose_block_k(problem, device)
    if problem.dtype == "float64":  # fp64 dot runs on CUDA cores: small tiles, 2 stages
        bm, bn, bk = min(bm, 64), min(bn, 64), 16
    warps = choose_num_warps(bm, bn)
    cfg = TileConfig(bm, bn, bk, 8, warps, 3)
    return replace(cfg, num_stages=choose_num_stages(cfg, problem, device))


def select_config(
    problem: GemmProblem,
    device: DeviceInfo,
    config: TileConfig | dict | None = None,
    pipeline: str | int | None = None,
) -> TileConfig:
    """Explicit config (validated) > heuristic; then the pipeline override."""
    if config is None:
        cfg = heuristic_config(problem, device)
    elif isinstance(config, TileConfig):
        cfg = config
    elif isinstance(config, dict):
        cfg = TileConfig.from_dict(config)
    else:
        raise TypeError(f"config must be a TileConfig or a dict, got {type(config).__name__}")
    if pipeline is not None:
        cfg = replace(cfg, num_stages=resolve_pipeline(pipeline, default_multi=max(cfg.num_stages, 3)))
    return cfg.validate(device, problem.elem_size, problem.acc_size)


# ----------------------------------------------------------------------------------
# Launch
# ----------------------------------------------------------------------------------
def _layout(a: torch.Tensor, b: torch.Tensor) -> str:
    """'N' for an operand whose rows are contiguous, 'T' for a transposed one."""
    la = "N" if a.stride(-1) == 1 else "T"
    lb = "N" if b.stride(-1) == 1 else "T"
    return la + lb


def problem_of(a: torch.Tensor, b: torch.Tensor) -> GemmProblem:
    batch = math.prod(a.shape[:-2]) if a.dim() > 2 else 1
    return GemmProblem(
        m=a.shape[-2], n=b.shape[-1], k=a.shape[-1], batch=batch,
        dtype=dtype_name(a.dtype), layout=_layout(a, b),
    )


def _collapse_batch(batch_shape, tensors):
    """Merge batch dims that every tensor can index with one stride.

    Returns (sizes, per-tensor strides) with size-1 dims dropped.  Dims i, i+1
    merge when for every tensor stride[i] == stride[i+1] * size[i+1] (always
    true for our own contiguous output and for broadcast stride-0 pairs).
    """
    nb = len(batch_shape)
    dims = [(batch_shape[i], [t.stride(i) for t in tensors]) for i in range(nb) if batch_shape[i] != 1]
    merged: list[tuple[int, list[int]]] = []
    for size, strides in dims:
        if merged:
            psize, pstrides = merged[-1]
            if all(ps == s * size for ps, s in zip(pstrides, strides)):
                merged[-1] = (psize * size, strides)
                continue
        merged.append((size, strides))
    return merged


def _max_offset(t: torch.Tensor) -> int:
    return sum((s - 1) * st for s, st in zip(t.shape, t.stride()) if s > 0)


def _dot_precision(dtype: torch.dtype) -> str:
    if dtype != torch.float32:
        return "ieee"
    return "tf32" if tf32_enabled() else "ieee"


def tf32_enabled() -> bool:
    """Does torch let float32 matmuls use TF32?  The same rule torch follows."""
    matmul = torch.backends.cuda.matmul
    precision = getattr(matmul, "fp32_precision", None)  # torch >= 2.9 API
    if precision == "tf32":
        return True
    if precision == "ieee":
        return False
    return bool(matmul.allow_tf32)


def gemm(
    a: torch.Tensor,
    b: torch.Tensor,
    out: torch.Tensor,
    *,
    addend: torch.Tensor | None = None,
    alpha: float = 1.0,
    beta: float = 0.0,
    config: TileConfig | dict | None = None,
    pipeline: str | int | None = None,
) -> torch.Tensor:
    """out = alpha * a @ b (+ beta * addend), written in place; returns ``out``.

    ``a`` is (*batch, M, K), ``b`` (*batch, K, N), ``out`` and ``addend``
    (*batch, M, N), all of one batch shape (broadcast operands arrive as
    stride-0 expanded views).  Any strides; nothing is copied.
    """
    M, K = a.shape[-2:]
    N = b.shape[-1]
    batch_shape = tuple(out.shape[:-2])
    if out.numel() == 0:
        return out
    device = device_info(a.device)
    problem = problem_of(a, b)
    cfg = select_config(problem, device, config, pipeline)
    if beta == 0:
        addend = None  # torch's rule: beta=0 ignores the addend, NaN and Inf included
    tensors = [a, b, out] + ([addend] if addend is not None else [])
    dims = _collapse_batch(batch_shape, tensors)
    # The kernel indexes one batch dimension; any further (rare: a broadcast
    # dim between two non-broadcast ones) are looped over here, as views.
    outer, inner = dims[:-1], (dims[-1] if dims else (1, [0] * len(tensors)))
    index_64 = any(_max_offset(t) > _INT32_MAX for t in tensors)
    if K > 0 and (out.dtype != a.dtype and out.dtype not in SUPPORTED_DTYPES):
        raise UnsupportedInputError(f"unsupported output dtype {out.dtype}")
    tiles = triton.cdiv(M, cfg.block_m) * triton.cdiv(N, cfg.block_n)
    if tiles * inner[0] > _INT32_MAX:
        raise RuntimeError(f"gemm: {tiles * inner[0]} programs exceed the grid limit of 2^31 - 1")
    base_ptrs = [t for t in tensors]
    for outer_index in itertools.product(*[range(s) for s, _ in outer]):
        offsets = [sum(i * st[j] for i, (_, st) in zip(outer_index, outer)) for j in range(len(tensors))]
        views = [
            t.as_strided(t.shape[-2:], t.stride()[-2:], t.storage_offset() + off)
            for t, off in zip(base_ptrs, offsets)
        ]
        _launch(views, inner, M, N, K, alpha, beta, cfg, index_64, addend is not None)
    return out


def _launch(views, inner, M, N, K, alpha, beta, cfg: TileConfig, index_64: bool, has_addend: bool):
    a, b, c = views[:3]
    d = views[3] if has_addend else c  # d_ptr is never read without HAS_ADDEND
    batch, bstrides = inner
    sd = bstrides[3] if has_addend else 0
    grid = (batch * triton.cdiv(M, cfg.block_m) * triton.cdiv(N, cfg.block_n),)
    interpreting = interpreter_enabled()
    kwargs = dict(
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, GROUP_M=cfg.group_m,
        EVEN_K=(K % cfg.block_k == 0),
        HAS_ALPHA=(alpha != 1.0),
        HAS_ADDEND=has_addend,
        INDEX_64=index_64,
        ACC_FP64=(a.dtype == torch.float64),
        DOT_PRECISION=_dot_precision(a.dtype),
        UPCAST_OPERANDS=(interpreting and a.dtype == torch.bfloat16),
        num_warps=cfg.num_warps,
        num_stages=cfg.num_stages,
    )
    args = (
        a, b, c, d, M, N, K,
        bstrides[0], a.stride(0), a.stride(1),
        bstrides[1], b.stride(0), b.stride(1),
        bstrides[2], c.stride(0), c.stride(1),
        sd, d.stride(0), d.stride(1),
        float(alpha), float(beta),
    )
    if a.device.type == "cuda":
        with torch.cuda.device(a.device):
            gemm_kernel[grid](*args, **kwargs)
    else:
        gemm_kernel[grid](*args, **kwargs)


__all__ = [
    "ConfigError",
    "UnsupportedInputError",
    "gemm",
    "heuristic_config",
    "select_config",
    "unsupported_reason",
    "problem_of",
]
