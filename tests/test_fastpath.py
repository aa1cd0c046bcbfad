"""The repeated-call fast path (``tritongemm.autograd.fastpath``) and the direct launch (``launch.direct.DirectLaunch``).

A repeated call must give what its first call gave, never reuse an entry for
arguments that differ in anything the first call's checks read, and leave
every error, autocast, autograd and fallback rule to the whole way.
"""

import threading

import pytest
import torch
import torch.nn.functional as F
from conftest import grad_fn_name

import tritongemm
from tritongemm import launch, semantics
from tritongemm.autograd import fastpath
from tritongemm.request import calls
from tritongemm.request import fastpath as door
from tritongemm.testing import (
    TF32_TOLERANCE,
    assert_close,
    assert_matches_reference,
    make_matrix,
    random_tensor,
    tolerance,
)

DTYPES = [torch.float32, torch.float16, torch.bfloat16]


@pytest.fixture(autouse=True)
def _fresh_entries():
    launch.clear_plan_cache()
    yield
    launch.clear_plan_cache()


class _WholeWayCounter:
    """Counts calls that take the whole way (``calls.linear`` / ``matmul`` / ``mm`` / ``addmm``)."""

    def __init__(self, monkeypatch):
        self.calls = 0
        for name in ("linear", "matmul", "mm", "addmm"):
            real = getattr(calls, name)

            def counted(*args, _real=real, **kwargs):
                self.calls += 1
                return _real(*args, **kwargs)

            monkeypatch.setattr(calls, name, counted)


#: the grad_fn an entry's output gets, per ``grad_node`` (conftest)
_NODE_NAMES = {"cpp-node": "TritongemmEntryBackward", "function": "EntryFunctionBackward"}


def _ref_linear(x, w, b=None):
    return F.linear(x.double(), w.double(), None if b is None else b.double())


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("x_shape", [(7, 24), (2, 5, 24), (3, 1, 2, 24)], ids=str)
@pytest.mark.parametrize("with_bias", [False, True], ids=["nobias", "bias"])
def test_repeated_linear_uses_its_entry_and_matches(dtype, x_shape, with_bias, device, monkeypatch):
    w = random_tensor((40, 24), dtype, device)
    b = random_tensor((40,), dtype, device) if with_bias else None
    counter = _WholeWayCounter(monkeypatch)
    for _ in range(3):
        x = random_tensor(x_shape, dtype, device)  # new data (and a new address) each call
        y = tritongemm.linear(x, w, b)
        assert y.shape == (*x_shape[:-1], 40)
        assert_close(y, _ref_linear(x, w, b), dtype=dtype)
    assert counter.calls == 1, "the second and third calls should have used the entry"
    assert len(launch.PLANS.entries) == 1
    assert isinstance(next(iter(launch.PLANS.entries.values())), fastpath.Entry)


@pytest.mark.parametrize("door", ["api", "module"])
def test_repeated_activation_linear_uses_its_entry_without_autograd(door, device, monkeypatch):
    # A fused activation's entries run only for calls autograd does not record; recorded calls take the
    # plain linear's entry, then torch's activation, as the whole way does (and backward stays right).
    layer = tritongemm.nn.Linear(24, 40, activation="gelu", device=device)
    w, b = layer.weight.detach(), layer.bias.detach()
    run = (
        (lambda x: layer(x))
        if door == "module"
        else (lambda x: tritongemm.linear(x, w, b, activation="gelu"))
    )
    counter = _WholeWayCounter(monkeypatch)
    with torch.no_grad():
        for _ in range(3):
            x = random_tensor((2, 5, 24), torch.float32, device)
            assert_close(run(x), F.gelu(_ref_linear(x, w, b)))
    assert counter.calls == 1, "the second and third calls should have used the entry"
    entries = [e for e in launch.PLANS.entries.values() if isinstance(e, fastpath.Entry)]
    assert [e.call.epilogue.activation for e in entries] == ["gelu"]
    silu = tritongemm.linear(x, w, b, activation="silu")  # another activation: another signature
    assert_close(silu, F.silu(_ref_linear(x, w, b)))
    x = random_tensor((2, 5, 24), torch.float32, device).requires_grad_()
    y = layer(x) if door == "module" else tritongemm.linear(x, layer.weight, layer.bias, activation="gelu")
    assert y.grad_fn is not None and "Entry" not in type(y.grad_fn).__name__
    y.sum().backward()
    xd = x.detach().double().requires_grad_()
    F.gelu(F.linear(xd, layer.weight.double(), layer.bias.double())).sum().backward()
    assert_close(x.grad, xd.grad)


