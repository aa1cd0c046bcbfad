"""The autotuner, the dispatch hook and ``python -m tritongemm`` on Triton's CPU interpreter.

Tiny shapes and a couple of candidates keep every tune well under a second
(on a GPU the same tests run compiled).
Every test points TRITONGEMM_CACHE_DIR at its own tmp_path.

On the interpreter ``tune`` never times or saves (its times are meaningless).
Most tests here check what tuning does with its times (choosing, saving,
dispatching), so they let the interpreter's times count, as a GPU's would
(``timings_count`` below; a no-op on a GPU); the section "Where timings mean
nothing" checks the interpreter's real behaviour.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import tritongemm
from tritongemm.cli import arguments
from tritongemm.cli import main as cli
from tritongemm.device import INTERPRETER_DEVICE, device_info, interpreter_enabled
from tritongemm.launch import problem_of
from tritongemm.planning.configs import TileConfig
from tritongemm.planning.heuristics import heuristic_config
from tritongemm.planning.problem import GemmProblem
from tritongemm.tuning import autotune, cache, measure, presets, report, tuner
from tritongemm.tuning.progress import ProgressBar

pytestmark = pytest.mark.skipif(
    not interpreter_enabled() and not torch.cuda.is_available(),
    reason="needs a CUDA GPU or Triton's CPU interpreter (TRITON_INTERPRET=1 before import)",
)

DEVICE = device_info()  # the interpreter's H100 budgets on CPU machines
SMALL = TileConfig(block_m=16, block_n=32, block_k=32, group_m=8, num_warps=4, num_stages=2)
LARGE = TileConfig(block_m=32, block_n=32, block_k=32, group_m=8, num_warps=4, num_stages=2)
TINY = GemmProblem(m=32, n=32, k=32, dtype="float32", layout="NN")
REPO = Path(__file__).resolve().parents[1]
REAL_TIMINGS_CHECK = tuner.timings_are_meaningful
on_the_interpreter = pytest.mark.skipif(not DEVICE.interpreter, reason="checks Triton's CPU interpreter")


@pytest.fixture(autouse=True)
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.delenv("TRITONGEMM_CACHE_FILE", raising=False)
    monkeypatch.delenv("TRITONGEMM_AUTOTUNE", raising=False)
    monkeypatch.setenv("TRITONGEMM_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(autotune, "_override", [None])
    monkeypatch.setattr(autotune, "_attempted", set())
    return tmp_path


@pytest.fixture(autouse=True)
def timings_count(monkeypatch):
    """Treat the interpreter's times as a GPU's, to test what tuning does with them."""
    monkeypatch.setattr(tuner, "timings_are_meaningful", lambda device: True)


@pytest.fixture
def honest_timings(monkeypatch):
    """The real rule: times measured on the interpreter are meaningless."""
    monkeypatch.setattr(tuner, "timings_are_meaningful", REAL_TIMINGS_CHECK)


def tune_quietly(problems, **kwargs):
    kwargs.setdefault("bench_ms", 1)
    return tuner.tune(problems, device=DEVICE, progress=False, **kwargs)


# ----------------------------------------------------------------------------------
# tune() end to end
# ----------------------------------------------------------------------------------
def test_tune_writes_an_entry_that_lookup_returns(cache_dir):
    (result,) = tune_quietly([TINY], candidates=[SMALL, LARGE])
    assert result.best in (SMALL, LARGE)
    assert [c.config for c in result.candidates] == [SMALL, LARGE]
    assert all(c.error is None and c.ms > 0 for c in result.candidates)
    assert result.ms == min(c.ms for c in result.candidates)
    assert result.tflops > 0 and result.torch_tflops > 0
    assert result.saved and not result.timed_out and result.timed is True and result.save_error is None
    cache.reload()  # as a new process: read the file
    assert cache.lookup(TINY, DEVICE) == result.best
    assert cache.lookup(GemmProblem(20, 32, 32, dtype="float32"), DEVICE) == result.best  # same M bucket
    entry = json.loads((cache_dir / cache.CACHE_FILENAME).read_text())["entries"][result.key]
    assert entry["config"] == result.best.to_dict()
    assert entry["tflops"] == pytest.approx(result.tflops, rel=1e-2, abs=1e-3)


@pytest.mark.parametrize("layout", ["NN", "NT", "TN", "TT"])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_tune_handles_each_layout_and_half_dtype(layout, dtype):
    problem = GemmProblem(m=24, n=40, k=48, dtype=dtype, layout=layout)
    (result,) = tune_quietly([problem], candidates=[LARGE])
    assert result.best == LARGE, result.candidates
    assert cache.lookup(problem, DEVICE) == LARGE


def test_tune_batched_problem():
    problem = GemmProblem(m=16, n=32, k=32, batch=3, dtype="float32")
    (result,) = tune_quietly([problem], candidates=[SMALL])
    assert result.best == SMALL
    assert cache.lookup(GemmProblem(16, 32, 32, batch=4, dtype="float32"), DEVICE) == SMALL  # batch bucket 4


def test_tune_without_save_writes_nothing(cache_dir):
    (result,) = tune_quietly([TINY], candidates=[SMALL], save=False)
    assert result.best == SMALL and not result.saved
    assert not (cache_dir / cache.CACHE_FILENAME).exists()


def test_tune_to_an_explicit_cache_file(tmp_path):
    target = tmp_path / "elsewhere" / "tuned.json"
    tune_quietly([TINY], candidates=[SMALL], cache_file=target)
    assert SMALL.to_dict() in [e["config"] for e in json.loads(target.read_text())["entries"].values()]


def test_tune_tries_problems_sharing_a_key_once():
    results = tune_quietly(
        [TINY, GemmProblem(20, 32, 32, dtype="float32"), GemmProblem(33, 32, 32, dtype="float32")],
        candidates=[LARGE],
    )
    assert [r.problem.m for r in results] == [32, 33]


def test_tune_accepts_shape_tuples():
    (result,) = tune_quietly([(16, 32, 32)], candidates=[SMALL])
    assert result.problem == GemmProblem(16, 32, 32, dtype="float16", layout="NN")


def test_tune_default_candidates_start_with_the_heuristic():
    (result,) = tune_quietly([TINY], max_candidates=1)
    assert [c.config for c in result.candidates] == [heuristic_config(TINY, DEVICE)]


# ----------------------------------------------------------------------------------
# Rejection and the time box
# ----------------------------------------------------------------------------------
def _sabotaging_launcher(bad: TileConfig, how: str):
    real = measure.KERNEL_LAUNCHERS["pointer"]

    def launcher(config):
        launch = real(config)
        if config != bad:
            return launch

        def wrong(ops):
            if how == "off_by_one":
                launch(ops)
                ops.out[-1, -1] += 1.0
            elif how == "unwritten_row":  # a kernel that never stores row 0
                scratch = torch.full_like(ops.out, float("nan"))
                launch(measure.Operands(ops.a, ops.b, scratch))
                ops.out[1:] = scratch[1:]
            else:
                raise RuntimeError("out of resources: shared memory")

        return wrong

    return launcher


@pytest.mark.parametrize("how", ["off_by_one", "unwritten_row", "raises"])
def test_tune_rejects_a_wrong_candidate(monkeypatch, how):
    monkeypatch.setitem(measure.KERNEL_LAUNCHERS, "pointer", _sabotaging_launcher(SMALL, how))
    (result,) = tune_quietly([TINY], candidates=[SMALL, LARGE])
    assert result.best == LARGE
    (rejected,) = result.rejected
    assert rejected.config == SMALL and rejected.ms is None
    assert ("RuntimeError" if how == "raises" else "wrong result") in rejected.error


def test_tune_with_no_correct_candidate_saves_nothing(monkeypatch, cache_dir):
    monkeypatch.setitem(measure.KERNEL_LAUNCHERS, "pointer", _sabotaging_launcher(SMALL, "off_by_one"))
    (result,) = tune_quietly([TINY], candidates=[SMALL])
    assert result.best is None and result.tflops is None and not result.saved and result.timed is True
    assert cache.lookup(TINY, DEVICE) is None
    assert "(none correct)" in report.format_table([result])
    assert "1 rejected, 1x 'wrong result" in report.format_rejections([result])


def test_tune_stops_at_the_time_budget():
    (result,) = tune_quietly([TINY], candidates=[SMALL, LARGE, SMALL.with_pipeline(3)], time_budget_s=0.0)
    assert len(result.candidates) == 1 and result.timed_out
    assert result.best == SMALL


def test_candidates_that_do_not_fit_are_dropped():
    huge = TileConfig(256, 256, 128, 8, 8, 6)  # 1.5 MiB of shared memory at 4 B/element
    assert tuner.candidates_for(TINY, DEVICE, [huge, SMALL.to_dict()]) == [SMALL]


def test_unknown_kernel_is_an_error():
    with pytest.raises(ValueError, match="unknown kernel 'tma'"):
        tune_quietly([TINY], candidates=[SMALL], kernel="tma")


# ----------------------------------------------------------------------------------
# Inputs and the correctness check
# ----------------------------------------------------------------------------------
@pytest.mark.parametrize("layout", ["NN", "NT", "TN", "TT"])
def test_operands_have_the_problem_layout(layout):
    problem = GemmProblem(m=24, n=40, k=48, batch=2, dtype="float32", layout=layout)
    copies = measure.make_operands(problem, torch.device("cpu"), copies=2)
    assert problem_of(copies[0].a, copies[0].b) == problem
    assert not torch.equal(copies[0].a, copies[1].a)  # independent random copies


def test_check_result_tolerates_rounding_and_catches_errors():
    ref = torch.randn(16, 16)
    assert measure.check_result(ref * (1 + 1e-4), ref, "float32") is None
    wrong = ref.clone()
    wrong[3, 4] += ref.abs().max()
    assert "wrong result" in measure.check_result(wrong, ref, "float32")
    unwritten = ref.clone()
    unwritten[0, 0] = float("nan")
    assert "wrong result" in measure.check_result(unwritten, ref, "float32")


# ----------------------------------------------------------------------------------
# The dispatch hook and opt-in autotuning
# ----------------------------------------------------------------------------------
def test_tuned_config_never_tunes_unless_asked(monkeypatch, cache_dir):
    monkeypatch.setattr(tuner, "tune", lambda *a, **k: pytest.fail("tuned without opt-in"))
    assert autotune.tuned_config(TINY, DEVICE) is None
    assert not (cache_dir / cache.CACHE_FILENAME).exists()


@pytest.mark.parametrize("switch", ["function", "env"])
def test_autotune_on_first_call_tunes_each_key_once(monkeypatch, switch):
    if switch == "function":
        autotune.set_autotune_on_first_call(True)
    else:
        monkeypatch.setenv("TRITONGEMM_AUTOTUNE", "1")
    calls = []
    real_tune = tuner.tune

    def counting_tune(problems, **kwargs):
        calls.append(list(problems))
        return real_tune(calls[-1], candidates=[SMALL], bench_ms=1, **kwargs)

    monkeypatch.setattr(tuner, "tune", counting_tune)
    assert autotune.tuned_config(TINY, DEVICE) == SMALL
    assert autotune.tuned_config(TINY, DEVICE) == SMALL  # now a cache hit
    assert len(calls) == 1
    cache.reload()
    assert cache.lookup(TINY, DEVICE) == SMALL


def test_autotune_failure_warns_and_falls_back(monkeypatch):
    autotune.set_autotune_on_first_call(True)

    def failing_tune(*args, **kwargs):
        raise RuntimeError("no GPU today")

    monkeypatch.setattr(tuner, "tune", failing_tune)
    with pytest.warns(RuntimeWarning, match="no GPU today"):
        assert autotune.tuned_config(TINY, DEVICE) is None
    assert autotune.tuned_config(TINY, DEVICE) is None  # not retried, no second warning


def test_set_autotune_on_first_call_overrides_env(monkeypatch):
    monkeypatch.setenv("TRITONGEMM_AUTOTUNE", "1")
    assert autotune.autotune_on_first_call()
    autotune.set_autotune_on_first_call(False)
    assert not autotune.autotune_on_first_call()
    autotune.set_autotune_on_first_call(None)
    assert autotune.autotune_on_first_call()


# ----------------------------------------------------------------------------------
# The command line
# ----------------------------------------------------------------------------------
def parse(*argv):
    return cli.build_parser().parse_args(["tune", *argv])


def test_cli_shapes_dtypes_and_layouts_multiply():
    problems = arguments.problems_from_args(
        parse("--shape", "4096x4096x4096", "--shape", "1x8x16", "--dtype", "fp16,bf16", "--layout", "NN,TN")
    )
    assert len(problems) == 8
    assert problems[0] == GemmProblem(4096, 4096, 4096, 1, "float16", "NN")
    assert GemmProblem(1, 8, 16, 1, "bfloat16", "TN") in problems


def test_cli_defaults_to_fp16_nn():
    assert arguments.problems_from_args(parse("--shape", "64x32x16")) == [
        GemmProblem(64, 32, 16, 1, "float16", "NN")
    ]


@pytest.mark.parametrize("bad", ["4096x4096", "axbxc", "0x4x4", "4x4x4x4"])
def test_cli_rejects_bad_shapes(bad, capsys):
    with pytest.raises(SystemExit):
        parse("--shape", bad)
    assert "bad shape" in capsys.readouterr().err


@pytest.mark.parametrize("argv", [["--dtype", "int8"], ["--layout", "NX"], ["--preset", "gpt5"]])
def test_cli_rejects_unknown_values(argv):
    with pytest.raises(SystemExit):
        parse(*argv)


LLAMA_PAIRS = {
    # (N, K) of fused QKV, O, fused gate/up, down
    "llama3-8b": {(6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336)},
    "llama3-70b": {(10240, 8192), (8192, 8192), (57344, 8192), (8192, 28672)},
}


@pytest.mark.parametrize("name", sorted(LLAMA_PAIRS))
def test_cli_presets_give_the_models_linear_layers(name):
    problems = arguments.problems_from_args(parse("--preset", name, "--tokens", "1,16,4096"))
    assert {(p.n, p.k) for p in problems} == LLAMA_PAIRS[name]
    assert sorted({p.m for p in problems}) == [1, 16, 4096]
    assert len(problems) == 4 * 3
    assert {p.layout for p in problems} == {"NT"}  # nn.Linear: x @ W.mT


def test_cli_presets_split_projections_as_hf_runs_them():
    problems = arguments.problems_from_args(
        parse("--preset", "llama3-8b", "--tokens", "8", "--split-projections")
    )
    assert {(p.n, p.k) for p in problems} == {(4096, 4096), (1024, 4096), (14336, 4096), (4096, 14336)}


def test_cli_preset_default_tokens_and_dtype_list():
    problems = arguments.problems_from_args(parse("--preset", "llama3-8b", "--dtype", "bf16,fp16"))
    assert sorted({p.m for p in problems}) == sorted(presets.DEFAULT_TOKENS)
    assert len(problems) == 4 * len(presets.DEFAULT_TOKENS) * 2


def test_cli_reads_a_shapes_file_with_header(tmp_path):
    f = tmp_path / "shapes.csv"
    f.write_text("# decode and prefill\nm,n,k,batch,dtype,layout\n1,4096,4096,,,\n128,1024,512,4,bf16,TN\n\n")
    problems = arguments.problems_from_args(parse("--shapes-file", str(f), "--dtype", "fp16,fp32"))
    assert problems == [
        GemmProblem(1, 4096, 4096, 1, "float16", "NN"),
        GemmProblem(1, 4096, 4096, 1, "float32", "NN"),
        GemmProblem(128, 1024, 512, 4, "bfloat16", "TN"),
    ]


def test_cli_reads_a_shapes_file_without_header_or_optional_columns(tmp_path):
    f = tmp_path / "shapes.csv"
    f.write_text("64, 32, 16\n8,8,8,2\n")
    assert arguments.problems_from_args(parse("--shapes-file", str(f))) == [
        GemmProblem(64, 32, 16, 1, "float16", "NN"),
        GemmProblem(8, 8, 8, 2, "float16", "NN"),
    ]


@pytest.mark.parametrize(
    "content, message",
    [
        ("m,n\n1,2\n", "missing ['k']"),
        ("m,n,k,flavour\n1,2,3,x\n", "unknown ['flavour']"),
        ("m,n,k\n1,2,x\n", ":2:"),
        ("1,2,3,1,int8\n", "unknown dtype"),
    ],
)
def test_cli_shapes_file_errors_name_the_line(tmp_path, content, message):
    f = tmp_path / "shapes.csv"
    f.write_text(content)
    with pytest.raises(arguments.ShapesFileError, match=f".*{message.replace('[', '.').replace(']', '.')}"):
        arguments.problems_from_args(parse("--shapes-file", str(f)))


def test_cli_tune_end_to_end(cache_dir, tmp_path, capsys):
    csv_path = tmp_path / "results.csv"
    status = cli.main(
        [
            "tune",
            "--shape",
            "32x32x32",
            "--dtype",
            "fp32",
            "--max-candidates",
            "1",
            "--bench-ms",
            "1",
            "--no-progress",
            "--csv",
            str(csv_path),
        ]
    )
    out = capsys.readouterr().out
    assert status == 0
    assert "torch TFLOP/s" in out and "32x32x32 float32 NN" in out
    cache.reload()
    assert cache.lookup(TINY, DEVICE) == heuristic_config(TINY, DEVICE)
    lines = csv_path.read_text().splitlines()
    assert lines[0].startswith("m,n,k,batch,dtype,layout,block_m") and len(lines) == 2

    assert cli.main(["explain", "--shape", "20x32x32", "--dtype", "fp32"]) == 0
    assert "source : tuned" in capsys.readouterr().out
    assert cli.main(["cache"]) == 0
    assert "1 entries" in capsys.readouterr().out


def test_cli_cache_shows_why_an_entry_is_ignored(cache_dir, capsys):
    good, bad = GemmProblem(16, 32, 32, dtype="float32"), GemmProblem(64, 32, 32, dtype="float32")
    cache.record(good, DEVICE, SMALL, 1.0)
    entry = cache.make_entry(bad, DEVICE, SMALL, 1.0, 1.0)
    entry["config"]["group_m"] = 2**31
    cache.save_entries({cache.cache_key(bad, DEVICE): entry})
    assert cli.main(["cache"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "2 entries" in lines[0]
    assert any("m=16" in line and SMALL.short() in line for line in lines)
    assert any(
        "m=64" in line and "(ignored: config field group_m=2147483648 is out of bounds" in line
        for line in lines
    )


def test_cli_tune_without_shapes_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["tune"])
    assert exc.value.code == 2 and "nothing to tune" in capsys.readouterr().err


def test_cli_explain_without_cache_uses_the_heuristic(capsys):
    assert cli.main(["explain", "--shape", "64x64x64"]) == 0
    assert "source : heuristic" in capsys.readouterr().out


def test_cli_explain_for_a_named_gpu_shows_the_fallback(capsys):
    """The CLI is the Python explain: an H100's descriptor kernel, and why an unaligned K cannot have it."""
    from tritongemm.kernels.gemm_gluon import GLUON_AVAILABLE

    kernel = "gluon_ws" if GLUON_AVAILABLE else "tma_persistent"  # 128x256 tiles over 3.9 waves
    assert (
        cli.main(
            ["explain", "--shape", "4096x4096x4096", "--dtype", "bf16", "--layout", "NT", "--device", "h100"]
        )
        == 0
    )
    assert f"kernel : {kernel}" in capsys.readouterr().out
    assert cli.main(["explain", "--shape", "4096x4096x4097", "--dtype", "bf16", "--device", "h100"]) == 0
    out = capsys.readouterr().out  # descriptors all the same: A and B are copied to aligned workspaces
    assert (
        f"kernel : {kernel}" in out
        and "align  : copy A to aligned" in out
        and "triton-interpreter" not in out
    )


