"""The model and host suites on the CPU: Triton's interpreter, tiny models.

What runs here: a hand-written transformer block converted and patched gives
stock's outputs and gradients; the suite's gate passes the real variants and
rejects a deliberately wrong one (recorded, never timed); the GEMM capture
sees forward and backward with their layouts; the breakdown, the CSVs and the
figures from them; the host suite's measurement.  Real model families
(``transformers``) run at tiny sizes only where the library is installed;
``make test`` needs neither ``transformers`` nor ``timm``.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import importlib.util
import math
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pandas as pd
import pytest
import torch

import tritongemm
from benchmarks import gemm_breakdown, harness, host, models
from benchmarks.gemm_breakdown import GemmShape
from benchmarks.tiny_models import TinyBlock, TinyConfig

REPO = Path(__file__).resolve().parent.parent
ENV = {
    "gpu": "NVIDIA H100 80GB HBM3",
    "sm_count": 132,
    "torch": "2.11.0",
    "triton": "3.6.0",
    "git": "abc1234",
}
CFG = TinyConfig()
B, S = 2, 8


def _grads_of(module: torch.nn.Module, x: torch.Tensor, g: torch.Tensor, context=None):
    """Output and every parameter's gradient (and the input's) of ``(module(x) * g).sum()``."""
    x = x.detach().clone().requires_grad_(True)
    for p in module.parameters():
        p.grad = None
    with context if context is not None else torch.enable_grad():
        out = module(x)
        (out * g).sum().backward()
    grads = {n: p.grad.clone() for n, p in module.named_parameters()}
    grads["input"] = x.grad.clone()
    return out.detach(), grads


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_tiny_block_converted_and_patched_match_stock(dtype, device):
    torch.manual_seed(0)
    block = TinyBlock(CFG).to(device)
    ref_block = copy.deepcopy(block).double()
    stock = copy.deepcopy(block).to(dtype)
    x = torch.randn(B, S, CFG.hidden, device=device)
    g = torch.randn(B, S, CFG.hidden, device=device)
    ref_out, ref_grads = _grads_of(ref_block, x.double(), g.double())
    stock_out, stock_grads = _grads_of(stock, x.to(dtype), g.to(dtype))

    converted = tritongemm.nn.convert(models.shared_copy(stock))
    assert sum(type(m) is tritongemm.nn.Linear for m in converted.modules()) == 4  # qkv, out, up, down
    conv_out, conv_grads = _grads_of(converted, x.to(dtype), g.to(dtype))
    patcher = tritongemm.patch()
    patch_out, patch_grads = _grads_of(stock, x.to(dtype), g.to(dtype), patcher)
    # 4 linear layers and attention's two batched products, all served by tritongemm
    assert patcher.stats.total_served == 6 and patcher.stats.total_fallbacks == 0

    for out, grads in ((conv_out, conv_grads), (patch_out, patch_grads)):
        result = models.gate_tensor("out", ref_out, stock_out, out, dtype)
        assert result.ok, result.reason
        result = models.gate_grads(ref_grads, stock_grads, grads, dtype)
        assert result.ok, result.reason
        assert result.rel_err > 0  # a different GEMM rounds differently: the comparison is real


# ----------------------------------------------------------------------------------
# The gate as pure functions
# ----------------------------------------------------------------------------------
def test_gate_tensor_bound_is_relative_to_stock():
    torch.manual_seed(0)
    ref = torch.randn(64, 64)
    noise = torch.randn(64, 64)
    stock = ref + 0.05 * noise  # stock errs ~5%: a variant may err up to GATE_FACTOR x that
    assert models.error_bound(0.05, torch.bfloat16) == pytest.approx(models.GATE_FACTOR * 0.05)
    assert models.error_bound(1e-6, torch.bfloat16) == harness.gate_tolerance(torch.bfloat16)
    fine = ref + 0.1 * torch.randn(64, 64)
    assert models.gate_tensor("x", ref, stock, fine, torch.bfloat16).ok
    wrong = ref + 0.5 * torch.randn(64, 64)
    result = models.gate_tensor("x", ref, stock, wrong, torch.bfloat16)
    assert not result.ok and "exceeds" in result.reason and "stock errs" in result.reason
    nan = fine.clone()
    nan[3, 3] = float("nan")
    assert "NaN" in models.gate_tensor("x", ref, stock, nan, torch.bfloat16).reason
    assert "dtype" in models.gate_tensor("x", ref, stock, fine.double(), torch.bfloat16).reason
    assert "shape" in models.gate_tensor("x", ref, stock, fine[:3], torch.bfloat16).reason


def test_gate_grads_checks_every_parameter():
    ref = {"a": torch.ones(4, 4), "b": torch.ones(8), "unused": None}
    stock = {k: (None if v is None else v * 1.001) for k, v in ref.items()}
    assert models.gate_grads(ref, stock, dict(stock), torch.float32).ok
    bad = {**stock, "b": stock["b"] * 2}
    result = models.gate_grads(ref, stock, bad, torch.float32)
    assert not result.ok and "grad b" in result.reason
    missing = {**stock, "a": None}
    assert "missing" in models.gate_grads(ref, stock, missing, torch.float32).reason
    extra = {**stock, "unused": torch.ones(2)}
    assert not models.gate_grads(ref, stock, extra, torch.float32).ok


def test_gate_tokens_identical_or_parting_on_a_tie():
    stock = torch.tensor([[5, 7, 9, 2]])
    logits = torch.zeros(4, 1, 16)
    for step, tok in enumerate(stock[0]):
        logits[step, 0, tok] = 3.0
    logits[2, 0, 4] = 2.999  # step 2 is a near-tie between tokens 9 and 4
    assert models.gate_tokens(stock, logits, stock.clone(), margin=0.01).ok
    tie = torch.tensor([[5, 7, 4, 0]])
    result = models.gate_tokens(stock, logits, tie, margin=0.01)
    assert result.ok and "step 2" in result.reason
    early = torch.tensor([[5, 3, 9, 2]])  # parts at step 1, where stock's gap is 3.0
    result = models.gate_tokens(stock, logits, early, margin=0.01)
    assert not result.ok and "step 1" in result.reason
    assert not models.gate_tokens(stock, logits, tie, margin=1e-4).ok  # the gap 1e-3 is no tie at this margin
    assert "shape" in models.gate_tokens(stock, logits, stock[:, :2], margin=0.01).reason


def test_tie_margin_scales_with_stock_error():
    ref = torch.zeros(1, 10)
    stock = ref.clone()
    stock[0, 3] = 0.02
    assert models.tie_margin(ref, stock) == pytest.approx(models.GATE_FACTOR * 0.02)


# ----------------------------------------------------------------------------------
# The suite's runner on the tiny model
# ----------------------------------------------------------------------------------
#: The tests of ``tiny_run`` (a minute on the interpreter) go to one xdist worker, so it runs once
#: (``--dist loadgroup``, as ``make test`` runs; ignored without xdist).
TINY_RUN_GROUP = pytest.mark.xdist_group("tiny_run")


@pytest.fixture(scope="module")
def tiny_run():
    """infer, decode and train of TinyLM in fp32 with the sabotaged variant, breakdown included."""
    pairs = [p for p in models.select_cases(models=["tiny"]) if p[1] != "train_amp"]
    return models.run_models(
        pairs,
        "cpu" if not torch.cuda.is_available() else "cuda",
        torch.float32,
        sabotaged=True,
        breakdown=True,
        warmup_ms=0,
        rep_ms=0,
        # One round: each of a round's timed steps costs up to 2 s on the interpreter, and what these
        # tests check (gated, timed, the CSVs and figures) does not depend on how many rounds ran.
        rounds=1,
        timing="calls",  # (one step a call: the loop's several steps a round would double the time)
    )


@TINY_RUN_GROUP
def test_suite_gate_rejects_the_sabotaged_variant_and_times_the_rest(tiny_run):
    rows = {(r["workload"], r["impl"]): r for r in tiny_run.rows}
    assert set(rows) == {
        (w, v) for w in ("infer", "decode", "train") for v in ("stock", "convert", "patch", "sabotaged")
    }
    for workload in ("infer", "decode", "train"):
        bad = rows[(workload, "sabotaged")]
        assert bad["status"] == harness.FAILED_GATE and "exceeds" in bad["message"]
        assert "ms" not in bad  # never timed
        for variant in ("stock", "convert", "patch"):
            row = rows[(workload, variant)]
            assert row["status"] == harness.OK, row
            assert row["ms"] > 0 and row["ms_p20"] <= row["ms"] <= row["ms_p80"]
        for variant in ("convert", "patch"):
            row = rows[(workload, variant)]
            assert row["rel_err"] <= row["tol"]
            assert row["speedup_vs_baseline"] == pytest.approx(rows[(workload, "stock")]["ms"] / row["ms"])
    assert "converted 5 nn.Linear" in rows[("infer", "convert")]["note"]  # 4 in the block + the LM head
    assert "fell back 0" in rows[("infer", "patch")]["note"]


def test_capture_sees_forward_and_backward_with_layouts(device):
    torch.manual_seed(0)
    block = TinyBlock(CFG).to(device)
    params = list(block.named_parameters())
    x = torch.randn(B, S, CFG.hidden, device=device)
    g = torch.randn(B, S, CFG.hidden, device=device)  # (not .sum(): its gradient is a stride-0 expand)

    def step():
        for _, p in params:
            p.grad = None
        (block(x) * g).sum().backward()

    counts, ops = gemm_breakdown.capture_gemms(step)
    tokens, h, d = B * S, CFG.hidden, CFG.hidden // CFG.heads
    expected = Counter()
    for n, k in ((3 * h, h), (h, h), (CFG.mlp, h), (h, CFG.mlp)):  # qkv, out, up, down: y = x @ W.T
        expected[GemmShape(1, tokens, n, k, "NT", "fp32")] += 1  # forward
        expected[GemmShape(1, tokens, k, n, "NN", "fp32")] += 1  # grad of x: dy @ W
        expected[GemmShape(1, n, k, tokens, "TN", "fp32")] += 1  # grad of W: dy.T @ x
    linear = Counter({s: c for s, c in counts.items() if s.batch == 1})
    assert linear == expected
    batched = {s: c for s, c in counts.items() if s.batch == B * CFG.heads}
    assert sum(batched.values()) == 6  # q @ k.T and p @ v forward, two gradients each backward
    assert GemmShape(B * CFG.heads, S, S, d, "NT", "fp32") in batched  # q @ k.T
    assert ops[GemmShape(1, tokens, 3 * h, h, "NT", "fp32")] == {"addmm"}  # linear with a bias
    assert ops[GemmShape(1, tokens, h, h, "NT", "fp32")] == {"mm"}  # the bias-free output projection


@TINY_RUN_GROUP
def test_breakdown_of_the_tiny_run(tiny_run, tmp_path):
    rows = tiny_run.gemm_rows
    assert {r["workload"] for r in rows} == {"infer", "decode", "train"}
    for workload in ("infer", "train"):
        tg = [r for r in rows if r["workload"] == workload and r["impl"] == "tritongemm"]
        assert math.isclose(sum(r["share"] for r in tg), 1.0)
        for r in tg:
            assert r["status"] == harness.OK, r
            assert r["kernel"] and r["config"] and r["speedup_vs_cublas"] > 0 and r["count"] >= 1
    decode = [r for r in rows if r["workload"] == "decode" and r["impl"] == "tritongemm"]
    # TinyLM decodes without a KV cache: each of the 3 steps reruns the whole sequence (4, 5, 6 tokens)
    assert {r["m"] for r in decode if r["batch"] == 1} == {4, 5, 6}
    table = gemm_breakdown.breakdown_table(rows)
    assert (
        "[tiny train]" in table
        and "tg ÷ cuBLAS" in table
        and f"{B * S}x{3 * CFG.hidden}x{CFG.hidden} NT" in table
    )


def _timed(shape: GemmShape, cublas_ms: float, tg_ms: float) -> dict:
    base = {**gemm_breakdown._shape_row(shape), "status": harness.OK}
    return {
        "cublas": {**base, "impl": "cublas", "ms": cublas_ms},
        "tritongemm": {**base, "impl": "tritongemm", "ms": tg_ms, "speedup_vs_cublas": cublas_ms / tg_ms},
    }


def test_breakdown_rows_share_and_weighted_ratio():
    big, small = GemmShape(1, 512, 512, 512, "NT", "bf16"), GemmShape(1, 16, 512, 512, "NN", "bf16")
    timed = {big: _timed(big, 3.0, 2.0), small: _timed(small, 1.0, 2.0)}
    rows = gemm_breakdown.breakdown_rows(
        "m", "train", Counter({big: 1, small: 3}), {big: {"mm"}, small: {"mm"}}, timed
    )
    shares = {r["shape"]: r["share"] for r in rows if r["impl"] == "tritongemm"}
    assert shares == {big.label: pytest.approx(0.5), small.label: pytest.approx(0.5)}  # 1 x 3 ms vs 3 x 1 ms
    assert rows[0]["count"] == 1 and rows[2]["count"] == 3
    # cuBLAS 1*3 + 3*1 = 6 ms against tritongemm 1*2 + 3*2 = 8 ms
    assert gemm_breakdown.weighted_ratio(rows) == pytest.approx(6 / 8)


def test_time_shapes_gates_and_explains(device):
    shapes = [GemmShape(1, 16, 32, 16, "NT", "fp32"), GemmShape(3, 8, 16, 16, "TN", "fp32")]
    timed = gemm_breakdown.time_shapes(shapes, device, warmup_ms=0, rep_ms=0, rounds=1)
    for shape in shapes:
        a, b = gemm_breakdown.make_operands(shape, device)
        assert a.shape[-2:] == (shape.m, shape.k) and b.shape[-2:] == (shape.k, shape.n)
        assert gemm_breakdown.operand_layout(a) + gemm_breakdown.operand_layout(b) == shape.layout
        tg = timed[shape]["tritongemm"]
        assert tg["status"] == harness.OK and tg["rel_err"] <= tg["tol"] and tg["kernel"]
        assert tg["speedup_vs_cublas"] == pytest.approx(timed[shape]["cublas"]["ms"] / tg["ms"])


@TINY_RUN_GROUP
def test_csvs_and_figures_from_them(tiny_run, tmp_path):
    paths = models.write(tiny_run, tmp_path, ENV, {"suite": "models"})
    assert [p.name for p in paths] == ["models.csv", "models_gemms.csv"]
    df = pd.read_csv(paths[0])
    assert (df["env_gpu"] == ENV["gpu"]).all() and list(df.columns[: len(harness.COLUMNS)]) == harness.COLUMNS
    assert set(df[df["impl"] == "sabotaged"]["status"]) == {harness.FAILED_GATE}
    assert df[df["impl"] == "sabotaged"]["ms"].isna().all()
    gemms = pd.read_csv(paths[1])
    assert {"share", "count", "kernel", "speedup_vs_cublas", "workload"} <= set(gemms.columns)
    figures = models.plot_models(paths, tmp_path / "fig")
    assert sorted(f.name for f in figures) == ["models_gemms.png", "models_speedup.png"]
    assert all(f.stat().st_size > 10_000 for f in figures)
    text = models.summary_table(tiny_run.rows)
    assert "failed_gate" in text and "baseline ÷ variant" in text


def _autocast_supported(device) -> bool:
    """Does tritongemm follow torch.autocast yet (bf16 output from fp32 operands)?"""
    x, w = torch.randn(4, 8, device=device), torch.randn(16, 8, device=device)
    with torch.autocast(device.type, dtype=torch.bfloat16):
        return tritongemm.linear(x, w).dtype == torch.bfloat16


@pytest.mark.slow  # (the fp32 gate runs in the default tier's tiny run)
def test_mixed_precision_training_gate(device):
    pairs = [(models.MODELS["tiny"], "train_amp")]
    rows = models.run_models(
        pairs, device, torch.bfloat16, breakdown=False, warmup_ms=0, rep_ms=0, rounds=1
    ).rows
    by = {r["impl"]: r for r in rows}
    assert by["stock"]["status"] == harness.OK
    if _autocast_supported(device):
        assert by["convert"]["status"] == harness.OK, by["convert"]["message"]
        assert by["patch"]["status"] == harness.OK, by["patch"]["message"]
    else:  # the gate must tell: stock's autocast logits are bf16, tritongemm's fp32
        for v in ("convert", "patch"):
            assert by[v]["status"] == harness.FAILED_GATE and "dtype" in by[v]["message"]


def test_each_round_times_several_steps_of_a_slow_step():
    """A launch-bound step (tens of ms) gets MIN_STEPS_PER_ROUND steps a round, not the 1 that the
    suite's share of ``rep_ms`` would buy; a fast step keeps the share; round 0 has no estimate yet."""
    share = 100 / 7
    assert models.round_rep_ms([], 100, 7) == pytest.approx(share)
    assert models.round_rep_ms([0.05, 0.06, 0.04], 100, 7) == pytest.approx(share)
    slow = models.round_rep_ms([20.0, 30.0, 25.0], 100, 7)
    assert slow // 25.0 >= models.MIN_STEPS_PER_ROUND  # do_bench repeats int(rep / estimate) times
    assert slow < 25.0 * (models.MIN_STEPS_PER_ROUND + 1)


