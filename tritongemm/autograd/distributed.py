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

import math
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


# ----------------------------------------------------------------------------------
# A Linear on the shards
# ----------------------------------------------------------------------------------
def linear_on_shards(local_linear, x, w, bias, activation: str):
    """``F.linear`` (+ activation) on DTensors as one GEMM of the local shards, where the placements
    need no redistribution; None where they do (then the custom op's rule and DTensor's
    redistribution take the call).

    ``local_linear(x, w, bias)`` is the Linear on plain tensors (passed in: this module sits below
    the doors), so the shards take the repeated-call path a plain tensor takes.  Tensor parallelism
    runs every projection this way: column-wise (``x`` replicated, ``w`` and ``bias`` split on N:
    the output split on its last dimension), row-wise (``x`` split on K, ``w`` on its columns: a
    partial sum, reduced by DTensor when it is read; a bias is added to the sum), and data or
    sequence sharding of ``x`` over a replicated weight.  Through DTensor's dispatch of a custom
    op the same GEMM costs several hundred microseconds of host time more per call.  Eager only: a
    trace takes the op, whose rule DTensor's tracing knows.
    """
    from torch.distributed.tensor import DTensor, Partial, Replicate, Shard

    if not isinstance(w, DTensor) or not isinstance(x, DTensor) or is_tracing_dtensor(x):
        return None
    mesh = x.device_mesh
    if w.device_mesh != mesh or (
        bias is not None and (not isinstance(bias, DTensor) or bias.device_mesh != mesh)
    ):
        return None
    last = x.ndim - 1
    out, grad_x, grad_w, grad_b = [], [], [], []
    reduced = False  # a mesh dimension whose output is a partial sum
    for i, (px, pw) in enumerate(zip(x.placements, w.placements)):
        pb = None if bias is None else bias.placements[i]
        x_k = type(px) is Shard and px.dim % x.ndim == last  # (not a strided shard: FSDP's)
        if isinstance(pw, Replicate) and (pb is None or isinstance(pb, Replicate)):
            if isinstance(px, Replicate):
                out.append(Replicate())
                grad_w.append(Replicate())
            elif type(px) is Shard and not x_k:  # rows (batch, sequence) split
                out.append(Shard(px.dim % x.ndim))
                grad_w.append(Partial())  # each rank's rows give part of the weight's gradient
            else:
                return None
            grad_x.append(px)
            grad_b.append(grad_w[-1])  # (the bias's gradient sums the same rows)
        elif pw == Shard(0) and isinstance(px, Replicate) and (pb is None or pb == Shard(0)):  # column-wise
            out.append(Shard(last))
            grad_x.append(Partial())  # each rank's columns give part of x's gradient
            grad_w.append(pw)
            grad_b.append(pw)
        elif pw == Shard(1) and x_k and (pb is None or isinstance(pb, Replicate)):  # row-wise
            if activation != "none":
                return None  # an activation must wait for the reduction: the op's rule splits it
            out.append(Partial())
            grad_x.append(px)
            grad_w.append(pw)
            grad_b.append(Replicate())  # (unused: the bias is added to the reduced sum)
            reduced = True
        else:
            return None
    add_bias_after = reduced and bias is not None
    b_local = None if bias is None or add_bias_after else bias
    if torch.is_grad_enabled() and (
        x.requires_grad or w.requires_grad or (b_local is not None and b_local.requires_grad)
    ):
        x_local = x.to_local(grad_placements=tuple(grad_x))
        w_local = w.to_local(grad_placements=tuple(grad_w))
        b_local = None if b_local is None else b_local.to_local(grad_placements=tuple(grad_b))
    else:  # nothing to differentiate: the shards themselves, without to_local's autograd node
        x_local, w_local = x._local_tensor, w._local_tensor
        b_local = None if b_local is None else b_local._local_tensor
    y = local_linear(x_local, w_local, b_local)
    shape = (*x.shape[:-1], w.shape[0])
    stride = tuple(math.prod(shape[d + 1 :]) for d in range(len(shape)))
    y = DTensor.from_local(y, mesh, out, run_check=False, shape=torch.Size(shape), stride=stride)
    return y + bias if add_bias_after else y


def is_tracing_dtensor(t) -> bool:
    """Is this DTensor's data a trace's (fake or functional), or is torch.compile tracing?"""
    if torch.compiler.is_compiling():
        return True
    from torch._subclasses.fake_tensor import FakeTensor
    from torch._subclasses.functional_tensor import FunctionalTensor

    return isinstance(t._local_tensor, (FakeTensor, FunctionalTensor))


__all__ = ["is_dtensor", "any_dtensor", "registration_error", "gemm", "linear_on_shards"]