def _usage_error(argv, capsys) -> str:
    """stderr of a command line the parser refuses (exit status 2)."""
    with pytest.raises(SystemExit) as exc:
        cli.main(argv)
    assert exc.value.code == 2
    return capsys.readouterr().err


def test_cli_takes_shapes_as_shape_options_in_every_subcommand(capsys):
    """--shape MxNxK is the spelling of tune and explain alike (documented in both helps); a bare
    MxNxK is accepted by both too."""
    assert arguments.problems_from_args(parse("--shape", "64x32x16")) == arguments.problems_from_args(
        parse("64x32x16")
    )
    assert len(arguments.problems_from_args(parse("--shape", "64x32x16", "8x8x8"))) == 2
    outs = []
    for argv in (["explain", "--shape", "64x32x16"], ["explain", "64x32x16"]):
        assert cli.main(argv) == 0
        outs.append(capsys.readouterr().out)
    assert outs[0] == outs[1] and "problem: 64x32x16 float16 NN" in outs[0]
    for command in ("tune", "explain"):
        with pytest.raises(SystemExit):
            cli.main([command, "-h"])
        assert "--shape MxNxK" in capsys.readouterr().out
    assert "no shape; give --shape MxNxK" in _usage_error(["explain"], capsys)
    assert "two shapes" in _usage_error(["explain", "1x2x3", "--shape", "1x2x4"], capsys)


