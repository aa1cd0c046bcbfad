"""A traced GEMM's kernel compiled on a worker thread while torch.compile goes on (``launch.precompile``).

What must hold: the kernel a warm-up compiles from meta tensors is the one the real launch looks up
(the same Triton cache key), a layout is requested once, a failed warm-up only leaves the compile to
the launch, and a compiled graph's first run compiles nothing more.  On the CPU the Gluon kernel's
keys are compared through Triton's ``jit_cache_hook`` with a driver that answers for an sm_90 GPU
(nothing is compiled or launched); on a GPU the whole way runs.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import sys
import threading
from collections import defaultdict
from types import SimpleNamespace

import pytest
import torch
import triton

import tritongemm
from tritongemm import launch
from tritongemm.device import KNOWN_DEVICES
from tritongemm.launch import precompile
from tritongemm.planning.call import Epilogue, GemmCall
from tritongemm.planning.eligibility import Operand
from tritongemm.planning.plan import plan
from tritongemm.testing import random_tensor, relative_error, tolerance

H100 = KNOWN_DEVICES["h100"]
GELU_BIAS = GemmCall(Epilogue("gelu", 1.0, 1.0, True))


def _meta(shape, stride, dtype=torch.bfloat16):
    return precompile._meta((shape, stride, 0, dtype))


def _operands(make, m=8192, n=3072, k=768):
    """x (m, k), w.T (k, n) as ``F.linear`` hands them over, out (m, n), a bias as a stride-0 (m, n) view."""
    return make((m, k), (k, 1)), make((k, n), (1, k)), make((m, n), (n, 1)), make((m, n), (0, 1))


def _warmup(hook_kwargs) -> bool:
    """Whether a ``jit_cache_hook`` call came from ``JITFunction.warmup`` (its name differs across Tritons)."""
    return hook_kwargs.get("is_manual_warmup", hook_kwargs.get("is_warmup"))


class _Sm90Driver:
    """Enough of a driver for ``JITFunction`` to specialize and key a launch for an H100."""

    def __init__(self):
        from triton.backends.compiler import GPUTarget

        self.target = GPUTarget("cuda", 90, 32)

    def get_current_target(self):
        return self.target

    def get_current_device(self):
        return 0

    def get_current_stream(self, device=None):
        return 0


def _gluon_keys(monkeypatch):
    """With a driver that answers for an H100, every lookup of the Gluon kernel that misses memory
    (the caches are emptied) is recorded, as (key, from a warm-up), and compiles nothing: ``run``
    returns before it would launch."""
    from tritongemm.kernels.gemm_gluon import GLUON_AVAILABLE, GLUON_UNAVAILABLE_REASON, gemm_gluon_kernel

    if not GLUON_AVAILABLE:
        pytest.skip(f"no usable Gluon: {GLUON_UNAVAILABLE_REASON}")
    monkeypatch.setattr(triton.runtime.driver, "_active", _Sm90Driver())
    monkeypatch.setattr(gemm_gluon_kernel, "device_caches", defaultdict(gemm_gluon_kernel.create_binder))
    seen = []
    monkeypatch.setattr(
        triton.knobs.runtime, "jit_cache_hook", lambda key, **kw: seen.append((key, _warmup(kw))) or True
    )
    return seen


def _empty(dtype):
    return lambda shape, stride: torch.empty_strided(shape, stride, dtype=dtype)


def _h100_plan(call, a, b, out, dtype, out_dtype, fast=False):
    return plan(
        launch.problem_of(a, b), H100, call.request, Operand.of(a), Operand.of(b), Operand.of(out),
        dtype, out_dtype, "auto", False, fast, call.epilogue.activation,
    )  # fmt: skip


def test_a_warmed_kernel_is_the_one_its_launch_looks_up(monkeypatch):
    seen = _gluon_keys(monkeypatch)
    a, b, out, d = _operands(_meta)
    chosen = _h100_plan(GELU_BIAS, a, b, out, torch.bfloat16, torch.bfloat16)
    assert chosen.kernel == "gluon_ws"  # the case this test is about: a descriptor kernel, an opaque op
    precompile.warm(chosen, GELU_BIAS, a, b, out, d)
    assert [w for _, w in seen] == [True]
    # The launch: real tensors (on the CPU here) of the same layouts, through the launcher a call builds.
    a, b, out, d = _operands(_empty(torch.bfloat16))
    launcher = launch.build_launcher(chosen, GELU_BIAS, a, b, out, d, out, out, interpreting=False)
    launcher(a, b, out, d, out, out, 1.0, 1.0)
    assert [w for _, w in seen] == [True, False]
    assert seen[0][0] == seen[1][0]


@pytest.mark.parametrize("fast", [False, True])
def test_a_warmed_fp8_kernel_is_the_one_scaled_mm_looks_up(fast, monkeypatch):
    from tritongemm.frontend.scaled import _launch_args

    seen = _gluon_keys(monkeypatch)
    e4m3 = torch.float8_e4m3fn
    make = {"a": lambda f: f((4096, 4096), (4096, 1), e4m3), "b": lambda f: f((4096, 2048), (1, 4096), e4m3)}

    def operands(f):  # (rowwise scales: (M, 1) and (1, N) fp32)
        a, b = make["a"](f), make["b"](f)
        return a, b, f((4096, 1), (1, 1), torch.float32), f((1, 2048), (2048, 1), torch.float32)

    def meta(shape, stride, dtype):
        return precompile._meta((shape, stride, 0, dtype))

    def real(shape, stride, dtype):
        return torch.empty_strided(shape, stride, dtype=dtype)

    for f in (meta, real):
        a, b, sa, sb = operands(f)
        call, addend, scales = _launch_args(a, b, sa, sb, None, torch.bfloat16, fast, "none", None)
        out = f((4096, 2048), (2048, 1), torch.bfloat16)
        chosen = _h100_plan(call, a, b, out, e4m3, torch.bfloat16, fast)
        assert chosen.kernel == "gluon_ws"
        if f is meta:
            precompile.warm(chosen, call, a, b, out, None, None, None, *scales)
        else:
            launcher = launch.build_launcher(chosen, call, a, b, out, out, out, out, interpreting=False)
            launcher(a, b, out, out, out, out, 1.0, 0.0, *scales)
    assert [w for _, w in seen] == [True, False]
    assert seen[0][0] == seen[1][0]


@pytest.mark.parametrize("saved", [False, True])
def test_a_warmed_gated_kernel_is_the_one_its_launch_looks_up(saved, monkeypatch):
    from tritongemm.launch.gated import GluonGated, _warm

    seen = _gluon_keys(monkeypatch)
    for f in (_meta, _empty(torch.bfloat16)):
        x, wg, wu = f((2048, 4096), (4096, 1)), f((14336, 4096), (4096, 1)), f((14336, 4096), (4096, 1))
        h, g, u = (f((2048, 14336), (14336, 1)) for _ in range(3))
        if f is _meta:
            _warm(
                GluonGated,
                "silu",
                False,
                saved,
                132,
                x,
                wg,
                wu,
                h,
                g if saved else None,
                u if saved else None,
            )
        else:
            launcher = GluonGated(x, wg, wu, h, "silu", False, saved, 132)
            launcher(x, wg, wu, h, h, h, *((g, u) if saved else (h, h)))
    assert [w for _, w in seen] == [True, False]
    assert seen[0][0] == seen[1][0]


class _Traced(SimpleNamespace):
    """What ``request`` reads of a traced tensor."""

    def stride(self):
        return self.strides

    def storage_offset(self):
        return 0


def _traced(shape, stride, device="cuda"):
    return _Traced(shape=torch.Size(shape), strides=stride, dtype=torch.bfloat16, device=torch.device(device))


def test_a_layout_is_requested_once_and_never_off_the_gpu(monkeypatch):
    started, release = [], threading.Event()
    monkeypatch.setattr(precompile, "_compile", lambda *args: started.append(args) or release.wait(10))
    monkeypatch.setattr(precompile, "_REQUESTS", {})
    monkeypatch.setattr(precompile, "_OUTSTANDING", [0])
    chosen = SimpleNamespace(kernel="gluon_ws", config="128x128x64")
    ops = _operands(_traced)
    first = precompile.request_gemm(chosen, GELU_BIAS, *ops)
    assert first is not None and precompile.pending() == 1
    assert precompile.request_gemm(chosen, GELU_BIAS, *ops) is None  # AOTAutograd may trace a body twice
    replanned = SimpleNamespace(kernel="gluon_ws", config="128x256x64")  # (the tuning cache changed, say)
    again = precompile.request_gemm(replanned, GELU_BIAS, *ops)
    assert again is not None
    other = precompile.request_gemm(chosen, GELU_BIAS, *_operands(_traced, m=4096))
    assert other is not None
    assert precompile.request_gemm(chosen, GELU_BIAS, *_operands(lambda s, t: _traced(s, t, "cpu"))) is None
    monkeypatch.setattr(precompile, "ENABLED", False)
    assert precompile.request_gemm(chosen, GELU_BIAS, *_operands(_traced, n=1024)) is None
    release.set()
    precompile.wait()
    assert first.done() and other.done() and again.done()
    assert precompile.pending() == 0 and precompile._OUTSTANDING == [0]
    assert len(started) == 3
    warm_up, device, specs = started[0]
    assert warm_up.func is precompile.warm and warm_up.args == (chosen, GELU_BIAS) and device.type == "cuda"
    assert specs[0] == ((8192, 768), (768, 1), 0, torch.bfloat16)  # (a's layout, as the trace had it)
    assert specs[4:] == (None, None)  # (no residual, no pre-activation)


def test_the_fake_kernels_of_scaled_mm_and_the_gated_op_request_their_kernels(monkeypatch):
    """A trace runs the ops' fake kernels on fake GPU tensors: each requests the kernel the op's first
    call will launch (planned here as for an H100), and a request that fails only records why."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from tritongemm.autograd import gated as gated_ops
    from tritongemm.frontend import scaled
    from tritongemm.launch import gated as gated_launch

    requests = []

    def request(key, warm_up, *tensors):
        requests.append((key, warm_up, [precompile._spec(t) for t in tensors]))

    monkeypatch.setattr(precompile, "request", request)
    monkeypatch.setattr(precompile, "FAILURES", [])
    for module in (launch, gated_launch):
        monkeypatch.setattr(module, "interpreter_enabled", lambda: False)
        monkeypatch.setattr(module, "device_info", lambda device: H100)
    e4m3, bf16 = torch.float8_e4m3fn, torch.bfloat16
    with FakeTensorMode():
        a = torch.empty(4096, 4096, device="cuda", dtype=e4m3)
        b = torch.empty(2048, 4096, device="cuda", dtype=e4m3).T
        sa, sb = torch.empty(4096, 1, device="cuda"), torch.empty(1, 2048, device="cuda")
        out = scaled._scaled_mm_fake(a, b, sa, sb, None, bf16, False, "none", None)
        x = torch.empty(2048, 4096, device="cuda", dtype=bf16)
        wg, wu = (torch.empty(14336, 4096, device="cuda", dtype=bf16) for _ in range(2))
        h, g, u = gated_ops._gated_fake(x, wg, wu, None, None, "silu", True)
        flat = torch.empty(14336, device="cuda", dtype=bf16)
        gated_ops._gated_fake(x, flat, flat, None, None, "silu", False)  # (1-D weights: no plan)
    assert out.shape == (4096, 2048) and out.dtype == bf16 and h.shape == g.shape == u.shape == (2048, 14336)
    (fp8_key, fp8_warm, fp8_specs), (gated_key, gated_warm, gated_specs) = requests
    assert fp8_key[0] == "gemm" and fp8_key[1].epilogue.scaling == "rowwise"
    assert fp8_warm.func is precompile.warm and fp8_warm.args[0].kernel == "gluon_ws"
    assert fp8_specs[:2] == [((4096, 4096), (4096, 1), 0, e4m3), ((4096, 2048), (1, 4096), 0, e4m3)]
    assert len(fp8_specs) == 8  # a, b, out, no bias, residual or pre-activation, then both scales
    assert gated_key == ("gated", "GluonGated", "silu", False)
    assert gated_warm.args[:4] == (gated_launch.GluonGated, "silu", False, True)
    assert gated_specs[4] == ((2048, 14336), (14336, 1), 0, bf16)  # g, saved for backward
    assert len(precompile.FAILURES) == 1 and precompile.FAILURES[0].startswith("gated: ")


