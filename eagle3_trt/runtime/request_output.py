"""What ``ReferenceLLM.generate_async`` returns, and how the scheduler's updates reach it.

``RequestOutput`` is async-iterable like TensorRT-LLM's (each step yields it updated); a ``Sink``
takes the scheduler's per-step updates: ``Waker`` puts them on the ``RequestOutput``s of this
process and wakes their consumers, once per event loop per scheduler round (in-process scheduler)
or per received batch (the worker process's dispatcher, ``executor_ipc.py``).
"""

from __future__ import annotations

import asyncio
import collections
import threading
import time
from dataclasses import dataclass
from typing import Any

from eagle3_trt.runtime.llm_api import (
    CompletionOutput,
    RequestPerfMetrics,
    SpeculativeDecodingMetrics,
    TimingMetrics,
    ns_to_timedelta,
)


@dataclass
class _Update:
    new_token_ids: list[int]
    text: str
    finished: bool
    finish_reason: str | None
    stop_reason: str | None
    perf: RequestPerfMetrics
    error: str | None = None


class RequestOutput:
    """What ``generate_async`` returns: async-iterable, each step yields this object updated."""

    def __init__(self, request_id: int, prompt_token_ids: list[int], streaming: bool, cancel: threading.Event):
        self.request_id = request_id
        self.prompt_token_ids = list(prompt_token_ids)
        self.outputs = [CompletionOutput(0)]
        self.finished = False
        self._streaming = streaming
        self._cancel = cancel
        self._lock = threading.Lock()
        self._pending: collections.deque[_Update] = collections.deque()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._cond = threading.Condition(self._lock)
        # The future an async consumer parked on an empty queue awaits (None: not parked). The
        # scheduler wakes a consumer only then, and wakes every consumer of one event loop that a
        # round's steps served with one call_soon_threadsafe at the round's end (``_wake``), as
        # TensorRT-LLM hands an iteration's responses over together.
        self._waiter: asyncio.Future[None] | None = None
        self._sync_waiters = 0
        self._on_abort: Any = None  # the worker process's abort message (None: the scheduler runs in this process)
        try:
            self._loop = asyncio.get_running_loop()
        except RuntimeError:  # called outside an event loop: only result() works
            pass

    # -- producer side (scheduler thread) -----------------------------------------------------
    def _put(self, u: _Update) -> asyncio.Future[None] | None:
        """Queue one update; the parked consumer's future to wake, if any (the caller wakes it)."""
        with self._lock:
            self._pending.append(u)
            waiter, self._waiter = self._waiter, None
            if self._sync_waiters:
                self._cond.notify_all()
        return waiter

    # -- consumer side ------------------------------------------------------------------------
    def _apply(self, u: _Update) -> None:
        o = self.outputs[0]
        o.token_ids.extend(u.new_token_ids)  # in place, as TensorRT-LLM's GenerationResult extends it
        o.text = u.text
        o.finish_reason = u.finish_reason
        o.stop_reason = u.stop_reason
        o.request_perf_metrics = u.perf
        self.finished = u.finished

    def __aiter__(self):
        return self

    async def __anext__(self) -> RequestOutput:
        if self.finished:
            raise StopAsyncIteration
        assert self._loop is not None, "generate_async was called outside an event loop"
        while True:
            # The future is made before taking the lock: the scheduler's _put takes the same lock, and
            # a GIL switch while the consumer holds it would make the scheduler's thread wait for it.
            waiter = self._loop.create_future()
            with self._lock:
                u = self._pending.popleft() if self._pending else None
                if u is None:
                    self._waiter = waiter
            if u is not None:
                self._apply(u)
                if u.error is not None:
                    # TensorRT-LLM raises a failed request's error from the result iterator.
                    raise RuntimeError(u.error)
                return self
            await waiter

    def result(self, timeout: float | None = None) -> RequestOutput:
        """Block until finished (for callers without an event loop)."""
        end = None if timeout is None else time.monotonic() + timeout
        while not self.finished:
            with self._cond:
                while not self._pending:
                    left = None if end is None else end - time.monotonic()
                    if left is not None and left <= 0:
                        raise TimeoutError("request not finished")
                    self._sync_waiters += 1
                    try:
                        self._cond.wait(left)
                    finally:
                        self._sync_waiters -= 1
                u = self._pending.popleft()
            self._apply(u)
        return self

    def abort(self) -> None:
        self._cancel.set()
        if self._on_abort is not None:
            self._on_abort()

    def aborted(self) -> bool:
        return self._cancel.is_set()