@pytest.mark.parametrize(
    "argv, named",
    [
        (["explain", "-4096x4096x4096"], "M = -4096"),
        (["explain", "--shape", "-4096x4096x4096", "--dtype", "bf16"], "M = -4096"),
        (["explain", "--shape", "4096x-8x4096"], "N = -8"),
        (["explain", "--shape", "4096x8x0"], "K = 0"),
        (["tune", "--shape", "-16x8x8"], "M = -16"),
        (["tune", "-16x8x8"], "M = -16"),
    ],
)
def test_cli_a_negative_size_is_named_not_a_missing_shape(argv, named, capsys):
    err = _usage_error(argv, capsys)
    assert f"{named} is not a size" in err and "bad shape" in err
    assert "required" not in err and "expected one argument" not in err


def test_cli_unknown_device_lists_the_names_it_accepts(capsys):
    from tritongemm.device import KNOWN_DEVICES

    err = _usage_error(["explain", "--shape", "64x64x64", "--device", "garbage"], capsys)
    assert "unknown device 'garbage'" in err and all(name in err for name in KNOWN_DEVICES)
    assert "DeviceInfo" not in err  # (Python API advice)
    with pytest.raises(SystemExit):
        cli.main(["explain", "-h"])
    help_text = capsys.readouterr().out
    assert all(name in help_text for name in KNOWN_DEVICES)
    assert cli.main(["explain", "--shape", "64x64x64", "--device", "A100"]) == 0  # names in any case
    assert "on NVIDIA A100" in capsys.readouterr().out


