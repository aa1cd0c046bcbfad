"""A GEMM call in torch's own ops: what a traced GEMM becomes where tritongemm's kernel has no edge
(``ops``), or where the op cannot follow (``function.gemm_op``: tangents in a trace)."""

from __future__ import annotations

import torch

from ..planning.call import GemmCall
from ..semantics import ACTIVATIONS

# torch's own functions, bound here: ``patch()`` replaces ``torch.mm`` and the rest of the matmul
# family while open, and a GEMM this module hands to aten must not be routed back to tritongemm.
_VF = torch._C._VariableFunctions
_addmm, _mm, _matmul = _VF.addmm, _VF.mm, _VF.matmul


def aten_ops(call: GemmCall, a, b, addend, residual) -> tuple[torch.Tensor, torch.Tensor]:
    """The op in aten ops, as the stock model has them: Inductor lowers and fuses these itself."""
    ep = call.epilogue
    if ep.addend and a.dim() == 2:
        if addend.dim() == 2 and addend.stride(0) == 0:
            # A bias broadcast over the rows: addmm takes the vector itself, as F.linear's bias, and
            # cuBLAS adds it in its epilogue.  Given the (M, N) view, aten copies it into the output
            # first and adds it as beta * C (H100, BERT-base compiled: 73 copies, 0.84 of stock).
            addend = addend.select(0, 0)
        z = _addmm(addend, a, b, beta=ep.beta, alpha=ep.alpha)  # (F.linear with a bias: addmm)
    else:
        z = _mm(a, b) if a.dim() == 2 else _matmul(a, b)
        if ep.alpha != 1.0:
            z = z * ep.alpha
        if ep.addend:
            z = z + (addend if ep.beta == 1.0 else ep.beta * addend)
    y = ACTIVATIONS[ep.activation](z)
    if residual is not None:
        y = y + residual
    return y, (z if ep.store_preact else y.new_empty(0))


__all__ = ["aten_ops"]
