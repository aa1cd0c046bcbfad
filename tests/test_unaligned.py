"""Unaligned leading dimensions (docs/unaligned.md): the plan's choice and every path it can take.

A leading dimension that is not a multiple of 16 bytes rules out TMA and
cp.async.  The planner then chooses, by a cost model, between (a) copying
the operands (and C) into aligned workspaces and running the fast kernel,
(b) the pointer kernel with the widest loads the strides allow and (c) the
plain pointer kernel.  The choice is checked on plain values (an H100's
budgets, from this CPU machine); each path runs on the interpreter (which
runs the TMA kernel too) against a float64 reference, with odd, prime and
unit M, N, K, every layout, out= into unaligned views, and gradients.
"""

import gc
import weakref

import pytest
import torch
from conftest import grid_cases

import tritongemm
from tritongemm import KNOWN_DEVICES, TileConfig, explain, launch
from tritongemm.launch.aligned import MatrixCopy, PadCopy, PaddedLauncher, SharedCopy, rows_fast
from tritongemm.launch.common import Launch
from tritongemm.launch.pointer import stride_hints
from tritongemm.planning.call import Epilogue, GemmCall, Request
from tritongemm.planning.eligibility import Operand, stride_hint, vector_bytes
from tritongemm.planning.plan import TMA_STORE_KERNELS, layout_letters, plan
from tritongemm.planning.problem import GemmProblem
from tritongemm.planning.unaligned import padding_estimate
from tritongemm.testing import assert_close, make_matrix, make_operands, nan_tensor, random_tensor

H100 = KNOWN_DEVICES["h100"]
TMA = TileConfig(16, 16, 16, 2, 4, 2, kernel="tma_persistent")
POINTER = TileConfig(16, 16, 16, 2, 4, 2)
DTYPES = [torch.float16, torch.bfloat16]
DTYPE_IDS = ["fp16", "bf16"]


@pytest.fixture
def padding():
    """``padding(policy)`` for the rest of the test; the policy (and the plan cache) restored after."""
    old = launch.padding_policy()
    yield launch.set_padding
    launch.set_padding(old)


def _needs_tma(device):
    if device.type == "cuda" and torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("TMA needs sm_90+")


# ----------------------------------------------------------------------------------
# The choice, on plain values
# ----------------------------------------------------------------------------------
def matrix(rows, cols, letter, elem=2) -> Operand:
    """A freshly allocated operand: row-major ("N") or the transpose of a row-major one ("T")."""
    return (
        Operand(rows, cols, cols, 1, elem, True)
        if letter == "N"
        else Operand(rows, cols, 1, rows, elem, True)
    )


def plan_of(m, n, k, layout="NN", dtype=torch.float16, batch=1, padding="auto", config=None, c=None):
    elem = torch.empty((), dtype=dtype).element_size()
    a, b = matrix(m, k, layout[0], elem), matrix(k, n, layout[1], elem)
    c = c or Operand.contiguous(m, n, elem)
    problem = GemmProblem(m, n, k, batch, str(dtype).removeprefix("torch."), layout_letters(a, b))
    return plan(problem, H100, Request(config), a, b, c, dtype, dtype, padding)


@pytest.mark.parametrize(
    "m, n, k, layout, padded",
    [
        (4097, 4097, 4097, "NN", ("A", "B", "C")),
        (3001, 5003, 1009, "NN", ("A", "B", "C")),
        (4096, 4096, 4097, "NT", ("A", "B")),  # odd K: both operands' rows, C is aligned
        (4097, 4096, 4096, "TN", ("A",)),
    ],
    ids=["4097^3", "3001x5003x1009", "NT-odd-K", "TN-odd-M"],
)
def test_large_unaligned_problems_are_padded_for_tma(m, n, k, layout, padded):
    p = plan_of(m, n, k, layout)
    assert p.kernel in TMA_STORE_KERNELS and p.fallback is None, p.describe()
    assert p.alignment.path == "pad" and p.alignment.padded == padded, p.describe()
    assert "copy " + ", ".join(padded) in p.describe()


