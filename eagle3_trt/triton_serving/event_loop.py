"""The serving loop's asyncio event loop: one GIL hand-off fewer per decoding step.

Every ``select`` call releases the GIL around ``epoll_wait``, even the non-blocking poll that
``BaseEventLoop._run_once`` makes whenever callbacks are already queued. On the serving loop that
poll comes once per decoding step: the runtime's wake-up runs in one iteration and resumes the
request's task for the next, which polls first. With the runtime's thread computing the next step,
each release hands the GIL to that thread and the loop then waits for it back: a hand-off that
delays the step's response and, with the wait to return it, the next step (issue 32's profile,
"serving loop: wake-up"). ``ReadyFirstSelector`` answers a non-blocking poll with "nothing ready"
without the system call every other time, so a wake-up and the task it resumes run under one
hold of the GIL, while file descriptors (the loop's self-pipe: wake-ups from other threads) are
still polled at least every second iteration and whenever the loop would block.
"""

from __future__ import annotations

import asyncio
import selectors
from typing import Any


class ReadyFirstSelector(selectors.DefaultSelector):  # type: ignore[misc,valid-type]
    """``DefaultSelector`` that skips every other non-blocking poll (module docstring)."""

    _skipped = False

    def select(self, timeout: float | None = None) -> list[Any]:
        if timeout is not None and timeout <= 0 and not self._skipped:
            self._skipped = True
            return []
        self._skipped = False
        return super().select(timeout)


def serving_event_loop() -> asyncio.AbstractEventLoop:
    """A new event loop over ``ReadyFirstSelector`` for the serving loop's thread."""
    return asyncio.SelectorEventLoop(ReadyFirstSelector())
