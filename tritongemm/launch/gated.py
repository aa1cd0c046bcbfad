"""The gated GEMM of a GLU MLP: ``h = act(x @ w_gate.T + b_gate) * (x @ w_up.T + b_up)`` in one kernel.

Llama, Qwen and Mistral MLPs compute ``down(silu(gate(x)) * up(x))`` (SwiGLU); Gemma's uses the tanh
GELU (GeGLU).  Stock PyTorch runs the gate and up projections as two GEMMs, each storing an M x N
tensor, then one or two elementwise passes over both.  Here one program computes a tile of the gate
and the same tile of the up projection from the same A tiles (two accumulators), applies the
activation and the product in its epilogue and stores one tile of ``h``.  Backward needs the
pre-activations: ``save=(g, u)`` stores them too.
"""

from __future__ import annotations

import torch

GATED_ACTIVATIONS = ("silu", "gelu_tanh", "gelu")


def gated_gemm(
    x: torch.Tensor,
    w_gate: torch.Tensor,
    w_up: torch.Tensor,
    activation: str = "silu",
    b_gate: torch.Tensor | None = None,
    b_up: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    save: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> torch.Tensor:
    """``act(x @ w_gate.T + b_gate) * (x @ w_up.T + b_up)``.

    x: (M, K); w_gate, w_up: (N, K) as ``nn.Linear`` stores them; b_gate, b_up: (N,) or None;
    all one dtype (fp16, bf16, fp32), one device.  ``out``: an (M, N) tensor to write (else one
    is made).  ``save``: two (M, N) tensors that receive the pre-activations ``g`` and ``u`` (for
    backward).  No checks here: the caller validated the operands.
    """
    g = x @ w_gate.T
    u = x @ w_up.T
    if b_gate is not None:
        g = g + b_gate
    if b_up is not None:
        u = u + b_up
    if save is not None:
        save[0].copy_(g)
        save[1].copy_(u)
    gf = g.float()
    if activation == "silu":
        a = torch.nn.functional.silu(gf)
    elif activation == "gelu_tanh":
        a = torch.nn.functional.gelu(gf, approximate="tanh")
    else:
        a = torch.nn.functional.gelu(gf)
    h = (a * u.float()).to(x.dtype)
    if out is None:
        return h
    return out.copy_(h)