@pytest.mark.parametrize(
    "m, n, k, layout",
    [
        (4096, 4096, 4096, "NN"),
        (1024, 4096, 4096, "NT"),
        (64, 4096, 4096, "NT"),
        (1, 4096, 4096, "NT"),
        (2048, 2048, 2048, "TT"),
    ],
)
def test_aligned_problems_plan_as_before(m, n, k, layout):
    p = plan_of(m, n, k, layout)
    assert p.alignment is None
    assert p == plan_of(m, n, k, layout, padding="never")


def test_small_problem_stays_on_the_plain_pointer_kernel():
    p = plan_of(37, 29, 13)
    assert p.kernel == "pointer" and p.alignment.path == "plain" and p.alignment.padded == ()
    assert "too small to repay a copy" in p.alignment.why


def test_strides_with_a_power_of_two_factor_take_the_hinted_pointer_kernel():
    p = plan_of(64, 66, 64)  # B's rows are 66 elements: 4-byte loads
    assert p.kernel == "pointer" and p.alignment.path == "hinted", p.describe()
    assert "B 4 B" in p.alignment.why


def test_memory_bound_problems_are_not_copied():
    skinny = plan_of(64, 4097, 4097, "NT")  # reading B once is the whole cost: a copy doubles it
    assert skinny.alignment.padded == () and "too small" in skinny.alignment.why
    gemv = plan_of(1, 4097, 4097, "NT")
    assert gemv.kernel == "gemv" and gemv.alignment is None


def test_wide_types_are_never_copied():
    p = plan_of(4097, 4097, 4097, dtype=torch.float32)
    assert p.alignment.padded == () and "float32" in p.alignment.why


def test_batched_problems_are_padded_for_the_pointer_kernel():
    p = plan_of(1024, 1025, 1024, batch=8)
    assert p.kernel == "pointer" and "batched" in p.fallback
    assert p.alignment.padded == ("B",)  # C is not: the pointer kernel stores any stride


@pytest.mark.parametrize("n", [1009, 1023])
def test_a_padded_run_goes_on_tma_where_the_device_has_it(n):
    """The heuristic's menu tile for ~1000^3 is a pointer tile; padded, it runs on TMA instead (the
    pointer kernel's K masks keep a K that is not a multiple of 8 element-wise: measured on the H100,
    1023^3 padded on pointer tiles 0.75-0.80x cuBLAS, on TMA tiles 1.40-1.54x)."""
    p = plan_of(n, n, n, dtype=torch.bfloat16)
    assert p.kernel in TMA_STORE_KERNELS and p.config.uses_tma, p.describe()
    assert p.alignment.padded == ("A", "B", "C")
    assert (p.config.block_m, p.config.block_n) == (64, 128)  # the menu's tile, moved over


def test_a_padded_run_stays_on_the_pointer_kernel_without_tma():
    elem = 2
    a = Operand(1023, 1023, 1023, 1, elem, True)
    c = Operand.contiguous(1023, 1023, elem)
    problem = GemmProblem(1023, 1023, 1023, 1, "bfloat16", "NN")
    p = plan(problem, KNOWN_DEVICES["a100"], Request(), a, a, c, torch.bfloat16, torch.bfloat16, "always")
    assert p.kernel == "pointer" and p.config.kernel == "pointer"
    assert p.alignment.padded == ("A", "B")


def test_only_an_unaligned_output_is_not_worth_a_copy():
    """Loads stay full-width when only C is unaligned: measured on the H100 (4096x4097x4096 NT) the
    unpadded pointer kernel ran 565-581 TFLOP/s against 555-560 with C padded for TMA by the one-launch
    copy kernel (benchmarks/results/h100/unaligned.csv), and 528 with torch copies."""
    p = plan_of(4096, 4097, 4096, "NT")
    assert p.alignment.padded == () and "too small to repay" in p.describe(), p.describe()
    c = Operand(4096, 4096, 1, 4096, 2, True)  # out= a column-major view
    assert plan_of(4096, 4096, 4096, c=c).alignment.padded == ()


def test_policies():
    assert plan_of(37, 29, 13, padding="always").alignment.padded == (
        "A",
        "B",
    )  # the heuristic's pointer tiles
    assert plan_of(37, 29, 13, padding="always", config=TMA).alignment.padded == ("A", "B", "C")
    never = plan_of(4097, 4097, 4097, padding="never")
    assert never.kernel == "stream_k" or never.kernel == "pointer"
    assert never.alignment.padded == () and "padding='never'" in never.alignment.why
    with pytest.raises(ValueError, match="padding policy"):
        launch.set_padding("sometimes")


