"""patch(): which torch calls tritongemm serves, which fall back, and the counts.

Every spelling of the matmul family is served (and computed by tritongemm:
the ``plans`` spy sees the GEMM); calls it cannot run (integer dtypes, out=,
devices it does not drive) go to torch with the reason counted; the routing
ends with the ``with`` block.
"""

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
import torch.nn.functional as F

import tritongemm
from tritongemm.testing import assert_close, make_operands, random_tensor

DT = torch.float32


def _operands(device):
    a, b = make_operands(9, 11, 13, "NT", DT, device)
    ba, bb = make_operands(9, 11, 13, "TN", DT, device, batch=(2,))
    return dict(
        a=a,
        b=b,
        ba=ba,
        bb=bb,
        inp=random_tensor((9, 11), DT, device),
        binp=random_tensor((2, 9, 11), DT, device),
        w=random_tensor((11, 13), DT, device),
        bias=random_tensor((11,), DT, device),
    )


# id -> (the torch call, the op name patch() counts it under)
SERVED = {
    "torch.matmul": (lambda t: torch.matmul(t["a"], t["b"]), "matmul"),
    "Tensor.matmul": (lambda t: t["a"].matmul(t["b"]), "matmul"),
    "a @ b": (lambda t: t["a"] @ t["b"], "matmul"),
    "batched @": (lambda t: t["ba"] @ t["bb"], "matmul"),
    "torch.mm": (lambda t: torch.mm(t["a"], t["b"]), "mm"),
    "Tensor.mm": (lambda t: t["a"].mm(t["b"]), "mm"),
    "torch.bmm": (lambda t: torch.bmm(t["ba"], t["bb"]), "bmm"),
    "Tensor.bmm": (lambda t: t["ba"].bmm(t["bb"]), "bmm"),
    "torch.addmm": (lambda t: torch.addmm(t["inp"], t["a"], t["b"], beta=0.5, alpha=2), "addmm"),
    "Tensor.addmm": (lambda t: t["inp"].addmm(t["a"], t["b"], alpha=-1), "addmm"),
    "torch.baddbmm": (lambda t: torch.baddbmm(t["binp"], t["ba"], t["bb"], beta=2), "baddbmm"),
    "Tensor.baddbmm": (lambda t: t["binp"].baddbmm(t["ba"], t["bb"]), "baddbmm"),
    "F.linear": (lambda t: F.linear(t["a"], t["w"], t["bias"]), "linear"),
    "F.linear-kwbias": (lambda t: F.linear(t["a"], t["w"], bias=t["bias"]), "linear"),
    "F.linear-nobias": (lambda t: F.linear(t["a"], t["w"]), "linear"),
}


def _float64(tensors):
    return {k: v.double() for k, v in tensors.items()}


@pytest.mark.parametrize("call", list(SERVED))
def test_served_and_counted(call, device, plans):
    fn, op = SERVED[call]
    tensors = _operands(device)
    with tritongemm.patch() as stats:
        out = fn(tensors)
    assert stats.served == {op: 1}, stats.summary()
    assert stats.total_fallbacks == 0, stats.summary()
    assert len(plans) == 1, "the call did not reach tritongemm's kernel"
    assert_close(out, fn(_float64(tensors)))


def test_rmatmul_is_served(device, plans):
    """Tensor.__rmatmul__ (b.__rmatmul__(a) is a @ b) keeps the operand order."""
    t = _operands(device)
    with tritongemm.patch() as stats:
        out = t["b"].__rmatmul__(t["a"])
    assert stats.served == {"matmul": 1}
    assert len(plans) == 1
    assert_close(out, t["a"].double() @ t["b"].double())


