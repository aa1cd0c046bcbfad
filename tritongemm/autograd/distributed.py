"""tritongemm under tensor parallelism: DTensor operands (``torch.distributed.tensor``).

``parallelize_module`` (ColwiseParallel, RowwiseParallel, SequenceParallel)
and FSDP2 make weights and activations DTensors.  tritongemm grows no
communication of its own: it teaches DTensor the sharding of its one custom
op, ``tritongemm::gemm``, with ``register_sharding``, and DTensor does the
redistribution and collectives, then runs the op on each rank's local shards
(on tritongemm's kernels).  A DTensor is not a plain ``torch.Tensor``, so the
autograd op already sends it through the custom-op door (the one
``torch.compile`` uses); its registered backward calls the same op on the
gradients, so forward, backward and compiled graphs all meet one rule.

The rule, for ``out = act(alpha * a @ b + beta * addend) + residual`` with
``a`` (*, M, K), ``b`` (*, K, N), per mesh dimension:

* everything replicated;
* rows split: ``a`` and the epilogue operands sharded on M, ``b`` replicated;
* columns split: ``b`` and the epilogue operands sharded on N (column-wise
  parallel: the weight ``W`` is sharded on its rows, ``b = W.mT`` on N);
* a batch dimension split: every operand sharded on it;
* the reduction split (row-wise parallel): ``a`` sharded on K, ``b`` on K,
  the output a partial sum.  Only a linear epilogue survives that: ``addend``
  and ``residual`` become partial too (DTensor divides a replicated bias by
  the mesh size, as for torch's own ``addmm``), so the sum over ranks adds
  them once.  An activation is not linear, so ``gemm`` splits such a call:
  the GEMM with the linear part on the shards, the reduction, then the
  activation and the residual on the reduced sum (``split_epilogue``).

Nothing here is imported by ``import tritongemm``'s path unless a DTensor
shows up: ``torch.distributed`` is read from ``sys.modules`` (a DTensor cannot
exist before ``torch.distributed.tensor`` is imported).
"""

from __future__ import annotations

import sys
import threading

import torch

from ..semantics import ACTIVATIONS, UnsupportedInputError

_PENDING = object()
_registration: list = [_PENDING]  # None once registered, or why it could not be
_register_lock = threading.Lock()


def is_dtensor(t) -> bool:
    """Is ``t`` a DTensor?  Costs a dictionary look-up when torch.distributed.tensor was never imported."""
    mod = sys.modules.get("torch.distributed.tensor")
    return mod is not None and isinstance(t, mod.DTensor)


def any_dtensor(*tensors) -> bool:
    mod = sys.modules.get("torch.distributed.tensor")
    return mod is not None and any(isinstance(t, mod.DTensor) for t in tensors)


def dtensor_reason(*tensors) -> str | None:
    """Why a call with DTensor operands must go to torch instead (None when tritongemm serves it).

    Plain-tensor calls get None.  The dtype and device are those of the local
    shards, which ``fallback.torch_reason`` reads through the DTensor before it asks here.
    """
    mod = sys.modules.get("torch.distributed.tensor")
    if mod is None:
        return None
    dtensors = [t for t in tensors if isinstance(t, mod.DTensor)]
    if not dtensors:
        return None
    if len(dtensors) != len([t for t in tensors if isinstance(t, torch.Tensor)]):
        # torch raises for this too ("mixed torch.Tensor and DTensor"): let it say so.
        return "DTensor mixed with plain torch.Tensor operands"
    error = registration_error()
    if error is not None:
        return error
    mesh = dtensors[0].device_mesh
    for t in dtensors:
        if t.device_mesh != mesh:
            return "DTensor operands on different device meshes"
        for p in t.placements:
            if not isinstance(p, (mod.Shard, mod.Replicate, mod.Partial)):
                return f"unsupported DTensor placement {p}"
    return None


