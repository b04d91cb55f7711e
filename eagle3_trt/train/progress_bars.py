"""Progress bars of `train-draft` (rich, on stderr), or nothing when --quiet."""

from __future__ import annotations

from typing import Protocol

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn


class Advance(Protocol):
    """Moves one progress bar on by ``n`` and shows ``info`` beside it."""

    def __call__(self, n: int = 1, info: str = "") -> None: ...


def no_progress(n: int = 1, info: str = "") -> None:
    return None


class Bars:
    """Rich progress bars, or nothing when quiet."""

    def __init__(self, quiet: bool):
        self.quiet = quiet
        self.p = None

    def __enter__(self):
        if not self.quiet:
            self.p = Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.fields[info]}"),
                TimeElapsedColumn(),
                TimeRemainingColumn(),
                console=Console(stderr=True),
            )
            self.p.__enter__()
        return self

    def __exit__(self, *exc):
        if self.p is not None:
            self.p.__exit__(*exc)

    def task(self, desc: str, total: int) -> Advance:
        if self.p is None:
            return no_progress
        tid = self.p.add_task(desc, total=total, info="")
        p = self.p

        def advance(n: int = 1, info: str = "") -> None:
            p.update(tid, advance=n, info=info)

        return advance
