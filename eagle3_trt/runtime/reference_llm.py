"""``ReferenceLLM``: the toolkit's ``SpeculativeEngine`` behind TensorRT-LLM's LLM-API shape.

``generate_async(prompt_token_ids, SamplingParams(...), streaming=True)`` returns a
``RequestOutput`` to ``async for`` over, as ``tensorrt_llm.LLM`` does (see ``llm_api.py`` for the
exact surface and the upstream commits). One scheduler thread steps every in-flight request in
turn (one target forward each per round), so concurrent streams all progress, ``abort()`` takes
effect between steps, and the engine is only ever called from one thread. That thread runs in a
worker process by default, as TensorRT-LLM's executor runs the model for one GPU (``ReferenceLLM``'s
docstring; ``executor_worker.py``), or in this process with ``TLLM_WORKER_USE_SINGLE_PROCESS=1``.

Like TensorRT-LLM, this object detokenizes and applies stop strings (the text stops before the
stop string). Unlike a naive loop it also trims the token ids at the token that completed the
stop string: tokens the target accepted past it are not returned, not counted in
``len(token_ids)``, and are taken out of the acceptance statistics, so speculation on and off
report the same token count for the same text.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import os
import queue
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from eagle3_trt.core.engine import SamplingParams as EngineSamplingParams
from eagle3_trt.formats import generation
from eagle3_trt.runtime.detok import IncrementalDetokenizer, StopMatcher, detokenize_step
from eagle3_trt.runtime.llm_api import (
    CompletionOutput,
    RequestPerfMetrics,
    SamplingParams,
    SpeculativeDecodingMetrics,
    TimingMetrics,
    effective_sampling,
    ns_to_timedelta,
)
from eagle3_trt.runtime.loader import engine_from_bundle, speculation_control

if TYPE_CHECKING:
    from eagle3_trt.runtime.executor_ipc import WorkerClient


def eos_token_ids(tokenizer, bundle: Path) -> tuple[int, ...]:
    """EOS ids the bundle's target declares (Llama 3 lists several) plus the tokenizer's."""
    ids = list(generation.eos_token_ids(bundle / "target"))
    if getattr(tokenizer, "eos_token_id", None) is not None:
        ids.append(int(tokenizer.eos_token_id))
    return tuple(dict.fromkeys(ids))


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


@dataclass
class _Req:
    key: Any  # what the sink delivers to: the RequestOutput (in process) or the request id (worker)
    streaming: bool
    gen: object
    detok: IncrementalDetokenizer
    stops: StopMatcher
    arrival_ns: int
    cancel: threading.Event
    speculate: bool
    text: str = ""
    n_tokens: int = 0
    unsent: list[int] = field(default_factory=list)
    first_scheduled_ns: int = 0
    first_token_ns: int = 0
    last_token_ns: int = 0
    stats: Any = None  # the engine's last RequestStats snapshot (None before the first step)
    accepted_trim: int = 0  # accepted drafts taken back at a stop string
    trimmed_pp: list[int] = field(default_factory=list)
    als: list[int] = field(default_factory=list)
    step_drafted: int = 0  # the last step's draft tokens and accepted drafts (the gate's sample)
    step_accepted: int = 0


class Scheduler:
    """The engine and its scheduler loop: what runs on ``ReferenceLLM``'s thread (single process)
    or in its worker process (``executor_worker.py``). Updates go to ``sink``."""

    def __init__(self, bundle: Path, sink: Sink, *, device: str = "auto", torch_threads: int | None = None, speculation: bool = True):
        if torch_threads:
            torch.set_num_threads(torch_threads)
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        self.bundle = Path(bundle)
        self.sink = sink
        self.engine = engine_from_bundle(self.bundle, device=device)
        self.tokenizer = self.engine.tokenizer
        self.speculation = speculation
        if speculation and (warning := self.engine.sampling.warning()):
            print(f"{self.bundle}: {warning}", file=sys.stderr)  # what TensorRT-LLM would serve, once per load
        self.eos_ids = eos_token_ids(self.tokenizer, self.bundle)
        # draft_len_schedule and the acceptance-rate switch-off, run per scheduler round as TensorRT-LLM
        # runs them per iteration (core/speculation_control.py; None: speculation off for the server)
        self.control = speculation_control(self.bundle, self.engine.max_draft_len) if speculation else None
        self.tok_lock = threading.Lock()  # HF fast tokenizers must not decode from two threads at once
        self.inbox: queue.Queue[_Req | None] = queue.Queue()

    def admit(self, key: Any, ids: list[int], sp: SamplingParams, streaming: bool, cancel: threading.Event, arrival_ns: int) -> None:
        """Queue one request for the scheduler loop (any thread)."""
        temperature, top_p, top_k = effective_sampling(sp.temperature, sp.top_p, sp.top_k)  # TensorRT-LLM's resolution
        eparams = EngineSamplingParams(
            max_tokens=int(sp.max_tokens), temperature=temperature, top_p=top_p, top_k=top_k, seed=sp.seed, stop_token_ids=self.eos_ids
        )
        speculate = self.speculation and sp.eagle3_speculative
        self.inbox.put(
            _Req(
                key,
                streaming,
                self.engine.stream(ids, eparams, speculate=speculate),
                IncrementalDetokenizer(self.tokenizer, lock=self.tok_lock),
                StopMatcher(sp.stop_strings),
                arrival_ns,
                cancel,
                speculate,
            )
        )

    def speculation_state(self) -> dict[str, object] | None:
        """Iterations run, gate samples, and when the acceptance gate switched speculation off."""
        return self.control.state() if self.control is not None else None

    def run(self) -> None:
        """One round = one TensorRT-LLM iteration: every in-flight request is stepped once (its
        prefill, or one decode step), at the K ``draft_len_schedule`` gives the round's batch size
        (0 once the acceptance gate has tripped); the rows that drafted give the gate one sample.
        Returns when ``None`` arrives in the inbox (requests in flight end "cancelled")."""
        active: list[_Req] = []
        lagging = 0  # finished last round; the overlap scheduler still schedules them this round
        while True:
            block = not active
            if block:
                lagging = 0  # an idle server has processed every finished request
            while True:
                try:
                    item = self.inbox.get(block=block)
                except queue.Empty:
                    break
                if item is None:
                    for r in active:
                        self._finish(r, "", "cancelled")
                    self.sink.round_end()
                    return
                active.append(item)
                block = False
            ctl = self.control
            if ctl is not None:
                # TensorRT-LLM's overlap scheduler schedules iteration i+1 before it learns which requests
                # iteration i finished, so those are counted in i+1's batch size
                self.engine.k_cap = ctl.k_for(len(active) + (lagging if ctl.overlap_scheduler else 0))
            drafted, accepted = [], []
            done = 0
            for r in list(active):
                r.step_drafted = r.step_accepted = 0
                if self._step(r):
                    active.remove(r)
                    done += 1
                drafted.append(r.step_drafted)
                accepted.append(r.step_accepted)
            self.sink.round_end()
            lagging = done
            if ctl is not None:
                ctl.after(drafted, accepted)

    def _close(self, r: _Req) -> None:
        try:
            r.gen.close()  # type: ignore[attr-defined]  # frees the request's KV cache
        except Exception:
            pass

    def _step(self, r: _Req) -> bool:
        """Advance one request by one target forward; True when it is finished."""
        if r.cancel.is_set():
            self._close(r)
            self._finish(r, "", "cancelled")
            return True
        now = time.monotonic_ns()
        r.first_scheduled_ns = r.first_scheduled_ns or now
        try:
            step = next(r.gen)  # type: ignore[call-overload]
        except StopIteration:
            self._finish(r, self._flush(r), "stop")
            return True
        except Exception as e:
            self._close(r)
            self._finish(r, "", "error", error=f"{type(e).__name__}: {e}")
            return True
        prev = r.stats
        r.stats = step.stats
        now = time.monotonic_ns()
        if step.new_token_ids:
            r.first_token_ns = r.first_token_ns or now
            r.last_token_ns = now
        # A stop string is located at the exact token that completes it; the rest of the step is
        # not returned (detok.detokenize_step: one decode per step unless a stop string completes).
        ids = [int(t) for t in step.new_token_ids]
        n_kept, delta = detokenize_step(r.detok, r.stops, ids)
        kept = ids[:n_kept]
        self._account(r, prev, len(step.new_token_ids), len(kept))
        r.n_tokens += len(kept)
        r.unsent += kept
        r.text += delta
        if r.stops.matched is not None:
            self._close(r)
            self._finish(r, "", "stop", stop_reason=r.stops.matched)
            return True
        if step.finished:
            self._finish(r, self._flush(r), step.finish_reason or "stop")
            return True
        if r.streaming:
            self.sink.deliver(r.key, r.unsent, r.text, False, None, None, self._perf(r), None)
            r.unsent = []
        return False

    def _account(self, r: _Req, prev, produced: int, kept: int) -> None:
        """Per-step acceptance; when a stop string cut the step short, the tokens after it are
        taken back from the accepted drafts (the last kept token stands in for the bonus)."""
        st = r.stats
        drafted = st.draft_tokens - (prev.draft_tokens if prev else 0)
        accepted = st.accepted_tokens - (prev.accepted_tokens if prev else 0)
        r.step_drafted, r.step_accepted = max(0, drafted), max(0, accepted)
        if drafted > 0:
            r.als.append(min(accepted, kept - 1) + 1 if kept < produced else accepted + 1)
        if kept < produced:
            keep_acc = max(0, min(accepted, kept - 1))
            r.accepted_trim += accepted - keep_acc
            if len(r.trimmed_pp) < len(st.accepted_per_position):
                r.trimmed_pp += [0] * (len(st.accepted_per_position) - len(r.trimmed_pp))
            for pos in range(keep_acc, accepted):
                r.trimmed_pp[pos] += 1

    def _flush(self, r: _Req) -> str:
        return r.stops.feed(r.detok.flush()) + r.stops.flush()

    def _perf(self, r: _Req) -> PerfRaw:
        st = r.stats
        if st is None or not r.speculate:
            spec = None
            forwards = getattr(st, "target_forwards", 0) if st is not None else 0
        else:
            acc = st.accepted_tokens - r.accepted_trim
            acc_pp = [a - (r.trimmed_pp[i] if i < len(r.trimmed_pp) else 0) for i, a in enumerate(st.accepted_per_position)]
            spec = (acc / st.draft_tokens if st.draft_tokens else 0.0, acc, st.draft_tokens, list(st.drafted_per_position), acc_pp, list(r.als))
            forwards = st.target_forwards
        return (r.arrival_ns, r.first_scheduled_ns, r.first_token_ns, r.last_token_ns, int(forwards), spec)

    def _finish(self, r: _Req, tail: str, reason: str, stop_reason: str | None = None, error: str | None = None) -> None:
        r.text += tail
        self.sink.deliver(r.key, r.unsent, r.text, True, reason, stop_reason, self._perf(r), error)
        r.unsent = []


SINGLE_PROCESS_ENV = "TLLM_WORKER_USE_SINGLE_PROCESS"


def single_process_requested() -> bool:
    """TensorRT-LLM's switch, read as it reads it (``enable_worker_single_process_for_tp1``,
    tensorrt_llm/llmapi/utils.py @cc4777e9: ``os.environ.get("TLLM_WORKER_USE_SINGLE_PROCESS", "0") == "1"``)."""
    return os.environ.get(SINGLE_PROCESS_ENV, "0") == "1"


class ReferenceLLM:
    """``tensorrt_llm.LLM``'s serving surface over ``SpeculativeEngine`` (see the module docstring).
    Servers open it through ``runtime.factory.open_llm``, never by name.

    Where the engine runs follows TensorRT-LLM's executor for one GPU (``GenerationExecutor.create``,
    tensorrt_llm/executor/executor.py @ed53795b): "Partition the workload to multiple process for
    streaming performance": a ``GenerationExecutorProxy`` in the user's process, the model in a worker
    process, results back over IPC to a dispatcher thread that hands them to each request's queue.
    Here too, by default, the scheduler loop (engine, steps, detokenization, stop strings, perf
    metrics) runs in a worker process (``executor_worker.py``; messages: ``executor_ipc.py``) and this
    process keeps ``RequestOutput``, ``generate_async``, ``abort``, ``shutdown`` and a dispatcher
    thread, so the serving loop's per-step work (responses, IPC, asyncio) does not hold the GIL the
    model's Python needs. TensorRT-LLM runs the worker in-process only for ``return_logits`` or when
    ``TLLM_WORKER_USE_SINGLE_PROCESS=1`` (``enable_worker_single_process_for_tp1``, llmapi/utils.py
    @cc4777e9), warning that it "may hurt streaming generation performance"; the same variable (or
    ``single_process=True``) keeps the scheduler on a thread of this process here.
    """

    sampling_params_cls = SamplingParams
    per_request_speculation = True  # SamplingParams(eagle3_speculative=False) is honoured

    def __init__(
        self,
        bundle: Path,
        *,
        device: str = "auto",
        torch_threads: int | None = None,
        speculation: bool = True,
        single_process: bool | None = None,
    ):
        self.bundle = Path(bundle)
        self.speculation = speculation
        self.single_process = single_process_requested() if single_process is None else bool(single_process)
        self._ids = itertools.count(1)
        self._sched: Scheduler | None = None
        self._worker: WorkerClient | None = None
        if self.single_process:
            self._sched = Scheduler(self.bundle, Waker(), device=device, torch_threads=torch_threads, speculation=speculation)
            self.tokenizer = self._sched.tokenizer
            self._tok_lock = self._sched.tok_lock
            self._thread = threading.Thread(target=self._sched.run, name="eagle3-reference-llm", daemon=True)
            self._thread.start()
        else:
            from eagle3_trt.runtime.executor_ipc import WorkerClient  # local: only this mode starts a process

            self._worker = WorkerClient(self.bundle, device=device, torch_threads=torch_threads, speculation=speculation)
            self.tokenizer = self._worker.tokenizer
            self._tok_lock = threading.Lock()

    @property
    def worker_pid(self) -> int | None:
        """The worker process's id (None: the scheduler runs on a thread of this process)."""
        return self._worker.pid if self._worker is not None else None

    # -- the LLM API ----------------------------------------------------------------------------
    def generate_async(self, inputs, sampling_params: SamplingParams | None = None, streaming: bool = False) -> RequestOutput:
        sp = sampling_params or SamplingParams()
        if isinstance(inputs, dict):
            ids = list(inputs["prompt_token_ids"])
        elif isinstance(inputs, str):
            with self._tok_lock:
                ids = list(self.tokenizer.encode(inputs))
        else:
            ids = [int(i) for i in inputs]
        arrival = time.monotonic_ns()  # CLOCK_MONOTONIC: one clock for every process of the machine
        cancel = threading.Event()
        out = RequestOutput(next(self._ids), ids, streaming, cancel)
        if self._worker is not None:
            self._worker.submit(out, sp, arrival)
        else:
            assert self._sched is not None
            self._sched.admit(out, ids, sp, streaming, cancel, arrival)
        return out

    def shutdown(self) -> None:
        if self._worker is not None:
            self._worker.shutdown()
        elif self._sched is not None:
            self._sched.inbox.put(None)
            self._thread.join(timeout=30)

    def speculation_state(self) -> dict[str, object] | None:
        """Iterations run, gate samples, and when the acceptance gate switched speculation off."""
        if self._worker is not None:
            return self._worker.speculation_state() if self.speculation else None
        assert self._sched is not None
        return self._sched.speculation_state()
