"""The C++ autograd node of fast-path entries (``tritongemm.launch.native``, ``csrc/entry_node.cpp``).

Its gradients are checked against float64 in test_fastpath (every backward
test there runs with it and with the Python ``Function``); here: what torch's
own nodes do and a Python node would too -- errors on a second backward and
on in-place changes, exceptions from backward, saved-tensor hooks,
double backward, forward-mode AD -- and how it is built: once, atomically,
by one of several processes, in the background, and not again after a
failure.
"""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from conftest import grad_fn_name, require_native

import tritongemm
from tritongemm import launch
from tritongemm.autograd import fastpath
from tritongemm.launch import native
from tritongemm.request import fastpath as door
from tritongemm.testing import assert_close, random_tensor, tolerance

NODE = "TritongemmEntryBackward"


@pytest.fixture(autouse=True)
def _node_built():
    require_native()
    launch.clear_plan_cache()
    yield
    launch.clear_plan_cache()


def _from_entry(fn, *args):
    """``fn(*args)`` run from its fast-path entry (the first call builds it)."""
    with torch.no_grad():
        fn(*args)
    out = fn(*args)
    assert out.grad_fn is not None and grad_fn_name(out.grad_fn) == NODE, out.grad_fn
    return out


def test_graph_edges_follow_what_requires_grad(device):
    x = random_tensor((5, 8), torch.float32, device)
    w = random_tensor((6, 8), torch.float32, device).requires_grad_()
    b = random_tensor((6,), torch.float32, device).requires_grad_()
    y = _from_entry(tritongemm.linear, x, w, b)
    edges = [None if fn is None else fn.name() for fn, _ in y.grad_fn.next_functions]
    assert edges == [None, "torch::autograd::AccumulateGrad", "torch::autograd::AccumulateGrad"]
    assert y.requires_grad and not y.is_leaf


def test_second_backward_without_retain_graph_raises_as_torch_does(device):
    x = random_tensor((5, 8), torch.float32, device).requires_grad_()
    w = random_tensor((6, 8), torch.float32, device).requires_grad_()
    y = _from_entry(tritongemm.linear, x, w)
    y.sum().backward(retain_graph=True)
    y.sum().backward()  # retained once: a second pass accumulates
    assert_close(w.grad, 2 * torch.ones(5, 6, dtype=torch.float64, device=device).T @ x.double())
    with pytest.raises(RuntimeError, match="backward through the graph a second time"):
        y.sum().backward()


def test_in_place_change_of_a_saved_operand_raises(device):
    x = random_tensor((5, 8), torch.float32, device).requires_grad_()
    w = random_tensor((6, 8), torch.float32, device).requires_grad_()
    y = _from_entry(tritongemm.linear, x, w)
    with torch.no_grad():
        w.mul_(2)  # saved for x's gradient
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.sum().backward()


def test_an_exception_in_backward_reaches_the_caller(device, monkeypatch):
    x = random_tensor((5, 8), torch.float32, device).requires_grad_()
    w = random_tensor((6, 8), torch.float32, device)
    y = _from_entry(tritongemm.linear, x, w)

    def failing(self, needs, g, x, w):
        raise ValueError("from Entry.backward")

    monkeypatch.setattr(fastpath.Entry, "backward", failing)
    with pytest.raises(ValueError, match="from Entry.backward"):
        y.sum().backward()


def test_gradients_only_for_the_inputs_asked_for(device, monkeypatch):
    x = random_tensor((5, 8), torch.float32, device).requires_grad_()
    w = random_tensor((6, 8), torch.float32, device).requires_grad_()
    b = random_tensor((6,), torch.float32, device).requires_grad_()
    y = _from_entry(tritongemm.linear, x, w, b)
    asked = []
    real = fastpath.Entry.backward
    monkeypatch.setattr(
        fastpath.Entry, "backward", lambda self, needs, *rest: asked.append(needs) or real(self, needs, *rest)
    )
    (gw,) = torch.autograd.grad(y.sum(), w)
    assert asked == [(False, True, False)]
    assert_close(gw, torch.ones(5, 6, dtype=torch.float64, device=device).T @ x.double())


