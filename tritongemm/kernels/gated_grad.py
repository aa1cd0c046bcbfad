"""The gated MLP's backward through the product, one elementwise pass: with ``h = act(g) * u``,

    dg = dh * u * act'(g)        du = dh * act(g)

from the pre-activations ``g`` and ``u`` the forward saved (``launch.gated``).  Each program reads a
``BLOCK_M x BLOCK_N`` tile of ``dh``, ``g`` and ``u`` once and writes the same tile of ``dg`` and
``du`` once: five M x N tensors cross DRAM, against eight for torch's ``act_backward`` + two
products.  Values are upcast to fp32 for the arithmetic and rounded once, on the store.

Rows may be strided (a view of every row of a wider matrix); columns are unit-stride.
"""

import triton
import triton.language as tl


@triton.jit
def activation_and_slope(g, ACTIVATION: tl.constexpr):
    """(act(g), act'(g)) on fp32 values, sharing the sigmoid / erf both need.

    tanh(z) is written as 2 sigmoid(2z) - 1 (and 1 - tanh(z)^2 as 4 s (1 - s)), which stays finite
    for every z: ``tl.sigmoid`` saturates to 0 or 1 instead of overflowing.  The constants are
    literals -- 2 sqrt(2 / pi), the tanh GELU's cubic coefficient 0.044715 and 3 times it,
    1 / sqrt(2), 1 / sqrt(2 pi) -- because a constexpr global times a tensor is a constexpr on
    Triton's interpreter, which its math functions reject.
    """
    if ACTIVATION == "silu":
        s = tl.sigmoid(g)
        act = g * s
        slope = s * (1.0 + g * (1.0 - s))
    elif ACTIVATION == "gelu_tanh":
        g2 = g * g
        s = tl.sigmoid(1.5957691216057308 * (g + 0.044715 * g2 * g))  # 0.5 (1 + tanh(inner))
        act = g * s
        slope = s + 1.5957691216057308 * g * s * (1.0 - s) * (1.0 + 0.134145 * g2)
    else:  # "gelu", exact: g * Phi(g)
        cdf = 0.5 * (1.0 + tl.math.erf(g * 0.7071067811865476))
        act = g * cdf
        slope = cdf + g * 0.3989422804014327 * tl.exp(-0.5 * g * g)
    return act, slope


@triton.jit
def gated_grad_kernel(
    dh_ptr,
    g_ptr,
    u_ptr,
    dg_ptr,
    du_ptr,
    M,
    N,
    stride_dh,
    stride_g,
    stride_u,
    stride_dg,
    stride_du,
    ACTIVATION: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """dg = dh * u * act'(g), du = dh * act(g) on (M, N) row-strided matrices; grid (cdiv(M, BLOCK_M),
    cdiv(N, BLOCK_N)), rows on the first axis (the one without the 65535 limit)."""
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = (rows[:, None] < M) & (cols[None, :] < N)
    rows64 = rows[:, None].to(tl.int64)  # 8192 x 57344 elements pass 2^31
    dh = tl.load(dh_ptr + rows64 * stride_dh + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    g = tl.load(g_ptr + rows64 * stride_g + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    u = tl.load(u_ptr + rows64 * stride_u + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    act, slope = activation_and_slope(g, ACTIVATION)
    tl.store(
        dg_ptr + rows64 * stride_dg + cols[None, :], (dh * u * slope).to(dg_ptr.dtype.element_ty), mask=mask
    )
    tl.store(du_ptr + rows64 * stride_du + cols[None, :], (dh * act).to(du_ptr.dtype.element_ty), mask=mask)