def test_nn_linear_is_served_with_gradients(device, plans):
    """torch.nn.Linear calls F.linear: served, and backward runs on tritongemm too."""
    layer = torch.nn.Linear(13, 11, device=device)
    x = random_tensor((4, 13), DT, device).requires_grad_(True)
    grad_y = random_tensor((4, 11), DT, device)
    with tritongemm.patch() as stats:
        y = layer(x)
        grads = torch.autograd.grad(y, (x, layer.weight, layer.bias), grad_y)
    assert stats.served == {"linear": 1}
    assert len(plans) == 3  # forward, grad input, grad weight
    ref_params = [p.detach().double().requires_grad_(True) for p in (x, layer.weight, layer.bias)]
    ref = F.linear(*ref_params)
    assert_close(y, ref)
    for g, r in zip(grads, torch.autograd.grad(ref, ref_params, grad_y.double())):
        assert_close(g, r)


# id -> (the torch call, op name, the reason it falls back, in words it must contain)
FALLBACKS = {
    "int32-matmul": (lambda t, d: torch.matmul(t["ia"], t["ib"]), "matmul", "int32"),
    "int64-mm": (lambda t, d: torch.mm(t["ia"].long(), t["ib"].long()), "mm", "int64"),
    "int32-@": (lambda t, d: t["ia"] @ t["ib"], "matmul", "int32"),
    "out=-mm": (lambda t, d: torch.mm(t["a"], t["b"], out=torch.empty(9, 11, device=d)), "mm", "out="),
    "out=-matmul": (
        lambda t, d: torch.matmul(t["a"], t["b"], out=torch.empty(9, 11, device=d)),
        "matmul",
        "out=",
    ),
    "out=-addmm": (
        lambda t, d: torch.addmm(t["inp"], t["a"], t["b"], out=torch.empty(9, 11, device=d)),
        "addmm",
        "out=",
    ),
    "complex-mm": (lambda t, d: torch.mm(t["a"].cfloat(), t["b"].cfloat()), "mm", "complex"),
    "mixed-dtypes": (lambda t, d: torch.addmm(t["inp"].double(), t["a"], t["b"]), "addmm", "dtype"),
    "sparse-mm": (lambda t, d: torch.mm(t["a"].to_sparse(), t["b"]), "mm", "sparse"),
    "nested-linear": (
        lambda t, d: F.linear(torch.nested.nested_tensor([t["a"][:4], t["a"][4:]]), t["b"].mT),
        "linear",
        "nested",
    ),
}


@pytest.mark.parametrize("call", list(FALLBACKS))
def test_fallback_counted_with_reason(call, device, plans):
    fn, op, words = FALLBACKS[call]
    t = _operands(device)
    t["ia"] = torch.randint(-5, 5, (9, 13), dtype=torch.int32, device=device)
    t["ib"] = torch.randint(-5, 5, (13, 11), dtype=torch.int32, device=device)
    with tritongemm.patch() as stats:
        try:
            out = fn(t, device)
        except RuntimeError as e:  # torch itself refuses (mixed dtypes): only the count matters
            out = e
    assert stats.total_served == 0 and len(plans) == 0, stats.summary()
    assert stats.total_fallbacks == 1, stats.summary()
    ((fell_op, reason),) = stats.fallbacks
    assert fell_op == op
    assert words in reason, f"reason {reason!r} does not mention {words!r}"
    assert stats.fallback_reasons() == {reason: 1}
    assert reason in stats.summary()
    if isinstance(out, torch.Tensor) and not out.is_complex() and not out.is_floating_point():
        assert torch.equal(out.cpu(), (t["ia"].long().cpu() @ t["ib"].long().cpu()).to(out.dtype))
    if call.startswith(("sparse", "nested")):  # torch's own kernel ran: torch's result
        rows = out.unbind() if out.is_nested else [out]
        ref = t["a"].double() @ t["b"].double()
        assert_close(torch.cat(list(rows)), ref, dtype=torch.float32)


def test_fallback_on_a_device_tritongemm_does_not_drive():
    """Meta tensors (any machine): counted as a fallback, torch computes the shape."""
    a = torch.empty(5, 7, device="meta")
    b = torch.empty(7, 3, device="meta")
    with tritongemm.patch() as stats:
        out = a @ b
    assert out.shape == (5, 3) and out.device.type == "meta"
    ((op, reason),) = stats.fallbacks
    assert op == "matmul" and "meta" in reason


