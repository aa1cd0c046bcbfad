"""The gated GEMM of a GLU MLP (pointer kernel): ``h = act(x @ Wg^T + bg) * (x @ Wu^T + bu)``.

Each program owns one BLOCK_M x BLOCK_N tile of ``h`` and keeps two accumulators, the gate's and the
up projection's, fed by the same A tile each K-step (A is read once for both).  The epilogue adds the
biases, stores the pre-activations when backward needs them (SAVE), and stores ``act(g) * u``: one
M x N tensor leaves the kernel where the unfused MLP writes two and reads them back.

The Hopper path is the warp-specialized Gluon kernel's ``GATED`` mode (``gemm_gluon``); this one runs
everywhere else, the CPU interpreter included.
"""

import triton
import triton.language as tl

from .activations import activate
from .gemm import grouped_tile_coords


@triton.jit
def gated_kernel(
    x_ptr,
    wg_ptr,
    wu_ptr,
    h_ptr,
    bg_ptr,
    bu_ptr,
    g_ptr,
    u_ptr,
    M,
    N,
    K,
    stride_xm,
    stride_xk,
    stride_gn,
    stride_gk,
    stride_un,
    stride_uk,
    stride_hm,
    stride_hn,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    ACTIVATION: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    SAVE: tl.constexpr,
    EVEN_K: tl.constexpr,
    UPCAST_OPERANDS: tl.constexpr,
):
    """One tile of ``h`` (and of ``g``, ``u`` with SAVE, which share h's strides).  W's are (N, K)."""
    pid_m, pid_n = grouped_tile_coords(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)
    # 64-bit offsets: h, g, u and the weights may pass 2^31 elements (8192 x 262144), where 32-bit ones
    # wrap; the pointers are computed once and then advanced, so the wider arithmetic costs nothing.
    offs_m = pid_m.to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n.to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    x_ptrs = x_ptr + offs_m[:, None] * stride_xm + offs_k[None, :] * stride_xk
    # The weights are read as K x N tiles (W^T), as nn.Linear's weight is used.
    g_ptrs = wg_ptr + offs_k[:, None] * stride_gk + offs_n[None, :] * stride_gn
    u_ptrs = wu_ptr + offs_k[:, None] * stride_uk + offs_n[None, :] * stride_un
    mask_m = offs_m[:, None] < M
    mask_n = offs_n[None, :] < N
    acc_g = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc_u = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        if EVEN_K:
            a = tl.load(x_ptrs, mask=mask_m, other=0.0)
            bg = tl.load(g_ptrs, mask=mask_n, other=0.0)
            bu = tl.load(u_ptrs, mask=mask_n, other=0.0)
        else:
            k_left = K - k * BLOCK_K
            a = tl.load(x_ptrs, mask=mask_m & (offs_k[None, :] < k_left), other=0.0)
            bg = tl.load(g_ptrs, mask=mask_n & (offs_k[:, None] < k_left), other=0.0)
            bu = tl.load(u_ptrs, mask=mask_n & (offs_k[:, None] < k_left), other=0.0)
        if UPCAST_OPERANDS:  # the interpreter's bf16 tl.dot (see gemm.mainloop)
            a = a.to(tl.float32)
            bg = bg.to(tl.float32)
            bu = bu.to(tl.float32)
        acc_g = tl.dot(a, bg, acc_g, input_precision="ieee")
        acc_u = tl.dot(a, bu, acc_u, input_precision="ieee")
        x_ptrs += BLOCK_K * stride_xk
        g_ptrs += BLOCK_K * stride_gk
        u_ptrs += BLOCK_K * stride_uk
    mask = mask_m & mask_n
    if HAS_BIAS:
        acc_g += tl.load(bg_ptr + offs_n, mask=offs_n < N, other=0.0).to(tl.float32)[None, :]
        acc_u += tl.load(bu_ptr + offs_n, mask=offs_n < N, other=0.0).to(tl.float32)[None, :]
    offs = offs_m[:, None] * stride_hm + offs_n[None, :] * stride_hn
    if SAVE:
        tl.store(g_ptr + offs, acc_g.to(g_ptr.dtype.element_ty), mask=mask)
        tl.store(u_ptr + offs, acc_u.to(u_ptr.dtype.element_ty), mask=mask)
    h = activate(acc_g, ACTIVATION, h_ptr.dtype.element_ty.primitive_bitwidth) * acc_u
    tl.store(h_ptr + offs, h.to(h_ptr.dtype.element_ty), mask=mask)