def test_loop_round_times_back_to_back_steps():
    """``timing="loop"``: untimed warm-up steps, then at least MIN_STEPS_PER_ROUND steps (more where the
    round's share buys more, sized by the steps' median so far) timed together; one sample per round."""
    calls = []

    def step():
        calls.append(time.perf_counter())
        time.sleep(0.002)

    prepared = harness.Prepared({"impl": "x"}, step, None, contextlib.nullcontext)
    device = torch.device("cpu")
    assert models.time_loop_round(prepared, device, 2, 0.0) is None
    assert len(calls) == 2 + models.MIN_STEPS_PER_ROUND and len(prepared.samples) == 1
    assert 2.0 <= prepared.samples[0] < 20.0  # ms per step, not per round
    calls.clear()
    assert models.time_loop_round(prepared, device, 1, 40 * prepared.samples[0]) is None
    assert 1 + 30 <= len(calls) <= 1 + 41 and len(prepared.samples) == 2

    def broken():
        raise RuntimeError("boom")

    bad = harness.Prepared({"impl": "y"}, broken, None, contextlib.nullcontext)
    row = models.time_loop_round(bad, device, 1, 0.0)
    assert row["status"] == harness.ERROR and "boom" in row["message"] and not bad.samples
    # paired: each round's ratio of two variants timed back to back, not the ratio of the medians
    rows = [
        {"case": "c", "dtype": "bf16", "impl": "stock", "status": harness.OK, "ms": 10.0,
         "round_ms": [10.0, 20.0, 10.0]},
        {"case": "c", "dtype": "bf16", "impl": "convert", "baseline": "stock", "status": harness.OK,
         "ms": 11.0, "round_ms": [9.0, 19.0, 11.0]},
        {"case": "c", "dtype": "bf16", "impl": "patch", "baseline": "stock", "status": harness.OK, "ms": 12.5},
    ]  # fmt: skip
    models.finish_rows(rows)
    assert rows[1]["speedup_vs_baseline"] == pytest.approx(20 / 19)  # median of 10/9, 20/19, 10/11
    assert rows[1]["speedup_p20"] < rows[1]["speedup_vs_baseline"] < rows[1]["speedup_p80"]
    assert rows[2]["speedup_vs_baseline"] == pytest.approx(10 / 12.5) and "speedup_p20" not in rows[2]
    assert models._spread_text(rows[1]).count("-") == 1 and models._spread_text(rows[2]) == ""
    with pytest.raises(ValueError, match="timing"):
        models.run_workload(None, "infer", None, None, None, torch.float32, device, timing="bogus")