def test_fallback_for_the_other_device(device):
    """With the interpreter CUDA tensors fall back, on a GPU CPU tensors do."""
    other = "cpu" if device.type == "cuda" else "cuda"
    if other == "cuda" and not torch.cuda.is_available():
        pytest.skip("interpreter mode without a CUDA device: no CUDA tensor to fall back on")
    a, b = make_operands(5, 6, 7, "NN", DT, other)
    with tritongemm.patch() as stats:
        out = torch.mm(a, b)
    ((op, reason),) = stats.fallbacks
    assert op == "mm" and other.upper() in reason.upper()
    assert_close(out, a.double() @ b.double())


def test_counts_accumulate_and_routing_ends_on_exit(device, plans):
    t = _operands(device)
    # int32 falls back to torch; torch multiplies integers on the CPU only.
    ia = torch.ones(3, 4, dtype=torch.int32)
    with tritongemm.patch() as stats:
        for _ in range(3):
            torch.mm(t["a"], t["b"])
        t["a"] @ t["b"]
        F.linear(t["a"], t["w"])
        ia @ ia.t()
        torch.relu(t["a"])  # not in the family: neither served nor a fallback
    assert stats.served == {"mm": 3, "matmul": 1, "linear": 1}
    assert stats.total_served == 5 and stats.total_fallbacks == 1
    assert len(plans) == 5
    torch.mm(t["a"], t["b"])  # after the block: torch's own, not counted
    assert stats.total_served == 5 and len(plans) == 5
    summary = stats.summary()
    assert "5 calls served, 1 fell back" in summary and "int32" in summary


def test_nested_contexts_each_count_every_call_once(device, plans):
    """Every open context counts each call made inside it once, served or not; each call is routed once."""
    t = _operands(device)
    ia = torch.ones(3, 4, dtype=torch.int32)
    with tritongemm.patch() as outer:
        torch.mm(t["a"], t["b"])
        with tritongemm.patch() as inner:
            torch.mm(t["a"], t["b"])
            ia @ ia.t()
        F.linear(t["a"], t["w"])
    assert len(plans) == 3
    ((fell_op, reason),) = inner.fallbacks
    assert fell_op == "matmul" and "int32" in reason
    assert inner.served == {"mm": 1} and inner.fallbacks == {("matmul", reason): 1}
    assert outer.served == {"mm": 2, "linear": 1} and outer.fallbacks == {("matmul", reason): 1}
    torch.mm(t["a"], t["b"])
    assert len(plans) == 3 and outer.total_served == 3, "routing must end with the outer block"


def test_decorator_stats_hold_the_most_recent_use(device, plans):
    t = _operands(device)
    p = tritongemm.patch()

    @p
    def model(x, y, n):
        return [torch.mm(x, y) for _ in range(n)]

    out = model(t["a"], t["b"], 2)
    first = p.stats
    assert first.served == {"mm": 2}
    assert_close(out[0], t["a"].double() @ t["b"].double())
    model(t["a"], t["b"], 1)
    assert p.stats.served == {"mm": 1}, "a new use starts from zero"
    assert first.served == {"mm": 2}, "an earlier use's stats stay as they were"
    assert len(plans) == 3
    torch.mm(t["a"], t["b"])
    assert len(plans) == 3 and p.stats.total_served == 1


def test_recursive_decorator_stats_are_the_outermost_use(device, plans):
    t = _operands(device)
    p = tritongemm.patch()

    @p
    def recurse(depth):
        torch.mm(t["a"], t["b"])
        if depth:
            recurse(depth - 1)
            assert p.stats.served == {"mm": depth + 1}, "the current use again, once the inner one returned"

    recurse(2)
    assert p.stats.served == {"mm": 3}
    assert len(plans) == 3