def test_entry_result_is_bitwise_the_whole_ways(device):
    x = random_tensor((2, 9, 32), torch.float16, device)
    w = random_tensor((24, 32), torch.float16, device)
    b = random_tensor((24,), torch.float16, device)
    whole = calls.linear(x, w, b, None, None, None, None, None, None)
    tritongemm.linear(x, w, b)  # makes the entry
    assert len(launch.PLANS.entries) == 1
    fast = tritongemm.linear(x, w, b)
    assert torch.equal(fast, whole)


@pytest.mark.parametrize("layouts", ["NN", "NT", "TN", "TT", "SN", "NS"])
def test_repeated_matmul_and_mm_every_layout(layouts, grad_node, device, monkeypatch):
    counter = _WholeWayCounter(monkeypatch)
    for fn in (tritongemm.matmul, tritongemm.mm):
        for _ in range(2):
            a = make_matrix(13, 20, layouts[0], torch.float32, device)
            b = make_matrix(20, 11, layouts[1], torch.float32, device)
            c = fn(a, b)
            assert_close(c, a.double() @ b.double())
    assert counter.calls == 2  # once for matmul, once for mm


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("w_layout", ["row", "column"])
def test_repeated_addmm_with_a_bias_uses_its_entry(dtype, w_layout, grad_node, device, monkeypatch):
    # ``torch.addmm(bias, x, w)`` is how transformers' Conv1D (GPT-2) computes its projections.
    counter = _WholeWayCounter(monkeypatch)
    w = make_matrix(24, 40, "N" if w_layout == "row" else "T", dtype, device).requires_grad_()
    b = random_tensor((40,), dtype, device).requires_grad_()
    for _ in range(3):
        x = random_tensor((7, 24), dtype, device).requires_grad_()
        assert_matches_reference(tritongemm.addmm, torch.addmm, b, x, w)
    assert counter.calls == 1, "the second and third calls should have used the entry"
    assert grad_fn_name(tritongemm.addmm(b, x, w).grad_fn) == _NODE_NAMES[grad_node]
    with torch.no_grad():
        fast = tritongemm.addmm(b, x, w)
    whole = calls.addmm(b, x, w, 1, 1, None, None, None, None)
    assert torch.equal(fast, whole)


def test_addmm_other_than_a_bias_and_unit_scales_takes_the_whole_way(device, monkeypatch):
    x = random_tensor((7, 24), torch.float32, device)
    w = random_tensor((24, 40), torch.float32, device)
    cases = {
        "(M, N) input": (random_tensor((7, 40), torch.float32, device), {}),
        "(1, N) input": (random_tensor((1, 40), torch.float32, device), {}),
        "(1,) input": (random_tensor((1,), torch.float32, device), {}),
        "beta": (random_tensor((40,), torch.float32, device), {"beta": 0.5}),
        "alpha": (random_tensor((40,), torch.float32, device), {"alpha": 2}),
        "float beta": (random_tensor((40,), torch.float32, device), {"beta": 1.0}),
    }
    for name, (inp, kwargs) in cases.items():
        counter = _WholeWayCounter(monkeypatch)
        for _ in range(2):
            assert_matches_reference(tritongemm.addmm, torch.addmm, inp, x, w, **kwargs)
        assert counter.calls == 2, name
        monkeypatch.undo()


def test_entries_are_per_signature(grad_node, device):
    """Shapes, strides, dtype, alignment and bias presence each get their own entry: no stale reuse."""
    w = random_tensor((16, 24), torch.float32, device)
    b = random_tensor((16,), torch.float32, device)
    cases = [
        random_tensor((5, 24), torch.float32, device),
        random_tensor((6, 24), torch.float32, device),  # another M
        random_tensor((24, 5), torch.float32, device).mT,  # other strides
        random_tensor((5 * 24 + 1,), torch.float32, device)[1:].view(5, 24),  # 4-byte aligned, not 16
    ]
    for _ in range(2):
        for x in cases:
            for bias in (None, b):
                assert_close(tritongemm.linear(x, w, bias), _ref_linear(x, w, bias))
    assert len(launch.PLANS.entries) == 2 * len(cases)
    x16 = random_tensor((5, 24), torch.float16, device)
    w16 = w.half()
    for _ in range(2):
        assert_close(tritongemm.linear(x16, w16), _ref_linear(x16, w16), dtype=torch.float16)
    assert len(launch.PLANS.entries) == 2 * len(cases) + 1


