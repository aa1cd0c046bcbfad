"""Nothing a user does may crash a call or change a gradient: threads, streams, graphs, Triton versions.

* Every thread can launch: autograd's device thread, a user's ``Thread``, a
  pool worker -- including one that has never made a CUDA call, whose first
  driver call (a tensor-map encoding, a launch) would otherwise find no
  current context (``launch.context``).
* The generated direct launcher is used only on the Triton releases and
  launcher form it was written for; elsewhere launches take Triton's runner.
* Operands of an empty product (K = 0) that require grad get torch's
  zero-size gradients, through every door.
* Concurrent streams and threads give the right answers; CUDA-graph capture
  of a shape's first call records a graph that replays correctly.
* The soak benchmark (``python -m benchmarks soak``) holds memory and caches flat.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import types
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import tritongemm
from tritongemm.launch import common, context, direct
from tritongemm.testing import relative_error, tolerance

REPO = Path(__file__).resolve().parents[1]


# ----------------------------------------------------------------------------------
# Empty products: gradients as torch gives them
# ----------------------------------------------------------------------------------
def _grads(fn, *tensors):
    out = fn(*tensors)
    grads = torch.autograd.grad(out.sum(), tensors, allow_unused=True)
    return out, grads


EMPTY_K_DOORS = {
    "addmm": (lambda i, a, b: tritongemm.addmm(i, a, b), torch.addmm, [(5, 3), (5, 0), (0, 3)]),
    "addmm beta=2": (
        lambda i, a, b: tritongemm.addmm(i, a, b, beta=2.0),
        lambda i, a, b: torch.addmm(i, a, b, beta=2.0),
        [(3,), (5, 0), (0, 3)],
    ),
    "baddbmm": (tritongemm.baddbmm, torch.baddbmm, [(2, 5, 3), (2, 5, 0), (2, 0, 3)]),
    "linear": (lambda x, w, b: tritongemm.linear(x, w, b), F.linear, [(4, 0), (3, 0), (3,)]),
    "linear no bias": (lambda x, w: tritongemm.linear(x, w), F.linear, [(4, 0), (3, 0)]),
    "matmul": (tritongemm.matmul, torch.matmul, [(5, 0), (0, 3)]),
}


@pytest.mark.parametrize("door", sorted(EMPTY_K_DOORS))
def test_empty_k_operands_get_torchs_gradients(door, device):
    ours, theirs, shapes = EMPTY_K_DOORS[door]
    tensors = [torch.randn(s, device=device, requires_grad=True) for s in shapes]
    out, grads = _grads(ours, *tensors)
    ref, ref_grads = _grads(theirs, *tensors)
    torch.testing.assert_close(out, ref, rtol=0, atol=0)
    for i, (g, r) in enumerate(zip(grads, ref_grads)):
        assert (g is None) == (r is None), f"operand {i}: got {g}, torch gives {r}"
        if r is not None:
            assert g.shape == r.shape and g.dtype == r.dtype, (i, g.shape, r.shape)
            torch.testing.assert_close(g, r, rtol=0, atol=0)


def test_empty_k_through_nn_and_patch_repeated(device):
    """Repeated calls (the fast path's entries) and the other doors give the same gradients."""
    model = tritongemm.nn.convert(torch.nn.Sequential(torch.nn.Linear(0, 3, device=device)))
    x = torch.randn(4, 0, device=device, requires_grad=True)
    for _ in range(3):
        x.grad = None
        model.zero_grad()
        model(x).sum().backward()
        assert x.grad is not None and x.grad.shape == (4, 0)
        assert model[0].weight.grad is not None and model[0].weight.grad.shape == (3, 0)
        torch.testing.assert_close(model[0].bias.grad, torch.full((3,), 4.0, device=device))
    i, a, b = (torch.randn(s, device=device, requires_grad=True) for s in [(5, 3), (5, 0), (0, 3)])
    with tritongemm.patch():
        grads = torch.autograd.grad(torch.addmm(i, a, b).sum(), (i, a, b))
    assert [tuple(g.shape) for g in grads] == [(5, 3), (5, 0), (0, 3)]


def test_empty_k_keeps_negative_zero_and_allows_inplace(device):
    z = torch.full((2, 2), -0.0, device=device)
    a = torch.randn(2, 0, device=device, requires_grad=True)
    out = tritongemm.addmm(z, a, torch.randn(0, 2, device=device))
    assert torch.signbit(out).all()
    out.relu_()  # an in-place op on the result is allowed, as on torch's
    out.sum().backward()
    assert a.grad.shape == (2, 0)


# ----------------------------------------------------------------------------------
# The direct launcher: only where it was written for
# ----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("version", "supported"),
    [
        ("3.4.0", True),
        ("3.6.0", True),
        ("3.6.0+git1234", True),
        ("3.7.0", False),
        ("3.9.0", False),
        ("4.0.0", False),
        ("3.3.1", False),
        ("nonsense", False),
    ],
)
def test_direct_launch_versions(version, supported):
    assert direct.direct_launch_supported(version) is supported