def _resolve(waiters: list[asyncio.Future[None]]) -> None:
    """On the consumer's loop: resume each parked ``__anext__`` (one whose task was cancelled is done already)."""
    for w in waiters:
        if not w.done():
            w.set_result(None)


# The perf metrics a step reports, as plain numbers (the wire form the worker process sends):
# (arrival, first scheduled, first token, last token) ns, target forwards, and None (speculation
# off for the request) or (acceptance rate, accepted, drafted, drafted/position, accepted/position,
# acceptance lengths).
PerfRaw = tuple[int, int, int, int, int, "tuple[float, int, int, list[int], list[int], list[int]] | list[Any] | None"]


def perf_from_raw(raw: PerfRaw | list[Any]) -> RequestPerfMetrics:
    arrival, scheduled, first, last, forwards, spec_raw = raw
    spec = SpeculativeDecodingMetrics() if spec_raw is None else SpeculativeDecodingMetrics(*spec_raw)
    timing = TimingMetrics(*(ns_to_timedelta(t) for t in (arrival, scheduled, first, last)))
    return RequestPerfMetrics(timing_metrics=timing, speculative_decoding=spec, eagle3_target_forwards=int(forwards))


class Sink:
    """Where the scheduler's per-step updates go: ``deliver`` one request's update, ``round_end``
    once per scheduler round (in-process: wake consumers; worker process: send the round's batch)."""

    def deliver(
        self, key: Any, new_ids: list[int], text: str, finished: bool, reason: str | None, stop_reason: str | None, perf: PerfRaw, error: str | None
    ) -> None:
        raise NotImplementedError

    def round_end(self) -> None:
        raise NotImplementedError


class Waker(Sink):
    """Hands updates to ``RequestOutput``s and wakes their consumers: one ``call_soon_threadsafe``
    per event loop per round (or per batch the dispatcher receives), as TensorRT-LLM's proxy hands an
    iteration's responses over together (``dispatch_result_task``'s one ``notify_many`` per loop,
    tensorrt_llm/executor/proxy.py)."""

    def __init__(self) -> None:
        self._to_wake: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = []  # one thread only

    def deliver(
        self, key: Any, new_ids: list[int], text: str, finished: bool, reason: str | None, stop_reason: str | None, perf: PerfRaw, error: str | None
    ) -> None:
        self.put(key, _Update(new_ids, text, finished, None if error else reason, stop_reason, perf_from_raw(perf), error))

    def put(self, out: RequestOutput, u: _Update) -> None:
        waiter = out._put(u)
        if waiter is not None and out._loop is not None:
            self._to_wake.append((out._loop, waiter))

    def round_end(self) -> None:
        """One ``call_soon_threadsafe`` per event loop wakes every consumer parked on a request the
        round served (one self-pipe write and one loop wake-up per round, not per request)."""
        if not self._to_wake:
            return
        by_loop: dict[asyncio.AbstractEventLoop, list[asyncio.Future[None]]] = {}
        for loop, waiter in self._to_wake:
            by_loop.setdefault(loop, []).append(waiter)
        self._to_wake = []
        for loop, waiters in by_loop.items():
            try:
                loop.call_soon_threadsafe(_resolve, waiters)
            except RuntimeError:  # the consumer's loop is closed: nobody is listening
                pass
