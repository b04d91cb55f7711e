"""The serving driver: Triton requests in, ``generate_async`` on an LLM-API object, responses out.

Triton-free on purpose (the model in ``model/model.py`` supplies a ``Sink`` built on
``triton_python_backend_utils``), and runtime-free: ``LlmServing`` drives any object with
TensorRT-LLM's LLM-API shape (``llm_api.py``), as ``runtime.factory.open_llm`` returns it for
either runtime (TensorRT-LLM in production, the reference runtime in the tests), through the
same code.

* ``Job``: one request from arrival to its final response: streaming or buffered output, the
  prompt echo, per-response token counts, perf metrics, the ``RequestSummary`` for metrics.
* ``LlmServing``: encodes prompts, builds ``SamplingParams``, runs every request as a coroutine on
  one asyncio loop thread (as upstream's llmapi model does), tracks in-flight requests by request
  id (the ``stop`` input), polls client cancellation every ``cancel_period_ms`` and aborts, and
  ends what is still running when a stop's (or a deploy's) drain window closes (``draining.py``),
  hands each request that ended naturally to the traffic capturer when ``serve --capture`` is on
  (``capture_setup.py``, ``runtime/capture.py``), and retires the instance (``on_retire``) once a
  stop or a deploy asked it to go and it has had nothing in flight for ``RETIRE_QUIET_S``.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from eagle3_trt.runtime.capture import Capturer
from eagle3_trt.runtime.llm_api import SamplingParamError, ServingLlm, SpecStats, spec_stats, to_ns
from eagle3_trt.runtime.request_contract import ServedRequest
from eagle3_trt.triton_serving.capture_setup import triton_capturer
from eagle3_trt.triton_serving.draining import RETIRE_POLL_S, RETIRE_QUIET_S, RETIRE_SETTLE_S, RETIRED_MESSAGE, SHUTDOWN_MESSAGE, DrainWatch
from eagle3_trt.triton_serving.request_params import GenRequest, RequestError, served_request


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


@dataclass(slots=True)
class Emission:
    """One response. Built once per decoding step: slots and no frozen-field setters keep it cheap."""

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
    """One request's responses. After ``submit`` every call comes from the serving loop's thread
    (the job's responses, the cancellation polls, the shutdown's errors), so a sink sends inline
    and needs no lock: its final response is never raced by a poll or another send."""

    def emit(self, e: Emission) -> None: ...
    def fail(self, message: str, cancelled: bool = False, bad_request: bool = False, unavailable: bool = False) -> None: ...
    def is_cancelled(self) -> bool: ...


def prompt_has_bos(tokenizer, prompt: str) -> bool:
    """A chat-templated prompt already starts with BOS: encoding must not add a second one."""
    bos = getattr(tokenizer, "bos_token", None)
    return isinstance(bos, str) and bool(bos) and prompt.startswith(bos)


def derive_positions(step_tokens: list[int], max_draft_len: int) -> tuple[list[int], list[int], list[int]]:
    """(acceptance lengths, drafted per position, accepted per position) from the tokens each
    streamed iteration added, for an LLM that reports only totals (TensorRT-LLM): every
    iteration after the first verified ``max_draft_len`` drafted tokens (a linear chain) and
    accepted ``n - 1`` of them."""
    als = [n for n in step_tokens[1:] if n > 0]
    drafted = [len(als)] * max_draft_len
    accepted = [sum(1 for n in als if n - 1 > k) for k in range(max_draft_len)]
    return als, drafted, accepted


class Job:
    """One request: turns the LLM's cumulative outputs into Triton responses."""

    def __init__(self, req: GenRequest, sink: Sink, request_id: str, arrival_ns: int, speculation: bool, max_draft_len: int):
        self.req = req
        self.sink = sink
        self.request_id = request_id
        self.arrival_ns = arrival_ns
        self.speculation = speculation
        self.max_draft_len = max_draft_len
        self.out: Any = None  # the LLM's RequestOutput
        self.sent_text = 0  # characters of the LLM's text already sent
        self.sent_tokens = 0
        self.sent_any = False
        self.n_tokens = 0
        self.step_tokens: list[int] = []  # tokens added by each streamed iteration
        self.first_token_ns = 0
        self.last_token_ns = 0
        self.perf_metrics: Any = None
        self.finish_reason: str | None = None
        self.category: str | None = None
        self.done = False
        self.cancelled = False
        # A stop string can only be cut once it is complete: hold back that much text, so that
        # nothing sent is later cut away (TensorRT-LLM truncates its text at the match).
        self.hold = max((len(s) for s in req.sampling.stop), default=1) - 1

    def _prefix(self) -> str:
        if self.req.exclude_input_from_output or self.sent_any:
            return ""
        return self.req.prompt

    def on_output(self, o, finished: bool) -> None:
        """One update of the LLM's ``outputs[0]`` (cumulative text and token ids)."""
        now = time.monotonic_ns()
        n = len(o.token_ids)
        if n > self.n_tokens:
            self.first_token_ns = self.first_token_ns or now
            self.last_token_ns = now
        self.step_tokens.append(max(0, n - self.n_tokens))
        self.n_tokens = n
        if getattr(o, "request_perf_metrics", None) is not None:
            self.perf_metrics = o.request_perf_metrics
        text = o.text
        if finished:
            self.finish(text[self.sent_text :], str(o.finish_reason or "stop"), o.stop_reason)
        elif self.req.streaming:
            upto = max(self.sent_text, len(text) - self.hold)
            if upto > self.sent_text or n > self.sent_tokens:
                self._send(Emission(self._prefix() + text[self.sent_text : upto], n - self.sent_tokens, False))
                self.sent_text = upto

    def _send(self, e: Emission) -> None:
        self.sent_any = True
        self.sent_tokens = self.n_tokens
        self.sink.emit(e)

    def finish(self, text: str, finish_reason: str, stop_reason=None) -> None:
        if self.done:
            return
        self.done = True
        self.finish_reason = finish_reason
        n = self.n_tokens - (self.sent_tokens if self.req.streaming else 0)
        perf = self.perf() if self.req.return_perf_metrics else None
        stop = None
        if self.req.return_stop_reason and stop_reason is not None:
            stop = str(stop_reason)
        self._send(Emission(self._prefix() + text, max(0, n), True, finish_reason, stop, perf))

    def fail(self, message: str, cancelled: bool = False, unavailable: bool = False) -> None:
        if self.done:
            return
        self.done = True
        self.sink.fail(message, cancelled, unavailable=unavailable)

    # -- metrics ----------------------------------------------------------------------------
    def _spec(self):
        pm = self.perf_metrics
        return getattr(pm, "speculative_decoding", None) if pm is not None else None

    def stats(self) -> SpecStats:
        # Forwards seen in the stream stand in when the runtime does not count them (TensorRT-LLM).
        return spec_stats(self.perf_metrics, self.n_tokens, self.speculation, forwards_seen=sum(1 for n in self.step_tokens if n > 0))

    def perf(self) -> PerfSnapshot:
        tm = getattr(self.perf_metrics, "timing_metrics", None)
        st = self.stats()
        return PerfSnapshot(
            to_ns(getattr(tm, "arrival_time", None)) or self.arrival_ns,
            to_ns(getattr(tm, "first_scheduled_time", None)) or self.arrival_ns,
            to_ns(getattr(tm, "first_token_time", None)) or self.first_token_ns,
            to_ns(getattr(tm, "last_token_time", None)) or self.last_token_ns,
            st.draft_tokens,
            st.accepted_draft_tokens,
            st.acceptance_rate,
            st.acceptance_length,
            self.speculation,
        )

    def summary(self, status: str) -> RequestSummary:
        if not self.speculation:
            return RequestSummary(status, False, self.n_tokens)
        st, spec = self.stats(), self._spec()
        if spec is not None and hasattr(spec, "eagle3_acceptance_lengths"):
            als, dpp, app = (list(spec.eagle3_acceptance_lengths), list(spec.eagle3_drafted_per_position), list(spec.eagle3_accepted_per_position))
        else:
            als, dpp, app = derive_positions(self.step_tokens, self.max_draft_len)
        return RequestSummary(status, True, self.n_tokens, st.draft_tokens, st.accepted_draft_tokens, als, dpp, app)