@pytest.mark.parametrize("enabled", [True, False])
def test_collector_paused_while_timing_and_restored(enabled):
    import gc

    was = gc.isenabled()
    (gc.enable if enabled else gc.disable)()
    try:
        with models._collector_paused():
            assert not gc.isenabled()
        assert gc.isenabled() is enabled
        with pytest.raises(RuntimeError), models._collector_paused():
            raise RuntimeError("a failed round")
        assert gc.isenabled() is enabled
    finally:
        (gc.enable if was else gc.disable)()


def test_case_selection():
    default = models.select_cases()
    names = {s.name for s, _ in default}
    assert names == {"llama-s", "gpt2", "bert-base", "llama-l"}
    assert ("bert-base", "decode") not in {(s.name, w) for s, w in default}  # an encoder has no decode
    assert {w for s, w in models.select_cases("vit")} == {"infer", "train", "train_amp"}
    assert [(s.name, w) for s, w in models.select_cases("llama-l train")] == [
        ("llama-l", "train"),
        ("llama-l", "train_amp"),
    ]
    assert all(w in models.WORKLOADS for _, w in default)


@pytest.mark.heavy
def test_models_module_imports_without_the_model_libraries():
    code = (
        "import sys, benchmarks.models, benchmarks.host; "
        "sys.exit(3 if 'transformers' in sys.modules or 'timm' in sys.modules else 0)"
    )
    env = {"TRITON_INTERPRET": "1", "PATH": "", "PYTHONPATH": os.environ.get("PYTHONPATH", "")}
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True)
    assert done.returncode != 3, "importing benchmarks.models imported transformers or timm"
    assert done.returncode == 0, done.stderr[-3000:]