def test_func_transforms_fall_back_to_torch(device, plans):
    """vmap / grad wrap tensors with no storage for a kernel: torch computes them, counted with the reason."""
    x = random_tensor((4, 9, 13), DT, device)
    w = random_tensor((13, 11), DT, device)
    with tritongemm.patch() as stats:
        out = torch.func.vmap(lambda a: torch.mm(a, w))(x)
        grad = torch.func.grad(lambda a: torch.tanh(a @ w).sum())(x[0])
    assert len(plans) == 0 and stats.total_served == 0
    ((_, reason), *_) = stats.fallbacks
    assert "functorch" in reason
    assert stats.fallbacks == {("mm", reason): 1, ("matmul", reason): 1}
    assert_close(out, x.double() @ w.double())
    xr = x[0].double().requires_grad_(True)
    torch.tanh(xr @ w.double()).sum().backward()
    assert_close(grad, xr.grad)


def _raised(fn):
    try:
        fn()
    except Exception as e:  # noqa: BLE001 - the test compares whatever torch raises
        return e
    raise AssertionError("torch did not raise")


# id -> a call torch itself refuses
TORCH_ERRORS = {
    "mm-inner-mismatch": lambda t: torch.mm(t["a"], t["a"]),
    "linear-mismatch": lambda t: F.linear(t["a"], t["w"].mT),
    "bmm-batch-mismatch": lambda t: torch.bmm(t["ba"], t["bb"][:1]),
    "vmap-mismatch": lambda t: torch.func.vmap(lambda a: torch.mm(a, t["a"]))(t["ba"]),
    "mixed-dtypes": lambda t: torch.mm(t["a"].double(), t["b"]),
    "mixed-dtypes-fp64-under-autocast": lambda t: _autocast(
        t["a"].device, lambda: torch.mm(t["a"].double(), t["b"])
    ),
}


def _autocast(device, fn):
    with torch.autocast(device.type, dtype=torch.bfloat16):
        return fn()


@pytest.mark.parametrize("call", list(TORCH_ERRORS))
def test_errors_torch_raises_are_still_raised(call, device):
    fn = TORCH_ERRORS[call]
    t = _operands(device)
    expected = _raised(lambda: fn(t))
    with tritongemm.patch():
        with pytest.raises(type(expected)):
            fn(t)


def test_negated_view_falls_back(device, plans):
    """z.conj().imag is a lazily negated view: its storage holds +imag, so a kernel reading it would be wrong."""
    t = _operands(device)
    z = torch.randn(9, 13, dtype=torch.complex64, device=device)
    a = z.conj().imag
    with tritongemm.patch() as stats:
        out = torch.mm(a, t["b"])
    assert len(plans) == 0
    ((op, reason),) = stats.fallbacks
    assert op == "mm" and "negated" in reason
    assert_close(out, -z.imag.double() @ t["b"].double())


# id -> (a call autocast makes uniform, op name): fp32 operands are cast to the autocast dtype
AUTOCAST = {
    "F.linear-bf16-input-fp32-weight": (lambda t: F.linear(t["a"].bfloat16(), t["w"], t["bias"]), "linear"),
    "matmul-fp32": (lambda t: torch.matmul(t["a"], t["b"]), "matmul"),
    "addmm-mixed": (lambda t: torch.addmm(t["inp"], t["a"].bfloat16(), t["b"]), "addmm"),
}


@pytest.mark.parametrize("call", list(AUTOCAST))
def test_autocast_calls_are_served_in_the_autocast_dtype(call, device, plans):
    fn, op = AUTOCAST[call]
    t = _operands(device)
    with torch.autocast(device.type, dtype=torch.bfloat16):
        expected = fn(t)
        with tritongemm.patch() as stats:
            out = fn(t)
    assert stats.served == {op: 1} and stats.total_fallbacks == 0, stats.summary()
    assert len(plans) == 1
    assert out.dtype == expected.dtype == torch.bfloat16
    # The reference: the same call in float64 on the operands as autocast rounds them (to bf16).
    as_cast = {k: v.to(torch.bfloat16).double() for k, v in t.items()}
    with torch.autocast(device.type, enabled=False):
        ref = {
            "F.linear-bf16-input-fp32-weight": lambda c: F.linear(c["a"], c["w"], c["bias"]),
            "matmul-fp32": lambda c: torch.matmul(c["a"], c["b"]),
            "addmm-mixed": lambda c: torch.addmm(c["inp"], c["a"], c["b"]),
        }[call](as_cast)
    assert_close(out, ref, dtype=torch.bfloat16)


