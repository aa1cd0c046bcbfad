"""What tuning measures with: a problem's operand copies, the launch of one config, timing, the check.

Copies of the inputs rotate so that no timed call finds its operands in L2;
every candidate's output is checked against torch's before it is timed.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass

import torch

from .. import launch
from ..planning.call import Epilogue, GemmCall, Request
from ..planning.configs import TileConfig
from ..planning.problem import GemmProblem
from ..semantics import dot_precision
from ..testing import (
    LIBRARY_TF32_TOLERANCE,
    LIBRARY_TOLERANCES,
    make_matrix,
    rotation_copies,
    time_samples,
)

#: Milliseconds of timed repetitions per candidate (``do_bench``'s ``rep``) and of warm-up.
DEFAULT_BENCH_MS = 25
WARMUP_MS = 5

#: Most operand copies tuning rotates through (memory; the rule is ``testing.rotation_copies``).
MAX_COPIES = 16

TORCH_DTYPES = {
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float32": torch.float32,
    "float64": torch.float64,
    "float8_e4m3fn": torch.float8_e4m3fn,
    "float8_e5m2": torch.float8_e5m2,
}
#: What an fp8 problem is tuned for: ``scaled_mm`` with rowwise scales and a bf16 output (the scales'
#: recipe and the output dtype change the epilogue only, not which tile is fastest).
FP8_OUT_DTYPE = torch.bfloat16
FP8_EPILOGUE = Epilogue(scaling="rowwise")


# ----------------------------------------------------------------------------------
# Inputs
# ----------------------------------------------------------------------------------
@dataclass
class Operands:
    """One copy of a problem's inputs and output: ``out = a @ b``."""

    a: torch.Tensor
    b: torch.Tensor
    out: torch.Tensor
    #: fp8 operands' rowwise scales (``scale_a`` (M,), ``scale_b`` (N,), contiguous), else none.
    scales: tuple = ()


def make_operands(
    problem: GemmProblem, torch_device: torch.device, copies: int, seed: int = 0
) -> list[Operands]:
    """``copies`` independent random copies of the problem's operands, in its layout.

    >>> ops = make_operands(GemmProblem(32, 32, 32, dtype="float32", layout="TN"), torch.device("cpu"), 2)
    >>> ops[0].a.stride()
    (1, 32)
    """
    dtype = TORCH_DTYPES[problem.dtype]
    gen = torch.Generator(device=torch_device)
    gen.manual_seed(seed)
    lead = (problem.batch,) if problem.batch > 1 else ()
    if dtype.itemsize == 1:
        if problem.batch > 1:
            raise ValueError(
                f"fp8 problems are one matrix (scaled_mm takes no batch), got batch {problem.batch}"
            )
        return [_fp8_operands(problem, dtype, torch_device, gen) for _ in range(copies)]
    return [
        Operands(
            a=make_matrix(problem.m, problem.k, problem.layout[0], dtype, torch_device, lead, gen),
            b=make_matrix(problem.k, problem.n, problem.layout[1], dtype, torch_device, lead, gen),
            out=torch.empty(*lead, problem.m, problem.n, dtype=dtype, device=torch_device),
        )
        for _ in range(copies)
    ]


def _fp8_operands(problem: GemmProblem, dtype, torch_device, gen) -> Operands:
    """fp8 operands in the problem's layout (cast from bf16 ones, which keeps their strides) and
    rowwise scales; one matrix (``scaled_mm`` takes no batch)."""
    a = make_matrix(problem.m, problem.k, problem.layout[0], torch.bfloat16, torch_device, (), gen).to(dtype)
    b = make_matrix(problem.k, problem.n, problem.layout[1], torch.bfloat16, torch_device, (), gen).to(dtype)
    scales = tuple(
        torch.rand(n, generator=gen, device=torch_device, dtype=torch.float32) + 0.5
        for n in (problem.m, problem.n)
    )
    out = torch.empty(problem.m, problem.n, dtype=FP8_OUT_DTYPE, device=torch_device)
    return Operands(a=a, b=b, out=out, scales=scales)