class LlmServing:
    """Drives the LLM-API object ``runtime.factory.open_llm`` returned (either runtime) for the Triton model."""

    def __init__(
        self,
        llm: ServingLlm,
        *,
        max_seq_len: int,
        max_draft_len: int,
        speculation: bool,
        default_max_tokens: int | None,
        cancel_period_ms: int,
        decoupled: bool,
        on_done: Callable[[RequestSummary], None],
        log: Callable[[str], None],
        drain: DrainWatch | None = None,
        capture: Capturer | None = None,
        on_retire: Callable[[str], None] | None = None,
    ):
        self.llm = llm
        self.SamplingParams = llm.sampling_params_cls
        self.tokenizer = llm.tokenizer
        self.max_seq_len = max_seq_len
        self.max_draft_len = max_draft_len if speculation else 0
        self.speculation = speculation
        self.per_request_speculation = llm.per_request_speculation
        self.default_max_tokens = default_max_tokens
        self.cancel_period_s = cancel_period_ms / 1000.0
        self.decoupled = decoupled
        self.on_done = on_done
        self.log = log
        self.drain = drain
        # `serve --capture DIR`: set up here, not in model.py, so a repository packaged earlier captures too.
        self.capture = capture if capture is not None else triton_capturer(log)
        self._drained = False
        self._jobs: set[Job] = set()
        self._by_id: dict[str, set[Job]] = {}
        self._lock = threading.Lock()
        # HF fast tokenizers are not safe to use from two threads at once ("Already borrowed").
        self._tok_lock = threading.Lock()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="eagle3-serving", daemon=True)
        self._thread.start()
        self._running = True
        self._ticking = False  # the cancellation timer is armed (loop thread only)
        self._last_activity = time.monotonic()  # a request arrived or ended
        self.on_retire = on_retire
        if on_retire is not None and drain is not None and (drain.path is not None or drain.retire_path is not None):
            threading.Thread(target=self._retire_loop, name="eagle3-retire", daemon=True).start()

    # -- retiring -----------------------------------------------------------------------------
    def touch(self) -> None:
        """A request reached the model (the model calls this for every batch Triton hands it)."""
        self._last_activity = time.monotonic()

    def _retire_loop(self) -> None:
        """Triton may keep this instance loaded with nothing in flight (``draining.py``): once a stop
        or a deploy asked it to go, and nothing has been in flight for ``RETIRE_QUIET_S``, hand
        over to ``on_retire`` (which ends the instance's processes)."""
        assert self.drain is not None and self.on_retire is not None
        seen: float | None = None
        while self._running:
            time.sleep(RETIRE_POLL_S)
            why = self.drain.asked()
            if why is None:
                continue
            now = time.monotonic()
            seen = seen if seen is not None else now
            if now - seen >= RETIRE_SETTLE_S and self.in_flight() == 0 and now - self._last_activity >= RETIRE_QUIET_S:
                if self._running:
                    self.on_retire(why)
                return

    # -- requests ---------------------------------------------------------------------------
    def encode(self, prompt: str) -> list[int]:
        with self._tok_lock:
            return list(self.tokenizer.encode(prompt, add_special_tokens=not prompt_has_bos(self.tokenizer, prompt)))

    def sampling_params(self, req: GenRequest, served: ServedRequest):
        """The runtime's SamplingParams for the request contract's ``served`` (runtime/request_contract.py)."""
        kw: dict[str, Any] = {**served.sampling_kwargs(), "return_perf_metrics": True}
        if not req.speculative and self.speculation:
            if not self.per_request_speculation:
                raise RequestError(
                    "speculative_decoding",
                    "the trtllm runtime cannot switch speculation off per request; package with --with-baseline and send to the <name>_nospec model",
                )
            kw["eagle3_speculative"] = False
        try:
            return self.SamplingParams(**kw)
        except SamplingParamError as e:  # the reference runtime refuses a value and names it: name the request's field
            raise RequestError(f"sampling_param_{e.field}" if e.field in kw else "request", str(e)) from None
        except ValueError as e:  # another runtime's refusal (TensorRT-LLM): the whole request
            raise RequestError("request", str(e)) from None

    def submit(self, req: GenRequest, sink: Sink, request_id: str, arrival_ns: int, category: str | None = None) -> None:
        """Check and start a request; RequestError for bad values (nothing was started).
        ``category``: the request's ``eagle3_category`` parameter, kept with captured traffic."""
        if req.streaming and not self.decoupled:
            # Upstream's wording (llmapi model.py: "Streaming is only supported in decoupled mode.").
            raise RequestError(
                "streaming", "this model is not decoupled; stream from the decoupled model (generate_stream or a gRPC stream), or set streaming false"
            )
        ids = self.encode(req.prompt)
        served = served_request(req, len(ids), self.max_seq_len, self.default_max_tokens)
        sp = self.sampling_params(req, served)
        speculation = self.speculation and req.speculative
        job = Job(req, sink, request_id, arrival_ns, speculation, self.max_draft_len)
        job.category = category
        with self._lock:
            self._last_activity = time.monotonic()
            self._jobs.add(job)
            if request_id:
                self._by_id.setdefault(request_id, set()).add(job)
        asyncio.run_coroutine_threadsafe(self._run(job, ids, sp, served), self._loop)

    def _capture(self, job: Job, ids: list[int], served: ServedRequest) -> None:
        """Hand a request that finished by itself to the capturer (a queue put; never raises).

        ``outputs[0].token_ids`` is every generated id and ``text`` all of the text (TensorRT-LLM's
        ``GenerationResultBase._handle_sequence`` extends ``token_ids`` on each response and trims a
        matched stop word's ids like the text; ``finish_reason`` 'stop' | 'length' is a natural end:
        tensorrt_llm/executor/result.py @005bc848); the reference runtime keeps the same contract."""
        cap = self.capture
        if cap is None or cap.stopped or job.out is None or job.finish_reason not in ("stop", "length"):
            return
        try:
            o, req = job.out.outputs[0], job.req
            cap.record(
                request_id=job.request_id,
                prompt_ids=ids,
                prompt_text=req.prompt,
                output_ids=list(o.token_ids),
                output_text=o.text,
                finish_reason=job.finish_reason,
                sampling=served.captured(),
                stats=job.stats(),
                category=job.category,
            )
        except Exception as e:
            self.log(f"capture: request not recorded: {type(e).__name__}: {e}")

    async def _run(self, job: Job, ids: list[int], sp, served: ServedRequest) -> None:
        status = "ok"
        self._arm_cancellation()
        try:
            # Always streamed from the LLM: per-iteration data for the metrics, and the client's
            # own streaming flag decides only what is sent.
            job.out = self.llm.generate_async(ids, sp, streaming=True)
            if job.done:  # cancelled before it started
                job.out.abort()
                status = "cancelled"
                return
            async for out in job.out:
                if job.done:  # cancelled (stop input or client) meanwhile
                    status = "cancelled"
                    return
                job.on_output(out.outputs[0], bool(out.finished))
                if job.done:
                    return
            if not job.done:
                job.finish("", "stop")
        except Exception as e:
            status = "error"
            self.log(f"request failed in the runtime: {type(e).__name__}: {e}")
            job.fail(f"generation failed: {type(e).__name__}: {e}")
        finally:
            if job.cancelled:
                status = "cancelled"
            self._forget(job)
            if status == "ok":
                self._capture(job, ids, served)
            try:
                self.on_done(job.summary(status))
            except Exception as e:
                self.log(f"metrics update failed: {e}")

    def _forget(self, job: Job) -> None:
        with self._lock:
            self._last_activity = time.monotonic()
            self._jobs.discard(job)
            s = self._by_id.get(job.request_id)
            if s is not None:
                s.discard(job)
                if not s:
                    del self._by_id[job.request_id]

    # -- cancellation -----------------------------------------------------------------------
    def _cancel(self, job: Job, message: str) -> None:
        """From any thread: the job's state is only ever touched on the loop thread."""
        try:
            self._loop.call_soon_threadsafe(self._cancel_on_loop, job, message)
        except RuntimeError:  # loop already closed at shutdown
            pass

    @staticmethod
    def _cancel_on_loop(job: Job, message: str, shutting_down: bool = False) -> None:
        if job.done:
            return
        job.cancelled = True
        job.fail(message, cancelled=not shutting_down, unavailable=shutting_down)
        if job.out is not None:
            job.out.abort()

    def stop_request(self, request_id: str) -> int:
        """Cancel in-flight requests carrying ``request_id`` (upstream's ``stop`` input); how many."""
        with self._lock:
            jobs = list(self._by_id.get(request_id, ())) if request_id else []
        for j in jobs:
            self._cancel(j, "Request cancelled by client")
        return len(jobs)

    def _arm_cancellation(self) -> None:
        """Loop thread: start upstream's cancellation_loop (every ``cancel_period_ms``, poll every
        in-flight request's sender) if it is not running. It is a timer on the loop, not a thread:
        the loop sends every job's responses, so a poll never races a final response (Triton frees
        the sender with it) and no lock is held across a send; an idle server has no timer."""
        if not self._ticking:
            self._ticking = True
            self._loop.call_later(self.cancel_period_s, self._cancellation_tick)

    def _cancellation_tick(self) -> None:
        with self._lock:
            jobs = [j for j in self._jobs if not j.done]
        if not jobs or not self._running:
            self._ticking = False
            return
        if self.drain is not None and self.drain.expired():
            self._end_drain(jobs)
        else:
            for j in jobs:
                if j.done:
                    continue
                try:
                    gone = bool(j.sink.is_cancelled())
                except Exception:
                    gone = True
                if gone:
                    self._cancel_on_loop(j, "Request cancelled by client")
        self._loop.call_later(self.cancel_period_s, self._cancellation_tick)

    def _end_drain(self, jobs: list[Job]) -> None:
        """The stop's (or the deploy's) drain window is over: each open request gets a final error
        response now, while Triton can still deliver it (past its exit timeout it cuts every stream
        silently)."""
        if jobs and not self._drained:
            self.log(f"drain window over: ending {len(jobs)} request(s) still running")
        self._drained = True
        if self.drain is not None and self.drain.asked() == "deploy":
            msg = f"{RETIRED_MESSAGE}: the request was still running when its drain window ended; retry it"
        else:
            msg = f"{SHUTDOWN_MESSAGE}: the request was still running when the drain window ended; retry it on another server"
        for j in jobs:
            self._cancel_on_loop(j, msg, True)

    def in_flight(self) -> int:
        with self._lock:
            return len(self._jobs)

    def shutdown(self) -> None:
        self._running = False
        with self._lock:
            jobs = list(self._jobs)

        async def fail_all() -> None:  # on the loop thread, which sends every job's responses
            for j in jobs:
                self._cancel_on_loop(j, SHUTDOWN_MESSAGE, shutting_down=True)

        try:
            asyncio.run_coroutine_threadsafe(fail_all(), self._loop).result(timeout=10)
        except Exception as e:
            self.log(f"shutdown: requests in flight not ended: {type(e).__name__}: {e}")
        try:
            self.llm.shutdown()
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=30)
            if self.capture is not None:
                self.capture.close()
