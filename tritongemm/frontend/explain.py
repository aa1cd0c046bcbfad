"""``explain``: which kernel and config a call would run, and why, without running it.

It validates exactly as the real call does (the same checks, the same
exceptions), then asks the same planner the launch layer asks.  With
``device=`` it plans for another GPU's budgets (``"h100"``, ``"a100"``, ... or a
``DeviceInfo``), so a machine without a GPU can show what an H100 would run:
pass CPU or ``meta`` tensors of the right shapes, strides and dtype.
"""

from __future__ import annotations

import math

import torch

from ..device import DeviceInfo, device_info, named_device
from ..launch import padding_policy
from ..planning.call import make_request
from ..planning.eligibility import FP8_DTYPES, Operand
from ..planning.plan import Plan, layout_letters, plan
from ..planning.problem import GemmProblem
from ..request import checks
from ..request.autocast import autocast_cast, autocast_dtype
from ..semantics import check_activation, dtype_name
from .scaled import check_matrices, stored_dtype


def _operand(t: torch.Tensor) -> Operand:
    """``Operand.of`` for any tensor; a meta tensor has no address and counts as freshly allocated (aligned)."""
    if t.device.type == "meta":
        return Operand(t.shape[-2], t.shape[-1], t.stride(-2), t.stride(-1), t.element_size(), True)
    return Operand.of(t)


def explain(
    a: torch.Tensor,
    b: torch.Tensor,
    *,
    bias: torch.Tensor | None = None,
    residual: torch.Tensor | None = None,
    activation: str | None = None,
    out_dtype: torch.dtype | None = None,
    config=None,
    pipeline=None,
    decomposition=None,
    device: str | DeviceInfo | None = None,
) -> Plan:
    """The plan ``tritongemm.matmul(a, b, ...)`` would run, and why (for fp8 operands, ``scaled_mm``'s).

    >>> print(tritongemm.explain(a, b).describe())
    >>> w = torch.empty(4096, 4096, device="meta", dtype=torch.bfloat16)
    >>> print(tritongemm.explain(w, w.mT, device="h100").describe())   # what an H100 would run

    Raises what ``matmul`` raises for inputs it rejects.  Without ``device``
    the operands' own device is planned for (and must be one tritongemm runs on).
    """
    if all(isinstance(t, torch.Tensor) and t.dtype in FP8_DTYPES for t in (a, b)):
        return _explain_fp8(a, b, out_dtype, config, device)
    dtype = autocast_dtype(a.device) if isinstance(a, torch.Tensor) else None
    if dtype is not None:
        a, b, bias, residual = autocast_cast(dtype, a, b, bias, residual)
    named = {
        n: t for n, t in (("input", a), ("other", b), ("bias", bias), ("residual", residual)) if t is not None
    }
    if device is None:
        checks.check_tensors("explain", **named)
        target = device_info(a.device)
    else:
        target = named_device(device)
        # The call's rules (types, dtypes, layout), on whatever device the tensors sit: meta tensors are fine.
        checks.check_tensors("explain", check_device=False, **named)
    checks.check_out_dtype("explain", out_dtype)
    check_activation("explain", activation)
    if a.dim() == 0 or b.dim() == 0:
        raise RuntimeError(
            f"explain: both arguments need to be at least 1D, but they are {a.dim()}D and {b.dim()}D"
        )
    a2 = a.unsqueeze(0) if a.dim() == 1 else a
    b2 = b.unsqueeze(-1) if b.dim() == 1 else b
    checks.check_inner("explain", a.shape, b.shape, a2.shape[-1], b2.shape[-2])
    batch = checks.broadcast_batch("explain", a2, b2)
    m, k, n = a2.shape[-2], a2.shape[-1], b2.shape[-1]
    if a2.dim() > 2 and math.prod(b2.shape[:-2]) == 1 and math.prod(a2.shape[:-2]) == math.prod(batch):
        folded = checks.fold_rows(a2)
        if folded is not None:  # the real call folds (*, M, K) @ (K, N) into one GEMM
            a2, b2, batch, m = folded, b2.reshape(k, n), (), folded.shape[0]
    for name, t in (("bias", bias), ("residual", residual)):
        checks.expand_to("explain", name, t, (*batch, m, n))
    op_a, op_b = _operand(a2), _operand(b2)
    problem = GemmProblem(m, n, k, math.prod(batch), dtype_name(a.dtype), layout_letters(op_a, op_b))
    out = out_dtype or a.dtype
    c = Operand.contiguous(m, n, torch.empty((), dtype=out).element_size())
    return plan(
        problem,
        target,
        make_request(config, pipeline, decomposition),
        op_a,
        op_b,
        c,
        a.dtype,
        out,
        padding_policy(),
        activation=activation or "none",
    )


def _explain_fp8(a, b, out_dtype, config, device) -> Plan:
    """The plan of ``scaled_mm(a, b, ..., out_dtype=out_dtype)`` (fp8 operands; the scales do not
    change it)."""
    check_matrices(a, b)
    target = device_info(a.device) if device is None else named_device(device)
    stored = stored_dtype(out_dtype or a.dtype)
    op_a, op_b = _operand(a), _operand(b)
    m, k, n = a.shape[0], a.shape[1], b.shape[1]
    problem = GemmProblem(m, n, k, 1, dtype_name(a.dtype), layout_letters(op_a, op_b))
    c = Operand.contiguous(m, n, stored.itemsize)
    return plan(problem, target, make_request(config), op_a, op_b, c, a.dtype, stored, padding_policy())


def explain_problem(problem: GemmProblem, device: str | DeviceInfo, **options) -> Plan:
    """``explain`` for a problem given as numbers (the CLI's door): meta operands of its shape and layout."""
    dtype = getattr(torch, problem.dtype)

    def operand(rows, cols, letter):
        t = torch.empty(
            (*((problem.batch,) if problem.batch > 1 else ()), rows, cols)
            if letter == "N"
            else (*((problem.batch,) if problem.batch > 1 else ()), cols, rows),
            dtype=dtype,
            device="meta",
        )
        return t if letter == "N" else t.mT

    a = operand(problem.m, problem.k, problem.layout[0])
    b = operand(problem.k, problem.n, problem.layout[1])
    return explain(a, b, device=device, **options)


__all__ = ["explain", "explain_problem"]
