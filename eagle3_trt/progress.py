"""The one progress facility of the commands (on stderr): rich's live bars on a terminal, plain lines
elsewhere, or nothing when quiet.

Why plain lines: rich draws no live display when stderr is not a terminal (a CI log, ``| tee``) and
prints the bars once at the end, so a log of a long wait held nothing readable until it finished.
Off a terminal every task prints ``desc: done/total info (elapsed)`` when it starts, every
tenth of its total (``LINE_TENTHS``) or ``LINE_EVERY_S`` seconds (whichever comes first), and when
it completes.
"""

from __future__ import annotations

import sys
import time
from typing import Protocol, TextIO

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

LINE_TENTHS = 10  # a line per tenth of the total
LINE_EVERY_S = 5.0


class Advance(Protocol):
    """Moves one progress task on by ``n`` and shows ``info`` beside it."""

    def __call__(self, n: int = 1, info: str = "") -> None: ...


def no_progress(n: int = 1, info: str = "") -> None:
    return None


class _LineTask:
    """One task off a terminal: a plain line at the start, at each tenth (or every few seconds), at the end."""

    def __init__(self, out: TextIO, desc: str, total: int) -> None:
        self.out, self.desc, self.total = out, desc, max(int(total), 1)
        self.done, self.info = 0, ""
        self.t0 = self.last_t = time.monotonic()
        self.last_step = 0
        self._line()

    def _line(self) -> None:
        info = f" {self.info}" if self.info else ""
        print(f"{self.desc}: {self.done}/{self.total}{info} ({time.monotonic() - self.t0:.0f} s)", file=self.out, flush=True)
        self.last_t = time.monotonic()

    def __call__(self, n: int = 1, info: str = "") -> None:
        self.done += n
        if info:
            self.info = info
        step = self.done * LINE_TENTHS // self.total  # integers: 15/50 is the third tenth exactly
        if self.done >= self.total or step > self.last_step or time.monotonic() - self.last_t >= LINE_EVERY_S:
            self.last_step = step
            self._line()


class Bars:
    """Progress tasks on stderr: live rich bars on a terminal, plain lines otherwise, nothing when quiet.

    ``with Bars(quiet) as bars: advance = bars.task("measuring", total); advance(1, info="12 tokens")``."""

    def __init__(self, quiet: bool = False, stream: TextIO | None = None) -> None:
        self.quiet = quiet
        self.stream = stream
        self.p: Progress | None = None

    @property
    def out(self) -> TextIO:
        return self.stream if self.stream is not None else sys.stderr

    def live(self) -> bool:
        return not self.quiet and self.out.isatty()

    def __enter__(self) -> Bars:
        if self.live():
            self.p = Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.fields[info]}"),
                TimeElapsedColumn(),
                TimeRemainingColumn(),
                console=Console(file=self.out),
            )
            self.p.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.p is not None:
            self.p.__exit__(*exc)  # type: ignore[arg-type]

    def say(self, message: str, style: str = "dim") -> None:
        """A line above the live bars (on a terminal), or a plain line; nothing when quiet."""
        if self.quiet:
            return
        if self.p is not None:
            self.p.console.print(message, style=style, highlight=False, markup=False)
        else:
            print(message, file=self.out, flush=True)

    def task(self, desc: str, total: int) -> Advance:
        if self.quiet:
            return no_progress
        if self.p is None:
            return _LineTask(self.out, desc, total)
        tid = self.p.add_task(desc, total=total, info="")
        p = self.p

        def advance(n: int = 1, info: str = "") -> None:
            p.update(tid, advance=n, info=info)

        return advance