def test_errors_are_raised_after_an_entry_exists(device):
    x = random_tensor((4, 8), torch.float32, device)
    w = random_tensor((6, 8), torch.float32, device)
    tritongemm.linear(x, w)
    tritongemm.linear(x, w)
    with pytest.raises(RuntimeError, match=r"\(4, 8\).*\(6, 9\)"):
        tritongemm.linear(x, random_tensor((6, 9), torch.float32, device))
    with pytest.raises(RuntimeError, match="dtype"):
        tritongemm.linear(x, w.double())
    with pytest.raises(TypeError):
        tritongemm.linear(x, w.tolist())
    with pytest.raises(RuntimeError, match="cannot be multiplied"):
        tritongemm.matmul(x, x)


@pytest.mark.parametrize("with_bias", [False, True], ids=["nobias", "bias"])
def test_repeated_linear_with_grad(grad_node, with_bias, device, monkeypatch):
    counter = _WholeWayCounter(monkeypatch)
    w = random_tensor((12, 16), torch.float32, device).requires_grad_()
    b = random_tensor((12,), torch.float32, device).requires_grad_() if with_bias else None
    for _ in range(3):
        x = random_tensor((2, 3, 16), torch.float32, device).requires_grad_()
        args = (x, w) if b is None else (x, w, b)
        assert_matches_reference(tritongemm.linear, F.linear, *args)
    assert counter.calls == 1
    assert grad_fn_name(tritongemm.linear(*args).grad_fn) == _NODE_NAMES[grad_node]


def test_grad_mode_and_requires_grad_switch_within_one_entry(grad_node, device):
    w = random_tensor((12, 16), torch.float32, device)
    x = random_tensor((3, 16), torch.float32, device)
    y0 = tritongemm.linear(x, w)
    assert y0.grad_fn is None
    w.requires_grad_()
    y1 = tritongemm.linear(x, w)
    assert grad_fn_name(y1.grad_fn) == _NODE_NAMES[grad_node]
    (g,) = torch.autograd.grad(y1.sum(), w)
    assert_close(g, torch.ones(3, 12, dtype=torch.float64, device=device).T @ x.double())
    with torch.no_grad():
        assert tritongemm.linear(x, w).grad_fn is None
    assert len(launch.PLANS.entries) == 1


@pytest.mark.parametrize("amp_dtype", [torch.bfloat16, torch.float16], ids=str)
def test_autocast_calls_use_entries_of_the_cast_operands(amp_dtype, grad_node, device, monkeypatch):
    """Under autocast a repeated call is served from the entry of its operands as autocast casts them:
    the result in the autocast dtype, equal to the whole way's, and fp32 leaves get fp32 gradients."""
    if device.type == "cpu" and amp_dtype == torch.float16 and not _cpu_autocast_takes(amp_dtype):
        pytest.skip("this torch's CPU autocast does not take float16")
    w = random_tensor((8, 16), torch.float32, device).requires_grad_()
    b = random_tensor((8,), torch.float32, device).requires_grad_()
    tritongemm.linear(random_tensor((4, 16), torch.float32, device), w.detach())  # an fp32 entry
    counter = _WholeWayCounter(monkeypatch)
    for _ in range(3):
        x = random_tensor((4, 16), torch.float32, device).requires_grad_()
        with torch.autocast(device.type, dtype=amp_dtype):
            y = tritongemm.linear(x, w, b)
        assert y.dtype == amp_dtype and y.grad_fn is not None
        # the reference: float64 on the operands as autocast rounds them
        ref = _ref_linear(x.detach().to(amp_dtype), w.detach().to(amp_dtype), b.detach().to(amp_dtype))
        assert_close(y, ref, dtype=amp_dtype)
        gx, gw, gb = torch.autograd.grad(y.float().sum(), (x, w, b))
        assert (gx.dtype, gw.dtype, gb.dtype) == (torch.float32,) * 3
        ones = torch.ones(4, 8, dtype=torch.float64, device=device)
        tol = tolerance(amp_dtype, device)  # the gradient GEMMs ran in the autocast dtype
        assert_close(gw, ones.T @ x.detach().to(amp_dtype).double(), tol=tol, what="grad w")
        assert_close(gx, ones @ w.detach().to(amp_dtype).double(), tol=tol, what="grad x")
    assert counter.calls == 1, "the second and third autocast calls should have used the entry"
    # autocast off again: the fp32 entry, not the autocast one
    y32 = tritongemm.linear(x.detach(), w.detach())
    assert y32.dtype == torch.float32 and counter.calls == 1
    assert len(launch.PLANS.entries) == 2
    # A call that can have no entry (rows that do not fold) is served the whole way, cast there.
    xp = random_tensor((2, 16, 3), torch.float32, device).permute(0, 2, 1)  # (2, 3, 16), rows do not fold
    for _ in range(2):
        with torch.autocast(device.type, dtype=amp_dtype):
            y = tritongemm.linear(xp, w.detach())
        assert y.dtype == amp_dtype
        assert_close(y, _ref_linear(xp.to(amp_dtype), w.detach().to(amp_dtype)), dtype=amp_dtype)
    assert sum(e is None for e in launch.PLANS.entries.values()) == 1