def test_cost_model():
    big = GemmProblem(4097, 4097, 4097, 1, "float16", "NN")
    est = padding_estimate(big, 3 * 4097 * 4097, 3, 2, True)
    assert est.pays and est.saved_us > 10 * est.copy_us
    tiny = GemmProblem(37, 29, 13, 1, "float16", "NN")
    assert not padding_estimate(tiny, 37 * 13 + 13 * 29, 2, 2, True).pays
    # Wider loads on the user's strides leave less to gain from a copy.
    mid = GemmProblem(1024, 1026, 1024, 1, "float16", "NN")
    gains = [padding_estimate(mid, 1024 * 1026, 1, v, False).saved_us for v in (2, 4, 8, 16)]
    assert gains == sorted(gains, reverse=True) and gains[-1] == 0


def test_stride_helpers():
    assert [stride_hint(s) for s in (1, 2, 1000, 4097, 4098, 4104, 4096, 0)] == [1, 2, 8, 1, 2, 8, 16, 16]
    assert vector_bytes(Operand(8, 8, 4097, 1, 2, True)) == 2
    assert vector_bytes(Operand(8, 8, 1000, 1, 2, True)) == 16
    assert vector_bytes(Operand(8, 8, 1000, 1, 2, False)) == 2  # misaligned base
    assert vector_bytes(Operand(8, 8, 2, 2, 2, True)) == 2  # no unit stride
    assert vector_bytes(Operand(8, 8, 4097, 1, 4, True)) == 4
    assert Operand(5, 7, 7, 1, 2, True).aligned() == Operand(5, 7, 8, 1, 2, True)
    assert Operand(5, 7, 1, 5, 2, True).aligned() == Operand(5, 7, 1, 8, 2, True)
    assert Operand(5, 7, 14, 2, 2, False).aligned() == Operand(5, 7, 8, 1, 2, True)
    assert Operand(5, 7, 14, 2, 4, False).aligned() == Operand(5, 7, 8, 1, 4, True)


def test_explain_reports_the_choice(padding):
    a, b = make_operands(4097, 4097, 4097, "NN", torch.bfloat16, "meta")
    text = explain(a, b, device="h100").describe()
    assert "align  : copy A, B, C to aligned workspaces" in text and "us" in text
    padding("never")
    assert "padding='never'" in explain(a, b, device="h100").describe()


# ----------------------------------------------------------------------------------
# Each path, run
# ----------------------------------------------------------------------------------
SHAPES = [(37, 29, 13), (1, 23, 7), (19, 1, 11), (13, 7, 1)]
SHAPE_IDS = ["primes", "M=1", "N=1", "K=1"]


@pytest.mark.parametrize("m, n, k", SHAPES, ids=SHAPE_IDS)
@pytest.mark.parametrize("layout", ["NN", "NT", "TN", "TT"])
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_padded_tma_path(device, padding, dtype, layout, m, n, k):
    """Path (a): aligned copies of A, B (and C, stored by TMA), then the TMA kernel."""
    _needs_tma(device)
    padding("always")
    a, b = make_operands(m, n, k, layout, dtype, device)
    out = torch.empty(m, n, dtype=dtype, device=device)
    p = launch.plan_for(GemmCall(request=Request(TMA)), a, b, out)
    assert p.kernel == "tma_persistent" and p.alignment.path == "pad", p.describe()
    assert "C" in p.alignment.padded or n % 8 == 0
    assert_close(tritongemm.matmul(a, b, config=TMA), a.double() @ b.double())


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_padded_pointer_path_with_broadcast_batch(device, padding, dtype):
    """Path (a) for the pointer kernel (batched), a stride-0 batch dim copied once, not per batch."""
    padding("always")
    a = random_tensor((2, 3, 21, 11), dtype, device)
    b = random_tensor((2, 1, 11, 19), dtype, device).mT.contiguous().mT  # column-major, broadcast over dim 1
    seen = []
    real = PaddedLauncher.__call__

    def spy(self, *args):
        seen.append((self.plan.kernel, self.b_ws.buffer_shape))
        return real(self, *args)

    PaddedLauncher.__call__ = spy
    try:
        out = tritongemm.matmul(a, b, config=POINTER)
    finally:
        PaddedLauncher.__call__ = real
    # Column-major as B was, K = 11 rounded up to 16 (8 elements per 16 bytes), one copy for the broadcast dim.
    assert seen == [("pointer", (2, 1, 19, 16))], seen
    assert_close(out, a.double() @ b.double())


