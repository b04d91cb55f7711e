"""One exception type for every user-facing failure.

The CLI prints ``UserError`` as a single line (``error: <where>: <what> (hint: ...)``)
and exits non-zero; anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import os


class UserError(Exception):
    """Bad input the user can fix: names the file/field, says what is wrong, gives a hint."""

    exit_code = 2

    def __init__(self, where: str | os.PathLike[str], what: str, hint: str | None = None):
        self.where = str(where)
        self.what = what
        self.hint = hint
        super().__init__(self.line())

    def line(self) -> str:
        msg = f"{self.where}: {self.what}"
        if self.hint:
            msg += f" (hint: {self.hint})"
        return msg


class IncompleteMeasurement(UserError):
    """A measurement that measured no request, or fewer than the prompts file (or ``--limit``) asked
    for: one line saying how many and why, exit 2. Raised before anything is written when nothing was
    measured; after the report (which records the skipped requests) otherwise."""


class GateFailed(Exception):
    """A measured figure is below the deployment gate (exit code 3, distinct from bad input).

    The message is the verdict line the CLI prints, as it is; empty when the command has already
    printed its verdict (bench's summary ends with it), so a verdict is never shown twice."""

    exit_code = 3


class RankFailed(Exception):
    """A rank of a tensor-parallel run failed or lost a peer: the message is the one line the CLI
    prints (exit 1); nothing was written."""

    exit_code = 1


class SignalInterrupt(KeyboardInterrupt):
    """A signal (SIGTERM) turned into an interrupt so clean-up runs; ``signum`` says which, so the
    CLI can exit 128 + signum without reading the message."""

    def __init__(self, signum: int, note: str | None = None):
        self.signum = int(signum)
        super().__init__(f"signal {self.signum}" + (f" ({note})" if note else ""))