def test_cli_lists_and_refuses_without_gpu(capsys):
    from benchmarks.__main__ import main

    assert main(["list"]) == 0
    out = capsys.readouterr().out
    assert "llama-l train_amp" in out and "host" in out
    if not torch.cuda.is_available():
        assert main(["run", "--suite", "models"]) == 2
        assert "no CUDA GPU" in capsys.readouterr().err


# ----------------------------------------------------------------------------------
# Host overhead
# ----------------------------------------------------------------------------------
def test_host_measure_every_api(device, tmp_path):
    cases = host.cases(sizes=((16, 16, 16),))
    assert [c.api for c in cases] == list(host.APIS)
    rows = host.run_host(cases, torch.float32, device, calls=1, rounds=2)
    assert len(rows) == 2 * len(cases)
    for r in rows:
        assert r["status"] == harness.OK, r
        assert r["host_us"] > 0 and r["us_p20"] <= r["host_us"] <= r["us_p80"]
    tg = [r for r in rows if r["impl"] == "tritongemm"]
    torch_us = {r["case"]: r["host_us"] for r in rows if r["impl"] == "torch"}
    for r in tg:
        assert r["ratio_vs_torch"] == pytest.approx(r["host_us"] / torch_us[r["case"]])
        assert r["rel_err"] <= r["tol"]
    csv = harness.write_results(rows, tmp_path / "host.csv", ENV)
    assert [f.name for f in host.plot_host(csv, tmp_path)] == ["host_overhead.png"]
    assert "tritongemm ÷ torch" in host.summary_table(rows)