@pytest.mark.parametrize("k, n", [(18, 20), (13, 29), (12, 36)], ids=["hint-2-4", "odd", "hint-4"])
@pytest.mark.parametrize("layout", ["NN", "TT"])
def test_unpadded_pointer_paths(device, padding, layout, k, n):
    """Paths (b) and (c): the user's strides, with whatever alignment they allow told to the compiler."""
    padding("never")
    a, b = make_operands(17, n, k, layout, torch.float16, device)
    out = torch.empty(17, n, dtype=torch.float16, device=device)
    p = launch.plan_for(GemmCall(request=Request(TMA)), a, b, out)
    assert p.kernel == "pointer" and p.alignment.path in ("hinted", "plain"), p.describe()
    hints = stride_hints(a, b, out)
    assert all(
        s % hints[name] == 0
        for name, s in zip(
            ("HINT_AM", "HINT_AK", "HINT_BK", "HINT_BN", "HINT_CM", "HINT_CN"),
            (*a.stride(), *b.stride(), *out.stride()),
        )
    )
    assert (p.alignment.path == "hinted") == any(
        h > 1 for h in (hints["HINT_AM"], hints["HINT_AK"], hints["HINT_BK"], hints["HINT_BN"])
    )
    assert_close(tritongemm.matmul(a, b, config=TMA), a.double() @ b.double())


@pytest.mark.parametrize("policy", ["always", "never"])
@pytest.mark.parametrize("view", ["offset", "column-major"])
def test_out_into_an_unaligned_view(device, padding, policy, view):
    _needs_tma(device)
    padding(policy)
    a, b = make_operands(23, 13, 17, "NT", torch.bfloat16, device)
    if view == "offset":  # stride 17, base 2 bytes past an aligned one
        buf = random_tensor((23, 17), torch.bfloat16, device)
        out = buf[:, 1:14]
    else:
        buf = random_tensor((13, 23), torch.bfloat16, device)
        out = buf.mT
    before = buf.clone()
    tritongemm.matmul(a, b, config=TMA, out=out)
    assert_close(out, a.double() @ b.double())
    if view == "offset":  # the columns around the view are untouched
        assert torch.equal(buf[:, :1], before[:, :1]) and torch.equal(buf[:, 14:], before[:, 14:])
    p = explain(a, b, config=TMA)
    assert p.kernel == ("tma_persistent" if policy == "always" else "pointer")


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_gradients_through_padded_gemms(device, padding, monkeypatch, dtype):
    """Backward's GEMMs (transposed views of the same unaligned operands) take the same paths; the fused
    epilogue's pre-activation, stored with C's strides, moves to a workspace with C."""
    _needs_tma(device)
    padding("always")
    paths = []
    real_gemm = launch.gemm

    def spy(call, a, b, out, *rest):
        paths.append(launch.plan_for(call, a, b, out).alignment)
        return real_gemm(call, a, b, out, *rest)

    monkeypatch.setattr(launch, "gemm", spy)
    x = random_tensor((19, 13), dtype, device).requires_grad_()
    w = random_tensor((11, 13), dtype, device).requires_grad_()
    bias = random_tensor((11,), dtype, device).requires_grad_()
    res = random_tensor((19, 11), dtype, device)
    y = tritongemm.linear(x, w, bias, activation="gelu", residual=res, config=TMA)
    grad = random_tensor(y.shape, dtype, device)
    y.backward(grad)
    assert len(paths) == 3 and all(p is not None and p.path == "pad" for p in paths), paths
    assert "C" in paths[0].padded
    xd, wd, bd = (t.detach().double().requires_grad_() for t in (x, w, bias))
    ref = torch.nn.functional.gelu(xd @ wd.T + bd) + res.double()
    ref.backward(grad.double())
    assert_close(y, ref)
    for got, want in ((x.grad, xd.grad), (w.grad, wd.grad), (bias.grad, bd.grad)):
        assert_close(got, want)