# ----------------------------------------------------------------------------------
# The sharding rule
# ----------------------------------------------------------------------------------
def _placements(a, b, addend, residual, activation: str):
    """Acceptable ([out, preact], [a, b, addend, residual]) placements on one mesh dimension.

    ``a``, ``b``, ... are DTensorSpecs (``addend``/``residual`` None when absent).
    """
    from torch.distributed.tensor import Partial, Replicate, Shard

    nd = a.ndim
    m_dim, n_dim = nd - 2, nd - 1

    def rule(out, pa, pb, epilogue_operand):
        preact = out if activation != "none" else Replicate()  # an empty tensor without an activation
        return (
            [out, preact],
            [
                pa,
                pb,
                epilogue_operand if addend is not None else None,
                epilogue_operand if residual is not None else None,
            ],
        )

    rules = [
        rule(Replicate(), Replicate(), Replicate(), Replicate()),
        rule(Shard(m_dim), Shard(m_dim), Replicate(), Shard(m_dim)),
        rule(Shard(n_dim), Replicate(), Shard(n_dim), Shard(n_dim)),
    ]
    rules += [rule(Shard(d), Shard(d), Shard(d), Shard(d)) for d in range(nd - 2)]
    if activation == "none":
        rules.append(rule(Partial(), Shard(n_dim), Shard(m_dim), Partial()))
    return rules


def registration_error() -> str | None:
    """Register the rule with DTensor, once (on the first DTensor call, so importing costs nothing).

    Returns why it could not be registered (None when it is): then DTensor calls go to torch.
    """
    if _registration[0] is not _PENDING:
        return _registration[0]
    with _register_lock:
        if _registration[0] is _PENDING:
            try:
                from torch.distributed.tensor.experimental import register_sharding

                op = torch.ops.tritongemm.gemm.default

                @register_sharding(op)
                def _gemm_sharding(a, b, addend, residual, alpha, beta, activation, *rest):
                    return _placements(a, b, addend, residual, activation)

                _key_cache_on_epilogue(op)
                _registration[0] = None
            except (ImportError, AttributeError) as e:  # an older or newer torch than this code knows
                _registration[0] = (
                    f"DTensor operands, but tritongemm cannot register its sharding rule with torch "
                    f"{torch.__version__} ({type(e).__name__}: {e})"
                )
    return _registration[0]


def _key_cache_on_epilogue(op) -> None:
    """Make DTensor's sharding cache tell calls apart by their epilogue, not only by their tensors.

    ``register_sharding`` hashes non-tensor arguments only from the first int
    one on; the op has none, so a call with an activation would reuse the
    placements cached for one without (an empty pre-activation, a partial sum
    fed to the activation).  Registering the same strategy again with the
    arguments from ``alpha`` on marked static fixes the key.
    """
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor._op_schema import RuntimeSchemaInfo

    propagator = DTensor._op_dispatcher.sharding_propagator
    propagator.register_op_strategy(
        op, propagator.op_strategy_funcs[op], RuntimeSchemaInfo(static_argnum=4, needs_pytree=True)
    )


# ----------------------------------------------------------------------------------
# The call
# ----------------------------------------------------------------------------------
def _reduction_sharded(a, b) -> bool:
    """Is the reduction dimension K split across ranks (a row-wise-parallel GEMM)?"""
    from torch.distributed.tensor import Shard

    k_of_a, k_of_b = a.ndim - 1, b.ndim - 2
    shard_k = any(isinstance(p, Shard) and p.dim % a.ndim == k_of_a for p in a.placements)
    return shard_k or any(isinstance(p, Shard) and p.dim % b.ndim == k_of_b for p in b.placements)


def split_epilogue(call, a, b) -> bool:
    """Must the activation wait for the reduction (K sharded, so the GEMM yields partial sums)?"""
    return call.epilogue.activation != "none" and _reduction_sharded(a, b)


def gemm(traceable_gemm, call, a, b, addend, residual):
    """The autograd op's custom-op door for DTensor operands.

    ``traceable_gemm(call, a, b, addend, residual)`` is that door (passed in:
    this module sits below ``autograd``).  With the reduction split and an
    activation, the GEMM with the linear part of the epilogue runs sharded and
    the activation and residual run on DTensor after its reduction.
    """
    error = registration_error()
    if error is not None:
        raise UnsupportedInputError(f"tritongemm: {error}")
    if not split_epilogue(call, a, b):
        return traceable_gemm(call, a, b, addend, residual)
    ep = call.epilogue
    linear = call._replace(epilogue=ep._replace(activation="none", residual=False, store_preact=False))
    z = traceable_gemm(linear, a, b, addend, None)
    y = ACTIVATIONS[ep.activation](z)
    return y + residual if residual is not None else y


__all__ = ["is_dtensor", "any_dtensor", "dtensor_reason", "registration_error", "gemm"]
