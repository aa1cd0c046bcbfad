"""The progress bar of ``tune`` and the benchmarks: ``tqdm`` on stderr.

On a terminal tqdm redraws one line; in a log (stderr not a terminal) a
redrawn line would pile up as ``\\r``-joined text, so each finished step is
written as one plain line in tqdm's format instead, and CI logs stay readable.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO

#: ``[####------] 5/12 shapes [01:03<01:31, 4096x4096x4096 float16 NT | candidate 7/36]``
BAR_FORMAT = "[{bar}] {n_fmt}/{total_fmt} {unit} [{elapsed}<{remaining}{postfix}]"


class ProgressBar:
    """Progress over ``total`` steps (shapes, runs), with a label for the current step.

    >>> bar = ProgressBar(total=12); bar.update(done=5, label="4096x4096x4096"); bar.close()  # doctest: +SKIP
    """

    def __init__(self, total: int, stream: TextIO | None = None, enabled: bool = True, unit: str = "shapes"):
        self.total = max(total, 1)
        self.unit = unit
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = enabled
        self.interactive = bool(getattr(self.stream, "isatty", lambda: False)())
        self.start = time.perf_counter()
        # Imported here: dispatch's cache lookups import the tuning package, and must not need tqdm.
        from tqdm import tqdm

        self._format_meter = tqdm.format_meter
        self._bar = tqdm(
            total=self.total,
            unit=unit,
            file=self.stream,
            bar_format=BAR_FORMAT,
            ascii=" #",
            dynamic_ncols=True,
            disable=not (enabled and self.interactive),
        )

    def update(self, done: int, label: str = "", detail: str = "") -> None:
        """Redraw the bar (on a terminal); ``detail`` changes within a step and is only drawn there."""
        if self._bar.disable:
            return
        self._bar.set_postfix_str(" | ".join(p for p in (label, detail) if p), refresh=False)
        self._bar.update(done - self._bar.n)  # update() redraws; a zero step redraws the label too
        self._bar.refresh()

    def step(self, done: int, label: str = "") -> None:
        """A step finished: on a terminal redraw, in a log write one line."""
        if not self.enabled:
            return
        if self.interactive:
            self.update(done, label)
            return
        line = self._format_meter(
            done,
            self.total,
            time.perf_counter() - self.start,
            unit=self.unit,
            bar_format=BAR_FORMAT,
            ascii=" #",
            postfix=label or None,
        )
        self.stream.write(line + "\n")
        self.stream.flush()

    def close(self) -> None:
        self._bar.close()


__all__ = ["ProgressBar"]