def test_tf32_switch_keys_fp32_entries_but_not_autocast_ones(device, restore_tf32, monkeypatch):
    """Outside autocast an fp32 call's entry is keyed by torch's TF32 switch (the kernel's precision
    follows it); under autocast its fp32 operands are cast to bf16, so the switch is not read (that
    costs ~2 us a call) and flipping it keeps the one entry."""
    reads = []

    def counting_precision():  # the TF32 switch, read for float32 operands (the key's and the entry's)
        reads.append(torch.float32)
        return semantics.fp32_precision()

    monkeypatch.setattr(door, "fp32_precision", counting_precision)
    matmul = torch.backends.cuda.matmul
    w = random_tensor((8, 16), torch.float32, device)
    x = random_tensor((4, 16), torch.float32, device)
    for allow in (False, True):
        matmul.allow_tf32 = allow
        for _ in range(2):
            assert_close(tritongemm.linear(x, w), _ref_linear(x, w), tol=TF32_TOLERANCE)
    assert len(launch.PLANS.entries) == 2 and torch.float32 in reads  # one entry per setting
    launch.clear_plan_cache()
    reads.clear()
    for allow in (False, True):
        matmul.allow_tf32 = allow
        for _ in range(2):
            with torch.autocast(device.type, dtype=torch.bfloat16):
                y = tritongemm.linear(x, w)
            assert y.dtype == torch.bfloat16
            assert_close(y, _ref_linear(x.to(torch.bfloat16), w.to(torch.bfloat16)), dtype=torch.bfloat16)
    assert len(launch.PLANS.entries) == 1 and torch.float32 not in reads


def _cpu_autocast_takes(dtype) -> bool:
    try:
        with torch.autocast("cpu", dtype=dtype):
            return torch.mm(torch.ones(2, 2), torch.ones(2, 2)).dtype == dtype
    except (RuntimeError, ValueError):
        return False


def test_negated_views_are_never_served_from_an_entry(device):
    z = torch.complex(
        random_tensor((4, 8), torch.float32, device), random_tensor((4, 8), torch.float32, device)
    )
    neg = z.conj().imag  # a lazily negated view: its storage holds +imag
    assert neg.is_neg()
    w = random_tensor((6, 8), torch.float32, device)
    plain = neg.clone()
    for _ in range(2):
        assert_close(tritongemm.linear(plain, w), _ref_linear(plain, w))
        assert_close(tritongemm.linear(neg, w), _ref_linear(neg.resolve_neg(), w))


def test_unfoldable_input_and_broadcast_bias_take_the_whole_way(device):
    w = random_tensor((6, 8), torch.float32, device)
    x = random_tensor((3, 8, 4), torch.float32, device).permute(0, 2, 1)  # (3, 4, 8), rows do not fold
    b2 = random_tensor((4, 6), torch.float32, device)  # a bias of the result's shape: not (N,)
    for _ in range(2):
        assert_close(tritongemm.linear(x, w), _ref_linear(x, w))
        assert_close(tritongemm.linear(x, w, b2), _ref_linear(x, w, b2))
    assert all(entry is None for entry in launch.PLANS.entries.values())


def test_entries_go_with_the_plan_cache_and_belong_to_a_padding_policy(device):
    x = random_tensor((4, 8), torch.float32, device)
    w = random_tensor((6, 8), torch.float32, device)
    tritongemm.linear(x, w)
    assert launch.PLANS.entries
    launch.clear_plan_cache()
    assert not launch.PLANS.entries and not launch.PLANS.launchers
    tritongemm.linear(x, w)
    kept = dict(launch.PLANS.entries)
    assert kept
    with launch.padding("never" if launch.padding_policy() != "never" else "always"):
        assert not launch.PLANS.entries  # another policy's launchers: its own entries
        tritongemm.linear(x, w)
        assert launch.PLANS.entries
    assert launch.PLANS.entries == kept  # back again: nothing re-planned