def test_threads_each_in_their_own_context(device):
    """Contexts are per thread: each counts exactly its own thread's calls, all computed right, at once."""
    n_threads = 4
    start = threading.Barrier(n_threads, timeout=60)
    shared = tritongemm.patch()  # entered by half the threads: its uses are per thread too

    def work(i):
        gen = torch.Generator().manual_seed(i)
        a, b, w, bias = (
            torch.randn(shape, generator=gen).to(device) for shape in ((16, 24), (24, 8), (8, 24), (8,))
        )
        layer = torch.nn.Linear(24, 8, device=device)
        start.wait()
        with shared if i % 2 else tritongemm.patch() as stats:
            outs = [torch.mm(a, b), a @ b, F.linear(a, w, bias), layer(a), torch.mm(a, b)]
        refs = [a.double() @ b.double()] * 2 + [
            F.linear(a.double(), w.double(), bias.double()),
            F.linear(a.double(), layer.weight.double(), layer.bias.double()),
            a.double() @ b.double(),
        ]
        return stats, outs, refs

    with ThreadPoolExecutor(n_threads) as pool:
        results = list(pool.map(work, range(n_threads)))
    for i, (stats, outs, refs) in enumerate(results):
        assert stats.served == {"mm": 2, "matmul": 1, "linear": 2}, f"thread {i}: {stats.summary()}"
        assert stats.total_fallbacks == 0, f"thread {i}: {stats.summary()}"
        for j, (out, ref) in enumerate(zip(outs, refs)):
            assert_close(out, ref, what=f"thread {i}, call {j}")


def test_patched_gradients_match_torch(device):
    """Gradients through patched calls (served by tritongemm's autograd op) match torch in float64."""
    t = _operands(device)
    a, b, inp = (t[k].detach().requires_grad_(True) for k in ("ba", "bb", "binp"))
    c = random_tensor((11, 5), DT, device)
    with tritongemm.patch() as stats:
        y = torch.baddbmm(inp, a, b, alpha=0.5) @ c
        grads = torch.autograd.grad(y.sum(), (a, b, inp))
    assert stats.served == {"baddbmm": 1, "matmul": 1}
    ra, rb, ri = (x.detach().double().requires_grad_(True) for x in (a, b, inp))
    ry = torch.baddbmm(ri, ra, rb, alpha=0.5) @ c.double()
    assert_close(y, ry)
    for g, r in zip(grads, torch.autograd.grad(ry.sum(), (ra, rb, ri))):
        assert_close(g, r)


def test_opened_inside_a_compiled_function_it_routes_the_traced_calls(device):
    """``with patch():`` in a function ``torch.compile`` traces (``fullgraph=True``), and a function it
    decorates: the matmul family in Dynamo's graph is tritongemm's op (which AOTAutograd may then hand
    back to aten, by ``TRITONGEMM_COMPILED_GEMMS``); nothing is counted, since the graph runs many times
    for one trace; the routing ends with the block there too."""
    targets: list[str] = []

    def backend(gm, example_inputs):
        targets.extend(str(n.target) for n in gm.graph.nodes if n.op == "call_function")
        return gm.forward

    t = _operands(device)
    a, b, w, bias = t["a"], t["b"], t["w"], t["bias"]

    def inside(a, b):
        with tritongemm.patch() as stats:
            y = F.linear(a, w, bias) + a @ b
        return y.T @ a, stats

    decorated = tritongemm.patch()(lambda a, b: torch.mm(a, b))
    torch._dynamo.reset()
    (y, stats) = torch.compile(inside, backend=backend, fullgraph=True)(a, b)
    ours = [x for x in targets if x.startswith("tritongemm.")]
    assert len(ours) == 2, targets  # (a @ b and the linear; not y.T @ a, after the block)
    assert stats.total_served == 0 and stats.total_fallbacks == 0
    ref = F.linear(a.double(), w.double(), bias.double()) + a.double() @ b.double()
    assert_close(y, ref.T @ a.double())
    targets.clear()
    torch._dynamo.reset()
    assert_close(torch.compile(decorated, backend=backend, fullgraph=True)(a, b), a.double() @ b.double())
    assert len([x for x in targets if x.startswith("tritongemm.")]) == 1, targets


