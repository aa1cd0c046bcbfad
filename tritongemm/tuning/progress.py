"""A tiny text progress bar on stderr (no dependency).

On a terminal it redraws one line with ``\\r``; in a log file it writes one
line per problem, so CI logs stay readable.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO


class ProgressBar:
    """``[#######.......]  5/12 shapes  1m03s | 4096x4096x4096 float16 NT | candidate 7/36``

    >>> bar = ProgressBar(total=12); bar.update(done=5, label="4096x4096x4096"); bar.close()  # doctest: +SKIP
    """

    WIDTH = 24

    def __init__(self, total: int, stream: TextIO | None = None, enabled: bool = True, unit: str = "shapes"):
        self.total = max(total, 1)
        self.unit = unit
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = enabled
        self.interactive = bool(getattr(self.stream, "isatty", lambda: False)())
        self.start = time.perf_counter()
        self._last_len = 0

    def update(self, done: int, label: str = "", detail: str = "") -> None:
        """Redraw the bar (on a terminal); ``detail`` changes within a problem and is only drawn there."""
        if not self.enabled:
            return
        if self.interactive:
            self._draw(self._line(done, label, detail), end="")

    def step(self, done: int, label: str = "") -> None:
        """A problem finished: on a terminal redraw, in a log write one line."""
        if not self.enabled:
            return
        line = self._line(done, label, "")
        if self.interactive:
            self._draw(line, end="")
        else:
            self.stream.write(line + "\n")
            self.stream.flush()

    def close(self) -> None:
        if self.enabled and self.interactive:
            self.stream.write("\n")
            self.stream.flush()

    def _line(self, done: int, label: str, detail: str) -> str:
        filled = self.WIDTH * min(done, self.total) // self.total
        bar = "#" * filled + "." * (self.WIDTH - filled)
        parts = [f"[{bar}] {done:>{len(str(self.total))}}/{self.total} {self.unit} {_clock(time.perf_counter() - self.start)}"]
        parts += [p for p in (label, detail) if p]
        return " | ".join(parts)

    def _draw(self, line: str, end: str) -> None:
        pad = " " * max(self._last_len - len(line), 0)
        self.stream.write("\r" + line + pad + end)
        self.stream.flush()
        self._last_len = len(line)


def _clock(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


__all__ = ["ProgressBar"]
