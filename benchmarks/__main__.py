"""Command line: ``python -m benchmarks {quick,run,plot,soak,fp8,fp8-train,list}`` (run from the repository root).

python -m benchmarks quick [--out DIR]
python -m benchmarks run --suite square|llm|decode|stages|hierarchy|backward|models|host|mlp|epilogue
                         [--dtype fp16,bf16] [--out DIR] [--no-compile] [--filter TEXT] [--impls A,B]
                         [--sabotaged]
python -m benchmarks plot CSV [CSV ...] [--out DIR] [--figures KIND,...]
python -m benchmarks soak [--calls N] [--out DIR]
python -m benchmarks fp8 [--shape MxNxK ...] [--recipes NAME,...] [--rounds N] [--out DIR]
python -m benchmarks fp8-train [--steps N] [--rounds N] [--out DIR]
python -m benchmarks list
"""

from __future__ import annotations

import argparse
import os
import sys

_INTERPRET_ON = ("1", "true", "on", "yes")
#: Suites that are not lists of GEMM cases: suite name -> module with ``run_cli(args)``.
_OWN_RUNNERS = {"models": ".models", "host": ".host", "mlp": ".mlp", "epilogue": ".epilogue"}


def _interpreter_requested() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0").lower() in _INTERPRET_ON


def _has_gpu() -> bool:
    import torch  # importing torch creates no Triton kernel

    return torch.cuda.is_available()


def _interpreter_ready() -> bool:
    """Will tritongemm's kernels run on the interpreter in this process?

    Triton fixes this when a kernel is decorated, i.e. when tritongemm is first
    imported: if it already is, ask it; otherwise the environment decides.
    """
    if "tritongemm" in sys.modules:
        return bool(sys.modules["tritongemm"].interpreter_enabled())
    return _interpreter_requested()


def _reexec_with_interpreter(argv: list[str]) -> None:
    """Replace this process with ``python -m benchmarks ARGV`` under TRITON_INTERPRET=1."""
    env = dict(os.environ, TRITON_INTERPRET="1")
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, "-m", "benchmarks", *argv], env)


def _shape(text: str) -> tuple[int, int, int]:
    """``--shape MxNxK``, parsed as ``tritongemm tune`` parses it (imported only when given: see
    ``_interpreter_ready``)."""
    from tritongemm.cli.arguments import parse_shape

    return parse_shape(text)