def test_host_gate_rejects_a_wrong_result(device, monkeypatch):
    monkeypatch.setattr(tritongemm, "matmul", lambda a, b: torch.matmul(a, b) * 1.5)
    rows = host.measure(host.HostCase("matmul", 16, 16, 16), torch.float32, device, calls=1, rounds=1)
    tg = next(r for r in rows if r["impl"] == "tritongemm")
    assert tg["status"] == harness.FAILED_GATE and "host_us" not in tg


# ----------------------------------------------------------------------------------
# Real model families at tiny sizes (only where transformers is installed)
# ----------------------------------------------------------------------------------
needs_transformers = pytest.mark.skipif(
    importlib.util.find_spec("transformers") is None,
    reason="transformers is not installed (pip install transformers)",
)


def _tiny_spec(name: str) -> models.ModelSpec:
    small = dict(batch=B, seq=S, n_labels=64, decode_prompt=4, decode_steps=3)
    if name == "llama":
        return dataclasses.replace(
            models.MODELS["llama-s"], name="llama-tiny", build=models._llama(32, 64, 1, 2, 1, 64), **small
        )
    if name == "gpt2":
        return dataclasses.replace(
            models.MODELS["gpt2"],
            name="gpt2-tiny",
            **small,
            build=models._gpt2(n_embd=32, n_layer=1, n_head=2, vocab_size=64, n_positions=64),
        )
    return dataclasses.replace(
        models.MODELS["bert-base"],
        name="bert-tiny",
        **small,
        build=models._bert(
            hidden_size=32,
            num_hidden_layers=1,
            num_attention_heads=2,
            intermediate_size=64,
            vocab_size=64,
            max_position_embeddings=64,
        ),
    )


