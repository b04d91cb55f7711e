"""SIGINT and SIGTERM while a write is in progress: the interrupt becomes ``KeyboardInterrupt`` so the
staging directory is removed, and both signals wait out a rename or clean-up.

Handlers are installed only for the duration of a write (``interrupts_raise``, ``signals_held``) and the
previous ones are put back exactly afterwards: a process that imports the toolkit keeps its own signal
dispositions outside a write.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

from eagle3_trt.errors import SignalInterrupt

# Frames of this package are the writer's own bookkeeping (see _on_interrupt).
_PACKAGE_DIR = os.path.dirname(__file__)


def _in_main_thread() -> bool:
    # signal.signal() may only be called from the main thread
    return threading.current_thread() is threading.main_thread()


class _Term:
    """Interrupt bookkeeping while ``interrupts_raise`` has its handlers installed (main thread only).

    A KeyboardInterrupt raised by a signal handler is lost when the handler happens to run inside
    a ``__del__`` method or a weakref/GC callback: Python prints "Exception ignored in ..." and
    carries on (seen here: SIGTERM landing in ``regex``'s ``Group.__del__`` while transformers was
    importing, and the build then completed with exit 0). Such a lost interrupt is caught by
    ``sys.unraisablehook`` and marked ``deferred``; it is then raised again by the signal the
    process re-sends itself every second, and at the latest when the ``staged_dir`` body ends,
    so an interrupted writer never puts its output in place."""

    deferred = False
    # the signal to re-send; SIGINT's KeyboardInterrupt (Python's own handler) can be swallowed the
    # same way and is deferred alike, re-sent as SIGTERM when that is ours to raise
    signum: int = signal.SIGTERM
    resend: threading.Timer | None = None


def _in_this_package(frame: FrameType | None) -> bool:
    return frame is not None and os.path.dirname(frame.f_code.co_filename) == _PACKAGE_DIR


def _on_interrupt(signum: int, frame: FrameType | None) -> None:
    if _in_this_package(frame):
        # inside the writer's own bookkeeping (between the body and its clean-up, say): raising
        # here could skip the clean-up; the end of the body or the re-sent signal acts on it
        _defer(signum)
        return
    _Term.deferred = False
    _Term.signum = signum  # if this exception is swallowed, the hook defers this signal
    raise SignalInterrupt(signum)  # a KeyboardInterrupt that carries the signal number (the CLI exits 128 + it)


def _defer(signum: int = signal.SIGTERM) -> None:
    _Term.deferred = True
    _Term.signum = signum
    if _Term.resend is None or not _Term.resend.is_alive():
        _Term.resend = threading.Timer(1.0, _resend)
        _Term.resend.daemon = True
        _Term.resend.start()


def _resend() -> None:
    # only while our handler is installed: after the write the previous disposition is back and a
    # late re-send would hit whatever the process has there (or kill it)
    if _Term.deferred and signal.getsignal(_Term.signum) is _on_interrupt:
        os.kill(os.getpid(), _Term.signum)


def raise_if_deferred() -> None:
    if _Term.deferred:
        _Term.deferred = False
        raise SignalInterrupt(_Term.signum, "received earlier, its exception was swallowed")


@contextmanager
def interrupts_raise() -> Iterator[None]:
    """SIGINT and SIGTERM raise KeyboardInterrupt inside the block, so clean-up runs on Ctrl-C and ``docker stop``.

    A signal is taken over only where its default action is in force (it would kill the process
    and leave the staging directory behind): a handler someone installed (Python's own SIGINT
    handler, which raises already; a server's graceful shutdown; an outer write) or an ignored
    signal is left as it is. Whatever was installed before is put back when the block ends, so
    nothing of this outlives the write."""
    if not _in_main_thread():
        yield
        return
    prev = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    mine = [s for s, h in prev.items() if h is signal.SIG_DFL]
    if not mine:
        yield
        return
    prev_hook = sys.unraisablehook

    def hook(u: Any) -> None:
        if u.exc_type is not None and issubclass(u.exc_type, KeyboardInterrupt):
            _defer(_Term.signum)  # handled: raised again later; Python's "Exception ignored" traceback would only confuse
            return
        prev_hook(u)

    _Term.deferred = False
    _Term.signum = signal.SIGTERM
    for s in mine:
        signal.signal(s, _on_interrupt)
    sys.unraisablehook = hook
    try:
        yield
        raise_if_deferred()
    finally:
        for s in mine:
            signal.signal(s, prev[s])
        sys.unraisablehook = prev_hook
        _Term.deferred = False


@contextmanager
def signals_held() -> Iterator[None]:
    """SIGINT and SIGTERM wait until the block is done, then take their course.

    Used around renames and clean-up: an interrupt between the two renames of a swap, or in the
    middle of removing a staging directory, would leave more behind than a late exit does."""
    if not _in_main_thread():
        yield
        return
    got: list[int] = []
    prev: dict[signal.Signals, Any] = {}
    for s in (signal.SIGINT, signal.SIGTERM):
        h = signal.getsignal(s)
        if h is None or h is signal.SIG_IGN:  # installed outside Python (cannot restore it) or ignored
            continue
        prev[s] = h
        signal.signal(s, lambda signum, frame: got.append(signum))
    try:
        yield
    finally:
        for s, h in prev.items():
            signal.signal(s, h)
        if got:
            signal.raise_signal(got[0])  # now handled by the restored handler (raise, or the default exit)