def test_nn_linear_and_patch_use_entries(device):
    layer = tritongemm.nn.Linear(16, 12, device=device)
    torch_layer = torch.nn.Linear(16, 12, device=device)
    x = random_tensor((2, 5, 16), torch.float32, device)
    for _ in range(3):
        with torch.no_grad():
            assert_close(layer(x), _ref_linear(x, layer.weight, layer.bias))
    with torch.no_grad(), tritongemm.patch() as stats:
        outs = [(torch_layer(x), x[0] @ torch_layer.weight.mT) for _ in range(3)]
    for y, c in outs:  # references outside the patch: inside, they would be served (and counted) too
        assert_close(y, _ref_linear(x, torch_layer.weight, torch_layer.bias))
        assert_close(c, x[0].double() @ torch_layer.weight.double().mT)
    assert stats.served["linear"] == 3 and stats.served["matmul"] == 3
    assert stats.total_fallbacks == 0
    # Both layers' weights have one signature (entries hold layouts, not tensors): one linear entry.
    assert sum(isinstance(e, fastpath.Entry) for e in launch.PLANS.entries.values()) == 2


def test_patched_addmm_with_a_bias_uses_its_entry(device, monkeypatch):
    # transformers' Conv1D: torch.addmm(bias, x.view(-1, nx), weight), weight stored (in, out)
    weight = random_tensor((16, 12), torch.float32, device)
    bias = random_tensor((12,), torch.float32, device)
    xs = [random_tensor((10, 16), torch.float32, device) for _ in range(3)]
    counter = _WholeWayCounter(monkeypatch)
    with torch.no_grad(), tritongemm.patch() as stats:
        outs = [torch.addmm(bias, x, weight) for x in xs] + [bias.addmm(xs[0], weight)]
    for y, x in zip(outs, [*xs, xs[0]]):
        assert_close(y, torch.addmm(bias.double(), x.double(), weight.double()))
    assert stats.served["addmm"] == 4 and stats.total_fallbacks == 0
    assert counter.calls == 1


def test_threads_share_entries(device):
    w = random_tensor((12, 16), torch.float32, device)
    xs = [random_tensor((3, 16), torch.float32, device) for _ in range(4)]
    errors = []

    def work(x):
        try:
            for _ in range(3):
                assert_close(tritongemm.linear(x, w), _ref_linear(x, w))
        except Exception as exc:  # reported below: an exception in a thread does not fail the test
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(x,)) for x in xs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors


# ----------------------------------------------------------------------------------
# On the GPU: the direct launch
# ----------------------------------------------------------------------------------
def _direct_expected() -> bool:
    """Triton 3.4-3.6 have the launcher form ``DirectLaunch`` calls directly."""
    import triton

    major, minor = (int(p) for p in triton.__version__.split(".")[:2])
    return (major, minor) in ((3, 4), (3, 5), (3, 6))


@pytest.mark.gpu
@pytest.mark.parametrize("m,n,k", [(64, 64, 64), (1000, 1024, 512), (2048, 2048, 1024), (1, 4096, 4096)])
def test_direct_launch_matches_triton_runner(m, n, k, device):
    dtype = torch.bfloat16
    x = random_tensor((m, k), dtype, device)
    w = random_tensor((n, k), dtype, device)
    b = random_tensor((n,), dtype, device)
    y = tritongemm.linear(x, w, b)
    entry = launch.PLANS.entries[next(iter(launch.PLANS.entries))]
    launches = [v for v in vars(entry.launcher).values() if isinstance(v, launch.common.Launch)]
    assert launches
    if _direct_expected():
        assert all(lc.direct is not None for lc in launches), (
            "DirectLaunch did not recognise Triton's launcher"
        )
    for _ in range(3):
        x2 = random_tensor((m, k), dtype, device)
        fast = tritongemm.linear(x2, w, b)
        saved = [(lc, lc.direct) for lc in launches]
        for lc, _ in saved:
            lc.direct = None  # through Triton's runner
        try:
            slow = tritongemm.linear(x2, w, b)
        finally:
            for lc, direct in saved:
                lc.direct = direct
        assert torch.equal(fast, slow)
        assert_close(fast, _ref_linear(x2, w, b), dtype=dtype)
    assert y.shape == (m, n)


