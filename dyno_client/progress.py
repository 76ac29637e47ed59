"""A progress bar on stderr: redrawn in place on a terminal, a line per tenth in a CI log."""

from __future__ import annotations

import sys
import time


class Bar:
    def __init__(self, total: float, *, label: str, unit: str, quiet: bool = False, width: int = 30) -> None:
        self.total, self.label, self.unit, self.quiet, self.width = max(total, 1e-12), label, unit, quiet, width
        self.done_so_far = 0.0
        self.note = ""
        self.started = time.monotonic()
        self.tty = sys.stderr.isatty()
        self.last_tenth = -1

    def advance(self, amount: float) -> None:
        self.set(self.done_so_far + amount)

    def set(self, value: float, *, note: str = "") -> None:
        self.done_so_far, self.note = min(value, self.total), note or self.note
        self._draw()

    def _amount(self) -> str:
        if self.unit == "bytes":
            return f"{self.done_so_far / 1e6:.1f}/{self.total / 1e6:.1f} MB"
        if self.unit == "fraction":
            return self.note
        return f"{self.done_so_far:.0f}/{self.total:.0f} {self.unit}"

    def _draw(self) -> None:
        if self.quiet:
            return
        fraction = self.done_so_far / self.total
        filled = int(fraction * self.width)
        line = f"{self.label} [{'#' * filled}{'.' * (self.width - filled)}] {fraction:4.0%} {self._amount()}"
        if self.tty:
            sys.stderr.write("\r" + line[:200])
            sys.stderr.flush()
        elif int(fraction * 10) != self.last_tenth:
            self.last_tenth = int(fraction * 10)
            print(line, file=sys.stderr, flush=True)

    def done(self) -> None:
        if not self.quiet:
            self.set(self.total)
            if self.tty:
                sys.stderr.write(f" ({time.monotonic() - self.started:.1f} s)\n")