def test_cli_usage_names_the_program_as_typed(monkeypatch, capsys):
    assert cli.program_name("/venv/bin/tritongemm") == "tritongemm"
    assert cli.program_name(str(REPO / "tritongemm" / "__main__.py")) == "python -m tritongemm"
    assert cli.program_name("/venv/lib/pytest/__main__.py") == "tritongemm"  # called from other code
    monkeypatch.setattr(sys, "argv", ["/venv/bin/tritongemm"])
    assert _usage_error(["explain"], capsys).startswith("usage: tritongemm explain")
    monkeypatch.setattr(sys, "argv", [str(REPO / "tritongemm" / "__main__.py")])
    assert _usage_error(["explain"], capsys).startswith("usage: python -m tritongemm explain")


def _option_help(command: str, option: str, capsys) -> str:
    """The help text of ``option`` in ``command -h`` (up to the next option), on one line."""
    with pytest.raises(SystemExit):
        cli.main([command, "-h"])
    out = capsys.readouterr().out
    block = out.split(f"  {option} ", 1)[1].split("\n  -", 1)[0]
    return " ".join(block.split())


@pytest.mark.parametrize("command", ["tune", "explain"])
def test_cli_dtype_and_layout_have_help_listing_the_choices(command, capsys):
    dtype_help = _option_help(command, "--dtype", capsys)
    assert all(name in dtype_help for name in ("fp16", "bf16", "fp32", "fp64", "default: fp16"))
    layout_help = _option_help(command, "--layout", capsys)
    assert all(layout in layout_help for layout in arguments.LAYOUTS) and "default: NN" in layout_help


