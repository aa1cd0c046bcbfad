"""``torch.compile`` with dynamic shapes: ``dynamic=True``, or what Dynamo does by itself once a size
changes (it retraces with that dimension symbolic).  Serving and training code sees many sequence
lengths, so every door must trace with symbolic sizes, once for all of them, and give eager's outputs
and gradients at each.

Symbolic sizes reach the library's Python while it traces: its checks compare them, its plans
cannot be made from them (those GEMMs are left to run time), and an ``autograd.Function`` traced
with them is a subgraph Dynamo speculates.  On torch 2.11 that last step failed for fp8 layers, whose
forward compared symbolic sizes (``float8_linear``).
"""

from __future__ import annotations

import pytest
import torch
import tritongemm.nn as tnn

import tritongemm
from tritongemm.testing import random_tensor, relative_error, tolerance

ROWS = (8, 20)  # (two sizes: the second call must reuse the first's graph)


class _GatedMLPLike(torch.nn.Module):
    """transformers' ``LlamaMLP`` in shape: ``convert`` makes it a ``GatedMLP``."""

    def __init__(self, hidden: int, inner: int):
        super().__init__()
        self.gate_proj = torch.nn.Linear(hidden, inner, bias=False)
        self.up_proj = torch.nn.Linear(hidden, inner, bias=False)
        self.down_proj = torch.nn.Linear(inner, hidden, bias=False)
        self.act_fn = torch.nn.SiLU()

    def forward(self, x):
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))


class _Block(torch.nn.Module):
    """A GELU MLP (fc1's activation fused by ``convert``), then a gated MLP, and a residual."""

    def __init__(self, hidden: int = 32):
        super().__init__()
        self.fc1 = torch.nn.Linear(hidden, 64)
        self.act = torch.nn.GELU()
        self.fc2 = torch.nn.Linear(64, hidden)
        self.mlp = _GatedMLPLike(hidden, 48)

    def forward(self, x):
        return self.mlp(self.fc2(self.act(self.fc1(x)))) + x


def _converted(device, precision=None, recipe="rowwise"):
    torch.manual_seed(0)
    if precision is None:
        return tnn.convert(_Block().to(device))
    # Two fp8 layers of different widths in one graph: Dynamo lifts what the first one's trace made
    # symbolic into the second's.
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Linear(64, 32)).to(device)
    return tnn.convert(model, precision=precision, recipe=recipe)


def _weights(device, *shapes):
    torch.manual_seed(1)
    return [torch.randn(*s, device=device) / s[-1] ** 0.5 for s in shapes]


def _doors(device):
    """name -> (function of one (2, rows, 32) input, the parameters whose gradients are compared)."""
    w, w2, wg, wu = _weights(device, (48, 32), (32, 48), (40, 32), (40, 32))
    b = torch.randn(48, device=device)
    scale = torch.tensor(0.5, device=device)

    def fp8(x):  # scaled_mm's door: cast by torch, as a compiled graph's fp8 layers do
        x8 = x.reshape(-1, 32).to(torch.float8_e4m3fn)
        w8 = w.to(torch.float8_e4m3fn)
        return tritongemm.scaled_mm(x8, w8.t(), scale, scale, out_dtype=torch.float32)

    model = _converted(device)
    doors = {
        "convert": (model, list(model.parameters())),
        "matmul": (lambda x: tritongemm.matmul(x, w.t()), []),
        "bmm": (lambda x: tritongemm.bmm(x, w.t().expand(2, 32, 48)), []),
        "baddbmm": (lambda x: tritongemm.baddbmm(x[..., :1], x, w.t().expand(2, 32, 48), beta=0.5), []),
        "addmm": (lambda x: tritongemm.addmm(b, x.reshape(-1, 32), w.t()), []),
        "linear+gelu": (lambda x: tritongemm.linear(x, w, b, activation="gelu"), []),
        "gated_linear": (lambda x: tritongemm.gated_linear(x, wg, wu), []),
        "mlp": (lambda x: tritongemm.mlp(x, w, b, w2, None, activation="gelu"), []),
        "scaled_mm": (fp8, []),
    }
    for recipe in ("rowwise", "tensorwise", "blockwise"):
        fp8_model = _converted(device, "fp8", recipe)
        doors[f"convert fp8 {recipe}"] = (fp8_model, list(fp8_model.parameters()))
    return doors


#: The default run takes one fp8 recipe (the casts differ, the traced Function is the same); the slow
#: tier the other two.
DOORS = [
    pytest.param(door, marks=pytest.mark.slow)
    if door in ("convert fp8 rowwise", "convert fp8 tensorwise")
    else door
    for door in _doors("cpu")
]


@pytest.mark.parametrize("door", DOORS)
def test_every_door_compiles_once_for_every_size(door, device):
    """On a GPU through Inductor; on the interpreter through AOTAutograd alone (Inductor's CPU code
    would not run Triton's interpreter)."""
    from torch._dynamo.testing import CompileCounterWithBackend

    if "fp8" in door or door == "scaled_mm":
        if device.type == "cuda" and torch.cuda.get_device_capability() < (8, 9):
            pytest.skip("fp8 GEMMs need sm_89 or newer")
    fn, params = _doors(device)[door]
    differentiable = door != "scaled_mm"
    torch._dynamo.reset()
    counter = CompileCounterWithBackend("inductor" if device.type == "cuda" else "aot_eager")
    compiled = torch.compile(fn, backend=counter, fullgraph=True, dynamic=True)
    tol = tolerance(torch.float32, device)
    for rows in ROWS:
        x = random_tensor((2, rows, 32), torch.float32, device).requires_grad_(differentiable)
        leaves = [x, *params] if differentiable else []
        expected = fn(x)
        grads = torch.autograd.grad(expected.square().sum(), leaves) if leaves else ()
        out = compiled(x)
        assert out.shape == expected.shape
        assert relative_error(out, expected.double()) <= tol, (door, rows)
        if leaves:
            for got, want in zip(torch.autograd.grad(out.square().sum(), leaves), grads):
                assert relative_error(got, want.double()) <= tol, (door, rows)
    # One graph: no recompilation for the second size, and no restarted first trace (a float the library
    # reads off a module-level object would be a symbol, which Dynamo restarts the trace to specialize).
    assert counter.frame_count == 1, f"{door}: {counter.frame_count} graphs compiled for sizes {ROWS}"
