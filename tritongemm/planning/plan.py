"""What a call will run: the config, the kernel, and why (``Plan``).

``plan`` works on plain values (a ``GemmProblem``, a ``DeviceInfo``, the
caller's ``Request`` and the operands' ``Operand`` layouts), so the same
function serves the launch layer (from tensors) and ``explain()`` (from
tensors, shapes, or another device's budgets).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, replace
from typing import NamedTuple

import torch

from ..device import DeviceInfo
from .call import Request
from .configs import TMA_KERNELS, TileConfig
from .eligibility import (
    FP8_DTYPES,
    Operand,
    gemv_unsupported_reason,
    stream_k_unsupported_reason,
    tma_operand_reason,
    tma_unsupported_reason,
    vector_bytes,
    warp_specialized_shared_bytes,
    warp_specialized_unsupported_reason,
)
from .heuristics.epilogue import epilogue_config
from .heuristics.fp8 import accumulation_config, block_scaled_config, fp8_choice
from .problem import GemmProblem
from .selection import select
from .unaligned import elementwise_tile, padding_estimate

#: Kernels that store C through a TMA descriptor (so an unaligned C is padded too).
TMA_STORE_KERNELS = TMA_KERNELS

#: How unaligned operands are treated: "auto" (the cost model), "always" pad, "never" pad.
PADDING_POLICIES = ("auto", "always", "never")


class Alignment(NamedTuple):
    """What a plan does about operands whose strides the fast loads cannot take (docs/unaligned.md).

    ``path`` is "pad" (copy ``padded`` into aligned workspaces, run the aligned
    kernel, copy C back), "hinted" (the pointer kernel with the widest loads the
    strides allow) or "plain" (the pointer kernel, element-wise loads).
    """

    path: str
    padded: tuple[str, ...]
    why: str


@dataclass(frozen=True)
class Plan:
    """What a call will run: the config, where it came from, the kernel, and why."""

    config: TileConfig
    source: str
    #: What runs, a key of ``launch.LAUNCHERS``: the config's ``launcher``, or the fallback's.
    kernel: str
    fallback: str | None = None
    problem: GemmProblem | None = None
    device: DeviceInfo | None = None
    #: None when every operand is aligned (the common case).
    alignment: Alignment | None = None
    #: Why a ``torch.compile`` graph runs this kernel; None: the stock model's aten op (``compiled_reason``).
    compiled: str | None = None

    def describe(self) -> str:
        lines = []
        if self.problem is not None:
            p = self.problem
            batch = f"{p.batch} x " if p.batch != 1 else ""
            lines.append(
                f"problem: {batch}{p.m}x{p.n}x{p.k} {p.dtype} {p.layout}"
                + (f" on {self.device.name}" if self.device else "")
            )
        lines.append(f"kernel : {self.kernel}" + (f" (fell back: {self.fallback})" if self.fallback else ""))
        lines.append(f"config : {self.config.short()}")
        lines.append(f"why    : {self.source}")
        if self.alignment is not None:
            al = self.alignment
            what = (
                f"copy {', '.join(al.padded)} to aligned workspaces"
                if al.path == "pad"
                else f"{al.path} pointer loads"
            )
            lines.append(f"align  : {what} ({al.why})")
        if self.device is not None and not self.device.interpreter:
            lines.append(
                "compile: the aten op, as in the stock model (no edge over cuBLAS; "
                "TRITONGEMM_COMPILED_GEMMS=always keeps this kernel)"
                if self.compiled is None
                else f"compile: this kernel ({self.compiled})"
            )
        return "\n".join(lines)


def plan(
    problem: GemmProblem,
    device: DeviceInfo,
    request: Request,
    a: Operand,
    b: Operand,
    c: Operand,
    dtype: torch.dtype,
    out_dtype: torch.dtype,
    padding: str = "auto",
    block_scaled: bool = False,
    fast_accumulation: bool = False,
    activation: str = "none",
) -> Plan:
    """Choose the config (``selection.select``), then the kernel the operands allow, then whether to copy
    unaligned operands into aligned workspaces (``padding``: one of ``PADDING_POLICIES``).
    ``block_scaled``: fp8 operands with a scale per block of K (``call.BLOCK_SCALINGS``);
    ``fast_accumulation``: fp8 products summed without promotion (``use_fast_accum``); ``activation``:
    the epilogue's (``heuristics.epilogue``)."""
    chosen, source = select(problem, device, request)
    if source.startswith("heuristic"):
        chosen, why = epilogue_config(chosen, problem, device, activation)
        if why:
            source += f"; {why}"
    if dtype in FP8_DTYPES and not block_scaled and source.startswith("heuristic"):
        chosen, why = accumulation_config(chosen, problem, device, fast_accumulation)
        if why:
            source += f"; {why}"
    if block_scaled:
        if request.config is None:  # (a tuned tile is the rowwise recipe's)
            chosen, rule = fp8_choice(problem, device, block_scaled=True)
            source = f"heuristic: {rule}"
        chosen, why = block_scaled_config(chosen)
        if why:
            source += f"; {why}"
    cfg, kernel, fallback = _kernel_for(chosen, problem, device, a, b, c, dtype, out_dtype)
    alignment = None
    if kernel != "gemv" and _misaligned(a, b, c, chosen.uses_tma):
        padded = _padded_plan(chosen, problem, device, a, b, c, dtype, out_dtype, padding)
        if isinstance(padded, tuple):
            (cfg, kernel, fallback), alignment = padded
        else:
            alignment = _unpadded_alignment(a, b, kernel, padded)
            small = _elementwise_config(problem, device, request, source, a, b)
            if small is not None:
                cfg, kernel, fallback = _kernel_for(small, problem, device, a, b, c, dtype, out_dtype)
                source += "; element-wise loads: instead, small tiles with a long K step (unaligned.elementwise_tile)"
    chosen = Plan(cfg, source, kernel, fallback, problem, device, alignment)
    return replace(chosen, compiled=compiled_reason(chosen, request, dtype, out_dtype, activation))