def test_cli_explain_says_when_it_plans_for_the_interpreter(capsys):
    assert cli.main(["explain", "--shape", "64x64x64"]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if "interpreter" in line.lower()]
    if DEVICE.interpreter:
        assert any(line.startswith("device : ") and "Triton's CPU interpreter" in line for line in lines)
        assert any("--device" in line for line in lines)
    else:
        assert not any(line.startswith("device : ") for line in lines)
    assert cli.main(["explain", "--shape", "64x64x64", "--device", "h100"]) == 0
    assert "device : " not in capsys.readouterr().out  # planned for the named GPU, not this machine


def _key_line(out: str) -> str:
    (line,) = [line for line in out.splitlines() if line.startswith("key    : ")]
    return line


def test_cli_explain_key_line_names_the_kernel_chosen(capsys):
    from tritongemm.kernels.gemm_gluon import GLUON_AVAILABLE

    kernel = "gluon_ws" if GLUON_AVAILABLE else "tma_persistent"
    assert cli.main(["explain", "--shape", "4096x4096x4096", "--dtype", "bf16", "--device", "h100"]) == 0
    out = capsys.readouterr().out
    assert f"kernel : {kernel}" in out
    line = _key_line(out)  # the key dispatch looks up (tuned on the pointer kernel), and the kernel that runs
    assert "|pointer|" in line and line.endswith(f"this plan runs {kernel})")
    # A plan on the pointer kernel: the key names it already.
    assert cli.main(["explain", "--shape", "64x64x64", "--device", "a100", "--dtype", "fp32"]) == 0
    out = capsys.readouterr().out
    assert "kernel : pointer" in out and _key_line(out).endswith("|batch=1")


