"""tritongemm: a pipelined Triton GEMM library for PyTorch.

Public API (torch signatures and semantics, all differentiable)::

    tritongemm.matmul, mm, bmm, addmm, baddbmm, linear
    tritongemm.scaled_mm           # fp8 (torch._scaled_mm's semantics), fused epilogues
    tritongemm.nn.Linear, tritongemm.nn.convert
    tritongemm.patch()             # route torch's matmul family here
    tritongemm.explain(a, b)       # which kernel and config a call would use, and why
    tritongemm.tune(problems)      # autotune into the persistent on-disk cache
    tritongemm.TileConfig          # the tiling hierarchy as a value
    tritongemm.PIPELINES           # single_stage / double_buffer / multi_stage

Where things live (imports flow down this list, never up)::

    kernels/        Triton code only
    device.py       device facts (and named GPUs' budgets)
    pipelines.py    the three mainloop schemes (single_stage, double_buffer, multi_stage)
    problem.py      GemmProblem: sizes, dtype, layouts
    configs.py      TileConfig: the tiling hierarchy as values
    semantics.py    torch's rules: dtypes, TF32, autocast, activations
    call.py         GemmCall: the one value that describes a call
    heuristics/     pure (problem, device) -> config rules
    selection.py    explicit > registered sources (tuning cache) > heuristic
    eligibility.py  which kernel can take which operand layouts
    plan.py         Plan: config + kernel + why
    launch/         the launch cache and one launcher per kernel
    autograd.py     the autograd op (eager Function + custom op for compile)
    batched.py      the one batched GEMM every public function reaches
    api.py          the public functions; scaled.py (fp8), explain.py, nn.py, float8.py, patch.py on top
    tuning/         autotuner and cache; registers itself as a config source
"""

import os as _os

from . import (
    _compat,  # noqa: F401  (first: an unsupported Triton/torch fails here, named, not later)
    nn,
    ops,  # noqa: F401  (registers torch.ops.tritongemm.gemm, which traced calls and DTensor use)
)
from ._version import __version__ as __version__
from .api import addmm, baddbmm, bmm, linear, matmul, mm
from .autograd import set_poison_outputs as _set_poison_outputs
from .configs import PIPELINES, ConfigError, TileConfig
from .device import KNOWN_DEVICES, DeviceInfo, device_info, interpreter_enabled
from .explain import explain
from .heuristics import heuristic_config
from .launch import clear_plan_cache
from .patch import PatchStats, patch
from .problem import GemmProblem
from .scaled import scaled_mm
from .selection import select_config
from .semantics import UnsupportedInputError
from .tuning import candidate_configs, set_autotune_on_first_call, tune

if _os.environ.get("TRITONGEMM_POISON_OUTPUTS", "0") == "1":
    _set_poison_outputs(True)

__all__ = [
    "matmul",
    "mm",
    "bmm",
    "addmm",
    "baddbmm",
    "linear",
    "scaled_mm",
    "nn",
    "patch",
    "PatchStats",
    "TileConfig",
    "PIPELINES",
    "ConfigError",
    "GemmProblem",
    "candidate_configs",
    "DeviceInfo",
    "KNOWN_DEVICES",
    "device_info",
    "interpreter_enabled",
    "UnsupportedInputError",
    "heuristic_config",
    "select_config",
    "explain",
    "clear_plan_cache",
    "tune",
    "set_autotune_on_first_call",
]