def compiled_reason(
    chosen: Plan | None,
    request: Request,
    dtype: torch.dtype,
    out_dtype: torch.dtype,
    activation: str = "none",
) -> str | None:
    """Why a GEMM in a ``torch.compile`` graph runs tritongemm's kernel; None: it is handed to the
    aten op, as in the stock model.  ``chosen`` is None where no plan could be made (symbolic
    sizes): then only the request and the dtypes decide.

    Inductor fuses the operations around an aten matmul and chooses cuBLAS or its own templates
    for it (max-autotune); a user kernel it can only call.  On aligned operands tritongemm's
    kernels match cuBLAS (``benchmarks/results/h100/llm.csv``), so there the aten op costs
    nothing and gains the fusions.  Where cuBLAS is weak -- unaligned leading dimensions, at a
    fraction of its speed -- or where the caller asked for something aten cannot do, the kernel
    runs.  So does a fused ``activation`` on a short K (``FUSED_ACTIVATION_MAX_K``) and a large
    output (``FUSED_ACTIVATION_MIN_OUTPUTS``): Inductor runs the activation as a pass of its own over
    the output, which costs about 470/K of the GEMM's time.
    """
    if dtype in FP8_DTYPES:
        return "fp8: scaled_mm is an op of its own"
    if request.config is not None or request.pipeline is not None or request.decomposition is not None:
        return "a config, pipeline or decomposition was asked for"
    if out_dtype != dtype:
        return "the output dtype differs from the operands' (aten would round the product first)"
    if chosen is not None and chosen.alignment is not None:
        if chosen.problem is not None and _sizes_unaligned(chosen.problem) and _inductor_pads_shapes():
            # Inductor pads a compute-bound matmul's unaligned sizes itself (``shape_padding``) and then
            # runs cuBLAS aligned: measured on the H100, GPT-2's and BERT's compiled vocabulary heads
            # ran 0.83-0.88 of stock compiled on this kernel.  Unaligned strides of views it leaves.
            return None
        return f"unaligned operands ({chosen.alignment.path}), where cuBLAS is slow"
    problem = chosen.problem if chosen is not None else None
    if activation != "none" and problem is not None:
        outputs = problem.m * problem.n * problem.batch
        if problem.k <= FUSED_ACTIVATION_MAX_K and outputs >= FUSED_ACTIVATION_MIN_OUTPUTS:
            return f"a fused {activation}: at K = {problem.k} the pass it saves is a large share of the GEMM"
    return None


#: Where a traced GEMM's fused activation keeps tritongemm's kernel (``compiled_reason``).  The pass
#: Inductor would run costs about 470/K of the GEMM (23% at K = 2048).  Measured on an H100, bf16, bias +
#: GELU or tanh-GELU (``benchmarks/results/h100/sweeps/short_k.txt``, CUDA-graph replays): compiled, the
#: fused kernel against ``torch.compile``'s cuBLAS then fused pointwise, 1.29-1.41 at K = 768-1024 (rows
#: 4096-12608).  Without CUDA graphs the kernel's opaque call costs host time that cuBLAS and Inductor's
#: pass do not (profiled in compiled GPT-2: about 80 us a call against addmm's 39, under the
#: profiler), which a pass over a small output does not repay: GPT-2's 4096 x 3072 fc1 (NN, its
#: Conv1D) took 45 us against cuBLAS's 31 and a 15 us pass, and GPT-2 compiled read 0.77 of compiled
#: stock with it.  So only outputs of at least ``FUSED_ACTIVATION_MIN_OUTPUTS`` elements keep the kernel
#: (BERT-base's 8192 x 3072 fc1 and ViT-B/16's 12608 x 3072 do: 1.02 and 1.12 of compiled stock).
FUSED_ACTIVATION_MAX_K = 2048
FUSED_ACTIVATION_MIN_OUTPUTS = 2**24