def test_a_failed_warm_up_is_recorded_and_leaves_the_compile_to_the_launch(monkeypatch):
    def broken(*args):
        raise RuntimeError("no compiler here")

    monkeypatch.setattr(precompile, "FAILURES", [])
    monkeypatch.setattr(torch.cuda, "device", lambda device: contextlib.nullcontext())
    precompile._compile(broken, torch.device("cuda", 0), (None,))
    assert precompile.FAILURES == ["broken: RuntimeError('no compiler here')"]


# On a GPU -----------------------------------------------------------------------------------------


def _fresh_caches(monkeypatch):
    """Every tritongemm kernel's in-memory caches emptied for the test (Triton's disk cache may still
    answer, but each lookup that misses memory passes ``jit_cache_hook``), and the hook's record of
    those lookups: whether each came from a warm-up."""
    for name, module in list(sys.modules.items()):
        if name.startswith("tritongemm.kernels."):
            for kernel in vars(module).values():
                if isinstance(kernel, triton.runtime.jit.JITFunction):
                    monkeypatch.setattr(kernel, "device_caches", defaultdict(kernel.create_binder))
    seen = []
    monkeypatch.setattr(
        triton.knobs.runtime, "jit_cache_hook", lambda key, **kw: seen.append(_warmup(kw)) and None
    )
    return seen