def _fp8_recipes(text: str) -> list[str]:
    """``--recipes tensorwise,blockwise``: fp8 recipe names, checked against the suite's (imported
    only when given, as ``_shape``)."""
    from .fp8 import select_recipes

    try:
        return [r.name for r in select_recipes(text)]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _positive_int(text: str) -> int:
    """``--rounds N`` (N >= 1), imported only when given, as ``_shape``."""
    from tritongemm.cli.arguments import positive_int

    return positive_int(text)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks", description="tritongemm benchmarks")
    sub = p.add_subparsers(dest="command", required=True)

    q = sub.add_parser(
        "quick", help="short benchmark vs cuBLAS (GPU) or interpreter correctness demo (no GPU)"
    )
    q.add_argument("--out", help="results folder (default benchmarks/results/<gpu>/, e.g. h100/)")
    q.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")

    r = sub.add_parser("run", help="run benchmark suites (CUDA GPU)")
    r.add_argument(
        "--suite",
        required=True,
        help="comma-separated: square, llm, decode, families, shortk, stages, hierarchy, backward, decomposition, unaligned, models, host, mlp, epilogue",
    )
    r.add_argument("--dtype", help="comma-separated: fp16, bf16, fp32 (default: the suite's)")
    r.add_argument("--out", help="results folder (default benchmarks/results/<gpu>/, e.g. h100/)")
    r.add_argument("--no-compile", action="store_true", help="skip torch.compile(max-autotune-no-cudagraphs)")
    r.add_argument("--filter", help="only cases whose label contains this text")
    r.add_argument(
        "--impls",
        help="only implementations whose name contains one of these (comma-separated); cuBLAS always runs",
    )
    r.add_argument(
        "--sabotaged",
        action="store_true",
        help="add a deliberately wrong implementation, to see the gate reject it",
    )
    r.add_argument(
        "--no-ceilings", action="store_true", help="skip the copy-bandwidth / peak-matmul ceilings"
    )
    r.add_argument("--no-plots", action="store_true", help="write the CSV only")
    r.add_argument("--warmup", type=float, default=25, help="do_bench warm-up, ms (default 25)")
    r.add_argument("--rep", type=float, default=100, help="do_bench measuring time, ms (default 100)")
    r.add_argument(
        "--rounds",
        type=int,
        default=None,
        help="time each case's implementations in this many interleaved rounds (default 3; the host suite 15)",
    )
    r.add_argument(
        "--timing",
        choices=("loop", "calls"),
        default="loop",
        help="models suite: time back-to-back steps between two synchronizations (loop, default) "
        "or each step alone with do_bench (calls)",
    )
    r.add_argument(
        "--compile-modes",
        default=None,
        help="models suite: its compiled view instead (stock, torch.compile of stock and of the converted "
        "model, compile times) in these comma-separated modes: default, reduce-overhead, "
        "max-autotune-no-cudagraphs; writes models_compile.csv",
    )
    r.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")

    pl = sub.add_parser("plot", help="regenerate figures from results CSVs (no GPU needed)")
    pl.add_argument("csv", nargs="+", help="results CSV(s), drawn together")
    pl.add_argument("--out", help="figures folder (default: the first CSV's folder)")
    pl.add_argument(
        "--figures",
        help="only these kinds (comma-separated): tflops, speedup, ladder, heatmap, "
        "sweep, roofline, compile, quick",
    )

    so = sub.add_parser(
        "soak", help="many mixed calls in one process: memory and caches must stay flat (GPU; tiny on CPU)"
    )
    so.add_argument("--calls", type=int, help="calls after warm-up (default 20000 on a GPU, 300 without)")
    so.add_argument("--out", help="results folder (default benchmarks/results/<gpu>/, e.g. h100/)")
    so.add_argument("--no-plots", action="store_true", help="write the CSV only")
    so.add_argument("--no-progress", action="store_true", help="no progress lines on stderr")

    ft = sub.add_parser(
        "fp8-train",
        help="fp8 training via nn.convert(precision='fp8'): a loss curve against bf16, and step times (GPU)",
    )
    ft.add_argument("--steps", type=int, default=500, help="training steps of the loss comparison")
    ft.add_argument("--rounds", type=int, default=3, help="interleaved timing rounds")
    ft.add_argument("--out", help="results folder (default benchmarks/results/<gpu>/, e.g. h100/)")

    f8 = sub.add_parser(
        "fp8",
        help="tritongemm.scaled_mm vs torch._scaled_mm, tensorwise, rowwise and blockwise scales "
        "(CUDA GPU, sm_89+)",
    )
    f8.add_argument(
        "--shape",
        type=_shape,
        action="append",
        metavar="MxNxK",
        help="only this shape (repeat for several; one the suite does not list runs too)",
    )
    f8.add_argument(
        "--recipes",
        type=_fp8_recipes,
        default=None,
        metavar="NAME,...",
        help="only these recipes (comma-separated; default all): tensorwise, tensorwise+fast_accum, "
        "rowwise, rowwise+fast_accum, blockwise",
    )
    f8.add_argument(
        "--rounds",
        type=_positive_int,
        default=None,
        help="time each shape's implementations in this many interleaved rounds (default 3)",
    )
    f8.add_argument("--out", help="results folder (default benchmarks/results/<gpu>/, e.g. h100/)")
    f8.add_argument("--warmup", type=float, default=25, help="do_bench warm-up, ms (default 25)")
    f8.add_argument("--rep", type=float, default=100, help="do_bench measuring time, ms (default 100)")
    f8.add_argument("--no-plots", action="store_true", help="write the CSV only")
    f8.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")

    ct = sub.add_parser(
        "compile-time",
        help="torch.compile's seconds on converted models against stock, each compile in a fresh process "
        "with empty caches",
    )
    ct.add_argument(
        "--models", help="comma-separated models-suite names (default: the suite's default models)"
    )
    ct.add_argument("--workloads", default="infer,train_amp", help="comma-separated: infer, train_amp")
    ct.add_argument("--modes", default="default,reduce-overhead", help="comma-separated torch.compile modes")
    ct.add_argument("--rounds", type=_positive_int, default=2, help="rounds, stock and converted alternating")
    ct.add_argument("--timeout", type=float, default=600, help="seconds one compile may take")
    ct.add_argument("--out", help="results folder (default benchmarks/results/<gpu>/, e.g. h100/)")

    sub.add_parser("list", help="list the suites and their cases")
    return p


