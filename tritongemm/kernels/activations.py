"""The epilogue's activations as Triton jit helpers, on fp32 (fp64) values: each activation, the
normal CDF it needs for GELU (two fits, by the output's width), and the derivative epilogues' slopes
(``semantics.DERIVATIVE_EPILOGUES``).  ``gluon_epilogue`` holds the same math in Gluon.
"""

import triton
import triton.language as tl


@triton.jit
def normal_cdf(x):
    """Phi(x) = erfc(-x / sqrt 2) / 2 for GELU, without a branch.

    libdevice's erf branches on |x|: one basic block per element, so an epilogue computing it on a tile
    runs each element's dependent chain in turn.  This is the Chebyshev fit of erfc in Numerical Recipes
    (erfc(z) = t exp(-z^2 + P(t)), t = 1 / (1 + z / 2), relative error below 1.2e-7 for z >= 0): one
    reciprocal, one exp2 and ten FMAs for every element, and accurate in the tails, where erfc(z) is
    tiny and 1 - erf(z) would cancel.
    """
    z = tl.abs(x) * 0.7071067811865476
    t = 1.0 / (1.0 + 0.5 * z)
    p = 0.17087277 * t - 0.82215223
    p = p * t + 1.48851587
    p = p * t - 1.13520398
    p = p * t + 0.27886807
    p = p * t - 0.18628806
    p = p * t + 0.09678418
    p = p * t + 0.37409196
    p = p * t + 1.00002368
    p = p * t - 1.26551223
    tail = 0.5 * t * tl.exp2((p - z * z) * 1.4426950408889634)  # erfc(z) / 2 = Phi(-|x|)
    return tl.where(x >= 0, 1.0 - tail, tail)


@triton.jit
def logit_phi_16(x):
    """log2(Phi(x) / (1 - Phi(x))) as ``gelu_16``'s fit writes it: x P(x^2), x^2 clamped at 25."""
    x2 = tl.minimum(x * x, 25.0)
    p = -1.92362056e-07 * x2 + 8.95980859e-06
    p = p * x2 - 0.000145463738
    p = p * x2 - 0.000129064741
    p = p * x2 + 0.104868111
    p = p * x2 + 2.30220155
    return x * p


@triton.jit
def gelu_16(x):
    """GELU = x Phi(x) for an output of 16 bits, with Phi as a logistic: 1 / (1 + 2^-(x P(x^2))).

    logit(Phi(x)) / x is smooth and even; P is its degree-5 minimax fit on |x| <= 5 in x^2, with log2(e)
    folded in, and x^2 is clamped at 25 beyond, where Phi is within 3e-7 of 0 or 1.  The GELU errs by at
    most 1.6e-6 (absolute, in fp32), a fifth of an fp16 ulp at 0.01.  Rounded to 16 bits, it differs by
    one ulp from the exactly rounded GELU at 2% (bf16) and 9% (fp16) of points on [-4, 4]; torch's own
    fp32 erf does at 1% and 6%.
    It costs five FMAs, an exp2 and a division: ``normal_cdf``'s ten-FMA chain behind a division made
    the epilogue longer than a K = 768 mainloop (H100, 8192 x 3072 x 768 with bias: fused 0.92 of
    ``F.gelu(F.linear(...))``, 1.34 with this one).
    """
    return x / (1.0 + tl.exp2(-logit_phi_16(x)))


@triton.jit
def activate(x, ACTIVATION: tl.constexpr, OUT_BITS: tl.constexpr = 32):
    """The fused activation, on fp32 (fp64) values, for an output of OUT_BITS bits."""
    if ACTIVATION == "relu":
        x = tl.maximum(x, 0.0)
    elif ACTIVATION == "gelu":  # exact: x * Phi(x)
        if x.dtype == tl.float64:  # (normal_cdf is an fp32-accurate fit)
            x = 0.5 * x * (1.0 + tl.math.erf(x * 0.7071067811865476))
        elif OUT_BITS == 16:
            x = gelu_16(x)
        else:
            x = x * normal_cdf(x)
    elif ACTIVATION == "gelu_tanh":  # 0.5 x (1 + tanh(u)) == x * sigmoid(2u)
        u = 0.7978845608028654 * (x + 0.044715 * x * x * x)
        x = x * tl.sigmoid(2.0 * u)
    elif ACTIVATION == "silu":
        x = x * tl.sigmoid(x)
    return x


@triton.jit
def normal_cdf_16(x):
    """Phi(x) as ``gelu_16`` writes it, 1 / (1 + 2^-(x P(x^2))): for results rounded to 16 bits."""
    return 1.0 / (1.0 + tl.exp2(-logit_phi_16(x)))


@triton.jit
def slope(z, ACTIVATION: tl.constexpr, OUT_BITS: tl.constexpr):
    """act'(z) on fp32 (fp64) values for a derivative epilogue, ACTIVATION = "<act>_grad" (not "relu_grad",
    which selects instead of multiplying), for an output of OUT_BITS bits.  tanh(u) is written as
    2 sigmoid(2u) - 1, finite for every z."""
    if ACTIVATION == "gelu_grad":  # Phi(z) + z phi(z)
        if z.dtype == tl.float64:
            cdf = 0.5 * (1.0 + tl.math.erf(z * 0.7071067811865476))
        elif OUT_BITS == 16:
            cdf = normal_cdf_16(z)
        else:
            cdf = normal_cdf(z)
        s = cdf + z * 0.3989422804014327 * tl.exp(-0.5 * z * z)
    elif ACTIVATION == "gelu_tanh_grad":  # with s = sigmoid(2u): s + 2 z s (1 - s) u'(z)
        z2 = z * z
        sg = tl.sigmoid(1.5957691216057308 * (z + 0.044715 * z2 * z))
        s = sg + 1.5957691216057308 * z * sg * (1.0 - sg) * (1.0 + 0.134145 * z2)
    else:  # "silu_grad": sigmoid(z) (1 + z (1 - sigmoid(z)))
        sg = tl.sigmoid(z)
        s = sg * (1.0 + z * (1.0 - sg))
    return s


@triton.jit
def activate_with(acc, r, ACTIVATION: tl.constexpr, OUT_BITS: tl.constexpr):
    """The epilogue's last step given R (both fp32 / fp64): act(acc) + R; or, for a derivative epilogue
    ("<act>_grad", R the pre-activation z that forward saved), acc * act'(z), the gradient through the
    activation of a GEMM computing dL/d act(z).  ReLU's selects, as torch's ``threshold_backward``:
    0 where z <= 0 whatever the gradient (inf or NaN included)."""
    if ACTIVATION == "relu_grad":
        y = tl.where(r > 0, acc, 0.0)
    elif ACTIVATION == "gelu_grad":
        y = acc * slope(r, ACTIVATION, OUT_BITS)
    elif ACTIVATION == "gelu_tanh_grad":
        y = acc * slope(r, ACTIVATION, OUT_BITS)
    elif ACTIVATION == "silu_grad":
        y = acc * slope(r, ACTIVATION, OUT_BITS)
    else:
        y = activate(acc, ACTIVATION, OUT_BITS) + r
    return y