def _sizes_unaligned(problem: GemmProblem) -> bool:
    """Is a size itself a leading dimension of no whole 16 bytes (so contiguous operands are unaligned)?"""
    return any(size * problem.elem_size % 16 for size in (problem.m, problem.n, problem.k))


def _inductor_pads_shapes() -> bool:
    """Inductor's ``shape_padding`` switch (on by default; read only once Inductor is loaded)."""
    config = sys.modules.get("torch._inductor.config")
    return True if config is None else bool(getattr(config, "shape_padding", True))


def _elementwise_config(problem, device, request: Request, source: str, a: Operand, b: Operand):
    """The heuristic's own tile for operands loaded element by element, where the heuristic chose."""
    if request.pipeline is not None or request.decomposition is not None:
        return None  # (an explicit config or a tuned one: ``source`` says so below)
    if not source.startswith("heuristic") or problem.elem_size != 2 or device.interpreter:
        return None  # (the interpreter keeps its own small tiles: there only its speed matters)
    if min(vector_bytes(a), vector_bytes(b)) > problem.elem_size:
        return None  # vector loads remain (path (b)): the heuristic's tile stands
    return elementwise_tile(problem, device)


def _kernel_for(
    cfg: TileConfig,
    problem: GemmProblem,
    device: DeviceInfo,
    a: Operand,
    b: Operand,
    c: Operand,
    dtype: torch.dtype,
    out_dtype: torch.dtype,
) -> tuple[TileConfig, str, str | None]:
    """(config, kernel, why it fell back) for these operand layouts."""
    if dtype in FP8_DTYPES:
        return _fp8_kernel_for(cfg, device, a, b, c, dtype, out_dtype, problem.batch > 1)
    batched = problem.batch > 1
    kernel, fallbacks = "pointer", []
    if cfg.stream_k:
        reason = stream_k_unsupported_reason(problem.k, batched)
        if reason is None:
            kernel = "stream_k"  # the TMA kernel's own Stream-K replaces this below when TMA applies
        else:
            fallbacks.append(reason)
            cfg = replace(cfg, stream_k=False)
    if cfg.kernel == "gemv":
        reason = gemv_unsupported_reason(problem.m, batched)
        if reason is None:
            kernel = "gemv"
        else:
            fallbacks.append(reason)
            cfg = replace(cfg, kernel="pointer")
    if cfg.uses_tma:
        reason = tma_unsupported_reason(a, b, c, dtype, out_dtype, device, batched)
        if reason is None and cfg.kernel == "gluon_ws":
            ws_reason = warp_specialized_unsupported_reason(cfg, a, b, c, dtype, out_dtype, device, batched)
            if ws_reason is None:
                return cfg, "gluon_ws", "; ".join(fallbacks) or None
            # The same tile on the TMA kernel, without warp specialization.
            fallbacks.append(ws_reason)
            cfg = cfg.without_warp_specialization()
        if reason is None:
            kernel = cfg.launcher
        else:
            # Same tiles on the pointer kernel (Stream-K included); the TMA-only knobs do not apply.
            fallbacks.append(reason)
            cfg = replace(cfg.without_warp_specialization(), kernel="pointer", epilogue_subtile=False)
    return cfg, kernel, "; ".join(fallbacks) or None


def _fp8_kernel_for(cfg, device, a, b, c, dtype, out_dtype, batched) -> tuple[TileConfig, str, str | None]:
    """fp8 runs on the warp-specialized kernel where it can, else on the pointer kernel (the GEMV,
    Stream-K and TMA kernels take 2-byte operands only)."""
    reasons = []
    if cfg.kernel == "gluon_ws":
        # The tiles are chosen for a 2-byte output; a 4-byte one's staging tile costs ring slots.
        while cfg.num_stages > 2 and (
            warp_specialized_shared_bytes(cfg, 1, out_dtype.itemsize) > device.smem_per_block
        ):
            cfg = replace(cfg, num_stages=cfg.num_stages - 1)
        reason = warp_specialized_unsupported_reason(cfg, a, b, c, dtype, out_dtype, device, batched)
        if reason is None:
            return cfg, "gluon_ws", None
        reasons.append(reason)
    elif cfg.launcher != "pointer":
        reasons.append(
            f"the {cfg.launcher} kernel takes 2-byte operands only: fp8 runs on the pointer kernel"
        )
    pointer = replace(
        cfg.without_warp_specialization() if cfg.kernel == "gluon_ws" else cfg,
        kernel="pointer",
        epilogue_subtile=False,
        stream_k=False,
    )
    return pointer, "pointer", "; ".join(reasons) or None


