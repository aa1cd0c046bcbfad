"""tritongemm: a pipelined Triton GEMM library for PyTorch.

Public API (torch signatures and semantics, all differentiable)::

    tritongemm.matmul, mm, bmm, addmm, baddbmm, linear
    tritongemm.nn.Linear, tritongemm.nn.convert
    tritongemm.patch()             # route torch's matmul family here
    tritongemm.explain(a, b)       # which kernel and config a call would use, and why
    tritongemm.tune(problems)      # autotune into the persistent on-disk cache
    tritongemm.TileConfig          # the tiling hierarchy as a value
    tritongemm.PIPELINES           # single_stage / double_buffer / multi_stage

Where things live: ``kernels/`` (Triton code only), ``configs.py`` (TileConfig,
candidate space), ``dispatch.py`` (config choice + launch), ``autograd.py``
(the autograd op), ``api.py`` (public functions), ``nn.py`` (modules),
``patch.py`` (torch routing), ``device.py`` (device facts).
"""

import os as _os

from . import nn
from .api import addmm, baddbmm, bmm, linear, matmul, mm
from .autograd import set_poison_outputs as _set_poison_outputs
from .configs import PIPELINES, ConfigError, GemmProblem, TileConfig, candidate_configs
from .device import DeviceInfo, device_info, interpreter_enabled
from .dispatch import UnsupportedInputError, clear_plan_cache, explain, heuristic_config, select_config
from .patch import PatchStats, patch
from .tuning import set_autotune_on_first_call, tune

__version__ = "0.1.0"

if _os.environ.get("TRITONGEMM_POISON_OUTPUTS", "0") == "1":
    _set_poison_outputs(True)

__all__ = [
    "matmul", "mm", "bmm", "addmm", "baddbmm", "linear", "nn", "patch", "PatchStats",
    "TileConfig", "PIPELINES", "ConfigError", "GemmProblem", "candidate_configs",
    "DeviceInfo", "device_info", "interpreter_enabled", "UnsupportedInputError",
    "heuristic_config", "select_config", "explain", "clear_plan_cache", "tune", "set_autotune_on_first_call",
]