@needs_transformers
@pytest.mark.parametrize(
    "family,workloads",
    [
        ("llama", ("infer", "decode", "decode_graph", "train")),
        ("gpt2", ("infer", "decode")),
        ("bert", ("infer", "train")),
    ],
)
def test_real_model_families_pass_the_gate(family, workloads, device):
    spec = _tiny_spec(family)
    result = models.run_models(
        [(spec, w) for w in workloads],
        device,
        torch.bfloat16,
        sabotaged=True,
        breakdown=False,
        warmup_ms=0,
        rep_ms=0,
        rounds=1,
        timing="calls",  # (the gate is the point; the loop timing runs in the mixed-precision test)
    )
    for r in result.rows:
        if r["impl"] == "sabotaged":
            assert r["status"] == harness.FAILED_GATE, r
        else:
            assert r["status"] == harness.OK, r
    converted = {r["note"] for r in result.rows if r["impl"] == "convert"}
    # GPT-2's projections are transformers' Conv1D (torch.addmm): 4 a block, beside the LM head's Linear
    assert (
        converted == {"converted 1 nn.Linear, 4 Conv1D"}
        if family == "gpt2"
        else all("converted" in n for n in converted)
    )


def test_compiled_view_builds_each_mode_against_its_own_baseline():
    """``--compile-modes``: stock, then per mode torch.compile of stock and of the converted model,
    the converted one timed against stock compiled in the same mode, and beside it the A/A control (a
    second compiled copy of stock, of stock's own modules) against the same baseline."""
    stock = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 8))
    variants = models.build_variants(
        stock, "infer", compile=True, compile_modes=models.COMPILE_MODES, eager=False
    )
    names = [v.name for v in variants]
    assert names[0] == "stock" and "convert" not in names and "patch" not in names
    for mode in models.COMPILE_MODES:
        base = models.compiled_name("compile", mode)
        (conv,) = [v for v in variants if v.name == models.compiled_name("compile+convert", mode)]
        (copy,) = [v for v in variants if v.name == models.compiled_name("compile+copy", mode)]
        assert base in names and conv.baseline == base and copy.baseline == base
        assert "mode=" in models._describe(conv.name, "infer") or mode == "default"
        assert "mode=" in models._describe(copy.name, "infer") or mode == "default"
        assert not any(isinstance(m, tritongemm.nn.Linear) for m in copy.module.modules())
        assert any(isinstance(m, tritongemm.nn.Linear) for m in conv.module.modules())
    eager_view = models.build_variants(stock, "infer", compile=True)
    assert not any(v.name.startswith("compile+copy") for v in eager_view)