def test_no_padded_copy_outlives_the_call(device, padding):
    """The cached launcher keeps no tensor: not the user's, not a workspace."""
    _needs_tma(device)
    padding("always")
    launch.clear_plan_cache()
    a, b = make_operands(21, 13, 11, "NN", torch.float16, device)
    snapshot = (a.data_ptr(), a.stride(), b.data_ptr(), b.stride(), a.clone(), b.clone())
    tritongemm.matmul(a, b, config=TMA)
    (launcher,) = launch.PLANS.launchers.values()
    assert isinstance(launcher, PaddedLauncher)
    assert not _tensors_in(launcher), _tensors_in(launcher)
    assert snapshot[:4] == (a.data_ptr(), a.stride(), b.data_ptr(), b.stride())
    assert torch.equal(snapshot[4], a) and torch.equal(snapshot[5], b)
    ref = weakref.ref(a)
    del a, snapshot
    gc.collect()
    assert ref() is None  # the cache does not keep the first call's operand alive either


def test_aligned_calls_get_the_kernel_launcher(device, padding):
    padding("auto")
    launch.clear_plan_cache()
    a, b = make_operands(32, 16, 24, "NT", torch.float16, device)
    tritongemm.matmul(a, b)
    assert not any(isinstance(x, PaddedLauncher) for x in launch.PLANS.launchers.values())


def _tensors_in(obj, depth=0, seen=None) -> list:
    """Tensors reachable through attributes, lists, tuples and dicts (a few levels deep)."""
    seen = set() if seen is None else seen
    if id(obj) in seen or depth > 5:
        return []
    seen.add(id(obj))
    if isinstance(obj, torch.Tensor):
        return [tuple(obj.shape)]
    if isinstance(obj, dict):
        items = list(obj.values())
    elif isinstance(obj, (list, tuple)):
        items = list(obj)
    elif (
        hasattr(obj, "__dict__")
        and not isinstance(obj, type)
        and type(obj).__module__.startswith("tritongemm")
    ):
        items = list(vars(obj).values())
    elif hasattr(obj, "__dict__") and type(obj).__name__ == "TensorDescriptor":
        items = list(vars(obj).values())
    else:
        return []
    return [t for item in items for t in _tensors_in(item, depth + 1, seen)]


# ----------------------------------------------------------------------------------
# The copy kernel (kernels/pad_copy.py) and the pointer-only padded launcher
# ----------------------------------------------------------------------------------
def _source(rows, cols, layout, dtype, device):
    """A (*batch, rows, cols) source: "N" row-major, "T" column-major, "S" no unit stride,
    "B" batched (3, ...), "P" a batch of column-major matrices, "X" broadcast over a batch of 4."""
    if layout in "NTS":
        return make_matrix(rows, cols, layout, dtype, device)
    if layout == "B":
        return make_matrix(rows, cols, "N", dtype, device, batch=(3,))
    if layout == "P":
        return make_matrix(rows, cols, "T", dtype, device, batch=(2,))
    return make_matrix(rows, cols, "N", dtype, device, batch=(1,)).expand(4, rows, cols)