def _torch_namespaces():
    """What the block may change, by (namespace, name): torch's, ``Tensor``'s and ``F``'s attributes."""
    return {
        (space, name): value
        for space, ns in (("torch", torch), ("Tensor", torch.Tensor), ("F", F))
        for name, value in vars(ns).items()
    }


ROUTED = {("torch", n) for n in ("matmul", "mm", "bmm", "addmm", "baddbmm")} | {("F", "linear")}
ROUTED |= {("Tensor", n) for n in ("matmul", "__matmul__", "__rmatmul__", "mm", "bmm", "addmm", "baddbmm")}


def test_only_the_matmul_family_is_replaced_and_torch_comes_back(device):
    """No function mode sees the block's other calls (one cost 1-3 us of host time for every view,
    add and ``.shape`` of a model, not only its GEMMs); the matmul family's callables are replaced,
    and torch's own are back after the block, however it ends."""
    before = _torch_namespaces()
    with tritongemm.patch():
        inside = _torch_namespaces()
        assert torch._C._len_torch_function_stack() == 0
    assert {k for k in inside if inside[k] is not before.get(k)} == ROUTED
    with pytest.raises(ValueError, match="inside"):
        with tritongemm.patch(), tritongemm.patch():
            raise ValueError("raised inside the block")
    after = _torch_namespaces()
    assert after.keys() == before.keys() and all(after[k] is before[k] for k in before)


def test_a_fallback_through_torchs_own_python_is_counted_once(device, plans):
    """``Tensor.__rmatmul__`` is Python that calls ``torch.matmul``: its fallback reaches torch without
    being routed, or counted, a second time."""
    ca, cb = (random_tensor(shape, DT, device).to(torch.complex64) for shape in ((5, 7), (7, 3)))
    with tritongemm.patch() as stats:
        out = cb.__rmatmul__(ca)
    assert stats.total_served == 0 and len(plans) == 0
    assert sum(stats.fallbacks.values()) == 1 and all(op == "matmul" for op, _ in stats.fallbacks)
    torch.testing.assert_close(out, (ca.to(torch.complex128) @ cb.to(torch.complex128)).to(out.dtype))


def test_a_thread_without_a_patch_runs_torch_while_another_keeps_one_open(device, plans):
    """The callables are replaced process-wide, the routing is per thread: a thread without a
    ``patch()`` runs torch's, uncounted, and the last thread to close one puts torch's back."""
    t = _operands(device)
    opened, release = threading.Event(), threading.Event()

    def holder():
        with tritongemm.patch() as stats:
            opened.set()
            assert release.wait(60)
            out = torch.mm(t["a"], t["b"])  # (still routed here after the main thread's block closed)
        return stats, out

    with ThreadPoolExecutor(1) as pool:
        held = pool.submit(holder)
        assert opened.wait(60)
        assert torch.mm is not torch._C._VariableFunctions.mm  # (the other thread's block is open)
        mine = [torch.mm(t["a"], t["b"]), t["a"] @ t["b"], F.linear(t["a"], t["w"])]
        assert len(plans) == 0
        with tritongemm.patch() as own:
            t["a"] @ t["b"]
        assert own.served == {"matmul": 1} and len(plans) == 1
        release.set()
        stats, out = held.result()
    assert stats.served == {"mm": 1} and stats.total_fallbacks == 0 and len(plans) == 2
    assert torch.mm is torch._C._VariableFunctions.mm and "mm" not in vars(torch.Tensor)
    ref = t["a"].double() @ t["b"].double()
    for y, r in zip([*mine, out], [ref, ref, F.linear(t["a"].double(), t["w"].double()), ref]):
        assert_close(y, r)