def test_compiled_view_runs_each_mode_alone_and_keeps_one_stock_row(monkeypatch):
    """``--compile-modes a,b``: one run a mode, Dynamo's caches emptied between runs (compiled copies
    of one model share its code objects' cache entries, which skewed a mixed run), stock's eager
    row kept once."""
    resets, runs = [], []
    monkeypatch.setattr(torch._dynamo, "reset", lambda: resets.append(len(runs)))

    def run(modes):
        runs.append(modes)
        rows = [{"impl": "stock", "mode": modes[0]}, {"impl": f"compile+convert:{modes[0]}"}]
        return models.ModelsResult(rows=rows, gemm_rows=[{"mode": modes[0]}])

    result = models.modes_apart(["default", "reduce-overhead", "max-autotune-no-cudagraphs"], run)
    assert runs == [("default",), ("reduce-overhead",), ("max-autotune-no-cudagraphs",)]
    assert resets == [1, 2]  # before the second and third runs
    assert [r["impl"] for r in result.rows] == [
        "stock",
        "compile+convert:default",
        "compile+convert:reduce-overhead",
        "compile+convert:max-autotune-no-cudagraphs",
    ]
    assert result.rows[0]["mode"] == "default" and len(result.gemm_rows) == 3
    runs.clear()
    assert models.modes_apart(None, run).rows[0]["impl"] == "stock" and runs == [("default",)]