def test_saved_tensor_hooks_see_what_the_node_saves(device):
    x = random_tensor((5, 8), torch.float32, device).requires_grad_()
    w = random_tensor((6, 8), torch.float32, device).requires_grad_()
    with torch.no_grad():
        tritongemm.linear(x, w)
    packed, unpacked = [], []

    def pack(t):
        packed.append(t.shape)
        return t.clone()

    def unpack(t):
        unpacked.append(t.shape)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
        y = tritongemm.linear(x, w)
    assert grad_fn_name(y.grad_fn) == NODE
    assert sorted(packed) == sorted([x.shape, w.shape])
    gx, gw = torch.autograd.grad(y.sum(), (x, w))
    assert sorted(unpacked) == sorted(packed)
    ones = torch.ones(5, 6, dtype=torch.float64, device=device)
    assert_close(gx, ones @ w.double())
    assert_close(gw, ones.T @ x.double())


# The full Jacobians cost two launches per input element (about 20 s on the interpreter): the
# default run checks a random projection of them (gradcheck's fast mode: a wrong entry still
# fails), `make test-slow` the whole Jacobians.
@pytest.mark.parametrize(
    "fast_mode", [True, pytest.param(False, marks=pytest.mark.slow)], ids=["projected", "full"]
)
def test_gradcheck_and_gradgradcheck_through_the_node(device, fast_mode):
    x = random_tensor((4, 6), torch.float64, device).requires_grad_()
    w = random_tensor((5, 6), torch.float64, device).requires_grad_()
    b = random_tensor((5,), torch.float64, device).requires_grad_()
    _from_entry(tritongemm.linear, x, w, b)
    assert torch.autograd.gradcheck(tritongemm.linear, (x, w, b), fast_mode=fast_mode)
    assert torch.autograd.gradgradcheck(tritongemm.linear, (x, w, b), fast_mode=fast_mode)


def test_forward_mode_ad_is_left_to_the_python_function(device):
    """The node has no forward derivative: with a dual operand the entry declines, and the
    Python ``Function`` (or the whole way) decides -- the same outcome as without the node."""
    import torch.autograd.forward_ad as fwAD

    x = random_tensor((5, 8), torch.float64, device)
    w = random_tensor((6, 8), torch.float64, device).requires_grad_()
    _from_entry(tritongemm.linear, x, w)
    outcomes = []
    for record in (native.RECORD, None):
        saved = native.RECORD
        native.RECORD = record
        try:
            with fwAD.dual_level():
                dual = fwAD.make_dual(x, torch.ones_like(x))
                out = tritongemm.linear(dual, w)
                outcomes.append(("ok", fwAD.unpack_dual(out).tangent))
        except RuntimeError as error:
            outcomes.append(("error", type(error).__name__))
        finally:
            native.RECORD = saved
    assert outcomes[0][0] == outcomes[1][0]
    if outcomes[0][0] == "ok":
        assert_close(outcomes[0][1], outcomes[1][1])


def test_matmul_and_3d_inputs_run_the_node(device):
    x = random_tensor((2, 3, 8), torch.float32, device).requires_grad_()
    w = random_tensor((8, 5), torch.float32, device).requires_grad_()
    y = _from_entry(tritongemm.matmul, x, w)
    g = random_tensor((2, 3, 5), torch.float32, device)
    gx, gw = torch.autograd.grad(y, (x, w), g)
    assert_close(gx, g.double() @ w.double().T)
    assert_close(gw, x.double().reshape(6, 8).T @ g.double().reshape(6, 5))
    yr = F.linear(x.double(), w.double().T)
    assert_close(y, yr)


# ----------------------------------------------------------------------------------
# Autocast casts
# ----------------------------------------------------------------------------------
AMP = torch.bfloat16  # an autocast dtype on both CUDA and CPU