# ----------------------------------------------------------------------------------
# Progress bar
# ----------------------------------------------------------------------------------
class FakeTerminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_bar_in_a_log_writes_one_line_per_shape():
    stream = io.StringIO()
    bar = ProgressBar(total=4, stream=stream)
    bar.update(0, "a", "candidate 1/3")  # not drawn in a log
    bar.step(1, "a")
    bar.step(4, "d")
    bar.close()
    assert "\r" not in stream.getvalue()
    lines = stream.getvalue().splitlines()
    assert len(lines) == 2
    assert lines[0].startswith("[##        ] 1/4 shapes") and lines[0].endswith(", a]")
    assert lines[1].startswith("[##########] 4/4 shapes") and lines[1].endswith(", d]")


def test_progress_bar_on_a_terminal_redraws_one_line():
    stream = FakeTerminal()
    bar = ProgressBar(total=4, stream=stream, unit="runs")
    bar.update(0, "a", "candidate 1/3")
    bar.step(1, "a")
    bar.step(4, "d")
    bar.close()
    text = stream.getvalue()
    assert text.count("\n") == 1 and text.endswith("\n")  # one line, redrawn with \r, ended at close
    draws = text.strip().split("\r")
    assert any("0/4 runs" in d and "a | candidate 1/3" in d for d in draws)
    assert draws[-1].startswith("[##########] 4/4 runs") and ", d]" in draws[-1]


@pytest.mark.parametrize("stream", [io.StringIO(), FakeTerminal()], ids=["log", "terminal"])
def test_progress_bar_disabled_writes_nothing(stream):
    bar = ProgressBar(total=2, stream=stream, enabled=False)
    bar.update(0, "a", "candidate 1/3")
    bar.step(1, "a")
    bar.close()
    assert stream.getvalue() == ""


def test_tune_draws_progress_only_on_a_terminal(monkeypatch):
    for stream, drawn in ((io.StringIO(), False), (FakeTerminal(), True)):
        monkeypatch.setattr(sys, "stderr", stream)
        tuner.tune([TINY], device=DEVICE, candidates=[SMALL], bench_ms=1, save=False)  # progress=None
        assert ("1/1 shapes" in stream.getvalue()) == drawn


def test_dispatch_uses_a_new_tuning_result_at_once(cache_dir):
    """A shape dispatched before tuning must pick up the tuned config afterwards (plan cache cleared)."""
    import tritongemm
    from tritongemm import explain
    from tritongemm.testing import default_device

    a = torch.randn(32, 32, device=default_device())
    b = torch.randn(32, 32, device=default_device())
    tritongemm.matmul(a, b)  # plans and caches the heuristic launch
    assert explain(a, b).source.startswith("heuristic")
    (result,) = tune_quietly([TINY], candidates=[LARGE])
    assert result.best == LARGE
    plan = explain(a, b)
    assert plan.source == "tuning cache" and plan.config == LARGE
    assert torch.allclose(tritongemm.matmul(a, b), a @ b, rtol=1e-4, atol=1e-4)


# ----------------------------------------------------------------------------------
# A cache that cannot be written: the results survive
# ----------------------------------------------------------------------------------
def unwritable_cache(tmp_path: Path, how: str) -> Path:
    if how == "parent_is_a_file":
        (tmp_path / "not_a_dir").write_text("")
        return tmp_path / "not_a_dir" / "tuned.json"
    if os.geteuid() == 0:
        pytest.skip("root writes into read-only directories (parent_is_a_file covers the failure as root)")
    read_only = tmp_path / "read_only"
    read_only.mkdir()
    read_only.chmod(0o555)
    return read_only / "tuned.json"