@pytest.mark.gpu
def test_direct_launch_under_cuda_graph_capture(device):
    dtype = torch.float16
    x = random_tensor((256, 512), dtype, device)
    w = random_tensor((768, 512), dtype, device)
    tritongemm.linear(x, w)
    tritongemm.linear(x, w)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        tritongemm.linear(x, w)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = tritongemm.linear(x, w)
    x.copy_(random_tensor((256, 512), dtype, device))
    graph.replay()
    torch.cuda.synchronize()
    assert_close(y, _ref_linear(x, w), dtype=dtype)


@pytest.mark.gpu
def test_launch_hooks_are_honoured(device):
    """With a Triton launch hook registered, launches go through Triton's runner (which calls it)."""
    import triton

    hooks = getattr(getattr(triton, "knobs", None), "runtime", None)
    if hooks is None or not hasattr(getattr(hooks, "launch_enter_hook", None), "add"):
        pytest.skip(f"triton {triton.__version__} has no launch hook chains")
    seen = []

    def hook(metadata):
        seen.append(1)

    x = random_tensor((64, 64), torch.float16, device)
    tritongemm.matmul(x, x)
    hooks.launch_enter_hook.add(hook)
    try:
        tritongemm.matmul(x, x)
    finally:
        hooks.launch_enter_hook.remove(hook)
    assert seen


# ----------------------------------------------------------------------------------
# The generated direct launch, against a stand-in for Triton 3.6's C launcher
# ----------------------------------------------------------------------------------
class _Template:
    """A stand-in for a ``TensorDescriptor`` template."""

    def __init__(self, name):
        self.name, self.base = name, None


class _FakeCompiled:
    """What ``DirectLaunch._generate`` reads from a ``CompiledKernel`` (3.6 form)."""

    def __init__(self, kernel, signature):
        from types import SimpleNamespace

        self.src = SimpleNamespace(signature=signature)
        self.function = 0xF00
        self.packed_metadata = (4, 1, 1024)
        self.run = SimpleNamespace(launch_cooperative_grid=False, launch_pdl=False)


def _signature_of(kernel, runtime, descriptors=()):
    """A plausible Triton signature: runtime pointers as pointers, descriptors as tensordescs, rest ints."""
    sig = {}
    for name in kernel.arg_names:
        if name in descriptors:
            sig[name] = "tensordesc<fp16[64, 64]>"
        elif name.endswith("_ptr"):
            sig[name] = "*fp16"
        elif name in runtime:
            sig[name] = "fp32"
        else:
            sig[name] = "i32"
    return sig


@pytest.mark.parametrize("with_descriptors", [False, True], ids=["pointers", "descriptors"])
def test_generated_direct_launch_places_every_argument(with_descriptors, monkeypatch):
    from types import SimpleNamespace

    from tritongemm.launch import common
    from tritongemm.launch import direct as direct_module
    from tritongemm.launch.pointer import RUNTIME as POINTER_RUNTIME
    from tritongemm.launch.tma import RUNTIME as TMA_RUNTIME

    runtime = TMA_RUNTIME if with_descriptors else POINTER_RUNTIME
    kernel = tritongemm.kernels.gemm_tma_kernel if with_descriptors else tritongemm.kernels.gemm_kernel
    fixed = {n: f"fixed:{n}" for n in kernel.arg_names if n not in runtime}
    args = common.KernelArgs(kernel, runtime, **fixed)
    templates = {}
    if with_descriptors:
        templates = {n: _Template(n) for n in ("a_desc", "b_desc", "c_desc")}
    launch_ = common.Launch(args, (7, 2), 4, 3, descriptors=templates or None)
    calls, encoded = [], []

    def raw(*call_args):
        calls.append(call_args)

    def expand(desc, meta):
        encoded.append((desc.name, desc.base.data_ptr()))
        return [f"map:{desc.name}@{desc.base.data_ptr()}", 64, 64]

    hooks = SimpleNamespace(launch_enter_hook=None, launch_exit_hook=None)
    monkeypatch.setattr(direct_module, "_RAW_STREAM", lambda index: 1000 + index)
    compiled = _FakeCompiled(kernel, _signature_of(kernel, runtime, templates))
    metas = [f"meta{i}" for i in range(len(templates))]
    direct = direct_module.DirectLaunch._generate(raw, compiled, launch_, 3, metas, expand, hooks)

    a, b, out, bias = (torch.empty(8) for _ in range(4))
    values = dict(zip(runtime, (a, b, out, bias, out, out, out, out, 0.5, 2.0)))
    for _ in range(2):  # the second launch reuses the descriptor encodings
        direct(*values.values())
    assert len(calls) == 2 and calls[0] == calls[1]
    head, rest = calls[0][:13], list(calls[0][13:])
    assert head == (7, 2, 1, 1003, 0xF00, False, False, None, None, (4, 1, 1024), None, None, None)
    expected = []
    for name in kernel.arg_names:
        if name in templates:
            expected += [f"map:{name}@{values[name].data_ptr()}", 64, 64]
        elif name in values and name.endswith("_ptr"):
            expected.append(values[name].data_ptr())
        elif name in values:
            expected.append(values[name])
        else:
            expected.append(fixed[name])
    assert rest == expected
    assert len(encoded) == len(templates), "encodings are cached per address"

    # A registered launch hook sends the launch through Triton's own path instead.
    hooks.launch_enter_hook = lambda metadata: None
    slow = []
    monkeypatch.setattr(launch_, "slow", lambda *v: slow.append(v))
    direct2 = direct_module.DirectLaunch._generate(raw, compiled, launch_, 3, metas, expand, hooks)
    direct2(*values.values())
    assert len(slow) == 1 and len(calls) == 2


