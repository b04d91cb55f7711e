"""What both Triton runtimes share: one request's life cycle and the front that tracks requests.

Triton-free on purpose (the model in ``model/model.py`` supplies a ``Sink`` built on
``triton_python_backend_utils``), so the request life cycle is written once:

* ``Job``: one request from arrival to its final response: incremental detokenization, stop
  strings, streaming or buffered output, perf metrics, the ``RequestSummary`` for metrics.
* ``Serving``: the front of a runtime: encodes prompts, tracks in-flight jobs by request id
  (``stop``), checks for client cancellation, reports each finished job.

The runtimes are ``reference_serving.ReferenceServing`` (the toolkit's PyTorch engine) and
``trtllm_serving.TrtllmServing`` (TensorRT-LLM's LLM API); both produce the same ``Emission``
objects and the same ``RequestSummary``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from eagle3_trt.triton_repo.detok import IncrementalDetokenizer, StopMatcher
from eagle3_trt.triton_repo.request_params import GenRequest


@dataclass(frozen=True)
class PerfSnapshot:
    arrival_ns: int
    first_scheduled_ns: int
    first_token_ns: int
    last_token_ns: int
    draft_tokens: int
    accepted_tokens: int
    acceptance_rate: float
    acceptance_length: float
    speculation: bool


@dataclass(frozen=True)
class Emission:
    text: str
    n_tokens: int
    final: bool
    finish_reason: str | None = None
    stop_reason: str | None = None
    perf: PerfSnapshot | None = None


@dataclass
class RequestSummary:
    status: str  # ok | cancelled | error
    speculation: bool
    generated_tokens: int = 0
    draft_tokens: int = 0
    accepted_tokens: int = 0
    step_acceptance_lengths: list[int] = field(default_factory=list)
    drafted_per_position: list[int] = field(default_factory=list)
    accepted_per_position: list[int] = field(default_factory=list)


class Sink(Protocol):
    def emit(self, e: Emission) -> None: ...
    def fail(self, message: str, cancelled: bool = False) -> None: ...
    def is_cancelled(self) -> bool: ...


def _now() -> int:
    return time.monotonic_ns()


def prompt_has_bos(tokenizer, prompt: str) -> bool:
    """A chat-templated prompt already starts with BOS: encoding must not add a second one."""
    bos = getattr(tokenizer, "bos_token", None)
    return bool(bos) and prompt.startswith(bos)


class Job:
    """One request from arrival to its final response."""

    def __init__(self, req: GenRequest, sink: Sink, tokenizer, request_id: str, arrival_ns: int, speculation: bool,
                 tok_lock=None):
        self.req = req
        self.sink = sink
        self.request_id = request_id
        self.speculation = speculation
        self.arrival_ns = arrival_ns
        self.first_scheduled_ns = 0
        self.first_token_ns = 0
        self.last_token_ns = 0
        self.detok = IncrementalDetokenizer(tokenizer, lock=tok_lock)
        self.stops = StopMatcher(req.stop)
        self.n_tokens = 0
        self.unsent_tokens = 0
        self.buffer: list[str] = []  # non-streaming: the whole text
        self.sent_any = False
        self.draft_tokens = 0
        self.accepted_tokens = 0
        self.target_steps = 0
        self.step_als: list[int] = []
        self.drafted_pp: list[int] = []
        self.accepted_pp: list[int] = []
        self.cancel_requested = False
        self.done = False
        self.next_cancel_check = 0
        self.max_tokens = 0
        self.gen: Any = None

    # -- output -------------------------------------------------------------
    def _prefix(self) -> str:
        if self.req.exclude_input_from_output or self.sent_any:
            return ""
        return self.req.prompt

    def perf(self) -> PerfSnapshot:
        rate = self.accepted_tokens / self.draft_tokens if self.draft_tokens else 0.0
        al = self.n_tokens / self.target_steps if self.target_steps else 0.0
        return PerfSnapshot(
            self.arrival_ns,
            self.first_scheduled_ns,
            self.first_token_ns,
            self.last_token_ns,
            self.draft_tokens,
            self.accepted_tokens,
            rate,
            al,
            self.speculation,
        )

    def push(self, new_ids, finished: bool, finish_reason: str | None) -> None:
        """New tokens from the runtime: detokenize, apply stop strings, send what is ready."""
        now = _now()
        if new_ids:
            if not self.first_token_ns:
                self.first_token_ns = now
            self.last_token_ns = now
            self.n_tokens += len(new_ids)
            self.unsent_tokens += len(new_ids)
        text = self.stops.feed(self.detok.add(new_ids)) if new_ids else ""
        if self.stops.matched is not None:
            finished, finish_reason = True, "stop"
        if finished:
            if self.stops.matched is None:
                text += self.stops.feed(self.detok.flush())
                text += self.stops.flush()
            self.finish(text, finish_reason or "stop")
        elif self.req.streaming:
            if text or self.unsent_tokens:
                self._send(Emission(self._prefix() + text, self.unsent_tokens, False))
        else:
            self.buffer.append(text)

    def _send(self, e: Emission) -> None:
        self.sent_any = True
        self.unsent_tokens = 0
        self.sink.emit(e)

    def finish(self, text: str, finish_reason: str) -> None:
        if self.done:
            return
        self.done = True
        if not self.req.streaming:
            text = "".join(self.buffer) + text
            n = self.n_tokens
        else:
            n = self.unsent_tokens
        perf = self.perf() if self.req.return_perf_metrics else None
        stop_reason = self.stops.matched if self.req.return_stop_reason else None
        self._send(Emission(self._prefix() + text, n, True, finish_reason, stop_reason, perf))

    def fail(self, message: str, cancelled: bool = False) -> None:
        if self.done:
            return
        self.done = True
        self.sink.fail(message, cancelled)

    def summary(self, status: str) -> RequestSummary:
        return RequestSummary(
            status,
            self.speculation,
            self.n_tokens,
            self.draft_tokens,
            self.accepted_tokens,
            list(self.step_als),
            list(self.drafted_pp),
            list(self.accepted_pp),
        )


class Serving:
    """Common front: checks limits, tracks in-flight jobs by request id for ``stop``."""

    tokenizer: Any
    max_seq_len: int
    max_draft_len: int

    def __init__(self, bundle: Path, speculation: bool, default_max_tokens: int, cancel_period_ms: int,
                 on_done: Callable[[RequestSummary], None], log: Callable[[str], None]):
        self.bundle = Path(bundle)
        self.speculation = speculation
        self.default_max_tokens = default_max_tokens
        self.cancel_period_ns = cancel_period_ms * 1_000_000
        self.on_done = on_done
        self.log = log
        self._by_id: dict[str, set[Job]] = {}
        self._lock = threading.Lock()
        # HF fast tokenizers are not safe to use from two threads at once ("Already borrowed"):
        # requests are encoded on Triton's execute thread while the scheduler decodes.
        self.tok_lock = threading.Lock()

    def encode(self, prompt: str) -> list[int]:
        with self.tok_lock:
            return list(self.tokenizer.encode(prompt, add_special_tokens=not prompt_has_bos(self.tokenizer, prompt)))

    def stop_request(self, request_id: str) -> int:
        """Cancel in-flight requests carrying ``request_id``; returns how many."""
        with self._lock:
            jobs = list(self._by_id.get(request_id, ()))
        for j in jobs:
            j.cancel_requested = True
        return len(jobs)

    def _track(self, job: Job) -> None:
        if job.request_id:
            with self._lock:
                self._by_id.setdefault(job.request_id, set()).add(job)

    def _untrack(self, job: Job) -> None:
        if job.request_id:
            with self._lock:
                s = self._by_id.get(job.request_id)
                if s is not None:
                    s.discard(job)
                    if not s:
                        del self._by_id[job.request_id]

    def _check_cancel(self, job: Job, now: int) -> bool:
        if job.cancel_requested:
            return True
        if now >= job.next_cancel_check:
            job.next_cancel_check = now + self.cancel_period_ns
            try:
                return bool(job.sink.is_cancelled())
            except Exception:  # a sender that can no longer answer is gone
                return True
        return False

    def _report(self, job: Job, status: str) -> None:
        self._untrack(job)
        try:
            self.on_done(job.summary(status))
        except Exception as e:  # metrics must never break serving
            self.log(f"metrics update failed: {e}")