@pytest.mark.gpu
@pytest.mark.parametrize("case", ["gelu", "unaligned"])
def test_a_launch_after_its_warm_up_compiles_nothing(case, monkeypatch):
    k = 768 if case == "gelu" else 771  # (771: K-major rows not 16-byte aligned: copied into workspaces)
    x = random_tensor((8192, k), torch.bfloat16, "cuda")
    layer = tritongemm.nn.Linear(k, 3072, activation="gelu", device="cuda", dtype=torch.bfloat16)
    call = GELU_BIAS
    a, b = x, layer.weight.mT
    out = torch.empty(8192, 3072, dtype=torch.bfloat16, device="cuda")
    d = layer.bias.expand(8192, 3072)
    chosen = launch.plan_for(call, a, b, out)
    if case == "unaligned":
        assert chosen.alignment is not None and chosen.alignment.padded  # the case this test is about
    seen = _fresh_caches(monkeypatch)
    launch.clear_plan_cache()
    metas = [precompile._meta(precompile._spec(t)) for t in (a, b, out, d)]
    precompile.warm(chosen, call, *metas)
    warmed = list(seen)
    launch.gemm(call, a, b, out, d)
    assert True in warmed and seen == warmed  # the launch's lookups all hit what the warm-up compiled
    ref = torch.nn.functional.gelu(torch.addmm(layer.bias.double(), x.double(), layer.weight.double().T))
    assert relative_error(out, ref) <= tolerance(torch.bfloat16, "cuda")