def _plot(args: argparse.Namespace) -> int:
    """Figures from the readable CSVs; one line on stderr for each file that is not a results CSV."""
    from . import plots, schema

    kinds = [k.strip() for k in args.figures.split(",") if k.strip()] if args.figures else list(plots.KINDS)
    unknown = [k for k in kinds if k not in plots.KINDS]
    if unknown:
        print(
            f"benchmarks plot: unknown figure kind(s) {', '.join(unknown)}; choose from "
            f"{', '.join(plots.KINDS)}",
            file=sys.stderr,
        )
        return 2
    frames, skipped, files, model_csvs = [], 0, [], []
    out = args.out or os.path.dirname(os.fspath(args.csv[0])) or "."
    for path in args.csv:
        try:
            frame = schema.read(path)
        except schema.SchemaError as exc:
            print(f"benchmarks plot: skipped {exc}", file=sys.stderr)
            skipped += 1
            continue
        suites = set(frame["suite"].dropna())
        if suites & {
            "models",
            "models_gemms",
        }:  # whole-model suites draw their own figures, all files at once
            model_csvs.append(path)
        elif "host" in suites:
            from .host import plot_host

            files += plot_host(path, out)
        elif "fp8" in suites:  # its own figure: fp8 rates against bf16 roofs would mislead
            from .fp8 import plot_fp8

            files += plot_fp8(path, out)
        else:
            frames.append(frame)
    if model_csvs:
        from .models import plot_models

        files += plot_models(model_csvs, out)
    if not frames and not files:
        return 1  # every file was skipped (each said why) or drew nothing of its own
    if frames:
        import pandas as pd

        files += plots.plot_all(pd.concat(frames, ignore_index=True), out, kinds)
    for f in files:
        print(f"wrote {f}")
    if not files:
        print(
            "benchmarks plot: no figures: the CSV(s) hold no successful measurements of the kinds asked for",
            file=sys.stderr,
        )
    return 0 if files and not skipped else 1


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = _parser().parse_args(argv)

    if args.command == "quick":
        if not (_has_gpu() and not _interpreter_requested()) and not _interpreter_ready():
            _reexec_with_interpreter(argv)  # does not return
        from .quick import run_quick

        return run_quick(args.out, progress=not args.no_progress)

    if args.command == "plot":
        return _plot(args)

    if args.command == "soak":
        if not (_has_gpu() and not _interpreter_requested()) and not _interpreter_ready():
            _reexec_with_interpreter(argv)  # does not return
        from .soak import run_cli

        return run_cli(args)

    if args.command == "fp8-train":
        from .fp8_train import run_cli

        return run_cli(args)

    if args.command == "fp8":  # a timing suite: without a GPU it says so (run_cli), as `run` does
        from .fp8 import run_cli

        return run_cli(args)

    if args.command == "compile-time":
        from .compile_time import run_cli

        return run_cli(args)

    if args.command == "list":
        from .suites import SUITES

        for suite in SUITES.values():
            cases = suite.cases()
            print(
                f"{suite.name:10s} {len(cases):3d} cases  {suite.description} "
                f"(default dtypes {','.join(suite.default_dtypes)})"
            )
            for c in cases:
                print(f"    {c.label:45s} M={c.m:<6d} N={c.n:<6d} K={c.k:<6d} {c.layout}")
        from . import epilogue, fp8, host, mlp, models

        print(f"{'models':10s} whole models, stock vs tritongemm (GPU; `--filter vit` adds ViT-B/16)")
        for spec, workload in models.select_cases():
            print(f"    {spec.name + ' ' + workload:45s} {spec.size}")
        print(f"{'host':10s} {len(host.cases()):3d} cases  per-call host time of tiny GEMMs vs torch")
        mlp_cases = mlp.cases()
        print(
            f"{'mlp':10s} {len(mlp_cases):3d} cases  the MLP block, gated down(act(gate(x)) * up(x)) and plain "
            f"fc2(act(fc1(x))): torch vs tritongemm.nn.convert, fused and not (default dtypes bf16)"
        )
        for c in mlp_cases:
            print(f"    {c.label:45s} M={c.m:<6d} N={c.intermediate:<6d} K={c.hidden:<6d} {c.activation}")
        epilogue_cases = epilogue.cases()
        print(
            f"{'epilogue':10s} {len(epilogue_cases):3d} cases  a linear layer's bias + GELU / SiLU / tanh-GELU / "
            "residual: torch's unfused sequence vs tritongemm.linear's fused epilogue and tritongemm.linear "
            "then torch (default dtypes bf16; fp16 too for bias+gelu at llama3-8b up)"
        )
        for c in epilogue_cases:
            print(f"    {c.label:45s} M={c.m:<6d} N={c.width.n:<6d} K={c.width.k:<6d} NT {c.dtype}")
        print(
            f"{'fp8':10s} {len(fp8.cases()):3d} shapes x {len(fp8.RECIPES)} recipes  tritongemm.scaled_mm vs "
            "torch._scaled_mm (`python -m benchmarks fp8`)"
        )
        for c in fp8.cases():
            print(f"    {c.group + ' ' + c.shape:45s} M={c.m:<6d} N={c.n:<6d} K={c.k:<6d} NT")
        return 0

    # run
    if not _has_gpu() or _interpreter_requested():
        why = "no CUDA GPU is available" if not _has_gpu() else "TRITON_INTERPRET=1 is set"
        print(
            f"benchmarks run: {why}; suites time compiled kernels on a CUDA GPU.\n"
            "Without one, `python -m benchmarks quick` runs the interpreter correctness demo, and "
            "`python -m benchmarks plot CSV` redraws figures from saved results.",
            file=sys.stderr,
        )
        return 2
    from . import harness, suites

    status = 0
    for name in [s.strip() for s in args.suite.split(",") if s.strip()]:
        if name in _OWN_RUNNERS:  # not lists of GEMM cases: their own runners, CSVs and tables
            import importlib

            status = max(status, importlib.import_module(_OWN_RUNNERS[name], __package__).run_cli(args))
            continue
        if name not in suites.SUITES:
            print(
                f"benchmarks run: unknown suite {name!r}; choose from {', '.join(suites.SUITES)}",
                file=sys.stderr,
            )
            return 2
        summary = suites.run_suite(
            name,
            args.dtype,
            args.out,
            compile=not args.no_compile,
            case_filter=args.filter,
            impl_filter=args.impls,
            include_sabotaged=args.sabotaged,
            ceilings=not args.no_ceilings,
            warmup_ms=args.warmup,
            rep_ms=args.rep,
            rounds=args.rounds or harness.ROUNDS,
            progress=not args.no_progress,
            plots=not args.no_plots,
        )
        print(f"\n== {name} ==")
        print(suites.summary_table(summary.csv))
        print(f"wrote {summary.csv}" + "".join(f"\nwrote {f}" for f in summary.figures))
        if summary.failed:
            status = 1
            print(f"{len(summary.failed)} measurement(s) failed:")
            for line in summary.failed:
                print("  " + line)
    return status


if __name__ == "__main__":
    sys.exit(main())