# ----------------------------------------------------------------------------------
# Backward of an entry (``EntryFunction`` / ``Entry.backward``)
# ----------------------------------------------------------------------------------
def _upstream(kind: str, shape, dtype, device) -> torch.Tensor:
    """An incoming gradient of ``shape`` in a layout autograd can hand over."""
    if kind == "contiguous":
        return random_tensor(shape, dtype, device)
    if kind == "transposed":  # column-major (2-D)
        return random_tensor(shape[::-1], dtype, device).mT
    if kind == "broadcast":  # what y.sum() sends back: one value, stride 0 everywhere
        return random_tensor((), dtype, device).expand(shape)
    raise AssertionError(kind)


def _grads_against_float64(fn, ref_fn, tensors, grad_out):
    ours = torch.autograd.grad(fn(*tensors), [t for t in tensors if t.requires_grad], grad_out)
    ref_in = [t.detach().double().requires_grad_(t.requires_grad) for t in tensors]
    refs = torch.autograd.grad(ref_fn(*ref_in), [t for t in ref_in if t.requires_grad], grad_out.double())
    scale_in = [t.detach().double().abs().requires_grad_(t.requires_grad) for t in tensors]
    scales = torch.autograd.grad(
        ref_fn(*scale_in), [t for t in scale_in if t.requires_grad], grad_out.double().abs()
    )
    for g, r, s, t in zip(ours, refs, scales, [t for t in tensors if t.requires_grad]):
        assert g.shape == t.shape
        assert_close(g, r, scale=s, dtype=t.dtype)
    return ours


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("upstream", ["contiguous", "transposed", "broadcast"])
@pytest.mark.parametrize("needs", ["all", "x", "w"])
def test_entry_backward_of_linear(grad_node, dtype, upstream, needs, device, monkeypatch):
    w = random_tensor((24, 20), dtype, device).requires_grad_(needs in ("all", "w"))
    b = random_tensor((24,), dtype, device).requires_grad_(needs == "all")
    counter = _WholeWayCounter(monkeypatch)
    for _ in range(3):
        x = random_tensor((9, 20), dtype, device).requires_grad_(needs in ("all", "x"))
        g = _upstream(upstream, (9, 24), dtype, device)
        _grads_against_float64(tritongemm.linear, F.linear, (x, w, b), g)
    assert counter.calls == 1
    (entry,) = launch.PLANS.entries.values()
    launches = list(entry.grad_launches.values())
    assert launches and all(isinstance(v, tuple) for v in launches), "backward should have used launchers"