@pytest.mark.parametrize("how", ["read_only_dir", "parent_is_a_file"])
def test_tune_into_an_unwritable_cache_returns_the_results_and_why(tmp_path, how):
    target = unwritable_cache(tmp_path, how)
    other = GemmProblem(m=64, n=32, k=32, dtype="float32")
    with pytest.warns(cache.TuningCacheWarning, match="could not write the tuning cache") as caught:
        results = tune_quietly([TINY, other], candidates=[SMALL, LARGE], cache_file=target)
    assert (
        len([w for w in caught if "could not write" in str(w.message)]) == 1
    )  # one warning, not one a shape
    assert [r.problem.m for r in results] == [32, 64]
    for result in results:
        assert result.best in (SMALL, LARGE) and result.tflops > 0  # tuned all the same
        assert not result.saved and result.save_error
        assert ("PermissionError" if how == "read_only_dir" else "not_a_dir") in result.save_error
    assert not target.exists()


@pytest.mark.parametrize("how", ["read_only_dir", "parent_is_a_file"])
def test_cli_tune_into_an_unwritable_cache_prints_the_results_and_why(tmp_path, capsys, how):
    target = unwritable_cache(tmp_path, how)
    status = cli.main(
        [
            "tune",
            "--shape",
            "32x32x32",
            "--dtype",
            "fp32",
            "--max-candidates",
            "1",
            "--bench-ms",
            "1",
            "--no-progress",
            "--cache-file",
            str(target),
        ]
    )
    captured = capsys.readouterr()
    assert status == 1
    assert "32x32x32 float32 NN" in captured.out and heuristic_config(TINY, DEVICE).short() in captured.out
    assert f"NOT SAVED: could not write the cache {target}" in captured.err
    assert "Warning" not in captured.err  # said once, plainly


# ----------------------------------------------------------------------------------
# Where timings mean nothing (Triton's CPU interpreter) or nothing can run
# ----------------------------------------------------------------------------------
@on_the_interpreter
def test_tune_on_the_interpreter_checks_candidates_but_times_and_saves_nothing(
    honest_timings, monkeypatch, cache_dir
):
    monkeypatch.setitem(measure.KERNEL_LAUNCHERS, "pointer", _sabotaging_launcher(SMALL, "off_by_one"))
    with pytest.warns(tuner.TimingsMeaninglessWarning, match="timings are meaningless"):
        (result,) = tune_quietly([TINY], candidates=[SMALL, LARGE])
    assert result.timed is False and result.best is None and not result.saved and result.save_error is None
    assert result.ms is None and result.torch_ms is None and result.tflops is None
    assert [(c.config, c.ms) for c in result.correct] == [(LARGE, None)]
    assert [c.config for c in result.rejected] == [SMALL] and "wrong result" in result.rejected[0].error
    assert not (cache_dir / cache.CACHE_FILENAME).exists()
    assert cache.lookup(TINY, DEVICE) is None
    assert "(not timed: 1 correct)" in report.format_table([result])


@on_the_interpreter
def test_cli_tune_on_the_interpreter_says_timings_are_meaningless(
    honest_timings, cache_dir, tmp_path, capsys
):
    csv_path = tmp_path / "results.csv"
    status = cli.main(
        [
            "tune",
            "--shape",
            "32x32x32",
            "--dtype",
            "fp32",
            "--max-candidates",
            "2",
            "--bench-ms",
            "1",
            "--no-progress",
            "--csv",
            str(csv_path),
        ]
    )
    captured = capsys.readouterr()
    assert status == 0
    assert "timings are meaningless" in captured.err and "nothing written to the cache" in captured.err
    assert "Warning" not in captured.err
    assert "(not timed: 2 correct)" in captured.out and "TFLOP/s" in captured.out
    assert not (cache_dir / cache.CACHE_FILENAME).exists()
    row = csv_path.read_text().splitlines()[1].split(",")
    assert row[:6] == ["32", "32", "32", "1", "float32", "NN"]


@on_the_interpreter
def test_autotune_on_the_interpreter_warns_and_uses_the_heuristic(honest_timings, monkeypatch, cache_dir):
    autotune.set_autotune_on_first_call(True)
    monkeypatch.setattr(tuner, "tune", lambda *a, **k: pytest.fail("tuned on the interpreter"))
    with pytest.warns(RuntimeWarning, match="ignored on Triton's CPU interpreter"):
        assert autotune.tuned_config(TINY, DEVICE) is None
    assert not (cache_dir / cache.CACHE_FILENAME).exists()


def test_tune_without_gpu_or_interpreter_is_one_clear_error(monkeypatch):
    monkeypatch.setattr(tuner, "interpreter_enabled", lambda: False)
    with pytest.raises(
        RuntimeError, match="no CUDA GPU to tune on, and Triton's CPU interpreter is off"
    ) as exc:
        tuner.tune([TINY], device=INTERPRETER_DEVICE, candidates=[SMALL], progress=False)
    assert "\n" not in str(exc.value)


