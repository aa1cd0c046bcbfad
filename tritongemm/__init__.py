"""tritongemm: a pipelined Triton GEMM library for PyTorch.

Public API (torch signatures and semantics, all differentiable)::

    tritongemm.matmul, mm, bmm, addmm, baddbmm, linear
    tritongemm.gated_linear        # act(linear(x, w_gate)) * linear(x, w_up): a GLU MLP's first half, one kernel
    tritongemm.mlp                 # linear(act(linear(x, w1, b1)), w2, b2): act's gradient in a GEMM's epilogue
    tritongemm.scaled_mm           # fp8 (torch._scaled_mm's semantics), fused epilogues
    tritongemm.nn.Linear, tritongemm.nn.GatedMLP, tritongemm.nn.convert
    tritongemm.patch()             # route torch's matmul family here
    tritongemm.explain(a, b)       # which kernel and config a call would use, and why
    tritongemm.tune(problems)      # autotune into the persistent on-disk cache
    tritongemm.TileConfig          # the tiling hierarchy as a value
    tritongemm.PIPELINES           # single_stage / double_buffer / multi_stage

Where things live, top down (each folder imports only from folders below it)::

    frontend/   the doors: api.py (matmul, mm, ..., linear), gated.py (gated_linear), mlp.py (mlp),
                nn.py presents modules.py (Linear, GatedMLP) and convert.py (fusion.py: which
                MLPs it fuses),
                patch.py, scaled.py (fp8 scaled_mm), float8.py (fp8 training), explain.py
    request/    a call made valid: autocast, torch's argument checks, same-batch views, torch or
                here (every reason), the repeated-call key and its entries' lookup
    autograd/   the differentiable op: eager Function (or a direct launch), torch.library ops
                for compile, DTensor's sharding rule, the repeated-call entries
    launch/     the launch cache and one launcher per kernel (native.py: the C++ helpers)
    planning/   what runs: configs (the tiling hierarchy), heuristics/, selection, eligibility,
                plan (config + kernel + why), problem and call values
    kernels/    Triton and Gluon code only
    tuning/     the autotuner and its persistent cache (a config source for planning)
    cli/        ``tritongemm tune|explain|cache``
    semantics.py, device.py   torch's rules every layer reads (dtypes, TF32, activations); device facts
"""

import os as _os
import sys as _sys

from . import _compat  # noqa: F401  (first: an unsupported Triton/torch fails here, named, not later)
from ._version import __version__ as __version__
from .autograd import ops  # noqa: F401  (registers torch.ops.tritongemm.gemm, which traced calls and DTensor use)
from .autograd.function import set_poison_outputs as _set_poison_outputs
from .device import KNOWN_DEVICES, DeviceInfo, device_info, interpreter_enabled
from .frontend import nn
from .frontend.api import addmm, baddbmm, bmm, linear, matmul, mm
from .frontend.explain import explain
from .frontend.gated import gated_linear
from .frontend.mlp import mlp
from .frontend.patch import PatchStats, patch
from .frontend.scaled import scaled_mm
from .launch import clear_plan_cache
from .planning.configs import PIPELINES, ConfigError, TileConfig
from .planning.heuristics import heuristic_config
from .planning.problem import GemmProblem
from .planning.selection import select_config
from .semantics import UnsupportedInputError
from .tuning import candidate_configs, set_autotune_on_first_call, tune

# ``tritongemm.nn`` is the public name of the module users swap layers from (``import tritongemm.nn``).
_sys.modules[__name__ + ".nn"] = nn

if _os.environ.get("TRITONGEMM_POISON_OUTPUTS", "0") == "1":
    _set_poison_outputs(True)

__all__ = [
    "matmul",
    "mm",
    "bmm",
    "addmm",
    "baddbmm",
    "linear",
    "gated_linear",
    "mlp",
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