@pytest.mark.parametrize("x_layout", ["row", "column", "batched"])
@pytest.mark.parametrize("w_layout", ["row", "column"])
def test_entry_backward_of_matmul_keeps_layouts(grad_node, x_layout, w_layout, device, monkeypatch):
    dtype = torch.float16
    wk = (
        random_tensor((20, 28), dtype, device)
        if w_layout == "row"
        else random_tensor((28, 20), dtype, device)
    )
    w = (wk if w_layout == "row" else wk.mT).detach().requires_grad_()
    counter = _WholeWayCounter(monkeypatch)
    for _ in range(2):
        if x_layout == "row":
            x = random_tensor((11, 20), dtype, device)
        elif x_layout == "column":
            x = random_tensor((20, 11), dtype, device).mT
        else:
            x = random_tensor((2, 5, 20), dtype, device)
        x = x.detach().requires_grad_()
        out_shape = (*x.shape[:-1], 28)
        g = random_tensor(out_shape, dtype, device)
        gx, gw = _grads_against_float64(tritongemm.matmul, torch.matmul, (x, w), g)
        assert gw.stride() == w.stride(), "the weight's gradient should land in the weight's layout"
        if x_layout == "column":
            assert gx.stride() == x.stride()
    assert counter.calls == 1


def test_entry_backward_accumulates_into_contiguous_weight_grad(grad_node, device):
    lin = torch.nn.Linear(16, 12, device=device)
    x = random_tensor((5, 16), torch.float32, device)
    ref = lin.weight.detach().double()
    for step in range(3):
        tritongemm.linear(x, lin.weight, lin.bias).sum().backward()
        expect = (step + 1) * torch.ones(5, 12, dtype=torch.float64, device=device).T @ x.double()
        assert_close(lin.weight.grad, expect)
        assert lin.weight.grad.is_contiguous()
        assert_close(lin.bias.grad, torch.full((12,), 5.0 * (step + 1), dtype=torch.float64, device=device))
    assert ref.shape == lin.weight.shape


def test_entry_backward_with_create_graph_takes_the_whole_way(grad_node, device):
    x = random_tensor((6, 10), torch.float64, device).requires_grad_()
    w = random_tensor((7, 10), torch.float64, device).requires_grad_()
    b = random_tensor((7,), torch.float64, device).requires_grad_()
    for _ in range(2):  # the second call runs from the entry
        y = tritongemm.linear(x, w, b)
        (gx,) = torch.autograd.grad((y * y).sum(), x, create_graph=True)
        (ggw,) = torch.autograd.grad(gx.sum(), w)
        xr, wr, br = (t.detach().requires_grad_() for t in (x, w, b))
        yr = F.linear(xr, wr, br)
        (gxr,) = torch.autograd.grad((yr * yr).sum(), xr, create_graph=True)
        (ggwr,) = torch.autograd.grad(gxr.sum(), wr)
        assert_close(gx, gxr)
        assert_close(ggw, ggwr)
    assert len(launch.PLANS.entries) == 1


def test_entry_backward_launches_are_planned_once(grad_node, device, monkeypatch):
    w = random_tensor((12, 16), torch.float32, device).requires_grad_()
    x = random_tensor((4, 16), torch.float32, device).requires_grad_()
    for _ in range(2):
        tritongemm.linear(x, w).backward(random_tensor((4, 12), torch.float32, device))
    planned = []
    real = launch.launcher_for
    monkeypatch.setattr(launch, "launcher_for", lambda *a, **k: planned.append(1) or real(*a, **k))
    for _ in range(2):
        tritongemm.linear(x, w).backward(random_tensor((4, 12), torch.float32, device))
    assert planned == [], "repeated backward calls should reuse the entry's gradient launchers"


def test_entry_function_apply_falls_back_to_the_python_wrapper(monkeypatch):
    raw = fastpath._raw_apply(fastpath.EntryFunction)
    assert raw != fastpath.EntryFunction.apply, "torch has the C method: the wrapper should be skipped"
    monkeypatch.delattr(torch._C, "_FunctionBase")
    assert fastpath._raw_apply(fastpath.EntryFunction) == fastpath.EntryFunction.apply


def test_a_recorded_activation_linear_takes_the_plain_entry_and_an_unknown_one_still_raises(
    device, monkeypatch
):
    w = random_tensor((40, 24), torch.float32, device).requires_grad_()
    x = random_tensor((2, 5, 24), torch.float32, device)
    tritongemm.linear(x, w)  # builds the plain linear's entry
    counter = _WholeWayCounter(monkeypatch)
    y = tritongemm.linear(x, w, activation="silu")
    assert counter.calls == 0 and type(y.grad_fn).__name__.startswith("Silu")
    assert_close(y, F.silu(_ref_linear(x, w)))
    with pytest.raises(ValueError, match="unknown activation 'tanh'"):
        tritongemm.linear(x, w, activation="tanh")