def test_cli_tune_without_gpu_or_interpreter_is_one_line_and_fails(monkeypatch, cache_dir, capsys):
    monkeypatch.setattr(tuner, "interpreter_enabled", lambda: False)
    monkeypatch.setattr(cli, "device_info", lambda: INTERPRETER_DEVICE)
    assert cli.main(["tune", "--shape", "32x32x32"]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    (line,) = captured.err.splitlines()
    assert line.startswith(f"{cli.program_name()} tune: error: no CUDA GPU") and "TRITON_INTERPRET=1" in line
    assert not (cache_dir / cache.CACHE_FILENAME).exists()


@pytest.mark.heavy
@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU: tune would run")
def test_python_m_tritongemm_tune_without_gpu_or_interpreter(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(
        TRITONGEMM_CACHE_FILE=str(tmp_path / "c.json"),
        PYTHONPATH=os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]),
    )
    proc = subprocess.run(
        [sys.executable, "-m", "tritongemm", "tune", "--shape", "32x32x32"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    (line,) = proc.stderr.splitlines()
    assert line.startswith("python -m tritongemm tune: error:") and "no CUDA GPU to tune on" in line
    assert not (tmp_path / "c.json").exists()


# ----------------------------------------------------------------------------------
# fp8
# ----------------------------------------------------------------------------------
FP8_SMALL = TileConfig(block_m=16, block_n=32, block_k=64, group_m=8, num_warps=4, num_stages=2)
FP8_LARGE = TileConfig(block_m=32, block_n=32, block_k=64, group_m=8, num_warps=4, num_stages=2)


@pytest.mark.parametrize("layout", ["NT", "NN"])
def test_tune_fp8_problem_and_scaled_mm_uses_the_tuned_config(layout):
    """An fp8 problem is tuned as scaled_mm runs it (rowwise scales, bf16 out, checked against the
    dequantized product), and scaled_mm's plan then comes from the cache."""
    problem = GemmProblem(m=32, n=48, k=128, dtype="fp8", layout=layout)
    (result,) = tune_quietly([problem], candidates=[FP8_SMALL, FP8_LARGE])
    assert all(c.error is None for c in result.candidates), result.candidates
    assert result.best in (FP8_SMALL, FP8_LARGE)
    assert cache.lookup(problem, DEVICE) == result.best
    where = "cpu" if interpreter_enabled() else "cuda"  # the device the problem was tuned for
    a = torch.empty(32, 128, dtype=torch.float8_e4m3fn, device=where)
    w = torch.empty(48, 128, dtype=torch.float8_e4m3fn, device=where)
    b = w.t() if layout == "NT" else w.t().contiguous()
    plan = tritongemm.explain(a, b, out_dtype=torch.bfloat16)
    assert plan.config == result.best and "tuning cache" in plan.source


def test_tune_rejects_a_wrong_fp8_candidate(monkeypatch):
    """The check compares with the dequantized product: a launch that drops the scales fails it."""
    real = measure.pointer_launcher

    def unscaled(config):
        run = real(config)
        return lambda ops: run(
            measure.Operands(ops.a, ops.b, ops.out, tuple(torch.ones_like(s) for s in ops.scales))
        )

    monkeypatch.setitem(measure.KERNEL_LAUNCHERS, "pointer", unscaled)
    problem = GemmProblem(m=32, n=48, k=128, dtype="fp8", layout="NT")
    (result,) = tune_quietly([problem], candidates=[FP8_SMALL], save=False)
    assert result.best is None and "wrong result" in result.candidates[0].error


def test_fp8_candidates_on_h100_take_128_byte_k_steps_on_the_warp_specialized_kernel():
    from tritongemm.device import KNOWN_DEVICES
    from tritongemm.tuning.space import candidate_configs

    configs = list(
        candidate_configs(GemmProblem(4096, 4096, 4096, dtype="fp8", layout="NT"), KNOWN_DEVICES["h100"])
    )
    ws = [c for c in configs if c.kernel == "gluon_ws"]
    assert ws and all(c.block_k == 128 for c in ws)
    assert all(c.block_k in (64, 128, 256) for c in configs)
    # Two fp8 consumers split a tile's rows: 128-row tiles only, 128x256 among them; bf16's take turns
    # on whole tiles of at most 128x128.
    split = {(c.block_m, c.block_n) for c in ws if c.pingpong}
    assert split == {(128, 128), (128, 256)}, split
    bf16 = candidate_configs(
        GemmProblem(4096, 4096, 4096, dtype="bfloat16", layout="NT"), KNOWN_DEVICES["h100"]
    )
    turns = {(c.block_m, c.block_n) for c in bf16 if c.kernel == "gluon_ws" and c.pingpong}
    assert turns == {(128, 128), (64, 128), (64, 256)}, turns


def test_cli_takes_fp8_dtypes():
    assert arguments.parse_dtype("fp8") == "float8_e4m3fn" and arguments.parse_dtype("e5m2") == "float8_e5m2"
