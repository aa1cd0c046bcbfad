"""One value describes a GEMM call: what the epilogue does, what the caller asked for.

    out = act(alpha * a @ b + beta * addend) + residual       (act: the epilogue's activation)

``GemmCall`` is built once at the API edge, travels unchanged through the
autograd op (it sits on the autograd context) to the launch layer, and *is*
the launch-cache key together with the operands' layout signature
(``launch.layout_signature``): an option added here is part of the key
without anyone listing it.  The problem sizes are not repeated here: they
are the operands' shapes, which the layout signature carries.

The values are named tuples: building and hashing one costs well under a
microsecond, which matters on a path that runs for every matmul.
"""

from __future__ import annotations

import json
from typing import NamedTuple

import torch

from .configs import TileConfig


class Epilogue(NamedTuple):
    """What the kernel does with the accumulator before storing it.

    ``alpha`` and ``beta`` are values (a call with another alpha is another
    call); ``addend`` says a D tensor is read (torch's rule: never when
    beta == 0, so NaN in D does not propagate), ``residual`` that R is added
    after the activation, ``store_preact`` that the pre-activation is written
    too (for backward).  ``scaling`` dequantizes fp8 operands first,
    ``acc * scale_a * scale_b`` (``scaled_mm``): "tensorwise" (one scale each),
    "rowwise" (one per row of A, one per column of B), or one of ``BLOCK_SCALINGS``
    (a scale per block of 128 of K); the scale tensors are given per call, like
    the operands.
    """

    activation: str = "none"
    alpha: float = 1.0
    beta: float = 0.0
    addend: bool = False
    residual: bool = False
    store_preact: bool = False
    scaling: str = "none"

    @property
    def scaled(self) -> bool:
        return self.alpha != 1.0


#: Block-scaled fp8 (``Epilogue.scaling``, DeepSeek-V3's recipe and ``torch._scaled_mm``'s): for each
#: ``SCALE_BLOCK_K`` of K, how many rows of A and how many columns of B share one scale.  1 x 128 blocks
#: suit activations (a scale per token), 128 x 128 blocks weights.
BLOCK_SCALINGS = {
    "blockwise_1x128_128x128": (1, 128),
    "blockwise_1x128_1x128": (1, 1),
    "blockwise_128x128_1x128": (128, 1),
}
SCALE_BLOCK_K = 128


class Request(NamedTuple):
    """What the caller forced: a config, a mainloop scheme, a way of splitting K (None: ours to choose)."""

    config: TileConfig | None = None
    pipeline: str | int | None = None
    decomposition: str | None = None


class GemmCall(NamedTuple):
    """Everything about a call that is not a tensor."""

    epilogue: Epilogue = Epilogue()
    request: Request = Request()
    #: The stored dtype (None: the operands').
    out_dtype: torch.dtype | None = None
    #: ``tl.dot`` input precision for float32: "tf32" or "ieee", read from torch's settings at the API edge
    #: ("auto" in a torch.compile trace: read when the custom op runs).  For fp8 operands, "fast" sums
    #: products in the tensor cores' reduced-precision accumulator (``use_fast_accum``).
    precision: str = "ieee"


def plain_epilogue(bias: bool = False) -> Epilogue:
    """``a @ b``, or with ``bias`` ``a @ b + 1 * bias``, built from literals: for code Dynamo traces,
    where under dynamic shapes a float read off a module-level object (``PLAIN_EPILOGUE``) becomes a
    symbol that the trace then restarts to specialize."""
    return Epilogue("none", 1.0, 1.0, True) if bias else Epilogue("none", 1.0, 0.0)


#: ``plain_epilogue()`` made once, for the eager hot path.
PLAIN_EPILOGUE = plain_epilogue()


NO_REQUEST = Request()


def make_request(config=None, pipeline=None, decomposition=None) -> Request:
    """A ``Request`` (a dict config becomes a ``TileConfig``); the shared empty one when nothing is forced."""
    if config is None and pipeline is None and decomposition is None:
        return NO_REQUEST
    if isinstance(config, dict):
        config = TileConfig.from_dict(config)
    elif config is not None and not isinstance(config, TileConfig):
        raise TypeError(f"config must be a TileConfig or a dict, got {type(config).__name__}")
    return Request(config, pipeline, decomposition)


def _config_json(config) -> str | None:
    return None if config is None else json.dumps(config.to_dict(), sort_keys=True)


def _parse_pipeline(pipeline: str | None) -> str | int | None:
    """The ops carry ``pipeline`` as a string: a name, or a stage count."""
    return int(pipeline) if pipeline is not None and pipeline.isdigit() else pipeline


def op_args(call: GemmCall, a, b, addend, residual) -> tuple:
    """``call`` on these tensors as the arguments of ``torch.ops.tritongemm.gemm`` (``ops.py``): the
    tensors, then every field as a plain value the op schema takes (a config as JSON)."""
    ep, req = call.epilogue, call.request
    pipeline = None if req.pipeline is None else str(req.pipeline)
    return (a, b, addend, residual, float(ep.alpha), float(ep.beta), ep.activation, call.out_dtype, pipeline,
            req.decomposition, _config_json(req.config), call.precision)  # fmt: skip


def from_op_args(args) -> tuple:
    """The op's arguments back as (call, a, b, addend, residual): the inverse of ``op_args``."""
    (
        a,
        b,
        addend,
        residual,
        alpha,
        beta,
        activation,
        out_dtype,
        pipeline,
        decomposition,
        config_json,
        *rest,
    ) = args
    # (defaults the dispatcher may leave out: precision, route, store_preact)
    precision = rest[0] if rest else "ieee"
    config = TileConfig.from_dict(json.loads(config_json)) if config_json else None
    request = Request(config, _parse_pipeline(pipeline), decomposition)
    store = activation != "none" and (rest[2] if len(rest) > 2 else True)
    ep = Epilogue(activation, alpha, beta, addend is not None and beta != 0, residual is not None, store)
    return GemmCall(ep, request, out_dtype, precision), a, b, addend, residual


__all__ = [
    "Epilogue",
    "GemmCall",
    "NO_REQUEST",
    "PLAIN_EPILOGUE",
    "plain_epilogue",
    "Request",
    "from_op_args",
    "make_request",
    "op_args",
]
