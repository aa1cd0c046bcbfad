"""What ``tune`` found, as text: the winners beside torch.matmul, and why candidates were rejected."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from ..testing import format_table as text_table
from .tuner import TuneResult, describe_problem


def format_table(results: Sequence[TuneResult]) -> str:
    """The winners as a text table, beside torch.matmul on the same inputs.

    >>> print(format_table(tune([...])))  # doctest: +SKIP
    shape                     best config            TFLOP/s  torch TFLOP/s  vs torch  tried  rejected
    4096x4096x4096 float16 NN 128x256x64 g8 w8 s3      612.1          655.0     0.93x     36         0
    """
    columns = [
        ("shape", "shape"),
        ("best", "best config"),
        ("tflops", "TFLOP/s"),
        ("torch", "torch TFLOP/s"),
        ("ratio", "vs torch"),
        ("tried", "tried"),
        ("rejected", "rejected"),
        ("time", "time"),
    ]
    rows = []
    for r in results:
        if not r.timed:
            best = f"(not timed: {len(r.correct)} correct)" if r.correct else "(none correct)"
        else:
            best = r.best.short() if r.best else "(none correct)"
        rows.append(
            dict(
                shape=describe_problem(r.problem),
                best=best,
                tflops=_fmt(r.tflops),
                torch=_fmt(r.torch_tflops),
                ratio=f"{r.tflops / r.torch_tflops:.2f}x" if r.tflops and r.torch_tflops else "-",
                tried=str(len(r.candidates)) + ("+" if r.timed_out else ""),
                rejected=str(len(r.rejected)),
                time=f"{r.seconds:.1f}s",
            )
        )
    return text_table(rows, columns)


def format_rejections(results: Sequence[TuneResult]) -> str:
    """One line per problem with rejected candidates: how many, and the most common reason.

    >>> print(format_rejections(results))  # doctest: +SKIP
    4096x4096x4096 float16 NN: 3 rejected, 3x "OutOfResources: out of resource: shared memory"
    """
    lines = []
    for r in results:
        if r.rejected:
            reason, count = Counter(c.error for c in r.rejected).most_common(1)[0]
            lines.append(f"{describe_problem(r.problem)}: {len(r.rejected)} rejected, {count}x {reason!r}")
    return "\n".join(lines)


def _fmt(x: float | None) -> str:
    if x is None:
        return "-"
    return f"{x:.1f}" if x >= 1 else f"{x:.3g}"  # the interpreter runs at micro-TFLOP/s
