"""``TRITONGEMM_COMPILED_GEMMS=autotune``: Inductor times tritongemm's kernel against the aten ops.

A traced GEMM that aten can compute as asked (no config, pipeline or
decomposition requested, the operands' dtype out, no residual or stored
pre-activation, not fp8) becomes ``tritongemm::gemm_tuned``: one output, so
that Inductor's custom-op autotuning (``register_custom_op_autotuning``,
torch >= 2.13) takes it.  When Inductor lowers it, it benchmarks the op itself
(tritongemm's kernel, as ``gemm_extern`` runs it) against the stock model's
aten ops (``ops.aten_tuned``), which it traces, fuses and tunes as its own,
and keeps the faster for that shape.  The timing costs compile time, every mode, where
the "auto" route decides by rule (``plan.compiled_reason``) instead.  Where
the installed torch lacks custom-op autotuning the route is "auto", with a
warning.
"""

from __future__ import annotations

import warnings

import torch

from ..planning.eligibility import FP8_DTYPES

_REGISTERED: list[bool] = []  # [whether torch has it], once decided
#: The first torch whose custom-op autotuning lowers ``gemm_tuned`` (tested: 2.13; 2.11 fails to).
MIN_TORCH = "2.13"


def eligible(route: str, call, a: torch.Tensor, residual) -> bool:
    """Is this traced GEMM (``tritongemm::gemm``'s call, on ``route``) one Inductor may time against aten?"""
    request = call.request
    return (
        route == "autotune"
        and request.config is None
        and request.pipeline is None
        and request.decomposition is None
        and call.out_dtype in (None, a.dtype)
        and a.dtype not in FP8_DTYPES
        and residual is None
        and not call.epilogue.store_preact
    )


def available(op, decomposition) -> bool:
    """Register ``op`` (``gemm_tuned``'s definition: torch 2.11 takes no overload) with Inductor's
    custom-op autotuning, ``decomposition`` the choice it weighs against the op, once; it imports
    Inductor, which ``import tritongemm`` does not.  False where this torch has none."""
    if not _REGISTERED:
        try:
            if torch.torch_version.TorchVersion(torch.__version__) < MIN_TORCH:
                raise ImportError  # torch 2.11's lowering fails on the op's output (a TensorBox it unpacks)
            from torch._inductor.kernel.custom_op import CustomOpConfig, register_custom_op_autotuning
        except ImportError:
            warnings.warn(
                f"TRITONGEMM_COMPILED_GEMMS=autotune needs Inductor's custom-op autotuning of torch >= "
                f"{MIN_TORCH} (this is {torch.__version__}): the GEMMs are routed as with 'auto'",
                stacklevel=3,
            )
            _REGISTERED.append(False)
        else:
            register_custom_op_autotuning(op, configs=[CustomOpConfig(decomposition)])
            _REGISTERED.append(True)
    return _REGISTERED[0]