def test_cast_casts_what_autocast_casts_and_passes_the_rest(device):
    dtype = AMP
    x = random_tensor((4, 8), torch.float32, device)
    w = random_tensor((6, 8), torch.float32, device).requires_grad_()
    b = random_tensor((6,), torch.float32, device).requires_grad_()
    with torch.autocast(device.type, dtype=dtype):
        cx, cw, cb = native.CAST(dtype, x, w, b)
        assert (cx.dtype, cw.dtype, cb.dtype) == (dtype,) * 3
        assert torch.equal(cx, x.to(dtype)) and torch.equal(cw, w.detach().to(dtype))
        assert torch.equal(cb, b.detach().to(dtype))
        assert cw.grad_fn is not None and cw.requires_grad  # differentiable, as torch's casts
        same = x.to(dtype)
        x64 = random_tensor((4, 8), torch.float64, device)
        out = native.CAST(dtype, same, x64, None)
        assert out[0] is same and out[1] is x64 and out[2] is None  # already the dtype; float64 untouched
    (gw,) = torch.autograd.grad((cw.float() * 2).sum(), w)
    assert gw.dtype == torch.float32 and torch.equal(gw, torch.full_like(w, 2.0))


def test_cast_refuses_bad_arguments():
    t = torch.ones(2, 2)
    for args in [
        (torch.bfloat16, t, t),
        ("bf16", t, t, None),
        (torch.bfloat16, t, 1.0, None),
        (torch.bfloat16, t, t, 2),
    ]:
        with pytest.raises(TypeError, match=r"cast\(dtype, x, w, bias\)"):
            native.CAST(*args)


@pytest.mark.parametrize("cache_enabled", [True, False])
def test_entries_share_torchs_autocast_weight_cache(device, cache_enabled):
    """Within one autocast region torch casts an fp32 leaf weight once and reuses the cast (unless
    ``cache_enabled=False``); an entry's calls do the same, so a weight read twice is cast once."""
    dtype = AMP
    w = random_tensor((6, 8), torch.float32, device).requires_grad_()
    x = random_tensor((4, 8), torch.float32, device)
    with torch.autocast(device.type, dtype=dtype):
        tritongemm.linear(x, w)  # the first call builds the entry (the whole way)
    with torch.autocast(device.type, dtype=dtype, cache_enabled=cache_enabled):
        y1, y2 = tritongemm.linear(x, w), tritongemm.linear(x, w)
        ref1, ref2 = native.CAST(dtype, x, w, None)[1], native.CAST(dtype, x, w, None)[1]
    assert grad_fn_name(y1.grad_fn) == NODE and grad_fn_name(y2.grad_fn) == NODE
    w_edge1, w_edge2 = y1.grad_fn.next_functions[1][0], y2.grad_fn.next_functions[1][0]
    assert w_edge1.name().startswith("ToCopyBackward")
    assert (w_edge1 is w_edge2) == cache_enabled
    assert (ref1 is ref2) == cache_enabled
    (gw,) = torch.autograd.grad((y1.float() + y2.float()).sum(), w)  # both uses reach w's gradient
    assert_close(
        gw,
        2 * torch.ones(4, 6, dtype=torch.float64, device=device).T @ x.to(dtype).double(),
        tol=tolerance(dtype, device),
    )


# ----------------------------------------------------------------------------------
# Keys
# ----------------------------------------------------------------------------------
def _key_cases(device):
    """(kind, x, w, bias, amp) calls that differ in one field each, and repeats that differ in none."""
    f32, f16 = torch.float32, torch.float16
    x = random_tensor((5, 24), f32, device)
    w = random_tensor((16, 24), f32, device)
    b = random_tensor((16,), f32, device)
    base = ("linear", x, w, b, None)
    flat = random_tensor((5 * 24 + 4,), f32, device)
    cases = [
        base,
        ("linear", random_tensor((5, 24), f32, device), w, b, None),  # other data, same fields
        ("matmul", x, w, b, None),
        ("linear", random_tensor((6, 24), f32, device), w, b, None),  # another M
        ("linear", random_tensor((24, 5), f32, device).mT, w, b, None),  # other strides
        ("linear", flat[1:-3].view(5, 24), w, b, None),  # 4-byte aligned, not 16
        ("linear", flat[4:].view(5, 24), w, b, None),  # 16-byte aligned again: base's key
        ("linear", x.view(1, 5, 24), w, b, None),  # another rank
        ("linear", x.half(), w.half(), b.half(), None),  # other dtypes
        ("linear", x, w.half(), b, None),  # one operand's dtype
        ("linear", x, w, None, None),  # no bias
        ("linear", x, w, random_tensor((32,), f32, device)[::2], None),  # a strided bias
        ("linear", x, w, torch._neg_view(b), None),  # a lazily negated bias
        ("linear", torch._neg_view(x), w, b, None),  # a lazily negated input
        ("linear", x, w, b, torch.bfloat16),  # under autocast
        ("linear", x, w, b, f16),
        ("linear", x.to(torch.float64), w.to(torch.float64), None, None),
        ("linear", x.mT.contiguous().mT, w, b, None),  # the strides of case 4: its key
    ]
    return cases