def _misaligned(a: Operand, b: Operand, c: Operand, wants_tma: bool) -> bool:
    """Does some operand keep the kernel from its fast loads (or, for a TMA config, stores)?"""
    return any(tma_operand_reason(n, op) for n, op in (("A", a), ("B", b))) or (
        wants_tma and (not c.row_major or tma_operand_reason("C", c) is not None)
    )


def _padded_plan(cfg, problem, device, a, b, c, dtype, out_dtype, padding):
    """((config, kernel, fallback), Alignment) when copying to aligned workspaces is chosen, else why not."""
    if padding == "never":
        return "copies turned off (padding='never')"
    if problem.elem_size != 2:
        # cp.async moves 4-byte elements one by one; only 2-byte ones lose asynchronous loads.
        return f"{problem.dtype} loads stay asynchronous on any stride: no copy"
    if problem.k == 0:
        return "K = 0: nothing is read"
    names = [n for n, op in (("A", a), ("B", b)) if tma_operand_reason(n, op)]
    pa = a.aligned() if "A" in names else a
    pb = b.aligned() if "B" in names else b
    # C is padded only when the aligned run stores through TMA (the pointer kernel stores any stride).
    pc = c.aligned(row_major=True) if (not c.row_major or tma_operand_reason("C", c)) else c
    padded_cfg, kernel, fallback = _kernel_for(
        _on_tma(cfg, problem, device), problem, device, pa, pb, pc, dtype, out_dtype
    )
    tma = kernel in TMA_STORE_KERNELS
    if tma and pc is not c:
        names.append("C")
    elif not names:
        return "only C is unaligned, and the pointer kernel stores any stride"
    if kernel == "gemv":
        return "the GEMV kernel streams B once: a copy would double its traffic"
    shapes = {"A": problem.m * problem.k, "B": problem.k * problem.n, "C": problem.m * problem.n}
    elems = problem.batch * sum(shapes[n] for n in names)
    # One copy launch takes A and B in, one more takes C out (launch/aligned.py).
    launches = int("A" in names or "B" in names) + int("C" in names)
    estimate = padding_estimate(problem, elems, launches, min(vector_bytes(a), vector_bytes(b)), tma)
    target = "the TMA kernel" if tma else "the pointer kernel's 16-byte loads"
    if padding == "always":
        return (padded_cfg, kernel, fallback), Alignment(
            "pad", tuple(names), f"padding='always'; {estimate.words()}"
        )
    if not estimate.pays:
        return f"too small to repay a copy: {estimate.words()}"
    return (padded_cfg, kernel, fallback), Alignment("pad", tuple(names), f"for {target}: {estimate.words()}")


def _on_tma(cfg: TileConfig, problem: GemmProblem, device: DeviceInfo) -> TileConfig:
    """The tile the padded run uses: on TMA where the device has it, whatever the heuristic's menu said.

    The pointer kernel masks K on every step when K is not a multiple of 8,
    which keeps its loads element-wise even on padded strides (H100, 1023^3
    padded: 39 us on 64x128 pointer tiles, cuBLAS 31 us), while TMA clips
    out-of-bounds reads in hardware.  Only the general menu's sliced-K tiles (64x128 and up; the
    skinny and element-wise tiles were measured on the pointer kernel) of one batch move over.
    """
    menu_tile = cfg.block_m >= 64 and cfg.block_n >= 128
    plain = menu_tile and cfg.split_k == 1 and not cfg.stream_k and problem.batch == 1
    if cfg.kernel != "pointer" or not plain or device.capability < (9, 0) or device.interpreter:
        return cfg
    return replace(cfg, kernel="tma_persistent")


def _unpadded_alignment(a: Operand, b: Operand, kernel: str, why_not: str) -> Alignment:
    """The operands' own strides: the widest loads they allow (path (b)) or element-wise ones (path (c))."""
    narrow = [(n, vector_bytes(op), op.elem_size) for n, op in (("A", a), ("B", b)) if vector_bytes(op) < 16]
    widths = ", ".join(f"{n} {w} B" for n, w, _ in narrow)
    if not narrow:
        return Alignment("plain", (), f"C is stored without TMA; {why_not}")
    if kernel == "pointer" and any(w > e for _, w, e in narrow):
        return Alignment("hinted", (), f"the widest loads the strides allow: {widths}; {why_not}")
    return Alignment("plain", (), f"element-wise loads ({widths}); {why_not}")


def layout_letters(a: Operand, b: Operand) -> str:
    """'N' for an operand whose rows are contiguous, 'T' for a transposed one ("NT", ...)."""
    return ("N" if a.col_stride == 1 else "T") + ("N" if b.col_stride == 1 else "T")


__all__ = ["PADDING_POLICIES", "Alignment", "Plan", "layout_letters", "plan"]