def _compiled_case(case: str):
    """(function, its arguments, a float64 reference of its output) for an opaque op of each kind."""
    torch.manual_seed(0)
    if case == "gemm":  # a converted Linear with BERT's fused GELU: the warp-specialized kernel
        mlp = torch.nn.Sequential(torch.nn.Linear(768, 3072), torch.nn.GELU(), torch.nn.Linear(3072, 768))
        mlp = mlp.to("cuda", torch.bfloat16)
        x = random_tensor((8192, 768), torch.bfloat16, "cuda")
        with torch.no_grad():
            ref = mlp.double()(x.double())
        return tritongemm.nn.convert(mlp.to(torch.bfloat16)), (x,), ref
    if case == "gated":  # Llama-3-8B's gate and up projections at 2048 tokens: the gated op
        x = random_tensor((2048, 4096), torch.bfloat16, "cuda")
        wg, wu = (random_tensor((14336, 4096), torch.bfloat16, "cuda") * 0.02 for _ in range(2))
        ref = torch.nn.functional.silu(x.double() @ wg.double().T) * (x.double() @ wu.double().T)
        return lambda x, wg, wu: tritongemm.gated_linear(x, wg, wu), (x, wg, wu), ref
    e4m3 = torch.float8_e4m3fn  # fp8 with rowwise scales
    a = random_tensor((4096, 4096), torch.bfloat16, "cuda").to(e4m3)
    b = random_tensor((2048, 4096), torch.bfloat16, "cuda").to(e4m3).T
    sa, sb = torch.rand(4096, 1, device="cuda") + 0.5, torch.rand(1, 2048, device="cuda") + 0.5
    ref = (a.double() @ b.double()) * sa.double() * sb.double()
    return lambda *args: tritongemm.scaled_mm(*args, out_dtype=torch.bfloat16), (a, b, sa, sb), ref