def test_packed_keys_tell_apart_exactly_what_python_keys_do(device, monkeypatch):
    cases = _key_cases(device)
    packed = [door.signature(*case) for case in cases]
    monkeypatch.setattr(native, "SIGNATURE", None)
    python = [door.signature(*case) for case in cases]
    assert all(type(k) is tuple and len(k) == 3 for k in packed)  # the C++ form ran
    assert all(len(k) > 3 for k in python)
    for i in range(len(cases)):
        for j in range(len(cases)):
            assert (packed[i] == packed[j]) == (python[i] == python[j]), (i, j)
            if packed[i] == packed[j]:
                assert hash(packed[i]) == hash(packed[j])
    assert packed[0] == packed[1] == packed[6] and packed[0] != packed[2]  # same fields; another kind
    assert packed[4] == packed[-1]
    assert len({*packed}) == len(cases) - 3  # every other case is a key of its own


def test_signature_refuses_bad_arguments():
    t = torch.ones(2, 2)
    for args in [("linear", t, t, None), ("linear", t, 1.0, None, None), ("linear", t, t, "b", None)]:
        with pytest.raises(TypeError, match=r"signature\(kind, x, w, bias, precision\)"):
            native.SIGNATURE(*args)


# ----------------------------------------------------------------------------------
# Building
# ----------------------------------------------------------------------------------
def test_build_dir_is_keyed_and_placed_by_the_environment(monkeypatch, tmp_path):
    monkeypatch.delenv("TRITONGEMM_NATIVE_DIR", raising=False)
    monkeypatch.setenv("TRITONGEMM_CACHE_DIR", str(tmp_path))
    folder = native.build_dir()
    assert folder.parent == tmp_path / "native" and len(folder.name) == 16
    monkeypatch.setenv("TRITONGEMM_NATIVE_DIR", str(tmp_path / "n"))
    assert native.build_dir() == tmp_path / "n" / folder.name
    monkeypatch.setattr(torch, "__version__", torch.__version__ + "+other")
    assert native.build_dir().name != folder.name, "a binary is per torch build"


def _fake_compiler(tmp_path: Path, body: str) -> Path:
    """A stand-in for c++ (``CXX``): runs ``body`` with $OUT set to the -o argument."""
    script = tmp_path / "fake-cxx"
    script.write_text(
        '#!/bin/sh\nwhile [ $# -gt 0 ]; do if [ "$1" = -o ]; then OUT="$2"; fi; shift; done\n' + body + "\n"
    )
    script.chmod(0o755)
    return script


def _run(code: str, env: dict) -> subprocess.CompletedProcess:
    full_env = {**os.environ, **env}
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        env=full_env,
        timeout=300,
    )


@pytest.mark.heavy
def test_two_processes_building_at_once_compile_once(tmp_path):
    """The lock serialises them: one compiles, the other loads its binary; no half file is ever loaded."""
    built = native._binary(native.build_dir())  # the session's binary (conftest built it)
    log = tmp_path / "compiles"
    cxx = _fake_compiler(tmp_path, f'echo x >> "{log}"; sleep 1; cp "{built}" "$OUT"')
    env = {"TRITONGEMM_NATIVE_DIR": str(tmp_path / "cache"), "CXX": str(cxx)}
    code = "from tritongemm.launch import native; print(native.build())"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code], env={**os.environ, **env}, stdout=subprocess.PIPE, text=True
        )
        for _ in range(2)
    ]
    paths = {p.communicate(timeout=300)[0].strip() for p in procs}
    assert all(p.returncode == 0 for p in procs)
    assert len(paths) == 1
    assert log.read_text().count("x") == 1, "the second process should have loaded the first one's build"
    leftovers = [p.name for p in Path(next(iter(paths))).parent.iterdir() if ".tmp-" in p.name]
    assert leftovers == []


