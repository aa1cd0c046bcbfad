"""What torch has switched on around a call that changes how a GEMM must run.

* A forward-mode AD level (``torch.autograd.forward_ad.dual_level``, ``torch.func.jvp`` outside
  functorch's own transforms): any operand may carry a tangent, which only the autograd op's ``jvp``
  propagates; a direct launch would drop it.
* A ``TorchDispatchMode`` (``torch.utils.flop_counter.FlopCounterMode``, memory trackers, selective
  activation checkpointing): it sees only what goes through the dispatcher, so the GEMMs run as the ops
  (``tritongemm::gemm``, ``gated``, ``scaled_mm``), whose FLOPs ``register_flops`` tells the counter,
  rather than as direct launches it would never see.
"""

from __future__ import annotations

import torch
from torch.autograd import forward_ad as forward_ad_state

dispatch_stack_len = torch._C._len_torch_dispatch_stack
if not hasattr(forward_ad_state, "_current_level"):  # (a torch that counts no levels: none is seen open)
    forward_ad_state = type("NoLevels", (), {"_current_level": -1})


def forward_ad_active() -> bool:
    """Is a forward-mode AD level open?"""
    return forward_ad_state._current_level >= 0


def dispatch_mode_active() -> bool:
    """Is a ``TorchDispatchMode`` on the stack?  (About 40 ns; fake and functional tensors, which also
    run under one, take the traced way before this is asked.)"""
    return dispatch_stack_len() > 0


def register_flops(ops, formula) -> None:
    """``formula(*shapes, out_shape)`` as ``FlopCounterMode``'s count for each of ``ops`` (op packets),
    once per process (the counter refuses a second registration)."""
    from torch.utils.flop_counter import flop_registry, register_flop_formula

    new = [op for op in ops if op not in flop_registry]
    if new:
        register_flop_formula(new)(formula)


def gemm_flops(a_shape, *_, out_shape, **__) -> int:
    """2 M N K per matrix of the batch (K: ``a_shape``'s last size, M N: the first output's): a multiply
    and an add per term, the epilogue not counted (as the counter counts torch's ``addmm``)."""
    out = out_shape[0] if isinstance(out_shape[0], (tuple, list, torch.Size)) else out_shape
    count = 2 * a_shape[-1]
    for size in out:
        count *= size
    return count


__all__ = [
    "dispatch_mode_active",
    "dispatch_stack_len",
    "forward_ad_active",
    "forward_ad_state",
    "gemm_flops",
    "register_flops",
]