@pytest.mark.gpu
@pytest.mark.parametrize("case", ["gemm", "gated", "fp8"])
def test_a_compiled_graphs_first_run_finds_its_kernel_built(case, monkeypatch):
    # (a graph found in Inductor's caches is not traced, and its kernel is Triton's cache's)
    monkeypatch.setattr(torch._inductor.config, "force_disable_caches", True)
    monkeypatch.setattr(precompile, "FAILURES", [])
    torch._dynamo.reset()
    launch.clear_plan_cache()
    fn, args, ref = _compiled_case(case)
    seen = _fresh_caches(monkeypatch)
    with torch.no_grad():
        out = torch.compile(fn, fullgraph=True)(*args)
    assert relative_error(out, ref) <= tolerance(torch.bfloat16, "cuda")
    assert seen and all(seen), seen  # compiled in the trace's warm-up only, none at the first launch
    assert not precompile.FAILURES


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_forked_child_starts_without_the_parents_requests(monkeypatch):
    """A child forked while the worker holds requests has no worker thread: it must not wait on them."""
    release = threading.Event()
    monkeypatch.setattr(precompile, "_compile", lambda *args: release.wait(10))
    monkeypatch.setattr(precompile, "_REQUESTS", {})
    monkeypatch.setattr(precompile, "_OUTSTANDING", [0])
    monkeypatch.setattr(precompile, "_POOL", [])
    assert (
        precompile.request_gemm(
            SimpleNamespace(kernel="gluon_ws", config="128x128x64"), GELU_BIAS, *_operands(_traced)
        )
        is not None
    )
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report whether it starts clean and returns from ``wait`` at once
        try:
            precompile.wait()
            clean = not precompile._REQUESTS and precompile._OUTSTANDING == [0] and not precompile._POOL
            os.write(write, b"ok" if clean else b"dirty")
        finally:
            os._exit(0)
    os.close(write)
    ready, _, _ = select.select([read], [], [], 30)
    answer = os.read(read, 16) if ready else b"hung in wait()"
    if not ready:
        os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    release.set()
    precompile.wait()
    assert answer == b"ok"


def test_warming_blocks_nest_and_restore_the_threads_launch_state():
    from tritongemm.launch import common
    from tritongemm.launch.context import THREAD

    before = (THREAD.ready, THREAD.warming, THREAD.tracing)
    with common.warming():
        with common.warming():  # (``precompile.warm`` inside the worker's own block)
            assert THREAD.warming and not THREAD.ready
        assert THREAD.warming and not THREAD.ready  # the outer block still compiles only
        with common.tracing():
            assert THREAD.tracing and THREAD.warming
        assert not THREAD.tracing
    assert (THREAD.ready, THREAD.warming, THREAD.tracing) == before