class _Launcher36:
    """The form of Triton 3.4-3.6's CudaLauncher."""

    global_scratch_size = profile_scratch_size = 0
    launch_cooperative_grid = launch_pdl = False

    def __call__(self, gridX, gridY, gridZ, stream, function, *args):  # noqa: N803
        raise AssertionError("not called")


class _Launcher39(_Launcher36):
    """Triton 3.9's: the same first parameters, then hooks and metadata, then ``*args``."""

    def __call__(  # noqa: N803
        self,
        gridX,
        gridY,
        gridZ,
        stream,
        function,
        kernel_metadata,
        launch_metadata,
        launch_enter_hook,
        launch_exit_hook,
        *args,
    ):
        raise AssertionError("not called")


def test_known_launcher_form():
    assert direct.is_known_launcher(_Launcher36())
    assert not direct.is_known_launcher(_Launcher39())
    assert not direct.is_known_launcher(None)
    assert not direct.is_known_launcher(object())


def _fake_compiled(launcher):
    launcher.launch = len  # a builtin, as Triton's C launch function is
    src = types.SimpleNamespace(signature={"a_ptr": "*fp32", "n": "i32"})
    return types.SimpleNamespace(run=launcher, src=src, function=1, packed_metadata=())


def _fake_launch():
    kernel = types.SimpleNamespace(arg_names=["a_ptr", "n"], __name__="fake_kernel")
    return common.Launch(common.KernelArgs(kernel, ("a_ptr",), n=4), (1,), 4, 3)


def test_direct_launch_refuses_other_launcher_forms(monkeypatch):
    """Triton 3.9's launcher passes hooks and scratch in other places: a launch generated for
    3.6's order would pass the wrong arguments, so it takes Triton's runner instead."""
    monkeypatch.setattr(direct, "_RAW_STREAM", lambda index: 0)
    monkeypatch.setattr(direct.triton, "__version__", "3.6.0")
    assert direct.DirectLaunch.of(_fake_compiled(_Launcher36()), _fake_launch(), 0) is not None
    assert direct.DirectLaunch.of(_fake_compiled(_Launcher39()), _fake_launch(), 0) is None
    monkeypatch.setattr(direct.triton, "__version__", "3.9.0")
    assert direct.DirectLaunch.of(_fake_compiled(_Launcher36()), _fake_launch(), 0) is None


def test_installed_triton_launcher_is_recognised_only_where_supported():
    driver = pytest.importorskip("triton.backends.nvidia.driver")
    import triton

    launcher = object.__new__(driver.CudaLauncher)
    if direct.direct_launch_supported(triton.__version__):
        assert direct.is_known_launcher(launcher), triton.__version__
    else:
        # Newer Triton: never the generated launcher, whatever the form.
        assert direct.DirectLaunch.of(_fake_compiled(launcher), _fake_launch(), 0) is None