def test_a_function_compiled_inside_the_block_routes_its_calls_until_it_closes(device):
    """``torch.compile`` traced inside an open ``patch()``: the graph holds tritongemm's op; after the
    block, Dynamo's guards see torch's functions back and the next call traces torch's ops."""
    targets: list[str] = []

    def backend(gm, example_inputs):
        targets.extend(str(n.target) for n in gm.graph.nodes if n.op == "call_function")
        return gm.forward

    t = _operands(device)
    fn = torch.compile(lambda a, b, w: torch.mm(a, b) + F.linear(a, w), backend=backend, fullgraph=True)
    torch._dynamo.reset()
    with tritongemm.patch() as stats:
        y = fn(t["a"], t["b"], t["w"])
    assert len([x for x in targets if x.startswith("tritongemm.")]) == 2, targets
    assert stats.total_served == 0 and stats.total_fallbacks == 0  # (a graph is traced once, run often)
    targets.clear()
    y2 = fn(t["a"], t["b"], t["w"])
    assert targets and not [x for x in targets if x.startswith("tritongemm.")], targets
    ref = t["a"].double() @ t["b"].double() + F.linear(t["a"].double(), t["w"].double())
    assert_close(y, ref)
    assert_close(y2, ref)


# A process whose first Dynamo trace happens inside a patch() block, then one after it.
_FIRST_TRACE_INSIDE = """
import torch, tritongemm
a = torch.randn(8, 8, device="cuda" if torch.cuda.is_available() else "cpu")
seen = []
def backend(gm, example_inputs):
    seen.append([str(n.target) for n in gm.graph.nodes if n.op == "call_function"])
    return gm.forward
with tritongemm.patch():
    torch.compile(lambda x: torch.mm(x, x) + 2, backend=backend, fullgraph=True)(a)
    def square(x):
        return torch.mm(x, x)
    inside = torch.jit.script(square)  # (TorchScript's builtins, learned here)
torch.compile(lambda x: torch.mm(x, x) + 1, backend=backend, fullgraph=True)(a)
def square_plus_one(x):
    return torch.mm(x, x) + 1
after = torch.jit.script(square_plus_one)
assert torch.equal(inside(a), torch.mm(a, a)) and "aten::mm" in str(after.graph), after.graph
print(repr(seen))
"""


@pytest.mark.heavy
def test_a_first_trace_inside_the_block_leaves_torchs_functions_known_to_dynamo(device, tmp_path):
    """Dynamo (and TorchScript) learn which callables are torch's by looking them up by name, once per
    process: done inside a block, Dynamo learned the wrappers (a traced ``torch.mm`` became an opaque
    call of one).  The tables are built before the first block replaces anything, and a function
    scripted inside a block calls torch's op."""
    import ast
    import subprocess
    import sys

    script = tmp_path / "first_trace_inside.py"  # (a file: TorchScript reads its functions' source)
    script.write_text(_FIRST_TRACE_INSIDE)
    run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    inside, after = ast.literal_eval(run.stdout.strip().splitlines()[-1])
    assert not [t for t in inside + after if t.startswith("<function ")], (inside, after)
    assert any(t.startswith("tritongemm.") for t in inside), inside
    assert any("built-in method mm" in t for t in after), after


def test_routed_callables_pickle_as_torchs_own(device):
    """A reference to ``torch.matmul`` (or ``F.linear``, ``Tensor.mm``) pickled inside a block loads as
    torch's own outside it, as one pickled outside does."""
    import pickle

    with tritongemm.patch():
        saved = pickle.dumps((torch.matmul, F.linear, torch.Tensor.mm, torch.Tensor.__rmatmul__))
    assert pickle.loads(saved) == (torch.matmul, F.linear, torch.Tensor.mm, torch.Tensor.__rmatmul__)