@pytest.mark.heavy
def test_a_failed_build_warns_once_falls_back_and_is_not_retried(tmp_path, device):
    env = {
        "TRITONGEMM_NATIVE_DIR": str(tmp_path),
        "CXX": str(_fake_compiler(tmp_path, 'echo "no compiler here" >&2; exit 1')),
        "TRITON_INTERPRET": os.environ.get("TRITON_INTERPRET", "0"),
    }
    code = f"""
        import warnings, torch, tritongemm
        from tritongemm.launch import native
        warnings.simplefilter("always")
        x = torch.randn(4, 8, device="{device.type}"); w = torch.randn(6, 8, device="{device.type}", requires_grad=True)
        with warnings.catch_warnings(record=True) as caught:
            for _ in range(3):
                y = tritongemm.linear(x, w)
            native.wait(120)
        y.sum().backward()
        assert torch.allclose(w.grad, torch.ones(4, 6, device=x.device).T @ x, atol=1e-4)
        print(type(y.grad_fn).__name__, native.RECORD, sum("was not built" in str(c.message) for c in caught))
    """
    first = _run(code, env)
    assert first.returncode == 0, first.stderr
    assert first.stdout.split() == ["EntryFunctionBackward", "None", "1"]
    (folder,) = tmp_path.glob("*/failed")
    assert "no compiler here" in (folder.parent / "build.log").read_text()
    second = _run(code, env)
    assert second.returncode == 0, second.stderr
    assert second.stdout.split() == ["EntryFunctionBackward", "None", "0"], "a failed build is not retried"
    cli = subprocess.run(
        [sys.executable, "-m", "tritongemm", "native"],
        capture_output=True,
        text=True,
        env={**os.environ, **env},
    )
    assert cli.returncode == 1 and "an earlier build failed" in cli.stderr


@pytest.mark.heavy
def test_first_calls_use_the_function_until_the_background_build_loads(tmp_path, device):
    built = native._binary(native.build_dir())
    env = {
        "TRITONGEMM_NATIVE_DIR": str(tmp_path),
        "CXX": str(_fake_compiler(tmp_path, f'sleep 2; cp "{built}" "$OUT"')),
        "TRITON_INTERPRET": os.environ.get("TRITON_INTERPRET", "0"),
    }
    code = f"""
        import torch, tritongemm
        from tritongemm.launch import native
        x = torch.randn(4, 8, device="{device.type}"); w = torch.randn(6, 8, device="{device.type}", requires_grad=True)
        names = [type(tritongemm.linear(x, w).grad_fn).__name__ for _ in range(3)]
        assert native.wait(120)
        names += [type(tritongemm.linear(x, w).grad_fn).__name__, tritongemm.linear(x, w).grad_fn.name()]
        print(" ".join(names))
    """
    done = _run(code, env)
    assert done.returncode == 0, done.stderr
    first, second, third, rekeyed, after = done.stdout.split()
    assert first == "GemmFunctionBackward"  # the whole way
    assert second == third == "EntryFunctionBackward"  # the entry, while the compiler runs
    assert rekeyed == "GemmFunctionBackward"  # the loaded module's keys: the whole way once more
    assert after == NODE


@pytest.mark.heavy
def test_switched_off_it_is_never_built(tmp_path, device):
    log = tmp_path / "compiles"
    env = {
        "TRITONGEMM_NATIVE": "0",
        "TRITONGEMM_NATIVE_DIR": str(tmp_path / "cache"),
        "CXX": str(_fake_compiler(tmp_path, f'echo x >> "{log}"; exit 1')),
        "TRITON_INTERPRET": os.environ.get("TRITON_INTERPRET", "0"),
    }
    code = f"""
        import torch, tritongemm
        from tritongemm.launch import native
        x = torch.randn(4, 8, device="{device.type}"); w = torch.randn(6, 8, device="{device.type}", requires_grad=True)
        names = [type(tritongemm.linear(x, w).grad_fn).__name__ for _ in range(3)]
        print(names[-1], native.wait(5), native._thread)
    """
    done = _run(code, env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["EntryFunctionBackward", "False", "None"]
    assert not log.exists() and not (tmp_path / "cache").exists()