def test_generated_source_holds_only_names_and_integers(monkeypatch):
    monkeypatch.setattr(direct, "_RAW_STREAM", lambda index: 0)
    monkeypatch.setattr(direct.triton, "__version__", "3.6.0")
    launch_fn = direct.DirectLaunch.of(_fake_compiled(_Launcher36()), _fake_launch(), 0)
    body = launch_fn.source.split("\n", 1)[1]
    assert "'" not in body and '"' not in body, launch_fn.source  # no string literals: values travel in env


# ----------------------------------------------------------------------------------
# A current context on every thread
# ----------------------------------------------------------------------------------
class _FakeDriver:
    """libcuda's four entry points ``context.ensure`` uses, recording calls."""

    def __init__(self, current: int):
        self.current, self.calls = current, []

    def cuCtxGetCurrent(self, ref):  # noqa: N802
        self.calls.append("get")
        ref._obj.value = self.current or None
        return 0

    def cuDeviceGet(self, ref, ordinal):  # noqa: N802
        self.calls.append(("device", ordinal))
        ref._obj.value = ordinal
        return 0

    def cuDevicePrimaryCtxRetain(self, ref, device):  # noqa: N802
        self.calls.append(("retain", device.value))
        ref._obj.value = 0xC0 + device.value
        return 0

    def cuCtxSetCurrent(self, ctx):  # noqa: N802
        self.calls.append(("set", ctx.value))
        self.current = ctx.value
        return 0


def _in_new_thread(fn):
    box = {}

    def run():
        try:
            box["value"] = fn()
        except BaseException as exc:  # re-raised in the caller
            box["error"] = exc

    t = threading.Thread(target=run)
    t.start()
    t.join()
    if "error" in box:
        raise box["error"]
    return box.get("value")


@pytest.mark.parametrize("current", [0, 0xAB])
def test_ensure_makes_the_primary_context_current_only_where_none_is(monkeypatch, current):
    fake = _FakeDriver(current)
    monkeypatch.setattr(context, "_DRIVER", [fake])
    monkeypatch.setattr(context.torch.cuda, "is_available", lambda: True)

    def first_and_second():
        assert not context.THREAD.ready  # a new thread starts without
        context.ensure(1)
        calls = list(fake.calls)
        context.ensure(1)  # once per thread
        return calls, list(fake.calls)

    calls, again = _in_new_thread(first_and_second)
    assert again == calls
    if current:
        assert calls == ["get"]
    else:
        assert calls == ["get", ("device", 1), ("retain", 1), ("set", 0xC1)]


def test_ensure_reports_driver_errors(monkeypatch):
    fake = _FakeDriver(0)
    fake.cuCtxGetCurrent = lambda ref: 201  # CUDA_ERROR_INVALID_CONTEXT
    monkeypatch.setattr(context, "_DRIVER", [fake])
    monkeypatch.setattr(context.torch.cuda, "is_available", lambda: True)
    with pytest.raises(RuntimeError, match="cuCtxGetCurrent failed with CUDA driver error 201"):
        _in_new_thread(lambda: context.ensure(0))


def test_every_launch_makes_sure_of_a_context_once_per_thread(monkeypatch, device):
    seen = []
    real = common.ensure

    def counting(device_index=None):
        seen.append(device_index)
        real(device_index)

    monkeypatch.setattr(common, "ensure", counting)
    a = torch.randn(16, 24, device=device)
    b = torch.randn(24, 8, device=device)
    tritongemm.matmul(a, b)  # plans and compiles on this thread

    def calls():
        assert not context.THREAD.ready
        before = len(seen)
        for _ in range(3):
            out = tritongemm.matmul(a, b)
        return len(seen) - before, out

    for ensured, out in [_in_new_thread(calls) for _ in range(3)]:
        assert ensured == 1  # the thread's first launch, and only that one
        assert relative_error(out, a.double() @ b.double()) <= tolerance(a.dtype, device)