def reference(ops: Operands) -> torch.Tensor:
    """torch's result for one copy, in the output's dtype (fp8: the dequantized product in fp32)."""
    if ops.scales:
        sa, sb = ops.scales
        return ((ops.a.float() @ ops.b.float()) * sa[:, None] * sb[None, :]).to(ops.out.dtype)
    ref = torch.empty_like(ops.out)
    torch.matmul(ops.a, ops.b, out=ref)
    return ref


def copies_for(problem: GemmProblem, on_cuda: bool) -> int:
    """How many operand copies to rotate through so that L2 never holds the next call's inputs."""
    if not on_cuda:
        return 2  # the interpreter has no L2 to flatter; two copies still exercise the rotation
    copy_bytes = problem.batch * (problem.m * problem.k + problem.k * problem.n + problem.m * problem.n)
    copy_bytes *= problem.elem_size
    return rotation_copies(copy_bytes, most=MAX_COPIES)


class Rotation:
    """Calls ``launch`` on the next operand copy each time it is called."""

    def __init__(self, copies: list[Operands], launch: Callable[[Operands], None]):
        self.copies, self.launch, self.next = copies, launch, 0

    def __call__(self) -> None:
        ops = self.copies[self.next]
        self.next = (self.next + 1) % len(self.copies)
        self.launch(ops)


# ----------------------------------------------------------------------------------
# Launching and timing
# ----------------------------------------------------------------------------------
def launch_torch(ops: Operands) -> None:
    # out= on purpose: inside tritongemm.patch() an out= call is left to torch,
    # so the baseline is always torch's own kernel (cuBLAS), never ours.
    if ops.scales:
        sa, sb = ops.scales
        torch._scaled_mm(ops.a, ops.b, sa[:, None], sb[None, :], out_dtype=ops.out.dtype, out=ops.out)
        return
    torch.matmul(ops.a, ops.b, out=ops.out)


def pointer_launcher(config: TileConfig) -> Callable[[Operands], None]:
    def run(ops: Operands) -> None:
        if ops.scales:  # fp8: what scaled_mm launches
            call = GemmCall(FP8_EPILOGUE, Request(config=config), FP8_OUT_DTYPE, "ieee")
            launch.gemm(call, ops.a, ops.b, ops.out, None, None, None, ops.scales)
            return
        call = GemmCall(request=Request(config=config), precision=dot_precision(ops.a.dtype))
        launch.gemm(call, ops.a, ops.b, ops.out)

    return run


#: Kernel path name (as in cache keys) -> builds the launch function of a config.
KERNEL_LAUNCHERS: dict[str, Callable[[TileConfig], Callable[[Operands], None]]] = {
    "pointer": pointer_launcher,
}


def median_ms(fn: Callable[[], None], on_cuda: bool, bench_ms: int = DEFAULT_BENCH_MS) -> float:
    """Median milliseconds per call of ``fn`` after warm-up.

    CUDA: ``triton.testing.do_bench`` (which also clears L2 between calls).
    CPU (Triton's interpreter): ``time.perf_counter`` over at least 3 calls; ``tune``
    keeps none of these (they say nothing about a GPU), tests of its choosing do.
    """
    device = torch.device("cuda" if on_cuda else "cpu")
    return statistics.median(time_samples(fn, device, warmup_ms=WARMUP_MS, rep_ms=bench_ms))


def check_result(out: torch.Tensor, ref: torch.Tensor, dtype: str) -> str | None:
    """Why ``out`` is not ``ref`` within the dtype's tolerance, or None when it is.

    >>> check_result(torch.ones(4, 4), torch.zeros(4, 4) + 1, "float32") is None
    True
    """
    wide = torch.float64 if dtype == "float64" else torch.float32
    expected = ref.to(wide)
    scale = expected.abs().max().clamp_min(1e-6)
    err = ((out.to(wide) - expected).abs().max() / scale).item()
    # Against torch's result in the same dtype, relative to max|C|: the library bound, and
    # TF32's for float32 (torch may use it; the check runs wherever tuning does).
    out_dtype = FP8_OUT_DTYPE if dtype.startswith("float8") else TORCH_DTYPES[dtype]
    tol = LIBRARY_TF32_TOLERANCE if dtype == "float32" else LIBRARY_TOLERANCES[out_dtype]
    if not err <= tol:  # also catches NaN: unwritten (poisoned) elements
        return f"wrong result: max |C - torch| = {err:.3g} x max|C| (tolerance {tol:g})"
    return None
