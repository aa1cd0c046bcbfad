"""Under ``torch.compile`` the graph launches tritongemm's kernels itself where it can.

``tritongemm::gemm`` is replaced by its body under AOTAutograd's
functionalization: plans whose kernel reads plain pointers
(``launch.TRACEABLE_KERNELS``) become Triton kernel launches that Inductor
makes with no Python of tritongemm's per call; plans on host tensor
descriptors (the TMA and Gluon kernels) stay one opaque op,
``tritongemm::gemm_extern``.  ``torch.export`` keeps ``tritongemm::gemm`` whole.
"""

from __future__ import annotations

import copy

import pytest
import torch

import tritongemm
from tritongemm import launch
from tritongemm.testing import random_tensor, relative_error, tolerance


def _mlp(k: int, n: int, device, dtype) -> torch.nn.Module:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(k, n), torch.nn.GELU(), torch.nn.Linear(n, k))
    return tritongemm.nn.convert(model.to(device, dtype))


def _compiled_code(fn, *args):
    from torch._inductor.utils import run_and_get_code

    out, codes = run_and_get_code(fn, *args)
    return out, "\n".join(codes)


def test_export_keeps_the_op_whole(device):
    model = _mlp(16, 24, device, torch.float32)
    x = random_tensor((5, 16), torch.float32, device)
    exported = torch.export.export(model, (x,))
    targets = [str(n.target) for n in exported.graph.nodes if n.op == "call_function"]
    assert sum(t == "tritongemm.gemm.default" for t in targets) == 2, targets
    assert relative_error(exported.module()(x), model(x).double()) <= tolerance(torch.float32, device)


def test_functionalized_op_runs_its_body(device):
    """AOTAutograd (``aot_eager``) replaces ``tritongemm::gemm`` by its body: on the interpreter the
    body records ``gemm_extern`` (no Triton kernel can be recorded there), on a GPU the kernel
    launches of pointer plans."""
    seen = []

    def backend(gm, example_inputs):
        from torch._functorch.aot_autograd import aot_module_simplified

        def record(g, _):
            seen.extend(str(n.target) for n in g.graph.nodes if n.op == "call_function")
            return g.forward

        return aot_module_simplified(gm, example_inputs, fw_compiler=record, bw_compiler=record)

    torch._dynamo.reset()
    model = _mlp(16, 24, device, torch.float32)
    x = random_tensor((5, 16), torch.float32, device).requires_grad_()
    out = torch.compile(model, backend=backend, fullgraph=True)(x)
    out.sum().backward()
    assert not any(t == "tritongemm.gemm.default" for t in seen), seen
    if device.type == "cuda":
        assert any("triton_kernel_wrapper" in t for t in seen), seen
    else:
        assert any("tritongemm.gemm_extern" in t for t in seen), seen
    ref = model(x.detach())
    assert relative_error(out, ref) <= tolerance(torch.float32, device)


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["default", "reduce-overhead", "max-autotune-no-cudagraphs"])
def test_inductor_launches_pointer_kernels_itself(mode):
    torch._dynamo.reset()
    model = _mlp(512, 1024, "cuda", torch.bfloat16)
    x = random_tensor((64, 512), torch.bfloat16, "cuda")
    w = model[0].weight
    assert tritongemm.explain(x, w.mT).kernel in launch.TRACEABLE_KERNELS  # the case this test is about
    with torch.no_grad():
        ref = model(x)
        out, code = _compiled_code(torch.compile(model, mode=mode, fullgraph=True), x)
    assert "gemm_kernel" in code, code[-3000:]
    assert "tritongemm.gemm" not in code, code[-3000:]  # no opaque op left
    assert relative_error(out, ref) <= tolerance(torch.bfloat16, "cuda", against="library")


@pytest.mark.gpu
def test_compiled_training_step_matches_eager():
    torch._dynamo.reset()
    model = _mlp(256, 768, "cuda", torch.bfloat16)
    twin = copy.deepcopy(model)
    x = random_tensor((4, 32, 256), torch.bfloat16, "cuda")
    compiled = torch.compile(model, fullgraph=True)
    for _ in range(2):
        model.zero_grad()
        compiled(x).float().square().mean().backward()
    twin(x).float().square().mean().backward()
    tol = tolerance(torch.bfloat16, "cuda", against="library")
    for p, q in zip(model.parameters(), twin.parameters()):
        assert relative_error(p.grad, q.grad) <= tol


@pytest.mark.gpu
def test_descriptor_kernels_stay_one_opaque_op():
    torch._dynamo.reset()
    model = _mlp(4096, 4096, "cuda", torch.bfloat16)
    x = random_tensor((4096, 4096), torch.bfloat16, "cuda")
    assert tritongemm.explain(x, model[0].weight.mT).kernel not in launch.TRACEABLE_KERNELS
    with torch.no_grad():
        ref = model(x)
        out, code = _compiled_code(torch.compile(model, fullgraph=True), x)
    assert "tritongemm.gemm_extern" in code
    assert relative_error(out, ref) <= tolerance(torch.bfloat16, "cuda", against="library")