# ----------------------------------------------------------------------------------
# Threads on the interpreter (its launches take turns) and the soak
# ----------------------------------------------------------------------------------
def test_pool_of_threads_gives_right_answers(device):
    shapes = [(9, 17, 33), (32, 16, 8), (5, 40, 24), (64, 8, 16)]
    operands = [(torch.randn(m, k, device=device), torch.randn(k, n, device=device)) for m, n, k in shapes]

    def work(i):
        a, b = operands[i % len(operands)]
        return i, tritongemm.matmul(a, b)

    with ThreadPoolExecutor(max_workers=4) as pool:
        results = list(pool.map(work, range(12)))
    for i, out in results:
        a, b = operands[i % len(operands)]
        assert relative_error(out, a.double() @ b.double()) <= tolerance(a.dtype, device)


def test_soak_holds_memory_and_caches_flat(tmp_path, device):
    """The soak benchmark's own run on the interpreter: its verdicts pass and its CSV is in the schema."""
    from benchmarks import schema, soak

    if device.type == "cuda":
        pytest.skip("on a GPU the soak is the benchmark `python -m benchmarks soak` (20,000 calls)")
    result = soak.soak(torch.device("cpu"), calls=24, samples=4, log=lambda s: None)
    failed = {k: v for k, v in result["verdicts"].items() if not v[0]}
    assert not failed, failed
    rows = soak.to_rows(result, torch.device("cpu"))
    from benchmarks import harness

    path = harness.write_results(rows, tmp_path / "soak.csv", harness.environment("cpu"))
    df = schema.read(path)
    assert list(df["x"]) == [0, 6, 12, 18, 24]


def test_soak_verdicts_catch_growth():
    """A cache or RSS that grows after warm-up fails its verdict."""
    from benchmarks import soak

    base = dict(rss_mb=100.0, launch_plans=5, fastpath_entries=5, encodings_per_argument=1, counter_buffers=1)
    rows = [dict(base, calls=0), dict(base, calls=10, rss_mb=500.0, fastpath_entries=6)]
    verdicts = soak.verdicts(rows, torch.device("cpu"))
    assert not verdicts["host RSS"][0]
    assert not verdicts["fastpath_entries"][0]
    assert verdicts["launch_plans"][0]


# ----------------------------------------------------------------------------------
# Compiled (GPU): threads that never touched CUDA, streams, graphs
# ----------------------------------------------------------------------------------
#: Shapes that reach each kernel on an H100 (bf16): TMA descriptors (warp-specialized and
#: persistent), pointer tiles, GEMV rows, split K, and the padded path of an odd leading dimension.
GPU_SHAPES = [(4096, 4096, 4096), (1024, 1024, 1024), (1, 4096, 4096), (64, 256, 8192), (333, 1023, 333)]


def _gpu_operands(shapes, dtype=torch.bfloat16):
    g = torch.Generator(device="cpu").manual_seed(7)
    return [
        (
            torch.randn(m, k, generator=g).to("cuda", dtype),
            torch.randn(n, k, generator=g).to("cuda", dtype).mT,
        )
        for m, n, k in shapes
    ]


@pytest.mark.gpu
def test_backward_on_autograd_thread_after_warm_up_in_fresh_process():
    """The reported crash: GEMMs warmed up on the main thread, then a backward whose first
    CUDA call on autograd's device thread is ours (a fresh process, so that thread is new)."""
    script = textwrap.dedent(
        """
        import torch, tritongemm
        x = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        w = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        g = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
        with torch.no_grad():
            for A in (g, g.mT):
                for B in (w, w.mT, x, x.mT):
                    tritongemm.matmul(A, B)
        tritongemm.linear(x, w).backward(g)
        ref_x = (g.double() @ w.double())
        ref_w = (g.double().mT @ x.double())
        for got, ref in ((x.grad, ref_x), (w.grad, ref_w)):
            err = ((got.double() - ref).norm() / ref.norm()).item()
            assert err < 2e-2, err
        print("ok")
        """
    )
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=_env(), timeout=600
    )
    assert proc.returncode == 0 and "ok" in proc.stdout, proc.stderr[-3000:]