def _padded_dest(src, row_major: bool):
    """A NaN-filled, 16-byte-aligned destination for ``src`` (each batch entry its own), the buffer
    behind it (with a guard row after it), and the view."""
    *batch, rows, cols = src.shape
    per = 16 // src.element_size()
    lead = -(-(cols if row_major else rows) // per) * per
    inner = (rows, lead) if row_major else (cols, lead)
    buf = nan_tensor((*batch, inner[0] + 1, lead), src.dtype, src.device)
    view = buf[..., : inner[0], : (cols if row_major else rows)]
    return buf, (view if row_major else view.mT)


def _check_copied(buf, dst, src):
    assert torch.equal(dst, src), "the copy differs from its source"
    written = torch.zeros(buf.shape, dtype=torch.bool)
    written.view(-1)[
        torch.as_strided(torch.arange(buf.numel()), dst.shape, dst.stride(), dst.storage_offset()).reshape(-1)
    ] = True
    assert buf[~written].isnan().all(), "the copy wrote outside the destination's logical elements"


PAD_SHAPES = [(1, 1), (1, 7), (13, 1), (37, 29), (8, 16), (20, 33)]


@pytest.mark.parametrize(
    "dtype, layout, rows, cols",
    grid_cases(
        {
            "dtype": [torch.float16, torch.bfloat16, torch.float32],
            "layout": ["N", "T", "S", "B", "P", "X"],
            "rows, cols": PAD_SHAPES,
        },
        # (indices) by default every shape in every layout, the dtypes rotating over both
        keep=lambda dtype, layout, shape: dtype == (shape + layout) % 3,
        ids={
            "dtype": {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32"}.get,
            "rows, cols": lambda s: f"{s[0]}x{s[1]}",
        },
    ),
)
def test_pad_copy_kernel(device, dtype, layout, rows, cols):
    """Bit-exact copies into poisoned aligned destinations; 16 x 16 tiles so the shapes span several,
    ragged at both edges."""
    src = _source(rows, cols, layout, dtype, device)
    for row_major in (True, False):
        buf, dst = _padded_dest(src, row_major)
        m = MatrixCopy.of(src, dst)
        assert m is not None and m.batch == (src.shape[0] if src.dim() == 3 else 1)
        PadCopy(m, block=(16, 16))(src, dst, src, dst)
        _check_copied(buf, dst, src)


def test_pad_copy_kernel_two_matrices_in_one_launch(device, monkeypatch):
    """Programs [0, tiles of matrix 0) copy matrix 0, the rest matrix 1: one launch for both."""
    a = _source(37, 13, "T", torch.float16, device)
    b = _source(13, 29, "X", torch.float16, device)
    buf_a, dst_a = _padded_dest(a, row_major=False)
    buf_b, dst_b = _padded_dest(b, row_major=True)
    first, second = MatrixCopy.of(a, dst_a), MatrixCopy.of(b, dst_b)
    copy = PadCopy(first, second, block=(16, 16))
    assert copy.launch.grid[0] == first.tiles((16, 16)) + second.tiles((16, 16)) == 3 * 1 + 4 * 1 * 2
    launches = []
    real = Launch.__call__
    monkeypatch.setattr(Launch, "__call__", lambda self, *v: (launches.append(self), real(self, *v)))
    copy(a, dst_a, b, dst_b)
    assert len(launches) == 1
    _check_copied(buf_a, dst_a, a)
    _check_copied(buf_b, dst_b, b)


def test_pad_copy_tile_axis_follows_the_unit_stride():
    x = torch.empty(8, 12)
    assert not rows_fast(x, x) and rows_fast(x.mT, x.mT)
    assert rows_fast(x.mT, torch.empty(12, 8))  # coalesced loads; the stores are strided
    assert rows_fast(x[::2, ::2], torch.empty(6, 4).mT)  # no unit stride: the destination's axis
    assert not rows_fast(torch.empty(1, 9), torch.empty(1, 9))
    assert rows_fast(torch.empty(9, 1), torch.empty(9, 1))  # a column: its rows are the contiguous axis


def test_pad_copy_describes_only_collapsible_batches():
    src = torch.empty(3, 2, 5, 7).transpose(0, 1)  # (2, 3) batch dims with strides (35, 70)
    assert MatrixCopy.of(src, torch.empty(2, 3, 5, 7)) is None
    m = MatrixCopy.of(torch.empty(2, 3, 5, 7), torch.empty(2, 3, 5, 8)[..., :7])
    assert (m.batch, m.src_strides, m.dst_strides) == (6, (35, 7, 1), (40, 8, 1))


def _copy_launches(monkeypatch) -> list:
    """The matrices each ``PadCopy`` launch copies, in order."""
    launches = []
    real = PadCopy.__call__

    def spy(self, *tensors):
        launches.append(2 if self.launch.args.template[self.launch.args.names.index("HAS_1")] else 1)
        return real(self, *tensors)

    monkeypatch.setattr(PadCopy, "__call__", spy)
    return launches


@pytest.mark.parametrize("m, n, k", [(37, 29, 13), (1, 23, 7), (19, 1, 11), (13, 7, 1)], ids=SHAPE_IDS)
@pytest.mark.parametrize("layout", ["NN", "NT", "TN", "TT"])
@pytest.mark.parametrize("config", [TMA, POINTER], ids=["tma", "pointer"])
def test_padded_launcher_takes_bases_and_copies_in_one_launch(
    device, padding, monkeypatch, config, layout, m, n, k
):
    """A and B go through one copy launch, C through one more; the launcher reads only pointers."""
    if config.uses_tma:
        _needs_tma(device)
    padding("always")
    launch.clear_plan_cache()
    a, b = make_operands(m, n, k, layout, torch.float16, device)
    launches = _copy_launches(monkeypatch)
    out = tritongemm.matmul(a, b, config=config)
    assert_close(out, a.double() @ b.double())
    (launcher,) = launch.PLANS.launchers.values()
    assert isinstance(launcher, PaddedLauncher) and launcher.takes_bases
    padded = launcher.plan.alignment.padded
    copied_in = sum(name in padded for name in "AB")
    assert launches == ([copied_in] if copied_in else []) + ([1] if "C" in padded else []), (padded, launches)
    assert len(launcher.pools) == 1  # one allocation per call


def test_padded_launcher_given_another_tensor_over_the_same_memory(device, padding):
    """The fast path's contract: built on ``w.mT`` (K, N), called with ``w`` (N, K) and a 3-D ``x``."""
    padding("always")
    x = random_tensor((2, 5, 13), torch.bfloat16, device)
    w = random_tensor((11, 13), torch.bfloat16, device)
    bias = random_tensor((11,), torch.bfloat16, device)
    a = x.view(-1, 13)
    call = GemmCall(Epilogue(beta=1.0, addend=True))
    out = torch.empty(10, 11, dtype=torch.bfloat16, device=device)
    launcher = launch.launcher_for(call, a, w.mT, out, bias.expand(10, 11))
    assert isinstance(launcher, PaddedLauncher) and launcher.takes_bases
    assert launcher.plan.alignment.padded[:2] == ("A", "B"), launcher.plan.describe()
    for _ in range(2):
        x.copy_(random_tensor(x.shape, x.dtype, device))
        got = torch.full((2, 5, 11), float("nan"), dtype=torch.bfloat16, device=device)
        launcher(x, w, got, bias, got, got, 1.0, 1.0)
        assert_close(got, x.double() @ w.double().mT + bias.double())


def test_fast_path_keeps_padded_calls(device, padding, monkeypatch):
    """A repeated padded ``linear`` takes its fast-path entry (the launcher reads only pointers)."""

    padding("always")
    launch.clear_plan_cache()
    w = random_tensor((11, 13), torch.float16, device)
    bias = random_tensor((11,), torch.float16, device)
    launches = _copy_launches(monkeypatch)
    for _ in range(3):
        x = random_tensor((7, 13), torch.float16, device)
        assert_close(tritongemm.linear(x, w, bias), x.double() @ w.double().T + bias.double())
    (entry,) = launch.PLANS.entries.values()
    assert entry is not None and isinstance(entry.launcher, PaddedLauncher)
    assert launches == [2, 2, 2]
    launch.clear_plan_cache()


def test_backward_copies_an_unaligned_gradient_once_for_both_gemms(device, padding, monkeypatch):
    """An odd output width (an LM head's vocabulary): both gradient GEMMs read dZ, whose rows are not
    16-byte aligned.  Repeated calls copy it once, aligned, for both, not once in each GEMM."""
    _needs_tma(device)
    padding("always")
    launch.clear_plan_cache()
    launch.clear_plan_cache()
    dtype = torch.float16
    x = random_tensor((2, 19, 16), dtype, device).requires_grad_()  # K = 16: x's and w's rows aligned
    w = random_tensor((11, 16), dtype, device).requires_grad_()
    grad = random_tensor((2, 19, 11), dtype, device)
    launches = _copy_launches(monkeypatch)
    tritongemm.linear(x, w).backward(grad)  # the whole way, which builds the entry
    assert launches == [1, 1], launches  # each gradient GEMM copies dZ for itself
    x.grad = w.grad = None
    launches.clear()
    shared = []
    real = SharedCopy.__call__
    monkeypatch.setattr(
        SharedCopy, "__call__", lambda self, t: shared.append(tuple(t.shape)) or real(self, t)
    )
    y = tritongemm.linear(x, w)
    y.backward(grad)
    assert shared == [(2, 19, 11)]
    assert launches == [1], launches  # dZ into the shared workspace; neither gradient GEMM copies more
    xd, wd = (t.detach().double().requires_grad_() for t in (x, w))
    ref = xd @ wd.T
    ref.backward(grad.double())
    assert_close(y, ref)
    assert_close(x.grad, xd.grad)
    assert_close(w.grad, wd.grad)
    # Only one gradient wanted: no shared copy (its one GEMM copies dZ, as any call does).
    shared.clear()
    for _ in range(2):  # (the second call takes the entry)
        tritongemm.linear(x.detach(), w).backward(grad)
    assert shared == []
    launch.clear_plan_cache()


def test_padded_batches_that_do_not_collapse_take_torch_copies(device, padding, monkeypatch):
    """Batch dims with no single stride (a permuted batch) are copied by torch, on views."""
    padding("always")
    launch.clear_plan_cache()
    a = random_tensor((3, 2, 21, 11), torch.float16, device).transpose(0, 1)
    b = random_tensor((2, 3, 11, 19), torch.float16, device)
    launches = _copy_launches(monkeypatch)
    out = tritongemm.matmul(a, b, config=POINTER)
    assert_close(out, a.double() @ b.double())
    (launcher,) = launch.PLANS.launchers.values()
    assert isinstance(launcher, PaddedLauncher) and not launcher.takes_bases
    assert launcher.copy_in.by_torch and launches == [1]  # A by torch; B by the kernel


def test_padded_broadcast_batch_copied_once(device, padding):
    """A broadcast batch dim of A (stride 0) is stored once; B's batch of 3 is one batch stride."""
    padding("always")
    launch.clear_plan_cache()
    a = random_tensor((1, 21, 11), torch.bfloat16, device).expand(3, 21, 11)
    b = random_tensor((3, 19, 11), torch.bfloat16, device).mT
    out = tritongemm.matmul(a, b, config=POINTER)
    assert_close(out, a.double() @ b.double())
    (launcher,) = launch.PLANS.launchers.values()
    assert launcher.takes_bases and launcher.a_ws.buffer_shape == (1, 21, 16)
    assert launcher.b_ws.buffer_shape == (3, 19, 16)  # column-major as B was


# ----------------------------------------------------------------------------------
# On the GPU: the cost model's own choice, and CUDA-graph capture
# ----------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["NN", "NT", "TN", "TT"])
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_gpu_unaligned_auto(device, dtype, layout):
    m, n, k = 3001, 5003, 1009  # a first odd shape: on an H100 the cost model copies A, B and C for TMA
    a, b = make_operands(m, n, k, layout, dtype, device)
    p = explain(a, b)
    if torch.cuda.get_device_capability() >= (9, 0):
        assert p.alignment.padded == ("A", "B", "C") and p.kernel in TMA_STORE_KERNELS, p.describe()
    assert_close(tritongemm.matmul(a, b), a.double() @ b.double())
    # Captured into a CUDA graph: the workspaces come from the graph's pool, replays recompute.
    out = tritongemm.matmul(a, b)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
        captured = tritongemm.matmul(a, b)
    torch.cuda.current_stream().wait_stream(stream)
    a.copy_(make_operands(m, n, k, layout, dtype, device)[0])
    graph.replay()
    torch.cuda.synchronize()
    assert_close(captured, a.double() @ b.double())
    assert not torch.equal(captured, out)


def test_linear_weight_stored_aligned_once(device):
    """docs/unaligned.md's recipe: a padded buffer behind nn.Linear's weight; W.T then needs no copy."""
    linear = torch.nn.Linear(13, 11).to(device=device, dtype=torch.float16)
    n, k = linear.weight.shape
    buf = torch.zeros(n, 16, dtype=linear.weight.dtype, device=device)
    buf[:, :k] = linear.weight.detach()
    linear.weight = torch.nn.Parameter(buf[:, :k])
    assert linear.weight.stride() == (16, 1)
    # At scale (what an H100 would run): K = 4095, the weight's rows padded to 4096: only x is copied.
    x = torch.empty(4096, 4095, dtype=torch.float16, device="meta")
    w = torch.empty_strided((4096, 4095), (4096, 1), dtype=torch.float16, device="meta")
    assert explain(x, w.mT, device="h100").alignment.padded == ("A",)
    assert explain(x, w.contiguous().mT, device="h100").alignment.padded == ("A", "B")
    x = random_tensor((19, k), torch.float16, device).requires_grad_()
    y = tritongemm.linear(x, linear.weight, linear.bias)
    y.sum().backward()
    assert_close(y, x.double() @ linear.weight.double().T + linear.bias.double())
    assert linear.weight.grad.shape == (n, k)