def _env(**extra) -> dict:
    """The environment of a compiled-kernel subprocess that imports this checkout's tritongemm."""
    env = dict(os.environ, **extra)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    env.pop("TRITON_INTERPRET", None)
    return env


@pytest.mark.gpu
def test_thread_that_never_touched_cuda_runs_every_kernel():
    operands = _gpu_operands(GPU_SHAPES)
    kernels = {tritongemm.explain(a, b).kernel for a, b in operands}
    assert {"gluon_ws", "tma", "tma_persistent"} & kernels, kernels  # a descriptor kernel is covered
    refs = [tritongemm.matmul(a, b) for a, b in operands]  # compiled and loaded on this thread
    torch.cuda.synchronize()

    def run():
        assert context.current_context() == 0, "the thread must start without a CUDA context"
        outs = [tritongemm.matmul(a, b) for a, b in operands]
        side = torch.cuda.Stream()
        with torch.cuda.stream(side):
            outs += [tritongemm.matmul(a, b) for a, b in operands]
        side.synchronize()
        torch.cuda.synchronize()
        return outs

    outs = _in_new_thread(run)
    for out, ref in zip(outs, refs + refs):
        assert torch.equal(out, ref)


@pytest.mark.gpu
def test_autograd_backward_in_fresh_threads():
    x = torch.randn(512, 1024, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    w = torch.randn(2048, 1024, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    g = torch.randn(512, 2048, device="cuda", dtype=torch.bfloat16)
    tritongemm.linear(x, w).backward(g)
    want = (x.grad.clone(), w.grad.clone())

    def step():
        assert context.current_context() == 0
        x.grad = w.grad = None
        tritongemm.linear(x, w).backward(g)
        torch.cuda.synchronize()
        return x.grad.clone(), w.grad.clone()

    for _ in range(2):
        got = _in_new_thread(step)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


@pytest.mark.gpu
def test_gated_mlp_backward_in_fresh_threads():
    """The gated MLP's backward starts with its elementwise kernel: that launch, too, must find a context."""
    x = torch.randn(512, 1024, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    w_gate, w_up = (torch.randn(2048, 1024, device="cuda", dtype=torch.bfloat16) * 0.05 for _ in range(2))
    g = torch.randn(512, 2048, device="cuda", dtype=torch.bfloat16)
    tritongemm.gated_linear(x, w_gate, w_up).backward(g)
    want = x.grad.clone()

    def step():
        assert context.current_context() == 0
        x.grad = None
        tritongemm.gated_linear(x, w_gate, w_up).backward(g)
        torch.cuda.synchronize()
        return x.grad.clone()

    for _ in range(2):
        assert torch.equal(_in_new_thread(step), want)


@pytest.mark.gpu
def test_eight_threads_on_one_gpu():
    shapes = [(m, n, k) for m in (1, 64, 700, 2048) for n, k in ((1024, 4096), (4096, 1024))]
    operands = _gpu_operands(shapes)
    refs = [tritongemm.matmul(a, b) for a, b in operands]
    torch.cuda.synchronize()

    def work(i):
        a, b = operands[i % len(operands)]
        out = tritongemm.matmul(a, b)
        torch.cuda.current_stream().synchronize()
        return i, out

    with ThreadPoolExecutor(max_workers=8) as pool:
        for i, out in pool.map(work, range(400)):
            assert torch.equal(out, refs[i % len(refs)]), i


@pytest.mark.gpu
def test_two_streams_run_different_gemms_concurrently():
    (a1, b1), (a2, b2) = _gpu_operands([(2048, 2048, 4096), (96, 8192, 4096)])
    r1 = a1.double() @ b1.double()
    r2 = a2.double() @ b2.double()
    s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()
    outs1, outs2 = [], []
    torch.cuda.synchronize()
    for _ in range(20):
        with torch.cuda.stream(s1):
            outs1.append(tritongemm.matmul(a1, b1))
        with torch.cuda.stream(s2):
            outs2.append(tritongemm.matmul(a2, b2))
    torch.cuda.synchronize()
    tol = tolerance(torch.bfloat16, "cuda")
    for o in outs1:
        assert relative_error(o, r1) <= tol
    for o in outs2:
        assert relative_error(o, r2) <= tol


@pytest.mark.gpu
@pytest.mark.parametrize("door", ["matmul", "linear", "nn"])
def test_graph_capture_of_a_shapes_first_call(door):
    """The first call of a shape (planned, compiled, loaded) made inside CUDA-graph capture:
    the graph replays to the right answer."""
    m, n, k = {"matmul": (513, 1536, 1024), "linear": (1000, 3072, 768), "nn": (77, 2304, 1152)}[door]
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
    bias = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    if door == "nn":
        lin = torch.nn.Linear(k, n, device="cuda", dtype=torch.bfloat16)
        with torch.no_grad():
            lin.weight.copy_(w)
            lin.bias.copy_(bias)
        model = tritongemm.nn.convert(torch.nn.Sequential(lin))

    def call():
        if door == "matmul":
            return tritongemm.matmul(x, w.mT)
        if door == "linear":
            return tritongemm.linear(x, w, bias)
        return model(x)

    graph = torch.cuda.CUDAGraph()
    torch.cuda.synchronize()
    with torch.no_grad(), torch.cuda.graph(graph):
        out = call()
    x.copy_(torch.randn_like(x))
    graph.replay()
    torch.cuda.synchronize()
    ref = x.double() @ w.double().mT + (0 if door == "matmul" else bias.double())
    assert relative_error(out, ref) <= tolerance(torch.bfloat16, "cuda")


@pytest.mark.gpu
def test_runner_launch_mode_gives_the_same_answers():
    """``TRITONGEMM_FAST_LAUNCH=runner`` (Triton's compiled-kernel runner, what Triton releases
    without a known launcher take) computes what the direct launcher does."""
    script = textwrap.dedent(
        """
        import torch, tritongemm
        from tritongemm.launch import common
        assert common.LAUNCH_MODE == "runner"
        g = torch.Generator(device="cpu").manual_seed(0)
        for m, n, k in ((4096, 4096, 4096), (1, 4096, 4096), (333, 1023, 333), (64, 256, 8192)):
            a = torch.randn(m, k, generator=g).to("cuda", torch.bfloat16)
            b = torch.randn(n, k, generator=g).to("cuda", torch.bfloat16).mT
            for _ in range(3):
                out = tritongemm.matmul(a, b)
            ref = a.double() @ b.double()
            err = ((out.double() - ref).norm() / ref.norm()).item()
            assert err < 1e-2, (m, n, k, err)
        print("ok")
        """
    )
    env = _env(TRITONGEMM_FAST_LAUNCH="runner")
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=600
    )
    assert proc.returncode == 0 and "ok" in proc.stdout, proc.stderr[-3000:]


def test_caches_stay_within_their_bounds(monkeypatch, device):
    """More distinct calls than a cache holds: it is cleared and refilled, never past its bound."""
    from tritongemm import launch

    monkeypatch.setattr(launch.Plans, "MAX_ENTRIES", 3)
    monkeypatch.setattr(launch.Plans, "MAX_LAUNCHERS", 3)
    w = torch.randn(8, 16, device=device)
    for m in range(1, 12):
        x = torch.randn(m, 16, device=device)
        for _ in range(2):  # the second call builds the fast-path entry
            out = tritongemm.linear(x, w)
        assert relative_error(out, x.double() @ w.double().mT) <= tolerance(x.dtype, device)
        assert len(launch.PLANS.entries) <= 3
        assert len(launch.PLANS.launchers) <= 3
